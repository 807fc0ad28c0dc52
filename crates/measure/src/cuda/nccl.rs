//! NCCL in one process over several GPUs: communicators, a watchdog that aborts a hung
//! collective, and the nccl-tests style sweep (timing, algbw/busbw, validation).

use super::gpu::{DevBuf, Event, Gpu, GpuError, GpuResult, HostBuf, Stream};
use crate::stats;
use cudarc::nccl::sys as nsys;
use gpufabric_api::result::{CollectiveSweep, SweepRow};
use gpufabric_api::suite::{Collective, DataType};
use std::ffi::{CStr, c_void};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Turns an NCCL status into a result.
pub fn ncheck(call: &'static str, r: nsys::ncclResult_t) -> GpuResult<()> {
    if r == nsys::ncclResult_t::ncclSuccess {
        return Ok(());
    }
    // SAFETY: ncclGetErrorString returns a static NUL-terminated string.
    let text = unsafe {
        let p = nsys::ncclGetErrorString(r);
        if p.is_null() {
            format!("{r:?}")
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        }
    };
    Err(GpuError::Call {
        call,
        detail: format!("{text} ({r:?})"),
    })
}

/// Whether libnccl can be opened.
pub fn nccl_present() -> bool {
    // SAFETY: only opens the library.
    unsafe { nsys::is_culib_present() }
}

/// NCCL version as "2.28.3".
pub fn nccl_version() -> Option<String> {
    let mut v = 0i32;
    // SAFETY: valid out-pointer.
    let r = unsafe { nsys::ncclGetVersion(&mut v) };
    if r != nsys::ncclResult_t::ncclSuccess {
        return None;
    }
    let (major, minor, patch) = if v >= 10000 {
        (v / 10000, (v % 10000) / 100, v % 100)
    } else {
        (v / 1000, (v % 1000) / 100, v % 100)
    };
    Some(format!("{major}.{minor}.{patch}"))
}

/// One communicator per GPU of a clique, created together in this process.
pub struct Comms {
    pub raw: Vec<nsys::ncclComm_t>,
    aborted: bool,
}

// SAFETY: NCCL communicators may be used from any thread (one at a time; the watchdog only
// aborts).
unsafe impl Send for Comms {}

impl Comms {
    pub fn init(devices: &[i32]) -> GpuResult<Comms> {
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
    pub fn init_rank(id: nsys::ncclUniqueId, world: i32, rank: i32) -> GpuResult<Comms> {
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
    /// Marks the communicators as aborted by the watchdog (they must not be destroyed).
    pub fn mark_aborted(&mut self) {
        self.aborted = true;
    }
    /// The first asynchronous error any communicator reports.
    pub fn async_error(&self) -> GpuResult<()> {
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
pub fn unique_id() -> GpuResult<nsys::ncclUniqueId> {
    let mut id = nsys::ncclUniqueId { internal: [0; 128] };
    // SAFETY: valid out-pointer.
    ncheck("ncclGetUniqueId", unsafe { nsys::ncclGetUniqueId(&mut id) })?;
    Ok(id)
}

/// Brackets a group of NCCL calls.
pub fn group<F: FnOnce() -> GpuResult<()>>(f: F) -> GpuResult<()> {
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
pub struct Watchdog {
    state: Arc<(Mutex<WatchState>, Condvar)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    pub fn start() -> Watchdog {
        let state = Arc::new((Mutex::new(WatchState::default()), Condvar::new()));
        let s2 = state.clone();
        let thread = std::thread::Builder::new()
            .name("nccl-watchdog".into())
            .spawn(move || watch(s2))
            .ok();
        Watchdog { state, thread }
    }

    /// Arms the watchdog for `comms`: past `timeout` they are aborted.
    pub fn arm(&self, comms: &Comms, what: &str, timeout: Duration) {
        let (m, cv) = &*self.state;
        if let Ok(mut s) = m.lock() {
            s.deadline = Some(Instant::now() + timeout);
            s.comms = comms.raw.iter().map(|c| *c as usize).collect();
            s.what = what.to_string();
            s.fired = None;
        }
        cv.notify_all();
    }

    pub fn disarm(&self) {
        let (m, cv) = &*self.state;
        if let Ok(mut s) = m.lock() {
            s.deadline = None;
            s.comms.clear();
        }
        cv.notify_all();
    }

    /// What the watchdog aborted, if it fired since the last arm.
    pub fn fired(&self) -> Option<String> {
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
pub fn sync_all(
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
pub fn settle(e: GpuError, comms: &mut Comms, wd: &Watchdog, timeout: Duration) -> GpuError {
    wd.disarm();
    match wd.fired() {
        Some(what) => {
            comms.mark_aborted();
            GpuError::Timeout(what, timeout)
        }
        None => e,
    }
}

pub fn nccl_type(dt: DataType) -> nsys::ncclDataType_t {
    use nsys::ncclDataType_t::*;
    match dt {
        DataType::Int8 => ncclInt8,
        DataType::Uint8 => ncclUint8,
        DataType::Int32 => ncclInt32,
        DataType::Uint32 => ncclUint32,
        DataType::Int64 => ncclInt64,
        DataType::Uint64 => ncclUint64,
        DataType::Float16 => ncclFloat16,
        DataType::Float32 => ncclFloat32,
        DataType::Float64 => ncclFloat64,
        DataType::Bfloat16 => ncclBfloat16,
    }
}

/// Element counts of one sweep size: (per-rank send count, per-rank recv count, nccl-tests
/// size in bytes). `bytes` follows nccl-tests' size convention (see `stats`).
pub fn counts(c: Collective, bytes: u64, elem: u64, n: u64) -> (u64, u64, u64) {
    let total = (bytes / elem).max(1);
    match c {
        Collective::AllReduce
        | Collective::Broadcast
        | Collective::Reduce
        | Collective::SendRecv => (total, total, total * elem),
        Collective::AllGather => {
            let per = (total / n).max(1);
            (per, per * n, per * n * elem)
        }
        Collective::ReduceScatter => {
            let per = (total / n).max(1);
            (per * n, per, per * n * elem)
        }
        Collective::AllToAll => {
            let per = (total / n).max(1);
            (per * n, per * n, per * n * elem)
        }
    }
}

/// Input value of rank `r` at element `i`: small integers, exact in every data type.
pub fn input_value(r: u64, i: u64) -> i64 {
    ((i.wrapping_mul(7) + r.wrapping_mul(3) + (i >> 12)) % 8) as i64
}

/// Expected output of rank `r` at element `i` (count = per-rank recv count, `per` = the
/// chunk per peer where relevant); `None` where the output is not defined (non-root of
/// reduce).
pub fn expected_value(c: Collective, n: u64, r: u64, i: u64, per: u64) -> Option<i64> {
    expected_with(c, n, r, i, per, &rank_sums(n))
}

/// The sum over `n` ranks of [`input_value`] by the rank-independent part of the index
/// modulo 8 (`(7i + (i >> 12)) % 8`): a reduction's expected value is one table read.
pub fn rank_sums(n: u64) -> [i64; 8] {
    let mut t = [0i64; 8];
    for (k, slot) in t.iter_mut().enumerate() {
        *slot = (0..n).map(|q| ((k as u64 + q * 3) % 8) as i64).sum();
    }
    t
}

fn expected_with(c: Collective, n: u64, r: u64, i: u64, per: u64, sums: &[i64; 8]) -> Option<i64> {
    // (7i + 3q + (i >> 12)) % 8 summed over q: only (7i + (i >> 12)) % 8 varies with i, and
    // wrapping arithmetic modulo 2^64 keeps the residue modulo 8.
    let sum = |idx: u64| sums[(idx.wrapping_mul(7).wrapping_add(idx >> 12) % 8) as usize];
    match c {
        Collective::AllReduce => Some(sum(i)),
        Collective::Reduce => (r == 0).then(|| sum(i)),
        Collective::Broadcast => Some(input_value(0, i)),
        Collective::AllGather => Some(input_value(i / per, i % per)),
        Collective::ReduceScatter => Some(sum(r * per + i)),
        Collective::AllToAll => Some(input_value(i / per, r * per + i % per)),
        Collective::SendRecv => Some(input_value((r + n - 1) % n, i)),
    }
}

/// Encodes a small integer in `dt` (wrapping like the device arithmetic for integers).
pub fn encode(dt: DataType, v: i64, out: &mut [u8]) {
    match dt {
        DataType::Int8 | DataType::Uint8 => out[0] = v as u8,
        DataType::Int32 | DataType::Uint32 => out[..4].copy_from_slice(&(v as u32).to_le_bytes()),
        DataType::Int64 | DataType::Uint64 => out[..8].copy_from_slice(&(v as u64).to_le_bytes()),
        DataType::Float32 => out[..4].copy_from_slice(&(v as f32).to_le_bytes()),
        DataType::Float64 => out[..8].copy_from_slice(&(v as f64).to_le_bytes()),
        DataType::Bfloat16 => {
            let bits = ((v as f32).to_bits() >> 16) as u16;
            out[..2].copy_from_slice(&bits.to_le_bytes());
        }
        DataType::Float16 => out[..2].copy_from_slice(&f16_bits(v as f32).to_le_bytes()),
    }
}

/// IEEE half bits of a small integer-valued float (exact for |v| <= 2048).
fn f16_bits(v: f32) -> u16 {
    if v == 0.0 {
        return 0;
    }
    let bits = v.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32 - 127 + 15;
    let mant = ((bits >> 13) & 0x3ff) as u16;
    if exp <= 0 {
        return sign;
    }
    if exp >= 31 {
        return sign | 0x7c00;
    }
    sign | ((exp as u16) << 10) | mant
}

/// Fills `buf` with rank `r`'s inputs for `count` elements.
pub fn fill_inputs(dt: DataType, r: u64, count: u64, buf: &mut [u8]) {
    let e = dt.size() as usize;
    let count = (count as usize).min(buf.len() / e);
    let chunk = (count / 32).max(1 << 16);
    std::thread::scope(|s| {
        for (ci, part) in buf[..count * e].chunks_mut(chunk * e).enumerate() {
            s.spawn(move || {
                let base = (ci * chunk) as u64;
                for (j, cell) in part.chunks_exact_mut(e).enumerate() {
                    encode(dt, input_value(r, base + j as u64), cell);
                }
            });
        }
    });
}

/// Counts elements of `buf` (rank `r`'s output, `count` elements) that differ from the
/// expected values.
pub fn count_wrong(
    dt: DataType,
    c: Collective,
    n: u64,
    r: u64,
    count: u64,
    per: u64,
    buf: &[u8],
) -> u64 {
    let e = dt.size() as usize;
    let count = (count as usize).min(buf.len() / e);
    if matches!(c, Collective::Reduce) && r != 0 {
        return 0;
    }
    let threads = std::thread::available_parallelism().map_or(32, |t| t.get());
    let chunk = (count / threads.max(1)).max(1 << 16);
    let sums = rank_sums(n);
    // Every expected value is in 0..=7n: encode each once.
    let encoded: Vec<[u8; 8]> = (0..=7 * n as i64)
        .map(|v| {
            let mut b = [0u8; 8];
            encode(dt, v, &mut b);
            b
        })
        .collect();
    let encoded = &encoded;
    std::thread::scope(|s| {
        let handles: Vec<_> = buf[..count * e]
            .chunks(chunk * e)
            .enumerate()
            .map(|(ci, part)| {
                s.spawn(move || {
                    let base = (ci * chunk) as u64;
                    let mut wrong = 0u64;
                    for (j, cell) in part.chunks_exact(e).enumerate() {
                        let Some(v) = expected_with(c, n, r, base + j as u64, per, &sums) else {
                            continue;
                        };
                        match encoded.get(v as usize) {
                            Some(want) if cell == &want[..e] => {}
                            _ => wrong += 1,
                        }
                    }
                    wrong
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(u64::MAX / 64))
            .fold(0u64, u64::saturating_add)
    })
}

/// Per-rank buffers and streams of the sweep.
pub struct Rank<'g> {
    pub gpu: &'g Gpu,
    pub stream: Stream,
    pub send: DevBuf,
    pub recv: DevBuf,
    pub input: DevBuf,
    pub host: HostBuf,
    pub start: Event,
    pub end: Event,
}

/// Whether the loaded NCCL has `ncclAlltoAll` (2.28 and later): nccl-tests times that call
/// where it exists, and grouped sends and receives before it, and so does the sweep.
pub fn alltoall_call() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        let mut v = 0i32;
        // SAFETY: valid out-pointer.
        let r = unsafe { nsys::ncclGetVersion(&mut v) };
        r == nsys::ncclResult_t::ncclSuccess && v >= 22800
    })
}

/// Enqueues one collective on every rank (one NCCL group).
#[allow(clippy::too_many_arguments)]
pub fn enqueue(
    c: Collective,
    comms: &Comms,
    ranks: &[Rank],
    dt: nsys::ncclDataType_t,
    elem: u64,
    send_count: u64,
    recv_count: u64,
    in_place: bool,
) -> GpuResult<()> {
    enqueue_at(
        c, comms, ranks, dt, elem, send_count, recv_count, in_place, 0,
    )
}

/// [`enqueue`] with both buffers `shift` bytes further in (see [`Op::shift`]).
#[allow(clippy::too_many_arguments)]
fn enqueue_at(
    c: Collective,
    comms: &Comms,
    ranks: &[Rank],
    dt: nsys::ncclDataType_t,
    elem: u64,
    send_count: u64,
    recv_count: u64,
    in_place: bool,
    shift: u64,
) -> GpuResult<()> {
    let n = ranks.len() as u64;
    group(|| {
        for (r, rk) in ranks.iter().enumerate() {
            let comm = comms.raw[r];
            let st = rk.stream.raw as nsys::cudaStream_t;
            let (send, recv) = buffers(c, rk, r as u64, elem, send_count, recv_count, in_place);
            let send = (send as u64 + shift) as *const c_void;
            let recv = (recv as u64 + shift) as *mut c_void;
            let sc = send_count as usize;
            let rc = recv_count as usize;
            use nsys::ncclRedOp_t::ncclSum;
            // SAFETY: buffers hold at least send/recv counts of elements (sized for the
            // largest size of the sweep); the communicator and stream are live.
            unsafe {
                match c {
                    Collective::AllReduce => ncheck(
                        "ncclAllReduce",
                        nsys::ncclAllReduce(send, recv, sc, dt, ncclSum, comm, st),
                    )?,
                    Collective::AllGather => ncheck(
                        "ncclAllGather",
                        nsys::ncclAllGather(send, recv, sc, dt, comm, st),
                    )?,
                    Collective::ReduceScatter => ncheck(
                        "ncclReduceScatter",
                        nsys::ncclReduceScatter(send, recv, rc, dt, ncclSum, comm, st),
                    )?,
                    Collective::Broadcast => ncheck(
                        "ncclBroadcast",
                        nsys::ncclBroadcast(send, recv, sc, dt, 0, comm, st),
                    )?,
                    Collective::Reduce => ncheck(
                        "ncclReduce",
                        nsys::ncclReduce(send, recv, sc, dt, ncclSum, 0, comm, st),
                    )?,
                    Collective::AllToAll if alltoall_call() => {
                        let per = (sc as u64 / n) as usize;
                        ncheck(
                            "ncclAlltoAll",
                            nsys::ncclAlltoAll(send, recv, per, dt, comm, st),
                        )?;
                    }
                    Collective::AllToAll => {
                        let per = (sc as u64 / n) as usize;
                        for p in 0..n as usize {
                            let off = (p * per) as u64 * elem;
                            ncheck(
                                "ncclSend",
                                nsys::ncclSend(
                                    (send as u64 + off) as *const c_void,
                                    per,
                                    dt,
                                    p as i32,
                                    comm,
                                    st,
                                ),
                            )?;
                            ncheck(
                                "ncclRecv",
                                nsys::ncclRecv(
                                    (recv as u64 + off) as *mut c_void,
                                    per,
                                    dt,
                                    p as i32,
                                    comm,
                                    st,
                                ),
                            )?;
                        }
                    }
                    Collective::SendRecv => {
                        let next = ((r as u64 + 1) % n) as i32;
                        let prev = ((r as u64 + n - 1) % n) as i32;
                        ncheck("ncclSend", nsys::ncclSend(send, sc, dt, next, comm, st))?;
                        ncheck("ncclRecv", nsys::ncclRecv(recv, rc, dt, prev, comm, st))?;
                    }
                }
            }
        }
        Ok(())
    })
}

fn buffers(
    c: Collective,
    rk: &Rank,
    r: u64,
    elem: u64,
    send_count: u64,
    recv_count: u64,
    in_place: bool,
) -> (*const c_void, *mut c_void) {
    if !in_place {
        return (rk.send.ptr as *const c_void, rk.recv.void());
    }
    match c {
        // In place, nccl-tests' layout: the rank's input is its slot of the output.
        Collective::AllGather => (
            rk.recv.at((r * send_count * elem) as usize) as *const c_void,
            rk.recv.void(),
        ),
        Collective::ReduceScatter => (
            rk.recv.ptr as *const c_void,
            rk.recv.at((r * recv_count * elem) as usize) as *mut c_void,
        ),
        _ => (rk.recv.ptr as *const c_void, rk.recv.void()),
    }
}

/// Where the in-place input lives in `recv` (byte offset) for a collective.
fn in_place_input_offset(c: Collective, r: u64, elem: u64, send_count: u64) -> u64 {
    match c {
        Collective::AllGather => r * send_count * elem,
        _ => 0,
    }
}

/// Collectives whose in-place form nccl-tests does not define in a checkable way here.
pub fn has_in_place(c: Collective) -> bool {
    !matches!(c, Collective::AllToAll | Collective::SendRecv)
}

/// Settings of one sweep.
pub struct SweepSettings {
    pub sizes: Vec<u64>,
    pub warmup: u32,
    pub iters: u32,
    pub data_type: DataType,
    pub timeout: Duration,
    pub check: bool,
}

/// Times and checks one collective over all sizes.
pub fn sweep_collective(
    c: Collective,
    comms: &mut Comms,
    ranks: &mut [Rank],
    wd: &Watchdog,
    set: &SweepSettings,
    progress: &dyn Fn(&str),
) -> GpuResult<CollectiveSweep> {
    let n = ranks.len() as u64;
    let dt = set.data_type;
    let elem = dt.size();
    let ndt = nccl_type(dt);
    // NCCL connects peers lazily at the first call of each kind: do that outside timing.
    if let Some(&first) = set.sizes.first() {
        let (sc, rc, _) = counts(c, first, elem, n);
        // Armed before the enqueue too: a peer that never joins can block NCCL on the host.
        wd.arm(comms, c.nccl_tests_name(), set.timeout);
        load_inputs(c, ranks, elem, sc, false)?;
        let streams: Vec<&Stream> = ranks.iter().map(|r| &r.stream).collect();
        // Back-to-back calls for at least RAMP as well: the GPUs idled while the previous
        // collective's outputs were checked on the host, and the first sizes must not be
        // timed while their clocks come back up.
        let ramp_start = Instant::now();
        for round in 0..RAMP_ROUNDS_MAX {
            for _ in 0..5 {
                enqueue(c, comms, ranks, ndt, elem, sc, rc, false)?;
            }
            sync_all(&streams, comms, wd, c.nccl_tests_name(), set.timeout)?;
            if round > 0 && ramp_start.elapsed() >= RAMP {
                break;
            }
            wd.arm(comms, c.nccl_tests_name(), set.timeout);
        }
    }
    let started = Instant::now();
    let mut timed = Duration::ZERO;
    let max_total = set
        .sizes
        .iter()
        .map(|&size| counts(c, size, elem, n).2)
        .max()
        .unwrap_or(0);
    let mut rows: Vec<SweepRow> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for &size in &set.sizes {
        let (sc, rc, bytes) = counts(c, size, elem, n);
        if !seen.insert(bytes) {
            continue;
        }
        let what = format!("{} {} bytes", c.nccl_tests_name(), bytes);
        let mut row = SweepRow {
            bytes,
            count: match c {
                Collective::ReduceScatter => rc,
                Collective::AllToAll => sc / n,
                _ => sc,
            },
            time_us: 0.0,
            algbw: 0.0,
            busbw: 0.0,
            wrong: 0,
            in_place_time_us: 0.0,
            in_place_algbw: 0.0,
            in_place_busbw: 0.0,
            in_place_wrong: 0,
        };
        // GPU event time per iteration (out of place, in place): for the progress log only.
        let mut gpu_us = [0.0f64; 2];
        for in_place in [false, true] {
            if in_place && !has_in_place(c) {
                continue;
            }
            let op = Op {
                c,
                dt: ndt,
                elem,
                sc,
                rc,
                in_place,
                total: bytes,
                max_total,
            };
            let t0 = Instant::now();
            let timing = time_blocks(&op, comms, ranks, wd, set, &what)?;
            timed += t0.elapsed();
            let time_us = timing.host_us;
            gpu_us[usize::from(in_place)] = timing.gpu_us;
            let streams: Vec<&Stream> = ranks.iter().map(|r| &r.stream).collect();
            let mut wrong = 0;
            if set.check {
                wd.arm(comms, &what, set.timeout);
                load_inputs(c, ranks, elem, sc, in_place)?;
                enqueue(c, comms, ranks, ndt, elem, sc, rc, in_place)?;
                sync_all(&streams, comms, wd, &what, set.timeout)?;
                wrong = check_outputs(c, ranks, dt, sc, rc, in_place)?;
            }
            let algbw = stats::algbw_gbps(bytes, time_us);
            let busbw = stats::busbw_gbps(c, n as u32, bytes, time_us);
            if in_place {
                row.in_place_time_us = time_us;
                row.in_place_algbw = algbw;
                row.in_place_busbw = busbw;
                row.in_place_wrong = wrong;
            } else {
                row.time_us = time_us;
                row.algbw = algbw;
                row.busbw = busbw;
                row.wrong = wrong;
            }
        }
        progress(&format!(
            "{:>14} {:>12} {:>10.2} us {:>8.2} GB/s busbw {:>8.2} in-place {:>10.2} us wrong {} (gpu-event {:.2} / {:.2} us)",
            c.nccl_tests_name(),
            row.bytes,
            row.time_us,
            row.busbw,
            row.in_place_busbw,
            row.in_place_time_us,
            row.wrong + row.in_place_wrong,
            gpu_us[0],
            gpu_us[1],
        ));
        rows.push(row);
    }
    progress(&format!(
        "{} swept in {:.2} s, {:.2} s of it timed iterations, the rest loading and checking",
        c.nccl_tests_name(),
        started.elapsed().as_secs_f64(),
        timed.as_secs_f64()
    ));
    let points: Vec<(u64, f64)> = rows.iter().map(|r| (r.bytes, r.time_us)).collect();
    Ok(CollectiveSweep {
        collective: c,
        data_type: dt,
        ranks: n as u32,
        fit: stats::fit_sweep(c, n as u32, &points),
        rows,
    })
}

/// One collective call of the sweep: what [`enqueue`] needs besides the ranks.
struct Op {
    c: Collective,
    dt: nsys::ncclDataType_t,
    elem: u64,
    sc: u64,
    rc: u64,
    in_place: bool,
    /// Bytes one call covers (the nccl-tests size).
    total: u64,
    /// Largest such size of the sweep: the buffers hold at least this much.
    max_total: u64,
}

impl Op {
    /// Where iteration `iter` places its buffers, as nccl-tests does: consecutive
    /// iterations move by one size through the buffers sized for the largest, so a size
    /// that fits the L2 cache is not timed from it (one H200 timed 16 MiB at 7.0 µs from
    /// L2 against nccl-tests' 11.1 µs before).
    fn shift(&self, iter: u32) -> u64 {
        let steps = self.max_total.checked_div(self.total).unwrap_or(1).max(1);
        self.total * (u64::from(iter) % steps)
    }
}

/// Time per iteration of one size: host time (what nccl-tests reports) and GPU event time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timing {
    pub host_us: f64,
    pub gpu_us: f64,
}

/// How long a collective's first size runs back to back before the sweep times it.
pub const RAMP: Duration = Duration::from_millis(50);
/// Most rounds of 5 calls spent on [`RAMP`] (a call of the smallest size takes ~20 µs).
const RAMP_ROUNDS_MAX: u32 = 2000;

/// Most timed blocks of one size; short blocks are repeated (see [`blocks_wanted`]).
pub const MAX_BLOCKS: u32 = 5;
/// A block shorter than this is repeated, up to [`MAX_BLOCKS`] times.
pub const SHORT_BLOCK: Duration = Duration::from_millis(2);

/// Whether another timed block is wanted after `done` blocks, the last of which took `last`:
/// one block of n iterations is nccl-tests' measurement; blocks shorter than
/// [`SHORT_BLOCK`] (small sizes, where a single preemption of the launching thread moves
/// the mean by tens of percent) are repeated up to [`MAX_BLOCKS`] times and the median kept.
pub fn blocks_wanted(done: u32, last: Duration) -> bool {
    done < MAX_BLOCKS && last < SHORT_BLOCK
}

/// The median of `v` (the upper middle of an even count); 0 when empty.
pub fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(0.0)
}

/// Times one size as nccl-tests does: warm-up iterations, a wait for every stream, then the
/// host time around `iters` back-to-back iterations and the wait for their end, divided by
/// `iters`. Short blocks are repeated and the median block kept ([`blocks_wanted`]). GPU
/// events around each block give the GPU time per iteration beside it.
fn time_blocks(
    op: &Op,
    comms: &mut Comms,
    ranks: &[Rank],
    wd: &Watchdog,
    set: &SweepSettings,
    what: &str,
) -> GpuResult<Timing> {
    let iters = set.iters.max(1);
    let streams: Vec<&Stream> = ranks.iter().map(|r| &r.stream).collect();
    let run = |comms: &Comms, iter: u32| {
        enqueue_at(
            op.c,
            comms,
            ranks,
            op.dt,
            op.elem,
            op.sc,
            op.rc,
            op.in_place,
            op.shift(iter),
        )
    };
    wd.arm(comms, what, set.timeout);
    load_inputs(op.c, ranks, op.elem, op.sc, op.in_place)?;
    for iter in 0..set.warmup {
        run(comms, iter)?;
    }
    sync_all(&streams, comms, wd, what, set.timeout)?;
    let (mut host, mut gpu) = (Vec::new(), Vec::new());
    loop {
        wd.arm(comms, what, set.timeout);
        let t0 = Instant::now();
        for rk in ranks {
            rk.start.record(&rk.stream)?;
        }
        for iter in 0..iters {
            run(comms, iter)?;
        }
        for rk in ranks {
            rk.end.record(&rk.stream)?;
        }
        sync_all(&streams, comms, wd, what, set.timeout)?;
        let took = t0.elapsed();
        host.push(took.as_secs_f64() * 1e6 / f64::from(iters));
        let mut ms: f64 = 0.0;
        for rk in ranks {
            ms = ms.max(rk.start.elapsed_ms(&rk.end)?);
        }
        gpu.push(ms * 1000.0 / f64::from(iters));
        // The block's length by the GPU's clock where that is shorter: a host stall inside
        // the first block must not make a short size look long and stop the repeats that
        // would outvote it (one H200 timed 16 MiB at 101.6 us host against 11.1 us GPU).
        let gpu_took = Duration::from_secs_f64((ms / 1000.0).max(0.0));
        if !blocks_wanted(host.len() as u32, took.min(gpu_took)) {
            break;
        }
    }
    Ok(Timing {
        host_us: median(&host),
        gpu_us: median(&gpu),
    })
}

/// Copies each rank's inputs (kept in `input`) to where the collective reads them.
fn load_inputs(c: Collective, ranks: &[Rank], elem: u64, sc: u64, in_place: bool) -> GpuResult<()> {
    for (r, rk) in ranks.iter().enumerate() {
        let bytes = (sc * elem) as usize;
        if in_place {
            let off = in_place_input_offset(c, r as u64, elem, sc) as usize;
            rk.stream
                .memcpy_dtod(rk.recv.at(off), rk.input.ptr, bytes)?;
        } else {
            rk.stream.memcpy_dtod(rk.send.ptr, rk.input.ptr, bytes)?;
            // Poison the output so that an element nothing wrote is counted wrong.
            rk.stream
                .memset_d32(rk.recv.ptr, 0xdead_beef, rk.recv.bytes / 4)?;
        }
    }
    Ok(())
}

fn check_outputs(
    c: Collective,
    ranks: &mut [Rank],
    dt: DataType,
    sc: u64,
    rc: u64,
    in_place: bool,
) -> GpuResult<u64> {
    let n = ranks.len() as u64;
    let elem = dt.size();
    let per = match c {
        Collective::AllGather => sc,
        Collective::ReduceScatter => rc,
        Collective::AllToAll => sc / n,
        _ => rc,
    };
    for (r, rk) in ranks.iter_mut().enumerate() {
        let off = if in_place && matches!(c, Collective::ReduceScatter) {
            r as u64 * rc * elem
        } else {
            0
        };
        let src = rk.recv.at(off as usize);
        rk.stream
            .memcpy_dtoh(&mut rk.host, src, (rc * elem) as usize)?;
    }
    let mut wrong = 0u64;
    for (r, rk) in ranks.iter().enumerate() {
        rk.stream.sync()?;
        wrong += count_wrong(dt, c, n, r as u64, rc, per, rk.host.as_slice());
    }
    Ok(wrong)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn simulate(c: Collective, n: u64, count_bytes: u64) -> Vec<Vec<i64>> {
        // A host model of each collective on the same inputs, to check expected_value.
        let (sc, rc, _) = counts(c, count_bytes, 4, n);
        let inputs: Vec<Vec<i64>> = (0..n)
            .map(|r| (0..sc).map(|i| input_value(r, i)).collect())
            .collect();
        (0..n)
            .map(|r| match c {
                Collective::AllReduce | Collective::Reduce => (0..rc)
                    .map(|i| inputs.iter().map(|v| v[i as usize]).sum())
                    .collect(),
                Collective::Broadcast => inputs[0].clone(),
                Collective::AllGather => inputs.iter().flatten().copied().collect(),
                Collective::ReduceScatter => (0..rc)
                    .map(|i| inputs.iter().map(|v| v[(r * rc + i) as usize]).sum())
                    .collect(),
                Collective::AllToAll => {
                    let per = sc / n;
                    (0..n)
                        .flat_map(|p| {
                            let src = &inputs[p as usize];
                            (0..per).map(move |k| src[(r * per + k) as usize])
                        })
                        .collect()
                }
                Collective::SendRecv => inputs[((r + n - 1) % n) as usize].clone(),
            })
            .collect()
    }

    #[test]
    fn expected_values_match_a_host_model_of_every_collective() {
        for c in Collective::ALL {
            for n in [1u64, 2, 3, 4, 8] {
                let out = simulate(c, n, 4 * 1000);
                let (sc, rc, _) = counts(c, 4 * 1000, 4, n);
                let per = match c {
                    Collective::AllGather => sc,
                    Collective::ReduceScatter => rc,
                    Collective::AllToAll => sc / n,
                    _ => rc,
                };
                for r in 0..n {
                    for i in 0..rc {
                        if let Some(v) = expected_value(c, n, r, i, per) {
                            assert_eq!(v, out[r as usize][i as usize], "{c:?} n={n} r={r} i={i}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_rank_sum_table_matches_summing_every_rank() {
        for n in [1u64, 2, 4, 8, 72] {
            let sums = rank_sums(n);
            for i in (0..100_000u64).chain([1 << 40, (1 << 12) - 1, (1 << 45) + 4097]) {
                let direct: i64 = (0..n).map(|q| input_value(q, i)).sum();
                let key = (i.wrapping_mul(7).wrapping_add(i >> 12) % 8) as usize;
                assert_eq!(sums[key], direct, "n={n} i={i}");
            }
        }
    }

    #[test]
    fn wrong_elements_are_counted_in_every_data_type() {
        use DataType::*;
        for dt in [
            Int8, Uint8, Int32, Uint32, Int64, Uint64, Float16, Float32, Float64, Bfloat16,
        ] {
            let n = 4;
            let count = 200_000u64;
            let e = dt.size() as usize;
            let mut buf = vec![0u8; count as usize * e];
            for i in 0..count {
                let v = expected_value(Collective::AllReduce, n, 0, i, count).unwrap_or(0);
                encode(dt, v, &mut buf[i as usize * e..]);
            }
            assert_eq!(
                count_wrong(dt, Collective::AllReduce, n, 0, count, count, &buf),
                0,
                "{dt:?}"
            );
            buf[5 * e] ^= 0x40;
            buf[(count as usize - 1) * e] ^= 0x01;
            assert_eq!(
                count_wrong(dt, Collective::AllReduce, n, 0, count, count, &buf),
                2,
                "{dt:?}"
            );
        }
    }

    #[test]
    fn counts_follow_nccl_tests_size_convention() {
        // all_gather: the size is the gathered output.
        assert_eq!(
            counts(Collective::AllGather, 1 << 20, 4, 4),
            (1 << 16, 1 << 18, 1 << 20)
        );
        // reduce_scatter: the size is the input.
        assert_eq!(
            counts(Collective::ReduceScatter, 1 << 20, 4, 4),
            (1 << 18, 1 << 16, 1 << 20)
        );
        assert_eq!(counts(Collective::AllReduce, 8, 4, 4), (2, 2, 8));
        // Too small to split: at least one element per rank.
        assert_eq!(counts(Collective::AllGather, 8, 4, 4), (1, 4, 16));
    }

    #[test]
    fn a_collective_missing_a_rank_times_out_and_is_aborted_by_the_watchdog() {
        let gpus = match super::super::open_gpus() {
            Ok(g) if g.len() >= 2 => g,
            Ok(_) => return eprintln!("skipped: needs 2 GPUs"),
            Err(e) => return eprintln!("skipped: no GPU ({e})"),
        };
        if !nccl_present() {
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

    #[test]
    fn short_blocks_are_repeated_and_long_ones_are_not() {
        // A 20-iteration block of 8 B (~0.4 ms) is repeated up to MAX_BLOCKS times.
        assert!(blocks_wanted(1, Duration::from_micros(400)));
        assert!(blocks_wanted(MAX_BLOCKS - 1, Duration::from_micros(400)));
        assert!(!blocks_wanted(MAX_BLOCKS, Duration::from_micros(400)));
        // A block of 1 GiB (~90 ms) is nccl-tests' single measurement.
        assert!(!blocks_wanted(1, Duration::from_millis(90)));
        assert!(!blocks_wanted(1, SHORT_BLOCK));
    }

    #[test]
    fn iterations_move_through_the_buffers_like_nccl_tests() {
        let op = |total, max_total| Op {
            c: Collective::AllReduce,
            dt: nsys::ncclDataType_t::ncclFloat32,
            elem: 4,
            sc: total / 4,
            rc: total / 4,
            in_place: false,
            total,
            max_total,
        };
        // 16 MiB in buffers for 1 GiB: 64 places, one size apart.
        let o = op(16 << 20, 1 << 30);
        assert_eq!(o.shift(0), 0);
        assert_eq!(o.shift(1), 16 << 20);
        assert_eq!(o.shift(19), 19 * (16 << 20));
        assert_eq!(o.shift(64), 0);
        // The largest size never moves; the last place still fits the buffers.
        assert_eq!(op(1 << 30, 1 << 30).shift(7), 0);
        let o = op(3 << 20, 10 << 20);
        assert!((0..100).all(|i| o.shift(i) + o.total <= o.max_total));
        assert_eq!(op(0, 1 << 30).shift(5), 0);
    }

    #[test]
    fn the_median_block_ignores_one_preempted_block() {
        assert_eq!(median(&[20.1, 19.9, 61.0, 20.0, 20.2]), 20.1);
        assert_eq!(median(&[20.0]), 20.0);
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[f64::NAN, 3.0]), 3.0);
    }

    #[test]
    fn half_encoding_of_small_integers_is_exact() {
        assert_eq!(f16_bits(1.0), 0x3c00);
        assert_eq!(f16_bits(2.0), 0x4000);
        assert_eq!(f16_bits(7.0), 0x4700);
        assert_eq!(f16_bits(-3.0), 0xc200);
        assert_eq!(f16_bits(0.0), 0);
    }
}
