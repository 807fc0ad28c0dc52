//! Why a run exists, where it stands and each node's verdict: what a run records and a
//! test's status keeps of its runs and nodes, so both CRDs (`crate::run`, `crate::test`)
//! build on this file and neither on the other's.

use crate::outcome::{HardwareFault, NodeOutcome};
use serde::{Deserialize, Serialize};

/// Why a run exists.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, schemars::JsonSchema)]
pub enum Trigger {
    /// The test has no schedule: one run when it was created.
    Creation,
    /// The cron schedule was due.
    Schedule,
    /// The `gpufabric.io/run-now` annotation.
    Manual,
    /// A retest of the suspects of an earlier run before quarantining them.
    Confirmation,
    /// A run over chosen nodes now: nodes that joined behind the validation gate, nodes
    /// back from repair, nodes another tool reported trouble on, or nodes named by hand
    /// (`spec.reasons` says which).
    Targeted,
}

impl Trigger {
    /// Whether `concurrencyPolicy: Replace` may delete an active run of this trigger: the
    /// runs of the schedule and those asked for by hand. A run that gates, confirms or tests
    /// a repair or a condition is never replaced (the nodes it tests would wait again, or be
    /// judged without their confirmation).
    pub fn is_replaceable(self) -> bool {
        match self {
            Trigger::Creation | Trigger::Schedule | Trigger::Manual => true,
            Trigger::Confirmation | Trigger::Targeted => false,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Creation => "creation",
            Trigger::Schedule => "schedule",
            Trigger::Manual => "manual",
            Trigger::Confirmation => "confirmation",
            Trigger::Targeted => "targeted",
        }
    }
}

/// Phase of a run.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default, schemars::JsonSchema,
)]
pub enum RunPhase {
    /// Created; nodes not yet resolved.
    #[default]
    Pending,
    /// Pods created; waiting for results.
    Running,
    /// Every node produced a result (some may have failed their checks).
    Succeeded,
    /// The run could not be carried out (no nodes, invalid spec, deadline passed).
    Failed,
}

impl RunPhase {
    pub fn is_finished(self) -> bool {
        matches!(self, RunPhase::Succeeded | RunPhase::Failed)
    }
}

/// Verdict on one node.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, Default, schemars::JsonSchema,
)]
pub enum NodeVerdict {
    /// Not measured yet.
    #[default]
    Pending,
    /// Pod running.
    Running,
    /// Measured; nothing critical found.
    Passed,
    /// Measured; at least one critical finding.
    Failed,
    /// A hardware fault the agent saw instead of a result: a GPU missing or unusable, the
    /// agent killed while driving the GPUs.
    Errored,
    /// The agent had started and hung past the deadline (a hung collective or copy).
    Timeout,
    /// Not measured, for a reason outside the node's hardware (see `notMeasured`): never
    /// counts against the node.
    NotMeasured,
}

impl NodeVerdict {
    /// The verdict's name as the API spells it (metric labels, logs).
    pub fn name(self) -> &'static str {
        match self {
            NodeVerdict::Pending => "Pending",
            NodeVerdict::Running => "Running",
            NodeVerdict::Passed => "Passed",
            NodeVerdict::Failed => "Failed",
            NodeVerdict::Errored => "Errored",
            NodeVerdict::Timeout => "Timeout",
            NodeVerdict::NotMeasured => "NotMeasured",
        }
    }

    pub fn is_final(self) -> bool {
        !matches!(self, NodeVerdict::Pending | NodeVerdict::Running)
    }
    /// The node was measured, or the agent saw a hardware fault: the verdict says something
    /// about the node's hardware.
    pub fn is_measured(self) -> bool {
        self.is_final() && self != NodeVerdict::NotMeasured
    }
    /// Failed, errored and timed-out nodes all count against a node's health; a node that
    /// was not measured never does.
    pub fn is_bad(self) -> bool {
        matches!(
            self,
            NodeVerdict::Failed | NodeVerdict::Errored | NodeVerdict::Timeout
        )
    }

    /// A node's verdict from its outcome before the run's evaluation, which judges the
    /// measured nodes: a measurement waits for it (`Running`), a hang is a `Timeout`, any
    /// other hardware fault `Errored`, and a node not measured stays `NotMeasured`.
    pub fn provisional(outcome: &NodeOutcome) -> NodeVerdict {
        match outcome {
            NodeOutcome::Measured(_) => NodeVerdict::Running,
            NodeOutcome::HardwareFault {
                fault: HardwareFault::Hang,
                ..
            } => NodeVerdict::Timeout,
            NodeOutcome::HardwareFault { .. } => NodeVerdict::Errored,
            NodeOutcome::NotMeasured { .. } => NodeVerdict::NotMeasured,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replace_deletes_only_scheduled_and_manual_runs() {
        let replaceable: Vec<Trigger> = [
            Trigger::Creation,
            Trigger::Schedule,
            Trigger::Manual,
            Trigger::Confirmation,
            Trigger::Targeted,
        ]
        .into_iter()
        .filter(|t| t.is_replaceable())
        .collect();
        assert_eq!(
            replaceable,
            [Trigger::Creation, Trigger::Schedule, Trigger::Manual]
        );
    }

    #[test]
    fn verdict_names_are_the_api_spelling() {
        for v in [
            NodeVerdict::Pending,
            NodeVerdict::Running,
            NodeVerdict::Passed,
            NodeVerdict::Failed,
            NodeVerdict::Errored,
            NodeVerdict::Timeout,
            NodeVerdict::NotMeasured,
        ] {
            assert_eq!(
                serde_json::to_value(v).ok(),
                Some(serde_json::Value::String(v.name().into()))
            );
        }
    }
}
