//! A real node (containerd, kubelet v1.33, kube-proxy, kube-scheduler) on the local control
//! plane runs what the operator and its benchmark pods need: a pod shaped like a benchmark
//! pod with its termination message and log, deadlines, deletion, a Deployment behind a
//! ClusterIP Service, a pod calling the API server through `kubernetes.default`, and GPUs
//! advertised in the node's status. Needs root and the node binaries
//! (`tests/cluster/build-node.sh`); the tests share one node.

use gpufabric_tests::cluster::ClusterOptions;
use gpufabric_tests::realnode::{self, BUSYBOX_IMAGE, RealNode, RealNodeOptions};
use gpufabric_tests::shared::TestEnv;
use gpufabric_tests::wait;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::api::{Api, DeleteParams, LogParams, Patch, PatchParams, PostParams};
use std::time::Duration;

const T: Duration = Duration::from_secs(60);

/// This test's namespace on the binary's control plane (started for a real node), and the
/// binary's real node.
async fn env(name: &str) -> (TestEnv, &'static RealNode, Api<Pod>) {
    let (env, node) = realnode::shared_env(name).await;
    let pods = Api::namespaced(env.client(), env.ns());
    (env, node, pods)
}

/// A pod of the busybox test image on `node` running `script` with `sh -c`, never
/// restarted, from a JSON spec merged over the defaults.
fn pod(name: &str, node: &str, script: &str, extra: serde_json::Value) -> Pod {
    let mut doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", script],
            }],
        },
    });
    merge(&mut doc, extra);
    serde_json::from_value(doc).expect("a valid pod")
}

fn merge(base: &mut serde_json::Value, extra: serde_json::Value) {
    match (base, extra) {
        (serde_json::Value::Object(b), serde_json::Value::Object(e)) => {
            for (k, v) in e {
                merge(b.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (b, e) => *b = e,
    }
}

async fn create(pods: &Api<Pod>, pod: &Pod) {
    pods.create(&PostParams::default(), pod)
        .await
        .expect("pod created");
}

/// Waits until the pod has ended (Succeeded or Failed) and returns it.
async fn ended(pods: &Api<Pod>, name: &str) -> Pod {
    wait::for_object(pods, name, T, |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref())
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|ph| ph == "Succeeded" || ph == "Failed")
    })
    .await
    .expect("pod ends")
    .expect("pod exists")
}

fn phase(p: &Pod) -> (&str, &str) {
    let s = p.status.as_ref();
    (
        s.and_then(|s| s.phase.as_deref()).unwrap_or(""),
        s.and_then(|s| s.reason.as_deref()).unwrap_or(""),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_registers_ready_with_containerd() {
    let (env, node, _) = env("registers-ready").await;
    let n: Node = Api::all(env.client())
        .get(node.name())
        .await
        .expect("the node");
    let status = n.status.expect("status");
    let info = status.node_info.expect("node info");
    assert!(
        info.container_runtime_version.starts_with("containerd://"),
        "{}",
        info.container_runtime_version
    );
    assert_eq!(info.kubelet_version, "v1.33.13");
    let ready = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready condition");
    assert_eq!(ready.status, "True", "{ready:?}");
    let addresses = status.addresses.unwrap_or_default();
    assert!(
        addresses
            .iter()
            .any(|a| a.type_ == "InternalIP" && a.address == node.ip().to_string()),
        "{addresses:?}"
    );
}

/// The shape of the operator's benchmark pods (`operator::pods`): pinned, non-root,
/// no privilege escalation, no capabilities, the runtime's seccomp profile, a read-only
/// root, a memory-backed `/dev/shm` with a size limit, no API credentials, a deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn benchmark_shaped_pod_returns_its_termination_message_and_log() {
    let (_env, node, pods) = env("benchmark-pod").await;
    let script = "echo \"uid=$(id -u) shm=$(df -k /dev/shm | tail -1 | awk '{print $2}')\"; \
                  echo '{\"verdict\":\"passed\"}' > /dev/termination-log; echo done";
    let p = pod(
        "bench",
        node.name(),
        script,
        serde_json::json!({"spec": {
            "automountServiceAccountToken": false,
            "activeDeadlineSeconds": 120,
            "securityContext": {
                "runAsNonRoot": true,
                "runAsUser": 65532,
                "runAsGroup": 65532,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["/bin/sh", "-c", script],
                "terminationMessagePolicy": "File",
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "readOnlyRootFilesystem": true,
                    "capabilities": {"drop": ["ALL"]},
                },
                "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
            }],
            "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "64Mi"}}],
        }}),
    );
    create(&pods, &p).await;
    let done = ended(&pods, "bench").await;
    assert_eq!(phase(&done).0, "Succeeded", "{:?}", done.status);
    let terminated = done
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.first())
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.clone())
        .expect("terminated state");
    assert_eq!(terminated.exit_code, 0);
    assert_eq!(
        terminated.message.as_deref().map(str::trim),
        Some("{\"verdict\":\"passed\"}")
    );
    let log = pods
        .logs("bench", &LogParams::default())
        .await
        .expect("pods/log");
    assert!(log.contains("uid=65532 shm=65536"), "{log}");
    assert!(log.trim_end().ends_with("done"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_past_its_active_deadline_ends_deadline_exceeded() {
    let (_env, node, pods) = env("deadline").await;
    let p = pod(
        "late",
        node.name(),
        "sleep 600",
        serde_json::json!({"spec": {"activeDeadlineSeconds": 3}}),
    );
    create(&pods, &p).await;
    let done = ended(&pods, "late").await;
    assert_eq!(
        phase(&done),
        ("Failed", "DeadlineExceeded"),
        "{:?}",
        done.status
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_pod_goes_away() {
    let (_env, node, pods) = env("deletion").await;
    let p = pod(
        "doomed",
        node.name(),
        "trap 'exit 0' TERM; while :; do sleep 1; done",
        serde_json::json!({}),
    );
    create(&pods, &p).await;
    wait::for_object(&pods, "doomed", T, |p: Option<&Pod>| {
        p.is_some_and(|p| phase(p).0 == "Running")
    })
    .await
    .expect("pod runs");
    pods.delete("doomed", &DeleteParams::default())
        .await
        .expect("delete");
    wait::for_deletion(&pods, "doomed", T)
        .await
        .expect("the kubelet confirms the deletion");
}

/// An HTTP GET from this process (the host) to `ip:port`: the response, head and body.
async fn http_get(ip: &str, port: u16) -> std::io::Result<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::time::timeout(
        Duration::from_secs(3),
        tokio::net::TcpStream::connect((ip, port)),
    )
    .await??;
    s.write_all(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n").await?;
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(3), s.read_to_string(&mut out)).await??;
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployment_behind_a_cluster_ip_service_is_reachable_from_the_host() {
    let (env, node, _) = env("service").await;
    let labels = serde_json::json!({"app": "web"});
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    // Scheduled, not pinned: only the real node in this binary runs pods.
                    "nodeSelector": {"kubernetes.io/hostname": node.name()},
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "httpd",
                        "image": BUSYBOX_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["/bin/sh", "-c",
                            "mkdir -p /tmp/www && echo \"served by $HOSTNAME\" > /tmp/www/index.html \
                             && exec httpd -f -p 8080 -h /tmp/www"],
                        "ports": [{"containerPort": 8080}],
                    }],
                },
            },
        },
    }))
    .expect("a valid deployment");
    Api::<Deployment>::namespaced(env.client(), env.ns())
        .create(&PostParams::default(), &deployment)
        .await
        .expect("deployment created");
    let service: Service = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {"selector": labels, "ports": [{"port": 80, "targetPort": 8080}]},
    }))
    .expect("a valid service");
    let service = Api::<Service>::namespaced(env.client(), env.ns())
        .create(&PostParams::default(), &service)
        .await
        .expect("service created");
    let ip = service
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("a ClusterIP");
    let body = wait::poll(
        &format!("an HTTP answer from {ip}:80"),
        T,
        Duration::from_millis(500),
        || async {
            Ok(http_get(&ip, 80)
                .await
                .ok()
                .filter(|r| r.contains("200 OK")))
        },
    )
    .await
    .expect("the Service answers from the host");
    assert!(body.contains("served by web-"), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_reaches_the_api_server_through_the_kubernetes_service() {
    let (_env, node, pods) = env("in-cluster-api").await;
    let script = "set -e; sa=/var/run/secrets/kubernetes.io/serviceaccount; \
                  test -s $sa/ca.crt; \
                  echo \"host=$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT\"; \
                  wget -q -O- --no-check-certificate \
                    --header \"Authorization: Bearer $(cat $sa/token)\" \
                    https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/version";
    create(
        &pods,
        &pod("api-client", node.name(), script, serde_json::json!({})),
    )
    .await;
    let done = ended(&pods, "api-client").await;
    let log = pods
        .logs("api-client", &LogParams::default())
        .await
        .expect("pods/log");
    assert_eq!(phase(&done).0, "Succeeded", "{log}");
    assert!(log.contains("host=10.96.0.1:443"), "{log}");
    assert!(log.contains("\"gitVersion\": \"v1.33.13\""), "{log}");
}

/// The end-to-end test makes the real node a GPU node by patching its status, as a device
/// plugin's kubelet would report it; the kubelet keeps the resource and admits pods that
/// request it, and refuses one that asks for more than there is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpus_patched_into_node_status_admit_pods_that_request_them() {
    let (env, node, pods) = env("extended-resource").await;
    node.set_extended_resource("nvidia.com/gpu", 8)
        .await
        .expect("status patched");
    let nodes: Api<Node> = Api::all(env.client());
    nodes
        .patch(
            node.name(),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}})),
        )
        .await
        .expect("label patched");
    let gpus = |n: u32| {
        serde_json::json!({"spec": {"containers": [{
            "name": "main",
            "image": BUSYBOX_IMAGE,
            "imagePullPolicy": "Never",
            "command": ["/bin/sh", "-c", "echo ok"],
            "resources": {"limits": {"nvidia.com/gpu": n.to_string()}},
        }]}})
    };
    create(&pods, &pod("eight", node.name(), "", gpus(8))).await;
    create(&pods, &pod("nine", node.name(), "", gpus(9))).await;
    let eight = ended(&pods, "eight").await;
    assert_eq!(phase(&eight).0, "Succeeded", "{:?}", eight.status);
    let nine = ended(&pods, "nine").await;
    assert_eq!(
        phase(&nine),
        ("Failed", "OutOfnvidia.com/gpu"),
        "{:?}",
        nine.status
    );
    // The kubelet's own status updates (every 10 s) keep what was patched in.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let n = nodes.get(node.name()).await.expect("the node");
    let status = n.status.expect("status");
    for list in [status.capacity, status.allocatable] {
        assert_eq!(
            list.unwrap_or_default()
                .get("nvidia.com/gpu")
                .map(|q| q.0.as_str()),
            Some("8")
        );
    }
}

/// An image re-tagged in the node's containerd (as a push of a new tag would) runs under
/// its new reference without a registry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_tagged_anew_runs_under_its_new_reference() {
    let (_env, node, pods) = env("retag").await;
    let next = "docker.io/local/busybox:next";
    node.tag_image(BUSYBOX_IMAGE, next).expect("image tagged");
    assert!(node.images().expect("images").iter().any(|i| i == next));
    let mut p = pod(
        "retagged",
        node.name(),
        "echo from-next",
        serde_json::json!({}),
    );
    if let Some(c) = p.spec.as_mut().and_then(|s| s.containers.first_mut()) {
        c.image = Some("local/busybox:next".into());
    }
    create(&pods, &p).await;
    let done = ended(&pods, "retagged").await;
    assert_eq!(phase(&done).0, "Succeeded", "{:?}", done.status);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_node_binaries_fail_with_a_message_to_run_build_node_sh() {
    let env = TestEnv::with_options(
        "no-binaries",
        ClusterOptions {
            real_node: true,
            ..Default::default()
        },
    )
    .await
    .expect("control plane for a real node");
    let empty = tempfile::tempdir().expect("temp dir");
    let err = RealNode::start(
        env.cluster(),
        RealNodeOptions {
            bin_dir: Some(empty.path().to_path_buf()),
            ..Default::default()
        },
    )
    .await
    .expect_err("no binaries, no node");
    let msg = err.to_string();
    assert!(msg.contains("tests/cluster/build-node.sh"), "{msg}");
    assert!(msg.contains("GPUFABRIC_NODE_BIN"), "{msg}");
    assert!(msg.contains("kubelet"), "{msg}");
}
