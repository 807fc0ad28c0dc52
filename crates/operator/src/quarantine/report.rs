//! How every executor action is reported: a log line, a metric, the status entry, and an
//! Event on the node and on the FabricTest.

use super::apply::Executor;
use super::outcome::{Action, ActionTaken};
use super::refusal::Refusal;
use crate::events::{EventType, event};
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::Resource;
use tracing::{info, warn};

impl Executor<'_> {
    /// Record node `name` left alone for `refusal` (`node`: as last read, when it was):
    /// the action and the sentence are the refusal's own.
    pub(super) async fn refused(&mut self, name: &str, node: Option<&Node>, refusal: &Refusal) {
        self.act(name, node, Action::of_refusal(refusal), refusal.to_string())
            .await;
    }

    /// Record one action on node `name` (`node`: as last read, when it was).
    pub(super) async fn act(
        &mut self,
        name: &str,
        node: Option<&Node>,
        action: Action,
        message: String,
    ) {
        match action.event_type() {
            EventType::Normal => {
                info!(node = name, test = %self.key, action = action.as_str(), "{message}")
            }
            EventType::Warning => {
                warn!(node = name, test = %self.key, action = action.as_str(), "{message}")
            }
        }
        self.metrics.count(&self.key, action.as_str());
        if !matches!(action, Action::Quarantined | Action::Released) {
            self.outcome
                .held_back
                .insert(name.to_string(), message.clone());
        }
        self.outcome.actions.push(ActionTaken {
            node: name.to_string(),
            action,
            message: message.clone(),
        });
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
