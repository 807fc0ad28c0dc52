//! The FabricTestRun controller: freezes the nodes into the run's shards, creates one
//! benchmark pod per node wave by wave (`spec.rollout`) with bounded concurrency, reads each
//! finished pod's result, ends each wave when its pods ended or its deadline passed, and
//! judges the nodes. Per-node results go to the shards (only those that changed are
//! written); the run keeps counts, progress and the worst nodes. Everything it knows is
//! re-read from the API server and its caches, so a restarted operator resumes a run where
//! it was.

use crate::context::Context;
use crate::error::{Error, Result};
use crate::metrics::VerdictLabels;
use crate::names;
use crate::nodes;
use crate::pods::{self, allocatable_gpus};
use crate::results::{self, PodState};
use crate::shards::{self, Shard};
use crate::status as st;
use crate::time::{now, to_chrono};
use crate::waves;
use chrono::Utc;
use futures::StreamExt;
use gpufabric_api::keys;
use gpufabric_api::outcome::{NodeOutcome, NotMeasuredReason};
use gpufabric_api::run::{
    FabricTestRun, FabricTestRunStatus, NodeRunResult, RunPhase, RunProgress,
};
use gpufabric_api::shard::FabricTestRunShard;
use gpufabric_health::NodeInput;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, LogParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

mod finish;
mod pairs;
use finish::finish;

/// Name of this controller in metrics and logs.
pub const CONTROLLER: &str = "fabrictestrun";
/// Pods created at once.
pub const CREATE_CONCURRENCY: usize = 50;
/// Time a run waits past the pods' own deadline before it stops them.
pub const DEADLINE_MARGIN_SECONDS: i64 = 30;
/// Condition set when every pod of the run exists; the run deadline counts from it.
pub const CONDITION_PODS_CREATED: &str = "PodsCreated";

/// Reconciles one run.
#[tracing::instrument(skip_all, fields(run = %obj.name_any()))]
pub async fn reconcile(obj: Arc<FabricTestRun>, ctx: Arc<Context>) -> Result<Action> {
    let _timer = ctx.metrics.reconcile_timer(CONTROLLER);
    let action = reconcile_run(&obj, &ctx).await?;
    super::succeeded(&ctx, obj.as_ref());
    Ok(action)
}

async fn reconcile_run(obj: &Arc<FabricTestRun>, ctx: &Arc<Context>) -> Result<Action> {
    ctx.caches_ready().await;
    let key = obj.name_any();
    let api: Api<FabricTestRun> = Api::all(ctx.client.clone());
    // The cache may lag behind our own last status write: read the run itself.
    let Some(run) = api.get_opt(&obj.name_any()).await? else {
        ctx.metrics.set_active_pods(&key, 0);
        if let Some(uid) = obj.uid() {
            ctx.shard_writes.forget(&uid);
        }
        return Ok(Action::await_change());
    };
    if run.meta().deletion_timestamp.is_some() {
        ctx.metrics.set_active_pods(&key, 0);
        if let Some(uid) = run.uid() {
            ctx.shard_writes.forget(&uid);
        }
        return Ok(Action::await_change());
    }
    let status = run.status.clone().unwrap_or_default();
    if status.phase.is_finished() {
        ctx.metrics.set_active_pods(&key, 0);
        return Ok(Action::await_change());
    }
    if status.start_time.is_none() {
        return start(&run, &api, ctx).await;
    }
    progress(&run, status, &api, ctx, &key).await
}

async fn apply_status(
    api: &Api<FabricTestRun>,
    name: &str,
    status: &FabricTestRunStatus,
) -> Result<FabricTestRun> {
    let body = json!({
        "apiVersion": gpufabric_api::GROUP.to_string() + "/" + gpufabric_api::VERSION,
        "kind": "FabricTestRun",
        "status": status,
    });
    Ok(api
        .patch_status(
            name,
            &PatchParams::apply(keys::MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await?)
}

/// The shard API (shards are cluster-scoped, like their run).
fn shards_api(ctx: &Context, _run: &FabricTestRun) -> Api<FabricTestRunShard> {
    Api::all(ctx.client.clone())
}

/// Resolves the nodes and freezes them into the run's shards, or fails the run when there
/// are none. A start cut short after its shards were made keeps the nodes they hold.
async fn start(run: &FabricTestRun, api: &Api<FabricTestRun>, ctx: &Context) -> Result<Action> {
    let name = run.name_any();
    let shards_api = shards_api(ctx, run);
    let existing = shards::listed(&shards_api, &ctx.shard_writes, run).await?;
    let (targets, skipped) = if existing.is_empty() {
        let (t, s) = resolve(run, ctx).await?;
        (t.into_iter().map(|t| t.name).collect::<Vec<_>>(), s)
    } else {
        let frozen = existing.iter().flat_map(|s| s.spec.nodes.clone()).collect();
        (frozen, Vec::new())
    };
    let started = now();
    let skipped_text = skipped
        .iter()
        .take(10)
        .map(|s| format!("{} {}", s.node, s.message))
        .collect::<Vec<_>>()
        .join("; ");
    let wave_size = run
        .spec
        .rollout
        .clone()
        .unwrap_or_default()
        .wave_size(targets.len());
    let failure = match (&wave_size, targets.is_empty()) {
        (Err(e), _) => Some(e.clone()),
        (Ok(_), true) if skipped.is_empty() => {
            Some("no node matches the nodeSelector and has allocatable nvidia.com/gpu".to_string())
        }
        (Ok(_), true) => Some(format!(
            "no node can be tested ({} selected, none usable): {skipped_text}",
            skipped.len()
        )),
        (Ok(_), false) => None,
    };
    let skipped_count = skipped.len() as u32;
    let mut listed_skipped = skipped;
    listed_skipped.truncate(st::MAX_SKIPPED_IN_STATUS);
    if let Some(message) = failure {
        let mut status = FabricTestRunStatus {
            phase: RunPhase::Failed,
            start_time: Some(started.clone()),
            completion_time: Some(started),
            duration: Some(st::duration_string(0)),
            message: Some(message.clone()),
            skipped: listed_skipped,
            skipped_count,
            ..Default::default()
        };
        crate::signals::set_finished_conditions(&mut status, run.metadata.generation, &now());
        apply_status(api, &name, &status).await?;
        ctx.metrics.run_finished(run, RunPhase::Failed, 0);
        tracing::warn!(%message, "run failed at its start");
        publish(ctx, run, true, "RunFailed", "Resolve", &message).await;
        return Ok(Action::await_change());
    }
    let wave_size = wave_size.unwrap_or(targets.len());
    if existing.is_empty() {
        create_shards(run, &targets, &shards_api).await?;
    }
    let pending: Vec<NodeRunResult> = targets
        .iter()
        .map(|n| NodeRunResult {
            node: n.clone(),
            ..Default::default()
        })
        .collect();
    let status = FabricTestRunStatus {
        phase: RunPhase::Running,
        start_time: Some(started),
        node_count: targets.len() as u32,
        shards: gpufabric_api::shard::shard_count(targets.len()) as u32,
        progress: Some(RunProgress {
            done: 0,
            total: targets.len() as u32,
            wave: 1,
            waves: targets.len().div_ceil(wave_size.max(1)) as u32,
            wave_size: wave_size as u32,
            wave_start_time: None,
            wave_pods_created_time: None,
            stopped: 0,
        }),
        nodes: st::nodes_for_run_status(&pending),
        message: (skipped_count > 0)
            .then(|| format!("{skipped_count} selected nodes not tested: {skipped_text}")),
        skipped: listed_skipped,
        skipped_count,
        ..Default::default()
    };
    apply_status(api, &name, &status).await?;
    tracing::info!(nodes = targets.len(), wave_size, "run started");
    let note = if wave_size < targets.len() {
        format!("testing {} nodes in waves of {wave_size}", targets.len())
    } else {
        format!("testing {} nodes", targets.len())
    };
    publish(ctx, run, false, "RunStarted", "Start", &note).await;
    Ok(Action::requeue(Duration::from_millis(100)))
}

/// An Event on the run, and the same (prefixed with the run's name) on its test.
async fn publish(
    ctx: &Context,
    run: &FabricTestRun,
    warning: bool,
    reason: &str,
    action: &str,
    note: &str,
) {
    let run_ref = run.object_ref(&());
    let test_note = format!("{}: {note}", run.name_any());
    if warning {
        ctx.events
            .warning(&run_ref, reason, action, note.to_string())
            .await;
    } else {
        ctx.events
            .normal(&run_ref, reason, action, note.to_string())
            .await;
    }
    if let Some(t) = &Context::test_ref_of(run) {
        if warning {
            ctx.events.warning(t, reason, action, test_note).await;
        } else {
            ctx.events.normal(t, reason, action, test_note).await;
        }
    }
}

/// The nodes a run tests and the selected nodes it skips, from the node cache.
async fn resolve(
    run: &FabricTestRun,
    ctx: &Context,
) -> Result<(Vec<nodes::Target>, Vec<gpufabric_api::run::SkippedNode>)> {
    let all = ctx.nodes.state();
    let in_use = gpus_in_use(ctx).await?;
    let tolerations = pods::tolerations(&run.spec.agent);
    Ok(nodes::resolve(
        all.iter().map(|n| n.as_ref()),
        &nodes::Selection {
            selector: &run.spec.node_selector,
            names: run.spec.nodes.as_deref(),
            tolerations: &tolerations,
            gpus_in_use: &in_use,
            include_busy: include_busy_nodes(run, ctx).await?,
        },
    ))
}

/// Creates the run's shards over `targets`, at most [`CREATE_CONCURRENCY`] at once; a
/// shard that exists already counts as created.
async fn create_shards(
    run: &FabricTestRun,
    targets: &[String],
    api: &Api<FabricTestRunShard>,
) -> Result<()> {
    let jobs: Vec<_> = shards::build(run, targets)?
        .into_iter()
        .map(|s| async move {
            match api.create(&PostParams::default(), &s).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
                Err(e) => Err(e),
            }
        })
        .collect();
    let results: Vec<_> = futures::stream::iter(jobs)
        .buffer_unordered(CREATE_CONCURRENCY)
        .collect()
        .await;
    for r in results {
        r?;
    }
    Ok(())
}

/// GPUs held by pods that are not gpufabric's, by node, read from the API server when a
/// run starts. Without the right to list pods cluster-wide, no node counts as busy.
async fn gpus_in_use(ctx: &Context) -> Result<std::collections::BTreeMap<String, u32>> {
    let api: Api<Pod> = Api::all(ctx.client.clone());
    let lp = ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed");
    match api.list(&lp).await {
        Ok(list) => Ok(nodes::gpus_in_use(&list.items)),
        Err(kube::Error::Api(s)) if s.code == 403 => {
            tracing::warn!(error = %s.message, "cannot list pods cluster-wide: busy nodes are not skipped");
            Ok(Default::default())
        }
        Err(e) => Err(e.into()),
    }
}

/// The owning test's `includeBusyNodes`, read when the run starts (false without a test).
async fn include_busy_nodes(run: &FabricTestRun, ctx: &Context) -> Result<bool> {
    let api: Api<gpufabric_api::test::FabricTest> = Api::all(ctx.client.clone());
    Ok(api
        .get_opt(&run.spec.test)
        .await?
        .is_some_and(|t| t.spec.include_busy_nodes))
}

fn is_transient(e: &kube::Error) -> bool {
    match e {
        kube::Error::Api(s) => s.code == 429 || s.code >= 500,
        _ => true,
    }
}

/// Where each node's pod stands, which pods to create and which to stop.
struct Read {
    outcomes: Vec<PodState>,
    to_create: Vec<usize>,
    /// Pods that ended while the kubelet still holds them (an image that cannot be pulled, a
    /// missing Secret): deleted so that they stop holding the node's GPUs.
    to_stop: Vec<usize>,
    /// Nodes whose pod holds them now (running, waiting, or ended and not yet gone).
    occupying: usize,
}

async fn read_states(
    name: &str,
    entries: &[NodeRunResult],
    pods: &HashMap<String, Arc<Pod>>,
    pods_api: &Api<Pod>,
    past_deadline: &(dyn Fn(usize) -> bool + Sync),
    run_seconds: u64,
) -> Result<Read> {
    let mut read = Read {
        outcomes: Vec::with_capacity(entries.len()),
        to_create: Vec::new(),
        to_stop: Vec::new(),
        occupying: 0,
    };
    for (i, e) in entries.iter().enumerate() {
        let pod_name = names::pod_name(name, &e.node);
        let live = match pods.get(&pod_name) {
            Some(p) => Some(p.as_ref().clone()),
            // Created before; the cache may lag, so ask the API server.
            None if e.pod.is_some() => pods_api.get_opt(&pod_name).await?,
            None => None,
        };
        let o = if let Some(p) = live {
            let state = results::pod_state(&p);
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
        } else if e.verdict.is_final() {
            // Ended earlier (a blocked pod this controller deleted): the status remembers why.
            PodState::Ended(results::outcome_from_entry(e))
        } else if e.pod.is_some() {
            if past_deadline(i) {
                PodState::Ended(results::never_started(&format!(
                    "the run deadline ({run_seconds}s)"
                )))
            } else {
                PodState::Ended(results::pod_gone())
            }
        } else {
            read.to_create.push(i);
            PodState::Waiting(None)
        };
        read.outcomes.push(o);
    }
    Ok(read)
}

/// The agent's last progress line in the tail of a running pod's log, to say which phase it
/// was in when the run deadline stopped it; None when the log cannot be read in a few
/// seconds (a node whose kubelet is gone) or has none.
async fn last_progress(pods_api: &Api<Pod>, pod: &str) -> Option<String> {
    let params = LogParams {
        container: Some(pods::CONTAINER.to_string()),
        tail_lines: Some(50),
        limit_bytes: Some(64 * 1024),
        ..LogParams::default()
    };
    match tokio::time::timeout(Duration::from_secs(5), pods_api.logs(pod, &params)).await {
        Ok(Ok(log)) => results::last_progress_in_log(&log),
        Ok(Err(e)) => {
            tracing::debug!(%pod, error = %e, "log of a pod stopped at the run deadline not read");
            None
        }
        Err(_) => None,
    }
}

/// Deletes a benchmark pod; one already gone is fine.
async fn delete_pod(pods_api: &Api<Pod>, name: &str) -> Result<()> {
    match pods_api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The run's shards: from the cache, or listed when the cache has not caught up.
async fn shards_of(run: &FabricTestRun, ctx: &Context) -> Result<Vec<Shard>> {
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

/// Reads every node's pod, stops what ended or passed its wave's deadline, creates the
/// pods of the wave under way, writes the shards that changed and the run's progress, and
/// finishes the run once every node has a result.
async fn progress(
    run: &FabricTestRun,
    status: FabricTestRunStatus,
    api: &Api<FabricTestRun>,
    ctx: &Context,
    key: &str,
) -> Result<Action> {
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
    let in_wave = |i: usize| waves::wave_of(i, wave_size) <= stored_wave;
    let run_seconds = (timeout + DEADLINE_MARGIN_SECONDS) as u64;
    let Read {
        mut outcomes,
        to_create,
        to_stop,
        occupying,
    } = read_states(
        &name,
        &entries,
        &pods,
        &pods_api,
        &|i| past_deadline && in_wave(i),
        run_seconds,
    )
    .await?;
    for i in to_stop {
        delete_pod(&pods_api, &names::pod_name(&name, &entries[i].node)).await?;
    }

    // Past the wave's deadline: its nodes without a pod never start, the others are stopped.
    if past_deadline {
        let wave: Vec<usize> = (0..entries.len()).filter(|i| in_wave(*i)).collect();
        prog.stopped += stop_at_deadline(
            &name,
            &entries,
            &wave,
            &to_create,
            &mut outcomes,
            &pods_api,
            run_seconds,
        )
        .await?;
    }

    let done: Vec<bool> = outcomes.iter().map(PodState::is_final).collect();
    let waiting: Vec<usize> = to_create.into_iter().filter(|i| !done[*i]).collect();
    let step = waves::step(&done, &waiting, occupying, wave_size);
    let transient = match step.as_ref().filter(|s| !s.create.is_empty()) {
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

    refresh_entries(run, &uid, &mut entries, &outcomes, ctx).await;
    let active = outcomes.iter().filter(|o| !o.is_final()).count();
    ctx.metrics.set_active_pods(key, active as i64);

    let mut next = status.clone();
    record_progress(
        run,
        &mut next,
        prog,
        step.as_ref(),
        &entries,
        &outcomes,
        wave_size,
    );
    ctx.metrics.set_run_progress(run, next.progress.as_ref());

    if step.is_none() && transient.is_none() {
        let ended = NodeChecksEnded {
            shards: &shards,
            outcomes: &outcomes,
            status: &status,
            pods_api: &pods_api,
        };
        return after_node_checks(run, next, entries, ended, api, ctx).await;
    }
    save(run, &uid, &shards, &entries, next, &status, api, ctx).await?;
    if let Some(e) = transient {
        return Err(e.into());
    }
    let wait = (deadline - Utc::now()).num_milliseconds().max(100) as u64;
    Ok(Action::requeue(Duration::from_millis(
        wait.min(60_000) + 50,
    )))
}

/// Each node's result from its pod's outcome (its node-pair records kept); each pod's full
/// result is kept as soon as the pod ends, so the run's end (and its verdict) waits only
/// for the last pods' logs.
async fn refresh_entries(
    run: &FabricTestRun,
    uid: &str,
    entries: &mut [NodeRunResult],
    outcomes: &[PodState],
    ctx: &Context,
) {
    for (e, o) in entries.iter_mut().zip(outcomes) {
        let pod = e.pod.clone();
        let pairs = std::mem::take(&mut e.pairs);
        *e = results::node_result(&e.node, pod.as_deref(), o);
        e.pairs = pairs;
    }
    let ended: Vec<bool> = outcomes.iter().map(PodState::is_final).collect();
    if let Some(note) = finish::keep_results(run, uid, entries, Some(&ended), ctx).await {
        tracing::warn!(%note, "full results not kept yet");
    }
}

/// What the end of the node checks hands on: the run's shards, the pods' outcomes, the
/// status read at the start of the pass, and the pods API.
struct NodeChecksEnded<'a> {
    shards: &'a [Shard],
    outcomes: &'a [PodState],
    status: &'a FabricTestRunStatus,
    pods_api: &'a Api<Pod>,
}

/// Every node check has ended: the run finishes, or its node-pair phase takes a step (and
/// the run waits for it). A confirmation run retests node-check suspects only: it has no
/// known-good partners to pair them with, and a node failed by the node-pair phase was
/// already retested against one within its own run (see `NodeRunResult::confirmed`).
async fn after_node_checks(
    run: &FabricTestRun,
    mut next: FabricTestRunStatus,
    mut entries: Vec<NodeRunResult>,
    e: NodeChecksEnded<'_>,
    api: &Api<FabricTestRun>,
    ctx: &Context,
) -> Result<Action> {
    let uid = run.uid().ok_or(Error::Missing("metadata.uid"))?;
    if !run.spec.suite.node_pairs.enabled
        || run.spec.trigger == gpufabric_api::run::Trigger::Confirmation
    {
        return finish(run, next, e.shards, entries, e.outcomes, api, ctx).await;
    }
    let pairs = pairs::advance(run, &mut next, &mut entries, e.outcomes, ctx, e.pods_api).await;
    match pairs {
        Ok(pairs::PairsStep::Done) => {
            finish(run, next, e.shards, entries, e.outcomes, api, ctx).await
        }
        Ok(pairs::PairsStep::Wait(wait)) => {
            save(run, &uid, e.shards, &entries, next, e.status, api, ctx).await?;
            Ok(Action::requeue(wait))
        }
        Err(err) => {
            // What this pass did (pods created, pairs settled) is kept before the retry.
            save(run, &uid, e.shards, &entries, next, e.status, api, ctx).await?;
            Err(err)
        }
    }
}

/// Writes what changed in this pass: the shards whose nodes changed, and the run's status
/// (counts and the worst nodes) when it differs from `before`.
#[allow(clippy::too_many_arguments)]
async fn save(
    run: &FabricTestRun,
    uid: &str,
    shards: &[Shard],
    entries: &[NodeRunResult],
    mut next: FabricTestRunStatus,
    before: &FabricTestRunStatus,
    api: &Api<FabricTestRun>,
    ctx: &Context,
) -> Result<()> {
    let after = shards::split(entries, shards);
    shards::write_changed(
        &shards_api(ctx, run),
        &ctx.shard_writes,
        uid,
        shards,
        &after,
    )
    .await?;
    st::set_counts(&mut next, entries);
    next.nodes = st::nodes_for_run_status(entries);
    if next != *before {
        apply_status(api, &run.name_any(), &next).await?;
    }
    Ok(())
}

/// The run's pods in the cache (the operator's namespace, owned by the run), by name.
fn pods_of(ctx: &Context, ns: &str, uid: &str) -> HashMap<String, Arc<Pod>> {
    ctx.pods
        .state()
        .into_iter()
        .filter(|p| p.namespace().as_deref() == Some(ns))
        .filter(|p| p.owner_references().iter().any(|o| o.uid == uid))
        .map(|p| (p.name_any(), p))
        .collect()
}

/// The deadline of the wave under way: the agent timeout and the operator's margin, from
/// when all its pods existed (else when the wave, or the run, started).
fn wave_deadline(
    prog: &RunProgress,
    status: &FabricTestRunStatus,
    timeout: i64,
    now: chrono::DateTime<Utc>,
) -> chrono::DateTime<Utc> {
    let base = prog
        .wave_pods_created_time
        .as_ref()
        .or(prog.wave_start_time.as_ref())
        .or(status.start_time.as_ref())
        .map(to_chrono)
        .unwrap_or(now);
    base + chrono::Duration::seconds(timeout + DEADLINE_MARGIN_SECONDS)
}

/// The run's progress after this pass (done, waves, the wave under way and when all its
/// pods existed) and, once every node has a pod or an outcome, the `PodsCreated` condition.
fn record_progress(
    run: &FabricTestRun,
    next: &mut FabricTestRunStatus,
    mut prog: RunProgress,
    step: Option<&waves::WaveStep>,
    entries: &[NodeRunResult],
    outcomes: &[PodState],
    wave_size: usize,
) {
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
            &now(),
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
            prog.wave_start_time = Some(now());
            prog.wave_pods_created_time = None;
            tracing::info!(wave = prog.wave, waves = prog.waves, "wave started");
        }
        let start = step.wave * wave_size;
        let end = (start + wave_size).min(entries.len());
        if prog.wave_pods_created_time.is_none() && (start..end).all(has_pod) {
            prog.wave_pods_created_time = Some(now());
        }
    }
    next.progress = Some(prog);
}

/// Creates the pods of this step; a pod the API server refuses for good ends its node as
/// not admitted. Returns the last transient error (the pass is retried), if any.
async fn create_step(
    run: &FabricTestRun,
    entries: &mut [NodeRunResult],
    outcomes: &mut [PodState],
    create: &[usize],
    ctx: &Context,
    pods_api: &Api<Pod>,
) -> Option<kube::Error> {
    let name = run.name_any();
    let mut transient = None;
    for (i, res) in create_pods(run, entries, create, ctx, pods_api).await {
        match res {
            Ok(()) => entries[i].pod = Some(names::pod_name(&name, &entries[i].node)),
            Err(CreateError::Permanent(reason)) => {
                outcomes[i] = PodState::Ended(NodeOutcome::not_measured(
                    NotMeasuredReason::NotAdmitted,
                    reason,
                ))
            }
            Err(CreateError::Transient(e)) => transient = Some(e),
        }
    }
    transient
}

/// Ends the wave's nodes past the run deadline: those without a pod never started, the
/// others are stopped (with the phase a running agent was in, from its log). Returns how
/// many pods were stopped.
async fn stop_at_deadline(
    name: &str,
    entries: &[NodeRunResult],
    wave: &[usize],
    to_create: &[usize],
    outcomes: &mut [PodState],
    pods_api: &Api<Pod>,
    run_seconds: u64,
) -> Result<u32> {
    let mut stopped = 0;
    for i in to_create.iter().copied().filter(|i| wave.contains(i)) {
        outcomes[i] = PodState::Ended(results::never_started(&format!(
            "the run deadline ({run_seconds}s)"
        )));
    }
    for &i in wave {
        let o = &mut outcomes[i];
        if o.is_final() {
            continue;
        }
        let pod = names::pod_name(name, &entries[i].node);
        let phase = match o {
            PodState::Running => last_progress(pods_api, &pod).await,
            _ => None,
        };
        delete_pod(pods_api, &pod).await?;
        *o = PodState::Ended(
            std::mem::replace(o, PodState::Running).at_run_deadline(run_seconds, phase.as_deref()),
        );
        stopped += 1;
    }
    Ok(stopped)
}

/// The pod is not in a terminal phase: the kubelet still holds it (and its GPUs).
fn holds_node(p: &Pod) -> bool {
    !matches!(
        p.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded") | Some("Failed")
    ) && p.meta().deletion_timestamp.is_none()
}

enum CreateError {
    Permanent(String),
    Transient(kube::Error),
}

/// Creates the missing pods, at most [`CREATE_CONCURRENCY`] at once. A pod that already
/// exists counts as created.
async fn create_pods(
    run: &FabricTestRun,
    entries: &[NodeRunResult],
    which: &[usize],
    ctx: &Context,
    pods_api: &Api<Pod>,
) -> Vec<(usize, Result<(), CreateError>)> {
    let jobs: Vec<_> = which
        .iter()
        .copied()
        .map(|i| {
            let node_name = entries[i].node.clone();
            let node: Option<Arc<Node>> = ctx.nodes.get(&ObjectRef::new(&node_name));
            async move {
                let Some(node) = node else {
                    return (
                        i,
                        Err(CreateError::Permanent(format!(
                            "node {node_name} no longer exists"
                        ))),
                    );
                };
                let gpus = allocatable_gpus(&node);
                let mut pod = match pods::node_check_pod(run, &node_name, gpus) {
                    Ok(p) => p,
                    Err(e) => return (i, Err(CreateError::Permanent(e.to_string()))),
                };
                ctx.resolve_agent_image(&mut pod);
                match pods_api.create(&PostParams::default(), &pod).await {
                    Ok(_) => (i, Ok(())),
                    Err(kube::Error::Api(s)) if s.code == 409 => (i, Ok(())),
                    Err(e) if is_transient(&e) => (i, Err(CreateError::Transient(e))),
                    Err(e) => (
                        i,
                        Err(CreateError::Permanent(format!(
                            "the benchmark pod could not be created: {e}"
                        ))),
                    ),
                }
            }
        })
        .collect();
    futures::stream::iter(jobs)
        .buffer_unordered(CREATE_CONCURRENCY)
        .collect()
        .await
}
