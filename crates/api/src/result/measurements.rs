//! What a node check measured, in the full document: the NCCL sweep, GPU-pair copies, the
//! DDP probe, NVML health and the transports NCCL chose.

use super::is_zero_f64;
use crate::suite::{Collective, DataType};
use serde::{Deserialize, Serialize};

/// Time, bandwidths and wrong elements of one run of a collective at one size.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Timing {
    /// Average time per iteration (microseconds).
    pub time_us: f64,
    /// Algorithm and bus bandwidth (GB/s).
    pub algbw: f64,
    pub busbw: f64,
    /// Elements that differ from the expected result.
    pub wrong: u64,
}

/// One row of an NCCL sweep, in nccl-tests' terms: the out-of-place run, and the in-place
/// run where the collective has one. On the wire an in-place run not measured is all zeros,
/// as nccl-tests prints it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(into = "SweepRowWire", from = "SweepRowWire")]
pub struct SweepRow {
    pub bytes: u64,
    pub count: u64,
    pub out_of_place: Timing,
    pub in_place: Option<Timing>,
}

/// The wire form of [`SweepRow`]: flat, in-place fields zero when not measured.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
struct SweepRowWire {
    bytes: u64,
    count: u64,
    time_us: f64,
    algbw: f64,
    busbw: f64,
    wrong: u64,
    in_place_time_us: f64,
    in_place_algbw: f64,
    in_place_busbw: f64,
    in_place_wrong: u64,
}

impl From<SweepRow> for SweepRowWire {
    fn from(r: SweepRow) -> Self {
        let ip = r.in_place.unwrap_or_default();
        SweepRowWire {
            bytes: r.bytes,
            count: r.count,
            time_us: r.out_of_place.time_us,
            algbw: r.out_of_place.algbw,
            busbw: r.out_of_place.busbw,
            wrong: r.out_of_place.wrong,
            in_place_time_us: ip.time_us,
            in_place_algbw: ip.algbw,
            in_place_busbw: ip.busbw,
            in_place_wrong: ip.wrong,
        }
    }
}

impl From<SweepRowWire> for SweepRow {
    fn from(w: SweepRowWire) -> Self {
        let in_place = Timing {
            time_us: w.in_place_time_us,
            algbw: w.in_place_algbw,
            busbw: w.in_place_busbw,
            wrong: w.in_place_wrong,
        };
        SweepRow {
            bytes: w.bytes,
            count: w.count,
            out_of_place: Timing {
                time_us: w.time_us,
                algbw: w.algbw,
                busbw: w.busbw,
                wrong: w.wrong,
            },
            // Never run: no time and nothing checked.
            in_place: (in_place != Timing::default()).then_some(in_place),
        }
    }
}

impl SweepRow {
    /// Wrong elements of the row, in and out of place.
    pub fn wrong(&self) -> u64 {
        self.out_of_place.wrong + self.in_place.map_or(0, |t| t.wrong)
    }
}

/// Latency and bandwidth fitted to a sweep: time(bytes) = alpha + bytes / beta.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AlphaBeta {
    pub alpha_us: f64,
    /// Asymptotic bus bandwidth in GB/s.
    pub beta_gbps: f64,
}

/// The sweep of one collective.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CollectiveSweep {
    pub collective: Collective,
    pub data_type: DataType,
    pub ranks: u32,
    pub rows: Vec<SweepRow>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fit: Option<AlphaBeta>,
}

impl CollectiveSweep {
    /// Highest out-of-place bus bandwidth of the sweep.
    pub fn peak_busbw(&self) -> f64 {
        self.rows
            .iter()
            .map(|r| r.out_of_place.busbw)
            .fold(0.0, f64::max)
    }
    /// Out-of-place time of the smallest size (microseconds).
    pub fn min_time_us(&self) -> Option<f64> {
        self.rows.first().map(|r| r.out_of_place.time_us)
    }
    /// Wrong elements over all rows, in and out of place.
    pub fn total_wrong(&self) -> u64 {
        self.rows.iter().map(SweepRow::wrong).sum()
    }
}

/// NCCL sweep over all GPUs of a node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NcclSweepResult {
    pub collectives: Vec<CollectiveSweep>,
    /// How the times were taken: 0 (absent), every iteration launched from the host, as
    /// nccl-tests without `-G`; N, as N launches of a CUDA graph of each block's iterations
    /// (`suite.ncclSweep.graphLaunches`), which leaves the launching CPU out of small sizes.
    #[serde(default, skip_serializing_if = "super::is_zero")]
    pub graph_launches: u32,
}

/// Copy bandwidth of one ordered GPU pair.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PairBandwidth {
    pub src: u32,
    pub dst: u32,
    pub gbps: f64,
}

/// Copy bandwidth of one GPU to or from the host.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HostBandwidth {
    pub gpu: u32,
    pub gbps: f64,
}

/// GPU-pair copy-engine matrix of one node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PairMatrix {
    pub bytes: u64,
    /// One entry per ordered pair (src != dst).
    pub unidirectional: Vec<PairBandwidth>,
    /// One entry per unordered pair (src < dst): both directions at once, summed.
    #[serde(default)]
    pub bidirectional: Vec<PairBandwidth>,
    #[serde(default)]
    pub host_to_device: Vec<HostBandwidth>,
    #[serde(default)]
    pub device_to_host: Vec<HostBandwidth>,
    /// Copies whose data did not arrive intact.
    pub corrupt_copies: u32,
}

/// One point of the DDP weak-scaling curve.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DdpPoint {
    pub gpus: u32,
    pub step_ms: f64,
    pub samples_per_s: f64,
    /// Throughput per GPU relative to the 1-GPU point (1.0 = perfect).
    pub scaling_efficiency: f64,
    /// Share of the step spent in gradient all-reduce not hidden behind backward.
    pub comm_fraction: f64,
    /// Share of the all-reduce time hidden behind backward (1.0 = fully overlapped).
    pub overlap_efficiency: f64,
    pub tflops_per_gpu: f64,
    /// Compute time (forward + backward) per GPU, milliseconds, by GPU index.
    pub compute_ms: Vec<f64>,
    /// The GPU indices this point ran on.
    pub gpu_indices: Vec<u32>,
}

/// The DDP scaling probe.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DdpResult {
    pub hidden: u32,
    pub layers: u32,
    pub batch_per_gpu: u32,
    /// Gradient bucket sizes in bytes, in all-reduce order.
    pub buckets: Vec<u64>,
    pub points: Vec<DdpPoint>,
}

/// NVML health of one GPU.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct GpuHealth {
    pub index: u32,
    pub nvlink_active: u32,
    pub nvlink_expected: u32,
    /// Replay + recovery + CRC (flit) error counts over all active links: what
    /// `nvidia-smi nvlink -e` reports (not the data CRC/ECC counters, which count data
    /// corrected in flight).
    pub nvlink_errors: u64,
    /// One-direction bandwidth of one NVLink link (GB/s, by the link generation); 0 when
    /// unknown or without NVLink.
    #[serde(default, skip_serializing_if = "is_zero_f64")]
    pub nvlink_link_gbps: f64,
    /// Whether the GPU's active NVLink links go to NVSwitches (true) or straight to other
    /// GPUs (false); absent when NVML cannot say.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink_switch: Option<bool>,
    pub pcie_gen: u32,
    pub pcie_gen_max: u32,
    pub pcie_width: u32,
    pub pcie_width_max: u32,
    /// XID events seen during the check.
    pub xids: Vec<u64>,
    pub ecc_uncorrected: u64,
    pub remapped_pending: bool,
    pub remapped_failed: bool,
    /// Throttle reasons other than idle and application clocks.
    pub throttle: Vec<String>,
    pub temperature_c: f64,
    pub power_w: f64,
}

/// What each GPU of a node computed: the compute checks, all GPUs at once.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct ComputeResult {
    /// M = N = K of the GEMM throughput check, when it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemm_size: Option<u32>,
    /// Bytes of each memory copy, when the bandwidth check ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// M = N = K of the silent-data-corruption GEMM, when it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sdc_size: Option<u32>,
    /// One entry per GPU, by index.
    pub gpus: Vec<GpuCompute>,
}

/// What one GPU computed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct GpuCompute {
    pub gpu: u32,
    /// Dense bf16 GEMM throughput (fp32 accumulate), TFLOP/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemm_bf16_tflops: Option<f64>,
    /// Dense TF32 GEMM throughput, TFLOP/s; absent where the GPU has no TF32 or it was off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemm_tf32_tflops: Option<f64>,
    /// Device-to-device copy within the GPU, read and write counted (2 x bytes / time), GB/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_copy_gbps: Option<f64>,
    /// Fill of device memory (write only), GB/s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_write_gbps: Option<f64>,
    /// The silent-data-corruption check, when it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sdc: Option<SdcStatus>,
    /// Clocks, temperature, power and throttle reasons read while the GEMMs ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub under_load: Option<LoadReading>,
}

/// How one GPU's silent-data-corruption GEMM came out.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default)]
#[serde(rename_all = "camelCase")]
pub struct SdcStatus {
    /// Outputs computed (`sdc.repeats`).
    pub outputs: u32,
    /// Outputs whose row or column sums differ from the exact ones.
    pub wrong_outputs: u32,
    /// Rows and columns whose sums differ, over all outputs.
    pub wrong_lines: u64,
    /// The first element found wrong (row, column), when one was located.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_wrong: Option<(u32, u32)>,
    /// A hash of the first output's bytes (16 hex digits): equal on every healthy GPU.
    pub checksum: String,
    /// The output's bytes differ from most GPUs' (or, of two GPUs, from the exact result).
    pub differs_from_others: bool,
}

impl SdcStatus {
    /// Whether every output was exactly right and equal to the other GPUs'.
    pub fn clean(&self) -> bool {
        self.wrong_outputs == 0 && !self.differs_from_others
    }
}

/// One GPU's clocks, temperature, power and throttle reasons under load (NVML).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct LoadReading {
    pub sm_clock_mhz: u32,
    pub max_sm_clock_mhz: u32,
    pub temperature_c: f64,
    pub power_w: f64,
    pub power_limit_w: f64,
    /// Throttle reasons other than idle and application clocks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub throttle: Vec<String>,
}

/// NVML snapshot of a node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct HealthSnapshot {
    pub gpus: Vec<GpuHealth>,
}

/// Transport between two GPUs, from NCCL.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "camelCase")]
pub enum Transport {
    /// Peer to peer over NVLink.
    Nvlink,
    /// Peer to peer over PCIe.
    Pcie,
    /// Through host shared memory.
    Shm,
    /// Through the network (IB or sockets).
    Net,
    Unknown,
}

/// The transport NCCL chose between two GPUs of a node.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TransportInfo {
    pub a: u32,
    pub b: u32,
    pub transport: Transport,
}
