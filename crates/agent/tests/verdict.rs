//! `fabric-agent node-check --verdict` as a gate: the operator's health rules on the sim
//! backend's fault fleet; a faulty node exits 3 with its findings, a clean one exits 0.

mod common;

use common::{EXIT_NODE_FAILED, agent, stderr, stdout};
use std::path::PathBuf;
use std::process::Output;

fn fleet() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../measure/fleets/faults.yaml")
}

fn verdict(node: &str, extra: &[&str]) -> Output {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cmd = agent();
    cmd.env("FABRIC_TERMINATION_LOG", dir.path().join("termination-log"))
        .args(["node-check", "--backend", "sim", "--fleet"])
        .arg(fleet())
        .args(["--node", node, "--verdict"])
        .args(extra);
    cmd.output().expect("agent runs")
}

#[test]
fn a_clean_node_passes_and_exits_0() {
    let out = verdict("clean", &[]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("# Verdict: PASSED (0 critical"), "{text}");
    // The full document is still the last line for whoever reads the log.
    let last = text.lines().last().expect("a last line");
    assert!(
        last.starts_with('{') && last.contains("\"node\":\"clean\""),
        "{last}"
    );
}

#[test]
fn a_node_with_hardware_faults_fails_with_its_findings_and_exits_3() {
    let out = verdict("xid-ecc-pcie", &[]);
    assert_eq!(
        out.status.code(),
        Some(EXIT_NODE_FAILED),
        "stderr: {}",
        stderr(&out)
    );
    let text = stdout(&out);
    assert!(text.contains("# Verdict: FAILED"), "{text}");
    for kind in ["Xid", "EccUncorrectable", "PcieDegraded"] {
        assert!(text.contains(kind), "{kind} missing from {text}");
    }
}

#[test]
fn a_slow_pair_fails_on_the_built_in_profile_alone() {
    let out = verdict("slow-pair", &[]);
    assert_eq!(
        out.status.code(),
        Some(EXIT_NODE_FAILED),
        "stderr: {}",
        stderr(&out)
    );
    assert!(stdout(&out).contains("Slow"), "{}", stdout(&out));
}

#[test]
fn an_explicit_threshold_fails_a_clean_node() {
    // No H100 reaches 1000 GB/s of all_reduce bus bandwidth.
    let out = verdict("clean", &["--min-busbw", "1000"]);
    assert_eq!(
        out.status.code(),
        Some(EXIT_NODE_FAILED),
        "stderr: {}",
        stderr(&out)
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("thresholds.yaml");
    std::fs::write(&file, "ncclBusBwGbps: 1000\n").expect("write thresholds");
    let out = verdict("clean", &["--thresholds", file.to_str().expect("utf-8")]);
    assert_eq!(
        out.status.code(),
        Some(EXIT_NODE_FAILED),
        "stderr: {}",
        stderr(&out)
    );
}

#[test]
fn verdict_json_alone_on_stdout_and_the_tables_on_stderr() {
    let out = verdict("xid-ecc-pcie", &["--verdict-json", "-"]);
    assert_eq!(
        out.status.code(),
        Some(EXIT_NODE_FAILED),
        "stderr: {}",
        stderr(&out)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("stdout is one JSON");
    assert_eq!(v["node"], "xid-ecc-pcie");
    assert_eq!(v["verdict"], "Failed");
    let findings = v["findings"].as_array().expect("findings");
    assert!(findings.iter().any(|f| f["kind"] == "Xid"), "{v}");
    assert!(stderr(&out).contains("# Verdict: FAILED"));
    assert!(stderr(&out).contains("all_reduce_perf"));

    let both = verdict("clean", &["--verdict-json", "-", "--json", "-"]);
    assert_eq!(both.status.code(), Some(2), "one of them must go to a file");
}

#[test]
fn the_full_document_alone_on_stdout_with_json_dash() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("verdict.json");
    let out = verdict(
        "clean",
        &[
            "--json",
            "-",
            "--verdict-json",
            file.to_str().expect("utf-8"),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let doc = gpufabric_api::ResultDocument::parse(&stdout(&out)).expect("stdout is the document");
    assert_eq!(doc.node, "clean");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).expect("verdict file")).expect("json");
    assert_eq!(v["verdict"], "Passed");
}

#[test]
fn nccl_tests_flags_that_are_not_measured_are_refused() {
    let out = verdict("clean", &["-o", "max"]);
    assert_eq!(out.status.code(), Some(2), "stderr: {}", stderr(&out));
    assert!(stderr(&out).contains("sum only"), "{}", stderr(&out));
    let out = verdict("clean", &["-z", "1"]);
    assert_eq!(out.status.code(), Some(2));
    let out = verdict(
        "clean",
        &["-d", "half", "-c", "1", "-a", "1", "-z", "0", "-o", "sum"],
    );
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    assert!(stdout(&out).contains("half"), "the sweep ran in half");
    // CUDA graph launches, as nccl-tests' -G: a count within the suite's bound is taken,
    // one past it is refused before anything runs.
    let out = verdict("clean", &["-G", "10"]);
    assert_eq!(out.status.code(), Some(0), "stderr: {}", stderr(&out));
    let out = verdict("clean", &["-G", "1001"]);
    assert_eq!(out.status.code(), Some(2), "stderr: {}", stderr(&out));
    assert!(
        stderr(&out).contains("suite.ncclSweep.graphLaunches: must be at most 1000 (got 1001)"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn nvlink_errors_that_grow_between_checks_fail_the_second_check_and_the_record_stays() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("counters.json");
    let path = file.to_str().expect("utf-8 path");
    let gate = ["--max-nvlink-error-growth", "1000", "--counters-file", path];
    // First check: nothing to compare against; the counters are recorded.
    let first = verdict("nvlink-growing", &gate);
    assert_eq!(first.status.code(), Some(0), "stderr: {}", stderr(&first));
    let recorded = std::fs::read_to_string(&file).expect("the counters file is written");
    assert!(recorded.contains("\"nvlink\":["), "{recorded}");
    // Second check: GPU 3 added about a million errors a second in between.
    let second = verdict("nvlink-growing", &gate);
    assert_eq!(
        second.status.code(),
        Some(EXIT_NODE_FAILED),
        "stderr: {}",
        stderr(&second)
    );
    let text = stdout(&second);
    assert!(text.contains("NvlinkErrorsGrowing"), "{text}");
    assert!(text.contains("GPU 3 on nvlink-growing"), "{text}");
    // The record of the first check stays, so the next check still sees the growth.
    assert_eq!(std::fs::read_to_string(&file).ok(), Some(recorded));
}

#[test]
fn a_clean_node_keeps_passing_with_a_counters_file_and_a_broken_one_is_replaced() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("counters.json");
    std::fs::write(&file, "not a record").expect("write");
    let path = file.to_str().expect("utf-8 path");
    let gate = ["--max-nvlink-error-growth", "1", "--counters-file", path];
    let first = verdict("clean", &gate);
    assert_eq!(first.status.code(), Some(0), "stderr: {}", stderr(&first));
    assert!(
        stderr(&first).contains("counter growth is not judged this time"),
        "{}",
        stderr(&first)
    );
    let replaced = std::fs::read_to_string(&file).expect("read");
    assert!(replaced.starts_with('{'), "{replaced}");
    let second = verdict("clean", &gate);
    assert_eq!(second.status.code(), Some(0), "stderr: {}", stderr(&second));
}

#[test]
fn a_trend_file_judges_a_node_against_its_own_checks_and_a_drift_fails_nothing() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("trend.json");
    std::fs::write(&file, "not a record").expect("write");
    let path = file.to_str().expect("utf-8 path");
    let gate = ["--trend-file", path];
    // First check: a broken file is said and replaced by this check's numbers.
    let first = verdict("clean", &gate);
    assert_eq!(first.status.code(), Some(0), "stderr: {}", stderr(&first));
    assert!(
        stderr(&first).contains("drift is not judged this time"),
        "{}",
        stderr(&first)
    );
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).expect("the trend file is written"))
            .expect("a JSON record");
    let test = &record["tests"][0];
    assert_eq!(test["test"], "node-check");
    let point = test["points"][0].clone();
    assert!(point["b"].as_f64().is_some_and(|b| b > 0.0), "{record}");
    // Five earlier checks 10% faster on every bandwidth: this check is 9% below them, but
    // for one run only, so no drift yet.
    let faster = |k: f64, t: i64| {
        let mut p = point.clone();
        for key in ["b", "p", "h"] {
            p[key] = serde_json::json!(p[key].as_f64().unwrap_or(0.0) * k);
        }
        p["t"] = serde_json::json!(t);
        p
    };
    let mut earlier: Vec<serde_json::Value> = (0..5).map(|t| faster(1.1, t)).collect();
    let write = |points: &[serde_json::Value]| {
        let mut r = record.clone();
        r["tests"][0]["points"] = serde_json::json!(points);
        std::fs::write(&file, r.to_string()).expect("write");
    };
    write(&earlier);
    let second = verdict("clean", &gate);
    assert_eq!(second.status.code(), Some(0), "stderr: {}", stderr(&second));
    assert!(!stdout(&second).contains("Drifting"), "{}", stdout(&second));
    // Two more checks already below the five: now it has drifted for three runs.
    earlier.extend([faster(1.02, 5), faster(1.01, 6)]);
    write(&earlier);
    let third = verdict("clean", &gate);
    assert_eq!(
        third.status.code(),
        Some(0),
        "a drift fails nothing: {}",
        stderr(&third)
    );
    let text = stdout(&third);
    assert!(text.contains("# Verdict: PASSED (0 critical"), "{text}");
    assert!(
        text.contains("Drifting") && text.contains("is drifting"),
        "{text}"
    );
    // The passing check was added.
    let after: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).expect("read")).expect("JSON");
    assert_eq!(
        after["tests"][0]["points"].as_array().map(Vec::len),
        Some(8)
    );
}
