//! GPUs as DRA devices in the local control plane: the fixture driver's ResourceSlices,
//! DeviceTaintRules on single GPUs, and the real kube-scheduler deciding which claims fit.
//! First a rule written by hand; then the operator's own, written for a GPU that failed a
//! run and its confirmation, released by a passing run and by the test's deletion; then a
//! node pair over two such nodes, each rank's pod claiming its node's GPUs; then, at once, a
//! GPU held back by the GPU budget and a node whose claim a taint of someone else's keeps
//! from being allocated (not measured, never failed).
//!
//! Needs the control-plane binaries (`tests/cluster/build.sh`), the real kube-scheduler
//! (`tests/cluster/build-node.sh`) and the agent and operator built:
//! `cargo build -p gpufabric-agent -p gpufabric-operator -p gpufabric-tests --bins`, then
//! `cargo test -p gpufabric-tests --test dra`.

use gpufabric_api::findings::Severity;
use gpufabric_api::keys::{
    ANNOTATION_DEVICE_QUARANTINE, CONDITION_NODE_DEGRADED, LABEL_RESULT, TAINT_GPU,
};
use gpufabric_api::run::SkipReason;
use gpufabric_measure::fleet::Fault;
use gpufabric_tests::cluster::Cluster;
use gpufabric_tests::dra;
use gpufabric_tests::fleet::{H100, SimFleet};
use gpufabric_tests::operator::{
    OperatorEnv, cordoned, last_run_name, node_pairs_suite, sim_agent,
};
use gpufabric_tests::wait;
use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeStatus, Pod};
use k8s_openapi::api::resource::v1alpha3::{
    DeviceTaint, DeviceTaintRule, DeviceTaintRuleSpec, DeviceTaintSelector,
};
use k8s_openapi::api::resource::v1beta1::{ResourceClaim, ResourceClaimTemplate};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tainted_gpu_keeps_a_claim_for_all_eight_off_its_node_and_lets_seven_schedule() {
    let mut cluster = Cluster::start_with(dra::cluster_options())
        .await
        .expect("control plane with DRA");
    dra::start_scheduler(&mut cluster).expect("kube-scheduler");
    let client = cluster.client();
    register_node(&client).await;
    // Pods need their service account; the controller manager makes it, maybe not yet.
    dra::service_account(&client, NS)
        .await
        .expect("service account");
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

    dra::claim_and_pod(&client, NS, NODE, "wants-eight", 8)
        .await
        .expect("claim and pod");
    let eight = dra::placement(&client, NS, NODE, "wants-eight").await;
    assert!(
        eight.is_err(),
        "8 GPUs of a node with one tainted GPU must not be allocated: {eight:?}"
    );

    dra::claim_and_pod(&client, NS, NODE, "wants-seven", 7)
        .await
        .expect("claim and pod");
    let seven = dra::placement(&client, NS, NODE, "wants-seven")
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
    dra::claim_and_pod(&client, NS, NODE, "wants-one", 1)
        .await
        .expect("claim and pod");
    let one = dra::placement(&client, NS, NODE, "wants-one")
        .await
        .expect("the released GPU fits");
    assert_eq!(one, vec!["gpu-3".to_string()]);
}

/// Four 8-GPU nodes: `dra-01` (GPU 3) and `dra-02` (GPU 6) with a straggler GPU and their
/// GPUs published as DRA devices; `plain-01` with a straggler GPU (5) and no devices;
/// `good-01` healthy, its GPUs devices only (the node reports no `nvidia.com/gpu`).
fn fleet() -> gpufabric_measure::fleet::Fleet {
    let mut f = SimFleet::uniform("n", 4, H100, 8);
    for (n, name) in f
        .nodes
        .iter_mut()
        .zip(["dra-01", "dra-02", "plain-01", "good-01"])
    {
        n.name = name.to_string();
    }
    for (i, gpu) in [(0, 3), (1, 6), (2, 5)] {
        f.nodes[i]
            .faults
            .push(Fault::Straggler { gpu, factor: 1.5 });
    }
    f
}

/// The DeviceTaintRules in the cluster.
async fn rules(client: &kube::Client) -> Vec<DeviceTaintRule> {
    Api::<DeviceTaintRule>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("rules listed")
        .items
}

/// The pod of run `run` on `node`.
async fn run_pod(env: &OperatorEnv, run: &str, node: &str) -> Pod {
    let lp = ListParams::default().labels(&format!(
        "{}={run},{}={node}",
        gpufabric_api::keys::LABEL_RUN,
        gpufabric_api::keys::LABEL_NODE
    ));
    let mut pods = env.pods_api().list(&lp).await.expect("pods listed").items;
    assert_eq!(pods.len(), 1, "one pod of {run} on {node}");
    pods.remove(0)
}

/// Waits (up to 180 s) until the test's status satisfies `cond` with no run active.
async fn wait_status(
    env: &OperatorEnv,
    name: &str,
    what: &str,
    cond: impl Fn(&gpufabric_api::FabricTestStatus) -> bool + Send + Sync,
) -> gpufabric_api::FabricTestStatus {
    let api = env.tests_api();
    let r = wait::for_object(&api, name, Duration::from_secs(180), |t| {
        t.and_then(|t| t.status.as_ref())
            .is_some_and(|s| s.active_run.is_none() && cond(s))
    })
    .await;
    match r {
        Ok(Some(t)) => t.status.unwrap_or_default(),
        other => {
            let status = api.get(name).await.ok().and_then(|t| t.status);
            panic!(
                "{what}: {other:?}\nstatus: {status:#?}\noperator log:\n{}",
                env.operator.log_tail(80)
            )
        }
    }
}

fn tainted(s: &gpufabric_api::FabricTestStatus, node: &str) -> Vec<u32> {
    s.nodes
        .iter()
        .find(|h| h.node == node)
        .map(|h| h.tainted_gpus.iter().map(|g| g.gpu).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gpu_that_fails_twice_is_tainted_alone_and_released_by_a_pass_and_by_the_tests_deletion()
{
    let began = Instant::now();
    let env = OperatorEnv::start_dra(fleet(), "gpufabric", &["good-01"]).await;
    let client = env.cluster.client();
    for node in ["dra-01", "dra-02", "good-01"] {
        dra::publish_gpus(&client, node, 8, H100)
            .await
            .expect("slice published");
    }
    let name = "gpus";
    env.create_test(
        name,
        json!({
            "nodeSelector": env.node_selector(),
            "agent": sim_agent(60),
            "quarantine": {"mode": "Cordon", "maxQuarantined": "100%", "failuresToQuarantine": 1,
                "confirmRetest": true, "passesToRelease": 1, "stormThresholdPercent": 100},
        }),
    )
    .await;

    // The first run finds the stragglers, the confirmation run finds them again.
    let s = wait_status(&env, name, "GPUs tainted after confirmation", |s| {
        tainted(s, "dra-01") == [3] && tainted(s, "dra-02") == [6]
    })
    .await;
    let handling = s.gpu_handling.clone().expect("gpuHandling in the status");
    assert_eq!(handling.device_taint_rules.as_deref(), Some("v1alpha3"));
    assert_eq!(handling.per_node, ["plain-01"]);
    assert_eq!(handling.per_gpu, ["dra-01", "dra-02", "good-01"]);
    assert_eq!(handling.tainted_gpus, 2);
    // The GPU budget (maxQuarantinedGpus, 10% by default) is a share of the selected nodes'
    // GPUs, good-01's devices among them: 10% of 32. The cordon of plain-01 takes the node
    // budget, not this one.
    assert_eq!(handling.gpu_budget, 3, "{handling:?}");
    assert_eq!(s.quarantined_nodes, ["plain-01"], "{:#?}", s.nodes);

    let all = rules(&client).await;
    assert_eq!(all.len(), 2, "one rule for each failing GPU: {all:#?}");
    let on = |node: &str| {
        all.iter()
            .find(|r| {
                r.spec
                    .device_selector
                    .as_ref()
                    .and_then(|d| d.pool.as_deref())
                    == Some(node)
            })
            .unwrap_or_else(|| panic!("a rule for {node}"))
    };
    let rule = on("dra-01");
    let selector = rule.spec.device_selector.clone().expect("selector");
    assert_eq!(selector.driver.as_deref(), Some(dra::DRIVER));
    assert_eq!(selector.device.as_deref(), Some("gpu-3"));
    assert_eq!(rule.spec.taint.key, TAINT_GPU);
    assert_eq!(rule.spec.taint.value.as_deref(), Some("straggler"));
    assert_eq!(rule.spec.taint.effect, "NoSchedule");
    let test = env.tests_api().get(name).await.expect("test read");
    let owner = &rule.owner_references()[0];
    assert_eq!(Some(&owner.uid), test.metadata.uid.as_ref());
    assert!(
        rule.annotations()
            .contains_key(ANNOTATION_DEVICE_QUARANTINE)
    );

    // The GPU nodes stay schedulable; the node without DRA devices is cordoned as before.
    for node in ["dra-01", "dra-02", "good-01"] {
        assert!(!cordoned(&env.read_node(node).await), "{node} was cordoned");
    }
    assert!(cordoned(&env.read_node("plain-01").await));

    // The signals name the GPU and why, and do not read dra-01 as a failed node (remediation
    // acting on it would take its seven good GPUs too); the metric holds the GPU alone.
    let degraded = |n: Option<&Node>| {
        n.and_then(|n| n.status.as_ref())
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == CONDITION_NODE_DEGRADED))
            .cloned()
    };
    let nodes: Api<Node> = Api::all(client.clone());
    let signalled = wait::for_object(&nodes, &env.node("dra-01"), Duration::from_secs(30), |n| {
        degraded(n).is_some_and(|c| c.reason.as_deref() == Some("GPUsOutOfService"))
    })
    .await
    .unwrap_or_else(|e| panic!("dra-01's signals: {e}"));
    let condition = degraded(signalled.as_ref()).expect("the condition");
    assert_eq!(condition.status, "False");
    let message = condition.message.unwrap_or_default();
    assert!(
        message.contains("GPU 3 out of service by DRA device taints, the node stays schedulable: "),
        "{message}"
    );
    let node = env.read_node("dra-01").await;
    assert_eq!(
        node.labels().get(LABEL_RESULT).map(String::as_str),
        Some("pass")
    );
    let series = format!(
        r#"gpufabric_gpu_quarantined{{test="{name}",node="{}",gpu="3"}} 1"#,
        env.node("dra-01")
    );
    let metrics = wait::poll(
        "the GPU's series",
        Duration::from_secs(30),
        Duration::from_millis(500),
        || {
            let op = &env.operator;
            let series = series.clone();
            async move {
                let text = op.metrics().await;
                Ok(text.contains(&series).then_some(text))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}: no series {series}"));
    assert!(
        !metrics.contains(&format!(
            r#"gpufabric_node_quarantined{{test="{name}",node="{}"}}"#,
            env.node("dra-01")
        )),
        "dra-01 is not held as a node"
    );

    // The real scheduler: 8 GPUs of dra-01 do not fit, 7 do, without GPU 3.
    let ns = env.ns.clone();
    dra::claim_and_pod(&client, &ns, "dra-01", "wants-eight", 8)
        .await
        .expect("claim and pod");
    let eight = dra::placement(&client, &ns, "dra-01", "wants-eight").await;
    assert!(
        eight.is_err(),
        "8 GPUs allocated next to a tainted one: {eight:?}"
    );
    dra::claim_and_pod(&client, &ns, "dra-01", "wants-seven", 7)
        .await
        .expect("claim and pod");
    let seven = dra::placement(&client, &ns, "dra-01", "wants-seven")
        .await
        .expect("7 untainted GPUs fit");
    assert_eq!(seven.len(), 7);
    assert!(!seven.iter().any(|d| d == "gpu-3"), "{seven:?}");

    // The run's own pods claimed their GPUs: on a node whose GPUs are devices, a template of
    // the pod's own for all 8, tolerating gpufabric's taint alone, and no nvidia.com/gpu;
    // the node without devices asked for nvidia.com/gpu as before.
    let last = last_run_name(&s);
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(client.clone(), &ns);
    for node in ["dra-01", "dra-02"] {
        let pod = run_pod(&env, &last, node).await;
        let spec = pod.spec.clone().expect("pod spec");
        assert_eq!(
            spec.node_name.as_deref(),
            Some(node),
            "bound by the scheduler"
        );
        let claim = &spec.resource_claims.as_ref().expect("the pod's claim")[0];
        let template = claim
            .resource_claim_template_name
            .clone()
            .expect("a template");
        assert_eq!(template, pod.name_any(), "named after its pod");
        let requests = spec.containers[0].resources.clone().unwrap_or_default();
        assert!(
            !requests
                .limits
                .unwrap_or_default()
                .contains_key("nvidia.com/gpu")
        );
        let t = templates.get(&template).await.expect("template read");
        assert_eq!(t.owner_references()[0].kind, "FabricTestRun");
        let request = &t
            .spec
            .spec
            .devices
            .expect("devices")
            .requests
            .expect("requests")[0];
        assert_eq!(request.count, Some(8));
        let tolerations = request.tolerations.clone().unwrap_or_default();
        assert_eq!(tolerations.len(), 1, "{tolerations:?}");
        assert_eq!(tolerations[0].key.as_deref(), Some(TAINT_GPU));
    }
    let plain = run_pod(&env, &last, "plain-01")
        .await
        .spec
        .expect("pod spec");
    assert!(plain.resource_claims.is_none());
    assert_eq!(
        plain.containers[0]
            .resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get("nvidia.com/gpu")),
        Some(&Quantity("8".into()))
    );

    // The job's claim holds 7 GPUs of dra-01: the next run skips the node busy, never blames
    // it, and it keeps its tainted GPU.
    let before = s.last_run.clone().map(|r| r.name);
    env.run_now(name).await;
    let s = wait_status(&env, name, "a run with dra-01 busy", |s| {
        s.last_run.as_ref().map(|r| &r.name) != before.as_ref()
    })
    .await;
    let run = env.run_status(&last_run_name(&s)).await;
    let busy = run
        .skipped
        .iter()
        .find(|k| k.node == "dra-01")
        .unwrap_or_else(|| panic!("dra-01 not skipped: {:#?}", run.skipped));
    assert_eq!(busy.reason, SkipReason::Busy);
    assert!(busy.message.contains("7 of its 8"), "{}", busy.message);
    assert_eq!(tainted(&s, "dra-01"), [3]);

    // good-01 reports no nvidia.com/gpu, its GPUs are devices only: it is selected, its pod
    // claims its 8 devices, the scheduler binds it there, and it passes.
    let good = env.read_node("good-01").await;
    let allocatable = good.status.and_then(|s| s.allocatable).unwrap_or_default();
    assert!(
        !allocatable.contains_key("nvidia.com/gpu"),
        "{allocatable:?}"
    );
    let pod = run_pod(&env, &last_run_name(&s), "good-01").await;
    let spec = pod.spec.clone().expect("pod spec");
    assert_eq!(spec.node_name.as_deref(), Some("good-01"));
    let template = spec.resource_claims.as_ref().expect("the pod's claim")[0]
        .resource_claim_template_name
        .clone()
        .expect("a template");
    let t = templates.get(&template).await.expect("template read");
    let requests = t
        .spec
        .spec
        .devices
        .and_then(|d| d.requests)
        .unwrap_or_default();
    assert_eq!(requests.first().and_then(|r| r.count), Some(8));
    let entry = run.nodes.iter().find(|n| n.node == "good-01");
    assert_eq!(
        entry.map(|n| n.verdict),
        Some(gpufabric_api::run::NodeVerdict::Passed),
        "{:#?}",
        run.nodes
    );

    // The job ends and its claim is deallocated.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for job in ["wants-seven", "wants-eight"] {
        pods.delete(job, &DeleteParams::default().grace_period(0))
            .await
            .expect("job deleted");
    }
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), &ns);
    let freed = wait::for_object(&claims, "wants-seven", Duration::from_secs(60), |c| {
        c.is_none_or(|c| c.status.as_ref().is_none_or(|s| s.allocation.is_none()))
    })
    .await;
    assert!(
        freed.is_ok(),
        "the job's claim was not deallocated: {freed:?}"
    );

    // dra-01 is repaired: a passing run deletes its rule; dra-02 still fails and stays. The
    // run's pod was scheduled on dra-01 with GPU 3 still tainted (the claim for all 8 that
    // does not tolerate gpufabric's taint was not), so the GPU was measured again.
    let mut repaired = env.fleet.fleet().clone();
    repaired.nodes[0].faults.clear();
    SimFleet::write_to(repaired, env.fleet.path()).expect("fleet rewritten");
    let before = s.last_run.clone().map(|r| r.name);
    env.run_now(name).await;
    let s = wait_status(&env, name, "dra-01 released", |s| {
        s.last_run.as_ref().map(|r| &r.name) != before.as_ref() && tainted(s, "dra-01").is_empty()
    })
    .await;
    assert_eq!(tainted(&s, "dra-02"), [6]);
    let measured = run_pod(&env, &last_run_name(&s), "dra-01").await;
    assert_eq!(
        measured.spec.and_then(|s| s.node_name).as_deref(),
        Some("dra-01")
    );
    let claimed = measured
        .status
        .and_then(|s| s.resource_claim_statuses)
        .unwrap_or_default();
    assert!(
        claimed.iter().any(|c| c.resource_claim_name.is_some()),
        "Kubernetes made the pod's claim from its template: {claimed:?}"
    );
    let left = rules(&client).await;
    assert_eq!(left.len(), 1, "{left:#?}");
    assert_eq!(
        left[0]
            .spec
            .device_selector
            .as_ref()
            .and_then(|d| d.pool.as_deref()),
        Some("dra-02")
    );

    // Deleting the FabricTest (what uninstall does) removes its rule at once.
    env.tests_api()
        .delete(name, &DeleteParams::default())
        .await
        .expect("test deleted");
    let gone = wait::for_object(&env.tests_api(), name, Duration::from_secs(60), |t| {
        t.is_none()
    })
    .await;
    assert!(
        gone.is_ok(),
        "the FabricTest's finalizer did not finish: {gone:?}"
    );
    let left = rules(&client).await;
    assert!(
        left.is_empty(),
        "rules left after the test's deletion: {left:#?}"
    );
    assert!(
        !cordoned(&env.read_node("plain-01").await),
        "plain-01 released"
    );

    // A node pair over two nodes whose GPUs are devices: each rank's pod claims all 8 GPUs
    // of its node through a template of its own, the real scheduler allocates the claim and
    // binds the pod, and the pair is measured.
    let pairs_began = Instant::now();
    let name = "pairs";
    env.create_test(
        name,
        json!({
            "nodeSelector": env.node_selector(),
            "nodes": ["dra-01", "good-01"],
            "suite": node_pairs_suite(),
            "agent": sim_agent(60),
        }),
    )
    .await;
    let s = wait_status(&env, name, "a run of one node pair", |s| {
        s.last_run.is_some()
    })
    .await;
    let last = last_run_name(&s);
    let run = env.run_status(&last).await;
    let np = run.node_pairs.clone().expect("the node-pair phase");
    assert!(
        np.done && np.pairs == 1 && np.measured == 1,
        "{np:#?}\n{}",
        env.operator.log_tail(80)
    );
    assert_eq!(
        (run.passed, run.failed, run.errored, run.not_measured),
        (2, 0, 0, 0),
        "{run:#?}"
    );
    assert!(
        run.findings.iter().all(|f| f.severity == Severity::Info),
        "the pair of healthy nodes passed: {:#?}",
        run.findings
    );
    let lp = ListParams::default().labels(&format!(
        "{}={last},{}=node-pair",
        gpufabric_api::keys::LABEL_RUN,
        gpufabric_api::keys::LABEL_ROLE
    ));
    let ranks = env.pods_api().list(&lp).await.expect("pods listed").items;
    let mut on: Vec<String> = Vec::new();
    for pod in &ranks {
        let spec = pod.spec.clone().expect("pod spec");
        let node = spec.node_name.clone().expect("bound by the scheduler");
        let template = spec.resource_claims.as_ref().expect("the pod's claim")[0]
            .resource_claim_template_name
            .clone();
        assert_eq!(template, Some(pod.name_any()), "a template of its own");
        assert!(
            !spec.containers[0]
                .resources
                .clone()
                .unwrap_or_default()
                .limits
                .unwrap_or_default()
                .contains_key("nvidia.com/gpu")
        );
        let claimed = pod
            .status
            .clone()
            .and_then(|s| s.resource_claim_statuses)
            .unwrap_or_default();
        assert!(
            claimed.iter().any(|c| c.resource_claim_name.is_some()),
            "the claim made from the template: {claimed:?}"
        );
        let t = templates.get(&pod.name_any()).await.expect("template read");
        assert_eq!(t.owner_references()[0].kind, "FabricTestRun");
        on.push(node);
    }
    on.sort();
    assert_eq!(on, ["dra-01", "good-01"], "one rank on each node");
    let pairs_took = pairs_began.elapsed();

    // Two tests at once, on different nodes: a GPU beyond the GPU budget, and a node whose
    // claim for its GPUs the scheduler cannot allocate.
    let edges_began = Instant::now();
    tokio::join!(
        a_gpu_beyond_the_gpu_budget_is_held_back(&env),
        a_node_whose_gpus_cannot_be_claimed_is_not_measured(&env),
    );
    eprintln!(
        "took {:.1}s (the node pair {:.1}s, the GPU budget and the unclaimable node {:.1}s)",
        began.elapsed().as_secs_f64(),
        pairs_took.as_secs_f64(),
        edges_began.elapsed().as_secs_f64()
    );
}

/// `maxQuarantinedGpus: 1` over dra-01 (GPU 3) and dra-02 (GPU 6), both failing again: the
/// first confirmed GPU is tainted, the second is held back (no rule, an `OverBudget` Event,
/// the test's status says why and how much of the budget is used), and neither node is
/// cordoned.
async fn a_gpu_beyond_the_gpu_budget_is_held_back(env: &OperatorEnv) {
    let client = env.cluster.client();
    // dra-01 fails again (it was repaired above).
    SimFleet::write_to(env.fleet.fleet().clone(), env.fleet.path()).expect("fleet rewritten");
    let name = "gpu-budget";
    env.create_test(
        name,
        json!({
            "nodeSelector": env.node_selector(),
            "nodes": ["dra-01", "dra-02"],
            "agent": sim_agent(60),
            "quarantine": {"mode": "Cordon", "maxQuarantined": "100%", "maxQuarantinedGpus": 1,
                "failuresToQuarantine": 1, "confirmRetest": true, "stormThresholdPercent": 100},
        }),
    )
    .await;
    let held_back = |s: &gpufabric_api::FabricTestStatus, node: &str| {
        s.nodes
            .iter()
            .find(|h| h.node == node)
            .and_then(|h| h.held_back.clone())
            .filter(|why| why.contains("maxQuarantinedGpus"))
    };
    let s = wait_status(env, name, "one GPU tainted, one held back", |s| {
        let one = |a: &str, b: &str| !tainted(s, a).is_empty() && held_back(s, b).is_some();
        one("dra-01", "dra-02") || one("dra-02", "dra-01")
    })
    .await;
    let (taken, held, gpu) = if tainted(&s, "dra-01") == [3] {
        ("dra-01", "dra-02", "gpu-6")
    } else {
        ("dra-02", "dra-01", "gpu-3")
    };
    assert!(tainted(&s, held).is_empty(), "{:#?}", s.nodes);
    let entry = s.nodes.iter().find(|h| h.node == held).expect("entry");
    assert!(
        matches!(&entry.standing, gpufabric_api::standing::Standing::HeldBack { why, .. }
            if why.contains("maxQuarantinedGpus")),
        "{entry:#?}"
    );
    // The budget in the status: one of one GPU used.
    let handling = s.gpu_handling.clone().expect("gpuHandling");
    assert_eq!((handling.tainted_gpus, handling.gpu_budget), (1, 1));
    // A rule for the GPU within the budget, none for the other.
    let test = env.tests_api().get(name).await.expect("test read");
    let ours: Vec<DeviceTaintRule> = rules(&client)
        .await
        .into_iter()
        .filter(|r| {
            r.owner_references()
                .iter()
                .any(|o| Some(&o.uid) == test.metadata.uid.as_ref())
        })
        .collect();
    let on: Vec<(Option<String>, Option<String>)> = ours
        .iter()
        .map(|r| {
            let d = r.spec.device_selector.clone().unwrap_or_default();
            (d.pool, d.device)
        })
        .collect();
    assert_eq!(on.len(), 1, "{on:?}");
    assert_eq!(on[0].0.as_deref(), Some(taken));
    assert!(
        on.iter()
            .all(|(pool, device)| pool.as_deref() != Some(held) && device.as_deref() != Some(gpu))
    );
    // The refusal is an Event on the node.
    let events = gpufabric_tests::events::about(&client, "default", held).await;
    assert!(
        events.iter().any(|(reason, note)| reason == "OverBudget"
            && note.contains("maxQuarantinedGpus")
            && note.contains("1 of 1 GPU(s)")),
        "{events:#?}"
    );
    for node in [taken, held] {
        assert!(!cordoned(&env.read_node(node).await), "{node} was cordoned");
    }
}

/// A DeviceTaintRule gpufabric did not make taints GPU 0 of good-01 NoSchedule: the run's
/// claim for all 8 of its GPUs (tolerating gpufabric's taint alone) cannot be allocated, the
/// pod is never scheduled, and at the run deadline the node is not measured, saying its GPUs
/// could not be claimed and what the scheduler said; it is not failed, nor cordoned.
async fn a_node_whose_gpus_cannot_be_claimed_is_not_measured(env: &OperatorEnv) {
    let client = env.cluster.client();
    let foreign = DeviceTaintRule {
        metadata: ObjectMeta {
            name: Some("maintenance-good-01-gpu-0".into()),
            ..ObjectMeta::default()
        },
        spec: DeviceTaintRuleSpec {
            device_selector: Some(DeviceTaintSelector {
                driver: Some(dra::DRIVER.into()),
                pool: Some("good-01".into()),
                device: Some("gpu-0".into()),
                ..DeviceTaintSelector::default()
            }),
            taint: DeviceTaint {
                key: "example.com/maintenance".into(),
                value: None,
                effect: "NoSchedule".into(),
                time_added: None,
            },
        },
    };
    Api::<DeviceTaintRule>::all(client.clone())
        .create(&PostParams::default(), &foreign)
        .await
        .expect("someone else's DeviceTaintRule created");
    let name = "unclaimable";
    env.create_test(
        name,
        json!({
            "nodeSelector": env.node_selector(),
            "nodes": ["good-01"],
            // The shortest deadline: 10 s and the operator's margin.
            "agent": sim_agent(10),
            "quarantine": {"mode": "Cordon", "maxQuarantined": "100%", "failuresToQuarantine": 1},
        }),
    )
    .await;
    let s = wait_status(env, name, "a run of the unclaimable node", |s| {
        s.last_run.is_some()
    })
    .await;
    let run = env.run_status(&last_run_name(&s)).await;
    let entry = run
        .nodes
        .iter()
        .find(|n| n.node == "good-01")
        .unwrap_or_else(|| panic!("good-01 not in the run: {run:#?}"));
    assert_eq!(
        entry.verdict,
        gpufabric_api::run::NodeVerdict::NotMeasured,
        "{entry:#?}"
    );
    assert_eq!(
        entry.not_measured,
        Some(gpufabric_api::outcome::NotMeasuredReason::NotScheduled)
    );
    let why = entry.reason.clone().unwrap_or_default();
    eprintln!("good-01 not measured: {why}");
    assert!(
        why.starts_with("the node's GPUs could not be claimed ("),
        "{why}"
    );
    assert!(
        why.contains(
            "the scheduler: Unschedulable: 0/4 nodes are available: 1 cannot allocate all claims"
        ),
        "the scheduler's words: {why}"
    );
    assert_eq!((run.failed, run.errored), (0, 0), "{run:#?}");
    let h = s.nodes.iter().find(|h| h.node == "good-01").expect("entry");
    assert_eq!(h.consecutive_failures, 0, "{h:#?}");
    assert!(s.quarantined_nodes.is_empty(), "{:?}", s.quarantined_nodes);
    assert!(!cordoned(&env.read_node("good-01").await));
    assert!(
        rules(&client).await.iter().all(|r| r
            .annotations()
            .get(ANNOTATION_DEVICE_QUARANTINE)
            .is_none()
            || r.spec
                .device_selector
                .as_ref()
                .and_then(|d| d.pool.as_deref())
                != Some("good-01")),
        "no rule of gpufabric on good-01"
    );
}
