//! What a folded run means for the nodes' lives once the quarantine executor ran, decided
//! with no client: the test's own records brought up to date and the node writes and Events
//! that follow, as [`LifeStep`]s that [`super::carry_out`] performs in order.

use crate::quarantine::{self, Outcome};
use gpufabric_api::keys;
use gpufabric_api::run::{FabricTestRun, NodeRunResult, NodeVerdict, Trigger};
use gpufabric_api::test::{FabricTest, FabricTestStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use std::collections::{BTreeMap, BTreeSet};

/// An Event about a node: Warning or Normal, its reason and note.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeNote {
    pub node: String,
    pub warning: bool,
    pub reason: &'static str,
    pub message: String,
}

impl NodeNote {
    fn normal(node: &str, reason: &'static str, message: String) -> Self {
        NodeNote {
            node: node.to_string(),
            warning: false,
            reason,
            message,
        }
    }

    fn warning(node: &str, reason: &'static str, message: String) -> Self {
        NodeNote {
            warning: true,
            ..NodeNote::normal(node, reason, message)
        }
    }
}

/// One thing the lifecycle does to the cluster after a folded run, in the order planned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LifeStep {
    /// An Event on the node.
    Note(NodeNote),
    /// Take the repaired annotation off the node (a resourceVersion-guarded patch), then
    /// publish `then`, whether or not the annotation could be taken off.
    ClearRepaired { node: String, then: NodeNote },
    /// Open the node's validation gate (a guarded patch): `opened` when it was removed,
    /// `held` when a gpufabric quarantine keeps it.
    OpenGate {
        node: String,
        opened: NodeNote,
        held: NodeNote,
    },
    /// An Event on the FabricTest.
    TestNote {
        reason: &'static str,
        message: String,
    },
}

/// What the plan reads of a folded run after the quarantine executor ran.
pub struct AfterRun<'a> {
    pub test: &'a FabricTest,
    pub run: &'a FabricTestRun,
    /// Every node's result (all of the run's shards).
    pub results: &'a [NodeRunResult],
    /// The nodes that carried the repaired annotation as the planner saw them.
    pub repaired: &'a BTreeSet<String>,
    pub outcome: &'a Outcome,
    /// The test's breaker is open: a repair the plan could not release is kept for the reset.
    pub breaker_open: bool,
    /// Whether a node carries the validation gate now.
    pub gated: &'a dyn Fn(&str) -> bool,
    pub at: Time,
}

/// Plans the lifecycle after a folded run and brings `status` up to date (no client):
/// 1. each node the executor quarantined adds to its repeat-offender record; one that
///    becomes a repeat offender gets a Warning (a node already one, by its standing, stays
///    one while the test holds it, until a repair test passes);
/// 2. quarantines older than the repeat-offender window are forgotten;
/// 3. each repaired node the run measured loses its repaired annotation, and an Event says
///    how its repair test went; a pass clears its record, except that a pass the open
///    breaker kept from releasing a node the test holds uses nothing up (the annotation
///    stays until the breaker is reset);
/// 4. each gated node the run measured: a full pass opens the gate, a failure or a partial
///    measurement keeps it, with an Event either way;
/// 5. a targeted run's targets it did not measure are named in one Event on the test;
/// 6. the status lists the repeat offenders the test holds (`repeatOffenders`): what the
///    nodes' standings then read.
pub fn plan(a: &AfterRun, status: &mut FabricTestStatus) -> Vec<LifeStep> {
    let mut steps = Vec::new();
    let key = a.test.name_any();
    let policy = &a.test.spec.quarantine;
    let mut offenders: BTreeSet<String> = status
        .nodes
        .iter()
        .filter(|h| h.standing.is_repeat_offender())
        .map(|h| h.node.clone())
        .collect();
    for node in a.outcome.nodes_with(quarantine::Action::Quarantined) {
        let e = super::entry(status, &node);
        if gpufabric_health::history::note_quarantine(e, a.at.clone(), policy) {
            offenders.insert(node.clone());
            steps.push(LifeStep::Note(NodeNote::warning(
                &node,
                "RepeatOffender",
                format!(
                    "quarantined {} times within {} hours by FabricTest {key}: a repeat offender; passing runs no longer release it, a repair ({}) does",
                    e.quarantine_times.len(),
                    policy.repeat_offender_window_hours,
                    keys::ANNOTATION_REPAIRED
                ),
            )));
        }
    }
    for h in &mut status.nodes {
        gpufabric_health::history::forget_old_quarantines(h, &a.at, policy);
    }
    let released: BTreeSet<String> = a
        .outcome
        .nodes_with(quarantine::Action::Released)
        .into_iter()
        .collect();
    let judged = Judged {
        key: &key,
        run: &a.run.name_any(),
    };
    // One result a node, in the nodes' order.
    let by_node: BTreeMap<&str, &NodeRunResult> =
        a.results.iter().map(|r| (r.node.as_str(), r)).collect();
    for r in by_node.values().filter(|r| measured(r.verdict)) {
        if a.repaired.contains(&r.node) {
            let repair = Repair {
                released: released.contains(&r.node),
                held: a.outcome.quarantined.contains_key(&r.node),
                breaker_open: a.breaker_open,
            };
            let (step, forgiven) = judged.repair_tested(r, &repair, status);
            if forgiven {
                offenders.remove(&r.node);
            }
            steps.push(step);
        }
        if (a.gated)(&r.node) {
            steps.push(judged.gate(r));
        }
    }
    steps.extend(targets_missed(a.run, &by_node));
    offenders.retain(|n| a.outcome.quarantined.contains_key(n));
    status.repeat_offenders = offenders.into_iter().collect();
    steps
}

/// What the executor did with a repaired node the run measured.
struct Repair {
    /// The plan released it.
    released: bool,
    /// The test holds it in quarantine after the executor ran.
    held: bool,
    /// The test's breaker is open.
    breaker_open: bool,
}

fn measured(v: NodeVerdict) -> bool {
    !matches!(v, NodeVerdict::NotMeasured | NodeVerdict::Pending)
}

/// The names that every note about a measured node of the run carries.
struct Judged<'a> {
    /// The FabricTest's name.
    key: &'a str,
    run: &'a str,
}

impl Judged<'_> {
    /// Rule 3: a repaired node was measured. True with the step when the pass proved the
    /// repair (the node's record is cleared: no longer a repeat offender).
    fn repair_tested(
        &self,
        r: &NodeRunResult,
        repair: &Repair,
        status: &mut FabricTestStatus,
    ) -> (LifeStep, bool) {
        let (key, run, node) = (self.key, self.run, r.node.as_str());
        let passed = r.verdict == NodeVerdict::Passed;
        let released = repair.released;
        if passed && !released && repair.breaker_open && repair.held {
            let waiting = NodeNote::normal(
                node,
                "RepairWaiting",
                format!(
                    "passed its repair test in run {run} of FabricTest {key}, but the test's breaker is open and releases nothing: the repair ({}) stays and is tested again once a person resets the breaker ({}=now)",
                    keys::ANNOTATION_REPAIRED,
                    keys::ANNOTATION_RESET_BREAKER
                ),
            );
            return (LifeStep::Note(waiting), false);
        }
        if passed {
            gpufabric_health::history::forgive(super::entry(status, node));
        }
        let then = match (passed, released) {
            (true, true) => NodeNote::normal(
                node,
                "RepairPassed",
                format!("passed its repair test in run {run} of FabricTest {key}: released"),
            ),
            (true, false) => NodeNote::normal(
                node,
                "RepairPassed",
                format!("passed its repair test in run {run} of FabricTest {key}"),
            ),
            (false, _) => NodeNote::warning(
                node,
                "RepairFailed",
                format!(
                    "failed its repair test in run {run} of FabricTest {key}: it stays quarantined (or is quarantined as the test's policy says)"
                ),
            ),
        };
        let step = LifeStep::ClearRepaired {
            node: node.to_string(),
            then,
        };
        (step, passed)
    }

    /// Rule 4: a measured node that carries the validation gate.
    fn gate(&self, r: &NodeRunResult) -> LifeStep {
        let (key, run, node) = (self.key, self.run, r.node.as_str());
        let gate = keys::TAINT_VALIDATION;
        if r.verdict != NodeVerdict::Passed {
            return LifeStep::Note(NodeNote::warning(
                node,
                "ValidationFailed",
                format!("failed run {run} of FabricTest {key}: the validation gate {gate} stays"),
            ));
        }
        if !r.unmeasured.is_empty() {
            return LifeStep::Note(NodeNote::warning(
                node,
                "ValidationIncomplete",
                format!(
                    "passed what ran in run {run} of FabricTest {key}, but {} could not run (see the run's findings: the suite or the agent's settings): the validation gate {gate} stays until a run measures every phase",
                    r.unmeasured.join(", "),
                ),
            ));
        }
        LifeStep::OpenGate {
            node: node.to_string(),
            opened: NodeNote::normal(
                node,
                "ValidationPassed",
                format!(
                    "passed run {run} of FabricTest {key}: the validation gate {gate} is removed"
                ),
            ),
            held: NodeNote::normal(
                node,
                "ValidationHeld",
                format!(
                    "passed run {run} of FabricTest {key}, but a gpufabric quarantine holds it: the validation gate {gate} stays until it is released"
                ),
            ),
        }
    }
}

/// Rule 5: the targets of a targeted run that it did not measure, each with why (its
/// result's reason, else why the run skipped it, else the run's message).
fn targets_missed(
    run: &FabricTestRun,
    verdicts: &BTreeMap<&str, &NodeRunResult>,
) -> Option<LifeStep> {
    if run.spec.trigger != Trigger::Targeted {
        return None;
    }
    let missed: Vec<String> = run
        .spec
        .reasons
        .keys()
        .filter(|n| {
            verdicts
                .get(n.as_str())
                .is_none_or(|r| !measured(r.verdict))
        })
        .map(|n| {
            let skipped = run.status.as_ref().and_then(|s| {
                s.skipped
                    .iter()
                    .find(|k| &k.node == n)
                    .map(|k| format!("{} {}", k.node, k.message))
                    .or_else(|| s.message.clone())
            });
            let why = verdicts
                .get(n.as_str())
                .and_then(|r| r.reason.clone())
                .or(skipped)
                .unwrap_or_else(|| "the run ended before it".into());
            format!("{n} ({why})")
        })
        .collect();
    (!missed.is_empty()).then(|| LifeStep::TestNote {
        reason: "TargetNotMeasured",
        message: format!(
            "run {} did not measure {}; each is tried again after a backoff, and nothing about it changes until a run measures it",
            run.name_any(),
            missed.join(", ")
        ),
    })
}

#[cfg(test)]
mod tests;
