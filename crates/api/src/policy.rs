//! What counts as failing (thresholds) and what to do about it (quarantine policy).

use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::{Deserialize, Serialize};

/// Explicit expectations. Each one, when set, wins over the built-in GPU profile and the
/// fleet comparison for its metric. Bandwidths are in GB/s (10^9 bytes per second).
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct Thresholds {
    /// Floor on the peak all_reduce bus bandwidth of a node (GB/s). Needs a sweep that reaches
    /// 64 MiB (`suite.ncclSweep.maxBytes`): below that busbw is set by latency, not by the
    /// links, and a test that sets this floor with a shorter sweep is refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub nccl_bus_bw_gbps: Option<f64>,
    /// Ceiling on the fitted all_reduce latency of a node (microseconds). It fails a node
    /// only when the sweep is timed with CUDA graphs (`suite.ncclSweep.graphLaunches` > 0):
    /// host-launched small sizes also time the launching CPU, whose state moves them up to 3x
    /// on a healthy node, so there a latency over the ceiling is an Info finding.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub nccl_latency_us: Option<f64>,
    /// Floor on one-way copy bandwidth of every GPU pair (GB/s). Needs copies of at least
    /// 16 MiB (`suite.gpuPairs.bytes`); a test that sets it with shorter ones is refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub pair_bandwidth_gbps: Option<f64>,
    /// Floor on bidirectional copy bandwidth of every GPU pair, both directions summed (GB/s).
    /// Needs copies of at least 16 MiB, as `pairBandwidthGbps`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub pair_bidir_bandwidth_gbps: Option<f64>,
    /// Floor on host-to-device and device-to-host bandwidth per GPU (GB/s). Needs copies of
    /// at least 16 MiB, as `pairBandwidthGbps`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub host_bandwidth_gbps: Option<f64>,
    /// Floor on DDP weak-scaling efficiency at the largest GPU count (0..1).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0))]
    pub ddp_scaling_efficiency: Option<f64>,
    /// A GPU whose DDP compute time exceeds the node median by this ratio is a straggler.
    #[schemars(range(min = 1.0))]
    pub straggler_ratio: f64,
    /// Smallest relative gap from the fleet median that can make a node an outlier. Host
    /// copies fail a node only 25% below (or this gap, if larger); closer, an Info finding:
    /// they also time the host.
    #[schemars(range(min = 0.0, max = 1.0))]
    pub fleet_min_relative_gap: f64,
    /// Robust z-score (median absolute deviations, scaled) beyond which a node is an outlier.
    #[schemars(range(min = 0.0))]
    pub fleet_outlier_score: f64,
    /// Fewest comparable nodes (same GPU product and count) for a fleet comparison.
    #[schemars(range(min = 2))]
    pub fleet_min_nodes: u32,
    /// Growth of one GPU's NVLink replay, recovery and CRC error counters since the node's
    /// previous run beyond which the node fails (Critical). Unset: growth beyond the
    /// built-in 100 is reported as Info and fails nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub nvlink_error_growth: Option<u64>,
    /// Ceiling on GPU temperature (degrees Celsius).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub max_temperature_c: Option<f64>,
    /// The drift rule: each node against its own earlier runs of this test (a Warning,
    /// never a failure).
    pub trend: TrendPolicy,
}

/// The drift rule. A node's all_reduce busbw, worst GPU-pair copy, slowest host link and
/// DDP step time are kept over its last `window` runs of the test (the node annotation
/// `gpufabric.io/trend`); a run in which one of them is worse than the median of the node's
/// earlier runs by more than `driftPercent`, after `sustainedRuns` runs in a row worse than
/// that median, gives a Warning `Drifting` finding on a node that passes. It never fails or
/// quarantines a node. A changed suite starts the record again.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct TrendPolicy {
    /// Judge drift at all (the record is kept either way).
    pub enabled: bool,
    /// Runs of the node's own record its baseline is the median of.
    #[schemars(range(min = 2, max = 20))]
    pub window: u32,
    /// Fewest earlier runs before drift is judged.
    #[schemars(range(min = 2, max = 20))]
    pub min_runs: u32,
    /// How far below its baseline (above, for the step time) a number must be, percent.
    #[schemars(range(min = 1.0, max = 50.0))]
    pub drift_percent: f64,
    /// Runs in a row, this one included, worse than the baseline.
    #[schemars(range(min = 1, max = 10))]
    pub sustained_runs: u32,
}

impl Default for TrendPolicy {
    fn default() -> Self {
        TrendPolicy {
            enabled: true,
            window: 14,
            min_runs: 5,
            drift_percent: 5.0,
            sustained_runs: 3,
        }
    }
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds {
            nccl_bus_bw_gbps: None,
            nccl_latency_us: None,
            pair_bandwidth_gbps: None,
            pair_bidir_bandwidth_gbps: None,
            host_bandwidth_gbps: None,
            ddp_scaling_efficiency: None,
            straggler_ratio: 1.10,
            fleet_min_relative_gap: 0.10,
            fleet_outlier_score: 3.5,
            fleet_min_nodes: 4,
            nvlink_error_growth: None,
            max_temperature_c: None,
            trend: TrendPolicy::default(),
        }
    }
}

/// What the operator does to a node found at fault.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema,
)]
pub enum QuarantineMode {
    /// Findings and "would quarantine" in status only; no node is changed.
    #[default]
    Observe,
    /// Label the node `gpufabric.io/quarantined=true`.
    Label,
    /// Label and cordon (spec.unschedulable) the node.
    Cordon,
    /// Label and taint the node `gpufabric.io/quarantined:NoSchedule`.
    Taint,
}

/// Quarantine policy. All safety rules are enforced by the operator in one place.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", default)]
#[schemars(extend("x-kubernetes-validations" = [{"rule": "type(self.maxQuarantined) == int ? self.maxQuarantined >= 0 : self.maxQuarantined.matches('^(100|[1-9]?[0-9])%$')", "message": "quarantine.maxQuarantined must be a count >= 0 or a percent from 0% to 100%"}, {"rule": "type(self.maxQuarantinedGpus) == int ? self.maxQuarantinedGpus >= 0 : self.maxQuarantinedGpus.matches('^(100|[1-9]?[0-9])%$')", "message": "quarantine.maxQuarantinedGpus must be a count >= 0 or a percent from 0% to 100%"}]))]
pub struct QuarantinePolicy {
    /// Observe (default), Label, Cordon or Taint.
    pub mode: QuarantineMode,
    /// Most nodes this FabricTest may hold in quarantine at once: a count, or a percent of
    /// the selected nodes (rounded down, but at least 1 unless 0%).
    pub max_quarantined: IntOrString,
    /// Most GPUs this FabricTest may hold out of service by DRA device taints at once: a
    /// count, or a percent of the selected nodes' GPUs (rounded down, but at least 1 unless
    /// 0%). A GPU tainted alone takes one GPU of it and no node of `maxQuarantined`; a node
    /// quarantined as a node takes one node of `maxQuarantined` and none of it. A taint
    /// beyond it is refused, as a node beyond `maxQuarantined` is.
    pub max_quarantined_gpus: IntOrString,
    /// Consecutive failing runs before a node is quarantined.
    #[schemars(range(min = 1))]
    pub failures_to_quarantine: u32,
    /// Consecutive passing runs before a quarantined node is released.
    #[schemars(range(min = 1))]
    pub passes_to_release: u32,
    /// Retest failing nodes at once in a confirmation run; quarantine only if they fail again.
    pub confirm_retest: bool,
    /// Release the nodes this test quarantined when the FabricTest is deleted.
    pub release_on_delete: bool,
    /// The storm rule: when more than this percent of a run's measured nodes fail at once
    /// (and at least `stormMinNodes` were measured), the environment is suspect (a driver
    /// rollout, a bad image), not the nodes: nothing is quarantined or released and the
    /// test's breaker opens until a person resets it. 100 turns the rule off.
    #[schemars(range(min = 1, max = 100))]
    pub storm_threshold_percent: u32,
    /// Fewest measured nodes in a run for the storm rule to apply to it alone. A run of
    /// fewer is judged together with every node the test judged within the day before it, so
    /// that many small runs cannot pass a storm the rule would stop in one large run.
    #[schemars(range(min = 1))]
    pub storm_min_nodes: u32,
    /// Graduated taints: a node that failed but is not yet confirmed (a suspect) gets the
    /// taint `gpufabric.io/suspect:PreferNoSchedule` (the scheduler avoids it when it can),
    /// removed when it passes or is confirmed; a confirmed failure gets what `mode` does
    /// (in Taint mode, the NoSchedule quarantine taint). Not in Observe mode.
    pub graduated_taints: bool,
    /// Repeat offenders: a node this test quarantined this many times within
    /// `repeatOffenderWindowHours` is no longer released by passing runs; it stays
    /// quarantined until a person marks it repaired (annotation `gpufabric.io/repaired`).
    /// 0 turns the rule off.
    pub repeat_offender_quarantines: u32,
    /// The window of the repeat-offender rule, in hours.
    #[schemars(range(min = 1, max = 8760))]
    pub repeat_offender_window_hours: u32,
    /// On nodes whose GPUs are DRA devices (the cluster serves DeviceTaintRules), a
    /// confirmed GPU-level fault (a straggler, wrong results, slow compute or memory, the
    /// GPU's NVLink) takes only that GPU out of service with a DeviceTaintRule of this
    /// effect, in Cordon and Taint modes: NoSchedule (default) keeps new claims off it,
    /// NoExecute also evicts the pods using it. A node with more than half its GPUs tainted
    /// is quarantined as `mode` says.
    pub gpu_taint_effect: crate::device_taint::GpuTaintEffect,
}

/// Default of `repeatOffenderQuarantines`: three times...
pub const DEFAULT_REPEAT_OFFENDER_QUARANTINES: u32 = 3;
/// ...within a week.
pub const DEFAULT_REPEAT_OFFENDER_WINDOW_HOURS: u32 = 168;

/// Default of `stormThresholdPercent`.
pub const DEFAULT_STORM_THRESHOLD_PERCENT: u32 = 50;
/// Default of `stormMinNodes`.
pub const DEFAULT_STORM_MIN_NODES: u32 = 4;

impl Default for QuarantinePolicy {
    fn default() -> Self {
        QuarantinePolicy {
            mode: QuarantineMode::Observe,
            max_quarantined: IntOrString::String("10%".into()),
            max_quarantined_gpus: IntOrString::String("10%".into()),
            failures_to_quarantine: 1,
            passes_to_release: 3,
            confirm_retest: true,
            release_on_delete: true,
            storm_threshold_percent: DEFAULT_STORM_THRESHOLD_PERCENT,
            storm_min_nodes: DEFAULT_STORM_MIN_NODES,
            graduated_taints: false,
            repeat_offender_quarantines: DEFAULT_REPEAT_OFFENDER_QUARANTINES,
            repeat_offender_window_hours: DEFAULT_REPEAT_OFFENDER_WINDOW_HOURS,
            gpu_taint_effect: crate::device_taint::GpuTaintEffect::default(),
        }
    }
}

/// Why `quarantine.maxQuarantined` or `quarantine.maxQuarantinedGpus` gives no budget.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BudgetError {
    #[error("{field} is negative ({value})")]
    Negative { field: &'static str, value: i32 },
    #[error("{field} {value:?} is not a percent from 0% to 100%")]
    NotAPercent { field: &'static str, value: String },
}

impl QuarantinePolicy {
    /// The budget in nodes for a test that selects `selected` nodes, or an error for a
    /// malformed value. Percent rounds down but never below 1 (unless it is 0%).
    pub fn budget(&self, selected: usize) -> Result<usize, BudgetError> {
        share("maxQuarantined", &self.max_quarantined, selected)
    }

    /// The budget in GPUs held by device taints, for a test whose selected nodes have
    /// `selected_gpus` GPUs; rounded as [`QuarantinePolicy::budget`].
    pub fn gpu_budget(&self, selected_gpus: usize) -> Result<usize, BudgetError> {
        share(
            "maxQuarantinedGpus",
            &self.max_quarantined_gpus,
            selected_gpus,
        )
    }
}

/// `value` (a count, or a percent of `base` rounded down but at least 1 unless 0%) of the
/// budget field `field`.
fn share(field: &'static str, value: &IntOrString, base: usize) -> Result<usize, BudgetError> {
    match value {
        IntOrString::Int(n) if *n >= 0 => Ok(*n as usize),
        IntOrString::Int(n) => Err(BudgetError::Negative { field, value: *n }),
        IntOrString::String(s) => {
            let pct = s
                .strip_suffix('%')
                .and_then(|p| p.parse::<u32>().ok())
                .filter(|p| *p <= 100)
                .ok_or_else(|| BudgetError::NotAPercent {
                    field,
                    value: s.clone(),
                })?;
            if pct == 0 {
                return Ok(0);
            }
            Ok((base * pct as usize / 100).max(1))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_gpus(v: IntOrString) -> QuarantinePolicy {
        QuarantinePolicy {
            max_quarantined_gpus: v,
            ..QuarantinePolicy::default()
        }
    }

    #[test]
    fn the_gpu_budget_is_a_count_or_a_share_of_the_selected_gpus() {
        let p = QuarantinePolicy::default();
        assert_eq!(p.gpu_budget(80), Ok(8), "10% of 80 GPUs by default");
        assert_eq!(p.gpu_budget(8), Ok(1), "never below one GPU");
        assert_eq!(with_gpus(IntOrString::Int(3)).gpu_budget(800), Ok(3));
        assert_eq!(
            with_gpus(IntOrString::String("0%".into())).gpu_budget(800),
            Ok(0)
        );
        // The node budget is its own: a GPU budget leaves it as it was.
        assert_eq!(with_gpus(IntOrString::Int(3)).budget(100), Ok(10));
    }

    #[test]
    fn a_malformed_gpu_budget_names_its_field() {
        let e = with_gpus(IntOrString::String("half".into()))
            .gpu_budget(8)
            .expect_err("not a percent");
        assert!(e.to_string().starts_with("maxQuarantinedGpus "), "{e}");
        let e = with_gpus(IntOrString::Int(-1))
            .gpu_budget(8)
            .expect_err("negative");
        assert_eq!(e.to_string(), "maxQuarantinedGpus is negative (-1)");
    }
}
