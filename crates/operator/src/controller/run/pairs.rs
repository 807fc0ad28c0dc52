//! The node-pair phase of a run (`suite.nodePairs`), after every node's own check: rounds
//! of node pairs over the nodes that passed it, a confirmation round that retests suspects
//! against known-good partners (and a second for those it left unclear), and the findings
//! of the pairs. Each pair's state and
//! result is kept on both of its nodes' records in the run's shards, so a restarted
//! operator goes on from there; the decisions are in [`crate::pairs::phase`].
//!
//! Each settled pair's port counters are judged against its nodes' records of their
//! previous pair test (the node annotation `gpufabric.io/nic-counters`, read from the node
//! cache); the records to write next are handed back to the caller, which writes them once
//! the pass is saved (`crate::counters::write_nic`).

use super::common::pods_of;
use super::common::publish;
use super::create::{
    NotAdmitted, RankMade, RankOf, SecretRefused, create_rank_pod, ensure_secret, group_deadline,
    rank_pods,
};
use super::deadline::delete_made;
use super::finish;
use crate::controller::run::context::RunContext;
use crate::error::{Error, Result};
use crate::nodes::gpu_count;
use crate::results::PodState;
use crate::time::now;
use gpufabric_api::run::{FabricTestRun, FabricTestRunStatus, NodeRunResult};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use std::time::Duration;

use crate::pairs::phase::{self, PairPod, PairStep, Slot};
use crate::pairs::pods::{Rendezvous, pair_pod};
use crate::pairs::rank::spare_lost;
use crate::pairs::rounds::{Candidate, plan_with_partners};
use gpufabric_api::nic_counters::NicCounters;
use gpufabric_api::pair::{NodePairsStatus, PairState};
use gpufabric_api::run::NodeVerdict;
use gpufabric_api::suite::Pairing;

/// Most nodes that `pairing: All` pairs every two of; more are paired as a ring.
pub const MAX_ALL_PAIRS_NODES: usize = 16;

/// What the phase asks of the run after this pass.
pub(super) enum PairsStep {
    /// Pairs are under way: save, and look again after this long.
    Wait(Duration),
    /// Every pair has ended (or there were none to test): the run can finish.
    Done,
}

/// The port counter records a pass settled, by node, for the caller to write once the
/// pass is saved: written before, a retried pass would judge the same reading against
/// itself.
pub(super) type NicRecords = Vec<(String, NicCounters)>;

/// One pass of the phase: starts it (planning the rounds into the records), moves every
/// pair of the round under way on a step, and opens the next round (or the confirmation
/// round) once every pair of this one has ended. The port counter records of the pairs it
/// settles go to `nic_records`, also when it fails.
pub(super) async fn advance(
    run: &FabricTestRun,
    next: &mut FabricTestRunStatus,
    entries: &mut [NodeRunResult],
    outcomes: &[PodState],
    ctx: &RunContext,
    pods_api: &Api<Pod>,
    nic_records: &mut NicRecords,
) -> Result<PairsStep> {
    let Some(mut np) = next.node_pairs.clone() else {
        return begin(run, next, entries, outcomes, ctx).await;
    };
    if np.done {
        return Ok(PairsStep::Done);
    }
    let wave_size = next.progress.as_ref().map_or(0, |p| p.wave_size as usize);
    let max_pairs = match wave_size {
        0 => usize::MAX,
        n => (n / 2).max(1),
    };
    let round = Round {
        number: np.round,
        max_pairs,
    };
    let mut secret = Secret {
        made: next.rendezvous_secret_uid.clone(),
        checked: None,
    };
    let stepped = step_round(run, entries, round, &mut secret, ctx, pods_api, nic_records).await;
    next.rendezvous_secret_uid = secret.made;
    let wait = stepped?;
    let slots = phase::slots(entries, np.round);
    let round_done = slots
        .iter()
        .all(|s| phase::record(entries, s).is_none_or(|r| r.state.is_final()));
    if round_done {
        // The confirmation rounds' suspects are judged against the test's baseline.
        let baselines = if np.round >= np.rounds && np.second_confirmation_round.is_none() {
            let fleet = crate::baseline::of_test(&ctx.client, run).await?;
            crate::baseline::pair_baselines(&fleet, run, now().0.as_second())
        } else {
            Vec::new()
        };
        open_next_round(run, &mut np, entries, &baselines);
    }
    phase::summarize(entries, &mut np);
    let done = np.done;
    if done && let Some(note) = phase::unmeasured_note(entries) {
        // Pairs not measured spare their nodes: the phase says so, once, as it ends.
        tracing::warn!(%note, "node pairs not measured");
        publish(ctx, run, true, "NodePairsNotMeasured", "NodePairs", &note).await;
        np.message = Some(match np.message.take() {
            Some(before) => format!("{before}; {note}"),
            None => note,
        });
    }
    next.node_pairs = Some(np);
    Ok(if done {
        PairsStep::Done
    } else if round_done {
        PairsStep::Wait(Duration::from_millis(100))
    } else {
        PairsStep::Wait(wait)
    })
}

/// The next round, a confirmation round when the planned ones (or the first confirmation
/// round) are over and some node needs a retest (judged against `baselines`, the test's
/// baselines of node pairs; `health::pairs::retest_pairs` decides, at most
/// `MAX_CONFIRMATION_ROUNDS`), or the end of the phase.
fn open_next_round(
    run: &FabricTestRun,
    np: &mut NodePairsStatus,
    entries: &mut [NodeRunResult],
    baselines: &[gpufabric_health::pairs::PairBaseline],
) {
    if np.round < np.rounds {
        np.round += 1;
        np.round_start_time = Some(now());
        tracing::info!(
            round = np.round,
            rounds = np.rounds,
            "node-pair round started"
        );
        return;
    }
    let number = match (np.confirmation_round, np.second_confirmation_round) {
        (None, _) => 1,
        (Some(_), None) => 2,
        (Some(_), Some(_)) => gpufabric_health::pairs::MAX_CONFIRMATION_ROUNDS + 1,
    };
    let observed = phase::observations(entries);
    let loc =
        gpufabric_health::pairs::localize_against(&observed, &Default::default(), Some(baselines));
    let retests = phase::retest_pairs(
        number,
        &loc,
        &phase::unconfirmed_ports(entries),
        &observed,
        &phase::retested(entries),
    );
    if !retests.is_empty() {
        let plan = crate::pairs::RoundPlan {
            pairing: run.spec.suite.node_pairs.pairing,
            seed: np.seed,
            rounds: vec![crate::pairs::Round {
                set: crate::pairs::PairSet::Within,
                pairs: retests.clone(),
            }],
        };
        let round = np.rounds + 1;
        if phase::write_plan(entries, &plan, round, true) > 0 {
            np.rounds = round;
            np.round = round;
            if number == 1 {
                np.confirmation_round = Some(round);
            } else {
                np.second_confirmation_round = Some(round);
            }
            np.retested += retests.len() as u32;
            np.round_start_time = Some(now());
            tracing::info!(
                confirmation = number,
                retests = retests.len(),
                "node-pair confirmation round started"
            );
            return;
        }
    }
    np.done = true;
    np.round_start_time = None;
    tracing::info!(pairs = np.pairs, "node-pair phase done");
}

/// Starts the phase: the nodes that passed their own check are planned into rounds and the
/// run's rendezvous secret is made; with fewer than two such nodes there is nothing to pair.
async fn begin(
    run: &FabricTestRun,
    next: &mut FabricTestRunStatus,
    entries: &mut [NodeRunResult],
    outcomes: &[PodState],
    ctx: &RunContext,
) -> Result<PairsStep> {
    let spec = &run.spec.suite.node_pairs;
    let evaluation = finish::judge(run, entries, outcomes, ctx);
    let devices = super::gpus::device_counts(ctx).await?;
    let candidates: Vec<Candidate> = entries
        .iter()
        .filter(|e| evaluation.verdicts.get(&e.node) == Some(&NodeVerdict::Passed))
        .filter_map(|e| {
            let node = ctx.nodes.get(&ObjectRef::new(&e.node))?;
            (gpu_count(&node, &devices) > 0).then(|| Candidate {
                name: e.node.clone(),
                group: spec
                    .topology_key
                    .as_ref()
                    .and_then(|k| node.labels().get(k).cloned()),
            })
        })
        .collect();
    let seed = match spec.pairing {
        // Below 2^53, so that every JSON reader keeps it exact.
        Pairing::Random => rand::random::<u64>() >> 11,
        // One partner a night: the day picks the round of the circle, so each night meets
        // new partners (health::pairs::rounds, rule 5).
        Pairing::Ring if spec.partners <= 1 => day_number(now().0.as_second()),
        _ => 0,
    };
    // Every pair of a large fleet would take n-1 rounds and records per node.
    let (pairing, note) = if spec.pairing == Pairing::All && candidates.len() > MAX_ALL_PAIRS_NODES
    {
        let note = format!(
            "pairing All is for at most {MAX_ALL_PAIRS_NODES} nodes; {} passed their own check, so they were paired as a ring",
            candidates.len()
        );
        (Pairing::Ring, Some(note))
    } else {
        (spec.pairing, None)
    };
    let plan = plan_with_partners(&candidates, pairing, seed, spec.partners);
    let mut np = NodePairsStatus {
        seed,
        candidates: candidates.len() as u32,
        message: note,
        ..Default::default()
    };
    for e in entries.iter_mut() {
        e.pairs.clear();
    }
    let rounds = phase::write_plan(entries, &plan, 1, false);
    if rounds == 0 {
        np.done = true;
        np.message = Some(format!(
            "{} nodes passed their own check: at least 2 are needed for node pairs",
            candidates.len()
        ));
        tracing::info!(candidates = candidates.len(), "no node pairs to test");
        next.node_pairs = Some(np);
        return Ok(PairsStep::Done);
    }
    match ensure_secret(run, ctx, next.rendezvous_secret_uid.as_deref()).await? {
        Ok(uid) => next.rendezvous_secret_uid = Some(uid),
        Err(why) => {
            // Fails closed: no pair runs with a secret someone else chose.
            for e in entries.iter_mut() {
                e.pairs.clear();
            }
            let note = format!("node pairs not tested: {why}");
            tracing::warn!(%why, "node-pair phase not run: the rendezvous Secret is not this run's");
            publish(
                ctx,
                run,
                true,
                "RendezvousSecretRefused",
                "NodePairs",
                &note,
            )
            .await;
            np.done = true;
            np.message = Some(note);
            next.node_pairs = Some(np);
            return Ok(PairsStep::Done);
        }
    }
    np.rounds = rounds;
    np.round = 1;
    np.round_start_time = Some(now());
    phase::summarize(entries, &mut np);
    tracing::info!(
        candidates = candidates.len(),
        rounds,
        pairs = np.pairs,
        seed,
        "node-pair phase started"
    );
    next.node_pairs = Some(np);
    Ok(PairsStep::Wait(Duration::from_millis(100)))
}

/// Days since the Unix epoch of `seconds` (0 before it).
fn day_number(seconds: i64) -> u64 {
    u64::try_from(seconds.div_euclid(86_400)).unwrap_or(0)
}

/// The run's rendezvous Secret as a pass sees it: the UID recorded, and once a pass has
/// looked (before it makes a rank pod), whether the Secret at its name is that one.
pub(super) struct Secret {
    pub(super) made: Option<String>,
    pub(super) checked: Option<std::result::Result<(), SecretRefused>>,
}

impl Secret {
    /// Whether rank pods may be made: the Secret at its name is the one this run made (made
    /// now when none is recorded), looked at once a pass.
    pub(super) async fn usable(
        &mut self,
        run: &FabricTestRun,
        ctx: &RunContext,
    ) -> Result<std::result::Result<(), SecretRefused>> {
        if let Some(c) = &self.checked {
            return Ok(c.clone());
        }
        let c = ensure_secret(run, ctx, self.made.as_deref())
            .await?
            .map(|uid| self.made = Some(uid));
        if let Err(why) = &c {
            let note = format!("rank pods not made: {why}");
            tracing::warn!(%why, "the rendezvous Secret is not this run's");
            publish(
                ctx,
                run,
                true,
                "RendezvousSecretRefused",
                "CreatePod",
                &note,
            )
            .await;
        }
        self.checked = Some(c.clone());
        Ok(c)
    }
}

/// The round a pass steps, and how many of its pairs may have pods at once.
struct Round {
    number: u32,
    max_pairs: usize,
}

/// Moves every pair of `round` on a step; at most `round.max_pairs` pairs have pods at
/// once. The port counter records of the pairs settled go to `nic_records`. Returns how
/// long until the next pair's deadline (at most 10 s).
async fn step_round(
    run: &FabricTestRun,
    entries: &mut [NodeRunResult],
    round: Round,
    secret: &mut Secret,
    ctx: &RunContext,
    pods_api: &Api<Pod>,
    nic_records: &mut NicRecords,
) -> Result<Duration> {
    let Round {
        number: round,
        max_pairs,
    } = round;
    let name = run.name_any();
    let at = gpufabric_api::rfc3339::now();
    let uid = run.uid().ok_or(Error::Missing("metadata.uid"))?;
    let base = crate::names::run_base(&name, &uid);
    let cached = pods_of(ctx, &ctx.pod_namespace, &uid);
    let slots = phase::slots(entries, round);
    let mut in_flight = slots
        .iter()
        .filter_map(|s| phase::record(entries, s))
        .filter(|r| matches!(r.state, PairState::Listening | PairState::Joined))
        .count();
    let mut wait = Duration::from_secs(10);
    let previous = |node: &str| {
        ctx.nodes
            .get(&ObjectRef::new(node))
            .and_then(|node| crate::counters::nic_record_of(&node))
    };
    let nics = phase::NicHistory {
        run: &name,
        at: &at,
        previous: &previous,
    };
    let not_ready = |node: &str| crate::nodes::not_ready_in(&ctx.nodes, node);
    for slot in &slots {
        let Some(state) = phase::record(entries, slot).map(|r| r.state) else {
            continue;
        };
        if state.is_final() {
            continue;
        }
        let names = [0, 1].map(|rank| pod_name(&base, slot, rank));
        let ranks = [0, 1].map(|rank| RankOf {
            name: names[rank as usize].clone(),
            node: &entries[if rank == 0 { slot.a } else { slot.b }].node,
            made: phase::pod_uid(entries, slot, rank),
        });
        let created = state != PairState::Pending;
        let pods = rank_pods(&ranks, &uid, &cached, created, pods_api).await?;
        let uids = [0, 1].map(|rank| phase::pod_uid(entries, slot, rank).map(str::to_string));
        let views = [0, 1].map(|rank| pods[rank].as_ref().map_or(PairPod::Absent, phase::pair_pod));
        let deadline = group_deadline(run, pods[0].as_ref());
        if let Some(until) = deadline.until {
            wait = wait.min(until);
        }
        let nodes = [entries[slot.a].node.as_str(), entries[slot.b].node.as_str()];
        let step = match phase::decide(state, (&views[0], &views[1]), nodes, deadline.past, &nics) {
            PairStep::Stop(o) => PairStep::Stop(spare_lost(o, &views, &nodes, &not_ready)),
            s => s,
        };
        match step {
            PairStep::Wait => {}
            PairStep::CreateRank0 if in_flight >= max_pairs => {}
            PairStep::CreateRank0 => {
                in_flight += 1;
                let made = match secret.usable(run, ctx).await? {
                    Ok(()) => {
                        create(run, entries, slot, &Rendezvous::Listen, ctx, pods_api).await?
                    }
                    Err(why) => RankMade::Not(NotAdmitted::Secret(why)),
                };
                match made {
                    RankMade::Made(pod_uid) => {
                        phase::set_pod_uid(entries, slot, 0, pod_uid);
                        phase::set_state(entries, slot, PairState::Listening)
                    }
                    RankMade::Later => {}
                    RankMade::Not(why) => phase::settle(entries, slot, &not_admitted(0, &why)),
                }
            }
            PairStep::CreateRank1 { ip } => {
                let join = Rendezvous::Join { rank0_ip: ip };
                let made = match secret.usable(run, ctx).await? {
                    Ok(()) => create(run, entries, slot, &join, ctx, pods_api).await?,
                    Err(why) => RankMade::Not(NotAdmitted::Secret(why)),
                };
                match made {
                    RankMade::Made(pod_uid) => {
                        phase::set_pod_uid(entries, slot, 1, pod_uid);
                        phase::set_state(entries, slot, PairState::Joined)
                    }
                    RankMade::Later => {}
                    RankMade::Not(why) => {
                        // All or nothing: rank 0 would wait for a peer that never comes.
                        delete_made(pods_api, &names[0], uids[0].as_deref()).await?;
                        phase::settle(entries, slot, &not_admitted(1, &why));
                    }
                }
            }
            PairStep::Stop(o) => {
                for (n, uid) in names.iter().zip(&uids) {
                    delete_made(pods_api, n, uid.as_deref()).await?;
                }
                phase::settle(entries, slot, &o);
                nic_records.extend(records_of(entries, slot, o));
            }
            PairStep::Settle(o) => {
                phase::settle(entries, slot, &o);
                nic_records.extend(records_of(entries, slot, o));
            }
        }
    }
    Ok(wait)
}

/// The port counter records a settled pair says to write, with their nodes.
fn records_of(
    entries: &[NodeRunResult],
    slot: &Slot,
    o: phase::PairOutcome,
) -> impl Iterator<Item = (String, NicCounters)> {
    let nodes = [entries[slot.a].node.clone(), entries[slot.b].node.clone()];
    nodes
        .into_iter()
        .zip(o.nic_records)
        .filter_map(|(node, r)| r.map(|r| (node, r)))
}

/// The pod of `rank` of `slot` in the run whose [`crate::names::run_base`] is `run`.
fn pod_name(run: &str, slot: &Slot, rank: u32) -> String {
    crate::pairs::pods::pod_name(run, slot.round as usize, slot.index as usize, rank)
}

fn not_admitted(rank: u32, why: &NotAdmitted) -> phase::PairOutcome {
    phase::PairOutcome {
        state: PairState::NotMeasured,
        message: Some(format!("the rank-{rank} pod was not admitted: {why}")),
        ..Default::default()
    }
}

/// Creates the pod of one rank of `slot` (see [`create_rank_pod`]).
async fn create(
    run: &FabricTestRun,
    entries: &[NodeRunResult],
    slot: &Slot,
    rendezvous: &Rendezvous,
    ctx: &RunContext,
    pods_api: &Api<Pod>,
) -> Result<RankMade> {
    let rank1 = matches!(rendezvous, Rendezvous::Join { .. });
    let node = &entries[if rank1 { slot.b } else { slot.a }].node;
    let pair = crate::pairs::NodePair {
        a: entries[slot.a].node.clone(),
        b: entries[slot.b].node.clone(),
    };
    let spec = &run.spec.suite.node_pairs;
    let place = (slot.round as usize, slot.index as usize);
    let build = |gpus| {
        pair_pod(
            run,
            &pair,
            place,
            rendezvous,
            gpus,
            spec.bytes,
            spec.all_to_all,
        )
    };
    let run_uid = run.uid().ok_or(Error::Missing("metadata.uid"))?;
    create_rank_pod(run, node, build, ctx, &run_uid, pods_api).await
}
