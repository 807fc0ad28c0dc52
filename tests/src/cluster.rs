//! A real local control plane for tests: etcd, kube-apiserver and kube-controller-manager
//! as child processes on free loopback ports, with generated certificates and the CRDs.
//!
//! ```no_run
//! # async fn demo() -> gpufabric_tests::Result<()> {
//! let cluster = gpufabric_tests::cluster::Cluster::start().await?;
//! let client = cluster.client();                 // admin (system:masters)
//! let kubeconfig = cluster.kubeconfig_path();    // for kubectl or the operator binary
//! # let _ = (client, kubeconfig); Ok(()) }
//! ```
//!
//! Each cluster lives in its own temp dir (certificates, kubeconfigs, etcd data and one log
//! file per component). Dropping the `Cluster` stops every process group (SIGTERM, then
//! SIGKILL) and removes the dir, also when a test panics; the processes also get
//! `PR_SET_PDEATHSIG`, so they die if the test process itself is killed. Set
//! `GPUFABRIC_KEEP_CLUSTER=1` to keep the dir (its path is logged) for a post-mortem.
//!
//! Binaries come from `$GPUFABRIC_CLUSTER_BIN`, else from `tests/cluster/build.sh
//! --print-bin-dir` (build them once with `tests/cluster/build.sh`).
//!
//! A cluster meant for a real node (`crate::realnode`) is started with
//! [`ClusterOptions::real_node`]: its API server then also listens on the host's address,
//! which pods reach through the `kubernetes` Service (`10.96.0.1:443`).

use crate::process::{harden, signal_group};
use crate::{Error, Result, io_err, kube_err, pki, workspace_root};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use nix::sys::signal::Signal;
use std::fs::File;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Env var: directory holding etcd, kube-apiserver, kube-controller-manager and kubectl.
pub const ENV_BIN: &str = "GPUFABRIC_CLUSTER_BIN";
/// Env var: `1` keeps each cluster's temp dir after the cluster is dropped.
pub const ENV_KEEP: &str = "GPUFABRIC_KEEP_CLUSTER";
/// Prefix of every cluster dir's name (tests look for it in `/proc/*/cmdline`).
pub const DIR_PREFIX: &str = "gpufabric-cluster-";

const BINARIES: [&str; 4] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kubectl",
];
const PORT_ATTEMPTS: usize = 4;
const ETCD_TIMEOUT: Duration = Duration::from_secs(60);
const APISERVER_TIMEOUT: Duration = Duration::from_secs(180);
const CRD_TIMEOUT: Duration = Duration::from_secs(60);
const STOP_GRACE: Duration = Duration::from_secs(3);

/// What to start.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Start kube-controller-manager (garbage collection, namespace deletion, service
    /// accounts, node lifecycle). Default: true.
    pub controller_manager: bool,
    /// Install the CRDs from `crds/` and wait until they are Established. Default: true.
    pub install_crds: bool,
    /// Keep the temp dir after drop. Default: `$GPUFABRIC_KEEP_CLUSTER == 1`.
    pub keep_dir: bool,
    /// Directory of the control-plane binaries. Default: [`bin_dir()`].
    pub bin_dir: Option<PathBuf>,
    /// Extra kube-apiserver flags (e.g. `--feature-gates=...`), after the harness's own.
    pub apiserver_args: Vec<String>,
    /// Extra kube-controller-manager flags (e.g. `--node-monitor-grace-period=10s`).
    pub controller_manager_args: Vec<String>,
    /// Make the control plane serve a real node (`crate::realnode::RealNode`): the API
    /// server listens on every address, advertises the host's address ([`host_ip`]) as
    /// the `kubernetes` Service's endpoint (so pods reach it at `10.96.0.1:443`), has it
    /// in its certificate, authorizes kubelets with the Node authorizer, and presents a
    /// client certificate to kubelets. Default: false (loopback only, as before).
    pub real_node: bool,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            controller_manager: true,
            install_crds: true,
            keep_dir: std::env::var(ENV_KEEP).is_ok_and(|v| v == "1"),
            bin_dir: None,
            apiserver_args: Vec::new(),
            controller_manager_args: Vec::new(),
            real_node: false,
        }
    }
}

/// A child process of the harness with its log file (`<dir>/<name>.log`).
pub(crate) struct Component {
    pub(crate) name: &'static str,
    pub(crate) child: Child,
    pub(crate) log: PathBuf,
}

/// A running local control plane. Dropping it stops everything and removes its dir.
pub struct Cluster {
    components: Vec<Component>,
    dir: Option<tempfile::TempDir>,
    dir_path: PathBuf,
    bin_dir: PathBuf,
    server: String,
    kubeconfig: PathBuf,
    config: kube::Config,
    client: Client,
    startup: Duration,
    pki: Option<pki::Pki>,
    host_ip: Option<IpAddr>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("server", &self.server)
            .field("dir", &self.dir_path)
            .finish_non_exhaustive()
    }
}

/// The directory with the control-plane binaries: `$GPUFABRIC_CLUSTER_BIN`, else what
/// `tests/cluster/build.sh --print-bin-dir` prints. Fails (saying how to build them) when
/// a binary is missing.
pub fn bin_dir() -> Result<PathBuf> {
    let dir = match std::env::var_os(ENV_BIN) {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => {
            let script = workspace_root().join("tests/cluster/build.sh");
            let out = Command::new("bash")
                .arg(&script)
                .arg("--print-bin-dir")
                .stderr(Stdio::piped())
                .output()
                .map_err(|e| Error::Binaries {
                    dir: script.clone(),
                    detail: format!("cannot run {}: {e}", script.display()),
                })?;
            let stdout = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if !out.status.success() || stdout.is_empty() {
                return Err(Error::Binaries {
                    dir: script,
                    detail: format!(
                        "`build.sh --print-bin-dir` failed: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    ),
                });
            }
            PathBuf::from(stdout)
        }
    };
    check_bin_dir(dir)
}

fn check_bin_dir(dir: PathBuf) -> Result<PathBuf> {
    let missing: Vec<&str> = BINARIES
        .iter()
        .copied()
        .filter(|b| !is_executable(&dir.join(b)))
        .collect();
    if !missing.is_empty() {
        return Err(Error::Binaries {
            dir,
            detail: format!("missing {}", missing.join(", ")),
        });
    }
    Ok(dir)
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A loopback port nothing listens on right now (the kernel picks it). Another process
/// may take it before we use it; callers retry on "address already in use".
pub(crate) fn free_port() -> Result<u16> {
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").map_err(io_err("finding a free port"))?;
    let port = listener
        .local_addr()
        .map_err(io_err("finding a free port"))?
        .port();
    Ok(port)
}

/// The host's own address: the source address of its default route, which pods on a real
/// node reach the host at. Fails on a machine without a default route.
pub fn host_ip() -> Result<IpAddr> {
    // Connecting a UDP socket sends nothing; it only picks the route and source address.
    let socket =
        std::net::UdpSocket::bind("0.0.0.0:0").map_err(io_err("finding the host's address"))?;
    socket.connect("8.8.8.8:53").map_err(io_err(
        "finding the host's address (the source of its default route)",
    ))?;
    let ip = socket
        .local_addr()
        .map_err(io_err("finding the host's address"))?
        .ip();
    if ip.is_loopback() || ip.is_unspecified() {
        return Err(Error::Invalid(format!(
            "the host's default route leaves from {ip}: a real node needs an address pods can reach"
        )));
    }
    Ok(ip)
}

/// The last `lines` lines of a log file (or why it cannot be read).
pub fn log_tail(path: &Path, lines: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// Starts `program` hardened (own process group, PR_SET_PDEATHSIG) with its output in
/// `dir/<name>.log`.
pub(crate) fn spawn(
    name: &'static str,
    program: &Path,
    args: &[String],
    dir: &Path,
) -> Result<Component> {
    let log = dir.join(format!("{name}.log"));
    let out = File::create(&log).map_err(io_err(format!("creating {}", log.display())))?;
    let err = out
        .try_clone()
        .map_err(io_err(format!("opening {}", log.display())))?;
    let mut cmd = Command::new(program);
    cmd.args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    harden(&mut cmd);
    let child = cmd
        .spawn()
        .map_err(io_err(format!("starting {}", program.display())))?;
    tracing::debug!(component = name, pid = child.id(), "started");
    Ok(Component { name, child, log })
}

impl Component {
    /// `Some(why)` when the process has exited.
    pub(crate) fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(format!("exited early with {status}")),
            Ok(None) => None,
            Err(e) => Some(format!("cannot check the process: {e}")),
        }
    }

    pub(crate) fn port_conflict(&self) -> bool {
        let tail = log_tail(&self.log, 60);
        tail.contains("address already in use") || tail.contains("bind: address")
    }

    pub(crate) fn start_error(&self, detail: impl Into<String>) -> Error {
        Error::Start {
            component: self.name.to_string(),
            detail: detail.into(),
            log: self.log.clone(),
            log_tail: log_tail(&self.log, 40),
        }
    }

    pub(crate) fn stop(mut self) {
        crate::process::stop_child(&mut self.child, STOP_GRACE);
    }
}

async fn etcd_healthy(port: u16) -> bool {
    let check = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await
            .ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).await.ok()?;
        Some(body.contains("\"health\":\"true\""))
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(3), check).await,
        Ok(Some(true))
    )
}

async fn client_for(kubeconfig: &Path) -> Result<(kube::Config, Client)> {
    let kc = Kubeconfig::read_from(kubeconfig)
        .map_err(|e| Error::Invalid(format!("reading {}: {e}", kubeconfig.display())))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Invalid(format!("loading {}: {e}", kubeconfig.display())))?;
    let client = Client::try_from(config.clone()).map_err(kube_err("creating a client"))?;
    Ok((config, client))
}

async fn apiserver_ready(client: &Client) -> bool {
    let Ok(req) = http::Request::get("/readyz").body(Vec::new()) else {
        return false;
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(5), client.request_text(req)).await,
        Ok(Ok(body)) if body.trim() == "ok"
    )
}

impl Cluster {
    /// Starts etcd, kube-apiserver and kube-controller-manager, installs the CRDs and
    /// returns when the API server is ready and the CRDs are Established.
    pub async fn start() -> Result<Cluster> {
        Cluster::start_with(ClusterOptions::default()).await
    }

    /// [`Cluster::start`] with options.
    pub async fn start_with(opts: ClusterOptions) -> Result<Cluster> {
        let t0 = Instant::now();
        let bin = match &opts.bin_dir {
            Some(d) => check_bin_dir(d.clone())?,
            None => bin_dir()?,
        };
        let dir = tempfile::Builder::new()
            .prefix(DIR_PREFIX)
            .tempdir()
            .map_err(io_err("creating the cluster dir"))?;
        let dir_path = dir.path().to_path_buf();
        // From here on, a failure drops `cluster`, which stops what was started.
        let mut cluster = Cluster {
            components: Vec::new(),
            dir: Some(dir),
            dir_path: dir_path.clone(),
            bin_dir: bin.clone(),
            server: String::new(),
            kubeconfig: dir_path.join("admin.kubeconfig"),
            config: kube::Config::new(
                "https://127.0.0.1:1"
                    .parse()
                    .map_err(|e| Error::Invalid(format!("placeholder url: {e}")))?,
            ),
            client: placeholder_client()?,
            startup: Duration::ZERO,
            pki: None,
            host_ip: None,
        };
        if opts.keep_dir
            && let Some(d) = cluster.dir.take()
        {
            let _ = d.keep();
        }
        if opts.real_node {
            cluster.host_ip = Some(host_ip()?);
        }
        let pki = pki::write(&dir_path, cluster.host_ip.as_slice())?;
        let etcd_port = cluster.start_etcd(&bin, &dir_path).await?;
        cluster
            .start_apiserver(&bin, &dir_path, etcd_port, &pki, &opts.apiserver_args)
            .await?;
        let t_api = t0.elapsed();
        if opts.controller_manager {
            let kcm_kubeconfig = dir_path.join("controller-manager.kubeconfig");
            std::fs::write(
                &kcm_kubeconfig,
                pki::kubeconfig_yaml(
                    &cluster.server,
                    &pki.ca_cert,
                    &pki.controller_manager_cert,
                    &pki.controller_manager_key,
                    "system:kube-controller-manager",
                ),
            )
            .map_err(io_err("writing the controller-manager kubeconfig"))?;
            let k = kcm_kubeconfig.display().to_string();
            let mut args = vec![
                format!("--kubeconfig={k}"),
                format!("--authentication-kubeconfig={k}"),
                format!("--authorization-kubeconfig={k}"),
                "--bind-address=127.0.0.1".into(),
                "--secure-port=0".into(),
                "--leader-elect=false".into(),
                "--use-service-account-credentials=true".into(),
                format!(
                    "--service-account-private-key-file={}",
                    pki.sa_key.display()
                ),
                format!("--root-ca-file={}", pki.ca_cert.display()),
                format!("--cluster-signing-cert-file={}", pki.ca_cert.display()),
                format!("--cluster-signing-key-file={}", pki.ca_key.display()),
                // Its flexvolume prober would create the default dir under /usr/libexec.
                format!(
                    "--flex-volume-plugin-dir={}",
                    dir_path.join("flexvolume").display()
                ),
                "--v=1".into(),
            ];
            args.extend(opts.controller_manager_args.iter().cloned());
            let kcm = spawn(
                "kube-controller-manager",
                &bin.join("kube-controller-manager"),
                &args,
                &dir_path,
            )?;
            cluster.components.push(kcm);
        }
        cluster.pki = Some(pki);
        if opts.install_crds {
            cluster.install_crds().await?;
        }
        cluster.startup = t0.elapsed();
        tracing::info!(
            server = %cluster.server,
            dir = %dir_path.display(),
            apiserver_ready_s = t_api.as_secs_f64(),
            total_s = cluster.startup.as_secs_f64(),
            "local control plane up"
        );
        Ok(cluster)
    }

    async fn start_etcd(&mut self, bin: &Path, dir: &Path) -> Result<u16> {
        for attempt in 1..=PORT_ATTEMPTS {
            let (client_port, peer_port) = (free_port()?, free_port()?);
            let data = dir.join("etcd-data");
            let _ = std::fs::remove_dir_all(&data);
            let args = vec![
                "--name=default".to_string(),
                format!("--data-dir={}", data.display()),
                format!("--listen-client-urls=http://127.0.0.1:{client_port}"),
                format!("--advertise-client-urls=http://127.0.0.1:{client_port}"),
                format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-cluster=default=http://127.0.0.1:{peer_port}"),
                "--unsafe-no-fsync".into(),
                "--log-level=warn".into(),
            ];
            let mut etcd = spawn("etcd", &bin.join("etcd"), &args, dir)?;
            let end = Instant::now() + ETCD_TIMEOUT;
            loop {
                if etcd_healthy(client_port).await {
                    self.components.push(etcd);
                    return Ok(client_port);
                }
                if let Some(why) = etcd.exited() {
                    if etcd.port_conflict() && attempt < PORT_ATTEMPTS {
                        tracing::debug!("etcd port conflict, retrying with other ports");
                        break;
                    }
                    return Err(etcd.start_error(why));
                }
                if Instant::now() > end {
                    let e = etcd.start_error(format!(
                        "no healthy /health on 127.0.0.1:{client_port} within {}s",
                        ETCD_TIMEOUT.as_secs()
                    ));
                    etcd.stop();
                    return Err(e);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            etcd.stop();
        }
        Err(Error::Invalid("etcd: no free ports after retries".into()))
    }

    async fn start_apiserver(
        &mut self,
        bin: &Path,
        dir: &Path,
        etcd_port: u16,
        pki: &pki::Pki,
        extra: &[String],
    ) -> Result<()> {
        for attempt in 1..=PORT_ATTEMPTS {
            let port = free_port()?;
            let mut args = vec![
                format!("--etcd-servers=http://127.0.0.1:{etcd_port}"),
                format!("--secure-port={port}"),
                format!("--tls-cert-file={}", pki.apiserver_cert.display()),
                format!("--tls-private-key-file={}", pki.apiserver_key.display()),
                format!("--client-ca-file={}", pki.ca_cert.display()),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
                format!("--service-account-key-file={}", pki.sa_pub.display()),
                format!(
                    "--service-account-signing-key-file={}",
                    pki.sa_key.display()
                ),
                format!("--service-cluster-ip-range={}", pki::SERVICE_CIDR),
                "--anonymous-auth=false".into(),
                "--enable-priority-and-fairness=false".into(),
                // `kubectl logs` reaches the process-kubelet's log server at the nodes'
                // InternalIP (127.0.0.1), a real kubelet at the host's address; their
                // Hostname address does not resolve.
                "--kubelet-preferred-address-types=InternalIP".into(),
                "--v=1".into(),
            ];
            match self.host_ip {
                None => args.extend([
                    "--bind-address=127.0.0.1".into(),
                    "--advertise-address=127.0.0.1".into(),
                    "--authorization-mode=RBAC".into(),
                    // The `kubernetes` Service cannot point at a loopback address; nothing
                    // in these clusters uses it.
                    "--endpoint-reconciler-type=none".into(),
                ]),
                Some(ip) => args.extend([
                    // Loopback for the harness's kubeconfigs, the host's address for pods
                    // (through the `kubernetes` Service, whose endpoint it advertises).
                    "--bind-address=0.0.0.0".into(),
                    format!("--advertise-address={ip}"),
                    // A kubelet (user system:node:<name>) may do what a node does.
                    "--authorization-mode=Node,RBAC".into(),
                    format!(
                        "--kubelet-client-certificate={}",
                        pki.apiserver_kubelet_client_cert.display()
                    ),
                    format!(
                        "--kubelet-client-key={}",
                        pki.apiserver_kubelet_client_key.display()
                    ),
                ]),
            }
            args.extend(extra.iter().cloned());
            let mut api = spawn("kube-apiserver", &bin.join("kube-apiserver"), &args, dir)?;
            self.server = format!("https://127.0.0.1:{port}");
            std::fs::write(
                &self.kubeconfig,
                pki::kubeconfig_yaml(
                    &self.server,
                    &pki.ca_cert,
                    &pki.admin_cert,
                    &pki.admin_key,
                    "gpufabric-admin",
                ),
            )
            .map_err(io_err("writing the admin kubeconfig"))?;
            let (config, client) = client_for(&self.kubeconfig).await?;
            let end = Instant::now() + APISERVER_TIMEOUT;
            loop {
                if apiserver_ready(&client).await {
                    self.config = config;
                    self.client = client;
                    self.components.push(api);
                    return Ok(());
                }
                if let Some(why) = api.exited() {
                    if api.port_conflict() && attempt < PORT_ATTEMPTS {
                        tracing::debug!("kube-apiserver port conflict, retrying");
                        break;
                    }
                    return Err(api.start_error(why));
                }
                if Instant::now() > end {
                    let e = api.start_error(format!(
                        "/readyz on {} not ok within {}s",
                        self.server,
                        APISERVER_TIMEOUT.as_secs()
                    ));
                    api.stop();
                    return Err(e);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            api.stop();
        }
        Err(Error::Invalid(
            "kube-apiserver: no free port after retries".into(),
        ))
    }

    /// Creates the CRDs from `crds/*.yaml` and waits until each is Established.
    async fn install_crds(&self) -> Result<()> {
        let crd_dir = workspace_root().join("crds");
        let mut files: Vec<PathBuf> = std::fs::read_dir(&crd_dir)
            .map_err(io_err(format!("listing {}", crd_dir.display())))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
            .collect();
        files.sort();
        let api: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let mut names = Vec::new();
        for file in &files {
            let text = std::fs::read_to_string(file)
                .map_err(io_err(format!("reading {}", file.display())))?;
            let crd: CustomResourceDefinition = serde_yaml::from_str(&text)
                .map_err(|e| Error::Invalid(format!("parsing {}: {e}", file.display())))?;
            let name = crd.metadata.name.clone().unwrap_or_default();
            api.create(&PostParams::default(), &crd)
                .await
                .map_err(kube_err(format!("creating CRD from {}", file.display())))?;
            names.push(name);
        }
        for name in &names {
            let cond = kube::runtime::wait::conditions::is_crd_established();
            tokio::time::timeout(
                CRD_TIMEOUT,
                kube::runtime::wait::await_condition(api.clone(), name, cond),
            )
            .await
            .map_err(|_| Error::Timeout {
                what: format!("CRD {name} to be Established"),
                seconds: CRD_TIMEOUT.as_secs(),
            })?
            .map_err(|e| Error::Invalid(format!("watching CRD {name}: {e}")))?;
        }
        tracing::debug!(crds = ?names, "CRDs established");
        Ok(())
    }

    /// Starts another component (e.g. kube-scheduler) against this control plane, stopped
    /// with it; its log is `<dir>/<name>.log`.
    pub fn start_extra(
        &mut self,
        name: &'static str,
        program: &Path,
        args: &[String],
    ) -> Result<()> {
        let c = spawn(name, program, args, &self.dir_path)?;
        self.components.push(c);
        Ok(())
    }

    /// An admin client (O=system:masters) of this cluster, bound to the runtime that
    /// started the cluster. From another tokio runtime, use [`Cluster::new_client`].
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// A fresh admin client for the current tokio runtime.
    pub fn new_client(&self) -> Result<Client> {
        Client::try_from(self.config.clone()).map_err(kube_err("creating a client"))
    }

    /// The client configuration (admin credentials).
    pub fn config(&self) -> &kube::Config {
        &self.config
    }

    /// Admin kubeconfig (client certificate), for kubectl and the operator binary. It
    /// references certificate files in the cluster dir: valid while the cluster lives.
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig
    }

    /// `https://127.0.0.1:<port>`.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The certificates of this cluster (its CA issues more with [`pki::Pki::issue_client`]).
    pub fn pki(&self) -> Result<&pki::Pki> {
        self.pki
            .as_ref()
            .ok_or_else(|| Error::Invalid("the cluster has no certificates yet".into()))
    }

    /// The host's address the API server also listens on, for a cluster started with
    /// [`ClusterOptions::real_node`]; `None` for a loopback-only cluster.
    pub fn host_ip(&self) -> Option<IpAddr> {
        self.host_ip
    }

    /// The cluster's temp dir (certificates, kubeconfigs, etcd data, logs).
    pub fn dir(&self) -> &Path {
        &self.dir_path
    }

    /// Directory of etcd, kube-apiserver, kube-controller-manager and kubectl.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// Log file of a component: `etcd`, `kube-apiserver` or `kube-controller-manager`.
    pub fn log_path(&self, component: &str) -> PathBuf {
        self.dir_path.join(format!("{component}.log"))
    }

    /// How long [`Cluster::start`] took (binaries found to CRDs Established).
    pub fn startup_time(&self) -> Duration {
        self.startup
    }

    /// Process ids of the control-plane processes (each leads its own process group).
    pub fn pids(&self) -> Vec<u32> {
        self.components.iter().map(|c| c.child.id()).collect()
    }

    /// A `kubectl` command with `--kubeconfig` set to the admin kubeconfig.
    pub fn kubectl(&self) -> Command {
        let mut cmd = Command::new(self.bin_dir.join("kubectl"));
        cmd.arg(format!("--kubeconfig={}", self.kubeconfig.display()));
        cmd
    }

    /// Labels namespace `name` to enforce Pod Security `level` (`restricted`, `baseline`,
    /// `privileged`), as an installation of gpufabric must: the chart's admission policy lets
    /// the operator create benchmark pods only in a namespace that enforces a level.
    pub async fn enforce_pod_security(&self, name: &str, level: &str) -> Result<()> {
        let client = self.new_client()?;
        let patch = serde_json::json!({"metadata": {"labels": {
            "pod-security.kubernetes.io/enforce": level,
            "pod-security.kubernetes.io/enforce-version": "latest",
        }}});
        Api::<Namespace>::all(client)
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .map(|_| ())
            .map_err(kube_err(format!("labelling namespace {name}")))
    }

    /// Creates a namespace and waits until its `default` ServiceAccount exists (the
    /// API server refuses pods in a namespace without it).
    pub async fn create_namespace(&self, name: &str) -> Result<()> {
        let client = self.new_client()?;
        let ns: Api<Namespace> = Api::all(client.clone());
        let obj = Namespace {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                ..Default::default()
            },
            ..Default::default()
        };
        match ns.create(&PostParams::default(), &obj).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(kube_err(format!("creating namespace {name}"))(e)),
        }
        let sa: Api<ServiceAccount> = Api::namespaced(client, name);
        crate::wait::poll(
            &format!("ServiceAccount {name}/default"),
            Duration::from_secs(60),
            Duration::from_millis(100),
            || async {
                Ok(sa
                    .get_opt("default")
                    .await
                    .map_err(kube_err("reading the default ServiceAccount"))?
                    .map(|_| ()))
            },
        )
        .await
    }
}

fn placeholder_client() -> Result<Client> {
    // Never used for requests: replaced as soon as the API server is up. `Client`
    // needs a runtime to be built, which every caller of `start` has.
    let url = "https://127.0.0.1:1"
        .parse()
        .map_err(|e| Error::Invalid(format!("placeholder url: {e}")))?;
    Client::try_from(kube::Config::new(url)).map_err(kube_err("creating a client"))
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Signal every group at once, so the whole cluster stops within one grace period.
        let mut comps = std::mem::take(&mut self.components);
        for c in comps.iter().rev() {
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
        for c in comps.into_iter().rev() {
            tracing::debug!(component = c.name, "stopping");
            c.stop();
        }
        if self.dir.is_none() {
            tracing::info!(dir = %self.dir_path.display(), "kept the cluster dir");
        }
        // TempDir's own Drop removes the dir.
    }
}
