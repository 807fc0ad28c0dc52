//! The node-check pod on a node whose GPUs are DRA devices: every GPU asked for through a
//! ResourceClaimTemplate of the pod's own, tolerating gpufabric's device taint alone, and the
//! pod placed by the scheduler (which allocates the claim) instead of bound by name.
//!
//! A template, not a ResourceClaim the operator makes: the ResourceClaim controller makes the
//! pod's claim from it under a generated name, owned by the pod, records it in the pod's
//! status (where the scheduler and the kubelet look for it), deallocates it when the pod ends
//! and deletes it with the pod. No claim name exists that anyone could take first, and the
//! GPUs are free again as soon as the check ends, not when the run is deleted. The template
//! is named after the pod and owned by the run (deleted with it); one at that name that the
//! run does not control is never used ([`template_is_runs`]).

use super::{BuildError, CONTAINER, owner_reference};
use gpufabric_api::device_taint::GPU_DRIVER;
use gpufabric_api::keys;
use gpufabric_api::run::FabricTestRun;
use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, Pod,
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

/// The ResourceClaimTemplate `name` (the pod's name) for `gpus` GPUs of the pod's node, in
/// `version` of `resource.k8s.io` (`v1beta1` holds the request's fields on the request
/// itself, `v1beta2` and `v1` under `exactly`), owned by `run`.
pub fn template(
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

/// Makes `pod` (built by [`super::node_check_pod`] for `node`) ask for its GPUs through the
/// template `template`: the claim in the pod and its container, no `nvidia.com/gpu`, and the
/// node required by affinity rather than `nodeName`, for only the scheduler allocates a
/// claim (a pod bound by name with an unallocated claim never starts).
pub fn use_template(pod: &mut Pod, node: &str, template: &str) {
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
mod tests {
    use super::*;
    use crate::pods::tests::run;

    fn labels() -> std::collections::BTreeMap<String, String> {
        std::collections::BTreeMap::from([("gpufabric.io/run".to_string(), "r".to_string())])
    }

    #[test]
    fn the_template_asks_for_every_gpu_tolerating_only_gpufabrics_taint() {
        let t = template(&run(), "pod-a", &labels(), 8, "v1beta1").expect("template");
        let r = &t["spec"]["spec"]["devices"]["requests"][0];
        assert_eq!(r["name"], CLAIM);
        assert_eq!(r["deviceClassName"], GPU_DEVICE_CLASS);
        assert_eq!(r["allocationMode"], "ExactCount");
        assert_eq!(r["count"], 8);
        assert_eq!(
            r["tolerations"],
            json!([{"key": "gpufabric.io/gpu", "operator": "Exists"}]),
            "exactly one toleration, of our key: no blanket toleration"
        );
        assert_eq!(t["apiVersion"], "resource.k8s.io/v1beta1");

        let v1 = template(&run(), "pod-a", &labels(), 4, "v1").expect("template");
        let e = &v1["spec"]["spec"]["devices"]["requests"][0]["exactly"];
        assert_eq!(e["count"], 4);
        assert_eq!(e["tolerations"], r["tolerations"]);
    }

    #[test]
    fn the_template_is_named_for_its_pod_and_owned_by_the_run() {
        let t = template(&run(), "nightly-1-0a1b-gpu-01", &labels(), 8, "v1").expect("template");
        assert_eq!(t["metadata"]["name"], "nightly-1-0a1b-gpu-01");
        let owner = &t["metadata"]["ownerReferences"][0];
        assert_eq!(owner["uid"], "run-uid");
        assert_eq!(owner["kind"], "FabricTestRun");
        assert_eq!(owner["controller"], true);
        assert_eq!(t["metadata"]["labels"], json!(labels()));
        assert!(matches!(
            template(&run(), "x", &labels(), 0, "v1"),
            Err(BuildError::NoGpus(_))
        ));
    }

    #[test]
    fn a_claiming_pod_is_placed_by_the_scheduler_without_the_extended_resource() {
        let mut pod = crate::pods::node_check_pod(&run(), "gpu-01", 8).expect("pod");
        use_template(&mut pod, "gpu-01", "tmpl");
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(
            spec.node_name, None,
            "the scheduler must allocate the claim"
        );
        assert_eq!(required_node(&pod), Some("gpu-01"));
        let claims = spec.resource_claims.as_ref().expect("pod claims");
        assert_eq!(claims.len(), 1);
        assert_eq!(claims[0].name, CLAIM);
        assert_eq!(
            claims[0].resource_claim_template_name.as_deref(),
            Some("tmpl")
        );
        assert_eq!(claims[0].resource_claim_name, None, "never a claim by name");
        let res = spec.containers[0].resources.as_ref().expect("resources");
        for list in [&res.limits, &res.requests].into_iter().flatten() {
            assert!(!list.contains_key(keys::RESOURCE_GPU), "{list:?}");
        }
        assert_eq!(res.claims.as_ref().map(|c| c[0].name.as_str()), Some(CLAIM));
        // The node's own taints are still tolerated as before (the scheduler reads them now).
        assert!(
            spec.tolerations
                .as_ref()
                .expect("tolerations")
                .iter()
                .any(|t| { t.key.as_deref() == Some("node.kubernetes.io/unschedulable") })
        );
    }

    #[test]
    fn a_template_the_run_does_not_control_is_never_used() {
        let t = template(&run(), "p", &labels(), 8, "v1").expect("template");
        let ours: DynamicObject = serde_json::from_value(t.clone()).expect("object");
        assert!(template_is_runs(&ours, "run-uid"));
        assert!(!template_is_runs(&ours, "another-run"));
        let mut not_controller = t;
        not_controller["metadata"]["ownerReferences"][0]["controller"] = json!(false);
        let squatted: DynamicObject = serde_json::from_value(not_controller).expect("object");
        assert!(!template_is_runs(&squatted, "run-uid"));
    }
}
