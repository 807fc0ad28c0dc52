//! What the links the nodes report allow the multi-node NCCL sweep: the node that bounds each
//! node count (its network ports' aggregate rate, or why it is unknown), each collective's
//! busbw ceiling from it, and the node counts whose curve stands far below or above it. The
//! model is `gpufabric_health::links`.

use crate::suite::Collective;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Why a node's links give no expectation.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum LinksUnknown {
    /// The node reported no InfiniBand or RoCE port: NCCL runs over sockets on whatever
    /// interface it finds (a veth on an emulated bed), whose rate sysfs does not give.
    NoPorts,
    /// None of its ports is up: NCCL falls back to sockets.
    NoneUp,
    /// A port that is up reported no rate.
    NoRate,
    /// The node did not report its ports (an agent too old, or the exchange lost them).
    NotReported,
}

impl LinksUnknown {
    /// The reason as a clause about `node`.
    pub fn describe(self, node: &str) -> String {
        match self {
            LinksUnknown::NoPorts => format!(
                "{node} reported no InfiniBand or RoCE port, so NCCL runs over sockets (a veth on an emulated bed) whose rate is not known"
            ),
            LinksUnknown::NoneUp => {
                format!("no network port of {node} is up, so NCCL falls back to sockets")
            }
            LinksUnknown::NoRate => format!("a port of {node} that is up reported no rate"),
            LinksUnknown::NotReported => format!("{node} did not report its network ports"),
        }
    }
}

/// The links of one node count of the sweep: the node whose network ports carry the least
/// (it bounds every ring through it), or the first whose ports give no expectation.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NcclNodesLinks {
    /// The bounding node, or the first node whose links are unknown.
    pub node: String,
    /// Its ports that are up with a rate (the rails NCCL can use).
    #[serde(default)]
    pub rails: u32,
    /// Their rates added up, GB/s (Gb/s / 8); absent when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gbps: Option<f64>,
    /// Why there is no expectation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unknown: Option<LinksUnknown>,
}

impl NcclNodesLinks {
    /// What bounds the node count, or why nothing is known, as words.
    pub fn describe(&self) -> String {
        match (self.gbps, self.unknown) {
            (Some(g), _) => format!("{} ({} rails, {g:.1} GB/s)", self.node, self.rails),
            (None, Some(u)) => u.describe(&self.node),
            (None, None) => LinksUnknown::NotReported.describe(&self.node),
        }
    }
}

/// One collective's busbw ceiling at one node count from its links, and the share of it the
/// sweep measured.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NcclNodesCeiling {
    pub collective: Collective,
    /// The most busbw the links allow, GB/s.
    pub busbw: f64,
    /// The measured busbw at the large sizes over the ceiling (1.0: at the links' rate).
    pub share: f64,
}

/// Which side of the ceiling a node count stands.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum LinkGapKind {
    /// Far below what the links carry: something else bounds it.
    Below,
    /// Above what the links can carry: the ports were reported wrong or the traffic does not
    /// cross them, so the expectation cannot be trusted.
    Above,
}

/// A node count of a sweep whose busbw stands far below its links' ceiling, or above it (a
/// judgement of the run, never a node's finding).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NcclNodesLinkGap {
    pub kind: LinkGapKind,
    /// The topology block's value of the label, for a block's own sweep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block: Option<String>,
    pub collective: Collective,
    pub nodes: u32,
    /// Measured busbw at the large sizes, GB/s.
    pub busbw: f64,
    /// The links' ceiling, GB/s.
    pub ceiling: f64,
    /// What it means and where to look.
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bound_says_its_node_and_rate_and_an_unknown_says_why() {
        let known = NcclNodesLinks {
            node: "n3".into(),
            rails: 7,
            gbps: Some(350.0),
            unknown: None,
        };
        assert_eq!(known.describe(), "n3 (7 rails, 350.0 GB/s)");
        let veth = NcclNodesLinks {
            node: "bed-1".into(),
            rails: 0,
            gbps: None,
            unknown: Some(LinksUnknown::NoPorts),
        };
        assert!(
            veth.describe()
                .starts_with("bed-1 reported no InfiniBand or RoCE port")
        );
        let text = serde_json::to_string(&veth).expect("serialises");
        assert_eq!(text, r#"{"node":"bed-1","rails":0,"unknown":"noPorts"}"#);
    }
}
