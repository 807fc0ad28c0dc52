//! Floors from the measured topology, NCCL against the copy engines, sides of a GPU.

use super::*;

const H200: &str = "NVIDIA H200";

/// A healthy slice of `g` GPUs of an H200 NVSwitch board as the agent reports it: 18
/// links of 25 GB/s to NVSwitches per GPU, pairs ~394 GB/s one way, all_reduce ~355 GB/s
/// (the 4 x H200 record of bench/results).
fn switched_slice(name: &str, g: u32, seed: u64) -> CompactResult {
    let mut r = node_of(name, H200, g, seed, 0.01);
    for h in &mut r.health {
        h.nvlink_link_gbps = 25.0;
        h.nvlink_switch = Some(true);
    }
    for v in r.copy_uni.iter_mut().filter(|v| **v > 0.0) {
        *v = *v / 390.0 * 394.0;
    }
    all_reduce(&mut r).peak_busbw = 355.0;
    r
}

fn critical_of<'a>(e: &'a Evaluation, node: &'a str) -> Vec<&'a Finding> {
    e.findings_of(node)
        .filter(|f| f.severity == Severity::Critical)
        .collect()
}

#[test]
fn healthy_switched_slices_of_two_four_and_eight_gpus_pass_alone() {
    for g in [2, 4, 8] {
        let e = run(vec![switched_slice("slice", g, u64::from(g))]);
        assert!(
            critical_of(&e, "slice").is_empty(),
            "{g} GPUs: {:?}",
            e.findings
        );
        assert_eq!(e.verdicts["slice"], NodeVerdict::Passed);
    }
}

#[test]
fn nccl_far_below_the_copy_engines_fails_a_switched_node_alone() {
    // NCCL_MAX_NCHANNELS=1, say: every link healthy, all_reduce a tenth of a pair's copy.
    for g in [2, 4] {
        let mut r = switched_slice("one-channel", g, 3);
        all_reduce(&mut r).peak_busbw = 38.0;
        let e = run(vec![r]);
        let bad = critical_of(&e, "one-channel");
        assert_eq!(bad.len(), 1, "{g} GPUs: {bad:?}");
        let f = bad[0];
        assert_eq!(f.metric, Metric::NcclBusBw);
        assert_eq!(f.subject.kind(), SubjectKind::Node);
        assert!(
            f.message.contains("its GPUs copy to each other"),
            "{}",
            f.message
        );
        assert!(f.message.contains("NCCL_MAX_NCHANNELS"), "{}", f.message);
        assert_eq!(e.verdicts["one-channel"], NodeVerdict::Failed);
    }
}

#[test]
fn without_a_measured_topology_a_four_gpu_node_has_no_busbw_floor() {
    // The same slow all_reduce on a node that reported no NVLink peers: the product's
    // floors exist only for its 8-GPU board, so the node alone passes (what the measured
    // topology adds).
    let mut r = switched_slice("unknown-links", 4, 5);
    for h in &mut r.health {
        h.nvlink_switch = None;
    }
    all_reduce(&mut r).peak_busbw = 38.0;
    let e = run(vec![r]);
    assert!(
        critical_of(&e, "unknown-links")
            .iter()
            .all(|f| f.metric != Metric::NcclBusBw),
        "{:?}",
        e.findings
    );
}

#[test]
fn a_switched_slice_below_its_link_floor_fails_with_the_floor_when_copies_are_slow_too() {
    // Links at a third of their speed: pairs and NCCL alike (no NCCL-only problem).
    let mut r = switched_slice("slow-links", 4, 7);
    for v in r.copy_uni.iter_mut() {
        *v /= 3.0;
    }
    for v in r.copy_bidir.iter_mut() {
        *v /= 3.0;
    }
    all_reduce(&mut r).peak_busbw = 110.0;
    let e = run(vec![r]);
    let bad = critical_of(&e, "slow-links");
    let floors: Vec<f64> = bad.iter().filter_map(|f| f.expected).collect();
    // Pair floor 18 x 25 x 0.5 = 225 GB/s; all_reduce floor the same.
    assert!(floors.contains(&225.0), "{bad:?}");
    assert!(
        bad.iter()
            .all(|f| !f.message.contains("its GPUs copy to each other")),
        "{bad:?}"
    );
}

#[test]
fn a_one_way_copy_load_names_the_sending_and_the_receiving_gpu() {
    // Work copying from GPU 1 into GPU 3: copies out of 1 and into 3 share its ports.
    let mut r = switched_slice("one-way", 4, 11);
    let g = 4usize;
    for a in 0..g {
        for b in 0..g {
            if a != b && (a == 1 || b == 3) {
                r.copy_uni[a * g + b] *= 0.52;
            }
        }
    }
    // Both ways at once, every pair of GPU 1 or 3 carries the slow direction.
    for (a, b) in [(0, 1), (0, 3), (1, 2), (1, 3), (2, 3)] {
        let i = upper(4, a, b);
        r.copy_bidir[i] *= 0.75;
    }
    let e = run(vec![r]);
    let bad = critical_of(&e, "one-way");
    assert_eq!(bad.len(), 2, "{bad:?}");
    let send = bad
        .iter()
        .find(|f| f.subject.gpu_index() == Some(1))
        .expect("GPU 1 named");
    assert_eq!(send.subject.kind(), SubjectKind::Gpu);
    assert!(send.message.contains("sending side"), "{}", send.message);
    let recv = bad
        .iter()
        .find(|f| f.subject.gpu_index() == Some(3))
        .expect("GPU 3 named");
    assert!(recv.message.contains("receiving side"), "{}", recv.message);
    assert!(bad.iter().all(|f| f.subject.kind() != SubjectKind::GpuPair));
}

#[test]
fn one_gpu_slow_to_receive_on_an_eight_gpu_board_is_named_with_its_side() {
    let mut r = healthy("recv", 21, 0.01);
    let g = 8usize;
    for a in 0..g {
        if a != 5 {
            r.copy_uni[a * g + 5] *= 0.4;
        }
    }
    let e = run(vec![r]);
    let bad = critical_of(&e, "recv");
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert_eq!(bad[0].subject.gpu_index(), Some(5));
    assert!(
        bad[0].message.contains("receiving side"),
        "{}",
        bad[0].message
    );
}

#[test]
fn one_slow_pair_is_still_named_as_the_pair() {
    let mut r = switched_slice("pair", 4, 13);
    slow_pair(&mut r, 0, 2, 0.5);
    let e = run(vec![r]);
    let bad = critical_of(&e, "pair");
    assert!(!bad.is_empty());
    assert!(
        bad.iter().all(|f| f.subject.kind() == SubjectKind::GpuPair
            && f.subject.gpu_index() == Some(0)
            && f.subject.peer_gpu_index() == Some(2)),
        "{bad:?}"
    );
}

#[test]
fn two_gpus_with_one_direction_far_below_the_other_name_that_direction() {
    // 2 x H200 on NVSwitch, bench/results/h200x2-2026-11-26-compare: a one-way copy load
    // from GPU 0 to GPU 1 took that direction to 263 GB/s against 390 back.
    let switched = |r: &mut CompactResult| {
        for h in &mut r.health {
            h.nvlink_link_gbps = 25.0;
            h.nvlink_switch = Some(true);
        }
    };
    let mut loaded = node_of("vm", "NVIDIA H200", 2, 1, 0.0);
    switched(&mut loaded);
    loaded.copy_uni = vec![0.0, 262.8, 389.7, 0.0];
    let e = run(vec![loaded]);
    let f = on(&e, "vm");
    let slow: Vec<&&Finding> = f.iter().filter(|f| f.kind == FindingKind::Slow).collect();
    assert_eq!(slow.len(), 1, "{f:#?}");
    assert_eq!(
        slow[0].subject,
        Subject::gpu_pair("vm", 0, 1),
        "{:#?}",
        slow[0]
    );
    assert_eq!(slow[0].measured, Some(262.8));
    assert_eq!(slow[0].expected, Some(389.7));
    assert!(
        slow[0]
            .message
            .contains("GPU 0's sending side or GPU 1's receiving side")
    );
    assert_eq!(e.verdicts["vm"], NodeVerdict::Failed);
    // Five clean runs on the same machine: the directions within 0.1% of each other.
    for (a, b) in [
        (394.3, 394.5),
        (394.5, 394.7),
        (394.5, 394.3),
        (394.8, 394.2),
        (394.3, 394.6),
    ] {
        let mut clean = node_of("vm", "NVIDIA H200", 2, 1, 0.0);
        switched(&mut clean);
        clean.copy_uni = vec![0.0, a, b, 0.0];
        let e = run(vec![clean]);
        assert!(
            on(&e, "vm").iter().all(|f| f.kind != FindingKind::Slow),
            "{:#?}",
            e.findings
        );
    }
}

#[test]
fn a_sweep_that_ends_below_the_bandwidth_sizes_is_not_judged_on_bandwidth() {
    // A latency test (maxBytes 1 MiB) on a healthy switched slice: its peak busbw is set by
    // latency, far below the floor and the copy engines. Not judged, and an Info says so.
    let t = Thresholds {
        nccl_bus_bw_gbps: Some(300.0),
        ..Thresholds::default()
    };
    for largest in [1u64 << 20, 16 << 20] {
        let mut r = switched_slice("latency-test", 4, 5);
        let ar = all_reduce(&mut r);
        ar.peak_busbw = 12.4;
        ar.largest_bytes = Some(largest);
        for th in [Thresholds::default(), t.clone()] {
            let e = evaluate(&[NodeInput::measured(r.clone())], &th);
            assert!(
                critical_of(&e, "latency-test").is_empty(),
                "{:#?}",
                e.findings
            );
            assert_eq!(e.verdicts["latency-test"], NodeVerdict::Passed);
            let info: Vec<_> = e
                .findings_of("latency-test")
                .filter(|f| f.metric == Metric::NcclBusBw)
                .collect();
            assert_eq!(info.len(), 1, "{info:#?}");
            assert_eq!(info[0].severity, Severity::Info);
            assert!(
                info[0].message.contains("not judged"),
                "{}",
                info[0].message
            );
            assert!(info[0].message.contains("maxBytes"), "{}", info[0].message);
        }
    }
    // From 64 MiB the same reading fails the node (the copy engines' relation).
    let mut r = switched_slice("bandwidth-test", 4, 5);
    let ar = all_reduce(&mut r);
    ar.peak_busbw = 12.4;
    ar.largest_bytes = Some(64 << 20);
    let e = run(vec![r]);
    assert_eq!(
        critical_of(&e, "bandwidth-test").len(),
        1,
        "{:#?}",
        e.findings
    );
    assert_eq!(e.verdicts["bandwidth-test"], NodeVerdict::Failed);
}

#[test]
fn copies_too_short_to_show_the_links_are_not_judged() {
    // gpuPairs.bytes 256 KiB: a healthy switched slice copies at ~74 GB/s one way and ~29
    // GB/s from the host (2 x H200). Not judged, against floors or each other; one Info.
    let slow = |bytes: u64| {
        let mut r = switched_slice("short-copies", 4, 9);
        for v in r.copy_uni.iter_mut().chain(r.copy_bidir.iter_mut()) {
            *v *= 74.0 / 394.0;
        }
        for v in r
            .host_to_device
            .iter_mut()
            .chain(r.device_to_host.iter_mut())
        {
            *v = 29.0;
        }
        r.copy_uni[1] *= 0.5;
        r.pair_bytes = Some(bytes);
        r
    };
    let e = run(vec![slow(256 << 10)]);
    assert!(
        critical_of(&e, "short-copies").is_empty(),
        "{:#?}",
        e.findings
    );
    assert_eq!(e.verdicts["short-copies"], NodeVerdict::Passed);
    let info: Vec<_> = e
        .findings_of("short-copies")
        .filter(|f| f.message.contains("not judged"))
        .collect();
    assert_eq!(info.len(), 1, "{:#?}", e.findings);
    assert_eq!(info[0].severity, Severity::Info);
    assert!(
        info[0].message.contains("gpuPairs.bytes"),
        "{}",
        info[0].message
    );
    // Copies of 16 MiB that slow fail the node.
    let e = run(vec![slow(16 << 20)]);
    assert!(
        !critical_of(&e, "short-copies").is_empty(),
        "{:#?}",
        e.findings
    );
    assert_eq!(e.verdicts["short-copies"], NodeVerdict::Failed);
}

/// `r` with every collective the sweep runs at `share` of its healthy relation to the
/// median pair copy (394 GB/s on a switched slice).
fn collectives_at(r: &mut CompactResult, share: f64) {
    r.collectives = crate::profiles::HEALTHY_COLLECTIVE_TO_COPY
        .iter()
        .map(|(c, healthy)| CompactCollective {
            collective: *c,
            peak_busbw: 394.0 * healthy * share,
            largest_busbw: 394.0 * healthy * share,
            smallest_time_us: 20.0,
            alpha_beta: None,
            wrong: 0,
            largest_bytes: Some(1 << 30),
        })
        .collect();
}

#[test]
fn every_collective_a_quarter_below_its_own_links_fails_and_a_clean_spread_passes() {
    // What five clean checks on 4 x H100 spread over (2%) passes, for every collective.
    for share in [0.98, 1.0, 1.02] {
        let mut r = switched_slice("clean", 4, 5);
        collectives_at(&mut r, share);
        let e = run(vec![r]);
        assert!(
            critical_of(&e, "clean").is_empty(),
            "{share}: {:#?}",
            e.findings
        );
    }
    // A quarter below: each collective named on its own.
    for i in 0..crate::profiles::HEALTHY_COLLECTIVE_TO_COPY.len() {
        let mut r = switched_slice("slow", 4, 5);
        collectives_at(&mut r, 1.0);
        r.collectives[i].peak_busbw *= 0.75;
        let want = r.collectives[i].collective;
        let e = run(vec![r]);
        let bad = critical_of(&e, "slow");
        assert_eq!(bad.len(), 1, "{want:?}: {bad:#?}");
        assert_eq!(bad[0].collective, Some(want));
        assert!(bad[0].message.contains("its GPUs copy to each other"));
    }
}

#[test]
fn without_the_health_snapshot_collectives_are_judged_against_the_pairs_of_an_nvlink_product() {
    // `--no-health`: no topology. An H100 node of 4 GPUs whose pairs copy alike at 394 GB/s
    // and whose all_reduce reads 98 is failed, not passed for want of a floor.
    let mut r = switched_slice("no-health", 4, 5);
    r.product = H100.into();
    r.health.clear();
    all_reduce(&mut r).peak_busbw = 98.0;
    let e = run(vec![r.clone()]);
    let bad = critical_of(&e, "no-health");
    assert_eq!(bad.len(), 1, "{:#?}", e.findings);
    assert_eq!(bad[0].collective, Some(Collective::AllReduce));
    // Healthy, it passes with no finding about its collectives.
    collectives_at(&mut r, 1.0);
    let e = run(vec![r.clone()]);
    assert!(
        e.findings.iter().all(|f| f.metric != Metric::NcclBusBw),
        "{:#?}",
        e.findings
    );
    // A product it does not know, without health: not judged alone, and an Info says so.
    r.product = "NVIDIA Mystery GPU".into();
    all_reduce(&mut r).peak_busbw = 98.0;
    let e = run(vec![r]);
    assert!(critical_of(&e, "no-health").is_empty(), "{:#?}", e.findings);
    let info: Vec<_> = e
        .findings
        .iter()
        .filter(|f| f.metric == Metric::NcclBusBw)
        .collect();
    assert_eq!(info.len(), 1, "{info:#?}");
    assert_eq!(info[0].severity, Severity::Info);
    assert!(info[0].message.contains("not judged on this node alone"));
}

#[test]
fn a_gpu_slow_at_compute_explains_slow_collectives_and_names_the_gpu_not_nccl() {
    let mut r = switched_slice("slow-gpu", 4, 5);
    collectives_at(&mut r, 0.7);
    r.compute = (0..4)
        .map(|g| gpufabric_api::result::CompactGpuCompute {
            bf16_tflops: if g == 2 { 420.0 } else { 700.0 },
            sdc: Some((0, 4, false)),
            ..Default::default()
        })
        .collect();
    r.compute_gemm_size = Some(8192);
    let e = run(vec![r]);
    let bad = critical_of(&e, "slow-gpu");
    assert_eq!(bad.len(), 1, "{bad:#?}");
    assert_eq!(bad[0].subject, Subject::gpu("slow-gpu", 2));
    assert_eq!(bad[0].metric, Metric::GemmThroughput);
    assert!(
        e.findings.iter().all(|f| !f.message.contains("NCCL_")),
        "{:#?}",
        e.findings
    );
}
