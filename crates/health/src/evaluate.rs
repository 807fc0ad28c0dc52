//! Run results to findings and per-node verdicts: per-node rules (hardware counters,
//! wrong results, phase errors, GPU pairs, stragglers, explicit thresholds and GPU
//! profiles), then the fleet comparison of comparable nodes.

use gpufabric_api::counters::CounterBaseline;
use gpufabric_api::findings::{
    ExpectationSource, Finding, FindingKind, Metric, Severity, Subject, deviation,
};
use gpufabric_api::outcome::HardwareFault;
pub use gpufabric_api::outcome::NodeOutcome;
use gpufabric_api::policy::Thresholds;
use gpufabric_api::result::{CompactResult, Phase, Transport};
use gpufabric_api::run::NodeVerdict;
use gpufabric_api::trend::TrendPoint;
use std::collections::BTreeMap;

pub mod baseline;
mod classify;
mod compare;
mod compute;
pub mod counters;
mod direction;
mod gpu_pairs;
mod hardware;
mod node;
mod perf;
pub mod software;
mod stats;
pub mod trend;
pub mod tuning;

pub use baseline::{Against, NodeSeries};
use compare::compare_fleet;
use node::judge_node;

/// One node of a finished run, as the operator saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeInput {
    pub node: String,
    /// `nvidia.com/gpu.product` label, if any.
    pub product_label: Option<String>,
    /// GPUs the node advertises (`nvidia.com/gpu.count` label, or the `nvidia.com/gpu`
    /// capacity), if known. Fewer measured GPUs is a GpuMismatch finding.
    pub expected_gpus: Option<u32>,
    pub outcome: NodeOutcome,
    /// The node's error counters at its previous measured run, if recorded: their growth
    /// is judged (NVLink errors grow on a marginal link).
    pub baseline: Option<CounterBaseline>,
    /// The node's earlier runs of this test with this suite, oldest first: a passing node
    /// is judged against them ([`trend`]).
    pub history: Vec<TrendPoint>,
    /// The NCCL tuning variables the test's spec set ([`tuning`]): a slow collective against
    /// a fixed expectation fails no node then. Settings from anywhere else reach the rules in
    /// the result (`settings_not_chosen`) and spare nothing.
    pub nccl_tuning: Vec<String>,
}

impl NodeInput {
    /// A node with a usable result and no labels.
    pub fn measured(result: CompactResult) -> Self {
        NodeInput {
            node: result.node.clone(),
            product_label: None,
            expected_gpus: None,
            outcome: NodeOutcome::Measured(Box::new(result)),
            baseline: None,
            history: Vec::new(),
            nccl_tuning: Vec::new(),
        }
    }
}

/// Findings of a run and the verdict on each node.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Evaluation {
    /// Sorted by node, subject, metric.
    pub findings: Vec<Finding>,
    pub verdicts: BTreeMap<String, NodeVerdict>,
    /// The numbers the baseline keeps of each node that passed ([`baseline::sample`] makes a
    /// run's numbers of those the caller lets feed it).
    pub series: BTreeMap<String, NodeSeries>,
}

impl Evaluation {
    /// The findings on one node.
    pub fn findings_of<'a>(&'a self, node: &'a str) -> impl Iterator<Item = &'a Finding> + 'a {
        self.findings
            .iter()
            .filter(move |f| f.subject.node_name() == node)
    }

    /// Critical findings on one node.
    pub fn critical_count(&self, node: &str) -> u32 {
        self.findings_of(node)
            .filter(|f| f.severity == Severity::Critical)
            .count() as u32
    }
}

/// The most telling finding about each node, the one its history and its run entry name:
/// the most severe, then the kind that says most about the node ([`kind_rank`]), then the
/// first listed.
pub fn worst_per_node(findings: &[Finding]) -> BTreeMap<&str, &Finding> {
    let telling = |f: &Finding| (std::cmp::Reverse(f.severity), kind_rank(f.kind));
    let mut worst: BTreeMap<&str, &Finding> = BTreeMap::new();
    for f in findings {
        let node = f.subject.node_name();
        if worst.get(node).is_none_or(|w| telling(f) < telling(w)) {
            worst.insert(node, f);
        }
    }
    worst
}

/// How much a kind of finding says about a node, most telling first.
fn kind_rank(kind: FindingKind) -> u8 {
    match kind {
        FindingKind::Crash => 0,
        FindingKind::Timeout => 1,
        FindingKind::Errored => 2,
        FindingKind::GpuMismatch => 3,
        FindingKind::Xid => 4,
        FindingKind::EccUncorrectable => 5,
        FindingKind::RowRemap => 6,
        FindingKind::NvlinkDown => 7,
        FindingKind::WrongResults => 8,
        FindingKind::NvlinkErrorsGrowing => 8,
        FindingKind::NvlinkErrors => 9,
        FindingKind::NicDown => 10,
        FindingKind::PcieDegraded => 10,
        FindingKind::NicDegraded => 11,
        FindingKind::TransportFallback => 11,
        FindingKind::NicErrors => 12,
        FindingKind::Straggler => 12,
        FindingKind::Slow => 13,
        FindingKind::Thermal => 14,
        FindingKind::Drifting => 15,
        FindingKind::SoftwareDrift => 16,
    }
}

/// Most GPUs a result may claim; more means the document is corrupt (and per-pair work
/// would grow with the square of the claim).
pub const MAX_GPUS_PER_NODE: u32 = 64;

/// Judges every node of a run. See the crate docs for the rules.
pub fn evaluate(nodes: &[NodeInput], thresholds: &Thresholds) -> Evaluation {
    evaluate_against(nodes, thresholds, None)
}

/// Judges every node of a run, and a node without enough peers in it against the test's
/// baseline when there is one to read (rules in [`baseline`]).
pub fn evaluate_against(
    nodes: &[NodeInput],
    thresholds: &Thresholds,
    against: Option<&Against<'_>>,
) -> Evaluation {
    let mut findings = Vec::new();
    let mut verdicts = BTreeMap::new();
    let mut stats = Vec::new();
    let mut series = BTreeMap::new();
    for input in nodes {
        let verdict = match &input.outcome {
            NodeOutcome::Measured(r) if r.gpus == 0 || r.gpus > MAX_GPUS_PER_NODE => {
                // A document no agent writes: the agent is at fault, not the node.
                findings.push(finding(
                    FindingKind::Errored,
                    Subject::node(&input.node),
                    Metric::GpuCount,
                    Severity::Info,
                    format!(
                        "The result of {} claims {} GPUs, which no node has (at most {MAX_GPUS_PER_NODE}); the result is corrupt and the node was not measured: read the full result on the last line of the pod log.",
                        input.node, r.gpus
                    ),
                ));
                NodeVerdict::NotMeasured
            }
            NodeOutcome::Measured(r) => {
                let mut own = Vec::new();
                let s = judge_node(input, r, thresholds, &mut own);
                series.insert(input.node.clone(), baseline::series_of(&s, r));
                let not_chosen = tuning::not_chosen(&input.node, &r.settings_not_chosen, &own);
                tuning::spare_tuned(&mut own, &input.nccl_tuning);
                own.extend(not_chosen);
                let failed = own.iter().any(|f| f.severity == Severity::Critical);
                stats.push((s, own.clone()));
                findings.extend(own);
                if failed {
                    NodeVerdict::Failed
                } else {
                    NodeVerdict::Passed
                }
            }
            NodeOutcome::HardwareFault { fault, detail } => {
                findings.push(hardware_fault_finding(&input.node, *fault, detail));
                // Timeout for a hang, Errored for any other fault: the rule the run entry
                // records before any evaluation.
                NodeVerdict::provisional(&input.outcome)
            }
            NodeOutcome::NotMeasured { .. } => NodeVerdict::NotMeasured,
        };
        verdicts.insert(input.node.clone(), verdict);
    }

    let mut fleet_findings = compare_fleet(&stats, thresholds);
    fleet_findings.extend(baseline_findings(&stats, &series, against, thresholds));
    for f in &fleet_findings {
        if f.severity == Severity::Critical {
            verdicts.insert(f.subject.node_name().to_string(), NodeVerdict::Failed);
        }
    }
    findings.extend(fleet_findings);
    series.retain(|node, _| verdicts.get(node) == Some(&NodeVerdict::Passed));
    findings.extend(drift_findings(nodes, &verdicts, thresholds));
    findings.extend(software_findings(nodes));
    sort_findings(&mut findings);
    Evaluation {
        findings,
        verdicts,
        series,
    }
}

/// Each node with fewer comparable nodes in its run than the fleet comparison needs,
/// against the baseline (rules in [`baseline`]); what its own findings already explain is
/// not reported again.
fn baseline_findings(
    stats: &[(stats::NodeStats, Vec<Finding>)],
    series: &BTreeMap<String, NodeSeries>,
    against: Option<&Against<'_>>,
    t: &Thresholds,
) -> Vec<Finding> {
    let Some(against) = against else {
        return Vec::new();
    };
    let mut sizes: BTreeMap<&(String, u32), usize> = BTreeMap::new();
    for (s, _) in stats {
        *sizes.entry(&s.group).or_default() += 1;
    }
    let mut out = Vec::new();
    for (s, own) in stats {
        if sizes.get(&s.group).copied().unwrap_or(0) >= baseline::peers_needed(t) {
            continue;
        }
        let Some(mine) = series.get(&s.node) else {
            continue;
        };
        let mut all = own.clone();
        all.extend(baseline::judge(s, mine, own, against, t));
        node::drop_explained_slowness(&mut all);
        out.extend(
            all.into_iter()
                .filter(|f| f.source == Some(ExpectationSource::Baseline) || !own.contains(f)),
        );
    }
    out
}

/// Each passing node against its own earlier runs (rules in [`trend`]).
fn drift_findings(
    nodes: &[NodeInput],
    verdicts: &BTreeMap<String, NodeVerdict>,
    t: &Thresholds,
) -> Vec<Finding> {
    let judged: Vec<trend::Judged<'_>> = nodes
        .iter()
        .filter(|i| verdicts.get(&i.node) == Some(&NodeVerdict::Passed))
        .filter_map(|i| {
            let NodeOutcome::Measured(r) = &i.outcome else {
                return None;
            };
            let now = TrendPoint::of(r, 0);
            let metrics = trend::judgeable(&i.history, &now, &t.trend);
            let drifts = trend::drifts(&i.history, &now, &t.trend);
            Some((i.node.as_str(), metrics, drifts))
        })
        .collect();
    trend::findings(&judged, t)
}

/// Each measured node's software against its run's majority (rules in [`software`]).
fn software_findings(nodes: &[NodeInput]) -> Vec<Finding> {
    let boards: Vec<(&str, String, u32, &CompactResult)> = nodes
        .iter()
        .filter_map(|i| match &i.outcome {
            NodeOutcome::Measured(r) if r.gpus > 0 && r.gpus <= MAX_GPUS_PER_NODE => {
                let product = if r.product.trim().is_empty() {
                    i.product_label.as_deref().unwrap_or_default()
                } else {
                    r.product.as_str()
                };
                Some((
                    i.node.as_str(),
                    crate::profiles::normalize(product),
                    r.gpus,
                    &**r,
                ))
            }
            _ => None,
        })
        .collect();
    let nodes: Vec<software::NodeSoftware<'_>> = boards
        .iter()
        .map(|(node, product, gpus, r)| software::NodeSoftware {
            node,
            board: (product.as_str(), *gpus),
            software: &r.software,
        })
        .collect();
    software::drift(&nodes)
}

/// The finding for a hardware fault the agent saw instead of a result.
fn hardware_fault_finding(node: &str, fault: HardwareFault, detail: &str) -> Finding {
    let (kind, message) = match fault {
        HardwareFault::Hang => (
            FindingKind::Timeout,
            format!(
                "The check on {node} hung: {detail}. A hung collective or copy points at NVLink or the GPU; raise agent.timeoutSeconds only if the suite is simply long."
            ),
        ),
        HardwareFault::GpuMissing => (
            FindingKind::Crash,
            format!(
                "The agent on {node} found fewer GPUs than the node advertises: {detail}. Check nvidia-smi and the node's kernel log (dmesg) for a GPU that fell off the bus."
            ),
        ),
        HardwareFault::GpuUnusable | HardwareFault::Crash => (
            FindingKind::Crash,
            format!(
                "The agent crashed on {node} without a result: {detail}. Read the pod log and the node's kernel log (dmesg) for XID errors."
            ),
        ),
    };
    finding(
        kind,
        Subject::node(node),
        Metric::AgentExit,
        Severity::Critical,
        message,
    )
}

pub use gpufabric_api::findings::sort_findings;

// ---------------------------------------------------------------------------------------
// Building findings
// ---------------------------------------------------------------------------------------

fn finding(
    kind: FindingKind,
    subject: Subject,
    metric: Metric,
    severity: Severity,
    message: String,
) -> Finding {
    Finding {
        // Fixed rules unless the caller says otherwise (`with_evidence` always does).
        source: Some(ExpectationSource::Rule),
        ..Finding::new(kind, subject, metric, severity, message)
    }
}

/// A bandwidth or time for a sentence: no decimals from 100 up, one below.
fn tenths_below_100(x: f64) -> String {
    if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

/// "49% below" / "31% above".
pub(crate) fn how_far(measured: f64, expected: f64) -> String {
    let d = deviation(measured, expected).unwrap_or(0.0);
    let pct = (d.abs() * 100.0).round();
    if d < 0.0 {
        format!("{pct:.0}% below")
    } else {
        format!("{pct:.0}% above")
    }
}

fn source_words(source: ExpectationSource, what: &str) -> String {
    match source {
        ExpectationSource::Threshold => format!("the spec's threshold for {what}"),
        ExpectationSource::Profile => format!("the GPU profile's floor for {what}"),
        ExpectationSource::Fleet => format!("comparable nodes' {what}"),
        ExpectationSource::Node => format!("the node's other {what}"),
        ExpectationSource::Rule => what.to_string(),
        ExpectationSource::History => format!("the node's own earlier {what}"),
        ExpectationSource::Baseline => format!("the test's baseline for {what}"),
    }
}

fn transport_name(t: Transport) -> &'static str {
    match t {
        Transport::Nvlink => "NVLink",
        Transport::Pcie => "PCIe",
        Transport::Shm => "host shared memory",
        Transport::Net => "the network",
        Transport::Unknown => "an unknown transport",
    }
}

fn phase_name(p: Phase) -> &'static str {
    match p {
        Phase::Setup => "setup",
        Phase::Health => "health",
        Phase::NcclSweep => "NCCL sweep",
        Phase::GpuPairs => "GPU-pair copy",
        Phase::DdpProbe => "DDP probe",
        Phase::NodePair => "node-pair",
        Phase::Compute => "compute",
    }
}

fn phase_metric(p: Phase) -> Metric {
    match p {
        Phase::Setup | Phase::NodePair | Phase::Health => Metric::AgentExit,
        Phase::NcclSweep => Metric::NcclBusBw,
        Phase::GpuPairs => Metric::PairBandwidth,
        Phase::DdpProbe => Metric::DdpScalingEfficiency,
        Phase::Compute => Metric::GemmThroughput,
    }
}

#[cfg(test)]
mod tests;
