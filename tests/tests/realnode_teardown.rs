//! Dropping a real node leaves nothing on the machine: no process, mount, network
//! namespace, bridge, iptables chain or pod cgroup of it, and no Node object. Its own
//! binary: the node of `tests/realnode.rs` lives until that binary exits, and one real
//! node runs on a machine at a time.

use gpufabric_tests::cluster::{Cluster, ClusterOptions};
use gpufabric_tests::process::processes_mentioning;
use gpufabric_tests::realnode::{BRIDGE, BUSYBOX_IMAGE, RealNode, RealNodeOptions};
use gpufabric_tests::wait;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use std::path::Path;
use std::time::Duration;

fn iptables_chains(tool: &str) -> Vec<String> {
    let out = std::process::Command::new(tool)
        .output()
        .expect("iptables-save runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix(':'))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| c.starts_with("KUBE-") || c.starts_with("CNI-"))
        .map(str::to_string)
        .collect()
}

fn mounts_under(dir: &Path) -> Vec<String> {
    let d = dir.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .filter(|p| p.starts_with(&d))
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_node_leaves_nothing_behind() {
    gpufabric_tests::init_tracing();
    let cluster = Cluster::start_with(ClusterOptions {
        real_node: true,
        install_crds: false,
        ..Default::default()
    })
    .await
    .expect("control plane for a real node");
    cluster
        .create_namespace("teardown")
        .await
        .expect("namespace");
    let node = RealNode::start(
        &cluster,
        RealNodeOptions {
            keep_dir: false,
            ..Default::default()
        },
    )
    .await
    .expect("real node starts (needs root and tests/cluster/build-node.sh)");
    let dir = node.dir().to_path_buf();
    let name = node.name().to_string();

    // A running pod with the mounts a benchmark pod has: a memory-backed emptyDir and
    // the ServiceAccount token's projected volume; its own network namespace.
    let pods: Api<Pod> = Api::namespaced(cluster.client(), "teardown");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "running"},
        "spec": {
            "nodeName": name,
            "containers": [{"name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                "command": ["sleep", "86413"],
                "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}]}],
            "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}}],
        },
    }))
    .expect("a valid pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("pod created");
    wait::for_object(
        &pods,
        "running",
        Duration::from_secs(60),
        |p: Option<&Pod>| {
            p.and_then(|p| p.status.as_ref())
                .and_then(|s| s.phase.as_deref())
                .is_some_and(|ph| ph == "Running")
        },
    )
    .await
    .expect("pod runs");
    assert!(!mounts_under(&dir).is_empty(), "the node mounted nothing?");
    assert!(Path::new("/sys/class/net").join(BRIDGE).exists());
    assert!(!iptables_chains("iptables-save").is_empty());

    drop(node);

    let needle = dir.display().to_string();
    assert_eq!(processes_mentioning(&needle), Vec::new());
    assert_eq!(processes_mentioning("sleep 86413"), Vec::new());
    assert_eq!(mounts_under(&dir), Vec::<String>::new());
    assert!(!dir.exists(), "{} is still there", dir.display());
    assert!(!Path::new("/sys/class/net").join(BRIDGE).exists());
    assert_eq!(iptables_chains("iptables-save"), Vec::<String>::new());
    assert_eq!(iptables_chains("ip6tables-save"), Vec::<String>::new());
    let cgroups: Vec<String> = std::fs::read_dir("/sys/fs/cgroup")
        .map(|entries| {
            entries
                .flatten()
                .map(|e| e.path().join("gpufabric-realnode"))
                .filter(|p| p.exists())
                .map(|p| p.display().to_string())
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(cgroups, Vec::<String>::new());
    let veths: Vec<String> = std::fs::read_dir("/sys/class/net")
        .map(|e| {
            e.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("veth"))
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(veths, Vec::<String>::new());
    let cni_results: Vec<String> = std::fs::read_dir("/var/lib/cni/results")
        .map(|e| {
            e.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("gpufabric-"))
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(cni_results, Vec::<String>::new());
    let nodes: Api<Node> = Api::all(cluster.client());
    assert!(nodes.get_opt(&name).await.expect("read nodes").is_none());
}
