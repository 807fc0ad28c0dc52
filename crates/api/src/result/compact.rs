//! The compact result: what the operator needs to judge a node, in one- and two-letter keys
//! so that it fits a termination message.

use super::measurements::{
    CollectiveSweep, DdpPoint, DdpResult, GpuCompute, GpuHealth, HostBandwidth, PairMatrix,
    Transport,
};
use super::settings::{NcclSetting, SettingSource};
use super::software::CompactSoftware;
use super::text::cut;
use super::{
    Backend, COMPACT_VERSION, ErrorKind, ParseError, Phase, PhaseError, ResultDocument, is_zero,
    is_zero_f64, is_zero_u64,
};
use crate::suite::Collective;
use serde::{Deserialize, Serialize};

/// The compact result: what the operator needs to judge a node, in short keys so that an
/// 8-GPU node with the default suite fits a termination message (4096 bytes).
/// Bandwidths are rounded to 0.1 GB/s, times to 0.1 µs or 0.01 ms. The Rust names are
/// readable; the one- and two-letter keys are the wire form and never change within a version.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct CompactResult {
    /// Version, [`COMPACT_VERSION`].
    #[serde(rename = "v")]
    pub version: u32,
    #[serde(rename = "n")]
    pub node: String,
    #[serde(rename = "b")]
    pub backend: Backend,
    /// GPU product (of GPU 0).
    #[serde(rename = "p")]
    pub product: String,
    /// GPU count.
    #[serde(rename = "g")]
    pub gpus: u32,
    /// Duration of the check, seconds.
    #[serde(rename = "d")]
    pub duration_s: f64,
    /// NCCL sweep, one entry per collective.
    #[serde(rename = "nc", default, skip_serializing_if = "Vec::is_empty")]
    pub collectives: Vec<CompactCollective>,
    /// One-way copy bandwidth matrix, row-major g*g, diagonal 0.
    #[serde(rename = "pu", default, skip_serializing_if = "Vec::is_empty")]
    pub copy_uni: Vec<f64>,
    /// Bidirectional copy bandwidth, upper triangle row-major (0-1, 0-2, ..., 1-2, ...).
    #[serde(rename = "pb", default, skip_serializing_if = "Vec::is_empty")]
    pub copy_bidir: Vec<f64>,
    /// Host-to-device copy bandwidth per GPU.
    #[serde(rename = "hd", default, skip_serializing_if = "Vec::is_empty")]
    pub host_to_device: Vec<f64>,
    /// Device-to-host copy bandwidth per GPU.
    #[serde(rename = "dh", default, skip_serializing_if = "Vec::is_empty")]
    pub device_to_host: Vec<f64>,
    /// Corrupt copies in the pair matrix.
    #[serde(rename = "pc", default, skip_serializing_if = "is_zero")]
    pub corrupt_copies: u32,
    /// Bytes of each copy of the pair matrix; None from agents that did not say. Below
    /// [`COPY_BYTES`] the copies do not show the links' bandwidth.
    #[serde(rename = "pz", default, skip_serializing_if = "Option::is_none")]
    pub pair_bytes: Option<u64>,
    /// DDP weak-scaling points.
    #[serde(rename = "dp", default, skip_serializing_if = "Vec::is_empty")]
    pub ddp_points: Vec<CompactDdpPoint>,
    /// DDP compute time per GPU (ms) at the largest GPU count, by GPU index.
    #[serde(rename = "dc", default, skip_serializing_if = "Vec::is_empty")]
    pub ddp_compute_ms: Vec<f64>,
    /// NVML health per GPU.
    #[serde(rename = "h", default, skip_serializing_if = "Vec::is_empty")]
    pub health: Vec<CompactGpuHealth>,
    /// GPU pairs where NCCL chose a transport other than NVLink: [a, b, transport].
    #[serde(rename = "tf", default, skip_serializing_if = "Vec::is_empty")]
    pub transport_fallbacks: Vec<(u32, u32, Transport)>,
    /// Phase errors (messages cut to 160 characters).
    #[serde(rename = "e", default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<PhaseError>,
    /// The sweep's CUDA graph launches ([`super::NcclSweepResult::graph_launches`]): 0, its
    /// small sizes timed host-launched calls and move with the launching CPU's speed.
    #[serde(rename = "gl", default, skip_serializing_if = "is_zero")]
    pub graph_launches: u32,
    /// What each GPU computed, by GPU index; empty when the compute checks did not run.
    #[serde(rename = "cu", default, skip_serializing_if = "Vec::is_empty")]
    pub compute: Vec<CompactGpuCompute>,
    /// M = N = K of the compute check's throughput GEMMs, when they ran: smaller GEMMs do
    /// not reach a GPU's plateau.
    #[serde(rename = "cz", default, skip_serializing_if = "Option::is_none")]
    pub compute_gemm_size: Option<u32>,
    /// The NCCL tuning settings in effect that the test did not choose (not from the spec's
    /// agent env), with their sources; values and paths cut to [`SETTING_CHARS`].
    #[serde(rename = "ns", default, skip_serializing_if = "Vec::is_empty")]
    pub settings_not_chosen: Vec<CompactSetting>,
    /// The node's software (driver, CUDA, NCCL, NCCL's config files, VBIOS, fabric manager),
    /// which the run's nodes are compared by; empty from older agents.
    #[serde(
        rename = "sw",
        default,
        skip_serializing_if = "CompactSoftware::is_empty"
    )]
    pub software: CompactSoftware,
}

/// Longest value or file path of a setting in the compact result.
pub const SETTING_CHARS: usize = 48;

/// An NCCL setting the test did not choose, as the compact result carries it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct CompactSetting {
    #[serde(rename = "k")]
    pub name: String,
    #[serde(rename = "v")]
    pub value: String,
    #[serde(rename = "s")]
    pub source: SettingSource,
}

impl From<&NcclSetting> for CompactSetting {
    fn from(s: &NcclSetting) -> Self {
        CompactSetting {
            name: s.name.clone(),
            value: cut(&s.value, SETTING_CHARS),
            source: match &s.source {
                SettingSource::ConfFile(path) => SettingSource::ConfFile(cut(path, SETTING_CHARS)),
                other => other.clone(),
            },
        }
    }
}

impl std::fmt::Display for CompactSetting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={} from {}", self.name, self.value, self.source)
    }
}

/// What one GPU computed, summarised: throughputs rounded to 0.1, clocks and power whole.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct CompactGpuCompute {
    /// bf16 GEMM TFLOP/s; 0 when not measured.
    #[serde(rename = "bf", default, skip_serializing_if = "is_zero_f64")]
    pub bf16_tflops: f64,
    /// TF32 GEMM TFLOP/s; 0 when not measured.
    #[serde(rename = "tf", default, skip_serializing_if = "is_zero_f64")]
    pub tf32_tflops: f64,
    /// Device memory copy GB/s (read and write counted); 0 when not measured.
    #[serde(rename = "mc", default, skip_serializing_if = "is_zero_f64")]
    pub memory_copy_gbps: f64,
    /// Silent-data-corruption check: None when it did not run, else (wrong outputs of
    /// outputs, differs from the other GPUs).
    #[serde(rename = "sd", default, skip_serializing_if = "Option::is_none")]
    pub sdc: Option<(u32, u32, bool)>,
    /// SM clock and its maximum under load (MHz), power and its limit (W), temperature (°C);
    /// absent when NVML could not read them.
    #[serde(rename = "ld", default, skip_serializing_if = "Option::is_none")]
    pub load: Option<(u32, u32, u32, u32, u32)>,
    /// Throttle reasons under load (short names).
    #[serde(rename = "th", default, skip_serializing_if = "Vec::is_empty")]
    pub throttle: Vec<String>,
}

impl From<&GpuCompute> for CompactGpuCompute {
    fn from(g: &GpuCompute) -> Self {
        CompactGpuCompute {
            bf16_tflops: r1(g.gemm_bf16_tflops.unwrap_or(0.0)),
            tf32_tflops: r1(g.gemm_tf32_tflops.unwrap_or(0.0)),
            memory_copy_gbps: g.memory_copy_gbps.unwrap_or(0.0).round(),
            sdc: g
                .sdc
                .as_ref()
                .map(|s| (s.wrong_outputs, s.outputs, s.differs_from_others)),
            load: g.under_load.as_ref().map(|l| {
                (
                    l.sm_clock_mhz,
                    l.max_sm_clock_mhz,
                    l.power_w.round() as u32,
                    l.power_limit_w.round() as u32,
                    l.temperature_c.round() as u32,
                )
            }),
            throttle: g
                .under_load
                .as_ref()
                .map(|l| l.throttle.clone())
                .unwrap_or_default(),
        }
    }
}

/// The compute checks of `doc` by GPU index; empty when they did not run.
fn compute_of(doc: &ResultDocument, n: usize) -> Vec<CompactGpuCompute> {
    let Some(c) = &doc.compute else {
        return Vec::new();
    };
    let mut out = vec![CompactGpuCompute::default(); n.max(c.gpus.len())];
    for g in &c.gpus {
        if let Some(slot) = out.get_mut(g.gpu as usize) {
            *slot = CompactGpuCompute::from(g);
        }
    }
    out
}

/// One collective of the sweep, summarised.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct CompactCollective {
    #[serde(rename = "c")]
    pub collective: Collective,
    /// Peak out-of-place busbw (GB/s).
    #[serde(rename = "pk")]
    pub peak_busbw: f64,
    /// Out-of-place busbw at the largest size (GB/s).
    #[serde(rename = "bb")]
    pub largest_busbw: f64,
    /// Out-of-place time at the smallest size (µs).
    #[serde(rename = "lt")]
    pub smallest_time_us: f64,
    /// Fitted alpha (µs) and beta (GB/s).
    #[serde(rename = "ab", default, skip_serializing_if = "Option::is_none")]
    pub alpha_beta: Option<(f64, f64)>,
    /// Wrong elements, all sizes, in and out of place.
    #[serde(rename = "w", default, skip_serializing_if = "is_zero_u64")]
    pub wrong: u64,
    /// Largest size of the sweep (bytes, nccl-tests' size column); None from agents that
    /// did not say. Below [`BANDWIDTH_BYTES`] the peak busbw is not the links' bandwidth.
    #[serde(rename = "mx", default, skip_serializing_if = "Option::is_none")]
    pub largest_bytes: Option<u64>,
}

/// Smallest largest-size of a sweep whose peak bus bandwidth is judged as bandwidth (floors,
/// the relation to the copy engines, the fleet comparison). A healthy all_reduce reaches more
/// than half of what its links carry there: 262 GB/s of 450 on 2 x H100 at 64 MiB, 249 on
/// 4 x H200 already at 16 MiB; at 1 MiB 2 x H100 read 12-31 GB/s. A sweep that ends below it
/// (a latency test, `ncclSweep.maxBytes` set low) says nothing of the links' bandwidth.
pub const BANDWIDTH_BYTES: u64 = 64 << 20;

/// Smallest copy of the pair matrix whose bandwidths are judged as the links' (pair and host
/// floors, the node's and the fleet's comparisons). 2 x H200, one-way copies between the two
/// GPUs: 74 GB/s at 256 KiB, 190 at 1 MiB, 305 at 4 MiB, 357 at 16 MiB, 394 at 256 MiB (the
/// floor is 225); host to device 16-42 GB/s at 1 MiB, 48-52 at 16 MiB, 55 at 256 MiB.
pub const COPY_BYTES: u64 = 16 << 20;

/// Least compute time per step (ms, the node's median GPU) of a DDP probe whose stragglers
/// and scaling are judged. Below it kernel launches set the time: on 2 x H200 one GPU read
/// 1.08-1.24x the other at 0.06-0.17 ms (hidden 512-1024), 1.00-1.01x from 0.42 ms (hidden
/// 2048, 4 layers) up to the default probe's 22.5 ms; a straggler is 1.10x.
pub const DDP_COMPUTE_MS: f64 = 1.0;

/// One DDP scaling point, summarised.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct CompactDdpPoint {
    #[serde(rename = "g")]
    pub gpus: u32,
    #[serde(rename = "st")]
    pub step_ms: f64,
    #[serde(rename = "e")]
    pub scaling_efficiency: f64,
    #[serde(rename = "cf")]
    pub comm_fraction: f64,
    #[serde(rename = "ov")]
    pub overlap_efficiency: f64,
    #[serde(rename = "tf")]
    pub tflops_per_gpu: f64,
}

/// NVML health of one GPU, only what can fail a node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct CompactGpuHealth {
    /// NVLink links active and expected.
    #[serde(rename = "l")]
    pub nvlinks: (u32, u32),
    /// NVLink error count.
    #[serde(rename = "le", default, skip_serializing_if = "is_zero_u64")]
    pub nvlink_errors: u64,
    /// One-direction GB/s of one NVLink link; 0 when unknown.
    #[serde(rename = "ls", default, skip_serializing_if = "is_zero_f64")]
    pub nvlink_link_gbps: f64,
    /// NVLink links to NVSwitches (true) or to GPUs (false); absent when unknown.
    #[serde(rename = "sw", default, skip_serializing_if = "Option::is_none")]
    pub nvlink_switch: Option<bool>,
    /// PCIe generation current, max, width current, max.
    #[serde(rename = "pc")]
    pub pcie: (u32, u32, u32, u32),
    /// XIDs seen.
    #[serde(rename = "x", default, skip_serializing_if = "Vec::is_empty")]
    pub xids: Vec<u64>,
    /// Uncorrectable ECC errors.
    #[serde(rename = "ec", default, skip_serializing_if = "is_zero_u64")]
    pub ecc_uncorrected: u64,
    /// Row remap: 0 ok, 1 pending, 2 failed, 3 both.
    #[serde(rename = "rr", default, skip_serializing_if = "is_zero")]
    pub row_remap: u32,
    /// Temperature (°C).
    #[serde(rename = "t")]
    pub temperature_c: f64,
    /// Throttle reasons (short names).
    #[serde(rename = "th", default, skip_serializing_if = "Vec::is_empty")]
    pub throttle: Vec<String>,
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
        let g = self.gpus as usize;
        if src == dst || self.copy_uni.len() != g * g {
            return None;
        }
        self.copy_uni.get(src as usize * g + dst as usize).copied()
    }

    /// Bidirectional bandwidth of the unordered pair {a, b}, if measured.
    pub fn pair_bidir(&self, a: u32, b: u32) -> Option<f64> {
        let (a, b) = if a < b { (a, b) } else { (b, a) };
        if a == b {
            return None;
        }
        self.copy_bidir.get(upper_index(self.gpus, a, b)).copied()
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
        let mut c = CompactResult {
            version: COMPACT_VERSION,
            node: doc.node.clone(),
            backend: doc.backend,
            product: doc
                .gpus
                .first()
                .map(|g| g.product.clone())
                .unwrap_or_default(),
            gpus: g,
            duration_s: r1(doc.duration_s),
            collectives: doc.nccl.as_ref().map_or_else(Vec::new, |n| {
                n.collectives.iter().map(CompactCollective::from).collect()
            }),
            copy_uni: Vec::new(),
            copy_bidir: Vec::new(),
            host_to_device: Vec::new(),
            device_to_host: Vec::new(),
            corrupt_copies: 0,
            pair_bytes: None,
            ddp_points: Vec::new(),
            ddp_compute_ms: Vec::new(),
            health: doc.health.as_ref().map_or_else(Vec::new, |s| {
                s.gpus.iter().map(CompactGpuHealth::from).collect()
            }),
            transport_fallbacks: doc
                .transports
                .iter()
                .filter(|t| t.transport != Transport::Nvlink)
                .map(|t| (t.a, t.b, t.transport))
                .collect(),
            errors: doc
                .errors
                .iter()
                .map(|e| PhaseError {
                    phase: e.phase,
                    kind: e.kind,
                    message: cut(&e.message, 160),
                })
                .collect(),
            graph_launches: doc.nccl.as_ref().map_or(0, |n| n.graph_launches),
            compute: compute_of(doc, g as usize),
            compute_gemm_size: doc.compute.as_ref().and_then(|c| c.gemm_size),
            settings_not_chosen: doc
                .nccl_settings
                .iter()
                .filter(|s| !s.source.chosen())
                .map(CompactSetting::from)
                .collect(),
            software: CompactSoftware::from(doc),
        };
        if let Some(p) = &doc.pairs {
            let n = g as usize;
            c.copy_uni = copy_uni(p, n);
            c.copy_bidir = copy_bidir(p, g);
            c.host_to_device = per_gpu(&p.host_to_device, n);
            c.device_to_host = per_gpu(&p.device_to_host, n);
            c.corrupt_copies = p.corrupt_copies;
            c.pair_bytes = Some(p.bytes);
        }
        if let Some(d) = &doc.ddp {
            c.ddp_points = d.points.iter().map(CompactDdpPoint::from).collect();
            c.ddp_compute_ms = ddp_compute_ms(d, g as usize);
        }
        c
    }
}

impl From<&CollectiveSweep> for CompactCollective {
    fn from(c: &CollectiveSweep) -> Self {
        CompactCollective {
            collective: c.collective,
            peak_busbw: r1(c.peak_busbw()),
            largest_busbw: r1(c.rows.last().map_or(0.0, |r| r.out_of_place.busbw)),
            smallest_time_us: r1(c.min_time_us().unwrap_or(0.0)),
            alpha_beta: c.fit.map(|f| (r1(f.alpha_us), r1(f.beta_gbps))),
            wrong: c.total_wrong(),
            largest_bytes: c.rows.iter().map(|r| r.bytes).max(),
        }
    }
}

impl From<&DdpPoint> for CompactDdpPoint {
    fn from(p: &DdpPoint) -> Self {
        CompactDdpPoint {
            gpus: p.gpus,
            step_ms: r2(p.step_ms),
            scaling_efficiency: r3(p.scaling_efficiency),
            comm_fraction: r3(p.comm_fraction),
            overlap_efficiency: r3(p.overlap_efficiency),
            tflops_per_gpu: r1(p.tflops_per_gpu),
        }
    }
}

impl From<&GpuHealth> for CompactGpuHealth {
    fn from(gh: &GpuHealth) -> Self {
        CompactGpuHealth {
            nvlinks: (gh.nvlink_active, gh.nvlink_expected),
            nvlink_errors: gh.nvlink_errors,
            nvlink_link_gbps: r1(gh.nvlink_link_gbps),
            nvlink_switch: gh.nvlink_switch,
            pcie: (
                gh.pcie_gen,
                gh.pcie_gen_max,
                gh.pcie_width,
                gh.pcie_width_max,
            ),
            xids: gh.xids.clone(),
            ecc_uncorrected: gh.ecc_uncorrected,
            row_remap: u32::from(gh.remapped_pending) | (u32::from(gh.remapped_failed) << 1),
            temperature_c: r1(gh.temperature_c),
            throttle: gh.throttle.clone(),
        }
    }
}

/// The one-way copy matrix of `n` GPUs, row-major, diagonal 0; empty when not measured.
fn copy_uni(p: &PairMatrix, n: usize) -> Vec<f64> {
    if p.unidirectional.is_empty() {
        return Vec::new();
    }
    let mut pu = vec![0.0; n * n];
    for e in &p.unidirectional {
        if let Some(slot) = pu.get_mut(e.src as usize * n + e.dst as usize) {
            *slot = r1(e.gbps);
        }
    }
    pu
}

/// The bidirectional copies of `g` GPUs as an upper triangle; empty when not measured.
fn copy_bidir(p: &PairMatrix, g: u32) -> Vec<f64> {
    let n = g as usize;
    if p.bidirectional.is_empty() || n < 2 {
        return Vec::new();
    }
    let mut pb = vec![0.0; n * (n - 1) / 2];
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
    pb
}

/// DDP compute time per GPU index at the largest GPU count; empty without points.
fn ddp_compute_ms(d: &DdpResult, n: usize) -> Vec<f64> {
    let Some(last) = d.points.iter().max_by_key(|p| p.gpus) else {
        return Vec::new();
    };
    let mut dc = vec![0.0; n];
    for (idx, ms) in last.gpu_indices.iter().zip(&last.compute_ms) {
        if let Some(slot) = dc.get_mut(*idx as usize) {
            *slot = r2(*ms);
        }
    }
    dc
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
    /// The compact form, guaranteed to fit `limit` bytes: when the full compact form does
    /// not fit, the least important detail is dropped first (throttle reasons, then the length
    /// of error messages), and a last resort keeps only identity and one error.
    pub fn compact_within(&self, limit: usize) -> String {
        let mut c = CompactResult::from(self);
        let mut text = c.to_json();
        if text.len() <= limit {
            return text;
        }
        for h in &mut c.health {
            h.throttle.clear();
        }
        for g in &mut c.compute {
            g.throttle.clear();
        }
        text = c.to_json();
        if text.len() <= limit {
            return text;
        }
        for e in &mut c.errors {
            e.message = cut(&e.message, 40);
        }
        text = c.to_json();
        if text.len() <= limit {
            return text;
        }
        // What each setting is named and where it came from stays: the rules judge those.
        for s in &mut c.settings_not_chosen {
            s.value = cut(&s.value, 8);
            if let SettingSource::ConfFile(path) = &mut s.source {
                *path = cut(path, 16);
            }
        }
        text = c.to_json();
        if text.len() <= limit {
            return text;
        }
        let minimal = CompactResult {
            collectives: Vec::new(),
            copy_uni: Vec::new(),
            copy_bidir: Vec::new(),
            host_to_device: Vec::new(),
            device_to_host: Vec::new(),
            ddp_points: Vec::new(),
            ddp_compute_ms: Vec::new(),
            health: Vec::new(),
            transport_fallbacks: Vec::new(),
            compute: Vec::new(),
            compute_gemm_size: None,
            errors: vec![PhaseError {
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
