//! `FabricTest`: what to test, where, when, and what to do with failures; and its status,
//! a summary of the latest run and of each node's health over runs.

use crate::limits::RunLimits;
use crate::policy::{QuarantinePolicy, Thresholds};
use crate::rollout::Rollout;
use crate::run_state::{NodeVerdict, RunPhase, Trigger};
use crate::suite::Suite;
use k8s_openapi::api::core::v1::{EnvVar, LocalObjectReference, ResourceRequirements, Toleration};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Image the benchmark pods run when neither `agent.image` nor the operator's
/// `--agent-image` names one.
pub const DEFAULT_AGENT_IMAGE: &str = concat!(
    "ghcr.io/gpufabric/fabric-agent:v",
    env!("CARGO_PKG_VERSION")
);

/// RE2 pattern (CEL `matches`) of a 5-field cron expression or a macro, as CronJob takes it.
/// Ranges are checked per field, so `61 * * * *` is rejected by the API server itself.
macro_rules! cron_pattern {
    () => {
        concat!(
    "^(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|",
    // minute
    "([*]|[0-5]?[0-9])(-([0-5]?[0-9]))?(/[0-9]+)?(,([*]|[0-5]?[0-9])(-([0-5]?[0-9]))?(/[0-9]+)?)*",
    " +",
    // hour
    "([*]|[01]?[0-9]|2[0-3])(-([01]?[0-9]|2[0-3]))?(/[0-9]+)?(,([*]|[01]?[0-9]|2[0-3])(-([01]?[0-9]|2[0-3]))?(/[0-9]+)?)*",
    " +",
    // day of month
    "([*?]|[1-9]|[12][0-9]|3[01])(-([1-9]|[12][0-9]|3[01]))?(/[0-9]+)?(,([*?]|[1-9]|[12][0-9]|3[01])(-([1-9]|[12][0-9]|3[01]))?(/[0-9]+)?)*",
    " +",
    // month
    "([*]|[1-9]|1[0-2]|(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec))(-([1-9]|1[0-2]|(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)))?(/[0-9]+)?(,([*]|[1-9]|1[0-2]|(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec))(-([1-9]|1[0-2]|(?i:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)))?(/[0-9]+)?)*",
    " +",
    // day of week
    "([*?]|[0-7]|(?i:sun|mon|tue|wed|thu|fri|sat))(-([0-7]|(?i:sun|mon|tue|wed|thu|fri|sat)))?(/[0-9]+)?(,([*?]|[0-7]|(?i:sun|mon|tue|wed|thu|fri|sat))(-([0-7]|(?i:sun|mon|tue|wed|thu|fri|sat)))?(/[0-9]+)?)*",
    ")$"
)
    };
}

/// The schedule pattern, for tests and tools.
pub const CRON_PATTERN: &str = cron_pattern!();

/// Message of the schedule rule, shared by the CRD schema and `validate()`.
pub const CRON_MESSAGE: &str = "schedule must be a cron expression of 5 fields (minute hour day-of-month month day-of-week), for example \"0 2 * * *\", or one of @hourly, @daily, @weekly, @monthly, @yearly";

const SCHEDULE_RULE: &str = concat!("self.matches('", cron_pattern!(), "')");

/// CEL rule: every nodeSelector key is a label key (`[DNS-subdomain/]name`); the 253-character
/// limit of the prefix is left to `validate()`.
const SELECTOR_KEYS_RULE: &str = r"self.all(k, k.matches('^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$'))";
const SELECTOR_KEYS_MESSAGE: &str = "nodeSelector keys must be label keys: an optional DNS subdomain prefix and '/', then a name of up to 63 alphanumeric characters, '-', '_' or '.', starting and ending with an alphanumeric character (e.g. 'pool', 'nvidia.com/gpu.product')";

/// A test of the GPU fabric of the selected nodes, run on a schedule or once.
#[derive(CustomResource, schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "gpufabric.io",
    version = "v1alpha1",
    kind = "FabricTest",
    shortname = "ft",
    category = "gpufabric",
    status = "FabricTestStatus",
    doc = "A scheduled test of the GPU fabric (NCCL, GPU pairs, DDP scaling, NVML health) of the selected nodes, and what to do with the nodes that fail.",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Degraded",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Degraded\")].status"
    ),
    printcolumn(name = "Schedule", type_ = "string", json_path = ".spec.schedule"),
    printcolumn(name = "Suspend", type_ = "boolean", json_path = ".spec.suspend"),
    printcolumn(
        name = "Last Run",
        type_ = "string",
        json_path = ".status.lastRun.name"
    ),
    printcolumn(
        name = "Passed",
        type_ = "integer",
        json_path = ".status.lastRun.passed"
    ),
    printcolumn(
        name = "Failed",
        type_ = "integer",
        json_path = ".status.lastRun.failed"
    ),
    printcolumn(
        name = "Quarantined",
        type_ = "integer",
        json_path = ".status.quarantinedCount"
    ),
    printcolumn(
        name = "Breaker Open",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"BreakerOpen\")].status"
    ),
    // A future time in a `date` column prints as `<invalid>` in kubectl: show the timestamp.
    printcolumn(
        name = "Next Run",
        type_ = "string",
        json_path = ".status.nextScheduleTime"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase", default)]
pub struct FabricTestSpec {
    /// Cron schedule (5 fields, or @daily etc.). Absent: one run when the test is created.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    #[schemars(extend("x-kubernetes-validations" = [{"rule": SCHEDULE_RULE, "message": CRON_MESSAGE}]))]
    pub schedule: Option<String>,
    /// IANA time zone of the schedule (default: UTC), e.g. "Europe/Berlin".
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub time_zone: Option<String>,
    /// Stop starting new runs (a run in progress finishes).
    pub suspend: bool,
    /// Labels the nodes must have. Empty selects every node with `nvidia.com/gpu`.
    #[schemars(extend(
        "maxProperties" = 64,
        "additionalProperties" = {"type": "string", "maxLength": 63, "pattern": "^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"},
        "x-kubernetes-validations" = [{"rule": SELECTOR_KEYS_RULE, "message": SELECTOR_KEYS_MESSAGE}]
    ))]
    pub node_selector: BTreeMap<String, String>,
    /// Explicit node names; when set, only these nodes (that also match the selector) run.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1))]
    pub nodes: Option<Vec<String>>,
    /// Also test nodes whose GPUs are partly held by other pods (their benchmark pods may
    /// then be refused by the kubelet: not measured, never held against the node). Off:
    /// busy nodes are skipped.
    pub include_busy_nodes: bool,
    /// Wait up to this many seconds for busy nodes before a run starts: the run stays
    /// Pending (its message names the busy nodes) while other pods hold GPUs of any selected
    /// node, and starts once none do or the time is up; nodes still busy then are skipped.
    /// Absent: busy nodes are skipped at once. Has no effect with `includeBusyNodes`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub wait_for_busy_nodes_seconds: Option<u32>,
    /// What to do when a run is due while another is active (as CronJob).
    pub concurrency_policy: ConcurrencyPolicy,
    /// A run that could not start within this many seconds of its time is skipped.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub starting_deadline_seconds: Option<i64>,
    /// The benchmarks to run.
    pub suite: Suite,
    /// Explicit expectations; absent metrics use GPU profiles and the fleet.
    pub thresholds: Thresholds,
    /// What to do with nodes at fault.
    pub quarantine: QuarantinePolicy,
    /// How the benchmark pods run.
    pub agent: AgentSpec,
    /// How many nodes are under test at once; absent: all of a run's nodes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout: Option<Rollout>,
    /// Hard limits on each run: the most nodes it tests and the longest it runs.
    #[serde(skip_serializing_if = "RunLimits::is_empty")]
    pub limits: RunLimits,
    /// Finished successful runs to keep.
    pub successful_runs_history_limit: u32,
    /// Finished failed runs to keep.
    pub failed_runs_history_limit: u32,
    /// Testing outside the schedule: nodes that join, and nodes other tools report trouble on.
    pub node_lifecycle: NodeLifecycle,
}

/// When a node is tested outside the schedule. Independently of these settings, a node that
/// carries the validation gate (`gpufabric.io/validation`) or the repaired annotation
/// (`gpufabric.io/repaired`), and a node whose quarantine someone else undid, is tested at
/// once by every FabricTest that selects it.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct NodeLifecycle {
    /// Put the validation gate (taint `gpufabric.io/validation:NoSchedule`) on selected
    /// nodes that join after this test was created, so that they take no work until a run
    /// passes them. Registering nodes with the taint (kubelet `--register-with-taints`)
    /// closes the moment between joining and the taint; this closes it for pools that
    /// cannot.
    pub gate_new_nodes: bool,
    /// Node condition types (e.g. `GPUProblem`, `XidCriticalError`) that another tool sets
    /// to True on a node it sees trouble on: such a node is tested at once, once per time
    /// the condition turns True.
    #[schemars(length(max = 16))]
    pub test_on_conditions: Vec<String>,
}

impl Default for FabricTestSpec {
    /// Every default filled in: what serde produces from `{}`. Keeps 3 successful and 1
    /// failed run, like CronJob.
    fn default() -> Self {
        FabricTestSpec {
            schedule: None,
            time_zone: None,
            suspend: false,
            node_selector: BTreeMap::new(),
            nodes: None,
            include_busy_nodes: false,
            wait_for_busy_nodes_seconds: None,
            concurrency_policy: ConcurrencyPolicy::Forbid,
            starting_deadline_seconds: None,
            suite: Suite::default(),
            thresholds: Thresholds::default(),
            quarantine: QuarantinePolicy::default(),
            agent: AgentSpec::default(),
            rollout: None,
            limits: RunLimits::default(),
            successful_runs_history_limit: 3,
            failed_runs_history_limit: 1,
            node_lifecycle: NodeLifecycle::default(),
        }
    }
}

/// CronJob's concurrency policies.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema,
)]
pub enum ConcurrencyPolicy {
    /// Skip a due run while one is active.
    #[default]
    Forbid,
    /// Stop the active run and start the new one.
    Replace,
    /// Run them side by side.
    Allow,
}

impl ConcurrencyPolicy {
    /// Whether a due run starts while other runs of the test may be active: `None` when
    /// it must not (Forbid with a run active), else `Some(stop_active)`, true when the
    /// active runs are stopped first (Replace).
    pub fn admit(self, any_active: bool) -> Option<bool> {
        match self {
            ConcurrencyPolicy::Forbid if any_active => None,
            ConcurrencyPolicy::Replace => Some(true),
            ConcurrencyPolicy::Forbid | ConcurrencyPolicy::Allow => Some(false),
        }
    }
}

/// Image pull policy of the benchmark pods.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema,
)]
pub enum PullPolicy {
    Always,
    #[default]
    IfNotPresent,
    Never,
}

/// How the benchmark pods run.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct AgentSpec {
    /// Agent image. Empty (the default): the operator's `--agent-image` (the chart's
    /// `agentImage`), resolved when each benchmark pod is created.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub image: String,
    pub image_pull_policy: PullPolicy,
    /// Secrets in the operator's namespace to pull the agent image with (a private
    /// registry), as a pod's `imagePullSecrets`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// RuntimeClass of the benchmark pods: `nvidia` where the NVIDIA container runtime is a
    /// RuntimeClass rather than the container runtime's default (k3s, RKE2, containerd set
    /// up by the GPU operator without `default_runtime_name`). Empty: the node's default.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub runtime_class_name: Option<String>,
    /// PriorityClass of the benchmark pods. A pod bound with `nodeName` is still preempted
    /// by the scheduler for a pod of higher priority that needs its GPUs; the node is then
    /// not measured (Preempted), never failed. Empty: the cluster's default priority.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub priority_class_name: Option<String>,
    /// Resources of the agent container besides the GPUs (which are always all of the
    /// node's): memory, CPU, and extended resources such as the RDMA devices of the NVIDIA
    /// network operator (`rdma/rdma_shared_device_a: 1`), whole numbers with the request
    /// equal to the limit. `nvidia.com/gpu` is refused here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// Annotations of every benchmark pod, e.g. Multus's `k8s.v1.cni.cncf.io/networks`
    /// attaching the pods to secondary (RDMA) networks. Keys under `gpufabric.io/` are the
    /// operator's and refused.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_annotations: BTreeMap<String, String>,
    /// Extra environment (e.g. NCCL_DEBUG, NCCL_IB_HCA).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Extra tolerations (the operator's own quarantine taint is always tolerated).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Run the pods in the host network namespace (needed for some RDMA setups).
    pub host_network: bool,
    /// Add the `IPC_LOCK` capability to the agent container: RDMA (InfiniBand, RoCE)
    /// registers pinned memory, which NCCL's IB transport needs beyond the default
    /// locked-memory limit.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub ipc_lock: bool,
    /// Size of the memory-backed `/dev/shm` (NCCL's shared-memory transport and proxy
    /// buffers); default 1Gi.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shm_size: Option<k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    /// Deadline of each benchmark pod (activeDeadlineSeconds) and of the run's phases.
    #[schemars(range(min = 10, max = 86400))]
    pub timeout_seconds: u32,
}

impl Default for AgentSpec {
    fn default() -> Self {
        AgentSpec {
            image: String::new(),
            image_pull_policy: PullPolicy::IfNotPresent,
            image_pull_secrets: Vec::new(),
            runtime_class_name: None,
            priority_class_name: None,
            resources: None,
            pod_annotations: BTreeMap::new(),
            env: Vec::new(),
            tolerations: Vec::new(),
            host_network: false,
            ipc_lock: false,
            shm_size: None,
            timeout_seconds: 900,
        }
    }
}

/// Observed state of a FabricTest.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FabricTestStatus {
    /// Ready (the spec is accepted and the operator acts on it: True from the first
    /// reconcile, reason Scheduled, RunsOnce or Suspended; False only with InvalidSpec),
    /// Degraded (nodes failing; Unknown until a run is judged), BreakerOpen and
    /// InfrastructureDegraded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_schedule_time: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_schedule_time: Option<Time>,
    /// Name of the run in progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_run: Option<String>,
    /// The latest finished run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run: Option<RunSummary>,
    /// Health of nodes over runs: at most 200, those that need attention first
    /// (quarantined, then failing, then held back, then the rest). A node left out has a
    /// plain history (the next failure starts its streak again: a cordon comes later,
    /// never sooner); quarantined nodes all carry the `gpufabric.io/quarantined` label.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "crate::health_upgrade::nodes"
    )]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["node"]))]
    pub nodes: Vec<NodeHealth>,
    /// Nodes with a history that `nodes` leaves out.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub nodes_not_listed: u32,
    /// Nodes this test holds in quarantine now: at most 200 (`quarantinedCount` counts
    /// them all; `kubectl get nodes -l gpufabric.io/quarantined` lists them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quarantined_nodes: Vec<String>,
    #[serde(default)]
    pub quarantined_count: u32,
    /// Nodes waiting to be tested outside the schedule (gated, repaired, trouble reported),
    /// at most 200.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["node"]))]
    pub targets: Vec<NodeTarget>,
    /// Nodes quarantined too often to be released by passing runs (their `nodes[].standing` is `RepeatOffender`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub repeat_offenders: Vec<String>,
    /// What this test's passing nodes measured in its recent complete runs, per GPU product,
    /// suite and NCCL settings: what a node judged without enough peers in its run is held to
    /// (`kubectl gpufabric baseline export` writes it as a file).
    #[serde(default, skip_serializing_if = "is_empty_baseline")]
    pub baseline: crate::baseline::FleetBaseline,
    /// Which nodes a GPU-level fault is acted on per GPU (DRA device taints) and which per
    /// node, as the latest run found the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_handling: Option<crate::device_taint::GpuHandling>,
}

fn is_empty_baseline(b: &crate::baseline::FleetBaseline) -> bool {
    b.entries.is_empty()
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Summary of a finished run.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunSummary {
    pub name: String,
    pub phase: RunPhase,
    pub trigger: Trigger,
    pub passed: u32,
    pub failed: u32,
    pub errored: u32,
    /// Nodes not measured for a reason outside their hardware.
    #[serde(default)]
    pub not_measured: u32,
    pub findings: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
}

/// A node's health over runs of this test.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeHealth {
    pub node: String,
    /// Verdict of the latest run that tested the node.
    pub verdict: NodeVerdict,
    pub consecutive_failures: u32,
    pub consecutive_passes: u32,
    /// The node's standing in this test, decided when a run is folded: what the node's
    /// signals, the metrics, this status' order and `kubectl gpufabric node` read
    /// (quarantined by this test, a repeat offender, held back, ...).
    #[serde(default)]
    pub standing: crate::standing::Standing,
    /// The flags an earlier version stored in place of the standing: read once, when the
    /// status is read ([`crate::health_upgrade`]), never written.
    #[serde(flatten, default)]
    pub earlier: EarlierFlags,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantined_since: Option<Time>,
    /// Why the quarantine planner did not act on the node in the latest run, whatever its
    /// standing: a failure not quarantined (the mode is Observe, the budget is spent, the
    /// breaker is open, ...) or a quarantine kept although the node passed enough runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_back: Option<String>,
    /// The most severe finding of the latest run, as a sentence; when the verdict is
    /// NotMeasured, why the node was not measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_finding: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run: Option<String>,
    /// When a run of this test last measured the node (passed or failed it; a node not
    /// measured keeps the earlier time).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_measured: Option<Time>,
    /// When a run of this test last gave the node a verdict (passed or failed it, in full or
    /// not; a node not measured keeps the earlier time). A run of fewer than
    /// `quarantine.stormMinNodes` nodes is judged by the storm rule together with the nodes
    /// judged within the day before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_judged: Option<Time>,
    /// When this test quarantined the node, within `quarantine.repeatOffenderWindowHours`:
    /// the evidence of a repeat offender.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub quarantine_times: Vec<Time>,
    /// Someone else undid this test's quarantine of the node (uncordoned it, cordoned it
    /// again, removed the taint or the label): what, and when. The test stopped holding the
    /// node then; what is on the node now is theirs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub taken_back: Option<TakenBack>,
    /// When the operator first saw the validation gate on the node, this time it carries
    /// it: a gate is a request to test the node, once per time it appears, whoever put it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gated_since: Option<Time>,
    /// The latest rise (turn to True) of a condition in `nodeLifecycle.testOnConditions`
    /// that was served: a run started for it, or it was dropped by the bound. One run per
    /// rise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition_rise: Option<Time>,
    /// When runs started for the node's conditions within the last
    /// `CONDITION_RUN_WINDOW_SECONDS`: at most `CONDITION_RUNS_PER_WINDOW` of them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub condition_runs: Vec<Time>,
    /// Rises of the node's conditions that started no run because the bound was reached.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub condition_rises_dropped: u32,
    /// The node's GPUs this test took out of service with DRA device taints (the node is
    /// handled per GPU, see `status.gpuHandling`); the node itself stays schedulable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["gpu"]))]
    pub tainted_gpus: Vec<crate::device_taint::TaintedGpu>,
}

/// At most this many runs start for a node's conditions (`testOnConditions`) within
/// [`CONDITION_RUN_WINDOW_SECONDS`]; a rise beyond it is dropped and counted.
pub const CONDITION_RUNS_PER_WINDOW: usize = 3;
/// The window of [`CONDITION_RUNS_PER_WINDOW`].
pub const CONDITION_RUN_WINDOW_SECONDS: i64 = 600;

/// A quarantine someone else undid.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TakenBack {
    /// What was done, as a sentence ("uncordoned by kubectl").
    pub what: String,
    /// When the operator saw it.
    pub at: Time,
    /// Whether it counts as a repair: the node is tested at once (an uncordon, or the
    /// quarantine taint or label removed; not a cordon of someone else's).
    #[serde(default)]
    pub repair: bool,
}

/// A node this test must test now, outside its schedule, and how often it tried.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeTarget {
    pub node: String,
    /// Why, as a sentence ("carries the validation gate gpufabric.io/validation").
    pub reason: String,
    /// Targeted runs started for it so far that did not measure it.
    #[serde(default)]
    pub attempts: u32,
    /// No targeted run starts for it before this time (backoff after a run that did not
    /// measure it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_attempt: Option<Time>,
}

/// `nodes[].quarantined` and `nodes[].repeatOffender` as an earlier version wrote them. They
/// stay in the schema so that the API server keeps them on an object written then (it prunes
/// fields the schema does not name); the operator writes neither.
#[derive(Deserialize, Clone, Debug, PartialEq, Eq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EarlierFlags {
    /// Written by an earlier version: quarantined by this test. Read into `standing`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) quarantined: Option<bool>,
    /// Written by an earlier version: a repeat offender. Read into `standing`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) repeat_offender: Option<bool>,
}

impl Serialize for EarlierFlags {
    /// Nothing: the flags are read, never written (flattened, they add no field).
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        s.serialize_map(Some(0))?.end()
    }
}

#[cfg(test)]
mod tests {
    use super::ConcurrencyPolicy as P;

    #[test]
    fn concurrency_policies_admit_a_due_run_as_cronjobs_do() {
        assert_eq!(P::Forbid.admit(true), None);
        assert_eq!(P::Forbid.admit(false), Some(false));
        assert_eq!(P::Replace.admit(true), Some(true));
        assert_eq!(P::Replace.admit(false), Some(true));
        assert_eq!(P::Allow.admit(true), Some(false));
        assert_eq!(P::Allow.admit(false), Some(false));
    }
}
