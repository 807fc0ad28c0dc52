//! A GPU taken out of service on its own: the DRA device taint gpufabric writes for a
//! GPU-level fault, the record it keeps of it, and how a test's nodes are handled.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::{Deserialize, Serialize};

/// The DRA driver whose devices are GPUs (NVIDIA's DRA driver): its ResourceSlices say which
/// device is which GPU.
pub const GPU_DRIVER: &str = "gpu.nvidia.com";

/// What a DeviceTaintRule of gpufabric does to claims of its GPU
/// (`quarantine.gpuTaintEffect`).
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema,
)]
pub enum GpuTaintEffect {
    /// New claims do not get the GPU; pods already using it keep running.
    #[default]
    NoSchedule,
    /// New claims do not get the GPU, and the pods using it are evicted.
    NoExecute,
}

impl GpuTaintEffect {
    /// The effect as a DeviceTaint names it.
    pub fn as_str(self) -> &'static str {
        match self {
            GpuTaintEffect::NoSchedule => "NoSchedule",
            GpuTaintEffect::NoExecute => "NoExecute",
        }
    }
}

/// One GPU of a node this test took out of service with a DeviceTaintRule.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TaintedGpu {
    /// The GPU's index on its node, as the findings name it.
    pub gpu: u32,
    /// The DRA device (`<driver>/<pool>/<device>`).
    pub device: String,
    /// The DeviceTaintRule that taints it.
    pub rule: String,
    /// Why: the finding that confirmed the GPU at fault.
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
}

/// How this test acts on a GPU-level fault, per node: per GPU (DRA device taints) where the
/// cluster serves DeviceTaintRules and the node's GPUs are devices of [`GPU_DRIVER`], per
/// node (the quarantine mode) everywhere else.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuHandling {
    /// The `resource.k8s.io` version the cluster serves DeviceTaintRules in; absent when it
    /// serves none (every node is handled per node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_taint_rules: Option<String>,
    /// Nodes the test knows whose GPUs are DRA devices: a GPU-level fault taints the GPU
    /// (at most [`GpuHandling::LISTED`]; `perGpuCount` counts them all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_gpu: Vec<String>,
    #[serde(default)]
    pub per_gpu_count: u32,
    /// Nodes the test knows handled per node: a GPU-level fault quarantines the node (at
    /// most [`GpuHandling::LISTED`]; `perNodeCount` counts them all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub per_node: Vec<String>,
    #[serde(default)]
    pub per_node_count: u32,
    /// GPUs this test holds tainted now, over all nodes.
    #[serde(default)]
    pub tainted_gpus: u32,
    /// Most GPUs this test may hold tainted (`quarantine.maxQuarantinedGpus` resolved over
    /// the selected nodes' GPUs): a GPU taint beyond it is refused.
    #[serde(default)]
    pub gpu_budget: u32,
}

impl GpuHandling {
    /// Most node names listed in `perGpu` and in `perNode` (the status stays small).
    pub const LISTED: usize = 100;
}

/// What gpufabric records on a DeviceTaintRule it made (annotation
/// [`crate::keys::ANNOTATION_DEVICE_QUARANTINE`]): the rule is the test's only while this
/// record and the rule's controller owner both name the test's UID.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DeviceQuarantineRecord {
    /// The FabricTest's UID.
    pub test_uid: String,
    /// The FabricTest's name.
    pub test: String,
    pub node: String,
    pub gpu: u32,
    /// The run that confirmed the fault.
    pub run: String,
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
}
