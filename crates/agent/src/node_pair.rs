//! `fabric-agent node-pair`: one rank of a node-pair test. The two ranks meet over TCP
//! (rank 0 serves the NCCL unique id to the rank that presents the run's secret), measure
//! NCCL across both nodes' GPUs, pass a barrier, and each writes its node-pair document.

use crate::args::{
    BackendArg, RankArgs, RendezvousArgs, invalid, load_sim_fleet, parse_collective, parse_seconds,
    parse_size,
};
use crate::output::progress;
use clap::Args;
use gpufabric_api::keys;
use gpufabric_api::pair::{NodePairResult, NotMeasured, PAIR_SCHEMA};
use gpufabric_api::result::{Backend, ErrorKind, Phase, PhaseError};
use gpufabric_api::suite::Collective;
use gpufabric_measure::pairs::{DEFAULT_COLLECTIVES, PairOptions};
use gpufabric_measure::rendezvous::{self, Config, RendezvousError};
use gpufabric_measure::sim::{self, ProcessFault};
use gpufabric_measure::{CheckError, rfc3339};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// Exit code of a pair that could not be measured (a peer that never arrived): the
/// document says why, and nothing in it counts against either node.
pub const EXIT_NOT_MEASURED: i32 = 3;

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

/// Where the kernel lists RDMA devices and their ports.
const NIC_ROOT: &str = "/sys/class/infiniband";

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
    let rank = RankRun {
        config: args.meet.config(opts.rank, opts.nodes.to_vec())?,
        args: &args,
        opts: &opts,
        started: Instant::now(),
        started_at: rfc3339(SystemTime::now()),
    };
    match args.backend {
        BackendArg::Cuda => run_cuda(&rank),
        BackendArg::Sim => run_sim(&rank),
    }
}

/// One rank of a pair: what it was asked, how it meets the other, when it started.
struct RankRun<'a> {
    args: &'a NodePairArgs,
    opts: &'a PairOptions,
    config: Config,
    started: Instant,
    started_at: String,
}

/// Meets the other rank: rank 0 serves `id` (made by `make_id`, called on rank 0 only),
/// rank 1 receives it. A peer that never comes is a not-measured document and an exit
/// code, in `Err`.
fn meet(
    r: &RankRun,
    backend: Backend,
    make_id: &mut dyn FnMut() -> anyhow::Result<[u8; rendezvous::ID_BYTES]>,
) -> anyhow::Result<Result<(rendezvous::Group, [u8; rendezvous::ID_BYTES]), i32>> {
    let (args, opts, config) = (r.args, r.opts, &r.config);
    progress(&format!(
        "node-pair {} <-> {} (group {}, rank {}): rendezvous at {}",
        opts.nodes[0], opts.nodes[1], opts.group, opts.rank, config.addr
    ));
    let met = if opts.rank == 0 {
        let id = make_id()?;
        rendezvous::serve(config, &id).map(|group| (group, id))
    } else {
        rendezvous::join(config)
    };
    match met {
        Ok(m) => Ok(Ok(m)),
        Err(e) => {
            let doc = not_measured(
                opts,
                backend,
                r.started_at.clone(),
                r.started,
                e.to_string(),
            );
            emit(&doc, args.me.json.as_deref())?;
            eprintln!("fabric-agent: node pair not measured: {e}");
            Ok(Err(match e {
                RendezvousError::Config(_) | RendezvousError::Listen { .. } => 2,
                _ => EXIT_NOT_MEASURED,
            }))
        }
    }
}

/// Both ranks finish together, so neither reports a pair the other abandoned; then the
/// document goes out.
fn finish(
    mut doc: NodePairResult,
    mut group: rendezvous::Group,
    r: &RankRun,
) -> anyhow::Result<i32> {
    if let Err(e) = group.barrier(r.args.meet.rendezvous_timeout) {
        doc.errors.push(PhaseError {
            phase: Phase::NodePair,
            kind: ErrorKind::Failed,
            message: e.to_string(),
        });
    }
    doc.duration_s = r.started.elapsed().as_secs_f64();
    emit(&doc, r.args.me.json.as_deref())?;
    Ok(match &doc.not_measured {
        Some(m) => {
            eprintln!("fabric-agent: node pair not measured: {}", m.message);
            EXIT_NOT_MEASURED
        }
        None => 0,
    })
}

fn run_sim(r: &RankRun) -> anyhow::Result<i32> {
    let (args, opts) = (r.args, r.opts);
    let fleet = load_sim_fleet(&args.me.fleet, &opts.nodes)?;
    // This rank's node in the sim fleet.
    let node = fleet.node(opts.node());
    if let Some(node) = node
        && let Some(ProcessFault::Crash { exit_code }) = sim::process_fault(node)
    {
        eprintln!(
            "fabric-agent: simulated crash of node {} (fault in the fleet file): exiting with code {exit_code}",
            opts.node()
        );
        return Ok(exit_code);
    }
    if let Some(node) = node {
        sim::refuse_shared_gpus(node, args.me.shared_gpus, &progress)?;
    }
    // The sim has no NCCL; it serves random bytes in place of NCCL's unique id, so that
    // the exchange is the one a real pair makes.
    let mut make_id = || rendezvous::random_id().map_err(|e| anyhow::anyhow!("{e}"));
    let (group, _id) = match meet(r, Backend::Sim, &mut make_id)? {
        Ok(m) => m,
        Err(code) => return Ok(code),
    };
    let seed = args.me.seed.unwrap_or(fleet.seed);
    let mut doc =
        gpufabric_measure::pairs::sim::node_pair(&fleet, opts, seed, r.started_at.clone())
            .map_err(|e| invalid(e.to_string()))?;
    // A hang of the pair's collectives (sim fault `hang` in phase `nodePair`): with
    // `stuck: true` the rank never returns, as one whose thread is stuck in a driver call;
    // else its watchdog's timeout is the document, as the cuda backend writes it.
    if let Some(node) = node
        && let Some(e) = sim::hang(node, Phase::NodePair, args.timeout, &progress)
    {
        doc.collectives.clear();
        doc.errors.push(e);
        return finish(doc, group, r);
    }
    // The cuda backend's last look at this node's GPUs.
    if let Some(node) = node
        && let Err(CheckError::GpusInUse(message)) = sim::work_started(node, args.me.shared_gpus)
    {
        doc.not_measured = Some(NotMeasured::own_node(message));
    }
    finish(doc, group, r)
}

fn run_cuda(r: &RankRun) -> anyhow::Result<i32> {
    let args = r.args;
    use gpufabric_measure::cuda;
    // Before any NCCL call or thread: NCCL reads its log settings once.
    let nccl_log = cuda::nccl_debug_file();
    if !cuda::nccl::nccl_present() {
        return Err(anyhow::Error::new(CheckError::LibraryMissing {
            library: "libnccl.so".into(),
            detail: "NCCL is not installed or not on the library path".into(),
        }));
    }
    cuda::refuse_shared_gpus(args.me.shared_gpus, &progress)?;
    let mut make_id = || {
        let id = cuda::nccl::unique_id().map_err(|e| {
            anyhow::Error::new(CheckError::Other(format!(
                "NCCL could not make the pair's unique id: {e}"
            )))
        })?;
        let mut bytes = [0u8; rendezvous::ID_BYTES];
        for (b, c) in bytes.iter_mut().zip(id.internal.iter()) {
            *b = *c as u8;
        }
        Ok(bytes)
    };
    let (mut group, id) = match meet(r, Backend::Cuda, &mut make_id)? {
        Ok(m) => m,
        Err(code) => return Ok(code),
    };
    let joined = Arc::new(AtomicBool::new(false));
    let settings = cuda::node_pair::PairSettings {
        iters: (args.warmup, args.iters),
        timeout: args.timeout,
        nics: gpufabric_measure::nic::read_ports(std::path::Path::new(NIC_ROOT))
            .unwrap_or_default(),
        nccl_log,
        joined: Some(joined.clone()),
        shared_gpus: args.me.shared_gpus,
    };
    let _watch = watch_init(joined, args.meet.rendezvous_timeout, {
        let doc = not_measured(
            r.opts,
            Backend::Cuda,
            r.started_at.clone(),
            r.started,
            format!(
                "{} met the rendezvous but did not join NCCL's communicator within {}s \
                 (its agent died, or NCCL cannot reach it on the network)",
                r.opts.peer(),
                args.meet.rendezvous_timeout.as_secs()
            ),
        );
        let (json, started) = (args.me.json.clone(), r.started);
        move || {
            let mut doc = doc;
            doc.duration_s = started.elapsed().as_secs_f64();
            // NCCL's init cannot be aborted: the document goes out and the process ends.
            if let Err(e) = emit(&doc, json.as_deref()) {
                eprintln!("fabric-agent: {e:#}");
            }
            if let Some(m) = &doc.not_measured {
                eprintln!("fabric-agent: node pair not measured: {}", m.message);
            }
            std::process::exit(EXIT_NOT_MEASURED);
        }
    });
    let timeout = args.meet.rendezvous_timeout;
    let mut barrier = || group.barrier(timeout).map_err(|e| e.to_string());
    let doc =
        cuda::node_pair::node_pair(r.opts, &id, &settings, &mut barrier, r.started_at.clone())?;
    finish(doc, group, r)
}

/// Watches NCCL's communicator set-up from a thread: when `joined` is not set within
/// `timeout`, calls `expire` (which ends the process: `ncclCommInitRank` blocks for ever
/// on a peer that died after the rendezvous, and cannot be aborted). The thread ends on
/// its own once `joined` is set.
fn watch_init(
    joined: Arc<AtomicBool>,
    timeout: Duration,
    expire: impl FnOnce() + Send + 'static,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let deadline = Instant::now() + timeout;
        while !joined.load(Ordering::SeqCst) {
            let now = Instant::now();
            if now >= deadline {
                expire();
                return;
            }
            std::thread::sleep((deadline - now).min(Duration::from_millis(50)));
        }
    })
}

fn not_measured(
    opts: &PairOptions,
    backend: Backend,
    started_at: String,
    started: Instant,
    message: String,
) -> NodePairResult {
    NodePairResult {
        schema: PAIR_SCHEMA.into(),
        group: opts.group.clone(),
        nodes: opts.nodes.clone(),
        rank: opts.rank,
        backend,
        started_at,
        duration_s: started.elapsed().as_secs_f64(),
        gpus_per_node: 0,
        collectives: Vec::new(),
        transport: None,
        nics_used: 0,
        nics: Vec::new(),
        not_measured: Some(NotMeasured {
            peer: Some(opts.peer().to_string()),
            message,
        }),
        errors: Vec::new(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    #[test]
    fn the_init_watch_expires_when_the_communicator_never_forms() {
        let (tx, rx) = mpsc::channel();
        let joined = Arc::new(AtomicBool::new(false));
        let t = watch_init(joined, Duration::from_millis(100), move || {
            let _ = tx.send(());
        });
        assert!(rx.recv_timeout(Duration::from_secs(10)).is_ok(), "expired");
        t.join().expect("the watch ends");
    }

    #[test]
    fn the_init_watch_stands_down_once_joined() {
        let (tx, rx) = mpsc::channel::<()>();
        let joined = Arc::new(AtomicBool::new(false));
        let t = watch_init(joined.clone(), Duration::from_millis(300), move || {
            let _ = tx.send(());
        });
        joined.store(true, Ordering::SeqCst);
        t.join().expect("the watch ends");
        // The watch has ended without expiring: the sender is dropped unused.
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(1)),
            Err(mpsc::RecvTimeoutError::Disconnected)
        );
    }
}
