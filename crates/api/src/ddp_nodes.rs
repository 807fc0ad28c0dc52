//! The multi-node DDP probe's document: the node probe's synthetic training step (an MLP
//! step with bucketed gradient all-reduce overlapped with backward), weak-scaled over 1, 2,
//! 4, ... nodes with all their GPUs, as one rank (node) of the group writes it.

use crate::pair::NotMeasured;
use crate::result::{Backend, DdpPoint, PhaseError};
use serde::{Deserialize, Serialize};

/// Schema of [`DdpNodesResult`].
pub const DDP_NODES_SCHEMA: &str = "gpufabric.io/ddp-nodes/v1";

/// One node count of the probe.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DdpNodesPoint {
    /// Nodes in this point: the first `nodes` of the group, by rank.
    pub nodes: u32,
    /// Step time, throughput and efficiency over all `nodes x G` GPUs; the efficiency is
    /// throughput per GPU relative to the one-node point. `gpuIndices` are global ranks.
    #[serde(flatten)]
    pub point: DdpPoint,
    /// Compute alone (forward + backward, no all-reduce), slowest GPU, ms.
    pub compute_alone_ms: f64,
    /// The gradient all-reduces alone, ms.
    pub comm_alone_ms: f64,
    /// Step time not covered by compute: the communication training would wait for, ms.
    pub exposed_comm_ms: f64,
    /// Each node's compute alone (its slowest GPU), ms, by rank.
    pub node_compute_ms: Vec<f64>,
}

/// A node whose GPUs compute the same step markedly slower than the fastest node's: in
/// data-parallel training every other node waits for it at each step.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DdpStraggler {
    pub node: String,
    /// Its compute alone, ms (slowest GPU).
    pub compute_ms: f64,
    /// The fastest node's, ms.
    pub fastest_ms: f64,
    /// How much slower, percent.
    pub slower_percent: f64,
}

/// The document each rank of a multi-node DDP probe writes (its termination message and
/// last stdout line). Every rank writes the same points: the ranks gather each node's times.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DdpNodesResult {
    /// Always [`DDP_NODES_SCHEMA`].
    pub schema: String,
    /// The rendezvous group.
    pub group: String,
    /// The nodes, by rank.
    pub nodes: Vec<String>,
    /// The rank that wrote this document.
    pub rank: u32,
    pub backend: Backend,
    /// RFC 3339.
    pub started_at: String,
    pub duration_s: f64,
    /// GPUs of each node (the same on every node).
    pub gpus_per_node: u32,
    pub hidden: u32,
    pub layers: u32,
    pub batch_per_gpu: u32,
    /// Gradient bucket sizes in bytes, in all-reduce order.
    pub buckets: Vec<u64>,
    pub points: Vec<DdpNodesPoint>,
    /// Nodes slower than the fastest by more than the straggler threshold, measured at the
    /// largest node count.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stragglers: Vec<DdpStraggler>,
    /// Set when the probe could not be measured (a rank that never arrived, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_measured: Option<NotMeasured>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<PhaseError>,
}
