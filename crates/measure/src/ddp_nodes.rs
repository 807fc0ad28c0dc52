//! The multi-node DDP probe, backend-neutral: the ranks (one per node) of a rendezvous group
//! measure each node count in turn, the first `k` nodes together, and gather every node's
//! times so that each rank writes the same points.
//!
//! For each node count `k`: rank 0 makes a fresh communicator id and hands it to every rank
//! (an all-gather over the rendezvous connections); ranks `0..k` measure the step over their
//! GPUs as global ranks `rank x G ..`, of `k x G`; ranks `k..` wait; then every rank's report
//! is gathered. The point's step is the slowest node's; the efficiency is throughput per GPU
//! against the one-node point; a node whose compute alone is slower than the fastest node's
//! by more than the threshold is a straggler.

use crate::model::{self, PointTimes};
use crate::rendezvous::{Group, RendezvousError};
use crate::{CheckError, Progress};
use gpufabric_api::ddp_nodes::{DdpNodesPoint, DdpStraggler};
use gpufabric_api::result::{Backend, DdpPoint, PhaseError};
use gpufabric_api::suite::DdpProbe;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// What one node measured at one node count, over its own GPUs: the slowest of its GPUs,
/// and each GPU's compute.
pub type NodeTimes = PointTimes;

/// One rank's report of one node count, as it travels to the others.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(tag = "status", rename_all = "camelCase")]
pub enum NodeReport {
    Measured(NodeTimes),
    /// Not in this node count.
    Idle,
    Failed {
        message: String,
    },
}

/// How one backend does its node's part of the probe: ready before the ranks meet, each
/// node count's measurement, and the looks at the GPUs around them.
pub trait NodeMeasure {
    /// The backend the document names.
    fn kind(&self) -> Backend;
    /// Before the ranks meet: the backend can measure here, and other work holds none of the
    /// GPUs (unless `shared`); an error ends this rank alone. Returns this node's GPU count.
    fn prepare(&mut self, shared: bool, progress: Progress) -> Result<u32, CheckError>;
    /// Once met, before measuring: the timeout of a probe that hangs before any node count
    /// (the sim's `hang` fault in phase `ddpProbe`, after `timeout`, or never with `stuck`);
    /// None to measure.
    fn hang(&self, timeout: Duration, progress: Progress) -> Option<PhaseError>;
    /// A fresh communicator id (called on rank 0 only, once per node count).
    fn make_id(&mut self) -> Result<Vec<u8>, String>;
    /// This node's GPUs as ranks `rank x G ..` of a clique of `nodes x G` ranks whose id is
    /// `id`.
    fn measure(&mut self, nodes: u32, id: &[u8]) -> Result<NodeTimes, String>;
    /// Once the measurements ended, with no context of this rank's left:
    /// [`CheckError::GpusInUse`] when other work holds the GPUs now, which started while
    /// they were measured ([`crate::gpu_use::refuse_at_end`]).
    fn end_look(&mut self) -> Result<(), CheckError>;
}

/// The node counts of the probe over `n` nodes: the ones asked for (clipped to `1..=n`,
/// sorted, without repeats), or 1, 2, 4, ... and `n`.
pub fn node_counts(asked: Option<&[u32]>, n: u32) -> Vec<u32> {
    let mut counts: Vec<u32> = match asked {
        Some(a) => a.iter().copied().filter(|c| (1..=n).contains(c)).collect(),
        None => std::iter::successors(Some(1u32), |c| c.checked_mul(2))
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
pub struct Measured {
    pub counts: Vec<(u32, Vec<NodeReport>)>,
    pub error: Option<String>,
}

/// Measures every node count over the group (see the module doc). `names` are the nodes by
/// rank; `wait` bounds each exchange (it must cover the slowest node count's measurement).
pub fn measure_counts(
    group: &mut Group,
    names: &[String],
    counts: &[u32],
    wait: Duration,
    m: &mut dyn NodeMeasure,
    progress: &dyn Fn(&str),
) -> Result<Measured, RendezvousError> {
    let rank = group.rank();
    let mut out = Measured {
        counts: Vec::new(),
        error: None,
    };
    for &k in counts {
        let made = if rank == 0 {
            m.make_id()
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
            progress(&format!("ddp-nodes: {k} node(s): measuring"));
            match m.measure(k, &id) {
                Ok(t) => NodeReport::Measured(t),
                Err(message) => NodeReport::Failed { message },
            }
        } else {
            NodeReport::Idle
        };
        let bytes = serde_json::to_vec(&report)
            .map_err(|e| RendezvousError::Protocol(format!("encoding this node's report: {e}")))?;
        let all = group.all_gather(&bytes, wait)?;
        let reports: Vec<NodeReport> = all
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

/// The point of `k` nodes from their reports (the first `k`, all measured), scaled against
/// `base` (the first point). None when a report is missing.
pub fn point(
    shape: &DdpProbe,
    k: u32,
    reports: &[NodeReport],
    gpus_per_node: u32,
    base: Option<&DdpPoint>,
) -> Option<DdpNodesPoint> {
    let mut nodes = Vec::new();
    for r in reports.iter().take(k as usize) {
        let NodeReport::Measured(n) = r else {
            return None;
        };
        nodes.push(n.clone());
    }
    if nodes.len() != k as usize {
        return None;
    }
    let node_compute_ms: Vec<f64> = nodes.iter().map(|n| n.compute_alone_ms).collect();
    let t = PointTimes::together(nodes);
    let flops = model::step_flops(
        u64::from(shape.hidden),
        u64::from(shape.layers),
        u64::from(shape.batch_per_gpu),
    );
    let ranks = (0..k * gpus_per_node).collect();
    let point = model::ddp_point(&t, u64::from(shape.batch_per_gpu), flops, base, ranks);
    Some(DdpNodesPoint {
        nodes: k,
        point,
        compute_alone_ms: t.compute_alone_ms,
        comm_alone_ms: t.comm_alone_ms,
        exposed_comm_ms: (t.step_ms - t.compute_alone_ms).max(0.0),
        node_compute_ms,
    })
}

/// The nodes of `point` whose compute alone is more than `percent` slower than the
/// fastest node's.
pub fn stragglers(names: &[String], point: &DdpNodesPoint, percent: f64) -> Vec<DdpStraggler> {
    let fastest = point
        .node_compute_ms
        .iter()
        .copied()
        .filter(|c| *c > 0.0)
        .fold(f64::INFINITY, f64::min);
    if !fastest.is_finite() {
        return Vec::new();
    }
    point
        .node_compute_ms
        .iter()
        .zip(names)
        .filter_map(|(&c, name)| {
            let slower = (c / fastest - 1.0) * 100.0;
            (slower > percent).then(|| DdpStraggler {
                node: name.clone(),
                compute_ms: c,
                fastest_ms: fastest,
                slower_percent: (slower * 10.0).round() / 10.0,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn times(step: f64, compute: f64, comm: f64, gpus: usize) -> NodeReport {
        NodeReport::Measured(NodeTimes {
            step_ms: step,
            compute_ms: vec![compute; gpus],
            compute_alone_ms: compute,
            comm_alone_ms: comm,
        })
    }

    #[test]
    fn node_counts_double_up_to_all_nodes() {
        assert_eq!(node_counts(None, 1), [1]);
        assert_eq!(node_counts(None, 4), [1, 2, 4]);
        assert_eq!(node_counts(None, 6), [1, 2, 4, 6]);
        assert_eq!(node_counts(Some(&[4, 1, 9, 0, 1]), 6), [1, 4]);
    }

    #[test]
    fn a_point_takes_the_slowest_node_and_scales_against_one_node() {
        let shape = DdpProbe::default();
        let one = point(&shape, 1, &[times(100.0, 95.0, 10.0, 2)], 2, None).expect("point");
        assert!((one.point.scaling_efficiency - 1.0).abs() < 1e-9);
        let reports = [times(120.0, 95.0, 40.0, 2), times(125.0, 96.0, 41.0, 2)];
        let two = point(&shape, 2, &reports, 2, Some(&one.point)).expect("point");
        assert_eq!(two.point.gpus, 4);
        assert_eq!(two.point.gpu_indices, [0, 1, 2, 3]);
        assert_eq!(two.point.step_ms, 125.0);
        assert!((two.point.scaling_efficiency - 100.0 / 125.0).abs() < 1e-9);
        assert_eq!(two.exposed_comm_ms, 125.0 - 96.0);
        assert_eq!(two.node_compute_ms, [95.0, 96.0]);
        // A node that did not measure gives no point.
        assert!(point(&shape, 2, &[reports[0].clone(), NodeReport::Idle], 2, None).is_none());
    }

    #[test]
    fn a_node_slower_than_the_fastest_by_more_than_the_threshold_is_named() {
        let shape = DdpProbe::default();
        let reports = [
            times(130.0, 100.0, 5.0, 1),
            times(130.0, 125.0, 5.0, 1),
            times(130.0, 104.0, 5.0, 1),
        ];
        let p = point(&shape, 3, &reports, 1, None).expect("point");
        let names: Vec<String> = ["a", "b", "c"].map(String::from).to_vec();
        let s = stragglers(&names, &p, 10.0);
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!((s[0].node.as_str(), s[0].slower_percent), ("b", 25.0));
        assert!(stragglers(&names, &p, 30.0).is_empty());
    }
}
