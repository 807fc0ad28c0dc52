//! The order of a fold's writes against an API server that answers every request: the
//! quarantine and the test's status never wait for the node signals, and signals lost to
//! a restart between are written by the next look.

use super::fabrictest as ft;
use crate::context::Context;
use crate::time::to_time;
use chrono::Utc;
use gpufabric_api::keys;
use gpufabric_api::policy::QuarantineMode;
use gpufabric_api::run::{
    FabricTestRun, FabricTestRunSpec, FabricTestRunStatus, NodeRunResult, NodeVerdict, RunPhase,
    Trigger,
};
use gpufabric_api::test::{FabricTest, FabricTestSpec, FabricTestStatus};
use http::{Method, Request, Response, StatusCode};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Client;
use kube::client::Body;
use kube::runtime::{reflector, watcher};
use serde_json::{Value, json};
use std::sync::{Arc, Mutex};

const NODES: usize = 10;

/// One request the operator made: method, path and body.
#[derive(Clone, Debug)]
struct Call {
    method: Method,
    path: String,
    body: Value,
}

impl Call {
    /// A write of the node signals: the condition, or the standing record in the metadata.
    fn is_signal(&self) -> bool {
        self.method == Method::PATCH
            && self.path.starts_with("/api/v1/nodes/")
            && (self.path.ends_with("/status")
                || self.body["metadata"]["annotations"][keys::ANNOTATION_STANDING].is_string())
    }

    /// The cordon of `node`.
    fn cordons(&self, node: &str) -> bool {
        self.method == Method::PATCH
            && self.path == format!("/api/v1/nodes/{node}")
            && self.body["spec"]["unschedulable"] == json!(true)
    }

    fn writes_test_status(&self) -> bool {
        self.method == Method::PATCH && self.path.ends_with("/fabrictests/fleet/status")
    }
}

fn node(name: &str) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "resourceVersion": "1", "uid": format!("uid-{name}")},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}, "capacity": {"nvidia.com/gpu": "8"}}
    }))
    .unwrap_or_default()
}

/// The test "fleet": cordons after one confirmed failure, no confirmation run, a budget of
/// half the fleet; its status as `status`.
fn fleet_test(status: Option<FabricTestStatus>) -> FabricTest {
    let mut spec = FabricTestSpec::default();
    spec.quarantine.mode = QuarantineMode::Cordon;
    spec.quarantine.confirm_retest = false;
    spec.quarantine.failures_to_quarantine = 1;
    spec.quarantine.storm_threshold_percent = 100;
    spec.quarantine.max_quarantined =
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("50%".into());
    let mut t = FabricTest::new("fleet", spec);
    t.metadata.uid = Some("uid-fleet".into());
    t.metadata.generation = Some(1);
    t.metadata.resource_version = Some("5".into());
    t.metadata.finalizers = Some(vec![keys::FINALIZER.to_string()]);
    t.metadata.creation_timestamp = Some(to_time(Utc::now() - chrono::Duration::hours(2)));
    t.status = status;
    t
}

/// A run of "fleet" that finished a minute ago: `bad` failed, every other node passed.
fn finished_run(bad: &str) -> FabricTestRun {
    let mut r = FabricTestRun::new(
        "fleet-1",
        FabricTestRunSpec::of_test(
            "fleet",
            &FabricTestSpec::default(),
            Trigger::Schedule,
            None,
            None,
        ),
    );
    r.metadata.uid = Some("uid-run".into());
    r.metadata.creation_timestamp = Some(to_time(Utc::now() - chrono::Duration::minutes(5)));
    r.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "gpufabric.io/v1alpha1".into(),
        kind: "FabricTest".into(),
        name: "fleet".into(),
        uid: "uid-fleet".into(),
        controller: Some(true),
        ..Default::default()
    }]);
    let nodes: Vec<NodeRunResult> = (0..NODES)
        .map(|i| {
            let name = format!("n{i}");
            let verdict = if name == bad {
                NodeVerdict::Failed
            } else {
                NodeVerdict::Passed
            };
            serde_json::from_value(json!({"node": name, "verdict": verdict,
                "finding": (name == bad).then_some("GPU 3 slow")}))
            .unwrap_or_default()
        })
        .collect();
    r.status = Some(FabricTestRunStatus {
        phase: RunPhase::Succeeded,
        start_time: Some(to_time(Utc::now() - chrono::Duration::minutes(4))),
        completion_time: Some(to_time(Utc::now() - chrono::Duration::minutes(1))),
        node_count: NODES as u32,
        passed: NODES as u32 - 1,
        failed: 1,
        nodes,
        ..Default::default()
    });
    r
}

/// The cluster's nodes as the API server holds them, and whether it refuses every write of
/// a node signal (as an admission policy would).
#[derive(Default)]
struct Fleet {
    nodes: Vec<Value>,
    refuse_signals: bool,
}

/// What the API server answers `call`, with the nodes as `fleet` holds them (a node patch
/// is merged into its node and returned under a new resourceVersion).
fn answer(call: &Call, test: &FabricTest, fleet: &Mutex<Fleet>) -> (StatusCode, Value) {
    let list = |kind: &str, items: Vec<Value>| json!({"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": "9"}, "items": items});
    let mut fleet = fleet.lock().unwrap_or_else(|e| e.into_inner());
    if fleet.refuse_signals && call.is_signal() {
        return (
            StatusCode::FORBIDDEN,
            super::fake_api::status(403, "Forbidden"),
        );
    }
    let nodes = &mut fleet.nodes;
    let path = call.path.as_str();
    if let Some(name) = path.strip_prefix("/api/v1/nodes/") {
        let name = name.trim_end_matches("/status");
        let Some(n) = nodes.iter_mut().find(|n| n["metadata"]["name"] == name) else {
            return (
                StatusCode::NOT_FOUND,
                super::fake_api::status(404, "NotFound"),
            );
        };
        if call.method == Method::PATCH {
            merge(n, &call.body);
            let rv = n["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(1);
            n["metadata"]["resourceVersion"] = json!((rv + 1).to_string());
        }
        return (StatusCode::OK, n.clone());
    }
    match (call.method.clone(), path) {
        (Method::GET, "/api/v1/nodes") => (StatusCode::OK, list("NodeList", nodes.clone())),
        // Discovery: a cluster that serves no resource.k8s.io (no DRA), as /apis always answers.
        (Method::GET, "/apis") => (
            StatusCode::OK,
            json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []}),
        ),
        (Method::GET, p) if p.ends_with("/fabrictests/fleet") => (
            StatusCode::OK,
            serde_json::to_value(test).unwrap_or_default(),
        ),
        (Method::GET, p) if p.ends_with("/fabrictestruns") || p.ends_with("/pods") => {
            (StatusCode::OK, list("List", Vec::new()))
        }
        (Method::POST, _) => (StatusCode::CREATED, call.body.clone()),
        (Method::PATCH, _) => (
            StatusCode::OK,
            serde_json::to_value(test).unwrap_or_default(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            super::fake_api::status(404, "NotFound"),
        ),
    }
}

/// A JSON merge patch (RFC 7386) of `patch` into `target`, with a strategic list of
/// conditions replaced whole.
fn merge(target: &mut Value, patch: &Value) {
    match (target.as_object_mut(), patch.as_object()) {
        (Some(t), Some(p)) => {
            for (k, v) in p {
                if k.starts_with('$') {
                    continue;
                }
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        _ => *target = patch.clone(),
    }
}

/// One reconcile of `test` by a fresh operator (or one that ran before: `ctx`) over
/// `nodes` and `runs`; every request made, in order.
async fn reconcile(
    test: &FabricTest,
    runs: Vec<FabricTestRun>,
    nodes: &Arc<Mutex<Fleet>>,
    ctx: Option<Arc<Context>>,
) -> (Vec<Call>, Arc<Context>) {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let ctx = match ctx {
        Some(c) => Arc::new(Context {
            events: crate::events::Events::new(
                client.clone(),
                crate::events::Reporter::from("gpufabric"),
            ),
            client,
            ..(*c).clone()
        }),
        None => {
            let (node_store, mut node_writer) = reflector::store();
            for n in nodes.lock().unwrap_or_else(|e| e.into_inner()).nodes.iter() {
                let n: Node = serde_json::from_value(n.clone()).unwrap_or_default();
                node_writer.apply_watcher_event(&watcher::Event::Apply(n));
            }
            let (run_store, mut run_writer) = reflector::store();
            for r in runs {
                run_writer.apply_watcher_event(&watcher::Event::Apply(r));
            }
            Context::for_tests(
                client,
                node_store,
                reflector::store().0,
                run_store,
                reflector::store().0,
            )
        }
    };
    let served = {
        let test = test.clone();
        let nodes = nodes.clone();
        tokio::spawn(async move {
            let mut calls = Vec::new();
            while let Some((request, respond)) = handle.next_request().await {
                let method = request.method().clone();
                let path = request.uri().path().to_string();
                let bytes = request
                    .into_body()
                    .collect_bytes()
                    .await
                    .unwrap_or_default();
                let call = Call {
                    method,
                    path,
                    body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                };
                let (code, body) = answer(&call, &test, &nodes);
                if !call.path.contains("/events") {
                    calls.push(call);
                }
                if let Ok(r) = Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&body).unwrap_or_default()))
                {
                    respond.send_response(r);
                }
            }
            calls
        })
    };
    let result = ft::reconcile(Arc::new(test.clone()), ctx.clone()).await;
    assert!(result.is_ok(), "{result:?}");
    // The context's client is the last one left: dropping a copy of it without the client
    // ends the server.
    let kept = Arc::new(Context {
        client: Client::new(
            tower_test::mock::pair::<Request<Body>, Response<Body>>().0,
            "default",
        ),
        events: crate::events::Events::new(
            Client::new(
                tower_test::mock::pair::<Request<Body>, Response<Body>>().0,
                "default",
            ),
            crate::events::Reporter::from("gpufabric"),
        ),
        ..(*ctx).clone()
    });
    drop(ctx);
    let calls = served.await.unwrap_or_default();
    (calls, kept)
}

fn fleet() -> Arc<Mutex<Fleet>> {
    Arc::new(Mutex::new(Fleet {
        nodes: (0..NODES)
            .map(|i| serde_json::to_value(node(&format!("n{i}"))).unwrap_or_default())
            .collect(),
        refuse_signals: false,
    }))
}

fn signal_writes(calls: &[Call]) -> Vec<&str> {
    let mut nodes: Vec<&str> = calls
        .iter()
        .filter(|c| c.is_signal())
        .filter_map(|c| c.path.strip_prefix("/api/v1/nodes/"))
        .map(|p| p.trim_end_matches("/status"))
        .collect();
    nodes.sort();
    nodes.dedup();
    nodes
}

/// The test's status as the first write of it in `calls` set it.
fn written_status(calls: &[Call]) -> Option<FabricTestStatus> {
    let c = calls.iter().find(|c| c.writes_test_status())?;
    serde_json::from_value(c.body["status"].clone()).ok()
}

#[tokio::test]
async fn the_cordon_and_the_tests_status_come_before_any_node_signal() {
    let nodes = fleet();
    let t = fleet_test(None);
    let (calls, _) = reconcile(&t, vec![finished_run("n3")], &nodes, None).await;
    let at = |what: &dyn Fn(&Call) -> bool| calls.iter().position(what);
    let cordon = at(&|c| c.cordons("n3")).expect("n3 is cordoned");
    let status = at(&|c| c.writes_test_status()).expect("the test's status is written");
    let first_signal = at(&|c| c.is_signal()).expect("the node signals are written");
    assert!(
        cordon < first_signal && status < first_signal,
        "cordon at {cordon}, status at {status}, first signal at {first_signal}: {:#?}",
        calls
            .iter()
            .map(|c| format!("{} {}", c.method, c.path))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        signal_writes(&calls).len(),
        NODES,
        "every tested node gets its signals after the status"
    );
    let status = written_status(&calls).expect("a status");
    assert_eq!(status.quarantined_count, 1);
}

#[tokio::test]
async fn signals_lost_between_the_status_and_their_write_are_written_by_the_next_operator() {
    let nodes = fleet();
    let run = finished_run("n3");
    // The signal writes are refused: the quarantine and the status are not held up.
    nodes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .refuse_signals = true;
    let (calls, _) = reconcile(&fleet_test(None), vec![run.clone()], &nodes, None).await;
    assert!(calls.iter().any(|c| c.cordons("n3")), "n3 is cordoned");
    let status = written_status(&calls).expect("the status is written");
    assert_eq!(status.quarantined_count, 1);
    assert_eq!(
        status.last_run.as_ref().map(|l| l.name.as_str()),
        Some("fleet-1")
    );
    // A new operator (a restart, a new leader) finds the run folded and the signals missing.
    nodes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .refuse_signals = false;
    let t = fleet_test(Some(status));
    let (calls, ctx) = reconcile(&t, vec![run.clone()], &nodes, None).await;
    assert!(
        !calls.iter().any(|c| c.cordons("n3")),
        "the run is not folded twice"
    );
    let expected: Vec<String> = (0..NODES).map(|i| format!("n{i}")).collect();
    assert_eq!(
        signal_writes(&calls),
        expected,
        "every node of the folded run gets its signals"
    );
    let n3 = nodes
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .nodes
        .iter()
        .find(|n| n["metadata"]["name"] == "n3")
        .cloned()
        .unwrap_or_default();
    assert_eq!(n3["metadata"]["labels"][keys::LABEL_RESULT], "fail", "{n3}");
    // The same operator looks again: nothing to write.
    let (calls, _) = reconcile(&t, vec![run.clone()], &nodes, Some(ctx)).await;
    assert_eq!(signal_writes(&calls), Vec::<&str>::new());
    // Another new operator decides them again and finds every node written.
    let (calls, _) = reconcile(&t, vec![run], &nodes, None).await;
    assert_eq!(
        signal_writes(&calls),
        Vec::<&str>::new(),
        "signals already written are not written again"
    );
}
