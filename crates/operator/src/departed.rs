//! The last state the watch saw of each benchmark pod that was deleted.
//!
//! A pod that is preempted or evicted, or whose agent ends at once on SIGTERM, can be gone
//! before the run's next pass reads it: the kubelet writes its terminal status (phase
//! `Failed`, the `DisruptionTarget` condition, the agent's exit code and last progress line)
//! and deletes it a moment later. The watch's delete event still carries that state, so
//! the run can say "preempted" instead of "deleted before it finished".

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long a deleted pod's last state is kept: far longer than a run's pass takes to come.
const KEEP: Duration = Duration::from_secs(30 * 60);

/// At most this many deleted pods are kept (the oldest go first): two runs of 10,000 nodes.
const MAX: usize = 20_000;

/// A pod's namespace and name.
type Key = (String, String);

/// Deleted benchmark pods by namespace and name, each with when its deletion was seen.
#[derive(Default)]
pub struct Departed {
    pods: Mutex<HashMap<Key, (Arc<Pod>, Instant)>>,
}

impl Departed {
    /// Keeps the last state of a pod the watch saw deleted.
    pub fn record(&self, pod: &Pod) {
        let key = (pod.namespace().unwrap_or_default(), pod.name_any());
        let now = Instant::now();
        let mut pods = match self.pods.lock() {
            Ok(p) => p,
            Err(poisoned) => poisoned.into_inner(),
        };
        if pods.len() >= MAX {
            pods.retain(|_, (_, at)| now.duration_since(*at) < KEEP);
        }
        if pods.len() >= MAX {
            let mut ages: Vec<(Instant, Key)> =
                pods.iter().map(|(k, (_, at))| (*at, k.clone())).collect();
            ages.sort();
            for (_, k) in ages.into_iter().take(pods.len() + 1 - MAX) {
                pods.remove(&k);
            }
        }
        pods.insert(key, (Arc::new(pod.clone()), now));
    }

    /// The last state of the deleted pod `name` in `namespace`, if it belonged to the run
    /// whose UID is `owner` (a later run's pod of the same name is another pod).
    pub fn last(&self, namespace: &str, name: &str, owner: &str) -> Option<Arc<Pod>> {
        let pods = match self.pods.lock() {
            Ok(p) => p,
            Err(poisoned) => poisoned.into_inner(),
        };
        let (pod, at) = pods.get(&(namespace.to_string(), name.to_string()))?;
        (at.elapsed() < KEEP && pod.owner_references().iter().any(|o| o.uid == owner))
            .then(|| pod.clone())
    }

    /// How many deleted pods are kept now.
    pub fn len(&self) -> usize {
        self.pods.lock().map_or(0, |p| p.len())
    }

    /// No deleted pod is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(name: &str, owner: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "gpufabric",
                "ownerReferences": [{"apiVersion": "gpufabric.io/v1alpha1",
                    "kind": "FabricTestRun", "name": "r", "uid": owner}]},
            "status": {"phase": "Failed"}
        }))
        .expect("a pod")
    }

    #[test]
    fn a_deleted_pod_is_found_only_by_its_own_run() {
        let d = Departed::default();
        assert!(d.is_empty());
        d.record(&pod("r-gpu-1", "uid-1"));
        assert!(d.last("gpufabric", "r-gpu-1", "uid-1").is_some());
        assert!(d.last("gpufabric", "r-gpu-1", "uid-2").is_none());
        assert!(d.last("other", "r-gpu-1", "uid-1").is_none());
        assert!(d.last("gpufabric", "r-gpu-2", "uid-1").is_none());
    }

    #[test]
    fn no_more_than_the_cap_is_kept_and_the_newest_stay() {
        let d = Departed::default();
        for i in 0..MAX + 5 {
            d.record(&pod(&format!("p-{i}"), "u"));
        }
        assert_eq!(d.len(), MAX);
        assert!(
            d.last("gpufabric", &format!("p-{}", MAX + 4), "u")
                .is_some()
        );
        assert!(d.last("gpufabric", "p-0", "u").is_none());
    }
}
