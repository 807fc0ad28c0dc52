//! Pod admission as the kubelet does it for `nvidia.com/gpu`: a pod asking for more GPUs
//! than its node has free (held by the other active pods on that node) is rejected, phase
//! Failed with reason `OutOfnvidia.com/gpu`.

use super::status::now;
use gpufabric_api::keys;
use k8s_openapi::api::core::v1::{Container, Pod};
use serde_json::{Value, json};

/// Why the kubelet refused to run a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Rejection {
    /// Pod status reason, e.g. `OutOfnvidia.com/gpu`.
    pub reason: String,
    /// Pod status message, as the kubelet words it.
    pub message: String,
}

fn container_gpus(c: &Container) -> u64 {
    let resources = c.resources.as_ref();
    // The API server copies limits into requests for extended resources; read either.
    let quantity = resources
        .and_then(|r| r.requests.as_ref()?.get(keys::RESOURCE_GPU))
        .or_else(|| resources.and_then(|r| r.limits.as_ref()?.get(keys::RESOURCE_GPU)));
    quantity.and_then(|q| q.0.parse().ok()).unwrap_or(0)
}

/// GPUs a pod needs while it runs: the sum over its containers, or the largest init
/// container's request if that is more (init containers run one at a time, before them).
pub(super) fn pod_gpus(pod: &Pod) -> u64 {
    let Some(spec) = pod.spec.as_ref() else {
        return 0;
    };
    let app: u64 = spec.containers.iter().map(container_gpus).sum();
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .map(container_gpus)
        .max()
        .unwrap_or(0);
    app.max(init)
}

/// Admits a pod asking for `requested` GPUs on a node with `capacity` GPUs, `used` of them
/// held by its active pods, or says why not (the kubelet's `OutOf<resource>` rejection).
pub(super) fn admit(requested: u64, used: u64, capacity: u64) -> Result<(), Rejection> {
    if requested == 0 || requested.saturating_add(used) <= capacity {
        return Ok(());
    }
    Err(Rejection {
        reason: format!("OutOf{}", keys::RESOURCE_GPU),
        message: format!(
            "Pod was rejected: Node didn't have enough resource: {}, requested: {requested}, used: {used}, capacity: {capacity}",
            keys::RESOURCE_GPU
        ),
    })
}

/// The status the kubelet writes for a rejected pod: phase, reason and message only.
pub(super) fn rejection_patch(r: &Rejection) -> Value {
    json!({"status": {
        "phase": "Failed",
        "reason": r.reason,
        "message": r.message,
        "startTime": now(),
        "qosClass": "BestEffort",
    }})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(containers: &[u64], init: &[u64]) -> Pod {
        let c = |n: &u64| json!({"name": "c", "resources": {"limits": {keys::RESOURCE_GPU: n.to_string()}}});
        serde_json::from_value(json!({
            "metadata": {"name": "p"},
            "spec": {
                "containers": containers.iter().map(c).collect::<Vec<_>>(),
                "initContainers": init.iter().map(c).collect::<Vec<_>>(),
            },
        }))
        .expect("pod")
    }

    #[test]
    fn a_pod_needs_its_containers_sum_or_its_largest_init_container() {
        assert_eq!(pod_gpus(&pod(&[2, 3], &[])), 5);
        assert_eq!(pod_gpus(&pod(&[1], &[4, 2])), 4);
        assert_eq!(pod_gpus(&pod(&[], &[])), 0);
    }

    #[test]
    fn admits_what_fits_and_words_a_rejection_as_the_kubelet_does() {
        assert_eq!(admit(8, 0, 8), Ok(()));
        assert_eq!(admit(0, 8, 8), Ok(()));
        assert_eq!(admit(4, 4, 8), Ok(()));
        let r = admit(8, 8, 8).expect_err("no GPU free");
        assert_eq!(r.reason, "OutOfnvidia.com/gpu");
        assert_eq!(
            r.message,
            "Pod was rejected: Node didn't have enough resource: nvidia.com/gpu, requested: 8, used: 8, capacity: 8"
        );
        assert!(admit(9, 0, 8).is_err(), "more than the node has");
    }
}
