//! Error counters between runs. NVML and sysfs count errors since the driver loaded, so a
//! count alone says little (a link may have erred once, long ago); what a marginal link
//! shows is growth. The operator keeps each node's counters of its latest
//! measured run in the node annotation [`crate::keys::ANNOTATION_COUNTERS`]; the standalone
//! agent keeps them in a file (`node-check --counters-file`). The next run compares.

use crate::result::CompactResult;
use serde::{Deserialize, Serialize};

/// Longest annotation value read; a larger one is ignored as not ours or corrupt.
pub const MAX_ANNOTATION_BYTES: usize = 16 * 1024;

/// The counters of one node at the end of one run.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct CounterBaseline {
    /// The run (or, standalone, the host) that measured them.
    pub run: String,
    /// When, RFC 3339.
    pub at: String,
    /// NVLink replay + recovery + CRC (flit) errors of each GPU, by GPU index.
    #[serde(default)]
    pub nvlink: Vec<u64>,
}

/// Why a stored baseline could not be read.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum BaselineError {
    #[error("the record is {0} bytes, over the {MAX_ANNOTATION_BYTES}-byte limit")]
    TooLarge(usize),
    #[error("the record is not valid: {0}")]
    Malformed(String),
}

/// Parses a counters record kept in a node annotation (this one, or
/// [`crate::nic_counters::NicCounters`]): at most [`MAX_ANNOTATION_BYTES`], valid JSON of
/// its shape; never panics on what a person or another tool wrote there.
pub fn parse_record<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, BaselineError> {
    if text.len() > MAX_ANNOTATION_BYTES {
        return Err(BaselineError::TooLarge(text.len()));
    }
    serde_json::from_str(text).map_err(|e| BaselineError::Malformed(e.to_string()))
}

impl CounterBaseline {
    /// The counters of a measured node; None when the result has no GPU health (a sim
    /// node without NVML, a check that stopped before its health phase).
    pub fn of(result: &CompactResult, run: &str, at: &str) -> Option<CounterBaseline> {
        if result.health.is_empty() {
            return None;
        }
        Some(CounterBaseline {
            run: run.to_string(),
            at: at.to_string(),
            nvlink: result.health.iter().map(|g| g.nvlink_errors).collect(),
        })
    }

    /// Parses a stored record; never panics on what a person or another tool wrote there.
    pub fn parse(text: &str) -> Result<CounterBaseline, BaselineError> {
        parse_record(text)
    }

    /// The record as stored (compact JSON).
    pub fn to_json(&self) -> String {
        // A struct of strings and integers always serialises.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Whether `other` holds the same counters (the run and time aside): then there is
    /// nothing new to store.
    pub fn same_counts(&self, other: &CounterBaseline) -> bool {
        self.nvlink == other.nvlink
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_junk_is_an_error_not_a_panic() {
        let b = CounterBaseline {
            run: "nightly-1".into(),
            at: "2026-11-23T02:00:00Z".into(),
            nvlink: vec![7062, 6358],
        };
        assert_eq!(CounterBaseline::parse(&b.to_json()), Ok(b.clone()));
        assert!(matches!(
            CounterBaseline::parse("{not json"),
            Err(BaselineError::Malformed(_))
        ));
        assert!(matches!(
            CounterBaseline::parse(r#"{"run":"r","at":"t","nvlink":[-1]}"#),
            Err(BaselineError::Malformed(_))
        ));
        let big = format!("{{\"run\":\"{}\"}}", "x".repeat(MAX_ANNOTATION_BYTES));
        assert!(matches!(
            CounterBaseline::parse(&big),
            Err(BaselineError::TooLarge(_))
        ));
    }

    #[test]
    fn same_counts_ignores_run_and_time() {
        let a = CounterBaseline {
            run: "a".into(),
            at: "t1".into(),
            nvlink: vec![1, 2],
        };
        let b = CounterBaseline {
            run: "b".into(),
            at: "t2".into(),
            ..a.clone()
        };
        assert!(a.same_counts(&b));
        let c = CounterBaseline {
            nvlink: vec![1, 3],
            ..a.clone()
        };
        assert!(!a.same_counts(&c));
    }
}
