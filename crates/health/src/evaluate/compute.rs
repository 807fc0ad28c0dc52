//! What each GPU computed: a silent-data-corruption mismatch (Critical, never averaged
//! away), a GPU whose GEMM throughput or memory bandwidth falls below the node's median GPU
//! by the straggler ratio, and GPUs below the product's floors (one node finding when every
//! GPU is, a node whose GPUs are all slow alike). Each finding carries the GPU's clocks,
//! power, temperature and throttle reasons read under load.

use super::stats::{NodeStats, SeriesKey};
use super::{how_far, tenths_below_100};
use crate::fleet;
use crate::profiles::Expectations;
use gpufabric_api::findings::{ExpectationSource, Finding, FindingKind, Metric, Severity, Subject};
use gpufabric_api::policy::Thresholds;
use gpufabric_api::result::{CompactGpuCompute, CompactResult};

/// Least GEMM size whose throughput is judged against the product's floor: smaller GEMMs
/// do not fill an H100's tensor cores (4096 reaches about 90% of 8192's rate).
pub const GEMM_FLOOR_SIZE: u32 = 4096;

pub(super) fn check_compute(
    node: &str,
    r: &CompactResult,
    t: &Thresholds,
    exp: Option<&Expectations>,
    stats: &mut NodeStats,
    out: &mut Vec<Finding>,
) {
    let gpus: Vec<(u32, &CompactGpuCompute)> = r
        .compute
        .iter()
        .take(r.gpus as usize)
        .enumerate()
        .map(|(i, c)| (i as u32, c))
        .collect();
    if gpus.is_empty() {
        return;
    }
    check_sdc(node, &gpus, out);
    let full_size = r.compute_gemm_size.is_some_and(|n| n >= GEMM_FLOOR_SIZE);
    let rates = [
        Rate {
            metric: Metric::GemmThroughput,
            what: "bf16 GEMM throughput",
            unit: "TFLOP/s",
            value: |c| c.bf16_tflops,
            floor: exp.and_then(|e| e.gemm_floor_tflops).filter(|_| full_size),
            advice: "a GPU that computes slow holds back every collective and step it takes part in: check its clocks and throttle reasons (nvidia-smi -q -d PERFORMANCE,CLOCK,POWER), then run the vendor's diagnostics (dcgmi diag -r 3)",
        },
        Rate {
            metric: Metric::MemoryBandwidth,
            what: "device memory copy bandwidth",
            unit: "GB/s",
            value: |c| c.memory_copy_gbps,
            floor: exp.and_then(|e| e.memory_floor_gbps),
            advice: "check its memory clock, ECC and remapped rows (nvidia-smi -q -d MEMORY,ECC,ROW_REMAPPER), then run the vendor's memory diagnostics (dcgmi diag -r 3)",
        },
    ];
    for rate in &rates {
        check_rate(node, &gpus, rate, t, stats, out);
    }
}

/// One per-GPU rate of the compute checks and how it is judged.
struct Rate {
    metric: Metric,
    what: &'static str,
    unit: &'static str,
    value: fn(&CompactGpuCompute) -> f64,
    floor: Option<f64>,
    advice: &'static str,
}

fn check_sdc(node: &str, gpus: &[(u32, &CompactGpuCompute)], out: &mut Vec<Finding>) {
    for (gpu, c) in gpus {
        let Some((wrong, outputs, differs)) = c.sdc else {
            continue;
        };
        if wrong == 0 && !differs {
            continue;
        }
        let others = if differs {
            ", and its output differs bit for bit from the other GPUs'"
        } else {
            ""
        };
        out.push(
            Finding::new(
                FindingKind::WrongResults,
                Subject::gpu(node, *gpu),
                Metric::ComputeChecksum,
                Severity::Critical,
                format!(
                    "GPU {gpu} on {node} computed a wrong result: {wrong} of {outputs} outputs of the silent-data-corruption GEMM differ from the exact product{others}. A GPU that computes wrong corrupts training without an error: keep it out of service and run the vendor's diagnostics (dcgmi diag -r 3) before it takes work again."
                ),
            )
            .with_evidence(f64::from(wrong.max(1)), 0.0, "outputs", ExpectationSource::Node),
        );
    }
}

fn check_rate(
    node: &str,
    gpus: &[(u32, &CompactGpuCompute)],
    rate: &Rate,
    t: &Thresholds,
    stats: &mut NodeStats,
    out: &mut Vec<Finding>,
) {
    let measured: Vec<(u32, f64, &CompactGpuCompute)> = gpus
        .iter()
        .map(|(g, c)| (*g, (rate.value)(c), *c))
        .filter(|(_, v, _)| *v > 0.0)
        .collect();
    let values: Vec<f64> = measured.iter().map(|(_, v, _)| *v).collect();
    let Some(median) = fleet::median(&values) else {
        return;
    };
    let key = SeriesKey::of_node(rate.metric);
    stats.values.insert(key, median);
    let ratio = t.straggler_ratio.max(1.0);
    let below_floor: Vec<&(u32, f64, &CompactGpuCompute)> = match rate.floor {
        Some(floor) => measured.iter().filter(|(_, v, _)| *v < floor).collect(),
        None => Vec::new(),
    };
    if let Some(floor) = rate.floor {
        stats.judged.insert(key);
        if !below_floor.is_empty() && below_floor.len() == measured.len() {
            // Every GPU alike: the node's, not one GPU's.
            let (_, worst, c) = below_floor
                .iter()
                .min_by(|a, b| a.1.total_cmp(&b.1))
                .copied()
                .copied()
                .unwrap_or((0, median, gpus[0].1));
            out.push(
                Finding::new(
                    FindingKind::Slow,
                    Subject::node(node),
                    rate.metric,
                    Severity::Critical,
                    format!(
                        "Every GPU on {node} is slow alike: {} median {} {unit}, {} the product's floor ({} {unit}; the slowest GPU {} {unit}{}). Look for what they share: power capping, cooling, clocks locked low, or the driver (nvidia-smi -q -d PERFORMANCE,CLOCK,POWER).",
                        rate.what,
                        tenths_below_100(median),
                        how_far(median, floor),
                        tenths_below_100(floor),
                        tenths_below_100(worst),
                        under_load(c),
                        unit = rate.unit
                    ),
                )
                .with_evidence(median, floor, rate.unit, ExpectationSource::Profile),
            );
            return;
        }
    }
    for (gpu, v, c) in &measured {
        let floor = rate.floor.filter(|f| v < f);
        let slow_vs_node = *v * ratio < median;
        if floor.is_none() && !slow_vs_node {
            continue;
        }
        let (expected, source, against) = match floor {
            Some(f) if !slow_vs_node || f > median => (
                f,
                ExpectationSource::Profile,
                format!(
                    "the product's floor ({} {})",
                    tenths_below_100(f),
                    rate.unit
                ),
            ),
            _ => (
                median,
                ExpectationSource::Node,
                format!(
                    "the node's median GPU ({} {})",
                    tenths_below_100(median),
                    rate.unit
                ),
            ),
        };
        let kind = if source == ExpectationSource::Node {
            FindingKind::Straggler
        } else {
            FindingKind::Slow
        };
        out.push(
            Finding::new(
                kind,
                Subject::gpu(node, *gpu),
                rate.metric,
                Severity::Critical,
                format!(
                    "GPU {gpu} on {node}: {} {} {}, {} {against}{}; {}.",
                    rate.what,
                    tenths_below_100(*v),
                    rate.unit,
                    how_far(*v, expected),
                    under_load(c),
                    rate.advice
                ),
            )
            .with_evidence(*v, expected, rate.unit, source),
        );
    }
}

/// "; under load: SM clock 1,245 of 1,980 MHz, 699 of 700 W, 71 °C, throttled by
/// hwSlowdown", or nothing when NVML could not read them.
fn under_load(c: &CompactGpuCompute) -> String {
    let Some((clock, max_clock, power, limit, temp)) = c.load else {
        return String::new();
    };
    let throttle = if c.throttle.is_empty() {
        String::new()
    } else {
        format!(", throttled by {}", c.throttle.join(", "))
    };
    format!(
        "; under load: SM clock {clock} of {max_clock} MHz, {power} of {limit} W, {temp} °C{throttle}"
    )
}
