//! Pure decisions about the signals on one node after a run is judged: its judgement
//! (pass, suspect, fail, hardware fault, not measured), the `GPUFabricDegraded` condition,
//! the `gpufabric.io/result` label and the `gpufabric.io/last-pass` annotation, and the
//! patches that write them (and that replace the `GPUFabricHealthy` condition of 0.2.0).
//! No client here; `super::apply` sends the patches.

use gpufabric_api::keys::{
    ANNOTATION_LAST_PASS, CONDITION_NODE_DEGRADED, CONDITION_NODE_HEALTHY_LEGACY, LABEL_RESULT,
};
use gpufabric_api::run::{NodeRunResult, NodeVerdict};
use gpufabric_api::test::NodeHealth;
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Map, Value, json};

/// Longest condition message written; the rest is cut with an ellipsis.
pub const MAX_MESSAGE: usize = 1024;

/// What one finished run says about one node, for the signals other tools read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Judgement {
    /// Measured and passed.
    Pass,
    /// Failed (findings, or a hardware fault) but not yet confirmed: fewer consecutive
    /// failures than `failuresToQuarantine`, or a confirmation run retests it first.
    Suspect,
    /// Failed its checks, and the failure is confirmed.
    Fail,
    /// A hardware fault the agent saw (a GPU missing, a link down, a hang), confirmed.
    HardwareFault,
    /// Not measured, for a reason outside the node (busy GPUs, image pull, ...): never
    /// held against the node.
    NotMeasured,
}

impl Judgement {
    /// The judgement of a node from its entry in a finished run, its history after that run
    /// (None: no history), whether a confirmation run retests it, and the test's
    /// `failuresToQuarantine`. None for a node without a final verdict.
    pub fn of(
        entry: &NodeRunResult,
        health: Option<&NodeHealth>,
        awaiting_confirmation: bool,
        failures_to_quarantine: u32,
    ) -> Option<Judgement> {
        match entry.verdict {
            NodeVerdict::Pending | NodeVerdict::Running => None,
            NodeVerdict::Passed => Some(Judgement::Pass),
            NodeVerdict::NotMeasured => Some(Judgement::NotMeasured),
            NodeVerdict::Failed | NodeVerdict::Errored | NodeVerdict::Timeout => {
                let confirmed = !awaiting_confirmation
                    && health.is_some_and(|h| {
                        h.quarantined || h.consecutive_failures >= failures_to_quarantine.max(1)
                    });
                let hardware = entry.hardware_fault.is_some()
                    || matches!(entry.verdict, NodeVerdict::Errored | NodeVerdict::Timeout);
                Some(match (confirmed, hardware) {
                    (false, _) => Judgement::Suspect,
                    (true, true) => Judgement::HardwareFault,
                    (true, false) => Judgement::Fail,
                })
            }
        }
    }

    /// The value of the `gpufabric.io/result` label; None: the label is left as it is.
    pub fn label(self) -> Option<&'static str> {
        match self {
            Judgement::Pass => Some("pass"),
            Judgement::Suspect => Some("suspect"),
            Judgement::Fail | Judgement::HardwareFault => Some("fail"),
            Judgement::NotMeasured => None,
        }
    }

    /// Status and reason of the `GPUFabricDegraded` condition: `True` is a problem, as
    /// node-problem-detector's conditions are, so that draino and NodeHealthCheck act on
    /// `True`. A suspect is `Unknown`, not `True`: remediation acts on confirmed failures
    /// only, as quarantine does.
    pub fn condition_status(self) -> (&'static str, &'static str) {
        match self {
            Judgement::Pass => ("False", "Passed"),
            Judgement::Suspect => ("Unknown", "Suspect"),
            Judgement::Fail => ("True", "Failed"),
            Judgement::HardwareFault => ("True", "HardwareFault"),
            Judgement::NotMeasured => ("Unknown", "NotMeasured"),
        }
    }
}

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
/// ...`, as [`message`] writes it); None for a condition gpufabric did not write.
pub fn writer(c: &NodeCondition) -> Option<&str> {
    let (test, _) = c
        .message
        .as_deref()?
        .strip_prefix("FabricTest ")?
        .split_once(", run ")?;
    (!test.is_empty()).then_some(test)
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

/// The condition to write for `judgement`, or None to leave the node's condition alone: a
/// node not measured keeps the condition an earlier run gave it (the infrastructure is not
/// the node's fault, and flipping it would trigger remediation); only a node without one
/// gets `Unknown`/`NotMeasured`. The transition time is kept while the status is unchanged.
pub fn condition(
    judgement: Judgement,
    message: &str,
    current: Option<&NodeCondition>,
    now: &Time,
) -> Option<NodeCondition> {
    if judgement == Judgement::NotMeasured && current.is_some() {
        return None;
    }
    let (status, reason) = judgement.condition_status();
    let last_transition_time = current
        .filter(|c| c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    Some(NodeCondition {
        type_: CONDITION_NODE_DEGRADED.to_string(),
        status: status.to_string(),
        reason: Some(reason.to_string()),
        message: Some(cut(message, MAX_MESSAGE)),
        last_heartbeat_time: Some(now.clone()),
        last_transition_time: Some(last_transition_time),
    })
}

/// The condition's message: which run of which test, and the worst finding (or why the
/// node was not measured).
pub fn message(test: &str, run: &str, judgement: Judgement, detail: Option<&str>) -> String {
    let what = match judgement {
        Judgement::Pass => "passed".to_string(),
        Judgement::Suspect => format!(
            "failed, not yet confirmed: {}",
            detail.unwrap_or("no finding recorded")
        ),
        Judgement::Fail | Judgement::HardwareFault => {
            detail.unwrap_or("failed, no finding recorded").to_string()
        }
        Judgement::NotMeasured => {
            format!("not measured: {}", detail.unwrap_or("no reason recorded"))
        }
    };
    format!("FabricTest {test}, run {run}: {what}")
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

/// The merge patch of the node's metadata that sets the result label and, on a pass, the
/// last-pass annotation; None when the node already carries both values. Only gpufabric's
/// own keys are in the patch.
pub fn metadata_patch(
    node: Option<&Node>,
    judgement: Judgement,
    passed_at: &Time,
) -> Option<Value> {
    let labels = node.and_then(|n| n.metadata.labels.as_ref());
    let annotations = node.and_then(|n| n.metadata.annotations.as_ref());
    let mut meta = Map::new();
    if let Some(value) = judgement.label()
        && labels.and_then(|l| l.get(LABEL_RESULT)).map(String::as_str) != Some(value)
    {
        meta.insert("labels".into(), json!({ LABEL_RESULT: value }));
    }
    if judgement == Judgement::Pass {
        let stamp = rfc3339(passed_at);
        if annotations.and_then(|a| a.get(ANNOTATION_LAST_PASS)) != Some(&stamp) {
            meta.insert("annotations".into(), json!({ ANNOTATION_LAST_PASS: stamp }));
        }
    }
    (!meta.is_empty()).then(|| json!({ "metadata": meta }))
}

/// A timestamp as RFC 3339 in UTC with whole seconds, e.g. `2026-11-23T17:44:17Z`.
pub fn rfc3339(t: &Time) -> String {
    crate::time::to_chrono(t).to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max.saturating_sub(3);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::to_time;
    use chrono::TimeZone;
    use gpufabric_api::outcome::HardwareFault;

    fn at(min: u32) -> Time {
        to_time(
            chrono::Utc
                .with_ymd_and_hms(2026, 1, 1, 0, min, 0)
                .single()
                .expect("valid"),
        )
    }

    fn entry(verdict: NodeVerdict) -> NodeRunResult {
        NodeRunResult {
            node: "n".into(),
            verdict,
            ..Default::default()
        }
    }

    fn health(failures: u32, quarantined: bool) -> NodeHealth {
        NodeHealth {
            node: "n".into(),
            verdict: NodeVerdict::Failed,
            consecutive_failures: failures,
            consecutive_passes: 0,
            quarantined,
            quarantined_since: None,
            held_back: None,
            last_finding: None,
            last_run: None,
            ..Default::default()
        }
    }

    #[test]
    fn a_first_failure_is_suspect_until_confirmed() {
        let failed = entry(NodeVerdict::Failed);
        let h1 = health(1, false);
        assert_eq!(
            Judgement::of(&failed, Some(&h1), true, 1),
            Some(Judgement::Suspect),
            "a confirmation run retests it"
        );
        assert_eq!(
            Judgement::of(&failed, Some(&h1), false, 2),
            Some(Judgement::Suspect),
            "one failure of two needed"
        );
        assert_eq!(
            Judgement::of(&failed, Some(&h1), false, 1),
            Some(Judgement::Fail)
        );
        assert_eq!(
            Judgement::of(&failed, Some(&health(1, true)), false, 3),
            Some(Judgement::Fail),
            "quarantined already"
        );
        assert_eq!(
            Judgement::of(&failed, None, false, 1),
            Some(Judgement::Suspect)
        );
    }

    #[test]
    fn hardware_faults_and_hangs_are_their_own_reason() {
        let mut e = entry(NodeVerdict::Errored);
        e.hardware_fault = Some(HardwareFault::Crash);
        let h = health(2, false);
        assert_eq!(
            Judgement::of(&e, Some(&h), false, 2),
            Some(Judgement::HardwareFault)
        );
        let t = entry(NodeVerdict::Timeout);
        assert_eq!(
            Judgement::of(&t, Some(&h), false, 2),
            Some(Judgement::HardwareFault)
        );
        assert_eq!(
            Judgement::HardwareFault.condition_status(),
            ("True", "HardwareFault")
        );
    }

    #[test]
    fn unfinished_nodes_get_no_judgement() {
        assert_eq!(
            Judgement::of(&entry(NodeVerdict::Running), None, false, 1),
            None
        );
        assert_eq!(
            Judgement::of(&entry(NodeVerdict::Pending), None, false, 1),
            None
        );
    }

    #[test]
    fn labels_say_pass_suspect_or_fail_and_leave_unmeasured_nodes_alone() {
        assert_eq!(Judgement::Pass.label(), Some("pass"));
        assert_eq!(Judgement::Suspect.label(), Some("suspect"));
        assert_eq!(Judgement::Fail.label(), Some("fail"));
        assert_eq!(Judgement::HardwareFault.label(), Some("fail"));
        assert_eq!(Judgement::NotMeasured.label(), None);
    }

    #[test]
    fn the_transition_time_is_kept_while_the_status_is_unchanged() {
        let first = condition(Judgement::Pass, "ok", None, &at(1)).expect("condition");
        assert_eq!(first.last_transition_time, Some(at(1)));
        let again = condition(Judgement::Pass, "ok 2", Some(&first), &at(5)).expect("condition");
        assert_eq!(again.last_transition_time, Some(at(1)));
        assert_eq!(again.last_heartbeat_time, Some(at(5)));
        let failed = condition(Judgement::Fail, "bad", Some(&again), &at(9)).expect("condition");
        assert_eq!(failed.last_transition_time, Some(at(9)));
        assert_eq!(
            (failed.status.as_str(), failed.reason.as_deref()),
            ("True", Some("Failed"))
        );
    }

    #[test]
    fn the_condition_is_true_for_a_problem_as_node_problem_detectors_are() {
        assert_eq!(Judgement::Pass.condition_status(), ("False", "Passed"));
        assert_eq!(Judgement::Fail.condition_status(), ("True", "Failed"));
        assert_eq!(
            Judgement::Suspect.condition_status(),
            ("Unknown", "Suspect")
        );
        assert_eq!(
            Judgement::NotMeasured.condition_status(),
            ("Unknown", "NotMeasured")
        );
        let c = condition(Judgement::Fail, "bad", None, &at(1)).expect("condition");
        assert_eq!(c.type_, "GPUFabricDegraded");
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
        assert_eq!(
            from_legacy(&legacy("Unknown", "m"), &at(9)).status,
            "Unknown"
        );
    }

    #[test]
    fn a_node_not_measured_keeps_its_condition_and_gets_unknown_only_without_one() {
        let failed = condition(Judgement::Fail, "bad", None, &at(1)).expect("condition");
        assert_eq!(
            condition(Judgement::NotMeasured, "busy", Some(&failed), &at(2)),
            None
        );
        let fresh = condition(Judgement::NotMeasured, "busy", None, &at(2)).expect("condition");
        assert_eq!(
            (fresh.status.as_str(), fresh.reason.as_deref()),
            ("Unknown", Some("NotMeasured"))
        );
    }

    #[test]
    fn messages_name_the_test_the_run_and_the_finding_and_are_bounded() {
        let m = message("ns/t", "t-1", Judgement::Fail, Some("GPU 3 slow"));
        assert_eq!(m, "FabricTest ns/t, run t-1: GPU 3 slow");
        let long = "é".repeat(2000);
        let c = condition(Judgement::Fail, &long, None, &at(1)).expect("condition");
        let text = c.message.unwrap_or_default();
        assert!(
            text.len() <= MAX_MESSAGE && text.ends_with("..."),
            "{}",
            text.len()
        );
    }

    #[test]
    fn the_status_patch_merges_one_condition_by_type_and_may_delete_the_legacy_one() {
        let c = condition(Judgement::Pass, "ok", None, &at(1)).expect("condition");
        let p = status_patch(Some(&c), false).expect("a patch");
        assert_eq!(
            p["status"]["conditions"][0]["type"],
            CONDITION_NODE_DEGRADED
        );
        assert_eq!(p["status"]["conditions"][0]["status"], "False");
        assert_eq!(p["status"]["conditions"].as_array().map(Vec::len), Some(1));
        let p = status_patch(Some(&c), true).expect("a patch");
        assert_eq!(
            p["status"]["conditions"][1],
            json!({"type": CONDITION_NODE_HEALTHY_LEGACY, "$patch": "delete"})
        );
        let p = status_patch(None, true).expect("a patch");
        assert_eq!(p["status"]["conditions"].as_array().map(Vec::len), Some(1));
        assert_eq!(status_patch(None, false), None);
    }

    #[test]
    fn the_metadata_patch_touches_only_gpufabric_keys_and_only_when_they_change() {
        let p = metadata_patch(None, Judgement::Pass, &at(7)).expect("patch");
        assert_eq!(p["metadata"]["labels"][LABEL_RESULT], "pass");
        assert_eq!(
            p["metadata"]["annotations"][ANNOTATION_LAST_PASS],
            "2026-01-01T00:07:00Z"
        );
        assert_eq!(
            p["metadata"]["labels"].as_object().map(|o| o.len()),
            Some(1)
        );
        let mut node = Node::default();
        node.metadata.labels = Some([(LABEL_RESULT.to_string(), "pass".to_string())].into());
        node.metadata.annotations = Some(
            [(
                ANNOTATION_LAST_PASS.to_string(),
                "2026-01-01T00:07:00Z".to_string(),
            )]
            .into(),
        );
        assert_eq!(metadata_patch(Some(&node), Judgement::Pass, &at(7)), None);
        let fail = metadata_patch(Some(&node), Judgement::Fail, &at(8)).expect("patch");
        assert_eq!(fail["metadata"]["labels"][LABEL_RESULT], "fail");
        assert!(
            fail["metadata"].get("annotations").is_none(),
            "last-pass stays"
        );
        assert_eq!(
            metadata_patch(Some(&node), Judgement::NotMeasured, &at(9)),
            None
        );
    }
}
