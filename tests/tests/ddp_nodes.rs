//! The multi-node DDP probe and the multi-node NCCL sweep of a run, end to end: the real
//! `fabric-operator` against a real control plane, the process-kubelet (each pod on its own
//! loopback address) and the sim agents, whose ranks really meet over TCP with the run's
//! secret.
//!
//! Six H200 nodes: `dn-06`'s NIC runs at a fifth of its speed, `dn-02` has a GPU that
//! computes 30% slower, and the path between `dn-05` and `dn-01` (no node pair of the ring)
//! carries a third of the rate. The node checks pass all six (the per-node DDP probe and the
//! compute checks are off, so nothing looks at compute there); the node pairs fail and
//! cordon `dn-06`; the probe then runs over the five others only, at 1, 2, 4 and 5 nodes,
//! and names `dn-02` a straggler, as an Info finding that cordons nothing. The NCCL sweep
//! runs after it over the same five, at 2, 4 and 5 nodes: its ring closes over the slow
//! path only at 5, where every collective's curve has its knee, a condition on the run that
//! fails and cordons no node.
//!
//! A fleet in three racks (a label), whose one rack's switch is degraded (the path between
//! its two nodes runs at a fifth of the rate), runs the sweep with that label as its
//! `topologyKey`: each rack's sweep, then one across racks; the slow rack is named on the
//! run, and no node is failed or cordoned for it.
//!
//! Build the binaries first: `cargo build --bins`, then
//! `cargo test -p gpufabric-tests --test ddp_nodes`.

use gpufabric_api::findings::Severity;
use gpufabric_api::pair::PairState;
use gpufabric_api::run::NodeVerdict;
use gpufabric_api::{FindingKind, Subject};
use gpufabric_measure::fleet::{Fault, Fleet};
use gpufabric_tests::fleet::{H200, SimFleet};
use gpufabric_tests::operator::{
    OperatorEnv, cordoned, last_run_name, quarantine_on_first_failure, sim_agent,
};
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use serde_json::json;

const TEST: &str = "ddp-nodes";
const SLOW_NIC: &str = "dn-06";
const STRAGGLER: &str = "dn-02";
/// The ends of the slow path: the ring of the first five nodes closes over it.
const SLOW_PATH: (&str, &str) = ("dn-05", "dn-01");

fn fleet() -> Fleet {
    let mut f = SimFleet::uniform("dn", 6, H200, 8);
    for n in f.nodes.iter_mut() {
        if n.name == SLOW_NIC {
            n.faults.push(Fault::SlowNic { factor: 0.2 });
        }
        if n.name == STRAGGLER {
            n.faults.push(Fault::Straggler {
                gpu: 5,
                factor: 1.3,
            });
        }
        if n.name == SLOW_PATH.0 {
            n.faults.push(Fault::BadPath {
                peer: SLOW_PATH.1.into(),
                factor: 0.3,
            });
        }
    }
    f
}

/// The node pairs, then the multi-node probe; the per-node probe and compute checks off, so
/// that nothing but the multi-node probe looks at compute.
fn probe_suite() -> serde_json::Value {
    json!({
        "ncclSweep": {"enabled": false},
        "ddpProbe": {"enabled": false, "hidden": 4096, "layers": 4},
        "compute": {"gemm": {"enabled": false}, "memory": {"enabled": false}, "sdc": {"enabled": false}},
        "nodePairs": {"enabled": true, "pairing": "ring", "bytes": 268435456},
        "ddpNodes": {"enabled": true, "maxNodes": 8}
    })
}

/// Four H200 nodes named `prefix`-01..04; the multi-node probe ranks of those in `stuck`
/// never return (sim `hang` in phase `ddpProbe`, beyond any watchdog).
fn stuck_fleet(prefix: &str, stuck: &[&str]) -> Fleet {
    let mut f = SimFleet::uniform(prefix, 4, H200, 8);
    for n in f
        .nodes
        .iter_mut()
        .filter(|n| stuck.contains(&n.name.as_str()))
    {
        n.faults.push(Fault::Hang {
            phase: Some(gpufabric_api::result::Phase::DdpProbe),
            stuck: true,
        });
    }
    f
}

/// Creates FabricTest `test` over the environment's nodes: the probe suite, 10 s agents, the
/// first failure cordoned.
async fn create_probe_test(env: &OperatorEnv, test: &str) {
    env.create_test(
        test,
        json!({
            "nodeSelector": env.node_selector(),
            "suite": probe_suite(),
            "quarantine": quarantine_on_first_failure("Cordon", false),
            "agent": sim_agent(10)
        }),
    )
    .await;
}

/// The run's multi-node probe, which must have ended; `log` is the operator's, for the
/// panic.
fn ended_probe(
    status: &gpufabric_api::run::FabricTestRunStatus,
    log: &dyn Fn() -> String,
) -> gpufabric_api::ddp_nodes::DdpNodesStatus {
    let probe = status
        .ddp_nodes
        .clone()
        .unwrap_or_else(|| panic!("no multi-node probe: {status:#?}\n{}", log()));
    assert!(probe.done, "{probe:#?}");
    probe
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_runs_over_nodes_that_passed_the_pairs_and_names_a_straggler_it_does_not_cordon()
{
    let env = OperatorEnv::shared(fleet(), "ddp-nodes").await;
    let mut suite = probe_suite();
    suite["ncclNodes"] = json!({
        "enabled": true,
        "maxNodes": 8,
        "minBytes": 1024,
        "maxBytes": 268435456,
        "largeBytes": 67108864
    });
    env.create_test(
        TEST,
        json!({
            "nodeSelector": env.node_selector(),
            "suite": suite,
            "quarantine": quarantine_on_first_failure("Cordon", true),
            "agent": sim_agent(60)
        }),
    )
    .await;
    let folded = env.wait_folded(TEST, None).await;
    let status = env.run_status(&last_run_name(&folded)).await;
    let log = || env.operator.log_tail(80);

    let probe = ended_probe(&status, &log);
    assert_eq!(probe.state, PairState::Measured, "{probe:#?}\n{}", log());
    let slow_nic = env.node(SLOW_NIC);
    let mut expected: Vec<String> = ["dn-01", "dn-02", "dn-03", "dn-04", "dn-05"]
        .iter()
        .map(|b| env.node(b))
        .collect();
    expected.sort();
    assert_eq!(
        probe.nodes, expected,
        "every node but the one the pairs failed"
    );
    let counts: Vec<u32> = probe.points.iter().map(|p| p.nodes).collect();
    assert_eq!(counts, vec![1, 2, 4, 5], "{probe:#?}");
    assert_eq!(probe.points[3].gpus, 40);
    assert_eq!(probe.points[0].scaling_efficiency, 1.0, "{probe:#?}");
    for p in &probe.points[1..] {
        assert!(
            p.scaling_efficiency > 0.0 && p.scaling_efficiency < 1.0,
            "{probe:#?}"
        );
        assert!(p.comm_alone_ms > 0.0, "{probe:#?}");
    }
    let straggler = env.node(STRAGGLER);
    let named: Vec<&str> = probe.stragglers.iter().map(|s| s.node.as_str()).collect();
    assert_eq!(named, vec![straggler.as_str()], "{probe:#?}");

    // The straggler is an Info finding on its node; the slow NIC the pairs' Critical one.
    let finding = status
        .findings
        .iter()
        .find(|f| f.kind == FindingKind::Straggler)
        .unwrap_or_else(|| panic!("no straggler finding: {:#?}", status.findings));
    assert_eq!(finding.subject, Subject::node(&straggler));
    assert_eq!(finding.severity, Severity::Info);
    assert!(
        finding.message.contains("multi-node DDP step"),
        "{}",
        finding.message
    );
    let critical: Vec<_> = status
        .findings
        .iter()
        .filter(|f| f.severity == Severity::Critical)
        .collect();
    assert_eq!(critical.len(), 1, "{:#?}", status.findings);
    assert_eq!(critical[0].subject, Subject::node(&slow_nic));

    assert_the_sweep_has_its_knee_where_the_ring_meets_the_slow_path(&status, &expected, &log);

    // Only the slow NIC's node is failed and cordoned: not those of the slow path.
    let nodes: Api<Node> = Api::all(env.cluster.client());
    for n in status.nodes.iter() {
        let node = nodes.get(&n.node).await.expect("node");
        if n.node == slow_nic {
            assert_eq!(n.verdict, NodeVerdict::Failed, "{n:#?}");
            assert!(cordoned(&node), "{} should be cordoned\n{}", n.node, log());
        } else {
            assert_eq!(n.verdict, NodeVerdict::Passed, "{n:#?}");
            assert!(!cordoned(&node), "{} cordoned\n{}", n.node, log());
        }
    }
    assert_eq!(status.nodes.len(), 6, "{:#?}", status.nodes);
}

/// The multi-node NCCL sweep over `nodes` (the probe's): its curve at 2, 4 and 5 nodes for
/// every collective, flat until the ring closes over the slow path at 5, where each
/// collective's knee is; a condition on the run, and no finding.
fn assert_the_sweep_has_its_knee_where_the_ring_meets_the_slow_path(
    status: &gpufabric_api::run::FabricTestRunStatus,
    nodes: &[String],
    log: &dyn Fn() -> String,
) {
    use gpufabric_api::suite::Collective;
    let sweep = status
        .nccl_nodes
        .clone()
        .unwrap_or_else(|| panic!("no multi-node NCCL sweep: {status:#?}\n{}", log()))
        .sweep;
    assert!(sweep.done, "{sweep:#?}");
    assert_eq!(sweep.state, PairState::Measured, "{sweep:#?}\n{}", log());
    assert_eq!(sweep.nodes, nodes, "the probe's nodes");
    let four = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllToAll,
    ];
    assert_eq!(sweep.collectives(), four, "{sweep:#?}");
    for c in four {
        let curve = sweep.curve(c);
        let counts: Vec<u32> = curve.iter().map(|(k, _)| *k).collect();
        assert_eq!(counts, vec![2, 4, 5], "{c:?}: {sweep:#?}");
        let (at2, at4, at5) = (curve[0].1, curve[1].1, curve[2].1);
        // Within the fleet's minimum gap (10%) from 2 to 4 nodes: the sim's small loss per
        // doubling and the latency of each size, no knee.
        assert!(at2 > 0.0 && at4 > at2 * 0.9, "{c:?} flat to 4: {curve:?}");
        assert!(at5 < at4 * 0.5, "{c:?} falls at 5: {curve:?}");
    }
    assert!(
        sweep
            .points
            .iter()
            .flat_map(|p| &p.summary)
            .all(|s| s.small_time_us > 0.0),
        "{sweep:#?}"
    );
    let knees: Vec<(Collective, u32, u32)> = sweep
        .knees
        .iter()
        .map(|k| (k.collective, k.from_nodes, k.at_nodes))
        .collect();
    assert_eq!(knees, four.map(|c| (c, 4, 5)), "{sweep:#?}");
    let condition = status
        .conditions
        .iter()
        .find(|c| c.type_ == gpufabric_operator::nccl_nodes::CONDITION_SCALING_KNEE)
        .unwrap_or_else(|| panic!("no knee condition: {:#?}", status.conditions));
    assert!(
        condition.message.contains("all_reduce loses")
            && condition.message.contains("from 4 to 5 nodes"),
        "{}",
        condition.message
    );
    assert!(
        status
            .findings
            .iter()
            .all(|f| !f.message.contains("of its bus bandwidth")),
        "the knee is no finding: {:#?}",
        status.findings
    );
    // The links the ranks exchanged: eight NDR ports on every H200 node, 400 GB/s at every
    // count; only the count whose ring closes over the slow path is far below them.
    for p in &sweep.points {
        let links = p
            .links
            .as_ref()
            .unwrap_or_else(|| panic!("no links: {p:#?}"));
        assert_eq!((links.rails, links.gbps), (8, Some(400.0)), "{p:#?}");
        let ar = p
            .ceiling(Collective::AllReduce)
            .unwrap_or_else(|| panic!("no ceiling: {p:#?}"));
        assert_eq!(ar.busbw, 400.0, "{p:#?}");
    }
    let gaps = &status.nccl_nodes.as_ref().expect("sweep").link_gaps;
    let below: Vec<(Collective, u32)> = gaps
        .iter()
        .filter(|g| g.kind == gpufabric_api::link_ceiling::LinkGapKind::Below)
        .map(|g| (g.collective, g.nodes))
        .collect();
    assert!(
        below.contains(&(Collective::AllReduce, 5)) && below.iter().all(|(_, k)| *k == 5),
        "{gaps:#?}"
    );
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.type_ == gpufabric_operator::nccl_nodes::CONDITION_BELOW_LINKS),
        "{:#?}",
        status.conditions
    );
}

/// Four nodes whose ranks of the multi-node probe all get stuck (sim `hang` in phase
/// `ddpProbe`, beyond any watchdog; the per-node probe is off) under kubelets that enforce no
/// deadline, so that every rank still reads Running at the probe's deadline (one rank that
/// hangs alone is left by the others, who write that it never arrived). Then `dl-02` stops
/// reporting (NotReady). Its rank's Running is its kubelet's last word, not a hang: the probe
/// is not measured, where with every node Ready it would be errored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_rank_on_a_node_that_stopped_reporting_leaves_the_probe_not_measured() {
    let all = ["dl-01", "dl-02", "dl-03", "dl-04"];
    let env = OperatorEnv::shared(stuck_fleet("dl", &all), "ddp-lost").await;
    let lost = env.node("dl-02");
    for base in all {
        env.kubelet
            .set_node_ignores_deadlines(&env.node(base), true)
            .await
            .expect("kubelet setting");
    }
    let test = "ddp-nodes-lost";
    create_probe_test(&env, test).await;
    let (_, status) = env
        .fold_with_node_lost_under(test, &lost, gpufabric_operator::ddp_nodes::ROLE_DDP_NODES)
        .await;
    let log = || env.operator.log_tail(120);
    let probe = ended_probe(&status, &log);
    assert_eq!(probe.state, PairState::NotMeasured, "{probe:#?}\n{}", log());
    assert!(
        probe
            .message
            .as_deref()
            .is_some_and(|m| m.contains("stopped reporting while its rank ran")),
        "{probe:#?}"
    );
    env.assert_none_held(
        &status,
        status.nodes.iter().map(|n| (n.node.as_str(), n.verdict)),
    )
    .await;
}

/// One rank of the multi-node probe stuck alone (sim `hang` in phase `ddpProbe`, beyond any
/// watchdog) on a Ready node whose kubelet enforces no deadline. The other ranks leave it and
/// end; it still reads Running at the probe's deadline. The probe names that rank and its
/// node as still running (not "never started"), and holds nothing against any node: a rank
/// stuck alone may wait on its node or on the network between.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_rank_stuck_alone_is_named_and_holds_nothing() {
    let env = OperatorEnv::shared(stuck_fleet("ds", &["ds-03"]), "ddp-stuck").await;
    let stuck = env.node("ds-03");
    env.kubelet
        .set_node_ignores_deadlines(&stuck, true)
        .await
        .expect("kubelet setting");
    let test = "ddp-nodes-stuck";
    create_probe_test(&env, test).await;
    let run = last_run_name(&env.wait_folded(test, None).await);
    let status = env.run_status(&run).await;
    let log = || env.operator.log_tail(120);
    let probe = ended_probe(&status, &log);
    assert_ne!(probe.state, PairState::Measured, "{probe:#?}");
    let message = probe.message.as_deref().unwrap_or_default();
    assert!(
        message.contains(&format!(
            "on {stuck} was still running at the probe's deadline"
        )) && !message.contains("never started"),
        "{probe:#?}\n{}",
        log()
    );
    env.assert_none_held(
        &status,
        status.nodes.iter().map(|n| (n.node.as_str(), n.verdict)),
    )
    .await;
}

/// The label of the racks of [`rack_fleet`].
const RACK: &str = "example.com/rack";

/// Six H200 nodes `bk-01..06` in three racks of two (`rack-a`: 01, 02; ...); in `rack-b` the
/// path between its two nodes runs at a fifth of the rate (its leaf switch degraded), while
/// both nodes are fine with every other node.
fn rack_fleet() -> Fleet {
    let mut f = SimFleet::uniform("bk", 6, H200, 8);
    for (i, n) in f.nodes.iter_mut().enumerate() {
        let rack = ["rack-a", "rack-b", "rack-c"][i / 2];
        n.labels.insert(RACK.into(), rack.into());
        if n.name == "bk-03" {
            n.faults.push(Fault::BadPath {
                peer: "bk-04".into(),
                factor: 0.2,
            });
        }
    }
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rack_whose_sweep_falls_below_the_other_racks_is_named_and_no_node_is_blamed() {
    use gpufabric_api::suite::Collective;
    let env = OperatorEnv::shared(rack_fleet(), "nccl-blocks").await;
    let test = "nccl-blocks";
    env.create_test(
        test,
        json!({
            "nodeSelector": env.node_selector(),
            "suite": {
                "ncclSweep": {"enabled": false},
                "ddpProbe": {"enabled": false},
                "compute": {"gemm": {"enabled": false}, "memory": {"enabled": false}, "sdc": {"enabled": false}},
                "ncclNodes": {
                    "enabled": true,
                    "maxNodes": 8,
                    "collectives": ["allReduce"],
                    "minBytes": 1024,
                    "maxBytes": 268435456,
                    "largeBytes": 67108864,
                    "topologyKey": RACK
                }
            },
            "quarantine": quarantine_on_first_failure("Cordon", false),
            "agent": sim_agent(30)
        }),
    )
    .await;
    let run = last_run_name(&env.wait_folded(test, None).await);
    let status = env.run_status(&run).await;
    let log = || env.operator.log_tail(120);
    let phase = status
        .nccl_nodes
        .clone()
        .unwrap_or_else(|| panic!("no multi-node NCCL sweep: {status:#?}\n{}", log()));
    assert!(phase.sweep.done, "{phase:#?}");
    assert_eq!(phase.topology_key.as_deref(), Some(RACK));

    // Each rack swept on its own two nodes, then one node of each rack across them.
    let blocks: Vec<(&str, Vec<String>, PairState)> = phase
        .blocks
        .iter()
        .map(|b| (b.value.as_str(), b.sweep.nodes.clone(), b.sweep.state))
        .collect();
    let pair = |a: &str, b: &str| vec![env.node(a), env.node(b)];
    assert_eq!(
        blocks,
        [
            ("rack-a", pair("bk-01", "bk-02"), PairState::Measured),
            ("rack-b", pair("bk-03", "bk-04"), PairState::Measured),
            ("rack-c", pair("bk-05", "bk-06"), PairState::Measured),
        ],
        "{phase:#?}\n{}",
        log()
    );
    assert_eq!(phase.sweep.state, PairState::Measured, "{phase:#?}");
    assert_eq!(phase.sweep.nodes.len(), 3, "one node of each rack");
    for (n, (_, nodes, _)) in phase.sweep.nodes.iter().zip(&blocks) {
        assert!(nodes.contains(n), "{n} of {nodes:?}");
    }
    let busbw = |b: usize| phase.blocks[b].sweep.curve(Collective::AllReduce)[0].1;
    assert!(
        busbw(1) < busbw(0) * 0.5 && busbw(1) < busbw(2) * 0.5,
        "{phase:#?}"
    );
    // Across racks, the degraded path is no one's: flat.
    let across = phase.sweep.curve(Collective::AllReduce);
    assert!(
        across.len() == 2 && across[1].1 > across[0].1 * 0.9,
        "{across:?}"
    );

    // The slow rack, by its label and value: a condition on the run, no finding.
    let slow: Vec<(&str, &str, u32)> = phase
        .slow_blocks
        .iter()
        .map(|b| (b.key.as_str(), b.value.as_str(), b.nodes))
        .collect();
    assert_eq!(slow, [(RACK, "rack-b", 2)], "{phase:#?}");
    let condition = status
        .conditions
        .iter()
        .find(|c| c.type_ == gpufabric_operator::nccl_nodes::CONDITION_SLOW_BLOCK)
        .unwrap_or_else(|| panic!("no slow-block condition: {:#?}", status.conditions));
    assert!(
        condition
            .message
            .contains("of block example.com/rack=rack-b reached"),
        "{}",
        condition.message
    );
    assert!(
        status
            .findings
            .iter()
            .all(|f| f.severity == Severity::Info && !f.message.contains("rack-b")),
        "{:#?}",
        status.findings
    );
    // No node failed, none cordoned.
    assert_eq!(status.nodes.len(), 6, "{:#?}", status.nodes);
    assert!(
        status
            .nodes
            .iter()
            .all(|n| n.verdict == NodeVerdict::Passed),
        "{:#?}",
        status.nodes
    );
    env.assert_none_held(
        &status,
        status.nodes.iter().map(|n| (n.node.as_str(), n.verdict)),
    )
    .await;
}
