//! The pod watch: every pod bound to one of this kubelet's nodes is admitted (or
//! rejected), run, stopped on deletion, or left alone on a stalled node.

use super::admission::{admit, pod_gpus, rejection_patch};
use super::pod::{PodRun, confirm_deletion, run_pod};
use super::status::write_status;
use super::{Inner, PodHandle, Stop, lock};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use tokio::sync::watch;

pub(super) async fn pod_watch_loop(inner: Arc<Inner>) {
    let api: Api<Pod> = Api::all(inner.client.clone());
    let cfg = watcher::Config::default().fields("spec.nodeName!=");
    let mut stream = watcher(api, cfg).default_backoff().boxed();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => on_pod(&inner, pod),
            Ok(watcher::Event::Delete(pod)) => {
                let uid = pod.metadata.uid.unwrap_or_default();
                if let Some(h) = lock(&inner.pods).get(&uid) {
                    let _ = h.stop.send(Stop::Abandon);
                }
            }
            Ok(watcher::Event::Init | watcher::Event::InitDone) => {}
            Err(e) => tracing::warn!(error = %e, "pod watch error (retrying)"),
        }
    }
}

/// What the kubelet does with a pod it has not seen before.
enum Admit {
    Run,
    Reject(super::admission::Rejection),
}

/// Handles one pod event: stops a known pod on deletion, starts or rejects a new one.
pub(super) fn on_pod(inner: &Arc<Inner>, pod: Pod) {
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    let Some((capacity, stalled)) = inner.node_gpus_and_stall(&node) else {
        return;
    };
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let deleting = pod.metadata.deletion_timestamp.is_some();
    let grace_seconds = pod.metadata.deletion_grace_period_seconds.unwrap_or(0);
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default();
    let mut pods = lock(&inner.pods);
    if let Some(h) = pods.get(&uid) {
        if deleting {
            h.stop.send_if_modified(|s| {
                if matches!(*s, Stop::Run | Stop::Evicted(_)) {
                    *s = Stop::Deleted { grace_seconds };
                    true
                } else {
                    false
                }
            });
        }
        return;
    }
    if deleting || phase == "Succeeded" || phase == "Failed" || stalled {
        // Not ours to run (finished before this kubelet started, deleted before it ran, or
        // on a node that starts nothing): a deletion still needs its confirmation.
        if deleting {
            let client = inner.client.clone();
            tokio::spawn(async move { confirm_deletion(&client, &namespace, &name, &uid).await });
        }
        return;
    }
    let gpus = pod_gpus(&pod);
    let used: u64 = pods
        .values()
        .filter(|h| h.node == node && h.active.load(Ordering::SeqCst))
        .map(|h| h.gpus)
        .sum();
    let decision = match admit(gpus, used, capacity) {
        Ok(()) => Admit::Run,
        Err(r) => Admit::Reject(r),
    };
    let (tx, rx) = watch::channel(Stop::Run);
    let pid = Arc::new(AtomicU32::new(0));
    let active = Arc::new(AtomicBool::new(matches!(decision, Admit::Run)));
    pods.insert(
        uid.clone(),
        PodHandle {
            node,
            namespace,
            name,
            gpus,
            stop: tx,
            pid: pid.clone(),
            active: active.clone(),
        },
    );
    drop(pods);
    let inner = inner.clone();
    tokio::spawn(async move {
        let run = PodRun::new(inner.clone(), pod, rx, pid, active);
        match decision {
            Admit::Run => run_pod(run).await,
            Admit::Reject(r) => {
                tracing::info!(pod = %run.label(), reason = %r.reason, message = %r.message, "pod rejected");
                write_status(&run.api, &run.name, rejection_patch(&r)).await;
                run.wait_for_deletion().await;
            }
        }
        lock(&inner.pods).remove(&uid);
    });
}
