//! Folding each finished run of a FabricTest into its per-node history, once, and what
//! follows each: the nodes observed, [`after_fold::plan`] asked (pure), and
//! its plan carried out (the breaker, the quarantine, the lifecycle, the confirmation
//! run); the node signals and trend points are decided here and written once the test's
//! status is (`super::signals`).

use super::writes::create_run;
use crate::context::Context;
use crate::controller::after_fold::{self, AfterFold, QuarantineDecision};
use crate::error::{Error, Result};
use crate::quarantine;
use crate::signals::pending::Pending;
use crate::status as st;
use gpufabric_api::quarantine::QuarantineRecord;
use gpufabric_api::run::{FabricTestRun, NodeRunResult};
use gpufabric_api::test::{FabricTest, FabricTestStatus};
use kube::api::Api;
use kube::{Resource, ResourceExt};
use std::collections::{BTreeMap, BTreeSet};

/// What folding the newly finished runs left to do once the test's status is written.
#[derive(Debug, Default)]
pub(super) struct Folded {
    /// False when a node change failed (look again soon).
    pub all_applied: bool,
    /// The node signals of each folded run, in fold order (none for a run folded while
    /// the breaker is open).
    pub signals: Vec<Pending>,
}

/// Folds each newly finished run into the per-node history, once, quarantines after it,
/// and decides its node signals, which are written after the status.
pub(super) async fn fold_finished_runs(
    test: &FabricTest,
    runs: &[FabricTestRun],
    status: &mut FabricTestStatus,
    breaker: &mut quarantine::Breaker,
    ctx: &Context,
) -> Result<Folded> {
    let to_fold: Vec<FabricTestRun> = st::runs_to_fold(runs, status.last_run.as_ref())
        .into_iter()
        .cloned()
        .collect();
    let mut folded = Folded {
        all_applied: true,
        signals: Vec::new(),
    };
    for run in &to_fold {
        // Folded in completion order: a run whose results the cache lacks waits, and so do
        // the runs after it.
        let Some(results) = results_of(ctx, run) else {
            tracing::info!(run = %run.name_any(), "waiting for the run's shards in the cache");
            folded.all_applied = false;
            return Ok(folded);
        };
        let began = std::time::Instant::now();
        status.nodes = st::fold_history(&status.nodes, run, &results);
        status.baseline = crate::baseline::after_fold(&status.baseline, run.status.as_ref());
        status.last_run = Some(st::run_summary(run));
        let (applied, signals) =
            quarantine_after(test, run, &results, status, breaker, ctx).await?;
        folded.all_applied &= applied;
        folded.signals.extend(signals);
        tracing::info!(
            run = %run.name_any(),
            nodes = results.len(),
            took_ms = began.elapsed().as_millis(),
            "run folded into the test's history"
        );
    }
    Ok(folded)
}

/// Every node's result of a finished run (see [`crate::shards::finished_results`]).
pub(super) fn results_of(ctx: &Context, run: &FabricTestRun) -> Option<Vec<NodeRunResult>> {
    crate::shards::finished_results(&ctx.shards, &ctx.shard_writes, run)
}

/// What the plan must respect beyond the test: its breaker, and the cluster-wide cap over
/// the cluster's GPU nodes (from the node cache).
fn guards(
    ctx: &Context,
    breaker_open: bool,
    held_by_others: usize,
    dra_gpus: &BTreeMap<String, u32>,
) -> gpufabric_health::Guards {
    let gpu_nodes = ctx
        .nodes
        .state()
        .iter()
        .filter(|n| crate::nodes::gpu_count(n, dra_gpus) > 0)
        .count();
    gpufabric_health::Guards {
        breaker_open,
        cluster_cap: ctx.cluster_cap.map(|c| c.nodes(gpu_nodes)),
        held_by_others,
    }
}

/// Observes the nodes of a folded run, plans what follows it ([`after_fold::plan`], pure)
/// and carries the plan out ([`carry_out_after_fold`]): the quarantine outcome goes into
/// `status`, a storm opens `breaker`. Returns false when some node change failed (the
/// controller looks again soon), and the run's node signals when the plan publishes them.
async fn quarantine_after(
    test: &FabricTest,
    run: &FabricTestRun,
    results: &[NodeRunResult],
    status: &mut FabricTestStatus,
    breaker: &mut quarantine::Breaker,
    ctx: &Context,
) -> Result<(bool, Option<Pending>)> {
    if run.status.is_none() {
        return Ok((true, None));
    }
    let tested: BTreeSet<&str> = st::measured_nodes(results);
    // One test at a time counts what the cluster holds, plans and applies.
    let _cap = ctx.quarantine_lock.lock().await;
    // The cluster's quarantine records, from the node cache with this process's own
    // writes on top (no list of every Node); the executor counts from them too.
    let holdings = quarantine::holdings_cached(
        ctx.nodes.state().iter().map(|n| n.as_ref()),
        &ctx.quarantine_writes,
        test,
    )
    .map_err(Error::Quarantine)?;
    let dra = crate::dra::observe(&ctx.client, test)
        .await
        .map_err(Error::Dra)?;
    let held = &holdings.ours;
    let mut names: Vec<String> = tested.iter().map(|s| s.to_string()).collect();
    names.extend(status.nodes.iter().map(|h| h.node.clone()));
    names.extend(held.keys().cloned());
    names.sort();
    names.dedup();
    let observed = quarantine::observe_cached(&ctx.client, &ctx.nodes, test, &names)
        .await
        .map_err(Error::Quarantine)?;
    // The budget is a share of what the test selects, not of this run: a confirmation run
    // retests only the suspects, and a percent of those would hold real failures back.
    let dra_gpus = dra.gpu_counts();
    let selected = crate::nodes::selected(
        ctx.nodes.state().iter().map(|n| n.as_ref()),
        &test.spec.node_selector,
        test.spec.nodes.as_deref(),
        &dra_gpus,
    );
    let after = after_fold::plan(&after_fold::Folded {
        test,
        run,
        results,
        status,
        observed: &observed,
        selected,
        guards: &guards(ctx, breaker.open, holdings.others, &dra_gpus),
        dra: &dra,
    })?;
    let held = holdings.ours;
    carry_out_after_fold(test, run, results, status, breaker, ctx, after, &dra, held).await
}

/// Carries out what follows a folded run, in the plan's order: the breaker opens on a
/// storm, the quarantine plan is executed and its outcome written into `status` (which the
/// lifecycle then reads), the lifecycle's steps, each node's standing decided
/// ([`st::settle`], which the signals, metrics and status read), and the confirmation run.
/// `held`: the nodes this test holds, as the fold counted them for the plan.
/// The GPUs' device taints are written right after the nodes' quarantine. The signals and
/// trend points, when the plan publishes them, are decided here and returned: they are
/// written after the test's status, so that no quarantine, status or confirmation run waits
/// for a write on every node. Returns false when some node or GPU change failed.
#[allow(clippy::too_many_arguments)]
async fn carry_out_after_fold(
    test: &FabricTest,
    run: &FabricTestRun,
    results: &[NodeRunResult],
    status: &mut FabricTestStatus,
    breaker: &mut quarantine::Breaker,
    ctx: &Context,
    after: AfterFold,
    dra: &crate::dra::DraView,
    held: BTreeMap<String, QuarantineRecord>,
) -> Result<(bool, Option<Pending>)> {
    let AfterFold {
        decision:
            QuarantineDecision {
                plan,
                gpus,
                reasons,
                repaired,
            },
        publish,
        confirm,
    } = after;
    let run_name = run.name_any();
    let began = std::time::Instant::now();
    if let Some(storm) = &plan.storm {
        quarantine::breaker::open_on_storm(breaker, test, &run_name, storm, &ctx.events).await;
    }
    let outcome = quarantine::execute_held(
        &ctx.client,
        &ctx.events,
        &ctx.metrics.quarantine,
        test,
        &run_name,
        &plan,
        &reasons,
        held,
        Some(&ctx.quarantine_writes),
    )
    .await
    .map_err(Error::Quarantine)?;
    outcome.apply_to_status(status);
    let gpu_outcome = crate::dra::carry_out(
        &ctx.client,
        &ctx.events,
        test,
        dra,
        &gpus,
        &run_name,
        &crate::time::now(),
    )
    .await;
    st::apply_gpu_outcome(status, dra.version(), &gpus, &gpu_outcome);
    for e in &gpu_outcome.errors {
        tracing::warn!(error = %e, "GPU quarantine not applied");
    }
    let quarantined_ms = began.elapsed().as_millis();
    let gated = |n: &str| {
        ctx.nodes
            .get(&kube::runtime::reflector::ObjectRef::new(n))
            .is_some_and(|n| crate::lifecycle::targets::is_gated(&n))
    };
    let life = crate::lifecycle::after_run::plan(
        &crate::lifecycle::after_run::AfterRun {
            test,
            run,
            results,
            repaired: &repaired,
            outcome: &outcome,
            breaker_open: breaker.open,
            gated: &gated,
            at: crate::time::now(),
        },
        status,
    );
    let lifecycle_applied = crate::lifecycle::carry_out(test, life, status, ctx).await;
    // Each node's standing, decided once: what the signals, metrics and status read.
    st::settle(
        status,
        results,
        &st::Settle {
            failures_to_quarantine: test.spec.quarantine.failures_to_quarantine,
            confirm: &plan.confirm,
            breaker_open: plan.breaker_open,
            gated: &gated,
        },
    );
    let settled_ms = began.elapsed().as_millis();
    let signals = publish.then(|| decide_signals(test, run, results, status, ctx));
    let decided_ms = began.elapsed().as_millis();
    if let Some(confirm) = confirm {
        create_confirmation(test, &confirm, &plan.confirm, ctx).await?;
    }
    tracing::info!(
        run = %run_name,
        quarantined_ms,
        settled_ms,
        signals_decided_ms = decided_ms - settled_ms,
        took_ms = began.elapsed().as_millis(),
        "after the fold"
    );
    Ok((
        outcome.errors.is_empty() && gpu_outcome.errors.is_empty() && lifecycle_applied,
        signals,
    ))
}

/// Creates the confirmation run that retests `suspects`, with an Event on the test when it
/// is new.
async fn create_confirmation(
    test: &FabricTest,
    confirm: &FabricTestRun,
    suspects: &[String],
    ctx: &Context,
) -> Result<()> {
    let api: Api<FabricTestRun> = Api::all(ctx.client.clone());
    if create_run(ctx, &api, confirm).await? {
        let note = format!(
            "created confirmation run {} to retest {}",
            confirm.name_any(),
            suspects.join(", ")
        );
        ctx.events
            .normal(&test.object_ref(&()), "RunCreated", "Confirm", note)
            .await;
    }
    Ok(())
}

/// The own records (`gpufabric.io/trend`) of the nodes that passed a complete check, with
/// the folded run's numbers added.
fn trend_points(
    run: &FabricTestRun,
    results: &[NodeRunResult],
    ctx: &Context,
) -> Vec<(String, gpufabric_api::trend::NodeTrend)> {
    let at = run
        .status
        .as_ref()
        .and_then(|s| s.completion_time.as_ref())
        .map_or(0, |t| t.0.as_second());
    let key = crate::trend::TrendKey::of(run);
    crate::trend::to_write(results, &key, at, |n| {
        ctx.nodes.get(&kube::runtime::reflector::ObjectRef::new(n))
    })
}

/// The node signals of a folded run (condition, result label, last pass) from every
/// node's result (`results`, all shards) and its standing in `status`, with each passing
/// node's trend record in the same metadata patch; written after the test's status.
fn decide_signals(
    test: &FabricTest,
    run: &FabricTestRun,
    results: &[NodeRunResult],
    status: &FabricTestStatus,
    ctx: &Context,
) -> Pending {
    let trends = trend_points(run, results, ctx);
    let mut signals = crate::signals::decide(test, run, results, &status.nodes, &ctx.nodes);
    let alone = crate::trend::ride_with_signals(&mut signals, trends);
    Pending {
        run: run.name_any(),
        signals,
        trends: alone,
    }
}
