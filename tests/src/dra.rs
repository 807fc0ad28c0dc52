//! Dynamic Resource Allocation in the local control plane: the feature gates that make
//! kube-apiserver 1.33 serve ResourceSlices, ResourceClaims and DeviceTaintRules, the real
//! kube-scheduler allocating claims, and a fixture driver that publishes a node's GPUs as
//! devices.
//!
//! Kubernetes 1.33 has DRA as beta (off by default) and device taints as alpha
//! (`DRADeviceTaints`, `resource.k8s.io/v1alpha3` DeviceTaintRule): the control plane keeps
//! its version (the one every other test runs) and turns both gates on here, in the API
//! server and the scheduler alike. The fixture driver stands in for NVIDIA's DRA driver: one
//! ResourceSlice per node, pool named after the node, devices `gpu-0` .. `gpu-N-1` with the
//! attributes that driver publishes (`index`, `uuid`, `productName`).

use crate::cluster::{Cluster, ClusterOptions};
use crate::{Error, Result};
use k8s_openapi::api::core::v1::{
    Affinity, Container, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    Pod, PodResourceClaim, PodSpec, ResourceClaim as ContainerClaim, ResourceRequirements,
    ServiceAccount, Toleration,
};
use k8s_openapi::api::resource::v1beta1::{
    BasicDevice, CELDeviceSelector, Device, DeviceAttribute, DeviceClaim, DeviceClass,
    DeviceClassSpec, DeviceRequest, DeviceSelector, ResourceClaim, ResourceClaimSpec, ResourcePool,
    ResourceSlice, ResourceSliceSpec,
};
use kube::api::{Api, ObjectMeta, PostParams};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The driver name the fixture publishes under (NVIDIA's DRA driver's).
pub const DRIVER: &str = "gpu.nvidia.com";

/// The DeviceClass that selects the fixture's GPUs.
pub const DEVICE_CLASS: &str = "gpu.nvidia.com";

/// The gates DRA and device taints need on Kubernetes 1.33, for every component that reads
/// them.
pub const FEATURE_GATES: &str =
    "--feature-gates=DynamicResourceAllocation=true,DRADeviceTaints=true";

/// Cluster options with DRA and device taints served: the gates and the API versions
/// (`v1beta1` for slices, claims and classes; `v1alpha3` for DeviceTaintRule). The
/// controller manager waits long before it calls a node without a kubelet unreachable, so
/// that nodes registered by hand stay schedulable through a test.
pub fn cluster_options() -> ClusterOptions {
    ClusterOptions {
        apiserver_args: vec![
            FEATURE_GATES.into(),
            "--runtime-config=resource.k8s.io/v1beta1=true,resource.k8s.io/v1alpha3=true".into(),
        ],
        controller_manager_args: vec![
            FEATURE_GATES.into(),
            "--node-monitor-grace-period=10m".into(),
        ],
        ..ClusterOptions::default()
    }
}

/// Starts the real kube-scheduler (from `$GPUFABRIC_NODE_BIN`) against `cluster` with the
/// DRA gates on, so that pods with ResourceClaims are placed and their claims allocated.
pub fn start_scheduler(cluster: &mut Cluster) -> Result<()> {
    let bin = crate::realnode::bin_dir()?.join("kube-scheduler");
    cluster.start_extra("kube-scheduler", &bin, &scheduler_args(cluster))
}

fn scheduler_args(cluster: &Cluster) -> Vec<String> {
    let k = cluster.kubeconfig_path().display().to_string();
    vec![
        format!("--kubeconfig={k}"),
        format!("--authentication-kubeconfig={k}"),
        format!("--authorization-kubeconfig={k}"),
        FEATURE_GATES.into(),
        "--leader-elect=false".into(),
        "--secure-port=0".into(),
        "--v=1".into(),
    ]
}

/// Creates the DeviceClass that selects every device of [`DRIVER`].
pub async fn create_device_class(client: &kube::Client) -> Result<()> {
    let class = DeviceClass {
        metadata: ObjectMeta {
            name: Some(DEVICE_CLASS.into()),
            ..ObjectMeta::default()
        },
        spec: DeviceClassSpec {
            selectors: Some(vec![DeviceSelector {
                cel: Some(CELDeviceSelector {
                    expression: format!("device.driver == '{DRIVER}'"),
                }),
            }]),
            ..DeviceClassSpec::default()
        },
    };
    Api::<DeviceClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await
        .map_err(|e| Error::Invalid(format!("creating DeviceClass {DEVICE_CLASS}: {e}")))?;
    Ok(())
}

/// The ResourceSlice the fixture driver publishes for `node`: `gpus` devices `gpu-0` ..,
/// one pool named after the node.
pub fn slice(node: &str, gpus: u32, product: &str) -> ResourceSlice {
    let devices = (0..gpus)
        .map(|i| {
            let attributes = BTreeMap::from([
                (
                    "index".to_string(),
                    DeviceAttribute {
                        int: Some(i64::from(i)),
                        ..DeviceAttribute::default()
                    },
                ),
                (
                    "uuid".to_string(),
                    DeviceAttribute {
                        string: Some(format!("GPU-{node}-{i}")),
                        ..DeviceAttribute::default()
                    },
                ),
                (
                    "productName".to_string(),
                    DeviceAttribute {
                        string: Some(product.to_string()),
                        ..DeviceAttribute::default()
                    },
                ),
            ]);
            Device {
                name: format!("gpu-{i}"),
                basic: Some(BasicDevice {
                    attributes: Some(attributes),
                    ..BasicDevice::default()
                }),
            }
        })
        .collect();
    ResourceSlice {
        metadata: ObjectMeta {
            name: Some(format!("{node}-{}", DRIVER.replace('.', "-"))),
            ..ObjectMeta::default()
        },
        spec: ResourceSliceSpec {
            driver: DRIVER.into(),
            node_name: Some(node.into()),
            pool: ResourcePool {
                name: node.into(),
                generation: 0,
                resource_slice_count: 1,
            },
            devices: Some(devices),
            ..ResourceSliceSpec::default()
        },
    }
}

/// Publishes `node`'s GPUs as [`slice`] does.
pub async fn publish_gpus(
    client: &kube::Client,
    node: &str,
    gpus: u32,
    product: &str,
) -> Result<()> {
    Api::<ResourceSlice>::all(client.clone())
        .create(&PostParams::default(), &slice(node, gpus, product))
        .await
        .map_err(|e| Error::Invalid(format!("publishing the GPUs of {node}: {e}")))?;
    Ok(())
}

/// Creates the `default` service account of `ns` that pods need, unless the controller
/// manager made it first.
pub async fn service_account(client: &kube::Client, ns: &str) -> Result<()> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let account = ServiceAccount {
        metadata: ObjectMeta {
            name: Some("default".into()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    match accounts.create(&PostParams::default(), &account).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(Error::Invalid(format!("service account of {ns}: {e}"))),
    }
}

/// A ResourceClaim `name` in `ns` for `count` of the fixture's GPUs, and a pod that uses it,
/// kept to `node` by node affinity (the scheduler still decides whether the claim fits).
pub async fn claim_and_pod(
    client: &kube::Client,
    ns: &str,
    node: &str,
    name: &str,
    count: i64,
) -> Result<()> {
    let claim = ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..ObjectMeta::default()
        },
        spec: ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(vec![DeviceRequest {
                    name: "gpus".into(),
                    device_class_name: Some(DEVICE_CLASS.into()),
                    allocation_mode: Some("ExactCount".into()),
                    count: Some(count),
                    ..DeviceRequest::default()
                }]),
                ..DeviceClaim::default()
            }),
        },
        status: None,
    };
    Api::<ResourceClaim>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &claim)
        .await
        .map_err(|e| Error::Invalid(format!("creating claim {name}: {e}")))?;
    let on_node = NodeSelectorTerm {
        match_fields: Some(vec![NodeSelectorRequirement {
            key: "metadata.name".into(),
            operator: "In".into(),
            values: Some(vec![node.into()]),
        }]),
        ..NodeSelectorTerm::default()
    };
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            affinity: Some(Affinity {
                node_affinity: Some(NodeAffinity {
                    required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                        node_selector_terms: vec![on_node],
                    }),
                    ..NodeAffinity::default()
                }),
                ..Affinity::default()
            }),
            automount_service_account_token: Some(false),
            // Nodes registered by hand keep the taints a new node is given.
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
                // Under the process-kubelet, a job that runs until the test ends: its claim
                // stays allocated while the test reads it.
                command: Some(vec!["sleep".into(), "600".into()]),
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
    Api::<Pod>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .map_err(|e| Error::Invalid(format!("creating pod {name}: {e}")))?;
    Ok(())
}

/// Where the scheduler put pod `name` of `ns`: `Ok(devices)` once it is bound to `node`
/// (the devices its claim was given), `Err(message)` once the scheduler says it does not
/// fit. Panics after 60 s without a decision.
pub async fn placement(
    client: &kube::Client,
    ns: &str,
    node: &str,
    name: &str,
) -> std::result::Result<Vec<String>, String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), ns);
    let end = Instant::now() + Duration::from_secs(60);
    while Instant::now() < end {
        let pod = pods.get(name).await.expect("pod read");
        if pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node) {
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
