//! How long a suite runs on one node, from its sizes, iterations and steps.
//!
//! Two figures, each the sum of the three phases the agent runs one after the other:
//! - [`FASTEST`] is a lower bound: a node of one GPU (the fewest pairs and DDP points any
//!   node has), no start-up time, and every operation at a rate no GPU sold today beats.
//!   A suite whose lower bound exceeds `agent.timeoutSeconds` cannot finish on any node,
//!   so `validate()` refuses it.
//! - [`TYPICAL`] is an 8-GPU H100/H200 SXM node at the rates measured on one
//!   (bench/results/h200x4-2026-11-21-final.md), with start-up. Over half of the timeout,
//!   the webhook warns.
//!
//! The model, per phase (`n` GPUs):
//! - NCCL sweep: for every collective and size `s` of `NcclSweep::sizes()`,
//!   `(warmupIters + iters) * (latency + s / algbw)`, where `algbw = busbw / factor(n)`
//!   (nccl-tests' bus-bandwidth factor), capped at the HBM copy rate (one GPU copies locally).
//! - GPU pairs (the agent repeats each measurement 5 times of 4 copies): one-way,
//!   `n(n-1) * 20 * bytes / copy`; both ways, `n(n-1)/2 * 20 * 2 bytes / copy` (each
//!   direction at the one-way rate at once); host copies `n * 2 * 20 * bytes / host`.
//! - DDP probe: for every GPU count `c` the node runs, `max(warmupSteps, 1) + steps +
//!   min(steps, 5)` steps with compute (`6 * batch * hidden^2 * layers` FLOPs of GEMMs)
//!   and as many with the gradient all-reduce (`2 * hidden^2 * layers` bytes, bf16, plus one
//!   latency per bucket) when `c > 1`, plus a communicator set-up per count.
//!
//! - Compute: GEMMs of `2 size^3` FLOPs, `warmupIters + iters` of them in bf16 and
//!   `min(warmupIters, 50) + iters` in TF32 at half the bf16 rate; 4 blocks of `iters`
//!   copies of `2 x bytes` and fills of `bytes` at the HBM copy rate; `sdc.repeats` GEMMs of
//!   `sdc.size`. The GPUs run them all at once.
//!
//! Node-pair pods are separate pods that move `nodePairs.bytes` once; they are left out.

use crate::suite::{Collective, Compute, DdpProbe, GpuPairs, NcclSweep, Suite};

/// Repeats of each GPU-pair measurement, and copies in each (the agent's full mode).
const PAIR_REPEATS: f64 = 5.0;
const PAIR_COPIES: f64 = 4.0;
/// Steps the DDP probe runs compute-only and communication-only after the timed ones.
const DDP_ALONE_STEPS_MAX: u32 = 5;
/// Bytes per gradient element (bf16).
const GRAD_ELEMENT_BYTES: f64 = 2.0;

/// The rates of a node the estimate assumes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NodeModel {
    /// What the figure stands for, in a sentence part ("an 8-GPU H100-class node").
    pub name: &'static str,
    /// GPUs of the node.
    pub gpus: u32,
    /// NCCL bus bandwidth (nccl-tests' busbw) of large messages, GB/s.
    pub nccl_busbw_gbps: f64,
    /// Highest algorithm bandwidth of any collective, GB/s (with one GPU, a local copy).
    pub nccl_algbw_max_gbps: f64,
    /// Time of the smallest collective, µs.
    pub nccl_latency_us: f64,
    /// One GPU-to-GPU copy stream, GB/s.
    pub copy_gbps: f64,
    /// One host<->GPU copy stream, GB/s.
    pub host_gbps: f64,
    /// Dense bf16 GEMM rate reached, TFLOP/s.
    pub gemm_tflops: f64,
    /// Pod start to first measurement: process, CUDA contexts, first communicator, s.
    pub startup_s: f64,
    /// Setting up the communicator of each DDP GPU count, s.
    pub comm_init_s: f64,
}

/// A lower bound for any node: one GPU, no start-up, rates above any GPU sold today
/// (HBM3e copies ~8 TB/s, NVLink 5 at 900 GB/s one way, Grace C2C 450 GB/s to the host,
/// ~2.5 PFLOP/s dense bf16), each taken at least twice over.
pub const FASTEST: NodeModel = NodeModel {
    name: "one GPU at rates no GPU reaches today",
    gpus: 1,
    nccl_busbw_gbps: 2_000.0,
    nccl_algbw_max_gbps: 20_000.0,
    nccl_latency_us: 2.0,
    copy_gbps: 2_000.0,
    host_gbps: 1_000.0,
    gemm_tflops: 5_000.0,
    startup_s: 0.0,
    comm_init_s: 0.0,
};

/// An 8-GPU H100/H200 SXM node as measured (all_reduce busbw ~355 GB/s, 12 µs at 8 B,
/// 390 GB/s per pair copy; PCIe Gen5 to the host; ~60% of the bf16 GEMM peak).
pub const TYPICAL: NodeModel = NodeModel {
    name: "an 8-GPU H100/H200 node",
    gpus: 8,
    nccl_busbw_gbps: 350.0,
    nccl_algbw_max_gbps: 3_000.0,
    nccl_latency_us: 15.0,
    copy_gbps: 390.0,
    host_gbps: 50.0,
    gemm_tflops: 600.0,
    startup_s: 10.0,
    comm_init_s: 2.0,
};

/// Seconds of each phase of a suite on one node.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Estimate {
    pub startup_s: f64,
    pub nccl_sweep_s: f64,
    pub gpu_pairs_s: f64,
    pub ddp_probe_s: f64,
    pub compute_s: f64,
}

impl Estimate {
    /// Seconds from pod start to the result.
    pub fn total_s(&self) -> f64 {
        self.startup_s + self.nccl_sweep_s + self.gpu_pairs_s + self.ddp_probe_s + self.compute_s
    }

    /// The phases that take time, e.g. "NCCL sweep 812 s, DDP probe 3 s".
    pub fn breakdown(&self) -> String {
        let parts = [
            ("start-up", self.startup_s),
            ("NCCL sweep", self.nccl_sweep_s),
            ("GPU pairs", self.gpu_pairs_s),
            ("DDP probe", self.ddp_probe_s),
            ("compute", self.compute_s),
        ];
        let named: Vec<String> = parts
            .iter()
            .filter(|(_, s)| *s >= 0.5)
            .map(|(name, s)| format!("{name} {}", seconds(*s)))
            .collect();
        if named.is_empty() {
            "every phase under a second".into()
        } else {
            named.join(", ")
        }
    }
}

/// A duration for messages: whole seconds, or "<1 s".
pub fn seconds(s: f64) -> String {
    if s < 1.0 {
        "<1 s".into()
    } else if s < 1e9 {
        format!("{s:.0} s")
    } else {
        format!("{s:.1e} s")
    }
}

/// The time of `suite` on a node like `node`.
pub fn estimate(suite: &Suite, node: &NodeModel) -> Estimate {
    Estimate {
        startup_s: node.startup_s,
        nccl_sweep_s: nccl_sweep_s(&suite.nccl_sweep, node),
        gpu_pairs_s: gpu_pairs_s(&suite.gpu_pairs, node),
        ddp_probe_s: ddp_probe_s(&suite.ddp_probe, node),
        compute_s: compute_s(&suite.compute, node),
    }
}

fn compute_s(compute: &Compute, node: &NodeModel) -> f64 {
    let gemm_s = |n: u32| 2.0 * f64::from(n).powi(3) / (node.gemm_tflops * 1e12);
    let mut s = 0.0;
    let g = &compute.gemm;
    if g.enabled {
        s += (f64::from(g.warmup_iters) + f64::from(g.iters)) * gemm_s(g.size);
        if g.tf32 {
            s += (f64::from(g.warmup_iters.min(50)) + f64::from(g.iters)) * 2.0 * gemm_s(g.size);
        }
    }
    let m = &compute.memory;
    if m.enabled {
        s += 4.0 * f64::from(m.iters) * 3.0 * m.bytes as f64 / (node.nccl_algbw_max_gbps * 1e9);
    }
    let d = &compute.sdc;
    if d.enabled {
        s += f64::from(d.repeats) * gemm_s(d.size);
    }
    s
}

/// Algorithm bandwidth of `c` on `ranks` GPUs, bytes/s.
fn algbw(node: &NodeModel, c: Collective, ranks: u32) -> f64 {
    let factor = c.busbw_factor(ranks as usize);
    let gbps = if factor > 0.0 {
        (node.nccl_busbw_gbps / factor).min(node.nccl_algbw_max_gbps)
    } else {
        node.nccl_algbw_max_gbps
    };
    gbps * 1e9
}

fn nccl_sweep_s(sweep: &NcclSweep, node: &NodeModel) -> f64 {
    if !sweep.enabled {
        return 0.0;
    }
    // With graph launches every timed block runs its iterations that many times.
    let ops = f64::from(sweep.warmup_iters)
        + f64::from(sweep.iters) * f64::from(sweep.graph_launches.max(1));
    let sizes = sweep.sizes();
    sweep
        .collectives
        .iter()
        .map(|&c| {
            let bw = algbw(node, c, node.gpus);
            sizes
                .iter()
                .map(|&s| ops * (node.nccl_latency_us * 1e-6 + s as f64 / bw))
                .sum::<f64>()
        })
        .sum()
}

fn gpu_pairs_s(pairs: &GpuPairs, node: &NodeModel) -> f64 {
    if !pairs.enabled {
        return 0.0;
    }
    let n = f64::from(node.gpus);
    let per_measure = PAIR_REPEATS * PAIR_COPIES * pairs.bytes as f64;
    let ordered_pairs = n * (n - 1.0);
    let mut s = ordered_pairs * per_measure / (node.copy_gbps * 1e9);
    if pairs.bidirectional {
        // Half as many pairs, each copying twice as long in both directions at once.
        s += ordered_pairs / 2.0 * 2.0 * per_measure / (node.copy_gbps * 1e9);
    }
    if pairs.host_copies {
        s += n * 2.0 * per_measure / (node.host_gbps * 1e9);
    }
    s
}

fn ddp_probe_s(probe: &DdpProbe, node: &NodeModel) -> f64 {
    if !probe.enabled {
        return 0.0;
    }
    let h = f64::from(probe.hidden);
    let layers = f64::from(probe.layers);
    let flops = 6.0 * f64::from(probe.batch_per_gpu) * h * h * layers;
    let compute_s = flops / (node.gemm_tflops * 1e12);
    let grad_bytes = GRAD_ELEMENT_BYTES * h * h * layers;
    let buckets = (grad_bytes / probe.bucket_bytes.max(1) as f64).ceil() + 1.0;
    let steps = f64::from(probe.warmup_steps.max(1))
        + f64::from(probe.steps)
        + f64::from(probe.steps.min(DDP_ALONE_STEPS_MAX));
    probe
        .counts_for(node.gpus)
        .into_iter()
        .map(|c| {
            let comm_s = if c > 1 {
                buckets * node.nccl_latency_us * 1e-6
                    + grad_bytes / algbw(node, Collective::AllReduce, c)
            } else {
                0.0
            };
            node.comm_init_s + steps * (compute_s + comm_s)
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_suite_fits_the_default_timeout_with_room() {
        let suite = Suite::default();
        let typical = estimate(&suite, &TYPICAL).total_s();
        let fastest = estimate(&suite, &FASTEST).total_s();
        // Measured: 22.3 s on 4 x H200; 8 GPUs have more pairs and one more DDP point.
        assert!((15.0..90.0).contains(&typical), "{typical}");
        assert!(fastest < typical / 10.0, "{fastest} vs {typical}");
        assert!(typical < 900.0 / 2.0);
    }

    #[test]
    fn the_lower_bound_is_below_the_typical_node_for_every_part() {
        let mut suite = Suite::default();
        suite.node_pairs.enabled = true;
        let (lo, hi) = (estimate(&suite, &FASTEST), estimate(&suite, &TYPICAL));
        assert!(lo.nccl_sweep_s < hi.nccl_sweep_s);
        assert!(lo.gpu_pairs_s < hi.gpu_pairs_s);
        assert!(lo.ddp_probe_s < hi.ddp_probe_s);
        assert!(lo.startup_s <= hi.startup_s);
    }

    #[test]
    fn time_grows_with_iterations_and_sizes() {
        let mut suite = Suite::default();
        let base = estimate(&suite, &TYPICAL).nccl_sweep_s;
        suite.nccl_sweep.iters *= 10;
        let more_iters = estimate(&suite, &TYPICAL).nccl_sweep_s;
        assert!(more_iters > 5.0 * base, "{base} -> {more_iters}");
        suite.nccl_sweep.max_bytes *= 16;
        assert!(estimate(&suite, &TYPICAL).nccl_sweep_s > 10.0 * more_iters);
    }

    #[test]
    fn graph_launches_run_the_timed_iterations_that_many_times() {
        let mut sweep = NcclSweep {
            collectives: vec![Collective::AllReduce],
            min_bytes: 1 << 30,
            max_bytes: 1 << 30,
            warmup_iters: 5,
            iters: 10,
            ..NcclSweep::default()
        };
        let once = nccl_sweep_s(&sweep, &TYPICAL);
        sweep.graph_launches = 1;
        assert_eq!(
            nccl_sweep_s(&sweep, &TYPICAL),
            once,
            "one launch is the plain block"
        );
        sweep.graph_launches = 10;
        // 5 warm-up iterations and 10 x 10 timed ones, against 5 + 10.
        let ratio = nccl_sweep_s(&sweep, &TYPICAL) / once;
        assert!((ratio - 105.0 / 15.0).abs() < 1e-9, "{ratio}");
    }

    #[test]
    fn a_disabled_phase_costs_nothing() {
        let mut suite = Suite::default();
        suite.nccl_sweep.enabled = false;
        suite.gpu_pairs.enabled = false;
        suite.ddp_probe.enabled = false;
        suite.compute.gemm.enabled = false;
        suite.compute.memory.enabled = false;
        suite.compute.sdc.enabled = false;
        let e = estimate(&suite, &TYPICAL);
        assert_eq!(e.total_s(), TYPICAL.startup_s);
        assert_eq!(e.breakdown(), "start-up 10 s");
    }

    #[test]
    fn the_default_compute_checks_take_a_few_seconds() {
        let c = Compute::default();
        let s = compute_s(&c, &TYPICAL);
        // bf16: 800 x 2 x 8192^3 at 600 TFLOP/s = 1.47 s; TF32 250 at half the rate 0.92 s;
        // 4 x 50 copies and fills of 1 GiB at 3 TB/s 0.21 s; 4 SDC GEMMs of 4096 nothing.
        assert!((2.4..2.8).contains(&s), "{s}");
        let mut off = c.clone();
        off.gemm.tf32 = false;
        assert!(compute_s(&off, &TYPICAL) < s * 0.7);
    }

    /// One size, one collective: the model's arithmetic by hand.
    #[test]
    fn one_all_reduce_size_is_latency_plus_bytes_over_algbw() {
        let mut sweep = NcclSweep {
            collectives: vec![Collective::AllReduce],
            min_bytes: 1 << 30,
            max_bytes: 1 << 30,
            warmup_iters: 0,
            iters: 10,
            ..NcclSweep::default()
        };
        // 8 ranks: algbw = 350 / (2 * 7 / 8) = 200 GB/s.
        let expect = 10.0 * (15e-6 + (1u64 << 30) as f64 / 200e9);
        let got = nccl_sweep_s(&sweep, &TYPICAL);
        assert!((got - expect).abs() < 1e-9, "{got} vs {expect}");
        sweep.enabled = false;
        assert_eq!(nccl_sweep_s(&sweep, &TYPICAL), 0.0);
    }

    #[test]
    fn seconds_read_well() {
        assert_eq!(seconds(0.2), "<1 s");
        assert_eq!(seconds(812.4), "812 s");
        assert_eq!(seconds(3.2e12), "3.2e12 s");
    }
}
