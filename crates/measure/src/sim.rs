//! The sim backend: the same result document as the cuda backend, computed from a model of
//! the declared node (alpha-beta per link, per-product bandwidths and compute) with the
//! faults of the fleet description injected, and small seeded noise. It exists so that
//! everything above the GPU layer can be tested on machines without GPUs; it never runs
//! unless asked for by name.
//!
//! The model, per node of `g` GPUs of one product on an NVSwitch board:
//! - every GPU pair has a link factor (1.0 healthy): a `slowPair` multiplies it, a
//!   `deadLink` scales every pair of that GPU by active/expected links, a
//!   `transportFallback` caps it at the fallback transport's bandwidth;
//! - copies: product copy bandwidth x link factor; host copies: product host bandwidth x
//!   the PCIe link's trained rate over its maximum;
//! - NCCL: `time = alpha + bytes * busbw_factor / busbw`, busbw the product's ring bus
//!   bandwidth x the smallest link factor among the ranks (a ring runs at its slowest link);
//! - DDP: compute time from the step's FLOPs over the product's effective TFLOP/s (times a
//!   straggler's factor), gradient buckets (PyTorch DDP assignment, fp32 gradients, the
//!   same as the cuda backend) all-reduced with the NCCL model as soon as backward has
//!   produced them, overlapped with the rest of backward; while they overlap, compute runs
//!   5% slower and the all-reduce at 45% of its standalone speed (fitted to a measured
//!   4 x H200 run, see [`H200`]).

use crate::fleet::{Fault, FleetNode};
use crate::{CheckError, CheckOptions, Progress, stats};
use gpufabric_api::ResultDocument;
use gpufabric_api::result::{
    Backend, CollectiveSweep, DdpPoint, DdpResult, ErrorKind, FULL_SCHEMA, GpuHealth, GpuInfo,
    HealthSnapshot, HostBandwidth, NcclSweepResult, PairBandwidth, PairMatrix, Phase, PhaseError,
    SweepRow, Transport, TransportInfo, Versions,
};
use gpufabric_api::suite::{Collective, DdpProbe, Suite};
use std::time::{Duration, Instant, SystemTime};

/// What a healthy GPU of one product measures in the model. Figures are per GPU on an
/// 8-GPU NVSwitch board.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProductModel {
    /// Short name (`H100`, `H200`, ...).
    pub name: &'static str,
    pub memory_bytes: u64,
    /// NVLink links per GPU (0: PCIe only).
    pub nvlinks: u32,
    /// Copy-engine peer copy, one direction, GB/s.
    pub copy_uni_gbps: f64,
    /// Copy-engine peer copy, both directions at once (sum), GB/s.
    pub copy_bidir_gbps: f64,
    /// NCCL all_reduce bus bandwidth at large sizes, all GPUs of the board, GB/s.
    pub all_reduce_busbw_gbps: f64,
    /// NCCL all_reduce latency at the smallest sizes, 8 ranks, microseconds.
    pub alpha_us: f64,
    /// Pinned host<->device copy, GB/s.
    pub host_gbps: f64,
    pub pcie_gen: u32,
    pub pcie_width: u32,
    /// Achieved dense bf16 GEMM throughput, TFLOP/s.
    pub tflops: f64,
    /// Power draw of an idle GPU, W.
    pub idle_power_w: f64,
}

/// NVIDIA H100 SXM5 80GB. Copy bandwidth: nvbandwidth on HGX H100 measures about
/// 370-390 GB/s one way and 740-780 GB/s both ways per pair (18 NVLink 4 links, 450 GB/s
/// nominal per direction). all_reduce busbw: nccl-tests on 8 GPUs without NVLS about
/// 360 GB/s. Host: PCIe Gen5 x16, about 55 GB/s pinned. Latency: the same NVLink 4 and
/// NVSwitch as H200, so H200's measured value (see [`H200`]). TFLOP/s: model value, a
/// little under H200's measured 616 (same GH100 compute, slower HBM3).
pub const H100: ProductModel = ProductModel {
    name: "H100",
    memory_bytes: 81_559 << 20,
    nvlinks: 18,
    copy_uni_gbps: 370.0,
    copy_bidir_gbps: 740.0,
    all_reduce_busbw_gbps: 360.0,
    alpha_us: 12.5,
    host_gbps: 55.0,
    pcie_gen: 5,
    pcie_width: 16,
    tflops: 600.0,
    idle_power_w: 115.0,
};

/// NVIDIA H200 SXM 141GB: the same NVLink 4 as H100 with faster HBM3e. Calibrated on this
/// project's own cuda-backend run on a 4 x H200 host, NVLS off
/// (`crates/health/tests/data/h200x4-full.compact`): one-way copy 394.8 GB/s, both ways
/// 779 GB/s, host copies 55.5 GB/s, all_reduce busbw 354 GB/s at 4 GPUs (nccl-tests on 8
/// GPUs without NVLS: 355-370), all_reduce latency 10.2 µs at 4 GPUs (12.5 µs at 8 by
/// this model's log2 scaling), DDP probe 616 TFLOP/s on one GPU.
pub const H200: ProductModel = ProductModel {
    name: "H200",
    memory_bytes: 143_771 << 20,
    nvlinks: 18,
    copy_uni_gbps: 396.0,
    copy_bidir_gbps: 783.0,
    all_reduce_busbw_gbps: 362.0,
    alpha_us: 12.5,
    host_gbps: 55.0,
    pcie_gen: 5,
    pcie_width: 16,
    tflops: 620.0,
    idle_power_w: 120.0,
};

/// NVIDIA A100 SXM4 80GB: 12 NVLink 3 links (300 GB/s nominal per direction); model
/// values of about 180 GB/s one-way copy and 230 GB/s all_reduce busbw. Host PCIe Gen4
/// x16, about 25 GB/s. TFLOP/s: 312 dense bf16 peak, about 80% achieved. Latency: model
/// value, a little above H100's.
pub const A100: ProductModel = ProductModel {
    name: "A100",
    memory_bytes: 81_920 << 20,
    nvlinks: 12,
    copy_uni_gbps: 180.0,
    copy_bidir_gbps: 360.0,
    all_reduce_busbw_gbps: 230.0,
    alpha_us: 15.0,
    host_gbps: 25.0,
    pcie_gen: 4,
    pcie_width: 16,
    tflops: 250.0,
    idle_power_w: 60.0,
};

/// NVIDIA B200: NVLink 5 at twice H100's bandwidth (900 GB/s nominal per direction);
/// model values of about double H100's bandwidths and compute, latency a little lower.
/// Host PCIe Gen5 x16.
pub const B200: ProductModel = ProductModel {
    name: "B200",
    memory_bytes: 183_359 << 20,
    nvlinks: 18,
    copy_uni_gbps: 740.0,
    copy_bidir_gbps: 1480.0,
    all_reduce_busbw_gbps: 720.0,
    alpha_us: 11.0,
    host_gbps: 55.0,
    pcie_gen: 5,
    pcie_width: 16,
    tflops: 1300.0,
    idle_power_w: 140.0,
};

/// A product the model does not know: a PCIe-only GPU (model values of a PCIe Gen4 card;
/// NCCL and copies go over PCIe).
pub const GENERIC_PCIE: ProductModel = ProductModel {
    name: "generic PCIe GPU",
    memory_bytes: 49_140 << 20,
    nvlinks: 0,
    copy_uni_gbps: 24.0,
    copy_bidir_gbps: 40.0,
    all_reduce_busbw_gbps: 20.0,
    alpha_us: 30.0,
    host_gbps: 25.0,
    pcie_gen: 4,
    pcie_width: 16,
    tflops: 180.0,
    idle_power_w: 35.0,
};

/// The model of a product, by its label (`NVIDIA-H100-80GB-HBM3`) or NVML name; unknown
/// products get [`GENERIC_PCIE`].
pub fn product_model(product: &str) -> ProductModel {
    let p = product.to_ascii_uppercase();
    if p.contains("H200") {
        H200
    } else if p.contains("H100") {
        H100
    } else if p.contains("A100") {
        A100
    } else if p.contains("B200") {
        B200
    } else {
        GENERIC_PCIE
    }
}

/// A fault that acts on the agent process rather than on a measurement. The agent acts on
/// it; [`node_check`] itself ignores these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessFault {
    /// Exit with this code and write nothing.
    Crash { exit_code: i32 },
    /// Write a truncated (unparseable) document.
    Garbage,
}

/// Exit code of a `crash` fault without one (134, as for SIGABRT).
pub const DEFAULT_CRASH_CODE: i32 = 134;

/// The process-level fault of a node, if any (a crash wins over garbage).
pub fn process_fault(node: &FleetNode) -> Option<ProcessFault> {
    let crash = node.faults.iter().find_map(|f| match f {
        Fault::Crash { exit_code } => Some(ProcessFault::Crash {
            exit_code: exit_code.unwrap_or(DEFAULT_CRASH_CODE),
        }),
        _ => None,
    });
    crash.or_else(|| {
        node.faults
            .iter()
            .any(|f| matches!(f, Fault::Garbage))
            .then_some(ProcessFault::Garbage)
    })
}

// ---------------------------------------------------------------------------------------
// Noise
// ---------------------------------------------------------------------------------------

/// splitmix64: a small, fast, well-mixed generator; plenty for measurement noise.
struct Rng(u64);

fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Rng {
    /// A generator for one stream of measurements of one node: the same (seed, node,
    /// stream) always gives the same numbers, and streams do not depend on each other (so
    /// disabling one phase does not change the numbers of another).
    fn new(seed: u64, node: &str, stream: &str) -> Rng {
        let mut r = Rng(seed ^ fnv1a(node).rotate_left(21) ^ fnv1a(stream).rotate_left(42));
        r.next_u64();
        r
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1).
    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Standard normal, cut at 3 sigma.
    fn normal(&mut self) -> f64 {
        let (u1, u2) = (self.uniform(), self.uniform());
        ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()).clamp(-3.0, 3.0)
    }

    /// A multiplicative factor around 1 with relative standard deviation `sigma`.
    fn jitter(&mut self, sigma: f64) -> f64 {
        1.0 + sigma * self.normal()
    }
}

// ---------------------------------------------------------------------------------------
// The node model
// ---------------------------------------------------------------------------------------

/// Per-node state of the model: product, faults resolved per GPU and pair, node bias.
struct NodeModel<'a> {
    node: &'a FleetNode,
    product: ProductModel,
    seed: u64,
    /// Systematic bandwidth and compute factors of this node (node-to-node spread).
    bw_bias: f64,
    compute_bias: f64,
}

impl<'a> NodeModel<'a> {
    fn new(node: &'a FleetNode, seed: u64) -> Self {
        let mut rng = Rng::new(seed, &node.name, "node-bias");
        NodeModel {
            node,
            product: product_model(&node.product),
            seed,
            bw_bias: rng.jitter(0.006),
            compute_bias: rng.jitter(0.004),
        }
    }

    fn rng(&self, stream: &str) -> Rng {
        Rng::new(self.seed, &self.node.name, stream)
    }

    fn gpus(&self) -> u32 {
        self.node.gpus
    }

    fn dead_links(&self, gpu: u32) -> u32 {
        self.node
            .faults
            .iter()
            .map(|f| match f {
                Fault::DeadLink { gpu: g, links } if *g == gpu => *links,
                _ => 0,
            })
            .sum::<u32>()
            .min(self.product.nvlinks)
    }

    fn nvlink_active(&self, gpu: u32) -> u32 {
        self.product.nvlinks - self.dead_links(gpu)
    }

    /// Share of a GPU's NVLink bandwidth still up.
    fn link_fraction(&self, gpu: u32) -> f64 {
        if self.product.nvlinks == 0 {
            return 1.0;
        }
        f64::from(self.nvlink_active(gpu)) / f64::from(self.product.nvlinks)
    }

    fn transport(&self, a: u32, b: u32) -> Transport {
        let fallback = self.node.faults.iter().rev().find_map(|f| match f {
            Fault::TransportFallback { gpus, transport } if same_pair(*gpus, a, b) => {
                Some(*transport)
            }
            _ => None,
        });
        fallback.unwrap_or(if self.product.nvlinks > 0 {
            Transport::Nvlink
        } else {
            Transport::Pcie
        })
    }

    /// Bandwidth (GB/s, one direction) of a transport other than NVLink between two GPUs
    /// of this node (model values: PCIe peer to peer at 80% of the host link, through host
    /// memory at 40%, through one 200 Gb/s NIC about 20 GB/s).
    fn fallback_gbps(&self, t: Transport) -> f64 {
        match t {
            Transport::Pcie => self.product.host_gbps * 0.8,
            Transport::Shm | Transport::Unknown => self.product.host_gbps * 0.4,
            Transport::Net => 20.0,
            Transport::Nvlink => self.product.copy_uni_gbps,
        }
    }

    /// Bandwidth factor (1.0 healthy) of the link between two GPUs.
    fn link_factor(&self, a: u32, b: u32) -> f64 {
        let slow: f64 = self
            .node
            .faults
            .iter()
            .map(|f| match f {
                Fault::SlowPair { gpus, factor } if same_pair(*gpus, a, b) => *factor,
                _ => 1.0,
            })
            .product();
        let links = self.link_fraction(a).min(self.link_fraction(b));
        let mut factor = slow * links;
        let t = self.transport(a, b);
        let native = if self.product.nvlinks > 0 {
            Transport::Nvlink
        } else {
            Transport::Pcie
        };
        if t != native {
            factor = factor.min(self.fallback_gbps(t) / self.product.copy_uni_gbps);
        }
        factor
    }

    /// The slowest link among a set of ranks (1.0 for a single rank).
    fn ring_factor(&self, ranks: &[u32]) -> f64 {
        let mut f: f64 = 1.0;
        for (i, &a) in ranks.iter().enumerate() {
            for &b in &ranks[i + 1..] {
                f = f.min(self.link_factor(a, b));
            }
        }
        f
    }

    /// Current PCIe generation and width of a GPU's host link.
    fn pcie(&self, gpu: u32) -> (u32, u32) {
        self.node
            .faults
            .iter()
            .rev()
            .find_map(|f| match f {
                Fault::PcieDegraded {
                    gpu: g,
                    generation,
                    width,
                } if *g == gpu => Some((*generation, *width)),
                _ => None,
            })
            .unwrap_or((self.product.pcie_gen, self.product.pcie_width))
    }

    /// Host link rate relative to its maximum.
    fn pcie_factor(&self, gpu: u32) -> f64 {
        let (generation, width) = self.pcie(gpu);
        let rate = |g: u32| 2.5 * f64::from(1u32 << g.clamp(1, 6).saturating_sub(1));
        let max = rate(self.product.pcie_gen) * f64::from(self.product.pcie_width.max(1));
        (rate(generation.max(1)) * f64::from(width) / max).clamp(0.0, 1.0)
    }

    fn straggler(&self, gpu: u32) -> f64 {
        self.node
            .faults
            .iter()
            .map(|f| match f {
                Fault::Straggler { gpu: g, factor } if *g == gpu => *factor,
                _ => 1.0,
            })
            .product()
    }

    /// Large-size bus bandwidth (GB/s) of a collective among `ranks`.
    fn busbw(&self, c: Collective, ranks: &[u32]) -> f64 {
        // Ratios to all_reduce (sendrecv: to the one-way copy) as measured on 4 x H200
        // (see [`H200`]): all_gather 325, reduce_scatter 326, broadcast 361, reduce 364,
        // alltoall 335, sendrecv 360 GB/s against all_reduce 354 and copies 395.
        let ar = self.product.all_reduce_busbw_gbps;
        let base = match c {
            Collective::AllReduce => ar,
            Collective::AllGather | Collective::ReduceScatter => ar * 0.92,
            Collective::Broadcast | Collective::Reduce => ar * 1.02,
            Collective::AllToAll => ar * 0.95,
            Collective::SendRecv => self.product.copy_uni_gbps * 0.91,
        };
        base * self.ring_factor(ranks) * self.bw_bias
    }

    /// Small-size latency (microseconds) of a collective over `n` ranks.
    fn alpha_us(&self, c: Collective, n: u32) -> f64 {
        // Ratios of smallest-size times to all_reduce's, as measured on 4 x H200:
        // all_gather 10.7, reduce_scatter 13.9, broadcast 9.2, reduce 9.1, alltoall 6.8,
        // sendrecv 6.7 µs against all_reduce 10.2.
        let per = match c {
            Collective::AllReduce => 1.0,
            Collective::AllGather => 1.05,
            Collective::ReduceScatter => 1.35,
            Collective::Broadcast | Collective::Reduce => 0.9,
            Collective::AllToAll | Collective::SendRecv => 0.66,
        };
        if n <= 1 {
            return 4.0;
        }
        // Latency grows with the number of ring steps: log2(n)/3 of the 8-rank value.
        let steps = 0.5 + 0.5 * f64::from(n).log2() / 3.0;
        self.product.alpha_us * per * steps
    }

    /// Model time (µs) of one collective of `bytes` over `ranks`.
    fn collective_time_us(&self, c: Collective, ranks: &[u32], bytes: u64) -> f64 {
        let n = ranks.len() as u32;
        let alpha = self.alpha_us(c, n);
        if n <= 1 {
            // One rank: a local copy through HBM (model: 1.5 TB/s).
            return alpha + bytes as f64 / 1.5e6;
        }
        let bus_bytes = bytes as f64 * c.busbw_factor(n as usize);
        alpha + bus_bytes / (self.busbw(c, ranks) * 1e3)
    }
}

fn same_pair(pair: [u32; 2], a: u32, b: u32) -> bool {
    (pair[0] == a && pair[1] == b) || (pair[0] == b && pair[1] == a)
}

// ---------------------------------------------------------------------------------------
// Phases
// ---------------------------------------------------------------------------------------

/// Sizes of one row as nccl-tests (and the cuda backend) shape them: `(bytes, count)` with
/// `bytes` the size column and `count` the per-rank element count nccl-tests prints (per
/// peer for alltoall); at least one element per rank.
pub fn row_shape(c: Collective, requested: u64, elem: u64, n: u64) -> (u64, u64) {
    let total = (requested / elem.max(1)).max(1);
    let n = n.max(1);
    match c {
        Collective::AllReduce
        | Collective::Broadcast
        | Collective::Reduce
        | Collective::SendRecv => (total * elem, total),
        Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => {
            let per = (total / n).max(1);
            (per * n * elem, per)
        }
    }
}

/// Whether a collective has an in-place run (not alltoall and sendrecv, as in nccl-tests).
pub fn has_in_place(c: Collective) -> bool {
    !matches!(c, Collective::AllToAll | Collective::SendRecv)
}

fn nccl_phase(m: &NodeModel, opts: &CheckOptions, progress: Progress) -> NcclSweepResult {
    let sweep = &opts.suite.nccl_sweep;
    let ranks: Vec<u32> = (0..m.gpus()).collect();
    let n = m.gpus();
    let elem = sweep.data_type.size();
    let sizes = opts.sweep_sizes();
    // Timing noise shrinks with the number of timed iterations (20 is the default).
    let iters_scale = (20.0 / f64::from(opts.sweep_iters().1)).sqrt();
    let mut collectives = Vec::new();
    // In the order the cuda backend runs them, whatever order the suite lists them in.
    let wanted = Collective::ALL
        .into_iter()
        .filter(|c| sweep.collectives.contains(c));
    for c in wanted {
        let mut rng = m.rng(&format!("nccl/{}", c.api_name()));
        let mut rows: Vec<SweepRow> = Vec::new();
        for &size in &sizes {
            let (bytes, count) = row_shape(c, size, elem, u64::from(n));
            if rows.last().is_some_and(|r| r.bytes == bytes) {
                continue;
            }
            let model = m.collective_time_us(c, &ranks, bytes);
            // Small messages are noisier (launch jitter), large ones steady.
            let sigma =
                (0.004 + 0.03 * (-(bytes as f64) / (1u64 << 20) as f64).exp()) * iters_scale;
            let t = model * rng.jitter(sigma).max(0.5);
            let ti = model * rng.jitter(sigma).max(0.5);
            // nccl-tests' alltoall and sendrecv (and the cuda backend) have no in-place run.
            let ti = if has_in_place(c) { ti } else { 0.0 };
            rows.push(SweepRow {
                bytes,
                count,
                time_us: t,
                algbw: stats::algbw_gbps(bytes, t),
                busbw: stats::busbw_gbps(c, n, bytes, t),
                wrong: 0,
                in_place_time_us: ti,
                in_place_algbw: stats::algbw_gbps(bytes, ti),
                in_place_busbw: stats::busbw_gbps(c, n, bytes, ti),
                in_place_wrong: 0,
            });
        }
        let points: Vec<(u64, f64)> = rows.iter().map(|r| (r.bytes, r.time_us)).collect();
        let cs = CollectiveSweep {
            collective: c,
            data_type: sweep.data_type,
            ranks: n,
            fit: stats::fit_sweep(c, n, &points),
            rows,
        };
        progress(&format!(
            "ncclSweep: {} over {} ranks, {} sizes, peak busbw {:.1} GB/s",
            c.nccl_tests_name(),
            n,
            cs.rows.len(),
            cs.peak_busbw()
        ));
        collectives.push(cs);
    }
    NcclSweepResult { collectives }
}

fn pairs_phase(m: &NodeModel, suite: &Suite, progress: Progress) -> PairMatrix {
    let p = &suite.gpu_pairs;
    let g = m.gpus();
    let mut rng = m.rng("pairs");
    let mut uni = Vec::new();
    let mut bidir = Vec::new();
    for a in 0..g {
        for b in 0..g {
            if a != b {
                let gbps =
                    m.product.copy_uni_gbps * m.link_factor(a, b) * m.bw_bias * rng.jitter(0.004);
                uni.push(PairBandwidth {
                    src: a,
                    dst: b,
                    gbps,
                });
            }
        }
    }
    if p.bidirectional {
        for a in 0..g {
            for b in a + 1..g {
                let gbps =
                    m.product.copy_bidir_gbps * m.link_factor(a, b) * m.bw_bias * rng.jitter(0.004);
                bidir.push(PairBandwidth {
                    src: a,
                    dst: b,
                    gbps,
                });
            }
        }
    }
    let (mut h2d, mut d2h) = (Vec::new(), Vec::new());
    if p.host_copies {
        for gpu in 0..g {
            let f = m.pcie_factor(gpu) * m.bw_bias;
            h2d.push(HostBandwidth {
                gpu,
                gbps: m.product.host_gbps * f * rng.jitter(0.006),
            });
            d2h.push(HostBandwidth {
                gpu,
                gbps: m.product.host_gbps * 0.98 * f * rng.jitter(0.006),
            });
        }
    }
    let min = uni.iter().map(|e| e.gbps).fold(f64::INFINITY, f64::min);
    progress(&format!(
        "gpuPairs: {} ordered pairs of {} MiB copies, slowest {:.1} GB/s",
        uni.len(),
        p.bytes >> 20,
        if min.is_finite() { min } else { 0.0 }
    ));
    PairMatrix {
        bytes: p.bytes,
        unidirectional: uni,
        bidirectional: bidir,
        host_to_device: h2d,
        device_to_host: d2h,
        corrupt_copies: 0,
    }
}

/// A gradient bucket of the DDP model: bytes, and the lowest layer whose gradients it holds.
struct Bucket {
    bytes: u64,
    ready_after_layer: u32,
}

/// PyTorch DDP's bucket assignment for `layers` Linear(hidden, hidden) layers with fp32
/// gradients (bias then weight, last layer first; a bucket closes once it reaches its cap),
/// the same as the cuda backend's.
fn ddp_buckets(hidden: u64, layers: u32, first_cap: u64, cap: u64) -> Vec<Bucket> {
    let mut out = Vec::new();
    let (mut size, mut lowest) = (0u64, u32::MAX);
    for l in (0..layers).rev() {
        for p in [hidden * 4, hidden * hidden * 4] {
            size += p;
            lowest = lowest.min(l);
            let limit = if out.is_empty() { first_cap } else { cap };
            if size >= limit {
                out.push(Bucket {
                    bytes: size,
                    ready_after_layer: lowest,
                });
                size = 0;
                lowest = u32::MAX;
            }
        }
    }
    if size > 0 {
        out.push(Bucket {
            bytes: size,
            ready_after_layer: lowest,
        });
    }
    out
}

/// Compute slowdown of a GPU whose all-reduce runs beside its GEMMs.
const COMPUTE_CONTENTION: f64 = 1.05;

/// Share of its standalone speed an all-reduce keeps while GEMMs run beside it (SM and HBM
/// contention). Fitted to the 4 x H200 DDP measurement (step 25.1 ms against 20.5 ms of
/// compute alone, 19% of the step exposed communication, 51% overlap).
const OVERLAPPED_COMM_SPEED: f64 = 0.45;

/// When an all-reduce of `work` ms (standalone time) that starts at `start` ends, running
/// at [`OVERLAPPED_COMM_SPEED`] until compute ends at `compute_end` and at full speed after.
fn overlapped_end(start: f64, work: f64, compute_end: f64) -> f64 {
    if start >= compute_end {
        return start + work;
    }
    let slow_window = compute_end - start;
    if work <= slow_window * OVERLAPPED_COMM_SPEED {
        start + work / OVERLAPPED_COMM_SPEED
    } else {
        compute_end + (work - slow_window * OVERLAPPED_COMM_SPEED)
    }
}

/// GEMMs of one step: forward one per layer, backward wgrad for every layer and dgrad for
/// all but the first (the cuda backend's count).
fn gemms_per_step(layers: u32) -> u32 {
    3 * layers - 1
}

fn ddp_phase(m: &NodeModel, opts: &CheckOptions, progress: Progress) -> DdpResult {
    let probe: &DdpProbe = &opts.suite.ddp_probe;
    let layers = probe.layers.max(1);
    let hidden = u64::from(probe.hidden.max(1));
    let batch = u64::from(probe.batch_per_gpu.max(1));
    let gemm_flops = 2.0 * batch as f64 * (hidden * hidden) as f64;
    let flops = gemm_flops * f64::from(gemms_per_step(layers));
    let buckets = ddp_buckets(hidden, layers, probe.first_bucket_bytes, probe.bucket_bytes);
    let steps_scale = (10.0 / f64::from(opts.ddp_steps().1)).sqrt();
    let mut rng = m.rng("ddp");
    let mut points: Vec<DdpPoint> = Vec::new();
    for count in opts.ddp_counts(m.gpus()) {
        let idx: Vec<u32> = (0..count).collect();
        // Compute per GPU alone, then under overlap: NCCL kernels take SMs and HBM
        // bandwidth from the GEMMs (5%: 21.6 ms with overlap against 20.5 alone, measured
        // on 4 x H200).
        let alone: Vec<f64> = idx
            .iter()
            .map(|&g| {
                flops / (m.product.tflops * 1e12 * m.compute_bias)
                    * 1e3
                    * m.straggler(g)
                    * rng.jitter(0.002 * steps_scale)
            })
            .collect();
        let contention = if count > 1 { COMPUTE_CONTENTION } else { 1.0 };
        let compute: Vec<f64> = alone.iter().map(|c| c * contention).collect();
        let per_gemm: Vec<f64> = compute
            .iter()
            .map(|c| c / f64::from(gemms_per_step(layers)))
            .collect();
        // GEMMs done when the backward of layer `l` has finished: forward (one per layer),
        // then layers L-1 down to l, two GEMMs each except layer 0 (wgrad only).
        let gemms_done = |l: u32| {
            let back: u32 = (l..layers).map(|k| if k == 0 { 1 } else { 2 }).sum();
            f64::from(layers + back)
        };
        let compute_max = compute.iter().copied().fold(0.0, f64::max);
        let (mut comm_end, mut comm_alone) = (0.0f64, 0.0f64);
        if count > 1 {
            for b in &buckets {
                let ready = per_gemm
                    .iter()
                    .map(|t| t * gemms_done(b.ready_after_layer))
                    .fold(0.0, f64::max);
                let t = m.collective_time_us(Collective::AllReduce, &idx, b.bytes) / 1e3
                    * rng.jitter(0.004 * steps_scale);
                comm_alone += t;
                comm_end = overlapped_end(comm_end.max(ready), t, compute_max);
            }
        }
        let alone_max = alone.iter().copied().fold(0.0, f64::max);
        let step_ms = compute_max.max(comm_end);
        let exposed = (step_ms - alone_max).max(0.0);
        let samples_per_s = (u64::from(count) * batch) as f64 / (step_ms / 1e3);
        let base = points
            .first()
            .map(|p| p.samples_per_s / f64::from(p.gpus))
            .unwrap_or(samples_per_s / f64::from(count));
        let point = DdpPoint {
            gpus: count,
            step_ms,
            samples_per_s,
            scaling_efficiency: if base > 0.0 {
                samples_per_s / f64::from(count) / base
            } else {
                0.0
            },
            comm_fraction: if step_ms > 0.0 {
                exposed / step_ms
            } else {
                0.0
            },
            overlap_efficiency: if comm_alone > 0.0 && count > 1 {
                (1.0 - exposed / comm_alone).clamp(0.0, 1.0)
            } else {
                1.0
            },
            tflops_per_gpu: flops / (step_ms / 1e3) / 1e12,
            compute_ms: compute,
            gpu_indices: idx,
        };
        progress(&format!(
            "ddpProbe: {} GPU(s): step {:.2} ms, efficiency {:.1}%, {:.0} TFLOP/s per GPU",
            count,
            point.step_ms,
            point.scaling_efficiency * 100.0,
            point.tflops_per_gpu
        ));
        points.push(point);
    }
    DdpResult {
        hidden: probe.hidden,
        layers: probe.layers,
        batch_per_gpu: probe.batch_per_gpu,
        buckets: buckets.iter().map(|b| b.bytes).collect(),
        points,
    }
}

fn health_phase(m: &NodeModel, progress: Progress) -> HealthSnapshot {
    let mut rng = m.rng("health");
    let gpus = (0..m.gpus())
        .map(|gpu| {
            let (pcie_gen, pcie_width) = m.pcie(gpu);
            let mut h = GpuHealth {
                index: gpu,
                nvlink_active: m.nvlink_active(gpu),
                nvlink_expected: m.product.nvlinks,
                nvlink_errors: 0,
                nvlink_link_gbps: 0.0,
                nvlink_switch: None,
                pcie_gen,
                pcie_gen_max: m.product.pcie_gen,
                pcie_width,
                pcie_width_max: m.product.pcie_width,
                xids: Vec::new(),
                ecc_uncorrected: 0,
                remapped_pending: false,
                remapped_failed: false,
                throttle: Vec::new(),
                temperature_c: (34.0 + 3.0 * rng.normal()).round(),
                power_w: (m.product.idle_power_w * rng.jitter(0.05) * 10.0).round() / 10.0,
            };
            for f in &m.node.faults {
                match f {
                    Fault::Xid { gpu: g, code } if *g == gpu => h.xids.push(*code),
                    Fault::Ecc { gpu: g, count } if *g == gpu => {
                        h.ecc_uncorrected += count;
                        // An uncorrectable error schedules a row remap at the next reset.
                        h.remapped_pending |= *count > 0;
                    }
                    _ => {}
                }
            }
            h
        })
        .collect::<Vec<_>>();
    progress(&format!("health: {} GPUs", gpus.len()));
    HealthSnapshot { gpus }
}

/// Runs `work` as the phase `phase` under the watchdog: when the node has a `hang` fault for
/// this phase, the work never finishes and the watchdog aborts it after `timeout`.
fn run_phase<T>(
    m: &NodeModel,
    phase: Phase,
    timeout: Duration,
    progress: Progress,
    work: impl FnOnce() -> T,
) -> Result<T, PhaseError> {
    let hang = m.node.faults.iter().find_map(|f| match f {
        Fault::Hang { phase: p, stuck } if p.unwrap_or(Phase::NcclSweep) == phase => Some(*stuck),
        _ => None,
    });
    match hang {
        None => Ok(work()),
        Some(true) => {
            progress(&format!(
                "{}: stuck (simulated hang beyond the watchdog)",
                phase_name(phase)
            ));
            tracing::warn!(node = %m.node.name, ?phase, "simulated stuck agent: blocking until killed");
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        Some(false) => {
            progress(&format!("{}: hanging (simulated)", phase_name(phase)));
            // The simulated work waits on a completion that never comes; the watchdog
            // gives up after the phase timeout, as it does on a hung NCCL call.
            let (_done, wait) = std::sync::mpsc::channel::<()>();
            let _ = wait.recv_timeout(timeout);
            let message = format!(
                "{} did not finish within {:.1} s; the watchdog aborted it",
                phase_name(phase),
                timeout.as_secs_f64()
            );
            progress(&format!("{}: timeout", phase_name(phase)));
            Err(PhaseError {
                phase,
                kind: ErrorKind::Timeout,
                message,
            })
        }
    }
}

/// The API name of a phase (`ncclSweep`, ...).
pub fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::Setup => "setup",
        Phase::Health => "health",
        Phase::NcclSweep => "ncclSweep",
        Phase::GpuPairs => "gpuPairs",
        Phase::DdpProbe => "ddpProbe",
        Phase::NodePair => "nodePair",
    }
}

/// Runs the simulated node check of `node` (as the fleet describes it) with noise seeded by
/// `seed`: the same options, node and seed always give the same measurements (`startedAt`
/// and `durationS` are the real time of the call). `crash` and `garbage` faults are the
/// agent's to act on (see [`process_fault`]); a `hang` fault blocks its phase until
/// `opts.phase_timeout`, or forever with `stuck: true`.
pub fn node_check(
    opts: &CheckOptions,
    node: &FleetNode,
    seed: u64,
    progress: Progress,
) -> Result<ResultDocument, CheckError> {
    let started = Instant::now();
    let started_at = crate::rfc3339(SystemTime::now());
    if node.gpus == 0 {
        return Err(CheckError::NoGpu(format!(
            "simulated node {} declares no GPUs",
            node.name
        )));
    }
    if let Some(wanted) = opts.expect_gpus
        && node.gpus < wanted
    {
        return Err(CheckError::TooFewGpus {
            found: node.gpus,
            wanted,
        });
    }
    let m = NodeModel::new(node, seed);
    if m.product.name == GENERIC_PCIE.name {
        tracing::warn!(product = %node.product, "unknown GPU product; simulating a PCIe-only GPU");
    }
    let suite = &opts.suite;
    let timeout = opts.phase_timeout;
    let _span = tracing::info_span!("sim_node_check", node = %node.name).entered();
    progress(&format!(
        "setup: simulated node {}, {} x {} ({} model)",
        node.name, node.gpus, node.product, m.product.name
    ));

    let gpus: Vec<GpuInfo> = (0..node.gpus)
        .map(|i| GpuInfo {
            index: i,
            product: node.product.clone(),
            uuid: Some(format!(
                "GPU-{:016x}",
                Rng::new(seed, &node.name, &format!("uuid/{i}")).next_u64()
            )),
            pci_bus_id: Some(format!("00000000:{:02X}:00.0", bus_id(i))),
            memory_bytes: m.product.memory_bytes,
        })
        .collect();

    let mut doc = ResultDocument {
        schema: FULL_SCHEMA.to_string(),
        node: opts.node.clone(),
        backend: Backend::Sim,
        started_at,
        duration_s: 0.0,
        versions: Versions {
            agent: env!("CARGO_PKG_VERSION").to_string(),
            driver: None,
            cuda: None,
            nccl: None,
        },
        gpus,
        nccl: None,
        pairs: None,
        ddp: None,
        health: None,
        transports: Vec::new(),
        nics: Vec::new(),
        errors: Vec::new(),
    };

    if let Err(e) = run_phase(&m, Phase::Setup, timeout, progress, || ()) {
        doc.errors.push(e);
        doc.duration_s = started.elapsed().as_secs_f64();
        return Ok(doc);
    }
    for a in 0..node.gpus {
        for b in a + 1..node.gpus {
            doc.transports.push(TransportInfo {
                a,
                b,
                transport: m.transport(a, b),
            });
        }
    }
    if suite.health.enabled {
        match run_phase(&m, Phase::Health, timeout, progress, || {
            health_phase(&m, progress)
        }) {
            Ok(h) => doc.health = Some(h),
            Err(e) => doc.errors.push(e),
        }
    }
    if suite.nccl_sweep.enabled {
        match run_phase(&m, Phase::NcclSweep, timeout, progress, || {
            nccl_phase(&m, opts, progress)
        }) {
            Ok(n) => doc.nccl = Some(n),
            Err(e) => doc.errors.push(e),
        }
    }
    if suite.gpu_pairs.enabled {
        match run_phase(&m, Phase::GpuPairs, timeout, progress, || {
            pairs_phase(&m, suite, progress)
        }) {
            Ok(p) => doc.pairs = Some(p),
            Err(e) => doc.errors.push(e),
        }
    }
    if suite.ddp_probe.enabled {
        match run_phase(&m, Phase::DdpProbe, timeout, progress, || {
            ddp_phase(&m, opts, progress)
        }) {
            Ok(d) => doc.ddp = Some(d),
            Err(e) => doc.errors.push(e),
        }
    }
    // No node-pair phase exists in a single-node check yet; a `slowNic` fault only matters
    // to node-pair tests and leaves this document untouched.
    if node
        .faults
        .iter()
        .any(|f| matches!(f, Fault::SlowNic { .. }))
    {
        tracing::debug!(node = %node.name, "slowNic fault: no node-pair phase in a node check");
    }
    doc.duration_s = started.elapsed().as_secs_f64();
    Ok(doc)
}

/// PCI bus numbers of the eight GPUs of an HGX board (as `nvidia-smi` lists them on
/// common HGX H100 systems); further GPUs continue past the last.
fn bus_id(i: u32) -> u32 {
    const HGX: [u32; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];
    HGX.get(i as usize).copied().unwrap_or(0xdc + i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufabric_api::CompactResult;

    fn node(product: &str, gpus: u32, faults: Vec<Fault>) -> FleetNode {
        FleetNode {
            name: "gpu-node-1".into(),
            product: product.into(),
            gpus,
            labels: Default::default(),
            faults,
        }
    }

    fn opts() -> CheckOptions {
        CheckOptions {
            node: "gpu-node-1".into(),
            suite: Suite::default(),
            quick: false,
            expect_gpus: None,
            phase_timeout: Duration::from_secs(30),
        }
    }

    fn check(n: &FleetNode) -> ResultDocument {
        node_check(&opts(), n, 7, &|_| {}).expect("sim check")
    }

    fn h100(faults: Vec<Fault>) -> FleetNode {
        node("NVIDIA-H100-80GB-HBM3", 8, faults)
    }

    fn uni(doc: &ResultDocument, a: u32, b: u32) -> f64 {
        doc.pairs
            .as_ref()
            .and_then(|p| p.unidirectional.iter().find(|e| e.src == a && e.dst == b))
            .map(|e| e.gbps)
            .expect("pair measured")
    }

    fn bidir(doc: &ResultDocument, a: u32, b: u32) -> f64 {
        doc.pairs
            .as_ref()
            .and_then(|p| p.bidirectional.iter().find(|e| e.src == a && e.dst == b))
            .map(|e| e.gbps)
            .expect("pair measured")
    }

    fn all_reduce_peak(doc: &ResultDocument) -> f64 {
        doc.nccl
            .as_ref()
            .and_then(|n| {
                n.collectives
                    .iter()
                    .find(|c| c.collective == Collective::AllReduce)
            })
            .map(|c| c.peak_busbw())
            .expect("all_reduce swept")
    }

    fn last_point(doc: &ResultDocument) -> DdpPoint {
        doc.ddp
            .as_ref()
            .and_then(|d| d.points.last().cloned())
            .expect("ddp measured")
    }

    /// Same document apart from the wall-clock fields.
    fn without_clock(mut d: ResultDocument) -> ResultDocument {
        d.started_at.clear();
        d.duration_s = 0.0;
        d
    }

    #[test]
    fn clean_h100_node_measures_like_an_hgx_h100() {
        let doc = check(&h100(vec![]));
        assert_eq!(doc.backend, Backend::Sim);
        assert_eq!(doc.gpus.len(), 8);
        assert!(doc.errors.is_empty());
        let peak = all_reduce_peak(&doc);
        assert!((330.0..380.0).contains(&peak), "all_reduce busbw {peak}");
        for a in 0..8 {
            for b in 0..8 {
                if a != b {
                    let v = uni(&doc, a, b);
                    assert!((350.0..390.0).contains(&v), "{a}->{b} {v}");
                }
            }
        }
        let p = doc.pairs.as_ref().expect("pairs");
        assert_eq!(p.unidirectional.len(), 56);
        assert_eq!(p.bidirectional.len(), 28);
        assert!(
            p.host_to_device
                .iter()
                .all(|h| (50.0..60.0).contains(&h.gbps))
        );
        let h = doc.health.as_ref().expect("health");
        assert!(h.gpus.iter().all(|g| g.nvlink_active == 18
            && g.xids.is_empty()
            && g.ecc_uncorrected == 0
            && g.pcie_gen == g.pcie_gen_max
            && g.pcie_width == g.pcie_width_max));
        assert!(
            doc.transports
                .iter()
                .all(|t| t.transport == Transport::Nvlink)
        );
        assert_eq!(doc.transports.len(), 28);
        let ddp = doc.ddp.as_ref().expect("ddp");
        assert_eq!(
            ddp.points.iter().map(|p| p.gpus).collect::<Vec<_>>(),
            vec![1, 2, 4, 8]
        );
        let last = last_point(&doc);
        assert!(last.scaling_efficiency > 0.7 && last.scaling_efficiency <= 1.0);
        let (lo, hi) = last
            .compute_ms
            .iter()
            .fold((f64::MAX, 0.0f64), |(l, h), &v| (l.min(v), h.max(v)));
        assert!(hi / lo < 1.02, "no straggler on a clean node: {lo}..{hi}");
        // Every sweep row checks out and the fit matches the model's asymptote.
        for c in &doc.nccl.as_ref().expect("nccl").collectives {
            assert_eq!(c.total_wrong(), 0);
            let fit = c.fit.expect("fit");
            assert!(fit.beta_gbps > 0.5 * c.peak_busbw(), "{c:?}");
        }
    }

    #[test]
    fn same_seed_same_document_and_another_seed_differs() {
        let n = h100(vec![]);
        let a = without_clock(check(&n));
        let b = without_clock(check(&n));
        assert_eq!(a, b);
        let c = without_clock(node_check(&opts(), &n, 8, &|_| {}).expect("sim check"));
        assert_ne!(a, c);
        // Noise is small: another seed stays within a few percent.
        assert!((all_reduce_peak(&a) / all_reduce_peak(&c) - 1.0).abs() < 0.05);
    }

    #[test]
    fn slow_pair_slows_that_pair_only_and_bounds_the_ring() {
        let clean = check(&h100(vec![]));
        let doc = check(&h100(vec![Fault::SlowPair {
            gpus: [2, 5],
            factor: 0.4,
        }]));
        let slow = uni(&doc, 2, 5);
        assert!(slow < 0.45 * uni(&clean, 2, 5), "{slow}");
        assert!(uni(&doc, 5, 2) < 0.45 * uni(&clean, 5, 2));
        assert!(bidir(&doc, 2, 5) < 0.45 * bidir(&clean, 2, 5));
        for a in 0..8 {
            for b in 0..8 {
                if a != b && !same_pair([2, 5], a, b) {
                    assert_eq!(uni(&doc, a, b), uni(&clean, a, b), "{a}->{b} untouched");
                }
            }
        }
        let ratio = all_reduce_peak(&doc) / all_reduce_peak(&clean);
        assert!(
            (0.35..0.45).contains(&ratio),
            "ring limited by the slow link: {ratio}"
        );
        // Health knows nothing of it: the link is up, only slow.
        assert_eq!(doc.health, clean.health);
    }

    #[test]
    fn straggler_slows_that_gpus_compute_and_stretches_the_step() {
        let clean = check(&h100(vec![]));
        let doc = check(&h100(vec![Fault::Straggler {
            gpu: 3,
            factor: 1.3,
        }]));
        let (p, c) = (last_point(&doc), last_point(&clean));
        for (i, (&v, &w)) in p.compute_ms.iter().zip(&c.compute_ms).enumerate() {
            if i == 3 {
                assert!((v / w - 1.3).abs() < 0.01, "gpu 3 {v} vs {w}");
            } else {
                assert_eq!(v, w, "gpu {i} untouched");
            }
        }
        // Part of the straggler's delay hides communication that was exposed before.
        assert!(
            p.step_ms > 1.1 * c.step_ms,
            "{} vs {}",
            p.step_ms,
            c.step_ms
        );
        assert!(p.scaling_efficiency < 0.9 * c.scaling_efficiency);
        // The 1- and 2-GPU points (GPUs 0 and 0-1) do not include GPU 3.
        let d = doc.ddp.as_ref().expect("ddp");
        let e = clean.ddp.as_ref().expect("ddp");
        assert_eq!(d.points[0], e.points[0]);
        assert_eq!(d.points[1], e.points[1]);
        assert_eq!(doc.nccl, clean.nccl);
        assert_eq!(doc.pairs, clean.pairs);
    }

    #[test]
    fn dead_link_lowers_active_links_and_that_gpus_pairs() {
        let clean = check(&h100(vec![]));
        let doc = check(&h100(vec![Fault::DeadLink { gpu: 6, links: 6 }]));
        let h = doc.health.as_ref().expect("health");
        for g in &h.gpus {
            let want = if g.index == 6 { 12 } else { 18 };
            assert_eq!(g.nvlink_active, want, "gpu {}", g.index);
            assert_eq!(g.nvlink_expected, 18);
        }
        for a in 0..8 {
            for b in 0..8 {
                if a == b {
                    continue;
                }
                let ratio = uni(&doc, a, b) / uni(&clean, a, b);
                if a == 6 || b == 6 {
                    assert!((ratio - 12.0 / 18.0).abs() < 1e-9, "{a}->{b} {ratio}");
                } else {
                    assert_eq!(ratio, 1.0, "{a}->{b}");
                }
            }
        }
    }

    #[test]
    fn health_faults_land_on_the_named_gpu() {
        let doc = check(&h100(vec![
            Fault::Xid { gpu: 1, code: 79 },
            Fault::Ecc { gpu: 4, count: 3 },
            Fault::PcieDegraded {
                gpu: 7,
                generation: 4,
                width: 8,
            },
        ]));
        let h = doc.health.as_ref().expect("health");
        for g in &h.gpus {
            assert_eq!(g.xids, if g.index == 1 { vec![79] } else { vec![] });
            assert_eq!(g.ecc_uncorrected, if g.index == 4 { 3 } else { 0 });
            assert_eq!(g.remapped_pending, g.index == 4);
            if g.index == 7 {
                assert_eq!((g.pcie_gen, g.pcie_width), (4, 8));
            } else {
                assert_eq!((g.pcie_gen, g.pcie_width), (5, 16));
            }
            assert_eq!((g.pcie_gen_max, g.pcie_width_max), (5, 16));
        }
        // Gen4 x8 is a quarter of Gen5 x16: that GPU's host copies drop to a quarter.
        let p = doc.pairs.as_ref().expect("pairs");
        let h2d7 = p.host_to_device[7].gbps;
        let h2d0 = p.host_to_device[0].gbps;
        assert!((h2d7 / h2d0 - 0.25).abs() < 0.02, "{h2d7} vs {h2d0}");
    }

    #[test]
    fn transport_fallback_is_reported_for_that_pair_and_slows_it() {
        let clean = check(&h100(vec![]));
        let doc = check(&h100(vec![Fault::TransportFallback {
            gpus: [0, 1],
            transport: Transport::Shm,
        }]));
        for t in &doc.transports {
            let want = if (t.a, t.b) == (0, 1) {
                Transport::Shm
            } else {
                Transport::Nvlink
            };
            assert_eq!(t.transport, want, "{t:?}");
        }
        assert!(uni(&doc, 0, 1) < 30.0);
        assert_eq!(uni(&doc, 0, 2), uni(&clean, 0, 2));
        assert!(all_reduce_peak(&doc) < 0.1 * all_reduce_peak(&clean));
        let compact = CompactResult::from(&doc);
        assert_eq!(compact.tf, vec![(0, 1, Transport::Shm)]);
    }

    #[test]
    fn hang_is_caught_by_the_watchdog_as_a_timeout_of_that_phase() {
        let n = h100(vec![Fault::Hang {
            phase: None,
            stuck: false,
        }]);
        let mut o = opts();
        o.phase_timeout = Duration::from_millis(200);
        let t0 = Instant::now();
        let doc = node_check(&o, &n, 7, &|_| {}).expect("sim check");
        assert!(t0.elapsed() >= Duration::from_millis(200));
        assert!(t0.elapsed() < Duration::from_secs(5));
        assert_eq!(doc.errors.len(), 1);
        assert_eq!(doc.errors[0].phase, Phase::NcclSweep);
        assert_eq!(doc.errors[0].kind, ErrorKind::Timeout);
        assert!(doc.nccl.is_none());
        assert!(doc.pairs.is_some() && doc.ddp.is_some() && doc.health.is_some());

        let n = h100(vec![Fault::Hang {
            phase: Some(Phase::GpuPairs),
            stuck: false,
        }]);
        let doc = node_check(&o, &n, 7, &|_| {}).expect("sim check");
        assert_eq!(doc.errors[0].phase, Phase::GpuPairs);
        assert!(doc.pairs.is_none() && doc.nccl.is_some());
    }

    #[test]
    fn hang_in_setup_leaves_only_the_timeout() {
        let n = h100(vec![Fault::Hang {
            phase: Some(Phase::Setup),
            stuck: false,
        }]);
        let mut o = opts();
        o.phase_timeout = Duration::from_millis(50);
        let doc = node_check(&o, &n, 7, &|_| {}).expect("sim check");
        assert_eq!(doc.gpus.len(), 8);
        assert!(doc.nccl.is_none() && doc.pairs.is_none() && doc.ddp.is_none());
        assert!(doc.health.is_none() && doc.transports.is_empty());
        assert_eq!(doc.errors.len(), 1);
        assert_eq!(
            (doc.errors[0].phase, doc.errors[0].kind),
            (Phase::Setup, ErrorKind::Timeout)
        );
    }

    #[test]
    fn slow_nic_leaves_the_node_check_untouched() {
        let clean = without_clock(check(&h100(vec![])));
        let doc = without_clock(check(&h100(vec![Fault::SlowNic { factor: 0.5 }])));
        assert_eq!(doc, clean);
    }

    #[test]
    fn crash_and_garbage_are_process_faults() {
        assert_eq!(process_fault(&h100(vec![])), None);
        assert_eq!(
            process_fault(&h100(vec![Fault::Crash { exit_code: None }])),
            Some(ProcessFault::Crash { exit_code: 134 })
        );
        assert_eq!(
            process_fault(&h100(vec![
                Fault::Garbage,
                Fault::Crash { exit_code: Some(3) }
            ])),
            Some(ProcessFault::Crash { exit_code: 3 })
        );
        assert_eq!(
            process_fault(&h100(vec![Fault::Garbage])),
            Some(ProcessFault::Garbage)
        );
    }

    #[test]
    fn suite_switches_and_sizes_are_respected() {
        let mut o = opts();
        o.suite.nccl_sweep.collectives = vec![Collective::AllGather, Collective::SendRecv];
        o.suite.nccl_sweep.min_bytes = 1024;
        o.suite.nccl_sweep.max_bytes = 1 << 20;
        o.suite.gpu_pairs.bidirectional = false;
        o.suite.gpu_pairs.host_copies = false;
        o.suite.ddp_probe.gpu_counts = Some(vec![2, 8]);
        o.suite.health.enabled = false;
        let doc = node_check(&o, &h100(vec![]), 1, &|_| {}).expect("sim check");
        let nccl = doc.nccl.as_ref().expect("nccl");
        assert_eq!(
            nccl.collectives
                .iter()
                .map(|c| c.collective)
                .collect::<Vec<_>>(),
            vec![Collective::AllGather, Collective::SendRecv]
        );
        let rows = &nccl.collectives[0].rows;
        assert_eq!(rows.first().map(|r| r.bytes), Some(1024));
        assert_eq!(rows.last().map(|r| r.bytes), Some(1 << 20));
        // all_gather's count is per rank: 1024 bytes of float over 8 ranks = 32.
        assert_eq!(rows[0].count, 32);
        assert!(rows.iter().all(|r| r.in_place_time_us > 0.0));
        let sendrecv = &nccl.collectives[1].rows;
        assert!(
            sendrecv
                .iter()
                .all(|r| r.in_place_time_us == 0.0 && r.in_place_busbw == 0.0)
        );
        let p = doc.pairs.as_ref().expect("pairs");
        assert!(p.bidirectional.is_empty() && p.host_to_device.is_empty());
        let counts: Vec<u32> = doc
            .ddp
            .as_ref()
            .expect("ddp")
            .points
            .iter()
            .map(|p| p.gpus)
            .collect();
        assert_eq!(counts, vec![2, 8]);
        assert!(doc.health.is_none());

        o.suite = Suite::default();
        o.suite.nccl_sweep.enabled = false;
        o.suite.gpu_pairs.enabled = false;
        o.suite.ddp_probe.enabled = false;
        let doc = node_check(&o, &h100(vec![]), 1, &|_| {}).expect("sim check");
        assert!(doc.nccl.is_none() && doc.pairs.is_none() && doc.ddp.is_none());
        assert!(doc.health.is_some());
    }

    #[test]
    fn quick_runs_fewer_sizes() {
        let full = check(&h100(vec![]));
        let mut o = opts();
        o.quick = true;
        let quick = node_check(&o, &h100(vec![]), 7, &|_| {}).expect("sim check");
        let rows = |d: &ResultDocument| d.nccl.as_ref().map(|n| n.collectives[0].rows.len());
        assert!(rows(&quick) < rows(&full));
    }

    #[test]
    fn single_gpu_node_has_host_copies_and_no_pairs() {
        let doc = check(&node("NVIDIA-H100-80GB-HBM3", 1, vec![]));
        let p = doc.pairs.as_ref().expect("pairs");
        assert!(p.unidirectional.is_empty() && p.bidirectional.is_empty());
        assert_eq!(p.host_to_device.len(), 1);
        assert!(doc.transports.is_empty());
        let ddp = doc.ddp.as_ref().expect("ddp");
        assert_eq!(ddp.points.len(), 1);
        assert_eq!(ddp.points[0].comm_fraction, 0.0);
        // One rank moves nothing over a bus: all_reduce busbw is 0 by nccl-tests' factor.
        assert_eq!(all_reduce_peak(&doc), 0.0);
        let compact = CompactResult::parse(&doc.compact_within(4096)).expect("parses");
        assert_eq!(compact.g, 1);
    }

    #[test]
    fn ddp_model_matches_the_measured_four_gpu_h200() {
        // crates/health/tests/data/h200x4-full.compact: step 25.12 ms, efficiency 0.817,
        // comm fraction 0.189, overlap 0.512 at 4 GPUs; 616 TFLOP/s on one GPU.
        let doc = check(&node("NVIDIA-H200", 4, vec![]));
        let ddp = doc.ddp.as_ref().expect("ddp");
        let one = &ddp.points[0];
        assert!((one.tflops_per_gpu / 616.0 - 1.0).abs() < 0.05, "{one:?}");
        let four = ddp.points.last().expect("4-GPU point");
        assert_eq!(four.gpus, 4);
        assert!((four.step_ms / 25.12 - 1.0).abs() < 0.05, "{four:?}");
        assert!((four.scaling_efficiency - 0.817).abs() < 0.04, "{four:?}");
        assert!((four.comm_fraction - 0.189).abs() < 0.04, "{four:?}");
        assert!((four.overlap_efficiency - 0.512).abs() < 0.08, "{four:?}");
    }

    #[test]
    fn overlapped_all_reduce_runs_slower_until_compute_ends() {
        // Entirely after compute: full speed.
        assert_eq!(overlapped_end(10.0, 2.0, 5.0), 12.0);
        // Entirely during compute: at the overlapped speed.
        let end = overlapped_end(0.0, 0.9, 10.0);
        assert!((end - 0.9 / OVERLAPPED_COMM_SPEED).abs() < 1e-12);
        // Straddling: slow until compute ends at 1.0, then the rest at full speed.
        let end = overlapped_end(0.0, 1.0, 1.0);
        assert!((end - (1.0 + (1.0 - OVERLAPPED_COMM_SPEED))).abs() < 1e-12);
    }

    #[test]
    fn too_few_gpus_is_an_error() {
        let mut o = opts();
        o.expect_gpus = Some(8);
        let err = node_check(&o, &node("NVIDIA-H200", 4, vec![]), 1, &|_| {}).expect_err("4 < 8");
        assert_eq!(err.exit_code(), 12);
    }

    #[test]
    fn products_have_their_own_figures() {
        let h200 = check(&node("NVIDIA-H200", 8, vec![]));
        let a100 = check(&node("NVIDIA-A100-SXM4-80GB", 8, vec![]));
        assert!(uni(&h200, 0, 1) > 385.0);
        assert!(uni(&a100, 0, 1) < 200.0);
        assert_eq!(
            a100.health.as_ref().map(|h| h.gpus[0].nvlink_expected),
            Some(12)
        );
        assert!(h200.gpus[0].memory_bytes > 140 << 30);
    }

    #[test]
    fn compact_default_eight_gpu_document_fits_a_termination_message() {
        let doc = check(&h100(vec![
            Fault::Xid { gpu: 1, code: 79 },
            Fault::TransportFallback {
                gpus: [0, 1],
                transport: Transport::Pcie,
            },
        ]));
        let full = CompactResult::from(&doc).to_json();
        assert!(full.len() <= 4096, "compact form is {} bytes", full.len());
        let text = doc.compact_within(4096);
        assert_eq!(text, full, "nothing had to be dropped");
        let back = CompactResult::parse(&text).expect("parses");
        assert_eq!(back.g, 8);
        assert_eq!(back.nc.len(), 7);
        assert_eq!(back.pu.len(), 64);
    }

    #[test]
    fn full_default_check_is_fast() {
        let t0 = Instant::now();
        let _ = check(&h100(vec![]));
        assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    }

    #[test]
    fn fit_of_sim_sweep_recovers_model_alpha_and_beta() {
        let doc = check(&h100(vec![]));
        let c = &doc.nccl.as_ref().expect("nccl").collectives[0];
        let fit = c.fit.expect("fit");
        assert!((fit.alpha_us - 12.5).abs() < 1.5, "{fit:?}");
        assert!((fit.beta_gbps - 360.0).abs() < 15.0, "{fit:?}");
    }

    #[test]
    fn row_shape_follows_nccl_tests_sizes() {
        assert_eq!(
            row_shape(Collective::AllReduce, 1 << 20, 4, 8),
            (1 << 20, 1 << 18)
        );
        assert_eq!(
            row_shape(Collective::AllGather, 1 << 20, 4, 8),
            (1 << 20, 1 << 15)
        );
        assert_eq!(row_shape(Collective::AllToAll, 8, 4, 8), (32, 1));
        assert_eq!(row_shape(Collective::SendRecv, 6, 4, 8), (4, 1));
    }
}
