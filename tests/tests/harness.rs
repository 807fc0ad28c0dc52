//! The test harness itself, against a real kube-apiserver: the control plane starts, the
//! CRDs' validation is what users get, the process-kubelet runs pods as a kubelet does,
//! and nothing is left running when a test fails or is killed.

use gpufabric_api::{FabricTest, keys};
use gpufabric_tests::cluster::{Cluster, DIR_PREFIX};
use gpufabric_tests::fixtures::node_ready;
use gpufabric_tests::fleet::{H100, H200, SimFleet};
use gpufabric_tests::kubelet::{Kubelet, KubeletOptions};
use gpufabric_tests::process::{pid_alive, processes_mentioning};
use gpufabric_tests::shared::TestEnv;
use gpufabric_tests::{wait, workspace_root};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use serde_json::json;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

const T: Duration = Duration::from_secs(90);
const NS: &str = "harness";

async fn start() -> Cluster {
    gpufabric_tests::init_tracing();
    let cluster = Cluster::start().await.expect("local control plane starts");
    eprintln!(
        "control plane up in {:.1}s at {}",
        cluster.startup_time().as_secs_f64(),
        cluster.server()
    );
    cluster
}

/// Two simulated nodes: `node-01` H100, `node-02` H200.
fn two_nodes() -> gpufabric_measure::fleet::Fleet {
    let mut fleet = SimFleet::uniform("node", 2, H100, 8);
    fleet.nodes[1].product = H200.to_string();
    fleet
}

/// A control plane of its own with [`two_nodes`], a kubelet, and the `harness` namespace.
async fn start_private_with_nodes() -> (Cluster, SimFleet, Kubelet) {
    let cluster = start().await;
    let fleet = SimFleet::write(two_nodes()).expect("fleet file");
    let kubelet = Kubelet::start(cluster.client(), &fleet, KubeletOptions::default())
        .await
        .expect("kubelet starts");
    cluster.create_namespace(NS).await.expect("namespace");
    (cluster, fleet, kubelet)
}

/// A test's namespace of the shared control plane, [`two_nodes`] (named with the test's
/// prefix) and a kubelet.
struct Nodes {
    env: TestEnv,
    fleet: SimFleet,
    kubelet: Kubelet,
    pods: Api<Pod>,
}

impl Nodes {
    async fn start(name: &str) -> Nodes {
        let env = TestEnv::new(name).await.expect("test environment");
        let (fleet, kubelet) = env
            .start_kubelet(two_nodes(), KubeletOptions::default())
            .await
            .expect("kubelet starts");
        let pods = Api::namespaced(env.client(), env.ns());
        Nodes {
            env,
            fleet,
            kubelet,
            pods,
        }
    }

    fn node(&self, base: &str) -> String {
        self.env.node(base)
    }

    async fn create(&self, pod: &Pod) {
        self.pods
            .create(&PostParams::default(), pod)
            .await
            .expect("pod created");
    }
}

fn shell_pod(name: &str, node: &str, script: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "main",
                "image": "busybox",
                "command": ["sh", "-c", script],
                "env": [
                    {"name": "LITERAL", "value": "lit"},
                    {"name": "EXPANDED", "value": "$(LITERAL)-x"},
                    {"name": keys::ENV_NODE_NAME, "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                ],
            }],
        },
    }))
    .expect("valid pod")
}

async fn create_pod(cluster: &Cluster, pod: &Pod) -> Api<Pod> {
    let pods: Api<Pod> = Api::namespaced(cluster.client(), NS);
    pods.create(&PostParams::default(), pod)
        .await
        .expect("pod created");
    pods
}

fn phase(p: Option<&Pod>) -> String {
    p.and_then(|p| p.status.as_ref()?.phase.clone())
        .unwrap_or_default()
}

async fn wait_phase(pods: &Api<Pod>, name: &str, want: &'static [&'static str]) -> Pod {
    wait::for_object(pods, name, T, |p: Option<&Pod>| {
        want.contains(&phase(p).as_str())
    })
    .await
    .expect("pod reaches the phase")
    .expect("pod exists")
}

fn terminated(pod: &Pod) -> k8s_openapi::api::core::v1::ContainerStateTerminated {
    gpufabric_tests::fixtures::container_state(Some(pod))
        .and_then(|s| s.terminated.clone())
        .expect("container terminated state")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_is_up_reports_v1_33_and_crds_are_established() {
    let env = TestEnv::new("api-up").await.expect("test environment");
    let cluster = env.cluster();
    eprintln!(
        "shared control plane up in {:.1}s at {}",
        cluster.startup_time().as_secs_f64(),
        cluster.server()
    );
    let version = env
        .client()
        .apiserver_version()
        .await
        .expect("/version answers");
    assert!(
        version.git_version.starts_with("v1.33."),
        "gitVersion {}",
        version.git_version
    );
    assert_eq!(
        (version.major.as_str(), version.minor.as_str()),
        ("1", "33")
    );
    let crds: Api<CustomResourceDefinition> = Api::all(env.client());
    for name in ["fabrictests.gpufabric.io", "fabrictestruns.gpufabric.io"] {
        let crd = crds.get(name).await.expect("CRD installed");
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        assert!(established, "{name} is Established");
    }
    // kubectl from the same build talks to it with the admin kubeconfig.
    let out = cluster
        .kubectl()
        .args(["get", "fabrictests", "-A", "-o", "name"])
        .output()
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl get fabrictests: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Each invalid FabricTest and the message the API server answers with.
fn invalid_cases() -> Vec<(&'static str, serde_json::Value, String)> {
    let ge = |field: &str, v: i64, min: i64| {
        format!(
            "{field}: Invalid value: {v}: {field} in body should be greater than or equal to {min}"
        )
    };
    vec![
        (
            "malformed cron",
            json!({"schedule": "not a cron"}),
            format!(
                "spec.schedule: Invalid value: \"string\": {}",
                gpufabric_api::test::CRON_MESSAGE
            ),
        ),
        (
            "cron minute out of range",
            json!({"schedule": "61 * * * *"}),
            format!(
                "spec.schedule: Invalid value: \"string\": {}",
                gpufabric_api::test::CRON_MESSAGE
            ),
        ),
        (
            "minBytes > maxBytes",
            json!({"suite": {"ncclSweep": {"minBytes": 1048576, "maxBytes": 1024}}}),
            "spec.suite.ncclSweep: Invalid value: \"object\": ncclSweep.minBytes must not be larger than ncclSweep.maxBytes".to_string(),
        ),
        (
            "unknown collective",
            json!({"suite": {"ncclSweep": {"collectives": ["allReduce", "allScatter"]}}}),
            // A schema error skips the CEL rules of the object, and the server says so.
            "[spec.suite.ncclSweep.collectives[1]: Unsupported value: \"allScatter\": supported values: \"allReduce\", \"allGather\", \"reduceScatter\", \"broadcast\", \"reduce\", \"allToAll\", \"sendRecv\", <nil>: Invalid value: \"null\": some validation rules were not checked because the object was invalid; correct the existing errors to complete validation]".to_string(),
        ),
        (
            "maxQuarantined 150%",
            json!({"quarantine": {"maxQuarantined": "150%"}}),
            "spec.quarantine: Invalid value: \"object\": quarantine.maxQuarantined must be a count >= 0 or a percent from 0% to 100%".to_string(),
        ),
        (
            "negative count",
            json!({"suite": {"ncclSweep": {"iters": -1}}}),
            ge("spec.suite.ncclSweep.iters", -1, 1),
        ),
        (
            "zero iters",
            json!({"suite": {"ncclSweep": {"iters": 0}}}),
            ge("spec.suite.ncclSweep.iters", 0, 1),
        ),
        (
            "zero layers",
            json!({"suite": {"ddpProbe": {"layers": 0}}}),
            ge("spec.suite.ddpProbe.layers", 0, 1),
        ),
        (
            "empty gpuCounts",
            json!({"suite": {"ddpProbe": {"gpuCounts": []}}}),
            "spec.suite.ddpProbe.gpuCounts: Invalid value: 0: spec.suite.ddpProbe.gpuCounts in body should have at least 1 items".to_string(),
        ),
        (
            "stepFactor 1",
            json!({"suite": {"ncclSweep": {"stepFactor": 1}}}),
            ge("spec.suite.ncclSweep.stepFactor", 1, 2),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_rejects_each_invalid_fabric_test_with_its_message() {
    let env = TestEnv::new("invalid").await.expect("test environment");
    let api: Api<DynamicObject> = Api::all_with(
        env.client(),
        &kube::api::ApiResource::erase::<FabricTest>(&()),
    );
    let mut wrong = Vec::new();
    for (i, (case, spec, message)) in invalid_cases().into_iter().enumerate() {
        let name = format!("invalid-{i}");
        let obj = json!({
            "apiVersion": "gpufabric.io/v1alpha1",
            "kind": "FabricTest",
            "metadata": {"name": name},
            "spec": spec,
        });
        let obj: DynamicObject = serde_json::from_value(obj).expect("object");
        match api.create(&PostParams::default(), &obj).await {
            Ok(_) => wrong.push(format!("{case}: accepted")),
            Err(kube::Error::Api(status)) => {
                let expected = format!("FabricTest.gpufabric.io \"{name}\" is invalid: {message}");
                if status.code != 422 || status.message != expected {
                    wrong.push(format!(
                        "{case}: got {} {:?}\n   expected {expected:?}",
                        status.code, status.message
                    ));
                }
            }
            Err(e) => wrong.push(format!("{case}: {e}")),
        }
    }
    assert!(wrong.is_empty(), "\n{}", wrong.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_accepts_the_examples_and_fills_in_defaults() {
    let env = TestEnv::new("examples").await.expect("test environment");
    let api: Api<FabricTest> = Api::all(env.client());
    for file in ["minimal.yaml", "nightly.yaml", "full.yaml"] {
        let path = workspace_root().join("deploy/examples").join(file);
        let text = std::fs::read_to_string(&path).expect("example readable");
        let ft: FabricTest = serde_yaml::from_str(&text).expect("example parses");
        let name = ft.metadata.name.clone().expect("example has a name");
        // Send what the file says, not what serde fills in, so the server does the defaulting.
        let raw: DynamicObject = serde_yaml::from_str(&text).expect("yaml");
        assert_eq!(
            raw.metadata.namespace, None,
            "{file}: FabricTest is cluster-scoped"
        );
        let dynamic: Api<DynamicObject> = Api::all_with(
            env.client(),
            &kube::api::ApiResource::erase::<FabricTest>(&()),
        );
        dynamic
            .create(&PostParams::default(), &raw)
            .await
            .unwrap_or_else(|e| panic!("{file} is accepted: {e}"));
        let stored = api.get(&name).await.expect("stored");
        if file == "minimal.yaml" {
            // Everything the example leaves out comes back with the server's defaults.
            let s = &stored.spec;
            assert_eq!(s.suite.nccl_sweep.iters, 20);
            assert_eq!(s.suite.nccl_sweep.step_factor, 2);
            assert_eq!(s.suite.nccl_sweep.max_bytes, 1 << 30);
            assert_eq!(s.agent.timeout_seconds, 900);
            assert_eq!(s.successful_runs_history_limit, 3);
            assert_eq!(s.failed_runs_history_limit, 1);
            let stored_raw = dynamic.get(&name).await.expect("stored");
            assert!(
                stored_raw.data["spec"]["suite"]["ncclSweep"]["iters"] == json!(20),
                "the server wrote the default into the object: {}",
                stored_raw.data["spec"]
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_registers_ready_gpu_nodes_with_leases() {
    let t = Nodes::start("registers").await;
    let (n1, n2) = (t.node("node-01"), t.node("node-02"));
    let nodes: Api<Node> = Api::all(t.env.client());
    let node = nodes.get(&n2).await.expect("node registered");
    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get(keys::LABEL_GPU_PRODUCT).map(String::as_str),
        Some(H200)
    );
    assert_eq!(
        labels.get(keys::LABEL_GPU_COUNT).map(String::as_str),
        Some("8")
    );
    assert_eq!(
        labels.get("kubernetes.io/hostname").map(String::as_str),
        Some(n2.as_str())
    );
    assert_eq!(labels.get("pool").map(String::as_str), Some("training"));
    let status = node.status.clone().expect("node status");
    for res in [status.capacity.clone(), status.allocatable.clone()] {
        let res = res.expect("resources");
        assert_eq!(res.get(keys::RESOURCE_GPU).map(|q| q.0.as_str()), Some("8"));
        assert!(res.contains_key("cpu") && res.contains_key("memory") && res.contains_key("pods"));
    }
    let ready = node_ready;
    assert_eq!(ready(Some(&node)).as_deref(), Some("True"));
    let leases: Api<Lease> = Api::namespaced(t.env.client(), "kube-node-lease");
    let lease = leases.get(&n2).await.expect("lease exists");
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some(n2.as_str())
    );

    let kubelet = &t.kubelet;
    kubelet
        .set_node_ready(&n1, false)
        .await
        .expect("set NotReady");
    wait::for_object(&nodes, &n1, T, |n| ready(n).as_deref() == Some("False"))
        .await
        .expect("node-01 NotReady");
    kubelet.set_node_ready(&n1, true).await.expect("set Ready");
    wait::for_object(&nodes, &n1, T, |n| ready(n).as_deref() == Some("True"))
        .await
        .expect("node-01 Ready again");

    kubelet.remove_node(&n2).await.expect("remove");
    wait::for_deletion(&nodes, &n2, T)
        .await
        .expect("node-02 gone");
    assert_eq!(kubelet.node_names(), vec![n1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_runs_its_command_and_succeeds_with_its_termination_message() {
    let t = Nodes::start("pod-runs").await;
    let script = r#"printf '%s|%s|%s|%s|%s|%s' "$FABRIC_NODE_NAME" "$POD_NAME" "$POD_NAMESPACE" "$POD_IP" "$EXPANDED" "$FABRIC_SIM_FLEET" > "$FABRIC_TERMINATION_LOG""#;
    t.create(&shell_pod("ok", &t.node("node-01"), script)).await;
    let pod = wait_phase(&t.pods, "ok", &["Succeeded", "Failed"]).await;
    assert_eq!(phase(Some(&pod)), "Succeeded");
    let ip = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .expect("pod IP");
    assert!(ip.starts_with("127."), "pod IP {ip} is a loopback address");
    let end = terminated(&pod);
    assert_eq!(end.exit_code, 0);
    assert_eq!(end.reason.as_deref(), Some("Completed"));
    let expected = format!(
        "{}|ok|{}|{ip}|lit-x|{}",
        t.node("node-01"),
        t.env.ns(),
        t.fleet.path().display()
    );
    assert_eq!(end.message.as_deref(), Some(expected.as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_command_ends_failed_with_its_exit_code_and_pod_ips_differ() {
    let t = Nodes::start("failing").await;
    let n2 = t.node("node-02");
    let script = "echo broken > \"$FABRIC_TERMINATION_LOG\"; exit 3";
    t.create(&shell_pod("bad", &n2, script)).await;
    t.create(&shell_pod("good", &n2, "true")).await;
    let pods = &t.pods;
    let pod = wait_phase(pods, "bad", &["Succeeded", "Failed"]).await;
    assert_eq!(phase(Some(&pod)), "Failed");
    let end = terminated(&pod);
    assert_eq!(end.exit_code, 3);
    assert_eq!(end.reason.as_deref(), Some("Error"));
    assert_eq!(end.message.as_deref(), Some("broken\n"));
    let good = wait_phase(pods, "good", &["Succeeded"]).await;
    let ip = |p: &Pod| p.status.as_ref().and_then(|s| s.pod_ip.clone());
    assert_ne!(ip(&pod), ip(&good), "each pod gets its own IP");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_deadline_ends_a_sleeping_pod_with_deadline_exceeded() {
    let t = Nodes::start("deadline").await;
    let mut pod = shell_pod("slow", &t.node("node-01"), "sleep 300");
    pod.spec.as_mut().expect("spec").active_deadline_seconds = Some(2);
    t.create(&pod).await;
    wait_phase(&t.pods, "slow", &["Running"]).await;
    let pid = t.kubelet.pod_pid(t.env.ns(), "slow").expect("process runs");
    let pod = wait_phase(&t.pods, "slow", &["Succeeded", "Failed"]).await;
    let status = pod.status.clone().expect("status");
    assert_eq!(status.phase.as_deref(), Some("Failed"));
    assert_eq!(status.reason.as_deref(), Some("DeadlineExceeded"));
    assert!(!pid_alive(pid), "the sleeping process {pid} was killed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_pod_kills_its_process_and_the_pod_disappears() {
    let t = Nodes::start("delete").await;
    t.create(&shell_pod("victim", &t.node("node-01"), "sleep 300"))
        .await;
    let pods = &t.pods;
    wait_phase(pods, "victim", &["Running"]).await;
    let pid = t
        .kubelet
        .pod_pid(t.env.ns(), "victim")
        .expect("process runs");
    assert!(pid_alive(pid));
    // A graceful delete (the default 30 s grace period): the kubelet must confirm it.
    pods.delete("victim", &DeleteParams::default())
        .await
        .expect("delete");
    wait::for_deletion(pods, "victim", T)
        .await
        .expect("pod object disappears");
    assert!(!pid_alive(pid), "process {pid} is gone");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_collector_deletes_owned_pods_through_the_kubelet() {
    let t = Nodes::start("gc").await;
    let owners: Api<ConfigMap> = Api::namespaced(t.env.client(), t.env.ns());
    let owner = owners
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "owner"}})).expect("cm"),
        )
        .await
        .expect("owner created");
    let mut pod = shell_pod("owned", &t.node("node-02"), "sleep 300");
    pod.metadata.owner_references = Some(vec![
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "ConfigMap", "name": "owner",
            "uid": owner.metadata.uid.clone().expect("uid"),
        }))
        .expect("owner reference"),
    ]);
    t.create(&pod).await;
    let pods = &t.pods;
    wait_phase(pods, "owned", &["Running"]).await;
    let pid = t
        .kubelet
        .pod_pid(t.env.ns(), "owned")
        .expect("process runs");
    owners
        .delete("owner", &DeleteParams::background())
        .await
        .expect("owner deleted");
    wait::for_deletion(pods, "owned", T)
        .await
        .expect("the controller-manager's garbage collector deletes the pod");
    assert!(!pid_alive(pid), "process {pid} is gone");
}

/// Which of the two child modes below a child process of this test binary runs.
const CHILD_ENV: &str = "GPUFABRIC_HARNESS_CHILD";

/// Not a test of its own: the child process of the two tests below. It starts a cluster,
/// a kubelet and a sleeping pod, prints the cluster dir and the pod's pid, then panics
/// (`panic`) or waits to be killed (`wait`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "run as a child process by the tests below"]
async fn child_starts_a_cluster_then_panics_or_waits() {
    let mode = std::env::var(CHILD_ENV).expect("run by the parent test");
    let (cluster, fleet, kubelet) = start_private_with_nodes().await;
    let pods = create_pod(&cluster, &shell_pod("sleeper", "node-01", "sleep 300")).await;
    wait_phase(&pods, "sleeper", &["Running"]).await;
    let pid = kubelet.pod_pid(NS, "sleeper").expect("pod process");
    // Temp dirs a killed process cannot remove: the parent does.
    let fleet_dir = fleet
        .path()
        .parent()
        .expect("fleet dir")
        .display()
        .to_string();
    println!(
        "CHILD dir={} pid={pid} leftovers={fleet_dir}:{}",
        cluster.dir().display(),
        kubelet.root_dir().display()
    );
    if mode == "panic" {
        panic!("panicking on purpose with a cluster running");
    }
    tokio::time::sleep(Duration::from_secs(600)).await;
}

thread_local! {
    /// Temp dirs of a killed child (its fleet and kubelet dirs), removed by the parent.
    static LEFTOVERS: std::cell::RefCell<Vec<std::path::PathBuf>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs the child test in `mode`; returns the child, its cluster dir and the pod's pid
/// once the child has printed them.
fn spawn_child(mode: &str) -> (std::process::Child, String, u32) {
    let exe = std::env::current_exe().expect("test binary");
    let mut child = Command::new(exe)
        .args([
            "--exact",
            "child_starts_a_cluster_then_panics_or_waits",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, mode)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("child starts");
    let stdout = child.stdout.take().expect("stdout");
    let mut found = None;
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("child output");
        if let Some(rest) = line.strip_prefix("CHILD dir=") {
            let (dir, rest) = rest.split_once(" pid=").expect("dir and pid");
            let (pid, leftovers) = rest.split_once(" leftovers=").expect("pid and leftovers");
            LEFTOVERS.with(|l| {
                l.borrow_mut()
                    .extend(leftovers.split(':').map(std::path::PathBuf::from))
            });
            found = Some((dir.to_string(), pid.parse().expect("pid")));
            break;
        }
    }
    let (dir, pid) = found.expect("child printed its cluster dir");
    assert!(dir.contains(DIR_PREFIX));
    (child, dir, pid)
}

fn assert_nothing_left(dir: &str, pod_pid: u32) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let left = processes_mentioning(dir);
        if left.is_empty() && !pid_alive(pod_pid) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still running: {left:?}, pod process alive: {}",
            pid_alive(pod_pid)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_panicking_test_leaves_no_processes_behind() {
    let (mut child, dir, pid) = spawn_child("panic");
    let status = child.wait().expect("child ends");
    assert!(!status.success(), "the child test panicked");
    assert_nothing_left(&dir, pid);
    assert!(
        !std::path::Path::new(&dir).exists(),
        "the cluster dir {dir} was removed"
    );
}

#[test]
fn a_killed_test_process_leaves_no_processes_behind() {
    let (mut child, dir, pid) = spawn_child("wait");
    assert!(!processes_mentioning(&dir).is_empty(), "the cluster runs");
    // SIGKILL: no Drop runs; PR_SET_PDEATHSIG takes the processes down.
    child.kill().expect("kill the child");
    let _ = child.wait();
    assert_nothing_left(&dir, pid);
    let _ = std::fs::remove_dir_all(&dir);
    for d in LEFTOVERS.with(|l| l.take()) {
        let _ = std::fs::remove_dir_all(d);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_binaries_fail_with_a_message_to_run_build_sh() {
    let empty = tempfile::tempdir().expect("temp dir");
    let err = Cluster::start_with(gpufabric_tests::cluster::ClusterOptions {
        bin_dir: Some(empty.path().to_path_buf()),
        ..Default::default()
    })
    .await
    .expect_err("no binaries, no cluster");
    let msg = err.to_string();
    assert!(msg.contains("tests/cluster/build.sh"), "{msg}");
    assert!(msg.contains("kube-apiserver"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_program_ends_failed_with_start_error() {
    let t = Nodes::start("start-error").await;
    let mut pod = shell_pod("nothing", &t.node("node-01"), "");
    pod.spec.as_mut().expect("spec").containers[0].command =
        Some(vec!["/opt/no-such-program-here".into()]);
    t.create(&pod).await;
    let pod = wait_phase(&t.pods, "nothing", &["Succeeded", "Failed"]).await;
    assert_eq!(phase(Some(&pod)), "Failed");
    let t = terminated(&pod);
    assert_eq!(
        (t.exit_code, t.reason.as_deref()),
        (128, Some("StartError"))
    );
    assert!(
        t.message
            .as_deref()
            .is_some_and(|m| m.contains("no-such-program-here")),
        "{:?}",
        t.message
    );
}

/// The controller-manager's node lifecycle controller marks a node whose kubelet stops
/// reporting Unknown and taints it once its grace period has passed; the process-kubelet's
/// Lease heartbeats must keep every node Ready and untainted. The grace period is cut to
/// 8 s (heartbeats every 2 s) so the test takes seconds, not minutes; stopping the kubelet
/// at the end shows the controller does act on a silent node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_stay_ready_and_untainted_past_the_node_monitor_grace_period() {
    gpufabric_tests::init_tracing();
    let cluster = Cluster::start_with(gpufabric_tests::cluster::ClusterOptions {
        controller_manager_args: vec![
            "--node-monitor-grace-period=8s".into(),
            "--node-monitor-period=1s".into(),
        ],
        ..Default::default()
    })
    .await
    .expect("local control plane starts");
    let fleet = SimFleet::write(SimFleet::uniform("node", 2, H100, 8)).expect("fleet file");
    let mut kubelet = Kubelet::start(
        cluster.client(),
        &fleet,
        KubeletOptions {
            heartbeat: Duration::from_secs(2),
            status_interval: Duration::from_secs(4),
            ..Default::default()
        },
    )
    .await
    .expect("kubelet starts");
    let nodes: Api<Node> = Api::all(cluster.client());
    let ready = node_ready;
    // The not-ready taint that node registration gets must go once the node is Ready.
    let untainted = |n: Option<&Node>| {
        n.and_then(|n| n.spec.as_ref())
            .is_some_and(|s| s.taints.as_ref().is_none_or(|t| t.is_empty()))
    };
    for name in ["node-01", "node-02"] {
        wait::for_object(&nodes, name, T, untainted)
            .await
            .expect("registration taint removed");
    }
    // Three grace periods.
    tokio::time::sleep(Duration::from_secs(24)).await;
    for node in nodes.list(&Default::default()).await.expect("nodes").items {
        let name = node.metadata.name.clone().unwrap_or_default();
        assert_eq!(ready(Some(&node)).as_deref(), Some("True"), "{name} Ready");
        assert!(
            untainted(Some(&node)),
            "{name} untainted: {:?}",
            node.spec.and_then(|s| s.taints)
        );
    }
    // Without heartbeats the controller takes the node's readiness away.
    kubelet.shutdown();
    wait::for_object(&nodes, "node-01", T, |n| {
        ready(n).as_deref() == Some("Unknown")
    })
    .await
    .expect("a silent node becomes Unknown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fabric_kubelet_binary_registers_the_fleet_and_runs_pods() {
    let env = TestEnv::new("binary").await.expect("test environment");
    let fleet = SimFleet::write(env.fleet(SimFleet::uniform("bin", 3, H100, 4))).expect("fleet");
    let (b2, b3) = (env.node("bin-02"), env.node("bin-03"));
    let root = tempfile::tempdir().expect("pod dirs");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fabric-kubelet"));
    cmd.arg("--root-dir")
        .arg(root.path())
        .arg("--kubeconfig")
        .arg(env.cluster().kubeconfig_path())
        .arg("--fleet")
        .arg(fleet.path())
        .args(["--stalled-node", &b3])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    gpufabric_tests::process::harden(&mut cmd);
    let mut kubelet = cmd.spawn().expect("fabric-kubelet starts");
    let nodes: Api<Node> = Api::all(env.client());
    wait::for_object(&nodes, &b3, T, |n: Option<&Node>| n.is_some())
        .await
        .expect("last node registered");
    let pods: Api<Pod> = Api::namespaced(env.client(), env.ns());
    let script = "echo -n done > \"$FABRIC_TERMINATION_LOG\"";
    for pod in [
        shell_pod("on-stalled", &b3, "exit 0"),
        shell_pod("via-binary", &b2, script),
    ] {
        pods.create(&PostParams::default(), &pod)
            .await
            .expect("pod created");
    }
    let pod = wait_phase(&pods, "via-binary", &["Succeeded", "Failed"]).await;
    let stalled = pods
        .get("on-stalled")
        .await
        .expect("pod on the stalled node");
    let _ = kubelet.kill();
    let _ = kubelet.wait();
    assert_eq!(phase(Some(&pod)), "Succeeded");
    assert_eq!(terminated(&pod).message.as_deref(), Some("done"));
    let stalled = stalled.status.unwrap_or_default();
    assert_eq!(
        stalled.phase.as_deref(),
        Some("Pending"),
        "--stalled-node starts nothing"
    );
    assert!(stalled.container_statuses.is_none(), "{stalled:?}");
}
