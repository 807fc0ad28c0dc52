//! What the run found, as tables: per-node results and findings, node pairs, the
//! multi-node DDP probe, quarantined and held-back nodes, and the nodes not measured.

use crate::print::{fmt_opt, info, print_table, step, wire};
use gpufabric_api::shard::FabricTestRunShard;
use gpufabric_api::{FabricTest, FabricTestRun, Subject, keys};
use gpufabric_tests::cluster::Cluster;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};

/// One run's per-node results and findings, as tables.
pub(crate) fn print_run(r: &FabricTestRun) {
    let st = r.status.clone().unwrap_or_default();
    step(format!(
        "run {} ({}): per-node results",
        r.metadata.name.clone().unwrap_or_default(),
        r.spec.trigger.as_str()
    ));
    let mut rows = vec![vec![
        "NODE".to_string(),
        "VERDICT".into(),
        "PRODUCT".into(),
        "ALLREDUCE GB/s".into(),
        "MIN PAIR GB/s".into(),
        "DDP EFF".into(),
        "FINDINGS".into(),
        "REASON".into(),
    ]];
    for n in &st.nodes {
        rows.push(vec![
            n.node.clone(),
            format!("{:?}", n.verdict),
            n.product.clone().unwrap_or_default(),
            fmt_opt(n.all_reduce_bus_bw_gbps, 1),
            fmt_opt(n.min_pair_gbps, 1),
            fmt_opt(n.ddp_efficiency, 3),
            n.findings.to_string(),
            n.reason.clone().unwrap_or_default(),
        ]);
    }
    print_table(&rows);
    step(format!("findings ({})", st.findings.len()));
    let mut rows = vec![vec![
        "SEVERITY".to_string(),
        "NODE".into(),
        "SUBJECT".into(),
        "METRIC".into(),
        "MEASURED".into(),
        "EXPECTED".into(),
        "DEVIATION".into(),
        "MESSAGE".into(),
    ]];
    for f in &st.findings {
        let subject = match &f.subject {
            Subject::GpuPair { a, b, .. } => format!("gpu {a}<->{b}"),
            Subject::Gpu { gpu, .. } => format!("gpu {gpu}"),
            Subject::NodePair { b, .. } => format!("<-> {b}"),
            Subject::Nic { port, .. } => port.clone(),
            Subject::Node { .. } => "node".into(),
        };
        let unit = f.unit.clone().unwrap_or_default();
        rows.push(vec![
            wire(&f.severity),
            f.subject.node_name().to_string(),
            subject,
            wire(&f.metric),
            format!("{} {unit}", fmt_opt(f.measured, 2)),
            format!("{} {unit}", fmt_opt(f.expected, 2)),
            f.deviation
                .map(|d| format!("{:+.0}%", d * 100.0))
                .unwrap_or_default(),
            f.message.clone(),
        ]);
    }
    print_table(&rows);
}

/// The run's node-pair phase: its rounds, and every pair of it from the shards (each pair
/// once, from its rank-0 node's record).
pub(crate) async fn print_pairs(cluster: &Cluster, r: &FabricTestRun) -> anyhow::Result<()> {
    let Some(np) = r.status.as_ref().and_then(|s| s.node_pairs.clone()) else {
        return Ok(());
    };
    let run = r.metadata.name.clone().unwrap_or_default();
    step(format!(
        "run {run}: node pairs ({} of the nodes that passed their own check, {} rounds{}, {} pairs: {} measured, {} not measured, {} errored; median {} GB/s)",
        np.candidates,
        np.rounds,
        np.confirmation_round
            .map(|c| format!(", round {c} retests {} suspect(s)", np.retested))
            .unwrap_or_default(),
        np.pairs,
        np.measured,
        np.not_measured,
        np.errored,
        fmt_opt(np.within.as_ref().and_then(|w| w.median_gbps), 1),
    ));
    let shards: Api<FabricTestRunShard> = Api::all(cluster.client());
    let lp = ListParams::default().labels(&format!("{}={run}", keys::LABEL_RUN));
    let mut pairs: Vec<(u32, u32, Vec<String>)> = Vec::new();
    for shard in shards.list(&lp).await?.items {
        for e in shard.status.map(|s| s.nodes).unwrap_or_default() {
            for p in e.pairs.iter().filter(|p| p.rank == 0) {
                pairs.push((
                    p.round,
                    p.index,
                    vec![
                        format!(
                            "{}{}",
                            p.round,
                            if p.confirmation { " (retest)" } else { "" }
                        ),
                        format!("{} <-> {}", e.node, p.partner),
                        wire(&p.state),
                        fmt_opt(p.busbw_gbps, 1),
                        p.transport.map(|t| wire(&t)).unwrap_or_default(),
                        p.message.clone().unwrap_or_default(),
                    ],
                ));
            }
        }
    }
    pairs.sort_by_key(|(round, index, _)| (*round, *index));
    let mut rows = vec![vec![
        "ROUND".to_string(),
        "PAIR".into(),
        "STATE".into(),
        "BUSBW GB/s".into(),
        "TRANSPORT".into(),
        "MESSAGE".into(),
    ]];
    rows.extend(pairs.into_iter().map(|(_, _, row)| row));
    print_table(&rows);
    Ok(())
}

/// The run's multi-node DDP probe: its nodes, and step time and efficiency per node count.
pub(crate) fn print_ddp_nodes(r: &FabricTestRun) {
    let Some(p) = r.status.as_ref().and_then(|s| s.ddp_nodes.clone()) else {
        return;
    };
    let run = r.metadata.name.clone().unwrap_or_default();
    step(format!(
        "run {run}: multi-node DDP probe over {} ({}{})",
        p.nodes.join(", "),
        wire(&p.state),
        p.message.map(|m| format!(": {m}")).unwrap_or_default()
    ));
    let mut rows = vec![vec![
        "NODES".to_string(),
        "GPUS".into(),
        "STEP ms".into(),
        "EFFICIENCY".into(),
        "COMM ALONE ms".into(),
        "EXPOSED COMM ms".into(),
    ]];
    rows.extend(p.points.iter().map(|x| {
        vec![
            x.nodes.to_string(),
            x.gpus.to_string(),
            format!("{:.2}", x.step_ms),
            format!("{:.1}%", x.scaling_efficiency * 100.0),
            format!("{:.2}", x.comm_alone_ms),
            format!("{:.2}", x.exposed_comm_ms),
        ]
    }));
    print_table(&rows);
    for s in &p.stragglers {
        info(format!(
            "straggler: {} computes a step {:.1}% slower than the fastest node",
            s.node, s.slower_percent
        ));
    }
}

/// The nodes the test holds in quarantine, what is done to them, and the failing nodes
/// held back.
pub(crate) async fn print_quarantine(cluster: &Cluster, ft: &FabricTest) -> anyhow::Result<()> {
    step("quarantined nodes");
    let quarantined = ft
        .status
        .as_ref()
        .map(|s| s.quarantined_nodes.clone())
        .unwrap_or_default();
    info(format!(
        "{} holds {} node(s) in quarantine: {}",
        ft.metadata.name.clone().unwrap_or_default(),
        quarantined.len(),
        if quarantined.is_empty() {
            "none".to_string()
        } else {
            quarantined.join(", ")
        }
    ));
    let nodes: Api<Node> = Api::all(cluster.client());
    let mut rows = vec![vec![
        "NODE".to_string(),
        "CORDONED".into(),
        "QUARANTINE LABEL".into(),
        "TAINTED".into(),
    ]];
    for n in nodes.list(&ListParams::default()).await?.items {
        let labels = n.metadata.labels.clone().unwrap_or_default();
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
        let label = labels.get(keys::LABEL_QUARANTINED).cloned();
        if cordoned || tainted || label.is_some() {
            rows.push(vec![
                n.metadata.name.clone().unwrap_or_default(),
                cordoned.to_string(),
                label.unwrap_or_default(),
                tainted.to_string(),
            ]);
        }
    }
    print_table(&rows);
    // Nodes that fail but are not acted on: over budget, Observe mode, cordoned by someone else.
    let held: Vec<(String, String)> = ft
        .status
        .as_ref()
        .map(|s| {
            s.nodes
                .iter()
                .filter_map(|n| n.held_back.clone().map(|why| (n.node.clone(), why)))
                .collect()
        })
        .unwrap_or_default();
    if !held.is_empty() {
        step("failing nodes held back (reported, not acted on)");
        let mut rows = vec![vec!["NODE".to_string(), "WHY".into()]];
        rows.extend(held.into_iter().map(|(n, why)| vec![n, why]));
        print_table(&rows);
    }
    Ok(())
}

/// The nodes no run measured, and why: skipped before the run (busy GPUs, someone's
/// taint) or not measured by it (an infrastructure reason). None of them is held against
/// its node.
pub(crate) fn not_measured(runs: &[FabricTestRun]) {
    let mut rows = vec![vec![
        "NODE".to_string(),
        "RUN".into(),
        "NOT MEASURED".into(),
        "WHY".into(),
    ]];
    for r in runs {
        let run = r.metadata.name.clone().unwrap_or_default();
        let Some(st) = r.status.as_ref() else {
            continue;
        };
        for s in &st.skipped {
            rows.push(vec![
                s.node.clone(),
                run.clone(),
                format!("skipped: {}", s.reason),
                s.message.clone(),
            ]);
        }
        for n in st.nodes.iter().filter(|n| n.not_measured.is_some()) {
            rows.push(vec![
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
    step("nodes not measured (infrastructure, never held against the node)");
    if rows.len() == 1 {
        info("none");
    } else {
        print_table(&rows);
    }
}
