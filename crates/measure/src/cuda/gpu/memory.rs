//! Memory: device buffers and page-locked host buffers, freed on drop.

use super::device::Gpu;
use super::error::{GpuResult, check, check_alloc, host_out_of_memory};
use cudarc::driver::sys;
use std::ffi::c_void;

/// Device memory, freed on drop.
pub(crate) struct DevBuf {
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
    pub(crate) fn new(gpu: &Gpu, bytes: usize) -> GpuResult<DevBuf> {
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
    pub(crate) unsafe fn adopt(
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

    pub(crate) fn void(&self) -> *mut c_void {
        self.ptr as *mut c_void
    }

    /// Address `offset` bytes into the buffer.
    pub(crate) fn at(&self, offset: usize) -> sys::CUdeviceptr {
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
pub(crate) struct HostBuf {
    ptr: *mut u8,
    pub bytes: usize,
}

// SAFETY: plain host memory owned by this value.
unsafe impl Send for HostBuf {}
// SAFETY: shared access is read-only through as_slice.
unsafe impl Sync for HostBuf {}

impl HostBuf {
    pub(crate) fn new(gpu: &Gpu, bytes: usize) -> GpuResult<HostBuf> {
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
    pub(crate) fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr points to `bytes` bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr, self.bytes) }
    }
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.bytes) }
    }
    pub(crate) fn void(&self) -> *mut c_void {
        self.ptr as *mut c_void
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        // SAFETY: frees the allocation made in new().
        unsafe { sys::cuMemFreeHost(self.ptr as *mut c_void) };
    }
}
