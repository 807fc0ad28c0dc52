//! Objects that make the process-kubelet produce the infrastructure failures of a busy
//! cluster: pods holding a node's GPUs, images that cannot be pulled, env from Secrets
//! that do not exist.

use crate::{Result, kube_err, wait};
use gpufabric_api::keys;
use k8s_openapi::api::core::v1::{
    ConfigMapKeySelector, Container, EnvVar, EnvVarSource, Pod, PodSpec, ResourceRequirements,
    SecretKeySelector,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Client;
use kube::api::{Api, PostParams};
use std::collections::BTreeMap;
use std::time::Duration;

/// An image the process-kubelet never pulls: its pods stay Pending in `ErrImagePull` /
/// `ImagePullBackOff`.
pub const MISSING_IMAGE: &str = "registry.invalid/gpufabric/does-not-exist:0.0.0";
/// Label on every pod made by [`gpu_holder_pod`].
pub const LABEL_GPU_HOLDER: &str = "gpufabric-tests/gpu-holder";

/// Name of the holder pod of `node`.
pub fn gpu_holder_name(node: &str) -> String {
    format!("gpu-holder-{node}")
}

/// A pod bound to `node` that requests `gpus` of its `nvidia.com/gpu` and sleeps until it
/// is deleted, as a training job holding the GPUs does. It is not gpufabric's.
pub fn gpu_holder_pod(node: &str, gpus: u32) -> Pod {
    let quantity = BTreeMap::from([(keys::RESOURCE_GPU.to_string(), Quantity(gpus.to_string()))]);
    Pod {
        metadata: ObjectMeta {
            name: Some(gpu_holder_name(node)),
            labels: Some(BTreeMap::from([
                (LABEL_GPU_HOLDER.to_string(), "true".to_string()),
                (
                    "app.kubernetes.io/name".to_string(),
                    "training-job".to_string(),
                ),
            ])),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.to_string()),
            restart_policy: Some("Never".to_string()),
            automount_service_account_token: Some(false),
            termination_grace_period_seconds: Some(1),
            containers: vec![Container {
                name: "train".to_string(),
                image: Some("registry.example/training:1".to_string()),
                command: Some(vec!["sleep".to_string(), "100000".to_string()]),
                resources: Some(ResourceRequirements {
                    requests: Some(quantity.clone()),
                    limits: Some(quantity),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Creates [`gpu_holder_pod`] in `namespace` and waits until it is Running (its GPUs are
/// then held on the node).
pub async fn hold_gpus(client: &Client, namespace: &str, node: &str, gpus: u32) -> Result<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let name = gpu_holder_name(node);
    pods.create(&PostParams::default(), &gpu_holder_pod(node, gpus))
        .await
        .map_err(kube_err(format!("creating {namespace}/{name}")))?;
    let running =
        |p: Option<&Pod>| p.and_then(|p| p.status.as_ref()?.phase.as_deref()) == Some("Running");
    let pod = wait::for_object(&pods, &name, Duration::from_secs(60), running).await?;
    pod.ok_or_else(|| crate::Error::Invalid(format!("{namespace}/{name} disappeared")))
}

/// An env var taken from key `key` of Secret `secret` (not optional): with no such Secret
/// the pod stays Pending in `CreateContainerConfigError`, `secret "<secret>" not found`.
pub fn secret_env(var: &str, secret: &str, key: &str) -> EnvVar {
    EnvVar {
        name: var.to_string(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: secret.to_string(),
                key: key.to_string(),
                optional: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// An env var taken from key `key` of ConfigMap `config_map` (not optional).
pub fn config_map_env(var: &str, config_map: &str, key: &str) -> EnvVar {
    EnvVar {
        name: var.to_string(),
        value_from: Some(EnvVarSource {
            config_map_key_ref: Some(ConfigMapKeySelector {
                name: config_map.to_string(),
                key: key.to_string(),
                optional: None,
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// A pod bound to `node` that runs `sh -c script` once (`restartPolicy: Never`).
pub fn shell_pod(name: &str, node: &str, script: &str) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.to_string()),
            restart_policy: Some("Never".to_string()),
            automount_service_account_token: Some(false),
            containers: vec![Container {
                name: "main".to_string(),
                image: Some("busybox".to_string()),
                command: Some(vec!["sh".to_string(), "-c".to_string(), script.to_string()]),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// The pod's phase (`""` when it has none yet).
pub fn pod_phase(pod: Option<&Pod>) -> &str {
    pod.and_then(|p| p.status.as_ref()?.phase.as_deref())
        .unwrap_or_default()
}

/// Reason and message of the first container's `waiting` state, if it waits.
pub fn waiting(pod: Option<&Pod>) -> Option<(String, String)> {
    let w = pod?
        .status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .waiting
        .clone()?;
    Some((w.reason.unwrap_or_default(), w.message.unwrap_or_default()))
}
