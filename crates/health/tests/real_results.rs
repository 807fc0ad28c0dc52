//! The rules on compact documents measured on real GPUs (4 x H200, tests/data): a healthy
//! node passes, and faults written into its real measurements are found where they are.

use gpufabric_api::result::CompactResult;
use gpufabric_api::run::NodeVerdict;
use gpufabric_api::{FindingKind, Severity, Subject};
use gpufabric_health::{NodeInput, evaluate};

fn load(name: &str) -> CompactResult {
    let path = format!("{}/tests/data/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect("test data is readable");
    CompactResult::parse(&text).expect("test data is a compact result")
}

fn judge(r: CompactResult) -> gpufabric_health::Evaluation {
    evaluate(&[NodeInput::measured(r)], &Default::default())
}

#[test]
fn a_healthy_h200_node_passes_with_only_info_findings() {
    for name in ["h200x4-full.compact", "h200x4-quick.compact"] {
        let r = load(name);
        // NVML's NVLink counters on this healthy host are in the thousands and grow during
        // a check: they must not fail it.
        assert!(
            r.h.iter().all(|h| h.le > 0),
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
    let g = r.g as usize;
    r.pu[g + 3] *= 0.55;
    r.pu[3 * g + 1] *= 0.55;
    let e = judge(r);
    let critical: Vec<_> = e
        .findings
        .iter()
        .filter(|f| f.severity == Severity::Critical)
        .collect();
    assert_eq!(critical.len(), 1, "{critical:#?}");
    assert_eq!(critical[0].subject, Subject::gpu_pair("vm", 1, 3));
    assert_eq!(critical[0].kind, FindingKind::Slow);
}

#[test]
fn a_straggler_written_into_real_measurements_is_named() {
    let mut r = load("h200x4-full.compact");
    r.dc[2] *= 1.25;
    let e = judge(r);
    let critical: Vec<_> = e
        .findings
        .iter()
        .filter(|f| f.severity == Severity::Critical)
        .collect();
    assert_eq!(critical.len(), 1, "{critical:#?}");
    assert_eq!(critical[0].subject, Subject::gpu("vm", 2));
    assert_eq!(critical[0].kind, FindingKind::Straggler);
}
