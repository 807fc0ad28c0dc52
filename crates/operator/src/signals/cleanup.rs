//! The FabricTest is being deleted: the node signals its runs wrote last go with it. The
//! condition's message names the test whose run wrote it (`FabricTest nightly, run ...`):
//! that is the record of who wrote the condition, the result label and the last-pass
//! annotation together. Nodes whose condition another test (or anyone else) wrote are not
//! touched. The `gpufabric.io/counters` and `gpufabric.io/nic-counters` records belong to
//! the hardware and stay.

use gpufabric_api::keys::{ANNOTATION_LAST_PASS, CONDITION_NODE_HEALTHY, LABEL_RESULT, MANAGER};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

/// Whether `node`'s `GPUFabricHealthy` condition was written by a run of FabricTest `test`.
pub fn written_by(node: &Node, test: &str) -> bool {
    let prefix = format!("FabricTest {test}, run ");
    super::current_condition(Some(node))
        .and_then(|c| c.message.as_deref())
        .is_some_and(|m| m.starts_with(&prefix))
}

/// The strategic merge patch of `nodes/status` that removes the condition (the list merges
/// by type: the kubelet's conditions stay).
pub fn remove_condition_patch() -> Value {
    json!({"status": {"conditions": [{"type": CONDITION_NODE_HEALTHY, "$patch": "delete"}]}})
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
    for n in super::nodes_where(&api, |n| written_by(n, test)).await? {
        let name = n.name_any();
        let status = api
            .patch_status(&name, &pp, &Patch::Strategic(remove_condition_patch()))
            .await;
        let meta = api
            .patch(&name, &pp, &Patch::Merge(remove_metadata_patch()))
            .await;
        for r in [status.map(|_| ()), meta.map(|_| ())] {
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
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};

    fn node(message: Option<&str>) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some("n1".into());
        n.status = Some(NodeStatus {
            conditions: Some(
                message
                    .map(|m| NodeCondition {
                        type_: CONDITION_NODE_HEALTHY.into(),
                        status: "True".into(),
                        message: Some(m.into()),
                        ..Default::default()
                    })
                    .into_iter()
                    .collect(),
            ),
            ..Default::default()
        });
        n
    }

    #[test]
    fn only_the_test_that_wrote_the_condition_owns_the_signals() {
        let n = node(Some("FabricTest nightly, run nightly-29373120: passed"));
        assert!(written_by(&n, "nightly"));
        assert!(
            !written_by(&n, "night"),
            "a prefix of the name is another test"
        );
        assert!(!written_by(&node(Some("set by hand")), "nightly"));
        assert!(!written_by(&node(None), "nightly"));
    }

    #[test]
    fn the_patches_remove_only_gpufabrics_keys() {
        let c = remove_condition_patch();
        assert_eq!(c["status"]["conditions"][0]["type"], CONDITION_NODE_HEALTHY);
        assert_eq!(c["status"]["conditions"][0]["$patch"], "delete");
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
