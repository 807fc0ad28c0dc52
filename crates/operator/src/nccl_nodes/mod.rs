//! The multi-node NCCL sweep of a run (`suite.ncclNodes`), without a client: its pods, how it
//! settles into the run's status, and the knees of its curves. It moves as every multi-node
//! group does ([`crate::pairs::group`]); the shell is `controller::run::group`.

use crate::names;
use crate::pairs::group::{GroupPhase, Settled as GroupSettled};
use crate::pairs::pods::{RankPod as RankPodSpec, Rendezvous, rank_pod, rendezvous_timeout};
use crate::pods::BuildError;
use gpufabric_api::nccl_nodes::{
    NcclNodesCurvePoint, NcclNodesKnee, NcclNodesResult, NcclNodesStatus,
};
use gpufabric_api::pair::PairState;
use gpufabric_api::run::{FabricTestRun, FabricTestRunStatus};
use gpufabric_health::scaling::{Curve, CurvePoint, knee};
use k8s_openapi::api::core::v1::Pod;
use kube::Resource;

/// Value of the `gpufabric.io/role` label on the sweep's pods.
pub const ROLE_NCCL_NODES: &str = "nccl-nodes";

/// How the sweep ended.
pub type Settled = GroupSettled<NcclNodesResult>;

/// Name of the pod of `rank` in the run whose [`crate::names::run_base`] is `run`.
pub fn pod_name(run: &str, rank: u32) -> String {
    names::bounded(&format!("{run}-nccl-{rank}"), 63)
}

/// The pod of `rank` of the sweep over `nodes`, on a node of `gpus` GPUs, running
/// `fabric-agent nccl-nodes` with `suite.ncclNodes`' collectives and sizes.
pub fn sweep_pod(
    run: &FabricTestRun,
    nodes: &[String],
    rank: u32,
    rendezvous: &Rendezvous,
    gpus: u32,
) -> Result<Pod, BuildError> {
    let run_name = run.meta().name.clone().ok_or(BuildError::RunNotPersisted)?;
    let node = nodes
        .get(rank as usize)
        .ok_or(BuildError::RunNotPersisted)?;
    let s = &run.spec.suite.nccl_nodes;
    let collectives: Vec<&str> = s.collectives.iter().map(|c| c.api_name()).collect();
    let command = [
        "fabric-agent",
        "nccl-nodes",
        "--nodes",
        &nodes.join(","),
        "--collectives",
        &collectives.join(","),
        "--min-bytes",
        &s.min_bytes.to_string(),
        "--max-bytes",
        &s.max_bytes.to_string(),
        "--step-factor",
        &s.step_factor.to_string(),
        "--large-bytes",
        &s.large_bytes.to_string(),
        "--warmup",
        &s.warmup_iters.to_string(),
        "--iters",
        &s.iters.to_string(),
        "--rendezvous-timeout",
        &rendezvous_timeout(run).to_string(),
    ]
    .map(String::from)
    .to_vec();
    rank_pod(
        run,
        RankPodSpec {
            node,
            gpus,
            name: pod_name(&crate::pods::run_base(run)?, rank),
            role: ROLE_NCCL_NODES,
            rank,
            group: format!("{run_name}/nccl"),
            rendezvous,
            command,
            env: Vec::new(),
        },
    )
}

impl GroupPhase for NcclNodesStatus {
    type Doc = NcclNodesResult;
    const NAME: &'static str = "multi-node NCCL sweep";
    const EVENT_OBJECT: &'static str = "NcclNodes";
    fn slot(status: &mut FabricTestRunStatus) -> &mut Option<Self> {
        &mut status.nccl_nodes
    }
    fn max_nodes(run: &FabricTestRun) -> usize {
        run.spec.suite.nccl_nodes.max_nodes as usize
    }
    crate::pairs::group::group_phase_common!(sweep_pod);
}

/// Writes a settled sweep into the run's status: its points without the per-size rows.
pub fn settle(status: &mut NcclNodesStatus, s: Settled) {
    status.state = s.state;
    status.message = s.message;
    if let Some(d) = s.doc {
        status.points = d.points.iter().map(NcclNodesCurvePoint::from).collect();
        status.gpus_per_node = d.header.gpus_per_node;
    }
    status.done = true;
}

/// The knee of each collective's curve of a measured sweep (`health::scaling::knee`, with
/// `min_gap` the fleet's minimum relative gap), in the order the collectives were measured.
pub fn knees(status: &NcclNodesStatus, min_gap: f64) -> Vec<NcclNodesKnee> {
    if status.state != PairState::Measured {
        return Vec::new();
    }
    status
        .collectives()
        .into_iter()
        .filter_map(|collective| {
            let curve = Curve {
                block: None,
                collective,
                points: status
                    .curve(collective)
                    .into_iter()
                    .map(|(nodes, busbw)| CurvePoint { nodes, busbw })
                    .collect(),
            };
            knee(&curve, min_gap)
        })
        .map(|k| NcclNodesKnee {
            collective: k.collective,
            from_nodes: k.from_nodes,
            at_nodes: k.at_nodes,
            busbw: k.busbw,
            previous_busbw: k.previous,
            message: k.message,
        })
        .collect()
}

/// Condition type on a run: a curve of its multi-node NCCL sweep has a knee (True, reason
/// `KneeInCurve`); set only then. A judgement of the fabric between the nodes, not of a node:
/// no node's verdict changes for it.
pub const CONDITION_SCALING_KNEE: &str = "NcclScalingKnee";

/// With the sweep's `knees`, the run's `NcclScalingKnee` condition and its message say where
/// each curve starts to lose (its nodes' verdicts do not change); without, nothing is set.
pub fn set_knee_condition(
    status: &mut FabricTestRunStatus,
    generation: Option<i64>,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) {
    let Some(knees) = status.nccl_nodes.as_ref().map(|n| &n.knees) else {
        return;
    };
    if knees.is_empty() {
        return;
    }
    let message = knees
        .iter()
        .map(|k| k.message.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    let c = crate::status::condition(
        &status.conditions,
        CONDITION_SCALING_KNEE,
        true,
        "KneeInCurve",
        message.clone(),
        generation,
        now,
    );
    status
        .conditions
        .retain(|c| c.type_ != CONDITION_SCALING_KNEE);
    status.conditions.push(c);
    status.message = Some(match status.message.take() {
        Some(m) if m.contains(&message) => m,
        Some(m) => format!("{m}; {message}"),
        None => message,
    });
}

#[cfg(test)]
mod tests;
