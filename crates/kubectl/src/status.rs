//! `kubectl gpufabric status`: every FabricTest with its schedule, its last run, the nodes it
//! holds in quarantine or holds back, its repeat offenders and its breaker.

use crate::doc::{Doc, Table, names, wire};
use crate::output::{View, test_name};
use gpufabric_api::FabricTest;
use gpufabric_api::test::RunSummary;
use serde::Serialize;

/// The condition type of a test's breaker.
pub const CONDITION_BREAKER_OPEN: &str = "BreakerOpen";

/// One FabricTest, summarized.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TestSummary {
    pub name: String,
    /// The cron schedule; none for a test that runs once.
    pub schedule: Option<String>,
    pub suspend: bool,
    /// The run in progress.
    pub active_run: Option<String>,
    /// The latest finished run.
    pub last_run: Option<RunSummary>,
    /// The nodes the test holds in quarantine (at most 200 listed).
    pub quarantined: Vec<String>,
    /// Every node it holds, listed or not.
    pub quarantined_count: u32,
    /// Failing nodes it does not act on, and why.
    pub held_back: Vec<HeldBack>,
    /// Nodes quarantined too often for passing runs to release.
    pub repeat_offenders: Vec<String>,
    pub breaker: Breaker,
    /// GPUs it took out of service with DRA device taints (their nodes stay schedulable).
    pub gpus_out_of_service: Vec<crate::gpus_out::GpuOut>,
}

/// A failing node a test reports but does not act on.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HeldBack {
    pub node: String,
    pub why: String,
}

/// A test's breaker: its `BreakerOpen` condition.
#[derive(Clone, Debug, PartialEq, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Breaker {
    pub open: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl Breaker {
    /// The breaker of `test`, from its `BreakerOpen` condition (closed when it has none).
    pub fn of(test: &FabricTest) -> Breaker {
        test.status
            .as_ref()
            .and_then(|s| {
                s.conditions
                    .iter()
                    .find(|c| c.type_ == CONDITION_BREAKER_OPEN)
            })
            .map(|c| Breaker {
                open: c.status == "True",
                reason: Some(c.reason.clone()).filter(|r| !r.is_empty()),
                message: Some(c.message.clone()).filter(|m| !m.is_empty()),
            })
            .unwrap_or_default()
    }
}

impl TestSummary {
    pub fn of(test: &FabricTest) -> TestSummary {
        let st = test.status.clone().unwrap_or_default();
        TestSummary {
            name: test.metadata.name.clone().unwrap_or_default(),
            schedule: test.spec.schedule.clone(),
            suspend: test.spec.suspend,
            active_run: st.active_run,
            last_run: st.last_run,
            quarantined: st.quarantined_nodes,
            quarantined_count: st.quarantined_count,
            held_back: st
                .nodes
                .iter()
                .filter_map(|n| {
                    n.held_back.clone().map(|why| HeldBack {
                        node: n.node.clone(),
                        why,
                    })
                })
                .collect(),
            repeat_offenders: st.repeat_offenders,
            breaker: Breaker::of(test),
            gpus_out_of_service: crate::gpus_out::of_test(test),
        }
    }
}

/// Every FabricTest, by name.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Status {
    pub tests: Vec<TestSummary>,
}

impl Status {
    pub fn of(tests: &[FabricTest]) -> Status {
        let mut tests: Vec<TestSummary> = tests.iter().map(TestSummary::of).collect();
        tests.sort_by(|a, b| a.name.cmp(&b.name));
        Status { tests }
    }
}

impl View for Status {
    fn names(&self) -> Vec<String> {
        self.tests.iter().map(|t| test_name(&t.name)).collect()
    }

    /// The table with each test's run in progress, its last run's trigger, errored nodes
    /// and findings, when it completed and how many nodes it holds in all.
    fn wide(&self) -> Doc {
        self.tables(true)
    }

    fn doc(&self) -> Doc {
        self.tables(false)
    }
}

impl Status {
    fn tables(&self, wide: bool) -> Doc {
        let mut t = Table::new(&[
            "TEST",
            "SCHEDULE",
            "LAST RUN",
            "PHASE",
            "PASSED",
            "FAILED",
            "NOT MEASURED",
            "QUARANTINED",
            "HELD BACK",
            "REPEAT OFFENDERS",
            "BREAKER",
        ]);
        if wide {
            t = Table::new(&[
                "TEST",
                "SCHEDULE",
                "LAST RUN",
                "PHASE",
                "PASSED",
                "FAILED",
                "NOT MEASURED",
                "QUARANTINED",
                "HELD BACK",
                "REPEAT OFFENDERS",
                "BREAKER",
                "ACTIVE RUN",
                "TRIGGER",
                "ERRORED",
                "FINDINGS",
                "COMPLETED",
                "QUARANTINED COUNT",
            ]);
        }
        let mut held = Table::new(&["TEST", "NODE", "WHY"]);
        let mut doc = Doc::default();
        for s in &self.tests {
            let schedule = match (&s.schedule, s.suspend) {
                (Some(c), false) => c.clone(),
                (Some(c), true) => format!("{c} (suspended)"),
                (None, _) => "once".into(),
            };
            let (run, phase, passed, failed, not_measured) = match &s.last_run {
                Some(l) => (
                    l.name.clone(),
                    format!("{:?}", l.phase),
                    l.passed.to_string(),
                    l.failed.to_string(),
                    l.not_measured.to_string(),
                ),
                None => ("-".into(), "-".into(), "-".into(), "-".into(), "-".into()),
            };
            let run = match &s.active_run {
                Some(a) if run == "-" => format!("({a} running)"),
                Some(a) => format!("{run} ({a} running)"),
                None => run,
            };
            let mut quarantined = names(&s.quarantined);
            let unlisted = (s.quarantined_count as usize).saturating_sub(s.quarantined.len());
            if unlisted > 0 {
                quarantined.push_str(&format!(" +{unlisted}"));
            }
            let held_names: Vec<String> = s.held_back.iter().map(|h| h.node.clone()).collect();
            let mut row = vec![
                s.name.clone(),
                schedule,
                run,
                phase,
                passed,
                failed,
                not_measured,
                quarantined,
                names(&held_names),
                names(&s.repeat_offenders),
                if s.breaker.open { "open" } else { "closed" }.into(),
            ];
            if wide {
                let last = s.last_run.as_ref();
                row.extend([
                    s.active_run.clone().unwrap_or_else(|| "-".into()),
                    last.map_or("-".into(), |l| wire(&l.trigger)),
                    last.map_or("-".into(), |l| l.errored.to_string()),
                    last.map_or("-".into(), |l| l.findings.to_string()),
                    last.and_then(|l| l.completion_time.as_ref())
                        .map_or("-".into(), |c| c.0.to_string()),
                    s.quarantined_count.to_string(),
                ]);
            }
            t.push(row);
            for h in &s.held_back {
                held.push(vec![s.name.clone(), h.node.clone(), h.why.clone()]);
            }
        }
        doc.table(t);
        if !held.is_empty() {
            doc.heading("failing nodes held back (reported, not acted on)");
            doc.table(held);
        }
        let gpus: Vec<crate::gpus_out::GpuOut> = self
            .tests
            .iter()
            .flat_map(|s| s.gpus_out_of_service.iter().cloned())
            .collect();
        doc.extend(crate::gpus_out::doc(crate::gpus_out::HEADING, &gpus));
        for s in self.tests.iter().filter(|s| s.breaker.open) {
            doc.heading(format!(
                "the breaker of {} is open: it quarantines and releases no node until reset (kubectl annotate ft {} {}=now)",
                s.name,
                s.name,
                gpufabric_api::keys::ANNOTATION_RESET_BREAKER
            ));
            if let Some(m) = &s.breaker.message {
                doc.line(m.clone());
            }
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
    fn the_table_has_a_row_per_test_with_its_last_run_and_nodes() {
        let text = render(&Status::of(&[fixtures::test()]), &Format::Table).expect("text");
        let mut lines = text.lines();
        let header = lines.next().expect("header");
        assert!(header.starts_with("TEST     SCHEDULE   LAST RUN"), "{text}");
        let row = lines.next().expect("row");
        for cell in [
            "nightly",
            "0 2 * * *",
            "nightly-manual-1",
            "Succeeded",
            "12",
            "3",
            "h200-02",
            "h100-03",
            "closed",
        ] {
            assert!(row.contains(cell), "{cell:?} in {row}");
        }
        assert!(text.contains("==> failing nodes held back"), "{text}");
        assert!(
            text.contains("nightly  h100-03  would quarantine: the budget"),
            "{text}"
        );
        assert!(!text.contains("breaker of nightly is open"), "{text}");
    }

    #[test]
    fn the_gpus_a_test_took_out_of_service_are_listed_with_node_finding_and_since() {
        let s = Status::of(&[fixtures::with_tainted_gpus(fixtures::test())]);
        let text = render(&s, &Format::Table).expect("text");
        let section = text
            .split("==> GPUs out of service (DRA device taints; the node itself stays schedulable)")
            .nth(1)
            .expect("the section");
        let rows: Vec<&str> = section.lines().skip(2).take(3).map(str::trim).collect();
        assert!(rows[0].starts_with("h100-00  nightly  6    gpu.nvidia.com/h100-00/gpu-6  2026-11-20T02:05:00Z  gpufabric-gpu-m3k7v  GPU 6 memory bandwidth"), "{text}");
        assert!(rows[1].starts_with("h100-03  nightly  2"), "{text}");
        assert!(rows[2].starts_with("h100-03  nightly  5"), "{text}");
        let json: serde_json::Value =
            serde_json::from_str(&render(&s, &Format::Json).expect("json")).expect("parses");
        let gpus = &json["tests"][0]["gpusOutOfService"];
        assert_eq!(gpus[0]["node"], "h100-00");
        assert_eq!(gpus[0]["rule"], "gpufabric-gpu-m3k7v");
        assert_eq!(
            gpus[2]["reason"],
            "GPU 5 computes a step 1.5x slower than the node's other GPUs"
        );
        let plain = render(&Status::of(&[fixtures::test()]), &Format::Table).expect("text");
        assert!(!plain.contains("GPUs out of service"), "{plain}");
    }

    #[test]
    fn an_open_breaker_is_shown_with_how_to_reset_it() {
        let t = fixtures::open_breaker(fixtures::test());
        let s = Status::of(&[t]);
        assert!(s.tests[0].breaker.open);
        let text = render(&s, &Format::Table).expect("text");
        assert!(text.contains("open"), "{text}");
        assert!(
            text.contains("kubectl annotate ft nightly gpufabric.io/reset-breaker=now"),
            "{text}"
        );
        assert!(text.contains("14 of 16 measured nodes failed"), "{text}");
    }

    #[test]
    fn a_test_without_status_shows_dashes_and_runs_once_without_a_schedule() {
        let mut t = fixtures::test();
        t.status = None;
        t.spec.schedule = None;
        let text = render(&Status::of(&[t]), &Format::Table).expect("text");
        assert!(text.contains("nightly  once"), "{text}");
        assert!(text.contains("closed"), "{text}");
    }

    #[test]
    fn json_and_yaml_carry_the_same_summary() {
        let s = Status::of(&[fixtures::test()]);
        let json: serde_json::Value =
            serde_json::from_str(&render(&s, &Format::Json).expect("json")).expect("parses");
        let t = &json["tests"][0];
        assert_eq!(t["name"], "nightly");
        assert_eq!(t["lastRun"]["name"], "nightly-manual-1");
        assert_eq!(t["lastRun"]["passed"], 12);
        assert_eq!(t["quarantined"][0], "h200-02");
        assert_eq!(t["heldBack"][0]["node"], "h100-03");
        assert_eq!(t["breaker"]["open"], false);
        let yaml: serde_json::Value =
            serde_yaml::from_str(&render(&s, &Format::Yaml).expect("yaml")).expect("parses");
        assert_eq!(yaml, json);
    }
}
