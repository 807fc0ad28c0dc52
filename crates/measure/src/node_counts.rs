//! What the multi-node tests (the DDP probe, the NCCL sweep) share over a rendezvous group:
//! meeting, agreeing on the GPUs per node, the node counts, and the exchange that measures
//! each count (a fresh communicator id from rank 0, the first `k` ranks measure, every
//! rank's report gathered).

use crate::Progress;
use crate::rendezvous::{self, Config, Group, RendezvousError};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Why this node made no communicator id or did not measure a node count; its text is what
/// the other ranks read.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The group's list has no node at this rank (the sim's fleet).
    #[error("rank {0} has no node")]
    NoNode(u32),
    /// A node count larger than the group's list (the sim's fleet).
    #[error("too few nodes")]
    TooFewNodes,
    /// The id rank 0 handed over is not the text this backend makes.
    #[error("the communicator id is not hex text")]
    IdNotText,
    /// A random id could not be made (the sim's stand-in for NCCL's).
    #[error(transparent)]
    Rendezvous(#[from] RendezvousError),
    /// What the backend's own calls gave: an NCCL call, the worker processes of this
    /// node's GPUs, their reports.
    #[error(transparent)]
    Backend(Box<dyn std::error::Error + Send + Sync>),
}

impl NodeError {
    /// A backend's own error, as it says it.
    pub fn backend(e: impl std::error::Error + Send + Sync + 'static) -> NodeError {
        NodeError::Backend(Box::new(e))
    }
}

/// One rank's report of one node count, as it travels to the others.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(tag = "status", rename_all = "camelCase")]
pub(crate) enum NodeReport<T> {
    Measured(T),
    /// Not in this node count.
    Idle,
    Failed {
        message: String,
    },
}

/// Meets the other ranks of `config` (rank 0 serves); `what` names the test in the progress
/// line and the activity.
pub(crate) fn meet(
    config: &Config,
    what: &str,
    progress: Progress,
) -> Result<Group, RendezvousError> {
    crate::activity::enter(format!("{what}: rendezvous at {}", config.addr));
    progress(&format!(
        "{what} {} (group {}, rank {} of {}): rendezvous at {}",
        config
            .names
            .get(config.rank as usize)
            .map_or("", String::as_str),
        config.group,
        config.rank,
        config.names.len(),
        config.addr
    ));
    if config.rank == 0 {
        rendezvous::random_id().and_then(|id| rendezvous::serve(config, &id))
    } else {
        rendezvous::join(config).map(|(g, _)| g)
    }
}

/// Every rank's GPU count, gathered: `Ok(Ok(g))` when every node has the same `g > 0`,
/// `Ok(Err(why))` naming each node's count otherwise.
pub(crate) fn agree_gpus(
    group: &mut Group,
    names: &[String],
    gpus: u32,
    timeout: Duration,
) -> Result<Result<u32, String>, RendezvousError> {
    let all = group.all_gather(&gpus.to_le_bytes(), timeout)?;
    let per_node: Vec<u32> = all
        .iter()
        .map(|b| b.as_slice().try_into().map(u32::from_le_bytes).unwrap_or(0))
        .collect();
    if per_node.iter().any(|g| *g != gpus || *g == 0) {
        return Ok(Err(format!(
            "the nodes have different GPU counts ({}); the test needs the same on each",
            names
                .iter()
                .zip(&per_node)
                .map(|(n, g)| format!("{n}: {g}"))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(Ok(gpus))
}

/// The node counts over `n` nodes: the ones asked for (clipped to `from..=n`, sorted,
/// without repeats), or `from`, doubling, ... and `n`.
pub(crate) fn node_counts(asked: Option<&[u32]>, from: u32, n: u32) -> Vec<u32> {
    let mut counts: Vec<u32> = match asked {
        Some(a) => a
            .iter()
            .copied()
            .filter(|c| (from..=n).contains(c))
            .collect(),
        None if n < from => Vec::new(),
        None => std::iter::successors(Some(from), |c| c.checked_mul(2))
            .take_while(|c| *c < n)
            .chain(std::iter::once(n))
            .collect(),
    };
    counts.sort_unstable();
    counts.dedup();
    counts
}

/// What the ranks measured together: one entry per node count, every rank's report, until
/// the first count a node failed (that failure is the error).
pub(crate) struct Measured<T> {
    pub(crate) counts: Vec<(u32, Vec<NodeReport<T>>)>,
    pub(crate) error: Option<String>,
}

/// How a rank takes part in each node count.
pub(crate) trait CountStep {
    /// What one node reports of one count.
    type Report: Serialize + DeserializeOwned;
    /// A fresh communicator id (called on rank 0 only, once per node count).
    fn make_id(&mut self) -> Result<Vec<u8>, NodeError>;
    /// This node's part of `nodes` nodes whose communicator id is `id`.
    fn measure(&mut self, nodes: u32, id: &[u8]) -> Result<Self::Report, NodeError>;
}

/// Measures every node count over the group (see the module doc). `names` are the nodes by
/// rank; `wait` bounds each exchange (it must cover the slowest node count's measurement);
/// `what` names the test in the progress lines.
pub(crate) fn measure_counts<S: CountStep + ?Sized>(
    group: &mut Group,
    names: &[String],
    counts: &[u32],
    wait: Duration,
    step: &mut S,
    what: &str,
    progress: Progress,
) -> Result<Measured<S::Report>, RendezvousError> {
    let rank = group.rank();
    let mut out = Measured {
        counts: Vec::new(),
        error: None,
    };
    for &k in counts {
        let made = if rank == 0 {
            step.make_id()
        } else {
            Ok(Vec::new())
        };
        // Rank 0's failure travels as an empty id: every rank stops at the same count.
        let mine = made.as_ref().map(Vec::as_slice).unwrap_or(&[]);
        let ids = group.all_gather(mine, wait)?;
        let id = ids.first().cloned().unwrap_or_default();
        if id.is_empty() {
            out.error = Some(match made {
                Err(e) => format!("{}: no communicator id: {e}", names[0]),
                Ok(_) => format!("{}: no communicator id", names[0]),
            });
            return Ok(out);
        }
        let report = if rank < k {
            crate::activity::enter(format!("{what}: {k} node(s), measuring"));
            progress(&format!("{what}: {k} node(s): measuring"));
            match step.measure(k, &id) {
                Ok(t) => NodeReport::Measured(t),
                Err(e) => NodeReport::Failed {
                    message: e.to_string(),
                },
            }
        } else {
            NodeReport::Idle
        };
        let bytes = serde_json::to_vec(&report)
            .map_err(|e| RendezvousError::Protocol(format!("encoding this node's report: {e}")))?;
        let all = group.all_gather(&bytes, wait)?;
        let reports: Vec<NodeReport<S::Report>> = all
            .iter()
            .map(|b| {
                serde_json::from_slice(b).unwrap_or_else(|e| NodeReport::Failed {
                    message: format!("unreadable report: {e}"),
                })
            })
            .collect();
        let failed = reports
            .iter()
            .enumerate()
            .take(k as usize)
            .find_map(|(r, rep)| match rep {
                NodeReport::Failed { message } => Some(format!("{}: {message}", names[r])),
                NodeReport::Idle => Some(format!("{}: did not measure", names[r])),
                NodeReport::Measured(_) => None,
            });
        out.counts.push((k, reports));
        if let Some(e) = failed {
            out.error = Some(format!("{k} node(s): {e}"));
            return Ok(out);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_counts_double_up_to_all_nodes() {
        assert_eq!(node_counts(None, 1, 1), [1]);
        assert_eq!(node_counts(None, 1, 4), [1, 2, 4]);
        assert_eq!(node_counts(None, 1, 6), [1, 2, 4, 6]);
        assert_eq!(node_counts(Some(&[4, 1, 9, 0, 1]), 1, 6), [1, 4]);
        assert_eq!(node_counts(None, 2, 3), [2, 3]);
        assert_eq!(node_counts(None, 2, 8), [2, 4, 8]);
        assert!(node_counts(None, 2, 1).is_empty());
        assert_eq!(node_counts(Some(&[1, 2]), 2, 4), [2]);
    }
}
