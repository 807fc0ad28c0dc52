//! The multi-node DDP probe of a run (`suite.ddpNodes`), without a client: which nodes it
//! runs on, its pods, where it stands from them, and what its document says. The shell that
//! carries the steps out is `controller::run::ddp_nodes`.
//!
//! The probe moves as every multi-node group does ([`crate::pairs::group::decide`]).

use crate::names;
use crate::pairs::group::{GroupPhase, GroupStep};
pub use crate::pairs::group::{choose, decide};
use crate::pairs::pods::{RankPod as RankPodSpec, Rendezvous, rank_pod, rendezvous_timeout};
use crate::pairs::rank::RankPod;
use crate::pods::BuildError;
use gpufabric_api::ddp_nodes::{DdpNodesResult, DdpNodesStatus};
use gpufabric_api::findings::{ExpectationSource, Finding, FindingKind, Metric, Severity, Subject};
use gpufabric_api::pair::PairState;
use gpufabric_api::run::{FabricTestRun, FabricTestRunStatus};
use k8s_openapi::api::core::v1::Pod;
use kube::Resource;

/// Value of the `gpufabric.io/role` label on the probe's pods.
pub const ROLE_DDP_NODES: &str = "ddp-nodes";

/// A rank's pod as the probe reads it.
pub type ProbePod = RankPod<DdpNodesResult>;

/// Name of the pod of `rank` in the run whose [`crate::names::run_base`] is `run`.
pub fn pod_name(run: &str, rank: u32) -> String {
    names::bounded(&format!("{run}-ddp-{rank}"), 63)
}

/// The pod of `rank` of the probe over `nodes`, on a node of `gpus` GPUs, running
/// `ddpProbe`'s step.
pub fn probe_pod(
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
    let p = &run.spec.suite.ddp_probe;
    let command = [
        "fabric-agent",
        "ddp-nodes",
        "--nodes",
        &nodes.join(","),
        "--hidden",
        &p.hidden.to_string(),
        "--layers",
        &p.layers.to_string(),
        "--batch-per-gpu",
        &p.batch_per_gpu.to_string(),
        "--first-bucket",
        &p.first_bucket_bytes.to_string(),
        "--bucket",
        &p.bucket_bytes.to_string(),
        "--warmup",
        &p.warmup_steps.to_string(),
        "--steps",
        &p.steps.to_string(),
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
            role: ROLE_DDP_NODES,
            rank,
            group: format!("{run_name}/ddp"),
            rendezvous,
            command,
            env: Vec::new(),
        },
    )
}

/// How the probe ended.
pub type Settled = crate::pairs::group::Settled<DdpNodesResult>;

/// The next step of the probe.
pub type ProbeStep = GroupStep<DdpNodesResult>;

impl GroupPhase for DdpNodesStatus {
    type Doc = DdpNodesResult;
    const NAME: &'static str = "multi-node DDP probe";
    const EVENT_OBJECT: &'static str = "DdpNodes";
    fn slot(status: &mut FabricTestRunStatus) -> &mut Option<Self> {
        &mut status.ddp_nodes
    }
    fn max_nodes(run: &FabricTestRun) -> usize {
        run.spec.suite.ddp_nodes.max_nodes as usize
    }
    fn begun(nodes: Vec<String>) -> Self {
        DdpNodesStatus {
            nodes,
            ..Default::default()
        }
    }
    fn skipped(why: String) -> Self {
        DdpNodesStatus {
            done: true,
            message: Some(why),
            ..Default::default()
        }
    }
    fn nodes(&self) -> &[String] {
        &self.nodes
    }
    fn state(&self) -> PairState {
        self.state
    }
    fn set_state(&mut self, state: PairState) {
        self.state = state;
    }
    fn pod_uids(&mut self) -> &mut Vec<String> {
        &mut self.pod_uids
    }
    fn done(&self) -> bool {
        self.done
    }
    fn pod_name(&self, base: &str, rank: u32) -> String {
        pod_name(base, rank)
    }
    fn pod(
        &self,
        run: &FabricTestRun,
        rank: u32,
        rendezvous: &Rendezvous,
        gpus: u32,
    ) -> Result<Pod, BuildError> {
        probe_pod(run, &self.nodes, rank, rendezvous, gpus)
    }
    fn settle(&mut self, settled: Settled) {
        settle(self, settled)
    }
}

/// Writes a settled probe into the run's status.
pub fn settle(status: &mut DdpNodesStatus, s: Settled) {
    status.state = s.state;
    status.message = s.message;
    if let Some(d) = s.doc {
        status.points = d.summary();
        status.stragglers = d.stragglers.clone();
    }
    status.done = true;
}

/// The probe's findings: each straggler node, Info (the node's own check judges its GPUs;
/// a straggler here is a node every other node of a data-parallel job would wait for).
pub fn findings(status: &DdpNodesStatus) -> Vec<Finding> {
    let largest = status.points.last().map_or(0, |p| p.nodes);
    status
        .stragglers
        .iter()
        .map(|s| {
            Finding::new(
                FindingKind::Straggler,
                Subject::node(&s.node),
                Metric::DdpComputeTime,
                Severity::Info,
                format!(
                    "node {}: computes the multi-node DDP step in {:.2} ms, {:.1}% slower than the fastest of the {largest} nodes ({:.2} ms); every node of a data-parallel job waits for it",
                    s.node, s.compute_ms, s.slower_percent, s.fastest_ms
                ),
            )
            .with_evidence(s.compute_ms, s.fastest_ms, "ms", ExpectationSource::Fleet)
        })
        .collect()
}

/// Condition type on a run: its multi-node probe ran far below the test's baseline at some
/// node count (True, reason `ProbeSlow`); set only then. A finding on the run, not on a node.
pub const CONDITION_PROBE_BELOW_BASELINE: &str = "ProbeBelowBaseline";

/// The node counts of a measured probe far below the test's baseline (`health::probe`).
pub fn shortfalls(
    status: &DdpNodesStatus,
    against: &gpufabric_health::evaluate::Against<'_>,
    min_gap: f64,
) -> Vec<gpufabric_health::probe::ProbeShortfall> {
    if status.state != PairState::Measured {
        return Vec::new();
    }
    let points: Vec<(u32, f64)> = status
        .points
        .iter()
        .map(|p| (p.nodes, p.scaling_efficiency))
        .collect();
    gpufabric_health::probe::shortfalls(&points, &status.nodes, against, min_gap)
}

/// With `shortfalls`, the run's `ProbeBelowBaseline` condition and its message say so (its
/// nodes' verdicts do not change); without, nothing is set.
pub fn set_probe_condition(
    status: &mut gpufabric_api::run::FabricTestRunStatus,
    shortfalls: &[gpufabric_health::probe::ProbeShortfall],
    generation: Option<i64>,
    now: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) {
    if shortfalls.is_empty() {
        return;
    }
    let message = shortfalls
        .iter()
        .map(|s| s.message.as_str())
        .collect::<Vec<_>>()
        .join("; ");
    crate::status::put_condition(
        &mut status.conditions,
        CONDITION_PROBE_BELOW_BASELINE,
        true,
        "ProbeSlow",
        message.clone(),
        generation,
        now,
    );
    crate::status::add_note(&mut status.message, &message);
}

#[cfg(test)]
mod tests;
