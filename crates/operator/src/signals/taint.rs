//! Graduated taints (`spec.quarantine.graduatedTaints`): a suspect node gets
//! `gpufabric.io/suspect:PreferNoSchedule`, removed when it passes, when its failure is
//! confirmed (quarantine then applies the mode's own action), and when the FabricTest is
//! deleted. Owned like the quarantine taint: the annotation `gpufabric.io/suspect-taint`
//! names the test that added it, and a taint without it is someone else's and never touched.
//! Each change is one merge patch guarded by the node's resourceVersion.

use super::SignalError;
use gpufabric_api::keys::{ANNOTATION_SUSPECT_TAINT, MANAGER, TAINT_SUSPECT};
use gpufabric_api::standing::Standing;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

/// Effect of the suspect taint: the scheduler avoids the node when it can, nothing is
/// evicted and nothing that must run there is refused.
pub const SUSPECT_EFFECT: &str = "PreferNoSchedule";
/// Tries of one node's change when it keeps changing underneath (409 Conflict).
const ATTEMPTS: usize = 3;

fn has_suspect_taint(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == TAINT_SUSPECT))
}

/// The guarded merge patch that brings the suspect taint of `node` in line with
/// the test's standing of it for the test `test_key`; None when nothing is to change or the taint is not
/// ours to change. Pure.
pub fn suspect_taint_patch(node: &Node, test_key: &str, standing: &Standing) -> Option<Value> {
    let owner = node.annotations().get(ANNOTATION_SUSPECT_TAINT);
    let tainted = has_suspect_taint(node);
    let rv = node.metadata.resource_version.clone()?;
    let taints: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let (taints, annotation) = match standing {
        Standing::NotMeasured | Standing::Gated => return None,
        Standing::Suspect if !tainted && owner.is_none() => {
            let mut t = taints;
            t.push(Taint {
                key: TAINT_SUSPECT.to_string(),
                value: Some("true".to_string()),
                effect: SUSPECT_EFFECT.to_string(),
                time_added: None,
            });
            (t, json!(test_key))
        }
        Standing::Suspect => return None,
        _ if owner.map(String::as_str) == Some(test_key) => (
            taints
                .into_iter()
                .filter(|t| t.key != TAINT_SUSPECT)
                .collect(),
            Value::Null,
        ),
        _ => return None,
    };
    Some(json!({
        "metadata": {
            "resourceVersion": rv,
            "annotations": { ANNOTATION_SUSPECT_TAINT: annotation },
        },
        "spec": { "taints": taints },
    }))
}

/// Reads `node` and applies [`suspect_taint_patch`], again on a conflict. A node that is
/// gone is fine.
pub async fn apply(
    api: &Api<Node>,
    node: &str,
    test_key: &str,
    standing: &Standing,
) -> Result<(), SignalError> {
    let pp = PatchParams {
        field_manager: Some(MANAGER.to_string()),
        ..Default::default()
    };
    for _ in 0..ATTEMPTS {
        let current = match api.get_opt(node).await {
            Ok(Some(n)) => n,
            Ok(None) => return Ok(()),
            Err(source) => {
                return Err(SignalError::ReadForTaint {
                    node: node.to_string(),
                    source,
                });
            }
        };
        let Some(patch) = suspect_taint_patch(&current, test_key, standing) else {
            return Ok(());
        };
        match api.patch(node, &pp, &Patch::Merge(&patch)).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(e)) if e.code == 409 => continue,
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
            Err(source) => {
                return Err(SignalError::Taint {
                    node: node.to_string(),
                    source,
                });
            }
        }
    }
    Err(SignalError::TaintKeptChanging {
        node: node.to_string(),
        attempts: ATTEMPTS,
    })
}

/// Removes the suspect taints the test `test_key` added, on every node (the FabricTest is
/// being deleted). Returns the nodes that could not be changed, with why.
pub async fn release_all(client: &Client, test_key: &str) -> Result<Vec<String>, kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let ours = super::nodes_where(&api, |n| {
        n.annotations()
            .get(ANNOTATION_SUSPECT_TAINT)
            .map(String::as_str)
            == Some(test_key)
    })
    .await?;
    let mut failures = Vec::new();
    for n in ours {
        // Any standing but Suspect removes our taint.
        if let Err(e) = apply(&api, &n.name_any(), test_key, &Standing::Passing).await {
            failures.push(e.to_string());
        }
    }
    Ok(failures)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn node(taints: &[(&str, &str)], owner: Option<&str>) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some("n".into());
        n.metadata.resource_version = Some("7".into());
        n.metadata.annotations =
            owner.map(|o| BTreeMap::from([(ANNOTATION_SUSPECT_TAINT.to_string(), o.to_string())]));
        n.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            taints: Some(
                taints
                    .iter()
                    .map(|(k, e)| Taint {
                        key: k.to_string(),
                        effect: e.to_string(),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        });
        n
    }

    fn keys(patch: &Value) -> Vec<String> {
        patch["spec"]["taints"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|t| {
                        format!(
                            "{}:{}",
                            t["key"].as_str().unwrap_or(""),
                            t["effect"].as_str().unwrap_or("")
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn a_suspect_gets_the_prefer_no_schedule_taint_beside_the_taints_it_has() {
        let n = node(&[("nvidia.com/gpu", "NoSchedule")], None);
        let p = suspect_taint_patch(&n, "ns/t", &Standing::Suspect).expect("patch");
        assert_eq!(
            keys(&p),
            [
                "nvidia.com/gpu:NoSchedule",
                "gpufabric.io/suspect:PreferNoSchedule"
            ]
        );
        assert_eq!(
            p["metadata"]["annotations"][ANNOTATION_SUSPECT_TAINT],
            "ns/t"
        );
        assert_eq!(p["metadata"]["resourceVersion"], "7", "guarded");
    }

    #[test]
    fn a_pass_or_a_confirmation_removes_only_our_taint() {
        let ours = node(
            &[
                ("nvidia.com/gpu", "NoSchedule"),
                (TAINT_SUSPECT, SUSPECT_EFFECT),
            ],
            Some("ns/t"),
        );
        for j in [
            Standing::Passing,
            Standing::Failing { hardware: false },
            Standing::Quarantined { hardware: true },
        ] {
            let p = suspect_taint_patch(&ours, "ns/t", &j).expect("patch");
            assert_eq!(keys(&p), ["nvidia.com/gpu:NoSchedule"], "{j:?}");
            assert_eq!(
                p["metadata"]["annotations"][ANNOTATION_SUSPECT_TAINT],
                Value::Null
            );
        }
        assert_eq!(
            suspect_taint_patch(&ours, "ns/other", &Standing::Passing),
            None,
            "another test's taint"
        );
        let someone_elses = node(&[(TAINT_SUSPECT, SUSPECT_EFFECT)], None);
        assert_eq!(
            suspect_taint_patch(&someone_elses, "ns/t", &Standing::Passing),
            None
        );
        assert_eq!(
            suspect_taint_patch(&someone_elses, "ns/t", &Standing::Suspect),
            None,
            "already tainted by someone else: not ours"
        );
    }

    #[test]
    fn a_node_not_measured_or_already_suspect_is_left_alone() {
        let ours = node(&[(TAINT_SUSPECT, SUSPECT_EFFECT)], Some("ns/t"));
        assert_eq!(
            suspect_taint_patch(&ours, "ns/t", &Standing::NotMeasured),
            None
        );
        assert_eq!(suspect_taint_patch(&ours, "ns/t", &Standing::Suspect), None);
        assert_eq!(
            suspect_taint_patch(&node(&[], None), "ns/t", &Standing::Passing),
            None,
            "nothing to remove"
        );
    }
}
