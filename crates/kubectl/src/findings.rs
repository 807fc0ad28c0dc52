//! `kubectl gpufabric findings [RUN]`: the findings of a run, or of each test's latest run.

use crate::doc::{Doc, Table, wire};
use crate::output::{View, run_name};
use gpufabric_api::{FabricTestRun, Finding, Subject};
use serde::Serialize;

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
}
