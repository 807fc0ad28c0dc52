//! The multi-node DDP probe's document: the node probe's synthetic training step (an MLP
//! step with bucketed gradient all-reduce overlapped with backward), weak-scaled over 1, 2,
//! 4, ... nodes with all their GPUs, as one rank (node) of the group writes it.

use crate::group::GroupHeader;
use crate::pair::{NotMeasured, PairState};
use crate::result::{DdpPoint, ParseError, PhaseError};
use schemars::JsonSchema;
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
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
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
    /// The group, its nodes, this rank, the backend and the times; its schema is always
    /// [`DDP_NODES_SCHEMA`].
    #[serde(flatten)]
    pub header: GroupHeader,
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

impl DdpNodesResult {
    /// Reads a document, rejecting malformed and unknown-schema input.
    pub fn parse(text: &str) -> Result<DdpNodesResult, ParseError> {
        crate::result::parse_tagged(
            text,
            |d: &DdpNodesResult| &d.header.schema,
            DDP_NODES_SCHEMA,
        )
    }

    /// The document as one line that fits a termination message
    /// ([`crate::keys::TERMINATION_MESSAGE_LIMIT`]): whole when it fits; else without each
    /// point's per-GPU lists (each node's compute stays); else with each node's compute kept
    /// at the largest node count only (where stragglers are named).
    pub fn termination_text(&self) -> String {
        let limit = crate::keys::TERMINATION_MESSAGE_LIMIT;
        // A struct of strings and numbers always serialises.
        let text = |d: &DdpNodesResult| serde_json::to_string(d).unwrap_or_default();
        let whole = text(self);
        if whole.len() <= limit {
            return whole;
        }
        let mut d = self.clone();
        for p in &mut d.points {
            p.point.compute_ms.clear();
            p.point.gpu_indices.clear();
        }
        let trimmed = text(&d);
        if trimmed.len() <= limit {
            return trimmed;
        }
        let last = d.points.len().saturating_sub(1);
        for p in &mut d.points[..last] {
            p.node_compute_ms.clear();
        }
        text(&d)
    }

    /// What the run's status keeps of the points.
    pub fn summary(&self) -> Vec<DdpNodesSummary> {
        let round = |x: f64| (x * 100.0).round() / 100.0;
        self.points
            .iter()
            .map(|p| DdpNodesSummary {
                nodes: p.nodes,
                gpus: p.point.gpus,
                step_ms: round(p.point.step_ms),
                scaling_efficiency: round(p.point.scaling_efficiency * 100.0) / 100.0,
                comm_alone_ms: round(p.comm_alone_ms),
                exposed_comm_ms: round(p.exposed_comm_ms),
            })
            .collect()
    }
}

/// One node count of the multi-node probe, as the run's status keeps it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DdpNodesSummary {
    pub nodes: u32,
    /// GPUs over all of its nodes.
    pub gpus: u32,
    pub step_ms: f64,
    /// Throughput per GPU against the one-node point (1.0 = perfect weak scaling).
    pub scaling_efficiency: f64,
    /// The gradient all-reduces alone, ms.
    pub comm_alone_ms: f64,
    /// Step time not covered by computing, ms.
    pub exposed_comm_ms: f64,
}

/// The multi-node DDP probe of a run (`suite.ddpNodes`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DdpNodesStatus {
    /// The probe's nodes, by rank: node count k runs on the first k.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    /// Where the probe stands (its pods: rank 0 first, the others once it has an IP).
    pub state: PairState,
    /// Step time, efficiency and exposed communication per node count.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub points: Vec<DdpNodesSummary>,
    /// Nodes that computed the step markedly slower than the fastest, at the largest count.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stragglers: Vec<DdpStraggler>,
    /// Why it was not measured or failed, or why it did not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The probe has ended, or there was nothing to probe.
    #[serde(default)]
    pub done: bool,
    /// The UIDs of the probe's pods, by rank, recorded when the operator made them (empty
    /// for a rank whose pod was not made): only those pods are read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_uids: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::result::Backend;

    fn doc(nodes: u32, gpus_per_node: u32) -> DdpNodesResult {
        let names: Vec<String> = (0..nodes)
            .map(|i| format!("a-long-node-name-in-some-rack-{i:04}"))
            .collect();
        let mut counts = vec![1];
        while counts[counts.len() - 1] * 2 < nodes {
            counts.push(counts[counts.len() - 1] * 2);
        }
        counts.push(nodes);
        DdpNodesResult {
            header: GroupHeader {
                duration_s: 30.0,
                gpus_per_node,
                ..GroupHeader::new(
                    DDP_NODES_SCHEMA,
                    "run/ddp".into(),
                    names,
                    0,
                    Backend::Sim,
                    "2026-11-25T02:00:00Z".into(),
                )
            },
            hidden: 8192,
            layers: 8,
            batch_per_gpu: 4096,
            buckets: vec![1 << 20, 25 << 20],
            points: counts
                .iter()
                .map(|&k| {
                    let gpus = k * gpus_per_node;
                    DdpNodesPoint {
                        nodes: k,
                        point: DdpPoint {
                            gpus,
                            step_ms: 123.456789,
                            samples_per_s: 1234567.891,
                            scaling_efficiency: 0.912345678,
                            comm_fraction: 0.123456789,
                            overlap_efficiency: 0.87654321,
                            tflops_per_gpu: 456.789012,
                            compute_ms: vec![101.234567; gpus as usize],
                            gpu_indices: (0..gpus).collect(),
                        },
                        compute_alone_ms: 101.23456,
                        comm_alone_ms: 45.678901,
                        exposed_comm_ms: 12.345678,
                        node_compute_ms: vec![101.234567; k as usize],
                    }
                })
                .collect(),
            stragglers: vec![],
            not_measured: None,
            errors: vec![],
        }
    }

    #[test]
    fn the_termination_text_fits_the_limit_and_keeps_the_points() {
        for (nodes, gpus) in [(2, 1), (4, 8), (16, 8)] {
            let d = doc(nodes, gpus);
            let text = d.termination_text();
            assert!(
                text.len() <= crate::keys::TERMINATION_MESSAGE_LIMIT,
                "{nodes} x {gpus}: {} bytes",
                text.len()
            );
            let back = DdpNodesResult::parse(&text).expect("parses back");
            assert_eq!(back.header.nodes, d.header.nodes);
            assert_eq!(back.summary(), d.summary());
            let last = back.points.last().expect("points");
            assert_eq!(
                last.node_compute_ms.len(),
                nodes as usize,
                "stragglers stay judgeable"
            );
        }
        let small = doc(2, 1);
        assert_eq!(
            DdpNodesResult::parse(&small.termination_text()).expect("parses"),
            small,
            "a document that fits is kept whole"
        );
    }

    #[test]
    fn junk_and_other_schemas_are_errors() {
        assert_eq!(DdpNodesResult::parse("  "), Err(ParseError::Empty));
        assert!(matches!(
            DdpNodesResult::parse("{\"schema\":"),
            Err(ParseError::Malformed(_))
        ));
        let mut d = doc(2, 1);
        d.header.schema = crate::pair::PAIR_SCHEMA.into();
        let text = serde_json::to_string(&d).expect("serialises");
        assert!(matches!(
            DdpNodesResult::parse(&text),
            Err(ParseError::Malformed(m)) if m.contains("schema")
        ));
    }

    #[test]
    fn the_summary_rounds_for_the_status() {
        let s = doc(4, 8).summary();
        assert_eq!(s.len(), 3);
        assert_eq!((s[2].nodes, s[2].gpus), (4, 32));
        assert_eq!(s[2].step_ms, 123.46);
        assert_eq!(s[2].scaling_efficiency, 0.9123);
        assert_eq!(s[2].exposed_comm_ms, 12.35);
    }
}
