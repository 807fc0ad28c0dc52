//! The FabricTest is being deleted: the node signals its runs wrote last go with it. The
//! condition's message names the test whose run wrote it (`FabricTest nightly, run ...`):
//! that is the record of who wrote the condition, the result label and the last-pass
//! annotation together. Nodes whose condition another test (or anyone else) wrote are not
//! touched. A `GPUFabricHealthy` condition of gpufabric 0.2.0 that the test wrote goes too
//! (on a node not tested since the upgrade it is the node's only condition, and its record).
//! The `gpufabric.io/counters` and `gpufabric.io/nic-counters` records belong to the
//! hardware and stay.

use gpufabric_api::keys::{
    ANNOTATION_LAST_PASS, CONDITION_NODE_DEGRADED, CONDITION_NODE_HEALTHY_LEGACY, LABEL_RESULT,
    MANAGER,
};
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

/// Whether `c` was written by a run of FabricTest `test`.
fn by(c: Option<&NodeCondition>, test: &str) -> bool {
    c.and_then(super::node::writer) == Some(test)
}

/// Whether `node`'s signals were written by a run of FabricTest `test`: its
/// `GPUFabricDegraded` condition says so, or, on a node without one, its `GPUFabricHealthy`
/// condition of 0.2.0 does.
pub fn written_by(node: &Node, test: &str) -> bool {
    match super::current_condition(Some(node)) {
        Some(c) => by(Some(c), test),
        None => by(super::node::legacy_condition(Some(node)), test),
    }
}

/// The conditions of `node` that FabricTest `test` wrote, by type (the current one, and the
/// one of 0.2.0).
pub fn conditions_written_by(node: &Node, test: &str) -> Vec<&'static str> {
    let mut out = Vec::new();
    if by(super::current_condition(Some(node)), test) {
        out.push(CONDITION_NODE_DEGRADED);
    }
    if by(super::node::legacy_condition(Some(node)), test) {
        out.push(CONDITION_NODE_HEALTHY_LEGACY);
    }
    out
}

/// The strategic merge patch of `nodes/status` that removes the conditions of `types` (the
/// list merges by type: the kubelet's conditions stay).
pub fn remove_conditions_patch(types: &[&str]) -> Value {
    let deletes: Vec<Value> = types
        .iter()
        .map(|t| json!({"type": t, "$patch": "delete"}))
        .collect();
    json!({"status": {"conditions": deletes}})
}

/// The merge patch that removes the result label and the last-pass annotation.
pub fn remove_metadata_patch() -> Value {
    json!({"metadata": {
        "labels": { LABEL_RESULT: null },
        "annotations": { ANNOTATION_LAST_PASS: null },
    }})
}

/// Removes the signals FabricTest `test` wrote last, on every node. Returns the nodes
/// that could not be changed, with why.
pub async fn release_all(client: &Client, test: &str) -> Result<Vec<String>, kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let pp = PatchParams {
        field_manager: Some(MANAGER.to_string()),
        ..Default::default()
    };
    let mut failures = Vec::new();
    // A node whose signals the test wrote carries a condition it wrote.
    let nodes = super::nodes_where(&api, |n| !conditions_written_by(n, test).is_empty()).await?;
    for n in nodes {
        let name = n.name_any();
        let status = api
            .patch_status(
                &name,
                &pp,
                &Patch::Strategic(remove_conditions_patch(&conditions_written_by(&n, test))),
            )
            .await
            .map(|_| ());
        // The label and annotation belong to the node's current condition's writer.
        let meta = if written_by(&n, test) {
            api.patch(&name, &pp, &Patch::Merge(remove_metadata_patch()))
                .await
                .map(|_| ())
        } else {
            Ok(())
        };
        for r in [status, meta] {
            match r {
                Ok(()) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => failures.push(format!("node {name}: removing the signals: {e}")),
            }
        }
    }
    Ok(failures)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeStatus;

    fn condition(type_: &str, message: &str) -> NodeCondition {
        NodeCondition {
            type_: type_.into(),
            status: "False".into(),
            message: Some(message.into()),
            ..Default::default()
        }
    }

    fn node(conditions: Vec<NodeCondition>) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some("n1".into());
        n.status = Some(NodeStatus {
            conditions: Some(conditions),
            ..Default::default()
        });
        n
    }

    fn degraded(message: &str) -> Node {
        node(vec![condition(CONDITION_NODE_DEGRADED, message)])
    }

    #[test]
    fn only_the_test_that_wrote_the_condition_owns_the_signals() {
        let n = degraded("FabricTest nightly, run nightly-29373120: passed");
        assert!(written_by(&n, "nightly"));
        assert!(
            !written_by(&n, "night"),
            "a prefix of the name is another test"
        );
        assert!(!written_by(&degraded("set by hand"), "nightly"));
        assert!(!written_by(&node(vec![]), "nightly"));
        assert_eq!(
            conditions_written_by(&n, "nightly"),
            [CONDITION_NODE_DEGRADED]
        );
        assert!(conditions_written_by(&n, "other").is_empty());
    }

    #[test]
    fn a_condition_of_0_2_0_the_test_wrote_goes_with_it() {
        let legacy = |m: &str| condition(CONDITION_NODE_HEALTHY_LEGACY, m);
        // Not tested since the upgrade: the legacy condition is the node's record.
        let n = node(vec![legacy(
            "FabricTest nightly, run nightly-1: GPU 3 slow",
        )]);
        assert!(written_by(&n, "nightly"));
        assert_eq!(
            conditions_written_by(&n, "nightly"),
            [CONDITION_NODE_HEALTHY_LEGACY]
        );
        // Tested by another test since: its condition and label stay; only the legacy one
        // the deleted test wrote goes.
        let n = node(vec![
            condition(
                CONDITION_NODE_DEGRADED,
                "FabricTest weekly, run weekly-3: passed",
            ),
            legacy("FabricTest nightly, run nightly-1: passed"),
        ]);
        assert!(!written_by(&n, "nightly"));
        assert_eq!(
            conditions_written_by(&n, "nightly"),
            [CONDITION_NODE_HEALTHY_LEGACY]
        );
        // One someone else wrote is theirs.
        let n = node(vec![legacy("set by hand")]);
        assert!(!written_by(&n, "nightly"));
        assert!(conditions_written_by(&n, "nightly").is_empty());
    }

    #[test]
    fn the_patches_remove_only_gpufabrics_keys() {
        let c = remove_conditions_patch(&[CONDITION_NODE_DEGRADED, CONDITION_NODE_HEALTHY_LEGACY]);
        assert_eq!(
            c["status"]["conditions"][0]["type"],
            CONDITION_NODE_DEGRADED
        );
        assert_eq!(c["status"]["conditions"][0]["$patch"], "delete");
        assert_eq!(
            c["status"]["conditions"][1]["type"],
            CONDITION_NODE_HEALTHY_LEGACY
        );
        assert_eq!(c["status"]["conditions"].as_array().map(Vec::len), Some(2));
        let m = remove_metadata_patch();
        assert_eq!(
            m["metadata"]["labels"].as_object().map(|o| o.len()),
            Some(1)
        );
        assert!(m["metadata"]["labels"][LABEL_RESULT].is_null());
        assert_eq!(
            m["metadata"]["annotations"].as_object().map(|o| o.len()),
            Some(1)
        );
    }
}
