//! Each FabricTest's standing of one node, kept on the node (`gpufabric.io/standing`), and
//! the worst of them: what the node's `GPUFabricDegraded` condition and result label say.
//! A pass in one test never clears another test's failure; a test's deletion removes only
//! its own entry.

use crate::keys::ANNOTATION_STANDING;
use crate::standing::Standing;
use k8s_openapi::api::core::v1::NodeCondition;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Longest detail kept per test (the finding, or why the node was not measured).
pub const MAX_DETAIL: usize = 300;

/// One test's standing of the node, with the run that decided it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TestStanding {
    pub standing: Standing,
    pub run: String,
    /// The worst finding of that run, or why the node was not measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

impl TestStanding {
    /// What the condition's message says of this test's standing.
    pub fn says(&self) -> String {
        let detail = self.detail.as_deref();
        match &self.standing {
            Standing::Passing => "passed".to_string(),
            Standing::Suspect => format!(
                "failed, not yet confirmed: {}",
                detail.unwrap_or("no finding recorded")
            ),
            Standing::Failing { .. } | Standing::Quarantined { .. } => {
                detail.unwrap_or("failed, no finding recorded").to_string()
            }
            Standing::HeldBack { why, .. } => format!(
                "{} (not acted on: {why})",
                detail.unwrap_or("failed, no finding recorded")
            ),
            Standing::RepeatOffender => format!(
                "a repeat offender, released only by a repair: {}",
                detail.unwrap_or("no finding recorded")
            ),
            Standing::GpusOutOfService { gpus } => format!(
                "{} out of service by DRA device taints, the node stays schedulable: {}",
                crate::standing::gpu_list(gpus),
                detail.unwrap_or("no finding recorded")
            ),
            Standing::TakenBack { what } => format!("quarantine taken back ({what})"),
            Standing::Gated => "behind the validation gate, not yet measured".to_string(),
            Standing::NotMeasured => {
                format!("not measured: {}", detail.unwrap_or("no reason recorded"))
            }
        }
    }
}

/// Every FabricTest's standing of one node, by test name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NodeStandings {
    pub tests: BTreeMap<String, TestStanding>,
}

/// Why a node's `gpufabric.io/standing` annotation is no record.
#[derive(Debug, thiserror::Error)]
#[error(
    "the node's {ANNOTATION_STANDING} annotation is not a standing record ({0}); remove it and the next run of each test writes it again"
)]
pub struct UnreadableStandings(#[from] serde_json::Error);

impl NodeStandings {
    /// The record on a node, None when it has none.
    pub fn from_annotations(
        annotations: Option<&BTreeMap<String, String>>,
    ) -> Result<Option<NodeStandings>, UnreadableStandings> {
        annotations
            .and_then(|a| a.get(ANNOTATION_STANDING))
            .map(|text| serde_json::from_str(text).map_err(UnreadableStandings))
            .transpose()
    }

    /// The record a node without one carries in effect: the single writer of its
    /// `GPUFabricDegraded` condition before the standing was kept per test (the test and run
    /// its message names, the standing its reason says). Empty for a condition no
    /// FabricTest wrote.
    pub fn migrated(condition: Option<&NodeCondition>) -> NodeStandings {
        let mut out = NodeStandings::default();
        let Some(c) = condition else {
            return out;
        };
        let Some((test, run, detail)) = c.message.as_deref().and_then(split_message) else {
            return out;
        };
        let standing = match c.reason.as_deref() {
            Some("Passed") => Standing::Passing,
            Some("Suspect") => Standing::Suspect,
            Some("Failed") => Standing::Failing { hardware: false },
            Some("HardwareFault") => Standing::Failing { hardware: true },
            _ => Standing::NotMeasured,
        };
        out.tests.insert(
            test.to_string(),
            TestStanding {
                standing,
                run: run.to_string(),
                detail: Some(detail.to_string()),
            },
        );
        out
    }

    /// The annotation's value.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Sets `test`'s standing (the detail cut to [`MAX_DETAIL`] bytes).
    pub fn set(&mut self, test: &str, mut entry: TestStanding) {
        if let Some(d) = entry.detail.as_mut() {
            crate::shard::cut(d, MAX_DETAIL);
        }
        self.tests.insert(test.to_string(), entry);
    }

    /// Removes `test`'s standing; true when it had one.
    pub fn remove(&mut self, test: &str) -> bool {
        self.tests.remove(test).is_some()
    }

    /// The worst standing across the tests, and the tests that hold it (by name); None
    /// when no test has a standing of the node.
    pub fn worst(&self) -> Option<(&Standing, Vec<(&str, &TestStanding)>)> {
        let top = self
            .tests
            .values()
            .map(|t| (t.standing.severity(), t.standing.hardware()))
            .max()?;
        let at_top: Vec<(&str, &TestStanding)> = self
            .tests
            .iter()
            .filter(|(_, t)| t.standing.severity() == top.0)
            .map(|(n, t)| (n.as_str(), t))
            .collect();
        let standing = at_top
            .iter()
            .map(|(_, t)| &t.standing)
            .find(|s| s.hardware() == top.1)?;
        Some((standing, at_top))
    }

    /// The condition's message: each test behind the worst standing, its run and what it
    /// says (`FabricTest nightly, run nightly-1: GPU 3 slow; FabricTest ...`).
    pub fn message(&self) -> Option<String> {
        let (_, tests) = self.worst()?;
        Some(
            tests
                .iter()
                .map(|(name, t)| format!("FabricTest {name}, run {}: {}", t.run, t.says()))
                .collect::<Vec<_>>()
                .join("; "),
        )
    }
}

/// `FabricTest <test>, run <run>: <detail>` split into its parts; None for a message no
/// FabricTest wrote.
pub fn split_message(message: &str) -> Option<(&str, &str, &str)> {
    let (test, rest) = message.strip_prefix("FabricTest ")?.split_once(", run ")?;
    let (run, detail) = rest.split_once(": ").unwrap_or((rest, ""));
    (!test.is_empty()).then_some((test, run, detail))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(standing: Standing, run: &str, detail: &str) -> TestStanding {
        TestStanding {
            standing,
            run: run.into(),
            detail: Some(detail.into()),
        }
    }

    #[test]
    fn a_pass_in_one_test_never_clears_another_tests_failure() {
        let mut s = NodeStandings::default();
        s.set(
            "nightly",
            entry(
                Standing::Quarantined { hardware: true },
                "nightly-1",
                "GPU 3 lost",
            ),
        );
        s.set("quick", entry(Standing::Passing, "quick-7", ""));
        let (worst, tests) = s.worst().expect("a standing");
        assert_eq!(worst, &Standing::Quarantined { hardware: true });
        assert_eq!(tests.len(), 1);
        assert_eq!(
            s.message().as_deref(),
            Some("FabricTest nightly, run nightly-1: GPU 3 lost")
        );
        assert!(s.remove("quick"));
        assert_eq!(
            s.worst().map(|w| w.0.clone()),
            Some(Standing::Quarantined { hardware: true })
        );
        assert!(s.remove("nightly"));
        assert!(s.worst().is_none());
    }

    #[test]
    fn the_message_names_every_test_behind_the_worst_standing() {
        let mut s = NodeStandings::default();
        s.set(
            "a",
            entry(Standing::Failing { hardware: false }, "a-1", "slow"),
        );
        s.set(
            "b",
            entry(Standing::Failing { hardware: true }, "b-1", "XID 79"),
        );
        s.set("c", entry(Standing::Suspect, "c-1", "slow"));
        let (worst, _) = s.worst().expect("a standing");
        assert_eq!(worst, &Standing::Failing { hardware: true });
        assert_eq!(
            s.message().as_deref(),
            Some("FabricTest a, run a-1: slow; FabricTest b, run b-1: XID 79")
        );
    }

    #[test]
    fn the_single_writer_of_an_older_condition_becomes_its_one_entry() {
        let c = NodeCondition {
            type_: "GPUFabricDegraded".into(),
            status: "True".into(),
            reason: Some("HardwareFault".into()),
            message: Some("FabricTest nightly, run nightly-3: GPU 2 fell off the bus".into()),
            ..Default::default()
        };
        let s = NodeStandings::migrated(Some(&c));
        assert_eq!(
            s.tests.get("nightly"),
            Some(&entry(
                Standing::Failing { hardware: true },
                "nightly-3",
                "GPU 2 fell off the bus"
            ))
        );
        let theirs = NodeCondition {
            message: Some("set by hand".into()),
            ..c
        };
        assert!(NodeStandings::migrated(Some(&theirs)).tests.is_empty());
    }

    #[test]
    fn the_record_reads_back_from_the_annotation() {
        let mut s = NodeStandings::default();
        s.set(
            "nightly",
            entry(Standing::Suspect, "nightly-1", &"é".repeat(400)),
        );
        let a = BTreeMap::from([(ANNOTATION_STANDING.to_string(), s.to_annotation())]);
        let back = NodeStandings::from_annotations(Some(&a))
            .expect("readable")
            .expect("present");
        assert_eq!(back, s);
        assert!(
            back.tests["nightly"]
                .detail
                .as_ref()
                .is_some_and(|d| d.len() <= MAX_DETAIL)
        );
        let bad = BTreeMap::from([(ANNOTATION_STANDING.to_string(), "{".to_string())]);
        assert!(NodeStandings::from_annotations(Some(&bad)).is_err());
        assert!(matches!(NodeStandings::from_annotations(None), Ok(None)));
    }
}
