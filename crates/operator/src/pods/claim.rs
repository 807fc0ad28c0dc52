//! How every benchmark pod (the node check, a node pair's ranks, the multi-node DDP probe's
//! and NCCL sweep's) asks for its node's GPUs: `nvidia.com/gpu` and bound to the node by
//! name, or, on a node whose GPUs are DRA devices, every GPU through a ResourceClaimTemplate
//! of the pod's own, tolerating gpufabric's device taint alone, and the pod placed by the
//! scheduler (which allocates the claim) instead of bound by name ([`benchmark_pod`]).
//!
//! A template, not a ResourceClaim the operator makes: the ResourceClaim controller makes the
//! pod's claim from it under a generated name, owned by the pod, records it in the pod's
//! status (where the scheduler and the kubelet look for it), deallocates it when the pod ends
//! and deletes it with the pod. No claim name exists that anyone could take first, and the
//! GPUs are free again as soon as the pod ends, not when the run is deleted. The template
//! is named after the pod and owned by the run (deleted with it); one at that name that the
//! run does not control is never used ([`template_is_runs`]).

use super::{BuildError, CONTAINER, allocatable_gpus, owner_reference};
use crate::dra::claims::ClaimView;
use gpufabric_api::device_taint::GPU_DRIVER;
use gpufabric_api::keys;
use gpufabric_api::run::FabricTestRun;
use k8s_openapi::api::core::v1::{
    Affinity, Node, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod,
    PodResourceClaim, ResourceClaim as ContainerClaim,
};
use kube::api::DynamicObject;
use serde_json::{Value, json};

/// The DeviceClass of whole GPUs that NVIDIA's DRA driver installs.
pub const GPU_DEVICE_CLASS: &str = GPU_DRIVER;
/// The name of the pod's claim and of its one device request.
pub const CLAIM: &str = "gpus";

/// The device tolerations of the benchmark's request: gpufabric's own GPU taint
/// ([`keys::TAINT_GPU`]), any value and effect, so that a GPU this operator took out of
/// service is still measured and can be released. Nothing else: a GPU another system
/// tainted (NVIDIA's driver for an XID error or a lost GPU, `gpu.nvidia.com/xid`,
/// `gpu.nvidia.com/gpu-lost`, or a person) was taken away by someone who knows more of it
/// than a benchmark does; the pod then does not schedule and the node is not measured,
/// never blamed.
pub fn device_tolerations() -> Value {
    json!([{ "key": keys::TAINT_GPU, "operator": "Exists" }])
}

/// How a benchmark pod asks for its node's GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gpus<'a> {
    /// `nvidia.com/gpu`, as many as the node has allocatable; the pod bound to it by name.
    Extended(u32),
    /// The node's GPUs are `count` devices of the GPU driver, claimed through a
    /// ResourceClaimTemplate in `version` of `resource.k8s.io`.
    Devices { count: u32, version: &'a str },
}

impl<'a> Gpus<'a> {
    /// How the benchmark pods of `node` ask: through a claim where `devices` (None: the
    /// cluster serves no claims) holds the node's GPUs as devices, else `nvidia.com/gpu`.
    pub fn of(devices: Option<&'a ClaimView>, node: &Node) -> Gpus<'a> {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        match devices.and_then(|d| Some((d, d.gpus_of(name)?))) {
            Some((d, count)) => Gpus::Devices {
                count,
                version: &d.templates.version,
            },
            None => Gpus::Extended(allocatable_gpus(node)),
        }
    }

    /// How many GPUs the pod asks for (and the agent expects to see).
    pub fn count(&self) -> u32 {
        match self {
            Gpus::Extended(n) | Gpus::Devices { count: n, .. } => *n,
        }
    }
}

/// A benchmark pod ready to create, and the ResourceClaimTemplate to create before it when
/// the pod claims its GPUs.
#[derive(Debug)]
pub struct BenchmarkPod {
    pub pod: Pod,
    pub template: Option<Value>,
}

/// The benchmark pod of `node`, built by `build` (for the node check, a pair's or a group's
/// rank) for `gpus.count()` GPUs, asking for them as `gpus` says: unchanged for
/// `nvidia.com/gpu`; for devices, with the template named after the pod (its labels, owned
/// by `run`) and the pod asking through it, placed by the scheduler ([`use_template`]).
/// Every kind of benchmark pod is made through here.
pub fn benchmark_pod(
    run: &FabricTestRun,
    node: &str,
    gpus: Gpus<'_>,
    build: impl FnOnce(u32) -> Result<Pod, BuildError>,
) -> Result<BenchmarkPod, BuildError> {
    let mut pod = build(gpus.count())?;
    let Gpus::Devices { count, version } = gpus else {
        return Ok(BenchmarkPod {
            pod,
            template: None,
        });
    };
    let name = pod
        .metadata
        .name
        .clone()
        .ok_or(BuildError::RunNotPersisted)?;
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    let template = template(run, &name, &labels, count, version)?;
    use_template(&mut pod, node, &name);
    Ok(BenchmarkPod {
        pod,
        template: Some(template),
    })
}

/// The ResourceClaimTemplate `name` (the pod's name) for `gpus` GPUs of the pod's node, in
/// `version` of `resource.k8s.io` (`v1beta1` holds the request's fields on the request
/// itself, `v1beta2` and `v1` under `exactly`), owned by `run`.
fn template(
    run: &FabricTestRun,
    name: &str,
    labels: &std::collections::BTreeMap<String, String>,
    gpus: u32,
    version: &str,
) -> Result<Value, BuildError> {
    if gpus == 0 {
        return Err(BuildError::NoGpus(name.to_string()));
    }
    let owner = owner_reference(run)?;
    let exact = json!({
        "deviceClassName": GPU_DEVICE_CLASS,
        "allocationMode": "ExactCount",
        "count": gpus,
        "tolerations": device_tolerations(),
    });
    let request = if version == "v1beta1" {
        let mut r = exact;
        r["name"] = json!(CLAIM);
        r
    } else {
        json!({ "name": CLAIM, "exactly": exact })
    };
    Ok(json!({
        "apiVersion": format!("resource.k8s.io/{version}"),
        "kind": "ResourceClaimTemplate",
        "metadata": { "name": name, "labels": labels, "ownerReferences": [owner] },
        "spec": { "spec": { "devices": { "requests": [request] } } },
    }))
}

/// Makes `pod` (built for `node`) ask for its GPUs through the template `template`: the
/// claim in the pod and its agent container, no `nvidia.com/gpu`, and the node required by
/// affinity rather than `nodeName`, for only the scheduler allocates a claim (a pod bound by
/// name with an unallocated claim never starts). The pod's own tolerations (of the node's
/// taints) stay: the scheduler reads them now.
pub(crate) fn use_template(pod: &mut Pod, node: &str, template: &str) {
    let Some(spec) = pod.spec.as_mut() else {
        return;
    };
    spec.node_name = None;
    let on_node = NodeSelectorTerm {
        match_fields: Some(vec![NodeSelectorRequirement {
            key: "metadata.name".into(),
            operator: "In".into(),
            values: Some(vec![node.to_string()]),
        }]),
        ..Default::default()
    };
    spec.affinity
        .get_or_insert_with(Affinity::default)
        .node_affinity = Some(NodeAffinity {
        required_during_scheduling_ignored_during_execution: Some(NodeSelector {
            node_selector_terms: vec![on_node],
        }),
        ..Default::default()
    });
    spec.resource_claims = Some(vec![PodResourceClaim {
        name: CLAIM.into(),
        resource_claim_template_name: Some(template.to_string()),
        ..Default::default()
    }]);
    for c in spec.containers.iter_mut().filter(|c| c.name == CONTAINER) {
        let resources = c.resources.get_or_insert_with(Default::default);
        for list in [&mut resources.limits, &mut resources.requests]
            .into_iter()
            .flatten()
        {
            list.remove(keys::RESOURCE_GPU);
        }
        resources.claims = Some(vec![ContainerClaim {
            name: CLAIM.into(),
            ..Default::default()
        }]);
    }
}

/// The node a pod built by [`use_template`] is kept to, before the scheduler binds it.
pub fn required_node(pod: &Pod) -> Option<&str> {
    let terms = &pod
        .spec
        .as_ref()?
        .affinity
        .as_ref()?
        .node_affinity
        .as_ref()?
        .required_during_scheduling_ignored_during_execution
        .as_ref()?
        .node_selector_terms;
    match terms.as_slice() {
        [t] => match t.match_fields.as_deref()? {
            [r] if r.key == "metadata.name" && r.operator == "In" => match r.values.as_deref()? {
                [n] => Some(n.as_str()),
                _ => None,
            },
            _ => None,
        },
        _ => None,
    }
}

/// The template found at the name is the one `run` made: its controller is the run, by UID
/// (an operator that made it and stopped before making the pod). Any other is someone
/// else's and never used.
pub fn template_is_runs(found: &DynamicObject, run_uid: &str) -> bool {
    found
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == run_uid && o.kind == "FabricTestRun")
}

#[cfg(test)]
mod tests;
