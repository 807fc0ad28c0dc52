//! Tests of the node signals' writer: what each standing writes, and when it writes.

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
async fn a_condition_write_that_loses_a_race_to_another_test_writes_what_the_record_says_then() {
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
