//! A node against its own earlier runs of the test: a number that falls slowly stays above
//! every floor for weeks, and the fleet comparison hides it while the fleet is young.
//!
//! # Rules
//! 1. Only a node that passes is judged (a failing node's findings already say more), and
//!    only with `thresholds.trend.enabled`.
//! 2. For each of all_reduce busbw, the worst GPU-pair copy, the slowest host link and the
//!    DDP step time: the baseline is the median of the node's last `window` earlier runs
//!    that measured it, judged once there are `minRuns` of them.
//! 3. The number drifts when this run is worse than the baseline by more than
//!    `driftPercent`, and by more than [`NOISE_FACTOR`] times the node's own run-to-run
//!    spread of it (the median absolute deviation of the earlier runs before the streak,
//!    scaled to a standard deviation: a host link that moves 10% between healthy checks is judged on a wider
//!    margin than a busbw that moves 0.5%), and the `sustainedRuns - 1` runs before it were
//!    each worse than the baseline too: one slow night is noise, not drift.
//! 4. A drift is a Warning `Drifting` finding on the node (source History), with how far
//!    below, for how many runs, and how fast it falls. It never fails a node.
//! 5. When at least `fleetMinNodes` judged nodes drift on one number and they are more than
//!    half of those judged on it, the fleet moved (a driver, NCCL or image change), not the
//!    nodes: each such finding becomes Info and says so.

use gpufabric_api::findings::{ExpectationSource, Finding, FindingKind, Metric, Severity, Subject};
use gpufabric_api::policy::{Thresholds, TrendPolicy};
use gpufabric_api::suite::Collective;
use gpufabric_api::trend::{TrendMetric, TrendPoint};
use std::collections::BTreeMap;

/// How many of the node's own run-to-run spreads a number must fall beyond to drift.
pub const NOISE_FACTOR: f64 = 3.0;

/// How one number of a node compares with its own record.
#[derive(Clone, Debug, PartialEq)]
pub struct Drift {
    pub metric: TrendMetric,
    pub value: f64,
    pub baseline: f64,
    /// How much worse than the baseline, as a share of it (positive: worse).
    pub worse_by: f64,
    /// Runs in a row, this one included, worse than the baseline.
    pub runs_worse: usize,
    /// Earlier runs the baseline is the median of.
    pub baseline_runs: usize,
    /// The spread around the baseline of the earlier runs before the streak, as a share of
    /// it (the median absolute deviation scaled to a standard deviation).
    pub spread: f64,
    /// The least-squares change a run over the runs worse than the baseline, as a share of
    /// the baseline (positive: getting worse).
    pub worsening_per_run: f64,
}

/// The drifts of one node: `history` its earlier runs of the test with this suite (oldest
/// first), `now` this run's numbers.
pub fn drifts(history: &[TrendPoint], now: &TrendPoint, policy: &TrendPolicy) -> Vec<Drift> {
    if !policy.enabled {
        return Vec::new();
    }
    TrendMetric::ALL
        .iter()
        .filter_map(|m| drift_of(*m, history, now, policy))
        .collect()
}

fn drift_of(
    metric: TrendMetric,
    history: &[TrendPoint],
    now: &TrendPoint,
    policy: &TrendPolicy,
) -> Option<Drift> {
    let value = now.get(metric)?;
    let earlier: Vec<f64> = history.iter().filter_map(|p| p.get(metric)).collect();
    let window = (policy.window as usize).max(1);
    let earlier = &earlier[earlier.len().saturating_sub(window)..];
    if earlier.len() < (policy.min_runs as usize).max(1) {
        return None;
    }
    let baseline = crate::fleet::median(earlier)?;
    if baseline <= 0.0 {
        return None;
    }
    let worse = |v: f64| {
        if metric.higher_is_better() {
            (baseline - v) / baseline
        } else {
            (v - baseline) / baseline
        }
    };
    let worse_by = worse(value);
    if worse_by <= policy.drift_percent / 100.0 {
        return None;
    }
    let before_now = earlier
        .iter()
        .rev()
        .take_while(|v| worse(**v) > 0.0)
        .count();
    let runs_worse = before_now + 1;
    if runs_worse < (policy.sustained_runs as usize).max(1) {
        return None;
    }
    // The spread of the runs before the streak: how much the number moves when healthy.
    let steady = &earlier[..earlier.len() - before_now];
    let center = crate::fleet::median(steady).unwrap_or(baseline);
    let deviations: Vec<f64> = steady.iter().map(|v| (v - center).abs()).collect();
    let spread = crate::fleet::median(&deviations).unwrap_or(0.0) * 1.4826 / baseline;
    if worse_by <= NOISE_FACTOR * spread {
        return None;
    }
    let run: Vec<f64> = earlier[earlier.len() - before_now..]
        .iter()
        .chain(std::iter::once(&value))
        .map(|v| worse(*v))
        .collect();
    Some(Drift {
        metric,
        value,
        baseline,
        worse_by,
        runs_worse,
        baseline_runs: earlier.len(),
        spread,
        worsening_per_run: slope(&run),
    })
}

/// Least-squares slope of `ys` over 0, 1, 2, ...; 0 for fewer than two points.
fn slope(ys: &[f64]) -> f64 {
    let n = ys.len() as f64;
    if ys.len() < 2 {
        return 0.0;
    }
    let mean_x = (n - 1.0) / 2.0;
    let mean_y = ys.iter().sum::<f64>() / n;
    let (mut tenths_below_100, mut den) = (0.0, 0.0);
    for (i, y) in ys.iter().enumerate() {
        let dx = i as f64 - mean_x;
        tenths_below_100 += dx * (y - mean_y);
        den += dx * dx;
    }
    if den == 0.0 {
        0.0
    } else {
        tenths_below_100 / den
    }
}

fn finding_metric(m: TrendMetric) -> (Metric, Option<Collective>) {
    match m {
        TrendMetric::BusBw => (Metric::NcclBusBw, Some(Collective::AllReduce)),
        TrendMetric::WorstPair => (Metric::PairBandwidth, None),
        TrendMetric::Host => (Metric::HostBandwidth, None),
        TrendMetric::DdpStep => (Metric::DdpStepTime, None),
    }
}

/// The Warning finding for one drift of `node`.
pub fn finding(node: &str, d: &Drift) -> Finding {
    let (metric, collective) = finding_metric(d.metric);
    let side = if d.metric.higher_is_better() {
        "below"
    } else {
        "above"
    };
    let pace = if d.worsening_per_run > 0.001 {
        format!(
            ", {} {:.1}% a run",
            if d.metric.higher_is_better() {
                "falling"
            } else {
                "rising"
            },
            d.worsening_per_run * 100.0
        )
    } else {
        String::new()
    };
    let message = format!(
        "{node} is drifting: {} {:.1} {unit} is {:.1}% {side} its {}-run median of {:.1} (its runs move about {:.1}%), {side} it for {} runs{pace}; still above every floor. It fails nothing: retest it, or watch whether it crosses a floor (a link, GPU or host path wearing out, or a changed node configuration).",
        d.metric.label(),
        d.value,
        d.worse_by * 100.0,
        d.baseline_runs,
        d.baseline,
        d.spread * 100.0,
        d.runs_worse,
        unit = d.metric.unit(),
    );
    let mut f = Finding::new(
        FindingKind::Drifting,
        Subject::node(node),
        metric,
        Severity::Warning,
        message,
    );
    f.collective = collective;
    f.measured = Some(d.value);
    f.expected = Some(d.baseline);
    f.deviation = Some((d.value - d.baseline) / d.baseline);
    f.unit = Some(d.metric.unit().to_string());
    f.source = Some(ExpectationSource::History);
    f
}

/// One passing node judged against its record: the numbers that could be judged, and its
/// drifts.
pub type Judged<'a> = (&'a str, Vec<TrendMetric>, Vec<Drift>);

/// The drift findings of a run. Rule 5 turns a fleet-wide drift into Info.
pub fn findings(judged: &[Judged<'_>], t: &Thresholds) -> Vec<Finding> {
    let mut drifting: BTreeMap<TrendMetric, usize> = BTreeMap::new();
    let mut with_record: BTreeMap<TrendMetric, usize> = BTreeMap::new();
    for (_, metrics, ds) in judged {
        for d in ds {
            *drifting.entry(d.metric).or_default() += 1;
        }
        for m in metrics {
            *with_record.entry(*m).or_default() += 1;
        }
    }
    let min = (t.fleet_min_nodes as usize).max(2);
    let mut out = Vec::new();
    for (node, _, ds) in judged {
        for d in ds {
            let n = drifting.get(&d.metric).copied().unwrap_or(0);
            let of = with_record.get(&d.metric).copied().unwrap_or(0);
            let mut f = finding(node, d);
            if n >= min && n * 2 > of {
                f.severity = Severity::Info;
                f.message = format!(
                    "{} ({n} of the {of} nodes judged against their own runs drifted on it at once: the fleet changed, a driver, NCCL or image, not this node.)",
                    f.message
                );
            }
            out.push(f);
        }
    }
    out
}

/// The trend's numbers that `history` and `now` let the rule judge.
pub fn judgeable(
    history: &[TrendPoint],
    now: &TrendPoint,
    policy: &TrendPolicy,
) -> Vec<TrendMetric> {
    if !policy.enabled {
        return Vec::new();
    }
    TrendMetric::ALL
        .into_iter()
        .filter(|m| {
            now.get(*m).is_some()
                && history.iter().filter(|p| p.get(*m).is_some()).count()
                    >= (policy.min_runs as usize).max(1)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(busbw: f64) -> TrendPoint {
        TrendPoint {
            at: 0,
            busbw_gbps: Some(busbw),
            ..Default::default()
        }
    }

    fn policy() -> TrendPolicy {
        TrendPolicy::default()
    }

    fn history(values: &[f64]) -> Vec<TrendPoint> {
        values.iter().map(|v| p(*v)).collect()
    }

    #[test]
    fn a_slow_fall_is_found_after_it_holds_for_the_sustained_runs() {
        // Five steady nights, then 2% a night.
        let h = history(&[400.0, 401.0, 399.0, 400.0, 400.0, 392.0, 384.0]);
        let d = drifts(&h, &p(376.0), &policy());
        assert_eq!(d.len(), 1, "{d:?}");
        let d = &d[0];
        assert_eq!(d.metric, TrendMetric::BusBw);
        assert_eq!(d.baseline, 400.0);
        assert_eq!(d.runs_worse, 3);
        assert!((d.worse_by - 0.06).abs() < 1e-9, "{}", d.worse_by);
        assert!((d.worsening_per_run - 0.02).abs() < 1e-9);
        let f = finding("n1", d);
        assert_eq!(f.severity, Severity::Warning);
        assert_eq!(f.kind, FindingKind::Drifting);
        assert!(
            f.message.contains("6.0% below its 7-run median of 400.0"),
            "{}",
            f.message
        );
        assert!(f.message.contains("falling 2.0% a run"), "{}", f.message);
    }

    #[test]
    fn one_slow_night_a_short_record_or_a_small_fall_is_no_drift() {
        let steady = history(&[400.0; 6]);
        // One night 10% down: noise until it holds.
        assert!(drifts(&steady, &p(360.0), &policy()).is_empty());
        // Down for three runs, but only 4%.
        let h = history(&[400.0, 400.0, 400.0, 400.0, 400.0, 385.0, 384.0]);
        assert!(drifts(&h, &p(384.0), &policy()).is_empty());
        // Too few earlier runs.
        let h = history(&[400.0, 380.0, 370.0]);
        assert!(drifts(&h, &p(360.0), &policy()).is_empty());
        // Turned off.
        let h = history(&[400.0, 400.0, 400.0, 400.0, 400.0, 380.0, 370.0]);
        let off = TrendPolicy {
            enabled: false,
            ..policy()
        };
        assert!(drifts(&h, &p(360.0), &off).is_empty());
        assert_eq!(drifts(&h, &p(360.0), &policy()).len(), 1);
    }

    #[test]
    fn a_number_that_moves_a_lot_between_healthy_runs_needs_a_larger_fall() {
        // The slowest host link of five healthy checks on 4 x H100 (GB/s): it moves about
        // 9% between checks (bench/results/trend-h100x4-2026-11-27.md).
        let host = |v: f64| TrendPoint {
            at: 0,
            host_gbps: Some(v),
            ..Default::default()
        };
        let mut h: Vec<TrendPoint> = [45.3, 53.4, 48.9, 50.3, 54.4]
            .iter()
            .map(|v| host(*v))
            .collect();
        h.extend([host(44.0), host(43.0)]);
        // 14% below the median: beyond 5%, within three of its spreads.
        assert!(drifts(&h, &host(43.0), &policy()).is_empty());
        // Halved (a PCIe link at half its width): a drift.
        h.extend([host(25.0), host(25.0)]);
        let d = drifts(&h, &host(25.0), &policy());
        assert_eq!(d.len(), 1, "{d:?}");
        assert!(d[0].spread > 0.05, "{}", d[0].spread);
        assert!(finding("n", &d[0]).message.contains("its runs move about"));
    }

    #[test]
    fn a_step_time_drifts_upward_and_a_faster_node_does_not_drift() {
        let step = |ms: f64| TrendPoint {
            at: 0,
            ddp_step_ms: Some(ms),
            ..Default::default()
        };
        let h: Vec<TrendPoint> = [40.0, 40.0, 40.0, 40.0, 40.0, 41.0, 42.0]
            .iter()
            .map(|v| step(*v))
            .collect();
        let d = drifts(&h, &step(43.0), &policy());
        assert_eq!(d.len(), 1);
        assert!(finding("n", &d[0]).message.contains("above its"));
        // Faster is never drift.
        let h = history(&[400.0, 400.0, 400.0, 400.0, 400.0, 430.0, 440.0]);
        assert!(drifts(&h, &p(450.0), &policy()).is_empty());
    }

    #[test]
    fn the_window_bounds_the_baseline() {
        // An old fast era outside the window does not count.
        let mut values = vec![500.0; 10];
        values.extend([400.0; 5]);
        let tight = TrendPolicy {
            window: 5,
            ..policy()
        };
        assert!(drifts(&history(&values), &p(399.0), &tight).is_empty());
    }

    #[test]
    fn a_fleet_wide_drift_is_info_and_one_node_stays_a_warning() {
        let d = || {
            drifts(
                &history(&[400.0, 400.0, 400.0, 400.0, 400.0, 380.0, 370.0]),
                &p(360.0),
                &policy(),
            )
        };
        let t = Thresholds::default();
        let bw = || vec![TrendMetric::BusBw];
        let all: Vec<Judged<'_>> = vec![
            ("a", bw(), d()),
            ("b", bw(), d()),
            ("c", bw(), d()),
            ("d", bw(), d()),
        ];
        let f = findings(&all, &t);
        assert_eq!(f.len(), 4);
        assert!(f.iter().all(|f| f.severity == Severity::Info), "{f:?}");
        assert!(f[0].message.contains("the fleet changed"));
        let one: Vec<Judged<'_>> = vec![
            ("a", bw(), d()),
            ("b", bw(), vec![]),
            ("c", bw(), vec![]),
            ("d", bw(), vec![]),
        ];
        let f = findings(&one, &t);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].severity, Severity::Warning);
    }
}
