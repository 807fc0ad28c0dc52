//! Unit tests of the evaluation rules, on synthetic nodes shaped like the agent's compact result.

use super::*;
use gpufabric_api::outcome::NotMeasuredReason;
use gpufabric_api::result::{
    COMPACT_VERSION, CompactCollective, CompactDdpPoint, CompactGpuHealth, PhaseError,
};

const H100: &str = "NVIDIA H100 80GB HBM3";

/// Deterministic noise in [-amp, +amp].
struct Noise(u64, f64);

impl Noise {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let unit = (self.0 >> 11) as f64 / (1u64 << 53) as f64; // [0, 1)
        (unit * 2.0 - 1.0) * self.1
    }
    fn scale(&mut self, x: f64) -> f64 {
        x * (1.0 + self.next())
    }
}

/// A healthy 8-GPU H100 node as the agent reports it, with +-`noise` relative jitter.
fn healthy(name: &str, seed: u64, noise: f64) -> CompactResult {
    node_of(name, H100, 8, seed, noise)
}

fn node_of(name: &str, product: &str, g: u32, seed: u64, noise: f64) -> CompactResult {
    let mut n = Noise(seed.wrapping_add(17), noise);
    let gu = g as usize;
    let mut pu = vec![0.0; gu * gu];
    for a in 0..gu {
        for b in 0..gu {
            if a != b {
                pu[a * gu + b] = n.scale(390.0);
            }
        }
    }
    let pb = (0..gu * gu.saturating_sub(1) / 2)
        .map(|_| n.scale(760.0))
        .collect();
    let nc = [
        (Collective::AllReduce, 460.0, 22.0),
        (Collective::AllGather, 360.0, 15.0),
        (Collective::ReduceScatter, 360.0, 15.0),
    ]
    .iter()
    .map(|(c, pk, lt)| CompactCollective {
        c: *c,
        pk: n.scale(*pk),
        bb: n.scale(*pk * 0.98),
        lt: n.scale(*lt),
        ab: None,
        w: 0,
    })
    .collect();
    let dp = [1u32, 2, 4, 8]
        .iter()
        .filter(|x| **x <= g)
        .map(|x| CompactDdpPoint {
            g: *x,
            st: n.scale(12.0),
            e: if *x == 1 { 1.0 } else { n.scale(0.93) },
            cf: 0.08,
            ov: 0.9,
            tf: 400.0,
        })
        .collect();
    let dc = (0..gu).map(|_| n.scale(10.0)).collect();
    let h = (0..gu)
        .map(|_| CompactGpuHealth {
            l: (18, 18),
            le: 0,
            pc: (5, 5, 16, 16),
            x: Vec::new(),
            ec: 0,
            rr: 0,
            t: 45.0,
            th: Vec::new(),
            ..Default::default()
        })
        .collect();
    CompactResult {
        v: COMPACT_VERSION,
        n: name.to_string(),
        b: gpufabric_api::result::Backend::Sim,
        p: product.to_string(),
        g,
        d: 120.0,
        nc,
        pu,
        pb,
        hd: (0..gu).map(|_| n.scale(55.0)).collect(),
        dh: (0..gu).map(|_| n.scale(52.0)).collect(),
        pc: 0,
        dp,
        dc,
        h,
        tf: Vec::new(),
        e: Vec::new(),
    }
}

fn slow_pair(r: &mut CompactResult, a: u32, b: u32, factor: f64) {
    let g = r.g as usize;
    let (a, b) = (a as usize, b as usize);
    r.pu[a * g + b] *= factor;
    r.pu[b * g + a] *= factor;
    let i = upper(r.g, a as u32, b as u32);
    r.pb[i] *= factor;
}

fn upper(g: u32, a: u32, b: u32) -> usize {
    gpufabric_api::result::upper_index(g, a.min(b), a.max(b))
}

fn all_reduce(r: &mut CompactResult) -> &mut CompactCollective {
    r.nc.iter_mut()
        .find(|c| c.c == Collective::AllReduce)
        .expect("every synthetic node has all_reduce")
}

fn fleet_of(n: usize, noise: f64) -> Vec<CompactResult> {
    (0..n)
        .map(|i| healthy(&format!("node-{i:02}"), i as u64, noise))
        .collect()
}

fn inputs(results: Vec<CompactResult>) -> Vec<NodeInput> {
    results.into_iter().map(NodeInput::measured).collect()
}

fn run(results: Vec<CompactResult>) -> Evaluation {
    evaluate(&inputs(results), &Thresholds::default())
}

fn on<'a>(e: &'a Evaluation, node: &'a str) -> Vec<&'a Finding> {
    e.findings_of(node).collect()
}

fn check_evidence(f: &Finding) {
    assert!(!f.message.is_empty());
    if let (Some(m), Some(x)) = (f.measured, f.expected)
        && x != 0.0
    {
        let d = f
            .deviation
            .expect("deviation when measured and expected are known");
        assert!((d - (m - x) / x).abs() < 1e-9, "{f:?}");
    }
}

// ---------------------------------------------------------------------------------------

#[test]
fn sixteen_node_fleet_names_the_slow_pair_and_the_straggler_and_nothing_else() {
    let mut fleet = fleet_of(16, 0.03);
    // node-03: the 3<->5 link runs at half speed; NCCL suffers a little from it.
    slow_pair(&mut fleet[3], 3, 5, 0.51);
    let ar = all_reduce(&mut fleet[3]);
    ar.pk *= 0.8;
    ar.bb *= 0.8;
    // node-11: GPU 6 computes 30% slower; the DDP step waits for it.
    fleet[11].dc[6] *= 1.3;
    if let Some(p) = fleet[11].dp.last_mut() {
        p.e *= 0.77;
    }
    let e = run(fleet);

    let f3 = on(&e, "node-03");
    assert_eq!(f3.len(), 1, "{f3:#?}");
    assert_eq!(f3[0].kind, FindingKind::Slow);
    assert_eq!(f3[0].subject, Subject::gpu_pair("node-03", 3, 5));
    assert_eq!(f3[0].metric, Metric::PairBandwidth);
    assert_eq!(f3[0].source, Some(ExpectationSource::Node));
    assert!(
        f3[0].message.contains("GPU 3 <-> GPU 5")
            && f3[0]
                .message
                .contains("below the node's other pairs (median"),
        "{}",
        f3[0].message
    );
    assert!(f3[0].deviation.expect("deviation") < -0.4);

    let f11 = on(&e, "node-11");
    assert_eq!(f11.len(), 1, "{f11:#?}");
    assert_eq!(f11[0].kind, FindingKind::Straggler);
    assert_eq!(f11[0].subject, Subject::gpu("node-11", 6));
    assert_eq!(f11[0].metric, Metric::DdpComputeTime);

    assert_eq!(e.findings.len(), 2, "{:#?}", e.findings);
    for (node, v) in &e.verdicts {
        let want = if node == "node-03" || node == "node-11" {
            NodeVerdict::Failed
        } else {
            NodeVerdict::Passed
        };
        assert_eq!(*v, want, "{node}");
    }
    assert_eq!(e.verdicts.len(), 16);
}

#[test]
fn three_comparable_nodes_never_get_fleet_outlier_findings() {
    let mut fleet = fleet_of(3, 0.01);
    // 30% slower all_reduce: above the H100 profile floor, so only the fleet could flag it.
    all_reduce(&mut fleet[2]).pk *= 0.7;
    let e = run(fleet);
    assert!(e.findings.is_empty(), "{:#?}", e.findings);

    // The same node in a fleet of 4 is an outlier.
    let mut fleet = fleet_of(4, 0.01);
    all_reduce(&mut fleet[2]).pk *= 0.7;
    let e = run(fleet);
    let f = on(&e, "node-02");
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].source, Some(ExpectationSource::Fleet));
    assert_eq!(f[0].collective, Some(Collective::AllReduce));
    assert_eq!(f[0].metric, Metric::NcclBusBw);
    assert_eq!(f[0].subject, Subject::node("node-02"));
    assert!(
        f[0].message.contains("below the median of 4 comparable"),
        "{}",
        f[0].message
    );
}

#[test]
fn fleet_min_nodes_from_the_spec_is_respected() {
    let mut fleet = fleet_of(5, 0.01);
    all_reduce(&mut fleet[0]).pk *= 0.7;
    let t = Thresholds {
        fleet_min_nodes: 6,
        ..Thresholds::default()
    };
    assert!(evaluate(&inputs(fleet), &t).findings.is_empty());
}

#[test]
fn crash_is_never_slow() {
    let mut nodes = inputs(fleet_of(8, 0.02));
    nodes.push(NodeInput {
        node: "node-crash".into(),
        product_label: Some("NVIDIA-H100-80GB-HBM3".into()),
        expected_gpus: Some(8),
        outcome: NodeOutcome::hardware(
            HardwareFault::Crash,
            "aborted (SIGABRT) (exit code 134): SIGABRT in ncclCommInitRank",
        ),
    });
    let e = evaluate(&nodes, &Thresholds::default());
    let f = on(&e, "node-crash");
    assert_eq!(f.len(), 1);
    assert_eq!(f[0].kind, FindingKind::Crash);
    assert_eq!(f[0].metric, Metric::AgentExit);
    assert_eq!(f[0].severity, Severity::Critical);
    assert!(f[0].message.contains("exit code 134"));
    assert!(e.findings.iter().all(|f| f.kind != FindingKind::Slow));
    assert_eq!(e.verdicts["node-crash"], NodeVerdict::Errored);
}

#[test]
fn hangs_have_their_own_kind_and_unmeasured_nodes_get_no_finding() {
    let nodes = vec![
        NodeInput {
            node: "a".into(),
            product_label: None,
            expected_gpus: None,
            outcome: NodeOutcome::hardware(
                HardwareFault::Hang,
                "the agent had started and ran past the pod deadline (900s)",
            ),
        },
        NodeInput {
            node: "b".into(),
            product_label: None,
            expected_gpus: None,
            outcome: NodeOutcome::not_measured(
                NotMeasuredReason::AgentBug,
                "the result document is not valid JSON",
            ),
        },
        NodeInput {
            node: "c".into(),
            product_label: None,
            expected_gpus: None,
            outcome: NodeOutcome::not_measured(
                NotMeasuredReason::NotAdmitted,
                "the kubelet refused the pod: OutOfnvidia.com/gpu",
            ),
        },
        NodeInput {
            node: "d".into(),
            product_label: None,
            expected_gpus: None,
            outcome: NodeOutcome::hardware(HardwareFault::GpuMissing, "found 7 GPUs, 8 expected"),
        },
    ];
    let e = evaluate(&nodes, &Thresholds::default());
    assert_eq!(e.verdicts["a"], NodeVerdict::Timeout);
    assert_eq!(e.verdicts["b"], NodeVerdict::NotMeasured);
    assert_eq!(e.verdicts["c"], NodeVerdict::NotMeasured);
    assert_eq!(e.verdicts["d"], NodeVerdict::Errored);
    assert_eq!(on(&e, "a")[0].kind, FindingKind::Timeout);
    assert!(on(&e, "b").is_empty() && on(&e, "c").is_empty());
    assert_eq!(on(&e, "d")[0].kind, FindingKind::Crash);
    assert!(on(&e, "d")[0].message.contains("fewer GPUs"));
    assert!(e.findings.iter().all(|f| f.severity == Severity::Critical));
}

#[test]
fn phase_errors_are_timeout_or_errored_findings_never_slow() {
    let mut r = healthy("n", 1, 0.0);
    r.e = vec![
        PhaseError {
            phase: Phase::NcclSweep,
            kind: ErrorKind::Timeout,
            message: "all_reduce 1 GiB did not finish in 60 s".into(),
        },
        PhaseError {
            phase: Phase::DdpProbe,
            kind: ErrorKind::Failed,
            message: "cublasLtMatmul: CUBLAS_STATUS_EXECUTION_FAILED".into(),
        },
    ];
    let e = run(vec![r]);
    let kinds: Vec<FindingKind> = e.findings.iter().map(|f| f.kind).collect();
    assert!(kinds.contains(&FindingKind::Timeout), "{kinds:?}");
    assert!(kinds.contains(&FindingKind::Errored), "{kinds:?}");
    assert!(!kinds.contains(&FindingKind::Slow));
    assert_eq!(e.verdicts["n"], NodeVerdict::Failed);
}

#[test]
fn a_phase_that_cannot_run_here_is_info_and_does_not_fail_the_node() {
    let mut r = healthy("n", 1, 0.0);
    r.e = vec![PhaseError {
        phase: Phase::NodePair,
        kind: ErrorKind::Unavailable,
        message: "no peer node".into(),
    }];
    let e = run(vec![r]);
    assert_eq!(e.findings.len(), 1);
    assert_eq!(e.findings[0].kind, FindingKind::Errored);
    assert_eq!(e.findings[0].severity, Severity::Info);
    assert_eq!(e.verdicts["n"], NodeVerdict::Passed);
}

#[test]
fn fleet_outliers_are_flagged_only_in_the_worse_direction() {
    let mut fleet = fleet_of(8, 0.01);
    all_reduce(&mut fleet[1]).pk *= 1.4;
    all_reduce(&mut fleet[2]).lt *= 0.5;
    all_reduce(&mut fleet[3]).lt *= 2.0;
    let e = run(fleet);
    assert!(on(&e, "node-01").is_empty());
    assert!(on(&e, "node-02").is_empty());
    let f = on(&e, "node-03");
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].metric, Metric::NcclLatency);
    assert!(f[0].deviation.expect("deviation") > 0.9);
}

#[test]
fn tight_fleet_with_zero_spread_does_not_flag_a_small_gap() {
    let mut fleet = fleet_of(8, 0.0);
    all_reduce(&mut fleet[4]).pk *= 0.95;
    assert!(run(fleet.clone()).findings.is_empty());
    all_reduce(&mut fleet[4]).pk *= 0.85 / 0.95;
    let e = run(fleet);
    assert_eq!(on(&e, "node-04").len(), 1);
}

#[test]
fn explicit_threshold_wins_over_profile_and_fleet() {
    let mut fleet = fleet_of(8, 0.01);
    // Below the H100 profile floor (225) and a fleet outlier, but above the spec's floor.
    all_reduce(&mut fleet[5]).pk = 200.0;
    let t = Thresholds {
        nccl_bus_bw_gbps: Some(150.0),
        ..Thresholds::default()
    };
    let e = evaluate(&inputs(fleet.clone()), &t);
    assert!(e.findings.is_empty(), "{:#?}", e.findings);

    // A spec floor above what every node measures fails every node, citing the threshold.
    let t = Thresholds {
        nccl_bus_bw_gbps: Some(500.0),
        ..Thresholds::default()
    };
    let e = evaluate(&inputs(fleet), &t);
    assert_eq!(e.findings.len(), 8);
    assert!(
        e.findings
            .iter()
            .all(|f| f.source == Some(ExpectationSource::Threshold)
                && f.expected == Some(500.0)
                && f.kind == FindingKind::Slow)
    );
}

#[test]
fn profile_floor_judges_a_single_node_without_a_fleet() {
    // Below the floor, but not so far below the pairs' copy bandwidth (390 GB/s) that
    // NCCL alone is to blame.
    let mut r = healthy("lonely", 3, 0.0);
    all_reduce(&mut r).pk = 200.0;
    let e = run(vec![r]);
    assert_eq!(e.findings.len(), 1, "{:#?}", e.findings);
    let f = &e.findings[0];
    assert_eq!(f.source, Some(ExpectationSource::Profile));
    assert_eq!(f.expected, Some(225.0));
    assert_eq!(f.collective, Some(Collective::AllReduce));
    assert!(f.message.contains("200 GB/s, 11% below"), "{}", f.message);
    check_evidence(f);
}

#[test]
fn a_profile_finding_is_not_repeated_by_the_fleet() {
    let mut fleet = fleet_of(8, 0.01);
    all_reduce(&mut fleet[0]).pk = 200.0;
    let e = run(fleet);
    let f = on(&e, "node-00");
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].source, Some(ExpectationSource::Profile));
}

#[test]
fn a_gpu_slow_to_every_peer_is_blamed_instead_of_its_pairs() {
    let mut r = healthy("n", 9, 0.02);
    for peer in [0, 1, 3, 4, 5, 6, 7] {
        slow_pair(&mut r, 2, peer, 0.6);
    }
    let e = run(vec![r]);
    assert_eq!(e.findings.len(), 1, "{:#?}", e.findings);
    let f = &e.findings[0];
    assert_eq!(f.subject, Subject::gpu("n", 2));
    assert_eq!(f.metric, Metric::PairBandwidth);
    assert_eq!(f.kind, FindingKind::Slow);
    assert!(f.message.contains("GPU 2"), "{}", f.message);
}

#[test]
fn every_pair_below_the_profile_floor_blames_the_node() {
    let mut r = healthy("n", 9, 0.02);
    for v in r.pu.iter_mut() {
        *v *= 0.4;
    }
    let e = run(vec![r]);
    let pairs: Vec<&Finding> = e
        .findings
        .iter()
        .filter(|f| f.metric == Metric::PairBandwidth)
        .collect();
    assert_eq!(pairs.len(), 1, "{pairs:#?}");
    assert_eq!(pairs[0].subject, Subject::node("n"));
    assert_eq!(pairs[0].source, Some(ExpectationSource::Profile));
}

#[test]
fn two_slow_pairs_of_one_gpu_are_named_as_pairs_not_the_gpu() {
    let mut r = healthy("n", 4, 0.02);
    slow_pair(&mut r, 1, 4, 0.5);
    slow_pair(&mut r, 1, 6, 0.5);
    let e = run(vec![r]);
    let subjects: Vec<&Subject> = e.findings.iter().map(|f| &f.subject).collect();
    assert_eq!(
        subjects,
        vec![&Subject::gpu_pair("n", 1, 4), &Subject::gpu_pair("n", 1, 6)]
    );
}

#[test]
fn a_one_way_slow_direction_counts_for_the_pair() {
    let mut r = healthy("n", 4, 0.02);
    r.pu[7 * 8] *= 0.5; // only 7 -> 0 (row 7, column 0)
    let e = run(vec![r]);
    assert_eq!(e.findings.len(), 1);
    assert_eq!(e.findings[0].subject, Subject::gpu_pair("n", 0, 7));
}

#[test]
fn straggler_needs_more_than_the_ratio_above_the_node_median() {
    let mut r = healthy("n", 5, 0.0);
    r.dc[3] *= 1.08;
    assert!(run(vec![r.clone()]).findings.is_empty());
    r.dc[3] *= 1.2 / 1.08;
    let e = run(vec![r.clone()]);
    assert_eq!(e.findings.len(), 1);
    let f = &e.findings[0];
    assert_eq!((f.kind, f.subject.gpu), (FindingKind::Straggler, Some(3)));
    assert_eq!(f.source, Some(ExpectationSource::Node));
    check_evidence(f);
    // A stricter ratio from the spec.
    r.dc[3] = 10.0 * 1.08;
    let t = Thresholds {
        straggler_ratio: 1.05,
        ..Thresholds::default()
    };
    assert_eq!(evaluate(&[NodeInput::measured(r)], &t).findings.len(), 1);
}

#[test]
fn hardware_faults_are_findings_of_their_own_kinds() {
    let mut r = healthy("n", 1, 0.0);
    r.h[0].l = (16, 18);
    r.h[1].le = 12;
    r.h[2].x = vec![79];
    r.h[3].ec = 2;
    r.h[4].rr = 1;
    r.h[5].rr = 2;
    r.h[6].pc = (5, 5, 8, 16);
    r.h[7].pc = (3, 5, 16, 16);
    let e = run(vec![r]);
    let got: Vec<(Option<u32>, FindingKind)> =
        e.findings.iter().map(|f| (f.subject.gpu, f.kind)).collect();
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
fn a_slot_below_the_products_pcie_generation_is_info() {
    let mut r = healthy("n", 1, 0.0);
    r.h[0].pc = (4, 4, 16, 16);
    let e = run(vec![r]);
    assert_eq!(e.findings.len(), 1);
    assert_eq!(e.findings[0].severity, Severity::Info);
    assert_eq!(e.findings[0].source, Some(ExpectationSource::Profile));
    assert_eq!(e.verdicts["n"], NodeVerdict::Passed);
}

#[test]
fn throttle_reasons_are_info_and_never_fail_a_node() {
    let mut r = healthy("n", 1, 0.0);
    r.h[2].th = vec!["sw_power_cap".into()];
    r.h[2].t = 81.0;
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
    r.nc[1].w = 4096;
    r.pc = 3;
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
    r.tf = vec![(2, 6, Transport::Shm)];
    let e = run(vec![r.clone()]);
    assert_eq!(e.findings.len(), 1);
    assert_eq!(e.findings[0].kind, FindingKind::TransportFallback);
    assert_eq!(e.findings[0].subject, Subject::gpu_pair("n", 2, 6));
    assert!(e.findings[0].message.contains("host shared memory"));

    // On GPUs without NVLink, PCIe between them is normal.
    let mut p = node_of("pcie", "NVIDIA L40S", 4, 1, 0.0);
    for h in &mut p.h {
        h.l = (0, 0);
    }
    p.tf = vec![(0, 1, Transport::Pcie), (2, 3, Transport::Shm)];
    assert!(run(vec![p]).findings.is_empty());
}

#[test]
fn a_gpu_whose_every_pair_falls_back_is_blamed_once() {
    let mut r = healthy("n", 1, 0.0);
    r.h[5].l = (0, 18);
    r.tf = (0..8u32)
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
            .any(|f| f.kind == FindingKind::NvlinkDown && f.subject.gpu == Some(5))
    );
}

#[test]
fn node_wide_fleet_findings_are_dropped_when_a_gpu_is_already_blamed() {
    let mut fleet = fleet_of(8, 0.01);
    fleet[0].h[3].l = (10, 18);
    all_reduce(&mut fleet[0]).pk *= 0.6;
    let e = run(fleet);
    let f = on(&e, "node-00");
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].kind, FindingKind::NvlinkDown);
}

#[test]
fn fewer_gpus_than_the_node_advertises_is_a_gpu_mismatch() {
    let r = node_of("n", H100, 7, 1, 0.0);
    let nodes = vec![NodeInput {
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
fn different_products_and_gpu_counts_are_not_compared() {
    let mut results = fleet_of(6, 0.01);
    // Two A100 nodes and two 4-GPU H100 nodes: slower than the 8-GPU H100s, but each
    // group is too small for a fleet comparison and above its own profile floors.
    for i in 0..2 {
        let mut a = node_of(&format!("a100-{i}"), "NVIDIA A100-SXM4-80GB", 8, i, 0.01);
        for v in a.pu.iter_mut() {
            *v *= 0.7;
        }
        for v in a.pb.iter_mut() {
            *v *= 0.7;
        }
        all_reduce(&mut a).pk = 230.0;
        for v in a.hd.iter_mut().chain(a.dh.iter_mut()) {
            *v = 25.0;
        }
        for h in &mut a.h {
            h.l = (12, 12);
            h.pc = (4, 4, 16, 16);
        }
        results.push(a);
        let mut h4 = node_of(&format!("h100x4-{i}"), H100, 4, i, 0.01);
        all_reduce(&mut h4).pk = 300.0;
        results.push(h4);
    }
    let e = run(results);
    assert!(e.findings.is_empty(), "{:#?}", e.findings);
}

#[test]
fn host_bandwidth_of_one_gpu_is_compared_with_the_same_gpu_of_other_nodes() {
    let mut fleet = fleet_of(8, 0.01);
    fleet[6].hd[4] = 42.0; // above the Gen5 floor (31.5), 24% below the fleet
    fleet[7].dh[1] = 20.0; // below the floor
    let e = run(fleet);
    let f6 = on(&e, "node-06");
    assert_eq!(f6.len(), 1, "{f6:#?}");
    assert_eq!(f6[0].subject, Subject::gpu("node-06", 4));
    assert_eq!(f6[0].metric, Metric::H2dBandwidth);
    assert_eq!(f6[0].source, Some(ExpectationSource::Fleet));
    let f7 = on(&e, "node-07");
    assert_eq!(f7.len(), 1, "{f7:#?}");
    assert_eq!(f7[0].metric, Metric::D2hBandwidth);
    assert_eq!(f7[0].source, Some(ExpectationSource::Profile));
}

#[test]
fn ddp_efficiency_below_the_spec_floor_fails_the_node() {
    let mut r = healthy("n", 1, 0.0);
    if let Some(p) = r.dp.last_mut() {
        p.e = 0.71;
    }
    let t = Thresholds {
        ddp_scaling_efficiency: Some(0.8),
        ..Thresholds::default()
    };
    let e = evaluate(&[NodeInput::measured(r)], &t);
    assert_eq!(e.findings.len(), 1);
    assert_eq!(e.findings[0].metric, Metric::DdpScalingEfficiency);
    assert!(
        e.findings[0].message.contains("71%"),
        "{}",
        e.findings[0].message
    );
}

#[test]
fn findings_are_sorted_and_independent_of_input_order() {
    let mut fleet = fleet_of(10, 0.02);
    slow_pair(&mut fleet[7], 0, 1, 0.4);
    fleet[2].h[1].x = vec![48];
    fleet[2].dc[0] *= 1.5;
    fleet[9].h[0].ec = 1;
    let forward = run(fleet.clone());
    fleet.reverse();
    let backward = run(fleet);
    assert_eq!(forward, backward);
    let keys: Vec<(String, Subject, Metric)> = forward
        .findings
        .iter()
        .map(|f| (f.subject.node.clone(), f.subject.clone(), f.metric))
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
    for f in &forward.findings {
        check_evidence(f);
    }
}

#[test]
fn a_healthy_fleet_with_noise_has_no_findings() {
    for seed in 0..20u64 {
        let fleet: Vec<CompactResult> = (0..16)
            .map(|i| healthy(&format!("n{i}"), seed * 100 + i, 0.03))
            .collect();
        let e = run(fleet);
        assert!(e.findings.is_empty(), "seed {seed}: {:#?}", e.findings);
        assert!(e.verdicts.values().all(|v| *v == NodeVerdict::Passed));
    }
}

#[test]
fn headline_is_the_most_telling_critical_finding() {
    let mut r = healthy("n", 1, 0.0);
    r.h[0].th = vec!["hw_slowdown".into()];
    r.dc[2] *= 1.5;
    r.h[4].x = vec![79];
    let e = run(vec![r]);
    let h = e.headline("n").expect("a headline");
    assert!(h.contains("XID 79"), "{h}");
    assert_eq!(e.critical_count("n"), 2);
    assert_eq!(e.headline("other"), None);
}

#[test]
fn pcie_generation_below_max_is_critical_when_host_copies_confirm_it_and_never_slow() {
    let mut fleet = fleet_of(6, 0.01);
    fleet[2].h[7].pc = (3, 5, 16, 16);
    fleet[2].hd[7] = 14.0;
    fleet[2].dh[7] = 13.0;
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
    r.h[1].pc = (5, 5, 4, 16);
    r.hd[1] = 15.0;
    let e = run(vec![r]);
    assert_eq!(e.findings.len(), 1, "{:#?}", e.findings);
    assert_eq!(e.findings[0].kind, FindingKind::PcieDegraded);
    assert_eq!(e.findings[0].unit.as_deref(), Some("lanes"));
}

#[test]
fn nvlink_links_down_explain_slow_pairs_and_are_never_slow() {
    let mut fleet = fleet_of(8, 0.01);
    fleet[4].h[2].l = (12, 18);
    for peer in [0, 1, 3, 4, 5, 6, 7] {
        slow_pair(&mut fleet[4], 2, peer, 12.0 / 18.0);
    }
    all_reduce(&mut fleet[4]).pk *= 0.7;
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
    r.tf = vec![(1, 6, Transport::Pcie)];
    let e = run(vec![r]);
    assert_eq!(e.findings.len(), 1, "{:#?}", e.findings);
    assert_eq!(e.findings[0].kind, FindingKind::TransportFallback);
}

#[test]
fn a_named_slow_pair_explains_a_node_below_the_profile_floor_but_not_below_a_threshold() {
    let mut r = healthy("n", 1, 0.01);
    slow_pair(&mut r, 2, 5, 0.4);
    all_reduce(&mut r).pk = 150.0;
    let e = run(vec![r.clone()]);
    assert_eq!(e.findings.len(), 1, "{:#?}", e.findings);
    assert_eq!(e.findings[0].subject, Subject::gpu_pair("n", 2, 5));
    let t = Thresholds {
        nccl_bus_bw_gbps: Some(300.0),
        ..Thresholds::default()
    };
    let e = evaluate(&[NodeInput::measured(r)], &t);
    assert_eq!(e.findings.len(), 2, "{:#?}", e.findings);
    assert!(
        e.findings
            .iter()
            .any(|f| f.source == Some(ExpectationSource::Threshold)
                && f.subject == Subject::node("n"))
    );
}

#[test]
fn a_result_claiming_an_impossible_gpu_count_is_an_agent_bug_not_evaluated() {
    let mut r = healthy("n", 1, 0.0);
    r.g = u32::MAX;
    let mut z = healthy("z", 1, 0.0);
    z.g = 0;
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
    r.pu.truncate(10);
    r.pb.truncate(3);
    let e = run(vec![r]);
    assert!(e.findings.is_empty(), "{:#?}", e.findings);
}

#[test]
#[ignore = "timing, for a person to read: cargo test -p gpufabric-health --release --lib evaluate_time -- --ignored --nocapture"]
fn evaluate_time_for_a_thousand_eight_gpu_nodes() {
    let mut fleet = fleet_of(1000, 0.03);
    slow_pair(&mut fleet[10], 1, 2, 0.5);
    fleet[20].dc[3] *= 1.5;
    let nodes = inputs(fleet);
    let t = Thresholds::default();
    let start = std::time::Instant::now();
    let rounds = 5;
    let mut found = 0;
    for _ in 0..rounds {
        found = evaluate(&nodes, &t).findings.len();
    }
    let per = start.elapsed() / rounds;
    eprintln!("evaluate: 1000 nodes x 8 GPUs in {per:?} per run ({found} findings)");
    assert_eq!(found, 2);
}

#[test]
fn a_node_whose_every_gpu_computes_slowly_is_a_fleet_outlier_not_a_straggler() {
    let mut fleet = fleet_of(8, 0.01);
    for v in fleet[3].dc.iter_mut() {
        *v *= 1.3;
    }
    let e = run(fleet);
    let f = on(&e, "node-03");
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].kind, FindingKind::Slow);
    assert_eq!(f[0].metric, Metric::DdpComputeTime);
    assert_eq!(f[0].subject, Subject::node("node-03"));
    assert_eq!(f[0].source, Some(ExpectationSource::Fleet));
}

#[test]
fn a_pair_slow_only_both_ways_at_once_is_a_bidirectional_finding() {
    let mut r = healthy("n", 2, 0.01);
    r.pb[upper(8, 3, 4)] *= 0.5;
    let e = run(vec![r]);
    assert_eq!(e.findings.len(), 1, "{:#?}", e.findings);
    assert_eq!(e.findings[0].metric, Metric::PairBidirBandwidth);
    assert_eq!(e.findings[0].subject, Subject::gpu_pair("n", 3, 4));
}

#[test]
fn an_explicit_pair_threshold_judges_every_pair_alone() {
    let mut r = healthy("n", 2, 0.01);
    slow_pair(&mut r, 0, 1, 0.7); // 30% below its peers, but above the spec's floor
    slow_pair(&mut r, 2, 3, 0.4); // below the spec's floor
    let t = Thresholds {
        pair_bandwidth_gbps: Some(200.0),
        ..Thresholds::default()
    };
    let e = evaluate(&[NodeInput::measured(r)], &t);
    let pairs: Vec<_> = e
        .findings
        .iter()
        .filter(|f| f.metric == Metric::PairBandwidth)
        .collect();
    assert_eq!(pairs.len(), 1, "{pairs:#?}");
    assert_eq!(pairs[0].subject, Subject::gpu_pair("n", 2, 3));
    assert_eq!(pairs[0].source, Some(ExpectationSource::Threshold));
    assert_eq!(pairs[0].expected, Some(200.0));
}

#[test]
fn latency_and_host_thresholds_fail_what_exceeds_them() {
    let mut r = healthy("n", 2, 0.0);
    all_reduce(&mut r).lt = 40.0;
    r.hd[5] = 30.0;
    let t = Thresholds {
        nccl_latency_us: Some(30.0),
        host_bandwidth_gbps: Some(40.0),
        ..Thresholds::default()
    };
    let e = evaluate(&[NodeInput::measured(r)], &t);
    let got: Vec<(Metric, Option<u32>, Option<ExpectationSource>)> = e
        .findings
        .iter()
        .map(|f| (f.metric, f.subject.gpu, f.source))
        .collect();
    assert_eq!(
        got,
        vec![
            (
                Metric::H2dBandwidth,
                Some(5),
                Some(ExpectationSource::Threshold)
            ),
            (
                Metric::NcclLatency,
                None,
                Some(ExpectationSource::Threshold)
            ),
        ]
    );
}

/// An 8-GPU PCIe node of an unknown product: pairs on one CPU socket (0-3, 4-7) copy at
/// 25 GB/s, pairs across sockets at 15 GB/s.
fn pcie_node(name: &str, seed: u64) -> CompactResult {
    let mut r = node_of(name, "NVIDIA L40S", 8, seed, 0.0);
    let mut n = Noise(seed + 99, 0.02);
    for a in 0..8usize {
        for b in 0..8usize {
            if a != b {
                let same_socket = (a < 4) == (b < 4);
                r.pu[a * 8 + b] = n.scale(if same_socket { 25.0 } else { 15.0 });
            }
        }
    }
    r.pb.clear();
    for h in &mut r.h {
        h.l = (0, 0);
        h.pc = (4, 4, 16, 16);
    }
    r
}

#[test]
fn pcie_topologies_are_not_judged_against_the_nodes_own_pairs() {
    let e = run(vec![pcie_node("p", 1)]);
    assert!(e.findings.is_empty(), "{:#?}", e.findings);
    let e = run((0..6).map(|i| pcie_node(&format!("p{i}"), i)).collect());
    assert!(e.findings.is_empty(), "{:#?}", e.findings);
}

#[test]
fn on_pcie_topologies_a_pair_is_compared_with_the_same_pair_of_other_nodes() {
    let mut fleet: Vec<CompactResult> = (0..6).map(|i| pcie_node(&format!("p{i}"), i)).collect();
    // Across sockets, 1 <-> 6 at half speed; all of GPU 3's pairs at 60%.
    fleet[2].pu[8 + 6] *= 0.5;
    fleet[2].pu[6 * 8 + 1] *= 0.5;
    for peer in 0..8usize {
        if peer != 3 {
            fleet[4].pu[3 * 8 + peer] *= 0.6;
            fleet[4].pu[peer * 8 + 3] *= 0.6;
        }
    }
    let e = run(fleet);
    let f2 = on(&e, "p2");
    assert_eq!(f2.len(), 1, "{f2:#?}");
    assert_eq!(f2[0].subject, Subject::gpu_pair("p2", 1, 6));
    assert_eq!(f2[0].source, Some(ExpectationSource::Fleet));
    assert!(
        f2[0].message.contains("same GPU pairs"),
        "{}",
        f2[0].message
    );
    let f4 = on(&e, "p4");
    assert_eq!(f4.len(), 1, "{f4:#?}");
    assert_eq!(f4[0].subject, Subject::gpu("p4", 3));
    assert_eq!(e.findings.len(), 2, "{:#?}", e.findings);
}

#[test]
fn a_node_fifteen_percent_slow_stands_out_of_a_noisy_fleet() {
    let mut fleet = fleet_of(16, 0.03);
    let ar = all_reduce(&mut fleet[9]);
    ar.pk *= 0.85;
    let e = run(fleet);
    let f = on(&e, "node-09");
    assert_eq!(f.len(), 1, "{:#?}", e.findings);
    assert_eq!(f[0].metric, Metric::NcclBusBw);
    assert!(
        f[0].message.contains("of 16 comparable"),
        "{}",
        f[0].message
    );
    assert_eq!(e.findings.len(), 1);
}

#[test]
fn blame_names_the_smallest_part() {
    use super::perf::blame;
    let all: BTreeSet<(u32, u32)> = (0..4u32)
        .flat_map(|a| ((a + 1)..4).map(move |b| (a, b)))
        .collect();
    let set = |v: &[(u32, u32)]| v.iter().copied().collect::<BTreeSet<_>>();
    // One pair.
    let b = blame(4, &all, &set(&[(1, 2)]));
    assert_eq!(
        (b.node, b.gpus.clone(), b.pairs.clone()),
        (false, vec![], vec![(1, 2)])
    );
    // Every pair of GPU 2.
    let b = blame(4, &all, &set(&[(0, 2), (1, 2), (2, 3), (0, 1)]));
    assert_eq!(
        (b.node, b.gpus.clone(), b.pairs.clone()),
        (false, vec![2], vec![(0, 1)])
    );
    // Every pair.
    let b = blame(4, &all, &all);
    assert!(b.node);
    // Two GPUs: a single pair is that pair, never a GPU.
    let two = set(&[(0, 1)]);
    let b = blame(2, &two, &two);
    assert_eq!((b.node, b.gpus, b.pairs), (false, vec![], vec![(0, 1)]));
}

#[test]
fn two_gpus_slow_to_everyone_are_blamed_even_when_most_pairs_are_slow() {
    // A 4-GPU node where every copy into or out of GPUs 1 and 3 runs at half speed (as
    // traffic between them does on NVSwitch): 5 of 6 pairs slow, the median slow too.
    let mut r = node_of("n", "NVIDIA H200", 4, 7, 0.01);
    for (a, b) in [(0, 1), (0, 3), (1, 2), (1, 3), (2, 3)] {
        slow_pair(&mut r, a, b, 0.5);
    }
    let e = run(vec![r]);
    let subjects: Vec<Subject> = on(&e, "n")
        .iter()
        .filter(|f| f.severity == Severity::Critical)
        .map(|f| f.subject.clone())
        .collect();
    assert_eq!(subjects, vec![Subject::gpu("n", 1), Subject::gpu("n", 3)]);
}

#[test]
fn a_noisy_healthy_node_is_not_judged_against_its_fastest_pair() {
    // 3% noise on every pair of 8 GPUs: the fastest of 28 pairs sits well above the
    // median, and no healthy pair may fall below the bar drawn from it.
    for seed in 0..40 {
        let e = run(vec![node_of("n", "NVIDIA H100 80GB HBM3", 8, seed, 0.03)]);
        assert!(
            on(&e, "n").iter().all(|f| f.severity == Severity::Info),
            "seed {seed}: {:#?}",
            on(&e, "n")
        );
    }
}

// ---------------------------------------------------------------------------------------
// Floors from the measured topology, NCCL against the copy engines, sides of a GPU
// ---------------------------------------------------------------------------------------

const H200: &str = "NVIDIA H200";

/// A healthy slice of `g` GPUs of an H200 NVSwitch board as the agent reports it: 18
/// links of 25 GB/s to NVSwitches per GPU, pairs ~394 GB/s one way, all_reduce ~355 GB/s
/// (the 4 x H200 record of bench/results).
fn switched_slice(name: &str, g: u32, seed: u64) -> CompactResult {
    let mut r = node_of(name, H200, g, seed, 0.01);
    for h in &mut r.h {
        h.nvlink_link_gbps = 25.0;
        h.nvlink_switch = Some(true);
    }
    for v in r.pu.iter_mut().filter(|v| **v > 0.0) {
        *v = *v / 390.0 * 394.0;
    }
    all_reduce(&mut r).pk = 355.0;
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
        all_reduce(&mut r).pk = 38.0;
        let e = run(vec![r]);
        let bad = critical_of(&e, "one-channel");
        assert_eq!(bad.len(), 1, "{g} GPUs: {bad:?}");
        let f = bad[0];
        assert_eq!(f.metric, Metric::NcclBusBw);
        assert_eq!(f.subject.kind, SubjectKind::Node);
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
    for h in &mut r.h {
        h.nvlink_switch = None;
    }
    all_reduce(&mut r).pk = 38.0;
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
    for v in r.pu.iter_mut() {
        *v /= 3.0;
    }
    for v in r.pb.iter_mut() {
        *v /= 3.0;
    }
    all_reduce(&mut r).pk = 110.0;
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
                r.pu[a * g + b] *= 0.52;
            }
        }
    }
    // Both ways at once, every pair of GPU 1 or 3 carries the slow direction.
    for (a, b) in [(0, 1), (0, 3), (1, 2), (1, 3), (2, 3)] {
        let i = upper(4, a, b);
        r.pb[i] *= 0.75;
    }
    let e = run(vec![r]);
    let bad = critical_of(&e, "one-way");
    assert_eq!(bad.len(), 2, "{bad:?}");
    let send = bad
        .iter()
        .find(|f| f.subject.gpu == Some(1))
        .expect("GPU 1 named");
    assert_eq!(send.subject.kind, SubjectKind::Gpu);
    assert!(send.message.contains("sending side"), "{}", send.message);
    let recv = bad
        .iter()
        .find(|f| f.subject.gpu == Some(3))
        .expect("GPU 3 named");
    assert!(recv.message.contains("receiving side"), "{}", recv.message);
    assert!(bad.iter().all(|f| f.subject.kind != SubjectKind::GpuPair));
}

#[test]
fn one_gpu_slow_to_receive_on_an_eight_gpu_board_is_named_with_its_side() {
    let mut r = healthy("recv", 21, 0.01);
    let g = 8usize;
    for a in 0..g {
        if a != 5 {
            r.pu[a * g + 5] *= 0.4;
        }
    }
    let e = run(vec![r]);
    let bad = critical_of(&e, "recv");
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert_eq!(bad[0].subject.gpu, Some(5));
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
        bad.iter().all(|f| f.subject.kind == SubjectKind::GpuPair
            && f.subject.gpu == Some(0)
            && f.subject.peer_gpu == Some(2)),
        "{bad:?}"
    );
}
