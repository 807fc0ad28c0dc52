//! Handing back the nodes whose quarantine someone else undid: the test's claim ends, and
//! nothing else on the node changes.

use super::QuarantineError;
use super::executor::{Applied, Executor};
use super::ledger::Ledger;
use super::metrics::QuarantineMetrics;
use super::node::hand_back_step;
use super::outcome::Action;
use super::ownership::Undone;
use super::refusal::{Change, NodeFailure};
use crate::events::Events;
use gpufabric_api::quarantine::QuarantineRecord;
use gpufabric_api::test::FabricTest;
use k8s_openapi::api::core::v1::Node;
use kube::Client;

/// A node whose quarantine someone else undid, handed back by [`hand_back`].
#[derive(Clone, Debug, PartialEq)]
pub struct HandedBack {
    pub node: String,
    pub undone: Undone,
}

/// Ends this test's claim on every node it holds whose quarantine someone else has undone
/// since (uncordoned, cordoned again, taint or label removed; see
/// [`super::ownership::undone`]): the record goes (and the label), nothing else on the node
/// changes, an Event on the node and the test says what happened, and the node no longer
/// counts against the budget. `nodes`: the nodes to look at (the operator's node cache);
/// each one that looks undone is read again and decided again before it is changed, and
/// noted in `ledger` when given.
pub async fn hand_back<'n>(
    client: &Client,
    events: &Events,
    metrics: &QuarantineMetrics,
    test: &FabricTest,
    nodes: impl IntoIterator<Item = &'n Node>,
    ledger: Option<&Ledger>,
) -> Result<(Vec<HandedBack>, Vec<NodeFailure>), QuarantineError> {
    let mut exec = Executor::new(client, events, metrics, test)?;
    exec.ledger = ledger;
    let key = exec.key.clone();
    let suspects: Vec<String> = nodes
        .into_iter()
        .filter(|n| {
            QuarantineRecord::from_annotations(n.metadata.annotations.as_ref())
                .ok()
                .flatten()
                .is_some_and(|r| r.is_owned_by(&key) && super::ownership::undone(n, &r).is_some())
        })
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    let mut handed = Vec::new();
    for name in suspects {
        // What was undone, as seen on the node the patch was decided from.
        let seen: std::sync::Mutex<Option<Undone>> = std::sync::Mutex::new(None);
        let decide = |n: &Node| {
            let step = hand_back_step(n, &key);
            if let Ok(mut slot) = seen.lock() {
                *slot = QuarantineRecord::from_annotations(n.metadata.annotations.as_ref())
                    .ok()
                    .flatten()
                    .and_then(|r| super::ownership::undone(n, &r));
            }
            step
        };
        match exec.guarded(&name, decide).await {
            Ok(Applied::Patched { node, .. }) => {
                let undone = seen
                    .lock()
                    .ok()
                    .and_then(|mut s| s.take())
                    .unwrap_or(Undone::Uncordoned);
                let message = format!(
                    "{undone} after FabricTest {key} quarantined it: the test no longer holds the node and leaves what is on it alone{}",
                    if undone.is_repair() {
                        "; it is tested again now, as a node back from repair"
                    } else {
                        ""
                    }
                );
                exec.act(&name, Some(&node), Action::TakenBack, message)
                    .await;
                handed.push(HandedBack { node: name, undone });
            }
            Ok(_) => {}
            Err(error) => exec.fail(&name, Change::HandBack, error).await,
        }
    }
    let errors = std::mem::take(&mut exec.outcome.errors);
    Ok((handed, errors))
}
