//! `fabric-operator` as a library: the FabricTest and FabricTestRun controllers, the pure
//! pieces they are built from (schedule math, pod building, result reading, status
//! folding), metrics, the admin server, and the quarantine executor.

#![forbid(unsafe_code)]

pub mod admin;
pub mod baseline;
pub mod cache;
pub mod context;
pub mod controller;
pub mod counters;
pub mod ddp_nodes;
pub mod departed;
pub mod dra;
pub mod error;
pub mod events;
pub mod identity;
pub mod leader;
pub mod lifecycle;
pub mod metrics;
pub mod metrics_access;
pub mod names;
pub mod nccl_nodes;
pub mod nodes;
pub mod paging;
pub mod pairs;
pub mod pod_defaults;
pub mod pods;
pub mod quarantine;
pub mod results;
pub mod runs;
pub mod schedule;
pub mod shards;
pub mod signals;
pub mod status;
pub mod time;
pub mod trend;
pub mod waves;
pub mod webhook;

pub use context::Context;
pub use error::Error;

use futures::{StreamExt, TryStreamExt};
use gpufabric_api::keys;
use gpufabric_api::run::FabricTestRun;
use gpufabric_api::shard::FabricTestRunShard;
use gpufabric_api::test::FabricTest;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::reflector;
use kube::runtime::watcher::{self, Config as WatchConfig};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How the operator runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The namespace the benchmark pods are created in (FabricTest and FabricTestRun are
    /// cluster-scoped; their pods are not).
    pub pod_namespace: String,
    /// Watch only the FabricTests (and runs) this label selector matches (None: all).
    pub selector: Option<String>,
    /// Where `/metrics`, `/live` and `/ready` are served (None: not served).
    pub admin_addr: Option<SocketAddr>,
    /// Whether `/metrics` asks the API server who the caller is and whether it may read
    /// them (true, the default), or answers anyone who reaches the port.
    pub metrics_auth: bool,
    /// Run the controllers only while holding this Lease (None: no leader election).
    pub leader: Option<leader::LeaderConfig>,
    /// The image of benchmark pods whose FabricTest names none.
    pub agent_image: String,
    /// What benchmark pods get where their FabricTest names nothing.
    pub pod_defaults: pod_defaults::PodDefaults,
    /// Most nodes gpufabric holds in quarantine in the whole cluster, over every
    /// FabricTest (None: only each test's own budget).
    pub max_quarantined_nodes: Option<gpufabric_health::ClusterCap>,
}

/// Namespace of the benchmark pods when neither `--pod-namespace` nor `$POD_NAMESPACE` names one.
pub const DEFAULT_POD_NAMESPACE: &str = "gpufabric";

/// Options for [`run`]: benchmark pods in `pod_namespace`, every FabricTest watched.
pub fn controller_options(pod_namespace: String, admin_addr: Option<SocketAddr>) -> Options {
    Options {
        pod_namespace,
        selector: None,
        admin_addr,
        metrics_auth: true,
        leader: None,
        agent_image: gpufabric_api::test::DEFAULT_AGENT_IMAGE.to_string(),
        pod_defaults: Default::default(),
        max_quarantined_nodes: None,
    }
}

use cache::{slim, slim_node, slim_pod};

/// The caches the controllers read besides the FabricTests'.
struct Caches {
    nodes: reflector::Store<Node>,
    pods: reflector::Store<Pod>,
    runs: reflector::Store<FabricTestRun>,
    shards: reflector::Store<FabricTestRunShard>,
}

/// What both controllers share.
fn context(
    client: &Client,
    options: &Options,
    metrics: Arc<metrics::Metrics>,
    caches: Caches,
    synced: tokio::sync::watch::Receiver<bool>,
) -> Arc<Context> {
    let events = events::Events::new(
        client.clone(),
        events::Reporter {
            controller: keys::MANAGER.into(),
            instance: std::env::var("POD_NAME").ok(),
        },
    );
    Arc::new(Context {
        client: client.clone(),
        metrics,
        events,
        nodes: caches.nodes,
        pods: caches.pods,
        runs: caches.runs,
        shards: caches.shards,
        shard_writes: Default::default(),
        backoff: Default::default(),
        synced,
        cluster_cap: options.max_quarantined_nodes,
        quarantine_lock: Default::default(),
        quarantine_writes: Default::default(),
        signals_written: Default::default(),
        devices: Default::default(),
    })
}

/// Resolves once every cache has its first full list: the operator is then ready and the
/// controllers may trust what the caches lack.
async fn caches_synced(
    caches: Caches,
    tests: reflector::Store<FabricTest>,
    ready: Arc<AtomicBool>,
    synced: tokio::sync::watch::Sender<bool>,
) {
    let _ = tokio::join!(
        tests.wait_until_ready(),
        caches.nodes.wait_until_ready(),
        caches.pods.wait_until_ready(),
        caches.runs.wait_until_ready(),
        caches.shards.wait_until_ready()
    );
    ready.store(true, Ordering::SeqCst);
    let _ = synced.send(true);
    tracing::info!("caches synced; ready");
}

/// Runs both controllers until SIGINT or SIGTERM.
pub async fn run(client: Client, options: Options) -> Result<(), std::io::Error> {
    let metrics = Arc::new(metrics::Metrics::new());
    let ready = Arc::new(AtomicBool::new(false));
    let tests_api: Api<FabricTest> = Api::all(client.clone());
    let runs_api: Api<FabricTestRun> = Api::all(client.clone());
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), &options.pod_namespace);
    let selected = || match &options.selector {
        Some(s) => WatchConfig::default().labels(s),
        None => WatchConfig::default(),
    };
    let shards_api: Api<FabricTestRunShard> = Api::all(client.clone());
    let (node_store, node_stream) = node_cache(&client);

    // Benchmark pods: a cache, and the trigger of the run controller.
    let (pod_store, pod_writer) = reflector::store();
    let departed = Arc::new(departed::Departed::default());
    let pod_stream = watcher::watcher(pods_api, WatchConfig::default().labels(keys::LABEL_RUN))
        .default_backoff()
        .modify(slim_pod)
        .inspect_ok({
            let departed = departed.clone();
            move |event| {
                if let watcher::Event::Delete(pod) = event {
                    departed.record(pod);
                }
            }
        })
        .reflect(pod_writer)
        .touched_objects();

    // Runs: one shared cache, read by both controllers and triggering both.
    let (run_store, run_writer) = reflector::store_shared::<FabricTestRun>(1024);
    let run_sub_runs = run_writer
        .subscribe()
        .ok_or_else(|| std::io::Error::other("the run cache cannot be shared"))?;
    let run_sub_tests = run_writer
        .subscribe()
        .ok_or_else(|| std::io::Error::other("the run cache cannot be shared"))?;
    let run_watch = watcher::watcher(runs_api, selected())
        .default_backoff()
        .modify(slim::<FabricTestRun>)
        .reflect_shared(run_writer)
        .for_each(|_| futures::future::ready(()));

    // Shards: a cache of every run's per-node results, read by both controllers.
    let (shard_store, shard_writer) = reflector::store();
    let shard_watch = watcher::watcher(shards_api, WatchConfig::default())
        .default_backoff()
        .modify(slim::<FabricTestRunShard>)
        .reflect(shard_writer)
        .for_each(|_| futures::future::ready(()));

    // FabricTests: one shared cache, the trigger of the test controller and the source of
    // the per-test metrics.
    let (test_store, test_writer) = reflector::store_shared::<FabricTest>(1024);
    let test_sub = test_writer
        .subscribe()
        .ok_or_else(|| std::io::Error::other("the FabricTest cache cannot be shared"))?;
    let test_watch = watcher::watcher(tests_api, selected())
        .default_backoff()
        .modify(slim::<FabricTest>)
        .reflect_shared(test_writer)
        .for_each(|_| futures::future::ready(()));
    metrics.read_state_from(test_store.clone(), run_store.clone());

    let (synced_tx, synced_rx) = tokio::sync::watch::channel(false);
    let caches = Caches {
        nodes: node_store.clone(),
        pods: pod_store.clone(),
        runs: run_store.clone(),
        shards: shard_store.clone(),
    };
    let ctx = context(&client, &options, metrics.clone(), caches, synced_rx);
    let run_ctx = Arc::new(controller::run::RunContext::new(
        ctx.clone(),
        departed,
        options.pod_namespace.clone(),
        options.agent_image.clone(),
        options.pod_defaults.clone(),
    ));

    let shutdown = shutdown_signal()?;
    let config = ControllerConfig::default().debounce(Duration::from_millis(500));
    // No debounce for runs: it would restart with each of thousands of pod events and hold
    // a busy run's passes back until its pods all ended; a throttle spaces them instead.
    let run_controller = Controller::for_shared_stream(run_sub_runs, run_store.clone())
        .with_config(ControllerConfig::default())
        .watches_stream(pod_stream, runs_owning)
        .graceful_shutdown_on(wait_for(shutdown.clone()))
        .run(
            controller::run::reconcile,
            |obj, err, ctx| {
                controller::error_policy(controller::run::CONTROLLER, &ctx.shared, err, &obj)
            },
            run_ctx,
        )
        .for_each(|_| futures::future::ready(()));
    let test_controller = Controller::for_shared_stream(test_sub, test_store.clone())
        .with_config(config)
        .owns_shared_stream(run_sub_tests)
        .watches_stream(node_stream, {
            let tests = test_store.clone();
            let devices = ctx.devices.clone();
            move |node| tests_for_node(&tests.state(), &node, &devices.last_counts())
        })
        .graceful_shutdown_on(wait_for(shutdown.clone()))
        .run(
            controller::fabrictest::reconcile,
            |obj, err, ctx| {
                controller::error_policy(controller::fabrictest::CONTROLLER, &ctx, err, &obj)
            },
            ctx.clone(),
        )
        .for_each(|_| futures::future::ready(()));

    let readiness = caches_synced(
        Caches {
            nodes: node_store,
            pods: pod_store,
            runs: run_store.clone(),
            shards: shard_store,
        },
        test_store.clone(),
        ready.clone(),
        synced_tx,
    );
    let migrate_client = client.clone();
    let migrate_selector = options.selector.clone();
    let work = async move {
        // Before any run's signals are written: the node conditions of 0.2.0 become the
        // new ones (nothing else writes node conditions meanwhile).
        signals::migrate::run(&migrate_client, migrate_selector.as_deref()).await;
        let readiness = async {
            readiness.await;
            futures::future::pending::<()>().await
        };
        tokio::select! {
            _ = futures::future::join(run_controller, test_controller) => {}
            _ = readiness => {}
            _ = run_watch => {}
            _ = shard_watch => {}
            _ = test_watch => {}
        }
    };
    tracing::info!(pod_namespace = %options.pod_namespace, selector = ?options.selector, "fabric-operator starting");
    act(&client, &options, &metrics, ready, shutdown, work).await
}

/// The runs that own a benchmark pod. Not `owns_stream`: that looks an owner up in its
/// child's namespace, and a FabricTestRun is cluster-scoped (a pod's change would then
/// trigger no reconcile).
fn runs_owning(pod: Pod) -> Vec<reflector::ObjectRef<FabricTestRun>> {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .filter(|o| o.kind == "FabricTestRun" && o.api_version.starts_with(gpufabric_api::GROUP))
        .map(|o| reflector::ObjectRef::new(&o.name))
        .collect()
}

/// Nodes: a cache for node selection and GPU counts, and the watch that fills it (the
/// FabricTest controller polls it, and hears of the nodes that concern a test).
fn node_cache(
    client: &Client,
) -> (
    reflector::Store<Node>,
    impl futures::Stream<Item = Result<Node, watcher::Error>> + Send + 'static,
) {
    let (store, writer) = reflector::store();
    let watch = watcher::watcher(Api::<Node>::all(client.clone()), WatchConfig::default())
        .default_backoff()
        .modify(slim_node)
        .reflect(writer)
        .touched_objects();
    (store, watch)
}

/// The FabricTests a change of `node` concerns: the one whose quarantine record it carries
/// (someone may have undone it), and each test that selects it when it carries the
/// validation gate or the repaired annotation, has a condition the test names turned True,
/// or may have just joined a test that gates new nodes. Other node changes (status
/// heartbeats of healthy nodes) trigger nothing. `dra_gpus`: each node's GPUs as DRA devices,
/// as last read (a node whose GPUs are only devices is selected by them).
fn tests_for_node(
    tests: &[std::sync::Arc<FabricTest>],
    node: &Node,
    dra_gpus: &std::collections::BTreeMap<String, u32>,
) -> Vec<reflector::ObjectRef<FabricTest>> {
    use kube::ResourceExt;
    let mut out = Vec::new();
    if let Ok(Some(record)) = gpufabric_api::quarantine::QuarantineRecord::from_annotations(
        node.metadata.annotations.as_ref(),
    ) {
        out.push(reflector::ObjectRef::new(record.test_name()));
    }
    let marked = lifecycle::targets::is_gated(node)
        || node
            .annotations()
            .contains_key(gpufabric_api::keys::ANNOTATION_REPAIRED);
    let conditions = lifecycle::targets::conditions(node);
    for t in tests {
        let lifecycle = &t.spec.node_lifecycle;
        let troubled = conditions
            .iter()
            .any(|c| c.status == "True" && lifecycle.test_on_conditions.contains(&c.type_));
        let joined = lifecycle.gate_new_nodes
            && !node
                .annotations()
                .contains_key(gpufabric_api::keys::ANNOTATION_GATED)
            && match (
                &node.metadata.creation_timestamp,
                &t.metadata.creation_timestamp,
            ) {
                (Some(n), Some(c)) => n.0 > c.0,
                _ => false,
            };
        if (marked || troubled || joined) && lifecycle::targets::selects(t, node, dra_gpus) {
            out.push(reflector::ObjectRef::new(&t.name_any()));
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out.dedup();
    out
}

/// Serves the admin port, waits for the Lease (when leader election is on; ready while it
/// waits), runs `work` (the controllers and watches) until it ends on a signal, and gives
/// the Lease up. An error when the Lease was lost while working.
async fn act(
    client: &Client,
    options: &Options,
    metrics: &Arc<metrics::Metrics>,
    ready: Arc<AtomicBool>,
    shutdown: tokio::sync::watch::Receiver<bool>,
    work: impl std::future::Future<Output = ()>,
) -> Result<(), std::io::Error> {
    let admin_task = {
        let (metrics, ready, addr) = (metrics.clone(), ready.clone(), options.admin_addr);
        let access = if options.metrics_auth {
            metrics_access::MetricsAccess::Kubernetes(client.clone())
        } else {
            metrics_access::MetricsAccess::Open
        };
        let shutdown = wait_for(shutdown.clone());
        tokio::spawn(async move {
            if let Some(addr) = addr
                && let Err(e) = admin::serve(addr, metrics, ready, access, shutdown).await
            {
                tracing::error!(%addr, error = %e, "admin server failed");
            }
        })
    };
    if let Some(cfg) = &options.leader {
        // A follower is ready once it reaches the API server: readiness must not wait for
        // leadership, or a rolling upgrade never finishes.
        let contact = || ready.store(true, Ordering::SeqCst);
        tokio::select! {
            _ = leader::acquire(client, cfg, contact) => {}
            _ = wait_for(shutdown.clone()) => {
                admin_task.abort();
                tracing::info!("fabric-operator stopped before it led");
                return Ok(());
            }
        }
    }
    metrics.leader.set(1);
    let kept = match &options.leader {
        Some(cfg) => leader::lead(client, cfg, work).await,
        None => {
            work.await;
            true
        }
    };
    metrics.leader.set(0);
    admin_task.abort();
    if !kept {
        return Err(std::io::Error::other(
            "lost the leader Lease; stopping so that only the leader acts",
        ));
    }
    tracing::info!("fabric-operator stopped");
    Ok(())
}

/// A receiver that turns true on SIGTERM or SIGINT (installed once, shared by the
/// controllers, the admin server and leader election).
fn shutdown_signal() -> Result<tokio::sync::watch::Receiver<bool>, std::io::Error> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: stopping"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping"),
        }
        let _ = tx.send(true);
    });
    Ok(rx)
}

/// Completes when `rx` turns true (or its sender is gone).
async fn wait_for(mut rx: tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    #[test]
    fn a_pod_triggers_its_cluster_scoped_run_not_one_in_its_namespace() {
        let mut pod = Pod::default();
        pod.metadata.namespace = Some("gpufabric".into());
        let owner = |kind: &str, name: &str| OwnerReference {
            api_version: format!("{}/{}", gpufabric_api::GROUP, gpufabric_api::VERSION),
            kind: kind.into(),
            name: name.into(),
            uid: "u".into(),
            controller: Some(true),
            ..Default::default()
        };
        pod.metadata.owner_references = Some(vec![
            owner("FabricTestRun", "nightly-1"),
            owner("Job", "other"),
        ]);
        let refs = runs_owning(pod);
        assert_eq!(refs, vec![reflector::ObjectRef::new("nightly-1")]);
        assert_eq!(refs[0].namespace, None);
    }
}
