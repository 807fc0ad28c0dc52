//! A node judged without enough peers in its run, against the baseline its test's passing
//! nodes made in earlier runs.

use super::*;
use gpufabric_api::baseline::{FleetBaseline, Series};

const SUITE: &str = "suite";
const SETTINGS: &str = "settings";
const HOUR: i64 = 3600;

/// The baseline `runs` healthy runs of `nodes` nodes each make, an hour apart.
fn baseline_of(runs: usize, nodes: usize) -> FleetBaseline {
    let mut b = FleetBaseline::default();
    for r in 0..runs {
        let fleet: Vec<CompactResult> = (0..nodes)
            .map(|i| healthy(&format!("base-{r}-{i}"), (r * 100 + i) as u64, 0.01))
            .collect();
        let e = run(fleet);
        let sample = crate::evaluate::baseline::sample(
            &format!("run-{r}"),
            SUITE,
            SETTINGS,
            e.series.values(),
        );
        b = b.with_run(&sample, r as i64 * HOUR);
    }
    b
}

fn against(b: &FleetBaseline) -> Against<'_> {
    Against {
        baseline: b,
        suite: SUITE,
        settings: SETTINGS,
        now: 10 * HOUR,
    }
}

fn judge_alone(r: CompactResult, b: &FleetBaseline, tuning: &[&str]) -> Evaluation {
    let mut input = NodeInput::measured(r);
    input.nccl_tuning = tuning.iter().map(|s| s.to_string()).collect();
    evaluate_against(&[input], &Thresholds::default(), Some(&against(b)))
}

fn scale_collectives(r: &mut CompactResult, only: Option<Collective>, k: f64) {
    for c in r
        .collectives
        .iter_mut()
        .filter(|c| only.is_none_or(|o| o == c.collective))
    {
        c.peak_busbw *= k;
        c.largest_busbw *= k;
    }
}

#[test]
fn a_run_of_passing_nodes_makes_a_sample_of_every_series_it_measured() {
    let e = run(fleet_of(5, 0.01));
    let sample = crate::evaluate::baseline::sample("r", SUITE, SETTINGS, e.series.values());
    assert_eq!(sample.len(), 1);
    let s = &sample[0];
    let product = crate::profiles::normalize(H100);
    assert_eq!(
        (&s.key.product, s.key.gpus, s.sample.nodes),
        (&product, 8, 5)
    );
    for series in [
        Series::BusBw(Collective::AllReduce),
        Series::BusBw(Collective::AllGather),
        Series::WorstPair,
        Series::WorstPairBidir,
        Series::WorstH2d,
        Series::WorstD2h,
        Series::Ddp(8),
    ] {
        assert!(s.sample.get(series).is_some_and(|sp| sp.n == 5), "{series}");
    }
}

#[test]
fn a_failing_node_feeds_no_sample() {
    let mut fleet = fleet_of(6, 0.01);
    all_reduce(&mut fleet[2]).peak_busbw *= 0.4;
    let e = run(fleet);
    assert_eq!(e.verdicts.get("node-02"), Some(&NodeVerdict::Failed));
    assert!(!e.series.contains_key("node-02"));
    assert_eq!(e.series.len(), 5);
}

#[test]
fn a_lone_node_far_below_the_baseline_fails_and_says_against_what() {
    let b = baseline_of(3, 5);
    let mut slow = healthy("gate-1", 999, 0.01);
    scale_collectives(&mut slow, Some(Collective::AllGather), 0.69);
    // The spec's NCCL_ALGO spares it from fixed expectations: only the baseline holds it.
    let e = judge_alone(slow, &b, &["NCCL_ALGO"]);
    assert_eq!(
        e.verdicts.get("gate-1"),
        Some(&NodeVerdict::Failed),
        "{:#?}",
        e.findings
    );
    let f = e
        .findings
        .iter()
        .find(|f| f.source == Some(ExpectationSource::Baseline))
        .unwrap_or_else(|| panic!("a finding against the baseline: {:#?}", e.findings));
    assert_eq!(f.collective, Some(Collective::AllGather));
    assert!(
        f.message
            .contains("31% below the 5 nodes of this test run alike over 1 day"),
        "{}",
        f.message
    );
    check_evidence(f);
}

#[test]
fn settings_the_spec_chose_spare_no_node_from_a_baseline_made_with_them() {
    // Every collective at 6% of what the baseline's nodes reach, with a tuning setting in
    // the spec: fixed expectations are spared, the baseline is not.
    let b = baseline_of(2, 4);
    let mut capped = healthy("gate-1", 7, 0.01);
    scale_collectives(&mut capped, None, 0.06);
    let e = judge_alone(capped, &b, &["NCCL_P2P_DISABLE"]);
    assert_eq!(
        e.verdicts.get("gate-1"),
        Some(&NodeVerdict::Failed),
        "{:#?}",
        e.findings
    );
    assert!(
        e.findings
            .iter()
            .any(|f| f.source == Some(ExpectationSource::Baseline)
                && f.collective == Some(Collective::AllReduce))
    );
}

#[test]
fn with_no_baseline_yet_an_info_says_so_and_the_node_is_judged_as_before() {
    let empty = FleetBaseline::default();
    let e = judge_alone(healthy("gate-1", 3, 0.01), &empty, &[]);
    assert_eq!(e.verdicts.get("gate-1"), Some(&NodeVerdict::Passed));
    let info: Vec<_> = e
        .findings
        .iter()
        .filter(|f| f.message.contains("no baseline yet"))
        .collect();
    assert_eq!(info.len(), 1, "{:#?}", e.findings);
    assert_eq!(info[0].severity, Severity::Info);
    // A baseline of other settings is none for this run.
    let other = baseline_of(2, 4);
    let a = Against {
        settings: "other",
        ..against(&other)
    };
    let e = evaluate_against(
        &[NodeInput::measured(healthy("gate-1", 3, 0.01))],
        &Thresholds::default(),
        Some(&a),
    );
    assert!(
        e.findings
            .iter()
            .any(|f| f.message.contains("no baseline yet"))
    );
}

#[test]
fn a_run_with_enough_peers_is_judged_by_its_own_median_not_the_baseline() {
    // Every node of a full run 20% below the baseline: the run's own median judges them,
    // and alike nodes pass (a fleet-wide change is the fleet's, not a node's).
    let b = baseline_of(2, 4);
    let mut fleet = fleet_of(Thresholds::default().fleet_min_nodes as usize, 0.01);
    for r in fleet.iter_mut() {
        scale_collectives(r, Some(Collective::AllGather), 0.8);
    }
    let e = evaluate_against(&inputs(fleet), &Thresholds::default(), Some(&against(&b)));
    assert!(
        e.findings
            .iter()
            .all(|f| f.source != Some(ExpectationSource::Baseline)
                && !f.message.contains("no baseline")),
        "{:#?}",
        e.findings
    );
}

/// How far below the baseline a lone node may fall, by the baseline's own spread: within
/// the low tail healthy nodes reach it passes; well beyond both the gap and the tail it
/// fails.
#[test]
fn how_far_below_fails_a_lone_node_a_table() {
    let tight = baseline_of(3, 6);
    let cases: [(f64, NodeVerdict); 6] = [
        (1.05, NodeVerdict::Passed),
        (1.0, NodeVerdict::Passed),
        (0.97, NodeVerdict::Passed),
        (0.92, NodeVerdict::Passed),
        (0.85, NodeVerdict::Failed),
        (0.5, NodeVerdict::Failed),
    ];
    for (k, verdict) in cases {
        let mut r = healthy("gate-1", 42, 0.0);
        scale_collectives(&mut r, Some(Collective::ReduceScatter), k);
        let e = judge_alone(r, &tight, &[]);
        assert_eq!(
            e.verdicts.get("gate-1"),
            Some(&verdict),
            "reduce_scatter at {k} of the baseline: {:#?}",
            e.findings
        );
    }
}

#[test]
fn far_below_needs_both_the_gap_and_the_spread() {
    let e = |median, p10| gpufabric_api::baseline::Expectation {
        median,
        p10,
        p90: median,
        nodes: 10,
        runs: 3,
        days: 1,
    };
    // Tight: the 10% gap decides.
    assert!(!crate::evaluate::baseline::far_below(
        91.0,
        &e(100.0, 99.0),
        0.1
    ));
    assert!(crate::evaluate::baseline::far_below(
        89.0,
        &e(100.0, 99.0),
        0.1
    ));
    // Loose: the spread decides (twice the low tail below the median).
    assert!(!crate::evaluate::baseline::far_below(
        65.0,
        &e(100.0, 80.0),
        0.1
    ));
    assert!(crate::evaluate::baseline::far_below(
        59.0,
        &e(100.0, 80.0),
        0.1
    ));
}
