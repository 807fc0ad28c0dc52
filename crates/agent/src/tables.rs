//! Human tables of a result document: the NCCL sweep as nccl-tests prints it, the pair
//! matrix as nvbandwidth prints it, the DDP scaling table and the health table.

use gpufabric_api::ResultDocument;
use gpufabric_api::result::{
    CollectiveSweep, CompactSoftware, ComputeResult, DdpResult, HealthSnapshot, HostBandwidth,
    PairBandwidth, PairMatrix, SoftwareField, Transport,
};
use gpufabric_api::suite::Collective;
use std::fmt::Write;

/// Every table of the document, in phase order.
pub fn render(doc: &ResultDocument) -> String {
    let mut out = String::new();
    let product = doc.gpus.first().map(|g| g.product.as_str()).unwrap_or("-");
    let _ = writeln!(
        out,
        "# fabric-agent node-check: node {} backend {} started {} ({} GPUs, {})",
        doc.node,
        doc.backend,
        doc.started_at,
        doc.gpus.len(),
        product
    );
    for g in &doc.gpus {
        let _ = writeln!(
            out,
            "#  GPU {:>2} [{}] {} {:.0} GiB {}",
            g.index,
            g.pci_bus_id.as_deref().unwrap_or("-"),
            g.product,
            g.memory_bytes as f64 / f64::from(1u32 << 30),
            g.uuid.as_deref().unwrap_or("")
        );
    }
    out.push_str(&software_line(doc));
    if let Some(h) = &doc.health {
        out.push('\n');
        out.push_str(&health_table(h));
    }
    if let Some(n) = &doc.nccl {
        for c in &n.collectives {
            out.push('\n');
            out.push_str(&sweep_table(c));
        }
    }
    if let Some(p) = &doc.pairs {
        out.push('\n');
        out.push_str(&pair_tables(p, doc.gpus.len()));
    }
    let fallbacks: Vec<_> = doc
        .transports
        .iter()
        .filter(|t| t.transport != Transport::Nvlink)
        .collect();
    if !fallbacks.is_empty() {
        out.push('\n');
        let _ = writeln!(out, "# Transports other than NVLink");
        for t in fallbacks {
            let _ = writeln!(out, "#  GPU {} <-> GPU {}: {:?}", t.a, t.b, t.transport);
        }
    }
    if let Some(d) = &doc.ddp {
        out.push('\n');
        out.push_str(&ddp_table(d));
    }
    if let Some(c) = &doc.compute {
        out.push('\n');
        out.push_str(&compute_table(c));
    }
    out.push('\n');
    if doc.errors.is_empty() {
        let _ = writeln!(
            out,
            "# Check finished in {:.1} s, no phase errors",
            doc.duration_s
        );
    } else {
        let _ = writeln!(out, "# Phase errors");
        for e in &doc.errors {
            let _ = writeln!(out, "#  {:?} {:?}: {}", e.phase, e.kind, e.message);
        }
        let _ = writeln!(out, "# Check finished in {:.1} s", doc.duration_s);
    }
    out
}

/// The node's software as the run's nodes are compared by, `unknown` where it was not read.
pub fn software_line(doc: &ResultDocument) -> String {
    let s = CompactSoftware::from(doc);
    let fields: Vec<String> = SoftwareField::ALL
        .iter()
        .map(|f| format!("{f} {}", f.of(&s).unwrap_or("unknown")))
        .collect();
    format!("#  Software: {}\n", fields.join(", "))
}

fn redop(c: Collective) -> &'static str {
    match c {
        Collective::AllReduce | Collective::Reduce | Collective::ReduceScatter => "sum",
        _ => "none",
    }
}

fn root(c: Collective) -> i32 {
    match c {
        Collective::Broadcast | Collective::Reduce => 0,
        _ => -1,
    }
}

/// nccl-tests' `%7.2f`-style time: more decimals for small values, never wider than 7.
fn time_cell(us: f64) -> String {
    if us >= 1e7 {
        format!("{us:7.0e}")
    } else if us >= 1e4 {
        format!("{us:7.0}")
    } else {
        format!("{us:7.2}")
    }
}

/// The sweep of one collective in nccl-tests' layout.
pub fn sweep_table(c: &CollectiveSweep) -> String {
    let mut out = String::new();
    let name = c.collective.nccl_tests_name();
    let _ = writeln!(
        out,
        "# {}_perf: {} ranks, {}",
        name,
        c.ranks,
        c.data_type.nccl_tests_name()
    );
    let _ = writeln!(out, "#{:>74}{:>31}", "out-of-place", "in-place");
    let _ = writeln!(
        out,
        "#{:>11}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}",
        "size",
        "count",
        "type",
        "redop",
        "root",
        "time",
        "algbw",
        "busbw",
        "#wrong",
        "time",
        "algbw",
        "busbw",
        "#wrong"
    );
    let _ = writeln!(
        out,
        "#{:>11}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}",
        "(B)",
        "(elements)",
        "",
        "",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        "",
        "(us)",
        "(GB/s)",
        "(GB/s)",
        ""
    );
    let (mut sum, mut n) = (0.0, 0u32);
    for r in &c.rows {
        let in_place = match r.in_place {
            Some(t) => {
                sum += t.busbw;
                n += 1;
                format!(
                    "{}  {:6.2}  {:6.2}  {:>6}",
                    time_cell(t.time_us),
                    t.algbw,
                    t.busbw,
                    t.wrong
                )
            }
            None => format!("{:>7}  {:>6}  {:>6}  {:>6}", "N/A", "N/A", "N/A", "N/A"),
        };
        let o = r.out_of_place;
        sum += o.busbw;
        n += 1;
        let _ = writeln!(
            out,
            " {:>11}  {:>12}  {:>8}  {:>6}  {:>6}  {}  {:6.2}  {:6.2}  {:>6}  {}",
            r.bytes,
            r.count,
            c.data_type.nccl_tests_name(),
            redop(c.collective),
            root(c.collective),
            time_cell(o.time_us),
            o.algbw,
            o.busbw,
            o.wrong,
            in_place
        );
    }
    let wrong = c.total_wrong();
    let _ = writeln!(
        out,
        "# Out of bounds values : {wrong} {}",
        if wrong == 0 { "OK" } else { "FAILED" }
    );
    let avg = if n > 0 { sum / f64::from(n) } else { 0.0 };
    let _ = writeln!(out, "# Avg bus bandwidth    : {avg:.3} ");
    match c.fit {
        Some(f) => {
            let _ = writeln!(
                out,
                "# Fit time = alpha + bytes * busbw factor / beta: alpha {:.2} us, beta {:.2} GB/s (bus)",
                f.alpha_us, f.beta_gbps
            );
        }
        None => {
            let _ = writeln!(out, "# Fit: not enough sizes for an alpha-beta fit");
        }
    }
    out
}

fn matrix(out: &mut String, title: &str, n: usize, cell: impl Fn(usize, usize) -> Option<f64>) {
    let _ = writeln!(out, "{title}");
    let mut header = String::from("     ");
    for col in 0..n {
        let _ = write!(header, "{col:>10}");
    }
    let _ = writeln!(out, "{header}");
    for row in 0..n {
        let mut line = format!("{row:>5}");
        for col in 0..n {
            match cell(row, col) {
                Some(v) => {
                    let _ = write!(line, "{v:>10.2}");
                }
                None => {
                    let _ = write!(line, "{:>10}", "N/A");
                }
            }
        }
        let _ = writeln!(out, "{line}");
    }
}

fn host_row(out: &mut String, title: &str, n: usize, values: &[HostBandwidth]) {
    let _ = writeln!(out, "{title}");
    let mut header = String::from("     ");
    for col in 0..n {
        let _ = write!(header, "{col:>10}");
    }
    let _ = writeln!(out, "{header}");
    let mut line = format!("{:>5}", 0);
    for col in 0..n {
        match values.iter().find(|v| v.gpu as usize == col) {
            Some(v) => {
                let _ = write!(line, "{:>10.2}", v.gbps);
            }
            None => {
                let _ = write!(line, "{:>10}", "N/A");
            }
        }
    }
    let _ = writeln!(out, "{line}");
}

fn find(list: &[PairBandwidth], a: usize, b: usize) -> Option<f64> {
    list.iter()
        .find(|e| e.src as usize == a && e.dst as usize == b)
        .map(|e| e.gbps)
}

/// The pair matrix as nvbandwidth prints it: GPU x GPU in GB/s, then host copies.
pub fn pair_tables(p: &PairMatrix, gpus: usize) -> String {
    let mut out = String::new();
    let mib = p.bytes as f64 / f64::from(1u32 << 20);
    matrix(
        &mut out,
        &format!("memcpy CE GPU(row) -> GPU(column) bandwidth (GB/s), {mib:.0} MiB copies"),
        gpus,
        |r, c| find(&p.unidirectional, r, c),
    );
    if !p.bidirectional.is_empty() {
        out.push('\n');
        matrix(
            &mut out,
            "memcpy CE GPU(row) <-> GPU(column) bidirectional bandwidth (GB/s, both directions summed)",
            gpus,
            |r, c| find(&p.bidirectional, r.min(c), r.max(c)).filter(|_| r != c),
        );
    }
    if !p.host_to_device.is_empty() {
        out.push('\n');
        host_row(
            &mut out,
            "memcpy CE CPU(row) -> GPU(column) bandwidth (GB/s)",
            gpus,
            &p.host_to_device,
        );
    }
    if !p.device_to_host.is_empty() {
        out.push('\n');
        host_row(
            &mut out,
            "memcpy CE CPU(row) <- GPU(column) bandwidth (GB/s)",
            gpus,
            &p.device_to_host,
        );
    }
    if p.corrupt_copies > 0 {
        let _ = writeln!(out, "# {} copies did not arrive intact", p.corrupt_copies);
    }
    out
}

/// The DDP weak-scaling table.
pub fn ddp_table(d: &DdpResult) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# DDP probe: {} Linear({h}, {h}) layers, batch {} per GPU, {} gradient buckets",
        d.layers,
        d.batch_per_gpu,
        d.buckets.len(),
        h = d.hidden
    );
    let _ = writeln!(
        out,
        "#{:>5}  {:>9}  {:>10}  {:>10}  {:>6}  {:>7}  {:>8}  {:>22}",
        "gpus",
        "step(ms)",
        "samples/s",
        "efficiency",
        "comm%",
        "overlap",
        "TFLOP/s",
        "compute ms min/max@gpu"
    );
    for p in &d.points {
        let (mut lo, mut hi, mut at) = (f64::MAX, 0.0f64, 0u32);
        for (i, &ms) in p.compute_ms.iter().enumerate() {
            lo = lo.min(ms);
            if ms > hi {
                hi = ms;
                at = p.gpu_indices.get(i).copied().unwrap_or(i as u32);
            }
        }
        if p.compute_ms.is_empty() {
            lo = 0.0;
        }
        let _ = writeln!(
            out,
            " {:>5}  {:>9.2}  {:>10.0}  {:>9.1}%  {:>5.1}%  {:>6.1}%  {:>8.1}  {:>14}",
            p.gpus,
            p.step_ms,
            p.samples_per_s,
            p.scaling_efficiency * 100.0,
            p.comm_fraction * 100.0,
            p.overlap_efficiency * 100.0,
            p.tflops_per_gpu,
            format!("{lo:.2}/{hi:.2}@{at}")
        );
    }
    out
}

/// The compute checks, one GPU a row: GEMM TFLOP/s, memory GB/s, the SDC outcome and the
/// GPU's state under load.
pub fn compute_table(c: &ComputeResult) -> String {
    let mut out = String::new();
    let size = |v: Option<u32>| v.map_or("-".to_string(), |n| n.to_string());
    let _ = writeln!(
        out,
        "# Compute: GEMM {} x {} x {}, memory copies of {} MiB, SDC GEMM of {}",
        size(c.gemm_size),
        size(c.gemm_size),
        size(c.gemm_size),
        c.memory_bytes
            .map_or("-".to_string(), |b| (b >> 20).to_string()),
        size(c.sdc_size)
    );
    let _ = writeln!(
        out,
        "#{:>3}  {:>9}  {:>9}  {:>10}  {:>10}  {:>18}  {:>10}  {:>12}  {:>5}  throttle",
        "gpu",
        "bf16 TF/s",
        "tf32 TF/s",
        "copy GB/s",
        "fill GB/s",
        "sdc",
        "sm MHz",
        "power W",
        "temp"
    );
    let cell = |v: Option<f64>| v.map_or("-".to_string(), |x| format!("{x:.1}"));
    for g in &c.gpus {
        let sdc = match &g.sdc {
            None => "-".to_string(),
            Some(s) if s.clean() => format!("ok {}/{}", s.outputs, s.outputs),
            Some(s) => match s.first_wrong {
                Some((r, col)) => format!("WRONG {}/{} @{r},{col}", s.wrong_outputs, s.outputs),
                None => format!("WRONG {}/{}", s.wrong_outputs.max(1), s.outputs),
            },
        };
        let (clock, power, temp, throttle) = match &g.under_load {
            Some(l) => (
                format!("{}/{}", l.sm_clock_mhz, l.max_sm_clock_mhz),
                format!("{:.0}/{:.0}", l.power_w, l.power_limit_w),
                format!("{:.0}C", l.temperature_c),
                if l.throttle.is_empty() {
                    "-".to_string()
                } else {
                    l.throttle.join(",")
                },
            ),
            None => ("-".into(), "-".into(), "-".into(), "-".into()),
        };
        let _ = writeln!(
            out,
            " {:>3}  {:>9}  {:>9}  {:>10}  {:>10}  {:>18}  {:>10}  {:>12}  {:>5}  {}",
            g.gpu,
            cell(g.gemm_bf16_tflops),
            cell(g.gemm_tf32_tflops),
            cell(g.memory_copy_gbps),
            cell(g.memory_write_gbps),
            sdc,
            clock,
            power,
            temp,
            throttle
        );
    }
    out
}

/// The health table, one GPU a row.
pub fn health_table(h: &HealthSnapshot) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# Health (NVML)");
    let _ = writeln!(
        out,
        "#{:>3}  {:>7}  {:>7}  {:>11}  {:>10}  {:>5}  {:>7}  {:>6}  {:>7}  throttle",
        "gpu", "nvlink", "nvl-err", "pcie", "xid", "ecc", "remap", "temp", "power"
    );
    for g in &h.gpus {
        let xid = if g.xids.is_empty() {
            "-".to_string()
        } else {
            g.xids
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        let remap = match (g.remapped_pending, g.remapped_failed) {
            (false, false) => "-",
            (true, false) => "pending",
            (false, true) => "failed",
            (true, true) => "pnd+fail",
        };
        let _ = writeln!(
            out,
            " {:>3}  {:>7}  {:>7}  {:>11}  {:>10}  {:>5}  {:>7}  {:>5.0}C  {:>6.0}W  {}",
            g.index,
            format!("{}/{}", g.nvlink_active, g.nvlink_expected),
            g.nvlink_errors,
            format!(
                "G{}x{}/G{}x{}",
                g.pcie_gen, g.pcie_width, g.pcie_gen_max, g.pcie_width_max
            ),
            xid,
            g.ecc_uncorrected,
            remap,
            g.temperature_c,
            g.power_w,
            if g.throttle.is_empty() {
                "-".to_string()
            } else {
                g.throttle.join(",")
            }
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufabric_api::result::{SweepRow, Timing};
    use gpufabric_api::suite::DataType;

    fn sweep(wrong: u64, in_place_wrong: u64) -> CollectiveSweep {
        let t = |wrong| Timing {
            time_us: 20.0,
            algbw: 50.0,
            busbw: 87.5,
            wrong,
        };
        CollectiveSweep {
            collective: Collective::AllReduce,
            data_type: DataType::Float32,
            ranks: 8,
            rows: vec![SweepRow {
                bytes: 1024,
                count: 256,
                out_of_place: t(wrong),
                in_place: Some(t(in_place_wrong)),
            }],
            fit: None,
        }
    }

    #[test]
    fn the_report_names_the_nodes_software_and_what_was_not_read() {
        let mut doc = ResultDocument::unmeasured(
            "n1".into(),
            gpufabric_api::result::Backend::Cuda,
            "2026-11-28T00:00:00Z".into(),
            gpufabric_api::result::Versions {
                driver: Some("550.90.07".into()),
                cuda: Some("12.4".into()),
                vbios: vec!["96.00.74.00.01".into(); 2],
                ..Default::default()
            },
            Vec::new(),
        );
        doc.versions.nccl_conf = Some("none".into());
        let text = render(&doc);
        assert!(
            text.contains(
                "#  Software: driver 550.90.07, CUDA driver version 12.4, NCCL unknown, NCCL config files digest none, VBIOS 96.00.74.00.01, fabric manager state unknown"
            ),
            "{text}"
        );
    }

    #[test]
    fn wrong_values_are_out_of_bounds_and_failed_as_nccl_tests_prints_them() {
        assert!(sweep_table(&sweep(0, 0)).contains("# Out of bounds values : 0 OK"));
        let bad = sweep_table(&sweep(2, 1));
        assert!(bad.contains("# Out of bounds values : 3 FAILED"), "{bad}");
    }

    #[test]
    fn the_compute_table_shows_each_gpu_and_points_at_a_wrong_output() {
        use gpufabric_api::result::{GpuCompute, SdcStatus};
        let sdc = |wrong: u32| SdcStatus {
            outputs: 4,
            wrong_outputs: wrong,
            wrong_lines: u64::from(wrong) * 2,
            first_wrong: (wrong > 0).then_some((1365, 2048)),
            checksum: "00".into(),
            differs_from_others: wrong > 0,
        };
        let c = ComputeResult {
            gemm_size: Some(8192),
            memory_bytes: Some(1 << 30),
            sdc_size: Some(4096),
            gpus: vec![
                GpuCompute {
                    gpu: 0,
                    gemm_bf16_tflops: Some(701.25),
                    sdc: Some(sdc(0)),
                    ..Default::default()
                },
                GpuCompute {
                    gpu: 1,
                    gemm_bf16_tflops: Some(699.0),
                    sdc: Some(sdc(4)),
                    ..Default::default()
                },
            ],
        };
        let t = compute_table(&c);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].contains("GEMM 8192 x 8192 x 8192") && lines[0].contains("1024 MiB"));
        assert!(
            lines[2].contains("701.2") && lines[2].contains("ok 4/4"),
            "{t}"
        );
        assert!(lines[3].contains("WRONG 4/4 @1365,2048"), "{t}");
    }
}
