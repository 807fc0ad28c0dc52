//! `helm uninstall` leaves no cordon, label or taint the operator made, and touches none it
//! did not make: the chart's pre-delete hook, `fabric-operator uninstall`, run here as the
//! hook runs it (the Job's arguments and its own ServiceAccount's token, from `helm get
//! hooks`; no kubelet here runs a Job), first while the operator runs, then after it died.
//!
//! Needs helm (`tests/tools/build.sh`, or GPUFABRIC_TOOLS_BIN) and the binaries:
//! `cargo build -p gpufabric-operator -p gpufabric-agent`.

use gpufabric_api::FabricTest;
use gpufabric_api::keys;
use gpufabric_measure::fleet::{Fault, Fleet};
use gpufabric_tests::cluster::{Cluster, ClusterOptions};
use gpufabric_tests::fleet::{H100, SimFleet};
use gpufabric_tests::kubelet::{Kubelet, KubeletOptions, default_agent_bin_dir};
use gpufabric_tests::operator::{OperatorProcess, sim_agent};
use gpufabric_tests::tools::{self, can, run_ok};
use gpufabric_tests::{wait, workspace_root};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde::Deserialize;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const NS: &str = "gpufabric-system";
const RELEASE: &str = "fabric";
/// `<release>-operator`: the operator's ServiceAccount, Deployment and Lease.
const NAME: &str = "fabric-operator";
/// The hook's ServiceAccount, roles and Job.
const HOOK: &str = "fabric-operator-uninstall";
/// The installation acts on the FabricTests with this label only.
const SELECTOR: &str = "team=infra";

/// `helm --kubeconfig <cluster> ARGS`; panics with its output when it fails.
fn helm(cluster: &Cluster, args: &[&str]) -> String {
    let out = run_ok(tools::helm(Some(cluster)).args(args));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The hook's objects as the release holds them (`helm get hooks`), by kind.
fn hook_objects(cluster: &Cluster) -> Vec<Value> {
    let text = helm(cluster, &["get", "hooks", RELEASE, "-n", NS]);
    serde_yaml::Deserializer::from_str(&text)
        .filter_map(|doc| Value::deserialize(doc).ok())
        .filter(|v: &Value| v.is_object())
        .collect()
}

fn of_kind(objects: &[Value], kind: &str) -> Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind)
        .cloned()
        .unwrap_or_else(|| panic!("the chart's hooks have no {kind}: {objects:?}"))
}

/// Creates the hook's ServiceAccount and roles, as helm does before it starts the Job.
async fn create_hook_rbac(client: &Client, objects: &[Value]) {
    let pp = PostParams::default();
    let sa: ServiceAccount =
        serde_json::from_value(of_kind(objects, "ServiceAccount")).expect("SA");
    Api::<ServiceAccount>::namespaced(client.clone(), NS)
        .create(&pp, &sa)
        .await
        .expect("hook ServiceAccount");
    let cr: ClusterRole = serde_json::from_value(of_kind(objects, "ClusterRole")).expect("CR");
    Api::<ClusterRole>::all(client.clone())
        .create(&pp, &cr)
        .await
        .expect("hook ClusterRole");
    let crb: ClusterRoleBinding =
        serde_json::from_value(of_kind(objects, "ClusterRoleBinding")).expect("CRB");
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&pp, &crb)
        .await
        .expect("hook ClusterRoleBinding");
    // The Lease's Role in the release namespace, the Events' in "default".
    for o in objects.iter().filter(|o| o["kind"] == "Role") {
        let role: Role = serde_json::from_value(o.clone()).expect("Role");
        Api::<Role>::namespaced(client.clone(), &role.namespace().unwrap_or_default())
            .create(&pp, &role)
            .await
            .expect("hook Role");
    }
    for o in objects.iter().filter(|o| o["kind"] == "RoleBinding") {
        let rb: RoleBinding = serde_json::from_value(o.clone()).expect("RB");
        Api::<RoleBinding>::namespaced(client.clone(), &rb.namespace().unwrap_or_default())
            .create(&pp, &rb)
            .await
            .expect("hook RoleBinding");
    }
}

/// A kubeconfig with a token of ServiceAccount `sa` in the release namespace.
async fn token_kubeconfig(cluster: &Cluster, sa: &str, path: PathBuf) -> PathBuf {
    tools::service_account_kubeconfig(cluster, NS, sa, &path).await;
    path
}

async fn client_of(kubeconfig: &Path) -> Client {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("config");
    Client::try_from(config).expect("client")
}

/// The hook may delete FabricTests, release nodes and read the Lease; nothing more.
async fn check_hook_privileges(hook: &Client) {
    for (verb, res, ns, name) in [
        ("list", "gpufabric.io/fabrictests", None, None),
        ("delete", "gpufabric.io/fabrictests", None, None),
        ("patch", "nodes", None, None),
        ("get", "coordination.k8s.io/leases", Some(NS), Some(NAME)),
    ] {
        assert!(
            can(hook, verb, res, ns, name).await,
            "{verb} {res} is granted"
        );
    }
    for (verb, res, ns, name) in [
        ("delete", "nodes", None, None),
        ("create", "gpufabric.io/fabrictests", None, None),
        ("create", "pods", Some(NS), None),
        ("list", "secrets", Some(NS), None),
        ("update", "coordination.k8s.io/leases", Some(NS), Some(NAME)),
        (
            "get",
            "coordination.k8s.io/leases",
            Some(NS),
            Some("someone-elses"),
        ),
    ] {
        assert!(
            !can(hook, verb, res, ns, name).await,
            "{verb} {res} {name:?} is refused"
        );
    }
}

/// The Job's pod is admitted where Pod Security "restricted" is enforced.
async fn check_pod_security(cluster: &Cluster, job: &Job) {
    let ns = "restricted";
    let obj = Namespace {
        metadata: ObjectMeta {
            name: Some(ns.into()),
            labels: Some(
                [(
                    "pod-security.kubernetes.io/enforce".to_string(),
                    "restricted".to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(cluster.client())
        .create(&PostParams::default(), &obj)
        .await
        .expect("namespace");
    cluster
        .create_namespace(ns)
        .await
        .expect("default ServiceAccount");
    let template = job.spec.as_ref().expect("job spec").template.clone();
    let mut pod = Pod {
        metadata: ObjectMeta {
            name: Some("uninstall".into()),
            ..Default::default()
        },
        spec: template.spec,
        ..Default::default()
    };
    if let Some(spec) = pod.spec.as_mut() {
        spec.service_account_name = None;
    }
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    if let Err(e) = Api::<Pod>::namespaced(cluster.client(), ns)
        .create(&dry, &pod)
        .await
    {
        panic!("Pod Security restricted refused the uninstall hook's pod: {e}");
    }
}

/// Runs `fabric-operator` with the hook Job's arguments as the hook's ServiceAccount: its
/// exit status, everything it printed, and how long it took.
async fn run_hook(args: &[String], kubeconfig: &Path) -> (bool, String, Duration) {
    let bin = default_agent_bin_dir().join("fabric-operator");
    assert!(
        bin.is_file(),
        "{} is missing: cargo build -p gpufabric-operator",
        bin.display()
    );
    let start = Instant::now();
    let out = tokio::process::Command::new(bin)
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env("RUST_LOG", "info")
        .kill_on_drop(true)
        .output()
        .await
        .expect("fabric-operator uninstall runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("--- fabric-operator {} ---\n{text}", args.join(" "));
    (out.status.success(), text, start.elapsed())
}

fn fleet() -> Fleet {
    let mut f = SimFleet::uniform("gpu", 4, H100, 8);
    f.nodes[1].faults.push(Fault::Straggler {
        gpu: 1,
        factor: 1.5,
    });
    f
}

fn fabric_test(name: &str, labels: Value, mode: &str) -> FabricTest {
    serde_json::from_value(json!({
        "apiVersion": "gpufabric.io/v1alpha1",
        "kind": "FabricTest",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeSelector": {"pool": "training"},
            "quarantine": {"mode": mode, "maxQuarantined": 1, "confirmRetest": false},
            "agent": sim_agent(60)
        }
    }))
    .expect("FabricTest")
}

/// Creates `name` (labelled for this installation) and waits until it holds gpu-02.
async fn quarantine_gpu_02(client: &Client, name: &str, mode: &str, operator: &OperatorProcess) {
    let tests: Api<FabricTest> = Api::all(client.clone());
    tests
        .create(
            &PostParams::default(),
            &fabric_test(name, json!({"team": "infra"}), mode),
        )
        .await
        .expect("FabricTest created");
    let r = wait::for_object(&tests, name, Duration::from_secs(180), |t| {
        t.and_then(|t| t.status.as_ref())
            .is_some_and(|s| s.quarantined_nodes == ["gpu-02"])
    })
    .await;
    if let Err(e) = r {
        panic!(
            "{name} did not quarantine gpu-02: {e}\n{}",
            operator.log_tail(80)
        );
    }
}

fn unschedulable(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
}

fn has_our_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == keys::TAINT_QUARANTINED))
}

/// gpu-02 carries nothing of the operator's; gpu-03 is still cordoned by someone else.
async fn check_nodes(client: &Client, after: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    let released = nodes.get("gpu-02").await.expect("gpu-02");
    assert!(!unschedulable(&released), "{after}: gpu-02 is uncordoned");
    assert!(!has_our_taint(&released), "{after}: gpu-02 is untainted");
    assert!(
        !released
            .annotations()
            .contains_key(keys::ANNOTATION_QUARANTINE),
        "{after}: gpu-02 has no quarantine record"
    );
    assert!(
        !released.labels().contains_key(keys::LABEL_QUARANTINED),
        "{after}: gpu-02 has no quarantine label"
    );
    let theirs = nodes.get("gpu-03").await.expect("gpu-03");
    assert!(
        unschedulable(&theirs),
        "{after}: gpu-03 stays cordoned by its owner"
    );
}

async fn assert_gone(tests: &Api<FabricTest>, name: &str) {
    assert!(
        tests.get_opt(name).await.expect("get FabricTest").is_none(),
        "FabricTest {name} is gone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uninstall_releases_what_the_operator_made_and_leaves_others_cordons() {
    gpufabric_tests::init_tracing();
    let cluster = Cluster::start_with(ClusterOptions {
        install_crds: false,
        ..Default::default()
    })
    .await
    .expect("local control plane starts");
    cluster.create_namespace(NS).await.expect("namespace");
    cluster
        .enforce_pod_security(NS, "restricted")
        .await
        .expect("Pod Security");
    let selector = format!("testSelector={SELECTOR}");
    helm(
        &cluster,
        &[
            "install",
            RELEASE,
            workspace_root()
                .join("charts/gpufabric")
                .to_str()
                .expect("path"),
            "--namespace",
            NS,
            "--set",
            "image.tag=test",
            "--set",
            "replicas=1",
            // No pod serves the webhook here: let FabricTests through unchecked.
            "--set",
            "webhook.failurePolicy=Ignore",
            "--set",
            &selector,
        ],
    );
    let admin = cluster.client();
    let dir = tempfile::tempdir().expect("temp dir");

    // The hook as the release holds it: not made at install, only at uninstall.
    let hooks = hook_objects(&cluster);
    let job: Job = serde_json::from_value(of_kind(&hooks, "Job")).expect("Job");
    assert_eq!(job.name_any(), HOOK);
    assert!(
        Api::<ServiceAccount>::namespaced(admin.clone(), NS)
            .get_opt(HOOK)
            .await
            .expect("get")
            .is_none(),
        "the hook's ServiceAccount exists only while the hook runs"
    );
    for o in &hooks {
        assert_eq!(
            o["metadata"]["annotations"]["helm.sh/hook"], "pre-delete",
            "{o}"
        );
    }
    check_pod_security(&cluster, &job).await;
    let pod = job
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .expect("pod spec");
    let hook_args = pod.containers[0].args.clone().unwrap_or_default();
    assert_eq!(hook_args[0], "uninstall");
    assert!(
        hook_args.contains(&format!("--selector={SELECTOR}")),
        "{hook_args:?}"
    );
    create_hook_rbac(&admin, &hooks).await;
    let hook_kubeconfig =
        token_kubeconfig(&cluster, HOOK, dir.path().join("hook.kubeconfig")).await;
    check_hook_privileges(&client_of(&hook_kubeconfig).await).await;

    // The fleet, and the operator with the Deployment's arguments as the chart's SA.
    let fleet = SimFleet::write_to(fleet(), dir.path().join("fleet.yaml")).expect("fleet file");
    let opts = KubeletOptions {
        root_dir: Some(dir.path().join("kubelet")),
        ..Default::default()
    };
    let _kubelet = Kubelet::start(admin.clone(), &fleet, opts)
        .await
        .expect("kubelet starts");
    let deployment = Api::<Deployment>::namespaced(admin.clone(), NS)
        .get(NAME)
        .await
        .expect("Deployment");
    let chart_args: Vec<String> = deployment
        .spec
        .and_then(|s| s.template.spec)
        .map(|p| p.containers[0].args.clone().unwrap_or_default())
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a != "run" && !a.starts_with("--admin-addr") && !a.starts_with("--webhook-"))
        .collect();
    let args: Vec<&str> = chart_args.iter().map(String::as_str).collect();
    let operator_kubeconfig =
        token_kubeconfig(&cluster, NAME, dir.path().join("op.kubeconfig")).await;
    let mut operator = OperatorProcess::start_as(
        operator_kubeconfig,
        dir.path().join("operator.log"),
        &args,
        &[("POD_NAME", "fabric-operator-0"), ("POD_NAMESPACE", NS)],
    );

    // Someone else cordons gpu-03; another installation's FabricTest is not this one's.
    let nodes: Api<Node> = Api::all(admin.clone());
    nodes
        .patch(
            "gpu-03",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .expect("gpu-03 cordoned");
    let tests: Api<FabricTest> = Api::all(admin.clone());
    tests
        .create(
            &PostParams::default(),
            &fabric_test("theirs", json!({"team": "other"}), "Observe"),
        )
        .await
        .expect("another installation's FabricTest");

    // 1. The operator runs: its finalizer releases gpu-02; the hook waits for it.
    quarantine_gpu_02(&admin, "fleet", "Cordon", &operator).await;
    assert!(unschedulable(&nodes.get("gpu-02").await.expect("gpu-02")));
    let (ok, out, took) = run_hook(&hook_args, &hook_kubeconfig).await;
    assert!(ok, "the hook failed:\n{out}\n{}", operator.log_tail(60));
    assert!(
        out.contains("deleted FabricTest fleet; its finalizer releases gpu-02"),
        "{out}"
    );
    assert!(
        !out.contains("released here"),
        "nothing is released beside a running operator:\n{out}"
    );
    assert!(!out.to_lowercase().contains("forbidden"), "{out}");
    assert_gone(&tests, "fleet").await;
    check_nodes(&admin, "with the operator running").await;
    assert!(
        tests.get_opt("theirs").await.expect("get").is_some(),
        "outside the selector: kept"
    );
    eprintln!("uninstall with the operator running took {took:?}");

    // 2. The operator died (SIGKILL: its Lease stays held, never renewed): the hook
    //    releases gpu-02 itself, with the finalizer's code, once the Lease has run out.
    quarantine_gpu_02(&admin, "fleet-2", "Taint", &operator).await;
    assert!(has_our_taint(&nodes.get("gpu-02").await.expect("gpu-02")));
    operator.kill();
    let (ok, out, took) = run_hook(&hook_args, &hook_kubeconfig).await;
    assert!(ok, "the hook failed:\n{out}");
    assert!(
        out.contains("no operator runs: FabricTest fleet-2 released here: gpu-02"),
        "{out}"
    );
    assert!(!out.to_lowercase().contains("forbidden"), "{out}");
    assert_gone(&tests, "fleet-2").await;
    check_nodes(&admin, "with the operator gone").await;
    assert!(
        tests.get_opt("theirs").await.expect("get").is_some(),
        "outside the selector: kept"
    );
    eprintln!("uninstall with the operator gone took {took:?}");

    // 3. A test that cannot go (a finalizer of someone else's): the hook gives up in time,
    //    says which test is left and what to do, and exits non-zero.
    let mut held = fabric_test("held", json!({"team": "infra"}), "Observe");
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    tests
        .create(&PostParams::default(), &held)
        .await
        .expect("held");
    let soon: Vec<String> = hook_args
        .iter()
        .map(|a| match a.starts_with("--timeout=") {
            true => "--timeout=5s".to_string(),
            false => a.clone(),
        })
        .collect();
    let (ok, out, _) = run_hook(&soon, &hook_kubeconfig).await;
    assert!(!ok, "a hook that timed out exits non-zero:\n{out}");
    assert!(out.contains("gave up after 5s: 1 FabricTest(s)"), "{out}");
    assert!(
        out.contains("FabricTest held: holds no node; finalizer example.com/hold"),
        "{out}"
    );
    assert!(out.contains("helm uninstall --no-hooks"), "{out}");
    tests
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("finalizer removed");
}
