//! A test's quarantine as the cluster shows it: the nodes it holds, every node's marks, the
//! failing nodes held back and the GPUs out of service.

use crate::doc::{Doc, Table};
use crate::status::HeldBack;
use gpufabric_api::{FabricTest, keys};
use k8s_openapi::api::core::v1::Node;
use serde::Serialize;

/// What is done to a node that carries any of gpufabric's quarantine marks.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NodeMarks {
    pub node: String,
    pub cordoned: bool,
    /// The value of the `gpufabric.io/quarantined` label.
    pub label: Option<String>,
    /// It carries the `gpufabric.io/quarantined` taint.
    pub tainted: bool,
}

impl NodeMarks {
    /// The marks of `n`: none when it is neither cordoned, labelled nor tainted.
    pub fn of(n: &Node) -> Option<NodeMarks> {
        let cordoned = n
            .spec
            .as_ref()
            .and_then(|s| s.unschedulable)
            .unwrap_or(false);
        let tainted = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == keys::TAINT_QUARANTINED));
        let label = n
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(keys::LABEL_QUARANTINED))
            .cloned();
        (cordoned || tainted || label.is_some()).then(|| NodeMarks {
            node: n.metadata.name.clone().unwrap_or_default(),
            cordoned,
            label,
            tainted,
        })
    }
}

/// The nodes a test holds in quarantine, the marks on the cluster's nodes, and the failing
/// nodes it holds back.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Quarantine {
    pub test: String,
    pub quarantined: Vec<String>,
    /// Every node cordoned, labelled or tainted as quarantined (by this test or not).
    pub marked: Vec<NodeMarks>,
    pub held_back: Vec<HeldBack>,
    /// GPUs it took out of service with DRA device taints (their nodes stay schedulable).
    pub gpus_out_of_service: Vec<crate::gpus_out::GpuOut>,
}

impl Quarantine {
    pub fn of(ft: &FabricTest, nodes: &[Node]) -> Quarantine {
        let s = crate::status::TestSummary::of(ft);
        Quarantine {
            test: s.name,
            quarantined: s.quarantined,
            marked: nodes.iter().filter_map(NodeMarks::of).collect(),
            held_back: s.held_back,
            gpus_out_of_service: s.gpus_out_of_service,
        }
    }

    pub fn doc(&self) -> Doc {
        let mut doc = Doc::default();
        doc.heading("quarantined nodes");
        doc.line(format!(
            "{} holds {} node(s) in quarantine: {}",
            self.test,
            self.quarantined.len(),
            if self.quarantined.is_empty() {
                "none".to_string()
            } else {
                self.quarantined.join(", ")
            }
        ));
        let mut t = Table::new(&["NODE", "CORDONED", "QUARANTINE LABEL", "TAINTED"]);
        for m in &self.marked {
            t.push(vec![
                m.node.clone(),
                m.cordoned.to_string(),
                m.label.clone().unwrap_or_default(),
                m.tainted.to_string(),
            ]);
        }
        doc.table(t);
        // Nodes that fail but are not acted on: over budget, Observe mode, the breaker open.
        if !self.held_back.is_empty() {
            doc.heading("failing nodes held back (reported, not acted on)");
            let mut t = Table::new(&["NODE", "WHY"]);
            for h in &self.held_back {
                t.push(vec![h.node.clone(), h.why.clone()]);
            }
            doc.table(t);
        }
        doc.extend(crate::gpus_out::doc(
            crate::gpus_out::HEADING,
            &self.gpus_out_of_service,
        ));
        doc
    }
}
