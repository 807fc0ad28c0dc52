//! Hardware faults, wrong results, transports, GPU counts and the PCIe and NVLink state that explains slow copies.

use super::*;

#[test]
fn hardware_faults_are_findings_of_their_own_kinds() {
    let mut r = healthy("n", 1, 0.0);
    r.health[0].nvlinks = (16, 18);
    r.health[1].nvlink_errors = 12;
    r.health[2].xids = vec![79];
    r.health[3].ecc_uncorrected = 2;
    r.health[4].row_remap = 1;
    r.health[5].row_remap = 2;
    r.health[6].pcie = (5, 5, 8, 16);
    r.health[7].pcie = (3, 5, 16, 16);
    let e = run(vec![r]);
    let got: Vec<(Option<u32>, FindingKind)> = e
        .findings
        .iter()
        .map(|f| (f.subject.gpu_index(), f.kind))
        .collect();
    assert_eq!(
        got,
        vec![
            (Some(0), FindingKind::NvlinkDown),
            (Some(1), FindingKind::NvlinkErrors),
            (Some(2), FindingKind::Xid),
            (Some(3), FindingKind::EccUncorrectable),
            (Some(4), FindingKind::RowRemap),
            (Some(5), FindingKind::RowRemap),
            (Some(6), FindingKind::PcieDegraded),
            (Some(7), FindingKind::PcieDegraded),
        ]
    );
    let severities: Vec<Severity> = e.findings.iter().map(|f| f.severity).collect();
    // NVLink error counters are cumulative since the driver loaded, and a GPU at Gen3 whose
    // host copies run at full speed only lowered its link while idle: both Info.
    use Severity::{Critical, Info};
    assert_eq!(
        severities,
        vec![
            Critical, Info, Critical, Critical, Critical, Critical, Critical, Info
        ]
    );
    assert_eq!(e.findings[0].measured, Some(16.0));
    assert_eq!(e.findings[0].expected, Some(18.0));
    assert!(e.findings[4].message.contains("pending"));
    assert!(e.findings[5].message.contains("replace"));
    assert_eq!(e.findings[6].unit.as_deref(), Some("lanes"));
    assert_eq!(e.findings[7].unit.as_deref(), Some("generation"));
    assert_eq!(e.verdicts["n"], NodeVerdict::Failed);
}

#[test]
fn a_gpu_alone_on_its_node_is_not_judged_by_its_nvlinks() {
    // A one-GPU slice of an HGX board (as on a one-GPU cloud VM): NVML reports 0 of 18 links
    // up, because the slice has no peer, not because a link failed.
    let mut r = node_of("vm", H100, 1, 1, 0.0);
    r.health[0].nvlinks = (0, 18);
    let e = run(vec![r.clone()]);
    assert!(
        on(&e, "vm")
            .iter()
            .all(|f| f.kind != FindingKind::NvlinkDown),
        "{:#?}",
        e.findings
    );
    // The same links down with two GPUs on the node are a fault.
    let mut two = node_of("pair", H100, 2, 1, 0.0);
    two.health[0].nvlinks = (0, 18);
    let e = run(vec![two]);
    assert!(
        on(&e, "pair")
            .iter()
            .any(|f| f.kind == FindingKind::NvlinkDown)
    );
}

#[test]
fn a_slot_below_the_products_pcie_generation_is_info() {
    let mut r = healthy("n", 1, 0.0);
    r.health[0].pcie = (4, 4, 16, 16);
    let e = run(vec![r]);
    assert_eq!(e.findings.len(), 1);
    assert_eq!(e.findings[0].severity, Severity::Info);
    assert_eq!(e.findings[0].source, Some(ExpectationSource::Profile));
    assert_eq!(e.verdicts["n"], NodeVerdict::Passed);
}

#[test]
fn throttle_reasons_are_info_and_never_fail_a_node() {
    let mut r = healthy("n", 1, 0.0);
    r.health[2].throttle = vec!["sw_power_cap".into()];
    r.health[2].temperature_c = 81.0;
    let e = run(vec![r.clone()]);
    assert_eq!(e.findings.len(), 1);
    assert_eq!(e.findings[0].severity, Severity::Info);
    assert_eq!(e.findings[0].kind, FindingKind::Thermal);
    assert_eq!(e.verdicts["n"], NodeVerdict::Passed);
    // Above an explicit ceiling it is critical.
    let t = Thresholds {
        max_temperature_c: Some(80.0),
        ..Thresholds::default()
    };
    let e = evaluate(&[NodeInput::measured(r)], &t);
    assert!(e.findings.iter().any(|f| f.kind == FindingKind::Thermal
        && f.severity == Severity::Critical
        && f.source == Some(ExpectationSource::Threshold)));
    assert_eq!(e.verdicts["n"], NodeVerdict::Failed);
}

#[test]
fn wrong_results_are_their_own_kind() {
    let mut r = healthy("n", 1, 0.0);
    r.collectives[1].wrong = 4096;
    r.corrupt_copies = 3;
    let e = run(vec![r]);
    assert_eq!(e.findings.len(), 2, "{:#?}", e.findings);
    assert!(
        e.findings
            .iter()
            .all(|f| f.kind == FindingKind::WrongResults)
    );
    assert!(
        e.findings
            .iter()
            .any(|f| f.collective == Some(Collective::AllGather)
                && f.metric == Metric::NcclWrong
                && f.measured == Some(4096.0))
    );
    assert!(
        e.findings
            .iter()
            .any(|f| f.metric == Metric::PairBandwidth && f.measured == Some(3.0))
    );
}

#[test]
fn transport_fallback_is_a_finding_where_nvlink_is_expected() {
    let mut r = healthy("n", 1, 0.0);
    r.transport_fallbacks = vec![(2, 6, Transport::Shm)];
    let e = run(vec![r.clone()]);
    assert_eq!(e.findings.len(), 1);
    assert_eq!(e.findings[0].kind, FindingKind::TransportFallback);
    assert_eq!(e.findings[0].subject, Subject::gpu_pair("n", 2, 6));
    assert!(e.findings[0].message.contains("host shared memory"));

    // On GPUs without NVLink, PCIe between them is normal.
    let mut p = node_of("pcie", "NVIDIA L40S", 4, 1, 0.0);
    for h in &mut p.health {
        h.nvlinks = (0, 0);
    }
    p.transport_fallbacks = vec![(0, 1, Transport::Pcie), (2, 3, Transport::Shm)];
    assert!(run(vec![p]).findings.is_empty());
}

#[test]
fn a_gpu_whose_every_pair_falls_back_is_blamed_once() {
    let mut r = healthy("n", 1, 0.0);
    r.health[5].nvlinks = (0, 18);
    r.transport_fallbacks = (0..8u32)
        .filter(|g| *g != 5)
        .map(|g| (g.min(5), g.max(5), Transport::Pcie))
        .collect();
    let e = run(vec![r]);
    let tf: Vec<&Finding> = e
        .findings
        .iter()
        .filter(|f| f.kind == FindingKind::TransportFallback)
        .collect();
    assert_eq!(tf.len(), 1, "{tf:#?}");
    assert_eq!(tf[0].subject, Subject::gpu("n", 5));
    assert!(
        e.findings
            .iter()
            .any(|f| f.kind == FindingKind::NvlinkDown && f.subject.gpu_index() == Some(5))
    );
}

#[test]
fn fewer_gpus_than_the_node_advertises_is_a_gpu_mismatch() {
    let r = node_of("n", H100, 7, 1, 0.0);
    let nodes = vec![NodeInput {
        baseline: None,
        history: Vec::new(),
        nccl_tuning: Vec::new(),
        node: "n".into(),
        product_label: Some("NVIDIA-H100-80GB-HBM3".into()),
        expected_gpus: Some(8),
        outcome: NodeOutcome::Measured(Box::new(r)),
    }];
    let e = evaluate(&nodes, &Thresholds::default());
    assert_eq!(e.findings.len(), 1, "{:#?}", e.findings);
    let f = &e.findings[0];
    assert_eq!(f.kind, FindingKind::GpuMismatch);
    assert_eq!((f.measured, f.expected), (Some(7.0), Some(8.0)));
    assert_eq!(f.severity, Severity::Critical);
    assert_eq!(e.verdicts["n"], NodeVerdict::Failed);
}

#[test]
fn an_odd_gpu_count_for_the_product_is_info_without_a_count_label() {
    let r = node_of("n", H100, 7, 1, 0.0);
    let e = run(vec![r]);
    assert_eq!(e.findings.len(), 1, "{:#?}", e.findings);
    assert_eq!(e.findings[0].kind, FindingKind::GpuMismatch);
    assert_eq!(e.findings[0].severity, Severity::Info);
}

#[test]
fn a_stale_product_label_is_info_and_label_spelling_is_not_a_mismatch() {
    let mk = |label: &str| {
        vec![NodeInput {
            baseline: None,
            history: Vec::new(),
            nccl_tuning: Vec::new(),
            node: "n".into(),
            product_label: Some(label.into()),
            expected_gpus: Some(8),
            outcome: NodeOutcome::Measured(Box::new(healthy("n", 1, 0.0))),
        }]
    };
    let e = evaluate(&mk("NVIDIA-H100-80GB-HBM3"), &Thresholds::default());
    assert!(e.findings.is_empty(), "{:#?}", e.findings);
    let e = evaluate(&mk("NVIDIA-A100-SXM4-80GB"), &Thresholds::default());
    assert_eq!(e.findings.len(), 1);
    assert_eq!(e.findings[0].kind, FindingKind::GpuMismatch);
    assert_eq!(e.findings[0].severity, Severity::Info);
}

#[test]
fn pcie_generation_below_max_is_critical_when_host_copies_confirm_it_and_never_slow() {
    let mut fleet = fleet_of(6, 0.01);
    fleet[2].health[7].pcie = (3, 5, 16, 16);
    fleet[2].host_to_device[7] = 14.0;
    fleet[2].device_to_host[7] = 13.0;
    let e = run(fleet);
    let f = on(&e, "node-02");
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].kind, FindingKind::PcieDegraded);
    assert_eq!(f[0].severity, Severity::Critical);
    assert!(
        f[0].message.contains("14 GB/s") || f[0].message.contains("14.0 GB/s"),
        "{}",
        f[0].message
    );
    assert_eq!(e.verdicts["node-02"], NodeVerdict::Failed);
}

#[test]
fn pcie_width_below_max_explains_slow_host_copies() {
    let mut r = healthy("n", 1, 0.0);
    r.health[1].pcie = (5, 5, 4, 16);
    r.host_to_device[1] = 15.0;
    let e = run(vec![r]);
    assert_eq!(e.findings.len(), 1, "{:#?}", e.findings);
    assert_eq!(e.findings[0].kind, FindingKind::PcieDegraded);
    assert_eq!(e.findings[0].unit.as_deref(), Some("lanes"));
}

#[test]
fn nvlink_links_down_explain_slow_pairs_and_are_never_slow() {
    let mut fleet = fleet_of(8, 0.01);
    fleet[4].health[2].nvlinks = (12, 18);
    for peer in [0, 1, 3, 4, 5, 6, 7] {
        slow_pair(&mut fleet[4], 2, peer, 12.0 / 18.0);
    }
    all_reduce(&mut fleet[4]).peak_busbw *= 0.7;
    let e = run(fleet);
    let f = on(&e, "node-04");
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].kind, FindingKind::NvlinkDown);
    assert_eq!(f[0].subject, Subject::gpu("node-04", 2));
}

#[test]
fn a_pair_that_fell_back_from_nvlink_is_not_also_slow() {
    let mut r = healthy("n", 1, 0.01);
    slow_pair(&mut r, 1, 6, 0.1);
    r.transport_fallbacks = vec![(1, 6, Transport::Pcie)];
    let e = run(vec![r]);
    assert_eq!(e.findings.len(), 1, "{:#?}", e.findings);
    assert_eq!(e.findings[0].kind, FindingKind::TransportFallback);
}

#[test]
fn a_result_claiming_an_impossible_gpu_count_is_an_agent_bug_not_evaluated() {
    let mut r = healthy("n", 1, 0.0);
    r.gpus = u32::MAX;
    let mut z = healthy("z", 1, 0.0);
    z.gpus = 0;
    let e = run(vec![r, z]);
    assert_eq!(e.verdicts["n"], NodeVerdict::NotMeasured);
    assert_eq!(e.verdicts["z"], NodeVerdict::NotMeasured);
    assert!(
        e.findings
            .iter()
            .all(|f| f.kind == FindingKind::Errored && f.severity == Severity::Info)
    );
}

#[test]
fn a_pair_matrix_of_the_wrong_size_is_ignored() {
    let mut r = healthy("n", 1, 0.0);
    r.copy_uni.truncate(10);
    r.copy_bidir.truncate(3);
    let e = run(vec![r]);
    assert!(e.findings.is_empty(), "{:#?}", e.findings);
}

fn with_errors(counts: &[u64]) -> CompactResult {
    let mut r = healthy("n1", 1, 0.0);
    for (h, c) in r.health.iter_mut().zip(counts) {
        h.nvlink_errors = *c;
    }
    r
}

fn baseline(counts: &[u64]) -> CounterBaseline {
    CounterBaseline {
        run: "nightly-1".into(),
        at: "2026-11-22T02:00:00Z".into(),
        nvlink: counts.to_vec(),
    }
}

fn growth_findings(now: &[u64], before: Option<&[u64]>, t: &Thresholds) -> Vec<Finding> {
    let input = NodeInput {
        baseline: before.map(baseline),
        history: Vec::new(),
        nccl_tuning: Vec::new(),
        ..NodeInput::measured(with_errors(now))
    };
    evaluate(&[input], t)
        .findings
        .into_iter()
        .filter(|f| f.kind == FindingKind::NvlinkErrorsGrowing)
        .collect()
}

#[test]
fn nvlink_errors_that_grow_past_the_threshold_fail_the_gpu_and_name_the_growth() {
    let t = Thresholds {
        nvlink_error_growth: Some(1000),
        ..Thresholds::default()
    };
    let before = [7062, 6358, 7000, 7000, 7000, 7000, 7000, 7000];
    // A healthy day: every GPU adds a few hundred; GPU 5 adds 25,000.
    let now = [7410, 7045, 7300, 7200, 7900, 32_000, 7000, 7999];
    let f = growth_findings(&now, Some(&before), &t);
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].subject, Subject::gpu("n1", 5));
    assert_eq!(f[0].severity, Severity::Critical);
    assert!(
        f[0].message.contains(
            "grew by 25000 (from 7000 to 32000) since run nightly-1 at 2026-11-22T02:00:00Z, over"
        ),
        "{}",
        f[0].message
    );
    let verdict = evaluate(
        &[NodeInput {
            baseline: Some(baseline(&before)),
            history: Vec::new(),
            nccl_tuning: Vec::new(),
            ..NodeInput::measured(with_errors(&now))
        }],
        &t,
    )
    .verdicts["n1"];
    assert_eq!(verdict, NodeVerdict::Failed);
    // Exactly at the threshold is not over it.
    let at_limit = [8062, 6358, 7000, 7000, 7000, 7000, 7000, 7000];
    assert!(growth_findings(&at_limit, Some(&before), &t).is_empty());
}

#[test]
fn nvlink_error_growth_without_a_threshold_is_info_and_passes_the_node() {
    let before = [0; 8];
    let now = [0, 0, 0, 20_000, 0, 0, 0, 0];
    let f = growth_findings(&now, Some(&before), &Thresholds::default());
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].severity, Severity::Info);
    assert!(f[0].message.contains("thresholds.nvlinkErrorGrowth"));
    let input = NodeInput {
        baseline: Some(baseline(&before)),
        history: Vec::new(),
        nccl_tuning: Vec::new(),
        ..NodeInput::measured(with_errors(&now))
    };
    assert_eq!(
        evaluate(&[input], &Thresholds::default()).verdicts["n1"],
        NodeVerdict::Passed
    );
}

#[test]
fn nvlink_counters_are_not_judged_without_a_comparable_previous_run() {
    let t = Thresholds {
        nvlink_error_growth: Some(10),
        ..Thresholds::default()
    };
    let now = [50_000; 8];
    // No previous run: counts since the driver loaded say nothing about growth.
    assert!(growth_findings(&now, None, &t).is_empty());
    // The counters went down: the driver reloaded; not judged this time.
    assert!(growth_findings(&[5; 8], Some(&[60_000; 8]), &t).is_empty());
    // Another GPU count: indices may have moved.
    assert!(growth_findings(&now, Some(&[0; 4]), &t).is_empty());
}

#[test]
fn the_record_kept_after_a_run_stays_put_while_a_gpu_grows_too_fast() {
    use crate::evaluate::counters::next_baseline;
    let t = Thresholds {
        nvlink_error_growth: Some(1000),
        ..Thresholds::default()
    };
    let before = baseline(&[100; 8]);
    let judge = |now: &[u64]| {
        let r = with_errors(now);
        let input = NodeInput {
            baseline: Some(before.clone()),
            history: Vec::new(),
            nccl_tuning: Vec::new(),
            ..NodeInput::measured(r.clone())
        };
        let e = evaluate(&[input], &t);
        next_baseline("n1", &r, Some(&before), &e.findings, "nightly-2", "t2")
    };
    // Healthy growth: this run's counts become the record.
    let kept = judge(&[150; 8]).expect("a new record");
    assert_eq!((kept.run.as_str(), kept.nvlink[0]), ("nightly-2", 150));
    // Too fast on GPU 2: the old record stays for the confirmation run.
    assert_eq!(judge(&[150, 150, 9000, 150, 150, 150, 150, 150]), None);
    // Unchanged counts: nothing to write.
    assert_eq!(judge(&[100; 8]), None);
}
