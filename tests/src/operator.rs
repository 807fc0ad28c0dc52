//! The real `fabric-operator` binary as a child process of a test: started against a local
//! cluster, restartable, killed (SIGKILL, as in a crash) on drop, with its admin endpoints.

use crate::cluster::{Cluster, log_tail};
use crate::kubelet::default_agent_bin_dir;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// A running `fabric-operator run` process.
pub struct OperatorProcess {
    args: Vec<String>,
    env: Vec<(String, String)>,
    child: Option<Child>,
    log: PathBuf,
    admin: String,
    kubeconfig: PathBuf,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

impl OperatorProcess {
    /// Starts `fabric-operator run` against `cluster`, its stderr appended to `log`.
    /// Panics with what to do when the binary has not been built.
    pub fn start(cluster: &Cluster, log: PathBuf) -> OperatorProcess {
        OperatorProcess::start_with(cluster, log, &[], &[])
    }

    /// As [`OperatorProcess::start`], with extra arguments of `run` and extra environment.
    pub fn start_with(
        cluster: &Cluster,
        log: PathBuf,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> OperatorProcess {
        OperatorProcess::start_as(cluster.kubeconfig_path().to_path_buf(), log, args, env)
    }

    /// As [`OperatorProcess::start_with`], connecting with `kubeconfig` instead of the
    /// cluster's admin credentials (e.g. a ServiceAccount's token).
    pub fn start_as(
        kubeconfig: PathBuf,
        log: PathBuf,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> OperatorProcess {
        let mut op = OperatorProcess {
            args: args.iter().map(|a| a.to_string()).collect(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            child: None,
            log,
            admin: String::new(),
            kubeconfig,
        };
        op.restart();
        op
    }

    /// `127.0.0.1:<port>` of the admin server (/metrics, /live, /ready).
    pub fn admin_addr(&self) -> &str {
        &self.admin
    }

    /// Starts the process again (after [`OperatorProcess::kill`]), on a new admin port.
    pub fn restart(&mut self) {
        let bin = default_agent_bin_dir().join("fabric-operator");
        assert!(
            bin.is_file(),
            "{} is missing: run `cargo build -p gpufabric-operator` first",
            bin.display()
        );
        self.admin = format!("127.0.0.1:{}", free_port());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("operator log");
        let mut cmd = Command::new(bin);
        // Killed with the test process, even when the test process is killed.
        crate::process::harden(&mut cmd);
        cmd.args(["run", "--kubeconfig"])
            .arg(&self.kubeconfig)
            .args(["--admin-addr", &self.admin])
            .args(&self.args)
            // The cluster-wide cap (10% by default, at least 1 node) is off unless a test
            // passes --max-quarantined-nodes (which wins over this): the small fleets here
            // quarantine several nodes under their tests' own budgets.
            .env("FABRIC_MAX_QUARANTINED_NODES", "none");
        // /metrics open to the tests' plain reads unless the test chose how it is guarded.
        if !self.args.iter().any(|a| a.starts_with("--metrics-auth")) {
            cmd.args(["--metrics-auth", "none"]);
        }
        let child = cmd
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .env("RUST_LOG", "info,gpufabric_operator=debug,kube=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("fabric-operator starts");
        self.child = Some(child);
    }

    /// SIGKILL: the operator gets no chance to clean up, as in a crash or an OOM kill.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, as Kubernetes stops a pod; waits up to `grace` for it to exit (then
    /// SIGKILL). Returns how long it took to exit, or None when it had to be killed.
    pub fn terminate(&mut self, grace: std::time::Duration) -> Option<std::time::Duration> {
        let mut c = self.child.take()?;
        let start = std::time::Instant::now();
        let pid = nix::unistd::Pid::from_raw(c.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        while start.elapsed() < grace {
            if let Ok(Some(_)) = c.try_wait() {
                return Some(start.elapsed());
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = c.kill();
        let _ = c.wait();
        None
    }

    /// Process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// The last lines of its log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log, lines)
    }

    /// Whether the operator logged that it wrote the node signals of run `run`.
    pub fn wrote_signals_of(&self, run: &str) -> bool {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .any(|l| l.contains("node signals written") && l.contains(run))
    }

    /// `GET path` on the admin port: status code and the whole response, or None when it
    /// does not answer.
    pub async fn get(&self, path: &str) -> Option<(u16, String)> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(&self.admin).await.ok()?;
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.ok()?;
        let mut buf = String::new();
        s.read_to_string(&mut buf).await.ok()?;
        let code = buf.split_whitespace().nth(1)?.parse().ok()?;
        Some((code, buf))
    }

    /// The Prometheus text of `/metrics` (empty when it does not answer).
    pub async fn metrics(&self) -> String {
        self.get("/metrics")
            .await
            .map(|(_, body)| body)
            .unwrap_or_default()
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The control plane of an [`OperatorEnv`]: its own, or the test binary's shared one.
pub enum EnvCluster {
    Own(Box<Cluster>),
    Shared(crate::shared::TestEnv),
}

impl EnvCluster {
    /// An admin client for this test's runtime. On the shared control plane that is the
    /// environment's own: the shared cluster's client keeps its pooled connections on the
    /// runtime that opened them, and another test's runtime ending closes them under a
    /// watch of this test.
    pub fn client(&self) -> kube::Client {
        match self {
            EnvCluster::Own(c) => c.client(),
            EnvCluster::Shared(env) => env.client(),
        }
    }
}

impl std::ops::Deref for EnvCluster {
    type Target = Cluster;
    fn deref(&self) -> &Cluster {
        match self {
            EnvCluster::Own(c) => c,
            EnvCluster::Shared(env) => env.cluster(),
        }
    }
}

/// What an operator end-to-end test runs against: a local control plane, a simulated fleet
/// (its file in `dir`, so a test can rewrite it to repair a node), the process-kubelet, the
/// operator's namespace and the operator. Dropped in reverse order of start.
pub struct OperatorEnv {
    pub operator: OperatorProcess,
    pub kubelet: crate::kubelet::Kubelet,
    pub fleet: crate::fleet::SimFleet,
    pub cluster: EnvCluster,
    pub dir: tempfile::TempDir,
    /// The operator's namespace: its benchmark pods (and Lease) live there. FabricTests
    /// and their runs are cluster-scoped.
    pub ns: String,
    /// The arguments that make an operator act on this environment only: its pod
    /// namespace and, on the shared control plane, the label selector of its FabricTests.
    operator_args: Vec<String>,
    /// Labels every FabricTest made by [`OperatorEnv::create_test`] carries.
    test_labels: serde_json::Value,
}

/// The `agent` of a FabricTest spec that runs the real `fabric-agent` on its sim backend.
pub fn sim_agent(timeout_seconds: u32) -> serde_json::Value {
    serde_json::json!({
        "image": "fabric-agent:test",
        "timeoutSeconds": timeout_seconds,
        "env": [{"name": "FABRIC_BACKEND", "value": "sim"}]
    })
}

/// The `quarantine` of a FabricTest spec that acts in `mode` on a node's first failure
/// (after a confirmation run where `confirm_retest`) and may hold every node.
pub fn quarantine_on_first_failure(mode: &str, confirm_retest: bool) -> serde_json::Value {
    serde_json::json!({
        "mode": mode,
        "maxQuarantined": "100%",
        "failuresToQuarantine": 1,
        "confirmRetest": confirm_retest
    })
}

/// The `suite` of a FabricTest spec that runs the node pairs alone: a ring of 256 MiB pair
/// tests, the single-node NCCL sweep and DDP probe off.
pub fn node_pairs_suite() -> serde_json::Value {
    serde_json::json!({
        "ncclSweep": {"enabled": false},
        "ddpProbe": {"enabled": false},
        "nodePairs": {"enabled": true, "pairing": "ring", "bytes": 268435456}
    })
}

/// The name of the run a FabricTest status last folded in (`""` before the first).
pub fn last_run_name(s: &gpufabric_api::FabricTestStatus) -> String {
    s.last_run.clone().map(|l| l.name).unwrap_or_default()
}

impl OperatorEnv {
    /// Starts everything for `fleet` on a control plane of its own, with the operator's
    /// namespace `ns` created.
    pub async fn start(fleet: gpufabric_measure::fleet::Fleet, ns: &str) -> OperatorEnv {
        OperatorEnv::start_own(fleet, ns, &[]).await
    }

    /// [`OperatorEnv::start`], with more arguments for `fabric-operator run`: for settings
    /// that depend on every node of the cluster (a percent cap counts all GPU nodes), which
    /// a shared control plane would mix with other tests' nodes.
    pub async fn start_own(
        fleet: gpufabric_measure::fleet::Fleet,
        ns: &str,
        operator_args: &[&str],
    ) -> OperatorEnv {
        crate::init_tracing();
        let cluster = Cluster::start().await.expect("local control plane starts");
        cluster.create_namespace(ns).await.expect("namespace");
        let cluster = EnvCluster::Own(Box::new(cluster));
        let mut args = vec!["--pod-namespace".to_string(), ns.to_string()];
        args.extend(operator_args.iter().map(|a| a.to_string()));
        OperatorEnv::start_on(cluster, fleet, ns, args, serde_json::json!({})).await
    }

    /// Starts everything for `fleet` on a control plane of its own that serves DRA and
    /// device taints ([`crate::dra::cluster_options`]), with the real kube-scheduler, the
    /// fixture driver's DeviceClass and the operator's namespace `ns` (with its `default`
    /// service account). The test publishes the GPUs of the nodes it wants as DRA devices;
    /// the nodes named in `dra_only` report no `nvidia.com/gpu`, their GPUs are those devices
    /// alone.
    pub async fn start_dra(
        fleet: gpufabric_measure::fleet::Fleet,
        ns: &str,
        dra_only: &[&str],
    ) -> OperatorEnv {
        crate::init_tracing();
        let mut cluster = Cluster::start_with(crate::dra::cluster_options())
            .await
            .expect("local control plane with DRA starts");
        crate::dra::start_scheduler(&mut cluster).expect("kube-scheduler starts");
        cluster.create_namespace(ns).await.expect("namespace");
        let client = cluster.client();
        crate::dra::service_account(&client, ns)
            .await
            .expect("service account");
        crate::dra::create_device_class(&client)
            .await
            .expect("device class");
        let cluster = EnvCluster::Own(Box::new(cluster));
        let args = vec!["--pod-namespace".to_string(), ns.to_string()];
        let opts = crate::kubelet::KubeletOptions {
            dra_only_nodes: dra_only.iter().map(|n| n.to_string()).collect(),
            ..Default::default()
        };
        OperatorEnv::start_with_kubelet(cluster, fleet, ns, args, serde_json::json!({}), opts).await
    }

    /// Starts everything for `fleet` on the test binary's shared control plane, with a
    /// namespace of its own (`<name>-<n>`, see [`OperatorEnv::ns`]) for the operator's pods;
    /// the nodes are named and labelled as [`crate::shared::TestEnv::fleet`] does, and the
    /// operator watches only the FabricTests with this environment's label (which
    /// [`OperatorEnv::create_test`] sets). FabricTest names are cluster-wide: tests sharing
    /// a control plane give their FabricTests different names.
    pub async fn shared(fleet: gpufabric_measure::fleet::Fleet, name: &str) -> OperatorEnv {
        OperatorEnv::shared_with(fleet, name, &[]).await
    }

    /// [`OperatorEnv::shared`], with more arguments for `fabric-operator run`.
    pub async fn shared_with(
        fleet: gpufabric_measure::fleet::Fleet,
        name: &str,
        operator_args: &[&str],
    ) -> OperatorEnv {
        let env = crate::shared::TestEnv::new(name)
            .await
            .expect("test environment");
        let fleet = env.fleet(fleet);
        let ns = env.ns().to_string();
        let (k, v) = env.label();
        let labels = serde_json::json!({ k: v });
        let mut args = vec![
            "--pod-namespace".to_string(),
            ns.clone(),
            "--selector".to_string(),
            env.selector(),
        ];
        args.extend(operator_args.iter().map(|a| a.to_string()));
        OperatorEnv::start_on(EnvCluster::Shared(env), fleet, &ns, args, labels).await
    }

    async fn start_on(
        cluster: EnvCluster,
        fleet: gpufabric_measure::fleet::Fleet,
        ns: &str,
        operator_args: Vec<String>,
        test_labels: serde_json::Value,
    ) -> OperatorEnv {
        let opts = crate::kubelet::KubeletOptions::default();
        OperatorEnv::start_with_kubelet(cluster, fleet, ns, operator_args, test_labels, opts).await
    }

    /// [`OperatorEnv::start_on`] with the process-kubelet's options (its `root_dir` is the
    /// environment's own).
    async fn start_with_kubelet(
        cluster: EnvCluster,
        fleet: gpufabric_measure::fleet::Fleet,
        ns: &str,
        operator_args: Vec<String>,
        test_labels: serde_json::Value,
        opts: crate::kubelet::KubeletOptions,
    ) -> OperatorEnv {
        let dir = tempfile::tempdir().expect("temp dir");
        let fleet = crate::fleet::SimFleet::write_to(fleet, dir.path().join("fleet.yaml"))
            .expect("fleet file");
        let opts = crate::kubelet::KubeletOptions {
            root_dir: Some(dir.path().join("kubelet")),
            ..opts
        };
        let client = cluster.new_client().expect("client");
        let kubelet = crate::kubelet::Kubelet::start(client, &fleet, opts)
            .await
            .expect("kubelet starts");
        let log = dir.path().join("operator.log");
        let args: Vec<&str> = operator_args.iter().map(String::as_str).collect();
        let operator = OperatorProcess::start_with(&cluster, log, &args, &[]);
        OperatorEnv {
            operator,
            kubelet,
            fleet,
            cluster,
            dir,
            ns: ns.to_string(),
            operator_args,
            test_labels,
        }
    }

    /// The arguments of `fabric-operator run` that make another operator of this
    /// environment (a second replica, a restarted one) act on it alone.
    pub fn operator_args(&self) -> Vec<&str> {
        self.operator_args.iter().map(String::as_str).collect()
    }

    /// The API of FabricTests (cluster-scoped).
    pub fn tests_api(&self) -> kube::Api<gpufabric_api::FabricTest> {
        kube::Api::all(self.cluster.client())
    }

    /// The API of FabricTestRuns (cluster-scoped).
    pub fn runs_api(&self) -> kube::Api<gpufabric_api::run::FabricTestRun> {
        kube::Api::all(self.cluster.client())
    }

    /// The API of the benchmark pods (in the operator's namespace).
    pub fn pods_api(&self) -> kube::Api<k8s_openapi::api::core::v1::Pod> {
        kube::Api::namespaced(self.cluster.client(), &self.ns)
    }

    /// Creates the FabricTest `name` (cluster-scoped, with this environment's labels) with
    /// `spec` (JSON, as a user writes it); returns the API it lives in.
    pub async fn create_test(
        &self,
        name: &str,
        spec: serde_json::Value,
    ) -> kube::Api<gpufabric_api::FabricTest> {
        let api = self.tests_api();
        let t: gpufabric_api::FabricTest = serde_json::from_value(serde_json::json!({
            "apiVersion": "gpufabric.io/v1alpha1",
            "kind": "FabricTest",
            "metadata": {"name": name, "labels": self.test_labels},
            "spec": spec,
        }))
        .expect("valid FabricTest");
        api.create(&kube::api::PostParams::default(), &t)
            .await
            .expect("FabricTest created");
        api
    }

    /// Waits (up to 180 s) until FabricTest `name` has folded a run other than `previous`
    /// into its status and has none active; panics with the operator's log otherwise.
    pub async fn wait_folded(
        &self,
        name: &str,
        previous: Option<&str>,
    ) -> gpufabric_api::FabricTestStatus {
        let api = self.tests_api();
        let r = crate::wait::for_object(&api, name, std::time::Duration::from_secs(180), |t| {
            t.and_then(|t| t.status.as_ref()).is_some_and(|s| {
                s.active_run.is_none()
                    && s.last_run
                        .as_ref()
                        .is_some_and(|l| Some(l.name.as_str()) != previous)
            })
        })
        .await;
        let status = match r {
            Ok(Some(t)) => t.status.unwrap_or_default(),
            other => panic!(
                "{name}: no run after {previous:?} folded: {other:?}\noperator log:\n{}",
                self.operator.log_tail(80)
            ),
        };
        // The node signals follow the status (none while the breaker is open): wait for them
        // too, so that what the nodes carry is the folded run's.
        let breaker_open = status
            .conditions
            .iter()
            .any(|c| c.type_ == "BreakerOpen" && c.status == "True");
        if let Some(run) = status.last_run.as_ref().map(|l| l.name.clone())
            && !breaker_open
        {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while !self.operator.wrote_signals_of(&run) && std::time::Instant::now() < deadline {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        }
        // The error counters follow the fold as well (`CountersRecorded`).
        if let Some(run) = status.last_run.as_ref().map(|l| l.name.clone()) {
            self.wait_counters_recorded(&run).await;
        }
        status
    }

    /// Waits (up to 60 s) until the run `run` has recorded its nodes' error counters: its
    /// `CountersRecorded` condition is not False.
    pub async fn wait_counters_recorded(&self, run: &str) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let pending = self
                .runs_api()
                .get_opt(run)
                .await
                .ok()
                .flatten()
                .is_some_and(|r| {
                    r.status.is_some_and(|s| {
                        s.conditions
                            .iter()
                            .any(|c| c.type_ == "CountersRecorded" && c.status == "False")
                    })
                });
            if !pending {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{run}: error counters not recorded within 60 s\noperator log:\n{}",
                self.operator.log_tail(80)
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// Waits (up to 180 s) until a pod of `role` (its `gpufabric.io/role` label) runs on
    /// `node`; then the node stops reporting (NotReady) while that pod still reads Running.
    /// Once FabricTest `test` has folded its run, the node is Ready again. Returns the run's
    /// name and status.
    pub async fn fold_with_node_lost_under(
        &self,
        test: &str,
        node: &str,
        role: &str,
    ) -> (String, gpufabric_api::run::FabricTestRunStatus) {
        let pods = self.pods_api();
        let role = format!("{}={role}", gpufabric_api::keys::LABEL_ROLE);
        crate::wait::poll(
            &format!("a {role} pod running on {node}"),
            std::time::Duration::from_secs(180),
            std::time::Duration::from_millis(200),
            || async {
                let params = kube::api::ListParams::default().labels(&role);
                let Ok(listed) = pods.list(&params).await else {
                    return Ok(None);
                };
                let running = listed.items.iter().any(|p| {
                    p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
                        && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                });
                Ok(running.then_some(()))
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", self.operator.log_tail(80)));
        self.kubelet
            .set_node_ready(node, false)
            .await
            .expect("NotReady");
        let run = last_run_name(&self.wait_folded(test, None).await);
        let status = self.run_status(&run).await;
        self.kubelet
            .set_node_ready(node, true)
            .await
            .expect("Ready again");
        (run, status)
    }

    /// Asserts that a run held nothing against any node: no Critical finding in `status`, and
    /// none of `nodes` (name and verdict) Failed or cordoned.
    pub async fn assert_none_held<'a>(
        &self,
        status: &gpufabric_api::run::FabricTestRunStatus,
        nodes: impl IntoIterator<Item = (&'a str, gpufabric_api::run::NodeVerdict)>,
    ) {
        let critical: Vec<_> = status
            .findings
            .iter()
            .filter(|f| f.severity == gpufabric_api::findings::Severity::Critical)
            .collect();
        assert!(critical.is_empty(), "{critical:#?}");
        let api: kube::Api<k8s_openapi::api::core::v1::Node> =
            kube::Api::all(self.cluster.client());
        for (name, verdict) in nodes {
            let log = self.operator.log_tail(120);
            assert_ne!(
                verdict,
                gpufabric_api::run::NodeVerdict::Failed,
                "{name}\n{log}"
            );
            let node = api.get(name).await.expect("node");
            assert!(!cordoned(&node), "{name} cordoned\n{log}");
        }
    }

    /// Asks for a run of FabricTest `name` now, as a person does: the run-now annotation.
    pub async fn run_now(&self, name: &str) {
        let annotations = serde_json::json!({gpufabric_api::keys::ANNOTATION_RUN_NOW: "true"});
        let patch = serde_json::json!({"metadata": {"annotations": annotations}});
        self.tests_api()
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&patch),
            )
            .await
            .expect("run-now annotation");
    }

    /// The status of the FabricTestRun `run` (empty while it has none).
    pub async fn run_status(&self, run: &str) -> gpufabric_api::run::FabricTestRunStatus {
        let run = self.runs_api().get(run).await.expect("run");
        run.status.unwrap_or_default()
    }

    /// The runs of FabricTest `test`, oldest first.
    pub async fn runs_of(&self, test: &str) -> Vec<gpufabric_api::run::FabricTestRun> {
        use kube::ResourceExt;
        let selector = format!("{}={test}", gpufabric_api::keys::LABEL_TEST);
        let mut runs = self
            .runs_api()
            .list(&kube::api::ListParams::default().labels(&selector))
            .await
            .expect("runs listed")
            .items;
        runs.sort_by_key(|r| r.creation_timestamp());
        runs
    }

    /// Node `base` of the fleet, as the API server has it now.
    pub async fn read_node(&self, base: &str) -> k8s_openapi::api::core::v1::Node {
        let api: kube::Api<k8s_openapi::api::core::v1::Node> =
            kube::Api::all(self.cluster.client());
        api.get(&self.node(base)).await.expect("node read")
    }

    /// Every node of the fleet, by name: all the nodes this environment's operator could
    /// change.
    pub async fn nodes(
        &self,
    ) -> std::collections::BTreeMap<String, k8s_openapi::api::core::v1::Node> {
        let api: kube::Api<k8s_openapi::api::core::v1::Node> =
            kube::Api::all(self.cluster.client());
        let mut out = std::collections::BTreeMap::new();
        for name in self.fleet.node_names() {
            let n = api.get(&name).await.expect("node");
            out.insert(name, n);
        }
        out
    }

    /// Sets annotation `key` of node `base` to `value` (merged over the node's others).
    pub async fn annotate_node(&self, base: &str, key: &str, value: &str) {
        let api: kube::Api<k8s_openapi::api::core::v1::Node> =
            kube::Api::all(self.cluster.client());
        let patch = serde_json::json!({"metadata": {"annotations": {key: value}}});
        api.patch(
            &self.node(base),
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap_or_else(|e| panic!("annotate {base}: {e}"));
    }

    /// The name this environment gives node `base` of its fleet (as is on a control plane
    /// of its own, prefixed on the shared one).
    pub fn node(&self, base: &str) -> String {
        match &self.cluster {
            EnvCluster::Own(_) => base.to_string(),
            EnvCluster::Shared(env) => env.node(base),
        }
    }

    /// The node selector of this environment's nodes (`pool: training`, and on the shared
    /// control plane its env label).
    pub fn node_selector(&self) -> serde_json::Value {
        let (k, v) = crate::fleet::POOL_LABEL;
        let mut sel = serde_json::json!({ k: v });
        if let EnvCluster::Shared(env) = &self.cluster {
            let (k, v) = env.label();
            sel[k] = serde_json::json!(v);
        }
        sel
    }

    /// The last lines of every benchmark pod's log, for failure messages.
    pub fn pod_logs(&self) -> String {
        let mut out = String::new();
        let root = self.dir.path().join("kubelet");
        for entry in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            let log = entry.path().join("container.log");
            out.push_str(&format!(
                "--- {}\n{}\n",
                entry.file_name().to_string_lossy(),
                log_tail(&log, 5)
            ));
        }
        out
    }
}

/// The node's taints, without those of the node lifecycle controller
/// (`node.kubernetes.io/*`), which come and go as nodes come up.
pub fn taints_without_lifecycle(
    n: &k8s_openapi::api::core::v1::Node,
) -> Vec<k8s_openapi::api::core::v1::Taint> {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|t| !t.key.starts_with("node.kubernetes.io/"))
        .collect()
}

impl OperatorEnv {
    /// Waits up to `timeout` until node `name` satisfies `cond`; panics with `what`, the node
    /// and the operator's log otherwise.
    pub async fn wait_node(
        &self,
        name: &str,
        what: &str,
        timeout: std::time::Duration,
        cond: impl Fn(&k8s_openapi::api::core::v1::Node) -> bool + Send + Sync,
    ) {
        use k8s_openapi::api::core::v1::Node;
        let api: kube::Api<Node> = kube::Api::all(self.cluster.client());
        let r =
            crate::wait::for_object(&api, name, timeout, |n: Option<&Node>| n.is_some_and(&cond))
                .await;
        if !matches!(r, Ok(Some(_))) {
            let node = api.get(name).await.ok();
            panic!(
                "{what}: {r:?}\nnode: {node:#?}\noperator log:\n{}",
                self.operator.log_tail(120)
            );
        }
    }

    /// Waits up to `timeout` until FabricTest `name` has no run active and satisfies `cond`,
    /// and returns its status; panics with `what`, the status and the operator's log otherwise.
    pub async fn wait_test_idle(
        &self,
        name: &str,
        what: &str,
        timeout: std::time::Duration,
        cond: impl Fn(&gpufabric_api::FabricTest, &gpufabric_api::FabricTestStatus) -> bool
        + Send
        + Sync,
    ) -> gpufabric_api::FabricTestStatus {
        use gpufabric_api::FabricTest;
        let api = self.tests_api();
        let r = crate::wait::for_object(&api, name, timeout, |t: Option<&FabricTest>| {
            t.is_some_and(|t| {
                t.status
                    .as_ref()
                    .is_some_and(|s| s.active_run.is_none() && cond(t, s))
            })
        })
        .await;
        match r {
            Ok(Some(t)) => t.status.unwrap_or_default(),
            other => {
                let status = api.get(name).await.ok().and_then(|t| t.status);
                panic!(
                    "{what}: {other:?}\nstatus: {status:#?}\noperator log:\n{}",
                    self.operator.log_tail(120)
                )
            }
        }
    }

    /// A change a person makes with kubectl: the API server records the field manager
    /// `kubectl`.
    pub async fn patch_node_as_kubectl(&self, node: &str, patch: serde_json::Value) {
        use kube::api::{Patch, PatchParams};
        let api: kube::Api<k8s_openapi::api::core::v1::Node> =
            kube::Api::all(self.cluster.client());
        let pp = PatchParams {
            field_manager: Some("kubectl".into()),
            ..PatchParams::default()
        };
        api.patch(node, &pp, &Patch::Merge(&patch))
            .await
            .unwrap_or_else(|e| panic!("kubectl on {node}: {e}"));
    }
}

/// Whether the node is cordoned (`spec.unschedulable`).
pub fn cordoned(n: &k8s_openapi::api::core::v1::Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}
