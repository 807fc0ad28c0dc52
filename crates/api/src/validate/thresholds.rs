//! The thresholds' checks: floors and ceilings, the drift rule, and suites that reach them.

use super::Checker;
use crate::policy::Thresholds;
use crate::test::FabricTestSpec;

/// A bus bandwidth threshold needs a sweep that reaches the sizes where busbw is bandwidth
/// ([`crate::result::BANDWIDTH_BYTES`]); below them the evaluation cannot judge it.
pub(super) fn check_bandwidth_reach(c: &mut Checker, spec: &FabricTestSpec) {
    let nccl = &spec.suite.nccl_sweep;
    let judged = nccl.enabled
        && spec.thresholds.nccl_bus_bw_gbps.is_some()
        && nccl
            .collectives
            .contains(&crate::suite::Collective::AllReduce);
    let Some(&largest) = nccl.sizes().last() else {
        return;
    };
    let min = crate::result::BANDWIDTH_BYTES;
    c.check(
        !judged || largest >= min,
        "thresholds.ncclBusBwGbps",
        || {
            format!(
                "needs a sweep that reaches {} MiB, where busbw nears what the links carry; suite.ncclSweep ends at {largest} bytes: raise suite.ncclSweep.maxBytes, or drop the threshold",
                min >> 20
            )
        },
    );
}

/// Copy bandwidth thresholds need copies long enough to show the links
/// ([`crate::result::COPY_BYTES`]).
pub(super) fn check_copy_reach(c: &mut Checker, spec: &FabricTestSpec) {
    let pairs = &spec.suite.gpu_pairs;
    let t = &spec.thresholds;
    let min = crate::result::COPY_BYTES;
    if !pairs.enabled || pairs.bytes >= min {
        return;
    }
    for (field, set) in [
        (
            "thresholds.pairBandwidthGbps",
            t.pair_bandwidth_gbps.is_some(),
        ),
        (
            "thresholds.pairBidirBandwidthGbps",
            t.pair_bidir_bandwidth_gbps.is_some(),
        ),
        (
            "thresholds.hostBandwidthGbps",
            t.host_bandwidth_gbps.is_some(),
        ),
    ] {
        c.check(!set, field, || {
            format!(
                "needs copies of at least {} MiB, where they near what the links carry; suite.gpuPairs.bytes is {}: raise it, or drop the threshold",
                min >> 20,
                pairs.bytes
            )
        });
    }
}

pub(super) fn check_thresholds(c: &mut Checker, t: &Thresholds) {
    let floors = [
        ("thresholds.ncclBusBwGbps", t.nccl_bus_bw_gbps),
        ("thresholds.ncclLatencyUs", t.nccl_latency_us),
        ("thresholds.pairBandwidthGbps", t.pair_bandwidth_gbps),
        (
            "thresholds.pairBidirBandwidthGbps",
            t.pair_bidir_bandwidth_gbps,
        ),
        ("thresholds.hostBandwidthGbps", t.host_bandwidth_gbps),
        ("thresholds.maxTemperatureC", t.max_temperature_c),
    ];
    for (field, value) in floors {
        if let Some(v) = value {
            c.check(v.is_finite() && v >= 0.0, field, || {
                format!("must be a number >= 0 (got {v})")
            });
        }
    }
    if let Some(g) = t.nvlink_error_growth {
        c.check(g >= 1, "thresholds.nvlinkErrorGrowth", || {
            format!("must be at least 1 (got {g})")
        });
    }
    if let Some(e) = t.ddp_scaling_efficiency {
        c.check(
            (0.0..=1.0).contains(&e),
            "thresholds.ddpScalingEfficiency",
            || format!("must be between 0 and 1 (got {e})"),
        );
    }
    c.check(
        t.straggler_ratio.is_finite() && t.straggler_ratio >= 1.0,
        "thresholds.stragglerRatio",
        || format!("must be at least 1.0 (got {})", t.straggler_ratio),
    );
    c.check(
        (0.0..=1.0).contains(&t.fleet_min_relative_gap),
        "thresholds.fleetMinRelativeGap",
        || format!("must be between 0 and 1 (got {})", t.fleet_min_relative_gap),
    );
    c.check(
        t.fleet_outlier_score.is_finite() && t.fleet_outlier_score >= 0.0,
        "thresholds.fleetOutlierScore",
        || format!("must be a number >= 0 (got {})", t.fleet_outlier_score),
    );
    c.check(t.fleet_min_nodes >= 2, "thresholds.fleetMinNodes", || {
        format!("must be at least 2 (got {})", t.fleet_min_nodes)
    });
    check_trend(c, &t.trend);
}

/// The drift rule's settings: a record it can judge from.
fn check_trend(c: &mut Checker, t: &crate::policy::TrendPolicy) {
    let most = crate::trend::MAX_POINTS as u32;
    c.check(
        (2..=most).contains(&t.window),
        "thresholds.trend.window",
        || format!("must be from 2 to {most} runs (got {})", t.window),
    );
    c.check(
        t.min_runs >= 2 && t.min_runs <= t.window,
        "thresholds.trend.minRuns",
        || {
            format!(
                "must be at least 2 and at most window ({}): the record keeps no more (got {})",
                t.window, t.min_runs
            )
        },
    );
    c.check(
        t.drift_percent.is_finite() && (1.0..=50.0).contains(&t.drift_percent),
        "thresholds.trend.driftPercent",
        || format!("must be from 1 to 50 (got {})", t.drift_percent),
    );
    c.check(
        (1..=10).contains(&t.sustained_runs),
        "thresholds.trend.sustainedRuns",
        || format!("must be from 1 to 10 (got {})", t.sustained_runs),
    );
}
