//! The multi-node NCCL sweep's document: all_reduce, all_gather, reduce_scatter and alltoall
//! over the first 2, 4, 8, ... nodes of a group (all their GPUs), each collective over a
//! range of sizes, in nccl-tests' convention, as one rank (node) of the group writes it.

use crate::group::GroupHeader;
use crate::link_ceiling::{NcclNodesCeiling, NcclNodesLinkGap, NcclNodesLinks};
use crate::pair::{NotMeasured, PairCollective, PairState};
use crate::result::{ParseError, PhaseError};
use crate::suite::Collective;
use serde::{Deserialize, Serialize};

/// Schema of [`NcclNodesResult`].
pub const NCCL_NODES_SCHEMA: &str = "gpufabric.io/nccl-nodes/v1";

/// What one collective gave at one node count: the busbw of the large sizes and the time of
/// the small ones.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NcclNodesSummary {
    pub collective: Collective,
    /// Mean busbw over the sizes of at least the document's `largeBytes` (the largest size
    /// alone when none is that large), GB/s, nccl-tests' definition for `nodes x G` ranks.
    pub large_busbw: f64,
    /// Time of one iteration at the smallest size (the document's first), µs:
    /// latency-bound.
    pub small_time_us: f64,
    /// Values that were not what the collective must give, over every size.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub wrong: u64,
}

impl NcclNodesSummary {
    /// The summary of `collective`'s rows (one per size); None when it has none.
    pub fn of(
        collective: Collective,
        rows: &[PairCollective],
        large_bytes: u64,
    ) -> Option<NcclNodesSummary> {
        let mine: Vec<&PairCollective> =
            rows.iter().filter(|r| r.collective == collective).collect();
        let smallest = mine.iter().min_by_key(|r| r.bytes)?;
        let largest = mine.iter().max_by_key(|r| r.bytes)?;
        let large: Vec<f64> = mine
            .iter()
            .filter(|r| r.bytes >= large_bytes)
            .map(|r| r.busbw)
            .collect();
        let large_busbw = if large.is_empty() {
            largest.busbw
        } else {
            large.iter().sum::<f64>() / large.len() as f64
        };
        Some(NcclNodesSummary {
            collective,
            large_busbw,
            small_time_us: smallest.time_us,
            wrong: mine.iter().map(|r| r.wrong).sum(),
        })
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One node count of the sweep.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NcclNodesPoint {
    /// How many nodes took part: the first of the group, by rank.
    pub nodes: u32,
    /// Their names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_names: Vec<String>,
    /// NCCL ranks: nodes x GPUs per node.
    pub ranks: u32,
    /// Per collective, in the order measured.
    pub summary: Vec<NcclNodesSummary>,
    /// What the nodes' network ports allow: the node that bounds this count, or why
    /// nothing is known (absent from older agents).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub links: Option<NcclNodesLinks>,
    /// Every collective at every size (nccl-tests' rows): the slowest node's time, its
    /// algbw and busbw, and the wrong values of every node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rows: Vec<PairCollective>,
}

/// The document each rank of a multi-node NCCL sweep writes (its termination message and
/// last stdout line). Every rank writes the same points: the ranks gather each node's rows.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NcclNodesResult {
    /// The group, its nodes, this rank, the backend and the times; its schema is always
    /// [`NCCL_NODES_SCHEMA`].
    #[serde(flatten)]
    pub header: GroupHeader,
    /// Sizes of the sweep, bytes (nccl-tests' size: the whole buffer of all_gather's output,
    /// reduce_scatter's input and alltoall's; one rank's buffer of all_reduce).
    pub sizes: Vec<u64>,
    /// Sizes from this one up are the large ones of each summary.
    pub large_bytes: u64,
    pub points: Vec<NcclNodesPoint>,
    /// Set when the sweep could not be measured (a rank that never arrived, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_measured: Option<NotMeasured>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<PhaseError>,
}

impl NcclNodesResult {
    /// Reads a document, rejecting malformed and unknown-schema input.
    pub fn parse(text: &str) -> Result<NcclNodesResult, ParseError> {
        crate::result::parse_tagged(
            text,
            |d: &NcclNodesResult| &d.header.schema,
            NCCL_NODES_SCHEMA,
        )
    }

    /// Wrong values over every point and collective.
    pub fn wrong(&self) -> u64 {
        self.points
            .iter()
            .flat_map(|p| &p.summary)
            .map(|s| s.wrong)
            .sum()
    }

    /// The document as one line that fits a termination message
    /// ([`crate::keys::TERMINATION_MESSAGE_LIMIT`]): whole when it fits; else without the
    /// per-size rows (the summaries stay); else without the node names of each point (the
    /// group's list names them: a point is its first `nodes`); else without the group's
    /// list and the list of sizes too (each point's summaries and links stay: they are what
    /// the run's status keeps).
    pub fn termination_text(&self) -> String {
        let limit = crate::keys::TERMINATION_MESSAGE_LIMIT;
        // A struct of strings and numbers always serialises.
        let text = |d: &NcclNodesResult| serde_json::to_string(d).unwrap_or_default();
        let whole = text(self);
        if whole.len() <= limit {
            return whole;
        }
        let mut d = self.clone();
        for p in &mut d.points {
            p.rows.clear();
        }
        let trimmed = text(&d);
        if trimmed.len() <= limit {
            return trimmed;
        }
        for p in &mut d.points {
            p.node_names.clear();
        }
        let trimmed = text(&d);
        if trimmed.len() <= limit {
            return trimmed;
        }
        d.header.nodes.clear();
        d.sizes.clear();
        text(&d)
    }
}

/// One node count of the sweep in the run's status: its summaries, without the per-size rows.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NcclNodesCurvePoint {
    /// How many nodes took part: the first of the sweep's, by rank.
    pub nodes: u32,
    /// NCCL ranks: nodes x GPUs per node.
    pub ranks: u32,
    /// Per collective, in the order measured.
    pub summary: Vec<NcclNodesSummary>,
    /// What the nodes' network ports allow: the node that bounds this count (its rails and
    /// their rate), or why nothing is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub links: Option<NcclNodesLinks>,
    /// Per collective, when the links are known: the busbw they allow and the share of it
    /// measured (`gpufabric_health::links`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ceilings: Vec<NcclNodesCeiling>,
}

impl From<&NcclNodesPoint> for NcclNodesCurvePoint {
    fn from(p: &NcclNodesPoint) -> Self {
        NcclNodesCurvePoint {
            nodes: p.nodes,
            ranks: p.ranks,
            summary: p.summary.clone(),
            links: p.links.clone(),
            ceilings: Vec::new(),
        }
    }
}

impl NcclNodesCurvePoint {
    /// The ceiling of `collective` at this count, when the links give one.
    pub fn ceiling(&self, collective: Collective) -> Option<&NcclNodesCeiling> {
        self.ceilings.iter().find(|c| c.collective == collective)
    }
}

/// Where a collective's curve starts to lose more than the fabric should (the run's
/// judgement of its points, never a node's).
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NcclNodesKnee {
    pub collective: Collective,
    /// The last node count before the knee, and the first in it.
    pub from_nodes: u32,
    pub at_nodes: u32,
    /// busbw at `atNodes` and at `fromNodes`, GB/s.
    pub busbw: f64,
    pub previous_busbw: f64,
    /// What it means and where to look.
    pub message: String,
}

/// One sweep of the run's multi-node NCCL phase over a set of nodes (the whole group, one
/// topology block, or one node of each block): where it stands and its curve.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NcclNodesSweep {
    /// The sweep's nodes, by rank: node count k runs on the first k.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    /// Where the sweep stands (its pods: rank 0 first, the others once it has an IP).
    pub state: PairState,
    /// Per node count (the first `nodes` of the list): the ranks, and per collective the
    /// busbw of the large sizes and the time of the smallest.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub points: Vec<NcclNodesCurvePoint>,
    /// GPUs of each node.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub gpus_per_node: u32,
    /// Per collective whose curve has one: where adding nodes starts to cost more than the
    /// fabric should.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub knees: Vec<NcclNodesKnee>,
    /// Why it was not measured or failed, or why it did not run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The sweep has ended, or there was nothing to sweep.
    #[serde(default)]
    pub done: bool,
    /// The UIDs of the sweep's pods, by rank, recorded when the operator made them (empty
    /// for a rank whose pod was not made): only those pods are read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pod_uids: Vec<String>,
}

/// The sweep inside one topology block: the nodes that share one value of
/// `suite.ncclNodes.topologyKey`.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NcclNodesBlock {
    /// The label's value on the block's nodes.
    pub value: String,
    #[serde(flatten)]
    pub sweep: NcclNodesSweep,
}

/// A topology block whose curve fell below the other blocks' (`health::scaling`'s slow-block
/// rule): a Warning on the block, never a finding on its nodes, which their own checks and
/// pairs judge.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NcclNodesSlowBlock {
    /// The label (`suite.ncclNodes.topologyKey`).
    pub key: String,
    /// The block's value of the label.
    pub value: String,
    pub collective: Collective,
    /// The first node count where it is slow.
    pub nodes: u32,
    /// Its busbw at that count, GB/s.
    pub busbw: f64,
    /// The blocks' median busbw at that count, GB/s.
    pub median: f64,
    /// Blocks compared at that node count.
    pub blocks: u32,
    /// What it means and where to look.
    pub message: String,
}

/// A node count of the sweep whose busbw fell far below what the test's earlier sweeps reached
/// there (the fleet's baseline): a finding on the fabric between the nodes, never on a node.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NcclNodesShortfall {
    pub collective: Collective,
    pub nodes: u32,
    /// Its busbw at the large sizes, GB/s.
    pub busbw: f64,
    /// The baseline's median at that count, GB/s.
    pub expected: f64,
    /// What it means and where to look.
    pub message: String,
}

/// The multi-node NCCL sweep of a run (`suite.ncclNodes`), in its status: one sweep over the
/// group, or with a `topologyKey` one per block and, in the fields of the sweep, the one
/// across blocks.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct NcclNodesStatus {
    /// The group's sweep; with a `topologyKey`, the one across blocks (one node of each), run
    /// after the blocks' own. Its `done` is the whole phase's.
    #[serde(flatten)]
    pub sweep: NcclNodesSweep,
    /// The label that split the nodes into blocks, when the suite names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_key: Option<String>,
    /// Each block's own sweep, in the order they ran (one after the other).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub blocks: Vec<NcclNodesBlock>,
    /// Blocks whose curve fell below the other blocks' (no node is held to account for it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slow_blocks: Vec<NcclNodesSlowBlock>,
    /// Node counts of the group's sweep (across blocks, with a `topologyKey`) far below the
    /// test's baseline at that count (no node is held to account for it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub below_baseline: Vec<NcclNodesShortfall>,
    /// Node counts of any sweep far below the ceiling of the links their nodes report, or
    /// above it (then the ports were reported wrong and the ceiling cannot be trusted); no
    /// node is held to account for either.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub link_gaps: Vec<NcclNodesLinkGap>,
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

impl NcclNodesSweep {
    /// The busbw of `collective` at the large sizes, per node count (the curve).
    pub fn curve(&self, collective: Collective) -> Vec<(u32, f64)> {
        self.points
            .iter()
            .filter_map(|p| {
                p.summary
                    .iter()
                    .find(|s| s.collective == collective)
                    .map(|s| (p.nodes, s.large_busbw))
            })
            .collect()
    }

    /// The collectives of the points, in the order first measured.
    pub fn collectives(&self) -> Vec<Collective> {
        let mut out: Vec<Collective> = Vec::new();
        for s in self.points.iter().flat_map(|p| &p.summary) {
            if !out.contains(&s.collective) {
                out.push(s.collective);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::result::Backend;

    fn row(c: Collective, bytes: u64, time_us: f64, busbw: f64) -> PairCollective {
        PairCollective {
            collective: c,
            bytes,
            time_us,
            algbw: busbw,
            busbw,
            wrong: 0,
        }
    }

    const FOUR: [Collective; 4] = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::AllToAll,
    ];

    fn doc(nodes: u32) -> NcclNodesResult {
        let names: Vec<String> = (0..nodes)
            .map(|i| format!("a-long-node-name-in-some-rack-{i:04}"))
            .collect();
        let sizes: Vec<u64> = (10..=30).map(|s| 1u64 << s).collect();
        let points = (1..)
            .map(|e| 1u32 << e)
            .take_while(|k| *k <= nodes)
            .map(|k| {
                let rows: Vec<PairCollective> = FOUR
                    .iter()
                    .flat_map(|&c| sizes.iter().map(move |&b| row(c, b, 30.0, 300.0)))
                    .collect();
                NcclNodesPoint {
                    nodes: k,
                    node_names: names[..k as usize].to_vec(),
                    ranks: k * 8,
                    summary: FOUR
                        .iter()
                        .filter_map(|&c| NcclNodesSummary::of(c, &rows, 64 << 20))
                        .collect(),
                    links: Some(NcclNodesLinks {
                        node: names[k as usize - 1].clone(),
                        rails: 8,
                        gbps: Some(400.0),
                        unknown: None,
                    }),
                    rows,
                }
            })
            .collect();
        NcclNodesResult {
            header: GroupHeader {
                duration_s: 30.0,
                gpus_per_node: 8,
                ..GroupHeader::new(
                    NCCL_NODES_SCHEMA,
                    "run/nccl".into(),
                    names,
                    0,
                    Backend::Sim,
                    "2026-11-29T02:00:00Z".into(),
                )
            },
            sizes,
            large_bytes: 64 << 20,
            points,
            not_measured: None,
            errors: Vec::new(),
        }
    }

    #[test]
    fn a_summary_averages_the_large_sizes_and_keeps_the_smallest_sizes_time() {
        let rows = [
            row(Collective::AllGather, 1 << 10, 25.0, 0.04),
            row(Collective::AllGather, 64 << 20, 900.0, 340.0),
            row(Collective::AllGather, 256 << 20, 3000.0, 360.0),
            row(Collective::AllReduce, 1 << 10, 99.0, 1.0),
        ];
        let s = NcclNodesSummary::of(Collective::AllGather, &rows, 64 << 20).expect("summary");
        assert_eq!((s.large_busbw, s.small_time_us), (350.0, 25.0));
        // No size as large as asked: the largest stands for the large ones.
        let s = NcclNodesSummary::of(Collective::AllGather, &rows, 1 << 30).expect("summary");
        assert_eq!(s.large_busbw, 360.0);
        assert!(NcclNodesSummary::of(Collective::AllToAll, &rows, 1).is_none());
    }

    #[test]
    fn the_document_reads_back_and_a_foreign_schema_is_refused() {
        let d = doc(4);
        let text = serde_json::to_string(&d).expect("serialises");
        assert_eq!(NcclNodesResult::parse(&text).expect("parses"), d);
        let other = text.replace(NCCL_NODES_SCHEMA, "gpufabric.io/ddp-nodes/v1");
        assert!(NcclNodesResult::parse(&other).is_err());
    }

    #[test]
    fn a_large_groups_termination_message_keeps_every_summary_within_the_limit() {
        let d = doc(1024);
        let line = d.termination_text();
        assert!(
            line.len() <= crate::keys::TERMINATION_MESSAGE_LIMIT,
            "{}",
            line.len()
        );
        let back: NcclNodesResult = serde_json::from_str(&line).expect("parses");
        assert_eq!(back.points.len(), 10);
        assert!(back.points.iter().all(|p| p.summary.len() == 4));
        assert_eq!(back.points[9].ranks, 1024 * 8);
        assert!(back.points.iter().all(|p| p.links.is_some()));
        // A small group's message names the nodes of each point.
        let small = doc(2);
        let back: NcclNodesResult =
            serde_json::from_str(&small.termination_text()).expect("parses");
        assert_eq!(back.points[0].node_names, small.points[0].node_names);
        assert_eq!(back.points[0].summary, small.points[0].summary);
    }
}
