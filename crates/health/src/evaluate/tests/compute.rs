//! The compute checks: silent data corruption, a GPU slow at GEMMs or memory against its
//! node, and GPUs below the product's floors.

use super::*;
use gpufabric_api::result::CompactGpuCompute;

/// `r` with every GPU computing as a healthy H100 does (+-`noise`), SDC clean.
fn computing(mut r: CompactResult, noise: f64) -> CompactResult {
    let mut n = Noise(r.node.len() as u64 + 5, noise);
    r.compute = (0..r.gpus)
        .map(|_| CompactGpuCompute {
            bf16_tflops: n.scale(700.0),
            tf32_tflops: n.scale(380.0),
            memory_copy_gbps: n.scale(2_700.0),
            sdc: Some((0, 4, false)),
            load: Some((1_755, 1_980, 699, 700, 61)),
            throttle: vec!["swPowerCap".into()],
        })
        .collect();
    r.compute_gemm_size = Some(8192);
    r
}

fn compute_findings(e: &Evaluation) -> Vec<(Subject, FindingKind, Metric)> {
    e.findings
        .iter()
        .filter(|f| {
            matches!(
                f.metric,
                Metric::GemmThroughput | Metric::MemoryBandwidth | Metric::ComputeChecksum
            )
        })
        .map(|f| (f.subject.clone(), f.kind, f.metric))
        .collect()
}

#[test]
fn clean_nodes_with_everyday_noise_have_no_compute_finding_alone_or_in_a_fleet() {
    for seed in 0..20 {
        let e = run(vec![computing(healthy("n", seed, 0.01), 0.02)]);
        assert!(compute_findings(&e).is_empty(), "{:#?}", e.findings);
    }
    let fleet: Vec<CompactResult> = fleet_of(12, 0.01)
        .into_iter()
        .map(|r| computing(r, 0.02))
        .collect();
    let e = run(fleet);
    assert!(compute_findings(&e).is_empty(), "{:#?}", e.findings);
}

#[test]
fn a_gpu_whose_output_differs_is_critical_and_named_whatever_its_speed() {
    let mut r = computing(healthy("n", 1, 0.0), 0.0);
    r.compute[5].sdc = Some((1, 4, false));
    r.compute[2].sdc = Some((4, 4, true));
    let e = run(vec![r]);
    let got = compute_findings(&e);
    assert_eq!(
        got,
        vec![
            (
                Subject::gpu("n", 2),
                FindingKind::WrongResults,
                Metric::ComputeChecksum
            ),
            (
                Subject::gpu("n", 5),
                FindingKind::WrongResults,
                Metric::ComputeChecksum
            ),
        ]
    );
    assert_eq!(e.verdicts.get("n"), Some(&NodeVerdict::Failed));
    let f = e
        .findings
        .iter()
        .find(|f| f.subject == Subject::gpu("n", 2))
        .expect("GPU 2");
    assert_eq!(f.severity, Severity::Critical);
    assert!(
        f.message.contains("4 of 4 outputs") && f.message.contains("differs bit for bit"),
        "{}",
        f.message
    );
    check_evidence(f);
}

#[test]
fn a_gpu_slow_at_gemms_is_a_straggler_with_its_clocks_and_throttle_reasons() {
    let mut r = computing(healthy("n", 1, 0.0), 0.01);
    r.compute[3].bf16_tflops = 450.0;
    r.compute[3].load = Some((1_140, 1_980, 480, 700, 84));
    r.compute[3].throttle = vec!["hwSlowdown".into(), "swThermal".into()];
    let e = run(vec![r]);
    assert_eq!(
        compute_findings(&e),
        vec![(
            Subject::gpu("n", 3),
            FindingKind::Straggler,
            Metric::GemmThroughput
        )]
    );
    let f = &e.findings[0];
    assert!(
        f.message.contains("SM clock 1140 of 1980 MHz")
            && f.message.contains("throttled by hwSlowdown, swThermal")
            && f.message.contains("the node's median GPU"),
        "{}",
        f.message
    );
    assert_eq!(f.source, Some(ExpectationSource::Node));
    check_evidence(f);
}

#[test]
fn a_gpu_below_the_floor_names_the_floor_and_every_gpu_below_it_is_the_nodes() {
    // One GPU three times slow: below the floor (494.5) and the median (700): the median,
    // the higher expectation, is named.
    let mut r = computing(healthy("n", 1, 0.0), 0.0);
    r.compute[6].bf16_tflops = 230.0;
    let e = run(vec![r]);
    let f = e
        .findings
        .iter()
        .find(|f| f.metric == Metric::GemmThroughput)
        .expect("GPU 6 found");
    assert_eq!(f.subject, Subject::gpu("n", 6));
    assert!(f.message.contains("the node's median GPU"), "{}", f.message);

    // Every GPU at 60% of a healthy one: no GPU stands out, the floor catches the node.
    let mut r = computing(healthy("n", 2, 0.0), 0.01);
    for c in &mut r.compute {
        c.bf16_tflops *= 0.6;
        c.memory_copy_gbps *= 0.55;
    }
    let e = run(vec![r]);
    assert_eq!(
        compute_findings(&e),
        vec![
            (
                Subject::node("n"),
                FindingKind::Slow,
                Metric::GemmThroughput
            ),
            (
                Subject::node("n"),
                FindingKind::Slow,
                Metric::MemoryBandwidth
            ),
        ]
    );
    assert!(e.findings.iter().all(|f| f.severity == Severity::Critical));
    assert!(e.findings[0].message.contains("slow alike"));

    // Small GEMMs do not reach the plateau: no floor, the node's median still applies.
    let mut r = computing(healthy("n", 3, 0.0), 0.0);
    r.compute_gemm_size = Some(1024);
    for c in &mut r.compute {
        c.bf16_tflops = 300.0;
    }
    assert!(compute_findings(&run(vec![r])).is_empty());
}

#[test]
fn a_gpu_with_slow_memory_is_named_and_the_others_are_not() {
    let mut r = computing(healthy("n", 1, 0.0), 0.01);
    r.compute[1].memory_copy_gbps = 1_900.0;
    let e = run(vec![r]);
    assert_eq!(
        compute_findings(&e),
        vec![(
            Subject::gpu("n", 1),
            FindingKind::Straggler,
            Metric::MemoryBandwidth
        )]
    );
}
