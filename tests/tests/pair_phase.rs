//! The node-pair phase of a run, end to end: the real `fabric-operator` against a real
//! control plane, the process-kubelet (each pod on its own loopback address) and the sim
//! agents, whose two ranks of every pair really meet over TCP with the run's secret.
//!
//! Twelve H200 nodes in a ring: three nodes in a row along it (each the partner of the next)
//! have a NIC at a fifth of its speed, and the path between two other nodes runs at a third.
//! The run tests every node, pairs the nodes that passed in two rounds, retests the slow
//! nodes against known-good partners in a third, the middle one (whose every partner was
//! slow) again against another in a fourth, and then fails and cordons those three alone;
//! the slow path is a finding on the node pair that blames neither node. With one partner a
//! night, eight nodes in one round: a slow NIC told from its partner by the retests.
//!
//! Build the binaries first: `cargo build --bins`, then
//! `cargo test -p gpufabric-tests --test pair_phase`.

use gpufabric_api::findings::Severity;
use gpufabric_api::pair::PairState;
use gpufabric_api::run::{NodeRunResult, NodeVerdict};
use gpufabric_api::shard::FabricTestRunShard;
use gpufabric_api::suite::Pairing;
use gpufabric_api::{FindingKind, Subject, SubjectKind, keys};
use gpufabric_measure::fleet::{Fault, Fleet};
use gpufabric_operator::pairs::rounds::{Candidate, RoundPlan, plan_rounds};
use gpufabric_tests::fleet::{H200, SimFleet};
use gpufabric_tests::operator::{
    OperatorEnv, cordoned, last_run_name, node_pairs_suite, quarantine_on_first_failure, sim_agent,
};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use serde_json::json;
use std::collections::BTreeMap;

const TEST: &str = "pairs-slow-nic";
/// Nodes of the ring with slow NICs and a slow path.
const RING: usize = 12;

/// The base names of a fleet of `n`, in name order.
fn names(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("np-{i:02}")).collect()
}

/// The operator's plan for the ring's nodes (its own planner, the same nodes, same order).
fn ring_plan() -> RoundPlan {
    let candidates: Vec<Candidate> = names(RING)
        .into_iter()
        .map(|name| Candidate { name, group: None })
        .collect();
    plan_rounds(&candidates, Pairing::Ring, 0)
}

/// The partners `node` meets in the planned rounds.
fn partners(plan: &RoundPlan, node: &str) -> Vec<String> {
    plan.pairs()
        .filter(|p| p.a == node || p.b == node)
        .map(|p| {
            if p.a == node {
                p.b.clone()
            } else {
                p.a.clone()
            }
        })
        .collect()
}

/// Three nodes in a row along the planned rounds' ring, from `np-05`: the middle one meets
/// only the other two, the ends each one good node.
fn slow_run() -> [String; 3] {
    let plan = ring_plan();
    let first = "np-05".to_string();
    let middle = partners(&plan, &first)[0].clone();
    let last = partners(&plan, &middle)
        .into_iter()
        .find(|p| *p != first)
        .expect("a ring node meets two partners");
    [first, middle, last]
}

/// Two nodes that the run pairs, neither of them a slow node nor one of their partners,
/// so both are fine with their other partner.
fn bad_path() -> (String, String) {
    let plan = ring_plan();
    let slow = slow_run();
    let near: Vec<String> = slow
        .iter()
        .flat_map(|n| partners(&plan, n))
        .chain(slow.iter().cloned())
        .collect();
    plan.pairs()
        .find(|p| !near.contains(&p.a) && !near.contains(&p.b))
        .map(|p| (p.a.clone(), p.b.clone()))
        .expect("a ring of 12 has a pair away from the slow nodes and their partners")
}

/// Every node's entry in the run's shards, by node name.
async fn shard_entries(env: &OperatorEnv, run_name: &str) -> BTreeMap<String, NodeRunResult> {
    let shards: Api<FabricTestRunShard> = Api::all(env.cluster.client());
    let listed = shards
        .list(&ListParams::default().labels(&format!("gpufabric.io/run={run_name}")))
        .await
        .expect("shards");
    listed
        .items
        .into_iter()
        .flat_map(|s| s.status.map(|s| s.nodes).unwrap_or_default())
        .map(|e| (e.node.clone(), e))
        .collect()
}

fn fleet(path: &(String, String)) -> Fleet {
    let slow = slow_run();
    let mut f = SimFleet::uniform("np", RING, H200, 8);
    for n in f.nodes.iter_mut() {
        if slow.contains(&n.name) {
            n.faults.push(Fault::SlowNic { factor: 0.2 });
        }
        if n.name == path.0 {
            n.faults.push(Fault::BadPath {
                peer: path.1.clone(),
                factor: 0.3,
            });
        }
    }
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_slow_nics_in_a_row_fail_their_nodes_after_retests_and_a_slow_path_blames_neither_node()
 {
    let path = bad_path();
    let env = OperatorEnv::shared(fleet(&path), "pair-phase").await;
    env.create_test(
        TEST,
        json!({
            "nodeSelector": env.node_selector(),
            "suite": node_pairs_suite(),
            "quarantine": quarantine_on_first_failure("Cordon", true),
            "agent": sim_agent(60)
        }),
    )
    .await;
    let folded = env.wait_folded(TEST, None).await;
    let run_name = last_run_name(&folded);
    let status = env.run_status(&run_name).await;
    let log = || env.operator.log_tail(60);

    // The phase: 2 rounds of the ring, the confirmation round, and a second for the middle
    // slow node, which the first left unclear; every pair measured.
    let np = status
        .node_pairs
        .clone()
        .unwrap_or_else(|| panic!("no node-pair phase: {status:#?}\n{}", log()));
    assert!(np.done, "{np:#?}");
    assert_eq!(
        np.candidates,
        RING as u32,
        "{np:#?}\nnodes: {:?}\nskipped: {:?}\n{}",
        status.nodes,
        status.skipped,
        env.operator.log_tail(200)
    );
    assert_eq!(
        (
            np.rounds,
            np.confirmation_round,
            np.second_confirmation_round
        ),
        (4, Some(3), Some(4)),
        "{np:#?}\n{:#?}",
        status.findings
    );
    assert_eq!(np.measured, np.pairs, "{np:#?}");
    assert!(np.pairs as usize >= RING + 4, "{np:#?}");
    let median = np
        .within
        .as_ref()
        .and_then(|w| w.median_gbps)
        .unwrap_or(0.0);
    assert!(median > 100.0, "{np:#?}");

    // The findings: each slow node, with numbers (the ends met a good node, the middle one
    // two retest partners); the path, on the pair only.
    let [first, middle, last] = slow_run().map(|n| env.node(&n));
    let slow = [first.clone(), middle.clone(), last.clone()];
    let critical: Vec<_> = status
        .findings
        .iter()
        .filter(|f| f.severity == Severity::Critical)
        .collect();
    assert_eq!(critical.len(), 3, "{:#?}", status.findings);
    for (node, partners) in [(&first, 3), (&middle, 4), (&last, 3)] {
        let f = critical
            .iter()
            .find(|f| f.subject == Subject::node(node))
            .unwrap_or_else(|| panic!("{node} not blamed: {:#?}", status.findings));
        assert_eq!(f.kind, FindingKind::Slow);
        assert!(
            f.message
                .starts_with(&format!("node {node}: NCCL busbw to {partners} partners")),
            "{}",
            f.message
        );
    }
    let (x, y) = (env.node(&path.0), env.node(&path.1));
    let pair_findings: Vec<_> = status
        .findings
        .iter()
        .filter(|f| f.subject.kind() == SubjectKind::NodePair)
        .collect();
    assert_eq!(pair_findings.len(), 1, "{:#?}", status.findings);
    assert_eq!(pair_findings[0].severity, Severity::Info);
    assert!(
        pair_findings[0].subject == Subject::node_pair(&x, &y)
            || pair_findings[0].subject == Subject::node_pair(&y, &x),
        "{:#?}",
        pair_findings[0]
    );
    assert!(
        pair_findings[0].message.contains("not either node"),
        "{}",
        pair_findings[0].message
    );

    // The retest rounds confirmed the slow nodes: no confirmation run retests them again.
    let confirmations = env
        .runs_api()
        .list(&ListParams::default().labels(&format!(
            "{}={TEST},{}=confirmation",
            keys::LABEL_TEST,
            keys::LABEL_TRIGGER
        )))
        .await
        .expect("runs");
    assert!(
        confirmations.items.is_empty(),
        "a confirmation run for a failure the pair phase confirmed: {:?}",
        confirmations
            .items
            .iter()
            .map(|r| r.metadata.name.clone())
            .collect::<Vec<_>>()
    );

    // Verdicts, records in the shards, and the three cordons.
    let entries = shard_entries(&env, &run_name).await;
    assert_eq!(entries.len(), RING);
    let nodes: Api<Node> = Api::all(env.cluster.client());
    for base in names(RING) {
        let name = env.node(&base);
        let e = &entries[&name];
        let n = nodes.get(&name).await.expect("node");
        assert!(
            e.pairs.iter().all(|r| r.state == PairState::Measured),
            "{name}: {:#?}",
            e.pairs
        );
        if slow.contains(&name) {
            assert_eq!(e.verdict, NodeVerdict::Failed, "{e:#?}");
            assert!(e.confirmed, "{e:#?}");
            assert_eq!(e.pairs.len(), if name == middle { 4 } else { 3 }, "{e:#?}");
            assert!(e.pairs.iter().any(|r| r.confirmation), "{e:#?}");
            assert!(cordoned(&n), "{name} should be cordoned\n{}", log());
        } else {
            assert_eq!(e.verdict, NodeVerdict::Passed, "{name}: {e:#?}");
            assert!(e.pairs.len() >= 2, "{name} met fewer than 2 partners");
            assert!(!cordoned(&n), "{name} cordoned");
        }
    }
}

/// Eight nodes: `np-02` finds no RDMA device and falls back to sockets, `np-06` has one of
/// its eight InfiniBand ports down (NCCL runs on the other seven, not slow enough to be
/// slow). The first is a transport finding, confirmed by its retest; the second a port
/// finding read from the pair documents, confirmed because each of the node's pair tests
/// read the port down. Both nodes fail, and no other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_fallback_and_a_port_down_fail_their_nodes_and_no_other() {
    let mut f = SimFleet::uniform("np", 8, H200, 8);
    f.nodes[1].faults.push(Fault::SocketFallback);
    f.nodes[5].faults.push(Fault::NicDown { nic: 3 });
    let env = OperatorEnv::shared(f, "pair-transport").await;
    let test = "pairs-transport";
    env.create_test(
        test,
        json!({
            "nodeSelector": env.node_selector(),
            "suite": {
                "ncclSweep": {"enabled": false},
                "ddpProbe": {"enabled": false},
                "nodePairs": {"enabled": true, "bytes": 268435456, "allToAll": true}
            },
            "agent": sim_agent(60)
        }),
    )
    .await;
    let folded = env.wait_folded(test, None).await;
    let status = env.run_status(&last_run_name(&folded)).await;
    let np = status.node_pairs.clone().expect("node-pair phase");
    assert!(np.done && np.confirmation_round.is_some(), "{np:#?}");

    let socket = env.node("np-02");
    let port_down = env.node("np-06");
    let critical: Vec<_> = status
        .findings
        .iter()
        .filter(|f| f.severity == Severity::Critical)
        .collect();
    assert_eq!(critical.len(), 2, "{:#?}", status.findings);
    assert!(
        critical
            .iter()
            .any(|f| f.kind == FindingKind::TransportFallback
                && f.subject == Subject::node(&socket)
                && f.message.contains("fell back to sockets")),
        "{critical:#?}"
    );
    assert!(
        critical.iter().any(|f| f.kind == FindingKind::NicDown
            && f.subject == Subject::nic(&port_down, "mlx5_3 port 1")),
        "{critical:#?}"
    );
    // The fallback was retested against a known-good partner; the port was read down by
    // every pair test of its node (two or more): both count as confirmed within the run.
    let mut confirmed: Vec<&str> = status
        .nodes
        .iter()
        .filter(|n| n.confirmed)
        .map(|n| n.node.as_str())
        .collect();
    confirmed.sort();
    let mut want = vec![socket.as_str(), port_down.as_str()];
    want.sort();
    assert_eq!(confirmed, want, "{:#?}", status.nodes);
    let verdicts: BTreeMap<String, NodeVerdict> = folded
        .nodes
        .iter()
        .map(|h| (h.node.clone(), h.verdict))
        .collect();
    for base in names(8) {
        let name = env.node(&base);
        let want = if name == socket || name == port_down {
            NodeVerdict::Failed
        } else {
            NodeVerdict::Passed
        };
        assert_eq!(
            verdicts.get(&name),
            Some(&want),
            "{name}: {verdicts:?}\nrun nodes: {:?}\nskipped: {:?}\n{}",
            status.nodes,
            status.skipped,
            env.operator.log_tail(200)
        );
    }
}

/// Four nodes: `np-02`'s rank of its first pair gets stuck (sim `hang` in phase `nodePair`,
/// beyond any watchdog), its kubelet enforces no deadline, and then the node stops reporting
/// (NotReady) while the rank still reads Running. At the pair's deadline that status is the
/// kubelet's last word, not a hang of the rank: the pair is not measured, counts against
/// neither node, and nothing is cordoned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_on_a_node_that_stopped_reporting_leaves_its_pair_not_measured() {
    let mut f = SimFleet::uniform("np", 4, H200, 8);
    f.nodes[1].faults.push(Fault::Hang {
        phase: Some(gpufabric_api::result::Phase::NodePair),
        stuck: true,
    });
    let env = OperatorEnv::shared(f, "pair-lost").await;
    let lost = env.node("np-02");
    env.kubelet
        .set_node_ignores_deadlines(&lost, true)
        .await
        .expect("kubelet setting");
    let test = "pairs-lost";
    env.create_test(
        test,
        json!({
            "nodeSelector": env.node_selector(),
            "suite": node_pairs_suite(),
            "quarantine": quarantine_on_first_failure("Cordon", false),
            "agent": sim_agent(10)
        }),
    )
    .await;
    // A rank of a pair running on the node: the node then stops reporting.
    let (run_name, status) = env
        .fold_with_node_lost_under(test, &lost, gpufabric_operator::pairs::pods::ROLE_NODE_PAIR)
        .await;
    let log = || env.operator.log_tail(120);
    let np = status
        .node_pairs
        .clone()
        .unwrap_or_else(|| panic!("no node-pair phase: {status:#?}\n{}", log()));
    assert!(np.done && np.not_measured >= 1, "{np:#?}\n{}", log());
    assert_eq!(np.errored, 0, "{np:#?}");
    // The phase says which pairs it could not measure and why, in status and in an Event:
    // they judged neither node, so the nodes are spared by it, not cleared.
    let counted = format!(
        "{} of {} node pairs not measured",
        np.not_measured, np.pairs
    );
    let said = np.message.clone().unwrap_or_default();
    assert!(
        said.contains(&counted) && said.contains("stopped reporting while its rank ran"),
        "{np:#?}"
    );
    let events = gpufabric_tests::events::about(&env.cluster.client(), "default", test).await;
    assert!(
        events
            .iter()
            .any(|(reason, note)| reason == "NodePairsNotMeasured" && note.contains(&counted)),
        "{events:#?}"
    );

    let entries = shard_entries(&env, &run_name).await;
    assert_eq!(entries.len(), 4, "{entries:#?}");
    let lost_entry = entries.get(&lost).expect("np-02");
    assert!(
        lost_entry
            .pairs
            .iter()
            .any(|r| r.state == PairState::NotMeasured),
        "{lost_entry:#?}"
    );
    // The reason is on rank 0's record, whichever node that is.
    assert!(
        entries.values().flat_map(|e| &e.pairs).any(|r| {
            r.state == PairState::NotMeasured
                && r.message
                    .as_deref()
                    .is_some_and(|m| m.contains("stopped reporting while its rank ran"))
        }),
        "{entries:#?}"
    );
    env.assert_none_held(
        &status,
        entries.values().map(|e| (e.node.as_str(), e.verdict)),
    )
    .await;
}

/// One partner a night (`nodePairs.partners: 1`): eight nodes in one planned round, `np-04`
/// with a NIC at a fifth of its speed. Its only pair is slow, so both of that pair's nodes
/// are suspects; the confirmation round retests each against a known-good partner, and only
/// `np-04` fails and is cordoned. The ring's round is the day's (`status.nodePairs.seed`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_one_partner_a_night_a_slow_nic_is_told_from_its_partner_by_the_retests() {
    let mut f = SimFleet::uniform("np", 8, H200, 8);
    f.nodes[3].faults.push(Fault::SlowNic { factor: 0.2 });
    let env = OperatorEnv::shared(f, "pair-one-partner").await;
    let test = "pairs-one-partner";
    let mut suite = node_pairs_suite();
    suite["nodePairs"]["partners"] = json!(1);
    env.create_test(
        test,
        json!({
            "nodeSelector": env.node_selector(),
            "suite": suite,
            "quarantine": quarantine_on_first_failure("Cordon", true),
            "agent": sim_agent(60)
        }),
    )
    .await;
    let folded = env.wait_folded(test, None).await;
    let run_name = last_run_name(&folded);
    let status = env.run_status(&run_name).await;
    let log = || env.operator.log_tail(200);
    let np = status
        .node_pairs
        .clone()
        .unwrap_or_else(|| panic!("no node-pair phase: {status:#?}\n{}", log()));
    // One planned round, then the confirmation round; nothing left for a second.
    assert_eq!(
        (
            np.rounds,
            np.confirmation_round,
            np.second_confirmation_round
        ),
        (2, Some(2), None),
        "{np:#?}\n{:#?}",
        status.findings
    );
    let day = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs()
        / 86_400;
    assert!(
        np.seed == day || np.seed + 1 == day,
        "seed {} on day {day}",
        np.seed
    );

    let slow = env.node("np-04");
    let blamed: Vec<_> = status
        .findings
        .iter()
        .filter(|f| f.severity == Severity::Critical)
        .map(|f| f.subject.clone())
        .collect();
    assert_eq!(blamed, vec![Subject::node(&slow)], "{:#?}", status.findings);

    let entries = shard_entries(&env, &run_name).await;
    assert_eq!(entries.len(), 8);
    let nodes: Api<Node> = Api::all(env.cluster.client());
    for base in names(8) {
        let name = env.node(&base);
        let e = &entries[&name];
        let planned = e.pairs.iter().filter(|r| !r.confirmation).count();
        assert_eq!(
            planned, 1,
            "{name} met {planned} planned partners: {:#?}",
            e.pairs
        );
        let n = nodes.get(&name).await.expect("node");
        if name == slow {
            assert_eq!(e.verdict, NodeVerdict::Failed, "{e:#?}");
            assert!(e.confirmed, "{e:#?}");
            assert!(cordoned(&n), "{name} should be cordoned\n{}", log());
        } else {
            assert_eq!(e.verdict, NodeVerdict::Passed, "{name}: {e:#?}");
            assert!(!cordoned(&n), "{name} cordoned");
        }
    }
}
