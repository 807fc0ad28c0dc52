//! The two controllers (FabricTest: schedule and history; FabricTestRun: pods and results)
//! and the watches that feed them.

pub mod run;
pub mod test;

use crate::context::Context;
use crate::error::Error;
use kube::runtime::controller::Action;
use std::sync::Arc;
use std::time::Duration;

/// How a failed reconcile is retried: logged, counted, tried again in a few seconds.
pub fn error_policy<K>(controller: &'static str, ctx: &Context, error: &Error, _obj: &K) -> Action {
    tracing::warn!(controller, error = %error, "reconcile failed");
    ctx.metrics.reconcile_failed(controller);
    Action::requeue(Duration::from_secs(5))
}

/// Shared context type of both controllers.
pub type Ctx = Arc<Context>;
