//! Scale of one run: 1000 simulated nodes, one pod each. Measures how long the operator
//! takes to create every pod, to fold 1000 results into the run status, how large that
//! status is, and the operator's peak memory. `#[ignore]`d: run it with
//! `bench/operator-scale.sh` (which builds the binaries and records the numbers).

use gpufabric_api::run::{FabricTestRun, RunPhase};
use gpufabric_api::{FabricTest, keys};
use gpufabric_tests::cluster::Cluster;
use gpufabric_tests::fleet::{H100, SimFleet};
use gpufabric_tests::kubelet::{Kubelet, KubeletOptions, default_agent_bin_dir};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const NS: &str = "scale";

fn vm_hwm_kib(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[tokio::test]
#[ignore = "scale measurement; run bench/operator-scale.sh"]
async fn a_run_over_1000_nodes() {
    let nodes: usize = std::env::var("SCALE_NODES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    gpufabric_tests::init_tracing();
    let cluster = Cluster::start().await.expect("control plane");
    let fleet = SimFleet::write(SimFleet::uniform("gpu", nodes, H100, 8)).expect("fleet");
    let dir = tempfile::tempdir().expect("dir");
    let t = Instant::now();
    let _kubelet = Kubelet::start(
        cluster.client(),
        &fleet,
        KubeletOptions {
            root_dir: Some(dir.path().join("kubelet")),
            heartbeat: Duration::from_secs(30),
            status_interval: Duration::from_secs(120),
            ..Default::default()
        },
    )
    .await
    .expect("kubelet");
    eprintln!(
        "{nodes} nodes registered in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    cluster.create_namespace(NS).await.expect("namespace");

    let bin = default_agent_bin_dir().join("fabric-operator");
    let log = std::fs::File::create(dir.path().join("operator.log")).expect("log");
    let mut cmd = Command::new(&bin);
    gpufabric_tests::process::harden(&mut cmd);
    let mut op = cmd
        .args([
            "run",
            "--admin-addr",
            "off",
            "--pod-namespace",
            NS,
            "--kubeconfig",
        ])
        .arg(cluster.kubeconfig_path())
        .env("RUST_LOG", "info,kube=warn")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("operator starts");
    let pid = op.id();

    let tests: Api<FabricTest> = Api::all(cluster.client());
    let test: FabricTest = serde_json::from_value(json!({
        "apiVersion": "gpufabric.io/v1alpha1", "kind": "FabricTest",
        "metadata": {"name": "fleet"},
        "spec": {
            "nodeSelector": {"pool": "training"},
            "suite": {"ncclSweep": {"collectives": ["allReduce"]}},
            "agent": {"timeoutSeconds": 600, "env": [{"name": "FABRIC_BACKEND", "value": "sim"}]}
        }
    }))
    .expect("test");
    let created = Instant::now();
    tests
        .create(&PostParams::default(), &test)
        .await
        .expect("create test");

    let runs: Api<FabricTestRun> = Api::all(cluster.client());
    let pods: Api<Pod> = Api::namespaced(cluster.client(), NS);
    let lp = ListParams::default().labels(keys::LABEL_RUN);
    let (mut run_seen, mut all_pods, mut all_done, mut succeeded) = (None, None, None, None);
    let mut run_obj = None;
    let deadline = Instant::now() + Duration::from_secs(900);
    while Instant::now() < deadline {
        let list = runs.list(&ListParams::default()).await.expect("runs").items;
        if let Some(r) = list.first() {
            run_seen.get_or_insert(created.elapsed());
            if r.status
                .as_ref()
                .is_some_and(|s| s.phase == RunPhase::Succeeded)
            {
                succeeded = Some(created.elapsed());
                run_obj = Some(r.clone());
                break;
            }
        }
        let p = pods.list_metadata(&lp).await.expect("pods").items.len();
        if p >= nodes && all_pods.is_none() {
            all_pods = Some(created.elapsed());
        }
        if all_pods.is_some() && all_done.is_none() {
            let done = pods
                .list(&lp)
                .await
                .expect("pods")
                .items
                .iter()
                .filter(|p| {
                    matches!(
                        p.status.as_ref().and_then(|s| s.phase.as_deref()),
                        Some("Succeeded" | "Failed")
                    )
                })
                .count();
            if done >= nodes {
                all_done = Some(created.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // The test's status: the run folded into the history (and handed to quarantine).
    let mut folded = None;
    while Instant::now() < deadline && succeeded.is_some() {
        let t = tests.get("fleet").await.expect("test");
        if t.status
            .as_ref()
            .and_then(|s| s.last_run.as_ref())
            .is_some()
        {
            folded = Some(created.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let hwm = vm_hwm_kib(pid);
    let _ = op.kill();
    let _ = op.wait();
    let run = run_obj.expect("the run succeeded within 15 minutes");
    let status = run.status.clone().expect("status");
    let status_bytes = serde_json::to_vec(&status).expect("json").len();
    let object_bytes = serde_json::to_vec(&run).expect("json").len();
    assert_eq!(status.nodes.len(), nodes);
    assert_eq!(
        status.passed as usize + status.failed as usize,
        nodes,
        "{:?}",
        status.message
    );
    let secs = |d: Option<Duration>| d.map(|d| d.as_secs_f64()).unwrap_or(f64::NAN);
    // Server-side times (whole seconds): run start, all pods created (condition), the last
    // agent to finish (container finishedAt), run completion.
    let ts = |t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time| t.0.as_second();
    let start = status.start_time.as_ref().map(ts).unwrap_or_default();
    let pods_created = status
        .conditions
        .iter()
        .find(|c| c.type_ == "PodsCreated")
        .map(|c| ts(&c.last_transition_time) - start);
    let last_finished = pods
        .list(&lp)
        .await
        .expect("pods")
        .items
        .iter()
        .filter_map(|p| {
            gpufabric_tests::fixtures::container_state(Some(p))?
                .terminated
                .as_ref()?
                .finished_at
                .as_ref()
                .map(ts)
        })
        .max();
    let completion = status.completion_time.as_ref().map(ts);
    let report = json!({
        "nodes": nodes,
        "run_created_s": secs(run_seen),
        "all_pods_created_s": secs(all_pods),
        "all_pods_finished_s": secs(all_done),
        "run_succeeded_s": secs(succeeded),
        "server_pods_created_after_start_s": pods_created,
        "server_last_agent_finished_after_start_s": last_finished.map(|t| t - start),
        "server_run_completed_after_last_agent_s": completion.zip(last_finished).map(|(c, l)| c - l),
        "test_status_folded_s": secs(folded),
        "fold_into_test_after_run_succeeded_s": secs(folded) - secs(succeeded),
        "status_bytes": status_bytes,
        "object_bytes": object_bytes,
        "findings_in_status": status.findings.len(),
        "operator_peak_rss_kib": hwm,
        "run": run.name_any(),
        "duration": status.duration,
    });
    println!("SCALE {report}");
    if let Ok(out) = std::env::var("SCALE_OUT") {
        std::fs::write(out, report.to_string()).expect("write report");
    }
}
