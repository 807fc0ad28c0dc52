//! Command-line arguments of `fabric-agent node-check` and how they become a suite.

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use gpufabric_api::keys;
use gpufabric_api::suite::{Collective, DataType, Suite};
use gpufabric_measure::fleet::{Fleet, FleetSource};
use std::path::PathBuf;

/// Which backend measures.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendArg {
    /// Real GPUs through CUDA, NCCL, cuBLAS and NVML.
    Cuda,
    /// A model of a node described in a fleet file (for machines without GPUs).
    Sim,
}

/// What a subcommand's command line says of its backend.
pub struct Choice<'a> {
    /// `--backend`.
    pub backend: BackendArg,
    /// Where the sim fleet comes from.
    pub fleet: &'a FleetArgs,
    /// The seed that overrides the fleet's own.
    pub seed: Option<u64>,
    /// The other nodes the sim fleet must hold (a group's nodes; none for one node).
    pub group: &'a [String],
}

/// How one rank of a test over several nodes meets the others (`node-pair`, `ddp-nodes`).
#[derive(Args, Debug, Clone)]
pub struct RendezvousArgs {
    /// `host:port` of the rendezvous: rank 0 listens on it, the others connect to it.
    #[arg(long, env = keys::ENV_RENDEZVOUS, value_name = "HOST:PORT")]
    pub rendezvous: String,

    /// Name of the rendezvous group, the same on every rank (e.g. `<run>/r0/p3`).
    #[arg(long, env = keys::ENV_GROUP, value_name = "NAME")]
    pub group: String,

    /// The run's rendezvous secret, hex (at least 32 digits).
    #[arg(long, env = keys::ENV_RENDEZVOUS_SECRET, hide_env_values = true, value_name = "HEX")]
    pub secret: String,

    /// Seconds to wait for the other ranks; then the test is "not measured", naming them.
    #[arg(long, default_value = "120", value_parser = parse_seconds, value_name = "SECS")]
    pub rendezvous_timeout: std::time::Duration,
}

impl RendezvousArgs {
    /// The rendezvous of rank `rank` among `names` (the nodes, by rank); a bad secret is
    /// invalid input.
    pub fn config(
        &self,
        rank: u32,
        names: Vec<String>,
    ) -> anyhow::Result<gpufabric_measure::rendezvous::Config> {
        let secret =
            gpufabric_measure::rendezvous::Secret::from_hex(&self.secret).map_err(|e| {
                anyhow::Error::new(gpufabric_measure::CheckError::InvalidInput(e.to_string()))
            })?;
        Ok(gpufabric_measure::rendezvous::Config {
            group: self.group.clone(),
            rank,
            names,
            addr: self.rendezvous.clone(),
            secret,
            timeout: self.rendezvous_timeout,
        })
    }
}

/// The fleet the `sim` backend simulates: a file, or the document itself.
#[derive(Args, Debug, Clone, Default)]
pub struct FleetArgs {
    /// Fleet description (YAML or JSON) the `sim` backend simulates; `sim` needs it or
    /// --fleet-doc.
    #[arg(long, env = keys::ENV_SIM_FLEET, value_name = "PATH")]
    pub fleet: Option<PathBuf>,

    /// The fleet description itself (YAML or JSON) instead of a file: how a benchmark pod
    /// gets one, from a ConfigMap key through the FabricTest's spec.agent.env.
    #[arg(
        long,
        env = keys::ENV_SIM_FLEET_DOC,
        value_name = "YAML",
        conflicts_with = "fleet",
        hide_env_values = true
    )]
    pub fleet_doc: Option<String>,

    /// Sim backend only: wrong elements to add to the first collective measured, whose
    /// values the sim otherwise always gets right (to see what wrong values do: exit code
    /// 4, the #wrong column, the findings).
    #[arg(long, env = "FABRIC_SIM_WRONG_ELEMENTS", hide = true, value_name = "N")]
    pub sim_wrong_elements: Option<u64>,

    /// Sim backend only: how long the simulated work lasts, slept in real time: `h200` (the
    /// default suite's times on a 4 x H200 node: a node check of 22-27 s), `none`, or a
    /// document, e.g. `{phases: {ncclSweep: 10}, nodePair: 13, ddpNodes: 12, spread: 0.1}`.
    /// Absent: every phase ends at once.
    #[arg(long, env = keys::ENV_SIM_PACE, value_name = "PROFILE|YAML")]
    pub sim_pace: Option<String>,
}

impl FleetArgs {
    /// Where the fleet comes from; an input error when neither is given.
    pub fn source(&self) -> anyhow::Result<FleetSource> {
        match (&self.fleet, &self.fleet_doc) {
            (Some(path), _) => Ok(FleetSource::File(path.clone())),
            (None, Some(doc)) => Ok(FleetSource::Document(doc.clone())),
            (None, None) => Err(anyhow::Error::new(
                gpufabric_measure::CheckError::InvalidInput(format!(
                    "the sim backend needs a fleet: pass --fleet PATH (or set {}) or --fleet-doc YAML (or set {})",
                    keys::ENV_SIM_FLEET,
                    keys::ENV_SIM_FLEET_DOC
                )),
            )),
        }
    }

    /// The fleet, read and checked.
    pub fn load(&self) -> anyhow::Result<(FleetSource, Fleet)> {
        let source = self.source()?;
        let fleet = source.load().map_err(|e| {
            anyhow::Error::new(gpufabric_measure::CheckError::InvalidInput(e.to_string()))
        })?;
        Ok((source, fleet))
    }
}

/// What a rank of a group (`node-pair`, `ddp-nodes`) is told about itself and where its
/// document goes, beside its rank and the rendezvous.
#[derive(Args, Debug, Clone)]
pub struct RankArgs {
    /// This node's name (default: the node of this rank in --nodes).
    #[arg(long, env = keys::ENV_NODE_NAME, value_name = "NAME")]
    pub node: Option<String>,

    #[command(flatten)]
    pub fleet: FleetArgs,

    /// Seed of the `sim` backend's noise (default: the fleet file's seed).
    #[arg(long)]
    pub seed: Option<u64>,

    /// Also write the document (pretty JSON) to this file.
    #[arg(long, value_name = "PATH")]
    pub json: Option<std::path::PathBuf>,

    /// Measure even when another process holds this node's GPUs (cuda backend). Without
    /// it, such a rank ends at once with exit code 14, before meeting the others, and the
    /// test is not measured; work that starts while the rank waits or measures makes it
    /// write its document as not measured (exit code 5). See node-check --shared-gpus.
    #[arg(long, env = "FABRIC_SHARED_GPUS")]
    pub shared_gpus: bool,
}

impl RankArgs {
    /// The backend of a rank of `group` as `backend` and these arguments say.
    pub fn choice<'a>(&'a self, backend: BackendArg, group: &'a [String]) -> Choice<'a> {
        Choice {
            backend,
            fleet: &self.fleet,
            seed: self.seed,
            group,
        }
    }

    /// Refuses a `--node` (or `FABRIC_NODE_NAME`) that is not `me`, the node of `rank` in
    /// `--nodes`: a pod on one node must not measure as another.
    pub fn check_node(&self, rank: u32, me: &str) -> anyhow::Result<()> {
        match self
            .node
            .as_deref()
            .map(str::trim)
            .filter(|n| !n.is_empty())
        {
            Some(node) if node != me => Err(invalid(format!(
                "this is node {node}, but rank {rank} of --nodes is {me}"
            ))),
            _ => Ok(()),
        }
    }
}

/// An error of the arguments (exit code 2).
pub fn invalid(message: String) -> anyhow::Error {
    anyhow::Error::new(gpufabric_measure::CheckError::InvalidInput(message))
}

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

/// Parses a byte size with an optional binary suffix: `8`, `1K`, `16M`, `1G` (also `KiB`,
/// `MB` and lower case; every suffix is a power of 1024, as in nccl-tests).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, suffix) = t.split_at(split);
    if digits.is_empty() {
        return Err(format!(
            "{text:?} is not a size; write a number with an optional K, M or G suffix, like 16M"
        ));
    }
    let n: u64 = digits
        .parse()
        .map_err(|e| format!("{text:?} is not a size: {e}"))?;
    let shift = match suffix.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        other => {
            return Err(format!(
                "{text:?}: unknown size suffix {other:?}; use K, M or G (powers of 1024)"
            ));
        }
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// Parses a positive number of seconds (fractions allowed).
pub fn parse_seconds(text: &str) -> Result<std::time::Duration, String> {
    let s: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    if !(s.is_finite() && s > 0.0) {
        return Err(format!("{text:?}: the timeout must be more than 0 seconds"));
    }
    Ok(std::time::Duration::from_secs_f64(s))
}

/// Parses a data type by its nccl-tests name (`float`, `half`, ...) or API name
/// (`float32`, `float16`, ...), in any case.
pub fn parse_data_type(text: &str) -> Result<DataType, String> {
    const ALL: [DataType; 10] = [
        DataType::Int8,
        DataType::Uint8,
        DataType::Int32,
        DataType::Uint32,
        DataType::Int64,
        DataType::Uint64,
        DataType::Float16,
        DataType::Float32,
        DataType::Float64,
        DataType::Bfloat16,
    ];
    let key = text.trim().to_ascii_lowercase();
    let api_name = |d: DataType| format!("{d:?}").to_ascii_lowercase();
    ALL.into_iter()
        .find(|d| d.nccl_tests_name() == key || api_name(*d) == key)
        .ok_or_else(|| {
            format!(
                "unknown data type {text:?}; one of {}",
                ALL.map(DataType::nccl_tests_name).join(", ")
            )
        })
}

/// The reduction operation: only `sum` is measured.
pub fn parse_op(text: &str) -> Result<String, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "sum" => Ok("sum".into()),
        "prod" | "min" | "max" | "avg" | "all" => Err(format!(
            "-o {text}: the sweep reduces with sum only; drop -o or pass -o sum"
        )),
        _ => Err(format!(
            "unknown operation {text:?}; nccl-tests' operations are sum, prod, min, max, avg, all, and the sweep measures sum"
        )),
    }
}

/// A 0 or 1 switch, as nccl-tests takes them.
pub fn parse_switch(text: &str) -> Result<bool, String> {
    match text.trim() {
        "0" => Ok(false),
        "1" => Ok(true),
        _ => Err(format!("{text:?}: expected 0 or 1")),
    }
}

/// nccl-tests' `-z`: only non-blocking collectives are measured.
pub fn parse_blocking(text: &str) -> Result<u8, String> {
    match parse_switch(text)? {
        false => Ok(0),
        true => Err(
            "-z 1 (blocking collectives) is not supported: the sweep enqueues every iteration without waiting, as nccl-tests does by default".into(),
        ),
    }
}

/// Parses a collective by its API name or nccl-tests name, in any case.
pub fn parse_collective(text: &str) -> Result<Collective, String> {
    let key: String = text
        .trim()
        .chars()
        .filter(|c| *c != '_' && *c != '-')
        .collect::<String>()
        .to_ascii_lowercase();
    Collective::ALL
        .into_iter()
        .find(|c| c.api_name().to_ascii_lowercase() == key)
        .ok_or_else(|| {
            format!(
                "unknown collective {text:?}; one of {}",
                Collective::ALL
                    .iter()
                    .map(|c| c.api_name())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_refuses_to_measure_as_another_node() {
        let me = |node: Option<&str>| RankArgs {
            node: node.map(String::from),
            fleet: FleetArgs::default(),
            seed: None,
            json: None,
            shared_gpus: false,
        };
        assert!(me(None).check_node(1, "gpu-02").is_ok());
        assert!(
            me(Some("  ")).check_node(1, "gpu-02").is_ok(),
            "unset downward API"
        );
        assert!(me(Some("gpu-02")).check_node(1, "gpu-02").is_ok());
        let err = me(Some("gpu-01"))
            .check_node(1, "gpu-02")
            .expect_err("another node");
        assert_eq!(
            err.to_string(),
            "invalid input: this is node gpu-01, but rank 1 of --nodes is gpu-02"
        );
    }

    #[test]
    fn sizes_take_binary_suffixes() {
        assert_eq!(parse_size("8"), Ok(8));
        assert_eq!(parse_size("1K"), Ok(1024));
        assert_eq!(parse_size("16M"), Ok(16 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert_eq!(parse_size("2gib"), Ok(2 << 30));
        assert_eq!(parse_size("64KB"), Ok(64 << 10));
        assert!(parse_size("M").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999999T").is_err());
    }

    #[test]
    fn collectives_parse_by_either_name() {
        assert_eq!(parse_collective("allReduce"), Ok(Collective::AllReduce));
        assert_eq!(parse_collective("all_reduce"), Ok(Collective::AllReduce));
        assert_eq!(parse_collective("alltoall"), Ok(Collective::AllToAll));
        assert_eq!(parse_collective("sendrecv"), Ok(Collective::SendRecv));
        assert!(parse_collective("allscatter").is_err());
    }

    #[test]
    fn nccl_tests_flags_parse_as_nccl_tests_spells_them() {
        assert_eq!(parse_data_type("float"), Ok(DataType::Float32));
        assert_eq!(parse_data_type("half"), Ok(DataType::Float16));
        assert_eq!(parse_data_type("bfloat16"), Ok(DataType::Bfloat16));
        assert_eq!(parse_data_type("Float64"), Ok(DataType::Float64));
        assert!(parse_data_type("fp8").is_err());
        assert_eq!(parse_op("sum"), Ok("sum".into()));
        assert!(parse_op("max").is_err_and(|e| e.contains("sum only")));
        assert_eq!(parse_switch("0"), Ok(false));
        assert!(parse_switch("2").is_err());
        assert_eq!(parse_blocking("0"), Ok(0));
        assert!(parse_blocking("1").is_err_and(|e| e.contains("not supported")));
    }

    #[test]
    fn timeouts_must_be_positive() {
        assert_eq!(
            parse_seconds("0.5"),
            Ok(std::time::Duration::from_millis(500))
        );
        assert!(parse_seconds("0").is_err());
        assert!(parse_seconds("soon").is_err());
    }
}

/// The group a rank of a multi-node test (`ddp-nodes`, `nccl-nodes`) belongs to: its
/// backend, the nodes by rank, this rank and how it meets the others.
#[derive(Args, Debug, Clone)]
pub struct GroupArgs {
    /// Backend. `sim` is only used when asked for by name.
    #[arg(long, value_enum, ignore_case = true, default_value_t = BackendArg::Cuda, env = keys::ENV_BACKEND)]
    pub backend: BackendArg,

    /// The nodes of the test, by rank, comma-separated. Node count k uses the first k.
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "NODE0,NODE1,...",
        required = true
    )]
    pub nodes: Vec<String>,

    /// This process's rank: its node's position in --nodes; 0 serves the rendezvous.
    #[arg(long, env = keys::ENV_RANK, value_name = "N")]
    pub rank: u32,

    /// How this rank meets the others.
    #[command(flatten)]
    pub meet: RendezvousArgs,
}

impl GroupArgs {
    /// Refuses fewer than `least` nodes, an empty or repeated name, a rank past the list and
    /// a `--node` of `me` that is not this rank's; returns this rank's node.
    pub fn check(&self, me: &RankArgs, least: usize) -> anyhow::Result<&str> {
        if self.nodes.len() < least || self.nodes.iter().any(|n| n.trim().is_empty()) {
            return Err(invalid(format!("--nodes takes {least} or more node names")));
        }
        let mut seen = std::collections::BTreeSet::new();
        if let Some(dup) = self.nodes.iter().find(|n| !seen.insert(n.as_str())) {
            return Err(invalid(format!("--nodes names {dup} twice")));
        }
        let node = self.nodes.get(self.rank as usize).ok_or_else(|| {
            invalid(format!(
                "--rank {} is past the last of the {} nodes in --nodes",
                self.rank,
                self.nodes.len()
            ))
        })?;
        me.check_node(self.rank, node)?;
        Ok(node)
    }

    /// The rendezvous settings of this rank.
    pub fn config(&self) -> anyhow::Result<gpufabric_measure::rendezvous::Config> {
        self.meet.config(self.rank, self.nodes.clone())
    }

    /// The group's nodes in the sim's `fleet`, by rank (those it has).
    pub fn fleet_nodes(&self, fleet: &Fleet) -> Vec<gpufabric_measure::fleet::FleetNode> {
        self.nodes
            .iter()
            .filter_map(|n| fleet.node(n).cloned())
            .collect()
    }

    /// The exit code of a rank that did not meet the others (saying so, `what` named): a
    /// rendezvous this rank could not set up is a usage error, a rank that never came is
    /// not measured.
    pub fn unmet_exit(what: &str, e: &gpufabric_measure::rendezvous::RendezvousError) -> i32 {
        use gpufabric_measure::rendezvous::RendezvousError;
        eprintln!("fabric-agent: {what} not measured: {e}");
        match e {
            RendezvousError::Config(_) | RendezvousError::Listen { .. } => crate::exit::Exit::Usage,
            _ => crate::exit::Exit::NotMeasured,
        }
        .code()
    }
}
