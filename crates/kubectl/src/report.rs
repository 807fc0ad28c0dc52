//! What a run found, as tables: per-node results and findings, node pairs, the multi-node
//! DDP probe, the test's quarantined and held-back nodes, and the nodes not measured.
//! `kubectl gpufabric report RUN` prints them, and so does the demo.

mod multinode;
mod pairs;
mod quarantine;

pub use multinode::{ddp_nodes_doc, nccl_nodes_doc};
pub use pairs::{PairRow, pair_rows, pairs_doc, retest_words};
pub use quarantine::{NodeMarks, Quarantine};

use crate::doc::{Doc, Table, fmt_opt, wire};
use crate::findings::subject;
use crate::output::View;
use gpufabric_api::FabricTestRun;
use serde::Serialize;

fn run_name(r: &FabricTestRun) -> String {
    r.metadata.name.clone().unwrap_or_default()
}

/// One run's per-node results and findings.
pub fn run_doc(r: &FabricTestRun) -> Doc {
    let st = r.status.clone().unwrap_or_default();
    let mut doc = Doc::default();
    doc.heading(format!(
        "run {} ({}): per-node results",
        run_name(r),
        r.spec.trigger.as_str()
    ));
    let mut t = Table::new(&[
        "NODE",
        "VERDICT",
        "PRODUCT",
        "ALLREDUCE GB/s",
        "MIN PAIR GB/s",
        "DDP EFF",
        "FINDINGS",
        "REASON",
    ]);
    for n in &st.nodes {
        t.push(vec![
            n.node.clone(),
            n.verdict.name().into(),
            n.product.clone().unwrap_or_default(),
            fmt_opt(n.all_reduce_bus_bw_gbps, 1),
            fmt_opt(n.min_pair_gbps, 1),
            fmt_opt(n.ddp_efficiency, 3),
            n.findings.to_string(),
            n.reason.clone().unwrap_or_default(),
        ]);
    }
    doc.table(t);
    doc.heading(format!("findings ({})", st.findings.len()));
    let mut t = Table::new(&[
        "SEVERITY",
        "NODE",
        "SUBJECT",
        "METRIC",
        "MEASURED",
        "EXPECTED",
        "DEVIATION",
        "MESSAGE",
    ]);
    for f in &st.findings {
        let unit = f.unit.clone().unwrap_or_default();
        t.push(vec![
            wire(&f.severity),
            f.subject.node_name().to_string(),
            subject(&f.subject),
            wire(&f.metric),
            format!("{} {unit}", fmt_opt(f.measured, 2)),
            format!("{} {unit}", fmt_opt(f.expected, 2)),
            f.deviation
                .map(|d| format!("{:+.0}%", d * 100.0))
                .unwrap_or_default(),
            f.message.clone(),
        ]);
    }
    doc.table(t);
    doc
}

/// The nodes no run measured, and why: skipped before the run (busy GPUs, someone's taint)
/// or not measured by it (an infrastructure reason). None of them is held against its node.
pub fn not_measured_doc(runs: &[FabricTestRun]) -> Doc {
    let mut t = Table::new(&["NODE", "RUN", "NOT MEASURED", "WHY"]);
    for r in runs {
        let run = run_name(r);
        let Some(st) = r.status.as_ref() else {
            continue;
        };
        for s in &st.skipped {
            t.push(vec![
                s.node.clone(),
                run.clone(),
                format!("skipped: {}", s.reason),
                s.message.clone(),
            ]);
        }
        for n in st.nodes.iter().filter(|n| n.not_measured.is_some()) {
            t.push(vec![
                n.node.clone(),
                run.clone(),
                n.not_measured
                    .map(|m| m.as_str())
                    .unwrap_or_default()
                    .into(),
                n.reason.clone().unwrap_or_default(),
            ]);
        }
    }
    let mut doc = Doc::default();
    doc.heading("nodes not measured (infrastructure, never held against the node)");
    if t.is_empty() {
        doc.line("none");
    } else {
        doc.table(t);
    }
    doc
}

/// `kubectl gpufabric report RUN`: the run, its pairs, and its test's quarantine.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub run: FabricTestRun,
    pub pairs: Vec<PairRow>,
    /// The test's quarantine now (none when the test is gone).
    pub quarantine: Option<Quarantine>,
}

impl View for Report {
    fn names(&self) -> Vec<String> {
        vec![crate::output::run_name(
            self.run.metadata.name.as_deref().unwrap_or_default(),
        )]
    }

    fn doc(&self) -> Doc {
        let mut doc = run_doc(&self.run);
        doc.extend(pairs_doc(&self.run, &self.pairs));
        doc.extend(ddp_nodes_doc(&self.run));
        doc.extend(nccl_nodes_doc(&self.run));
        if let Some(q) = &self.quarantine {
            doc.extend(q.doc());
        }
        doc.extend(not_measured_doc(std::slice::from_ref(&self.run)));
        doc
    }
}

#[cfg(test)]
mod tests;
