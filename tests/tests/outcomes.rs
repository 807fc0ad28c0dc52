//! Only hardware faults count against a node: the real `fabric-operator` against a real
//! control plane and the process-kubelet. Infrastructure failures produced for real (a
//! missing Secret, busy GPUs, an eviction, someone's maintenance taint) leave every node untouched in
//! every quarantine mode, and the reason is in the status.
//!
//! The tests share the binary's control plane and run in parallel: each has its own
//! operator, namespace and prefixed, labelled nodes, and its FabricTests select only those
//! nodes.
//!
//! Build the binaries first: `cargo build --bins`, then
//! `cargo test -p gpufabric-tests --test outcomes`.

use gpufabric_api::keys::{
    ANNOTATION_QUARANTINE, LABEL_QUARANTINED, LABEL_TEST, TAINT_QUARANTINED,
};
use gpufabric_api::limits::{CANCEL_ANNOTATION, CONDITION_GPUS_FREE, StopCause};
use gpufabric_api::outcome::NotMeasuredReason;
use gpufabric_api::result::Phase;
use gpufabric_api::run::{FabricTestRun, NodeVerdict, RunPhase, SkipReason};
use gpufabric_api::{FabricTest, FabricTestStatus};
use gpufabric_measure::fleet::{Fault, Fleet};
use gpufabric_tests::fixtures;
use gpufabric_tests::fleet::{H100, SimFleet};
use gpufabric_tests::kubelet::Eviction;
use gpufabric_tests::operator::{OperatorEnv, sim_agent};
use gpufabric_tests::wait;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

const MODES: [&str; 4] = ["Observe", "Label", "Cordon", "Taint"];

/// Node label that gives each quarantine mode three nodes of its own, so that the four
/// modes of a cause run at once.
const MODE_LABEL: &str = "outcomes.gpufabric.io/mode";

fn fleet(n: usize) -> Fleet {
    SimFleet::uniform("gpu", n, H100, 8)
}

/// Three nodes for each mode (gpu-01..03 Observe, gpu-04..06 Label, ...), labelled with it.
fn fleet_per_mode() -> Fleet {
    let mut f = fleet(3 * MODES.len());
    for (i, n) in f.nodes.iter_mut().enumerate() {
        n.labels
            .insert(MODE_LABEL.to_string(), MODES[i / 3].to_lowercase());
    }
    f
}

/// Every node name of [`fleet_per_mode`], as `env` registered them.
fn all_mode_nodes(env: &OperatorEnv) -> Vec<String> {
    (1..=3 * MODES.len())
        .map(|i| env.node(&format!("gpu-{i:02}")))
        .collect()
}

/// Runs `check` for every mode in `modes` at once (each on its own nodes).
async fn each_mode<F, Fut>(modes: &[&'static str], check: F)
where
    F: Fn(&'static str) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    futures::future::join_all(modes.iter().map(|m| check(m))).await;
}

/// A small suite on the sim backend that acts on the first bad result: one failure is
/// enough to quarantine, no confirmation run, every node may be held.
fn spec(
    env: &OperatorEnv,
    mode: &str,
    agent: serde_json::Value,
    extra: serde_json::Value,
) -> serde_json::Value {
    let mut spec = json!({
        "nodeSelector": env.node_selector(),
        "suite": {
            "ncclSweep": {"collectives": ["allReduce"]},
            "ddpProbe": {"hidden": 256, "layers": 2, "batchPerGpu": 8, "warmupSteps": 1, "steps": 2}
        },
        "quarantine": {
            "mode": mode,
            "maxQuarantined": "100%",
            "failuresToQuarantine": 1,
            "passesToRelease": 1,
            "confirmRetest": false
        },
        "agent": agent,
    });
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            s.insert(k.clone(), v.clone());
        }
    }
    spec
}

/// The sim agent with an env var taken from a Secret that does not exist.
fn agent_with_missing_secret() -> serde_json::Value {
    let mut agent = sim_agent(20);
    if let Some(env) = agent.get_mut("env").and_then(|e| e.as_array_mut()) {
        env.push(json!({
            "name": "FABRIC_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "no-such-secret", "key": "token"}}
        }));
    }
    agent
}

/// Waits until the test has folded a finished run into its status and has none active.
async fn wait_folded(env: &OperatorEnv, api: &Api<FabricTest>, name: &str) -> FabricTestStatus {
    let r = wait::for_object(api, name, Duration::from_secs(120), |t| {
        t.and_then(|t| t.status.as_ref())
            .is_some_and(|s| s.active_run.is_none() && s.last_run.is_some())
    })
    .await;
    match r {
        Ok(Some(t)) => t.status.unwrap_or_default(),
        other => panic!(
            "{name}: no run folded: {other:?}\noperator log:\n{}",
            env.operator.log_tail(80)
        ),
    }
}

/// Asserts that gpufabric changed nothing on any node: no cordon, taint, label or record.
fn assert_untouched(all: &BTreeMap<String, Node>, context: &str) {
    for (name, n) in all {
        let spec = n.spec.clone().unwrap_or_default();
        assert!(
            !spec.unschedulable.unwrap_or(false),
            "{context}: {name} was cordoned"
        );
        assert!(
            !spec
                .taints
                .unwrap_or_default()
                .iter()
                .any(|t| t.key == TAINT_QUARANTINED),
            "{context}: {name} was tainted"
        );
        assert!(
            !n.labels().contains_key(LABEL_QUARANTINED),
            "{context}: {name} was labelled"
        );
        assert!(
            !n.annotations().contains_key(ANNOTATION_QUARANTINE),
            "{context}: {name} carries a quarantine record"
        );
    }
}

/// Events about the FabricTest `name` (cluster-scoped: its Events are in "default").
async fn test_events(env: &OperatorEnv, name: &str) -> Vec<(String, String)> {
    gpufabric_tests::events::about(&env.cluster.client(), "default", name).await
}

/// What one infrastructure cause must leave in the status of a run over every node.
struct Expect {
    reason: NotMeasuredReason,
    /// The pattern's label in the condition and Event.
    label: &'static str,
    /// In every node's `reason`.
    detail: &'static str,
}

/// Creates one FabricTest in `mode` over that mode's nodes and checks its first run: every node not measured for
/// `want.reason`, nothing held against any node, one InfrastructureDegraded condition and
/// Event, no pod left holding GPUs, and no node touched.
async fn check_spared(
    env: &OperatorEnv,
    cause: &str,
    mode: &str,
    agent: serde_json::Value,
    extra: serde_json::Value,
    want: &Expect,
) {
    let name = format!("{cause}-{}", mode.to_lowercase());
    let mut spec = spec(env, mode, agent, extra);
    spec["nodeSelector"][MODE_LABEL] = json!(mode.to_lowercase());
    let tests = env.create_test(&name, spec).await;
    let status = wait_folded(env, &tests, &name).await;
    let context = format!("{cause}/{mode}");

    // Every node is listed as not measured, with the kubelet's reason.
    let runs = env.runs_of(&name).await;
    assert_eq!(runs.len(), 1, "{context}: one run, no confirmation run");
    let run = runs[0].status.clone().expect("run status");
    assert_eq!(run.nodes.len(), 3, "{context}: {run:?}");
    for n in &run.nodes {
        assert_eq!(n.verdict, NodeVerdict::NotMeasured, "{context}: {n:?}");
        assert_eq!(n.not_measured, Some(want.reason), "{context}: {n:?}");
        assert!(
            n.reason.as_deref().is_some_and(|r| r.contains(want.detail)),
            "{context}: {n:?}"
        );
    }
    assert_eq!((run.not_measured, run.errored, run.failed), (3, 0, 0));
    assert!(run.findings.is_empty(), "{context}: {:?}", run.findings);

    // The test's history holds nothing against the nodes.
    assert_eq!(status.quarantined_count, 0, "{context}: {status:#?}");
    for h in &status.nodes {
        assert_eq!(
            (h.verdict, h.consecutive_failures, h.held_back.as_deref()),
            (NodeVerdict::NotMeasured, 0, None),
            "{context}: {h:?}"
        );
    }
    let degraded = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Degraded")
        .expect("Degraded");
    assert_eq!(degraded.status, "False", "{context}: {degraded:?}");

    // One condition and one Event name the pattern and what to check.
    let infra = status
        .conditions
        .iter()
        .find(|c| c.type_ == "InfrastructureDegraded")
        .expect("InfrastructureDegraded");
    assert_eq!(
        (infra.status.as_str(), infra.reason.as_str()),
        ("True", want.reason.as_str()),
        "{context}"
    );
    let pattern = format!("{} on 3 of 3 nodes", want.label);
    assert!(
        infra.message.contains(&pattern),
        "{context}: {}",
        infra.message
    );
    let events = wait::poll(
        "the InfrastructureDegraded Event",
        Duration::from_secs(20),
        Duration::from_millis(300),
        || async {
            let e: Vec<_> = test_events(env, &name)
                .await
                .into_iter()
                .filter(|(r, _)| r == "InfrastructureDegraded")
                .collect();
            Ok((!e.is_empty()).then_some(e))
        },
    )
    .await
    .expect("an Event on the test");
    if events.len() != 1 {
        let api: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(env.cluster.client(), "default");
        let all = api.list(&ListParams::default()).await.map(|l| l.items);
        panic!(
            "{context}: {events:?}\nall Events: {all:#?}\noperator log:\n{}",
            env.operator.log_tail(150)
        );
    }
    assert!(events[0].1.contains(&pattern), "{context}: {events:?}");

    // No pod of the run still holds a node's GPUs: each is gone or has ended.
    let pods: Api<Pod> = env.pods_api();
    let selector = format!("{}={}", gpufabric_api::keys::LABEL_RUN, runs[0].name_any());
    wait::poll(
        "blocked pods stopped",
        Duration::from_secs(30),
        Duration::from_millis(300),
        || async {
            let holding = pods
                .list(&ListParams::default().labels(&selector))
                .await
                .map(|l| l.items.iter().filter(|p| holds_gpus(p)).count())
                .unwrap_or(usize::MAX);
            Ok((holding == 0).then_some(()))
        },
    )
    .await
    .expect("the pods of the run hold no GPUs");

    assert_untouched(&env.nodes().await, &context);
}

/// The pod is neither ended nor being deleted.
fn holds_gpus(p: &Pod) -> bool {
    p.metadata.deletion_timestamp.is_none()
        && !matches!(
            p.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded") | Some("Failed")
        )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_secret_on_every_node_cordons_nothing_in_any_mode() {
    let env = OperatorEnv::shared(fleet_per_mode(), "secret").await;
    let want = Expect {
        reason: NotMeasuredReason::ContainerConfig,
        label: "CreateContainerConfigError",
        detail: "secret \"no-such-secret\" not found",
    };
    each_mode(&MODES, |mode| {
        check_spared(
            &env,
            "secret",
            mode,
            agent_with_missing_secret(),
            json!({}),
            &want,
        )
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_that_cannot_be_pulled_cordons_nothing_in_any_mode() {
    let env = OperatorEnv::shared(fleet_per_mode(), "image").await;
    let mut agent = sim_agent(20);
    agent["image"] = json!(fixtures::MISSING_IMAGE);
    let want = Expect {
        reason: NotMeasuredReason::ImagePull,
        label: "ImagePullBackOff",
        detail: "ImagePullBackOff",
    };
    each_mode(&MODES, |mode| {
        check_spared(&env, "image", mode, agent.clone(), json!({}), &want)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_refused_for_busy_gpus_cordon_nothing_in_any_mode() {
    let env = OperatorEnv::shared(fleet_per_mode(), "busy").await;
    // A training job holds every GPU of every node; the tests opt in to busy nodes, so
    // their pods reach the kubelet, which refuses them.
    for node in all_mode_nodes(&env) {
        fixtures::hold_gpus(&env.cluster.client(), &env.ns, &node, 8)
            .await
            .expect("GPUs held");
    }
    let want = Expect {
        reason: NotMeasuredReason::NotAdmitted,
        label: "OutOfnvidia.com/gpu",
        detail: "used: 8, capacity: 8",
    };
    each_mode(&MODES, |mode| {
        check_spared(
            &env,
            "busy",
            mode,
            sim_agent(20),
            json!({"includeBusyNodes": true}),
            &want,
        )
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_that_never_start_cordon_nothing_in_any_mode() {
    let env = OperatorEnv::shared(fleet_per_mode(), "stalled").await;
    for node in all_mode_nodes(&env) {
        env.kubelet
            .set_node_stalled(&node, true)
            .await
            .expect("node stalled");
    }
    let want = Expect {
        reason: NotMeasuredReason::NeverStarted,
        label: "NeverStarted",
        detail: "no container ever ran",
    };
    // The run deadline is the agent timeout plus the operator's margin: the shortest timeout the schema allows (10 s).
    each_mode(&MODES, |mode| {
        check_spared(&env, "stalled", mode, sim_agent(10), json!({}), &want)
    })
    .await;
}

/// The nodes of every mode, whose agents all fail the same way (`fault`).
fn fleet_all(fault: Fault) -> Fleet {
    let mut f = fleet_per_mode();
    for n in f.nodes.iter_mut() {
        n.faults.push(fault.clone());
    }
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_cannot_load_its_libraries_cordons_nothing_in_any_mode() {
    // Exit 11: the image's CUDA, NCCL or NVML does not load on this driver. The image is at
    // fault, not the nodes.
    let env = OperatorEnv::shared(
        fleet_all(Fault::Crash {
            exit_code: Some(11),
        }),
        "incompatible",
    )
    .await;
    let want = Expect {
        reason: NotMeasuredReason::AgentIncompatible,
        label: "AgentIncompatible",
        detail: "could not be loaded (exit code 11)",
    };
    each_mode(&MODES, |mode| {
        check_spared(&env, "incompatible", mode, sim_agent(20), json!({}), &want)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpus_held_by_work_outside_the_scheduler_cordon_nothing_in_any_mode() {
    // Exit 14: another process (started on the host, or a pod that sees the GPUs without
    // asking for them) holds 40 GiB of GPU 0 when the agent starts. Its load would read as
    // slow links and GPUs; the agent does not measure, and the node is not at fault.
    let env = OperatorEnv::shared(
        fleet_all(Fault::GpusInUse {
            gpu: 0,
            bytes: 40 << 30,
            during: false,
        }),
        "shared",
    )
    .await;
    let want = Expect {
        reason: NotMeasuredReason::GpusInUse,
        label: "GpusInUse",
        detail: "(exit code 14): the GPUs are in use by other work: GPU 0: 40.0 GiB of",
    };
    each_mode(&MODES, |mode| {
        check_spared(&env, "shared", mode, sim_agent(20), json!({}), &want)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_result_document_cordons_nothing_in_any_mode() {
    // Every agent exits 0 with a truncated document: an agent bug, not the nodes.
    let env = OperatorEnv::shared(fleet_all(Fault::Garbage), "garbage").await;
    let want = Expect {
        reason: NotMeasuredReason::AgentBug,
        label: "AgentBug",
        detail: "its result is unusable",
    };
    each_mode(&MODES, |mode| {
        check_spared(&env, "garbage", mode, sim_agent(20), json!({}), &want)
    })
    .await;
}

/// A pod of someone else's in `ns` that holds `gpus` GPUs of `node` (bound there, sleeping).
fn gpu_holder(ns: &str, node: &str, gpus: u32) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": format!("training-{node}"), "namespace": ns},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "containers": [{
                "name": "train",
                "image": "example.com/train:1",
                "command": ["sleep", "600"],
                "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}
            }]
        }
    }))
    .expect("valid pod")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_and_foreign_tainted_nodes_are_skipped_with_the_reason() {
    let env = OperatorEnv::shared(fleet(3), "skipped").await;
    let (n1, n2, n3) = (env.node("gpu-01"), env.node("gpu-02"), env.node("gpu-03"));
    let client = env.cluster.client();
    // gpu-01: under someone's maintenance. gpu-02: a training job holds half its GPUs.
    let node_api: Api<Node> = Api::all(client.clone());
    let taint = json!({"spec": {"taints": [
        {"key": "example.com/maintenance", "value": "true", "effect": "NoSchedule"}
    ]}});
    node_api
        .patch(&n1, &PatchParams::default(), &Patch::Merge(&taint))
        .await
        .expect("taint gpu-01");
    let pods: Api<Pod> = env.pods_api();
    pods.create(&PostParams::default(), &gpu_holder(&env.ns, &n2, 4))
        .await
        .expect("holder pod");

    let tests = env
        .create_test("idle", spec(&env, "Cordon", sim_agent(30), json!({})))
        .await;
    wait_folded(&env, &tests, "idle").await;
    let runs = env.runs_of("idle").await;
    let run = runs[0].status.clone().expect("run status");
    let tested: Vec<&str> = run.nodes.iter().map(|n| n.node.as_str()).collect();
    assert_eq!(tested, [n3.as_str()], "{run:#?}");
    assert_eq!(run.nodes[0].verdict, NodeVerdict::Passed, "{run:#?}");
    let skipped: Vec<(&str, SkipReason)> = run
        .skipped
        .iter()
        .map(|s| (s.node.as_str(), s.reason))
        .collect();
    assert_eq!(
        skipped,
        [
            (n1.as_str(), SkipReason::Tainted),
            (n2.as_str(), SkipReason::Busy)
        ]
    );
    assert!(
        run.skipped[0].message.contains("example.com/maintenance"),
        "{:?}",
        run.skipped[0]
    );
    assert!(
        run.skipped[1].message.contains("4 of its 8"),
        "{:?}",
        run.skipped[1]
    );
    let all = env.nodes().await;
    assert_untouched(&all, "idle");
    // The maintenance taint is still the administrator's alone.
    let taints = all[&n1]
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    assert!(taints.iter().any(|t| t.key == "example.com/maintenance"));

    // Opting in tests the busy node too (the tainted one stays skipped).
    let tests = env
        .create_test(
            "busy-too",
            spec(
                &env,
                "Observe",
                sim_agent(30),
                json!({"includeBusyNodes": true}),
            ),
        )
        .await;
    wait_folded(&env, &tests, "busy-too").await;
    let runs = env.runs_of("busy-too").await;
    let run = runs[0].status.clone().expect("run status");
    let tested: Vec<&str> = run.nodes.iter().map(|n| n.node.as_str()).collect();
    assert_eq!(tested, [n2.as_str(), n3.as_str()], "{run:#?}");
    assert_eq!(run.skipped.len(), 1, "{:?}", run.skipped);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_waits_for_busy_nodes_when_asked_and_skips_them_when_the_wait_is_over() {
    let env = OperatorEnv::shared(fleet(2), "wait").await;
    let (n1, n2) = (env.node("gpu-01"), env.node("gpu-02"));
    let holder = format!("training-{n2}");
    let pods: Api<Pod> = env.pods_api();
    pods.create(&PostParams::default(), &gpu_holder(&env.ns, &n2, 4))
        .await
        .expect("holder pod");

    // Waiting: the run stays Pending and says for which node, until the training pod ends.
    let tests = env
        .create_test(
            "patient",
            spec(
                &env,
                "Cordon",
                sim_agent(30),
                json!({"waitForBusyNodesSeconds": 300}),
            ),
        )
        .await;
    let runs_api = env.runs_api();
    let pending = wait::poll(
        "a run waiting for gpu-02",
        Duration::from_secs(60),
        Duration::from_millis(300),
        || async {
            let runs = env.runs_of("patient").await;
            Ok(runs.into_iter().find_map(|r| {
                let s = r.status.clone()?;
                let waiting = s.phase == gpufabric_api::run::RunPhase::Pending
                    && s.message.as_deref().is_some_and(|m| m.contains(&n2));
                waiting.then_some(r)
            }))
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\noperator log:\n{}", env.operator.log_tail(60)));
    // Still waiting a few passes later: no pod was created for either node.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let run = runs_api.get(&pending.name_any()).await.expect("the run");
    let status = run.status.clone().unwrap_or_default();
    assert_eq!(
        status.phase,
        gpufabric_api::run::RunPhase::Pending,
        "{status:#?}"
    );
    let bench = env
        .pods_api()
        .list(&ListParams::default().labels(&format!("{LABEL_TEST}=patient")))
        .await
        .expect("pods listed");
    assert!(bench.items.is_empty(), "no benchmark pod while waiting");
    pods.delete(&holder, &Default::default())
        .await
        .expect("the training pod ends");
    wait_folded(&env, &tests, "patient").await;
    let runs = env.runs_of("patient").await;
    let run = runs[0].status.clone().expect("run status");
    let tested: Vec<(&str, NodeVerdict)> = run
        .nodes
        .iter()
        .map(|n| (n.node.as_str(), n.verdict))
        .collect();
    assert_eq!(
        tested,
        [
            (n1.as_str(), NodeVerdict::Passed),
            (n2.as_str(), NodeVerdict::Passed)
        ],
        "{run:#?}"
    );
    assert!(run.skipped.is_empty(), "{:?}", run.skipped);

    // A wait that ends while the node is still busy: the run starts without it, which is
    // skipped with the reason, and nothing is done to it.
    wait::for_object(&pods, &holder, Duration::from_secs(60), |p| p.is_none())
        .await
        .expect("the training pod is gone");
    pods.create(&PostParams::default(), &gpu_holder(&env.ns, &n2, 2))
        .await
        .expect("holder pod again");
    let tests = env
        .create_test(
            "short-wait",
            spec(
                &env,
                "Cordon",
                sim_agent(30),
                json!({"waitForBusyNodesSeconds": 4}),
            ),
        )
        .await;
    wait_folded(&env, &tests, "short-wait").await;
    let runs = env.runs_of("short-wait").await;
    let run = runs[0].status.clone().expect("run status");
    let tested: Vec<&str> = run.nodes.iter().map(|n| n.node.as_str()).collect();
    assert_eq!(tested, [n1.as_str()], "{run:#?}");
    assert_eq!(run.skipped.len(), 1, "{:?}", run.skipped);
    assert_eq!(run.skipped[0].reason, SkipReason::Busy);
    assert!(
        run.skipped[0]
            .message
            .contains("still busy after waiting 4s"),
        "{:?}",
        run.skipped[0]
    );
    assert_untouched(&env.nodes().await, "short-wait");
}

/// The nodes of every mode, whose agents block in their health phase until stopped.
fn hung_fleet() -> Fleet {
    let mut f = fleet_per_mode();
    for node in f.nodes.iter_mut() {
        node.faults.push(Fault::Hang {
            phase: Some(Phase::Health),
            stuck: true,
        });
    }
    f
}

/// Calls `act` once on each benchmark pod of the test `name` as soon as its agent runs, until
/// `n` pods have been acted on (`what` names the act in a failure); returns their names.
async fn act_on_running_pods<F, Fut>(
    env: &OperatorEnv,
    name: &str,
    n: usize,
    what: &str,
    act: F,
) -> std::collections::BTreeSet<String>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let pods = env.pods_api();
    let selector = format!("{LABEL_TEST}={name}");
    let mut done = std::collections::BTreeSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while done.len() < n {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name}: only {done:?} of {n} pods ran to be {what}"
        );
        let list = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        for p in list {
            let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            let pod = p.name_any();
            if running && !done.contains(&pod) {
                act(pod.clone()).await;
                done.insert(pod);
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    done
}

/// Evicts each benchmark pod of the test `name` as soon as its agent runs (node pressure,
/// as the kubelet does when the node runs low on memory), until `n` are.
async fn evict_running_pods(env: &OperatorEnv, name: &str, n: usize, how: Eviction) {
    act_on_running_pods(env, name, n, "evicted", |pod| async move {
        env.kubelet
            .evict_pod(&env.ns, &pod, how)
            .expect("the kubelet runs the pod");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_benchmark_pods_cordon_nothing_in_any_mode() {
    // Every agent blocks in its health phase until it is stopped: each pod is still running
    // when the kubelet evicts it.
    let env = OperatorEnv::shared(hung_fleet(), "evicted").await;
    let want = Expect {
        reason: NotMeasuredReason::Evicted,
        label: "Evicted",
        detail: "low on resource: memory",
    };
    let (env, want) = (&env, &want);
    each_mode(&MODES, |mode| async move {
        let name = format!("evicted-{}", mode.to_lowercase());
        tokio::join!(
            check_spared(env, "evicted", mode, sim_agent(60), json!({}), want),
            evict_running_pods(env, &name, 3, Eviction::NodePressure),
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preempted_benchmark_pods_cordon_nothing() {
    // As above, but the kubelet preempts each running pod to admit a critical one.
    let env = OperatorEnv::shared(hung_fleet(), "preempted").await;
    let want = Expect {
        reason: NotMeasuredReason::Preempted,
        label: "Preempted",
        detail: "Preempted in order to admit critical pod",
    };
    let (env, want) = (&env, &want);
    each_mode(&["Cordon", "Taint"], |mode| async move {
        let name = format!("preempted-{}", mode.to_lowercase());
        tokio::join!(
            check_spared(env, "preempted", mode, sim_agent(60), json!({}), want),
            evict_running_pods(env, &name, 3, Eviction::Preemption),
        );
    })
    .await;
}

/// The nodes of every mode, whose agents block in their health phase until stopped and then
/// die of a segmentation fault (exit 139) instead of ending cleanly.
fn crash_on_stop_fleet() -> Fleet {
    let mut f = hung_fleet();
    for node in f.nodes.iter_mut() {
        node.faults.push(Fault::CrashOnStop { exit_code: None });
    }
    f
}

/// Deletes each benchmark pod of the test `name` as soon as its agent runs, as a person or a
/// drain without a disruption condition does, until `n` are. Each pod first gets a finalizer
/// of the test's own, so that its object, with the exit code the kubelet wrote, outlives the
/// kubelet's confirmation long enough to be read; the finalizers are removed once the run has
/// been judged (`release`).
async fn delete_running_pods(
    env: &OperatorEnv,
    name: &str,
    n: usize,
    release: tokio::sync::watch::Receiver<bool>,
) {
    let pods = env.pods_api();
    let deleted = act_on_running_pods(env, name, n, "deleted", |pod| {
        let pods = pods.clone();
        async move {
            let hold = json!({"metadata": {"finalizers": ["outcomes.gpufabric.io/hold"]}});
            pods.patch(&pod, &PatchParams::default(), &Patch::Merge(&hold))
                .await
                .expect("finalizer added");
            pods.delete(&pod, &Default::default())
                .await
                .expect("pod deleted");
        }
    })
    .await;
    let mut release = release;
    let _ = release.wait_for(|r| *r).await;
    for pod in deleted {
        let clear = json!({"metadata": {"finalizers": null}});
        let _ = pods
            .patch(&pod, &PatchParams::default(), &Patch::Merge(&clear))
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_that_crashes_while_its_pod_is_deleted_cordons_nothing() {
    // Every agent blocks until it is stopped, then dies of a segmentation fault: what a GPU
    // library torn down under a running collective did. The pods are deleted while running;
    // the exit code 139 the kubelet reports is the stop's, never the node's crash.
    let env = OperatorEnv::shared(crash_on_stop_fleet(), "deleted").await;
    let want = Expect {
        reason: NotMeasuredReason::PodDeleted,
        label: "PodDeleted",
        detail: "ended with exit code 139",
    };
    let (env, want) = (&env, &want);
    each_mode(&["Cordon", "Taint"], |mode| async move {
        let name = format!("deleted-{}", mode.to_lowercase());
        let (judged, release) = tokio::sync::watch::channel(false);
        tokio::join!(
            async {
                check_spared(env, "deleted", mode, sim_agent(60), json!({}), want).await;
                let _ = judged.send(true);
            },
            delete_running_pods(env, &name, 3, release),
        );
    })
    .await;
}

/// Three nodes a run cancels and three a run that runs out of time stops, whose agents
/// block in their health phase until stopped.
fn stopped_fleet() -> Fleet {
    let mut f = fleet(6);
    for (i, n) in f.nodes.iter_mut().enumerate() {
        let group = if i < 3 { "cancel" } else { "duration" };
        n.labels.insert(MODE_LABEL.to_string(), group.to_string());
        n.faults.push(Fault::Hang {
            phase: Some(Phase::Health),
            stuck: true,
        });
    }
    f
}

/// Checks a run stopped early as `cause` says: Failed with why, every node it tested not
/// measured for that reason, `GpusFree` True with no pod of the run left, and nothing held
/// against any node.
async fn check_stopped(env: &OperatorEnv, name: &str, cause: StopCause, nodes: usize) {
    let tests: Api<FabricTest> = Api::all(env.cluster.client());
    let status = wait_folded(env, &tests, name).await;
    let runs = env.runs_of(name).await;
    assert_eq!(runs.len(), 1, "{name}: one run, no confirmation run");
    let run = runs[0].status.clone().expect("run status");
    assert_eq!(run.phase, RunPhase::Failed, "{name}: {run:#?}");
    let limits = run.limits.clone().expect("the limits in the status");
    assert_eq!(limits.stopped, Some(cause), "{name}: {limits:?}");
    let reason = match cause {
        StopCause::Cancelled => NotMeasuredReason::Cancelled,
        StopCause::MaxDuration => NotMeasuredReason::MaxDuration,
    };
    assert_eq!(run.nodes.len(), nodes, "{name}: {run:#?}");
    for n in &run.nodes {
        assert_eq!(
            (n.verdict, n.not_measured),
            (NodeVerdict::NotMeasured, Some(reason)),
            "{name}: {n:?}"
        );
    }
    assert_eq!((run.failed, run.errored), (0, 0), "{name}");
    let free = run
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_GPUS_FREE)
        .expect("GpusFree");
    assert_eq!(free.status, "True", "{name}: {free:?}");
    // The run said so only once none of its pods was left: none is there now.
    let selector = format!("{}={}", gpufabric_api::keys::LABEL_RUN, runs[0].name_any());
    let left = env
        .pods_api()
        .list(&ListParams::default().labels(&selector))
        .await
        .expect("pods listed")
        .items;
    assert!(
        left.is_empty(),
        "{name}: pods left: {:?}",
        left.iter().map(|p| p.name_any()).collect::<Vec<_>>()
    );
    assert_eq!(status.quarantined_count, 0, "{name}: {status:#?}");
    for h in &status.nodes {
        assert_eq!(h.consecutive_failures, 0, "{name}: {h:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_run_and_one_out_of_time_free_every_gpu_and_blame_no_node() {
    let env = OperatorEnv::shared(stopped_fleet(), "stopped").await;
    let env = &env;
    let cancel = async {
        // Two of the three selected nodes (limits.maxNodes); cancelled once both agents run.
        let mut s = spec(
            env,
            "Cordon",
            sim_agent(60),
            json!({"limits": {"maxNodes": 2}}),
        );
        s["nodeSelector"][MODE_LABEL] = json!("cancel");
        env.create_test("cancel", s).await;
        act_on_running_pods(env, "cancel", 2, "running", |_| async {}).await;
        let runs: Api<FabricTestRun> = Api::all(env.cluster.client());
        let run = env.runs_of("cancel").await[0].name_any();
        let cancel =
            json!({"metadata": {"annotations": {CANCEL_ANNOTATION: "maintenance at 14:00"}}});
        runs.patch(&run, &PatchParams::default(), &Patch::Merge(&cancel))
            .await
            .expect("run annotated");
        check_stopped(env, "cancel", StopCause::Cancelled, 2).await;
        let run = env.runs_of("cancel").await[0]
            .status
            .clone()
            .unwrap_or_default();
        assert_eq!(run.skipped.len(), 1, "{run:#?}");
        assert_eq!(run.skipped[0].reason, SkipReason::OverLimit, "{run:#?}");
        let limits = run.limits.unwrap_or_default();
        assert_eq!(limits.nodes_over_limit, 1);
        assert!(
            limits.message.contains("maintenance at 14:00"),
            "{limits:?}"
        );
    };
    let duration = async {
        let mut s = spec(
            env,
            "Cordon",
            sim_agent(60),
            json!({"limits": {"maxDurationSeconds": 10}}),
        );
        s["nodeSelector"][MODE_LABEL] = json!("duration");
        env.create_test("duration", s).await;
        check_stopped(env, "duration", StopCause::MaxDuration, 3).await;
    };
    tokio::join!(cancel, duration);
    assert_untouched(&env.nodes().await, "stopped runs");
}
