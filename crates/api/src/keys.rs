//! Label, annotation, taint, finalizer and environment-variable names: the contract between
//! the operator, the benchmark pods and the nodes.

/// Field manager of every server-side apply the operator makes.
pub const MANAGER: &str = "fabric-operator";

/// Label on runs and pods: the name of the FabricTest they belong to.
pub const LABEL_TEST: &str = "gpufabric.io/test";
/// Label on pods: the name of the FabricTestRun they belong to.
pub const LABEL_RUN: &str = "gpufabric.io/run";
/// Label on pods: the node the pod measures.
pub const LABEL_NODE: &str = "gpufabric.io/node";
/// Label on pods: what the pod does (`node-check`, `node-pair`, `multi-node`).
pub const LABEL_ROLE: &str = "gpufabric.io/role";
/// Annotation on a confirmation run: the run whose suspects it retests.
pub const ANNOTATION_CONFIRMS: &str = "gpufabric.io/confirms";
/// Label on runs: why the run exists (`schedule`, `manual`, `confirmation`, `creation`).
pub const LABEL_TRIGGER: &str = "gpufabric.io/trigger";

/// Annotation on a FabricTest: when present, the operator starts a run now and removes it.
pub const ANNOTATION_RUN_NOW: &str = "gpufabric.io/run-now";
/// Annotation on a FabricTest: when present (any value), the operator closes the test's
/// breaker (condition `BreakerOpen`), records the reset in the condition, and removes it.
pub const ANNOTATION_RESET_BREAKER: &str = "gpufabric.io/reset-breaker";
/// Annotation on a Node: JSON record of what this operator did to the node (who, why,
/// which run, when, and which of cordon/taint/label it applied). Its presence is the only
/// proof of ownership: the operator never undoes a change this record does not name.
pub const ANNOTATION_QUARANTINE: &str = "gpufabric.io/quarantine";
/// Annotation on a Node: the error counters (NVLink per GPU) of the node's latest measured
/// run, JSON ([`crate::counters::CounterBaseline`]); the next run judges their growth. Any
/// FabricTest's run updates it: the counters belong to the hardware, not to a test.
pub const ANNOTATION_COUNTERS: &str = "gpufabric.io/counters";
/// Annotation on a Node: the error counters (symbol, receive and link-downed errors per
/// InfiniBand/RoCE port) of the node's latest node-pair test, JSON
/// ([`crate::nic_counters::NicCounters`]); the next pair test judges their growth. Apart from
/// [`ANNOTATION_COUNTERS`], which the node check writes at another time. Any FabricTest's
/// run updates it: the counters belong to the hardware, not to a test.
pub const ANNOTATION_NIC_COUNTERS: &str = "gpufabric.io/nic-counters";
/// Annotation on a Node: the key numbers of its last runs per FabricTest, JSON
/// ([`crate::trend::NodeTrend`]); each run judges the node's drift against them.
pub const ANNOTATION_TREND: &str = "gpufabric.io/trend";

/// Annotation on a Node: each FabricTest's standing of the node, its run and why, JSON
/// ([`crate::standings::NodeStandings`]). The `GPUFabricDegraded` condition and the
/// `gpufabric.io/result` label read the worst of them; a test's deletion removes its entry.
pub const ANNOTATION_STANDING: &str = "gpufabric.io/standing";

/// Label the operator sets on a node in `Label` (and stronger) quarantine modes.
pub const LABEL_QUARANTINED: &str = "gpufabric.io/quarantined";
/// Taint key the operator adds in `Taint` mode (effect NoSchedule). Benchmark pods
/// tolerate it so a quarantined node can still be retested and released.
pub const TAINT_QUARANTINED: &str = "gpufabric.io/quarantined";

/// Taint key of the validation gate (effect NoSchedule): a node that carries it takes no
/// work until gpufabric has tested it. Whoever provisions a node may register it with the
/// taint (kubelet `--register-with-taints`); a FabricTest with `nodeLifecycle.gateNewNodes`
/// adds it to the nodes it selects that join after it. Every FabricTest that selects a gated
/// node tests it at once; a run that measures it passing removes the taint; a failure keeps
/// it. Benchmark pods tolerate it.
pub const TAINT_VALIDATION: &str = "gpufabric.io/validation";
/// Annotation on a Node: gpufabric added the validation gate ([`TAINT_VALIDATION`]) to it
/// once, when it joined; the value names the FabricTest. A node that carries it is never
/// gated again, so that a person who opens the gate by hand is not overruled.
pub const ANNOTATION_GATED: &str = "gpufabric.io/gated";
/// Annotation on a Node, set by a person (any value, e.g. a ticket): the node is back from
/// repair. Every FabricTest that selects it tests it at once; a pass releases the test's
/// quarantine of it at once (the repair stands for the confirmation), a failure keeps it
/// quarantined. The operator removes the annotation once a run has measured the node.
pub const ANNOTATION_REPAIRED: &str = "gpufabric.io/repaired";
/// Annotation on a FabricTest: the nodes to test now, comma-separated. The operator starts
/// a targeted run over them (those the test selects) and removes the annotation.
pub const ANNOTATION_RUN_NODES: &str = "gpufabric.io/run-nodes";
/// Annotation on a FabricTest: a label selector (`key=value,key2=value2`) of nodes to test
/// now, within the test's own selection. The operator starts a targeted run over them and
/// removes the annotation.
pub const ANNOTATION_RUN_SELECTOR: &str = "gpufabric.io/run-selector";

/// Key of a full result document in the ConfigMap the operator keeps it in, stored as it is
/// (`data`).
pub const RESULT_KEY: &str = "result.json";
/// Key of a full result document kept gzipped (`binaryData`), when it is too large as it is.
pub const RESULT_KEY_GZIP: &str = "result.json.gz";
/// Annotation on the ConfigMap keeping a node's full result: the node's full name (the
/// [`LABEL_NODE`] label's value may be shortened). The same key as that label.
pub const ANNOTATION_RESULT_NODE: &str = LABEL_NODE;

/// Finalizer on a FabricTest: release what this test quarantined before it goes.
pub const FINALIZER: &str = "gpufabric.io/release-quarantine";

/// Node label with the GPU product (set by NVIDIA's GPU feature discovery).
pub const LABEL_GPU_PRODUCT: &str = "nvidia.com/gpu.product";
/// Node label with the GPU count (set by NVIDIA's GPU feature discovery).
pub const LABEL_GPU_COUNT: &str = "nvidia.com/gpu.count";
/// Extended resource name of NVIDIA GPUs.
pub const RESOURCE_GPU: &str = "nvidia.com/gpu";

/// Agent env: the node the pod runs on (downward API `spec.nodeName`).
pub const ENV_NODE_NAME: &str = "FABRIC_NODE_NAME";
/// Agent env: the suite to run, as JSON (the run's frozen copy). The only channel of the
/// suite from the operator to the agent; command-line flags are for people.
pub const ENV_SUITE: &str = "FABRIC_SUITE";
/// Agent env: the run the pod belongs to.
pub const ENV_RUN: &str = "FABRIC_RUN";
/// Agent env: where to write the compact result (default `/dev/termination-log`).
pub const ENV_TERMINATION_LOG: &str = "FABRIC_TERMINATION_LOG";
/// Agent env: `ip:port` of the rank-0 pod of a multi-node group.
pub const ENV_RENDEZVOUS: &str = "FABRIC_RENDEZVOUS";
/// Agent env (node-pair pods): the run's rendezvous secret, hex.
pub const ENV_RENDEZVOUS_SECRET: &str = "FABRIC_RENDEZVOUS_SECRET";
/// Agent env (node-pair pods): the rendezvous group, the same for both pods of a pair.
pub const ENV_GROUP: &str = "FABRIC_GROUP";
/// Agent env (node-pair pods): the pod's rank in its group (0 serves the rendezvous).
pub const ENV_RANK: &str = "FABRIC_RANK";
/// Agent env (node-pair pods): the nodes of the pair by rank, comma-separated.
pub const ENV_PAIR_NODES: &str = "FABRIC_PAIR_NODES";
/// Agent env: path of the simulated fleet description (sim backend only).
pub const ENV_SIM_FLEET: &str = "FABRIC_SIM_FLEET";
/// The sim backend's fleet description itself, rather than a file: how a benchmark pod in a
/// container gets one (a FabricTest's `spec.agent.env`, `valueFrom` a ConfigMap key).
pub const ENV_SIM_FLEET_DOC: &str = "FABRIC_SIM_FLEET_DOC";
/// Agent env: backend override (`cuda` or `sim`).
pub const ENV_BACKEND: &str = "FABRIC_BACKEND";
/// Env var: how long the sim backend's work lasts (`h200`, `none`, or a document): see
/// `fabric-agent node-check --help`.
pub const ENV_SIM_PACE: &str = "FABRIC_SIM_PACE";
/// Agent env: the names of the NCCL variables the FabricTest's `spec.agent.env` sets,
/// comma-separated. Only those are the test's own settings; any other NCCL tuning setting in
/// effect (a pod env the spec did not set, NCCL's config files) is reported with its source
/// and judged as a setting nobody chose.
pub const ENV_SPEC_ENV: &str = "FABRIC_SPEC_ENV";
/// Agent env: format of the agent's log on stderr (`text` or `json`).
pub const ENV_LOG_FORMAT: &str = "FABRIC_LOG_FORMAT";

/// Default path of the termination message.
pub const DEFAULT_TERMINATION_LOG: &str = "/dev/termination-log";
/// Start of a termination message that is a progress line, not a result: the agent keeps
/// its latest progress line (`ncclSweep: allReduce 64 MiB`, ...) there until it writes its
/// result, so that an agent killed at its deadline still says which phase it was in.
pub const PROGRESS_PREFIX: &str = "fabric-agent progress: ";
/// Kubernetes' limit on a termination message, in bytes.
pub const TERMINATION_MESSAGE_LIMIT: usize = 4096;

/// Node condition type the operator writes on every node a run measured, `True` when there
/// is a problem, as node-problem-detector's conditions are: `True` (a confirmed failure or
/// hardware fault), `False` (passed), `Unknown` (a first failure awaiting confirmation, or
/// never measured). Read by medik8s NodeHealthCheck and draino (both act on a listed
/// condition that is `True`), and alerting.
pub const CONDITION_NODE_DEGRADED: &str = "GPUFabricDegraded";
/// The node condition gpufabric 0.2.0 wrote instead, of the opposite polarity (`True`:
/// passed). The operator replaces the ones gpufabric wrote with [`CONDITION_NODE_DEGRADED`]
/// and removes them with the FabricTest that wrote them; it never writes one.
pub const CONDITION_NODE_HEALTHY_LEGACY: &str = "GPUFabricHealthy";
/// Label on every node a run measured: `pass`, `suspect` (failed, not yet confirmed) or
/// `fail` (failure confirmed). A node no test measured carries none.
pub const LABEL_RESULT: &str = "gpufabric.io/result";
/// Annotation on a node: when it last passed a run (RFC 3339).
pub const ANNOTATION_LAST_PASS: &str = "gpufabric.io/last-pass";
/// Taint key (effect PreferNoSchedule) on a suspect node, with `graduatedTaints`.
pub const TAINT_SUSPECT: &str = "gpufabric.io/suspect";
/// Annotation on a node: the FabricTest (`<namespace>/<name>`) that added the suspect
/// taint. Its presence is the only proof of ownership: without it the taint is someone
/// else's and is never removed.
pub const ANNOTATION_SUSPECT_TAINT: &str = "gpufabric.io/suspect-taint";
/// The key of the DRA device taint gpufabric puts on a GPU found at fault (its value names
/// the fault: `straggler`, `wrong-results`, `slow`, `nvlink`).
pub const TAINT_GPU: &str = "gpufabric.io/gpu";
/// Annotation on a DeviceTaintRule gpufabric made: its record (JSON: the FabricTest's UID,
/// node, GPU, run and reason). A rule without it, or whose record and controller owner do
/// not both name the test's UID, is someone else's and is never changed or deleted.
pub const ANNOTATION_DEVICE_QUARANTINE: &str = "gpufabric.io/device-quarantine";
/// Label on a DeviceTaintRule gpufabric made: the UID of the FabricTest that made it (how
/// its rules are listed; ownership is then checked on the rule's owner and record).
pub const LABEL_TEST_UID: &str = "gpufabric.io/test-uid";
