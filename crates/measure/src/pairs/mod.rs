//! Node-pair tests: NCCL across every GPU of two nodes once their ranks have met over the
//! [`crate::rendezvous`]; the sim backend's model of the network between nodes.

pub(crate) mod sim;

use gpufabric_api::suite::Collective;

/// What one rank of a node pair is asked to measure.
#[derive(Debug, Clone)]
pub struct PairOptions {
    /// The rendezvous group, e.g. `<run>/r0/p3`.
    pub group: String,
    /// This rank (0 or 1).
    pub rank: u32,
    /// The two nodes, by rank.
    pub nodes: [String; 2],
    /// Message size of each collective.
    pub bytes: u64,
    /// all_reduce and sendrecv, and all_to_all when asked.
    pub collectives: Vec<Collective>,
}

impl PairOptions {
    /// This rank's node.
    pub fn node(&self) -> &str {
        &self.nodes[(self.rank as usize).min(1)]
    }

    /// The other rank's node.
    pub(crate) fn peer(&self) -> &str {
        &self.nodes[usize::from(self.rank == 0)]
    }
}

/// The collectives of a pair test unless asked otherwise.
pub const DEFAULT_COLLECTIVES: [Collective; 2] = [Collective::AllReduce, Collective::SendRecv];
