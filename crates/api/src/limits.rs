//! `spec.limits`: the most nodes one run tests and the longest it runs, and how a run stands
//! against them (the nodes left out, when it ends, why it was stopped early).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};

/// Annotation on a FabricTestRun that cancels it: every pod it made is stopped (within its
/// grace period), its unfinished nodes end `NotMeasured` (`Cancelled`), and its status
/// says once no pod of it is left. The value is free text (who, why), shown in the status.
pub const CANCEL_ANNOTATION: &str = "gpufabric.io/cancel";

/// Condition of a stopped run (cancelled, or past `limits.maxDurationSeconds`): True once
/// no pod it made is left, so no GPU is held by it.
pub const CONDITION_GPUS_FREE: &str = "GpusFree";

/// Hard limits on each run of a test.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunLimits {
    /// Most nodes one run tests. Selected nodes beyond it (by name, the first ones kept) are
    /// not tested and listed in the run's `status.skipped` (`OverLimit`). Absent: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_nodes: Option<u32>,
    /// Longest a run runs, from its start: then every pod it made is stopped, its nodes
    /// without a result end `NotMeasured` (`MaxDuration`, never held against them) and the
    /// run is judged on the nodes it measured. Absent: no limit (each wave still ends at
    /// the agent's timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 10, max = 604800))]
    pub max_duration_seconds: Option<u32>,
}

impl RunLimits {
    pub fn is_empty(&self) -> bool {
        self == &RunLimits::default()
    }

    /// The nodes a run tests among `targets` (in the order given, the first kept) and those
    /// left out by `maxNodes`.
    pub fn split_nodes<T>(&self, mut targets: Vec<T>) -> (Vec<T>, Vec<T>) {
        match self.max_nodes {
            Some(max) if targets.len() > max as usize => {
                let over = targets.split_off(max as usize);
                (targets, over)
            }
            _ => (targets, Vec::new()),
        }
    }
}

/// Why a run was stopped before its nodes were done.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum StopCause {
    /// It ran `limits.maxDurationSeconds`.
    MaxDuration,
    /// The `gpufabric.io/cancel` annotation.
    Cancelled,
}

/// How a run stands against its limits.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LimitsStatus {
    /// Selected nodes left out by `limits.maxNodes`.
    #[serde(default)]
    pub nodes_over_limit: u32,
    /// When `limits.maxDurationSeconds` stops the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_time: Option<Time>,
    /// Why the run was stopped early, once it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<StopCause>,
    /// What stopped it, in words (the cancel annotation's value, the limit).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_nodes_keeps_the_first_nodes_and_leaves_out_the_rest() {
        let limits = RunLimits {
            max_nodes: Some(2),
            ..Default::default()
        };
        assert_eq!(
            limits.split_nodes(vec!["a", "b", "c", "d"]),
            (vec!["a", "b"], vec!["c", "d"])
        );
        assert_eq!(limits.split_nodes(vec!["a"]), (vec!["a"], vec![]));
        assert_eq!(
            RunLimits::default().split_nodes(vec!["a", "b", "c"]),
            (vec!["a", "b", "c"], vec![])
        );
    }
}
