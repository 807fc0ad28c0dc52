//! `deploy/nodehealthcheck.yaml` against the real API server: medik8s NodeHealthCheck's own
//! CRD (tests/fixtures/medik8s, copied from node-healthcheck-operator) is installed, the
//! example is applied and accepted by the CRD's schema, and then what gpufabric writes on
//! real nodes is read the way NodeHealthCheck reads it: a node is unhealthy when the
//! example's selector selects it and one of its `unhealthyConditions` (type and status)
//! matches one of its conditions. A failing node matches once its failure is confirmed,
//! not while it is only suspect; passing nodes never do. (The `duration` is time NHC waits
//! on top; the condition's `lastTransitionTime` says since when it holds.)
//!
//! Build the binaries first: `cargo build --bins`, then
//! `cargo test -p gpufabric-tests --test nodehealthcheck`.

use gpufabric_api::keys::CONDITION_NODE_DEGRADED;
use gpufabric_measure::fleet::{Fault, Fleet};
use gpufabric_tests::fleet::{H100, SimFleet};
use gpufabric_tests::operator::{OperatorEnv, last_run_name, sim_agent};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;
use serde::Deserialize;
use serde_json::json;
use std::path::PathBuf;
use std::process::Output;

/// The example NodeHealthCheck, as deploy/ ships it.
fn example() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/nodehealthcheck.yaml")
}

/// NodeHealthCheck's CRD, copied from medik8s/node-healthcheck-operator.
fn crd() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/medik8s/remediation.medik8s.io_nodehealthchecks.yaml")
}

/// One entry of `spec.unhealthyConditions`.
#[derive(Deserialize, Debug, Clone, PartialEq)]
struct UnhealthyCondition {
    #[serde(rename = "type")]
    type_: String,
    status: String,
    duration: String,
}

/// What NodeHealthCheck reads of its spec to find unhealthy nodes.
#[derive(Deserialize, Debug)]
#[serde(rename_all = "camelCase")]
struct NhcSpec {
    selector: LabelSelector,
    unhealthy_conditions: Vec<UnhealthyCondition>,
}

fn ok(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Whether `selector` selects a node with `labels` (matchLabels and matchExpressions, as
/// Kubernetes evaluates a label selector).
fn selects(selector: &LabelSelector, labels: &std::collections::BTreeMap<String, String>) -> bool {
    let by_label = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let by_expression = selector.match_expressions.iter().flatten().all(|e| {
        let value = labels.get(&e.key);
        let listed = |v: &String| e.values.iter().flatten().any(|w| w == v);
        match e.operator.as_str() {
            "In" => value.is_some_and(listed),
            "NotIn" => !value.is_some_and(listed),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            other => panic!("unknown selector operator {other:?}"),
        }
    });
    by_label && by_expression
}

/// The unhealthy condition of `spec` that `node` meets, as NodeHealthCheck matches them
/// (the condition's type and status); None for a node it leaves alone.
fn unhealthy_by<'a>(spec: &'a NhcSpec, node: &Node) -> Option<&'a UnhealthyCondition> {
    if !selects(&spec.selector, node.labels()) {
        return None;
    }
    let conditions = node.status.as_ref()?.conditions.as_ref()?;
    spec.unhealthy_conditions.iter().find(|u| {
        conditions
            .iter()
            .any(|c| c.type_ == u.type_ && c.status == u.status)
    })
}

/// Three nodes; gpu-02 has a straggler GPU.
fn fleet() -> Fleet {
    let mut f = SimFleet::uniform("gpu", 3, H100, 8);
    f.nodes[1].faults.push(Fault::Straggler {
        gpu: 1,
        factor: 1.5,
    });
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_nodehealthcheck_is_accepted_and_selects_a_confirmed_failure_only() {
    let env = OperatorEnv::shared(fleet(), "nhc").await;
    let kubectl = || env.cluster.kubectl();

    // NodeHealthCheck's CRD, then the example: the API server validates it with the CRD's
    // schema (a duration NodeHealthCheck cannot read is refused: the schema is enforced).
    let crd_path = crd();
    let out = kubectl()
        .args(["apply", "-f"])
        .arg(&crd_path)
        .output()
        .expect("kubectl runs");
    ok(&out, "applying NodeHealthCheck's CRD");
    let out = kubectl()
        .args([
            "wait",
            "--for=condition=Established",
            "--timeout=30s",
            "crd/nodehealthchecks.remediation.medik8s.io",
        ])
        .output()
        .expect("kubectl runs");
    ok(&out, "the CRD is established");
    let out = kubectl()
        .args(["apply", "-f"])
        .arg(example())
        .output()
        .expect("kubectl runs");
    ok(&out, "applying deploy/nodehealthcheck.yaml");
    let bad = json!({
        "apiVersion": "remediation.medik8s.io/v1alpha1",
        "kind": "NodeHealthCheck",
        "metadata": {"name": "gpufabric-bad-duration"},
        "spec": {
            "selector": {},
            "unhealthyConditions": [
                {"type": CONDITION_NODE_DEGRADED, "status": "True", "duration": "ten minutes"}
            ]
        }
    });
    let bad_file = env.dir.path().join("bad-nhc.json");
    std::fs::write(&bad_file, bad.to_string()).expect("write");
    let out = kubectl()
        .args(["create", "-f"])
        .arg(&bad_file)
        .output()
        .expect("kubectl runs");
    assert!(
        !out.status.success() && String::from_utf8_lossy(&out.stderr).contains("duration"),
        "the CRD's schema must refuse a bad duration: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // The example as the API server stored it.
    let out = kubectl()
        .args([
            "get",
            "nodehealthcheck",
            "gpufabric-unhealthy-fabric",
            "-o",
            "json",
        ])
        .output()
        .expect("kubectl runs");
    ok(&out, "reading the NodeHealthCheck back");
    let stored: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let spec: NhcSpec =
        serde_json::from_value(stored["spec"].clone()).expect("a NodeHealthCheck spec");
    assert_eq!(
        spec.unhealthy_conditions,
        [UnhealthyCondition {
            type_: CONDITION_NODE_DEGRADED.into(),
            status: "True".into(),
            duration: "10m".into(),
        }],
        "the example remediates on the condition gpufabric writes, True as a problem"
    );

    // Two failures in a row confirm one; every run started by hand.
    env.create_test(
        "nhc",
        json!({
            "nodeSelector": env.node_selector(),
            "quarantine": {
                "mode": "Observe",
                "failuresToQuarantine": 2,
                "confirmRetest": false
            },
            "agent": sim_agent(60)
        }),
    )
    .await;

    // Run 1: gpu-02 fails once: suspect, Unknown; NodeHealthCheck leaves every node alone.
    let s1 = env.wait_folded("nhc", None).await;
    for base in ["gpu-01", "gpu-02", "gpu-03"] {
        let n = env.read_node(base).await;
        assert!(
            selects(&spec.selector, n.labels()),
            "{base}: the example selects GPU nodes: {:?}",
            n.labels()
        );
        assert_eq!(
            unhealthy_by(&spec, &n),
            None,
            "{base} after run 1: {:#?}",
            n.status.as_ref().and_then(|s| s.conditions.as_ref())
        );
    }
    let suspect = condition_of(&env.read_node("gpu-02").await);
    assert_eq!(
        suspect,
        ("Unknown".into(), "Suspect".into()),
        "{:#?}",
        s1.nodes
    );

    // Run 2: confirmed: True, and NodeHealthCheck remediates gpu-02 alone.
    env.run_now("nhc").await;
    let s2 = env.wait_folded("nhc", Some(&last_run_name(&s1))).await;
    let failing = env.read_node("gpu-02").await;
    assert_eq!(
        condition_of(&failing),
        ("True".into(), "Failed".into()),
        "{:#?}",
        s2.nodes
    );
    assert!(
        unhealthy_by(&spec, &failing).is_some(),
        "the example must select the confirmed failure: {:#?}",
        failing.status.as_ref().and_then(|s| s.conditions.as_ref())
    );
    for base in ["gpu-01", "gpu-03"] {
        let n = env.read_node(base).await;
        assert_eq!(
            condition_of(&n),
            ("False".into(), "Passed".into()),
            "{base}"
        );
        assert_eq!(unhealthy_by(&spec, &n), None, "{base} passed");
    }
}

/// Status and reason of the node's `GPUFabricDegraded` condition.
fn condition_of(n: &Node) -> (String, String) {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == CONDITION_NODE_DEGRADED))
        .map(|c| (c.status.clone(), c.reason.clone().unwrap_or_default()))
        .unwrap_or_default()
}
