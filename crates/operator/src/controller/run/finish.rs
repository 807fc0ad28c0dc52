//! The end of a run: every node judged, every node's result written to the shards, the
//! run's status and its test's history updated.

use super::common::{apply_status, publish, shards_api};
use super::record_counters::{settle, write_after_fold};
use crate::controller::run::context::RunContext;
use crate::error::{Error, Result};
use crate::metrics::VerdictLabels;
use crate::pods::allocatable_gpus;
use crate::results::PodState;
use crate::shards::{self, Shard};
use crate::status as st;
use crate::time::{now, to_chrono};
use crate::trend::TrendKey;
use gpufabric_api::keys;
use gpufabric_api::outcome::NodeOutcome;
use gpufabric_api::run::{FabricTestRun, FabricTestRunStatus, NodeRunResult, RunPhase};
use gpufabric_health::NodeInput;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;

/// Judges every node, writes every node's result to the shards, and ends the run.
pub(super) async fn finish(
    run: &FabricTestRun,
    mut next: FabricTestRunStatus,
    shards: &[Shard],
    mut entries: Vec<NodeRunResult>,
    outcomes: Vec<PodState>,
    api: &Api<FabricTestRun>,
    ctx: &RunContext,
) -> Result<Action> {
    let began = std::time::Instant::now();
    let name = run.name_any();
    let uid = run.uid().ok_or(Error::Missing("metadata.uid"))?;
    // The outcomes move into the evaluator's inputs: at thousands of nodes a second copy of
    // every parsed result is the largest thing the operator would hold.
    let judging = Judging::of(run);
    // The test's baseline: what a node without enough peers in this run is judged against.
    let fleet_baseline = crate::baseline::of_test(&ctx.client, run).await?;
    let inputs = node_inputs(&entries, outcomes, &judging, ctx);
    let evaluation = gpufabric_health::evaluate::evaluate_against(
        &inputs,
        &run.spec.thresholds,
        Some(&judging.alike.against(&fleet_baseline, now().0.as_second())),
    );
    let mut all_findings = evaluation.findings.clone();
    let now_s = now().0.as_second();
    if let Some(np) = next.node_pairs.as_mut() {
        let baselines = crate::baseline::pair_baselines(&fleet_baseline, run, now_s);
        let judged = crate::pairs::phase::findings(&entries, &Default::default(), Some(&baselines));
        all_findings.extend(judged.findings);
        if let Some(basis) = judged.basis {
            crate::pairs::phase::note(np, &basis);
        }
    }
    let mut probe_shortfalls = Vec::new();
    if let Some(probe) = &next.ddp_nodes {
        all_findings.extend(crate::ddp_nodes::findings(probe));
        probe_shortfalls = crate::ddp_nodes::shortfalls(
            probe,
            &judging.alike.against(&fleet_baseline, now_s),
            run.spec.thresholds.fleet_min_relative_gap,
        );
    }
    if let Some(sweep) = next.nccl_nodes.as_mut() {
        let t = &run.spec.thresholds;
        // Blocks, not nodes, are compared: three of them are enough.
        let rule = gpufabric_health::fleet::Rule {
            score: t.fleet_outlier_score,
            min_gap: t.fleet_min_relative_gap,
            min_count: 3,
        };
        crate::nccl_nodes::judge(
            sweep,
            &rule,
            Some(&judging.alike.against(&fleet_baseline, now_s)),
        );
    }
    if next.node_pairs.is_some() || next.ddp_nodes.is_some() {
        gpufabric_health::evaluate::sort_findings(&mut all_findings);
    }
    judge_entries(&mut entries, &evaluation, &all_findings);
    next.baseline_sample = crate::baseline::sample(
        &name,
        &judging.alike,
        &entries,
        &evaluation.series,
        |n| ctx.nodes.get(&ObjectRef::new(n)),
        run.spec.suite.node_pairs.bytes,
        crate::baseline::Groups {
            probe: next.ddp_nodes.as_ref(),
            sweep: next.nccl_nodes.as_ref(),
        },
    );
    let judged_ms = began.elapsed().as_millis();
    let after = shards::split(&entries, shards);
    let written = shards::write_changed(
        &shards_api(ctx, run),
        &ctx.shard_writes,
        &uid,
        shards,
        &after,
    )
    .await?;

    crate::ddp_nodes::set_probe_condition(
        &mut next,
        &probe_shortfalls,
        run.metadata.generation,
        &now(),
    );
    crate::nccl_nodes::set_knee_condition(&mut next, run.metadata.generation, &now());
    end_status(
        &mut next,
        &all_findings,
        &entries,
        run.metadata.generation,
        now(),
    );
    // The verdict first, the full results after it: the history limits leave a run alone
    // while its `ResultsKept` is False, so its pods stay until they are read.
    let pending = ctx.keeper.unclaimed(&uid, &entries) + ctx.keeper.in_flight(&uid);
    crate::signals::set_results_kept(
        &mut next,
        (pending > 0).then_some(pending),
        None,
        run.metadata.generation,
        &now(),
    );
    // The error counters to record, worked out now so that every node's parsed result can be
    // let go before the writes: at thousands of nodes they are most of what this pass holds.
    let at = next
        .completion_time
        .as_ref()
        .map(|t| gpufabric_api::rfc3339::rfc3339(t.0))
        .unwrap_or_default();
    let records = crate::counters::to_write(&inputs, &evaluation.findings, &name, &at);
    drop(inputs);
    drop(evaluation);
    // Recorded after the test's fold (below): until then the condition says they are due,
    // so that an operator that stops in between records them from the run's pods.
    if !records.is_empty() {
        crate::signals::set_counters_recorded(
            &mut next,
            Some(records.len()),
            None,
            run.metadata.generation,
            &now(),
        );
    }
    apply_status(api, &name, &next).await?;
    tracing::debug!(
        took_ms = began.elapsed().as_millis(),
        judged_ms,
        shards_written = written,
        "verdict written"
    );
    announce(run, &next, &entries, all_findings.len(), ctx).await;
    drop(all_findings);
    // After the verdict, so a failed status write cannot make a retry judge against the
    // counters of the run it is judging; and after the test's fold, so that the test's
    // status and its quarantine do not queue behind a write a node at the API server.
    if !records.is_empty() {
        // The run as it ended: the test's fold is found by its end.
        let mut ended = run.clone();
        ended.status = Some(next.clone());
        let failures = write_after_fold(&ended, records, &entries, ctx).await;
        settle(&mut next, failures, run.metadata.generation);
        if pending == 0 {
            apply_status(api, &name, &next).await?;
        }
    }
    if pending > 0 {
        keep_after_verdict(run, next, &entries, api, ctx).await?;
    } else {
        ctx.keeper.settle(&uid).await;
        ctx.keeper.forget(&uid);
    }
    Ok(Action::await_change())
}

/// Each node's verdict and finding count from the evaluation, and a node that passed its
/// own check but is blamed by node-pair findings failed (confirmed when its pair tests read
/// the fault twice); each node's worst finding as its one-line reason.
fn judge_entries(
    entries: &mut [NodeRunResult],
    evaluation: &gpufabric_health::Evaluation,
    all_findings: &[gpufabric_api::Finding],
) {
    let blamed = crate::pairs::phase::blamed(all_findings);
    let worst = gpufabric_health::evaluate::worst_per_node(all_findings);
    for e in entries {
        if let Some(v) = evaluation.verdicts.get(&e.node) {
            e.verdict = *v;
        }
        if e.verdict == gpufabric_api::run::NodeVerdict::Passed
            && let Some(blaming) = blamed.get(e.node.as_str())
        {
            e.verdict = gpufabric_api::run::NodeVerdict::Failed;
            e.confirmed = crate::pairs::phase::confirmed_within_run(e, blaming);
        }
        e.findings = evaluation.critical_count(&e.node)
            + blamed.get(e.node.as_str()).map_or(0, |b| b.len() as u32);
        e.finding = worst.get(e.node.as_str()).map(|f| f.message.clone());
    }
}

/// The ended run's status: its findings (as many as fit), counts, nodes, times, phase
/// (Failed when the deadline stopped pods), message and finished conditions.
fn end_status(
    next: &mut FabricTestRunStatus,
    all_findings: &[gpufabric_api::Finding],
    entries: &[NodeRunResult],
    generation: Option<i64>,
    completion: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) {
    let (kept, dropped) = st::findings_for_status(all_findings.to_vec());
    next.finding_count = all_findings.len() as u32;
    next.findings = kept;
    st::set_counts(next, entries);
    next.nodes = st::nodes_for_run_status(entries);
    let started = next
        .start_time
        .clone()
        .unwrap_or_else(|| completion.clone());
    next.duration = Some(st::duration_string(
        (to_chrono(&completion) - to_chrono(&started)).num_seconds(),
    ));
    next.completion_time = Some(completion.clone());
    let stopped = next.progress.as_ref().map_or(0, |p| p.stopped);
    let mut notes = Vec::new();
    if let Some(m) = &next.message {
        notes.push(m.clone());
    }
    let halted = next
        .limits
        .as_ref()
        .filter(|l| l.stopped.is_some())
        .map(|l| l.message.clone());
    if let Some(why) = halted {
        // Cancelled or out of time: the nodes it did not finish are not measured, never
        // failed; the run itself did not do what it was for.
        next.phase = RunPhase::Failed;
        notes.push(format!(
            "{why}: the nodes it had not finished are not measured ({} not measured in all)",
            next.not_measured
        ));
    } else if stopped > 0 {
        next.phase = RunPhase::Failed;
        notes.push(format!(
            "the run deadline passed: {stopped} pods that had not finished were stopped"
        ));
    } else {
        next.phase = RunPhase::Succeeded;
    }
    if dropped > 0 {
        notes.push(format!(
            "{dropped} more findings are not listed (status size limit)"
        ));
    }
    next.message = (!notes.is_empty()).then(|| notes.join("; "));
    crate::signals::set_finished_conditions(next, generation, &completion);
}

/// Keeps the full results of a judged run that are not kept yet, then sets `ResultsKept`
/// (with the nodes whose result could not be kept, also added to the run's message).
pub(super) async fn keep_after_verdict(
    run: &FabricTestRun,
    mut status: FabricTestRunStatus,
    entries: &[NodeRunResult],
    api: &Api<FabricTestRun>,
    ctx: &RunContext,
) -> Result<()> {
    let began = std::time::Instant::now();
    let uid = run.uid().ok_or(Error::Missing("metadata.uid"))?;
    // The batches under way first: what they could not keep is tried again here.
    ctx.keeper.settle(&uid).await;
    let todo = ctx.keeper.claim(&uid, entries, None);
    let note = ctx
        .keeper
        .keep(&ctx.client, &ctx.pod_namespace, run, &uid, todo)
        .await;
    ctx.keeper.forget(&uid);
    if let Some(n) = &note {
        status.message = Some(match status.message.take() {
            Some(m) => format!("{m}; {n}"),
            None => n.clone(),
        });
    }
    crate::signals::set_results_kept(
        &mut status,
        None,
        note.as_deref(),
        run.metadata.generation,
        &now(),
    );
    apply_status(api, &run.name_any(), &status).await?;
    tracing::debug!(took_ms = began.elapsed().as_millis(), "full results kept");
    Ok(())
}

/// Judges the nodes whose pods have ended by their own checks (a copy of their outcomes:
/// the run goes on with them). Not against the baseline: the run's end judges again, with
/// it.
pub(super) fn judge(
    run: &FabricTestRun,
    entries: &[NodeRunResult],
    outcomes: &[PodState],
    ctx: &RunContext,
) -> gpufabric_health::Evaluation {
    let inputs = node_inputs(entries, outcomes.to_vec(), &Judging::of(run), ctx);
    gpufabric_health::evaluate(&inputs, &run.spec.thresholds)
}

/// What the evaluator is given: the nodes whose pods have ended by their own checks.
pub(super) fn node_inputs(
    entries: &[NodeRunResult],
    outcomes: Vec<PodState>,
    judging: &Judging,
    ctx: &RunContext,
) -> Vec<NodeInput> {
    entries
        .iter()
        .zip(outcomes)
        .filter_map(|(e, o)| match o {
            PodState::Ended(outcome) => Some(node_input(ctx, &e.node, outcome, judging)),
            _ => None,
        })
        .collect()
}

/// Metrics, the log line, the Event on the run and, when many nodes were not measured for
/// one reason, the one Event on the test that says so.
async fn announce(
    run: &FabricTestRun,
    next: &FabricTestRunStatus,
    entries: &[NodeRunResult],
    findings: usize,
    ctx: &RunContext,
) {
    let name = run.name_any();
    let (p, f, er, nm) = (next.passed, next.failed, next.errored, next.not_measured);
    ctx.metrics.run_finished(run, next.phase, f + er);
    ctx.metrics.set_run_progress(run, None);
    for n in entries {
        ctx.metrics
            .nodes_tested
            .get_or_create(&VerdictLabels {
                verdict: n.verdict.name().to_string(),
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
        if let Some(t) = &crate::context::Context::test_ref_of(run) {
            ctx.events
                .warning(t, st::CONDITION_INFRASTRUCTURE_DEGRADED, "Finish", note)
                .await;
        }
    }
    publish(ctx, run, bad, reason, "Finish", &summary).await;
    // A slow topology block: a Warning on the run naming the block, never on its nodes.
    for b in next.nccl_nodes.iter().flat_map(|n| &n.slow_blocks) {
        tracing::warn!(key = %b.key, value = %b.value, "slow topology block");
        let reason = crate::nccl_nodes::CONDITION_SLOW_BLOCK;
        publish(ctx, run, true, reason, "Finish", &b.message).await;
    }
}

/// What every node of a run is judged with besides its own result: which trend record it
/// reads, and the NCCL tuning the test's agent env sets.
pub(super) struct Judging {
    trend: TrendKey,
    nccl_tuning: Vec<String>,
    alike: crate::baseline::Alike,
}

impl Judging {
    pub(super) fn of(run: &FabricTestRun) -> Judging {
        let names = run.spec.agent.env.iter().map(|e| &e.name);
        Judging {
            trend: TrendKey::of(run),
            alike: crate::baseline::Alike::of(run),
            nccl_tuning: gpufabric_health::evaluate::tuning::tuning_of(names),
        }
    }
}

/// What the evaluator needs of one node: its outcome, what its labels say it holds, and
/// the records it carries (error counters, its earlier runs of this test).
fn node_input(ctx: &RunContext, name: &str, outcome: NodeOutcome, judging: &Judging) -> NodeInput {
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
        history: node
            .as_deref()
            .map(|n| judging.trend.history(n))
            .unwrap_or_default(),
        nccl_tuning: judging.nccl_tuning.clone(),
        node: name.to_string(),
        product_label,
        expected_gpus,
        outcome,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::to_time;
    use gpufabric_api::run::{NodeVerdict, RunProgress};

    fn node(name: &str, verdict: NodeVerdict) -> NodeRunResult {
        NodeRunResult {
            node: name.into(),
            verdict,
            ..Default::default()
        }
    }

    fn at(secs: i64) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
        to_time(chrono::DateTime::from_timestamp(secs, 0).expect("a time"))
    }

    #[test]
    fn an_ended_run_counts_its_nodes_and_takes_its_time_from_the_start() {
        let mut next = FabricTestRunStatus {
            start_time: Some(at(1_000)),
            message: Some("2 nodes waited for GPUs".into()),
            ..Default::default()
        };
        let entries = [
            node("a", NodeVerdict::Passed),
            node("b", NodeVerdict::Failed),
            node("c", NodeVerdict::NotMeasured),
        ];
        end_status(&mut next, &[], &entries, Some(3), at(1_125));
        assert_eq!(next.phase, RunPhase::Succeeded);
        assert_eq!((next.passed, next.failed, next.not_measured), (1, 1, 1));
        assert_eq!(next.duration.as_deref(), Some("2m5s"));
        assert_eq!(next.completion_time, Some(at(1_125)));
        assert_eq!(next.message.as_deref(), Some("2 nodes waited for GPUs"));
        assert!(!next.conditions.is_empty(), "finished conditions set");
    }

    #[test]
    fn pods_stopped_at_the_deadline_fail_the_run_and_say_so() {
        let mut next = FabricTestRunStatus {
            progress: Some(RunProgress {
                stopped: 2,
                ..Default::default()
            }),
            ..Default::default()
        };
        end_status(&mut next, &[], &[], None, at(10));
        assert_eq!(next.phase, RunPhase::Failed);
        assert_eq!(
            next.message.as_deref(),
            Some("the run deadline passed: 2 pods that had not finished were stopped")
        );
        // No start time: the run took no time rather than failing to end.
        assert_eq!(
            next.duration.as_deref(),
            Some(st::duration_string(0).as_str())
        );
    }
}
