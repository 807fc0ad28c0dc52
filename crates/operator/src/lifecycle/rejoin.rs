//! A node's identity for the lifecycle is the Node object, not its name: a machine deleted
//! and registered again under the same name (re-imaged, replaced) starts a new history.

use super::publish_on_node;
use super::targets::of_an_earlier_node;
use crate::context::Context;
use gpufabric_api::test::{FabricTest, FabricTestStatus, NodeHealth};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::Api;
use std::collections::BTreeMap;

/// Drops from `status` the history of every node whose entry is of an earlier Node of the
/// same name ([`of_an_earlier_node`]): its verdicts, counts, quarantine (the Node that held
/// it is gone) and gate. Returns the names forgotten.
pub fn forget_earlier_nodes<'a>(
    status: &mut FabricTestStatus,
    nodes: impl IntoIterator<Item = &'a Node>,
) -> Vec<String> {
    let by_name: BTreeMap<String, &Node> = nodes.into_iter().map(|n| (n.name_any(), n)).collect();
    let earlier: Vec<String> = status
        .nodes
        .iter()
        .filter(|h| {
            by_name
                .get(&h.node)
                .is_some_and(|n| of_an_earlier_node(h, n))
        })
        .map(|h| h.node.clone())
        .collect();
    for name in &earlier {
        if let Some(h) = status.nodes.iter_mut().find(|h| &h.node == name) {
            if h.standing.is_quarantined() {
                status.quarantined_count = status.quarantined_count.saturating_sub(1);
            }
            *h = NodeHealth {
                node: name.clone(),
                ..NodeHealth::default()
            };
        }
        status.quarantined_nodes.retain(|n| n != name);
        status.repeat_offenders.retain(|n| n != name);
        status.targets.retain(|t| &t.node != name);
    }
    earlier
}

/// [`forget_earlier_nodes`] over the node cache, with an Event on each node forgotten.
pub async fn forget_rejoined(test: &FabricTest, ctx: &Context, status: &mut FabricTestStatus) {
    let cached = ctx.nodes.state();
    let forgotten = forget_earlier_nodes(status, cached.iter().map(|n| n.as_ref()));
    if forgotten.is_empty() {
        return;
    }
    let key = test.name_any();
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let gates = if test.spec.node_lifecycle.gate_new_nodes {
        "; it is gated and tested as a new node"
    } else {
        ""
    };
    for node in forgotten {
        let message = format!(
            "registered again under a name FabricTest {key} knew: a new machine, its history starts again{gates}"
        );
        publish_on_node(ctx, &nodes, &node, false, "NodeRejoined", message).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use serde_json::json;

    fn time(s: &str) -> Time {
        Time(s.parse().expect("time"))
    }

    #[test]
    fn a_rejoined_machine_loses_the_earlier_machines_record_and_quarantine() {
        let node: Node = serde_json::from_value(json!({"metadata": {"name": "g",
            "creationTimestamp": "2026-11-27T05:00:00Z"}}))
        .expect("a node");
        let old = NodeHealth {
            node: "g".into(),
            standing: gpufabric_api::standing::Standing::Quarantined { hardware: false },
            consecutive_failures: 2,
            last_measured: Some(time("2026-11-27T01:00:00Z")),
            last_judged: Some(time("2026-11-27T01:00:00Z")),
            ..NodeHealth::default()
        };
        let other = NodeHealth {
            node: "h".into(),
            last_measured: Some(time("2026-11-27T01:00:00Z")),
            ..NodeHealth::default()
        };
        let mut status = FabricTestStatus {
            nodes: vec![old, other.clone()],
            quarantined_nodes: vec!["g".into()],
            quarantined_count: 1,
            ..FabricTestStatus::default()
        };
        assert_eq!(forget_earlier_nodes(&mut status, [&node]), ["g"]);
        assert_eq!(status.nodes[0].last_measured, None);
        assert!(!status.nodes[0].standing.is_quarantined());
        assert!(status.quarantined_nodes.is_empty());
        assert_eq!(status.quarantined_count, 0);
        // A node not in the cache, and one seen since, keep theirs.
        assert_eq!(status.nodes[1], other);
        assert!(forget_earlier_nodes(&mut status, [&node]).is_empty());
    }
}
