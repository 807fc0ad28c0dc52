//! What both controllers share: the client, the metrics, the Events publisher, the caches
//! (Nodes, benchmark Pods, FabricTestRuns and their shards) kept current by watches, and
//! the cluster-wide quarantine cap with its lock. What only a run needs is the run
//! controller's own (`controller::run::context`).

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

/// What both controllers share.
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
    /// The shard statuses this process wrote last, read on top of `shards`.
    pub shard_writes: Arc<ShardWrites>,
    /// Failed reconciles in a row per object, for the retry backoff.
    pub backoff: ErrorBackoff,
    /// Becomes true once the Node, Pod and run caches have been filled.
    pub synced: tokio::sync::watch::Receiver<bool>,
    /// The cluster-wide cap on nodes held in quarantine (`--max-quarantined-nodes`).
    pub cluster_cap: Option<gpufabric_health::ClusterCap>,
    /// Held while one FabricTest counts the nodes held in the cluster, plans and applies
    /// its plan, so that two tests never both take the last slot of the cluster-wide cap.
    pub quarantine_lock: Arc<tokio::sync::Mutex<()>>,
    /// The quarantine records this process wrote, read on top of `nodes` when the fold
    /// counts what the cluster holds.
    pub quarantine_writes: Arc<crate::quarantine::Ledger>,
    /// The last folded run per test whose node signals this process wrote.
    pub signals_written: Arc<crate::signals::pending::Written>,
    /// The last read of which nodes' GPUs are DRA devices, shared by the pods made soon
    /// after, the targets of a FabricTest and the node watch.
    pub devices: Arc<crate::dra::cache::DeviceCache>,
}

impl Context {
    /// Waits until the Node, Pod and run caches have been filled once: a run must not pick
    /// its nodes from an empty cache, nor think its pods are missing.
    pub async fn caches_ready(&self) {
        // Not `Store::wait_until_ready` here: it wakes only one of several waiters.
        let mut synced = self.synced.clone();
        let _ = synced.wait_for(|s| *s).await;
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
            shard_writes: Default::default(),
            backoff: Default::default(),
            synced,
            cluster_cap: None,
            quarantine_lock: Default::default(),
            quarantine_writes: Default::default(),
            signals_written: Default::default(),
            devices: Default::default(),
        })
    }
}
