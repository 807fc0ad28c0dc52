//! A node's health over runs: consecutive failing and passing runs, the hysteresis the
//! quarantine planner reads.

use gpufabric_api::policy::QuarantinePolicy;
use gpufabric_api::run::NodeVerdict;
use gpufabric_api::test::NodeHealth;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// The node's health after one more run.
///
/// - A bad verdict (Failed, Errored, Timeout) adds one consecutive failure and clears the
///   passes; Passed adds one consecutive pass and clears the failures.
/// - A verdict that is not final (Pending, Running), or NotMeasured, leaves both counters as
///   they were: a node the infrastructure kept from being measured is neither better nor
///   worse (its `last_finding` then says why it was not measured).
/// - `quarantined_since` is kept from `prev`: only the quarantine executor changes it.
///   `held_back` is cleared; the planner sets it again if it holds the node back in this run.
/// - `standing` (quarantined or not, a repeat offender or not) is kept: it is decided once
///   the quarantine plan and the lifecycle have run (the operator's fold).
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
        standing: prev.map(|p| p.standing.clone()).unwrap_or_default(),
        earlier: Default::default(),
        quarantined_since: prev.and_then(|p| p.quarantined_since.clone()),
        held_back: None,
        last_finding,
        last_run: Some(run.to_string()),
        last_measured: prev.and_then(|p| p.last_measured.clone()),
        last_judged: prev.and_then(|p| p.last_judged.clone()),
        quarantine_times: prev.map(|p| p.quarantine_times.clone()).unwrap_or_default(),
        taken_back: prev.and_then(|p| p.taken_back.clone()),
        gated_since: prev.and_then(|p| p.gated_since.clone()),
        condition_rise: prev.and_then(|p| p.condition_rise.clone()),
        condition_runs: prev.map(|p| p.condition_runs.clone()).unwrap_or_default(),
        condition_rises_dropped: prev.map_or(0, |p| p.condition_rises_dropped),
        tainted_gpus: prev.map(|p| p.tainted_gpus.clone()).unwrap_or_default(),
    }
}

/// Records that the test quarantined the node at `at`: `quarantine_times` keeps the
/// quarantines within `policy.repeat_offender_window_hours` of `at`. Returns true when this
/// quarantine makes the node a repeat offender: they number
/// `policy.repeat_offender_quarantines` (0: never). The fold's standing records it.
pub fn note_quarantine(health: &mut NodeHealth, at: Time, policy: &QuarantinePolicy) -> bool {
    health.quarantine_times.push(at.clone());
    forget_old_quarantines(health, &at, policy);
    let limit = policy.repeat_offender_quarantines as usize;
    limit > 0 && health.quarantine_times.len() >= limit
}

/// Drops the quarantine times older than the window before `now` (a repeat offender stays
/// one until it is repaired: the window counts toward the rule, it does not pardon).
pub fn forget_old_quarantines(health: &mut NodeHealth, now: &Time, policy: &QuarantinePolicy) {
    let window = i64::from(policy.repeat_offender_window_hours.max(1)) * 3600;
    let cutoff = now.0.as_second() - window;
    health.quarantine_times.retain(|t| t.0.as_second() > cutoff);
    // Bounded whatever the policy: the rule needs no more than its count.
    let keep = (policy.repeat_offender_quarantines as usize).clamp(1, 16);
    let excess = health.quarantine_times.len().saturating_sub(keep);
    health.quarantine_times.drain(..excess);
}

/// A repair was proven: the node starts with a clean record (and, quarantined still, is no
/// longer a repeat offender: the fold's standing is decided after it).
pub fn forgive(health: &mut NodeHealth) {
    health.quarantine_times.clear();
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
        a.standing = gpufabric_api::standing::Standing::Quarantined { hardware: true };
        a.quarantined_since = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        a.held_back = Some("over budget".into());
        let b = advance(Some(&a), "n1", NodeVerdict::Passed, Some("x".into()), "r2");
        assert_eq!(b.standing, a.standing, "only the fold decides the standing");
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

    fn at(hours: i64) -> Time {
        let base: k8s_openapi::jiff::Timestamp = "2026-11-20T00:00:00Z".parse().expect("time");
        Time(
            k8s_openapi::jiff::Timestamp::from_second(base.as_second() + hours * 3600)
                .expect("time"),
        )
    }

    #[test]
    fn the_third_quarantine_within_a_week_makes_a_repeat_offender() {
        let policy = QuarantinePolicy::default();
        let mut h = NodeHealth::default();
        assert!(!note_quarantine(&mut h, at(0), &policy));
        assert!(!note_quarantine(&mut h, at(48), &policy));
        assert!(note_quarantine(&mut h, at(96), &policy), "{h:?}");
        // Quarantined again (a person had lifted it): still one.
        assert!(note_quarantine(&mut h, at(100), &policy));
        // A repair proven: the count starts again.
        forgive(&mut h);
        assert!(h.quarantine_times.is_empty());
        assert!(!note_quarantine(&mut h, at(101), &policy));
    }

    #[test]
    fn quarantines_outside_the_window_do_not_count() {
        let policy = QuarantinePolicy::default();
        let mut h = NodeHealth::default();
        note_quarantine(&mut h, at(0), &policy);
        note_quarantine(&mut h, at(100), &policy);
        // 8 days after the first: only two fall within the week.
        assert!(!note_quarantine(&mut h, at(8 * 24), &policy));
        assert_eq!(h.quarantine_times.len(), 2);
        let off = QuarantinePolicy {
            repeat_offender_quarantines: 0,
            ..QuarantinePolicy::default()
        };
        let mut h = NodeHealth::default();
        for i in 0..5 {
            assert!(!note_quarantine(&mut h, at(i), &off));
        }
    }
}
