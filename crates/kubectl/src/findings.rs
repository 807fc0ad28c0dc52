//! `kubectl gpufabric findings [RUN]`: the findings of a run, or of each test's latest run.

use crate::doc::{Doc, Table, wire};
use crate::output::{View, run_name};
use gpufabric_api::{FabricTest, FabricTestRun, Finding, Subject};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};

/// A finding and the run that made it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunFinding {
    pub run: String,
    pub test: String,
    #[serde(flatten)]
    pub finding: Finding,
}

/// The findings of some runs; `unlisted` counts those a run's status leaves out (it lists
/// 100 at most).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Findings {
    pub findings: Vec<RunFinding>,
    pub unlisted: u32,
}

/// What a finding is about, short: `gpu 3`, `gpu 2<->5`, `<-> peer`, a NIC port, `node`.
pub fn subject(s: &Subject) -> String {
    match s {
        Subject::GpuPair { a, b, .. } => format!("gpu {a}<->{b}"),
        Subject::Gpu { gpu, .. } => format!("gpu {gpu}"),
        Subject::NodePair { b, .. } => format!("<-> {b}"),
        Subject::Nic { port, .. } => port.clone(),
        Subject::Node { .. } => "node".into(),
    }
}

/// Whether a finding names `node` (also as the second node of a pair).
pub fn names_node(f: &Finding, node: &str) -> bool {
    match &f.subject {
        Subject::NodePair { a, b } => a == node || b == node,
        s => s.node_name() == node,
    }
}

impl Findings {
    pub fn of(runs: &[FabricTestRun]) -> Findings {
        let mut findings = Vec::new();
        let mut unlisted = 0;
        for r in runs {
            let Some(st) = r.status.as_ref() else {
                continue;
            };
            let run = r.metadata.name.clone().unwrap_or_default();
            unlisted += st.finding_count.saturating_sub(st.findings.len() as u32);
            findings.extend(st.findings.iter().map(|f| RunFinding {
                run: run.clone(),
                test: r.spec.test.clone(),
                finding: f.clone(),
            }));
        }
        Findings { findings, unlisted }
    }
}

/// The runs that hold the findings of `tests` now: each test's latest run, and the run that
/// last judged each of its failing or quarantined nodes (a later targeted run of other
/// nodes does not hide them). Sorted, no repeats.
pub fn runs_to_read(tests: &[FabricTest]) -> Vec<String> {
    let mut names = BTreeSet::new();
    for s in tests.iter().filter_map(|t| t.status.as_ref()) {
        names.extend(s.last_run.as_ref().map(|l| l.name.clone()));
        names.extend(
            s.nodes
                .iter()
                .filter(|h| h.standing.is_quarantined() || h.verdict.is_bad())
                .filter_map(|h| h.last_run.clone()),
        );
    }
    names.into_iter().collect()
}

impl Findings {
    /// The findings of `tests` now, from `runs` (those [`runs_to_read`] names): all of each
    /// test's latest run, and from an earlier run only those of the nodes it last judged that
    /// are failing or quarantined.
    pub fn of_tests(tests: &[FabricTest], runs: &[FabricTestRun]) -> Findings {
        let by_name: BTreeMap<&str, &FabricTestRun> = runs
            .iter()
            .filter_map(|r| Some((r.metadata.name.as_deref()?, r)))
            .collect();
        let mut out = Findings {
            findings: Vec::new(),
            unlisted: 0,
        };
        for s in tests.iter().filter_map(|t| t.status.as_ref()) {
            let latest = s.last_run.as_ref().map(|l| l.name.as_str());
            if let Some(r) = latest.and_then(|n| by_name.get(n)) {
                let f = Findings::of(&[(*r).clone()]);
                out.findings.extend(f.findings);
                out.unlisted += f.unlisted;
            }
            let mut earlier: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
            for h in s
                .nodes
                .iter()
                .filter(|h| h.standing.is_quarantined() || h.verdict.is_bad())
            {
                if let Some(run) = h.last_run.as_deref().filter(|r| Some(*r) != latest) {
                    earlier.entry(run).or_default().push(h.node.as_str());
                }
            }
            for (run, nodes) in earlier {
                let Some(r) = by_name.get(run) else {
                    continue;
                };
                let f = Findings::of(&[(*r).clone()]);
                out.findings.extend(
                    f.findings
                        .into_iter()
                        .filter(|f| nodes.iter().any(|n| names_node(&f.finding, n))),
                );
            }
        }
        out
    }
}

impl View for Findings {
    /// The runs the findings are of, once each.
    fn names(&self) -> Vec<String> {
        let mut runs: Vec<String> = self.findings.iter().map(|f| run_name(&f.run)).collect();
        runs.dedup();
        runs
    }

    /// The table with the test, the metric, and what was measured against what was expected.
    fn wide(&self) -> Doc {
        let mut t = Table::new(&[
            "RUN", "TEST", "NODE", "SUBJECT", "KIND", "SEVERITY", "METRIC", "MEASURED", "EXPECTED",
            "UNIT", "MESSAGE",
        ]);
        let num = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v}"));
        for f in &self.findings {
            t.push(vec![
                f.run.clone(),
                f.test.clone(),
                f.finding.subject.node_name().to_string(),
                subject(&f.finding.subject),
                wire(&f.finding.kind),
                wire(&f.finding.severity),
                wire(&f.finding.metric),
                num(f.finding.measured),
                num(f.finding.expected),
                f.finding.unit.clone().unwrap_or_else(|| "-".into()),
                f.finding.message.clone(),
            ]);
        }
        let mut doc = Doc::default();
        doc.table(t);
        doc
    }

    fn doc(&self) -> Doc {
        let mut t = Table::new(&["RUN", "NODE", "SUBJECT", "KIND", "SEVERITY", "MESSAGE"]);
        for f in &self.findings {
            t.push(vec![
                f.run.clone(),
                f.finding.subject.node_name().to_string(),
                subject(&f.finding.subject),
                wire(&f.finding.kind),
                wire(&f.finding.severity),
                f.finding.message.clone(),
            ]);
        }
        let mut doc = Doc::default();
        doc.table(t);
        if self.unlisted > 0 {
            doc.line(format!(
                "{} more finding(s) not listed in the runs' status (it lists 100 at most)",
                self.unlisted
            ));
        }
        doc
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use crate::output::{Format, render};

    #[test]
    fn the_table_names_node_subject_kind_severity_and_message() {
        let text = render(&Findings::of(&[fixtures::run()]), &Format::Table).expect("text");
        assert!(
            text.starts_with("RUN               NODE     SUBJECT      KIND  SEVERITY  MESSAGE\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "nightly-manual-1  h100-03  gpu 2<->5    Slow  Critical  GPU pair 2-5 copies at 95 GB/s"
            ),
            "{text}"
        );
        assert!(text.contains("h100-05  <-> h200-02  Slow  Info"), "{text}");
        assert!(text.contains("1 more finding(s) not listed"), "{text}");
    }

    #[test]
    fn json_and_yaml_keep_each_finding_whole_beside_its_run() {
        let f = Findings::of(&[fixtures::run()]);
        let json: serde_json::Value =
            serde_json::from_str(&render(&f, &Format::Json).expect("json")).expect("parses");
        let first = &json["findings"][0];
        assert_eq!(first["run"], "nightly-manual-1");
        assert_eq!(first["test"], "nightly");
        assert_eq!(first["severity"], "Critical");
        assert_eq!(first["subject"]["peerGpu"], 5);
        assert_eq!(first["measured"], 95.0);
        assert_eq!(json["unlisted"], 1);
        let yaml: serde_json::Value =
            serde_yaml::from_str(&render(&f, &Format::Yaml).expect("yaml")).expect("parses");
        assert_eq!(yaml, json);
    }

    #[test]
    fn a_node_pair_finding_names_both_nodes() {
        let run = fixtures::run();
        let pair = &run.status.as_ref().expect("status").findings[1];
        assert!(names_node(pair, "h100-05") && names_node(pair, "h200-02"));
        assert!(!names_node(pair, "h100-03"));
        assert!(Findings::of(&[]).findings.is_empty());
    }

    #[test]
    fn a_later_targeted_run_does_not_hide_the_findings_of_a_failing_node() {
        let failed = fixtures::run();
        let failed_name = failed.metadata.name.clone().expect("a name");
        let mut targeted = failed.clone();
        targeted.metadata.name = Some("nightly-t1-abc".into());
        if let Some(st) = targeted.status.as_mut() {
            st.findings.clear();
            st.finding_count = 0;
        }
        let test: FabricTest = serde_json::from_value(serde_json::json!({
            "apiVersion": "gpufabric.io/v1alpha1", "kind": "FabricTest",
            "metadata": {"name": "nightly"}, "spec": {},
            "status": {
                "lastRun": {"name": "nightly-t1-abc", "trigger": "Targeted", "phase": "Succeeded",
                    "passed": 1, "failed": 0, "errored": 0, "findings": 0},
                "nodes": [
                    {"node": "h100-03", "verdict": "Failed", "consecutiveFailures": 2,
                     "consecutivePasses": 0, "quarantined": true, "lastRun": failed_name},
                    {"node": "h100-01", "verdict": "Passed", "consecutiveFailures": 0,
                     "consecutivePasses": 1, "lastRun": failed_name}
                ]
            }
        }))
        .expect("a test");
        let tests = [test];
        assert_eq!(
            runs_to_read(&tests),
            [failed_name.clone(), "nightly-t1-abc".to_string()]
        );
        let f = Findings::of_tests(&tests, &[failed, targeted]);
        assert!(
            !f.findings.is_empty(),
            "the failing node's findings are shown"
        );
        assert!(
            f.findings
                .iter()
                .all(|f| f.run == failed_name && names_node(&f.finding, "h100-03")),
            "{f:?}"
        );
    }
}
