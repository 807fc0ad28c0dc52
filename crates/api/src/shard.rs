//! `FabricTestRunShard`: the per-node results of one slice of a run. A run over N nodes
//! keeps its per-node results in `ceil(N / NODES_PER_SHARD)` shards, owned by the run and
//! deleted with it, so that no object grows with the fleet: the run itself keeps counts,
//! progress and the worst nodes only.

use crate::run::{NodeRunResult, NodeVerdict};
use kube::CustomResource;
use serde::{Deserialize, Serialize};

/// Most nodes one shard holds. A node's entry is at most about 3 KiB (a 253-character node
/// name, a pod name and the UID it was made with, a reason cut to [`MAX_REASON`], its node
/// pairs' records with their pods' UIDs), so a shard stays far below etcd's 1.5 MiB and below
/// 256 KiB (`crates/operator/tests/object_sizes.rs`).
pub const NODES_PER_SHARD: usize = 80;

/// Longest `reason` or `finding` a shard entry keeps, in bytes (the full text stays in the
/// pod and its Events).
pub const MAX_REASON: usize = 300;

/// The per-node results of one slice of a run.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[kube(
    group = "gpufabric.io",
    version = "v1alpha1",
    kind = "FabricTestRunShard",
    shortname = "ftrs",
    category = "gpufabric",
    status = "FabricTestRunShardStatus",
    doc = "The per-node results of one slice (at most 80 nodes; 100 or 200 in runs made by earlier versions) of a FabricTestRun; owned by the run and deleted with it.",
    printcolumn(name = "Run", type_ = "string", json_path = ".spec.run"),
    printcolumn(name = "Index", type_ = "integer", json_path = ".spec.index"),
    printcolumn(name = "Nodes", type_ = "integer", json_path = ".status.nodeCount"),
    printcolumn(name = "Done", type_ = "integer", json_path = ".status.done"),
    printcolumn(name = "Passed", type_ = "integer", json_path = ".status.passed"),
    printcolumn(name = "Failed", type_ = "integer", json_path = ".status.failed"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct FabricTestRunShardSpec {
    /// Name of the FabricTestRun this shard belongs to.
    pub run: String,
    /// Position of this shard in the run: shard i holds the run's nodes
    /// `i * 100 .. (i + 1) * 100` in the order the run froze them (runs made before the
    /// shard size was 100 hold 200 per shard).
    pub index: u32,
    /// The nodes of this shard, frozen when the run started.
    #[schemars(length(max = 200))]
    pub nodes: Vec<String>,
}

/// Results of the shard's nodes.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FabricTestRunShardStatus {
    #[serde(default)]
    pub node_count: u32,
    /// Nodes with a final verdict.
    #[serde(default)]
    pub done: u32,
    #[serde(default)]
    pub passed: u32,
    /// Failed, errored or timed out.
    #[serde(default)]
    pub failed: u32,
    /// One entry per node of `spec.nodes`, in the same order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["node"]))]
    pub nodes: Vec<NodeRunResult>,
}

impl FabricTestRunShardStatus {
    /// The status holding `nodes`, with its counts, and each text cut to [`MAX_REASON`].
    pub fn of(mut nodes: Vec<NodeRunResult>) -> Self {
        for n in &mut nodes {
            for text in [&mut n.reason, &mut n.finding].into_iter().flatten() {
                cut(text, MAX_REASON);
            }
            bound_pairs(&mut n.pairs);
        }
        let count =
            |f: fn(NodeVerdict) -> bool| nodes.iter().filter(|n| f(n.verdict)).count() as u32;
        FabricTestRunShardStatus {
            node_count: nodes.len() as u32,
            done: count(NodeVerdict::is_final),
            passed: count(|v| v == NodeVerdict::Passed),
            failed: count(NodeVerdict::is_bad),
            nodes,
        }
    }
}

/// Longest message of a node-pair record in a shard. With 100 nodes a shard, a node gets
/// about 2.6 KB in the worst case (every text at its bound, six pair records):
/// `crates/operator/tests/object_sizes.rs` keeps that under 256 KiB with a margin.
pub const MAX_PAIR_MESSAGE: usize = 96;
/// Port findings a node's pair records keep, in all (the worst first).
pub const MAX_NIC_FINDINGS: usize = 1;

/// Bounds a node's pair records: a pair's message is kept on rank 0's record only, cut to
/// [`MAX_PAIR_MESSAGE`]; port findings (and their count of readings) stay on the latest
/// record that has them only, at most [`MAX_NIC_FINDINGS`], their messages cut to
/// [`MAX_PAIR_MESSAGE`].
pub fn bound_pairs(pairs: &mut [crate::pair::PairRecord]) {
    let latest = pairs.iter().rposition(|r| !r.nic_findings.is_empty());
    for (i, r) in pairs.iter_mut().enumerate() {
        if r.rank != 0 {
            r.message = None;
        }
        if let Some(m) = r.message.as_mut() {
            cut(m, MAX_PAIR_MESSAGE);
        }
        r.nic_findings
            .sort_by_key(|f| std::cmp::Reverse(f.severity));
        if Some(i) != latest {
            r.nic_findings.clear();
            r.nic_readings = 0;
        }
        r.nic_findings.truncate(MAX_NIC_FINDINGS);
        for f in r.nic_findings.iter_mut() {
            cut(&mut f.message, MAX_PAIR_MESSAGE);
        }
    }
}

/// Cuts `text` to at most `max` bytes on a character boundary, marking the cut with `...`.
pub fn cut(text: &mut String, max: usize) {
    if text.len() > max {
        *text = crate::text::cut(text, max);
    }
}

/// Number of shards of a run over `nodes` nodes.
pub fn shard_count(nodes: usize) -> usize {
    nodes.div_ceil(NODES_PER_SHARD)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_are_cut_on_character_boundaries() {
        let mut s = "é".repeat(400);
        cut(&mut s, MAX_REASON);
        assert!(s.len() <= MAX_REASON && s.ends_with("..."));
        let mut short = "ok".to_string();
        cut(&mut short, MAX_REASON);
        assert_eq!(short, "ok");
    }

    #[test]
    fn a_shard_counts_its_nodes() {
        let n = |v| NodeRunResult {
            node: format!("{v:?}"),
            verdict: v,
            reason: Some("x".repeat(1000)),
            ..Default::default()
        };
        let s = FabricTestRunShardStatus::of(vec![
            n(NodeVerdict::Passed),
            n(NodeVerdict::Timeout),
            n(NodeVerdict::Running),
        ]);
        assert_eq!((s.node_count, s.done, s.passed, s.failed), (3, 2, 1, 1));
        assert!(
            s.nodes
                .iter()
                .all(|n| n.reason.as_ref().is_some_and(|r| r.len() <= MAX_REASON))
        );
        assert_eq!(shard_count(0), 0);
        assert_eq!(shard_count(1), 1);
        assert_eq!(shard_count(NODES_PER_SHARD), 1);
        assert_eq!(shard_count(NODES_PER_SHARD + 1), 2);
        assert_eq!(shard_count(10_000), 125);
    }
}
