//! Pure functions: result documents + policy -> findings, per-node verdicts, node history
//! and quarantine plans. No I/O, no Kubernetes client, no async. The rules, in the order
//! they apply, are in this crate's README.md.

#![forbid(unsafe_code)]

pub mod evaluate;
pub mod fleet;
pub mod floors;
pub mod gpu_quarantine;
pub mod history;
pub mod links;
pub mod nics;
pub mod pairs;
pub mod probe;
pub mod profiles;
pub mod quarantine;
pub mod scaling;

pub use evaluate::{Evaluation, NodeInput, NodeOutcome, evaluate};
pub use quarantine::{
    ClusterCap, GpuHold, Guards, Hold, NodeFacts, Plan, Selected, Storm, plan, plan_guarded,
};

/// What a counter's growth is measured from, for a finding's message: `since run R at T`,
/// or `since run R` for a record without a time.
pub(crate) fn since_run(run: &str, at: &str) -> String {
    format!("since run {run}{}", at_time(at))
}

/// ` at T`, or nothing for a record without a time.
pub(crate) fn at_time(at: &str) -> String {
    if at.is_empty() {
        String::new()
    } else {
        format!(" at {at}")
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn since_run_names_the_time_only_when_the_record_has_one() {
        assert_eq!(
            super::since_run("nightly-1", "2026-11-24T02:00:00Z"),
            "since run nightly-1 at 2026-11-24T02:00:00Z"
        );
        assert_eq!(super::since_run("nightly-1", ""), "since run nightly-1");
    }
}
