//! The start of a run: its nodes resolved from the node cache and frozen into its shards,
//! or the run failed when none can be tested.

use super::*;

/// Resolves the nodes and freezes them into the run's shards, or fails the run when there
/// are none. A start cut short after its shards were made keeps the nodes they hold.
pub(super) async fn start(
    run: &FabricTestRun,
    api: &Api<FabricTestRun>,
    ctx: &Context,
) -> Result<Action> {
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
pub(super) async fn publish(
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
pub(super) async fn resolve(
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

/// GPUs held by pods that are not gpufabric's, by node, read from the API server when a
/// run starts. Without the right to list pods cluster-wide, no node counts as busy.
pub(super) async fn gpus_in_use(ctx: &Context) -> Result<std::collections::BTreeMap<String, u32>> {
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
pub(super) async fn include_busy_nodes(run: &FabricTestRun, ctx: &Context) -> Result<bool> {
    let api: Api<gpufabric_api::test::FabricTest> = Api::all(ctx.client.clone());
    Ok(api
        .get_opt(&run.spec.test)
        .await?
        .is_some_and(|t| t.spec.include_busy_nodes))
}
