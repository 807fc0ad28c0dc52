//! A pod's status to a [`PodState`]: a pure function over the Pod, which sorts every way a
//! pod can end into measured, a hardware fault the agent saw, or not measured and why.

use super::{Blocker, PodState, never_started};
use gpufabric_api::keys::PROGRESS_PREFIX;
use gpufabric_api::outcome::{
    NodeOutcome, NotMeasuredReason, exit_code_outcome, exit_code_writes_result,
};
use gpufabric_api::result::CompactResult;
use k8s_openapi::api::core::v1::{ContainerStateTerminated, ContainerStateWaiting, Pod, PodStatus};

/// Waiting reasons after which the kubelet will not start the container without a change
/// by a person (an image name, a Secret): the node is not measured, and the pod is stopped.
const FINAL_WAITING: &[&str] = &[
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "CreateContainerConfigError",
];

/// Waiting reasons of an image that cannot be pulled.
const IMAGE_WAITING: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
    "RegistryUnavailable",
];

/// Waiting reasons of a container that cannot be configured or created.
const CONFIG_WAITING: &[&str] = &[
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
    "PreCreateHookError",
    "PreStartHookError",
];

/// Terminated reasons of a container the runtime could not start.
const START_FAILED: &[&str] = &["StartError", "ContainerCannotRun"];

fn first_line(text: &str, max: usize) -> String {
    let line = text.trim().lines().next().unwrap_or("").trim();
    if line.len() <= max {
        return line.to_string();
    }
    format!("{}…", gpufabric_api::text::prefix(line, max))
}

/// "Reason: message" from a reason and an optional message, the message cut to one line.
fn with_message(reason: &str, message: Option<&str>) -> String {
    match message
        .map(|m| first_line(m, 200))
        .filter(|m| !m.is_empty())
    {
        Some(m) => format!("{reason}: {m}"),
        None => reason.to_string(),
    }
}

fn agent_container(status: &PodStatus) -> Option<&k8s_openapi::api::core::v1::ContainerStatus> {
    status.container_statuses.as_ref().and_then(|cs| cs.first())
}

fn terminated(status: &PodStatus) -> Option<&ContainerStateTerminated> {
    agent_container(status)
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.as_ref())
}

fn waiting(status: &PodStatus) -> Option<&ContainerStateWaiting> {
    agent_container(status)
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.waiting.as_ref())
}

/// The agent's last progress line (e.g. `ncclSweep: allReduce 64 MiB`), when its
/// termination message is one: the agent ended before it wrote its result.
fn last_progress(message: &str) -> Option<String> {
    let line = first_line(message.trim().strip_prefix(PROGRESS_PREFIX)?, 200);
    (!line.is_empty()).then_some(line)
}

/// Where a started agent was when it was stopped, for the reason of a timeout.
fn whereabouts(status: &PodStatus) -> String {
    let progress = terminated(status)
        .and_then(|t| t.message.as_deref())
        .and_then(last_progress);
    match progress {
        Some(line) => format!("in phase \"{line}\" (its last progress line)"),
        None => "phase unknown: the agent wrote no progress line".to_string(),
    }
}

/// The agent's container ran (it is running, or it ended after starting).
fn agent_started(status: &PodStatus) -> bool {
    let Some(state) = agent_container(status).and_then(|c| c.state.as_ref()) else {
        return false;
    };
    state.running.is_some()
        || state.terminated.as_ref().is_some_and(|t| {
            t.started_at.is_some()
                && !t
                    .reason
                    .as_deref()
                    .is_some_and(|r| START_FAILED.contains(&r))
        })
}

/// What holds a pod back, from the container's waiting reason or a missing binding.
fn blocker(pod: &Pod, status: &PodStatus) -> Option<Blocker> {
    if let Some(w) = waiting(status) {
        let reason = w.reason.as_deref().unwrap_or("");
        let kind = if IMAGE_WAITING.contains(&reason) {
            Some(NotMeasuredReason::ImagePull)
        } else if CONFIG_WAITING.contains(&reason) {
            Some(NotMeasuredReason::ContainerConfig)
        } else {
            None
        };
        if let Some(kind) = kind {
            return Some(Blocker {
                reason: kind,
                detail: with_message(reason, w.message.as_deref()),
            });
        }
    }
    let bound = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| !n.is_empty());
    (!bound).then(|| Blocker {
        reason: NotMeasuredReason::NotScheduled,
        detail: not_scheduled(pod, status),
    })
}

/// Why an unbound pod was not scheduled, from the scheduler's `PodScheduled` condition:
/// a pod that claims its GPUs (a ResourceClaim for all the node's GPUs) that the scheduler
/// could not allocate says that its GPUs could not be claimed, and why that happens, before
/// the scheduler's words (a status cuts a long reason).
fn not_scheduled(pod: &Pod, status: &PodStatus) -> String {
    let refused = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False");
    let Some(c) = refused else {
        return "the pod was never bound to its node".into();
    };
    let said = with_message(
        c.reason.as_deref().unwrap_or("PodScheduled=False"),
        c.message.as_deref(),
    );
    let claims = pod
        .spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_ref())
        .is_some_and(|c| !c.is_empty());
    let about_claims = c
        .message
        .as_deref()
        .is_some_and(|m| m.to_ascii_lowercase().contains("claim"));
    if claims && about_claims {
        format!(
            "the node's GPUs could not be claimed (a GPU tainted by someone else, or held by another claim, keeps the pod's claim for all of them from being allocated); the scheduler: {said}"
        )
    } else {
        format!("the pod was never bound to its node (the scheduler: {said})")
    }
}

/// The disruption the pod's `DisruptionTarget` condition or reason records, if any.
fn disruption(status: &PodStatus) -> Option<(NotMeasuredReason, String)> {
    if status.reason.as_deref() == Some("Evicted") {
        return Some((
            NotMeasuredReason::Evicted,
            with_message("Evicted", status.message.as_deref()),
        ));
    }
    if status.reason.as_deref() == Some("Preempting") {
        return Some((
            NotMeasuredReason::Preempted,
            with_message("Preempted", status.message.as_deref()),
        ));
    }
    let c = status
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "DisruptionTarget" && c.status == "True")?;
    let reason = c.reason.as_deref().unwrap_or("DisruptionTarget");
    let kind = if reason == "PreemptionByScheduler" {
        NotMeasuredReason::Preempted
    } else {
        NotMeasuredReason::Evicted
    };
    Some((kind, with_message(reason, c.message.as_deref())))
}

/// The outcome of a container that ended.
fn ended_container(t: &ContainerStateTerminated) -> NodeOutcome {
    let message = t.message.as_deref().unwrap_or("");
    let reason = t.reason.as_deref().unwrap_or("");
    if t.exit_code == 0 {
        return match CompactResult::parse(message) {
            Ok(result) => NodeOutcome::Measured(Box::new(result)),
            Err(e) => NodeOutcome::not_measured(
                NotMeasuredReason::AgentBug,
                format!("the agent exited 0 but its result is unusable: {e}"),
            ),
        };
    }
    // Wrong values (checked by default) and a failed verdict end the agent non-zero with
    // its document written: the health rules judge that document, as after a 0.
    if exit_code_writes_result(t.exit_code)
        && let Ok(result) = CompactResult::parse(message)
    {
        return NodeOutcome::Measured(Box::new(result));
    }
    if START_FAILED.contains(&reason) {
        return NodeOutcome::not_measured(
            NotMeasuredReason::ContainerConfig,
            format!(
                "the container could not start (exit code {}): {}",
                t.exit_code,
                with_message(reason, Some(message))
            ),
        );
    }
    if reason == "OOMKilled" {
        return NodeOutcome::not_measured(
            NotMeasuredReason::OutOfMemory,
            format!(
                "the agent ran out of its container's memory (OOMKilled, exit code {})",
                t.exit_code
            ),
        );
    }
    let (kind, meaning) = exit_code_outcome(t.exit_code);
    let mut detail = format!("{meaning} (exit code {})", t.exit_code);
    if !reason.is_empty() && reason != "Error" {
        detail.push_str(&format!(", {reason}"));
    }
    if let Some(progress) = last_progress(message) {
        detail.push_str(&format!(", in phase \"{progress}\""));
    } else {
        let line = first_line(message, 200);
        if !line.is_empty() && !line.starts_with('{') {
            detail.push_str(&format!(": {line}"));
        }
    }
    match kind {
        Ok(fault) => NodeOutcome::hardware(fault, detail),
        Err(reason) => NodeOutcome::not_measured(reason, detail),
    }
}

/// Why a pod was being stopped from outside its agent, when it was: evicted, preempted, the
/// node shutting down (a `DisruptionTarget` condition or the pod's reason), or deleted (its
/// `deletionTimestamp`, by a person, a drain, the garbage collector or this operator).
fn stopped_from_outside(pod: &Pod, status: &PodStatus) -> Option<(NotMeasuredReason, String)> {
    if let Some(d) = disruption(status) {
        return Some(d);
    }
    if status.reason.as_deref() == Some("Terminated")
        || status.reason.as_deref() == Some("Shutdown")
    {
        // The kubelet's graceful node shutdown.
        return Some((
            NotMeasuredReason::Evicted,
            with_message("the node was shutting down", status.message.as_deref()),
        ));
    }
    pod.metadata.deletion_timestamp.as_ref()?;
    Some((
        NotMeasuredReason::PodDeleted,
        "the benchmark pod was being deleted".to_string(),
    ))
}

/// The outcome of an agent whose pod was stopped from outside (`why`): never the node's,
/// whatever the exit code or signal (a segmentation fault or a SIGKILL at the end of the
/// grace period included). A result the agent wrote before it ended is still read.
fn stopped_outcome(t: &ContainerStateTerminated, why: (NotMeasuredReason, String)) -> NodeOutcome {
    let ended = ended_container(t);
    if matches!(ended, NodeOutcome::Measured(_)) {
        return ended;
    }
    let (reason, detail) = why;
    let message = t.message.as_deref().unwrap_or("");
    let mut text = format!(
        "{detail}; the agent was stopped and ended with exit code {}",
        t.exit_code
    );
    if let Some(progress) = last_progress(message) {
        text.push_str(&format!(" in phase \"{progress}\""));
    }
    text.push_str(", which says nothing of the node");
    NodeOutcome::not_measured(reason, text)
}

/// A pod killed at its own `activeDeadlineSeconds`.
fn deadline_exceeded(pod: &Pod, status: &PodStatus) -> NodeOutcome {
    let limit = pod
        .spec
        .as_ref()
        .and_then(|s| s.active_deadline_seconds)
        .map(|s| format!(" ({s}s)"))
        .unwrap_or_default();
    if agent_started(status) {
        return NodeOutcome::hardware(
            gpufabric_api::outcome::HardwareFault::Hang,
            format!(
                "the agent had started and ran past the pod deadline{limit}, {}",
                whereabouts(status)
            ),
        );
    }
    match blocker(pod, status) {
        Some(b) => NodeOutcome::not_measured(
            b.reason,
            format!(
                "{}; the pod never started before its deadline{limit}",
                b.detail
            ),
        ),
        None => never_started(&format!("its deadline{limit}")),
    }
}

/// Where a benchmark pod stands, from its status alone.
pub fn pod_state(pod: &Pod) -> PodState {
    let Some(status) = pod.status.as_ref() else {
        return PodState::Waiting(blocker(pod, &PodStatus::default()));
    };
    if status.reason.as_deref() == Some("DeadlineExceeded") {
        return PodState::Ended(deadline_exceeded(pod, status));
    }
    if let Some((reason, detail)) = disruption(status)
        && status.phase.as_deref() == Some("Failed")
    {
        return PodState::Ended(NodeOutcome::not_measured(reason, detail));
    }
    if let Some(t) = terminated(status) {
        // A crash that ended the container before anyone stopped the pod was read and kept
        // in the run's entry before the pod was deleted (the run keeps an ended entry's
        // outcome for a pod being deleted); read here, a stopped pod's end is the stop's.
        if let Some(why) = stopped_from_outside(pod, status) {
            return PodState::Ended(stopped_outcome(t, why));
        }
        return PodState::Ended(ended_container(t));
    }
    match status.phase.as_deref() {
        // Failed with its container still waiting: the waiting reason says why. Failed
        // before any container ran: the kubelet's admission refused the pod
        // (`OutOfnvidia.com/gpu`, `NodeAffinity`, `UnexpectedAdmissionError`...).
        Some("Failed") => PodState::Ended(match waiting(status).and(blocker(pod, status)) {
            Some(b) => NodeOutcome::not_measured(b.reason, b.detail),
            None => NodeOutcome::not_measured(
                NotMeasuredReason::NotAdmitted,
                format!(
                    "the kubelet refused the pod: {}",
                    with_message(
                        status.reason.as_deref().unwrap_or("unknown reason"),
                        status.message.as_deref()
                    )
                ),
            ),
        }),
        Some("Succeeded") => PodState::Ended(NodeOutcome::not_measured(
            NotMeasuredReason::AgentBug,
            "the pod succeeded but reports no container state",
        )),
        Some("Running") if waiting(status).is_none() => PodState::Running,
        _ => match blocker(pod, status) {
            Some(b)
                if waiting(status)
                    .and_then(|w| w.reason.as_deref())
                    .is_some_and(|r| FINAL_WAITING.contains(&r)) =>
            {
                PodState::Ended(NodeOutcome::not_measured(b.reason, b.detail))
            }
            b => PodState::Waiting(b),
        },
    }
}
