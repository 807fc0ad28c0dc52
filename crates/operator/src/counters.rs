//! The node annotations `gpufabric.io/counters` and `gpufabric.io/nic-counters`: each
//! node's error counters at its latest measured run (NVLink, from the node check) and at
//! its latest node-pair test (network ports), read back by the next run or pair test to
//! judge their growth (`gpufabric_health::evaluate::counters`, `gpufabric_health::nics`).
//! Read from the node cache (no request); written after what judged them is saved (the
//! run's status and the test's fold of it, see `controller::run::record_counters`; the pass
//! of the node-pair phase), only for nodes whose counters changed, with a merge patch of
//! that one annotation. Writing is best effort: a node that cannot be
//! written keeps its older record, so the next run compares over a longer span, never a
//! shorter one.

use futures::StreamExt;
use gpufabric_api::counters::{BaselineError, CounterBaseline};
use gpufabric_api::findings::Finding;
use gpufabric_api::keys::{ANNOTATION_COUNTERS, ANNOTATION_NIC_COUNTERS, MANAGER};
use gpufabric_api::nic_counters::NicCounters;
use gpufabric_api::outcome::NodeOutcome;
use gpufabric_health::NodeInput;
use gpufabric_health::evaluate::counters::next_baseline;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

/// Nodes written at once.
pub const WRITE_CONCURRENCY: usize = 16;

/// The record on `node`, if it carries a readable one. An unreadable record is logged and
/// treated as none: nothing is judged against it, and the next write replaces it.
pub fn baseline_of(node: &Node) -> Option<CounterBaseline> {
    record_on(node, ANNOTATION_COUNTERS, CounterBaseline::parse)
}

/// The network port record on `node`, if it carries a readable one; an unreadable record
/// is logged and treated as none, as [`baseline_of`] does.
pub fn nic_record_of(node: &Node) -> Option<NicCounters> {
    record_on(node, ANNOTATION_NIC_COUNTERS, NicCounters::parse)
}

pub(crate) fn record_on<T>(
    node: &Node,
    key: &str,
    parse: fn(&str) -> Result<T, BaselineError>,
) -> Option<T> {
    let text = node.annotations().get(key)?;
    match parse(text) {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!(node = %node.name_any(), annotation = key, error = %e, "ignoring an unreadable counters annotation");
            None
        }
    }
}

/// The merge patch that sets the record.
pub fn patch(record: &CounterBaseline) -> Value {
    annotation_patch(ANNOTATION_COUNTERS, record.to_json())
}

/// The merge patch that sets the network port record.
pub fn nic_patch(record: &NicCounters) -> Value {
    annotation_patch(ANNOTATION_NIC_COUNTERS, record.to_json())
}

fn annotation_patch(key: &str, value: String) -> Value {
    json!({ "metadata": { "annotations": { key: value } } })
}

/// The records to write after a run: one per measured node whose counters changed and
/// did not grow too fast. Pure.
pub fn to_write(
    inputs: &[NodeInput],
    findings: &[Finding],
    run: &str,
    at: &str,
) -> Vec<(String, CounterBaseline)> {
    inputs
        .iter()
        .filter_map(|i| {
            let NodeOutcome::Measured(r) = &i.outcome else {
                return None;
            };
            next_baseline(&i.node, r, i.baseline.as_ref(), findings, run, at)
                .map(|b| (i.node.clone(), b))
        })
        .collect()
}

/// Writes `records`; returns the nodes that could not be written, with why. A node that
/// is gone is skipped.
pub async fn write(client: &Client, records: Vec<(String, CounterBaseline)>) -> Vec<String> {
    let patches = records.iter().map(|(n, r)| (n.clone(), patch(r))).collect();
    write_patches(client, patches, "error counters").await
}

/// Writes the network port `records`, as [`write`] does.
pub async fn write_nic(client: &Client, records: Vec<(String, NicCounters)>) -> Vec<String> {
    let patches = records
        .iter()
        .map(|(n, r)| (n.clone(), nic_patch(r)))
        .collect();
    write_patches(client, patches, "NIC error counters").await
}

pub(crate) async fn write_patches(
    client: &Client,
    patches: Vec<(String, Value)>,
    what: &str,
) -> Vec<String> {
    let api: Api<Node> = Api::all(client.clone());
    let pp = PatchParams {
        field_manager: Some(MANAGER.to_string()),
        ..Default::default()
    };
    futures::stream::iter(patches)
        .map(|(node, body)| {
            let (api, pp) = (api.clone(), pp.clone());
            async move {
                match api.patch(&node, &pp, &Patch::Merge(&body)).await {
                    Ok(_) => None,
                    Err(kube::Error::Api(e)) if e.code == 404 => None,
                    Err(e) => Some(format!("node {node}: recording its {what}: {e}")),
                }
            }
        })
        .buffer_unordered(WRITE_CONCURRENCY)
        .filter_map(|e| async move { e })
        .collect()
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufabric_api::result::{COMPACT_VERSION, CompactResult};
    use std::collections::BTreeMap;

    fn node(annotation: Option<&str>) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some("n1".into());
        n.metadata.annotations =
            annotation.map(|a| BTreeMap::from([(ANNOTATION_COUNTERS.to_string(), a.to_string())]));
        n
    }

    fn measured(name: &str, errors: u64) -> NodeInput {
        let gpu = json!({"l": [18, 18], "le": errors, "pc": [5, 5, 16, 16], "t": 40.0});
        let doc = json!({
            "v": COMPACT_VERSION, "n": name, "b": "sim", "p": "NVIDIA H200", "g": 2, "d": 1.0,
            "h": [gpu.clone(), gpu],
        });
        let r = CompactResult::parse(&doc.to_string()).expect("a valid compact document");
        NodeInput::measured(r)
    }

    #[test]
    fn a_readable_record_is_read_and_junk_is_ignored() {
        let good = r#"{"run":"r1","at":"2026-11-23T02:00:00Z","nvlink":[1,2]}"#;
        assert_eq!(
            baseline_of(&node(Some(good))).map(|b| b.nvlink),
            Some(vec![1, 2])
        );
        assert_eq!(baseline_of(&node(Some("cordon me"))), None);
        assert_eq!(baseline_of(&node(None)), None);
    }

    #[test]
    fn a_readable_nic_record_is_read_and_junk_is_ignored() {
        let good = r#"{"run":"r1","at":"2026-11-24T02:00:00Z","ports":[{"device":"mlx5_0","port":1,"symbolErrors":4}]}"#;
        let mut n = node(None);
        n.metadata.annotations = Some(BTreeMap::from([(
            ANNOTATION_NIC_COUNTERS.to_string(),
            good.to_string(),
        )]));
        let r = nic_record_of(&n).expect("a readable record");
        assert_eq!(
            r.port("mlx5_0", 1).and_then(|p| p.errors.symbol_errors),
            Some(4)
        );
        let p = nic_patch(&r);
        let text = p["metadata"]["annotations"][ANNOTATION_NIC_COUNTERS]
            .as_str()
            .unwrap_or_default();
        assert_eq!(NicCounters::parse(text).ok(), Some(r));
        assert_eq!(
            p["metadata"]["annotations"].as_object().map(|a| a.len()),
            Some(1),
            "the patch sets that one annotation only"
        );
        n.metadata.annotations = Some(BTreeMap::from([(
            ANNOTATION_NIC_COUNTERS.to_string(),
            "[1,2".to_string(),
        )]));
        assert_eq!(nic_record_of(&n), None);
        // The NVLink record is another annotation.
        assert_eq!(nic_record_of(&node(Some(good))), None);
    }

    #[test]
    fn only_measured_nodes_with_changed_counters_are_written() {
        let mut same = measured("same", 5);
        same.baseline = Some(CounterBaseline {
            run: "r0".into(),
            at: "t0".into(),
            nvlink: vec![5, 5],
        });
        let fresh = measured("fresh", 7);
        let not_measured = NodeInput {
            outcome: NodeOutcome::not_measured(
                gpufabric_api::outcome::NotMeasuredReason::NotAdmitted,
                "busy",
            ),
            ..measured("busy", 0)
        };
        let w = to_write(&[same, fresh, not_measured], &[], "r1", "t1");
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].0, "fresh");
        assert_eq!(w[0].1.nvlink, vec![7, 7]);
        let p = patch(&w[0].1);
        let text = p["metadata"]["annotations"][ANNOTATION_COUNTERS]
            .as_str()
            .unwrap_or_default();
        assert_eq!(CounterBaseline::parse(text).ok(), Some(w[0].1.clone()));
    }
}
