//! What the FabricTest controller decides, with no client: whether the spec can run,
//! whether a run starts now (schedule, creation, run-now, concurrency policy), and the
//! conditions the status shows. `super::test` carries the decisions out; what follows a
//! folded run is decided in `super::after_fold`.

use crate::names;
use crate::schedule::Schedule;
use crate::status as st;
use crate::time::to_chrono;
use chrono::{DateTime, Utc};
use gpufabric_api::keys;
use gpufabric_api::run::{FabricTestRun, Trigger};
use gpufabric_api::test::{FabricTest, FabricTestStatus};
use gpufabric_health::profiles::validate;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;

/// Condition: the spec is accepted and the operator acts on it (runs are scheduled, or the
/// test runs once, or its owner suspended it); False only for a spec that cannot run.
pub const CONDITION_READY: &str = "Ready";
/// Condition: nodes of this test are failing (Unknown until a run is judged).
pub const CONDITION_DEGRADED: &str = "Degraded";

/// A run to start.
#[derive(Clone, Debug, PartialEq)]
pub struct Start {
    pub trigger: Trigger,
    pub name: String,
    /// The schedule time it stands for (scheduled and creation runs).
    pub scheduled: Option<DateTime<Utc>>,
}

/// An Event the decision leaves on the test.
#[derive(Clone, Debug, PartialEq)]
pub struct Note {
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

impl Note {
    fn normal(reason: &'static str, message: String) -> Note {
        Note {
            warning: false,
            reason,
            message,
        }
    }

    fn warning(reason: &'static str, message: String) -> Note {
        Note {
            warning: true,
            reason,
            message,
        }
    }
}

/// What to do about starting runs, decided at one instant.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StartPlan {
    /// The run to start now.
    pub start: Option<Start>,
    /// Delete the active runs before starting (concurrencyPolicy Replace).
    pub replace_active: bool,
    /// The run due at this time exists already (its status write was lost): record the
    /// time as the last schedule time.
    pub already_started: Option<DateTime<Utc>>,
    /// Events to publish on the test.
    pub notes: Vec<Note>,
    /// When the schedule is next due (None: no schedule, suspended, or a run-now now).
    pub next: Option<DateTime<Utc>>,
}

/// Why a test's spec cannot run; its text is the InvalidSpec condition's message.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum InvalidSpec {
    /// The spec breaks a rule of `api::validate` (checked again here for specs admitted
    /// before a rule existed, or without the webhook).
    #[error(transparent)]
    Spec(#[from] gpufabric_api::ValidationError),
    /// The schedule or its time zone cannot be used.
    #[error(transparent)]
    Schedule(#[from] crate::schedule::ScheduleError),
}

/// The test's schedule, or why the spec cannot run (for the InvalidSpec condition).
pub fn validated_schedule(test: &FabricTest) -> Result<Option<Schedule>, InvalidSpec> {
    validate(&test.spec)?;
    Ok(test
        .spec
        .schedule
        .as_deref()
        .map(|s| Schedule::parse(s, test.spec.time_zone.as_deref()))
        .transpose()?)
}

/// Whether a run of `test` starts at `now`, given its status and its `active` runs (not
/// finished, not being deleted). In order: the run-now annotation, then the schedule, then
/// the one run of a test without a schedule. The concurrency policy admits each.
pub fn decide(
    test: &FabricTest,
    schedule: Option<&Schedule>,
    status: &FabricTestStatus,
    active: &[&FabricTestRun],
    now: DateTime<Utc>,
) -> StartPlan {
    let name = test.name_any();
    let created = test
        .metadata
        .creation_timestamp
        .as_ref()
        .map(to_chrono)
        .unwrap_or(now);
    let mut d = StartPlan::default();
    if test.annotations().contains_key(keys::ANNOTATION_RUN_NOW) {
        let rv = test.resource_version().unwrap_or_default();
        let candidate = Start {
            trigger: Trigger::Manual,
            name: names::run_name(
                &name,
                &format!("manual-{:08x}", names::fnv1a(rv.as_bytes()) as u32),
            ),
            scheduled: None,
        };
        d.admit(test, active, candidate, |a| {
            Note::normal(
                "RunNowWaiting",
                format!("run-now waits for the active run {a} (concurrencyPolicy Forbid)"),
            )
        });
    } else if let Some(schedule) = schedule.filter(|_| !test.spec.suspend) {
        let due = schedule.decide(
            status.last_schedule_time.as_ref().map(to_chrono),
            created,
            test.spec.starting_deadline_seconds,
            now,
        );
        if due.too_many_missed {
            d.notes.push(Note::warning(
                "TooManyMissedTimes",
                "more than 100 schedule times were missed; only the latest runs. Set startingDeadlineSeconds to bound this".into(),
            ));
        }
        if let Some(t) = due.too_late {
            d.notes.push(Note::warning(
                "MissedSchedule",
                format!("the run due at {t} is past startingDeadlineSeconds and is skipped"),
            ));
        }
        if let Some(t) = due.due {
            let candidate = Start {
                trigger: Trigger::Schedule,
                name: names::run_name(&name, &(t.timestamp() / 60).to_string()),
                scheduled: Some(t),
            };
            if active.iter().any(|r| r.name_any() == candidate.name) {
                d.already_started = Some(t);
            } else {
                d.admit(test, active, candidate, |a| {
                    Note::normal(
                        "RunAlreadyActive",
                        format!(
                            "not starting the run due at {t}: {a} is still running (concurrencyPolicy Forbid)"
                        ),
                    )
                });
            }
        }
        d.next = due.next;
    } else if schedule.is_none() && !test.spec.suspend && status.last_schedule_time.is_none() {
        d.start = Some(Start {
            trigger: Trigger::Creation,
            name: names::run_name(&name, &(created.timestamp() / 60).to_string()),
            scheduled: Some(created),
        });
    }
    d
}

impl StartPlan {
    /// Start `candidate` if the concurrency policy admits it; else say why it waits with
    /// the note `waits` makes from the name of the active run.
    fn admit(
        &mut self,
        test: &FabricTest,
        active: &[&FabricTestRun],
        candidate: Start,
        waits: impl FnOnce(&str) -> Note,
    ) {
        match test.spec.concurrency_policy.admit(!active.is_empty()) {
            Some(replace) => {
                self.replace_active = replace;
                self.start = Some(candidate);
            }
            None => {
                let blocking = active.first().map(|r| r.name_any()).unwrap_or_default();
                self.notes.push(waits(&blocking));
            }
        }
    }
}

/// The status conditions of a test whose spec is valid: Ready and Degraded.
///
/// Ready says the operator accepted the spec and acts on it, so it is True from the first
/// reconcile, never waiting for a run: `kubectl wait --for=condition=Ready` and GitOps
/// health checks return once the spec is taken, whenever the schedule fires. Its reason
/// says how runs start: `Scheduled`, `RunsOnce` (no schedule), or `Suspended` (the schedule
/// and the creation run wait; run-now and targeted runs of new or repaired nodes still
/// start, and held nodes stay held). A suspended test is as its owner asked, so it is Ready
/// too. Ready is False only for a spec that cannot run ([`invalid_status`]).
///
/// Degraded is the nodes' health: Unknown (`NoRunJudged`) until a run is judged, then True
/// while nodes of the test are failing, else False.
pub fn conditions(
    test: &FabricTest,
    previous: &[Condition],
    status: &FabricTestStatus,
    stamp: &Time,
) -> Vec<Condition> {
    let generation = test.metadata.generation;
    let (reason, message) = match (&test.spec.schedule, test.spec.suspend) {
        (_, true) => (
            "Suspended",
            "spec accepted; suspended: no scheduled run starts, run-now and targeted runs still do"
                .to_string(),
        ),
        (Some(s), false) => (
            "Scheduled",
            format!("spec accepted; runs on the schedule {s:?}"),
        ),
        (None, false) => (
            "RunsOnce",
            "spec accepted; no schedule: runs once when created, and on gpufabric.io/run-now"
                .to_string(),
        ),
    };
    let ready = st::condition(
        previous,
        CONDITION_READY,
        true,
        reason,
        message,
        generation,
        stamp,
    );
    let failing = st::failing_nodes(&status.nodes);
    let degraded = if !failing.is_empty() {
        st::condition(
            previous,
            CONDITION_DEGRADED,
            true,
            "NodesFailing",
            format!(
                "{} node(s) failing: {}",
                failing.len(),
                st::name_list(&failing, 10)
            ),
            generation,
            stamp,
        )
    } else if let Some(last) = &status.last_run {
        st::condition(
            previous,
            CONDITION_DEGRADED,
            false,
            "NodesPassing",
            format!("no node is failing (latest run judged: {})", last.name),
            generation,
            stamp,
        )
    } else {
        st::condition_unknown(
            previous,
            CONDITION_DEGRADED,
            "NoRunJudged",
            "no run has been judged yet".into(),
            generation,
            stamp,
        )
    };
    vec![ready, degraded]
}

/// The status of a test whose spec cannot run: Ready is False with the reason, and
/// nothing is scheduled. Other conditions stay as they were.
pub fn invalid_status(
    test: &FabricTest,
    original: &FabricTestStatus,
    why: &InvalidSpec,
    stamp: &Time,
) -> FabricTestStatus {
    let mut status = original.clone();
    status.observed_generation = test.metadata.generation;
    st::put_condition(
        &mut status.conditions,
        CONDITION_READY,
        false,
        "InvalidSpec",
        why.to_string(),
        test.metadata.generation,
        stamp,
    );
    status.next_schedule_time = None;
    status
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::time::to_time;
    use chrono::TimeZone;
    use gpufabric_api::run::{
        FabricTestRunSpec, FabricTestRunStatus, NodeRunResult, NodeVerdict, RunPhase,
    };
    use gpufabric_api::test::{ConcurrencyPolicy, FabricTestSpec};
    use std::collections::BTreeMap;

    pub(in crate::controller) fn at(h: u32, m: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 21, h, m, 0)
            .single()
            .expect("valid time")
    }

    fn test(schedule: Option<&str>) -> FabricTest {
        let mut t = FabricTest::new(
            "nightly",
            FabricTestSpec {
                schedule: schedule.map(str::to_string),
                ..FabricTestSpec::default()
            },
        );
        t.metadata.creation_timestamp = Some(to_time(at(1, 0)));
        t.metadata.resource_version = Some("7".into());
        t
    }

    /// A running scheduled run of the test `nightly`.
    pub(in crate::controller) fn run(name: &str) -> FabricTestRun {
        let mut r = FabricTestRun::new(
            name,
            FabricTestRunSpec::of_test(
                "nightly",
                &FabricTestSpec::default(),
                Trigger::Schedule,
                None,
                None,
            ),
        );
        r.status = Some(FabricTestRunStatus {
            phase: RunPhase::Running,
            ..Default::default()
        });
        r
    }

    fn decide_at(
        t: &FabricTest,
        status: &FabricTestStatus,
        active: &[&FabricTestRun],
        now: DateTime<Utc>,
    ) -> StartPlan {
        let schedule = validated_schedule(t).expect("valid spec");
        decide(t, schedule.as_ref(), status, active, now)
    }

    fn ran_at(time: DateTime<Utc>) -> FabricTestStatus {
        FabricTestStatus {
            last_schedule_time: Some(to_time(time)),
            ..Default::default()
        }
    }

    #[test]
    fn a_test_without_a_schedule_runs_once_when_created() {
        let t = test(None);
        let d = decide_at(&t, &FabricTestStatus::default(), &[], at(1, 5));
        let start = d.start.expect("a creation run");
        assert_eq!(start.trigger, Trigger::Creation);
        assert_eq!(start.scheduled, Some(at(1, 0)));
        assert_eq!(start.name, format!("nightly-{}", at(1, 0).timestamp() / 60));
        // Once only.
        let d = decide_at(&t, &ran_at(at(1, 0)), &[], at(3, 0));
        assert_eq!(d, StartPlan::default());
    }

    #[test]
    fn a_due_schedule_starts_its_run_and_says_when_it_is_next() {
        let t = test(Some("0 2 * * *"));
        let d = decide_at(&t, &ran_at(at(1, 0)), &[], at(2, 0));
        let start = d.start.expect("due");
        assert_eq!(
            (start.trigger, start.scheduled),
            (Trigger::Schedule, Some(at(2, 0)))
        );
        assert!(!d.replace_active && d.notes.is_empty());
        assert_eq!(d.next, Some(at(2, 0) + chrono::Duration::days(1)));
        // Not due yet: nothing starts, the next time is still known.
        let d = decide_at(&t, &ran_at(at(1, 0)), &[], at(1, 30));
        assert!(d.start.is_none());
        assert_eq!(d.next, Some(at(2, 0)));
    }

    #[test]
    fn forbid_keeps_the_due_run_waiting_and_says_which_run_blocks_it() {
        let t = test(Some("0 2 * * *"));
        let busy = run("nightly-old");
        let d = decide_at(&t, &ran_at(at(1, 0)), &[&busy], at(2, 0));
        assert!(d.start.is_none());
        assert_eq!(d.notes.len(), 1);
        assert_eq!(d.notes[0].reason, "RunAlreadyActive");
        assert!(d.notes[0].message.contains("nightly-old"), "{:?}", d.notes);
        assert!(!d.notes[0].warning);
    }

    #[test]
    fn replace_starts_the_due_run_after_deleting_the_active_one() {
        let mut t = test(Some("0 2 * * *"));
        t.spec.concurrency_policy = ConcurrencyPolicy::Replace;
        let busy = run("nightly-old");
        let d = decide_at(&t, &ran_at(at(1, 0)), &[&busy], at(2, 0));
        assert!(d.start.is_some() && d.replace_active);
    }

    #[test]
    fn a_due_run_that_exists_already_is_recorded_not_started_again() {
        let t = test(Some("0 2 * * *"));
        let existing = run(&names::run_name(
            "nightly",
            &(at(2, 0).timestamp() / 60).to_string(),
        ));
        let d = decide_at(&t, &ran_at(at(1, 0)), &[&existing], at(2, 0));
        assert!(d.start.is_none() && d.notes.is_empty());
        assert_eq!(d.already_started, Some(at(2, 0)));
    }

    #[test]
    fn run_now_starts_a_manual_run_named_for_the_request_or_waits_under_forbid() {
        let mut t = test(Some("0 2 * * *"));
        t.metadata.annotations = Some(BTreeMap::from([(
            keys::ANNOTATION_RUN_NOW.to_string(),
            "1".to_string(),
        )]));
        let d = decide_at(&t, &ran_at(at(1, 0)), &[], at(1, 30));
        let start = d.start.expect("manual");
        assert_eq!(start.trigger, Trigger::Manual);
        assert!(start.name.starts_with("nightly-manual-"), "{}", start.name);
        assert_eq!(d.next, None);
        let busy = run("nightly-old");
        let d = decide_at(&t, &ran_at(at(1, 0)), &[&busy], at(1, 30));
        assert!(d.start.is_none());
        assert_eq!(d.notes[0].reason, "RunNowWaiting");
    }

    #[test]
    fn a_suspended_test_starts_nothing_and_has_no_next_time() {
        let mut t = test(Some("0 2 * * *"));
        t.spec.suspend = true;
        assert_eq!(
            decide_at(&t, &ran_at(at(1, 0)), &[], at(2, 0)),
            StartPlan::default()
        );
        t.spec.schedule = None;
        assert_eq!(
            decide_at(&t, &FabricTestStatus::default(), &[], at(2, 0)),
            StartPlan::default()
        );
    }

    #[test]
    fn a_run_past_its_starting_deadline_is_not_started() {
        let mut t = test(Some("0 2 * * *"));
        t.spec.starting_deadline_seconds = Some(60);
        let d = decide_at(&t, &ran_at(at(1, 0)), &[], at(2, 30));
        assert!(d.start.is_none(), "{d:?}");
        assert_eq!(d.next, Some(at(2, 0) + chrono::Duration::days(1)));
    }

    #[test]
    fn an_unknown_time_zone_is_an_invalid_spec_with_the_reason() {
        let mut t = test(Some("0 2 * * *"));
        t.spec.time_zone = Some("Mars/Olympus".into());
        let why = validated_schedule(&t).expect_err("invalid");
        assert!(why.to_string().contains("Mars/Olympus"), "{why}");
        let stamp = to_time(at(1, 0));
        let status = invalid_status(&t, &FabricTestStatus::default(), &why, &stamp);
        let ready = status
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_READY)
            .expect("Ready");
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "InvalidSpec")
        );
        assert_eq!(status.next_schedule_time, None);
    }

    fn result(node: &str, verdict: NodeVerdict) -> NodeRunResult {
        serde_json::from_value(serde_json::json!({"node": node, "verdict": verdict}))
            .expect("a node result")
    }

    fn status_of<'a>(c: &'a [Condition], type_: &str) -> (&'a str, &'a str) {
        c.iter()
            .find(|c| c.type_ == type_)
            .map(|c| (c.status.as_str(), c.reason.as_str()))
            .unwrap_or_default()
    }

    fn judged(stamp: &Time) -> FabricTestStatus {
        FabricTestStatus {
            last_run: Some(gpufabric_api::test::RunSummary {
                name: "t-1".into(),
                phase: gpufabric_api::run::RunPhase::Succeeded,
                trigger: gpufabric_api::run::Trigger::Schedule,
                passed: 1,
                failed: 0,
                errored: 0,
                not_measured: 0,
                findings: 0,
                completion_time: Some(stamp.clone()),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_valid_test_is_ready_before_its_first_run_and_its_health_is_unknown() {
        let stamp = to_time(at(1, 0));
        for (schedule, reason) in [(Some("0 2 * * *"), "Scheduled"), (None, "RunsOnce")] {
            let c = conditions(&test(schedule), &[], &FabricTestStatus::default(), &stamp);
            assert_eq!(c.len(), 2);
            assert_eq!(status_of(&c, CONDITION_READY), ("True", reason));
            assert_eq!(
                status_of(&c, CONDITION_DEGRADED),
                ("Unknown", "NoRunJudged")
            );
        }
    }

    #[test]
    fn a_suspended_test_is_ready_and_says_it_is_suspended() {
        let mut t = test(Some("0 2 * * *"));
        t.spec.suspend = true;
        let stamp = to_time(at(1, 0));
        let c = conditions(&t, &[], &FabricTestStatus::default(), &stamp);
        assert_eq!(status_of(&c, CONDITION_READY), ("True", "Suspended"));
        // Suspending keeps Ready True since it first became True: nothing transitions.
        let earlier = to_time(at(0, 30));
        let before = conditions(
            &test(Some("0 2 * * *")),
            &[],
            &FabricTestStatus::default(),
            &earlier,
        );
        let c = conditions(&t, &before, &FabricTestStatus::default(), &stamp);
        let ready = c
            .iter()
            .find(|c| c.type_ == CONDITION_READY)
            .expect("Ready");
        assert_eq!(ready.last_transition_time, earlier);
    }

    #[test]
    fn a_judged_run_changes_health_and_never_ready() {
        let t = test(Some("0 2 * * *"));
        let first = to_time(at(1, 0));
        let before = conditions(&t, &[], &FabricTestStatus::default(), &first);
        let later = to_time(at(2, 10));
        let c = conditions(&t, &before, &judged(&later), &later);
        assert_eq!(status_of(&c, CONDITION_READY), ("True", "Scheduled"));
        let ready = c
            .iter()
            .find(|c| c.type_ == CONDITION_READY)
            .expect("Ready");
        assert_eq!(ready.last_transition_time, first);
        assert_eq!(status_of(&c, CONDITION_DEGRADED), ("False", "NodesPassing"));

        let r = run("t-2");
        let mut failing = judged(&later);
        failing.nodes =
            crate::status::fold_history(&[], &r, &[result("gpu-3", NodeVerdict::Failed)]);
        let c = conditions(&t, &c, &failing, &later);
        assert_eq!(status_of(&c, CONDITION_READY), ("True", "Scheduled"));
        assert_eq!(status_of(&c, CONDITION_DEGRADED), ("True", "NodesFailing"));
    }

    #[test]
    fn only_a_spec_that_cannot_run_is_not_ready() {
        let mut t = test(Some("0 2 * * *"));
        let stamp = to_time(at(1, 0));
        let ready = conditions(&t, &[], &FabricTestStatus::default(), &stamp);
        t.spec.time_zone = Some("Mars/Olympus".into());
        let why = validated_schedule(&t).expect_err("invalid");
        let original = FabricTestStatus {
            conditions: ready,
            ..Default::default()
        };
        let status = invalid_status(&t, &original, &why, &stamp);
        assert_eq!(
            status_of(&status.conditions, CONDITION_READY),
            ("False", "InvalidSpec")
        );
        // Health is left as it was.
        assert_eq!(
            status_of(&status.conditions, CONDITION_DEGRADED),
            ("Unknown", "NoRunJudged")
        );
    }
}
