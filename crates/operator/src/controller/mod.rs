//! The two controllers (FabricTest: schedule and history; FabricTestRun: pods and results)
//! and the watches that feed them.

pub mod after_fold;
pub mod backoff;
pub mod decide;
pub mod fabrictest;
#[cfg(test)]
pub(crate) mod fake_api;
#[cfg(test)]
mod fold_order_tests;
#[cfg(test)]
mod reconcile_tests;
pub mod run;

use crate::context::Context;
use crate::error::Error;
use kube::Resource;
use kube::runtime::controller::Action;
use std::sync::Arc;

/// How a failed reconcile is retried: logged and counted every time, reported as a Warning
/// Event when the error is new for the object, and tried again after a per-object backoff
/// (5 s doubling up to 5 min; see [`backoff`]).
pub fn error_policy<K>(
    controller: &'static str,
    ctx: &Arc<Context>,
    error: &Error,
    obj: &Arc<K>,
) -> Action
where
    K: Resource<DynamicType = ()> + Send + Sync + 'static,
{
    let note = error.to_string();
    let retry = ctx
        .backoff
        .failed(&backoff::object_key(obj.as_ref()), &note);
    tracing::warn!(controller, error = %error, retry_in_s = retry.after.as_secs(), "reconcile failed");
    ctx.metrics.reconcile_failed(controller);
    if retry.report {
        let (ctx, reference) = (ctx.clone(), obj.object_ref(&()));
        tokio::spawn(async move {
            ctx.events
                .warning(&reference, "ReconcileError", "Reconcile", note)
                .await;
        });
    }
    Action::requeue(retry.after)
}

/// Marks a reconcile of `obj` as successful, so that its next failure backs off from the
/// start and is reported again.
pub fn succeeded<K>(ctx: &Context, obj: &K)
where
    K: Resource<DynamicType = ()>,
{
    ctx.backoff.succeeded(&backoff::object_key(obj));
}

/// Shared context type of both controllers.
pub type Ctx = Arc<Context>;
