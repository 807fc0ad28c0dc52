//! The lifecycle's plan after a folded run, step by step.

use super::*;
use crate::quarantine::ActionTaken;
use gpufabric_api::run::FabricTestRunSpec;
use gpufabric_api::standing::Standing;
use gpufabric_api::test::{FabricTestSpec, NodeHealth};

const AT: &str = "2026-11-21T12:00:00Z";

fn time(s: &str) -> Time {
    serde_json::from_value(serde_json::json!(s)).expect("a time")
}

fn test() -> FabricTest {
    let mut t = FabricTest::new("nightly", FabricTestSpec::default());
    t.spec.quarantine.repeat_offender_quarantines = 2;
    t.spec.quarantine.repeat_offender_window_hours = 24;
    t
}

fn result(node: &str, verdict: NodeVerdict) -> NodeRunResult {
    serde_json::from_value(serde_json::json!({"node": node, "verdict": verdict}))
        .expect("a node result")
}

/// The executor's outcome: `actions` taken; the nodes it quarantined are held.
fn outcome(actions: &[(&str, quarantine::Action)]) -> Outcome {
    Outcome {
        quarantined: actions
            .iter()
            .filter(|(_, a)| *a == quarantine::Action::Quarantined)
            .map(|(n, _)| (n.to_string(), time(AT)))
            .collect(),
        actions: actions
            .iter()
            .map(|(n, a)| ActionTaken {
                node: n.to_string(),
                action: *a,
                message: String::new(),
            })
            .collect(),
        ..Outcome::default()
    }
}

/// The plan over `results` of run "nightly-1" (of `trigger`), with `repaired` nodes, the
/// executor's `outcome`, the breaker as given and the `gated` nodes.
struct Case<'a> {
    run: FabricTestRun,
    results: Vec<NodeRunResult>,
    repaired: &'a [&'a str],
    outcome: Outcome,
    breaker_open: bool,
    gated: &'a [&'a str],
}

impl<'a> Case<'a> {
    fn new(results: Vec<NodeRunResult>) -> Self {
        Case {
            run: FabricTestRun::new(
                "nightly-1",
                FabricTestRunSpec::of_test(
                    "nightly",
                    &FabricTestSpec::default(),
                    Trigger::Schedule,
                    None,
                    None,
                ),
            ),
            results,
            repaired: &[],
            outcome: Outcome::default(),
            breaker_open: false,
            gated: &[],
        }
    }

    fn plan(&self, status: &mut FabricTestStatus) -> Vec<LifeStep> {
        let repaired: BTreeSet<String> = self.repaired.iter().map(|s| s.to_string()).collect();
        let gated = |n: &str| self.gated.contains(&n);
        plan(
            &AfterRun {
                test: &test(),
                run: &self.run,
                results: &self.results,
                repaired: &repaired,
                outcome: &self.outcome,
                breaker_open: self.breaker_open,
                gated: &gated,
                at: time(AT),
            },
            status,
        )
    }
}

/// A node's history as an earlier fold left it: its standing and its quarantines.
fn history(node: &str, standing: Standing, quarantine_times: &[&str]) -> NodeHealth {
    NodeHealth {
        node: node.into(),
        standing,
        quarantine_times: quarantine_times.iter().map(|t| time(t)).collect(),
        ..NodeHealth::default()
    }
}

fn reasons(steps: &[LifeStep]) -> Vec<(&str, &str)> {
    steps
        .iter()
        .map(|s| match s {
            LifeStep::Note(n) => ("note", n.reason),
            LifeStep::ClearRepaired { then, .. } => ("clear repaired", then.reason),
            LifeStep::OpenGate { .. } => ("open gate", ""),
            LifeStep::TestNote { reason, .. } => ("test note", *reason),
        })
        .collect()
}

#[test]
fn a_second_quarantine_within_the_window_makes_a_repeat_offender_with_a_warning() {
    let mut status = FabricTestStatus {
        nodes: vec![history(
            "bad",
            Standing::TakenBack {
                what: "uncordoned".into(),
            },
            &["2026-11-21T01:00:00Z"],
        )],
        ..FabricTestStatus::default()
    };
    let mut case = Case::new(vec![result("bad", NodeVerdict::Failed)]);
    case.outcome = outcome(&[("bad", quarantine::Action::Quarantined)]);
    let steps = case.plan(&mut status);
    let [LifeStep::Note(note)] = steps.as_slice() else {
        panic!("one note: {steps:?}");
    };
    assert!(note.warning);
    assert_eq!((note.node.as_str(), note.reason), ("bad", "RepeatOffender"));
    assert!(
        note.message.contains("quarantined 2 times within 24 hours"),
        "{}",
        note.message
    );
    assert_eq!(status.repeat_offenders, ["bad"]);
}

#[test]
fn quarantines_older_than_the_window_are_forgotten_and_make_no_offender() {
    let mut status = FabricTestStatus {
        nodes: vec![history(
            "bad",
            Standing::TakenBack {
                what: "uncordoned".into(),
            },
            &["2026-11-19T01:00:00Z"],
        )],
        ..FabricTestStatus::default()
    };
    let mut case = Case::new(vec![result("bad", NodeVerdict::Failed)]);
    case.outcome = outcome(&[("bad", quarantine::Action::Quarantined)]);
    assert!(case.plan(&mut status).is_empty());
    assert_eq!(status.nodes[0].quarantine_times, [time(AT)]);
    assert!(status.repeat_offenders.is_empty());
}

/// A repeat offender the test holds, back from repair, and a run that gave it `verdict`.
fn repaired_offender(verdict: NodeVerdict) -> (FabricTestStatus, Case<'static>) {
    let times = ["2026-11-21T01:00:00Z", "2026-11-21T02:00:00Z"];
    let status = FabricTestStatus {
        nodes: vec![history("fixed", Standing::RepeatOffender, &times)],
        ..FabricTestStatus::default()
    };
    let mut case = Case::new(vec![result("fixed", verdict)]);
    case.repaired = &["fixed"];
    // Held still, unless a test's executor released it.
    case.outcome
        .quarantined
        .insert("fixed".into(), time(times[0]));
    (status, case)
}

#[test]
fn a_passed_repair_takes_the_annotation_off_and_clears_the_record() {
    let (mut status, mut case) = repaired_offender(NodeVerdict::Passed);
    case.outcome = outcome(&[("fixed", quarantine::Action::Released)]);
    let steps = case.plan(&mut status);
    let [LifeStep::ClearRepaired { node, then }] = steps.as_slice() else {
        panic!("the annotation taken off: {steps:?}");
    };
    assert_eq!(node, "fixed");
    assert_eq!(then.reason, "RepairPassed");
    assert!(then.message.ends_with(": released"), "{}", then.message);
    assert!(status.nodes[0].quarantine_times.is_empty());
    assert!(status.repeat_offenders.is_empty());
}

#[test]
fn a_repair_passed_while_the_breaker_is_open_keeps_its_annotation_and_its_record() {
    let (mut status, mut case) = repaired_offender(NodeVerdict::Passed);
    case.breaker_open = true;
    let steps = case.plan(&mut status);
    assert_eq!(reasons(&steps), [("note", "RepairWaiting")]);
    assert_eq!(status.repeat_offenders, ["fixed"], "nothing is used up");
    assert_eq!(status.nodes[0].quarantine_times.len(), 2);
}

#[test]
fn a_failed_repair_takes_the_annotation_off_with_a_warning_and_keeps_the_record() {
    let (mut status, case) = repaired_offender(NodeVerdict::Failed);
    let steps = case.plan(&mut status);
    let [LifeStep::ClearRepaired { then, .. }] = steps.as_slice() else {
        panic!("the annotation taken off: {steps:?}");
    };
    assert!(then.warning);
    assert_eq!(then.reason, "RepairFailed");
    assert_eq!(status.repeat_offenders, ["fixed"]);
}

#[test]
fn only_a_full_pass_opens_the_validation_gate() {
    let mut partial = result("partial", NodeVerdict::Passed);
    partial.unmeasured = vec!["ncclSweep".into()];
    let mut case = Case::new(vec![
        result("failed", NodeVerdict::Failed),
        result("passed", NodeVerdict::Passed),
        partial,
        result("ungated", NodeVerdict::Passed),
        result("busy", NodeVerdict::NotMeasured),
    ]);
    case.gated = &["failed", "passed", "partial", "busy"];
    let steps = case.plan(&mut FabricTestStatus::default());
    assert_eq!(
        reasons(&steps),
        [
            ("note", "ValidationFailed"),
            ("note", "ValidationIncomplete"),
            ("open gate", ""),
        ]
    );
    let LifeStep::OpenGate { node, opened, held } = &steps[2] else {
        panic!("the gate opened: {steps:?}");
    };
    assert_eq!(node, "passed");
    assert_eq!(
        (opened.reason, held.reason),
        ("ValidationPassed", "ValidationHeld")
    );
}

#[test]
fn a_targeted_run_names_each_target_it_did_not_measure_and_why() {
    let mut busy = result("busy", NodeVerdict::NotMeasured);
    busy.reason = Some("another run's pod".into());
    let mut case = Case::new(vec![result("done", NodeVerdict::Passed), busy]);
    case.run.spec.trigger = Trigger::Targeted;
    case.run.spec.reasons = ["done", "busy", "late"]
        .iter()
        .map(|n| (n.to_string(), "repaired".to_string()))
        .collect();
    let steps = case.plan(&mut FabricTestStatus::default());
    let [LifeStep::TestNote { reason, message }] = steps.as_slice() else {
        panic!("one note on the test: {steps:?}");
    };
    assert_eq!(*reason, "TargetNotMeasured");
    assert!(
        message
            .contains("did not measure busy (another run's pod), late (the run ended before it)"),
        "{message}"
    );
    assert!(!message.contains("done"), "{message}");
}

#[test]
fn a_scheduled_run_that_missed_nodes_says_nothing_of_targets() {
    let case = Case::new(vec![result("busy", NodeVerdict::NotMeasured)]);
    assert!(case.plan(&mut FabricTestStatus::default()).is_empty());
}
