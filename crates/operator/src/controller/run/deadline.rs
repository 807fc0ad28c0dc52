//! The deadline of the wave under way, and what happens to its pods when it passes.

use super::common::DEADLINE_MARGIN_SECONDS;
use crate::error::Result;
use crate::pods;
use crate::results::{self, PodState};
use crate::time::to_chrono;
use chrono::Utc;
use gpufabric_api::run::{FabricTestRunStatus, NodeRunResult, RunProgress};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, LogParams};
use std::time::Duration;

/// The agent's last progress line in the tail of a running pod's log, to say which phase it
/// was in when the run deadline stopped it; None when the log cannot be read in a few
/// seconds (a node whose kubelet is gone) or has none.
pub(super) async fn last_progress(pods_api: &Api<Pod>, pod: &str) -> Option<String> {
    let params = LogParams {
        container: Some(pods::CONTAINER.to_string()),
        tail_lines: Some(50),
        limit_bytes: Some(64 * 1024),
        ..LogParams::default()
    };
    match tokio::time::timeout(Duration::from_secs(5), pods_api.logs(pod, &params)).await {
        Ok(Ok(log)) => results::last_progress_in_log(&log),
        Ok(Err(e)) => {
            tracing::debug!(%pod, error = %e, "log of a pod stopped at the run deadline not read");
            None
        }
        Err(_) => None,
    }
}

/// Deletes the pod `name` only if it is still the object `uid` (a precondition the API
/// server checks); one already gone, or replaced, is left.
pub(super) async fn delete_unrecorded(pods_api: &Api<Pod>, name: &str, uid: &str) -> Result<()> {
    let dp = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    match pods_api.delete(name, &dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Deletes the pod `name` that the run made as `made` (its UID, a precondition): a pod it
/// did not make, or did not record, is never deleted this way.
pub(super) async fn delete_made(pods_api: &Api<Pod>, name: &str, made: Option<&str>) -> Result<()> {
    match made {
        Some(uid) => delete_unrecorded(pods_api, name, uid).await,
        None => Ok(()),
    }
}

/// The deadline of the wave under way: the agent timeout and the operator's margin, from
/// when all its pods existed (else when the wave, or the run, started).
pub(super) fn wave_deadline(
    prog: &RunProgress,
    status: &FabricTestRunStatus,
    timeout: i64,
    now: chrono::DateTime<Utc>,
) -> chrono::DateTime<Utc> {
    let base = prog
        .wave_pods_created_time
        .as_ref()
        .or(prog.wave_start_time.as_ref())
        .or(status.start_time.as_ref())
        .map(to_chrono)
        .unwrap_or(now);
    base + chrono::Duration::seconds(timeout + DEADLINE_MARGIN_SECONDS)
}

/// A wave that passed the run deadline.
pub(super) struct PastDeadline<'a> {
    /// The wave's nodes, as indexes into the run's entries.
    pub(super) wave: &'a [usize],
    /// The run deadline, seconds.
    pub(super) run_seconds: u64,
    /// Why a node is not Ready; None while it is.
    pub(super) not_ready: &'a (dyn Fn(&str) -> Option<String> + Sync),
}

/// Ends the wave's nodes past the run deadline: those without a pod never started, the
/// others are stopped (with the phase a running agent was in, from its log; on a node that
/// is not Ready, `not_ready` says why, not measured). Returns how many pods were stopped.
pub(super) async fn stop_at_deadline(
    entries: &[NodeRunResult],
    past: PastDeadline<'_>,
    to_create: &[usize],
    outcomes: &mut [PodState],
    pods_api: &Api<Pod>,
) -> Result<u32> {
    let PastDeadline {
        wave,
        run_seconds,
        not_ready,
    } = past;
    let mut stopped = 0;
    for i in to_create.iter().copied().filter(|i| wave.contains(i)) {
        outcomes[i] = PodState::Ended(results::never_started(&format!(
            "the run deadline ({run_seconds}s)"
        )));
    }
    for &i in wave {
        let o = &mut outcomes[i];
        if o.is_final() {
            continue;
        }
        // A node's pod that is still there is the one its entry recorded.
        let Some(pod) = entries[i].pod.clone() else {
            *o = PodState::Ended(results::never_started(&format!(
                "the run deadline ({run_seconds}s)"
            )));
            continue;
        };
        // A Running pod on a node that stopped reporting: its status is the kubelet's last
        // word, not a hang of the agent.
        let lost = match o {
            PodState::Running => not_ready(&entries[i].node),
            _ => None,
        };
        let phase = match (&*o, &lost) {
            (PodState::Running, None) => last_progress(pods_api, &pod).await,
            _ => None,
        };
        delete_made(pods_api, &pod, entries[i].pod_uid.as_deref()).await?;
        *o = PodState::Ended(match lost {
            Some(why) => results::node_not_ready(run_seconds, &why),
            None => std::mem::replace(o, PodState::Running)
                .at_run_deadline(run_seconds, phase.as_deref()),
        });
        stopped += 1;
    }
    Ok(stopped)
}
