//! GPU fabric measurements (NCCL sweep, GPU-pair copies, DDP probe, NVML health) behind a
//! cuda and a sim backend; no Kubernetes.

pub mod cuda;
pub mod fleet;
pub mod stats;

use gpufabric_api::suite::Suite;
use std::time::Duration;

/// What a node check is asked to do.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// Name of the node (goes into the result document).
    pub node: String,
    /// What to measure.
    pub suite: Suite,
    /// Fewer sizes, iterations and steps: a fast smoke check.
    pub quick: bool,
    /// GPUs the node must have (fail with `TooFewGpus` when fewer are visible).
    pub expect_gpus: Option<u32>,
    /// Watchdog per phase: a collective or copy that does not finish in time is aborted
    /// and reported as a `timeout` phase error.
    pub phase_timeout: Duration,
}

/// Receives one line of progress (the agent prints it on stderr).
pub type Progress<'a> = &'a (dyn Fn(&str) + Sync);

/// Why a node check could not measure at all. Each kind has its own process exit code.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("no GPU found: {0}")]
    NoGpu(String),
    #[error("{library} could not be loaded: {detail}")]
    LibraryMissing { library: String, detail: String },
    #[error("found {found} GPUs, {wanted} expected")]
    TooFewGpus { found: u32, wanted: u32 },
    #[error("invalid input: {0}")]
    InvalidInput(String),
    #[error("{0}")]
    Other(String),
}

impl CheckError {
    /// Process exit code of the agent for this error (0 is "measured", 1 is a bug).
    pub fn exit_code(&self) -> i32 {
        match self {
            CheckError::NoGpu(_) => 10,
            CheckError::LibraryMissing { .. } => 11,
            CheckError::TooFewGpus { .. } => 12,
            CheckError::InvalidInput(_) => 2,
            CheckError::Other(_) => 13,
        }
    }
}
