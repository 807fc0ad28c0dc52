//! Pure status computations: per-run counts and durations, conditions, which finished runs
//! to fold into the test's history (once each), and which old runs the history limits delete.

use crate::time::to_chrono;
use chrono::{DateTime, Utc};
use gpufabric_api::findings::{Finding, Severity};
use gpufabric_api::run::{
    FabricTestRun, FabricTestRunStatus, NodeRunResult, NodeVerdict, RunPhase,
};
use gpufabric_api::test::{NodeHealth, RunSummary};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;
use std::collections::BTreeMap;

mod bound;
mod gpus;
mod infra;
mod standing;

pub use bound::{
    MAX_NODES_IN_RUN_STATUS, MAX_NODES_IN_TEST_STATUS, MAX_SKIPPED_IN_STATUS, bound_test_status,
    nodes_for_run_status,
};
pub use gpus::apply_gpu_outcome;
pub use infra::{
    CONDITION_INFRASTRUCTURE_DEGRADED, CONDITION_PHASES_NOT_RUN, INFRASTRUCTURE_MIN_NODES,
    INFRASTRUCTURE_SHARE, InfrastructureIssue, infrastructure_condition, infrastructure_issue,
    phases_not_run_condition,
};
pub use standing::{Settle, settle};

/// Most findings one run status keeps (critical ones first): a run over ten thousand
/// nodes can find more than fits in one object; `findingCount` counts them all.
pub const MAX_FINDINGS_IN_STATUS: usize = 100;

/// A duration as kubectl prints it: `45s`, `4m12s`, `2h3m4s`.
pub fn duration_string(seconds: i64) -> String {
    let s = seconds.max(0);
    let (h, m, s) = (s / 3600, (s % 3600) / 60, s % 60);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

/// Passed, failed, and errored (errored or timed out) nodes; not-measured nodes are
/// counted by [`set_counts`] apart from these.
pub fn counts(nodes: &[NodeRunResult]) -> (u32, u32, u32) {
    let mut c = (0, 0, 0);
    for n in nodes {
        match n.verdict {
            NodeVerdict::Passed => c.0 += 1,
            NodeVerdict::Failed => c.1 += 1,
            NodeVerdict::Errored | NodeVerdict::Timeout => c.2 += 1,
            NodeVerdict::NotMeasured | NodeVerdict::Pending | NodeVerdict::Running => {}
        }
    }
    c
}

/// Writes the passed, failed, errored and not-measured counts of a run over `nodes`.
pub fn set_counts(status: &mut FabricTestRunStatus, nodes: &[NodeRunResult]) {
    let (p, f, e) = counts(nodes);
    status.passed = p;
    status.failed = f;
    status.errored = e;
    status.not_measured = nodes
        .iter()
        .filter(|n| n.verdict == NodeVerdict::NotMeasured)
        .count() as u32;
}

/// The nodes of a run whose result says something about their hardware (measured, or a
/// hardware fault the agent saw): the only nodes the quarantine plan may judge.
pub fn measured_nodes(nodes: &[NodeRunResult]) -> std::collections::BTreeSet<&str> {
    nodes
        .iter()
        .filter(|n| n.verdict.is_measured())
        .map(|n| n.node.as_str())
        .collect()
}

/// A condition, keeping the previous transition time when its status did not change.
pub fn condition(
    previous: &[Condition],
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let status = if status { "True" } else { "False" };
    condition_of(previous, type_, status, reason, message, generation, now)
}

/// Puts a condition of `type_` on `conditions` in place of the one there (keeping its
/// transition time when its status did not change): every condition a run or test carries
/// is written through here or [`condition`], one of each type.
pub fn put_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: &Time,
) {
    let c = condition(conditions, type_, status, reason, message, generation, now);
    conditions.retain(|c| c.type_ != type_);
    conditions.push(c);
}

/// Adds `note` to a status message, once (`; ` between notes).
pub fn add_note(message: &mut Option<String>, note: &str) {
    match message {
        Some(m) if m.contains(note) => {}
        Some(m) => {
            m.push_str("; ");
            m.push_str(note);
        }
        None => *message = Some(note.to_string()),
    }
}

/// A condition whose status is `Unknown` (not yet known), keeping the previous transition
/// time when it was `Unknown` before.
pub fn condition_unknown(
    previous: &[Condition],
    type_: &str,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    condition_of(previous, type_, "Unknown", reason, message, generation, now)
}

fn condition_of(
    previous: &[Condition],
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| now.clone());
    Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message,
        observed_generation: generation,
        last_transition_time,
    }
}

/// Findings for the status: critical first, cut to [`MAX_FINDINGS_IN_STATUS`], each
/// message cut as in the shards. Returns the
/// kept findings and how many were left out.
pub fn findings_for_status(mut findings: Vec<Finding>) -> (Vec<Finding>, usize) {
    findings.sort_by(|a, b| {
        b.severity
            .cmp(&a.severity)
            .then_with(|| a.subject.cmp(&b.subject))
    });
    let dropped = findings.len().saturating_sub(MAX_FINDINGS_IN_STATUS);
    findings.truncate(MAX_FINDINGS_IN_STATUS);
    for f in &mut findings {
        gpufabric_api::shard::cut(&mut f.message, gpufabric_api::shard::MAX_REASON);
    }
    (findings, dropped)
}

/// When a run finished (completion time), for ordering.
fn finished_at(run: &FabricTestRun) -> Option<DateTime<Utc>> {
    run.status
        .as_ref()
        .filter(|s| s.phase.is_finished())
        .map(|s| {
            s.completion_time
                .as_ref()
                .map(to_chrono)
                .unwrap_or(DateTime::UNIX_EPOCH)
        })
}

/// The key that orders finished runs: completion time, then name.
fn fold_key(run: &FabricTestRun) -> Option<(DateTime<Utc>, String)> {
    finished_at(run).map(|t| (t, run.name_any()))
}

/// Finished runs not yet folded into the test's history, oldest first. A run is folded once
/// its summary is `lastRun`; every run that finished before that one was folded earlier.
pub fn runs_to_fold<'a>(
    runs: &'a [FabricTestRun],
    last: Option<&RunSummary>,
) -> Vec<&'a FabricTestRun> {
    let last_key = last.map(|l| {
        (
            l.completion_time
                .as_ref()
                .map(to_chrono)
                .unwrap_or(DateTime::UNIX_EPOCH),
            l.name.clone(),
        )
    });
    let mut out: Vec<(_, &FabricTestRun)> = runs
        .iter()
        .filter_map(|r| fold_key(r).map(|k| (k, r)))
        .filter(|(k, _)| last_key.as_ref().is_none_or(|l| k > l))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out.into_iter().map(|(_, r)| r).collect()
}

/// The summary of a finished run for the test's `lastRun`.
pub fn run_summary(run: &FabricTestRun) -> RunSummary {
    let status = run.status.clone().unwrap_or_default();
    RunSummary {
        name: run.name_any(),
        phase: status.phase,
        trigger: run.spec.trigger,
        passed: status.passed,
        failed: status.failed,
        errored: status.errored,
        not_measured: status.not_measured,
        findings: status
            .findings
            .iter()
            .filter(|f| f.severity == Severity::Critical)
            .count() as u32,
        completion_time: status.completion_time,
    }
}

/// The test's per-node history after one more finished run, whose nodes' results are
/// `nodes` (every node, from its shards). Nodes the run did not test keep their history as
/// it was.
pub fn fold_history(
    previous: &[NodeHealth],
    run: &FabricTestRun,
    nodes: &[NodeRunResult],
) -> Vec<NodeHealth> {
    let mut by_node: BTreeMap<String, NodeHealth> = previous
        .iter()
        .map(|h| (h.node.clone(), h.clone()))
        .collect();
    let listed = run
        .status
        .as_ref()
        .map(|s| s.findings.as_slice())
        .unwrap_or_default();
    let worst = gpufabric_health::evaluate::worst_per_node(listed);
    let run_name = run.name_any();
    // When the run measured its nodes: its end (its start would do as well; a node is
    // measured once per run).
    let measured_at = run
        .status
        .as_ref()
        .and_then(|s| s.completion_time.clone().or_else(|| s.start_time.clone()))
        .or_else(|| run.metadata.creation_timestamp.clone());
    for n in nodes {
        // A node not measured: its last finding says why.
        let finding = if n.verdict == NodeVerdict::NotMeasured {
            n.reason.clone()
        } else {
            n.finding
                .clone()
                .or_else(|| worst.get(n.node.as_str()).map(|f| f.message.clone()))
                .or_else(|| n.reason.clone())
        };
        let mut next = gpufabric_health::history::advance(
            by_node.get(&n.node),
            &n.node,
            n.verdict,
            finding,
            &run_name,
        );
        // Only a complete measurement counts: a target (a gate, a repair, a condition)
        // whose node a phase could not run on is tried again.
        if n.complete() {
            next.last_measured = measured_at.clone();
        }
        // Any verdict counts for the storm rule's window, a partial measurement too.
        if n.verdict.is_measured() {
            next.last_judged = measured_at.clone();
        }
        by_node.insert(n.node.clone(), next);
    }
    by_node.into_values().collect()
}

/// Names of finished runs beyond the history limits, oldest first: successful runs beyond
/// `successful`, failed runs beyond `failed`. Only runs already folded may be passed in.
pub fn runs_to_delete(runs: &[&FabricTestRun], successful: u32, failed: u32) -> Vec<String> {
    let mut ok: Vec<_> = Vec::new();
    let mut bad: Vec<_> = Vec::new();
    for r in runs {
        let Some(key) = fold_key(r) else { continue };
        match r.status.as_ref().map(|s| s.phase) {
            Some(RunPhase::Succeeded) => ok.push(key),
            Some(RunPhase::Failed) => bad.push(key),
            _ => {}
        }
    }
    ok.sort();
    bad.sort();
    let excess = |v: Vec<(DateTime<Utc>, String)>, keep: u32| {
        let n = v.len().saturating_sub(keep as usize);
        v.into_iter()
            .take(n)
            .map(|(_, name)| name)
            .collect::<Vec<_>>()
    };
    let mut out = excess(ok, successful);
    out.extend(excess(bad, failed));
    out
}

/// Nodes whose latest verdict is bad, for the Degraded condition.
pub fn failing_nodes(history: &[NodeHealth]) -> Vec<&str> {
    history
        .iter()
        .filter(|h| h.verdict.is_bad())
        .map(|h| h.node.as_str())
        .collect()
}

/// A short list of names for a message: the first few and how many more.
pub fn name_list(names: &[&str], max: usize) -> String {
    let shown = names
        .iter()
        .take(max)
        .copied()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > max {
        format!("{shown} and {} more", names.len() - max)
    } else {
        shown
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::to_time;
    use chrono::TimeZone;
    use gpufabric_api::findings::{FindingKind, Metric, Subject};
    use gpufabric_api::outcome::NotMeasuredReason;
    use gpufabric_api::run::{FabricTestRunSpec, FabricTestRunStatus, Trigger};
    use gpufabric_api::test::FabricTestSpec;

    fn at(min: u32) -> Time {
        to_time(
            Utc.with_ymd_and_hms(2026, 1, 1, 0, min, 0)
                .single()
                .expect("valid"),
        )
    }

    fn run(
        name: &str,
        phase: RunPhase,
        done: Option<u32>,
        nodes: &[(&str, NodeVerdict)],
    ) -> FabricTestRun {
        let mut r = FabricTestRun::new(
            name,
            FabricTestRunSpec::of_test(
                "t",
                &FabricTestSpec::default(),
                Trigger::Schedule,
                None,
                None,
            ),
        );
        let nodes: Vec<NodeRunResult> = nodes
            .iter()
            .map(|(n, v)| NodeRunResult {
                node: n.to_string(),
                verdict: *v,
                ..Default::default()
            })
            .collect();
        let (passed, failed, errored) = counts(&nodes);
        r.status = Some(FabricTestRunStatus {
            phase,
            completion_time: done.map(at),
            nodes,
            passed,
            failed,
            errored,
            ..Default::default()
        });
        r
    }

    fn fold(previous: &[NodeHealth], r: &FabricTestRun) -> Vec<NodeHealth> {
        let nodes = r
            .status
            .as_ref()
            .map(|s| s.nodes.clone())
            .unwrap_or_default();
        fold_history(previous, r, &nodes)
    }

    #[test]
    fn durations_read_like_kubectl() {
        assert_eq!(duration_string(45), "45s");
        assert_eq!(duration_string(252), "4m12s");
        assert_eq!(duration_string(7384), "2h3m4s");
        assert_eq!(duration_string(-3), "0s");
    }

    #[test]
    fn counts_put_timeouts_with_errors() {
        let r = run(
            "r",
            RunPhase::Succeeded,
            Some(1),
            &[
                ("a", NodeVerdict::Passed),
                ("b", NodeVerdict::Failed),
                ("c", NodeVerdict::Timeout),
                ("d", NodeVerdict::Errored),
                ("e", NodeVerdict::Running),
            ],
        );
        assert_eq!(counts(&r.status.expect("status").nodes), (1, 1, 2));
    }

    #[test]
    fn condition_keeps_its_transition_time_while_unchanged() {
        let first = condition(&[], "Ready", true, "Valid", "ok".into(), Some(1), &at(1));
        let same = condition(
            std::slice::from_ref(&first),
            "Ready",
            true,
            "Valid",
            "ok".into(),
            Some(2),
            &at(5),
        );
        assert_eq!(same.last_transition_time, at(1));
        assert_eq!(same.observed_generation, Some(2));
        let flipped = condition(
            &[same],
            "Ready",
            false,
            "InvalidSpec",
            "bad".into(),
            Some(3),
            &at(9),
        );
        assert_eq!(flipped.last_transition_time, at(9));
        assert_eq!(flipped.status, "False");
    }

    #[test]
    fn a_put_condition_replaces_the_one_of_its_type_and_leaves_the_others() {
        let mut conditions = vec![
            condition(&[], "Ready", true, "Valid", "ok".into(), Some(1), &at(1)),
            condition(&[], "Degraded", false, "Fine", "ok".into(), Some(1), &at(1)),
        ];
        put_condition(
            &mut conditions,
            "Ready",
            true,
            "Valid",
            "still".into(),
            Some(2),
            &at(4),
        );
        put_condition(
            &mut conditions,
            "Degraded",
            true,
            "Slow",
            "slow".into(),
            Some(2),
            &at(4),
        );
        assert_eq!(conditions.len(), 2, "one condition of each type");
        let ready = conditions
            .iter()
            .find(|c| c.type_ == "Ready")
            .expect("ready");
        assert_eq!(
            (ready.message.as_str(), &ready.last_transition_time),
            ("still", &at(1))
        );
        let degraded = conditions
            .iter()
            .find(|c| c.type_ == "Degraded")
            .expect("degraded");
        assert_eq!(
            (degraded.status.as_str(), &degraded.last_transition_time),
            ("True", &at(4))
        );
    }

    #[test]
    fn a_note_joins_a_message_once() {
        let mut message = None;
        add_note(&mut message, "a slow block");
        add_note(&mut message, "a knee at 8 nodes");
        add_note(&mut message, "a slow block");
        assert_eq!(message.as_deref(), Some("a slow block; a knee at 8 nodes"));
    }

    #[test]
    fn each_finished_run_is_folded_once_in_completion_order() {
        let runs = vec![
            run("t-3", RunPhase::Succeeded, Some(30), &[]),
            run("t-1", RunPhase::Succeeded, Some(10), &[]),
            run("t-4", RunPhase::Running, None, &[]),
            run("t-2", RunPhase::Failed, Some(20), &[]),
        ];
        let names = |v: Vec<&FabricTestRun>| v.iter().map(|r| r.name_any()).collect::<Vec<_>>();
        assert_eq!(names(runs_to_fold(&runs, None)), ["t-1", "t-2", "t-3"]);
        let last = run_summary(&runs[1]);
        assert_eq!(names(runs_to_fold(&runs, Some(&last))), ["t-2", "t-3"]);
        let last = run_summary(&runs[0]);
        assert!(runs_to_fold(&runs, Some(&last)).is_empty());
    }

    #[test]
    fn history_counts_consecutive_failures_per_node() {
        let r1 = run(
            "t-1",
            RunPhase::Succeeded,
            Some(1),
            &[("a", NodeVerdict::Failed), ("b", NodeVerdict::Passed)],
        );
        let r2 = run(
            "t-2",
            RunPhase::Succeeded,
            Some(2),
            &[("a", NodeVerdict::Timeout)],
        );
        let h = fold(&fold(&[], &r1), &r2);
        let a = h.iter().find(|n| n.node == "a").expect("a");
        let b = h.iter().find(|n| n.node == "b").expect("b");
        assert_eq!(a.consecutive_failures, 2);
        assert_eq!(a.last_run.as_deref(), Some("t-2"));
        assert_eq!(b.consecutive_passes, 1);
        assert_eq!(b.last_run.as_deref(), Some("t-1"), "b was not in t-2");
        assert_eq!(failing_nodes(&h), ["a"]);
    }

    #[test]
    fn history_records_the_worst_finding_of_a_node() {
        let mut r = run(
            "t-1",
            RunPhase::Succeeded,
            Some(1),
            &[("a", NodeVerdict::Failed)],
        );
        let finding = |sev, msg: &str| {
            Finding::new(
                FindingKind::Slow,
                Subject::node("a"),
                Metric::NcclBusBw,
                sev,
                msg.into(),
            )
        };
        if let Some(s) = r.status.as_mut() {
            s.findings = vec![
                finding(Severity::Info, "meh"),
                finding(Severity::Critical, "slow all_reduce"),
            ];
        }
        let h = fold(&[], &r);
        assert_eq!(h[0].last_finding.as_deref(), Some("slow all_reduce"));
    }

    #[test]
    fn history_limits_delete_the_oldest_runs_of_each_kind() {
        let runs = [
            run("t-1", RunPhase::Succeeded, Some(1), &[]),
            run("t-2", RunPhase::Failed, Some(2), &[]),
            run("t-3", RunPhase::Succeeded, Some(3), &[]),
            run("t-4", RunPhase::Failed, Some(4), &[]),
            run("t-5", RunPhase::Succeeded, Some(5), &[]),
            run("t-6", RunPhase::Running, None, &[]),
        ];
        let refs: Vec<&FabricTestRun> = runs.iter().collect();
        assert_eq!(runs_to_delete(&refs, 2, 1), ["t-1", "t-2"]);
        assert_eq!(
            runs_to_delete(&refs, 0, 0),
            ["t-1", "t-3", "t-5", "t-2", "t-4"]
        );
        assert!(runs_to_delete(&refs, 3, 2).is_empty());
    }

    #[test]
    fn findings_in_status_are_capped_critical_first() {
        let f = |i: usize, sev| {
            Finding::new(
                FindingKind::Slow,
                Subject::node(format!("n{i:04}")),
                Metric::NcclBusBw,
                sev,
                String::new(),
            )
        };
        let mut all: Vec<Finding> = (0..600).map(|i| f(i, Severity::Info)).collect();
        all.push(f(9999, Severity::Critical));
        let (kept, dropped) = findings_for_status(all);
        assert_eq!(kept.len(), MAX_FINDINGS_IN_STATUS);
        assert_eq!(dropped, 501);
        assert_eq!(kept[0].severity, Severity::Critical);
    }

    /// A node the run did not measure, for `reason`, with `detail` as its reason.
    pub(super) fn not_measured(
        node: &str,
        reason: NotMeasuredReason,
        detail: &str,
    ) -> NodeRunResult {
        NodeRunResult {
            node: node.into(),
            verdict: NodeVerdict::NotMeasured,
            not_measured: Some(reason),
            reason: Some(detail.into()),
            ..Default::default()
        }
    }

    #[test]
    fn unmeasured_nodes_are_neither_judged_nor_counted_as_errors() {
        let mut r = run(
            "t-1",
            RunPhase::Succeeded,
            Some(1),
            &[("a", NodeVerdict::Failed), ("b", NodeVerdict::Timeout)],
        );
        if let Some(s) = r.status.as_mut() {
            s.nodes.push(not_measured(
                "c",
                NotMeasuredReason::ContainerConfig,
                "CreateContainerConfigError: secret \"x\" not found",
            ));
            let nodes = s.nodes.clone();
            set_counts(s, &nodes);
            assert_eq!(
                (s.passed, s.failed, s.errored, s.not_measured),
                (0, 1, 1, 1)
            );
            assert_eq!(
                measured_nodes(&s.nodes).into_iter().collect::<Vec<_>>(),
                ["a", "b"]
            );
        }
        let h = fold(&[], &r);
        let c = h.iter().find(|n| n.node == "c").expect("c");
        assert_eq!(
            (c.consecutive_failures, c.verdict),
            (0, NodeVerdict::NotMeasured)
        );
        assert!(
            c.last_finding
                .as_deref()
                .is_some_and(|m| m.contains("secret"))
        );
        assert_eq!(failing_nodes(&h), ["a", "b"]);
        let nodes = r
            .status
            .as_ref()
            .map(|s| s.nodes.clone())
            .unwrap_or_default();
        let cond = infrastructure_condition(&[], Some(("t-1", &nodes)), Some(1), &at(2))
            .expect("condition");
        assert_eq!(
            (cond.status.as_str(), cond.reason.as_str()),
            ("False", "NodesMeasured")
        );
        let kept = infrastructure_condition(std::slice::from_ref(&cond), None, Some(1), &at(3));
        assert_eq!(kept, Some(cond));
    }

    #[test]
    fn name_lists_are_short() {
        assert_eq!(name_list(&["a", "b", "c"], 2), "a, b and 1 more");
        assert_eq!(name_list(&["a"], 2), "a");
    }
}
