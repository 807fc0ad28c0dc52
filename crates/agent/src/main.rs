//! `fabric-agent`: runs the GPU fabric checks on one node and writes the result document.

#![forbid(unsafe_code)]

mod args;
mod backend;
mod ddp_nodes;
mod exit;
mod group_table;
mod inject;
mod nccl_nodes;
mod node_pair;
mod output;
mod settings;
mod stop;
mod tables;
mod verdict;

use anyhow::Context;
use args::{Choice, NodeCheckArgs};
use backend::{Chosen, Measures};
use clap::{Parser, Subcommand, ValueEnum};
use exit::Exit;
use gpufabric_api::keys;
use gpufabric_measure::cuda::{CudaCheck, CudaOptions};
use gpufabric_measure::fleet::{Fleet, FleetNode};
use gpufabric_measure::node_check::CheckBackend;
use gpufabric_measure::sim::SimCheck;
use gpufabric_measure::{CheckError, CheckOptions};
use output::progress;
use std::process::ExitCode;

/// Tests the GPU fabric of this node: NCCL collective sweep, GPU-pair copy bandwidth, a
/// DDP scaling probe and an NVML health snapshot. Prints human tables, then the full
/// result document as JSON on the last line of stdout.
#[derive(Parser, Debug)]
#[command(
    name = "fabric-agent",
    version,
    about,
    long_about,
    after_help = format!("Examples:\n  fabric-agent node-check --quick\n  fabric-agent node-check --backend sim --fleet crates/measure/fleets/demo-16.yaml --node h100-03\n  fabric-agent inject straggler --gpu 3 --seconds 120\n\n{}", exit::help())
)]
struct Cli {
    /// Format of the log on stderr: text, or one JSON object a line. Progress lines and
    /// tables stay text.
    #[arg(long, global = true, env = keys::ENV_LOG_FORMAT, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,

    #[command(subcommand)]
    command: Command,
}

/// Format of the log on stderr.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Measure every GPU of this node and write the result document.
    ///
    /// Runs, in order: the NVML health snapshot, the NCCL sweep (nccl-tests' sizes, columns
    /// and busbw), the GPU-pair copy matrix (like nvbandwidth) and the DDP scaling probe.
    /// Prints tables, then the full document as one JSON line (the last line of stdout);
    /// writes the compact document (<= 4096 bytes) to $FABRIC_TERMINATION_LOG, or to
    /// /dev/termination-log when that file exists and is writable.
    ///
    /// With --verdict, judges the node with the operator's health rules and prints the
    /// verdict and its findings under the tables. Every value of the sweep is checked, as
    /// nccl-tests does: a wrong one ends the check with exit code 4 (-c 0: no check).
    ///
    /// Examples:
    ///   fabric-agent node-check
    ///   fabric-agent node-check --quick --collectives allReduce -b 8 -e 1G --json out.json
    ///   fabric-agent node-check --verdict --min-busbw 340 --verdict-json verdict.json
    ///   fabric-agent node-check --backend sim --fleet crates/measure/fleets/demo-16.yaml --node h100-00
    #[command(verbatim_doc_comment, after_help = exit::help())]
    NodeCheck(Box<NodeCheckArgs>),
    /// Inject a real fault on this node's GPUs (a slow GPU pair, a straggler GPU) for a
    /// while, to see that a node-check run beside it finds it.
    ///
    /// Example:
    ///   fabric-agent inject slow-pair --gpus 3,5 --seconds 120
    #[command(verbatim_doc_comment, after_help = exit::help())]
    Inject(inject::InjectArgs),
    /// One rank of a node-pair test: meet the other node's pod over TCP, run NCCL across
    /// both nodes' GPUs, and write the node-pair document.
    ///
    /// Rank 0 listens on --rendezvous and gives the NCCL unique id to the rank that presents
    /// the run's secret; rank 1 connects, retrying until --rendezvous-timeout. Either may
    /// start first. A peer that never arrives ends the pod within that time with exit code
    /// 5 and a document saying the pair was not measured, naming the peer. Wrong values in
    /// a collective end it with exit code 4, the document written.
    ///
    /// Example (two shells):
    ///   fabric-agent node-pair --backend sim --fleet f.yaml --nodes a,b --rank 0 \
    ///     --rendezvous 127.0.0.1:29400 --group demo --secret $S
    ///   fabric-agent node-pair --backend sim --fleet f.yaml --nodes a,b --rank 1 \
    ///     --rendezvous 127.0.0.1:29400 --group demo --secret $S
    #[command(verbatim_doc_comment, after_help = exit::help())]
    NodePair(Box<node_pair::NodePairArgs>),
    /// One rank (node) of the multi-node DDP probe: the node probe's training step,
    /// weak-scaled over 1, 2, 4, ... of --nodes (all GPUs each), with step time, scaling
    /// efficiency and exposed communication per node count, and the straggler nodes.
    ///
    /// The ranks meet as a node pair's do (rank 0 serves --rendezvous, the others present
    /// the secret; any start order); a rank that never arrives ends every rank within
    /// --rendezvous-timeout with exit code 5 and a document saying why. Every rank prints
    /// the same points.
    ///
    /// Example (one shell per node):
    ///   fabric-agent ddp-nodes --nodes a,b,c,d --rank 0 --rendezvous a:29400 \
    ///     --group nightly --secret $S
    #[command(verbatim_doc_comment, after_help = exit::help())]
    DdpNodes(Box<ddp_nodes::DdpNodesArgs>),
    /// One rank (node) of the multi-node NCCL sweep: all_reduce, all_gather,
    /// reduce_scatter and alltoall over 2, 4, 8, ... of --nodes and all of them (one NCCL
    /// clique over every GPU of the first k nodes, this process driving its node's GPUs),
    /// each at every size from -b to -e, printed as nccl-tests prints them (size, count,
    /// time, algbw, busbw in nccl-tests' convention), then a summary per node count: busbw
    /// at the large sizes, the time of the smallest.
    ///
    /// The ranks meet as a node pair's do (rank 0 serves --rendezvous, the others present
    /// the secret; any start order); a rank that never arrives ends every rank within
    /// --rendezvous-timeout with exit code 5 and a document saying why. Every rank prints
    /// the same rows (each the slowest node's time). Wrong values end it with exit code 4.
    ///
    /// Example (one shell per node, S=$(openssl rand -hex 32) on every node):
    ///   fabric-agent nccl-nodes --nodes a,b,c,d --rank 0 --rendezvous a:29400 \
    ///     --group nightly --secret $S --json nccl-nodes.json
    #[command(verbatim_doc_comment, after_help = exit::help())]
    NcclNodes(Box<nccl_nodes::NcclNodesArgs>),
    /// One rank of the DDP probe run with one process per GPU: reads its task as one JSON
    /// line on stdin, prints its report as one JSON line. Started by node-check itself.
    #[command(hide = true)]
    DdpWorker,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_tracing(cli.log_format);
    // A DDP worker is one of node-check's own processes: its parent says where it stopped.
    if !matches!(cli.command, Command::DdpWorker)
        && let Err(e) = stop::on_sigterm()
    {
        tracing::warn!(
            error = format!("{e:#}"),
            "SIGTERM will stop the agent without a word"
        );
    }
    let result = match cli.command {
        Command::NodeCheck(args) => node_check(*args),
        Command::Inject(args) => inject::run(args).map(|()| Exit::Success.code()),
        Command::NodePair(args) => node_pair::run(*args),
        Command::DdpNodes(args) => ddp_nodes::run(*args),
        Command::NcclNodes(args) => nccl_nodes::run(*args),
        Command::DdpWorker => ddp_worker(),
    };
    match result {
        Ok(code) => exit_code(code),
        Err(e) => {
            eprintln!("fabric-agent: error: {e:#}");
            let check = e.downcast_ref::<CheckError>();
            if let Some(c) = check {
                // The reason replaces the last progress line as the termination message,
                // so that the operator's node entry says it.
                output::write_termination(&c.to_string());
            }
            let code = check.map_or(Exit::Error, Exit::of).code();
            if let Some(hint) = check.and_then(hint) {
                eprintln!("fabric-agent: {hint}");
            }
            exit_code(code)
        }
    }
}

fn init_tracing(format: LogFormat) {
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        );
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn exit_code(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// What to do about an error that stops the check.
fn hint(e: &CheckError) -> Option<&'static str> {
    match e {
        CheckError::NoGpu(_) | CheckError::LibraryMissing { .. } => Some(
            "run on a node with NVIDIA GPUs and their driver (the pod needs nvidia.com/gpu), \
             or use `--backend sim --fleet FILE` on a machine without GPUs",
        ),
        CheckError::TooFewGpus { .. } => {
            Some("request every GPU of the node, or lower --expect-gpus")
        }
        CheckError::GpusInUse(_) => Some(
            "this is not a fault of the node; run the check when its GPUs are idle, or pass --shared-gpus",
        ),
        _ => None,
    }
}

fn invalid(e: anyhow::Error) -> anyhow::Error {
    anyhow::Error::new(CheckError::InvalidInput(format!("{e:#}")))
}

/// The node name: the flag or `FABRIC_NODE_NAME`, else the host name.
fn node_name(arg: Option<String>) -> anyhow::Result<String> {
    if let Some(n) = arg.filter(|n| !n.trim().is_empty()) {
        return Ok(n.trim().to_string());
    }
    for path in ["/proc/sys/kernel/hostname", "/etc/hostname"] {
        if let Ok(text) = std::fs::read_to_string(path)
            && !text.trim().is_empty()
        {
            return Ok(text.trim().to_string());
        }
    }
    if let Ok(h) = std::env::var("HOSTNAME")
        && !h.trim().is_empty()
    {
        return Ok(h.trim().to_string());
    }
    Err(invalid(anyhow::anyhow!(
        "cannot tell the node name; pass --node NAME or set FABRIC_NODE_NAME"
    )))
}

fn ddp_worker() -> anyhow::Result<i32> {
    let stdin = std::io::stdin();
    let stdout = std::io::stdout();
    gpufabric_measure::cuda::ddp::procs::worker_main(&mut stdin.lock(), &mut stdout.lock())
        .context("writing the ddp worker report")?;
    Ok(Exit::Success.code())
}

fn node_check(args: NodeCheckArgs) -> anyhow::Result<i32> {
    let suite = args.suite().map_err(invalid)?;
    let node = node_name(args.node.clone())?;
    let thresholds = args
        .verdict
        .verdict
        .then(|| args.verdict.thresholds())
        .transpose()
        .map_err(invalid)?;
    let outputs = output::Outputs::new(args.json.as_deref(), args.verdict.verdict_json.as_deref())
        .map_err(invalid)?;
    if let Some(a) = args.average.filter(|a| *a != 3) {
        progress(&format!(
            "-a {a}: one process times every GPU together; times are the slowest GPU's (-a 3)"
        ));
    }
    let opts = CheckOptions {
        node: node.clone(),
        suite,
        quick: args.quick,
        expect_gpus: args.expect_gpus,
        phase_timeout: args.phase_timeout,
        shared_gpus: args.shared_gpus,
    };
    let (mut backend, garbage) = match backend::choose(&args, &node)? {
        Chosen::Measure { backend, garbage } => (backend, garbage),
        Chosen::Crashed(code) => return Ok(code),
    };
    // Before NCCL runs: it copies its config files' variables into this process's env.
    let nccl_settings = settings::in_effect();
    let mut doc = gpufabric_measure::node_check::run(backend.as_mut(), &opts, &progress)?;
    doc.nccl_settings = nccl_settings;
    // The sim backend reports its fleet's value; a real node, the files NCCL reads here.
    if doc.versions.nccl_conf.is_none() {
        doc.versions.nccl_conf = Some(settings::conf_digest());
    }
    if args.check {
        backend::add_sim_wrong_elements(&args.fleet, args.backend, &mut doc);
    }
    let verdict = match &thresholds {
        Some(t) => {
            let previous = args.verdict.previous_counters();
            let trend = args.verdict.previous_trend();
            let suite = opts.suite.fingerprint();
            let history = trend
                .as_ref()
                .map(|r| r.points(verdict::TREND_TEST, &suite).to_vec())
                .unwrap_or_default();
            let asked = &opts.suite.nccl_sweep.collectives;
            let baseline = args.verdict.fleet_baseline().map_err(invalid)?;
            let judged = verdict::judge(
                &doc,
                asked,
                t,
                args.expect_gpus,
                previous.as_ref(),
                &history,
                baseline.as_ref().map(|b| (b, suite.as_str())),
            )
            .map_err(invalid)?;
            if let Some(path) = &args.verdict.counters_file {
                verdict::keep_counters(path, &judged, previous.as_ref())?;
            }
            if let Some(path) = &args.verdict.trend_file {
                let window = t.trend.window as usize;
                verdict::keep_trend(path, &judged, trend.as_ref(), &suite, window)?;
            }
            Some(judged.verdict)
        }
        None => None,
    };
    output::emit(&doc, verdict.as_ref(), &outputs, garbage).context("writing the result")?;
    // With -c 0 nothing was checked: no count is a finding.
    let wrong: u64 = match (args.check, doc.nccl.as_ref()) {
        (true, Some(n)) => n.collectives.iter().map(|c| c.total_wrong()).sum(),
        _ => 0,
    };
    if wrong > 0 {
        eprintln!(
            "fabric-agent: {wrong} wrong value(s) in the NCCL sweep (the #wrong column); -c 0 skips the check"
        );
    }
    Ok(Exit::judged(verdict.as_ref().map(|v| v.verdict), wrong).code())
}

/// The program the DDP probe starts per GPU, when asked for one process per GPU.
fn ddp_worker_exe(args: &NodeCheckArgs) -> anyhow::Result<Option<std::path::PathBuf>> {
    if let Some(exe) = &args.ddp_worker_exe {
        return Ok(Some(exe.clone()));
    }
    if !args.ddp_process_per_gpu {
        return Ok(None);
    }
    std::env::current_exe()
        .map(Some)
        .context("finding this program to start it once per GPU")
}

impl Measures for NodeCheckArgs {
    type Backend = dyn CheckBackend;
    const NAME: &'static str = "node-check";
    const NODES_FLAG: &'static str = "--node";

    fn choice(&self) -> Choice<'_> {
        Choice {
            backend: self.backend,
            fleet: &self.fleet,
            seed: self.seed,
            group: &[],
        }
    }

    /// The cuda backend with the command line's options.
    fn cuda(&self) -> anyhow::Result<Box<dyn CheckBackend>> {
        let cuda = CudaOptions {
            check_values: self.check,
            ddp_trace: self.ddp_trace,
            ddp_worker: ddp_worker_exe(self)?,
            launch_pin: self.pin_launch_cpu,
            flip_sdc_bit: self.flip_sdc_bit,
        };
        Ok(Box::new(CudaCheck::new(cuda)))
    }

    fn sim(
        &self,
        _fleet: Fleet,
        node: FleetNode,
        seed: u64,
    ) -> anyhow::Result<Box<dyn CheckBackend>> {
        Ok(Box::new(SimCheck::new(node, seed)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_ddp_worker_subcommand_parses_and_stays_out_of_help() {
        let cli = Cli::try_parse_from(["fabric-agent", "ddp-worker"]).expect("parses");
        assert!(matches!(cli.command, Command::DdpWorker));
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("node-check"), "{help}");
        assert!(!help.contains("ddp-worker"), "{help}");
    }
}
