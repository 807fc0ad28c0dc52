//! Every kind of benchmark pod on a node whose GPUs are devices, and on one whose are not.

use super::*;
use crate::pairs::pods::{Rendezvous, pair_pod};
use crate::pairs::rounds::NodePair;
use crate::pods::tests::run;
use gpufabric_health::gpu_quarantine::DeviceRef;
use k8s_openapi::api::core::v1::NodeStatus;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{ApiResource, GroupVersionKind};
use std::collections::BTreeMap;

const NODE: &str = "gpu-01";
const DEVICES: Gpus<'static> = Gpus::Devices {
    count: 8,
    version: "v1",
};

fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([("gpufabric.io/run".to_string(), "r".to_string())])
}

/// A benchmark pod's builder, for a node of so many GPUs.
type Build = Box<dyn Fn(u32) -> Result<Pod, BuildError>>;

/// The four kinds of benchmark pod, each with its builder, all of rank 0 (whose pod runs on
/// [`NODE`]).
fn kinds() -> Vec<(&'static str, Build)> {
    let nodes = vec![NODE.to_string(), "gpu-02".to_string()];
    let pair = NodePair {
        a: NODE.into(),
        b: "gpu-02".into(),
    };
    let (n1, n2) = (nodes.clone(), nodes);
    vec![
        (
            "node-check",
            Box::new(|g| crate::pods::node_check_pod(&run(), NODE, g)),
        ),
        (
            "node-pair",
            Box::new(move |g| {
                pair_pod(
                    &run(),
                    &pair,
                    (0, 0),
                    &Rendezvous::Listen,
                    g,
                    1 << 20,
                    false,
                )
            }),
        ),
        (
            "ddp-nodes",
            Box::new(move |g| crate::ddp_nodes::probe_pod(&run(), &n1, 0, &Rendezvous::Listen, g)),
        ),
        (
            "nccl-nodes",
            Box::new(move |g| {
                crate::nccl_nodes::sweep_pod(&run(), &n2, None, 0, &Rendezvous::Listen, g)
            }),
        ),
    ]
}

#[test]
fn every_kind_of_benchmark_pod_on_a_dra_node_claims_all_its_gpus_placed_by_the_scheduler() {
    for (kind, build) in kinds() {
        let made = benchmark_pod(&run(), NODE, DEVICES, &build).expect(kind);
        let pod = &made.pod;
        let name = pod.metadata.name.clone().expect("a name");
        let spec = pod.spec.as_ref().expect("spec");
        assert_eq!(
            spec.node_name, None,
            "{kind}: the scheduler allocates the claim"
        );
        assert_eq!(required_node(pod), Some(NODE), "{kind}: kept to its node");
        let claims = spec.resource_claims.as_ref().expect("pod claims");
        assert_eq!(claims.len(), 1, "{kind}");
        assert_eq!(claims[0].name, CLAIM);
        assert_eq!(
            claims[0].resource_claim_template_name.as_deref(),
            Some(name.as_str()),
            "{kind}: its own template, named after it"
        );
        assert_eq!(
            claims[0].resource_claim_name, None,
            "{kind}: never a claim by name"
        );
        let res = spec.containers[0].resources.as_ref().expect("resources");
        for list in [&res.limits, &res.requests].into_iter().flatten() {
            assert!(!list.contains_key(keys::RESOURCE_GPU), "{kind}: {list:?}");
        }
        assert_eq!(res.claims.as_ref().map(|c| c[0].name.as_str()), Some(CLAIM));
        let command = spec.containers[0].command.clone().unwrap_or_default();
        assert_eq!(command[1], kind, "{kind}: its own agent command");

        let t = made.template.expect("a template");
        assert_eq!(t["metadata"]["name"], name.as_str());
        assert_eq!(t["metadata"]["ownerReferences"][0]["uid"], "run-uid");
        assert_eq!(t["metadata"]["ownerReferences"][0]["controller"], true);
        assert_eq!(
            t["metadata"]["labels"],
            json!(pod.metadata.labels),
            "{kind}: the pod's labels"
        );
        let exact = &t["spec"]["spec"]["devices"]["requests"][0]["exactly"];
        assert_eq!(exact["count"], 8, "{kind}: every GPU of the node");
        assert_eq!(exact["deviceClassName"], GPU_DEVICE_CLASS);
        assert_eq!(
            exact["tolerations"],
            json!([{"key": "gpufabric.io/gpu", "operator": "Exists"}]),
            "{kind}: gpufabric's GPU taint alone"
        );
    }
}

#[test]
fn every_kind_of_benchmark_pod_on_a_node_without_devices_is_as_it_was() {
    for (kind, build) in kinds() {
        let made = benchmark_pod(&run(), NODE, Gpus::Extended(8), &build).expect(kind);
        assert!(made.template.is_none(), "{kind}: no template");
        assert_eq!(made.pod, build(8).expect(kind), "{kind}: unchanged");
        let spec = made.pod.spec.as_ref().expect("spec");
        assert_eq!(spec.node_name.as_deref(), Some(NODE), "{kind}");
        assert!(
            spec.resource_claims.is_none() && spec.affinity.is_none(),
            "{kind}"
        );
        let limits = spec.containers[0]
            .resources
            .as_ref()
            .and_then(|r| r.limits.clone())
            .unwrap_or_default();
        assert_eq!(limits.get(keys::RESOURCE_GPU), Some(&Quantity("8".into())));
    }
}

#[test]
fn a_node_with_no_gpus_gets_no_benchmark_pod_either_way() {
    for (kind, build) in kinds() {
        for gpus in [
            Gpus::Extended(0),
            Gpus::Devices {
                count: 0,
                version: "v1",
            },
        ] {
            let e = benchmark_pod(&run(), NODE, gpus, &build).expect_err(kind);
            assert!(matches!(e, BuildError::NoGpus(_)), "{kind}: {e:?}");
        }
    }
}

fn node(name: &str, allocatable: u32) -> Node {
    Node {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        status: Some(NodeStatus {
            allocatable: Some(BTreeMap::from([(
                keys::RESOURCE_GPU.to_string(),
                Quantity(allocatable.to_string()),
            )])),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn view() -> ClaimView {
    let api = |kind: &str| {
        ApiResource::from_gvk(&GroupVersionKind::gvk("resource.k8s.io", "v1beta1", kind))
    };
    let gpus = (0..4)
        .map(|i| {
            let d = DeviceRef {
                driver: GPU_DRIVER.into(),
                pool: "dra-01".into(),
                device: format!("gpu-{i}"),
            };
            (i, d)
        })
        .collect();
    ClaimView {
        templates: api("ResourceClaimTemplate"),
        claims: api("ResourceClaim"),
        gpus: BTreeMap::from([("dra-01".to_string(), gpus)]),
    }
}

#[test]
fn a_node_claims_through_devices_only_when_its_gpus_are_devices() {
    let v = view();
    assert_eq!(
        Gpus::of(Some(&v), &node("dra-01", 0)),
        Gpus::Devices {
            count: 4,
            version: "v1beta1"
        },
        "the devices count, not the (absent) extended resource"
    );
    assert_eq!(Gpus::of(Some(&v), &node("plain-01", 8)), Gpus::Extended(8));
    assert_eq!(Gpus::of(None, &node("dra-01", 8)), Gpus::Extended(8));
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
fn a_claiming_pod_keeps_tolerating_the_nodes_own_taints() {
    let made = benchmark_pod(&run(), NODE, DEVICES, |g| {
        crate::pods::node_check_pod(&run(), NODE, g)
    })
    .expect("pod");
    let spec = made.pod.spec.expect("spec");
    // The scheduler reads them now: a cordoned or gated node is still tested.
    assert!(
        spec.tolerations
            .as_ref()
            .expect("tolerations")
            .iter()
            .any(|t| t.key.as_deref() == Some("node.kubernetes.io/unschedulable"))
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
