//! A real Kubernetes node on this machine, for end-to-end tests of what ships: Debian's
//! containerd and runc, CNI (bridge, host-local, portmap, loopback), kubelet v1.33 and
//! kube-proxy (iptables), plus kube-scheduler, against a [`Cluster`] started with
//! [`ClusterOptions::real_node`](crate::cluster::ClusterOptions::real_node).
//!
//! ```no_run
//! # async fn demo() -> gpufabric_tests::Result<()> {
//! use gpufabric_tests::cluster::{Cluster, ClusterOptions};
//! use gpufabric_tests::realnode::{RealNode, RealNodeOptions, BUSYBOX_IMAGE};
//! let cluster = Cluster::start_with(ClusterOptions { real_node: true, ..Default::default() }).await?;
//! let node = RealNode::start(&cluster, RealNodeOptions::default()).await?; // Ready, kube-proxy synced
//! node.import_image(std::path::Path::new("target/images/fabric-operator.oci.tar"))?;
//! node.set_extended_resource("nvidia.com/gpu", 8).await?;   // as a device plugin would
//! // ... Deployments, Services, pods with image BUSYBOX_IMAGE (imagePullPolicy: Never) ...
//! drop(node);                                                // everything it made is gone
//! # Ok(()) }
//! ```
//!
//! What it runs, all under one temp dir (`gpufabric-realnode-*`):
//! - **containerd** with its own root, state, socket, runc state and network namespaces,
//!   `restrict_oom_score_adj = true` (root here lacks CAP_SYS_RESOURCE) and a local pause
//!   image; images come from OCI archives (`ctr -n k8s.io images import`): the
//!   [`PAUSE_IMAGE`] and a [`BUSYBOX_IMAGE`] made of Debian's busybox-static (from the node
//!   bin dir) by `deploy/images/oci.py`, and whatever [`RealNode::import_image`] adds; or
//!   pulled by the kubelet from a registry the node trusts ([`RealNode::trust_registry`]:
//!   containerd's `certs.d/<host>/hosts.toml`, e.g. a [`crate::registry::Registry`]);
//! - **CNI**: a bridge [`BRIDGE`] as the pods' gateway, addresses from
//!   [`RealNodeOptions::pod_cidr`] (10.244.0.0/24), portmap, no masquerading;
//! - **kubelet** (cgroupfs on cgroup v1, see [`config::kubelet_config`]) registering the node
//!   [`RealNodeOptions::name`] with the host's address, as user `system:node:<name>`;
//! - **kube-proxy** in iptables mode, so ClusterIP Services work from the host (the API
//!   server calling a webhook) and from pods (`kubernetes.default` at 10.96.0.1:443);
//! - **kube-scheduler**, so Deployments' pods are placed (on any Ready node of the
//!   cluster, simulated ones included: pin them with a node selector where that matters);
//! - with [`RealNodeOptions::dra`], **DRA**: the kubelet and the scheduler with the
//!   [`crate::dra::FEATURE_GATES`] (the cluster needs them too: [`dra_cluster_options`]),
//!   containerd 1.7 from the node bin dir with CDI on (Debian 12's 1.6 has no CDI, and a
//!   claim's devices reach the runtime only as CDI devices), and the GPU DRA kubelet plugin
//!   (`tests/cluster/draplugin`) beside the kubelet, publishing the GPUs of [`Dra::dev`] as
//!   devices of [`crate::dra::DRIVER`] and writing each prepared claim's CDI spec under
//!   [`RealNode::cdi_specs`].
//!
//! One real node runs on a machine at a time (a lock in the temp dir; the bridge, the pod
//! CIDR and kube-proxy's chains are the machine's). Dropping the node, also when a test
//! panics, stops everything and removes what it made: processes, containers and shims,
//! mounts, network namespaces, the bridge, kube-proxy's iptables chains, pod cgroups, the
//! kernel settings it changed, the Node object. A node whose test process was killed is
//! cleaned up when the next one starts. Needs root, and the packages in [`APT_PACKAGES`].
//!
//! Binaries: kubelet, kube-proxy, kube-scheduler and busybox from `$GPUFABRIC_NODE_BIN`,
//! else from `tests/cluster/build-node.sh --print-bin-dir` (build them with
//! `tests/cluster/build-node.sh`).

mod cleanup;
pub mod config;
mod host;
mod images;

pub use cleanup::BRIDGE;
pub use host::APT_PACKAGES;
pub use images::{BUSYBOX_IMAGE, PAUSE_IMAGE};

use crate::cluster::{Cluster, Component, free_port, log_tail, spawn};
use crate::process::signal_group;
use crate::{Error, Result, io_err, kube_err, pki, workspace_root};
use config::{Layout, NodeConfig};
use host::{HostTools, MachineLock, Sysctls};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use nix::sys::signal::Signal;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// Env var: directory holding kubelet, kube-proxy, kube-scheduler and busybox.
pub const ENV_NODE_BIN: &str = "GPUFABRIC_NODE_BIN";
/// The node's name unless [`RealNodeOptions::name`] says otherwise.
pub const DEFAULT_NAME: &str = "gpufabric-realnode";
/// The pods' addresses unless [`RealNodeOptions::pod_cidr`] says otherwise.
pub const DEFAULT_POD_CIDR: &str = "10.244.0.0/24";

/// Where every kubelet keeps its device manager's checkpoint (the device plugin directory is
/// not under `--root-dir`).
const DEVICE_MANAGER_CHECKPOINT: &str =
    "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint";

const BINARIES: [&str; 4] = ["kubelet", "kube-proxy", "kube-scheduler", "busybox"];
/// What the DRA mode adds to the node bin dir (`tests/cluster/build-node.sh` builds them).
const DRA_BINARIES: [&str; 2] = ["containerd", "gpu-dra-plugin"];
const LOCK_TIMEOUT: Duration = Duration::from_secs(600);
const CONTAINERD_TIMEOUT: Duration = Duration::from_secs(30);
const READY_TIMEOUT: Duration = Duration::from_secs(120);
const STOP_GRACE: Duration = Duration::from_secs(2);

/// What to start.
#[derive(Debug, Clone)]
pub struct RealNodeOptions {
    /// The Node's name. Default: [`DEFAULT_NAME`].
    pub name: String,
    /// The pods' addresses (the bridge takes the first). Default: [`DEFAULT_POD_CIDR`].
    pub pod_cidr: String,
    /// Labels the kubelet registers the node with (e.g. `nvidia.com/gpu.product`).
    pub labels: BTreeMap<String, String>,
    /// OCI image archives imported before the kubelet starts.
    pub images: Vec<PathBuf>,
    /// Start kube-scheduler. Default: true.
    pub scheduler: bool,
    /// Extra kubelet flags, after the harness's own.
    pub kubelet_args: Vec<String>,
    /// Directory of the node binaries. Default: [`bin_dir()`].
    pub bin_dir: Option<PathBuf>,
    /// Keep the node's dir (config, logs) after teardown. Default:
    /// `$GPUFABRIC_KEEP_CLUSTER == 1`.
    pub keep_dir: bool,
    /// DRA: the gates, containerd with CDI, and the GPU DRA plugin (see the module doc).
    /// Default: none.
    pub dra: Option<Dra>,
}

/// The GPUs the node's DRA plugin publishes and hands to claims.
#[derive(Debug, Clone)]
pub struct Dra {
    /// Where the GPU device nodes are (`nvidiaN`, and `nvidiactl`, `nvidia-uvm` where there
    /// are): `/dev` on a GPU host, a directory of stand-ins elsewhere.
    pub dev: PathBuf,
    /// The directory of the driver's `libcuda.so.1` and `libnvidia-ml.so.1`, bound into a
    /// claim's containers; none: no libraries.
    pub driver_lib: Option<PathBuf>,
    /// A file the plugin reads at each prepare, as the device plugin does: `hidden-gpu`
    /// withholds the last of a claim's GPUs' device nodes, `sdc` sets the agent's SDC hook.
    pub fault_file: Option<PathBuf>,
}

/// Cluster options for a real node with [`RealNodeOptions::dra`]: the control plane's DRA
/// gates and API versions ([`crate::dra::cluster_options`]) and an API server that pods
/// reach.
pub fn dra_cluster_options() -> crate::cluster::ClusterOptions {
    crate::cluster::ClusterOptions {
        real_node: true,
        ..crate::dra::cluster_options()
    }
}

impl Default for RealNodeOptions {
    fn default() -> Self {
        RealNodeOptions {
            name: DEFAULT_NAME.to_string(),
            pod_cidr: DEFAULT_POD_CIDR.to_string(),
            labels: BTreeMap::new(),
            images: Vec::new(),
            scheduler: true,
            kubelet_args: Vec::new(),
            bin_dir: None,
            keep_dir: std::env::var(crate::cluster::ENV_KEEP).is_ok_and(|v| v == "1"),
            dra: None,
        }
    }
}

/// The directory with the node binaries: `$GPUFABRIC_NODE_BIN`, else what
/// `tests/cluster/build-node.sh --print-bin-dir` prints. Fails (saying how to build them)
/// when one is missing.
pub fn bin_dir() -> Result<PathBuf> {
    let script = workspace_root().join("tests/cluster/build-node.sh");
    let dir = match std::env::var_os(ENV_NODE_BIN) {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => {
            let out = Command::new("bash")
                .arg(&script)
                .arg("--print-bin-dir")
                .stderr(Stdio::piped())
                .output()
                .map_err(|e| {
                    Error::Invalid(format!(
                        "cannot run {}: {e}. {HOW_TO_BUILD}",
                        script.display()
                    ))
                })?;
            let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if !out.status.success() || stdout.is_empty() {
                return Err(Error::Invalid(format!(
                    "`{} --print-bin-dir` failed: {}. {HOW_TO_BUILD}",
                    script.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
            PathBuf::from(stdout)
        }
    };
    check_bin_dir(dir)
}

const HOW_TO_BUILD: &str = "Build them with `tests/cluster/build-node.sh` (a few minutes after \
     tests/cluster/build.sh, cached afterwards) and export GPUFABRIC_NODE_BIN=<the dir it \
     prints>, or point GPUFABRIC_NODE_BIN at a directory holding kubelet, kube-proxy, \
     kube-scheduler and busybox";

fn check_bin_dir(dir: PathBuf) -> Result<PathBuf> {
    let missing: Vec<&str> = BINARIES
        .iter()
        .copied()
        .filter(|b| !dir.join(b).is_file())
        .collect();
    if !missing.is_empty() {
        return Err(Error::Invalid(format!(
            "node binaries not found in {}: missing {}. {HOW_TO_BUILD}",
            dir.display(),
            missing.join(", ")
        )));
    }
    Ok(dir)
}

/// A running real node. Dropping it tears everything down (see the module doc).
pub struct RealNode {
    name: String,
    ip: IpAddr,
    layout: Layout,
    dir: Option<tempfile::TempDir>,
    bin_dir: PathBuf,
    tools: HostTools,
    config: kube::Config,
    /// containerd first; the kubelet, kube-proxy and kube-scheduler after it. Emptied by
    /// teardown.
    components: Mutex<Vec<Component>>,
    sysctls: Sysctls,
    new_host_dirs: cleanup::NewHostDirs,
    startup: Duration,
    torn_down: AtomicBool,
    /// Released last, once everything above is gone.
    _lock: MachineLock,
}

impl std::fmt::Debug for RealNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealNode")
            .field("name", &self.name)
            .field("ip", &self.ip)
            .field("dir", &self.layout.dir)
            .finish_non_exhaustive()
    }
}

impl RealNode {
    /// Starts a node against `cluster` (started with `ClusterOptions::real_node`) and
    /// waits until it is Ready without the not-ready taint and kube-proxy has written the
    /// `kubernetes` Service's rules. Takes about 8 s on 2 cores.
    pub async fn start(cluster: &Cluster, opts: RealNodeOptions) -> Result<RealNode> {
        let t0 = Instant::now();
        let ip = cluster.host_ip().ok_or_else(|| {
            Error::Invalid(
                "a real node needs a cluster started with `ClusterOptions { real_node: true, .. }` \
                 (its API server must listen where pods reach it)"
                    .into(),
            )
        })?;
        host::require_root()?;
        let bin_dir = match &opts.bin_dir {
            Some(d) => check_bin_dir(d.clone())?,
            None => bin_dir()?,
        };
        let mut tools = HostTools::find()?;
        if opts.dra.is_some() {
            let missing: Vec<&str> = DRA_BINARIES
                .iter()
                .copied()
                .filter(|b| !bin_dir.join(b).is_file())
                .collect();
            if !missing.is_empty() {
                return Err(Error::Invalid(format!(
                    "a DRA node needs {} in {}: rebuild it with `tests/cluster/build-node.sh`",
                    missing.join(" and "),
                    bin_dir.display()
                )));
            }
            tools.containerd = bin_dir.join("containerd");
        }
        let lock = MachineLock::acquire(LOCK_TIMEOUT).await?;
        sweep_killed_nodes(&tools);

        let tmp = tempfile::Builder::new()
            .prefix(cleanup::DIR_PREFIX)
            .tempdir()
            .map_err(io_err("creating the node's temp dir"))?;
        let layout = Layout {
            dir: tmp.path().to_path_buf(),
        };
        let mut node = RealNode {
            name: opts.name.clone(),
            ip,
            layout,
            dir: Some(tmp),
            bin_dir,
            tools,
            config: cluster.config().clone(),
            components: Mutex::new(Vec::new()),
            sysctls: Sysctls::default(),
            new_host_dirs: cleanup::NewHostDirs::before_start(),
            startup: Duration::ZERO,
            torn_down: AtomicBool::new(false),
            _lock: lock,
        };
        if opts.keep_dir
            && let Some(d) = node.dir.take()
        {
            let _ = std::fs::write(d.path().join(cleanup::KEPT_MARK), "");
            let _ = d.keep();
        }
        // The kubelet's device manager keeps its checkpoint in a fixed directory, whatever its
        // --root-dir: an earlier node's (a device plugin registered there) would make this
        // kubelet take a resource patched into its status for a plugin's that never comes.
        let _ = std::fs::remove_file(DEVICE_MANAGER_CHECKPOINT);
        // From here on, a failure drops `node`, which tears down what was started.
        node.boot(cluster, &opts).await?;
        node.startup = t0.elapsed();
        tracing::info!(
            node = %node.name,
            ip = %node.ip,
            dir = %node.layout.dir.display(),
            startup_s = node.startup.as_secs_f64(),
            "real node Ready"
        );
        Ok(node)
    }

    async fn boot(&mut self, cluster: &Cluster, opts: &RealNodeOptions) -> Result<()> {
        let layout = self.layout.clone();
        for d in [
            layout.containerd_root(),
            layout.containerd_state(),
            layout.runc_root(),
            layout.containerd_opt(),
            layout.cni_conf_dir(),
            layout.ipam_dir(),
            layout.kubelet_root(),
            layout.pod_logs(),
            layout.volume_plugins(),
            layout.images(),
            layout.certs(),
            layout.registry_hosts(),
            layout.cdi_specs(),
        ] {
            std::fs::create_dir_all(&d).map_err(io_err(format!("creating {}", d.display())))?;
        }
        let pki = cluster.pki()?;
        let node = NodeConfig {
            name: self.name.clone(),
            node_ip: self.ip,
            pod_cidr: opts.pod_cidr.clone(),
            bridge: BRIDGE.to_string(),
            cni_bin_dir: PathBuf::from(host::CNI_BIN_DIR),
            pause_image: PAUSE_IMAGE.to_string(),
            cgroup_root: cleanup::CGROUP_ROOT.to_string(),
            kubelet_port: free_port()?,
            kube_proxy_healthz_port: free_port()?,
            kube_proxy_metrics_port: free_port()?,
            ca_cert: pki.ca_cert.clone(),
            cdi: opts.dra.is_some(),
        };
        let write = |path: PathBuf, text: String| {
            std::fs::write(&path, text).map_err(io_err(format!("writing {}", path.display())))
        };
        write(
            layout.containerd_config(),
            config::containerd_toml(&layout, &node),
        )?;
        write(
            layout.cni_conf_dir().join("10-gpufabric.conflist"),
            config::cni_conflist(&layout, &node),
        )?;
        write(
            layout.kubelet_config(),
            config::kubelet_config(&layout, &node),
        )?;
        write(
            layout.kube_proxy_config(),
            config::kube_proxy_config(&layout, &node),
        )?;
        for (component, stem, cn, org) in [
            (
                "kubelet",
                "kubelet-client",
                format!("system:node:{}", self.name),
                Some("system:nodes"),
            ),
            ("kube-proxy", "kube-proxy", "system:kube-proxy".into(), None),
            (
                "kube-scheduler",
                "kube-scheduler",
                "system:kube-scheduler".into(),
                None,
            ),
        ] {
            let cert = pki.issue_client(&layout.certs(), stem, &cn, org)?;
            write(
                layout.kubeconfig(component),
                pki::kubeconfig_yaml(cluster.server(), &pki.ca_cert, &cert.cert, &cert.key, &cn),
            )?;
        }

        self.sysctls = Sysctls::save_and_set();
        cleanup::create_cgroup_root().map_err(io_err(format!(
            "creating the pod cgroup root /{} in each cgroup hierarchy",
            cleanup::CGROUP_ROOT
        )))?;

        self.start_containerd().await?;
        let (pause, busybox) =
            images::write_archives(&self.bin_dir.join("busybox"), &layout.images())?;
        for archive in [&pause, &busybox].into_iter().chain(&opts.images) {
            self.import_image(archive)?;
        }

        let mut kubelet_args = vec![
            format!("--config={}", layout.kubelet_config().display()),
            format!("--kubeconfig={}", layout.kubeconfig("kubelet").display()),
            format!("--root-dir={}", layout.kubelet_root().display()),
            format!("--hostname-override={}", self.name),
            format!("--node-ip={}", self.ip),
            "--v=2".into(),
        ];
        if !opts.labels.is_empty() {
            let labels: Vec<String> = opts
                .labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            kubelet_args.push(format!("--node-labels={}", labels.join(",")));
        }
        if opts.dra.is_some() {
            kubelet_args.push(crate::dra::FEATURE_GATES.into());
        }
        kubelet_args.extend(opts.kubelet_args.iter().cloned());
        let kubelet = spawn(
            "kubelet",
            &self.bin_dir.join("kubelet"),
            &kubelet_args,
            &layout.dir,
        )?;
        self.components().push(kubelet);
        if let Some(dra) = &opts.dra {
            let plugin = self.dra_plugin(cluster, dra)?;
            self.components().push(plugin);
        }
        let proxy = spawn(
            "kube-proxy",
            &self.bin_dir.join("kube-proxy"),
            &[
                format!("--config={}", layout.kube_proxy_config().display()),
                "--v=2".into(),
            ],
            &layout.dir,
        )?;
        self.components().push(proxy);
        if opts.scheduler {
            let k = layout.kubeconfig("kube-scheduler").display().to_string();
            let mut args = vec![
                format!("--kubeconfig={k}"),
                format!("--authentication-kubeconfig={k}"),
                format!("--authorization-kubeconfig={k}"),
                "--leader-elect=false".into(),
                "--secure-port=0".into(),
                "--v=1".into(),
            ];
            if opts.dra.is_some() {
                args.push(crate::dra::FEATURE_GATES.into());
            }
            let scheduler = spawn(
                "kube-scheduler",
                &self.bin_dir.join("kube-scheduler"),
                &args,
                &layout.dir,
            )?;
            self.components().push(scheduler);
        }
        self.wait_ready(READY_TIMEOUT).await?;
        self.wait_service_rules(READY_TIMEOUT).await
    }

    /// Starts the GPU DRA plugin against the kubelet (it registers once the kubelet's plugin
    /// watcher runs), publishing with the cluster's admin credentials.
    fn dra_plugin(&self, cluster: &Cluster, dra: &Dra) -> Result<Component> {
        let mut args = vec![
            format!("-node-name={}", self.name),
            format!("-kubeconfig={}", cluster.kubeconfig_path().display()),
            format!("-kubelet-root={}", self.layout.kubelet_root().display()),
            format!("-cdi-dir={}", self.layout.cdi_specs().display()),
            format!("-dev={}", dra.dev.display()),
            // Stand-in GPUs are described by nothing but their device nodes.
            format!(
                "-proc-gpus={}",
                self.layout.dir.join("no-driver-information").display()
            ),
        ];
        if let Some(lib) = &dra.driver_lib {
            args.push(format!("-driver-lib={}", lib.display()));
        }
        if let Some(fault) = &dra.fault_file {
            args.push(format!("-fault-file={}", fault.display()));
        }
        spawn(
            "gpu-dra-plugin",
            &self.bin_dir.join("gpu-dra-plugin"),
            &args,
            &self.layout.dir,
        )
    }

    async fn start_containerd(&mut self) -> Result<()> {
        let args = vec![
            format!("--config={}", self.layout.containerd_config().display()),
            "--log-level=info".into(),
        ];
        let mut containerd = spawn(
            "containerd",
            &self.tools.containerd,
            &args,
            &self.layout.dir,
        )?;
        let end = Instant::now() + CONTAINERD_TIMEOUT;
        loop {
            if self.layout.containerd_socket().exists() && self.ctr(&["version"]).is_ok() {
                self.components().push(containerd);
                return Ok(());
            }
            if let Some(why) = containerd.exited() {
                return Err(containerd.start_error(why));
            }
            if Instant::now() > end {
                let e = containerd.start_error(format!(
                    "no answer on {} within {}s",
                    self.layout.containerd_socket().display(),
                    CONTAINERD_TIMEOUT.as_secs()
                ));
                containerd.stop();
                return Err(e);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Runs `ctr` against the node's containerd in the `k8s.io` namespace (the kubelet's).
    fn ctr(&self, args: &[&str]) -> Result<String> {
        let out = Command::new(&self.tools.ctr)
            .arg("--address")
            .arg(self.layout.containerd_socket())
            .args(["--namespace", "k8s.io"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(io_err(format!("running {}", self.tools.ctr.display())))?;
        if !out.status.success() {
            return Err(Error::Invalid(format!(
                "ctr {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Imports an OCI image archive (as `deploy/images/oci.py` writes) into the node's
    /// containerd, where the kubelet finds it, and returns the references it holds. The
    /// kubelet looks an image up by its full reference (`docker.io/local/x:1` for a pod's
    /// `local/x:1`), so the archive must name it so; pods use `imagePullPolicy: Never` or
    /// `IfNotPresent` (or pull from a registry: [`RealNode::trust_registry`]).
    pub fn import_image(&self, archive: &Path) -> Result<Vec<String>> {
        let path = archive.display().to_string();
        let out = self.ctr(&["images", "import", &path])?;
        let refs = images::imported_refs(&out);
        if refs.is_empty() {
            return Err(Error::Invalid(format!(
                "importing {path} named no image (ctr said: {}); the archive's index.json \
                 must carry the full reference (io.containerd.image.name)",
                out.trim()
            )));
        }
        tracing::debug!(archive = %path, ?refs, "image imported");
        Ok(refs)
    }

    /// Gives the image `source` (already in the node's containerd) the reference `target`
    /// too, as a push of a new tag would (e.g. to upgrade a Deployment to "another" image).
    pub fn tag_image(&self, source: &str, target: &str) -> Result<()> {
        self.ctr(&["images", "tag", "--force", source, target])?;
        Ok(())
    }

    /// Lets the node pull from the registry at `host` (`127.0.0.1:PORT`), served over TLS
    /// with a certificate from `ca`: containerd's `certs.d/<host>/hosts.toml`, which it reads
    /// at each pull (no restart). Credentials come from the pods' `imagePullSecrets`.
    pub fn trust_registry(&self, host: &str, ca: &Path) -> Result<()> {
        let dir = self.layout.registry_hosts().join(host);
        std::fs::create_dir_all(&dir).map_err(io_err(format!("creating {}", dir.display())))?;
        let path = dir.join("hosts.toml");
        std::fs::write(&path, config::registry_hosts_toml(host, ca))
            .map_err(io_err(format!("writing {}", path.display())))
    }

    /// The references of every image in the node's containerd.
    pub fn images(&self) -> Result<Vec<String>> {
        Ok(self
            .ctr(&["images", "ls", "-q"])?
            .lines()
            .filter(|l| !l.starts_with("sha256:"))
            .map(str::to_string)
            .collect())
    }

    /// Advertises `count` of an extended resource (e.g. `nvidia.com/gpu`) in the Node's
    /// status, capacity and allocatable, as a device plugin's kubelet would; the kubelet
    /// keeps a resource patched in this way, and admits pods that request it.
    pub async fn set_extended_resource(&self, resource: &str, count: u32) -> Result<()> {
        let nodes: Api<Node> = Api::all(self.client()?);
        let patch = serde_json::json!({"status": {
            "capacity": {resource: count.to_string()},
            "allocatable": {resource: count.to_string()},
        }});
        nodes
            .patch_status(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(kube_err(format!(
                "patching {resource} into node {}'s status",
                self.name
            )))?;
        Ok(())
    }

    fn client(&self) -> Result<Client> {
        Client::try_from(self.config.clone()).map_err(kube_err("creating a client"))
    }

    /// Waits until the Node is Ready and the node lifecycle controller has taken its
    /// `node.kubernetes.io/not-ready` taint off (scheduled pods would wait for that).
    async fn wait_ready(&self, timeout: Duration) -> Result<()> {
        let nodes: Api<Node> = Api::all(self.client()?);
        let end = Instant::now() + timeout;
        let mut last = String::from("not registered");
        loop {
            if let Some(node) = nodes
                .get_opt(&self.name)
                .await
                .map_err(kube_err(format!("reading node {}", self.name)))?
            {
                let ready = node
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .and_then(|cs| cs.iter().find(|c| c.type_ == "Ready"));
                let tainted = node
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.as_ref())
                    .is_some_and(|ts| {
                        ts.iter()
                            .any(|t| t.key.starts_with("node.kubernetes.io/not-ready"))
                    });
                match ready {
                    Some(c) if c.status == "True" && !tainted => return Ok(()),
                    Some(c) if c.status == "True" => last = "Ready, still tainted not-ready".into(),
                    Some(c) => {
                        last = format!(
                            "Ready={} ({}: {})",
                            c.status,
                            c.reason.clone().unwrap_or_default(),
                            c.message.clone().unwrap_or_default()
                        )
                    }
                    None => last = "registered, no Ready condition".into(),
                }
            }
            self.check_running()?;
            if Instant::now() > end {
                return Err(Error::Start {
                    component: "kubelet".into(),
                    detail: format!(
                        "node {} not Ready within {}s: {last}",
                        self.name,
                        timeout.as_secs()
                    ),
                    log: self.layout.log("kubelet"),
                    log_tail: log_tail(&self.layout.log("kubelet"), 40),
                });
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Waits until kube-proxy has written the `kubernetes` Service's rules.
    async fn wait_service_rules(&self, timeout: Duration) -> Result<()> {
        let end = Instant::now() + timeout;
        let service_ip = format!("{}/32", pki::KUBERNETES_SERVICE_IP);
        loop {
            let rules = Command::new(&self.tools.iptables)
                .args(["-t", "nat", "-S", "KUBE-SERVICES"])
                .stderr(Stdio::null())
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            if rules.contains(&service_ip) {
                return Ok(());
            }
            self.check_running()?;
            if Instant::now() > end {
                return Err(Error::Start {
                    component: "kube-proxy".into(),
                    detail: format!(
                        "no rules for {service_ip} in the nat table's KUBE-SERVICES within {}s",
                        timeout.as_secs()
                    ),
                    log: self.layout.log("kube-proxy"),
                    log_tail: log_tail(&self.layout.log("kube-proxy"), 40),
                });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn components(&self) -> MutexGuard<'_, Vec<Component>> {
        self.components.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Fails when a component has exited.
    fn check_running(&self) -> Result<()> {
        for c in self.components().iter_mut() {
            if let Some(why) = c.exited() {
                return Err(c.start_error(why));
            }
        }
        Ok(())
    }

    /// The Node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node's address (the host's): its InternalIP, where the kubelet serves.
    pub fn ip(&self) -> IpAddr {
        self.ip
    }

    /// The node's temp dir (configuration, certificates, logs, containerd's state).
    pub fn dir(&self) -> &Path {
        &self.layout.dir
    }

    /// Log file of `containerd`, `kubelet`, `kube-proxy` or `kube-scheduler`.
    pub fn log_path(&self, component: &str) -> PathBuf {
        self.layout.log(component)
    }

    /// Where the DRA plugin writes the CDI spec of each claim it prepared (and containerd
    /// reads them): `gpufabric-claim-<claim uid>.json`.
    pub fn cdi_specs(&self) -> PathBuf {
        self.layout.cdi_specs()
    }

    /// containerd's socket (for `ctr --address` or `crictl`).
    pub fn containerd_socket(&self) -> PathBuf {
        self.layout.containerd_socket()
    }

    /// How long [`RealNode::start`] took.
    pub fn startup_time(&self) -> Duration {
        self.startup
    }

    /// Stops everything and removes what the node made on the machine (once: later calls
    /// do nothing). Drop does this.
    fn teardown(&self, delete_node_object: bool) {
        if self.torn_down.swap(true, Ordering::SeqCst) {
            return;
        }
        let t0 = Instant::now();
        let mut comps = std::mem::take(&mut *self.components());
        // The kubelet, kube-proxy and kube-scheduler first, so nothing restarts containers.
        let containerd = if comps.first().is_some_and(|c| c.name == "containerd") {
            Some(comps.remove(0))
        } else {
            None
        };
        for c in &comps {
            signal_group(c.child.id(), Signal::SIGTERM);
        }
        let end = Instant::now() + STOP_GRACE;
        while Instant::now() < end
            && comps
                .iter_mut()
                .any(|c| matches!(c.child.try_wait(), Ok(None)))
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        for c in comps {
            c.stop();
        }
        if let Some(mut c) = containerd {
            if matches!(c.child.try_wait(), Ok(None)) {
                cleanup::delete_containers(&self.tools.ctr, &self.layout.containerd_socket());
            }
            cleanup::remove_pod_cgroups();
            c.stop();
        } else {
            cleanup::remove_pod_cgroups();
        }
        clean_dir(&self.layout.dir, &self.tools);
        self.new_host_dirs.remove_empty();
        self.sysctls.restore();
        if delete_node_object {
            self.delete_node_object();
        }
        if self.dir.is_some() {
            // TempDir's Drop would too, but a shared node is never dropped.
            let _ = std::fs::remove_dir_all(&self.layout.dir);
        }
        tracing::info!(node = %self.name, seconds = t0.elapsed().as_secs_f64(), "real node torn down");
    }

    /// Deletes the Node object (from a thread of its own: drop may run inside a runtime).
    fn delete_node_object(&self) {
        let (config, name) = (self.config.clone(), self.name.clone());
        let worker = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                let Ok(client) = Client::try_from(config) else {
                    return;
                };
                let nodes: Api<Node> = Api::all(client);
                let _ = tokio::time::timeout(
                    Duration::from_secs(5),
                    nodes.delete(&name, &DeleteParams::default()),
                )
                .await;
            });
        });
        let _ = worker.join();
    }
}

/// Cleans up after a node in `dir`: kills every process naming it (containerd, shims,
/// kubelet, ...) and the pods' processes, unmounts what is under it, removes the pod
/// cgroups, the bridge, the CNI results, kube-proxy's chains and the kubelet's log links
/// to it.
fn clean_dir(dir: &Path, tools: &HostTools) {
    cleanup::kill_processes_naming(dir);
    cleanup::remove_pod_cgroups();
    cleanup::unmount_under(dir);
    cleanup::delete_bridge(&tools.ip);
    cleanup::remove_cni_results();
    cleanup::remove_iptables();
    cleanup::remove_log_links(dir);
}

/// Cleans up after nodes whose test process was killed (the caller holds the lock, so no
/// node is running): their processes, mounts and directories (but the files of one kept
/// for a post-mortem), the pod cgroups, the bridge, kube-proxy's chains, the kernel
/// settings.
fn sweep_killed_nodes(tools: &HostTools) {
    let dirs = cleanup::node_dirs();
    for (dir, kept) in &dirs {
        cleanup::kill_processes_naming(dir);
        cleanup::unmount_under(dir);
        cleanup::remove_log_links(dir);
        if !kept {
            tracing::info!(dir = %dir.display(), "cleaning up after a real node whose test was killed");
            let _ = std::fs::remove_dir_all(dir);
        }
    }
    cleanup::remove_pod_cgroups();
    cleanup::delete_bridge(&tools.ip);
    cleanup::remove_cni_results();
    cleanup::remove_iptables();
    if let Some(saved) = Sysctls::left_by_a_killed_node() {
        saved.restore();
    }
}

/// The real node of this test binary ([`RealNode::shared`]).
static SHARED: OnceLock<std::result::Result<RealNode, String>> = OnceLock::new();

extern "C" fn tear_down_shared_at_exit() {
    if let Some(Ok(node)) = SHARED.get() {
        // The control plane goes too (its own exit hook runs after this one).
        node.teardown(false);
    }
}

impl RealNode {
    /// The real node of this test binary, for tests that share one: started on first use
    /// on `cluster` (this binary's shared control plane, started with
    /// `ClusterOptions::real_node`, e.g. through `shared::TestEnv::with_options`) with
    /// `opts` (the first call's), on a thread of its own that lives as long as the process,
    /// and torn down when the process exits.
    pub async fn shared(
        cluster: &'static Cluster,
        opts: RealNodeOptions,
    ) -> Result<&'static RealNode> {
        let started = tokio::task::spawn_blocking(move || {
            SHARED.get_or_init(|| start_shared(cluster, opts)).is_ok()
        })
        .await
        .map_err(|e| Error::Invalid(format!("starting the shared real node: {e}")))?;
        match SHARED.get() {
            Some(Ok(node)) if started => Ok(node),
            Some(Err(e)) => Err(Error::Invalid(format!("shared real node: {e}"))),
            _ => Err(Error::Invalid("the shared real node did not start".into())),
        }
    }
}

/// A test's namespace on its binary's control plane (started for a real node) and the
/// binary's shared real node with the default options: what the tests that share one node
/// start with.
pub async fn shared_env(name: &str) -> (crate::shared::TestEnv, &'static RealNode) {
    let env = crate::shared::TestEnv::with_options(
        name,
        crate::cluster::ClusterOptions {
            real_node: true,
            ..Default::default()
        },
    )
    .await
    .expect("control plane for a real node");
    let cluster: &'static Cluster = env.cluster();
    let node = RealNode::shared(cluster, RealNodeOptions::default())
        .await
        .expect("real node starts (needs root and tests/cluster/build-node.sh)");
    (env, node)
}

/// As [`shared_env`], with the control plane and the node started with `cluster` and `node`
/// (every test of one binary must pass the same: the first call's start them).
pub async fn shared_env_with(
    name: &str,
    cluster: crate::cluster::ClusterOptions,
    node: RealNodeOptions,
) -> (crate::shared::TestEnv, &'static RealNode) {
    let env = crate::shared::TestEnv::with_options(name, cluster)
        .await
        .expect("control plane for a real node");
    let cluster: &'static Cluster = env.cluster();
    let node = RealNode::shared(cluster, node)
        .await
        .expect("real node starts (needs root and tests/cluster/build-node.sh)");
    (env, node)
}

/// Starts the shared node on a thread that never returns: its processes die with that
/// thread (PR_SET_PDEATHSIG), that is with the process.
fn start_shared(
    cluster: &'static Cluster,
    opts: RealNodeOptions,
) -> std::result::Result<RealNode, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("shared-real-node".into())
        .spawn(move || {
            let started = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("building a runtime: {e}"))
                .and_then(|rt| {
                    rt.block_on(RealNode::start(cluster, opts))
                        .map_err(|e| e.to_string())
                });
            let _ = tx.send(started);
            loop {
                std::thread::park();
            }
        })
        .map_err(|e| format!("spawning the real node's thread: {e}"))?;
    let node = rx
        .recv()
        .map_err(|_| "the real node's thread ended without a node".to_string())??;
    // SAFETY: registers a plain function without arguments.
    unsafe {
        libc::atexit(tear_down_shared_at_exit);
    }
    Ok(node)
}

impl Drop for RealNode {
    fn drop(&mut self) {
        self.teardown(true);
        if self.dir.is_none() {
            tracing::info!(dir = %self.layout.dir.display(), "kept the real node's dir");
        }
        // TempDir's own Drop removes the dir; the lock goes last.
    }
}
