//! Which pods are the operator's own: the UID it recorded when it made one, the run as the
//! pod's controller, and the node it was made for. A name, a label or an owner reference
//! alone proves nothing: anyone who can create pods in the namespace can copy them.
//!
//! The rule for a pod the operator made but whose UID it could not record (it stopped, or
//! the write failed, between the create and the record): such a pod is never read. When it
//! names the run as its controller it is deleted (with its UID as precondition, so only that
//! pod goes) and made again, and the new one's UID is recorded; so a lost write costs a node
//! its check once, never its result. A pod at the name that does not name the run as its
//! controller is someone else's: the name is taken, and the node is not measured.
//!
//! The run's rendezvous Secret follows the same rule without the second chance: the
//! operator may create Secrets but never read or delete one, so a Secret at the name that
//! the run did not record making is never used, and the phase that needs it does not run.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Why an object is not the one this run made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NotOurs {
    #[error("{kind} {name} is not the one this run made (UID {found}, made {made})")]
    OtherUid {
        kind: &'static str,
        name: String,
        found: String,
        made: String,
    },
    #[error("{kind} {name} is not controlled by this run")]
    NotControlled { kind: &'static str, name: String },
    #[error("pod {name} runs on node {found}, not on {made} that it was made for")]
    OtherNode {
        name: String,
        found: String,
        made: String,
    },
}

/// The object names run `run_uid` as its controller.
pub fn controlled_by(meta: &ObjectMeta, run_uid: &str) -> bool {
    meta.owner_references
        .iter()
        .flatten()
        .any(|o| o.controller == Some(true) && o.uid == run_uid)
}

/// The object (a `kind`) is the one run `run_uid` made and recorded as `made`: its UID, and
/// the run as its controller.
pub fn made_by(
    kind: &'static str,
    meta: &ObjectMeta,
    run_uid: &str,
    made: &str,
) -> Result<(), NotOurs> {
    let name = meta.name.clone().unwrap_or_default();
    let found = meta.uid.as_deref().unwrap_or_default();
    if found != made {
        return Err(NotOurs::OtherUid {
            kind,
            name,
            found: found.to_string(),
            made: made.to_string(),
        });
    }
    if !controlled_by(meta, run_uid) {
        return Err(NotOurs::NotControlled { kind, name });
    }
    Ok(())
}

/// The pod is the one run `run_uid` made for `node` and recorded as `made`: its UID, the run
/// as its controller, and `spec.nodeName` the node (or, before the scheduler binds a pod
/// that claims its GPUs, the one node its affinity requires: [`crate::pods::claim`]).
pub fn pod_made_by(
    pod: &k8s_openapi::api::core::v1::Pod,
    run_uid: &str,
    made: &str,
    node: &str,
) -> Result<(), NotOurs> {
    made_by("pod", &pod.metadata, run_uid, made)?;
    let on = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())
        .or_else(|| crate::pods::claim::required_node(pod))
        .unwrap_or_default();
    if on != node {
        return Err(NotOurs::OtherNode {
            name: pod.metadata.name.clone().unwrap_or_default(),
            found: on.to_string(),
            made: node.to_string(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Pod, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn pod(uid: &str, owner: &str, controller: bool, node: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("nightly-1-0a1b2c3d-gpu-01".into()),
                uid: Some(uid.into()),
                owner_references: Some(vec![OwnerReference {
                    api_version: "gpufabric.io/v1alpha1".into(),
                    kind: "FabricTestRun".into(),
                    name: "nightly-1".into(),
                    uid: owner.into(),
                    controller: controller.then_some(true),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            spec: Some(PodSpec {
                node_name: Some(node.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_pod_the_run_made_is_its_own() {
        assert_eq!(
            pod_made_by(&pod("p1", "run", true, "gpu-01"), "run", "p1", "gpu-01"),
            Ok(())
        );
    }

    #[test]
    fn a_pod_with_a_copied_name_and_owner_but_another_uid_is_not() {
        let e = pod_made_by(&pod("p2", "run", true, "gpu-01"), "run", "p1", "gpu-01");
        assert!(matches!(e, Err(NotOurs::OtherUid { .. })), "{e:?}");
        let msg = e.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            msg.contains("nightly-1-0a1b2c3d-gpu-01") && msg.contains("p2"),
            "{msg}"
        );
    }

    #[test]
    fn a_pod_the_run_does_not_control_is_not() {
        let e = pod_made_by(&pod("p1", "run", false, "gpu-01"), "run", "p1", "gpu-01");
        assert!(matches!(e, Err(NotOurs::NotControlled { .. })), "{e:?}");
        let e = pod_made_by(&pod("p1", "other", true, "gpu-01"), "run", "p1", "gpu-01");
        assert!(matches!(e, Err(NotOurs::NotControlled { .. })), "{e:?}");
    }

    #[test]
    fn a_pod_on_another_node_is_not() {
        let e = pod_made_by(&pod("p1", "run", true, "gpu-02"), "run", "p1", "gpu-01");
        assert!(matches!(e, Err(NotOurs::OtherNode { .. })), "{e:?}");
    }

    #[test]
    fn a_claiming_pod_not_bound_yet_is_its_own_only_when_kept_to_its_node() {
        let mut p = pod("p1", "run", true, "gpu-01");
        crate::pods::claim::use_template(&mut p, "gpu-01", "t");
        assert_eq!(pod_made_by(&p, "run", "p1", "gpu-01"), Ok(()));
        let e = pod_made_by(&p, "run", "p1", "gpu-02");
        assert!(matches!(e, Err(NotOurs::OtherNode { .. })), "{e:?}");
        let mut unpinned = pod("p1", "run", true, "");
        if let Some(s) = unpinned.spec.as_mut() {
            s.node_name = None;
        }
        let e = pod_made_by(&unpinned, "run", "p1", "gpu-01");
        assert!(matches!(e, Err(NotOurs::OtherNode { .. })), "{e:?}");
    }
}
