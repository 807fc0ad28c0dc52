//! What the executor did to each node ([`Action`], [`Outcome`]), and how that reads in the
//! FabricTest status.

use super::refusal::{NodeFailure, Refusal};
use crate::events::EventType;
use gpufabric_api::test::FabricTestStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::BTreeMap;

/// What one node action was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Action {
    /// The node was labeled/cordoned/tainted and the record written.
    Quarantined,
    /// What the record named was undone and the record removed.
    Released,
    /// Would be quarantined, but the budget is spent.
    OverBudget,
    /// Would be quarantined, but the cluster-wide cap on nodes held is reached.
    OverClusterCap,
    /// Would be quarantined, but the mode is Observe.
    WouldQuarantine,
    /// Would be released, but the mode is Observe.
    WouldRelease,
    /// Not ours to touch: cordoned or tainted by someone else, quarantined by another
    /// FabricTest, gone. Normal: a person's cordon is not a problem to warn about.
    LeftAlone,
    /// Left alone because its quarantine annotation is unreadable: nobody can tell what
    /// was done to the node, so a person has to look (a Warning).
    Unreadable,
    /// The API server refused or failed the change; retried on the next reconcile.
    Failed,
    /// Someone else undid the quarantine; the test stopped holding the node.
    TakenBack,
}

impl Action {
    /// How a refusal is reported: a node nobody can explain is a Warning for a person; a
    /// node that is someone else's is normal.
    pub fn of_refusal(refusal: &Refusal) -> Action {
        match refusal {
            Refusal::UnreadableRecord(_) => Action::Unreadable,
            _ => Action::LeftAlone,
        }
    }

    /// The metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Quarantined => "quarantined",
            Action::Released => "released",
            Action::OverBudget => "over_budget",
            Action::OverClusterCap => "over_cluster_cap",
            Action::WouldQuarantine => "would_quarantine",
            Action::WouldRelease => "would_release",
            Action::LeftAlone => "left_alone",
            Action::Unreadable => "unreadable_record",
            Action::Failed => "failed",
            Action::TakenBack => "taken_back",
        }
    }

    /// The Event reason.
    pub fn reason(self) -> &'static str {
        match self {
            Action::Quarantined => "Quarantined",
            Action::Released => "Released",
            Action::OverBudget => "OverBudget",
            Action::OverClusterCap => "OverClusterCap",
            Action::WouldQuarantine => "WouldQuarantine",
            Action::WouldRelease => "WouldRelease",
            Action::LeftAlone => "LeftAlone",
            Action::Unreadable => "QuarantineRecordUnreadable",
            Action::Failed => "QuarantineFailed",
            Action::TakenBack => "QuarantineTakenBack",
        }
    }

    pub(super) fn event_type(self) -> EventType {
        match self {
            Action::Quarantined
            | Action::OverBudget
            | Action::OverClusterCap
            | Action::Failed
            | Action::Unreadable => EventType::Warning,
            _ => EventType::Normal,
        }
    }
}

/// One thing the executor did (or declined to do) to one node.
#[derive(Clone, Debug, PartialEq)]
pub struct ActionTaken {
    pub node: String,
    pub action: Action,
    /// A sentence for Events, logs and status.
    pub message: String,
}

/// What [`super::execute`] did, and what the FabricTest status should say.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Every node this test holds in quarantine after the executor ran (in the whole
    /// cluster, not only the nodes of the plan), with when it was quarantined.
    pub quarantined: BTreeMap<String, Time>,
    /// Nodes not acted on, with why (for `NodeHealth.heldBack`).
    pub held_back: BTreeMap<String, String>,
    /// Every action, in the order taken.
    pub actions: Vec<ActionTaken>,
    /// Node changes that failed (API errors); the controller should requeue soon. The
    /// plan can be executed again safely: finished steps are no-ops the second time.
    pub errors: Vec<NodeFailure>,
}

impl Outcome {
    /// Nodes this test holds in quarantine, sorted.
    pub fn quarantined_nodes(&self) -> Vec<String> {
        self.quarantined.keys().cloned().collect()
    }

    /// The nodes an action of `kind` was taken on.
    pub fn nodes_with(&self, kind: Action) -> Vec<String> {
        self.actions
            .iter()
            .filter(|a| a.action == kind)
            .map(|a| a.node.clone())
            .collect()
    }

    /// Write the quarantine part of the status: `quarantinedNodes`, `quarantinedCount`,
    /// and each `nodes[]` entry's `quarantinedSince` and `heldBack` (which is replaced: a
    /// node not held back in this execution has none). Each node's standing is decided
    /// from them once the lifecycle ran (`status::standing::settle`).
    pub fn apply_to_status(&self, status: &mut FabricTestStatus) {
        status.quarantined_nodes = self.quarantined_nodes();
        status.quarantined_count = u32::try_from(self.quarantined.len()).unwrap_or(u32::MAX);
        for n in &mut status.nodes {
            let since = self.quarantined.get(&n.node);
            n.quarantined_since = since.cloned();
            n.held_back = self.held_back.get(&n.node).cloned();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_unreadable_record_is_a_warning() {
        assert_eq!(
            Action::of_refusal(&Refusal::UnreadableRecord("bad".into())),
            Action::Unreadable
        );
        for r in [
            Refusal::Gone,
            Refusal::OtherTest("team-b/x".into()),
            Refusal::CordonedByOthers,
            Refusal::TaintedByOthers,
        ] {
            assert_eq!(Action::of_refusal(&r), Action::LeftAlone, "{r}");
        }
    }

    use gpufabric_api::run::NodeVerdict;
    use gpufabric_api::test::NodeHealth;

    #[test]
    fn status_shows_what_is_quarantined_and_what_is_held_back() {
        let since = Time("2026-11-21T02:00:00Z".parse().expect("time"));
        let outcome = Outcome {
            quarantined: BTreeMap::from([("n1".to_string(), since.clone())]),
            held_back: BTreeMap::from([("n2".to_string(), "over budget".to_string())]),
            ..Default::default()
        };
        let health = |n: &str| NodeHealth {
            node: n.into(),
            verdict: NodeVerdict::Failed,
            consecutive_failures: 2,
            consecutive_passes: 0,
            quarantined_since: None,
            held_back: Some("stale".into()),
            last_finding: None,
            last_run: None,
            ..Default::default()
        };
        let mut status = FabricTestStatus {
            nodes: vec![health("n1"), health("n2"), health("n3")],
            ..Default::default()
        };
        outcome.apply_to_status(&mut status);
        assert_eq!(status.quarantined_nodes, vec!["n1".to_string()]);
        assert_eq!(status.quarantined_count, 1);
        assert_eq!(status.nodes[0].quarantined_since, Some(since));
        assert_eq!(status.nodes[0].held_back, None);
        assert_eq!(status.nodes[1].quarantined_since, None);
        assert_eq!(status.nodes[1].held_back.as_deref(), Some("over budget"));
        assert!(status.nodes[2].quarantined_since.is_none() && status.nodes[2].held_back.is_none());
    }
}
