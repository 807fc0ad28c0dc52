//! Repairs that cannot act now: one that waits for the reset of an open breaker, and one on
//! a node gpufabric does not hold. Each is said once, on the node.

use super::targets::{Repair, Wanted};
use super::{gate, publish_on_node};
use crate::context::Context;
use crate::quarantine::{self, NodeChange};
use gpufabric_api::keys::{ANNOTATION_REPAIRED, ANNOTATION_RESET_BREAKER};
use gpufabric_api::test::{FabricTest, NodeTarget};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::Api;

/// Says on each node whose repair waits for the breaker's reset that it waits (once: when
/// it was not waiting in `previous`), and declines the repair of each node gpufabric does
/// not hold: the annotation is removed with an Event that says why, so that it is said once
/// and no run starts.
pub async fn repairs_on_hold(
    test: &FabricTest,
    ctx: &Context,
    wanted: &Wanted,
    previous: &[NodeTarget],
) {
    let key = test.name_any();
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    for (node, why) in &wanted.waiting {
        if previous.iter().any(|t| &t.node == node && &t.reason == why) {
            continue;
        }
        let message = format!(
            "{why}: the breaker of FabricTest {key} is open and nothing is released until a person resets it (kubectl annotate fabrictest {key} {ANNOTATION_RESET_BREAKER}=now); the annotation stays and the node is tested after the reset"
        );
        publish_on_node(ctx, &nodes, node, false, "RepairWaiting", message).await;
    }
    for node in &wanted.not_held {
        let removed = quarantine::guarded(&nodes, node, |n| {
            match (super::targets::repair(n, false), gate::clear_repaired(n)) {
                (Repair::NotHeld, Some(p)) => NodeChange::Patch(p, ()),
                _ => NodeChange::Keep(()),
            }
        })
        .await;
        match removed {
            Ok(quarantine::Guarded::Patched(..)) => {
                let message = format!(
                    "marked repaired ({ANNOTATION_REPAIRED}), but no gpufabric quarantine and no validation gate hold it: a repair has nothing to release, so FabricTest {key} starts no run and removes the annotation; whoever cordoned the node uncordons it"
                );
                publish_on_node(ctx, &nodes, node, true, "RepairIgnored", message).await;
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(node = %node, error = %e, "could not remove a repaired annotation")
            }
        }
    }
}
