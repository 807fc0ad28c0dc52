//! What a benchmark pod says about its node: where the pod stands and, once it has ended,
//! the node's [`NodeOutcome`] (measured, a hardware fault, or not measured and why), and
//! the compact entry the run status keeps. Never panics on what a pod holds.

mod bounded;
mod classify;
#[cfg(test)]
mod round_trip_tests;
pub mod store;
#[cfg(test)]
mod tests;

pub use classify::pod_state;
use gpufabric_api::outcome::{HardwareFault, NodeOutcome, NotMeasuredReason};
use gpufabric_api::run::{NodeRunResult, NodeVerdict};

/// Prefix of the agent's progress lines on stderr (and so in the pod log).
pub const LOG_PROGRESS_PREFIX: &str = "[fabric-agent] ";

/// The agent's last progress line in (the tail of) a pod log, cut to 200 characters.
pub fn last_progress_in_log(log: &str) -> Option<String> {
    let line = log
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix(LOG_PROGRESS_PREFIX))?
        .trim();
    let cut: String = line.chars().take(200).collect();
    (!cut.is_empty()).then_some(cut)
}

/// Why the kubelet holds a pod back, when it says (a waiting reason, an unbound pod).
#[derive(Debug, Clone, PartialEq)]
pub struct Blocker {
    pub reason: NotMeasuredReason,
    pub detail: String,
}

/// Where one node's benchmark pod stands.
#[derive(Debug, Clone, PartialEq)]
pub enum PodState {
    /// Created, no container running yet; with what holds it back, when the kubelet says.
    Waiting(Option<Blocker>),
    /// The agent is running.
    Running,
    /// Nothing more will come from the pod.
    Ended(NodeOutcome),
}

impl PodState {
    /// The pod has ended: nothing more will come from it.
    pub fn is_final(&self) -> bool {
        matches!(self, PodState::Ended(_))
    }

    /// The outcome once the run's deadline has passed and the pod is stopped: an agent that
    /// had started hung; a pod that never started was not measured, with the kubelet's
    /// reason when it gave one.
    /// `phase` is the agent's last progress line, read from the pod's log before it was
    /// stopped (None: the log had none or could not be read).
    pub fn at_run_deadline(self, seconds: u64, phase: Option<&str>) -> NodeOutcome {
        match self {
            PodState::Ended(o) => o,
            PodState::Running => NodeOutcome::hardware(
                HardwareFault::Hang,
                match phase {
                    Some(p) => format!(
                        "the agent had started and was still running when the run deadline ({seconds}s) passed, in phase \"{p}\" (its last progress line in the pod log)"
                    ),
                    None => format!(
                        "the agent had started and was still running when the run deadline ({seconds}s) passed (phase unknown: the pod log had no progress line or could not be read)"
                    ),
                },
            ),
            PodState::Waiting(Some(b)) => NodeOutcome::not_measured(
                b.reason,
                format!(
                    "{}; the pod never started before the run deadline ({seconds}s)",
                    b.detail
                ),
            ),
            PodState::Waiting(None) => never_started(&format!("the run deadline ({seconds}s)")),
        }
    }

    /// The node's verdict before the fleet is judged: measured nodes stay `Running` until
    /// the run's evaluation gives them Passed or Failed.
    pub fn provisional_verdict(&self) -> NodeVerdict {
        match self {
            PodState::Waiting(_) => NodeVerdict::Pending,
            PodState::Running => NodeVerdict::Running,
            PodState::Ended(o) => NodeVerdict::provisional(o),
        }
    }
}

/// A pod still Running at the run deadline (`seconds`) on a node that is not Ready (`why`,
/// [`crate::nodes::not_ready_because`]): its kubelet stopped reporting, so whether the agent
/// hung, finished or died is unknown. Not measured, never a hang held against the GPUs.
pub fn node_not_ready(seconds: u64, why: &str) -> NodeOutcome {
    NodeOutcome::not_measured(
        NotMeasuredReason::NodeNotReady,
        format!(
            "the node stopped reporting while the agent ran ({why}), and its pod still read Running when the run deadline ({seconds}s) passed; what the agent did is unknown, and its kubelet or network, not its GPUs, failed to answer"
        ),
    )
}

/// A pod that stayed Pending, with no container ever running, until `deadline`.
pub fn never_started(deadline: &str) -> NodeOutcome {
    NodeOutcome::not_measured(
        NotMeasuredReason::NeverStarted,
        format!("the pod stayed Pending until {deadline}; no container ever ran"),
    )
}

/// The outcome of a pod that was created but is no longer there.
pub fn pod_gone() -> NodeOutcome {
    NodeOutcome::not_measured(
        NotMeasuredReason::PodDeleted,
        "the benchmark pod was deleted before it finished",
    )
}

/// The outcome of a node whose pod was created and is gone, with no outcome kept in the
/// status; `last` is the node's verdict as last written there. Before its wave's deadline the
/// pod was deleted. After it, a pod last seen Pending never started; one last seen Running
/// (or measured and judged) had started, and was stopped at the deadline (whose status write
/// then failed) or deleted: what it was doing then is not known, so not measured, not a hang
/// and not "never started".
pub fn gone_pod(last: NodeVerdict, past_deadline: bool, run_seconds: u64) -> NodeOutcome {
    match (past_deadline, last) {
        (false, _) => pod_gone(),
        (true, NodeVerdict::Running | NodeVerdict::Passed | NodeVerdict::Failed) => {
            NodeOutcome::not_measured(
                NotMeasuredReason::PodDeleted,
                format!(
                    "the agent had started, and its pod was gone after the run deadline ({run_seconds}s): it was stopped at the deadline or deleted, and what it was doing then was not recorded"
                ),
            )
        }
        (true, _) => never_started(&format!("the run deadline ({run_seconds}s)")),
    }
}

/// The compact per-node summary the run status keeps ([`NodeRunResult::record`] of an
/// ended pod's outcome; [`NodeRunResult::outcome`] gives it back).
pub fn node_result(node: &str, pod: Option<&str>, state: &PodState) -> NodeRunResult {
    let mut r = NodeRunResult {
        node: node.to_string(),
        verdict: state.provisional_verdict(),
        pod: pod.map(str::to_string),
        ..Default::default()
    };
    if let PodState::Ended(o) = state {
        r.record(o);
    }
    r
}
