//! The lifecycle at its edges, on the real control plane: a machine that rejoins under a
//! known name, a gate put on by hand, targeted runs close together, a flapping condition,
//! repairs that cannot act (an open breaker, a node someone else cordoned), and `Replace`
//! next to a targeted run.
//!
//! Build the binaries first: `cargo build -p gpufabric-agent -p gpufabric-operator`, then
//! `cargo test -p gpufabric-tests --test lifecycle_edges`.

use gpufabric_api::keys::{
    ANNOTATION_GATED, ANNOTATION_REPAIRED, ANNOTATION_RESET_BREAKER, ANNOTATION_RUN_NODES,
    ANNOTATION_RUN_NOW, TAINT_VALIDATION,
};
use gpufabric_api::run::{NodeVerdict, Trigger};
use gpufabric_api::test::{CONDITION_RUNS_PER_WINDOW, NodeHealth};
use gpufabric_api::{FabricTest, FabricTestStatus};
use gpufabric_measure::fleet::Fault;
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

fn straggler() -> Fault {
    Fault::Straggler {
        gpu: 1,
        factor: 1.5,
    }
}

/// Sets the faults of the nodes `faults` names (by index) in the fleet file the agents
/// read; the others have none.
fn set_faults(env: &Env, faults: &[(usize, Fault)]) {
    let mut f = env.fleet.fleet().clone();
    for (i, n) in f.nodes.iter_mut().enumerate() {
        n.faults = faults
            .iter()
            .filter(|(at, _)| *at == i)
            .map(|(_, fault)| fault.clone())
            .collect();
    }
    SimFleet::write_to(f, env.fleet.path()).expect("fleet rewritten");
}

/// A FabricTest over the environment's nodes on the sim backend, its schedule far away.
fn spec(env: &Env, quarantine: serde_json::Value, extra: serde_json::Value) -> serde_json::Value {
    let mut s = json!({
        "nodeSelector": env.node_selector(),
        "quarantine": quarantine,
        "schedule": "0 3 1 1 *",
        "agent": sim_agent(60)
    });
    if let (Some(s), Some(extra)) = (s.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            s.insert(k.clone(), v.clone());
        }
    }
    s
}

fn observe() -> serde_json::Value {
    json!({"mode": "Observe"})
}

/// Cordon mode on the first failure, no confirmation run, every node may be held.
fn cordon_at_once() -> serde_json::Value {
    json!({"mode": "Cordon", "maxQuarantined": 4, "confirmRetest": false,
        "failuresToQuarantine": 1, "passesToRelease": 3})
}

async fn wait_status(
    env: &Env,
    name: &str,
    what: &str,
    cond: impl Fn(&FabricTest, &FabricTestStatus) -> bool + Send + Sync,
) -> FabricTestStatus {
    env.wait_test_idle(name, what, WAIT, cond).await
}

/// Waits until node `name` satisfies `cond`.
async fn wait_node(env: &Env, name: &str, what: &str, cond: impl Fn(&Node) -> bool + Send + Sync) {
    env.wait_node(name, what, WAIT, cond).await
}

/// A change a person makes with kubectl.
async fn as_kubectl(env: &Env, node: &str, patch: serde_json::Value) {
    env.patch_node_as_kubectl(node, patch).await
}

async fn annotate_test(env: &Env, name: &str, key: &str, value: &str) {
    let patch = json!({"metadata": {"annotations": {key: value}}});
    env.tests_api()
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("test annotated");
}

fn health<'a>(s: &'a FabricTestStatus, node: &str) -> Option<&'a NodeHealth> {
    s.nodes.iter().find(|h| h.node == node)
}

fn holds(s: &FabricTestStatus, node: &str) -> bool {
    s.quarantined_nodes.iter().any(|n| n == node)
}

fn gated(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == TAINT_VALIDATION))
}

async fn events_on(env: &Env, object: &str) -> Vec<String> {
    gpufabric_tests::events::reasons(&env.cluster.client(), "default", object).await
}

/// Polls `check` until it gives a value; panics after [`WAIT`] with `what`.
async fn until<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    wait::poll(what, WAIT, Duration::from_millis(500), || {
        let fut = check();
        async move { Ok(fut.await) }
    })
    .await
    .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// The targeted runs of `test` whose reasons name `node`.
async fn targeted_runs_of(env: &Env, test: &str, node: &str) -> usize {
    env.runs_of(test)
        .await
        .iter()
        .filter(|r| r.spec.trigger == Trigger::Targeted && r.spec.reasons.contains_key(node))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_that_rejoins_under_a_known_name_is_gated_and_tested_again() {
    let env = OperatorEnv::shared(SimFleet::uniform("gpu", 1, H100, 8), "lce-rejoin").await;
    env.create_test(
        "lce-rejoin",
        spec(
            &env,
            observe(),
            json!({"nodeLifecycle": {"gateNewNodes": true}}),
        ),
    )
    .await;
    // Nodes join after the test, not within its creation second.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let EnvCluster::Shared(shared) = &env.cluster else {
        panic!("a shared control plane");
    };
    let joining = || {
        let mut f = SimFleet::uniform("re", 1, H100, 8);
        let (k, v) = gpufabric_tests::fleet::POOL_LABEL;
        f.nodes[0].labels.insert(k.into(), v.into());
        f
    };
    let (_fleet, kubelet) = shared
        .start_kubelet(joining(), Default::default())
        .await
        .expect("a node joins");
    let node = env.node("re-01");
    wait_node(&env, &node, "gated and then opened by a pass", |n| {
        !gated(n) && n.annotations().contains_key(ANNOTATION_GATED)
    })
    .await;
    let first = wait_status(&env, "lce-rejoin", "the first machine measured", |_, s| {
        health(s, &node).is_some_and(|h| h.verdict == NodeVerdict::Passed)
    })
    .await;
    assert_eq!(targeted_runs_of(&env, "lce-rejoin", &node).await, 1);

    // The machine is re-imaged: its Node is deleted and registered again, same name (the
    // operator allows for a little clock skew between itself and the API server).
    let skew = gpufabric_operator::lifecycle::targets::CLOCK_SKEW_SECONDS as u64;
    tokio::time::sleep(Duration::from_secs(skew + 1)).await;
    drop(kubelet);
    let nodes: Api<Node> = Api::all(env.cluster.client());
    nodes
        .delete(&node, &DeleteParams::default())
        .await
        .expect("node deleted");
    wait::for_deletion(&nodes, &node, Duration::from_secs(60))
        .await
        .expect("node gone");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (_fleet, _kubelet) = shared
        .start_kubelet(joining(), Default::default())
        .await
        .expect("the machine registers again");
    wait_node(&env, &node, "the new machine gated", |n| {
        n.annotations().get(ANNOTATION_GATED).map(String::as_str) == Some("lce-rejoin")
    })
    .await;
    wait_node(&env, &node, "tested and opened again", |n| {
        !gated(n) && n.annotations().contains_key(ANNOTATION_GATED)
    })
    .await;
    let s = wait_status(&env, "lce-rejoin", "the new machine measured", |_, s| {
        health(s, &node).is_some_and(|h| {
            h.verdict == NodeVerdict::Passed
                && h.last_measured > health(&first, &node).and_then(|f| f.last_measured.clone())
        })
    })
    .await;
    assert!(
        health(&s, &node).is_some_and(|h| h.consecutive_passes == 1),
        "its history started again: {s:#?}"
    );
    assert_eq!(targeted_runs_of(&env, "lce-rejoin", &node).await, 2);
    assert!(
        events_on(&env, &node)
            .await
            .contains(&"NodeRejoined".to_string())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_put_by_hand_on_a_measured_node_is_tested_at_once() {
    let env = OperatorEnv::shared(SimFleet::uniform("gpu", 2, H100, 8), "lce-hand").await;
    env.create_test("lce-hand", spec(&env, observe(), json!({})))
        .await;
    let node = env.node("gpu-01");
    annotate_test(&env, "lce-hand", ANNOTATION_RUN_NODES, &node).await;
    wait_status(&env, "lce-hand", "measured once", |_, s| {
        health(s, &node).is_some_and(|h| h.last_measured.is_some())
    })
    .await;

    // After maintenance, a person puts the gate on.
    let gate = |on: bool| {
        let taints = if on {
            json!([{"key": TAINT_VALIDATION, "value": "maintenance", "effect": "NoSchedule"}])
        } else {
            serde_json::Value::Null
        };
        json!({"spec": {"taints": taints}})
    };
    as_kubectl(&env, &node, gate(true)).await;
    wait_node(&env, &node, "tested and the gate opened", |n| !gated(n)).await;
    // The run named by hand, then the gate's.
    assert_eq!(targeted_runs_of(&env, "lce-hand", &node).await, 2);

    // A second time: a second request.
    wait_status(&env, "lce-hand", "gate seen gone", |_, s| {
        health(s, &node).is_some_and(|h| h.gated_since.is_none())
    })
    .await;
    as_kubectl(&env, &node, gate(true)).await;
    wait_node(&env, &node, "tested and opened again", |n| !gated(n)).await;
    assert_eq!(targeted_runs_of(&env, "lce-hand", &node).await, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targeted_runs_of_the_same_nodes_within_a_minute_each_run_under_their_own_name() {
    let env = OperatorEnv::shared(SimFleet::uniform("gpu", 2, H100, 8), "lce-names").await;
    env.create_test("lce-names", spec(&env, observe(), json!({})))
        .await;
    let node = env.node("gpu-02");
    let mut names = Vec::new();
    for round in 0..3 {
        annotate_test(&env, "lce-names", ANNOTATION_RUN_NODES, &node).await;
        let s = wait_status(&env, "lce-names", "the targeted run folded", |t, s| {
            !t.annotations().contains_key(ANNOTATION_RUN_NODES)
                && s.last_run
                    .as_ref()
                    .is_some_and(|l| !names.contains(&l.name))
        })
        .await;
        names.push(s.last_run.expect("a run").name);
        assert_eq!(
            targeted_runs_of(&env, "lce-names", &node).await,
            round + 1,
            "each request made its own run: {names:?}"
        );
    }
    // The Event says which run tests which node and why, in words.
    let about = gpufabric_tests::events::about(&env.cluster.client(), "default", "lce-names").await;
    let created: Vec<&String> = about
        .iter()
        .filter(|(r, _)| r == "RunCreated")
        .map(|(_, note)| note)
        .collect();
    assert!(
        created.iter().any(|note| names
            .iter()
            .any(|n| note.contains(&format!("created targeted run {n} for")))
            && note.contains(&node)
            && note.contains("named by hand on the FabricTest")),
        "a RunCreated Event names the targeted run, the node and why: {created:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flapping_condition_starts_one_run_per_rise_up_to_the_bound_and_counts_the_drops() {
    let env = OperatorEnv::shared(SimFleet::uniform("gpu", 2, H100, 8), "lce-flap").await;
    env.create_test(
        "lce-flap",
        spec(
            &env,
            observe(),
            json!({"nodeLifecycle": {"testOnConditions": ["XidCriticalError"]}}),
        ),
    )
    .await;
    let node = env.node("gpu-01");
    let api: Api<Node> = Api::all(env.cluster.client());
    let set = |status: &'static str, at: k8s_openapi::jiff::Timestamp| {
        let api = api.clone();
        let node = node.clone();
        async move {
            let condition = json!({"status": {"conditions": [{
                "type": "XidCriticalError", "status": status, "reason": "Xid79",
                "message": "GPU has fallen off the bus",
                "lastTransitionTime": at.to_string(),
                "lastHeartbeatTime": at.to_string()
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
        }
    };
    // Twenty fast flaps, then one more rise at a time until the bound drops some.
    for _ in 0..20 {
        set("True", k8s_openapi::jiff::Timestamp::now()).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        set("False", k8s_openapi::jiff::Timestamp::now()).await;
    }
    for _ in 0..(CONDITION_RUNS_PER_WINDOW + 2) {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let at = k8s_openapi::jiff::Timestamp::now();
        set("True", at).await;
        wait_status(&env, "lce-flap", "the rise served", |_, s| {
            health(s, &node)
                .and_then(|h| h.condition_rise.as_ref())
                .is_some_and(|r| r.0.as_second() >= at.as_second())
        })
        .await;
        set("False", k8s_openapi::jiff::Timestamp::now()).await;
    }
    let s = wait_status(&env, "lce-flap", "settled", |_, _| true).await;
    let h = health(&s, &node).expect("history");
    let runs = targeted_runs_of(&env, "lce-flap", &node).await;
    assert_eq!(runs, CONDITION_RUNS_PER_WINDOW, "{h:?}");
    assert_eq!(h.condition_runs.len(), CONDITION_RUNS_PER_WINDOW);
    assert!(h.condition_rises_dropped >= 2, "{h:?}");
    // Each dropped rise is said once on the test, with the node and the bound.
    let bounded: Vec<String> =
        gpufabric_tests::events::about(&env.cluster.client(), "default", "lce-flap")
            .await
            .into_iter()
            .filter(|(r, _)| r == "ConditionRunsBounded")
            .map(|(_, note)| note)
            .collect();
    assert!(
        bounded.iter().any(|n| n.contains(&node)
            && n.contains(&format!(
                "{CONDITION_RUNS_PER_WINDOW} runs for its conditions in the last 10 minutes"
            ))),
        "a ConditionRunsBounded Event names the node and the bound: {bounded:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repair_during_an_open_breaker_waits_for_the_reset_and_then_releases() {
    let mut fleet = SimFleet::uniform("gpu", 4, H100, 8);
    fleet.nodes[1].faults.push(straggler());
    let env = OperatorEnv::shared(fleet, "lce-breaker").await;
    env.create_test("lce-breaker", spec(&env, cordon_at_once(), json!({})))
        .await;
    let bad = env.node("gpu-02");
    annotate_test(&env, "lce-breaker", ANNOTATION_RUN_NOW, "1").await;
    wait_status(&env, "lce-breaker", "gpu-02 quarantined", |_, s| {
        holds(s, &bad)
    })
    .await;

    // A storm: every node fails the next run, the breaker opens.
    set_faults(&env, &[0, 1, 2, 3].map(|i| (i, straggler())));
    annotate_test(&env, "lce-breaker", ANNOTATION_RUN_NOW, "2").await;
    wait_status(&env, "lce-breaker", "the breaker opens", |_, s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == "BreakerOpen" && c.status == "True")
    })
    .await;
    let runs_before = env.runs_of("lce-breaker").await.len();

    // gpu-02 is repaired while the breaker is open: nothing is used up.
    set_faults(&env, &[]);
    env.annotate_node("gpu-02", ANNOTATION_REPAIRED, "INC-9")
        .await;
    until("an Event says the repair waits", || async {
        events_on(&env, &bad)
            .await
            .contains(&"RepairWaiting".to_string())
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        env.runs_of("lce-breaker").await.len(),
        runs_before,
        "no run"
    );
    let n = env.read_node("gpu-02").await;
    assert!(n.annotations().contains_key(ANNOTATION_REPAIRED), "kept");
    assert!(cordoned(&n));

    // A run that measures it passing while the breaker is open uses nothing up either (and
    // gives the other nodes a passing judgement, so the repair run after the reset is no
    // storm).
    annotate_test(&env, "lce-breaker", ANNOTATION_RUN_NOW, "3").await;
    wait_status(&env, "lce-breaker", "a passing run while open", |_, s| {
        health(s, &bad).is_some_and(|h| h.verdict == NodeVerdict::Passed)
    })
    .await;
    let n = env.read_node("gpu-02").await;
    assert!(
        n.annotations().contains_key(ANNOTATION_REPAIRED) && cordoned(&n),
        "the repair is still there and the node still held"
    );

    annotate_test(
        &env,
        "lce-breaker",
        ANNOTATION_RESET_BREAKER,
        "driver fixed",
    )
    .await;
    wait_node(
        &env,
        &bad,
        "released by the repair run after the reset",
        |n| !cordoned(n) && !n.annotations().contains_key(ANNOTATION_REPAIRED),
    )
    .await;
    // The Event is published after the release it reports.
    until("the RepairPassed Event", || async {
        events_on(&env, &bad)
            .await
            .contains(&"RepairPassed".to_string())
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repair_on_a_node_someone_else_cordoned_starts_no_run_and_says_so_once() {
    let env = OperatorEnv::shared(SimFleet::uniform("gpu", 2, H100, 8), "lce-foreign").await;
    env.create_test("lce-foreign", spec(&env, cordon_at_once(), json!({})))
        .await;
    let node = env.node("gpu-01");
    as_kubectl(&env, &node, json!({"spec": {"unschedulable": true}})).await;
    env.annotate_node("gpu-01", ANNOTATION_REPAIRED, "INC-3")
        .await;
    wait_node(&env, &node, "the annotation declined", |n| {
        !n.annotations().contains_key(ANNOTATION_REPAIRED)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(env.runs_of("lce-foreign").await.is_empty(), "no run");
    let reasons = events_on(&env, &node).await;
    assert_eq!(
        reasons.iter().filter(|r| *r == "RepairIgnored").count(),
        1,
        "{reasons:?}"
    );
    assert!(cordoned(&env.read_node("gpu-01").await), "still theirs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replace_keeps_an_active_targeted_run_and_replaces_a_manual_one() {
    let env = OperatorEnv::shared(SimFleet::uniform("gpu", 2, H100, 8), "lce-replace").await;
    // gpu-02's agent hangs: its targeted run stays active until its deadline.
    set_faults(
        &env,
        &[(
            1,
            Fault::Hang {
                phase: None,
                stuck: true,
            },
        )],
    );
    env.create_test(
        "lce-replace",
        spec(&env, observe(), json!({"concurrencyPolicy": "Replace"})),
    )
    .await;
    let node = env.node("gpu-02");
    annotate_test(&env, "lce-replace", ANNOTATION_RUN_NODES, &node).await;
    let targeted = until("the targeted run", || async {
        env.runs_of("lce-replace")
            .await
            .into_iter()
            .find(|r| r.spec.trigger == Trigger::Targeted)
    })
    .await;
    annotate_test(&env, "lce-replace", ANNOTATION_RUN_NOW, "1").await;
    let manual = until("the manual run", || async {
        env.runs_of("lce-replace")
            .await
            .into_iter()
            .find(|r| r.spec.trigger == Trigger::Manual)
    })
    .await;
    // The request is carried out (its annotation removed) before the next one.
    until("run-now consumed", || async {
        let t = env.tests_api().get("lce-replace").await.ok()?;
        (!t.annotations().contains_key(ANNOTATION_RUN_NOW)).then_some(())
    })
    .await;
    annotate_test(&env, "lce-replace", ANNOTATION_RUN_NOW, "2").await;
    until("the first manual run replaced by the second", || async {
        let runs = env.runs_of("lce-replace").await;
        let manuals = runs
            .iter()
            .filter(|r| {
                r.spec.trigger == Trigger::Manual && r.metadata.deletion_timestamp.is_none()
            })
            .count();
        (manuals == 1 && !runs.iter().any(|r| r.name_any() == manual.name_any())).then_some(())
    })
    .await;
    let runs = env.runs_of("lce-replace").await;
    let t = runs
        .iter()
        .find(|r| r.name_any() == targeted.name_any())
        .expect("the targeted run is kept");
    assert!(t.metadata.deletion_timestamp.is_none(), "not being deleted");
}
