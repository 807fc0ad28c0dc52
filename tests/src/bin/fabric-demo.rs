//! `fabric-demo`: the whole system on one machine without GPUs: a real control plane, 16
//! simulated GPU nodes (one slow GPU link, one straggler GPU, one slow NIC, one bad path
//! between two nodes, one node whose GPUs a training job holds), the process-kubelet, the
//! operator, and a FabricTest run (node checks, then node pairs) whose findings, node
//! pairs, quarantined nodes and not-measured nodes it prints.
//!
//! `cargo run -p gpufabric-tests --bin fabric-demo -- [--once] [--fleet PATH] [--no-build] [--no-operator]`

#![forbid(unsafe_code)]

use anyhow::{Context, bail};
use clap::Parser;
use gpufabric_api::shard::FabricTestRunShard;
use gpufabric_api::{FabricTest, FabricTestRun, Subject, keys};
use gpufabric_tests::cluster::{Cluster, ClusterOptions, ENV_BIN, log_tail};
use gpufabric_tests::fixtures;
use gpufabric_tests::fleet::SimFleet;
use gpufabric_tests::kubelet::{Kubelet, KubeletOptions, default_agent_bin_dir};
use gpufabric_tests::workspace_root;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const NAMESPACE: &str = "gpufabric";

/// Runs the GPU fabric operator end to end against a local control plane and a simulated
/// fleet, and prints what it found.
#[derive(Parser, Debug)]
#[command(name = "fabric-demo", version, about)]
struct Cli {
    /// Tear everything down after the run instead of waiting for Ctrl-C.
    #[arg(long)]
    once: bool,
    /// Fleet description (default: crates/measure/fleets/demo-16.yaml, else a built-in
    /// 16-node fleet).
    #[arg(long)]
    fleet: Option<PathBuf>,
    /// Do not build anything: use the control-plane binaries of `tests/cluster/build.sh
    /// --print-bin-dir` (or $GPUFABRIC_CLUSTER_BIN) and fabric-agent/fabric-operator
    /// next to this program.
    #[arg(long)]
    no_build: bool,
    /// Stop at "control plane up": do not start the operator even if it is built.
    #[arg(long)]
    no_operator: bool,
    /// Longest wait for the run to finish, in seconds.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
}

fn step(msg: impl AsRef<str>) {
    println!("==> {}", msg.as_ref());
}

fn info(msg: impl AsRef<str>) {
    println!("    {}", msg.as_ref());
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
                "warn,gpufabric_tests=warn,kube_client::client::builder=off".into()
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let t0 = Instant::now();
    let bins = default_agent_bin_dir();

    let (cluster, fleet, kubelet) = bring_up(&cli, &bins).await?;

    let operator_bin = bins.join("fabric-operator");
    let agent_bin = bins.join("fabric-agent");
    let mut operator = None;
    if !agent_bin.is_file() {
        info(format!(
            "{} not found: benchmark pods would fail to start",
            agent_bin.display()
        ));
    }
    if cli.no_operator {
        info("--no-operator: not starting the operator");
    } else if operator_bin.is_file() {
        match start_operator(&cluster, &operator_bin).await {
            Ok(child) => operator = Some(child),
            Err(e) => info(format!("the operator did not start: {e:#}")),
        }
    } else {
        info(format!("{} not found", operator_bin.display()));
    }

    // One healthy node is busy with someone's training job: it is skipped, not blamed.
    let busy = fleet
        .fleet()
        .nodes
        .iter()
        .rev()
        .find(|n| n.faults.is_empty())
        .map(|n| n.name.clone());
    match &mut operator {
        Some(op) => {
            run_nightly(&cluster, cli.timeout, op, busy.as_deref()).await?;
        }
        None => {
            step("what comes next");
            info(
                "build the operator (cargo build -p gpufabric-operator -p gpufabric-agent) and re-run without --no-operator,",
            );
            info(format!(
                "or run it yourself: fabric-operator run --kubeconfig {}",
                cluster.kubeconfig_path().display()
            ));
            info(
                "then: kubectl apply -f deploy/examples/nightly.yaml (cluster-scoped; pods in namespace gpufabric), annotated gpufabric.io/run-now",
            );
        }
    }

    step(format!("done in {:.0}s", t0.elapsed().as_secs_f64()));
    if !cli.once {
        println!();
        println!("export KUBECONFIG={}", cluster.kubeconfig_path().display());
        println!("export PATH={}:$PATH", cluster.bin_dir().display());
        info("the cluster keeps running; Ctrl-C tears it down");
        tokio::signal::ctrl_c().await?;
    }
    step("tearing down");
    if let Some(mut op) = operator {
        stop(&mut op);
    }
    drop(kubelet);
    drop(cluster);
    Ok(())
}

/// Builds what is missing, starts the control plane and registers the simulated fleet's
/// nodes with the process-kubelet; returns once they are Ready.
async fn bring_up(cli: &Cli, bins: &Path) -> anyhow::Result<(Cluster, SimFleet, Kubelet)> {
    let control_plane = if cli.no_build { None } else { build(bins)? };

    step("starting the control plane (etcd, kube-apiserver, kube-controller-manager)");
    let cluster = Cluster::start_with(ClusterOptions {
        bin_dir: control_plane,
        ..Default::default()
    })
    .await
    .context("starting the control plane")?;
    info(format!(
        "up in {:.1}s at {}, dir {}",
        cluster.startup_time().as_secs_f64(),
        cluster.server(),
        cluster.dir().display()
    ));

    let fleet = match cli.fleet.clone().or_else(SimFleet::shipped_demo_file) {
        Some(path) => SimFleet::load(&path)?,
        None => SimFleet::write_to(SimFleet::demo(), cluster.dir().join("fleet.yaml"))?,
    };
    let faulty: Vec<String> = fleet
        .fleet()
        .nodes
        .iter()
        .filter(|n| !n.faults.is_empty())
        .map(|n| format!("{} {:?}", n.name, n.faults))
        .collect();
    step(format!(
        "registering {} simulated GPU nodes from {}",
        fleet.fleet().nodes.len(),
        fleet.path().display()
    ));
    for f in &faulty {
        info(format!("injected fault: {f}"));
    }
    let kubelet = Kubelet::start(
        cluster.client(),
        &fleet,
        KubeletOptions {
            agent_bin_dir: bins.to_path_buf(),
            ..Default::default()
        },
    )
    .await?;
    let nodes: Api<Node> = Api::all(cluster.client());
    let n = wait_nodes_ready(&nodes, kubelet.node_names().len()).await?;
    kubectl(
        &cluster,
        &[
            "get",
            "nodes",
            "-L",
            keys::LABEL_GPU_PRODUCT,
            "-L",
            keys::LABEL_GPU_COUNT,
        ],
    );
    step(format!("control plane up with {n} GPU nodes"));
    Ok((cluster, fleet, kubelet))
}

/// Builds the control-plane binaries and the two programs of this workspace.
/// Returns the control-plane bin dir when it built (or found) it.
fn build(bins: &Path) -> anyhow::Result<Option<PathBuf>> {
    step("building (or reusing) the control-plane binaries: tests/cluster/build.sh");
    let mut control_plane = None;
    if std::env::var_os(ENV_BIN).is_none() {
        let out = Command::new("bash")
            .arg(workspace_root().join("tests/cluster/build.sh"))
            .stderr(Stdio::inherit())
            .output()
            .context("running tests/cluster/build.sh")?;
        if !out.status.success() {
            bail!("tests/cluster/build.sh failed");
        }
        let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
        info(format!("binaries in {dir}"));
        control_plane = Some(PathBuf::from(dir));
    }
    for pkg in ["gpufabric-agent", "gpufabric-operator"] {
        step(format!("cargo build -p {pkg}"));
        let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["build", "-q", "-p", pkg])
            .current_dir(workspace_root())
            .status();
        match status {
            Ok(s) if s.success() => {}
            _ => info(format!(
                "building {pkg} failed; using what is in {} if anything",
                bins.display()
            )),
        }
    }
    Ok(control_plane)
}

async fn wait_nodes_ready(nodes: &Api<Node>, want: usize) -> anyhow::Result<usize> {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let list = nodes.list(&ListParams::default()).await?;
        let ready = list
            .items
            .iter()
            .filter(|n| {
                n.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .count();
        if ready >= want {
            return Ok(ready);
        }
        if Instant::now() > end {
            bail!("only {ready} of {want} nodes Ready after 60s");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn kubectl(cluster: &Cluster, args: &[&str]) {
    match cluster.kubectl().args(args).output() {
        Ok(out) => {
            print!("{}", String::from_utf8_lossy(&out.stdout));
            let err = String::from_utf8_lossy(&out.stderr);
            if !err.trim().is_empty() {
                print!("{err}");
            }
        }
        Err(e) => info(format!("kubectl: {e}")),
    }
}

async fn start_operator(cluster: &Cluster, bin: &Path) -> anyhow::Result<std::process::Child> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let log = cluster.dir().join("fabric-operator.log");
    step(format!(
        "starting the operator: fabric-operator run --kubeconfig {} (log {})",
        cluster.kubeconfig_path().display(),
        log.display()
    ));
    let out = std::fs::File::create(&log)?;
    let mut cmd = Command::new(bin);
    cmd.args(["run", "--pod-namespace", NAMESPACE, "--kubeconfig"])
        .arg(cluster.kubeconfig_path())
        .args(["--admin-addr", &format!("127.0.0.1:{port}")])
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    gpufabric_tests::process::harden(&mut cmd);
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    // Give it a moment to fail fast (bad flags, no such subcommand).
    tokio::time::sleep(Duration::from_secs(2)).await;
    if let Some(status) = child.try_wait()? {
        bail!(
            "exited with {status}; last lines of {}:\n{}",
            log.display(),
            log_tail(&log, 20)
        );
    }
    info(format!(
        "running (pid {}), metrics on http://127.0.0.1:{port}/metrics",
        child.id()
    ));
    Ok(child)
}

fn stop(child: &mut std::process::Child) {
    if let Ok(pid) = i32::try_from(child.id()) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    let end = Instant::now() + Duration::from_secs(5);
    while Instant::now() < end {
        if !matches!(child.try_wait(), Ok(None)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

async fn run_nightly(
    cluster: &Cluster,
    timeout: u64,
    operator: &mut std::process::Child,
    busy: Option<&str>,
) -> anyhow::Result<()> {
    let name = apply_nightly(cluster, busy).await?;
    let tests: Api<FabricTest> = Api::all(cluster.client());
    let runs: Api<FabricTestRun> = Api::all(cluster.client());
    let lp = ListParams::default().labels(&format!("{}={name}", keys::LABEL_TEST));
    wait_settled(&tests, &runs, &lp, &name, timeout, operator).await?;
    step("kubectl get ft,ftr -o wide");
    kubectl(cluster, &["get", "ft,ftr", "-o", "wide"]);
    for r in runs.list(&lp).await?.items {
        print_run(&r);
        print_pairs(cluster, &r).await?;
        print_ddp_nodes(&r);
    }
    let ft = tests.get(&name).await?;
    print_quarantine(cluster, &ft).await?;
    not_measured(&runs.list(&lp).await?.items);
    Ok(())
}

/// Applies deploy/examples/nightly.yaml (run now, sim backend, the training pool), after
/// a training job takes every GPU of `busy`. Returns the FabricTest's name.
async fn apply_nightly(cluster: &Cluster, busy: Option<&str>) -> anyhow::Result<String> {
    cluster.create_namespace(NAMESPACE).await?;
    if let Some(node) = busy {
        step(format!(
            "a training job holds every GPU of {node} (pod {NAMESPACE}/{}): gpufabric must not test it, nor blame it",
            fixtures::gpu_holder_name(node)
        ));
        fixtures::hold_gpus(&cluster.client(), NAMESPACE, node, 8)
            .await
            .with_context(|| format!("holding the GPUs of {node}"))?;
    }
    let path = workspace_root().join("deploy/examples/nightly.yaml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut obj: DynamicObject = serde_yaml::from_str(&text)?;
    let name = obj
        .metadata
        .name
        .clone()
        .unwrap_or_else(|| "nightly".into());
    obj.metadata.annotations.get_or_insert_default().insert(
        keys::ANNOTATION_RUN_NOW.into(),
        chrono::Utc::now().to_rfc3339(),
    );
    let spec = obj
        .data
        .get_mut("spec")
        .and_then(|s| s.as_object_mut())
        .context("nightly.yaml has no spec")?;
    spec.insert(
        "nodeSelector".into(),
        serde_json::json!({"pool": "training"}),
    );
    // Node pairs over the nodes that pass their own check, in a ring, then a retest round;
    // then the multi-node DDP probe over 4 of the nodes that passed both.
    spec.insert(
        "suite".into(),
        serde_json::json!({
            "nodePairs": {"enabled": true, "pairing": "ring"},
            "ddpNodes": {"enabled": true, "maxNodes": 4},
        }),
    );
    spec.insert(
        "agent".into(),
        serde_json::json!({
            "env": [{"name": keys::ENV_BACKEND, "value": "sim"}],
            "timeoutSeconds": 120,
        }),
    );
    let dynamic: Api<DynamicObject> = Api::all_with(
        cluster.client(),
        &kube::api::ApiResource::erase::<FabricTest>(&()),
    );
    step(format!(
        "applying deploy/examples/nightly.yaml as FabricTest {name} (cluster-scoped; pods in {NAMESPACE}) with {}, FABRIC_BACKEND=sim, nodeSelector pool=training, suite.nodePairs in a ring, suite.ddpNodes over 4 nodes",
        keys::ANNOTATION_RUN_NOW
    ));
    dynamic.create(&PostParams::default(), &obj).await?;

    Ok(name)
}

/// Waits until the test's runs (and any confirmation run) have finished and nothing has
/// changed for 5 s, printing each change of their progress; gives up after `timeout` s.
async fn wait_settled(
    tests: &Api<FabricTest>,
    runs: &Api<FabricTestRun>,
    lp: &ListParams,
    name: &str,
    timeout: u64,
    operator: &mut std::process::Child,
) -> anyhow::Result<()> {
    step("waiting for the run(s) to finish");
    let end = Instant::now() + Duration::from_secs(timeout);
    let mut last_line = String::new();
    let mut settled_since: Option<Instant> = None;
    loop {
        if let Ok(Some(status)) = operator.try_wait() {
            bail!("the operator exited with {status}");
        }
        let list = runs.list(lp).await?;
        let ft = tests.get(name).await?;
        let active = ft.status.as_ref().and_then(|s| s.active_run.clone());
        let mut parts = Vec::new();
        for r in &list.items {
            let st = r.status.clone().unwrap_or_default();
            parts.push(format!(
                "{} ({}) {:?}: {}/{} nodes passed, {} failed, {} errored",
                r.metadata.name.clone().unwrap_or_default(),
                r.spec.trigger.as_str(),
                st.phase,
                st.passed,
                st.node_count,
                st.failed,
                st.errored
            ));
        }
        let line = if parts.is_empty() {
            "no run yet".to_string()
        } else {
            parts.join("; ")
        };
        if line != last_line {
            info(&line);
            last_line = line;
        }
        let all_done = !list.items.is_empty()
            && active.is_none()
            && list
                .items
                .iter()
                .all(|r| r.status.as_ref().is_some_and(|s| s.phase.is_finished()));
        // A finished run may be followed by a confirmation run: wait until nothing changes.
        match (all_done, settled_since) {
            (true, Some(t)) if t.elapsed() > Duration::from_secs(5) => break,
            (true, None) => settled_since = Some(Instant::now()),
            (false, _) => settled_since = None,
            _ => {}
        }
        if Instant::now() > end {
            info(format!(
                "no finished run after {timeout}s; showing what there is"
            ));
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    Ok(())
}

/// One run's per-node results and findings, as tables.
fn print_run(r: &FabricTestRun) {
    let st = r.status.clone().unwrap_or_default();
    step(format!(
        "run {} ({}): per-node results",
        r.metadata.name.clone().unwrap_or_default(),
        r.spec.trigger.as_str()
    ));
    let mut rows = vec![vec![
        "NODE".to_string(),
        "VERDICT".into(),
        "PRODUCT".into(),
        "ALLREDUCE GB/s".into(),
        "MIN PAIR GB/s".into(),
        "DDP EFF".into(),
        "FINDINGS".into(),
        "REASON".into(),
    ]];
    for n in &st.nodes {
        rows.push(vec![
            n.node.clone(),
            format!("{:?}", n.verdict),
            n.product.clone().unwrap_or_default(),
            fmt_opt(n.all_reduce_bus_bw_gbps, 1),
            fmt_opt(n.min_pair_gbps, 1),
            fmt_opt(n.ddp_efficiency, 3),
            n.findings.to_string(),
            n.reason.clone().unwrap_or_default(),
        ]);
    }
    print_table(&rows);
    step(format!("findings ({})", st.findings.len()));
    let mut rows = vec![vec![
        "SEVERITY".to_string(),
        "NODE".into(),
        "SUBJECT".into(),
        "METRIC".into(),
        "MEASURED".into(),
        "EXPECTED".into(),
        "DEVIATION".into(),
        "MESSAGE".into(),
    ]];
    for f in &st.findings {
        let subject = match &f.subject {
            Subject::GpuPair { a, b, .. } => format!("gpu {a}<->{b}"),
            Subject::Gpu { gpu, .. } => format!("gpu {gpu}"),
            Subject::NodePair { b, .. } => format!("<-> {b}"),
            Subject::Nic { port, .. } => port.clone(),
            Subject::Node { .. } => "node".into(),
        };
        let unit = f.unit.clone().unwrap_or_default();
        rows.push(vec![
            wire(&f.severity),
            f.subject.node_name().to_string(),
            subject,
            wire(&f.metric),
            format!("{} {unit}", fmt_opt(f.measured, 2)),
            format!("{} {unit}", fmt_opt(f.expected, 2)),
            f.deviation
                .map(|d| format!("{:+.0}%", d * 100.0))
                .unwrap_or_default(),
            f.message.clone(),
        ]);
    }
    print_table(&rows);
}

/// The run's node-pair phase: its rounds, and every pair of it from the shards (each pair
/// once, from its rank-0 node's record).
async fn print_pairs(cluster: &Cluster, r: &FabricTestRun) -> anyhow::Result<()> {
    let Some(np) = r.status.as_ref().and_then(|s| s.node_pairs.clone()) else {
        return Ok(());
    };
    let run = r.metadata.name.clone().unwrap_or_default();
    step(format!(
        "run {run}: node pairs ({} of the nodes that passed their own check, {} rounds{}, {} pairs: {} measured, {} not measured, {} errored; median {} GB/s)",
        np.candidates,
        np.rounds,
        np.confirmation_round
            .map(|c| format!(", round {c} retests {} suspect(s)", np.retested))
            .unwrap_or_default(),
        np.pairs,
        np.measured,
        np.not_measured,
        np.errored,
        fmt_opt(np.within.as_ref().and_then(|w| w.median_gbps), 1),
    ));
    let shards: Api<FabricTestRunShard> = Api::all(cluster.client());
    let lp = ListParams::default().labels(&format!("{}={run}", keys::LABEL_RUN));
    let mut pairs: Vec<(u32, u32, Vec<String>)> = Vec::new();
    for shard in shards.list(&lp).await?.items {
        for e in shard.status.map(|s| s.nodes).unwrap_or_default() {
            for p in e.pairs.iter().filter(|p| p.rank == 0) {
                pairs.push((
                    p.round,
                    p.index,
                    vec![
                        format!(
                            "{}{}",
                            p.round,
                            if p.confirmation { " (retest)" } else { "" }
                        ),
                        format!("{} <-> {}", e.node, p.partner),
                        wire(&p.state),
                        fmt_opt(p.busbw_gbps, 1),
                        p.transport.map(|t| wire(&t)).unwrap_or_default(),
                        p.message.clone().unwrap_or_default(),
                    ],
                ));
            }
        }
    }
    pairs.sort_by_key(|(round, index, _)| (*round, *index));
    let mut rows = vec![vec![
        "ROUND".to_string(),
        "PAIR".into(),
        "STATE".into(),
        "BUSBW GB/s".into(),
        "TRANSPORT".into(),
        "MESSAGE".into(),
    ]];
    rows.extend(pairs.into_iter().map(|(_, _, row)| row));
    print_table(&rows);
    Ok(())
}

/// The run's multi-node DDP probe: its nodes, and step time and efficiency per node count.
fn print_ddp_nodes(r: &FabricTestRun) {
    let Some(p) = r.status.as_ref().and_then(|s| s.ddp_nodes.clone()) else {
        return;
    };
    let run = r.metadata.name.clone().unwrap_or_default();
    step(format!(
        "run {run}: multi-node DDP probe over {} ({}{})",
        p.nodes.join(", "),
        wire(&p.state),
        p.message.map(|m| format!(": {m}")).unwrap_or_default()
    ));
    let mut rows = vec![vec![
        "NODES".to_string(),
        "GPUS".into(),
        "STEP ms".into(),
        "EFFICIENCY".into(),
        "COMM ALONE ms".into(),
        "EXPOSED COMM ms".into(),
    ]];
    rows.extend(p.points.iter().map(|x| {
        vec![
            x.nodes.to_string(),
            x.gpus.to_string(),
            format!("{:.2}", x.step_ms),
            format!("{:.1}%", x.scaling_efficiency * 100.0),
            format!("{:.2}", x.comm_alone_ms),
            format!("{:.2}", x.exposed_comm_ms),
        ]
    }));
    print_table(&rows);
    for s in &p.stragglers {
        info(format!(
            "straggler: {} computes a step {:.1}% slower than the fastest node",
            s.node, s.slower_percent
        ));
    }
}

/// The nodes the test holds in quarantine, what is done to them, and the failing nodes
/// held back.
async fn print_quarantine(cluster: &Cluster, ft: &FabricTest) -> anyhow::Result<()> {
    step("quarantined nodes");
    let quarantined = ft
        .status
        .as_ref()
        .map(|s| s.quarantined_nodes.clone())
        .unwrap_or_default();
    info(format!(
        "{} holds {} node(s) in quarantine: {}",
        ft.metadata.name.clone().unwrap_or_default(),
        quarantined.len(),
        if quarantined.is_empty() {
            "none".to_string()
        } else {
            quarantined.join(", ")
        }
    ));
    let nodes: Api<Node> = Api::all(cluster.client());
    let mut rows = vec![vec![
        "NODE".to_string(),
        "CORDONED".into(),
        "QUARANTINE LABEL".into(),
        "TAINTED".into(),
    ]];
    for n in nodes.list(&ListParams::default()).await?.items {
        let labels = n.metadata.labels.clone().unwrap_or_default();
        let cordoned = n
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        let tainted = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == keys::TAINT_QUARANTINED));
        let label = labels.get(keys::LABEL_QUARANTINED).cloned();
        if cordoned || tainted || label.is_some() {
            rows.push(vec![
                n.metadata.name.clone().unwrap_or_default(),
                cordoned.to_string(),
                label.unwrap_or_default(),
                tainted.to_string(),
            ]);
        }
    }
    print_table(&rows);
    // Nodes that fail but are not acted on: over budget, Observe mode, cordoned by someone else.
    let held: Vec<(String, String)> = ft
        .status
        .as_ref()
        .map(|s| {
            s.nodes
                .iter()
                .filter_map(|n| n.held_back.clone().map(|why| (n.node.clone(), why)))
                .collect()
        })
        .unwrap_or_default();
    if !held.is_empty() {
        step("failing nodes held back (reported, not acted on)");
        let mut rows = vec![vec!["NODE".to_string(), "WHY".into()]];
        rows.extend(held.into_iter().map(|(n, why)| vec![n, why]));
        print_table(&rows);
    }
    Ok(())
}

/// The nodes no run measured, and why: skipped before the run (busy GPUs, someone's
/// taint) or not measured by it (an infrastructure reason). None of them is held against
/// its node.
fn not_measured(runs: &[FabricTestRun]) {
    let mut rows = vec![vec![
        "NODE".to_string(),
        "RUN".into(),
        "NOT MEASURED".into(),
        "WHY".into(),
    ]];
    for r in runs {
        let run = r.metadata.name.clone().unwrap_or_default();
        let Some(st) = r.status.as_ref() else {
            continue;
        };
        for s in &st.skipped {
            rows.push(vec![
                s.node.clone(),
                run.clone(),
                format!("skipped: {}", s.reason),
                s.message.clone(),
            ]);
        }
        for n in st.nodes.iter().filter(|n| n.not_measured.is_some()) {
            rows.push(vec![
                n.node.clone(),
                run.clone(),
                n.not_measured
                    .map(|m| m.as_str())
                    .unwrap_or_default()
                    .into(),
                n.reason.clone().unwrap_or_default(),
            ]);
        }
    }
    step("nodes not measured (infrastructure, never held against the node)");
    if rows.len() == 1 {
        info("none");
    } else {
        print_table(&rows);
    }
}

fn fmt_opt(v: Option<f64>, decimals: usize) -> String {
    v.map(|v| format!("{v:.decimals$}"))
        .unwrap_or_else(|| "-".into())
}

/// The name a value has on the wire (its serde form), e.g. `critical` or `allReduceBusBw`.
fn wire<T: serde::Serialize>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => "?".into(),
    }
}

fn print_table(rows: &[Vec<String>]) {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .map(|r| r.get(c).map_or(0, |s| s.chars().count()))
                .max()
                .unwrap_or(0)
        })
        .collect();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, s)| {
                if i + 1 == r.len() {
                    s.clone()
                } else {
                    format!("{s:<w$}", w = widths[i])
                }
            })
            .collect();
        println!("{}", line.join("  ").trim_end());
    }
    if rows.len() <= 1 {
        println!("(none)");
    }
}
