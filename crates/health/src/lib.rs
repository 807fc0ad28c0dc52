//! Pure functions: result documents + policy -> findings, per-node verdicts, node history
//! and quarantine plans. No I/O, no Kubernetes client, no async.
//!
//! # Expectations
//! Each metric of a node is judged against, in order, the first that applies:
//! 1. an explicit threshold in the spec (`Thresholds`); when set, it alone judges its metric;
//! 2. the built-in profile of the GPU product and GPU count ([`profiles`]): floors at 50% of
//!    the datasheet's nominal bandwidth, bandwidth floors only on the 8-GPU NVSwitch boards;
//! 3. the fleet ([`fleet`]): a robust outlier against the median of the nodes of the same
//!    product (normalized: `NVIDIA-H100-80GB-HBM3` = `NVIDIA H100 80GB HBM3`) and GPU count
//!    in this run: robust z-score `0.6745 (x - median) / MAD` beyond `fleetOutlierScore`
//!    *and* at least `fleetMinRelativeGap` from the median, in the worse direction only,
//!    with at least `fleetMinNodes` comparable nodes. Compared: each collective's peak
//!    busbw and latency, the node's median pair bandwidth (one-way and bidirectional), each
//!    GPU's host bandwidth against the same GPU index of the other nodes, DDP scaling
//!    efficiency and median DDP compute time.
//!
//! # Findings
//! Each finding names the smallest subject at fault (GPU, GPU pair, node), the metric, the
//! measured and expected values, the deviation `(measured - expected) / expected`, the unit,
//! where the expectation came from, a severity (Critical fails the node, Info never does)
//! and one sentence a person can act on. They are sorted by node, subject, metric.
//!
//! - **Outcomes** ([`NodeOutcome`]): a hardware fault the agent saw instead of a result (a
//!   GPU missing or unusable, a crash, a hang past the deadline) is a Critical finding of its
//!   own kind (Crash, Timeout), never Slow. A node not measured for an infrastructure reason
//!   (pod not admitted, image pull, container config, eviction, agent bug...) gets no
//!   finding and the verdict NotMeasured. A result that claims no GPUs or more than
//!   [`evaluate::MAX_GPUS_PER_NODE`] is an agent bug: NotMeasured, with an Info finding.
//! - **Phase errors**: a watchdog timeout is a Timeout finding, a failure an Errored
//!   finding (both Critical); a phase that could not run here is an Errored Info finding.
//! - **Hardware** (per GPU, fixed rules): NVLink links down, XID, uncorrectable ECC, row
//!   remap failed or pending, PCIe width below maximum, and wrong results (NCCL wrong
//!   elements, corrupt copies) are Critical. NCCL falling back from NVLink is Critical where
//!   both GPUs have NVLink (blamed on a GPU when all its pairs fell back). NVLink error
//!   counters are Info: NVML counts them since the driver loaded, and healthy H200s show
//!   thousands that grow under load (tests/data). A PCIe generation below maximum is
//!   Critical only when the GPU's host copies are below half of what its maximum link
//!   carries (NVML reports the current generation, which an idle GPU lowers); else Info.
//!   Throttle reasons are Info; temperature fails a node only above an explicit ceiling.
//! - **GPU count**: fewer GPUs than the node advertises (`nvidia.com/gpu.count` or its
//!   capacity) is a Critical GpuMismatch; without a count, a count that is no board size of
//!   the product is Info, as is a product label that disagrees with the GPUs.
//! - **GPU pairs**: on a board whose pairs are all alike (a known product on one of its
//!   board sizes: NVSwitch or all-to-all NVLink), a pair well below the node's other pairs
//!   (the fleet's outlier rule against the median of the node's pairs, at least 3 pairs),
//!   or below the node's fastest pair by more than the rule's minimum gap plus its score
//!   in robust standard deviations (so that two GPUs slow to everyone, which makes most
//!   pairs and the median slow, are still found), or else below the profile floor, is Slow. Elsewhere (PCIe across CPU sockets, NVLink
//!   bridges, unknown products) pairs differ by design, so each pair is compared with the
//!   same pair of the comparable nodes instead. When the spec sets a pair threshold, that
//!   threshold alone judges. A pair's one-way value is its slower direction. The smallest
//!   subject is blamed: every pair of one GPU slow blames the GPU, every pair of the node
//!   slow blames the node, else each pair. Bidirectional pairs are judged the same way,
//!   for pairs not already named.
//! - **Stragglers**: a GPU whose DDP compute time exceeds `stragglerRatio` x the node's
//!   median is a Straggler finding on that GPU.
//! - **Explained slowness is not repeated**: the pairs of a GPU with NVLink down or falling
//!   back, a pair that fell back, and the host bandwidth of a GPU with a degraded PCIe link
//!   are not also Slow; a node with a Critical finding on a GPU or link of its NVLink path
//!   gets no node-wide Slow finding on collectives from the profile or the fleet, and one
//!   with any Critical GPU finding (a straggler too) none on DDP (an explicit threshold
//!   still reports); a metric a profile floor already failed is not reported again by the
//!   fleet.
//!
//! # Verdicts
//! Errored for a hardware fault without a result, Timeout for an agent that hung, Failed for
//! a measured node with any Critical finding, Passed otherwise; NotMeasured for a node the
//! infrastructure kept from being measured, which never counts against it.
//!
//! # History and quarantine
//! [`history::advance`] counts consecutive failing and passing runs; [`quarantine::plan`]
//! turns them, the ownership facts of each node and the policy into a plan (see its docs).

pub mod evaluate;
pub mod fleet;
pub mod history;
pub mod nics;
pub mod pairs;
pub mod profiles;
pub mod quarantine;

pub use evaluate::{Evaluation, NodeInput, NodeOutcome, evaluate};
pub use quarantine::{ClusterCap, Guards, Hold, NodeFacts, Plan, Storm, plan, plan_guarded};
