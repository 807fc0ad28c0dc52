//! What the HTML report shows, built from the objects `main.rs` fetched (the run, its shards,
//! the nodes, the full results the operator keeps in ConfigMaps, the run that confirmed it)
//! with no client: the fleet by verdict, each failing node's own measurements against its
//! floors, the node-pair matrix, the multi-node DDP probe and each node's trend.

use crate::report::{PairRow, pair_rows};
use gpufabric_api::ddp_nodes::DdpNodesStatus;
use gpufabric_api::findings::ExpectationSource;
use gpufabric_api::pair::NodePairsStatus;
use gpufabric_api::run::{NodeRunResult, NodeVerdict, SkippedNode};
use gpufabric_api::shard::FabricTestRunShard;
use gpufabric_api::suite::Collective;
use gpufabric_api::trend::{NodeTrend, TrendPoint};
use gpufabric_api::{CompactResult, FabricTestRun, Finding, Metric, ResultDocument, Subject, keys};
use gpufabric_health::{floors, profiles};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use std::collections::{BTreeMap, BTreeSet};

pub use super::kept::{Kept, KeptError, kept, read_kept};

/// Most failing nodes drawn in detail; the others are listed.
pub const MAX_DETAILS: usize = 24;
/// Most nodes in the node-pair matrix: the nodes of suspect, faulty and unmeasured pairs first.
pub const MAX_MATRIX_NODES: usize = 40;
/// Most nodes whose trend is drawn: failing nodes first.
pub const MAX_TRENDS: usize = 100;

/// What main.rs fetched for one run's report.
#[derive(Clone, Copy, Debug)]
pub struct Sources<'a> {
    pub run: &'a FabricTestRun,
    pub shards: &'a [FabricTestRunShard],
    pub nodes: &'a [Node],
    /// The ConfigMaps of the run's test that keep full results.
    pub kept: &'a [ConfigMap],
    /// Why `kept` is empty when they could not be read: each failing node says so.
    pub kept_note: Option<&'a str>,
    /// The run that retested this run's suspects, if one did.
    pub confirmation: Option<&'a str>,
    /// When the page was made (RFC 3339).
    pub generated_at: &'a str,
    /// The GPUs the run's test holds out of service with DRA device taints now.
    pub gpus_out: &'a [crate::gpus_out::GpuOut],
}

/// The whole page.
#[derive(Clone, Debug, PartialEq)]
pub struct HtmlReport {
    pub run: String,
    pub test: String,
    pub trigger: String,
    pub phase: String,
    pub started: Option<String>,
    pub duration: Option<String>,
    pub message: Option<String>,
    pub generated_at: String,
    pub fleet: Fleet,
    /// The run's findings, critical first (the run keeps 100), and how many it made.
    pub findings: Vec<Finding>,
    pub finding_count: u32,
    pub failing: Vec<NodeDetail>,
    /// Failing nodes past [`MAX_DETAILS`], not drawn.
    pub failing_not_drawn: Vec<String>,
    pub pairs: Option<PairMatrix>,
    pub ddp: Option<DdpNodesStatus>,
    pub nccl: Option<gpufabric_api::nccl_nodes::NcclNodesStatus>,
    pub trends: Vec<TrendRow>,
    pub trends_not_drawn: usize,
    /// The GPUs the run's test holds out of service with DRA device taints now.
    pub gpus_out: Vec<crate::gpus_out::GpuOut>,
}

/// Every node of the run by verdict, and the nodes it skipped.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Fleet {
    /// One entry per node: from the shards (every node), else the run's list.
    pub nodes: Vec<NodeRunResult>,
    pub skipped: Vec<SkippedNode>,
    pub skipped_count: u32,
}

impl Fleet {
    /// The verdicts shown, in the order the page counts them.
    pub const VERDICTS: [NodeVerdict; 7] = [
        NodeVerdict::Failed,
        NodeVerdict::Errored,
        NodeVerdict::Timeout,
        NodeVerdict::NotMeasured,
        NodeVerdict::Passed,
        NodeVerdict::Running,
        NodeVerdict::Pending,
    ];

    pub fn count(&self, v: NodeVerdict) -> usize {
        self.nodes.iter().filter(|n| n.verdict == v).count()
    }
}

/// A floor a measurement is drawn against, and where it comes from.
#[derive(Clone, Debug, PartialEq)]
pub struct Floor {
    pub gbps: f64,
    pub source: String,
}

/// One failing node drawn in detail.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeDetail {
    pub entry: NodeRunResult,
    /// The run's findings that name it.
    pub findings: Vec<Finding>,
    pub kept: Kept,
    pub busbw_floor: Option<Floor>,
    pub pair_floor: Option<Floor>,
}

impl NodeDetail {
    /// The GPU pairs its findings name, each as (lower, higher) index.
    pub fn suspect_pairs(&self) -> BTreeSet<(u32, u32)> {
        self.findings
            .iter()
            .filter_map(|f| match f.subject {
                Subject::GpuPair { a, b, .. } => Some((a.min(b), a.max(b))),
                _ => None,
            })
            .collect()
    }

    /// The GPUs its findings name.
    pub fn suspect_gpus(&self) -> BTreeSet<u32> {
        self.findings
            .iter()
            .filter_map(|f| match f.subject {
                Subject::Gpu { gpu, .. } => Some(gpu),
                _ => None,
            })
            .collect()
    }
}

/// A node of the node-pair matrix.
#[derive(Clone, Debug, PartialEq)]
pub struct MatrixNode {
    pub name: String,
    /// Blamed by the node-pair phase: slow to its partners, or its network ports.
    pub suspect: bool,
    /// Retested against a known-good partner in the confirmation round.
    pub retested: bool,
}

/// A pair of the matrix, and whether a finding blames the path between its nodes.
#[derive(Clone, Debug, PartialEq)]
pub struct PairCell {
    pub pair: PairRow,
    pub path_fault: bool,
}

/// The node-pair phase as a matrix of nodes.
#[derive(Clone, Debug, PartialEq)]
pub struct PairMatrix {
    pub status: NodePairsStatus,
    pub nodes: Vec<MatrixNode>,
    /// Every pair between two nodes of `nodes`, the latest round last.
    pub cells: Vec<PairCell>,
    /// Nodes of the phase left out of the matrix (past [`MAX_MATRIX_NODES`]).
    pub hidden: usize,
}

impl PairMatrix {
    /// The latest pair between `a` and `b`, either way round.
    pub fn cell(&self, a: &str, b: &str) -> Option<&PairCell> {
        self.cells
            .iter()
            .rev()
            .find(|c| (c.pair.a == a && c.pair.b == b) || (c.pair.a == b && c.pair.b == a))
    }
}

/// A node's trend, as the page reads its annotation.
#[derive(Clone, Debug, PartialEq)]
pub enum TrendState {
    /// The runs of the report's test, oldest first.
    Points(Vec<TrendPoint>),
    NoTrend,
    Unreadable(String),
}

#[derive(Clone, Debug, PartialEq)]
pub struct TrendRow {
    pub node: String,
    pub verdict: NodeVerdict,
    pub trend: TrendState,
}

/// Whether a finding blames a node from what the node-pair phase measured.
fn blames_node_from_pairs(f: &Finding) -> Option<&str> {
    match &f.subject {
        Subject::Node { node }
            if matches!(f.metric, Metric::NodePairBusBw | Metric::NetTransport) =>
        {
            Some(node)
        }
        Subject::Nic { node, .. } => Some(node),
        _ => None,
    }
}

/// A node's all_reduce and one-way GPU-pair floors, as the health rules hold its kept result
/// to them ([`gpufabric_health::floors`]): the run's thresholds, else what its product and
/// links should reach at the sizes it measured. None without a kept result (nothing is drawn
/// then), and none where the rules judge nothing by a floor (a sweep or copies too short).
fn floors(
    run: &FabricTestRun,
    product: Option<&str>,
    doc: Option<&ResultDocument>,
) -> (Option<Floor>, Option<Floor>) {
    let (Some(product), Some(doc)) = (product, doc) else {
        return (None, None);
    };
    let compact = CompactResult::from(doc);
    let (all_reduce, pair) = floors::of_node(&run.spec.thresholds, product, &compact);
    let named = profiles::expectations_of(product, &compact)
        .and_then(|e| e.profile)
        .map_or("the node's links", |p| p.product);
    let drawn = |f: floors::Floor, threshold: &str, at: &str| Floor {
        gbps: f.gbps,
        source: match f.source {
            ExpectationSource::Threshold => format!("thresholds.{threshold}"),
            _ => format!("{named} floor{at}"),
        },
    };
    // A profile's all_reduce floor is held lower in a sweep that ends early: say where.
    let at = compact
        .collectives
        .iter()
        .find(|c| c.collective == Collective::AllReduce)
        .and_then(|c| c.largest_bytes)
        .filter(|b| *b < profiles::PROFILE_BYTES)
        .map_or(String::new(), |b| format!(" at a sweep to {} MiB", b >> 20));
    (
        all_reduce.map(|f| drawn(f, "ncclBusBwGbps", &at)),
        pair.map(|f| drawn(f, "pairBandwidthGbps", "")),
    )
}

/// Every node's entry: from the shards, with the run's own list for any they lack.
fn entries(src: &Sources<'_>) -> Vec<NodeRunResult> {
    let mut by_node: BTreeMap<String, NodeRunResult> = BTreeMap::new();
    let listed = src.run.status.iter().flat_map(|s| &s.nodes);
    let sharded = src
        .shards
        .iter()
        .filter_map(|s| s.status.as_ref())
        .flat_map(|s| &s.nodes);
    for e in listed.chain(sharded) {
        by_node.insert(e.node.clone(), e.clone());
    }
    by_node.into_values().collect()
}

fn trend_of(nodes: &[Node], node: &str, test: &str) -> TrendState {
    let text = nodes
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(node))
        .and_then(|n| n.metadata.annotations.as_ref())
        .and_then(|a| a.get(keys::ANNOTATION_TREND));
    let Some(text) = text else {
        return TrendState::NoTrend;
    };
    match NodeTrend::parse(text) {
        Ok(t) => match t.of_test(test) {
            Some(tt) if !tt.points.is_empty() => TrendState::Points(tt.points.clone()),
            _ => TrendState::NoTrend,
        },
        Err(e) => TrendState::Unreadable(e.to_string()),
    }
}

fn pair_matrix(src: &Sources<'_>, entries: &[NodeRunResult]) -> Option<PairMatrix> {
    let status = src.run.status.as_ref()?.node_pairs.clone()?;
    let rows = pair_rows(src.shards);
    let findings = src.run.status.iter().flat_map(|s| &s.findings);
    let mut suspects: BTreeSet<String> = findings
        .clone()
        .filter_map(blames_node_from_pairs)
        .map(str::to_string)
        .collect();
    suspects.extend(
        entries
            .iter()
            .filter(|e| e.confirmed)
            .map(|e| e.node.clone()),
    );
    let paths: BTreeSet<(String, String)> = findings
        .filter_map(|f| match &f.subject {
            Subject::NodePair { a, b } => Some((a.min(b).clone(), a.max(b).clone())),
            _ => None,
        })
        .collect();
    let retest_nodes: BTreeSet<&str> = rows
        .iter()
        .filter(|p| p.confirmation)
        .flat_map(|p| [p.a.as_str(), p.b.as_str()])
        .collect();
    let all: BTreeSet<&str> = rows
        .iter()
        .flat_map(|p| [p.a.as_str(), p.b.as_str()])
        .collect();
    // The nodes worth a look first, then the others by name, up to the bound.
    let mut shown: BTreeSet<&str> = BTreeSet::new();
    let notable = |p: &PairRow| {
        p.confirmation
            || p.state != gpufabric_api::pair::PairState::Measured
            || paths.contains(&(p.a.clone().min(p.b.clone()), p.a.clone().max(p.b.clone())))
            || suspects.contains(&p.a)
            || suspects.contains(&p.b)
    };
    for p in rows.iter().filter(|p| notable(p)) {
        for n in [p.a.as_str(), p.b.as_str()] {
            if shown.len() < MAX_MATRIX_NODES {
                shown.insert(n);
            }
        }
    }
    for n in &all {
        if shown.len() < MAX_MATRIX_NODES {
            shown.insert(n);
        }
    }
    let nodes = shown
        .iter()
        .map(|n| MatrixNode {
            name: n.to_string(),
            suspect: suspects.contains(*n),
            retested: suspects.contains(*n) && retest_nodes.contains(n),
        })
        .collect();
    let cells = rows
        .iter()
        .filter(|p| shown.contains(p.a.as_str()) && shown.contains(p.b.as_str()))
        .map(|p| PairCell {
            path_fault: paths
                .contains(&(p.a.clone().min(p.b.clone()), p.a.clone().max(p.b.clone()))),
            pair: p.clone(),
        })
        .collect();
    Some(PairMatrix {
        status,
        nodes,
        cells,
        hidden: all.len() - shown.len(),
    })
}

impl HtmlReport {
    /// The page's model of `src`.
    pub fn of(src: &Sources<'_>) -> HtmlReport {
        let run = src.run;
        let name = run.metadata.name.clone().unwrap_or_default();
        let st = run.status.clone().unwrap_or_default();
        let entries = entries(src);
        let mut bad: Vec<&NodeRunResult> = entries.iter().filter(|e| e.verdict.is_bad()).collect();
        bad.sort_by_key(|e| (std::cmp::Reverse(e.findings), e.node.clone()));
        let failing = bad
            .iter()
            .take(MAX_DETAILS)
            .map(|e| {
                let kept = match src.kept_note {
                    Some(note) => Kept::NotKept(note.to_string()),
                    None => kept(src.kept, &e.node, &name, src.confirmation),
                };
                let doc = match &kept {
                    Kept::Document { doc, .. } => Some(doc),
                    Kept::NotKept(_) => None,
                };
                // The product the health rules judged by: the document's, else the label's.
                let product = doc
                    .and_then(|d| d.gpus.first())
                    .map(|g| g.product.clone())
                    .filter(|p| !p.trim().is_empty())
                    .or_else(|| e.product.clone());
                let (busbw_floor, pair_floor) = floors(run, product.as_deref(), doc.map(|d| &**d));
                NodeDetail {
                    findings: st
                        .findings
                        .iter()
                        .filter(|f| crate::findings::names_node(f, &e.node))
                        .cloned()
                        .collect(),
                    busbw_floor,
                    pair_floor,
                    entry: (*e).clone(),
                    kept,
                }
            })
            .collect();
        let failing_not_drawn = bad
            .iter()
            .skip(MAX_DETAILS)
            .map(|e| e.node.clone())
            .collect();
        let mut order: Vec<&NodeRunResult> = entries.iter().collect();
        order.sort_by_key(|e| (!e.verdict.is_bad(), e.node.clone()));
        let trends = order
            .iter()
            .take(MAX_TRENDS)
            .map(|e| TrendRow {
                node: e.node.clone(),
                verdict: e.verdict,
                trend: trend_of(src.nodes, &e.node, &run.spec.test),
            })
            .collect();
        let trends_not_drawn = order.len().saturating_sub(MAX_TRENDS);
        HtmlReport {
            run: name,
            test: run.spec.test.clone(),
            trigger: run.spec.trigger.as_str().into(),
            phase: format!("{:?}", st.phase),
            started: st.start_time.as_ref().map(|t| t.0.to_string()),
            duration: st.duration.clone(),
            message: st.message.clone(),
            generated_at: src.generated_at.to_string(),
            pairs: pair_matrix(src, &entries),
            fleet: Fleet {
                skipped: st.skipped.clone(),
                skipped_count: st.skipped_count.max(st.skipped.len() as u32),
                nodes: entries,
            },
            findings: st.findings.clone(),
            finding_count: st.finding_count.max(st.findings.len() as u32),
            failing,
            failing_not_drawn,
            ddp: st.ddp_nodes.clone(),
            nccl: st.nccl_nodes.clone(),
            trends_not_drawn,
            trends,
            gpus_out: src.gpus_out.to_vec(),
        }
    }
}

#[cfg(test)]
mod floor_tests {
    use super::*;
    use crate::fixtures;
    use gpufabric_api::Severity;
    use gpufabric_api::result::{SweepRow, Timing};
    use gpufabric_health::{NodeInput, evaluate};

    /// The fixture's node with its all_reduce peaking near `peak`, its sweep ending at
    /// 2^`last` bytes, with or without its GPU-pair copies.
    fn node(peak: f64, last: u32, pairs: bool) -> ResultDocument {
        let mut doc = fixtures::document("n1", (9, 9), peak);
        if !pairs {
            doc.pairs = None;
        }
        if let Some(n) = doc.nccl.as_mut() {
            for c in &mut n.collectives {
                c.rows.retain(|r| r.bytes <= 1 << last);
                while c.rows.last().is_some_and(|r| r.bytes < 1 << last) {
                    let bytes = c.rows.last().map_or(8, |r| 2 * r.bytes);
                    let busbw = peak * bytes as f64 / (bytes as f64 + 4e6);
                    c.rows.push(SweepRow {
                        bytes,
                        count: bytes / 4,
                        out_of_place: Timing {
                            time_us: bytes as f64 / busbw / 1e3,
                            algbw: busbw,
                            busbw,
                            wrong: 0,
                        },
                        in_place: None,
                    });
                }
            }
        }
        doc
    }

    /// Whether the rules name what holds the node's all_reduce down: a Critical finding on
    /// its all_reduce, or on a GPU or GPU pair of it (which explains every collective).
    fn has_finding(run: &FabricTestRun, doc: &ResultDocument) -> bool {
        let e = evaluate(
            &[NodeInput::measured(CompactResult::from(doc))],
            &run.spec.thresholds,
        );
        e.findings.iter().any(|f| {
            f.severity == Severity::Critical
                && match f.subject {
                    Subject::Node { .. } => {
                        f.metric == Metric::NcclBusBw && f.collective == Some(Collective::AllReduce)
                    }
                    Subject::Gpu { .. } | Subject::GpuPair { .. } => true,
                    _ => false,
                }
        })
    }

    fn all_reduce_peak(doc: &ResultDocument) -> f64 {
        doc.nccl
            .iter()
            .flat_map(|n| &n.collectives)
            .filter(|c| c.collective == Collective::AllReduce)
            .flat_map(|c| &c.rows)
            .map(|r| r.out_of_place.busbw)
            .fold(0.0, f64::max)
    }

    /// Every sweep end the rules know (64 MiB to 1 GiB) and one they do not judge (1 MiB),
    /// the profile's floor and the spec's threshold, with and without pair copies: an
    /// all_reduce curve under the drawn floor always has a finding, and without pair copies
    /// (the floor the only rule) one above it has none.
    #[test]
    fn a_curve_under_a_drawn_floor_has_a_finding_and_one_above_it_none() {
        let mut run = fixtures::run();
        for threshold in [None, Some(300.0)] {
            run.spec.thresholds.nccl_bus_bw_gbps = threshold;
            for last in [20, 26, 27, 28, 29, 30] {
                for pairs in [false, true] {
                    let mut drawn_any = false;
                    for step in 0..=100 {
                        let doc = node(150.0 + 2.0 * f64::from(step), last, pairs);
                        let product = doc.gpus.first().map(|g| g.product.clone());
                        let (floor, _) = floors(&run, product.as_deref(), Some(&doc));
                        let Some(floor) = floor else {
                            continue;
                        };
                        drawn_any = true;
                        let peak = all_reduce_peak(&doc);
                        let found = has_finding(&run, &doc);
                        let case = format!(
                            "sweep to 2^{last}, threshold {threshold:?}, pairs {pairs}: peak {peak:.1} against a drawn floor of {} ({})",
                            floor.gbps, floor.source
                        );
                        if peak < floor.gbps {
                            assert!(found, "no finding: {case}");
                        } else if !pairs {
                            assert!(!found, "a finding above the line: {case}");
                        }
                    }
                    assert_eq!(drawn_any, last >= 26, "sweep to 2^{last}");
                }
            }
        }
    }
}
