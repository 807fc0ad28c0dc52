//! gpufabric installed the way a platform team installs it, from a registry: the release step
//! (`deploy/release.sh --artifacts --push`) pushes the images `deploy/images/build.sh` built
//! and the chart, as an OCI artifact, to a real registry (Debian's docker-registry, TLS from a
//! private CA, basic auth); `helm install oci://.../gpufabric --version X` into a namespace
//! that enforces Pod Security `restricted`; a real node (kubelet v1.33, containerd, runc,
//! CNI, kube-proxy, kube-scheduler) pulls both images with the chart's pull Secret. Then,
//! with nothing but the API: two operator replicas ready and one leading; a bad FabricTest
//! refused by the admission webhook through its Service; a clean node passed by an agent that
//! ran as a container (its result back through the real termination message and container
//! log); a FabricTest whose own pull Secret is wrong: its node not measured
//! (`ImagePullBackOff`), the test `InfrastructureDegraded`, the node not cordoned; a run
//! cancelled by its annotation, its pod gone
//! and no pod left holding `nvidia.com/gpu` before its status says every GPU is free; a
//! benchmark pod preempted by a training pod of higher priority, the node not measured and
//! nothing held against it; a node with a fault cordoned after its confirmation run while `helm upgrade` changes the operator's image
//! under the run; `helm uninstall` releasing that cordon and leaving a person's cordon, label
//! and taint alone.
//!
//! Needs root, the node packages (`tests/src/realnode.rs`), the registry's
//! (`tests/src/registry.rs`), the node binaries (`tests/cluster/build-node.sh`), helm
//! (`tests/tools/build.sh`) and the images (`deploy/images/build.sh`, or `$GPUFABRIC_IMAGES`).

use gpufabric_api::keys;
use gpufabric_api::outcome::NotMeasuredReason;
use gpufabric_api::run::{FabricTestRun, NodeVerdict, Trigger};
use gpufabric_api::test::FabricTest;
use gpufabric_tests::cluster::ClusterOptions;
use gpufabric_tests::operator::cordoned;
use gpufabric_tests::realnode::{BUSYBOX_IMAGE, RealNode, RealNodeOptions};
use gpufabric_tests::registry::{Registry, USERNAME};
use gpufabric_tests::shared::TestEnv;
use gpufabric_tests::tools::{self, helm, run_ok};
use gpufabric_tests::{wait, workspace_root};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Secret};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const RELEASE: &str = "gpufabric";
/// `<release>-operator`: the Deployment and the leader Lease.
const OPERATOR: &str = "gpufabric-operator";
const PRODUCT: &str = "NVIDIA-H100-80GB-HBM3";
const FLEET_MAP: &str = "sim-fleet";
/// Where the release pushes, under the registry: `<host>/gpufabric/fabric-operator`, ...
const PREFIX: &str = "gpufabric";
/// The pull Secret of the chart (operator and benchmark pods), and one with a wrong password.
const PULL_SECRET: &str = "registry-pull";
const WRONG_PULL_SECRET: &str = "registry-pull-wrong";
const T: Duration = Duration::from_secs(180);

/// A step and how long it took, printed at the end.
struct Steps {
    start: Instant,
    last: Instant,
    done: Vec<(String, Duration)>,
}

impl Steps {
    fn new() -> Steps {
        let now = Instant::now();
        Steps {
            start: now,
            last: now,
            done: Vec::new(),
        }
    }

    fn done(&mut self, what: &str) {
        let now = Instant::now();
        eprintln!(
            "installed: {what} ({:.1} s)",
            (now - self.last).as_secs_f64()
        );
        self.done.push((what.to_string(), now - self.last));
        self.last = now;
    }

    fn print(&self) {
        eprintln!("\nreal-node end to end, step by step:");
        for (what, took) in &self.done {
            eprintln!("  {:>6.1} s  {what}", took.as_secs_f64());
        }
        eprintln!(
            "  {:>6.1} s  in all",
            (Instant::now() - self.start).as_secs_f64()
        );
    }
}

/// The sim fleet of the real node, as the agent reads it from a ConfigMap key: eight H100s,
/// with `faults`.
fn fleet_doc(node: &str, faults: serde_json::Value) -> String {
    let fleet = json!({
        "seed": 7,
        "nodes": [{"name": node, "product": PRODUCT, "gpus": 8, "faults": faults}],
    });
    serde_json::to_string(&fleet).expect("a fleet serialises")
}

async fn set_fleet(client: &Client, ns: &str, node: &str, faults: serde_json::Value) {
    let cm: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": FLEET_MAP, "namespace": ns},
        "data": {"fleet.yaml": fleet_doc(node, faults)},
    }))
    .expect("a ConfigMap");
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .patch(
            FLEET_MAP,
            &PatchParams::apply("installed-test").force(),
            &Patch::Apply(&cm),
        )
        .await
        .expect("fleet ConfigMap applied");
}

/// A FabricTest over the real node alone, run once on creation, its agent on the sim
/// backend with the fleet from the ConfigMap; the image is the chart's `agentImage`.
fn fabric_test(
    name: &str,
    node: &str,
    quarantine: serde_json::Value,
    agent: serde_json::Value,
) -> FabricTest {
    let mut agent_spec = json!({
        "timeoutSeconds": 120,
        "env": [
            {"name": keys::ENV_BACKEND, "value": "sim"},
            {"name": keys::ENV_SIM_FLEET_DOC, "valueFrom": {"configMapKeyRef": {"name": FLEET_MAP, "key": "fleet.yaml"}}},
        ],
    });
    if let (Some(a), serde_json::Value::Object(extra)) = (agent_spec.as_object_mut(), agent) {
        a.extend(extra);
    }
    serde_json::from_value(json!({
        "apiVersion": "gpufabric.io/v1alpha1",
        "kind": "FabricTest",
        "metadata": {"name": name},
        "spec": {
            "nodes": [node],
            "quarantine": quarantine,
            "agent": agent_spec,
        },
    }))
    .expect("a FabricTest")
}

/// The runs of FabricTest `test`, oldest first.
async fn runs_of(client: &Client, test: &str) -> Vec<FabricTestRun> {
    let mut runs = Api::<FabricTestRun>::all(client.clone())
        .list(&ListParams::default().labels(&format!("{}={test}", keys::LABEL_TEST)))
        .await
        .expect("runs listed")
        .items;
    runs.sort_by_key(|r| r.metadata.creation_timestamp.clone().map(|t| t.0));
    runs
}

/// The verdict and not-measured reason of `node` in `run`.
fn node_result(run: &FabricTestRun, node: &str) -> (NodeVerdict, Option<NotMeasuredReason>) {
    run.status
        .as_ref()
        .and_then(|s| s.nodes.iter().find(|n| n.node == node))
        .map(|n| (n.verdict, n.not_measured))
        .unwrap_or((NodeVerdict::Pending, None))
}

/// Waits until FabricTest `name` has no active run and its status satisfies `cond`.
async fn wait_test(
    client: &Client,
    name: &str,
    timeout: Duration,
    what: &str,
    cond: impl Fn(&gpufabric_api::FabricTestStatus) -> bool + Send + Sync,
) -> FabricTest {
    let api: Api<FabricTest> = Api::all(client.clone());
    match wait::for_object(&api, name, timeout, |t| {
        t.and_then(|t| t.status.as_ref())
            .is_some_and(|s| s.active_run.is_none() && cond(s))
    })
    .await
    {
        Ok(Some(t)) => t,
        other => panic!(
            "{what}: {other:?}\nstatus: {:#?}",
            api.get(name).await.ok().and_then(|t| t.status)
        ),
    }
}

async fn delete_test(client: &Client, name: &str) {
    let api: Api<FabricTest> = Api::all(client.clone());
    let _ = api.delete(name, &DeleteParams::default()).await;
    wait::for_deletion(&api, name, T)
        .await
        .expect("FabricTest deleted (its finalizer ran)");
}

/// `kubectl apply -f -` of `doc`; the command's output.
fn kubectl_apply(env: &TestEnv, doc: &str) -> std::process::Output {
    let mut child = env
        .cluster()
        .kubectl()
        .args(["apply", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl starts");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(doc.as_bytes())
        .expect("kubectl reads the document");
    child.wait_with_output().expect("kubectl ends")
}

/// The release, pushed to a registry: where the chart and the images are, and how helm gets in.
struct Pushed<'a> {
    registry: &'a Registry,
    /// helm's registry config, written by `helm registry login`.
    helm_config: PathBuf,
    version: String,
}

impl Pushed<'_> {
    /// `<host>/gpufabric/fabric-NAME`.
    fn repository(&self, name: &str) -> String {
        format!("{}/{PREFIX}/fabric-{name}", self.registry.host())
    }
}

/// `deploy/release.sh --artifacts OUT --images IMAGES --push REGISTRY` started: the release's
/// files, pushed to `registry`.
fn start_release(registry: &Registry, images: &Path, out: &Path) -> std::process::Child {
    Command::new("bash")
        .arg(workspace_root().join("deploy/release.sh"))
        .arg("--artifacts")
        .arg(out)
        .arg("--images")
        .arg(images)
        .arg("--push")
        .arg(format!("{}/{PREFIX}", registry.host()))
        .env("HELM", tools::bin_dir().join("helm"))
        .env("REGISTRY_AUTH_FILE", registry.auth_file())
        .env("REGISTRY_CA_FILE", registry.ca_cert())
        .current_dir(workspace_root())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("deploy/release.sh starts")
}

/// `helm install` (or `upgrade`) of the pushed chart, operator tag `operator_tag`, both
/// images pulled with the chart's pull Secret.
fn helm_release(env: &TestEnv, verb: &str, pushed: &Pushed<'_>, operator_tag: &str) {
    let out = helm(Some(env.cluster()))
        .args([verb, RELEASE])
        .arg(format!(
            "oci://{}/{PREFIX}/charts/gpufabric",
            pushed.registry.host()
        ))
        .args(["--version", &pushed.version])
        .arg("--ca-file")
        .arg(pushed.registry.ca_cert())
        .arg("--registry-config")
        .arg(&pushed.helm_config)
        .args(["--namespace", env.ns()])
        .args([
            "--set",
            &format!("image.repository={}", pushed.repository("operator")),
        ])
        .args(["--set", &format!("image.tag={operator_tag}")])
        .args([
            "--set",
            &format!("agentImage.repository={}", pushed.repository("agent")),
        ])
        .args(["--set", &format!("imagePullSecrets[0].name={PULL_SECRET}")])
        .args([
            "--set",
            &format!("benchmarkPods.imagePullSecrets[0].name={PULL_SECRET}"),
        ])
        // The one schedulable node is also the GPU node the fault test cordons, maybe while
        // the upgrade still places a replica: the operator tolerates that cordon (on a
        // cluster it runs on nodes that are not tested).
        .args([
            "--set",
            "tolerations[0].key=node.kubernetes.io/unschedulable",
            "--set",
            "tolerations[0].operator=Exists",
            "--set",
            "tolerations[0].effect=NoSchedule",
        ])
        .args(["--wait", "--timeout", "240s"])
        .output()
        .expect("helm runs");
    if !out.status.success() {
        // What the release waited for: the pods and the namespace's Events (image pulls).
        let state = env
            .cluster()
            .kubectl()
            .args([
                "-n",
                env.ns(),
                "get",
                "pods,replicasets,events",
                "-o",
                "wide",
            ])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        panic!(
            "helm {verb} failed ({}):\n{}\n{}\n{state}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A `kubernetes.io/dockerconfigjson` Secret `name` for the registry, with `password`.
async fn pull_secret(client: &Client, ns: &str, name: &str, registry: &Registry, password: &str) {
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": ns},
        "type": "kubernetes.io/dockerconfigjson",
        "stringData": {".dockerconfigjson": registry.pull_secret_json(password)},
    }))
    .expect("a Secret");
    Api::<Secret>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &secret)
        .await
        .expect("pull Secret created");
}

/// Waits until the operator Deployment has rolled out `image` on two ready replicas, and
/// returns the Lease's holder, one of its pods.
async fn operator_ready(client: &Client, ns: &str, image: &str) -> String {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let rolled = wait::for_object(&deployments, OPERATOR, T, |d| {
        d.is_some_and(|d| {
            let spec_image = d
                .spec
                .as_ref()
                .and_then(|s| s.template.spec.as_ref())
                .and_then(|p| p.containers.first())
                .and_then(|c| c.image.clone());
            let st = d.status.as_ref();
            spec_image.as_deref() == Some(image)
                && st.and_then(|s| s.updated_replicas) == Some(2)
                && st.and_then(|s| s.ready_replicas) == Some(2)
                && st.and_then(|s| s.replicas) == Some(2)
                && st.and_then(|s| s.observed_generation) == d.metadata.generation
        })
    })
    .await;
    assert!(rolled.is_ok(), "two ready replicas of {image}: {rolled:?}");
    let pods: Vec<String> = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!(
            "app.kubernetes.io/name=fabric-operator,app.kubernetes.io/instance={RELEASE}"
        )))
        .await
        .expect("operator pods")
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(ResourceExt::name_any)
        .collect();
    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
    let lease = wait::for_object(&leases, OPERATOR, T, |l| {
        l.and_then(|l| l.spec.as_ref())
            .and_then(|s| s.holder_identity.as_ref())
            .is_some_and(|h| pods.contains(h))
    })
    .await;
    match lease {
        Ok(Some(l)) => l.spec.and_then(|s| s.holder_identity).expect("a holder"),
        other => panic!("a running operator pod leads ({pods:?}): {other:?}"),
    }
}

/// A benchmark pod as it was when its container ended, and its log then.
struct EndedPod {
    pod: Pod,
    log: String,
}

/// Watches for the first pod matching `selector` until its container has ended and its log
/// ends in a line that parses as JSON (the agent's full document), reading both before the
/// operator's deletion of the pod takes them away.
async fn ended_benchmark_pod(pods: Api<Pod>, selector: String, timeout: Duration) -> EndedPod {
    let end = Instant::now() + timeout;
    let mut last_seen = None;
    while Instant::now() < end {
        let found = pods
            .list(&ListParams::default().labels(&selector))
            .await
            .ok()
            .and_then(|l| l.items.into_iter().next());
        if let Some(pod) = found {
            let ended = pod
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.as_ref())
                .and_then(|c| c.first())
                .and_then(|c| c.state.as_ref())
                .is_some_and(|s| s.terminated.is_some());
            if ended && let Ok(log) = pods.logs(&pod.name_any(), &LogParams::default()).await {
                let last = log.lines().last().unwrap_or_default();
                if serde_json::from_str::<serde_json::Value>(last).is_ok() {
                    return EndedPod { pod, log };
                }
            }
            last_seen = Some(pod);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "no benchmark pod ({selector}) ended with a readable log in time; last seen: {last_seen:#?}"
    );
}

#[tokio::test]
async fn the_chart_runs_the_operator_and_its_benchmark_pods_on_a_real_node() {
    let mut steps = Steps::new();
    let images = tools::images();
    let version = env!("CARGO_PKG_VERSION").to_string();
    // The release step's rehearsal: every file of the release written and pushed to a real
    // registry (TLS, basic auth), the images under their digests, the chart as an OCI
    // artifact.
    let registry = Registry::start()
        .expect("the registry starts (apt-get install docker-registry skopeo apache2-utils)");
    let release_dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    // Pushed while the control plane and the node start.
    let releasing = start_release(
        &registry,
        images.operator.archive.parent().expect("the images' dir"),
        release_dir.path(),
    );
    let env = TestEnv::with_options(
        "installed",
        ClusterOptions {
            real_node: true,
            ..Default::default()
        },
    )
    .await
    .expect("control plane for a real node");
    let client = env.client();
    let ns = env.ns().to_string();
    let node = RealNode::shared(
        env.cluster(),
        RealNodeOptions {
            labels: [
                (keys::LABEL_GPU_PRODUCT.to_string(), PRODUCT.to_string()),
                (keys::LABEL_GPU_COUNT.to_string(), "8".to_string()),
            ]
            .into(),
            ..Default::default()
        },
    )
    .await
    .expect("real node starts (needs root, the node packages and tests/cluster/build-node.sh)");
    node.set_extended_resource(keys::RESOURCE_GPU, 8)
        .await
        .expect("GPUs advertised");
    node.trust_registry(registry.host(), &registry.ca_cert())
        .expect("the node trusts the registry's CA");
    let name = node.name().to_string();
    let held = node.images().expect("the node's images");
    assert!(
        !held.iter().any(|i| i.contains("fabric-")),
        "the node pulls gpufabric's images, none is there before: {held:?}"
    );
    steps.done("real node Ready, trusting the registry's CA, 8 GPUs advertised");
    let released = releasing
        .wait_with_output()
        .expect("deploy/release.sh ends");
    let said = String::from_utf8_lossy(&released.stderr);
    assert!(
        released.status.success(),
        "deploy/release.sh --push failed:\n{said}"
    );
    assert!(
        said.contains(&format!(
            "pushed oci://{}/{PREFIX}/charts/gpufabric:{version}",
            registry.host()
        )),
        "{said}"
    );
    for image in ["operator", "agent"] {
        let tags = registry
            .tags(&format!("{PREFIX}/fabric-{image}"), registry.password())
            .expect("the registry lists the tags");
        assert_eq!(tags, [format!("v{version}")], "fabric-{image}");
    }
    assert!(
        registry
            .tags(&format!("{PREFIX}/fabric-agent"), "not-the-password")
            .is_err(),
        "the registry refuses a wrong password"
    );
    let helm_config = release_dir.path().join("helm-registry.json");
    let mut login = helm(None)
        .arg("--registry-config")
        .arg(&helm_config)
        .args(["registry", "login", registry.host(), "--username", USERNAME])
        .arg("--password-stdin")
        .arg("--ca-file")
        .arg(registry.ca_cert())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("helm registry login starts");
    login
        .stdin
        .take()
        .expect("stdin")
        .write_all(registry.password().as_bytes())
        .expect("the password written");
    let logged_in = login.wait_with_output().expect("helm registry login ends");
    assert!(
        logged_in.status.success(),
        "helm registry login: {}",
        String::from_utf8_lossy(&logged_in.stderr)
    );
    let pushed = Pushed {
        registry: &registry,
        helm_config,
        version: version.clone(),
    };
    let operator_ref = format!("{}:v{version}", pushed.repository("operator"));
    let agent_ref = format!("{}:v{version}", pushed.repository("agent"));
    steps.done("release pushed to the registry: both images and the chart, read back");

    // What a person did to the node before gpufabric came: a label and a soft taint that
    // gpufabric must leave as they are; and another node a person cordoned.
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"labels": {"example.com/owner": "platform"}},
                "spec": {"taints": [{"key": "example.com/maintenance", "value": "soon", "effect": "PreferNoSchedule"}]},
            })),
        )
        .await
        .expect("foreign label and taint");
    let foreign = format!("{ns}-cordoned-by-admin");
    let foreign_node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": foreign, "labels": {keys::LABEL_GPU_PRODUCT: PRODUCT}},
        "spec": {"unschedulable": true},
    }))
    .expect("a node");
    nodes
        .create(&PostParams::default(), &foreign_node)
        .await
        .expect("foreign node");

    // The release namespace enforces Pod Security restricted: the operator and every
    // benchmark pod must meet it.
    Api::<Namespace>::all(client.clone())
        .patch(
            &ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest",
            }}})),
        )
        .await
        .expect("namespace labelled");

    // The chart's pull Secret, and one a FabricTest names by mistake.
    pull_secret(&client, &ns, PULL_SECRET, &registry, registry.password()).await;
    pull_secret(
        &client,
        &ns,
        WRONG_PULL_SECRET,
        &registry,
        "not-the-password",
    )
    .await;
    helm_release(&env, "install", &pushed, &format!("v{version}"));
    let leader = operator_ready(&client, &ns, &operator_ref).await;
    steps.done(&format!(
        "helm install oci://.../gpufabric --version {version}: two operator replicas pulled and ready, {leader} leads"
    ));

    // A FabricTest the schema admits and the operator could only fail: the webhook, reached
    // by the API server through its Service (kube-proxy), refuses it at the door.
    let bad = "apiVersion: gpufabric.io/v1alpha1\nkind: FabricTest\nmetadata:\n  name: never-fires\nspec:\n  schedule: \"0 0 31 2 *\"\n";
    // The Service routes once kube-proxy has synced its new endpoints, shortly after the
    // replicas are Ready: until then the API server cannot reach the webhook at all.
    let routed = Instant::now() + Duration::from_secs(60);
    let (out, stderr) = loop {
        let out = kubectl_apply(&env, bad);
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        if !stderr.contains("failed calling webhook") || Instant::now() > routed {
            break (out, stderr);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        !out.status.success(),
        "a schedule that never fires is refused"
    );
    assert!(
        stderr.contains("admission webhook \"fabrictests.gpufabric.io\" denied the request"),
        "{stderr}"
    );
    steps.done("kubectl apply of a bad FabricTest refused by the webhook");

    // A clean node passes; its agent ran as a container. The operator deletes a run's pod as
    // soon as it has read the result, which can be before the kubelet reports the pod's phase:
    // the pod and its log are watched from its creation, and kept from when its container ended.
    set_fleet(&client, &ns, &name, json!([])).await;
    let api: Api<FabricTest> = Api::all(client.clone());
    let observe = json!({"mode": "Observe"});
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let seen = tokio::spawn(ended_benchmark_pod(
        pods.clone(),
        format!("{}=installed-clean", keys::LABEL_TEST),
        T,
    ));
    api.create(
        &PostParams::default(),
        &fabric_test("installed-clean", &name, observe, json!({})),
    )
    .await
    .expect("clean test");
    let t = wait_test(&client, "installed-clean", T, "the clean run", |s| {
        s.last_run.is_some()
    })
    .await;
    let verdict = t
        .status
        .as_ref()
        .and_then(|s| s.nodes.iter().find(|n| n.node == name))
        .map(|n| n.verdict);
    assert_eq!(verdict, Some(NodeVerdict::Passed), "{:#?}", t.status);
    let EndedPod { pod, log } = seen.await.expect("the pod watch");
    let status = pod.status.as_ref().expect("pod status");
    let container = status
        .container_statuses
        .as_ref()
        .and_then(|c| c.first())
        .expect("container status");
    assert!(
        container
            .container_id
            .as_deref()
            .is_some_and(|id| id.starts_with("containerd://")),
        "ran by containerd: {container:?}"
    );
    assert_eq!(container.image, agent_ref);
    assert!(
        container.image_id.ends_with(&images.agent.digest),
        "the agent pulled from the registry is the one released: {} is not {}",
        container.image_id,
        images.agent.digest
    );
    let terminated = container
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .expect("the container ended");
    assert_eq!(terminated.exit_code, 0, "{terminated:?}");
    let message = terminated.message.clone().unwrap_or_default();
    assert!(
        !message.is_empty() && message.len() <= keys::TERMINATION_MESSAGE_LIMIT,
        "the compact result as the termination message: {message:?}"
    );
    let last = log.lines().last().unwrap_or_default();
    let doc: serde_json::Value =
        serde_json::from_str(last).expect("the full document is the log's last line");
    assert_eq!(doc["node"], name.as_str());
    assert_eq!(doc["backend"], "sim");
    delete_test(&client, "installed-clean").await;
    steps.done("clean node Passed; the agent, pulled with the chart's pull Secret, ran as a non-root container, result from its termination message and log");

    // A FabricTest whose own pull Secret (it replaces the chart's) has a wrong password: the
    // kubelet cannot pull, the node is not measured and nothing is held against it, and the
    // test says its image cannot be pulled.
    let cordon_now = json!({"mode": "Cordon", "maxQuarantined": "100%", "failuresToQuarantine": 1, "confirmRetest": false});
    api.create(
        &PostParams::default(),
        &fabric_test(
            "installed-wrong-secret",
            &name,
            cordon_now,
            json!({"imagePullPolicy": "Always", "imagePullSecrets": [{"name": WRONG_PULL_SECRET}]}),
        ),
    )
    .await
    .expect("wrong-secret test");
    let t = wait_test(
        &client,
        "installed-wrong-secret",
        T,
        "the run that cannot pull",
        |s| s.last_run.is_some(),
    )
    .await;
    let runs = runs_of(&client, "installed-wrong-secret").await;
    let run = runs.first().expect("a run");
    assert_eq!(
        node_result(run, &name),
        (NodeVerdict::NotMeasured, Some(NotMeasuredReason::ImagePull)),
        "{:#?}",
        run.status
    );
    let detail = run
        .status
        .as_ref()
        .and_then(|s| s.nodes.iter().find(|n| n.node == name))
        .and_then(|n| n.reason.clone())
        .unwrap_or_default();
    assert!(detail.starts_with("ImagePullBackOff"), "{detail}");
    let degraded = t
        .status
        .as_ref()
        .and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == "InfrastructureDegraded")
        })
        .cloned()
        .expect("the InfrastructureDegraded condition");
    assert_eq!(
        (degraded.status.as_str(), degraded.reason.as_str()),
        ("True", "ImagePull"),
        "{degraded:?}"
    );
    assert!(
        degraded.message.contains(
            "ImagePullBackOff on 1 of 1 nodes: check agent.image and agent.imagePullSecrets"
        ),
        "{}",
        degraded.message
    );
    let n = nodes.get(&name).await.expect("node");
    assert!(
        !cordoned(&n),
        "a test that cannot pull its image cordons nothing"
    );
    assert!(
        t.status.as_ref().is_some_and(|s| s.quarantined_count == 0),
        "{:#?}",
        t.status
    );
    delete_test(&client, "installed-wrong-secret").await;
    steps.done("a FabricTest's wrong pull Secret: ImagePullBackOff, not measured, InfrastructureDegraded, not cordoned");

    // Cancelled: a run whose agent blocks until it is stopped is cancelled by its annotation;
    // its status says every GPU is free only once the kubelet has let its pod go, and then
    // no pod on the node holds nvidia.com/gpu.
    set_fleet(
        &client,
        &ns,
        &name,
        json!([{"kind": "hang", "stuck": true}]),
    )
    .await;
    let cordon_now = json!({"mode": "Cordon", "maxQuarantined": "100%", "failuresToQuarantine": 1, "confirmRetest": false});
    api.create(
        &PostParams::default(),
        &fabric_test("installed-cancel", &name, cordon_now, json!({})),
    )
    .await
    .expect("cancelled test");
    let cancel_selector = format!("{}=installed-cancel", keys::LABEL_TEST);
    wait::poll(
        "the benchmark pod to cancel running",
        T,
        Duration::from_millis(500),
        || {
            let (pods, selector) = (pods.clone(), cancel_selector.clone());
            async move {
                let list = pods
                    .list(&ListParams::default().labels(&selector))
                    .await
                    .map_err(|e| gpufabric_tests::Error::Invalid(e.to_string()))?;
                Ok(list.items.into_iter().find(|p| {
                    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                }))
            }
        },
    )
    .await
    .expect("the benchmark pod runs");
    let cancelled_run = runs_of(&client, "installed-cancel")
        .await
        .first()
        .expect("a run")
        .name_any();
    let runs_api: Api<FabricTestRun> = Api::all(client.clone());
    runs_api
        .patch(
            &cancelled_run,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                gpufabric_api::limits::CANCEL_ANNOTATION: "installed test"
            }}})),
        )
        .await
        .expect("run annotated");
    let stopped = wait::for_object(&runs_api, &cancelled_run, T, |r| {
        r.and_then(|r| r.status.as_ref()).is_some_and(|s| {
            s.phase.is_finished()
                && s.conditions.iter().any(|c| {
                    c.type_ == gpufabric_api::limits::CONDITION_GPUS_FREE && c.status == "True"
                })
        })
    })
    .await
    .expect("the cancelled run says its GPUs are free")
    .expect("the cancelled run");
    assert_eq!(
        node_result(&stopped, &name),
        (NodeVerdict::NotMeasured, Some(NotMeasuredReason::Cancelled)),
        "{:#?}",
        stopped.status
    );
    let left = pods
        .list(&ListParams::default().labels(&cancel_selector))
        .await
        .expect("pods listed")
        .items;
    assert!(
        left.is_empty(),
        "benchmark pods left after the cancel: {left:#?}"
    );
    let on_node = Api::<Pod>::all(client.clone())
        .list(&ListParams::default().fields(&format!("spec.nodeName={name}")))
        .await
        .expect("pods on the node")
        .items;
    let holding: Vec<String> = on_node
        .iter()
        .filter(|p| {
            !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        })
        .filter(|p| {
            p.spec.iter().flat_map(|s| &s.containers).any(|c| {
                c.resources
                    .as_ref()
                    .and_then(|r| r.limits.as_ref())
                    .is_some_and(|l| l.contains_key(keys::RESOURCE_GPU))
            })
        })
        .map(|p| p.name_any())
        .collect();
    assert!(
        holding.is_empty(),
        "pods still holding nvidia.com/gpu: {holding:?}"
    );
    wait_test(
        &client,
        "installed-cancel",
        T,
        "the cancelled run folded",
        |s| s.last_run.is_some(),
    )
    .await;
    let cordoned_now = nodes
        .get(&name)
        .await
        .ok()
        .and_then(|n| n.spec)
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    assert!(
        !cordoned_now,
        "a cancelled run holds nothing against the node"
    );
    delete_test(&client, "installed-cancel").await;
    steps.done("a cancelled run: its pod stopped, no pod left holding nvidia.com/gpu, status GpusFree, the node not measured and not cordoned");

    // Preempted: a training pod of higher priority needs the GPUs the benchmark pod holds.
    let priority = |name: &str, value: i32| -> PriorityClass {
        serde_json::from_value(json!({
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": {"name": name}, "value": value,
        }))
        .expect("a PriorityClass")
    };
    let classes: Api<PriorityClass> = Api::all(client.clone());
    let (low, high) = (format!("{ns}-tests"), format!("{ns}-training"));
    for class in [priority(&low, 100), priority(&high, 100_000)] {
        classes
            .create(&PostParams::default(), &class)
            .await
            .expect("PriorityClass");
    }
    set_fleet(
        &client,
        &ns,
        &name,
        json!([{"kind": "hang", "stuck": true}]),
    )
    .await;
    let cordon_once = json!({"mode": "Cordon", "maxQuarantined": "100%", "failuresToQuarantine": 1, "confirmRetest": false});
    api.create(
        &PostParams::default(),
        &fabric_test(
            "installed-preempted",
            &name,
            cordon_once,
            json!({"priorityClassName": low}),
        ),
    )
    .await
    .expect("preempted test");
    let running = wait::poll(
        "the benchmark pod running",
        T,
        Duration::from_millis(500),
        || {
            let pods = pods.clone();
            async move {
                let list = pods
                    .list(
                        &ListParams::default()
                            .labels(&format!("{}=installed-preempted", keys::LABEL_TEST)),
                    )
                    .await
                    .map_err(|e| gpufabric_tests::Error::Invalid(e.to_string()))?;
                Ok(list.items.into_iter().find(|p| {
                    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                }))
            }
        },
    )
    .await
    .expect("the benchmark pod runs");
    let training: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "training"},
        "spec": {
            "priorityClassName": high,
            "nodeSelector": {"kubernetes.io/hostname": name},
            "tolerations": [{"operator": "Exists"}],
            "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532, "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "train",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", "sleep 3600"],
                "resources": {"limits": {keys::RESOURCE_GPU: "8"}},
                "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }))
    .expect("a pod");
    pods.create(&PostParams::default(), &training)
        .await
        .expect("training pod");
    let t = wait_test(
        &client,
        "installed-preempted",
        T,
        "the preempted run",
        |s| s.last_run.is_some(),
    )
    .await;
    let runs = runs_of(&client, "installed-preempted").await;
    let run = runs.first().expect("a run");
    assert_eq!(
        node_result(run, &name),
        (NodeVerdict::NotMeasured, Some(NotMeasuredReason::Preempted)),
        "preempted pod {}: {:#?}",
        running.name_any(),
        run.status
    );
    let n = nodes.get(&name).await.expect("node");
    assert!(!cordoned(&n), "nothing is held against a preempted node");
    assert!(
        t.status.as_ref().is_some_and(|s| s.quarantined_count == 0),
        "{:#?}",
        t.status
    );
    let trained = wait::for_object(&pods, "training", T, |p| {
        p.and_then(|p| p.status.as_ref())
            .and_then(|s| s.phase.as_deref())
            == Some("Running")
    })
    .await;
    assert!(trained.is_ok(), "the training pod runs: {trained:?}");
    pods.delete("training", &DeleteParams::default().grace_period(0))
        .await
        .expect("training pod deleted");
    wait::for_deletion(&pods, "training", T)
        .await
        .expect("training pod gone");
    delete_test(&client, "installed-preempted").await;
    for class in [&low, &high] {
        let _ = classes.delete(class, &DeleteParams::default()).await;
    }
    steps.done("benchmark pod preempted by a training pod: not measured (Preempted), nothing held");

    // A fault: the first run fails the node, the confirmation run fails it again, and the
    // node is cordoned, while helm upgrade moves the operator to a new image tag under the
    // runs.
    set_fleet(
        &client,
        &ns,
        &name,
        json!([{"kind": "slowPair", "gpus": [2, 5], "factor": 0.3}]),
    )
    .await;
    let confirm = json!({"mode": "Cordon", "maxQuarantined": "100%", "failuresToQuarantine": 1, "confirmRetest": true});
    api.create(
        &PostParams::default(),
        &fabric_test("installed-fault", &name, confirm, json!({})),
    )
    .await
    .expect("fault test");
    wait::poll("the first run's pod", T, Duration::from_millis(200), || {
        let pods = pods.clone();
        async move {
            let list = pods
                .list(
                    &ListParams::default().labels(&format!("{}=installed-fault", keys::LABEL_TEST)),
                )
                .await
                .map_err(|e| gpufabric_tests::Error::Invalid(e.to_string()))?;
            Ok((!list.items.is_empty()).then_some(()))
        }
    })
    .await
    .expect("the fault test's first pod exists");
    let new_tag = format!("v{version}-next");
    let new_ref = registry
        .tag(
            &operator_ref,
            &format!("{PREFIX}/fabric-operator:{new_tag}"),
        )
        .expect("the operator image pushed under a new tag");
    helm_release(&env, "upgrade", &pushed, &new_tag);
    let leader = operator_ready(&client, &ns, &new_ref).await;
    steps.done(&format!(
        "helm upgrade to {new_tag} with a run in flight: two replicas ready, {leader} leads"
    ));
    let t = wait_test(
        &client,
        "installed-fault",
        T,
        "the fault confirmed and cordoned",
        |s| {
            s.quarantined_count == 1
                && s.last_run
                    .as_ref()
                    .is_some_and(|r| r.trigger == Trigger::Confirmation)
        },
    )
    .await;
    let runs = runs_of(&client, "installed-fault").await;
    assert_eq!(runs.len(), 2, "the first run and its confirmation");
    for run in &runs {
        assert_eq!(
            node_result(run, &name).0,
            NodeVerdict::Failed,
            "every run kept its result across the upgrade: {:#?}",
            run.status
        );
    }
    let n = nodes.get(&name).await.expect("node");
    assert!(cordoned(&n), "cordoned after the confirmation");
    assert!(n.annotations().contains_key(keys::ANNOTATION_QUARANTINE));
    assert_eq!(
        n.labels().get(keys::LABEL_QUARANTINED).map(String::as_str),
        Some("true"),
        "{:?}",
        n.labels()
    );
    let mut reasons = gpufabric_tests::events::reasons(&client, "default", "installed-fault").await;
    reasons.extend(gpufabric_tests::events::reasons(&client, "default", &name).await);
    assert!(
        reasons.iter().any(|r| r == "Quarantined"),
        "an Event says what was done: {reasons:?}"
    );
    assert!(
        t.status
            .as_ref()
            .is_some_and(|s| s.quarantined_nodes == [name.clone()])
    );
    steps.done("slow GPU pair: Failed, confirmed, cordoned");

    // helm uninstall: its hook deletes the tests while the operator runs; their finalizers
    // release what gpufabric did, and nothing a person did is touched.
    run_ok(helm(Some(env.cluster())).args([
        "uninstall",
        RELEASE,
        "--namespace",
        &ns,
        "--wait",
        "--timeout",
        "240s",
    ]));
    let left = api.list(&ListParams::default()).await.expect("tests");
    assert!(
        left.items
            .iter()
            .all(|t| !t.name_any().starts_with("installed-")),
        "the hook deleted the tests"
    );
    let n = nodes.get(&name).await.expect("node");
    assert!(!cordoned(&n), "the cordon gpufabric made is gone");
    assert!(!n.annotations().contains_key(keys::ANNOTATION_QUARANTINE));
    assert!(!n.labels().contains_key(keys::LABEL_QUARANTINED));
    assert_eq!(
        n.labels().get("example.com/owner").map(String::as_str),
        Some("platform")
    );
    let taints = n
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    assert!(
        taints.iter().any(|t| t.key == "example.com/maintenance"),
        "{taints:?}"
    );
    assert!(
        !taints.iter().any(|t| t.key.starts_with("gpufabric.io/")),
        "{taints:?}"
    );
    let f = nodes.get(&foreign).await.expect("foreign node");
    assert!(cordoned(&f), "a person's cordon stays");
    let _ = nodes.delete(&foreign, &DeleteParams::default()).await;
    steps.done(
        "helm uninstall: gpufabric's cordon released, a person's label, taint and cordon kept",
    );
    steps.print();
}
