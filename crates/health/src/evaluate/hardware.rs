//! Per-node rules that need no comparison: identity, phase errors, NVML health, wrong results, NCCL transports.

use super::gpu_pairs::blame;
use super::{NodeInput, finding, phase_metric, phase_name, tenths_below_100, transport_name};
use crate::profiles::{self, Expectations};
use gpufabric_api::findings::{ExpectationSource, Finding, FindingKind, Metric, Severity, Subject};
use gpufabric_api::policy::Thresholds;
use gpufabric_api::result::CompactGpuHealth;
use gpufabric_api::result::{CompactResult, ErrorKind, Transport};
use std::collections::{BTreeMap, BTreeSet};

pub(super) fn check_identity(
    input: &NodeInput,
    r: &CompactResult,
    exp: Option<&Expectations>,
    out: &mut Vec<Finding>,
) {
    let node = input.node.as_str();
    if let Some(expected) = input.expected_gpus
        && r.gpus < expected
    {
        out.push(
            Finding::new(
                FindingKind::GpuMismatch,
                Subject::node(node),
                Metric::GpuCount,
                Severity::Critical,
                format!(
                    "{node} advertises {expected} GPUs but the check saw {}: a GPU fell off the bus or failed to initialise; check nvidia-smi and dmesg for XID 79 and drain the node.",
                    r.gpus
                ),
            )
            .with_evidence(f64::from(r.gpus), f64::from(expected), "GPUs", ExpectationSource::Rule),
        );
    } else if input.expected_gpus.is_none()
        && let Some(p) = exp.and_then(|e| e.profile)
        && !p.is_board_count(r.gpus)
    {
        out.push(
            Finding::new(
                FindingKind::GpuMismatch,
                Subject::node(node),
                Metric::GpuCount,
                Severity::Info,
                format!(
                    "{node} has {} {} GPUs, not a board size this product ships with ({:?}); if a GPU is missing, check nvidia-smi and dmesg.",
                    r.gpus, p.product, p.board_gpus
                ),
            )
            .with_evidence(
                f64::from(r.gpus),
                f64::from(p.switched_gpus),
                "GPUs",
                ExpectationSource::Profile,
            ),
        );
    }
    if let Some(label) = &input.product_label
        && !r.product.trim().is_empty()
        && profiles::normalize(label) != profiles::normalize(&r.product)
    {
        out.push(finding(
            FindingKind::GpuMismatch,
            Subject::node(node),
            Metric::GpuCount,
            Severity::Info,
            format!(
                "{node} is labelled nvidia.com/gpu.product={label} but its GPUs report {}; the label is stale (restart GPU feature discovery on the node).",
                r.product
            ),
        ));
    }
}

pub(super) fn check_phase_errors(node: &str, r: &CompactResult, out: &mut Vec<Finding>) {
    for e in &r.errors {
        let phase = phase_name(e.phase);
        let (kind, severity, message) = match e.kind {
            ErrorKind::Timeout => (
                FindingKind::Timeout,
                Severity::Critical,
                format!(
                    "The {phase} phase on {node} hung and was aborted by its watchdog ({}); a hang points at NVLink, the NVSwitch or a GPU: check dmesg for XIDs and nvidia-smi nvlink -s.",
                    e.message
                ),
            ),
            ErrorKind::Failed => (
                FindingKind::Errored,
                Severity::Critical,
                format!(
                    "The {phase} phase on {node} failed ({}); read the pod log, and dmesg for XIDs.",
                    e.message
                ),
            ),
            ErrorKind::Unavailable => (
                FindingKind::Errored,
                Severity::Info,
                format!(
                    "The {phase} phase could not run on {node} ({}); its metrics were not checked.",
                    e.message
                ),
            ),
        };
        out.push(Finding {
            source: Some(ExpectationSource::Rule),
            ..finding(
                kind,
                Subject::node(node),
                phase_metric(e.phase),
                severity,
                message,
            )
        });
    }
}

pub(super) fn check_health(
    node: &str,
    r: &CompactResult,
    t: &Thresholds,
    exp: Option<&Expectations>,
    out: &mut Vec<Finding>,
) {
    for (i, h) in r.health.iter().take(r.gpus as usize).enumerate() {
        let gpu = i as u32;
        check_nvlink(node, gpu, h, r.gpus, out);
        check_memory(node, gpu, h, out);
        check_pcie(node, gpu, h, r, exp, out);
        check_thermal(node, gpu, h, t, out);
    }
}

/// A GPU's NVLink links: down (Critical), and the errors counted since the driver loaded (Info).
fn check_nvlink(node: &str, gpu: u32, h: &CompactGpuHealth, gpus: u32, out: &mut Vec<Finding>) {
    let subject = || Subject::gpu(node, gpu);
    let (active, expected) = h.nvlinks;
    // A GPU alone on its node (a one-GPU VM or slice) has no peer to link to: its links
    // are down by how the node was cut, not by a fault. A board that lost GPUs shows up
    // as missing GPUs instead.
    if active < expected && gpus >= 2 {
        out.push(
            Finding::new(
                FindingKind::NvlinkDown,
                subject(),
                Metric::NvlinkLinks,
                Severity::Critical,
                format!(
                    "GPU {gpu} on {node} has {active} of {expected} NVLink links up; reseat or replace the GPU or baseboard (nvidia-smi nvlink -s -i {gpu} shows which links are down)."
                ),
            )
            .with_evidence(
                f64::from(active),
                f64::from(expected),
                "links",
                ExpectationSource::Rule,
            ),
        );
    }
    if h.nvlink_errors > 0 {
        out.push(
            Finding::new(
                FindingKind::NvlinkErrors,
                subject(),
                Metric::NvlinkErrors,
                Severity::Info,
                format!(
                    "GPU {gpu} on {node} has counted {} NVLink replay, recovery or CRC errors since the driver loaded; if the count grows between runs a link is marginal: check nvidia-smi nvlink -e -i {gpu}.",
                    h.nvlink_errors
                ),
            )
            .with_evidence(h.nvlink_errors as f64, 0.0, "errors", ExpectationSource::Rule),
        );
    }
}

/// A GPU's XIDs, uncorrectable ECC errors and row remapping.
fn check_memory(node: &str, gpu: u32, h: &CompactGpuHealth, out: &mut Vec<Finding>) {
    let subject = || Subject::gpu(node, gpu);
    if !h.xids.is_empty() {
        let list: Vec<String> = h.xids.iter().map(u64::to_string).collect();
        out.push(
            Finding::new(
                FindingKind::Xid,
                subject(),
                Metric::Xid,
                Severity::Critical,
                format!(
                    "GPU {gpu} on {node} raised XID {} during the check; look the code up in NVIDIA's XID catalogue and drain the node for a GPU reset or replacement.",
                    list.join(", ")
                ),
            )
            .with_evidence(h.xids.len() as f64, 0.0, "events", ExpectationSource::Rule),
        );
    }
    if h.ecc_uncorrected > 0 {
        out.push(
            Finding::new(
                FindingKind::EccUncorrectable,
                subject(),
                Metric::EccUncorrected,
                Severity::Critical,
                format!(
                    "GPU {gpu} on {node} has {} uncorrectable ECC errors; its memory is corrupting data: drain the node and reset or replace the GPU.",
                    h.ecc_uncorrected
                ),
            )
            .with_evidence(h.ecc_uncorrected as f64, 0.0, "errors", ExpectationSource::Rule),
        );
    }
    if h.row_remap & 2 != 0 {
        out.push(finding(
            FindingKind::RowRemap,
            subject(),
            Metric::RemappedRows,
            Severity::Critical,
            format!(
                "GPU {gpu} on {node} failed to remap a memory row: it has no spare rows left; replace the GPU."
            ),
        ));
    } else if h.row_remap & 1 != 0 {
        out.push(finding(
            FindingKind::RowRemap,
            subject(),
            Metric::RemappedRows,
            Severity::Critical,
            format!(
                "GPU {gpu} on {node} has a memory row remap pending; drain the node and reset the GPU to apply it."
            ),
        ));
    }
}

/// A GPU above the temperature ceiling (Critical) or throttled (Info).
fn check_thermal(
    node: &str,
    gpu: u32,
    h: &CompactGpuHealth,
    t: &Thresholds,
    out: &mut Vec<Finding>,
) {
    let subject = || Subject::gpu(node, gpu);
    if let Some(max) = t.max_temperature_c
        && h.temperature_c > max
    {
        out.push(
            Finding::new(
                FindingKind::Thermal,
                subject(),
                Metric::Temperature,
                Severity::Critical,
                format!(
                    "GPU {gpu} on {node} reached {:.0} °C, above the spec's ceiling of {max:.0} °C; check airflow, fans and coolant.",
                    h.temperature_c
                ),
            )
            .with_evidence(h.temperature_c, max, "°C", ExpectationSource::Threshold),
        );
    }
    if !h.throttle.is_empty() {
        out.push(Finding {
            measured: Some(h.temperature_c),
            unit: Some("°C".into()),
            source: Some(ExpectationSource::Rule),
            ..finding(
                FindingKind::Thermal,
                subject(),
                Metric::Temperature,
                Severity::Info,
                format!(
                    "GPU {gpu} on {node} had its clocks throttled ({}) at {:.0} °C; worth watching if it recurs.",
                    h.throttle.join(", "),
                    h.temperature_c
                ),
            )
        });
    }
}

/// A GPU's PCIe link: narrower than its maximum, at a lower generation than its maximum
/// (critical only where host copies confirm it), or able to train only below its product.
fn check_pcie(
    node: &str,
    gpu: u32,
    h: &CompactGpuHealth,
    r: &CompactResult,
    exp: Option<&Expectations>,
    out: &mut Vec<Finding>,
) {
    let i = gpu as usize;
    let subject = || Subject::gpu(node, gpu);
    let (gen_now, gen_max, width_now, width_max) = h.pcie;
    if width_now < width_max {
        out.push(
            Finding::new(
                FindingKind::PcieDegraded,
                subject(),
                Metric::PcieLink,
                Severity::Critical,
                format!(
                    "GPU {gpu} on {node} runs its PCIe link at x{width_now}, below its maximum x{width_max} (Gen{gen_now} of Gen{gen_max}); reseat the GPU or its riser and check the slot."
                ),
            )
            .with_evidence(
                f64::from(width_now),
                f64::from(width_max),
                "lanes",
                ExpectationSource::Rule,
            ),
        );
    } else if gen_now < gen_max {
        // NVML reports the current generation, which an idle GPU lowers to save power:
        // only host copies slower than the maximum link could carry confirm a fault.
        let best_host = [r.host_to_device.get(i), r.device_to_host.get(i)]
            .into_iter()
            .flatten()
            .copied()
            .filter(|v| *v > 0.0)
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
        let link = profiles::pcie_x16_gbps(gen_max)
            .map(|g| g * f64::from(width_max) / 16.0 * profiles::FLOOR_FRACTION);
        let confirmed = matches!((best_host, link), (Some(b), Some(l)) if b < l);
        let (severity, why) = if confirmed {
            (
                Severity::Critical,
                format!(
                    "host copies reach only {} GB/s; reseat the GPU or its riser and check the slot's BIOS link speed",
                    tenths_below_100(best_host.unwrap_or(0.0))
                ),
            )
        } else {
            (
                Severity::Info,
                "host copies are not slow, so the GPU may simply have lowered its link speed while idle".to_string(),
            )
        };
        out.push(
            Finding::new(
                FindingKind::PcieDegraded,
                subject(),
                Metric::PcieLink,
                severity,
                format!(
                    "GPU {gpu} on {node} reported its PCIe link at Gen{gen_now}, below its maximum Gen{gen_max}; {why}."
                ),
            )
            .with_evidence(
                f64::from(gen_now),
                f64::from(gen_max),
                "generation",
                ExpectationSource::Rule,
            ),
        );
    } else if let Some(p) = exp.and_then(|e| e.profile)
        && gen_max > 0
        && gen_max < p.pcie_gen
    {
        out.push(
            Finding::new(
                FindingKind::PcieDegraded,
                subject(),
                Metric::PcieLink,
                Severity::Info,
                format!(
                    "GPU {gpu} on {node} can train its PCIe link only to Gen{gen_max}, the {} supports Gen{}; the slot, riser or BIOS setting limits host bandwidth.",
                    p.product, p.pcie_gen
                ),
            )
            .with_evidence(
                f64::from(gen_max),
                f64::from(p.pcie_gen),
                "generation",
                ExpectationSource::Profile,
            ),
        );
    }
}

pub(super) fn check_wrong_results(node: &str, r: &CompactResult, out: &mut Vec<Finding>) {
    for c in &r.collectives {
        if c.wrong > 0 {
            out.push(
                Finding::new(
                    FindingKind::WrongResults,
                    Subject::node(node),
                    Metric::NcclWrong,
                    Severity::Critical,
                    format!(
                        "{} on {node} produced {} wrong elements; the node corrupts data in flight: drain it and check dmesg for XIDs and NVLink errors.",
                        c.collective.nccl_tests_name(),
                        c.wrong
                    ),
                )
                .with_collective(c.collective)
                .with_evidence(c.wrong as f64, 0.0, "elements", ExpectationSource::Rule),
            );
        }
    }
    if r.corrupt_copies > 0 {
        out.push(
            Finding::new(
                FindingKind::WrongResults,
                Subject::node(node),
                Metric::PairBandwidth,
                Severity::Critical,
                format!(
                    "{} GPU-to-GPU copies on {node} arrived corrupted; drain the node and check NVLink errors and ECC.",
                    r.corrupt_copies
                ),
            )
            .with_evidence(f64::from(r.corrupt_copies), 0.0, "copies", ExpectationSource::Rule),
        );
    }
}

/// Which of a node's GPU pairs are at fault, blamed on the smallest subject: every pair
/// slow -> the node; every pair of one GPU slow -> that GPU; else the pairs themselves.
pub(super) fn nvlink_expected(
    r: &CompactResult,
    exp: Option<&Expectations>,
    a: u32,
    b: u32,
) -> Option<bool> {
    let links = |i: u32| r.health.get(i as usize).map(|h| h.nvlinks.1 > 0);
    match (links(a), links(b)) {
        (Some(x), Some(y)) => Some(x && y),
        _ => exp.and_then(|e| e.profile).map(|p| p.nvlinks > 0),
    }
}

pub(super) fn check_transports(
    node: &str,
    r: &CompactResult,
    exp: Option<&Expectations>,
    out: &mut Vec<Finding>,
) {
    let mut bad: BTreeMap<(u32, u32), Transport> = BTreeMap::new();
    for (a, b, transport) in &r.transport_fallbacks {
        if *transport == Transport::Nvlink || a == b || *a >= r.gpus || *b >= r.gpus {
            continue;
        }
        if nvlink_expected(r, exp, *a, *b) == Some(true) {
            bad.insert(((*a).min(*b), (*a).max(*b)), *transport);
        }
    }
    if bad.is_empty() {
        return;
    }
    let all: BTreeSet<(u32, u32)> = (0..r.gpus)
        .flat_map(|a| ((a + 1)..r.gpus).map(move |b| (a, b)))
        .collect();
    let keys: BTreeSet<(u32, u32)> = bad.keys().copied().collect();
    let verdict = blame(r.gpus, &all, &keys);
    let mut push = |subject: Subject, what: String| {
        out.push(Finding {
            source: Some(ExpectationSource::Rule),
            ..finding(
                FindingKind::TransportFallback,
                subject,
                Metric::NcclTransport,
                Severity::Critical,
                what,
            )
        });
    };
    let used = |set: &mut dyn Iterator<Item = Transport>| {
        let names: BTreeSet<&str> = set.map(transport_name).collect();
        names.into_iter().collect::<Vec<_>>().join(" or ")
    };
    if verdict.node {
        let via = used(&mut bad.values().copied());
        push(
            Subject::node(node),
            format!(
                "NCCL used {via} instead of NVLink between every GPU pair of {node}; check the NVLink/NVSwitch state (nvidia-smi topo -m, the fabric manager service) and peer access (IOMMU, ACS)."
            ),
        );
        return;
    }
    for k in &verdict.gpus {
        let via = used(
            &mut bad
                .iter()
                .filter(|((a, b), _)| a == k || b == k)
                .map(|(_, t)| *t),
        );
        push(
            Subject::gpu(node, *k),
            format!(
                "NCCL used {via} instead of NVLink between GPU {k} and every other GPU of {node}; GPU {k}'s NVLink is unusable: check nvidia-smi nvlink -s -i {k}."
            ),
        );
    }
    for (a, b) in &verdict.pairs {
        let via = bad.get(&(*a, *b)).copied().unwrap_or(Transport::Unknown);
        push(
            Subject::gpu_pair(node, *a, *b),
            format!(
                "NCCL used {} instead of NVLink between GPU {a} and GPU {b} on {node}; check nvidia-smi topo -m and both GPUs' NVLink status.",
                transport_name(via)
            ),
        );
    }
}
