//! Every metric family follows one naming scheme, and docs/alerts.md's metrics table lists each
//! family, with its labels, as the operator exports it.
//!
//! The checks read the text exposition after every family has been given a series, so a
//! family registered anywhere is seen, and so are its labels.

use super::*;
use gpufabric_api::findings::{Finding, FindingKind, Metric, Severity, Subject};
use gpufabric_api::run::{FabricTestRunStatus, NodeRunResult, RunProgress};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// The label names a family may carry. A FabricTest is always `test`, a run `run`, a node
/// `node`, a GPU `gpu` (its index on the node, as dcgm-exporter's `gpu`); the others say
/// which of a family's values a series is. A new label is a decision: add it here and to
/// docs/alerts.md.
const LABELS: &[&str] = &[
    "test",
    "run",
    "node",
    "gpu",
    "result",
    "trigger",
    "verdict",
    "controller",
    "action",
    "version",
    "kind",
    "severity",
];

/// Parts of a name that are not Prometheus base units, or that read as another unit than
/// the one meant (`gbps`: gigabits or gigabytes?). Bandwidths are `_bytes_per_second`,
/// durations and times `_seconds`, ratios have no unit.
const NOT_BASE_UNITS: &[&str] = &[
    "gbps",
    "mbps",
    "kbps",
    "gbit",
    "gb",
    "gib",
    "mb",
    "mib",
    "kb",
    "kib",
    "bits",
    "ms",
    "us",
    "ns",
    "millis",
    "milliseconds",
    "microseconds",
    "nanoseconds",
    "minutes",
    "hours",
    "days",
    "percent",
];

/// One family of the text exposition: its type, help and the samples after it.
#[derive(Debug, Default)]
struct Exposed {
    kind: String,
    help: String,
    /// Each sample's name and label names.
    samples: Vec<(String, BTreeSet<String>)>,
}

/// The label names of a sample's `{...}` (label values may hold `,`, `=`, `}` and escaped
/// quotes).
fn label_names(labels: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = labels;
    while let Some((name, after)) = rest.split_once("=\"") {
        names.insert(name.trim_start_matches(',').trim().to_string());
        let mut escaped = false;
        let mut end = after.len();
        for (i, c) in after.char_indices() {
            match (escaped, c) {
                (false, '\\') => escaped = true,
                (false, '"') => {
                    end = i;
                    break;
                }
                _ => escaped = false,
            }
        }
        rest = after.get(end + 1..).unwrap_or("");
    }
    names
}

/// The families of a text exposition, by name.
fn parse(text: &str) -> BTreeMap<String, Exposed> {
    let mut families: BTreeMap<String, Exposed> = BTreeMap::new();
    let mut current = String::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            families.entry(name.to_string()).or_default().help = help.to_string();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            families.entry(name.to_string()).or_default().kind = kind.to_string();
            current = name.to_string();
        } else if line.starts_with('#') || line.is_empty() {
            continue;
        } else {
            let (name, labels) = match line.split_once('{') {
                Some((name, rest)) => (name, label_names(rest)),
                None => (line.split(' ').next().unwrap_or(line), BTreeSet::new()),
            };
            families
                .entry(current.clone())
                .or_default()
                .samples
                .push((name.to_string(), labels));
        }
    }
    families
}

/// What breaks the scheme in a text exposition, one sentence per breach.
fn breaches(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (name, f) in parse(text) {
        let mut breach = |what: String| out.push(format!("{name}: {what}"));
        if !name.starts_with("gpufabric_") {
            breach("does not start with gpufabric_".into());
        }
        if !name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            breach("is not lower snake case".into());
        }
        for part in name.split('_') {
            if NOT_BASE_UNITS.contains(&part) {
                breach(format!(
                    "`_{part}` is not a base unit (bandwidths are _bytes_per_second, durations _seconds)"
                ));
            }
        }
        if f.help.trim_end_matches('.').trim().is_empty() {
            breach("has no HELP".into());
        }
        if f.samples.is_empty() {
            breach("has no series: give it one in exercised() so its labels are checked".into());
        }
        let counter = f.kind == "counter";
        if name.ends_with("_total") {
            breach("the family name ends in _total (prometheus-client adds it to counters)".into());
        }
        for (sample, labels) in &f.samples {
            if counter != sample.ends_with("_total") {
                breach(format!(
                    "{sample}: counters, and only counters, end in _total (this is a {})",
                    f.kind
                ));
            }
            for l in labels {
                let histogram_bucket = f.kind == "histogram" && l == "le";
                if !LABELS.contains(&l.as_str()) && !histogram_bucket {
                    breach(format!(
                        "label `{l}` is none of {LABELS:?} (a FabricTest is `test`, a run `run`, a node `node`, a GPU `gpu`)"
                    ));
                }
            }
            let subject = [
                ("gpufabric_node_", &["node"][..]),
                ("gpufabric_gpu_", &["node", "gpu"][..]),
                ("gpufabric_run_", &["run", "test"][..]),
                ("gpufabric_test_", &["test"][..]),
            ];
            for (prefix, needs) in subject {
                for need in needs {
                    if name.starts_with(prefix) && !labels.contains(*need) {
                        breach(format!("{sample} has no `{need}` label"));
                    }
                }
            }
            if labels.contains("gpu") && !labels.contains("node") {
                breach(format!("{sample}: a `gpu` without its `node`"));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// A FabricTest `nightly` with a schedule, a last run `nightly-1`, a quarantined node, a
/// node with a GPU out of service and an open breaker.
fn test_fixture() -> Arc<FabricTest> {
    let t: FabricTest = serde_json::from_value(json!({
        "apiVersion": "gpufabric.io/v1alpha1",
        "kind": "FabricTest",
        "metadata": {"name": "nightly"},
        "spec": {"nodeSelector": {}},
        "status": {
            "nodes": [
                {"node": "gpu-01", "verdict": "Passed", "consecutiveFailures": 0,
                 "consecutivePasses": 1, "quarantined": false},
                {"node": "gpu-02", "verdict": "Failed", "consecutiveFailures": 2,
                 "consecutivePasses": 0, "quarantined": true},
                {"node": "gpu-03", "verdict": "Failed", "consecutiveFailures": 2,
                 "consecutivePasses": 0, "standing": {"state": "GpusOutOfService", "gpus": [5]},
                 "taintedGpus": [{"gpu": 5, "device": "gpu.nvidia.com/gpu-03/gpu-5",
                                  "rule": "gpufabric-gpu-q9w4z", "reason": "GPU 5 straggles"}]}
            ],
            "quarantinedNodes": ["gpu-02"],
            "quarantinedCount": 1,
            "lastRun": {"name": "nightly-1", "phase": "Succeeded", "trigger": "Manual",
                        "passed": 1, "failed": 1, "errored": 0, "findings": 1,
                        "completionTime": "2026-01-02T00:00:00Z"},
            "lastScheduleTime": "2026-01-01T23:00:00Z",
            "nextScheduleTime": "2026-01-03T00:00:00Z",
            "conditions": [{"type": "BreakerOpen", "status": "True", "reason": "BreakerOpen",
                            "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}]
        }
    }))
    .expect("a FabricTest");
    Arc::new(t)
}

/// The run `nightly-1` of `nightly`, finished, with bandwidths and a GPU-pair finding.
fn run_fixture() -> Arc<FabricTestRun> {
    let mut r: FabricTestRun = serde_json::from_value(json!({
        "apiVersion": "gpufabric.io/v1alpha1",
        "kind": "FabricTestRun",
        "metadata": {"name": "nightly-1",
                     "labels": {gpufabric_api::keys::LABEL_TEST: "nightly"}},
        "spec": {"test": "nightly", "trigger": "Manual"},
    }))
    .expect("a FabricTestRun");
    let completion = serde_json::from_value(json!("2026-01-02T00:00:00Z")).expect("a time");
    let node = |name: &str, bw: f64| NodeRunResult {
        node: name.into(),
        all_reduce_bus_bw_gbps: Some(bw),
        min_pair_gbps: Some(bw / 4.0),
        ..Default::default()
    };
    r.status = Some(FabricTestRunStatus {
        phase: RunPhase::Succeeded,
        completion_time: Some(completion),
        nodes: vec![node("gpu-01", 480.0), node("gpu-02", 300.0)],
        findings: vec![Finding::new(
            FindingKind::Slow,
            Subject::gpu_pair("gpu-02", 0, 3),
            Metric::PairBandwidth,
            Severity::Critical,
            "gpu-02 GPU 0 <-> GPU 3 copies at half the bandwidth of its peers".into(),
        )],
        ..Default::default()
    });
    Arc::new(r)
}

/// The operator's metrics with a series in every family, as /metrics shows them.
fn exercised() -> (Metrics, String) {
    let m = Metrics::new();
    let run = run_fixture();
    m.runs_started
        .get_or_create(&TriggerLabels {
            trigger: "schedule".into(),
        })
        .inc();
    m.run_finished(&run, RunPhase::Succeeded, 1);
    m.nodes_tested
        .get_or_create(&VerdictLabels {
            verdict: "passed".into(),
        })
        .inc();
    m.set_active_pods("nightly-1", 2);
    {
        let _timer = m.reconcile_timer("fabrictest");
    }
    m.reconcile_failed("fabrictest");
    m.quarantine.set_quarantined("nightly", 1);
    m.quarantine.count("nightly", "quarantined");
    m.quarantine.set_repeat_offenders("nightly", 1);
    m.leader.set(1);
    let progress = RunProgress {
        done: 1,
        total: 2,
        wave: 1,
        waves: 1,
        wave_size: 2,
        ..Default::default()
    };
    m.set_run_progress(&run, Some(&progress));
    m.state.set(state::series(&[test_fixture()], &[run]));
    let text = m.encode();
    (m, text)
}

/// The names people query (a counter's with `_total`, an info's with `_info`) and their
/// label names (a histogram's without `le`).
fn queried(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    parse(text)
        .into_iter()
        .map(|(name, f)| {
            let queried = match f.kind.as_str() {
                "counter" => format!("{name}_total"),
                "info" => format!("{name}_info"),
                _ => name,
            };
            let labels = f
                .samples
                .into_iter()
                .flat_map(|(_, labels)| labels)
                .filter(|l| l != "le")
                .collect();
            (queried, labels)
        })
        .collect()
}

/// The metrics of docs/alerts.md's "### Metrics" table: each row's first cell names one or more
/// `` `gpufabric_name{label,label}` ``.
fn readme_table(readme: &str) -> BTreeMap<String, BTreeSet<String>> {
    let section = readme
        .split_once("\n### Metrics\n")
        .map(|(_, s)| s)
        .expect("docs/alerts.md has a ### Metrics section");
    let section = section.split("\n### ").next().unwrap_or(section);
    let mut out = BTreeMap::new();
    for row in section.lines().filter(|l| l.starts_with("| `gpufabric_")) {
        let first_cell = row.split(" | ").next().unwrap_or(row);
        for item in first_cell.split('`').skip(1).step_by(2) {
            let (name, labels) = match item.split_once('{') {
                Some((name, labels)) => (
                    name,
                    labels
                        .trim_end_matches('}')
                        .split(',')
                        .map(|l| l.trim().to_string())
                        .filter(|l| !l.is_empty())
                        .collect(),
                ),
                None => (item, BTreeSet::new()),
            };
            out.insert(name.to_string(), labels);
        }
    }
    out
}

#[test]
fn every_family_follows_the_naming_scheme() {
    let (_m, text) = exercised();
    let breaches = breaches(&text);
    assert!(breaches.is_empty(), "{}\n\n{text}", breaches.join("\n"));
    // The families people alert on are there, in base units.
    for series in [
        r#"gpufabric_node_allreduce_busbw_bytes_per_second{test="nightly",node="gpu-01"} 480000000000.0"#,
        r#"gpufabric_node_worst_pair_bandwidth_bytes_per_second{test="nightly",node="gpu-01"} 120000000000.0"#,
        r#"gpufabric_gpu_findings{test="nightly",node="gpu-02",gpu="3",kind="Slow",severity="Critical"} 1"#,
        r#"gpufabric_quarantined_nodes{test="nightly"} 1"#,
        r#"gpufabric_test_runs_total{test="nightly",result="nodes_failed"} 1"#,
        r#"gpufabric_run_nodes_done{run="nightly-1",test="nightly"} 1"#,
        r#"gpufabric_breaker_open{test="nightly"} 1"#,
    ] {
        assert!(text.contains(series), "no {series} in\n{text}");
    }
}

#[test]
fn one_gauge_counts_a_tests_quarantined_nodes() {
    let (_m, text) = exercised();
    let counting: Vec<String> = parse(&text)
        .into_keys()
        .filter(|name| name.contains("quarantined_nodes"))
        .collect();
    assert_eq!(counting, ["gpufabric_quarantined_nodes"]);
}

/// A test labelled the old way, `name`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NameLabels {
    name: String,
}

#[test]
fn the_scheme_check_refuses_other_units_labels_and_suffixes() {
    let (mut m, _) = exercised();
    let gbps = Family::<state::NodeLabels, FloatGauge>::default();
    gbps.get_or_create(&state::NodeLabels {
        test: "nightly".into(),
        node: "gpu-01".into(),
    })
    .set(480.0);
    m.registry
        .register("gpufabric_foo_gbps", "Bandwidth (GB/s)", gbps);
    let by_name = Family::<NameLabels, Gauge>::default();
    by_name
        .get_or_create(&NameLabels {
            name: "nightly".into(),
        })
        .set(1);
    m.registry
        .register("gpufabric_bar_nodes", "Nodes of a test", by_name);
    let gauge_total = Family::<RunResultLabels, Gauge>::default();
    gauge_total
        .get_or_create(&RunResultLabels {
            test: "nightly".into(),
            result: "passed".into(),
        })
        .set(1);
    m.registry
        .register("gpufabric_baz_runs_total", "Runs", gauge_total);
    let millis = Family::<ControllerLabels, FloatGauge>::default();
    millis
        .get_or_create(&ControllerLabels {
            controller: "fabrictest".into(),
        })
        .set(12.0);
    m.registry.register("gpufabric_qux_duration_ms", "", millis);
    let breaches = breaches(&m.encode()).join("\n");
    for want in [
        "gpufabric_foo_gbps: `_gbps` is not a base unit",
        "gpufabric_bar_nodes: label `name` is none of",
        "gpufabric_baz_runs_total: the family name ends in _total",
        "gpufabric_baz_runs_total: gpufabric_baz_runs_total: counters, and only counters, end in _total (this is a gauge)",
        "gpufabric_qux_duration_ms: `_ms` is not a base unit",
        "gpufabric_qux_duration_ms: has no HELP",
    ] {
        assert!(breaches.contains(want), "no `{want}` in:\n{breaches}");
    }
    assert_eq!(
        breaches
            .lines()
            .filter(|l| l.starts_with("gpufabric_foo")
                || l.starts_with("gpufabric_bar")
                || l.starts_with("gpufabric_baz")
                || l.starts_with("gpufabric_qux"))
            .count(),
        breaches.lines().count(),
        "only the added families break the scheme:\n{breaches}"
    );
}

#[test]
fn readmes_metrics_table_lists_every_family_with_its_labels() {
    let (_m, text) = exercised();
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/alerts.md");
    let readme = std::fs::read_to_string(&path).expect("docs/alerts.md");
    let documented = readme_table(&readme);
    let exported = queried(&text);
    let only_in_readme: Vec<_> = documented
        .iter()
        .filter(|(name, labels)| exported.get(*name) != Some(labels))
        .collect();
    let only_exported: Vec<_> = exported
        .iter()
        .filter(|(name, labels)| documented.get(*name) != Some(labels))
        .collect();
    assert!(
        only_in_readme.is_empty() && only_exported.is_empty(),
        "docs/alerts.md's metrics table and /metrics differ.\ndocs/alerts.md only: {only_in_readme:?}\n/metrics only: {only_exported:?}"
    );
}

#[test]
fn label_names_read_through_quoted_values() {
    assert_eq!(
        label_names(r#"test="a,b=\"c\"}",node="n"} 1"#),
        ["node", "test"].map(String::from).into_iter().collect()
    );
}
