//! GPUs as DRA devices in the local control plane: the fixture driver's ResourceSlices, a
//! DeviceTaintRule on one GPU, and the real kube-scheduler deciding which claims fit.

use gpufabric_tests::cluster::Cluster;
use gpufabric_tests::dra;
use k8s_openapi::api::core::v1::{
    Container, Node, NodeCondition, NodeStatus, Pod, PodResourceClaim, PodSpec,
    ResourceClaim as ContainerClaim, ResourceRequirements, ServiceAccount, Toleration,
};
use k8s_openapi::api::resource::v1alpha3::{
    DeviceTaint, DeviceTaintRule, DeviceTaintRuleSpec, DeviceTaintSelector,
};
use k8s_openapi::api::resource::v1beta1::{
    DeviceClaim, DeviceRequest, ResourceClaim, ResourceClaimSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const NODE: &str = "gpu-01";
const NS: &str = "default";
const PRODUCT: &str = "NVIDIA-H100-80GB-HBM3";

async fn register_node(client: &kube::Client) {
    let api: Api<Node> = Api::all(client.clone());
    let node = Node {
        metadata: ObjectMeta {
            name: Some(NODE.into()),
            labels: Some(BTreeMap::from([(
                "kubernetes.io/hostname".to_string(),
                NODE.to_string(),
            )])),
            ..ObjectMeta::default()
        },
        ..Node::default()
    };
    api.create(&PostParams::default(), &node)
        .await
        .expect("node created");
    let capacity = BTreeMap::from([
        ("cpu".to_string(), Quantity("64".into())),
        ("memory".to_string(), Quantity("512Gi".into())),
        ("pods".to_string(), Quantity("110".into())),
    ]);
    let status = NodeStatus {
        allocatable: Some(capacity.clone()),
        capacity: Some(capacity),
        conditions: Some(vec![NodeCondition {
            type_: "Ready".into(),
            status: "True".into(),
            reason: Some("KubeletReady".into()),
            ..NodeCondition::default()
        }]),
        ..NodeStatus::default()
    };
    api.patch_status(
        NODE,
        &PatchParams::default(),
        &Patch::Merge(&serde_json::json!({ "status": status })),
    )
    .await
    .expect("node status set");
}

/// A claim for `count` of the fixture's GPUs and a pod on [`NODE`] that uses it.
async fn claim_and_pod(client: &kube::Client, name: &str, count: i64) {
    let claim = ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            ..ObjectMeta::default()
        },
        spec: ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(vec![DeviceRequest {
                    name: "gpus".into(),
                    device_class_name: Some(dra::DEVICE_CLASS.into()),
                    allocation_mode: Some("ExactCount".into()),
                    count: Some(count),
                    ..DeviceRequest::default()
                }]),
                ..DeviceClaim::default()
            }),
        },
        status: None,
    };
    Api::<ResourceClaim>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &claim)
        .await
        .expect("claim created");
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_selector: Some(BTreeMap::from([(
                "kubernetes.io/hostname".to_string(),
                NODE.to_string(),
            )])),
            automount_service_account_token: Some(false),
            // Registered by hand, the node keeps the taints a new node is given.
            tolerations: Some(vec![Toleration {
                operator: Some("Exists".into()),
                ..Toleration::default()
            }]),
            resource_claims: Some(vec![PodResourceClaim {
                name: "gpus".into(),
                resource_claim_name: Some(name.into()),
                ..PodResourceClaim::default()
            }]),
            containers: vec![Container {
                name: "job".into(),
                image: Some("example.invalid/job:1".into()),
                resources: Some(ResourceRequirements {
                    claims: Some(vec![ContainerClaim {
                        name: "gpus".into(),
                        ..ContainerClaim::default()
                    }]),
                    ..ResourceRequirements::default()
                }),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        status: None,
    };
    Api::<Pod>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &pod)
        .await
        .expect("pod created");
}

/// Where the scheduler put pod `name`: `Ok(devices)` once it is bound (the devices its
/// claim was given), `Err(message)` once the scheduler says it does not fit.
async fn placement(client: &kube::Client, name: &str) -> Result<Vec<String>, String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let end = Instant::now() + Duration::from_secs(60);
    while Instant::now() < end {
        let pod = pods.get(name).await.expect("pod read");
        if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(NODE) {
            let claim = claims.get(name).await.expect("claim read");
            let devices = claim
                .status
                .and_then(|s| s.allocation)
                .and_then(|a| a.devices)
                .and_then(|d| d.results)
                .map(|r| r.into_iter().map(|r| r.device).collect())
                .unwrap_or_default();
            return Ok(devices);
        }
        let unschedulable = pod
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            });
        if let Some(c) = unschedulable {
            return Err(c.message.unwrap_or_default());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("the scheduler decided nothing about pod {name} in 60 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tainted_gpu_keeps_a_claim_for_all_eight_off_its_node_and_lets_seven_schedule() {
    let mut cluster = Cluster::start_with(dra::cluster_options())
        .await
        .expect("control plane with DRA");
    dra::start_scheduler(&mut cluster).expect("kube-scheduler");
    let client = cluster.client();
    register_node(&client).await;
    // Pods need their service account; the controller manager makes it, maybe not yet.
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), NS);
    let account = ServiceAccount {
        metadata: ObjectMeta {
            name: Some("default".into()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    match accounts.create(&PostParams::default(), &account).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("service account: {e}"),
    }
    dra::create_device_class(&client)
        .await
        .expect("device class");
    dra::publish_gpus(&client, NODE, 8, PRODUCT)
        .await
        .expect("slice published");

    let rules: Api<DeviceTaintRule> = Api::all(client.clone());
    let rule = DeviceTaintRule {
        metadata: ObjectMeta {
            name: Some("gpu-01-gpu-3".into()),
            ..ObjectMeta::default()
        },
        spec: DeviceTaintRuleSpec {
            device_selector: Some(DeviceTaintSelector {
                driver: Some(dra::DRIVER.into()),
                pool: Some(NODE.into()),
                device: Some("gpu-3".into()),
                ..DeviceTaintSelector::default()
            }),
            taint: DeviceTaint {
                key: "gpufabric.io/gpu".into(),
                value: Some("straggler".into()),
                effect: "NoSchedule".into(),
                time_added: None,
            },
        },
    };
    rules
        .create(&PostParams::default(), &rule)
        .await
        .expect("DeviceTaintRule created");

    claim_and_pod(&client, "wants-eight", 8).await;
    let eight = placement(&client, "wants-eight").await;
    assert!(
        eight.is_err(),
        "8 GPUs of a node with one tainted GPU must not be allocated: {eight:?}"
    );

    claim_and_pod(&client, "wants-seven", 7).await;
    let seven = placement(&client, "wants-seven")
        .await
        .expect("7 untainted GPUs fit");
    assert_eq!(seven.len(), 7, "{seven:?}");
    assert!(
        !seven.iter().any(|d| d == "gpu-3"),
        "the tainted GPU was allocated: {seven:?}"
    );

    // The rule removed, the one GPU left is allocatable again.
    rules
        .delete("gpu-01-gpu-3", &DeleteParams::default())
        .await
        .expect("rule deleted");
    claim_and_pod(&client, "wants-one", 1).await;
    let one = placement(&client, "wants-one")
        .await
        .expect("the released GPU fits");
    assert_eq!(one, vec!["gpu-3".to_string()]);
}
