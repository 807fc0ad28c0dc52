use super::*;
use crate::pairs::rank::RankEnd;
use gpufabric_api::ddp_nodes::{DDP_NODES_SCHEMA, DdpNodesPoint, DdpStraggler};
use gpufabric_api::group::GroupHeader;
use gpufabric_api::pair::NotMeasured;
use gpufabric_api::result::{Backend, DdpPoint, ErrorKind, Phase, PhaseError};
use gpufabric_api::run::FabricTestRunSpec;

fn nodes(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("gpu-{i:02}")).collect()
}

fn doc(k: u32) -> DdpNodesResult {
    DdpNodesResult {
        header: GroupHeader {
            duration_s: 12.0,
            gpus_per_node: 8,
            ..GroupHeader::new(
                DDP_NODES_SCHEMA,
                "nightly/ddp".into(),
                nodes(k as usize),
                0,
                Backend::Sim,
                "2026-11-25T02:00:00Z".into(),
            )
        },
        hidden: 8192,
        layers: 8,
        batch_per_gpu: 4096,
        buckets: vec![1 << 20],
        points: [1, k]
            .iter()
            .map(|&n| DdpNodesPoint {
                nodes: n,
                point: DdpPoint {
                    gpus: n * 8,
                    step_ms: if n == 1 { 100.0 } else { 125.0 },
                    samples_per_s: 1.0,
                    scaling_efficiency: if n == 1 { 1.0 } else { 0.8 },
                    comm_fraction: 0.2,
                    overlap_efficiency: 0.5,
                    tflops_per_gpu: 400.0,
                    compute_ms: vec![],
                    gpu_indices: vec![],
                },
                compute_alone_ms: 90.0,
                comm_alone_ms: 40.0,
                exposed_comm_ms: 25.0,
                node_compute_ms: vec![90.0; n as usize],
            })
            .collect(),
        stragglers: vec![DdpStraggler {
            node: "gpu-02".into(),
            compute_ms: 130.0,
            fastest_ms: 90.0,
            slower_percent: 44.4,
        }],
        not_measured: None,
        errors: vec![],
    }
}

fn ended(d: DdpNodesResult) -> ProbePod {
    RankPod::Ended(RankEnd::Document(Box::new(d)))
}

fn running(ip: &str) -> ProbePod {
    RankPod::Running {
        ip: Some(ip.into()),
    }
}

#[test]
fn the_chosen_nodes_share_a_gpu_count_change_with_the_seed_and_are_sorted() {
    let mut c: Vec<(String, u32)> = nodes(10).into_iter().map(|n| (n, 8)).collect();
    c.push(("odd-4gpu".into(), 4));
    c.push(("no-gpus".into(), 0));
    let a = choose(&c, 4, 1);
    assert_eq!(a.len(), 4);
    assert!(a.iter().all(|n| n.starts_with("gpu-")), "{a:?}");
    assert!(a.windows(2).all(|w| w[0] < w[1]), "sorted: {a:?}");
    assert_eq!(choose(&c, 4, 1), a, "the same seed, the same set");
    let sets: std::collections::BTreeSet<Vec<String>> =
        (0..20).map(|seed| choose(&c, 4, seed)).collect();
    assert!(sets.len() > 1, "other seeds, other sets");
    assert_eq!(choose(&c, 16, 3).len(), 10, "at most the nodes there are");
    assert!(choose(&[("x".into(), 0)], 4, 0).is_empty());
}

#[test]
fn rank_0_first_then_every_other_rank_once_it_has_an_ip() {
    let n = nodes(4);
    let absent = vec![RankPod::Absent; 4];
    assert_eq!(
        decide(PairState::Pending, &absent, &n, false),
        ProbeStep::CreateRank0
    );
    let mut pods = absent.clone();
    pods[0] = RankPod::Waiting { ip: None };
    assert_eq!(
        decide(PairState::Listening, &pods, &n, false),
        ProbeStep::Wait
    );
    pods[0] = RankPod::Waiting {
        ip: Some("10.0.0.7".into()),
    };
    assert_eq!(
        decide(PairState::Listening, &pods, &n, false),
        ProbeStep::CreateOthers {
            ip: "10.0.0.7".into()
        }
    );
    let joined = vec![
        running("10.0.0.7"),
        running("a"),
        running("b"),
        running("c"),
    ];
    assert_eq!(
        decide(PairState::Joined, &joined, &n, false),
        ProbeStep::Wait
    );
}

#[test]
fn rank_0_s_document_settles_the_probe_once_every_rank_ended() {
    let n = nodes(4);
    let mut pods = vec![ended(doc(4)), running("a"), running("b"), running("c")];
    assert_eq!(decide(PairState::Joined, &pods, &n, false), ProbeStep::Wait);
    for p in &mut pods[1..] {
        *p = ended(doc(4));
    }
    let ProbeStep::Settle(s) = decide(PairState::Joined, &pods, &n, false) else {
        panic!("settles");
    };
    assert_eq!(s.state, PairState::Measured);
    let mut status = DdpNodesStatus {
        nodes: n.clone(),
        ..Default::default()
    };
    settle(&mut status, s);
    assert!(status.done);
    assert_eq!(status.points.len(), 2);
    assert_eq!(status.points[1].scaling_efficiency, 0.8);
    let f = findings(&status);
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].severity, Severity::Info, "reported, never acted on");
    assert_eq!(f[0].subject.node_name(), "gpu-02");
    assert!(f[0].message.contains("44.4% slower"), "{}", f[0].message);
}

#[test]
fn a_rank_that_never_arrived_or_was_not_admitted_is_not_measured() {
    let n = nodes(2);
    let mut lost = doc(2);
    lost.points.clear();
    lost.not_measured = Some(NotMeasured {
        peer: Some("gpu-01".into()),
        message: "rank 1 (gpu-01) never arrived within 40 s".into(),
    });
    let pods = vec![
        ended(lost),
        RankPod::Ended(RankEnd::Failed("exit 3".into())),
    ];
    let ProbeStep::Settle(s) = decide(PairState::Joined, &pods, &n, false) else {
        panic!("settles");
    };
    assert_eq!(s.state, PairState::NotMeasured);
    assert!(s.message.is_some_and(|m| m.contains("never arrived")));

    // The same with rank 1 still running at the deadline: it was stuck, and the message
    // says so before the others' account; still not measured.
    let mut lost = doc(3);
    lost.points.clear();
    lost.not_measured = Some(NotMeasured {
        peer: Some("gpu-02".into()),
        message: "rank 2 (gpu-02) never arrived within 40 s".into(),
    });
    let pods = vec![
        ended(lost),
        RankPod::Ended(RankEnd::Failed("exit 3".into())),
        running("c"),
    ];
    let ProbeStep::Stop(s) = decide(PairState::Joined, &pods, &nodes(3), true) else {
        panic!("stops");
    };
    assert_eq!(s.state, PairState::NotMeasured);
    let m = s.message.unwrap_or_default();
    assert!(
        m.starts_with(
            "rank 2 on gpu-02 was still running at the probe's deadline, after another rank"
        ) && m.contains("never arrived"),
        "{m}"
    );

    let pods = vec![
        RankPod::Ended(RankEnd::NotMeasured("evicted".into())),
        RankPod::Absent,
    ];
    let ProbeStep::Settle(s) = decide(PairState::Listening, &pods, &n, false) else {
        panic!("settles");
    };
    assert_eq!(s.state, PairState::NotMeasured);
}

#[test]
fn errors_hangs_and_pods_that_never_started_at_the_deadline() {
    let n = nodes(2);
    let mut bad = doc(2);
    bad.errors.push(PhaseError {
        phase: Phase::DdpProbe,
        kind: ErrorKind::Failed,
        message: "ncclAllReduce failed".into(),
    });
    let pods = vec![ended(bad), ended(doc(2))];
    let ProbeStep::Settle(s) = decide(PairState::Joined, &pods, &n, false) else {
        panic!("settles");
    };
    assert_eq!(s.state, PairState::Errored);
    assert!(s.message.is_some_and(|m| m.contains("ncclAllReduce")));

    let hung = vec![running("a"), running("b")];
    let ProbeStep::Stop(s) = decide(PairState::Joined, &hung, &n, true) else {
        panic!("stops");
    };
    assert_eq!(s.state, PairState::Errored);

    let stuck = vec![running("a"), RankPod::Waiting { ip: None }];
    let ProbeStep::Stop(s) = decide(PairState::Joined, &stuck, &n, true) else {
        panic!("stops");
    };
    assert_eq!(s.state, PairState::NotMeasured);
    assert!(s.message.is_some_and(|m| m.contains("gpu-01")));

    // Rank 0 stuck alone: named, not "never started".
    let mut left = doc(2);
    left.points.clear();
    left.not_measured = Some(NotMeasured {
        peer: Some("gpu-00".into()),
        message: "rank 0 (gpu-00) did not arrive within 40 s".into(),
    });
    let rank0_stuck = vec![running("a"), ended(left)];
    let ProbeStep::Stop(s) = decide(PairState::Joined, &rank0_stuck, &n, true) else {
        panic!("stops");
    };
    assert_eq!(s.state, PairState::NotMeasured);
    let m = s.message.unwrap_or_default();
    assert!(
        m.starts_with(
            "rank 0 on gpu-00 was still running at the probe's deadline, after another rank"
        ) && m.contains("did not arrive")
            && !m.contains("never started"),
        "{m}"
    );

    let gone = vec![running("a"), RankPod::Absent];
    let ProbeStep::Stop(s) = decide(PairState::Joined, &gone, &n, false) else {
        panic!("stops");
    };
    assert!(
        s.message
            .is_some_and(|m| m.contains("rank-1 pod on gpu-01 is gone"))
    );
}

#[test]
fn the_pods_run_the_probe_with_the_ddp_probe_shape() {
    let spec: FabricTestRunSpec = serde_json::from_value(serde_json::json!({
        "test": "nightly",
        "trigger": "Schedule",
        "nodes": ["gpu-00", "gpu-01", "gpu-02"],
        "suite": {"ddpProbe": {"hidden": 4096, "layers": 4}},
    }))
    .unwrap_or_else(|e| panic!("a run spec parses: {e}"));
    let mut run = FabricTestRun::new("nightly-0200", spec);
    run.metadata.uid = Some("uid-1".into());
    let n = nodes(3);
    let join = Rendezvous::Join {
        rank0_ip: "10.0.0.7".into(),
    };
    let pod = probe_pod(&run, &n, 2, &join, 8).expect("builds");
    let spec = pod.spec.as_ref().expect("spec");
    assert_eq!(spec.node_name.as_deref(), Some("gpu-02"));
    let base = crate::pods::run_base(&run).expect("persisted");
    assert!(base.starts_with("nightly-0200-"), "{base}");
    assert_eq!(pod.metadata.name, Some(format!("{base}-ddp-2")));
    let c = &spec.containers[0];
    let command = c.command.clone().unwrap_or_default();
    assert_eq!(
        &command[..4],
        &[
            "fabric-agent",
            "ddp-nodes",
            "--nodes",
            "gpu-00,gpu-01,gpu-02"
        ]
    );
    let at = |flag: &str| {
        command
            .iter()
            .position(|a| a == flag)
            .and_then(|i| command.get(i + 1))
            .cloned()
    };
    assert_eq!(at("--hidden").as_deref(), Some("4096"));
    assert_eq!(at("--layers").as_deref(), Some("4"));
    let env = c.env.clone().unwrap_or_default();
    let value = |k: &str| {
        env.iter()
            .find(|e| e.name == k)
            .and_then(|e| e.value.clone())
    };
    assert_eq!(value(gpufabric_api::keys::ENV_RANK).as_deref(), Some("2"));
    assert_eq!(
        value(gpufabric_api::keys::ENV_GROUP).as_deref(),
        Some("nightly-0200/ddp")
    );
    assert_eq!(
        value(gpufabric_api::keys::ENV_RENDEZVOUS).as_deref(),
        Some("10.0.0.7:29400")
    );
    assert!(
        probe_pod(&run, &n, 3, &join, 8).is_err(),
        "no rank 3 of 3 nodes"
    );
}

fn probe_status(efficiency_at_4: f64) -> DdpNodesStatus {
    let point = |nodes: u32, e: f64| gpufabric_api::ddp_nodes::DdpNodesSummary {
        nodes,
        gpus: nodes * 8,
        step_ms: 100.0,
        scaling_efficiency: e,
        comm_alone_ms: 10.0,
        exposed_comm_ms: 5.0,
    };
    DdpNodesStatus {
        nodes: nodes(4),
        state: PairState::Measured,
        points: vec![point(1, 1.0), point(2, 0.95), point(4, efficiency_at_4)],
        done: true,
        ..Default::default()
    }
}

/// A baseline that expects 92% at 4 nodes over 8 nodes' probes of suite "s".
fn probe_baseline() -> gpufabric_api::baseline::FleetBaseline {
    use gpufabric_api::baseline::{Series, Spread};
    let spread = Spread {
        median: 0.92,
        p10: 0.9,
        p90: 0.93,
        n: 4,
    };
    gpufabric_api::baseline::testing::one_series(
        &Series::Probe(4).to_string(),
        spread,
        &[("r", 1_000)],
    )
}

#[test]
fn a_probe_far_below_the_baseline_is_a_condition_on_the_run_and_no_nodes_finding() {
    let b = probe_baseline();
    let against = gpufabric_health::evaluate::Against {
        baseline: &b,
        suite: "s",
        settings: "n",
        now: 2_000,
    };
    let at = crate::time::to_time(chrono::Utc::now());
    let slow = probe_status(0.044);
    let found = shortfalls(&slow, &against, 0.1);
    assert_eq!(found.len(), 1, "{found:#?}");
    let mut status = gpufabric_api::run::FabricTestRunStatus::default();
    set_probe_condition(&mut status, &found, Some(1), &at);
    let c = status
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_PROBE_BELOW_BASELINE)
        .expect("the condition");
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("True", "ProbeSlow")
    );
    assert!(
        c.message
            .contains("over 4 nodes (gpu-00, gpu-01, gpu-02, gpu-03) ran at 4%"),
        "{}",
        c.message
    );
    assert_eq!(status.message.as_deref(), Some(c.message.as_str()));
    // No finding on a node: the probe's nodes passed their own tests.
    assert!(findings(&slow).is_empty());
    // Near the baseline, or not measured: nothing.
    assert!(shortfalls(&probe_status(0.9), &against, 0.1).is_empty());
    let mut lost = probe_status(0.044);
    lost.state = PairState::NotMeasured;
    assert!(shortfalls(&lost, &against, 0.1).is_empty());
    let mut clean = gpufabric_api::run::FabricTestRunStatus::default();
    set_probe_condition(&mut clean, &[], Some(1), &at);
    assert!(clean.conditions.is_empty() && clean.message.is_none());
}
