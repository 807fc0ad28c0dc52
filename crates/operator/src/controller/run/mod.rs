//! The FabricTestRun controller: freezes the nodes into the run's shards, creates one
//! benchmark pod per node wave by wave (`spec.rollout`) with bounded concurrency, reads each
//! finished pod's result, ends each wave when its pods ended or its deadline passed, and
//! judges the nodes. Per-node results go to the shards (only those that changed are
//! written); the run keeps counts, progress and the worst nodes. Everything it knows is
//! re-read from the API server and its caches, so a restarted operator resumes a run where
//! it was.

use crate::error::Result;
use crate::shards;
use gpufabric_api::run::FabricTestRun;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::{Resource, ResourceExt};
use std::sync::Arc;

mod common;
pub mod context;
mod create;
mod deadline;
mod finish;
mod gpus;
mod group;
mod halt;
pub mod keeper;
mod pairs;
mod pass;
mod record_counters;
mod start;
pub mod throttle;
pub use common::{CONDITION_PODS_CREATED, CREATE_CONCURRENCY, DEADLINE_MARGIN_SECONDS};
pub use context::RunContext;
pub use keeper::Keeper;
use pass::{progress, shards_of};
use start::start;
pub use throttle::{MIN_PASS_INTERVAL, PassThrottle};

/// Name of this controller in metrics and logs.
pub const CONTROLLER: &str = "fabrictestrun";

/// Reconciles one run.
#[tracing::instrument(skip_all, fields(run = %obj.name_any()))]
pub async fn reconcile(obj: Arc<FabricTestRun>, ctx: Arc<RunContext>) -> Result<Action> {
    let finished = obj.status.as_ref().is_some_and(|s| s.phase.is_finished());
    if !finished && let Err(wait) = ctx.passes.begin(&obj.name_any(), std::time::Instant::now()) {
        return Ok(Action::requeue(wait));
    }
    let _timer = ctx.metrics.reconcile_timer(CONTROLLER);
    let action = reconcile_run(&obj, &ctx).await?;
    super::succeeded(&ctx, obj.as_ref());
    Ok(action)
}

async fn reconcile_run(obj: &Arc<FabricTestRun>, ctx: &Arc<RunContext>) -> Result<Action> {
    ctx.caches_ready().await;
    let key = obj.name_any();
    let api: Api<FabricTestRun> = Api::all(ctx.client.clone());
    // The cache may lag behind our own last status write: read the run itself.
    let Some(run) = api.get_opt(&obj.name_any()).await? else {
        ctx.metrics.set_active_pods(&key, 0);
        ctx.passes.forget(&key);
        if let Some(uid) = obj.uid() {
            ctx.shard_writes.forget(&uid);
        }
        return Ok(Action::await_change());
    };
    if run.meta().deletion_timestamp.is_some() {
        ctx.metrics.set_active_pods(&key, 0);
        ctx.passes.forget(&key);
        if let Some(uid) = run.uid() {
            ctx.shard_writes.forget(&uid);
        }
        return Ok(Action::await_change());
    }
    let status = run.status.clone().unwrap_or_default();
    if status.phase.is_finished() {
        ctx.metrics.set_active_pods(&key, 0);
        ctx.passes.forget(&key);
        let counters = crate::signals::counters_pending(&status);
        let results = crate::signals::results_pending(&status);
        if counters || results {
            // Judged before its error counters were recorded or its full results all kept
            // (an operator stopped in between): do it now.
            let mut status = status;
            let entries = shards::results(&shards_of(&run, ctx).await?);
            if counters {
                let records = record_counters::rebuilt(&run, &entries, ctx);
                let failures =
                    record_counters::write_after_fold(&run, records, &entries, ctx).await;
                record_counters::settle(&mut status, failures, run.metadata.generation);
            }
            if results {
                finish::keep_after_verdict(&run, status, &entries, &api, ctx).await?;
            } else {
                common::apply_status(&api, &key, &status).await?;
            }
        }
        return Ok(Action::await_change());
    }
    if status.start_time.is_none() {
        return start(&run, &api, ctx).await;
    }
    progress(&run, status, &api, ctx, &key).await
}
