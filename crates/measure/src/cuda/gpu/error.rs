//! A GPU call's failure as a value: the error, and how a failed allocation is judged (the
//! GPU's memory full, a suite too large for it, or the GPU's own failure).

use cudarc::driver::sys;
use std::ffi::CStr;
use std::time::Duration;

/// A failed CUDA, NCCL or cuBLAS call, or a wait that ran past its deadline.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GpuError {
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
    pub(crate) fn refused(self) -> GpuError {
        match self {
            GpuError::Call { call, detail } => GpuError::Refused { call, detail },
            other => other,
        }
    }
}

pub(crate) type GpuResult<T> = Result<T, GpuError>;

/// The result of a scoped thread that drives a GPU; a panic there is the `call`'s error,
/// never the process's end.
pub(crate) fn joined<T>(
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
pub(crate) fn check(call: &'static str, status: sys::CUresult) -> GpuResult<()> {
    check_alloc(call, status, None)
}

/// [`check`] for an allocation of `requested` bytes of device memory: a failure to find
/// them is judged by [`out_of_memory`].
pub(crate) fn check_alloc(
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
pub(crate) fn out_of_memory(
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
pub(crate) fn host_out_of_memory(call: &'static str, requested: u64) -> GpuError {
    GpuError::MemoryFull {
        call,
        detail: format!(
            "could not pin {:.1} GiB of host memory: the node's or the pod's memory cannot hold the suite's host buffers (one per GPU, of the largest size), which is not a fault of the GPU; lower the suite's sizes or raise agent.resources memory",
            requested as f64 / f64::from(1u32 << 30)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use gpufabric_api::result::{ErrorKind, Phase};

    fn kind(e: &GpuError) -> ErrorKind {
        crate::cuda::phase_error(Phase::NcclSweep, e).kind
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
        let phase = crate::cuda::phase_error(Phase::NcclSweep, &e);
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
        let phase = crate::cuda::phase_error(Phase::GpuPairs, &e);
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
}
