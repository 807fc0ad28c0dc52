//! Between nodes: the result document of one node-pair test (NCCL across the GPUs of two
//! nodes) and the run's record of each pair. A node's network ports are `crate::nic`'s.

use crate::result::{Backend, PhaseError};
use crate::suite::Collective;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use crate::nic::NicPort;

/// Schema tag of the node-pair document.
pub const PAIR_SCHEMA: &str = "gpufabric.io/node-pair/v1";

/// The network transport NCCL used between the nodes of a pair.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum NetTransport {
    /// InfiniBand verbs.
    Ib,
    /// RDMA over Converged Ethernet (NCCL's IB transport on an Ethernet link layer).
    Roce,
    /// TCP sockets: the fallback NCCL takes when it finds no usable RDMA device.
    Socket,
    Unknown,
}

impl NetTransport {
    /// RDMA (IB or RoCE).
    pub fn is_rdma(self) -> bool {
        matches!(self, NetTransport::Ib | NetTransport::Roce)
    }
}

impl std::fmt::Display for NetTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NetTransport::Ib => "InfiniBand",
            NetTransport::Roce => "RoCE",
            NetTransport::Socket => "sockets",
            NetTransport::Unknown => "an unknown transport",
        })
    }
}

/// One collective across the 2 x G ranks of a pair at the configured size.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PairCollective {
    pub collective: Collective,
    pub bytes: u64,
    /// Average time per iteration, microseconds.
    pub time_us: f64,
    pub algbw: f64,
    /// Bus bandwidth as nccl-tests defines it for 2 x G ranks, GB/s.
    pub busbw: f64,
    #[serde(default)]
    pub wrong: u64,
}

/// Why a pair was not measured (nothing here counts against either node).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NotMeasured {
    /// The rank (node) at fault when one is known, e.g. the peer that never arrived.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    pub message: String,
}

impl NotMeasured {
    /// Not measured for a reason on the writing rank's own node that is not its fabric's
    /// (other work on its GPUs): no peer at fault.
    pub fn own_node(message: String) -> NotMeasured {
        NotMeasured {
            peer: None,
            message,
        }
    }
}

/// The result one rank of a node pair writes (its termination message and last stdout line;
/// small enough for both).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodePairResult {
    /// Always [`PAIR_SCHEMA`].
    pub schema: String,
    /// The rendezvous group, e.g. `<run>/r0/p3`.
    pub group: String,
    /// The two nodes, by rank.
    pub nodes: [String; 2],
    /// The rank (0 or 1) that wrote this document.
    pub rank: u32,
    pub backend: Backend,
    /// RFC 3339.
    pub started_at: String,
    pub duration_s: f64,
    /// GPUs used on each node.
    pub gpus_per_node: u32,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub collectives: Vec<PairCollective>,
    /// The network transport NCCL used between the two nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<NetTransport>,
    /// NICs NCCL used on this rank's node.
    #[serde(default)]
    pub nics_used: u32,
    /// This rank's node's network ports.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nics: Vec<NicPort>,
    /// Set when the pair could not be measured (a peer that never arrived, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_measured: Option<NotMeasured>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<PhaseError>,
}

impl NodePairResult {
    /// The all_reduce bus bandwidth, else the highest of any collective (GB/s).
    pub fn busbw(&self) -> Option<f64> {
        self.collectives
            .iter()
            .find(|c| c.collective == Collective::AllReduce)
            .or_else(|| {
                self.collectives
                    .iter()
                    .max_by(|a, b| a.busbw.total_cmp(&b.busbw))
            })
            .map(|c| c.busbw)
    }

    /// Reads a node-pair document, rejecting malformed and unknown-schema input.
    pub fn parse(text: &str) -> Result<NodePairResult, crate::result::ParseError> {
        crate::result::parse_tagged(text, |d: &NodePairResult| &d.schema, PAIR_SCHEMA)
    }
}

/// Where one node-pair test of a run stands.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum PairState {
    /// Planned; no pod yet.
    #[default]
    Pending,
    /// The rank-0 pod exists; the rank-1 pod follows once rank 0 has an IP.
    Listening,
    /// Both pods exist.
    Joined,
    /// Both ranks met and measured.
    Measured,
    /// Not measured for a reason outside both nodes (a pod not admitted, a peer that never
    /// arrived): counts against neither node.
    NotMeasured,
    /// The ranks met but the test failed (an NCCL error, a crash, a hang): judged as a
    /// pair with no bandwidth, so that the rules say which side is at fault.
    Errored,
}

impl PairState {
    /// Nothing more will come from the pair.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            PairState::Measured | PairState::NotMeasured | PairState::Errored
        )
    }
}

/// One node-pair test as each of its two nodes' results keeps it (in the run's shards).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PairRecord {
    /// Round of the run's node-pair phase (1-based; the confirmation round is the last).
    pub round: u32,
    /// Pair number within its round (0-based; names the pods).
    pub index: u32,
    /// The other node.
    pub partner: String,
    /// This node's rank in the pair (0 serves the rendezvous).
    pub rank: u32,
    /// The two nodes are in different topology groups.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub across: bool,
    /// A retest of a suspect against a known-good partner.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub confirmation: bool,
    #[serde(default)]
    pub state: PairState,
    /// NCCL all_reduce bus bandwidth between the two nodes (GB/s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busbw_gbps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<NetTransport>,
    /// NICs NCCL used on this node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nics_used: Option<u32>,
    /// What this node's network ports showed (a port down, one trained below its
    /// siblings): the worst, on the node's latest record that saw one; empty when every
    /// port was fine.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nic_findings: Vec<crate::findings::Finding>,
    /// How many of this node's pair tests of the run, this one included, read the worst
    /// of `nicFindings` on the same port (each pair test reads the ports again).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub nic_readings: u32,
    /// Why the pair was not measured or failed (on rank 0's record, cut to 120 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The UID of this node's pod of the pair, recorded when the operator made it: only
    /// that pod is read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
}

/// Bandwidth of one set of pairs (within topology groups, or across them).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PairSetSummary {
    /// Pairs measured.
    pub measured: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub median_gbps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_gbps: Option<f64>,
}

/// The node-pair phase of a run (`suite.nodePairs`): every pair's result is on both of its
/// nodes in the run's shards; this is the summary.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodePairsStatus {
    /// Seed of the pairing (replays a `Random` pairing).
    pub seed: u64,
    /// Nodes that passed their own check and take part.
    pub candidates: u32,
    /// The round under way (1-based).
    pub round: u32,
    /// Rounds of the phase, the confirmation round included once it is planned.
    pub rounds: u32,
    /// The round that retests suspects against known-good partners, when one was needed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confirmation_round: Option<u32>,
    /// The second confirmation round, when the first left suspects unclear: it retests them
    /// against known-good partners they had not met (a node whose every planned partner was
    /// bad needs two). There is no third.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub second_confirmation_round: Option<u32>,
    /// Retests in the confirmation rounds, each a suspect against a known-good partner (a
    /// node retested in both rounds counts twice).
    #[serde(default)]
    pub retested: u32,
    /// When the round under way began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub round_start_time: Option<Time>,
    /// Every pair has ended.
    #[serde(default)]
    pub done: bool,
    pub pairs: u32,
    pub measured: u32,
    pub not_measured: u32,
    pub errored: u32,
    /// Pairs within one topology group (every pair when no `topologyKey` is set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub within: Option<PairSetSummary>,
    /// Pairs across topology groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub across: Option<PairSetSummary>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nic::PortErrors;

    fn doc() -> NodePairResult {
        NodePairResult {
            schema: PAIR_SCHEMA.into(),
            group: "run-a/r0/p1".into(),
            nodes: ["h200-01".into(), "h200-02".into()],
            rank: 0,
            backend: Backend::Sim,
            started_at: "2026-11-23T02:00:00Z".into(),
            duration_s: 3.2,
            gpus_per_node: 8,
            collectives: vec![
                PairCollective {
                    collective: Collective::SendRecv,
                    bytes: 1 << 30,
                    time_us: 5000.0,
                    algbw: 214.7,
                    busbw: 214.7,
                    wrong: 0,
                },
                PairCollective {
                    collective: Collective::AllReduce,
                    bytes: 1 << 30,
                    time_us: 11000.0,
                    algbw: 97.6,
                    busbw: 183.0,
                    wrong: 0,
                },
            ],
            transport: Some(NetTransport::Ib),
            nics_used: 8,
            nics: vec![NicPort {
                device: "mlx5_0".into(),
                port: 1,
                link_layer: Some("InfiniBand".into()),
                state: "ACTIVE".into(),
                phys_state: "LinkUp".into(),
                rate_gbps: Some(400.0),
                errors: PortErrors {
                    symbol_errors: Some(0),
                    link_downed: Some(0),
                    rcv_errors: Some(0),
                },
            }],
            not_measured: None,
            errors: vec![],
        }
    }

    #[test]
    fn a_pair_document_round_trips_and_names_its_all_reduce_busbw() {
        let d = doc();
        let text = serde_json::to_string(&d).expect("serialises");
        assert!(text.contains("\"transport\":\"ib\""), "{text}");
        assert!(text.contains("\"physState\":\"LinkUp\""), "{text}");
        let back = NodePairResult::parse(&text).expect("parses");
        assert_eq!(back, d);
        assert_eq!(back.busbw(), Some(183.0));
    }

    #[test]
    fn a_pair_document_of_the_agent_reads_and_writes_back_byte_for_byte() {
        // The wire form the agent writes: the port's counters sit beside its other fields;
        // a counter sysfs lacks is absent.
        let text = concat!(
            r#"{"schema":"gpufabric.io/node-pair/v1","group":"run-a/r0/p1","#,
            r#""nodes":["h200-01","h200-02"],"rank":1,"backend":"sim","#,
            r#""startedAt":"2026-11-23T02:00:00Z","durationS":3.2,"gpusPerNode":8,"#,
            r#""transport":"ib","nicsUsed":2,"nics":["#,
            r#"{"device":"mlx5_0","port":1,"linkLayer":"InfiniBand","state":"ACTIVE","#,
            r#""physState":"LinkUp","rateGbps":400.0,"symbolErrors":12,"linkDowned":1,"#,
            r#""rcvErrors":3},"#,
            r#"{"device":"mlx5_1","port":1,"state":"DOWN","physState":"Polling","#,
            r#""linkDowned":0}]}"#
        );
        let d = NodePairResult::parse(text).expect("parses");
        assert_eq!(
            d.nics[0].errors,
            PortErrors {
                symbol_errors: Some(12),
                link_downed: Some(1),
                rcv_errors: Some(3),
            }
        );
        assert_eq!(
            d.nics[1].errors,
            PortErrors {
                link_downed: Some(0),
                ..Default::default()
            }
        );
        assert_eq!(serde_json::to_string(&d).expect("serialises"), text);
        // A null counter reads as absent; a negative or repeated one is refused.
        let port = |fields: &str| {
            serde_json::from_str::<NicPort>(&format!(
                r#"{{"device":"d","port":1,"state":"ACTIVE","physState":"LinkUp"{fields}}}"#
            ))
        };
        assert_eq!(
            port(r#","symbolErrors":null"#).ok().map(|p| p.errors),
            Some(PortErrors::default())
        );
        assert!(port(r#","rcvErrors":-1"#).is_err());
        assert!(port(r#","linkDowned":1,"linkDowned":2"#).is_err());
    }

    #[test]
    fn an_eight_nic_pair_document_fits_a_termination_message() {
        let mut d = doc();
        let port = d.nics[0].clone();
        d.nics = (0..8)
            .map(|i| NicPort {
                device: format!("mlx5_{i}"),
                ..port.clone()
            })
            .collect();
        let text = serde_json::to_string(&d).expect("serialises");
        assert!(
            text.len() < crate::keys::TERMINATION_MESSAGE_LIMIT,
            "{}",
            text.len()
        );
    }

    #[test]
    fn wrong_schema_and_empty_text_are_refused() {
        let mut d = doc();
        d.schema = "gpufabric.io/result/v1".into();
        let text = serde_json::to_string(&d).expect("serialises");
        assert!(NodePairResult::parse(&text).is_err());
        assert!(NodePairResult::parse("  ").is_err());
        assert!(NodePairResult::parse("{\"schema\":").is_err());
    }
}
