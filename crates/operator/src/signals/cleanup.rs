//! The FabricTest is being deleted: its part of the node signals goes with it. Its entry
//! leaves each node's standing record (`gpufabric.io/standing`), and the condition and the
//! result label read the worst standing of the tests left; a node no test stands on any more
//! loses the condition, the label, the last-pass annotation and the record. A node written
//! before the record existed counts its condition's writer as its one entry. A
//! `GPUFabricHealthy` condition of gpufabric 0.2.0 that the test wrote goes too. The
//! `gpufabric.io/counters` and `gpufabric.io/nic-counters` records belong to the hardware and
//! stay.

use gpufabric_api::keys::{
    ANNOTATION_LAST_PASS, ANNOTATION_STANDING, CONDITION_NODE_DEGRADED,
    CONDITION_NODE_HEALTHY_LEGACY, LABEL_RESULT, MANAGER,
};
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

/// Whether `c` was written by a run of FabricTest `test`.
fn by(c: Option<&NodeCondition>, test: &str) -> bool {
    c.and_then(super::node::writer) == Some(test)
}

/// Whether FabricTest `test` has a part in `node`'s signals: an entry in its standing record
/// (or, on a node without one, it wrote the condition), or it wrote the `GPUFabricHealthy`
/// condition of 0.2.0 there.
pub fn has_part(node: &Node, test: &str) -> bool {
    super::node::standings_of(Some(node))
        .tests
        .contains_key(test)
        || by(super::node::legacy_condition(Some(node)), test)
}

/// The patches that take `test`'s part out of `node`'s signals: the status patch (the
/// condition of the tests left, or its deletion; the legacy condition the test wrote goes)
/// and the metadata patch (the record, label and last pass of the tests left, or their
/// removal), guarded by the resourceVersion. Pure.
pub fn removal(node: &Node, test: &str, now: &Time) -> (Option<Value>, Option<Value>) {
    let mut standings = super::node::standings_of(Some(node));
    let had = standings.remove(test);
    let mut conditions: Vec<Value> = Vec::new();
    if by(super::node::legacy_condition(Some(node)), test) {
        conditions.push(json!({"type": CONDITION_NODE_HEALTHY_LEGACY, "$patch": "delete"}));
    }
    let mut meta = None;
    if had {
        match standings.worst().zip(standings.message()) {
            Some(((worst, _), message)) => {
                let current = super::current_condition(Some(node));
                if let Some(c) = super::condition(worst, &message, current, now) {
                    conditions.push(json!(c));
                }
                let mut values = super::metadata_values(&standings, false, now);
                if worst.label().is_none() {
                    values["metadata"]["labels"] = json!({ LABEL_RESULT: null });
                }
                meta = Some(values);
            }
            None => {
                conditions.push(json!({"type": CONDITION_NODE_DEGRADED, "$patch": "delete"}));
                meta = Some(json!({"metadata": {
                    "labels": { LABEL_RESULT: null },
                    "annotations": { ANNOTATION_LAST_PASS: null, ANNOTATION_STANDING: null },
                }}));
            }
        }
    }
    let meta = meta.map(|mut m| {
        if let Some(rv) = node.metadata.resource_version.clone() {
            m["metadata"]["resourceVersion"] = json!(rv);
        }
        m
    });
    let status = (!conditions.is_empty()).then(|| json!({"status": {"conditions": conditions}}));
    (status, meta)
}

/// Tries of one node's removal whose node changed under it.
const ATTEMPTS: usize = 3;

/// Takes FabricTest `test`'s part out of the signals of every node. Returns the nodes that
/// could not be changed, with why.
pub async fn release_all(client: &Client, test: &str) -> Result<Vec<String>, kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let pp = PatchParams {
        field_manager: Some(MANAGER.to_string()),
        ..Default::default()
    };
    let mut failures = Vec::new();
    let nodes = super::nodes_where(&api, |n| has_part(n, test)).await?;
    for n in nodes {
        let name = n.name_any();
        if let Err(e) = release_one(&api, &pp, n, test).await {
            failures.push(format!("node {name}: removing the signals: {e}"));
        }
    }
    Ok(failures)
}

/// The metadata first, under the resourceVersion (read again and decided again on a
/// conflict), then the condition, under the resourceVersion the metadata write returned (on
/// a conflict, what the record says then). A node that is gone is fine.
async fn release_one(
    api: &Api<Node>,
    pp: &PatchParams,
    mut node: Node,
    test: &str,
) -> Result<(), kube::Error> {
    let name = node.name_any();
    for attempt in 1..=ATTEMPTS {
        let (status, meta) = removal(&node, test, &crate::time::now());
        let mut resource_version = node.metadata.resource_version.clone();
        if let Some(m) = meta {
            match api.patch(&name, pp, &Patch::Merge(&m)).await {
                Ok(written) => resource_version = written.metadata.resource_version,
                Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
                Err(kube::Error::Api(e)) if e.code == 409 && attempt < ATTEMPTS => {
                    match api.get_opt(&name).await? {
                        Some(fresh) => node = fresh,
                        None => return Ok(()),
                    }
                    continue;
                }
                Err(e) => return Err(e),
            }
        }
        if let Some(s) = status {
            let legacy = by(super::node::legacy_condition(Some(&node)), test);
            let s = super::node::guarded(s, resource_version);
            super::apply::write_status(api, pp, &name, s, legacy).await?;
        }
        return Ok(());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufabric_api::standing::Standing;
    use gpufabric_api::standings::{NodeStandings, TestStanding};
    use k8s_openapi::api::core::v1::NodeStatus;

    fn condition(type_: &str, status: &str, message: &str) -> NodeCondition {
        NodeCondition {
            type_: type_.into(),
            status: status.into(),
            reason: Some("Failed".into()),
            message: Some(message.into()),
            ..Default::default()
        }
    }

    fn node(conditions: Vec<NodeCondition>, standings: Option<&NodeStandings>) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some("n1".into());
        n.metadata.resource_version = Some("5".into());
        if let Some(s) = standings {
            n.metadata.annotations =
                Some([(ANNOTATION_STANDING.to_string(), s.to_annotation())].into());
        }
        n.status = Some(NodeStatus {
            conditions: Some(conditions),
            ..Default::default()
        });
        n
    }

    fn now() -> Time {
        Time("2026-11-21T02:00:00Z".parse().expect("time"))
    }

    #[test]
    fn deleting_one_test_leaves_the_others_standing_on_the_node() {
        let mut s = NodeStandings::default();
        for (test, standing) in [
            ("nightly", Standing::Quarantined { hardware: false }),
            ("quick", Standing::Passing),
        ] {
            s.set(
                test,
                TestStanding {
                    standing,
                    run: format!("{test}-1"),
                    detail: Some("GPU 3 slow".into()),
                },
            );
        }
        let n = node(
            vec![condition(
                CONDITION_NODE_DEGRADED,
                "True",
                "FabricTest nightly, run nightly-1: GPU 3 slow",
            )],
            Some(&s),
        );
        assert!(has_part(&n, "quick") && has_part(&n, "nightly"));
        assert!(!has_part(&n, "weekly"));
        let (status, meta) = removal(&n, "quick", &now());
        let status = status.expect("the condition is written again");
        assert_eq!(status["status"]["conditions"][0]["status"], "True");
        let meta = meta.expect("the record changes");
        assert_eq!(meta["metadata"]["labels"][LABEL_RESULT], "fail");
        assert_eq!(meta["metadata"]["resourceVersion"], "5");
        let left: NodeStandings = serde_json::from_str(
            meta["metadata"]["annotations"][ANNOTATION_STANDING]
                .as_str()
                .unwrap_or_default(),
        )
        .expect("a record");
        assert_eq!(left.tests.keys().collect::<Vec<_>>(), ["nightly"]);
    }

    #[test]
    fn deleting_the_last_test_removes_every_signal() {
        let n = node(
            vec![condition(
                CONDITION_NODE_DEGRADED,
                "True",
                "FabricTest nightly, run nightly-1: GPU 3 slow",
            )],
            None,
        );
        assert!(has_part(&n, "nightly"), "the condition's writer, migrated");
        let (status, meta) = removal(&n, "nightly", &now());
        assert_eq!(
            status.expect("status")["status"]["conditions"][0],
            json!({"type": CONDITION_NODE_DEGRADED, "$patch": "delete"})
        );
        let meta = meta.expect("meta");
        assert!(meta["metadata"]["labels"][LABEL_RESULT].is_null());
        assert!(meta["metadata"]["annotations"][ANNOTATION_STANDING].is_null());
        assert!(meta["metadata"]["annotations"][ANNOTATION_LAST_PASS].is_null());
    }

    #[test]
    fn a_condition_of_0_2_0_the_test_wrote_goes_with_it_and_one_set_by_hand_stays() {
        let legacy = condition(
            CONDITION_NODE_HEALTHY_LEGACY,
            "False",
            "FabricTest nightly, run nightly-1: GPU 3 slow",
        );
        let n = node(vec![legacy], None);
        assert!(has_part(&n, "nightly"));
        let (status, meta) = removal(&n, "nightly", &now());
        assert_eq!(
            status.expect("status")["status"]["conditions"][0],
            json!({"type": CONDITION_NODE_HEALTHY_LEGACY, "$patch": "delete"})
        );
        assert_eq!(meta, None);
        let theirs = node(
            vec![condition(CONDITION_NODE_DEGRADED, "True", "set by hand")],
            None,
        );
        assert!(!has_part(&theirs, "nightly"));
        assert_eq!(removal(&theirs, "nightly", &now()), (None, None));
    }
}
