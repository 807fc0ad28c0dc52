//! Command-line arguments of `fabric-agent node-check` and how they become a suite.

use super::{
    BackendArg, FleetArgs, parse_blocking, parse_collective, parse_data_type, parse_op,
    parse_seconds, parse_size, parse_switch,
};
use anyhow::{Context, bail};
use clap::Args;
use gpufabric_api::keys;
use gpufabric_api::suite::{Collective, DataType, Suite};
use std::path::PathBuf;

/// Arguments of `fabric-agent node-check`.
#[derive(Args, Debug, Clone)]
pub struct NodeCheckArgs {
    /// Backend. `sim` is only used when asked for by name.
    #[arg(long, value_enum, ignore_case = true, default_value_t = BackendArg::Cuda, env = keys::ENV_BACKEND)]
    pub backend: BackendArg,

    /// Suite file (YAML or JSON, the `suite` of a FabricTest); flags below override it.
    #[arg(long, value_name = "FILE")]
    pub suite: Option<PathBuf>,

    /// The suite inline, as JSON or YAML (the operator passes the run's whole suite in
    /// `FABRIC_SUITE`, its only channel); `--suite FILE` wins over it, flags below override both.
    #[arg(
        long,
        env = keys::ENV_SUITE,
        value_name = "JSON",
        hide_env_values = true
    )]
    pub suite_json: Option<String>,

    /// Collectives to sweep, comma-separated (allReduce or all_reduce, allGather,
    /// reduceScatter, broadcast, reduce, allToAll, sendRecv).
    #[arg(long, value_delimiter = ',', value_parser = parse_collective, value_name = "LIST")]
    pub collectives: Option<Vec<Collective>>,

    /// Smallest NCCL message size (8, 1K, 16M, 1G).
    #[arg(long, short = 'b', value_parser = parse_size, value_name = "SIZE")]
    pub min_bytes: Option<u64>,

    /// Largest NCCL message size (8, 1K, 16M, 1G).
    #[arg(long, short = 'e', value_parser = parse_size, value_name = "SIZE")]
    pub max_bytes: Option<u64>,

    /// Each size is the previous one times this factor.
    #[arg(long, short = 'f', value_name = "N")]
    pub step_factor: Option<u32>,

    /// Untimed iterations before each size.
    #[arg(long, short = 'w', value_name = "N")]
    pub warmup_iters: Option<u32>,

    /// Timed iterations per size.
    #[arg(long, short = 'n', value_name = "N")]
    pub iters: Option<u32>,

    /// Data type of the NCCL sweep, as nccl-tests' `-d`: float, half, bfloat16, double,
    /// int8, uint8, int32, uint32, int64, uint64.
    #[arg(long = "datatype", short = 'd', value_parser = parse_data_type, value_name = "TYPE")]
    pub data_type: Option<DataType>,

    /// Reduction operation, as nccl-tests' `-o`. The sweep reduces with sum; other
    /// operations are refused.
    #[arg(long, short = 'o', value_parser = parse_op, value_name = "OP")]
    pub op: Option<String>,

    /// Check every result, as nccl-tests' `-c`: 1 (the default) checks, and any wrong value
    /// ends the check with exit code 4, as nccl-tests fails; 0 skips the check.
    #[arg(
        long,
        short = 'c',
        action = clap::ArgAction::Set,
        value_parser = parse_switch,
        value_name = "0|1",
        default_value = "1"
    )]
    pub check: bool,

    /// How the ranks' times combine, as nccl-tests' `-a` (0 rank 0, 1 average, 2 minimum,
    /// 3 maximum). One process drives every GPU and reports the slowest GPU's time, which
    /// is `-a 3`; other values are accepted and report the same time.
    #[arg(long = "average", short = 'a', value_parser = clap::value_parser!(u8).range(0..=3), value_name = "0-3")]
    pub average: Option<u8>,

    /// Blocking collectives, as nccl-tests' `-z`. Only 0 (nccl-tests' default: the host
    /// enqueues without waiting) is measured; 1 is refused.
    #[arg(long = "blocking", short = 'z', value_parser = parse_blocking, value_name = "0")]
    pub blocking: Option<u8>,

    /// Time the NCCL sweep with CUDA graphs, as nccl-tests' `-G`: each block's `-n`
    /// iterations are recorded into one graph per GPU, and the time per iteration is that
    /// of N launches of the graphs (cuda backend). The host then launches one graph per GPU
    /// instead of every call, so small sizes time the GPUs and links rather than the
    /// launching CPU. 0 (the default) launches every iteration, as nccl-tests does without
    /// `-G`.
    #[arg(long = "cudagraph", short = 'G', value_name = "N")]
    pub graph_launches: Option<u32>,

    /// Bytes per GPU-pair copy (8, 1K, 16M, 1G). Copy bandwidths are judged only from 16M up;
    /// shorter copies are set by latency, and an Info finding says so.
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub pair_bytes: Option<u64>,

    /// Skip the NCCL sweep.
    #[arg(long)]
    pub no_nccl: bool,

    /// Skip the GPU-pair copy matrix.
    #[arg(long)]
    pub no_pairs: bool,

    /// Skip the DDP scaling probe.
    #[arg(long)]
    pub no_ddp: bool,

    /// Skip the NVML health snapshot.
    #[arg(long)]
    pub no_health: bool,

    /// Skip the compute checks (GEMM throughput, memory bandwidth, silent data corruption).
    #[arg(long)]
    pub no_compute: bool,

    /// A test hook, never a fault: flip one bit of this GPU's first silent-data-corruption
    /// output in device memory before it is read, to show the check finds it (cuda backend).
    #[arg(
        long,
        env = "FABRIC_TEST_FLIP_SDC_BIT",
        hide = true,
        value_name = "GPU"
    )]
    pub flip_sdc_bit: Option<u32>,

    /// GPU counts of the DDP probe, comma-separated (default 1, 2, 4, ... all).
    #[arg(long, value_delimiter = ',', value_name = "LIST")]
    pub ddp_gpu_counts: Option<Vec<u32>>,

    /// A fast smoke check: sizes up to 64 MiB, few iterations and steps.
    #[arg(long)]
    pub quick: bool,

    /// Also write the full result document (pretty JSON) to this file; `-` writes it to
    /// stdout alone (the tables then go to stderr).
    #[arg(long, value_name = "PATH")]
    pub json: Option<PathBuf>,

    /// Print the timeline of one step of the DDP probe (every GEMM, memory pass and
    /// all-reduce), to compare it with a profiler trace of PyTorch DDP (cuda backend).
    #[arg(long, env = "FABRIC_DDP_TRACE")]
    pub ddp_trace: bool,

    /// Time each collective of the NCCL sweep from the CPU that runs a fixed piece of work
    /// fastest just before it (cuda backend). Small sizes time the host's launches, and on
    /// shared hosts some CPUs run at half speed at any moment. On one such 2 x H200 host it
    /// held times at -n 1000 steadier (5-13% spread over eight runs, against 18-19%), not at
    /// -n 20; off by default, so that the sweep runs as nccl-tests does. Not with -G, whose
    /// launches come from one thread per GPU.
    #[arg(long, env = "FABRIC_PIN_LAUNCH_CPU")]
    pub pin_launch_cpu: bool,

    /// Run the DDP probe with one process per GPU, as PyTorch DDP runs (cuda backend):
    /// this program started once per rank.
    #[arg(long, env = "FABRIC_DDP_PROCESS_PER_GPU")]
    pub ddp_process_per_gpu: bool,

    /// The program to start per rank with --ddp-process-per-gpu (default: this one).
    #[arg(long, env = "FABRIC_DDP_WORKER_EXE", value_name = "PATH", hide = true)]
    pub ddp_worker_exe: Option<PathBuf>,

    #[command(flatten)]
    pub verdict: crate::verdict::VerdictArgs,

    /// Node name in the document (and, with `sim`, the node of the fleet to simulate).
    /// Default: the host name.
    #[arg(long, env = keys::ENV_NODE_NAME, value_name = "NAME")]
    pub node: Option<String>,

    #[command(flatten)]
    pub fleet: FleetArgs,

    /// Seed of the `sim` backend's noise (default: the fleet file's seed).
    #[arg(long)]
    pub seed: Option<u64>,

    /// Measure even when another process holds the GPUs. Without it, a GPU with memory in
    /// use before the check starts (or a process NVML lists on it) ends the check with exit
    /// code 14 and the GPUs and processes named: work the scheduler does not know about
    /// would slow every measurement, and the node is not measured. With it, what that work
    /// costs counts against the node. Work that starts while the check measures (a process
    /// NVML lists only at the end, or 1 GiB more in use) ends it with exit code 14 too. A
    /// GPU whose compute mode is Prohibited ends the check with exit code 14 either way.
    /// Other work never hides a GPU's own faults: with uncorrectable ECC errors, a row
    /// remap or NVLink links down, the document holds the GPUs' health alone.
    #[arg(long, env = "FABRIC_SHARED_GPUS")]
    pub shared_gpus: bool,

    /// Fail (exit 12) when fewer GPUs than this are visible.
    #[arg(long, value_name = "N")]
    pub expect_gpus: Option<u32>,

    /// Watchdog per phase, in seconds: a phase that does not finish in time is aborted and
    /// recorded as a `timeout` error.
    #[arg(long, default_value = "600", value_parser = parse_seconds, value_name = "SECS")]
    pub phase_timeout: std::time::Duration,
}

impl NodeCheckArgs {
    /// The suite: the file (or the defaults), then the flags.
    pub fn suite(&self) -> anyhow::Result<Suite> {
        let mut suite = match &self.suite {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading suite file {}", path.display()))?;
                serde_yaml::from_str::<Suite>(&text).with_context(|| {
                    format!(
                        "suite file {} is not a valid suite (the `suite` of a FabricTest, YAML or JSON)",
                        path.display()
                    )
                })?
            }
            None => match self.suite_json.as_deref().filter(|t| !t.trim().is_empty()) {
                Some(text) => serde_yaml::from_str::<Suite>(text).context(
                    "the inline suite (--suite-json or FABRIC_SUITE) is not a valid suite",
                )?,
                None => Suite::default(),
            },
        };
        let n = &mut suite.nccl_sweep;
        if let Some(c) = &self.collectives {
            n.collectives = c.clone();
        }
        if let Some(v) = self.min_bytes {
            n.min_bytes = v;
        }
        if let Some(v) = self.max_bytes {
            n.max_bytes = v;
        }
        if let Some(v) = self.step_factor {
            n.step_factor = v;
        }
        if let Some(v) = self.warmup_iters {
            n.warmup_iters = v;
        }
        if let Some(v) = self.iters {
            n.iters = v;
        }
        if let Some(v) = self.data_type {
            n.data_type = v;
        }
        if let Some(v) = self.graph_launches {
            n.graph_launches = v;
        }
        if let Some(v) = self.pair_bytes {
            suite.gpu_pairs.bytes = v;
        }
        if let Some(v) = &self.ddp_gpu_counts {
            suite.ddp_probe.gpu_counts = Some(v.clone());
        }
        suite.nccl_sweep.enabled &= !self.no_nccl;
        suite.gpu_pairs.enabled &= !self.no_pairs;
        suite.ddp_probe.enabled &= !self.no_ddp;
        suite.health.enabled &= !self.no_health;
        if self.no_compute {
            suite.compute.gemm.enabled = false;
            suite.compute.memory.enabled = false;
            suite.compute.sdc.enabled = false;
        }
        check_suite(&suite)?;
        Ok(suite)
    }
}

/// The rules a FabricTest's suite must follow, applied to the suite given on the command line.
fn check_suite(suite: &Suite) -> anyhow::Result<()> {
    let spec = gpufabric_api::FabricTestSpec {
        suite: suite.clone(),
        ..Default::default()
    };
    if let Err(e) = gpufabric_api::validate(&spec) {
        let problems: Vec<String> = e
            .problems
            .iter()
            .filter(|p| p.field.starts_with("suite"))
            .map(|p| format!("{}: {}", p.field, p.message))
            .collect();
        if !problems.is_empty() {
            bail!("invalid suite: {}", problems.join("; "));
        }
    }
    if let Some(counts) = &suite.ddp_probe.gpu_counts
        && counts.contains(&0)
    {
        bail!("invalid suite: ddp GPU counts must be at least 1");
    }
    Ok(())
}
