//! The node-check pod, field by field: pinning, credentials, env, security and spec knobs.

use super::*;
use gpufabric_api::run::{FabricTestRunSpec, Trigger};
use gpufabric_api::test::{AgentSpec, FabricTestSpec};
use k8s_openapi::api::core::v1::LocalObjectReference;

pub(crate) fn run() -> FabricTestRun {
    let mut agent = AgentSpec {
        timeout_seconds: 600,
        ..Default::default()
    };
    agent.env.push(EnvVar {
        name: "NCCL_DEBUG".into(),
        value: Some("INFO".into()),
        ..Default::default()
    });
    agent.env.push(EnvVar {
        name: keys::ENV_RUN.into(),
        value: Some("spoofed".into()),
        ..Default::default()
    });
    agent.tolerations.push(Toleration {
        key: Some("dedicated".into()),
        operator: Some("Equal".into()),
        value: Some("gpu".into()),
        effect: Some("NoSchedule".into()),
        ..Default::default()
    });
    let spec = FabricTestSpec {
        agent,
        ..Default::default()
    };
    let mut r = FabricTestRun::new(
        "nightly-29000000",
        FabricTestRunSpec::of_test("nightly", &spec, Trigger::Schedule, None, None),
    );
    r.metadata.uid = Some("run-uid".into());
    r
}

fn container(p: &Pod) -> &Container {
    &p.spec.as_ref().expect("spec").containers[0]
}

#[test]
fn an_rdma_pod_carries_the_specs_annotations_and_devices_beside_every_gpu() {
    let mut r = run();
    r.spec.agent.pod_annotations = BTreeMap::from([(
        "k8s.v1.cni.cncf.io/networks".to_string(),
        "rdma-net-a,rdma-net-b".to_string(),
    )]);
    let rdma = BTreeMap::from([(
        "rdma/rdma_shared_device_a".to_string(),
        Quantity("1".into()),
    )]);
    r.spec.agent.resources = Some(ResourceRequirements {
        limits: Some(rdma.clone()),
        requests: Some(rdma),
        ..Default::default()
    });
    let p = node_check_pod(&r, "gpu-1", 8).expect("builds");
    assert_eq!(
        p.metadata.annotations.as_ref().expect("annotations")["k8s.v1.cni.cncf.io/networks"],
        "rdma-net-a,rdma-net-b"
    );
    let res = container(&p).resources.clone().expect("resources");
    for side in [res.limits, res.requests] {
        let side = side.expect("both sides");
        assert_eq!(side["rdma/rdma_shared_device_a"].0, "1");
        assert_eq!(side["nvidia.com/gpu"].0, "8");
    }
    assert_eq!(
        node_check_pod(&run(), "gpu-1", 8)
            .expect("builds")
            .metadata
            .annotations,
        None
    );
}

#[test]
fn pod_is_pinned_to_its_node_and_requests_every_gpu() {
    let p = node_check_pod(&run(), "gpu-1", 8).expect("builds");
    let spec = p.spec.as_ref().expect("spec");
    assert_eq!(spec.node_name.as_deref(), Some("gpu-1"));
    let res = container(&p).resources.as_ref().expect("resources");
    assert_eq!(
        res.limits.as_ref().expect("limits")["nvidia.com/gpu"].0,
        "8"
    );
    assert_eq!(
        res.requests.as_ref().expect("requests")["nvidia.com/gpu"].0,
        "8"
    );
    let base = run_base(&run()).expect("persisted");
    assert!(base.starts_with("nightly-29000000-"), "{base}");
    assert_eq!(p.metadata.name, Some(format!("{base}-gpu-1")));
    assert_eq!(p.metadata.namespace, None);
}

#[test]
fn pod_holds_no_credentials_has_a_deadline_and_never_restarts() {
    let p = node_check_pod(&run(), "gpu-1", 8).expect("builds");
    let spec = p.spec.as_ref().expect("spec");
    assert_eq!(spec.automount_service_account_token, Some(false));
    assert_eq!(spec.active_deadline_seconds, Some(600));
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    let c = container(&p);
    assert_eq!(c.termination_message_policy.as_deref(), Some("File"));
    assert_eq!(
        c.termination_message_path.as_deref(),
        Some("/dev/termination-log")
    );
}

#[test]
fn pod_tolerates_our_quarantine_taint_and_the_users_tolerations() {
    let p = node_check_pod(&run(), "gpu-1", 8).expect("builds");
    let tol = p
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.clone())
        .expect("tolerations");
    assert!(
        tol.iter()
            .any(|t| t.key.as_deref() == Some("gpufabric.io/quarantined")
                && t.operator.as_deref() == Some("Exists"))
    );
    assert!(tol.iter().any(|t| t.key.as_deref() == Some("dedicated")));
}

#[test]
fn pod_is_owned_by_the_run_and_labelled() {
    let p = node_check_pod(&run(), "gpu-1", 8).expect("builds");
    let owners = p.metadata.owner_references.as_ref().expect("owners");
    assert_eq!(owners.len(), 1);
    assert_eq!(owners[0].kind, "FabricTestRun");
    assert_eq!(owners[0].uid, "run-uid");
    assert_eq!(owners[0].controller, Some(true));
    let labels = p.metadata.labels.as_ref().expect("labels");
    assert_eq!(labels["gpufabric.io/test"], "nightly");
    assert_eq!(labels["gpufabric.io/run"], "nightly-29000000");
    assert_eq!(labels["gpufabric.io/node"], "gpu-1");
    assert_eq!(labels["gpufabric.io/role"], "node-check");
}

#[test]
fn pod_env_has_node_run_and_suite_and_users_cannot_override_ours() {
    let p = node_check_pod(&run(), "gpu-1", 8).expect("builds");
    let env = container(&p).env.clone().expect("env");
    let get = |n: &str| env.iter().filter(|e| e.name == n).collect::<Vec<_>>();
    assert_eq!(get("NCCL_DEBUG")[0].value.as_deref(), Some("INFO"));
    let run_env = get("FABRIC_RUN");
    assert_eq!(run_env.len(), 1);
    assert_eq!(run_env[0].value.as_deref(), Some("nightly-29000000"));
    let node = get("FABRIC_NODE_NAME");
    assert_eq!(
        node[0]
            .value_from
            .as_ref()
            .and_then(|v| v.field_ref.as_ref())
            .map(|f| f.field_path.as_str()),
        Some("spec.nodeName")
    );
    let suite = get("FABRIC_SUITE")[0].value.clone().expect("suite json");
    let parsed: gpufabric_api::Suite = serde_json::from_str(&suite).expect("suite parses");
    assert_eq!(parsed, gpufabric_api::Suite::default());
    let cmd = container(&p).command.clone().expect("command");
    assert_eq!(
        &cmd[..2],
        &["fabric-agent".to_string(), "node-check".to_string()]
    );
}

#[test]
fn pod_env_names_the_nccl_variables_the_spec_sets_and_only_those() {
    let mut r = run();
    for (name, value) in [
        ("NCCL_P2P_DISABLE", "1"),
        ("NCCL_ALGO", "Ring"),
        ("OMP_NUM_THREADS", "4"),
        // A user's own list is replaced by the one the spec's env gives.
        (keys::ENV_SPEC_ENV, "NCCL_PROTO"),
    ] {
        r.spec.agent.env.push(EnvVar {
            name: name.into(),
            value: Some(value.into()),
            ..Default::default()
        });
    }
    let p = node_check_pod(&r, "gpu-1", 8).expect("builds");
    let env = container(&p).env.clone().expect("env");
    let listed: Vec<_> = env
        .iter()
        .filter(|e| e.name == keys::ENV_SPEC_ENV)
        .collect();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        listed[0].value.as_deref(),
        Some("NCCL_ALGO,NCCL_DEBUG,NCCL_P2P_DISABLE")
    );
    // The spec's settings still reach the agent as set.
    let p2p = env.iter().find(|e| e.name == "NCCL_P2P_DISABLE");
    assert_eq!(p2p.and_then(|e| e.value.as_deref()), Some("1"));
}

#[test]
fn a_spec_without_nccl_settings_lists_none() {
    let mut r = run();
    r.spec.agent.env.clear();
    let p = node_check_pod(&r, "gpu-1", 8).expect("builds");
    let env = container(&p).env.clone().expect("env");
    let listed = env.iter().find(|e| e.name == keys::ENV_SPEC_ENV);
    assert_eq!(listed.and_then(|e| e.value.as_deref()), Some(""));
}

#[test]
fn pod_names_are_deterministic_and_bounded() {
    let node = format!("{}.example.com", "n".repeat(70));
    let a = node_check_pod(&run(), &node, 4).expect("builds");
    let b = node_check_pod(&run(), &node, 4).expect("builds");
    let name = a.metadata.name.clone().expect("name");
    assert!(name.len() <= 63);
    assert_eq!(a.metadata.name, b.metadata.name);
    let label = &a.metadata.labels.as_ref().expect("labels")["gpufabric.io/node"];
    assert!(label.len() <= 63);
}

#[test]
fn the_suite_travels_only_in_the_env() {
    let mut r = run();
    r.spec.suite.nccl_sweep.collectives = vec![gpufabric_api::Collective::AllReduce];
    r.spec.suite.nccl_sweep.max_bytes = 1 << 20;
    r.spec.suite.ddp_probe.enabled = false;
    let p = node_check_pod(&r, "gpu-1", 8).expect("builds");
    let cmd = container(&p).command.clone().expect("command");
    assert_eq!(
        cmd.join(" "),
        "fabric-agent node-check --expect-gpus 8 --phase-timeout 450"
    );
    let env = container(&p).env.clone().expect("env");
    let suite = env
        .iter()
        .find(|e| e.name == keys::ENV_SUITE)
        .and_then(|e| e.value.clone())
        .expect("suite env");
    let parsed: gpufabric_api::Suite = serde_json::from_str(&suite).expect("suite parses");
    assert_eq!(parsed, r.spec.suite);
}

#[test]
fn nccl_gets_a_memory_backed_dev_shm_and_no_privilege_escalation() {
    let p = node_check_pod(&run(), "gpu-node-1", 8).expect("pod");
    let spec = p.spec.as_ref().expect("spec");
    let volume = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == SHM_VOLUME)
        .expect("shm volume");
    let dir = volume.empty_dir.as_ref().expect("emptyDir");
    assert_eq!(dir.medium.as_deref(), Some("Memory"));
    assert_eq!(dir.size_limit, Some(Quantity(SHM_SIZE.into())));
    let c = container(&p);
    assert!(
        c.volume_mounts
            .iter()
            .flatten()
            .any(|m| m.name == SHM_VOLUME && m.mount_path == "/dev/shm")
    );
    let sc = c.security_context.as_ref().expect("security context");
    assert_eq!(sc.allow_privilege_escalation, Some(false));
}

#[test]
fn a_node_without_gpus_gets_no_pod() {
    assert!(node_check_pod(&run(), "cpu-1", 0).is_err());
}

#[test]
fn host_network_and_image_come_from_the_agent_spec() {
    let mut r = run();
    r.spec.agent.host_network = true;
    r.spec.agent.ipc_lock = true;
    r.spec.agent.shm_size = Some(Quantity("8Gi".into()));
    r.spec.agent.image = "registry.local/fabric-agent:dev".into();
    r.spec.agent.image_pull_policy = PullPolicy::Always;
    let p = node_check_pod(&r, "gpu-1", 8).expect("builds");
    let spec = p.spec.as_ref().expect("spec");
    assert_eq!(spec.host_network, Some(true));
    assert_eq!(spec.dns_policy.as_deref(), Some("ClusterFirstWithHostNet"));
    assert_eq!(
        container(&p).image.as_deref(),
        Some("registry.local/fabric-agent:dev")
    );
    assert_eq!(container(&p).image_pull_policy.as_deref(), Some("Always"));
    let caps = container(&p)
        .security_context
        .as_ref()
        .and_then(|s| s.capabilities.as_ref())
        .and_then(|c| c.add.clone());
    assert_eq!(caps, Some(vec!["IPC_LOCK".to_string()]));
    let shm = spec
        .volumes
        .as_ref()
        .and_then(|v| v.iter().find(|v| v.name == SHM_VOLUME))
        .and_then(|v| v.empty_dir.as_ref())
        .and_then(|d| d.size_limit.clone());
    assert_eq!(shm, Some(Quantity("8Gi".into())));
    // Not asked for: no capability is added.
    let plain = node_check_pod(&run(), "gpu-1", 8).expect("builds");
    assert!(
        container(&plain)
            .security_context
            .as_ref()
            .and_then(|s| s.capabilities.as_ref())
            .is_some_and(|c| c.add.is_none())
    );
}

#[test]
fn the_agent_container_meets_pod_security_restricted() {
    let p = node_check_pod(&run(), "gpu-1", 8).expect("builds");
    let spec = p.spec.as_ref().expect("spec");
    let pod_seccomp = spec
        .security_context
        .as_ref()
        .and_then(|s| s.seccomp_profile.as_ref())
        .map(|s| s.type_.as_str());
    assert_eq!(pod_seccomp, Some("RuntimeDefault"));
    assert_eq!(spec.host_network, None);
    let sc = container(&p).security_context.clone().expect("security");
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.run_as_non_root, Some(true));
    assert_eq!(sc.run_as_user, None, "the image's non-root user");
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    let caps = sc.capabilities.expect("capabilities");
    assert_eq!(caps.drop, Some(vec!["ALL".to_string()]));
    assert_eq!(caps.add, None);
    // Only emptyDir volumes, and a writable /tmp under the read-only root.
    let volumes = spec.volumes.clone().unwrap_or_default();
    assert!(volumes.iter().all(|v| v.empty_dir.is_some()));
    assert!(
        container(&p)
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.mount_path == "/tmp")
    );
}

#[test]
fn ipc_lock_runs_the_agent_as_root_with_that_capability_alone() {
    let mut r = run();
    r.spec.agent.ipc_lock = true;
    let p = node_check_pod(&r, "gpu-1", 8).expect("builds");
    let sc = container(&p).security_context.clone().expect("security");
    assert_eq!(sc.run_as_user, Some(0));
    assert_eq!(sc.run_as_non_root, None);
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    let caps = sc.capabilities.expect("capabilities");
    assert_eq!(caps.drop, Some(vec!["ALL".to_string()]));
    assert_eq!(caps.add, Some(vec!["IPC_LOCK".to_string()]));
}

#[test]
fn pull_secrets_runtime_class_and_priority_come_from_the_agent_spec() {
    let plain = node_check_pod(&run(), "gpu-1", 8).expect("builds");
    let spec = plain.spec.as_ref().expect("spec");
    assert_eq!(spec.image_pull_secrets, None);
    assert_eq!(spec.runtime_class_name, None);
    assert_eq!(spec.priority_class_name, None);

    let mut r = run();
    r.spec.agent.image_pull_secrets = vec![LocalObjectReference {
        name: "regcred".into(),
    }];
    r.spec.agent.runtime_class_name = Some("nvidia".into());
    r.spec.agent.priority_class_name = Some("gpu-tests".into());
    let p = node_check_pod(&r, "gpu-1", 8).expect("builds");
    let spec = p.spec.as_ref().expect("spec");
    let secrets: Vec<String> = spec
        .image_pull_secrets
        .iter()
        .flatten()
        .map(|s| s.name.clone())
        .collect();
    assert_eq!(secrets, ["regcred"]);
    assert_eq!(spec.runtime_class_name.as_deref(), Some("nvidia"));
    assert_eq!(spec.priority_class_name.as_deref(), Some("gpu-tests"));
}
