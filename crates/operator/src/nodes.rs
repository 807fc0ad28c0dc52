//! Which nodes a run tests: selected by labels (and an optional list), Ready, with whole
//! idle GPUs, and not cordoned or tainted by anyone but this operator. Pure: it reads Node
//! and Pod objects, nothing else.

use crate::names;
use crate::pods::allocatable_gpus;
use gpufabric_api::keys;
use gpufabric_api::run::{SkipReason, SkippedNode};
use k8s_openapi::api::core::v1::{Node, NodeCondition, Pod, Taint, Toleration};
use kube::ResourceExt;
use std::collections::BTreeMap;

/// A node the run will test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub name: String,
    pub gpus: u32,
}

/// What decides which selected nodes a run tests.
#[derive(Debug, Clone, Copy)]
pub struct Selection<'a> {
    pub selector: &'a BTreeMap<String, String>,
    /// When set, only these nodes (names not found are reported).
    pub names: Option<&'a [String]>,
    /// The benchmark pod's tolerations: a NoSchedule/NoExecute taint they do not tolerate
    /// is someone else's (maintenance), and the node is skipped.
    pub tolerations: &'a [Toleration],
    /// GPUs held by other pods, by node ([`gpus_in_use`]).
    pub gpus_in_use: &'a BTreeMap<String, u32>,
    /// Nodes under another gpufabric run whose pod there has not ended, with that run
    /// ([`other_runs`]).
    pub other_runs: &'a BTreeMap<String, String>,
    /// Test nodes whose GPUs are partly in use anyway.
    pub include_busy: bool,
}

/// The node's Ready condition, if it reports one.
fn ready_condition(node: &Node) -> Option<&NodeCondition> {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
}

/// The node's Ready condition is True.
pub fn is_ready(node: &Node) -> bool {
    ready_condition(node).is_some_and(|c| c.status == "True")
}

/// Why the node is not Ready, from its Ready condition ("its Ready condition is Unknown
/// since 2026-11-26T14:00:00Z (NodeStatusUnknown: Kubelet stopped posting node status.)");
/// None when it is Ready.
pub fn not_ready_because(node: &Node) -> Option<String> {
    let Some(c) = ready_condition(node) else {
        return Some("it reports no Ready condition".into());
    };
    if c.status == "True" {
        return None;
    }
    let since = c
        .last_transition_time
        .as_ref()
        .map(|t| format!(" since {}", t.0))
        .unwrap_or_default();
    let why = match (c.reason.as_deref(), c.message.as_deref()) {
        (Some(r), Some(m)) => format!(" ({r}: {m})"),
        (Some(r), None) => format!(" ({r})"),
        (None, Some(m)) => format!(" ({m})"),
        (None, None) => String::new(),
    };
    Some(format!("its Ready condition is {}{since}{why}", c.status))
}

/// [`not_ready_because`] of the node named `node` in the cache; None when it is Ready or
/// not in the cache (a node removed is not a node that stopped reporting).
pub fn not_ready_in(nodes: &kube::runtime::reflector::Store<Node>, node: &str) -> Option<String> {
    nodes
        .get(&kube::runtime::reflector::ObjectRef::new(node))
        .and_then(|n| not_ready_because(&n))
}

/// The node is cordoned and no quarantine record of this operator explains it.
pub fn cordoned_by_others(node: &Node) -> bool {
    let unschedulable = node
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false);
    unschedulable && !node.annotations().contains_key(keys::ANNOTATION_QUARANTINE)
}

/// The node carries every label of `selector`.
pub fn matches_selector(node: &Node, selector: &BTreeMap<String, String>) -> bool {
    let labels = node.labels();
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// How many nodes a test selects (selector, optional name list, GPUs allocatable), whatever
/// their state: the base of a percent quarantine budget. A quarantined, cordoned or NotReady
/// node is still selected; a confirmation run's few suspects are not the base.
pub fn selected_count<'a>(
    all: impl IntoIterator<Item = &'a Node>,
    selector: &BTreeMap<String, String>,
    names: Option<&[String]>,
) -> usize {
    all.into_iter()
        .filter(|node| names.is_none_or(|list| list.contains(&node.name_any())))
        .filter(|node| matches_selector(node, selector) && allocatable_gpus(node) > 0)
        .count()
}

/// `nvidia.com/gpu` held by pods that are not gpufabric's and have not ended, by node:
/// the larger of the containers' sum and the largest init container, as the scheduler counts.
pub fn gpus_in_use<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> BTreeMap<String, u32> {
    let gpus = |c: &k8s_openapi::api::core::v1::Container| {
        c.resources
            .as_ref()
            .and_then(|r| {
                r.requests
                    .as_ref()
                    .and_then(|q| q.get(keys::RESOURCE_GPU))
                    .or_else(|| r.limits.as_ref().and_then(|q| q.get(keys::RESOURCE_GPU)))
            })
            .and_then(|q| q.0.trim().parse::<u32>().ok())
            .unwrap_or(0)
    };
    let mut used: BTreeMap<String, u32> = BTreeMap::new();
    for pod in pods {
        let ended = matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded") | Some("Failed")
        );
        if ended || pod.labels().contains_key(keys::LABEL_RUN) {
            continue;
        }
        let Some(spec) = pod.spec.as_ref() else {
            continue;
        };
        let Some(node) = spec.node_name.as_ref().filter(|n| !n.is_empty()) else {
            continue;
        };
        let main: u32 = spec.containers.iter().map(gpus).sum();
        let init = spec
            .init_containers
            .iter()
            .flatten()
            .map(gpus)
            .max()
            .unwrap_or(0);
        let n = main.max(init);
        if n > 0 {
            *used.entry(node.clone()).or_default() += n;
        }
    }
    used
}

/// The nodes where a pod of a gpufabric run other than `run` has not ended, with that
/// run: the kubelet counts such a pod's GPUs until its phase is final, which comes a moment
/// after its container ended (and its result was read), so a pod of `run` made there now
/// would be refused.
pub fn other_runs<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    run: &str,
) -> BTreeMap<String, String> {
    let mut held = BTreeMap::new();
    for pod in pods {
        let ended = matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded") | Some("Failed")
        );
        let Some(other) = pod.labels().get(keys::LABEL_RUN) else {
            continue;
        };
        if ended || other == &names::label_value(run) {
            continue;
        }
        if let Some(node) = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .filter(|n| !n.is_empty())
        {
            held.entry(node.clone()).or_insert_with(|| other.clone());
        }
    }
    held
}

/// Whether a toleration tolerates a taint (the scheduler's rule).
fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    let effect_ok = t
        .effect
        .as_deref()
        .is_none_or(|e| e.is_empty() || e == taint.effect);
    let key = t.key.as_deref().unwrap_or("");
    match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => effect_ok && (key.is_empty() || key == taint.key),
        _ => {
            effect_ok
                && key == taint.key
                && t.value.as_deref().unwrap_or("") == taint.value.as_deref().unwrap_or("")
        }
    }
}

/// The first NoSchedule/NoExecute taint the benchmark pod does not tolerate. The cordon's
/// own taint is left to [`cordoned_by_others`].
pub fn foreign_taint<'a>(node: &'a Node, tolerations: &[Toleration]) -> Option<&'a Taint> {
    node.spec.as_ref()?.taints.as_ref()?.iter().find(|t| {
        matches!(t.effect.as_str(), "NoSchedule" | "NoExecute")
            && t.key != "node.kubernetes.io/unschedulable"
            && !tolerations.iter().any(|tol| tolerates(tol, t))
    })
}

/// Why the node's `nvidia.com/gpu` are not whole physical GPUs, if they are not: MIG
/// resources, time-slicing replicas, or more GPUs than the node's GPU count label.
pub fn partitioned(node: &Node) -> Option<String> {
    let status = node.status.as_ref();
    let mig = status
        .and_then(|s| s.capacity.as_ref())
        .into_iter()
        .flatten()
        .find(|(k, q)| k.starts_with("nvidia.com/mig-") && q.0.trim() != "0")
        .map(|(k, _)| k.clone());
    if let Some(k) = mig {
        return Some(format!("MIG: the node exposes {k}"));
    }
    let labels = node.labels();
    if labels
        .get("nvidia.com/mig.strategy")
        .is_some_and(|s| s == "single")
        && labels
            .get("nvidia.com/mig.config")
            .is_some_and(|c| c != "all-disabled")
    {
        return Some("MIG: nvidia.com/gpu are MIG slices (mig.strategy single)".into());
    }
    if let Some(r) = labels
        .get("nvidia.com/gpu.replicas")
        .and_then(|r| r.parse::<u32>().ok())
        .filter(|r| *r > 1)
    {
        return Some(format!("time-sliced: {r} replicas per GPU"));
    }
    let capacity = status
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get(keys::RESOURCE_GPU))
        .and_then(|q| q.0.trim().parse::<u32>().ok());
    let count = labels
        .get(keys::LABEL_GPU_COUNT)
        .and_then(|c| c.parse::<u32>().ok());
    match (capacity, count) {
        (Some(cap), Some(count)) if count > 0 && cap > count => Some(format!(
            "shared: {cap} nvidia.com/gpu on {count} physical GPUs"
        )),
        _ => None,
    }
}

/// The node controller's taints of a node it has not seen Ready: a node that has just
/// joined carries `not-ready` until its kubelet reports Ready and the controller notices,
/// a node that stopped reporting `unreachable`. Not someone's decision to keep work away,
/// so no toleration is the answer: the node is not ready yet.
const LIFECYCLE_TAINTS: [&str; 2] = [
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
];

fn lifecycle_taint(node: &Node) -> Option<&k8s_openapi::api::core::v1::Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .find(|t| LIFECYCLE_TAINTS.contains(&t.key.as_str()) && t.effect != "PreferNoSchedule")
}

/// Why a selected GPU node is not tested now, if it is not.
fn skip_reason(node: &Node, gpus: u32, sel: &Selection) -> Option<(SkipReason, String)> {
    if node.metadata.deletion_timestamp.is_some() {
        return Some((SkipReason::Deleting, "is being deleted".into()));
    }
    if !is_ready(node) {
        return Some((SkipReason::NotReady, "is not Ready".into()));
    }
    if let Some(t) = lifecycle_taint(node) {
        return Some((
            SkipReason::NotReady,
            format!(
                "has the taint {}:{}: the node controller has not seen it Ready (it has just joined, or stopped reporting); it is tested once it is Ready",
                t.key, t.effect
            ),
        ));
    }
    if cordoned_by_others(node) {
        return Some((
            SkipReason::Cordoned,
            "is cordoned (not by this operator)".into(),
        ));
    }
    if let Some(t) = foreign_taint(node, sel.tolerations) {
        let value = t
            .value
            .as_deref()
            .map(|v| format!("={v}"))
            .unwrap_or_default();
        return Some((
            SkipReason::Tainted,
            format!(
                "has the taint {}{value}:{} (not this operator's; add a toleration to agent.tolerations to test it)",
                t.key, t.effect
            ),
        ));
    }
    if let Some(why) = partitioned(node) {
        return Some((
            SkipReason::PartitionedGpus,
            format!("has partitioned GPUs ({why}); the benchmark needs whole GPUs"),
        ));
    }
    if let Some(other) = sel.other_runs.get(&node.name_any()) {
        return Some((
            SkipReason::InOtherRun,
            format!(
                "is being tested by gpufabric run {other}, whose pod there has not ended: a node is tested by one run at a time"
            ),
        ));
    }
    let used = sel.gpus_in_use.get(&node.name_any()).copied().unwrap_or(0);
    if used > 0 && !sel.include_busy {
        return Some((
            SkipReason::Busy,
            format!(
                "is busy: other pods hold {used} of its {gpus} nvidia.com/gpu (set includeBusyNodes to test it anyway, or waitForBusyNodesSeconds to wait for it)"
            ),
        ));
    }
    None
}

/// The nodes to test, sorted by name, and the selected nodes that are left out with why.
pub fn resolve<'a>(
    all: impl IntoIterator<Item = &'a Node>,
    sel: &Selection,
) -> (Vec<Target>, Vec<SkippedNode>) {
    let mut targets = Vec::new();
    let mut skipped: Vec<SkippedNode> = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for node in all {
        let name = node.name_any();
        if sel.names.is_some_and(|list| !list.contains(&name)) {
            continue;
        }
        if !matches_selector(node, sel.selector) {
            continue;
        }
        seen.insert(name.clone());
        let gpus = allocatable_gpus(node);
        let skip = if gpus == 0 {
            // Without a list, a node without GPUs was never a candidate.
            sel.names.is_some().then(|| {
                (
                    SkipReason::NoGpus,
                    "has no allocatable nvidia.com/gpu".into(),
                )
            })
        } else {
            skip_reason(node, gpus, sel)
        };
        match skip {
            Some((reason, message)) => skipped.push(SkippedNode {
                node: name,
                reason,
                message,
            }),
            None if gpus > 0 => targets.push(Target { name, gpus }),
            None => {}
        }
    }
    if let Some(list) = sel.names {
        for n in list {
            if !seen.contains(n) && !skipped.iter().any(|s| &s.node == n) {
                skipped.push(SkippedNode {
                    node: n.clone(),
                    reason: SkipReason::NotFound,
                    message: "does not exist or does not match the nodeSelector".into(),
                });
            }
        }
    }
    targets.sort_by(|a, b| a.name.cmp(&b.name));
    targets.dedup_by(|a, b| a.name == b.name);
    skipped.sort_by(|a, b| a.node.cmp(&b.node));
    skipped.dedup_by(|a, b| a.node == b.node);
    (targets, skipped)
}

#[cfg(test)]
mod tests {
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
        assert_eq!(selected_count(&nodes, &sel, None), 4);
        let list = vec!["a".to_string(), "other".to_string()];
        assert_eq!(selected_count(&nodes, &sel, Some(&list)), 1);
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

    #[test]
    fn a_node_under_another_runs_pod_that_has_not_ended_is_not_tested_even_busy_included() {
        let mut other = gpu_pod("a", 8, "Running", true);
        if let Some(l) = other.metadata.labels.as_mut() {
            l.insert(keys::LABEL_RUN.into(), "nightly-1".into());
        }
        let mut mine = gpu_pod("b", 8, "Running", true);
        if let Some(l) = mine.metadata.labels.as_mut() {
            l.insert(keys::LABEL_RUN.into(), "nightly-1-confirm".into());
        }
        let mut ended = gpu_pod("c", 8, "Succeeded", true);
        if let Some(l) = ended.metadata.labels.as_mut() {
            l.insert(keys::LABEL_RUN.into(), "nightly-1".into());
        }
        let held = other_runs([&other, &mine, &ended], "nightly-1-confirm");
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
        };
        let (t, s) = resolve(&nodes, &sel);
        assert_eq!(names(&t), ["b"]);
        assert_eq!(s[0].reason, SkipReason::InOtherRun);
        assert!(s[0].message.contains("nightly-1"), "{}", s[0].message);
    }

    fn gpu_pod(node: &str, gpus: u32, phase: &str, ours: bool) -> Pod {
        use k8s_openapi::api::core::v1::{Container, PodSpec, PodStatus, ResourceRequirements};
        let mut p = Pod::default();
        p.metadata.name = Some(format!("{node}-{gpus}-{phase}"));
        if ours {
            p.metadata.labels = Some(BTreeMap::from([(
                keys::LABEL_RUN.to_string(),
                "r".to_string(),
            )]));
        }
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
        let pods = [
            gpu_pod("a", 4, "Running", false),
            gpu_pod("a", 2, "Pending", false),
            gpu_pod("a", 8, "Succeeded", false),
            gpu_pod("b", 8, "Failed", false),
            gpu_pod("c", 8, "Running", true),
        ];
        let used = gpus_in_use(&pods);
        assert_eq!(used, BTreeMap::from([("a".to_string(), 6)]));
    }

    #[test]
    fn busy_nodes_are_skipped_unless_the_test_opts_in() {
        let nodes = [node("a", 8, true, &[]), node("b", 8, true, &[])];
        let used = gpus_in_use(&[gpu_pod("a", 2, "Running", false)]);
        let mut sel = Selection {
            selector: &BTreeMap::new(),
            names: None,
            tolerations: &[],
            gpus_in_use: &used,
            other_runs: &BTreeMap::new(),
            include_busy: false,
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
}
