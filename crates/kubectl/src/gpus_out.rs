//! The GPUs a FabricTest took out of service with DRA device taints, read from its
//! `status.nodes[].taintedGpus`: one list for the node, status and report views, as a
//! sentence per GPU and as a table.

use crate::doc::{Doc, Table};
use gpufabric_api::FabricTest;
use gpufabric_api::device_taint::TaintedGpu;
use serde::Serialize;

/// One GPU a test holds out of service, with the node and test it belongs to.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuOut {
    pub test: String,
    pub node: String,
    /// The GPU, its DRA device, the rule, the finding and since when.
    #[serde(flatten)]
    pub gpu: TaintedGpu,
}

/// Every GPU `test` holds out of service, by node and GPU index.
pub fn of_test(test: &FabricTest) -> Vec<GpuOut> {
    let name = test.metadata.name.clone().unwrap_or_default();
    let mut out: Vec<GpuOut> = test
        .status
        .iter()
        .flat_map(|s| &s.nodes)
        .flat_map(|h| {
            h.tainted_gpus.iter().map(|g| GpuOut {
                test: name.clone(),
                node: h.node.clone(),
                gpu: g.clone(),
            })
        })
        .collect();
    out.sort_by(|a, b| (&a.node, a.gpu.gpu).cmp(&(&b.node, b.gpu.gpu)));
    out
}

/// `node`'s GPUs out of service in every test of `tests`, by test and GPU index.
pub fn of_node(tests: &[FabricTest], node: &str) -> Vec<GpuOut> {
    let mut out: Vec<GpuOut> = tests
        .iter()
        .flat_map(of_test)
        .filter(|g| g.node == node)
        .collect();
    out.sort_by(|a, b| (&a.test, a.gpu.gpu).cmp(&(&b.test, b.gpu.gpu)));
    out
}

/// One GPU as a sentence: `GPU 3 (gpu.nvidia.com/h100-03/gpu-3) since ...: the finding`.
pub fn sentence(g: &TaintedGpu) -> String {
    format!(
        "GPU {} ({}){}: {}",
        g.gpu,
        g.device,
        g.since
            .as_ref()
            .map(|t| format!(" since {}", t.0))
            .unwrap_or_default(),
        g.reason
    )
}

/// The GPUs as a table under `heading`; nothing at all when there are none (a cluster
/// without DRA device taints never shows the section).
pub fn doc(heading: &str, gpus: &[GpuOut]) -> Doc {
    let mut doc = Doc::default();
    if gpus.is_empty() {
        return doc;
    }
    doc.heading(heading);
    let mut t = Table::new(&["NODE", "TEST", "GPU", "DEVICE", "SINCE", "RULE", "FINDING"]);
    for g in gpus {
        t.push(vec![
            g.node.clone(),
            g.test.clone(),
            g.gpu.gpu.to_string(),
            g.gpu.device.clone(),
            g.gpu
                .since
                .as_ref()
                .map(|t| t.0.to_string())
                .unwrap_or_else(|| "-".into()),
            g.gpu.rule.clone(),
            g.gpu.reason.clone(),
        ]);
    }
    doc.table(t);
    doc
}

/// The heading every view gives the section.
pub const HEADING: &str =
    "GPUs out of service (DRA device taints; the node itself stays schedulable)";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    #[test]
    fn every_tainted_gpu_of_a_test_is_listed_by_node_and_index() {
        let t = fixtures::with_tainted_gpus(fixtures::test());
        let out = of_test(&t);
        let gpus: Vec<(&str, u32)> = out.iter().map(|g| (g.node.as_str(), g.gpu.gpu)).collect();
        assert_eq!(gpus, [("h100-00", 6), ("h100-03", 2), ("h100-03", 5)]);
        assert!(out.iter().all(|g| g.test == "nightly"));
        assert_eq!(
            of_node(&[t], "h100-03")
                .iter()
                .map(|g| g.gpu.gpu)
                .collect::<Vec<_>>(),
            [2, 5]
        );
    }

    #[test]
    fn a_gpu_reads_as_its_index_device_since_and_finding() {
        let t = fixtures::with_tainted_gpus(fixtures::test());
        let out = of_node(&[t], "h100-03");
        assert_eq!(
            sentence(&out[0].gpu),
            "GPU 2 (gpu.nvidia.com/h100-03/gpu-2) since 2026-11-21T02:04:10Z: GPU pair 2-5 copies at 95 GB/s"
        );
        let text = doc(HEADING, &out).render();
        assert!(
            text.contains("h100-03  nightly  2    gpu.nvidia.com/h100-03/gpu-2  2026-11-21T02:04:10Z  gpufabric-gpu-8c2d1  GPU pair 2-5 copies at 95 GB/s"),
            "{text}"
        );
    }

    #[test]
    fn no_tainted_gpu_no_section() {
        assert!(of_test(&fixtures::test()).is_empty());
        assert_eq!(doc(HEADING, &[]).render(), "");
    }
}
