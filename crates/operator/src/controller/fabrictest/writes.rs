//! The FabricTest controller's own writes, shared by its steps: the test's status, the
//! request annotations it removes once carried out, and the runs it creates and deletes.

use crate::context::Context;
use crate::error::Result;
use crate::metrics::TriggerLabels;
use gpufabric_api::keys;
use gpufabric_api::run::FabricTestRun;
use gpufabric_api::test::{FabricTest, FabricTestStatus};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// Writes the test's status (server-side apply, as the operator's field manager).
pub(super) async fn apply_status(
    api: &Api<FabricTest>,
    name: &str,
    status: &FabricTestStatus,
) -> Result<()> {
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

/// Removes the request annotations `keys` from the test once they are carried out.
pub(super) async fn remove_annotations(
    ctx: &Context,
    test: &FabricTest,
    keys: &[&str],
) -> Result<()> {
    let nulls: serde_json::Map<String, serde_json::Value> = keys
        .iter()
        .map(|k| (k.to_string(), serde_json::Value::Null))
        .collect();
    let patch = json!({"metadata": {"annotations": nulls}});
    let api: Api<FabricTest> = Api::all(ctx.client.clone());
    api.patch(
        &test.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    Ok(())
}

/// Creates `run`; false when it exists already (a retry after a lost status write). Counts
/// it in `gpufabric_runs_started_total{trigger}`.
pub(super) async fn create_run(
    ctx: &Context,
    api: &Api<FabricTestRun>,
    run: &FabricTestRun,
) -> Result<bool> {
    match api.create(&PostParams::default(), run).await {
        Ok(_) => {
            ctx.metrics
                .runs_started
                .get_or_create(&TriggerLabels {
                    trigger: run.spec.trigger.as_str().into(),
                })
                .inc();
            Ok(true)
        }
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

pub(super) async fn delete_run(api: &Api<FabricTestRun>, name: &str) -> Result<()> {
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
