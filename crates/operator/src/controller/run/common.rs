//! What every step of the run controller shares, below all of them: its limits and the
//! `PodsCreated` condition, the run's status write, the shards' API, the run's pods in the
//! cache and the Events a run publishes. It imports no other file of the controller, so
//! the steps import it and each other one way: `create` and `deadline`, then `finish`,
//! `pairs`, `ddp_nodes`, `pass`; `start` beside them; `mod.rs` over all.

use crate::controller::run::context::RunContext;
use crate::error::Result;
use gpufabric_api::keys;
use gpufabric_api::run::{FabricTestRun, FabricTestRunStatus};
use gpufabric_api::shard::FabricTestRunShard;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;

/// Pods created at once.
pub const CREATE_CONCURRENCY: usize = 50;
/// Time a run waits past the pods' own deadline before it stops them.
pub const DEADLINE_MARGIN_SECONDS: i64 = 30;
/// Condition set when every pod of the run exists; the run deadline counts from it.
pub const CONDITION_PODS_CREATED: &str = "PodsCreated";

/// Writes the run's status (server-side apply, as the operator's field manager).
pub(super) async fn apply_status(
    api: &Api<FabricTestRun>,
    name: &str,
    status: &FabricTestRunStatus,
) -> Result<FabricTestRun> {
    let body = json!({
        "apiVersion": gpufabric_api::GROUP.to_string() + "/" + gpufabric_api::VERSION,
        "kind": "FabricTestRun",
        "status": status,
    });
    Ok(api
        .patch_status(
            name,
            &PatchParams::apply(keys::MANAGER).force(),
            &Patch::Apply(&body),
        )
        .await?)
}

/// The shard API (shards are cluster-scoped, like their run).
pub(super) fn shards_api(ctx: &RunContext, _run: &FabricTestRun) -> Api<FabricTestRunShard> {
    Api::all(ctx.client.clone())
}

/// An Event on the run, and the same (prefixed with the run's name) on its test.
pub(super) async fn publish(
    ctx: &RunContext,
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
    if let Some(t) = &crate::context::Context::test_ref_of(run) {
        if warning {
            ctx.events.warning(t, reason, action, test_note).await;
        } else {
            ctx.events.normal(t, reason, action, test_note).await;
        }
    }
}

/// The pods in the cache that the run controls (the operator's namespace, the run as their
/// controller), by name. Anyone who can create pods can copy an owner reference: a pod here
/// is read only when its UID is the one the run recorded (see [`crate::identity`]).
pub(super) fn pods_of(ctx: &RunContext, ns: &str, uid: &str) -> HashMap<String, Arc<Pod>> {
    ctx.pods
        .state()
        .into_iter()
        .filter(|p| p.namespace().as_deref() == Some(ns))
        .filter(|p| crate::identity::controlled_by(&p.metadata, uid))
        .map(|p| (p.name_any(), p))
        .collect()
}
