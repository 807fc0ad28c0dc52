//! Why one node was not changed: the node is not ours to touch ([`Refusal`]), or the API
//! server did not let us ([`NodeChangeError`]).

use gpufabric_api::keys::{LABEL_QUARANTINED, TAINT_QUARANTINED};
use std::fmt;

/// Why this test leaves a node alone. Decided from the node as read, never from a string.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The Node object does not exist.
    Gone,
    /// The Node object has a deletionTimestamp.
    BeingDeleted,
    /// The quarantine annotation cannot be read (the parse error): nobody can tell what was
    /// done to the node.
    UnreadableRecord(String),
    /// The record names another FabricTest.
    OtherTest(String),
    /// Unschedulable, and no record says this operator cordoned it.
    CordonedByOthers,
    /// Carries our taint key, and no record says this operator added it.
    TaintedByOthers,
    /// Label mode, and the node already has our label that no record explains.
    LabeledByOthers,
    /// The node has no resourceVersion: a change could not be guarded against races.
    NoResourceVersion,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Gone => f.write_str("the node does not exist"),
            Refusal::BeingDeleted => f.write_str("the node is being deleted"),
            Refusal::UnreadableRecord(e) => f.write_str(e),
            Refusal::OtherTest(t) => {
                write!(
                    f,
                    "left alone: quarantined by FabricTest {t}, not by this test"
                )
            }
            Refusal::CordonedByOthers => f.write_str(
                "left alone: the node was cordoned by someone else (not by this operator)",
            ),
            Refusal::TaintedByOthers => write!(
                f,
                "left alone: the node carries the taint {TAINT_QUARANTINED} put there by someone else"
            ),
            Refusal::LabeledByOthers => write!(
                f,
                "left alone: the node already has the label {LABEL_QUARANTINED}, set by someone else"
            ),
            Refusal::NoResourceVersion => {
                f.write_str("the node has no resourceVersion; cannot change it safely")
            }
        }
    }
}

/// A node change the API server refused or failed. The next reconcile tries again.
#[derive(Debug, thiserror::Error)]
pub enum NodeChangeError {
    #[error("reading the node: {0}")]
    Read(#[source] kube::Error),
    #[error("patching the node: {0}")]
    Patch(#[source] kube::Error),
    #[error("the node kept changing ({0} conflicts in a row); left as it is, retried later")]
    KeptChanging(usize),
}

/// Which change failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    Quarantine,
    Release,
    /// End the claim on a node whose quarantine someone else undid.
    HandBack,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Change::Quarantine => "quarantine",
            Change::Release => "release",
            Change::HandBack => "hand back",
        })
    }
}

/// A node change that failed, and why.
#[derive(Debug, thiserror::Error)]
#[error("{node}: could not {change}: {error}")]
pub struct NodeFailure {
    pub node: String,
    pub change: Change,
    #[source]
    pub error: NodeChangeError,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_and_failures_say_what_happened() {
        assert!(
            Refusal::OtherTest("team-b/x".into())
                .to_string()
                .contains("team-b/x")
        );
        assert!(
            Refusal::CordonedByOthers
                .to_string()
                .contains("cordoned by someone else")
        );
        let failure = NodeFailure {
            node: "n1".into(),
            change: Change::Release,
            error: NodeChangeError::KeptChanging(5),
        };
        assert_eq!(
            failure.to_string(),
            "n1: could not release: the node kept changing (5 conflicts in a row); left as it is, retried later"
        );
    }
}
