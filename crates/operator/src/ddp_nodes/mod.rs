//! The multi-node DDP probe of a run (`suite.ddpNodes`), without a client: which nodes it
//! runs on, its pods, where it stands from them, and what its document says. The shell that
//! carries the steps out is `controller::run::ddp_nodes`.
//!
//! # The probe, step by step ([`decide`])
//! 1. `Pending`: the rank-0 pod is created.
//! 2. `Listening`: once it has an IP, the pods of every other rank are created with it. A
//!    pod the API server refuses deletes the others: the probe is all or nothing, and one
//!    that could not start counts against no node.
//! 3. `Joined`: every pod exists; the probe settles when rank 0 has ended (every rank
//!    writes the same points).
//! 4. Past the deadline (the agent timeout and the operator's margin from the rank-0 pod's
//!    creation), its pods are stopped: ranks still running hung (`Errored`), a pod that
//!    never started was not measured.

use crate::names;
use crate::pairs::pods::{RankPod as RankPodSpec, Rendezvous, rank_pod, rendezvous_timeout};
use crate::pairs::rank::{GroupOutcome, RankEnd, RankPod, cut, still_running};
use crate::pods::BuildError;
use gpufabric_api::ddp_nodes::{DdpNodesResult, DdpNodesStatus};
use gpufabric_api::findings::{ExpectationSource, Finding, FindingKind, Metric, Severity, Subject};
use gpufabric_api::pair::PairState;
use gpufabric_api::run::FabricTestRun;
use k8s_openapi::api::core::v1::Pod;
use kube::Resource;
use std::collections::BTreeMap;

/// Value of the `gpufabric.io/role` label on the probe's pods.
pub const ROLE_DDP_NODES: &str = "ddp-nodes";

/// A rank's pod as the probe reads it.
pub type ProbePod = RankPod<DdpNodesResult>;

/// Name of the pod of `rank` in the run whose [`crate::names::run_base`] is `run`.
pub fn pod_name(run: &str, rank: u32) -> String {
    names::bounded(&format!("{run}-ddp-{rank}"), 63)
}

/// The nodes of the probe, by rank: among `candidates` (node, GPUs), those with the GPU
/// count most of them have (every rank must have the same; the larger count on a tie), at
/// most `max`, picked by `seed` so that each run probes another set, sorted by name.
pub fn choose(candidates: &[(String, u32)], max: usize, seed: u64) -> Vec<String> {
    let mut by_gpus: BTreeMap<u32, usize> = BTreeMap::new();
    for (_, g) in candidates.iter().filter(|(_, g)| *g > 0) {
        *by_gpus.entry(*g).or_default() += 1;
    }
    let Some(gpus) = by_gpus
        .iter()
        .max_by_key(|(g, n)| (**n, **g))
        .map(|(g, _)| *g)
    else {
        return Vec::new();
    };
    let mut pool: Vec<&String> = candidates
        .iter()
        .filter(|(_, g)| *g == gpus)
        .map(|(n, _)| n)
        .collect();
    let key = |n: &String| gpufabric_api::fnv1a(format!("{seed}/{n}").as_bytes());
    pool.sort_by_key(|n| (key(n), n.as_str()));
    let mut chosen: Vec<String> = pool.into_iter().take(max).cloned().collect();
    chosen.sort();
    chosen
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
#[derive(Debug, Clone, PartialEq)]
pub struct Settled {
    pub state: PairState,
    pub doc: Option<Box<DdpNodesResult>>,
    pub message: Option<String>,
}

impl GroupOutcome for Settled {
    fn errored(&self) -> bool {
        self.state == PairState::Errored
    }
    fn not_measured(why: String) -> Self {
        Settled::not_measured(why)
    }
}

impl Settled {
    pub(crate) fn not_measured(message: impl Into<String>) -> Self {
        Settled {
            state: PairState::NotMeasured,
            doc: None,
            message: Some(cut(&message.into())),
        }
    }
    fn errored(message: impl Into<String>) -> Self {
        Settled {
            state: PairState::Errored,
            doc: None,
            message: Some(cut(&message.into())),
        }
    }
}

/// The next step of the probe.
#[derive(Debug, Clone, PartialEq)]
pub enum ProbeStep {
    CreateRank0,
    /// Create every other rank's pod, joining rank 0 at `ip`.
    CreateOthers {
        ip: String,
    },
    Wait,
    /// Delete whatever pods are left, then settle.
    Stop(Settled),
    Settle(Settled),
}

/// The next step for the probe in `state` whose pods stand as `pods` (by rank) on `nodes`;
/// `past_deadline`: its deadline has passed.
pub fn decide(
    state: PairState,
    pods: &[ProbePod],
    nodes: &[String],
    past_deadline: bool,
) -> ProbeStep {
    if state.is_final() || pods.is_empty() {
        return ProbeStep::Wait;
    }
    let node = |i: usize| nodes.get(i).map_or("?", String::as_str);
    let others = &pods[1..];
    let absent = others.iter().position(|p| matches!(p, RankPod::Absent));
    match &pods[0] {
        RankPod::Absent if state == PairState::Pending => return ProbeStep::CreateRank0,
        RankPod::Absent => {
            return ProbeStep::Stop(Settled::not_measured(format!(
                "the rank-0 pod on {} is gone",
                node(0)
            )));
        }
        RankPod::Ended(e0) => {
            let all_ended = others.iter().all(|p| matches!(p, RankPod::Ended(_)));
            if all_ended || state != PairState::Joined {
                return ProbeStep::Settle(outcome(e0, others));
            }
            if past_deadline {
                return ProbeStep::Stop(with_stuck_rank(outcome(e0, others), others, &node));
            }
            return ProbeStep::Wait;
        }
        _ => {}
    }
    if state == PairState::Joined
        && let Some(i) = absent
    {
        return ProbeStep::Stop(Settled::not_measured(format!(
            "the rank-{} pod on {} is gone",
            i + 1,
            node(i + 1)
        )));
    }
    if !past_deadline {
        return match (state, pods[0].ip()) {
            (PairState::Listening, Some(ip)) if absent.is_some() => {
                ProbeStep::CreateOthers { ip: ip.to_string() }
            }
            _ => ProbeStep::Wait,
        };
    }
    if state == PairState::Joined && pods.iter().all(|p| matches!(p, RankPod::Running { .. })) {
        return ProbeStep::Stop(Settled::errored(
            "every rank was still running at the probe's deadline (a hang in NCCL between the nodes?)",
        ));
    }
    if matches!(pods[0], RankPod::Running { .. })
        && others.iter().any(|p| matches!(p, RankPod::Ended(_)))
    {
        // Rank 0 stuck while others ended: named, with what the others said.
        let others_said = others
            .iter()
            .find_map(|p| match p {
                RankPod::Ended(RankEnd::Document(d)) => d
                    .not_measured
                    .as_ref()
                    .map(|n| n.message.clone())
                    .or_else(|| d.errors.first().map(|e| e.message.clone())),
                RankPod::Ended(RankEnd::NotMeasured(m) | RankEnd::Failed(m)) => Some(m.clone()),
                _ => None,
            })
            .map(|m| format!("another rank: {m}"));
        return ProbeStep::Stop(Settled::not_measured(still_running(
            0,
            node(0),
            "probe",
            others_said,
        )));
    }
    let waiting = pods
        .iter()
        .position(|p| matches!(p, RankPod::Waiting { .. } | RankPod::Absent))
        .unwrap_or(0);
    ProbeStep::Stop(Settled::not_measured(format!(
        "the pod on {} never started before the probe's deadline",
        node(waiting)
    )))
}

/// `settled`, with the first rank still Running at the deadline after rank 0 ended named in
/// its message ([`still_running`]). Its state is left as it is: a rank stuck alone may wait on
/// its node or on the network between, and the probe holds nothing against a node for it.
fn with_stuck_rank<'a>(
    mut settled: Settled,
    others: &[ProbePod],
    node: &dyn Fn(usize) -> &'a str,
) -> Settled {
    if let Some(i) = others
        .iter()
        .position(|p| matches!(p, RankPod::Running { .. }))
    {
        settled.message = Some(still_running(i + 1, node(i + 1), "probe", settled.message));
    }
    settled
}

/// What rank 0's end says, with the other ranks' ends for a reason when it has none.
fn outcome(e0: &RankEnd<DdpNodesResult>, others: &[ProbePod]) -> Settled {
    let ends = std::iter::once(e0).chain(others.iter().filter_map(|p| match p {
        RankPod::Ended(e) => Some(e),
        _ => None,
    }));
    for e in ends {
        match e {
            RankEnd::Document(d) => {
                if let Some(n) = &d.not_measured {
                    return Settled::not_measured(n.message.clone());
                }
            }
            RankEnd::NotMeasured(m) => return Settled::not_measured(m.clone()),
            RankEnd::Failed(_) => {}
        }
    }
    match e0 {
        RankEnd::Document(d) if d.errors.is_empty() && !d.points.is_empty() => Settled {
            state: PairState::Measured,
            doc: Some(d.clone()),
            message: None,
        },
        RankEnd::Document(d) => Settled::errored(
            d.errors
                .first()
                .map(|e| format!("rank 0: {}", e.message))
                .unwrap_or_else(|| "rank 0 measured no point".into()),
        ),
        RankEnd::Failed(m) => Settled::errored(format!("rank 0: {m}")),
        RankEnd::NotMeasured(m) => Settled::not_measured(m.clone()),
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
    let c = crate::status::condition(
        &status.conditions,
        CONDITION_PROBE_BELOW_BASELINE,
        true,
        "ProbeSlow",
        message.clone(),
        generation,
        now,
    );
    status
        .conditions
        .retain(|c| c.type_ != CONDITION_PROBE_BELOW_BASELINE);
    status.conditions.push(c);
    status.message = Some(match status.message.take() {
        Some(m) if m.contains(&message) => m,
        Some(m) => format!("{m}; {message}"),
        None => message,
    });
}

#[cfg(test)]
mod tests;
