//! The demo's node lifecycle after the nightly run: the busy node, free again, is put
//! behind the validation gate as a freshly provisioned node would be, and passes; the node
//! nightly cordoned is repaired, marked so, and released by one passing run.

use crate::NAMESPACE;
use crate::print::{info, step};
use crate::setup::kubectl;
use gpufabric_api::FabricTest;
use gpufabric_api::keys::{ANNOTATION_REPAIRED, TAINT_VALIDATION};
use gpufabric_tests::cluster::Cluster;
use gpufabric_tests::fixtures;
use gpufabric_tests::fleet::SimFleet;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams};
use std::time::Duration;

fn gated(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == TAINT_VALIDATION))
}

fn cordoned(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// Gates `busy` (its training job ends first) and repairs the node `test` holds; waits up to
/// `timeout` for the gate to open and the node to be released, and prints what happened.
pub(crate) async fn show_lifecycle(
    cluster: &Cluster,
    fleet: &SimFleet,
    test: &str,
    busy: Option<&str>,
    timeout: Duration,
) -> anyhow::Result<()> {
    step("a node's life: a gated node and a repaired node, each tested at once");
    let tests: Api<FabricTest> = Api::all(cluster.client());
    let held = tests
        .get(test)
        .await?
        .status
        .and_then(|s| s.quarantined_nodes.first().cloned());
    if let Some(node) = busy {
        let pods: Api<Pod> = Api::namespaced(cluster.client(), NAMESPACE);
        pods.delete(
            &fixtures::gpu_holder_name(node),
            &DeleteParams::default().grace_period(0),
        )
        .await?;
        info(format!(
            "the training job on {node} ended; gating it as a new node is: kubectl taint node {node} {TAINT_VALIDATION}=pending:NoSchedule"
        ));
        kubectl(
            cluster,
            &[
                "taint",
                "node",
                node,
                &format!("{TAINT_VALIDATION}=pending:NoSchedule"),
            ],
        );
    }
    if let Some(node) = &held {
        let mut repaired = fleet.fleet().clone();
        for n in repaired.nodes.iter_mut().filter(|n| &n.name == node) {
            n.faults.clear();
        }
        SimFleet::write_to(repaired, fleet.path())?;
        info(format!(
            "{node}'s NIC is replaced; marking it: kubectl annotate node {node} {ANNOTATION_REPAIRED}=\"NIC replaced\""
        ));
        kubectl(
            cluster,
            &[
                "annotate",
                "node",
                node,
                &format!("{ANNOTATION_REPAIRED}=NIC replaced"),
            ],
        );
    }
    let nodes: Api<Node> = Api::all(cluster.client());
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let gate_open = match busy {
            Some(n) => !gated(&nodes.get(n).await?),
            None => true,
        };
        let released = match &held {
            Some(n) => !cordoned(&nodes.get(n).await?),
            None => true,
        };
        if gate_open && released {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            info("the gated or the repaired node was not judged in time");
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    step("kubectl get ftr -l gpufabric.io/trigger=targeted");
    kubectl(
        cluster,
        &["get", "ftr", "-l", "gpufabric.io/trigger=targeted"],
    );
    for node in busy.into_iter().chain(held.as_deref()) {
        let n = nodes.get(node).await?;
        let said = gpufabric_tests::events::about(&cluster.client(), "default", node).await;
        let lifecycle: Vec<String> = said
            .into_iter()
            .filter(|(r, _)| {
                [
                    "ValidationPassed",
                    "ValidationFailed",
                    "RepairPassed",
                    "RepairFailed",
                    "Released",
                ]
                .contains(&r.as_str())
            })
            .map(|(r, note)| format!("{r}: {note}"))
            .collect();
        info(format!(
            "{node}: gated {}, cordoned {}; {}",
            gated(&n),
            cordoned(&n),
            lifecycle.join(" | ")
        ));
    }
    Ok(())
}
