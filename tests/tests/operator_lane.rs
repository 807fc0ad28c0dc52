//! The operator's lane on a real kube-apiserver: the chart installed with helm, and every
//! request made with a token of the chart's ServiceAccount. Its admission policies
//! (templates/admission-policy.yaml) let through each kind of write the operator makes
//! (its labels and annotations, cordon and uncordon with its quarantine record, its taints
//! with the validation gate, its condition through nodes/status, its pods and Secrets) and
//! refuse the same token outside them: another label or annotation, another taint, a
//! NoExecute taint, a cordon without the record, anything added on a node without GPUs, another
//! condition, the node's capacity, a pod or Secret without its label or owner, a pod in a
//! namespace that enforces no Pod Security level. The cluster admin is not bound by them.
//!
//! Needs helm: `tests/tools/build.sh` (cached; or point GPUFABRIC_TOOLS_BIN at it).

use gpufabric_tests::cluster::{Cluster, ClusterOptions};
use gpufabric_tests::tools::{self, chart, helm, run_ok};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret, ServiceAccount};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

const NS: &str = "gpufabric-system";
const RELEASE: &str = "fabric";
const NAME: &str = "fabric-operator";
const GPU_NODE: &str = "gpu-1";
const CPU_NODE: &str = "cpu-1";
/// How the API server names a refusal by one of the chart's policies.
const DENIED: &str = "ValidatingAdmissionPolicy";

async fn namespace(client: &Client, name: &str, labels: Value) {
    let ns: Namespace = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels}
    }))
    .expect("namespace");
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("namespace created");
    // No controller-manager here: the `default` ServiceAccount pods are admitted with.
    let sa: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "default"}})).expect("sa");
    Api::<ServiceAccount>::namespaced(client.clone(), name)
        .create(&PostParams::default(), &sa)
        .await
        .expect("default ServiceAccount");
}

/// A node with a person's label, annotation and taint; with `gpus`, 8 `nvidia.com/gpu` in
/// its capacity and allocatable, and a kubelet condition.
async fn node(admin: &Client, name: &str, gpus: bool) {
    let nodes: Api<Node> = Api::all(admin.clone());
    let n: Node = serde_json::from_value(json!({
        "metadata": {
            "name": name,
            "labels": {"team": "ml", "gpufabric.io/result": "pass"},
            "annotations": {"owner": "infra"},
        },
        "spec": {"taints": [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]},
    }))
    .expect("node");
    nodes
        .create(&PostParams::default(), &n)
        .await
        .expect("node created");
    let mut resources = json!({"cpu": "64", "memory": "512Gi", "pods": "110"});
    if gpus {
        resources["nvidia.com/gpu"] = json!("8");
    }
    let status = json!({"status": {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
            "message": "kubelet is posting ready status",
            "lastHeartbeatTime": "2026-11-01T00:00:00Z", "lastTransitionTime": "2026-11-01T00:00:00Z"}],
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("node status");
}

async fn operator_client(cluster: &Cluster, dir: &std::path::Path) -> Client {
    let path = dir.join("sa.kubeconfig");
    tools::service_account_kubeconfig(cluster, NS, NAME, &path).await;
    let kc = kube::config::Kubeconfig::read_from(&path).expect("sa kubeconfig");
    let config = kube::config::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("sa config");
    Client::try_from(config).expect("sa client")
}

/// The refusal of `r`, which must come from one of the chart's policies and say `why`.
fn refused<T: std::fmt::Debug>(what: &str, r: Result<T, kube::Error>, why: &str) {
    match r {
        Err(kube::Error::Api(s)) => {
            assert!(
                s.message.contains(DENIED) && s.message.contains(why),
                "{what}: refused, but not by the policy saying {why:?}: {}",
                s.message
            );
            assert_eq!(s.code, 403, "{what}: a policy refusal is Forbidden");
        }
        other => panic!("{what}: the operator's token was let through: {other:?}"),
    }
}

fn allowed<T>(what: &str, r: Result<T, kube::Error>) -> T {
    r.unwrap_or_else(|e| panic!("{what}: the operator's own write was refused: {e}"))
}

fn merge(v: Value) -> Patch<Value> {
    Patch::Merge(v)
}

/// The node's taints as read, plus `extra`: the whole list, as the operator sends it.
async fn taints_with(nodes: &Api<Node>, node: &str, extra: &[Value]) -> Value {
    let n = nodes.get(node).await.expect("node read");
    let mut taints: Vec<Value> = n
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .map(|t| serde_json::to_value(t).expect("taint"))
        .collect();
    taints.extend(extra.iter().cloned());
    Value::Array(taints)
}

fn condition(type_: &str, status: &str) -> Value {
    json!({"status": {"conditions": [{
        "type": type_, "status": status, "reason": "Test",
        "message": "FabricTest nightly, run nightly-1: passed",
        "lastHeartbeatTime": "2026-11-02T00:00:00Z", "lastTransitionTime": "2026-11-02T00:00:00Z",
    }]}})
}

/// A benchmark pod as the operator makes one: its labels, a FabricTestRun as controller,
/// Pod Security `restricted`.
fn pod(name: &str, labels: Value, owned: bool) -> Pod {
    let owners = if owned {
        json!([{"apiVersion": "gpufabric.io/v1alpha1", "kind": "FabricTestRun",
            "name": "nightly-1", "uid": "8d3e2f1a-0000-4000-8000-000000000001",
            "controller": true}])
    } else {
        json!([])
    };
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels, "ownerReferences": owners},
        "spec": {
            "nodeName": GPU_NODE,
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532,
                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{"name": "agent", "image": "fabric-agent:test",
                "securityContext": {"allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]}}}],
        },
    }))
    .expect("pod")
}

fn secret(labels: Value, owned: bool) -> Secret {
    let owners = if owned {
        json!([{"apiVersion": "gpufabric.io/v1alpha1", "kind": "FabricTestRun",
            "name": "nightly-1", "uid": "8d3e2f1a-0000-4000-8000-000000000001",
            "controller": true}])
    } else {
        json!([])
    };
    serde_json::from_value(json!({
        "metadata": {"name": "nightly-1-rendezvous", "labels": labels, "ownerReferences": owners},
        "data": {"secret": "MDA="},
    }))
    .expect("secret")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operators_token_is_held_to_its_lane_by_the_charts_admission_policies() {
    gpufabric_tests::init_tracing();
    let cluster = Cluster::start_with(ClusterOptions {
        install_crds: false,
        // No node lifecycle controller tainting the nodes between two requests.
        controller_manager: false,
        ..Default::default()
    })
    .await
    .expect("local control plane starts");
    let admin = cluster.client();
    namespace(
        &admin,
        NS,
        json!({"pod-security.kubernetes.io/enforce": "restricted"}),
    )
    .await;
    run_ok(
        helm(Some(&cluster))
            .args(["install", RELEASE])
            .arg(chart())
            .args(["--namespace", NS, "--set", "image.tag=test"])
            .args(["--set", "webhook.failurePolicy=Ignore"]),
    );
    node(&admin, GPU_NODE, true).await;
    node(&admin, CPU_NODE, false).await;
    let dir = tempfile::tempdir().expect("temp dir");
    let sa = operator_client(&cluster, dir.path()).await;
    let nodes: Api<Node> = Api::all(sa.clone());
    let pp = PatchParams::default();

    // A policy takes effect once the API server has loaded it: wait for the first refusal.
    let foreign_label = json!({"metadata": {"labels": {"team": "other"}}});
    gpufabric_tests::wait::poll(
        "the admission policy refuses a foreign label",
        std::time::Duration::from_secs(30),
        std::time::Duration::from_millis(200),
        || async {
            let r = nodes
                .patch(
                    GPU_NODE,
                    &PatchParams {
                        dry_run: true,
                        ..Default::default()
                    },
                    &merge(foreign_label.clone()),
                )
                .await;
            Ok(r.is_err().then_some(()))
        },
    )
    .await
    .expect("the policy is in force");

    // Outside the lane, on a GPU node.
    refused(
        "a label not under gpufabric.io/",
        nodes.patch(GPU_NODE, &pp, &merge(foreign_label)).await,
        "only gpufabric.io/ labels",
    );
    refused(
        "removing a person's label",
        nodes
            .patch(
                GPU_NODE,
                &pp,
                &merge(json!({"metadata": {"labels": {"team": null}}})),
            )
            .await,
        "only gpufabric.io/ labels",
    );
    refused(
        "an annotation not under gpufabric.io/",
        nodes
            .patch(
                GPU_NODE,
                &pp,
                &merge(json!({"metadata": {"annotations": {"owner": "me"}}})),
            )
            .await,
        "only gpufabric.io/ annotations",
    );
    refused(
        "removing a person's taint",
        nodes
            .patch(
                GPU_NODE,
                &pp,
                &merge(json!({"spec": {"taints": [
                    {"key": "gpufabric.io/quarantined", "value": "true", "effect": "NoSchedule"}
                ]}})),
            )
            .await,
        "only gpufabric.io/ taints",
    );
    let foreign_taint = json!({"key": "maintenance", "effect": "NoSchedule"});
    refused(
        "adding another taint",
        nodes
            .patch(
                GPU_NODE,
                &pp,
                &merge(
                    json!({"spec": {"taints": taints_with(&nodes, GPU_NODE, &[foreign_taint]).await}}),
                ),
            )
            .await,
        "only gpufabric.io/ taints",
    );
    let evicting =
        json!({"key": "gpufabric.io/quarantined", "value": "true", "effect": "NoExecute"});
    refused(
        "a NoExecute taint of its own key",
        nodes
            .patch(
                GPU_NODE,
                &pp,
                &merge(
                    json!({"spec": {"taints": taints_with(&nodes, GPU_NODE, &[evicting]).await}}),
                ),
            )
            .await,
        "never adds a NoExecute taint",
    );
    refused(
        "a cordon without the quarantine record",
        nodes
            .patch(
                GPU_NODE,
                &pp,
                &merge(json!({"spec": {"unschedulable": true}})),
            )
            .await,
        "cordons a node only with its quarantine record",
    );
    refused(
        "another node condition",
        nodes
            .patch_status(
                GPU_NODE,
                &pp,
                &Patch::Strategic(condition("Ready", "False")),
            )
            .await,
        "only its own node conditions",
    );
    refused(
        "the node's capacity",
        nodes
            .patch_status(
                GPU_NODE,
                &pp,
                &merge(json!({"status": {"capacity": {"nvidia.com/gpu": "64"}}})),
            )
            .await,
        "no node status but its own conditions",
    );
    refused(
        "a node's provider",
        nodes
            .patch(
                GPU_NODE,
                &pp,
                &merge(json!({"spec": {"providerID": "fake://elsewhere"}})),
            )
            .await,
        "no node field but",
    );

    // The operator's own writes on a GPU node: signals, a quarantine in each mode, the
    // gate, the condition, and the release of each.
    let record = r#"{"test":"nightly","run":"nightly-1","reason":"GPU 3 straggler","since":"2026-11-02T00:00:00Z","mode":"Cordon","cordoned":true,"tainted":false,"labeled":true}"#;
    allowed(
        "the result label and last-pass annotation",
        nodes
            .patch(
                GPU_NODE,
                &pp,
                &merge(json!({"metadata": {
                    "labels": {"gpufabric.io/result": "fail"},
                    "annotations": {"gpufabric.io/last-pass": "2026-11-01T00:00:00Z",
                        "gpufabric.io/counters": "{}", "gpufabric.io/trend": "{}"},
                }})),
            )
            .await,
    );
    allowed(
        "a cordon with the quarantine record and label",
        nodes
            .patch(
                GPU_NODE,
                &pp,
                &merge(json!({
                    "metadata": {"annotations": {"gpufabric.io/quarantine": record},
                        "labels": {"gpufabric.io/quarantined": "true"}},
                    "spec": {"unschedulable": true},
                })),
            )
            .await,
    );
    let ours = [
        json!({"key": "gpufabric.io/quarantined", "value": "true", "effect": "NoSchedule"}),
        json!({"key": "gpufabric.io/validation", "value": "pending", "effect": "NoSchedule"}),
        json!({"key": "gpufabric.io/suspect", "value": "nightly", "effect": "PreferNoSchedule"}),
    ];
    allowed(
        "its quarantine, gate and suspect taints beside a person's",
        nodes
            .patch(
                GPU_NODE,
                &pp,
                &merge(json!({
                    "metadata": {"annotations": {"gpufabric.io/gated": "nightly",
                        "gpufabric.io/suspect-taint": "nightly"}},
                    "spec": {"taints": taints_with(&nodes, GPU_NODE, &ours).await},
                })),
            )
            .await,
    );
    allowed(
        "its condition through nodes/status",
        nodes
            .patch_status(
                GPU_NODE,
                &PatchParams {
                    field_manager: Some("fabric-operator".into()),
                    ..Default::default()
                },
                &Patch::Strategic(condition("GPUFabricDegraded", "True")),
            )
            .await,
    );
    let n = nodes.get(GPU_NODE).await.expect("node");
    let kept: Vec<Value> = n
        .spec
        .and_then(|s| s.taints)
        .unwrap_or_default()
        .into_iter()
        .filter(|t| !t.key.starts_with("gpufabric.io/"))
        .map(|t| serde_json::to_value(t).expect("taint"))
        .collect();
    assert!(
        kept.iter().any(|t| t["key"] == "dedicated"),
        "the person's taint is still there: {kept:?}"
    );
    allowed(
        "the release: record, label, cordon and taints gone",
        nodes
            .patch(
                GPU_NODE,
                &pp,
                &merge(json!({
                    "metadata": {"annotations": {"gpufabric.io/quarantine": null,
                        "gpufabric.io/gated": null, "gpufabric.io/suspect-taint": null},
                        "labels": {"gpufabric.io/quarantined": null}},
                    "spec": {"unschedulable": null, "taints": kept},
                })),
            )
            .await,
    );
    allowed(
        "removing its condition",
        nodes
            .patch_status(
                GPU_NODE,
                &pp,
                &Patch::Strategic(json!({"status": {"conditions": [
                    {"type": "GPUFabricDegraded", "$patch": "delete"}
                ]}})),
            )
            .await,
    );
    let after = Api::<Node>::all(admin.clone())
        .get(GPU_NODE)
        .await
        .expect("node");
    assert_eq!(after.labels().get("team").map(String::as_str), Some("ml"));
    assert!(
        after
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready"),
        "the kubelet's condition stays"
    );

    // A node without GPUs: nothing added, nothing cordoned; what is there can be undone.
    refused(
        "a gpufabric label on a node without GPUs",
        nodes
            .patch(
                CPU_NODE,
                &pp,
                &merge(json!({"metadata": {"labels": {"gpufabric.io/result": "fail"}}})),
            )
            .await,
        "without GPUs",
    );
    refused(
        "a cordon of a node without GPUs",
        nodes
            .patch(
                CPU_NODE,
                &pp,
                &merge(json!({
                    "metadata": {"annotations": {"gpufabric.io/quarantine": record}},
                    "spec": {"unschedulable": true},
                })),
            )
            .await,
        "without GPUs",
    );
    refused(
        "its condition on a node without GPUs",
        nodes
            .patch_status(
                CPU_NODE,
                &pp,
                &Patch::Strategic(condition("GPUFabricDegraded", "True")),
            )
            .await,
        "without GPUs",
    );
    allowed(
        "removing its label from a node without GPUs",
        nodes
            .patch(
                CPU_NODE,
                &pp,
                &merge(json!({"metadata": {"labels": {"gpufabric.io/result": null}}})),
            )
            .await,
    );

    // Pods and Secrets in the pod namespace.
    let pods: Api<Pod> = Api::namespaced(sa.clone(), NS);
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let labels = json!({"gpufabric.io/run": "nightly-1", "gpufabric.io/test": "nightly",
        "gpufabric.io/node": GPU_NODE, "gpufabric.io/role": "node-check"});
    allowed(
        "a benchmark pod with its labels and owner",
        pods.create(&dry, &pod("nightly-1-gpu-1", labels.clone(), true))
            .await,
    );
    refused(
        "a pod without the run label",
        pods.create(&dry, &pod("squat", json!({"app": "x"}), true))
            .await,
        "carry the label gpufabric.io/run",
    );
    refused(
        "a pod no FabricTestRun controls",
        pods.create(&dry, &pod("orphan", labels.clone(), false))
            .await,
        "controlled by a FabricTestRun",
    );
    let secrets: Api<Secret> = Api::namespaced(sa.clone(), NS);
    allowed(
        "the rendezvous Secret",
        secrets
            .create(
                &dry,
                &secret(json!({"gpufabric.io/run": "nightly-1"}), true),
            )
            .await,
    );
    refused(
        "a Secret without the run label",
        secrets.create(&dry, &secret(json!({}), true)).await,
        "carry the label gpufabric.io/run",
    );
    // A person's pod in the namespace is not the operator's to delete.
    let theirs = pod("theirs", json!({"app": "x"}), false);
    Api::<Pod>::namespaced(admin.clone(), NS)
        .create(&PostParams::default(), &theirs)
        .await
        .expect("a person's pod");
    refused(
        "deleting a pod that is not a benchmark pod",
        pods.delete("theirs", &DeleteParams::default()).await,
        "carry the label gpufabric.io/run",
    );
    // A namespace that enforces no Pod Security level: no benchmark pod until it does.
    Api::<Namespace>::all(admin.clone())
        .patch(
            NS,
            &pp,
            &merge(json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": null}}})),
        )
        .await
        .expect("label removed");
    refused(
        "a pod in a namespace without Pod Security",
        pods.create(&dry, &pod("nightly-1-gpu-1", labels, true))
            .await,
        "enforces no Pod Security level",
    );

    // The policies bind the operator only: the admin changes what it likes.
    Api::<Node>::all(admin.clone())
        .patch(
            CPU_NODE,
            &pp,
            &merge(
                json!({"metadata": {"labels": {"team": "other"}}, "spec": {"unschedulable": true}}),
            ),
        )
        .await
        .expect("the admin is not bound by the operator's policies");
}
