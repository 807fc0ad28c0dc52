//! Writes the node signals of a judged run: for every node the run tested, the
//! `GPUFabricDegraded` condition (a strategic merge patch of `nodes/status`, which also
//! deletes a `GPUFabricHealthy` condition of 0.2.0 a FabricTest wrote) and the result label
//! and last-pass annotation (a merge patch of gpufabric's own keys). A node that cannot be
//! written is reported; it never stops the others nor the reconcile.

use super::SignalError;
use super::node;
use crate::time::now;
use futures::StreamExt;
use gpufabric_api::keys;
use gpufabric_api::policy::QuarantineMode;
use gpufabric_api::run::{FabricTestRun, NodeRunResult, NodeVerdict};
use gpufabric_api::standing::Standing;
use gpufabric_api::standings::{NodeStandings, TestStanding};
use gpufabric_api::test::{FabricTest, NodeHealth};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use serde_json::Value;
use std::collections::BTreeMap;

/// Nodes written at once.
pub const WRITE_CONCURRENCY: usize = 16;

/// One node's signals, decided before anything is written.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeSignal {
    pub node: String,
    /// The test (its name) whose run decided these signals.
    pub test: String,
    /// This test's standing of the node, with its run and why: the node's record gets it,
    /// and the node's condition and label read the worst standing across the record.
    pub entry: TestStanding,
    /// When the run passed the node (the last-pass time).
    pub passed_at: Time,
    /// Whether the run measured the node (see [`for_node`]).
    pub measured: bool,
    /// The condition to write; None: the node keeps the one it has.
    pub condition: Option<k8s_openapi::api::core::v1::NodeCondition>,
    /// Delete the node's `GPUFabricHealthy` condition, which a FabricTest of gpufabric
    /// 0.2.0 wrote: the condition above replaces it.
    pub remove_legacy: bool,
    /// The metadata merge patch, as JSON text (a fleet's worth of them is held between
    /// deciding and writing: text is a tenth of the parsed form); None: labels and
    /// annotations are already right.
    pub metadata: Option<String>,
    /// With graduated taints, the test (`<namespace>/<name>`) that owns the suspect taint.
    pub suspect_taint_owner: Option<String>,
    /// The node's resourceVersion these signals were decided from: the condition is written
    /// under it (or under the one the metadata write returned).
    pub resource_version: Option<String>,
}

/// What writing the signals of one run did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Published {
    /// This test's standing per node, for logs and tests.
    pub judged: BTreeMap<String, Standing>,
    /// Nodes whose signals could not be written, with why.
    pub failures: Vec<String>,
}

/// The node's record with `test`'s `entry` in it, and whether that changed the record. A
/// run that did not measure the node (`measured` false) and left its standing as it was
/// leaves the entry (its run and why) as the measurement that decided it wrote it.
fn record_with(
    node: Option<&Node>,
    test: &str,
    entry: &TestStanding,
    measured: bool,
) -> (NodeStandings, bool) {
    let mut standings = node::standings_of(node);
    let kept = !measured
        && standings
            .tests
            .get(test)
            .is_some_and(|e| e.standing == entry.standing);
    if kept {
        return (standings, false);
    }
    let before = standings.clone();
    standings.set(test, entry.clone());
    let changed = standings != before;
    (standings, changed)
}

/// The condition and the metadata patch of `node` once `test`'s `entry` is in its record
/// ([`record_with`]), and whether a `GPUFabricHealthy` condition of 0.2.0 this test wrote
/// goes. A record left as it was leaves the node's condition as it is. Pure.
pub fn for_node(
    node: Option<&Node>,
    test: &str,
    entry: &TestStanding,
    measured: bool,
    passed_at: &Time,
    stamp: &Time,
) -> (
    Option<k8s_openapi::api::core::v1::NodeCondition>,
    bool,
    Option<Value>,
) {
    let (standings, changed) = record_with(node, test, entry, measured);
    // A node that still carries the condition of 0.2.0 this test wrote (an old replica's
    // last write) has it as its current one, turned over; kept (not measured), it is
    // written under the new type.
    let legacy = node::legacy_condition(node).filter(|c| node::writer(c) == Some(test));
    let migrated = match node::current_condition(node) {
        Some(_) => None,
        None => legacy.map(|l| node::from_legacy(l, stamp)),
    };
    let present = node::current_condition(node).or(migrated.as_ref());
    let condition = (changed || present.is_none())
        .then(|| standings.worst().zip(standings.message()))
        .flatten()
        .and_then(|((worst, _), message)| node::condition(worst, &message, present, stamp))
        .or_else(|| migrated.clone());
    let passed = measured && entry.standing == Standing::Passing;
    let metadata = node::metadata_patch(node, &standings, passed, passed_at);
    (condition, legacy.is_some(), metadata)
}

/// Why the node's GPUs are out of service, for its condition's message: each one's
/// finding, prefixed with the GPU where the finding does not name it first.
fn gpus_out_detail(health: &NodeHealth) -> String {
    health
        .tainted_gpus
        .iter()
        .map(|g| {
            if g.reason.starts_with(&format!("GPU {} ", g.gpu)) {
                g.reason.clone()
            } else {
                format!("GPU {}: {}", g.gpu, g.reason)
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The signals of every node `run` tested, from every node's result (`results`: all of
/// the run's shards, not the bounded run status) and the standing each has in the test's
/// history after the run was folded (`history`). Pure.
pub fn decide(
    test: &FabricTest,
    run: &FabricTestRun,
    results: &[NodeRunResult],
    history: &[NodeHealth],
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
    let test_name = test.name_any();
    let run_name = run.name_any();
    let q = &test.spec.quarantine;
    let taint_owner = (q.graduated_taints && q.mode != QuarantineMode::Observe)
        .then(|| crate::quarantine::test_key(test).ok())
        .flatten();
    results
        .iter()
        .filter(|entry| entry.verdict.is_final())
        .filter_map(|entry| {
            let health = by_node.get(entry.node.as_str()).copied()?;
            let detail = match entry.verdict {
                // The GPUs out of service, each with the finding that took it out.
                _ if !health.tainted_gpus.is_empty() => Some(gpus_out_detail(health)),
                NodeVerdict::NotMeasured => entry.reason.clone(),
                _ => health.last_finding.clone().or(entry.reason.clone()),
            };
            let standing = TestStanding {
                standing: health.standing.clone(),
                run: run_name.clone(),
                detail,
            };
            let current = nodes.get(&ObjectRef::new(&entry.node));
            let measured = entry.verdict.is_measured();
            let (condition, remove_legacy, metadata) = for_node(
                current.as_deref(),
                &test_name,
                &standing,
                measured,
                &passed_at,
                &stamp,
            );
            Some(NodeSignal {
                node: entry.node.clone(),
                test: test_name.clone(),
                entry: standing,
                passed_at: passed_at.clone(),
                measured,
                condition,
                remove_legacy,
                metadata: metadata.map(|p| p.to_string()),
                suspect_taint_owner: taint_owner.clone(),
                resource_version: current.and_then(|n| n.metadata.resource_version.clone()),
            })
        })
        .collect()
}

/// Writes `signals`, [`WRITE_CONCURRENCY`] nodes at once. A node that is gone is skipped.
/// Each node's signals are decided again just before they are written when the cache
/// (`nodes`) holds a newer Node than they were decided from (the run's own error counters,
/// written at its verdict, change every node at the same time): a guarded patch decided from
/// the older one would be refused and cost a read and a second patch.
pub async fn write(client: &Client, nodes: &Store<Node>, signals: Vec<NodeSignal>) -> Published {
    let api: Api<Node> = Api::all(client.clone());
    let judged = signals
        .iter()
        .map(|s| (s.node.clone(), s.entry.standing.clone()))
        .collect();
    let failures: Vec<String> = futures::stream::iter(signals)
        .map(|s| {
            let api = api.clone();
            let cached = nodes.get(&ObjectRef::new(&s.node));
            async move {
                let s = match cached {
                    Some(node) => fresher(s, &node),
                    None => s,
                };
                write_one(&api, &s).await.err().map(|e| e.to_string())
            }
        })
        .buffer_unordered(WRITE_CONCURRENCY)
        .filter_map(|e| async move { e })
        .collect()
        .await;
    Published { judged, failures }
}

/// `s` decided again from `node` when its metadata patch is guarded by an older
/// resourceVersion than `node`'s; else as it is. Pure.
fn fresher(mut s: NodeSignal, node: &Node) -> NodeSignal {
    let Some(text) = &s.metadata else {
        return s;
    };
    let Ok(patch) = serde_json::from_str::<Value>(text) else {
        return s;
    };
    let decided = patch["metadata"]["resourceVersion"].as_str();
    let now = node.metadata.resource_version.as_deref();
    if decided.is_none() || decided == now {
        return s;
    }
    let stamp = crate::time::now();
    let (condition, legacy, _) = for_node(
        Some(node),
        &s.test,
        &s.entry,
        s.measured,
        &s.passed_at,
        &stamp,
    );
    let (standings, _) = record_with(Some(node), &s.test, &s.entry, s.measured);
    let values = node::metadata_values(
        &standings,
        s.measured && s.entry.standing == Standing::Passing,
        &s.passed_at,
    );
    s.metadata =
        Some(node::redecided(patch, &values, node.metadata.resource_version.clone()).to_string());
    s.condition = condition;
    s.remove_legacy = legacy;
    s.resource_version = node.metadata.resource_version.clone();
    s
}

/// Waits before the second and third tries of a signal write.
pub const RETRY_DELAYS: [std::time::Duration; 2] = [
    std::time::Duration::from_millis(500),
    std::time::Duration::from_secs(2),
];

/// Whether another try of the same request may succeed: not for a node that is gone, a
/// request the API server refuses as invalid, a missing permission, or a node changed since
/// the patch was decided (decided again instead).
fn worth_retrying(e: &kube::Error) -> bool {
    !matches!(e, kube::Error::Api(s) if matches!(s.code, 400 | 403 | 404 | 409 | 422))
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

/// Tries of a metadata patch whose node changed since it was decided.
const METADATA_ATTEMPTS: usize = 3;

/// Writes one node's signals: the metadata first, under the resourceVersion it was decided
/// from (another test may write its standing into the same record at the same time: on a
/// conflict the node is read again and the record, label and condition decided again), then
/// the condition, then the suspect taint.
async fn write_one(api: &Api<Node>, s: &NodeSignal) -> Result<(), SignalError> {
    let pp = PatchParams {
        field_manager: Some(keys::MANAGER.to_string()),
        ..Default::default()
    };
    let mut condition = s.condition.clone();
    let mut remove_legacy = s.remove_legacy;
    let mut resource_version = s.resource_version.clone();
    if let Some(m) = &s.metadata {
        let mut patch: Value =
            serde_json::from_str(m).map_err(|source| SignalError::LabelPatch {
                node: s.node.clone(),
                source,
            })?;
        for attempt in 1..=METADATA_ATTEMPTS {
            let merge = Patch::Merge(&patch);
            match retrying(|| api.patch(&s.node, &pp, &merge)).await {
                Ok(written) => {
                    resource_version = written.metadata.resource_version;
                    break;
                }
                Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
                Err(kube::Error::Api(e)) if e.code == 409 && attempt < METADATA_ATTEMPTS => {
                    let fresh = match api.get_opt(&s.node).await {
                        Ok(Some(n)) => n,
                        Ok(None) => return Ok(()),
                        Err(source) => {
                            return Err(SignalError::Label {
                                node: s.node.clone(),
                                source,
                            });
                        }
                    };
                    let stamp = now();
                    let (c, legacy, _) = for_node(
                        Some(&fresh),
                        &s.test,
                        &s.entry,
                        s.measured,
                        &s.passed_at,
                        &stamp,
                    );
                    condition = c;
                    remove_legacy = legacy;
                    let (standings, _) = record_with(Some(&fresh), &s.test, &s.entry, s.measured);
                    let values = node::metadata_values(
                        &standings,
                        s.measured && s.entry.standing == Standing::Passing,
                        &s.passed_at,
                    );
                    patch = node::redecided(patch, &values, fresh.metadata.resource_version);
                }
                Err(source) => {
                    return Err(SignalError::Label {
                        node: s.node.clone(),
                        source,
                    });
                }
            }
        }
    }
    if let Some(patch) = node::status_patch(condition.as_ref(), remove_legacy) {
        let patch = node::guarded(patch, resource_version);
        write_status(api, &pp, &s.node, patch, remove_legacy)
            .await
            .map_err(|source| SignalError::Condition {
                node: s.node.clone(),
                source,
            })?;
    }
    if let Some(owner) = &s.suspect_taint_owner {
        super::taint::apply(api, &s.node, owner, &s.entry.standing).await?;
    }
    Ok(())
}

/// Tries of a condition write whose node changed since it was decided.
const STATUS_ATTEMPTS: usize = 3;

/// Writes the node's condition with `patch` (a strategic merge patch of `nodes/status`
/// guarded by a resourceVersion): another test may have changed the node's standing record
/// since the condition was decided, so on a conflict the node is read again and the
/// condition its record says now is written instead, under the new resourceVersion. A node
/// that is gone is fine.
pub(super) async fn write_status(
    api: &Api<Node>,
    pp: &PatchParams,
    name: &str,
    mut patch: Value,
    remove_legacy: bool,
) -> Result<(), kube::Error> {
    for attempt in 1..=STATUS_ATTEMPTS {
        let strategic = Patch::Strategic(&patch);
        match retrying(|| api.patch_status(name, pp, &strategic)).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 && attempt < STATUS_ATTEMPTS => {
                let Some(fresh) = api.get_opt(name).await? else {
                    return Ok(());
                };
                match node::status_patch_of_record(&fresh, remove_legacy, &now()) {
                    Some(p) => patch = p,
                    None => return Ok(()),
                }
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "apply_tests.rs"]
mod tests;
