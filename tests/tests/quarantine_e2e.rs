//! Quarantine end to end: the real `fabric-operator` binary against a real control plane
//! (with kube-controller-manager), the process-kubelet and the sim agents. What a user sees
//! on the nodes after runs find faults, pass again, or the FabricTest is deleted.
//!
//! The tests share the binary's control plane and run in parallel: each has its own
//! operator, namespace and prefixed, labelled nodes, and its FabricTests select only those
//! nodes.
//!
//! Build the binaries first: `cargo build -p gpufabric-agent -p gpufabric-operator`, then
//! `cargo test -p gpufabric-tests --test quarantine_e2e`.

use gpufabric_api::keys::{ANNOTATION_QUARANTINE, LABEL_QUARANTINED, TAINT_QUARANTINED};
use gpufabric_api::quarantine::QuarantineRecord;
use gpufabric_api::run::{FabricTestRun, Trigger};
use gpufabric_api::{FabricTest, SubjectKind};
use gpufabric_measure::fleet::{Fault, Fleet};
use gpufabric_tests::fleet::{H100, SimFleet};
use gpufabric_tests::operator::{OperatorEnv, cordoned, sim_agent, taints_without_lifecycle};
use gpufabric_tests::wait;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

type Env = OperatorEnv;

/// The operator, a kubelet and `fleet` (nodes prefixed and labelled for the test) on the
/// shared control plane.
async fn setup(fleet: Fleet, name: &str) -> Env {
    OperatorEnv::shared(fleet, name).await
}

/// A FabricTest on the sim backend with the default suite (the sim models it in well under
/// a second per node): the GPU-pair copy matrix finds a slow pair, the DDP probe a straggler.
fn spec(env: &Env, quarantine: serde_json::Value) -> serde_json::Value {
    json!({
        "nodeSelector": env.node_selector(),
        "quarantine": quarantine,
        "agent": sim_agent(60)
    })
}

/// Waits until the test's status satisfies `cond` (and no run is active), or fails with
/// the status and the operator's log.
async fn wait_status(
    env: &Env,
    api: &Api<FabricTest>,
    name: &str,
    timeout: Duration,
    what: &str,
    cond: impl Fn(&gpufabric_api::FabricTestStatus) -> bool + Send + Sync,
) -> FabricTest {
    let r = wait::for_object(api, name, timeout, |t| {
        t.and_then(|t| t.status.as_ref())
            .is_some_and(|s| s.active_run.is_none() && cond(s))
    })
    .await;
    match r {
        Ok(Some(t)) => t,
        other => {
            let status = api.get(name).await.ok().and_then(|t| t.status);
            panic!(
                "{what}: {other:?}\nstatus: {status:#?}\noperator log:\n{}",
                env.operator.log_tail(80)
            )
        }
    }
}

/// Waits until FabricTest `name` has folded in its confirmation run.
async fn wait_confirmation_folded(
    env: &Env,
    api: &Api<FabricTest>,
    name: &str,
    timeout: Duration,
) -> FabricTest {
    wait_status(
        env,
        api,
        name,
        timeout,
        "the confirmation run folded in",
        |s| {
            s.last_run
                .as_ref()
                .is_some_and(|r| r.trigger == Trigger::Confirmation)
        },
    )
    .await
}

async fn event_reasons_for(env: &Env, ns: &str, name: &str) -> Vec<String> {
    let mut r = gpufabric_tests::events::reasons(&env.cluster.client(), ns, name).await;
    r.sort();
    r.dedup();
    r
}

/// The findings of the run the FabricTest's creation started.
fn first_run_findings(runs: &[FabricTestRun]) -> Vec<gpufabric_api::Finding> {
    runs.iter()
        .find(|r| r.spec.trigger == Trigger::Creation)
        .expect("the first run")
        .status
        .as_ref()
        .map(|s| s.findings.clone())
        .unwrap_or_default()
}

/// The parts of a node a quarantine could change, without what the control plane and the
/// kubelet manage themselves while nodes come up (`beta.kubernetes.io/*` labels, the
/// `node.kubernetes.io/*` taints of the node lifecycle controller).
fn quarantine_view(n: &Node) -> serde_json::Value {
    let labels: BTreeMap<String, String> = n
        .labels()
        .iter()
        .filter(|(k, _)| !k.starts_with("beta.kubernetes.io/"))
        // The result label is a signal written in every mode, Observe included.
        .filter(|(k, _)| k.as_str() != gpufabric_api::keys::LABEL_RESULT)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    json!({
        "labels": labels,
        "annotations": n
            .annotations()
            .iter()
            .filter(|(k, _)| k.as_str() != gpufabric_api::keys::ANNOTATION_LAST_PASS)
            // Bookkeeping of the hardware's error counters, written after every measured run.
            .filter(|(k, _)| k.as_str() != gpufabric_api::keys::ANNOTATION_COUNTERS)
            // The node's own record of its runs, kept in every mode (not while the breaker
            // is open): it acts on nothing.
            .filter(|(k, _)| k.as_str() != gpufabric_api::keys::ANNOTATION_TREND)
            // Each test's standing of the node, behind the result label and the condition:
            // a signal, written in every mode as they are.
            .filter(|(k, _)| k.as_str() != gpufabric_api::keys::ANNOTATION_STANDING)
            .collect::<BTreeMap<_, _>>(),
        "unschedulable": n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false),
        "taints": taints_without_lifecycle(n),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_fleet_ends_with_exactly_the_slow_pair_and_the_straggler_cordoned() {
    let env = setup(SimFleet::demo(), "demo").await;
    let (slow, straggler) = (env.node("h100-03"), env.node("h200-06"));
    let tests = env
        .create_test(
            "demo",
            // A budget of 4 nodes: "exactly two" comes from the findings, not from the budget.
            spec(&env, json!({"mode": "Cordon", "maxQuarantined": "25%"})),
        )
        .await;

    let t = wait_status(
        &env,
        &tests,
        "demo",
        Duration::from_secs(300),
        "two nodes quarantined",
        |s| s.quarantined_count >= 2,
    )
    .await;
    let status = t.status.expect("status");
    assert_eq!(
        status.quarantined_nodes,
        vec![slow.clone(), straggler.clone()],
        "{status:#?}"
    );
    // A control plane without DRA device taints: the straggler GPU's node is quarantined as
    // a node, and the status says every node is handled so.
    let handling = status.gpu_handling.clone().expect("gpuHandling");
    assert_eq!(handling.device_taint_rules, None);
    assert!(handling.per_gpu.is_empty());
    assert!(handling.per_node.contains(&straggler), "{handling:?}");
    assert_eq!(handling.tainted_gpus, 0);
    let all = env.nodes().await;
    let cordoned_now: Vec<&str> = all
        .iter()
        .filter(|(_, n)| cordoned(n))
        .map(|(name, _)| name.as_str())
        .collect();
    assert_eq!(cordoned_now, vec![slow.as_str(), straggler.as_str()]);
    for name in [slow.as_str(), straggler.as_str()] {
        let n = &all[name];
        let record = QuarantineRecord::from_annotations(n.metadata.annotations.as_ref())
            .expect("readable record")
            .expect("record present");
        assert_eq!(record.test, "demo");
        assert!(
            record.cordoned && record.labeled && !record.tainted,
            "{record:?}"
        );
        assert_eq!(
            n.labels().get(LABEL_QUARANTINED).map(String::as_str),
            Some("true")
        );
        assert!(
            event_reasons_for(&env, "default", name)
                .await
                .contains(&"Quarantined".to_string())
        );
    }

    // Confirmation: a run over exactly the two suspects came first, and the quarantine
    // names it.
    let runs = env.runs_of("demo").await;
    let confirm = runs
        .iter()
        .find(|r| r.spec.trigger == Trigger::Confirmation)
        .expect("a confirmation run");
    assert_eq!(
        confirm.spec.nodes,
        Some(vec![slow.clone(), straggler.clone()])
    );
    let record = QuarantineRecord::from_annotations(all[&slow].metadata.annotations.as_ref())
        .expect("record")
        .expect("record");
    assert_eq!(record.run, confirm.name_any());

    // The findings name the pair and the GPU.
    let findings = first_run_findings(&runs);
    assert!(
        findings
            .iter()
            .any(|f| f.subject.kind() == SubjectKind::GpuPair
                && f.subject.node_name() == slow
                && {
                    let mut g = [f.subject.gpu_index(), f.subject.peer_gpu_index()];
                    g.sort();
                    g == [Some(2), Some(3)]
                }),
        "a finding on GPU pair 2-3 of h100-03: {findings:#?}"
    );
    assert!(
        findings.iter().any(|f| f.subject.kind() == SubjectKind::Gpu
            && f.subject.node_name() == straggler
            && f.subject.gpu_index() == Some(5)),
        "a finding on GPU 5 of h200-06: {findings:#?}"
    );
    assert!(
        findings.iter().all(|f| f.subject.node_name() == slow
            || f.subject.node_name() == straggler
            || f.severity != gpufabric_api::Severity::Critical),
        "no critical finding on a healthy node: {findings:#?}"
    );

    let metrics = env.operator.metrics().await;
    assert!(
        metrics.contains("gpufabric_quarantined_nodes{test=\"demo\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics
            .contains("gpufabric_quarantine_actions_total{test=\"demo\",action=\"quarantined\"} 2"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_percent_budget_is_taken_of_the_selected_nodes_not_of_the_suspects() {
    // 8 selected nodes, two stragglers; "25%" of 8 is 2. The confirmation run retests only
    // the 2 suspects, and 25% of those would be 1.
    let mut fleet = SimFleet::uniform("gpu", 8, H100, 8);
    for i in [1, 4] {
        fleet.nodes[i].faults.push(Fault::Straggler {
            gpu: 3,
            factor: 1.5,
        });
    }
    let env = setup(fleet, "pct").await;
    let tests = env
        .create_test(
            "pct",
            spec(&env, json!({"mode": "Cordon", "maxQuarantined": "25%"})),
        )
        .await;
    let t = wait_confirmation_folded(&env, &tests, "pct", Duration::from_secs(180)).await;
    let status = t.status.expect("status");
    assert_eq!(
        status.quarantined_nodes,
        vec![env.node("gpu-02"), env.node("gpu-05")],
        "both failing nodes fit the budget of 25% of 8 nodes: {:#?}",
        status.nodes
    );
    // The budget's 8 nodes are this test's: other tests' nodes on the shared control plane
    // are not selected.
    let selected: BTreeSet<&str> = status.nodes.iter().map(|n| n.node.as_str()).collect();
    let own = env.fleet.node_names();
    assert_eq!(selected, own.iter().map(String::as_str).collect());
}

/// Four nodes, node 2 with a straggler GPU.
fn small_fleet() -> Fleet {
    let mut f = SimFleet::uniform("gpu", 4, H100, 8);
    f.nodes[1].faults.push(Fault::Straggler {
        gpu: 1,
        factor: 1.5,
    });
    f
}

/// Repairs gpu-02 of [`small_fleet`]: its fault goes from the fleet file the agents read.
fn repair_gpu_02(env: &Env) {
    let mut repaired = env.fleet.fleet().clone();
    repaired.nodes[1].faults.clear();
    SimFleet::write_to(repaired, env.fleet.path()).expect("fleet rewritten");
}

/// Creates FabricTest `name` over [`small_fleet`] with `quarantine` and waits (up to
/// `timeout`) until gpu-02, its straggler, is the one node quarantined.
async fn quarantine_gpu_02(
    env: &Env,
    name: &str,
    quarantine: serde_json::Value,
    timeout: Duration,
) -> Api<FabricTest> {
    let failing = env.node("gpu-02");
    let tests = env.create_test(name, spec(env, quarantine)).await;
    wait_status(env, &tests, name, timeout, "gpu-02 quarantined", |s| {
        s.quarantined_nodes == [failing.clone()]
    })
    .await;
    tests
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repaired_node_is_released_after_passes_to_release_passing_runs() {
    let env = setup(small_fleet(), "heal").await;
    let failing = env.node("gpu-02");
    let tests = quarantine_gpu_02(
        &env,
        "heal",
        json!({"mode": "Cordon", "maxQuarantined": 1, "confirmRetest": false, "passesToRelease": 2}),
        Duration::from_secs(180),
    )
    .await;
    assert!(cordoned(&env.nodes().await[&failing]));

    // The node is repaired.
    repair_gpu_02(&env);

    // One passing run is not enough.
    env.run_now("heal").await;
    let t = wait_status(
        &env,
        &tests,
        "heal",
        Duration::from_secs(180),
        "one passing run",
        |s| {
            s.nodes
                .iter()
                .any(|n| n.node == failing && n.consecutive_passes == 1)
        },
    )
    .await;
    assert_eq!(t.status.expect("status").quarantined_count, 1);
    assert!(
        cordoned(&env.nodes().await[&failing]),
        "still cordoned after one pass"
    );

    // The second one releases it.
    env.run_now("heal").await;
    wait_status(
        &env,
        &tests,
        "heal",
        Duration::from_secs(180),
        "gpu-02 released",
        |s| {
            s.quarantined_count == 0
                && s.nodes
                    .iter()
                    .any(|n| n.node == failing && n.consecutive_passes >= 2)
        },
    )
    .await;
    let n = &env.nodes().await[&failing];
    assert!(!cordoned(n));
    assert!(!n.annotations().contains_key(ANNOTATION_QUARANTINE));
    assert!(!n.labels().contains_key(LABEL_QUARANTINED));
    assert!(
        event_reasons_for(&env, "default", &failing)
            .await
            .contains(&"Released".to_string())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_fabric_test_releases_its_cordons_but_not_a_persons() {
    let env = setup(small_fleet(), "gone").await;
    let (failing, person) = (env.node("gpu-02"), env.node("gpu-04"));
    // A person cordoned gpu-04 for maintenance before the test existed.
    let node_api: Api<Node> = Api::all(env.cluster.client());
    node_api
        .patch(
            &person,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .expect("person cordons gpu-04");
    let tests = quarantine_gpu_02(
        &env,
        "gone",
        json!({"mode": "Cordon", "maxQuarantined": 2, "confirmRetest": false}),
        Duration::from_secs(180),
    )
    .await;
    assert!(cordoned(&env.nodes().await[&failing]));

    tests
        .delete("gone", &DeleteParams::default())
        .await
        .expect("FabricTest deleted");
    if let Err(e) = wait::for_deletion(&tests, "gone", Duration::from_secs(60)).await {
        panic!(
            "the finalizer was not removed: {e}\noperator log:\n{}",
            env.operator.log_tail(80)
        );
    }
    let all = env.nodes().await;
    let n = &all[&failing];
    assert!(!cordoned(n), "our cordon is released");
    assert!(!n.annotations().contains_key(ANNOTATION_QUARANTINE));
    assert!(!n.labels().contains_key(LABEL_QUARANTINED));
    assert!(cordoned(&all[&person]), "the person's cordon stays");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observe_mode_changes_no_node() {
    let env = setup(small_fleet(), "watch").await;
    let failing = env.node("gpu-02");
    let before: BTreeMap<String, serde_json::Value> = env
        .nodes()
        .await
        .iter()
        .map(|(k, n)| (k.clone(), quarantine_view(n)))
        .collect();
    // Observe is the default mode.
    let tests = env
        .create_test("watch", spec(&env, json!({"maxQuarantined": 4})))
        .await;
    let t = wait_status(
        &env,
        &tests,
        "watch",
        Duration::from_secs(180),
        "gpu-02 held back",
        |s| {
            s.nodes
                .iter()
                .any(|n| n.node == failing && n.held_back.is_some())
        },
    )
    .await;
    let status = t.status.expect("status");
    let held = status
        .nodes
        .iter()
        .find(|n| n.node == failing)
        .and_then(|n| n.held_back.clone())
        .expect("held back");
    assert!(held.contains("would quarantine"), "{held}");
    assert_eq!(status.quarantined_count, 0);
    let after: BTreeMap<String, serde_json::Value> = env
        .nodes()
        .await
        .iter()
        .map(|(k, n)| (k.clone(), quarantine_view(n)))
        .collect();
    assert_eq!(
        after, before,
        "no node's labels, annotations, cordon or taints changed"
    );
    for (name, n) in env.nodes().await {
        assert!(
            !n.annotations().contains_key(ANNOTATION_QUARANTINE)
                && !n.labels().contains_key(LABEL_QUARANTINED)
                && !cordoned(&n),
            "{name} was changed in Observe mode: {n:?}"
        );
    }
    assert!(
        event_reasons_for(&env, "default", "watch")
            .await
            .contains(&"WouldQuarantine".to_string())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_passes_its_confirmation_run_is_not_quarantined() {
    let env = setup(small_fleet(), "flaky").await;
    let failing = env.node("gpu-02");
    let tests = env
        .create_test(
            "flaky",
            spec(&env, json!({"mode": "Cordon", "maxQuarantined": 1})),
        )
        .await;
    // The first run finds the straggler on gpu-02 ...
    let runs_api: Api<FabricTestRun> = env.runs_api();
    let first = wait::poll(
        "the first run to finish",
        Duration::from_secs(120),
        Duration::from_millis(50),
        || async {
            let runs = env.runs_of("flaky").await;
            Ok(runs.into_iter().find(|r| {
                r.spec.trigger == Trigger::Creation
                    && r.status.as_ref().is_some_and(|s| s.phase.is_finished())
            }))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\noperator log:\n{}", env.operator.log_tail(80)));
    // ... and the fault is gone before its confirmation run starts (the operator waits
    // for the run to be folded into the test first): a one-off slowdown.
    repair_gpu_02(&env);
    let failed_first = first
        .status
        .as_ref()
        .map(|s| {
            s.nodes
                .iter()
                .any(|n| n.node == failing && n.verdict.is_bad())
        })
        .unwrap_or(false);
    assert!(
        failed_first,
        "gpu-02 fails the first run: {:?}",
        first.status
    );

    let t = wait_confirmation_folded(&env, &tests, "flaky", Duration::from_secs(120)).await;
    let confirm = env
        .runs_of("flaky")
        .await
        .into_iter()
        .find(|r| r.spec.trigger == Trigger::Confirmation)
        .expect("a confirmation run");
    assert_eq!(confirm.spec.nodes, Some(vec![failing.clone()]));
    let confirm = runs_api.get(&confirm.name_any()).await.expect("run");
    let passed = confirm
        .status
        .as_ref()
        .map(|s| {
            s.nodes
                .iter()
                .any(|n| n.node == failing && !n.verdict.is_bad())
        })
        .unwrap_or(false);
    assert!(passed, "gpu-02 passes its retest: {:?}", confirm.status);
    let status = t.status.expect("status");
    assert_eq!(status.quarantined_count, 0, "{status:#?}");
    let n = &env.nodes().await[&failing];
    assert!(!cordoned(n));
    assert!(!n.annotations().contains_key(ANNOTATION_QUARANTINE));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taint_mode_taints_the_failing_node_and_release_removes_only_that_taint() {
    let env = setup(small_fleet(), "taint").await;
    let failing = env.node("gpu-02");
    let tests = quarantine_gpu_02(
        &env,
        "taint",
        json!({"mode": "Taint", "maxQuarantined": 1, "confirmRetest": false, "passesToRelease": 1}),
        Duration::from_secs(120),
    )
    .await;
    let n = &env.nodes().await[&failing];
    assert!(!cordoned(n), "Taint mode does not cordon");
    let ours: Vec<_> = n
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.key == TAINT_QUARANTINED)
        .collect();
    assert_eq!(ours.len(), 1, "{ours:?}");
    assert_eq!(ours[0].effect, "NoSchedule");

    // Someone adds a maintenance taint of their own (as kubectl does: read, append, write
    // back guarded by the resourceVersion, again on a conflict); then the node is repaired.
    let node_api: Api<Node> = Api::all(env.cluster.client());
    let mut attempts = 0;
    loop {
        let n = node_api.get(&failing).await.expect("node");
        let mut taints = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        taints.push(k8s_openapi::api::core::v1::Taint {
            key: "maintenance.example.com/fw".into(),
            value: Some("pending".into()),
            effect: "PreferNoSchedule".into(),
            time_added: None,
        });
        let patch = json!({"metadata": {"resourceVersion": n.resource_version()},
                           "spec": {"taints": taints}});
        match node_api
            .patch(&failing, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => break,
            Err(kube::Error::Api(e)) if e.code == 409 && attempts < 10 => attempts += 1,
            Err(e) => panic!("someone adds a taint: {e}"),
        }
    }
    repair_gpu_02(&env);
    env.run_now("taint").await;
    wait_status(
        &env,
        &tests,
        "taint",
        Duration::from_secs(120),
        "gpu-02 released",
        |s| s.quarantined_count == 0,
    )
    .await;
    let n = &env.nodes().await[&failing];
    let keys: Vec<String> = taints_without_lifecycle(n)
        .into_iter()
        .map(|t| t.key)
        .collect();
    assert_eq!(keys, vec!["maintenance.example.com/fw".to_string()]);
    assert!(!n.annotations().contains_key(ANNOTATION_QUARANTINE));
}

/// `nodes` H100 nodes, gpu-04 launching its sweep's calls from a CPU 1.4x slower.
fn slow_launch_cpu_fleet(nodes: usize) -> Fleet {
    let mut fleet = SimFleet::uniform("gpu", nodes, H100, 8);
    fleet.nodes[3]
        .faults
        .push(Fault::SlowLaunchCpu { factor: 1.4 });
    fleet
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_launching_cpu_is_slow_is_reported_and_not_cordoned() {
    // gpu-04 launches the sweep's calls from a CPU 1.4x slower (the two host states of a
    // shared 4 x H200 host: 27 and 38 us at 8 B); gpu-07 has a straggler GPU, so the run
    // still has a node that must be cordoned.
    let mut fleet = slow_launch_cpu_fleet(8);
    fleet.nodes[6].faults.push(Fault::Straggler {
        gpu: 2,
        factor: 1.5,
    });
    let env = setup(fleet, "launch").await;
    let (slow_cpu, straggler) = (env.node("gpu-04"), env.node("gpu-07"));
    let tests = env
        .create_test("launch", spec(&env, json!({"mode": "Cordon"})))
        .await;
    let t = wait_confirmation_folded(&env, &tests, "launch", Duration::from_secs(180)).await;
    let status = t.status.expect("status");
    assert_eq!(
        status.quarantined_nodes,
        vec![straggler.clone()],
        "{:#?}",
        status.nodes
    );
    let all = env.nodes().await;
    assert!(!cordoned(&all[&slow_cpu]), "{slow_cpu} was cordoned");
    // The first run reports gpu-04's latency, as Info, and says how to take the CPU out.
    let runs = env.runs_of("launch").await;
    let findings = first_run_findings(&runs);
    let on_it: Vec<_> = findings
        .iter()
        .filter(|f| f.subject.node_name() == slow_cpu)
        .collect();
    assert!(
        on_it
            .iter()
            .any(|f| f.metric == gpufabric_api::Metric::NcclLatency
                && f.severity == gpufabric_api::Severity::Info
                && f.message.contains("graphLaunches")),
        "an Info latency finding on {slow_cpu}: {findings:#?}"
    );
    assert!(
        on_it
            .iter()
            .all(|f| f.severity != gpufabric_api::Severity::Critical),
        "{on_it:#?}"
    );
    // The confirmation run retested the straggler alone: gpu-04 was never a suspect (a
    // confirmation run of two nodes has no fleet to compare with, and would have cleared it
    // only by that accident).
    let confirm = runs
        .iter()
        .find(|r| r.spec.trigger == Trigger::Confirmation)
        .expect("a confirmation run");
    assert_eq!(confirm.spec.nodes, Some(vec![straggler]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graph_launches_reach_the_agents_and_take_the_launching_cpu_out_of_latency() {
    // The same slow launching CPU, with the suite timing small sizes by CUDA graphs: the
    // setting travels from the FabricTest to the pods, and the node's latency is its fleet's.
    let fleet = slow_launch_cpu_fleet(6);
    let env = setup(fleet, "graphs").await;
    let mut spec = spec(&env, json!({"mode": "Cordon"}));
    spec["suite"] = json!({"ncclSweep": {"graphLaunches": 10}});
    let tests = env.create_test("graphs", spec).await;
    let t = wait_status(
        &env,
        &tests,
        "graphs",
        Duration::from_secs(180),
        "the first run folded in",
        |s| s.last_run.is_some(),
    )
    .await;
    let status = t.status.expect("status");
    let last = status.last_run.as_ref().expect("last run");
    assert_eq!(
        (last.passed, last.failed, last.findings),
        (6, 0, 0),
        "{status:#?}"
    );
    assert!(status.quarantined_nodes.is_empty(), "{status:#?}");
    let findings = first_run_findings(&env.runs_of("graphs").await);
    assert!(findings.is_empty(), "{findings:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_gpu_held_by_a_stuck_process_is_cordoned_and_a_busy_healthy_node_is_not() {
    // gpu-02: a process stuck on GPU 2 holds 3 GiB of it, and the GPU has uncorrectable ECC
    // errors (a failed GPU whose job cannot exit). gpu-03: the same process on a healthy GPU.
    // Other work keeps both from being measured; gpu-02's own readings still fail it.
    let mut fleet = SimFleet::uniform("gpu", 4, H100, 8);
    for n in [1, 2] {
        fleet.nodes[n].faults.push(Fault::GpusInUse {
            gpu: 2,
            bytes: 3 << 30,
            during: false,
        });
    }
    fleet.nodes[1].faults.push(Fault::Ecc { gpu: 2, count: 4 });
    let env = setup(fleet, "stuck").await;
    let (failed, busy) = (env.node("gpu-02"), env.node("gpu-03"));
    let tests = env
        .create_test("stuck", spec(&env, json!({"mode": "Cordon"})))
        .await;
    let t = wait_confirmation_folded(&env, &tests, "stuck", Duration::from_secs(180)).await;
    let status = t.status.expect("status");
    assert_eq!(
        status.quarantined_nodes,
        vec![failed.clone()],
        "{:#?}",
        status.nodes
    );
    let all = env.nodes().await;
    assert!(cordoned(&all[&failed]), "{failed} was not cordoned");
    assert!(!cordoned(&all[&busy]), "{busy} was cordoned");
    // The first run: gpu-03 not measured for the other work, gpu-02 failed on its GPU's
    // own evidence.
    let runs = env.runs_of("stuck").await;
    let first = runs
        .iter()
        .find(|r| r.spec.trigger == Trigger::Creation)
        .and_then(|r| r.status.clone())
        .expect("the first run's status");
    let entry = |name: &str| {
        first
            .nodes
            .iter()
            .find(|n| n.node == name)
            .cloned()
            .expect("node entry")
    };
    let b = entry(&busy);
    assert_eq!(
        b.verdict,
        gpufabric_api::run::NodeVerdict::NotMeasured,
        "{b:?}"
    );
    assert_eq!(
        b.not_measured,
        Some(gpufabric_api::outcome::NotMeasuredReason::GpusInUse),
        "{b:?}"
    );
    assert_eq!(
        entry(&failed).verdict,
        gpufabric_api::run::NodeVerdict::Failed
    );
    let findings = first_run_findings(&runs);
    let critical: Vec<_> = findings
        .iter()
        .filter(|f| f.severity == gpufabric_api::Severity::Critical)
        .collect();
    assert!(!critical.is_empty(), "{findings:#?}");
    assert!(
        critical.iter().all(|f| f.subject.node_name() == failed),
        "{critical:#?}"
    );
    assert!(
        critical
            .iter()
            .any(|f| f.kind == gpufabric_api::FindingKind::EccUncorrectable),
        "{critical:#?}"
    );
}
