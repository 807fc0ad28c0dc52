//! The node annotation `gpufabric.io/trend`: each node's key numbers over its last runs of
//! each test ([`gpufabric_api::trend::NodeTrend`]). Read from the node cache (no request)
//! when a run is judged, so a passing node is judged against its own earlier runs
//! (`gpufabric_health::evaluate::trend`); written when the test folds the run, for each
//! node that passed a complete check (from its run entry, which keeps the same numbers), and
//! not while the test's breaker is open, in the same merge patch as the node's signals (the
//! result label and last-pass time: one patch a passing node a run), or in a patch of its
//! own for a node without signals. Writing is best effort: a node that cannot be written
//! misses one point of its record.

use crate::signals::NodeSignal;
use gpufabric_api::keys::ANNOTATION_TREND;
use gpufabric_api::run::{FabricTestRun, NodeRunResult, NodeVerdict};
use gpufabric_api::trend::{NodeTrend, TrendPoint};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use serde_json::{Value, json};
use std::collections::BTreeMap;

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
            suite: run.spec.suite.fingerprint(),
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
    entries: &[NodeRunResult],
    key: &TrendKey,
    at: i64,
    now: impl Fn(&str) -> Option<std::sync::Arc<Node>>,
) -> Vec<(String, NodeTrend)> {
    entries
        .iter()
        .filter(|e| e.verdict == NodeVerdict::Passed && e.complete())
        .filter_map(|e| {
            let point = TrendPoint::of_entry(e, at);
            if point.is_empty() {
                return None;
            }
            let before = now(&e.node).and_then(|n| record_of(&n)).unwrap_or_default();
            let after = before.with_point(&key.test, &key.suite, point, key.window);
            (after != before).then(|| (e.node.clone(), after))
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

/// Puts each record into the metadata patch of its node's signals (written after the same
/// run, under the same rule), so that a node that passed is patched once a run and not
/// twice; returns the records of nodes without signals, to be written on their own. Pure.
pub fn ride_with_signals(
    signals: &mut [NodeSignal],
    records: Vec<(String, NodeTrend)>,
) -> Vec<(String, NodeTrend)> {
    let by_node: BTreeMap<&str, usize> = signals
        .iter()
        .enumerate()
        .map(|(i, s)| (s.node.as_str(), i))
        .collect();
    let mut places = Vec::new();
    let mut alone = Vec::new();
    for (node, record) in records {
        match by_node.get(node.as_str()) {
            Some(&i) => places.push((i, record)),
            None => alone.push((node, record)),
        }
    }
    for (i, record) in places {
        let signal = &mut signals[i];
        let mut body = match signal
            .metadata
            .as_deref()
            .map(serde_json::from_str::<Value>)
        {
            None => json!({ "metadata": {} }),
            Some(Ok(v)) => v,
            Some(Err(_)) => {
                alone.push((signal.node.clone(), record));
                continue;
            }
        };
        let annotations = body
            .pointer_mut("/metadata")
            .and_then(Value::as_object_mut)
            .map(|m| m.entry("annotations").or_insert_with(|| json!({})))
            .and_then(Value::as_object_mut);
        match annotations {
            Some(a) => {
                a.insert(ANNOTATION_TREND.into(), Value::String(record.to_json()));
                signal.metadata = Some(body.to_string());
            }
            None => alone.push((signal.node.clone(), record)),
        }
    }
    alone
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufabric_api::result::{COMPACT_VERSION, CompactResult};
    use gpufabric_api::run::NodeVerdict;
    use std::collections::BTreeMap;
    use std::sync::Arc;

    /// A node's entry as a run records a measurement with this busbw.
    fn measured(node: &str, verdict: NodeVerdict, busbw: f64) -> NodeRunResult {
        let doc = json!({
            "v": COMPACT_VERSION, "n": node, "b": "sim", "p": "NVIDIA H100 80GB HBM3", "g": 2,
            "d": 1.0,
            "nc": [{"c": "allReduce", "pk": busbw, "bb": busbw, "lt": 20.0}],
        });
        let r = CompactResult::parse(&doc.to_string()).expect("a valid compact document");
        let mut e = entry(node, verdict);
        e.record(&gpufabric_api::outcome::NodeOutcome::Measured(Box::new(r)));
        e.verdict = verdict;
        e
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
        let mut partial = measured("partial", NodeVerdict::Passed, 390.0);
        partial.unmeasured = vec!["ddpProbe".into()];
        let entries = [
            measured("pass", NodeVerdict::Passed, 390.0),
            measured("fail", NodeVerdict::Failed, 100.0),
            partial,
            // Passed with no number kept (an entry of an older operator): nothing to add.
            entry("bare", NodeVerdict::Passed),
        ];
        let w = to_write(&entries, &key(), 2, |_| Some(node_with(Some(&text))));
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
        let w = to_write(&entries[..1], &key(), 3, |_| Some(node_with(Some("{oops"))));
        assert_eq!(w[0].1.points("nightly", "s1").len(), 1);
    }

    #[test]
    fn an_entry_keeps_the_numbers_the_judge_reads_from_the_result() {
        let doc = json!({
            "v": COMPACT_VERSION, "n": "n", "b": "sim", "p": "NVIDIA H100 80GB HBM3", "g": 2,
            "d": 1.0,
            "nc": [{"c": "allReduce", "pk": 356.34, "bb": 350.0, "lt": 20.0}],
            "pu": [0.0, 393.51, 392.22, 0.0],
            "hd": [55.01, 48.74], "dh": [55.05, 45.35],
            "dp": [{"g": 1, "st": 20.1, "e": 1.0, "cf": 0.1, "ov": 0.9, "tf": 400.0},
                   {"g": 2, "st": 26.57, "e": 0.95, "cf": 0.2, "ov": 0.9, "tf": 380.0}],
        });
        let r = CompactResult::parse(&doc.to_string()).expect("a valid compact document");
        let judged = TrendPoint::of(&r, 5);
        let mut e = entry("n", NodeVerdict::Passed);
        e.record(&gpufabric_api::outcome::NodeOutcome::Measured(Box::new(r)));
        assert_eq!(TrendPoint::of_entry(&e, 5), judged);
        assert_eq!(judged.host_gbps, Some(45.35));
        assert_eq!(judged.ddp_step_ms, Some(26.57));
        assert_eq!(judged.worst_pair_gbps, Some(392.2));
    }

    #[test]
    fn the_patch_sets_that_one_annotation_and_reads_back() {
        let w = to_write(
            &[measured("pass", NodeVerdict::Passed, 390.0)],
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

    fn signal(node: &str, metadata: Option<Value>) -> NodeSignal {
        NodeSignal {
            node: node.into(),
            test: "nightly".into(),
            entry: gpufabric_api::standings::TestStanding {
                standing: gpufabric_api::standing::Standing::Passing,
                run: "nightly-1".into(),
                detail: None,
            },
            passed_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-01-01T00:00:00Z".parse().expect("time"),
            ),
            measured: true,
            condition: None,
            remove_legacy: false,
            metadata: metadata.map(|m| m.to_string()),
            suspect_taint_owner: None,
            resource_version: None,
        }
    }

    fn record(busbw: f64) -> NodeTrend {
        NodeTrend::default().with_point(
            "nightly",
            "s1",
            TrendPoint {
                at: 1,
                busbw_gbps: Some(busbw),
                ..Default::default()
            },
            14,
        )
    }

    fn patched(s: &NodeSignal) -> Value {
        serde_json::from_str(s.metadata.as_deref().expect("a metadata patch")).expect("JSON")
    }

    #[test]
    fn a_record_rides_in_its_nodes_signal_patch_and_a_node_without_signals_is_written_alone() {
        let last_pass = json!({ "metadata": {
            "labels": { "gpufabric.io/result": "pass" },
            "annotations": { "gpufabric.io/last-pass": "2026-11-27T02:00:00Z" },
        }});
        let mut signals = vec![signal("a", Some(last_pass)), signal("b", None)];
        let alone = ride_with_signals(
            &mut signals,
            vec![
                ("a".into(), record(400.0)),
                ("b".into(), record(401.0)),
                ("c".into(), record(402.0)),
            ],
        );
        assert_eq!(alone, vec![("c".to_string(), record(402.0))]);
        let a = patched(&signals[0]);
        assert_eq!(a["metadata"]["labels"]["gpufabric.io/result"], "pass");
        assert_eq!(
            a["metadata"]["annotations"]["gpufabric.io/last-pass"],
            "2026-11-27T02:00:00Z"
        );
        let text = a["metadata"]["annotations"][ANNOTATION_TREND]
            .as_str()
            .expect("the record");
        assert_eq!(NodeTrend::parse(text).ok(), Some(record(400.0)));
        // A node whose label and last pass are already right gets the record alone: the
        // same patch as writing it on its own.
        assert_eq!(patched(&signals[1]), patch(&record(401.0)));
    }

    #[test]
    fn without_records_the_signals_are_left_as_decided() {
        let mut signals = vec![
            signal("a", None),
            signal("b", Some(json!({ "metadata": { "labels": { "x": "y" } } }))),
        ];
        let before = signals.clone();
        assert!(ride_with_signals(&mut signals, Vec::new()).is_empty());
        assert_eq!(signals, before);
    }
}
