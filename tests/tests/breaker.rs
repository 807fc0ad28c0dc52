//! The cluster-wide breaker: the real `fabric-operator` against a real control plane, the
//! process-kubelet and the sim agents. A storm of failing nodes (an agent that measures
//! garbage on every node) opens a FabricTest's breaker and touches no node; only a person's
//! reset closes it; it survives the operator being killed; the cluster-wide cap holds over
//! two FabricTests.
//!
//! The tests run in parallel. All but the percent cap share the binary's control plane,
//! each with its own operator, namespace and prefixed, labelled nodes; the count cap counts
//! every node gpufabric holds in the cluster, and the other shared tests hold none.
//!
//! Build the binaries first: `cargo build --bins`, then
//! `cargo test -p gpufabric-tests --test breaker`.

use gpufabric_api::keys::{
    ANNOTATION_RESET_BREAKER, ANNOTATION_RUN_NOW, CONDITION_NODE_DEGRADED, LABEL_TEST,
};
use gpufabric_api::run::FabricTestRun;
use gpufabric_api::{FabricTest, FabricTestStatus};
use gpufabric_measure::fleet::{Fault, Fleet};
use gpufabric_tests::fleet::{H100, SimFleet};
use gpufabric_tests::operator::{
    OperatorEnv, quarantine_on_first_failure, sim_agent, taints_without_lifecycle,
};
use gpufabric_tests::wait;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

/// `n` nodes; those whose index is in `failing` have a straggler GPU, which the default
/// suite measures and fails.
fn fleet(n: usize, failing: &[usize]) -> Fleet {
    let mut f = SimFleet::uniform("gpu", n, H100, 8);
    for i in failing {
        f.nodes[*i].faults.push(Fault::Straggler {
            gpu: 1,
            factor: 1.5,
        });
    }
    f
}

/// A FabricTest of `env`'s nodes that acts on the first failure (no confirmation run) and
/// may hold every node: only the breaker and the cap can stop it.
fn spec(env: &OperatorEnv, mode: &str, nodes: Option<Vec<String>>) -> serde_json::Value {
    let mut spec = json!({
        "nodeSelector": env.node_selector(),
        "quarantine": quarantine_on_first_failure(mode, false),
        "agent": sim_agent(60)
    });
    if let Some(nodes) = nodes {
        spec["nodes"] = json!(nodes);
    }
    spec
}

fn breaker(status: &FabricTestStatus) -> Option<&Condition> {
    status.conditions.iter().find(|c| c.type_ == "BreakerOpen")
}

fn breaker_is(status: &FabricTestStatus, open: bool) -> bool {
    let want = if open { "True" } else { "False" };
    breaker(status).is_some_and(|c| c.status == want)
}

/// Waits until the test's status satisfies `cond` with no run active, or fails with the
/// status and the operator's log.
async fn wait_status(
    env: &OperatorEnv,
    api: &Api<FabricTest>,
    name: &str,
    what: &str,
    cond: impl Fn(&FabricTest, &FabricTestStatus) -> bool + Send + Sync,
) -> FabricTest {
    let r = wait::for_object(api, name, Duration::from_secs(180), |t| {
        t.is_some_and(|t| {
            t.status
                .as_ref()
                .is_some_and(|s| s.active_run.is_none() && cond(t, s))
        })
    })
    .await;
    match r {
        Ok(Some(t)) => t,
        other => {
            let status = api.get(name).await.ok().and_then(|t| t.status);
            panic!(
                "{name}: {what}: {other:?}\nstatus: {status:#?}\noperator log:\n{}\npods:\n{}",
                env.operator.log_tail(80),
                env.pod_logs()
            )
        }
    }
}

/// What gpufabric could change on each of `env`'s nodes: labels, annotations (but the
/// counters record), cordon,
/// taints (without what the control plane manages itself), and the `GPUFabricDegraded`
/// condition that remediation tools act on.
async fn node_views(env: &OperatorEnv) -> BTreeMap<String, serde_json::Value> {
    let mut out = BTreeMap::new();
    for (name, n) in env.nodes().await {
        let labels: BTreeMap<String, String> = n
            .labels()
            .iter()
            .filter(|(k, _)| !k.starts_with("beta.kubernetes.io/"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let degraded = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == CONDITION_NODE_DEGRADED))
            .map(|c| c.status.clone());
        let view = json!({
            "degraded": degraded,
            "labels": labels,
            // The counters record is bookkeeping of the hardware, written after every
            // measured run whatever the breaker says; it acts on nothing.
            "annotations": n
                .annotations()
                .iter()
                .filter(|(k, _)| k.as_str() != gpufabric_api::keys::ANNOTATION_COUNTERS)
                .collect::<BTreeMap<_, _>>(),
            "unschedulable": n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false),
            "taints": taints_without_lifecycle(&n),
        });
        out.insert(name, view);
    }
    out
}

fn cordoned(view: &serde_json::Value) -> bool {
    view["unschedulable"] == json!(true)
}

/// The reasons of the Events on the FabricTest `name`, one entry per Event object.
async fn event_reasons(env: &OperatorEnv, name: &str) -> Vec<String> {
    gpufabric_tests::events::reasons(&env.cluster.client(), "default", name).await
}

async fn runs_of(env: &OperatorEnv, test: &str) -> Vec<FabricTestRun> {
    let api: Api<FabricTestRun> = env.runs_api();
    api.list(&ListParams::default().labels(&format!("{LABEL_TEST}={test}")))
        .await
        .expect("runs listed")
        .items
}

async fn annotate(api: &Api<FabricTest>, name: &str, key: &str, value: &str) {
    let patch = json!({"metadata": {"annotations": {key: value}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("annotation set");
}

/// The value of `gpufabric_breaker_open` for the test `name`, as the operator serves it.
async fn breaker_metric(env: &OperatorEnv, name: &str) -> Option<String> {
    let series = format!("gpufabric_breaker_open{{test=\"{name}\"}} ");
    let text = env.operator.metrics().await;
    text.lines()
        .find_map(|l| l.strip_prefix(&series))
        .map(|v| v.trim().to_string())
}

/// Polls the metric until it reads `want` (the state metrics refresh at each scrape, from
/// the operator's cache of FabricTests).
async fn wait_breaker_metric(env: &OperatorEnv, name: &str, want: &str) {
    let r = wait::poll(
        "the breaker metric",
        Duration::from_secs(30),
        Duration::from_millis(500),
        || async { Ok((breaker_metric(env, name).await.as_deref() == Some(want)).then_some(())) },
    )
    .await;
    if r.is_err() {
        panic!(
            "gpufabric_breaker_open of {name} never read {want}; it reads {:?}",
            breaker_metric(env, name).await
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_opens_the_breaker_touches_no_node_and_only_a_reset_closes_it() {
    // Every node fails: an agent image that measures garbage looks like this.
    let env = OperatorEnv::shared(fleet(4, &[0, 1, 2, 3]), "storm").await;
    let before = node_views(&env).await;
    for mode in ["Cordon", "Taint"] {
        let name = format!("storm-{}", mode.to_lowercase());
        let tests = env.create_test(&name, spec(&env, mode, None)).await;
        let t = wait_status(&env, &tests, &name, "the breaker opens", |_, s| {
            s.last_run.is_some() && breaker_is(s, true)
        })
        .await;
        let status = t.status.expect("status");
        let c = breaker(&status).expect("condition");
        assert_eq!(c.reason, "BreakerOpen");
        assert!(
            c.message
                .contains("4 of 4 measured nodes failed (more than 50%)"),
            "{c:?}"
        );
        assert!(c.message.contains(ANNOTATION_RESET_BREAKER), "{c:?}");
        assert_eq!(status.quarantined_count, 0, "{mode}: {status:#?}");
        assert_eq!(status.nodes.len(), 4, "{status:#?}");
        for n in &status.nodes {
            assert!(
                n.held_back
                    .as_deref()
                    .is_some_and(|h| h.contains("breaker is open")),
                "{mode}: {n:?}"
            );
        }
        assert_eq!(node_views(&env).await, before, "{mode}: a node was touched");
        assert_eq!(runs_of(&env, &name).await.len(), 1, "no confirmation run");
        let reasons = event_reasons(&env, &name).await;
        assert_eq!(
            reasons.iter().filter(|r| *r == "BreakerOpen").count(),
            1,
            "one Event: {reasons:?}"
        );
        assert!(!reasons.iter().any(|r| r == "Quarantined"), "{reasons:?}");
        wait_breaker_metric(&env, &name, "1").await;

        // A person resets it: the condition says so, the annotation goes, and the run
        // judged while it was open still changes nothing.
        annotate(
            &tests,
            &name,
            ANNOTATION_RESET_BREAKER,
            "checked the driver",
        )
        .await;
        let t = wait_status(&env, &tests, &name, "the reset closes it", |t, s| {
            breaker_is(s, false) && !t.annotations().contains_key(ANNOTATION_RESET_BREAKER)
        })
        .await;
        let c = breaker(t.status.as_ref().expect("status"))
            .expect("condition")
            .clone();
        assert_eq!(c.reason, "BreakerReset");
        assert!(c.message.contains("checked the driver"), "{c:?}");
        wait_breaker_metric(&env, &name, "0").await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            node_views(&env).await,
            before,
            "{mode}: a node was touched after the reset"
        );
        assert!(
            event_reasons(&env, &name)
                .await
                .contains(&"BreakerReset".to_string())
        );
        tests
            .delete(&name, &DeleteParams::default())
            .await
            .expect("test deleted");
        wait::for_deletion(&tests, &name, Duration::from_secs(60))
            .await
            .expect("test gone");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_breaker_stays_open_when_the_operator_is_killed_and_started_again() {
    let mut env = OperatorEnv::shared(fleet(4, &[0, 1, 2, 3]), "restart").await;
    let tests = env.create_test("restart", spec(&env, "Cordon", None)).await;
    let t = wait_status(&env, &tests, "restart", "the breaker opens", |_, s| {
        s.last_run.is_some() && breaker_is(s, true)
    })
    .await;
    let status = t.status.expect("status");
    let opened = breaker(&status).expect("condition").clone();
    let first_run = status.last_run.expect("last run").name;
    let before = node_views(&env).await;

    // SIGKILL while open; meanwhile three nodes are repaired, so the next run is no storm
    // and would cordon the one still failing if the breaker had been forgotten.
    env.operator.kill();
    let mut repaired = env.fleet.fleet().clone();
    for n in repaired.nodes.iter_mut() {
        if n.name != env.node("gpu-02") {
            n.faults.clear();
        }
    }
    SimFleet::write_to(repaired, env.fleet.path()).expect("fleet rewritten");
    env.operator.restart();
    annotate(&tests, "restart", ANNOTATION_RUN_NOW, "after-restart").await;

    let t = wait_status(
        &env,
        &tests,
        "restart",
        "a run after the restart",
        |_, s| s.last_run.as_ref().is_some_and(|r| r.name != first_run),
    )
    .await;
    let status = t.status.expect("status");
    let last = status.last_run.as_ref().expect("last run");
    assert_eq!((last.failed, last.passed), (1, 3), "{status:#?}");
    let c = breaker(&status).expect("condition");
    assert_eq!(c.status, "True", "{c:?}");
    assert_eq!(
        c.message, opened.message,
        "the condition still names the storm"
    );
    assert_eq!(c.last_transition_time, opened.last_transition_time);
    assert_eq!(status.quarantined_count, 0, "{status:#?}");
    let failing = env.node("gpu-02");
    let held = status
        .nodes
        .iter()
        .find(|n| n.node == failing)
        .and_then(|n| n.held_back.clone());
    assert!(
        held.as_deref()
            .is_some_and(|h| h.contains("breaker is open")),
        "{held:?}"
    );
    let after = node_views(&env).await;
    assert!(!cordoned(&after[&failing]), "{failing} was cordoned");
    assert_eq!(after, before, "a node was touched after the restart");
    wait_breaker_metric(&env, "restart", "1").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_cap_refuses_a_node_beyond_it_across_two_fabric_tests() {
    // gpu-02 and gpu-04 fail; each test sees one failing node of two (no storm).
    let env =
        OperatorEnv::shared_with(fleet(4, &[1, 3]), "cap", &["--max-quarantined-nodes", "1"]).await;
    let (n1, n2, n3, n4) = (
        env.node("gpu-01"),
        env.node("gpu-02"),
        env.node("gpu-03"),
        env.node("gpu-04"),
    );
    let a = env
        .create_test("cap-a", spec(&env, "Cordon", Some(vec![n1, n2.clone()])))
        .await;
    wait_status(&env, &a, "cap-a", "gpu-02 quarantined", |_, s| {
        s.quarantined_nodes == [n2.clone()]
    })
    .await;

    let b = env
        .create_test("cap-b", spec(&env, "Cordon", Some(vec![n3, n4.clone()])))
        .await;
    let t = wait_status(&env, &b, "cap-b", "its run folded", |_, s| {
        s.last_run.is_some()
    })
    .await;
    let status = t.status.expect("status");
    assert_eq!(status.quarantined_count, 0, "{status:#?}");
    let held = status
        .nodes
        .iter()
        .find(|n| n.node == n4)
        .and_then(|n| n.held_back.clone());
    assert!(
        held.as_deref()
            .is_some_and(|h| h.contains("cluster-wide cap")
                && h.contains("holds 1 node(s) in the cluster, the cap is 1")),
        "{held:?}"
    );
    let views = node_views(&env).await;
    assert!(cordoned(&views[&n2]), "{n2} is cap-a's");
    // Without a breaker, the signals a remediation tool reads are written (what the storm
    // tests check stays absent).
    assert_eq!(views[&n2]["degraded"], json!("True"), "{views:#?}");
    assert!(!cordoned(&views[&n4]), "{n4} is beyond the cap");
    assert!(
        event_reasons(&env, "cap-b")
            .await
            .contains(&"OverClusterCap".to_string())
    );

    // cap-a goes and releases its node: the slot is free for cap-b's next run.
    a.delete("cap-a", &DeleteParams::default())
        .await
        .expect("cap-a deleted");
    wait::for_deletion(&a, "cap-a", Duration::from_secs(60))
        .await
        .expect("cap-a gone");
    annotate(&b, "cap-b", ANNOTATION_RUN_NOW, "again").await;
    wait_status(&env, &b, "cap-b", "gpu-04 quarantined", |_, s| {
        s.quarantined_nodes == [n4.clone()]
    })
    .await;
    let views = node_views(&env).await;
    assert!(
        !cordoned(&views[&n2]) && cordoned(&views[&n4]),
        "{views:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_percent_cap_counts_the_clusters_gpu_nodes_and_holds_the_rest_back() {
    // Ten GPU nodes, four failing (40%: below the storm share), a cap of 20%: two nodes.
    let env = OperatorEnv::start_own(
        fleet(10, &[1, 3, 5, 7]),
        "cap-percent",
        &["--max-quarantined-nodes", "20%"],
    )
    .await;
    let failing: Vec<String> = ["gpu-02", "gpu-04", "gpu-06", "gpu-08"]
        .iter()
        .map(|n| env.node(n))
        .collect();
    let api = env.create_test("cap-pct", spec(&env, "Cordon", None)).await;
    let t = wait_status(&env, &api, "cap-pct", "two nodes quarantined", |_, s| {
        s.last_run.is_some() && s.quarantined_count == 2
    })
    .await;
    let status = t.status.expect("status");
    assert!(!breaker_is(&status, true), "no storm: {status:#?}");
    let held: Vec<&str> = status
        .nodes
        .iter()
        .filter(|n| {
            n.held_back
                .as_deref()
                .is_some_and(|h| h.contains("holds 2 node(s) in the cluster, the cap is 2"))
        })
        .map(|n| n.node.as_str())
        .collect();
    assert_eq!(held.len(), 2, "{:#?}", status.nodes);
    let views = node_views(&env).await;
    let cordoned_nodes: Vec<&String> = views
        .iter()
        .filter(|(_, v)| cordoned(v))
        .map(|(n, _)| n)
        .collect();
    assert_eq!(cordoned_nodes.len(), 2, "{views:#?}");
    for n in cordoned_nodes
        .iter()
        .map(|n| n.as_str())
        .chain(held.iter().copied())
    {
        assert!(
            failing.iter().any(|f| f == n),
            "{n} is healthy but was acted on"
        );
    }
    assert!(
        event_reasons(&env, "cap-pct")
            .await
            .contains(&"OverClusterCap".to_string())
    );
}
