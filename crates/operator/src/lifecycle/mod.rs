//! A node's whole life, beyond the schedule: nodes that join behind the validation gate,
//! nodes back from repair, quarantines a person lifted, repeat offenders, and node
//! conditions other tools set. The FabricTest controller calls in here; the pure decisions
//! are in [`targets`] and [`gate`], the node changes go through
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

pub mod gate;
pub mod rejoin;
pub mod repairs;
pub mod targets;

pub use repairs::repairs_on_hold;

use crate::context::Context;
use crate::error::{Error, Result};
use crate::quarantine::{self, Decision, Guarded, Outcome};
use crate::time::now;
use gpufabric_api::keys;
use gpufabric_api::run::{FabricTestRun, NodeRunResult, NodeVerdict, Trigger};
use gpufabric_api::test::{FabricTest, FabricTestStatus, NodeHealth, TakenBack};
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::{Resource, ResourceExt};
use std::collections::{BTreeMap, BTreeSet};

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
    )
    .await
    .map_err(Error::Quarantine)?;
    if handed.is_empty() {
        return Ok(errors.is_empty());
    }
    let at = now();
    for h in &handed {
        status.quarantined_nodes.retain(|n| n != &h.node);
        let e = entry(status, &h.node);
        e.quarantined = false;
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

/// What a folded run means for the nodes' lives, after the quarantine executor ran: the
/// repeat-offender record of each node it quarantined, the repair of each repaired node it
/// measured (the annotation goes; a released one starts with a clean record), the gate of
/// each gated node it passed (opened) or failed (kept), and an Event for the targets it did
/// not measure. `repaired`: the nodes that carried the repaired annotation as the planner
/// saw them; with `breaker_open`, a repair the plan could not release is kept for the
/// reset. False when a node could not be changed.
#[allow(clippy::too_many_arguments)]
pub async fn after_quarantine(
    test: &FabricTest,
    run: &FabricTestRun,
    results: &[NodeRunResult],
    repaired: &BTreeSet<String>,
    outcome: &Outcome,
    breaker_open: bool,
    status: &mut FabricTestStatus,
    ctx: &Context,
) -> bool {
    let at = now();
    let run_name = run.name_any();
    let test_ref = test.object_ref(&());
    let key = test.name_any();
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let mut all_applied = true;

    for node in outcome.nodes_with(quarantine::Action::Quarantined) {
        let e = entry(status, &node);
        if gpufabric_health::history::note_quarantine(e, at.clone(), &test.spec.quarantine) {
            let message = format!(
                "quarantined {} times within {} hours by FabricTest {key}: a repeat offender; passing runs no longer release it, a repair ({}) does",
                e.quarantine_times.len(),
                test.spec.quarantine.repeat_offender_window_hours,
                keys::ANNOTATION_REPAIRED
            );
            publish_on_node(ctx, &nodes, &node, true, "RepeatOffender", message).await;
        }
    }
    for h in &mut status.nodes {
        gpufabric_health::history::forget_old_quarantines(h, &at, &test.spec.quarantine);
    }
    let released: BTreeSet<String> = outcome
        .nodes_with(quarantine::Action::Released)
        .into_iter()
        .collect();

    let verdicts: BTreeMap<&str, NodeVerdict> = results
        .iter()
        .map(|r| (r.node.as_str(), r.verdict))
        .collect();
    let unmeasured: BTreeMap<&str, &[String]> = results
        .iter()
        .map(|r| (r.node.as_str(), r.unmeasured.as_slice()))
        .collect();
    for (node, verdict) in &verdicts {
        let measured = !matches!(verdict, NodeVerdict::NotMeasured | NodeVerdict::Pending);
        if !measured {
            continue;
        }
        let judged = Judged {
            ctx,
            nodes: &nodes,
            key: &key,
            run: &run_name,
            node,
            verdict: *verdict,
            unmeasured: unmeasured.get(node).copied().unwrap_or_default(),
        };
        if repaired.contains(*node) {
            let released = released.contains(*node);
            all_applied &= judged.repair_tested(released, breaker_open, status).await;
        }
        all_applied &= judged.gate().await;
    }

    if run.spec.trigger == Trigger::Targeted {
        let missed: Vec<String> = run
            .spec
            .reasons
            .keys()
            .filter(|n| {
                verdicts
                    .get(n.as_str())
                    .is_none_or(|v| matches!(v, NodeVerdict::NotMeasured | NodeVerdict::Pending))
            })
            .map(|n| {
                let skipped = run.status.as_ref().and_then(|s| {
                    s.skipped
                        .iter()
                        .find(|k| &k.node == n)
                        .map(|k| format!("{} {}", k.node, k.message))
                        .or_else(|| s.message.clone())
                });
                let why = results
                    .iter()
                    .find(|r| &r.node == n)
                    .and_then(|r| r.reason.clone())
                    .or(skipped)
                    .unwrap_or_else(|| "the run ended before it".into());
                format!("{n} ({why})")
            })
            .collect();
        if !missed.is_empty() {
            ctx.events
                .normal(
                    &test_ref,
                    "TargetNotMeasured",
                    "Lifecycle",
                    format!(
                        "run {run_name} did not measure {}; each is tried again after a backoff, and nothing about it changes until a run measures it",
                        missed.join(", ")
                    ),
                )
                .await;
        }
    }
    let offenders: Vec<String> = status
        .nodes
        .iter()
        .filter(|h| h.repeat_offender)
        .map(|h| h.node.clone())
        .collect();
    ctx.metrics
        .quarantine
        .set_repeat_offenders(&key, offenders.len());
    status.repeat_offenders = offenders;
    all_applied
}

/// One measured node of a folded run, as the lifecycle judges it.
struct Judged<'a> {
    ctx: &'a Context,
    nodes: &'a Api<Node>,
    /// The FabricTest's name.
    key: &'a str,
    run: &'a str,
    node: &'a str,
    verdict: NodeVerdict,
    /// Phases that could not run on the node.
    unmeasured: &'a [String],
}

impl Judged<'_> {
    /// A repaired node was measured: the annotation goes, the node's record is cleared when
    /// it passed, and an Event says how the repair test went. `released`: the run's plan
    /// released it. A pass that the open breaker kept from releasing a node the test holds
    /// uses nothing up: the annotation stays and the node is tested again after the reset.
    async fn repair_tested(
        &self,
        released: bool,
        breaker_open: bool,
        status: &mut FabricTestStatus,
    ) -> bool {
        let (key, run, node) = (self.key, self.run, self.node);
        let passed = self.verdict == NodeVerdict::Passed;
        let held = status.nodes.iter().any(|h| h.node == node && h.quarantined);
        if passed && !released && breaker_open && held {
            let message = format!(
                "passed its repair test in run {run} of FabricTest {key}, but the test's breaker is open and releases nothing: the repair ({}) stays and is tested again once a person resets the breaker ({}=now)",
                keys::ANNOTATION_REPAIRED,
                keys::ANNOTATION_RESET_BREAKER
            );
            publish_on_node(self.ctx, self.nodes, node, false, "RepairWaiting", message).await;
            return true;
        }
        if passed {
            gpufabric_health::history::forgive(entry(status, node));
        }
        let cleared =
            match quarantine::guarded(self.nodes, node, |n| match gate::clear_repaired(n) {
                Some(p) => Decision::Patch(p, ()),
                None => Decision::Keep(()),
            })
            .await
            {
                Ok(_) => true,
                Err(e) => {
                    tracing::warn!(node, error = %e, "could not remove the repaired annotation");
                    false
                }
            };
        let (warning, reason, message) = match (passed, released) {
            (true, true) => (
                false,
                "RepairPassed",
                format!("passed its repair test in run {run} of FabricTest {key}: released"),
            ),
            (true, false) => (
                false,
                "RepairPassed",
                format!("passed its repair test in run {run} of FabricTest {key}"),
            ),
            (false, _) => (
                true,
                "RepairFailed",
                format!(
                    "failed its repair test in run {run} of FabricTest {key}: it stays quarantined (or is quarantined as the test's policy says)"
                ),
            ),
        };
        publish_on_node(self.ctx, self.nodes, node, warning, reason, message).await;
        cleared
    }

    /// A measured node that carries the validation gate: a pass opens it (unless a
    /// quarantine holds the node), a failure keeps it.
    async fn gate(&self) -> bool {
        let (ctx, nodes, key, run, node) = (self.ctx, self.nodes, self.key, self.run, self.node);
        let gated = ctx
            .nodes
            .get(&kube::runtime::reflector::ObjectRef::new(node))
            .is_some_and(|n| targets::is_gated(&n));
        if !gated {
            return true;
        }
        if self.verdict != NodeVerdict::Passed {
            let message = format!(
                "failed run {run} of FabricTest {key}: the validation gate {} stays",
                keys::TAINT_VALIDATION
            );
            publish_on_node(ctx, nodes, node, true, "ValidationFailed", message).await;
            return true;
        }
        if !self.unmeasured.is_empty() {
            let message = format!(
                "passed what ran in run {run} of FabricTest {key}, but {} could not run (see the run's findings: the suite or the agent's settings): the validation gate {} stays until a run measures every phase",
                self.unmeasured.join(", "),
                keys::TAINT_VALIDATION
            );
            publish_on_node(ctx, nodes, node, true, "ValidationIncomplete", message).await;
            return true;
        }
        let opened = quarantine::guarded(nodes, node, |n| match gate::open(n) {
            Ok(p) => Decision::Patch(p, None),
            Err(kept) => Decision::Keep(Some(kept)),
        })
        .await;
        match opened {
            Ok(Guarded::Patched(..)) => {
                let message = format!(
                    "passed run {run} of FabricTest {key}: the validation gate {} is removed",
                    keys::TAINT_VALIDATION
                );
                publish_on_node(ctx, nodes, node, false, "ValidationPassed", message).await;
                true
            }
            Ok(Guarded::Kept(_, Some(gate::GateKept::Quarantined))) => {
                let message = format!(
                    "passed run {run} of FabricTest {key}, but a gpufabric quarantine holds it: the validation gate {} stays until it is released",
                    keys::TAINT_VALIDATION
                );
                publish_on_node(ctx, nodes, node, false, "ValidationHeld", message).await;
                true
            }
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(node, error = %e, "could not open the validation gate");
                false
            }
        }
    }
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
    let joined: Vec<String> = ctx
        .nodes
        .state()
        .iter()
        .filter(|n| targets::selects(test, n))
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
            Some(p) => Decision::Patch(p, ()),
            None => Decision::Keep(()),
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
/// that it selects, and the names it does not select. None when neither annotation is set.
pub fn named_by_hand<'a>(
    test: &FabricTest,
    nodes: impl IntoIterator<Item = &'a Node> + Clone,
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
        if (named || matched) && targets::selects(test, n) {
            chosen.push(name);
        }
    }
    chosen.sort();
    chosen.dedup();
    let not_selected = listed.into_iter().filter(|n| !chosen.contains(n)).collect();
    Some((chosen, not_selected))
}
