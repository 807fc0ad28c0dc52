//! The result document an agent writes: a full form (JSON file and last line of stdout) and
//! a compact form (the termination message, at most 4096 bytes for an 8-GPU node with the
//! default suite). Both are versioned; readers reject a version they do not know.
//!
//! Bandwidths are GB/s (10^9 bytes per second), times are microseconds or milliseconds as
//! the field name says.

use crate::suite::{Collective, DataType};
use serde::{Deserialize, Serialize};

/// Schema tag of the full document.
pub const FULL_SCHEMA: &str = "gpufabric.io/result/v1";
/// Version number of the compact document (field `v`).
pub const COMPACT_VERSION: u32 = 1;

/// Which backend produced a document.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    #[default]
    Cuda,
    Sim,
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Backend::Cuda => "cuda",
            Backend::Sim => "sim",
        })
    }
}

/// The phases of a node check.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub enum Phase {
    Setup,
    Health,
    NcclSweep,
    GpuPairs,
    DdpProbe,
    NodePair,
}

/// How a phase failed.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub enum ErrorKind {
    /// The phase ran past its watchdog and was aborted.
    Timeout,
    /// The phase failed (a CUDA or NCCL error, a process that died).
    Failed,
    /// The phase could not run here (library missing, too few GPUs).
    Unavailable,
}

/// A phase that did not produce a measurement.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PhaseError {
    pub phase: Phase,
    pub kind: ErrorKind,
    pub message: String,
}

/// The full result document of one node check.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ResultDocument {
    /// Always [`FULL_SCHEMA`].
    pub schema: String,
    pub node: String,
    pub backend: Backend,
    /// RFC 3339.
    pub started_at: String,
    pub duration_s: f64,
    pub versions: Versions,
    pub gpus: Vec<GpuInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl: Option<NcclSweepResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pairs: Option<PairMatrix>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ddp: Option<DdpResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthSnapshot>,
    /// Transport NCCL chose between each pair of GPUs (from NCCL's own information).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub transports: Vec<TransportInfo>,
    /// The node's InfiniBand / RoCE ports (sysfs), when it has any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nics: Vec<crate::pair::NicPort>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<PhaseError>,
}

/// Software versions seen by the agent.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct Versions {
    pub agent: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl: Option<String>,
}

/// One GPU as the agent saw it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GpuInfo {
    pub index: u32,
    pub product: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    pub memory_bytes: u64,
}

/// One row of an NCCL sweep, in nccl-tests' terms.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SweepRow {
    pub bytes: u64,
    pub count: u64,
    /// Out-of-place: average time per iteration (microseconds), algbw and busbw (GB/s),
    /// and wrong elements.
    pub time_us: f64,
    pub algbw: f64,
    pub busbw: f64,
    pub wrong: u64,
    /// The same, in place.
    pub in_place_time_us: f64,
    pub in_place_algbw: f64,
    pub in_place_busbw: f64,
    pub in_place_wrong: u64,
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
        self.rows.iter().map(|r| r.busbw).fold(0.0, f64::max)
    }
    /// Out-of-place time of the smallest size (microseconds).
    pub fn min_time_us(&self) -> Option<f64> {
        self.rows.first().map(|r| r.time_us)
    }
    /// Wrong elements over all rows, in and out of place.
    pub fn total_wrong(&self) -> u64 {
        self.rows.iter().map(|r| r.wrong + r.in_place_wrong).sum()
    }
}

/// NCCL sweep over all GPUs of a node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NcclSweepResult {
    pub collectives: Vec<CollectiveSweep>,
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
    /// Replay + recovery + CRC error counts over all links.
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

/// NVML snapshot of a node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct HealthSnapshot {
    pub gpus: Vec<GpuHealth>,
}

/// Transport between two GPUs, from NCCL.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
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

// ---------------------------------------------------------------------------------------
// Compact form
// ---------------------------------------------------------------------------------------

/// The compact result: what the operator needs to judge a node, in short keys so that an
/// 8-GPU node with the default suite fits a termination message (4096 bytes).
/// Bandwidths are rounded to 0.1 GB/s, times to 0.1 µs or 0.01 ms.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct CompactResult {
    /// Version, [`COMPACT_VERSION`].
    pub v: u32,
    /// Node name.
    pub n: String,
    /// Backend.
    pub b: Backend,
    /// GPU product (of GPU 0).
    pub p: String,
    /// GPU count.
    pub g: u32,
    /// Duration of the check, seconds.
    pub d: f64,
    /// NCCL sweep, one entry per collective.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nc: Vec<CompactCollective>,
    /// One-way copy bandwidth matrix, row-major g*g, diagonal 0.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pu: Vec<f64>,
    /// Bidirectional copy bandwidth, upper triangle row-major (0-1, 0-2, ..., 1-2, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pb: Vec<f64>,
    /// Host-to-device per GPU.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hd: Vec<f64>,
    /// Device-to-host per GPU.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dh: Vec<f64>,
    /// Corrupt copies in the pair matrix.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pc: u32,
    /// DDP weak-scaling points.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dp: Vec<CompactDdpPoint>,
    /// DDP compute time per GPU (ms) at the largest GPU count, by GPU index.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dc: Vec<f64>,
    /// NVML health per GPU.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub h: Vec<CompactGpuHealth>,
    /// GPU pairs where NCCL chose a transport other than NVLink: [a, b, transport].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tf: Vec<(u32, u32, Transport)>,
    /// Phase errors (messages cut to 160 characters).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub e: Vec<PhaseError>,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// One collective of the sweep, summarised.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct CompactCollective {
    /// Collective.
    pub c: Collective,
    /// Peak out-of-place busbw (GB/s).
    pub pk: f64,
    /// Out-of-place busbw at the largest size (GB/s).
    pub bb: f64,
    /// Out-of-place time at the smallest size (µs).
    pub lt: f64,
    /// Fitted alpha (µs) and beta (GB/s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ab: Option<(f64, f64)>,
    /// Wrong elements, all sizes, in and out of place.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub w: u64,
}

fn is_zero_u64(v: &u64) -> bool {
    *v == 0
}

fn is_zero_f64(v: &f64) -> bool {
    *v == 0.0
}

/// One DDP scaling point, summarised.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct CompactDdpPoint {
    /// GPUs.
    pub g: u32,
    /// Step time (ms).
    pub st: f64,
    /// Scaling efficiency.
    pub e: f64,
    /// Communication fraction.
    pub cf: f64,
    /// Overlap efficiency.
    pub ov: f64,
    /// TFLOP/s per GPU.
    pub tf: f64,
}

/// NVML health of one GPU, only what can fail a node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct CompactGpuHealth {
    /// NVLink links active and expected.
    pub l: (u32, u32),
    /// NVLink error count.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub le: u64,
    /// One-direction GB/s of one NVLink link; 0 when unknown.
    #[serde(rename = "ls", default, skip_serializing_if = "is_zero_f64")]
    pub nvlink_link_gbps: f64,
    /// NVLink links to NVSwitches (true) or to GPUs (false); absent when unknown.
    #[serde(rename = "sw", default, skip_serializing_if = "Option::is_none")]
    pub nvlink_switch: Option<bool>,
    /// PCIe generation current, max, width current, max.
    pub pc: (u32, u32, u32, u32),
    /// XIDs seen.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub x: Vec<u64>,
    /// Uncorrectable ECC errors.
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub ec: u64,
    /// Row remap: 0 ok, 1 pending, 2 failed, 3 both.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub rr: u32,
    /// Temperature (°C).
    pub t: f64,
    /// Throttle reasons (short names).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub th: Vec<String>,
}

fn r1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}
fn r2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}
fn r3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn cut(message: &str, max: usize) -> String {
    if message.len() <= max {
        return message.to_string();
    }
    let mut end = max;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &message[..end])
}

/// Errors reading a result document.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ParseError {
    #[error("the result document is empty (the agent wrote no termination message)")]
    Empty,
    #[error("the result document is not valid JSON ({0}); it may be truncated")]
    Malformed(String),
    #[error("the result document has version {found}, this operator reads version {expected}")]
    Version { found: u32, expected: u32 },
}

impl CompactResult {
    /// Reads a compact document, rejecting empty, truncated, malformed and unknown-version input.
    pub fn parse(text: &str) -> Result<CompactResult, ParseError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(ParseError::Empty);
        }
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| ParseError::Malformed(e.to_string()))?;
        let found = value.get("v").and_then(|v| v.as_u64()).unwrap_or(0) as u32;
        if found != COMPACT_VERSION {
            return Err(ParseError::Version {
                found,
                expected: COMPACT_VERSION,
            });
        }
        serde_json::from_value(value).map_err(|e| ParseError::Malformed(e.to_string()))
    }

    /// Compact JSON text.
    pub fn to_json(&self) -> String {
        // Serialising plain data with string keys cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// One-way bandwidth from `src` to `dst`, if measured.
    pub fn pair_uni(&self, src: u32, dst: u32) -> Option<f64> {
        let g = self.g as usize;
        if src == dst || self.pu.len() != g * g {
            return None;
        }
        self.pu.get(src as usize * g + dst as usize).copied()
    }

    /// Bidirectional bandwidth of the unordered pair {a, b}, if measured.
    pub fn pair_bidir(&self, a: u32, b: u32) -> Option<f64> {
        let (a, b) = if a < b { (a, b) } else { (b, a) };
        if a == b {
            return None;
        }
        self.pb.get(upper_index(self.g, a, b)).copied()
    }
}

/// Index of the unordered pair (a < b) in a row-major upper triangle of g GPUs.
pub fn upper_index(g: u32, a: u32, b: u32) -> usize {
    let (g, a, b) = (g as usize, a as usize, b as usize);
    a * (2 * g - a - 1) / 2 + (b - a - 1)
}

impl From<&ResultDocument> for CompactResult {
    fn from(doc: &ResultDocument) -> Self {
        let g = doc.gpus.len() as u32;
        let nc = doc
            .nccl
            .as_ref()
            .map(|n| {
                n.collectives
                    .iter()
                    .map(|c| CompactCollective {
                        c: c.collective,
                        pk: r1(c.peak_busbw()),
                        bb: r1(c.rows.last().map(|r| r.busbw).unwrap_or(0.0)),
                        lt: r1(c.min_time_us().unwrap_or(0.0)),
                        ab: c.fit.map(|f| (r1(f.alpha_us), r1(f.beta_gbps))),
                        w: c.total_wrong(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let (mut pu, mut pb, mut hd, mut dh, mut pc) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), 0);
        if let Some(p) = &doc.pairs {
            let n = g as usize;
            if !p.unidirectional.is_empty() {
                pu = vec![0.0; n * n];
                for e in &p.unidirectional {
                    if let Some(slot) = pu.get_mut(e.src as usize * n + e.dst as usize) {
                        *slot = r1(e.gbps);
                    }
                }
            }
            if !p.bidirectional.is_empty() && n >= 2 {
                pb = vec![0.0; n * (n - 1) / 2];
                for e in &p.bidirectional {
                    let (a, b) = if e.src < e.dst {
                        (e.src, e.dst)
                    } else {
                        (e.dst, e.src)
                    };
                    if a != b
                        && let Some(slot) = pb.get_mut(upper_index(g, a, b))
                    {
                        *slot = r1(e.gbps);
                    }
                }
            }
            hd = per_gpu(&p.host_to_device, n);
            dh = per_gpu(&p.device_to_host, n);
            pc = p.corrupt_copies;
        }
        let (mut dp, mut dc) = (Vec::new(), Vec::new());
        if let Some(d) = &doc.ddp {
            dp = d
                .points
                .iter()
                .map(|p| CompactDdpPoint {
                    g: p.gpus,
                    st: r2(p.step_ms),
                    e: r3(p.scaling_efficiency),
                    cf: r3(p.comm_fraction),
                    ov: r3(p.overlap_efficiency),
                    tf: r1(p.tflops_per_gpu),
                })
                .collect();
            if let Some(last) = d.points.iter().max_by_key(|p| p.gpus) {
                dc = vec![0.0; g as usize];
                for (idx, ms) in last.gpu_indices.iter().zip(&last.compute_ms) {
                    if let Some(slot) = dc.get_mut(*idx as usize) {
                        *slot = r2(*ms);
                    }
                }
            }
        }
        let h = doc
            .health
            .as_ref()
            .map(|s| {
                s.gpus
                    .iter()
                    .map(|gh| CompactGpuHealth {
                        l: (gh.nvlink_active, gh.nvlink_expected),
                        le: gh.nvlink_errors,
                        nvlink_link_gbps: r1(gh.nvlink_link_gbps),
                        nvlink_switch: gh.nvlink_switch,
                        pc: (
                            gh.pcie_gen,
                            gh.pcie_gen_max,
                            gh.pcie_width,
                            gh.pcie_width_max,
                        ),
                        x: gh.xids.clone(),
                        ec: gh.ecc_uncorrected,
                        rr: u32::from(gh.remapped_pending) | (u32::from(gh.remapped_failed) << 1),
                        t: r1(gh.temperature_c),
                        th: gh.throttle.clone(),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let tf = doc
            .transports
            .iter()
            .filter(|t| t.transport != Transport::Nvlink)
            .map(|t| (t.a, t.b, t.transport))
            .collect();
        let e = doc
            .errors
            .iter()
            .map(|e| PhaseError {
                phase: e.phase,
                kind: e.kind,
                message: cut(&e.message, 160),
            })
            .collect();
        CompactResult {
            v: COMPACT_VERSION,
            n: doc.node.clone(),
            b: doc.backend,
            p: doc
                .gpus
                .first()
                .map(|g| g.product.clone())
                .unwrap_or_default(),
            g,
            d: r1(doc.duration_s),
            nc,
            pu,
            pb,
            hd,
            dh,
            pc,
            dp,
            dc,
            h,
            tf,
            e,
        }
    }
}

fn per_gpu(values: &[HostBandwidth], n: usize) -> Vec<f64> {
    if values.is_empty() {
        return Vec::new();
    }
    let mut out = vec![0.0; n];
    for v in values {
        if let Some(slot) = out.get_mut(v.gpu as usize) {
            *slot = r1(v.gbps);
        }
    }
    out
}

impl ResultDocument {
    /// Reads a full document, rejecting malformed and unknown-schema input.
    pub fn parse(text: &str) -> Result<ResultDocument, ParseError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(ParseError::Empty);
        }
        let doc: ResultDocument =
            serde_json::from_str(text).map_err(|e| ParseError::Malformed(e.to_string()))?;
        if doc.schema != FULL_SCHEMA {
            return Err(ParseError::Malformed(format!(
                "schema is {:?}, expected {FULL_SCHEMA:?}",
                doc.schema
            )));
        }
        Ok(doc)
    }

    /// The compact form, guaranteed to fit `limit` bytes: when the full compact form does
    /// not fit, the least important detail is dropped first (throttle reasons, then the length
    /// of error messages), and a last resort keeps only identity and one error.
    pub fn compact_within(&self, limit: usize) -> String {
        let mut c = CompactResult::from(self);
        let mut text = c.to_json();
        if text.len() <= limit {
            return text;
        }
        for h in &mut c.h {
            h.th.clear();
        }
        text = c.to_json();
        if text.len() <= limit {
            return text;
        }
        for e in &mut c.e {
            e.message = cut(&e.message, 40);
        }
        text = c.to_json();
        if text.len() <= limit {
            return text;
        }
        let minimal = CompactResult {
            nc: Vec::new(),
            pu: Vec::new(),
            pb: Vec::new(),
            hd: Vec::new(),
            dh: Vec::new(),
            dp: Vec::new(),
            dc: Vec::new(),
            h: Vec::new(),
            tf: Vec::new(),
            e: vec![PhaseError {
                phase: Phase::Setup,
                kind: ErrorKind::Failed,
                message: format!(
                    "compact result over {limit} bytes; read the full document from the pod log"
                ),
            }],
            ..c
        };
        minimal.to_json()
    }
}
