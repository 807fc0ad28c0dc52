//! When and in what order a judged run's error counters are recorded on its nodes: once
//! the test has folded the run (its status and its quarantine first), failing nodes first,
//! never over a newer record; and, after a restart, again from the run's pods.

use super::RunContext;
use super::finish::{Judging, node_inputs};
use crate::results::{self, PodState};
use crate::time::now;
use gpufabric_api::counters::CounterBaseline;
use gpufabric_api::run::{FabricTestRun, FabricTestRunStatus, NodeRunResult, NodeVerdict};
use gpufabric_api::test::FabricTest;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// The longest the counters wait for the fold: past it they are written anyway (a test
/// whose fold is held up elsewhere must not leave its nodes without their records).
pub const FOLD_WAIT: Duration = Duration::from_secs(120);

/// How often the test's status is read while waiting.
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// Whether the counters may be written now.
#[derive(Debug, PartialEq, Eq)]
pub enum Go {
    /// Now, and why.
    Now(&'static str),
    /// Not yet: the test has not folded the run.
    Wait,
}

/// Decides, from the run and its test as last read (`None`: gone or never read), whether
/// the counters may be written after `waited`: once the test's status holds the run (its
/// quarantine is carried out before that status is written), when no test will fold it,
/// or past [`FOLD_WAIT`]. Pure.
pub fn may_write(run: &FabricTestRun, test: Option<&FabricTest>, waited: Duration) -> Go {
    let Some(owner) = crate::context::Context::test_ref_of(run) else {
        return Go::Now("no test folds the run");
    };
    let Some(test) = test.filter(|t| t.uid().is_some() && t.uid() == owner.uid) else {
        return Go::Now("the run's test is gone");
    };
    let last = test.status.as_ref().and_then(|s| s.last_run.as_ref());
    // Only a run with its end (its fold key) can be found folded: one without is never
    // left out of the runs to fold because it is folded.
    let ended = run.status.as_ref().is_some_and(|s| s.phase.is_finished());
    if ended && crate::status::runs_to_fold(std::slice::from_ref(run), last).is_empty() {
        return Go::Now("the test has folded the run");
    }
    if waited >= FOLD_WAIT {
        return Go::Now("the fold did not come in time");
    }
    Go::Wait
}

/// The records in the order they are written: the nodes the run did not pass first (a
/// confirmation run retests them soon and reads their record), then the rest, each group
/// in node order. Pure.
pub fn in_writing_order(
    mut records: Vec<(String, CounterBaseline)>,
    entries: &[NodeRunResult],
) -> Vec<(String, CounterBaseline)> {
    let not_passed: BTreeSet<&str> = entries
        .iter()
        .filter(|e| e.verdict != NodeVerdict::Passed)
        .map(|e| e.node.as_str())
        .collect();
    records.sort_by(|(a, _), (b, _)| {
        (!not_passed.contains(a.as_str()), a).cmp(&(!not_passed.contains(b.as_str()), b))
    });
    records
}

/// Whether `ours` must not replace `current`, the record the node carries now: a later
/// run measured the node and wrote its own since (a record written late, after a
/// restart, never takes a node back to older counts). Pure.
pub fn superseded(ours: &CounterBaseline, current: Option<&CounterBaseline>) -> bool {
    let Some(current) = current.filter(|c| c.run != ours.run) else {
        return false;
    };
    let at = |s: &str| chrono::DateTime::parse_from_rfc3339(s).ok();
    match (at(&ours.at), at(&current.at)) {
        (Some(o), Some(c)) => c > o,
        // A record with no readable time is older than any that has one.
        (Some(_), None) => false,
        (None, _) => true,
    }
}

/// Waits until [`may_write`] says go (reading the run's test once a second), then writes
/// `records`: failing nodes first, none over a newer record. Returns the nodes that could
/// not be written, with why.
pub(super) async fn write_after_fold(
    run: &FabricTestRun,
    records: Vec<(String, CounterBaseline)>,
    entries: &[NodeRunResult],
    ctx: &RunContext,
) -> Vec<String> {
    if records.is_empty() {
        return Vec::new();
    }
    let began = Instant::now();
    let tests: Api<FabricTest> = Api::all(ctx.client.clone());
    let owner = crate::context::Context::test_ref_of(run).and_then(|o| o.name);
    let why = loop {
        let test = match &owner {
            Some(name) => match tests.get_opt(name).await {
                Ok(t) => t,
                Err(e) => {
                    // Read again at the next look; the bound still holds.
                    tracing::debug!(error = %e, "reading the run's test to see it folded");
                    if began.elapsed() < FOLD_WAIT {
                        tokio::time::sleep(LOOK_EVERY).await;
                        continue;
                    }
                    None
                }
            },
            None => None,
        };
        match may_write(run, test.as_ref(), began.elapsed()) {
            Go::Now(why) => break why,
            Go::Wait => tokio::time::sleep(LOOK_EVERY).await,
        }
    };
    let waited_ms = began.elapsed().as_millis();
    let records: Vec<_> = in_writing_order(records, entries)
        .into_iter()
        .filter(|(node, ours)| {
            let current = ctx
                .nodes
                .get(&ObjectRef::new(node))
                .and_then(|n| crate::counters::baseline_of(&n));
            !superseded(ours, current.as_ref())
        })
        .collect();
    let count = records.len();
    let writing = Instant::now();
    let failures = crate::counters::write(&ctx.client, records).await;
    tracing::debug!(
        %why,
        waited_ms,
        nodes = count,
        took_ms = writing.elapsed().as_millis(),
        "error counters recorded"
    );
    failures
}

/// Sets `CountersRecorded` True on a run's `status` once its counters were written, with
/// the nodes that could not be (each logged).
pub(super) fn settle(
    status: &mut FabricTestRunStatus,
    failures: Vec<String>,
    generation: Option<i64>,
) {
    for failure in &failures {
        tracing::warn!(%failure, "error counters not recorded");
    }
    let note = (!failures.is_empty()).then(|| {
        let shown: Vec<&str> = failures.iter().take(5).map(String::as_str).collect();
        format!(
            "error counters not recorded for {} node(s), which keep their older record: {}",
            failures.len(),
            shown.join("; ")
        )
    });
    crate::signals::set_counters_recorded(status, None, note.as_deref(), generation, &now());
}

/// The records of a judged run worked out again from its pods (an operator that stopped
/// between the verdict and their write): each measured node's result as its pod ended,
/// judged against the record its node carries now. A node written before the stop has
/// that run's counts already and gets nothing; a node whose pod is gone keeps its older
/// record (the next run compares over a longer span).
pub(super) fn rebuilt(
    run: &FabricTestRun,
    entries: &[NodeRunResult],
    ctx: &RunContext,
) -> Vec<(String, CounterBaseline)> {
    let outcomes: Vec<PodState> = entries
        .iter()
        .map(|e| {
            let pod = e
                .pod
                .as_ref()
                .and_then(|name| {
                    ctx.pods
                        .get(&ObjectRef::new(name).within(&ctx.pod_namespace))
                })
                .filter(|p| p.uid().is_some() && p.uid() == e.pod_uid);
            match pod.map(|p| results::pod_state(&p)) {
                Some(state) if state.is_final() => state,
                _ => PodState::Waiting(None),
            }
        })
        .collect();
    let inputs = node_inputs(entries, outcomes, &Judging::of(run), ctx);
    let evaluation = gpufabric_health::evaluate(&inputs, &run.spec.thresholds);
    let at = run
        .status
        .as_ref()
        .and_then(|s| s.completion_time.as_ref())
        .map(|t| gpufabric_api::rfc3339::rfc3339(t.0))
        .unwrap_or_default();
    crate::counters::to_write(&inputs, &evaluation.findings, &run.name_any(), &at)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::to_time;
    use gpufabric_api::run::{FabricTestRunSpec, RunPhase, Trigger};
    use gpufabric_api::test::{FabricTestSpec, FabricTestStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn run(name: &str, ended_minutes_ago: i64) -> FabricTestRun {
        let spec = FabricTestRunSpec::of_test(
            "fleet",
            &FabricTestSpec::default(),
            Trigger::Schedule,
            None,
            None,
        );
        let mut r = FabricTestRun::new(name, spec);
        r.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "gpufabric.io/v1alpha1".into(),
            kind: "FabricTest".into(),
            name: "fleet".into(),
            uid: "uid-fleet".into(),
            controller: Some(true),
            ..Default::default()
        }]);
        r.status = Some(FabricTestRunStatus {
            phase: RunPhase::Succeeded,
            completion_time: Some(to_time(
                chrono::Utc::now() - chrono::Duration::minutes(ended_minutes_ago),
            )),
            ..Default::default()
        });
        r
    }

    fn test_with_last(last: Option<&FabricTestRun>) -> FabricTest {
        let mut t = FabricTest::new("fleet", FabricTestSpec::default());
        t.metadata.uid = Some("uid-fleet".into());
        t.status = Some(FabricTestStatus {
            last_run: last.map(crate::status::run_summary),
            ..Default::default()
        });
        t
    }

    fn record(run: &str, at: &str) -> CounterBaseline {
        CounterBaseline {
            run: run.into(),
            at: at.into(),
            nvlink: vec![1, 2],
        }
    }

    fn entry(node: &str, verdict: NodeVerdict) -> NodeRunResult {
        NodeRunResult {
            node: node.into(),
            verdict,
            ..Default::default()
        }
    }

    #[test]
    fn the_counters_wait_until_the_test_has_folded_the_run() {
        let older = run("fleet-1", 60);
        let this = run("fleet-2", 1);
        let waited = Duration::from_secs(5);
        assert_eq!(
            may_write(&this, Some(&test_with_last(None)), waited),
            Go::Wait,
            "nothing folded yet"
        );
        assert_eq!(
            may_write(&this, Some(&test_with_last(Some(&older))), waited),
            Go::Wait,
            "only an earlier run folded"
        );
        assert_eq!(
            may_write(&this, Some(&test_with_last(Some(&this))), waited),
            Go::Now("the test has folded the run")
        );
        let later = run("fleet-3", 0);
        assert_eq!(
            may_write(&this, Some(&test_with_last(Some(&later))), waited),
            Go::Now("the test has folded the run"),
            "a later run folded: this one was folded before it"
        );
    }

    #[test]
    fn a_run_without_its_end_is_never_taken_for_folded() {
        let mut this = run("fleet-2", 1);
        if let Some(s) = this.status.as_mut() {
            s.phase = RunPhase::Running;
            s.completion_time = None;
        }
        assert_eq!(
            may_write(&this, Some(&test_with_last(None)), Duration::from_secs(5)),
            Go::Wait
        );
    }

    #[test]
    fn the_counters_do_not_wait_for_a_fold_that_cannot_come() {
        let this = run("fleet-2", 1);
        let waited = Duration::from_secs(5);
        assert_eq!(
            may_write(&this, None, waited),
            Go::Now("the run's test is gone")
        );
        let mut other = test_with_last(None);
        other.metadata.uid = Some("uid-another-fleet".into());
        assert_eq!(
            may_write(&this, Some(&other), waited),
            Go::Now("the run's test is gone"),
            "a test of the same name made again does not fold this run"
        );
        let mut orphan = this.clone();
        orphan.metadata.owner_references = None;
        assert_eq!(
            may_write(&orphan, Some(&test_with_last(None)), waited),
            Go::Now("no test folds the run")
        );
        assert_eq!(
            may_write(&this, Some(&test_with_last(None)), FOLD_WAIT),
            Go::Now("the fold did not come in time")
        );
    }

    #[test]
    fn nodes_the_run_did_not_pass_are_written_first() {
        let records = ["a", "b", "c", "d"]
            .iter()
            .map(|n| (n.to_string(), record("fleet-2", "2026-11-29T10:00:00Z")))
            .collect();
        let entries = [
            entry("a", NodeVerdict::Passed),
            entry("b", NodeVerdict::Failed),
            entry("c", NodeVerdict::Passed),
            entry("d", NodeVerdict::Timeout),
        ];
        let order: Vec<String> = in_writing_order(records, &entries)
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(order, ["b", "d", "a", "c"]);
    }

    #[test]
    fn a_record_written_late_never_replaces_a_later_runs() {
        let ours = record("fleet-2", "2026-11-29T10:00:00Z");
        assert!(!superseded(&ours, None), "no record yet");
        let older = record("fleet-1", "2026-11-28T10:00:00Z");
        assert!(!superseded(&ours, Some(&older)));
        let later = record("fleet-3", "2026-11-29T10:05:00Z");
        assert!(superseded(&ours, Some(&later)));
        let same_run = record("fleet-2", "2026-11-29T10:00:00Z");
        assert!(!superseded(&ours, Some(&same_run)));
        let unreadable_time = record("other-tool", "yesterday");
        assert!(
            !superseded(&ours, Some(&unreadable_time)),
            "a record with no readable time is older"
        );
    }
}
