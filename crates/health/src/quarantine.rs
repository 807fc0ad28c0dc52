//! The quarantine planner: from each node's health and ownership facts and the policy, which
//! nodes to quarantine, release or retest now, and which are held back and why. Pure: the
//! executor applies the plan to Nodes.
//!
//! Rules, in the order they apply:
//! 1. **Storm**: on a run that is not a confirmation run, when more than
//!    `policy.storm_threshold_percent` of the nodes it measured are bad (failed, errored,
//!    timed out) and it measured at least `policy.storm_min_nodes`, the environment is
//!    suspect, not the nodes ([`Plan::storm`]): the breaker opens. A confirmation run
//!    retests only suspects, so a high share there says nothing about the environment.
//!    **A small run** (fewer than `storm_min_nodes` measured) is judged together with every
//!    node the test judged within [`STORM_WINDOW_HOURS`] before it, each by its latest
//!    verdict ([`NodeHealth::last_judged`]): a failure split into many small runs (gates,
//!    repairs, targeted runs, a test of three nodes run again and again) opens the breaker as
//!    one large run would, as soon as the runs of that window judged `storm_min_nodes` nodes.
//!    Runs of at least `storm_min_nodes` are each judged alone, so every run is held to the
//!    rule one way or the other; a test that judges fewer nodes than that within the window
//!    is bounded by its budget (rule 3) and the cluster cap (rule 11).
//! 2. **Breaker**: while the breaker is open ([`Guards::breaker_open`], or opened by rule 1)
//!    nothing is quarantined, released or sent to confirmation ([`Hold::BreakerOpen`],
//!    [`Hold::BreakerOpenRelease`]); [`Plan::enforcement`] is None. Only the records of gone
//!    nodes go (rule 4: nothing on a node changes).
//! 3. **Budget**, counted in nodes and in GPUs: `policy.budget(selected.nodes)` nodes at
//!    most are quarantined by this test at once, and `policy.gpu_budget(selected.gpus)` GPUs
//!    at most are held out of service by its DRA device taints ([`GpuHold`]). A node held as
//!    a node takes one node and no GPU; a node held by tainted GPUs alone takes those GPUs
//!    and no node. What we hold already counts against each. A malformed budget counts as 0
//!    (nothing new is held of it) and is reported in [`Plan::budget_error`].
//! 4. **Gone nodes**: a node that no longer exists and was ours is released, so that its
//!    record goes (in every mode: nothing on a node is changed). A gone node that is not
//!    ours is never quarantined ([`Hold::NodeGone`]).
//! 5. **Ownership**: a node cordoned or tainted by others (see [`NodeFacts`]) is never
//!    quarantined by us and never released by us ([`Hold::CordonedByOthers`]).
//! 6. **Release**: a node quarantined by us with `consecutive_passes >= passes_to_release`
//!    is released; a [`NodeFacts::repaired`] node with one pass is released at once.
//!    Releases come before new quarantines so a freed slot is reused in the same plan. A
//!    repeat offender (its health's `repeat_offender`) is not released by passes at all,
//!    only after a repair ([`Hold::RepeatOffender`]).
//! 7. **Candidates**: a node not quarantined by us, tested in this run, with
//!    `consecutive_failures >= failures_to_quarantine`. Candidates not tested in this run
//!    (a confirmation run tests only its suspects) are held back ([`Hold::NotTested`]).
//! 8. **Observe mode**: nothing is quarantined or released; candidates are held back
//!    ([`Hold::ObserveMode`], "would quarantine"), releases too
//!    ([`Hold::ObserveModeRelease`]), and no confirmation run is asked for.
//!    [`Plan::enforcement`] is then None: the executor has nothing to change on a node.
//! 9. **Confirmation**: with `confirm_retest`, candidates of a run that is not itself a
//!    confirmation run go to [`Plan::confirm`] and are held back
//!    ([`Hold::AwaitingConfirmation`]); on a confirmation run, the candidates (they failed
//!    again) are quarantined. A candidate whose failure the run itself confirmed
//!    ([`NodeFacts::confirmed`]) needs no confirmation run and is planned as on one.
//! 10. **Over budget**: candidates beyond the free slots are held back: a node that would be
//!     quarantined as a node beyond the node budget ([`Hold::OverBudget`]), one whose GPUs
//!     would be tainted instead ([`GpuHold::instead`]) beyond the GPU budget
//!     ([`Hold::OverGpuBudget`]; all of its GPUs or none). The worst go first: most
//!     consecutive failures, then by name.
//! 11. **Cluster cap**: gpufabric holds at most [`Guards::cluster_cap`] nodes in the whole
//!     cluster, over every FabricTest (the nodes other tests hold are
//!     [`Guards::held_by_others`]). Candidates within this test's budget but beyond the cap
//!     are held back ([`Hold::ClusterCap`]). The cap counts nodes held as nodes; a GPU
//!     taint takes none of it.

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
    /// The node was measured in the run this plan is for (its verdict is this run's).
    pub tested: bool,
    /// This run's failure of the node was already confirmed within the run (the node-pair
    /// phase retested it against a known-good partner): no confirmation run is needed.
    pub confirmed: bool,
    /// A person marked the node repaired (or undid the quarantine, which is read the same
    /// way) and this run is its first test since: one pass releases it, whatever
    /// `passes_to_release` and the repeat-offender rule say (rule 6).
    pub repaired: bool,
    /// What the node holds, or would hold, of the GPU budget (rule 3).
    pub gpus: GpuHold,
}

/// A node's GPUs in the budget (rule 3), from [`crate::gpu_quarantine`]: the default is a
/// node handled per node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuHold {
    /// GPUs of the node this test holds tainted now: each takes one GPU of the GPU budget.
    pub tainted: u32,
    /// The node is held by its tainted GPUs alone (no quarantine record as a node, though
    /// [`NodeFacts::quarantined_by_us`] is set): it takes no node of the node budget.
    pub only: bool,
    /// Quarantining the node now would taint this many of its GPUs instead of the node
    /// ([`crate::gpu_quarantine::GpuNode::taints_instead`]): as a candidate it takes that
    /// many GPUs of the GPU budget and no node.
    pub instead: Option<u32>,
}

/// What a test selects: the bases of a percent budget, in nodes and in their GPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Selected {
    pub nodes: usize,
    pub gpus: usize,
}

/// The budgets' units one node takes: nodes and GPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Units {
    nodes: usize,
    gpus: usize,
}

impl Units {
    /// What a node we hold takes now.
    fn held(f: &NodeFacts) -> Units {
        Units {
            nodes: usize::from(!f.gpus.only),
            gpus: f.gpus.tainted as usize,
        }
    }

    /// What a candidate would take once quarantined.
    fn candidate(f: &NodeFacts) -> Units {
        match f.gpus.instead {
            Some(g) => Units {
                nodes: 0,
                gpus: g as usize,
            },
            None => Units { nodes: 1, gpus: 0 },
        }
    }
}

/// What the plan must respect beyond this test's own policy: its breaker, and the
/// cluster-wide cap over every FabricTest. The default is a closed breaker and no cap.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Guards {
    /// The test's breaker is open (its `BreakerOpen` condition is True).
    pub breaker_open: bool,
    /// Most nodes gpufabric may hold in quarantine in the whole cluster, resolved to a
    /// count ([`ClusterCap::nodes`]); None: no cap.
    pub cluster_cap: Option<usize>,
    /// Nodes held in quarantine now by other FabricTests (or with a record nobody can
    /// read): they count against the cap.
    pub held_by_others: usize,
}

/// The operator setting `--max-quarantined-nodes`: a count, or a percent of the cluster's
/// GPU nodes (rounded down, but at least 1 unless 0%).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClusterCap {
    Nodes(usize),
    Percent(u32),
}

impl ClusterCap {
    /// The cap when none is set: a tenth of the cluster's GPU nodes (at least 1). On unless
    /// turned off by name ([`ClusterCap::setting`] of `none`), so that an operator started
    /// without the flag, or a stolen token driving its FabricTests, cannot quarantine more.
    pub const DEFAULT: ClusterCap = ClusterCap::Percent(10);

    /// A `--max-quarantined-nodes` value: a cap (a count or a percent), or `none` for no
    /// cluster-wide cap (each test's own budget still applies).
    pub fn setting(s: &str) -> Result<Option<ClusterCap>, String> {
        if s.trim().eq_ignore_ascii_case("none") {
            return Ok(None);
        }
        s.parse()
            .map(Some)
            .map_err(|e| format!("{e}, or none for no cluster-wide cap"))
    }

    /// The cap in nodes, for a cluster of `gpu_nodes` GPU nodes.
    pub fn nodes(self, gpu_nodes: usize) -> usize {
        match self {
            ClusterCap::Nodes(n) => n,
            ClusterCap::Percent(0) => 0,
            ClusterCap::Percent(p) => (gpu_nodes.saturating_mul(p as usize) / 100).max(1),
        }
    }
}

impl std::str::FromStr for ClusterCap {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let bad =
            || format!("{s:?} is not a node count (e.g. 5) or a percent from 0% to 100% (e.g. 2%)");
        match t.strip_suffix('%') {
            Some(p) => p
                .trim()
                .parse::<u32>()
                .ok()
                .filter(|p| *p <= 100)
                .map(ClusterCap::Percent)
                .ok_or_else(bad),
            None => t.parse::<usize>().map(ClusterCap::Nodes).map_err(|_| bad()),
        }
    }
}

impl std::fmt::Display for ClusterCap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClusterCap::Nodes(n) => write!(f, "{n}"),
            ClusterCap::Percent(p) => write!(f, "{p}%"),
        }
    }
}

/// How far back a small run reaches for the nodes it is judged with (rule 1): a day, long
/// enough to hold a rollout's worth of gates and targeted runs together.
pub const STORM_WINDOW_HOURS: u32 = 24;

/// A run in which too many measured nodes failed at once (rule 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Storm {
    /// Counted nodes that are bad.
    pub failed: usize,
    /// Nodes counted: the run's measured nodes, or for a small run those the test judged
    /// within the window.
    pub measured: usize,
    /// The policy's threshold, in percent.
    pub threshold_percent: u32,
    /// Set when a small run was judged with the test's other nodes of the last this many
    /// hours ([`STORM_WINDOW_HOURS`]).
    pub window_hours: Option<u32>,
}

impl Storm {
    /// E.g. `4 of 4 measured nodes failed (more than 50%)`, or `5 of 6 nodes judged within
    /// 24 hours failed (more than 50%)`.
    pub fn describe(&self) -> String {
        let counted = match self.window_hours {
            None => "measured nodes".to_string(),
            Some(h) => format!("nodes judged within {h} hours"),
        };
        format!(
            "{} of {} {counted} failed (more than {}%)",
            self.failed, self.measured, self.threshold_percent
        )
    }
}

/// The storm of this run, if it is one (rule 1). `nodes` without repeats: the run's and
/// every other node the test has a record of.
pub fn storm(nodes: &[&NodeFacts], policy: &QuarantinePolicy, trigger: Trigger) -> Option<Storm> {
    if trigger == Trigger::Confirmation || policy.storm_threshold_percent >= 100 {
        return None;
    }
    let min = policy.storm_min_nodes.max(1) as usize;
    let run: Vec<&NodeFacts> = nodes.iter().copied().filter(|f| f.tested).collect();
    let (counted, window_hours) = if run.len() >= min {
        (run, None)
    } else {
        (judged_recently(nodes), Some(STORM_WINDOW_HOURS))
    };
    let measured = counted.len();
    let failed = counted.iter().filter(|f| f.health.verdict.is_bad()).count();
    let threshold = policy.storm_threshold_percent as usize;
    (measured >= min && failed * 100 > threshold * measured).then_some(Storm {
        failed,
        measured,
        threshold_percent: policy.storm_threshold_percent,
        window_hours,
    })
}

/// The run's measured nodes and every other node the test judged within
/// [`STORM_WINDOW_HOURS`] before the run's latest judgement.
fn judged_recently<'a>(nodes: &[&'a NodeFacts]) -> Vec<&'a NodeFacts> {
    let seconds = |f: &NodeFacts| f.health.last_judged.as_ref().map(|t| t.0.as_second());
    let newest = nodes
        .iter()
        .filter(|f| f.tested)
        .filter_map(|f| seconds(f))
        .max();
    let since = newest.map(|n| n - i64::from(STORM_WINDOW_HOURS) * 3600);
    nodes
        .iter()
        .copied()
        .filter(|f| {
            f.tested
                || (f.health.verdict.is_measured()
                    && since.is_some_and(|s| seconds(f).is_some_and(|t| t >= s)))
        })
        .collect()
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
    /// The GPU budget is spent: the node's GPUs would be tainted.
    OverGpuBudget,
    /// Someone else cordoned or tainted the node; we neither quarantine nor release it.
    CordonedByOthers,
    /// A confirmation run retests the node first.
    AwaitingConfirmation,
    /// The Node object is gone.
    NodeGone,
    /// The node was not tested in this run; it is judged when it is.
    NotTested,
    /// The test's breaker is open: the node would be quarantined.
    BreakerOpen,
    /// The test's breaker is open: the node, quarantined by us earlier, would be released.
    BreakerOpenRelease,
    /// The cluster-wide cap on nodes gpufabric holds is reached.
    ClusterCap,
    /// Quarantined too often within the window: passes do not release the node, a repair
    /// does.
    RepeatOffender,
}

impl Hold {
    /// A short sentence for `NodeHealth.held_back`.
    pub fn describe(self) -> &'static str {
        match self {
            Hold::ObserveMode => "would quarantine: the quarantine mode is Observe",
            Hold::ObserveModeRelease => "would release: the quarantine mode is Observe",
            Hold::OverBudget => "would quarantine: the quarantine budget (maxQuarantined) is spent",
            Hold::OverGpuBudget => {
                "would taint GPUs: the GPU quarantine budget (maxQuarantinedGpus) is spent"
            }
            Hold::CordonedByOthers => "left alone: the node is cordoned or tainted by someone else",
            Hold::AwaitingConfirmation => "waiting for a confirmation run to retest the node",
            Hold::NodeGone => "the node no longer exists",
            Hold::NotTested => "failing, but not tested in this run",
            Hold::BreakerOpen => {
                "would quarantine: the breaker is open (too many nodes failed at once)"
            }
            Hold::BreakerOpenRelease => {
                "would release: the breaker is open (too many nodes failed at once)"
            }
            Hold::ClusterCap => {
                "would quarantine: the cluster-wide cap (--max-quarantined-nodes) is reached"
            }
            Hold::RepeatOffender => {
                "kept: a repeat offender (quarantined too often) is released only after a repair (annotation gpufabric.io/repaired)"
            }
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
    /// What a quarantine changes on a node (from the mode); None in Observe mode or with
    /// the breaker open, where `quarantine` is empty.
    pub enforcement: Option<Enforcement>,
    /// Nodes to release now (by name).
    pub release: Vec<String>,
    /// Nodes to retest in a confirmation run (worst first).
    pub confirm: Vec<String>,
    /// Nodes held back, by name, with the reason.
    pub held_back: Vec<(String, Hold)>,
    /// The budget in nodes.
    pub budget: usize,
    /// Nodes quarantined by us as nodes once the plan is applied.
    pub quarantined_after: usize,
    /// The budget in GPUs held by device taints.
    pub gpu_budget: usize,
    /// GPUs held by our device taints once the plan is applied.
    pub gpus_held_after: usize,
    /// Why a budget could not be read, when one could not (that budget is then 0).
    pub budget_error: Option<String>,
    /// This run is a storm (rule 1): the breaker opens, if it is not open yet.
    pub storm: Option<Storm>,
    /// The plan was made with the breaker open (it was open, or this run opened it).
    pub breaker_open: bool,
    /// The cluster-wide cap in nodes, when there is one.
    pub cluster_cap: Option<usize>,
    /// Nodes gpufabric holds in the whole cluster once the plan is applied.
    pub held_in_cluster_after: usize,
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

/// Plans quarantine and release for one finished run with a closed breaker and no cluster
/// cap, for a test of `selected_nodes` nodes whose GPUs are not counted (a percent GPU
/// budget is then its floor of one GPU): [`plan_guarded`] with [`Guards::default`].
pub fn plan(
    nodes: &[NodeFacts],
    policy: &QuarantinePolicy,
    selected_nodes: usize,
    trigger: Trigger,
) -> Plan {
    let selected = Selected {
        nodes: selected_nodes,
        gpus: 0,
    };
    plan_guarded(nodes, policy, selected, trigger, &Guards::default())
}

/// Plans quarantine and release for one finished run. See the module docs for the rules.
///
/// `nodes`: every node the test has a record of (its history, the nodes it holds in
/// quarantine, the nodes of this run). `selected`: how many nodes the FabricTest selects
/// and their GPUs, the bases of a percent budget; for a confirmation run, that is still the
/// test's selection, not the few suspects the run retests. `guards`: the breaker and the
/// cluster-wide cap.
pub fn plan_guarded(
    nodes: &[NodeFacts],
    policy: &QuarantinePolicy,
    selected: Selected,
    trigger: Trigger,
    guards: &Guards,
) -> Plan {
    let mut errors = Vec::new();
    let mut read = |b: Result<usize, gpufabric_api::policy::BudgetError>| {
        b.unwrap_or_else(|e| {
            errors.push(e.to_string());
            0
        })
    };
    let budget = read(policy.budget(selected.nodes));
    let gpu_budget = read(policy.gpu_budget(selected.gpus));
    let budget_error = (!errors.is_empty()).then(|| errors.join("; "));
    let mut sorted: Vec<&NodeFacts> = nodes.iter().collect();
    sorted.sort_by(|a, b| a.node.cmp(&b.node));
    sorted.dedup_by(|a, b| a.node == b.node);

    let storm = storm(&sorted, policy, trigger);
    let breaker_open = guards.breaker_open || storm.is_some();
    let observe = policy.mode == QuarantineMode::Observe;
    let mut plan = Plan {
        budget,
        gpu_budget,
        budget_error,
        enforcement: Enforcement::of(policy.mode).filter(|_| !breaker_open),
        storm,
        breaker_open,
        cluster_cap: guards.cluster_cap,
        ..Plan::default()
    };
    let still = Stillness {
        breaker_open,
        observe,
    };
    let (mut ours, mut candidates) = sort_out(&sorted, policy, still, &mut plan);

    candidates.sort_by(|a, b| {
        b.health
            .consecutive_failures
            .cmp(&a.health.consecutive_failures)
            .then_with(|| a.node.cmp(&b.node))
    });
    let confirming = policy.confirm_retest && trigger != Trigger::Confirmation;
    let mut free = budget.saturating_sub(ours.nodes);
    let mut free_gpus = gpu_budget.saturating_sub(ours.gpus);
    let mut free_in_cluster = guards.cluster_cap.map_or(usize::MAX, |cap| {
        cap.saturating_sub(guards.held_by_others + ours.nodes)
    });
    for f in candidates {
        let takes = Units::candidate(f);
        let hold = if confirming && !f.confirmed {
            plan.confirm.push(f.node.clone());
            Some(Hold::AwaitingConfirmation)
        } else if takes.gpus > free_gpus {
            Some(Hold::OverGpuBudget)
        } else if takes.nodes > free {
            Some(Hold::OverBudget)
        } else if takes.nodes > free_in_cluster {
            Some(Hold::ClusterCap)
        } else {
            None
        };
        match hold {
            Some(h) => plan.held_back.push((f.node.clone(), h)),
            None => {
                plan.quarantine.push(f.node.clone());
                free -= takes.nodes;
                free_gpus -= takes.gpus;
                free_in_cluster = free_in_cluster.saturating_sub(takes.nodes);
                ours.nodes += takes.nodes;
                ours.gpus += takes.gpus;
            }
        }
    }
    plan.held_back.sort();
    plan.quarantined_after = ours.nodes;
    plan.gpus_held_after = ours.gpus;
    plan.held_in_cluster_after = guards.held_by_others + ours.nodes;
    plan
}

/// Why nothing may change on a node in this plan, whatever it deserves.
#[derive(Clone, Copy)]
struct Stillness {
    breaker_open: bool,
    observe: bool,
}

/// Rules 2 and 4 to 8: releases and holds go into `plan`; returns what we hold after the
/// releases, and the candidates for quarantine.
fn sort_out<'a>(
    sorted: &[&'a NodeFacts],
    policy: &QuarantinePolicy,
    still: Stillness,
    plan: &mut Plan,
) -> (Units, Vec<&'a NodeFacts>) {
    let failures_needed = policy.failures_to_quarantine.max(1);
    let passes_needed = policy.passes_to_release.max(1);
    let mut ours = Units::default();
    let mut candidates: Vec<&NodeFacts> = Vec::new();
    for f in sorted {
        let foreign = f.cordoned_by_others || f.tainted_by_others;
        let failing = f.health.consecutive_failures >= failures_needed;
        if f.quarantined_by_us {
            if !f.exists {
                plan.release.push(f.node.clone());
                continue;
            }
            let held = Units::held(f);
            ours.nodes += held.nodes;
            ours.gpus += held.gpus;
            let passed = f.health.consecutive_passes >= passes_needed
                || (f.repaired && f.tested && f.health.consecutive_passes >= 1);
            if passed {
                let hold = if foreign {
                    Some(Hold::CordonedByOthers)
                } else if still.breaker_open {
                    Some(Hold::BreakerOpenRelease)
                } else if still.observe {
                    Some(Hold::ObserveModeRelease)
                } else if f.health.standing.is_repeat_offender() && !f.repaired {
                    Some(Hold::RepeatOffender)
                } else {
                    None
                };
                match hold {
                    Some(h) => plan.held_back.push((f.node.clone(), h)),
                    None => {
                        plan.release.push(f.node.clone());
                        ours.nodes -= held.nodes;
                        ours.gpus -= held.gpus;
                    }
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
        } else if still.breaker_open {
            Some(Hold::BreakerOpen)
        } else if still.observe {
            Some(Hold::ObserveMode)
        } else {
            None
        };
        match hold {
            Some(h) => plan.held_back.push((f.node.clone(), h)),
            None => candidates.push(f),
        }
    }
    (ours, candidates)
}

#[cfg(test)]
mod tests;
