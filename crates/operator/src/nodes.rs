//! Which nodes a run tests: selected by labels (and an optional list), Ready, with whole
//! idle GPUs (`nvidia.com/gpu`, or devices of the GPU driver in DRA ResourceSlices), and
//! not cordoned or tainted by anyone but this operator. Pure: it reads Node and Pod objects
//! and the GPU counts read from the slices, nothing else.

use crate::pods::allocatable_gpus;
use gpufabric_api::keys;
use gpufabric_api::run::{FabricTestRun, SkipReason, SkippedNode};
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
    /// Each node's GPUs published as DRA devices of the GPU driver, by node
    /// ([`crate::dra::claims::ClaimView::gpu_counts`]); empty where DRA is not served.
    pub dra_gpus: &'a BTreeMap<String, u32>,
}

/// How many GPUs `node` has for a run: its GPUs published as DRA devices of the GPU driver
/// (`dra_gpus`, from its ResourceSlices) where there are any, the pod then claims them;
/// else its allocatable `nvidia.com/gpu`. 0: not a GPU node.
pub fn gpu_count(node: &Node, dra_gpus: &BTreeMap<String, u32>) -> u32 {
    dra_gpus
        .get(&node.name_any())
        .copied()
        .filter(|n| *n > 0)
        .unwrap_or_else(|| allocatable_gpus(node))
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

/// How many nodes a test selects (selector, optional name list, GPUs allocatable or
/// published as DRA devices: [`gpu_count`]) and their GPUs, whatever their state: the bases
/// of a percent quarantine budget, in nodes and in GPUs. A quarantined, cordoned or NotReady
/// node is still selected; a confirmation run's few suspects are not the base.
pub fn selected<'a>(
    all: impl IntoIterator<Item = &'a Node>,
    selector: &BTreeMap<String, String>,
    names: Option<&[String]>,
    dra_gpus: &BTreeMap<String, u32>,
) -> gpufabric_health::Selected {
    all.into_iter()
        .filter(|node| names.is_none_or(|list| list.contains(&node.name_any())))
        .filter(|node| matches_selector(node, selector))
        .map(|node| gpu_count(node, dra_gpus))
        .filter(|gpus| *gpus > 0)
        .fold(gpufabric_health::Selected::default(), |s, gpus| {
            gpufabric_health::Selected {
                nodes: s.nodes + 1,
                gpus: s.gpus + gpus as usize,
            }
        })
}

/// Where the pods of this operator's runs are, and its runs: what makes a pod one of its
/// own for the busy-node rules. A label says nothing: anyone may set one.
#[derive(Debug, Clone, Copy)]
pub struct OwnPods<'a> {
    /// The namespace of the benchmark pods.
    pub namespace: &'a str,
    /// The FabricTestRuns that exist, name by UID.
    pub runs: &'a BTreeMap<String, String>,
}

impl OwnPods<'_> {
    /// The gpufabric run `pod` belongs to: only a pod in the pods' namespace whose
    /// controller is a FabricTestRun that exists. Any other pod, whatever it is labelled, is
    /// one of the cluster's other workloads.
    pub fn run_of(&self, pod: &Pod) -> Option<&str> {
        if pod.metadata.namespace.as_deref() != Some(self.namespace) {
            return None;
        }
        let owner = pod
            .owner_references()
            .iter()
            .find(|o| o.controller == Some(true))?;
        let kind = <FabricTestRun as kube::Resource>::kind(&());
        let api_version = <FabricTestRun as kube::Resource>::api_version(&());
        if owner.kind != kind || owner.api_version != api_version {
            return None;
        }
        self.runs.get(&owner.uid).map(String::as_str)
    }
}

/// `nvidia.com/gpu` held by pods that are not gpufabric's (`own`) and have not ended, by
/// node: the larger of the containers' sum and the largest init container, as the scheduler
/// counts.
pub fn gpus_in_use<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    own: &OwnPods<'_>,
) -> BTreeMap<String, u32> {
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
        if ended || own.run_of(pod).is_some() {
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

/// The nodes where a pod of a gpufabric run other than `run` (one of `own`) has not ended,
/// with that run: the kubelet counts such a pod's GPUs until its phase is final, which
/// comes a moment after its container ended (and its result was read), so a pod of `run`
/// made there now would be refused. Any other pod counts only through the GPUs it asks
/// for ([`gpus_in_use`]).
pub fn other_runs<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    run: &str,
    own: &OwnPods<'_>,
) -> BTreeMap<String, String> {
    let mut held = BTreeMap::new();
    for pod in pods {
        let ended = matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded") | Some("Failed")
        );
        let Some(other) = own.run_of(pod) else {
            continue;
        };
        if ended || other == run {
            continue;
        }
        if let Some(node) = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .filter(|n| !n.is_empty())
        {
            held.entry(node.clone())
                .or_insert_with(|| other.to_string());
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
                "is busy: other pods hold {used} of its {gpus} GPUs (nvidia.com/gpu requests or DRA ResourceClaims; set includeBusyNodes to test it anyway, or waitForBusyNodesSeconds to wait for it)"
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
        let gpus = gpu_count(node, sel.dra_gpus);
        let skip = if gpus == 0 {
            // Without a list, a node without GPUs was never a candidate.
            sel.names.is_some().then(|| {
                (
                    SkipReason::NoGpus,
                    format!(
                        "has no allocatable nvidia.com/gpu and no GPU published as a DRA device of {}",
                        gpufabric_api::device_taint::GPU_DRIVER
                    ),
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
mod tests;
