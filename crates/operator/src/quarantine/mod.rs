//! The quarantine executor: applies a plan of `gpufabric_health::quarantine::plan` to Nodes
//! (label, cordon, taint, release), with an Event, a metric and a status entry for each
//! node. The plan decides (budget, mode, hysteresis, ownership as observed); this module
//! only observes nodes for it and applies its steps.
//!
//! After a run of FabricTest `test` finishes, the controller:
//! 1. [`observe`]s the nodes of the run, of `test.status.nodes`, and [`quarantined_by`] the
//!    test (so that gone and deselected nodes are released too);
//! 2. plans with each observation's [`NodeObservation::facts`], the test's *current*
//!    `spec.quarantine`, and the number of nodes the test selects (not the few a
//!    confirmation run retests);
//! 3. calls [`execute`], and writes [`Outcome::apply_to_status`] into the test's status.
//!
//! On deletion (finalizer [`gpufabric_api::keys::FINALIZER`]) it calls [`release_all`].
//!
//! Safety at the node:
//! - one JSON merge patch per node carrying the resourceVersion it was decided from: a
//!   node that changed in between (someone cordoned it) is read and decided again;
//! - the record (annotation `gpufabric.io/quarantine`) says which of label, cordon and
//!   taint this operator made; release undoes exactly those;
//! - a node cordoned or carrying our taint key by someone else, quarantined by another
//!   FabricTest, or with an unreadable record is never touched ([`Refusal`]).
//!
//! Ownership follows the node ([`hand_back`]): when someone else undoes a quarantine this
//! test made (uncordons the node, uncordons and cordons it again, removes the taint or the
//! label), the test's claim ends at once. The record goes, an Event says so, the node no
//! longer counts against the budget, and a release never removes what they put there. An
//! uncordon or a removal reads as "back from repair": the node is tested at once.
//!
//! Known limits: a `kubectl cordon` of a node that is already cordoned changes nothing on
//! the node and is undone with ours (the managed fields say who set `spec.unschedulable`
//! last; a no-op leaves no trace). A quarantine taint removed and added again between two
//! looks of the operator is not told apart from ours (taints are one list, whose managed
//! fields follow whoever changed any taint). A node whose record a person removed is no
//! longer this operator's; a node quarantined in Label mode keeps only its label if the
//! mode later becomes Cordon.

mod apply;
#[cfg(test)]
mod apply_tests;
pub mod breaker;
mod executor;
mod guarded;
mod hand_back;
mod ledger;
mod metrics;
mod node;
mod observe;
mod outcome;
mod ownership;
#[cfg(test)]
mod ownership_tests;
mod refusal;
mod report;
/// RFC 7386 merge, as the API server applies a merge patch (for tests that build nodes).
#[cfg(test)]
pub(crate) use node::tests::merge as node_merge_for_tests;

pub use apply::{CHANGE_CONCURRENCY, execute, execute_held, release_all};
pub use breaker::{Breaker, CONDITION_BREAKER_OPEN};
pub use guarded::{Guarded, NodeChange, guarded};
pub use hand_back::{HandedBack, hand_back};
pub use ledger::{LEDGER_TTL, Ledger, holdings_cached};
pub use metrics::{ActionLabels, QuarantineMetrics, TestLabels};
pub use node::{QuarantineStep, hand_back_step, quarantine_step, release_step};
pub use observe::{
    Holdings, OBSERVE_CONCURRENCY, holdings, observe, observe_cached, quarantined_by, test_key,
};
pub use outcome::{Action, ActionTaken, Outcome};
pub use ownership::{
    NodeObservation, TAINT_EFFECT, Undone, cordon_manager, is_our_taint, is_unschedulable,
    manages_cordon, taints_of, undone,
};
pub use refusal::{Change, NodeChangeError, NodeFailure, Refusal};

/// Errors that stop the executor from acting at all. Per-node problems do not stop it;
/// they are reported in [`Outcome::errors`].
#[derive(Debug, thiserror::Error)]
pub enum QuarantineError {
    #[error("listing nodes to count this test's quarantined nodes: {0}")]
    ListNodes(#[source] kube::Error),
    #[error("reading node {node}: {source}")]
    GetNode {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("the FabricTest has no name")]
    Unnamed,
    #[error("could not release {} node(s), the finalizer stays until they are: {}", .0.len(), .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Release(Vec<NodeFailure>),
}
