//! The sim backend's part of the multi-node DDP probe: one node's times at a node count,
//! from the fleet's model. Compute as in the node probe (a straggling GPU slows its node);
//! between nodes, each bucket's all-reduce runs as a ring over the slowest link of the
//! ring's nodes (a slow NIC, a bad path or sockets slow every node count that includes it).

use super::node_model::NodeModel;
use super::phases::{COMPUTE_CONTENTION, StepShape, compute_alone, gemms_done, overlapped_end};
use crate::ddp_nodes::{NodeError, NodeMeasure, NodeTimes};
use crate::fleet::FleetNode;
use crate::{CheckError, Progress};
use gpufabric_api::result::{Backend, Phase, PhaseError};
use gpufabric_api::suite::{Collective, DdpProbe};
use std::time::Duration;

/// Latency of one inter-node all-reduce step, µs.
const NET_ALPHA_US: f64 = 20.0;

/// One rank of the probe on the sim backend.
pub struct SimDdpNodes {
    /// The group's nodes, by rank (all in the fleet).
    pub nodes: Vec<FleetNode>,
    pub rank: u32,
    pub shape: DdpProbe,
    pub seed: u64,
}

impl SimDdpNodes {
    /// This rank's node.
    fn me(&self) -> Result<&FleetNode, NodeError> {
        super::rank_node(&self.nodes, self.rank)
    }
}

impl NodeMeasure for SimDdpNodes {
    fn kind(&self) -> Backend {
        Backend::Sim
    }

    /// The node's `gpusInUse` faults present from the start.
    fn prepare(&mut self, shared: bool, progress: Progress) -> Result<u32, CheckError> {
        super::prepare_rank(&self.nodes, self.rank, shared, progress)
    }

    /// The node's `hang` fault in phase `ddpProbe`.
    fn hang(&self, timeout: Duration, progress: Progress) -> Option<PhaseError> {
        let me = self.me().ok()?;
        super::hang(me, Phase::DdpProbe, timeout, progress)
    }

    /// What the node's `gpusInUse` faults hold at the end, as the cuda backend's look of a
    /// rank whose workers ended.
    fn end_look(&mut self) -> Result<(), CheckError> {
        let me = self
            .me()
            .map_err(|e| CheckError::InvalidInput(e.to_string()))?;
        crate::gpu_use::refuse_at_end(&super::gpu_use(me, true))
    }

    fn make_id(&mut self) -> Result<Vec<u8>, NodeError> {
        super::random_comm_id()
    }

    fn measure(&mut self, k: u32, _id: &[u8]) -> Result<NodeTimes, NodeError> {
        let me = self.me()?;
        let ring: Vec<&FleetNode> = self
            .nodes
            .get(..k as usize)
            .ok_or(NodeError::TooFewNodes)?
            .iter()
            .collect();
        super::pace::spend("ddpNodes", &me.name, self.seed);
        Ok(node_times(me, &ring, &self.shape, self.seed, k))
    }
}

fn node_times(
    me: &FleetNode,
    ring: &[&FleetNode],
    shape: &DdpProbe,
    seed: u64,
    k: u32,
) -> NodeTimes {
    let m = NodeModel::new(me, seed);
    let StepShape {
        layers,
        flops,
        gemms,
        buckets,
        ..
    } = StepShape::of(shape);
    let mut rng = m.rng(&format!("ddp-nodes-{k}"));
    let gpus: Vec<u32> = (0..m.gpus()).collect();
    let ranks = k * m.gpus();
    let alone = compute_alone(&m, flops, &gpus, &mut rng, 0.002);
    let contention = if ranks > 1 { COMPUTE_CONTENTION } else { 1.0 };
    let compute: Vec<f64> = alone.iter().map(|c| c * contention).collect();
    let compute_max = compute.iter().copied().fold(0.0, f64::max);
    let per_gemm = compute_max / gemms;
    // The ring's slowest link between consecutive nodes.
    let net_gbps = (0..ring.len())
        .filter(|_| ring.len() > 1)
        .map(|i| crate::pairs::sim::path_gbps(ring[i], ring[(i + 1) % ring.len()]))
        .fold(f64::INFINITY, f64::min);
    let (mut comm_end, mut comm_alone) = (0.0f64, 0.0f64);
    if ranks > 1 {
        for b in &buckets {
            let t = if ring.len() > 1 {
                let n = f64::from(ranks);
                (NET_ALPHA_US + b.bytes as f64 * 2.0 * (n - 1.0) / n / (net_gbps * 1e3)) / 1e3
            } else {
                m.collective_time_us(Collective::AllReduce, &gpus, b.bytes) / 1e3
            } * rng.jitter(0.004);
            comm_alone += t;
            let ready = per_gemm * gemms_done(layers, b.ready_after_layer);
            comm_end = overlapped_end(comm_end.max(ready), t, compute_max);
        }
    }
    NodeTimes {
        step_ms: compute_max.max(comm_end),
        compute_ms: compute,
        compute_alone_ms: alone.iter().copied().fold(0.0, f64::max),
        comm_alone_ms: comm_alone,
    }
}
