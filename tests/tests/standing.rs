//! A node tested by several FabricTests, on the real control plane: the real
//! `fabric-operator` binary, the process-kubelet and the sim agents. Each test's standing
//! of the node is kept on the node; the `GPUFabricDegraded` condition and the
//! `gpufabric.io/result` label are the worst of them and name the test behind it. A pass in
//! one test never clears another test's confirmed failure; deleting a test removes only its
//! part.
//!
//! Build the binaries first: `cargo build -p gpufabric-agent -p gpufabric-operator`, then
//! `cargo test -p gpufabric-tests --test standing`.

use gpufabric_api::keys::{ANNOTATION_STANDING, CONDITION_NODE_DEGRADED, LABEL_RESULT};
use gpufabric_api::standing::Standing;
use gpufabric_api::standings::NodeStandings;
use gpufabric_measure::fleet::{Fault, Fleet};
use gpufabric_tests::fleet::{H100, SimFleet};
use gpufabric_tests::operator::{OperatorEnv, cordoned, sim_agent};
use gpufabric_tests::wait;
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use kube::ResourceExt;
use kube::api::DeleteParams;
use serde_json::json;
use std::time::Duration;

/// Four H100 nodes; gpu-02 has a straggler GPU (the DDP probe finds it).
fn fleet() -> Fleet {
    let mut f = SimFleet::uniform("gpu", 4, H100, 8);
    f.nodes[1].faults.push(Fault::Straggler {
        gpu: 1,
        factor: 1.5,
    });
    f
}

fn degraded(n: &Node) -> Option<NodeCondition> {
    n.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == CONDITION_NODE_DEGRADED)
        .cloned()
}

fn result_label(n: &Node) -> Option<&str> {
    n.labels().get(LABEL_RESULT).map(String::as_str)
}

fn standings(n: &Node) -> NodeStandings {
    NodeStandings::from_annotations(n.metadata.annotations.as_ref())
        .expect("a readable record")
        .unwrap_or_default()
}

/// The condition's status and message, for asserting both at once.
fn said(n: &Node) -> (String, String) {
    degraded(n)
        .map(|c| (c.status, c.message.unwrap_or_default()))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quick_tests_pass_never_clears_the_nightly_tests_confirmed_failure() {
    let env = OperatorEnv::shared(fleet(), "standing").await;
    let (nightly, quick) = ("st-nightly", "st-quick");

    // The nightly test confirms gpu-02's failure on its first run and cordons it.
    let tests = env
        .create_test(
            nightly,
            json!({
                "nodeSelector": env.node_selector(),
                "quarantine": {"mode": "Cordon", "maxQuarantined": 2, "confirmRetest": false,
                               "failuresToQuarantine": 1, "passesToRelease": 3},
                "agent": sim_agent(60)
            }),
        )
        .await;
    let s = env.wait_folded(nightly, None).await;
    let bad = env.node("gpu-02");
    let h = s
        .nodes
        .iter()
        .find(|h| h.node == bad)
        .expect("gpu-02 in the nightly's history");
    assert_eq!(
        h.standing,
        Standing::Quarantined { hardware: false },
        "{h:#?}"
    );
    let n = env.read_node("gpu-02").await;
    assert!(cordoned(&n), "the nightly cordons a confirmed failure");
    let (status, message) = said(&n);
    assert_eq!(status, "True", "{message}");
    assert!(
        message.starts_with(&format!("FabricTest {nightly}, run ")),
        "{message}"
    );
    assert_eq!(result_label(&n), Some("fail"));

    // gpu-02 is repaired out of band; the quick test, which acts on nothing, passes it.
    let mut healed = env.fleet.fleet().clone();
    healed.nodes[1].faults.clear();
    SimFleet::write_to(healed, env.fleet.path()).expect("fleet rewritten");
    env.create_test(
        quick,
        json!({
            "nodeSelector": env.node_selector(),
            "agent": sim_agent(60)
        }),
    )
    .await;
    let q = env.wait_folded(quick, None).await;
    let hq = q
        .nodes
        .iter()
        .find(|h| h.node == bad)
        .expect("gpu-02 tested by the quick test");
    assert_eq!(hq.standing, Standing::Passing, "{hq:#?}");
    let n = env.read_node("gpu-02").await;
    let record = standings(&n);
    assert_eq!(
        record.tests.get(quick).map(|t| &t.standing),
        Some(&Standing::Passing),
        "{record:#?}"
    );
    assert_eq!(
        record.tests.get(nightly).map(|t| &t.standing),
        Some(&Standing::Quarantined { hardware: false }),
        "{record:#?}"
    );
    let (status, message) = said(&n);
    assert_eq!(status, "True", "the nightly's failure stands: {message}");
    assert!(
        message.contains(&format!("FabricTest {nightly}, run ")),
        "{message}"
    );
    assert!(
        !message.contains(quick),
        "the pass is not the worst: {message}"
    );
    assert_eq!(result_label(&n), Some("fail"));
    assert!(cordoned(&n), "still the nightly's quarantine");
    // A node both tests passed reads pass, its condition naming both.
    let good = env.read_node("gpu-01").await;
    assert_eq!(result_label(&good), Some("pass"));
    let (status, message) = said(&good);
    assert_eq!(status, "False");
    assert!(
        message.contains(nightly) && message.contains(quick),
        "{message}"
    );

    // Deleting the quick test changes nothing on gpu-02.
    let before = said(&n);
    tests
        .delete(quick, &DeleteParams::default())
        .await
        .expect("delete the quick test");
    wait::for_deletion(&tests, quick, Duration::from_secs(60))
        .await
        .expect("the quick test is gone");
    let n = env.read_node("gpu-02").await;
    assert_eq!(said(&n), before, "the nightly's condition stays as it was");
    assert_eq!(result_label(&n), Some("fail"));
    assert!(cordoned(&n));
    assert_eq!(
        standings(&n).tests.keys().collect::<Vec<_>>(),
        [nightly],
        "only the quick test's part went"
    );
    let good = env.read_node("gpu-01").await;
    let (_, message) = said(&good);
    assert!(
        message.contains(nightly) && !message.contains(quick),
        "{message}"
    );

    // Deleting the nightly releases gpu-02 and clears its signals.
    tests
        .delete(nightly, &DeleteParams::default())
        .await
        .expect("delete the nightly test");
    wait::for_deletion(&tests, nightly, Duration::from_secs(60))
        .await
        .expect("the nightly test is gone");
    for base in ["gpu-01", "gpu-02"] {
        let n = env.read_node(base).await;
        assert_eq!(degraded(&n), None, "{base}: condition left");
        assert_eq!(result_label(&n), None, "{base}: label left");
        assert!(
            !n.annotations().contains_key(ANNOTATION_STANDING),
            "{base}: record left"
        );
    }
    assert!(
        !cordoned(&env.read_node("gpu-02").await),
        "the nightly's cordon is released"
    );
}
