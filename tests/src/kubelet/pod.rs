//! One admitted pod on its node: pulling its image, building its config, running its
//! process, and ending it (deadline, eviction, deletion) with the status a kubelet writes.

use super::launch::{Launch, run_process};
use super::status::{Disruption, PodStatus, now, status_patch, write_status};
use super::{Inner, WRITE_ATTEMPTS, waiting};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, DeleteParams, Preconditions};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// How the kubelet ends a pod on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eviction {
    /// Node-pressure eviction: reason `Evicted`.
    NodePressure,
    /// Preempted to admit a critical pod: reason `Preempting`.
    Preemption,
}

impl Eviction {
    /// The pod status reason.
    pub fn reason(self) -> &'static str {
        match self {
            Eviction::NodePressure => "Evicted",
            Eviction::Preemption => "Preempting",
        }
    }

    /// The pod status message, as the kubelet words it.
    pub fn message(self) -> &'static str {
        match self {
            Eviction::NodePressure => {
                "The node was low on resource: memory. Threshold quantity: 100Mi, available: 42Mi. "
            }
            Eviction::Preemption => "Preempted in order to admit critical pod",
        }
    }

    /// The reason of the `DisruptionTarget` condition.
    pub(super) fn condition_reason(self) -> &'static str {
        "TerminationByKubelet"
    }
}

/// Why a pod's process must stop.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Stop {
    Run,
    /// The kubelet ends the pod: kill, write Failed with the eviction's reason.
    Evicted(Eviction),
    /// The pod has a deletionTimestamp: kill, then confirm the deletion.
    Deleted {
        grace_seconds: i64,
    },
    /// The pod object is gone, its node removed, or the kubelet stops: kill, write nothing.
    Abandon,
}

/// The pod status message of `activeDeadlineSeconds`, as the kubelet words it.
pub(super) const DEADLINE_MESSAGE: &str =
    "Pod was active on the node longer than the specified deadline";

/// Why waiting for a retry or for the process ended early.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Interrupt {
    /// `activeDeadlineSeconds` passed (counted from the pod's start time).
    Deadline,
    /// The pod must stop (not [`Stop::Run`]).
    Stopped(Stop),
}

/// A pod the kubelet has admitted, and what it knows about it.
pub(super) struct PodRun {
    pub inner: Arc<Inner>,
    pub pod: Pod,
    pub api: Api<Pod>,
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub dir: PathBuf,
    pub ip: String,
    pub start_time: String,
    pub deadline: Option<Instant>,
    pub container: String,
    pub image: String,
    pub stop: watch::Receiver<Stop>,
    /// Pid of the running process (0 when none), read by `Kubelet::pod_pid`.
    pub pid: Arc<AtomicU32>,
    /// Whether the pod still holds its resources on the node (admission counts it).
    pub active: Arc<AtomicBool>,
}

/// Sleeps until `deadline`, or forever without one.
pub(super) async fn until_deadline(deadline: Option<Instant>) {
    match deadline {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

impl PodRun {
    pub fn new(
        inner: Arc<Inner>,
        pod: Pod,
        stop: watch::Receiver<Stop>,
        pid: Arc<AtomicU32>,
        active: Arc<AtomicBool>,
    ) -> PodRun {
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let name = pod.metadata.name.clone().unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let spec = pod.spec.as_ref();
        let node = spec
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or_default();
        let deadline = spec
            .filter(|_| !inner.ignores_deadlines(node))
            .and_then(|s| s.active_deadline_seconds)
            .and_then(|s| u64::try_from(s).ok())
            .map(|s| Instant::now() + Duration::from_secs(s));
        let first = spec.and_then(|s| s.containers.first());
        let ip = inner.pod_ip(node);
        PodRun {
            api: Api::namespaced(inner.client.clone(), &namespace),
            dir: inner.root.join(format!("{namespace}_{name}")),
            ip,
            start_time: now(),
            deadline,
            container: first.map(|c| c.name.clone()).unwrap_or_default(),
            image: first.and_then(|c| c.image.clone()).unwrap_or_default(),
            inner,
            pod,
            namespace,
            name,
            uid,
            stop,
            pid,
            active,
        }
    }

    /// `namespace/name`, for logs.
    pub fn label(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// A container status of the first container in `state`, not ready, not started.
    pub fn container_status(&self, state: Value) -> Value {
        json!({"name": self.container, "image": self.image, "imageID": "", "ready": false,
               "started": false, "restartCount": 0, "state": state})
    }

    /// Writes the pod's status: `phase`, pod-level reason and message, its container.
    pub async fn write(
        &self,
        phase: &str,
        reason: Option<&str>,
        message: Option<String>,
        container: Value,
        disruption: Option<Disruption<'_>>,
    ) {
        let patch = status_patch(PodStatus {
            phase,
            reason,
            message,
            pod_ip: &self.ip,
            start_time: &self.start_time,
            container,
            disruption,
        });
        write_status(&self.api, &self.name, patch).await;
    }

    /// Pending with the container waiting for `reason` (`ErrImagePull`, ...).
    pub async fn write_waiting(&self, reason: &str, message: String) {
        let c = self.container_status(json!({"waiting": {"reason": reason, "message": message}}));
        self.write("Pending", None, None, c, None).await;
    }

    /// Sleeps for `d`, unless the deadline passes or the pod must stop first.
    pub async fn pause(&mut self, d: Duration) -> Option<Interrupt> {
        let deadline = self.deadline;
        let sleep = tokio::time::sleep(d);
        tokio::pin!(sleep);
        loop {
            let state = *self.stop.borrow_and_update();
            if state != Stop::Run {
                return Some(Interrupt::Stopped(state));
            }
            tokio::select! {
                _ = &mut sleep => return None,
                _ = until_deadline(deadline) => return Some(Interrupt::Deadline),
                changed = self.stop.changed() => if changed.is_err() {
                    return Some(Interrupt::Stopped(Stop::Abandon));
                },
            }
        }
    }

    /// Ends a pod whose container never ran: Failed at its deadline or on eviction, its
    /// waiting container reported as the kubelet does for a pod it terminated.
    pub async fn end_unstarted(self, why: Interrupt) {
        let unknown = || {
            self.container_status(json!({"terminated": {
                "exitCode": 137, "reason": "ContainerStatusUnknown",
                "message": "The container could not be located when the pod was terminated",
                "startedAt": null, "finishedAt": now()}}))
        };
        match why {
            Interrupt::Deadline => {
                let msg = Some(DEADLINE_MESSAGE.to_string());
                self.write("Failed", Some("DeadlineExceeded"), msg, unknown(), None)
                    .await;
            }
            Interrupt::Stopped(Stop::Evicted(e)) => {
                let d = Disruption {
                    reason: e.condition_reason(),
                    message: e.message(),
                };
                let msg = Some(e.message().to_string());
                self.write("Failed", Some(e.reason()), msg, unknown(), Some(d))
                    .await;
            }
            Interrupt::Stopped(Stop::Deleted { .. }) => {
                return confirm_deletion(
                    &self.inner.client,
                    &self.namespace,
                    &self.name,
                    &self.uid,
                )
                .await;
            }
            Interrupt::Stopped(Stop::Abandon) => return,
            Interrupt::Stopped(Stop::Run) => {}
        }
        self.wait_for_deletion().await
    }

    /// Failed because its process cannot start (exit code 128, `StartError`).
    pub async fn end_start_error(self, message: String) {
        let c = self.container_status(json!({"terminated": {
            "exitCode": 128, "reason": "StartError", "message": message,
            "startedAt": self.start_time, "finishedAt": now()}}));
        let patch = status_patch(PodStatus {
            phase: "Failed",
            reason: None,
            message: Some(message),
            pod_ip: "",
            start_time: &self.start_time,
            container: c,
            disruption: None,
        });
        write_status(&self.api, &self.name, patch).await;
        self.wait_for_deletion().await
    }

    /// After the pod has ended: it frees its resources; wait for its deletion and confirm
    /// it (or for the object to go).
    pub async fn wait_for_deletion(mut self) {
        self.active.store(false, Ordering::SeqCst);
        loop {
            let state = *self.stop.borrow_and_update();
            match state {
                Stop::Deleted { .. } => {
                    let c = &self.inner.client;
                    return confirm_deletion(c, &self.namespace, &self.name, &self.uid).await;
                }
                Stop::Abandon => return,
                Stop::Run | Stop::Evicted(_) => {}
            }
            if self.stop.changed().await.is_err() {
                return;
            }
        }
    }
}

/// Runs an admitted pod to its end and, once deleted, confirms the deletion.
pub(super) async fn run_pod(mut run: PodRun) {
    let _ = std::fs::remove_dir_all(&run.dir);
    if let Err(e) = std::fs::create_dir_all(&run.dir) {
        let msg = format!("creating the pod dir {}: {e}", run.dir.display());
        return run.end_start_error(msg).await;
    }
    if waiting::image_missing(&run.image) {
        let why = waiting::pull_failure(&mut run).await;
        return run.end_unstarted(why).await;
    }
    let launch: Launch = match waiting::until_configured(&mut run).await {
        waiting::Configured::Ready(l) => l,
        waiting::Configured::Interrupted(why) => return run.end_unstarted(why).await,
        waiting::Configured::StartError(msg) => return run.end_start_error(msg).await,
    };
    run_process(run, launch).await
}

/// Confirms a deletion with `gracePeriodSeconds: 0`, as a kubelet must once the pod's
/// processes are gone, or the pod stays forever.
pub(super) async fn confirm_deletion(client: &Client, namespace: &str, name: &str, uid: &str) {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..Default::default()
    };
    for attempt in 1..=WRITE_ATTEMPTS {
        match api.delete(name, &dp).await {
            Ok(_) => {
                tracing::debug!(pod = %format!("{namespace}/{name}"), "deletion confirmed");
                return;
            }
            // Gone already, or another object of that name: nothing to confirm.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => return,
            Err(e) => {
                tracing::warn!(pod = %format!("{namespace}/{name}"), attempt, error = %e, "confirming the deletion failed")
            }
        }
        tokio::time::sleep(Duration::from_millis(200) * attempt).await;
    }
}
