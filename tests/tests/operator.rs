//! The operator against a real kube-apiserver, with the process-kubelet running the real
//! `fabric-agent` (sim backend): runs start when they should, results land in the status,
//! crashes and hangs are reported as such, a restarted operator resumes, and the history
//! limits clean up. The operator runs as the real `fabric-operator` binary.
//!
//! The tests share the binary's control plane and run in parallel: each has its own
//! operator, namespace and prefixed, labelled nodes, and its FabricTests select only those
//! nodes.
//!
//! Build the binaries first: `cargo build -p gpufabric-agent -p gpufabric-operator`.

use gpufabric_api::keys;
use gpufabric_api::run::{
    FabricTestRun, FabricTestRunStatus, NodeRunResult, NodeVerdict, RunPhase, Trigger,
};
use gpufabric_api::shard::FabricTestRunShard;
use gpufabric_measure::fleet::{Fault, Fleet};
use gpufabric_tests::fleet::{H100, SimFleet};
use gpufabric_tests::operator::{OperatorEnv, OperatorProcess, sim_agent};
use gpufabric_tests::wait;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

type Env = OperatorEnv;

/// The operator, a kubelet and `fleet` (nodes prefixed) on the shared control plane, its
/// pods in a namespace of its own and its FabricTests labelled for it alone.
async fn setup(fleet: Fleet) -> Env {
    OperatorEnv::shared(fleet, "op").await
}

/// A small, fast suite on the sim backend.
fn test_spec(env: &Env, extra: serde_json::Value) -> serde_json::Value {
    let mut spec = json!({
        "nodeSelector": env.node_selector(),
        "suite": {
            "ncclSweep": {"collectives": ["allReduce", "allGather"]},
            "ddpProbe": {"hidden": 256, "layers": 2, "batchPerGpu": 8, "warmupSteps": 1, "steps": 2}
        },
        "agent": sim_agent(60)
    });
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            s.insert(k.clone(), v.clone());
        }
    }
    spec
}

async fn pods_of(env: &Env, run: &str) -> Vec<Pod> {
    let api: Api<Pod> = env.pods_api();
    api.list(&ListParams::default().labels(&format!("{}={run}", keys::LABEL_RUN)))
        .await
        .expect("list pods")
        .items
}

/// The Events about the FabricTest `test` and its runs (`<test>-<suffix>`): cluster-scoped
/// objects, whose Events are in "default" beside those of the tests running alongside.
async fn events_about(env: &Env, test: &str) -> Vec<k8s_openapi::api::events::v1::Event> {
    let api: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(env.cluster.client(), "default");
    let run_prefix = format!("{test}-");
    api.list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().is_some_and(|r| {
                let name = r.name.as_deref().unwrap_or_default();
                match r.kind.as_deref() {
                    Some("FabricTest") => name == test,
                    Some("FabricTestRun") => name.starts_with(&run_prefix),
                    _ => false,
                }
            })
        })
        .collect()
}

fn finished(r: &FabricTestRun) -> bool {
    r.status.as_ref().is_some_and(|s| s.phase.is_finished())
}

/// Waits until the run `name` has finished and returns it.
async fn wait_finished(env: &Env, name: &str, timeout: Duration) -> FabricTestRun {
    let api: Api<FabricTestRun> = env.runs_api();
    match wait::for_object(&api, name, timeout, |r| r.is_some_and(finished)).await {
        Ok(Some(r)) => r,
        other => panic!(
            "run {name} did not finish: {other:?}\noperator log:\n{}",
            env.operator.log_tail(60)
        ),
    }
}

/// Waits until `test` has at least `n` runs, and returns them (oldest first).
async fn wait_runs(env: &Env, test: &str, n: usize, timeout: Duration) -> Vec<FabricTestRun> {
    let r = wait::poll(
        &format!("{n} runs of {test}"),
        timeout,
        Duration::from_millis(500),
        || async {
            let runs = env.runs_of(test).await;
            Ok((runs.len() >= n).then_some(runs))
        },
    )
    .await;
    match r {
        Ok(runs) => runs,
        Err(e) => panic!("{e}\noperator log:\n{}", env.operator.log_tail(60)),
    }
}

fn verdicts(run: &FabricTestRun) -> BTreeMap<String, NodeVerdict> {
    run.status
        .as_ref()
        .map(|s| {
            s.nodes
                .iter()
                .map(|n| (n.node.clone(), n.verdict))
                .collect()
        })
        .unwrap_or_default()
}

fn fleet(n: usize) -> Fleet {
    SimFleet::uniform("gpu", n, H100, 8)
}

/// `n` nodes, the last of which hangs until its pod's deadline.
fn fleet_with_last_hung(n: usize) -> Fleet {
    let mut f = fleet(n);
    if let Some(last) = f.nodes.last_mut() {
        last.faults.push(Fault::Hang {
            phase: None,
            stuck: true,
        });
    }
    f
}

#[tokio::test]
async fn a_test_without_schedule_runs_once_and_results_land_in_status() {
    let mut f = fleet(3);
    f.nodes[2].faults.push(Fault::Crash { exit_code: None });
    let env = setup(f).await;
    let tests = env.create_test("once", test_spec(&env, json!({}))).await;

    let runs = wait_runs(&env, "once", 1, Duration::from_secs(60)).await;
    assert_eq!(runs[0].spec.trigger, Trigger::Creation);
    let run = wait_finished(&env, &runs[0].name_any(), Duration::from_secs(90)).await;
    let status = run.status.clone().expect("status");
    assert_eq!(status.phase, RunPhase::Succeeded, "{status:?}");
    assert_eq!(status.node_count, 3);
    let v = verdicts(&run);
    assert_eq!(
        v[&env.node("gpu-01")],
        NodeVerdict::Passed,
        "{status:?}\n{}",
        env.pod_logs()
    );
    assert_eq!(v[&env.node("gpu-02")], NodeVerdict::Passed, "{status:?}");
    // A crashing agent is Errored, with the exit code in the reason.
    assert_eq!(v[&env.node("gpu-03")], NodeVerdict::Errored, "{status:?}");
    let crashed = status
        .nodes
        .iter()
        .find(|n| n.node == env.node("gpu-03"))
        .expect("gpu-03");
    assert!(
        crashed
            .reason
            .as_deref()
            .is_some_and(|r| r.contains("exit code")),
        "{crashed:?}"
    );
    let good = status
        .nodes
        .iter()
        .find(|n| n.node == env.node("gpu-01"))
        .expect("gpu-01");
    assert!(
        good.all_reduce_bus_bw_gbps.is_some_and(|b| b > 0.0),
        "{good:?}"
    );
    assert_eq!(good.gpus, Some(8));
    assert_eq!((status.passed, status.errored), (2, 1));
    assert!(status.duration.is_some() && status.completion_time.is_some());

    // The pods: pinned, every GPU, no credentials, owned by the run.
    let pods = pods_of(&env, &run.name_any()).await;
    assert_eq!(pods.len(), 3);
    for p in &pods {
        let spec = p.spec.as_ref().expect("spec");
        assert_eq!(spec.automount_service_account_token, Some(false));
        assert!(
            spec.node_name
                .as_deref()
                .is_some_and(|n| n.starts_with(&env.node("gpu-")))
        );
        let limits = spec.containers[0]
            .resources
            .as_ref()
            .and_then(|r| r.limits.clone())
            .expect("limits");
        assert_eq!(limits["nvidia.com/gpu"].0, "8");
        assert_eq!(p.owner_references()[0].uid, run.uid().expect("uid"));
    }

    // The test's status folds the run in: last run, per-node history, Degraded.
    let t = wait::for_object(&tests, "once", Duration::from_secs(30), |t| {
        t.and_then(|t| t.status.as_ref())
            .and_then(|s| s.last_run.as_ref())
            .is_some()
    })
    .await
    .expect("test status")
    .expect("test exists");
    let ts = t.status.expect("status");
    let last = ts.last_run.expect("last run");
    assert_eq!(last.name, run.name_any());
    assert_eq!((last.passed, last.errored), (2, 1));
    let h = ts
        .nodes
        .iter()
        .find(|n| n.node == env.node("gpu-03"))
        .expect("history of gpu-03");
    assert_eq!(h.consecutive_failures, 1);
    assert!(
        ts.conditions
            .iter()
            .any(|c| c.type_ == "Degraded" && c.status == "True")
    );
    assert!(
        ts.conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")
    );

    // Once: no second run comes by itself.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(env.runs_of("once").await.len(), 1);

    // run-now starts a Manual run and the annotation is removed.
    env.run_now("once").await;
    let runs = wait_runs(&env, "once", 2, Duration::from_secs(30)).await;
    let manual = runs
        .iter()
        .find(|r| r.spec.trigger == Trigger::Manual)
        .expect("a manual run");
    wait_finished(&env, &manual.name_any(), Duration::from_secs(90)).await;
    let t = tests.get("once").await.expect("test");
    assert!(
        !t.annotations().contains_key(keys::ANNOTATION_RUN_NOW),
        "annotation removed"
    );

    // Observability: ready, metrics, events.
    let (code, _) = env.operator.get("/ready").await.expect("admin answers");
    assert_eq!(code, 200);
    let (_, metrics) = env.operator.get("/metrics").await.expect("metrics");
    assert!(
        metrics.contains("gpufabric_runs_started_total{trigger=\"creation\"} 1"),
        "{metrics}"
    );
    assert!(
        // Both runs finished; the fleet has failing nodes, so both are counted as such.
        metrics.contains("gpufabric_test_runs_total{test=\"once\",result=\"nodes_failed\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics
            .contains("gpufabric_reconcile_duration_seconds_count{controller=\"fabrictestrun\"}"),
        "{metrics}"
    );
    let reasons: BTreeSet<String> = events_about(&env, "once")
        .await
        .into_iter()
        .filter_map(|e| e.reason)
        .collect();
    assert!(
        reasons.contains("RunStarted") && reasons.contains("NodesFailed"),
        "{reasons:?}"
    );
    // The Events of a cluster-scoped object are in "default"; `kubectl describe` finds them.
    let described = env
        .cluster
        .kubectl()
        .args(["describe", "fabrictest", "once"])
        .output()
        .expect("kubectl runs");
    let text = String::from_utf8_lossy(&described.stdout);
    assert!(
        described.status.success() && text.contains("RunCreated") && text.contains("RunStarted"),
        "kubectl describe shows the test's Events:\n{text}{}",
        String::from_utf8_lossy(&described.stderr)
    );
}

#[tokio::test]
async fn invalid_spec_is_reported_and_starts_no_run() {
    let env = setup(fleet(1)).await;
    // The CRD schema cannot see that 30 February never comes, nor an unknown time zone.
    let tests = env
        .create_test(
            "bad",
            test_spec(
                &env,
                json!({"schedule": "0 2 * * *", "timeZone": "Mars/Olympus"}),
            ),
        )
        .await;
    let t = wait::for_object(&tests, "bad", Duration::from_secs(30), |t| {
        t.and_then(|t| t.status.as_ref()).is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "False")
        })
    })
    .await
    .expect("Ready=False")
    .expect("exists");
    let ready = t
        .status
        .expect("status")
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready");
    assert_eq!(ready.reason, "InvalidSpec");
    assert!(ready.message.contains("Mars/Olympus"), "{}", ready.message);
    assert!(env.runs_of("bad").await.is_empty());
}

/// Runs FabricTest `name` (agent timeout 10 s) over two nodes of which gpu-02 hangs, and
/// returns the run's status once gpu-01 passed and gpu-02 timed out, with gpu-02's reason.
async fn run_with_hung_node(
    env: &Env,
    name: &str,
    wait: Duration,
) -> (FabricTestRunStatus, String) {
    env.create_test(name, test_spec(env, json!({"agent": sim_agent(10)})))
        .await;
    let runs = wait_runs(env, name, 1, Duration::from_secs(60)).await;
    let run = wait_finished(env, &runs[0].name_any(), wait).await;
    let status = run.status.clone().expect("status");
    let v = verdicts(&run);
    assert_eq!(v[&env.node("gpu-01")], NodeVerdict::Passed, "{status:?}");
    assert_eq!(v[&env.node("gpu-02")], NodeVerdict::Timeout, "{status:?}");
    let reason = status
        .nodes
        .iter()
        .find(|n| n.node == env.node("gpu-02"))
        .and_then(|n| n.reason.clone())
        .unwrap_or_default();
    (status, reason)
}

#[tokio::test]
async fn a_hanging_agent_times_out_at_the_pod_deadline() {
    let env = setup(fleet_with_last_hung(2)).await;
    let started = Instant::now();
    let (status, reason) = run_with_hung_node(&env, "hang", Duration::from_secs(90)).await;
    // It says that the agent had started and which phase it was in (its last progress line).
    assert!(
        reason.contains("deadline")
            && reason.contains("had started")
            && reason.contains("in phase \"ncclSweep: stuck"),
        "{reason}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "ended near the 10 s deadline"
    );
    assert!(
        status
            .findings
            .iter()
            .any(|f| f.subject.node_name() == env.node("gpu-02")
                && f.kind == gpufabric_api::FindingKind::Timeout),
        "{:?}",
        status.findings
    );
}

#[tokio::test]
async fn an_agent_still_running_at_the_run_deadline_is_named_with_its_phase_from_the_log() {
    let env = setup(fleet_with_last_hung(2)).await;
    // gpu-02's kubelet lost track of pod deadlines: only the run deadline (the agent timeout
    // plus the operator's margin) stops its hung agent, whose termination message is
    // never written; the phase must come from the pod log.
    env.kubelet
        .set_node_ignores_deadlines(&env.node("gpu-02"), true)
        .await
        .expect("kubelet setting");
    let (_, reason) = run_with_hung_node(&env, "rundl", Duration::from_secs(120)).await;
    assert!(
        reason.contains("run deadline")
            && reason.contains("in phase \"ncclSweep: stuck")
            && reason.contains("pod log"),
        "{reason}"
    );
}

#[tokio::test]
async fn an_agent_on_a_node_that_stopped_reporting_is_not_measured_not_timed_out() {
    let env = setup(fleet_with_last_hung(2)).await;
    let lost = env.node("gpu-02");
    // gpu-02's kubelet goes away while its agent runs: the node turns NotReady and nothing
    // there enforces the pod's deadline or reports on the pod any more. Its pod still reads
    // Running at the run deadline; that says nothing of its GPUs.
    env.kubelet
        .set_node_ignores_deadlines(&lost, true)
        .await
        .expect("kubelet setting");
    env.create_test("lost", test_spec(&env, json!({"agent": sim_agent(10)})))
        .await;
    let runs = wait_runs(&env, "lost", 1, Duration::from_secs(60)).await;
    let run_name = runs[0].name_any();
    wait::poll(
        "gpu-02's pod running",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let running = pods_of(&env, &run_name).await.iter().any(|p| {
                p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(lost.as_str())
                    && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            });
            Ok(running.then_some(()))
        },
    )
    .await
    .expect("pod running");
    env.kubelet
        .set_node_ready(&lost, false)
        .await
        .expect("NotReady");
    let run = wait_finished(&env, &run_name, Duration::from_secs(120)).await;
    let status = run.status.clone().expect("status");
    let v = verdicts(&run);
    assert_eq!(v[&env.node("gpu-01")], NodeVerdict::Passed, "{status:?}");
    assert_eq!(v[&lost], NodeVerdict::NotMeasured, "{status:?}");
    let entry = status.nodes.iter().find(|n| n.node == lost).expect("entry");
    assert_eq!(
        entry.not_measured,
        Some(gpufabric_api::outcome::NotMeasuredReason::NodeNotReady),
        "{entry:?}"
    );
    let reason = entry.reason.clone().unwrap_or_default();
    assert!(
        reason.contains(
            "the node stopped reporting while the agent ran (its Ready condition is False"
        ) && reason.contains("run deadline"),
        "{reason}"
    );
    assert!(
        !status
            .findings
            .iter()
            .any(|f| f.subject.node_name() == lost
                && f.severity == gpufabric_api::Severity::Critical),
        "{:?}",
        status.findings
    );
    env.kubelet
        .set_node_ready(&lost, true)
        .await
        .expect("Ready again");
}

#[tokio::test]
async fn a_restarted_operator_resumes_the_run_without_duplicate_pods_or_lost_results() {
    // One node hangs until its 10 s deadline, so the run is still going when the operator dies.
    let mut env = setup(fleet_with_last_hung(12)).await;
    env.create_test("restart", test_spec(&env, json!({"agent": sim_agent(10)})))
        .await;
    let runs = wait_runs(&env, "restart", 1, Duration::from_secs(60)).await;
    let run_name = runs[0].name_any();
    // Kill the operator once every pod exists and some have finished.
    let before = wait::poll(
        "all 12 pods",
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let pods = pods_of(&env, &run_name).await;
            let done = pods
                .iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded"))
                .count();
            Ok((pods.len() == 12 && done >= 1).then_some(pods))
        },
    )
    .await
    .expect("pods created");
    let pid = env.operator.pid();
    env.operator.kill();
    eprintln!("killed the operator (pid {pid:?}) mid-run");
    let api: Api<FabricTestRun> = env.runs_api();
    let mid = api.get(&run_name).await.expect("run");
    assert!(
        !finished(&mid),
        "the run was still going when the operator died"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    env.operator.restart();

    let run = wait_finished(&env, &run_name, Duration::from_secs(90)).await;
    let status = run.status.clone().expect("status");
    assert_eq!(status.phase, RunPhase::Succeeded, "{status:?}");
    let after = pods_of(&env, &run_name).await;
    assert_eq!(after.len(), 12, "no duplicate pods");
    let uids = |p: &[Pod]| {
        p.iter()
            .map(|p| (p.name_any(), p.uid()))
            .collect::<BTreeMap<_, _>>()
    };
    assert_eq!(uids(&before), uids(&after), "the same pods, none recreated");
    let v = verdicts(&run);
    assert_eq!(v.len(), 12);
    assert_eq!(
        v.values().filter(|v| **v == NodeVerdict::Passed).count(),
        11,
        "{status:?}"
    );
    assert_eq!(v[&env.node("gpu-12")], NodeVerdict::Timeout);
    assert_eq!(env.runs_of("restart").await.len(), 1, "no second run");
}

#[tokio::test]
async fn an_operator_killed_while_it_creates_pods_leaves_every_shard_entry_naming_its_pod() {
    const NODES: usize = 40;
    let mut env = setup(fleet(NODES)).await;
    env.create_test("killed-creating", test_spec(&env, json!({})))
        .await;
    // Killed as soon as the first of the 40 pods exists, before the pass that creates them
    // writes the shards that name them.
    let pods: Api<Pod> = env.pods_api();
    let by_test = ListParams::default().labels(&format!("{}=killed-creating", keys::LABEL_TEST));
    let first = wait::poll(
        "the run's first pod",
        Duration::from_secs(60),
        Duration::from_millis(10),
        || async {
            let listed = pods.list_metadata(&by_test).await.ok();
            Ok(listed.and_then(|l| l.items.into_iter().next()))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", env.operator.log_tail(60)));
    env.operator.kill();
    let run_name = first
        .labels()
        .get(keys::LABEL_RUN)
        .cloned()
        .expect("a run label");
    let shards: Api<FabricTestRunShard> = Api::all(env.cluster.client());
    let by_run = ListParams::default().labels(&format!("{}={run_name}", keys::LABEL_RUN));
    let entries = |list: Vec<FabricTestRunShard>| -> Vec<NodeRunResult> {
        list.into_iter()
            .flat_map(|s| s.status.map(|s| s.nodes).unwrap_or_default())
            .collect()
    };
    let left = entries(shards.list(&by_run).await.expect("shards").items);
    let created = pods_of(&env, &run_name).await.len();
    eprintln!(
        "killed with {created} pods created and {} shard entries naming a pod",
        left.iter().filter(|e| e.pod.is_some()).count()
    );
    env.operator.restart();

    let run = wait_finished(&env, &run_name, Duration::from_secs(120)).await;
    let status = run.status.clone().expect("status");
    assert_eq!(status.phase, RunPhase::Succeeded, "{status:?}");
    assert_eq!(status.node_count as usize, NODES, "{status:?}");
    let pod_on: BTreeMap<String, String> = pods_of(&env, &run_name)
        .await
        .into_iter()
        .filter_map(|p| Some((p.spec.as_ref()?.node_name.clone()?, p.name_any())))
        .collect();
    assert_eq!(pod_on.len(), NODES, "one pod per node");
    let whole = entries(shards.list(&by_run).await.expect("shards").items);
    assert_eq!(whole.len(), NODES);
    for e in &whole {
        assert_eq!(e.pod.as_ref(), pod_on.get(&e.node), "{e:?}");
        assert_eq!(e.verdict, NodeVerdict::Passed, "{e:?}");
    }
}

#[tokio::test]
async fn history_limits_delete_old_runs_and_their_pods() {
    let env = setup(fleet(2)).await;
    let tests = env
        .create_test(
            "hist",
            test_spec(&env, json!({"successfulRunsHistoryLimit": 1})),
        )
        .await;
    let first = wait_runs(&env, "hist", 1, Duration::from_secs(60)).await[0].name_any();
    wait_finished(&env, &first, Duration::from_secs(90)).await;
    for i in 0..2 {
        let patch =
            json!({"metadata": {"annotations": {keys::ANNOTATION_RUN_NOW: format!("{i}")}}});
        tests
            .patch("hist", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("annotate");
        let runs = wait::poll(
            "a new manual run",
            Duration::from_secs(60),
            Duration::from_millis(300),
            || async {
                let t = tests
                    .get("hist")
                    .await
                    .map_err(|e| gpufabric_tests::Error::Invalid(e.to_string()))?;
                let runs = env.runs_of("hist").await;
                let manual = runs
                    .iter()
                    .filter(|r| r.spec.trigger == Trigger::Manual)
                    .count();
                Ok(
                    (!t.annotations().contains_key(keys::ANNOTATION_RUN_NOW) && manual > i)
                        .then_some(runs),
                )
            },
        )
        .await
        .expect("manual run");
        let newest = runs
            .iter()
            .rfind(|r| r.spec.trigger == Trigger::Manual)
            .expect("manual")
            .name_any();
        wait_finished(&env, &newest, Duration::from_secs(90)).await;
    }
    // Only the newest successful run stays; the others and their pods go.
    let left = wait::poll(
        "one run left",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            let runs = env.runs_of("hist").await;
            Ok((runs.len() == 1).then_some(runs))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", env.operator.log_tail(60)));
    assert_eq!(left[0].spec.trigger, Trigger::Manual);
    let pods = wait::poll(
        "pods of deleted runs gone",
        Duration::from_secs(60),
        Duration::from_millis(500),
        || async {
            let api: Api<Pod> = env.pods_api();
            let pods = api
                .list(&ListParams::default().labels(keys::LABEL_RUN))
                .await
                .expect("pods")
                .items;
            Ok(pods
                .iter()
                .all(|p| p.labels().get(keys::LABEL_RUN) == Some(&left[0].name_any()))
                .then_some(pods))
        },
    )
    .await
    .expect("garbage collected");
    assert_eq!(pods.len(), 2);
    let first_gone: Api<FabricTestRun> = env.runs_api();
    assert!(first_gone.get_opt(&first).await.expect("get").is_none());
}

#[tokio::test]
async fn a_scheduled_run_fires_and_forbid_skips_while_one_is_active() {
    let env = setup(fleet_with_last_hung(2)).await;
    // Every minute; each run lasts ~70 s (one node hangs to its deadline), so the next
    // minute comes while a run is active.
    let tests = env
        .create_test(
            "cron",
            test_spec(
                &env,
                json!({
                    "schedule": "* * * * *",
                    "concurrencyPolicy": "Forbid",
                    "agent": sim_agent(70)
                }),
            ),
        )
        .await;
    let t = wait::for_object(&tests, "cron", Duration::from_secs(30), |t| {
        t.and_then(|t| t.status.as_ref())
            .is_some_and(|s| s.next_schedule_time.is_some())
    })
    .await
    .expect("next schedule time")
    .expect("exists");
    let next = t.status.and_then(|s| s.next_schedule_time).expect("next");
    let first = wait_runs(&env, "cron", 1, Duration::from_secs(75)).await;
    let r1 = &first[0];
    assert_eq!(r1.spec.trigger, Trigger::Schedule);
    assert_eq!(
        r1.spec.scheduled_time.as_ref(),
        Some(&next),
        "fires at the time it announced"
    );
    // Watch two minutes: never two active runs at once.
    let end = Instant::now() + Duration::from_secs(100);
    let mut max_active = 0;
    while Instant::now() < end {
        let runs = env.runs_of("cron").await;
        let active = runs.iter().filter(|r| !finished(r)).count();
        max_active = max_active.max(active);
        if runs.len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(max_active, 1, "Forbid: one active run at a time");
    let runs = env.runs_of("cron").await;
    assert!(
        runs.len() >= 2,
        "the schedule went on after the first run: {}",
        env.operator.log_tail(60)
    );
    let r1_done = runs[0]
        .status
        .as_ref()
        .and_then(|s| s.completion_time.clone())
        .expect("first run finished before the second started");
    let r2_created = runs[1]
        .metadata
        .creation_timestamp
        .clone()
        .expect("created");
    assert!(
        r2_created.0 >= r1_done.0,
        "second run started after the first ended"
    );
    let skipped = events_about(&env, "cron")
        .await
        .iter()
        .any(|e| e.reason.as_deref() == Some("RunAlreadyActive"));
    assert!(
        skipped,
        "a RunAlreadyActive event says why the due run did not start"
    );
}

#[tokio::test]
async fn replace_deletes_the_active_run_for_the_new_one() {
    let env = setup(fleet_with_last_hung(1)).await;
    let tests = env
        .create_test(
            "repl",
            test_spec(
                &env,
                json!({
                    "concurrencyPolicy": "Replace",
                    "agent": sim_agent(120)
                }),
            ),
        )
        .await;
    let first = wait_runs(&env, "repl", 1, Duration::from_secs(60)).await[0].name_any();
    let runs: Api<FabricTestRun> = env.runs_api();
    wait::for_object(&runs, &first, Duration::from_secs(30), |r| {
        r.and_then(|r| r.status.as_ref())
            .is_some_and(|s| s.phase == RunPhase::Running)
    })
    .await
    .expect("first run running");
    let patch = json!({"metadata": {"annotations": {keys::ANNOTATION_RUN_NOW: "now"}}});
    tests
        .patch("repl", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("annotate");
    wait::for_deletion(&runs, &first, Duration::from_secs(60))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", env.operator.log_tail(60)));
    // The new run may come a moment after the old one is gone.
    let left = wait_runs(&env, "repl", 1, Duration::from_secs(30)).await;
    assert_eq!(left.len(), 1, "only the new run");
    assert_eq!(left[0].spec.trigger, Trigger::Manual);
}

#[tokio::test]
async fn only_the_leader_acts_and_a_follower_takes_over_when_it_dies() {
    let mut env = setup(fleet(1)).await;
    env.operator.kill();
    let mut lease_args = env.operator_args();
    lease_args.push("--leader-elect");
    let log = |n: &str| env.dir.path().join(format!("operator-{n}.log"));
    let mut a =
        OperatorProcess::start_with(&env.cluster, log("a"), &lease_args, &[("POD_NAME", "op-a")]);
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(env.cluster.client(), &env.ns);
    wait::for_object(&leases, "fabric-operator", Duration::from_secs(30), |l| {
        l.and_then(|l| l.spec.as_ref())
            .and_then(|s| s.holder_identity.as_deref())
            == Some("op-a")
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", a.log_tail(60)));
    let b =
        OperatorProcess::start_with(&env.cluster, log("b"), &lease_args, &[("POD_NAME", "op-b")]);

    let tests = env.create_test("led", test_spec(&env, json!({}))).await;
    let first = wait_runs(&env, "led", 1, Duration::from_secs(60)).await[0].name_any();
    wait_finished(&env, &first, Duration::from_secs(60)).await;
    // The follower waits, and is ready while it does (it reached the Lease): readiness
    // that waited for leadership would stall every rolling upgrade.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (code, _) = b.get("/ready").await.expect("follower admin answers");
    assert_eq!(code, 200, "a follower is ready");

    a.kill();
    wait::for_object(&leases, "fabric-operator", Duration::from_secs(60), |l| {
        l.and_then(|l| l.spec.as_ref())
            .and_then(|s| s.holder_identity.as_deref())
            == Some("op-b")
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", b.log_tail(60)));
    let patch = json!({"metadata": {"annotations": {keys::ANNOTATION_RUN_NOW: "b"}}});
    tests
        .patch("led", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("annotate");
    let runs = wait_runs(&env, "led", 2, Duration::from_secs(60)).await;
    let manual = runs
        .iter()
        .find(|r| r.spec.trigger == Trigger::Manual)
        .expect("the new leader started the manual run");
    wait_finished(&env, &manual.name_any(), Duration::from_secs(60)).await;
}

#[test]
fn the_removed_namespace_flag_is_refused_with_what_to_use_instead() {
    let bin = gpufabric_tests::kubelet::default_agent_bin_dir().join("fabric-operator");
    assert!(
        bin.is_file(),
        "{} is missing: build it first",
        bin.display()
    );
    let out = std::process::Command::new(bin)
        .args(["run", "--namespace", "gpu", "--admin-addr", "off"])
        .output()
        .expect("fabric-operator runs");
    assert!(!out.status.success(), "--namespace was accepted");
    let err = String::from_utf8_lossy(&out.stderr);
    for needed in ["cluster-scoped", "--pod-namespace gpu", "--selector"] {
        assert!(err.contains(needed), "{needed:?} not in: {err}");
    }
}
