//! The two controllers (FabricTest: schedule and history; FabricTestRun: pods and results)
//! and the watches that feed them.

pub mod run;
pub mod test;

use crate::context::Context;
use crate::error::Error;
use kube::Resource;
use kube::runtime::controller::Action;
use std::sync::Arc;
use std::time::Duration;

/// How a failed reconcile is retried: logged, counted, reported as a Warning Event on the
/// object, tried again in a few seconds.
pub fn error_policy<K>(
    controller: &'static str,
    ctx: &Arc<Context>,
    error: &Error,
    obj: &Arc<K>,
) -> Action
where
    K: Resource<DynamicType = ()> + Send + Sync + 'static,
{
    tracing::warn!(controller, error = %error, "reconcile failed");
    ctx.metrics.reconcile_failed(controller);
    let (ctx, reference, note) = (ctx.clone(), obj.object_ref(&()), error.to_string());
    tokio::spawn(async move {
        crate::events::warning(&ctx, &reference, "ReconcileError", "Reconcile", note).await;
    });
    Action::requeue(Duration::from_secs(5))
}

/// Shared context type of both controllers.
pub type Ctx = Arc<Context>;
