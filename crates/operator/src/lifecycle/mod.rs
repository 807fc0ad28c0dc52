//! A node's whole life, beyond the schedule: nodes that join behind the validation gate,
//! nodes back from repair, quarantines a person lifted, repeat offenders, and node
//! conditions other tools set. The FabricTest controller calls in here; the pure decisions
//! are in [`targets`], [`gate`] and [`after_run`] (what follows a folded run), and
//! [`carry_out`] performs the last one's steps; the node changes go through
//! [`crate::quarantine::guarded`].
//!
//! States of a node, as one FabricTest sees it, and what moves it:
//! - **gated** (taint `gpufabric.io/validation`): tested at once; a pass opens the gate, a
//!   failure quarantines it as the policy says and the gate stays;
//! - **in service**: tested on the schedule; a failure (confirmed) quarantines it;
//! - **quarantined**: passing runs release it (`passesToRelease`); a repair
//!   (`gpufabric.io/repaired`) is tested at once and one pass releases it;
//! - **repeat offender** (quarantined `repeatOffenderQuarantines` times in the window):
//!   only a repair releases it;
//! - **taken back**: a person lifted the quarantine; the test no longer holds the node and
//!   tests it at once as back from repair; a failure quarantines it again.

pub mod after_run;
pub mod gate;
pub mod rejoin;
pub mod repairs;
pub mod targets;

pub use repairs::repairs_on_hold;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::quarantine::{self, Guarded, NodeChange};
use crate::time::now;
use gpufabric_api::keys;
use gpufabric_api::test::{FabricTest, FabricTestStatus, NodeHealth, TakenBack};
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::{Resource, ResourceExt};
use std::collections::BTreeMap;

/// The entry of `node` in the test's history, made when there is none.
pub(crate) fn entry<'s>(status: &'s mut FabricTestStatus, node: &str) -> &'s mut NodeHealth {
    let i = match status.nodes.iter().position(|h| h.node == node) {
        Some(i) => i,
        None => {
            status.nodes.push(NodeHealth {
                node: node.to_string(),
                ..NodeHealth::default()
            });
            status.nodes.len() - 1
        }
    };
    &mut status.nodes[i]
}

/// Ends the test's claim on every node whose quarantine someone else undid
/// ([`quarantine::hand_back`]) and writes it into `status`: the node is no longer
/// quarantined by the test, and its `takenBack` says what happened (a lifted quarantine is
/// then a target: the node is tested at once). False when a node could not be changed
/// (look again soon).
pub async fn hand_back(
    test: &FabricTest,
    ctx: &Context,
    status: &mut FabricTestStatus,
) -> Result<bool> {
    let key = quarantine::test_key(test).map_err(Error::Quarantine)?;
    let cached = ctx.nodes.state();
    let _cap = ctx.quarantine_lock.lock().await;
    let (handed, errors) = quarantine::hand_back(
        &ctx.client,
        &ctx.events,
        &ctx.metrics.quarantine,
        test,
        cached.iter().map(|n| n.as_ref()),
        Some(&ctx.quarantine_writes),
    )
    .await
    .map_err(Error::Quarantine)?;
    if handed.is_empty() {
        return Ok(errors.is_empty());
    }
    let at = now();
    for h in &handed {
        status.quarantined_nodes.retain(|n| n != &h.node);
        status.repeat_offenders.retain(|n| n != &h.node);
        let e = entry(status, &h.node);
        e.quarantined_since = None;
        e.held_back = None;
        e.standing = e.standing.on_taken_back(&h.undone.to_string());
        e.taken_back = Some(TakenBack {
            what: h.undone.to_string(),
            at: at.clone(),
            repair: h.undone.is_repair(),
        });
    }
    status.quarantined_count = status
        .quarantined_count
        .saturating_sub(u32::try_from(handed.len()).unwrap_or(u32::MAX));
    ctx.metrics
        .quarantine
        .set_quarantined(&key, status.quarantined_count as usize);
    let list: Vec<String> = handed
        .iter()
        .map(|h| format!("{} ({})", h.node, h.undone))
        .collect();
    ctx.events
        .normal(
            &test.object_ref(&()),
            "QuarantineTakenBack",
            "Quarantine",
            format!(
                "no longer holds {} node(s) whose quarantine someone else undid: {}",
                handed.len(),
                list.join(", ")
            ),
        )
        .await;
    Ok(errors.is_empty())
}

/// Carries out the lifecycle's plan after a folded run ([`after_run::plan`]): each step in
/// order, every node change a resourceVersion-guarded patch, and the repeat offenders'
/// metric from `status`. Decides nothing. False when a node could not be changed.
pub async fn carry_out(
    test: &FabricTest,
    steps: Vec<after_run::LifeStep>,
    status: &FabricTestStatus,
    ctx: &Context,
) -> bool {
    use after_run::LifeStep;
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let mut all_applied = true;
    for step in steps {
        match step {
            LifeStep::Note(note) => publish_note(ctx, &nodes, note).await,
            LifeStep::ClearRepaired { node, then } => {
                let cleared =
                    quarantine::guarded(&nodes, &node, |n| match gate::clear_repaired(n) {
                        Some(p) => NodeChange::Patch(p, ()),
                        None => NodeChange::Keep(()),
                    })
                    .await;
                if let Err(e) = cleared {
                    tracing::warn!(node, error = %e, "could not remove the repaired annotation");
                    all_applied = false;
                }
                publish_note(ctx, &nodes, then).await;
            }
            LifeStep::OpenGate { node, opened, held } => {
                let outcome = quarantine::guarded(&nodes, &node, |n| match gate::open(n) {
                    Ok(p) => NodeChange::Patch(p, None),
                    Err(kept) => NodeChange::Keep(Some(kept)),
                })
                .await;
                match outcome {
                    Ok(Guarded::Patched(..)) => publish_note(ctx, &nodes, opened).await,
                    Ok(Guarded::Kept(_, Some(gate::GateKept::Quarantined))) => {
                        publish_note(ctx, &nodes, held).await;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(node, error = %e, "could not open the validation gate");
                        all_applied = false;
                    }
                }
            }
            LifeStep::TestNote { reason, message } => {
                ctx.events
                    .normal(&test.object_ref(&()), reason, "Lifecycle", message)
                    .await;
            }
        }
    }
    ctx.metrics
        .quarantine
        .set_repeat_offenders(&test.name_any(), status.repeat_offenders.len());
    all_applied
}

/// Publishes a planned note on its node ([`publish_on_node`]).
async fn publish_note(ctx: &Context, nodes: &Api<Node>, note: after_run::NodeNote) {
    publish_on_node(
        ctx,
        nodes,
        &note.node,
        note.warning,
        note.reason,
        note.message,
    )
    .await;
}

/// Puts the validation gate on the selected nodes that joined after the test was created
/// and that it has never measured (`nodeLifecycle.gateNewNodes`). A node is gated once: the
/// annotation `gpufabric.io/gated` keeps a person's opening of it.
pub async fn gate_new_nodes(test: &FabricTest, ctx: &Context, status: &FabricTestStatus) {
    if !test.spec.node_lifecycle.gate_new_nodes {
        return;
    }
    let Some(created) = test.metadata.creation_timestamp.as_ref() else {
        return;
    };
    // Measured as this Node: an entry of an earlier Node of the name does not count.
    let measured: BTreeMap<&str, &gpufabric_api::test::NodeHealth> = status
        .nodes
        .iter()
        .filter(|h| h.last_measured.is_some())
        .map(|h| (h.node.as_str(), h))
        .collect();
    let key = test.name_any();
    let cached = ctx.nodes.state();
    let needed = targets::needs_devices(test, cached.iter().map(|n| n.as_ref()));
    let devices = ctx.devices.counts_if(needed, &ctx.client).await;
    let joined: Vec<String> = cached
        .iter()
        .filter(|n| targets::selects(test, n, &devices))
        .filter(|n| {
            n.metadata
                .creation_timestamp
                .as_ref()
                .is_some_and(|c| c.0 > created.0)
        })
        .filter(|n| {
            measured
                .get(n.name_any().as_str())
                .is_none_or(|h| targets::of_an_earlier_node(h, n))
        })
        .filter(|n| gate::close(n, &key).is_some())
        .map(|n| n.name_any())
        .collect();
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    for name in joined {
        let closed = quarantine::guarded(&nodes, &name, |n| match gate::close(n, &key) {
            Some(p) => NodeChange::Patch(p, ()),
            None => NodeChange::Keep(()),
        })
        .await;
        match closed {
            Ok(Guarded::Patched(..)) => {
                let message = format!(
                    "joined after FabricTest {key}, which gates new nodes: taint {}:NoSchedule until a run passes it",
                    keys::TAINT_VALIDATION
                );
                publish_on_node(ctx, &nodes, &name, false, "Gated", message).await;
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(node = %name, error = %e, "could not gate a new node"),
        }
    }
}

/// An Event on a node (read for its uid, so that `kubectl describe node` shows it).
async fn publish_on_node(
    ctx: &Context,
    nodes: &Api<Node>,
    node: &str,
    warning: bool,
    reason: &str,
    message: String,
) {
    if warning {
        tracing::warn!(node, reason, "{message}");
    } else {
        tracing::info!(node, reason, "{message}");
    }
    let Ok(Some(n)) = nodes.get_opt(node).await else {
        return;
    };
    let on = n.object_ref(&());
    if warning {
        ctx.events.warning(&on, reason, "Lifecycle", message).await;
    } else {
        ctx.events.normal(&on, reason, "Lifecycle", message).await;
    }
}

/// A targeted run to start now: its nodes, and why each.
#[derive(Clone, Debug, PartialEq)]
pub struct Targeted {
    pub nodes: Vec<String>,
    pub reasons: BTreeMap<String, String>,
    /// The test's annotations that asked for it (removed once the run exists).
    pub by_hand: bool,
}

/// The nodes named by hand on the test (`gpufabric.io/run-nodes`, `gpufabric.io/run-selector`)
/// that it selects (`dra_gpus`: each node's GPUs as DRA devices, [`targets::selects`]), and
/// the names it does not select. None when neither annotation is set.
pub fn named_by_hand<'a>(
    test: &FabricTest,
    nodes: impl IntoIterator<Item = &'a Node> + Clone,
    dra_gpus: &BTreeMap<String, u32>,
) -> Option<(Vec<String>, Vec<String>)> {
    let a = test.annotations();
    let names = a.get(keys::ANNOTATION_RUN_NODES);
    let selector = a.get(keys::ANNOTATION_RUN_SELECTOR);
    if names.is_none() && selector.is_none() {
        return None;
    }
    let listed: Vec<String> = names
        .map(|s| {
            s.split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    let labels: Option<BTreeMap<String, String>> = selector.map(|s| {
        s.split(',')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect()
    });
    let mut chosen = Vec::new();
    for n in nodes.clone() {
        let name = n.name_any();
        let named = names.is_some() && listed.contains(&name);
        let matched = labels
            .as_ref()
            .is_some_and(|l| !l.is_empty() && crate::nodes::matches_selector(n, l));
        if (named || matched) && targets::selects(test, n, dra_gpus) {
            chosen.push(name);
        }
    }
    chosen.sort();
    chosen.dedup();
    let not_selected = listed.into_iter().filter(|n| !chosen.contains(n)).collect();
    Some((chosen, not_selected))
}
