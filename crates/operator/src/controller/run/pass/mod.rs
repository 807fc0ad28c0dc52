//! One pass over a running run: where each node's pod stands, the pods of the wave to
//! create, the results kept and written, and the hand-over to the node-pair phase or the
//! end of the run.

use super::common::{
    CONDITION_PODS_CREATED, DEADLINE_MARGIN_SECONDS, apply_status, pods_of, shards_api,
};
use super::create::create_step;
use super::deadline::{
    PastDeadline, delete_made, delete_unrecorded, stop_at_deadline, wave_deadline,
};
use super::finish::finish;
use super::{group, pairs};
use crate::controller::run::context::RunContext;
use crate::error::{Error, Result};
use crate::names;
use crate::results::{self, PodState};
use crate::shards::{self, Shard};
use crate::status as st;
use crate::time::now;
use crate::waves;
use chrono::Utc;
use gpufabric_api::ddp_nodes::DdpNodesStatus;
use gpufabric_api::nccl_nodes::NcclNodesStatus;
use gpufabric_api::run::{FabricTestRun, FabricTestRunStatus, NodeRunResult, RunProgress};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Where each node's pod stands, which pods to create and which to stop.
pub(super) struct Read {
    outcomes: Vec<PodState>,
    to_create: Vec<usize>,
    /// Pods that ended while the kubelet still holds them (an image that cannot be pulled, a
    /// missing Secret): deleted so that they stop holding the node's GPUs.
    to_stop: Vec<usize>,
    /// Pods at a node's name, controlled by the run, whose UID the run never recorded (see
    /// [`crate::identity`]): never read, deleted (name and UID), and made again once gone.
    unrecorded: Vec<(String, String)>,
    /// Nodes whose pod holds them now (running, waiting, or ended and not yet gone).
    occupying: usize,
}

/// Where the run's pods stand: `pods` (the cache: the pods the run controls), asked of the
/// API server when the cache lacks one, and for a pod that is gone, how it ended as the
/// watch last saw it (`gone`). Only the pod whose UID a node's entry recorded is read.
pub(super) struct PodsOfRun<'a> {
    /// What the names of the run's pods start with ([`names::run_base`]).
    pub base: &'a str,
    /// The run's UID.
    pub uid: &'a str,
    pub pods: &'a HashMap<String, Arc<Pod>>,
    pub api: &'a Api<Pod>,
    pub gone: &'a (dyn Fn(&str) -> Option<Arc<Pod>> + Sync),
}

pub(super) async fn read_states(
    entries: &mut [NodeRunResult],
    of_run: &PodsOfRun<'_>,
    past_deadline: &(dyn Fn(usize) -> bool + Sync),
    run_seconds: u64,
) -> Result<Read> {
    let PodsOfRun {
        base,
        uid: run_uid,
        pods,
        api: pods_api,
        gone,
    } = of_run;
    let mut read = Read {
        outcomes: Vec::with_capacity(entries.len()),
        to_create: Vec::new(),
        to_stop: Vec::new(),
        unrecorded: Vec::new(),
        occupying: 0,
    };
    for (i, e) in entries.iter_mut().enumerate() {
        let Some(made) = e.pod_uid.clone() else {
            // No pod recorded: one ended earlier without a pod (not admitted, its name
            // taken), or one to make, unless a pod the run controls already stands at the
            // name (made by an operator that stopped before it recorded it, or a forgery).
            let o = if let Some(o) = e.outcome() {
                PodState::Ended(o)
            } else {
                e.pod = None;
                let name = names::pod_name(base, &e.node);
                match pods.get(&name) {
                    Some(p) => {
                        if p.meta().deletion_timestamp.is_none() {
                            read.unrecorded.push((name, p.uid().unwrap_or_default()));
                        }
                        read.occupying += 1;
                    }
                    None => read.to_create.push(i),
                }
                PodState::Waiting(None)
            };
            read.outcomes.push(o);
            continue;
        };
        let pod_name = e
            .pod
            .clone()
            .unwrap_or_else(|| names::pod_name(base, &e.node));
        let found = match pods.get(&pod_name) {
            Some(p) => Some(p.clone()),
            // Created before; the cache may lag, so ask the API server.
            None => pods_api.get_opt(&pod_name).await?.map(Arc::new),
        };
        // Only the pod the run made, on the node it was made for: another at its name is
        // someone else's, and the run's own pod is gone.
        let live = found.filter(|p| {
            let ours = crate::identity::pod_made_by(p, run_uid, &made, &e.node);
            if let Err(why) = &ours {
                tracing::warn!(node = %e.node, %why, "a pod not made by this run is not read");
            }
            ours.is_ok()
        });
        let o = if let Some(p) = live {
            e.pod = Some(pod_name);
            // A pod being deleted after its end was read (a crash, a blocked pod this
            // controller stopped) keeps the outcome its entry holds: read again, its end
            // would be the stop's.
            let state = match e.outcome() {
                Some(o) if p.meta().deletion_timestamp.is_some() => PodState::Ended(o),
                _ => results::pod_state(&p),
            };
            if !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded") | Some("Failed")
            ) {
                read.occupying += 1;
            }
            if state.is_final() && holds_node(&p) {
                read.to_stop.push(i);
            }
            state
        } else if let Some(o) = e.outcome() {
            // Ended earlier (a blocked pod this controller deleted): the entry holds why.
            PodState::Ended(o)
        } else {
            // Gone: how it ended, when the watch saw the pod the run made end before it
            // went (preempted, evicted, the agent's exit); otherwise only that it went.
            let last = gone(&pod_name).filter(|p| p.uid().as_deref() == Some(made.as_str()));
            match last.map(|p| results::pod_state(&p)) {
                Some(state) if state.is_final() => state,
                _ => PodState::Ended(results::gone_pod(e.verdict, past_deadline(i), run_seconds)),
            }
        };
        read.outcomes.push(o);
    }
    Ok(read)
}

/// The run's shards: from the cache, or listed when the cache has not caught up.
pub(super) async fn shards_of(run: &FabricTestRun, ctx: &RunContext) -> Result<Vec<Shard>> {
    let want = run.status.as_ref().map_or(0, |s| s.shards) as usize;
    let found = match shards::cached(&ctx.shards, &ctx.shard_writes, run) {
        Some(s) => s,
        None => shards::listed(&shards_api(ctx, run), &ctx.shard_writes, run).await?,
    };
    if found.len() < want {
        return Err(Error::Missing("the run's FabricTestRunShards"));
    }
    Ok(found)
}

/// One pass: reads every node's pod, carries out [`plan_pass`] (deletes the pods that
/// ended, stops a wave past its deadline, creates the pods of the wave under way), then
/// writes what [`plan_write`] says: the shards that changed and the run's progress, or, once
/// every node check has ended, the hand-over to the node-pair phase or the verdict.
pub(super) async fn progress(
    run: &FabricTestRun,
    status: FabricTestRunStatus,
    api: &Api<FabricTestRun>,
    ctx: &RunContext,
    key: &str,
) -> Result<Action> {
    let pass_began = std::time::Instant::now();
    let name = run.name_any();
    let ns = ctx.pod_namespace.as_str();
    let uid = run.uid().ok_or(Error::Missing("metadata.uid"))?;
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let timeout = i64::from(run.spec.agent.timeout_seconds);
    let now_t = Utc::now();
    let shards = shards_of(run, ctx).await?;
    let mut entries = shards::results(&shards);

    let pods = pods_of(ctx, ns, &uid);

    let mut prog = status.progress.clone().unwrap_or_default();
    let wave_size = match prog.wave_size as usize {
        0 => entries.len().max(1),
        n => n,
    };
    let stored_wave = prog.wave.saturating_sub(1) as usize;
    let deadline = wave_deadline(&prog, &status, timeout, now_t);
    let past_deadline = now_t >= deadline;
    let run_seconds = (timeout + DEADLINE_MARGIN_SECONDS) as u64;
    let base = names::run_base(&name, &uid);
    let read = read_states(
        &mut entries,
        &PodsOfRun {
            base: &base,
            uid: &uid,
            pods: &pods,
            api: &pods_api,
            gone: &|pod: &str| ctx.departed.last(ns, pod, &uid),
        },
        &|i| past_deadline && waves::wave_of(i, wave_size) <= stored_wave,
        run_seconds,
    )
    .await?;
    if let Some(h) = super::halt::halt(run, &status, now_t) {
        let stopping = Stopping {
            read: AsRead {
                shards: &shards,
                status: &status,
            },
            outcomes: read.outcomes,
            uid: &uid,
            pods_api: &pods_api,
        };
        return halted(run, h, entries, stopping, api, ctx).await;
    }
    let plan = plan_pass(&read, wave_size, stored_wave, past_deadline);

    let mut outcomes = read.outcomes;
    for &i in &plan.delete {
        if let Some(pod) = &entries[i].pod {
            delete_made(&pods_api, pod, entries[i].pod_uid.as_deref()).await?;
        }
    }
    for (pod, pod_uid) in &read.unrecorded {
        tracing::warn!(%pod, "a pod this run controls but never recorded is deleted, not read");
        delete_unrecorded(&pods_api, pod, pod_uid).await?;
    }
    if let Some(wave) = &plan.stop {
        let not_ready = |node: &str| crate::nodes::not_ready_in(&ctx.nodes, node);
        let past = PastDeadline {
            wave,
            run_seconds,
            not_ready: &not_ready,
        };
        prog.stopped +=
            stop_at_deadline(&entries, past, &read.to_create, &mut outcomes, &pods_api).await?;
    }
    let transient = match plan.step.as_ref().filter(|s| !s.create.is_empty()) {
        Some(step) => {
            create_step(
                run,
                &mut entries,
                &mut outcomes,
                &step.create,
                ctx,
                &pods_api,
            )
            .await
        }
        None => None,
    };

    let read_ms = pass_began.elapsed().as_millis();
    let written = plan_write(
        run,
        &status,
        prog,
        &plan,
        PassDone {
            entries: &mut entries,
            outcomes: &outcomes,
            retry: transient.is_some(),
        },
        wave_size,
        now(),
    );
    // The last pass of the node checks keeps no results: the verdict goes first.
    if !written.checks_ended {
        keep_ended(run, &uid, &entries, &outcomes, ctx);
    }
    let active = outcomes.iter().filter(|o| !o.is_final()).count();
    tracing::debug!(active, nodes = entries.len(), read_ms, "pass");
    ctx.metrics.set_active_pods(key, active as i64);
    let next = written.next;
    ctx.metrics.set_run_progress(run, next.progress.as_ref());

    let read = AsRead {
        shards: &shards,
        status: &status,
    };
    if written.checks_ended {
        let ended = NodeChecksEnded {
            read,
            outcomes,
            pods_api: &pods_api,
        };
        return after_node_checks(run, next, entries, ended, api, ctx).await;
    }
    save(run, &uid, read, &entries, next, api, ctx).await?;
    if let Some(e) = transient {
        return Err(e.into());
    }
    // The next pass by the wave's deadline, or by `limits.maxDurationSeconds`.
    let until = super::halt::stop_time(run, status.start_time.as_ref())
        .map(|t| crate::time::to_chrono(&t))
        .map_or(deadline, |stop| stop.min(deadline));
    let wait = (until - Utc::now()).num_milliseconds().max(100) as u64;
    Ok(Action::requeue(Duration::from_millis(
        wait.min(60_000) + 50,
    )))
}

/// What a pass over a stopped run works from: the run's shards and status as read, each
/// node's pod as it stands, the run's UID and the pods API.
struct Stopping<'a> {
    read: AsRead<'a>,
    outcomes: Vec<PodState>,
    uid: &'a str,
    pods_api: &'a Api<Pod>,
}

/// A pass over a run stopped as `halt` says (see [`super::halt`]): every pod it made is
/// deleted, every node without a result ends not measured, and the run waits, saying so,
/// until none of its pods is left; then its status says every GPU is free and the nodes it
/// measured are judged.
async fn halted(
    run: &FabricTestRun,
    halt: super::halt::Halt,
    mut entries: Vec<NodeRunResult>,
    s: Stopping<'_>,
    api: &Api<FabricTestRun>,
    ctx: &RunContext,
) -> Result<Action> {
    let Stopping {
        read,
        mut outcomes,
        uid,
        pods_api,
    } = s;
    let left = super::halt::stop_pods(ctx, uid, pods_api).await?;
    super::halt::end_unfinished(&mut outcomes, &halt);
    let prog = read.status.progress.clone().unwrap_or_default();
    let wave_size = (prog.wave_size as usize).max(1);
    let plan = PassPlan {
        delete: Vec::new(),
        stop: None,
        step: None,
    };
    let done = PassDone {
        entries: &mut entries,
        outcomes: &outcomes,
        retry: false,
    };
    let mut next = plan_write(run, read.status, prog, &plan, done, wave_size, now()).next;
    let first = read
        .status
        .limits
        .as_ref()
        .and_then(|l| l.stopped)
        .is_none();
    super::halt::record(&mut next, &halt, left, run.metadata.generation, &now());
    if first {
        tracing::info!(message = %halt.message, pods = left, "run stopped");
        let note = format!("{}: stopping its {left} pods", halt.message);
        super::common::publish(ctx, run, true, "RunStopped", "Stop", &note).await;
    }
    if left > 0 {
        save(run, uid, read, &entries, next, api, ctx).await?;
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    finish(run, next, read.shards, entries, outcomes, api, ctx).await
}

/// What a pass does to the run's pods, decided from where they stand.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct PassPlan {
    /// Pods that ended while the kubelet still holds them (an image that cannot be pulled,
    /// a missing Secret): deleted, so that they stop holding the node's GPUs.
    pub(super) delete: Vec<usize>,
    /// The wave under way passed its deadline: its nodes (and those of the waves before
    /// it), every one of which ends now: a pod still there is stopped, a node without one
    /// never starts.
    pub(super) stop: Option<Vec<usize>>,
    /// The wave under way and the pods to create in it now; None once every node is done
    /// (the node checks have ended).
    pub(super) step: Option<waves::WaveStep>,
}

/// The pass over pods that stand as `read` says, in waves of `wave_size` with the wave
/// `stored_wave` (0-based) under way as the status records it, and whether that wave's
/// deadline has passed: pure. A node of a wave stopped at its deadline counts as done, and
/// its pod as holding its node until it is gone, so the next wave's pods are created only
/// as room allows ([`waves::step`]).
pub(super) fn plan_pass(
    read: &Read,
    wave_size: usize,
    stored_wave: usize,
    past_deadline: bool,
) -> PassPlan {
    let in_wave = |i: usize| waves::wave_of(i, wave_size) <= stored_wave;
    let nodes = read.outcomes.len();
    let stop = past_deadline.then(|| (0..nodes).filter(|i| in_wave(*i)).collect::<Vec<_>>());
    let done: Vec<bool> = read
        .outcomes
        .iter()
        .enumerate()
        .map(|(i, o)| o.is_final() || (stop.is_some() && in_wave(i)))
        .collect();
    let waiting: Vec<usize> = read
        .to_create
        .iter()
        .copied()
        .filter(|i| !done[*i])
        .collect();
    PassPlan {
        delete: read.to_stop.clone(),
        stop,
        step: waves::step(&done, &waiting, read.occupying, wave_size),
    }
}

/// What a pass's deletes, stops and creates left: each node's entry and outcome, and
/// whether a pod creation failed for a while (the pass is retried).
pub(super) struct PassDone<'a> {
    pub(super) entries: &'a mut [NodeRunResult],
    pub(super) outcomes: &'a [PodState],
    pub(super) retry: bool,
}

/// What a pass writes.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct PassWrite {
    /// The run's status with its progress after the pass.
    pub(super) next: FabricTestRunStatus,
    /// Every node check has ended (no step left, no pod creation to retry): the run hands
    /// over to its node-pair phase or its verdict.
    pub(super) checks_ended: bool,
}

/// What the pass `plan` of `run` writes once it was carried out (`done`), at `now`: each
/// node's entry from its outcome (its node-pair records kept), and the run's status, read
/// as `status`, with its progress `prog` recorded: pure.
pub(super) fn plan_write(
    run: &FabricTestRun,
    status: &FabricTestRunStatus,
    prog: RunProgress,
    plan: &PassPlan,
    done: PassDone<'_>,
    wave_size: usize,
    now: Time,
) -> PassWrite {
    for (e, o) in done.entries.iter_mut().zip(done.outcomes) {
        let pod = e.pod.clone();
        let pod_uid = e.pod_uid.take();
        let pairs = std::mem::take(&mut e.pairs);
        *e = results::node_result(&e.node, pod.as_deref(), o);
        e.pod_uid = pod_uid;
        e.pairs = pairs;
    }
    let mut next = status.clone();
    record_progress(
        run,
        &mut next,
        prog,
        plan.step.as_ref(),
        &done,
        wave_size,
        now,
    );
    PassWrite {
        next,
        checks_ended: plan.step.is_none() && !done.retry,
    }
}

/// The full result of each pod that ended since the last pass goes to the keeper (in the
/// background), so that after the verdict only the last pods' logs are left to read.
fn keep_ended(
    run: &FabricTestRun,
    uid: &str,
    entries: &[NodeRunResult],
    outcomes: &[PodState],
    ctx: &RunContext,
) {
    let ended: Vec<bool> = outcomes.iter().map(PodState::is_final).collect();
    let todo = ctx.keeper.claim(uid, entries, Some(&ended));
    if todo.is_empty() {
        return;
    }
    ctx.keeper.spawn(
        ctx.client.clone(),
        ctx.pod_namespace.clone(),
        run.clone(),
        uid.to_string(),
        todo,
    );
}

/// What the end of the node checks hands on: the run's shards and status as the pass read
/// them, the pods' outcomes, and the pods API.
pub(super) struct NodeChecksEnded<'a> {
    read: AsRead<'a>,
    outcomes: Vec<PodState>,
    pods_api: &'a Api<Pod>,
}

/// Every node check has ended: the run finishes, or its node-pair phase, then its
/// multi-node DDP probe, then its multi-node NCCL sweep, takes a step (and the run waits
/// for it). A confirmation run retests
/// node-check suspects only: it has no known-good partners to pair them with, and a node
/// failed by the node-pair phase was already retested against one within its own run (see
/// `NodeRunResult::confirmed`).
pub(super) async fn after_node_checks(
    run: &FabricTestRun,
    mut next: FabricTestRunStatus,
    mut entries: Vec<NodeRunResult>,
    e: NodeChecksEnded<'_>,
    api: &Api<FabricTestRun>,
    ctx: &RunContext,
) -> Result<Action> {
    let uid = run.uid().ok_or(Error::Missing("metadata.uid"))?;
    if run.spec.trigger == gpufabric_api::run::Trigger::Confirmation {
        return finish(run, next, e.read.shards, entries, e.outcomes, api, ctx).await;
    }
    let suite = &run.spec.suite;
    let mut nic_records = Vec::new();
    let step = if suite.node_pairs.enabled {
        let (n, o) = (&mut next, &e.outcomes);
        pairs::advance(run, n, &mut entries, o, ctx, e.pods_api, &mut nic_records).await
    } else {
        Ok(pairs::PairsStep::Done)
    };
    let step = match step {
        Ok(pairs::PairsStep::Done) if suite.ddp_nodes.enabled => {
            let (o, p) = (&e.outcomes, e.pods_api);
            group::advance::<DdpNodesStatus>(run, &mut next, &entries, o, ctx, p).await
        }
        other => other,
    };
    // After the DDP probe, not beside it: both hold every GPU of their nodes, and each
    // would time the other's traffic.
    let step = match step {
        Ok(pairs::PairsStep::Done) if suite.nccl_nodes.enabled => {
            let (o, p) = (&e.outcomes, e.pods_api);
            group::advance::<NcclNodesStatus>(run, &mut next, &entries, o, ctx, p).await
        }
        other => other,
    };
    // The port counter records only once the pairs that read them are saved as settled.
    match step {
        Ok(pairs::PairsStep::Done) => {
            let action = finish(run, next, e.read.shards, entries, e.outcomes, api, ctx).await?;
            write_nic_records(ctx, nic_records).await;
            Ok(action)
        }
        Ok(pairs::PairsStep::Wait(wait)) => {
            save(run, &uid, e.read, &entries, next, api, ctx).await?;
            write_nic_records(ctx, nic_records).await;
            Ok(Action::requeue(wait))
        }
        Err(err) => {
            // What this pass did (pods created, pairs settled) is kept before the retry.
            save(run, &uid, e.read, &entries, next, api, ctx).await?;
            write_nic_records(ctx, nic_records).await;
            Err(err)
        }
    }
}

/// Writes the port counter records of the pairs a pass settled; best effort: a record not
/// written leaves the older one, and the run goes on.
async fn write_nic_records(ctx: &RunContext, records: pairs::NicRecords) {
    if records.is_empty() {
        return;
    }
    for failure in crate::counters::write_nic(&ctx.client, records).await {
        tracing::warn!(%failure, "NIC error counters not recorded");
    }
}

/// The run's shards and status as a pass read them: what it writes only the changes to.
#[derive(Clone, Copy)]
pub(super) struct AsRead<'a> {
    pub(super) shards: &'a [Shard],
    pub(super) status: &'a FabricTestRunStatus,
}

/// Writes what changed in this pass: the shards whose nodes changed, and the run's status
/// (counts and the worst nodes) when it differs from the one read.
pub(super) async fn save(
    run: &FabricTestRun,
    uid: &str,
    read: AsRead<'_>,
    entries: &[NodeRunResult],
    mut next: FabricTestRunStatus,
    api: &Api<FabricTestRun>,
    ctx: &RunContext,
) -> Result<()> {
    let after = shards::split(entries, read.shards);
    shards::write_changed(
        &shards_api(ctx, run),
        &ctx.shard_writes,
        uid,
        read.shards,
        &after,
    )
    .await?;
    st::set_counts(&mut next, entries);
    next.nodes = st::nodes_for_run_status(entries);
    if next != *read.status {
        apply_status(api, &run.name_any(), &next).await?;
    }
    Ok(())
}

/// The run's progress after this pass (done, waves, the wave under way and when all its
/// pods existed) and, once every node has a pod or an outcome, the `PodsCreated` condition.
fn record_progress(
    run: &FabricTestRun,
    next: &mut FabricTestRunStatus,
    mut prog: RunProgress,
    step: Option<&waves::WaveStep>,
    done: &PassDone<'_>,
    wave_size: usize,
    now: Time,
) {
    let (entries, outcomes) = (&*done.entries, done.outcomes);
    let has_pod = |i: usize| entries[i].pod.is_some() || outcomes[i].is_final();
    if (0..entries.len()).all(has_pod)
        && !next
            .conditions
            .iter()
            .any(|c| c.type_ == CONDITION_PODS_CREATED)
    {
        let c = st::condition(
            &next.conditions.clone(),
            CONDITION_PODS_CREATED,
            true,
            "AllPodsCreated",
            format!("{} benchmark pods created", entries.len()),
            run.metadata.generation,
            &now,
        );
        next.conditions.push(c);
        tracing::info!(pods = entries.len(), "all pods created");
    }
    prog.total = entries.len() as u32;
    prog.done = outcomes.iter().filter(|o| o.is_final()).count() as u32;
    prog.wave_size = wave_size as u32;
    prog.waves = entries.len().div_ceil(wave_size) as u32;
    if let Some(step) = step {
        if step.wave + 1 != prog.wave as usize || prog.wave_start_time.is_none() {
            prog.wave = step.wave as u32 + 1;
            prog.wave_start_time = Some(now.clone());
            prog.wave_pods_created_time = None;
            tracing::info!(wave = prog.wave, waves = prog.waves, "wave started");
        }
        let start = step.wave * wave_size;
        let end = (start + wave_size).min(entries.len());
        if prog.wave_pods_created_time.is_none() && (start..end).all(has_pod) {
            prog.wave_pods_created_time = Some(now);
        }
    }
    next.progress = Some(prog);
}

/// The pod is not in a terminal phase: the kubelet still holds it (and its GPUs).
pub(super) fn holds_node(p: &Pod) -> bool {
    !matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    ) && p.meta().deletion_timestamp.is_none()
}

#[cfg(test)]
mod tests;
