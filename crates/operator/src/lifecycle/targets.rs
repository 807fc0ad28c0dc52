//! Which nodes a FabricTest tests now, outside its schedule, and when it tries again: pure
//! decisions from the nodes as cached and the test's history.

use crate::nodes::matches_selector;
use crate::pods::allocatable_gpus;
use gpufabric_api::keys::{ANNOTATION_REPAIRED, TAINT_VALIDATION};
use gpufabric_api::test::{FabricTest, NodeHealth, NodeTarget};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use std::collections::BTreeMap;

/// Most targets a test's status lists (and a targeted run takes at once).
pub const MAX_TARGETS: usize = 200;
/// The first retry of a target that a run did not measure waits this long; each further
/// one twice as long, up to [`MAX_BACKOFF_SECONDS`].
pub const FIRST_BACKOFF_SECONDS: i64 = 20;
pub const MAX_BACKOFF_SECONDS: i64 = 600;

/// The node is selected by `test` (its selector, its name list, GPUs allocatable) and not
/// being deleted.
pub fn selects(test: &FabricTest, node: &Node) -> bool {
    node.metadata.deletion_timestamp.is_none()
        && test
            .spec
            .nodes
            .as_ref()
            .is_none_or(|names| names.contains(&node.name_any()))
        && matches_selector(node, &test.spec.node_selector)
        && allocatable_gpus(node) > 0
}

/// The node carries the validation gate.
pub fn is_gated(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == TAINT_VALIDATION))
}

/// `a` is before `b` (both present).
fn before(a: &Time, b: &Time) -> bool {
    a.0 < b.0
}

/// The test has not measured the node since `since`.
fn unmeasured_since(h: Option<&NodeHealth>, since: Option<&Time>) -> bool {
    match (h.and_then(|h| h.last_measured.as_ref()), since) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(measured), Some(since)) => before(measured, since),
    }
}

/// Why the test must test `node` now, if it must: the validation gate (and the test has not
/// measured the node since it joined), the repaired annotation, a quarantine someone else
/// lifted (not measured since), a node condition the test names turned True (not measured
/// since). Several reasons are joined.
pub fn why_now(test: &FabricTest, node: &Node, h: Option<&NodeHealth>) -> Option<String> {
    let mut why = Vec::new();
    if is_gated(node) && unmeasured_since(h, node.metadata.creation_timestamp.as_ref()) {
        why.push(format!("carries the validation gate {TAINT_VALIDATION}"));
    }
    if let Some(v) = node.annotations().get(ANNOTATION_REPAIRED) {
        let note = if v.trim().is_empty() {
            String::new()
        } else {
            format!(": {}", short(v))
        };
        why.push(format!("marked repaired ({ANNOTATION_REPAIRED}{note})"));
    }
    if let Some(t) = h.and_then(|h| h.taken_back.as_ref())
        && t.repair
        && unmeasured_since(h, Some(&t.at))
    {
        why.push(format!(
            "its quarantine was lifted ({}): tested as back from repair",
            t.what
        ));
    }
    let conditions = conditions(node);
    for wanted in &test.spec.node_lifecycle.test_on_conditions {
        let Some(c) = conditions.iter().find(|c| &c.type_ == wanted) else {
            continue;
        };
        if c.status == "True" && unmeasured_since(h, c.last_transition_time.as_ref()) {
            let detail = [c.reason.as_deref(), c.message.as_deref()]
                .into_iter()
                .flatten()
                .filter(|s| !s.is_empty())
                .map(short)
                .collect::<Vec<_>>()
                .join(": ");
            why.push(if detail.is_empty() {
                format!("condition {wanted}=True")
            } else {
                format!("condition {wanted}=True ({detail})")
            });
        }
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// The node's conditions (none when it reports none).
pub fn conditions(node: &Node) -> &[k8s_openapi::api::core::v1::NodeCondition] {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(Vec::as_slice)
        .unwrap_or_default()
}

fn short(s: &str) -> String {
    const MAX: usize = 160;
    if s.len() <= MAX {
        return s.to_string();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

/// Every node `test` must test now, by name, with why (see [`why_now`]).
pub fn wanted<'a>(
    test: &FabricTest,
    nodes: impl IntoIterator<Item = &'a Node>,
    history: &[NodeHealth],
) -> BTreeMap<String, String> {
    let by_node: BTreeMap<&str, &NodeHealth> =
        history.iter().map(|h| (h.node.as_str(), h)).collect();
    nodes
        .into_iter()
        .filter(|n| selects(test, n))
        .filter_map(|n| {
            let name = n.name_any();
            why_now(test, n, by_node.get(name.as_str()).copied()).map(|why| (name, why))
        })
        .collect()
}

/// The targets after this look: each wanted node, with the attempts and backoff its earlier
/// entry had (a node no longer wanted is dropped), at most [`MAX_TARGETS`]; and the nodes
/// due now (no backoff pending).
pub fn schedule(
    previous: &[NodeTarget],
    wanted: &BTreeMap<String, String>,
    now: &Time,
) -> (Vec<NodeTarget>, Vec<String>) {
    let before: BTreeMap<&str, &NodeTarget> =
        previous.iter().map(|t| (t.node.as_str(), t)).collect();
    let targets: Vec<NodeTarget> = wanted
        .iter()
        .take(MAX_TARGETS)
        .map(|(node, reason)| {
            let prev = before.get(node.as_str());
            NodeTarget {
                node: node.clone(),
                reason: reason.clone(),
                attempts: prev.map_or(0, |p| p.attempts),
                next_attempt: prev.and_then(|p| p.next_attempt.clone()),
            }
        })
        .collect();
    let due = targets
        .iter()
        .filter(|t| {
            t.next_attempt
                .as_ref()
                .is_none_or(|at| !before_now(now, at))
        })
        .map(|t| t.node.clone())
        .collect();
    (targets, due)
}

/// `now` is before `at`.
fn before_now(now: &Time, at: &Time) -> bool {
    before(now, at)
}

/// A targeted run starts for `nodes` at `now`: each counts an attempt and waits its backoff
/// before the next (a run that measures it ends the target; one that does not leaves it to
/// be tried again then).
pub fn attempted(targets: &mut [NodeTarget], nodes: &[String], now: &Time) {
    for t in targets.iter_mut().filter(|t| nodes.contains(&t.node)) {
        t.attempts = t.attempts.saturating_add(1);
        t.next_attempt = Some(after(now, backoff_seconds(t.attempts)));
    }
}

/// The wait after the `attempts`-th run.
pub fn backoff_seconds(attempts: u32) -> i64 {
    let doublings = attempts.saturating_sub(1).min(20);
    (FIRST_BACKOFF_SECONDS << doublings).min(MAX_BACKOFF_SECONDS)
}

fn after(t: &Time, seconds: i64) -> Time {
    Time(
        k8s_openapi::jiff::Timestamp::from_second(t.0.as_second().saturating_add(seconds))
            .unwrap_or(t.0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufabric_api::test::TakenBack;
    use serde_json::json;

    fn time(s: &str) -> Time {
        Time(s.parse().expect("time"))
    }

    fn test(spec: serde_json::Value) -> FabricTest {
        serde_json::from_value(json!({
            "apiVersion": "gpufabric.io/v1alpha1", "kind": "FabricTest",
            "metadata": {"name": "t"}, "spec": spec
        }))
        .expect("a test")
    }

    fn node(name: &str, extra: serde_json::Value) -> Node {
        let mut v = json!({
            "metadata": {"name": name, "labels": {"pool": "a"},
                "creationTimestamp": "2026-11-27T01:00:00Z"},
            "spec": {},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}}
        });
        crate::quarantine::node_merge_for_tests(&mut v, &extra);
        serde_json::from_value(v).expect("a node")
    }

    fn measured(node: &str, at: &str) -> NodeHealth {
        NodeHealth {
            node: node.into(),
            last_measured: Some(time(at)),
            ..Default::default()
        }
    }

    const GATE: &str =
        r#"{"spec": {"taints": [{"key": "gpufabric.io/validation", "effect": "NoSchedule"}]}}"#;

    #[test]
    fn a_gated_node_is_wanted_until_the_test_measures_it_after_it_joined() {
        let t = test(json!({"nodeSelector": {"pool": "a"}}));
        let gated = node("g", serde_json::from_str(GATE).expect("json"));
        assert!(why_now(&t, &gated, None).is_some_and(|w| w.contains("validation gate")));
        // Measured before it joined (the same name, an earlier machine): wanted.
        assert!(why_now(&t, &gated, Some(&measured("g", "2026-11-26T00:00:00Z"))).is_some());
        // Measured since: a failure keeps the gate but is not retested at once.
        assert!(why_now(&t, &gated, Some(&measured("g", "2026-11-27T02:00:00Z"))).is_none());
        // A node the test does not select is never wanted.
        let other = test(json!({"nodeSelector": {"pool": "b"}}));
        assert!(wanted(&other, [&gated], &[]).is_empty());
        // Nor one without GPUs.
        let cpu = node(
            "c",
            json!({"status": {"allocatable": {"nvidia.com/gpu": "0"}}}),
        );
        assert!(!selects(&t, &cpu));
    }

    #[test]
    fn repairs_lifted_quarantines_and_conditions_are_reasons() {
        let t = test(json!({"nodeLifecycle": {"testOnConditions": ["XidCriticalError"]}}));
        let repaired = node(
            "r",
            json!({"metadata": {"annotations": {"gpufabric.io/repaired": "INC-42"}}}),
        );
        assert_eq!(
            why_now(&t, &repaired, None).as_deref(),
            Some("marked repaired (gpufabric.io/repaired: INC-42)")
        );
        let mut h = measured("u", "2026-11-27T01:00:00Z");
        h.taken_back = Some(TakenBack {
            what: "uncordoned by someone else".into(),
            at: time("2026-11-27T02:00:00Z"),
            repair: true,
        });
        let plain = node("u", json!({}));
        assert!(why_now(&t, &plain, Some(&h)).is_some_and(|w| w.contains("uncordoned")));
        h.last_measured = Some(time("2026-11-27T03:00:00Z"));
        assert!(why_now(&t, &plain, Some(&h)).is_none(), "measured since");
        // A cordon taken over by someone else is not a repair.
        h.last_measured = None;
        if let Some(tb) = h.taken_back.as_mut() {
            tb.repair = false;
        }
        assert!(why_now(&t, &plain, Some(&h)).is_none());

        let xid = node(
            "x",
            json!({"status": {"conditions": [{"type": "XidCriticalError", "status": "True",
                "reason": "Xid79", "message": "GPU has fallen off the bus",
                "lastTransitionTime": "2026-11-27T04:00:00Z"}]}}),
        );
        assert_eq!(
            why_now(&t, &xid, Some(&measured("x", "2026-11-27T03:00:00Z"))).as_deref(),
            Some("condition XidCriticalError=True (Xid79: GPU has fallen off the bus)")
        );
        assert!(why_now(&t, &xid, Some(&measured("x", "2026-11-27T05:00:00Z"))).is_none());
        // A condition the test does not name, or one that is False, is nothing.
        let untested = test(json!({}));
        assert!(why_now(&untested, &xid, None).is_none());
        let fine = node(
            "f",
            json!({"status": {"conditions": [{"type": "XidCriticalError", "status": "False"}]}}),
        );
        assert!(why_now(&t, &fine, None).is_none());
    }

    #[test]
    fn a_target_not_measured_waits_longer_each_time() {
        let now = time("2026-11-27T02:00:00Z");
        let wanted = BTreeMap::from([("a".to_string(), "gated".to_string())]);
        let (mut targets, due) = schedule(&[], &wanted, &now);
        assert_eq!(due, ["a"]);
        attempted(&mut targets, &due, &now);
        assert_eq!(targets[0].attempts, 1);
        // Right after the run: not due (the node cache may still show the old node).
        let (targets, due) = schedule(&targets, &wanted, &now);
        assert!(due.is_empty());
        let later = after(&now, FIRST_BACKOFF_SECONDS);
        let (mut targets, due) = schedule(&targets, &wanted, &later);
        assert_eq!(due, ["a"]);
        attempted(&mut targets, &due, &later);
        assert_eq!(
            targets[0]
                .next_attempt
                .as_ref()
                .map(|t| t.0.as_second() - later.0.as_second()),
            Some(2 * FIRST_BACKOFF_SECONDS)
        );
        assert_eq!(backoff_seconds(30), MAX_BACKOFF_SECONDS);
        // No longer wanted: dropped.
        let (targets, due) = schedule(&targets, &BTreeMap::new(), &later);
        assert!(targets.is_empty() && due.is_empty());
    }
}
