//! Writes the node signals of a judged run: for every node the run tested, the
//! `GPUFabricDegraded` condition (a strategic merge patch of `nodes/status`, which also
//! deletes a `GPUFabricHealthy` condition of 0.2.0 a FabricTest wrote) and the result label
//! and last-pass annotation (a merge patch of gpufabric's own keys). A node that cannot be
//! written is reported; it never stops the others nor the reconcile.

use super::SignalError;
use super::node::{self, Judgement};
use crate::time::now;
use futures::StreamExt;
use gpufabric_api::keys;
use gpufabric_api::policy::QuarantineMode;
use gpufabric_api::run::{FabricTestRun, NodeRunResult};
use gpufabric_api::test::{FabricTest, NodeHealth};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use std::collections::{BTreeMap, BTreeSet};

/// Nodes written at once.
pub const WRITE_CONCURRENCY: usize = 16;

/// One node's signals, decided before anything is written.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeSignal {
    pub node: String,
    pub judgement: Judgement,
    /// The condition to write; None: the node keeps the one it has.
    pub condition: Option<k8s_openapi::api::core::v1::NodeCondition>,
    /// Delete the node's `GPUFabricHealthy` condition, which a FabricTest of gpufabric
    /// 0.2.0 wrote: the condition above replaces it.
    pub remove_legacy: bool,
    /// The metadata merge patch, as JSON text (a fleet's worth of them is held between
    /// deciding and writing: text is a tenth of the parsed form); None: label and
    /// annotation are already right.
    pub metadata: Option<String>,
    /// With graduated taints, the test (`<namespace>/<name>`) that owns the suspect taint.
    pub suspect_taint_owner: Option<String>,
}

/// What writing the signals of one run did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Published {
    /// Judgement per node, for logs and tests.
    pub judged: BTreeMap<String, Judgement>,
    /// Nodes whose signals could not be written, with why.
    pub failures: Vec<String>,
}

/// The signals of every node `run` tested, from every node's result (`results`: all of
/// the run's shards, not the bounded run status), the test's history after the run was
/// folded (`history`) and the nodes a confirmation run retests (`confirm`). Pure.
pub fn decide(
    test: &FabricTest,
    run: &FabricTestRun,
    results: &[NodeRunResult],
    history: &[NodeHealth],
    confirm: &[String],
    nodes: &Store<Node>,
) -> Vec<NodeSignal> {
    let Some(status) = run.status.as_ref() else {
        return Vec::new();
    };
    let stamp = now();
    let passed_at = status
        .completion_time
        .clone()
        .unwrap_or_else(|| stamp.clone());
    let by_node: BTreeMap<&str, &NodeHealth> =
        history.iter().map(|h| (h.node.as_str(), h)).collect();
    let confirm: BTreeSet<&str> = confirm.iter().map(String::as_str).collect();
    let failures_needed = test.spec.quarantine.failures_to_quarantine;
    let test_name = test.name_any();
    let run_name = run.name_any();
    let q = &test.spec.quarantine;
    let taint_owner = (q.graduated_taints && q.mode != QuarantineMode::Observe)
        .then(|| crate::quarantine::test_key(test).ok())
        .flatten();
    results
        .iter()
        .filter_map(|entry| {
            let health = by_node.get(entry.node.as_str()).copied();
            let judgement = Judgement::of(
                entry,
                health,
                confirm.contains(entry.node.as_str()),
                failures_needed,
            )?;
            let current = nodes.get(&ObjectRef::new(&entry.node));
            let detail = match judgement {
                Judgement::NotMeasured => entry.reason.as_deref(),
                _ => health
                    .and_then(|h| h.last_finding.as_deref())
                    .or(entry.reason.as_deref()),
            };
            let message = node::message(&test_name, &run_name, judgement, detail);
            // A node that still carries the condition of 0.2.0 this test wrote (an old
            // replica's last write) has it as its current one, turned over; kept (not
            // measured), it is written under the new type.
            let legacy = node::legacy_condition(current.as_deref())
                .filter(|c| node::writer(c) == Some(test_name.as_str()));
            let migrated = match node::current_condition(current.as_deref()) {
                Some(_) => None,
                None => legacy.map(|l| node::from_legacy(l, &stamp)),
            };
            let present = node::current_condition(current.as_deref()).or(migrated.as_ref());
            let condition =
                node::condition(judgement, &message, present, &stamp).or_else(|| migrated.clone());
            Some(NodeSignal {
                node: entry.node.clone(),
                judgement,
                condition,
                remove_legacy: legacy.is_some(),
                metadata: node::metadata_patch(current.as_deref(), judgement, &passed_at)
                    .map(|p| p.to_string()),
                suspect_taint_owner: taint_owner.clone(),
            })
        })
        .collect()
}

/// Writes `signals`, [`WRITE_CONCURRENCY`] nodes at once. A node that is gone is skipped.
pub async fn write(client: &Client, signals: Vec<NodeSignal>) -> Published {
    let api: Api<Node> = Api::all(client.clone());
    let judged = signals
        .iter()
        .map(|s| (s.node.clone(), s.judgement))
        .collect();
    let failures: Vec<String> = futures::stream::iter(signals)
        .map(|s| {
            let api = api.clone();
            async move { write_one(&api, &s).await.err().map(|e| e.to_string()) }
        })
        .buffer_unordered(WRITE_CONCURRENCY)
        .filter_map(|e| async move { e })
        .collect()
        .await;
    Published { judged, failures }
}

/// Waits before the second and third tries of a signal write.
pub const RETRY_DELAYS: [std::time::Duration; 2] = [
    std::time::Duration::from_millis(500),
    std::time::Duration::from_secs(2),
];

/// Whether another try may succeed: not for a node that is gone, a request the API server
/// refuses as invalid, or a missing permission.
fn worth_retrying(e: &kube::Error) -> bool {
    !matches!(e, kube::Error::Api(s) if matches!(s.code, 400 | 403 | 404 | 422))
}

/// Runs `call`, trying again after each of [`RETRY_DELAYS`] while it fails with an error
/// worth retrying (a timeout, a conflict, an API server restarting).
pub async fn retrying<T, F, Fut>(mut call: F) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let mut delays = RETRY_DELAYS.iter();
    loop {
        match call().await {
            Err(e) if worth_retrying(&e) => match delays.next() {
                Some(d) => {
                    tracing::debug!(error = %e, "signal write failed; trying again");
                    tokio::time::sleep(*d).await;
                }
                None => return Err(e),
            },
            other => return other,
        }
    }
}

async fn write_one(api: &Api<Node>, s: &NodeSignal) -> Result<(), SignalError> {
    let pp = PatchParams {
        field_manager: Some(keys::MANAGER.to_string()),
        ..Default::default()
    };
    if let Some(patch) = node::status_patch(s.condition.as_ref(), s.remove_legacy) {
        let patch = Patch::Strategic(patch);
        match retrying(|| api.patch_status(&s.node, &pp, &patch)).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
            Err(source) => {
                return Err(SignalError::Condition {
                    node: s.node.clone(),
                    source,
                });
            }
        }
    }
    if let Some(m) = &s.metadata {
        let parsed: serde_json::Value =
            serde_json::from_str(m).map_err(|source| SignalError::LabelPatch {
                node: s.node.clone(),
                source,
            })?;
        let patch = Patch::Merge(parsed);
        match retrying(|| api.patch(&s.node, &pp, &patch)).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
            Err(source) => {
                return Err(SignalError::Label {
                    node: s.node.clone(),
                    source,
                });
            }
        }
    }
    if let Some(owner) = &s.suspect_taint_owner {
        super::taint::apply(api, &s.node, owner, s.judgement).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn api_error(code: u16) -> kube::Error {
        let mut status = kube::core::Status::failure("x", "x");
        status.code = code;
        kube::Error::Api(status.boxed())
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_that_fails_twice_is_tried_a_third_time() {
        let calls = AtomicU32::new(0);
        let r = retrying(|| async {
            match calls.fetch_add(1, Ordering::SeqCst) {
                0 | 1 => Err(api_error(500)),
                _ => Ok(7),
            }
        })
        .await;
        assert_eq!(r.ok(), Some(7));
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_is_given_up_after_three_tries_or_at_once_when_retrying_cannot_help() {
        let calls = AtomicU32::new(0);
        let r: Result<(), _> = retrying(|| async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(api_error(503))
        })
        .await;
        assert!(r.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        let calls = AtomicU32::new(0);
        let r: Result<(), _> = retrying(|| async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err(api_error(404))
        })
        .await;
        assert!(r.is_err());
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }
}
