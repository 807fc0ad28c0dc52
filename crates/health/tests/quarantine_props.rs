//! Property tests of the quarantine planner over random sequences of runs: random failing
//! sets, foreign cordons and taints, deleted nodes, policies and budgets, with each plan
//! applied to a model of the cluster before the next run.

use gpufabric_api::policy::{QuarantineMode, QuarantinePolicy};
use gpufabric_api::run::{NodeVerdict, Trigger};
use gpufabric_api::test::NodeHealth;
use gpufabric_health::history::advance;
use gpufabric_health::quarantine::{
    GpuHold, Guards, Hold, NodeFacts, Selected, plan, plan_guarded,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use proptest::prelude::*;
use std::collections::BTreeSet;

/// One run of the sequence.
#[derive(Clone, Debug)]
struct Step {
    /// When the previous plan asked for a confirmation run, run it (else a scheduled run).
    confirm_next: bool,
    failing: u16,
    foreign_cordon: u16,
    foreign_taint: u16,
    gone: u16,
}

fn step() -> impl Strategy<Value = Step> {
    (
        any::<bool>(),
        any::<u16>(),
        (any::<u16>(), any::<u16>(), any::<u16>()),
        (any::<u16>(), any::<u16>(), any::<u16>()),
        (any::<u16>(), any::<u16>(), any::<u16>(), any::<u16>()),
    )
        .prop_map(|(confirm_next, failing, c, t, g)| Step {
            confirm_next,
            failing,
            // About one node in eight cordoned or tainted by someone else, one in sixteen gone.
            foreign_cordon: c.0 & c.1 & c.2,
            foreign_taint: t.0 & t.1 & t.2,
            gone: g.0 & g.1 & g.2 & g.3,
        })
}

fn mode() -> impl Strategy<Value = QuarantineMode> {
    prop_oneof![
        Just(QuarantineMode::Observe),
        Just(QuarantineMode::Label),
        Just(QuarantineMode::Cordon),
        Just(QuarantineMode::Taint),
    ]
}

fn policy() -> impl Strategy<Value = QuarantinePolicy> {
    (
        mode(),
        prop_oneof![
            (0i32..6).prop_map(IntOrString::Int),
            (0u32..=100).prop_map(|p| IntOrString::String(format!("{p}%"))),
        ],
        1u32..4,
        1u32..4,
        any::<bool>(),
        (prop_oneof![Just(100u32), 1u32..100], 1u32..6),
    )
        .prop_map(
            |(mode, max_quarantined, f, p, confirm_retest, (storm_pct, storm_min))| {
                QuarantinePolicy {
                    mode,
                    max_quarantined,
                    failures_to_quarantine: f,
                    passes_to_release: p,
                    confirm_retest,
                    release_on_delete: true,
                    storm_threshold_percent: storm_pct,
                    storm_min_nodes: storm_min,
                    graduated_taints: false,
                    ..QuarantinePolicy::default()
                }
            },
        )
}

/// The cluster as the executor would leave it.
#[derive(Clone, Debug)]
struct Model {
    health: Vec<Option<NodeHealth>>,
    ours: Vec<bool>,
    /// Consecutive bad verdicts, counted independently of `history`.
    bad_streak: Vec<u32>,
    /// Bad streak at the moment each node was last sent to confirmation, if it was.
    confirmed_at: Vec<Option<u32>>,
}

fn name(i: usize) -> String {
    format!("node-{i:02}")
}

fn bit(mask: u16, i: usize) -> bool {
    mask & (1 << i) != 0
}

/// Runs `steps` through the planner. `cap`: the cluster-wide cap, and the nodes other
/// tests hold. `reset_every`: the breaker is reset by a person after that many runs open.
fn simulate(
    n: usize,
    pol: &QuarantinePolicy,
    steps: &[Step],
    cap: Option<(usize, usize)>,
    reset_every: usize,
) -> Result<(), TestCaseError> {
    let budget = pol.budget(n).unwrap_or(0);
    let mut breaker_open = false;
    let mut open_for = 0usize;
    let mut m = Model {
        health: vec![None; n],
        ours: vec![false; n],
        bad_streak: vec![0; n],
        confirmed_at: vec![None; n],
    };
    let mut last_confirm: BTreeSet<usize> = BTreeSet::new();
    for (k, s) in steps.iter().enumerate() {
        let trigger = if s.confirm_next && !last_confirm.is_empty() {
            Trigger::Confirmation
        } else {
            Trigger::Schedule
        };
        let run = format!("run-{k}");
        let mut facts = Vec::new();
        for i in 0..n {
            let exists = !bit(s.gone, i);
            let tested = exists && (trigger != Trigger::Confirmation || last_confirm.contains(&i));
            if tested {
                let verdict = if bit(s.failing, i) {
                    NodeVerdict::Failed
                } else {
                    NodeVerdict::Passed
                };
                m.health[i] = Some(advance(m.health[i].as_ref(), &name(i), verdict, None, &run));
                m.bad_streak[i] = if verdict.is_bad() {
                    m.bad_streak[i] + 1
                } else {
                    0
                };
            }
            let Some(health) = m.health[i].clone() else {
                // Never tested and not ours: the operator has no record of it.
                continue;
            };
            facts.push(NodeFacts {
                node: name(i),
                health,
                quarantined_by_us: m.ours[i],
                cordoned_by_others: exists && bit(s.foreign_cordon, i),
                tainted_by_others: exists && bit(s.foreign_taint, i),
                exists,
                tested,
                confirmed: false,
                repaired: false,
                gpus: Default::default(),
            });
        }
        let guards = Guards {
            breaker_open,
            cluster_cap: cap.map(|(c, _)| c),
            held_by_others: cap.map_or(0, |(_, o)| o),
        };
        let p = plan_guarded(
            &facts,
            pol,
            Selected {
                nodes: n,
                gpus: 8 * n,
            },
            trigger,
            &guards,
        );
        let quarantine: BTreeSet<&String> = p.quarantine.iter().collect();
        // (e) with the breaker open, or a storm opening it, no node changes: only the
        // records of gone nodes go.
        if p.breaker_open {
            prop_assert!(breaker_open || p.storm.is_some());
            prop_assert!(
                p.quarantine.is_empty() && p.confirm.is_empty(),
                "step {k}: {p:?}"
            );
            prop_assert!(p.enforcement.is_none());
            for node in &p.release {
                prop_assert!(
                    facts.iter().any(|f| &f.node == node && !f.exists),
                    "step {k}: released {node} with the breaker open"
                );
            }
        }
        if let Some(storm) = p.storm {
            prop_assert!(trigger != Trigger::Confirmation);
            prop_assert!(storm.measured >= pol.storm_min_nodes as usize);
            prop_assert!(
                storm.failed * 100 > storm.measured * pol.storm_threshold_percent as usize
            );
        }
        // (f) the cluster-wide cap: nothing new beyond it.
        if let Some((c, others)) = cap {
            prop_assert_eq!(p.held_in_cluster_after, others + p.quarantined_after);
            if !p.quarantine.is_empty() {
                prop_assert!(
                    p.held_in_cluster_after <= c,
                    "step {k}: over the cap {c}: {p:?}"
                );
            }
        }
        breaker_open = p.breaker_open;
        if breaker_open {
            open_for += 1;
            if open_for >= reset_every {
                breaker_open = false;
                open_for = 0;
            }
        }
        let release: BTreeSet<&String> = p.release.iter().collect();

        // (c) never both, never twice.
        prop_assert!(quarantine.is_disjoint(&release), "step {k}: {p:?}");
        prop_assert_eq!(quarantine.len(), p.quarantine.len());
        prop_assert_eq!(release.len(), p.release.len());
        for f in &facts {
            let held = p.held_back.iter().filter(|(h, _)| *h == f.node).count();
            let acted =
                usize::from(quarantine.contains(&f.node)) + usize::from(release.contains(&f.node));
            prop_assert!(
                held + acted <= 1,
                "step {k}: {} acted on and held: {p:?}",
                f.node
            );
        }
        for f in &facts {
            let i: usize = f.node[5..]
                .parse()
                .map_err(|_| TestCaseError::fail("node name"))?;
            let foreign = f.cordoned_by_others || f.tainted_by_others;
            // (b) a node cordoned or tainted by others is neither quarantined nor released.
            if foreign {
                prop_assert!(
                    !quarantine.contains(&f.node),
                    "step {k}: quarantined foreign {}",
                    f.node
                );
                prop_assert!(
                    !release.contains(&f.node),
                    "step {k}: released foreign {}",
                    f.node
                );
            }
            if quarantine.contains(&f.node) {
                prop_assert!(!m.ours[i] && f.exists && f.tested);
                prop_assert!(pol.mode != QuarantineMode::Observe);
                // (d) only after failures_to_quarantine consecutive failures ...
                prop_assert!(
                    m.bad_streak[i] >= pol.failures_to_quarantine,
                    "step {k}: {} streak {}",
                    f.node,
                    m.bad_streak[i]
                );
                // ... and, with confirm_retest, only on a confirmation run that the node
                // was sent to, having failed again since.
                if pol.confirm_retest {
                    prop_assert_eq!(trigger, Trigger::Confirmation);
                    prop_assert!(last_confirm.contains(&i));
                    let at =
                        m.confirmed_at[i].ok_or_else(|| TestCaseError::fail("never confirmed"))?;
                    prop_assert!(
                        m.bad_streak[i] > at,
                        "step {k}: {} not failed again",
                        f.node
                    );
                }
            }
            if release.contains(&f.node) {
                prop_assert!(m.ours[i]);
                prop_assert!(
                    !f.exists
                        || (f.health.consecutive_passes >= pol.passes_to_release
                            && pol.mode != QuarantineMode::Observe),
                    "step {k}: released {} early",
                    f.node
                );
            }
        }
        if pol.mode == QuarantineMode::Observe {
            prop_assert!(p.quarantine.is_empty() && p.confirm.is_empty());
        }
        for node in &p.confirm {
            prop_assert_eq!(
                p.held_back.iter().find(|(n, _)| n == node).map(|(_, h)| *h),
                Some(Hold::AwaitingConfirmation)
            );
        }

        // Apply the plan.
        for node in &p.release {
            let i: usize = node[5..]
                .parse()
                .map_err(|_| TestCaseError::fail("node name"))?;
            m.ours[i] = false;
        }
        for node in &p.quarantine {
            let i: usize = node[5..]
                .parse()
                .map_err(|_| TestCaseError::fail("node name"))?;
            m.ours[i] = true;
        }
        last_confirm = BTreeSet::new();
        for node in &p.confirm {
            let i: usize = node[5..]
                .parse()
                .map_err(|_| TestCaseError::fail("node name"))?;
            m.confirmed_at[i] = Some(m.bad_streak[i]);
            last_confirm.insert(i);
        }
        // (a) the budget holds once the plan is applied.
        let held = m.ours.iter().filter(|o| **o).count();
        prop_assert!(
            held <= budget,
            "step {k}: {held} quarantined, budget {budget}"
        );
        prop_assert_eq!(held, p.quarantined_after);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn planner_keeps_budget_ownership_and_hysteresis_over_random_runs(
        n in 1usize..=16,
        pol in policy(),
        steps in prop::collection::vec(step(), 1..40),
    ) {
        simulate(n, &pol, &steps, None, usize::MAX)?;
    }

    /// The same runs with a cluster-wide cap, nodes held by other tests, and a person who
    /// resets the breaker after a few runs: the storm rule, the breaker and the cap hold.
    #[test]
    fn planner_keeps_the_breaker_and_the_cluster_cap_over_random_runs(
        n in 1usize..=16,
        pol in policy(),
        steps in prop::collection::vec(step(), 1..40),
        cap in 0usize..8,
        others in 0usize..6,
        reset_every in 1usize..4,
    ) {
        simulate(n, &pol, &steps, Some((cap, others)), reset_every)?;
    }

    /// When the policy changes between runs (a smaller budget, another mode), the planner
    /// never adds a quarantine while the nodes it holds are at or over the new budget.
    #[test]
    fn planner_never_adds_quarantines_at_or_over_a_changed_budget(
        n in 1usize..=16,
        ours in any::<u16>(),
        failing in any::<u16>(),
        pol in policy(),
    ) {
        let facts: Vec<NodeFacts> = (0..n)
            .map(|i| {
                let v = if bit(failing, i) { NodeVerdict::Failed } else { NodeVerdict::Passed };
                NodeFacts {
                    node: name(i),
                    health: advance(None, &name(i), v, None, "r"),
                    quarantined_by_us: bit(ours, i),
                    cordoned_by_others: false,
                    tainted_by_others: false,
                    exists: true,
                    tested: true,
                    confirmed: false,
                    repaired: false,
                    gpus: Default::default(),
                }
            })
            .collect();
        let budget = pol.budget(n).unwrap_or(0);
        let before = facts.iter().filter(|f| f.quarantined_by_us).count();
        let p = plan(&facts, &pol, n, Trigger::Confirmation);
        let after = before - p.release.len() + p.quarantine.len();
        prop_assert_eq!(after, p.quarantined_after);
        prop_assert!(after <= budget.max(before - p.release.len()));
        if before - p.release.len() >= budget {
            prop_assert!(p.quarantine.is_empty());
        }
    }

    /// Nodes held per GPU, nodes held as nodes, and candidates of either kind: each budget
    /// counts only its own units, a candidate is quarantined only where its units fit, and
    /// what either budget holds after the plan never grows beyond it.
    #[test]
    fn the_node_and_the_gpu_budget_each_hold_their_own_units(
        n in 1usize..=16,
        held in any::<u16>(),
        per_gpu in any::<u16>(),
        failing in any::<u16>(),
        sizes in prop::collection::vec(1u32..=4, 16),
        max_nodes in 0i32..6,
        max_gpus in 0i32..10,
    ) {
        let mut pol = QuarantinePolicy {
            mode: QuarantineMode::Cordon,
            confirm_retest: false,
            storm_threshold_percent: 100,
            ..QuarantinePolicy::default()
        };
        pol.max_quarantined = IntOrString::Int(max_nodes);
        pol.max_quarantined_gpus = IntOrString::Int(max_gpus);
        let facts: Vec<NodeFacts> = (0..n)
            .map(|i| {
                let ours = bit(held, i);
                let gpu = bit(per_gpu, i);
                let v = if bit(failing, i) { NodeVerdict::Failed } else { NodeVerdict::Passed };
                NodeFacts {
                    node: name(i),
                    health: advance(None, &name(i), v, None, "r"),
                    quarantined_by_us: ours,
                    cordoned_by_others: false,
                    tainted_by_others: false,
                    exists: true,
                    tested: true,
                    confirmed: false,
                    repaired: false,
                    gpus: GpuHold {
                        tainted: if ours && gpu { sizes[i] } else { 0 },
                        only: ours && gpu,
                        instead: (!ours && gpu).then_some(sizes[i]),
                    },
                }
            })
            .collect();
        let p = plan_guarded(
            &facts,
            &pol,
            Selected { nodes: n, gpus: 8 * n },
            Trigger::Schedule,
            &Guards::default(),
        );
        let of = |name: &String| facts.iter().find(|f| &f.node == name).expect("a node");
        let nodes_before = facts.iter().filter(|f| f.quarantined_by_us && !f.gpus.only).count();
        let gpus_before: usize = facts.iter().map(|f| f.gpus.tainted as usize).sum();
        let new_nodes = p.quarantine.iter().filter(|q| of(q).gpus.instead.is_none()).count();
        let new_gpus: usize =
            p.quarantine.iter().filter_map(|q| of(q).gpus.instead).map(|g| g as usize).sum();
        // Nothing is released: no node has passed.
        prop_assert!(p.release.is_empty());
        prop_assert_eq!(p.quarantined_after, nodes_before + new_nodes);
        prop_assert_eq!(p.gpus_held_after, gpus_before + new_gpus);
        if new_nodes > 0 {
            prop_assert!(p.quarantined_after <= max_nodes as usize);
        }
        if new_gpus > 0 {
            prop_assert!(p.gpus_held_after <= max_gpus as usize);
        }
        for (node, hold) in &p.held_back {
            let f = of(node);
            match hold {
                Hold::OverGpuBudget => prop_assert!(f.gpus.instead.is_some()),
                Hold::OverBudget => prop_assert!(f.gpus.instead.is_none()),
                other => prop_assert!(false, "{node} held back: {other:?}"),
            }
        }
    }
}
