//! The driver and one device with its primary context.

use super::error::{GpuError, GpuResult, check};
use cudarc::driver::sys;
use std::ffi::CStr;

/// Whether the driver library can be opened at all.
pub(crate) fn driver_present() -> bool {
    // SAFETY: only tries to open the shared library.
    unsafe { sys::is_culib_present() }
}

/// Initialises the driver and counts devices.
pub(crate) fn init_and_count() -> GpuResult<u32> {
    // SAFETY: plain driver calls with valid out-pointers.
    unsafe {
        check("cuInit", sys::cuInit(0))?;
        let mut n = 0i32;
        check("cuDeviceGetCount", sys::cuDeviceGetCount(&mut n))?;
        Ok(n.max(0) as u32)
    }
}

/// Driver version as "13.0".
pub(crate) fn driver_cuda_version() -> Option<String> {
    let mut v = 0i32;
    // SAFETY: valid out-pointer.
    let ok = unsafe { sys::cuDriverGetVersion(&mut v) } == sys::CUresult::CUDA_SUCCESS;
    ok.then(|| format!("{}.{}", v / 1000, (v % 1000) / 10))
}

/// The PCI bus id of device `index` (after [`init_and_count`]), read without creating a
/// context on it.
pub(crate) fn device_bus_id(index: u32) -> Option<String> {
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
pub(crate) struct Gpu {
    pub index: u32,
    pub dev: sys::CUdevice,
    pub ctx: sys::CUcontext,
}

// SAFETY: CUDA contexts may be made current on any thread.
unsafe impl Send for Gpu {}
// SAFETY: all uses go through driver calls, which are thread safe.
unsafe impl Sync for Gpu {}

impl Gpu {
    pub(crate) fn open(index: u32) -> GpuResult<Gpu> {
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
    pub(crate) fn bind(&self) -> GpuResult<()> {
        // SAFETY: ctx is a retained primary context.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(self.ctx) })
    }

    pub(crate) fn name(&self) -> String {
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

    pub(crate) fn pci_bus_id(&self) -> Option<String> {
        bus_id_of(self.dev)
    }

    /// Compute capability (major, minor), if the driver says.
    pub(crate) fn compute_capability(&self) -> Option<(i32, i32)> {
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

    pub(crate) fn total_mem(&self) -> u64 {
        let mut bytes = 0usize;
        // SAFETY: valid out-pointer.
        unsafe { sys::cuDeviceTotalMem_v2(&mut bytes, self.dev) };
        bytes as u64
    }

    /// Enables peer access from this GPU's context to `peer`'s memory (idempotent).
    pub(crate) fn enable_peer(&self, peer: &Gpu) -> GpuResult<()> {
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
