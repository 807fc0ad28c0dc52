//! CUDA graphs: recording a stream's work, instantiating it and launching it, as nccl-tests
//! does with `-G`; and which failures of those calls are the driver declining the feature
//! rather than a fault of the GPUs.

use super::gpu::{Gpu, GpuError, GpuResult, Stream, check};
use cudarc::driver::sys;

/// Like [`check`], for the calls that record and instantiate CUDA graphs: a status saying
/// the driver will not record or instantiate this work ([`is_capture_refusal`]) is
/// [`GpuError::Refused`]; any other status, such as the error a faulted GPU leaves on its
/// context, stays a fault.
fn check_capture(call: &'static str, status: sys::CUresult) -> GpuResult<()> {
    let checked = check(call, status);
    if is_capture_refusal(status) {
        checked.map_err(GpuError::refused)
    } else {
        checked
    }
}

/// Statuses with which the driver declines to record or instantiate work in a CUDA graph
/// (capture unsupported, invalidated or misused, not permitted, not supported).
pub(crate) fn is_capture_refusal(status: sys::CUresult) -> bool {
    use sys::CUresult as R;
    matches!(
        status,
        R::CUDA_ERROR_NOT_PERMITTED
            | R::CUDA_ERROR_NOT_SUPPORTED
            | R::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
            | R::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
            | R::CUDA_ERROR_STREAM_CAPTURE_MERGE
            | R::CUDA_ERROR_STREAM_CAPTURE_UNMATCHED
            | R::CUDA_ERROR_STREAM_CAPTURE_UNJOINED
            | R::CUDA_ERROR_STREAM_CAPTURE_ISOLATION
            | R::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
            | R::CUDA_ERROR_CAPTURED_EVENT
            | R::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD
    )
}

/// Streams whose work is being recorded into CUDA graphs instead of run, as nccl-tests
/// records its timed iterations with `-G`: [`Capture::begin`] starts recording on every
/// stream, [`Capture::finish`] ends it and instantiates one graph per stream. Dropped
/// unfinished (an enqueue failed while recording), it ends the recording and discards what
/// was recorded, so the streams can run work again. Recording and instantiating run on the
/// host alone: their failures are [`GpuError::Refused`], never a fault of the GPUs.
pub(crate) struct Capture<'s> {
    streams: Vec<(&'s Gpu, &'s Stream)>,
    open: usize,
}

impl<'s> Capture<'s> {
    /// Starts recording on each stream, in the calling thread's capture mode (work that
    /// other threads enqueue meanwhile is not affected, nor refused).
    pub(crate) fn begin(streams: &[(&'s Gpu, &'s Stream)]) -> GpuResult<Capture<'s>> {
        let mut cap = Capture {
            streams: streams.to_vec(),
            open: 0,
        };
        for (gpu, s) in streams {
            gpu.bind()?;
            // SAFETY: live stream; ended in finish() or Drop.
            check_capture("cuStreamBeginCapture", unsafe {
                sys::cuStreamBeginCapture_v2(
                    s.raw,
                    sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
                )
            })?;
            cap.open += 1;
        }
        Ok(cap)
    }

    /// Whether the driver gave up recording on any stream (work it cannot record was
    /// enqueued): an enqueue that failed then failed for the recording, not for the GPUs.
    pub(crate) fn invalidated(&self) -> bool {
        self.streams.iter().take(self.open).any(|(_, s)| {
            let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
            // SAFETY: live stream, valid out-pointer.
            let ok = unsafe { sys::cuStreamIsCapturing(s.raw, &mut status) };
            ok == sys::CUresult::CUDA_SUCCESS
                && status == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED
        })
    }

    /// Ends the recording on every stream, then instantiates each stream's graph (not
    /// before every recording has ended: the driver refuses to instantiate while the
    /// thread still records on another stream).
    pub(crate) fn finish(mut self) -> GpuResult<Vec<Graph>> {
        let open = std::mem::take(&mut self.open);
        let mut graphs = Vec::with_capacity(open);
        let mut first_err = None;
        for (gpu, s) in self.streams.iter().take(open) {
            let mut raw: sys::CUgraph = std::ptr::null_mut();
            let _ = gpu.bind();
            // SAFETY: the stream is recording (begun above); valid out-pointer. The graph
            // is owned by a Graph from here and destroyed with it.
            let ended = check_capture("cuStreamEndCapture", unsafe {
                sys::cuStreamEndCapture(s.raw, &mut raw)
            });
            graphs.push(Graph {
                graph: raw,
                exec: std::ptr::null_mut(),
            });
            if let Err(e) = ended {
                first_err.get_or_insert(e);
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        for ((gpu, _), g) in self.streams.iter().zip(&mut graphs) {
            g.instantiate(gpu)?;
        }
        Ok(graphs)
    }
}

impl Drop for Capture<'_> {
    fn drop(&mut self) {
        for (gpu, s) in self.streams.iter().take(self.open) {
            let _ = gpu.bind();
            let mut raw: sys::CUgraph = std::ptr::null_mut();
            // SAFETY: the stream is recording; a graph it returns is destroyed at once.
            unsafe {
                sys::cuStreamEndCapture(s.raw, &mut raw);
                if !raw.is_null() {
                    sys::cuGraphDestroy(raw);
                }
            }
        }
    }
}

/// One recorded and instantiated CUDA graph, launched on a stream of its GPU.
pub(crate) struct Graph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
}

// SAFETY: graphs may be launched from any thread.
unsafe impl Send for Graph {}

impl Graph {
    fn instantiate(&mut self, gpu: &Gpu) -> GpuResult<()> {
        gpu.bind()?;
        // SAFETY: a graph returned by cuStreamEndCapture; valid out-pointer; both are
        // destroyed in Drop.
        check_capture("cuGraphInstantiate", unsafe {
            sys::cuGraphInstantiateWithFlags(&mut self.exec, self.graph, 0)
        })
    }

    /// Enqueues the graph's work on `stream`.
    pub(crate) fn launch(&self, stream: &Stream) -> GpuResult<()> {
        // SAFETY: live executable graph and stream of the same GPU.
        check("cuGraphLaunch", unsafe {
            sys::cuGraphLaunch(self.exec, stream.raw)
        })
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: destroys what instantiate() made; null handles are skipped.
        unsafe {
            if !self.exec.is_null() {
                sys::cuGraphExecDestroy(self.exec);
            }
            if !self.graph.is_null() {
                sys::cuGraphDestroy(self.graph);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_refused_recording_is_not_a_fault_but_a_faulted_gpu_still_is() {
        use sys::CUresult as R;
        // The status an instantiation met while another stream still recorded.
        assert!(is_capture_refusal(R::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED));
        assert!(is_capture_refusal(R::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED));
        assert!(is_capture_refusal(R::CUDA_ERROR_NOT_SUPPORTED));
        // Errors a faulted GPU leaves on its context stay faults.
        for fault in [
            R::CUDA_ERROR_ILLEGAL_ADDRESS,
            R::CUDA_ERROR_LAUNCH_FAILED,
            R::CUDA_ERROR_ECC_UNCORRECTABLE,
            R::CUDA_ERROR_NVLINK_UNCORRECTABLE,
            R::CUDA_ERROR_OUT_OF_MEMORY,
        ] {
            assert!(!is_capture_refusal(fault), "{fault:?}");
        }
        let call = GpuError::Call {
            call: "ncclGroupEnd",
            detail: "unhandled cuda error".into(),
        };
        assert!(matches!(
            call.refused(),
            GpuError::Refused {
                call: "ncclGroupEnd",
                ..
            }
        ));
        let hung = GpuError::Timeout("all_reduce 8 bytes".into(), Duration::from_secs(1));
        assert!(matches!(hung.refused(), GpuError::Timeout(..)));
    }
}
