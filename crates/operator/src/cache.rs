//! What the operator's caches keep of each object: only the fields its controllers read, so
//! that a cache of thousands of Nodes and benchmark Pods stays small. Objects read from the
//! API server directly (a pod the cache has not seen yet) are whole; the readers need no
//! more than what is kept here.

use k8s_openapi::api::core::v1::{
    Affinity, Node, NodeAffinity, NodeSpec, NodeStatus, Pod, PodSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
use kube::Resource;

/// Drops what no reader of any cached object needs: managed fields.
pub fn slim<K: Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

/// A benchmark pod as the run controller reads it: its metadata, its whole status (phase,
/// conditions, container states and termination messages, pod IP) and, of its spec, only the
/// node it is bound to, the node its affinity requires (a pod that claims its GPUs, before
/// the scheduler binds it: [`crate::pods::claim::required_node`]), its
/// `activeDeadlineSeconds` and its resource claims (whether it claims its GPUs: a claim the
/// scheduler cannot allocate is said so, [`crate::results::pod_state`]). The containers (arguments, environment, volumes) are what the
/// operator wrote and never reads back.
pub fn slim_pod(pod: &mut Pod) {
    slim(pod);
    if let Some(spec) = pod.spec.take() {
        let required = spec
            .affinity
            .and_then(|a| a.node_affinity)
            .and_then(|n| n.required_during_scheduling_ignored_during_execution);
        pod.spec = Some(PodSpec {
            node_name: spec.node_name,
            active_deadline_seconds: spec.active_deadline_seconds,
            resource_claims: spec.resource_claims,
            affinity: required.map(|r| Affinity {
                node_affinity: Some(NodeAffinity {
                    required_during_scheduling_ignored_during_execution: Some(r),
                    ..NodeAffinity::default()
                }),
                ..Affinity::default()
            }),
            ..PodSpec::default()
        });
    }
}

/// A Node as node selection, quarantine and the node signals read it: metadata (labels,
/// annotations, creation time), taints and `unschedulable`, GPU capacity and allocatable,
/// and conditions. Of the managed fields, only who set `spec.unschedulable` last (the one
/// entry that owns it, with that field alone): whose a cordon is. Its image list,
/// addresses, system info and volumes are dropped.
pub fn slim_node(node: &mut Node) {
    let cordon = node.metadata.managed_fields.take().and_then(|fields| {
        fields
            .into_iter()
            .find(crate::quarantine::manages_cordon)
            .map(|m| ManagedFieldsEntry {
                manager: m.manager,
                operation: m.operation,
                fields_type: m.fields_type,
                fields_v1: Some(FieldsV1(
                    serde_json::json!({"f:spec": {"f:unschedulable": {}}}),
                )),
                ..ManagedFieldsEntry::default()
            })
    });
    node.metadata.managed_fields = cordon.map(|c| vec![c]);
    if let Some(spec) = node.spec.take() {
        node.spec = Some(NodeSpec {
            taints: spec.taints,
            unschedulable: spec.unschedulable,
            ..NodeSpec::default()
        });
    }
    if let Some(status) = node.status.take() {
        node.status = Some(NodeStatus {
            allocatable: status.allocatable,
            capacity: status.capacity,
            conditions: status.conditions,
            ..NodeStatus::default()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::{self, PodState};
    use serde_json::json;

    fn pod(state: serde_json::Value, phase: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u",
                "managedFields": [{"manager": "x", "operation": "Apply"}]},
            "spec": {
                "nodeName": "gpu-0",
                "activeDeadlineSeconds": 600,
                "containers": [{"name": crate::pods::CONTAINER, "image": "i",
                    "args": ["node-check"], "env": [{"name": "A", "value": "b"}]}]
            },
            "status": {
                "phase": phase,
                "podIP": "10.0.0.1",
                "reason": if phase == "Failed" { "DeadlineExceeded" } else { "" },
                "containerStatuses": [{"name": crate::pods::CONTAINER, "image": "i",
                    "imageID": "", "ready": false, "restartCount": 0, "state": state}]
            }
        }))
        .expect("a pod")
    }

    #[test]
    fn a_slim_pod_reads_as_the_whole_pod_does() {
        let cases = [
            pod(
                json!({"running": {"startedAt": "2026-11-25T00:00:00Z"}}),
                "Running",
            ),
            pod(
                json!({"waiting": {"reason": "ImagePullBackOff", "message": "no"}}),
                "Pending",
            ),
            pod(
                json!({"terminated": {"exitCode": 3, "message": "not a document"}}),
                "Failed",
            ),
            pod(
                json!({"terminated": {"exitCode": 0, "message": "{}"}}),
                "Succeeded",
            ),
        ];
        for whole in cases {
            let mut kept = whole.clone();
            slim_pod(&mut kept);
            assert!(kept.metadata.managed_fields.is_none());
            let spec = kept.spec.as_ref().expect("spec kept");
            assert!(spec.containers.is_empty());
            assert_eq!(spec.node_name.as_deref(), Some("gpu-0"));
            assert_eq!(spec.active_deadline_seconds, Some(600));
            assert_eq!(
                format!("{:?}", results::pod_state(&kept)),
                format!("{:?}", results::pod_state(&whole))
            );
            assert_eq!(
                format!("{:?}", crate::pairs::phase::pair_pod(&kept)),
                format!("{:?}", crate::pairs::phase::pair_pod(&whole))
            );
        }
        // The cases above are not all alike: the comparison means something.
        let states: std::collections::BTreeSet<String> = [
            pod(json!({"running": {}}), "Running"),
            pod(json!({"terminated": {"exitCode": 3}}), "Failed"),
        ]
        .iter()
        .map(|p| format!("{:?}", results::pod_state(p)))
        .collect();
        assert_eq!(states.len(), 2);
        assert!(matches!(
            results::pod_state(&pod(json!({"running": {}}), "Running")),
            PodState::Running
        ));
    }

    #[test]
    fn a_claiming_pod_not_bound_yet_is_still_its_runs_once_cached() {
        let run = crate::pods::tests::run();
        let made = crate::pods::claim::benchmark_pod(
            &run,
            "gpu-0",
            crate::pods::claim::Gpus::Devices {
                count: 8,
                version: "v1",
            },
            |g| crate::pods::node_check_pod(&run, "gpu-0", g),
        )
        .expect("pod");
        let mut pod = made.pod;
        pod.metadata.uid = Some("pod-uid".into());
        // The scheduler cannot allocate its claim.
        pod.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Pending".into()),
            conditions: Some(vec![k8s_openapi::api::core::v1::PodCondition {
                type_: "PodScheduled".into(),
                status: "False".into(),
                reason: Some("Unschedulable".into()),
                message: Some("0/4 nodes are available: 1 cannot allocate all claims.".into()),
                ..Default::default()
            }]),
            ..Default::default()
        });
        let whole = pod.clone();
        slim_pod(&mut pod);
        let state = results::pod_state(&pod);
        assert_eq!(state, results::pod_state(&whole));
        assert!(
            matches!(&state, PodState::Waiting(Some(b))
                if b.detail.starts_with("the node's GPUs could not be claimed")),
            "{state:?}"
        );
        assert!(pod.spec.as_ref().is_some_and(|s| s.containers.is_empty()));
        assert_eq!(crate::pods::claim::required_node(&pod), Some("gpu-0"));
        assert_eq!(
            crate::identity::pod_made_by(&pod, "run-uid", "pod-uid", "gpu-0"),
            crate::identity::pod_made_by(&whole, "run-uid", "pod-uid", "gpu-0"),
        );
        assert_eq!(
            crate::identity::pod_made_by(&pod, "run-uid", "pod-uid", "gpu-0"),
            Ok(())
        );
    }

    #[test]
    fn a_slim_node_keeps_what_selection_and_signals_read() {
        let mut node: Node = serde_json::from_value(json!({
            "metadata": {"name": "gpu-0", "labels": {"pool": "a"},
                "annotations": {"gpufabric.io/counters": "{}"}},
            "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}], "unschedulable": true,
                "podCIDR": "10.0.0.0/24", "providerID": "x"},
            "status": {
                "capacity": {"nvidia.com/gpu": "8"},
                "allocatable": {"nvidia.com/gpu": "8"},
                "conditions": [{"type": "Ready", "status": "True"}],
                "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}],
                "images": [{"names": ["a"], "sizeBytes": 1}],
                "nodeInfo": {"architecture": "amd64", "bootID": "", "containerRuntimeVersion": "",
                    "kernelVersion": "", "kubeProxyVersion": "", "kubeletVersion": "",
                    "machineID": "", "operatingSystem": "linux", "osImage": "", "systemUUID": ""}
            }
        }))
        .expect("a node");
        let whole = node.clone();
        slim_node(&mut node);
        assert_eq!(crate::pods::allocatable_gpus(&node), 8);
        assert_eq!(node.metadata.labels, whole.metadata.labels);
        assert_eq!(node.metadata.annotations, whole.metadata.annotations);
        let (spec, status) = (node.spec.expect("spec"), node.status.expect("status"));
        assert_eq!(spec.taints.map(|t| t.len()), Some(1));
        assert_eq!(spec.unschedulable, Some(true));
        assert!(spec.pod_cidr.is_none() && spec.provider_id.is_none());
        assert_eq!(status.conditions.map(|c| c.len()), Some(1));
        assert!(status.capacity.is_some());
        assert!(
            status.addresses.is_none() && status.images.is_none() && status.node_info.is_none()
        );
    }

    #[test]
    fn a_slim_node_keeps_who_cordoned_it_and_no_other_managed_field() {
        let mut node: Node = serde_json::from_value(json!({
            "metadata": {"name": "gpu-0", "managedFields": [
                {"manager": "kubelet", "operation": "Update", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:status": {"f:conditions": {}}}},
                {"manager": "kubectl", "operation": "Update", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:spec": {"f:unschedulable": {}, "f:taints": {}},
                        "f:metadata": {"f:labels": {"f:x": {}}}}}
            ]},
            "spec": {"unschedulable": true}
        }))
        .expect("a node");
        assert_eq!(crate::quarantine::cordon_manager(&node), Some("kubectl"));
        slim_node(&mut node);
        let kept = node
            .metadata
            .managed_fields
            .clone()
            .expect("the cordon's entry");
        assert_eq!(kept.len(), 1);
        assert_eq!(
            kept[0].fields_v1.as_ref().map(|f| f.0.clone()),
            Some(json!({"f:spec": {"f:unschedulable": {}}}))
        );
        assert_eq!(crate::quarantine::cordon_manager(&node), Some("kubectl"));
        // A node nobody cordoned keeps no managed fields at all.
        let mut plain: Node = serde_json::from_value(json!({
            "metadata": {"name": "gpu-1", "managedFields": [
                {"manager": "kubelet", "operation": "Update", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:status": {}}}]}
        }))
        .expect("a node");
        slim_node(&mut plain);
        assert!(plain.metadata.managed_fields.is_none());
    }
}
