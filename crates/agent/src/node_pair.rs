//! `fabric-agent node-pair`: one rank of a node-pair test. The two ranks meet over TCP
//! (rank 0 serves the NCCL unique id to the rank that presents the run's secret), measure
//! NCCL across both nodes' GPUs, pass a barrier, and each writes its node-pair document.

use crate::args::{
    BackendArg, Choice, RankArgs, RendezvousArgs, invalid, parse_collective, parse_seconds,
    parse_size,
};
use crate::backend::{self, Chosen, Measures};
use crate::exit::Exit;
use crate::output::progress;
use clap::Args;
use gpufabric_api::keys;
use gpufabric_api::pair::NodePairResult;
use gpufabric_api::suite::Collective;
use gpufabric_measure::cuda::node_pair::{CudaPair, PairSettings};
use gpufabric_measure::fleet::{Fleet, FleetNode};
use gpufabric_measure::node_pair::{self, PairBackend, PairRun, Stuck};
use gpufabric_measure::pairs::{DEFAULT_COLLECTIVES, PairOptions};
use gpufabric_measure::rendezvous::RendezvousError;
use gpufabric_measure::sim::SimPair;
use std::time::Duration;

/// Arguments of `fabric-agent node-pair`.
#[derive(Args, Debug, Clone)]
pub struct NodePairArgs {
    /// Backend. `sim` is only used when asked for by name.
    #[arg(long, value_enum, ignore_case = true, default_value_t = BackendArg::Cuda, env = keys::ENV_BACKEND)]
    pub backend: BackendArg,

    /// The two nodes of the pair, by rank, comma-separated.
    #[arg(long, value_delimiter = ',', env = keys::ENV_PAIR_NODES, value_name = "NODE0,NODE1", required = true)]
    pub nodes: Vec<String>,

    /// This process's rank: 0 serves the rendezvous, 1 joins it.
    #[arg(long, env = keys::ENV_RANK, value_name = "0|1")]
    pub rank: u32,

    /// How this rank meets the others.
    #[command(flatten)]
    pub meet: RendezvousArgs,

    /// Message size of each collective (8, 1K, 16M, 1G).
    #[arg(long, short = 'b', default_value = "1G", value_parser = parse_size, value_name = "SIZE")]
    pub bytes: u64,

    /// Collectives, comma-separated (default allReduce,sendRecv; add allToAll to measure it).
    #[arg(long, value_delimiter = ',', value_parser = parse_collective, value_name = "LIST")]
    pub collectives: Option<Vec<Collective>>,

    /// Warm-up iterations of each collective (cuda backend).
    #[arg(long, default_value_t = 5, value_name = "N")]
    pub warmup: u32,

    /// Timed iterations of each collective (cuda backend).
    #[arg(long, default_value_t = 20, value_name = "N")]
    pub iters: u32,

    /// Longest a collective's iterations may take before the watchdog aborts them and
    /// the document records a timeout (cuda backend; the sim's `hang` fault in phase
    /// `nodePair` waits this long).
    #[arg(long, default_value = "300", value_parser = parse_seconds, value_name = "SECS")]
    pub timeout: Duration,

    /// This node, the sim fleet, the document file.
    #[command(flatten)]
    pub me: RankArgs,
}

impl NodePairArgs {
    fn options(&self) -> anyhow::Result<PairOptions> {
        let [a, b] = self.nodes.as_slice() else {
            return Err(invalid(format!(
                "--nodes takes the two nodes of the pair, got {}",
                self.nodes.len()
            )));
        };
        if a == b {
            return Err(invalid(format!("--nodes names {a} twice")));
        }
        if self.rank > 1 {
            return Err(invalid(format!("--rank is 0 or 1, got {}", self.rank)));
        }
        let opts = PairOptions {
            group: self.meet.group.clone(),
            rank: self.rank,
            nodes: [a.clone(), b.clone()],
            bytes: self.bytes,
            collectives: self
                .collectives
                .clone()
                .unwrap_or_else(|| DEFAULT_COLLECTIVES.to_vec()),
        };
        self.me.check_node(self.rank, opts.node())?;
        Ok(opts)
    }
}

/// Runs one rank; returns the exit code.
pub fn run(args: NodePairArgs) -> anyhow::Result<i32> {
    let opts = args.options()?;
    let pair = PairRun {
        config: args.meet.config(opts.rank, opts.nodes.to_vec())?,
        shared_gpus: args.me.shared_gpus,
    };
    let mut backend = match backend::choose(&args, opts.node())? {
        Chosen::Measure { backend, .. } => backend,
        Chosen::Crashed(code) => return Ok(code),
    };
    let json = args.me.json.clone();
    // The communicator's set-up cannot be aborted: the document goes out and the process
    // ends.
    let stuck: Stuck = Box::new(move |doc| {
        std::process::exit(match write(&doc, json.as_deref()) {
            Ok(code) => code.code(),
            Err(e) => {
                eprintln!("fabric-agent: {e:#}");
                Exit::NotMeasured.code()
            }
        })
    });
    let mut end = node_pair::run(backend.as_mut(), &opts, &pair, stuck, &progress)?;
    backend::add_sim_wrong_elements_to_pair(&args.me.fleet, args.backend, &mut end.doc);
    let code = write(&end.doc, args.me.json.as_deref())?;
    Ok(match end.unmet {
        Some(RendezvousError::Config(_) | RendezvousError::Listen { .. }) => Exit::Usage,
        _ => code,
    }
    .code())
}

/// Writes the document; the exit code it makes: not measured (saying why), wrong values
/// (every value of a pair's collectives is checked), or success.
fn write(doc: &NodePairResult, json: Option<&std::path::Path>) -> anyhow::Result<Exit> {
    emit(doc, json)?;
    if let Some(m) = &doc.not_measured {
        eprintln!("fabric-agent: node pair not measured: {}", m.message);
        return Ok(Exit::NotMeasured);
    }
    let wrong: u64 = doc.collectives.iter().map(|c| c.wrong).sum();
    if wrong > 0 {
        eprintln!("fabric-agent: {wrong} wrong value(s) in the pair's collectives (#wrong)");
    }
    Ok(Exit::judged(None, wrong))
}

impl Measures for NodePairArgs {
    type Backend = dyn PairBackend;
    const NAME: &'static str = "node-pair";
    const NODES_FLAG: &'static str = "--nodes";

    fn choice(&self) -> Choice<'_> {
        self.me.choice(self.backend, &self.nodes)
    }

    fn cuda(&self) -> anyhow::Result<Box<dyn PairBackend>> {
        Ok(Box::new(CudaPair::new(PairSettings {
            iters: (self.warmup, self.iters),
            timeout: self.timeout,
        })))
    }

    fn sim(
        &self,
        fleet: Fleet,
        node: FleetNode,
        seed: u64,
    ) -> anyhow::Result<Box<dyn PairBackend>> {
        Ok(Box::new(SimPair::new(fleet, node, seed, self.timeout)))
    }
}

/// The table on stdout, the document as the last stdout line, in the termination message
/// and (pretty) in `--json`.
fn emit(doc: &NodePairResult, json: Option<&std::path::Path>) -> anyhow::Result<()> {
    let mut text = String::new();
    text.push_str(&format!(
        "# node pair {} <-> {}  rank {}  {} GPUs each  transport {}  NICs used {}\n",
        doc.nodes[0],
        doc.nodes[1],
        doc.rank,
        doc.gpus_per_node,
        doc.transport
            .map(|t| t.to_string())
            .unwrap_or_else(|| "-".into()),
        doc.nics_used
    ));
    text.push_str("#  collective        size   time(us)  algbw(GB/s)  busbw(GB/s)  #wrong\n");
    for c in &doc.collectives {
        text.push_str(&format!(
            "  {:<14} {:>8} {:>10.1} {:>12.2} {:>12.2} {:>7}\n",
            c.collective.api_name(),
            c.bytes,
            c.time_us,
            c.algbw,
            c.busbw,
            c.wrong
        ));
    }
    if let Some(nm) = &doc.not_measured {
        text.push_str(&format!("# not measured: {}\n", nm.message));
    }
    crate::output::emit_rank(doc, None, json, text)
}
