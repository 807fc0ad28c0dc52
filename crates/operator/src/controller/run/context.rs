//! What the run controller needs beyond what both controllers share: the pods' namespace
//! and defaults, the pods seen leaving, the lock on picking nodes, the result keeper and
//! the pass throttle.

use crate::context::Context;
use k8s_openapi::api::core::v1::Pod;
use std::sync::Arc;

/// The run controller's context: the shared [`Context`] (reached through it as well) and
/// the parts only a run needs.
pub struct RunContext {
    pub shared: Arc<Context>,
    /// The last state of each benchmark pod the watch saw deleted, for a run whose pod is
    /// gone before its pass read how it ended.
    pub departed: Arc<crate::departed::Departed>,
    /// The namespace of the benchmark pods (`--pod-namespace`).
    pub pod_namespace: String,
    /// The image of benchmark pods whose FabricTest names none (`--agent-image`).
    pub agent_image: String,
    /// What benchmark pods get where their FabricTest names nothing (`--agent-priority-class`,
    /// `--agent-runtime-class`, `--agent-image-pull-secret`).
    pub pod_defaults: crate::pod_defaults::PodDefaults,
    /// Held while a run picks its nodes and freezes them into its shards: two runs starting
    /// at the same moment would otherwise each see the other's nodes free (its pods come a
    /// pass later) and both make a pod on every node, the second refused by the kubelet.
    pub start_lock: tokio::sync::Mutex<()>,
    /// Keeps each node's full result once, in the background, as its pod ends; the run's
    /// end has only the last pods left.
    pub keeper: Arc<super::keeper::Keeper>,
    /// When each run's last pass began: a run gets at most one pass a second.
    pub passes: super::throttle::PassThrottle,
}

impl std::ops::Deref for RunContext {
    type Target = Context;

    fn deref(&self) -> &Context {
        &self.shared
    }
}

impl RunContext {
    /// The run controller's context over `shared`, with a fresh keeper and throttle.
    pub fn new(
        shared: Arc<Context>,
        departed: Arc<crate::departed::Departed>,
        pod_namespace: String,
        agent_image: String,
        pod_defaults: crate::pod_defaults::PodDefaults,
    ) -> Self {
        RunContext {
            shared,
            departed,
            pod_namespace,
            agent_image,
            pod_defaults,
            start_lock: Default::default(),
            keeper: Arc::new(super::keeper::Keeper::new()),
            passes: Default::default(),
        }
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
impl RunContext {
    /// A run controller's context over `client` and the given caches (filled and synced),
    /// every other part as a fresh operator has it.
    pub(crate) fn for_tests(
        client: kube::Client,
        nodes: kube::runtime::reflector::Store<k8s_openapi::api::core::v1::Node>,
        pods: kube::runtime::reflector::Store<Pod>,
        runs: kube::runtime::reflector::Store<gpufabric_api::run::FabricTestRun>,
        shards: kube::runtime::reflector::Store<gpufabric_api::shard::FabricTestRunShard>,
    ) -> Arc<RunContext> {
        Arc::new(RunContext::new(
            Context::for_tests(client, nodes, pods, runs, shards),
            Default::default(),
            "gpufabric".into(),
            "registry.local/fabric-agent:test".into(),
            Default::default(),
        ))
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
