//! How the process-kubelet runs: where the agent is, its timings, node resources, and
//! which nodes are stalled.

use super::ENV_AGENT_BIN_DIR;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

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
    /// First back-off of image pulls, and the interval at which a container's config is
    /// built again after `CreateContainerConfigError`. Default: 10 s (the kubelet's).
    pub retry_backoff: Duration,
    /// Nodes that stay Ready but never start a pod (see the module docs). Default: none.
    pub stalled_nodes: BTreeSet<String>,
    /// Node name -> the IP every pod of that node gets, as host-network pods get their
    /// node's address: for pods that run in a network namespace standing for the node
    /// (bench/gpu-e2e.sh), whose peers must reach them there. Default: none (each pod gets
    /// its own `127.x.y.z`).
    pub pod_ips: BTreeMap<String, String>,
    /// Nodes whose GPUs are DRA devices only: they report no `nvidia.com/gpu` in capacity or
    /// allocatable (the test publishes their ResourceSlices, [`crate::dra::publish_gpus`]).
    /// Default: none.
    pub dra_only_nodes: BTreeSet<String>,
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
            retry_backoff: Duration::from_secs(10),
            stalled_nodes: BTreeSet::new(),
            pod_ips: BTreeMap::new(),
            dra_only_nodes: BTreeSet::new(),
        }
    }
}
