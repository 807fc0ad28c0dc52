//! The fleet comparison: each series of values against the nodes of the same product and GPU count in the run.

use super::gpu_pairs::blame;
use super::node::drop_explained_slowness;
use super::stats::{NodeStats, SeriesKey};
use super::{how_far, tenths_below_100};
use crate::fleet::{self, Better, Rule};
use gpufabric_api::findings::{ExpectationSource, Finding, FindingKind, Metric, Severity, Subject};
use gpufabric_api::policy::Thresholds;
use gpufabric_api::suite::Collective;
use std::collections::{BTreeMap, BTreeSet};

fn series_better(metric: Metric) -> Better {
    match metric {
        Metric::NcclLatency | Metric::DdpComputeTime => Better::Lower,
        _ => Better::Higher,
    }
}

fn series_words(key: &SeriesKey) -> (String, &'static str) {
    let c = key
        .collective
        .map(Collective::nccl_tests_name)
        .unwrap_or("");
    match key.metric {
        Metric::PairBandwidth if key.peer.is_some() => ("copy bandwidth".into(), "GB/s"),
        Metric::PairBidirBandwidth if key.peer.is_some() => {
            ("bidirectional copy bandwidth".into(), "GB/s")
        }
        Metric::NcclBusBw => (format!("{c} peak bus bandwidth"), "GB/s"),
        Metric::NcclLatency => (format!("{c} latency"), "µs"),
        Metric::PairBandwidth => ("median GPU-pair copy bandwidth".into(), "GB/s"),
        Metric::PairBidirBandwidth => (
            "median GPU-pair bidirectional copy bandwidth".into(),
            "GB/s",
        ),
        Metric::H2dBandwidth => ("host-to-device bandwidth".into(), "GB/s"),
        Metric::D2hBandwidth => ("device-to-host bandwidth".into(), "GB/s"),
        Metric::DdpScalingEfficiency => ("DDP scaling efficiency".into(), "ratio"),
        Metric::DdpComputeTime => ("median DDP compute time".into(), "ms"),
        Metric::GemmThroughput => ("median GPU's bf16 GEMM throughput".into(), "TFLOP/s"),
        Metric::MemoryBandwidth => ("median GPU's device memory copy bandwidth".into(), "GB/s"),
        _ => ("value".into(), ""),
    }
}

/// How far below comparable nodes (or the test's baseline) a GPU's host copies must fall to
/// fail the node. Host copies time the host (its memory, the root port, other work on it) as
/// much as the GPU: one healthy H200 measured twelve times in an hour moved host-to-device
/// between 48.1 and 55.3 GB/s, once 12% below the median of the others
/// (bench/results/gpu-e2e-h200x1-2026-11-29-832985c). A fault in the host path costs more: a
/// link trained down one generation or to half its lanes halves it (and the PCIe check names
/// that link). A fleet outlier short of this gap is reported as Info and fails nothing.
pub(crate) const HOST_COPY_FAIL_GAP: f64 = 0.25;

/// Whether a metric is a host copy (host-to-device or device-to-host).
pub(crate) fn host_copy(metric: Metric) -> bool {
    matches!(metric, Metric::H2dBandwidth | Metric::D2hBandwidth)
}

pub(super) fn explicit_threshold(key: &SeriesKey, t: &Thresholds) -> bool {
    match key.metric {
        Metric::NcclBusBw => {
            key.collective == Some(Collective::AllReduce) && t.nccl_bus_bw_gbps.is_some()
        }
        Metric::NcclLatency => {
            key.collective == Some(Collective::AllReduce) && t.nccl_latency_us.is_some()
        }
        Metric::PairBandwidth => t.pair_bandwidth_gbps.is_some(),
        Metric::PairBidirBandwidth => t.pair_bidir_bandwidth_gbps.is_some(),
        Metric::H2dBandwidth | Metric::D2hBandwidth => t.host_bandwidth_gbps.is_some(),
        Metric::DdpScalingEfficiency => t.ddp_scaling_efficiency.is_some(),
        _ => false,
    }
}

/// The GPU pairs of one node (and metric) that are fleet outliers.
type PairOutliers = BTreeMap<(u32, u32), fleet::Outlier>;

pub(super) fn compare_fleet(stats: &[(NodeStats, Vec<Finding>)], t: &Thresholds) -> Vec<Finding> {
    let rule = Rule {
        score: t.fleet_outlier_score,
        min_gap: t.fleet_min_relative_gap,
        min_count: t.fleet_min_nodes.max(2) as usize,
    };
    let mut groups: BTreeMap<&(String, u32), Vec<&NodeStats>> = BTreeMap::new();
    for (s, _) in stats {
        if !s.group.0.is_empty() {
            groups.entry(&s.group).or_default().push(s);
        }
    }
    // Fleet findings by node; pair outliers apart, to be blamed on the smallest part.
    let mut found: BTreeMap<&str, Vec<Finding>> = BTreeMap::new();
    let mut pair_outliers: BTreeMap<(&str, Metric), PairOutliers> = BTreeMap::new();
    for ((_, gpus), members) in groups {
        if members.len() < rule.min_count {
            continue;
        }
        let keys: BTreeSet<SeriesKey> = members
            .iter()
            .flat_map(|s| s.values.keys().copied())
            .collect();
        for key in keys {
            if explicit_threshold(&key, t) {
                continue;
            }
            let values: Vec<(&NodeStats, f64)> = members
                .iter()
                .filter_map(|s| s.values.get(&key).map(|v| (*s, *v)))
                .collect();
            let better = series_better(key.metric);
            for (s, o) in fleet::outliers(&values, better, &rule) {
                if s.judged.contains(&key) && findings_exist(stats, &s.node, &key) {
                    continue;
                }
                if let (Some(a), Some(b)) = (key.gpu, key.peer) {
                    pair_outliers
                        .entry((s.node.as_str(), key.metric))
                        .or_default()
                        .insert((a, b), o);
                    continue;
                }
                found
                    .entry(s.node.as_str())
                    .or_default()
                    .push(series_finding(s, &key, &o, *gpus));
            }
        }
    }
    for ((node, metric), bad) in pair_outliers {
        let Some(s) = stats.iter().map(|(s, _)| s).find(|s| s.node == node) else {
            continue;
        };
        found
            .entry(node)
            .or_default()
            .extend(pair_findings(s, metric, &bad));
    }
    // What a node's own findings already explain is not reported again (see node.rs).
    let mut out = Vec::new();
    for (s, own) in stats {
        let Some(fleet_findings) = found.remove(s.node.as_str()) else {
            continue;
        };
        let mut all: Vec<Finding> = own.clone();
        all.extend(fleet_findings);
        drop_explained_slowness(&mut all);
        out.extend(
            all.into_iter()
                .filter(|f| f.source == Some(ExpectationSource::Fleet)),
        );
    }
    out
}

/// The finding for one node (or one GPU) that is an outlier of its fleet.
fn series_finding(s: &NodeStats, key: &SeriesKey, o: &fleet::Outlier, gpus: u32) -> Finding {
    let (what, unit) = series_words(key);
    let (subject, at) = match key.gpu {
        Some(g) => (Subject::gpu(&s.node, g), format!("GPU {g} on {}", s.node)),
        None => (Subject::node(&s.node), s.node.clone()),
    };
    let (shown, shown_median) = if unit == "ratio" {
        (
            format!("{:.0}%", o.value * 100.0),
            format!("{:.0}%", o.median * 100.0),
        )
    } else {
        (
            format!("{} {unit}", tenths_below_100(o.value)),
            format!("{} {unit}", tenths_below_100(o.median)),
        )
    };
    // Host-launched small sizes time the launching CPU as much as the GPUs: one 4 x H200
    // host moved all_reduce 8 B between 27 and 38 us from one healthy run to the next. Such a
    // latency outlier is Info; timed with CUDA graphs (4-7% between runs) it fails.
    let host_timed_latency = key.metric == Metric::NcclLatency && !s.graph_timed;
    let host_copy_spread = host_copy(key.metric)
        && o.median > 0.0
        && (o.median - o.value) / o.median < HOST_COPY_FAIL_GAP;
    let (severity, advice) = if host_timed_latency {
        (
            Severity::Info,
            "not failed: host-launched calls also time the launching CPU (suite.ncclSweep.graphLaunches times the GPUs alone).",
        )
    } else if host_copy_spread {
        (
            Severity::Info,
            "not failed: host copies also time the host, and one healthy GPU's move by up to 12% from one run to the next; a fault in the host path (a link trained down) costs more than 25% and fails.",
        )
    } else {
        (
            Severity::Critical,
            "compare its NVLink, PCIe and clock state with a healthy node.",
        )
    };
    Finding {
        collective: key.collective,
        ..Finding::new(
            FindingKind::Slow,
            subject,
            key.metric,
            severity,
            format!(
                "{at}: {what} {shown}, {} the median of {} comparable {} x{gpus} nodes ({shown_median}); {advice}",
                how_far(o.value, o.median),
                o.count,
                s.product,
            ),
        )
        .with_evidence(o.value, o.median, unit, ExpectationSource::Fleet)
    }
}

/// The findings for a node's GPU pairs that are outliers against the same pairs of
/// comparable nodes, blamed on the smallest part (the node, a GPU, or each pair).
fn pair_findings(s: &NodeStats, metric: Metric, bad: &PairOutliers) -> Vec<Finding> {
    let measured: BTreeSet<(u32, u32)> = s
        .values
        .keys()
        .filter(|k| k.metric == metric)
        .filter_map(|k| k.gpu.zip(k.peer))
        .collect();
    let keys: BTreeSet<(u32, u32)> = bad.keys().copied().collect();
    let verdict = blame(s.group.1, &measured, &keys);
    let what = if metric == Metric::PairBidirBandwidth {
        "bidirectional copy bandwidth"
    } else {
        "copy bandwidth"
    };
    let finding = |subject: Subject, at: String, outliers: Vec<&fleet::Outlier>| {
        let measured =
            fleet::median(&outliers.iter().map(|o| o.value).collect::<Vec<_>>()).unwrap_or(0.0);
        let expected =
            fleet::median(&outliers.iter().map(|o| o.median).collect::<Vec<_>>()).unwrap_or(0.0);
        let count = outliers.iter().map(|o| o.count).min().unwrap_or(0);
        Finding::new(
            FindingKind::Slow,
            subject,
            metric,
            Severity::Critical,
            format!(
                "{at}: {what} {} GB/s, {} the same GPU pairs on {count} comparable {} nodes ({} GB/s); check the NVLink or PCIe path (nvidia-smi topo -m, nvidia-smi nvlink -s).",
                tenths_below_100(measured),
                how_far(measured, expected),
                s.product,
                tenths_below_100(expected)
            ),
        )
        .with_evidence(measured, expected, "GB/s", ExpectationSource::Fleet)
    };
    let mut out = Vec::new();
    if verdict.node {
        out.push(finding(
            Subject::node(&s.node),
            format!("Every GPU pair on {}", s.node),
            bad.values().collect(),
        ));
        return out;
    }
    for k in &verdict.gpus {
        out.push(finding(
            Subject::gpu(&s.node, *k),
            format!("GPU {k} on {} to every other GPU", s.node),
            bad.iter()
                .filter(|((a, b), _)| a == k || b == k)
                .map(|(_, o)| o)
                .collect(),
        ));
    }
    for (a, b) in &verdict.pairs {
        out.extend(bad.get(&(*a, *b)).map(|o| {
            finding(
                Subject::gpu_pair(&s.node, *a, *b),
                format!("GPU {a} <-> GPU {b} on {}", s.node),
                vec![o],
            )
        }));
    }
    out
}

/// Whether the node already has a finding on this series (from a threshold or profile).
fn findings_exist(stats: &[(NodeStats, Vec<Finding>)], node: &str, key: &SeriesKey) -> bool {
    stats
        .iter()
        .filter(|(s, _)| s.node == node)
        .flat_map(|(_, fs)| fs.iter())
        .filter(|f| !super::tuning::spared(f))
        .any(|f| {
            f.metric == key.metric
                && f.collective == key.collective
                && f.subject.gpu_index() == key.gpu
                && f.subject.peer_gpu_index() == key.peer
        })
}
