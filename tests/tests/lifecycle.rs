//! A node's whole life on the real control plane: the real `fabric-operator` binary, the
//! process-kubelet and the sim agents. A person's changes to what the operator did are
//! theirs (uncordon, cordon again, deletion of the test); nodes behind the validation gate,
//! nodes back from repair, repeat offenders, targeted runs and node conditions.
//!
//! Build the binaries first: `cargo build -p gpufabric-agent -p gpufabric-operator`, then
//! `cargo test -p gpufabric-tests --test lifecycle`.

use gpufabric_api::FabricTestStatus;
use gpufabric_api::keys::{
    ANNOTATION_GATED, ANNOTATION_QUARANTINE, ANNOTATION_REPAIRED, ANNOTATION_RUN_NODES,
    LABEL_QUARANTINED, TAINT_VALIDATION,
};
use gpufabric_api::run::{NodeVerdict, Trigger};
use gpufabric_api::standing::Standing;
use gpufabric_measure::fleet::{Fault, Fleet};
use gpufabric_tests::fleet::{H100, SimFleet};
use gpufabric_tests::operator::{EnvCluster, OperatorEnv, cordoned, sim_agent};
use gpufabric_tests::wait;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;
use std::time::Duration;

type Env = OperatorEnv;

const WAIT: Duration = Duration::from_secs(180);

/// Four H100 nodes; gpu-02 has a straggler GPU (the DDP probe finds it).
fn fleet() -> Fleet {
    let mut f = SimFleet::uniform("gpu", 4, H100, 8);
    f.nodes[1].faults.push(straggler());
    f
}

fn straggler() -> Fault {
    Fault::Straggler {
        gpu: 1,
        factor: 1.5,
    }
}

/// Sets the faults of gpu-02 in the fleet file the agents read (none: repaired).
fn set_gpu_02_faults(env: &Env, faults: Vec<Fault>) {
    let mut f = env.fleet.fleet().clone();
    f.nodes[1].faults = faults;
    SimFleet::write_to(f, env.fleet.path()).expect("fleet rewritten");
}

/// A FabricTest over the environment's nodes on the sim backend; `schedule` far away so
/// that only the runs a test asks for (creation, run-now, targeted) happen.
fn spec(env: &Env, quarantine: serde_json::Value, extra: serde_json::Value) -> serde_json::Value {
    let mut s = json!({
        "nodeSelector": env.node_selector(),
        "quarantine": quarantine,
        "agent": sim_agent(60)
    });
    if let (Some(s), Some(extra)) = (s.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            s.insert(k.clone(), v.clone());
        }
    }
    s
}

/// Cordon mode, quarantine on the first failure, no confirmation run.
fn cordon(passes_to_release: u32) -> serde_json::Value {
    json!({"mode": "Cordon", "maxQuarantined": 2, "confirmRetest": false,
        "failuresToQuarantine": 1, "passesToRelease": passes_to_release})
}

/// Waits until the test's status satisfies `cond` with no run active.
async fn wait_status(
    env: &Env,
    name: &str,
    what: &str,
    cond: impl Fn(&FabricTestStatus) -> bool + Send + Sync,
) -> FabricTestStatus {
    env.wait_test_idle(name, what, WAIT, |_, s| cond(s)).await
}

/// Waits until node `name` satisfies `cond`.
async fn wait_node(env: &Env, name: &str, what: &str, cond: impl Fn(&Node) -> bool + Send + Sync) {
    env.wait_node(name, what, WAIT, cond).await
}

/// A change a person makes with kubectl.
async fn as_kubectl(env: &Env, node: &str, patch: serde_json::Value) {
    env.patch_node_as_kubectl(node, patch).await
}

fn holds(s: &FabricTestStatus, node: &str) -> bool {
    s.quarantined_nodes.iter().any(|n| n == node)
}

fn health<'a>(s: &'a FabricTestStatus, node: &str) -> Option<&'a gpufabric_api::test::NodeHealth> {
    s.nodes.iter().find(|h| h.node == node)
}

fn gated(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == TAINT_VALIDATION))
}

async fn gate(env: &Env, node: &str) {
    let api: Api<Node> = Api::all(env.cluster.client());
    let n = api.get(node).await.expect("node");
    let mut taints = n.spec.and_then(|s| s.taints).unwrap_or_default();
    taints.push(k8s_openapi::api::core::v1::Taint {
        key: TAINT_VALIDATION.into(),
        value: Some("pending".into()),
        effect: "NoSchedule".into(),
        time_added: None,
    });
    as_kubectl(env, node, json!({"spec": {"taints": taints}})).await;
}

async fn events_on(env: &Env, node: &str) -> Vec<String> {
    gpufabric_tests::events::reasons(&env.cluster.client(), "default", node).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_persons_uncordon_and_cordon_are_theirs_through_retests_and_deletion() {
    let env = OperatorEnv::shared(fleet(), "lc-own").await;
    let bad = env.node("gpu-02");
    env.create_test("lc-own", spec(&env, cordon(3), json!({})))
        .await;
    wait_status(&env, "lc-own", "gpu-02 quarantined", |s| holds(s, &bad)).await;
    assert!(cordoned(&env.read_node("gpu-02").await));

    // A person uncordons it: the test lets go at once, and tests it as back from repair.
    // It is still broken, so that test fails it and it is cordoned again.
    as_kubectl(&env, &bad, json!({"spec": {"unschedulable": null}})).await;
    let s = wait_status(
        &env,
        "lc-own",
        "the uncordon handed back and retested",
        |s| {
            holds(s, &bad)
                && s.last_run
                    .as_ref()
                    .is_some_and(|r| r.trigger == Trigger::Targeted)
        },
    )
    .await;
    let h = health(&s, &bad).expect("history of gpu-02");
    let taken = h.taken_back.as_ref().expect("takenBack recorded");
    assert!(taken.what.contains("uncordoned"), "{taken:?}");
    assert!(taken.repair);
    let reasons = events_on(&env, &bad).await;
    assert!(
        reasons.contains(&"QuarantineTakenBack".to_string()),
        "{reasons:?}"
    );
    assert!(
        cordoned(&env.read_node("gpu-02").await),
        "a failing retest cordons it again"
    );

    // The person uncordons and cordons it again before the operator looks (it is stopped):
    // the cordon is theirs now. The test lets go and does not retest it.
    let mut env = env;
    env.operator.kill();
    as_kubectl(&env, &bad, json!({"spec": {"unschedulable": null}})).await;
    as_kubectl(&env, &bad, json!({"spec": {"unschedulable": true}})).await;
    env.operator.restart();
    let s = wait_status(&env, "lc-own", "the cordon taken over", |s| {
        !holds(s, &bad)
            && health(s, &bad)
                .and_then(|h| h.taken_back.as_ref())
                .is_some_and(|t| t.what.contains("cordoned again by kubectl"))
    })
    .await;
    assert_eq!(s.quarantined_count, 0);
    let n = env.read_node("gpu-02").await;
    assert!(cordoned(&n), "their cordon stays");
    assert!(!n.annotations().contains_key(ANNOTATION_QUARANTINE));
    assert!(!n.labels().contains_key(LABEL_QUARANTINED));

    // Deleting the test leaves their cordon.
    let api = env.tests_api();
    api.delete("lc-own", &DeleteParams::default())
        .await
        .expect("deleted");
    wait::for_deletion(&api, "lc-own", Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", env.operator.log_tail(80)));
    assert!(
        cordoned(&env.read_node("gpu-02").await),
        "their cordon survives the deletion"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repaired_node_is_released_by_one_passing_run() {
    let env = OperatorEnv::shared(fleet(), "lc-repair").await;
    let bad = env.node("gpu-02");
    env.create_test("lc-repair", spec(&env, cordon(3), json!({})))
        .await;
    wait_status(&env, "lc-repair", "gpu-02 quarantined", |s| holds(s, &bad)).await;

    set_gpu_02_faults(&env, vec![]);
    env.annotate_node("gpu-02", ANNOTATION_REPAIRED, "INC-1234 replaced GPU 1")
        .await;
    let s = wait_status(
        &env,
        "lc-repair",
        "gpu-02 released by its repair test",
        |s| !holds(s, &bad),
    )
    .await;
    let h = health(&s, &bad).expect("history");
    assert_eq!(h.consecutive_passes, 1, "one pass released it: {h:?}");
    let last = s.last_run.expect("a run");
    assert_eq!(last.trigger, Trigger::Targeted);
    let run = env
        .runs_api()
        .get(&last.name)
        .await
        .expect("the targeted run");
    assert!(
        run.spec.reasons[&bad].contains("INC-1234"),
        "{:?}",
        run.spec.reasons
    );
    wait_node(&env, &bad, "released and the annotation gone", |n| {
        !cordoned(n) && !n.annotations().contains_key(ANNOTATION_REPAIRED)
    })
    .await;
    let reasons = events_on(&env, &bad).await;
    assert!(reasons.contains(&"RepairPassed".to_string()), "{reasons:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_offender_stays_quarantined_until_it_is_repaired() {
    let env = OperatorEnv::shared(fleet(), "lc-repeat").await;
    let bad = env.node("gpu-02");
    let mut q = cordon(1);
    q["repeatOffenderQuarantines"] = json!(2);
    env.create_test("lc-repeat", spec(&env, q, json!({}))).await;
    wait_status(&env, "lc-repeat", "first quarantine", |s| holds(s, &bad)).await;

    // Fixed, released by a pass; broken again, quarantined a second time: an offender.
    set_gpu_02_faults(&env, vec![]);
    env.run_now("lc-repeat").await;
    wait_status(&env, "lc-repeat", "released", |s| !holds(s, &bad)).await;
    set_gpu_02_faults(&env, vec![straggler()]);
    env.run_now("lc-repeat").await;
    let s = wait_status(&env, "lc-repeat", "second quarantine", |s| {
        holds(s, &bad) && s.repeat_offenders.contains(&bad)
    })
    .await;
    assert!(health(&s, &bad).is_some_and(|h| h.standing == Standing::RepeatOffender));
    let metrics = env.operator.metrics().await;
    assert!(
        metrics.contains("gpufabric_repeat_offender_nodes{test=\"lc-repeat\"} 1"),
        "{metrics}"
    );

    // Passing runs no longer release it.
    set_gpu_02_faults(&env, vec![]);
    let before = s.last_run.map(|r| r.name);
    env.run_now("lc-repeat").await;
    let s = wait_status(&env, "lc-repeat", "a passing run folded", |s| {
        s.last_run.as_ref().map(|r| &r.name) != before.as_ref()
    })
    .await;
    assert!(
        holds(&s, &bad),
        "a repeat offender is not released by passes"
    );
    assert!(
        health(&s, &bad)
            .and_then(|h| h.held_back.as_deref())
            .is_some_and(|m| m.contains("repeat offender")),
        "{s:#?}"
    );
    assert!(
        events_on(&env, &bad)
            .await
            .contains(&"RepeatOffender".to_string())
    );

    // A repair does.
    env.annotate_node("gpu-02", ANNOTATION_REPAIRED, "board swapped")
        .await;
    let s = wait_status(&env, "lc-repeat", "released by the repair", |s| {
        !holds(s, &bad)
    })
    .await;
    assert!(s.repeat_offenders.is_empty());
    assert!(health(&s, &bad).is_some_and(|h| !h.standing.is_repeat_offender()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gated_nodes_are_tested_at_once_opened_on_pass_and_kept_on_failure() {
    let env = OperatorEnv::shared(fleet(), "lc-gate").await;
    let (good, bad) = (env.node("gpu-01"), env.node("gpu-02"));
    gate(&env, &good).await;
    gate(&env, &bad).await;
    // A schedule that is not due: only the gate starts a run.
    env.create_test(
        "lc-gate",
        spec(&env, cordon(3), json!({"schedule": "0 3 1 1 *"})),
    )
    .await;
    let s = wait_status(&env, "lc-gate", "the gated nodes tested", |s| {
        health(s, &good).is_some_and(|h| h.last_measured.is_some())
            && holds(s, &bad)
            && s.targets.is_empty()
    })
    .await;
    let runs = env.runs_of("lc-gate").await;
    assert_eq!(runs.len(), 1, "one targeted run, nothing else");
    assert_eq!(runs[0].spec.trigger, Trigger::Targeted);
    let mut named: Vec<&String> = runs[0].spec.reasons.keys().collect();
    named.sort();
    assert_eq!(named, [&good, &bad]);
    assert!(s.nodes.iter().all(|h| h.node == good || h.node == bad));
    wait_node(&env, &good, "the gate opened on the pass", |n| !gated(n)).await;
    let b = env.read_node("gpu-02").await;
    assert!(gated(&b), "the gate stays on a failure");
    assert!(cordoned(&b), "and the policy quarantines it");
    assert!(
        events_on(&env, &good)
            .await
            .contains(&"ValidationPassed".to_string())
    );
    assert!(
        events_on(&env, &bad)
            .await
            .contains(&"ValidationFailed".to_string())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_gated_node_stays_gated_and_is_tried_again() {
    let env = OperatorEnv::shared(fleet(), "lc-busy").await;
    let node = env.node("gpu-03");
    let holder = gpufabric_tests::fixtures::hold_gpus(&env.cluster.client(), &env.ns, &node, 8)
        .await
        .expect("a training job holds gpu-03");
    gate(&env, &node).await;
    env.create_test(
        "lc-busy",
        spec(&env, cordon(3), json!({"schedule": "0 3 1 1 *"})),
    )
    .await;
    let s = wait_status(&env, "lc-busy", "the busy gated node not measured", |s| {
        s.targets.iter().any(|t| t.node == node && t.attempts >= 1) && s.last_run.is_some()
    })
    .await;
    assert!(health(&s, &node).is_none_or(|h| h.last_measured.is_none()));
    assert!(
        gated(&env.read_node("gpu-03").await),
        "not measured: the gate stays"
    );
    let said = gpufabric_tests::events::about(&env.cluster.client(), "default", "lc-busy").await;
    assert!(
        said.iter()
            .any(|(r, note)| r == "TargetNotMeasured" && note.contains("busy")),
        "{said:?}"
    );

    // The job ends: the next attempt measures it and opens the gate.
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(env.cluster.client(), &env.ns);
    pods.delete(&holder.name_any(), &DeleteParams::default().grace_period(0))
        .await
        .expect("the job ends");
    wait_node(&env, &node, "the gate opened on the retry", |n| !gated(n)).await;
    let s = wait_status(&env, "lc-busy", "the retry folded", |s| {
        s.targets.is_empty()
    })
    .await;
    assert!(health(&s, &node).is_some_and(|h| h.verdict == NodeVerdict::Passed));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_joins_is_gated_and_tested_before_it_takes_work() {
    let env = OperatorEnv::shared(SimFleet::uniform("gpu", 2, H100, 8), "lc-join").await;
    env.create_test(
        "lc-join",
        spec(
            &env,
            cordon(3),
            json!({"schedule": "0 3 1 1 *", "nodeLifecycle": {"gateNewNodes": true}}),
        ),
    )
    .await;
    // The test's nodes exist already: none is gated.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!gated(&env.read_node("gpu-01").await));
    let EnvCluster::Shared(shared) = &env.cluster else {
        panic!("a shared control plane");
    };
    let mut joined = SimFleet::uniform("new", 1, H100, 8);
    let (k, v) = gpufabric_tests::fleet::POOL_LABEL;
    joined.nodes[0].labels.insert(k.into(), v.into());
    let (_fleet, _kubelet) = shared
        .start_kubelet(joined, Default::default())
        .await
        .expect("a node joins");
    let new = env.node("new-01");
    wait_node(&env, &new, "the joined node gated", |n| {
        n.annotations().get(ANNOTATION_GATED).map(String::as_str) == Some("lc-join")
    })
    .await;
    wait_node(&env, &new, "tested and the gate opened", |n| {
        !gated(n) && n.annotations().contains_key(ANNOTATION_GATED)
    })
    .await;
    let s = wait_status(&env, "lc-join", "the run folded", |s| {
        health(s, &new).is_some_and(|h| h.verdict == NodeVerdict::Passed)
    })
    .await;
    assert!(
        s.nodes.iter().all(|h| h.node == new),
        "only the new node ran: {s:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_targeted_run_tests_two_named_nodes_now() {
    let env = OperatorEnv::shared(fleet(), "lc-named").await;
    env.create_test(
        "lc-named",
        spec(
            &env,
            json!({"mode": "Observe"}),
            json!({"schedule": "0 3 1 1 *"}),
        ),
    )
    .await;
    let (a, b) = (env.node("gpu-01"), env.node("gpu-03"));
    let patch =
        json!({"metadata": {"annotations": {ANNOTATION_RUN_NODES: format!("{a},{b},not-a-node")}}});
    env.tests_api()
        .patch("lc-named", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("annotated");
    let s = wait_status(&env, "lc-named", "the targeted run folded", |s| {
        s.last_run.is_some()
    })
    .await;
    let mut tested: Vec<&str> = s.nodes.iter().map(|h| h.node.as_str()).collect();
    tested.sort();
    assert_eq!(tested, [a.as_str(), b.as_str()]);
    let runs = env.runs_of("lc-named").await;
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].spec.trigger, Trigger::Targeted);
    let t = env.tests_api().get("lc-named").await.expect("test");
    assert!(
        !t.annotations().contains_key(ANNOTATION_RUN_NODES),
        "consumed"
    );
    let reasons =
        gpufabric_tests::events::reasons(&env.cluster.client(), "default", "lc-named").await;
    assert!(
        reasons.contains(&"TargetNotSelected".to_string()),
        "{reasons:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_condition_set_by_another_tool_starts_a_run() {
    let env = OperatorEnv::shared(fleet(), "lc-cond").await;
    env.create_test(
        "lc-cond",
        spec(
            &env,
            json!({"mode": "Observe"}),
            json!({"schedule": "0 3 1 1 *",
                "nodeLifecycle": {"testOnConditions": ["XidCriticalError"]}}),
        ),
    )
    .await;
    let node = env.node("gpu-04");
    let api: Api<Node> = Api::all(env.cluster.client());
    let condition = json!({"status": {"conditions": [{
        "type": "XidCriticalError", "status": "True", "reason": "Xid79",
        "message": "GPU has fallen off the bus",
        "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
        "lastHeartbeatTime": k8s_openapi::jiff::Timestamp::now().to_string()
    }]}});
    api.patch_status(
        &node,
        &PatchParams {
            field_manager: Some("node-problem-detector".into()),
            ..PatchParams::default()
        },
        &Patch::Strategic(&condition),
    )
    .await
    .expect("condition set");
    let s = wait_status(&env, "lc-cond", "the condition's run folded", |s| {
        health(s, &node).is_some_and(|h| h.last_measured.is_some())
    })
    .await;
    assert_eq!(s.nodes.len(), 1, "only that node: {s:#?}");
    let runs = env.runs_of("lc-cond").await;
    assert_eq!(runs.len(), 1);
    assert!(
        runs[0].spec.reasons[&node].contains("XidCriticalError=True (Xid79"),
        "{:?}",
        runs[0].spec.reasons
    );
    // Tested once per time the condition turns True: no second run.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(env.runs_of("lc-cond").await.len(), 1);
}
