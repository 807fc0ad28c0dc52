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
mod tests {
    use super::*;

    fn time(at: &str) -> Time {
        Time(at.parse().expect("time"))
    }

    #[test]
    fn a_node_with_a_gpu_out_of_service_names_it_and_why_without_reading_as_failed() {
        let health = NodeHealth {
            node: "dra-01".into(),
            standing: Standing::GpusOutOfService { gpus: vec![3, 6] },
            tainted_gpus: vec![
                gpufabric_api::device_taint::TaintedGpu {
                    gpu: 3,
                    device: "gpu.nvidia.com/dra-01/gpu-3".into(),
                    rule: "gpufabric-gpu-x7k2p".into(),
                    reason: "GPU 3 computes a step 1.5x slower than the node's other GPUs".into(),
                    since: None,
                },
                gpufabric_api::device_taint::TaintedGpu {
                    gpu: 6,
                    device: "gpu.nvidia.com/dra-01/gpu-6".into(),
                    rule: "gpufabric-gpu-b2c4d".into(),
                    reason: "memory bandwidth 2.10 TB/s, 38% under its peers".into(),
                    since: None,
                },
            ],
            ..Default::default()
        };
        let entry = TestStanding {
            standing: health.standing.clone(),
            run: "gpus-2".into(),
            detail: Some(gpus_out_detail(&health)),
        };
        let t = time("2026-01-01T00:00:00Z");
        let (condition, _, metadata) = for_node(None, "gpus", &entry, true, &t, &t);
        let c = condition.expect("a condition");
        assert_eq!(c.status, "False", "the node as a node is not degraded");
        assert_eq!(c.reason.as_deref(), Some("GPUsOutOfService"));
        assert_eq!(
            c.message.as_deref(),
            Some(
                "FabricTest gpus, run gpus-2: GPUs 3, 6 out of service by DRA device taints, the node stays schedulable: GPU 3 computes a step 1.5x slower than the node's other GPUs; GPU 6: memory bandwidth 2.10 TB/s, 38% under its peers"
            )
        );
        let metadata = metadata.expect("metadata");
        assert_eq!(metadata["metadata"]["labels"][keys::LABEL_RESULT], "pass");
    }

    #[test]
    fn a_run_that_did_not_measure_the_node_leaves_its_signals_as_they_are() {
        let passed = TestStanding {
            standing: Standing::Passing,
            run: "nightly-1".into(),
            detail: None,
        };
        let (t1, t2) = (time("2026-01-01T00:00:00Z"), time("2026-01-02T00:00:00Z"));
        let (condition, _, metadata) = for_node(None, "nightly", &passed, true, &t1, &t1);
        let metadata = metadata.expect("metadata");
        let record = metadata["metadata"]["annotations"][keys::ANNOTATION_STANDING]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let mut node = Node::default();
        node.metadata.labels = Some([(keys::LABEL_RESULT.to_string(), "pass".to_string())].into());
        node.metadata.annotations = Some(
            [
                (keys::ANNOTATION_STANDING.to_string(), record),
                (
                    keys::ANNOTATION_LAST_PASS.to_string(),
                    "2026-01-01T00:00:00Z".to_string(),
                ),
            ]
            .into(),
        );
        node.status = Some(k8s_openapi::api::core::v1::NodeStatus {
            conditions: Some(vec![condition.expect("a condition")]),
            ..Default::default()
        });
        let busy = TestStanding {
            run: "nightly-2".into(),
            detail: Some("busy GPUs".into()),
            ..passed.clone()
        };
        let (condition, _, metadata) = for_node(Some(&node), "nightly", &busy, false, &t2, &t2);
        assert_eq!(condition, None, "the condition stays as it is");
        assert_eq!(metadata, None, "the record and label stay as they are");
        let (condition, _, _) = for_node(Some(&node), "nightly", &busy, true, &t2, &t2);
        assert!(
            condition.is_some(),
            "a measurement writes the condition again"
        );
    }

    #[test]
    fn a_signal_decided_before_the_node_changed_is_decided_again_from_the_cache() {
        let t1 = time("2026-01-01T00:00:00Z");
        let passed = TestStanding {
            standing: Standing::Passing,
            run: "nightly-1".into(),
            detail: None,
        };
        let mut node = Node::default();
        node.metadata.name = Some("n1".into());
        node.metadata.resource_version = Some("1".into());
        let (condition, remove_legacy, metadata) =
            for_node(Some(&node), "nightly", &passed, true, &t1, &t1);
        let signal = NodeSignal {
            node: "n1".into(),
            test: "nightly".into(),
            entry: passed,
            passed_at: t1.clone(),
            measured: true,
            condition,
            remove_legacy,
            metadata: metadata.map(|m| m.to_string()),
            suspect_taint_owner: None,
            resource_version: node.metadata.resource_version.clone(),
        };
        // Unchanged node: the signal as decided.
        assert_eq!(fresher(signal.clone(), &node), signal);
        // The run's counters record changed the node since: the patch is guarded by the new
        // resourceVersion, so the API server takes it at the first try.
        node.metadata.resource_version = Some("2".into());
        node.metadata.annotations =
            Some([("gpufabric.io/nvlink-counters".to_string(), "{}".to_string())].into());
        let again = fresher(signal, &node);
        let patch: Value =
            serde_json::from_str(again.metadata.as_deref().unwrap_or_default()).expect("json");
        assert_eq!(patch["metadata"]["resourceVersion"], "2");
        assert_eq!(
            again.resource_version.as_deref(),
            Some("2"),
            "the condition is written under the resourceVersion it was decided again from"
        );
        assert!(
            patch["metadata"]["annotations"][keys::ANNOTATION_STANDING].is_string(),
            "{patch}"
        );
    }

    use std::sync::atomic::{AtomicU32, Ordering};

    /// A node "n1" at `rv` whose record holds `standings`.
    fn node_json(rv: &str, standings: &NodeStandings, t: &Time) -> Value {
        let mut n = node::metadata_values(standings, false, t);
        n["metadata"]["name"] = serde_json::json!("n1");
        n["metadata"]["resourceVersion"] = serde_json::json!(rv);
        n["apiVersion"] = serde_json::json!("v1");
        n["kind"] = serde_json::json!("Node");
        n
    }

    #[tokio::test]
    async fn a_condition_write_that_loses_a_race_to_another_test_writes_what_the_record_says_then()
    {
        use crate::controller::fake_api::{self, Expect};
        use http::{Method, StatusCode};
        let t = time("2026-01-02T00:00:00Z");
        let passed = TestStanding {
            standing: Standing::Passing,
            run: "quick-1".into(),
            detail: None,
        };
        // The quick test passed n1 and decided its condition from a record of its own.
        let (condition, remove_legacy, metadata) = for_node(None, "quick", &passed, true, &t, &t);
        let signal = NodeSignal {
            node: "n1".into(),
            test: "quick".into(),
            entry: passed.clone(),
            passed_at: t.clone(),
            measured: true,
            condition,
            remove_legacy,
            metadata: metadata.map(|m| m.to_string()),
            suspect_taint_owner: None,
            resource_version: None,
        };
        let mut own = NodeStandings::default();
        own.set("quick", passed.clone());
        // Between its two writes, the nightly test wrote its quarantine into the record.
        let mut both = own.clone();
        both.set(
            "nightly",
            TestStanding {
                standing: Standing::Quarantined { hardware: false },
                run: "nightly-3".into(),
                detail: Some("GPU 3 slow".into()),
            },
        );
        let (client, handle) = fake_api::client();
        let server = fake_api::serve(
            handle,
            vec![
                Expect::new(
                    Method::PATCH,
                    "/api/v1/nodes/n1",
                    StatusCode::OK,
                    node_json("2", &own, &t),
                ),
                Expect::new(
                    Method::PATCH,
                    "/api/v1/nodes/n1/status",
                    StatusCode::CONFLICT,
                    fake_api::status(409, "Conflict"),
                ),
                Expect::new(
                    Method::GET,
                    "/api/v1/nodes/n1",
                    StatusCode::OK,
                    node_json("3", &both, &t),
                ),
                Expect::new(
                    Method::PATCH,
                    "/api/v1/nodes/n1/status",
                    StatusCode::OK,
                    node_json("4", &both, &t),
                ),
            ],
        );
        let api: Api<Node> = Api::all(client);
        let written = write_one(&api, &signal).await;
        drop(api);
        let seen = server.await.expect("the scripted server");
        assert!(written.is_ok(), "{written:?}");
        assert!(
            seen.unexpected.is_empty() && seen.missing.is_empty(),
            "{seen:#?}"
        );
        let first = &seen.requests[1].body;
        assert_eq!(
            first["metadata"]["resourceVersion"], "2",
            "guarded: {first}"
        );
        assert_eq!(first["status"]["conditions"][0]["status"], "False");
        let again = &seen.requests[3].body;
        assert_eq!(
            again["metadata"]["resourceVersion"], "3",
            "guarded: {again}"
        );
        let c = &again["status"]["conditions"][0];
        assert_eq!(
            c["status"], "True",
            "the nightly's quarantine is kept: {again}"
        );
        let message = c["message"].as_str().unwrap_or_default();
        assert!(message.contains("nightly"), "{message}");
    }

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
