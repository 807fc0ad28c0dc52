//! Writes the node signals of a judged run: for every node the run tested, the
//! `GPUFabricHealthy` condition (a strategic merge patch of `nodes/status`) and the result
//! label and last-pass annotation (a merge patch of gpufabric's own keys). A node that
//! cannot be written is reported; it never stops the others nor the reconcile.

use super::node::{self, Judgement};
use crate::time::now;
use futures::StreamExt;
use gpufabric_api::keys;
use gpufabric_api::policy::QuarantineMode;
use gpufabric_api::run::FabricTestRun;
use gpufabric_api::test::{FabricTest, NodeHealth};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use std::collections::{BTreeMap, BTreeSet};

/// Nodes written at once.
pub const WRITE_CONCURRENCY: usize = 16;

/// One node's signals, decided before anything is written.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeSignal {
    pub node: String,
    pub judgement: Judgement,
    /// The condition to write; None: the node keeps the one it has.
    pub condition: Option<k8s_openapi::api::core::v1::NodeCondition>,
    /// The metadata merge patch; None: label and annotation are already right.
    pub metadata: Option<serde_json::Value>,
    /// With graduated taints, the test (`<namespace>/<name>`) that owns the suspect taint.
    pub suspect_taint_owner: Option<String>,
}

/// What writing the signals of one run did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Published {
    /// Judgement per node, for logs and tests.
    pub judged: BTreeMap<String, Judgement>,
    /// Nodes whose signals could not be written, with why.
    pub failures: Vec<String>,
}

/// The signals of every node `run` tested, from the test's history after the run was
/// folded (`history`) and the nodes a confirmation run retests (`confirm`). Pure.
pub fn decide(
    test: &FabricTest,
    run: &FabricTestRun,
    history: &[NodeHealth],
    confirm: &[String],
    nodes: &Store<Node>,
) -> Vec<NodeSignal> {
    let Some(status) = run.status.as_ref() else {
        return Vec::new();
    };
    let stamp = now();
    let passed_at = status
        .completion_time
        .clone()
        .unwrap_or_else(|| stamp.clone());
    let by_node: BTreeMap<&str, &NodeHealth> =
        history.iter().map(|h| (h.node.as_str(), h)).collect();
    let confirm: BTreeSet<&str> = confirm.iter().map(String::as_str).collect();
    let failures_needed = test.spec.quarantine.failures_to_quarantine;
    let test_name = test.name_any();
    let run_name = run.name_any();
    let q = &test.spec.quarantine;
    let taint_owner = (q.graduated_taints && q.mode != QuarantineMode::Observe)
        .then(|| crate::quarantine::test_key(test).ok())
        .flatten();
    status
        .nodes
        .iter()
        .filter_map(|entry| {
            let health = by_node.get(entry.node.as_str()).copied();
            let judgement = Judgement::of(
                entry,
                health,
                confirm.contains(entry.node.as_str()),
                failures_needed,
            )?;
            let current = nodes.get(&ObjectRef::new(&entry.node));
            let detail = match judgement {
                Judgement::NotMeasured => entry.reason.as_deref(),
                _ => health
                    .and_then(|h| h.last_finding.as_deref())
                    .or(entry.reason.as_deref()),
            };
            let message = node::message(&test_name, &run_name, judgement, detail);
            Some(NodeSignal {
                node: entry.node.clone(),
                judgement,
                condition: node::condition(
                    judgement,
                    &message,
                    node::current_condition(current.as_deref()),
                    &stamp,
                ),
                metadata: node::metadata_patch(current.as_deref(), judgement, &passed_at),
                suspect_taint_owner: taint_owner.clone(),
            })
        })
        .collect()
}

/// Writes `signals`, [`WRITE_CONCURRENCY`] nodes at once. A node that is gone is skipped.
pub async fn write(client: &Client, signals: Vec<NodeSignal>) -> Published {
    let api: Api<Node> = Api::all(client.clone());
    let judged = signals
        .iter()
        .map(|s| (s.node.clone(), s.judgement))
        .collect();
    let failures: Vec<String> = futures::stream::iter(signals)
        .map(|s| {
            let api = api.clone();
            async move { write_one(&api, &s).await.err() }
        })
        .buffer_unordered(WRITE_CONCURRENCY)
        .filter_map(|e| async move { e })
        .collect()
        .await;
    Published { judged, failures }
}

async fn write_one(api: &Api<Node>, s: &NodeSignal) -> Result<(), String> {
    let pp = PatchParams {
        field_manager: Some(keys::MANAGER.to_string()),
        ..Default::default()
    };
    if let Some(c) = &s.condition {
        match api
            .patch_status(&s.node, &pp, &Patch::Strategic(node::status_patch(c)))
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
            Err(e) => {
                return Err(format!(
                    "node {}: writing condition {}: {e}",
                    s.node,
                    keys::CONDITION_NODE_HEALTHY
                ));
            }
        }
    }
    if let Some(m) = &s.metadata {
        match api.patch(&s.node, &pp, &Patch::Merge(m)).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
            Err(e) => {
                return Err(format!(
                    "node {}: writing label {}: {e}",
                    s.node,
                    keys::LABEL_RESULT
                ));
            }
        }
    }
    if let Some(owner) = &s.suspect_taint_owner {
        super::taint::apply(api, &s.node, owner, s.judgement).await?;
    }
    Ok(())
}
