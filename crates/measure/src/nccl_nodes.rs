//! The multi-node NCCL sweep, backend-neutral: the ranks (one per node, each driving all its
//! GPUs) of a rendezvous group run all_reduce, all_gather, reduce_scatter and alltoall over
//! the first 2, 4, 8, ... nodes and the whole group, every collective over a range of sizes
//! as nccl-tests does, and gather every node's rows so that each rank writes the same points.
//!
//! For each node count `k`: rank 0 makes a fresh communicator id and hands it to every rank
//! (an all-gather over the rendezvous connections); ranks `0..k` form one NCCL clique of
//! `k x G` ranks, the first `k` of the group, and time each collective at each size; ranks
//! `k..` wait; then every rank's rows are gathered. A point's row takes the slowest node's
//! time, and its algbw and busbw from that time (nccl-tests' definitions for `k x G` ranks).
//!
//! One rank's steps, in [`run`]'s order: the backend gets ready and refuses GPUs other work
//! holds ([`NcclMeasure::prepare`]: such a rank ends alone, before it meets the others); the
//! ranks meet over the [`crate::rendezvous`] (a rank that never comes is a not-measured
//! document); they agree on the GPUs per node and measure every node count; work that
//! started on the GPUs while they measured makes the sweep not measured, this node's doing
//! (unless the GPUs are shared by request or a node count failed); last, every rank passes
//! a barrier.

use crate::node_counts::{CountStep, NodeReport, agree_gpus, measure_counts, meet, node_counts};
use crate::rendezvous::{Config, Group, RendezvousError};
use crate::{CheckError, Progress, stats};
use gpufabric_api::nccl_nodes::{
    NCCL_NODES_SCHEMA, NcclNodesPoint, NcclNodesResult, NcclNodesSummary,
};
use gpufabric_api::pair::{NicPort, NotMeasured, PairCollective};
use gpufabric_api::result::{Backend, ErrorKind, Phase, PhaseError};
use gpufabric_api::suite::Collective;
use std::time::{Duration, Instant};

pub use crate::node_counts::NodeError;

/// The collectives of the sweep, in the order they run.
pub const COLLECTIVES: [Collective; 4] = [
    Collective::AllReduce,
    Collective::AllGather,
    Collective::ReduceScatter,
    Collective::AllToAll,
];

/// What each node count runs: every collective at every size.
#[derive(Debug, Clone, PartialEq)]
pub struct Sweep {
    pub collectives: Vec<Collective>,
    /// Bytes, nccl-tests' size of each collective.
    pub sizes: Vec<u64>,
    /// Untimed and timed iterations of each collective at each size.
    pub iters: (u32, u32),
}

/// The sizes from `min` to `max` bytes, each `factor` times the last (nccl-tests' `-b -e
/// -f`), and `max` itself.
pub fn sizes(min: u64, max: u64, factor: u64) -> Vec<u64> {
    let min = min.max(1);
    let mut out: Vec<u64> = std::iter::successors(Some(min), |s| s.checked_mul(factor.max(2)))
        .take_while(|s| *s < max)
        .collect();
    if max >= min {
        out.push(max);
    }
    out
}

/// How one backend does its node's part of the sweep.
pub trait NcclMeasure {
    /// The backend the document names.
    fn kind(&self) -> Backend;
    /// Before the ranks meet: the backend can measure here, and other work holds none of the
    /// GPUs (unless `shared`); an error ends this rank alone. Returns this node's GPU count.
    fn prepare(&mut self, shared: bool, progress: Progress) -> Result<u32, CheckError>;
    /// A fresh communicator id (called on rank 0 only, once per node count).
    fn make_id(&mut self) -> Result<Vec<u8>, NodeError>;
    /// This node's GPUs as ranks `rank x G ..` of a clique of `nodes x G` ranks whose id is
    /// `id`: every collective of `sweep` at every size, this node's time of each.
    fn measure(
        &mut self,
        nodes: u32,
        id: &[u8],
        sweep: &Sweep,
    ) -> Result<Vec<PairCollective>, NodeError>;
    /// Once the measurements ended: [`CheckError::GpusInUse`] when other work holds the GPUs
    /// now, which started while they were measured.
    fn end_look(&mut self) -> Result<(), CheckError>;
    /// This node's InfiniBand / RoCE ports (empty without any); None when they could not be
    /// read.
    fn ports(&mut self) -> Option<Vec<NicPort>>;
}

/// How a rank takes part in the sweep.
pub struct NcclNodesRun {
    /// The rendezvous: the group, this rank, the nodes by rank (node count k is the first
    /// k); its timeout also bounds the barriers and each exchange.
    pub config: Config,
    pub sweep: Sweep,
    /// Sizes from this one up are each summary's large ones.
    pub large_bytes: u64,
    /// The node counts asked for (default: 2, 4, 8, ... and every node).
    pub node_counts: Option<Vec<u32>>,
    /// Longest one node count may take on one node.
    pub timeout: Duration,
    /// Measure beside other work on this node's GPUs (`--shared-gpus`).
    pub shared_gpus: bool,
}

/// What a rank ends with: its document, and why the ranks did not all meet (or a rank
/// went while they measured) when that happened (the document says it too).
pub struct NcclNodesEnd {
    pub doc: NcclNodesResult,
    pub unmet: Option<RendezvousError>,
    /// Every node's network ports, by rank, as each reported them (None: not read or not
    /// received); empty when the ranks did not get as far as exchanging them. What the
    /// links allow each point is worked out from them.
    pub ports: Vec<Option<Vec<NicPort>>>,
}

/// Runs one rank of the sweep on `m` (see the module doc). `startedAt` and `durationS` are
/// the real time of the call; an `Err` is a rank that could not get ready and met no one.
pub fn run(
    m: &mut dyn NcclMeasure,
    run: &NcclNodesRun,
    progress: Progress,
) -> Result<NcclNodesEnd, CheckError> {
    let started = Instant::now();
    let config = &run.config;
    let _span =
        tracing::info_span!("nccl_nodes", group = %config.group, rank = config.rank).entered();
    let mut doc = document(run, m.kind());
    crate::activity::enter("nccl-nodes: preparing the GPUs");
    let gpus = m.prepare(run.shared_gpus, progress)?;
    let unmet = |mut doc: NcclNodesResult, e: RendezvousError| {
        doc.header.duration_s = started.elapsed().as_secs_f64();
        doc.not_measured = Some(NotMeasured {
            peer: None,
            message: e.to_string(),
        });
        Ok(NcclNodesEnd {
            doc,
            unmet: Some(e),
            ports: Vec::new(),
        })
    };
    let mut group = match meet(config, "nccl-nodes", progress) {
        Ok(g) => g,
        Err(e) => return unmet(doc, e),
    };
    let ports = match measure(&mut doc, &mut group, run, gpus, m, progress) {
        Ok(p) => p,
        Err(e) => return unmet(doc, e),
    };
    let looked = if run.shared_gpus || !doc.errors.is_empty() {
        Ok(())
    } else {
        m.end_look()
    };
    if let Err(CheckError::GpusInUse(message)) = looked {
        doc.not_measured = Some(NotMeasured::own_node(message));
    }
    crate::activity::enter("nccl-nodes: waiting for the other ranks to finish");
    if let Err(e) = group.barrier(config.timeout) {
        doc.errors.push(error(e.to_string()));
    }
    doc.header.duration_s = started.elapsed().as_secs_f64();
    Ok(NcclNodesEnd {
        doc,
        unmet: None,
        ports,
    })
}

fn document(run: &NcclNodesRun, backend: Backend) -> NcclNodesResult {
    NcclNodesResult {
        header: run
            .config
            .header(NCCL_NODES_SCHEMA, backend, gpufabric_api::rfc3339::now()),
        sizes: run.sweep.sizes.clone(),
        large_bytes: run.large_bytes,
        points: Vec::new(),
        not_measured: None,
        errors: Vec::new(),
    }
}

fn error(message: String) -> PhaseError {
    PhaseError {
        phase: Phase::NcclSweep,
        kind: ErrorKind::Failed,
        message,
    }
}

/// One node's rows of one node count, as they travel to the others.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq)]
struct Rows {
    rows: Vec<PairCollective>,
}

/// A backend's sweep of one node count, as the exchange takes it.
struct Step<'a> {
    m: &'a mut dyn NcclMeasure,
    sweep: &'a Sweep,
}

impl CountStep for Step<'_> {
    type Report = Rows;
    fn make_id(&mut self) -> Result<Vec<u8>, NodeError> {
        self.m.make_id()
    }
    fn measure(&mut self, nodes: u32, id: &[u8]) -> Result<Rows, NodeError> {
        let rows = self.m.measure(nodes, id, self.sweep)?;
        Ok(Rows { rows })
    }
}

/// Every rank's ports, gathered by rank; a rank's that could not be read, were too many to
/// send, or did not parse is None.
fn gather_ports(
    group: &mut Group,
    mine: Option<Vec<NicPort>>,
    timeout: Duration,
) -> Result<Vec<Option<Vec<NicPort>>>, RendezvousError> {
    // A list of ports always serialises; one too large to send goes as "not read".
    let text = serde_json::to_vec(&mine).unwrap_or_default();
    let text = if text.len() > crate::rendezvous::MAX_GATHER_BYTES {
        b"null".to_vec()
    } else {
        text
    };
    let all = group.all_gather(&text, timeout)?;
    Ok(all
        .iter()
        .map(|b| serde_json::from_slice::<Option<Vec<NicPort>>>(b).unwrap_or(None))
        .collect())
}

/// Agrees on the GPUs per node, gathers every node's ports, measures every node count and
/// fills in the points; returns the ports. A rendezvous failure (a rank gone) is `Err`; a
/// node count that failed is an error in the document.
fn measure(
    doc: &mut NcclNodesResult,
    group: &mut Group,
    run: &NcclNodesRun,
    gpus: u32,
    m: &mut dyn NcclMeasure,
    progress: Progress,
) -> Result<Vec<Option<Vec<NicPort>>>, RendezvousError> {
    let names = &run.config.names;
    if let Err(why) = agree_gpus(group, names, gpus, run.config.timeout)? {
        doc.errors.push(error(why));
        return Ok(Vec::new());
    }
    let ports = gather_ports(group, m.ports(), run.config.timeout)?;
    doc.header.gpus_per_node = gpus;
    let counts = node_counts(run.node_counts.as_deref(), 2, names.len() as u32);
    if counts.is_empty() {
        doc.errors.push(error(format!(
            "no node count to measure over {} node(s): the sweep needs at least 2",
            names.len()
        )));
        return Ok(ports);
    }
    let wait = run.timeout * 2 + run.config.timeout;
    let mut step = Step {
        m,
        sweep: &run.sweep,
    };
    let measured = measure_counts(
        group,
        names,
        &counts,
        wait,
        &mut step,
        "nccl-nodes",
        progress,
    )?;
    for (k, reports) in &measured.counts {
        if let Some(p) = point(names, *k, gpus, &run.sweep, run.large_bytes, reports) {
            for s in &p.summary {
                progress(&format!(
                    "nccl-nodes: {k} node(s), {} ranks: {} busbw {:.2} GB/s at the large sizes, {:.1} us at {} B",
                    p.ranks,
                    s.collective.nccl_tests_name(),
                    s.large_busbw,
                    s.small_time_us,
                    doc.sizes.first().copied().unwrap_or(0)
                ));
            }
            doc.points.push(p);
        }
    }
    if let Some(e) = measured.error {
        doc.errors.push(error(e));
    }
    Ok(ports)
}

/// The point of `k` nodes from their rows (the first `k`, all measured): per collective and
/// size, the slowest node's time, the bandwidths from it, and every node's wrong values.
/// None when a report is missing.
fn point(
    names: &[String],
    k: u32,
    gpus_per_node: u32,
    sweep: &Sweep,
    large_bytes: u64,
    reports: &[NodeReport<Rows>],
) -> Option<NcclNodesPoint> {
    let mut nodes = Vec::new();
    for r in reports.iter().take(k as usize) {
        let NodeReport::Measured(Rows { rows }) = r else {
            return None;
        };
        nodes.push(rows);
    }
    if nodes.len() != k as usize {
        return None;
    }
    let ranks = k * gpus_per_node;
    let rows: Vec<PairCollective> = nodes[0]
        .iter()
        .map(|first| {
            let same = nodes.iter().filter_map(|rows| {
                rows.iter()
                    .find(|r| r.collective == first.collective && r.bytes == first.bytes)
            });
            let (time_us, wrong) = same.fold((0.0f64, 0u64), |(t, w), r| {
                (t.max(r.time_us), w.saturating_add(r.wrong))
            });
            PairCollective {
                collective: first.collective,
                bytes: first.bytes,
                time_us,
                algbw: stats::algbw_gbps(first.bytes, time_us),
                busbw: stats::busbw_gbps(first.collective, ranks, first.bytes, time_us),
                wrong,
            }
        })
        .collect();
    Some(NcclNodesPoint {
        nodes: k,
        node_names: names.iter().take(k as usize).cloned().collect(),
        ranks,
        summary: sweep
            .collectives
            .iter()
            .filter_map(|&c| NcclNodesSummary::of(c, &rows, large_bytes))
            .collect(),
        links: None,
        rows,
    })
}

#[cfg(test)]
mod tests;
