//! The FabricTest controller's shell against a scripted API server: which requests one
//! reconcile makes, in which order, with which bodies, and what it returns.

use super::fake_api::{Expect, Transcript, client, serve, status};
use super::{error_policy, fabrictest as ft};
use crate::context::Context;
use crate::error::Error;
use crate::time::to_time;
use chrono::Utc;
use gpufabric_api::keys;
use gpufabric_api::run::{
    FabricTestRun, FabricTestRunSpec, FabricTestRunStatus, RunPhase, Trigger,
};
use gpufabric_api::test::{FabricTest, FabricTestSpec, FabricTestStatus};
use http::{Method, StatusCode};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::runtime::controller::Action;
use kube::runtime::{reflector, watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

const TESTS: &str = "/apis/gpufabric.io/v1alpha1/fabrictests";
const RUNS: &str = "/apis/gpufabric.io/v1alpha1/fabrictestruns";

fn context(client: Client, runs: Vec<FabricTestRun>) -> Arc<Context> {
    let (nodes, _) = reflector::store();
    let (pods, _) = reflector::store();
    let (run_store, mut writer) = reflector::store();
    for r in runs {
        writer.apply_watcher_event(&watcher::Event::Apply(r));
    }
    Context::for_tests(client, nodes, pods, run_store, reflector::store().0)
}

fn fabric_test(name: &str, spec: FabricTestSpec, status: Option<FabricTestStatus>) -> FabricTest {
    let mut t = FabricTest::new(name, spec);
    t.metadata.uid = Some("uid-1".into());
    t.metadata.generation = Some(1);
    t.metadata.resource_version = Some("5".into());
    t.metadata.finalizers = Some(vec![keys::FINALIZER.to_string()]);
    t.metadata.creation_timestamp = Some(to_time(Utc::now() - chrono::Duration::hours(2)));
    t.status = status;
    t
}

fn json_of<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// Runs one reconcile of `test` against `script`; what it returned and what was seen.
async fn reconcile(
    test: &FabricTest,
    runs: Vec<FabricTestRun>,
    script: Vec<Expect>,
) -> (Result<Action, Error>, Transcript) {
    let (client, handle) = client();
    let server = serve(handle, script);
    let ctx = context(client, runs);
    let result = ft::reconcile(Arc::new(test.clone()), ctx).await;
    let seen = server.await.unwrap_or_default();
    (result, seen)
}

fn condition<'a>(status: &'a Value, type_: &str) -> &'a Value {
    status["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .unwrap_or(&Value::Null)
}

/// The controller reads the FabricTest `t` first.
fn get_test(t: &FabricTest) -> Expect {
    Expect::new(
        Method::GET,
        &format!("{TESTS}/{}", t.name_any()),
        StatusCode::OK,
        json_of(t),
    )
}

/// The controller writes the status of `t`.
fn patch_test_status(t: &FabricTest) -> Expect {
    Expect::new(
        Method::PATCH,
        &format!("{TESTS}/{}/status", t.name_any()),
        StatusCode::OK,
        json_of(t),
    )
}

/// Every scripted call was made, and no other.
fn assert_every_call_as_scripted(seen: &Transcript) {
    assert!(
        seen.unexpected.is_empty() && seen.missing.is_empty(),
        "{seen:?}"
    );
}

#[tokio::test]
async fn a_new_test_without_a_schedule_creates_its_one_run_and_records_it() {
    let t = fabric_test("once", FabricTestSpec::default(), None);
    let (result, seen) = reconcile(
        &t,
        vec![],
        vec![
            get_test(&t),
            Expect::new(Method::POST, RUNS, StatusCode::CREATED, Value::Null),
            patch_test_status(&t),
        ],
    )
    .await;
    assert_eq!(result.expect("reconciled"), Action::await_change());
    assert_every_call_as_scripted(&seen);
    let run = &seen.requests[1].body;
    assert_eq!(run["spec"]["trigger"], "Creation");
    assert_eq!(run["metadata"]["labels"][keys::LABEL_TEST], "once");
    assert_eq!(run["metadata"]["ownerReferences"][0]["uid"], "uid-1");
    let status = &seen.requests[2].body["status"];
    assert_eq!(status["activeRun"], run["metadata"]["name"]);
    assert!(status["lastScheduleTime"].is_string(), "{status}");
    // Ready at once, before its run is judged; its health is not known yet.
    let ready = condition(status, "Ready");
    assert_eq!(
        (&ready["status"], &ready["reason"]),
        (&json!("True"), &json!("RunsOnce"))
    );
    let degraded = condition(status, "Degraded");
    assert_eq!(
        (&degraded["status"], &degraded["reason"]),
        (&json!("Unknown"), &json!("NoRunJudged"))
    );
    assert_eq!(seen.event_reasons(), vec!["RunCreated"]);
}

fn active_run(name: &str) -> FabricTestRun {
    let mut r = FabricTestRun::new(
        name,
        FabricTestRunSpec::of_test(
            "every",
            &FabricTestSpec::default(),
            Trigger::Schedule,
            None,
            None,
        ),
    );
    r.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "gpufabric.io/v1alpha1".into(),
        kind: "FabricTest".into(),
        name: "every".into(),
        uid: "uid-1".into(),
        controller: Some(true),
        ..Default::default()
    }]);
    r.status = Some(FabricTestRunStatus {
        phase: RunPhase::Running,
        ..Default::default()
    });
    r
}

#[tokio::test]
async fn forbid_with_a_run_active_starts_nothing_says_why_and_looks_again_at_the_next_time() {
    let spec = FabricTestSpec {
        schedule: Some("* * * * *".into()),
        ..FabricTestSpec::default()
    };
    let ran = FabricTestStatus {
        last_schedule_time: Some(to_time(Utc::now() - chrono::Duration::minutes(10))),
        ..Default::default()
    };
    let t = fabric_test("every", spec, Some(ran));
    let (result, seen) = reconcile(
        &t,
        vec![active_run("every-old")],
        vec![get_test(&t), patch_test_status(&t)],
    )
    .await;
    assert_every_call_as_scripted(&seen);
    let action = result.expect("reconciled");
    assert_ne!(
        action,
        Action::await_change(),
        "requeued at the next schedule time"
    );
    let status = &seen.requests[1].body["status"];
    assert_eq!(status["activeRun"], "every-old");
    assert!(status["nextScheduleTime"].is_string(), "{status}");
    assert_eq!(seen.event_reasons(), vec!["RunAlreadyActive"]);
}

#[tokio::test]
async fn an_invalid_spec_sets_ready_false_once_with_an_event_and_waits_for_a_change() {
    let spec = FabricTestSpec {
        schedule: Some("0 2 * * *".into()),
        time_zone: Some("Mars/Olympus_Mons".into()),
        ..FabricTestSpec::default()
    };
    let t = fabric_test("bad", spec, None);
    let (result, seen) = reconcile(&t, vec![], vec![get_test(&t), patch_test_status(&t)]).await;
    assert_eq!(result.expect("reconciled"), Action::await_change());
    assert_every_call_as_scripted(&seen);
    let ready = condition(&seen.requests[1].body["status"], "Ready");
    assert_eq!(
        (&ready["status"], &ready["reason"]),
        (&json!("False"), &json!("InvalidSpec"))
    );
    assert_eq!(seen.event_reasons(), vec!["InvalidSpec"]);
}

#[tokio::test]
async fn a_failing_reconcile_backs_off_and_reports_a_persistent_error_once() {
    let t = Arc::new(fabric_test("flaky", FabricTestSpec::default(), None));
    let script = (0..3)
        .map(|_| {
            Expect::new(
                Method::GET,
                &format!("{TESTS}/flaky"),
                StatusCode::INTERNAL_SERVER_ERROR,
                status(500, "InternalError"),
            )
        })
        .collect();
    let (client, handle) = client();
    let server = serve(handle, script);
    let ctx = context(client, vec![]);
    let mut waits = Vec::new();
    for _ in 0..3 {
        let error = ft::reconcile(t.clone(), ctx.clone())
            .await
            .expect_err("the API server fails");
        waits.push(error_policy(ft::CONTROLLER, &ctx, &error, &t));
    }
    assert_eq!(
        waits,
        vec![
            Action::requeue(Duration::from_secs(5)),
            Action::requeue(Duration::from_secs(10)),
            Action::requeue(Duration::from_secs(20)),
        ]
    );
    // The Event is published in the background: give it a moment, then close the client.
    tokio::time::sleep(Duration::from_millis(200)).await;
    drop(ctx);
    let seen = server.await.unwrap_or_default();
    assert!(seen.missing.is_empty(), "{seen:?}");
    assert_eq!(seen.event_reasons(), vec!["ReconcileError"]);
}

#[tokio::test]
async fn a_reset_closes_the_open_breaker_then_removes_its_annotation() {
    let opened = json!({
        "type": "BreakerOpen", "status": "True", "reason": "BreakerOpen",
        "message": "run every-1: 4 of 4 measured nodes failed (more than 50%): ...",
        "lastTransitionTime": "2026-11-23T02:00:00Z"
    });
    let ran = FabricTestStatus {
        last_schedule_time: Some(to_time(Utc::now() - chrono::Duration::minutes(10))),
        conditions: vec![serde_json::from_value(opened).expect("condition")],
        ..Default::default()
    };
    let mut t = fabric_test("every", FabricTestSpec::default(), Some(ran));
    t.metadata.annotations = Some(
        [(
            keys::ANNOTATION_RESET_BREAKER.to_string(),
            "fixed the driver".to_string(),
        )]
        .into(),
    );
    let (result, seen) = reconcile(
        &t,
        vec![],
        vec![
            get_test(&t),
            patch_test_status(&t),
            // The annotation goes only once the status records the reset.
            Expect::new(
                Method::PATCH,
                &format!("{TESTS}/every"),
                StatusCode::OK,
                json_of(&t),
            ),
        ],
    )
    .await;
    result.expect("reconciled");
    assert_every_call_as_scripted(&seen);
    let breaker = condition(&seen.requests[1].body["status"], "BreakerOpen");
    assert_eq!(breaker["status"], "False", "{breaker}");
    assert_eq!(breaker["reason"], "BreakerReset");
    let message = breaker["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("fixed the driver") && message.contains("4 of 4 measured nodes"),
        "{message}"
    );
    assert_eq!(
        seen.requests[2].body["metadata"]["annotations"][keys::ANNOTATION_RESET_BREAKER],
        Value::Null
    );
    assert!(
        seen.requests[2].body["metadata"]["annotations"]
            .as_object()
            .is_some_and(|a| a.contains_key(keys::ANNOTATION_RESET_BREAKER)),
        "the patch removes the annotation: {}",
        seen.requests[2].body
    );
    assert_eq!(seen.event_reasons(), vec!["BreakerReset"]);
}
