//! Pure decisions about the signals on one node after a run is judged, read from every
//! test's standing of it (`gpufabric.io/standing`): the `GPUFabricDegraded` condition and
//! the `gpufabric.io/result` label of the worst standing, the `gpufabric.io/last-pass`
//! annotation, and the patches that write them (and that replace the `GPUFabricHealthy`
//! condition of 0.2.0). No client here; `super::apply` sends the patches.

use gpufabric_api::keys::{
    ANNOTATION_LAST_PASS, ANNOTATION_STANDING, CONDITION_NODE_DEGRADED,
    CONDITION_NODE_HEALTHY_LEGACY, LABEL_RESULT,
};
use gpufabric_api::standing::Standing;
use gpufabric_api::standings::NodeStandings;
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Map, Value, json};

/// Longest condition message written; the rest is cut with an ellipsis.
pub const MAX_MESSAGE: usize = 1024;

/// The condition of type `type_` a node has, if any.
fn condition_of<'a>(node: Option<&'a Node>, type_: &str) -> Option<&'a NodeCondition> {
    node?
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

/// The `GPUFabricDegraded` condition a node has, if any.
pub fn current_condition(node: Option<&Node>) -> Option<&NodeCondition> {
    condition_of(node, CONDITION_NODE_DEGRADED)
}

/// The FabricTest whose run wrote `c`, from its message (`FabricTest <test>, run <run>:
/// ...`, as [`NodeStandings::message`] writes it); None for a condition gpufabric did not write.
pub fn writer(c: &NodeCondition) -> Option<&str> {
    gpufabric_api::standings::split_message(c.message.as_deref()?).map(|(test, _, _)| test)
}

/// The `GPUFabricHealthy` condition of gpufabric 0.2.0 on a node, when a FabricTest's run
/// wrote it (one someone else wrote is theirs, and stays).
pub fn legacy_condition(node: Option<&Node>) -> Option<&NodeCondition> {
    condition_of(node, CONDITION_NODE_HEALTHY_LEGACY).filter(|c| writer(c).is_some())
}

/// The `GPUFabricDegraded` condition that says what a `GPUFabricHealthy` condition of 0.2.0
/// said: the status turned over (`True` is now the problem), the reason, message and
/// transition time kept.
pub fn from_legacy(legacy: &NodeCondition, now: &Time) -> NodeCondition {
    let status = match legacy.status.as_str() {
        "True" => "False",
        "False" => "True",
        other => other,
    };
    NodeCondition {
        type_: CONDITION_NODE_DEGRADED.to_string(),
        status: status.to_string(),
        reason: legacy.reason.clone(),
        message: legacy.message.clone(),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(
            legacy
                .last_transition_time
                .clone()
                .unwrap_or_else(|| now.clone()),
        ),
    }
}

/// The condition to write for the node's worst standing across tests, or None to leave the
/// node's condition alone: a node no test has measured keeps the condition it has (the
/// infrastructure is not the node's fault, and flipping it would trigger remediation); only
/// a node without one gets `Unknown`. The transition time is kept while the status is
/// unchanged.
pub fn condition(
    standing: &Standing,
    message: &str,
    current: Option<&NodeCondition>,
    now: &Time,
) -> Option<NodeCondition> {
    if standing.label().is_none() && current.is_some() {
        return None;
    }
    let reading = standing.condition();
    let last_transition_time = current
        .filter(|c| c.status == reading.status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    Some(NodeCondition {
        type_: CONDITION_NODE_DEGRADED.to_string(),
        status: reading.status.to_string(),
        reason: Some(reading.reason.to_string()),
        message: Some(gpufabric_api::text::cut(message, MAX_MESSAGE)),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(last_transition_time),
    })
}

/// The node's record of every test's standing: its `gpufabric.io/standing` annotation or,
/// on a node written before the standing was kept per test, the single writer of its
/// condition (an unreadable record is replaced: each test's next run writes its part).
pub fn standings_of(node: Option<&Node>) -> NodeStandings {
    let annotations = node.and_then(|n| n.metadata.annotations.as_ref());
    match NodeStandings::from_annotations(annotations) {
        Ok(Some(s)) => s,
        Ok(None) => NodeStandings::migrated(current_condition(node)),
        Err(e) => {
            tracing::warn!(error = %e, "replacing the node's standing record");
            NodeStandings::default()
        }
    }
}

/// The strategic merge patch of `nodes/status` that sets the condition `c` (when given) and
/// with `remove_legacy` deletes the `GPUFabricHealthy` condition of 0.2.0: the list merges
/// by `type`, so the kubelet's conditions are left as they are. None when it changes nothing.
pub fn status_patch(c: Option<&NodeCondition>, remove_legacy: bool) -> Option<Value> {
    let mut conditions: Vec<Value> = c.map(|c| json!(c)).into_iter().collect();
    if remove_legacy {
        conditions.push(json!({"type": CONDITION_NODE_HEALTHY_LEGACY, "$patch": "delete"}));
    }
    (!conditions.is_empty()).then(|| json!({"status": {"conditions": conditions}}))
}

/// The status patch that writes the condition `node`'s record says now, decided again after
/// the node changed under an earlier write: the worst standing's condition, or its deletion
/// when no test stands on the node any more; with `remove_legacy`, the `GPUFabricHealthy`
/// condition of 0.2.0 goes too. Guarded by the node's resourceVersion. None when nothing
/// changes.
pub fn status_patch_of_record(node: &Node, remove_legacy: bool, now: &Time) -> Option<Value> {
    let standings = standings_of(Some(node));
    let current = current_condition(Some(node));
    let mut conditions: Vec<Value> = match standings.worst().zip(standings.message()) {
        Some(((worst, _), message)) => condition(worst, &message, current, now)
            .map(|c| json!(c))
            .into_iter()
            .collect(),
        None => current
            .map(|_| json!({"type": CONDITION_NODE_DEGRADED, "$patch": "delete"}))
            .into_iter()
            .collect(),
    };
    if remove_legacy {
        conditions.push(json!({"type": CONDITION_NODE_HEALTHY_LEGACY, "$patch": "delete"}));
    }
    (!conditions.is_empty()).then(|| {
        guarded(
            json!({"status": {"conditions": conditions}}),
            node.metadata.resource_version.clone(),
        )
    })
}

/// `patch` carrying `resource_version`: the API server refuses it (409) when the object
/// changed since. None leaves the patch unguarded.
pub fn guarded(mut patch: Value, resource_version: Option<String>) -> Value {
    if let Some(rv) = resource_version {
        patch["metadata"]["resourceVersion"] = json!(rv);
    }
    patch
}

/// gpufabric's own labels and annotations on a node with `standings` (every test's
/// standing of it): the result label of the worst standing (none: left as it is), the
/// record itself, and, when `passed` (this test passed it), the last-pass time.
pub fn metadata_values(standings: &NodeStandings, passed: bool, passed_at: &Time) -> Value {
    let mut labels = Map::new();
    if let Some(value) = standings.worst().and_then(|(w, _)| w.label()) {
        labels.insert(LABEL_RESULT.into(), json!(value));
    }
    let mut annotations = Map::new();
    annotations.insert(ANNOTATION_STANDING.into(), json!(standings.to_annotation()));
    if passed {
        annotations.insert(
            ANNOTATION_LAST_PASS.into(),
            json!(gpufabric_api::rfc3339::rfc3339(passed_at.0)),
        );
    }
    json!({"metadata": {"labels": labels, "annotations": annotations}})
}

/// The merge patch of the node's metadata that brings [`metadata_values`] onto `node`,
/// guarded by the resourceVersion it was decided from; None when the node already carries
/// them. Only gpufabric's own keys are in the patch.
pub fn metadata_patch(
    node: Option<&Node>,
    standings: &NodeStandings,
    passed: bool,
    passed_at: &Time,
) -> Option<Value> {
    let want = metadata_values(standings, passed, passed_at);
    let labels = node.and_then(|n| n.metadata.labels.as_ref());
    let annotations = node.and_then(|n| n.metadata.annotations.as_ref());
    let mut meta = Map::new();
    for (part, have) in [("labels", labels), ("annotations", annotations)] {
        let changed: Map<String, Value> = want["metadata"][part]
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, v)| {
                have.and_then(|h| h.get(k.as_str()))
                    .map(|h| json!(h))
                    .as_ref()
                    != Some(*v)
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if !changed.is_empty() {
            meta.insert(part.into(), Value::Object(changed));
        }
    }
    if meta.is_empty() {
        return None;
    }
    if let Some(rv) = node.and_then(|n| n.metadata.resource_version.clone()) {
        meta.insert("resourceVersion".into(), json!(rv));
    }
    Some(json!({ "metadata": meta }))
}

/// `patch` decided again on a node read after a conflict: gpufabric's keys as `fresh`
/// ([`metadata_values`]) says, anything else the patch carried (a trend record) kept, and
/// the node's new resourceVersion.
pub fn redecided(mut patch: Value, fresh: &Value, resource_version: Option<String>) -> Value {
    for part in ["labels", "annotations"] {
        let Some(values) = fresh["metadata"][part].as_object() else {
            continue;
        };
        let target = patch
            .pointer_mut("/metadata")
            .and_then(Value::as_object_mut)
            .map(|m| m.entry(part).or_insert_with(|| json!({})))
            .and_then(Value::as_object_mut);
        if let Some(t) = target {
            for (k, v) in values {
                t.insert(k.clone(), v.clone());
            }
        }
    }
    if let Some(m) = patch
        .pointer_mut("/metadata")
        .and_then(Value::as_object_mut)
    {
        match resource_version {
            Some(rv) => m.insert("resourceVersion".into(), json!(rv)),
            None => m.remove("resourceVersion"),
        };
    }
    patch
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::to_time;
    use chrono::TimeZone;
    use gpufabric_api::standings::TestStanding;

    fn at(min: u32) -> Time {
        to_time(
            chrono::Utc
                .with_ymd_and_hms(2026, 1, 1, 0, min, 0)
                .single()
                .expect("valid"),
        )
    }

    fn with_conditions(conditions: Vec<NodeCondition>) -> Node {
        Node {
            status: Some(k8s_openapi::api::core::v1::NodeStatus {
                conditions: Some(conditions),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn legacy(status: &str, message: &str) -> NodeCondition {
        NodeCondition {
            type_: CONDITION_NODE_HEALTHY_LEGACY.into(),
            status: status.into(),
            reason: Some("Failed".into()),
            message: Some(message.into()),
            last_transition_time: Some(at(3)),
            ..Default::default()
        }
    }

    fn standings(test: &str, standing: Standing) -> NodeStandings {
        let mut s = NodeStandings::default();
        s.set(
            test,
            TestStanding {
                standing,
                run: format!("{test}-1"),
                detail: None,
            },
        );
        s
    }

    #[test]
    fn the_transition_time_is_kept_while_the_status_is_unchanged() {
        let first = condition(&Standing::Passing, "ok", None, &at(1)).expect("condition");
        assert_eq!(first.last_transition_time, Some(at(1)));
        let again = condition(&Standing::Passing, "ok 2", Some(&first), &at(5)).expect("condition");
        assert_eq!(again.last_transition_time, Some(at(1)));
        assert_eq!(again.last_heartbeat_time, Some(at(5)));
        let failed = condition(
            &Standing::Failing { hardware: false },
            "bad",
            Some(&again),
            &at(9),
        )
        .expect("condition");
        assert_eq!(failed.last_transition_time, Some(at(9)));
        assert_eq!(
            (failed.status.as_str(), failed.reason.as_deref()),
            ("True", Some("Failed"))
        );
        assert_eq!(failed.type_, "GPUFabricDegraded");
    }

    #[test]
    fn only_a_legacy_condition_a_fabrictest_wrote_is_gpufabrics() {
        let ours = legacy("False", "FabricTest nightly, run nightly-1: GPU 3 slow");
        assert_eq!(writer(&ours), Some("nightly"));
        let node = with_conditions(vec![ours.clone()]);
        assert_eq!(legacy_condition(Some(&node)), Some(&ours));
        let theirs = with_conditions(vec![legacy("True", "set by hand")]);
        assert_eq!(legacy_condition(Some(&theirs)), None);
        assert_eq!(
            writer(&legacy("True", "FabricTest , run x: passed")),
            None,
            "no test named"
        );
        assert_eq!(current_condition(Some(&node)), None, "another type");
    }

    #[test]
    fn a_legacy_condition_turns_over_and_keeps_what_it_said() {
        let old = legacy("False", "FabricTest nightly, run nightly-1: GPU 3 slow");
        let new = from_legacy(&old, &at(9));
        assert_eq!(new.type_, CONDITION_NODE_DEGRADED);
        assert_eq!(
            (new.status.as_str(), new.reason.as_deref()),
            ("True", Some("Failed"))
        );
        assert_eq!(new.message, old.message);
        assert_eq!(new.last_transition_time, Some(at(3)));
        assert_eq!(new.last_heartbeat_time, Some(at(9)));
        assert_eq!(from_legacy(&legacy("True", "m"), &at(9)).status, "False");
    }

    #[test]
    fn a_node_not_measured_keeps_its_condition_and_gets_unknown_only_without_one() {
        let failed =
            condition(&Standing::Failing { hardware: false }, "bad", None, &at(1)).expect("c");
        assert_eq!(
            condition(&Standing::NotMeasured, "busy", Some(&failed), &at(2)),
            None
        );
        let fresh = condition(&Standing::NotMeasured, "busy", None, &at(2)).expect("c");
        assert_eq!(
            (fresh.status.as_str(), fresh.reason.as_deref()),
            ("Unknown", Some("NotMeasured"))
        );
        let long = "é".repeat(2000);
        let c = condition(&Standing::Suspect, &long, None, &at(1)).expect("condition");
        let text = c.message.unwrap_or_default();
        assert!(text.len() <= MAX_MESSAGE && text.ends_with("..."));
    }

    #[test]
    fn a_node_written_by_one_test_before_the_record_existed_migrates_to_it() {
        let mut c = legacy("True", "FabricTest nightly, run nightly-1: GPU 3 slow");
        c.type_ = CONDITION_NODE_DEGRADED.into();
        let node = with_conditions(vec![c]);
        let s = standings_of(Some(&node));
        assert_eq!(
            s.tests.get("nightly").map(|t| &t.standing),
            Some(&Standing::Failing { hardware: false })
        );
    }

    #[test]
    fn the_metadata_patch_touches_only_gpufabric_keys_and_only_when_they_change() {
        let passing = standings("quick", Standing::Passing);
        let p = metadata_patch(None, &passing, true, &at(7)).expect("patch");
        assert_eq!(p["metadata"]["labels"][LABEL_RESULT], "pass");
        assert_eq!(
            p["metadata"]["annotations"][ANNOTATION_LAST_PASS],
            "2026-01-01T00:07:00Z"
        );
        let mut node = Node::default();
        node.metadata.resource_version = Some("7".into());
        node.metadata.labels = Some([(LABEL_RESULT.to_string(), "pass".to_string())].into());
        node.metadata.annotations = Some(
            [
                (
                    ANNOTATION_LAST_PASS.to_string(),
                    "2026-01-01T00:07:00Z".to_string(),
                ),
                (ANNOTATION_STANDING.to_string(), passing.to_annotation()),
            ]
            .into(),
        );
        assert_eq!(metadata_patch(Some(&node), &passing, true, &at(7)), None);
        let failing = standings("quick", Standing::Failing { hardware: true });
        let fail = metadata_patch(Some(&node), &failing, false, &at(8)).expect("patch");
        assert_eq!(fail["metadata"]["labels"][LABEL_RESULT], "fail");
        assert_eq!(fail["metadata"]["resourceVersion"], "7", "guarded");
        assert!(
            fail["metadata"]["annotations"]
                .get(ANNOTATION_LAST_PASS)
                .is_none(),
            "last-pass stays"
        );
    }

    #[test]
    fn a_patch_decided_again_after_a_conflict_keeps_what_else_it_carried() {
        let old = json!({"metadata": {"resourceVersion": "1",
            "labels": {LABEL_RESULT: "pass"},
            "annotations": {"gpufabric.io/trend": "{}"}}});
        let fresh = metadata_values(
            &standings("nightly", Standing::Quarantined { hardware: false }),
            false,
            &at(1),
        );
        let p = redecided(old, &fresh, Some("2".into()));
        assert_eq!(p["metadata"]["labels"][LABEL_RESULT], "fail");
        assert_eq!(p["metadata"]["annotations"]["gpufabric.io/trend"], "{}");
        assert_eq!(p["metadata"]["resourceVersion"], "2");
    }
}
