//! What the run found, as `kubectl gpufabric report RUN` and `kubectl gpufabric status`
//! print it: the plugin's library (crates/kubectl) renders, the demo fetches; and the run's
//! HTML page, written by the plugin itself.

use crate::print::{info, show, step};
use anyhow::{Context, bail};
use gpufabric_api::run::Trigger;
use gpufabric_api::shard::FabricTestRunShard;
use gpufabric_api::{FabricTest, FabricTestRun, keys};
use gpufabric_kubectl::report::{
    Quarantine, ddp_nodes_doc, not_measured_doc, pair_rows, pairs_doc, run_doc,
};
use gpufabric_kubectl::status::Status;
use gpufabric_kubectl::{Format, render};
use gpufabric_tests::cluster::Cluster;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use std::path::Path;

/// One run's per-node results and findings, its node pairs (from its shards) and its
/// multi-node DDP probe.
pub(crate) async fn print_run(cluster: &Cluster, r: &FabricTestRun) -> anyhow::Result<()> {
    show(&run_doc(r));
    let run = r.metadata.name.clone().unwrap_or_default();
    let shards: Api<FabricTestRunShard> = Api::all(cluster.client());
    let lp = ListParams::default().labels(&format!("{}={run}", keys::LABEL_RUN));
    let shards = shards.list(&lp).await?.items;
    show(&pairs_doc(r, &pair_rows(&shards)));
    show(&ddp_nodes_doc(r));
    Ok(())
}

/// The nodes the test holds in quarantine, what is done to them, and the failing nodes
/// held back.
pub(crate) async fn print_quarantine(cluster: &Cluster, ft: &FabricTest) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(cluster.client());
    let nodes = nodes.list(&ListParams::default()).await?.items;
    show(&Quarantine::of(ft, &nodes).doc());
    Ok(())
}

/// The nodes no run measured, and why. None of them is held against its node.
pub(crate) fn not_measured(runs: &[FabricTestRun]) {
    show(&not_measured_doc(runs));
}

/// `kubectl gpufabric status`: every FabricTest as the plugin shows it.
pub(crate) async fn print_status(cluster: &Cluster) -> anyhow::Result<()> {
    step("kubectl gpufabric status");
    let tests: Api<FabricTest> = Api::all(cluster.client());
    let tests = tests.list(&ListParams::default()).await?.items;
    print!("{}", render(&Status::of(&tests), &Format::Table)?);
    Ok(())
}

/// Writes the HTML report of `test`'s manual run (the one the demo started) to `page` with
/// the built `kubectl-gpufabric`, as a user would: `kubectl gpufabric report RUN -o FILE`.
pub(crate) async fn write_html(
    cluster: &Cluster,
    bins: &Path,
    test: &str,
    page: &Path,
) -> anyhow::Result<()> {
    let runs: Api<FabricTestRun> = Api::all(cluster.client());
    let lp = ListParams::default().labels(&format!("{}={test}", keys::LABEL_TEST));
    let run = runs
        .list(&lp)
        .await?
        .items
        .into_iter()
        .find(|r| r.spec.trigger == Trigger::Manual)
        .and_then(|r| r.metadata.name)
        .context("the demo's manual run is gone")?;
    step(format!(
        "kubectl gpufabric report {run} -o {}",
        page.display()
    ));
    let plugin = bins.join("kubectl-gpufabric");
    if !plugin.is_file() {
        bail!(
            "{} not found: build it with cargo build -p gpufabric-kubectl",
            plugin.display()
        );
    }
    if let Some(dir) = page.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let out = std::process::Command::new(&plugin)
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig_path())
        .args(["report", &run, "--namespace", crate::NAMESPACE, "-o"])
        .arg(page)
        .output()
        .with_context(|| format!("running {}", plugin.display()))?;
    if !out.status.success() {
        bail!(
            "kubectl gpufabric report failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    info(format!(
        "the report of run {run} is in {} (one self-contained HTML page: open it in a browser)",
        page.display()
    ));
    Ok(())
}
