//! NCCL in one process over several GPUs: communicators and the watchdog that aborts a hung
//! collective (`comm`), the node check's sweep phase (`phase`), the nccl-tests style sweep
//! of one collective (`sweep`), its timing (`timing`), the threads that launch a block's
//! CUDA graphs (`launch`) and the validation of its outputs (`check`); where NCCL's log goes.

mod check;
mod comm;
mod launch;
pub(crate) mod phase;
mod rank;
mod sweep;
mod timing;

pub(crate) use check::fill_inputs;
pub(crate) use comm::{Comms, Watchdog, group, settle, sync_all, unique_id};
pub(crate) use rank::{Rank, SweepSettings, alltoall_call};
pub(crate) use sweep::sweep_collective;

use super::gpu::{DevBuf, Gpu, GpuError, GpuResult};
use cudarc::driver::sys as csys;
use cudarc::nccl::sys as nsys;
use gpufabric_api::suite::DataType;
use std::ffi::CStr;

/// Points NCCL's INFO log at a file this process parses for transports, unless the user set
/// NCCL_DEBUG, and returns the file; processes this one starts are to keep out of it. Call
/// before the first NCCL call and before starting threads.
pub(crate) fn debug_file() -> Option<std::path::PathBuf> {
    if std::env::var_os("NCCL_DEBUG").is_some() {
        return None;
    }
    let path = std::env::temp_dir().join(format!("fabric-agent-nccl-{}.log", std::process::id()));
    // SAFETY: called before the first NCCL call and before this backend starts threads;
    // NCCL reads these variables at its initialisation.
    unsafe {
        std::env::set_var("NCCL_DEBUG", "INFO");
        std::env::set_var("NCCL_DEBUG_SUBSYS", "INIT,P2P,SHM,NET");
        std::env::set_var("NCCL_DEBUG_FILE", &path);
    }
    Some(path)
}

/// [`CheckError::LibraryMissing`] where NCCL cannot be loaded.
pub(crate) fn require() -> Result<(), crate::CheckError> {
    if nccl_present() {
        return Ok(());
    }
    Err(crate::CheckError::LibraryMissing {
        library: "libnccl.so".into(),
        detail: "NCCL is not installed or not on the library path".into(),
    })
}

/// Turns an NCCL status into a result.
pub(crate) fn ncheck(call: &'static str, r: nsys::ncclResult_t) -> GpuResult<()> {
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
    Err(nccl_error(call, r, text))
}

/// The error of an NCCL call that returned `r` (`text` its description): invalid usage and
/// invalid arguments are NCCL refusing how it was asked ([`GpuError::Misconfigured`]: an
/// `NCCL_*` variable in the test's agent env, such as an `NCCL_ALGO` or `NCCL_PROTO` a
/// collective does not support, or the suite); anything else is a failure of the node.
pub(crate) fn nccl_error(call: &'static str, r: nsys::ncclResult_t, text: String) -> GpuError {
    use nsys::ncclResult_t::{ncclInvalidArgument, ncclInvalidUsage};
    let detail = format!("{text} ({r:?})");
    if matches!(r, ncclInvalidUsage | ncclInvalidArgument) {
        GpuError::Misconfigured {
            call,
            detail: format!(
                "{detail}: NCCL refused its settings, so the node was not measured on it; the FabricTest's agent env (an NCCL_* variable such as NCCL_ALGO or NCCL_PROTO that this collective does not support) or its suite is wrong, not the node"
            ),
        }
    } else {
        GpuError::Call { call, detail }
    }
}

/// Whether libnccl can be opened.
pub fn nccl_present() -> bool {
    // SAFETY: only opens the library.
    unsafe { nsys::is_culib_present() }
}

/// NCCL's version code (22809 for 2.28.9); None when it cannot be read.
pub(crate) fn nccl_version_code() -> Option<i32> {
    static CODE: std::sync::OnceLock<Option<i32>> = std::sync::OnceLock::new();
    *CODE.get_or_init(|| {
        let mut v = 0i32;
        // SAFETY: valid out-pointer.
        let r = unsafe { nsys::ncclGetVersion(&mut v) };
        (r == nsys::ncclResult_t::ncclSuccess).then_some(v)
    })
}

/// NCCL version as "2.28.3".
pub(crate) fn nccl_version() -> Option<String> {
    let v = nccl_version_code()?;
    let (major, minor, patch) = if v >= 10000 {
        (v / 10000, (v % 10000) / 100, v % 100)
    } else {
        (v / 1000, (v % 1000) / 100, v % 100)
    };
    Some(format!("{major}.{minor}.{patch}"))
}

pub(crate) fn nccl_type(dt: DataType) -> nsys::ncclDataType_t {
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

/// Whether the loaded NCCL has `ncclMemAlloc` (2.19 and later; the symbol is looked up only
/// then, as a missing one cannot be loaded).
pub(crate) fn mem_alloc_call() -> bool {
    nccl_version_code().is_some_and(|v| v >= 21900)
}

/// A buffer for collectives, allocated as nccl-tests allocates its send and receive buffers:
/// `ncclMemAlloc` where NCCL has it (memory mapped with `cuMemCreate` and made accessible
/// to every peer GPU), else `cuMemAlloc`, so that the sweep and nccl-tests time the same
/// kind of memory. (A side-by-side of the two on 2 x H200 at 16 MiB - 1 GiB did not show
/// the allocator to change busbw beyond the 3-6% the sizes move between rounds;
/// bench/results/h200x2-2026-11-26-compare.md.) Where `ncclMemAlloc` fails, the buffer comes
/// from `cuMemAlloc`, as before: a host whose driver or container refuses NCCL's way of
/// mapping memory must not fail its sweep for it. Also returns which allocator gave it,
/// and why not `ncclMemAlloc` where that failed.
pub(crate) fn comm_buffer(gpu: &Gpu, bytes: usize) -> GpuResult<(DevBuf, String)> {
    if !mem_alloc_call() {
        return Ok((DevBuf::new(gpu, bytes)?, "cuMemAlloc".into()));
    }
    gpu.bind()?;
    let mut ptr: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: valid out-pointer; NCCL allocates on the current device (bound above).
    let r = ncheck("ncclMemAlloc", unsafe {
        nsys::ncclMemAlloc(&mut ptr, bytes.max(1))
    });
    match r {
        Ok(()) => {
            let ptr = ptr as csys::CUdeviceptr;
            // SAFETY: a live allocation of at least `bytes` on this GPU, owned by nothing
            // else and given back by ncclMemFree.
            let buf = unsafe { DevBuf::adopt(gpu, ptr, bytes, nccl_mem_free) };
            Ok((buf, "ncclMemAlloc".into()))
        }
        Err(e) => Ok((DevBuf::new(gpu, bytes)?, format!("cuMemAlloc, because {e}"))),
    }
}

/// # Safety
/// `ptr` came from `ncclMemAlloc` on the current device and is freed once.
unsafe fn nccl_mem_free(ptr: csys::CUdeviceptr) {
    // SAFETY: see the function's contract.
    unsafe { nsys::ncclMemFree(ptr as *mut std::ffi::c_void) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufabric_api::result::{ErrorKind, Phase};

    #[test]
    fn nccl_refusing_its_settings_is_the_tests_configuration_never_the_nodes() {
        use nsys::ncclResult_t::*;
        for r in [ncclInvalidUsage, ncclInvalidArgument] {
            let e = nccl_error("ncclGroupEnd", r, "invalid usage".into());
            assert!(matches!(e, GpuError::Misconfigured { .. }), "{e:?}");
            let phase = crate::cuda::phase_error(Phase::NcclSweep, &e);
            assert_eq!(phase.kind, ErrorKind::Unavailable);
            assert!(
                phase.message.contains("agent env")
                    && phase.message.contains("NCCL_ALGO")
                    && phase.message.contains("not the node"),
                "{}",
                phase.message
            );
        }
        for r in [
            ncclUnhandledCudaError,
            ncclSystemError,
            ncclInternalError,
            ncclRemoteError,
        ] {
            let e = nccl_error("ncclAllReduce", r, "failed".into());
            assert!(matches!(e, GpuError::Call { .. }), "{e:?}");
            assert_eq!(
                crate::cuda::phase_error(Phase::NcclSweep, &e).kind,
                ErrorKind::Failed
            );
        }
    }
}
