//! The device-taint writer: creates and deletes DeviceTaintRules as a GPU plan says, with
//! an Event for each, and deletes all of a test's rules when it goes. It decides nothing.

use super::rules::{self, HeldRule};
use super::{DraError, DraView};
use crate::events::Events;
use gpufabric_api::FabricTest;
use gpufabric_api::device_taint::TaintedGpu;
use gpufabric_health::gpu_quarantine::{GpuPlan, GpuTaint};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams, Preconditions};
use kube::{Client, Resource, ResourceExt};
use std::collections::BTreeMap;

/// What the writer did: the GPUs each node has tainted by the test now, and what failed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuOutcome {
    /// Every node's tainted GPUs after the plan (nodes without any are absent).
    pub tainted: BTreeMap<String, Vec<TaintedGpu>>,
    /// What could not be done, as sentences (the fold is tried again).
    pub errors: Vec<String>,
}

fn node_ref(node: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.into()),
        ..ObjectReference::default()
    }
}

fn tainted_of(h: &HeldRule) -> TaintedGpu {
    TaintedGpu {
        gpu: h.record.gpu,
        device: h.device.to_string(),
        rule: h.name.clone(),
        reason: h.record.reason.clone(),
        since: h.record.since.clone(),
    }
}

/// Deletes `h`, only while it is the rule that was read (its UID); a rule already gone is
/// fine.
async fn delete(api: &Api<DynamicObject>, h: &HeldRule) -> Result<(), kube::Error> {
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(h.uid.clone()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&h.name, &dp).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Carries out `plan` for `test` after run `run`: deletes the rules of the nodes it
/// releases, creates one for each GPU it taints, and publishes an Event on the node and
/// the test for each (and for each node quarantined as a node instead).
pub async fn carry_out(
    client: &Client,
    events: &Events,
    test: &FabricTest,
    view: &DraView,
    plan: &GpuPlan,
    run: &str,
    at: &Time,
) -> GpuOutcome {
    let mut out = GpuOutcome::default();
    let key = test.name_any();
    let test_ref = test.object_ref(&());
    for (node, held) in &view.held {
        if !plan.release.contains(node) {
            out.tainted
                .insert(node.clone(), held.iter().map(tainted_of).collect());
        }
    }
    let Some(ar) = &view.taint_rules else {
        return out;
    };
    let api: Api<DynamicObject> = Api::all_with(client.clone(), ar);
    for node in &plan.release {
        let mut left = Vec::new();
        for h in view.held.get(node).into_iter().flatten() {
            match delete(&api, h).await {
                Ok(()) => {
                    let note = format!(
                        "GPU {} ({}) released by FabricTest {key} after run {run}: DeviceTaintRule {} deleted",
                        h.record.gpu, h.device, h.name
                    );
                    events
                        .normal(&node_ref(node), "GpuReleased", "Release", note.clone())
                        .await;
                    events
                        .normal(&test_ref, "GpuReleased", "Release", note)
                        .await;
                }
                Err(e) => {
                    out.errors
                        .push(format!("deleting DeviceTaintRule {}: {e}", h.name));
                    left.push(tainted_of(h));
                }
            }
        }
        if !left.is_empty() {
            out.tainted.insert(node.clone(), left);
        }
    }
    for (node, why) in &plan.escalated {
        let note = format!("{}: FabricTest {key}, run {run}", why.describe());
        events
            .warning(
                &node_ref(node),
                "GpuQuarantineEscalated",
                "Quarantine",
                note,
            )
            .await;
    }
    let effect = test.spec.quarantine.gpu_taint_effect;
    for t in &plan.taint {
        match create(&api, test, &ar.version, t, effect, run, at).await {
            Ok(name) => {
                let note = format!(
                    "GPU {} ({}) tainted {}={}:{} by FabricTest {key} after run {run} (DeviceTaintRule {name}): {}",
                    t.gpu,
                    t.device,
                    gpufabric_api::keys::TAINT_GPU,
                    t.fault.word,
                    effect.as_str(),
                    t.fault.reason
                );
                events
                    .warning(
                        &node_ref(&t.node),
                        "GpuQuarantined",
                        "Quarantine",
                        note.clone(),
                    )
                    .await;
                events
                    .warning(&test_ref, "GpuQuarantined", "Quarantine", note)
                    .await;
                out.tainted
                    .entry(t.node.clone())
                    .or_default()
                    .push(TaintedGpu {
                        gpu: t.gpu,
                        device: t.device.to_string(),
                        rule: name,
                        reason: t.fault.reason.clone(),
                        since: Some(at.clone()),
                    });
            }
            Err(e) => out.errors.push(format!(
                "tainting GPU {} of {} ({}): {e}",
                t.gpu, t.node, t.device
            )),
        }
    }
    for gpus in out.tainted.values_mut() {
        gpus.sort_by_key(|g| g.gpu);
    }
    out
}

/// Creates the rule of `t`; returns the name the API server gave it.
async fn create(
    api: &Api<DynamicObject>,
    test: &FabricTest,
    version: &str,
    t: &GpuTaint,
    effect: gpufabric_api::device_taint::GpuTaintEffect,
    run: &str,
    at: &Time,
) -> Result<String, String> {
    let rule = rules::rule(test, version, t, effect, run, at)
        .ok_or("the FabricTest has no name or UID")?;
    let obj: DynamicObject = serde_json::from_value(rule).map_err(|e| e.to_string())?;
    let made = api
        .create(&PostParams::default(), &obj)
        .await
        .map_err(|e| e.to_string())?;
    Ok(made.name_any())
}

/// Deletes every DeviceTaintRule `test` holds (the finalizer's and uninstall's work; its
/// owner reference would have the garbage collector do it too, later). Returns the nodes
/// whose GPUs were released.
pub async fn release_all(
    client: &Client,
    events: &Events,
    test: &FabricTest,
) -> Result<Vec<String>, DraError> {
    let Some(ar) = super::discover(client).await?.0 else {
        return Ok(Vec::new());
    };
    let held = super::held_rules(client, &ar, test).await?;
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    for h in held.values().flatten() {
        delete(&api, h).await.map_err(|source| DraError::Delete {
            test: test.name_any(),
            rule: h.name.clone(),
            source,
        })?;
        let note = format!(
            "GPU {} ({}) released: FabricTest {} is deleted (DeviceTaintRule {} deleted)",
            h.record.gpu,
            h.device,
            test.name_any(),
            h.name
        );
        events
            .normal(&node_ref(&h.record.node), "GpuReleased", "Release", note)
            .await;
    }
    Ok(held.into_keys().collect())
}
