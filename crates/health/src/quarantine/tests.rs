//! Unit tests of the quarantine planner, one rule at a time.
use super::*;
use gpufabric_api::run::NodeVerdict;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

fn policy(mode: QuarantineMode, max: i32, failures: u32, confirm: bool) -> QuarantinePolicy {
    QuarantinePolicy {
        mode,
        max_quarantined: IntOrString::Int(max),
        failures_to_quarantine: failures,
        passes_to_release: 2,
        confirm_retest: confirm,
        release_on_delete: true,
        storm_threshold_percent: 100,
        storm_min_nodes: 4,
        graduated_taints: false,
        ..QuarantinePolicy::default()
    }
}

/// A selection of `nodes` 8-GPU nodes.
fn selected(nodes: usize) -> Selected {
    Selected {
        nodes,
        gpus: 8 * nodes,
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
            quarantined_since: None,
            held_back: None,
            last_finding: None,
            last_run: Some("r".into()),
            ..Default::default()
        },
        quarantined_by_us: false,
        cordoned_by_others: false,
        tainted_by_others: false,
        exists: true,
        tested: true,
        confirmed: false,
        repaired: false,
        gpus: Default::default(),
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

/// A node whose failure this run already confirmed (the node-pair retest round).
fn retested(node: &str) -> NodeFacts {
    NodeFacts {
        confirmed: true,
        repaired: false,
        ..facts(node, 1, 0)
    }
}

#[test]
fn a_failure_the_run_confirmed_itself_needs_no_confirmation_run() {
    let pol = policy(QuarantineMode::Cordon, 5, 1, true);
    let p = plan(
        &[retested("a"), facts("b", 1, 0)],
        &pol,
        10,
        Trigger::Schedule,
    );
    assert_eq!(p.quarantine, vec!["a"]);
    assert_eq!(p.confirm, vec!["b"]);
    assert_eq!(p.hold_of("b"), Some(Hold::AwaitingConfirmation));
    // The budget still holds it back.
    let no_budget = policy(QuarantineMode::Cordon, 0, 1, true);
    let p = plan(&[retested("a")], &no_budget, 10, Trigger::Schedule);
    assert!(p.quarantine.is_empty());
    assert_eq!(p.hold_of("a"), Some(Hold::OverBudget));
    // Observe mode still acts on nothing.
    let observe = policy(QuarantineMode::Observe, 5, 1, true);
    let p = plan(&[retested("a")], &observe, 10, Trigger::Schedule);
    assert!(p.quarantine.is_empty() && p.confirm.is_empty());
    assert_eq!(p.hold_of("a"), Some(Hold::ObserveMode));
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
            // `plan` counts no GPUs: a percent GPU budget is its floor.
            gpu_budget: 1,
            held_in_cluster_after: 1,
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

fn stormy(threshold: u32, min_nodes: u32) -> QuarantinePolicy {
    QuarantinePolicy {
        storm_threshold_percent: threshold,
        storm_min_nodes: min_nodes,
        ..cordon(10)
    }
}

fn fleet(failing: usize, passing: usize) -> Vec<NodeFacts> {
    (0..failing)
        .map(|i| facts(&format!("f{i}"), 1, 0))
        .chain((0..passing).map(|i| facts(&format!("p{i}"), 0, 1)))
        .collect()
}

#[test]
fn a_storm_opens_the_breaker_and_touches_no_node() {
    let mut nodes = fleet(3, 1);
    nodes.push(ours("healed", 0, 5));
    let p = plan(&nodes, &stormy(50, 4), 10, Trigger::Schedule);
    assert_eq!(
        p.storm,
        Some(Storm {
            failed: 3,
            measured: 5,
            threshold_percent: 50,
            window_hours: None,
        })
    );
    assert!(p.breaker_open);
    assert!(p.quarantine.is_empty() && p.release.is_empty() && p.confirm.is_empty());
    assert_eq!(p.enforcement, None);
    for n in ["f0", "f1", "f2"] {
        assert_eq!(p.hold_of(n), Some(Hold::BreakerOpen), "{n}");
    }
    assert_eq!(p.hold_of("healed"), Some(Hold::BreakerOpenRelease));
    assert_eq!(p.quarantined_after, 1);
    assert!(
        p.storm
            .is_some_and(|s| s.describe() == "3 of 5 measured nodes failed (more than 50%)")
    );
}

#[test]
fn the_storm_rule_needs_more_than_the_share_and_enough_measured_nodes() {
    // Exactly half is not more than half.
    let p = plan(&fleet(2, 2), &stormy(50, 4), 10, Trigger::Schedule);
    assert_eq!((p.storm, p.quarantine.len()), (None, 2));
    // Three of three fail, but fewer than stormMinNodes were measured.
    let p = plan(&fleet(3, 0), &stormy(50, 4), 10, Trigger::Schedule);
    assert_eq!((p.storm, p.quarantine.len()), (None, 3));
    // 100% turns the rule off.
    let p = plan(&fleet(8, 0), &stormy(100, 1), 10, Trigger::Schedule);
    assert_eq!((p.storm, p.quarantine.len()), (None, 8));
    // Nodes not measured in this run do not count either way.
    let mut nodes = fleet(2, 2);
    for n in &mut nodes[2..] {
        n.tested = false;
    }
    assert_eq!(
        plan(&nodes, &stormy(50, 2), 10, Trigger::Schedule).storm,
        Some(Storm {
            failed: 2,
            measured: 2,
            threshold_percent: 50,
            window_hours: None,
        })
    );
}

/// A node the test judged at `hour` (hours after a day's start), failed or passed, and
/// whether this run measured it.
fn judged(node: &str, failed: bool, hour: i64, tested: bool) -> NodeFacts {
    let mut f = if failed {
        facts(node, 1, 0)
    } else {
        facts(node, 0, 1)
    };
    f.health.last_judged = Some(Time(
        k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + hour * 3600).expect("a time"),
    ));
    f.tested = tested;
    f
}

#[test]
fn many_small_failing_runs_open_the_breaker_as_one_large_run_would() {
    // A bad driver reaches the nodes a few at a time: gates and targeted runs of one or two
    // nodes, none of them stormMinNodes (4) large. Each run is planned with the test's
    // records as they stand after it.
    let policy = QuarantinePolicy {
        mode: QuarantineMode::Cordon,
        max_quarantined: IntOrString::Int(100),
        confirm_retest: false,
        ..stormy(50, 4)
    };
    let mut records: Vec<NodeFacts> = Vec::new();
    let mut quarantined = 0;
    let mut opened_at = None;
    for (run, hour) in [(0, 1), (1, 2), (2, 3), (3, 4)] {
        for f in &mut records {
            f.tested = false;
        }
        records.push(judged(&format!("r{run}a"), true, hour, true));
        records.push(judged(&format!("r{run}b"), true, hour, true));
        let p = plan(&records, &policy, 100, Trigger::Targeted);
        quarantined += p.quarantine.len();
        if p.storm.is_some() {
            opened_at.get_or_insert(run);
            assert_eq!(
                p.storm.map(|s| s.describe()),
                Some("4 of 4 nodes judged within 24 hours failed (more than 50%)".to_string())
            );
            break;
        }
    }
    // The second run of two brings the day's count to stormMinNodes: the breaker opens
    // then, and only the first run's two nodes were quarantined.
    assert_eq!((opened_at, quarantined), (Some(1), 2));
}

#[test]
fn a_small_run_is_judged_with_the_days_nodes_only() {
    let policy = stormy(50, 4);
    // Three passing nodes judged within the day dilute a small run's two failures: 2 of 5.
    let mut nodes = vec![
        judged("p0", false, 1, false),
        judged("p1", false, 2, false),
        judged("p2", false, 3, false),
        judged("f0", true, 20, true),
        judged("f1", true, 20, true),
    ];
    assert_eq!(plan(&nodes, &policy, 100, Trigger::Targeted).storm, None);
    // Two of the passes were judged more than a day before the run and no longer count;
    // with a third failure it is 3 of 4.
    nodes[0] = judged("p0", false, -10, false);
    nodes[1] = judged("p1", false, -10, false);
    nodes.push(judged("f2", true, 20, true));
    let p = plan(&nodes, &policy, 100, Trigger::Targeted);
    assert_eq!(
        p.storm,
        Some(Storm {
            failed: 3,
            measured: 4,
            threshold_percent: 50,
            window_hours: Some(STORM_WINDOW_HOURS),
        })
    );
    // A node never judged (not measured) does not count.
    let mut unmeasured = judged("n0", false, 19, false);
    unmeasured.health.verdict = NodeVerdict::NotMeasured;
    nodes.push(unmeasured);
    assert_eq!(
        plan(&nodes, &policy, 100, Trigger::Targeted)
            .storm
            .map(|s| s.measured),
        Some(4)
    );
}

#[test]
fn a_large_run_is_judged_alone() {
    // Four measured nodes, two failing: not more than half. The day's earlier failures do
    // not count against a run of stormMinNodes or more.
    let policy = stormy(50, 4);
    let nodes = vec![
        judged("old0", true, 1, false),
        judged("old1", true, 1, false),
        judged("a", true, 5, true),
        judged("b", true, 5, true),
        judged("c", false, 5, true),
        judged("d", false, 5, true),
    ];
    assert_eq!(plan(&nodes, &policy, 100, Trigger::Schedule).storm, None);
}

#[test]
fn a_confirmation_run_never_opens_the_breaker() {
    // It retests only the suspects: all of them failing again is what it is for.
    let p = plan(&fleet(5, 0), &stormy(50, 4), 10, Trigger::Confirmation);
    assert_eq!(p.storm, None);
    assert_eq!(p.quarantine.len(), 5);
}

#[test]
fn while_the_breaker_is_open_nothing_is_quarantined_released_or_confirmed() {
    let mut pol = stormy(100, 4);
    pol.confirm_retest = true;
    let guards = Guards {
        breaker_open: true,
        ..Guards::default()
    };
    let mut gone = ours("gone", 3, 0);
    gone.exists = false;
    let nodes = [facts("a", 2, 0), ours("b", 0, 9), gone];
    for trigger in [Trigger::Schedule, Trigger::Confirmation] {
        let p = plan_guarded(&nodes, &pol, selected(10), trigger, &guards);
        assert!(p.breaker_open && p.storm.is_none());
        assert!(p.quarantine.is_empty() && p.confirm.is_empty());
        // Only the record of a gone node goes: nothing on a node changes.
        assert_eq!(p.release, vec!["gone"]);
        assert_eq!(p.hold_of("a"), Some(Hold::BreakerOpen));
        assert_eq!(p.hold_of("b"), Some(Hold::BreakerOpenRelease));
        assert_eq!(p.enforcement, None);
    }
}

#[test]
fn the_cluster_cap_counts_the_nodes_other_tests_hold() {
    let guards = Guards {
        cluster_cap: Some(3),
        held_by_others: 1,
        ..Guards::default()
    };
    let nodes = [
        ours("q", 4, 0),
        facts("a", 3, 0),
        facts("b", 2, 0),
        facts("c", 1, 0),
    ];
    let p = plan_guarded(
        &nodes,
        &cordon(10),
        selected(10),
        Trigger::Schedule,
        &guards,
    );
    // 1 held by others + 1 ours + 1 new = the cap of 3.
    assert_eq!(p.quarantine, vec!["a"]);
    assert_eq!(p.hold_of("b"), Some(Hold::ClusterCap));
    assert_eq!(p.hold_of("c"), Some(Hold::ClusterCap));
    assert_eq!((p.quarantined_after, p.held_in_cluster_after), (2, 3));
    assert_eq!(p.cluster_cap, Some(3));
    // A release frees a slot of the cap too.
    let nodes = [ours("q", 0, 5), facts("a", 3, 0)];
    let guards = Guards {
        cluster_cap: Some(2),
        held_by_others: 1,
        ..Guards::default()
    };
    let p = plan_guarded(
        &nodes,
        &cordon(10),
        selected(10),
        Trigger::Schedule,
        &guards,
    );
    assert_eq!((p.release.len(), p.quarantine.len()), (1, 1));
    // Already over the cap (it was lowered): nothing new, nothing released for it.
    let guards = Guards {
        cluster_cap: Some(1),
        held_by_others: 4,
        ..Guards::default()
    };
    let p = plan_guarded(
        &[ours("q", 3, 0), facts("a", 3, 0)],
        &cordon(10),
        selected(10),
        Trigger::Schedule,
        &guards,
    );
    assert!(p.quarantine.is_empty() && p.release.is_empty());
    assert_eq!(p.hold_of("a"), Some(Hold::ClusterCap));
}

#[test]
fn the_test_budget_is_reported_before_the_cluster_cap() {
    let guards = Guards {
        cluster_cap: Some(0),
        ..Guards::default()
    };
    let nodes = [facts("a", 1, 0), facts("b", 1, 0)];
    let p = plan_guarded(&nodes, &cordon(0), selected(10), Trigger::Schedule, &guards);
    assert_eq!(p.hold_of("a"), Some(Hold::OverBudget));
    let p = plan_guarded(&nodes, &cordon(1), selected(10), Trigger::Schedule, &guards);
    assert_eq!(p.hold_of("a"), Some(Hold::ClusterCap));
    assert_eq!(p.hold_of("b"), Some(Hold::ClusterCap));
}

#[test]
fn cluster_cap_reads_a_count_or_a_percent_of_gpu_nodes() {
    assert_eq!("5".parse(), Ok(ClusterCap::Nodes(5)));
    assert_eq!(" 2% ".parse(), Ok(ClusterCap::Percent(2)));
    for bad in ["", "-1", "101%", "two", "5.5", "%"] {
        let e = bad.parse::<ClusterCap>().expect_err(bad);
        assert!(e.contains("percent"), "{e}");
    }
    assert_eq!(ClusterCap::Percent(2).nodes(1000), 20);
    assert_eq!(ClusterCap::Percent(2).nodes(10), 1, "at least one");
    // The flag's value: a cap, or none by name; the default is a tenth of the GPU nodes.
    assert_eq!(ClusterCap::setting("none"), Ok(None));
    assert_eq!(ClusterCap::setting("7"), Ok(Some(ClusterCap::Nodes(7))));
    assert!(ClusterCap::setting("").is_err(), "empty is not none");
    assert_eq!(ClusterCap::DEFAULT.nodes(100), 10);
    assert_eq!(ClusterCap::DEFAULT.nodes(4), 1);
    assert_eq!(ClusterCap::Percent(0).nodes(1000), 0);
    assert_eq!(ClusterCap::Percent(100).nodes(7), 7);
    assert_eq!(ClusterCap::Nodes(3).nodes(0), 3);
    assert_eq!(ClusterCap::Percent(10).to_string(), "10%");
}

#[test]
fn a_repaired_node_is_released_by_its_first_pass() {
    // passesToRelease is 2 in these tests: one pass is not enough for a node that was not
    // repaired, and is for one that was.
    let repaired = NodeFacts {
        repaired: true,
        ..ours("fixed", 0, 1)
    };
    let p = plan(
        &[repaired, ours("waiting", 0, 1)],
        &cordon(2),
        10,
        Trigger::Targeted,
    );
    assert_eq!(p.release, vec!["fixed"]);
    assert!(p.held_back.is_empty(), "{:?}", p.held_back);
    assert_eq!(p.quarantined_after, 1);
    // A repair that was not tested in this run releases nothing yet.
    let untested = NodeFacts {
        repaired: true,
        tested: false,
        ..ours("fixed", 0, 1)
    };
    assert!(
        plan(&[untested], &cordon(2), 10, Trigger::Schedule)
            .release
            .is_empty()
    );
}

#[test]
fn a_repeat_offender_is_kept_through_passes_until_it_is_repaired() {
    let mut offender = ours("bad", 0, 5);
    offender.health.standing = gpufabric_api::standing::Standing::RepeatOffender;
    let p = plan(&[offender.clone()], &cordon(2), 10, Trigger::Schedule);
    assert!(p.release.is_empty());
    assert_eq!(p.hold_of("bad"), Some(Hold::RepeatOffender));
    assert_eq!(p.quarantined_after, 1, "it still counts against the budget");
    let repaired = NodeFacts {
        repaired: true,
        ..offender
    };
    let p = plan(&[repaired], &cordon(2), 10, Trigger::Targeted);
    assert_eq!(p.release, vec!["bad"]);
}

/// A failing node whose quarantine would taint `gpus` of its GPUs instead of the node.
fn gpu_candidate(node: &str, gpus: u32) -> NodeFacts {
    NodeFacts {
        gpus: GpuHold {
            instead: Some(gpus),
            ..GpuHold::default()
        },
        ..facts(node, 3, 0)
    }
}

/// A node held by `tainted` tainted GPUs alone.
fn held_per_gpu(node: &str, tainted: u32, passes: u32) -> NodeFacts {
    NodeFacts {
        gpus: GpuHold {
            tainted,
            only: true,
            instead: None,
        },
        ..ours(node, 0, passes)
    }
}

fn with_gpu_budget(max_nodes: i32, max_gpus: i32) -> QuarantinePolicy {
    QuarantinePolicy {
        max_quarantined_gpus: IntOrString::Int(max_gpus),
        ..cordon(max_nodes)
    }
}

#[test]
fn a_gpu_taint_takes_the_gpu_budget_and_no_node_of_the_node_budget() {
    // One node of budget: two nodes whose single GPUs are tainted and one cordoned node all fit.
    let nodes = [
        gpu_candidate("a", 1),
        gpu_candidate("b", 1),
        facts("c", 3, 0),
    ];
    let p = plan_guarded(
        &nodes,
        &with_gpu_budget(1, 2),
        selected(10),
        Trigger::Schedule,
        &Guards::default(),
    );
    assert_eq!(p.quarantine, ["a", "b", "c"]);
    assert_eq!((p.quarantined_after, p.budget), (1, 1));
    assert_eq!((p.gpus_held_after, p.gpu_budget), (2, 2));
    assert!(p.held_back.is_empty());
}

#[test]
fn a_gpu_taint_beyond_the_gpu_budget_is_refused_as_a_cordon_beyond_the_node_budget_is() {
    // GPUs held already: 3 on "held"; the budget is 4. "a" needs 2 and is refused whole,
    // "b" needs 1 and fits; the node budget still has room for "c".
    let nodes = [
        held_per_gpu("held", 3, 0),
        gpu_candidate("a", 2),
        gpu_candidate("b", 1),
        facts("c", 1, 0),
    ];
    let p = plan_guarded(
        &nodes,
        &with_gpu_budget(1, 4),
        selected(10),
        Trigger::Schedule,
        &Guards::default(),
    );
    assert_eq!(p.quarantine, ["b", "c"]);
    assert_eq!(p.hold_of("a"), Some(Hold::OverGpuBudget));
    assert_eq!(p.gpus_held_after, 4);
    assert_eq!(
        p.quarantined_after, 1,
        "the node held per GPU takes no node"
    );
    assert!(
        Hold::OverGpuBudget
            .describe()
            .contains("budget (maxQuarantinedGpus) is spent")
    );
}

#[test]
fn a_percent_gpu_budget_is_a_share_of_the_selected_gpus_and_a_release_frees_its_gpus() {
    let mut pol = cordon(10);
    pol.max_quarantined_gpus = IntOrString::String("5%".into());
    // 10 nodes of 8 GPUs: 4 GPUs. "held" passed enough to be released: its 3 GPUs are free
    // again for "a" in the same plan.
    let nodes = [held_per_gpu("held", 3, 5), gpu_candidate("a", 4)];
    let p = plan_guarded(
        &nodes,
        &pol,
        selected(10),
        Trigger::Schedule,
        &Guards::default(),
    );
    assert_eq!(p.gpu_budget, 4);
    assert_eq!(p.release, ["held"]);
    assert_eq!(p.quarantine, ["a"]);
    assert_eq!(p.gpus_held_after, 4);
}

#[test]
fn nodes_held_per_gpu_take_no_slot_of_the_cluster_cap() {
    let guards = Guards {
        cluster_cap: Some(1),
        held_by_others: 0,
        ..Guards::default()
    };
    let nodes = [
        held_per_gpu("held", 1, 0),
        gpu_candidate("a", 1),
        facts("c", 1, 0),
    ];
    let p = plan_guarded(
        &nodes,
        &with_gpu_budget(5, 5),
        selected(10),
        Trigger::Schedule,
        &guards,
    );
    assert_eq!(p.quarantine, ["a", "c"]);
    assert_eq!(p.held_in_cluster_after, 1);
}

#[test]
fn a_malformed_gpu_budget_holds_no_new_gpu_and_says_why() {
    let mut pol = cordon(5);
    pol.max_quarantined_gpus = IntOrString::String("lots".into());
    let p = plan_guarded(
        &[gpu_candidate("a", 1), facts("c", 1, 0)],
        &pol,
        selected(10),
        Trigger::Schedule,
        &Guards::default(),
    );
    assert_eq!(p.quarantine, ["c"], "the node budget still holds");
    assert_eq!(p.hold_of("a"), Some(Hold::OverGpuBudget));
    let why = p.budget_error.expect("the error");
    assert!(why.contains("maxQuarantinedGpus"), "{why}");
}
