//! Where one rank's pod of a rendezvous group stands, from its status alone: waiting (with
//! its IP once it has one), running, or ended with the rank's document, with a reason
//! outside the node, or with a failure.

use crate::results::{self, PodState};
use gpufabric_api::ddp_nodes::DdpNodesResult;
use gpufabric_api::nccl_nodes::NcclNodesResult;
use gpufabric_api::pair::NodePairResult;
use gpufabric_api::result::ParseError;
use k8s_openapi::api::core::v1::Pod;

/// Longest message kept from a pod.
pub const MESSAGE_LIMIT: usize = 300;

/// A document a rank writes as its termination message.
pub trait RankDocument: Sized {
    /// What the document is, for messages ("node-pair document").
    const WHAT: &'static str;
    fn parse(text: &str) -> Result<Self, ParseError>;
}

impl RankDocument for NodePairResult {
    const WHAT: &'static str = "node-pair document";
    fn parse(text: &str) -> Result<Self, ParseError> {
        NodePairResult::parse(text)
    }
}

impl RankDocument for DdpNodesResult {
    const WHAT: &'static str = "ddp-nodes document";
    fn parse(text: &str) -> Result<Self, ParseError> {
        DdpNodesResult::parse(text)
    }
}

impl RankDocument for NcclNodesResult {
    const WHAT: &'static str = "nccl-nodes document";
    fn parse(text: &str) -> Result<Self, ParseError> {
        NcclNodesResult::parse(text)
    }
}

/// How one rank's pod ended.
#[derive(Debug, Clone, PartialEq)]
pub enum RankEnd<D> {
    /// The rank wrote its document.
    Document(Box<D>),
    /// The pod never ran the agent for a reason outside the node (not admitted, an image
    /// that cannot be pulled, evicted), or the agent ended without a document for one
    /// (other work holding the GPUs, a library the image cannot load, a stopped pod).
    NotMeasured(String),
    /// The agent ran and left no usable document, or the pod was stopped at its deadline.
    Failed(String),
}

/// Where one rank's pod stands.
#[derive(Debug, Clone, PartialEq)]
pub enum RankPod<D> {
    Absent,
    /// Created, not running yet (`ip` once the pod has one).
    Waiting {
        ip: Option<String>,
    },
    Running {
        ip: Option<String>,
    },
    Ended(RankEnd<D>),
}

impl<D> RankPod<D> {
    pub fn ip(&self) -> Option<&str> {
        match self {
            RankPod::Waiting { ip } | RankPod::Running { ip } => ip.as_deref(),
            _ => None,
        }
    }
}

/// Why a group stopped at its deadline without a result is not held against its nodes:
/// the first rank still Running on a node that is not Ready (`not_ready(node)` says why,
/// [`crate::nodes::not_ready_because`]). That pod's status is its kubelet's last word, not a
/// hang of the rank. `nodes` by rank, as `pods`.
pub fn lost_rank<D>(
    pods: &[RankPod<D>],
    nodes: &[&str],
    not_ready: &dyn Fn(&str) -> Option<String>,
) -> Option<String> {
    pods.iter().zip(nodes).find_map(|(p, node)| match p {
        RankPod::Running { .. } => not_ready(node).map(|why| {
            format!(
                "{node} stopped reporting while its rank ran ({why}); whether the rank hung is unknown: its kubelet or network, not its fabric, failed to answer"
            )
        }),
        _ => None,
    })
}

/// The outcome of a rendezvous group (a node pair, the multi-node probe), as far as the
/// lost-rank rule needs it.
pub trait GroupOutcome {
    /// The group failed (held against its nodes).
    fn errored(&self) -> bool;
    /// Not measured, for `why`.
    fn not_measured(why: String) -> Self;
}

/// `outcome`, unless it is an error while a rank was still Running on a node that stopped
/// reporting ([`lost_rank`]): then not measured, for that reason. A group stopped without a
/// result is held against its nodes only while their kubelets answer.
pub fn spare_lost<O: GroupOutcome, D>(
    outcome: O,
    pods: &[RankPod<D>],
    nodes: &[&str],
    not_ready: &dyn Fn(&str) -> Option<String>,
) -> O {
    if !outcome.errored() {
        return outcome;
    }
    match lost_rank(pods, nodes, not_ready) {
        Some(why) => O::not_measured(why),
        None => outcome,
    }
}

/// `message` led by the note that rank `rank` on `node` was still Running at the `group`'s
/// deadline while another rank had ended: what the others then say of it ("did not arrive",
/// a timeout) means it was stuck, not that it never came.
pub fn still_running(rank: usize, node: &str, group: &str, message: Option<String>) -> String {
    let note = format!(
        "rank {rank} on {node} was still running at the {group}'s deadline, after another rank had ended"
    );
    cut(&match message {
        Some(m) => format!("{note}; {m}"),
        None => note,
    })
}

/// Where a rank's pod stands, from its status alone.
pub fn rank_pod<D: RankDocument>(pod: &Pod) -> RankPod<D> {
    let status = pod.status.clone().unwrap_or_default();
    let ip = status.pod_ip.clone().filter(|ip| !ip.is_empty());
    if status.reason.as_deref() == Some("DeadlineExceeded") {
        return RankPod::Ended(RankEnd::Failed(
            "stopped at its deadline (activeDeadlineSeconds) before the test finished".into(),
        ));
    }
    let terminated = status
        .container_statuses
        .as_ref()
        .and_then(|cs| cs.iter().find(|c| c.name == crate::pods::CONTAINER))
        .and_then(|c| c.state.as_ref())
        .and_then(|s| s.terminated.clone());
    if let Some(t) = terminated {
        let message = t.message.unwrap_or_default();
        return RankPod::Ended(match D::parse(&message) {
            Ok(doc) => RankEnd::Document(Box::new(doc)),
            // Without a document the exit says who is at fault, as for a node check: a
            // reason outside the node must not end the pair as a failure of its nodes.
            Err(e) => match results::pod_state(pod) {
                PodState::Ended(o) if !o.counts_against_node() => {
                    RankEnd::NotMeasured(cut(o.detail().unwrap_or("not measured")))
                }
                _ => RankEnd::Failed(cut(&format!(
                    "the agent exited with code {} without a {} ({e})",
                    t.exit_code,
                    D::WHAT
                ))),
            },
        });
    }
    match results::pod_state(pod) {
        PodState::Waiting(_) => RankPod::Waiting { ip },
        PodState::Running => RankPod::Running { ip },
        PodState::Ended(o) => {
            let detail = cut(o.detail().unwrap_or("the pod ended"));
            RankPod::Ended(if o.counts_against_node() {
                RankEnd::Failed(detail)
            } else {
                RankEnd::NotMeasured(detail)
            })
        }
    }
}

/// `text` cut to [`MESSAGE_LIMIT`] bytes on a character boundary.
pub fn cut(text: &str) -> String {
    gpufabric_api::text::prefix(text, MESSAGE_LIMIT).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_running_on_a_node_that_stopped_reporting_is_named() {
        let running = || RankPod::<NodePairResult>::Running { ip: None };
        let pods = [running(), running()];
        let lost = |n: &str| (n == "b").then(|| "its Ready condition is Unknown".to_string());
        assert_eq!(
            lost_rank(&pods, &["a", "b"], &lost).as_deref(),
            Some(
                "b stopped reporting while its rank ran (its Ready condition is Unknown); whether the rank hung is unknown: its kubelet or network, not its fabric, failed to answer"
            )
        );
        // Every node Ready: nothing to say, the group's own outcome stands.
        assert_eq!(lost_rank(&pods, &["a", "c"], &lost), None);
        // A rank that ended is not the kubelet's last word.
        let ended = [
            running(),
            RankPod::Ended(RankEnd::Failed("exit 134".into())),
        ];
        assert_eq!(lost_rank(&ended, &["a", "b"], &lost), None);
    }

    #[derive(Debug, PartialEq)]
    enum Outcome {
        Errored,
        Passed,
        NotMeasured(String),
    }

    impl GroupOutcome for Outcome {
        fn errored(&self) -> bool {
            *self == Outcome::Errored
        }
        fn not_measured(why: String) -> Self {
            Outcome::NotMeasured(why)
        }
    }

    #[test]
    fn only_an_error_with_a_rank_on_a_lost_node_is_spared() {
        let running = || RankPod::<NodePairResult>::Running { ip: None };
        let pods = [running(), running()];
        let lost = |n: &str| (n == "b").then(|| "its Ready condition is Unknown".to_string());
        let spared = spare_lost(Outcome::Errored, &pods, &["a", "b"], &lost);
        assert!(
            matches!(&spared, Outcome::NotMeasured(why) if why.starts_with("b stopped reporting")),
            "{spared:?}"
        );
        // Every node Ready: the error stands.
        assert_eq!(
            spare_lost(Outcome::Errored, &pods, &["a", "c"], &lost),
            Outcome::Errored
        );
        // What is not an error is left as it is.
        assert_eq!(
            spare_lost(Outcome::Passed, &pods, &["a", "b"], &lost),
            Outcome::Passed
        );
    }
}
