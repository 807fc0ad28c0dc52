//! The phases of a node check, as every document names them, and how one failed: below the
//! suite (which says what memory each phase holds) and the documents (which list the phases
//! that measured nothing). Imports nothing of the crate.

use serde::{Deserialize, Serialize};

/// The phases of a node check.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub enum Phase {
    Setup,
    Health,
    NcclSweep,
    GpuPairs,
    DdpProbe,
    NodePair,
    Compute,
}

impl Phase {
    /// The API name of a phase (`ncclSweep`, ...), as the documents spell it.
    pub fn api_name(self) -> &'static str {
        match self {
            Phase::Setup => "setup",
            Phase::Health => "health",
            Phase::NcclSweep => "ncclSweep",
            Phase::GpuPairs => "gpuPairs",
            Phase::DdpProbe => "ddpProbe",
            Phase::NodePair => "nodePair",
            Phase::Compute => "compute",
        }
    }
}

/// How a phase failed.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "camelCase")]
pub enum ErrorKind {
    /// The phase ran past its watchdog and was aborted.
    Timeout,
    /// The phase failed (a CUDA or NCCL error, a process that died).
    Failed,
    /// The phase could not run here (library missing, too few GPUs).
    Unavailable,
}

/// A phase that did not produce a measurement.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PhaseError {
    pub phase: Phase,
    pub kind: ErrorKind,
    pub message: String,
}
