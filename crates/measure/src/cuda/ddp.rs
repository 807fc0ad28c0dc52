//! The DDP scaling probe: an MLP step (bf16 cuBLAS GEMMs, fp32 accumulate and fp32
//! gradients as under PyTorch autocast) with gradient buckets all-reduced on a second
//! stream as soon as backward has produced them, weak-scaled over GPU counts.

use super::gpu::{DevBuf, Event, Gpu, GpuError, GpuResult, HostBuf, Stream};
use super::nccl::{Comms, Watchdog, ncheck, sync_all};
use crate::model::{self, Bucket, PointTimes, buckets};
use cudarc::cublas::sys as bsys;
use cudarc::nccl::sys as nsys;
use gpufabric_api::result::{DdpPoint, DdpResult};
use serde::{Deserialize, Serialize};
use std::ffi::c_void;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
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

/// Byte offset of layer `l`'s weight gradient in the flat buffer (reverse layer order,
/// bias before weight).
fn wgrad_offset(hidden: u64, layers: usize, l: usize) -> u64 {
    let per_layer = hidden * 4 + hidden * hidden * 4;
    (layers - 1 - l) as u64 * per_layer + hidden * 4
}

fn bcheck(call: &'static str, s: bsys::cublasStatus_t) -> GpuResult<()> {
    if s == bsys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(GpuError::Call {
            call,
            detail: format!("{s:?}"),
        })
    }
}

/// Whether libcublas can be opened.
pub fn cublas_present() -> bool {
    // SAFETY: only opens the library.
    unsafe { bsys::is_culib_present() }
}

struct Blas {
    raw: bsys::cublasHandle_t,
}

impl Blas {
    fn new(gpu: &Gpu, stream: &Stream) -> GpuResult<Blas> {
        gpu.bind()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid out-pointer; destroyed in Drop.
        bcheck("cublasCreate", unsafe { bsys::cublasCreate_v2(&mut raw) })?;
        let b = Blas { raw };
        // SAFETY: live handle and stream.
        bcheck("cublasSetStream", unsafe {
            bsys::cublasSetStream_v2(b.raw, stream.raw as bsys::cudaStream_t)
        })?;
        Ok(b)
    }

    /// C(m x n, fp32 or bf16) = op(A) op(B), bf16 inputs, fp32 accumulate; column-major.
    #[allow(clippy::too_many_arguments)]
    fn gemm(
        &self,
        ta: bool,
        tb: bool,
        m: usize,
        n: usize,
        k: usize,
        a: u64,
        lda: usize,
        b: u64,
        ldb: usize,
        c: u64,
        ldc: usize,
        c_fp32: bool,
    ) -> GpuResult<()> {
        let alpha = 1.0f32;
        let beta = 0.0f32;
        let op = |t| {
            if t {
                bsys::cublasOperation_t::CUBLAS_OP_T
            } else {
                bsys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let ct = if c_fp32 {
            bsys::cudaDataType::CUDA_R_32F
        } else {
            bsys::cudaDataType::CUDA_R_16BF
        };
        // SAFETY: the pointers are device buffers sized for these shapes by the caller.
        bcheck("cublasGemmEx", unsafe {
            bsys::cublasGemmEx(
                self.raw,
                op(ta),
                op(tb),
                m as i32,
                n as i32,
                k as i32,
                &alpha as *const f32 as *const c_void,
                a as *const c_void,
                bsys::cudaDataType::CUDA_R_16BF,
                lda as i32,
                b as *const c_void,
                bsys::cudaDataType::CUDA_R_16BF,
                ldb as i32,
                &beta as *const f32 as *const c_void,
                c as *mut c_void,
                ct,
                ldc as i32,
                bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        })
    }
}

// SAFETY: a cuBLAS handle may be used from any thread, one at a time; each handle belongs
// to one replica and each replica to one thread at a time.
unsafe impl Send for Blas {}
// SAFETY: as above.
unsafe impl Sync for Blas {}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: destroys the handle created in new().
        unsafe { bsys::cublasDestroy_v2(self.raw) };
    }
}

/// Everything one GPU of the probe holds.
struct Replica<'g> {
    gpu: &'g Gpu,
    compute: Stream,
    comm: Stream,
    blas: Blas,
    weights: DevBuf,
    acts: DevBuf,
    dy: [DevBuf; 2],
    grads: DevBuf,
    scratch: [DevBuf; 2],
    ready: Vec<Event>,
    /// Recorded on the comm stream after each bucket's all-reduce.
    bucket_done: Vec<Event>,
    comm_done: Event,
    t0: Event,
    t1: Event,
    step_start: Vec<Event>,
    step_end: Vec<Event>,
    trace: Option<Trace>,
}

/// One step's operations on one GPU, each between two events on its stream.
struct Trace {
    on: AtomicBool,
    ops: Mutex<Vec<TracedOp>>,
}

struct TracedOp {
    name: String,
    comm: bool,
    start: Event,
    end: Event,
}

/// One traced operation: on the comm stream or the compute stream, start and duration
/// in ms from the step's start.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceLine {
    pub name: String,
    pub comm: bool,
    pub start_ms: f64,
    pub dur_ms: f64,
}

/// The trace as text: one line per operation, then the total time per kind of operation
/// (the name up to its index: `fwd`, `wgrad`, `allreduce b`, ...).
pub fn trace_lines(ops: &[TraceLine]) -> Vec<String> {
    let mut lines = Vec::new();
    let mut sums: Vec<(String, f64, u32)> = Vec::new();
    for op in ops {
        let stream = if op.comm { "comm" } else { "compute" };
        lines.push(format!(
            "{stream:<7} {:<14} start {:8.3} ms  dur {:7.3} ms",
            op.name, op.start_ms, op.dur_ms
        ));
        let kind: String = op
            .name
            .chars()
            .take_while(|c| c.is_alphabetic() || *c == '-')
            .collect();
        match sums.iter_mut().find(|(k, _, _)| *k == kind) {
            Some(e) => {
                e.1 += op.dur_ms;
                e.2 += 1;
            }
            None => sums.push((kind, op.dur_ms, 1)),
        }
    }
    for (kind, total, n) in sums {
        lines.push(format!("sum     {kind:<14} {n:2} x  total {total:7.3} ms"));
    }
    lines
}

/// The copies that move `total` bytes through a buffer of `chunk` bytes: (offset, bytes).
fn chunks(total: u64, chunk: u64) -> impl Iterator<Item = (u64, u64)> {
    let chunk = chunk.max(1);
    (0..total.div_ceil(chunk)).map(move |i| {
        let off = i * chunk;
        (off, chunk.min(total - off))
    })
}

/// Pseudo-random bf16 values uniform in (-scale, scale), as little-endian bytes.
fn bf16_random(buf: &mut [u8], scale: f32, seed: u64) {
    let n = buf.len() / 2;
    let chunk = (n / 16).max(1 << 16);
    std::thread::scope(|s| {
        for (ci, part) in buf[..n * 2].chunks_mut(chunk * 2).enumerate() {
            s.spawn(move || {
                for (j, cell) in part.chunks_exact_mut(2).enumerate() {
                    let w = super::gpu::pattern_word(seed, (ci * chunk + j) as u64);
                    let u = (w >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
                    let v = (2.0 * u - 1.0) * scale;
                    let bits = (v.to_bits() >> 16) as u16;
                    cell.copy_from_slice(&bits.to_le_bytes());
                }
            });
        }
    });
}

impl<'g> Replica<'g> {
    fn new(
        gpu: &'g Gpu,
        set: &DdpSettings,
        nbuckets: usize,
        host: &mut HostBuf,
    ) -> GpuResult<Self> {
        let (h, l, b) = (set.hidden, set.layers, set.batch);
        let compute = Stream::new(gpu)?;
        let comm = Stream::new(gpu)?;
        let blas = Blas::new(gpu, &compute)?;
        let wbytes = h * h * 2;
        let abytes = b * h * 2;
        let weights = DevBuf::new(gpu, wbytes * l)?;
        let acts = DevBuf::new(gpu, abytes * (l + 1))?;
        let dy = [DevBuf::new(gpu, abytes)?, DevBuf::new(gpu, abytes)?];
        let grads = DevBuf::new(gpu, l * (h * 4 + h * h * 4))?;
        let scratch_bytes = h * h * 4;
        let scratch = [
            DevBuf::new(gpu, scratch_bytes)?,
            DevBuf::new(gpu, scratch_bytes)?,
        ];
        // Weights: one random layer, copied to all layers (U(-sqrt(3/h), sqrt(3/h)) keeps the
        // activations' scale through the stack); inputs and output gradient random too.
        let wscale = (3.0 / h as f32).sqrt();
        bf16_random(&mut host.as_mut_slice()[..wbytes], wscale, 11);
        for i in 0..l {
            compute.memcpy_htod(weights.at(i * wbytes), host, wbytes)?;
        }
        compute.sync()?;
        bf16_random(
            &mut host.as_mut_slice()[..abytes],
            1.0,
            12 + u64::from(gpu.index),
        );
        compute.memcpy_htod(acts.ptr, host, abytes)?;
        compute.sync()?;
        bf16_random(&mut host.as_mut_slice()[..abytes], 1e-3, 13);
        compute.memcpy_htod(dy[0].ptr, host, abytes)?;
        compute.memset_d32(grads.ptr, 0, grads.bytes / 4)?;
        compute.sync()?;
        let steps = set.steps.max(1) as usize;
        Ok(Replica {
            gpu,
            compute,
            comm,
            blas,
            weights,
            acts,
            dy,
            grads,
            scratch,
            ready: (0..nbuckets)
                .map(|_| Event::new(gpu))
                .collect::<GpuResult<_>>()?,
            bucket_done: (0..nbuckets)
                .map(|_| Event::new(gpu))
                .collect::<GpuResult<_>>()?,
            comm_done: Event::new(gpu)?,
            t0: Event::new(gpu)?,
            t1: Event::new(gpu)?,
            step_start: (0..steps)
                .map(|_| Event::new(gpu))
                .collect::<GpuResult<_>>()?,
            step_end: (0..steps)
                .map(|_| Event::new(gpu))
                .collect::<GpuResult<_>>()?,
            trace: (set.trace && gpu.index == 0).then(|| Trace {
                on: AtomicBool::new(false),
                ops: Mutex::new(Vec::new()),
            }),
        })
    }

    /// Runs `f`, which enqueues work on the compute or the comm stream; while this
    /// replica's trace is on, brackets that work with two events.
    fn traced(
        &self,
        name: impl FnOnce() -> String,
        comm: bool,
        f: impl FnOnce() -> GpuResult<()>,
    ) -> GpuResult<()> {
        let Some(tr) = self.trace.as_ref().filter(|t| t.on.load(Ordering::Relaxed)) else {
            return f();
        };
        let stream = if comm { &self.comm } else { &self.compute };
        let start = Event::new(self.gpu)?;
        start.record(stream)?;
        f()?;
        let end = Event::new(self.gpu)?;
        end.record(stream)?;
        if let Ok(mut ops) = tr.ops.lock() {
            ops.push(TracedOp {
                name: name(),
                comm,
                start,
                end,
            });
        }
        Ok(())
    }

    /// The traced step's operations (tracing stops after the timed steps, in
    /// [`measure_point`]) in the order they were enqueued, with start and duration in ms
    /// from the step's start.
    fn take_trace(&self, step: usize) -> GpuResult<Vec<TraceLine>> {
        let Some(tr) = &self.trace else {
            return Ok(Vec::new());
        };
        let ops = match tr.ops.lock() {
            Ok(mut ops) => std::mem::take(&mut *ops),
            Err(_) => return Ok(Vec::new()),
        };
        let Some(origin) = self.step_start.get(step) else {
            return Ok(Vec::new());
        };
        ops.iter()
            .map(|op| {
                Ok(TraceLine {
                    name: op.name.clone(),
                    comm: op.comm,
                    start_ms: origin.elapsed_ms(&op.start)?,
                    dur_ms: op.start.elapsed_ms(&op.end)?,
                })
            })
            .collect()
    }

    /// One memory pass of `bytes` read and `bytes` written on the compute stream.
    fn pass(&self, bytes: usize) -> GpuResult<()> {
        let bytes = bytes.min(self.scratch[0].bytes);
        self.compute
            .memcpy_dtod(self.scratch[1].ptr, self.scratch[0].ptr, bytes)
    }

    /// Launches the all-reduce of bucket `k` on the comm stream once it is ready (`wait`).
    fn allreduce(&self, comm: usize, bk: &Bucket, wait: Option<usize>) -> GpuResult<()> {
        if let Some(k) = wait {
            self.comm.wait(&self.ready[k])?;
        }
        let p = (self.grads.ptr + bk.offset) as *mut c_void;
        let name = || wait.map_or("allreduce".into(), |k| format!("allreduce b{k}"));
        self.traced(name, true, || {
            // SAFETY: the bucket lies inside the gradient buffer (in-place all-reduce);
            // the communicator is live and used by this thread only.
            ncheck("ncclAllReduce", unsafe {
                nsys::ncclAllReduce(
                    p,
                    p,
                    (bk.bytes / 4) as usize,
                    nsys::ncclDataType_t::ncclFloat32,
                    nsys::ncclRedOp_t::ncclSum,
                    comm as nsys::ncclComm_t,
                    self.comm.raw as nsys::cudaStream_t,
                )
            })
        })?;
        if let Some(k) = wait {
            self.bucket_done[k].record(&self.comm)?;
        }
        Ok(())
    }

    /// After the all-reduces, as PyTorch's DDP reducer finalizes backward without bucket
    /// views: bucket by bucket, in the order they were reduced, the compute stream waits
    /// for that bucket's all-reduce and copies the bucket back into the parameters'
    /// gradients, so the early buckets' copies overlap the last all-reduce.
    fn finish_step(&self, bks: &[Bucket]) -> GpuResult<()> {
        let chunk = self.scratch[1].bytes as u64;
        for (k, bk) in bks.iter().enumerate() {
            self.compute.wait(&self.bucket_done[k])?;
            self.traced(
                || format!("copy-back {k}"),
                false,
                || {
                    chunks(bk.bytes, chunk).try_for_each(|(off, n)| {
                        let src = self.grads.ptr + bk.offset + off;
                        self.compute
                            .memcpy_dtod(self.scratch[1].ptr, src, n as usize)
                    })
                },
            )?;
        }
        self.compute.wait(&self.comm_done)
    }

    /// Forward and backward on the compute stream; `ready[b]` is recorded once bucket b's
    /// gradients are written.
    fn compute_step(
        &self,
        set: &DdpSettings,
        bks: &[Bucket],
        timed: Option<usize>,
        launch: Option<usize>,
    ) -> GpuResult<()> {
        self.gpu.bind()?;
        let (h, l, b) = (set.hidden, set.layers, set.batch);
        let wbytes = (h * h * 2) as u64;
        let abytes = (b * h * 2) as u64;
        let w = |i: usize| self.weights.ptr + i as u64 * wbytes;
        let x = |i: usize| self.acts.ptr + i as u64 * abytes;
        if let (Some(tr), Some(s)) = (&self.trace, timed) {
            // Trace the last timed step (and its copy-back, which ends the run).
            tr.on
                .store(s + 1 == self.step_start.len(), Ordering::Relaxed);
        }
        if let Some(s) = timed {
            self.step_start[s].record(&self.compute)?;
        }
        // Forward: X_{i+1} (h x b, column-major) = W_i^T-as-stored * X_i.
        for i in 0..l {
            // Under autocast each fp32 weight is first cast to bf16 (read 4, write 2
            // bytes per parameter).
            self.traced(|| format!("wcast {i}"), false, || self.pass(h * h * 3))?;
            self.traced(
                || format!("fwd {i}"),
                false,
                || {
                    self.blas
                        .gemm(true, false, h, b, h, w(i), h, x(i), h, x(i + 1), h, false)
                },
            )?;
        }
        // Backward, last layer first: dgrad (not for the first layer), then wgrad into the
        // flat fp32 gradient buffer; a bucket is ready after its lowest layer.
        let mut cur = 0usize;
        for i in (0..l).rev() {
            let dy = self.dy[cur].ptr;
            if i > 0 {
                let dx = self.dy[1 - cur].ptr;
                self.traced(
                    || format!("dgrad {i}"),
                    false,
                    || {
                        self.blas
                            .gemm(false, false, h, b, h, w(i), h, dy, h, dx, h, false)
                    },
                )?;
            }
            let gw = self.grads.ptr + wgrad_offset(h as u64, l, i);
            // As under autocast: the weight gradient in bf16, cast to fp32 (read 2, write 4
            // bytes per parameter), then copied, scaled by 1/world, into its bucket (read
            // 4, write 4).
            let (s0, s1) = (self.scratch[0].ptr, self.scratch[1].ptr);
            self.traced(
                || format!("wgrad {i}"),
                false,
                || {
                    self.blas
                        .gemm(false, true, h, h, b, x(i), h, dy, h, s0, h, false)
                },
            )?;
            self.traced(
                || format!("gcast {i}"),
                false,
                || self.compute.memcpy_dtod(s1, s0, h * h * 3),
            )?;
            self.traced(
                || format!("bucket-in {i}"),
                false,
                || self.compute.memcpy_dtod(gw, s1, h * h * 4),
            )?;
            for (k, bk) in bks.iter().enumerate() {
                if bk.ready_after_layer == i {
                    self.ready[k].record(&self.compute)?;
                    if let Some(comm) = launch {
                        self.allreduce(comm, bk, Some(k))?;
                    }
                }
            }
            cur = 1 - cur;
        }
        if let Some(s) = timed {
            self.step_end[s].record(&self.compute)?;
        }
        Ok(())
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Overlapped,
    ComputeOnly,
    CommOnly,
}

/// The steps of one replica, launched from its own thread: compute, and each bucket's
/// all-reduce launched right after its gradients (as a DDP process does).
fn replica_steps(
    r: &Replica,
    comm: usize,
    set: &DdpSettings,
    bks: &[Bucket],
    mode: Mode,
    steps: u32,
    timed: bool,
) -> GpuResult<()> {
    r.gpu.bind()?;
    for s in 0..steps as usize {
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

/// Runs `steps` steps in `mode`; returns the mean step time (ms, slowest GPU).
#[allow(clippy::too_many_arguments)]
fn run_steps(
    reps: &[Replica],
    comms: &mut Comms,
    wd: &Watchdog,
    set: &DdpSettings,
    bks: &[Bucket],
    mode: Mode,
    steps: u32,
    timed: bool,
) -> GpuResult<f64> {
    run_steps_armed(reps, comms, wd, set, bks, mode, steps, timed)
        .map_err(|e| super::nccl::settle(e, comms, wd, set.timeout))
}

#[allow(clippy::too_many_arguments)]
fn run_steps_armed(
    reps: &[Replica],
    comms: &mut Comms,
    wd: &Watchdog,
    set: &DdpSettings,
    bks: &[Bucket],
    mode: Mode,
    steps: u32,
    timed: bool,
) -> GpuResult<f64> {
    wd.arm(comms, "ddp probe step", set.timeout);
    for r in reps {
        r.t0.record(&r.compute)?;
        r.comm.wait(&r.t0)?;
    }
    // One launching thread per GPU, as each DDP process has: a bucket's all-reduce is
    // launched as soon as its gradients are enqueued.
    let results: Vec<GpuResult<()>> = std::thread::scope(|sc| {
        let handles: Vec<_> = reps
            .iter()
            .zip(comms.raw.iter().map(|c| *c as usize))
            .map(|(r, comm)| sc.spawn(move || replica_steps(r, comm, set, bks, mode, steps, timed)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(GpuError::Call {
                        call: "ddp probe thread",
                        detail: "panicked".into(),
                    })
                })
            })
            .collect()
    });
    for r in results {
        r?;
    }
    for r in reps {
        match mode {
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
    Ok(ms / f64::from(steps.max(1)))
}

/// Runs n x n x n bf16 GEMMs on `gpu` until `duration` passes or `stop` is set; returns the
/// floating-point operations done. Used to make a real straggler.
pub fn busy_gemms(
    gpu: &Gpu,
    n: usize,
    duration: Duration,
    stop: &std::sync::atomic::AtomicBool,
) -> GpuResult<f64> {
    let stream = Stream::new(gpu)?;
    let blas = Blas::new(gpu, &stream)?;
    let bytes = n * n * 2;
    let a = DevBuf::new(gpu, bytes)?;
    let b = DevBuf::new(gpu, bytes)?;
    let c = DevBuf::new(gpu, bytes)?;
    let mut host = HostBuf::new(gpu, bytes)?;
    bf16_random(host.as_mut_slice(), 1.0, 21);
    stream.memcpy_htod(a.ptr, &host, bytes)?;
    stream.memcpy_htod(b.ptr, &host, bytes)?;
    stream.sync()?;
    let started = std::time::Instant::now();
    let mut flops = 0.0;
    while started.elapsed() < duration && !stop.load(std::sync::atomic::Ordering::Relaxed) {
        gpu.bind()?;
        for _ in 0..8 {
            blas.gemm(false, false, n, n, n, a.ptr, n, b.ptr, n, c.ptr, n, false)?;
        }
        stream.sync()?;
        flops += 8.0 * 2.0 * (n as f64).powi(3);
    }
    Ok(flops)
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
    run_steps(
        sub,
        comms,
        wd,
        set,
        bks,
        Mode::Overlapped,
        set.warmup.max(1),
        false,
    )?;
    let step_ms = run_steps(sub, comms, wd, set, bks, Mode::Overlapped, set.steps, true)?;
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
    let alone_steps = set.steps.clamp(1, 5);
    let compute_alone_ms = run_steps(
        sub,
        comms,
        wd,
        set,
        bks,
        Mode::ComputeOnly,
        alone_steps,
        false,
    )?;
    let comm_alone_ms = run_steps(sub, comms, wd, set, bks, Mode::CommOnly, alone_steps, false)?;
    Ok(PointTimes {
        step_ms,
        compute_ms,
        compute_alone_ms,
        comm_alone_ms,
    })
}

/// The result point of `t` on the GPUs `gpu_indices`, scaled against `base` (the 1-GPU
/// point, or the first point measured); reports it through `progress`.
pub fn make_point(
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
pub fn measure_rank(
    device: u32,
    rank: u32,
    world: u32,
    id: nsys::ncclUniqueId,
    set: &DdpSettings,
) -> GpuResult<PointTimes> {
    super::gpu::init_and_count()?;
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
    t
}

/// Measures every GPU count of the probe.
/// With `worker`, one process of that program per GPU (its `ddp-worker` subcommand), as
/// PyTorch DDP runs; without, this process drives every GPU.
pub fn probe(
    gpus: &[Gpu],
    set: &DdpSettings,
    worker: Option<&std::path::Path>,
    wd: &Watchdog,
    progress: &dyn Fn(&str),
) -> GpuResult<DdpResult> {
    if let Some(exe) = worker {
        return super::ddp_procs::probe(gpus, set, exe, progress);
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
        let devs: Vec<i32> = sub.iter().map(|r| r.gpu.index as i32).collect();
        let mut comms = Comms::init(&devs)?;
        let t = measure_point(sub, &mut comms, wd, set, &bks)?;
        drop(comms);
        if let Some(r) = sub.first().filter(|r| r.trace.is_some()) {
            let last = set.steps.max(1) as usize - 1;
            for line in trace_lines(&r.take_trace(last)?) {
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
pub fn result(set: &DdpSettings, bks: &[Bucket], points: Vec<DdpPoint>) -> DdpResult {
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
    fn weight_gradients_land_inside_their_layers_bucket() {
        let bks = buckets(8192, 8, 1 << 20, 25 << 20);
        for l in 0..8 {
            let off = wgrad_offset(8192, 8, l);
            let b = bks
                .iter()
                .find(|b| b.ready_after_layer == l)
                .expect("a bucket for each layer");
            assert!(off >= b.offset && off + 8192 * 8192 * 4 <= b.offset + b.bytes);
        }
    }

    #[test]
    fn a_bucket_is_copied_back_in_scratch_sized_pieces() {
        // The default MLP: one weight (256 MiB) and one bias per bucket, a 256 MiB scratch
        // buffer: two copies, as PyTorch copies weight and bias gradients apart.
        let w = 8192u64 * 8192 * 4;
        let pieces: Vec<_> = chunks(w + 8192 * 4, w).collect();
        assert_eq!(pieces, vec![(0, w), (w, 8192 * 4)]);
        assert_eq!(
            chunks(10, 4).collect::<Vec<_>>(),
            vec![(0, 4), (4, 4), (8, 2)]
        );
        assert_eq!(chunks(0, 4).count(), 0);
        // A zero-sized scratch buffer never loops forever.
        assert_eq!(chunks(3, 0).count(), 3);
    }

    #[test]
    fn trace_lines_list_every_operation_then_the_time_per_kind() {
        let op = |name: &str, comm, start_ms, dur_ms| TraceLine {
            name: name.into(),
            comm,
            start_ms,
            dur_ms,
        };
        let lines = trace_lines(&[
            op("wgrad 1", false, 0.0, 1.0),
            op("allreduce b0", true, 1.0, 2.0),
            op("wgrad 0", false, 1.0, 0.5),
        ]);
        assert_eq!(lines.len(), 5);
        assert!(lines[1].starts_with("comm    allreduce b0"), "{}", lines[1]);
        assert!(lines[1].contains("start    1.000 ms  dur   2.000 ms"));
        assert!(lines[3].contains("wgrad") && lines[3].contains(" 2 x  total   1.500 ms"));
        assert!(lines[4].contains("allreduce") && lines[4].contains(" 1 x  total   2.000 ms"));
    }

    #[test]
    fn each_bucket_is_copied_back_once_its_own_all_reduce_is_done() {
        let gpus = match super::super::open_gpus() {
            Ok(g) if g.len() >= 2 => g,
            Ok(_) => return eprintln!("skipped: needs 2 GPUs"),
            Err(e) => return eprintln!("skipped: no GPU ({e})"),
        };
        if !cublas_present() || !super::super::nccl::nccl_present() {
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
        let ops = reps[0].take_trace(1).expect("trace");
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
