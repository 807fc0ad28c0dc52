//! Kubernetes Events on FabricTests and runs. Publishing is best effort: a failed Event is
//! logged, never fails a reconcile.

use crate::context::Context;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType};

/// Publishes a Normal event.
pub async fn normal(ctx: &Context, on: &ObjectReference, reason: &str, action: &str, note: String) {
    publish(ctx, on, EventType::Normal, reason, action, note).await;
}

/// Publishes a Warning event.
pub async fn warning(
    ctx: &Context,
    on: &ObjectReference,
    reason: &str,
    action: &str,
    note: String,
) {
    publish(ctx, on, EventType::Warning, reason, action, note).await;
}

async fn publish(
    ctx: &Context,
    on: &ObjectReference,
    type_: EventType,
    reason: &str,
    action: &str,
    mut note: String,
) {
    if note.len() > 1000 {
        let mut end = 1000;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
    }
    let ev = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note),
        action: action.to_string(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&ev, on).await {
        tracing::warn!(reason, error = %e, "could not publish event");
    }
}
