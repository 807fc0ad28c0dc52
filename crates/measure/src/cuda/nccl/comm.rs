//! NCCL communicators of a clique and the watchdog that aborts them when a collective hangs.

use super::ncheck;
use crate::cuda::gpu::{GpuError, GpuResult, Stream};
use cudarc::nccl::sys as nsys;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// One communicator per GPU of a clique, created together in this process.
pub(crate) struct Comms {
    pub raw: Vec<nsys::ncclComm_t>,
    aborted: bool,
}

// SAFETY: NCCL communicators may be used from any thread (one at a time; the watchdog only
// aborts).
unsafe impl Send for Comms {}

impl Comms {
    pub(crate) fn init(devices: &[i32]) -> GpuResult<Comms> {
        let mut raw = vec![std::ptr::null_mut(); devices.len()];
        // SAFETY: raw has one slot per device.
        ncheck("ncclCommInitAll", unsafe {
            nsys::ncclCommInitAll(raw.as_mut_ptr(), devices.len() as i32, devices.as_ptr())
        })?;
        Ok(Comms {
            raw,
            aborted: false,
        })
    }
    /// This process's rank of a clique spread over processes, joined through `id` (made by
    /// [`unique_id`] in one process and handed to the others); the rank's GPU must be
    /// current on the calling thread.
    pub(crate) fn init_rank(id: nsys::ncclUniqueId, world: i32, rank: i32) -> GpuResult<Comms> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the id comes from ncclGetUniqueId.
        ncheck("ncclCommInitRank", unsafe {
            nsys::ncclCommInitRank(&mut raw, world, id, rank)
        })?;
        Ok(Comms {
            raw: vec![raw],
            aborted: false,
        })
    }
    /// Communicators created by the caller (one per local GPU of a clique spread over
    /// processes); they are destroyed on drop as these are.
    pub(crate) fn from_raw(raw: Vec<nsys::ncclComm_t>) -> Comms {
        Comms {
            raw,
            aborted: false,
        }
    }
    /// Marks the communicators as aborted by the watchdog (they must not be destroyed).
    pub(crate) fn mark_aborted(&mut self) {
        self.aborted = true;
    }
    /// The first asynchronous error any communicator reports.
    pub(crate) fn async_error(&self) -> GpuResult<()> {
        for c in &self.raw {
            let mut e = nsys::ncclResult_t::ncclSuccess;
            // SAFETY: live communicator, valid out-pointer.
            ncheck("ncclCommGetAsyncError", unsafe {
                nsys::ncclCommGetAsyncError(*c, &mut e)
            })?;
            ncheck("NCCL asynchronous error", e)?;
        }
        Ok(())
    }
}

impl Drop for Comms {
    fn drop(&mut self) {
        if self.aborted {
            return;
        }
        for c in &self.raw {
            // SAFETY: destroys a communicator created in init().
            unsafe { nsys::ncclCommDestroy(*c) };
        }
    }
}

/// A new NCCL unique id: the rendezvous of a clique spread over processes.
pub(crate) fn unique_id() -> GpuResult<nsys::ncclUniqueId> {
    let mut id = nsys::ncclUniqueId { internal: [0; 128] };
    // SAFETY: valid out-pointer.
    ncheck("ncclGetUniqueId", unsafe { nsys::ncclGetUniqueId(&mut id) })?;
    Ok(id)
}

/// Brackets a group of NCCL calls.
pub(crate) fn group<F: FnOnce() -> GpuResult<()>>(f: F) -> GpuResult<()> {
    // SAFETY: ncclGroupStart/End bracket the calls made by f.
    ncheck("ncclGroupStart", unsafe { nsys::ncclGroupStart() })?;
    let inner = f();
    // SAFETY: closes the group opened above.
    let end = ncheck("ncclGroupEnd", unsafe { nsys::ncclGroupEnd() });
    inner.and(end)
}

#[derive(Default)]
struct WatchState {
    deadline: Option<Instant>,
    comms: Vec<usize>,
    what: String,
    fired: Option<String>,
    stop: bool,
}

/// A thread that aborts the armed communicators when their deadline passes.
pub(crate) struct Watchdog {
    state: Arc<(Mutex<WatchState>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    pub(crate) fn start() -> Watchdog {
        let state = Arc::new((Mutex::new(WatchState::default()), Condvar::new()));
        let s2 = state.clone();
        let thread = std::thread::Builder::new()
            .name("nccl-watchdog".into())
            .spawn(move || watch(s2))
            .ok();
        Watchdog { state, thread }
    }

    /// Arms the watchdog for `comms`: past `timeout` they are aborted.
    pub(crate) fn arm(&self, comms: &Comms, what: &str, timeout: Duration) {
        let (m, cv) = &*self.state;
        if let Ok(mut s) = m.lock() {
            s.deadline = Some(Instant::now() + timeout);
            s.comms = comms.raw.iter().map(|c| *c as usize).collect();
            s.what = what.to_string();
            s.fired = None;
        }
        cv.notify_all();
    }

    pub(crate) fn disarm(&self) {
        let (m, cv) = &*self.state;
        if let Ok(mut s) = m.lock() {
            s.deadline = None;
            s.comms.clear();
        }
        cv.notify_all();
    }

    /// What the watchdog aborted, if it fired since the last arm.
    pub(crate) fn fired(&self) -> Option<String> {
        self.state.0.lock().ok().and_then(|s| s.fired.clone())
    }
}

fn watch(state: Arc<(Mutex<WatchState>, Condvar)>) {
    let (m, cv) = &*state;
    let Ok(mut s) = m.lock() else { return };
    loop {
        if s.stop {
            return;
        }
        match s.deadline {
            None => {
                s = match cv.wait(s) {
                    Ok(g) => g,
                    Err(_) => return,
                };
            }
            Some(d) => {
                let now = Instant::now();
                if now >= d {
                    for c in &s.comms {
                        // SAFETY: the armed communicators are live until disarm; abort
                        // is the documented way to stop a hung collective from another
                        // thread.
                        unsafe { nsys::ncclCommAbort(*c as nsys::ncclComm_t) };
                    }
                    tracing::warn!(what = %s.what, "watchdog aborted NCCL communicators");
                    s.fired = Some(s.what.clone());
                    s.deadline = None;
                    s.comms.clear();
                } else {
                    s = match cv.wait_timeout(s, d - now) {
                        Ok((g, _)) => g,
                        Err(_) => return,
                    };
                }
            }
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        {
            let (m, cv) = &*self.state;
            if let Ok(mut s) = m.lock() {
                s.stop = true;
            }
            cv.notify_all();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Waits for all `streams` under the watchdog; a timeout aborts `comms`.
pub(crate) fn sync_all(
    streams: &[&Stream],
    comms: &mut Comms,
    wd: &Watchdog,
    what: &str,
    timeout: Duration,
) -> GpuResult<()> {
    wd.arm(comms, what, timeout);
    let deadline = Instant::now() + timeout + Duration::from_secs(1);
    let mut result = Ok(());
    for s in streams {
        result = s.sync_until(what, deadline, &|| wd.fired().is_some());
        if result.is_err() {
            break;
        }
    }
    wd.disarm();
    if let Some(w) = wd.fired() {
        comms.mark_aborted();
        return Err(GpuError::Timeout(w, timeout));
    }
    if let Err(GpuError::Timeout(w, _)) = &result {
        // The stream did not finish although the watchdog did not fire (race at the edge):
        // abort now so that nothing is left running.
        for c in &comms.raw {
            // SAFETY: live communicators.
            unsafe { nsys::ncclCommAbort(*c) };
        }
        comms.mark_aborted();
        return Err(GpuError::Timeout(w.clone(), timeout));
    }
    result?;
    comms.async_error()
}

/// After a failed NCCL or CUDA call: if the watchdog fired, the communicators are aborted
/// (never to be destroyed) and the failure is the watchdog's timeout.
pub(crate) fn settle(e: GpuError, comms: &mut Comms, wd: &Watchdog, timeout: Duration) -> GpuError {
    wd.disarm();
    match wd.fired() {
        Some(what) => {
            comms.mark_aborted();
            GpuError::Timeout(what, timeout)
        }
        None => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::gpu::DevBuf;
    use std::ffi::c_void;

    #[test]
    fn a_collective_missing_a_rank_times_out_and_is_aborted_by_the_watchdog() {
        let gpus = match crate::cuda::open_gpus() {
            Ok(g) if g.len() >= 2 => g,
            Ok(_) => return eprintln!("skipped: needs 2 GPUs"),
            Err(e) => return eprintln!("skipped: no GPU ({e})"),
        };
        if !super::super::nccl_present() {
            return eprintln!("skipped: no libnccl");
        }
        let devs: Vec<i32> = gpus.iter().map(|g| g.index as i32).collect();
        let mut comms = Comms::init(&devs).expect("communicators");
        let streams: Vec<Stream> = gpus
            .iter()
            .map(|g| Stream::new(g).expect("stream"))
            .collect();
        let bufs: Vec<DevBuf> = gpus
            .iter()
            .map(|g| DevBuf::new(g, 4096).expect("buffer"))
            .collect();
        let reduce = |r: usize| {
            // SAFETY: live buffer, communicator and stream of rank r.
            ncheck("ncclAllReduce", unsafe {
                nsys::ncclAllReduce(
                    bufs[r].ptr as *const c_void,
                    bufs[r].void(),
                    1024,
                    nsys::ncclDataType_t::ncclFloat32,
                    nsys::ncclRedOp_t::ncclSum,
                    comms.raw[r],
                    streams[r].raw as nsys::cudaStream_t,
                )
            })
        };
        // All ranks once, so that NCCL has connected the peers.
        group(|| (0..gpus.len()).try_for_each(reduce)).expect("all ranks");
        for s in &streams {
            s.sync().expect("connected");
        }
        let wd = Watchdog::start();
        wd.arm(&comms, "lonely all_reduce", Duration::from_secs(2));
        // Rank 0 alone: its all-reduce waits on the GPU for peers that never join.
        let enqueued = reduce(0);
        let started = Instant::now();
        let out = match enqueued.map_err(|e| settle(e, &mut comms, &wd, Duration::from_secs(2))) {
            Ok(()) => sync_all(
                &[&streams[0]],
                &mut comms,
                &wd,
                "lonely all_reduce",
                Duration::from_secs(2),
            ),
            Err(e) => Err(e),
        };
        assert!(matches!(out, Err(GpuError::Timeout(..))), "{out:?}");
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the watchdog stopped the wait"
        );
        assert!(wd.fired().is_some());
    }
}
