//! The DDP scaling probe: an MLP step (bf16 cuBLAS GEMMs, fp32 accumulate and fp32
//! gradients as under PyTorch autocast) with gradient buckets all-reduced on a second
//! stream as soon as backward has produced them, weak-scaled over GPU counts.

mod blas;
pub mod procs;
mod replica;
mod trace;

pub(crate) use blas::{Blas, SquareGemm};
pub(crate) use blas::{busy_gemms, cublas_present};
pub(crate) use trace::trace_lines;

use super::gpu::{Gpu, GpuError, GpuResult, HostBuf, Stream};
use super::nccl::{Comms, Watchdog, sync_all};
use crate::model::{self, Bucket, PointTimes, buckets};
use cudarc::nccl::sys as nsys;
use gpufabric_api::result::{DdpPoint, DdpResult};
use replica::Replica;
use serde::{Deserialize, Serialize};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Probe shape and schedule. The worker processes of the one-process-per-GPU mode get
/// these as JSON.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DdpSettings {
    pub hidden: usize,
    pub layers: usize,
    pub batch: usize,
    pub first_bucket_bytes: u64,
    pub bucket_bytes: u64,
    pub warmup: u32,
    pub steps: u32,
    pub counts: Vec<u32>,
    pub timeout: Duration,
    /// Print the timeline of the last timed step on the first GPU of each count (every
    /// GEMM, memory pass and all-reduce with its start and duration), for comparing the
    /// probe with a profiler trace of PyTorch DDP.
    #[serde(default)]
    pub trace: bool,
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Overlapped,
    ComputeOnly,
    CommOnly,
}

/// One run of steps: what they do, how many, and whether each step's compute is timed.
#[derive(Clone, Copy)]
struct Steps {
    mode: Mode,
    count: u32,
    timed: bool,
}

/// The steps of one replica, launched from its own thread: compute, and each bucket's
/// all-reduce launched right after its gradients (as a DDP process does).
fn replica_steps(
    r: &Replica,
    comm: usize,
    set: &DdpSettings,
    bks: &[Bucket],
    Steps { mode, count, timed }: Steps,
) -> GpuResult<()> {
    r.gpu.bind()?;
    for s in 0..count as usize {
        match mode {
            Mode::Overlapped | Mode::ComputeOnly => {
                // The next step starts once the previous one's buckets are copied back;
                // compute alone copies them too (framework work, not communication).
                if s > 0 {
                    r.finish_step(bks)?;
                }
                let launch = (mode == Mode::Overlapped).then_some(comm);
                r.compute_step(set, bks, timed.then_some(s), launch)?;
            }
            Mode::CommOnly => {
                for bk in bks {
                    r.allreduce(comm, bk, None)?;
                }
            }
        }
        if mode != Mode::ComputeOnly {
            r.comm_done.record(&r.comm)?;
        }
    }
    Ok(())
}

/// Runs `steps`; returns the mean step time (ms, slowest GPU).
fn run_steps(
    reps: &[Replica],
    comms: &mut Comms,
    wd: &Watchdog,
    set: &DdpSettings,
    bks: &[Bucket],
    steps: Steps,
) -> GpuResult<f64> {
    run_steps_armed(reps, comms, wd, set, bks, steps)
        .map_err(|e| crate::cuda::nccl::settle(e, comms, wd, set.timeout))
}

fn run_steps_armed(
    reps: &[Replica],
    comms: &mut Comms,
    wd: &Watchdog,
    set: &DdpSettings,
    bks: &[Bucket],
    steps: Steps,
) -> GpuResult<f64> {
    wd.arm(comms, "ddp probe step", set.timeout);
    for r in reps {
        r.t0.record(&r.compute)?;
        r.comm.wait(&r.t0)?;
    }
    // One launching thread per GPU, as each DDP process has: a bucket's all-reduce is
    // launched as soon as its gradients are done (`Replica::compute_step`).
    let results: Vec<GpuResult<()>> = std::thread::scope(|sc| {
        let handles: Vec<_> = reps
            .iter()
            .zip(comms.raw.iter().map(|c| *c as usize))
            .map(|(r, comm)| sc.spawn(move || replica_steps(r, comm, set, bks, steps)))
            .collect();
        handles
            .into_iter()
            .map(|h| super::gpu::joined(h, "ddp probe thread"))
            .collect()
    });
    for r in results {
        r?;
    }
    for r in reps {
        match steps.mode {
            Mode::Overlapped | Mode::ComputeOnly => r.finish_step(bks)?,
            Mode::CommOnly => r.compute.wait(&r.comm_done)?,
        }
        r.t1.record(&r.compute)?;
    }
    let streams: Vec<&Stream> = reps.iter().flat_map(|r| [&r.compute, &r.comm]).collect();
    sync_all(&streams, comms, wd, "ddp probe step", set.timeout)?;
    let mut ms: f64 = 0.0;
    for r in reps {
        ms = ms.max(r.t0.elapsed_ms(&r.t1)?);
    }
    Ok(ms / f64::from(steps.count.max(1)))
}

/// Warm-up, timed overlapped steps, then compute alone and communication alone, on the
/// replicas `sub` (all of a clique in one process, or this process's one rank).
fn measure_point(
    sub: &[Replica],
    comms: &mut Comms,
    wd: &Watchdog,
    set: &DdpSettings,
    bks: &[Bucket],
) -> GpuResult<PointTimes> {
    let warmup = Steps {
        mode: Mode::Overlapped,
        count: set.warmup.max(1),
        timed: false,
    };
    run_steps(sub, comms, wd, set, bks, warmup)?;
    let timed = Steps {
        mode: Mode::Overlapped,
        count: set.steps,
        timed: true,
    };
    let step_ms = run_steps(sub, comms, wd, set, bks, timed)?;
    for tr in sub.iter().filter_map(|r| r.trace.as_ref()) {
        tr.on.store(false, Ordering::Relaxed);
    }
    let mut compute_ms = Vec::new();
    for r in sub {
        let mut total = 0.0;
        for s in 0..set.steps.max(1) as usize {
            total += r.step_start[s].elapsed_ms(&r.step_end[s])?;
        }
        compute_ms.push(total / f64::from(set.steps.max(1)));
    }
    let alone = |mode| Steps {
        mode,
        count: set.steps.clamp(1, 5),
        timed: false,
    };
    let compute_alone_ms = run_steps(sub, comms, wd, set, bks, alone(Mode::ComputeOnly))?;
    let comm_alone_ms = run_steps(sub, comms, wd, set, bks, alone(Mode::CommOnly))?;
    Ok(PointTimes {
        step_ms,
        compute_ms,
        compute_alone_ms,
        comm_alone_ms,
    })
}

/// The result point of `t` on the GPUs `gpu_indices`, scaled against `base` (the 1-GPU
/// point, or the first point measured); reports it through `progress`.
pub(crate) fn make_point(
    set: &DdpSettings,
    base: Option<&DdpPoint>,
    t: &PointTimes,
    gpu_indices: Vec<u32>,
    progress: &dyn Fn(&str),
) -> DdpPoint {
    let flops = model::step_flops(set.hidden as u64, set.layers as u64, set.batch as u64);
    let point = model::ddp_point(t, set.batch as u64, flops, base, gpu_indices);
    let (count, step_ms, samples_per_s, eff) = (
        point.gpus,
        point.step_ms,
        point.samples_per_s,
        point.scaling_efficiency,
    );
    let exposed = (step_ms - t.compute_alone_ms).max(0.0);
    progress(&format!(
        "ddp {} GPU(s): step {:.2} ms, {:.0} samples/s, efficiency {:.1}%, compute alone {:.2} ms, comm alone {:.2} ms, exposed comm {:.2} ms, {:.0} TFLOP/s per GPU, compute per GPU {:?} ms",
        count,
        step_ms,
        samples_per_s,
        eff * 100.0,
        t.compute_alone_ms,
        t.comm_alone_ms,
        exposed,
        point.tflops_per_gpu,
        point
            .compute_ms
            .iter()
            .map(|v| (v * 100.0).round() / 100.0)
            .collect::<Vec<_>>()
    ));
    point
}

/// One rank of a clique spread over processes: opens `device`, joins the communicator of
/// `id` as `rank` of `world`, and measures the same point as [`probe`] does for its GPU.
pub(crate) fn measure_rank(
    device: u32,
    rank: u32,
    world: u32,
    id: nsys::ncclUniqueId,
    set: &DdpSettings,
) -> GpuResult<PointTimes> {
    crate::cuda::gpu::init_and_count()?;
    let gpu = Gpu::open(device)?;
    let bks = buckets(
        set.hidden as u64,
        set.layers,
        set.first_bucket_bytes,
        set.bucket_bytes,
    );
    let rep = {
        let mut host = HostBuf::new(
            &gpu,
            (set.hidden * set.hidden * 2).max(set.batch * set.hidden * 2),
        )?;
        Replica::new(&gpu, set, bks.len(), &mut host)?
    };
    gpu.bind()?;
    let mut comms = Comms::init_rank(id, world as i32, rank as i32)?;
    let wd = Watchdog::start();
    let t = measure_point(std::slice::from_ref(&rep), &mut comms, &wd, set, &bks);
    drop(wd);
    drop(comms);
    if t.is_ok() && rep.trace.is_some() {
        for line in trace_lines(&rep.take_trace()?) {
            eprintln!("ddp trace rank {rank} of {world}: {line}");
        }
    }
    t
}

/// Measures every GPU count of the probe.
/// With `worker`, one process of that program per GPU (its `ddp-worker` subcommand), as
/// PyTorch DDP runs, kept out of `nccl_log` (this process's NCCL log file); without, this
/// process drives every GPU.
pub(crate) fn probe(
    gpus: &[Gpu],
    set: &DdpSettings,
    worker: Option<&std::path::Path>,
    nccl_log: Option<&std::path::Path>,
    wd: &Watchdog,
    progress: &dyn Fn(&str),
) -> GpuResult<DdpResult> {
    if let Some(exe) = worker {
        return procs::probe(gpus, set, exe, nccl_log, progress);
    }
    let bks = buckets(
        set.hidden as u64,
        set.layers,
        set.first_bucket_bytes,
        set.bucket_bytes,
    );
    let Some(first) = gpus.first() else {
        return Err(GpuError::Call {
            call: "ddp probe",
            detail: "no GPU".into(),
        });
    };
    let mut host = HostBuf::new(
        first,
        (set.hidden * set.hidden * 2).max(set.batch * set.hidden * 2),
    )?;
    let mut reps = Vec::new();
    let max_count = set.counts.iter().copied().max().unwrap_or(1) as usize;
    for g in gpus.iter().take(max_count) {
        reps.push(Replica::new(g, set, bks.len(), &mut host)?);
    }
    let mut points: Vec<DdpPoint> = Vec::new();
    for &count in &set.counts {
        let count = count as usize;
        if count == 0 || count > reps.len() {
            continue;
        }
        let sub = &reps[..count];
        crate::activity::enter(format!("DDP probe: {count} GPU(s)"));
        let devs: Vec<i32> = sub.iter().map(|r| r.gpu.index as i32).collect();
        let mut comms = Comms::init(&devs)?;
        let t = measure_point(sub, &mut comms, wd, set, &bks)?;
        drop(comms);
        if let Some(r) = sub.first().filter(|r| r.trace.is_some()) {
            for line in trace_lines(&r.take_trace()?) {
                progress(&format!(
                    "ddp trace {count} GPU(s) gpu{}: {line}",
                    r.gpu.index
                ));
            }
        }
        let point = make_point(
            set,
            points.first(),
            &t,
            sub.iter().map(|r| r.gpu.index).collect(),
            progress,
        );
        points.push(point);
    }
    Ok(result(set, &bks, points))
}

/// The probe's result: its shape, its buckets and the points measured.
pub(crate) fn result(set: &DdpSettings, bks: &[Bucket], points: Vec<DdpPoint>) -> DdpResult {
    DdpResult {
        hidden: set.hidden as u32,
        layers: set.layers as u32,
        batch_per_gpu: set.batch as u32,
        buckets: bks.iter().map(|b| b.bytes).collect(),
        points,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_bucket_is_copied_back_once_its_own_all_reduce_is_done() {
        let gpus = match crate::cuda::open_gpus() {
            Ok(g) if g.len() >= 2 => g,
            Ok(_) => return eprintln!("skipped: needs 2 GPUs"),
            Err(e) => return eprintln!("skipped: no GPU ({e})"),
        };
        if !cublas_present() || !crate::cuda::nccl::nccl_present() {
            return eprintln!("skipped: no libcublas or libnccl");
        }
        let set = DdpSettings {
            hidden: 2048,
            layers: 4,
            batch: 1024,
            first_bucket_bytes: 1 << 20,
            bucket_bytes: 25 << 20,
            warmup: 1,
            steps: 2,
            counts: vec![2],
            timeout: Duration::from_secs(60),
            trace: true,
        };
        let bks = buckets(2048, 4, 1 << 20, 25 << 20);
        assert_eq!(bks.len(), 3, "{bks:?}");
        let mut host = HostBuf::new(&gpus[0], 2048 * 2048 * 2).expect("host buffer");
        let reps: Vec<Replica> = gpus[..2]
            .iter()
            .map(|g| Replica::new(g, &set, bks.len(), &mut host).expect("replica"))
            .collect();
        let mut comms = Comms::init(&[0, 1]).expect("communicators");
        let wd = Watchdog::start();
        let t = measure_point(&reps, &mut comms, &wd, &set, &bks).expect("measured");
        assert!(t.step_ms > 0.0 && t.compute_alone_ms > 0.0 && t.comm_alone_ms > 0.0);
        let ops = reps[0].take_trace().expect("trace");
        let find = |name: String| {
            ops.iter()
                .find(|o| o.name == name)
                .unwrap_or_else(|| panic!("{name} traced: {ops:?}"))
        };
        for k in 0..bks.len() {
            let ar = find(format!("allreduce b{k}"));
            let back = find(format!("copy-back {k}"));
            assert!(ar.comm && !back.comm);
            // Event times have about half a microsecond of resolution.
            assert!(
                back.start_ms + 0.002 >= ar.start_ms + ar.dur_ms,
                "bucket {k} copied back at {} ms, its all-reduce ended at {} ms",
                back.start_ms,
                ar.start_ms + ar.dur_ms
            );
        }
    }
}
