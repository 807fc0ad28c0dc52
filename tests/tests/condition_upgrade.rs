//! Upgrading from gpufabric 0.2.0, whose node condition was `GPUFabricHealthy` (`True`:
//! passed), to `GPUFabricDegraded` (`True`: a problem), against a real API server: the
//! operator, once it starts, replaces each `GPUFabricHealthy` condition a FabricTest it
//! watches wrote with the `GPUFabricDegraded` one that says the same (status turned over,
//! reason, message and transition time kept); a node judged later loses one left behind;
//! deleting the test removes what it wrote; a `GPUFabricHealthy` someone else wrote, or
//! another installation's test, is never touched.
//!
//! Build the binaries first: `cargo build --bins`, then
//! `cargo test -p gpufabric-tests --test condition_upgrade`.

use gpufabric_api::keys::{CONDITION_NODE_DEGRADED, CONDITION_NODE_HEALTHY_LEGACY, LABEL_RESULT};
use gpufabric_tests::fleet::{H100, SimFleet};
use gpufabric_tests::operator::{OperatorEnv, last_run_name, sim_agent};
use gpufabric_tests::wait;
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;
use std::time::Duration;

const SINCE: &str = "2026-11-01T10:00:00Z";

fn condition(n: &Node, type_: &str) -> Option<NodeCondition> {
    n.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .cloned()
}

fn said(c: &Option<NodeCondition>) -> Option<(String, String, String)> {
    c.as_ref().map(|c| {
        (
            c.status.clone(),
            c.reason.clone().unwrap_or_default(),
            c.message.clone().unwrap_or_default(),
        )
    })
}

/// Writes a `GPUFabricHealthy` condition on `node`, as gpufabric 0.2.0 (or someone else)
/// did.
async fn write_legacy(nodes: &Api<Node>, node: &str, status: &str, reason: &str, message: &str) {
    let patch = json!({"status": {"conditions": [{
        "type": CONDITION_NODE_HEALTHY_LEGACY,
        "status": status,
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": SINCE,
        "lastTransitionTime": SINCE,
    }]}});
    nodes
        .patch_status(node, &PatchParams::default(), &Patch::Strategic(&patch))
        .await
        .expect("a GPUFabricHealthy condition written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_conditions_of_0_2_0_become_the_new_ones_and_only_gpufabrics() {
    let mut env = OperatorEnv::shared(SimFleet::uniform("gpu", 4, H100, 8), "upgrade").await;
    let nodes: Api<Node> = Api::all(env.cluster.client());
    // Runs only when asked for (the schedule is once a year, far from now).
    let tests = env
        .create_test(
            "upgrade",
            json!({
                "nodeSelector": env.node_selector(),
                "schedule": "0 0 1 1 *",
                "quarantine": {"mode": "Observe", "confirmRetest": false},
                "agent": sim_agent(60)
            }),
        )
        .await;

    // What 0.2.0 left: a confirmed failure and a pass written by runs of this test; one
    // written by hand; one written by another installation's test.
    let failed =
        "FabricTest upgrade, run upgrade-29000000: GPU 3 <-> GPU 5 copy bandwidth 201 GB/s";
    write_legacy(&nodes, &env.node("gpu-01"), "False", "Failed", failed).await;
    let passed = "FabricTest upgrade, run upgrade-29000000: passed";
    write_legacy(&nodes, &env.node("gpu-02"), "True", "Passed", passed).await;
    write_legacy(
        &nodes,
        &env.node("gpu-03"),
        "False",
        "Manual",
        "set by hand",
    )
    .await;
    let elsewhere = "FabricTest elsewhere, run elsewhere-1: passed";
    write_legacy(&nodes, &env.node("gpu-04"), "True", "Passed", elsewhere).await;

    // The upgraded operator starts.
    env.operator.kill();
    env.operator.restart();
    let migrated_node = |base: &'static str| {
        let (nodes, name) = (nodes.clone(), env.node(base));
        let env = &env;
        async move {
            wait::poll(
                &format!("{base}'s GPUFabricDegraded condition"),
                Duration::from_secs(60),
                Duration::from_millis(300),
                || async {
                    let n = nodes.get(&name).await.ok();
                    Ok(n.filter(|n| condition(n, CONDITION_NODE_DEGRADED).is_some()))
                },
            )
            .await
            .unwrap_or_else(|e| panic!("{e}\noperator log:\n{}", env.operator.log_tail(60)))
        }
    };
    let migrated = migrated_node("gpu-01").await;

    // A confirmed failure is True now, saying what it said since when it said it.
    let c = condition(&migrated, CONDITION_NODE_DEGRADED);
    assert_eq!(
        said(&c),
        Some(("True".into(), "Failed".into(), failed.into()))
    );
    assert_eq!(
        c.and_then(|c| c.last_transition_time)
            .map(|t| t.0.to_string()),
        Some(SINCE.to_string()),
        "the transition time stays"
    );
    assert_eq!(condition(&migrated, CONDITION_NODE_HEALTHY_LEGACY), None);
    // The operator migrates one node after the other: gpu-02 may come a moment later.
    let n2 = migrated_node("gpu-02").await;
    assert_eq!(
        said(&condition(&n2, CONDITION_NODE_DEGRADED)),
        Some(("False".into(), "Passed".into(), passed.into()))
    );
    assert_eq!(condition(&n2, CONDITION_NODE_HEALTHY_LEGACY), None);
    // Not gpufabric's, or not this installation's: left as they were.
    for (base, message) in [("gpu-03", "set by hand"), ("gpu-04", elsewhere)] {
        let n = env.read_node(base).await;
        assert_eq!(condition(&n, CONDITION_NODE_DEGRADED), None, "{base}");
        assert_eq!(
            condition(&n, CONDITION_NODE_HEALTHY_LEGACY).and_then(|c| c.message),
            Some(message.to_string()),
            "{base}"
        );
    }

    // A GPUFabricHealthy of this test written after the start (an old replica's last write)
    // goes when the node is judged next; one someone else wrote, or another installation's
    // test, stays even on a node the run judged.
    write_legacy(&nodes, &env.node("gpu-02"), "True", "Passed", passed).await;
    env.run_now("upgrade").await;
    let s = env.wait_folded("upgrade", None).await;
    for base in ["gpu-01", "gpu-02", "gpu-03", "gpu-04"] {
        let n = env.read_node(base).await;
        assert_eq!(
            said(&condition(&n, CONDITION_NODE_DEGRADED))
                .map(|(status, reason, _)| (status, reason)),
            Some(("False".into(), "Passed".into())),
            "{base}: {:#?}",
            s.nodes
        );
        assert_eq!(
            n.labels().get(LABEL_RESULT).map(String::as_str),
            Some("pass")
        );
    }
    assert_eq!(
        condition(
            &env.read_node("gpu-02").await,
            CONDITION_NODE_HEALTHY_LEGACY
        ),
        None,
        "left behind, removed with the node's next judgement"
    );
    for (base, message) in [("gpu-03", "set by hand"), ("gpu-04", elsewhere)] {
        assert_eq!(
            condition(&env.read_node(base).await, CONDITION_NODE_HEALTHY_LEGACY)
                .and_then(|c| c.message),
            Some(message.to_string()),
            "{base}"
        );
    }

    // Deleting the test removes the conditions and labels its runs wrote, and only those.
    let run = last_run_name(&s);
    assert!(!run.is_empty());
    tests
        .delete("upgrade", &DeleteParams::default())
        .await
        .expect("delete the test");
    wait::for_deletion(&tests, "upgrade", Duration::from_secs(60))
        .await
        .expect("the test is gone");
    for base in ["gpu-01", "gpu-02", "gpu-03", "gpu-04"] {
        let n = env.read_node(base).await;
        assert_eq!(condition(&n, CONDITION_NODE_DEGRADED), None, "{base}");
        assert_eq!(n.labels().get(LABEL_RESULT), None, "{base}");
    }
    for (base, message) in [("gpu-03", "set by hand"), ("gpu-04", elsewhere)] {
        assert_eq!(
            condition(&env.read_node(base).await, CONDITION_NODE_HEALTHY_LEGACY)
                .and_then(|c| c.message),
            Some(message.to_string()),
            "{base}"
        );
    }
}
