//! A node against its own earlier runs: drift is a Warning on a passing node, never a failure.

use super::*;
use gpufabric_api::trend::TrendPoint;

/// Nightly records of a node whose all_reduce busbw was `nightly[i]` times its value now.
fn history_of(r: &CompactResult, nightly: &[f64]) -> Vec<TrendPoint> {
    let now = TrendPoint::of(r, 0);
    nightly
        .iter()
        .enumerate()
        .map(|(i, k)| TrendPoint {
            at: i as i64,
            busbw_gbps: now.busbw_gbps.map(|b| b * k),
            ..now.clone()
        })
        .collect()
}

#[test]
fn a_passing_node_drifting_below_its_own_median_gets_a_warning_and_still_passes() {
    let fleet = fleet_of(6, 0.0);
    let mut nodes = inputs(fleet);
    // node-02 ran at 1.07x tonight's busbw for five nights, then slid: 1.04x, 1.02x, now.
    let h = {
        let NodeOutcome::Measured(r) = &nodes[2].outcome else {
            panic!("measured")
        };
        history_of(r, &[1.07, 1.07, 1.07, 1.07, 1.07, 1.04, 1.02])
    };
    nodes[2].history = h;
    // node-03 has as long a record, steady: nothing to say.
    let steady = {
        let NodeOutcome::Measured(r) = &nodes[3].outcome else {
            panic!("measured")
        };
        history_of(r, &[1.0; 7])
    };
    nodes[3].history = steady;
    let e = evaluate(&nodes, &Thresholds::default());
    let f = on(&e, "node-02");
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].kind, FindingKind::Drifting);
    assert_eq!(f[0].severity, Severity::Warning);
    assert_eq!(f[0].source, Some(ExpectationSource::History));
    assert_eq!(f[0].collective, Some(Collective::AllReduce));
    assert!(
        f[0].message.contains("below its 7-run median"),
        "{}",
        f[0].message
    );
    check_evidence(f[0]);
    assert_eq!(e.verdicts.get("node-02"), Some(&NodeVerdict::Passed));
    assert_eq!(e.critical_count("node-02"), 0);
    assert!(on(&e, "node-03").is_empty());
}

#[test]
fn a_failing_node_is_not_also_drifting() {
    let mut fleet = fleet_of(6, 0.0);
    slow_pair(&mut fleet[2], 0, 1, 0.5);
    let mut nodes = inputs(fleet);
    let h = {
        let NodeOutcome::Measured(r) = &nodes[2].outcome else {
            panic!("measured")
        };
        history_of(r, &[1.2; 7])
    };
    nodes[2].history = h;
    let e = evaluate(&nodes, &Thresholds::default());
    assert_eq!(e.verdicts.get("node-02"), Some(&NodeVerdict::Failed));
    assert!(
        on(&e, "node-02")
            .iter()
            .all(|f| f.kind != FindingKind::Drifting),
        "{:#?}",
        on(&e, "node-02")
    );
}
