//! A node's health over runs: consecutive failing and passing runs, the hysteresis the
//! quarantine planner reads.

use gpufabric_api::run::NodeVerdict;
use gpufabric_api::test::NodeHealth;

/// The node's health after one more run.
///
/// - A bad verdict (Failed, Errored, Timeout) adds one consecutive failure and clears the
///   passes; Passed adds one consecutive pass and clears the failures.
/// - A verdict that is not final (Pending, Running), or NotMeasured, leaves both counters as
///   they were: a node the infrastructure kept from being measured is neither better nor
///   worse (its `last_finding` then says why it was not measured).
/// - `quarantined` and `quarantined_since` are kept from `prev`: only the quarantine
///   executor changes them. `held_back` is cleared; the planner sets it again if it holds
///   the node back in this run.
/// - `last_finding` is replaced (None when the run found nothing), `last_run` set to `run`.
pub fn advance(
    prev: Option<&NodeHealth>,
    node: &str,
    verdict: NodeVerdict,
    last_finding: Option<String>,
    run: &str,
) -> NodeHealth {
    let (failures, passes) = prev
        .map(|p| (p.consecutive_failures, p.consecutive_passes))
        .unwrap_or((0, 0));
    let (consecutive_failures, consecutive_passes) = if verdict.is_bad() {
        (failures.saturating_add(1), 0)
    } else if verdict == NodeVerdict::Passed {
        (0, passes.saturating_add(1))
    } else {
        (failures, passes)
    };
    NodeHealth {
        node: node.to_string(),
        verdict,
        consecutive_failures,
        consecutive_passes,
        quarantined: prev.is_some_and(|p| p.quarantined),
        quarantined_since: prev.and_then(|p| p.quarantined_since.clone()),
        held_back: None,
        last_finding,
        last_run: Some(run.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn run(prev: Option<&NodeHealth>, v: NodeVerdict) -> NodeHealth {
        advance(prev, "n1", v, None, "r")
    }

    #[test]
    fn first_failure_counts_one() {
        let h = run(None, NodeVerdict::Failed);
        assert_eq!((h.consecutive_failures, h.consecutive_passes), (1, 0));
        assert_eq!(h.node, "n1");
        assert_eq!(h.last_run.as_deref(), Some("r"));
    }

    #[test]
    fn errored_and_timeout_count_as_failures() {
        let a = run(None, NodeVerdict::Errored);
        let b = run(Some(&a), NodeVerdict::Timeout);
        let c = run(Some(&b), NodeVerdict::Failed);
        assert_eq!(c.consecutive_failures, 3);
        assert_eq!(c.verdict, NodeVerdict::Failed);
    }

    #[test]
    fn a_pass_resets_failures_and_a_failure_resets_passes() {
        let a = run(None, NodeVerdict::Failed);
        let b = run(Some(&a), NodeVerdict::Failed);
        let c = run(Some(&b), NodeVerdict::Passed);
        assert_eq!((c.consecutive_failures, c.consecutive_passes), (0, 1));
        let d = run(Some(&c), NodeVerdict::Passed);
        assert_eq!(d.consecutive_passes, 2);
        let e = run(Some(&d), NodeVerdict::Timeout);
        assert_eq!((e.consecutive_failures, e.consecutive_passes), (1, 0));
    }

    #[test]
    fn not_measured_leaves_counters_alone_and_says_why() {
        let a = advance(
            None,
            "n1",
            NodeVerdict::Failed,
            Some("NVLink down".into()),
            "r1",
        );
        let b = advance(
            Some(&a),
            "n1",
            NodeVerdict::NotMeasured,
            Some("ImagePullBackOff".into()),
            "r2",
        );
        assert_eq!((b.consecutive_failures, b.consecutive_passes), (1, 0));
        assert_eq!(b.verdict, NodeVerdict::NotMeasured);
        assert_eq!(b.last_finding.as_deref(), Some("ImagePullBackOff"));
        let c = advance(Some(&b), "n1", NodeVerdict::Passed, None, "r3");
        assert_eq!((c.consecutive_failures, c.consecutive_passes), (0, 1));
        let fresh = advance(None, "n2", NodeVerdict::NotMeasured, None, "r1");
        assert_eq!(
            (fresh.consecutive_failures, fresh.consecutive_passes),
            (0, 0)
        );
    }

    #[test]
    fn pending_or_running_leaves_counters_alone() {
        let a = run(None, NodeVerdict::Failed);
        let b = run(Some(&a), NodeVerdict::Pending);
        assert_eq!((b.consecutive_failures, b.consecutive_passes), (1, 0));
        let c = run(Some(&b), NodeVerdict::Running);
        assert_eq!((c.consecutive_failures, c.consecutive_passes), (1, 0));
    }

    #[test]
    fn quarantine_state_is_kept_and_held_back_is_cleared() {
        let mut a = run(None, NodeVerdict::Failed);
        a.quarantined = true;
        a.quarantined_since = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        a.held_back = Some("over budget".into());
        let b = advance(Some(&a), "n1", NodeVerdict::Passed, Some("x".into()), "r2");
        assert!(b.quarantined);
        assert_eq!(b.quarantined_since, a.quarantined_since);
        assert_eq!(b.held_back, None);
        assert_eq!(b.last_finding.as_deref(), Some("x"));
        assert_eq!(b.last_run.as_deref(), Some("r2"));
    }

    #[test]
    fn counters_saturate_instead_of_overflowing() {
        let mut a = run(None, NodeVerdict::Failed);
        a.consecutive_failures = u32::MAX;
        let b = run(Some(&a), NodeVerdict::Failed);
        assert_eq!(b.consecutive_failures, u32::MAX);
    }
}
