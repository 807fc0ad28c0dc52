//! The rules on compact documents measured on real GPUs (4 x H200, tests/data): a healthy
//! node passes, and faults written into its real measurements are found where they are.

use gpufabric_api::keys::TERMINATION_MESSAGE_LIMIT;
use gpufabric_api::result::{CompactResult, ResultDocument};
use gpufabric_api::run::NodeVerdict;
use gpufabric_api::{Finding, FindingKind, Metric, Severity, Subject};
use gpufabric_health::{NodeInput, evaluate};

fn data(name: &str) -> String {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).expect("test data is readable")
}

fn load(name: &str) -> CompactResult {
    CompactResult::parse(&data(name)).expect("test data is a compact result")
}

/// A full document written by `fabric-agent node-check`, as the operator receives it:
/// through the compact termination message.
fn as_received(full: &str) -> CompactResult {
    let doc = ResultDocument::parse(full).expect("a full document");
    CompactResult::parse(&doc.compact_within(TERMINATION_MESSAGE_LIMIT))
        .expect("its compact form parses")
}

fn judge(r: CompactResult) -> gpufabric_health::Evaluation {
    evaluate(&[NodeInput::measured(r)], &Default::default())
}

fn critical(e: &gpufabric_health::Evaluation) -> Vec<&Finding> {
    e.findings
        .iter()
        .filter(|f| f.severity == Severity::Critical)
        .collect()
}

#[test]
fn a_healthy_h200_node_passes_with_only_info_findings() {
    for name in ["h200x4-full.compact", "h200x4-quick.compact"] {
        let r = load(name);
        // NVML's NVLink counters on this healthy host are in the thousands and grow during
        // a check: they must not fail it.
        assert!(
            r.health.iter().all(|h| h.nvlink_errors > 0),
            "{name}: the data has NVLink counts"
        );
        let e = judge(r);
        assert_eq!(
            e.verdicts["vm"],
            NodeVerdict::Passed,
            "{name}: {:#?}",
            e.findings
        );
        assert!(
            e.findings.iter().all(|f| f.severity == Severity::Info),
            "{name}: {:#?}",
            e.findings
        );
    }
}

#[test]
fn a_slow_pair_written_into_real_measurements_is_named() {
    let mut r = load("h200x4-full.compact");
    let g = r.gpus as usize;
    r.copy_uni[g + 3] *= 0.55;
    r.copy_uni[3 * g + 1] *= 0.55;
    let e = judge(r);
    let critical = critical(&e);
    assert_eq!(critical.len(), 1, "{critical:#?}");
    assert_eq!(critical[0].subject, Subject::gpu_pair("vm", 1, 3));
    assert_eq!(critical[0].kind, FindingKind::Slow);
}

#[test]
fn a_straggler_written_into_real_measurements_is_named() {
    let mut r = load("h200x4-full.compact");
    r.ddp_compute_ms[2] *= 1.25;
    let e = judge(r);
    let critical = critical(&e);
    assert_eq!(critical.len(), 1, "{critical:#?}");
    assert_eq!(critical[0].subject, Subject::gpu("vm", 2));
    assert_eq!(critical[0].kind, FindingKind::Straggler);
}

#[test]
fn real_background_traffic_between_two_gpus_fails_the_node_on_those_two_gpus() {
    // `fabric-agent inject slow-pair --gpus 1,3` beside a check on an NVSwitch host: every
    // copy into or out of GPU 1 or GPU 3 ran at half speed (198-222 GB/s), pair 0-2 at
    // 394 GB/s. Five of six pairs are slow, so the node's median is slow too; the pairs
    // must still be judged against the fastest and blamed on the two GPUs.
    let e = judge(as_received(&data("h200x4-injected-slow-pair.json")));
    assert_eq!(e.verdicts["vm"], NodeVerdict::Failed, "{:#?}", e.findings);
    let critical = critical(&e);
    let gpus: Vec<_> = critical.iter().map(|f| f.subject.clone()).collect();
    assert_eq!(
        gpus,
        vec![Subject::gpu("vm", 1), Subject::gpu("vm", 3)],
        "{critical:#?}"
    );
    for f in &critical {
        assert_eq!(f.kind, FindingKind::Slow);
        assert_eq!(f.metric, Metric::PairBandwidth);
        assert!(f.measured.expect("measured") < 230.0, "{f:#?}");
        assert!(f.expected.expect("expected") > 390.0, "{f:#?}");
        assert!(
            f.message.contains("the node's fastest pair"),
            "{}",
            f.message
        );
        // Two copy streams each way: both sides of both GPUs carry the traffic.
        assert!(
            f.message.contains("sending and receiving sides"),
            "{}",
            f.message
        );
    }
}

#[test]
fn a_real_straggler_is_named_and_nothing_else() {
    // `fabric-agent inject straggler --gpu 2`: GEMMs on GPU 2 beside the DDP probe.
    let e = judge(as_received(&data("h200x4-injected-straggler.json")));
    assert_eq!(e.verdicts["vm"], NodeVerdict::Failed);
    let critical: Vec<_> = e
        .findings
        .iter()
        .filter(|f| f.severity != Severity::Info)
        .collect();
    assert_eq!(critical.len(), 1, "{critical:#?}");
    assert_eq!(critical[0].kind, FindingKind::Straggler);
    assert_eq!(critical[0].subject, Subject::gpu("vm", 2));
}

#[test]
fn five_real_clean_runs_pass() {
    let text = data("h200x4-clean-runs.jsonl");
    let mut runs = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let e = judge(as_received(line));
        assert_eq!(e.verdicts["vm"], NodeVerdict::Passed, "{:#?}", e.findings);
        runs += 1;
    }
    assert_eq!(runs, 5);
}
