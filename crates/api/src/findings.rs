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
    /// A GPU's NVLink error counters grew since the node's previous run by more than the
    /// threshold (`thresholds.nvlinkErrorGrowth`): a marginal link.
    NvlinkErrorsGrowing,
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
    /// A network port's error counters grew since the node's previous node-pair test.
    NicErrors,
    /// A node's number fell below its own baseline (the median of its earlier runs of the
    /// test) for several runs while still above every floor. A Warning: it never fails a
    /// node.
    Drifting,
    /// A node's software (driver, CUDA, NCCL, NCCL's config files, VBIOS, fabric manager)
    /// differs from what most nodes of its run have. A Warning: it never fails a node.
    SoftwareDrift,
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
    /// Worth a look soon (a node drifting toward a floor); never fails a node.
    Warning,
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
    /// Growth of a GPU's NVLink error counters between two runs.
    NvlinkErrorGrowth,
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
    /// A GPU's dense GEMM throughput (TFLOP/s).
    GemmThroughput,
    /// A GPU's device memory bandwidth (GB/s).
    MemoryBandwidth,
    /// A GPU's output of the silent-data-corruption GEMM against the exact result and the
    /// other GPUs'.
    ComputeChecksum,
    /// The slowest host-to-device or device-to-host copy of any GPU of a node.
    HostBandwidth,
    /// The DDP probe's step time at the largest GPU count.
    DdpStepTime,
    /// A node's software versions and configuration.
    Software,
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

/// The smallest thing at fault. On the wire (and in the CRD schema) it is a kind and the
/// fields that kind uses (`SubjectWire`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(into = "SubjectWire", try_from = "SubjectWire")]
pub enum Subject {
    /// One GPU of a node.
    Gpu { node: String, gpu: u32 },
    /// Two GPUs of one node.
    GpuPair { node: String, a: u32, b: u32 },
    /// A whole node.
    Node { node: String },
    /// Two nodes (the path between them, or either side).
    NodePair { a: String, b: String },
    /// One port of a network device of a node, e.g. `mlx5_0 port 1`.
    Nic { node: String, port: String },
}

impl Subject {
    pub fn node(node: impl Into<String>) -> Self {
        Subject::Node { node: node.into() }
    }
    pub fn gpu(node: impl Into<String>, gpu: u32) -> Self {
        Subject::Gpu {
            node: node.into(),
            gpu,
        }
    }
    pub fn gpu_pair(node: impl Into<String>, a: u32, b: u32) -> Self {
        Subject::GpuPair {
            node: node.into(),
            a,
            b,
        }
    }
    pub fn node_pair(a: impl Into<String>, b: impl Into<String>) -> Self {
        Subject::NodePair {
            a: a.into(),
            b: b.into(),
        }
    }
    pub fn nic(node: impl Into<String>, port: impl Into<String>) -> Self {
        Subject::Nic {
            node: node.into(),
            port: port.into(),
        }
    }

    /// Which kind of subject this is (the wire form's `kind`).
    pub fn kind(&self) -> SubjectKind {
        match self {
            Subject::Gpu { .. } => SubjectKind::Gpu,
            Subject::GpuPair { .. } => SubjectKind::GpuPair,
            Subject::Node { .. } => SubjectKind::Node,
            Subject::NodePair { .. } => SubjectKind::NodePair,
            Subject::Nic { .. } => SubjectKind::Nic,
        }
    }

    /// The node the subject is on (for a node pair, the first node).
    pub fn node_name(&self) -> &str {
        match self {
            Subject::Gpu { node, .. }
            | Subject::GpuPair { node, .. }
            | Subject::Node { node }
            | Subject::Nic { node, .. } => node,
            Subject::NodePair { a, .. } => a,
        }
    }

    /// The GPU of a GPU subject, or the first GPU of a GPU pair.
    pub fn gpu_index(&self) -> Option<u32> {
        match self {
            Subject::Gpu { gpu, .. } => Some(*gpu),
            Subject::GpuPair { a, .. } => Some(*a),
            _ => None,
        }
    }

    /// The second GPU of a GPU pair.
    pub fn peer_gpu_index(&self) -> Option<u32> {
        match self {
            Subject::GpuPair { b, .. } => Some(*b),
            _ => None,
        }
    }
}

impl std::fmt::Display for Subject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Subject::Gpu { node, gpu } => write!(f, "{node} GPU {gpu}"),
            Subject::GpuPair { node, a, b } => write!(f, "{node} GPU {a} <-> GPU {b}"),
            Subject::Node { node } => write!(f, "{node}"),
            Subject::NodePair { a, b } => write!(f, "{a} <-> {b}"),
            Subject::Nic { node, port } => write!(f, "{node} {port}"),
        }
    }
}

/// The smallest thing at fault: a GPU, a GPU pair of one node, a network port of a node,
/// a node, or a node pair.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "Subject")]
struct SubjectWire {
    kind: SubjectKind,
    /// The node (for a node pair, the first node).
    node: String,
    /// GPU index on the node (for a GPU pair, the first GPU).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    gpu: Option<u32>,
    /// Second GPU of a GPU pair.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    peer_gpu: Option<u32>,
    /// Second node of a node pair.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    peer_node: Option<String>,
    /// Network port, e.g. `mlx5_0 port 1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nic: Option<String>,
}

impl From<Subject> for SubjectWire {
    fn from(s: Subject) -> Self {
        let kind = s.kind();
        let (node, gpu, peer_gpu, peer_node, nic) = match s {
            Subject::Gpu { node, gpu } => (node, Some(gpu), None, None, None),
            Subject::GpuPair { node, a, b } => (node, Some(a), Some(b), None, None),
            Subject::Node { node } => (node, None, None, None, None),
            Subject::NodePair { a, b } => (a, None, None, Some(b), None),
            Subject::Nic { node, port } => (node, None, None, None, Some(port)),
        };
        SubjectWire {
            kind,
            node,
            gpu,
            peer_gpu,
            peer_node,
            nic,
        }
    }
}

/// A subject on the wire without a field its kind needs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a {kind:?} subject needs `{field}`")]
pub struct SubjectError {
    kind: SubjectKind,
    field: &'static str,
}

impl TryFrom<SubjectWire> for Subject {
    type Error = SubjectError;

    fn try_from(w: SubjectWire) -> Result<Self, SubjectError> {
        let kind = w.kind;
        let missing = |field: &'static str| SubjectError { kind, field };
        Ok(match w.kind {
            SubjectKind::Node => Subject::Node { node: w.node },
            SubjectKind::Gpu => Subject::Gpu {
                gpu: w.gpu.ok_or_else(|| missing("gpu"))?,
                node: w.node,
            },
            SubjectKind::GpuPair => Subject::GpuPair {
                a: w.gpu.ok_or_else(|| missing("gpu"))?,
                b: w.peer_gpu.ok_or_else(|| missing("peerGpu"))?,
                node: w.node,
            },
            SubjectKind::NodePair => Subject::NodePair {
                b: w.peer_node.ok_or_else(|| missing("peerNode"))?,
                a: w.node,
            },
            SubjectKind::Nic => Subject::Nic {
                port: w.nic.ok_or_else(|| missing("nic"))?,
                node: w.node,
            },
        })
    }
}

impl schemars::JsonSchema for Subject {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        SubjectWire::schema_name()
    }

    fn schema_id() -> std::borrow::Cow<'static, str> {
        SubjectWire::schema_id()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        SubjectWire::json_schema(generator)
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
    /// The median of the node's own earlier runs of the test.
    History,
    /// The test's baseline: its passing nodes of the same product, suite and NCCL settings
    /// in recent complete runs.
    Baseline,
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
    /// The GPU this finding puts at fault on its own, when it is a GPU-level fault that
    /// taking that one GPU out of service answers: a straggler, wrong results, slow compute
    /// or memory, or the GPU's NVLink. None for anything else (a pair, a node, a crash, a
    /// warning): those are the node's.
    pub fn faulty_gpu(&self) -> Option<u32> {
        let gpu_level = matches!(
            self.kind,
            FindingKind::Straggler
                | FindingKind::WrongResults
                | FindingKind::Slow
                | FindingKind::NvlinkDown
                | FindingKind::NvlinkErrors
                | FindingKind::NvlinkErrorsGrowing
        );
        match self.subject {
            Subject::Gpu { gpu, .. } if gpu_level && self.severity == Severity::Critical => {
                Some(gpu)
            }
            _ => None,
        }
    }

    /// A short word for the fault of a GPU-level finding, the value of its device taint.
    pub fn fault_word(&self) -> &'static str {
        match self.kind {
            FindingKind::Straggler => "straggler",
            FindingKind::WrongResults => "wrong-results",
            FindingKind::NvlinkDown
            | FindingKind::NvlinkErrors
            | FindingKind::NvlinkErrorsGrowing => "nvlink",
            _ => "slow",
        }
    }

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

    /// The finding about one collective (`c`).
    pub fn with_collective(self, c: Collective) -> Self {
        Finding {
            collective: Some(c),
            ..self
        }
    }

    /// The finding with its evidence: `measured` against `expected` in `unit`, the
    /// expectation from `source`; the deviation follows from the two ([`deviation`]).
    pub fn with_evidence(
        self,
        measured: f64,
        expected: f64,
        unit: &str,
        source: ExpectationSource,
    ) -> Self {
        Finding {
            measured: Some(measured),
            expected: Some(expected),
            deviation: deviation(measured, expected),
            unit: Some(unit.to_string()),
            source: Some(source),
            ..self
        }
    }
}

/// (measured - expected) / expected; none where it has no meaning (expected zero, or either
/// not finite).
pub fn deviation(measured: f64, expected: f64) -> Option<f64> {
    (expected != 0.0 && measured.is_finite() && expected.is_finite())
        .then(|| (measured - expected) / expected)
}

/// Sorts findings by node, subject, metric (then collective, kind, severity), so that the
/// same inputs always give the same list.
pub fn sort_findings(findings: &mut [Finding]) {
    findings.sort_by(|a, b| {
        (
            a.subject.node_name(),
            &a.subject,
            a.metric,
            a.collective,
            a.kind,
            a.severity,
        )
            .cmp(&(
                b.subject.node_name(),
                &b.subject,
                b.metric,
                b.collective,
                b.kind,
                b.severity,
            ))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_subject_keeps_its_flat_wire_form_and_reads_back() {
        let cases = [
            (Subject::node("n1"), r#"{"kind":"Node","node":"n1"}"#),
            (
                Subject::gpu("n1", 3),
                r#"{"kind":"Gpu","node":"n1","gpu":3}"#,
            ),
            (
                Subject::gpu_pair("n1", 0, 2),
                r#"{"kind":"GpuPair","node":"n1","gpu":0,"peerGpu":2}"#,
            ),
            (
                Subject::node_pair("n1", "n2"),
                r#"{"kind":"NodePair","node":"n1","peerNode":"n2"}"#,
            ),
            (
                Subject::nic("n1", "mlx5_0 port 1"),
                r#"{"kind":"Nic","node":"n1","nic":"mlx5_0 port 1"}"#,
            ),
        ];
        for (subject, wire) in cases {
            assert_eq!(serde_json::to_string(&subject).ok().as_deref(), Some(wire));
            let back: Subject = serde_json::from_str(wire).expect("reads back");
            assert_eq!(back, subject);
        }
    }

    #[test]
    fn a_subject_missing_the_field_its_kind_needs_is_refused() {
        for wire in [
            r#"{"kind":"Gpu","node":"n1"}"#,
            r#"{"kind":"GpuPair","node":"n1","gpu":0}"#,
            r#"{"kind":"NodePair","node":"n1"}"#,
            r#"{"kind":"Nic","node":"n1"}"#,
        ] {
            let err = serde_json::from_str::<Subject>(wire).expect_err(wire);
            assert!(err.to_string().contains("subject needs"), "{err}");
        }
    }

    #[test]
    fn subjects_sort_by_kind_then_node_then_gpus_as_the_flat_record_did() {
        let mut v = [
            Subject::node("b"),
            Subject::gpu_pair("a", 1, 2),
            Subject::gpu("b", 0),
            Subject::gpu("a", 7),
            Subject::nic("a", "p"),
            Subject::node_pair("a", "b"),
            Subject::node("a"),
            Subject::gpu_pair("a", 0, 3),
        ];
        v.sort();
        let shown: Vec<String> = v.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "a GPU 7",
                "b GPU 0",
                "a GPU 0 <-> GPU 3",
                "a GPU 1 <-> GPU 2",
                "a",
                "b",
                "a <-> b",
                "a p"
            ]
        );
    }

    #[test]
    fn evidence_carries_the_deviation_only_where_it_means_something() {
        let f = |measured, expected| {
            Finding::new(
                FindingKind::Slow,
                Subject::node("n1"),
                Metric::NcclBusBw,
                Severity::Critical,
                "slow".into(),
            )
            .with_evidence(measured, expected, "GB/s", ExpectationSource::Fleet)
        };
        let slow = f(150.0, 200.0);
        assert_eq!(slow.measured, Some(150.0));
        assert_eq!(slow.expected, Some(200.0));
        assert_eq!(slow.deviation, Some(-0.25));
        assert_eq!(slow.unit.as_deref(), Some("GB/s"));
        assert_eq!(slow.source, Some(ExpectationSource::Fleet));
        assert_eq!(f(3.0, 0.0).deviation, None);
        assert_eq!(f(f64::NAN, 1.0).deviation, None);
    }
}
