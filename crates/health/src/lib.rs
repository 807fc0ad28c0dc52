//! Pure functions: result documents + policy -> findings, per-node verdicts, node history
//! and quarantine plans. No I/O, no Kubernetes client, no async.
//!
//! # Expectations
//! Each metric of a node is judged against, in order, the first that applies:
//! 1. an explicit threshold in the spec (`Thresholds`); when set, it alone judges its metric;
//! 2. the built-in profile of the GPU product and GPU count ([`profiles`]): floors at a
//!    conservative fraction of the datasheet's nominal bandwidth;
//! 3. the fleet ([`fleet`]): a robust outlier against the median of the nodes of the same
//!    product and GPU count in this run — robust z-score `0.6745 (x - median) / MAD` beyond
//!    `fleetOutlierScore` *and* at least `fleetMinRelativeGap` from the median, in the worse
//!    direction only, with at least `fleetMinNodes` comparable nodes.
//!
//! # Findings
//! - A crash, a timeout and an unusable result are findings of their own kinds (Crash,
//!   Timeout, Errored), never Slow; so are hardware faults (NVLink links down or erroring,
//!   XID, uncorrectable ECC, row remap, degraded PCIe), wrong results, NCCL falling back
//!   from NVLink, and a GPU count below what the node advertises.
//! - Severity of hardware findings: NVLink links down, XID, uncorrectable ECC, row remap
//!   (failed or pending), PCIe width below maximum, NCCL falling back from NVLink where both
//!   GPUs have NVLink, and wrong results are Critical. NVLink error counters are Info: NVML
//!   counts them since the driver loaded, so a count says nothing about this run. A PCIe
//!   generation below maximum is Critical only when the GPU's host copies are below half of
//!   what its maximum link carries (NVML reports the current generation, which an idle GPU
//!   lowers); else Info.
//! - Slowness a hardware finding explains is not reported again as Slow: the pairs of a GPU
//!   with NVLink down or falling back, a pair that fell back, the host bandwidth of a GPU
//!   with a degraded PCIe link.
//! - Phase errors: a watchdog timeout is a Timeout finding, a failure an Errored finding
//!   (both Critical); a phase that could not run here is an Errored Info finding.
//! - GPU pairs: a pair well below the node's other pairs (same outlier rule as the fleet,
//!   against the median of the node's pairs, at least 3 pairs), or else below the profile
//!   floor, is Slow; when the spec sets a pair threshold, that threshold alone judges. The smallest subject at fault is named: every pair of one GPU slow blames the
//!   GPU, every pair of the node slow blames the node, else each pair.
//! - Stragglers: a GPU whose DDP compute time exceeds `stragglerRatio` x the node's median.
//! - A node with a critical finding on a GPU or GPU pair gets no node-wide Slow finding on
//!   collectives or DDP from the profile or the fleet (an explicit threshold still
//!   reports): its slow collectives are explained by the part already named.
//! - Throttle reasons are Info (they never fail a node); temperature fails a node only
//!   above an explicit ceiling.
//! - Findings are sorted by node, subject, metric.
//!
//! # Verdicts
//! Errored for a crash or an unusable result, Timeout for a timed-out node, Failed for a
//! measured node with any Critical finding, else Passed.
//!
//! # History and quarantine
//! [`history::advance`] counts consecutive failing and passing runs; [`quarantine::plan`]
//! turns them, the ownership facts of each node and the policy into a plan (see its docs).

pub mod evaluate;
pub mod fleet;
pub mod history;
pub mod profiles;
pub mod quarantine;

pub use evaluate::{Evaluation, NodeInput, NodeOutcome, evaluate};
pub use quarantine::{Hold, NodeFacts, Plan, plan};
