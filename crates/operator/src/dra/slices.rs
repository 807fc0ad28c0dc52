//! Which DRA device is which GPU: the GPU driver's ResourceSlices read into each node's GPUs
//! by index, as NVIDIA's DRA driver publishes them (attribute `index`, devices of type gpu).

use gpufabric_api::device_taint::GPU_DRIVER;
use gpufabric_health::gpu_quarantine::DeviceRef;
use serde_json::Value;
use std::collections::BTreeMap;

/// The GPUs of each node, by index, from the `ResourceSlice`s (any served version, as
/// JSON) of [`GPU_DRIVER`]. A device counts as a GPU when it has an integer attribute
/// `index` and, when it says its type, is of type `gpu` (not a MIG slice). v1beta1 holds the
/// attributes under `basic`; v1beta2 and v1 on the device itself. A node whose slices give
/// one index to two devices has none of them here (which is which is unknown).
pub fn gpus_by_node(slices: &[Value]) -> BTreeMap<String, BTreeMap<u32, DeviceRef>> {
    let mut out: BTreeMap<String, BTreeMap<u32, DeviceRef>> = BTreeMap::new();
    let mut doubled: Vec<(String, u32)> = Vec::new();
    for s in slices {
        let spec = &s["spec"];
        if spec["driver"].as_str() != Some(GPU_DRIVER) {
            continue;
        }
        let (Some(node), Some(pool)) = (spec["nodeName"].as_str(), spec["pool"]["name"].as_str())
        else {
            continue;
        };
        for d in spec["devices"].as_array().into_iter().flatten() {
            let Some((name, index)) = gpu_device(d) else {
                continue;
            };
            let device = DeviceRef {
                driver: GPU_DRIVER.to_string(),
                pool: pool.to_string(),
                device: name.to_string(),
            };
            let gpus = out.entry(node.to_string()).or_default();
            if gpus.insert(index, device).is_some() {
                doubled.push((node.to_string(), index));
            }
        }
    }
    for (node, index) in doubled {
        if let Some(gpus) = out.get_mut(&node) {
            gpus.remove(&index);
        }
    }
    out.retain(|_, g| !g.is_empty());
    out
}

/// A device's name and GPU index, when it is a whole GPU.
fn gpu_device(d: &Value) -> Option<(&str, u32)> {
    let name = d["name"].as_str()?;
    let attributes = if d["basic"].is_object() {
        &d["basic"]["attributes"]
    } else {
        &d["attributes"]
    };
    let attribute = |key: &str| {
        let qualified = format!("{GPU_DRIVER}/{key}");
        attributes
            .get(key)
            .or_else(|| attributes.get(qualified.as_str()))
    };
    if let Some(kind) = attribute("type").and_then(|t| t["string"].as_str())
        && kind != "gpu"
    {
        return None;
    }
    let index = attribute("index")?["int"].as_u64()?;
    Some((name, u32::try_from(index).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slice(node: &str, devices: Value) -> Value {
        json!({"spec": {"driver": GPU_DRIVER, "nodeName": node,
            "pool": {"name": node, "generation": 0, "resourceSliceCount": 1},
            "devices": devices}})
    }

    #[test]
    fn a_gpu_is_found_by_its_index_in_v1beta1_and_in_v1_slices() {
        let old = slice(
            "a",
            json!([{"name": "gpu-0", "basic": {"attributes": {"index": {"int": 0}}}},
                   {"name": "gpu-1", "basic": {"attributes": {"index": {"int": 1}}}}]),
        );
        let new = slice(
            "b",
            json!([{"name": "gpu-7", "attributes": {"gpu.nvidia.com/index": {"int": 3}, "type": {"string": "gpu"}}}]),
        );
        let gpus = gpus_by_node(&[old, new]);
        assert_eq!(gpus["a"][&1].device, "gpu-1");
        assert_eq!(gpus["a"][&1].pool, "a");
        assert_eq!(gpus["b"][&3].device, "gpu-7", "by index, not by name");
    }

    #[test]
    fn mig_slices_other_drivers_and_doubled_indexes_are_not_gpus() {
        let mig = slice(
            "a",
            json!([{"name": "gpu-0-mig-1", "attributes": {"index": {"int": 0}, "type": {"string": "mig"}}}]),
        );
        let mut other = slice(
            "b",
            json!([{"name": "gpu-0", "attributes": {"index": {"int": 0}}}]),
        );
        other["spec"]["driver"] = json!("example.com/gpu");
        let doubled = slice(
            "c",
            json!([{"name": "x", "attributes": {"index": {"int": 0}}},
                   {"name": "y", "attributes": {"index": {"int": 0}}},
                   {"name": "z", "attributes": {"index": {"int": 1}}}]),
        );
        let gpus = gpus_by_node(&[mig, other, doubled]);
        assert!(!gpus.contains_key("a"));
        assert!(!gpus.contains_key("b"));
        assert_eq!(gpus["c"].keys().collect::<Vec<_>>(), [&1]);
    }
}
