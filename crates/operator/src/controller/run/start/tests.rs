use super::*;
use gpufabric_api::run::{FabricTestRunSpec, SkipReason, SkippedNode, Trigger};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

fn run_created_at(t: chrono::DateTime<Utc>) -> FabricTestRun {
    let spec = gpufabric_api::test::FabricTestSpec::default();
    let mut r = FabricTestRun::new(
        "nightly-29000000",
        FabricTestRunSpec::of_test("nightly", &spec, Trigger::Schedule, None, None),
    );
    r.metadata.creation_timestamp = Some(crate::time::to_time(t));
    r
}

fn skipped(node: &str, reason: SkipReason) -> SkippedNode {
    SkippedNode {
        node: node.into(),
        reason,
        message: "is busy".into(),
    }
}

#[test]
fn a_run_waits_for_busy_nodes_until_its_wait_is_over() {
    // Whole seconds: a creationTimestamp has no fraction.
    let created = chrono::DateTime::parse_from_rfc3339("2026-11-25T02:00:00Z")
        .expect("a time")
        .with_timezone(&Utc);
    let run = run_created_at(created);
    let wait = Duration::from_secs(600);
    let mut s = vec![
        skipped("gpu-01", SkipReason::Tainted),
        skipped("gpu-02", SkipReason::Busy),
    ];
    // Busy, within the wait: Pending, naming the node, looked at again soon.
    let at = created + chrono::Duration::seconds(60);
    let BusyWait::Wait { message, recheck } = busy_wait(&run, &mut s, wait, at) else {
        panic!("waits");
    };
    assert!(
        message.contains("1 busy nodes") && message.contains("gpu-02"),
        "{message}"
    );
    assert!(!message.contains("gpu-01"), "{message}");
    assert_eq!(recheck, BUSY_RECHECK);
    // 5 s before the end: looked at again at the end, not later.
    let at = created + chrono::Duration::seconds(595);
    let BusyWait::Wait { recheck, .. } = busy_wait(&run, &mut s, wait, at) else {
        panic!("waits");
    };
    assert_eq!(recheck, Duration::from_secs(5));
    // Over: starts, and the busy node's skip says it was waited for.
    let at = created + chrono::Duration::seconds(600);
    assert_eq!(busy_wait(&run, &mut s, wait, at), BusyWait::Go);
    assert_eq!(s[1].message, "is busy (still busy after waiting 600s)");
    assert_eq!(s[0].message, "is busy", "only busy nodes");
}

#[test]
fn a_node_under_another_run_is_waited_for_without_any_setting_until_the_agent_timeout() {
    let created = chrono::DateTime::parse_from_rfc3339("2026-11-25T02:00:00Z")
        .expect("a time")
        .with_timezone(&Utc);
    let run = run_created_at(created);
    let wait = u64::from(run.spec.agent.timeout_seconds) + OTHER_RUN_GRACE.as_secs();
    let mut s = vec![
        skipped("gpu-01", SkipReason::Busy),
        skipped("gpu-02", SkipReason::InOtherRun),
    ];
    let at = created + chrono::Duration::seconds(1);
    let others =
        std::collections::BTreeMap::from([("gpu-02".to_string(), "weekly-29000000".to_string())]);
    let BusyWait::Wait { message, .. } = other_run_wait(&run, &mut s, &others, at) else {
        panic!("waits for the other run");
    };
    assert!(
        message.contains("gpufabric run weekly-29000000 is testing") && message.contains("gpu-02"),
        "{message}"
    );
    assert!(
        !message.contains("gpu-01"),
        "busy nodes wait only when asked: {message}"
    );
    let at = created + chrono::Duration::seconds(wait as i64);
    assert_eq!(other_run_wait(&run, &mut s, &others, at), BusyWait::Go);
    assert_eq!(
        s[1].message,
        format!("is busy (still under another run after waiting {wait}s)")
    );
    assert_eq!(s[0].message, "is busy");
}

#[test]
fn a_run_without_busy_nodes_starts_at_once() {
    let run = run_created_at(Utc::now());
    let mut s = vec![skipped("gpu-01", SkipReason::Tainted)];
    let wait = Duration::from_secs(600);
    assert_eq!(busy_wait(&run, &mut s, wait, Utc::now()), BusyWait::Go);
    assert_eq!(busy_wait(&run, &mut [], wait, Utc::now()), BusyWait::Go);
}

/// No run exists: every pod is someone else's.
fn no_runs() -> nodes::OwnPods<'static> {
    static NONE: std::collections::BTreeMap<String, String> = std::collections::BTreeMap::new();
    nodes::OwnPods {
        namespace: "gpufabric",
        runs: &NONE,
    }
}

/// A pod of someone else's holding `gpus` GPUs of `node`, as the API server lists it.
fn pod(name: &str, node: &str, gpus: u32) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"nodeName": node, "containers": [{"name": "c",
            "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}]},
        "status": {"phase": "Running"}
    })
}

#[tokio::test]
async fn busy_gpus_are_summed_over_every_page_of_the_pod_list() {
    use crate::controller::fake_api;
    let (client, handle) = fake_api::client();
    let server = fake_api::serve(
        handle,
        std::iter::once(fake_api::no_dra())
            .chain(fake_api::paged_list(
                "/api/v1/pods",
                "v1",
                "PodList",
                vec![
                    vec![pod("a", "gpu-01", 4), pod("b", "gpu-02", 8)],
                    vec![pod("c", "gpu-01", 2)],
                ],
                &["more"],
            ))
            .collect(),
    );
    let used = in_use(&client, "this-run", &no_runs())
        .await
        .expect("listed")
        .gpus;
    drop(client);
    let mut transcript = server.await.expect("server");
    // The first request is discovery (no DRA served), then the paged pod list.
    assert_eq!(transcript.requests.remove(0).path, "/apis");
    let q = transcript.assert_paged(&["more"]);
    assert!(q.iter().all(|q| q.contains("fieldSelector")), "{q:?}");
    assert_eq!(
        used,
        std::collections::BTreeMap::from([("gpu-01".to_string(), 6), ("gpu-02".to_string(), 8)])
    );
}

#[tokio::test]
async fn without_the_right_to_list_pods_no_node_is_busy() {
    use crate::controller::fake_api::{self, Expect};
    use http::{Method, StatusCode};
    let (client, handle) = fake_api::client();
    let server = fake_api::serve(
        handle,
        vec![
            fake_api::no_dra(),
            Expect::new(
                Method::GET,
                "/api/v1/pods",
                StatusCode::FORBIDDEN,
                fake_api::status(403, "Forbidden"),
            ),
        ],
    );
    assert_eq!(
        in_use(&client, "this-run", &no_runs())
            .await
            .expect("not an error"),
        InUse::default()
    );
    drop(client);
    assert!(server.await.expect("server").missing.is_empty());
}

fn nodes(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("gpu-{i:02}")).collect()
}

#[test]
fn a_run_with_no_node_to_test_fails_at_its_start_and_says_why() {
    let run = run_created_at(Utc::now());
    let at = crate::time::now();
    let StartPlan::Fail { status, message } = plan_start(&run, &[], Vec::new(), at.clone()) else {
        panic!("fails");
    };
    assert_eq!(
        message,
        "no node matches the nodeSelector and has allocatable nvidia.com/gpu"
    );
    assert_eq!(status.phase, RunPhase::Failed);
    assert_eq!(status.message.as_deref(), Some(message.as_str()));
    assert_eq!(status.completion_time, Some(at));
    assert!(
        !status.conditions.is_empty(),
        "the finished conditions are set"
    );

    let skips = vec![skipped("gpu-01", SkipReason::Busy)];
    let StartPlan::Fail { status, message } = plan_start(&run, &[], skips, crate::time::now())
    else {
        panic!("fails");
    };
    assert!(
        message.contains("1 selected, none usable") && message.contains("gpu-01 is busy"),
        "{message}"
    );
    assert_eq!(status.skipped_count, 1);
}

#[test]
fn a_rollout_it_cannot_follow_fails_the_run_and_a_good_one_sets_its_waves() {
    let mut run = run_created_at(Utc::now());
    run.spec.rollout = Some(gpufabric_api::rollout::Rollout {
        max_unavailable: Some(IntOrString::Int(0)),
    });
    let plan = plan_start(&run, &nodes(4), Vec::new(), crate::time::now());
    assert!(
        matches!(&plan, StartPlan::Fail { message, .. } if message.contains("maxUnavailable")),
        "{plan:?}"
    );

    run.spec.rollout = Some(gpufabric_api::rollout::Rollout {
        max_unavailable: Some(IntOrString::Int(3)),
    });
    let skips = vec![skipped("gpu-99", SkipReason::Tainted)];
    let StartPlan::Start {
        status,
        wave_size,
        note,
    } = plan_start(&run, &nodes(10), skips, crate::time::now())
    else {
        panic!("starts");
    };
    assert_eq!(wave_size, 3);
    assert_eq!(note, "testing 10 nodes in waves of 3");
    assert_eq!(status.phase, RunPhase::Running);
    assert_eq!(status.node_count, 10);
    let p = status.progress.expect("progress");
    assert_eq!((p.wave, p.waves, p.wave_size, p.total), (1, 4, 3, 10));
    assert_eq!(status.nodes.len(), 10);
    assert!(status.nodes.iter().all(|n| n.pod.is_none()));
    assert_eq!(
        status.message.as_deref(),
        Some("1 selected nodes not tested: gpu-99 is busy")
    );

    run.spec.rollout = None;
    let StartPlan::Start {
        note, wave_size, ..
    } = plan_start(&run, &nodes(2), Vec::new(), crate::time::now())
    else {
        panic!("starts");
    };
    assert_eq!((note.as_str(), wave_size), ("testing 2 nodes", 2));
}

#[test]
fn a_started_run_shows_its_nodes_over_the_limit_and_when_it_stops() {
    let created = chrono::DateTime::parse_from_rfc3339("2026-11-25T02:00:00Z")
        .expect("a time")
        .with_timezone(&Utc);
    let mut run = run_created_at(created);
    run.spec.limits = gpufabric_api::limits::RunLimits {
        max_nodes: Some(2),
        max_duration_seconds: Some(3600),
    };
    let (targets, over) = super::super::halt::over_limit(
        &run.spec.limits,
        vec!["a".to_string(), "b".to_string(), "c".to_string()],
        Clone::clone,
        |_| None,
    );
    let StartPlan::Start { status, .. } =
        plan_start(&run, &targets, over, crate::time::to_time(created))
    else {
        panic!("starts");
    };
    assert_eq!(status.node_count, 2);
    assert_eq!(status.skipped_count, 1);
    assert_eq!(status.skipped[0].reason, SkipReason::OverLimit);
    let limits = status.limits.expect("limits in the status");
    assert_eq!(limits.nodes_over_limit, 1);
    assert_eq!(
        limits.stop_time,
        Some(crate::time::to_time(
            created + chrono::Duration::seconds(3600)
        ))
    );
}
