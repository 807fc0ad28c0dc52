use super::node_model::same_pair;
use super::phases::{OVERLAPPED_COMM_SPEED, overlapped_end};
use super::*;
use crate::fleet::Fault;
use gpufabric_api::CompactResult;
use gpufabric_api::result::{DdpPoint, Transport};
use gpufabric_api::suite::{Collective, Suite};
use std::time::Instant;

fn node(product: &str, gpus: u32, faults: Vec<Fault>) -> FleetNode {
    FleetNode {
        name: "gpu-node-1".into(),
        product: product.into(),
        gpus,
        labels: Default::default(),
        faults,
        software: Default::default(),
    }
}

fn opts() -> CheckOptions {
    CheckOptions {
        node: "gpu-node-1".into(),
        suite: Suite::default(),
        quick: false,
        expect_gpus: None,
        phase_timeout: Duration::from_secs(30),
        shared_gpus: false,
    }
}

fn check(n: &FleetNode) -> ResultDocument {
    node_check(&opts(), n, 7, &|_| {}).expect("sim check")
}

fn h100(faults: Vec<Fault>) -> FleetNode {
    node("NVIDIA-H100-80GB-HBM3", 8, faults)
}

fn uni(doc: &ResultDocument, a: u32, b: u32) -> f64 {
    doc.pairs
        .as_ref()
        .and_then(|p| p.unidirectional.iter().find(|e| e.src == a && e.dst == b))
        .map(|e| e.gbps)
        .expect("pair measured")
}

fn bidir(doc: &ResultDocument, a: u32, b: u32) -> f64 {
    doc.pairs
        .as_ref()
        .and_then(|p| p.bidirectional.iter().find(|e| e.src == a && e.dst == b))
        .map(|e| e.gbps)
        .expect("pair measured")
}

fn all_reduce_peak(doc: &ResultDocument) -> f64 {
    doc.nccl
        .as_ref()
        .and_then(|n| {
            n.collectives
                .iter()
                .find(|c| c.collective == Collective::AllReduce)
        })
        .map(|c| c.peak_busbw())
        .expect("all_reduce swept")
}

fn last_point(doc: &ResultDocument) -> DdpPoint {
    doc.ddp
        .as_ref()
        .and_then(|d| d.points.last().cloned())
        .expect("ddp measured")
}

/// Same document apart from the wall-clock fields.
fn without_clock(mut d: ResultDocument) -> ResultDocument {
    d.started_at.clear();
    d.duration_s = 0.0;
    d
}

#[test]
fn clean_h100_node_measures_like_an_hgx_h100() {
    let doc = check(&h100(vec![]));
    assert_eq!(doc.backend, Backend::Sim);
    assert_eq!(doc.gpus.len(), 8);
    assert!(doc.errors.is_empty());
    let peak = all_reduce_peak(&doc);
    assert!((330.0..380.0).contains(&peak), "all_reduce busbw {peak}");
    for a in 0..8 {
        for b in 0..8 {
            if a != b {
                let v = uni(&doc, a, b);
                assert!((350.0..390.0).contains(&v), "{a}->{b} {v}");
            }
        }
    }
    let p = doc.pairs.as_ref().expect("pairs");
    assert_eq!(p.unidirectional.len(), 56);
    assert_eq!(p.bidirectional.len(), 28);
    assert!(
        p.host_to_device
            .iter()
            .all(|h| (50.0..60.0).contains(&h.gbps))
    );
    let h = doc.health.as_ref().expect("health");
    assert!(h.gpus.iter().all(|g| g.nvlink_active == 18
        && g.xids.is_empty()
        && g.ecc_uncorrected == 0
        && g.pcie_gen == g.pcie_gen_max
        && g.pcie_width == g.pcie_width_max));
    assert!(
        doc.transports
            .iter()
            .all(|t| t.transport == Transport::Nvlink)
    );
    assert_eq!(doc.transports.len(), 28);
    let ddp = doc.ddp.as_ref().expect("ddp");
    assert_eq!(
        ddp.points.iter().map(|p| p.gpus).collect::<Vec<_>>(),
        vec![1, 2, 4, 8]
    );
    let last = last_point(&doc);
    assert!(last.scaling_efficiency > 0.7 && last.scaling_efficiency <= 1.0);
    let (lo, hi) = last
        .compute_ms
        .iter()
        .fold((f64::MAX, 0.0f64), |(l, h), &v| (l.min(v), h.max(v)));
    assert!(hi / lo < 1.02, "no straggler on a clean node: {lo}..{hi}");
    // Every sweep row checks out and the fit matches the model's asymptote.
    for c in &doc.nccl.as_ref().expect("nccl").collectives {
        assert_eq!(c.total_wrong(), 0);
        let fit = c.fit.expect("fit");
        assert!(fit.beta_gbps > 0.5 * c.peak_busbw(), "{c:?}");
    }
}

#[test]
fn same_seed_same_document_and_another_seed_differs() {
    let n = h100(vec![]);
    let a = without_clock(check(&n));
    let b = without_clock(check(&n));
    assert_eq!(a, b);
    let c = without_clock(node_check(&opts(), &n, 8, &|_| {}).expect("sim check"));
    assert_ne!(a, c);
    // Noise is small: another seed stays within a few percent.
    assert!((all_reduce_peak(&a) / all_reduce_peak(&c) - 1.0).abs() < 0.05);
}

#[test]
fn a_slow_fabric_slows_every_pair_and_the_collectives_alike() {
    let clean = check(&h100(vec![]));
    let doc = check(&h100(vec![Fault::SlowFabric { factor: 0.9 }]));
    for a in 0..8 {
        for b in 0..8 {
            if a != b {
                let r = uni(&doc, a, b) / uni(&clean, a, b);
                assert!((r - 0.9).abs() < 1e-9, "{a}->{b}: {r}");
            }
        }
    }
    let ratio = all_reduce_peak(&doc) / all_reduce_peak(&clean);
    assert!((0.88..0.92).contains(&ratio), "{ratio}");
    assert_eq!(doc.health, clean.health);
}

#[test]
fn slow_pair_slows_that_pair_only_and_bounds_the_ring() {
    let clean = check(&h100(vec![]));
    let doc = check(&h100(vec![Fault::SlowPair {
        gpus: [2, 5],
        factor: 0.4,
    }]));
    let slow = uni(&doc, 2, 5);
    assert!(slow < 0.45 * uni(&clean, 2, 5), "{slow}");
    assert!(uni(&doc, 5, 2) < 0.45 * uni(&clean, 5, 2));
    assert!(bidir(&doc, 2, 5) < 0.45 * bidir(&clean, 2, 5));
    for a in 0..8 {
        for b in 0..8 {
            if a != b && !same_pair([2, 5], a, b) {
                assert_eq!(uni(&doc, a, b), uni(&clean, a, b), "{a}->{b} untouched");
            }
        }
    }
    let ratio = all_reduce_peak(&doc) / all_reduce_peak(&clean);
    assert!(
        (0.35..0.45).contains(&ratio),
        "ring limited by the slow link: {ratio}"
    );
    // Health knows nothing of it: the link is up, only slow.
    assert_eq!(doc.health, clean.health);
}

#[test]
fn a_slow_launching_cpu_stretches_host_launched_small_sizes_and_not_graph_timed_ones() {
    let slow = h100(vec![Fault::SlowLaunchCpu { factor: 1.4 }]);
    let small = |doc: &ResultDocument| {
        let nccl = doc.nccl.as_ref().expect("nccl");
        let ar = &nccl.collectives[0];
        assert_eq!(ar.collective, Collective::AllReduce);
        (
            ar.rows[0].out_of_place.time_us,
            ar.rows.last().map(|r| r.out_of_place.busbw),
        )
    };
    let (clean_t, clean_bw) = small(&check(&h100(vec![])));
    let (slow_t, slow_bw) = small(&check(&slow));
    assert!(
        (slow_t / clean_t - 1.4).abs() < 0.1,
        "{slow_t} vs {clean_t}"
    );
    // The launch cost is per call: 1 GiB keeps its bandwidth.
    let (a, b) = (slow_bw.expect("rows"), clean_bw.expect("rows"));
    assert!((a / b - 1.0).abs() < 0.01, "{a} vs {b}");
    let mut graphs = opts();
    graphs.suite.nccl_sweep.graph_launches = 10;
    let doc = node_check(&graphs, &slow, 7, &|_| {}).expect("sim check");
    assert_eq!(doc.nccl.as_ref().map(|n| n.graph_launches), Some(10));
    let (graph_t, _) = small(&doc);
    assert!(
        (graph_t / clean_t - 1.0).abs() < 0.1,
        "{graph_t} vs {clean_t}"
    );
}

#[test]
fn straggler_slows_that_gpus_compute_and_stretches_the_step() {
    let clean = check(&h100(vec![]));
    let doc = check(&h100(vec![Fault::Straggler {
        gpu: 3,
        factor: 1.3,
    }]));
    let (p, c) = (last_point(&doc), last_point(&clean));
    for (i, (&v, &w)) in p.compute_ms.iter().zip(&c.compute_ms).enumerate() {
        if i == 3 {
            assert!((v / w - 1.3).abs() < 0.01, "gpu 3 {v} vs {w}");
        } else {
            assert_eq!(v, w, "gpu {i} untouched");
        }
    }
    // Part of the straggler's delay hides communication that was exposed before.
    assert!(
        p.step_ms > 1.1 * c.step_ms,
        "{} vs {}",
        p.step_ms,
        c.step_ms
    );
    assert!(p.scaling_efficiency < 0.9 * c.scaling_efficiency);
    // The 1- and 2-GPU points (GPUs 0 and 0-1) do not include GPU 3.
    let d = doc.ddp.as_ref().expect("ddp");
    let e = clean.ddp.as_ref().expect("ddp");
    assert_eq!(d.points[0], e.points[0]);
    assert_eq!(d.points[1], e.points[1]);
    assert_eq!(doc.nccl, clean.nccl);
    assert_eq!(doc.pairs, clean.pairs);
}

#[test]
fn dead_link_lowers_active_links_and_that_gpus_pairs() {
    let clean = check(&h100(vec![]));
    let doc = check(&h100(vec![Fault::DeadLink { gpu: 6, links: 6 }]));
    let h = doc.health.as_ref().expect("health");
    for g in &h.gpus {
        let want = if g.index == 6 { 12 } else { 18 };
        assert_eq!(g.nvlink_active, want, "gpu {}", g.index);
        assert_eq!(g.nvlink_expected, 18);
    }
    for a in 0..8 {
        for b in 0..8 {
            if a == b {
                continue;
            }
            let ratio = uni(&doc, a, b) / uni(&clean, a, b);
            if a == 6 || b == 6 {
                assert!((ratio - 12.0 / 18.0).abs() < 1e-9, "{a}->{b} {ratio}");
            } else {
                assert_eq!(ratio, 1.0, "{a}->{b}");
            }
        }
    }
}

#[test]
fn health_faults_land_on_the_named_gpu() {
    let doc = check(&h100(vec![
        Fault::Xid { gpu: 1, code: 79 },
        Fault::Ecc { gpu: 4, count: 3 },
        Fault::PcieDegraded {
            gpu: 7,
            generation: 4,
            width: 8,
        },
    ]));
    let h = doc.health.as_ref().expect("health");
    for g in &h.gpus {
        assert_eq!(g.xids, if g.index == 1 { vec![79] } else { vec![] });
        assert_eq!(g.ecc_uncorrected, if g.index == 4 { 3 } else { 0 });
        assert_eq!(g.remapped_pending, g.index == 4);
        if g.index == 7 {
            assert_eq!((g.pcie_gen, g.pcie_width), (4, 8));
        } else {
            assert_eq!((g.pcie_gen, g.pcie_width), (5, 16));
        }
        assert_eq!((g.pcie_gen_max, g.pcie_width_max), (5, 16));
    }
    // Gen4 x8 is a quarter of Gen5 x16: that GPU's host copies drop to a quarter.
    let p = doc.pairs.as_ref().expect("pairs");
    let h2d7 = p.host_to_device[7].gbps;
    let h2d0 = p.host_to_device[0].gbps;
    assert!((h2d7 / h2d0 - 0.25).abs() < 0.02, "{h2d7} vs {h2d0}");
}

#[test]
fn transport_fallback_is_reported_for_that_pair_and_slows_it() {
    let clean = check(&h100(vec![]));
    let doc = check(&h100(vec![Fault::TransportFallback {
        gpus: [0, 1],
        transport: Transport::Shm,
    }]));
    for t in &doc.transports {
        let want = if (t.a, t.b) == (0, 1) {
            Transport::Shm
        } else {
            Transport::Nvlink
        };
        assert_eq!(t.transport, want, "{t:?}");
    }
    assert!(uni(&doc, 0, 1) < 30.0);
    assert_eq!(uni(&doc, 0, 2), uni(&clean, 0, 2));
    assert!(all_reduce_peak(&doc) < 0.1 * all_reduce_peak(&clean));
    let compact = CompactResult::from(&doc);
    assert_eq!(compact.transport_fallbacks, vec![(0, 1, Transport::Shm)]);
}

#[test]
fn hang_is_caught_by_the_watchdog_as_a_timeout_of_that_phase() {
    let n = h100(vec![Fault::Hang {
        phase: None,
        stuck: false,
    }]);
    let mut o = opts();
    o.phase_timeout = Duration::from_millis(200);
    let t0 = Instant::now();
    let doc = node_check(&o, &n, 7, &|_| {}).expect("sim check");
    assert!(t0.elapsed() >= Duration::from_millis(200));
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_eq!(doc.errors.len(), 1);
    assert_eq!(doc.errors[0].phase, Phase::NcclSweep);
    assert_eq!(doc.errors[0].kind, ErrorKind::Timeout);
    assert!(doc.nccl.is_none());
    assert!(doc.pairs.is_some() && doc.ddp.is_some() && doc.health.is_some());

    let n = h100(vec![Fault::Hang {
        phase: Some(Phase::GpuPairs),
        stuck: false,
    }]);
    let doc = node_check(&o, &n, 7, &|_| {}).expect("sim check");
    assert_eq!(doc.errors[0].phase, Phase::GpuPairs);
    assert!(doc.pairs.is_none() && doc.nccl.is_some());
}

#[test]
fn hang_in_setup_leaves_only_the_timeout() {
    let n = h100(vec![Fault::Hang {
        phase: Some(Phase::Setup),
        stuck: false,
    }]);
    let mut o = opts();
    o.phase_timeout = Duration::from_millis(50);
    let doc = node_check(&o, &n, 7, &|_| {}).expect("sim check");
    assert_eq!(doc.gpus.len(), 8);
    assert!(doc.nccl.is_none() && doc.pairs.is_none() && doc.ddp.is_none());
    assert!(doc.health.is_none() && doc.transports.is_empty());
    assert_eq!(doc.errors.len(), 1);
    assert_eq!(
        (doc.errors[0].phase, doc.errors[0].kind),
        (Phase::Setup, ErrorKind::Timeout)
    );
}

#[test]
fn slow_nic_leaves_the_node_check_untouched() {
    let clean = without_clock(check(&h100(vec![])));
    let doc = without_clock(check(&h100(vec![Fault::SlowNic { factor: 0.5 }])));
    assert_eq!(doc, clean);
}

#[test]
fn crash_and_garbage_are_process_faults() {
    assert_eq!(process_fault(&h100(vec![])), None);
    assert_eq!(
        process_fault(&h100(vec![Fault::Crash { exit_code: None }])),
        Some(ProcessFault::Crash { exit_code: 134 })
    );
    assert_eq!(
        process_fault(&h100(vec![
            Fault::Garbage,
            Fault::Crash { exit_code: Some(3) }
        ])),
        Some(ProcessFault::Crash { exit_code: 3 })
    );
    assert_eq!(
        process_fault(&h100(vec![Fault::Garbage])),
        Some(ProcessFault::Garbage)
    );
}

#[test]
fn suite_switches_and_sizes_are_respected() {
    let mut o = opts();
    o.suite.nccl_sweep.collectives = vec![Collective::AllGather, Collective::SendRecv];
    o.suite.nccl_sweep.min_bytes = 1024;
    o.suite.nccl_sweep.max_bytes = 1 << 20;
    o.suite.gpu_pairs.bidirectional = false;
    o.suite.gpu_pairs.host_copies = false;
    o.suite.ddp_probe.gpu_counts = Some(vec![2, 8]);
    o.suite.health.enabled = false;
    let doc = node_check(&o, &h100(vec![]), 1, &|_| {}).expect("sim check");
    let nccl = doc.nccl.as_ref().expect("nccl");
    assert_eq!(
        nccl.collectives
            .iter()
            .map(|c| c.collective)
            .collect::<Vec<_>>(),
        vec![Collective::AllGather, Collective::SendRecv]
    );
    let rows = &nccl.collectives[0].rows;
    assert_eq!(rows.first().map(|r| r.bytes), Some(1024));
    assert_eq!(rows.last().map(|r| r.bytes), Some(1 << 20));
    // all_gather's count is per rank: 1024 bytes of float over 8 ranks = 32.
    assert_eq!(rows[0].count, 32);
    assert!(
        rows.iter()
            .all(|r| r.in_place.is_some_and(|t| t.time_us > 0.0))
    );
    let sendrecv = &nccl.collectives[1].rows;
    assert!(sendrecv.iter().all(|r| r.in_place.is_none()));
    let p = doc.pairs.as_ref().expect("pairs");
    assert!(p.bidirectional.is_empty() && p.host_to_device.is_empty());
    let counts: Vec<u32> = doc
        .ddp
        .as_ref()
        .expect("ddp")
        .points
        .iter()
        .map(|p| p.gpus)
        .collect();
    assert_eq!(counts, vec![2, 8]);
    assert!(doc.health.is_none());

    o.suite = Suite::default();
    o.suite.nccl_sweep.enabled = false;
    o.suite.gpu_pairs.enabled = false;
    o.suite.ddp_probe.enabled = false;
    let doc = node_check(&o, &h100(vec![]), 1, &|_| {}).expect("sim check");
    assert!(doc.nccl.is_none() && doc.pairs.is_none() && doc.ddp.is_none());
    assert!(doc.health.is_some());
}

#[test]
fn quick_runs_fewer_sizes() {
    let full = check(&h100(vec![]));
    let mut o = opts();
    o.quick = true;
    let quick = node_check(&o, &h100(vec![]), 7, &|_| {}).expect("sim check");
    let rows = |d: &ResultDocument| d.nccl.as_ref().map(|n| n.collectives[0].rows.len());
    assert!(rows(&quick) < rows(&full));
}

#[test]
fn single_gpu_node_has_host_copies_and_no_pairs() {
    let doc = check(&node("NVIDIA-H100-80GB-HBM3", 1, vec![]));
    let p = doc.pairs.as_ref().expect("pairs");
    assert!(p.unidirectional.is_empty() && p.bidirectional.is_empty());
    assert_eq!(p.host_to_device.len(), 1);
    assert!(doc.transports.is_empty());
    let ddp = doc.ddp.as_ref().expect("ddp");
    assert_eq!(ddp.points.len(), 1);
    assert_eq!(ddp.points[0].comm_fraction, 0.0);
    // One rank moves nothing over a bus: all_reduce busbw is 0 by nccl-tests' factor.
    assert_eq!(all_reduce_peak(&doc), 0.0);
    let compact = CompactResult::parse(&doc.compact_within(4096)).expect("parses");
    assert_eq!(compact.gpus, 1);
}

#[test]
fn ddp_model_matches_the_measured_four_gpu_h200() {
    // crates/health/tests/data/h200x4-full.compact: step 25.12 ms, efficiency 0.817,
    // comm fraction 0.189, overlap 0.512 at 4 GPUs; 616 TFLOP/s on one GPU.
    let doc = check(&node("NVIDIA-H200", 4, vec![]));
    let ddp = doc.ddp.as_ref().expect("ddp");
    let one = &ddp.points[0];
    assert!((one.tflops_per_gpu / 616.0 - 1.0).abs() < 0.05, "{one:?}");
    let four = ddp.points.last().expect("4-GPU point");
    assert_eq!(four.gpus, 4);
    assert!((four.step_ms / 25.12 - 1.0).abs() < 0.05, "{four:?}");
    assert!((four.scaling_efficiency - 0.817).abs() < 0.04, "{four:?}");
    assert!((four.comm_fraction - 0.189).abs() < 0.04, "{four:?}");
    assert!((four.overlap_efficiency - 0.512).abs() < 0.08, "{four:?}");
}

#[test]
fn overlapped_all_reduce_runs_slower_until_compute_ends() {
    // Entirely after compute: full speed.
    assert_eq!(overlapped_end(10.0, 2.0, 5.0), 12.0);
    // Entirely during compute: at the overlapped speed.
    let end = overlapped_end(0.0, 0.9, 10.0);
    assert!((end - 0.9 / OVERLAPPED_COMM_SPEED).abs() < 1e-12);
    // Straddling: slow until compute ends at 1.0, then the rest at full speed.
    let end = overlapped_end(0.0, 1.0, 1.0);
    assert!((end - (1.0 + (1.0 - OVERLAPPED_COMM_SPEED))).abs() < 1e-12);
}

#[test]
fn too_few_gpus_is_an_error() {
    let mut o = opts();
    o.expect_gpus = Some(8);
    let err = node_check(&o, &node("NVIDIA-H200", 4, vec![]), 1, &|_| {}).expect_err("4 < 8");
    assert_eq!(err.exit_code(), 12);
}

#[test]
fn products_have_their_own_figures() {
    let h200 = check(&node("NVIDIA-H200", 8, vec![]));
    let a100 = check(&node("NVIDIA-A100-SXM4-80GB", 8, vec![]));
    assert!(uni(&h200, 0, 1) > 385.0);
    assert!(uni(&a100, 0, 1) < 200.0);
    assert_eq!(
        a100.health.as_ref().map(|h| h.gpus[0].nvlink_expected),
        Some(12)
    );
    assert!(h200.gpus[0].memory_bytes > 140 << 30);
}

#[test]
fn compact_default_eight_gpu_document_fits_a_termination_message() {
    let doc = check(&h100(vec![
        Fault::Xid { gpu: 1, code: 79 },
        Fault::TransportFallback {
            gpus: [0, 1],
            transport: Transport::Pcie,
        },
    ]));
    let full = CompactResult::from(&doc).to_json();
    assert!(full.len() <= 4096, "compact form is {} bytes", full.len());
    let text = doc.compact_within(4096);
    assert_eq!(text, full, "nothing had to be dropped");
    let back = CompactResult::parse(&text).expect("parses");
    assert_eq!(back.gpus, 8);
    assert_eq!(back.collectives.len(), 7);
    assert_eq!(back.copy_uni.len(), 64);
}

#[test]
fn full_default_check_is_fast() {
    let t0 = Instant::now();
    let _ = check(&h100(vec![]));
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
}

#[test]
fn fit_of_sim_sweep_recovers_model_alpha_and_beta() {
    let doc = check(&h100(vec![]));
    let c = &doc.nccl.as_ref().expect("nccl").collectives[0];
    let fit = c.fit.expect("fit");
    assert!((fit.alpha_us - 12.5).abs() < 1.5, "{fit:?}");
    assert!((fit.beta_gbps - 360.0).abs() < 15.0, "{fit:?}");
}

#[test]
fn the_compute_checks_name_a_corrupting_gpu_a_slow_memory_and_a_straggler_and_nothing_else() {
    let doc = check(&h100(vec![
        Fault::Sdc { gpu: 6 },
        Fault::SlowMemory {
            gpu: 1,
            factor: 0.7,
        },
        Fault::Straggler {
            gpu: 3,
            factor: 1.5,
        },
    ]));
    let c = doc.compute.as_ref().expect("compute measured");
    assert_eq!(c.gpus.len(), 8);
    assert_eq!((c.gemm_size, c.sdc_size), (Some(8192), Some(4096)));
    let rate = |g: usize| c.gpus[g].gemm_bf16_tflops.expect("bf16");
    let mem = |g: usize| c.gpus[g].memory_copy_gbps.expect("copy");
    for g in 0..8 {
        let sdc = c.gpus[g].sdc.as_ref().expect("sdc ran");
        assert_eq!(sdc.clean(), g != 6, "GPU {g}: {sdc:?}");
        assert_eq!(sdc.outputs, 4);
        if g == 6 {
            assert!(sdc.differs_from_others && sdc.wrong_outputs == 4);
            assert!(sdc.first_wrong.is_some());
        }
        assert!(c.gpus[g].gemm_tf32_tflops.is_some());
        assert!(c.gpus[g].under_load.is_some());
    }
    assert!(rate(3) < rate(0) / 1.4, "{} vs {}", rate(3), rate(0));
    assert!(
        (rate(6) / rate(0) - 1.0).abs() < 0.03,
        "a corrupting GPU computes at speed"
    );
    assert!(mem(1) < mem(0) * 0.75 && mem(1) > mem(0) * 0.65);
    // The compact form keeps them for the operator.
    let compact = CompactResult::from(&doc);
    assert_eq!(compact.compute.len(), 8);
    assert_eq!(compact.compute[6].sdc, Some((4, 4, true)));
    assert_eq!(compact.compute[0].sdc, Some((0, 4, false)));
}

#[test]
fn compute_checks_turned_off_leave_no_compute_section() {
    let mut o = opts();
    o.suite.compute.gemm.enabled = false;
    o.suite.compute.memory.enabled = false;
    o.suite.compute.sdc.enabled = false;
    let doc = node_check(&o, &h100(vec![]), 7, &|_| {}).expect("sim check");
    assert!(doc.compute.is_none());
    o.suite.compute.sdc.enabled = true;
    let doc = node_check(&o, &h100(vec![]), 7, &|_| {}).expect("sim check");
    let c = doc.compute.expect("sdc alone");
    assert!(
        c.gpus
            .iter()
            .all(|g| g.gemm_bf16_tflops.is_none() && g.sdc.is_some())
    );
}

#[test]
fn a_suite_larger_than_the_simulated_gpus_is_refused_as_input_before_any_phase() {
    let mut o = opts();
    // 32 GiB: three buffers of 96 GiB fit an H200 (140 GiB), not an H100 (80 GB).
    o.suite.nccl_sweep.max_bytes = 32 << 30;
    let err = super::node_check(&o, &h100(vec![]), 7, &|_| {}).expect_err("refused");
    let CheckError::InvalidInput(why) = &err else {
        panic!("not an input refusal: {err:?}");
    };
    assert!(
        why.contains("suite.ncclSweep.maxBytes: needs 96.0 GiB on each GPU")
            && why.contains("this node's"),
        "{why}"
    );
    assert_eq!(err.exit_code(), 2);
    let h200 = node("NVIDIA-H200", 8, vec![]);
    assert!(
        super::node_check(&o, &h200, 7, &|_| {}).is_ok(),
        "fits an H200"
    );
}

#[test]
fn a_node_whose_gpus_are_all_hidden_loads_and_finds_no_gpu_as_cuda_does() {
    let fleet: crate::fleet::Fleet =
        serde_yaml::from_str("nodes:\n  - {name: gpu-node-1, product: NVIDIA-H200, gpus: 0}\n")
            .expect("parses");
    fleet
        .check()
        .expect("a node with every GPU hidden is a valid fleet");
    let err = node_check(&opts(), &fleet.nodes[0], 7, &|_| {}).expect_err("no GPU");
    assert!(matches!(err, CheckError::NoGpu(_)), "{err}");
    assert_eq!(err.exit_code(), 10, "the exit code of GpuMissing");
}
