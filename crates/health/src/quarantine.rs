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
//!    ([`Hold::ObserveMode`], "would quarantine"), releases too
//!    ([`Hold::ObserveModeRelease`]), and no confirmation run is asked for.
//!    [`Plan::enforcement`] is then None: the executor has nothing to change on a node.
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

/// What quarantining a node changes on it: the modes that act on nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Enforcement {
    /// The label `gpufabric.io/quarantined` only.
    Label,
    /// The label and a cordon.
    Cordon,
    /// The label and the operator's NoSchedule taint.
    Taint,
}

impl Enforcement {
    /// What `mode` changes on a node; None for Observe, which changes nothing.
    pub fn of(mode: QuarantineMode) -> Option<Enforcement> {
        match mode {
            QuarantineMode::Observe => None,
            QuarantineMode::Label => Some(Enforcement::Label),
            QuarantineMode::Cordon => Some(Enforcement::Cordon),
            QuarantineMode::Taint => Some(Enforcement::Taint),
        }
    }

    /// The mode this is (what a node's quarantine record names).
    pub fn mode(self) -> QuarantineMode {
        match self {
            Enforcement::Label => QuarantineMode::Label,
            Enforcement::Cordon => QuarantineMode::Cordon,
            Enforcement::Taint => QuarantineMode::Taint,
        }
    }
}

/// Why a node that would be acted on is not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Hold {
    /// The mode is Observe: the node would be quarantined.
    ObserveMode,
    /// The mode is Observe: the node, quarantined by us earlier, would be released.
    ObserveModeRelease,
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
            Hold::ObserveModeRelease => "would release: the quarantine mode is Observe",
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
    /// What a quarantine changes on a node (from the mode); None in Observe mode, where
    /// `quarantine` is empty.
    pub enforcement: Option<Enforcement>,
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
///
/// `nodes`: every node the test has a record of (its history, the nodes it holds in
/// quarantine, the nodes of this run). `selected_nodes`: how many nodes the FabricTest
/// selects, the base of a percent budget; for a confirmation run, that is still the test's
/// selection, not the few suspects the run retests.
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
        enforcement: Enforcement::of(policy.mode),
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
                    plan.held_back
                        .push((f.node.clone(), Hold::ObserveModeRelease));
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

#[cfg(test)]
mod tests {
    use super::*;
    use gpufabric_api::run::NodeVerdict;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

    fn policy(mode: QuarantineMode, max: i32, failures: u32, confirm: bool) -> QuarantinePolicy {
        QuarantinePolicy {
            mode,
            max_quarantined: IntOrString::Int(max),
            failures_to_quarantine: failures,
            passes_to_release: 2,
            confirm_retest: confirm,
            release_on_delete: true,
        }
    }

    fn cordon(max: i32) -> QuarantinePolicy {
        policy(QuarantineMode::Cordon, max, 1, false)
    }

    fn facts(node: &str, failures: u32, passes: u32) -> NodeFacts {
        NodeFacts {
            node: node.into(),
            health: NodeHealth {
                node: node.into(),
                verdict: if failures > 0 {
                    NodeVerdict::Failed
                } else {
                    NodeVerdict::Passed
                },
                consecutive_failures: failures,
                consecutive_passes: passes,
                quarantined: false,
                quarantined_since: None,
                held_back: None,
                last_finding: None,
                last_run: Some("r".into()),
            },
            quarantined_by_us: false,
            cordoned_by_others: false,
            tainted_by_others: false,
            exists: true,
            tested: true,
        }
    }

    fn ours(node: &str, failures: u32, passes: u32) -> NodeFacts {
        NodeFacts {
            quarantined_by_us: true,
            ..facts(node, failures, passes)
        }
    }

    #[test]
    fn quarantines_failing_nodes_within_budget() {
        let p = plan(
            &[facts("a", 1, 0), facts("b", 0, 3)],
            &cordon(2),
            10,
            Trigger::Schedule,
        );
        assert_eq!(p.quarantine, vec!["a"]);
        assert!(p.release.is_empty() && p.held_back.is_empty() && p.confirm.is_empty());
        assert_eq!((p.budget, p.quarantined_after), (2, 1));
        assert_eq!(p.enforcement, Some(Enforcement::Cordon));
    }

    #[test]
    fn every_mode_but_observe_says_what_a_quarantine_changes() {
        for mode in [
            QuarantineMode::Label,
            QuarantineMode::Cordon,
            QuarantineMode::Taint,
        ] {
            let how = Enforcement::of(mode).expect("acts");
            assert_eq!(how.mode(), mode);
            let p = plan(
                &[facts("a", 1, 0)],
                &policy(mode, 1, 1, false),
                10,
                Trigger::Schedule,
            );
            assert_eq!((p.enforcement, p.quarantine.len()), (Some(how), 1));
        }
        assert_eq!(Enforcement::of(QuarantineMode::Observe), None);
    }

    #[test]
    fn nodes_already_quarantined_by_us_count_against_the_budget() {
        let p = plan(
            &[ours("q1", 3, 0), ours("q2", 2, 0), facts("a", 1, 0)],
            &cordon(2),
            10,
            Trigger::Schedule,
        );
        assert!(p.quarantine.is_empty());
        assert_eq!(p.held_back, vec![("a".to_string(), Hold::OverBudget)]);
        assert_eq!(p.quarantined_after, 2);
    }

    #[test]
    fn over_budget_takes_the_worst_first_then_by_name() {
        let nodes = [
            facts("d", 2, 0),
            facts("c", 5, 0),
            facts("b", 2, 0),
            facts("a", 1, 0),
        ];
        let p = plan(&nodes, &cordon(2), 10, Trigger::Schedule);
        assert_eq!(p.quarantine, vec!["c", "b"]);
        assert_eq!(
            p.held_back,
            vec![
                ("a".to_string(), Hold::OverBudget),
                ("d".to_string(), Hold::OverBudget)
            ]
        );
    }

    #[test]
    fn percent_budget_rounds_down_but_allows_one() {
        let mut pol = cordon(0);
        pol.max_quarantined = IntOrString::String("10%".into());
        let nodes: Vec<NodeFacts> = (0..5).map(|i| facts(&format!("n{i}"), 1, 0)).collect();
        assert_eq!(plan(&nodes, &pol, 5, Trigger::Schedule).quarantine.len(), 1);
        assert_eq!(
            plan(&nodes, &pol, 30, Trigger::Schedule).quarantine.len(),
            3
        );
    }

    #[test]
    fn a_malformed_budget_quarantines_nothing_and_says_why() {
        let mut pol = cordon(0);
        pol.max_quarantined = IntOrString::String("lots".into());
        let p = plan(&[facts("a", 3, 0)], &pol, 10, Trigger::Schedule);
        assert!(p.quarantine.is_empty());
        assert_eq!(p.budget, 0);
        assert!(
            p.budget_error
                .as_deref()
                .is_some_and(|e| e.contains("lots"))
        );
        assert_eq!(p.hold_of("a"), Some(Hold::OverBudget));
    }

    #[test]
    fn failures_below_failures_to_quarantine_are_not_candidates() {
        let pol = policy(QuarantineMode::Taint, 5, 3, false);
        let p = plan(
            &[facts("a", 2, 0), facts("b", 3, 0)],
            &pol,
            10,
            Trigger::Schedule,
        );
        assert_eq!(p.quarantine, vec!["b"]);
        assert_eq!(p.hold_of("a"), None);
    }

    #[test]
    fn observe_mode_holds_candidates_and_releases_nothing() {
        let pol = policy(QuarantineMode::Observe, 5, 1, true);
        let p = plan(
            &[facts("a", 1, 0), ours("q", 0, 9)],
            &pol,
            10,
            Trigger::Schedule,
        );
        assert!(p.quarantine.is_empty() && p.release.is_empty() && p.confirm.is_empty());
        assert_eq!(p.hold_of("a"), Some(Hold::ObserveMode));
        assert_eq!(p.hold_of("q"), Some(Hold::ObserveModeRelease));
        assert!(Hold::ObserveMode.describe().contains("would quarantine"));
        assert!(
            Hold::ObserveModeRelease
                .describe()
                .contains("would release")
        );
        assert_eq!(p.enforcement, None);
    }

    #[test]
    fn confirm_retest_sends_candidates_to_a_confirmation_run_first() {
        let pol = policy(QuarantineMode::Cordon, 5, 1, true);
        let p = plan(
            &[facts("a", 1, 0), facts("b", 4, 0)],
            &pol,
            10,
            Trigger::Schedule,
        );
        assert!(p.quarantine.is_empty());
        assert_eq!(p.confirm, vec!["b", "a"]);
        assert_eq!(p.hold_of("a"), Some(Hold::AwaitingConfirmation));
        // Manual and creation runs confirm too.
        let p = plan(&[facts("a", 1, 0)], &pol, 10, Trigger::Manual);
        assert_eq!(p.confirm, vec!["a"]);
    }

    #[test]
    fn a_confirmation_run_quarantines_the_confirmed_failures() {
        let pol = policy(QuarantineMode::Cordon, 5, 1, true);
        let mut untested = facts("c", 2, 0);
        untested.tested = false;
        let p = plan(
            &[facts("a", 2, 0), facts("b", 0, 1), untested],
            &pol,
            10,
            Trigger::Confirmation,
        );
        assert_eq!(p.quarantine, vec!["a"]);
        assert!(p.confirm.is_empty());
        assert_eq!(p.hold_of("c"), Some(Hold::NotTested));
    }

    #[test]
    fn nodes_cordoned_or_tainted_by_others_are_never_quarantined_or_released() {
        let mut cordoned = facts("c", 3, 0);
        cordoned.cordoned_by_others = true;
        let mut tainted = facts("t", 3, 0);
        tainted.tainted_by_others = true;
        let mut ours_cordoned = ours("o", 0, 5);
        ours_cordoned.cordoned_by_others = true;
        let p = plan(
            &[cordoned, tainted, ours_cordoned],
            &cordon(10),
            10,
            Trigger::Schedule,
        );
        assert!(p.quarantine.is_empty() && p.release.is_empty());
        for n in ["c", "t", "o"] {
            assert_eq!(p.hold_of(n), Some(Hold::CordonedByOthers), "{n}");
        }
    }

    #[test]
    fn released_after_passes_to_release_consecutive_passes() {
        let p = plan(
            &[ours("one", 0, 1), ours("two", 0, 2)],
            &cordon(5),
            10,
            Trigger::Schedule,
        );
        assert_eq!(p.release, vec!["two"]);
        assert_eq!(p.quarantined_after, 1);
    }

    #[test]
    fn a_release_frees_a_slot_for_a_new_quarantine_in_the_same_plan() {
        let p = plan(
            &[ours("old", 0, 2), facts("new", 1, 0)],
            &cordon(1),
            10,
            Trigger::Schedule,
        );
        assert_eq!(p.release, vec!["old"]);
        assert_eq!(p.quarantine, vec!["new"]);
        assert_eq!(p.quarantined_after, 1);
    }

    #[test]
    fn a_gone_node_of_ours_is_released_and_a_gone_candidate_is_held() {
        let mut gone_ours = ours("g1", 5, 0);
        gone_ours.exists = false;
        let mut gone = facts("g2", 5, 0);
        gone.exists = false;
        let p = plan(
            &[gone_ours, gone, facts("a", 1, 0)],
            &cordon(1),
            10,
            Trigger::Schedule,
        );
        assert_eq!(p.release, vec!["g1"]);
        assert_eq!(p.quarantine, vec!["a"]);
        assert_eq!(p.hold_of("g2"), Some(Hold::NodeGone));
        // Even in Observe mode the record of a gone node goes.
        let mut gone_ours = ours("g1", 5, 0);
        gone_ours.exists = false;
        let pol = policy(QuarantineMode::Observe, 1, 1, false);
        assert_eq!(
            plan(&[gone_ours], &pol, 10, Trigger::Schedule).release,
            vec!["g1"]
        );
    }

    #[test]
    fn a_failing_node_already_quarantined_by_us_is_left_as_it_is() {
        let p = plan(&[ours("q", 7, 0)], &cordon(1), 10, Trigger::Schedule);
        assert_eq!(
            p,
            Plan {
                budget: 1,
                quarantined_after: 1,
                enforcement: Some(Enforcement::Cordon),
                ..Plan::default()
            }
        );
    }

    #[test]
    fn a_node_listed_twice_is_planned_once() {
        let p = plan(
            &[facts("a", 1, 0), facts("a", 1, 0)],
            &cordon(5),
            10,
            Trigger::Schedule,
        );
        assert_eq!(p.quarantine, vec!["a"]);
    }
}
