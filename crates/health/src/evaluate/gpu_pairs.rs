//! GPU pairs of one node against the node's other pairs and floors, with blame of the
//! smallest part at fault (pair, GPU or node).

use super::classify::{Missed, classify};
use super::direction;
use super::perf::floor_of;
use super::stats::{NodeStats, SeriesKey};
use super::{how_far, source_words, tenths_below_100};
use crate::fleet::{self, Rule};
use crate::profiles::Expectations;
use gpufabric_api::findings::{ExpectationSource, Finding, FindingKind, Metric, Severity, Subject};
use gpufabric_api::policy::Thresholds;
use gpufabric_api::result::CompactResult;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Debug, PartialEq)]
pub(super) struct Blame {
    pub(super) node: bool,
    pub(super) gpus: Vec<u32>,
    pub(super) pairs: Vec<(u32, u32)>,
}

pub(super) fn blame(g: u32, measured: &BTreeSet<(u32, u32)>, bad: &BTreeSet<(u32, u32)>) -> Blame {
    if bad.is_empty() {
        return Blame {
            node: false,
            gpus: Vec::new(),
            pairs: Vec::new(),
        };
    }
    if g >= 3 && measured.len() >= 3 && measured.iter().all(|p| bad.contains(p)) {
        return Blame {
            node: true,
            gpus: Vec::new(),
            pairs: Vec::new(),
        };
    }
    let mut gpus = Vec::new();
    if g >= 3 {
        for k in 0..g {
            let mine: Vec<&(u32, u32)> = measured
                .iter()
                .filter(|(a, b)| *a == k || *b == k)
                .collect();
            if mine.len() >= 2 && mine.iter().all(|p| bad.contains(p)) {
                gpus.push(k);
            }
        }
    }
    let pairs = bad
        .iter()
        .filter(|(a, b)| !gpus.contains(a) && !gpus.contains(b))
        .copied()
        .collect();
    Blame {
        node: false,
        gpus,
        pairs,
    }
}

/// A GPU-pair measurement of a node: value per unordered pair.
struct PairSet {
    metric: Metric,
    what: &'static str,
    values: BTreeMap<(u32, u32), f64>,
    floor: Option<(f64, ExpectationSource)>,
}

fn unordered_pairs(r: &CompactResult) -> BTreeMap<(u32, u32), f64> {
    let mut values = BTreeMap::new();
    if r.copy_uni.len() != (r.gpus as usize) * (r.gpus as usize) {
        return values;
    }
    for a in 0..r.gpus {
        for b in (a + 1)..r.gpus {
            let there = r.pair_uni(a, b).filter(|v| *v > 0.0);
            let back = r.pair_uni(b, a).filter(|v| *v > 0.0);
            let v = match (there, back) {
                (Some(x), Some(y)) => Some(x.min(y)),
                (x, y) => x.or(y),
            };
            if let Some(v) = v {
                values.insert((a, b), v);
            }
        }
    }
    values
}

fn bidir_pairs(r: &CompactResult) -> BTreeMap<(u32, u32), f64> {
    let mut values = BTreeMap::new();
    if r.gpus < 2 || r.copy_bidir.len() != (r.gpus as usize) * (r.gpus as usize - 1) / 2 {
        return values;
    }
    for a in 0..r.gpus {
        for b in (a + 1)..r.gpus {
            if let Some(v) = r.pair_bidir(a, b).filter(|v| *v > 0.0) {
                values.insert((a, b), v);
            }
        }
    }
    values
}

pub(super) fn check_pairs(
    node: &str,
    r: &CompactResult,
    t: &Thresholds,
    exp: Option<&Expectations>,
    stats: &mut NodeStats,
    out: &mut Vec<Finding>,
) {
    if super::perf::copies_too_short(r) {
        let measured = !r.copy_uni.is_empty()
            || !r.copy_bidir.is_empty()
            || !r.host_to_device.is_empty()
            || !r.device_to_host.is_empty();
        if measured {
            out.push(super::perf::copies_not_judged(node, r));
        }
        return;
    }
    let one_way_floor = crate::floors::pair(t, exp, r.pair_bytes).map(|f| (f.gbps, f.source));
    let sets = [
        PairSet {
            metric: Metric::PairBandwidth,
            what: "copy bandwidth",
            values: unordered_pairs(r),
            // The floor the report draws too ([`crate::floors::pair`]).
            floor: one_way_floor,
        },
        PairSet {
            metric: Metric::PairBidirBandwidth,
            what: "bidirectional copy bandwidth",
            values: bidir_pairs(r),
            floor: floor_of(
                t.pair_bidir_bandwidth_gbps,
                exp.and_then(|e| e.pair_bidir_floor_gbps),
            ),
        },
    ];
    // Pairs and GPUs already blamed by an earlier set are not blamed again.
    let mut covered_pairs: BTreeSet<(u32, u32)> = BTreeSet::new();
    let mut covered_gpus: BTreeSet<u32> = BTreeSet::new();
    let mut covered_node = false;
    let rule = Rule {
        score: t.fleet_outlier_score,
        min_gap: t.fleet_min_relative_gap,
        min_count: 3,
    };
    let explicit = |m: Metric| match m {
        Metric::PairBandwidth => t.pair_bandwidth_gbps.is_some(),
        _ => t.pair_bidir_bandwidth_gbps.is_some(),
    };
    // Comparing a pair with the node's other pairs needs a topology where every pair is
    // alike: the boards a known product ships on (all-to-all NVLink or NVSwitch). Elsewhere
    // (PCIe across sockets, NVLink bridges between two GPUs) each pair is compared with the
    // same pair of comparable nodes instead.
    let uniform = exp.is_some_and(|e| e.uniform_pairs);
    // A GPU whose sending or receiving side is slow is named with that side first; its
    // pairs are not blamed again below.
    covered_gpus.extend(direction::check_sides(
        node,
        r,
        one_way_floor,
        uniform && !explicit(Metric::PairBandwidth),
        &rule,
        out,
    ));
    for set in sets {
        if set.values.is_empty() {
            continue;
        }
        let Some((key, node_median)) =
            record_pair_stats(&set, !uniform && !explicit(set.metric), stats)
        else {
            continue;
        };
        if covered_node {
            continue;
        }
        let mut slow = classify(
            &set.values,
            set.floor,
            uniform && !explicit(set.metric),
            &rule,
        );
        slow.retain(|(a, b), _| {
            !covered_pairs.contains(&(*a, *b))
                && !covered_gpus.contains(a)
                && !covered_gpus.contains(b)
        });
        let measured: BTreeSet<(u32, u32)> = set.values.keys().copied().collect();
        let bad: BTreeSet<(u32, u32)> = slow.keys().copied().collect();
        let verdict = blame(r.gpus, &measured, &bad);
        if verdict.node {
            let (floor, source) = set.floor.unwrap_or((node_median, ExpectationSource::Node));
            if set
                .floor
                .is_some_and(|(_, s)| s == ExpectationSource::Profile)
            {
                stats.judged.insert(key);
            }
            out.push(every_pair_slow(node, &set, node_median, floor, source));
            covered_node = true;
            continue;
        }
        for k in &verdict.gpus {
            out.push(gpu_slow_to_every_peer(node, &set, &slow, *k, node_median));
            covered_gpus.insert(*k);
        }
        for (a, b) in &verdict.pairs {
            out.push(slow_pair(node, &set, &slow, (*a, *b), node_median));
            covered_pairs.insert((*a, *b));
        }
    }
}

/// What the fleet comparison keeps of one set of pairs: each pair (`per_pair`: where pairs
/// are compared across nodes, not within the node) and the node's median, which is
/// returned with its key; None without values.
fn record_pair_stats(
    set: &PairSet,
    per_pair: bool,
    stats: &mut NodeStats,
) -> Option<(SeriesKey, f64)> {
    if per_pair {
        for ((a, b), v) in &set.values {
            stats.values.insert(
                SeriesKey {
                    metric: set.metric,
                    collective: None,
                    gpu: Some(*a),
                    peer: Some(*b),
                },
                *v,
            );
        }
    }
    let all: Vec<f64> = set.values.values().copied().collect();
    let node_median = fleet::median(&all)?;
    let key = SeriesKey::of_node(set.metric);
    stats.values.insert(key, node_median);
    if set
        .floor
        .is_some_and(|(_, s)| s == ExpectationSource::Threshold)
    {
        stats.judged.insert(key);
    }
    Some((key, node_median))
}

/// Every GPU pair of the node is slow: the node is blamed, against `floor` from `source`.
fn every_pair_slow(
    node: &str,
    set: &PairSet,
    node_median: f64,
    floor: f64,
    source: ExpectationSource,
) -> Finding {
    Finding::new(
        FindingKind::Slow,
        Subject::node(node),
        set.metric,
        Severity::Critical,
        format!(
            "Every GPU pair on {node} is slow: {} median {} GB/s, {} {} ({} GB/s); check NVLink and NVSwitch health (nvidia-smi nvlink -s, the fabric manager service).",
            set.what,
            tenths_below_100(node_median),
            how_far(node_median, floor),
            source_words(source, &format!("pair {}", set.what)),
            tenths_below_100(floor)
        ),
    )
    .with_evidence(node_median, floor, "GB/s", source)
}

/// GPU `k` is slow to every other GPU: its pairs' median against what they missed.
fn gpu_slow_to_every_peer(
    node: &str,
    set: &PairSet,
    slow: &BTreeMap<(u32, u32), Missed>,
    k: u32,
    node_median: f64,
) -> Finding {
    let mine: Vec<f64> = set
        .values
        .iter()
        .filter(|((a, b), _)| *a == k || *b == k)
        .map(|(_, v)| *v)
        .collect();
    let others: Vec<f64> = set
        .values
        .iter()
        .filter(|((a, b), _)| *a != k && *b != k)
        .map(|(_, v)| *v)
        .collect();
    let measured = fleet::median(&mine).unwrap_or(0.0);
    // The expectation of the GPU's pairs: a floor one of them missed, else the
    // node's fastest pair when that is what they missed, else the median of the
    // node's pairs that do not involve the GPU.
    let theirs: Vec<Missed> = slow
        .iter()
        .filter(|((a, b), _)| *a == k || *b == k)
        .map(|(_, m)| *m)
        .collect();
    let missed = Missed::of_group(&theirs, fleet::median(&others).unwrap_or(node_median));
    let (expected, source) = missed.expectation();
    let against = match missed {
        Missed::NodeFastest(_) => "the node's fastest pair".to_string(),
        Missed::NodeMedian(_) => source_words(source, "pairs"),
        Missed::Floor(_, s) => source_words(s, "pair bandwidth"),
    };
    Finding::new(
        FindingKind::Slow,
        Subject::gpu(node, k),
        set.metric,
        Severity::Critical,
        format!(
            "GPU {k} on {node} is slow to every other GPU: {} median {} GB/s, {} {against} ({} GB/s); check GPU {k}'s NVLink links (nvidia-smi nvlink -s -i {k}) and whether other work moves data through them.",
            set.what,
            tenths_below_100(measured),
            how_far(measured, expected),
            tenths_below_100(expected)
        ),
    )
    .with_evidence(measured, expected, "GB/s", source)
}

/// The pair `(a, b)` is slow: its bandwidth against what it missed.
fn slow_pair(
    node: &str,
    set: &PairSet,
    slow: &BTreeMap<(u32, u32), Missed>,
    (a, b): (u32, u32),
    node_median: f64,
) -> Finding {
    let v = set.values.get(&(a, b)).copied().unwrap_or(0.0);
    let missed = slow
        .get(&(a, b))
        .copied()
        .unwrap_or(Missed::NodeMedian(node_median));
    let (expected, source) = missed.expectation();
    let against = match missed {
        Missed::NodeFastest(f) => format!("the node's fastest pair ({} GB/s)", tenths_below_100(f)),
        Missed::NodeMedian(m) => format!(
            "the node's other pairs (median {} GB/s)",
            tenths_below_100(m)
        ),
        Missed::Floor(f, s) => format!(
            "{} ({} GB/s)",
            source_words(s, &format!("pair {}", set.what)),
            tenths_below_100(f)
        ),
    };
    Finding::new(
        FindingKind::Slow,
        Subject::gpu_pair(node, a, b),
        set.metric,
        Severity::Critical,
        format!(
            "GPU {a} <-> GPU {b} on {node}: {} {} GB/s, {} {against}; check the NVLink links of both GPUs (nvidia-smi nvlink -s).",
            set.what,
            tenths_below_100(v),
            how_far(v, expected),
        ),
    )
    .with_evidence(v, expected, "GB/s", source)
}
