//! The cuda backend's looks at other work on the node's GPUs (the rules are
//! [`crate::gpu_use`]'s): before any context of this process, once its contexts are open
//! and after its measurements.

use super::{count_gpus, health, open_monitor};
use crate::gpu_use::GpuUse;
use crate::{CheckError, Progress};

/// What the GPUs `monitor` covers have in use now, with their processes; nothing without
/// NVML.
pub(super) fn in_use(monitor: Option<&health::Monitor>) -> Vec<GpuUse> {
    monitor.map(health::Monitor::gpu_use).unwrap_or_default()
}

/// Ends with [`CheckError::GpusInUse`] when other work holds any GPU ([`crate::gpu_use`]),
/// unless `shared`, which says so on progress and goes on. Call before this process creates
/// any context: what the GPUs have in use is then other work's. Without NVML it cannot
/// tell, and goes on.
pub(crate) fn refuse_gpus_in_use(
    monitor: Option<&health::Monitor>,
    shared: bool,
    progress: Progress,
) -> Result<(), CheckError> {
    crate::gpu_use::refuse(&in_use(monitor), shared, progress)
}

/// The same refusal for a rank of a node pair or group, before it meets the others: a rank
/// whose GPUs other work holds ends alone and at once (exit 14), and its peers record the
/// test as not measured.
pub(crate) fn refuse_shared_gpus(shared: bool, progress: Progress) -> Result<(), CheckError> {
    let n = count_gpus()?;
    refuse_gpus_in_use(open_monitor(n).as_ref(), shared, progress)
}

/// For a rank whose measuring processes have ended and that holds no context of its own:
/// [`CheckError::GpusInUse`] when other work holds the GPUs now, which started while they
/// were measured ([`crate::gpu_use::refuse_at_end`]). Without NVML it cannot tell.
pub(crate) fn refuse_work_started() -> Result<(), CheckError> {
    let monitor = open_monitor(count_gpus()?);
    crate::gpu_use::refuse_at_end(&in_use(monitor.as_ref()))
}
