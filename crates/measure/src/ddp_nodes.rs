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
//!
//! One rank's steps, in [`run`]'s order: the backend gets ready and refuses GPUs other work
//! holds ([`NodeMeasure::prepare`]: such a rank ends alone, before it meets the others); the
//! ranks meet over the [`crate::rendezvous`] (a rank that never comes is a not-measured
//! document); a probe that hangs before any node count writes its timeout; the ranks agree on
//! the GPUs per node and measure every node count; work that started on the GPUs while they
//! measured makes the probe not measured, this node's doing (unless the GPUs are shared by
//! request or a node count failed); last, every rank passes a barrier.

use crate::model::{self, PointTimes};
use crate::node_counts::{CountStep, NodeReport, agree_gpus, measure_counts, meet, node_counts};
use crate::rendezvous::{Config, Group, RendezvousError};
use crate::{CheckError, Progress};
use gpufabric_api::ddp_nodes::{DDP_NODES_SCHEMA, DdpNodesPoint, DdpNodesResult, DdpStraggler};
use gpufabric_api::pair::NotMeasured;
use gpufabric_api::result::{Backend, DdpPoint, ErrorKind, Phase, PhaseError};
use gpufabric_api::suite::DdpProbe;
use std::time::{Duration, Instant};

/// What one node measured at one node count, over its own GPUs: the slowest of its GPUs,
/// and each GPU's compute.
pub type NodeTimes = PointTimes;

pub use crate::node_counts::NodeError;

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
    fn make_id(&mut self) -> Result<Vec<u8>, NodeError>;
    /// This node's GPUs as ranks `rank x G ..` of a clique of `nodes x G` ranks whose id is
    /// `id`.
    fn measure(&mut self, nodes: u32, id: &[u8]) -> Result<NodeTimes, NodeError>;
    /// Once the measurements ended, with no context of this rank's left:
    /// [`CheckError::GpusInUse`] when other work holds the GPUs now, which started while
    /// they were measured ([`crate::gpu_use::refuse_at_end`]).
    fn end_look(&mut self) -> Result<(), CheckError>;
}

/// How a rank takes part in the probe.
pub struct DdpNodesRun {
    /// The rendezvous: the group, this rank, the nodes by rank (node count k is the first
    /// k); its timeout also bounds the barriers and each exchange.
    pub config: Config,
    /// The model and its steps (`gpuCounts` is not used: every GPU of each node takes part).
    pub shape: DdpProbe,
    /// The node counts asked for (default: 1, 2, 4, ... and every node).
    pub node_counts: Option<Vec<u32>>,
    /// A node whose compute is slower than the fastest node's by more than this many
    /// percent is a straggler.
    pub straggler_percent: f64,
    /// Longest one node count may take on one node.
    pub timeout: Duration,
    /// Measure beside other work on this node's GPUs (`--shared-gpus`).
    pub shared_gpus: bool,
}

/// What a rank ends with: its document, and why the ranks did not all meet (or a rank
/// went while they measured) when that happened (the document says it too).
pub struct DdpNodesEnd {
    pub doc: DdpNodesResult,
    pub unmet: Option<RendezvousError>,
}

/// Runs one rank of the probe on `m` (see the module doc). `startedAt` and `durationS` are
/// the real time of the call; an `Err` is a rank that could not get ready and met no one.
pub fn run(
    m: &mut dyn NodeMeasure,
    probe: &DdpNodesRun,
    progress: Progress,
) -> Result<DdpNodesEnd, CheckError> {
    let started = Instant::now();
    let started_at = gpufabric_api::rfc3339::now();
    let config = &probe.config;
    let _span =
        tracing::info_span!("ddp_nodes", group = %config.group, rank = config.rank).entered();
    let mut doc = document(probe, m.kind(), started_at);
    // The backend is ready (libraries and GPUs found, none held by other work) before the
    // others are met: a rank that cannot measure fails alone, and at once.
    crate::activity::enter("ddp-nodes: preparing the GPUs");
    let gpus = m.prepare(probe.shared_gpus, progress)?;
    let unmet = |mut doc: DdpNodesResult, e: RendezvousError| {
        doc.header.duration_s = started.elapsed().as_secs_f64();
        doc.not_measured = Some(NotMeasured {
            peer: None,
            message: e.to_string(),
        });
        Ok(DdpNodesEnd {
            doc,
            unmet: Some(e),
        })
    };
    let met = meet(config, "ddp-nodes", progress);
    let mut group = match met {
        Ok(g) => g,
        Err(e) => return unmet(doc, e),
    };
    // A hang of the probe: for good, as a rank whose thread is stuck in a driver call; else,
    // after the timeout, the timeout is the document, with no points.
    if let Some(e) = m.hang(probe.timeout, progress) {
        // The others find the group closed, as when a rank's process ends.
        drop(group);
        doc.errors.push(e);
        doc.header.duration_s = started.elapsed().as_secs_f64();
        return Ok(DdpNodesEnd { doc, unmet: None });
    }
    if let Err(e) = measure(&mut doc, &mut group, probe, gpus, m, progress) {
        return unmet(doc, e);
    }
    // The workers have ended: what the GPUs hold now is work that started while they
    // measured (not after a failure: a worker that was killed may still be letting go).
    let looked = if probe.shared_gpus || !doc.errors.is_empty() {
        Ok(())
    } else {
        m.end_look()
    };
    if let Err(CheckError::GpusInUse(message)) = looked {
        doc.not_measured = Some(NotMeasured::own_node(message));
    }
    crate::activity::enter("ddp-nodes: waiting for the other ranks to finish");
    if let Err(e) = group.barrier(config.timeout) {
        doc.errors.push(error(e.to_string()));
    }
    doc.header.duration_s = started.elapsed().as_secs_f64();
    Ok(DdpNodesEnd { doc, unmet: None })
}

/// The document before anything is measured: the group, the nodes, this rank and the
/// model's shape and buckets.
fn document(probe: &DdpNodesRun, backend: Backend, started_at: String) -> DdpNodesResult {
    let shape = &probe.shape;
    DdpNodesResult {
        header: probe.config.header(DDP_NODES_SCHEMA, backend, started_at),
        hidden: shape.hidden,
        layers: shape.layers,
        batch_per_gpu: shape.batch_per_gpu,
        buckets: model::buckets(
            u64::from(shape.hidden),
            shape.layers as usize,
            shape.first_bucket_bytes,
            shape.bucket_bytes,
        )
        .iter()
        .map(|b| b.bytes)
        .collect(),
        points: Vec::new(),
        stragglers: Vec::new(),
        not_measured: None,
        errors: Vec::new(),
    }
}

fn error(message: String) -> PhaseError {
    PhaseError {
        phase: Phase::DdpProbe,
        kind: ErrorKind::Failed,
        message,
    }
}

/// Agrees on the GPUs per node, measures every node count and fills in the points and the
/// stragglers. A rendezvous failure (a rank gone) is `Err`; a node count that failed is an
/// error in the document.
fn measure(
    doc: &mut DdpNodesResult,
    group: &mut Group,
    probe: &DdpNodesRun,
    gpus: u32,
    m: &mut dyn NodeMeasure,
    progress: Progress,
) -> Result<(), RendezvousError> {
    let names = &probe.config.names;
    if let Err(why) = agree_gpus(group, names, gpus, probe.config.timeout)? {
        doc.errors.push(error(why));
        return Ok(());
    }
    doc.header.gpus_per_node = gpus;
    let counts = node_counts(probe.node_counts.as_deref(), 1, names.len() as u32);
    // A node count may take the whole timeout on the slowest node.
    let wait = probe.timeout * 2 + probe.config.timeout;
    let measured = measure_counts(
        group,
        names,
        &counts,
        wait,
        &mut Step(m),
        "ddp-nodes",
        progress,
    )?;
    for (k, reports) in &measured.counts {
        let base = doc.points.first().map(|p| &p.point);
        if let Some(p) = point(&probe.shape, *k, reports, gpus, base) {
            progress(&format!(
                "ddp-nodes: {} node(s), {} GPUs: step {:.2} ms, efficiency {:.1}%, compute alone {:.2} ms, comm alone {:.2} ms, exposed comm {:.2} ms",
                k,
                p.point.gpus,
                p.point.step_ms,
                p.point.scaling_efficiency * 100.0,
                p.compute_alone_ms,
                p.comm_alone_ms,
                p.exposed_comm_ms
            ));
            doc.points.push(p);
        }
    }
    if let Some(e) = measured.error {
        doc.errors.push(error(e));
    }
    if let Some(last) = doc.points.last().filter(|p| p.nodes > 1) {
        doc.stragglers = stragglers(&names[..last.nodes as usize], last, probe.straggler_percent);
    }
    Ok(())
}

/// A backend's measurement of one node count, as the exchange takes it.
struct Step<'a>(&'a mut dyn NodeMeasure);

impl CountStep for Step<'_> {
    type Report = NodeTimes;
    fn make_id(&mut self) -> Result<Vec<u8>, NodeError> {
        self.0.make_id()
    }
    fn measure(&mut self, nodes: u32, id: &[u8]) -> Result<NodeTimes, NodeError> {
        self.0.measure(nodes, id)
    }
}

/// The point of `k` nodes from their reports (the first `k`, all measured), scaled against
/// `base` (the first point). None when a report is missing.
fn point(
    shape: &DdpProbe,
    k: u32,
    reports: &[NodeReport<NodeTimes>],
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
fn stragglers(names: &[String], point: &DdpNodesPoint, percent: f64) -> Vec<DdpStraggler> {
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

    fn times(step: f64, compute: f64, comm: f64, gpus: usize) -> NodeReport<NodeTimes> {
        NodeReport::Measured(NodeTimes {
            step_ms: step,
            compute_ms: vec![compute; gpus],
            compute_alone_ms: compute,
            comm_alone_ms: comm,
        })
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
