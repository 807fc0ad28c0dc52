//! Unit tests of node selection: readiness, taints, cordons, busy and partitioned GPUs,
//! and nodes under another run.
use super::*;
use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

fn node(name: &str, gpus: u32, ready: bool, labels: &[(&str, &str)]) -> Node {
    let mut n = Node::default();
    n.metadata.name = Some(name.into());
    n.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    n.status = Some(NodeStatus {
        allocatable: Some(BTreeMap::from([(
            "nvidia.com/gpu".to_string(),
            Quantity(gpus.to_string()),
        )])),
        conditions: Some(vec![NodeCondition {
            type_: "Ready".into(),
            status: if ready { "True" } else { "False" }.into(),
            ..Default::default()
        }]),
        ..Default::default()
    });
    n
}

fn cordon(mut n: Node, ours: bool) -> Node {
    n.spec = Some(NodeSpec {
        unschedulable: Some(true),
        ..Default::default()
    });
    if ours {
        n.metadata.annotations = Some(BTreeMap::from([(
            keys::ANNOTATION_QUARANTINE.to_string(),
            "{}".to_string(),
        )]));
    }
    n
}

fn names(t: &[Target]) -> Vec<&str> {
    t.iter().map(|t| t.name.as_str()).collect()
}

#[test]
fn a_node_that_is_not_ready_says_why_from_its_condition() {
    assert_eq!(not_ready_because(&node("a", 8, true, &[])), None);
    let mut n = node("a", 8, false, &[]);
    assert_eq!(
        not_ready_because(&n).as_deref(),
        Some("its Ready condition is False")
    );
    if let Some(c) = n
        .status
        .as_mut()
        .and_then(|s| s.conditions.as_mut())
        .and_then(|c| c.first_mut())
    {
        c.status = "Unknown".into();
        c.reason = Some("NodeStatusUnknown".into());
        c.message = Some("Kubelet stopped posting node status.".into());
        c.last_transition_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-11-26T14:00:00Z".parse().expect("time"),
        ));
    }
    assert_eq!(
        not_ready_because(&n).as_deref(),
        Some(
            "its Ready condition is Unknown since 2026-11-26T14:00:00Z (NodeStatusUnknown: Kubelet stopped posting node status.)"
        )
    );
    n.status = None;
    assert_eq!(
        not_ready_because(&n).as_deref(),
        Some("it reports no Ready condition")
    );
}

fn resolve_plain<'a>(
    all: impl IntoIterator<Item = &'a Node>,
    selector: &BTreeMap<String, String>,
    names: Option<&[String]>,
) -> (Vec<Target>, Vec<SkippedNode>) {
    resolve(
        all,
        &Selection {
            selector,
            names,
            tolerations: &[],
            gpus_in_use: &BTreeMap::new(),
            other_runs: &BTreeMap::new(),
            include_busy: false,
            dra_gpus: &BTreeMap::new(),
        },
    )
}

#[test]
fn selects_ready_gpu_nodes_matching_the_selector() {
    let nodes = [
        node("b", 8, true, &[("pool", "h100")]),
        node("a", 8, true, &[("pool", "h100")]),
        node("c", 8, true, &[("pool", "a100")]),
        node("cpu", 0, true, &[("pool", "h100")]),
        node("sick", 8, false, &[("pool", "h100")]),
    ];
    let sel = BTreeMap::from([("pool".to_string(), "h100".to_string())]);
    let (t, s) = resolve_plain(&nodes, &sel, None);
    assert_eq!(names(&t), ["a", "b"]);
    assert_eq!(t[0].gpus, 8);
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].node, "sick");
}

#[test]
fn budget_base_counts_every_selected_gpu_node_whatever_its_state() {
    let nodes = [
        node("a", 8, true, &[("pool", "h100")]),
        cordon(node("ours", 8, true, &[("pool", "h100")]), true),
        cordon(node("theirs", 8, true, &[("pool", "h100")]), false),
        node("sick", 8, false, &[("pool", "h100")]),
        node("cpu", 0, true, &[("pool", "h100")]),
        node("other", 8, true, &[("pool", "a100")]),
    ];
    let sel = BTreeMap::from([("pool".to_string(), "h100".to_string())]);
    let none = BTreeMap::new();
    assert_eq!(selected(&nodes, &sel, None, &none).nodes, 4);
    assert_eq!(selected(&nodes, &sel, None, &none).gpus, 32);
    let list = vec!["a".to_string(), "other".to_string()];
    assert_eq!(selected(&nodes, &sel, Some(&list), &none).nodes, 1);
}

/// The GPUs `node` publishes as DRA devices of the GPU driver, as the slices say.
fn published(node: &str, gpus: u32) -> BTreeMap<String, u32> {
    BTreeMap::from([(node.to_string(), gpus)])
}

#[test]
fn a_node_whose_gpus_are_only_dra_devices_is_selected_with_its_devices_count() {
    let nodes = [node("dra", 0, true, &[]), node("plain", 8, true, &[])];
    let dra = published("dra", 4);
    let (t, s) = resolve(
        &nodes,
        &Selection {
            selector: &BTreeMap::new(),
            names: None,
            tolerations: &[],
            gpus_in_use: &BTreeMap::new(),
            other_runs: &BTreeMap::new(),
            include_busy: false,
            dra_gpus: &dra,
        },
    );
    assert!(s.is_empty(), "{s:?}");
    assert_eq!(
        t,
        [
            Target {
                name: "dra".into(),
                gpus: 4
            },
            Target {
                name: "plain".into(),
                gpus: 8
            }
        ]
    );
    // It is in the budget's base, nodes and GPUs.
    let base = selected(&nodes, &BTreeMap::new(), None, &dra);
    assert_eq!((base.nodes, base.gpus), (2, 12));
}

#[test]
fn a_node_with_devices_counts_them_not_its_nvidia_gpu() {
    // A node with both: its pod claims the devices, so the devices are its GPUs.
    assert_eq!(
        gpu_count(&node("both", 8, true, &[]), &published("both", 4)),
        4
    );
    assert_eq!(
        gpu_count(&node("plain", 8, true, &[]), &published("other", 4)),
        8
    );
    assert_eq!(
        gpu_count(&node("none", 0, true, &[]), &published("none", 0)),
        0
    );
}

#[test]
fn a_listed_node_with_neither_nvidia_gpu_nor_devices_is_skipped_saying_both() {
    let nodes = [node("cpu", 0, true, &[]), node("dra", 0, true, &[])];
    let dra = published("dra", 8);
    let list = vec!["cpu".to_string(), "dra".to_string()];
    let (t, s) = resolve(
        &nodes,
        &Selection {
            selector: &BTreeMap::new(),
            names: Some(&list),
            tolerations: &[],
            gpus_in_use: &BTreeMap::new(),
            other_runs: &BTreeMap::new(),
            include_busy: false,
            dra_gpus: &dra,
        },
    );
    assert_eq!(names(&t), ["dra"]);
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].node, "cpu");
    assert_eq!(s[0].reason, SkipReason::NoGpus);
    assert_eq!(
        s[0].message,
        "has no allocatable nvidia.com/gpu and no GPU published as a DRA device of gpu.nvidia.com"
    );
    // Without a list, a node with neither is no candidate at all.
    let (t, s) = resolve_plain(&nodes, &BTreeMap::new(), None);
    assert!(t.is_empty() && s.is_empty(), "{t:?} {s:?}");
}

#[test]
fn nodes_cordoned_by_others_are_left_out_but_our_quarantined_nodes_are_tested() {
    let nodes = [
        cordon(node("theirs", 8, true, &[]), false),
        cordon(node("ours", 8, true, &[]), true),
    ];
    let (t, s) = resolve_plain(&nodes, &BTreeMap::new(), None);
    assert_eq!(names(&t), ["ours"]);
    assert_eq!(s[0].node, "theirs");
}

#[test]
fn an_explicit_list_limits_the_nodes_and_reports_missing_ones() {
    let nodes = [node("a", 4, true, &[]), node("b", 4, true, &[])];
    let list = vec!["b".to_string(), "ghost".to_string()];
    let (t, s) = resolve_plain(&nodes, &BTreeMap::new(), Some(&list));
    assert_eq!(names(&t), ["b"]);
    assert_eq!(s.len(), 1);
    assert_eq!(s[0].node, "ghost");
}

/// The runs that exist in these tests, name by UID, and where their pods are.
fn runs() -> BTreeMap<String, String> {
    BTreeMap::from([
        ("uid-n1".to_string(), "nightly-1".to_string()),
        ("uid-c1".to_string(), "nightly-1-confirm".to_string()),
    ])
}

const POD_NS: &str = "gpufabric";

/// A pod of run `uid` in the pods' namespace, as the operator makes it (controller owner,
/// labelled with the run).
fn run_pod(node: &str, phase: &str, uid: &str, run: &str) -> Pod {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    let mut p = gpu_pod(node, 8, phase, false);
    p.metadata.namespace = Some(POD_NS.into());
    p.metadata.labels = Some(BTreeMap::from([(
        keys::LABEL_RUN.to_string(),
        run.to_string(),
    )]));
    p.metadata.owner_references = Some(vec![OwnerReference {
        api_version: format!("{}/{}", gpufabric_api::GROUP, gpufabric_api::VERSION),
        kind: "FabricTestRun".into(),
        name: run.into(),
        uid: uid.into(),
        controller: Some(true),
        ..Default::default()
    }]);
    p
}

#[test]
fn a_node_under_another_runs_pod_that_has_not_ended_is_not_tested_even_busy_included() {
    let runs = runs();
    let own = OwnPods {
        namespace: POD_NS,
        runs: &runs,
    };
    let other = run_pod("a", "Running", "uid-n1", "nightly-1");
    let mine = run_pod("b", "Running", "uid-c1", "nightly-1-confirm");
    let ended = run_pod("c", "Succeeded", "uid-n1", "nightly-1");
    let held = other_runs([&other, &mine, &ended], "nightly-1-confirm", &own);
    assert_eq!(
        held,
        BTreeMap::from([("a".to_string(), "nightly-1".to_string())])
    );
    let nodes = [node("a", 8, true, &[]), node("b", 8, true, &[])];
    let sel = Selection {
        selector: &BTreeMap::new(),
        names: None,
        tolerations: &[],
        gpus_in_use: &BTreeMap::new(),
        other_runs: &held,
        include_busy: true,
        dra_gpus: &BTreeMap::new(),
    };
    let (t, s) = resolve(&nodes, &sel);
    assert_eq!(names(&t), ["b"]);
    assert_eq!(s[0].reason, SkipReason::InOtherRun);
    assert!(s[0].message.contains("nightly-1"), "{}", s[0].message);
}

#[test]
fn a_pod_labelled_as_a_run_hides_no_node_and_counts_by_the_gpus_it_asks_for() {
    let runs = runs();
    let own = OwnPods {
        namespace: POD_NS,
        runs: &runs,
    };
    // In a tenant's namespace, labelled and even owned like a run's pod.
    let mut tenant = run_pod("a", "Running", "uid-n1", "nightly-1");
    tenant.metadata.namespace = Some("tenant".into());
    // In the pods' namespace, labelled, with no owner.
    let mut unowned = run_pod("b", "Running", "uid-n1", "nightly-1");
    unowned.metadata.owner_references = None;
    // Owned by a run that does not exist.
    let orphan = run_pod("c", "Running", "uid-gone", "nightly-0");
    // Owned by the run, but not as its controller.
    let mut not_controller = run_pod("d", "Running", "uid-n1", "nightly-1");
    if let Some(o) = not_controller.metadata.owner_references.as_mut() {
        o[0].controller = None;
    }
    let pods = [tenant, unowned, orphan, not_controller];
    assert_eq!(
        other_runs(&pods, "nightly-1-confirm", &own),
        BTreeMap::new()
    );
    assert_eq!(
        gpus_in_use(&pods, &own),
        BTreeMap::from([
            ("a".to_string(), 8),
            ("b".to_string(), 8),
            ("c".to_string(), 8),
            ("d".to_string(), 8),
        ])
    );
}

fn gpu_pod(node: &str, gpus: u32, phase: &str, ours: bool) -> Pod {
    use k8s_openapi::api::core::v1::{Container, PodSpec, PodStatus, ResourceRequirements};
    let mut p = if ours {
        run_pod(node, phase, "uid-n1", "nightly-1")
    } else {
        let mut p = Pod::default();
        p.metadata.namespace = Some("ml".into());
        p
    };
    p.metadata.name = Some(format!("{node}-{gpus}-{phase}"));
    p.spec = Some(PodSpec {
        node_name: Some(node.into()),
        containers: vec![Container {
            name: "train".into(),
            resources: Some(ResourceRequirements {
                limits: Some(BTreeMap::from([(
                    keys::RESOURCE_GPU.to_string(),
                    Quantity(gpus.to_string()),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    });
    p.status = Some(PodStatus {
        phase: Some(phase.into()),
        ..Default::default()
    });
    p
}

#[test]
fn gpus_in_use_counts_only_other_pods_that_have_not_ended() {
    let runs = runs();
    let own = OwnPods {
        namespace: POD_NS,
        runs: &runs,
    };
    let pods = [
        gpu_pod("a", 4, "Running", false),
        gpu_pod("a", 2, "Pending", false),
        gpu_pod("a", 8, "Succeeded", false),
        gpu_pod("b", 8, "Failed", false),
        gpu_pod("c", 8, "Running", true),
    ];
    let used = gpus_in_use(&pods, &own);
    assert_eq!(used, BTreeMap::from([("a".to_string(), 6)]));
}

#[test]
fn busy_nodes_are_skipped_unless_the_test_opts_in() {
    let nodes = [node("a", 8, true, &[]), node("b", 8, true, &[])];
    let runs = runs();
    let own = OwnPods {
        namespace: POD_NS,
        runs: &runs,
    };
    let used = gpus_in_use(&[gpu_pod("a", 2, "Running", false)], &own);
    let mut sel = Selection {
        selector: &BTreeMap::new(),
        names: None,
        tolerations: &[],
        gpus_in_use: &used,
        other_runs: &BTreeMap::new(),
        include_busy: false,
        dra_gpus: &BTreeMap::new(),
    };
    let (t, s) = resolve(&nodes, &sel);
    assert_eq!(names(&t), ["b"]);
    assert_eq!((s[0].node.as_str(), s[0].reason), ("a", SkipReason::Busy));
    assert!(s[0].message.contains("2 of its 8"), "{}", s[0].message);
    sel.include_busy = true;
    assert_eq!(names(&resolve(&nodes, &sel).0), ["a", "b"]);
}

fn taint(mut n: Node, key: &str, effect: &str) -> Node {
    n.spec.get_or_insert_with(Default::default).taints = Some(vec![Taint {
        key: key.into(),
        value: Some("true".into()),
        effect: effect.into(),
        ..Default::default()
    }]);
    n
}

#[test]
fn a_foreign_taint_skips_the_node_unless_the_agent_tolerates_it() {
    let nodes = [
        taint(
            node("maint", 8, true, &[]),
            "example.com/maintenance",
            "NoSchedule",
        ),
        taint(
            node("soft", 8, true, &[]),
            "example.com/maintenance",
            "PreferNoSchedule",
        ),
        taint(node("gpu", 8, true, &[]), "nvidia.com/gpu", "NoSchedule"),
        taint(
            node("ours", 8, true, &[]),
            keys::TAINT_QUARANTINED,
            "NoSchedule",
        ),
    ];
    let tolerations = [
        Toleration {
            key: Some("nvidia.com/gpu".into()),
            operator: Some("Exists".into()),
            ..Default::default()
        },
        Toleration {
            key: Some(keys::TAINT_QUARANTINED.into()),
            operator: Some("Exists".into()),
            ..Default::default()
        },
    ];
    let (t, s) = resolve(
        &nodes,
        &Selection {
            selector: &BTreeMap::new(),
            names: None,
            tolerations: &tolerations,
            gpus_in_use: &BTreeMap::new(),
            other_runs: &BTreeMap::new(),
            include_busy: false,
            dra_gpus: &BTreeMap::new(),
        },
    );
    assert_eq!(names(&t), ["gpu", "ours", "soft"]);
    assert_eq!(s.len(), 1);
    assert_eq!(
        (s[0].node.as_str(), s[0].reason),
        ("maint", SkipReason::Tainted)
    );
    assert!(
        s[0].message
            .contains("example.com/maintenance=true:NoSchedule")
    );
}

#[test]
fn a_node_that_just_joined_is_not_ready_not_tainted() {
    let joined = taint(
        node("joined", 8, true, &[]),
        "node.kubernetes.io/not-ready",
        "NoSchedule",
    );
    let gone = taint(
        node("gone", 8, true, &[]),
        "node.kubernetes.io/unreachable",
        "NoExecute",
    );
    let (t, s) = resolve_plain(&[joined, gone], &BTreeMap::new(), None);
    assert!(t.is_empty());
    assert_eq!(s.len(), 2);
    for skipped in &s {
        assert_eq!(skipped.reason, SkipReason::NotReady, "{skipped:?}");
        assert!(
            skipped.message.contains("tested once it is Ready")
                && !skipped.message.contains("toleration"),
            "{}",
            skipped.message
        );
    }
}

#[test]
fn mig_and_time_sliced_nodes_are_skipped_not_judged() {
    let mut mig = node("mig", 1, true, &[]);
    if let Some(st) = mig.status.as_mut() {
        st.capacity = Some(BTreeMap::from([(
            "nvidia.com/mig-1g.10gb".to_string(),
            Quantity("7".into()),
        )]));
    }
    let mut sliced = node("sliced", 32, true, &[(keys::LABEL_GPU_COUNT, "8")]);
    if let Some(st) = sliced.status.as_mut() {
        st.capacity = Some(BTreeMap::from([(
            keys::RESOURCE_GPU.to_string(),
            Quantity("32".into()),
        )]));
    }
    let replicas = node("replicas", 8, true, &[("nvidia.com/gpu.replicas", "4")]);
    let whole = node("whole", 8, true, &[(keys::LABEL_GPU_COUNT, "8")]);
    let (t, s) = resolve_plain(&[mig, sliced, replicas, whole], &BTreeMap::new(), None);
    assert_eq!(names(&t), ["whole"]);
    assert!(
        s.iter().all(|s| s.reason == SkipReason::PartitionedGpus),
        "{s:?}"
    );
    assert_eq!(s.len(), 3);
    assert!(s[0].message.contains("mig-1g.10gb"), "{}", s[0].message);
}
