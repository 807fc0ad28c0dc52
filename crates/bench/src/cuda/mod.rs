//! The cuda backend: real GPUs through cudarc (driver, NCCL, cuBLAS) and nvml-wrapper.

use crate::{CheckError, CheckOptions, Progress};
use gpufabric_api::ResultDocument;

/// Runs the node check on every visible GPU.
pub fn node_check(_opts: &CheckOptions, _progress: Progress) -> Result<ResultDocument, CheckError> {
    Err(CheckError::LibraryMissing {
        library: "cuda backend".into(),
        detail: "this build of the agent has no cuda backend yet".into(),
    })
}
