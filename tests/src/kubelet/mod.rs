//! The process-kubelet: registers simulated GPU nodes and runs the pods bound to them as
//! local processes, writing node and pod status as a kubelet does, including the failures a
//! busy cluster produces.
//!
//! It is as much of a kubelet as the benchmark pods need:
//! - **Nodes** ([`node`]): one Node per fleet node, with `nvidia.com/gpu` (plus cpu, memory,
//!   pods) capacity and allocatable (none on a node of [`KubeletOptions::dra_only_nodes`],
//!   whose GPUs are DRA devices only), the labels `nvidia.com/gpu.product`,
//!   `nvidia.com/gpu.count`, `kubernetes.io/hostname` and the fleet's own, a Ready
//!   condition, a Lease heartbeat in `kube-node-lease` and periodic status updates (so the
//!   node lifecycle controller keeps them Ready). A test can make a node NotReady
//!   ([`Kubelet::set_node_ready`]) or remove it ([`Kubelet::remove_node`]).
//! - **Admission** ([`admission`]): a pod asking for more `nvidia.com/gpu` than its node has
//!   free (capacity minus what the node's other active pods request) is rejected: phase
//!   Failed, reason `OutOfnvidia.com/gpu`, message `Pod was rejected: Node didn't have
//!   enough resource: nvidia.com/gpu, requested: 8, used: 8, capacity: 8`. A pod holds its
//!   GPUs until its process has ended. `crate::fixtures::gpu_holder_pod` makes a pod
//!   that holds GPUs of a node (a sleeping process, Running until deleted).
//! - **Pods** ([`launch`], [`sources`]) bound by `spec.nodeName` (there is no scheduler):
//!   the first container's `command` + `args` (with `$(VAR)` expansion) run as a local
//!   process in its own process group, with the container's env: `envFrom` and `env`
//!   (literal values; downward-API `fieldRef` for `spec.nodeName`, `metadata.name`,
//!   `metadata.namespace`, `metadata.uid`, `status.podIP`, `status.hostIP`,
//!   `spec.serviceAccountName`; `secretKeyRef` / `configMapKeyRef` read from the API
//!   server), plus `FABRIC_TERMINATION_LOG=<pod dir>/termination-log` (instead of
//!   `/dev/termination-log`), `FABRIC_SIM_FLEET=<fleet file>`, and a `PATH` that starts
//!   with [`KubeletOptions::agent_bin_dir`]. A container without `command` runs
//!   [`KubeletOptions::default_command`] (the image's entrypoint, `fabric-agent`); an
//!   absolute program path that does not exist here is looked up by its file name on
//!   `PATH`. A pod that claims its GPUs through DRA (placed by the real kube-scheduler where
//!   a test runs one, `crate::dra`) runs as any other once bound: its claims are not
//!   prepared, and it holds no `nvidia.com/gpu` here (the scheduler's allocation holds its
//!   devices).
//! - **Waiting containers** ([`waiting`]; the pod stays Pending, the container `waiting`):
//!   - an image whose name contains [`MISSING_IMAGE_MARK`] (`does-not-exist`) cannot be
//!     pulled: reason `ErrImagePull` (`Failed to pull image "...": ... not found`), then
//!     `ImagePullBackOff` (`Back-off pulling image "..."`), alternating with a back-off that
//!     starts at [`KubeletOptions::retry_backoff`] and doubles up to 300 s;
//!   - env from a Secret or ConfigMap that does not exist (or lacks the key), not
//!     `optional`: reason `CreateContainerConfigError`, message `secret "x" not found`,
//!     `configmap "x" not found` or `couldn't find key K in Secret ns/x`; retried every
//!     [`KubeletOptions::retry_backoff`], so the pod starts once the object is created.
//!     Unsupported env sources (`resourceFieldRef`, other `fieldRef` paths) report the same
//!     reason.
//! - **Stalled nodes**: a node named in [`KubeletOptions::stalled_nodes`] (binary:
//!   `--stalled-node NAME`, or `GPUFABRIC_STALLED_NODES=a,b`), or set with
//!   [`Kubelet::set_node_stalled`], stays Ready but never starts its pods: they stay Pending
//!   with no container status and no start time, as behind a hung container runtime.
//!   Deletions are still confirmed. Un-stalling starts the pods bound to it.
//! - **Lost deadlines**: with [`Kubelet::set_node_ignores_deadlines`], pods started on a
//!   node afterwards run past their `activeDeadlineSeconds` until deleted.
//! - **Status**: Running with a distinct pod IP (`127.x.y.z`; or, for a node named in
//!   [`KubeletOptions::pod_ips`], that node's address, as host-network pods get), container
//!   `running`; then
//!   Succeeded or Failed with the exit code (128 + signal when killed), reason
//!   `Completed`/`Error`, and the termination message read from the file (first 4096
//!   bytes; `FallbackToLogsOnError` uses the log tail); a program that cannot start ends
//!   Failed with exit code 128 and reason `StartError`.
//! - **`activeDeadlineSeconds`**, counted from the pod's start (also while its container
//!   waits): the process is killed; phase Failed, reason `DeadlineExceeded`, as the
//!   kubelet does. A container that never ran is reported terminated with
//!   `ContainerStatusUnknown` (exit code 137).
//! - **Eviction and preemption** ([`Kubelet::evict_pod`]): the process is killed; phase
//!   Failed, reason `Evicted` (node pressure) or `Preempting` (to admit a critical pod), a
//!   `DisruptionTarget` condition with reason `TerminationByKubelet`.
//! - **Deletion**: on a `deletionTimestamp` (a graceful delete, also the garbage
//!   collector's) the process group gets SIGTERM, then SIGKILL after the pod's grace period
//!   (capped by [`KubeletOptions::max_grace`]); the container's end (exit code, termination
//!   message, phase) is written, then the deletion is confirmed with `gracePeriodSeconds:
//!   0`, as a real kubelet must, or the pod stays forever.
//!
//! What it does not do: images (nothing is pulled; the image name is only reported),
//! containers other than the first, init containers, restarts (every pod behaves as
//! `restartPolicy: Never`), probes, volumes and mounts, resource limits, cgroups or
//! namespaces (processes share the host's network: a pod IP is a loopback address the
//! process may bind to, not an isolated stack), admission of anything but
//! `nvidia.com/gpu` (cpu, memory, taints, node affinity), `kubectl exec`, following logs
//! (`kubectl logs` serves the log as it is, see [`logs`]; the file is
//! [`Kubelet::pod_log_path`]), evictions of its own accord, static pods and
//! node-pressure conditions.

mod admission;
mod launch;
mod logs;
mod node;
mod options;
mod pod;
mod pod_watch;
mod sources;
mod status;
mod waiting;

pub use options::{KubeletOptions, default_agent_bin_dir};
pub use pod::Eviction;
pub use sources::expand;
pub use waiting::MISSING_IMAGE_MARK;

use pod::Stop;

use crate::fleet::SimFleet;
use crate::process::signal_group;
use crate::{Error, Result};
use gpufabric_measure::fleet::{Fleet, FleetNode};
use kube::Client;
use nix::sys::signal::Signal;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
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
/// Env var of the `fabric-kubelet` binary: comma-separated names of stalled nodes.
pub const ENV_STALLED_NODES: &str = "GPUFABRIC_STALLED_NODES";

const NODE_LEASE_NS: &str = "kube-node-lease";
const LEASE_SECONDS: i32 = 40;
/// Longest wait at start for the node lifecycle controller to take the not-ready taint off.
const NOT_READY_TAINT_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
const TERMINATION_LOG_FILE: &str = "termination-log";
const LOG_FILE: &str = "container.log";
/// Tries of a pod status write or deletion confirmation before giving up.
const WRITE_ATTEMPTS: u32 = 5;
/// Kubelet's limit on a termination message taken from the log tail.
const FALLBACK_LOG_BYTES: usize = 2048;
const FALLBACK_LOG_LINES: usize = 80;

#[derive(Debug, Clone)]
struct NodeState {
    spec: FleetNode,
    ready: bool,
    removed: bool,
    stalled: bool,
    /// Pods on this node run past their `activeDeadlineSeconds` (a kubelet that lost track
    /// of them), so only the operator's run deadline stops them.
    deadlines_ignored: bool,
    ready_since: String,
}

struct PodHandle {
    node: String,
    namespace: String,
    name: String,
    /// `nvidia.com/gpu` the pod requests.
    gpus: u64,
    stop: watch::Sender<Stop>,
    pid: Arc<AtomicU32>,
    /// Whether the pod still holds its GPUs (admitted and not ended).
    active: Arc<AtomicBool>,
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
    /// Port of the log server ([`logs`]) on 127.0.0.1, in every node's status.
    log_port: u16,
}

/// A running process-kubelet. Dropping it stops its tasks and kills every pod process.
pub struct Kubelet {
    inner: Arc<Inner>,
    tasks: Vec<JoinHandle<()>>,
    _root: Option<tempfile::TempDir>,
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
        let (log_port, log_server) = logs::serve(root.clone(), LOG_FILE).await?;
        let t = status::now();
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
                        stalled: opts.stalled_nodes.contains(&n.name),
                        deadlines_ignored: false,
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
            log_port,
        });
        for node in fleet.nodes.iter() {
            inner.register_node(node).await?;
        }
        tracing::info!(
            nodes = fleet.nodes.len(),
            "process-kubelet registered the fleet"
        );
        let hb = tokio::spawn(node::heartbeat_loop(inner.clone()));
        let pw = tokio::spawn(pod_watch::pod_watch_loop(inner.clone()));
        inner.wait_not_ready_taints_gone(NOT_READY_TAINT_WAIT).await;
        Ok(Kubelet {
            inner,
            tasks: vec![hb, pw, log_server],
            _root: tmp,
        })
    }

    /// Ends a pod as the kubelet does under node pressure or to admit a critical pod: its
    /// process is killed and the pod is Failed with the eviction's reason. A pod whose
    /// container is still waiting is Failed the same way.
    pub fn evict_pod(&self, namespace: &str, name: &str, eviction: Eviction) -> Result<()> {
        let pods = lock(&self.inner.pods);
        let h = pods
            .values()
            .find(|h| h.namespace == namespace && h.name == name)
            .ok_or_else(|| {
                Error::Invalid(format!("no pod {namespace}/{name} on this kubelet's nodes"))
            })?;
        h.stop.send_if_modified(|s| {
            let run = *s == Stop::Run;
            if run {
                *s = Stop::Evicted(eviction);
            }
            run
        });
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

impl Inner {
    /// GPU capacity of a live node and whether it is stalled; `None` for a node this
    /// kubelet does not run.
    fn node_gpus_and_stall(&self, node: &str) -> Option<(u64, bool)> {
        lock(&self.nodes)
            .get(node)
            .filter(|n| !n.removed)
            .map(|n| (u64::from(n.spec.gpus), n.stalled))
    }

    /// Whether pods on `node` run past their deadline ([`Kubelet::set_node_ignores_deadlines`]).
    fn ignores_deadlines(&self, node: &str) -> bool {
        lock(&self.nodes)
            .get(node)
            .is_some_and(|n| n.deadlines_ignored)
    }

    /// The IP of a new pod on `node`: the node's own ([`KubeletOptions::pod_ips`]), else
    /// the next distinct loopback address.
    fn pod_ip(&self, node: &str) -> String {
        if let Some(ip) = self.opts.pod_ips.get(node) {
            return ip.clone();
        }
        let n = self.next_ip.fetch_add(1, Ordering::SeqCst);
        format!("127.{}.{}.{}", self.ip_base, (n >> 8) & 0xff, n & 0xff)
    }
}
