//! The quarantine executor against a real API server: budget, modes, ownership, races and
//! release, on Node objects created directly (no kubelet, and no controller-manager node
//! lifecycle or TTL controller, so that nothing but the executor and the "person" in each
//! test changes a node). The tests share one control plane: each labels its nodes and
//! prefixes its FabricTests with its own id, and node names differ between tests (creating
//! a node that exists fails the test).
//!
//! Needs the control-plane binaries (`tests/cluster/build.sh`). Run with
//! `cargo test -p gpufabric-tests --test quarantine`.

use gpufabric_api::keys::{ANNOTATION_QUARANTINE, LABEL_QUARANTINED, TAINT_QUARANTINED};
use gpufabric_api::policy::{QuarantineMode, QuarantinePolicy};
use gpufabric_api::quarantine::QuarantineRecord;
use gpufabric_api::run::{NodeVerdict, Trigger};
use gpufabric_api::test::{FabricTest, FabricTestSpec, NodeHealth};
use gpufabric_health::quarantine::{Enforcement, Hold, Plan, plan};
use gpufabric_operator::events::{Events, Reporter};
use gpufabric_operator::quarantine::{
    self, Action, NodeObservation, Outcome, QuarantineMetrics, is_unschedulable, taints_of,
};
use gpufabric_tests::cluster::ClusterOptions;
use gpufabric_tests::shared::TestEnv;
use k8s_openapi::api::core::v1::{Node, NodeSpec, Taint};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::collections::BTreeMap;

/// What one test needs: its share of the control plane, a client, the recorder and
/// metrics the operator would pass.
struct Env {
    env: TestEnv,
    client: Client,
    recorder: Events,
    metrics: QuarantineMetrics,
}

/// The shared control plane of this binary: the controller-manager runs (namespaces,
/// service accounts) without the controllers that write to Node objects.
fn control_plane() -> ClusterOptions {
    ClusterOptions {
        controller_manager_args: vec![
            "--controllers=*,-node-lifecycle-controller,-ttl-controller".into(),
        ],
        ..ClusterOptions::default()
    }
}

async fn env() -> Env {
    let env = TestEnv::with_options("quarantine", control_plane())
        .await
        .expect("local control plane starts (build it with tests/cluster/build.sh)");
    let client = env.client();
    let recorder = Events::new(client.clone(), Reporter::from("fabric-operator"));
    Env {
        env,
        client,
        recorder,
        metrics: QuarantineMetrics::default(),
    }
}

/// A GPU node as GPU pools have them: product labels and the common `nvidia.com/gpu` taint.
fn gpu_node(e: &Env, name: &str) -> Node {
    let (env_key, env_id) = e.env.label();
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([
                (env_key.to_string(), env_id.to_string()),
                (
                    "nvidia.com/gpu.product".to_string(),
                    "NVIDIA-H200".to_string(),
                ),
                ("nvidia.com/gpu.count".to_string(), "8".to_string()),
            ])),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: Some(vec![Taint {
                key: "nvidia.com/gpu".into(),
                value: Some("present".into()),
                effect: "NoSchedule".into(),
                time_added: None,
            }]),
            ..Default::default()
        }),
        status: Some(k8s_openapi::api::core::v1::NodeStatus {
            capacity: Some(BTreeMap::from([(
                "nvidia.com/gpu".to_string(),
                Quantity("8".into()),
            )])),
            ..Default::default()
        }),
    }
}

async fn create_nodes(e: &Env, names: &[&str]) {
    let nodes: Api<Node> = Api::all(e.client.clone());
    for n in names {
        nodes
            .create(&PostParams::default(), &gpu_node(e, n))
            .await
            .expect("node created");
    }
}

/// A `maxQuarantined` as a share of the selected nodes, such as `"50%"`.
fn percent(share: &str) -> IntOrString {
    IntOrString::String(share.into())
}

/// The FabricTest `name`, prefixed with the test's id (FabricTests are cluster-scoped).
async fn create_test(e: &Env, name: &str, mode: QuarantineMode, max: IntOrString) -> FabricTest {
    let spec = FabricTestSpec {
        quarantine: QuarantinePolicy {
            mode,
            max_quarantined: max,
            failures_to_quarantine: 1,
            passes_to_release: 1,
            confirm_retest: true,
            release_on_delete: true,
            ..QuarantinePolicy::default()
        },
        ..FabricTestSpec::default()
    };
    let api: Api<FabricTest> = Api::all(e.client.clone());
    api.create(
        &PostParams::default(),
        &FabricTest::new(&e.env.node(name), spec),
    )
    .await
    .expect("FabricTest created")
}

async fn get(client: &Client, name: &str) -> Node {
    let nodes: Api<Node> = Api::all(client.clone());
    nodes.get(name).await.expect("node readable")
}

/// This test's nodes.
async fn all_nodes(e: &Env) -> BTreeMap<String, serde_json::Value> {
    let nodes: Api<Node> = Api::all(e.client.clone());
    nodes
        .list(&ListParams::default().labels(&e.env.selector()))
        .await
        .expect("nodes listed")
        .items
        .into_iter()
        .map(|n| {
            (
                n.name_any(),
                serde_json::to_value(&n).expect("node serializes"),
            )
        })
        .collect()
}

fn health(node: &str, failing: bool) -> NodeHealth {
    NodeHealth {
        node: node.into(),
        verdict: if failing {
            NodeVerdict::Failed
        } else {
            NodeVerdict::Passed
        },
        consecutive_failures: u32::from(failing),
        consecutive_passes: u32::from(!failing),
        quarantined_since: None,
        held_back: None,
        last_finding: None,
        last_run: Some("run-1".into()),
        ..Default::default()
    }
}

/// What the controller does after a confirmation run: observe, plan, execute.
async fn observe_plan_execute(
    e: &Env,
    test: &FabricTest,
    nodes: &[&str],
    bad: &[&str],
) -> (Plan, Outcome) {
    let names: Vec<String> = nodes.iter().map(|s| s.to_string()).collect();
    let observed = quarantine::observe(&e.client, test, &names)
        .await
        .expect("observe");
    let facts: Vec<_> = observed
        .iter()
        .map(|o| o.facts(health(&o.node, bad.contains(&o.node.as_str())), true))
        .collect();
    let p = plan(
        &facts,
        &test.spec.quarantine,
        nodes.len(),
        Trigger::Confirmation,
    );
    let outcome = execute(e, test, &p).await;
    (p, outcome)
}

async fn execute(e: &Env, test: &FabricTest, p: &Plan) -> Outcome {
    let reasons: BTreeMap<String, String> = p
        .quarantine
        .iter()
        .map(|n| {
            (
                n.clone(),
                format!("GPU pair 0-1 on {n} copies at 110 GB/s, expected >= 300 GB/s"),
            )
        })
        .collect();
    quarantine::execute(
        &e.client,
        &e.recorder,
        &e.metrics,
        test,
        "run-1",
        p,
        &reasons,
    )
    .await
    .expect("execute")
}

/// A plan made by hand, acting in `test`'s mode: the executor applies what a plan says.
fn plan_of(test: &FabricTest, quarantine: &[&str], release: &[&str], budget: usize) -> Plan {
    Plan {
        quarantine: quarantine.iter().map(|s| s.to_string()).collect(),
        enforcement: Enforcement::of(test.spec.quarantine.mode),
        release: release.iter().map(|s| s.to_string()).collect(),
        budget,
        ..Plan::default()
    }
}

fn record_of(node: &Node) -> Option<QuarantineRecord> {
    QuarantineRecord::from_annotations(node.metadata.annotations.as_ref()).expect("readable record")
}

fn key(test: &FabricTest) -> String {
    quarantine::test_key(test).expect("test key")
}

/// Reasons of the Events (events.k8s.io) about the object named `name` in `ns`.
async fn event_reasons(client: &Client, ns: &str, name: &str) -> Vec<String> {
    let events: Api<K8sEvent> = Api::namespaced(client.clone(), ns);
    let mut reasons: Vec<String> = events
        .list(&ListParams::default())
        .await
        .expect("events listed")
        .items
        .into_iter()
        .filter(|ev| ev.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter_map(|ev| ev.reason)
        .collect();
    reasons.sort();
    reasons
}

/// (reason, type) of the Events about the object named `name` in `ns`.
async fn event_kinds(client: &Client, ns: &str, name: &str) -> Vec<(String, String)> {
    let events: Api<K8sEvent> = Api::namespaced(client.clone(), ns);
    events
        .list(&ListParams::default())
        .await
        .expect("events listed")
        .items
        .into_iter()
        .filter(|ev| ev.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .map(|ev| (ev.reason.unwrap_or_default(), ev.type_.unwrap_or_default()))
        .collect()
}

async fn cordon_as_a_person(client: &Client, name: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({
                "metadata": {"annotations": {"ops.example.com/ticket": "RMA-1234"}},
                "spec": {"unschedulable": true}
            })),
        )
        .await
        .expect("person cordons");
}

#[tokio::test]
async fn cordons_at_most_budget_nodes() {
    let e = env().await;
    let nodes = ["n1", "n2", "n3", "n4", "n5", "n6"];
    create_nodes(&e, &nodes).await;
    let test = create_test(&e, "nightly", QuarantineMode::Cordon, IntOrString::Int(2)).await;

    let (p, outcome) = observe_plan_execute(&e, &test, &nodes, &["n1", "n2", "n3", "n4"]).await;
    assert_eq!(
        p.quarantine.len(),
        2,
        "the planner keeps to the budget: {p:?}"
    );
    assert_eq!(outcome.quarantined_nodes().len(), 2);
    let mut cordoned_now = Vec::new();
    for n in &nodes {
        if is_unschedulable(&get(&e.client, n).await) {
            cordoned_now.push(n.to_string());
        }
    }
    assert_eq!(cordoned_now, outcome.quarantined_nodes());
    assert_eq!(outcome.nodes_with(Action::OverBudget).len(), 2);
    assert_eq!(e.metrics.quarantined(&key(&test)), 2);
    for n in ["n3", "n4"] {
        let node = get(&e.client, n).await;
        assert!(
            !is_unschedulable(&node),
            "{n} must not be cordoned over budget"
        );
        assert!(record_of(&node).is_none());
    }
}

#[tokio::test]
async fn budget_of_one_with_three_bad_nodes_cordons_one_and_reports_two_over_budget() {
    let e = env().await;
    let nodes = ["a1", "a2", "a3", "a4"];
    create_nodes(&e, &nodes).await;
    let test = create_test(&e, "nightly", QuarantineMode::Cordon, IntOrString::Int(1)).await;

    let (p, outcome) = observe_plan_execute(&e, &test, &nodes, &["a1", "a2", "a3"]).await;
    assert_eq!(
        p.quarantine,
        vec!["a1".to_string()],
        "worst first, then by name"
    );
    assert_eq!(outcome.quarantined_nodes(), vec!["a1".to_string()]);
    let over = outcome.nodes_with(Action::OverBudget);
    assert_eq!(over, vec!["a2".to_string(), "a3".to_string()]);
    for n in ["a2", "a3"] {
        let why = &outcome.held_back[n];
        assert!(why.contains("budget"), "{n}: {why}");
        assert!(!is_unschedulable(&get(&e.client, n).await));
    }
    let a1 = get(&e.client, "a1").await;
    assert!(is_unschedulable(&a1));
    let record = record_of(&a1).expect("a1 has our record");
    assert_eq!(record.test, key(&test));
    assert_eq!(record.run, "run-1");
    assert!(record.cordoned && record.labeled && !record.tainted);
    assert!(record.reason.contains("110 GB/s"), "{}", record.reason);
    assert_eq!(
        a1.labels().get(LABEL_QUARANTINED).map(String::as_str),
        Some("true")
    );

    // Every action leaves an Event on the node and on the FabricTest, and a metric.
    assert_eq!(
        event_reasons(&e.client, "default", "a1").await,
        vec!["Quarantined"]
    );
    assert_eq!(
        event_reasons(&e.client, "default", "a2").await,
        vec!["OverBudget"]
    );
    let on_test = event_reasons(&e.client, "default", &test.name_any()).await;
    assert_eq!(
        on_test,
        vec!["OverBudget", "OverBudget", "Quarantined"],
        "{on_test:?}"
    );
    assert_eq!(e.metrics.action_count(&key(&test), "quarantined"), 1);
    assert_eq!(e.metrics.action_count(&key(&test), "over_budget"), 2);
    assert_eq!(e.metrics.quarantined(&key(&test)), 1);

    // The status the controller writes from the outcome.
    let mut status = gpufabric_api::test::FabricTestStatus {
        nodes: nodes.iter().map(|n| health(n, *n != "a4")).collect(),
        ..Default::default()
    };
    outcome.apply_to_status(&mut status);
    assert_eq!(status.quarantined_count, 1);
    assert!(status.nodes[0].quarantined_since.is_some());
    assert!(
        status.nodes[1]
            .held_back
            .as_deref()
            .is_some_and(|h| h.contains("budget"))
    );
    assert!(status.nodes[3].held_back.is_none());
}

#[tokio::test]
async fn a_node_cordoned_by_a_person_is_never_touched() {
    let e = env().await;
    let nodes = ["p1", "p2"];
    create_nodes(&e, &nodes).await;
    cordon_as_a_person(&e.client, "p1").await;
    let before = get(&e.client, "p1").await;
    let test = create_test(&e, "nightly", QuarantineMode::Cordon, IntOrString::Int(5)).await;

    let observed = quarantine::observe(&e.client, &test, &["p1".to_string()])
        .await
        .expect("observe");
    assert!(observed[0].cordoned_by_others && !observed[0].quarantined_by_us);

    // The planner holds it back; a stale plan that names it anyway is refused.
    let (p, outcome) = observe_plan_execute(&e, &test, &nodes, &["p1"]).await;
    assert_eq!(p.hold_of("p1"), Some(Hold::CordonedByOthers));
    assert!(
        outcome.held_back["p1"].contains("cordoned by someone else"),
        "{outcome:?}"
    );
    let outcome = execute(&e, &test, &plan_of(&test, &["p1"], &["p1"], 5)).await;
    assert_eq!(
        outcome.nodes_with(Action::LeftAlone),
        vec!["p1".to_string()]
    );
    assert!(outcome.quarantined.is_empty());
    quarantine::release_all(&e.client, &e.recorder, &e.metrics, &test)
        .await
        .expect("release_all");

    // Reported, but as Normal: a person's cordon is not a problem to warn about.
    let kinds = event_kinds(&e.client, "default", "p1").await;
    assert!(
        !kinds.is_empty()
            && kinds
                .iter()
                .all(|k| k == &("LeftAlone".to_string(), "Normal".to_string())),
        "{kinds:?}"
    );
    let after = get(&e.client, "p1").await;
    assert_eq!(
        serde_json::to_value(&after).expect("json"),
        serde_json::to_value(&before).expect("json"),
        "the person's node is unchanged, resourceVersion included"
    );
}

#[tokio::test]
async fn taint_mode_adds_exactly_our_taint_and_release_removes_only_ours() {
    let e = env().await;
    create_nodes(&e, &["t1", "t2"]).await;
    let before = get(&e.client, "t1").await;
    let test = create_test(&e, "nightly", QuarantineMode::Taint, IntOrString::Int(1)).await;

    let (_, outcome) = observe_plan_execute(&e, &test, &["t1", "t2"], &["t1"]).await;
    assert_eq!(outcome.quarantined_nodes(), vec!["t1".to_string()]);
    let node = get(&e.client, "t1").await;
    let taints = taints_of(&node);
    // Exactly the taints it had (the API server's admission adds
    // node.kubernetes.io/not-ready to new nodes), plus ours at the end.
    let theirs = taints_of(&before);
    assert_eq!(taints.len(), theirs.len() + 1, "{taints:?}");
    assert_eq!(
        taints[..theirs.len()],
        theirs[..],
        "foreign taints kept as they were"
    );
    let last = &taints[theirs.len()];
    assert_eq!(
        (last.key.as_str(), last.effect.as_str()),
        (TAINT_QUARANTINED, "NoSchedule")
    );
    assert!(!is_unschedulable(&node), "Taint mode does not cordon");
    let record = record_of(&node).expect("record");
    assert!(record.tainted && record.labeled && !record.cordoned);

    // Someone adds a taint of their own while the node is quarantined; it stays.
    let nodes: Api<Node> = Api::all(e.client.clone());
    let mut with_theirs = taints.clone();
    with_theirs.push(Taint {
        key: "maintenance.example.com/disk".into(),
        value: None,
        effect: "NoExecute".into(),
        time_added: None,
    });
    nodes
        .patch(
            "t1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": with_theirs}})),
        )
        .await
        .expect("someone adds a taint");

    let outcome = execute(&e, &test, &plan_of(&test, &[], &["t1"], 1)).await;
    assert_eq!(outcome.nodes_with(Action::Released), vec!["t1".to_string()]);
    let after = get(&e.client, "t1").await;
    let mut expected = theirs.clone();
    expected.push(with_theirs[with_theirs.len() - 1].clone());
    assert_eq!(taints_of(&after), expected, "only our taint is gone");
    assert_eq!(after.metadata.labels, before.metadata.labels);
    assert!(!after.annotations().contains_key(ANNOTATION_QUARANTINE));
    assert_eq!(e.metrics.quarantined(&key(&test)), 0);
}

#[tokio::test]
async fn label_mode_only_labels_and_release_removes_the_label() {
    let e = env().await;
    create_nodes(&e, &["l1", "l2"]).await;
    let before = get(&e.client, "l1").await;
    let test = create_test(&e, "nightly", QuarantineMode::Label, percent("50%")).await;

    let (_, outcome) = observe_plan_execute(&e, &test, &["l1", "l2"], &["l1"]).await;
    assert_eq!(outcome.quarantined_nodes(), vec!["l1".to_string()]);
    let node = get(&e.client, "l1").await;
    assert_eq!(
        node.labels().get(LABEL_QUARANTINED).map(String::as_str),
        Some("true")
    );
    assert!(!is_unschedulable(&node));
    assert_eq!(taints_of(&node), taints_of(&before));
    let record = record_of(&node).expect("record");
    assert_eq!(record.mode, QuarantineMode::Label);
    assert!(record.labeled && !record.cordoned && !record.tainted);

    let outcome = execute(&e, &test, &plan_of(&test, &[], &["l1"], 1)).await;
    assert_eq!(outcome.nodes_with(Action::Released), vec!["l1".to_string()]);
    let after = get(&e.client, "l1").await;
    assert_eq!(after.metadata.labels, before.metadata.labels);
    assert_eq!(after.spec, before.spec);
    assert!(after.metadata.annotations.unwrap_or_default().is_empty());
}

#[tokio::test]
async fn observe_mode_changes_no_node() {
    let e = env().await;
    let nodes = ["o1", "o2", "o3"];
    create_nodes(&e, &nodes).await;
    let before = all_nodes(&e).await;
    let test = create_test(&e, "nightly", QuarantineMode::Observe, IntOrString::Int(3)).await;

    let (p, outcome) = observe_plan_execute(&e, &test, &nodes, &["o1", "o2"]).await;
    assert!(p.quarantine.is_empty());
    assert_eq!(
        outcome.nodes_with(Action::WouldQuarantine),
        vec!["o1".to_string(), "o2".to_string()]
    );
    assert_eq!(
        p.enforcement, None,
        "Observe mode changes nothing on a node"
    );
    assert!(outcome.held_back["o1"].contains("would quarantine"));
    assert!(outcome.quarantined.is_empty());

    assert_eq!(all_nodes(&e).await, before, "no Node object changed at all");
    assert_eq!(
        event_reasons(&e.client, "default", "o1").await,
        vec!["WouldQuarantine"]
    );
    assert_eq!(e.metrics.action_count(&key(&test), "would_quarantine"), 2);
}

#[tokio::test]
async fn releasing_what_another_fabric_test_quarantined_is_refused() {
    let e = env().await;
    create_nodes(&e, &["x1"]).await;
    let theirs = create_test(&e, "team-b", QuarantineMode::Cordon, IntOrString::Int(1)).await;
    let ours = create_test(&e, "nightly", QuarantineMode::Cordon, IntOrString::Int(1)).await;
    let (_, outcome) = observe_plan_execute(&e, &theirs, &["x1"], &["x1"]).await;
    assert_eq!(outcome.quarantined_nodes(), vec!["x1".to_string()]);
    let held = get(&e.client, "x1").await;

    let observed = quarantine::observe(&e.client, &ours, &["x1".to_string()])
        .await
        .expect("observe");
    assert_eq!(
        observed[0].quarantined_by_other_test.as_deref(),
        Some(key(&theirs).as_str())
    );
    assert!(
        observed[0]
            .facts(health("x1", false), true)
            .cordoned_by_others
    );

    let outcome = execute(&e, &ours, &plan_of(&ours, &["x1"], &["x1"], 1)).await;
    assert_eq!(
        outcome.nodes_with(Action::LeftAlone),
        vec!["x1".to_string(), "x1".to_string()]
    );
    assert!(
        outcome.held_back["x1"].contains(&key(&theirs)),
        "{outcome:?}"
    );
    assert!(outcome.quarantined.is_empty());
    let released = quarantine::release_all(&e.client, &e.recorder, &e.metrics, &ours)
        .await
        .expect("release_all");
    assert!(released.is_empty());
    assert_eq!(
        serde_json::to_value(get(&e.client, "x1").await).expect("json"),
        serde_json::to_value(&held).expect("json"),
        "team-b's quarantine is untouched"
    );
}

#[tokio::test]
async fn a_node_quarantined_by_the_namespaced_form_of_a_test_is_released_by_the_test_of_that_name()
{
    let e = env().await;
    create_nodes(&e, &["v1"]).await;
    let before = get(&e.client, "v1").await;
    // What an operator of the namespaced v1alpha1 form left: cordon, label and a record
    // naming the test `<namespace>/<name>`.
    let old_key = format!("gpu/{}", e.env.node("nightly"));
    let old = QuarantineRecord {
        test: old_key.clone(),
        run: "nightly-28990000".into(),
        reason: "GPU pair 0-1 copies at 110 GB/s".into(),
        since: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-11-01T02:00:00Z".parse().expect("timestamp"),
        ),
        mode: QuarantineMode::Cordon,
        cordoned: true,
        tainted: false,
        labeled: true,
    };
    let patch = serde_json::json!({
        "metadata": {
            "labels": {LABEL_QUARANTINED: "true"},
            "annotations": {ANNOTATION_QUARANTINE: old.to_annotation()}
        },
        "spec": {"unschedulable": true}
    });
    Api::<Node>::all(e.client.clone())
        .patch("v1", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("old quarantine written");
    let other = create_test(&e, "weekly", QuarantineMode::Cordon, IntOrString::Int(1)).await;
    let observed = quarantine::observe(&e.client, &other, &["v1".to_string()])
        .await
        .expect("observe");
    assert_eq!(
        observed[0].quarantined_by_other_test.as_deref(),
        Some(old_key.as_str()),
        "another test still may not touch it"
    );

    let test = create_test(&e, "nightly", QuarantineMode::Cordon, IntOrString::Int(1)).await;
    let observed = quarantine::observe(&e.client, &test, &["v1".to_string()])
        .await
        .expect("observe");
    assert!(observed[0].quarantined_by_us, "{:?}", observed[0]);
    assert_eq!(
        quarantine::quarantined_by(&e.client, &test)
            .await
            .expect("records")
            .len(),
        1
    );
    let outcome = execute(&e, &test, &plan_of(&test, &[], &["v1"], 1)).await;
    assert_eq!(outcome.nodes_with(Action::Released), vec!["v1".to_string()]);
    let after = get(&e.client, "v1").await;
    assert!(!is_unschedulable(&after));
    assert!(record_of(&after).is_none());
    assert_eq!(after.metadata.labels, before.metadata.labels);
}

#[tokio::test]
async fn release_all_on_delete_releases_its_cordons_and_only_those() {
    let e = env().await;
    let nodes = ["d1", "d2", "d3"];
    create_nodes(&e, &nodes).await;
    let before = all_nodes(&e).await;
    let test = create_test(&e, "nightly", QuarantineMode::Cordon, IntOrString::Int(3)).await;
    cordon_as_a_person(&e.client, "d3").await;
    let d3 = get(&e.client, "d3").await;
    let (_, outcome) = observe_plan_execute(&e, &test, &nodes, &["d1", "d2", "d3"]).await;
    assert_eq!(
        outcome.quarantined_nodes(),
        vec!["d1".to_string(), "d2".to_string()]
    );

    let mut released = quarantine::release_all(&e.client, &e.recorder, &e.metrics, &test)
        .await
        .expect("release_all");
    released.sort();
    assert_eq!(released, vec!["d1".to_string(), "d2".to_string()]);
    let after = all_nodes(&e).await;
    for n in ["d1", "d2"] {
        let (a, b) = (&after[n], &before[n]);
        assert_eq!(a["spec"], b["spec"], "{n}: cordon undone");
        assert_eq!(
            a["metadata"]["labels"], b["metadata"]["labels"],
            "{n}: label removed"
        );
        assert!(
            a["metadata"]["annotations"]
                .get(ANNOTATION_QUARANTINE)
                .is_none()
        );
    }
    assert_eq!(
        after["d3"],
        serde_json::to_value(&d3).expect("json"),
        "the person's cordon stays"
    );
}

#[tokio::test]
async fn release_on_delete_false_keeps_the_quarantine() {
    let e = env().await;
    create_nodes(&e, &["k1"]).await;
    let mut test = create_test(&e, "nightly", QuarantineMode::Cordon, IntOrString::Int(1)).await;
    observe_plan_execute(&e, &test, &["k1"], &["k1"]).await;
    let held = get(&e.client, "k1").await;
    test.spec.quarantine.release_on_delete = false;
    let released = quarantine::release_all(&e.client, &e.recorder, &e.metrics, &test)
        .await
        .expect("release_all");
    assert!(released.is_empty());
    assert_eq!(
        serde_json::to_value(get(&e.client, "k1").await).expect("json"),
        serde_json::to_value(&held).expect("json")
    );
    assert!(
        event_reasons(&e.client, "default", &test.name_any())
            .await
            .contains(&"QuarantineKept".to_string())
    );
}

#[tokio::test]
async fn a_cordon_made_between_observe_and_execute_is_never_claimed_or_undone() {
    let e = env().await;
    create_nodes(&e, &["r1", "r2"]).await;
    let test = create_test(&e, "nightly", QuarantineMode::Cordon, IntOrString::Int(2)).await;

    // r1: the person cordons after the controller observed and planned.
    let names = vec!["r1".to_string()];
    let observed = quarantine::observe(&e.client, &test, &names)
        .await
        .expect("observe");
    assert!(!observed[0].cordoned_by_others);
    let facts = vec![observed[0].facts(health("r1", true), true)];
    let p = plan(&facts, &test.spec.quarantine, 2, Trigger::Confirmation);
    assert_eq!(p.quarantine, names);
    cordon_as_a_person(&e.client, "r1").await;
    let outcome = execute(&e, &test, &p).await;
    assert_eq!(outcome.nodes_with(Action::LeftAlone), names);

    // r2: cordoned by the person before anything ran. (A cordon between the executor's
    // read and its patch is refused by the resourceVersion guard: the executor's unit
    // tests answer the patch with 409 Conflict and check that it reads again.)
    cordon_as_a_person(&e.client, "r2").await;

    for n in ["r1", "r2"] {
        let node = get(&e.client, n).await;
        assert!(
            record_of(&node).is_none(),
            "{n}: no claim on the person's cordon"
        );
        assert!(!node.labels().contains_key(LABEL_QUARANTINED));
    }
    // Later releases (the plan, or deleting the test) leave the person's cordons alone.
    execute(&e, &test, &plan_of(&test, &[], &["r1", "r2"], 2)).await;
    quarantine::release_all(&e.client, &e.recorder, &e.metrics, &test)
        .await
        .expect("release_all");
    for n in ["r1", "r2"] {
        assert!(
            is_unschedulable(&get(&e.client, n).await),
            "{n} stays cordoned"
        );
    }
}

#[tokio::test]
async fn an_unreadable_record_leaves_the_node_alone() {
    let e = env().await;
    create_nodes(&e, &["u1"]).await;
    let nodes: Api<Node> = Api::all(e.client.clone());
    nodes
        .patch(
            "u1",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {ANNOTATION_QUARANTINE: "quarantined by bob"}}}),
            ),
        )
        .await
        .expect("annotated");
    let before = get(&e.client, "u1").await;
    let test = create_test(&e, "nightly", QuarantineMode::Cordon, IntOrString::Int(1)).await;
    let observed: Vec<NodeObservation> = quarantine::observe(&e.client, &test, &["u1".to_string()])
        .await
        .expect("observe");
    assert!(observed[0].record_error.is_some());
    let outcome = execute(&e, &test, &plan_of(&test, &["u1"], &["u1"], 1)).await;
    assert_eq!(outcome.nodes_with(Action::Unreadable).len(), 2);
    assert!(
        outcome.held_back["u1"].contains("not a quarantine record"),
        "{outcome:?}"
    );
    assert_eq!(
        serde_json::to_value(get(&e.client, "u1").await).expect("json"),
        serde_json::to_value(&before).expect("json")
    );
    // A Warning: nobody can tell what was done to this node, a person has to look.
    assert!(event_kinds(&e.client, "default", "u1").await.contains(&(
        "QuarantineRecordUnreadable".to_string(),
        "Warning".to_string()
    )));
}

#[tokio::test]
async fn a_deleted_node_no_longer_counts_against_the_budget() {
    let e = env().await;
    create_nodes(&e, &["g1", "g2"]).await;
    let test = create_test(&e, "nightly", QuarantineMode::Cordon, IntOrString::Int(1)).await;
    observe_plan_execute(&e, &test, &["g1", "g2"], &["g1"]).await;
    let nodes: Api<Node> = Api::all(e.client.clone());
    nodes
        .delete("g1", &Default::default())
        .await
        .expect("node deleted");
    // The record went with the Node object, so the budget is free again: g2 can be
    // quarantined, and g1 no longer counts or shows as quarantined.
    let (_, outcome) = observe_plan_execute(&e, &test, &["g1", "g2"], &["g2"]).await;
    assert_eq!(outcome.quarantined_nodes(), vec!["g2".to_string()]);
    assert_eq!(e.metrics.quarantined(&key(&test)), 1);
}

#[tokio::test]
async fn two_fabric_tests_racing_for_the_same_nodes_never_both_claim_one() {
    let e = env().await;
    let names: Vec<String> = (1..=20).map(|i| format!("c{i:02}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    create_nodes(&e, &refs).await;
    let a = create_test(&e, "team-a", QuarantineMode::Cordon, IntOrString::Int(20)).await;
    let b = create_test(&e, "team-b", QuarantineMode::Taint, IntOrString::Int(20)).await;
    let (plan_a, plan_b) = (plan_of(&a, &refs, &[], 20), plan_of(&b, &refs, &[], 20));
    // The same plan, executed by both at once (interleaved at every request). Whichever
    // reads a node second either sees the first one's record, or sends a patch with a
    // stale resourceVersion that the API server refuses; the deterministic version of
    // that race is a_cordon_made_between_observe_and_execute_is_never_claimed_or_undone.
    let (oa, ob) = tokio::join!(execute(&e, &a, &plan_a), execute(&e, &b, &plan_b));
    assert!(
        oa.errors.is_empty() && ob.errors.is_empty(),
        "{oa:?} {ob:?}"
    );
    for n in &names {
        let node = get(&e.client, n).await;
        let record = record_of(&node).expect("claimed by one of them");
        let (won, lost) = if record.test == key(&a) {
            (&oa, &ob)
        } else {
            (&ob, &oa)
        };
        assert!(won.quarantined.contains_key(n), "{n}");
        assert!(!lost.quarantined.contains_key(n), "{n}: claimed by both");
        assert!(
            lost.held_back[n].contains(&record.test),
            "{n}: {}",
            lost.held_back[n]
        );
        // Exactly the winner's changes are on the node.
        assert_eq!(is_unschedulable(&node), record.cordoned, "{n}");
        let ours = taints_of(&node)
            .iter()
            .filter(|t| t.key == TAINT_QUARANTINED)
            .count();
        assert_eq!(ours, usize::from(record.tainted), "{n}");
    }
    assert_eq!(oa.quarantined.len() + ob.quarantined.len(), names.len());
}

#[tokio::test]
async fn quarantine_of_a_large_fleet_keeps_to_the_budget() {
    let e = env().await;
    let names: Vec<String> = (1..=300).map(|i| format!("big-{i:03}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    create_nodes(&e, &refs).await;
    let test = create_test(&e, "nightly", QuarantineMode::Cordon, percent("10%")).await;
    let bad: Vec<&str> = refs.iter().copied().step_by(7).collect(); // 43 failing nodes
    let t0 = std::time::Instant::now();
    let (p, outcome) = observe_plan_execute(&e, &test, &refs, &bad).await;
    let quarantine_s = t0.elapsed().as_secs_f64();
    assert_eq!(p.budget, 30);
    assert_eq!(outcome.quarantined.len(), 30);
    assert_eq!(outcome.nodes_with(Action::OverBudget).len(), bad.len() - 30);
    let cordoned = all_nodes(&e)
        .await
        .values()
        .filter(|n| n["spec"]["unschedulable"] == json!(true))
        .count();
    assert_eq!(cordoned, 30);
    let t1 = std::time::Instant::now();
    let released = quarantine::release_all(&e.client, &e.recorder, &e.metrics, &test)
        .await
        .expect("release_all");
    let release_s = t1.elapsed().as_secs_f64();
    assert_eq!(released.len(), 30);
    eprintln!(
        "300 nodes, 43 failing, budget 10%: observe+plan+execute {quarantine_s:.2} s \
         (30 cordoned, 13 over budget, each with 2 Events), release_all {release_s:.2} s"
    );
}

#[tokio::test]
async fn a_budget_that_cannot_be_read_quarantines_nothing_and_says_why() {
    let e = env().await;
    create_nodes(&e, &["b1"]).await;
    let test = create_test(&e, "nightly", QuarantineMode::Cordon, IntOrString::Int(1)).await;
    // What the planner returns for a budget it cannot read (the CRD schema keeps such a
    // value out of the API server, but an older CRD or a direct etcd write might not).
    let mut policy = test.spec.quarantine.clone();
    policy.max_quarantined = IntOrString::String("ten".into());
    let observed = quarantine::observe(&e.client, &test, &["b1".to_string()])
        .await
        .expect("observe");
    let facts = vec![observed[0].facts(health("b1", true), true)];
    let p = plan(&facts, &policy, 1, Trigger::Confirmation);
    assert!(p.budget_error.is_some() && p.quarantine.is_empty(), "{p:?}");
    let outcome = execute(&e, &test, &p).await;
    assert_eq!(
        outcome.nodes_with(Action::OverBudget),
        vec!["b1".to_string()]
    );
    assert!(!is_unschedulable(&get(&e.client, "b1").await));
    assert!(
        event_kinds(&e.client, "default", &test.name_any())
            .await
            .contains(&("InvalidBudget".to_string(), "Warning".to_string()))
    );
}
