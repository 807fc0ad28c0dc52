//! The sim backend's part of the multi-node NCCL sweep: one node's rows at a node count,
//! from the fleet's model of the network ([`crate::pairs::sim`]).
//!
//! # Model
//! - Ring collectives (all_reduce, all_gather, reduce_scatter) run at the slowest link
//!   between consecutive nodes of the ring; alltoall at the slowest link between any two of
//!   the nodes (every pair exchanges). A slow NIC, a bad path or sockets slow every node
//!   count that includes them.
//! - busbw = that bandwidth times the collective's efficiency (as the node pair's), less 1%
//!   per doubling of the node count (model value), with 1% noise that depends only on the
//!   seed, the nodes and the collective, so every rank reports the same rows.
//! - time per iteration = latency x (1 + log2 nodes) (20 µs RDMA, 60 µs sockets) + bytes /
//!   algbw, with algbw = busbw / the collective's bus factor for `nodes x G` ranks.

use crate::fleet::FleetNode;
use crate::nccl_nodes::{NcclMeasure, NodeError, Sweep};
use crate::pairs::sim::{efficiency, noise, path_gbps, socket};
use crate::{CheckError, Progress, stats};
use gpufabric_api::pair::PairCollective;
use gpufabric_api::result::Backend;
use gpufabric_api::suite::Collective;

/// One rank of the sweep on the sim backend.
pub struct SimNcclNodes {
    /// The group's nodes, by rank (all in the fleet).
    pub nodes: Vec<FleetNode>,
    pub rank: u32,
    pub seed: u64,
}

impl NcclMeasure for SimNcclNodes {
    fn kind(&self) -> Backend {
        Backend::Sim
    }

    /// The node's `gpusInUse` faults present from the start.
    fn prepare(&mut self, shared: bool, progress: Progress) -> Result<u32, CheckError> {
        super::prepare_rank(&self.nodes, self.rank, shared, progress)
    }

    fn make_id(&mut self) -> Result<Vec<u8>, NodeError> {
        super::random_comm_id()
    }

    fn measure(
        &mut self,
        k: u32,
        _id: &[u8],
        sweep: &Sweep,
    ) -> Result<Vec<PairCollective>, NodeError> {
        let me = super::rank_node(&self.nodes, self.rank)?;
        let nodes = self.nodes.get(..k as usize).ok_or(NodeError::TooFewNodes)?;
        super::pace::spend("ncclNodes", &me.name, self.seed);
        Ok(rows(nodes, me.gpus, sweep, self.seed))
    }

    /// What the node's `gpusInUse` faults hold at the end (those with `during` started while
    /// the sweep measured).
    fn end_look(&mut self) -> Result<(), CheckError> {
        let me = super::rank_node(&self.nodes, self.rank)
            .map_err(|e| CheckError::InvalidInput(e.to_string()))?;
        crate::gpu_use::refuse_after(&super::gpu_use(me, false), &super::gpu_use(me, true))
    }

    /// The node's ports as the node pair's model has them ([`crate::pairs::sim::ports`]).
    fn ports(&mut self) -> Option<Vec<gpufabric_api::pair::NicPort>> {
        super::rank_node(&self.nodes, self.rank)
            .ok()
            .map(crate::pairs::sim::ports)
    }
}

/// Every collective of `sweep` at every size over `nodes` of `gpus` GPUs each (see the
/// module doc).
fn rows(nodes: &[FleetNode], gpus: u32, sweep: &Sweep, seed: u64) -> Vec<PairCollective> {
    let k = nodes.len();
    let ranks = k as u32 * gpus;
    let ring = (0..k)
        .map(|i| path_gbps(&nodes[i], &nodes[(i + 1) % k]))
        .fold(f64::INFINITY, f64::min);
    let any_pair = (0..k)
        .flat_map(|i| (i + 1..k).map(move |j| (i, j)))
        .map(|(i, j)| path_gbps(&nodes[i], &nodes[j]))
        .fold(f64::INFINITY, f64::min);
    let alpha_us = if nodes.iter().any(socket) { 60.0 } else { 20.0 };
    let hops = 1.0 + (k as f64).log2();
    let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    let key = names.join(",");
    let mut out = Vec::new();
    for &c in &sweep.collectives {
        let link = if c == Collective::AllToAll {
            any_pair
        } else {
            ring
        };
        let busbw = link
            * efficiency(c)
            * (1.0 - 0.01 * (k as f64).log2())
            * noise(seed, &key, "nccl-nodes", c);
        let algbw = busbw / c.busbw_factor(ranks as usize);
        for &bytes in &sweep.sizes {
            let time_us = alpha_us * hops + bytes as f64 / (algbw * 1e3);
            out.push(PairCollective {
                collective: c,
                bytes,
                time_us,
                algbw: stats::algbw_gbps(bytes, time_us),
                busbw: stats::busbw_gbps(c, ranks, bytes, time_us),
                wrong: 0,
            });
        }
    }
    out
}
