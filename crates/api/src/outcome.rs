//! What a node's benchmark pod says about the node, and who is at fault: the agent measured
//! (the evaluator gives the verdict), the agent saw the hardware fail, or the node was not
//! measured for a reason outside its hardware. Only the first two ever count against a node.

use crate::result::CompactResult;
use serde::{Deserialize, Serialize};

/// The outcome of one node in a run: one type from the pod to the evaluator.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeOutcome {
    /// The agent measured and wrote a readable result; passed or failed is the evaluator's verdict.
    Measured(Box<CompactResult>),
    /// The agent saw the hardware fail and could not measure.
    HardwareFault {
        fault: HardwareFault,
        detail: String,
    },
    /// The node was not measured, for a reason outside its hardware.
    NotMeasured {
        reason: NotMeasuredReason,
        detail: String,
    },
}

impl NodeOutcome {
    pub fn not_measured(reason: NotMeasuredReason, detail: impl Into<String>) -> Self {
        NodeOutcome::NotMeasured {
            reason,
            detail: detail.into(),
        }
    }

    pub fn hardware(fault: HardwareFault, detail: impl Into<String>) -> Self {
        NodeOutcome::HardwareFault {
            fault,
            detail: detail.into(),
        }
    }

    /// Whether this outcome may count against the node (measured or a hardware fault).
    pub fn counts_against_node(&self) -> bool {
        !matches!(self, NodeOutcome::NotMeasured { .. })
    }

    /// The sentence that says why there is no measurement, when there is none.
    pub fn detail(&self) -> Option<&str> {
        match self {
            NodeOutcome::Measured(_) => None,
            NodeOutcome::HardwareFault { detail, .. } | NodeOutcome::NotMeasured { detail, .. } => {
                Some(detail)
            }
        }
    }
}

/// A hardware fault the agent saw instead of a measurement.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    schemars::JsonSchema,
)]
pub enum HardwareFault {
    /// The agent found no GPU, or fewer than the node advertises (agent exit codes 10, 12).
    GpuMissing,
    /// The agent found a GPU it could not use (agent exit code 13).
    GpuUnusable,
    /// The agent died by a signal while driving the GPUs (SIGABRT, SIGSEGV, SIGKILL), or
    /// exited with an error code the agent does not document.
    Crash,
    /// The agent had started and ran past the pod's deadline: its own watchdog could not
    /// stop a hung collective or copy.
    Hang,
}

impl HardwareFault {
    pub fn as_str(self) -> &'static str {
        match self {
            HardwareFault::GpuMissing => "GpuMissing",
            HardwareFault::GpuUnusable => "GpuUnusable",
            HardwareFault::Crash => "Crash",
            HardwareFault::Hang => "Hang",
        }
    }
}

impl std::fmt::Display for HardwareFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a node was not measured: the infrastructure, never the node's hardware.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    schemars::JsonSchema,
)]
pub enum NotMeasuredReason {
    /// The kubelet or an admission check refused the pod (e.g. `OutOfnvidia.com/gpu`: the
    /// node's GPUs were in use).
    NotAdmitted,
    /// The pod was never bound to the node.
    NotScheduled,
    /// The agent image could not be pulled (`ErrImagePull`, `ImagePullBackOff`, `InvalidImageName`).
    ImagePull,
    /// The container could not be configured or started (`CreateContainerConfigError`: a
    /// missing Secret or ConfigMap; `CreateContainerError`, `StartError`).
    ContainerConfig,
    /// The pod was evicted (node pressure, the eviction API, a taint).
    Evicted,
    /// The pod was preempted by a higher-priority pod.
    Preempted,
    /// The pod was deleted, or its node removed, before the agent finished.
    PodDeleted,
    /// The agent ran out of its container's memory (OOMKilled).
    OutOfMemory,
    /// The agent cannot run against this node's driver or CUDA, or refused its input
    /// (agent exit codes 11 and 2): an image or version mismatch, not a broken node.
    AgentIncompatible,
    /// The pod stayed Pending until the deadline; no container ever ran.
    NeverStarted,
    /// Other work the scheduler does not know about held the node's GPUs when the agent
    /// started (agent exit code 14): memory in use before the agent's own contexts, or a
    /// process NVML lists; or an administrator reserved a GPU (compute mode Prohibited).
    GpusInUse,
    /// The agent's result could not be read (unparseable document) or the agent panicked
    /// (exit codes 1 and 101).
    AgentBug,
    /// The node stopped reporting (its Ready condition not True) while its agent ran, and
    /// the agent was still running, as far as anyone could tell, at the run deadline: its
    /// kubelet or its network failed to answer, which says nothing of its GPUs.
    NodeNotReady,
    /// An object with the name of the node's benchmark pod existed already and was not made
    /// by this run (someone else's pod): it is never read, and the node is not measured.
    NameTaken,
    /// The run reached `limits.maxDurationSeconds` before the node's result: its pod was
    /// stopped.
    MaxDuration,
    /// The run was cancelled (`gpufabric.io/cancel`) before the node's result: its pod was
    /// stopped.
    Cancelled,
}

impl NotMeasuredReason {
    pub fn as_str(self) -> &'static str {
        match self {
            NotMeasuredReason::NotAdmitted => "NotAdmitted",
            NotMeasuredReason::NotScheduled => "NotScheduled",
            NotMeasuredReason::ImagePull => "ImagePull",
            NotMeasuredReason::ContainerConfig => "ContainerConfig",
            NotMeasuredReason::Evicted => "Evicted",
            NotMeasuredReason::Preempted => "Preempted",
            NotMeasuredReason::PodDeleted => "PodDeleted",
            NotMeasuredReason::OutOfMemory => "OutOfMemory",
            NotMeasuredReason::AgentIncompatible => "AgentIncompatible",
            NotMeasuredReason::NeverStarted => "NeverStarted",
            NotMeasuredReason::GpusInUse => "GpusInUse",
            NotMeasuredReason::AgentBug => "AgentBug",
            NotMeasuredReason::NodeNotReady => "NodeNotReady",
            NotMeasuredReason::NameTaken => "NameTaken",
            NotMeasuredReason::MaxDuration => "MaxDuration",
            NotMeasuredReason::Cancelled => "Cancelled",
        }
    }

    /// What a person should check when many nodes share this reason.
    pub fn advice(self) -> &'static str {
        match self {
            NotMeasuredReason::NotAdmitted => {
                "the nodes' GPUs are in use or the kubelet refused the pods; test when they are idle"
            }
            NotMeasuredReason::NotScheduled => "the pods were never bound to their nodes",
            NotMeasuredReason::ImagePull => "check agent.image and agent.imagePullSecrets",
            NotMeasuredReason::ContainerConfig => {
                "check the Secrets and ConfigMaps that agent.env refers to"
            }
            NotMeasuredReason::Evicted | NotMeasuredReason::Preempted => {
                "other workloads displaced the benchmark pods; check priorities and node pressure"
            }
            NotMeasuredReason::PodDeleted => "something deleted the benchmark pods",
            NotMeasuredReason::OutOfMemory => "raise agent.resources memory",
            NotMeasuredReason::AgentIncompatible => {
                "the agent image does not match the nodes' driver or CUDA, or this operator's version"
            }
            NotMeasuredReason::NeverStarted => {
                "the kubelets did not start the pods; check the nodes and their runtime"
            }
            NotMeasuredReason::GpusInUse => {
                "processes outside the scheduler's view (host processes, pods that did not request GPUs, an MPS server) hold the nodes' GPUs, or their compute mode is Prohibited; stop them, or set FABRIC_SHARED_GPUS=1 in agent.env to measure beside them"
            }
            NotMeasuredReason::AgentBug => "the agent wrote no readable result; report a bug",
            NotMeasuredReason::NodeNotReady => {
                "the nodes stopped reporting to the API server while their agents ran; check their kubelets and network"
            }
            NotMeasuredReason::NameTaken => {
                "someone else created pods with the names of this run's benchmark pods; find who can create pods in the operator's namespace"
            }
            NotMeasuredReason::MaxDuration => {
                "the run reached limits.maxDurationSeconds first; raise it, or test fewer nodes a run (limits.maxNodes)"
            }
            NotMeasuredReason::Cancelled => "the run was cancelled before these nodes were done",
        }
    }
}

impl std::fmt::Display for NotMeasuredReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether the agent writes its document when it ends with `code`: success (0), and a node
/// that failed its own verdict (3) or produced wrong values (4); the operator judges such a
/// pod on its document. (5, a test over several nodes not measured, writes one too: the
/// operator reads a rank's document whatever its exit code.)
pub fn exit_code_writes_result(code: i32) -> bool {
    matches!(code, 0 | 3 | 4)
}

/// What the agent's exit code says, for a pod that ended without a usable result.
/// The codes are the agent's, one table for every subcommand (`fabric-agent --help`);
/// 128 + N is signal N.
pub fn exit_code_outcome(code: i32) -> (Result<HardwareFault, NotMeasuredReason>, &'static str) {
    match code {
        1 => (
            Err(NotMeasuredReason::AgentBug),
            "the agent failed unexpectedly",
        ),
        101 => (Err(NotMeasuredReason::AgentBug), "the agent panicked"),
        2 => (
            Err(NotMeasuredReason::AgentIncompatible),
            "the agent refused its input",
        ),
        // The codes that come with a document, here without one that could be read.
        3 => (
            Err(NotMeasuredReason::AgentBug),
            "the agent failed the node on its own verdict but wrote no readable result",
        ),
        4 => (
            Err(NotMeasuredReason::AgentBug),
            "the agent found wrong values but wrote no readable result",
        ),
        5 => (
            Err(NotMeasuredReason::AgentBug),
            "the agent said the test was not measured but wrote no readable result",
        ),
        10 => (Ok(HardwareFault::GpuMissing), "no GPU found"),
        11 => (
            Err(NotMeasuredReason::AgentIncompatible),
            "a GPU library (CUDA, NCCL or NVML) could not be loaded",
        ),
        12 => (
            Ok(HardwareFault::GpuMissing),
            "fewer GPUs than the node advertises",
        ),
        13 => (Ok(HardwareFault::GpuUnusable), "the check could not run"),
        14 => (
            Err(NotMeasuredReason::GpusInUse),
            "other work held the GPUs when the agent started",
        ),
        134 => (Ok(HardwareFault::Crash), "aborted (SIGABRT)"),
        135 => (Ok(HardwareFault::Crash), "bus error (SIGBUS)"),
        137 => (Ok(HardwareFault::Crash), "killed (SIGKILL)"),
        139 => (Ok(HardwareFault::Crash), "segmentation fault"),
        143 => (
            Err(NotMeasuredReason::PodDeleted),
            "terminated (SIGTERM): the pod was stopped",
        ),
        _ => (Ok(HardwareFault::Crash), "agent exited with an error"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documented_agent_exit_codes_say_who_is_at_fault() {
        assert_eq!(exit_code_outcome(12).0, Ok(HardwareFault::GpuMissing));
        assert_eq!(exit_code_outcome(10).0, Ok(HardwareFault::GpuMissing));
        assert_eq!(exit_code_outcome(13).0, Ok(HardwareFault::GpuUnusable));
        assert_eq!(
            exit_code_outcome(11).0,
            Err(NotMeasuredReason::AgentIncompatible)
        );
        assert_eq!(
            exit_code_outcome(2).0,
            Err(NotMeasuredReason::AgentIncompatible)
        );
        assert_eq!(exit_code_outcome(101).0, Err(NotMeasuredReason::AgentBug));
        assert_eq!(exit_code_outcome(14).0, Err(NotMeasuredReason::GpusInUse));
        assert_eq!(exit_code_outcome(134).0, Ok(HardwareFault::Crash));
        assert_eq!(exit_code_outcome(77).0, Ok(HardwareFault::Crash));
        // Node failed, wrong values, not measured: each comes with a document; without
        // one the agent is at fault, not the node.
        for code in [3, 4, 5] {
            assert_eq!(exit_code_outcome(code).0, Err(NotMeasuredReason::AgentBug));
        }
        assert!(exit_code_writes_result(0));
        assert!(exit_code_writes_result(3));
        assert!(exit_code_writes_result(4));
        assert!(!exit_code_writes_result(14));
        assert!(!exit_code_writes_result(143));
    }

    #[test]
    fn only_not_measured_outcomes_spare_the_node() {
        let n = NodeOutcome::not_measured(NotMeasuredReason::ImagePull, "ImagePullBackOff");
        assert!(!n.counts_against_node());
        assert_eq!(n.detail(), Some("ImagePullBackOff"));
        assert!(NodeOutcome::hardware(HardwareFault::Hang, "hung").counts_against_node());
    }
}
