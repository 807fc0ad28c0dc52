//! Only what the operator made counts, against a real kube-apiserver: a pod or Secret made
//! in its namespace with the name of one of a run's own is never read, a pod labelled as a
//! run's elsewhere hides no node, and a benchmark pod that floods its log cannot make the
//! operator grow.
//!
//! Build the binaries first: `cargo build -p gpufabric-agent -p gpufabric-operator`.

use gpufabric_api::keys;
use gpufabric_api::outcome::NotMeasuredReason;
use gpufabric_api::run::{FabricTestRun, NodeVerdict};
use gpufabric_measure::fleet::Fleet;
use gpufabric_operator::names::{pod_name, run_base};
use gpufabric_tests::fixtures::shell_pod;
use gpufabric_tests::fleet::{H100, SimFleet};
use gpufabric_tests::kubelet::{KubeletOptions, default_agent_bin_dir};
use gpufabric_tests::operator::{
    OperatorEnv, OperatorProcess, cordoned, last_run_name, quarantine_on_first_failure, sim_agent,
};
use gpufabric_tests::shared::TestEnv;
use gpufabric_tests::wait;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret};
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use std::time::Duration;

fn fleet(n: usize) -> Fleet {
    SimFleet::uniform("gpu", n, H100, 8)
}

/// The first run of FabricTest `test`, as soon as it exists (it has a UID from then on).
async fn first_run(env: &OperatorEnv, test: &str) -> FabricTestRun {
    wait::poll(
        &format!("a run of {test}"),
        Duration::from_secs(60),
        Duration::from_millis(20),
        || async { Ok(env.runs_of(test).await.into_iter().next()) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", env.operator.log_tail(60)))
}

/// What the names of `run`'s pods and Secret start with.
fn base_of(run: &FabricTestRun) -> String {
    run_base(&run.name_any(), &run.uid().unwrap_or_default())
}

/// A pod named as `run`'s benchmark pod of `node` would be, made by someone else, that
/// ends at once with exit code 10 (the agent's hardware fault); with `owner`, it carries the
/// run as its controller, copied from the run.
fn squatter(run: &FabricTestRun, node: &str, owner: bool) -> Pod {
    let mut p = shell_pod(&pod_name(&base_of(run), node), node, "exit 10");
    p.metadata.labels = Some(
        [(keys::LABEL_RUN.to_string(), run.name_any())]
            .into_iter()
            .collect(),
    );
    if owner {
        let copied = k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "gpufabric.io/v1alpha1".into(),
            kind: "FabricTestRun".into(),
            name: run.name_any(),
            uid: run.uid().unwrap_or_default(),
            controller: Some(true),
            ..Default::default()
        };
        p.metadata.owner_references = Some(vec![copied]);
    }
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_squatting_pod_at_a_benchmark_pods_name_never_gets_its_node_cordoned() {
    let env = OperatorEnv::shared(fleet(3), "squat").await;
    // One node at a time, so that the later nodes' pods are made after the run exists.
    env.create_test(
        "squat",
        json!({
            "nodeSelector": env.node_selector(),
            "suite": {"ncclSweep": {"enabled": false}, "ddpProbe": {"enabled": false}},
            "rollout": {"maxUnavailable": 1},
            "quarantine": quarantine_on_first_failure("Cordon", false),
            "agent": sim_agent(30)
        }),
    )
    .await;
    let run = first_run(&env, "squat").await;
    let pods = env.pods_api();
    // gpu-02: a squatter of its own; gpu-03: one with the run's owner copied onto it.
    for (node, owner) in [("gpu-02", false), ("gpu-03", true)] {
        pods.create(
            &PostParams::default(),
            &squatter(&run, &env.node(node), owner),
        )
        .await
        .unwrap_or_else(|e| panic!("the squatter of {node} made before its pod: {e}"));
    }
    let status = env.wait_folded("squat", None).await;
    let run_name = last_run_name(&status);
    assert_eq!(run_name, run.name_any());
    let status = env.run_status(&run_name).await;
    let entry = |base: &str| {
        let node = env.node(base);
        status
            .nodes
            .iter()
            .find(|n| n.node == node)
            .cloned()
            .unwrap_or_else(|| panic!("{node} in {status:#?}"))
    };
    let taken = entry("gpu-02");
    assert_eq!(taken.verdict, NodeVerdict::NotMeasured, "{taken:?}");
    assert_eq!(
        taken.not_measured,
        Some(NotMeasuredReason::NameTaken),
        "{taken:?}"
    );
    let squat_name = pod_name(&base_of(&run), &env.node("gpu-02"));
    assert!(
        taken
            .reason
            .as_deref()
            .is_some_and(|r| r.contains(&squat_name)),
        "the reason names the squatter: {taken:?}"
    );
    // The copy of the run's owner was deleted unread; the node got a pod of its own.
    let copied = entry("gpu-03");
    assert_eq!(copied.verdict, NodeVerdict::Passed, "{copied:?}");
    let nodes: Api<Node> = Api::all(env.cluster.client());
    for base in ["gpu-01", "gpu-02", "gpu-03"] {
        let node = nodes.get(&env.node(base)).await.expect("node");
        assert!(
            !cordoned(&node),
            "{base} cordoned\n{}",
            env.operator.log_tail(80)
        );
    }
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(env.cluster.client(), "default");
    let said = events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .any(|e| {
            e.reason.as_deref() == Some("NameTaken")
                && e.note.as_deref().is_some_and(|n| n.contains(&squat_name))
        });
    assert!(said, "an Event names the squatter");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rendezvous_secret_made_before_the_run_made_its_own_is_never_used() {
    let env = OperatorEnv::shared(fleet(2), "squat-secret").await;
    env.create_test(
        "squat-secret",
        json!({
            "nodeSelector": env.node_selector(),
            "suite": gpufabric_tests::operator::node_pairs_suite(),
            "agent": sim_agent(30)
        }),
    )
    .await;
    let run = first_run(&env, "squat-secret").await;
    let name = gpufabric_operator::pairs::pods::secret_name(&base_of(&run));
    let chosen = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        string_data: Some(
            [(
                gpufabric_operator::pairs::pods::SECRET_KEY.to_string(),
                "0".repeat(64),
            )]
            .into_iter()
            .collect(),
        ),
        ..Default::default()
    };
    let secrets: Api<Secret> = Api::namespaced(env.cluster.client(), &env.ns);
    secrets
        .create(&PostParams::default(), &chosen)
        .await
        .expect("the chosen secret made before the run's own");
    let status = env.wait_folded("squat-secret", None).await;
    let status = env.run_status(&last_run_name(&status)).await;
    let pairs = status.node_pairs.clone().expect("the node-pair phase");
    assert!(pairs.done, "{pairs:#?}");
    assert!(
        pairs.message.as_deref().is_some_and(|m| m.contains(&name)),
        "the phase says why it did not run: {pairs:#?}"
    );
    let pair_pods = env
        .pods_api()
        .list(&ListParams::default().labels(&format!("{}=node-pair", keys::LABEL_ROLE)))
        .await
        .expect("pods")
        .items;
    assert!(
        pair_pods.is_empty(),
        "no pod ever read the chosen secret: {pair_pods:#?}"
    );
    // The node checks themselves were not touched.
    assert!(
        status
            .nodes
            .iter()
            .all(|n| n.verdict == NodeVerdict::Passed),
        "{status:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_labelled_as_a_run_in_a_tenant_namespace_does_not_hide_its_node() {
    let env = OperatorEnv::shared(fleet(2), "tenant-label").await;
    let tenant = format!("{}-tenant", env.ns);
    let namespaces: Api<Namespace> = Api::all(env.cluster.client());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": tenant}})).expect("ns");
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .expect("tenant namespace");
    // A tenant's pod on gpu-01 that asks for no GPU, labelled as a gpufabric run's.
    let mut p = shell_pod("looks-like-a-run", &env.node("gpu-01"), "sleep 600");
    p.metadata.labels = Some(
        [(keys::LABEL_RUN.to_string(), "nightly-1".to_string())]
            .into_iter()
            .collect(),
    );
    let pods: Api<Pod> = Api::namespaced(env.cluster.client(), &tenant);
    pods.create(&PostParams::default(), &p)
        .await
        .expect("labelled pod");
    env.create_test(
        "tenant-label",
        json!({
            "nodeSelector": env.node_selector(),
            "suite": {"ncclSweep": {"enabled": false}, "ddpProbe": {"enabled": false}},
            "agent": sim_agent(30)
        }),
    )
    .await;
    let status = env.wait_folded("tenant-label", None).await;
    let status = env.run_status(&last_run_name(&status)).await;
    let _ = namespaces.delete(&tenant, &Default::default()).await;
    assert!(
        status.skipped.is_empty(),
        "no node skipped: {:#?}",
        status.skipped
    );
    for base in ["gpu-01", "gpu-02"] {
        let node = env.node(base);
        let e = status.nodes.iter().find(|n| n.node == node);
        assert_eq!(
            e.map(|e| e.verdict),
            Some(NodeVerdict::Passed),
            "{base}: {status:#?}"
        );
    }
}

/// Peak resident memory of process `pid` (`VmHWM`), bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_64_mib_log_line_is_refused_without_the_operator_growing() {
    const NODES: usize = 4;
    const FLOOD: u64 = 64 * 1024 * 1024;
    let env = TestEnv::new("flood").await.expect("env");
    // The agent as the kubelet runs it: the real one, then a last log line of 64 MiB that
    // is one valid JSON object (`{"x":[0,0,...,0]}`): read whole and parsed into a tree, it
    // would cost the operator more than a GiB.
    let dir = tempfile::tempdir().expect("dir");
    let real = default_agent_bin_dir().join("fabric-agent");
    let script = format!(
        "#!/bin/sh\n\"{}\" \"$@\"; rc=$?\nprintf '{{\"x\":['; yes 0 | head -c {FLOOD} | tr '\\n' ','; printf '0]}}\\n'\nexit $rc\n",
        real.display()
    );
    let wrapper = dir.path().join("fabric-agent");
    std::fs::write(&wrapper, script).expect("wrapper");
    std::fs::set_permissions(
        &wrapper,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("executable");
    let opts = KubeletOptions {
        agent_bin_dir: dir.path().to_path_buf(),
        ..Default::default()
    };
    let (_fleet, _kubelet) = env
        .start_kubelet(fleet(NODES), opts)
        .await
        .expect("kubelet");
    let log = dir.path().join("operator.log");
    let selector = env.selector();
    let args = ["--pod-namespace", env.ns(), "--selector", &selector];
    let operator = OperatorProcess::start_with(env.cluster(), log, &args, &[]);
    let (k, v) = env.label();
    let test: gpufabric_api::FabricTest = serde_json::from_value(json!({
        "apiVersion": "gpufabric.io/v1alpha1",
        "kind": "FabricTest",
        "metadata": {"name": "flood", "labels": {k: v}},
        "spec": {
            "nodeSelector": env.node_selector(),
            "suite": {"ncclSweep": {"enabled": false}, "ddpProbe": {"enabled": false}},
            "agent": sim_agent(60)
        }
    }))
    .expect("test");
    let tests: Api<gpufabric_api::FabricTest> = Api::all(env.client());
    tests
        .create(&PostParams::default(), &test)
        .await
        .expect("FabricTest");
    let folded = wait::for_object(&tests, "flood", Duration::from_secs(180), |t| {
        t.and_then(|t| t.status.as_ref())
            .is_some_and(|s| s.active_run.is_none() && s.last_run.is_some())
    })
    .await;
    let status = match folded {
        Ok(Some(t)) => t.status.unwrap_or_default(),
        other => panic!("not folded: {other:?}\n{}", operator.log_tail(80)),
    };
    let runs: Api<FabricTestRun> = Api::all(env.client());
    // The full results are kept after the verdict: wait for the run to say what came of it.
    let kept = wait::for_object(
        &runs,
        &last_run_name(&status),
        Duration::from_secs(90),
        |r| {
            r.and_then(|r| r.status.as_ref())
                .and_then(|s| s.message.as_deref())
                .is_some_and(|m| m.contains("full results not kept"))
        },
    )
    .await;
    let run_status = match kept {
        Ok(Some(r)) => r.status.unwrap_or_default(),
        other => panic!(
            "no word on the full results: {other:?}
{}",
            operator.log_tail(80)
        ),
    };
    let pid = operator.pid().expect("the operator runs");
    let peak = peak_rss(pid);
    eprintln!(
        "operator peak RSS {} MiB after {NODES} pods' 64 MiB log lines",
        peak / (1024 * 1024)
    );
    assert!(
        run_status
            .nodes
            .iter()
            .all(|n| n.verdict == NodeVerdict::Passed),
        "the results themselves are read from the pods' status: {run_status:#?}"
    );
    assert!(
        run_status
            .message
            .as_deref()
            .is_some_and(|m| m.contains("over the") && m.contains("not read")),
        "the run says the full results were not kept: {:?}\n{}",
        run_status.message,
        operator.log_tail(40)
    );
    // One such line read whole is 64 MiB, and parsing it as a tree takes more than a GiB.
    const BOUND: u64 = 128 * 1024 * 1024;
    assert!(
        peak > 0 && peak < BOUND,
        "peak RSS {peak} bytes: the operator grew with the log"
    );
    let _ = tests.delete("flood", &Default::default()).await;
}
