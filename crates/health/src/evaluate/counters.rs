//! Error counters against the node's previous run: NVML counts NVLink errors since the
//! driver loaded, so only their growth between runs says a link is marginal.
//!
//! # Rules
//! 1. Without a previous record (first run, or a record that could not be read) nothing is
//!    judged.
//! 2. A record with another GPU count is not compared (GPU indices may have moved).
//! 3. A GPU whose count went down (driver reload, reboot) is not judged this time.
//! 4. A GPU whose count grew by more than `thresholds.nvlinkErrorGrowth` is Critical
//!    `NvlinkErrorsGrowing`; with the threshold unset, growth over
//!    [`DEFAULT_NVLINK_ERROR_GROWTH`] is Info (healthy H200 links added none over four full
//!    checks, but one pair of machines is no basis for failing a fleet's nodes by default).

use gpufabric_api::counters::CounterBaseline;
use gpufabric_api::findings::{ExpectationSource, Finding, FindingKind, Metric, Severity, Subject};
use gpufabric_api::policy::Thresholds;
use gpufabric_api::result::CompactResult;

/// Growth between runs reported (as Info) when `thresholds.nvlinkErrorGrowth` is unset.
pub const DEFAULT_NVLINK_ERROR_GROWTH: u64 = 100;

pub(super) fn check_counter_growth(
    node: &str,
    r: &CompactResult,
    baseline: Option<&CounterBaseline>,
    t: &Thresholds,
    out: &mut Vec<Finding>,
) {
    let Some(before) = baseline else {
        return;
    };
    let gpus = (r.gpus as usize).min(r.health.len());
    if before.nvlink.len() != gpus {
        return;
    }
    let (limit, severity, source) = match t.nvlink_error_growth {
        Some(limit) => (limit, Severity::Critical, ExpectationSource::Threshold),
        None => (
            DEFAULT_NVLINK_ERROR_GROWTH,
            Severity::Info,
            ExpectationSource::Rule,
        ),
    };
    for (i, (h, was)) in r.health.iter().zip(&before.nvlink).enumerate() {
        let now = h.nvlink_errors;
        let Some(growth) = now.checked_sub(*was) else {
            continue;
        };
        if growth <= limit {
            continue;
        }
        let gpu = i as u32;
        let since = crate::since_run(&before.run, &before.at);
        let consequence = if severity == Severity::Critical {
            "a link is marginal: drain the node, read nvidia-smi nvlink -e -i {gpu} for the link, and reseat or replace the GPU or baseboard"
        } else {
            "a link may be marginal: read nvidia-smi nvlink -e -i {gpu}; set thresholds.nvlinkErrorGrowth to fail nodes on it"
        }
        .replace("{gpu}", &gpu.to_string());
        out.push(
            Finding::new(
                FindingKind::NvlinkErrorsGrowing,
                Subject::gpu(node, gpu),
                Metric::NvlinkErrorGrowth,
                severity,
                format!(
                    "GPU {gpu} on {node}: NVLink replay, recovery and CRC errors grew by {growth} (from {was} to {now}) {since}, over the threshold of {limit}; {consequence}."
                ),
            )
            .with_evidence(growth as f64, limit as f64, "errors", source),
        );
    }
}

/// The record to keep after a run: this run's counters, unless the run found a GPU's
/// counters growing too fast (then the previous record stays, so that a confirmation run
/// soon after compares against the same starting point and the growth is not forgotten;
/// a driver reload, which lowers the counts, ends that). None: nothing new to keep.
pub fn next_baseline(
    node: &str,
    r: &CompactResult,
    previous: Option<&CounterBaseline>,
    findings: &[Finding],
    run: &str,
    at: &str,
) -> Option<CounterBaseline> {
    let growing = findings
        .iter()
        .any(|f| f.kind == FindingKind::NvlinkErrorsGrowing && f.subject.node_name() == node);
    if growing {
        return None;
    }
    let next = CounterBaseline::of(r, run, at)?;
    match previous {
        Some(p) if p.same_counts(&next) => None,
        _ => Some(next),
    }
}
