//! The one way the operator changes a Node: read it, decide from what was read, patch with
//! that resourceVersion under the operator's field manager, and on a conflict read and decide
//! again.

use super::refusal::NodeChangeError;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use tracing::info;

/// How often a node change is re-read and re-decided after a conflict before giving up.
pub(super) const MAX_ATTEMPTS: usize = 5;

/// The parameters of every node change: the field manager names this operator, so that the
/// node's managed fields tell its cordon from a person's ([`super::ownership::cordon_manager`]).
fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(gpufabric_api::keys::MANAGER.to_string()),
        ..PatchParams::default()
    }
}

/// What a guarded change decides from the node as read: the merge patch to send (it must
/// carry the node's resourceVersion) and what to remember of it, or nothing to send.
pub enum NodeChange<T> {
    Patch(serde_json::Value, T),
    Keep(T),
}

/// What a guarded change came to: the node as the patch left it, or as read when nothing
/// was sent; or the node is gone.
pub enum Guarded<T> {
    Patched(Node, T),
    Kept(Node, T),
    Gone,
}

/// Reads the node, decides, patches with the resourceVersion it was decided from (under the
/// operator's field manager), and on a conflict reads it again and decides again, up to
/// [`MAX_ATTEMPTS`] times. Every change the operator makes to a Node goes through here.
pub async fn guarded<T>(
    nodes: &Api<Node>,
    name: &str,
    decide: impl Fn(&Node) -> NodeChange<T>,
) -> Result<Guarded<T>, NodeChangeError> {
    for attempt in 1..=MAX_ATTEMPTS {
        let Some(node) = nodes.get_opt(name).await.map_err(NodeChangeError::Read)? else {
            return Ok(Guarded::Gone);
        };
        let (patch, kept) = match decide(&node) {
            NodeChange::Patch(patch, kept) => (patch, kept),
            NodeChange::Keep(kept) => return Ok(Guarded::Kept(node, kept)),
        };
        match nodes
            .patch(name, &patch_params(), &Patch::Merge(&patch))
            .await
        {
            Ok(node) => return Ok(Guarded::Patched(node, kept)),
            Err(kube::Error::Api(s)) if s.is_conflict() => {
                info!(
                    node = name,
                    attempt, "node changed while deciding; reading it again"
                );
            }
            Err(kube::Error::Api(s)) if s.is_not_found() => return Ok(Guarded::Gone),
            Err(e) => return Err(NodeChangeError::Patch(e)),
        }
    }
    Err(NodeChangeError::KeptChanging(MAX_ATTEMPTS))
}
