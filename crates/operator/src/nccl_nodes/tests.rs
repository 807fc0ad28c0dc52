use super::*;
use crate::pairs::group::{GroupStep, decide};
use crate::pairs::rank::{RankEnd, RankPod};
use gpufabric_api::group::GroupHeader;
use gpufabric_api::nccl_nodes::{
    NCCL_NODES_SCHEMA, NcclNodesBlock, NcclNodesPoint, NcclNodesSummary,
};
use gpufabric_api::pair::{NotMeasured, PairCollective};
use gpufabric_api::result::Backend;
use gpufabric_api::run::FabricTestRunSpec;
use gpufabric_api::suite::Collective;

const RULE: Rule = Rule {
    score: 3.5,
    min_gap: 0.10,
    min_count: 3,
};

fn nodes(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("gpu-{i:02}")).collect()
}

fn run() -> FabricTestRun {
    let spec: FabricTestRunSpec = serde_json::from_value(serde_json::json!({
        "test": "nightly",
        "trigger": "Schedule",
        "nodes": nodes(4),
        "suite": {"ncclNodes": {
            "enabled": true,
            "collectives": ["allReduce", "allToAll"],
            "minBytes": 4096,
            "maxBytes": 1073741824,
            "iters": 50
        }},
    }))
    .unwrap_or_else(|e| panic!("a run spec parses: {e}"));
    let mut run = FabricTestRun::new("nightly-0200", spec);
    run.metadata.uid = Some("uid-1".into());
    run
}

/// A document over `n` nodes whose all_reduce runs at `busbw(k)` at k nodes and alltoall flat.
fn doc(n: u32, busbw: &dyn Fn(u32) -> f64) -> NcclNodesResult {
    let summary = |c: Collective, b: f64| NcclNodesSummary {
        collective: c,
        large_busbw: b,
        small_time_us: 30.0,
        wrong: 0,
    };
    let row = PairCollective {
        collective: Collective::AllReduce,
        bytes: 1 << 30,
        time_us: 1.0,
        algbw: 1.0,
        busbw: 1.0,
        wrong: 0,
    };
    NcclNodesResult {
        header: GroupHeader {
            duration_s: 30.0,
            gpus_per_node: 8,
            ..GroupHeader::new(
                NCCL_NODES_SCHEMA,
                "nightly-0200/nccl".into(),
                nodes(n as usize),
                0,
                Backend::Sim,
                "2026-11-29T02:00:00Z".into(),
            )
        },
        sizes: vec![1 << 10, 1 << 30],
        large_bytes: 64 << 20,
        points: [2, 4, 8]
            .into_iter()
            .filter(|k| *k <= n)
            .map(|k| NcclNodesPoint {
                nodes: k,
                node_names: nodes(k as usize),
                ranks: k * 8,
                summary: vec![
                    summary(Collective::AllReduce, busbw(k)),
                    summary(Collective::AllToAll, 40.0),
                ],
                links: None,
                rows: vec![row.clone()],
            })
            .collect(),
        not_measured: None,
        errors: Vec::new(),
    }
}

fn ended(d: NcclNodesResult) -> RankPod<NcclNodesResult> {
    RankPod::Ended(RankEnd::Document(Box::new(d)))
}

#[test]
fn the_sweep_pods_run_nccl_nodes_with_the_suites_collectives_and_sizes() {
    let run = run();
    let join = Rendezvous::Join {
        rank0_ip: "10.0.0.7".into(),
    };
    let pod = sweep_pod(&run, &nodes(4), None, 3, &join, 8).expect("builds");
    let spec = pod.spec.as_ref().expect("spec");
    assert_eq!(spec.node_name.as_deref(), Some("gpu-03"));
    let base = crate::pods::run_base(&run).expect("persisted");
    assert_eq!(pod.metadata.name, Some(format!("{base}-nccl-3")));
    assert_eq!(
        pod.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(gpufabric_api::keys::LABEL_ROLE))
            .map(String::as_str),
        Some(ROLE_NCCL_NODES)
    );
    let c = &spec.containers[0];
    let command = c.command.clone().unwrap_or_default();
    assert_eq!(
        &command[..4],
        &[
            "fabric-agent",
            "nccl-nodes",
            "--nodes",
            "gpu-00,gpu-01,gpu-02,gpu-03"
        ]
    );
    let at = |flag: &str| {
        command
            .iter()
            .position(|a| a == flag)
            .and_then(|i| command.get(i + 1))
            .cloned()
    };
    assert_eq!(at("--collectives").as_deref(), Some("allReduce,allToAll"));
    assert_eq!(at("--min-bytes").as_deref(), Some("4096"));
    assert_eq!(at("--max-bytes").as_deref(), Some("1073741824"));
    assert_eq!(at("--iters").as_deref(), Some("50"));
    assert_eq!(at("--large-bytes").as_deref(), Some("67108864"));
    let env = c.env.clone().unwrap_or_default();
    let value = |k: &str| {
        env.iter()
            .find(|e| e.name == k)
            .and_then(|e| e.value.clone())
    };
    assert_eq!(value(gpufabric_api::keys::ENV_RANK).as_deref(), Some("3"));
    assert_eq!(
        value(gpufabric_api::keys::ENV_GROUP).as_deref(),
        Some("nightly-0200/nccl")
    );
    assert!(
        sweep_pod(&run, &nodes(4), None, 4, &join, 8).is_err(),
        "no rank 4 of 4"
    );
}

#[test]
fn a_measured_sweep_keeps_each_node_counts_summaries_without_the_rows() {
    let n = nodes(8);
    let pods: Vec<_> = (0..8).map(|_| ended(doc(8, &|_| 40.0))).collect();
    let GroupStep::Settle(s) = decide(PairState::Joined, &pods, &n, false) else {
        panic!("settles");
    };
    let mut phase = NcclNodesStatus::begun(n);
    settle(&mut phase, s);
    let status = &phase.sweep;
    assert!(status.done);
    assert_eq!(status.state, PairState::Measured);
    assert_eq!(status.gpus_per_node, 8);
    let counts: Vec<(u32, u32)> = status.points.iter().map(|p| (p.nodes, p.ranks)).collect();
    assert_eq!(counts, vec![(2, 16), (4, 32), (8, 64)]);
    assert_eq!(
        status.curve(Collective::AllToAll),
        vec![(2, 40.0), (4, 40.0), (8, 40.0)]
    );
    let json = serde_json::to_string(&status).expect("serialises");
    assert!(
        !json.contains("rows") && !json.contains("nodeNames"),
        "{json}"
    );
    assert!(
        knees(status, None, 0.10).is_empty(),
        "a flat curve has no knee"
    );
}

#[test]
fn a_curve_that_falls_past_a_node_count_is_a_condition_on_the_run_and_judges_no_node() {
    let n = nodes(8);
    let falls = |k: u32| if k >= 8 { 12.0 } else { 40.0 };
    let pods: Vec<_> = (0..8).map(|_| ended(doc(8, &falls))).collect();
    let GroupStep::Settle(s) = decide(PairState::Joined, &pods, &n, false) else {
        panic!("settles");
    };
    let mut sweep = NcclNodesStatus::begun(n);
    settle(&mut sweep, s);
    judge(&mut sweep, &RULE, None);
    let knees_ = &sweep.sweep.knees;
    assert_eq!(knees_.len(), 1, "all_reduce only: {knees_:#?}");
    let k = &knees_[0];
    assert_eq!(k.collective, Collective::AllReduce);
    assert_eq!((k.from_nodes, k.at_nodes), (4, 8));
    assert_eq!((k.previous_busbw, k.busbw), (40.0, 12.0));
    let mut status = gpufabric_api::run::FabricTestRunStatus {
        nccl_nodes: Some(sweep),
        ..Default::default()
    };
    let at = crate::time::to_time(chrono::Utc::now());
    set_knee_condition(&mut status, Some(1), &at);
    let c = status
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_SCALING_KNEE)
        .expect("the condition");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "KneeInCurve")
    );
    assert!(
        c.message
            .starts_with("all_reduce loses 70% of its bus bandwidth from 4 to 8 nodes"),
        "{}",
        c.message
    );
    assert_eq!(status.message.as_deref(), Some(c.message.as_str()));
    assert!(status.findings.is_empty() && status.nodes.is_empty());

    // Not measured: no curve, no knee, nothing set.
    let mut lost = status.nccl_nodes.clone().expect("sweep");
    lost.sweep.state = PairState::NotMeasured;
    assert!(knees(&lost.sweep, None, 0.10).is_empty());
    let mut clean = gpufabric_api::run::FabricTestRunStatus::default();
    set_knee_condition(&mut clean, Some(1), &at);
    assert!(clean.conditions.is_empty() && clean.message.is_none());
}

#[test]
fn each_count_carries_its_links_ceiling_and_one_far_below_or_above_it_is_a_condition_on_the_run() {
    use gpufabric_api::link_ceiling::{LinkGapKind, LinksUnknown, NcclNodesLinks};
    let n = nodes(8);
    // gpu-01 has 4 of its 8 rails of 400 Gb/s up: 200 GB/s bounds every count.
    let with_links = |links: NcclNodesLinks| {
        let mut d = doc(8, &|_| 40.0);
        for p in &mut d.points {
            p.links = Some(links.clone());
        }
        ended(d)
    };
    let half = NcclNodesLinks {
        node: "gpu-01".into(),
        rails: 4,
        gbps: Some(200.0),
        unknown: None,
    };
    let pods: Vec<_> = (0..8).map(|_| with_links(half.clone())).collect();
    let GroupStep::Settle(s) = decide(PairState::Joined, &pods, &n, false) else {
        panic!("settles");
    };
    let mut sweep = NcclNodesStatus::begun(n.clone());
    settle(&mut sweep, s);
    judge(&mut sweep, &RULE, None);
    let two = &sweep.sweep.points[0];
    let ar = two.ceiling(Collective::AllReduce).expect("a ceiling");
    assert_eq!((ar.busbw, ar.share), (200.0, 0.2));
    // alltoall over 2 nodes of 8: half the traffic stays inside a node.
    let a2a = two.ceiling(Collective::AllToAll).expect("a ceiling");
    assert!((a2a.busbw - 46.875).abs() < 1e-9, "{a2a:?}");
    let gaps: Vec<(LinkGapKind, Collective, u32)> = sweep
        .link_gaps
        .iter()
        .map(|g| (g.kind, g.collective, g.nodes))
        .collect();
    assert_eq!(
        gaps,
        [
            (LinkGapKind::Below, Collective::AllReduce, 2),
            (LinkGapKind::Below, Collective::AllReduce, 4),
            (LinkGapKind::Below, Collective::AllReduce, 8),
        ],
        "alltoall above its ceiling is not judged (its bound assumes even traffic)"
    );
    let mut status = gpufabric_api::run::FabricTestRunStatus {
        nccl_nodes: Some(sweep),
        ..Default::default()
    };
    let at = crate::time::to_time(chrono::Utc::now());
    set_knee_condition(&mut status, Some(1), &at);
    let cond = |t: &str| {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == t)
            .unwrap_or_else(|| panic!("{t} is set: {:#?}", status.conditions))
    };
    let below = cond(CONDITION_BELOW_LINKS);
    assert_eq!(
        (below.status.as_str(), below.reason.as_str()),
        ("True", "FarBelowLinks")
    );
    assert!(
        below.message.starts_with(
            "all_reduce over 2 nodes reached 40.0 GB/s, 20% of the 200.0 GB/s the links allow (slowest node gpu-01 (4 rails, 200.0 GB/s))"
        ),
        "{}",
        below.message
    );
    assert!(
        !status
            .conditions
            .iter()
            .any(|c| c.type_ == CONDITION_ABOVE_LINKS),
        "{:#?}",
        status.conditions
    );
    // A judgement of the run: no node is blamed, none is cordoned.
    assert!(status.findings.is_empty() && status.nodes.is_empty());

    // One port of 160 Gb/s reported (20 GB/s) under rings that reach 40: the ceiling is wrong.
    let one_port = NcclNodesLinks {
        node: "gpu-01".into(),
        rails: 1,
        gbps: Some(20.0),
        unknown: None,
    };
    let pods: Vec<_> = (0..8).map(|_| with_links(one_port.clone())).collect();
    let GroupStep::Settle(s) = decide(PairState::Joined, &pods, &n, false) else {
        panic!("settles");
    };
    let mut sweep = NcclNodesStatus::begun(n.clone());
    settle(&mut sweep, s);
    judge(&mut sweep, &RULE, None);
    let mut status = gpufabric_api::run::FabricTestRunStatus {
        nccl_nodes: Some(sweep),
        ..Default::default()
    };
    set_knee_condition(&mut status, Some(1), &at);
    let above = status
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_ABOVE_LINKS)
        .expect("NcclAboveLinks is set");
    assert_eq!(above.reason, "AboveLinks");
    assert!(
        above.message.contains("cannot be trusted"),
        "{}",
        above.message
    );
    assert!(status.findings.is_empty() && status.nodes.is_empty());

    // Links unknown (sockets over veth): no ceiling, no condition, and the point says why.
    let veth = NcclNodesLinks {
        node: "gpu-00".into(),
        rails: 0,
        gbps: None,
        unknown: Some(LinksUnknown::NoPorts),
    };
    let pods: Vec<_> = (0..8).map(|_| with_links(veth.clone())).collect();
    let GroupStep::Settle(s) = decide(PairState::Joined, &pods, &n, false) else {
        panic!("settles");
    };
    let mut sweep = NcclNodesStatus::begun(n);
    settle(&mut sweep, s);
    judge(&mut sweep, &RULE, None);
    assert!(sweep.link_gaps.is_empty());
    assert!(sweep.sweep.points.iter().all(|p| p.ceilings.is_empty()));
    assert_eq!(
        sweep.sweep.points[0].links.as_ref().and_then(|l| l.unknown),
        Some(LinksUnknown::NoPorts)
    );
}

#[test]
fn a_sweep_rank_that_never_arrived_is_not_measured_and_one_stuck_is_named_for_the_sweep() {
    let n = nodes(3);
    let mut lost = doc(3, &|_| 40.0);
    lost.points.clear();
    lost.not_measured = Some(NotMeasured {
        peer: Some("gpu-02".into()),
        message: "rank 2 (gpu-02) never arrived within 40 s".into(),
    });
    let pods = vec![
        ended(lost.clone()),
        RankPod::Ended(RankEnd::Failed("exit 3".into())),
        RankPod::Running { ip: None },
    ];
    let GroupStep::Stop(s) = decide(PairState::Joined, &pods, &n, true) else {
        panic!("stops");
    };
    assert_eq!(s.state, PairState::NotMeasured);
    let m = s.message.unwrap_or_default();
    assert!(
        m.starts_with("rank 2 on gpu-02 was still running at the sweep's deadline")
            && m.contains("never arrived"),
        "{m}"
    );
    // A pod that never started: nobody's fault.
    let waiting = vec![
        RankPod::Running { ip: None },
        RankPod::Waiting { ip: None },
        RankPod::Running { ip: None },
    ];
    let GroupStep::Stop(s) = decide::<NcclNodesResult>(PairState::Joined, &waiting, &n, true)
    else {
        panic!("stops");
    };
    assert_eq!(s.state, PairState::NotMeasured);
    assert!(
        s.message
            .is_some_and(|m| m.contains("gpu-01 never started before the sweep's deadline"))
    );
    // Every rank hung: errored, as the probe's.
    let hung = vec![RankPod::<NcclNodesResult>::Running { ip: None }; 3];
    let GroupStep::Stop(s) = decide(PairState::Joined, &hung, &n, true) else {
        panic!("stops");
    };
    assert_eq!(s.state, PairState::Errored);
}

/// Nodes `b{block}-{i}` of 8 GPUs in blocks `rack-{block}` of `sizes[block]` nodes, and one
/// without the label.
fn labelled(sizes: &[usize]) -> Vec<(String, u32, Option<String>)> {
    let mut out: Vec<(String, u32, Option<String>)> = sizes
        .iter()
        .enumerate()
        .flat_map(|(b, n)| {
            (0..*n).map(move |i| (format!("b{b}-{i}"), 8, Some(format!("rack-{b}"))))
        })
        .collect();
    out.push(("loose".into(), 8, None));
    out
}

#[test]
fn nodes_are_chosen_per_block_and_one_of_each_block_across_them() {
    use crate::pairs::group::choose_blocks;
    let mut c = labelled(&[3, 5, 1]);
    // A node of another GPU count takes no part, in its block or across.
    c.push(("b0-odd".into(), 4, Some("rack-0".into())));
    let b = choose_blocks(&c, 4, 7);
    let values: Vec<&str> = b.blocks.iter().map(|(v, _)| v.as_str()).collect();
    assert_eq!(values, ["rack-0", "rack-1", "rack-2"]);
    let sizes: Vec<usize> = b.blocks.iter().map(|(_, n)| n.len()).collect();
    assert_eq!(sizes, [3, 4, 1], "at most maxNodes of a block: {b:#?}");
    assert_eq!(b.unlabelled, 1);
    assert_eq!(b.across.len(), 3, "{b:#?}");
    for (rep, (_, nodes)) in b.across.iter().zip(&b.blocks) {
        assert!(nodes.contains(rep), "{rep} of {nodes:?}");
    }
    assert_eq!(b.groups(), 3, "two blocks of 2+ nodes and the one across");
    assert_eq!(choose_blocks(&c, 4, 7), b, "the same seed, the same choice");
    // At most maxNodes blocks across.
    assert_eq!(
        choose_blocks(&labelled(&[2, 2, 2, 2]), 2, 1).across.len(),
        2
    );
}

#[test]
fn blocks_are_swept_one_after_the_other_with_pods_of_their_own_and_then_across_them() {
    let blocks = crate::pairs::group::Blocks {
        blocks: vec![
            ("rack-a".into(), vec!["a-0".into(), "a-1".into()]),
            ("rack-b".into(), vec!["b-0".into()]),
            ("rack-c".into(), vec!["c-0".into(), "c-1".into()]),
        ],
        across: vec!["a-0".into(), "b-0".into(), "c-1".into()],
        unlabelled: 0,
    };
    let mut status = NcclNodesStatus::begun_in_blocks("example.com/rack", blocks);
    assert_eq!(status.topology_key.as_deref(), Some("example.com/rack"));
    assert!(status.blocks[1].sweep.done, "one node: nothing inside it");
    let measured = |k: u32| {
        let n = nodes(2);
        let pods: Vec<_> = (0..2).map(|_| ended(doc(k, &|_| 40.0))).collect();
        let GroupStep::Settle(s) = decide(PairState::Joined, &pods, &n, false) else {
            panic!("settles");
        };
        s
    };
    let run = run();
    let base = crate::pods::run_base(&run).expect("persisted");
    let mut order = Vec::new();
    while !status.done() {
        let pod = status.pod(&run, 1, &Rendezvous::Listen, 8).expect("builds");
        order.push((
            status.nodes().to_vec(),
            status.pod_name(&base, 1),
            pod.metadata.name.clone().unwrap_or_default(),
        ));
        status.set_state(PairState::Joined);
        status.settle(measured(2));
        assert!(order.len() <= 3, "{status:#?}");
    }
    let groups: Vec<&[String]> = order.iter().map(|(n, _, _)| n.as_slice()).collect();
    assert_eq!(
        groups,
        [
            &["a-0".to_string(), "a-1".into()][..],
            &["c-0".to_string(), "c-1".into()][..],
            &["a-0".to_string(), "b-0".into(), "c-1".into()][..],
        ]
    );
    let names: Vec<&str> = order.iter().map(|(_, n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            format!("{base}-nccl-b0-1"),
            format!("{base}-nccl-b2-1"),
            format!("{base}-nccl-1")
        ]
    );
    assert!(order.iter().all(|(_, name, pod)| name == pod), "{order:#?}");
    assert!(
        [0, 2]
            .iter()
            .all(|&b| status.blocks[b].sweep.state == PairState::Measured)
    );
    assert_eq!(status.sweep.state, PairState::Measured);

    // Two blocks of one node each: nothing across, and the phase ends with the blocks.
    let lone = NcclNodesStatus::begun_in_blocks(
        "k",
        crate::pairs::group::Blocks {
            blocks: vec![("v".into(), vec!["x".into(), "y".into()])],
            across: vec!["x".into()],
            unlabelled: 2,
        },
    );
    assert!(!lone.done());
    let mut lone = lone;
    lone.settle(measured(2));
    assert!(lone.done());
    let m = lone.sweep.message.as_deref().unwrap_or_default();
    assert!(
        m.contains("2 node(s) without the label k took no part")
            && m.contains("nothing to sweep across blocks"),
        "{m}"
    );
}

#[test]
fn a_block_slower_than_the_others_is_a_warning_on_the_block_and_judges_no_node() {
    let sweep = |busbw: &dyn Fn(u32) -> f64| {
        let n = nodes(4);
        let pods: Vec<_> = (0..4).map(|_| ended(doc(4, busbw))).collect();
        let GroupStep::Settle(s) = decide(PairState::Joined, &pods, &n, false) else {
            panic!("settles");
        };
        let mut one = NcclNodesStatus::begun(n);
        settle(&mut one, s);
        one.sweep
    };
    let mut phase = NcclNodesStatus {
        sweep: sweep(&|_| 40.0),
        topology_key: Some("nvidia.com/gpu.clique".into()),
        blocks: ["clique-a", "clique-b", "clique-c", "clique-d"]
            .iter()
            .map(|v| NcclNodesBlock {
                value: v.to_string(),
                sweep: if *v == "clique-c" {
                    sweep(&|k| if k >= 4 { 22.0 } else { 39.0 })
                } else {
                    sweep(&|_| 40.0)
                },
            })
            .collect(),
        slow_blocks: Vec::new(),
        below_baseline: Vec::new(),
        link_gaps: Vec::new(),
    };
    judge(&mut phase, &RULE, None);
    let slow: Vec<(&str, &str, Collective, u32)> = phase
        .slow_blocks
        .iter()
        .map(|b| (b.key.as_str(), b.value.as_str(), b.collective, b.nodes))
        .collect();
    assert_eq!(
        slow,
        [(
            "nvidia.com/gpu.clique",
            "clique-c",
            Collective::AllReduce,
            4
        )],
        "{phase:#?}"
    );
    // The slow block's own curve has its knee too, named for the block.
    let block_knees = &phase.blocks[2].sweep.knees;
    assert_eq!(block_knees.len(), 1, "{block_knees:#?}");
    assert!(block_knees[0].message.contains("in block clique-c"));
    assert!(phase.sweep.knees.is_empty());
    let mut status = gpufabric_api::run::FabricTestRunStatus {
        nccl_nodes: Some(phase),
        ..Default::default()
    };
    let at = crate::time::to_time(chrono::Utc::now());
    set_knee_condition(&mut status, Some(1), &at);
    let c = status
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_SLOW_BLOCK)
        .expect("the slow-block condition");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "SlowBlock")
    );
    assert!(
        c.message
            .contains("of block nvidia.com/gpu.clique=clique-c reached 22.0 GB/s"),
        "{}",
        c.message
    );
    assert!(
        status
            .message
            .as_deref()
            .is_some_and(|m| m.contains(&c.message))
    );
    assert!(status.findings.is_empty() && status.nodes.is_empty());
}

#[test]
fn a_sweep_far_below_the_tests_earlier_sweeps_is_a_condition_on_the_run_and_feeds_no_baseline_twice()
 {
    use gpufabric_api::baseline::testing::one_series;
    use gpufabric_api::baseline::{FleetBaseline, Series, Spread};
    use gpufabric_health::evaluate::baseline::Against;
    let spread = Spread {
        median: 40.0,
        p10: 39.0,
        p90: 41.0,
        n: 8,
    };
    let baseline = one_series(
        &Series::Sweep(Collective::AllReduce, 8).to_string(),
        spread,
        &[("r1", 1_000), ("r2", 2_000)],
    );
    let against = Against {
        baseline: &baseline,
        suite: "s",
        settings: "n",
        now: 3_000,
    };
    let n = nodes(8);
    // Flat at 20 GB/s: no knee, but half of what the test's sweeps reached over 8 nodes.
    let pods: Vec<_> = (0..8).map(|_| ended(doc(8, &|_| 20.0))).collect();
    let GroupStep::Settle(s) = decide(PairState::Joined, &pods, &n, false) else {
        panic!("settles");
    };
    let mut sweep = NcclNodesStatus::begun(n);
    settle(&mut sweep, s);
    judge(&mut sweep, &RULE, Some(&against));
    assert!(sweep.sweep.knees.is_empty());
    let below: Vec<(Collective, u32, f64)> = sweep
        .below_baseline
        .iter()
        .map(|b| (b.collective, b.nodes, b.expected))
        .collect();
    assert_eq!(below, [(Collective::AllReduce, 8, 40.0)], "{sweep:#?}");
    let mut status = gpufabric_api::run::FabricTestRunStatus {
        nccl_nodes: Some(sweep.clone()),
        ..Default::default()
    };
    let at = crate::time::to_time(chrono::Utc::now());
    set_knee_condition(&mut status, Some(1), &at);
    let c = status
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_SWEEP_BELOW_BASELINE)
        .expect("the below-baseline condition");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "SweepSlow")
    );
    assert!(
        c.message.starts_with("all_reduce over 8 nodes (") && c.message.contains("50% below"),
        "{}",
        c.message
    );
    assert!(status.findings.is_empty() && status.nodes.is_empty());
    // Without a baseline for the count, nothing.
    let empty = FleetBaseline::default();
    let none = Against {
        baseline: &empty,
        ..against
    };
    judge(&mut sweep, &RULE, Some(&none));
    assert!(sweep.below_baseline.is_empty());
}
