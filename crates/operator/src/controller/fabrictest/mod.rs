//! The FabricTest controller: validates the spec, starts runs (on schedule, once on
//! creation, or on `gpufabric.io/run-now`) under the concurrency policy, folds each finished
//! run into the per-node history once, hands it to the quarantine executor, writes the
//! status and then the node signals, deletes runs beyond the history limits, and requeues
//! at the next schedule time.

mod fold;
mod signals;
mod writes;

use super::decide::{StartPlan, conditions, decide, invalid_status, validated_schedule};
use crate::context::Context;
use crate::error::{Error, Result};
use crate::events::{self, EventType};
use crate::quarantine;
use crate::runs;
use crate::status as st;
use crate::time::{now, to_time};
use chrono::Utc;
use fold::{fold_finished_runs, results_of};
use gpufabric_api::keys;
use gpufabric_api::run::{FabricTestRun, Trigger};
use gpufabric_api::test::{FabricTest, FabricTestStatus};
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::{Resource, ResourceExt};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use writes::{apply_status, create_run, delete_run, remove_annotations};

pub use super::decide::{CONDITION_DEGRADED, CONDITION_READY};

/// Name of this controller in metrics and logs.
pub const CONTROLLER: &str = "fabrictest";

/// Reconciles one FabricTest.
#[tracing::instrument(skip_all, fields(test = %obj.name_any()))]
pub async fn reconcile(obj: Arc<FabricTest>, ctx: Arc<Context>) -> Result<Action> {
    let _timer = ctx.metrics.reconcile_timer(CONTROLLER);
    let action = reconcile_test(&obj, &ctx).await?;
    super::succeeded(&ctx, obj.as_ref());
    Ok(action)
}

async fn reconcile_test(obj: &Arc<FabricTest>, ctx: &Arc<Context>) -> Result<Action> {
    ctx.caches_ready().await;
    let api: Api<FabricTest> = Api::all(ctx.client.clone());
    // The cache may lag behind our own last status write; folding from a stale status
    // would count a run twice. Read the test itself.
    let Some(test) = api.get_opt(&obj.name_any()).await? else {
        return Ok(Action::await_change());
    };
    let ctx2 = ctx.clone();
    finalizer(&api, keys::FINALIZER, Arc::new(test), |event| async move {
        match event {
            Finalizer::Apply(t) => apply(&t, &ctx2).await,
            Finalizer::Cleanup(t) => cleanup(&t, &ctx2).await,
        }
    })
    .await
    .map_err(Error::from_finalizer)
}

/// The FabricTest is being deleted: release what it quarantined.
async fn cleanup(test: &FabricTest, ctx: &Context) -> Result<Action> {
    let released = release(&ctx.client, &ctx.events, &ctx.metrics.quarantine, test).await?;
    tracing::info!(released = released.len(), "FabricTest deleted");
    Ok(Action::await_change())
}

/// Undoes on every node what `test` made: its quarantines (only the label, cordon and taint
/// each node's record says this operator made; none with `releaseOnDelete: false`), its
/// suspect taints, its GPUs' device taints and the node signals its runs wrote last. The finalizer's work: the
/// controller does it when the test is deleted, and `fabric-operator uninstall` when no
/// operator runs. Returns the nodes released; an error (the finalizer must stay) when a
/// quarantine could not be undone. Signals left behind are logged, not an error.
pub async fn release(
    client: &kube::Client,
    events: &events::Events,
    metrics: &quarantine::QuarantineMetrics,
    test: &FabricTest,
) -> Result<Vec<String>> {
    let released = quarantine::release_all(client, events, metrics, test)
        .await
        .map_err(Error::Quarantine)?;
    // A GPU's device taint always goes with its test: the rule's owner is the test, so the
    // garbage collector would remove it anyway once the test is gone.
    crate::dra::release_all(client, events, test)
        .await
        .map_err(Error::Dra)?;
    if let Ok(key) = quarantine::test_key(test) {
        match crate::signals::release_suspect_taints(client, &key).await {
            Ok(failures) if failures.is_empty() => {}
            Ok(failures) => tracing::warn!(?failures, "suspect taints left on nodes"),
            Err(e) => tracing::warn!(error = %e, "listing nodes for suspect taints"),
        }
    }
    match crate::signals::cleanup::release_all(client, &test.name_any()).await {
        Ok(failures) if failures.is_empty() => {}
        Ok(failures) => tracing::warn!(?failures, "node signals left on nodes"),
        Err(e) => tracing::warn!(error = %e, "listing nodes for their signals"),
    }
    Ok(released)
}

fn is_active(run: &FabricTestRun) -> bool {
    run.meta().deletion_timestamp.is_none()
        && !run.status.as_ref().is_some_and(|s| s.phase.is_finished())
}

/// Reconciles a FabricTest that is not being deleted: validate, fold finished runs into
/// the history (and quarantine after each), decide whether a run starts ([`decide`]), carry
/// that out, write the status, prune old runs, and requeue at the next schedule time.
async fn apply(test: &FabricTest, ctx: &Context) -> Result<Action> {
    let name = test.name_any();
    let api: Api<FabricTest> = Api::all(ctx.client.clone());
    let test_ref = test.object_ref(&());
    let stamp = now();
    let original = test.status.clone().unwrap_or_default();
    // The gauge lives in memory: a restarted operator sets it again from the status.
    if let Ok(key) = quarantine::test_key(test) {
        ctx.metrics
            .quarantine
            .set_quarantined(&key, original.quarantined_count as usize);
    }

    let schedule = match validated_schedule(test) {
        Ok(s) => s,
        Err(why) => {
            let status = invalid_status(test, &original, &why, &stamp);
            if status != original {
                apply_status(&api, &name, &status).await?;
                ctx.events
                    .warning(&test_ref, "InvalidSpec", "Validate", why.to_string())
                    .await;
            }
            return Ok(Action::await_change());
        }
    };

    let runs = runs_of(test, ctx, &original).await?;
    let mut status = original.clone();
    status.observed_generation = test.metadata.generation;
    // Ownership follows the node: what someone else undid is theirs before anything is
    // judged, so that no plan counts or releases it.
    crate::lifecycle::rejoin::forget_rejoined(test, ctx, &mut status).await;
    let handed_back = crate::lifecycle::hand_back(test, ctx, &mut status).await?;
    // Runs are folded with the breaker as it was, before a reset applies.
    let mut breaker = quarantine::Breaker::from_conditions(&original.conditions);
    let folded = fold_finished_runs(test, &runs, &mut status, &mut breaker, ctx).await?;
    let requeue_soon = !folded.all_applied || !handed_back;
    let reset = quarantine::breaker::take_reset(&mut breaker, test, &ctx.events).await;

    let active: Vec<&FabricTestRun> = runs.iter().filter(|r| is_active(r)).collect();
    let decision = decide(test, schedule.as_ref(), &original, &active, Utc::now());
    carry_out(test, ctx, &decision, &active, &mut status).await?;
    crate::lifecycle::gate_new_nodes(test, ctx, &status).await;
    let targets_wait = start_targeted(test, ctx, &active, breaker.open, &mut status).await?;
    status.next_schedule_time = decision.next.map(to_time);
    status.conditions = conditions(test, &original.conditions, &status, &stamp);
    status.conditions.push(breaker.condition(
        &original.conditions,
        test.metadata.generation,
        &stamp,
    ));
    let last_run = status
        .last_run
        .as_ref()
        .and_then(|l| runs.iter().find(|r| r.name_any() == l.name))
        .and_then(|r| Some((r.name_any(), results_of(ctx, r)?)));
    status.conditions.extend(st::infrastructure_condition(
        &original.conditions,
        last_run.as_ref().map(|(n, r)| (n.as_str(), r.as_slice())),
        test.metadata.generation,
        &stamp,
    ));
    let nccl_settings: Vec<String> = test
        .spec
        .agent
        .env
        .iter()
        .filter(|e| e.name.starts_with("NCCL_"))
        .map(|e| e.name.clone())
        .collect();
    status.conditions.extend(st::phases_not_run_condition(
        &original.conditions,
        last_run.as_ref().map(|(n, r)| (n.as_str(), r.as_slice())),
        &nccl_settings,
        test.metadata.generation,
        &stamp,
    ));
    st::bound_test_status(&mut status);
    if status != original {
        apply_status(&api, &name, &status).await?;
        if !folded.signals.is_empty() {
            tracing::info!(
                runs = folded.signals.len(),
                quarantined = status.quarantined_count,
                "test status written after the fold"
            );
        }
    }
    if reset {
        quarantine::breaker::clear_reset(&api, &name).await?;
    }
    // The node signals follow the status: no quarantine, status or confirmation run waits
    // for a write on every node.
    signals::write_after_status(
        test,
        &status,
        original.last_run.as_ref().map(|l| l.name.as_str()),
        folded.signals,
        &runs,
        ctx,
    )
    .await;

    // History limits, after the status holds every folded run.
    prune_history(test, ctx, &runs).await?;

    if requeue_soon {
        return Ok(Action::requeue(Duration::from_secs(10)));
    }
    // A target waiting out its backoff is looked at again when it is due.
    let next = match (decision.next, targets_wait) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    match next {
        Some(next) => {
            let wait = (next - Utc::now()).num_milliseconds().max(0) as u64 + 200;
            Ok(Action::requeue(Duration::from_millis(wait)))
        }
        None => Ok(Action::await_change()),
    }
}

/// The runs of `test`: from the cache, plus its active run when the cache has not seen it
/// yet (the run was just created).
async fn runs_of(
    test: &FabricTest,
    ctx: &Context,
    status: &FabricTestStatus,
) -> Result<Vec<FabricTestRun>> {
    let uid = test.uid().ok_or(Error::Missing("metadata.uid"))?;
    let mut runs: Vec<FabricTestRun> = ctx
        .runs
        .state()
        .iter()
        .filter(|r| r.owner_references().iter().any(|o| o.uid == uid))
        .map(|r| (**r).clone())
        .collect();
    if let Some(active) = &status.active_run
        && !runs.iter().any(|r| &r.name_any() == active)
    {
        let api: Api<FabricTestRun> = Api::all(ctx.client.clone());
        if let Some(r) = api.get_opt(active).await?
            && r.owner_references().iter().any(|o| o.uid == uid)
        {
            runs.push(r);
        }
    }
    Ok(runs)
}

/// Carries out `decision`: its Events, the Replace deletions, the new run, and what the
/// status records of it.
async fn carry_out(
    test: &FabricTest,
    ctx: &Context,
    decision: &StartPlan,
    active: &[&FabricTestRun],
    status: &mut FabricTestStatus,
) -> Result<()> {
    let test_ref = test.object_ref(&());
    let runs_api: Api<FabricTestRun> = Api::all(ctx.client.clone());
    for note in &decision.notes {
        let ev = events::event(
            if note.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            note.reason,
            "Schedule",
            note.message.clone(),
            None,
        );
        ctx.events.publish(&test_ref, ev).await;
    }
    if let Some(t) = decision.already_started {
        status.last_schedule_time = Some(to_time(t));
    }
    let Some(start) = &decision.start else {
        status.active_run = active
            .iter()
            .max_by_key(|r| r.creation_timestamp())
            .map(|r| r.name_any());
        return Ok(());
    };
    // Replace deletes the runs of the schedule and those asked for by hand, never a run
    // that gates, confirms, or tests a repair or a condition.
    let replaced: Vec<&FabricTestRun> = active
        .iter()
        .filter(|r| decision.replace_active && r.spec.trigger.is_replaceable())
        .copied()
        .collect();
    for r in &replaced {
        tracing::info!(run = %r.name_any(), "replacing the active run");
        delete_run(&runs_api, &r.name_any()).await?;
    }
    let run = runs::new_run(
        test,
        &start.name,
        start.trigger,
        start.scheduled.map(to_time),
        test.spec.nodes.clone(),
    )?;
    let created = create_run(ctx, &runs_api, &run).await?;
    // Events after the create, so that the new run follows the deleted one at once.
    for r in &replaced {
        ctx.events
            .normal(
                &test_ref,
                "RunReplaced",
                "Schedule",
                format!(
                    "deleted the active run {} (concurrencyPolicy Replace)",
                    r.name_any()
                ),
            )
            .await;
    }
    if created {
        tracing::info!(run = %start.name, trigger = start.trigger.as_str(), "run created");
        ctx.events
            .normal(
                &test_ref,
                "RunCreated",
                "Schedule",
                format!("created run {} ({})", start.name, start.trigger.as_str()),
            )
            .await;
    }
    if start.trigger == Trigger::Manual {
        remove_annotations(ctx, test, &[keys::ANNOTATION_RUN_NOW]).await?;
    } else if let Some(t) = start.scheduled {
        status.last_schedule_time = Some(to_time(t));
    }
    status.active_run = Some(start.name.clone());
    Ok(())
}

/// Starts a targeted run when nodes wait for one (gated, repaired, a lifted quarantine, a
/// node condition, named by hand on the test) and no targeted run of the test is active,
/// and writes the targets into `status`. A targeted run does not wait for the test's other
/// runs: a node is tested by one run at a time anyway. An attempt counts only once the run
/// exists. Returns when the next target is due (a backoff pending), for the requeue.
async fn start_targeted(
    test: &FabricTest,
    ctx: &Context,
    active: &[&FabricTestRun],
    breaker_open: bool,
    status: &mut FabricTestStatus,
) -> Result<Option<chrono::DateTime<Utc>>> {
    use crate::lifecycle::targets;
    let stamp = now();
    let cached = ctx.nodes.state();
    let nodes = || cached.iter().map(|n| n.as_ref());
    let devices = ctx
        .devices
        .counts_if(targets::needs_devices(test, nodes()), &ctx.client)
        .await;
    targets::note_gates(test, nodes(), &devices, &mut status.nodes, &stamp);
    let wanted = targets::wanted(test, nodes(), &devices, &status.nodes, breaker_open);
    crate::lifecycle::repairs_on_hold(test, ctx, &wanted, &status.targets).await;
    let (mut list, mut due) = targets::schedule(&status.targets, &wanted.now, &stamp);
    list.extend(targets::waiting(&wanted.waiting));
    let by_hand = crate::lifecycle::named_by_hand(test, nodes(), &devices);
    let busy = active.iter().find(|r| r.spec.trigger == Trigger::Targeted);
    let test_ref = test.object_ref(&());
    if let Some(run) = busy {
        if by_hand.is_some() || !due.is_empty() {
            tracing::debug!(run = %run.name_any(), "targets wait for the active targeted run");
        }
        status.targets = list;
        return Ok(None);
    }
    let mut reasons: BTreeMap<String, String> = due
        .iter()
        .filter_map(|n| wanted.now.get(n).map(|w| (n.clone(), w.clone())))
        .collect();
    // One run per condition rise, a bounded number per window: a rise beyond the bound is
    // served without a run (and counted); a node wanted for nothing else is left out.
    let mut dropped = Vec::new();
    for (node, rise) in &wanted.rises {
        if !reasons.contains_key(node) {
            continue;
        }
        let h = crate::lifecycle::entry(status, node);
        if !targets::admit_rise(h, rise, &stamp) {
            dropped.push(node.clone());
            // The rise is served now: what else the node asks for, if anything.
            let still = nodes()
                .find(|n| &n.name_any() == node)
                .and_then(|n| targets::why_now(test, n, Some(h), breaker_open));
            match still {
                Some(why) => {
                    reasons.insert(node.clone(), why);
                }
                None => {
                    reasons.remove(node);
                }
            }
        }
    }
    if !dropped.is_empty() {
        tracing::info!(nodes = ?dropped, "condition rises beyond the bound: no run");
        ctx.events
            .warning(
                &test_ref,
                "ConditionRunsBounded",
                "Lifecycle",
                format!(
                    "no targeted run for the node condition that rose again on {}: {} runs for its conditions in the last {} minutes already (the bound per node); the rise is counted in status (conditionRisesDropped) and the next scheduled run tests the node",
                    dropped.join(", "),
                    gpufabric_api::test::CONDITION_RUNS_PER_WINDOW,
                    gpufabric_api::test::CONDITION_RUN_WINDOW_SECONDS / 60
                ),
            )
            .await;
    }
    if let Some((named, not_selected)) = &by_hand {
        for n in named {
            reasons
                .entry(n.clone())
                .or_insert_with(|| "named by hand on the FabricTest".into());
        }
        if !not_selected.is_empty() {
            ctx.events
                .warning(
                    &test_ref,
                    "TargetNotSelected",
                    "Lifecycle",
                    format!(
                        "not testing {}: the FabricTest does not select them (nodeSelector, nodes, GPUs allocatable)",
                        not_selected.join(", ")
                    ),
                )
                .await;
        }
    }
    if !reasons.is_empty() {
        let nodes: Vec<String> = reasons.keys().cloned().collect();
        let uid = test.uid().ok_or(Error::Missing("metadata.uid"))?;
        let api: Api<FabricTestRun> = Api::all(ctx.client.clone());
        let mut started = None;
        for attempt in 0..TARGETED_NAME_TRIES {
            let name = targeted_name(&test.name_any(), &nodes, Utc::now(), attempt);
            let mut run = runs::new_run(test, &name, Trigger::Targeted, None, Some(nodes.clone()))?;
            run.spec.reasons = reasons.clone();
            if create_run(ctx, &api, &run).await? {
                tracing::info!(run = %name, nodes = ?nodes, "targeted run created");
                ctx.events
                    .normal(
                        &test_ref,
                        "RunCreated",
                        "Lifecycle",
                        format!(
                            "created targeted run {name} for {}",
                            describe(&run.spec.reasons)
                        ),
                    )
                    .await;
                started = Some(name);
                break;
            }
            // The name is taken: by this very run when an earlier status write was lost
            // (it is active and tests the same nodes), else by another run: a fresh name.
            if let Some(r) = api.get_opt(&name).await?
                && r.owner_references().iter().any(|o| o.uid == uid)
                && is_active(&r)
                && r.spec.nodes.as_ref() == Some(&nodes)
            {
                tracing::info!(run = %name, "the targeted run exists already");
                started = Some(name);
                break;
            }
            tracing::info!(run = %name, "a run holds this name: trying a fresh one");
        }
        match started {
            Some(name) => {
                targets::attempted(&mut list, &nodes, &stamp);
                due.clear();
                status.active_run = Some(name);
            }
            None => {
                ctx.events
                    .warning(
                        &test_ref,
                        "RunNotCreated",
                        "Lifecycle",
                        format!(
                            "could not create a targeted run for {}: every name tried is taken; tried again at the next look",
                            describe(&reasons)
                        ),
                    )
                    .await;
            }
        }
    }
    if by_hand.is_some() {
        remove_annotations(
            ctx,
            test,
            &[keys::ANNOTATION_RUN_NODES, keys::ANNOTATION_RUN_SELECTOR],
        )
        .await?;
    }
    let next = list
        .iter()
        .filter_map(|t| t.next_attempt.as_ref())
        .map(crate::time::to_chrono)
        .min();
    status.targets = list;
    Ok(next)
}

/// Names tried for one targeted run before the look gives up until the next.
const TARGETED_NAME_TRIES: u32 = 4;

/// The name of a targeted run of `test` over `nodes` created at `at`: the second and a hash
/// of the nodes, and `attempt` when an earlier name was taken.
fn targeted_name(test: &str, nodes: &[String], at: chrono::DateTime<Utc>, attempt: u32) -> String {
    let hash = crate::names::fnv1a(nodes.join(",").as_bytes()) as u32;
    let suffix = match attempt {
        0 => format!("t{}-{hash:08x}", at.timestamp()),
        n => format!("t{}-{hash:08x}-{n}", at.timestamp()),
    };
    crate::names::run_name(test, &suffix)
}

/// `node (why), ...` for an Event, at most a few nodes.
fn describe(reasons: &BTreeMap<String, String>) -> String {
    const SHOWN: usize = 5;
    let mut parts: Vec<String> = reasons
        .iter()
        .take(SHOWN)
        .map(|(n, why)| format!("{n} ({why})"))
        .collect();
    if reasons.len() > SHOWN {
        parts.push(format!("and {} more", reasons.len() - SHOWN));
    }
    parts.join(", ")
}

/// Deletes finished runs beyond the history limits.
async fn prune_history(test: &FabricTest, ctx: &Context, runs: &[FabricTestRun]) -> Result<()> {
    let api: Api<FabricTestRun> = Api::all(ctx.client.clone());
    let finished: Vec<&FabricTestRun> = runs
        .iter()
        .filter(|r| !is_active(r) && r.meta().deletion_timestamp.is_none())
        // A run whose full results are still being read, or whose error counters are still
        // to be recorded, keeps its pods until they are.
        .filter(|r| {
            !r.status.as_ref().is_some_and(|s| {
                crate::signals::results_pending(s) || crate::signals::counters_pending(s)
            })
        })
        .collect();
    for old in st::runs_to_delete(
        &finished,
        test.spec.successful_runs_history_limit,
        test.spec.failed_runs_history_limit,
    ) {
        tracing::info!(run = %old, "deleting a run beyond the history limit");
        delete_run(&api, &old).await?;
    }
    Ok(())
}
