//! `FabricTestRun`: one execution of a FabricTest, with a frozen copy of what to run, the
//! nodes it resolved, per-node results and findings. Like a Job under a CronJob.

use crate::findings::Finding;
use crate::limits::{LimitsStatus, RunLimits};
use crate::outcome::{HardwareFault, NodeOutcome, NotMeasuredReason};
use crate::policy::{QuarantinePolicy, Thresholds};
use crate::result::{CompactResult, ErrorKind, KeyNumbers};
use crate::rollout::Rollout;
use crate::suite::Suite;
use crate::test::{AgentSpec, FabricTestSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub use crate::run_state::{NodeVerdict, RunPhase, Trigger};

/// One run of a FabricTest.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[kube(
    group = "gpufabric.io",
    version = "v1alpha1",
    kind = "FabricTestRun",
    shortname = "ftr",
    category = "gpufabric",
    status = "FabricTestRunStatus",
    doc = "One run of a FabricTest: the frozen suite and policy, the nodes it tested, their results and the findings.",
    printcolumn(
        name = "Test",
        type_ = "string",
        json_path = ".spec.test",
        priority = 1
    ),
    printcolumn(
        name = "Trigger",
        type_ = "string",
        json_path = ".spec.trigger",
        priority = 1
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(name = "Nodes", type_ = "integer", json_path = ".status.nodeCount"),
    printcolumn(name = "Passed", type_ = "integer", json_path = ".status.passed"),
    printcolumn(name = "Failed", type_ = "integer", json_path = ".status.failed"),
    printcolumn(name = "Done", type_ = "integer", json_path = ".status.progress.done"),
    printcolumn(
        name = "Wave",
        type_ = "integer",
        json_path = ".status.progress.wave",
        priority = 1
    ),
    printcolumn(name = "Started", type_ = "date", json_path = ".status.startTime"),
    printcolumn(name = "Duration", type_ = "string", json_path = ".status.duration"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct FabricTestRunSpec {
    /// Name of the FabricTest this run belongs to.
    pub test: String,
    /// Why this run exists.
    pub trigger: Trigger,
    /// The schedule time this run stands for (scheduled runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_time: Option<Time>,
    /// Node selector copied from the test.
    #[serde(default)]
    pub node_selector: BTreeMap<String, String>,
    /// Explicit nodes: copied from the test, or the suspects of a confirmation run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<Vec<String>>,
    /// Frozen copy of the test's suite.
    #[serde(default)]
    pub suite: Suite,
    /// Frozen copy of the test's thresholds.
    #[serde(default)]
    pub thresholds: Thresholds,
    /// The test's quarantine policy when the run started, kept as a record. What happens
    /// to the nodes after the run follows the FabricTest's policy as it is then, so that
    /// switching a test to Observe (or lowering its budget) takes effect at once, also for
    /// runs already under way.
    #[serde(default)]
    pub quarantine: QuarantinePolicy,
    /// Frozen copy of the test's agent settings.
    #[serde(default)]
    pub agent: AgentSpec,
    /// Frozen copy of the test's rollout: how many nodes are under test at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<Rollout>,
    /// Frozen copy of the test's limits: the most nodes the run tests, the longest it runs.
    #[serde(default, skip_serializing_if = "RunLimits::is_empty")]
    pub limits: RunLimits,
    /// Why each node of a targeted run is in it (gated, repaired, a node condition, named
    /// by hand), by node name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub reasons: BTreeMap<String, String>,
}

impl FabricTestRunSpec {
    /// A run of the FabricTest `test_name` with spec `spec`: a frozen copy of what to run.
    /// `nodes` is the explicit node list: the test's own for scheduled, manual and creation
    /// runs, the suspects for a confirmation run.
    pub fn of_test(
        test_name: &str,
        spec: &FabricTestSpec,
        trigger: Trigger,
        scheduled_time: Option<Time>,
        nodes: Option<Vec<String>>,
    ) -> Self {
        FabricTestRunSpec {
            test: test_name.to_string(),
            trigger,
            scheduled_time,
            node_selector: spec.node_selector.clone(),
            nodes,
            suite: spec.suite.clone(),
            thresholds: spec.thresholds.clone(),
            quarantine: spec.quarantine.clone(),
            agent: spec.agent.clone(),
            rollout: spec.rollout.clone(),
            limits: spec.limits.clone(),
            reasons: BTreeMap::new(),
        }
    }
}

/// Result of one node in a run (compact: the full measurements stay in the pod).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeRunResult {
    pub node: String,
    pub verdict: NodeVerdict,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The UID of the pod the operator made for this node, recorded when it made it: only
    /// that pod is read, never another by the same name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// GPU product and count measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub product: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    /// Why the node errored, timed out or was not measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The hardware fault the agent saw (verdict Errored or Timeout).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware_fault: Option<HardwareFault>,
    /// Why the node was not measured (verdict NotMeasured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_measured: Option<NotMeasuredReason>,
    /// Peak all_reduce bus bandwidth (GB/s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all_reduce_bus_bw_gbps: Option<f64>,
    /// Lowest one-way GPU-pair copy bandwidth (GB/s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_pair_gbps: Option<f64>,
    /// DDP scaling efficiency at the largest GPU count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ddp_efficiency: Option<f64>,
    /// Lowest host-to-device or device-to-host copy of any GPU (GB/s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_host_gbps: Option<f64>,
    /// DDP step time at the largest GPU count (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ddp_step_ms: Option<f64>,
    /// Critical findings on this node.
    #[serde(default)]
    pub findings: u32,
    /// The most severe finding on this node, as a sentence (cut to 300 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finding: Option<String>,
    /// The node-pair tests this node took part in (`suite.nodePairs`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pairs: Vec<crate::pair::PairRecord>,
    /// The node's failure is already confirmed within this run: the node-pair phase
    /// retested it against a known-good partner. `quarantine.confirmRetest` sends it to no
    /// confirmation run (which could not rebuild the pairing).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub confirmed: bool,
    /// Phases of a measured node that could not run (the suite or a setting NCCL refused, a
    /// library missing): the node is judged on the rest and never blamed for these, but its
    /// measurement is not complete, so it opens no validation gate and releases no repair.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unmeasured: Vec<String>,
}

impl NodeRunResult {
    /// Measured, and every phase of the suite ran.
    pub fn complete(&self) -> bool {
        self.verdict.is_measured() && self.unmeasured.is_empty()
    }

    /// Writes a node's outcome into its entry: the verdict before evaluation
    /// ([`NodeVerdict::provisional`]), the sentence, and the hardware fault or the reason it
    /// was not measured; of a measurement, its headline numbers. The entry's other outcome
    /// fields are cleared, so that [`NodeRunResult::outcome`] gives back exactly `outcome`
    /// when it is not a measurement. The node, pod, findings and pair records are left as
    /// they are.
    pub fn record(&mut self, outcome: &NodeOutcome) {
        self.verdict = NodeVerdict::provisional(outcome);
        self.reason = outcome.detail().map(str::to_string);
        self.hardware_fault = None;
        self.not_measured = None;
        self.product = None;
        self.gpus = None;
        self.all_reduce_bus_bw_gbps = None;
        self.min_pair_gbps = None;
        self.ddp_efficiency = None;
        self.min_host_gbps = None;
        self.ddp_step_ms = None;
        self.unmeasured.clear();
        match outcome {
            NodeOutcome::Measured(c) => self.summarise(c),
            NodeOutcome::HardwareFault { fault, .. } => self.hardware_fault = Some(*fault),
            NodeOutcome::NotMeasured { reason, .. } => self.not_measured = Some(*reason),
        }
    }

    /// The outcome the entry holds, when it holds a whole one: a hardware fault (verdict
    /// Errored or Timeout) or a reason the node was not measured (verdict NotMeasured), with
    /// its sentence. None for a node whose pod has not ended or that was measured: of a
    /// measurement the entry keeps only the headline numbers (the document stays in the pod
    /// and in the run's results ConfigMap).
    ///
    /// An entry that lacks the fault or the reason (written before they were recorded) gives
    /// the outcome its verdict stands for: not measured because the pod was deleted, a hang
    /// for Timeout, a crash for Errored; one without a sentence says "no result".
    pub fn outcome(&self) -> Option<NodeOutcome> {
        if !matches!(
            self.verdict,
            NodeVerdict::Errored | NodeVerdict::Timeout | NodeVerdict::NotMeasured
        ) {
            return None;
        }
        let detail = self.reason.clone().unwrap_or_else(|| "no result".into());
        Some(
            match (self.not_measured, self.verdict, self.hardware_fault) {
                (Some(reason), _, _) => NodeOutcome::not_measured(reason, detail),
                (None, NodeVerdict::NotMeasured, _) => {
                    NodeOutcome::not_measured(NotMeasuredReason::PodDeleted, detail)
                }
                (None, _, Some(fault)) => NodeOutcome::hardware(fault, detail),
                (None, NodeVerdict::Timeout, None) => {
                    NodeOutcome::hardware(HardwareFault::Hang, detail)
                }
                (None, _, None) => NodeOutcome::hardware(HardwareFault::Crash, detail),
            },
        )
    }

    /// The headline numbers of a measurement: peak all_reduce bus bandwidth, the slowest
    /// GPU-pair copy and host link, DDP step time at the most GPUs (the numbers a node's
    /// trend keeps, [`KeyNumbers`], to four significant digits), DDP
    /// efficiency, and the phases that could not run.
    fn summarise(&mut self, c: &CompactResult) {
        self.product = (!c.product.is_empty()).then(|| c.product.clone());
        self.gpus = Some(c.gpus);
        // Four significant digits, as a node's trend keeps them: a shard entry stays small.
        let key = KeyNumbers::of(c);
        self.all_reduce_bus_bw_gbps = key.busbw_gbps;
        self.min_pair_gbps = key.worst_pair_gbps;
        self.min_host_gbps = key.host_gbps;
        self.ddp_step_ms = key.ddp_step_ms;
        self.ddp_efficiency = c
            .ddp_points
            .iter()
            .max_by_key(|p| p.gpus)
            .map(|p| p.scaling_efficiency);
        self.unmeasured = c
            .errors
            .iter()
            .filter(|e| e.kind == ErrorKind::Unavailable)
            .map(|e| e.phase.api_name().to_string())
            .collect();
        self.unmeasured.sort();
        self.unmeasured.dedup();
    }
}

/// Observed state of a run.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FabricTestRunStatus {
    #[serde(default)]
    pub phase: RunPhase,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// Wall time of the run, e.g. "4m12s".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<String>,
    #[serde(default)]
    pub node_count: u32,
    #[serde(default)]
    pub passed: u32,
    #[serde(default)]
    pub failed: u32,
    #[serde(default)]
    pub errored: u32,
    /// Nodes not measured for a reason outside their hardware.
    #[serde(default)]
    pub not_measured: u32,
    /// Selected nodes the run did not test, with why (busy, tainted or cordoned by others,
    /// partitioned GPUs, not Ready): at most 100, `skippedCount` counts them all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["node"]))]
    pub skipped: Vec<SkippedNode>,
    /// Selected nodes the run did not test.
    #[serde(default)]
    pub skipped_count: u32,
    /// Number of FabricTestRunShards holding every node's result
    /// (`kubectl get ftrs -l gpufabric.io/run=<run>`).
    #[serde(default)]
    pub shards: u32,
    /// Nodes done, in total, and the wave under way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<RunProgress>,
    /// The nodes most worth a look, the worst first: at most 100 (every node of a smaller
    /// run). Every node's result is in the run's shards.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["node"]))]
    pub nodes: Vec<NodeRunResult>,
    /// Findings, critical first: at most 100; `findingCount` counts them all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub findings: Vec<Finding>,
    /// Findings of the run, listed or not.
    #[serde(default)]
    pub finding_count: u32,
    /// Why the run failed, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The node-pair phase (`suite.nodePairs`), once it has begun.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_pairs: Option<crate::pair::NodePairsStatus>,
    /// The multi-node DDP probe (`suite.ddpNodes`), once it has begun.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ddp_nodes: Option<crate::ddp_nodes::DdpNodesStatus>,
    /// The multi-node NCCL sweep (`suite.ncclNodes`), once it has begun.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nccl_nodes: Option<crate::nccl_nodes::NcclNodesStatus>,
    /// The UID of the rendezvous Secret this run made (node pairs, the multi-node DDP
    /// probe, the multi-node NCCL sweep): rank pods are made only while the Secret at its name is that one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rendezvous_secret_uid: Option<String>,
    /// What this run's passing, unquarantined nodes of a complete check measured, per GPU
    /// product (the run's own numbers for the test's baseline, which its test adds when it
    /// folds a complete run).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub baseline_sample: Vec<crate::baseline::KeyedSample>,
    /// How the run stands against `spec.limits`, and why it was stopped early (cancelled,
    /// or its longest duration reached); absent when neither applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<LimitsStatus>,
}

/// How far a run is.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunProgress {
    /// Nodes with a final verdict.
    pub done: u32,
    /// Nodes the run tests.
    pub total: u32,
    /// The wave under way (1-based).
    pub wave: u32,
    /// Number of waves.
    pub waves: u32,
    /// Nodes per wave (`spec.rollout`; every node when absent).
    pub wave_size: u32,
    /// When the wave under way began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wave_start_time: Option<Time>,
    /// When every pod of the wave under way existed; the wave's deadline counts from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wave_pods_created_time: Option<Time>,
    /// Pods stopped because their wave's deadline passed (the run then fails).
    #[serde(default)]
    pub stopped: u32,
}

/// A selected node the run did not test.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SkippedNode {
    pub node: String,
    pub reason: SkipReason,
    /// The detail, e.g. which taint or how many GPUs are in use.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}

/// Why a selected node is not tested.
#[derive(
    Serialize,
    Deserialize,
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    schemars::JsonSchema,
)]
pub enum SkipReason {
    /// Other pods hold some of its GPUs (set `includeBusyNodes` to test it anyway).
    Busy,
    /// A pod of another gpufabric run on it has not ended: a node is tested by one run at a
    /// time (the run waits for it first, up to its agent timeout).
    InOtherRun,
    /// Someone else's NoSchedule or NoExecute taint (maintenance).
    Tainted,
    /// Unschedulable, cordoned by someone else.
    Cordoned,
    /// Not Ready.
    NotReady,
    /// Being deleted.
    Deleting,
    /// MIG or time-sliced GPUs: `nvidia.com/gpu` is not the node's physical GPU count.
    PartitionedGpus,
    /// No allocatable `nvidia.com/gpu`.
    NoGpus,
    /// Named in `nodes` but missing or not matching the selector.
    NotFound,
    /// Beyond `limits.maxNodes`: the run tests at most that many nodes.
    OverLimit,
}

impl SkipReason {
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::Busy => "Busy",
            SkipReason::InOtherRun => "InOtherRun",
            SkipReason::Tainted => "Tainted",
            SkipReason::Cordoned => "Cordoned",
            SkipReason::NotReady => "NotReady",
            SkipReason::Deleting => "Deleting",
            SkipReason::PartitionedGpus => "PartitionedGpus",
            SkipReason::NoGpus => "NoGpus",
            SkipReason::NotFound => "NotFound",
            SkipReason::OverLimit => "OverLimit",
        }
    }
}

impl std::fmt::Display for SkipReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
