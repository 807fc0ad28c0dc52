//! One GPU of the probe: its buffers, streams and events, and one step of forward,
//! backward and bucketed all-reduce on them.

use super::DdpSettings;
use super::blas::{Blas, Input, Mat, bf16_random};
use super::trace::{Trace, TraceLine, TracedOp};
use crate::cuda::gpu::{DevBuf, Event, Gpu, GpuResult, HostBuf, Stream};
use crate::cuda::nccl::ncheck;
use crate::model::Bucket;
use cudarc::nccl::sys as nsys;
use std::ffi::c_void;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// Byte offset of layer `l`'s weight gradient in the flat buffer (reverse layer order,
/// bias before weight).
fn wgrad_offset(hidden: u64, layers: usize, l: usize) -> u64 {
    let per_layer = hidden * 4 + hidden * hidden * 4;
    (layers - 1 - l) as u64 * per_layer + hidden * 4
}

/// Everything one GPU of the probe holds.
pub(super) struct Replica<'g> {
    pub(super) gpu: &'g Gpu,
    pub(super) compute: Stream,
    pub(super) comm: Stream,
    blas: Blas,
    weights: DevBuf,
    acts: DevBuf,
    dy: [DevBuf; 2],
    grads: DevBuf,
    scratch: [DevBuf; 2],
    ready: Vec<Event>,
    /// Recorded on the comm stream after each bucket's all-reduce.
    bucket_done: Vec<Event>,
    pub(super) comm_done: Event,
    pub(super) t0: Event,
    pub(super) t1: Event,
    pub(super) step_start: Vec<Event>,
    pub(super) step_end: Vec<Event>,
    pub(super) trace: Option<Trace>,
}

/// The copies that move `total` bytes through a buffer of `chunk` bytes: (offset, bytes).
fn chunks(total: u64, chunk: u64) -> impl Iterator<Item = (u64, u64)> {
    let chunk = chunk.max(1);
    (0..total.div_ceil(chunk)).map(move |i| {
        let off = i * chunk;
        (off, chunk.min(total - off))
    })
}

impl<'g> Replica<'g> {
    pub(super) fn new(
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

    /// The traced step's operations (the last timed step; tracing stops after it, in
    /// [`super::measure_point`]) in the order they were enqueued, with start and duration in ms
    /// from the step's start.
    pub(super) fn take_trace(&self) -> GpuResult<Vec<TraceLine>> {
        let Some(tr) = &self.trace else {
            return Ok(Vec::new());
        };
        let ops = match tr.ops.lock() {
            Ok(mut ops) => std::mem::take(&mut *ops),
            Err(_) => return Ok(Vec::new()),
        };
        let Some(origin) = self.step_start.last() else {
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
    pub(super) fn allreduce(&self, comm: usize, bk: &Bucket, wait: Option<usize>) -> GpuResult<()> {
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
    pub(super) fn finish_step(&self, bks: &[Bucket]) -> GpuResult<()> {
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
    pub(super) fn compute_step(
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
        // Every matrix of the step has `h` rows.
        let mat = |ptr| Mat { ptr, ld: h };
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
                    self.blas.gemm(
                        h,
                        b,
                        h,
                        Input::Transposed(mat(w(i))),
                        Input::AsStored(mat(x(i))),
                        mat(x(i + 1)),
                    )
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
                        self.blas.gemm(
                            h,
                            b,
                            h,
                            Input::AsStored(mat(w(i))),
                            Input::AsStored(mat(dy)),
                            mat(dx),
                        )
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
                    self.blas.gemm(
                        h,
                        h,
                        b,
                        Input::AsStored(mat(x(i))),
                        Input::Transposed(mat(dy)),
                        mat(s0),
                    )
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
                        // The all-reduce is launched once the bucket's gradients are done
                        // on the GPU, before the rest of backward is enqueued, so its NCCL
                        // kernel holds SMs before the next GEMM takes them all: the order
                        // PyTorch DDP's profile shows (its NCCL kernel starts just before
                        // the next GEMM). Enqueued ahead instead, the GEMM started first
                        // and a 268 MB all-reduce over sockets barely moved until it ended
                        // (150-166 ms against 104-123 ms launched this way).
                        self.ready[k].synchronize()?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::buckets;

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
}
