//! Metrics read from the API state at scrape time (FabricTest status and the runs it
//! names), so that they are the same on every replica and survive a restart: per node the
//! last result, peak all_reduce busbw and worst GPU-pair bandwidth (bytes per second); per
//! GPU the findings of the latest run and whether the test holds it out of service with a
//! DRA device taint; per test the last and next run, the last successful
//! run, and whether its breaker is open. Labels `test` (the cluster-scoped FabricTest),
//! `node` (the node's name) and `gpu` (the GPU's index on the node, as dcgm-exporter's
//! `gpu`).

use gpufabric_api::findings::{Finding, Subject};
use gpufabric_api::run::{FabricTestRun, RunPhase};
use gpufabric_api::standing::Standing;
use gpufabric_api::test::FabricTest;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use prometheus_client::encoding::EncodeLabelSet;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// One gigabyte per second (the unit of the run status' bandwidths) in bytes per second.
const BYTES_PER_SECOND_IN_GBPS: f64 = 1e9;

/// `{test}`: a FabricTest.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct TestLabels {
    pub test: String,
}

/// `{test, node}`: a node as a FabricTest saw it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct NodeLabels {
    pub test: String,
    pub node: String,
}

/// `{test, node, result}`: one of a node's possible last results.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct NodeResultLabels {
    pub test: String,
    pub node: String,
    pub result: String,
}

/// `{test, node, gpu, kind, severity}`: findings of one kind about one GPU of a node. `gpu`
/// is the GPU's index on the node, as a string (dcgm-exporter's `gpu`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct GpuFindingLabels {
    pub test: String,
    pub node: String,
    pub gpu: String,
    pub kind: String,
    pub severity: String,
}

/// `{test, node, gpu}`: one GPU of a node as a FabricTest saw it (`gpu`: its index on the
/// node, as a string).
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct GpuLabels {
    pub test: String,
    pub node: String,
    pub gpu: String,
}

/// Every state series at one instant.
#[derive(Debug, Default, PartialEq)]
pub struct StateSeries {
    /// One-hot: 1 for the node's last result, 0 for the other three.
    pub node_result: Vec<(NodeResultLabels, i64)>,
    /// Peak all_reduce bus bandwidth of the node in the test's last run (bytes per second).
    pub node_busbw_bytes_per_second: Vec<(NodeLabels, f64)>,
    /// Lowest GPU-pair copy bandwidth of the node in the last run (bytes per second).
    pub node_worst_pair_bytes_per_second: Vec<(NodeLabels, f64)>,
    /// 1 for each node the test holds in quarantine.
    pub node_quarantined: Vec<(NodeLabels, i64)>,
    /// Findings of the test's last run about each GPU, by kind and severity (a GPU pair's
    /// finding counts for both GPUs), as the run status lists them.
    pub gpu_findings: Vec<(GpuFindingLabels, i64)>,
    /// 1 for each GPU the test holds out of service with a DRA device taint.
    pub gpu_quarantined: Vec<(GpuLabels, i64)>,
    pub last_run_seconds: Vec<(TestLabels, f64)>,
    pub last_success_seconds: Vec<(TestLabels, f64)>,
    pub next_run_seconds: Vec<(TestLabels, f64)>,
    /// 1 while the test's breaker is open (its `BreakerOpen` condition is True), else 0.
    pub breaker_open: Vec<(TestLabels, i64)>,
}

fn seconds(t: &Time) -> f64 {
    t.0.as_millisecond() as f64 / 1000.0
}

fn run_end(run: &FabricTestRun) -> Option<&Time> {
    let s = run.status.as_ref()?;
    s.completion_time.as_ref().or(s.start_time.as_ref())
}

/// The series of `tests`, with the runs in `runs` (matched by the test label).
pub fn series(tests: &[Arc<FabricTest>], runs: &[Arc<FabricTestRun>]) -> StateSeries {
    let mut by_name: HashMap<String, &FabricTestRun> = HashMap::new();
    let mut last_success: HashMap<String, f64> = HashMap::new();
    for run in runs {
        by_name.insert(run.name_any(), run);
        let Some(test) = run.labels().get(gpufabric_api::keys::LABEL_TEST) else {
            continue;
        };
        let succeeded = run
            .status
            .as_ref()
            .is_some_and(|s| s.phase == RunPhase::Succeeded);
        if let (true, Some(t)) = (succeeded, run_end(run)) {
            let e = last_success.entry(test.clone()).or_insert(0.0);
            *e = e.max(seconds(t));
        }
    }
    let mut out = StateSeries::default();
    for test in tests {
        let test_labels = TestLabels {
            test: test.name_any(),
        };
        if let Some(t) = last_success.get(&test_labels.test) {
            out.last_success_seconds.push((test_labels.clone(), *t));
        }
        let Some(status) = test.status.as_ref() else {
            continue;
        };
        if let Some(t) = &status.next_schedule_time {
            out.next_run_seconds.push((test_labels.clone(), seconds(t)));
        }
        let last_run = status.last_run.as_ref();
        let last_time = last_run
            .and_then(|r| r.completion_time.as_ref())
            .or(status.last_schedule_time.as_ref());
        if let Some(t) = last_time {
            out.last_run_seconds.push((test_labels.clone(), seconds(t)));
        }
        let breaker_open = crate::quarantine::Breaker::from_conditions(&status.conditions).open;
        out.breaker_open
            .push((test_labels.clone(), i64::from(breaker_open)));
        let node_labels = |node: &str| NodeLabels {
            test: test_labels.test.clone(),
            node: node.to_string(),
        };
        for health in &status.nodes {
            // The node's standing says; nothing is judged here.
            let result = health.standing.metric();
            for r in Standing::METRIC_VALUES {
                let l = NodeResultLabels {
                    test: test_labels.test.clone(),
                    node: health.node.clone(),
                    result: r.into(),
                };
                out.node_result.push((l, i64::from(r == result)));
            }
            for g in &health.tainted_gpus {
                let l = GpuLabels {
                    test: test_labels.test.clone(),
                    node: health.node.clone(),
                    gpu: g.gpu.to_string(),
                };
                out.gpu_quarantined.push((l, 1));
            }
        }
        for node in &status.quarantined_nodes {
            out.node_quarantined.push((node_labels(node), 1));
        }
        let run_status = last_run
            .and_then(|r| by_name.get(&r.name))
            .and_then(|r| r.status.as_ref());
        for n in run_status.map_or(&[][..], |s| &s.nodes[..]) {
            if let Some(v) = n.all_reduce_bus_bw_gbps {
                out.node_busbw_bytes_per_second
                    .push((node_labels(&n.node), v * BYTES_PER_SECOND_IN_GBPS));
            }
            if let Some(v) = n.min_pair_gbps {
                out.node_worst_pair_bytes_per_second
                    .push((node_labels(&n.node), v * BYTES_PER_SECOND_IN_GBPS));
            }
        }
        let findings = run_status.map_or(&[][..], |s| &s.findings[..]);
        out.gpu_findings
            .extend(gpu_findings(&test_labels.test, findings));
    }
    out
}

/// The findings about GPUs, counted per GPU, kind and severity; a GPU pair's finding counts
/// for both of its GPUs. Kind and severity are named as in the run status.
fn gpu_findings(test: &str, findings: &[Finding]) -> Vec<(GpuFindingLabels, i64)> {
    let mut counts: BTreeMap<GpuFindingLabels, i64> = BTreeMap::new();
    for f in findings {
        let gpus = match &f.subject {
            Subject::Gpu { node, gpu } => vec![(node, *gpu)],
            Subject::GpuPair { node, a, b } => vec![(node, *a), (node, *b)],
            _ => continue,
        };
        for (node, gpu) in gpus {
            let l = GpuFindingLabels {
                test: test.to_string(),
                node: node.clone(),
                gpu: gpu.to_string(),
                kind: wire_name(&f.kind),
                severity: wire_name(&f.severity),
            };
            *counts.entry(l).or_insert(0) += 1;
        }
    }
    counts.into_iter().collect()
}

/// A unit enum's name on the wire (`Slow`, `Critical`), as `kubectl get ftr -o yaml` shows it.
fn wire_name<T: serde::Serialize + std::fmt::Debug>(v: &T) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        _ => format!("{v:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufabric_api::run::NodeRunResult;
    use serde_json::json;

    fn time(s: &str) -> Time {
        serde_json::from_value(json!(s)).expect("time")
    }

    fn test_with(status: serde_json::Value) -> Arc<FabricTest> {
        let mut t: FabricTest = serde_json::from_value(json!({
            "apiVersion": "gpufabric.io/v1alpha1",
            "kind": "FabricTest",
            "metadata": {"name": "nightly"},
            "spec": {"nodeSelector": {}},
        }))
        .expect("test");
        t.status = Some(serde_json::from_value(status).expect("status"));
        Arc::new(t)
    }

    fn run(name: &str, phase: &str, done: &str, nodes: Vec<NodeRunResult>) -> Arc<FabricTestRun> {
        let mut r: FabricTestRun = serde_json::from_value(json!({
            "apiVersion": "gpufabric.io/v1alpha1",
            "kind": "FabricTestRun",
            "metadata": {"name": name,
                         "labels": {gpufabric_api::keys::LABEL_TEST: "nightly"}},
            "spec": {"test": "nightly", "trigger": "Manual"},
        }))
        .expect("run");
        let s = gpufabric_api::run::FabricTestRunStatus {
            phase: serde_json::from_value(json!(phase)).expect("phase"),
            completion_time: Some(time(done)),
            nodes,
            ..Default::default()
        };
        r.status = Some(s);
        Arc::new(r)
    }

    #[test]
    fn node_results_are_one_hot_and_confirmed_failures_are_fail() {
        let t = test_with(json!({
            "nodes": [
                {"node": "a", "verdict": "Passed", "consecutiveFailures": 0, "consecutivePasses": 3, "quarantined": false, "standing": {"state": "Passing"}},
                {"node": "b", "verdict": "Failed", "consecutiveFailures": 1, "consecutivePasses": 0, "quarantined": false, "standing": {"state": "Suspect"}},
                {"node": "c", "verdict": "Failed", "consecutiveFailures": 2, "consecutivePasses": 0, "quarantined": true, "standing": {"state": "Quarantined"}},
                {"node": "d", "verdict": "NotMeasured", "consecutiveFailures": 0, "consecutivePasses": 0, "quarantined": false}
            ],
            "quarantinedNodes": ["c"],
            "quarantinedCount": 1
        }));
        let s = series(&[t], &[]);
        let on: Vec<(String, String)> = s
            .node_result
            .iter()
            .filter(|(_, v)| *v == 1)
            .map(|(l, _)| (l.node.clone(), l.result.clone()))
            .collect();
        assert_eq!(
            on,
            [
                ("a", "pass"),
                ("b", "suspect"),
                ("c", "fail"),
                ("d", "not_measured")
            ]
            .map(|(n, r)| (n.to_string(), r.to_string()))
        );
        assert_eq!(s.node_result.len(), 16, "four results per node");
        assert_eq!(s.node_quarantined.len(), 1);
        assert_eq!(s.node_quarantined[0].0.node, "c");
        assert_eq!(s.breaker_open[0].1, 0, "no BreakerOpen condition: closed");
    }

    #[test]
    fn each_gpu_out_of_service_is_one_series_and_its_node_reads_pass() {
        let t = test_with(json!({
            "nodes": [
                {"node": "dra-01", "verdict": "Failed", "consecutiveFailures": 2,
                 "consecutivePasses": 0,
                 "standing": {"state": "GpusOutOfService", "gpus": [3, 6]},
                 "taintedGpus": [
                    {"gpu": 3, "device": "gpu.nvidia.com/dra-01/gpu-3", "rule": "gpufabric-gpu-x7k2p",
                     "reason": "GPU 3 computes a step 1.5x slower", "since": "2026-01-02T00:00:00Z"},
                    {"gpu": 6, "device": "gpu.nvidia.com/dra-01/gpu-6", "rule": "gpufabric-gpu-b2c4d",
                     "reason": "GPU 6 memory bandwidth 38% under its peers"}
                 ]},
                {"node": "good-01", "verdict": "Passed", "consecutiveFailures": 0,
                 "consecutivePasses": 1, "standing": {"state": "Passing"}}
            ]
        }));
        let s = series(&[t], &[]);
        let gpus: Vec<(&str, &str, i64)> = s
            .gpu_quarantined
            .iter()
            .map(|(l, v)| (l.node.as_str(), l.gpu.as_str(), *v))
            .collect();
        assert_eq!(gpus, [("dra-01", "3", 1), ("dra-01", "6", 1)]);
        assert!(s.node_quarantined.is_empty(), "the node is not held");
        let fail = s
            .node_result
            .iter()
            .find(|(l, _)| l.node == "dra-01" && l.result == "fail")
            .map(|(_, v)| *v);
        assert_eq!(fail, Some(0));
    }

    #[test]
    fn a_node_quarantined_for_a_hardware_fault_reads_fail_not_not_measured() {
        let t = test_with(json!({
            "nodes": [
                {"node": "lost-gpu", "verdict": "Errored", "consecutiveFailures": 2, "consecutivePasses": 0, "quarantined": true, "standing": {"state": "Quarantined", "hardware": true}},
                {"node": "hung", "verdict": "Timeout", "consecutiveFailures": 2, "consecutivePasses": 0, "quarantined": true, "standing": {"state": "Quarantined", "hardware": true}},
                {"node": "once", "verdict": "Errored", "consecutiveFailures": 1, "consecutivePasses": 0, "quarantined": false, "standing": {"state": "Suspect"}},
                {"node": "held", "verdict": "Timeout", "consecutiveFailures": 2, "consecutivePasses": 0, "quarantined": false, "heldBack": "budget", "standing": {"state": "HeldBack", "why": "budget", "hardware": true}},
                {"node": "cordoned-unmeasured", "verdict": "NotMeasured", "consecutiveFailures": 2, "consecutivePasses": 0, "quarantined": true, "standing": {"state": "Quarantined"}}
            ],
            "quarantinedNodes": ["lost-gpu", "hung", "cordoned-unmeasured"],
            "quarantinedCount": 3
        }));
        let s = series(&[t], &[]);
        let on: Vec<(String, String)> = s
            .node_result
            .iter()
            .filter(|(_, v)| *v == 1)
            .map(|(l, _)| (l.node.clone(), l.result.clone()))
            .collect();
        assert_eq!(
            on,
            [
                ("lost-gpu", "fail"),
                ("hung", "fail"),
                ("once", "suspect"),
                ("held", "fail"),
                ("cordoned-unmeasured", "fail")
            ]
            .map(|(n, r)| (n.to_string(), r.to_string()))
        );
    }

    #[test]
    fn the_breaker_series_follows_the_condition_so_it_survives_a_restart() {
        let condition = |status: &str| {
            json!({"conditions": [{"type": "BreakerOpen", "status": status, "reason": "BreakerOpen",
                "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}]})
        };
        let s = series(&[test_with(condition("True"))], &[]);
        assert_eq!(s.breaker_open.len(), 1);
        assert_eq!(s.breaker_open[0].0.test, "nightly");
        assert_eq!(s.breaker_open[0].1, 1);
        let s = series(&[test_with(condition("False"))], &[]);
        assert_eq!(s.breaker_open[0].1, 0);
    }

    #[test]
    fn gpu_findings_of_the_last_run_are_counted_per_gpu_and_a_pair_counts_for_both() {
        use gpufabric_api::findings::{FindingKind, Metric, Severity};
        let t = test_with(json!({
            "lastRun": {"name": "r2", "phase": "Succeeded", "trigger": "Manual",
                        "passed": 0, "failed": 1, "errored": 0, "findings": 4,
                        "completionTime": "2026-01-02T00:00:00Z"}
        }));
        let finding = |kind, subject, severity| {
            Finding::new(kind, subject, Metric::PairBandwidth, severity, "m".into())
        };
        let with_findings = |name: &str, findings: Vec<Finding>| {
            let mut r = run(name, "Succeeded", "2026-01-02T00:00:00Z", vec![]);
            if let Some(s) = Arc::make_mut(&mut r).status.as_mut() {
                s.findings = findings;
            }
            r
        };
        let runs = [
            with_findings(
                "r1",
                vec![finding(
                    FindingKind::Xid,
                    Subject::gpu("a", 7),
                    Severity::Critical,
                )],
            ),
            with_findings(
                "r2",
                vec![
                    finding(
                        FindingKind::Slow,
                        Subject::gpu_pair("a", 0, 3),
                        Severity::Critical,
                    ),
                    finding(
                        FindingKind::Slow,
                        Subject::gpu_pair("a", 3, 5),
                        Severity::Critical,
                    ),
                    finding(FindingKind::Thermal, Subject::gpu("a", 3), Severity::Info),
                    finding(
                        FindingKind::NicDown,
                        Subject::nic("a", "mlx5_0 port 1"),
                        Severity::Critical,
                    ),
                    finding(FindingKind::Slow, Subject::node("b"), Severity::Critical),
                ],
            ),
        ];
        let s = series(&[t], &runs);
        let got: Vec<(&str, &str, &str, &str, i64)> = s
            .gpu_findings
            .iter()
            .map(|(l, v)| {
                assert_eq!(l.test, "nightly");
                (
                    l.node.as_str(),
                    l.gpu.as_str(),
                    l.kind.as_str(),
                    l.severity.as_str(),
                    *v,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("a", "0", "Slow", "Critical", 1),
                ("a", "3", "Slow", "Critical", 2),
                ("a", "3", "Thermal", "Info", 1),
                ("a", "5", "Slow", "Critical", 1),
            ],
            "only the last run's GPU and GPU-pair findings; not r1's GPU 7, the NIC or the node"
        );
    }

    #[test]
    fn bandwidth_comes_from_the_last_run_and_success_from_the_newest_succeeded_run() {
        let t = test_with(json!({
            "lastRun": {"name": "r2", "phase": "Succeeded", "trigger": "Manual",
                        "passed": 1, "failed": 0, "errored": 0, "findings": 0,
                        "completionTime": "2026-01-02T00:00:00Z"},
            "nextScheduleTime": "2026-01-03T00:00:00Z"
        }));
        let node = |bw: f64| NodeRunResult {
            node: "a".into(),
            all_reduce_bus_bw_gbps: Some(bw),
            min_pair_gbps: Some(bw / 2.0),
            ..Default::default()
        };
        let runs = [
            run("r1", "Succeeded", "2026-01-01T00:00:00Z", vec![node(100.0)]),
            run("r2", "Succeeded", "2026-01-02T00:00:00Z", vec![node(400.0)]),
            run("r3", "Failed", "2026-01-02T12:00:00Z", vec![node(1.0)]),
        ];
        let s = series(&[t], &runs);
        assert_eq!(s.node_busbw_bytes_per_second.len(), 1);
        assert_eq!(
            s.node_busbw_bytes_per_second[0].1, 400e9,
            "400 GB/s in bytes/s"
        );
        assert_eq!(s.node_worst_pair_bytes_per_second[0].1, 200e9);
        assert_eq!(s.last_success_seconds[0].1, 1_767_312_000.0);
        assert_eq!(s.last_run_seconds[0].1, 1_767_312_000.0);
        assert_eq!(s.next_run_seconds[0].1, 1_767_398_400.0);
    }
}
