//! The multi-node DDP probe of a run (`suite.ddpNodes`), after the node checks and the node
//! pairs: one group of pods over nodes that passed both, rank 0 first, the others once it
//! has an IP, all meeting over TCP with the run's rendezvous secret. Where the probe stands
//! is kept in the run's status, so a restarted operator goes on from there; the decisions
//! are in [`crate::ddp_nodes`].

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
use crate::pods::allocatable_gpus;
use crate::results::PodState;
use gpufabric_api::run::{FabricTestRun, FabricTestRunStatus, NodeRunResult};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use std::time::Duration;

use super::pairs::PairsStep;
use crate::ddp_nodes::{self, ProbePod, ProbeStep, Settled};
use crate::pairs::pods::Rendezvous;
use crate::pairs::rank::{RankPod, rank_pod, spare_lost};
use gpufabric_api::ddp_nodes::DdpNodesStatus;
use gpufabric_api::pair::PairState;
use gpufabric_api::run::NodeVerdict;

/// One pass of the probe: chooses its nodes, then moves it on a step.
pub(super) async fn advance(
    run: &FabricTestRun,
    next: &mut FabricTestRunStatus,
    entries: &[NodeRunResult],
    outcomes: &[PodState],
    ctx: &RunContext,
    pods_api: &Api<Pod>,
) -> Result<PairsStep> {
    let Some(mut status) = next.ddp_nodes.clone() else {
        return begin(run, next, entries, outcomes, ctx).await;
    };
    if status.done {
        return Ok(PairsStep::Done);
    }
    let mut secret = Secret {
        made: next.rendezvous_secret_uid.clone(),
        checked: None,
    };
    let result = step(run, &mut status, &mut secret, ctx, pods_api).await;
    next.rendezvous_secret_uid = secret.made;
    let done = status.done;
    next.ddp_nodes = Some(status);
    let wait = result?;
    Ok(if done {
        PairsStep::Done
    } else {
        PairsStep::Wait(wait)
    })
}

/// Chooses the probe's nodes among those that passed their own check and were not blamed
/// by the node pairs; with fewer than two there is nothing to probe.
async fn begin(
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
    let candidates: Vec<(String, u32)> = entries
        .iter()
        .filter(|e| evaluation.verdicts.get(&e.node) == Some(&NodeVerdict::Passed))
        .filter(|e| !blamed.contains_key(e.node.as_str()))
        .filter_map(|e| {
            let node = ctx.nodes.get(&ObjectRef::new(&e.node))?;
            Some((e.node.clone(), allocatable_gpus(&node)))
        })
        .collect();
    let seed = gpufabric_api::fnv1a(run.uid().unwrap_or_default().as_bytes());
    let max = run.spec.suite.ddp_nodes.max_nodes as usize;
    let nodes = ddp_nodes::choose(&candidates, max, seed);
    if nodes.len() < 2 {
        tracing::info!(
            candidates = candidates.len(),
            "no multi-node DDP probe: fewer than 2 nodes"
        );
        next.ddp_nodes = Some(DdpNodesStatus {
            done: true,
            message: Some(format!(
                "{} nodes with the same GPU count passed their own check and the node pairs: at least 2 are needed",
                nodes.len()
            )),
            ..Default::default()
        });
        return Ok(PairsStep::Done);
    }
    match ensure_secret(run, ctx, next.rendezvous_secret_uid.as_deref()).await? {
        Ok(uid) => next.rendezvous_secret_uid = Some(uid),
        Err(why) => {
            // Fails closed: no probe runs with a secret someone else chose.
            let note = format!("multi-node DDP probe not run: {why}");
            tracing::warn!(%why, "multi-node DDP probe not run: the rendezvous Secret is not this run's");
            publish(ctx, run, true, "RendezvousSecretRefused", "DdpNodes", &note).await;
            next.ddp_nodes = Some(DdpNodesStatus {
                done: true,
                message: Some(note),
                ..Default::default()
            });
            return Ok(PairsStep::Done);
        }
    }
    tracing::info!(nodes = ?nodes, "multi-node DDP probe started");
    next.ddp_nodes = Some(DdpNodesStatus {
        nodes,
        ..Default::default()
    });
    Ok(PairsStep::Wait(Duration::from_millis(100)))
}

/// Moves the probe on one step; returns how long until its deadline (at most 10 s).
async fn step(
    run: &FabricTestRun,
    status: &mut DdpNodesStatus,
    secret: &mut Secret,
    ctx: &RunContext,
    pods_api: &Api<Pod>,
) -> Result<Duration> {
    let name = run.name_any();
    let uid = run.uid().ok_or(Error::Missing("metadata.uid"))?;
    let base = crate::names::run_base(&name, &uid);
    let cached = pods_of(ctx, &ctx.pod_namespace, &uid);
    let names: Vec<String> = (0..status.nodes.len() as u32)
        .map(|rank| ddp_nodes::pod_name(&base, rank))
        .collect();
    status.pod_uids.resize(status.nodes.len(), String::new());
    let made: Vec<Option<String>> = status
        .pod_uids
        .iter()
        .map(|u| Some(u.clone()).filter(|u| !u.is_empty()))
        .collect();
    let ranks: Vec<RankOf<'_>> = names
        .iter()
        .zip(&status.nodes)
        .zip(&made)
        .map(|((name, node), made)| RankOf {
            name: name.clone(),
            node,
            made: made.as_deref(),
        })
        .collect();
    let created = status.state != PairState::Pending;
    let pods = rank_pods(&ranks, &uid, &cached, created, pods_api).await?;
    let views: Vec<ProbePod> = pods
        .iter()
        .map(|p| p.as_ref().map_or(RankPod::Absent, rank_pod))
        .collect();
    let deadline = group_deadline(run, pods.first().and_then(Option::as_ref));
    let wait = deadline
        .until
        .map_or(Duration::from_secs(10), |u| u.min(Duration::from_secs(10)));
    let past = deadline.past;
    let not_ready = |node: &str| crate::nodes::not_ready_in(&ctx.nodes, node);
    let nodes: Vec<&str> = status.nodes.iter().map(String::as_str).collect();
    let step = match ddp_nodes::decide(status.state, &views, &status.nodes, past) {
        ProbeStep::Stop(s) => ProbeStep::Stop(spare_lost(s, &views, &nodes, &not_ready)),
        s => s,
    };
    match step {
        ProbeStep::Wait => {}
        ProbeStep::CreateRank0 => {
            let made = match secret.usable(run, ctx).await? {
                Ok(()) => create(run, status, 0, &Rendezvous::Listen, ctx, pods_api).await?,
                Err(why) => RankMade::Not(NotAdmitted::Secret(why)),
            };
            match made {
                RankMade::Made(pod_uid) => {
                    status.pod_uids[0] = pod_uid;
                    status.state = PairState::Listening
                }
                RankMade::Later => {}
                RankMade::Not(why) => ddp_nodes::settle(status, not_admitted(0, &why)),
            }
        }
        ProbeStep::CreateOthers { ip } => {
            let join = Rendezvous::Join { rank0_ip: ip };
            let mut later = false;
            for rank in 1..status.nodes.len() as u32 {
                if !matches!(views[rank as usize], RankPod::Absent) {
                    continue;
                }
                let made = match secret.usable(run, ctx).await? {
                    Ok(()) => create(run, status, rank, &join, ctx, pods_api).await?,
                    Err(why) => RankMade::Not(NotAdmitted::Secret(why)),
                };
                match made {
                    RankMade::Made(pod_uid) => status.pod_uids[rank as usize] = pod_uid,
                    RankMade::Later => later = true,
                    RankMade::Not(why) => {
                        // All or nothing: the others would wait for a rank that never comes.
                        for (n, uid) in names.iter().zip(&status.pod_uids) {
                            let uid = Some(uid.as_str()).filter(|u| !u.is_empty());
                            delete_made(pods_api, n, uid).await?;
                        }
                        ddp_nodes::settle(status, not_admitted(rank, &why));
                        return Ok(wait);
                    }
                }
            }
            if !later {
                status.state = PairState::Joined;
            }
        }
        ProbeStep::Stop(s) => {
            for (n, uid) in names.iter().zip(&status.pod_uids) {
                let uid = Some(uid.as_str()).filter(|u| !u.is_empty());
                delete_made(pods_api, n, uid).await?;
            }
            ddp_nodes::settle(status, s);
        }
        ProbeStep::Settle(s) => ddp_nodes::settle(status, s),
    }
    if status.done {
        tracing::info!(state = ?status.state, "multi-node DDP probe done");
    }
    Ok(wait)
}

fn not_admitted(rank: u32, why: &NotAdmitted) -> Settled {
    Settled {
        state: PairState::NotMeasured,
        doc: None,
        message: Some(format!("the rank-{rank} pod was not admitted: {why}")),
    }
}

/// Creates the pod of `rank` (see [`create_rank_pod`]).
async fn create(
    run: &FabricTestRun,
    status: &DdpNodesStatus,
    rank: u32,
    rendezvous: &Rendezvous,
    ctx: &RunContext,
    pods_api: &Api<Pod>,
) -> Result<RankMade> {
    let build = |gpus| ddp_nodes::probe_pod(run, &status.nodes, rank, rendezvous, gpus);
    let run_uid = run.uid().ok_or(Error::Missing("metadata.uid"))?;
    create_rank_pod(&status.nodes[rank as usize], build, ctx, &run_uid, pods_api).await
}
