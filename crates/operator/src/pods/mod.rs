//! The benchmark pod of one node in a run, built without a client: pinned to the node,
//! every GPU requested, no API credentials, a deadline, and the result in the termination
//! message.

pub mod claim;

use crate::names;
use gpufabric_api::keys;
use gpufabric_api::run::FabricTestRun;
use gpufabric_api::test::{AgentSpec, PullPolicy};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource, ObjectFieldSelector, Pod,
    PodSecurityContext, PodSpec, ResourceRequirements, SeccompProfile, SecurityContext, Toleration,
    Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;
use std::collections::BTreeMap;

/// Value of the `gpufabric.io/role` label on node-check pods.
pub const ROLE_NODE_CHECK: &str = "node-check";
/// Name of the agent container.
pub const CONTAINER: &str = "agent";
/// Where the agent writes the compact result (the kubelet's default path).
pub const TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";
/// Size of the memory-backed `/dev/shm` of the agent: NCCL keeps its shared-memory transport
/// and proxy buffers there, and a container runtime's default of 64 MiB is too small for
/// eight GPUs (NCCL's docs ask for `--shm-size=1g` under Docker).
pub const SHM_SIZE: &str = "1Gi";
const SHM_VOLUME: &str = "dshm";
/// A writable `/tmp` under a read-only root filesystem (NCCL's debug files, CUDA's caches).
const TMP_VOLUME: &str = "tmp";
const TMP_SIZE: &str = "256Mi";

/// Why a pod could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("run has no name or uid yet; it must be read from the API server")]
    RunNotPersisted,
    #[error("node {0} has no allocatable nvidia.com/gpu")]
    NoGpus(String),
}

/// The owner reference that makes a run the controller of its pods (the garbage collector
/// deletes them with the run).
pub fn owner_reference(run: &FabricTestRun) -> Result<OwnerReference, BuildError> {
    run.controller_owner_ref(&())
        .ok_or(BuildError::RunNotPersisted)
}

/// What the names of `run`'s pods and Secret start with ([`names::run_base`]).
pub fn run_base(run: &FabricTestRun) -> Result<String, BuildError> {
    let name = run
        .meta()
        .name
        .as_deref()
        .ok_or(BuildError::RunNotPersisted)?;
    let uid = run
        .meta()
        .uid
        .as_deref()
        .ok_or(BuildError::RunNotPersisted)?;
    Ok(names::run_base(name, uid))
}

/// The node-check pod for `node`, which has `gpus` allocatable GPUs.
pub fn node_check_pod(run: &FabricTestRun, node: &str, gpus: u32) -> Result<Pod, BuildError> {
    if gpus == 0 {
        return Err(BuildError::NoGpus(node.to_string()));
    }
    let run_name = run.meta().name.clone().ok_or(BuildError::RunNotPersisted)?;
    let owner = owner_reference(run)?;
    let spec = &run.spec;
    let agent = &spec.agent;

    let labels = pod_labels(&spec.test, &run_name, node);
    let env = agent_env(agent, &run_name, &spec.suite);
    let resources = gpu_resources(agent, gpus);

    let tolerations = tolerations(agent);

    let pull_policy = match agent.image_pull_policy {
        PullPolicy::Always => "Always",
        PullPolicy::IfNotPresent => "IfNotPresent",
        PullPolicy::Never => "Never",
    };

    Ok(Pod {
        metadata: ObjectMeta {
            name: Some(names::pod_name(&run_base(run)?, node)),
            // Created through the API of the operator's pod namespace (`--pod-namespace`):
            // the run is cluster-scoped, so it has no namespace to give.
            namespace: None,
            labels: Some(labels),
            // The spec's, e.g. Multus's networks: the pod's network attachments are the
            // test's to choose.
            annotations: (!agent.pod_annotations.is_empty()).then(|| agent.pod_annotations.clone()),
            owner_references: Some(vec![owner]),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.to_string()),
            restart_policy: Some("Never".into()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            active_deadline_seconds: Some(i64::from(agent.timeout_seconds)),
            host_network: agent.host_network.then_some(true),
            dns_policy: agent
                .host_network
                .then(|| "ClusterFirstWithHostNet".to_string()),
            tolerations: Some(tolerations),
            termination_grace_period_seconds: Some(10),
            image_pull_secrets: (!agent.image_pull_secrets.is_empty())
                .then(|| agent.image_pull_secrets.clone()),
            runtime_class_name: agent.runtime_class_name.clone(),
            priority_class_name: agent.priority_class_name.clone(),
            security_context: Some(PodSecurityContext {
                seccomp_profile: Some(runtime_default_seccomp()),
                ..Default::default()
            }),
            containers: vec![Container {
                name: CONTAINER.into(),
                image: Some(agent.image.clone()),
                image_pull_policy: Some(pull_policy.into()),
                command: Some(agent_command(gpus, agent.timeout_seconds)),
                env: Some(env),
                resources: Some(resources),
                termination_message_path: Some(TERMINATION_MESSAGE_PATH.into()),
                termination_message_policy: Some("File".into()),
                volume_mounts: Some(vec![
                    VolumeMount {
                        name: SHM_VOLUME.into(),
                        mount_path: "/dev/shm".into(),
                        ..Default::default()
                    },
                    VolumeMount {
                        name: TMP_VOLUME.into(),
                        mount_path: "/tmp".into(),
                        ..Default::default()
                    },
                ]),
                security_context: Some(container_security(agent)),
                ..Default::default()
            }],
            volumes: Some(vec![
                memory_dir(
                    SHM_VOLUME,
                    agent
                        .shm_size
                        .clone()
                        .unwrap_or_else(|| Quantity(SHM_SIZE.into())),
                ),
                memory_dir(TMP_VOLUME, Quantity(TMP_SIZE.into())),
            ]),
            ..Default::default()
        }),
        status: None,
    })
}

/// A memory-backed emptyDir of at most `size`.
fn memory_dir(name: &str, size: Quantity) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: Some("Memory".into()),
            size_limit: Some(size),
        }),
        ..Default::default()
    }
}

fn runtime_default_seccomp() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".into(),
        ..Default::default()
    }
}

/// The agent container's security context, as tight as the agent spec allows: no
/// privilege escalation, every capability dropped, the runtime's seccomp profile, a
/// read-only root filesystem and a non-root user (the image's, 65532), so that a namespace
/// enforcing Pod Security `restricted` admits the pod. With `ipcLock` the agent runs as
/// root with `IPC_LOCK` alone: a capability is effective only for root when the runtime
/// gives no ambient capabilities (Kubernetes gives none), and RDMA's pinned memory needs
/// it; such a pod needs the `privileged` Pod Security level, as `hostNetwork` does.
pub fn container_security(agent: &AgentSpec) -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: (!agent.ipc_lock).then_some(true),
        run_as_user: agent.ipc_lock.then_some(0),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: agent.ipc_lock.then(|| vec!["IPC_LOCK".into()]),
        }),
        seccomp_profile: Some(runtime_default_seccomp()),
        ..Default::default()
    }
}

/// The labels of a benchmark pod: its test, run, node and role.
pub(crate) fn pod_labels(test: &str, run_name: &str, node: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (keys::LABEL_TEST.to_string(), names::label_value(test)),
        (keys::LABEL_RUN.to_string(), names::label_value(run_name)),
        (keys::LABEL_NODE.to_string(), names::label_value(node)),
        (keys::LABEL_ROLE.to_string(), ROLE_NODE_CHECK.to_string()),
        (
            "app.kubernetes.io/name".to_string(),
            "fabric-agent".to_string(),
        ),
        (
            "app.kubernetes.io/managed-by".to_string(),
            keys::MANAGER.to_string(),
        ),
    ])
}

/// The agent's environment: the user's, then ours (the node, the run, the suite and the
/// names of the NCCL variables the user's set), which replace user entries of the same name.
fn agent_env(agent: &AgentSpec, run_name: &str, suite: &gpufabric_api::Suite) -> Vec<EnvVar> {
    let mut env: Vec<EnvVar> = agent.env.clone();
    // Ours come last and replace user entries of the same name.
    let ours = [
        keys::ENV_NODE_NAME,
        keys::ENV_RUN,
        keys::ENV_SUITE,
        keys::ENV_SPEC_ENV,
    ];
    env.retain(|e| !ours.contains(&e.name.as_str()));
    let spec_env = spec_env_names(&env);
    env.push(EnvVar {
        name: keys::ENV_NODE_NAME.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: "spec.nodeName".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    env.push(EnvVar {
        name: keys::ENV_RUN.into(),
        value: Some(run_name.to_string()),
        ..Default::default()
    });
    env.push(EnvVar {
        name: keys::ENV_SUITE.into(),
        // Serialising the plain suite struct cannot fail.
        value: Some(serde_json::to_string(suite).unwrap_or_default()),
        ..Default::default()
    });
    env.push(EnvVar {
        name: keys::ENV_SPEC_ENV.into(),
        value: Some(spec_env),
        ..Default::default()
    });

    env
}

/// The names of the NCCL variables among `env` (the spec's agent env), sorted and
/// comma-separated: the settings the agent counts as the test's own ([`keys::ENV_SPEC_ENV`]).
fn spec_env_names(env: &[EnvVar]) -> String {
    let mut names: Vec<&str> = env
        .iter()
        .map(|e| e.name.as_str())
        .filter(|n| n.starts_with("NCCL_"))
        .collect();
    names.sort_unstable();
    names.dedup();
    names.join(",")
}

/// The container's resources: the user's, with all `gpus` of the node as request and limit.
fn gpu_resources(agent: &AgentSpec, gpus: u32) -> ResourceRequirements {
    let mut resources: ResourceRequirements = agent.resources.clone().unwrap_or_default();
    let gpu = Quantity(gpus.to_string());
    resources
        .limits
        .get_or_insert_with(BTreeMap::new)
        .insert(keys::RESOURCE_GPU.into(), gpu.clone());
    resources
        .requests
        .get_or_insert_with(BTreeMap::new)
        .insert(keys::RESOURCE_GPU.into(), gpu);
    resources
}

/// The agent command line: `fabric-agent node-check` with the GPU count the node must show
/// and a per-phase watchdog of three quarters of the pod deadline, so that a hung phase is
/// reported by the agent (with the other phases' results) before the pod is killed. The
/// suite travels only in [`keys::ENV_SUITE`].
pub fn agent_command(gpus: u32, timeout_seconds: u32) -> Vec<String> {
    vec![
        "fabric-agent".into(),
        "node-check".into(),
        "--expect-gpus".into(),
        gpus.to_string(),
        "--phase-timeout".into(),
        (u64::from(timeout_seconds) * 3 / 4).max(5).to_string(),
    ]
}

/// The benchmark pod's tolerations: our quarantine taint, the validation gate (a gated node
/// takes no work until it is tested), the cordon (a node we quarantined is still tested),
/// and the user's.
pub fn tolerations(agent: &AgentSpec) -> Vec<Toleration> {
    let mut tolerations = vec![
        Toleration {
            key: Some(keys::TAINT_QUARANTINED.into()),
            operator: Some("Exists".into()),
            ..Default::default()
        },
        Toleration {
            key: Some(keys::TAINT_VALIDATION.into()),
            operator: Some("Exists".into()),
            ..Default::default()
        },
        // A quarantined node may be cordoned by this operator and is still tested.
        Toleration {
            key: Some("node.kubernetes.io/unschedulable".into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        },
    ];
    tolerations.extend(agent.tolerations.iter().cloned());
    tolerations
}

/// Allocatable GPUs of a node (`nvidia.com/gpu`), 0 when absent or unreadable.
pub fn allocatable_gpus(node: &k8s_openapi::api::core::v1::Node) -> u32 {
    node.status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .and_then(|a| a.get(keys::RESOURCE_GPU))
        .and_then(|q| q.0.trim().parse::<u32>().ok())
        .unwrap_or(0)
}

#[cfg(test)]
pub(crate) mod tests;
