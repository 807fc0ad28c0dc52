//! The GPUs in a FabricTest's status: each node's tainted GPUs, and which nodes are handled
//! per GPU and which per node, from what the device-taint writer did.

use crate::dra::GpuOutcome;
use gpufabric_api::device_taint::GpuHandling;
use gpufabric_api::test::{FabricTestStatus, NodeHealth};
use gpufabric_health::gpu_quarantine::GpuPlan;

/// Writes `outcome` into `status`: every node's `taintedGpus` (emptied where the test holds
/// none now) and `gpuHandling` (the served DeviceTaintRule version, the plan's nodes per GPU
/// and per node, the GPUs held and the GPU budget).
pub fn apply_gpu_outcome(
    status: &mut FabricTestStatus,
    version: Option<&str>,
    plan: &GpuPlan,
    outcome: &GpuOutcome,
) {
    for h in &mut status.nodes {
        h.tainted_gpus = outcome.tainted.get(&h.node).cloned().unwrap_or_default();
    }
    for (node, gpus) in &outcome.tainted {
        if !status.nodes.iter().any(|h| &h.node == node) {
            status.nodes.push(NodeHealth {
                node: node.clone(),
                tainted_gpus: gpus.clone(),
                ..NodeHealth::default()
            });
        }
    }
    status.gpu_handling = Some(GpuHandling {
        device_taint_rules: version.map(str::to_string),
        per_gpu: plan
            .per_gpu
            .iter()
            .take(GpuHandling::LISTED)
            .cloned()
            .collect(),
        per_gpu_count: plan.per_gpu.len() as u32,
        per_node: plan
            .per_node
            .iter()
            .take(GpuHandling::LISTED)
            .cloned()
            .collect(),
        per_node_count: plan.per_node.len() as u32,
        tainted_gpus: outcome.tainted.values().map(|g| g.len() as u32).sum(),
        gpu_budget: u32::try_from(plan.budget).unwrap_or(u32::MAX),
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufabric_api::device_taint::TaintedGpu;

    fn tainted(gpu: u32) -> TaintedGpu {
        TaintedGpu {
            gpu,
            device: format!("gpu.nvidia.com/a/gpu-{gpu}"),
            rule: "gpufabric-gpu-abcde".into(),
            reason: "straggler".into(),
            since: None,
        }
    }

    #[test]
    fn the_status_names_the_tainted_gpus_and_forgets_the_released_ones() {
        let mut status = FabricTestStatus {
            nodes: ["a", "b"]
                .iter()
                .map(|n| NodeHealth {
                    node: n.to_string(),
                    tainted_gpus: vec![tainted(1)],
                    ..NodeHealth::default()
                })
                .collect(),
            ..FabricTestStatus::default()
        };
        let plan = GpuPlan {
            per_gpu: vec!["a".into(), "b".into()],
            per_node: vec!["c".into()],
            budget: 4,
            ..GpuPlan::default()
        };
        let outcome = GpuOutcome {
            tainted: [("a".to_string(), vec![tainted(3)])].into(),
            errors: vec![],
        };
        apply_gpu_outcome(&mut status, Some("v1alpha3"), &plan, &outcome);
        assert_eq!(status.nodes[0].tainted_gpus, [tainted(3)]);
        assert!(status.nodes[1].tainted_gpus.is_empty(), "b was released");
        let handling = status.gpu_handling.expect("written");
        assert_eq!(handling.device_taint_rules.as_deref(), Some("v1alpha3"));
        assert_eq!(handling.per_node, ["c"]);
        assert_eq!(handling.per_gpu_count, 2);
        assert_eq!(handling.tainted_gpus, 1);
        assert_eq!(handling.gpu_budget, 4, "GPUs held of the budget");
    }
}
