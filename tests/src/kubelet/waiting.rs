//! A container that waits and never starts, as on a busy cluster: an image that cannot be
//! pulled (`ErrImagePull`, then `ImagePullBackOff`), or config the kubelet cannot build
//! (`CreateContainerConfigError`, retried until the Secret or ConfigMap appears). The pod
//! stays Pending until it is deleted, evicted, or its `activeDeadlineSeconds` pass.

use super::launch::{Launch, LaunchError, resolve};
use super::pod::{Interrupt, PodRun};
use std::time::Duration;

/// An image whose name contains this cannot be pulled: its pods stay Pending in
/// `ErrImagePull` / `ImagePullBackOff`.
pub const MISSING_IMAGE_MARK: &str = "does-not-exist";
/// The kubelet's longest back-off between image pulls.
const MAX_BACKOFF: Duration = Duration::from_secs(300);

/// Whether `image` is one the process-kubelet fails to pull.
pub(super) fn image_missing(image: &str) -> bool {
    image.contains(MISSING_IMAGE_MARK)
}

/// What the registry answers for `image`, as the kubelet reports a failed pull.
pub(super) fn pull_error(image: &str) -> String {
    format!(
        "Failed to pull image {image:?}: rpc error: code = NotFound desc = failed to pull and unpack image \
         {image:?}: failed to resolve reference {image:?}: {image}: not found"
    )
}

/// Reports a pull failure, then the back-off, again and again (the back-off doubling up
/// to the kubelet's cap) until the pod must stop or its deadline passes.
pub(super) async fn pull_failure(run: &mut PodRun) -> Interrupt {
    let image = run.image.clone();
    let err = pull_error(&image);
    let mut backoff = run.inner.opts.retry_backoff;
    tracing::info!(pod = %run.label(), %image, "image cannot be pulled");
    loop {
        run.write_waiting("ErrImagePull", err.clone()).await;
        if let Some(why) = run.pause(backoff).await {
            return why;
        }
        let msg = format!("Back-off pulling image {image:?}: ErrImagePull: {err}");
        run.write_waiting("ImagePullBackOff", msg).await;
        if let Some(why) = run.pause(backoff).await {
            return why;
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// How building a container's config ended.
pub(super) enum Configured {
    /// Ready to start.
    Ready(Launch),
    /// Still `CreateContainerConfigError` when the pod had to stop.
    Interrupted(Interrupt),
    /// The program cannot be found: the pod fails (`StartError`).
    StartError(String),
}

/// Builds the container's config, reporting `CreateContainerConfigError` and retrying
/// every [`super::KubeletOptions::retry_backoff`] while a source is missing.
pub(super) async fn until_configured(run: &mut PodRun) -> Configured {
    loop {
        match resolve(run).await {
            Ok(l) => return Configured::Ready(l),
            Err(LaunchError::Start(msg)) => return Configured::StartError(msg),
            Err(LaunchError::Config(msg)) => {
                tracing::info!(pod = %run.label(), error = %msg, "container config error");
                run.write_waiting("CreateContainerConfigError", msg).await;
                let backoff = run.inner.opts.retry_backoff;
                if let Some(why) = run.pause(backoff).await {
                    return Configured::Interrupted(why);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_marked_images_fail_to_pull_and_the_error_names_the_image() {
        assert!(image_missing("registry.invalid/does-not-exist:1"));
        assert!(!image_missing("ghcr.io/gpufabric/agent:0.1.0"));
        let err = pull_error("x/does-not-exist:1");
        assert!(
            err.starts_with("Failed to pull image \"x/does-not-exist:1\": "),
            "{err}"
        );
        assert!(err.ends_with("not found"), "{err}");
    }
}
