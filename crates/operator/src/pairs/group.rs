//! A multi-node rendezvous group (the multi-node DDP probe, the multi-node NCCL sweep), without
//! a client: where it stands from its ranks' pods and what to do next, for any document its
//! ranks write ([`GroupDocument`]). The shell is `controller::run::group`.
//!
//! # A group, step by step ([`decide`])
//! 1. `Pending`: the rank-0 pod is created.
//! 2. `Listening`: once it has an IP, the pods of every other rank are created with it. A
//!    pod the API server refuses deletes the others: the group is all or nothing, and one
//!    that could not start counts against no node.
//! 3. `Joined`: every pod exists; the group settles when rank 0 has ended (every rank
//!    writes the same points).
//! 4. Past the deadline (the agent timeout and the operator's margin from the rank-0 pod's
//!    creation), its pods are stopped: ranks still running hung (`Errored`), a pod that
//!    never started was not measured.

use super::pods::Rendezvous;
use super::rank::{GroupOutcome, RankDocument, RankEnd, RankPod, cut, still_running};
use crate::pods::BuildError;
use gpufabric_api::ddp_nodes::DdpNodesResult;
use gpufabric_api::nccl_nodes::NcclNodesResult;
use gpufabric_api::pair::PairState;
use gpufabric_api::run::{FabricTestRun, FabricTestRunStatus};
use k8s_openapi::api::core::v1::Pod;
use std::collections::BTreeMap;

/// The document each rank of a multi-node group writes, as the group's decision reads it.
pub trait GroupDocument: RankDocument + Clone {
    /// What the group is called in its messages ("probe": "the probe's deadline").
    const GROUP: &'static str;
    /// Why the group could not be measured, when the rank says so (a rank that never
    /// arrived, ...).
    fn not_measured(&self) -> Option<&str>;
    /// The first error the rank reports.
    fn first_error(&self) -> Option<&str>;
    /// The document holds at least one measured point.
    fn measured(&self) -> bool;
}

impl GroupDocument for DdpNodesResult {
    const GROUP: &'static str = "probe";
    fn not_measured(&self) -> Option<&str> {
        self.not_measured.as_ref().map(|n| n.message.as_str())
    }
    fn first_error(&self) -> Option<&str> {
        self.errors.first().map(|e| e.message.as_str())
    }
    fn measured(&self) -> bool {
        !self.points.is_empty()
    }
}

impl GroupDocument for NcclNodesResult {
    const GROUP: &'static str = "sweep";
    fn not_measured(&self) -> Option<&str> {
        self.not_measured.as_ref().map(|n| n.message.as_str())
    }
    fn first_error(&self) -> Option<&str> {
        self.errors.first().map(|e| e.message.as_str())
    }
    fn measured(&self) -> bool {
        !self.points.is_empty()
    }
}

/// How a group ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Settled<D> {
    pub state: PairState,
    pub doc: Option<Box<D>>,
    pub message: Option<String>,
}

impl<D> GroupOutcome for Settled<D> {
    fn errored(&self) -> bool {
        self.state == PairState::Errored
    }
    fn not_measured(why: String) -> Self {
        Settled::not_measured(why)
    }
}

impl<D> Settled<D> {
    pub fn not_measured(message: impl Into<String>) -> Self {
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

/// The next step of a group.
#[derive(Debug, Clone, PartialEq)]
pub enum GroupStep<D> {
    CreateRank0,
    /// Create every other rank's pod, joining rank 0 at `ip`.
    CreateOthers {
        ip: String,
    },
    Wait,
    /// Delete whatever pods are left, then settle.
    Stop(Settled<D>),
    Settle(Settled<D>),
}

/// The next step for the group in `state` whose pods stand as `pods` (by rank) on `nodes`;
/// `past_deadline`: its deadline has passed.
pub fn decide<D: GroupDocument>(
    state: PairState,
    pods: &[RankPod<D>],
    nodes: &[String],
    past_deadline: bool,
) -> GroupStep<D> {
    if state.is_final() || pods.is_empty() {
        return GroupStep::Wait;
    }
    let group = D::GROUP;
    let node = |i: usize| nodes.get(i).map_or("?", String::as_str);
    let others = &pods[1..];
    let absent = others.iter().position(|p| matches!(p, RankPod::Absent));
    match &pods[0] {
        RankPod::Absent if state == PairState::Pending => return GroupStep::CreateRank0,
        RankPod::Absent => {
            return GroupStep::Stop(Settled::not_measured(format!(
                "the rank-0 pod on {} is gone",
                node(0)
            )));
        }
        RankPod::Ended(e0) => {
            let all_ended = others.iter().all(|p| matches!(p, RankPod::Ended(_)));
            if all_ended || state != PairState::Joined {
                return GroupStep::Settle(outcome(e0, others));
            }
            if past_deadline {
                return GroupStep::Stop(with_stuck_rank(outcome(e0, others), others, &node));
            }
            return GroupStep::Wait;
        }
        _ => {}
    }
    if state == PairState::Joined
        && let Some(i) = absent
    {
        return GroupStep::Stop(Settled::not_measured(format!(
            "the rank-{} pod on {} is gone",
            i + 1,
            node(i + 1)
        )));
    }
    if !past_deadline {
        return match (state, pods[0].ip()) {
            (PairState::Listening, Some(ip)) if absent.is_some() => {
                GroupStep::CreateOthers { ip: ip.to_string() }
            }
            _ => GroupStep::Wait,
        };
    }
    if state == PairState::Joined && pods.iter().all(|p| matches!(p, RankPod::Running { .. })) {
        return GroupStep::Stop(Settled::errored(format!(
            "every rank was still running at the {group}'s deadline (a hang in NCCL between the nodes?)"
        )));
    }
    if matches!(pods[0], RankPod::Running { .. })
        && others.iter().any(|p| matches!(p, RankPod::Ended(_)))
    {
        // Rank 0 stuck while others ended: named, with what the others said.
        let others_said = others
            .iter()
            .find_map(|p| match p {
                RankPod::Ended(RankEnd::Document(d)) => d
                    .not_measured()
                    .or_else(|| d.first_error())
                    .map(str::to_string),
                RankPod::Ended(RankEnd::NotMeasured(m) | RankEnd::Failed(m)) => Some(m.clone()),
                _ => None,
            })
            .map(|m| format!("another rank: {m}"));
        return GroupStep::Stop(Settled::not_measured(still_running(
            0,
            node(0),
            group,
            others_said,
        )));
    }
    let waiting = pods
        .iter()
        .position(|p| matches!(p, RankPod::Waiting { .. } | RankPod::Absent))
        .unwrap_or(0);
    GroupStep::Stop(Settled::not_measured(format!(
        "the pod on {} never started before the {group}'s deadline",
        node(waiting)
    )))
}

/// `settled`, with the first rank still Running at the deadline after rank 0 ended named in
/// its message ([`still_running`]). Its state is left as it is: a rank stuck alone may wait on
/// its node or on the network between, and the group holds nothing against a node for it.
fn with_stuck_rank<'a, D: GroupDocument>(
    mut settled: Settled<D>,
    others: &[RankPod<D>],
    node: &dyn Fn(usize) -> &'a str,
) -> Settled<D> {
    if let Some(i) = others
        .iter()
        .position(|p| matches!(p, RankPod::Running { .. }))
    {
        settled.message = Some(still_running(i + 1, node(i + 1), D::GROUP, settled.message));
    }
    settled
}

/// What rank 0's end says, with the other ranks' ends for a reason when it has none.
fn outcome<D: GroupDocument>(e0: &RankEnd<D>, others: &[RankPod<D>]) -> Settled<D> {
    let ends = std::iter::once(e0).chain(others.iter().filter_map(|p| match p {
        RankPod::Ended(e) => Some(e),
        _ => None,
    }));
    for e in ends {
        match e {
            RankEnd::Document(d) => {
                if let Some(n) = d.not_measured() {
                    return Settled::not_measured(n);
                }
            }
            RankEnd::NotMeasured(m) => return Settled::not_measured(m.clone()),
            RankEnd::Failed(_) => {}
        }
    }
    match e0 {
        RankEnd::Document(d) if d.first_error().is_none() && d.measured() => Settled {
            state: PairState::Measured,
            doc: Some(d.clone()),
            message: None,
        },
        RankEnd::Document(d) => Settled::errored(
            d.first_error()
                .map(|e| format!("rank 0: {e}"))
                .unwrap_or_else(|| "rank 0 measured no point".into()),
        ),
        RankEnd::Failed(m) => Settled::errored(format!("rank 0: {m}")),
        RankEnd::NotMeasured(m) => Settled::not_measured(m.clone()),
    }
}

/// The nodes of a group, by rank: among `candidates` (node, GPUs), those with the GPU
/// count most of them have (every rank must have the same; the larger count on a tie), at
/// most `max`, picked by `seed` so that each run measures another set, sorted by name.
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

/// The part of a [`GroupPhase`] that every phase's status holds under the same field names
/// (`nodes`, `state`, `podUids`, `done`, `message`) and the phase's own `pod_name`, `settle`
/// and `$pod` (its pod builder, `fn(run, nodes, rank, rendezvous, gpus)`) in its module.
macro_rules! group_phase_common {
    ($pod:ident) => {
        fn begun(nodes: Vec<String>) -> Self {
            Self {
                nodes,
                ..Default::default()
            }
        }
        fn skipped(why: String) -> Self {
            Self {
                done: true,
                message: Some(why),
                ..Default::default()
            }
        }
        fn nodes(&self) -> &[String] {
            &self.nodes
        }
        fn state(&self) -> gpufabric_api::pair::PairState {
            self.state
        }
        fn set_state(&mut self, state: gpufabric_api::pair::PairState) {
            self.state = state;
        }
        fn pod_uids(&mut self) -> &mut Vec<String> {
            &mut self.pod_uids
        }
        fn done(&self) -> bool {
            self.done
        }
        fn pod_name(base: &str, rank: u32) -> String {
            pod_name(base, rank)
        }
        fn pod(
            &self,
            run: &gpufabric_api::run::FabricTestRun,
            rank: u32,
            rendezvous: &crate::pairs::pods::Rendezvous,
            gpus: u32,
        ) -> Result<k8s_openapi::api::core::v1::Pod, crate::pods::BuildError> {
            $pod(run, &self.nodes, rank, rendezvous, gpus)
        }
        fn settle(&mut self, settled: crate::pairs::group::Settled<Self::Doc>) {
            settle(self, settled)
        }
    };
}
pub(crate) use group_phase_common;

/// A multi-node phase of a run as the shell moves it: its part of the run's status, the pods
/// of its ranks and how it settles. The shell (`controller::run::group`) is the same for
/// every phase; each phase says only what differs.
pub trait GroupPhase: Clone + Sized {
    /// What its ranks write.
    type Doc: GroupDocument;
    /// Its name in logs, events and messages ("multi-node DDP probe").
    const NAME: &'static str;
    /// The object of its events ("DdpNodes").
    const EVENT_OBJECT: &'static str;
    /// Its status in the run's.
    fn slot(status: &mut FabricTestRunStatus) -> &mut Option<Self>;
    /// Most nodes in the group (the run's suite).
    fn max_nodes(run: &FabricTestRun) -> usize;
    /// Its status once its nodes are chosen.
    fn begun(nodes: Vec<String>) -> Self;
    /// Its status when it does not run, for `why`.
    fn skipped(why: String) -> Self;
    /// Its nodes, by rank.
    fn nodes(&self) -> &[String];
    fn state(&self) -> PairState;
    fn set_state(&mut self, state: PairState);
    /// The UIDs of its pods, by rank ("" for one not made).
    fn pod_uids(&mut self) -> &mut Vec<String>;
    fn done(&self) -> bool;
    /// Name of the pod of `rank` in the run whose [`crate::names::run_base`] is `base`.
    fn pod_name(base: &str, rank: u32) -> String;
    /// The pod of `rank` on a node of `gpus` GPUs.
    fn pod(
        &self,
        run: &FabricTestRun,
        rank: u32,
        rendezvous: &Rendezvous,
        gpus: u32,
    ) -> Result<Pod, BuildError>;
    /// Writes how it ended into its status (and marks it done).
    fn settle(&mut self, settled: Settled<Self::Doc>);
}
