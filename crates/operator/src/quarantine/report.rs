//! How every executor action is reported: an Event on the node and on the FabricTest when
//! it happens, then a log line, a metric and the status entry.

use super::executor::Executor;
use super::outcome::{Action, ActionTaken};
use super::refusal::{Change, NodeChangeError, NodeFailure, Refusal};
use crate::events::{EventType, event};
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::Resource;
use tracing::{info, warn};

/// One node action to note in the outcome, once its Events are published.
pub(super) struct Report {
    node: String,
    action: Action,
    message: String,
    /// The failed change, for [`Action::Failed`].
    failure: Option<NodeFailure>,
}

impl Executor<'_> {
    /// Record node `name` left alone for `refusal` (`node`: as last read, when it was):
    /// the action and the sentence are the refusal's own.
    pub(super) async fn refused(&mut self, name: &str, node: Option<&Node>, refusal: &Refusal) {
        let report = self.report_refusal(name, node, refusal).await;
        self.note(report);
    }

    /// Record one action on node `name` (`node`: as last read, when it was).
    pub(super) async fn act(
        &mut self,
        name: &str,
        node: Option<&Node>,
        action: Action,
        message: String,
    ) {
        let report = self.report(name, node, action, message).await;
        self.note(report);
    }

    /// [`Self::report`] of a refusal.
    pub(super) async fn report_refusal(
        &self,
        name: &str,
        node: Option<&Node>,
        refusal: &Refusal,
    ) -> Report {
        self.report(name, node, Action::of_refusal(refusal), refusal.to_string())
            .await
    }

    /// [`Self::report`] of a change the API server refused or failed, with the failure.
    pub(super) async fn report_failure(
        &self,
        name: &str,
        change: Change,
        error: NodeChangeError,
    ) -> Report {
        let message = format!("could not {change}: {error}");
        let mut report = self.report(name, None, Action::Failed, message).await;
        report.failure = Some(NodeFailure {
            node: name.to_string(),
            change,
            error,
        });
        report
    }

    /// Publishes the Events of one action on node `name` (`node`: as last read, when it
    /// was; else read for its uid) and returns what [`Self::note`] records of it. Takes the
    /// executor shared, so that changes on different nodes report at once.
    pub(super) async fn report(
        &self,
        name: &str,
        node: Option<&Node>,
        action: Action,
        message: String,
    ) -> Report {
        let node_ref = match node {
            Some(n) => Some(n.object_ref(&())),
            // Not read here: read it for its uid, so `kubectl describe node` shows the Event.
            None => match self.nodes.get_opt(name).await {
                Ok(Some(n)) => Some(n.object_ref(&())),
                _ => None,
            },
        };
        if let Some(r) = &node_ref {
            let ev = event(
                action.event_type(),
                action.reason(),
                action.reason(),
                message.clone(),
                Some(self.test.object_ref(&())),
            );
            self.events.publish(r, ev).await;
        }
        self.event_on_test(
            action.event_type(),
            action.reason(),
            format!("node {name}: {message}"),
            node_ref,
        )
        .await;
        Report {
            node: name.to_string(),
            action,
            message,
            failure: None,
        }
    }

    /// Records one reported action: a log line, the metric, the outcome's entry (and its
    /// failure, when the change failed). Each report is noted once.
    pub(super) fn note(&mut self, report: Report) {
        let Report {
            node,
            action,
            message,
            failure,
        } = report;
        match action.event_type() {
            EventType::Normal => {
                info!(node = %node, test = %self.key, action = action.as_str(), "{message}")
            }
            EventType::Warning => {
                warn!(node = %node, test = %self.key, action = action.as_str(), "{message}")
            }
        }
        self.metrics.count(&self.key, action.as_str());
        if !matches!(action, Action::Quarantined | Action::Released) {
            self.outcome.held_back.insert(node.clone(), message.clone());
        }
        self.outcome.errors.extend(failure);
        self.outcome.actions.push(ActionTaken {
            node,
            action,
            message,
        });
    }

    /// The budget could not be read: nothing new is quarantined, and the test says why.
    pub(super) async fn invalid_budget(&self, error: &str) {
        warn!(test = %self.key, "{error}; nothing new is quarantined");
        self.event_on_test(
            EventType::Warning,
            "InvalidBudget",
            format!(
                "{error}; nothing new is quarantined until spec.quarantine.maxQuarantined is fixed"
            ),
            None,
        )
        .await;
    }

    /// An Event on the FabricTest, about `related` when given.
    pub(super) async fn event_on_test(
        &self,
        type_: EventType,
        reason: &str,
        note: String,
        related: Option<ObjectReference>,
    ) {
        let ev = event(type_, reason, reason, note, related);
        self.events.publish(&self.test.object_ref(&()), ev).await;
    }
}
