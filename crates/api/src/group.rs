//! What the document of every rank of a test over several nodes begins with.

use crate::result::Backend;
use serde::{Deserialize, Serialize};

/// The first fields of a multi-node test's document (`ddp-nodes`, `nccl-nodes`): which
/// schema, which group and nodes, which rank wrote it, with which backend, when and for how
/// long. Each document flattens it first, so its fields lead the JSON in this order.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GroupHeader {
    /// The document's schema.
    pub schema: String,
    /// The rendezvous group.
    pub group: String,
    /// The group's nodes, by rank.
    pub nodes: Vec<String>,
    /// The rank that wrote this document.
    pub rank: u32,
    pub backend: Backend,
    /// RFC 3339.
    pub started_at: String,
    pub duration_s: f64,
    /// GPUs of each node (the same on every node).
    pub gpus_per_node: u32,
}

impl GroupHeader {
    /// The header of `rank` among `nodes` (by rank) in `group` as its test starts: no time
    /// taken yet, no GPUs agreed yet.
    pub fn new(
        schema: &str,
        group: String,
        nodes: Vec<String>,
        rank: u32,
        backend: Backend,
        started_at: String,
    ) -> GroupHeader {
        GroupHeader {
            schema: schema.into(),
            group,
            nodes,
            rank,
            backend,
            started_at,
            duration_s: 0.0,
            gpus_per_node: 0,
        }
    }
}
