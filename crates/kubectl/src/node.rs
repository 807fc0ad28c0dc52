//! `kubectl gpufabric node NODE`: a node's history in every FabricTest, its quarantine
//! record, the gate and repair marks on it, the findings of the latest runs that name it,
//! and why each test does or does not act on it.

use crate::doc::{Doc, Table, wire};
use crate::findings::{RunFinding, names_node, subject};
use crate::output::View;
use crate::status::Breaker;
use gpufabric_api::quarantine::QuarantineRecord;
use gpufabric_api::standing::Standing;
use gpufabric_api::test::{NodeHealth, NodeTarget};
use gpufabric_api::trend::{NodeTrend, TestTrend, TrendMetric};
use gpufabric_api::{FabricTest, FabricTestRun, keys};
use k8s_openapi::api::core::v1::Node;
use serde::Serialize;

/// The node's entry in one FabricTest.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TestEntry {
    pub test: String,
    /// Its history in the test's `status.nodes`.
    pub health: NodeHealth,
    /// Waiting for a targeted run of the test, and why.
    pub target: Option<NodeTarget>,
    /// Whether the test acts on the node, and why (or why not), as a sentence.
    pub acted_on: String,
}

/// What `node` shows.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeView {
    pub node: String,
    pub cordoned: bool,
    /// The gpufabric taints on it (`key=value:effect`).
    pub taints: Vec<String>,
    /// The `gpufabric.io/result` label: pass, suspect or fail.
    pub result: Option<String>,
    /// The quarantine record (`gpufabric.io/quarantine`), parsed.
    pub quarantine: Option<QuarantineRecord>,
    /// Why the annotation is there but is no record.
    pub quarantine_error: Option<String>,
    /// `gpufabric.io/repaired`: marked back from repair, not yet measured.
    pub repaired: Option<String>,
    /// `gpufabric.io/gated`: the test that put the validation gate on it when it joined.
    pub gated: Option<String>,
    pub last_pass: Option<String>,
    pub tests: Vec<TestEntry>,
    /// The findings that name the node in each test's latest run that tested it.
    pub findings: Vec<RunFinding>,
    /// Its key numbers over its last runs of each test (`gpufabric.io/trend`), oldest
    /// first.
    pub trend: Vec<TestTrend>,
    /// Why the trend annotation is there but is no record.
    pub trend_error: Option<String>,
    /// Its GPUs the tests took out of service with DRA device taints.
    pub gpus_out_of_service: Vec<crate::gpus_out::GpuOut>,
}

/// Why `test` does or does not act on the node of entry `h`: what its standing says, with
/// what moves it next under the test's policy.
pub fn acted_on(test: &FabricTest, h: &NodeHealth, breaker: &Breaker) -> String {
    let policy = &test.spec.quarantine;
    let since = h
        .quarantined_since
        .as_ref()
        .map(|t| format!(" since {}", t.0))
        .unwrap_or_default();
    let mut why = match &h.standing {
        Standing::RepeatOffender => format!(
            "quarantined{since}, a repeat offender: passing runs no longer release it, a repair ({}) does",
            keys::ANNOTATION_REPAIRED
        ),
        Standing::Quarantined { .. } => format!(
            "quarantined{since}: released after {} passing run(s) in a row, or one pass after a repair ({})",
            policy.passes_to_release,
            keys::ANNOTATION_REPAIRED
        ),
        Standing::HeldBack { why, .. } => format!("not acted on: {why}"),
        Standing::TakenBack { what } => format!(
            "not acted on: someone else took the quarantine back ({what}{}); what is on the node is theirs",
            h.taken_back
                .as_ref()
                .map(|t| format!(", {}", t.at.0))
                .unwrap_or_default()
        ),
        Standing::Suspect | Standing::Failing { .. } => format!(
            "{} ({} run(s) in a row): quarantined ({:?}) after {} in a row{}",
            h.standing,
            h.consecutive_failures,
            policy.mode,
            policy.failures_to_quarantine,
            if policy.confirm_retest {
                ", confirmed by a retest"
            } else {
                ""
            }
        ),
        Standing::Passing => "passing: nothing to do".to_string(),
        Standing::GpusOutOfService { .. } => {
            "not held: it stays schedulable for its other GPUs".to_string()
        }
        Standing::Gated => h.standing.to_string(),
        Standing::NotMeasured => format!(
            "not measured ({}): never held against the node",
            h.verdict.name()
        ),
    };
    if !h.tainted_gpus.is_empty() {
        let gpus: Vec<String> = h
            .tainted_gpus
            .iter()
            .map(crate::gpus_out::sentence)
            .collect();
        why = format!(
            "GPUs out of service by DRA device taints: {}; each released after {} passing run(s) in a row; the node itself: {why}",
            gpus.join("; "),
            policy.passes_to_release
        );
    }
    if breaker.open {
        why.push_str(&format!(
            "; the breaker of {} is open: it quarantines and releases no node",
            test.metadata.name.as_deref().unwrap_or_default()
        ));
    }
    why
}

impl NodeView {
    /// The view of `node`, from every FabricTest and the latest run of each that tested it.
    pub fn of(node: &Node, tests: &[FabricTest], runs: &[FabricTestRun]) -> NodeView {
        let name = node.metadata.name.clone().unwrap_or_default();
        let annotations = node.metadata.annotations.clone().unwrap_or_default();
        let (quarantine, quarantine_error) =
            match QuarantineRecord::from_annotations(Some(&annotations)) {
                Ok(r) => (r, None),
                Err(e) => (None, Some(e.to_string())),
            };
        let taints = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|t| t.key.starts_with("gpufabric.io/"))
            .map(|t| {
                format!(
                    "{}={}:{}",
                    t.key,
                    t.value.clone().unwrap_or_default(),
                    t.effect
                )
            })
            .collect();
        let mut entries = Vec::new();
        let mut findings = Vec::new();
        let mut sorted: Vec<&FabricTest> = tests.iter().collect();
        sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        for t in sorted {
            let Some(st) = t.status.as_ref() else {
                continue;
            };
            let Some(h) = st.nodes.iter().find(|h| h.node == name) else {
                continue;
            };
            let breaker = Breaker::of(t);
            entries.push(TestEntry {
                test: t.metadata.name.clone().unwrap_or_default(),
                health: h.clone(),
                target: st.targets.iter().find(|x| x.node == name).cloned(),
                acted_on: acted_on(t, h, &breaker),
            });
            let Some(last) = &h.last_run else {
                continue;
            };
            let Some(run) = runs
                .iter()
                .find(|r| r.metadata.name.as_deref() == Some(last.as_str()))
            else {
                continue;
            };
            for f in run
                .status
                .iter()
                .flat_map(|s| &s.findings)
                .filter(|f| names_node(f, &name))
            {
                findings.push(RunFinding {
                    run: last.clone(),
                    test: run.spec.test.clone(),
                    finding: f.clone(),
                });
            }
        }
        let (trend, trend_error) = match annotations.get(keys::ANNOTATION_TREND) {
            None => (Vec::new(), None),
            Some(text) => match NodeTrend::parse(text) {
                Ok(t) => (t.tests, None),
                Err(e) => (Vec::new(), Some(e.to_string())),
            },
        };
        let label = |k: &str| {
            node.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(k))
                .cloned()
        };
        NodeView {
            cordoned: node
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false),
            taints,
            result: label(keys::LABEL_RESULT),
            quarantine,
            quarantine_error,
            repaired: annotations.get(keys::ANNOTATION_REPAIRED).cloned(),
            gated: annotations.get(keys::ANNOTATION_GATED).cloned(),
            last_pass: annotations.get(keys::ANNOTATION_LAST_PASS).cloned(),
            tests: entries,
            findings,
            trend,
            trend_error,
            gpus_out_of_service: crate::gpus_out::of_node(tests, &name),
            node: name,
        }
    }
}

impl View for NodeView {
    fn names(&self) -> Vec<String> {
        vec![format!("node/{}", self.node)]
    }

    fn doc(&self) -> Doc {
        let mut doc = Doc::default();
        doc.heading(format!("node {}", self.node));
        doc.line(format!(
            "cordoned {}; result {}; last pass {}",
            self.cordoned,
            self.result.as_deref().unwrap_or("-"),
            self.last_pass.as_deref().unwrap_or("-")
        ));
        doc.line(format!(
            "gpufabric taints: {}",
            if self.taints.is_empty() {
                "none".to_string()
            } else {
                self.taints.join(", ")
            }
        ));
        match (&self.quarantine, &self.quarantine_error) {
            (Some(q), _) => {
                let mut done = Vec::new();
                if q.cordoned {
                    done.push("cordoned");
                }
                if q.labeled {
                    done.push("labelled");
                }
                if q.tainted {
                    done.push("tainted");
                }
                doc.line(format!(
                    "quarantine record ({}): FabricTest {}, run {}, since {}, mode {:?}, {}: {}",
                    keys::ANNOTATION_QUARANTINE,
                    q.test_name(),
                    q.run,
                    q.since.0,
                    q.mode,
                    if done.is_empty() {
                        "changed nothing".to_string()
                    } else {
                        done.join(", ")
                    },
                    q.reason
                ));
            }
            (None, Some(e)) => doc.line(format!("quarantine record: unreadable: {e}")),
            (None, None) => doc.line("quarantine record: none"),
        }
        doc.line(format!(
            "repaired ({}): {}; gated ({}): {}",
            keys::ANNOTATION_REPAIRED,
            self.repaired.as_deref().unwrap_or("no"),
            keys::ANNOTATION_GATED,
            self.gated.as_deref().unwrap_or("no")
        ));
        doc.extend(crate::gpus_out::doc(
            crate::gpus_out::HEADING,
            &self.gpus_out_of_service,
        ));
        doc.heading("history in each FabricTest");
        let mut t = Table::new(&[
            "TEST",
            "VERDICT",
            "FAILURES",
            "PASSES",
            "LAST RUN",
            "LAST MEASURED",
            "LAST FINDING",
        ]);
        for e in &self.tests {
            let h = &e.health;
            t.push(vec![
                e.test.clone(),
                h.verdict.name().into(),
                h.consecutive_failures.to_string(),
                h.consecutive_passes.to_string(),
                h.last_run.clone().unwrap_or_else(|| "-".into()),
                h.last_measured
                    .as_ref()
                    .map(|t| t.0.to_string())
                    .unwrap_or_else(|| "-".into()),
                h.last_finding.clone().unwrap_or_default(),
            ]);
        }
        doc.table(t);
        doc.heading(format!("its own runs ({})", keys::ANNOTATION_TREND));
        if let Some(e) = &self.trend_error {
            doc.line(format!("unreadable: {e}"));
        } else if self.trend.is_empty() {
            doc.line("no record yet: a run adds one when the node passes a complete check");
        }
        for t in &self.trend {
            let mut table = Table::new(&[
                "TEST",
                "NUMBER",
                "RUNS",
                "MEDIAN",
                "LATEST",
                "LATEST/MEDIAN",
            ]);
            for m in TrendMetric::ALL {
                let v: Vec<f64> = t.points.iter().filter_map(|p| p.get(m)).collect();
                let (Some(last), Some(median)) = (v.last(), gpufabric_health::fleet::median(&v))
                else {
                    continue;
                };
                table.push(vec![
                    t.test.clone(),
                    format!("{} ({})", m.label(), m.unit()),
                    v.len().to_string(),
                    format!("{median:.1}"),
                    format!("{last:.1}"),
                    format!("{:.3}", last / median),
                ]);
            }
            doc.table(table);
        }
        doc.heading("acted on?");
        let mut t = Table::new(&["TEST", "WHY"]);
        for e in &self.tests {
            t.push(vec![e.test.clone(), e.acted_on.clone()]);
            if let Some(x) = &e.target {
                t.push(vec![
                    e.test.clone(),
                    format!(
                        "to be tested now: {} ({} attempt(s) so far)",
                        x.reason, x.attempts
                    ),
                ]);
            }
        }
        doc.table(t);
        doc.heading(format!("findings naming {}", self.node));
        let mut t = Table::new(&["RUN", "SUBJECT", "KIND", "SEVERITY", "MESSAGE"]);
        for f in &self.findings {
            t.push(vec![
                f.run.clone(),
                subject(&f.finding.subject),
                wire(&f.finding.kind),
                wire(&f.finding.severity),
                f.finding.message.clone(),
            ]);
        }
        doc.table(t);
        doc
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use crate::output::{Format, render};

    fn view(node: &str, record: Option<&str>) -> NodeView {
        NodeView::of(
            &fixtures::node(node, record),
            &[fixtures::test()],
            &[fixtures::run()],
        )
    }

    #[test]
    fn a_quarantined_node_shows_its_record_history_findings_and_why() {
        let v = view("h200-02", Some(fixtures::RECORD));
        let q = v.quarantine.as_ref().expect("record parsed");
        assert_eq!(q.run, "nightly-manual-1");
        assert!(v.cordoned);
        assert_eq!(v.taints, ["gpufabric.io/quarantined=true:NoSchedule"]);
        assert_eq!(v.repaired.as_deref(), Some("INC-1"));
        let text = render(&v, &Format::Table).expect("text");
        assert!(
            text.contains("quarantine record (gpufabric.io/quarantine): FabricTest nightly, run nightly-manual-1, since 2026-11-21T02:03:04Z, mode Cordon, cordoned, labelled: NIC mlx5_0 port 1 slow to every partner"),
            "{text}"
        );
        assert!(text.contains("nightly  Failed   1         0"), "{text}");
        assert!(
            text.contains("quarantined since 2026-11-21T02:03:04Z: released after 2 passing run(s) in a row, or one pass after a repair (gpufabric.io/repaired)"),
            "{text}"
        );
        assert!(text.contains("to be tested now: marked repaired"), "{text}");
        // The path finding names it as the second node of the pair.
        assert!(
            text.contains("nightly-manual-1  <-> h200-02  Slow  Info"),
            "{text}"
        );
    }

    #[test]
    fn a_node_with_tainted_gpus_lists_them_and_still_reads_as_its_own_standing() {
        let test = fixtures::with_tainted_gpus(fixtures::test());
        let v = NodeView::of(
            &fixtures::node("h100-03", None),
            &[test],
            &[fixtures::run()],
        );
        assert_eq!(
            v.tests[0].acted_on,
            "GPUs out of service by DRA device taints: GPU 5 (gpu.nvidia.com/h100-03/gpu-5) since 2026-11-21T02:04:10Z: GPU 5 computes a step 1.5x slower than the node's other GPUs; GPU 2 (gpu.nvidia.com/h100-03/gpu-2) since 2026-11-21T02:04:10Z: GPU pair 2-5 copies at 95 GB/s; each released after 2 passing run(s) in a row; the node itself: not held: it stays schedulable for its other GPUs"
        );
        let text = render(&v, &Format::Table).expect("text");
        assert!(
            text.contains(
                "==> GPUs out of service (DRA device taints; the node itself stays schedulable)"
            ),
            "{text}"
        );
        assert!(
            text.contains("h100-03  nightly  2    gpu.nvidia.com/h100-03/gpu-2  2026-11-21T02:04:10Z  gpufabric-gpu-8c2d1  GPU pair 2-5 copies at 95 GB/s"),
            "{text}"
        );
        let json: serde_json::Value =
            serde_json::from_str(&render(&v, &Format::Json).expect("json")).expect("parses");
        let gpus = &json["gpusOutOfService"];
        assert_eq!(gpus[0]["gpu"], 2);
        assert_eq!(gpus[0]["device"], "gpu.nvidia.com/h100-03/gpu-2");
        assert_eq!(gpus[0]["since"], "2026-11-21T02:04:10Z");
        assert_eq!(
            gpus[1]["reason"],
            "GPU 5 computes a step 1.5x slower than the node's other GPUs"
        );
        assert_eq!(gpus[1]["test"], "nightly");
        // A node without tainted GPUs has no such section.
        let plain = render(&view("h100-03", None), &Format::Table).expect("text");
        assert!(!plain.contains("GPUs out of service"), "{plain}");
    }

    #[test]
    fn a_held_back_node_says_why_it_is_not_acted_on() {
        let v = view("h100-03", None);
        assert!(v.quarantine.is_none() && v.quarantine_error.is_none());
        assert_eq!(
            v.tests[0].acted_on,
            "not acted on: would quarantine: the budget (maxQuarantined 10%) is spent"
        );
        assert_eq!(v.findings.len(), 1);
        let text = render(&v, &Format::Table).expect("text");
        assert!(text.contains("quarantine record: none"), "{text}");
    }

    #[test]
    fn a_node_shows_its_own_runs_and_a_broken_record_is_said() {
        use gpufabric_api::trend::TrendPoint;
        let mut record = NodeTrend::default();
        for (at, busbw) in [(1, 400.0), (2, 402.0), (3, 398.0), (4, 376.0)] {
            let p = TrendPoint {
                at,
                busbw_gbps: Some(busbw),
                ddp_step_ms: Some(26.5),
                ..Default::default()
            };
            record = record.with_point("nightly", "s", p, 14);
        }
        let mut n = fixtures::node("h100-00", None);
        n.metadata
            .annotations
            .get_or_insert_default()
            .insert(keys::ANNOTATION_TREND.into(), record.to_json());
        let v = NodeView::of(&n, &[fixtures::test()], &[]);
        assert_eq!(v.trend.len(), 1);
        let text = render(&v, &Format::Table).expect("text");
        assert!(
            text.contains("nightly  all_reduce busbw (GB/s)  4     399.0   376.0   0.942"),
            "{text}"
        );
        assert!(text.contains("DDP step time (ms)"), "{text}");
        assert!(
            !text.contains("worst GPU-pair"),
            "no number, no row: {text}"
        );
        n.metadata
            .annotations
            .get_or_insert_default()
            .insert(keys::ANNOTATION_TREND.into(), "{broken".into());
        let text = render(&NodeView::of(&n, &[], &[]), &Format::Table).expect("text");
        assert!(
            text.contains("unreadable: the record is not valid"),
            "{text}"
        );
        let plain = render(&view("h100-00", None), &Format::Table).expect("text");
        assert!(plain.contains("no record yet"), "{plain}");
    }

    #[test]
    fn an_open_breaker_and_a_passing_node_are_said_so() {
        let t = fixtures::open_breaker(fixtures::test());
        let v = NodeView::of(&fixtures::node("h100-00", None), &[t], &[]);
        assert_eq!(
            v.tests[0].acted_on,
            "passing: nothing to do; the breaker of nightly is open: it quarantines and releases no node"
        );
    }

    #[test]
    fn an_unreadable_record_is_reported_not_hidden() {
        let v = view("h100-00", Some("cordoned by bob"));
        assert!(v.quarantine.is_none());
        let text = render(&v, &Format::Table).expect("text");
        assert!(text.contains("quarantine record: unreadable"), "{text}");
    }

    #[test]
    fn a_node_no_test_knows_has_empty_tables() {
        let v = view("other", None);
        assert!(v.tests.is_empty() && v.findings.is_empty());
        let text = render(&v, &Format::Table).expect("text");
        assert!(text.contains("(none)"), "{text}");
    }

    #[test]
    fn json_and_yaml_carry_the_record_and_the_history() {
        let v = view("h200-02", Some(fixtures::RECORD));
        let json: serde_json::Value =
            serde_json::from_str(&render(&v, &Format::Json).expect("json")).expect("parses");
        assert_eq!(json["node"], "h200-02");
        assert_eq!(json["quarantine"]["test"], "nightly");
        assert_eq!(json["quarantine"]["cordoned"], true);
        // The standing is the one record; an earlier version's flag is read, never written.
        assert_eq!(
            json["tests"][0]["health"]["standing"]["state"],
            "Quarantined"
        );
        assert_eq!(
            json["tests"][0]["health"]["quarantined"],
            serde_json::Value::Null
        );
        assert_eq!(json["tests"][0]["target"]["attempts"], 0);
        assert_eq!(json["findings"][0]["subject"]["peerNode"], "h200-02");
        let yaml: serde_json::Value =
            serde_yaml::from_str(&render(&v, &Format::Yaml).expect("yaml")).expect("parses");
        assert_eq!(yaml, json);
    }
}
