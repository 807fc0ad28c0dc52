use super::*;
use crate::controller::fake_api::{self, Expect};
use gpufabric_api::keys;
use gpufabric_api::run::{FabricTestRunSpec, RunPhase, Trigger};
use gpufabric_api::shard::{FabricTestRunShard, FabricTestRunShardSpec, FabricTestRunShardStatus};
use http::{Method, StatusCode};
use k8s_openapi::api::core::v1::Node;
use kube::runtime::{reflector, watcher};
use serde_json::Value;
use serde_json::json;

const RUN: &str = "nightly-1";
const UID: &str = "run-uid";

fn running_run(nodes: &[&str]) -> FabricTestRun {
    let spec = gpufabric_api::test::FabricTestSpec::default();
    let mut r = FabricTestRun::new(
        RUN,
        FabricTestRunSpec::of_test("nightly", &spec, Trigger::Schedule, None, None),
    );
    r.metadata.uid = Some(UID.into());
    r.metadata.creation_timestamp = Some(now());
    r.status = Some(FabricTestRunStatus {
        phase: RunPhase::Running,
        start_time: Some(now()),
        node_count: nodes.len() as u32,
        shards: 1,
        progress: Some(RunProgress {
            total: nodes.len() as u32,
            wave: 1,
            waves: 1,
            wave_size: nodes.len() as u32,
            wave_start_time: Some(now()),
            ..Default::default()
        }),
        ..Default::default()
    });
    r
}

/// The run's one shard as the killed operator left it: every node Pending, no pod named.
fn shard_without_pods(run: &FabricTestRun, nodes: &[&str]) -> FabricTestRunShard {
    let nodes: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
    let mut s = shards::build(run, &nodes).expect("shards").remove(0);
    let spec: &FabricTestRunShardSpec = &s.spec;
    s.status = Some(FabricTestRunShardStatus::of(shards::entries(spec, None)));
    s
}

/// The running benchmark pod of `node`, controlled by the run, with UID `uid`.
fn running_pod(node: &str, uid: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {
            "name": names::pod_name(&names::run_base(RUN, UID), node),
            "uid": uid,
            "namespace": "gpufabric",
            "labels": {keys::LABEL_RUN: RUN},
            "ownerReferences": [{"apiVersion": "gpufabric.io/v1alpha1",
                "kind": "FabricTestRun", "name": RUN, "uid": UID, "controller": true}],
            "creationTimestamp": now(),
        },
        "spec": {"nodeName": node, "containers": [{"name": "agent"}]},
        "status": {"phase": "Running",
            "containerStatuses": [{"name": "agent", "ready": true, "restartCount": 0,
                "image": "fabric-agent", "imageID": "", "state": {"running": {}}}]}
    }))
    .expect("pod")
}

fn json_of<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

fn gpu_node(name: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "status": {"allocatable": {keys::RESOURCE_GPU: "8"}}
    }))
    .expect("node")
}

fn context(client: kube::Client, shard: FabricTestRunShard, pods: Vec<Pod>) -> Arc<RunContext> {
    let (node_store, mut node_writer) = reflector::store();
    for n in ["gpu-01", "gpu-02", "gpu-03"] {
        node_writer.apply_watcher_event(&watcher::Event::Apply(gpu_node(n)));
    }
    let (pod_store, mut pod_writer) = reflector::store();
    for p in pods {
        pod_writer.apply_watcher_event(&watcher::Event::Apply(p));
    }
    let (shard_store, mut shard_writer) = reflector::store();
    shard_writer.apply_watcher_event(&watcher::Event::Apply(shard));
    RunContext::for_tests(
        client,
        node_store,
        pod_store,
        reflector::store().0,
        shard_store,
    )
}

/// What the names of the test run's pods start with.
fn base() -> String {
    names::run_base(RUN, UID)
}

/// The name of `node`'s benchmark pod in the test run.
fn pod_name(node: &str) -> String {
    names::pod_name(&base(), node)
}

#[tokio::test]
async fn a_pod_the_run_controls_but_never_recorded_is_deleted_unread_and_made_again() {
    let nodes = ["gpu-01", "gpu-02", "gpu-03"];
    let run = running_run(&nodes);
    let shard = shard_without_pods(&run, &nodes);
    // An operator killed before its shard write made the pods of gpu-01 and gpu-02 (or
    // someone copied the run's owner onto pods of those names): gpu-01's has ended with a
    // hardware fault's exit code.
    let mut faulty = running_pod("gpu-01", "uid-1");
    faulty.status = serde_json::from_value(json!({"phase": "Failed",
        "containerStatuses": [{"name": "agent", "ready": false, "restartCount": 0,
            "image": "fabric-agent", "imageID": "",
            "state": {"terminated": {"exitCode": 10, "reason": "Error"}}}]}))
    .ok();
    let pods = vec![faulty, running_pod("gpu-02", "uid-2")];
    let (client, handle) = fake_api::client();
    let pod_path = |node: &str| format!("/api/v1/namespaces/gpufabric/pods/{}", pod_name(node));
    let made = running_pod("gpu-03", "uid-3");
    let server = fake_api::serve(
        handle,
        vec![
            Expect::new(
                Method::GET,
                &format!("/apis/gpufabric.io/v1alpha1/fabrictestruns/{RUN}"),
                StatusCode::OK,
                json_of(&run),
            ),
            Expect::new(
                Method::DELETE,
                &pod_path("gpu-01"),
                StatusCode::OK,
                Value::Null,
            ),
            Expect::new(
                Method::DELETE,
                &pod_path("gpu-02"),
                StatusCode::OK,
                Value::Null,
            ),
            fake_api::no_dra(),
            Expect::new(
                Method::POST,
                "/api/v1/namespaces/gpufabric/pods",
                StatusCode::CREATED,
                json_of(&made),
            ),
            Expect::new(
                Method::PATCH,
                &format!("/apis/gpufabric.io/v1alpha1/fabrictestrunshards/{RUN}-s0/status"),
                StatusCode::OK,
                json_of(&shard),
            ),
            Expect::new(
                Method::PATCH,
                &format!("/apis/gpufabric.io/v1alpha1/fabrictestruns/{RUN}/status"),
                StatusCode::OK,
                json_of(&run),
            ),
        ],
    );
    let ctx = context(client, shard, pods);
    super::super::reconcile(Arc::new(run), ctx.clone())
        .await
        .expect("a pass");
    drop(ctx);
    let seen = server.await.expect("server");
    assert!(
        seen.unexpected.is_empty() && seen.missing.is_empty(),
        "{seen:#?}"
    );
    assert_eq!(
        seen.requests[1].body["preconditions"]["uid"], "uid-1",
        "only the pod seen is deleted"
    );
    // Request 3 is discovery: no DRA, so the pod is bound by name.
    assert_eq!(seen.requests[4].body["spec"]["nodeName"], "gpu-03");
    let written = &seen.requests[5].body["status"]["nodes"];
    for (i, node) in nodes.iter().enumerate() {
        assert_eq!(written[i]["node"], *node);
        assert_eq!(written[i]["verdict"], "Pending", "{node}: {written}");
    }
    assert!(written[0].get("pod").is_none(), "never read: {written}");
    assert!(written[1].get("pod").is_none(), "never read: {written}");
    assert_eq!(written[2]["pod"], pod_name("gpu-03"));
    assert_eq!(written[2]["podUid"], "uid-3", "recorded as it is made");
}

/// An entry whose pod the run made and recorded as `uid`.
fn recorded(node: &str, uid: &str) -> NodeRunResult {
    NodeRunResult {
        node: node.to_string(),
        pod: Some(pod_name(node)),
        pod_uid: Some(uid.to_string()),
        verdict: gpufabric_api::run::NodeVerdict::Running,
        ..Default::default()
    }
}

#[tokio::test]
async fn a_pod_at_a_nodes_name_with_another_uid_is_never_read() {
    // The run made gpu-01's pod as uid-1; someone deleted it and made one of the same name,
    // owner copied, that exits with a hardware fault's code.
    let mut forged = running_pod("gpu-01", "forged");
    forged.status = serde_json::from_value(json!({"phase": "Failed",
        "containerStatuses": [{"name": "agent", "ready": false, "restartCount": 0,
            "image": "fabric-agent", "imageID": "",
            "state": {"terminated": {"exitCode": 10, "reason": "Error",
                "message": "gpu 3 fell off the bus"}}}]}))
    .ok();
    // On gpu-02, the run's own pod, moved to another node by no one: a pod of the same UID
    // on another node is not the one made for gpu-02.
    let mut elsewhere = running_pod("gpu-02", "uid-2");
    if let Some(spec) = elsewhere.spec.as_mut() {
        spec.node_name = Some("gpu-09".into());
    }
    let mut entries = vec![recorded("gpu-01", "uid-1"), recorded("gpu-02", "uid-2")];
    let cache: HashMap<String, Arc<Pod>> = [forged, elsewhere]
        .into_iter()
        .map(|p| (p.name_any(), Arc::new(p)))
        .collect();
    let (client, handle) = fake_api::client();
    let server = fake_api::serve(handle, vec![]);
    let api: Api<Pod> = Api::namespaced(client, "gpufabric");
    let departed = crate::departed::Departed::default();
    let read = read_states(
        &mut entries,
        &PodsOfRun {
            base: &base(),
            uid: UID,
            pods: &cache,
            api: &api,
            gone: &|pod: &str| departed.last("gpufabric", pod, UID),
        },
        &|_| false,
        60,
    )
    .await
    .expect("read");
    drop(api);
    let seen = server.await.expect("server");
    assert!(seen.unexpected.is_empty(), "{seen:#?}");
    for o in &read.outcomes {
        assert!(
            matches!(
                o,
                PodState::Ended(gpufabric_api::outcome::NodeOutcome::NotMeasured {
                    reason: gpufabric_api::outcome::NotMeasuredReason::PodDeleted,
                    ..
                })
            ),
            "the run's own pod is gone, never a fault: {o:?}"
        );
    }
}

#[tokio::test]
async fn a_name_someone_else_holds_ends_its_node_not_measured_with_an_event() {
    let nodes = ["gpu-01"];
    let run = running_run(&nodes);
    let shard = shard_without_pods(&run, &nodes);
    let mut squatter = running_pod("gpu-01", "squat");
    squatter.metadata.owner_references = None;
    squatter.metadata.namespace = Some("gpufabric".into());
    let (client, handle) = fake_api::client();
    let server = fake_api::serve(
        handle,
        vec![
            fake_api::no_dra(),
            Expect::new(
                Method::POST,
                "/api/v1/namespaces/gpufabric/pods",
                StatusCode::CONFLICT,
                fake_api::status(409, "AlreadyExists"),
            ),
            Expect::new(
                Method::GET,
                &format!("/api/v1/namespaces/gpufabric/pods/{}", pod_name("gpu-01")),
                StatusCode::OK,
                json_of(&squatter),
            ),
        ],
    );
    let ctx = context(client.clone(), shard, vec![]);
    let api: Api<Pod> = Api::namespaced(client, "gpufabric");
    let mut entries = vec![NodeRunResult {
        node: "gpu-01".into(),
        ..Default::default()
    }];
    let mut outcomes = vec![PodState::Waiting(None)];
    let transient = create_step(&run, &mut entries, &mut outcomes, &[0], &ctx, &api).await;
    drop((api, ctx));
    let seen = server.await.expect("server");
    assert!(transient.is_none());
    assert!(
        seen.unexpected.is_empty() && seen.missing.is_empty(),
        "{seen:#?}"
    );
    assert_eq!(entries[0].pod, None, "the squatter is never the node's pod");
    assert_eq!(entries[0].pod_uid, None);
    match &outcomes[0] {
        PodState::Ended(gpufabric_api::outcome::NodeOutcome::NotMeasured { reason, detail }) => {
            assert_eq!(
                *reason,
                gpufabric_api::outcome::NotMeasuredReason::NameTaken
            );
            assert!(detail.contains(&pod_name("gpu-01")), "{detail}");
        }
        o => panic!("not measured: {o:?}"),
    }
    assert!(
        seen.events.iter().any(|e| e.body["reason"] == "NameTaken"
            && e.body["note"]
                .as_str()
                .is_some_and(|n| n.contains("gpu-01"))),
        "{:#?}",
        seen.events
    );
}

#[tokio::test]
async fn a_conflict_with_a_pod_the_run_controls_deletes_it_and_tries_again_later() {
    let nodes = ["gpu-01"];
    let run = running_run(&nodes);
    let shard = shard_without_pods(&run, &nodes);
    let unrecorded = running_pod("gpu-01", "uid-lost");
    let (client, handle) = fake_api::client();
    let path = format!("/api/v1/namespaces/gpufabric/pods/{}", pod_name("gpu-01"));
    let server = fake_api::serve(
        handle,
        vec![
            fake_api::no_dra(),
            Expect::new(
                Method::POST,
                "/api/v1/namespaces/gpufabric/pods",
                StatusCode::CONFLICT,
                fake_api::status(409, "AlreadyExists"),
            ),
            Expect::new(Method::GET, &path, StatusCode::OK, json_of(&unrecorded)),
            Expect::new(Method::DELETE, &path, StatusCode::OK, Value::Null),
        ],
    );
    let ctx = context(client.clone(), shard, vec![]);
    let api: Api<Pod> = Api::namespaced(client, "gpufabric");
    let mut entries = vec![NodeRunResult {
        node: "gpu-01".into(),
        ..Default::default()
    }];
    let mut outcomes = vec![PodState::Waiting(None)];
    let transient = create_step(&run, &mut entries, &mut outcomes, &[0], &ctx, &api).await;
    drop((api, ctx));
    let seen = server.await.expect("server");
    assert!(transient.is_none());
    assert!(
        seen.unexpected.is_empty() && seen.missing.is_empty(),
        "{seen:#?}"
    );
    assert_eq!(seen.requests[3].body["preconditions"]["uid"], "uid-lost");
    assert_eq!(entries[0].pod_uid, None, "not taken for the pod made");
    assert_eq!(outcomes[0], PodState::Waiting(None), "made again later");
}

/// The pod of `node` as the watch last saw it before it was deleted: preempted by the
/// scheduler, its agent ended on SIGTERM.
fn preempted_pod(node: &str) -> Pod {
    let mut p = running_pod(node, &format!("uid-{node}"));
    let status = json!({"phase": "Failed",
        "conditions": [{"type": "DisruptionTarget", "status": "True",
            "reason": "PreemptionByScheduler",
            "message": "default-scheduler: preempting to accommodate a higher priority pod"}],
        "containerStatuses": [{"name": "agent", "ready": false, "restartCount": 0,
            "image": "fabric-agent", "imageID": "",
            "state": {"terminated": {"exitCode": 143, "reason": "Error",
                "message": "progress: ncclSweep: allReduce 64 MiB"}}}]});
    p.status = serde_json::from_value(status).ok();
    p
}

#[tokio::test]
async fn a_pod_gone_before_its_pass_ends_as_the_watch_last_saw_it() {
    let nodes = ["gpu-01", "gpu-02"];
    let mut entries: Vec<NodeRunResult> = nodes
        .iter()
        .map(|n| recorded(n, &format!("uid-{n}")))
        .collect();
    let (client, handle) = fake_api::client();
    let gone_path = |node: &str| format!("/api/v1/namespaces/gpufabric/pods/{}", pod_name(node));
    let server = fake_api::serve(
        handle,
        nodes
            .iter()
            .map(|n| {
                Expect::new(
                    Method::GET,
                    &gone_path(n),
                    StatusCode::NOT_FOUND,
                    fake_api::status(404, "NotFound"),
                )
            })
            .collect(),
    );
    let api: Api<Pod> = Api::namespaced(client, "gpufabric");
    // The watch saw gpu-01's pod end preempted; gpu-02's went with no last state seen.
    let departed = crate::departed::Departed::default();
    departed.record(&preempted_pod("gpu-01"));
    let read = read_states(
        &mut entries,
        &PodsOfRun {
            base: &base(),
            uid: UID,
            pods: &HashMap::new(),
            api: &api,
            gone: &|pod: &str| departed.last("gpufabric", pod, UID),
        },
        &|_| false,
        60,
    )
    .await
    .expect("read");
    drop(api);
    let seen = server.await.expect("server");
    assert!(
        seen.unexpected.is_empty() && seen.missing.is_empty(),
        "{seen:#?}"
    );
    let reason = |s: &PodState| match s {
        PodState::Ended(gpufabric_api::outcome::NodeOutcome::NotMeasured { reason, .. }) => {
            Some(*reason)
        }
        _ => None,
    };
    use gpufabric_api::outcome::NotMeasuredReason;
    assert_eq!(
        reason(&read.outcomes[0]),
        Some(NotMeasuredReason::Preempted),
        "{:?}",
        read.outcomes[0]
    );
    assert_eq!(
        reason(&read.outcomes[1]),
        Some(NotMeasuredReason::PodDeleted),
        "{:?}",
        read.outcomes[1]
    );
    assert!(read.to_create.is_empty() && read.to_stop.is_empty());
    assert_eq!(read.occupying, 0);
    // Another run's pod of the same name is not this run's.
    assert!(
        departed
            .last("gpufabric", &pod_name("gpu-01"), "other")
            .is_none()
    );
}

/// Where the pods stand in a pass: each node's state, the nodes without a pod, the ended
/// pods the kubelet still holds, and how many pods hold their node.
fn read_of(
    outcomes: Vec<PodState>,
    to_create: Vec<usize>,
    to_stop: Vec<usize>,
    occupying: usize,
) -> Read {
    Read {
        outcomes,
        to_create,
        to_stop,
        unrecorded: Vec::new(),
        occupying,
    }
}

/// Each node's entry before its pod exists.
fn pending(nodes: &[&str]) -> Vec<NodeRunResult> {
    nodes
        .iter()
        .map(|n| NodeRunResult {
            node: n.to_string(),
            ..Default::default()
        })
        .collect()
}

fn ended() -> PodState {
    PodState::Ended(results::pod_gone())
}

fn step(wave: usize, waves: usize, create: Vec<usize>) -> Option<waves::WaveStep> {
    Some(waves::WaveStep {
        wave,
        waves,
        create,
    })
}

#[test]
fn past_its_deadline_a_wave_ends_and_the_next_gets_pods_only_as_the_stopped_ones_go() {
    // 5 nodes in waves of 2: node 0 ended, node 1's agent still runs, the rest wait.
    let read = || {
        read_of(
            vec![
                ended(),
                PodState::Running,
                PodState::Waiting(None),
                PodState::Waiting(None),
                PodState::Waiting(None),
            ],
            vec![2, 3, 4],
            vec![],
            1,
        )
    };
    assert_eq!(
        plan_pass(&read(), 2, 0, false),
        PassPlan {
            delete: vec![],
            stop: None,
            step: step(0, 3, vec![]),
        },
        "before the deadline the wave waits for node 1"
    );
    assert_eq!(
        plan_pass(&read(), 2, 0, true),
        PassPlan {
            delete: vec![],
            stop: Some(vec![0, 1]),
            step: step(1, 3, vec![2]),
        },
        "node 1's stopped pod holds its node until it is gone"
    );
}

#[test]
fn a_wave_past_its_deadline_ends_its_nodes_without_a_pod_too() {
    // Node 1 never got its pod (the API server refused it for a while).
    let read = read_of(
        vec![ended(), PodState::Waiting(None), PodState::Waiting(None)],
        vec![1, 2],
        vec![],
        0,
    );
    let plan = plan_pass(&read, 2, 0, true);
    assert_eq!(plan.stop, Some(vec![0, 1]));
    assert_eq!(plan.step, step(1, 2, vec![2]), "node 1 gets no pod now");
}

#[test]
fn ended_pods_the_kubelet_still_holds_are_deleted_and_count_until_gone() {
    let read = read_of(
        vec![
            PodState::Ended(gpufabric_api::outcome::NodeOutcome::not_measured(
                gpufabric_api::outcome::NotMeasuredReason::ImagePull,
                "ImagePullBackOff",
            )),
            PodState::Waiting(None),
        ],
        vec![1],
        vec![0],
        1,
    );
    assert_eq!(
        plan_pass(&read, 1, 0, false),
        PassPlan {
            delete: vec![0],
            stop: None,
            step: step(1, 2, vec![]),
        }
    );
}

#[test]
fn the_node_checks_end_once_every_node_is_done_and_no_pod_creation_is_retried() {
    let nodes = ["gpu-01", "gpu-02"];
    let run = running_run(&nodes);
    let status = run.status.clone().unwrap_or_default();
    let read = read_of(vec![ended(), ended()], vec![], vec![], 0);
    let plan = plan_pass(&read, 2, 0, false);
    assert_eq!(plan.step, None);
    let mut entries = pending(&nodes);
    let prog = status.progress.clone().unwrap_or_default();
    let write = |entries: &mut [NodeRunResult], plan: &PassPlan, retry: bool| {
        plan_write(
            &run,
            &status,
            prog.clone(),
            plan,
            PassDone {
                entries,
                outcomes: &read.outcomes,
                retry,
            },
            2,
            now(),
        )
    };
    assert!(write(&mut entries, &plan, false).checks_ended);
    let waiting = PassPlan {
        step: step(0, 1, vec![]),
        ..plan.clone()
    };
    assert!(!write(&mut entries, &waiting, false).checks_ended);
    assert!(!write(&mut entries, &waiting, true).checks_ended);
}

#[test]
fn a_pass_writes_each_nodes_outcome_keeps_its_pair_records_and_records_the_wave() {
    let nodes = ["gpu-01", "gpu-02", "gpu-03"];
    let run = running_run(&nodes);
    let mut status = run.status.clone().unwrap_or_default();
    // Waves of 2; the first, under way, has not started its clock yet.
    let prog = RunProgress {
        wave_size: 2,
        wave: 1,
        wave_start_time: None,
        ..status.progress.clone().unwrap_or_default()
    };
    status.progress = Some(prog.clone());
    let mut entries = pending(&nodes);
    entries[0].pairs = vec![gpufabric_api::pair::PairRecord {
        partner: "gpu-02".into(),
        ..Default::default()
    }];
    entries[0].pod = Some(pod_name("gpu-01"));
    entries[1].pod = Some(pod_name("gpu-02"));
    let outcomes = vec![ended(), PodState::Running, PodState::Waiting(None)];
    let read = read_of(outcomes.clone(), vec![2], vec![], 1);
    let plan = plan_pass(&read, 2, 0, false);
    let at = now();
    let written = plan_write(
        &run,
        &status,
        prog,
        &plan,
        PassDone {
            entries: &mut entries,
            outcomes: &outcomes,
            retry: false,
        },
        2,
        at.clone(),
    );
    assert_eq!(
        entries[0].verdict,
        gpufabric_api::run::NodeVerdict::NotMeasured
    );
    assert_eq!(entries[0].pairs.len(), 1, "pair records kept");
    assert_eq!(entries[1].verdict, gpufabric_api::run::NodeVerdict::Running);
    assert!(!written.checks_ended);
    let p = written.next.progress.clone().unwrap_or_default();
    assert_eq!((p.done, p.total, p.wave, p.waves), (1, 3, 1, 2));
    assert_eq!(
        p.wave_start_time,
        Some(at.clone()),
        "the wave's clock starts"
    );
    assert_eq!(
        p.wave_pods_created_time,
        Some(at),
        "every node of the wave has its pod"
    );
    assert!(
        !written
            .next
            .conditions
            .iter()
            .any(|c| c.type_ == CONDITION_PODS_CREATED),
        "gpu-03 has no pod yet"
    );
}

#[tokio::test]
async fn a_crash_read_before_its_pod_was_deleted_stays_a_crash() {
    // gpu-01's agent crashed on its own (exit 139, read and kept in its entry); its ended pod
    // is deleted later. Read again while deleting, the pod's end would be the stop's: the
    // entry's outcome stands.
    let mut crashed = running_pod("gpu-01", "uid-1");
    crashed.metadata.deletion_timestamp = Some(now());
    crashed.status = serde_json::from_value(json!({"phase": "Failed",
        "containerStatuses": [{"name": "agent", "ready": false, "restartCount": 0,
            "image": "fabric-agent", "imageID": "",
            "state": {"terminated": {"exitCode": 139, "reason": "Error"}}}]}))
    .ok();
    let mut entry = recorded("gpu-01", "uid-1");
    entry.record(&gpufabric_api::outcome::NodeOutcome::hardware(
        gpufabric_api::outcome::HardwareFault::Crash,
        "segmentation fault (exit code 139)",
    ));
    // gpu-02's agent was stopped while running (its pod deleted): nothing kept, the stop's.
    let mut stopped = running_pod("gpu-02", "uid-2");
    stopped.metadata.deletion_timestamp = Some(now());
    stopped.status = crashed.status.clone();
    let mut entries = vec![entry, recorded("gpu-02", "uid-2")];
    let cache: HashMap<String, Arc<Pod>> = [crashed, stopped]
        .into_iter()
        .map(|p| (p.name_any(), Arc::new(p)))
        .collect();
    let (client, handle) = fake_api::client();
    let server = fake_api::serve(handle, vec![]);
    let api: Api<Pod> = Api::namespaced(client, "gpufabric");
    let departed = crate::departed::Departed::default();
    let read = read_states(
        &mut entries,
        &PodsOfRun {
            base: &base(),
            uid: UID,
            pods: &cache,
            api: &api,
            gone: &|pod: &str| departed.last("gpufabric", pod, UID),
        },
        &|_| false,
        60,
    )
    .await
    .expect("read");
    drop(api);
    let seen = server.await.expect("server");
    assert!(seen.unexpected.is_empty(), "{seen:#?}");
    assert!(
        matches!(
            &read.outcomes[0],
            PodState::Ended(gpufabric_api::outcome::NodeOutcome::HardwareFault {
                fault: gpufabric_api::outcome::HardwareFault::Crash,
                ..
            })
        ),
        "{:?}",
        read.outcomes[0]
    );
    assert!(
        matches!(
            &read.outcomes[1],
            PodState::Ended(gpufabric_api::outcome::NodeOutcome::NotMeasured {
                reason: gpufabric_api::outcome::NotMeasuredReason::PodDeleted,
                ..
            })
        ),
        "{:?}",
        read.outcomes[1]
    );
}
