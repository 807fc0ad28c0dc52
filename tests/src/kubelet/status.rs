//! Pod status as the kubelet writes it: the patch, the write with retries, and the
//! termination message read from the pod's file or log.

use super::{
    FALLBACK_LOG_BYTES, FALLBACK_LOG_LINES, LOG_FILE, TERMINATION_LOG_FILE, WRITE_ATTEMPTS,
};
use gpufabric_api::keys;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;

pub(super) fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The message of the `DisruptionTarget` condition the kubelet adds to a pod it ends on
/// its own (eviction, preemption).
pub(super) struct Disruption<'a> {
    pub reason: &'a str,
    pub message: &'a str,
}

/// One pod status write: phase, pod-level reason and message, and the first container.
pub(super) struct PodStatus<'a> {
    pub phase: &'a str,
    pub reason: Option<&'a str>,
    pub message: Option<String>,
    pub pod_ip: &'a str,
    pub start_time: &'a str,
    pub container: Value,
    pub disruption: Option<Disruption<'a>>,
}

/// The merge patch of a pod's status, with the conditions a kubelet sets for that phase.
pub(super) fn status_patch(s: PodStatus<'_>) -> Value {
    let t = now();
    let container_name = s.container["name"].as_str().unwrap_or_default().to_string();
    let not_ready = format!("containers with unready status: [{container_name}]");
    let (ready, ready_reason, ready_message) = match s.phase {
        "Running" => ("True", None, None),
        "Pending" => ("False", Some("ContainersNotReady"), Some(not_ready)),
        _ => ("False", Some("PodCompleted"), None),
    };
    let cond = |type_: &str, status: &str, reason: Option<&str>, message: Option<&str>| {
        let mut c = json!({"type": type_, "status": status, "lastTransitionTime": t, "lastProbeTime": null});
        if let Some(r) = reason {
            c["reason"] = json!(r);
        }
        if let Some(m) = message {
            c["message"] = json!(m);
        }
        c
    };
    let mut conditions = vec![
        cond("PodReadyToStartContainers", "True", None, None),
        cond("Initialized", "True", None, None),
        cond("Ready", ready, ready_reason, ready_message.as_deref()),
        cond(
            "ContainersReady",
            ready,
            ready_reason,
            ready_message.as_deref(),
        ),
        cond("PodScheduled", "True", None, None),
    ];
    if let Some(d) = &s.disruption {
        conditions.push(cond(
            "DisruptionTarget",
            "True",
            Some(d.reason),
            Some(d.message),
        ));
    }
    let mut status = json!({
        "phase": s.phase,
        "hostIP": "127.0.0.1",
        "hostIPs": [{"ip": "127.0.0.1"}],
        "podIP": s.pod_ip,
        "podIPs": [{"ip": s.pod_ip}],
        "startTime": s.start_time,
        "qosClass": "BestEffort",
        "conditions": conditions,
        "containerStatuses": [s.container],
        "reason": s.reason,
        "message": s.message,
    });
    if s.pod_ip.is_empty() {
        status["podIP"] = Value::Null;
        status["podIPs"] = Value::Null;
    }
    json!({ "status": status })
}

/// Writes a status patch, retrying transient failures a few times.
pub(super) async fn write_status(api: &Api<Pod>, name: &str, patch: Value) {
    for attempt in 1..=WRITE_ATTEMPTS {
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(patch.clone()))
            .await
        {
            Ok(_) => return,
            // The pod is gone, or the server refuses this status: retrying cannot help.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 422 => {
                tracing::warn!(pod = %name, error = %s.message, "pod status not written");
                return;
            }
            Err(e) => {
                tracing::warn!(pod = %name, attempt, error = %e, "writing the pod status failed")
            }
        }
        tokio::time::sleep(Duration::from_millis(200) * attempt).await;
    }
}

/// Reads the termination message as the kubelet does: the first 4096 bytes of the file;
/// with `FallbackToLogsOnError` and an empty file after a failure, the log tail.
pub(super) fn termination_message(pod_dir: &Path, failed: bool, fallback: bool) -> String {
    use std::io::Read;
    let mut buf = Vec::new();
    if let Ok(f) = std::fs::File::open(pod_dir.join(TERMINATION_LOG_FILE)) {
        let _ = f
            .take(keys::TERMINATION_MESSAGE_LIMIT as u64)
            .read_to_end(&mut buf);
    }
    let msg = String::from_utf8_lossy(&buf).to_string();
    if msg.is_empty() && failed && fallback {
        let tail = crate::cluster::log_tail(&pod_dir.join(LOG_FILE), FALLBACK_LOG_LINES);
        let start = tail.len().saturating_sub(FALLBACK_LOG_BYTES);
        let start = (start..tail.len())
            .find(|i| tail.is_char_boundary(*i))
            .unwrap_or(tail.len());
        return tail[start..].to_string();
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn termination_message_is_cut_at_the_kubelet_limit() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join(TERMINATION_LOG_FILE), "x".repeat(5000)).expect("write");
        assert_eq!(termination_message(dir.path(), false, false).len(), 4096);
    }

    #[test]
    fn fallback_to_logs_uses_the_log_tail_only_after_a_failure() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join(LOG_FILE), "line 1\nboom\n").expect("write");
        assert_eq!(termination_message(dir.path(), true, true), "line 1\nboom");
        assert_eq!(termination_message(dir.path(), false, true), "");
        assert_eq!(termination_message(dir.path(), true, false), "");
    }

    #[test]
    fn a_waiting_pod_is_pending_and_not_ready_with_its_container_named() {
        let patch = status_patch(PodStatus {
            phase: "Pending",
            reason: None,
            message: None,
            pod_ip: "127.1.0.1",
            start_time: "2026-01-01T00:00:00Z",
            container: json!({"name": "agent", "state": {"waiting": {"reason": "ErrImagePull"}}}),
            disruption: None,
        });
        let ready = patch["status"]["conditions"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
            .cloned()
            .unwrap_or_default();
        assert_eq!(ready["status"], "False");
        assert_eq!(ready["reason"], "ContainersNotReady");
        assert_eq!(ready["message"], "containers with unready status: [agent]");
    }
}
