//! What failed phases and unmeasured nodes become, and the order and headline of findings.

use super::*;

#[test]
fn crash_is_never_slow() {
    let mut nodes = inputs(fleet_of(8, 0.02));
    nodes.push(NodeInput {
        baseline: None,
        history: Vec::new(),
        nccl_tuning: Vec::new(),
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
            baseline: None,
            history: Vec::new(),
            nccl_tuning: Vec::new(),
            node: "a".into(),
            product_label: None,
            expected_gpus: None,
            outcome: NodeOutcome::hardware(
                HardwareFault::Hang,
                "the agent had started and ran past the pod deadline (900s)",
            ),
        },
        NodeInput {
            baseline: None,
            history: Vec::new(),
            nccl_tuning: Vec::new(),
            node: "b".into(),
            product_label: None,
            expected_gpus: None,
            outcome: NodeOutcome::not_measured(
                NotMeasuredReason::AgentBug,
                "the result document is not valid JSON",
            ),
        },
        NodeInput {
            baseline: None,
            history: Vec::new(),
            nccl_tuning: Vec::new(),
            node: "c".into(),
            product_label: None,
            expected_gpus: None,
            outcome: NodeOutcome::not_measured(
                NotMeasuredReason::NotAdmitted,
                "the kubelet refused the pod: OutOfnvidia.com/gpu",
            ),
        },
        NodeInput {
            baseline: None,
            history: Vec::new(),
            nccl_tuning: Vec::new(),
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
    r.errors = vec![
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
    r.errors = vec![PhaseError {
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
fn a_sweep_the_node_could_not_record_in_cuda_graphs_does_not_fail_it() {
    // graphLaunches > 0 on a node whose driver refuses graph capture: no sweep at all, an
    // Unavailable phase error, and the node's copies and health still judged.
    let mut fleet = fleet_of(4, 0.0);
    fleet[1].collectives.clear();
    fleet[1].errors = vec![PhaseError {
        phase: Phase::NcclSweep,
        kind: ErrorKind::Unavailable,
        message: "CUDA graphs cannot be used here (cuGraphInstantiate was refused: operation not permitted when stream is capturing)".into(),
    }];
    let e = run(fleet);
    let on_it: Vec<_> = e
        .findings
        .iter()
        .filter(|f| f.subject.node_name() == "node-01")
        .collect();
    assert!(
        on_it.iter().all(|f| f.severity == Severity::Info),
        "{on_it:?}"
    );
    assert_eq!(e.verdicts["node-01"], NodeVerdict::Passed);
}

#[test]
fn findings_are_sorted_and_independent_of_input_order() {
    let mut fleet = fleet_of(10, 0.02);
    slow_pair(&mut fleet[7], 0, 1, 0.4);
    fleet[2].health[1].xids = vec![48];
    fleet[2].ddp_compute_ms[0] *= 1.5;
    fleet[9].health[0].ecc_uncorrected = 1;
    let forward = run(fleet.clone());
    fleet.reverse();
    let backward = run(fleet);
    assert_eq!(forward, backward);
    let keys: Vec<(String, Subject, Metric)> = forward
        .findings
        .iter()
        .map(|f| {
            (
                f.subject.node_name().to_string(),
                f.subject.clone(),
                f.metric,
            )
        })
        .collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted);
    for f in &forward.findings {
        check_evidence(f);
    }
}

#[test]
fn headline_is_the_most_telling_critical_finding() {
    let mut r = healthy("n", 1, 0.0);
    r.health[0].throttle = vec!["hw_slowdown".into()];
    r.ddp_compute_ms[2] *= 1.5;
    r.health[4].xids = vec![79];
    let e = run(vec![r]);
    let worst = worst_per_node(&e.findings);
    let h = &worst.get("n").expect("a headline").message;
    assert!(h.contains("XID 79"), "{h}");
    assert_eq!(e.critical_count("n"), 2);
    assert_eq!(worst.get("other"), None);
}
