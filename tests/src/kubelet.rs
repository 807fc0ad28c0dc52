//! The process-kubelet: registers simulated GPU nodes and runs the pods bound to them as
//! local processes, writing node and pod status as a kubelet does.
//!
//! It is as much of a kubelet as the benchmark pods need:
//! - **Nodes**: one Node per fleet node, with `nvidia.com/gpu` (plus cpu, memory, pods)
//!   capacity and allocatable, the labels `nvidia.com/gpu.product`, `nvidia.com/gpu.count`,
//!   `kubernetes.io/hostname` and the fleet's own, a Ready condition, a Lease heartbeat in
//!   `kube-node-lease` and periodic status updates (so the node lifecycle controller keeps
//!   them Ready). A test can make a node NotReady ([`Kubelet::set_node_ready`]) or remove it
//!   ([`Kubelet::remove_node`]).
//! - **Pods** bound to those nodes by `spec.nodeName` (there is no scheduler): the first
//!   container's `command` + `args` (with `$(VAR)` expansion) run as a local process in its
//!   own process group, with the container's env (literal values, and downward-API
//!   `fieldRef` for `spec.nodeName`, `metadata.name`, `metadata.namespace`, `metadata.uid`,
//!   `status.podIP`, `status.hostIP`, `spec.serviceAccountName`), plus
//!   `FABRIC_TERMINATION_LOG=<pod dir>/termination-log` (instead of `/dev/termination-log`),
//!   `FABRIC_SIM_FLEET=<fleet file>`, and a `PATH` that starts with
//!   [`KubeletOptions::agent_bin_dir`]. A container without `command` runs
//!   [`KubeletOptions::default_command`] (the image's entrypoint, `fabric-agent`); an
//!   absolute program path that does not exist here is looked up by its file name on `PATH`.
//! - **Status**: Running with a distinct pod IP (`127.x.y.z`), container `running`; then
//!   Succeeded or Failed with the exit code (128 + signal when killed), reason
//!   `Completed`/`Error`, and the termination message read from the file (first 4096
//!   bytes; `FallbackToLogsOnError` uses the log tail); a program that cannot start ends
//!   Failed with exit code 128 and reason `StartError`.
//! - **`activeDeadlineSeconds`**: the process is killed; phase Failed, reason
//!   `DeadlineExceeded`, as the kubelet does.
//! - **Deletion**: on a `deletionTimestamp` (a graceful delete, also the garbage
//!   collector's) the process group gets SIGTERM, then SIGKILL after the pod's grace period
//!   (capped by [`KubeletOptions::max_grace`]); then the deletion is confirmed with
//!   `gracePeriodSeconds: 0`, as a real kubelet must, or the pod stays forever.
//!
//! What it does not do: images (nothing is pulled; the image name is only reported),
//! containers other than the first, init containers, restarts (every pod behaves as
//! `restartPolicy: Never`), probes, volumes and mounts, resource limits, cgroups or
//! namespaces (processes share the host's network: a pod IP is a loopback address the
//! process may bind to, not an isolated stack), admission (it does not check requested
//! GPUs against the node or taints against tolerations), `kubectl logs`/`exec` (logs are
//! in [`Kubelet::pod_log_path`]), evictions, static pods, node-pressure conditions and
//! env from secrets or config maps (such a pod fails with `CreateContainerConfigError`).

use crate::fleet::SimFleet;
use crate::process::signal_group;
use crate::{Error, Result, kube_err};
use futures::StreamExt;
use gpufabric_api::keys;
use gpufabric_measure::fleet::{Fleet, FleetNode};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::{WatchStreamExt, watcher};
use nix::sys::signal::Signal;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Field manager of everything the process-kubelet writes.
pub const MANAGER: &str = "fabric-kubelet";
/// Env var: overrides the default [`KubeletOptions::agent_bin_dir`].
pub const ENV_AGENT_BIN_DIR: &str = "GPUFABRIC_AGENT_BIN_DIR";
/// Label on every simulated node.
pub const LABEL_SIMULATED: &str = "gpufabric.io/simulated";
/// Kubelet version the nodes report.
pub const KUBELET_VERSION: &str = "v1.33.0-process";

const NODE_LEASE_NS: &str = "kube-node-lease";
const LEASE_SECONDS: i32 = 40;
const TERMINATION_LOG_FILE: &str = "termination-log";
const LOG_FILE: &str = "container.log";
/// Tries of a pod status write or deletion confirmation before giving up.
const WRITE_ATTEMPTS: u32 = 5;
/// Kubelet's limit on a termination message taken from the log tail.
const FALLBACK_LOG_BYTES: usize = 2048;
const FALLBACK_LOG_LINES: usize = 80;

/// How the process-kubelet runs.
#[derive(Debug, Clone)]
pub struct KubeletOptions {
    /// Directory put first on each pod's `PATH`, where `fabric-agent` is found. Default:
    /// `$GPUFABRIC_AGENT_BIN_DIR`, else the cargo target dir of the running executable
    /// (`target/debug` for a test binary in `target/debug/deps` or a binary in
    /// `target/debug`): build the agent first with `cargo build -p gpufabric-agent`.
    pub agent_bin_dir: PathBuf,
    /// Where pod dirs (termination message, log, working dir) go. Default: a temp dir
    /// removed when the kubelet is dropped.
    pub root_dir: Option<PathBuf>,
    /// Program (and leading args) run for a container without `command`: the image's
    /// entrypoint. Default: `["fabric-agent"]`.
    pub default_command: Vec<String>,
    /// Lease renewal interval. Default: 10 s (a kubelet's default).
    pub heartbeat: Duration,
    /// Interval of the Ready condition refresh (node status). Default: 30 s.
    pub status_interval: Duration,
    /// Longest SIGTERM grace period given to a deleted pod before SIGKILL. Default: 5 s.
    pub max_grace: Duration,
    /// Extra env for every pod process (e.g. `RUST_LOG`); the pod's own env wins.
    pub extra_env: BTreeMap<String, String>,
    /// Node resources besides GPUs: cpu cores, memory (a quantity) and pods.
    pub cpu: String,
    pub memory: String,
    pub max_pods: String,
}

/// The default agent dir: `$GPUFABRIC_AGENT_BIN_DIR`, else the target dir of the current
/// executable (its dir, or the parent of a `deps` dir).
pub fn default_agent_bin_dir() -> PathBuf {
    if let Some(d) = std::env::var_os(ENV_AGENT_BIN_DIR).filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    let dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().map(Path::to_path_buf).unwrap_or(dir)
    } else {
        dir
    }
}

impl Default for KubeletOptions {
    fn default() -> Self {
        KubeletOptions {
            agent_bin_dir: default_agent_bin_dir(),
            root_dir: None,
            default_command: vec!["fabric-agent".to_string()],
            heartbeat: Duration::from_secs(10),
            status_interval: Duration::from_secs(30),
            max_grace: Duration::from_secs(5),
            extra_env: BTreeMap::new(),
            cpu: "64".to_string(),
            memory: "1Ti".to_string(),
            max_pods: "110".to_string(),
        }
    }
}

#[derive(Debug, Clone)]
struct NodeState {
    spec: FleetNode,
    ready: bool,
    removed: bool,
    ready_since: String,
}

/// Why a pod's process must stop.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Stop {
    Run,
    /// The pod has a deletionTimestamp: kill, then confirm the deletion.
    Deleted {
        grace_seconds: i64,
    },
    /// The pod object is gone, its node removed, or the kubelet stops: kill, write nothing.
    Abandon,
}

struct PodHandle {
    node: String,
    namespace: String,
    name: String,
    stop: watch::Sender<Stop>,
    pid: Arc<AtomicU32>,
}

struct Inner {
    client: Client,
    fleet_path: PathBuf,
    opts: KubeletOptions,
    root: PathBuf,
    nodes: Mutex<BTreeMap<String, NodeState>>,
    pods: Mutex<HashMap<String, PodHandle>>,
    next_ip: AtomicU32,
    ip_base: u8,
}

/// A running process-kubelet. Dropping it stops its tasks and kills every pod process.
pub struct Kubelet {
    inner: Arc<Inner>,
    tasks: Vec<JoinHandle<()>>,
    _root: Option<tempfile::TempDir>,
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn now_micro() -> String {
    chrono::Utc::now()
        .format("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Kubelet {
    /// Registers every node of `fleet` (Node objects with Ready status and Leases) and
    /// starts the heartbeat and the pod watch.
    pub async fn start(client: Client, fleet: &SimFleet, opts: KubeletOptions) -> Result<Kubelet> {
        Kubelet::start_fleet(client, fleet.fleet().clone(), fleet.path(), opts).await
    }

    /// [`Kubelet::start`] from a fleet description and the path of its file.
    pub async fn start_fleet(
        client: Client,
        fleet: Fleet,
        fleet_path: &Path,
        opts: KubeletOptions,
    ) -> Result<Kubelet> {
        let (root, tmp) = match &opts.root_dir {
            Some(d) => {
                std::fs::create_dir_all(d)
                    .map_err(crate::io_err(format!("creating {}", d.display())))?;
                (d.clone(), None)
            }
            None => {
                let t = tempfile::Builder::new()
                    .prefix("gpufabric-kubelet-")
                    .tempdir()
                    .map_err(crate::io_err("creating the kubelet dir"))?;
                (t.path().to_path_buf(), Some(t))
            }
        };
        let t = now();
        let nodes = fleet
            .nodes
            .iter()
            .map(|n| {
                (
                    n.name.clone(),
                    NodeState {
                        spec: n.clone(),
                        ready: true,
                        removed: false,
                        ready_since: t.clone(),
                    },
                )
            })
            .collect();
        let inner = Arc::new(Inner {
            client,
            fleet_path: std::path::absolute(fleet_path).unwrap_or(fleet_path.to_path_buf()),
            opts,
            root,
            nodes: Mutex::new(nodes),
            pods: Mutex::new(HashMap::new()),
            next_ip: AtomicU32::new(1),
            ip_base: rand::random_range(16..=250),
        });
        for node in fleet.nodes.iter() {
            inner.register_node(node).await?;
        }
        tracing::info!(
            nodes = fleet.nodes.len(),
            "process-kubelet registered the fleet"
        );
        let hb = tokio::spawn(heartbeat_loop(inner.clone()));
        let pw = tokio::spawn(pod_watch_loop(inner.clone()));
        Ok(Kubelet {
            inner,
            tasks: vec![hb, pw],
            _root: tmp,
        })
    }

    /// Names of the nodes this kubelet runs (removed ones excluded).
    pub fn node_names(&self) -> Vec<String> {
        lock(&self.inner.nodes)
            .values()
            .filter(|n| !n.removed)
            .map(|n| n.spec.name.clone())
            .collect()
    }

    /// Makes a node Ready or NotReady now: writes the Ready condition, and stops (or
    /// resumes) its Lease heartbeat. Its pods keep running.
    pub async fn set_node_ready(&self, node: &str, ready: bool) -> Result<()> {
        {
            let mut nodes = lock(&self.inner.nodes);
            let st = nodes
                .get_mut(node)
                .filter(|s| !s.removed)
                .ok_or_else(|| Error::Invalid(format!("no node {node} in this kubelet")))?;
            if st.ready != ready {
                st.ready = ready;
                st.ready_since = now();
            }
        }
        self.inner.patch_node_status(node).await
    }

    /// Removes a node: kills its pods (without writing their status) and deletes its
    /// Node and Lease objects.
    pub async fn remove_node(&self, node: &str) -> Result<()> {
        {
            let mut nodes = lock(&self.inner.nodes);
            let st = nodes
                .get_mut(node)
                .ok_or_else(|| Error::Invalid(format!("no node {node} in this kubelet")))?;
            st.removed = true;
        }
        for h in lock(&self.inner.pods).values().filter(|h| h.node == node) {
            let _ = h.stop.send(Stop::Abandon);
        }
        let nodes: Api<Node> = Api::all(self.inner.client.clone());
        ignore_not_found(nodes.delete(node, &DeleteParams::default()).await)
            .map_err(kube_err(format!("deleting node {node}")))?;
        let leases: Api<Lease> = Api::namespaced(self.inner.client.clone(), NODE_LEASE_NS);
        ignore_not_found(leases.delete(node, &DeleteParams::default()).await)
            .map_err(kube_err(format!("deleting the lease of {node}")))?;
        Ok(())
    }

    /// Pid of the process of a pod (leader of its process group), while it runs.
    pub fn pod_pid(&self, namespace: &str, name: &str) -> Option<u32> {
        lock(&self.inner.pods)
            .values()
            .find(|h| h.namespace == namespace && h.name == name)
            .map(|h| h.pid.load(Ordering::SeqCst))
            .filter(|p| *p != 0)
    }

    /// The dir of a pod (working dir, termination message, log).
    pub fn pod_dir(&self, namespace: &str, name: &str) -> PathBuf {
        self.inner.root.join(format!("{namespace}_{name}"))
    }

    /// The combined stdout and stderr of a pod's process.
    pub fn pod_log_path(&self, namespace: &str, name: &str) -> PathBuf {
        self.pod_dir(namespace, name).join(LOG_FILE)
    }

    /// Where the pod dirs are ([`KubeletOptions::root_dir`] or the temp dir).
    pub fn root_dir(&self) -> &Path {
        &self.inner.root
    }

    /// The fleet file every pod gets as `FABRIC_SIM_FLEET`.
    pub fn fleet_path(&self) -> &Path {
        &self.inner.fleet_path
    }

    /// Stops the kubelet: the watch and heartbeat end and every pod process is killed.
    /// Node objects stay (as with a kubelet that stops).
    pub fn shutdown(&mut self) {
        for t in self.tasks.drain(..) {
            t.abort();
        }
        for h in lock(&self.inner.pods).values() {
            let _ = h.stop.send(Stop::Abandon);
            let pid = h.pid.load(Ordering::SeqCst);
            if pid != 0 {
                signal_group(pid, Signal::SIGKILL);
            }
        }
    }
}

impl Drop for Kubelet {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn ignore_not_found<T>(r: kube::Result<T>) -> kube::Result<()> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

impl Inner {
    async fn register_node(&self, n: &FleetNode) -> Result<()> {
        let mut labels: BTreeMap<String, String> = n.labels.clone();
        labels.insert("kubernetes.io/hostname".into(), n.name.clone());
        labels.insert("kubernetes.io/os".into(), "linux".into());
        labels.insert("kubernetes.io/arch".into(), "amd64".into());
        labels.insert(keys::LABEL_GPU_PRODUCT.into(), n.product.clone());
        labels.insert(keys::LABEL_GPU_COUNT.into(), n.gpus.to_string());
        labels.insert(LABEL_SIMULATED.into(), "true".into());
        let obj = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": n.name,
                "labels": labels,
                "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            },
        });
        let nodes: Api<Node> = Api::all(self.client.clone());
        nodes
            .patch(
                &n.name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(obj),
            )
            .await
            .map_err(kube_err(format!("registering node {}", n.name)))?;
        self.patch_node_status(&n.name).await?;
        self.renew_lease(&n.name).await
    }

    fn node_status(&self, st: &NodeState) -> Value {
        let t = now();
        let gpus = st.spec.gpus.to_string();
        let resources = json!({
            "cpu": self.opts.cpu,
            "memory": self.opts.memory,
            "pods": self.opts.max_pods,
            "ephemeral-storage": "1Ti",
            keys::RESOURCE_GPU: gpus,
        });
        let cond = |type_: &str, status: &str, reason: &str, message: &str, since: &str| {
            json!({"type": type_, "status": status, "reason": reason, "message": message,
                   "lastHeartbeatTime": t, "lastTransitionTime": since})
        };
        let ready = if st.ready {
            cond(
                "Ready",
                "True",
                "KubeletReady",
                "kubelet is posting ready status",
                &st.ready_since,
            )
        } else {
            cond(
                "Ready",
                "False",
                "KubeletNotReady",
                "node made NotReady by the test",
                &st.ready_since,
            )
        };
        json!({"status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available", &st.ready_since),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure", &st.ready_since),
                cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available", &st.ready_since),
                ready,
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": st.spec.name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {
                "machineID": st.spec.name, "systemUUID": st.spec.name, "bootID": st.spec.name,
                "kernelVersion": "", "osImage": "gpufabric process-kubelet",
                "containerRuntimeVersion": "process://", "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64",
            },
        }})
    }

    async fn patch_node_status(&self, node: &str) -> Result<()> {
        let status = {
            let nodes = lock(&self.nodes);
            match nodes.get(node) {
                Some(st) if !st.removed => self.node_status(st),
                _ => return Ok(()),
            }
        };
        let nodes: Api<Node> = Api::all(self.client.clone());
        nodes
            .patch_status(node, &PatchParams::default(), &Patch::Merge(status))
            .await
            .map_err(kube_err(format!("writing the status of node {node}")))?;
        Ok(())
    }

    async fn renew_lease(&self, node: &str) -> Result<()> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let uid = nodes
            .get_opt(node)
            .await
            .map_err(kube_err(format!("reading node {node}")))?
            .and_then(|n| n.metadata.uid);
        let mut meta = json!({"name": node, "namespace": NODE_LEASE_NS});
        if let Some(uid) = uid {
            meta["ownerReferences"] =
                json!([{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}]);
        }
        let lease = json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {
                "holderIdentity": node,
                "leaseDurationSeconds": LEASE_SECONDS,
                "renewTime": now_micro(),
            },
        });
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), NODE_LEASE_NS);
        leases
            .patch(
                node,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(lease),
            )
            .await
            .map_err(kube_err(format!("renewing the lease of node {node}")))?;
        Ok(())
    }

    fn live_node(&self, node: &str) -> bool {
        lock(&self.nodes).get(node).is_some_and(|n| !n.removed)
    }

    fn next_pod_ip(&self) -> String {
        let n = self.next_ip.fetch_add(1, Ordering::SeqCst);
        format!("127.{}.{}.{}", self.ip_base, (n >> 8) & 0xff, n & 0xff)
    }
}

async fn heartbeat_loop(inner: Arc<Inner>) {
    let mut since_status = Duration::ZERO;
    loop {
        tokio::time::sleep(inner.opts.heartbeat).await;
        since_status += inner.opts.heartbeat;
        let refresh_status = since_status >= inner.opts.status_interval;
        if refresh_status {
            since_status = Duration::ZERO;
        }
        let names: Vec<(String, bool)> = lock(&inner.nodes)
            .values()
            .filter(|n| !n.removed)
            .map(|n| (n.spec.name.clone(), n.ready))
            .collect();
        for (name, ready) in names {
            if ready && let Err(e) = inner.renew_lease(&name).await {
                tracing::warn!(node = %name, error = %e, "lease renewal failed");
            }
            if refresh_status && let Err(e) = inner.patch_node_status(&name).await {
                tracing::warn!(node = %name, error = %e, "node status update failed");
            }
        }
    }
}

async fn pod_watch_loop(inner: Arc<Inner>) {
    let api: Api<Pod> = Api::all(inner.client.clone());
    let cfg = watcher::Config::default().fields("spec.nodeName!=");
    let mut stream = watcher(api, cfg).default_backoff().boxed();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => on_pod(&inner, pod),
            Ok(watcher::Event::Delete(pod)) => {
                let uid = pod.metadata.uid.unwrap_or_default();
                if let Some(h) = lock(&inner.pods).get(&uid) {
                    let _ = h.stop.send(Stop::Abandon);
                }
            }
            Ok(watcher::Event::Init | watcher::Event::InitDone) => {}
            Err(e) => tracing::warn!(error = %e, "pod watch error (retrying)"),
        }
    }
}

fn on_pod(inner: &Arc<Inner>, pod: Pod) {
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    if !inner.live_node(&node) {
        return;
    }
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let deleting = pod.metadata.deletion_timestamp.is_some();
    let grace_seconds = pod.metadata.deletion_grace_period_seconds.unwrap_or(0);
    let phase = pod
        .status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default();
    let mut pods = lock(&inner.pods);
    if let Some(h) = pods.get(&uid) {
        if deleting {
            h.stop.send_if_modified(|s| {
                if *s == Stop::Run {
                    *s = Stop::Deleted { grace_seconds };
                    true
                } else {
                    false
                }
            });
        }
        return;
    }
    if deleting || phase == "Succeeded" || phase == "Failed" {
        // Not ours to run (finished before this kubelet started, or deleted before it
        // ran): a deletion still needs its confirmation.
        if deleting {
            let client = inner.client.clone();
            tokio::spawn(async move { confirm_deletion(&client, &namespace, &name, &uid).await });
        }
        return;
    }
    let (tx, rx) = watch::channel(Stop::Run);
    let pid = Arc::new(AtomicU32::new(0));
    pods.insert(
        uid.clone(),
        PodHandle {
            node,
            namespace,
            name,
            stop: tx,
            pid: pid.clone(),
        },
    );
    let inner = inner.clone();
    tokio::spawn(async move {
        run_pod(&inner, pod, rx, pid).await;
        lock(&inner.pods).remove(&uid);
    });
}

async fn confirm_deletion(client: &Client, namespace: &str, name: &str, uid: &str) {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..Default::default()
    };
    for attempt in 1..=WRITE_ATTEMPTS {
        match api.delete(name, &dp).await {
            Ok(_) => {
                tracing::debug!(pod = %format!("{namespace}/{name}"), "deletion confirmed");
                return;
            }
            // Gone already, or another object of that name: nothing to confirm.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => return,
            Err(e) => {
                tracing::warn!(pod = %format!("{namespace}/{name}"), attempt, error = %e, "confirming the deletion failed")
            }
        }
        tokio::time::sleep(Duration::from_millis(200) * attempt).await;
    }
}

/// What the process of a pod is, once resolved from its spec.
struct Launch {
    program: PathBuf,
    args: Vec<String>,
    env: BTreeMap<String, String>,
    container: String,
    image: String,
    fallback_to_logs: bool,
}

#[derive(Debug)]
enum LaunchError {
    /// Env the process-kubelet cannot provide.
    Config(String),
    /// The program cannot be found or started.
    Start(String),
}

/// Expands `$(VAR)` from `env` as the kubelet does; `$$(VAR)` stays literal `$(VAR)`, and
/// unknown references are left as they are.
pub fn expand(s: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('(') {
            match body.find(')') {
                Some(j) => {
                    let var = &body[..j];
                    match env.get(var) {
                        Some(v) => out.push_str(v),
                        None => {
                            out.push_str("$(");
                            out.push_str(var);
                            out.push(')');
                        }
                    }
                    rest = &body[j + 1..];
                }
                None => {
                    out.push('$');
                    rest = after;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

fn field_ref(pod: &Pod, path: &str, pod_ip: &str) -> Option<String> {
    let spec = pod.spec.as_ref();
    match path {
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()),
        "metadata.name" => pod.metadata.name.clone(),
        "metadata.namespace" => pod.metadata.namespace.clone(),
        "metadata.uid" => pod.metadata.uid.clone(),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()),
        "status.podIP" => Some(pod_ip.to_string()),
        "status.hostIP" => Some("127.0.0.1".to_string()),
        _ => None,
    }
}

impl Inner {
    fn resolve(&self, pod: &Pod, pod_dir: &Path, pod_ip: &str) -> Result<Launch, LaunchError> {
        let spec = pod
            .spec
            .as_ref()
            .ok_or_else(|| LaunchError::Config("pod has no spec".into()))?;
        let c = spec
            .containers
            .first()
            .ok_or_else(|| LaunchError::Config("pod has no containers".into()))?;
        let host_path = std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into());
        let path = format!("{}:{host_path}", self.opts.agent_bin_dir.display());
        let mut env: BTreeMap<String, String> = self.opts.extra_env.clone();
        env.insert("PATH".into(), path.clone());
        env.insert("HOME".into(), pod_dir.display().to_string());
        env.insert(
            "HOSTNAME".into(),
            pod.metadata.name.clone().unwrap_or_default(),
        );
        for e in c.env.iter().flatten() {
            let value = match (&e.value, &e.value_from) {
                (_, Some(from)) => match &from.field_ref {
                    Some(f) => field_ref(pod, &f.field_path, pod_ip).ok_or_else(|| {
                        LaunchError::Config(format!(
                            "env {}: fieldRef {} is not supported by the process-kubelet",
                            e.name, f.field_path
                        ))
                    })?,
                    None => {
                        return Err(LaunchError::Config(format!(
                            "env {}: only literal values and fieldRef are supported by the process-kubelet",
                            e.name
                        )));
                    }
                },
                (Some(v), None) => expand(v, &env),
                (None, None) => String::new(),
            };
            env.insert(e.name.clone(), value);
        }
        env.insert(
            keys::ENV_TERMINATION_LOG.into(),
            pod_dir.join(TERMINATION_LOG_FILE).display().to_string(),
        );
        env.insert(
            keys::ENV_SIM_FLEET.into(),
            self.fleet_path.display().to_string(),
        );
        let mut argv: Vec<String> = match &c.command {
            Some(cmd) if !cmd.is_empty() => cmd.iter().map(|a| expand(a, &env)).collect(),
            _ => self.opts.default_command.clone(),
        };
        argv.extend(c.args.iter().flatten().map(|a| expand(a, &env)));
        let Some((program, args)) = argv.split_first() else {
            return Err(LaunchError::Start("no command to run".into()));
        };
        let program = find_program(program, &path).ok_or_else(|| {
            LaunchError::Start(format!(
                "executable {program:?} not found in PATH ({path}); for fabric-agent run `cargo build -p gpufabric-agent` \
                 or set {ENV_AGENT_BIN_DIR}"
            ))
        })?;
        Ok(Launch {
            program,
            args: args.to_vec(),
            env,
            container: c.name.clone(),
            image: c.image.clone().unwrap_or_default(),
            fallback_to_logs: c.termination_message_policy.as_deref()
                == Some("FallbackToLogsOnError"),
        })
    }
}

/// Finds `program` as the kubelet's container would: a path containing `/` as is (or, if
/// absent on this host, its file name on `PATH`), else the first match on `PATH`.
fn find_program(program: &str, path: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let exec = |p: &Path| {
        p.metadata()
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let name = if program.contains('/') {
        let p = PathBuf::from(program);
        if exec(&p) {
            return Some(p);
        }
        p.file_name()?.to_string_lossy().to_string()
    } else {
        program.to_string()
    };
    path.split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(&name))
        .find(|p| exec(p))
}

/// Reads the termination message as the kubelet does: the first 4096 bytes of the file;
/// with `FallbackToLogsOnError` and an empty file after a failure, the log tail.
fn termination_message(pod_dir: &Path, failed: bool, fallback: bool) -> String {
    use std::io::Read;
    let mut buf = Vec::new();
    if let Ok(f) = std::fs::File::open(pod_dir.join(TERMINATION_LOG_FILE)) {
        let _ = f
            .take(keys::TERMINATION_MESSAGE_LIMIT as u64)
            .read_to_end(&mut buf);
    }
    let msg = String::from_utf8_lossy(&buf).to_string();
    if msg.is_empty() && failed && fallback {
        let tail = crate::cluster::log_tail(&pod_dir.join(LOG_FILE), FALLBACK_LOG_LINES);
        let start = tail.len().saturating_sub(FALLBACK_LOG_BYTES);
        let start = (start..tail.len())
            .find(|i| tail.is_char_boundary(*i))
            .unwrap_or(tail.len());
        return tail[start..].to_string();
    }
    msg
}

struct PodStatus<'a> {
    phase: &'a str,
    reason: Option<&'a str>,
    message: Option<String>,
    pod_ip: &'a str,
    start_time: &'a str,
    container: Value,
}

fn status_patch(s: PodStatus<'_>) -> Value {
    let t = now();
    let running = s.phase == "Running";
    let (ready, ready_reason) = if running {
        ("True", None)
    } else {
        ("False", Some("PodCompleted"))
    };
    let cond = |type_: &str, status: &str, reason: Option<&str>| {
        let mut c = json!({"type": type_, "status": status, "lastTransitionTime": t, "lastProbeTime": null});
        if let Some(r) = reason {
            c["reason"] = json!(r);
        }
        c
    };
    let mut status = json!({
        "phase": s.phase,
        "hostIP": "127.0.0.1",
        "hostIPs": [{"ip": "127.0.0.1"}],
        "podIP": s.pod_ip,
        "podIPs": [{"ip": s.pod_ip}],
        "startTime": s.start_time,
        "qosClass": "BestEffort",
        "conditions": [
            cond("PodReadyToStartContainers", "True", None),
            cond("Initialized", "True", None),
            cond("Ready", ready, ready_reason),
            cond("ContainersReady", ready, ready_reason),
            cond("PodScheduled", "True", None),
        ],
        "containerStatuses": [s.container],
        "reason": s.reason,
        "message": s.message,
    });
    if s.pod_ip.is_empty() {
        status["podIP"] = Value::Null;
        status["podIPs"] = Value::Null;
    }
    json!({ "status": status })
}

async fn write_status(api: &Api<Pod>, name: &str, patch: Value) {
    for attempt in 1..=WRITE_ATTEMPTS {
        match api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(patch.clone()))
            .await
        {
            Ok(_) => return,
            // The pod is gone, or the server refuses this status: retrying cannot help.
            Err(kube::Error::Api(s)) if s.code == 404 || s.code == 422 => {
                tracing::warn!(pod = %name, error = %s.message, "pod status not written");
                return;
            }
            Err(e) => {
                tracing::warn!(pod = %name, attempt, error = %e, "writing the pod status failed")
            }
        }
        tokio::time::sleep(Duration::from_millis(200) * attempt).await;
    }
}

async fn run_pod(
    inner: &Arc<Inner>,
    pod: Pod,
    mut stop: watch::Receiver<Stop>,
    pid_slot: Arc<AtomicU32>,
) {
    let namespace = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(inner.client.clone(), &namespace);
    let pod_dir = inner.root.join(format!("{namespace}_{name}"));
    let _ = std::fs::remove_dir_all(&pod_dir);
    if let Err(e) = std::fs::create_dir_all(&pod_dir) {
        tracing::warn!(pod = %name, error = %e, "cannot create the pod dir");
        return;
    }
    let pod_ip = inner.next_pod_ip();
    let start_time = now();
    let deadline = pod
        .spec
        .as_ref()
        .and_then(|s| s.active_deadline_seconds)
        .and_then(|s| u64::try_from(s).ok())
        .map(Duration::from_secs);
    let container_name = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .map(|c| c.name.clone())
        .unwrap_or_default();
    let failed_to_launch = |reason: &str, exit: Option<i32>, message: String| {
        let state = match exit {
            Some(code) => {
                json!({"terminated": {"exitCode": code, "reason": reason, "message": message,
                                 "startedAt": start_time, "finishedAt": now()}})
            }
            None => json!({"waiting": {"reason": reason, "message": message}}),
        };
        status_patch(PodStatus {
            phase: "Failed",
            reason: None,
            message: Some(message.clone()),
            pod_ip: "",
            start_time: &start_time,
            container: json!({"name": container_name, "image": "", "imageID": "", "ready": false,
                              "started": false, "restartCount": 0, "state": state}),
        })
    };
    let launch = match inner.resolve(&pod, &pod_dir, &pod_ip) {
        Ok(l) => l,
        Err(LaunchError::Config(msg)) => {
            write_status(
                &api,
                &name,
                failed_to_launch("CreateContainerConfigError", None, msg),
            )
            .await;
            return wait_for_deletion(inner, stop, &namespace, &name, &uid).await;
        }
        Err(LaunchError::Start(msg)) => {
            write_status(&api, &name, failed_to_launch("StartError", Some(128), msg)).await;
            return wait_for_deletion(inner, stop, &namespace, &name, &uid).await;
        }
    };
    let log = match std::fs::File::create(pod_dir.join(LOG_FILE)) {
        Ok(f) => f,
        Err(e) => {
            write_status(
                &api,
                &name,
                failed_to_launch("StartError", Some(128), e.to_string()),
            )
            .await;
            return wait_for_deletion(inner, stop, &namespace, &name, &uid).await;
        }
    };
    let mut cmd = std::process::Command::new(&launch.program);
    cmd.args(&launch.args)
        .env_clear()
        .envs(&launch.env)
        .current_dir(&pod_dir)
        .stdin(std::process::Stdio::null())
        .stdout(
            log.try_clone()
                .map(std::process::Stdio::from)
                .unwrap_or(std::process::Stdio::null()),
        )
        .stderr(log);
    crate::process::harden(&mut cmd);
    let mut child = match tokio::process::Command::from(cmd).spawn() {
        Ok(c) => c,
        Err(e) => {
            let msg = format!("starting {}: {e}", launch.program.display());
            write_status(&api, &name, failed_to_launch("StartError", Some(128), msg)).await;
            return wait_for_deletion(inner, stop, &namespace, &name, &uid).await;
        }
    };
    let pid = child.id().unwrap_or(0);
    pid_slot.store(pid, Ordering::SeqCst);
    let container_id = format!("process://{pid}");
    tracing::info!(pod = %format!("{namespace}/{name}"), pid, program = %launch.program.display(), ip = %pod_ip, "pod started");
    let base = json!({"name": launch.container, "image": launch.image, "imageID": "", "containerID": container_id, "restartCount": 0});
    let mut running = base.clone();
    running["ready"] = json!(true);
    running["started"] = json!(true);
    running["state"] = json!({"running": {"startedAt": start_time}});
    if *stop.borrow() == Stop::Run {
        write_status(
            &api,
            &name,
            status_patch(PodStatus {
                phase: "Running",
                reason: None,
                message: None,
                pod_ip: &pod_ip,
                start_time: &start_time,
                container: running,
            }),
        )
        .await;
    }

    enum End {
        Exited(std::process::ExitStatus),
        Deadline,
        Stopped(Stop),
    }
    let deadline_sleep = async {
        match deadline {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(deadline_sleep);
    let end = loop {
        let state = *stop.borrow_and_update();
        if state != Stop::Run {
            break End::Stopped(state);
        }
        tokio::select! {
            st = child.wait() => match st {
                Ok(st) => break End::Exited(st),
                Err(e) => {
                    tracing::warn!(pod = %name, error = %e, "waiting for the process failed");
                    break End::Deadline;
                }
            },
            _ = &mut deadline_sleep => break End::Deadline,
            changed = stop.changed() => if changed.is_err() { break End::Stopped(Stop::Abandon) },
        }
    };
    let (status, reason, pod_message) = match end {
        End::Exited(st) => {
            // Take down anything the process left behind in its group.
            signal_group(pid, Signal::SIGKILL);
            (Some(st), None, None)
        }
        End::Deadline => {
            let st = kill_child(&mut child, pid, Duration::ZERO).await;
            (
                st,
                Some("DeadlineExceeded"),
                Some("Pod was active on the node longer than the specified deadline".to_string()),
            )
        }
        End::Stopped(Stop::Deleted { grace_seconds }) => {
            let grace = Duration::from_secs(u64::try_from(grace_seconds).unwrap_or(0))
                .min(inner.opts.max_grace);
            let _ = kill_child(&mut child, pid, grace).await;
            pid_slot.store(0, Ordering::SeqCst);
            tracing::info!(pod = %format!("{namespace}/{name}"), "pod deleted: process stopped");
            confirm_deletion(&inner.client, &namespace, &name, &uid).await;
            return;
        }
        End::Stopped(_) => {
            let _ = kill_child(&mut child, pid, Duration::ZERO).await;
            pid_slot.store(0, Ordering::SeqCst);
            return;
        }
    };
    pid_slot.store(0, Ordering::SeqCst);
    let code = status.map(exit_code).unwrap_or(137);
    let failed = code != 0 || reason.is_some();
    let message = termination_message(&pod_dir, failed, launch.fallback_to_logs);
    let mut terminated = json!({"exitCode": code, "reason": if code == 0 { "Completed" } else { "Error" },
                                "startedAt": start_time, "finishedAt": now(), "containerID": container_id});
    if !message.is_empty() {
        terminated["message"] = json!(message);
    }
    let mut container = base;
    container["ready"] = json!(false);
    container["started"] = json!(false);
    container["state"] = json!({ "terminated": terminated });
    let phase = if failed { "Failed" } else { "Succeeded" };
    tracing::info!(pod = %format!("{namespace}/{name}"), phase, code, "pod finished");
    if *stop.borrow() == Stop::Run || reason.is_some() {
        write_status(
            &api,
            &name,
            status_patch(PodStatus {
                phase,
                reason,
                message: pod_message,
                pod_ip: &pod_ip,
                start_time: &start_time,
                container,
            }),
        )
        .await;
    }
    wait_for_deletion(inner, stop, &namespace, &name, &uid).await
}

/// After a pod has ended: wait for its deletion and confirm it (or for the object to go).
async fn wait_for_deletion(
    inner: &Arc<Inner>,
    mut stop: watch::Receiver<Stop>,
    ns: &str,
    name: &str,
    uid: &str,
) {
    loop {
        let state = *stop.borrow_and_update();
        match state {
            Stop::Deleted { .. } => {
                confirm_deletion(&inner.client, ns, name, uid).await;
                return;
            }
            Stop::Abandon => return,
            Stop::Run => {}
        }
        if stop.changed().await.is_err() {
            return;
        }
    }
}

/// SIGTERM to the process group, up to `grace` for the leader to exit, then SIGKILL.
async fn kill_child(
    child: &mut tokio::process::Child,
    pid: u32,
    grace: Duration,
) -> Option<std::process::ExitStatus> {
    signal_group(pid, Signal::SIGTERM);
    let exited = if grace.is_zero() {
        None
    } else {
        tokio::time::timeout(grace, child.wait()).await.ok()
    };
    signal_group(pid, Signal::SIGKILL);
    match exited {
        Some(Ok(st)) => Some(st),
        _ => child.wait().await.ok(),
    }
}

fn exit_code(st: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    st.code()
        .or_else(|| st.signal().map(|s| 128 + s))
        .unwrap_or(137)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expands_references_to_defined_variables_only() {
        let env = BTreeMap::from([("NODE".to_string(), "n1".to_string())]);
        assert_eq!(expand("--node=$(NODE)", &env), "--node=n1");
        assert_eq!(expand("$(MISSING)/x", &env), "$(MISSING)/x");
        assert_eq!(expand("$$(NODE) $5", &env), "$(NODE) $5");
        assert_eq!(expand("tail $(", &env), "tail $(");
    }

    #[test]
    fn finds_an_absolute_program_missing_here_by_its_name_on_path() {
        let found = find_program("/nonexistent/dir/sh", "/usr/bin:/bin");
        assert!(found.is_some_and(|p| p.ends_with("sh")));
        assert_eq!(find_program("no-such-program-here", "/usr/bin:/bin"), None);
    }

    #[test]
    fn termination_message_is_cut_at_the_kubelet_limit() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join(TERMINATION_LOG_FILE), "x".repeat(5000)).expect("write");
        assert_eq!(termination_message(dir.path(), false, false).len(), 4096);
    }

    #[test]
    fn fallback_to_logs_uses_the_log_tail_only_after_a_failure() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join(LOG_FILE), "line 1\nboom\n").expect("write");
        assert_eq!(termination_message(dir.path(), true, true), "line 1\nboom");
        assert_eq!(termination_message(dir.path(), false, true), "");
        assert_eq!(termination_message(dir.path(), true, false), "");
    }
}
