//! GPUs through ResourceClaims: which nodes' benchmark pods claim their GPUs (those whose GPUs
//! are devices of the GPU driver, where the cluster serves claim templates), and which GPUs
//! other pods' claims hold, counted busy as an `nvidia.com/gpu` request is.

use super::{DraError, GROUP, kind, slices};
use gpufabric_api::device_taint::GPU_DRIVER;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// What a run needs of DRA to claim GPUs and to see GPUs claimed by others.
#[derive(Clone, Debug)]
pub struct ClaimView {
    /// ResourceClaimTemplate in its most stable served version.
    pub templates: ApiResource,
    /// ResourceClaim in its most stable served version.
    pub claims: ApiResource,
    /// Each node's GPUs as devices: by index, the device's pool and name.
    pub gpus: BTreeMap<String, BTreeMap<u32, gpufabric_health::gpu_quarantine::DeviceRef>>,
}

impl ClaimView {
    /// How many GPUs of `node` are devices; None when its GPUs are not claimed (the pod asks
    /// for `nvidia.com/gpu`).
    pub fn gpus_of(&self, node: &str) -> Option<u32> {
        self.gpus
            .get(node)
            .map(|g| u32::try_from(g.len()).unwrap_or(u32::MAX))
            .filter(|n| *n > 0)
    }

    /// How many GPUs each node publishes as devices of the GPU driver: what a node without
    /// `nvidia.com/gpu` is selected and tested by ([`crate::nodes::gpu_count`]).
    pub fn gpu_counts(&self) -> BTreeMap<String, u32> {
        self.gpus
            .keys()
            .filter_map(|node| Some((node.clone(), self.gpus_of(node)?)))
            .collect()
    }
}

/// Reads discovery and the GPU driver's ResourceSlices; None when the cluster serves no
/// ResourceClaimTemplate, ResourceClaim or ResourceSlice (every pod asks for
/// `nvidia.com/gpu`), or when the operator may not list the slices (with a warning).
pub async fn observe(client: &Client) -> Result<Option<ClaimView>, DraError> {
    let group = match kube::discovery::group(client, GROUP).await {
        Ok(g) => g,
        Err(kube::Error::Discovery(kube::error::DiscoveryError::MissingApiGroup(_))) => {
            return Ok(None);
        }
        Err(e) => return Err(DraError::Discover(e)),
    };
    let (Some(templates), Some(claims), Some(slice_api)) = (
        kind(&group, "ResourceClaimTemplate"),
        kind(&group, "ResourceClaim"),
        kind(&group, "ResourceSlice"),
    ) else {
        return Ok(None);
    };
    let gpus = match super::list_slices(client, &slice_api).await {
        Ok(s) => slices::gpus_by_node(&s),
        Err(DraError::Slices(kube::Error::Api(s))) if s.code == 403 => {
            tracing::warn!(reason = %s.message, "no right to list DRA ResourceSlices: benchmark pods ask for nvidia.com/gpu (grant list on resourceslices)");
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    Ok(Some(ClaimView {
        templates,
        claims,
        gpus,
    }))
}

/// The allocated ResourceClaims of every namespace, as JSON; empty without the right to
/// list them (with a warning: GPUs claimed by others are then not seen).
pub async fn list_allocated(client: &Client, view: &ClaimView) -> Result<Vec<Value>, DraError> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &view.claims);
    let mut out = Vec::new();
    let mut pages = crate::paging::Pages::default();
    while let Some(lp) = pages.next_params() {
        match api.list(&lp).await {
            Ok(page) => {
                out.extend(
                    page.items
                        .into_iter()
                        .map(|o| o.data)
                        .filter(|d| d["status"]["allocation"].is_object()),
                );
                pages.read(page.metadata.continue_);
            }
            Err(kube::Error::Api(s)) if s.code == 403 => {
                tracing::warn!(reason = %s.message, "no right to list ResourceClaims: GPUs other pods claim are not counted busy (grant list on resourceclaims)");
                return Ok(Vec::new());
            }
            Err(e) => return Err(DraError::Claims(e)),
        }
    }
    Ok(out)
}

/// The pods a claim is reserved for (`status.reservedFor` of kind pods), by UID; and
/// whether it is reserved for anything that is not a pod.
fn consumers(claim: &Value) -> (Vec<&str>, bool) {
    let mut pods = Vec::new();
    let mut other = false;
    for c in claim["status"]["reservedFor"]
        .as_array()
        .into_iter()
        .flatten()
    {
        match (c["resource"].as_str(), c["uid"].as_str()) {
            (Some("pods"), Some(uid)) if c["apiGroup"].as_str().unwrap_or("").is_empty() => {
                pods.push(uid)
            }
            _ => other = true,
        }
    }
    (pods, other)
}

/// The UIDs of the pods the allocated `claims` are reserved for: those whose state the busy
/// rule must know.
pub fn consumer_pods(claims: &[Value]) -> BTreeSet<String> {
    claims
        .iter()
        .flat_map(|c| consumers(c).0)
        .map(str::to_string)
        .collect()
}

/// GPUs held by others through ResourceClaims, by node: each GPU of [`GPU_DRIVER`]
/// (`gpus`, from the slices) allocated in a claim reserved for a pod in `others` (pods that
/// are not gpufabric's and have not ended, as [`crate::nodes::gpus_in_use`] counts them) or
/// for a consumer that is not a pod. A claim reserved only for gpufabric's own pods, for
/// pods that ended (the claim is about to be deallocated) or for nobody yet is not counted;
/// nor is a device given with admin access (a monitor beside the GPU's user, not a user). A
/// GPU counts once however many claims name it.
pub fn claimed_gpus(
    claims: &[Value],
    gpus: &BTreeMap<String, BTreeMap<u32, gpufabric_health::gpu_quarantine::DeviceRef>>,
    others: &BTreeSet<String>,
) -> BTreeMap<String, u32> {
    let mut node_of: BTreeMap<(&str, &str), (&str, u32)> = BTreeMap::new();
    for (node, by_index) in gpus {
        for (index, d) in by_index {
            node_of.insert(
                (d.pool.as_str(), d.device.as_str()),
                (node.as_str(), *index),
            );
        }
    }
    let mut held: BTreeSet<(&str, u32)> = BTreeSet::new();
    for claim in claims {
        let (pods, other) = consumers(claim);
        if !other && !pods.iter().any(|uid| others.contains(*uid)) {
            continue;
        }
        let results = &claim["status"]["allocation"]["devices"]["results"];
        for r in results.as_array().into_iter().flatten() {
            if r["driver"].as_str() != Some(GPU_DRIVER) || r["adminAccess"] == Value::Bool(true) {
                continue;
            }
            let (Some(pool), Some(device)) = (r["pool"].as_str(), r["device"].as_str()) else {
                continue;
            };
            if let Some(gpu) = node_of.get(&(pool, device)) {
                held.insert(*gpu);
            }
        }
    }
    let mut out: BTreeMap<String, u32> = BTreeMap::new();
    for (node, _) in held {
        *out.entry(node.to_string()).or_default() += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufabric_health::gpu_quarantine::DeviceRef;
    use serde_json::json;

    fn gpus() -> BTreeMap<String, BTreeMap<u32, DeviceRef>> {
        let node = |n: &str| {
            (0..8)
                .map(|i| {
                    (
                        i,
                        DeviceRef {
                            driver: GPU_DRIVER.into(),
                            pool: n.into(),
                            device: format!("gpu-{i}"),
                        },
                    )
                })
                .collect()
        };
        BTreeMap::from([("a".to_string(), node("a")), ("b".to_string(), node("b"))])
    }

    fn claim(pool: &str, devices: &[&str], reserved: Value) -> Value {
        let results: Vec<Value> = devices
            .iter()
            .map(|d| json!({"request": "gpus", "driver": GPU_DRIVER, "pool": pool, "device": d}))
            .collect();
        json!({"status": {"allocation": {"devices": {"results": results}}, "reservedFor": reserved}})
    }

    fn pod(uid: &str) -> Value {
        json!([{"resource": "pods", "name": "p", "uid": uid}])
    }

    #[test]
    fn a_gpu_another_pods_claim_holds_makes_its_node_busy() {
        let claims = [
            claim("a", &["gpu-0", "gpu-1"], pod("job")),
            // The same device in a second claim of the job counts once.
            claim("a", &["gpu-1"], pod("job")),
        ];
        let others = BTreeSet::from(["job".to_string()]);
        let busy = claimed_gpus(&claims, &gpus(), &others);
        assert_eq!(busy, BTreeMap::from([("a".to_string(), 2)]));
        assert_eq!(consumer_pods(&claims), others);
    }

    #[test]
    fn gpufabrics_own_ended_and_unreserved_claims_are_not_busy() {
        let claims = [
            // Our own benchmark pod's claim: its UID is not among the others.
            claim("a", &["gpu-0"], pod("ours")),
            // A pod that ended (not listed): the claim is about to be deallocated.
            claim("b", &["gpu-3"], pod("ended")),
            // Allocated, reserved for nobody yet.
            claim("b", &["gpu-4"], json!([])),
        ];
        let busy = claimed_gpus(&claims, &gpus(), &BTreeSet::from(["job".to_string()]));
        assert!(busy.is_empty(), "{busy:?}");
    }

    #[test]
    fn a_consumer_that_is_not_a_pod_holds_its_gpus_but_admin_access_and_other_drivers_do_not() {
        let mut monitor = claim("a", &["gpu-5"], pod("job"));
        monitor["status"]["allocation"]["devices"]["results"][0]["adminAccess"] = json!(true);
        let mut nic = claim("a", &["gpu-6"], pod("job"));
        nic["status"]["allocation"]["devices"]["results"][0]["driver"] = json!("example.com/nic");
        let workload = claim(
            "b",
            &["gpu-7"],
            json!([{"apiGroup": "example.com", "resource": "workloads", "name": "w", "uid": "w1"}]),
        );
        let unknown_device = claim("b", &["gpu-99"], pod("job"));
        let busy = claimed_gpus(
            &[monitor, nic, workload, unknown_device],
            &gpus(),
            &BTreeSet::from(["job".to_string()]),
        );
        assert_eq!(busy, BTreeMap::from([("b".to_string(), 1)]));
    }
}
