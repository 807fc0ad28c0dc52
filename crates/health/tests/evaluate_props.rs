//! Property tests of `evaluate` over random, often inconsistent result documents: it never
//! panics, verdicts follow the findings, crashes are never Slow, and the result does not
//! depend on the order of the nodes.

use gpufabric_api::outcome::{HardwareFault, NotMeasuredReason};
use gpufabric_api::policy::Thresholds;
use gpufabric_api::result::{
    Backend, COMPACT_VERSION, CompactCollective, CompactDdpPoint, CompactGpuHealth, CompactResult,
    ErrorKind, Phase, PhaseError, Transport,
};
use gpufabric_api::run::NodeVerdict;
use gpufabric_api::{Collective, FindingKind, Severity, SubjectKind};
use gpufabric_health::{NodeInput, NodeOutcome, evaluate};
use proptest::prelude::*;

fn bw() -> impl Strategy<Value = f64> {
    prop_oneof![Just(0.0), 1.0f64..900.0, 350.0f64..400.0]
}

fn health() -> impl Strategy<Value = CompactGpuHealth> {
    (
        (0u32..19, 0u32..19),
        prop_oneof![Just(0u64), 0u64..5],
        (
            0u32..6,
            0u32..6,
            prop_oneof![Just(16u32), 0u32..17],
            Just(16u32),
        ),
        prop::collection::vec(prop_oneof![Just(79u64), Just(48u64)], 0..2),
        prop_oneof![3 => Just(0u64), 1 => 1u64..3],
        prop_oneof![3 => Just(0u32), 1 => 0u32..4],
        20.0f64..95.0,
        prop::collection::vec(Just("sw_power_cap".to_string()), 0..2),
    )
        .prop_map(|(l, le, pc, x, ec, rr, t, th)| CompactGpuHealth {
            nvlinks: l,
            nvlink_errors: le,
            pcie: pc,
            xids: x,
            ecc_uncorrected: ec,
            row_remap: rr,
            temperature_c: t,
            throttle: th,
            ..Default::default()
        })
}

fn collective() -> impl Strategy<Value = CompactCollective> {
    (
        prop_oneof![
            Just(Collective::AllReduce),
            Just(Collective::AllGather),
            Just(Collective::SendRecv)
        ],
        bw(),
        0.0f64..100.0,
        prop_oneof![3 => Just(0u64), 1 => 0u64..100],
        prop::option::of((0.0f64..50.0, 0.0f64..500.0)),
        prop::option::of(prop_oneof![
            Just(1u64 << 20),
            Just(64u64 << 20),
            Just(1u64 << 30)
        ]),
    )
        .prop_map(|(c, pk, lt, w, ab, mx)| CompactCollective {
            collective: c,
            peak_busbw: pk,
            largest_busbw: pk,
            smallest_time_us: lt,
            alpha_beta: ab,
            wrong: w,
            largest_bytes: mx,
        })
}

fn result(name: String) -> impl Strategy<Value = CompactResult> {
    (1u32..10).prop_flat_map(move |g| {
        let n = g as usize;
        let name = name.clone();
        (
            prop_oneof![Just("NVIDIA-H100-80GB-HBM3".to_string()), Just("NVIDIA A100-SXM4-80GB".to_string()), Just("".to_string()), Just("Some GPU".to_string())],
            // Usually the right length, sometimes not.
            prop_oneof![4 => prop::collection::vec(bw(), n * n), 1 => prop::collection::vec(bw(), 0..20)],
            prop_oneof![4 => prop::collection::vec(bw(), n * n.saturating_sub(1) / 2), 1 => prop::collection::vec(bw(), 0..20)],
            prop::collection::vec(0.0f64..70.0, 0..n + 2),
            prop::collection::vec(0.0f64..20.0, 0..n + 2),
            prop::collection::vec(health(), 0..n + 2),
            prop::collection::vec((0u32..12, 0u32..12, prop_oneof![Just(Transport::Shm), Just(Transport::Pcie), Just(Transport::Nvlink)]), 0..4),
            prop::collection::vec(collective(), 0..4),
            prop::collection::vec(
                (prop_oneof![Just(Phase::NcclSweep), Just(Phase::Setup)], prop_oneof![Just(ErrorKind::Timeout), Just(ErrorKind::Failed), Just(ErrorKind::Unavailable)])
                    .prop_map(|(phase, kind)| PhaseError { phase, kind, message: "x".into() }),
                0..2,
            ),
            (prop_oneof![Just(0u32), 0u32..3], prop::option::of(0.0f64..1.2)),
        )
            .prop_map(move |(p, pu, pb, hd, dc, h, tf, nc, e, (pc, eff))| CompactResult {
                version: COMPACT_VERSION,
                node: name.clone(),
                backend: Backend::Sim,
                product: p,
                gpus: g,
                duration_s: 1.0,
                collectives: nc,
                copy_uni: pu,
                copy_bidir: pb,
                host_to_device: hd.clone(),
                device_to_host: hd,
                corrupt_copies: pc,
                // Copies of unknown size, too short to judge, and long enough.
                pair_bytes: [None, Some(1 << 20), Some(256 << 20)][pc as usize % 3],
                ddp_points: eff
                    .map(|e| vec![CompactDdpPoint { gpus: g, step_ms: 10.0, scaling_efficiency: e, comm_fraction: 0.1, overlap_efficiency: 0.9, tflops_per_gpu: 100.0 }])
                    .unwrap_or_default(),
                ddp_compute_ms: dc,
                health: h,
                transport_fallbacks: tf,
                errors: e,
                // Host-launched and graph-timed sweeps alike.
                graph_launches: pc * 5,
                compute: Vec::new(),
                compute_gemm_size: None,
                settings_not_chosen: Vec::new(),
                software: Default::default(),
            })
    })
}

fn input(i: usize) -> impl Strategy<Value = NodeInput> {
    let name = format!("n{i:02}");
    let measured = result(name.clone()).prop_map(|r| NodeOutcome::Measured(Box::new(r)));
    let outcome = prop_oneof![
        8 => measured,
        1 => Just(NodeOutcome::hardware(HardwareFault::Crash, "boom")),
        1 => Just(NodeOutcome::hardware(HardwareFault::Hang, "late")),
        1 => Just(NodeOutcome::not_measured(NotMeasuredReason::AgentBug, "truncated")),
    ];
    (outcome, prop::option::of(0u32..10)).prop_map(move |(outcome, expected_gpus)| NodeInput {
        baseline: None,
        history: Vec::new(),
        nccl_tuning: Vec::new(),
        node: name.clone(),
        product_label: None,
        expected_gpus,
        outcome,
    })
}

fn inputs() -> impl Strategy<Value = Vec<NodeInput>> {
    (1usize..10).prop_flat_map(|n| (0..n).map(input).collect::<Vec<_>>())
}

fn thresholds() -> impl Strategy<Value = Thresholds> {
    (
        prop::option::of(100.0f64..500.0),
        prop::option::of(100.0f64..400.0),
        1.0f64..1.5,
        2u32..6,
    )
        .prop_map(|(ar, pair, straggler, min)| Thresholds {
            nccl_bus_bw_gbps: ar,
            pair_bandwidth_gbps: pair,
            straggler_ratio: straggler,
            fleet_min_nodes: min,
            ..Thresholds::default()
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn evaluate_is_total_consistent_and_order_independent(nodes in inputs(), t in thresholds()) {
        let e = evaluate(&nodes, &t);
        prop_assert_eq!(e.verdicts.len(), nodes.len());
        for n in &nodes {
            let verdict = e.verdicts[&n.node];
            let mine: Vec<_> = e.findings_of(&n.node).collect();
            let critical = mine.iter().any(|f| f.severity == Severity::Critical);
            match &n.outcome {
                NodeOutcome::HardwareFault { fault: HardwareFault::Hang, .. } => {
                    prop_assert_eq!(verdict, NodeVerdict::Timeout);
                    prop_assert_eq!(mine.len(), 1);
                    prop_assert_eq!(mine[0].kind, FindingKind::Timeout);
                }
                NodeOutcome::HardwareFault { .. } => {
                    prop_assert_eq!(verdict, NodeVerdict::Errored);
                    prop_assert_eq!(mine.len(), 1);
                    prop_assert_eq!(mine[0].kind, FindingKind::Crash);
                }
                NodeOutcome::NotMeasured { .. } => {
                    prop_assert_eq!(verdict, NodeVerdict::NotMeasured);
                    prop_assert!(mine.is_empty());
                }
                NodeOutcome::Measured(r) => {
                    prop_assert_eq!(verdict == NodeVerdict::Failed, critical, "{:?} {:#?}", verdict, mine);
                    prop_assert!(matches!(verdict, NodeVerdict::Passed | NodeVerdict::Failed));
                    for f in &mine {
                        for g in [f.subject.gpu_index(), f.subject.peer_gpu_index()].into_iter().flatten() {
                            prop_assert!(g < r.gpus, "{:?} names GPU {} of {}", f, g, r.gpus);
                        }
                        if f.subject.kind() == SubjectKind::GpuPair {
                            prop_assert!(f.subject.gpu_index() < f.subject.peer_gpu_index());
                        }
                    }
                }
            }
            for f in &mine {
                prop_assert!(!f.message.is_empty());
                prop_assert!(f.source.is_some(), "no source: {:?}", f);
                if let (Some(m), Some(x), Some(d)) = (f.measured, f.expected, f.deviation) {
                    prop_assert!((d - (m - x) / x).abs() < 1e-9);
                }
            }
        }
        let keys: Vec<_> = e.findings.iter().map(|f| (f.subject.node_name().to_string(), f.subject.clone(), f.metric)).collect();
        let mut sorted = keys.clone();
        sorted.sort();
        prop_assert_eq!(keys, sorted);

        let mut reversed = nodes.clone();
        reversed.reverse();
        prop_assert_eq!(evaluate(&reversed, &t), e);
    }
}
