//! `fabric-agent ddp-nodes`: one rank (node) of the multi-node DDP probe. The ranks meet over
//! TCP as a node pair's do (rank 0 serves, the others present the run's secret), then
//! measure the node probe's training step weak-scaled over 1, 2, 4, ... of their nodes, all
//! GPUs each, gather every node's times, and each writes the same document: step time,
//! scaling efficiency and exposed communication per node count, and the straggler nodes.
//! The sequence is `gpufabric_measure::ddp_nodes::run`; here are its arguments, the backend
//! chosen for it, the table, the document and the exit code.

use crate::args::{Choice, GroupArgs, RankArgs, invalid, parse_seconds, parse_size};
use crate::backend::{self, Chosen, Measures};
use crate::exit::Exit;
use crate::group_table;
use crate::output::progress;
use anyhow::Context;
use clap::Args;
use gpufabric_api::ddp_nodes::DdpNodesResult;
use gpufabric_api::suite::DdpProbe;
use gpufabric_measure::cuda::ddp::DdpSettings;
use gpufabric_measure::cuda::ddp_nodes::CudaDdpNodes;
use gpufabric_measure::ddp_nodes::{self, DdpNodesRun, NodeMeasure};
use gpufabric_measure::fleet::{Fleet, FleetNode};
use gpufabric_measure::sim::ddp_nodes::SimDdpNodes;
use std::time::Duration;

/// Arguments of `fabric-agent ddp-nodes`.
#[derive(Args, Debug, Clone)]
pub struct DdpNodesArgs {
    /// The group: backend, nodes, rank, rendezvous.
    #[command(flatten)]
    pub group: GroupArgs,

    /// Node counts to measure (default 1, 2, 4, ... and all of --nodes).
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub node_counts: Option<Vec<u32>>,

    /// Width of each square Linear layer.
    #[arg(long, default_value_t = 8192, value_name = "N")]
    pub hidden: u32,

    /// Number of Linear layers.
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub layers: u32,

    /// Samples per GPU per step (fixed: weak scaling).
    #[arg(long, default_value_t = 4096, value_name = "N")]
    pub batch_per_gpu: u32,

    /// First gradient bucket (PyTorch DDP: 1 MiB).
    #[arg(long, default_value = "1M", value_parser = parse_size, value_name = "SIZE")]
    pub first_bucket: u64,

    /// Other gradient buckets (PyTorch DDP: 25 MiB).
    #[arg(long, default_value = "25M", value_parser = parse_size, value_name = "SIZE")]
    pub bucket: u64,

    /// Untimed steps before each node count.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub warmup: u32,

    /// Timed steps of each node count.
    #[arg(long, default_value_t = 10, value_name = "N")]
    pub steps: u32,

    /// A node whose compute is more than this many percent slower than the fastest node's
    /// is named a straggler.
    #[arg(long, default_value_t = 10.0, value_name = "PERCENT")]
    pub straggler_percent: f64,

    /// Longest one node count may take before its workers are stopped (cuda backend; the
    /// sim's `hang` fault in phase `ddpProbe` waits this long).
    #[arg(long, default_value = "300", value_parser = parse_seconds, value_name = "SECS")]
    pub timeout: Duration,

    /// Print the timeline of the last timed step of this node's first GPU on stderr (every
    /// GEMM, memory pass and all-reduce, cuda backend), to set beside a profiler trace of
    /// PyTorch DDP.
    #[arg(long, env = "FABRIC_DDP_TRACE")]
    pub trace: bool,

    /// This node, the sim fleet, the document file.
    #[command(flatten)]
    pub me: RankArgs,
}

impl DdpNodesArgs {
    fn check(&self) -> anyhow::Result<()> {
        self.group.check(&self.me, 1)?;
        if self.node_counts.as_ref().is_some_and(|c| c.contains(&0)) {
            return Err(invalid("--node-counts must be at least 1".into()));
        }
        if self.steps == 0 || self.hidden == 0 || self.layers == 0 || self.batch_per_gpu == 0 {
            return Err(invalid(
                "--steps, --hidden, --layers and --batch-per-gpu must be at least 1".into(),
            ));
        }
        Ok(())
    }

    fn shape(&self) -> DdpProbe {
        DdpProbe {
            enabled: true,
            hidden: self.hidden,
            layers: self.layers,
            batch_per_gpu: self.batch_per_gpu,
            gpu_counts: None,
            first_bucket_bytes: self.first_bucket,
            bucket_bytes: self.bucket,
            warmup_steps: self.warmup,
            steps: self.steps,
        }
    }
}

/// Runs one rank; returns the exit code.
pub fn run(args: DdpNodesArgs) -> anyhow::Result<i32> {
    args.check()?;
    let probe = DdpNodesRun {
        config: args.group.config()?,
        shape: args.shape(),
        node_counts: args.node_counts.clone(),
        straggler_percent: args.straggler_percent,
        timeout: args.timeout,
        shared_gpus: args.me.shared_gpus,
    };
    let me = args.group.check(&args.me, 1)?;
    let mut m = match backend::choose(&args, me)? {
        Chosen::Measure { backend, .. } => backend,
        Chosen::Crashed(code) => return Ok(code),
    };
    let end = ddp_nodes::run(m.as_mut(), &probe, &progress)?;
    emit(&end.doc, args.me.json.as_deref())?;
    if let Some(e) = &end.unmet {
        return Ok(GroupArgs::unmet_exit("multi-node DDP probe", e));
    }
    Ok(match &end.doc.not_measured {
        Some(nm) => {
            eprintln!(
                "fabric-agent: multi-node DDP probe not measured: {}",
                nm.message
            );
            Exit::NotMeasured
        }
        None => Exit::Success,
    }
    .code())
}

impl Measures for DdpNodesArgs {
    type Backend = dyn NodeMeasure;
    const NAME: &'static str = "ddp-nodes";
    const NODES_FLAG: &'static str = "--nodes";

    fn choice(&self) -> Choice<'_> {
        self.me.choice(self.group.backend, &self.group.nodes)
    }

    /// This node's GPUs, one `ddp-worker` process (this program) each.
    fn cuda(&self) -> anyhow::Result<Box<dyn NodeMeasure>> {
        let exe = std::env::current_exe().context("finding this program for the ddp workers")?;
        let shape = self.shape();
        let settings = DdpSettings {
            hidden: shape.hidden as usize,
            layers: shape.layers as usize,
            batch: shape.batch_per_gpu as usize,
            first_bucket_bytes: shape.first_bucket_bytes,
            bucket_bytes: shape.bucket_bytes,
            warmup: shape.warmup_steps,
            steps: shape.steps,
            counts: Vec::new(),
            timeout: self.timeout,
            trace: self.trace,
        };
        let limit = self.timeout * 2 + Duration::from_secs(30);
        Ok(Box::new(CudaDdpNodes::new(
            self.group.rank,
            settings,
            exe,
            limit,
        )))
    }

    fn sim(
        &self,
        fleet: Fleet,
        _node: FleetNode,
        seed: u64,
    ) -> anyhow::Result<Box<dyn NodeMeasure>> {
        let nodes = self.group.fleet_nodes(&fleet);
        Ok(Box::new(SimDdpNodes {
            nodes,
            rank: self.group.rank,
            shape: self.shape(),
            seed,
        }))
    }
}

/// The table on stdout, the document as the last stdout line, in the termination message
/// and (pretty) in `--json`.
fn emit(doc: &DdpNodesResult, json: Option<&std::path::Path>) -> anyhow::Result<()> {
    let mut text = group_table::title(
        "multi-node DDP probe",
        &doc.header,
        &format!(
            "MLP {} x {}, batch {} per GPU",
            doc.layers, doc.hidden, doc.batch_per_gpu
        ),
    );
    text.push_str("#  nodes  gpus  step(ms)  samples/s  efficiency  compute(ms)  comm alone(ms)  exposed comm(ms)\n");
    for p in &doc.points {
        text.push_str(&format!(
            "  {:>5} {:>5} {:>9.2} {:>10.0} {:>10.1}% {:>12.2} {:>15.2} {:>17.2}\n",
            p.nodes,
            p.point.gpus,
            p.point.step_ms,
            p.point.samples_per_s,
            p.point.scaling_efficiency * 100.0,
            p.compute_alone_ms,
            p.comm_alone_ms,
            p.exposed_comm_ms
        ));
    }
    for s in &doc.stragglers {
        text.push_str(&format!(
            "# straggler: {} computes a step in {:.2} ms, {:.1}% slower than the fastest node ({:.2} ms)\n",
            s.node, s.compute_ms, s.slower_percent, s.fastest_ms
        ));
    }
    text.push_str(&group_table::ending(&doc.errors, doc.not_measured.as_ref()));
    crate::output::emit_rank(doc, Some(&doc.termination_text()), json, text)
}
