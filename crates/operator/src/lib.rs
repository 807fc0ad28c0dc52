//! `fabric-operator` as a library: the FabricTest and FabricTestRun controllers, the pure
//! pieces they are built from (schedule math, pod building, result reading, status
//! folding), metrics, the admin server, and the quarantine executor.

pub mod admin;
pub mod context;
pub mod controller;
pub mod error;
pub mod events;
pub mod leader;
pub mod metrics;
pub mod names;
pub mod nodes;
pub mod pods;
pub mod quarantine;
pub mod results;
pub mod runs;
pub mod schedule;
pub mod status;
pub mod time;
pub mod webhook;

pub use context::Context;
pub use error::Error;

use futures::StreamExt;
use gpufabric_api::keys;
use gpufabric_api::run::FabricTestRun;
use gpufabric_api::test::FabricTest;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::reflector;
use kube::runtime::watcher::{self, Config as WatchConfig};
use kube::{Client, Resource};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How the operator runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// Watch only this namespace (None: all namespaces).
    pub namespace: Option<String>,
    /// Where `/metrics`, `/live` and `/ready` are served (None: not served).
    pub admin_addr: Option<SocketAddr>,
    /// Run the controllers only while holding this Lease (None: no leader election).
    pub leader: Option<leader::LeaderConfig>,
}

/// Options for [`run`].
pub fn controller_options(namespace: Option<String>, admin_addr: Option<SocketAddr>) -> Options {
    Options {
        namespace,
        admin_addr,
        leader: None,
    }
}

/// Drops what the operator never reads from a cached object (managed fields; a Node's image
/// list), so a cache of thousands of objects stays small.
fn slim<K: Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

/// Runs both controllers until SIGINT or SIGTERM.
pub async fn run(client: Client, options: Options) -> Result<(), std::io::Error> {
    let metrics = Arc::new(metrics::Metrics::new());
    let ready = Arc::new(AtomicBool::new(false));
    let ns = options.namespace.clone();
    let namespaced = |c: &Client| -> (Api<FabricTest>, Api<FabricTestRun>, Api<Pod>) {
        match &ns {
            Some(n) => (
                Api::namespaced(c.clone(), n),
                Api::namespaced(c.clone(), n),
                Api::namespaced(c.clone(), n),
            ),
            None => (
                Api::all(c.clone()),
                Api::all(c.clone()),
                Api::all(c.clone()),
            ),
        }
    };
    let (tests_api, runs_api, pods_api) = namespaced(&client);
    let nodes_api: Api<Node> = Api::all(client.clone());

    // Nodes: a cache for node selection and GPU counts.
    let (node_store, node_writer) = reflector::store();
    let node_watch = watcher::watcher(nodes_api, WatchConfig::default())
        .default_backoff()
        .modify(|n: &mut Node| {
            slim(n);
            if let Some(s) = n.status.as_mut() {
                s.images = None;
            }
        })
        .reflect(node_writer)
        .for_each(|_| futures::future::ready(()));

    // Benchmark pods: a cache, and the trigger of the run controller.
    let (pod_store, pod_writer) = reflector::store();
    let pod_stream = watcher::watcher(pods_api, WatchConfig::default().labels(keys::LABEL_RUN))
        .default_backoff()
        .modify(slim::<Pod>)
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
    let run_watch = watcher::watcher(runs_api, WatchConfig::default())
        .default_backoff()
        .modify(slim::<FabricTestRun>)
        .reflect_shared(run_writer)
        .for_each(|_| futures::future::ready(()));

    let events = events::Events::new(
        client.clone(),
        events::Reporter {
            controller: keys::MANAGER.into(),
            instance: std::env::var("POD_NAME").ok(),
        },
    );
    let (synced_tx, synced_rx) = tokio::sync::watch::channel(false);
    let ctx = Arc::new(Context {
        client: client.clone(),
        metrics: metrics.clone(),
        events,
        nodes: node_store.clone(),
        pods: pod_store.clone(),
        runs: run_store.clone(),
        namespace: options.namespace.clone(),
        backoff: Default::default(),
        synced: synced_rx,
    });

    let config = ControllerConfig::default().debounce(Duration::from_millis(500));
    let run_controller = Controller::for_shared_stream(run_sub_runs, run_store.clone())
        .with_config(config.clone())
        .owns_stream(pod_stream)
        .shutdown_on_signal()
        .run(
            controller::run::reconcile,
            |obj, err, ctx| controller::error_policy(controller::run::CONTROLLER, &ctx, err, &obj),
            ctx.clone(),
        )
        .for_each(|_| futures::future::ready(()));
    let test_controller = Controller::new(tests_api, WatchConfig::default())
        .with_config(config)
        .owns_shared_stream(run_sub_tests)
        .shutdown_on_signal()
        .run(
            controller::test::reconcile,
            |obj, err, ctx| controller::error_policy(controller::test::CONTROLLER, &ctx, err, &obj),
            ctx.clone(),
        )
        .for_each(|_| futures::future::ready(()));

    let readiness = {
        let ready = ready.clone();
        let (n, p, r) = (node_store.clone(), pod_store.clone(), run_store.clone());
        async move {
            let _ = n.wait_until_ready().await;
            let _ = p.wait_until_ready().await;
            let _ = r.wait_until_ready().await;
            ready.store(true, Ordering::SeqCst);
            let _ = synced_tx.send(true);
            tracing::info!("caches synced; ready");
        }
    };
    let admin = {
        let (metrics, ready, addr) = (metrics.clone(), ready.clone(), options.admin_addr);
        async move {
            if let Some(addr) = addr {
                let shutdown = async {
                    let _ = tokio::signal::ctrl_c().await;
                };
                if let Err(e) = admin::serve(addr, metrics, ready, shutdown).await {
                    tracing::error!(%addr, error = %e, "admin server failed");
                }
            }
        }
    };
    tracing::info!(namespace = ?options.namespace, "fabric-operator starting");
    let admin_task = tokio::spawn(admin);
    let lost_leadership = {
        let client = client.clone();
        let leader = options.leader.clone();
        async move {
            match leader {
                Some(cfg) => leader::hold(&client, &cfg).await,
                None => futures::future::pending::<()>().await,
            }
        }
    };
    if let Some(cfg) = &options.leader {
        leader::acquire(&client, cfg).await;
    }
    tokio::select! {
        _ = futures::future::join3(run_controller, test_controller, readiness) => {}
        _ = node_watch => {}
        _ = run_watch => {}
        _ = lost_leadership => {
            admin_task.abort();
            return Err(std::io::Error::other("lost the leader Lease; stopping so that only the leader acts"));
        }
    }
    admin_task.abort();
    tracing::info!("fabric-operator stopped");
    Ok(())
}
