//! The multi-node groups of a run (the DDP probe, `suite.ddpNodes`; the NCCL sweep,
//! `suite.ncclNodes`), after the node checks and the node pairs: one group of pods over nodes
//! that passed both, rank 0 first, the others once it has an IP, all meeting over TCP with the
//! run's rendezvous secret. Where a group stands is kept in the run's status, so a restarted
//! operator goes on from there; the decisions are in [`crate::pairs::group`], what differs
//! between the phases in their [`GroupPhase`].

use super::common::pods_of;
use super::common::publish;
use super::create::{
    NotAdmitted, RankMade, RankOf, create_rank_pod, ensure_secret, group_deadline, rank_pods,
};
use super::deadline::delete_made;
use super::finish;
use super::pairs::Secret;
use crate::controller::run::context::RunContext;
use crate::error::{Error, Result};
use crate::nodes::gpu_count;
use crate::results::PodState;
use gpufabric_api::run::{FabricTestRun, FabricTestRunStatus, NodeRunResult};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use std::time::Duration;

use super::pairs::PairsStep;
use crate::pairs::group::{self, GroupPhase, GroupStep, Settled};
use crate::pairs::pods::Rendezvous;
use crate::pairs::rank::{RankPod, rank_pod, spare_lost};
use gpufabric_api::pair::PairState;
use gpufabric_api::run::NodeVerdict;

/// One pass of the group `G`: chooses its nodes, then moves it on a step.
pub(super) async fn advance<G: GroupPhase>(
    run: &FabricTestRun,
    next: &mut FabricTestRunStatus,
    entries: &[NodeRunResult],
    outcomes: &[PodState],
    ctx: &RunContext,
    pods_api: &Api<Pod>,
) -> Result<PairsStep> {
    let Some(mut status) = G::slot(next).clone() else {
        return begin::<G>(run, next, entries, outcomes, ctx).await;
    };
    if status.done() {
        return Ok(PairsStep::Done);
    }
    let mut secret = Secret {
        made: next.rendezvous_secret_uid.clone(),
        checked: None,
    };
    let group = status.nodes().to_vec();
    let result = step(run, &mut status, &mut secret, ctx, pods_api).await;
    next.rendezvous_secret_uid = secret.made;
    let done = status.done();
    // A group ended and the phase's next one begins: at once, not at a deadline.
    let next_group = status.nodes() != group.as_slice();
    *G::slot(next) = Some(status);
    let wait = result?;
    Ok(if done {
        PairsStep::Done
    } else if next_group {
        PairsStep::Wait(Duration::from_millis(100))
    } else {
        PairsStep::Wait(wait)
    })
}

/// Chooses the group's nodes among those that passed their own check and were not blamed
/// by the node pairs; with fewer than two there is nothing to measure.
async fn begin<G: GroupPhase>(
    run: &FabricTestRun,
    next: &mut FabricTestRunStatus,
    entries: &[NodeRunResult],
    outcomes: &[PodState],
    ctx: &RunContext,
) -> Result<PairsStep> {
    let evaluation = finish::judge(run, entries, outcomes, ctx);
    let pair_findings = if next.node_pairs.is_some() {
        let fleet = crate::baseline::of_test(&ctx.client, run).await?;
        let now_s = crate::time::now().0.as_second();
        let baselines = crate::baseline::pair_baselines(&fleet, run, now_s);
        crate::pairs::phase::findings(entries, &Default::default(), Some(&baselines)).findings
    } else {
        Vec::new()
    };
    let blamed = crate::pairs::phase::blamed(&pair_findings);
    let devices = super::gpus::device_counts(ctx).await?;
    let candidates: Vec<(String, u32)> = entries
        .iter()
        .filter(|e| evaluation.verdicts.get(&e.node) == Some(&NodeVerdict::Passed))
        .filter(|e| !blamed.contains_key(e.node.as_str()))
        .filter_map(|e| {
            let node = ctx.nodes.get(&ObjectRef::new(&e.node))?;
            Some((e.node.clone(), gpu_count(&node, &devices)))
        })
        .collect();
    let seed = gpufabric_api::fnv1a(run.uid().unwrap_or_default().as_bytes());
    let begun = match G::topology_key(run) {
        None => {
            let nodes = group::choose(&candidates, G::max_nodes(run), seed);
            if nodes.len() >= 2 {
                Ok(G::begun(nodes))
            } else {
                Err(format!(
                    "{} nodes with the same GPU count passed their own check and the node pairs: at least 2 are needed",
                    nodes.len()
                ))
            }
        }
        Some(key) => {
            let labelled: Vec<(String, u32, Option<String>)> = candidates
                .iter()
                .map(|(n, g)| {
                    let value = ctx
                        .nodes
                        .get(&ObjectRef::new(n))
                        .and_then(|node| node.labels().get(key).cloned());
                    (n.clone(), *g, value)
                })
                .collect();
            let blocks = group::choose_blocks(&labelled, G::max_nodes(run), seed);
            if blocks.groups() == 0 {
                Err(format!(
                    "no value of {key} is shared by 2 nodes with the same GPU count that passed their own check and the node pairs, nor are there 2 such values ({} without the label)",
                    blocks.unlabelled
                ))
            } else {
                Ok(G::begun_in_blocks(key, blocks))
            }
        }
    };
    let begun = match begun {
        Ok(begun) => begun,
        Err(why) => {
            tracing::info!(candidates = candidates.len(), %why, "no {}", G::NAME);
            *G::slot(next) = Some(G::skipped(why));
            return Ok(PairsStep::Done);
        }
    };
    match ensure_secret(run, ctx, next.rendezvous_secret_uid.as_deref()).await? {
        Ok(uid) => next.rendezvous_secret_uid = Some(uid),
        Err(why) => {
            // Fails closed: no group runs with a secret someone else chose.
            let note = format!("{} not run: {why}", G::NAME);
            tracing::warn!(%why, "{} not run: the rendezvous Secret is not this run's", G::NAME);
            let object = G::EVENT_OBJECT;
            publish(ctx, run, true, "RendezvousSecretRefused", object, &note).await;
            *G::slot(next) = Some(G::skipped(note));
            return Ok(PairsStep::Done);
        }
    }
    tracing::info!(nodes = ?begun.nodes(), "{} started", G::NAME);
    *G::slot(next) = Some(begun);
    Ok(PairsStep::Wait(Duration::from_millis(100)))
}

/// Moves the group on one step; returns how long until its deadline (at most 10 s).
async fn step<G: GroupPhase>(
    run: &FabricTestRun,
    status: &mut G,
    secret: &mut Secret,
    ctx: &RunContext,
    pods_api: &Api<Pod>,
) -> Result<Duration> {
    let name = run.name_any();
    let uid = run.uid().ok_or(Error::Missing("metadata.uid"))?;
    let base = crate::names::run_base(&name, &uid);
    let cached = pods_of(ctx, &ctx.pod_namespace, &uid);
    let count = status.nodes().len();
    let names: Vec<String> = (0..count as u32)
        .map(|rank| status.pod_name(&base, rank))
        .collect();
    status.pod_uids().resize(count, String::new());
    let made: Vec<Option<String>> = status
        .pod_uids()
        .iter()
        .map(|u| Some(u.clone()).filter(|u| !u.is_empty()))
        .collect();
    let ranks: Vec<RankOf<'_>> = names
        .iter()
        .zip(status.nodes())
        .zip(&made)
        .map(|((name, node), made)| RankOf {
            name: name.clone(),
            node,
            made: made.as_deref(),
        })
        .collect();
    let created = status.state() != PairState::Pending;
    let pods = rank_pods(&ranks, &uid, &cached, created, pods_api).await?;
    let views: Vec<RankPod<G::Doc>> = pods
        .iter()
        .map(|p| p.as_ref().map_or(RankPod::Absent, rank_pod))
        .collect();
    let deadline = group_deadline(run, pods.first().and_then(Option::as_ref));
    let wait = deadline
        .until
        .map_or(Duration::from_secs(10), |u| u.min(Duration::from_secs(10)));
    let past = deadline.past;
    let not_ready = |node: &str| crate::nodes::not_ready_in(&ctx.nodes, node);
    let nodes: Vec<&str> = status.nodes().iter().map(String::as_str).collect();
    let step = match group::decide(status.state(), &views, status.nodes(), past) {
        GroupStep::Stop(s) => GroupStep::Stop(spare_lost(s, &views, &nodes, &not_ready)),
        s => s,
    };
    match step {
        GroupStep::Wait => {}
        GroupStep::CreateRank0 => {
            let made = match secret.usable(run, ctx).await? {
                Ok(()) => create(run, status, 0, &Rendezvous::Listen, ctx, pods_api).await?,
                Err(why) => RankMade::Not(NotAdmitted::Secret(why)),
            };
            match made {
                RankMade::Made(pod_uid) => {
                    status.pod_uids()[0] = pod_uid;
                    status.set_state(PairState::Listening)
                }
                RankMade::Later => {}
                RankMade::Not(why) => status.settle(not_admitted(0, &why)),
            }
        }
        GroupStep::CreateOthers { ip } => {
            let join = Rendezvous::Join { rank0_ip: ip };
            let mut later = false;
            for rank in 1..count as u32 {
                if !matches!(views[rank as usize], RankPod::Absent) {
                    continue;
                }
                let made = match secret.usable(run, ctx).await? {
                    Ok(()) => create(run, status, rank, &join, ctx, pods_api).await?,
                    Err(why) => RankMade::Not(NotAdmitted::Secret(why)),
                };
                match made {
                    RankMade::Made(pod_uid) => status.pod_uids()[rank as usize] = pod_uid,
                    RankMade::Later => later = true,
                    RankMade::Not(why) => {
                        // All or nothing: the others would wait for a rank that never comes.
                        for (n, uid) in names.iter().zip(status.pod_uids().iter()) {
                            let uid = Some(uid.as_str()).filter(|u| !u.is_empty());
                            delete_made(pods_api, n, uid).await?;
                        }
                        status.settle(not_admitted(rank, &why));
                        return Ok(wait);
                    }
                }
            }
            if !later {
                status.set_state(PairState::Joined);
            }
        }
        GroupStep::Stop(s) => {
            for (n, uid) in names.iter().zip(status.pod_uids().iter()) {
                let uid = Some(uid.as_str()).filter(|u| !u.is_empty());
                delete_made(pods_api, n, uid).await?;
            }
            status.settle(s);
        }
        GroupStep::Settle(s) => status.settle(s),
    }
    if status.done() {
        tracing::info!(state = ?status.state(), "{} done", G::NAME);
    }
    Ok(wait)
}

fn not_admitted<D>(rank: u32, why: &NotAdmitted) -> Settled<D> {
    Settled {
        state: PairState::NotMeasured,
        doc: None,
        message: Some(format!("the rank-{rank} pod was not admitted: {why}")),
    }
}

/// Creates the pod of `rank` (see [`create_rank_pod`]).
async fn create<G: GroupPhase>(
    run: &FabricTestRun,
    status: &G,
    rank: u32,
    rendezvous: &Rendezvous,
    ctx: &RunContext,
    pods_api: &Api<Pod>,
) -> Result<RankMade> {
    let build = |gpus| status.pod(run, rank, rendezvous, gpus);
    let run_uid = run.uid().ok_or(Error::Missing("metadata.uid"))?;
    let node = status.nodes().get(rank as usize).map_or("", String::as_str);
    create_rank_pod(run, node, build, ctx, &run_uid, pods_api).await
}
