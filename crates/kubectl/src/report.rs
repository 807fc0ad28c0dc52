//! What a run found, as tables: per-node results and findings, node pairs, the multi-node
//! DDP probe, the test's quarantined and held-back nodes, and the nodes not measured.
//! `kubectl gpufabric report RUN` prints them, and so does the demo.

use crate::doc::{Doc, Table, fmt_opt, wire};
use crate::findings::subject;
use crate::output::View;
use crate::status::HeldBack;
use gpufabric_api::pair::{NetTransport, PairState};
use gpufabric_api::shard::FabricTestRunShard;
use gpufabric_api::{FabricTest, FabricTestRun, keys};
use k8s_openapi::api::core::v1::Node;
use serde::Serialize;

/// One node pair of a run, from its rank-0 node's record.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PairRow {
    pub round: u32,
    pub index: u32,
    /// A retest of a suspect against a known-good partner.
    pub confirmation: bool,
    pub a: String,
    pub b: String,
    pub state: PairState,
    pub busbw_gbps: Option<f64>,
    pub transport: Option<NetTransport>,
    pub message: Option<String>,
}

/// Every pair the shards of a run record, each once (from its rank-0 node), by round.
pub fn pair_rows(shards: &[FabricTestRunShard]) -> Vec<PairRow> {
    let mut pairs: Vec<PairRow> = shards
        .iter()
        .filter_map(|s| s.status.as_ref())
        .flat_map(|s| &s.nodes)
        .flat_map(|e| {
            e.pairs.iter().filter(|p| p.rank == 0).map(|p| PairRow {
                round: p.round,
                index: p.index,
                confirmation: p.confirmation,
                a: e.node.clone(),
                b: p.partner.clone(),
                state: p.state,
                busbw_gbps: p.busbw_gbps,
                transport: p.transport,
                message: p.message.clone(),
            })
        })
        .collect();
    pairs.sort_by_key(|p| (p.round, p.index));
    pairs
}

fn run_name(r: &FabricTestRun) -> String {
    r.metadata.name.clone().unwrap_or_default()
}

/// One run's per-node results and findings.
pub fn run_doc(r: &FabricTestRun) -> Doc {
    let st = r.status.clone().unwrap_or_default();
    let mut doc = Doc::default();
    doc.heading(format!(
        "run {} ({}): per-node results",
        run_name(r),
        r.spec.trigger.as_str()
    ));
    let mut t = Table::new(&[
        "NODE",
        "VERDICT",
        "PRODUCT",
        "ALLREDUCE GB/s",
        "MIN PAIR GB/s",
        "DDP EFF",
        "FINDINGS",
        "REASON",
    ]);
    for n in &st.nodes {
        t.push(vec![
            n.node.clone(),
            n.verdict.name().into(),
            n.product.clone().unwrap_or_default(),
            fmt_opt(n.all_reduce_bus_bw_gbps, 1),
            fmt_opt(n.min_pair_gbps, 1),
            fmt_opt(n.ddp_efficiency, 3),
            n.findings.to_string(),
            n.reason.clone().unwrap_or_default(),
        ]);
    }
    doc.table(t);
    doc.heading(format!("findings ({})", st.findings.len()));
    let mut t = Table::new(&[
        "SEVERITY",
        "NODE",
        "SUBJECT",
        "METRIC",
        "MEASURED",
        "EXPECTED",
        "DEVIATION",
        "MESSAGE",
    ]);
    for f in &st.findings {
        let unit = f.unit.clone().unwrap_or_default();
        t.push(vec![
            wire(&f.severity),
            f.subject.node_name().to_string(),
            subject(&f.subject),
            wire(&f.metric),
            format!("{} {unit}", fmt_opt(f.measured, 2)),
            format!("{} {unit}", fmt_opt(f.expected, 2)),
            f.deviation
                .map(|d| format!("{:+.0}%", d * 100.0))
                .unwrap_or_default(),
            f.message.clone(),
        ]);
    }
    doc.table(t);
    doc
}

/// The confirmation rounds of a node-pair phase in words: ", round 3 retests 5 suspect(s)",
/// ", rounds 3 and 4 retest 7 suspect(s)" with a second, or nothing without one.
pub fn retest_words(np: &gpufabric_api::pair::NodePairsStatus) -> String {
    match (np.confirmation_round, np.second_confirmation_round) {
        (Some(c), Some(d)) => format!(", rounds {c} and {d} retest {} suspect(s)", np.retested),
        (Some(c), None) => format!(", round {c} retests {} suspect(s)", np.retested),
        _ => String::new(),
    }
}

/// The run's node-pair phase: its rounds, and every pair of it (see [`pair_rows`]). Empty
/// for a run without one.
pub fn pairs_doc(r: &FabricTestRun, pairs: &[PairRow]) -> Doc {
    let mut doc = Doc::default();
    let Some(np) = r.status.as_ref().and_then(|s| s.node_pairs.as_ref()) else {
        return doc;
    };
    doc.heading(format!(
        "run {}: node pairs ({} of the nodes that passed their own check, {} rounds{}, {} pairs: {} measured, {} not measured, {} errored; median {} GB/s)",
        run_name(r),
        np.candidates,
        np.rounds,
        retest_words(np),
        np.pairs,
        np.measured,
        np.not_measured,
        np.errored,
        fmt_opt(np.within.as_ref().and_then(|w| w.median_gbps), 1),
    ));
    let mut t = Table::new(&[
        "ROUND",
        "PAIR",
        "STATE",
        "BUSBW GB/s",
        "TRANSPORT",
        "MESSAGE",
    ]);
    for p in pairs {
        t.push(vec![
            format!(
                "{}{}",
                p.round,
                if p.confirmation { " (retest)" } else { "" }
            ),
            format!("{} <-> {}", p.a, p.b),
            wire(&p.state),
            fmt_opt(p.busbw_gbps, 1),
            p.transport.map(|t| wire(&t)).unwrap_or_default(),
            p.message.clone().unwrap_or_default(),
        ]);
    }
    doc.table(t);
    doc
}

/// The heading of a multi-node phase: `title` (the run and the phase) over its nodes, and how
/// it ended.
fn group_heading(
    title: String,
    nodes: &[String],
    state: &gpufabric_api::pair::PairState,
    message: Option<&str>,
) -> String {
    format!(
        "{title} over {} ({}{})",
        nodes.join(", "),
        wire(state),
        message.map(|m| format!(": {m}")).unwrap_or_default()
    )
}

/// The run's multi-node DDP probe: its nodes, and step time and efficiency per node count.
/// Empty for a run without one.
pub fn ddp_nodes_doc(r: &FabricTestRun) -> Doc {
    let mut doc = Doc::default();
    let Some(p) = r.status.as_ref().and_then(|s| s.ddp_nodes.as_ref()) else {
        return doc;
    };
    doc.heading(group_heading(
        format!("run {}: multi-node DDP probe", run_name(r)),
        &p.nodes,
        &p.state,
        p.message.as_deref(),
    ));
    let mut t = Table::new(&[
        "NODES",
        "GPUS",
        "STEP ms",
        "EFFICIENCY",
        "COMM ALONE ms",
        "EXPOSED COMM ms",
    ]);
    for x in &p.points {
        t.push(vec![
            x.nodes.to_string(),
            x.gpus.to_string(),
            format!("{:.2}", x.step_ms),
            format!("{:.1}%", x.scaling_efficiency * 100.0),
            format!("{:.2}", x.comm_alone_ms),
            format!("{:.2}", x.exposed_comm_ms),
        ]);
    }
    doc.table(t);
    for s in &p.stragglers {
        doc.line(format!(
            "straggler: {} computes a step {:.1}% slower than the fastest node",
            s.node, s.slower_percent
        ));
    }
    doc
}

/// The run's multi-node NCCL sweep: its nodes, and per node count each collective's busbw at
/// the large sizes and time at the smallest (nccl-tests' columns), then each knee; with
/// topology blocks, the same for each block's sweep, and the blocks slower than the others.
/// Empty for a run without one.
pub fn nccl_nodes_doc(r: &FabricTestRun) -> Doc {
    let mut doc = Doc::default();
    let Some(p) = r.status.as_ref().and_then(|s| s.nccl_nodes.as_ref()) else {
        return doc;
    };
    let across = match &p.topology_key {
        Some(key) => format!(" across blocks of {key}"),
        None => String::new(),
    };
    sweep_doc(
        &mut doc,
        format!("run {}: multi-node NCCL sweep{across}", run_name(r)),
        &p.sweep,
    );
    let key = p.topology_key.as_deref().unwrap_or_default();
    for b in &p.blocks {
        sweep_doc(
            &mut doc,
            format!(
                "run {}: multi-node NCCL sweep in block {key}={}",
                run_name(r),
                b.value
            ),
            &b.sweep,
        );
    }
    for b in &p.slow_blocks {
        doc.line(format!("slow block: {}", b.message));
    }
    for g in &p.link_gaps {
        let what = match g.kind {
            gpufabric_api::link_ceiling::LinkGapKind::Below => "far below the links",
            gpufabric_api::link_ceiling::LinkGapKind::Above => "above the links",
        };
        doc.line(format!("{what}: {}", g.message));
    }
    doc
}

/// One sweep under `title`: its nodes, state, curve table (each collective's busbw beside the
/// ceiling its links allow, where known), what bounds the links, and its knees.
fn sweep_doc(doc: &mut Doc, title: String, p: &gpufabric_api::nccl_nodes::NcclNodesSweep) {
    doc.heading(group_heading(
        title,
        &p.nodes,
        &p.state,
        p.message.as_deref(),
    ));
    let collectives = p.collectives();
    let ceilinged: Vec<bool> = collectives
        .iter()
        .map(|c| p.points.iter().any(|x| x.ceiling(*c).is_some()))
        .collect();
    let mut header = vec!["NODES".to_string(), "RANKS".to_string()];
    for (c, has) in collectives.iter().zip(&ceilinged) {
        let name = c.nccl_tests_name().to_uppercase();
        header.push(format!("{name} busbw GB/s"));
        header.push(format!("{name} small us"));
        if *has {
            header.push(format!("{name} links GB/s"));
        }
    }
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut t = Table::new(&header);
    for x in &p.points {
        let mut row = vec![x.nodes.to_string(), x.ranks.to_string()];
        for (c, has) in collectives.iter().zip(&ceilinged) {
            match x.summary.iter().find(|s| s.collective == *c) {
                Some(s) => {
                    row.push(format!("{:.1}", s.large_busbw));
                    row.push(format!("{:.1}", s.small_time_us));
                }
                None => row.extend([String::new(), String::new()]),
            }
            if *has {
                row.push(
                    x.ceiling(*c)
                        .map(|k| format!("{:.1} ({:.0}%)", k.busbw, k.share * 100.0))
                        .unwrap_or_default(),
                );
            }
        }
        t.push(row);
    }
    doc.table(t);
    // What bounds the links, once per run of counts it holds for.
    let mut last: Option<String> = None;
    for x in &p.points {
        let Some(l) = &x.links else { continue };
        let said = l.describe();
        if last.as_deref() != Some(said.as_str()) {
            let what = if l.gbps.is_some() {
                format!("links from {} nodes: bounded by {said}", x.nodes)
            } else {
                format!("links from {} nodes: no ceiling, {said}", x.nodes)
            };
            doc.line(what);
            last = Some(said);
        }
    }
    for k in &p.knees {
        doc.line(format!("knee: {}", k.message));
    }
}

/// What is done to a node that carries any of gpufabric's quarantine marks.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NodeMarks {
    pub node: String,
    pub cordoned: bool,
    /// The value of the `gpufabric.io/quarantined` label.
    pub label: Option<String>,
    /// It carries the `gpufabric.io/quarantined` taint.
    pub tainted: bool,
}

impl NodeMarks {
    /// The marks of `n`: none when it is neither cordoned, labelled nor tainted.
    pub fn of(n: &Node) -> Option<NodeMarks> {
        let cordoned = n
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        let tainted = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == keys::TAINT_QUARANTINED));
        let label = n
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(keys::LABEL_QUARANTINED))
            .cloned();
        (cordoned || tainted || label.is_some()).then(|| NodeMarks {
            node: n.metadata.name.clone().unwrap_or_default(),
            cordoned,
            label,
            tainted,
        })
    }
}

/// The nodes a test holds in quarantine, the marks on the cluster's nodes, and the failing
/// nodes it holds back.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Quarantine {
    pub test: String,
    pub quarantined: Vec<String>,
    /// Every node cordoned, labelled or tainted as quarantined (by this test or not).
    pub marked: Vec<NodeMarks>,
    pub held_back: Vec<HeldBack>,
    /// GPUs it took out of service with DRA device taints (their nodes stay schedulable).
    pub gpus_out_of_service: Vec<crate::gpus_out::GpuOut>,
}

impl Quarantine {
    pub fn of(ft: &FabricTest, nodes: &[Node]) -> Quarantine {
        let s = crate::status::TestSummary::of(ft);
        Quarantine {
            test: s.name,
            quarantined: s.quarantined,
            marked: nodes.iter().filter_map(NodeMarks::of).collect(),
            held_back: s.held_back,
            gpus_out_of_service: s.gpus_out_of_service,
        }
    }

    pub fn doc(&self) -> Doc {
        let mut doc = Doc::default();
        doc.heading("quarantined nodes");
        doc.line(format!(
            "{} holds {} node(s) in quarantine: {}",
            self.test,
            self.quarantined.len(),
            if self.quarantined.is_empty() {
                "none".to_string()
            } else {
                self.quarantined.join(", ")
            }
        ));
        let mut t = Table::new(&["NODE", "CORDONED", "QUARANTINE LABEL", "TAINTED"]);
        for m in &self.marked {
            t.push(vec![
                m.node.clone(),
                m.cordoned.to_string(),
                m.label.clone().unwrap_or_default(),
                m.tainted.to_string(),
            ]);
        }
        doc.table(t);
        // Nodes that fail but are not acted on: over budget, Observe mode, the breaker open.
        if !self.held_back.is_empty() {
            doc.heading("failing nodes held back (reported, not acted on)");
            let mut t = Table::new(&["NODE", "WHY"]);
            for h in &self.held_back {
                t.push(vec![h.node.clone(), h.why.clone()]);
            }
            doc.table(t);
        }
        doc.extend(crate::gpus_out::doc(
            crate::gpus_out::HEADING,
            &self.gpus_out_of_service,
        ));
        doc
    }
}

/// The nodes no run measured, and why: skipped before the run (busy GPUs, someone's taint)
/// or not measured by it (an infrastructure reason). None of them is held against its node.
pub fn not_measured_doc(runs: &[FabricTestRun]) -> Doc {
    let mut t = Table::new(&["NODE", "RUN", "NOT MEASURED", "WHY"]);
    for r in runs {
        let run = run_name(r);
        let Some(st) = r.status.as_ref() else {
            continue;
        };
        for s in &st.skipped {
            t.push(vec![
                s.node.clone(),
                run.clone(),
                format!("skipped: {}", s.reason),
                s.message.clone(),
            ]);
        }
        for n in st.nodes.iter().filter(|n| n.not_measured.is_some()) {
            t.push(vec![
                n.node.clone(),
                run.clone(),
                n.not_measured
                    .map(|m| m.as_str())
                    .unwrap_or_default()
                    .into(),
                n.reason.clone().unwrap_or_default(),
            ]);
        }
    }
    let mut doc = Doc::default();
    doc.heading("nodes not measured (infrastructure, never held against the node)");
    if t.is_empty() {
        doc.line("none");
    } else {
        doc.table(t);
    }
    doc
}

/// `kubectl gpufabric report RUN`: the run, its pairs, and its test's quarantine.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub run: FabricTestRun,
    pub pairs: Vec<PairRow>,
    /// The test's quarantine now (none when the test is gone).
    pub quarantine: Option<Quarantine>,
}

impl View for Report {
    fn names(&self) -> Vec<String> {
        vec![crate::output::run_name(
            self.run.metadata.name.as_deref().unwrap_or_default(),
        )]
    }

    fn doc(&self) -> Doc {
        let mut doc = run_doc(&self.run);
        doc.extend(pairs_doc(&self.run, &self.pairs));
        doc.extend(ddp_nodes_doc(&self.run));
        doc.extend(nccl_nodes_doc(&self.run));
        if let Some(q) = &self.quarantine {
            doc.extend(q.doc());
        }
        doc.extend(not_measured_doc(std::slice::from_ref(&self.run)));
        doc
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use crate::output::{Format, render};

    fn report() -> Report {
        let nodes = [
            fixtures::node("h200-02", Some(fixtures::RECORD)),
            fixtures::node("h100-00", None),
        ];
        Report {
            run: fixtures::run(),
            pairs: pair_rows(&[fixtures::shard()]),
            quarantine: Some(Quarantine::of(&fixtures::test(), &nodes)),
        }
    }

    #[test]
    fn pairs_are_listed_once_from_their_rank_0_node_by_round() {
        let rows = pair_rows(&[fixtures::shard()]);
        let pairs: Vec<(u32, &str, &str)> = rows
            .iter()
            .map(|p| (p.round, p.a.as_str(), p.b.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [(1, "h100-05", "h200-02"), (4, "h200-02", "h100-00")]
        );
    }

    #[test]
    fn a_second_confirmation_round_is_named_beside_the_first() {
        let mut np = gpufabric_api::pair::NodePairsStatus {
            confirmation_round: Some(3),
            retested: 5,
            ..Default::default()
        };
        assert_eq!(retest_words(&np), ", round 3 retests 5 suspect(s)");
        np.second_confirmation_round = Some(4);
        np.retested = 7;
        assert_eq!(retest_words(&np), ", rounds 3 and 4 retest 7 suspect(s)");
        assert_eq!(retest_words(&Default::default()), "");
    }

    #[test]
    fn the_report_prints_the_demos_tables() {
        let text = render(&report(), &Format::Table).expect("text");
        for needle in [
            "==> run nightly-manual-1 (manual): per-node results",
            "h100-03  Failed       NVIDIA-H100-80GB-HBM3  361.5           95.0           0.970    1",
            "==> findings (2)",
            "Critical  h100-03  gpu 2<->5    pairBandwidth  95.00 GB/s  300.00 GB/s  -68%       GPU pair 2-5 copies at 95 GB/s",
            "Info      h100-05  <-> h200-02  nodePairBusBw",
            "rounds, round 4 retests 1 suspect(s), 2 pairs: 2 measured, 0 not measured, 0 errored; median 48.5 GB/s)",
            "1           h100-05 <-> h200-02  Measured  13.0        ib",
            "4 (retest)  h200-02 <-> h100-00  Measured  12.5        ib",
            "==> run nightly-manual-1: multi-node DDP probe over h100-00, h100-01 (Measured)",
            "2      16    21.00    95.2%",
            "    straggler: h100-01 computes a step 30.0% slower than the fastest node",
            "    nightly holds 1 node(s) in quarantine: h200-02",
            "h200-02  true      true              true",
            "h100-03  would quarantine: the budget",
            "h200-07  nightly-manual-1  skipped: Busy  8 of 8 GPUs in use",
            "h100-09  nightly-manual-1  Evicted",
        ] {
            assert!(text.contains(needle), "{needle:?} missing in:\n{text}");
        }
        // A node without marks is not in the quarantine table.
        assert!(!text.contains("h100-00  false"), "{text}");
    }

    #[test]
    fn the_report_lists_the_gpus_its_test_took_out_of_service() {
        let mut r = report();
        r.quarantine = Some(Quarantine::of(
            &fixtures::with_tainted_gpus(fixtures::test()),
            &[],
        ));
        let text = render(&r, &Format::Table).expect("text");
        assert!(
            text.contains(
                "==> GPUs out of service (DRA device taints; the node itself stays schedulable)"
            ),
            "{text}"
        );
        assert!(
            text.contains("h100-03  nightly  5    gpu.nvidia.com/h100-03/gpu-5  2026-11-21T02:04:10Z  gpufabric-gpu-q9w4z  GPU 5 computes a step 1.5x slower"),
            "{text}"
        );
        let json: serde_json::Value =
            serde_json::from_str(&render(&r, &Format::Json).expect("json")).expect("parses");
        assert_eq!(
            json["quarantine"]["gpusOutOfService"][1]["device"],
            "gpu.nvidia.com/h100-03/gpu-2"
        );
        let plain = render(&report(), &Format::Table).expect("text");
        assert!(!plain.contains("GPUs out of service"), "{plain}");
    }

    #[test]
    fn the_report_draws_the_nccl_curves_as_nodes_by_collective_per_block_and_names_knees_and_slow_blocks()
     {
        let mut r = report();
        if let Some(s) = r.run.status.as_mut() {
            s.nccl_nodes = Some(fixtures::nccl_nodes());
        }
        let text = render(&r, &Format::Table).expect("text");
        for needle in [
            "==> run nightly-manual-1: multi-node NCCL sweep over h100-00, h100-01, h100-02, h100-03 (Measured)",
            "NODES  RANKS  ALL_REDUCE busbw GB/s  ALL_REDUCE small us  ALL_REDUCE links GB/s  ALLTOALL busbw GB/s  ALLTOALL small us",
            "2      16     45.5                   41.2                 400.0 (11%)            38.0                 41.2",
            "4      32     14.0",
            "    links from 2 nodes: bounded by h100-01 (8 rails, 400.0 GB/s)",
            "    knee: all_reduce loses 69% of its bus bandwidth from 2 to 4 nodes",
        ] {
            assert!(text.contains(needle), "{needle:?} missing in:\n{text}");
        }

        // In topology blocks: the sweep across them, each block's, and the slow block named.
        if let Some(s) = r.run.status.as_mut() {
            s.nccl_nodes = Some(fixtures::in_blocks(fixtures::nccl_nodes()));
        }
        let text = render(&r, &Format::Table).expect("text");
        for needle in [
            "multi-node NCCL sweep across blocks of example.com/rack over h100-00",
            "multi-node NCCL sweep in block example.com/rack=rack-b over h100-02, h100-03 (Measured)",
            "2      16     9.5",
            "slow block: all_reduce over 2 nodes of block example.com/rack=rack-b reached 9.5 GB/s",
        ] {
            assert!(text.contains(needle), "{needle:?} missing in:\n{text}");
        }

        // A count far below its links is said once, under the sweeps.
        let p = fixtures::nccl_nodes_far_below_links();
        if let Some(s) = r.run.status.as_mut() {
            s.nccl_nodes = Some(p);
        }
        let text = render(&r, &Format::Table).expect("text");
        assert_eq!(
            text.matches("far below the links: all_reduce over 4 nodes reached 14.0 GB/s")
                .count(),
            1,
            "{text}"
        );
    }

    #[test]
    fn a_run_without_pairs_probe_or_skipped_nodes_has_none_of_their_sections() {
        let mut run = fixtures::run();
        if let Some(s) = run.status.as_mut() {
            s.node_pairs = None;
            s.ddp_nodes = None;
            s.skipped.clear();
            s.nodes.retain(|n| n.not_measured.is_none());
        }
        let r = Report {
            run,
            pairs: Vec::new(),
            quarantine: None,
        };
        let text = render(&r, &Format::Table).expect("text");
        assert!(!text.contains("node pairs"), "{text}");
        assert!(!text.contains("multi-node"), "{text}");
        assert!(!text.contains("quarantined nodes"), "{text}");
        assert!(
            text.ends_with(
                "==> nodes not measured (infrastructure, never held against the node)\n    none\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn json_and_yaml_carry_the_run_pairs_and_quarantine() {
        let r = report();
        let json: serde_json::Value =
            serde_json::from_str(&render(&r, &Format::Json).expect("json")).expect("parses");
        assert_eq!(json["run"]["metadata"]["name"], "nightly-manual-1");
        assert_eq!(json["run"]["status"]["findings"][0]["severity"], "Critical");
        assert_eq!(json["pairs"][1]["confirmation"], true);
        assert_eq!(json["pairs"][1]["busbwGbps"], 12.5);
        assert_eq!(json["quarantine"]["quarantined"][0], "h200-02");
        assert_eq!(json["quarantine"]["marked"][0]["cordoned"], true);
        assert_eq!(json["quarantine"]["heldBack"][0]["node"], "h100-03");
        let yaml: serde_json::Value =
            serde_yaml::from_str(&render(&r, &Format::Yaml).expect("yaml")).expect("parses");
        assert_eq!(yaml, json);
    }
}
