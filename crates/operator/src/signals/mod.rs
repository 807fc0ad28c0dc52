//! Signals that other tools read, written after each run is judged: on nodes, the
//! `GPUFabricDegraded` condition (`True`: a confirmed problem, as node-problem-detector's
//! conditions are), the `gpufabric.io/result` label and the `gpufabric.io/last-pass`
//! annotation (medik8s NodeHealthCheck, draino and alerting act on them); on runs, the
//! `Complete` and `Failed` conditions (`kubectl wait`).
//!
//! Rules:
//! - every signal reads the node's standing in each test (`gpufabric_api::standing`),
//!   decided once when the run was folded; nothing here judges the node again;
//! - each test's standing is kept on the node (`gpufabric.io/standing`); the condition and
//!   the label are the worst standing across the tests that test the node, and the
//!   condition's message names the test(s) behind it: a pass in one test never clears
//!   another test's failure; a node written by one test before the record existed starts
//!   with that test's entry;
//! - only nodes a run tested get signals; a node no test measured carries none;
//! - a failure counts as confirmed with the same rule quarantine uses
//!   (`failuresToQuarantine` consecutive failures, and not awaiting a confirmation run);
//!   before that the node is `suspect` and its condition `Unknown`, never `True`;
//! - a node not measured (busy GPUs, an image that cannot be pulled, ...) keeps the
//!   standing a measurement gave it: the infrastructure is not the node's fault;
//! - with `graduatedTaints`, a suspect also gets `gpufabric.io/suspect:PreferNoSchedule`
//!   (see [`suspect_taint_patch`]);
//! - when the FabricTest is deleted, its entry leaves each node's record and the condition
//!   and label read the rest; with no test left they go (see [`cleanup`]);
//! - the `GPUFabricHealthy` condition of gpufabric 0.2.0 (`True`: passed), where a
//!   FabricTest wrote it, is replaced by `GPUFabricDegraded` when the operator starts to
//!   lead (see [`migrate`]), or else at the node's next judged run, and removed with the
//!   test that wrote it;
//! - a write that fails is tried again twice before it is reported;
//! - while the test's breaker is open (a storm of failures: the environment is suspected)
//!   no node signal is written at all, as no node is touched.

mod apply;
pub mod cleanup;
mod error;
pub mod migrate;
mod node;
pub mod pending;
mod run;
mod taint;

pub use apply::{NodeSignal, Published, WRITE_CONCURRENCY, decide, for_node, write};
pub use error::SignalError;
pub use node::{
    MAX_MESSAGE, condition, current_condition, metadata_patch, metadata_values, standings_of,
    status_patch,
};
pub use run::{
    CONDITION_COMPLETE, CONDITION_COUNTERS_RECORDED, CONDITION_FAILED, CONDITION_RESULTS_KEPT,
    counters_pending, results_pending, set_counters_recorded, set_finished_conditions,
    set_results_kept,
};
pub use taint::{SUSPECT_EFFECT, release_all as release_suspect_taints, suspect_taint_patch};

/// The nodes `keep` selects, read from the API server a page at a time
/// ([`crate::paging`]), so that a fleet's worth of Nodes is never held at once.
async fn nodes_where(
    api: &kube::Api<k8s_openapi::api::core::v1::Node>,
    keep: impl Fn(&k8s_openapi::api::core::v1::Node) -> bool,
) -> Result<Vec<k8s_openapi::api::core::v1::Node>, kube::Error> {
    let mut out = Vec::new();
    let mut pages = crate::paging::Pages::default();
    while let Some(lp) = pages.next_params() {
        let page = api.list(&lp).await?;
        out.extend(page.items.into_iter().filter(|n| keep(n)));
        pages.read(page.metadata.continue_);
    }
    Ok(out)
}
