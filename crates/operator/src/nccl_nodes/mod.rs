//! The multi-node NCCL sweep of a run (`suite.ncclNodes`), without a client: its pods, how it
//! settles into the run's status, the knees of its curves, the ceilings its nodes' links
//! allow and, with a `topologyKey`, its sweeps per topology block and the blocks slower than
//! the others. It moves as every
//! multi-node group does ([`crate::pairs::group`]), one group after the other (each block's,
//! then the one across blocks); the shell is `controller::run::group`.

use crate::names;
use crate::pairs::group::Blocks;
use crate::pairs::group::{GroupPhase, Settled as GroupSettled};
use crate::pairs::pods::{RankPod as RankPodSpec, Rendezvous, rank_pod, rendezvous_timeout};
use crate::pods::BuildError;
use gpufabric_api::link_ceiling::{LinkGapKind, NcclNodesLinkGap};
use gpufabric_api::nccl_nodes::{
    NcclNodesBlock, NcclNodesCurvePoint, NcclNodesKnee, NcclNodesResult, NcclNodesSlowBlock,
    NcclNodesStatus, NcclNodesSweep,
};
use gpufabric_api::pair::PairState;
use gpufabric_api::run::{FabricTestRun, FabricTestRunStatus};
use gpufabric_health::evaluate::baseline::Against;
use gpufabric_health::fleet::Rule;
use gpufabric_health::links::{self, Measured};
use gpufabric_health::scaling::{Curve, CurvePoint, below_baseline, knee, slow_blocks as slow};
use k8s_openapi::api::core::v1::Pod;
use kube::Resource;

/// Value of the `gpufabric.io/role` label on the sweep's pods.
pub const ROLE_NCCL_NODES: &str = "nccl-nodes";

/// How the sweep ended.
pub type Settled = GroupSettled<NcclNodesResult>;

/// Name of the pod of `rank` in the run whose [`crate::names::run_base`] is `run`: of the
/// sweep of topology block `block` (its index in the status), or of the group's (across
/// blocks) without.
pub fn pod_name(run: &str, block: Option<usize>, rank: u32) -> String {
    match block {
        Some(b) => names::bounded(&format!("{run}-nccl-b{b}-{rank}"), 63),
        None => names::bounded(&format!("{run}-nccl-{rank}"), 63),
    }
}

/// The pod of `rank` of the sweep over `nodes` (of topology block `block`, by its index, or
/// the group's), on a node of `gpus` GPUs, running `fabric-agent nccl-nodes` with
/// `suite.ncclNodes`' collectives and sizes.
pub fn sweep_pod(
    run: &FabricTestRun,
    nodes: &[String],
    block: Option<usize>,
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
            name: pod_name(&crate::pods::run_base(run)?, block, rank),
            role: ROLE_NCCL_NODES,
            rank,
            group: match block {
                Some(b) => format!("{run_name}/nccl/b{b}"),
                None => format!("{run_name}/nccl"),
            },
            rendezvous,
            command,
            env: Vec::new(),
        },
    )
}

/// The sweep that moves now: the first block's not yet done, else the one across blocks (or
/// the group's), with the block's index.
fn current(status: &NcclNodesStatus) -> (Option<usize>, &NcclNodesSweep) {
    match status.blocks.iter().position(|b| !b.sweep.done) {
        Some(i) => (Some(i), &status.blocks[i].sweep),
        None => (None, &status.sweep),
    }
}

fn current_mut(status: &mut NcclNodesStatus) -> &mut NcclNodesSweep {
    match status.blocks.iter().position(|b| !b.sweep.done) {
        Some(i) => &mut status.blocks[i].sweep,
        None => &mut status.sweep,
    }
}

/// The status of a sweep over `blocks` of the label `key`: a block of one node has nothing to
/// sweep inside it, and fewer than two blocks nothing across them (each done at once, saying
/// so); the others wait their turn.
pub fn in_blocks(key: &str, blocks: Blocks) -> NcclNodesStatus {
    let mut status = NcclNodesStatus {
        sweep: NcclNodesSweep {
            nodes: blocks.across,
            ..Default::default()
        },
        topology_key: Some(key.to_string()),
        blocks: blocks
            .blocks
            .into_iter()
            .map(|(value, nodes)| {
                let alone = nodes.len() < 2;
                NcclNodesBlock {
                    sweep: NcclNodesSweep {
                        nodes,
                        done: alone,
                        message: alone.then(|| {
                            format!("one node of {key}={value} passed: nothing to sweep inside it")
                        }),
                        ..Default::default()
                    },
                    value,
                }
            })
            .collect(),
        slow_blocks: Vec::new(),
        below_baseline: Vec::new(),
        link_gaps: Vec::new(),
    };
    if blocks.unlabelled > 0 {
        status.sweep.message = Some(format!(
            "{} node(s) without the label {key} took no part",
            blocks.unlabelled
        ));
    }
    end_across_if_alone(&mut status);
    status
}

/// With every block done and fewer than two nodes across them, the phase is done.
fn end_across_if_alone(status: &mut NcclNodesStatus) {
    if status.blocks.iter().all(|b| b.sweep.done) && status.sweep.nodes.len() < 2 {
        let why = format!(
            "{} block(s) of {}: nothing to sweep across blocks",
            status.sweep.nodes.len(),
            status.topology_key.as_deref().unwrap_or("the label")
        );
        status.sweep.message = Some(match status.sweep.message.take() {
            Some(m) => format!("{m}; {why}"),
            None => why,
        });
        status.sweep.done = true;
    }
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
    fn begun(nodes: Vec<String>) -> Self {
        NcclNodesStatus {
            sweep: NcclNodesSweep {
                nodes,
                ..Default::default()
            },
            ..Default::default()
        }
    }
    fn topology_key(run: &FabricTestRun) -> Option<&str> {
        run.spec.suite.nccl_nodes.topology_key.as_deref()
    }
    fn begun_in_blocks(key: &str, blocks: Blocks) -> Self {
        in_blocks(key, blocks)
    }
    fn skipped(why: String) -> Self {
        NcclNodesStatus {
            sweep: NcclNodesSweep {
                done: true,
                message: Some(why),
                ..Default::default()
            },
            ..Default::default()
        }
    }
    fn nodes(&self) -> &[String] {
        &current(self).1.nodes
    }
    fn state(&self) -> PairState {
        current(self).1.state
    }
    fn set_state(&mut self, state: PairState) {
        current_mut(self).state = state;
    }
    fn pod_uids(&mut self) -> &mut Vec<String> {
        &mut current_mut(self).pod_uids
    }
    fn done(&self) -> bool {
        self.sweep.done
    }
    fn pod_name(&self, base: &str, rank: u32) -> String {
        pod_name(base, current(self).0, rank)
    }
    fn pod(
        &self,
        run: &FabricTestRun,
        rank: u32,
        rendezvous: &Rendezvous,
        gpus: u32,
    ) -> Result<Pod, BuildError> {
        let (block, sweep) = current(self);
        sweep_pod(run, &sweep.nodes, block, rank, rendezvous, gpus)
    }
    fn settle(&mut self, settled: Settled) {
        settle(self, settled)
    }
}

/// Writes the current sweep's end into the run's status (its points without the per-size
/// rows); the phase is done after the sweep across blocks, or after the last block's when
/// there is none across.
pub fn settle(status: &mut NcclNodesStatus, s: Settled) {
    let sweep = current_mut(status);
    sweep.state = s.state;
    sweep.message = match (sweep.message.take(), s.message) {
        (Some(a), Some(b)) => Some(format!("{a}; {b}")),
        (a, b) => b.or(a),
    };
    if let Some(d) = s.doc {
        sweep.points = d.points.iter().map(NcclNodesCurvePoint::from).collect();
        sweep.gpus_per_node = d.header.gpus_per_node;
    }
    sweep.done = true;
    end_across_if_alone(status);
}

/// Each collective's curve of a measured sweep (none otherwise), named for `block`.
fn curves(sweep: &NcclNodesSweep, block: Option<&str>) -> Vec<Curve> {
    if sweep.state != PairState::Measured {
        return Vec::new();
    }
    sweep
        .collectives()
        .into_iter()
        .map(|collective| Curve {
            block: block.map(str::to_string),
            collective,
            points: sweep
                .curve(collective)
                .into_iter()
                .map(|(nodes, busbw)| CurvePoint { nodes, busbw })
                .collect(),
        })
        .collect()
}

/// Judges a sweep that ended: the knees of the group's curve (or the one across blocks) and
/// of each block's, the blocks whose curve falls below the others' (`rule`: the fleet's
/// outlier rule; at least three blocks are compared), `against` the test's baseline the
/// group's node counts far below it, and every sweep's points against the ceiling of the
/// links their nodes report.
pub fn judge(status: &mut NcclNodesStatus, rule: &Rule, against: Option<&Against<'_>>) {
    let mut gaps = Vec::new();
    for b in &mut status.blocks {
        gaps.extend(link_ceilings(&mut b.sweep, Some(&b.value)));
    }
    gaps.extend(link_ceilings(&mut status.sweep, None));
    status.link_gaps = gaps;
    status.below_baseline = match against {
        Some(a) if status.sweep.state == PairState::Measured => below_baseline(
            &curves(&status.sweep, None),
            &status.sweep.nodes,
            a,
            rule.min_gap,
        ),
        _ => Vec::new(),
    };
    status.sweep.knees = knees(&status.sweep, None, rule.min_gap);
    for b in &mut status.blocks {
        b.sweep.knees = knees(&b.sweep, Some(&b.value), rule.min_gap);
    }
    status.slow_blocks = match &status.topology_key {
        Some(key) => slow_blocks(key, &status.blocks, rule),
        None => Vec::new(),
    };
}

/// Writes each point's ceilings from its links (`health::links`) into a measured sweep (of
/// topology block `block`, or the group's) and returns its counts far below or above them.
pub fn link_ceilings(sweep: &mut NcclNodesSweep, block: Option<&str>) -> Vec<NcclNodesLinkGap> {
    if sweep.state != PairState::Measured {
        for p in &mut sweep.points {
            p.ceilings.clear();
        }
        return Vec::new();
    }
    let gpus = sweep.gpus_per_node;
    let measured: Vec<Measured<'_>> = sweep
        .points
        .iter()
        .map(|p| Measured {
            nodes: p.nodes,
            gpus,
            links: p.links.as_ref(),
            busbw: p
                .summary
                .iter()
                .map(|s| (s.collective, s.large_busbw))
                .collect(),
        })
        .collect();
    let ceilings: Vec<_> = measured.iter().map(links::ceilings).collect();
    let gaps = links::gaps(&measured, block);
    for (p, c) in sweep.points.iter_mut().zip(ceilings) {
        p.ceilings = c;
    }
    gaps
}

/// The blocks whose curve is an outlier below the other blocks'
/// (`health::scaling::slow_blocks`), one per block and collective.
pub fn slow_blocks(key: &str, blocks: &[NcclNodesBlock], rule: &Rule) -> Vec<NcclNodesSlowBlock> {
    let curves: Vec<Curve> = blocks
        .iter()
        .flat_map(|b| curves(&b.sweep, Some(&b.value)))
        .collect();
    slow(key, &curves, rule)
}

/// The knee of each collective's curve of a measured sweep (`health::scaling::knee`, with
/// `min_gap` the fleet's minimum relative gap), named for `block`, in the order the
/// collectives were measured.
pub fn knees(sweep: &NcclNodesSweep, block: Option<&str>, min_gap: f64) -> Vec<NcclNodesKnee> {
    curves(sweep, block)
        .iter()
        .filter_map(|curve| knee(curve, min_gap))
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

/// Condition type on a run: a topology block's curve of its multi-node NCCL sweep fell below
/// the other blocks' (True, reason `SlowBlock`); set only then. A Warning on the block, not
/// on a node: no node's verdict changes for it, no node is quarantined for it.
pub const CONDITION_SLOW_BLOCK: &str = "NcclSlowBlock";

/// Condition type on a run: a node count of its multi-node NCCL sweep fell far below the
/// test's baseline there (True, reason `SweepSlow`); set only then. A judgement of the fabric
/// between the nodes: no node's verdict changes for it.
pub const CONDITION_SWEEP_BELOW_BASELINE: &str = "NcclBelowBaseline";

/// Condition type on a run: a node count of its multi-node NCCL sweep reached less than
/// `health::links::MIN_SHARE` of the busbw the links its nodes report allow (True, reason
/// `FarBelowLinks`); set only then. A judgement of the fabric, not of a node: no node's verdict
/// changes for it, no node is quarantined for it.
pub const CONDITION_BELOW_LINKS: &str = "NcclBelowLinks";

/// Condition type on a run: a node count of its multi-node NCCL sweep measured more than the
/// links its nodes report can carry (True, reason `AboveLinks`): the ports were reported wrong
/// or the traffic does not cross them, so the ceiling cannot be trusted; set only then.
pub const CONDITION_ABOVE_LINKS: &str = "NcclAboveLinks";

/// With knees in the sweep's curves (the group's or across blocks, and each block's), the
/// run's `NcclScalingKnee` condition says where each curve starts to lose; with slow blocks,
/// its `NcclSlowBlock` condition names them (label and value); with counts far below their
/// links' ceiling or above it, `NcclBelowLinks` and `NcclAboveLinks` say which; each message
/// joins the run's.
/// Without, nothing is set. Its nodes' verdicts do not change.
pub fn set_knee_condition(
    status: &mut FabricTestRunStatus,
    generation: Option<i64>,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) {
    let Some(sweep) = status.nccl_nodes.as_ref() else {
        return;
    };
    let knees: Vec<&str> = sweep
        .sweep
        .knees
        .iter()
        .chain(sweep.blocks.iter().flat_map(|b| &b.sweep.knees))
        .map(|k| k.message.as_str())
        .collect();
    let knees = knees.join("; ");
    let slow = sweep
        .slow_blocks
        .iter()
        .map(|b| b.message.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    let below = sweep
        .below_baseline
        .iter()
        .map(|b| b.message.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    let gaps = |kind: LinkGapKind| {
        sweep
            .link_gaps
            .iter()
            .filter(|g| g.kind == kind)
            .map(|g| g.message.as_str())
            .collect::<Vec<_>>()
            .join("; ")
    };
    let (below_links, above_links) = (gaps(LinkGapKind::Below), gaps(LinkGapKind::Above));
    for (type_, reason, message) in [
        (CONDITION_SCALING_KNEE, "KneeInCurve", knees),
        (CONDITION_SLOW_BLOCK, "SlowBlock", slow),
        (CONDITION_SWEEP_BELOW_BASELINE, "SweepSlow", below),
        (CONDITION_BELOW_LINKS, "FarBelowLinks", below_links),
        (CONDITION_ABOVE_LINKS, "AboveLinks", above_links),
    ] {
        if message.is_empty() {
            continue;
        }
        crate::status::put_condition(
            &mut status.conditions,
            type_,
            true,
            reason,
            message.clone(),
            generation,
            now,
        );
        crate::status::add_note(&mut status.message, &message);
    }
}

#[cfg(test)]
mod tests;
