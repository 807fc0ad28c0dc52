//! A benchmark pod made ready to create, whatever its kind: built for its node's GPUs as
//! [`pods::claim::benchmark_pod`] decides, with the run's pod defaults, and on a node whose
//! GPUs are DRA devices its ResourceClaimTemplate created first (one the run does not
//! control is never used).

use super::context::RunContext;
use super::create::{CreateError, NameTaken, is_transient};
use crate::dra::claims::ClaimView;
use crate::pods::{self, claim::Gpus};
use gpufabric_api::run::FabricTestRun;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::Value;

/// Which nodes' GPUs are DRA devices (None: the cluster serves no claims), from the shared
/// read ([`crate::dra::cache::DeviceCache`]) for the pods made meanwhile; an error is the API
/// server's, and the pods are made by a later pass.
pub(super) async fn devices(ctx: &RunContext) -> Result<Option<ClaimView>, kube::Error> {
    ctx.devices.read(&ctx.client).await.map_err(|e| {
        tracing::warn!(error = %e, "DRA devices not read: benchmark pods made later");
        e
    })
}

/// Each node's GPUs published as DRA devices, by node name (empty where the cluster serves
/// no claims): with [`crate::nodes::gpu_count`], the GPUs a node has whichever way it offers
/// them.
pub(super) async fn device_counts(
    ctx: &RunContext,
) -> Result<std::collections::BTreeMap<String, u32>, kube::Error> {
    Ok(devices(ctx)
        .await?
        .as_ref()
        .map(ClaimView::gpu_counts)
        .unwrap_or_default())
}

/// The benchmark pod of `node`, built by `build` from the GPUs it asks for (see
/// [`Gpus::of`]), with the run's pod defaults; when it claims its GPUs, its
/// ResourceClaimTemplate is created (or found, the run's own) before the pod is returned.
pub(super) async fn prepare(
    run: &FabricTestRun,
    node: &Node,
    devices: Option<&ClaimView>,
    build: impl FnOnce(u32) -> Result<Pod, pods::BuildError>,
    ctx: &RunContext,
    run_uid: &str,
) -> Result<Pod, CreateError> {
    let name = node.metadata.name.as_deref().unwrap_or_default();
    let made = pods::claim::benchmark_pod(run, name, Gpus::of(devices, node), build)
        .map_err(CreateError::Build)?;
    let mut pod = made.pod;
    ctx.resolve_pod_defaults(&mut pod);
    if let (Some(template), Some(devices)) = (made.template, devices) {
        create_template(template, devices, ctx, run_uid).await?;
    }
    Ok(pod)
}

/// Creates the ResourceClaimTemplate `json` of a benchmark pod (see [`pods::claim`]). One
/// already at the name is used only when the run controls it; anyone else's is `NameTaken`,
/// and the pod is not made.
async fn create_template(
    json: Value,
    devices: &ClaimView,
    ctx: &RunContext,
    run_uid: &str,
) -> Result<(), CreateError> {
    let template: DynamicObject = serde_json::from_value(json).map_err(|e| {
        CreateError::Permanent(format!("the ResourceClaimTemplate was not built: {e}"))
    })?;
    let name = template.metadata.name.clone().unwrap_or_default();
    let api: Api<DynamicObject> =
        Api::namespaced_with(ctx.client.clone(), &ctx.pod_namespace, &devices.templates);
    match api.create(&PostParams::default(), &template).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => match api.get_opt(&name).await {
            Ok(Some(found)) if pods::claim::template_is_runs(&found, run_uid) => Ok(()),
            Ok(Some(_)) => Err(CreateError::NameTaken(NameTaken {
                kind: "ResourceClaimTemplate",
                namespace: ctx.pod_namespace.clone(),
                name,
            })),
            // Gone since: made by a later pass.
            Ok(None) => Err(CreateError::Unrecorded),
            Err(e) => Err(CreateError::Transient(e)),
        },
        Err(e) if is_transient(&e) => Err(CreateError::Transient(e)),
        Err(e) => Err(CreateError::Permanent(format!(
            "the benchmark pod's ResourceClaimTemplate could not be created: {e}"
        ))),
    }
}
