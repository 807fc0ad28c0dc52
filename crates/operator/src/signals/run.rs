//! The `Complete` and `Failed` conditions of a finished FabricTestRun, as a Job has them,
//! so that `kubectl wait --for=condition=Complete ftr/NAME` (or `condition=Failed`) returns
//! once the run has ended and its nodes are judged; and what follows the verdict
//! (`ResultsKept`, `CountersRecorded`), False until done.

use crate::status as st;
use gpufabric_api::run::{FabricTestRunStatus, RunPhase};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Condition type: the run finished and every node was judged (phase Succeeded).
pub const CONDITION_COMPLETE: &str = "Complete";
/// Condition type: the run ended without testing every node (phase Failed: no usable
/// node, or pods stopped at the run deadline). Its nodes are judged all the same.
pub const CONDITION_FAILED: &str = "Failed";

/// Sets `Complete` and `Failed` on a run status whose phase is final: one is True, the
/// other False, both with the run's message. Does nothing while the run is not finished.
pub fn set_finished_conditions(
    status: &mut FabricTestRunStatus,
    generation: Option<i64>,
    now: &Time,
) {
    let succeeded = match status.phase {
        RunPhase::Succeeded => true,
        RunPhase::Failed => false,
        _ => return,
    };
    let message = status.message.clone().unwrap_or_else(|| {
        format!(
            "{} nodes: {} passed, {} failed, {} errored or timed out, {} not measured",
            status.nodes.len(),
            status.passed,
            status.failed,
            status.errored,
            status.not_measured
        )
    });
    let (reason_complete, reason_failed) = if succeeded {
        ("RunSucceeded", "RunSucceeded")
    } else {
        ("RunFailed", "RunFailed")
    };
    let complete = st::condition(
        &status.conditions,
        CONDITION_COMPLETE,
        succeeded,
        reason_complete,
        message.clone(),
        generation,
        now,
    );
    let failed = st::condition(
        &status.conditions,
        CONDITION_FAILED,
        !succeeded,
        reason_failed,
        message,
        generation,
        now,
    );
    status
        .conditions
        .retain(|c| c.type_ != CONDITION_COMPLETE && c.type_ != CONDITION_FAILED);
    status.conditions.push(complete);
    status.conditions.push(failed);
}

/// Condition type: the full result documents of the run's measured nodes are kept
/// (ConfigMaps, see docs/signals.md). False from the verdict until they are: the verdict is
/// written first, so it never waits for hundreds of log reads.
pub const CONDITION_RESULTS_KEPT: &str = "ResultsKept";

/// Sets `ResultsKept`: False while `pending` (with how many are left), True once the run's
/// results were kept (`note`: the ones that could not be, if any).
pub fn set_results_kept(
    status: &mut FabricTestRunStatus,
    pending: Option<usize>,
    note: Option<&str>,
    generation: Option<i64>,
    now: &Time,
) {
    let (kept, reason, message) = match (pending, note) {
        (Some(n), _) => (
            false,
            "Keeping",
            format!("keeping the full results of {n} nodes"),
        ),
        (None, Some(note)) => (true, "PartlyKept", note.to_string()),
        (None, None) => (
            true,
            "Kept",
            "every measured node's full result is kept".into(),
        ),
    };
    st::put_condition(
        &mut status.conditions,
        CONDITION_RESULTS_KEPT,
        kept,
        reason,
        message,
        generation,
        now,
    );
}

/// Whether a finished run's full results are still to be kept.
pub fn results_pending(status: &FabricTestRunStatus) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == CONDITION_RESULTS_KEPT && c.status == "False")
}

/// Condition type: every measured node's error counters of this run are recorded on its
/// node (`gpufabric.io/counters`, see docs/signals.md). False from the verdict until they
/// are: they are written once the test has folded the run, so that its status and its
/// quarantine never queue behind a write a node at the API server. An operator that finds
/// it False (a restart in between) records them again from the run's pods.
pub const CONDITION_COUNTERS_RECORDED: &str = "CountersRecorded";

/// Sets `CountersRecorded`: False while `pending` (with how many nodes are left), True
/// once they were written (`note`: the nodes that could not be, if any).
pub fn set_counters_recorded(
    status: &mut FabricTestRunStatus,
    pending: Option<usize>,
    note: Option<&str>,
    generation: Option<i64>,
    now: &Time,
) {
    let (recorded, reason, message) = match (pending, note) {
        (Some(n), _) => (
            false,
            "AfterFold",
            format!("recording the error counters of {n} nodes once the test has folded the run"),
        ),
        (None, Some(note)) => (true, "PartlyRecorded", note.to_string()),
        (None, None) => (
            true,
            "Recorded",
            "every measured node's error counters are recorded".into(),
        ),
    };
    st::put_condition(
        &mut status.conditions,
        CONDITION_COUNTERS_RECORDED,
        recorded,
        reason,
        message,
        generation,
        now,
    );
}

/// Whether a finished run's error counters are still to be recorded.
pub fn counters_pending(status: &FabricTestRunStatus) -> bool {
    status
        .conditions
        .iter()
        .any(|c| c.type_ == CONDITION_COUNTERS_RECORDED && c.status == "False")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::now;

    fn status_of(
        conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
        t: &str,
    ) -> String {
        conditions
            .iter()
            .find(|c| c.type_ == t)
            .map(|c| c.status.clone())
            .unwrap_or_default()
    }

    #[test]
    fn a_succeeded_run_is_complete_and_not_failed() {
        let mut s = FabricTestRunStatus {
            phase: RunPhase::Succeeded,
            passed: 3,
            ..Default::default()
        };
        set_finished_conditions(&mut s, Some(1), &now());
        assert_eq!(status_of(&s.conditions, CONDITION_COMPLETE), "True");
        assert_eq!(status_of(&s.conditions, CONDITION_FAILED), "False");
        assert!(s.conditions.iter().all(|c| c.message.contains("3 passed")));
    }

    #[test]
    fn a_failed_run_is_failed_and_not_complete_with_its_message() {
        let mut s = FabricTestRunStatus {
            phase: RunPhase::Failed,
            message: Some("no node can be tested".into()),
            ..Default::default()
        };
        set_finished_conditions(&mut s, Some(1), &now());
        assert_eq!(status_of(&s.conditions, CONDITION_COMPLETE), "False");
        assert_eq!(status_of(&s.conditions, CONDITION_FAILED), "True");
        let failed = s.conditions.iter().find(|c| c.type_ == CONDITION_FAILED);
        assert_eq!(
            failed.map(|c| (c.reason.as_str(), c.message.as_str())),
            Some(("RunFailed", "no node can be tested"))
        );
        // Set twice: one condition of each type.
        set_finished_conditions(&mut s, Some(1), &now());
        assert_eq!(s.conditions.len(), 2);
    }

    #[test]
    fn a_running_run_has_neither_condition() {
        let mut s = FabricTestRunStatus {
            phase: RunPhase::Running,
            ..Default::default()
        };
        set_finished_conditions(&mut s, Some(1), &now());
        assert!(s.conditions.is_empty());
    }

    #[test]
    fn results_kept_is_false_while_pending_and_true_after() {
        let mut s = FabricTestRunStatus::default();
        assert!(!results_pending(&s), "no condition: nothing pending");
        set_results_kept(&mut s, Some(12), None, Some(1), &now());
        assert!(results_pending(&s));
        assert!(s.conditions.iter().any(|c| c.message.contains("12 nodes")));
        set_results_kept(
            &mut s,
            None,
            Some("full results not kept for 1 node(s): a"),
            Some(1),
            &now(),
        );
        assert!(!results_pending(&s));
        let c: Vec<_> = s
            .conditions
            .iter()
            .filter(|c| c.type_ == CONDITION_RESULTS_KEPT)
            .collect();
        assert_eq!(c.len(), 1);
        assert_eq!(
            (c[0].status.as_str(), c[0].reason.as_str()),
            ("True", "PartlyKept")
        );
    }

    #[test]
    fn counters_recorded_is_false_until_written_and_true_after() {
        let mut s = FabricTestRunStatus::default();
        assert!(!counters_pending(&s), "no condition: nothing pending");
        set_counters_recorded(&mut s, Some(2000), None, Some(1), &now());
        assert!(counters_pending(&s));
        assert!(
            s.conditions
                .iter()
                .any(|c| c.message.contains("2000 nodes"))
        );
        set_counters_recorded(&mut s, None, None, Some(1), &now());
        assert!(!counters_pending(&s));
        let c: Vec<_> = s
            .conditions
            .iter()
            .filter(|c| c.type_ == CONDITION_COUNTERS_RECORDED)
            .collect();
        assert_eq!(c.len(), 1, "one condition of the type");
        assert_eq!(
            (c[0].status.as_str(), c[0].reason.as_str()),
            ("True", "Recorded")
        );
    }
}
