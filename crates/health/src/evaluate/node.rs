//! One measured node: every per-node check in order, filling what the fleet comparison
//! needs from it (`stats.rs`), and the slowness a smaller part at fault explains.

use super::NodeInput;
use super::gpu_pairs::check_pairs;
use super::hardware::{
    check_health, check_identity, check_phase_errors, check_transports, check_wrong_results,
};
use super::perf::{check_ddp, check_host, check_nccl};
use super::stats::NodeStats;
use crate::profiles;
use gpufabric_api::findings::{ExpectationSource, Finding, FindingKind, Metric, Severity, Subject};
use gpufabric_api::policy::Thresholds;
use gpufabric_api::result::CompactResult;
use std::collections::{BTreeMap, BTreeSet};

pub(super) fn judge_node(
    input: &NodeInput,
    r: &CompactResult,
    t: &Thresholds,
    out: &mut Vec<Finding>,
) -> NodeStats {
    let node = input.node.as_str();
    let product = if r.product.trim().is_empty() {
        input.product_label.clone().unwrap_or_default()
    } else {
        r.product.clone()
    };
    let exp = profiles::expectations_of(&product, r);
    let mut stats = NodeStats {
        node: node.to_string(),
        group: (profiles::normalize(&product), r.gpus),
        product: product.clone(),
        values: BTreeMap::new(),
        judged: BTreeSet::new(),
        graph_timed: r.graph_launches > 0,
    };

    check_identity(input, r, exp.as_ref(), out);
    check_phase_errors(node, r, out);
    check_health(node, r, t, exp.as_ref(), out);
    super::counters::check_counter_growth(node, r, input.baseline.as_ref(), t, out);
    check_wrong_results(node, r, out);
    check_transports(node, r, exp.as_ref(), out);
    check_nccl(node, r, t, exp.as_ref(), &mut stats, out);
    check_pairs(node, r, t, exp.as_ref(), &mut stats, out);
    check_host(node, r, t, exp.as_ref(), &mut stats, out);
    check_ddp(node, r, t, &mut stats, out);
    super::compute::check_compute(node, r, t, exp.as_ref(), &mut stats, out);
    drop_explained_slowness(out);
    stats
}

/// Drops Slow findings that a finding of a smaller or more specific part already explains:
/// pairs of a GPU with NVLink links down or NCCL falling back from NVLink, pairs that fell
/// back themselves, host bandwidth of a GPU whose PCIe link is degraded (those faults are
/// findings of their own kinds and are never reported as Slow as well), and node-wide
/// collective or DDP slowness on a node with a critical finding on a GPU or GPU pair.
pub(super) fn drop_explained_slowness(out: &mut Vec<Finding>) {
    let critical = |f: &&Finding, kinds: &[FindingKind]| {
        f.severity == Severity::Critical && kinds.contains(&f.kind)
    };
    let link_gpus: BTreeSet<u32> = out
        .iter()
        .filter(|f| {
            critical(
                f,
                &[FindingKind::NvlinkDown, FindingKind::TransportFallback],
            )
        })
        .filter_map(|f| match f.subject {
            Subject::Gpu { gpu, .. } => Some(gpu),
            _ => None,
        })
        .collect();
    let link_pairs: BTreeSet<(u32, u32)> = out
        .iter()
        .filter(|f| critical(f, &[FindingKind::TransportFallback]))
        .filter_map(|f| match f.subject {
            Subject::GpuPair { a, b, .. } => Some((a, b)),
            _ => None,
        })
        .collect();
    let link_node = out.iter().any(|f| {
        critical(&f, &[FindingKind::TransportFallback]) && matches!(f.subject, Subject::Node { .. })
    });
    let pcie_gpus: BTreeSet<u32> = out
        .iter()
        .filter(|f| critical(f, &[FindingKind::PcieDegraded]))
        .filter_map(|f| f.subject.gpu_index())
        .collect();
    // Parts at fault that explain node-wide slowness: a GPU or link on the NVLink path, or
    // a GPU slow at compute, explains slow collectives and slow DDP steps alike.
    let part = |f: &Finding| {
        f.severity == Severity::Critical
            && matches!(f.subject, Subject::Gpu { .. } | Subject::GpuPair { .. })
            && !matches!(
                f.metric,
                Metric::H2dBandwidth | Metric::D2hBandwidth | Metric::PcieLink
            )
    };
    // Every collective waits for its slowest GPU: a straggler explains it as a link does.
    let link_part = out.iter().any(part);
    let any_part = out.iter().any(part);
    // A GPU the compute check found slow at GEMMs is the DDP probe's straggler: one finding,
    // the one with its clocks and throttle reasons.
    let slow_gemm: BTreeSet<u32> = out
        .iter()
        .filter(|f| f.severity == Severity::Critical && f.metric == Metric::GemmThroughput)
        .filter_map(|f| f.subject.gpu_index())
        .collect();
    out.retain(|f| {
        !(f.kind == FindingKind::Straggler
            && f.metric == Metric::DdpComputeTime
            && f.subject
                .gpu_index()
                .is_some_and(|g| slow_gemm.contains(&g)))
    });
    out.retain(|f| {
        if f.kind != FindingKind::Slow {
            return true;
        }
        let s = &f.subject;
        let explained = match f.metric {
            // Node-wide collectives and DDP are as slow as their slowest GPU or link: when
            // one is named, the node-wide symptom is not (unless the spec set the floor).
            Metric::NcclBusBw | Metric::NcclLatency => {
                matches!(s, Subject::Node { .. })
                    && link_part
                    && f.source != Some(ExpectationSource::Threshold)
            }
            Metric::DdpScalingEfficiency | Metric::DdpComputeTime => {
                matches!(s, Subject::Node { .. })
                    && any_part
                    && f.source != Some(ExpectationSource::Threshold)
            }
            Metric::PairBandwidth | Metric::PairBidirBandwidth => match *s {
                Subject::Gpu { gpu, .. } => link_gpus.contains(&gpu),
                Subject::GpuPair { a, b, .. } => {
                    link_gpus.contains(&a)
                        || link_gpus.contains(&b)
                        || link_pairs.contains(&(a.min(b), a.max(b)))
                }
                Subject::Node { .. } => link_node,
                _ => false,
            },
            Metric::H2dBandwidth | Metric::D2hBandwidth => {
                s.gpu_index().is_some_and(|g| pcie_gpus.contains(&g))
            }
            _ => false,
        };
        !explained
    });
}
