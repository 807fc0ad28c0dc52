//! The phases of a simulated node check: NCCL sweep, GPU-pair copies, DDP probe and health.

#![forbid(unsafe_code)]

use super::node_model::NodeModel;
use super::noise::Rng;
use crate::fleet::Fault;
use crate::{CheckOptions, Progress, model, stats};
use gpufabric_api::result::{
    CollectiveSweep, DdpPoint, DdpResult, GpuHealth, HealthSnapshot, HostBandwidth,
    NcclSweepResult, PairBandwidth, PairMatrix, SweepRow,
};
use gpufabric_api::suite::{Collective, DdpProbe, Suite};

pub(super) fn nccl_phase(
    m: &NodeModel,
    opts: &CheckOptions,
    progress: Progress,
) -> NcclSweepResult {
    let sweep = &opts.suite.nccl_sweep;
    let ranks: Vec<u32> = (0..m.gpus()).collect();
    let n = m.gpus();
    let elem = sweep.data_type.size();
    let sizes = opts.sweep_sizes();
    // Timing noise shrinks with the number of timed iterations (20 is the default).
    let iters_scale = (20.0 / f64::from(opts.sweep_iters().1)).sqrt();
    let mut collectives = Vec::new();
    // A slow launching CPU stretches the per-call latency of host-launched calls; graph
    // launches leave the host out of it.
    let launch = match sweep.graph_launches {
        0 => m.launch_cpu_factor(),
        _ => 1.0,
    };
    // In the order the cuda backend runs them, whatever order the suite lists them in.
    let wanted = Collective::ALL
        .into_iter()
        .filter(|c| sweep.collectives.contains(c));
    for c in wanted {
        let mut rng = m.rng(&format!("nccl/{}", c.api_name()));
        let mut rows: Vec<SweepRow> = Vec::new();
        for &size in &sizes {
            let (bytes, count) = model::row_shape(c, size, elem, u64::from(n));
            if rows.last().is_some_and(|r| r.bytes == bytes) {
                continue;
            }
            let modelled =
                m.collective_time_us(c, &ranks, bytes) + m.alpha_us(c, n) * (launch - 1.0);
            // Small messages are noisier (launch jitter), large ones steady.
            let sigma =
                (0.004 + 0.03 * (-(bytes as f64) / (1u64 << 20) as f64).exp()) * iters_scale;
            let t = modelled * rng.jitter(sigma).max(0.5);
            let ti = modelled * rng.jitter(sigma).max(0.5);
            rows.push(SweepRow {
                bytes,
                count,
                out_of_place: stats::timing(c, n, bytes, t, 0),
                // nccl-tests' alltoall and sendrecv (and the cuda backend) have no in-place run.
                in_place: model::has_in_place(c).then(|| stats::timing(c, n, bytes, ti, 0)),
            });
        }
        let points: Vec<(u64, f64)> = rows
            .iter()
            .map(|r| (r.bytes, r.out_of_place.time_us))
            .collect();
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
    NcclSweepResult {
        collectives,
        graph_launches: sweep.graph_launches,
    }
}

pub(super) fn pairs_phase(m: &NodeModel, suite: &Suite, progress: Progress) -> PairMatrix {
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

/// Compute slowdown of a GPU whose all-reduce runs beside its GEMMs.
pub(super) const COMPUTE_CONTENTION: f64 = 1.05;

/// Share of its standalone speed an all-reduce keeps while GEMMs run beside it (SM and HBM
/// contention). Fitted to the 4 x H200 DDP measurement (step 25.1 ms against 20.5 ms of
/// compute alone, 19% of the step exposed communication, 51% overlap).
pub(super) const OVERLAPPED_COMM_SPEED: f64 = 0.45;

/// When an all-reduce of `work` ms (standalone time) that starts at `start` ends, running
/// at [`OVERLAPPED_COMM_SPEED`] until compute ends at `compute_end` and at full speed after.
pub(super) fn overlapped_end(start: f64, work: f64, compute_end: f64) -> f64 {
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

/// Each GPU's compute alone for one step (ms): the product's speed, the node's bias, a
/// straggling GPU's factor, and `jitter` of noise.
pub(super) fn compute_alone(
    m: &NodeModel,
    flops: f64,
    gpus: &[u32],
    rng: &mut Rng,
    jitter: f64,
) -> Vec<f64> {
    gpus.iter()
        .map(|&g| {
            flops / (m.product.tflops * 1e12 * m.compute_bias)
                * 1e3
                * m.straggler(g)
                * rng.jitter(jitter)
        })
        .collect()
}

/// GEMMs done when the backward of layer `l` (of `layers`) has finished: forward (one per
/// layer), then layers L-1 down to l, two GEMMs each except layer 0 (wgrad only).
pub(super) fn gemms_done(layers: u32, l: usize) -> f64 {
    let back: u32 = (l as u32..layers).map(|k| if k == 0 { 1 } else { 2 }).sum();
    f64::from(layers + back)
}

/// The probe's training step as the model sees it.
pub(super) struct StepShape {
    pub layers: u32,
    /// Samples per GPU.
    pub batch: u64,
    /// FLOPs and GEMMs of one step on one GPU.
    pub flops: f64,
    pub gemms: f64,
    /// Gradient buckets, in all-reduce order.
    pub buckets: Vec<model::Bucket>,
}

impl StepShape {
    pub(super) fn of(probe: &DdpProbe) -> StepShape {
        let layers = probe.layers.max(1);
        let hidden = u64::from(probe.hidden.max(1));
        let batch = u64::from(probe.batch_per_gpu.max(1));
        StepShape {
            layers,
            batch,
            flops: model::step_flops(hidden, u64::from(layers), batch),
            gemms: model::gemms_per_step(u64::from(layers)) as f64,
            buckets: model::buckets(
                hidden,
                layers as usize,
                probe.first_bucket_bytes,
                probe.bucket_bytes,
            ),
        }
    }
}

pub(super) fn ddp_phase(m: &NodeModel, opts: &CheckOptions, progress: Progress) -> DdpResult {
    let probe: &DdpProbe = &opts.suite.ddp_probe;
    let StepShape {
        layers,
        batch,
        flops,
        gemms,
        buckets,
    } = StepShape::of(probe);
    let steps_scale = (10.0 / f64::from(opts.ddp_steps().1)).sqrt();
    let mut rng = m.rng("ddp");
    let mut points: Vec<DdpPoint> = Vec::new();
    for count in opts.ddp_counts(m.gpus()) {
        let idx: Vec<u32> = (0..count).collect();
        // Compute per GPU alone, then under overlap: NCCL kernels take SMs and HBM
        // bandwidth from the GEMMs (5%: 21.6 ms with overlap against 20.5 alone, measured
        // on 4 x H200).
        let alone = compute_alone(m, flops, &idx, &mut rng, 0.002 * steps_scale);
        let contention = if count > 1 { COMPUTE_CONTENTION } else { 1.0 };
        let compute: Vec<f64> = alone.iter().map(|c| c * contention).collect();
        let per_gemm: Vec<f64> = compute.iter().map(|c| c / gemms).collect();
        let compute_max = compute.iter().copied().fold(0.0, f64::max);
        let (mut comm_end, mut comm_alone) = (0.0f64, 0.0f64);
        if count > 1 {
            for b in &buckets {
                let ready = per_gemm
                    .iter()
                    .map(|t| t * gemms_done(layers, b.ready_after_layer))
                    .fold(0.0, f64::max);
                let t = m.collective_time_us(Collective::AllReduce, &idx, b.bytes) / 1e3
                    * rng.jitter(0.004 * steps_scale);
                comm_alone += t;
                comm_end = overlapped_end(comm_end.max(ready), t, compute_max);
            }
        }
        let alone_max = alone.iter().copied().fold(0.0, f64::max);
        let step_ms = compute_max.max(comm_end);
        let times = model::PointTimes {
            step_ms,
            compute_ms: compute,
            compute_alone_ms: alone_max,
            comm_alone_ms: comm_alone,
        };
        let point = model::ddp_point(&times, batch, flops, points.first(), idx);
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

pub(super) fn health_phase(m: &NodeModel, progress: Progress) -> HealthSnapshot {
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
                    Fault::NvlinkErrors { gpu: g, per_second } if *g == gpu => {
                        h.nvlink_errors += super::counter_at_now(*per_second);
                    }
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
