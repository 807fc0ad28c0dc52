//! The process-kubelet produces, on a real kube-apiserver, the infrastructure failures of a
//! busy cluster with the pod status a real kubelet writes: admission rejection when the
//! GPUs are held, image pulls that fail, config that cannot be built, a node that never
//! starts pods, eviction and preemption.

use gpufabric_tests::fixtures::{
    self, MISSING_IMAGE, hold_gpus, pod_phase, secret_env, shell_pod, waiting,
};
use gpufabric_tests::fleet::{H100, SimFleet};
use gpufabric_tests::kubelet::{Eviction, Kubelet, KubeletOptions};
use gpufabric_tests::shared::TestEnv;
use gpufabric_tests::wait;
use k8s_openapi::api::core::v1::{EnvFromSource, Pod, Secret, SecretEnvSource};
use kube::api::{Api, DeleteParams, PostParams};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

const T: Duration = Duration::from_secs(90);

/// A namespace of the shared control plane, two 8-GPU nodes (`node-01`, `node-02`,
/// prefixed), and a kubelet with `opts`.
async fn start(name: &str, opts: KubeletOptions) -> (TestEnv, SimFleet, Kubelet, Api<Pod>) {
    let env = TestEnv::new(name).await.expect("test environment");
    let (fleet, kubelet) = env
        .start_kubelet(SimFleet::uniform("node", 2, H100, 8), opts)
        .await
        .expect("kubelet starts");
    let pods = Api::namespaced(env.client(), env.ns());
    (env, fleet, kubelet, pods)
}

fn fast() -> KubeletOptions {
    KubeletOptions {
        retry_backoff: Duration::from_secs(1),
        ..Default::default()
    }
}

fn gpu_pod(name: &str, node: &str, gpus: u32, script: &str) -> Pod {
    let mut pod = shell_pod(name, node, script);
    let q = BTreeMap::from([(
        "nvidia.com/gpu".to_string(),
        k8s_openapi::apimachinery::pkg::api::resource::Quantity(gpus.to_string()),
    )]);
    if let Some(c) = pod.spec.as_mut().and_then(|s| s.containers.first_mut()) {
        c.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
            limits: Some(q),
            ..Default::default()
        });
    }
    pod
}

async fn create(pods: &Api<Pod>, pod: &Pod) {
    pods.create(&PostParams::default(), pod)
        .await
        .expect("pod created");
}

async fn wait_until(
    pods: &Api<Pod>,
    name: &str,
    cond: impl Fn(Option<&Pod>) -> bool + Send,
) -> Pod {
    wait::for_object(pods, name, T, cond)
        .await
        .expect("pod reaches the expected state")
        .expect("pod exists")
}

fn ended(p: Option<&Pod>) -> bool {
    matches!(pod_phase(p), "Succeeded" | "Failed")
}

fn status_reason(p: &Pod) -> (String, String) {
    let s = p.status.clone().unwrap_or_default();
    (s.reason.unwrap_or_default(), s.message.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_asking_for_gpus_another_pod_holds_is_rejected_out_of_gpu() {
    let (env, _fleet, _kubelet, pods) = start("out-of-gpu", fast()).await;
    let (n1, n2) = (env.node("node-01"), env.node("node-02"));
    hold_gpus(&env.client(), env.ns(), &n1, 8)
        .await
        .expect("the holder runs on node-01");
    create(&pods, &gpu_pod("bench-01", &n1, 8, "exit 0")).await;
    create(&pods, &gpu_pod("bench-02", &n2, 8, "exit 0")).await;
    let rejected = wait_until(&pods, "bench-01", ended).await;
    assert_eq!(pod_phase(Some(&rejected)), "Failed");
    assert_eq!(
        status_reason(&rejected),
        (
            "OutOfnvidia.com/gpu".to_string(),
            "Pod was rejected: Node didn't have enough resource: nvidia.com/gpu, requested: 8, used: 8, capacity: 8"
                .to_string()
        )
    );
    let no_containers = rejected
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .is_none_or(|c| c.is_empty());
    assert!(no_containers, "a rejected pod never had a container");
    let free = wait_until(&pods, "bench-02", ended).await;
    assert_eq!(
        pod_phase(Some(&free)),
        "Succeeded",
        "node-02's GPUs are free"
    );

    // Once the holder is gone its GPUs are free again.
    let holder = fixtures::gpu_holder_name(&n1);
    pods.delete(&holder, &DeleteParams::default())
        .await
        .expect("holder deleted");
    wait::for_deletion(&pods, &holder, T)
        .await
        .expect("holder gone");
    create(&pods, &gpu_pod("bench-03", &n1, 8, "exit 0")).await;
    let after = wait_until(&pods, "bench-03", ended).await;
    assert_eq!(pod_phase(Some(&after)), "Succeeded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_that_does_not_exist_waits_in_err_image_pull_then_back_off() {
    let (env, _fleet, _kubelet, pods) = start("image-pull", fast()).await;
    let mut pod = shell_pod("pull", &env.node("node-01"), "exit 0");
    let mut doomed = shell_pod("pull-deadline", &env.node("node-02"), "exit 0");
    for p in [&mut pod, &mut doomed] {
        if let Some(c) = p.spec.as_mut().and_then(|s| s.containers.first_mut()) {
            c.image = Some(MISSING_IMAGE.to_string());
        }
    }
    if let Some(s) = doomed.spec.as_mut() {
        s.active_deadline_seconds = Some(4);
    }
    create(&pods, &pod).await;
    create(&pods, &doomed).await;
    let reason_is =
        |want: &'static str| move |p: Option<&Pod>| waiting(p).is_some_and(|(r, _)| r == want);
    let p = wait_until(&pods, "pull", reason_is("ErrImagePull")).await;
    assert_eq!(pod_phase(Some(&p)), "Pending");
    let (_, msg) = waiting(Some(&p)).unwrap_or_default();
    assert!(
        msg.starts_with(&format!("Failed to pull image \"{MISSING_IMAGE}\"")),
        "{msg}"
    );
    let p = wait_until(&pods, "pull", reason_is("ImagePullBackOff")).await;
    assert_eq!(pod_phase(Some(&p)), "Pending");
    let (_, msg) = waiting(Some(&p)).unwrap_or_default();
    assert!(
        msg.starts_with(&format!("Back-off pulling image \"{MISSING_IMAGE}\"")),
        "{msg}"
    );

    // activeDeadlineSeconds also ends a pod whose image never came.
    let d = wait_until(&pods, "pull-deadline", ended).await;
    assert_eq!(pod_phase(Some(&d)), "Failed");
    assert_eq!(status_reason(&d).0, "DeadlineExceeded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_from_a_missing_secret_is_a_config_error_until_the_secret_exists() {
    let (env, _fleet, _kubelet, pods) = start("config-error", fast()).await;
    let mut pod = shell_pod(
        "needs-token",
        &env.node("node-01"),
        "echo -n \"$TOKEN\" > \"$FABRIC_TERMINATION_LOG\"",
    );
    let mut from_all = shell_pod("needs-all", &env.node("node-02"), "exit 0");
    if let Some(c) = pod.spec.as_mut().and_then(|s| s.containers.first_mut()) {
        c.env = Some(vec![secret_env("TOKEN", "agent-token", "token")]);
    }
    if let Some(c) = from_all
        .spec
        .as_mut()
        .and_then(|s| s.containers.first_mut())
    {
        c.env_from = Some(vec![EnvFromSource {
            secret_ref: Some(SecretEnvSource {
                name: "agent-settings".to_string(),
                optional: None,
            }),
            ..Default::default()
        }]);
    }
    create(&pods, &pod).await;
    create(&pods, &from_all).await;
    let config_error =
        |p: Option<&Pod>| waiting(p).is_some_and(|(r, _)| r == "CreateContainerConfigError");
    let p = wait_until(&pods, "needs-token", config_error).await;
    assert_eq!(pod_phase(Some(&p)), "Pending");
    assert_eq!(
        waiting(Some(&p)).map(|(_, m)| m).as_deref(),
        Some("secret \"agent-token\" not found")
    );
    let p = wait_until(&pods, "needs-all", config_error).await;
    assert_eq!(
        waiting(Some(&p)).map(|(_, m)| m).as_deref(),
        Some("secret \"agent-settings\" not found")
    );

    // A Secret without the key is still an error, worded as the kubelet does.
    let secrets: Api<Secret> = Api::namespaced(env.client(), env.ns());
    let secret = |data: &[(&str, &str)]| Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("agent-token".to_string()),
            ..Default::default()
        },
        string_data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..Default::default()
    };
    secrets
        .create(&PostParams::default(), &secret(&[("other", "x")]))
        .await
        .expect("secret without the key");
    let missing_key = format!("couldn't find key token in Secret {}/agent-token", env.ns());
    wait_until(&pods, "needs-token", |p| {
        waiting(p).is_some_and(|(_, m)| m == missing_key)
    })
    .await;
    // With the key, the pod starts and sees the value.
    secrets
        .replace(
            "agent-token",
            &PostParams::default(),
            &secret(&[("token", "s3cret")]),
        )
        .await
        .expect("secret with the key");
    let p = wait_until(&pods, "needs-token", ended).await;
    assert_eq!(pod_phase(Some(&p)), "Succeeded");
    let message = p.status.and_then(|s| {
        s.container_statuses?
            .first()?
            .state
            .clone()?
            .terminated?
            .message
    });
    assert_eq!(message.as_deref(), Some("s3cret"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_node_leaves_its_pods_pending_without_status_until_it_recovers() {
    let env = TestEnv::new("stalled").await.expect("test environment");
    let (n1, n2) = (env.node("node-01"), env.node("node-02"));
    let opts = KubeletOptions {
        stalled_nodes: BTreeSet::from([n2.clone()]),
        ..fast()
    };
    let (_fleet, kubelet) = env
        .start_kubelet(SimFleet::uniform("node", 2, H100, 8), opts)
        .await
        .expect("kubelet starts");
    let pods: Api<Pod> = Api::namespaced(env.client(), env.ns());
    create(&pods, &shell_pod("stuck", &n2, "exit 0")).await;
    create(&pods, &shell_pod("deleted", &n2, "exit 0")).await;
    create(&pods, &shell_pod("runs", &n1, "exit 0")).await;
    let ran = wait_until(&pods, "runs", ended).await;
    assert_eq!(pod_phase(Some(&ran)), "Succeeded", "node-01 works");
    // Well after node-01 finished its pod, node-02 has not touched its own.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let stuck = pods.get("stuck").await.expect("pod");
    let status = stuck.status.clone().unwrap_or_default();
    assert_eq!(status.phase.as_deref(), Some("Pending"));
    assert!(
        status
            .container_statuses
            .as_ref()
            .is_none_or(|c| c.is_empty()),
        "{status:?}"
    );
    assert!(status.start_time.is_none(), "{status:?}");
    // Deleting a pod of a stalled node still completes.
    pods.delete("deleted", &DeleteParams::default())
        .await
        .expect("delete");
    wait::for_deletion(&pods, "deleted", T)
        .await
        .expect("deletion confirmed");
    kubelet
        .set_node_stalled(&n2, false)
        .await
        .expect("node-02 recovers");
    let recovered = wait_until(&pods, "stuck", ended).await;
    assert_eq!(pod_phase(Some(&recovered)), "Succeeded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_and_preempted_pods_fail_with_the_kubelets_reason() {
    let (env, _fleet, kubelet, pods) = start("eviction", fast()).await;
    let running = |p: Option<&Pod>| pod_phase(p) == "Running";
    for (name, node) in [("evicted", "node-01"), ("preempted", "node-02")] {
        create(&pods, &gpu_pod(name, &env.node(node), 8, "sleep 100000")).await;
        wait_until(&pods, name, running).await;
    }
    kubelet
        .evict_pod(env.ns(), "evicted", Eviction::NodePressure)
        .expect("evict");
    kubelet
        .evict_pod(env.ns(), "preempted", Eviction::Preemption)
        .expect("preempt");
    for (name, reason) in [("evicted", "Evicted"), ("preempted", "Preempting")] {
        let p = wait_until(&pods, name, ended).await;
        assert_eq!(pod_phase(Some(&p)), "Failed", "{name}");
        assert_eq!(status_reason(&p).0, reason, "{name}");
        let target = p
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "DisruptionTarget");
        assert_eq!(
            target.and_then(|c| c.reason).as_deref(),
            Some("TerminationByKubelet"),
            "{name}"
        );
    }
    // An evicted pod no longer holds its node's GPUs.
    create(&pods, &gpu_pod("after", &env.node("node-01"), 8, "exit 0")).await;
    let after = wait_until(&pods, "after", ended).await;
    assert_eq!(pod_phase(Some(&after)), "Succeeded");
    assert!(
        kubelet
            .evict_pod(env.ns(), "no-such-pod", Eviction::NodePressure)
            .is_err()
    );
}
