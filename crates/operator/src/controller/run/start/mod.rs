//! The start of a run: its nodes resolved from the node cache and frozen into its shards,
//! or the run failed when none can be tested.

use super::common::{CREATE_CONCURRENCY, apply_status, publish, shards_api};
use crate::controller::run::context::RunContext;
use crate::error::Result;
use crate::nodes;
use crate::pods;
use crate::shards;
use crate::status as st;
use crate::time::{now, to_chrono};
use chrono::Utc;
use futures::StreamExt;
use gpufabric_api::run::{
    FabricTestRun, FabricTestRunStatus, NodeRunResult, RunPhase, RunProgress,
};
use gpufabric_api::shard::FabricTestRunShard;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;
use std::time::Duration;

/// Resolves the nodes and freezes them into the run's shards, or fails the run when there
/// are none. A start cut short after its shards were made keeps the nodes they hold.
pub(super) async fn start(
    run: &FabricTestRun,
    api: &Api<FabricTestRun>,
    ctx: &RunContext,
) -> Result<Action> {
    // One run picks and freezes its nodes at a time (see `Context::start_lock`).
    let _starting = ctx.start_lock.lock().await;
    let name = run.name_any();
    if let Some(h) = super::halt::cancelled(run) {
        let status = super::halt::cancelled_before_start(run, &h);
        apply_status(api, &name, &status).await?;
        ctx.metrics.run_finished(run, RunPhase::Failed, 0);
        publish(ctx, run, true, "RunCancelled", "Cancel", &h.message).await;
        return Ok(Action::await_change());
    }
    let shards_api = shards_api(ctx, run);
    let existing = shards::listed(&shards_api, &ctx.shard_writes, run).await?;
    let (targets, skipped) = if existing.is_empty() {
        let busy = busy_nodes_policy(run, ctx).await?;
        let (t, mut s, others) = resolve(run, ctx, busy.include).await?;
        if let BusyWait::Wait { message, recheck } =
            other_run_wait(run, &mut s, &others, Utc::now())
        {
            return wait_for_busy_nodes(run, message, recheck, api).await;
        }
        if let Some(wait) = busy.wait {
            match busy_wait(run, &mut s, wait, Utc::now()) {
                BusyWait::Wait { message, recheck } => {
                    return wait_for_busy_nodes(run, message, recheck, api).await;
                }
                BusyWait::Go => {}
            }
        }
        let last_pass = |n: &str| {
            ctx.nodes
                .get(&kube::runtime::reflector::ObjectRef::new(n))
                .and_then(|n| {
                    n.annotations()
                        .get(gpufabric_api::keys::ANNOTATION_LAST_PASS)
                        .cloned()
                })
        };
        let (t, over) = super::halt::over_limit(&run.spec.limits, t, |t| t.name.clone(), last_pass);
        s.extend(over);
        (t.into_iter().map(|t| t.name).collect::<Vec<_>>(), s)
    } else {
        let frozen = existing.iter().flat_map(|s| s.spec.nodes.clone()).collect();
        (frozen, Vec::new())
    };
    match plan_start(run, &targets, skipped, now()) {
        StartPlan::Fail { status, message } => {
            apply_status(api, &name, &status).await?;
            ctx.metrics.run_finished(run, RunPhase::Failed, 0);
            tracing::warn!(%message, "run failed at its start");
            publish(ctx, run, true, "RunFailed", "Resolve", &message).await;
            Ok(Action::await_change())
        }
        StartPlan::Start {
            status,
            wave_size,
            note,
        } => {
            if existing.is_empty() {
                create_shards(run, &targets, &shards_api).await?;
            }
            apply_status(api, &name, &status).await?;
            tracing::info!(nodes = targets.len(), wave_size, "run started");
            publish(ctx, run, false, "RunStarted", "Start", &note).await;
            Ok(Action::requeue(Duration::from_millis(100)))
        }
    }
}

/// What a run whose nodes are known does at its start, decided apart from doing it.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum StartPlan {
    /// It cannot run (no node to test, a rollout it cannot follow): ends Failed with this
    /// status, saying `message`.
    Fail {
        status: FabricTestRunStatus,
        message: String,
    },
    /// It runs over its nodes in waves of `wave_size`: its shards are made (when they were
    /// not yet), then this status, and `note` is published.
    Start {
        status: FabricTestRunStatus,
        wave_size: usize,
        note: String,
    },
}

/// The start of `run` over `targets`, with `skipped` the selected nodes it does not test,
/// at `started`: pure.
pub(super) fn plan_start(
    run: &FabricTestRun,
    targets: &[String],
    skipped: Vec<gpufabric_api::run::SkippedNode>,
    started: Time,
) -> StartPlan {
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
        (Err(e), _) => Some(e.to_string()),
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
    let limits = super::halt::at_start(run, &started, &skipped);
    let mut listed_skipped = skipped;
    listed_skipped.truncate(st::MAX_SKIPPED_IN_STATUS);
    if let Some(message) = failure {
        let mut status = FabricTestRunStatus {
            phase: RunPhase::Failed,
            start_time: Some(started.clone()),
            completion_time: Some(started.clone()),
            duration: Some(st::duration_string(0)),
            message: Some(message.clone()),
            skipped: listed_skipped,
            skipped_count,
            ..Default::default()
        };
        crate::signals::set_finished_conditions(&mut status, run.metadata.generation, &started);
        return StartPlan::Fail { status, message };
    }
    let wave_size = wave_size.unwrap_or(targets.len());
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
        limits,
        ..Default::default()
    };
    let note = if wave_size < targets.len() {
        format!("testing {} nodes in waves of {wave_size}", targets.len())
    } else {
        format!("testing {} nodes", targets.len())
    };
    StartPlan::Start {
        status,
        wave_size,
        note,
    }
}

/// The nodes a run tests and the selected nodes it skips, from the node cache (busy nodes
/// are tested when `include_busy`), and the nodes under another gpufabric run with its name.
pub(super) async fn resolve(
    run: &FabricTestRun,
    ctx: &RunContext,
    include_busy: bool,
) -> Result<Resolved> {
    let all = ctx.nodes.state();
    let runs: std::collections::BTreeMap<String, String> = ctx
        .runs
        .state()
        .iter()
        .filter_map(|r| Some((r.uid()?, r.name_any())))
        .collect();
    let own = nodes::OwnPods {
        namespace: &ctx.pod_namespace,
        runs: &runs,
    };
    let mut in_use = in_use(&ctx.client, &run.name_any(), &own).await?;
    for (node, other) in frozen_by_other_runs(run, ctx).await? {
        in_use.runs.entry(node).or_insert(other);
    }
    let tolerations = pods::tolerations(&run.spec.agent);
    let (targets, skipped) = nodes::resolve(
        all.iter().map(|n| n.as_ref()),
        &nodes::Selection {
            selector: &run.spec.node_selector,
            names: run.spec.nodes.as_deref(),
            tolerations: &tolerations,
            gpus_in_use: &in_use.gpus,
            other_runs: &in_use.runs,
            include_busy,
            dra_gpus: &in_use.dra_gpus,
        },
    );
    Ok((targets, skipped, in_use.runs))
}

/// What [`resolve`] gives: the nodes to test, the skipped nodes, and the nodes under
/// another gpufabric run with that run's name.
pub(super) type Resolved = (
    Vec<nodes::Target>,
    Vec<gpufabric_api::run::SkippedNode>,
    std::collections::BTreeMap<String, String>,
);

/// The nodes that other runs of this operator froze and have not finished testing, with
/// the run: such a run makes their pods wave by wave after its start, so they may not
/// exist yet. Read from the API server (a run that just started may not be in the shard
/// cache yet).
async fn frozen_by_other_runs(
    run: &FabricTestRun,
    ctx: &RunContext,
) -> Result<std::collections::BTreeMap<String, String>> {
    let api = shards_api(ctx, run);
    let mut held = std::collections::BTreeMap::new();
    for other in ctx.runs.state() {
        let finished = other.status.as_ref().is_some_and(|s| s.phase.is_finished());
        if finished || other.name_any() == run.name_any() {
            continue;
        }
        for shard in shards::listed(&api, &ctx.shard_writes, &other).await? {
            for e in shard.entries.iter().filter(|e| !e.verdict.is_final()) {
                held.entry(e.node.clone())
                    .or_insert_with(|| other.name_any());
            }
        }
    }
    Ok(held)
}

/// Longest a run waiting for busy nodes goes without looking at them again.
const BUSY_RECHECK: Duration = Duration::from_secs(15);

/// What a run with `waitForBusyNodesSeconds` does at its start.
#[derive(Debug, PartialEq)]
pub(super) enum BusyWait {
    /// Start now: no selected node is busy, or the wait is over (the busy nodes' skip
    /// messages then say how long they were waited for).
    Go,
    /// Stay Pending, saying so, and look again after `recheck`.
    Wait { message: String, recheck: Duration },
}

/// Whether a run created at its `creationTimestamp` waits (up to `wait`) for the busy
/// nodes among `skipped`. Pure.
pub(super) fn busy_wait(
    run: &FabricTestRun,
    skipped: &mut [gpufabric_api::run::SkippedNode],
    wait: Duration,
    now: chrono::DateTime<Utc>,
) -> BusyWait {
    wait_for(
        run,
        skipped,
        gpufabric_api::run::SkipReason::Busy,
        wait,
        now,
        &|until, n| {
            format!(
                "waiting until {until} (waitForBusyNodesSeconds) for {n} busy nodes, whose GPUs other pods hold"
            )
        },
        "still busy",
    )
}

/// Longer than its own agent timeout a run waits for its nodes under another gpufabric
/// run: their pods end by their deadline, and then a moment passes before the kubelet
/// reports their phase and frees their GPUs.
const OTHER_RUN_GRACE: Duration = Duration::from_secs(60);

/// Whether a run waits for its nodes under another gpufabric run (always: a node is tested
/// by one run at a time, and a pod made beside the other run's would be refused by the
/// kubelet), up to its agent timeout and [`OTHER_RUN_GRACE`]. Pure.
pub(super) fn other_run_wait(
    run: &FabricTestRun,
    skipped: &mut [gpufabric_api::run::SkippedNode],
    others: &std::collections::BTreeMap<String, String>,
    now: chrono::DateTime<Utc>,
) -> BusyWait {
    let wait = Duration::from_secs(u64::from(run.spec.agent.timeout_seconds)) + OTHER_RUN_GRACE;
    // The runs it waits for, by name.
    let mut runs: Vec<&str> = skipped
        .iter()
        .filter(|s| s.reason == gpufabric_api::run::SkipReason::InOtherRun)
        .filter_map(|s| others.get(&s.node).map(String::as_str))
        .collect();
    runs.sort_unstable();
    runs.dedup();
    let by = match runs.len() {
        0 => "another gpufabric run".to_string(),
        1 => format!("gpufabric run {}", runs[0]),
        _ => format!("gpufabric runs {}", runs.join(", ")),
    };
    wait_for(
        run,
        skipped,
        gpufabric_api::run::SkipReason::InOtherRun,
        wait,
        now,
        &|until, n| {
            format!("waiting until {until} for {n} nodes that {by} is testing (one run at a time)")
        },
        "still under another run",
    )
}

/// Whether a run waits (up to `wait` from its creation) for the nodes `skipped` left out
/// for `reason`: `Wait` while some are and the time is not over; once it is, their skip
/// messages say how long they were waited for (`still`).
fn wait_for(
    run: &FabricTestRun,
    skipped: &mut [gpufabric_api::run::SkippedNode],
    reason: gpufabric_api::run::SkipReason,
    wait: Duration,
    now: chrono::DateTime<Utc>,
    waiting: &dyn Fn(String, usize) -> String,
    still: &str,
) -> BusyWait {
    let held: Vec<&gpufabric_api::run::SkippedNode> =
        skipped.iter().filter(|s| s.reason == reason).collect();
    if held.is_empty() {
        return BusyWait::Go;
    }
    let created = run
        .metadata
        .creation_timestamp
        .as_ref()
        .map(to_chrono)
        .unwrap_or(now);
    let until = created + chrono::Duration::from_std(wait).unwrap_or(chrono::Duration::zero());
    if now < until {
        let names: Vec<&str> = held.iter().take(10).map(|s| s.node.as_str()).collect();
        let more = held.len().saturating_sub(names.len());
        let message = format!(
            "{}: {}{}",
            waiting(
                gpufabric_api::rfc3339::rfc3339(crate::time::to_time(until).0),
                held.len()
            ),
            names.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            },
        );
        let left = (until - now).to_std().unwrap_or_default();
        return BusyWait::Wait {
            message,
            recheck: left.min(BUSY_RECHECK),
        };
    }
    for s in skipped.iter_mut().filter(|s| s.reason == reason) {
        s.message = format!("{} ({still} after waiting {}s)", s.message, wait.as_secs());
    }
    BusyWait::Go
}

/// Keeps the run Pending with `message` (written only when it changed) and looks again
/// after `recheck`.
async fn wait_for_busy_nodes(
    run: &FabricTestRun,
    message: String,
    recheck: Duration,
    api: &Api<FabricTestRun>,
) -> Result<Action> {
    let current = run.status.clone().unwrap_or_default();
    if current.message.as_deref() != Some(message.as_str()) {
        let status = FabricTestRunStatus {
            phase: RunPhase::Pending,
            message: Some(message.clone()),
            ..current
        };
        apply_status(api, &run.name_any(), &status).await?;
        tracing::info!(%message, "run waits for busy nodes");
    }
    Ok(Action::requeue(recheck))
}

/// Creates the run's shards over `targets`, at most [`CREATE_CONCURRENCY`] at once; a
/// shard that exists already counts as created.
pub(super) async fn create_shards(
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

/// What the pods that have not ended hold, by node: GPUs of pods that are not gpufabric's,
/// and the other gpufabric run whose pod is there.
#[derive(Debug, Default, PartialEq)]
pub(super) struct InUse {
    pub gpus: std::collections::BTreeMap<String, u32>,
    pub runs: std::collections::BTreeMap<String, String>,
    /// Each node's GPUs published as DRA devices of the GPU driver: how many GPUs a node
    /// without `nvidia.com/gpu` has ([`nodes::gpu_count`]).
    pub dra_gpus: std::collections::BTreeMap<String, u32>,
}

/// [`InUse`] as seen by run `run`, read from the API server when it starts (and while it
/// waits for busy nodes), 500 pods a page so that a large cluster's pods are never held at
/// once: pods of every namespace hold GPUs, but only this operator's own (`own`) put a
/// node under another run. Without the right to list pods cluster-wide, no node counts as
/// busy. Where GPUs are DRA devices, a GPU allocated to another pod's ResourceClaim counts
/// as that pod's `nvidia.com/gpu` request does ([`crate::dra::claims::claimed_gpus`]).
pub(super) async fn in_use(
    client: &kube::Client,
    run: &str,
    own: &nodes::OwnPods<'_>,
) -> Result<InUse> {
    let api: Api<Pod> = Api::all(client.clone());
    let mut used = InUse::default();
    let devices = crate::dra::claims::observe(client).await?;
    used.dra_gpus = devices
        .as_ref()
        .map(crate::dra::claims::ClaimView::gpu_counts)
        .unwrap_or_default();
    let claims = match &devices {
        Some(d) => crate::dra::claims::list_allocated(client, d).await?,
        None => Vec::new(),
    };
    // The claims' consumers that are live pods of others, found while the pods are paged.
    let consumers = crate::dra::claims::consumer_pods(&claims);
    let mut others = std::collections::BTreeSet::new();
    let mut pages = crate::paging::Pages::default();
    while let Some(lp) = pages.next_params() {
        let lp = lp.fields("status.phase!=Succeeded,status.phase!=Failed");
        match api.list(&lp).await {
            Ok(list) => {
                for (node, gpus) in nodes::gpus_in_use(&list.items, own) {
                    *used.gpus.entry(node).or_insert(0) += gpus;
                }
                for (node, other) in nodes::other_runs(&list.items, run, own) {
                    used.runs.entry(node).or_insert(other);
                }
                others.extend(
                    list.items
                        .iter()
                        .filter(|p| own.run_of(p).is_none())
                        .filter_map(|p| p.metadata.uid.clone())
                        .filter(|uid| consumers.contains(uid)),
                );
                pages.read(list.metadata.continue_);
            }
            Err(kube::Error::Api(s)) if s.code == 403 => {
                tracing::warn!(error = %s.message, "cannot list pods cluster-wide: busy nodes are not skipped");
                return Ok(InUse {
                    dra_gpus: used.dra_gpus,
                    ..Default::default()
                });
            }
            Err(e) => return Err(e.into()),
        }
    }
    if let Some(d) = &devices {
        for (node, gpus) in crate::dra::claims::claimed_gpus(&claims, &d.gpus, &others) {
            *used.gpus.entry(node).or_insert(0) += gpus;
        }
    }
    Ok(used)
}

/// What the owning test says of busy nodes.
#[derive(Debug, Default)]
pub(super) struct BusyNodesPolicy {
    /// `includeBusyNodes`: test them anyway.
    pub include: bool,
    /// `waitForBusyNodesSeconds`: wait for them before starting.
    pub wait: Option<Duration>,
}

/// The owning test's busy-node settings, read when the run starts (none without a test).
pub(super) async fn busy_nodes_policy(
    run: &FabricTestRun,
    ctx: &RunContext,
) -> Result<BusyNodesPolicy> {
    let api: Api<gpufabric_api::test::FabricTest> = Api::all(ctx.client.clone());
    Ok(api
        .get_opt(&run.spec.test)
        .await?
        .map(|t| BusyNodesPolicy {
            include: t.spec.include_busy_nodes,
            wait: t
                .spec
                .wait_for_busy_nodes_seconds
                .filter(|_| !t.spec.include_busy_nodes)
                .map(|s| Duration::from_secs(u64::from(s))),
        })
        .unwrap_or_default())
}

#[cfg(test)]
mod tests;
