//! What every reconcile shares: the client, the metrics, the Events publisher, and the caches
//! (Nodes, benchmark Pods, FabricTestRuns and their shards) kept current by watches.

use crate::controller::backoff::ErrorBackoff;
use crate::events::Events;
use crate::metrics::Metrics;
use crate::shards::ShardWrites;
use gpufabric_api::run::FabricTestRun;
use gpufabric_api::shard::FabricTestRunShard;
use k8s_openapi::api::core::v1::{Node, ObjectReference, Pod};
use kube::Client;
use kube::runtime::reflector::Store;
use std::sync::Arc;

/// Shared state of the controllers.
#[derive(Clone)]
pub struct Context {
    pub client: Client,
    pub metrics: Arc<Metrics>,
    /// Publishes Kubernetes Events.
    pub events: Events,
    /// Every Node (managed fields and image lists stripped).
    pub nodes: Store<Node>,
    /// Benchmark pods (those with the `gpufabric.io/run` label).
    pub pods: Store<Pod>,
    /// Every FabricTestRun the operator watches (all, or those its label selector matches).
    pub runs: Store<FabricTestRun>,
    /// Every FabricTestRunShard (the runs' per-node results).
    pub shards: Store<FabricTestRunShard>,
    /// The last state of each benchmark pod the watch saw deleted, for a run whose pod is
    /// gone before its pass read how it ended.
    pub departed: Arc<crate::departed::Departed>,
    /// The shard statuses this process wrote last, read on top of `shards`.
    pub shard_writes: Arc<ShardWrites>,
    /// The namespace of the benchmark pods (`--pod-namespace`).
    pub pod_namespace: String,
    /// Failed reconciles in a row per object, for the retry backoff.
    pub backoff: ErrorBackoff,
    /// Becomes true once the Node, Pod and run caches have been filled.
    pub synced: tokio::sync::watch::Receiver<bool>,
    /// The image of benchmark pods whose FabricTest names none (`--agent-image`).
    pub agent_image: String,
    /// What benchmark pods get where their FabricTest names nothing (`--agent-priority-class`,
    /// `--agent-runtime-class`, `--agent-image-pull-secret`).
    pub pod_defaults: crate::pod_defaults::PodDefaults,
    /// The cluster-wide cap on nodes held in quarantine (`--max-quarantined-nodes`).
    pub cluster_cap: Option<gpufabric_health::ClusterCap>,
    /// Held while one FabricTest counts the nodes held in the cluster, plans and applies
    /// its plan, so that two tests never both take the last slot of the cluster-wide cap.
    pub quarantine_lock: Arc<tokio::sync::Mutex<()>>,
    /// Held while a run picks its nodes and freezes them into its shards: two runs starting
    /// at the same moment would otherwise each see the other's nodes free (its pods come a
    /// pass later) and both make a pod on every node, the second refused by the kubelet.
    pub start_lock: Arc<tokio::sync::Mutex<()>>,
    /// Keeps each node's full result once, in the background, as its pod ends; the run's
    /// end has only the last pods left.
    pub keeper: Arc<crate::controller::run::keeper::Keeper>,
    /// When each run's last pass began: a run gets at most one pass a second.
    pub passes: Arc<crate::controller::run::throttle::PassThrottle>,
}

impl Context {
    /// Waits until the Node, Pod and run caches have been filled once: a run must not pick
    /// its nodes from an empty cache, nor think its pods are missing.
    pub async fn caches_ready(&self) {
        // Not `Store::wait_until_ready` here: it wakes only one of several waiters.
        let mut synced = self.synced.clone();
        let _ = synced.wait_for(|s| *s).await;
    }

    /// Gives a container without an image the operator's agent image, and the pod the
    /// installation's priority class, runtime class and pull secrets where its FabricTest
    /// names none, so a FabricTest that names none runs what the operator is configured
    /// with when the pod is created (a chart upgrade changes it), not one frozen into the
    /// FabricTest.
    pub fn resolve_pod_defaults(&self, pod: &mut Pod) {
        fill_image(pod, &self.agent_image);
        self.pod_defaults.fill(pod);
    }

    /// Reference to a run's owning FabricTest, for events on the test.
    pub fn test_ref_of(run: &FabricTestRun) -> Option<ObjectReference> {
        let owner = run
            .metadata
            .owner_references
            .as_ref()?
            .iter()
            .find(|o| o.kind == "FabricTest" && o.controller == Some(true))?;
        Some(ObjectReference {
            api_version: Some(owner.api_version.clone()),
            kind: Some(owner.kind.clone()),
            name: Some(owner.name.clone()),
            uid: Some(owner.uid.clone()),
            ..Default::default()
        })
    }
}

/// Sets `image` on every container of `pod` that has none.
fn fill_image(pod: &mut Pod, image: &str) {
    let containers = pod.spec.iter_mut().flat_map(|s| s.containers.iter_mut());
    for c in containers {
        if c.image.as_deref().is_none_or(|i| i.trim().is_empty()) {
            c.image = Some(image.to_string());
        }
    }
}

#[cfg(test)]
impl Context {
    /// A context over `client` and the given caches (filled and synced), every other part as
    /// a fresh operator has it: what the unit tests of the controllers run against.
    pub(crate) fn for_tests(
        client: Client,
        nodes: Store<Node>,
        pods: Store<Pod>,
        runs: Store<FabricTestRun>,
        shards: Store<FabricTestRunShard>,
    ) -> Arc<Context> {
        let (_, synced) = tokio::sync::watch::channel(true);
        Arc::new(Context {
            client: client.clone(),
            metrics: Arc::new(Metrics::new()),
            events: Events::new(client, crate::events::Reporter::from("gpufabric")),
            nodes,
            pods,
            runs,
            shards,
            departed: Default::default(),
            shard_writes: Default::default(),
            pod_namespace: "gpufabric".into(),
            backoff: Default::default(),
            synced,
            agent_image: "registry.local/fabric-agent:test".into(),
            pod_defaults: Default::default(),
            cluster_cap: None,
            quarantine_lock: Default::default(),
            start_lock: Default::default(),
            keeper: Arc::new(crate::controller::run::keeper::Keeper::new()),
            passes: Default::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec};

    fn pod(image: Option<&str>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "agent".into(),
                    image: image.map(String::from),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn image(p: &Pod) -> Option<&str> {
        p.spec.as_ref()?.containers[0].image.as_deref()
    }

    #[test]
    fn a_pod_without_an_image_gets_the_operators_and_a_named_image_is_kept() {
        for unset in [None, Some(""), Some(" ")] {
            let mut p = pod(unset);
            fill_image(&mut p, "registry.local/agent:2");
            assert_eq!(image(&p), Some("registry.local/agent:2"));
        }
        let mut p = pod(Some("mine:1"));
        fill_image(&mut p, "registry.local/agent:2");
        assert_eq!(image(&p), Some("mine:1"));
    }
}
