//! From gpufabric 0.2.0's `GPUFabricHealthy` node condition (`True`: passed) to
//! `GPUFabricDegraded` (`True`: a problem, as node-problem-detector's conditions are and
//! draino and NodeHealthCheck read them). Once, when the operator starts to lead and before
//! its controllers run, every `GPUFabricHealthy` condition that a run of a FabricTest this
//! operator watches wrote is replaced in one patch by the `GPUFabricDegraded` condition
//! saying the same, turned over (reason, message and transition time kept), so that no node
//! waits for its next run to carry the new signal. A node that has a `GPUFabricDegraded`
//! condition already only loses the old one. A condition someone else wrote, or another
//! installation's test, is not touched.

use super::node;
use futures::StreamExt;
use gpufabric_api::FabricTest;
use gpufabric_api::keys::MANAGER;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::Value;
use std::collections::BTreeSet;

/// The patch of `nodes/status` that replaces `n`'s `GPUFabricHealthy` condition, when one of
/// `tests` wrote it; None otherwise. Pure.
pub fn patch(n: &Node, tests: &BTreeSet<String>, now: &Time) -> Option<Value> {
    let legacy = node::legacy_condition(Some(n))
        .filter(|c| node::writer(c).is_some_and(|t| tests.contains(t)))?;
    let replacement = match node::current_condition(Some(n)) {
        Some(_) => None,
        None => Some(node::from_legacy(legacy, now)),
    };
    node::status_patch(replacement.as_ref(), true)
}

/// The names of the FabricTests this operator watches (`selector`: its `--selector`).
async fn watched_tests(
    client: &Client,
    selector: Option<&str>,
) -> Result<BTreeSet<String>, kube::Error> {
    let api: Api<FabricTest> = Api::all(client.clone());
    let mut names = BTreeSet::new();
    let mut pages = crate::paging::Pages::default();
    while let Some(lp) = pages.next_params() {
        let lp: ListParams = match selector {
            Some(s) => lp.labels(s),
            None => lp,
        };
        let page = api.list_metadata(&lp).await?;
        names.extend(page.items.iter().map(ResourceExt::name_any));
        pages.read(page.metadata.continue_);
    }
    Ok(names)
}

/// Replaces the `GPUFabricHealthy` conditions the watched FabricTests wrote. Returns the
/// nodes changed, and those that could not be, with why.
pub async fn legacy_conditions(
    client: &Client,
    selector: Option<&str>,
) -> Result<(Vec<String>, Vec<String>), kube::Error> {
    let tests = watched_tests(client, selector).await?;
    if tests.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let api: Api<Node> = Api::all(client.clone());
    let now = crate::time::now();
    let nodes = super::nodes_where(&api, |n| patch(n, &tests, &now).is_some()).await?;
    let pp = PatchParams {
        field_manager: Some(MANAGER.to_string()),
        ..Default::default()
    };
    let patches: Vec<(String, Value)> = nodes
        .iter()
        .filter_map(|n| Some((n.name_any(), patch(n, &tests, &now)?)))
        .collect();
    let results: Vec<(String, Result<(), kube::Error>)> = futures::stream::iter(patches)
        .map(|(name, p)| {
            let (api, pp) = (&api, &pp);
            async move {
                let p = Patch::Strategic(p);
                let r = super::apply::retrying(|| api.patch_status(&name, pp, &p)).await;
                (name, r.map(|_| ()))
            }
        })
        .buffer_unordered(super::WRITE_CONCURRENCY)
        .collect()
        .await;
    let (mut changed, mut failures) = (Vec::new(), Vec::new());
    for (name, r) in results {
        match r {
            Ok(()) => changed.push(name),
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => failures.push(format!("node {name}: replacing GPUFabricHealthy: {e}")),
        }
    }
    Ok((changed, failures))
}

/// [`legacy_conditions`], with what it did logged: a node it could not change is replaced
/// at its next judged run instead, or its condition removed with the test.
pub async fn run(client: &Client, selector: Option<&str>) {
    match legacy_conditions(client, selector).await {
        Ok((changed, failures)) => {
            if !changed.is_empty() {
                tracing::info!(
                    nodes = changed.len(),
                    "replaced gpufabric 0.2.0's GPUFabricHealthy condition with GPUFabricDegraded"
                );
            }
            if !failures.is_empty() {
                tracing::warn!(
                    ?failures,
                    "GPUFabricHealthy left on nodes; their next judged run replaces it"
                );
            }
        }
        Err(e) => tracing::warn!(
            error = %e,
            "listing FabricTests or nodes to replace GPUFabricHealthy; each node's next judged run replaces it"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufabric_api::keys::{CONDITION_NODE_DEGRADED, CONDITION_NODE_HEALTHY_LEGACY};
    use k8s_openapi::api::core::v1::{NodeCondition, NodeStatus};
    use serde_json::json;

    fn at(secs: i64) -> Time {
        crate::time::to_time(chrono::DateTime::from_timestamp(secs, 0).expect("valid time"))
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

    fn condition(type_: &str, status: &str, message: &str) -> NodeCondition {
        NodeCondition {
            type_: type_.into(),
            status: status.into(),
            reason: Some("HardwareFault".into()),
            message: Some(message.into()),
            last_transition_time: Some(at(100)),
            ..Default::default()
        }
    }

    fn tests(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn a_legacy_condition_of_a_watched_test_is_replaced_by_the_new_one_turned_over() {
        let n = node(vec![condition(
            CONDITION_NODE_HEALTHY_LEGACY,
            "False",
            "FabricTest nightly, run nightly-1: GPU 2 missing",
        )]);
        let p = patch(&n, &tests(&["nightly"]), &at(500)).expect("a patch");
        let conditions = p["status"]["conditions"].as_array().expect("a list");
        assert_eq!(conditions.len(), 2);
        assert_eq!(conditions[0]["type"], CONDITION_NODE_DEGRADED);
        assert_eq!(conditions[0]["status"], "True", "a fault is True now");
        assert_eq!(conditions[0]["reason"], "HardwareFault");
        assert_eq!(
            conditions[0]["message"],
            "FabricTest nightly, run nightly-1: GPU 2 missing"
        );
        assert_eq!(
            conditions[0]["lastTransitionTime"],
            json!(at(100)),
            "since when it says so stays"
        );
        assert_eq!(
            conditions[1],
            json!({"type": CONDITION_NODE_HEALTHY_LEGACY, "$patch": "delete"})
        );
    }

    #[test]
    fn a_node_with_the_new_condition_only_loses_the_old_one() {
        let n = node(vec![
            condition(
                CONDITION_NODE_HEALTHY_LEGACY,
                "True",
                "FabricTest nightly, run nightly-1: passed",
            ),
            condition(
                CONDITION_NODE_DEGRADED,
                "True",
                "FabricTest nightly, run nightly-2: GPU 2 missing",
            ),
        ]);
        let p = patch(&n, &tests(&["nightly"]), &at(500)).expect("a patch");
        assert_eq!(
            p["status"]["conditions"],
            json!([{"type": CONDITION_NODE_HEALTHY_LEGACY, "$patch": "delete"}])
        );
    }

    #[test]
    fn conditions_of_others_are_left_alone() {
        let of = |message: &str| {
            node(vec![condition(
                CONDITION_NODE_HEALTHY_LEGACY,
                "False",
                message,
            )])
        };
        let watched = tests(&["nightly"]);
        assert_eq!(
            patch(
                &of("FabricTest weekly, run weekly-1: passed"),
                &watched,
                &at(5)
            ),
            None,
            "another installation's test"
        );
        assert_eq!(patch(&of("set by hand"), &watched, &at(5)), None);
        assert_eq!(patch(&node(vec![]), &watched, &at(5)), None);
    }
}
