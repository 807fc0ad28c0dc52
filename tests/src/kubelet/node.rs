//! The simulated nodes: registration (labels, capacity, conditions), node status, and the
//! Lease heartbeat that keeps the node lifecycle controller calling them Ready.

use super::status::now;
use super::{
    Inner, KUBELET_VERSION, LABEL_SIMULATED, LEASE_SECONDS, MANAGER, NODE_LEASE_NS, NodeState, lock,
};
use crate::{Result, kube_err};
use gpufabric_api::keys;
use gpufabric_measure::fleet::FleetNode;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

fn now_micro() -> String {
    chrono::Utc::now()
        .format("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string()
}

impl Inner {
    pub(super) async fn register_node(&self, n: &FleetNode) -> Result<()> {
        let mut labels: BTreeMap<String, String> = n.labels.clone();
        labels.insert("kubernetes.io/hostname".into(), n.name.clone());
        labels.insert("kubernetes.io/os".into(), "linux".into());
        labels.insert("kubernetes.io/arch".into(), "amd64".into());
        labels.insert(keys::LABEL_GPU_PRODUCT.into(), n.product.clone());
        labels.insert(keys::LABEL_GPU_COUNT.into(), n.gpus.to_string());
        labels.insert(LABEL_SIMULATED.into(), "true".into());
        let obj = json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": n.name,
                "labels": labels,
                "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
            },
        });
        let nodes: Api<Node> = Api::all(self.client.clone());
        nodes
            .patch(
                &n.name,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(obj),
            )
            .await
            .map_err(kube_err(format!("registering node {}", n.name)))?;
        self.patch_node_status(&n.name).await?;
        self.renew_lease(&n.name).await
    }

    fn node_status(&self, st: &NodeState) -> Value {
        let t = now();
        let gpus = st.spec.gpus.to_string();
        let resources = json!({
            "cpu": self.opts.cpu,
            "memory": self.opts.memory,
            "pods": self.opts.max_pods,
            "ephemeral-storage": "1Ti",
            keys::RESOURCE_GPU: gpus,
        });
        let cond = |type_: &str, status: &str, reason: &str, message: &str, since: &str| {
            json!({"type": type_, "status": status, "reason": reason, "message": message,
                   "lastHeartbeatTime": t, "lastTransitionTime": since})
        };
        let ready = if st.ready {
            cond(
                "Ready",
                "True",
                "KubeletReady",
                "kubelet is posting ready status",
                &st.ready_since,
            )
        } else {
            cond(
                "Ready",
                "False",
                "KubeletNotReady",
                "node made NotReady by the test",
                &st.ready_since,
            )
        };
        json!({"status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available", &st.ready_since),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure", &st.ready_since),
                cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available", &st.ready_since),
                ready,
            ],
            "addresses": [
                {"type": "InternalIP", "address": "127.0.0.1"},
                {"type": "Hostname", "address": st.spec.name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 0}},
            "nodeInfo": {
                "machineID": st.spec.name, "systemUUID": st.spec.name, "bootID": st.spec.name,
                "kernelVersion": "", "osImage": "gpufabric process-kubelet",
                "containerRuntimeVersion": "process://", "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64",
            },
        }})
    }

    pub(super) async fn patch_node_status(&self, node: &str) -> Result<()> {
        let status = {
            let nodes = lock(&self.nodes);
            match nodes.get(node) {
                Some(st) if !st.removed => self.node_status(st),
                _ => return Ok(()),
            }
        };
        let nodes: Api<Node> = Api::all(self.client.clone());
        nodes
            .patch_status(node, &PatchParams::default(), &Patch::Merge(status))
            .await
            .map_err(kube_err(format!("writing the status of node {node}")))?;
        Ok(())
    }

    pub(super) async fn renew_lease(&self, node: &str) -> Result<()> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let uid = nodes
            .get_opt(node)
            .await
            .map_err(kube_err(format!("reading node {node}")))?
            .and_then(|n| n.metadata.uid);
        let mut meta = json!({"name": node, "namespace": NODE_LEASE_NS});
        if let Some(uid) = uid {
            meta["ownerReferences"] =
                json!([{"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}]);
        }
        let lease = json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {
                "holderIdentity": node,
                "leaseDurationSeconds": LEASE_SECONDS,
                "renewTime": now_micro(),
            },
        });
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), NODE_LEASE_NS);
        leases
            .patch(
                node,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(lease),
            )
            .await
            .map_err(kube_err(format!("renewing the lease of node {node}")))?;
        Ok(())
    }
}

pub(super) async fn heartbeat_loop(inner: Arc<Inner>) {
    let mut since_status = Duration::ZERO;
    loop {
        tokio::time::sleep(inner.opts.heartbeat).await;
        since_status += inner.opts.heartbeat;
        let refresh_status = since_status >= inner.opts.status_interval;
        if refresh_status {
            since_status = Duration::ZERO;
        }
        let names: Vec<(String, bool)> = lock(&inner.nodes)
            .values()
            .filter(|n| !n.removed)
            .map(|n| (n.spec.name.clone(), n.ready))
            .collect();
        for (name, ready) in names {
            if ready && let Err(e) = inner.renew_lease(&name).await {
                tracing::warn!(node = %name, error = %e, "lease renewal failed");
            }
            if refresh_status && let Err(e) = inner.patch_node_status(&name).await {
                tracing::warn!(node = %name, error = %e, "node status update failed");
            }
        }
    }
}
