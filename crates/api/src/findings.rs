//! Findings: what is wrong, with which component, measured against what, and how badly.

use crate::suite::Collective;
use serde::{Deserialize, Serialize};

/// What kind of fault a finding reports. Crashes, timeouts and hardware faults are kinds
/// of their own and are never reported as `Slow`.
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
pub enum FindingKind {
    /// A bandwidth or latency worse than expected.
    Slow,
    /// A GPU whose compute time in the DDP probe is well above its node's median.
    Straggler,
    /// A collective or copy produced wrong data.
    WrongResults,
    /// The agent crashed or exited without a result.
    Crash,
    /// The agent or a collective did not finish in time.
    Timeout,
    /// The result could not be used (missing, truncated, malformed, or the agent could not measure).
    Errored,
    /// Fewer NVLink links up than the GPU should have.
    NvlinkDown,
    /// NVLink replay, recovery or CRC error counters are non-zero.
    NvlinkErrors,
    /// The driver reported XID errors during the check.
    Xid,
    /// Uncorrectable ECC errors.
    EccUncorrectable,
    /// Remapped rows failed, or a remap is pending a reset.
    RowRemap,
    /// PCIe link running below its maximum generation or width.
    PcieDegraded,
    /// NCCL chose a slower transport (SHM, PCIe, network) between GPUs that have NVLink.
    TransportFallback,
    /// GPU temperature above the ceiling.
    Thermal,
    /// Fewer GPUs than the node advertises, or of another product.
    GpuMismatch,
    /// A network port (InfiniBand / RoCE) is not up.
    NicDown,
    /// A network port trained below the rate of its siblings on the node.
    NicDegraded,
    /// A network port's error counters grew since the previous run.
    NicErrors,
}

/// How much a finding matters.
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
pub enum Severity {
    /// Worth knowing; never fails a node.
    Info,
    /// Fails the node.
    Critical,
}

/// The measured quantity a finding is about.
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
#[serde(rename_all = "camelCase")]
pub enum Metric {
    NcclBusBw,
    NcclLatency,
    NcclWrong,
    PairBandwidth,
    PairBidirBandwidth,
    H2dBandwidth,
    D2hBandwidth,
    DdpScalingEfficiency,
    DdpComputeTime,
    NvlinkLinks,
    NvlinkErrors,
    Xid,
    EccUncorrected,
    RemappedRows,
    PcieLink,
    NcclTransport,
    Temperature,
    GpuCount,
    /// The agent's exit (crash, timeout, unusable result).
    AgentExit,
    /// NCCL bus bandwidth between two nodes.
    NodePairBusBw,
    /// The network transport NCCL used between two nodes (InfiniBand, RoCE, sockets).
    NetTransport,
    /// A network port's logical and physical state.
    NicLink,
    /// A network port's active rate.
    NicRate,
    /// A network port's error counters.
    NicErrors,
}

/// What a finding points at.
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
pub enum SubjectKind {
    Gpu,
    GpuPair,
    Node,
    NodePair,
    /// One port of a network device of a node.
    Nic,
}

/// The smallest thing at fault: a GPU, a GPU pair of one node, a network port of a node,
/// a node, or a node pair.
#[derive(
    Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct Subject {
    pub kind: SubjectKind,
    /// The node (for a node pair, the first node).
    pub node: String,
    /// GPU index on the node (for a GPU pair, the first GPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
    /// Second GPU of a GPU pair.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_gpu: Option<u32>,
    /// Second node of a node pair.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_node: Option<String>,
    /// Network port, e.g. `mlx5_0 port 1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nic: Option<String>,
}

impl Subject {
    pub fn node(node: impl Into<String>) -> Self {
        Subject {
            kind: SubjectKind::Node,
            node: node.into(),
            gpu: None,
            peer_gpu: None,
            peer_node: None,
            nic: None,
        }
    }
    pub fn gpu(node: impl Into<String>, gpu: u32) -> Self {
        Subject {
            kind: SubjectKind::Gpu,
            node: node.into(),
            gpu: Some(gpu),
            peer_gpu: None,
            peer_node: None,
            nic: None,
        }
    }
    pub fn gpu_pair(node: impl Into<String>, a: u32, b: u32) -> Self {
        Subject {
            kind: SubjectKind::GpuPair,
            node: node.into(),
            gpu: Some(a),
            peer_gpu: Some(b),
            peer_node: None,
            nic: None,
        }
    }
    pub fn node_pair(a: impl Into<String>, b: impl Into<String>) -> Self {
        Subject {
            kind: SubjectKind::NodePair,
            node: a.into(),
            gpu: None,
            peer_gpu: None,
            peer_node: Some(b.into()),
            nic: None,
        }
    }
    pub fn nic(node: impl Into<String>, port: impl Into<String>) -> Self {
        Subject {
            kind: SubjectKind::Nic,
            node: node.into(),
            gpu: None,
            peer_gpu: None,
            peer_node: None,
            nic: Some(port.into()),
        }
    }
}

impl std::fmt::Display for Subject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.kind, self.gpu, self.peer_gpu, &self.peer_node) {
            (SubjectKind::Gpu, Some(g), _, _) => write!(f, "{} GPU {g}", self.node),
            (SubjectKind::GpuPair, Some(a), Some(b), _) => {
                write!(f, "{} GPU {a} <-> GPU {b}", self.node)
            }
            (SubjectKind::NodePair, _, _, Some(peer)) => write!(f, "{} <-> {peer}", self.node),
            (SubjectKind::Nic, _, _, _) => match &self.nic {
                Some(port) => write!(f, "{} {port}", self.node),
                None => write!(f, "{}", self.node),
            },
            _ => write!(f, "{}", self.node),
        }
    }
}

/// Where the expected value of a finding came from.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, schemars::JsonSchema)]
pub enum ExpectationSource {
    /// An explicit threshold in the FabricTest spec.
    Threshold,
    /// The built-in profile of the GPU product.
    Profile,
    /// The median of comparable nodes in the same run.
    Fleet,
    /// The median of the node's own GPUs or GPU pairs.
    Node,
    /// A fixed rule (a hardware counter that must be zero, a link that must be up).
    Rule,
}

/// One finding, with its evidence and a sentence a person can act on.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    pub kind: FindingKind,
    pub subject: Subject,
    pub metric: Metric,
    /// The collective, for NCCL metrics.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collective: Option<Collective>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<f64>,
    /// (measured - expected) / expected; negative when below.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deviation: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<ExpectationSource>,
    pub severity: Severity,
    /// One sentence a person can act on.
    pub message: String,
}

impl Finding {
    /// A finding without evidence: what, about whom, how severe, and the sentence.
    pub fn new(
        kind: FindingKind,
        subject: Subject,
        metric: Metric,
        severity: Severity,
        message: String,
    ) -> Self {
        Finding {
            kind,
            subject,
            metric,
            collective: None,
            measured: None,
            expected: None,
            deviation: None,
            unit: None,
            source: None,
            severity,
            message,
        }
    }
}
