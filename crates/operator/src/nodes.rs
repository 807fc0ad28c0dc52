//! Which nodes a run tests: selected by labels (and an optional list), Ready, with GPUs,
//! and not cordoned by anyone but this operator. Pure: it reads Node objects, nothing else.

use crate::pods::allocatable_gpus;
use gpufabric_api::keys;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use std::collections::BTreeMap;

/// A node the run will test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub name: String,
    pub gpus: u32,
}

/// Why a node that the selector or list named is not tested.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Skipped {
    pub name: String,
    pub reason: String,
}

/// The node's Ready condition is True.
pub fn is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
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

/// The nodes to test, sorted by name, and the selected nodes that are left out with why.
/// `names`, when set, limits the run to those nodes (names not found are reported).
pub fn resolve<'a>(
    all: impl IntoIterator<Item = &'a Node>,
    selector: &BTreeMap<String, String>,
    names: Option<&[String]>,
) -> (Vec<Target>, Vec<Skipped>) {
    let mut targets = Vec::new();
    let mut skipped = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for node in all {
        let name = node.name_any();
        if names.is_some_and(|list| !list.contains(&name)) {
            continue;
        }
        if !matches_selector(node, selector) {
            continue;
        }
        seen.insert(name.clone());
        let gpus = allocatable_gpus(node);
        let skip = |reason: &str| Skipped {
            name: name.clone(),
            reason: reason.to_string(),
        };
        if gpus == 0 {
            // Without a list, a node without GPUs was never a candidate.
            if names.is_some() {
                skipped.push(skip("has no allocatable nvidia.com/gpu"));
            }
        } else if node.metadata.deletion_timestamp.is_some() {
            skipped.push(skip("is being deleted"));
        } else if !is_ready(node) {
            skipped.push(skip("is not Ready"));
        } else if cordoned_by_others(node) {
            skipped.push(skip("is cordoned (not by this operator)"));
        } else {
            targets.push(Target { name, gpus });
        }
    }
    if let Some(list) = names {
        for n in list {
            if !seen.contains(n) && !targets.iter().any(|t| &t.name == n) {
                let reason = "does not exist or does not match the nodeSelector";
                if !skipped.iter().any(|s| &s.name == n) {
                    skipped.push(Skipped {
                        name: n.clone(),
                        reason: reason.into(),
                    });
                }
            }
        }
    }
    targets.sort_by(|a, b| a.name.cmp(&b.name));
    targets.dedup_by(|a, b| a.name == b.name);
    skipped.sort_by(|a, b| a.name.cmp(&b.name));
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
    fn selects_ready_gpu_nodes_matching_the_selector() {
        let nodes = [
            node("b", 8, true, &[("pool", "h100")]),
            node("a", 8, true, &[("pool", "h100")]),
            node("c", 8, true, &[("pool", "a100")]),
            node("cpu", 0, true, &[("pool", "h100")]),
            node("sick", 8, false, &[("pool", "h100")]),
        ];
        let sel = BTreeMap::from([("pool".to_string(), "h100".to_string())]);
        let (t, s) = resolve(&nodes, &sel, None);
        assert_eq!(names(&t), ["a", "b"]);
        assert_eq!(t[0].gpus, 8);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].name, "sick");
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
        let (t, s) = resolve(&nodes, &BTreeMap::new(), None);
        assert_eq!(names(&t), ["ours"]);
        assert_eq!(s[0].name, "theirs");
    }

    #[test]
    fn an_explicit_list_limits_the_nodes_and_reports_missing_ones() {
        let nodes = [node("a", 4, true, &[]), node("b", 4, true, &[])];
        let list = vec!["b".to_string(), "ghost".to_string()];
        let (t, s) = resolve(&nodes, &BTreeMap::new(), Some(&list));
        assert_eq!(names(&t), ["b"]);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].name, "ghost");
    }
}
