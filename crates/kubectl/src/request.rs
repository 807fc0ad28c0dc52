//! `run` and `release`: the annotations that ask the operator to act, exactly those it
//! documents (`gpufabric_api::keys`), decided without a client.

use crate::doc::Doc;
use crate::output::{View, test_name};
use gpufabric_api::keys;
use gpufabric_api::quarantine::QuarantineRecord;
use k8s_openapi::api::core::v1::Node;
use serde::Serialize;
use std::collections::BTreeMap;

/// Annotations to set on an object, and what they ask for.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Request {
    /// `FabricTest` or `Node`.
    pub kind: String,
    pub name: String,
    pub annotations: BTreeMap<String, String>,
    /// What the operator does with them, as a sentence.
    pub effect: String,
}

impl Request {
    /// The merge patch that sets the annotations.
    pub fn patch(&self) -> serde_json::Value {
        serde_json::json!({"metadata": {"annotations": self.annotations}})
    }
}

impl View for Request {
    /// The object annotated, as `kubectl annotate -o name` prints it.
    fn names(&self) -> Vec<String> {
        vec![match self.kind.as_str() {
            "Node" => format!("node/{}", self.name),
            _ => test_name(&self.name),
        }]
    }

    fn doc(&self) -> Doc {
        let mut doc = Doc::default();
        let set: Vec<String> = self
            .annotations
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        doc.heading(format!(
            "annotated {} {}: {}",
            self.kind,
            self.name,
            set.join(" ")
        ));
        doc.line(self.effect.clone());
        doc
    }
}

/// Why a request is not made.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The command line asks for something malformed.
    #[error("{0}")]
    Usage(String),
    /// `release` of a node with nothing to release.
    #[error(
        "node {0} carries no gpufabric quarantine record ({ann}): gpufabric holds nothing on it to release. A node someone else cordoned is theirs to uncordon; to test a node now, use `kubectl gpufabric run TEST --nodes {0}`",
        ann = keys::ANNOTATION_QUARANTINE
    )]
    NotQuarantined(String),
    /// `release` of a node whose record cannot be read.
    #[error("node {node}: {error}")]
    Unreadable { node: String, error: String },
}

/// A run of `test` now: over `nodes` and/or the nodes matching `selector` (a targeted run,
/// `gpufabric.io/run-nodes` / `gpufabric.io/run-selector`), or, with neither, over every
/// node the test selects (`gpufabric.io/run-now`, valued `now`, a timestamp).
pub fn run(
    test: &str,
    nodes: &[String],
    selector: Option<&str>,
    now: &str,
) -> Result<Request, Refusal> {
    let mut annotations = BTreeMap::new();
    let listed: Vec<&str> = nodes
        .iter()
        .flat_map(|n| n.split(','))
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect();
    if !nodes.is_empty() && listed.is_empty() {
        return Err(Refusal::Usage("--nodes names no node".into()));
    }
    if !listed.is_empty() {
        annotations.insert(keys::ANNOTATION_RUN_NODES.to_string(), listed.join(","));
    }
    if let Some(sel) = selector {
        let pairs: Vec<&str> = sel
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .collect();
        let bad: Vec<&&str> = pairs
            .iter()
            .filter(|p| {
                p.split_once('=')
                    .is_none_or(|(k, _)| k.trim().is_empty() || k.contains('!'))
            })
            .collect();
        if pairs.is_empty() || !bad.is_empty() {
            return Err(Refusal::Usage(format!(
                "--selector {sel:?}: give key=value pairs separated by commas (e.g. rack=r12,pool=training)"
            )));
        }
        annotations.insert(keys::ANNOTATION_RUN_SELECTOR.to_string(), pairs.join(","));
    }
    let effect = if annotations.is_empty() {
        annotations.insert(keys::ANNOTATION_RUN_NOW.to_string(), now.to_string());
        format!(
            "the operator starts a run of {test} now over every node it selects, and removes the annotation"
        )
    } else {
        format!(
            "the operator starts a targeted run of {test} now over the nodes named that it selects (the others are named in a TargetNotSelected Event), and removes the annotation"
        )
    };
    Ok(Request {
        kind: "FabricTest".into(),
        name: test.to_string(),
        annotations,
        effect,
    })
}

/// The repair signal on `node` (`gpufabric.io/repaired`, valued `note`): only for a node
/// that carries a gpufabric quarantine record.
pub fn release(node: &Node, note: &str) -> Result<Request, Refusal> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let record = QuarantineRecord::from_annotations(node.metadata.annotations.as_ref())
        .map_err(|e| Refusal::Unreadable {
            node: name.clone(),
            error: e.to_string(),
        })?
        .ok_or_else(|| Refusal::NotQuarantined(name.clone()))?;
    let mut annotations = BTreeMap::new();
    annotations.insert(keys::ANNOTATION_REPAIRED.to_string(), note.to_string());
    Ok(Request {
        kind: "Node".into(),
        name: name.clone(),
        annotations,
        effect: format!(
            "every FabricTest that selects {name} tests it now; one pass releases FabricTest {}'s quarantine (run {}: {}), a failure keeps it; the operator removes the annotation once a run has measured the node",
            record.test_name(),
            record.run,
            record.reason
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use crate::output::{Format, render};

    #[test]
    fn a_plain_run_is_the_run_now_annotation() {
        let r = run("nightly", &[], None, "2026-11-27T09:00:00Z").expect("request");
        assert_eq!(
            r.patch(),
            serde_json::json!({"metadata": {"annotations": {"gpufabric.io/run-now": "2026-11-27T09:00:00Z"}}})
        );
        assert_eq!(r.kind, "FabricTest");
    }

    #[test]
    fn named_nodes_and_a_selector_are_the_targeted_run_annotations() {
        let nodes = vec!["gpu-07, gpu-12".to_string(), "gpu-13".to_string()];
        let r = run("nightly", &nodes, Some("rack=r12, pool=training"), "now").expect("request");
        assert_eq!(r.annotations.len(), 2, "{:?}", r.annotations);
        assert_eq!(
            r.annotations[keys::ANNOTATION_RUN_NODES],
            "gpu-07,gpu-12,gpu-13"
        );
        assert_eq!(
            r.annotations[keys::ANNOTATION_RUN_SELECTOR],
            "rack=r12,pool=training"
        );
        let text = render(&r, &Format::Table).expect("text");
        assert!(
            text.starts_with("==> annotated FabricTest nightly: gpufabric.io/run-nodes=gpu-07,gpu-12,gpu-13 gpufabric.io/run-selector=rack=r12,pool=training\n    the operator starts a targeted run"),
            "{text}"
        );
    }

    #[test]
    fn malformed_node_lists_and_selectors_are_usage_errors() {
        for (nodes, sel) in [
            (vec![" , ".to_string()], None),
            (vec![], Some("rack")),
            (vec![], Some("=r12")),
            (vec![], Some("rack!=r12")),
            (vec![], Some(",")),
        ] {
            assert!(
                matches!(run("t", &nodes, sel, "now"), Err(Refusal::Usage(_))),
                "{nodes:?} {sel:?}"
            );
        }
    }

    #[test]
    fn release_sets_the_repaired_annotation_on_a_quarantined_node() {
        let n = fixtures::node("h200-02", Some(fixtures::RECORD));
        let r = release(&n, "INC-7 NIC replaced").expect("released");
        assert_eq!(
            r.patch(),
            serde_json::json!({"metadata": {"annotations": {"gpufabric.io/repaired": "INC-7 NIC replaced"}}})
        );
        assert!(
            r.effect.contains(
                "one pass releases FabricTest nightly's quarantine (run nightly-manual-1"
            ),
            "{}",
            r.effect
        );
        let json: serde_json::Value =
            serde_json::from_str(&render(&r, &Format::Json).expect("json")).expect("parses");
        assert_eq!(json["kind"], "Node");
        assert_eq!(
            json["annotations"]["gpufabric.io/repaired"],
            "INC-7 NIC replaced"
        );
        let yaml: serde_json::Value =
            serde_yaml::from_str(&render(&r, &Format::Yaml).expect("yaml")).expect("parses");
        assert_eq!(yaml, json);
    }

    #[test]
    fn release_refuses_a_node_without_a_readable_record() {
        let err = release(&fixtures::node("h100-00", None), "x").expect_err("refused");
        assert_eq!(err, Refusal::NotQuarantined("h100-00".into()));
        assert!(
            err.to_string()
                .contains("carries no gpufabric quarantine record"),
            "{err}"
        );
        let err =
            release(&fixtures::node("h100-00", Some("cordoned by bob")), "x").expect_err("refused");
        assert!(matches!(err, Refusal::Unreadable { .. }), "{err}");
    }
}
