//! NCCL in one process over several GPUs: communicators and the watchdog that aborts a hung
//! collective (`comm`), the nccl-tests style sweep (`sweep`), its timing (`timing`) and the
//! validation of its outputs (`check`).

mod check;
mod comm;
mod sweep;
mod timing;

pub use check::{count_wrong, encode, expected_value, fill_inputs, input_value, rank_sums};
pub use comm::{Comms, Watchdog, group, settle, sync_all, unique_id};
pub use sweep::{Rank, SweepSettings, alltoall_call, enqueue, sweep_collective};
pub use timing::{MAX_BLOCKS, RAMP, SHORT_BLOCK, Timing, blocks_wanted, median};

use super::gpu::{GpuError, GpuResult};
use cudarc::nccl::sys as nsys;
use gpufabric_api::suite::DataType;
use std::ffi::CStr;

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
