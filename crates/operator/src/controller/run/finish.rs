//! The end of a run: every node judged, every node's result written to the shards, the
//! run's status and its test's history updated.

use super::*;

/// Judges every node, writes every node's result to the shards, and ends the run.
pub(super) async fn finish(
    run: &FabricTestRun,
    mut next: FabricTestRunStatus,
    shards: &[Shard],
    mut entries: Vec<NodeRunResult>,
    outcomes: &[PodState],
    api: &Api<FabricTestRun>,
    ctx: &Context,
) -> Result<Action> {
    let name = run.name_any();
    let uid = run.uid().ok_or(Error::Missing("metadata.uid"))?;
    let (inputs, evaluation) = judge(&entries, outcomes, &run.spec.thresholds, ctx);
    let mut all_findings = evaluation.findings.clone();
    if next.node_pairs.is_some() {
        all_findings.extend(crate::pairs::phase::findings(&entries, &Default::default()));
        gpufabric_health::evaluate::sort_findings(&mut all_findings);
    }
    let blamed = crate::pairs::phase::blamed(&all_findings);
    let worst = st::worst_finding_per_node(&all_findings);
    for e in &mut entries {
        if let Some(v) = evaluation.verdicts.get(&e.node) {
            e.verdict = *v;
        }
        // The node-pair findings that blame a node fail it (it passed its own check).
        if e.verdict == gpufabric_api::run::NodeVerdict::Passed
            && let Some(blaming) = blamed.get(e.node.as_str())
        {
            e.verdict = gpufabric_api::run::NodeVerdict::Failed;
            e.confirmed = crate::pairs::phase::confirmed_by_retest(blaming);
        }
        e.findings = evaluation.critical_count(&e.node)
            + blamed.get(e.node.as_str()).map_or(0, |b| b.len() as u32);
        e.finding = worst.get(e.node.as_str()).map(|f| f.message.clone());
    }
    let after = shards::split(&entries, shards);
    shards::write_changed(
        &shards_api(ctx, run),
        &ctx.shard_writes,
        &uid,
        shards,
        &after,
    )
    .await?;

    let (kept, dropped) = st::findings_for_status(all_findings.clone());
    next.finding_count = all_findings.len() as u32;
    next.findings = kept;
    st::set_counts(&mut next, &entries);
    next.nodes = st::nodes_for_run_status(&entries);
    let completion = now();
    let started = next
        .start_time
        .clone()
        .unwrap_or_else(|| completion.clone());
    next.duration = Some(st::duration_string(
        (to_chrono(&completion) - to_chrono(&started)).num_seconds(),
    ));
    next.completion_time = Some(completion);
    let stopped = next.progress.as_ref().map_or(0, |p| p.stopped);
    let mut notes = Vec::new();
    if let Some(m) = &next.message {
        notes.push(m.clone());
    }
    if stopped > 0 {
        next.phase = RunPhase::Failed;
        notes.push(format!(
            "the run deadline passed: {stopped} pods that had not finished were stopped"
        ));
    } else {
        next.phase = RunPhase::Succeeded;
    }
    // Before the run ends, so before the history limits can delete its pods.
    notes.extend(keep_results(run, &uid, &entries, None, ctx).await);
    forget_kept(ctx, &uid);
    if dropped > 0 {
        notes.push(format!(
            "{dropped} more findings are not listed (status size limit)"
        ));
    }
    next.message = (!notes.is_empty()).then(|| notes.join("; "));
    crate::signals::set_finished_conditions(&mut next, run.metadata.generation, &now());
    apply_status(api, &name, &next).await?;
    // After the status, so a failed status write cannot make a retry judge against the
    // counters of the run it is judging.
    let at = next
        .completion_time
        .as_ref()
        .map(crate::signals::rfc3339)
        .unwrap_or_default();
    let records = crate::counters::to_write(&inputs, &evaluation.findings, &name, &at);
    for failure in crate::counters::write(&ctx.client, records).await {
        tracing::warn!(%failure, "error counters not recorded");
    }

    announce(run, &next, &entries, all_findings.len(), ctx).await;
    Ok(Action::await_change())
}

/// Judges the nodes whose pods have ended by their own checks: what the evaluator was
/// given, and what it said.
pub(super) fn judge(
    entries: &[NodeRunResult],
    outcomes: &[PodState],
    thresholds: &gpufabric_api::policy::Thresholds,
    ctx: &Context,
) -> (Vec<NodeInput>, gpufabric_health::Evaluation) {
    let inputs: Vec<NodeInput> = entries
        .iter()
        .zip(outcomes)
        .filter_map(|(e, o)| {
            let PodState::Ended(outcome) = o else {
                return None;
            };
            Some(node_input(ctx, &e.node, outcome))
        })
        .collect();
    let evaluation = gpufabric_health::evaluate(&inputs, thresholds);
    (inputs, evaluation)
}

/// Metrics, the log line, the Event on the run and, when many nodes were not measured for
/// one reason, the one Event on the test that says so.
async fn announce(
    run: &FabricTestRun,
    next: &FabricTestRunStatus,
    entries: &[NodeRunResult],
    findings: usize,
    ctx: &Context,
) {
    let name = run.name_any();
    let (p, f, er, nm) = (next.passed, next.failed, next.errored, next.not_measured);
    ctx.metrics.run_finished(run, next.phase, f + er);
    ctx.metrics.set_run_progress(run, None);
    for n in entries {
        ctx.metrics
            .nodes_tested
            .get_or_create(&VerdictLabels {
                verdict: format!("{:?}", n.verdict),
            })
            .inc();
    }
    let summary = format!(
        "{} nodes: {p} passed, {f} failed, {er} errored or timed out, {nm} not measured; {} findings",
        entries.len(),
        findings
    );
    tracing::info!(phase = ?next.phase, %summary, "run finished");
    let bad = f + er > 0 || next.phase == RunPhase::Failed;
    let reason = if next.phase == RunPhase::Failed {
        "RunFailed"
    } else if bad {
        "NodesFailed"
    } else {
        "RunSucceeded"
    };
    if let Some(issue) = st::infrastructure_issue(entries) {
        // One Event for the pattern, on the test: the nodes are not at fault.
        let note = format!("{name}: {}", issue.message());
        tracing::warn!(%note, "many nodes not measured for one reason");
        if let Some(t) = &Context::test_ref_of(run) {
            ctx.events
                .warning(t, st::CONDITION_INFRASTRUCTURE_DEGRADED, "Finish", note)
                .await;
        }
    }
    publish(ctx, run, bad, reason, "Finish", &summary).await;
}

/// Keeps the full documents of the nodes of `entries` that have ended (`ended`: which; None:
/// all) and that this process has not kept yet; returns a note when some could not be kept
/// (they are tried again at the next pass, at the latest when the run ends).
pub(super) async fn keep_results(
    run: &FabricTestRun,
    uid: &str,
    entries: &[NodeRunResult],
    ended: Option<&[bool]>,
    ctx: &Context,
) -> Option<String> {
    let todo: Vec<NodeRunResult> = {
        let kept = ctx
            .kept_results
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let done = kept.get(uid);
        entries
            .iter()
            .enumerate()
            .filter(|(i, _)| ended.is_none_or(|e| e.get(*i).copied().unwrap_or(false)))
            .filter(|(_, e)| !done.is_some_and(|d| d.contains(&e.node)))
            .map(|(_, e)| e.clone())
            .collect()
    };
    if todo.is_empty() {
        return None;
    }
    let kept = results::store::keep_all(&ctx.client, &ctx.pod_namespace, run, &todo).await;
    ctx.kept_results
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .entry(uid.to_string())
        .or_default()
        .extend(kept.nodes);
    kept.note
}

/// Drops the record of kept results of a run that has ended.
fn forget_kept(ctx: &Context, uid: &str) {
    ctx.kept_results
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .remove(uid);
}

/// What the evaluator needs of one node: its outcome, and what its labels say it holds.
fn node_input(ctx: &Context, name: &str, outcome: &NodeOutcome) -> NodeInput {
    let node = ctx.nodes.get(&ObjectRef::new(name));
    let product_label = node
        .as_ref()
        .and_then(|n| n.labels().get(keys::LABEL_GPU_PRODUCT).cloned());
    let expected_gpus = node.as_ref().and_then(|n| {
        n.labels()
            .get(keys::LABEL_GPU_COUNT)
            .and_then(|c| c.parse().ok())
            .or_else(|| Some(allocatable_gpus(n)).filter(|g| *g > 0))
    });
    NodeInput {
        baseline: node.as_deref().and_then(crate::counters::baseline_of),
        node: name.to_string(),
        product_label,
        expected_gpus,
        outcome: outcome.clone(),
    }
}
