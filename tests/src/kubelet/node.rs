//! The simulated nodes: registration (labels, capacity, conditions), node status, and the
//! Lease heartbeat that keeps the node lifecycle controller calling them Ready.

use super::status::now;
use super::{
    Inner, KUBELET_VERSION, Kubelet, LABEL_SIMULATED, LEASE_SECONDS, MANAGER, NODE_LEASE_NS,
    NodeState, Stop, lock, pod_watch,
};
use crate::{Error, Result, kube_err};
use gpufabric_api::keys;
use gpufabric_measure::fleet::FleetNode;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

fn now_micro() -> String {
    chrono::Utc::now()
        .format("%Y-%m-%dT%H:%M:%S%.6fZ")
        .to_string()
}

/// The taint the API server's TaintNodesByCondition admission puts on every new node, and
/// the node lifecycle controller takes off once it sees the node Ready.
const TAINT_NOT_READY: &str = "node.kubernetes.io/not-ready";

impl Inner {
    /// Waits until no Ready node of the fleet carries [`TAINT_NOT_READY`], as a real node
    /// is schedulable only once its kubelet has reported Ready: a run that starts earlier
    /// skips the node as tainted by someone else. The taint is there from the node's
    /// creation, so no window lets a node through before the controller has seen it. Gives
    /// up after `timeout` with a warning (without kube-controller-manager nothing takes the
    /// taint off).
    pub(super) async fn wait_not_ready_taints_gone(&self, timeout: Duration) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let names: std::collections::BTreeSet<String> = lock(&self.nodes)
            .iter()
            .filter(|(_, st)| st.ready && !st.removed)
            .map(|(name, _)| name.clone())
            .collect();
        let start = tokio::time::Instant::now();
        let end = start + timeout;
        loop {
            // One list a poll, not a get per node: fleets run to thousands of nodes.
            let tainted: Vec<String> = match nodes.list(&ListParams::default()).await {
                Ok(list) => list
                    .items
                    .into_iter()
                    .filter(|n| {
                        n.spec
                            .as_ref()
                            .and_then(|s| s.taints.as_ref())
                            .is_some_and(|t| t.iter().any(|t| t.key == TAINT_NOT_READY))
                    })
                    .filter_map(|n| n.metadata.name)
                    .filter(|name| names.contains(name))
                    .collect(),
                // An API error: not worth waiting on.
                Err(_) => Vec::new(),
            };
            if tainted.is_empty() {
                tracing::debug!(waited = ?start.elapsed(), "no node carries {TAINT_NOT_READY}");
                return;
            }
            if tokio::time::Instant::now() >= end {
                tracing::warn!(
                    nodes = tainted.len(),
                    first = ?tainted.first(),
                    "nodes still carry {TAINT_NOT_READY} after {timeout:?}; going on"
                );
                return;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

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
        let mut resources = json!({
            "cpu": self.opts.cpu,
            "memory": self.opts.memory,
            "pods": self.opts.max_pods,
            "ephemeral-storage": "1Ti",
        });
        if !self.opts.dra_only_nodes.contains(&st.spec.name) {
            resources[keys::RESOURCE_GPU] = json!(gpus);
        }
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
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.log_port}},
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
            // Strategic, as a kubelet does: conditions merge by type, so those that others
            // write (e.g. GPUFabricDegraded) stay.
            .patch_status(node, &PatchParams::default(), &Patch::Strategic(status))
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

impl Kubelet {
    /// Names of the nodes this kubelet runs (removed ones excluded).
    pub fn node_names(&self) -> Vec<String> {
        lock(&self.inner.nodes)
            .values()
            .filter(|n| !n.removed)
            .map(|n| n.spec.name.clone())
            .collect()
    }

    /// Makes a node Ready or NotReady now: writes the Ready condition, and stops (or
    /// resumes) its Lease heartbeat. Its pods keep running.
    pub async fn set_node_ready(&self, node: &str, ready: bool) -> Result<()> {
        {
            let mut nodes = lock(&self.inner.nodes);
            let st = nodes
                .get_mut(node)
                .filter(|s| !s.removed)
                .ok_or_else(|| Error::Invalid(format!("no node {node} in this kubelet")))?;
            if st.ready != ready {
                st.ready = ready;
                st.ready_since = now();
            }
        }
        self.inner.patch_node_status(node).await
    }

    /// Makes the pods started on `node` from now on run past their `activeDeadlineSeconds`
    /// (or enforces the deadline again for pods started later).
    pub async fn set_node_ignores_deadlines(&self, node: &str, ignore: bool) -> Result<()> {
        let mut nodes = lock(&self.inner.nodes);
        let st = nodes
            .get_mut(node)
            .filter(|s| !s.removed)
            .ok_or_else(|| Error::Invalid(format!("no node {node} in this kubelet")))?;
        st.deadlines_ignored = ignore;
        Ok(())
    }

    /// Stalls a node (it stays Ready but starts no pod) or resumes it: pods bound to it
    /// while it was stalled start then, as behind a container runtime that recovers.
    /// Pods already running keep running.
    pub async fn set_node_stalled(&self, node: &str, stalled: bool) -> Result<()> {
        {
            let mut nodes = lock(&self.inner.nodes);
            let st = nodes
                .get_mut(node)
                .filter(|s| !s.removed)
                .ok_or_else(|| Error::Invalid(format!("no node {node} in this kubelet")))?;
            st.stalled = stalled;
        }
        if stalled {
            return Ok(());
        }
        let pods: Api<Pod> = Api::all(self.inner.client.clone());
        let lp = ListParams::default().fields(&format!("spec.nodeName={node}"));
        let list = pods
            .list(&lp)
            .await
            .map_err(kube_err(format!("listing the pods of node {node}")))?;
        for pod in list.items {
            pod_watch::on_pod(&self.inner, pod);
        }
        Ok(())
    }

    /// Removes a node: kills its pods (without writing their status) and deletes its
    /// Node and Lease objects.
    pub async fn remove_node(&self, node: &str) -> Result<()> {
        {
            let mut nodes = lock(&self.inner.nodes);
            let st = nodes
                .get_mut(node)
                .ok_or_else(|| Error::Invalid(format!("no node {node} in this kubelet")))?;
            st.removed = true;
        }
        for h in lock(&self.inner.pods).values().filter(|h| h.node == node) {
            let _ = h.stop.send(Stop::Abandon);
        }
        let nodes: Api<Node> = Api::all(self.inner.client.clone());
        ignore_not_found(nodes.delete(node, &DeleteParams::default()).await)
            .map_err(kube_err(format!("deleting node {node}")))?;
        let leases: Api<Lease> = Api::namespaced(self.inner.client.clone(), NODE_LEASE_NS);
        ignore_not_found(leases.delete(node, &DeleteParams::default()).await)
            .map_err(kube_err(format!("deleting the lease of {node}")))?;
        Ok(())
    }
}

fn ignore_not_found<T>(r: kube::Result<T>) -> kube::Result<()> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(e) => Err(e),
    }
}
