//! Which nodes a FabricTest tests now, outside its schedule, and when it tries again: pure
//! decisions from the nodes as cached and the test's history.

use crate::nodes::{gpu_count, matches_selector};
use gpufabric_api::keys::{ANNOTATION_QUARANTINE, ANNOTATION_REPAIRED, TAINT_VALIDATION};
use gpufabric_api::test::{
    CONDITION_RUN_WINDOW_SECONDS, CONDITION_RUNS_PER_WINDOW, FabricTest, NodeHealth, NodeTarget,
};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use std::collections::BTreeMap;

/// Most targets a test's status lists (and a targeted run takes at once).
pub const MAX_TARGETS: usize = 200;
/// The first retry of a target that a run did not measure waits this long; each further
/// one twice as long, up to [`MAX_BACKOFF_SECONDS`].
pub const FIRST_BACKOFF_SECONDS: i64 = 20;
pub const MAX_BACKOFF_SECONDS: i64 = 600;

/// The node is selected by `test` (its selector, its name list, GPUs: allocatable
/// `nvidia.com/gpu` or, where it has them, its GPUs published as DRA devices, `dra_gpus`, as
/// [`gpu_count`] counts them for a run) and not being deleted.
pub fn selects(test: &FabricTest, node: &Node, dra_gpus: &BTreeMap<String, u32>) -> bool {
    named(test, node) && gpu_count(node, dra_gpus) > 0
}

/// The node is selected by `test`'s selector and name list, and not being deleted, whatever
/// its GPUs.
fn named(test: &FabricTest, node: &Node) -> bool {
    node.metadata.deletion_timestamp.is_none()
        && test
            .spec
            .nodes
            .as_ref()
            .is_none_or(|names| names.contains(&node.name_any()))
        && matches_selector(node, &test.spec.node_selector)
}

/// Whether [`selects`] needs the nodes' DRA devices to decide: some node the test names
/// (selector, name list) offers no `nvidia.com/gpu`, and may have its GPUs as devices only.
/// Where every such node has `nvidia.com/gpu`, the devices change nothing and are not read.
pub fn needs_devices<'a>(test: &FabricTest, nodes: impl IntoIterator<Item = &'a Node>) -> bool {
    nodes
        .into_iter()
        .any(|n| named(test, n) && crate::pods::allocatable_gpus(n) == 0)
}

/// The node carries the validation gate.
pub fn is_gated(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == TAINT_VALIDATION))
}

/// `a` is before `b` (both present).
fn before(a: &Time, b: &Time) -> bool {
    a.0 < b.0
}

/// The test has not measured the node since `since`.
fn unmeasured_since(h: Option<&NodeHealth>, since: Option<&Time>) -> bool {
    match (h.and_then(|h| h.last_measured.as_ref()), since) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(measured), Some(since)) => before(measured, since),
    }
}

/// What a node's repaired annotation (`gpufabric.io/repaired`) asks of a test now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Repair {
    /// The node carries no repaired annotation.
    None,
    /// Test the node now; why, as a sentence.
    Test(String),
    /// The test's breaker is open: nothing is released until a person resets it, so the
    /// repair waits (the annotation stays) and is tested after the reset.
    WaitsForReset(String),
    /// No gpufabric quarantine and no validation gate hold the node (someone else cordoned
    /// it, or nothing does): a repair has nothing to release, and starts no run.
    NotHeld,
}

/// What the repaired annotation of `node` asks now (see [`Repair`]).
pub fn repair(node: &Node, breaker_open: bool) -> Repair {
    let Some(v) = node.annotations().get(ANNOTATION_REPAIRED) else {
        return Repair::None;
    };
    if !node.annotations().contains_key(ANNOTATION_QUARANTINE) && !is_gated(node) {
        return Repair::NotHeld;
    }
    let note = if v.trim().is_empty() {
        String::new()
    } else {
        format!(": {}", short(v))
    };
    let why = format!("marked repaired ({ANNOTATION_REPAIRED}{note})");
    if breaker_open {
        Repair::WaitsForReset(format!("{why}, waits for the reset of the breaker"))
    } else {
        Repair::Test(why)
    }
}

/// When the test first saw the gate on the node this time (its creation when not yet seen:
/// a node that joins gated).
fn gate_appeared<'a>(node: &'a Node, h: Option<&'a NodeHealth>) -> Option<&'a Time> {
    let created = node.metadata.creation_timestamp.as_ref();
    match (h.and_then(|h| h.gated_since.as_ref()), created) {
        (Some(seen), Some(c)) if before(seen, c) => Some(c),
        (Some(seen), _) => Some(seen),
        (None, c) => c,
    }
}

/// The latest rise (turn to True) of a condition the test names that is still to be served:
/// the test has neither measured the node since, nor served that rise already (one run per
/// rise; [`admit_rise`]).
pub fn condition_rise(test: &FabricTest, node: &Node, h: Option<&NodeHealth>) -> Option<Time> {
    conditions(node)
        .iter()
        .filter(|c| c.status == "True")
        .filter(|c| {
            test.spec
                .node_lifecycle
                .test_on_conditions
                .contains(&c.type_)
        })
        .filter(|c| unmeasured_since(h, c.last_transition_time.as_ref()))
        .filter_map(|c| c.last_transition_time.clone())
        .filter(|t| {
            h.and_then(|h| h.condition_rise.as_ref())
                .is_none_or(|served| before(served, t))
        })
        .max_by_key(|t| t.0)
}

/// Why the test must test `node` now, if it must: the validation gate (and the test has not
/// measured the node since the gate appeared, whoever put it there), the repaired annotation
/// on a node gpufabric holds with the breaker closed ([`repair`]), a quarantine someone else
/// lifted (not measured since), a node condition the test names turned True (a rise not
/// measured nor served since, [`condition_rise`]). Several reasons are joined.
pub fn why_now(
    test: &FabricTest,
    node: &Node,
    h: Option<&NodeHealth>,
    breaker_open: bool,
) -> Option<String> {
    let mut why = Vec::new();
    if is_gated(node) && unmeasured_since(h, gate_appeared(node, h)) {
        why.push(format!("carries the validation gate {TAINT_VALIDATION}"));
    }
    if let Repair::Test(r) = repair(node, breaker_open) {
        why.push(r);
    }
    if let Some(t) = h.and_then(|h| h.taken_back.as_ref())
        && t.repair
        && unmeasured_since(h, Some(&t.at))
    {
        why.push(format!(
            "its quarantine was lifted ({}): tested as back from repair",
            t.what
        ));
    }
    let rise = condition_rise(test, node, h);
    let conditions = conditions(node);
    for wanted in &test.spec.node_lifecycle.test_on_conditions {
        let Some(c) = conditions.iter().find(|c| &c.type_ == wanted) else {
            continue;
        };
        if c.status == "True" && rise.is_some() && c.last_transition_time == rise {
            let detail = [c.reason.as_deref(), c.message.as_deref()]
                .into_iter()
                .flatten()
                .filter(|s| !s.is_empty())
                .map(short)
                .collect::<Vec<_>>()
                .join(": ");
            why.push(if detail.is_empty() {
                format!("condition {wanted}=True")
            } else {
                format!("condition {wanted}=True ({detail})")
            });
        }
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// A targeted run may start for the condition rise `rise` of a node whose history is `h`,
/// at `now`: at most one run per rise, and at most [`CONDITION_RUNS_PER_WINDOW`] runs in
/// [`CONDITION_RUN_WINDOW_SECONDS`]. Either way the rise is served (`conditionRise`); a run
/// is recorded (`conditionRuns`), a rise beyond the bound is dropped and counted
/// (`conditionRisesDropped`). True when the run may start.
pub fn admit_rise(h: &mut NodeHealth, rise: &Time, now: &Time) -> bool {
    let window_start = after(now, -CONDITION_RUN_WINDOW_SECONDS);
    h.condition_runs.retain(|t| before(&window_start, t));
    h.condition_rise = Some(rise.clone());
    if h.condition_runs.len() >= CONDITION_RUNS_PER_WINDOW {
        h.condition_rises_dropped = h.condition_rises_dropped.saturating_add(1);
        return false;
    }
    h.condition_runs.push(now.clone());
    true
}

/// Seconds an entry's last time must lie before a Node's creation for the entry to be of an
/// earlier Node: the operator's clock and the API server's may differ by a little.
pub const CLOCK_SKEW_SECONDS: i64 = 30;

/// A node's entry in the history is of an earlier Node of the same name (a machine deleted
/// and registered again, re-imaged or replaced under its hostname): everything a run or a
/// quarantine recorded in it happened before this Node was created (by more than
/// [`CLOCK_SKEW_SECONDS`]). Its history does not count for this one.
pub fn of_an_earlier_node(h: &NodeHealth, node: &Node) -> bool {
    let Some(created) = node.metadata.creation_timestamp.as_ref() else {
        return false;
    };
    let times = [
        h.last_judged.as_ref(),
        h.last_measured.as_ref(),
        h.quarantined_since.as_ref(),
        h.taken_back.as_ref().map(|t| &t.at),
    ];
    let latest = times
        .into_iter()
        .flatten()
        .chain(h.quarantine_times.iter())
        .chain(h.condition_runs.iter())
        .max_by_key(|t| t.0);
    latest.is_some_and(|t| before(&after(t, CLOCK_SKEW_SECONDS), created))
}

/// Notes, for each node as cached, when the validation gate appeared on it (`gatedSince`,
/// kept while the gate stays, cleared when it goes) so that a gate put on again is a new
/// request. `dra_gpus`: each node's GPUs as DRA devices ([`selects`]). Returns whether
/// `history` changed.
pub fn note_gates<'a>(
    test: &FabricTest,
    nodes: impl IntoIterator<Item = &'a Node>,
    dra_gpus: &BTreeMap<String, u32>,
    history: &mut Vec<NodeHealth>,
    now: &Time,
) -> bool {
    let gated: BTreeMap<String, bool> = nodes
        .into_iter()
        .filter(|n| selects(test, n, dra_gpus))
        .map(|n| (n.name_any(), is_gated(n)))
        .collect();
    let mut changed = false;
    for h in history.iter_mut() {
        if h.gated_since.is_some() && !gated.get(&h.node).copied().unwrap_or(false) {
            h.gated_since = None;
            changed = true;
        }
    }
    for (node, _) in gated.iter().filter(|(_, g)| **g) {
        match history.iter_mut().find(|h| &h.node == node) {
            Some(h) if h.gated_since.is_some() => {}
            Some(h) => {
                h.gated_since = Some(now.clone());
                changed = true;
            }
            None => {
                history.push(NodeHealth {
                    node: node.clone(),
                    gated_since: Some(now.clone()),
                    ..NodeHealth::default()
                });
                changed = true;
            }
        }
    }
    changed
}

/// The node's conditions (none when it reports none).
pub fn conditions(node: &Node) -> &[k8s_openapi::api::core::v1::NodeCondition] {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// A condition's message for a reason: at most 160 bytes.
fn short(s: &str) -> String {
    gpufabric_api::text::cut(s, 160)
}

/// What the nodes ask of a test now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Wanted {
    /// Every node to test now, by name, with why (see [`why_now`]).
    pub now: BTreeMap<String, String>,
    /// The latest unserved condition rise of each node in `now` that has one.
    pub rises: BTreeMap<String, Time>,
    /// Repaired nodes that wait for the reset of the breaker, with why.
    pub waiting: BTreeMap<String, String>,
    /// Repaired nodes gpufabric does not hold ([`Repair::NotHeld`]).
    pub not_held: Vec<String>,
}

/// What the selected `nodes` ask of `test` now, from its history and its breaker.
/// `dra_gpus`: each node's GPUs as DRA devices ([`selects`]).
pub fn wanted<'a>(
    test: &FabricTest,
    nodes: impl IntoIterator<Item = &'a Node>,
    dra_gpus: &BTreeMap<String, u32>,
    history: &[NodeHealth],
    breaker_open: bool,
) -> Wanted {
    let by_node: BTreeMap<&str, &NodeHealth> =
        history.iter().map(|h| (h.node.as_str(), h)).collect();
    let mut w = Wanted::default();
    for n in nodes.into_iter().filter(|n| selects(test, n, dra_gpus)) {
        let name = n.name_any();
        let h = by_node.get(name.as_str()).copied();
        if let Some(why) = why_now(test, n, h, breaker_open) {
            if let Some(rise) = condition_rise(test, n, h) {
                w.rises.insert(name.clone(), rise);
            }
            w.now.insert(name.clone(), why);
        }
        match repair(n, breaker_open) {
            Repair::WaitsForReset(why) => {
                w.waiting.insert(name, why);
            }
            Repair::NotHeld => w.not_held.push(name),
            Repair::None | Repair::Test(_) => {}
        }
    }
    w
}

/// The targets that wait (a repair waiting for the breaker's reset): listed, never due.
pub fn waiting(waiting: &BTreeMap<String, String>) -> Vec<NodeTarget> {
    waiting
        .iter()
        .map(|(node, reason)| NodeTarget {
            node: node.clone(),
            reason: reason.clone(),
            attempts: 0,
            next_attempt: None,
        })
        .collect()
}

/// The targets after this look: each wanted node, with the attempts and backoff its earlier
/// entry had (a node no longer wanted is dropped), at most [`MAX_TARGETS`]; and the nodes
/// due now (no backoff pending).
pub fn schedule(
    previous: &[NodeTarget],
    wanted: &BTreeMap<String, String>,
    now: &Time,
) -> (Vec<NodeTarget>, Vec<String>) {
    let before: BTreeMap<&str, &NodeTarget> =
        previous.iter().map(|t| (t.node.as_str(), t)).collect();
    let targets: Vec<NodeTarget> = wanted
        .iter()
        .take(MAX_TARGETS)
        .map(|(node, reason)| {
            let prev = before.get(node.as_str());
            NodeTarget {
                node: node.clone(),
                reason: reason.clone(),
                attempts: prev.map_or(0, |p| p.attempts),
                next_attempt: prev.and_then(|p| p.next_attempt.clone()),
            }
        })
        .collect();
    let due = targets
        .iter()
        .filter(|t| {
            t.next_attempt
                .as_ref()
                .is_none_or(|at| !before_now(now, at))
        })
        .map(|t| t.node.clone())
        .collect();
    (targets, due)
}

/// `now` is before `at`.
fn before_now(now: &Time, at: &Time) -> bool {
    before(now, at)
}

/// A targeted run starts for `nodes` at `now`: each counts an attempt and waits its backoff
/// before the next (a run that measures it ends the target; one that does not leaves it to
/// be tried again then).
pub fn attempted(targets: &mut [NodeTarget], nodes: &[String], now: &Time) {
    for t in targets.iter_mut().filter(|t| nodes.contains(&t.node)) {
        t.attempts = t.attempts.saturating_add(1);
        t.next_attempt = Some(after(now, backoff_seconds(t.attempts)));
    }
}

/// The wait after the `attempts`-th run.
pub fn backoff_seconds(attempts: u32) -> i64 {
    let doublings = attempts.saturating_sub(1).min(20);
    (FIRST_BACKOFF_SECONDS << doublings).min(MAX_BACKOFF_SECONDS)
}

fn after(t: &Time, seconds: i64) -> Time {
    Time(
        k8s_openapi::jiff::Timestamp::from_second(t.0.as_second().saturating_add(seconds))
            .unwrap_or(t.0),
    )
}

#[cfg(test)]
mod tests;
