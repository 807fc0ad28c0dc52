//! Streams and the events that time them.

use super::device::Gpu;
use super::error::{GpuError, GpuResult, check};
use super::memory::HostBuf;
use cudarc::driver::sys;
use std::time::{Duration, Instant};

/// How long [`Stream::sync_until`] polls without sleeping before it backs off: longer than
/// any timed block of the NCCL sweep (20 iterations of a 1 GiB collective take ~0.1 s), so
/// the end of a block is seen within a poll, not a sleep of up to 0.5 ms.
pub(crate) const SPIN_WINDOW: Duration = Duration::from_secs(1);

/// A non-blocking stream on one GPU.
pub(crate) struct Stream {
    pub raw: sys::CUstream,
}

// SAFETY: streams may be used from any thread.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

impl Stream {
    pub(crate) fn new(gpu: &Gpu) -> GpuResult<Stream> {
        gpu.bind()?;
        let mut raw: sys::CUstream = std::ptr::null_mut();
        // SAFETY: valid out-pointer; destroyed in Drop.
        check("cuStreamCreate", unsafe {
            sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        Ok(Stream { raw })
    }

    pub(crate) fn wait(&self, event: &Event) -> GpuResult<()> {
        // SAFETY: both handles are live.
        check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(self.raw, event.raw, 0)
        })
    }

    /// Waits for the stream by polling, so a hung stream returns a timeout instead of
    /// blocking forever; `abort` is checked between polls. The first [`SPIN_WINDOW`] polls
    /// without sleeping, as nccl-tests' stream wait does: a host time read right after the
    /// wait then ends when the GPU work ends, not when a sleep does.
    pub(crate) fn sync_until(
        &self,
        what: &str,
        deadline: Instant,
        abort: &dyn Fn() -> bool,
    ) -> GpuResult<()> {
        let spin_until = Instant::now() + SPIN_WINDOW;
        let mut sleep = Duration::from_micros(20);
        loop {
            // SAFETY: live stream.
            let st = unsafe { sys::cuStreamQuery(self.raw) };
            if st == sys::CUresult::CUDA_SUCCESS {
                return Ok(());
            }
            if st != sys::CUresult::CUDA_ERROR_NOT_READY {
                return check("cuStreamQuery", st);
            }
            if abort() || Instant::now() >= deadline {
                return Err(GpuError::Timeout(
                    what.to_string(),
                    deadline.saturating_duration_since(Instant::now()),
                ));
            }
            if Instant::now() < spin_until {
                std::thread::yield_now();
                continue;
            }
            std::thread::sleep(sleep);
            sleep = (sleep * 2).min(Duration::from_micros(500));
        }
    }

    pub(crate) fn sync(&self) -> GpuResult<()> {
        // SAFETY: live stream.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(self.raw)
        })
    }

    pub(crate) fn memcpy_dtod(
        &self,
        dst: sys::CUdeviceptr,
        src: sys::CUdeviceptr,
        bytes: usize,
    ) -> GpuResult<()> {
        // SAFETY: callers pass addresses of live buffers of at least `bytes`.
        check("cuMemcpyDtoDAsync", unsafe {
            sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, self.raw)
        })
    }

    pub(crate) fn memcpy_htod(
        &self,
        dst: sys::CUdeviceptr,
        src: &HostBuf,
        bytes: usize,
    ) -> GpuResult<()> {
        let bytes = bytes.min(src.bytes);
        // SAFETY: src is pinned and holds at least `bytes`; dst is a live device buffer.
        check("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, src.void(), bytes, self.raw)
        })
    }

    pub(crate) fn memcpy_dtoh(
        &self,
        dst: &mut HostBuf,
        src: sys::CUdeviceptr,
        bytes: usize,
    ) -> GpuResult<()> {
        let bytes = bytes.min(dst.bytes);
        // SAFETY: dst is pinned and holds at least `bytes`.
        check("cuMemcpyDtoHAsync", unsafe {
            sys::cuMemcpyDtoHAsync_v2(dst.void(), src, bytes, self.raw)
        })
    }

    pub(crate) fn memset_d32(
        &self,
        dst: sys::CUdeviceptr,
        value: u32,
        words: usize,
    ) -> GpuResult<()> {
        // SAFETY: dst holds at least `words` 32-bit words.
        check("cuMemsetD32Async", unsafe {
            sys::cuMemsetD32Async(dst, value, words, self.raw)
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // SAFETY: destroys the stream created in new().
        unsafe { sys::cuStreamDestroy_v2(self.raw) };
    }
}

/// A timing event.
pub(crate) struct Event {
    pub raw: sys::CUevent,
}

// SAFETY: events may be used from any thread.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl Event {
    pub(crate) fn new(gpu: &Gpu) -> GpuResult<Event> {
        gpu.bind()?;
        let mut raw: sys::CUevent = std::ptr::null_mut();
        // SAFETY: valid out-pointer; destroyed in Drop.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut raw, sys::CUevent_flags::CU_EVENT_DEFAULT as u32)
        })?;
        Ok(Event { raw })
    }
    pub(crate) fn record(&self, stream: &Stream) -> GpuResult<()> {
        // SAFETY: live handles.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(self.raw, stream.raw)
        })
    }
    /// Blocks this thread until the work before the event's record is done.
    pub(crate) fn synchronize(&self) -> GpuResult<()> {
        // SAFETY: live event.
        check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(self.raw)
        })
    }
    /// Milliseconds from `self` to `end` (both recorded and complete).
    pub(crate) fn elapsed_ms(&self, end: &Event) -> GpuResult<f64> {
        let mut ms = 0f32;
        // SAFETY: live events, valid out-pointer.
        check("cuEventElapsedTime", unsafe {
            sys::cuEventElapsedTime_v2(&mut ms, self.raw, end.raw)
        })?;
        Ok(f64::from(ms))
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: destroys the event created in new().
        unsafe { sys::cuEventDestroy_v2(self.raw) };
    }
}
