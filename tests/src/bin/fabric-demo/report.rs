//! What the run found, as `kubectl gpufabric report RUN` and `kubectl gpufabric status`
//! print it: the plugin's library (crates/kubectl) renders, the demo fetches.

use crate::print::{show, step};
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
    print!("{}", render(&Status::of(&tests), Format::Table)?);
    Ok(())
}
