//! The node changes of the lifecycle, as pure merge patches: opening the validation gate,
//! closing it on a node that joins, and clearing the repaired annotation. Each carries the
//! resourceVersion it was decided from; `crate::quarantine::guarded` sends it.

use super::targets::is_gated;
use gpufabric_api::keys::{
    ANNOTATION_GATED, ANNOTATION_QUARANTINE, ANNOTATION_REPAIRED, TAINT_VALIDATION,
};
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::ResourceExt;
use serde_json::{Value, json};

/// Why the gate of a node that passed stays closed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GateKept {
    /// The node is not gated (any more).
    NotGated,
    /// A gpufabric quarantine holds the node: the gate opens with its release, not before.
    Quarantined,
}

/// The patch that removes the validation gate from a node that passed, or why not.
pub fn open(node: &Node) -> Result<Value, GateKept> {
    if !is_gated(node) {
        return Err(GateKept::NotGated);
    }
    if node.annotations().contains_key(ANNOTATION_QUARANTINE) {
        return Err(GateKept::Quarantined);
    }
    let taints: Vec<&Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .map(|t| t.iter().filter(|t| t.key != TAINT_VALIDATION).collect())
        .unwrap_or_default();
    Ok(json!({
        "metadata": {"resourceVersion": node.resource_version()},
        "spec": {"taints": if taints.is_empty() { Value::Null } else { json!(taints) }},
    }))
}

/// The patch that puts the validation gate on a node that joined, for FabricTest `test`;
/// None when the node is gated already or was gated once (a person may have opened it).
pub fn close(node: &Node, test: &str) -> Option<Value> {
    if is_gated(node) || node.annotations().contains_key(ANNOTATION_GATED) {
        return None;
    }
    let mut taints: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    taints.push(Taint {
        key: TAINT_VALIDATION.into(),
        value: Some("pending".into()),
        effect: "NoSchedule".into(),
        time_added: None,
    });
    Some(json!({
        "metadata": {
            "resourceVersion": node.resource_version(),
            "annotations": {ANNOTATION_GATED: test},
        },
        "spec": {"taints": taints},
    }))
}

/// The patch that removes the repaired annotation once a run has measured the node.
pub fn clear_repaired(node: &Node) -> Option<Value> {
    node.annotations()
        .contains_key(ANNOTATION_REPAIRED)
        .then(|| {
            json!({"metadata": {
                "resourceVersion": node.resource_version(),
                "annotations": {ANNOTATION_REPAIRED: null},
            }})
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(v: Value) -> Node {
        serde_json::from_value(v).expect("a node")
    }

    fn patched(n: &Node, p: &Value) -> Node {
        let mut v = serde_json::to_value(n).expect("json");
        crate::quarantine::node_merge_for_tests(&mut v, p);
        node(v)
    }

    #[test]
    fn opening_removes_the_gate_and_keeps_every_other_taint() {
        let n = node(json!({
            "metadata": {"name": "n", "resourceVersion": "5"},
            "spec": {"taints": [
                {"key": "nvidia.com/gpu", "effect": "NoSchedule"},
                {"key": TAINT_VALIDATION, "value": "pending", "effect": "NoSchedule"}
            ]}
        }));
        let p = open(&n).expect("opens");
        assert_eq!(p["metadata"]["resourceVersion"], "5");
        let after = patched(&n, &p);
        let keys: Vec<String> = after
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .into_iter()
            .map(|t| t.key)
            .collect();
        assert_eq!(keys, ["nvidia.com/gpu"]);
        // The last taint: the list goes.
        let only = node(json!({"metadata": {"name": "n"},
            "spec": {"taints": [{"key": TAINT_VALIDATION, "effect": "NoSchedule"}]}}));
        assert!(open(&only).expect("opens")["spec"]["taints"].is_null());
    }

    #[test]
    fn a_quarantined_or_ungated_node_keeps_its_gate_state() {
        let held = node(json!({
            "metadata": {"name": "n", "annotations": {ANNOTATION_QUARANTINE: "{}"}},
            "spec": {"taints": [{"key": TAINT_VALIDATION, "effect": "NoSchedule"}]}
        }));
        assert_eq!(open(&held), Err(GateKept::Quarantined));
        let plain = node(json!({"metadata": {"name": "n"}, "spec": {}}));
        assert_eq!(open(&plain), Err(GateKept::NotGated));
    }

    #[test]
    fn a_node_is_gated_once_and_never_again() {
        let joined = node(json!({"metadata": {"name": "n", "resourceVersion": "1"},
            "spec": {"taints": [{"key": "other", "effect": "NoSchedule"}]}}));
        let p = close(&joined, "nightly").expect("gates");
        let gated = patched(&joined, &p);
        assert!(is_gated(&gated));
        assert_eq!(
            gated
                .annotations()
                .get(ANNOTATION_GATED)
                .map(String::as_str),
            Some("nightly")
        );
        assert_eq!(
            gated
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .map(Vec::len),
            Some(2)
        );
        assert!(close(&gated, "nightly").is_none());
        // A person opened the gate: it stays open.
        let opened = patched(&gated, &open(&gated).expect("opens"));
        assert!(!is_gated(&opened));
        assert!(close(&opened, "nightly").is_none());
    }

    #[test]
    fn the_repaired_annotation_is_cleared_once() {
        let n = node(json!({"metadata": {"name": "n", "resourceVersion": "3",
            "annotations": {ANNOTATION_REPAIRED: "INC-1"}}}));
        let cleared = patched(&n, &clear_repaired(&n).expect("clears"));
        assert!(!cleared.annotations().contains_key(ANNOTATION_REPAIRED));
        assert!(clear_repaired(&cleared).is_none());
    }
}
