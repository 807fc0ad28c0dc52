//! Run results to findings and per-node verdicts: per-node rules (hardware counters,
//! wrong results, phase errors, GPU pairs, stragglers, explicit thresholds and GPU
//! profiles), then the fleet comparison of comparable nodes.

use crate::fleet::{self, Better, Rule};
use crate::profiles::{self, Expectations};
use gpufabric_api::SubjectKind;
use gpufabric_api::findings::{ExpectationSource, Finding, FindingKind, Metric, Severity, Subject};
use gpufabric_api::policy::Thresholds;
use gpufabric_api::result::{CompactResult, ErrorKind, Phase, Transport};
use gpufabric_api::run::NodeVerdict;
use gpufabric_api::suite::Collective;
use std::collections::{BTreeMap, BTreeSet};

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
}

impl NodeInput {
    /// A node with a usable result and no labels.
    pub fn measured(result: CompactResult) -> Self {
        NodeInput {
            node: result.n.clone(),
            product_label: None,
            expected_gpus: None,
            outcome: NodeOutcome::Measured(result),
        }
    }
}

/// What came back from a node.
// A run holds one outcome per node, most of them measured: boxing the result would only
// add an allocation per node.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum NodeOutcome {
    Measured(CompactResult),
    /// The agent exited non-zero or was killed without a usable result.
    Crashed {
        exit_code: Option<i32>,
        reason: String,
    },
    /// The pod or the run ran past its deadline.
    TimedOut {
        reason: String,
    },
    /// The result was missing, truncated or malformed.
    Errored {
        reason: String,
    },
}

/// Findings of a run and the verdict on each node.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Evaluation {
    /// Sorted by node, subject, metric.
    pub findings: Vec<Finding>,
    pub verdicts: BTreeMap<String, NodeVerdict>,
}

impl Evaluation {
    /// The findings on one node.
    pub fn findings_of<'a>(&'a self, node: &'a str) -> impl Iterator<Item = &'a Finding> + 'a {
        self.findings.iter().filter(move |f| f.subject.node == node)
    }

    /// Critical findings on one node.
    pub fn critical_count(&self, node: &str) -> u32 {
        self.findings_of(node)
            .filter(|f| f.severity == Severity::Critical)
            .count() as u32
    }

    /// The most severe finding on a node, as its sentence (for `NodeHealth.last_finding`).
    pub fn headline(&self, node: &str) -> Option<String> {
        self.findings_of(node)
            .min_by_key(|f| (std::cmp::Reverse(f.severity), kind_rank(f.kind)))
            .map(|f| f.message.clone())
    }
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
        FindingKind::NvlinkErrors => 9,
        FindingKind::PcieDegraded => 10,
        FindingKind::TransportFallback => 11,
        FindingKind::Straggler => 12,
        FindingKind::Slow => 13,
        FindingKind::Thermal => 14,
    }
}

/// Most GPUs a result may claim; more means the document is corrupt (and per-pair work
/// would grow with the square of the claim).
pub const MAX_GPUS_PER_NODE: u32 = 64;

/// Judges every node of a run. See the crate docs for the rules.
pub fn evaluate(nodes: &[NodeInput], thresholds: &Thresholds) -> Evaluation {
    let mut findings = Vec::new();
    let mut verdicts = BTreeMap::new();
    let mut stats = Vec::new();
    for input in nodes {
        let verdict = match &input.outcome {
            NodeOutcome::Measured(r) if r.g == 0 || r.g > MAX_GPUS_PER_NODE => {
                findings.push(finding(
                    FindingKind::Errored,
                    Subject::node(&input.node),
                    Metric::GpuCount,
                    Severity::Critical,
                    format!(
                        "The result of {} claims {} GPUs, which no node has (at most {MAX_GPUS_PER_NODE}); the result is corrupt: read the full result on the last line of the pod log.",
                        input.node, r.g
                    ),
                ));
                NodeVerdict::Errored
            }
            NodeOutcome::Measured(r) => {
                let mut own = Vec::new();
                let s = judge_node(input, r, thresholds, &mut own);
                let failed = own.iter().any(|f| f.severity == Severity::Critical);
                stats.push((s, own.clone()));
                findings.extend(own);
                if failed {
                    NodeVerdict::Failed
                } else {
                    NodeVerdict::Passed
                }
            }
            NodeOutcome::Crashed { exit_code, reason } => {
                let code = exit_code
                    .map(|c| format!("exit code {c}"))
                    .unwrap_or_else(|| "no exit code".into());
                findings.push(Finding {
                    measured: exit_code.map(f64::from),
                    source: Some(ExpectationSource::Rule),
                    ..finding(
                        FindingKind::Crash,
                        Subject::node(&input.node),
                        Metric::AgentExit,
                        Severity::Critical,
                        format!(
                            "The agent crashed on {} ({code}) without a result: {reason}. Read the pod log and the node's kernel log (dmesg) for XID errors.",
                            input.node
                        ),
                    )
                });
                NodeVerdict::Errored
            }
            NodeOutcome::TimedOut { reason } => {
                findings.push(finding(
                    FindingKind::Timeout,
                    Subject::node(&input.node),
                    Metric::AgentExit,
                    Severity::Critical,
                    format!(
                        "The check on {} did not finish in time: {reason}. A hung collective or copy points at NVLink or the GPU; raise agent.timeoutSeconds only if the suite is simply long.",
                        input.node
                    ),
                ));
                NodeVerdict::Timeout
            }
            NodeOutcome::Errored { reason } => {
                findings.push(finding(
                    FindingKind::Errored,
                    Subject::node(&input.node),
                    Metric::AgentExit,
                    Severity::Critical,
                    format!(
                        "The result of {} could not be used: {reason}. Read the full result on the last line of the pod log.",
                        input.node
                    ),
                ));
                NodeVerdict::Errored
            }
        };
        verdicts.insert(input.node.clone(), verdict);
    }

    let fleet_findings = compare_fleet(&stats, thresholds);
    for f in &fleet_findings {
        if f.severity == Severity::Critical {
            verdicts.insert(f.subject.node.clone(), NodeVerdict::Failed);
        }
    }
    findings.extend(fleet_findings);
    sort_findings(&mut findings);
    Evaluation { findings, verdicts }
}

/// Sorts findings by node, subject, metric (then collective, kind, severity), so that the
/// same inputs always give the same list.
pub fn sort_findings(findings: &mut [Finding]) {
    findings.sort_by(|a, b| {
        (
            &a.subject.node,
            &a.subject,
            a.metric,
            a.collective,
            a.kind,
            a.severity,
        )
            .cmp(&(
                &b.subject.node,
                &b.subject,
                b.metric,
                b.collective,
                b.kind,
                b.severity,
            ))
    });
}

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
        kind,
        subject,
        metric,
        collective: None,
        measured: None,
        expected: None,
        deviation: None,
        unit: None,
        // Fixed rules unless the caller says otherwise (evidence() always does).
        source: Some(ExpectationSource::Rule),
        severity,
        message,
    }
}

/// A finding with evidence: measured against expected, in `unit`, from `source`.
#[allow(clippy::too_many_arguments)]
fn evidence(
    kind: FindingKind,
    subject: Subject,
    metric: Metric,
    measured: f64,
    expected: f64,
    unit: &str,
    source: ExpectationSource,
    severity: Severity,
    message: String,
) -> Finding {
    Finding {
        measured: Some(measured),
        expected: Some(expected),
        deviation: deviation(measured, expected),
        unit: Some(unit.to_string()),
        source: Some(source),
        ..finding(kind, subject, metric, severity, message)
    }
}

fn deviation(measured: f64, expected: f64) -> Option<f64> {
    (expected != 0.0 && measured.is_finite() && expected.is_finite())
        .then(|| (measured - expected) / expected)
}

/// A bandwidth or time for a sentence: no decimals from 100 up, one below.
fn num(x: f64) -> String {
    if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

/// "49% below" / "31% above".
fn how_far(measured: f64, expected: f64) -> String {
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
    }
}

fn collective_name(c: Collective) -> &'static str {
    match c {
        Collective::AllReduce => "all_reduce",
        Collective::AllGather => "all_gather",
        Collective::ReduceScatter => "reduce_scatter",
        Collective::Broadcast => "broadcast",
        Collective::Reduce => "reduce",
        Collective::AllToAll => "alltoall",
        Collective::SendRecv => "sendrecv",
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
    }
}

fn phase_metric(p: Phase) -> Metric {
    match p {
        Phase::Setup | Phase::NodePair | Phase::Health => Metric::AgentExit,
        Phase::NcclSweep => Metric::NcclBusBw,
        Phase::GpuPairs => Metric::PairBandwidth,
        Phase::DdpProbe => Metric::DdpScalingEfficiency,
    }
}

// ---------------------------------------------------------------------------------------
// One node
// ---------------------------------------------------------------------------------------

/// A value of one node that the fleet comparison looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct SeriesKey {
    metric: Metric,
    collective: Option<Collective>,
    gpu: Option<u32>,
}

/// What the fleet comparison needs from one measured node.
#[derive(Debug)]
struct NodeStats {
    node: String,
    /// Normalized product and GPU count: nodes compare only within the same group.
    group: (String, u32),
    product: String,
    values: BTreeMap<SeriesKey, f64>,
    /// Series already judged on this node by a threshold or a profile floor.
    judged: BTreeSet<SeriesKey>,
}

fn judge_node(
    input: &NodeInput,
    r: &CompactResult,
    t: &Thresholds,
    out: &mut Vec<Finding>,
) -> NodeStats {
    let node = input.node.as_str();
    let product = if r.p.trim().is_empty() {
        input.product_label.clone().unwrap_or_default()
    } else {
        r.p.clone()
    };
    let exp = profiles::expectations(&product, r.g);
    let mut stats = NodeStats {
        node: node.to_string(),
        group: (profiles::normalize(&product), r.g),
        product: product.clone(),
        values: BTreeMap::new(),
        judged: BTreeSet::new(),
    };

    check_identity(input, r, exp.as_ref(), out);
    check_phase_errors(node, r, out);
    check_health(node, r, t, exp.as_ref(), out);
    check_wrong_results(node, r, out);
    check_transports(node, r, exp.as_ref(), out);
    check_nccl(node, r, t, exp.as_ref(), &mut stats, out);
    check_pairs(node, r, t, exp.as_ref(), &mut stats, out);
    check_host(node, r, t, exp.as_ref(), &mut stats, out);
    check_ddp(node, r, t, &mut stats, out);
    drop_explained_slowness(out);
    stats
}

/// Drops Slow findings that a finding of a smaller or more specific part already explains:
/// pairs of a GPU with NVLink links down or NCCL falling back from NVLink, pairs that fell
/// back themselves, host bandwidth of a GPU whose PCIe link is degraded (those faults are
/// findings of their own kinds and are never reported as Slow as well), and node-wide
/// collective or DDP slowness on a node with a critical finding on a GPU or GPU pair.
fn drop_explained_slowness(out: &mut Vec<Finding>) {
    let critical = |f: &&Finding, kinds: &[FindingKind]| {
        f.severity == Severity::Critical && kinds.contains(&f.kind)
    };
    let link_gpus: BTreeSet<u32> = out
        .iter()
        .filter(|f| {
            critical(
                f,
                &[FindingKind::NvlinkDown, FindingKind::TransportFallback],
            )
        })
        .filter(|f| f.subject.kind == SubjectKind::Gpu)
        .filter_map(|f| f.subject.gpu)
        .collect();
    let link_pairs: BTreeSet<(u32, u32)> = out
        .iter()
        .filter(|f| critical(f, &[FindingKind::TransportFallback]))
        .filter(|f| f.subject.kind == SubjectKind::GpuPair)
        .filter_map(|f| f.subject.gpu.zip(f.subject.peer_gpu))
        .collect();
    let link_node = out.iter().any(|f| {
        critical(&f, &[FindingKind::TransportFallback]) && f.subject.kind == SubjectKind::Node
    });
    let pcie_gpus: BTreeSet<u32> = out
        .iter()
        .filter(|f| critical(f, &[FindingKind::PcieDegraded]))
        .filter_map(|f| f.subject.gpu)
        .collect();
    let part_at_fault = out.iter().any(|f| {
        f.severity == Severity::Critical
            && matches!(f.subject.kind, SubjectKind::Gpu | SubjectKind::GpuPair)
    });
    out.retain(|f| {
        if f.kind != FindingKind::Slow {
            return true;
        }
        let s = &f.subject;
        let explained = match f.metric {
            // Node-wide collectives and DDP are as slow as their slowest GPU or link: when
            // one is named, the node-wide symptom is not (unless the spec set the floor).
            Metric::NcclBusBw
            | Metric::NcclLatency
            | Metric::DdpScalingEfficiency
            | Metric::DdpComputeTime => {
                s.kind == SubjectKind::Node
                    && part_at_fault
                    && f.source != Some(ExpectationSource::Threshold)
            }
            Metric::PairBandwidth | Metric::PairBidirBandwidth => match (s.kind, s.gpu, s.peer_gpu)
            {
                (SubjectKind::Gpu, Some(g), _) => link_gpus.contains(&g),
                (SubjectKind::GpuPair, Some(a), Some(b)) => {
                    link_gpus.contains(&a)
                        || link_gpus.contains(&b)
                        || link_pairs.contains(&(a.min(b), a.max(b)))
                }
                (SubjectKind::Node, _, _) => link_node,
                _ => false,
            },
            Metric::H2dBandwidth | Metric::D2hBandwidth => {
                s.gpu.is_some_and(|g| pcie_gpus.contains(&g))
            }
            _ => false,
        };
        !explained
    });
}

fn check_identity(
    input: &NodeInput,
    r: &CompactResult,
    exp: Option<&Expectations>,
    out: &mut Vec<Finding>,
) {
    let node = input.node.as_str();
    if let Some(expected) = input.expected_gpus
        && r.g < expected
    {
        out.push(evidence(
            FindingKind::GpuMismatch,
            Subject::node(node),
            Metric::GpuCount,
            f64::from(r.g),
            f64::from(expected),
            "GPUs",
            ExpectationSource::Rule,
            Severity::Critical,
            format!(
                "{node} advertises {expected} GPUs but the check saw {}: a GPU fell off the bus or failed to initialise; check nvidia-smi and dmesg for XID 79 and drain the node.",
                r.g
            ),
        ));
    } else if input.expected_gpus.is_none()
        && let Some(e) = exp
        && !e.profile.is_board_count(r.g)
    {
        out.push(evidence(
            FindingKind::GpuMismatch,
            Subject::node(node),
            Metric::GpuCount,
            f64::from(r.g),
            f64::from(e.profile.switched_gpus),
            "GPUs",
            ExpectationSource::Profile,
            Severity::Info,
            format!(
                "{node} has {} {} GPUs, not a board size this product ships with ({:?}); if a GPU is missing, check nvidia-smi and dmesg.",
                r.g, e.profile.product, e.profile.board_gpus
            ),
        ));
    }
    if let Some(label) = &input.product_label
        && !r.p.trim().is_empty()
        && profiles::normalize(label) != profiles::normalize(&r.p)
    {
        out.push(finding(
            FindingKind::GpuMismatch,
            Subject::node(node),
            Metric::GpuCount,
            Severity::Info,
            format!(
                "{node} is labelled nvidia.com/gpu.product={label} but its GPUs report {}; the label is stale (restart GPU feature discovery on the node).",
                r.p
            ),
        ));
    }
}

fn check_phase_errors(node: &str, r: &CompactResult, out: &mut Vec<Finding>) {
    for e in &r.e {
        let phase = phase_name(e.phase);
        let (kind, severity, message) = match e.kind {
            ErrorKind::Timeout => (
                FindingKind::Timeout,
                Severity::Critical,
                format!(
                    "The {phase} phase on {node} hung and was aborted by its watchdog ({}); a hang points at NVLink, the NVSwitch or a GPU: check dmesg for XIDs and nvidia-smi nvlink -s.",
                    e.message
                ),
            ),
            ErrorKind::Failed => (
                FindingKind::Errored,
                Severity::Critical,
                format!(
                    "The {phase} phase on {node} failed ({}); read the pod log, and dmesg for XIDs.",
                    e.message
                ),
            ),
            ErrorKind::Unavailable => (
                FindingKind::Errored,
                Severity::Info,
                format!(
                    "The {phase} phase could not run on {node} ({}); its metrics were not checked.",
                    e.message
                ),
            ),
        };
        out.push(Finding {
            source: Some(ExpectationSource::Rule),
            ..finding(
                kind,
                Subject::node(node),
                phase_metric(e.phase),
                severity,
                message,
            )
        });
    }
}

fn check_health(
    node: &str,
    r: &CompactResult,
    t: &Thresholds,
    exp: Option<&Expectations>,
    out: &mut Vec<Finding>,
) {
    for (i, h) in r.h.iter().take(r.g as usize).enumerate() {
        let gpu = i as u32;
        let subject = || Subject::gpu(node, gpu);
        let (active, expected) = h.l;
        if active < expected {
            out.push(evidence(
                FindingKind::NvlinkDown,
                subject(),
                Metric::NvlinkLinks,
                f64::from(active),
                f64::from(expected),
                "links",
                ExpectationSource::Rule,
                Severity::Critical,
                format!(
                    "GPU {gpu} on {node} has {active} of {expected} NVLink links up; reseat or replace the GPU or baseboard (nvidia-smi nvlink -s -i {gpu} shows which links are down)."
                ),
            ));
        }
        if h.le > 0 {
            out.push(evidence(
                FindingKind::NvlinkErrors,
                subject(),
                Metric::NvlinkErrors,
                h.le as f64,
                0.0,
                "errors",
                ExpectationSource::Rule,
                Severity::Info,
                format!(
                    "GPU {gpu} on {node} has counted {} NVLink replay, recovery or CRC errors since the driver loaded; if the count grows between runs a link is marginal: check nvidia-smi nvlink -e -i {gpu}.",
                    h.le
                ),
            ));
        }
        if !h.x.is_empty() {
            let list: Vec<String> = h.x.iter().map(u64::to_string).collect();
            out.push(evidence(
                FindingKind::Xid,
                subject(),
                Metric::Xid,
                h.x.len() as f64,
                0.0,
                "events",
                ExpectationSource::Rule,
                Severity::Critical,
                format!(
                    "GPU {gpu} on {node} raised XID {} during the check; look the code up in NVIDIA's XID catalogue and drain the node for a GPU reset or replacement.",
                    list.join(", ")
                ),
            ));
        }
        if h.ec > 0 {
            out.push(evidence(
                FindingKind::EccUncorrectable,
                subject(),
                Metric::EccUncorrected,
                h.ec as f64,
                0.0,
                "errors",
                ExpectationSource::Rule,
                Severity::Critical,
                format!(
                    "GPU {gpu} on {node} has {} uncorrectable ECC errors; its memory is corrupting data: drain the node and reset or replace the GPU.",
                    h.ec
                ),
            ));
        }
        if h.rr & 2 != 0 {
            out.push(finding(
                FindingKind::RowRemap,
                subject(),
                Metric::RemappedRows,
                Severity::Critical,
                format!(
                    "GPU {gpu} on {node} failed to remap a memory row: it has no spare rows left; replace the GPU."
                ),
            ));
        } else if h.rr & 1 != 0 {
            out.push(finding(
                FindingKind::RowRemap,
                subject(),
                Metric::RemappedRows,
                Severity::Critical,
                format!(
                    "GPU {gpu} on {node} has a memory row remap pending; drain the node and reset the GPU to apply it."
                ),
            ));
        }
        let (gen_now, gen_max, width_now, width_max) = h.pc;
        if width_now < width_max {
            out.push(evidence(
                FindingKind::PcieDegraded,
                subject(),
                Metric::PcieLink,
                f64::from(width_now),
                f64::from(width_max),
                "lanes",
                ExpectationSource::Rule,
                Severity::Critical,
                format!(
                    "GPU {gpu} on {node} runs its PCIe link at x{width_now}, below its maximum x{width_max} (Gen{gen_now} of Gen{gen_max}); reseat the GPU or its riser and check the slot."
                ),
            ));
        } else if gen_now < gen_max {
            // NVML reports the current generation, which an idle GPU lowers to save power:
            // only host copies slower than the maximum link could carry confirm a fault.
            let best_host = [r.hd.get(i), r.dh.get(i)]
                .into_iter()
                .flatten()
                .copied()
                .filter(|v| *v > 0.0)
                .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
            let link = profiles::pcie_x16_gbps(gen_max)
                .map(|g| g * f64::from(width_max) / 16.0 * profiles::FLOOR_FRACTION);
            let confirmed = matches!((best_host, link), (Some(b), Some(l)) if b < l);
            let (severity, why) = if confirmed {
                (
                    Severity::Critical,
                    format!(
                        "host copies reach only {} GB/s; reseat the GPU or its riser and check the slot's BIOS link speed",
                        num(best_host.unwrap_or(0.0))
                    ),
                )
            } else {
                (
                    Severity::Info,
                    "host copies are not slow, so the GPU may simply have lowered its link speed while idle".to_string(),
                )
            };
            out.push(evidence(
                FindingKind::PcieDegraded,
                subject(),
                Metric::PcieLink,
                f64::from(gen_now),
                f64::from(gen_max),
                "generation",
                ExpectationSource::Rule,
                severity,
                format!(
                    "GPU {gpu} on {node} reported its PCIe link at Gen{gen_now}, below its maximum Gen{gen_max}; {why}."
                ),
            ));
        } else if let Some(e) = exp
            && gen_max > 0
            && gen_max < e.profile.pcie_gen
        {
            out.push(evidence(
                FindingKind::PcieDegraded,
                subject(),
                Metric::PcieLink,
                f64::from(gen_max),
                f64::from(e.profile.pcie_gen),
                "generation",
                ExpectationSource::Profile,
                Severity::Info,
                format!(
                    "GPU {gpu} on {node} can train its PCIe link only to Gen{gen_max}, the {} supports Gen{}; the slot, riser or BIOS setting limits host bandwidth.",
                    e.profile.product, e.profile.pcie_gen
                ),
            ));
        }
        if let Some(max) = t.max_temperature_c
            && h.t > max
        {
            out.push(evidence(
                FindingKind::Thermal,
                subject(),
                Metric::Temperature,
                h.t,
                max,
                "°C",
                ExpectationSource::Threshold,
                Severity::Critical,
                format!(
                    "GPU {gpu} on {node} reached {:.0} °C, above the spec's ceiling of {max:.0} °C; check airflow, fans and coolant.",
                    h.t
                ),
            ));
        }
        if !h.th.is_empty() {
            out.push(Finding {
                measured: Some(h.t),
                unit: Some("°C".into()),
                source: Some(ExpectationSource::Rule),
                ..finding(
                    FindingKind::Thermal,
                    subject(),
                    Metric::Temperature,
                    Severity::Info,
                    format!(
                        "GPU {gpu} on {node} had its clocks throttled ({}) at {:.0} °C; worth watching if it recurs.",
                        h.th.join(", "),
                        h.t
                    ),
                )
            });
        }
    }
}

fn check_wrong_results(node: &str, r: &CompactResult, out: &mut Vec<Finding>) {
    for c in &r.nc {
        if c.w > 0 {
            out.push(Finding {
                collective: Some(c.c),
                ..evidence(
                    FindingKind::WrongResults,
                    Subject::node(node),
                    Metric::NcclWrong,
                    c.w as f64,
                    0.0,
                    "elements",
                    ExpectationSource::Rule,
                    Severity::Critical,
                    format!(
                        "{} on {node} produced {} wrong elements; the node corrupts data in flight: drain it and check dmesg for XIDs and NVLink errors.",
                        collective_name(c.c),
                        c.w
                    ),
                )
            });
        }
    }
    if r.pc > 0 {
        out.push(evidence(
            FindingKind::WrongResults,
            Subject::node(node),
            Metric::PairBandwidth,
            f64::from(r.pc),
            0.0,
            "copies",
            ExpectationSource::Rule,
            Severity::Critical,
            format!(
                "{} GPU-to-GPU copies on {node} arrived corrupted; drain the node and check NVLink errors and ECC.",
                r.pc
            ),
        ));
    }
}

/// Which of a node's GPU pairs are at fault, blamed on the smallest subject: every pair
/// slow -> the node; every pair of one GPU slow -> that GPU; else the pairs themselves.
#[derive(Debug, PartialEq)]
struct Blame {
    node: bool,
    gpus: Vec<u32>,
    pairs: Vec<(u32, u32)>,
}

fn blame(g: u32, measured: &BTreeSet<(u32, u32)>, bad: &BTreeSet<(u32, u32)>) -> Blame {
    if bad.is_empty() {
        return Blame {
            node: false,
            gpus: Vec::new(),
            pairs: Vec::new(),
        };
    }
    if g >= 3 && measured.len() >= 3 && measured.iter().all(|p| bad.contains(p)) {
        return Blame {
            node: true,
            gpus: Vec::new(),
            pairs: Vec::new(),
        };
    }
    let mut gpus = Vec::new();
    if g >= 3 {
        for k in 0..g {
            let mine: Vec<&(u32, u32)> = measured
                .iter()
                .filter(|(a, b)| *a == k || *b == k)
                .collect();
            if mine.len() >= 2 && mine.iter().all(|p| bad.contains(p)) {
                gpus.push(k);
            }
        }
    }
    let pairs = bad
        .iter()
        .filter(|(a, b)| !gpus.contains(a) && !gpus.contains(b))
        .copied()
        .collect();
    Blame {
        node: false,
        gpus,
        pairs,
    }
}

fn nvlink_expected(r: &CompactResult, exp: Option<&Expectations>, a: u32, b: u32) -> Option<bool> {
    let links = |i: u32| r.h.get(i as usize).map(|h| h.l.1 > 0);
    match (links(a), links(b)) {
        (Some(x), Some(y)) => Some(x && y),
        _ => exp.map(|e| e.profile.nvlinks > 0),
    }
}

fn check_transports(
    node: &str,
    r: &CompactResult,
    exp: Option<&Expectations>,
    out: &mut Vec<Finding>,
) {
    let mut bad: BTreeMap<(u32, u32), Transport> = BTreeMap::new();
    for (a, b, transport) in &r.tf {
        if *transport == Transport::Nvlink || a == b || *a >= r.g || *b >= r.g {
            continue;
        }
        if nvlink_expected(r, exp, *a, *b) == Some(true) {
            bad.insert(((*a).min(*b), (*a).max(*b)), *transport);
        }
    }
    if bad.is_empty() {
        return;
    }
    let all: BTreeSet<(u32, u32)> = (0..r.g)
        .flat_map(|a| ((a + 1)..r.g).map(move |b| (a, b)))
        .collect();
    let keys: BTreeSet<(u32, u32)> = bad.keys().copied().collect();
    let verdict = blame(r.g, &all, &keys);
    let mut push = |subject: Subject, what: String| {
        out.push(Finding {
            source: Some(ExpectationSource::Rule),
            ..finding(
                FindingKind::TransportFallback,
                subject,
                Metric::NcclTransport,
                Severity::Critical,
                what,
            )
        });
    };
    let used = |set: &mut dyn Iterator<Item = Transport>| {
        let names: BTreeSet<&str> = set.map(transport_name).collect();
        names.into_iter().collect::<Vec<_>>().join(" or ")
    };
    if verdict.node {
        let via = used(&mut bad.values().copied());
        push(
            Subject::node(node),
            format!(
                "NCCL used {via} instead of NVLink between every GPU pair of {node}; check the NVLink/NVSwitch state (nvidia-smi topo -m, the fabric manager service) and peer access (IOMMU, ACS)."
            ),
        );
        return;
    }
    for k in &verdict.gpus {
        let via = used(
            &mut bad
                .iter()
                .filter(|((a, b), _)| a == k || b == k)
                .map(|(_, t)| *t),
        );
        push(
            Subject::gpu(node, *k),
            format!(
                "NCCL used {via} instead of NVLink between GPU {k} and every other GPU of {node}; GPU {k}'s NVLink is unusable: check nvidia-smi nvlink -s -i {k}."
            ),
        );
    }
    for (a, b) in &verdict.pairs {
        let via = bad.get(&(*a, *b)).copied().unwrap_or(Transport::Unknown);
        push(
            Subject::gpu_pair(node, *a, *b),
            format!(
                "NCCL used {} instead of NVLink between GPU {a} and GPU {b} on {node}; check nvidia-smi topo -m and both GPUs' NVLink status.",
                transport_name(via)
            ),
        );
    }
}

fn check_nccl(
    node: &str,
    r: &CompactResult,
    t: &Thresholds,
    exp: Option<&Expectations>,
    stats: &mut NodeStats,
    out: &mut Vec<Finding>,
) {
    for c in &r.nc {
        let bw_key = SeriesKey {
            metric: Metric::NcclBusBw,
            collective: Some(c.c),
            gpu: None,
        };
        if c.pk > 0.0 {
            stats.values.insert(bw_key, c.pk);
            let floor = if c.c != Collective::AllReduce {
                None
            } else if let Some(v) = t.nccl_bus_bw_gbps {
                Some((v, ExpectationSource::Threshold))
            } else {
                exp.and_then(|e| e.all_reduce_floor_gbps)
                    .map(|v| (v, ExpectationSource::Profile))
            };
            if let Some((floor, source)) = floor {
                stats.judged.insert(bw_key);
                if c.pk < floor {
                    out.push(Finding {
                        collective: Some(c.c),
                        ..evidence(
                            FindingKind::Slow,
                            Subject::node(node),
                            Metric::NcclBusBw,
                            c.pk,
                            floor,
                            "GB/s",
                            source,
                            Severity::Critical,
                            format!(
                                "{} peak bus bandwidth on {node} is {} GB/s, {} {} ({} GB/s); check NVLink state and NCCL's transport (NCCL_DEBUG=INFO).",
                                collective_name(c.c),
                                num(c.pk),
                                how_far(c.pk, floor),
                                source_words(source, "all_reduce bus bandwidth"),
                                num(floor)
                            ),
                        )
                    });
                }
            }
        }
        let latency = match c.ab {
            Some((alpha, _)) if alpha > 0.0 => alpha,
            _ => c.lt,
        };
        if latency > 0.0 {
            let key = SeriesKey {
                metric: Metric::NcclLatency,
                collective: Some(c.c),
                gpu: None,
            };
            stats.values.insert(key, latency);
            if c.c == Collective::AllReduce
                && let Some(ceiling) = t.nccl_latency_us
            {
                stats.judged.insert(key);
                if latency > ceiling {
                    out.push(Finding {
                        collective: Some(c.c),
                        ..evidence(
                            FindingKind::Slow,
                            Subject::node(node),
                            Metric::NcclLatency,
                            latency,
                            ceiling,
                            "µs",
                            ExpectationSource::Threshold,
                            Severity::Critical,
                            format!(
                                "all_reduce latency on {node} is {} µs, {} the spec's ceiling of {} µs; check NCCL's transport and protocol choice (NCCL_DEBUG=INFO).",
                                num(latency),
                                how_far(latency, ceiling),
                                num(ceiling)
                            ),
                        )
                    });
                }
            }
        }
    }
}

/// A GPU-pair measurement of a node: value per unordered pair.
struct PairSet {
    metric: Metric,
    what: &'static str,
    values: BTreeMap<(u32, u32), f64>,
    floor: Option<(f64, ExpectationSource)>,
}

fn unordered_pairs(r: &CompactResult) -> BTreeMap<(u32, u32), f64> {
    let mut values = BTreeMap::new();
    if r.pu.len() != (r.g as usize) * (r.g as usize) {
        return values;
    }
    for a in 0..r.g {
        for b in (a + 1)..r.g {
            let there = r.pair_uni(a, b).filter(|v| *v > 0.0);
            let back = r.pair_uni(b, a).filter(|v| *v > 0.0);
            let v = match (there, back) {
                (Some(x), Some(y)) => Some(x.min(y)),
                (x, y) => x.or(y),
            };
            if let Some(v) = v {
                values.insert((a, b), v);
            }
        }
    }
    values
}

fn bidir_pairs(r: &CompactResult) -> BTreeMap<(u32, u32), f64> {
    let mut values = BTreeMap::new();
    if r.g < 2 || r.pb.len() != (r.g as usize) * (r.g as usize - 1) / 2 {
        return values;
    }
    for a in 0..r.g {
        for b in (a + 1)..r.g {
            if let Some(v) = r.pair_bidir(a, b).filter(|v| *v > 0.0) {
                values.insert((a, b), v);
            }
        }
    }
    values
}

fn check_pairs(
    node: &str,
    r: &CompactResult,
    t: &Thresholds,
    exp: Option<&Expectations>,
    stats: &mut NodeStats,
    out: &mut Vec<Finding>,
) {
    let sets = [
        PairSet {
            metric: Metric::PairBandwidth,
            what: "copy bandwidth",
            values: unordered_pairs(r),
            floor: t
                .pair_bandwidth_gbps
                .map(|v| (v, ExpectationSource::Threshold))
                .or_else(|| {
                    exp.and_then(|e| e.pair_floor_gbps)
                        .map(|v| (v, ExpectationSource::Profile))
                }),
        },
        PairSet {
            metric: Metric::PairBidirBandwidth,
            what: "bidirectional copy bandwidth",
            values: bidir_pairs(r),
            floor: t
                .pair_bidir_bandwidth_gbps
                .map(|v| (v, ExpectationSource::Threshold))
                .or_else(|| {
                    exp.and_then(|e| e.pair_bidir_floor_gbps)
                        .map(|v| (v, ExpectationSource::Profile))
                }),
        },
    ];
    // Pairs and GPUs already blamed by an earlier set are not blamed again.
    let mut covered_pairs: BTreeSet<(u32, u32)> = BTreeSet::new();
    let mut covered_gpus: BTreeSet<u32> = BTreeSet::new();
    let mut covered_node = false;
    let rule = Rule {
        score: t.fleet_outlier_score,
        min_gap: t.fleet_min_relative_gap,
        min_count: 3,
    };
    let explicit = |m: Metric| match m {
        Metric::PairBandwidth => t.pair_bandwidth_gbps.is_some(),
        _ => t.pair_bidir_bandwidth_gbps.is_some(),
    };
    for set in sets {
        if set.values.is_empty() {
            continue;
        }
        let all: Vec<f64> = set.values.values().copied().collect();
        let Some(node_median) = fleet::median(&all) else {
            continue;
        };
        let key = SeriesKey {
            metric: set.metric,
            collective: None,
            gpu: None,
        };
        stats.values.insert(key, node_median);
        if set
            .floor
            .is_some_and(|(_, s)| s == ExpectationSource::Threshold)
        {
            stats.judged.insert(key);
        }
        if covered_node {
            continue;
        }
        // Each slow pair with the expectation it missed.
        let mut slow: BTreeMap<(u32, u32), (f64, ExpectationSource)> = BTreeMap::new();
        let node_mad = fleet::mad(&all, node_median);
        for (pair, v) in &set.values {
            // Against the node's other pairs first (the sharpest evidence for one link),
            // then the profile floor; an explicit threshold alone when the spec sets one.
            if !explicit(set.metric)
                && all.len() >= rule.min_count
                && fleet::is_outlier(*v, node_median, node_mad, Better::Higher, &rule)
            {
                slow.insert(*pair, (node_median, ExpectationSource::Node));
            } else if let Some((floor, source)) = set.floor
                && *v < floor
            {
                slow.insert(*pair, (floor, source));
            }
        }
        slow.retain(|(a, b), _| {
            !covered_pairs.contains(&(*a, *b))
                && !covered_gpus.contains(a)
                && !covered_gpus.contains(b)
        });
        let measured: BTreeSet<(u32, u32)> = set.values.keys().copied().collect();
        let bad: BTreeSet<(u32, u32)> = slow.keys().copied().collect();
        let verdict = blame(r.g, &measured, &bad);
        if verdict.node {
            let (floor, source) = set.floor.unwrap_or((node_median, ExpectationSource::Node));
            if set
                .floor
                .is_some_and(|(_, s)| s == ExpectationSource::Profile)
            {
                stats.judged.insert(key);
            }
            out.push(evidence(
                FindingKind::Slow,
                Subject::node(node),
                set.metric,
                node_median,
                floor,
                "GB/s",
                source,
                Severity::Critical,
                format!(
                    "Every GPU pair on {node} is slow: {} median {} GB/s, {} {} ({} GB/s); check NVLink and NVSwitch health (nvidia-smi nvlink -s, the fabric manager service).",
                    set.what,
                    num(node_median),
                    how_far(node_median, floor),
                    source_words(source, &format!("pair {}", set.what)),
                    num(floor)
                ),
            ));
            covered_node = true;
            continue;
        }
        for k in &verdict.gpus {
            let mine: Vec<f64> = set
                .values
                .iter()
                .filter(|((a, b), _)| a == k || b == k)
                .map(|(_, v)| *v)
                .collect();
            let others: Vec<f64> = set
                .values
                .iter()
                .filter(|((a, b), _)| a != k && b != k)
                .map(|(_, v)| *v)
                .collect();
            let measured = fleet::median(&mine).unwrap_or(0.0);
            // The expectation of the GPU's pairs: the strictest floor among them, or the
            // median of the node's pairs that do not involve the GPU.
            let (expected, source) = slow
                .iter()
                .filter(|((a, b), _)| a == k || b == k)
                .map(|(_, e)| *e)
                .find(|(_, s)| *s != ExpectationSource::Node)
                .unwrap_or((
                    fleet::median(&others).unwrap_or(node_median),
                    ExpectationSource::Node,
                ));
            out.push(evidence(
                FindingKind::Slow,
                Subject::gpu(node, *k),
                set.metric,
                measured,
                expected,
                "GB/s",
                source,
                Severity::Critical,
                format!(
                    "GPU {k} on {node} is slow to every other GPU: {} median {} GB/s, {} {} ({} GB/s); check GPU {k}'s NVLink links (nvidia-smi nvlink -s -i {k}).",
                    set.what,
                    num(measured),
                    how_far(measured, expected),
                    source_words(source, if source == ExpectationSource::Node { "pairs" } else { "pair bandwidth" }),
                    num(expected)
                ),
            ));
            covered_gpus.insert(*k);
        }
        for (a, b) in &verdict.pairs {
            let v = set.values.get(&(*a, *b)).copied().unwrap_or(0.0);
            let (expected, source) = slow
                .get(&(*a, *b))
                .copied()
                .unwrap_or((node_median, ExpectationSource::Node));
            let against = match source {
                ExpectationSource::Node => {
                    format!("the node's other pairs (median {} GB/s)", num(expected))
                }
                s => format!(
                    "{} ({} GB/s)",
                    source_words(s, &format!("pair {}", set.what)),
                    num(expected)
                ),
            };
            out.push(evidence(
                FindingKind::Slow,
                Subject::gpu_pair(node, *a, *b),
                set.metric,
                v,
                expected,
                "GB/s",
                source,
                Severity::Critical,
                format!(
                    "GPU {a} <-> GPU {b} on {node}: {} {} GB/s, {} {against}; check the NVLink links of both GPUs (nvidia-smi nvlink -s).",
                    set.what,
                    num(v),
                    how_far(v, expected),
                ),
            ));
            covered_pairs.insert((*a, *b));
        }
    }
}

fn check_host(
    node: &str,
    r: &CompactResult,
    t: &Thresholds,
    exp: Option<&Expectations>,
    stats: &mut NodeStats,
    out: &mut Vec<Finding>,
) {
    let floor = t
        .host_bandwidth_gbps
        .map(|v| (v, ExpectationSource::Threshold))
        .or_else(|| {
            exp.and_then(|e| e.host_floor_gbps)
                .map(|v| (v, ExpectationSource::Profile))
        });
    for (values, metric, what) in [
        (&r.hd, Metric::H2dBandwidth, "host-to-device"),
        (&r.dh, Metric::D2hBandwidth, "device-to-host"),
    ] {
        for (i, v) in values.iter().take(r.g as usize).enumerate() {
            if *v <= 0.0 {
                continue;
            }
            let gpu = i as u32;
            let key = SeriesKey {
                metric,
                collective: None,
                gpu: Some(gpu),
            };
            stats.values.insert(key, *v);
            let Some((floor, source)) = floor else {
                continue;
            };
            stats.judged.insert(key);
            if *v < floor {
                out.push(evidence(
                    FindingKind::Slow,
                    Subject::gpu(node, gpu),
                    metric,
                    *v,
                    floor,
                    "GB/s",
                    source,
                    Severity::Critical,
                    format!(
                        "GPU {gpu} on {node}: {what} bandwidth {} GB/s, {} {} ({} GB/s); check the GPU's PCIe link (nvidia-smi -q -d PCI) and its NUMA placement.",
                        num(*v),
                        how_far(*v, floor),
                        source_words(source, "host bandwidth"),
                        num(floor)
                    ),
                ));
            }
        }
    }
}

fn check_ddp(
    node: &str,
    r: &CompactResult,
    t: &Thresholds,
    stats: &mut NodeStats,
    out: &mut Vec<Finding>,
) {
    if let Some(last) = r.dp.iter().max_by_key(|p| p.g)
        && last.g > 1
        && last.e > 0.0
    {
        let key = SeriesKey {
            metric: Metric::DdpScalingEfficiency,
            collective: None,
            gpu: None,
        };
        stats.values.insert(key, last.e);
        if let Some(floor) = t.ddp_scaling_efficiency {
            stats.judged.insert(key);
            if last.e < floor {
                out.push(evidence(
                    FindingKind::Slow,
                    Subject::node(node),
                    Metric::DdpScalingEfficiency,
                    last.e,
                    floor,
                    "ratio",
                    ExpectationSource::Threshold,
                    Severity::Critical,
                    format!(
                        "DDP scaling efficiency on {node} at {} GPUs is {:.0}%, below the spec's floor of {:.0}%; gradient all-reduce is not hidden behind compute (communication fraction {:.0}%).",
                        last.g,
                        last.e * 100.0,
                        floor * 100.0,
                        last.cf * 100.0
                    ),
                ));
            }
        }
    }

    let times: Vec<f64> =
        r.dc.iter()
            .take(r.g as usize)
            .copied()
            .filter(|v| *v > 0.0)
            .collect();
    if times.len() < 2 {
        return;
    }
    let Some(m) = fleet::median(&times) else {
        return;
    };
    stats.values.insert(
        SeriesKey {
            metric: Metric::DdpComputeTime,
            collective: None,
            gpu: None,
        },
        m,
    );
    let ratio = t.straggler_ratio.max(1.0);
    for (i, v) in r.dc.iter().take(r.g as usize).enumerate() {
        if *v > 0.0 && *v > ratio * m {
            let gpu = i as u32;
            out.push(evidence(
                FindingKind::Straggler,
                Subject::gpu(node, gpu),
                Metric::DdpComputeTime,
                *v,
                m,
                "ms",
                ExpectationSource::Node,
                Severity::Critical,
                format!(
                    "GPU {gpu} on {node} is a straggler: DDP compute time {} ms, {} the node's median ({} ms); every step waits for it: check its clocks, throttle reasons and power (nvidia-smi -q -d PERFORMANCE,CLOCK).",
                    num(*v),
                    how_far(*v, m),
                    num(m)
                ),
            ));
        }
    }
}

// ---------------------------------------------------------------------------------------
// The fleet
// ---------------------------------------------------------------------------------------

fn series_better(metric: Metric) -> Better {
    match metric {
        Metric::NcclLatency | Metric::DdpComputeTime => Better::Lower,
        _ => Better::Higher,
    }
}

fn series_words(key: &SeriesKey) -> (String, &'static str) {
    let c = key.collective.map(collective_name).unwrap_or("");
    match key.metric {
        Metric::NcclBusBw => (format!("{c} peak bus bandwidth"), "GB/s"),
        Metric::NcclLatency => (format!("{c} latency"), "µs"),
        Metric::PairBandwidth => ("median GPU-pair copy bandwidth".into(), "GB/s"),
        Metric::PairBidirBandwidth => (
            "median GPU-pair bidirectional copy bandwidth".into(),
            "GB/s",
        ),
        Metric::H2dBandwidth => ("host-to-device bandwidth".into(), "GB/s"),
        Metric::D2hBandwidth => ("device-to-host bandwidth".into(), "GB/s"),
        Metric::DdpScalingEfficiency => ("DDP scaling efficiency".into(), "ratio"),
        Metric::DdpComputeTime => ("median DDP compute time".into(), "ms"),
        _ => ("value".into(), ""),
    }
}

fn explicit_threshold(key: &SeriesKey, t: &Thresholds) -> bool {
    match key.metric {
        Metric::NcclBusBw => {
            key.collective == Some(Collective::AllReduce) && t.nccl_bus_bw_gbps.is_some()
        }
        Metric::NcclLatency => {
            key.collective == Some(Collective::AllReduce) && t.nccl_latency_us.is_some()
        }
        Metric::PairBandwidth => t.pair_bandwidth_gbps.is_some(),
        Metric::PairBidirBandwidth => t.pair_bidir_bandwidth_gbps.is_some(),
        Metric::H2dBandwidth | Metric::D2hBandwidth => t.host_bandwidth_gbps.is_some(),
        Metric::DdpScalingEfficiency => t.ddp_scaling_efficiency.is_some(),
        _ => false,
    }
}

fn compare_fleet(stats: &[(NodeStats, Vec<Finding>)], t: &Thresholds) -> Vec<Finding> {
    let rule = Rule {
        score: t.fleet_outlier_score,
        min_gap: t.fleet_min_relative_gap,
        min_count: t.fleet_min_nodes.max(2) as usize,
    };
    // A node with a critical finding on one of its GPUs or GPU pairs has its node-wide
    // slowness explained already: the smallest subject at fault is named, not the node.
    let explained: BTreeSet<&str> = stats
        .iter()
        .filter(|(_, fs)| {
            fs.iter().any(|f| {
                f.severity == Severity::Critical
                    && matches!(f.subject.kind, SubjectKind::Gpu | SubjectKind::GpuPair)
            })
        })
        .map(|(s, _)| s.node.as_str())
        .collect();
    let pcie_explained: BTreeSet<(&str, u32)> = stats
        .iter()
        .flat_map(|(s, fs)| {
            fs.iter()
                .filter(|f| f.severity == Severity::Critical && f.kind == FindingKind::PcieDegraded)
                .filter_map(|f| f.subject.gpu)
                .map(move |g| (s.node.as_str(), g))
        })
        .collect();
    let mut groups: BTreeMap<&(String, u32), Vec<&NodeStats>> = BTreeMap::new();
    for (s, _) in stats {
        if !s.group.0.is_empty() {
            groups.entry(&s.group).or_default().push(s);
        }
    }
    let mut out = Vec::new();
    for ((_, gpus), members) in groups {
        if members.len() < rule.min_count {
            continue;
        }
        let keys: BTreeSet<SeriesKey> = members
            .iter()
            .flat_map(|s| s.values.keys().copied())
            .collect();
        for key in keys {
            if explicit_threshold(&key, t) {
                continue;
            }
            let values: Vec<(&NodeStats, f64)> = members
                .iter()
                .filter_map(|s| s.values.get(&key).map(|v| (*s, *v)))
                .collect();
            let better = series_better(key.metric);
            for (s, o) in fleet::outliers(&values, better, &rule) {
                if s.judged.contains(&key) && findings_exist(stats, &s.node, &key) {
                    continue;
                }
                if key.gpu.is_none() && explained.contains(s.node.as_str()) {
                    continue;
                }
                if let Some(g) = key.gpu
                    && pcie_explained.contains(&(s.node.as_str(), g))
                {
                    continue;
                }
                let (what, unit) = series_words(&key);
                let subject = match key.gpu {
                    Some(g) => Subject::gpu(&s.node, g),
                    None => Subject::node(&s.node),
                };
                let at = match key.gpu {
                    Some(g) => format!("GPU {g} on {}", s.node),
                    None => s.node.clone(),
                };
                let (shown, shown_median) = if unit == "ratio" {
                    (
                        format!("{:.0}%", o.value * 100.0),
                        format!("{:.0}%", o.median * 100.0),
                    )
                } else {
                    (
                        format!("{} {unit}", num(o.value)),
                        format!("{} {unit}", num(o.median)),
                    )
                };
                out.push(Finding {
                    collective: key.collective,
                    ..evidence(
                        FindingKind::Slow,
                        subject,
                        key.metric,
                        o.value,
                        o.median,
                        unit,
                        ExpectationSource::Fleet,
                        Severity::Critical,
                        format!(
                            "{at}: {what} {shown}, {} the median of {} comparable {} x{gpus} nodes ({shown_median}); compare its NVLink, PCIe and clock state with a healthy node.",
                            how_far(o.value, o.median),
                            o.count,
                            s.product,
                        ),
                    )
                });
            }
        }
    }
    out
}

/// Whether the node already has a finding on this series (from a threshold or profile).
fn findings_exist(stats: &[(NodeStats, Vec<Finding>)], node: &str, key: &SeriesKey) -> bool {
    stats
        .iter()
        .filter(|(s, _)| s.node == node)
        .flat_map(|(_, fs)| fs.iter())
        .any(|f| {
            f.metric == key.metric && f.collective == key.collective && f.subject.gpu == key.gpu
        })
}

#[cfg(test)]
mod tests;
