//! The node annotation `gpufabric.io/trend`: each node's key numbers over its last runs of
//! each test ([`gpufabric_api::trend::NodeTrend`]). Read from the node cache (no request)
//! when a run is judged, so a passing node is judged against its own earlier runs
//! (`gpufabric_health::evaluate::trend`); written after the run's status, for each node
//! that passed a complete check, with a merge patch of that one annotation. Writing is best
//! effort: a node that cannot be written misses one point of its record.

use gpufabric_api::keys::ANNOTATION_TREND;
use gpufabric_api::outcome::NodeOutcome;
use gpufabric_api::run::{FabricTestRun, NodeRunResult, NodeVerdict};
use gpufabric_api::trend::{NodeTrend, TrendPoint, suite_fingerprint};
use gpufabric_health::NodeInput;
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use serde_json::{Value, json};

/// Which record of a node a run reads and writes: its test and the fingerprint of its
/// suite.
#[derive(Clone, Debug, PartialEq)]
pub struct TrendKey {
    pub test: String,
    pub suite: String,
    /// Runs kept (`thresholds.trend.window`).
    pub window: usize,
}

impl TrendKey {
    pub fn of(run: &FabricTestRun) -> TrendKey {
        TrendKey {
            test: run.spec.test.clone(),
            suite: suite_fingerprint(&run.spec.suite),
            window: run.spec.thresholds.trend.window as usize,
        }
    }

    /// The node's earlier runs of this test with this suite, oldest first: none when the
    /// node carries no readable record.
    pub fn history(&self, node: &Node) -> Vec<TrendPoint> {
        record_of(node)
            .map(|t| t.points(&self.test, &self.suite).to_vec())
            .unwrap_or_default()
    }
}

/// The record on `node`, if it carries a readable one. An unreadable record is logged and
/// treated as none: nothing is judged against it, and the next write replaces it.
pub fn record_of(node: &Node) -> Option<NodeTrend> {
    crate::counters::record_on(node, ANNOTATION_TREND, NodeTrend::parse)
}

/// The records to write after a run: each node that passed with every phase measured gets
/// this run's point (`at`, seconds since the epoch) added to the record it carries (`now`
/// returns the node from the cache). Pure.
pub fn to_write(
    inputs: &[NodeInput],
    entries: &[NodeRunResult],
    key: &TrendKey,
    at: i64,
    now: impl Fn(&str) -> Option<std::sync::Arc<Node>>,
) -> Vec<(String, NodeTrend)> {
    let complete_pass = |node: &str| {
        entries
            .iter()
            .any(|e| e.node == node && e.verdict == NodeVerdict::Passed && e.complete())
    };
    inputs
        .iter()
        .filter(|i| complete_pass(&i.node))
        .filter_map(|i| {
            let NodeOutcome::Measured(r) = &i.outcome else {
                return None;
            };
            let point = TrendPoint::of(r, at);
            if point.is_empty() {
                return None;
            }
            let before = now(&i.node).and_then(|n| record_of(&n)).unwrap_or_default();
            let after = before.with_point(&key.test, &key.suite, point, key.window);
            (after != before).then(|| (i.node.clone(), after))
        })
        .collect()
}

/// Writes `records`; returns the nodes that could not be written, with why. A node that
/// is gone is skipped.
pub async fn write(client: &Client, records: Vec<(String, NodeTrend)>) -> Vec<String> {
    let patches = records.iter().map(|(n, r)| (n.clone(), patch(r))).collect();
    crate::counters::write_patches(client, patches, "trend").await
}

/// The merge patch that sets the record.
pub fn patch(record: &NodeTrend) -> Value {
    json!({ "metadata": { "annotations": { ANNOTATION_TREND: record.to_json() } } })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufabric_api::result::{COMPACT_VERSION, CompactResult};
    use std::collections::BTreeMap;
    use std::sync::Arc;

    fn measured(name: &str, busbw: f64) -> NodeInput {
        let doc = json!({
            "v": COMPACT_VERSION, "n": name, "b": "sim", "p": "NVIDIA H100 80GB HBM3", "g": 2,
            "d": 1.0,
            "nc": [{"c": "allReduce", "pk": busbw, "bb": busbw, "lt": 20.0}],
        });
        let r = CompactResult::parse(&doc.to_string()).expect("a valid compact document");
        NodeInput::measured(r)
    }

    fn entry(node: &str, verdict: NodeVerdict) -> NodeRunResult {
        NodeRunResult {
            node: node.into(),
            verdict,
            ..Default::default()
        }
    }

    fn node_with(record: Option<&str>) -> Arc<Node> {
        let mut n = Node::default();
        n.metadata.name = Some("n".into());
        n.metadata.annotations =
            record.map(|r| BTreeMap::from([(ANNOTATION_TREND.to_string(), r.to_string())]));
        Arc::new(n)
    }

    fn key() -> TrendKey {
        TrendKey {
            test: "nightly".into(),
            suite: "s1".into(),
            window: 14,
        }
    }

    #[test]
    fn only_complete_passes_are_recorded_on_top_of_what_the_node_carries() {
        let earlier = NodeTrend::default().with_point(
            "nightly",
            "s1",
            TrendPoint {
                at: 1,
                busbw_gbps: Some(400.0),
                ..Default::default()
            },
            14,
        );
        let text = earlier.to_json();
        let inputs = [
            measured("pass", 390.0),
            measured("fail", 100.0),
            measured("partial", 390.0),
        ];
        let mut partial = entry("partial", NodeVerdict::Passed);
        partial.unmeasured = vec!["ddpProbe".into()];
        let entries = [
            entry("pass", NodeVerdict::Passed),
            entry("fail", NodeVerdict::Failed),
            partial,
        ];
        let w = to_write(&inputs, &entries, &key(), 2, |_| {
            Some(node_with(Some(&text)))
        });
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].0, "pass");
        let pts = w[0].1.points("nightly", "s1");
        assert_eq!(pts.len(), 2);
        assert_eq!(pts[1].busbw_gbps, Some(390.0));
        assert_eq!(pts[1].at, 2);
        // Read back from the node as the next run reads it.
        let next = node_with(Some(&w[0].1.to_json()));
        assert_eq!(key().history(&next).len(), 2);
        // Another suite reads nothing of it; junk reads as no record.
        let other = TrendKey {
            suite: "s2".into(),
            ..key()
        };
        assert!(other.history(&next).is_empty());
        assert!(key().history(&node_with(Some("{oops"))).is_empty());
        // A node with junk (or nothing) starts a record.
        let w = to_write(&inputs[..1], &entries[..1], &key(), 3, |_| {
            Some(node_with(Some("{oops")))
        });
        assert_eq!(w[0].1.points("nightly", "s1").len(), 1);
    }

    #[test]
    fn the_patch_sets_that_one_annotation_and_reads_back() {
        let w = to_write(
            &[measured("pass", 390.0)],
            &[entry("pass", NodeVerdict::Passed)],
            &key(),
            7,
            |_| None,
        );
        let p = patch(&w[0].1);
        let annotations = p["metadata"]["annotations"].as_object();
        assert_eq!(annotations.map(|a| a.len()), Some(1));
        let text = p["metadata"]["annotations"][ANNOTATION_TREND]
            .as_str()
            .unwrap_or_default();
        assert_eq!(NodeTrend::parse(text).ok(), Some(w[0].1.clone()));
    }
}
