//! The fleet comparison: each series of values against the nodes of the same product and GPU count in the run.

use super::node::{NodeStats, SeriesKey};
use super::*;

fn series_better(metric: Metric) -> Better {
    match metric {
        Metric::NcclLatency | Metric::DdpComputeTime => Better::Lower,
        _ => Better::Higher,
    }
}

fn series_words(key: &SeriesKey) -> (String, &'static str) {
    let c = key.collective.map(collective_name).unwrap_or("");
    match key.metric {
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
        _ => ("value".into(), ""),
    }
}

fn explicit_threshold(key: &SeriesKey, t: &Thresholds) -> bool {
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

pub(super) fn compare_fleet(stats: &[(NodeStats, Vec<Finding>)], t: &Thresholds) -> Vec<Finding> {
    let rule = Rule {
        score: t.fleet_outlier_score,
        min_gap: t.fleet_min_relative_gap,
        min_count: t.fleet_min_nodes.max(2) as usize,
    };
    // A node with a critical finding on one of its GPUs or GPU pairs has its node-wide
    // slowness explained already: the smallest subject at fault is named, not the node.
    let explained: BTreeSet<&str> = stats
        .iter()
        .filter(|(_, fs)| {
            fs.iter().any(|f| {
                f.severity == Severity::Critical
                    && matches!(f.subject.kind, SubjectKind::Gpu | SubjectKind::GpuPair)
            })
        })
        .map(|(s, _)| s.node.as_str())
        .collect();
    let pcie_explained: BTreeSet<(&str, u32)> = stats
        .iter()
        .flat_map(|(s, fs)| {
            fs.iter()
                .filter(|f| f.severity == Severity::Critical && f.kind == FindingKind::PcieDegraded)
                .filter_map(|f| f.subject.gpu)
                .map(move |g| (s.node.as_str(), g))
        })
        .collect();
    let mut groups: BTreeMap<&(String, u32), Vec<&NodeStats>> = BTreeMap::new();
    for (s, _) in stats {
        if !s.group.0.is_empty() {
            groups.entry(&s.group).or_default().push(s);
        }
    }
    let mut out = Vec::new();
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
                if key.gpu.is_none() && explained.contains(s.node.as_str()) {
                    continue;
                }
                if let Some(g) = key.gpu
                    && pcie_explained.contains(&(s.node.as_str(), g))
                {
                    continue;
                }
                let (what, unit) = series_words(&key);
                let subject = match key.gpu {
                    Some(g) => Subject::gpu(&s.node, g),
                    None => Subject::node(&s.node),
                };
                let at = match key.gpu {
                    Some(g) => format!("GPU {g} on {}", s.node),
                    None => s.node.clone(),
                };
                let (shown, shown_median) = if unit == "ratio" {
                    (
                        format!("{:.0}%", o.value * 100.0),
                        format!("{:.0}%", o.median * 100.0),
                    )
                } else {
                    (
                        format!("{} {unit}", num(o.value)),
                        format!("{} {unit}", num(o.median)),
                    )
                };
                out.push(Finding {
                    collective: key.collective,
                    ..evidence(
                        FindingKind::Slow,
                        subject,
                        key.metric,
                        o.value,
                        o.median,
                        unit,
                        ExpectationSource::Fleet,
                        Severity::Critical,
                        format!(
                            "{at}: {what} {shown}, {} the median of {} comparable {} x{gpus} nodes ({shown_median}); compare its NVLink, PCIe and clock state with a healthy node.",
                            how_far(o.value, o.median),
                            o.count,
                            s.product,
                        ),
                    )
                });
            }
        }
    }
    out
}

/// Whether the node already has a finding on this series (from a threshold or profile).
fn findings_exist(stats: &[(NodeStats, Vec<Finding>)], node: &str, key: &SeriesKey) -> bool {
    stats
        .iter()
        .filter(|(s, _)| s.node == node)
        .flat_map(|(_, fs)| fs.iter())
        .any(|f| {
            f.metric == key.metric && f.collective == key.collective && f.subject.gpu == key.gpu
        })
}
