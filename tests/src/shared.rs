//! One control plane per test binary, shared by its tests: started on first use on a
//! thread of its own that lives as long as the process, stopped and removed when the
//! process exits. Each test gets a [`TestEnv`]: a fresh namespace, and a prefix and label
//! for the nodes it registers, so that label selectors see only its own nodes.
//!
//! ```no_run
//! # async fn demo() -> gpufabric_tests::Result<()> {
//! use gpufabric_tests::{fleet::{H100, SimFleet}, kubelet::KubeletOptions, shared::TestEnv};
//! let env = TestEnv::new("my-test").await?;            // namespace `my-test-<n>`
//! let (fleet, kubelet) = env.start_kubelet(SimFleet::uniform("gpu", 2, H100, 8), KubeletOptions::default()).await?;
//! let node = env.node("gpu-01");                       // `my-test-<n>-gpu-01`
//! # Ok(()) }
//! ```
//!
//! A binary whose tests all need other flags starts its shared control plane with them
//! ([`TestEnv::with_options`]); a test that needs a control plane of its own (killing it)
//! still uses [`Cluster::start`] or [`Cluster::start_with`].

use crate::cluster::{Cluster, ClusterOptions};
use crate::fleet::SimFleet;
use crate::kubelet::{Kubelet, KubeletOptions};
use crate::process::signal_group;
use crate::{Error, Result, kube_err};
use gpufabric_measure::fleet::Fleet;
use k8s_openapi::api::core::v1::{Namespace, Node};
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams};
use nix::sys::signal::Signal;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};

/// Label on every node a [`TestEnv`] registers: its id.
pub const LABEL_ENV: &str = "gpufabric-tests/env";

struct Shared {
    cluster: Cluster,
    runtime: tokio::runtime::Handle,
}

static SHARED: OnceLock<std::result::Result<Shared, String>> = OnceLock::new();
/// The options of this binary's control plane, where its tests set them
/// ([`TestEnv::with_options`]); the defaults otherwise.
static OPTIONS: OnceLock<ClusterOptions> = OnceLock::new();
/// What the exit hook stops and removes: the control plane's process groups and its dir.
static AT_EXIT: OnceLock<(Vec<u32>, PathBuf)> = OnceLock::new();
static NEXT_ENV: AtomicU32 = AtomicU32::new(1);

extern "C" fn stop_at_exit() {
    if let Some((pids, dir)) = AT_EXIT.get() {
        for pid in pids {
            signal_group(*pid, Signal::SIGKILL);
        }
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Starts the control plane on a thread that never returns: its processes die with that
/// thread (PR_SET_PDEATHSIG), that is with the process, and its runtime serves the
/// cluster's own client.
fn start_shared() -> std::result::Result<Shared, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("shared-control-plane".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
            {
                Ok(r) => r,
                Err(e) => {
                    let _ = tx.send(Err(format!("building the shared runtime: {e}")));
                    return;
                }
            };
            let opts = OPTIONS.get().cloned().unwrap_or_default();
            let started = runtime
                .block_on(Cluster::start_with(opts))
                .map(|cluster| Shared {
                    cluster,
                    runtime: runtime.handle().clone(),
                });
            let _ = tx.send(started.map_err(|e| e.to_string()));
            loop {
                std::thread::park();
            }
        });
    if let Err(e) = spawned {
        return Err(format!("spawning the control-plane thread: {e}"));
    }
    let shared = rx
        .recv()
        .map_err(|_| "the control-plane thread ended without a cluster".to_string())??;
    if AT_EXIT
        .set((shared.cluster.pids(), shared.cluster.dir().to_path_buf()))
        .is_ok()
    {
        // SAFETY: registers a plain function without arguments; it only signals process
        // groups and removes a directory.
        unsafe {
            libc::atexit(stop_at_exit);
        }
    }
    Ok(shared)
}

fn shared() -> Result<&'static Shared> {
    SHARED
        .get_or_init(start_shared)
        .as_ref()
        .map_err(|e| Error::Invalid(format!("shared control plane: {e}")))
}

/// The control plane of this test binary, started on first use.
pub fn cluster() -> Result<&'static Cluster> {
    shared().map(|s| &s.cluster)
}

/// A test's share of the control plane: its own namespace, client and node names.
/// Dropping it deletes the namespace and the nodes labelled with its id (in the
/// background).
pub struct TestEnv {
    cluster: &'static Cluster,
    client: Client,
    id: String,
}

/// `name` as a DNS label part: lowercase letters, digits and `-`, at most 40 characters.
fn dns_part(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(40)
        .collect();
    let s = s.trim_matches('-');
    if s.is_empty() {
        "t".to_string()
    } else {
        s.to_string()
    }
}

impl TestEnv {
    /// Starts the control plane if this binary has none yet, and creates the namespace
    /// `<name>-<n>` (`n` counts the environments of this binary), waiting for its
    /// ServiceAccount.
    pub async fn new(name: &str) -> Result<TestEnv> {
        crate::init_tracing();
        let cluster = cluster()?;
        let id = format!(
            "{}-{}",
            dns_part(name),
            NEXT_ENV.fetch_add(1, Ordering::SeqCst)
        );
        cluster.create_namespace(&id).await?;
        Ok(TestEnv {
            cluster,
            client: cluster.new_client()?,
            id,
        })
    }

    /// [`TestEnv::new`] where the control plane, if this binary has none yet, starts with
    /// `opts`. Every test of a binary passes the same options: the first call's are used.
    pub async fn with_options(name: &str, opts: ClusterOptions) -> Result<TestEnv> {
        let _ = OPTIONS.set(opts);
        TestEnv::new(name).await
    }

    /// The shared control plane (kubeconfig, kubectl, logs).
    pub fn cluster(&self) -> &'static Cluster {
        self.cluster
    }

    /// An admin client for this test's runtime.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// This test's namespace, also its id and node-name prefix.
    pub fn ns(&self) -> &str {
        &self.id
    }

    /// The name this test gives the node `base` (`<id>-<base>`).
    pub fn node(&self, base: &str) -> String {
        format!("{}-{base}", self.id)
    }

    /// The label that selects this test's nodes, and only them.
    pub fn label(&self) -> (&'static str, &str) {
        (LABEL_ENV, &self.id)
    }

    /// A label selector string for this test's nodes (`gpufabric-tests/env=<id>`).
    pub fn selector(&self) -> String {
        format!("{LABEL_ENV}={}", self.id)
    }

    /// `fleet` as this test registers it: every node renamed with [`TestEnv::node`] (and the
    /// peers its faults name) and labelled with [`TestEnv::label`].
    pub fn fleet(&self, mut fleet: Fleet) -> Fleet {
        for n in fleet.nodes.iter_mut() {
            n.name = self.node(&n.name);
            n.labels.insert(LABEL_ENV.to_string(), self.id.clone());
            for f in n.faults.iter_mut() {
                if let gpufabric_measure::fleet::Fault::BadPath { peer, .. } = f {
                    *peer = self.node(peer);
                }
            }
        }
        fleet
    }

    /// Writes [`TestEnv::fleet`] of `fleet` to a temp file and starts a process-kubelet
    /// for its nodes.
    pub async fn start_kubelet(
        &self,
        fleet: Fleet,
        opts: KubeletOptions,
    ) -> Result<(SimFleet, Kubelet)> {
        let fleet = SimFleet::write(self.fleet(fleet))?;
        let kubelet = Kubelet::start(self.client(), &fleet, opts).await?;
        Ok((fleet, kubelet))
    }

    /// The labels of this test's nodes, for a node selector.
    pub fn node_selector(&self) -> BTreeMap<String, String> {
        BTreeMap::from([(LABEL_ENV.to_string(), self.id.clone())])
    }
}

async fn clean_up(client: Client, id: String) -> Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    match namespaces.delete(&id, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(kube_err(format!("deleting namespace {id}"))(e)),
    }
    let nodes: Api<Node> = Api::all(client);
    let lp = ListParams::default().labels(&format!("{LABEL_ENV}={id}"));
    nodes
        .delete_collection(&DeleteParams::default(), &lp)
        .await
        .map_err(kube_err(format!("deleting the nodes of {id}")))?;
    Ok(())
}

impl Drop for TestEnv {
    fn drop(&mut self) {
        let Ok(shared) = shared() else { return };
        let (client, id) = (shared.cluster.client(), self.id.clone());
        shared.runtime.spawn(async move {
            if let Err(e) = clean_up(client, id).await {
                tracing::warn!(error = %e, "cleaning up a test environment");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_become_dns_label_parts() {
        assert_eq!(dns_part("Pod_runs::its command"), "pod-runs--its-command");
        assert_eq!(dns_part("--"), "t");
        assert_eq!(dns_part(&"x".repeat(80)).len(), 40);
    }
}
