//! A run stopped before its end, cancelled (`gpufabric.io/cancel`) or past
//! `limits.maxDurationSeconds`: every pod it made is stopped, its unfinished nodes end
//! `NotMeasured`, and once no pod of it is left its status says every GPU is free and the
//! nodes it measured are judged.

use super::common::pods_of;
use super::deadline::delete_unrecorded;
use crate::controller::run::context::RunContext;
use crate::error::Result;
use crate::results::PodState;
use crate::status as st;
use crate::time::{now, to_chrono, to_time};
use chrono::Utc;
use gpufabric_api::limits::{
    CANCEL_ANNOTATION, CONDITION_GPUS_FREE, LimitsStatus, RunLimits, StopCause,
};
use gpufabric_api::outcome::{NodeOutcome, NotMeasuredReason};
use gpufabric_api::run::{FabricTestRun, FabricTestRunStatus, SkipReason, SkippedNode};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::{Resource, ResourceExt};

/// Why a run stops now, and the sentence its nodes and status carry.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Halt {
    pub(super) cause: StopCause,
    pub(super) message: String,
}

impl Halt {
    /// The outcome of a node the run had not finished.
    pub(super) fn outcome(&self) -> NodeOutcome {
        let reason = match self.cause {
            StopCause::MaxDuration => NotMeasuredReason::MaxDuration,
            StopCause::Cancelled => NotMeasuredReason::Cancelled,
        };
        NodeOutcome::not_measured(reason, format!("{}: its pod was stopped", self.message))
    }
}

/// The cancel annotation's sentence, when the run carries it.
pub(super) fn cancelled(run: &FabricTestRun) -> Option<Halt> {
    let why = run.annotations().get(CANCEL_ANNOTATION)?;
    let message = match why.trim() {
        "" | "true" => format!("cancelled ({CANCEL_ANNOTATION})"),
        why => format!("cancelled ({CANCEL_ANNOTATION}: {why})"),
    };
    Some(Halt {
        cause: StopCause::Cancelled,
        message,
    })
}

/// When `limits.maxDurationSeconds` stops a run that started at `started`.
pub(super) fn stop_time(run: &FabricTestRun, started: Option<&Time>) -> Option<Time> {
    let max = run.spec.limits.max_duration_seconds?;
    let start = to_chrono(started?);
    Some(to_time(start + chrono::Duration::seconds(i64::from(max))))
}

/// Whether the run stops now: once stopped it stays so; else a cancel, else its longest
/// duration reached at `now`. Pure.
pub(super) fn halt(
    run: &FabricTestRun,
    status: &FabricTestRunStatus,
    now: chrono::DateTime<Utc>,
) -> Option<Halt> {
    if let Some(l) = &status.limits
        && let Some(cause) = l.stopped
    {
        return Some(Halt {
            cause,
            message: l.message.clone(),
        });
    }
    if let Some(h) = cancelled(run) {
        return Some(h);
    }
    let max = run.spec.limits.max_duration_seconds?;
    let at = stop_time(run, status.start_time.as_ref())?;
    (now >= to_chrono(&at)).then(|| Halt {
        cause: StopCause::MaxDuration,
        message: format!("the run reached limits.maxDurationSeconds ({max}s)"),
    })
}

/// The nodes among `targets` (sorted by name) a run with `limits` tests, and those beyond
/// `maxNodes`, each skipped with why. The nodes that passed longest ago come first (by
/// `last_pass`, RFC 3339; one that never passed first of all), so that runs over a fleet
/// larger than the limit take turns over all of it; the kept nodes stay sorted by name.
pub(super) fn over_limit<T>(
    limits: &RunLimits,
    mut targets: Vec<T>,
    name: impl Fn(&T) -> String,
    last_pass: impl Fn(&str) -> Option<String>,
) -> (Vec<T>, Vec<SkippedNode>) {
    if limits
        .max_nodes
        .is_some_and(|max| targets.len() > max as usize)
    {
        targets.sort_by_cached_key(|t| {
            let n = name(t);
            (last_pass(&n), n)
        });
    }
    let (mut kept, over) = limits.split_nodes(targets);
    kept.sort_by_cached_key(|t| name(t));
    let mut skipped: Vec<SkippedNode> = over
        .iter()
        .map(|t| SkippedNode {
            node: name(t),
            reason: SkipReason::OverLimit,
            message: format!(
                "beyond limits.maxNodes ({}): the run tests at most that many nodes, those that passed longest ago first",
                limits.max_nodes.unwrap_or_default()
            ),
        })
        .collect();
    skipped.sort_by(|a, b| a.node.cmp(&b.node));
    (kept, skipped)
}

/// What a run's status says of its limits at its start (`started`): the nodes left out
/// (among `skipped`) and when its longest duration ends. None for a run without limits.
pub(super) fn at_start(
    run: &FabricTestRun,
    started: &Time,
    skipped: &[SkippedNode],
) -> Option<LimitsStatus> {
    if run.spec.limits.is_empty() {
        return None;
    }
    Some(LimitsStatus {
        nodes_over_limit: skipped
            .iter()
            .filter(|s| s.reason == SkipReason::OverLimit)
            .count() as u32,
        stop_time: stop_time(run, Some(started)),
        stopped: None,
        message: String::new(),
    })
}

/// Every node without a final outcome ends as `halt` says. Pure.
pub(super) fn end_unfinished(outcomes: &mut [PodState], halt: &Halt) {
    for o in outcomes.iter_mut().filter(|o| !o.is_final()) {
        *o = PodState::Ended(halt.outcome());
    }
}

/// The status of a stopped run with `left` of its pods still there: why it stopped, and
/// the `GpusFree` condition (True once none is left). Pure.
pub(super) fn record(
    next: &mut FabricTestRunStatus,
    halt: &Halt,
    left: usize,
    generation: Option<i64>,
    at: &Time,
) {
    let limits = next.limits.get_or_insert_with(LimitsStatus::default);
    limits.stopped = Some(halt.cause);
    limits.message = halt.message.clone();
    let (free, reason, message) = if left == 0 {
        (
            true,
            "NoPodLeft",
            "no pod of this run is left: every GPU it held is free".to_string(),
        )
    } else {
        (
            false,
            "Stopping",
            format!("{left} pods of this run are stopping and still hold their GPUs"),
        )
    };
    st::put_condition(
        &mut next.conditions,
        CONDITION_GPUS_FREE,
        free,
        reason,
        message,
        generation,
        at,
    );
}

/// Deletes every pod the run made that is not being deleted yet (each by name and UID, with
/// its grace period), and returns how many of its pods are still there.
pub(super) async fn stop_pods(ctx: &RunContext, uid: &str, pods_api: &Api<Pod>) -> Result<usize> {
    let pods = pods_of(ctx, &ctx.pod_namespace, uid);
    for (name, p) in &pods {
        if p.meta().deletion_timestamp.is_some() {
            continue;
        }
        if let Some(pod_uid) = p.uid() {
            delete_unrecorded(pods_api, name, &pod_uid).await?;
        }
    }
    Ok(pods.len())
}

/// The status of a run cancelled before it started: Failed, no pod made.
pub(super) fn cancelled_before_start(run: &FabricTestRun, halt: &Halt) -> FabricTestRunStatus {
    let at = now();
    let mut status = run.status.clone().unwrap_or_default();
    status.phase = gpufabric_api::run::RunPhase::Failed;
    status.start_time.get_or_insert_with(|| at.clone());
    status.completion_time = Some(at.clone());
    status.duration = Some(st::duration_string(0));
    status.message = Some(format!("{} before it started", halt.message));
    record(&mut status, halt, 0, run.metadata.generation, &at);
    crate::signals::set_finished_conditions(&mut status, run.metadata.generation, &at);
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufabric_api::run::{FabricTestRunSpec, Trigger};
    use gpufabric_api::test::FabricTestSpec;

    fn run(limits: RunLimits, cancel: Option<&str>) -> FabricTestRun {
        let spec = FabricTestSpec {
            limits,
            ..Default::default()
        };
        let mut r = FabricTestRun::new(
            "r",
            FabricTestRunSpec::of_test("t", &spec, Trigger::Manual, None, None),
        );
        if let Some(why) = cancel {
            r.annotations_mut()
                .insert(CANCEL_ANNOTATION.into(), why.into());
        }
        r
    }

    fn started(t: &str) -> FabricTestRunStatus {
        FabricTestRunStatus {
            start_time: Some(to_time(at(t))),
            ..Default::default()
        }
    }

    fn minutes(limit: u32) -> RunLimits {
        RunLimits {
            max_duration_seconds: Some(limit * 60),
            ..Default::default()
        }
    }

    fn at(s: &str) -> chrono::DateTime<Utc> {
        s.parse().expect("time")
    }

    #[test]
    fn a_run_stops_at_its_longest_duration_and_not_before() {
        let r = run(minutes(10), None);
        let s = started("2026-01-01T00:00:00Z");
        assert_eq!(halt(&r, &s, at("2026-01-01T00:09:59Z")), None);
        let h = halt(&r, &s, at("2026-01-01T00:10:00Z")).expect("stopped");
        assert_eq!(h.cause, StopCause::MaxDuration);
        assert!(h.message.contains("maxDurationSeconds (600s)"), "{h:?}");
        assert_eq!(
            halt(
                &run(RunLimits::default(), None),
                &s,
                at("2027-01-01T00:00:00Z")
            ),
            None
        );
    }

    #[test]
    fn a_cancel_stops_the_run_at_once_with_its_reason() {
        let r = run(RunLimits::default(), Some("maintenance at 14:00"));
        let h = halt(
            &r,
            &started("2026-01-01T00:00:00Z"),
            at("2026-01-01T00:00:01Z"),
        )
        .expect("cancelled");
        assert_eq!(h.cause, StopCause::Cancelled);
        assert!(h.message.contains("maintenance at 14:00"), "{h:?}");
    }

    #[test]
    fn a_stopped_run_stays_stopped_when_the_annotation_goes() {
        let r = run(RunLimits::default(), None);
        let mut s = started("2026-01-01T00:00:00Z");
        let h = Halt {
            cause: StopCause::Cancelled,
            message: "cancelled".into(),
        };
        record(&mut s, &h, 3, None, &now());
        assert_eq!(halt(&r, &s, at("2026-01-01T00:00:01Z")), Some(h));
    }

    #[test]
    fn unfinished_nodes_end_not_measured_and_results_stay() {
        let measured = PodState::Ended(NodeOutcome::not_measured(
            NotMeasuredReason::GpusInUse,
            "held",
        ));
        let mut outcomes = vec![PodState::Running, PodState::Waiting(None), measured.clone()];
        let h = Halt {
            cause: StopCause::MaxDuration,
            message: "the run reached limits.maxDurationSeconds (600s)".into(),
        };
        end_unfinished(&mut outcomes, &h);
        for o in &outcomes[..2] {
            match o {
                PodState::Ended(NodeOutcome::NotMeasured { reason, detail }) => {
                    assert_eq!(*reason, NotMeasuredReason::MaxDuration);
                    assert!(detail.contains("600s"), "{detail}");
                }
                other => panic!("not ended as not measured: {other:?}"),
            }
        }
        assert_eq!(outcomes[2], measured);
    }

    #[test]
    fn gpus_are_free_only_once_no_pod_of_the_run_is_left() {
        let h = Halt {
            cause: StopCause::Cancelled,
            message: "cancelled".into(),
        };
        let mut s = started("2026-01-01T00:00:00Z");
        record(&mut s, &h, 2, None, &now());
        let free = |s: &FabricTestRunStatus| {
            s.conditions
                .iter()
                .find(|c| c.type_ == CONDITION_GPUS_FREE)
                .map(|c| c.status.clone())
        };
        assert_eq!(free(&s).as_deref(), Some("False"));
        record(&mut s, &h, 0, None, &now());
        assert_eq!(free(&s).as_deref(), Some("True"));
        assert_eq!(s.conditions.len(), 1);
        assert_eq!(s.limits.and_then(|l| l.stopped), Some(StopCause::Cancelled));
    }

    #[test]
    fn nodes_beyond_max_nodes_are_skipped_and_counted() {
        let r = run(
            RunLimits {
                max_nodes: Some(2),
                ..Default::default()
            },
            None,
        );
        // "a" passed last, "b" long ago, "c" never: "b" and "c" have their turn.
        let last_pass = |n: &str| match n {
            "a" => Some("2026-01-02T00:00:00Z".to_string()),
            "b" => Some("2026-01-01T00:00:00Z".to_string()),
            _ => None,
        };
        let (kept, skipped) = over_limit(
            &r.spec.limits,
            vec!["a", "b", "c"],
            |n| n.to_string(),
            last_pass,
        );
        assert_eq!(kept, vec!["b", "c"]);
        assert_eq!(skipped.len(), 1);
        assert_eq!(skipped[0].node, "a");
        assert_eq!(skipped[0].reason, SkipReason::OverLimit);
        let t0 = to_time(at("2026-01-01T00:00:00Z"));
        let limits = at_start(&r, &t0, &skipped).expect("limits");
        assert_eq!(limits.nodes_over_limit, 1);
        assert_eq!(limits.stop_time, None);
        let timed = run(minutes(10), None);
        let limits = at_start(&timed, &t0, &[]).expect("limits");
        assert_eq!(limits.stop_time, Some(to_time(at("2026-01-01T00:10:00Z"))));
    }
}
