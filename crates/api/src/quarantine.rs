//! The ownership record the operator writes on a node it quarantines: who, why, which run,
//! when, and exactly which changes (label, cordon, taint) it made, so it undoes only those.

use crate::keys::ANNOTATION_QUARANTINE;
use crate::policy::QuarantineMode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Longest reason kept in a record; longer ones are cut (the findings stay on the run).
pub const MAX_REASON_LEN: usize = 512;

/// What the operator did to a node, kept as JSON in the node annotation
/// `gpufabric.io/quarantine`. A change the record does not name was not made by the
/// operator, and the operator never undoes it.
///
/// The booleans default to `false` when absent: a record that does not say "we cordoned"
/// never makes the operator uncordon.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct QuarantineRecord {
    /// The name of the FabricTest that owns the quarantine (cluster-scoped). Records written
    /// while FabricTest was namespaced say `<namespace>/<name>`; they are read as `<name>`.
    pub test: String,
    /// The FabricTestRun whose findings caused it.
    pub run: String,
    /// Why, as a sentence (the most severe finding on the node).
    pub reason: String,
    /// When the node was quarantined.
    pub since: Time,
    /// The mode the test had when it quarantined the node.
    pub mode: QuarantineMode,
    /// The operator set `spec.unschedulable` (the node was schedulable before).
    #[serde(default)]
    pub cordoned: bool,
    /// The operator added the taint `gpufabric.io/quarantined:NoSchedule` (it was absent before).
    #[serde(default)]
    pub tainted: bool,
    /// The operator set the label `gpufabric.io/quarantined=true` (it was absent before).
    #[serde(default)]
    pub labeled: bool,
}

/// Why a node's quarantine annotation could not be read.
#[derive(Debug, thiserror::Error)]
#[error(
    "annotation {ANNOTATION_QUARANTINE} on this node is not a quarantine record ({source}); \
     the operator leaves the node alone until a person fixes or removes the annotation"
)]
pub struct RecordError {
    #[source]
    pub source: serde_json::Error,
}

impl QuarantineRecord {
    /// The FabricTest key that records name: the test's name (FabricTest is cluster-scoped).
    pub fn test_key(name: &str) -> String {
        name.to_string()
    }

    /// The name of the FabricTest this record names: `test` itself, or the part after the
    /// `/` of a record written while FabricTest was namespaced (`<namespace>/<name>`; a
    /// name never contains `/`).
    pub fn test_name(&self) -> &str {
        self.test
            .rsplit_once('/')
            .map_or(self.test.as_str(), |(_, name)| name)
    }

    /// The record in a node's annotations: `Ok(None)` when there is none, an error when the
    /// annotation is there but is not a record (then nobody may assume anything about the node).
    pub fn from_annotations(
        annotations: Option<&BTreeMap<String, String>>,
    ) -> Result<Option<Self>, RecordError> {
        match annotations.and_then(|a| a.get(ANNOTATION_QUARANTINE)) {
            None => Ok(None),
            Some(text) => Self::parse(text).map(Some),
        }
    }

    /// Parse the annotation value.
    pub fn parse(text: &str) -> Result<Self, RecordError> {
        serde_json::from_str(text).map_err(|source| RecordError { source })
    }

    /// The annotation value (compact JSON).
    pub fn to_annotation(&self) -> String {
        // A struct of strings, booleans, a timestamp and a unit enum always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Whether this record says the test named `test_key` owns the node (also when the
    /// record names it in the old `<namespace>/<name>` form, so that a node quarantined
    /// before FabricTest became cluster-scoped is released by the test of the same name).
    pub fn is_owned_by(&self, test_key: &str) -> bool {
        self.test_name() == test_key
    }

    /// A reason cut to [`MAX_REASON_LEN`] bytes on a character boundary.
    pub fn short_reason(reason: &str) -> String {
        crate::text::cut(reason, MAX_REASON_LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> QuarantineRecord {
        QuarantineRecord {
            test: "nightly".into(),
            run: "nightly-29001".into(),
            reason: "GPU pair 0-1 copy bandwidth 110 GB/s, expected >= 300 GB/s".into(),
            since: Time("2026-11-21T02:03:04Z".parse().expect("timestamp")),
            mode: QuarantineMode::Cordon,
            cordoned: true,
            tainted: false,
            labeled: true,
        }
    }

    #[test]
    fn record_round_trips_through_the_annotation() {
        let r = record();
        let text = r.to_annotation();
        assert!(text.contains(r#""since":"2026-11-21T02:03:04Z""#), "{text}");
        assert_eq!(QuarantineRecord::parse(&text).expect("parses"), r);
    }

    #[test]
    fn missing_change_flags_never_claim_a_change() {
        let text = r#"{"test":"a/b","run":"r","reason":"x","since":"2026-11-21T02:03:04Z","mode":"Taint"}"#;
        let r = QuarantineRecord::parse(text).expect("parses");
        assert!(!r.cordoned && !r.tainted && !r.labeled);
    }

    #[test]
    fn garbage_annotation_is_an_error_not_an_empty_record() {
        let mut a = BTreeMap::new();
        a.insert(
            ANNOTATION_QUARANTINE.to_string(),
            "cordoned by bob".to_string(),
        );
        let err = QuarantineRecord::from_annotations(Some(&a)).expect_err("not a record");
        assert!(err.to_string().contains("leaves the node alone"), "{err}");
        assert!(matches!(QuarantineRecord::from_annotations(None), Ok(None)));
    }

    #[test]
    fn a_record_of_the_namespaced_form_is_owned_by_the_test_of_the_same_name() {
        let mut r = record();
        assert!(r.is_owned_by("nightly"));
        r.test = "gpu/nightly".into();
        assert_eq!(r.test_name(), "nightly");
        assert!(r.is_owned_by("nightly"));
        assert!(!r.is_owned_by("weekly"));
        assert!(!r.is_owned_by("gpu/nightly"));
        r.test = "gpu/nightly-2".into();
        assert!(!r.is_owned_by("nightly"));
    }

    #[test]
    fn long_reasons_are_cut_on_a_char_boundary() {
        let long = "é".repeat(400);
        let short = QuarantineRecord::short_reason(&long);
        assert!(short.len() <= MAX_REASON_LEN && short.ends_with("..."));
    }
}
