//! `fabric-demo`: the whole system on one machine without GPUs: a real control plane, 16
//! simulated GPU nodes (one slow GPU link, one straggler GPU, one slow NIC, one bad path
//! between two nodes, one node whose GPUs a training job holds), the process-kubelet, the
//! operator with its admission webhook (and a FabricTest it refuses), and a FabricTest run
//! (node checks, then node pairs) whose findings, node pairs, quarantined nodes and
//! not-measured nodes it prints with the tables of `kubectl gpufabric` (crates/kubectl),
//! ending with the HTML report of its run (`kubectl gpufabric report RUN -o FILE.html`) and
//! its `status`.
//!
//! `cargo run -p gpufabric-tests --bin fabric-demo -- [--once] [--fleet PATH] [--no-build] [--no-operator] [--report FILE.html]`

#![forbid(unsafe_code)]

mod admission;
mod lifecycle;
mod nightly;
mod operator;
mod print;
mod report;
mod setup;

use clap::Parser;
use gpufabric_tests::kubelet::default_agent_bin_dir;
use nightly::run_nightly;
use operator::{start_operator, stop};
use print::{info, step};
use setup::bring_up;
use std::path::{Path, PathBuf};
use std::time::Instant;

const NAMESPACE: &str = "gpufabric";

/// The report's default path for the demo program at `exe`: `fabric-demo-report/report.html`
/// in its target dir (`target/debug/fabric-demo` writes `target/fabric-demo-report/report.html`),
/// beside the profile dirs, where no build puts a file: a dir beside the binaries could meet
/// a binary of the same name.
fn default_report(exe: &Path) -> PathBuf {
    let profile = exe.parent().unwrap_or(Path::new("."));
    let target = profile.parent().unwrap_or(profile);
    target.join("fabric-demo-report").join("report.html")
}

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
    /// Where the HTML report of the run goes (default: fabric-demo-report/report.html in
    /// the target dir, e.g. target/fabric-demo-report/report.html).
    #[arg(long, value_name = "FILE.html")]
    report: Option<PathBuf>,
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
        let serving = admission::Serving::new(cluster.dir())?;
        match start_operator(&cluster, &operator_bin, &serving.operator_args()).await {
            Ok(child) => operator = Some(child),
            Err(e) => info(format!("the operator did not start: {e:#}")),
        }
        if operator.is_some() {
            admission::register(&cluster, &serving).await?;
            admission::show_refusal(&cluster)?;
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
            let test = run_nightly(&cluster, cli.timeout, op, busy.as_deref()).await?;
            lifecycle::show_lifecycle(
                &cluster,
                &fleet,
                &test,
                busy.as_deref(),
                std::time::Duration::from_secs(cli.timeout.min(180)),
            )
            .await?;
            let page = cli
                .report
                .clone()
                .unwrap_or_else(|| default_report(&std::env::current_exe().unwrap_or_default()));
            report::write_html(&cluster, &bins, &test, &page).await?;
            report::print_status(&cluster).await?;
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

#[cfg(test)]
mod tests {
    use super::default_report;
    use std::path::Path;

    #[test]
    fn the_default_report_lies_in_the_target_dir_outside_the_profile_dir_of_the_binaries() {
        let exe = Path::new("/src/gpufabric/target/debug/fabric-demo");
        let page = default_report(exe);
        assert_eq!(
            page,
            Path::new("/src/gpufabric/target/fabric-demo-report/report.html")
        );
        // The dir the binaries are written to (fabric-demo itself among them) is no parent
        // of the report: creating the report's dir never meets a binary.
        let profile = exe.parent().expect("a dir");
        assert!(!page.starts_with(profile), "{}", page.display());
    }
}
