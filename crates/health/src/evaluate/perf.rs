//! Per-node performance rules: NCCL against thresholds and profiles, host copies, DDP
//! scaling and stragglers.

use super::stats::{NodeStats, SeriesKey};
use super::{how_far, source_words, tenths_below_100};
use crate::fleet;
use crate::profiles::{self, Expectations};
use gpufabric_api::findings::{ExpectationSource, Finding, FindingKind, Metric, Severity, Subject};
use gpufabric_api::policy::Thresholds;
use gpufabric_api::result::CompactResult;
use gpufabric_api::suite::Collective;

/// The floor a bandwidth is held to: the spec's threshold, else the GPU profile's floor
/// ([`crate::floors`]).
pub(super) fn floor_of(
    threshold: Option<f64>,
    profile: Option<f64>,
) -> Option<(f64, ExpectationSource)> {
    crate::floors::of(threshold, profile).map(|f| (f.gbps, f.source))
}

/// The median one-way copy bandwidth of a node's GPU pairs (GB/s), if it measured any.
fn median_pair_copy(r: &CompactResult) -> Option<f64> {
    let n = r.gpus as usize;
    if n < 2 || r.copy_uni.len() != n * n || copies_too_short(r) {
        return None;
    }
    let cells: Vec<f64> = (0..n)
        .flat_map(|a| (0..n).filter(move |b| *b != a).map(move |b| a * n + b))
        .filter_map(|i| r.copy_uni.get(i).copied())
        .filter(|v| *v > 0.0)
        .collect();
    fleet::median(&cells)
}

/// Whether a node's collectives are judged against its own pair copies: on NVSwitch (every
/// pair gets a GPU's whole NVLink bandwidth), or, where no health snapshot said the topology,
/// on a product with NVLink whose pairs measured alike (within 25%): judged from what is
/// known rather than not at all. Links straight between GPUs give a ring more than one pair
/// carries, so the floor stays a floor there too.
fn judged_against_links(r: &CompactResult, exp: Option<&Expectations>) -> bool {
    let Some(e) = exp else {
        return false;
    };
    if e.switched {
        return true;
    }
    let nvlink_product = e.profile.is_some_and(|p| p.nvlinks > 0);
    e.topology.is_none() && nvlink_product && pairs_alike(r)
}

/// Every measured one-way pair copy within 25% of the fastest.
fn pairs_alike(r: &CompactResult) -> bool {
    let n = r.gpus as usize;
    let cells: Vec<f64> = (0..n)
        .flat_map(|a| (0..n).filter(move |b| *b != a).map(move |b| a * n + b))
        .filter_map(|i| r.copy_uni.get(i).copied())
        .filter(|v| *v > 0.0)
        .collect();
    let max = cells.iter().copied().fold(0.0, f64::max);
    !cells.is_empty() && cells.iter().all(|v| *v >= 0.75 * max)
}

/// A collective whose bus bandwidth falls below [`profiles::collective_to_copy_floor`] of
/// what the same GPUs copy to each other: the links are fine and the collective does not use
/// them (a setting, a plugin, a transport choice) or a GPU holds it back (named by its own
/// finding, which then explains this one). No floor from the links alone would single it out
/// when the links are faster than the floor needs.
fn below_own_links(
    node: &str,
    r: &CompactResult,
    exp: Option<&Expectations>,
    c: &gpufabric_api::result::CompactCollective,
) -> Option<Finding> {
    if !judged_against_links(r, exp) {
        return None;
    }
    let share = profiles::collective_to_copy_floor(c.collective, c.largest_bytes)?;
    let pair = median_pair_copy(r)?;
    let bar = pair * share;
    if c.peak_busbw >= bar {
        return None;
    }
    let healthy = share / profiles::COLLECTIVE_TO_COPY_MARGIN;
    let name = c.collective.nccl_tests_name();
    Some(
        slow_collective(
            node,
            c.collective,
            Metric::NcclBusBw,
            format!(
                "{name} peak bus bandwidth on {node} is {} GB/s, {:.0}% of the {} GB/s its GPUs copy to each other (median pair, one way), where healthy nodes reach {:.0}%{}: the links carry more than {name} gets from them. Unless a GPU of this node is named slow, check NCCL_* settings (NCCL_P2P_DISABLE, NCCL_ALGO, NCCL_PROTO, NCCL_MAX_NCHANNELS), NCCL plugins and the transport NCCL chose (NCCL_DEBUG=INFO).",
                tenths_below_100(c.peak_busbw),
                100.0 * c.peak_busbw / pair,
                tenths_below_100(pair),
                100.0 * healthy,
                sweep_words(c.largest_bytes)
            ),
        )
        .with_evidence(c.peak_busbw, bar, "GB/s", ExpectationSource::Node),
    )
}

/// Where a sweep that ended below [`profiles::PROFILE_BYTES`] is held to what healthy nodes
/// reach at its own largest size, the words that say so.
fn sweep_words(largest: Option<u64>) -> String {
    match largest {
        Some(b) if b < profiles::PROFILE_BYTES => {
            format!(" in a sweep that ends at {}", size_words(b))
        }
        _ => String::new(),
    }
}

/// The Info finding of a node whose collectives nothing judged alone: no threshold, no floor
/// from its product's board, and no topology or pair copies to hold them to.
fn links_not_judged(node: &str, c: &gpufabric_api::result::CompactCollective) -> Finding {
    let f = Finding::new(
        FindingKind::Slow,
        Subject::node(node),
        Metric::NcclBusBw,
        Severity::Info,
        format!(
            "{} bus bandwidth on {node} ({} GB/s) not judged on this node alone: nothing says what its links carry (the health snapshot, which reads the NVLink topology, or the GPU-pair copies of a product with NVLink); keep suite.health and suite.gpuPairs on, or set thresholds.ncclBusBwGbps. A fleet of its kind still compares it.",
            c.collective.nccl_tests_name(),
            tenths_below_100(c.peak_busbw)
        ),
    )
    .with_collective(c.collective);
    // Measured, against nothing: the rule that would judge it had nothing to go on.
    Finding {
        measured: Some(c.peak_busbw),
        unit: Some("GB/s".into()),
        source: Some(ExpectationSource::Rule),
        ..f
    }
}

/// Whether the pair matrix's copies were shorter than
/// [`gpufabric_api::result::COPY_BYTES`]: their bandwidths then do not show the links'.
pub(super) fn copies_too_short(r: &CompactResult) -> bool {
    r.pair_bytes
        .is_some_and(|b| b < gpufabric_api::result::COPY_BYTES)
}

/// The Info finding of a node whose pair matrix copied fewer than
/// [`gpufabric_api::result::COPY_BYTES`] at a time: none of its copy bandwidths (pairs,
/// host) was judged, and why.
pub(super) fn copies_not_judged(node: &str, r: &CompactResult) -> Finding {
    let bytes = r.pair_bytes.unwrap_or(0);
    let min = gpufabric_api::result::COPY_BYTES;
    not_judged(
        node,
        Metric::PairBandwidth,
        format!(
            "copy bandwidth on {node} (GPU pairs and host) not judged: each copy moved {}, below the {} at which copies near what the links carry; raise suite.gpuPairs.bytes (default 256 MiB) to judge it.",
            size_words(bytes),
            size_words(min)
        ),
        in_mib(bytes, min),
    )
}

/// The Info finding of an all_reduce whose sweep ended below
/// [`gpufabric_api::result::BANDWIDTH_BYTES`]: its bus bandwidth was not judged, and why.
fn bandwidth_not_judged(node: &str, c: &gpufabric_api::result::CompactCollective) -> Finding {
    let largest = c.largest_bytes.unwrap_or(0);
    let min = gpufabric_api::result::BANDWIDTH_BYTES;
    not_judged(
        node,
        Metric::NcclBusBw,
        format!(
            "all_reduce bus bandwidth on {node} not judged: the sweep's largest size is {}, below the {} at which busbw nears what the links carry (peak here {} GB/s); raise suite.ncclSweep.maxBytes (nccl-tests' sweep ends at 1 GiB) to judge it.",
            size_words(largest),
            size_words(min),
            tenths_below_100(c.peak_busbw)
        ),
        in_mib(largest, min),
    )
    .with_collective(c.collective)
}

/// The Info finding of a DDP probe whose GPUs computed `ms` a step (the median), below
/// [`gpufabric_api::result::DDP_COMPUTE_MS`]: its stragglers and scaling were not judged.
fn ddp_not_judged(node: &str, ms: f64) -> Finding {
    let min = gpufabric_api::result::DDP_COMPUTE_MS;
    not_judged(
        node,
        Metric::DdpComputeTime,
        format!(
            "DDP probe on {node} not judged (stragglers, scaling): its GPUs computed {} ms a step, below the {} ms at which kernel launches stop setting the time; raise suite.ddpProbe.hidden, layers or batchPerGpu (defaults 8192, 8, 4096) to judge it.",
            tenths_below_100(ms),
            tenths_below_100(min)
        ),
        (ms, min, "ms"),
    )
}

/// An Info finding on `node`: `metric` was not judged because what was measured is smaller
/// than the rule's minimum; `(measured, minimum, unit)` is its evidence.
fn not_judged(
    node: &str,
    metric: Metric,
    message: String,
    (value, min, unit): (f64, f64, &str),
) -> Finding {
    Finding::new(
        FindingKind::Slow,
        Subject::node(node),
        metric,
        Severity::Info,
        message,
    )
    .with_evidence(value, min, unit, ExpectationSource::Rule)
}

/// Bytes as MiB, with the unit, for a [`not_judged`] finding's evidence.
fn in_mib(bytes: u64, min: u64) -> (f64, f64, &'static str) {
    let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
    (mib(bytes), mib(min), "MiB")
}

/// A size in whole MiB where it is one, else in bytes.
fn size_words(b: u64) -> String {
    match b % (1 << 20) {
        0 => format!("{} MiB", b >> 20),
        _ => format!("{b} bytes"),
    }
}

/// A collective slower on `node` than it should be, by `metric`: Critical, and the node's
/// own (the caller adds the evidence).
fn slow_collective(node: &str, collective: Collective, metric: Metric, message: String) -> Finding {
    Finding::new(
        FindingKind::Slow,
        Subject::node(node),
        metric,
        Severity::Critical,
        message,
    )
    .with_collective(collective)
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
        let below_bandwidth = c
            .largest_bytes
            .is_some_and(|b| b < gpufabric_api::result::BANDWIDTH_BYTES);
        if below_bandwidth {
            // The sweep ended where busbw is still set by latency (and, host-launched, by the
            // launching CPU): no floor, relation or fleet comparison holds it.
            if c.collective == Collective::AllReduce && c.peak_busbw > 0.0 {
                out.push(bandwidth_not_judged(node, c));
            }
        } else if c.peak_busbw > 0.0 {
            stats.values.insert(bw_key, c.peak_busbw);
            // The floor the report draws too: one source for both.
            let floor = if c.collective != Collective::AllReduce {
                None
            } else {
                crate::floors::all_reduce(t, exp, c.largest_bytes).map(|f| (f.gbps, f.source))
            };
            // A collective far below the node's own copy engines says more than the
            // profile's floor (the links are fine), so it replaces that finding; a threshold
            // the spec set for it wins over both, as explicit expectations do.
            let relation = below_own_links(node, r, exp, c)
                .filter(|_| !floor.is_some_and(|(_, s)| s == ExpectationSource::Threshold));
            if c.collective == Collective::AllReduce
                && floor.is_none()
                && exp.is_none_or(|e| e.topology.is_none())
                && !judged_against_links(r, exp)
            {
                out.push(links_not_judged(node, c));
            }
            let floor = if relation.is_some() { None } else { floor };
            if let Some(f) = relation {
                stats.judged.insert(bw_key);
                out.push(f);
            }
            if let Some((floor, source)) = floor {
                stats.judged.insert(bw_key);
                if c.peak_busbw < floor {
                    out.push(
                        slow_collective(
                            node,
                            c.collective,
                            Metric::NcclBusBw,
                            format!(
                                "{} peak bus bandwidth on {node} is {} GB/s, {} {} ({} GB/s{}); check NVLink state and NCCL's transport (NCCL_DEBUG=INFO).",
                                c.collective.nccl_tests_name(),
                                tenths_below_100(c.peak_busbw),
                                how_far(c.peak_busbw, floor),
                                source_words(source, "all_reduce bus bandwidth"),
                                tenths_below_100(floor),
                                if source == ExpectationSource::Profile {
                                    sweep_words(c.largest_bytes)
                                } else {
                                    String::new()
                                }
                            ),
                        )
                        .with_evidence(c.peak_busbw, floor, "GB/s", source),
                    );
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
                    // Host-launched small sizes time the launching CPU as much as the GPUs
                    // (the same healthy host moves between two states up to 3x apart): over
                    // the ceiling that is reported, not held against the node. Timed with
                    // CUDA graphs, it fails the node.
                    let host_timed = r.graph_launches == 0;
                    let mut f = slow_collective(
                        node,
                        c.collective,
                        Metric::NcclLatency,
                        format!(
                            "all_reduce latency on {node} is {} µs, {} the spec's ceiling of {} µs; {}",
                            tenths_below_100(latency),
                            how_far(latency, ceiling),
                            tenths_below_100(ceiling),
                            if host_timed {
                                "not failed: host-launched calls also time the launching CPU (suite.ncclSweep.graphLaunches times the GPUs alone, and then the ceiling fails the node)."
                            } else {
                                "check NCCL's transport and protocol choice (NCCL_DEBUG=INFO)."
                            }
                        ),
                    )
                    .with_evidence(latency, ceiling, "µs", ExpectationSource::Threshold);
                    if host_timed {
                        f.severity = Severity::Info;
                    }
                    out.push(f);
                }
            }
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
    if copies_too_short(r) {
        // Said once for pairs and host alike (check_pairs).
        return;
    }
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
                out.push(
                    Finding::new(
                        FindingKind::Slow,
                        Subject::gpu(node, gpu),
                        metric,
                        Severity::Critical,
                        format!(
                            "GPU {gpu} on {node}: {what} bandwidth {} GB/s, {} {} ({} GB/s); check the GPU's PCIe link (nvidia-smi -q -d PCI) and its NUMA placement.",
                            tenths_below_100(*v),
                            how_far(*v, floor),
                            source_words(source, "host bandwidth"),
                            tenths_below_100(floor)
                        ),
                    )
                    .with_evidence(*v, floor, "GB/s", source),
                );
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
    let times: Vec<f64> = r
        .ddp_compute_ms
        .iter()
        .take(r.gpus as usize)
        .copied()
        .filter(|v| *v > 0.0)
        .collect();
    let median_compute = fleet::median(&times);
    if let Some(m) = median_compute.filter(|m| *m < gpufabric_api::result::DDP_COMPUTE_MS) {
        // A probe this small times kernel launches, not the GPUs: neither its stragglers nor
        // its scaling (against a threshold or the fleet) say anything of the node.
        out.push(ddp_not_judged(node, m));
        return;
    }
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
                out.push(
                    Finding::new(
                        FindingKind::Slow,
                        Subject::node(node),
                        Metric::DdpScalingEfficiency,
                        Severity::Critical,
                        format!(
                            "DDP scaling efficiency on {node} at {} GPUs is {:.0}%, below the spec's floor of {:.0}%; gradient all-reduce is not hidden behind compute (communication fraction {:.0}%).",
                            last.gpus,
                            last.scaling_efficiency * 100.0,
                            floor * 100.0,
                            last.comm_fraction * 100.0
                        ),
                    )
                    .with_evidence(
                        last.scaling_efficiency,
                        floor,
                        "ratio",
                        ExpectationSource::Threshold,
                    ),
                );
            }
        }
    }

    if times.len() < 2 {
        return;
    }
    let Some(m) = median_compute else {
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
            out.push(
                Finding::new(
                    FindingKind::Straggler,
                    Subject::gpu(node, gpu),
                    Metric::DdpComputeTime,
                    Severity::Critical,
                    format!(
                        "GPU {gpu} on {node} is a straggler: DDP compute time {} ms, {} the node's median ({} ms); every step waits for it: check its clocks, throttle reasons and power (nvidia-smi -q -d PERFORMANCE,CLOCK).",
                        tenths_below_100(*v),
                        how_far(*v, m),
                        tenths_below_100(m)
                    ),
                )
                .with_evidence(*v, m, "ms", ExpectationSource::Node),
            );
        }
    }
}
