//! The operator's error type.

/// Anything a reconcile can fail with. The controller logs it, counts it, and retries.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[from] kube::Error),
    #[error("could not serialise an object: {0}")]
    Json(#[from] serde_json::Error),
    #[error("could not build a benchmark pod: {0}")]
    Build(#[from] crate::pods::BuildError),
    #[error("object is missing {0}")]
    Missing(&'static str),
    #[error("quarantine failed: {0}")]
    Quarantine(String),
}

/// Results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
