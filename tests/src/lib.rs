//! Test support: a real local control plane (etcd, kube-apiserver, controller-manager), a process-kubelet and simulated GPU nodes.
//!
//! ```no_run
//! # async fn demo() -> gpufabric_tests::Result<()> {
//! use gpufabric_tests::{cluster::Cluster, fleet::SimFleet, kubelet::{Kubelet, KubeletOptions}};
//! let cluster = Cluster::start().await?;                 // etcd + apiserver + controller-manager + CRDs
//! let fleet = SimFleet::write(SimFleet::uniform("gpu-node", 2, "NVIDIA-H100-80GB-HBM3", 8))?;
//! let kubelet = Kubelet::start(cluster.client(), &fleet, KubeletOptions::default()).await?;
//! // ... create FabricTests, run the operator against cluster.kubeconfig_path() ...
//! kubelet.set_node_ready("gpu-node-01", false).await?;
//! # Ok(()) }
//! ```
//!
//! See `tests/README.md` for what the process-kubelet does and does not do.

pub mod apimetrics;
pub mod cluster;
pub mod dra;
pub mod events;
pub mod fixtures;
pub mod fleet;
pub mod kubelet;
pub mod operator;
pub mod pki;
pub mod process;
pub mod realnode;
pub mod registry;
pub mod shared;
pub mod tools;
pub mod wait;

use std::path::PathBuf;

/// Everything that can go wrong starting or driving the local cluster.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The control-plane binaries are not there.
    #[error(
        "control-plane binaries not found in {dir}: {detail}. Build them with `tests/cluster/build.sh` \
         (about 11 min on 2 cores, cached afterwards) or point GPUFABRIC_CLUSTER_BIN at a directory \
         holding etcd, kube-apiserver, kube-controller-manager and kubectl"
    )]
    Binaries { dir: PathBuf, detail: String },
    /// A component did not start; `log_tail` is the end of its log.
    #[error("{component} did not start: {detail}\n--- last lines of {log} ---\n{log_tail}")]
    Start {
        component: String,
        detail: String,
        log: PathBuf,
        log_tail: String,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Kube {
        what: String,
        source: Box<kube::Error>,
    },
    #[error("timed out after {seconds}s waiting for {what}")]
    Timeout { what: String, seconds: u64 },
    #[error("generating certificates: {0}")]
    Certificates(String),
    #[error(transparent)]
    Fleet(#[from] gpufabric_measure::fleet::FleetError),
    #[error("{0}")]
    Invalid(String),
}

/// Result of the harness.
pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Error {
    let what = what.into();
    move |source| Error::Io { what, source }
}

pub(crate) fn kube_err(what: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let what = what.into();
    move |source| Error::Kube {
        what,
        source: Box::new(source),
    }
}

/// Installs a tracing subscriber that writes to the test output (once per process; later
/// calls do nothing). Filter with `RUST_LOG` (default: `info` for this crate, `warn` else).
pub fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new("warn,gpufabric_tests=info,kube_client::client::builder=off")
    });
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// Root of the workspace (where `crds/`, `deploy/` and `tests/cluster/` are).
pub fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().map(PathBuf::from).unwrap_or(manifest)
}
