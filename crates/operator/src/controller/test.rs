//! The FabricTest controller: validates the spec, starts runs (on schedule, once on
//! creation, or on `gpufabric.io/run-now`) under the concurrency policy, folds each finished
//! run into the per-node history once, hands it to the quarantine executor, deletes runs
//! beyond the history limits, and requeues at the next schedule time.

use crate::context::Context;
use crate::error::{Error, Result};
use crate::events;
use crate::metrics::TriggerLabels;
use crate::names;
use crate::quarantine;
use crate::schedule::Schedule;
use crate::status as st;
use crate::time::{now, to_chrono, to_time};
use chrono::{DateTime, Utc};
use gpufabric_api::keys;
use gpufabric_api::run::{FabricTestRun, FabricTestRunSpec, Trigger};
use gpufabric_api::test::{FabricTest, FabricTestStatus, NodeHealth};
use gpufabric_api::validate;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::{Resource, ResourceExt};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

/// Name of this controller in metrics and logs.
pub const CONTROLLER: &str = "fabrictest";
/// Condition: the spec is valid and runs are scheduled.
pub const CONDITION_READY: &str = "Ready";
/// Condition: nodes of this test are failing.
pub const CONDITION_DEGRADED: &str = "Degraded";

/// Reconciles one FabricTest.
#[tracing::instrument(skip_all, fields(test = %obj.name_any(), ns = obj.namespace().unwrap_or_default()))]
pub async fn reconcile(obj: Arc<FabricTest>, ctx: Arc<Context>) -> Result<Action> {
    let _timer = ctx.metrics.reconcile_timer(CONTROLLER);
    ctx.caches_ready().await;
    let ns = obj
        .namespace()
        .ok_or(Error::Missing("metadata.namespace"))?;
    let api: Api<FabricTest> = Api::namespaced(ctx.client.clone(), &ns);
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
    .map_err(|e| match e {
        kube::runtime::finalizer::Error::ApplyFailed(e)
        | kube::runtime::finalizer::Error::CleanupFailed(e) => e,
        kube::runtime::finalizer::Error::AddFinalizer(e)
        | kube::runtime::finalizer::Error::RemoveFinalizer(e) => Error::Kube(e),
        other => Error::Quarantine(other.to_string()),
    })
}

/// The FabricTest is being deleted: release what it quarantined.
async fn cleanup(test: &FabricTest, ctx: &Context) -> Result<Action> {
    let released =
        quarantine::release_all(&ctx.client, &ctx.recorder, &ctx.metrics.quarantine, test)
            .await
            .map_err(|e| Error::Quarantine(e.to_string()))?;
    tracing::info!(released = released.len(), "FabricTest deleted");
    Ok(Action::await_change())
}

async fn apply_status(api: &Api<FabricTest>, name: &str, status: &FabricTestStatus) -> Result<()> {
    let body = json!({
        "apiVersion": gpufabric_api::GROUP.to_string() + "/" + gpufabric_api::VERSION,
        "kind": "FabricTest",
        "status": status,
    });
    api.patch_status(
        name,
        &PatchParams::apply(keys::MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(())
}

fn is_active(run: &FabricTestRun) -> bool {
    run.meta().deletion_timestamp.is_none()
        && !run.status.as_ref().is_some_and(|s| s.phase.is_finished())
}

/// A run to start.
struct Start {
    trigger: Trigger,
    name: String,
    scheduled: Option<DateTime<Utc>>,
}

/// The run object for `start`, a frozen copy of the test's spec owned by the test.
fn build_run(test: &FabricTest, start: &Start) -> Result<FabricTestRun> {
    let owner = test
        .controller_owner_ref(&())
        .ok_or(Error::Missing("metadata.uid"))?;
    let spec = &test.spec;
    let mut run = FabricTestRun::new(
        &start.name,
        FabricTestRunSpec {
            test: test.name_any(),
            trigger: start.trigger,
            scheduled_time: start.scheduled.map(to_time),
            node_selector: spec.node_selector.clone(),
            nodes: spec.nodes.clone(),
            suite: spec.suite.clone(),
            thresholds: spec.thresholds.clone(),
            quarantine: spec.quarantine.clone(),
            agent: spec.agent.clone(),
        },
    );
    run.metadata.namespace = test.namespace();
    run.metadata.owner_references = Some(vec![owner]);
    run.metadata.labels = Some(BTreeMap::from([
        (
            keys::LABEL_TEST.to_string(),
            names::label_value(&test.name_any()),
        ),
        (
            keys::LABEL_TRIGGER.to_string(),
            start.trigger.as_str().to_string(),
        ),
    ]));
    Ok(run)
}

/// Reconciles a FabricTest that is not being deleted.
async fn apply(test: &FabricTest, ctx: &Context) -> Result<Action> {
    let ns = test
        .namespace()
        .ok_or(Error::Missing("metadata.namespace"))?;
    let name = test.name_any();
    let uid = test.uid().ok_or(Error::Missing("metadata.uid"))?;
    let api: Api<FabricTest> = Api::namespaced(ctx.client.clone(), &ns);
    let runs_api: Api<FabricTestRun> = Api::namespaced(ctx.client.clone(), &ns);
    let test_ref = test.object_ref(&());
    let generation = test.metadata.generation;
    let now_t = Utc::now();
    let stamp = now();
    let original = test.status.clone().unwrap_or_default();
    // The gauge lives in memory: a restarted operator sets it again from the status.
    if let Ok(key) = quarantine::test_key(test) {
        ctx.metrics
            .quarantine
            .set_quarantined(&key, original.quarantined_count as usize);
    }
    let mut status = original.clone();
    status.observed_generation = generation;

    // 1. Validate.
    let schedule = match validate(&test.spec)
        .map_err(|e| e.to_string())
        .and_then(|_| {
            test.spec
                .schedule
                .as_deref()
                .map(|s| {
                    Schedule::parse(s, test.spec.time_zone.as_deref()).map_err(|e| e.to_string())
                })
                .transpose()
        }) {
        Ok(s) => s,
        Err(message) => {
            let c = st::condition(
                &original.conditions,
                CONDITION_READY,
                false,
                "InvalidSpec",
                message.clone(),
                generation,
                &stamp,
            );
            status.conditions.retain(|c| c.type_ != CONDITION_READY);
            status.conditions.push(c);
            status.next_schedule_time = None;
            if status != original {
                apply_status(&api, &name, &status).await?;
                events::warning(ctx, &test_ref, "InvalidSpec", "Validate", message).await;
            }
            return Ok(Action::await_change());
        }
    };

    // 2. The runs of this test.
    let mut runs: Vec<FabricTestRun> = ctx
        .runs
        .state()
        .iter()
        .filter(|r| r.namespace().as_deref() == Some(ns.as_str()))
        .filter(|r| r.owner_references().iter().any(|o| o.uid == uid))
        .map(|r| (**r).clone())
        .collect();
    // A run this test started may not be in the cache yet.
    if let Some(active) = &original.active_run
        && !runs.iter().any(|r| &r.name_any() == active)
        && let Some(r) = runs_api.get_opt(active).await?
        && r.owner_references().iter().any(|o| o.uid == uid)
    {
        runs.push(r);
    }

    // 3. Fold each newly finished run into the history, once, and quarantine.
    let mut requeue_soon = false;
    let to_fold: Vec<FabricTestRun> = st::runs_to_fold(&runs, original.last_run.as_ref())
        .into_iter()
        .cloned()
        .collect();
    for run in &to_fold {
        status.nodes = st::fold_history(&status.nodes, run);
        status.last_run = Some(st::run_summary(run));
        if !quarantine_after(test, run, &mut status, ctx).await? {
            requeue_soon = true;
        }
        tracing::info!(run = %run.name_any(), "run folded into the test's history");
    }

    // 4. Decide whether to start a run.
    let active: Vec<&FabricTestRun> = runs.iter().filter(|r| is_active(r)).collect();
    let policy = test.spec.concurrency_policy;
    let run_now = test.annotations().get(keys::ANNOTATION_RUN_NOW).is_some();
    let mut start: Option<Start> = None;
    let mut decision = None;
    let mut replace = false;
    if run_now {
        let rv = test.resource_version().unwrap_or_default();
        let candidate = Start {
            trigger: Trigger::Manual,
            name: names::run_name(
                &name,
                &format!("manual-{:08x}", names::fnv1a(rv.as_bytes()) as u32),
            ),
            scheduled: None,
        };
        match policy.admit(!active.is_empty()) {
            None => {
                events::normal(
                    ctx,
                    &test_ref,
                    "RunNowWaiting",
                    "Schedule",
                    format!(
                        "run-now waits for the active run {} (concurrencyPolicy Forbid)",
                        active[0].name_any()
                    ),
                )
                .await;
            }
            Some(stop_active) => {
                replace = stop_active;
                start = Some(candidate);
            }
        }
    } else if let Some(schedule) = &schedule {
        if !test.spec.suspend {
            let created = test
                .metadata
                .creation_timestamp
                .as_ref()
                .map(to_chrono)
                .unwrap_or(now_t);
            let d = schedule.decide(
                original.last_schedule_time.as_ref().map(to_chrono),
                created,
                test.spec.starting_deadline_seconds,
                now_t,
            );
            if d.too_many_missed {
                events::warning(
                    ctx,
                    &test_ref,
                    "TooManyMissedTimes",
                    "Schedule",
                    "more than 100 schedule times were missed; only the latest runs. Set startingDeadlineSeconds to bound this".into(),
                )
                .await;
            }
            if let Some(t) = d.too_late {
                events::warning(
                    ctx,
                    &test_ref,
                    "MissedSchedule",
                    "Schedule",
                    format!("the run due at {t} is past startingDeadlineSeconds and is skipped"),
                )
                .await;
            }
            if let Some(t) = d.due {
                let candidate = Start {
                    trigger: Trigger::Schedule,
                    name: names::run_name(&name, &(t.timestamp() / 60).to_string()),
                    scheduled: Some(t),
                };
                if active.iter().any(|r| r.name_any() == candidate.name) {
                    // Already started (the status write was lost): record it.
                    status.last_schedule_time = Some(to_time(t));
                } else {
                    match policy.admit(!active.is_empty()) {
                        None => {
                            events::normal(
                                ctx,
                                &test_ref,
                                "RunAlreadyActive",
                                "Schedule",
                                format!(
                                    "not starting the run due at {t}: {} is still running (concurrencyPolicy Forbid)",
                                    active[0].name_any()
                                ),
                            )
                            .await;
                        }
                        Some(stop_active) => {
                            replace = stop_active;
                            start = Some(candidate);
                        }
                    }
                }
            }
            decision = Some(d);
        }
    } else if original.last_schedule_time.is_none() && !test.spec.suspend {
        let created = test
            .metadata
            .creation_timestamp
            .as_ref()
            .map(to_chrono)
            .unwrap_or(now_t);
        start = Some(Start {
            trigger: Trigger::Creation,
            name: names::run_name(&name, &(created.timestamp() / 60).to_string()),
            scheduled: Some(created),
        });
    }

    // 5. Start it.
    if let Some(s) = &start {
        if replace {
            for r in &active {
                tracing::info!(run = %r.name_any(), "replacing the active run");
                match runs_api
                    .delete(&r.name_any(), &DeleteParams::background())
                    .await
                {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => return Err(e.into()),
                }
                events::normal(
                    ctx,
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
        }
        let run = build_run(test, s)?;
        let created = match runs_api.create(&PostParams::default(), &run).await {
            Ok(_) => true,
            Err(kube::Error::Api(e)) if e.code == 409 => false,
            Err(e) => return Err(e.into()),
        };
        if created {
            ctx.metrics
                .runs_started
                .get_or_create(&TriggerLabels {
                    trigger: s.trigger.as_str().into(),
                })
                .inc();
            tracing::info!(run = %s.name, trigger = s.trigger.as_str(), "run created");
            events::normal(
                ctx,
                &test_ref,
                "RunCreated",
                "Schedule",
                format!("created run {} ({})", s.name, s.trigger.as_str()),
            )
            .await;
        }
        if s.trigger == Trigger::Manual {
            let patch = json!({"metadata": {"annotations": {keys::ANNOTATION_RUN_NOW: null}}});
            api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
        } else if let Some(t) = s.scheduled {
            status.last_schedule_time = Some(to_time(t));
        }
        status.active_run = Some(s.name.clone());
    } else {
        status.active_run = active
            .iter()
            .max_by_key(|r| r.creation_timestamp())
            .map(|r| r.name_any());
    }

    // 6. Conditions and the next time.
    status.next_schedule_time = decision
        .as_ref()
        .and_then(|d| d.next)
        .filter(|_| !test.spec.suspend)
        .map(to_time);
    let (reason, message) = match (&test.spec.schedule, test.spec.suspend) {
        (_, true) => ("Suspended", "suspended: no new runs start".to_string()),
        (Some(s), false) => ("Scheduled", format!("runs on the schedule {s:?}")),
        (None, false) => (
            "RunsOnce",
            "no schedule: runs once when created, and on gpufabric.io/run-now".to_string(),
        ),
    };
    let ready = st::condition(
        &original.conditions,
        CONDITION_READY,
        true,
        reason,
        message,
        generation,
        &stamp,
    );
    let failing = st::failing_nodes(&status.nodes);
    let degraded = if failing.is_empty() {
        st::condition(
            &original.conditions,
            CONDITION_DEGRADED,
            false,
            "NodesPassing",
            "no node is failing".into(),
            generation,
            &stamp,
        )
    } else {
        st::condition(
            &original.conditions,
            CONDITION_DEGRADED,
            true,
            "NodesFailing",
            format!(
                "{} node(s) failing: {}",
                failing.len(),
                st::name_list(&failing, 10)
            ),
            generation,
            &stamp,
        )
    };
    status.conditions = vec![ready, degraded];
    let last_run = status
        .last_run
        .as_ref()
        .and_then(|l| runs.iter().find(|r| r.name_any() == l.name));
    status.conditions.extend(st::infrastructure_condition(
        &original.conditions,
        last_run,
        generation,
        &stamp,
    ));

    if status != original {
        apply_status(&api, &name, &status).await?;
    }

    // 7. History limits, after the status holds every folded run.
    let finished: Vec<&FabricTestRun> = runs
        .iter()
        .filter(|r| !is_active(r) && r.meta().deletion_timestamp.is_none())
        .collect();
    for old in st::runs_to_delete(
        &finished,
        test.spec.successful_runs_history_limit,
        test.spec.failed_runs_history_limit,
    ) {
        tracing::info!(run = %old, "deleting a run beyond the history limit");
        match runs_api.delete(&old, &DeleteParams::background()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }

    // 8. Look again at the next schedule time.
    if requeue_soon {
        return Ok(Action::requeue(Duration::from_secs(10)));
    }
    match status.next_schedule_time.as_ref().map(to_chrono) {
        Some(next) => {
            let wait = (next - Utc::now()).num_milliseconds().max(0) as u64 + 200;
            Ok(Action::requeue(Duration::from_millis(wait)))
        }
        None => Ok(Action::await_change()),
    }
}

/// Hands a folded run to the quarantine executor and writes its outcome into `status`.
/// Returns false when some node change failed (the controller looks again soon).
async fn quarantine_after(
    test: &FabricTest,
    run: &FabricTestRun,
    status: &mut FabricTestStatus,
    ctx: &Context,
) -> Result<bool> {
    let Some(run_status) = run.status.as_ref() else {
        return Ok(true);
    };
    let run_name = run.name_any();
    // Only nodes the run measured are judged: a node not measured is never a suspect.
    let tested: BTreeSet<&str> = st::measured_nodes(run_status);
    let held = quarantine::quarantined_by(&ctx.client, test)
        .await
        .map_err(|e| Error::Quarantine(e.to_string()))?;
    let mut names: Vec<String> = tested.iter().map(|s| s.to_string()).collect();
    names.extend(status.nodes.iter().map(|h| h.node.clone()));
    names.extend(held.keys().cloned());
    names.sort();
    names.dedup();
    let observed = quarantine::observe(&ctx.client, test, &names)
        .await
        .map_err(|e| Error::Quarantine(e.to_string()))?;
    let history: BTreeMap<&str, &NodeHealth> =
        status.nodes.iter().map(|h| (h.node.as_str(), h)).collect();
    let facts: Vec<_> = observed
        .iter()
        .map(|o| {
            let health = history
                .get(o.node.as_str())
                .map(|h| (*h).clone())
                .unwrap_or_else(|| {
                    gpufabric_health::history::advance(
                        None,
                        &o.node,
                        gpufabric_api::run::NodeVerdict::Pending,
                        None,
                        &run_name,
                    )
                });
            o.facts(health, tested.contains(o.node.as_str()))
        })
        .collect();
    // The budget is a share of what the test selects, not of this run: a confirmation run
    // retests only the suspects, and a percent of those would hold real failures back.
    let selected = crate::nodes::selected_count(
        ctx.nodes.state().iter().map(|n| n.as_ref()),
        &test.spec.node_selector,
        test.spec.nodes.as_deref(),
    );
    let plan = gpufabric_health::plan(
        &facts,
        &test.spec.quarantine,
        selected.max(tested.len()),
        run.spec.trigger,
    );
    let reasons: BTreeMap<String, String> = status
        .nodes
        .iter()
        .filter_map(|h| h.last_finding.clone().map(|f| (h.node.clone(), f)))
        .collect();
    let outcome = quarantine::execute(
        &ctx.client,
        &ctx.recorder,
        &ctx.metrics.quarantine,
        test,
        &run_name,
        &plan,
        &reasons,
    )
    .await
    .map_err(|e| Error::Quarantine(e.to_string()))?;
    outcome.apply_to_status(status);
    if !plan.confirm.is_empty() {
        let confirm = quarantine::confirmation_run(test, &run_name, &plan.confirm)
            .map_err(|e| Error::Quarantine(e.to_string()))?;
        let ns = test.namespace().unwrap_or_default();
        let api: Api<FabricTestRun> = Api::namespaced(ctx.client.clone(), &ns);
        match api.create(&PostParams::default(), &confirm).await {
            Ok(_) => {
                ctx.metrics
                    .runs_started
                    .get_or_create(&TriggerLabels {
                        trigger: Trigger::Confirmation.as_str().into(),
                    })
                    .inc();
                events::normal(
                    ctx,
                    &test.object_ref(&()),
                    "RunCreated",
                    "Confirm",
                    format!(
                        "created confirmation run {} to retest {}",
                        confirm.name_any(),
                        plan.confirm.join(", ")
                    ),
                )
                .await;
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(outcome.errors.is_empty())
}
