//! Why one node's signals could not be written. Reported per node (in the run's
//! `SignalsNotWritten` Event and the log); it never stops the other nodes nor the reconcile.

use gpufabric_api::keys;

/// One node's signal write that failed, with the node and the step.
#[derive(Debug, thiserror::Error)]
pub enum SignalError {
    #[error(
        "node {node}: writing condition {}: {source}",
        keys::CONDITION_NODE_DEGRADED
    )]
    Condition {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("node {node}: the label patch is not JSON: {source}")]
    LabelPatch {
        node: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("node {node}: writing label {}: {source}", keys::LABEL_RESULT)]
    Label {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("node {node}: reading it for the suspect taint: {source}")]
    ReadForTaint {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error("node {node}: changing the suspect taint: {source}")]
    Taint {
        node: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "node {node}: the suspect taint was not changed: the node kept changing ({attempts} tries)"
    )]
    TaintKeptChanging { node: String, attempts: usize },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_failure_names_the_node_and_the_step() {
        let kept = SignalError::TaintKeptChanging {
            node: "gpu-1".into(),
            attempts: 3,
        };
        assert_eq!(
            kept.to_string(),
            "node gpu-1: the suspect taint was not changed: the node kept changing (3 tries)"
        );
        let source = serde_json::from_str::<serde_json::Value>("{").expect_err("not JSON");
        let why = source.to_string();
        let patch = SignalError::LabelPatch {
            node: "gpu-2".into(),
            source,
        };
        assert_eq!(
            patch.to_string(),
            format!("node gpu-2: the label patch is not JSON: {why}")
        );
    }
}
