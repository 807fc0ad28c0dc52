//! NIC error counters between node-pair tests, end to end: the real `fabric-operator`
//! against a real control plane, the process-kubelet and the sim agents, whose two ranks of
//! every pair meet over TCP and report their node's InfiniBand ports.
//!
//! What it proves: the first run's pair tests record every paired node's port counters in
//! the `gpufabric.io/nic-counters` annotation (replacing one it cannot read, and apart from
//! the node check's `gpufabric.io/counters`) and judge nothing, since counters since driver
//! load say nothing alone. When one port's symbol errors then grow (a marginal cable), the
//! next run finds it on that node and port only, against the first run's record (named in
//! the finding), fails and cordons that node, and keeps its old record so that the growth
//! is not forgotten; the healthy nodes pass with no counter finding, and their unchanged
//! counters are not written again.
//!
//! Build the binaries first: `cargo build --workspace --bins`, then
//! `cargo test -p gpufabric-tests --test nic_counters`.

use gpufabric_api::findings::Severity;
use gpufabric_api::keys::{ANNOTATION_COUNTERS, ANNOTATION_NIC_COUNTERS};
use gpufabric_api::nic_counters::NicCounters;
use gpufabric_api::run::{FabricTestRunStatus, NodeVerdict};
use gpufabric_api::{FindingKind, Subject};
use gpufabric_measure::fleet::Fault;
use gpufabric_tests::fleet::{H200, SimFleet};
use gpufabric_tests::operator::{
    OperatorEnv, cordoned, last_run_name, node_pairs_suite, quarantine_on_first_failure, sim_agent,
};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use serde_json::json;
use std::collections::BTreeMap;

const TEST: &str = "nic-growth";
/// The node whose port goes bad after the first run.
const FAULTY: &str = "nic-02";
/// Its port.
const PORT: &str = "mlx5_5 port 1";
const NODES: [&str; 4] = ["nic-01", "nic-02", "nic-03", "nic-04"];

fn record(n: &Node) -> Option<NicCounters> {
    NicCounters::parse(n.annotations().get(ANNOTATION_NIC_COUNTERS)?).ok()
}

fn nic_errors(status: &FabricTestRunStatus) -> Vec<&gpufabric_api::Finding> {
    status
        .findings
        .iter()
        .filter(|f| f.kind == FindingKind::NicErrors)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nic_errors_growing_between_pair_tests_fail_only_their_node_and_name_the_port() {
    let env = OperatorEnv::shared(SimFleet::uniform("nic", 4, H200, 8), "nic-counters").await;
    // A record nobody can read (another tool's, or corrupted) is ignored and replaced.
    env.annotate_node("nic-04", ANNOTATION_NIC_COUNTERS, "{broken")
        .await;

    env.create_test(
        TEST,
        json!({
            "nodeSelector": env.node_selector(),
            "suite": node_pairs_suite(),
            "quarantine": quarantine_on_first_failure("Cordon", false),
            "agent": sim_agent(60)
        }),
    )
    .await;

    // Run 1: no node has a readable record, so nothing is judged; every paired node gets
    // one, stamped with this run.
    let s1 = env.wait_folded(TEST, None).await;
    let run1 = last_run_name(&s1);
    let status1 = env.run_status(&run1).await;
    let np = status1.node_pairs.clone().expect("a node-pair phase");
    assert!(
        np.done && np.candidates == 4 && np.measured == np.pairs && np.pairs >= 4,
        "{np:#?}\n{}",
        env.operator.log_tail(80)
    );
    assert!(nic_errors(&status1).is_empty(), "{:#?}", status1.findings);
    for base in NODES {
        let n = env.read_node(base).await;
        let r = record(&n).unwrap_or_else(|| {
            panic!(
                "{base}: no readable NIC record after run 1: {:?}\n{}",
                n.annotations().get(ANNOTATION_NIC_COUNTERS),
                env.operator.log_tail(80)
            )
        });
        assert_eq!(r.run, run1, "{base}");
        assert_eq!(r.ports.len(), 8, "{base}: {r:?}");
        assert!(
            r.ports.iter().all(|p| p.errors.symbol_errors == Some(0)),
            "{base}: {r:?}"
        );
        // The node check's NVLink record is another annotation, written at another time.
        assert!(
            n.annotations().contains_key(ANNOTATION_COUNTERS),
            "{base}: no NVLink counters record"
        );
        assert!(!cordoned(&n), "{base} cordoned after run 1");
    }
    let first = record(&env.read_node(FAULTY).await).expect("the faulty node's record");

    // After run 1 a cable of nic-02 goes marginal: its port 5 counts a million symbol
    // errors a second from now on.
    let mut marginal = env.fleet.fleet().clone();
    let faulty = env.node(FAULTY);
    marginal
        .nodes
        .iter_mut()
        .find(|n| n.name == faulty)
        .expect("the faulty node in the fleet")
        .faults
        .push(Fault::NicErrors {
            nic: 5,
            per_second: 1e6,
        });
    SimFleet::write_to(marginal, env.fleet.path()).expect("fleet rewritten");

    // Run 2: the port's growth since run 1 is found on that node and port, and no other.
    env.run_now(TEST).await;
    let s2 = env.wait_folded(TEST, Some(&run1)).await;
    let run2 = last_run_name(&s2);
    let status2 = env.run_status(&run2).await;
    let growing = nic_errors(&status2);
    assert_eq!(growing.len(), 1, "{:#?}", status2.findings);
    assert_eq!(growing[0].subject, Subject::nic(&faulty, PORT));
    assert_eq!(growing[0].severity, Severity::Critical);
    assert!(
        growing[0]
            .message
            .starts_with(&format!("{PORT} symbol_error grew by "))
            && growing[0].message.contains("(from 0 to "),
        "{}",
        growing[0].message
    );
    assert!(
        growing[0]
            .message
            .contains(&format!("since run {run1} at {}", first.at)),
        "{}",
        growing[0].message
    );
    assert!(
        growing[0].measured.is_some_and(|d| d >= 1e6),
        "{:#?}",
        growing[0]
    );
    let verdicts: BTreeMap<String, NodeVerdict> = s2
        .nodes
        .iter()
        .map(|h| (h.node.clone(), h.verdict))
        .collect();
    for base in NODES {
        let name = env.node(base);
        let n = env.read_node(base).await;
        let r = record(&n).unwrap_or_else(|| panic!("{base}: no readable record after run 2"));
        if base == FAULTY {
            assert_eq!(
                verdicts.get(&name),
                Some(&NodeVerdict::Failed),
                "{verdicts:?}"
            );
            assert!(
                cordoned(&n),
                "{base} should be cordoned\n{}",
                env.operator.log_tail(80)
            );
            // The record of run 1 stays: a later test still measures the growth from there.
            assert_eq!(r, first, "{base}");
        } else {
            assert_eq!(
                verdicts.get(&name),
                Some(&NodeVerdict::Passed),
                "{base}: {verdicts:?}\n{:#?}",
                status2.findings
            );
            assert!(!cordoned(&n), "{base} cordoned");
            // Unchanged counters are not written again.
            assert_eq!(r.run, run1, "{base}");
        }
    }
}
