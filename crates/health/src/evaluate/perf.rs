//! Per-node performance rules: NCCL against thresholds and profiles, GPU pairs against the node and floors (with blame of the smallest part), host copies, DDP scaling and stragglers.

use super::direction;
use super::node::{NodeStats, SeriesKey};
use super::*;

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

/// The floor a bandwidth is held to: the spec's threshold, else the GPU profile's floor.
fn floor_of(threshold: Option<f64>, profile: Option<f64>) -> Option<(f64, ExpectationSource)> {
    threshold
        .map(|v| (v, ExpectationSource::Threshold))
        .or_else(|| profile.map(|v| (v, ExpectationSource::Profile)))
}

/// The median one-way copy bandwidth of a node's GPU pairs (GB/s), if it measured any.
fn median_pair_copy(r: &CompactResult) -> Option<f64> {
    let n = r.gpus as usize;
    if n < 2 || r.copy_uni.len() != n * n {
        return None;
    }
    let cells: Vec<f64> = (0..n)
        .flat_map(|a| (0..n).filter(move |b| *b != a).map(move |b| a * n + b))
        .filter_map(|i| r.copy_uni.get(i).copied())
        .filter(|v| *v > 0.0)
        .collect();
    fleet::median(&cells)
}

/// On an NVSwitch board, all_reduce bus bandwidth far below what the same GPUs copy to each
/// other ([`profiles::NCCL_TO_COPY_FLOOR`] of the median pair) means the links are fine and
/// NCCL is not using them: a setting, a plugin or a transport choice, which no floor from
/// the links alone would single out when the links are faster than the floor needs.
fn nccl_below_copy_engines(
    node: &str,
    r: &CompactResult,
    exp: Option<&Expectations>,
    busbw: f64,
) -> Option<Finding> {
    if !exp.is_some_and(|e| e.switched) {
        return None;
    }
    let pair = median_pair_copy(r)?;
    let bar = pair * profiles::NCCL_TO_COPY_FLOOR;
    if busbw >= bar {
        return None;
    }
    Some(Finding {
        collective: Some(Collective::AllReduce),
        ..Finding::new(FindingKind::Slow, Subject::node(node), Metric::NcclBusBw, Severity::Critical, format!(
                "all_reduce peak bus bandwidth on {node} is {} GB/s, {:.0}% of the {} GB/s its GPUs copy to each other (median pair, one way); on NVSwitch NCCL reaches about 90% of it, so the links are healthy and NCCL is not using them: check NCCL_* settings (NCCL_P2P_DISABLE, NCCL_ALGO, NCCL_PROTO, NCCL_MAX_NCHANNELS), NCCL plugins and the transport NCCL chose (NCCL_DEBUG=INFO).",
                num(busbw),
                100.0 * busbw / pair,
                num(pair)
            )).with_evidence(busbw, bar, "GB/s", ExpectationSource::Node)
    })
}

pub(super) fn check_nccl(
    node: &str,
    r: &CompactResult,
    t: &Thresholds,
    exp: Option<&Expectations>,
    stats: &mut NodeStats,
    out: &mut Vec<Finding>,
) {
    for c in &r.collectives {
        let bw_key = SeriesKey {
            metric: Metric::NcclBusBw,
            collective: Some(c.collective),
            gpu: None,
            peer: None,
        };
        if c.peak_busbw > 0.0 {
            stats.values.insert(bw_key, c.peak_busbw);
            let floor = if c.collective != Collective::AllReduce {
                None
            } else {
                floor_of(
                    t.nccl_bus_bw_gbps,
                    exp.and_then(|e| e.all_reduce_floor_gbps),
                )
            };
            // NCCL far below the node's own copy engines says more than the profile's floor
            // (the links are fine), so it replaces that finding; a threshold the spec set
            // is reported as such, and the relation only where the threshold is met.
            let relation = (c.collective == Collective::AllReduce)
                .then(|| nccl_below_copy_engines(node, r, exp, c.peak_busbw))
                .flatten()
                .filter(|_| {
                    !floor
                        .is_some_and(|(f, s)| s == ExpectationSource::Threshold && c.peak_busbw < f)
                });
            let floor = if relation.is_some() { None } else { floor };
            if let Some(f) = relation {
                stats.judged.insert(bw_key);
                out.push(f);
            }
            if let Some((floor, source)) = floor {
                stats.judged.insert(bw_key);
                if c.peak_busbw < floor {
                    out.push(Finding {
                        collective: Some(c.collective),
                        ..Finding::new(FindingKind::Slow, Subject::node(node), Metric::NcclBusBw, Severity::Critical, format!(
                                "{} peak bus bandwidth on {node} is {} GB/s, {} {} ({} GB/s); check NVLink state and NCCL's transport (NCCL_DEBUG=INFO).",
                                c.collective.nccl_tests_name(),
                                num(c.peak_busbw),
                                how_far(c.peak_busbw, floor),
                                source_words(source, "all_reduce bus bandwidth"),
                                num(floor)
                            )).with_evidence(c.peak_busbw, floor, "GB/s", source)
                    });
                }
            }
        }
        let latency = match c.alpha_beta {
            Some((alpha, _)) if alpha > 0.0 => alpha,
            _ => c.smallest_time_us,
        };
        if latency > 0.0 {
            let key = SeriesKey {
                metric: Metric::NcclLatency,
                collective: Some(c.collective),
                gpu: None,
                peer: None,
            };
            stats.values.insert(key, latency);
            if c.collective == Collective::AllReduce
                && let Some(ceiling) = t.nccl_latency_us
            {
                stats.judged.insert(key);
                if latency > ceiling {
                    out.push(Finding {
                        collective: Some(c.collective),
                        ..Finding::new(FindingKind::Slow, Subject::node(node), Metric::NcclLatency, Severity::Critical, format!(
                                "all_reduce latency on {node} is {} µs, {} the spec's ceiling of {} µs; check NCCL's transport and protocol choice (NCCL_DEBUG=INFO).",
                                num(latency),
                                how_far(latency, ceiling),
                                num(ceiling)
                            )).with_evidence(latency, ceiling, "µs", ExpectationSource::Threshold)
                    });
                }
            }
        }
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

/// The expectation a slow pair missed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Missed {
    /// A floor: the spec's threshold or the profile's.
    Floor(f64, ExpectationSource),
    /// The node's median pair.
    NodeMedian(f64),
    /// The node's fastest pair.
    NodeFastest(f64),
}

impl Missed {
    pub(super) fn expectation(self) -> (f64, ExpectationSource) {
        match self {
            Missed::Floor(v, s) => (v, s),
            Missed::NodeMedian(v) | Missed::NodeFastest(v) => (v, ExpectationSource::Node),
        }
    }
}

/// The node's fastest pair and the bar below which a pair is slow against it: on a board
/// whose pairs are all alike, no fault makes a pair faster, so the fastest pair is what
/// each should reach, less the fleet rule's minimum gap and its score in robust standard
/// deviations of the node's pairs (the fastest pair is itself the high end of the noise).
fn fastest_reference(values: &[f64], mad: f64, rule: &Rule) -> Option<(f64, f64)> {
    let fastest = values
        .iter()
        .copied()
        .filter(|v| v.is_finite())
        .reduce(f64::max)?;
    let bar = fastest * (1.0 - rule.min_gap) - rule.score * 1.4826 * mad;
    (fastest > 0.0 && bar > 0.0).then_some((fastest, bar))
}

/// Each slow cell of `values` with the expectation it missed: against the node's other
/// cells first (the sharpest evidence for one link) when `in_node` (a board whose pairs are
/// all alike, no explicit threshold) and there are enough of them, then against the node's
/// fastest cell, then the floor (an explicit threshold alone when the spec sets one).
pub(super) fn classify<K: Copy + Ord>(
    values: &BTreeMap<K, f64>,
    floor: Option<(f64, ExpectationSource)>,
    in_node: bool,
    rule: &Rule,
) -> BTreeMap<K, Missed> {
    let all: Vec<f64> = values.values().copied().collect();
    let mut slow = BTreeMap::new();
    let Some(node_median) = fleet::median(&all) else {
        return slow;
    };
    let node_mad = fleet::mad(&all, node_median);
    let fastest = fastest_reference(&all, node_mad, rule);
    let judge_in_node = in_node && all.len() >= rule.min_count;
    for (cell, v) in values {
        if judge_in_node && fleet::is_outlier(*v, node_median, node_mad, Better::Higher, rule) {
            slow.insert(*cell, Missed::NodeMedian(node_median));
        } else if let Some((f, _)) = fastest.filter(|(_, bar)| judge_in_node && *v < *bar) {
            // Most cells slow (the ports of two GPUs, say): the median is slow too, but on
            // a board whose pairs are all alike each should reach the fastest.
            slow.insert(*cell, Missed::NodeFastest(f));
        } else if let Some((floor, source)) = floor
            && *v < floor
        {
            slow.insert(*cell, Missed::Floor(floor, source));
        }
    }
    slow
}

pub(super) fn check_pairs(
    node: &str,
    r: &CompactResult,
    t: &Thresholds,
    exp: Option<&Expectations>,
    stats: &mut NodeStats,
    out: &mut Vec<Finding>,
) {
    let sets = [
        PairSet {
            metric: Metric::PairBandwidth,
            what: "copy bandwidth",
            values: unordered_pairs(r),
            floor: floor_of(t.pair_bandwidth_gbps, exp.and_then(|e| e.pair_floor_gbps)),
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
    let one_way_floor = floor_of(t.pair_bandwidth_gbps, exp.and_then(|e| e.pair_floor_gbps));
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
        if !uniform && !explicit(set.metric) {
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
        let Some(node_median) = fleet::median(&all) else {
            continue;
        };
        let key = SeriesKey {
            metric: set.metric,
            collective: None,
            gpu: None,
            peer: None,
        };
        stats.values.insert(key, node_median);
        if set
            .floor
            .is_some_and(|(_, s)| s == ExpectationSource::Threshold)
        {
            stats.judged.insert(key);
        }
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
            out.push(Finding::new(FindingKind::Slow, Subject::node(node), set.metric, Severity::Critical, format!(
                    "Every GPU pair on {node} is slow: {} median {} GB/s, {} {} ({} GB/s); check NVLink and NVSwitch health (nvidia-smi nvlink -s, the fabric manager service).",
                    set.what,
                    num(node_median),
                    how_far(node_median, floor),
                    source_words(source, &format!("pair {}", set.what)),
                    num(floor)
                )).with_evidence(node_median, floor, "GB/s", source));
            covered_node = true;
            continue;
        }
        for k in &verdict.gpus {
            let mine: Vec<f64> = set
                .values
                .iter()
                .filter(|((a, b), _)| a == k || b == k)
                .map(|(_, v)| *v)
                .collect();
            let others: Vec<f64> = set
                .values
                .iter()
                .filter(|((a, b), _)| a != k && b != k)
                .map(|(_, v)| *v)
                .collect();
            let measured = fleet::median(&mine).unwrap_or(0.0);
            // The expectation of the GPU's pairs: a floor one of them missed, else the
            // node's fastest pair when that is what they missed, else the median of the
            // node's pairs that do not involve the GPU.
            let theirs: Vec<Missed> = slow
                .iter()
                .filter(|((a, b), _)| a == k || b == k)
                .map(|(_, m)| *m)
                .collect();
            let missed = theirs
                .iter()
                .find(|m| matches!(m, Missed::Floor(..)))
                .or_else(|| theirs.iter().find(|m| matches!(m, Missed::NodeFastest(_))))
                .copied()
                .unwrap_or(Missed::NodeMedian(
                    fleet::median(&others).unwrap_or(node_median),
                ));
            let (expected, source) = missed.expectation();
            let against = match missed {
                Missed::NodeFastest(_) => "the node's fastest pair".to_string(),
                Missed::NodeMedian(_) => source_words(source, "pairs"),
                Missed::Floor(_, s) => source_words(s, "pair bandwidth"),
            };
            out.push(Finding::new(FindingKind::Slow, Subject::gpu(node, *k), set.metric, Severity::Critical, format!(
                    "GPU {k} on {node} is slow to every other GPU: {} median {} GB/s, {} {against} ({} GB/s); check GPU {k}'s NVLink links (nvidia-smi nvlink -s -i {k}) and whether other work moves data through them.",
                    set.what,
                    num(measured),
                    how_far(measured, expected),
                    num(expected)
                )).with_evidence(measured, expected, "GB/s", source));
            covered_gpus.insert(*k);
        }
        for (a, b) in &verdict.pairs {
            let v = set.values.get(&(*a, *b)).copied().unwrap_or(0.0);
            let missed = slow
                .get(&(*a, *b))
                .copied()
                .unwrap_or(Missed::NodeMedian(node_median));
            let (expected, source) = missed.expectation();
            let against = match missed {
                Missed::NodeFastest(f) => format!("the node's fastest pair ({} GB/s)", num(f)),
                Missed::NodeMedian(m) => format!("the node's other pairs (median {} GB/s)", num(m)),
                Missed::Floor(f, s) => format!(
                    "{} ({} GB/s)",
                    source_words(s, &format!("pair {}", set.what)),
                    num(f)
                ),
            };
            out.push(Finding::new(FindingKind::Slow, Subject::gpu_pair(node, *a, *b), set.metric, Severity::Critical, format!(
                    "GPU {a} <-> GPU {b} on {node}: {} {} GB/s, {} {against}; check the NVLink links of both GPUs (nvidia-smi nvlink -s).",
                    set.what,
                    num(v),
                    how_far(v, expected),
                )).with_evidence(v, expected, "GB/s", source));
            covered_pairs.insert((*a, *b));
        }
    }
}

pub(super) fn check_host(
    node: &str,
    r: &CompactResult,
    t: &Thresholds,
    exp: Option<&Expectations>,
    stats: &mut NodeStats,
    out: &mut Vec<Finding>,
) {
    let floor = floor_of(t.host_bandwidth_gbps, exp.and_then(|e| e.host_floor_gbps));
    for (values, metric, what) in [
        (&r.host_to_device, Metric::H2dBandwidth, "host-to-device"),
        (&r.device_to_host, Metric::D2hBandwidth, "device-to-host"),
    ] {
        for (i, v) in values.iter().take(r.gpus as usize).enumerate() {
            if *v <= 0.0 {
                continue;
            }
            let gpu = i as u32;
            let key = SeriesKey {
                metric,
                collective: None,
                gpu: Some(gpu),
                peer: None,
            };
            stats.values.insert(key, *v);
            let Some((floor, source)) = floor else {
                continue;
            };
            stats.judged.insert(key);
            if *v < floor {
                out.push(Finding::new(FindingKind::Slow, Subject::gpu(node, gpu), metric, Severity::Critical, format!(
                        "GPU {gpu} on {node}: {what} bandwidth {} GB/s, {} {} ({} GB/s); check the GPU's PCIe link (nvidia-smi -q -d PCI) and its NUMA placement.",
                        num(*v),
                        how_far(*v, floor),
                        source_words(source, "host bandwidth"),
                        num(floor)
                    )).with_evidence(*v, floor, "GB/s", source));
            }
        }
    }
}

pub(super) fn check_ddp(
    node: &str,
    r: &CompactResult,
    t: &Thresholds,
    stats: &mut NodeStats,
    out: &mut Vec<Finding>,
) {
    if let Some(last) = r.ddp_points.iter().max_by_key(|p| p.gpus)
        && last.gpus > 1
        && last.scaling_efficiency > 0.0
    {
        let key = SeriesKey {
            metric: Metric::DdpScalingEfficiency,
            collective: None,
            gpu: None,
            peer: None,
        };
        stats.values.insert(key, last.scaling_efficiency);
        if let Some(floor) = t.ddp_scaling_efficiency {
            stats.judged.insert(key);
            if last.scaling_efficiency < floor {
                out.push(Finding::new(FindingKind::Slow, Subject::node(node), Metric::DdpScalingEfficiency, Severity::Critical, format!(
                        "DDP scaling efficiency on {node} at {} GPUs is {:.0}%, below the spec's floor of {:.0}%; gradient all-reduce is not hidden behind compute (communication fraction {:.0}%).",
                        last.gpus,
                        last.scaling_efficiency * 100.0,
                        floor * 100.0,
                        last.comm_fraction * 100.0
                    )).with_evidence(last.scaling_efficiency, floor, "ratio", ExpectationSource::Threshold));
            }
        }
    }

    let times: Vec<f64> = r
        .ddp_compute_ms
        .iter()
        .take(r.gpus as usize)
        .copied()
        .filter(|v| *v > 0.0)
        .collect();
    if times.len() < 2 {
        return;
    }
    let Some(m) = fleet::median(&times) else {
        return;
    };
    stats.values.insert(
        SeriesKey {
            metric: Metric::DdpComputeTime,
            collective: None,
            gpu: None,
            peer: None,
        },
        m,
    );
    let ratio = t.straggler_ratio.max(1.0);
    for (i, v) in r.ddp_compute_ms.iter().take(r.gpus as usize).enumerate() {
        if *v > 0.0 && *v > ratio * m {
            let gpu = i as u32;
            out.push(Finding::new(FindingKind::Straggler, Subject::gpu(node, gpu), Metric::DdpComputeTime, Severity::Critical, format!(
                    "GPU {gpu} on {node} is a straggler: DDP compute time {} ms, {} the node's median ({} ms); every step waits for it: check its clocks, throttle reasons and power (nvidia-smi -q -d PERFORMANCE,CLOCK).",
                    num(*v),
                    how_far(*v, m),
                    num(m)
                )).with_evidence(*v, m, "ms", ExpectationSource::Node));
        }
    }
}
