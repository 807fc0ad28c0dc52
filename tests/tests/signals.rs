//! Signals other tools read, end to end: the real `fabric-operator` against a real control
//! plane, the process-kubelet and the sim agents. After runs with one failing node and
//! healthy ones: the `GPUFabricDegraded` condition (`True`: a confirmed problem), the `gpufabric.io/result` label and the
//! last-pass annotation on the right nodes, `suspect` (and the PreferNoSchedule suspect
//! taint) on a first failure then `fail` (and the NoSchedule quarantine taint) on
//! confirmation, `Complete`/`Failed` on the runs (and `kubectl wait` on them), a node that
//! is not measured keeps its condition, and the full result documents outlive the pods.
//! And on the FabricTest itself: `Ready` within seconds of `kubectl apply` whatever its
//! schedule, so that `kubectl wait --for=condition=Ready` and GitOps tools need not wait
//! for a run.
//!
//! Build the binaries first: `cargo build --bins`, then
//! `cargo test -p gpufabric-tests --test signals`.

use gpufabric_api::keys::{
    ANNOTATION_LAST_PASS, ANNOTATION_SUSPECT_TAINT, CONDITION_NODE_DEGRADED, LABEL_NODE,
    LABEL_RESULT, LABEL_RUN, LABEL_TEST, TAINT_QUARANTINED, TAINT_SUSPECT,
};
use gpufabric_api::run::{FabricTestRun, NodeVerdict};
use gpufabric_measure::fleet::{Fault, Fleet};
use gpufabric_tests::fleet::{H100, POOL_LABEL, SimFleet};
use gpufabric_tests::operator::{OperatorEnv, last_run_name, sim_agent, taints_without_lifecycle};
use gpufabric_tests::wait;
use k8s_openapi::api::core::v1::{ConfigMap, Node, NodeCondition, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use std::time::Duration;

/// Five nodes: gpu-02 has a straggler GPU; gpu-05 is outside the selector (never tested).
fn fleet() -> Fleet {
    let mut f = SimFleet::uniform("gpu", 5, H100, 8);
    f.nodes[1].faults.push(Fault::Straggler {
        gpu: 1,
        factor: 1.5,
    });
    f.nodes[4].labels.remove(POOL_LABEL.0);
    f
}

/// Two failures in a row confirm a failure; no confirmation run (each run is started by
/// hand, so every state is seen); graduated taints; busy nodes are tested (and not
/// measured).
fn spec(env: &OperatorEnv) -> serde_json::Value {
    json!({
        "nodeSelector": env.node_selector(),
        "includeBusyNodes": true,
        "quarantine": {
            "mode": "Taint",
            "maxQuarantined": "100%",
            "failuresToQuarantine": 2,
            "passesToRelease": 1,
            "confirmRetest": false,
            "graduatedTaints": true
        },
        "agent": sim_agent(60)
    })
}

fn degraded(n: &Node) -> Option<NodeCondition> {
    n.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == CONDITION_NODE_DEGRADED)
        .cloned()
}

/// The node's taints as `key:effect`, without the node lifecycle controller's.
fn taints_of(n: &Node) -> Vec<String> {
    taints_without_lifecycle(n)
        .into_iter()
        .map(|t| format!("{}:{}", t.key, t.effect))
        .collect()
}

fn result_label(n: &Node) -> Option<&str> {
    n.labels().get(LABEL_RESULT).map(String::as_str)
}

fn status_reason(c: &Option<NodeCondition>) -> (String, String) {
    c.as_ref()
        .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
        .unwrap_or_default()
}

fn condition_status(run: &FabricTestRun, type_: &str) -> Option<String> {
    run.status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_carry_the_condition_label_and_last_pass_of_their_latest_judgement() {
    let env = OperatorEnv::shared(fleet(), "signals").await;
    let tests = env.create_test("sig", spec(&env)).await;

    // Run 1: gpu-02 fails once of the two needed: suspect, condition Unknown.
    let s1 = env.wait_folded("sig", None).await;
    let run1 = last_run_name(&s1);
    let n2 = env.read_node("gpu-02").await;
    assert_eq!(result_label(&n2), Some("suspect"), "{:#?}", s1.nodes);
    assert_eq!(
        status_reason(&degraded(&n2)),
        ("Unknown".into(), "Suspect".into())
    );
    let msg = degraded(&n2).and_then(|c| c.message).unwrap_or_default();
    assert!(
        msg.contains(&run1) && msg.contains("not yet confirmed"),
        "{msg}"
    );
    assert!(!n2.annotations().contains_key(ANNOTATION_LAST_PASS));
    assert_eq!(
        taints_of(&n2),
        [format!("{TAINT_SUSPECT}:PreferNoSchedule")],
        "a suspect is avoided, not refused"
    );
    assert_eq!(
        n2.annotations().get(ANNOTATION_SUSPECT_TAINT),
        Some(&"sig".to_string()),
        "the suspect taint is recorded as ours"
    );
    let mut passed_since = Vec::new();
    for base in ["gpu-01", "gpu-03", "gpu-04"] {
        let n = env.read_node(base).await;
        assert_eq!(result_label(&n), Some("pass"), "{base}");
        let c = degraded(&n);
        assert_eq!(
            status_reason(&c),
            ("False".into(), "Passed".into()),
            "{base}"
        );
        let stamp = n
            .annotations()
            .get(ANNOTATION_LAST_PASS)
            .cloned()
            .unwrap_or_default();
        assert!(
            chrono::DateTime::parse_from_rfc3339(&stamp).is_ok(),
            "{base}: last-pass {stamp:?}"
        );
        passed_since.push(c.and_then(|c| c.last_transition_time));
        // The kubelet's own conditions are still there beside ours.
        assert!(
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready")),
            "{base}: Ready kept"
        );
    }
    // A node no test selects carries no signal.
    let untested = env.read_node("gpu-05").await;
    assert_eq!(result_label(&untested), None);
    assert_eq!(degraded(&untested), None);

    // The run is Complete, and kubectl waits on it.
    let runs: Api<FabricTestRun> = env.runs_api();
    let r1 = runs.get(&run1).await.expect("run 1");
    assert_eq!(condition_status(&r1, "Complete").as_deref(), Some("True"));
    assert_eq!(condition_status(&r1, "Failed").as_deref(), Some("False"));
    let out = env
        .cluster
        .kubectl()
        .args(["wait", "--for=condition=Complete", "--timeout=30s", "-n"])
        .arg(&env.ns)
        .arg(format!("ftr/{run1}"))
        .output()
        .expect("kubectl runs");
    assert!(
        out.status.success(),
        "kubectl wait: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // The test is Ready: its latest run is judged.
    let t = tests.get("sig").await.expect("test");
    assert!(
        t.status.as_ref().is_some_and(|s| s
            .conditions
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True")),
        "{:#?}",
        t.status
    );

    // Run 2: gpu-02 fails again: confirmed, condition True, label fail, cordoned.
    env.run_now("sig").await;
    let s2 = env.wait_folded("sig", Some(&run1)).await;
    let n2 = env.read_node("gpu-02").await;
    assert_eq!(result_label(&n2), Some("fail"), "{:#?}", s2.nodes);
    assert_eq!(
        status_reason(&degraded(&n2)),
        ("True".into(), "Failed".into())
    );
    assert_eq!(
        taints_of(&n2),
        [format!("{TAINT_QUARANTINED}:NoSchedule")],
        "confirmed: the quarantine taint replaces the suspect one"
    );
    assert!(!n2.annotations().contains_key(ANNOTATION_SUSPECT_TAINT));
    for base in ["gpu-01", "gpu-03", "gpu-04"] {
        assert!(taints_of(&env.read_node(base).await).is_empty(), "{base}");
    }
    for (i, base) in ["gpu-01", "gpu-03", "gpu-04"].iter().enumerate() {
        let c = degraded(&env.read_node(base).await);
        assert_eq!(
            status_reason(&c),
            ("False".into(), "Passed".into()),
            "{base}"
        );
        assert_eq!(
            c.and_then(|c| c.last_transition_time),
            passed_since[i],
            "{base}: the transition time stays while the status does"
        );
    }

    // Run 3: a training job holds every GPU of gpu-03: not measured. Its condition and label
    // stay as run 2 left them; never True.
    let before = degraded(&env.read_node("gpu-03").await);
    let pods: Api<Pod> = Api::namespaced(env.cluster.client(), &env.ns);
    pods.create(&PostParams::default(), &gpu_holder(&env, "gpu-03"))
        .await
        .expect("holder pod");
    env.run_now("sig").await;
    let s3 = env.wait_folded("sig", Some(&last_run_name(&s2))).await;
    let h3 = s3
        .nodes
        .iter()
        .find(|n| n.node == env.node("gpu-03"))
        .expect("gpu-03 in history");
    assert_eq!(h3.verdict, NodeVerdict::NotMeasured, "{h3:#?}");
    let n3 = env.read_node("gpu-03").await;
    assert_eq!(
        degraded(&n3),
        before,
        "not measured: the condition is left alone"
    );
    assert_eq!(result_label(&n3), Some("pass"));

    // The full result documents outlive the pods: delete every benchmark pod, then read
    // gpu-01's latest document back as docs/signals.md says.
    let run3 = last_run_name(&s3);
    let bench = ListParams::default().labels(&format!("{LABEL_TEST}=sig"));
    pods.delete_collection(&DeleteParams::default(), &bench)
        .await
        .expect("benchmark pods deleted");
    let gone = wait::poll(
        "benchmark pods deleted",
        Duration::from_secs(60),
        Duration::from_millis(300),
        || async {
            Ok(pods
                .list(&bench)
                .await
                .ok()
                .filter(|l| l.items.is_empty())
                .map(|_| ()))
        },
    )
    .await;
    assert!(gone.is_ok(), "benchmark pods still there: {gone:?}");
    let node1 = env.node("gpu-01");
    let out = env
        .cluster
        .kubectl()
        .args(["get", "cm", "-n", &env.ns, "-l"])
        .arg(format!("{LABEL_NODE}={node1}"))
        .args(["-o", r"jsonpath={.items[0].data.result\.json}"])
        .output()
        .expect("kubectl runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!(
            "the stored document is not JSON ({e}): {text:?} {}\noperator log:\n{}",
            String::from_utf8_lossy(&out.stderr),
            env.operator.log_tail(40)
        )
    });
    assert_eq!(doc["node"], node1.as_str(), "the document of gpu-01");
    let cms: Api<ConfigMap> = Api::namespaced(env.cluster.client(), &env.ns);
    let stored = cms
        .list(&ListParams::default().labels(&format!("{LABEL_TEST}=sig")))
        .await
        .expect("configmaps listed")
        .items;
    let of = |base: &str| {
        stored
            .iter()
            .find(|c| c.labels().get(LABEL_NODE) == Some(&env.node(base)))
            .unwrap_or_else(|| panic!("no stored result for {base}: {stored:#?}"))
    };
    assert_eq!(
        of("gpu-01").labels().get(LABEL_RUN),
        Some(&run3),
        "latest run only"
    );
    assert_eq!(
        of("gpu-03").labels().get(LABEL_RUN).map(String::as_str),
        Some(last_run_name(&s2).as_str()),
        "not measured in run 3: the document of run 2 stays"
    );
    assert_eq!(stored.len(), 4, "one per tested node: {stored:#?}");
    assert!(
        of("gpu-01")
            .owner_references()
            .iter()
            .any(|o| o.kind == "FabricTest" && o.name == "sig"),
        "owned by the FabricTest"
    );

    // Deleting the test removes the signals its runs wrote last, and only those: gpu-05's
    // condition (written by someone else) and every node's counters record stay.
    let nodes: Api<Node> = Api::all(env.cluster.client());
    let foreign = json!({"status": {"conditions": [{
        "type": CONDITION_NODE_DEGRADED, "status": "False", "reason": "Passed",
        "message": "FabricTest other, run other-1: passed"
    }]}});
    nodes
        .patch_status(
            &env.node("gpu-05"),
            &PatchParams::default(),
            &Patch::Strategic(&foreign),
        )
        .await
        .expect("a condition written by another test");
    tests
        .delete("sig", &DeleteParams::default())
        .await
        .expect("delete the test");
    wait::for_deletion(&tests, "sig", Duration::from_secs(60))
        .await
        .expect("the test is gone");
    for base in ["gpu-01", "gpu-02", "gpu-03", "gpu-04"] {
        let n = env.read_node(base).await;
        assert_eq!(degraded(&n), None, "{base}: condition left");
        assert_eq!(result_label(&n), None, "{base}: label left");
        assert!(
            !n.annotations().contains_key(ANNOTATION_LAST_PASS),
            "{base}: last-pass left"
        );
        assert!(
            n.annotations()
                .contains_key(gpufabric_api::keys::ANNOTATION_COUNTERS),
            "{base}: the counters record belongs to the hardware"
        );
        assert!(
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready")),
            "{base}: the kubelet's Ready condition stays"
        );
    }
    let other = degraded(&env.read_node("gpu-05").await);
    assert!(
        other
            .and_then(|c| c.message)
            .is_some_and(|m| m.contains("FabricTest other")),
        "another test's condition stays"
    );
}

/// A pod of someone else's that holds every GPU of `base` (bound there, sleeping).
fn gpu_holder(env: &OperatorEnv, base: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": format!("training-{base}"), "namespace": env.ns},
        "spec": {
            "nodeName": env.node(base),
            "restartPolicy": "Never",
            "containers": [{
                "name": "train",
                "image": "example.com/train:1",
                "command": ["sleep", "600"],
                "resources": {"limits": {"nvidia.com/gpu": "8"}}
            }]
        }
    }))
    .expect("valid pod")
}

/// `Ready` means the spec is accepted, not that a run was judged: a test whose schedule is
/// weeks away, and a suspended one, are Ready within seconds of their creation (as
/// `kubectl wait` sees it), with no run started and their health not yet known.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_test_is_ready_within_seconds_of_its_creation_whatever_its_schedule() {
    let env = OperatorEnv::shared(SimFleet::uniform("gpu", 2, H100, 8), "ready").await;
    let far = |suspend: bool| {
        json!({
            "nodeSelector": env.node_selector(),
            // Once a year, on 1 January at 00:00: far from any moment this test runs at
            // but its last few minutes of a year.
            "schedule": "0 0 1 1 *",
            "suspend": suspend,
            "agent": sim_agent(60)
        })
    };
    for (name, suspend, reason) in [
        ("ready-far", false, "Scheduled"),
        ("ready-suspended", true, "Suspended"),
    ] {
        let created = std::time::Instant::now();
        let tests = env.create_test(name, far(suspend)).await;
        let out = env
            .cluster
            .kubectl()
            .args(["wait", "--for=condition=Ready", "--timeout=20s"])
            .arg(format!("ft/{name}"))
            .output()
            .expect("kubectl runs");
        assert!(
            out.status.success(),
            "{name}: kubectl wait --for=condition=Ready: {}{}\noperator log:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            env.operator.log_tail(40)
        );
        eprintln!("{name}: Ready {:?} after its creation", created.elapsed());
        let status = tests
            .get(name)
            .await
            .expect("the test")
            .status
            .unwrap_or_default();
        let condition = |type_: &str| {
            status
                .conditions
                .iter()
                .find(|c| c.type_ == type_)
                .map(|c| (c.status.clone(), c.reason.clone()))
                .unwrap_or_default()
        };
        assert_eq!(condition("Ready"), ("True".into(), reason.into()), "{name}");
        assert_eq!(
            condition("Degraded"),
            ("Unknown".into(), "NoRunJudged".into()),
            "{name}"
        );
        assert!(
            status.last_run.is_none() && status.active_run.is_none(),
            "{name}: {status:?}"
        );
        assert!(env.runs_of(name).await.is_empty(), "{name}: no run started");
        assert_eq!(
            status.next_schedule_time.is_some(),
            !suspend,
            "{name}: a next run time only when not suspended"
        );
    }
}
