//! One execution of node changes: the test it is for, what it has done so far, and the
//! guarded change of one node as a quarantine step.

use super::QuarantineError;
use super::guarded::{Guarded, NodeChange, guarded};
use super::ledger::Ledger;
use super::metrics::QuarantineMetrics;
use super::node::QuarantineStep;
use super::observe::test_key;
use super::outcome::Outcome;
use super::refusal::NodeChangeError;
use crate::events::Events;
use gpufabric_api::quarantine::QuarantineRecord;
use gpufabric_api::test::FabricTest;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::Api;

/// One execution's state: what it has done so far, and how to report it.
pub(super) struct Executor<'a> {
    pub(super) nodes: Api<Node>,
    pub(super) events: &'a Events,
    pub(super) metrics: &'a QuarantineMetrics,
    pub(super) test: &'a FabricTest,
    pub(super) key: String,
    pub(super) outcome: Outcome,
    /// Where each node patched is noted (what the fold counts from the node cache).
    pub(super) ledger: Option<&'a Ledger>,
}

/// What a guarded node change came to.
pub(super) enum Applied {
    /// The patch went through; the node as it is now.
    Patched {
        node: Box<Node>,
        record: Option<QuarantineRecord>,
        changes: Vec<&'static str>,
    },
    /// Nothing to change, or not ours to change (the step says which).
    Unchanged {
        step: QuarantineStep,
        node: Box<Node>,
    },
    /// The Node object does not exist.
    Gone,
}

impl<'a> Executor<'a> {
    pub(super) fn new(
        client: &Client,
        events: &'a Events,
        metrics: &'a QuarantineMetrics,
        test: &'a FabricTest,
    ) -> Result<Executor<'a>, QuarantineError> {
        Ok(Executor {
            nodes: Api::all(client.clone()),
            events,
            metrics,
            test,
            key: test_key(test)?,
            outcome: Outcome::default(),
            ledger: None,
        })
    }

    /// [`guarded`] with a quarantine [`QuarantineStep`].
    pub(super) async fn guarded(
        &self,
        name: &str,
        decide: impl Fn(&Node) -> QuarantineStep,
    ) -> Result<Applied, NodeChangeError> {
        let applied = guarded(&self.nodes, name, |n| match decide(n) {
            QuarantineStep::Patch {
                patch,
                record,
                changes,
            } => NodeChange::Patch(
                patch,
                QuarantineStep::Patch {
                    patch: serde_json::Value::Null,
                    record,
                    changes,
                },
            ),
            step => NodeChange::Keep(step),
        })
        .await?;
        if let (Guarded::Patched(node, _), Some(ledger)) = (&applied, self.ledger) {
            ledger.wrote(node);
        }
        Ok(match applied {
            Guarded::Patched(
                node,
                QuarantineStep::Patch {
                    record, changes, ..
                },
            ) => Applied::Patched {
                node: Box::new(node),
                record,
                changes,
            },
            Guarded::Patched(node, step) | Guarded::Kept(node, step) => Applied::Unchanged {
                step,
                node: Box::new(node),
            },
            Guarded::Gone => Applied::Gone,
        })
    }
}
