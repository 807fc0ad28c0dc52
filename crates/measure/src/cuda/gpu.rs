//! Thin, owned wrappers over the CUDA driver API (contexts, memory, streams, events) with
//! errors as values; everything the measurements need and nothing more.

use cudarc::driver::sys;
use std::ffi::{CStr, c_void};
use std::time::{Duration, Instant};

/// A failed CUDA, NCCL or cuBLAS call, or a wait that ran past its deadline.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("{call} failed: {detail}")]
    Call { call: &'static str, detail: String },
    #[error("{0} did not finish within {1:?}")]
    Timeout(String, Duration),
    /// A call this node's driver or libraries refuse for a feature the settings asked for
    /// (CUDA graph capture), not a fault of its GPUs or links: the phase cannot run here.
    #[error("{call} was refused: {detail}")]
    Refused { call: &'static str, detail: String },
    /// An allocation failed with the GPU's memory nearly all taken (by other work, or a
    /// suite larger than the GPU): no fault of its hardware, the phase cannot run here.
    #[error("{call} failed: {detail}")]
    MemoryFull { call: &'static str, detail: String },
    /// An allocation the suite made too large for the GPU (more than it has, or than it
    /// has free with most of it free): the test's fault, never the GPU's.
    #[error("{call} failed: {detail}")]
    SuiteTooLarge { call: &'static str, detail: String },
    /// A call NCCL refused as invalid usage or an invalid argument: its settings (an
    /// `NCCL_*` variable of the test's agent env, the suite) are wrong, not the node.
    #[error("{call} was refused: {detail}")]
    Misconfigured { call: &'static str, detail: String },
}

impl GpuError {
    /// The same failure, as a refusal of the feature rather than a fault ([`GpuError::Refused`]).
    pub fn refused(self) -> GpuError {
        match self {
            GpuError::Call { call, detail } => GpuError::Refused { call, detail },
            other => other,
        }
    }
}

pub type GpuResult<T> = Result<T, GpuError>;

/// The result of a scoped thread that drives a GPU; a panic there is the `call`'s error,
/// never the process's end.
pub fn joined<T>(
    h: std::thread::ScopedJoinHandle<'_, GpuResult<T>>,
    call: &'static str,
) -> GpuResult<T> {
    h.join().unwrap_or_else(|_| {
        Err(GpuError::Call {
            call,
            detail: "its thread panicked".into(),
        })
    })
}

/// Turns a driver status into a result.
pub fn check(call: &'static str, status: sys::CUresult) -> GpuResult<()> {
    check_alloc(call, status, None)
}

/// [`check`] for an allocation of `requested` bytes of device memory: a failure to find
/// them is judged by [`out_of_memory`].
pub fn check_alloc(
    call: &'static str,
    status: sys::CUresult,
    requested: Option<u64>,
) -> GpuResult<()> {
    if status == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut text: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorString writes a pointer to a static string or leaves it null.
    unsafe { sys::cuGetErrorString(status, &mut text) };
    let detail = if text.is_null() {
        format!("{status:?}")
    } else {
        // SAFETY: non-null results of cuGetErrorString are NUL-terminated static strings.
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    };
    if status == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        let mut free = 0usize;
        let mut total = 0usize;
        // SAFETY: valid out-pointers; fails harmlessly without a current context.
        let st = unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) };
        if st == sys::CUresult::CUDA_SUCCESS {
            return Err(out_of_memory(
                call,
                detail,
                requested,
                free as u64,
                total as u64,
            ));
        }
    }
    Err(GpuError::Call { call, detail })
}

/// Below this share of its memory free, a GPU whose allocation failed is full, not faulty.
const FULL_BELOW: f64 = 0.10;

/// An allocation of `requested` bytes (when known) that failed with `free` of `total`
/// bytes of the GPU free, judged in order:
/// 1. more than the GPU has: the suite is larger than the GPU ([`GpuError::SuiteTooLarge`]);
/// 2. less than [`FULL_BELOW`] free: the memory is taken ([`GpuError::MemoryFull`]);
/// 3. more than is free, with most of it free: the suite's buffers together are larger than
///    the GPU holds ([`GpuError::SuiteTooLarge`]);
/// 4. otherwise, the failure is the GPU's ([`GpuError::Call`]).
///
/// Every message says how much was asked for and how much was free.
pub fn out_of_memory(
    call: &'static str,
    detail: String,
    requested: Option<u64>,
    free: u64,
    total: u64,
) -> GpuError {
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    let asked = requested
        .map(|r| format!(" asking for {:.1} GiB", gib(r)))
        .unwrap_or_default();
    let detail = format!(
        "{detail}{asked} with {:.1} GiB of {:.1} GiB free",
        gib(free),
        gib(total)
    );
    let too_large = |detail: String, what: &str| GpuError::SuiteTooLarge {
        call,
        detail: format!(
            "{detail}: {what}; the FabricTest's suite is wrong, not the GPU, which was not measured on it"
        ),
    };
    match requested {
        Some(r) if r > total => too_large(detail, "the suite asks for more than the GPU's memory"),
        _ if (free as f64) < FULL_BELOW * total as f64 => GpuError::MemoryFull {
            call,
            detail: format!(
                "{detail}: the GPU's memory is taken (by other work on it, or a suite larger than the GPU), which is not a fault of the GPU"
            ),
        },
        Some(r) if r > free => too_large(
            detail,
            "the suite's buffers together are larger than the GPU holds",
        ),
        _ => GpuError::Call { call, detail },
    }
}

/// Pinned host memory of `requested` bytes that could not be had: the host's or the pod's
/// memory, which is never a fault of the GPU.
pub fn host_out_of_memory(call: &'static str, requested: u64) -> GpuError {
    GpuError::MemoryFull {
        call,
        detail: format!(
            "could not pin {:.1} GiB of host memory: the node's or the pod's memory cannot hold the suite's host buffers (one per GPU, of the largest size), which is not a fault of the GPU; lower the suite's sizes or raise agent.resources memory",
            requested as f64 / f64::from(1u32 << 30)
        ),
    }
}

/// Whether the driver library can be opened at all.
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the shared library.
    unsafe { sys::is_culib_present() }
}

/// Initialises the driver and counts devices.
pub fn init_and_count() -> GpuResult<u32> {
    // SAFETY: plain driver calls with valid out-pointers.
    unsafe {
        check("cuInit", sys::cuInit(0))?;
        let mut n = 0i32;
        check("cuDeviceGetCount", sys::cuDeviceGetCount(&mut n))?;
        Ok(n.max(0) as u32)
    }
}

/// Driver version as "13.0".
pub fn driver_cuda_version() -> Option<String> {
    let mut v = 0i32;
    // SAFETY: valid out-pointer.
    let ok = unsafe { sys::cuDriverGetVersion(&mut v) } == sys::CUresult::CUDA_SUCCESS;
    ok.then(|| format!("{}.{}", v / 1000, (v % 1000) / 10))
}

/// The PCI bus id of device `index` (after [`init_and_count`]), read without creating a
/// context on it.
pub fn device_bus_id(index: u32) -> Option<String> {
    let mut dev: sys::CUdevice = 0;
    // SAFETY: valid out-pointer.
    let st = unsafe { sys::cuDeviceGet(&mut dev, index as i32) };
    (st == sys::CUresult::CUDA_SUCCESS)
        .then(|| bus_id_of(dev))
        .flatten()
}

fn bus_id_of(dev: sys::CUdevice) -> Option<String> {
    let mut buf = [0 as std::ffi::c_char; 64];
    // SAFETY: the buffer is 64 bytes as declared.
    let st = unsafe { sys::cuDeviceGetPCIBusId(buf.as_mut_ptr(), 64, dev) };
    if st != sys::CUresult::CUDA_SUCCESS {
        return None;
    }
    // SAFETY: NUL-terminated by the driver.
    Some(
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// One device with its primary context.
pub struct Gpu {
    pub index: u32,
    pub dev: sys::CUdevice,
    pub ctx: sys::CUcontext,
}

// SAFETY: CUDA contexts may be made current on any thread.
unsafe impl Send for Gpu {}
// SAFETY: all uses go through driver calls, which are thread safe.
unsafe impl Sync for Gpu {}

impl Gpu {
    pub fn open(index: u32) -> GpuResult<Gpu> {
        let mut dev: sys::CUdevice = 0;
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointers; the primary context is released in Drop.
        unsafe {
            check("cuDeviceGet", sys::cuDeviceGet(&mut dev, index as i32))?;
            check(
                "cuDevicePrimaryCtxRetain",
                sys::cuDevicePrimaryCtxRetain(&mut ctx, dev),
            )?;
        }
        let gpu = Gpu { index, dev, ctx };
        gpu.bind()?;
        Ok(gpu)
    }

    /// Makes this GPU's context current on the calling thread.
    pub fn bind(&self) -> GpuResult<()> {
        // SAFETY: ctx is a retained primary context.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(self.ctx) })
    }

    pub fn name(&self) -> String {
        let mut buf = [0 as std::ffi::c_char; 256];
        // SAFETY: the buffer is 256 bytes as declared.
        let st = unsafe { sys::cuDeviceGetName(buf.as_mut_ptr(), 256, self.dev) };
        if st != sys::CUresult::CUDA_SUCCESS {
            return "unknown".into();
        }
        // SAFETY: cuDeviceGetName writes a NUL-terminated string into the buffer.
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    pub fn pci_bus_id(&self) -> Option<String> {
        bus_id_of(self.dev)
    }

    /// Compute capability (major, minor), if the driver says.
    pub fn compute_capability(&self) -> Option<(i32, i32)> {
        let attr = |a: sys::CUdevice_attribute| {
            let mut v = 0i32;
            // SAFETY: valid out-pointer and device.
            let st = unsafe { sys::cuDeviceGetAttribute(&mut v, a, self.dev) };
            (st == sys::CUresult::CUDA_SUCCESS).then_some(v)
        };
        Some((
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        ))
    }

    pub fn total_mem(&self) -> u64 {
        let mut bytes = 0usize;
        // SAFETY: valid out-pointer.
        unsafe { sys::cuDeviceTotalMem_v2(&mut bytes, self.dev) };
        bytes as u64
    }

    /// Enables peer access from this GPU's context to `peer`'s memory (idempotent).
    pub fn enable_peer(&self, peer: &Gpu) -> GpuResult<()> {
        let mut can = 0i32;
        // SAFETY: valid devices and out-pointer.
        unsafe {
            check(
                "cuDeviceCanAccessPeer",
                sys::cuDeviceCanAccessPeer(&mut can, self.dev, peer.dev),
            )?;
        }
        if can == 0 {
            return Err(GpuError::Call {
                call: "cuDeviceCanAccessPeer",
                detail: format!("GPU {} cannot access GPU {}", self.index, peer.index),
            });
        }
        self.bind()?;
        // SAFETY: peer.ctx is a retained context.
        let st = unsafe { sys::cuCtxEnablePeerAccess(peer.ctx, 0) };
        if st == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        check("cuCtxEnablePeerAccess", st)
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // SAFETY: releases the reference taken in open().
        unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.dev) };
    }
}

/// Device memory, freed on drop.
pub struct DevBuf {
    pub ptr: sys::CUdeviceptr,
    pub bytes: usize,
    ctx: sys::CUcontext,
    /// What gives the memory back (the allocator that made it), run in `ctx`.
    free: unsafe fn(sys::CUdeviceptr),
}

// SAFETY: a device pointer is a plain address usable from any thread.
unsafe impl Send for DevBuf {}
// SAFETY: as above; the buffer's contents are only touched by device work.
unsafe impl Sync for DevBuf {}

impl DevBuf {
    pub fn new(gpu: &Gpu, bytes: usize) -> GpuResult<DevBuf> {
        gpu.bind()?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: valid out-pointer; freed in Drop.
        let status = unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes.max(1)) };
        check_alloc("cuMemAlloc", status, Some(bytes as u64))?;
        Ok(DevBuf {
            ptr,
            bytes,
            ctx: gpu.ctx,
            free: cu_mem_free,
        })
    }

    /// Takes ownership of `bytes` at `ptr`, allocated on `gpu` by an allocator other than
    /// `cuMemAlloc`; `free` gives it back (called with `gpu`'s context current).
    ///
    /// # Safety
    /// `ptr` must be a live allocation of at least `bytes` on `gpu` that `free` releases,
    /// owned by nothing else.
    pub unsafe fn adopt(
        gpu: &Gpu,
        ptr: sys::CUdeviceptr,
        bytes: usize,
        free: unsafe fn(sys::CUdeviceptr),
    ) -> DevBuf {
        DevBuf {
            ptr,
            bytes,
            ctx: gpu.ctx,
            free,
        }
    }

    pub fn void(&self) -> *mut c_void {
        self.ptr as *mut c_void
    }

    /// Address `offset` bytes into the buffer.
    pub fn at(&self, offset: usize) -> sys::CUdeviceptr {
        self.ptr + offset as u64
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        // SAFETY: frees memory allocated in new(); the context is retained by a Gpu that
        // outlives the buffer in every caller.
        unsafe {
            sys::cuCtxSetCurrent(self.ctx);
            (self.free)(self.ptr);
        }
    }
}

/// # Safety
/// `ptr` came from `cuMemAlloc` in the current context and is freed once.
unsafe fn cu_mem_free(ptr: sys::CUdeviceptr) {
    // SAFETY: see the function's contract.
    unsafe { sys::cuMemFree_v2(ptr) };
}

/// Page-locked host memory, freed on drop.
pub struct HostBuf {
    ptr: *mut u8,
    pub bytes: usize,
}

// SAFETY: plain host memory owned by this value.
unsafe impl Send for HostBuf {}
// SAFETY: shared access is read-only through as_slice.
unsafe impl Sync for HostBuf {}

impl HostBuf {
    pub fn new(gpu: &Gpu, bytes: usize) -> GpuResult<HostBuf> {
        gpu.bind()?;
        let mut ptr: *mut c_void = std::ptr::null_mut();
        // SAFETY: portable pinned allocation, freed in Drop.
        let status =
            unsafe { sys::cuMemHostAlloc(&mut ptr, bytes.max(1), sys::CU_MEMHOSTALLOC_PORTABLE) };
        if status == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            return Err(host_out_of_memory("cuMemHostAlloc", bytes as u64));
        }
        check("cuMemHostAlloc", status)?;
        Ok(HostBuf {
            ptr: ptr as *mut u8,
            bytes,
        })
    }
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr points to `bytes` bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.bytes) }
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.bytes) }
    }
    pub fn void(&self) -> *mut c_void {
        self.ptr as *mut c_void
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        // SAFETY: frees the allocation made in new().
        unsafe { sys::cuMemFreeHost(self.ptr as *mut c_void) };
    }
}

/// How long [`Stream::sync_until`] polls without sleeping before it backs off: longer than
/// any timed block of the NCCL sweep (20 iterations of a 1 GiB collective take ~0.1 s), so
/// the end of a block is seen within a poll, not a sleep of up to 0.5 ms.
pub const SPIN_WINDOW: Duration = Duration::from_secs(1);

/// A non-blocking stream on one GPU.
pub struct Stream {
    pub raw: sys::CUstream,
}

// SAFETY: streams may be used from any thread.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

impl Stream {
    pub fn new(gpu: &Gpu) -> GpuResult<Stream> {
        gpu.bind()?;
        let mut raw: sys::CUstream = std::ptr::null_mut();
        // SAFETY: valid out-pointer; destroyed in Drop.
        check("cuStreamCreate", unsafe {
            sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        Ok(Stream { raw })
    }

    /// A non-blocking stream at the highest priority the device offers (its kernels get
    /// SMs ahead of those of normal streams).
    pub fn high_priority(gpu: &Gpu) -> GpuResult<Stream> {
        gpu.bind()?;
        let (mut least, mut greatest) = (0i32, 0i32);
        // SAFETY: valid out-pointers; a context is current.
        check("cuCtxGetStreamPriorityRange", unsafe {
            sys::cuCtxGetStreamPriorityRange(&mut least, &mut greatest)
        })?;
        let mut raw: sys::CUstream = std::ptr::null_mut();
        // SAFETY: valid out-pointer; destroyed in Drop.
        check("cuStreamCreateWithPriority", unsafe {
            sys::cuStreamCreateWithPriority(
                &mut raw,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                greatest,
            )
        })?;
        Ok(Stream { raw })
    }

    pub fn wait(&self, event: &Event) -> GpuResult<()> {
        // SAFETY: both handles are live.
        check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(self.raw, event.raw, 0)
        })
    }

    /// Waits for the stream by polling, so a hung stream returns a timeout instead of
    /// blocking forever; `abort` is checked between polls. The first [`SPIN_WINDOW`] polls
    /// without sleeping, as nccl-tests' stream wait does: a host time read right after the
    /// wait then ends when the GPU work ends, not when a sleep does.
    pub fn sync_until(
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

    pub fn sync(&self) -> GpuResult<()> {
        // SAFETY: live stream.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(self.raw)
        })
    }

    pub fn memcpy_dtod(
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

    pub fn memcpy_htod(&self, dst: sys::CUdeviceptr, src: &HostBuf, bytes: usize) -> GpuResult<()> {
        let bytes = bytes.min(src.bytes);
        // SAFETY: src is pinned and holds at least `bytes`; dst is a live device buffer.
        check("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, src.void(), bytes, self.raw)
        })
    }

    pub fn memcpy_dtoh(
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

    pub fn memset_d32(&self, dst: sys::CUdeviceptr, value: u32, words: usize) -> GpuResult<()> {
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
pub struct Event {
    pub raw: sys::CUevent,
}

// SAFETY: events may be used from any thread.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl Event {
    pub fn new(gpu: &Gpu) -> GpuResult<Event> {
        gpu.bind()?;
        let mut raw: sys::CUevent = std::ptr::null_mut();
        // SAFETY: valid out-pointer; destroyed in Drop.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut raw, sys::CUevent_flags::CU_EVENT_DEFAULT as u32)
        })?;
        Ok(Event { raw })
    }
    pub fn record(&self, stream: &Stream) -> GpuResult<()> {
        // SAFETY: live handles.
        check("cuEventRecord", unsafe {
            sys::cuEventRecord(self.raw, stream.raw)
        })
    }
    /// Blocks this thread until the work before the event's record is done.
    pub fn synchronize(&self) -> GpuResult<()> {
        // SAFETY: live event.
        check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(self.raw)
        })
    }
    /// Milliseconds from `self` to `end` (both recorded and complete).
    pub fn elapsed_ms(&self, end: &Event) -> GpuResult<f64> {
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

/// Deterministic 64-bit pattern word (splitmix64 of seed and index).
pub fn pattern_word(seed: u64, i: u64) -> u64 {
    let mut z = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(i.wrapping_mul(0xBF58_476D_1CE4_E5B9))
        .wrapping_add(0x94D0_49BB_1331_11EB);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fills `buf` with the pattern of `seed`, using several threads.
pub fn fill_pattern(buf: &mut [u8], seed: u64) {
    let words = buf.len() / 8;
    let chunk_words = (words / 16).max(1 << 16);
    let (head, tail) = buf.split_at_mut(words * 8);
    std::thread::scope(|s| {
        for (ci, chunk) in head.chunks_mut(chunk_words * 8).enumerate() {
            s.spawn(move || {
                let base = (ci * chunk_words) as u64;
                for (j, w) in chunk.chunks_exact_mut(8).enumerate() {
                    w.copy_from_slice(&pattern_word(seed, base + j as u64).to_le_bytes());
                }
            });
        }
    });
    for (k, b) in tail.iter_mut().enumerate() {
        *b = (pattern_word(seed, words as u64 + k as u64) & 0xff) as u8;
    }
}

/// Counts 8-byte words of `buf` that differ from the pattern of `seed` (several threads).
pub fn count_pattern_mismatch(buf: &[u8], seed: u64) -> u64 {
    let words = buf.len() / 8;
    let chunk_words = (words / 16).max(1 << 16);
    let head = &buf[..words * 8];
    let mut bad: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = head
            .chunks(chunk_words * 8)
            .enumerate()
            .map(|(ci, chunk)| {
                s.spawn(move || {
                    let base = (ci * chunk_words) as u64;
                    chunk
                        .chunks_exact(8)
                        .enumerate()
                        .filter(|(j, w)| {
                            let mut a = [0u8; 8];
                            a.copy_from_slice(w);
                            u64::from_le_bytes(a) != pattern_word(seed, base + *j as u64)
                        })
                        .count() as u64
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(u64::MAX / 64))
            .fold(0u64, u64::saturating_add)
    });
    for (k, b) in buf[words * 8..].iter().enumerate() {
        if *b != (pattern_word(seed, words as u64 + k as u64) & 0xff) as u8 {
            bad += 1;
        }
    }
    bad
}

#[cfg(test)]
mod tests {
    use super::*;

    use gpufabric_api::result::{ErrorKind, Phase};

    fn kind(e: &GpuError) -> ErrorKind {
        super::super::phase_error(Phase::NcclSweep, e).kind
    }

    #[test]
    fn out_of_memory_on_a_full_gpu_is_no_fault_and_on_a_free_one_is() {
        let total = 143_771u64 << 20;
        let full = out_of_memory("cuMemAlloc", "out of memory".into(), None, 3 << 30, total);
        assert!(matches!(full, GpuError::MemoryFull { .. }), "{full:?}");
        assert_eq!(
            full.to_string(),
            "cuMemAlloc failed: out of memory with 3.0 GiB of 140.4 GiB free: the GPU's memory is taken (by other work on it, or a suite larger than the GPU), which is not a fault of the GPU"
        );
        assert_eq!(kind(&full), ErrorKind::Unavailable);
        // With most of its memory free, an allocation that fits and fails is the GPU's failure.
        for requested in [None, Some(1 << 30)] {
            let free = out_of_memory(
                "cuMemAlloc",
                "out of memory".into(),
                requested,
                100 << 30,
                total,
            );
            assert!(matches!(free, GpuError::Call { .. }), "{free:?}");
            assert!(
                free.to_string()
                    .ends_with("with 100.0 GiB of 140.4 GiB free")
            );
            assert_eq!(kind(&free), ErrorKind::Failed);
        }
    }

    #[test]
    fn an_allocation_larger_than_the_gpu_is_the_suites_fault_not_the_gpus() {
        let total = 81_559u64 << 20;
        let e = out_of_memory(
            "cuMemAlloc",
            "out of memory".into(),
            Some(1 << 40),
            79 << 30,
            total,
        );
        assert!(matches!(e, GpuError::SuiteTooLarge { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(
            msg.contains("asking for 1024.0 GiB with 79.0 GiB of 79.6 GiB free")
                && msg.contains("more than the GPU's memory")
                && msg.contains("the FabricTest's suite is wrong, not the GPU"),
            "{msg}"
        );
        let phase = super::super::phase_error(Phase::NcclSweep, &e);
        assert_eq!(phase.kind, ErrorKind::Unavailable);
        assert!(
            phase.message.contains("suite.ncclSweep.maxBytes"),
            "{}",
            phase.message
        );
        // Larger than the GPU even when the GPU is also nearly full: still the suite's.
        let e = out_of_memory("cuMemAlloc", String::new(), Some(1 << 40), 1 << 30, total);
        assert!(matches!(e, GpuError::SuiteTooLarge { .. }), "{e:?}");
    }

    #[test]
    fn buffers_together_larger_than_the_free_memory_are_the_suites_fault() {
        // Three buffers of 30 GiB on an 80 GB GPU: the third finds 19 GiB of 79.6 free.
        let total = 81_559u64 << 20;
        let e = out_of_memory(
            "cuMemAlloc",
            "out of memory".into(),
            Some(30 << 30),
            19 << 30,
            total,
        );
        assert!(matches!(e, GpuError::SuiteTooLarge { .. }), "{e:?}");
        assert!(
            e.to_string()
                .contains("the suite's buffers together are larger than the GPU holds"),
            "{e}"
        );
        let phase = super::super::phase_error(Phase::GpuPairs, &e);
        assert_eq!(phase.kind, ErrorKind::Unavailable);
        assert!(
            phase.message.contains("suite.gpuPairs.bytes"),
            "{}",
            phase.message
        );
    }

    #[test]
    fn pinned_host_memory_that_runs_out_is_never_the_gpus_fault() {
        let e = host_out_of_memory("cuMemHostAlloc", 512 << 30);
        assert!(matches!(e, GpuError::MemoryFull { .. }), "{e:?}");
        assert!(e.to_string().contains("512.0 GiB of host memory"), "{e}");
        assert_eq!(kind(&e), ErrorKind::Unavailable);
    }

    #[test]
    fn pattern_check_finds_exactly_the_corrupted_words() {
        let mut buf = vec![0u8; 8 * 300_000 + 3];
        fill_pattern(&mut buf, 7);
        assert_eq!(count_pattern_mismatch(&buf, 7), 0);
        buf[8 * 12345] ^= 1;
        buf[8 * 299_999 + 7] ^= 0x80;
        let last = buf.len() - 1;
        buf[last] ^= 1;
        assert_eq!(count_pattern_mismatch(&buf, 7), 3);
        assert!(
            count_pattern_mismatch(&buf, 8) > 290_000,
            "another seed is another pattern"
        );
    }
}
