//! The quarantine planner: from each node's health and ownership facts and the policy, which
//! nodes to quarantine, release or retest now, and which are held back and why. Pure: the
//! executor applies the plan to Nodes.
//!
//! Rules, in the order they apply:
//! 1. **Budget**: `policy.budget(selected_nodes)` nodes at most are quarantined by this test
//!    at once. Nodes already quarantined by us count against it. A malformed budget counts
//!    as 0 (nothing new is quarantined) and is reported in [`Plan::budget_error`].
//! 2. **Gone nodes**: a node that no longer exists and was ours is released, so that its
//!    record goes (in every mode: nothing on a node is changed). A gone node that is not
//!    ours is never quarantined ([`Hold::NodeGone`]).
//! 3. **Ownership**: a node cordoned or tainted by others (see [`NodeFacts`]) is never
//!    quarantined by us and never released by us ([`Hold::CordonedByOthers`]).
//! 4. **Release**: a node quarantined by us with `consecutive_passes >= passes_to_release`
//!    is released. Releases come before new quarantines so a freed slot is reused in the
//!    same plan.
//! 5. **Candidates**: a node not quarantined by us, tested in this run, with
//!    `consecutive_failures >= failures_to_quarantine`. Candidates not tested in this run
//!    (a confirmation run tests only its suspects) are held back ([`Hold::NotTested`]).
//! 6. **Observe mode**: nothing is quarantined or released; candidates are held back
//!    ([`Hold::ObserveMode`], "would quarantine"), and no confirmation run is asked for.
//! 7. **Confirmation**: with `confirm_retest`, candidates of a run that is not itself a
//!    confirmation run go to [`Plan::confirm`] and are held back
//!    ([`Hold::AwaitingConfirmation`]); on a confirmation run, the candidates (they failed
//!    again) are quarantined.
//! 8. **Over budget**: candidates beyond the free slots are held back ([`Hold::OverBudget`]).
//!    The worst go first: most consecutive failures, then by name.

use gpufabric_api::policy::{QuarantineMode, QuarantinePolicy};
use gpufabric_api::run::Trigger;
use gpufabric_api::test::NodeHealth;

/// What the planner knows about one node.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeFacts {
    pub node: String,
    /// Health after [`crate::history::advance`] for this run.
    pub health: NodeHealth,
    /// The ownership annotation of this test is on the node: we quarantined it.
    pub quarantined_by_us: bool,
    /// The node is unschedulable, and our ownership annotation does not record that we
    /// cordoned it (someone else did: a person, another controller, another FabricTest).
    pub cordoned_by_others: bool,
    /// The node carries a NoSchedule/NoExecute taint that our ownership annotation does not
    /// record: our quarantine taint key put there by someone else (another FabricTest, a
    /// person), or any taint that marks the node as under maintenance by someone else.
    pub tainted_by_others: bool,
    /// The Node object still exists.
    pub exists: bool,
    /// The node was tested in the run this plan is for.
    pub tested: bool,
}

/// Why a node that would be acted on is not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Hold {
    /// The mode is Observe: the node would be quarantined (or released).
    ObserveMode,
    /// The budget is spent.
    OverBudget,
    /// Someone else cordoned or tainted the node; we neither quarantine nor release it.
    CordonedByOthers,
    /// A confirmation run retests the node first.
    AwaitingConfirmation,
    /// The Node object is gone.
    NodeGone,
    /// The node was not tested in this run; it is judged when it is.
    NotTested,
}

impl Hold {
    /// A short sentence for `NodeHealth.held_back`.
    pub fn describe(self) -> &'static str {
        match self {
            Hold::ObserveMode => "would quarantine: the quarantine mode is Observe",
            Hold::OverBudget => "would quarantine: the quarantine budget (maxQuarantined) is spent",
            Hold::CordonedByOthers => "left alone: the node is cordoned or tainted by someone else",
            Hold::AwaitingConfirmation => "waiting for a confirmation run to retest the node",
            Hold::NodeGone => "the node no longer exists",
            Hold::NotTested => "failing, but not tested in this run",
        }
    }
}

impl std::fmt::Display for Hold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.describe())
    }
}

/// What to do now. Every node appears at most once over `quarantine`, `release` and
/// `held_back`; `confirm` nodes are also in `held_back` as AwaitingConfirmation.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Plan {
    /// Nodes to quarantine now, worst first.
    pub quarantine: Vec<String>,
    /// Nodes to release now (by name).
    pub release: Vec<String>,
    /// Nodes to retest in a confirmation run (worst first).
    pub confirm: Vec<String>,
    /// Nodes held back, by name, with the reason.
    pub held_back: Vec<(String, Hold)>,
    /// The budget in nodes.
    pub budget: usize,
    /// Nodes quarantined by us once the plan is applied.
    pub quarantined_after: usize,
    /// Why the budget could not be read, when it could not (the budget is then 0).
    pub budget_error: Option<String>,
}

impl Plan {
    /// Why a node is held back, if it is.
    pub fn hold_of(&self, node: &str) -> Option<Hold> {
        self.held_back
            .iter()
            .find(|(n, _)| n == node)
            .map(|(_, h)| *h)
    }
}

/// Plans quarantine and release for one finished run. See the module docs for the rules.
pub fn plan(
    nodes: &[NodeFacts],
    policy: &QuarantinePolicy,
    selected_nodes: usize,
    trigger: Trigger,
) -> Plan {
    let (budget, budget_error) = match policy.budget(selected_nodes) {
        Ok(b) => (b, None),
        Err(e) => (0, Some(e)),
    };
    let observe = policy.mode == QuarantineMode::Observe;
    let confirming = policy.confirm_retest && trigger != Trigger::Confirmation;
    let failures_needed = policy.failures_to_quarantine.max(1);
    let passes_needed = policy.passes_to_release.max(1);

    let mut sorted: Vec<&NodeFacts> = nodes.iter().collect();
    sorted.sort_by(|a, b| a.node.cmp(&b.node));
    sorted.dedup_by(|a, b| a.node == b.node);

    let mut plan = Plan {
        budget,
        budget_error,
        ..Plan::default()
    };
    let mut ours = 0usize;
    let mut candidates: Vec<&NodeFacts> = Vec::new();
    for f in &sorted {
        let foreign = f.cordoned_by_others || f.tainted_by_others;
        let failing = f.health.consecutive_failures >= failures_needed;
        if f.quarantined_by_us {
            if !f.exists {
                plan.release.push(f.node.clone());
                continue;
            }
            ours += 1;
            if f.health.consecutive_passes >= passes_needed {
                if foreign {
                    plan.held_back
                        .push((f.node.clone(), Hold::CordonedByOthers));
                } else if observe {
                    plan.held_back.push((f.node.clone(), Hold::ObserveMode));
                } else {
                    plan.release.push(f.node.clone());
                    ours -= 1;
                }
            }
            continue;
        }
        if !failing {
            continue;
        }
        let hold = if !f.exists {
            Some(Hold::NodeGone)
        } else if foreign {
            Some(Hold::CordonedByOthers)
        } else if !f.tested {
            Some(Hold::NotTested)
        } else if observe {
            Some(Hold::ObserveMode)
        } else {
            None
        };
        match hold {
            Some(h) => plan.held_back.push((f.node.clone(), h)),
            None => candidates.push(f),
        }
    }

    candidates.sort_by(|a, b| {
        b.health
            .consecutive_failures
            .cmp(&a.health.consecutive_failures)
            .then_with(|| a.node.cmp(&b.node))
    });
    let mut free = budget.saturating_sub(ours);
    for f in candidates {
        if confirming {
            plan.confirm.push(f.node.clone());
            plan.held_back
                .push((f.node.clone(), Hold::AwaitingConfirmation));
        } else if free > 0 {
            plan.quarantine.push(f.node.clone());
            free -= 1;
            ours += 1;
        } else {
            plan.held_back.push((f.node.clone(), Hold::OverBudget));
        }
    }
    plan.held_back.sort();
    plan.quarantined_after = ours;
    plan
}
