//! The operator's error type.

/// Anything a reconcile can fail with. The controller logs it, counts it, and retries it
/// with a per-object backoff (see [`crate::controller::backoff`]).
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
    Quarantine(#[from] crate::quarantine::QuarantineError),
    #[error("quarantine of GPUs through DRA failed: {0}")]
    Dra(#[from] crate::dra::DraError),
    #[error("adding the finalizer failed: {0}")]
    AddFinalizer(#[source] kube::Error),
    #[error("removing the finalizer failed: {0}")]
    RemoveFinalizer(#[source] kube::Error),
    #[error("the finalizer could not be handled: {0}")]
    Finalizer(&'static str),
}

impl Error {
    /// The error of a reconcile run under [`kube::runtime::finalizer`]: the reconcile's own
    /// error as it is, the finalizer's own failures with their source.
    pub fn from_finalizer(e: kube::runtime::finalizer::Error<Error>) -> Error {
        use kube::runtime::finalizer::Error as F;
        match e {
            F::ApplyFailed(e) | F::CleanupFailed(e) => e,
            F::AddFinalizer(e) => Error::AddFinalizer(e),
            F::RemoveFinalizer(e) => Error::RemoveFinalizer(e),
            F::UnnamedObject => Error::Missing("metadata.name"),
            F::InvalidFinalizer => Error::Finalizer("the finalizer name is not a valid path"),
        }
    }
}

/// Results of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;
