//! The cuda backend: real GPUs through cudarc (driver, NCCL, cuBLAS) and nvml-wrapper, one
//! process driving every visible GPU; libraries load at run time, so their absence is an error.

mod check;
mod clique;
mod compute;
pub mod ddp;
pub mod ddp_nodes;
pub(crate) mod gpu;
mod gpu_use;
pub(crate) mod graph;
pub(crate) mod health;
pub mod inject;
pub mod nccl;
pub mod nccl_nodes;
pub mod node_pair;
pub(crate) mod pairs;
mod software;
pub(crate) mod transport;

use crate::node_check::PhaseRun;
use crate::{CheckError, CheckOptions};
pub use check::CudaCheck;
use gpu::{Gpu, GpuError};
use gpu_use::refuse_gpus_in_use;
pub(crate) use gpu_use::refuse_shared_gpus;
use gpu_use::refuse_work_started;
use gpufabric_api::ResultDocument;
use gpufabric_api::result::{Backend, ErrorKind, GpuInfo, Phase, PhaseError, Versions};

pub(crate) use crate::node_check::panic_message;

/// How the cuda backend runs: the agent's command line decides.
#[derive(Debug, Clone, PartialEq)]
pub struct CudaOptions {
    /// Check every result of the NCCL sweep for wrong elements (nccl-tests' `-c 1`).
    pub check_values: bool,
    /// Print the timeline of one step of the DDP probe on progress.
    pub ddp_trace: bool,
    /// Run the DDP probe with one process per GPU, as PyTorch DDP runs: this program
    /// started once per rank with its `ddp-worker` subcommand. `None`: this process drives
    /// every GPU (the default: on 4 x H200 both modes measured the same multi-GPU step,
    /// bench/results/ddp-modes-2026-11-21.md).
    pub ddp_worker: Option<std::path::PathBuf>,
    /// Time each collective of the NCCL sweep from the CPU that runs a fixed piece of work
    /// fastest before it ([`crate::launch_cpu`]); false (the default) leaves the thread
    /// where the scheduler puts it, as nccl-tests does.
    pub launch_pin: bool,
    /// A test hook: flip one bit of this GPU's first silent-data-corruption output in device
    /// memory before it is read, so that the check's detection is shown end to end. Never a
    /// real fault, and never set in production.
    pub flip_sdc_bit: Option<u32>,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            check_values: true,
            ddp_trace: false,
            ddp_worker: None,
            launch_pin: false,
            flip_sdc_bit: None,
        }
    }
}

/// Runs the node check on every visible GPU ([`CudaCheck`]).
#[cfg(test)]
fn node_check(
    opts: &CheckOptions,
    cuda: &CudaOptions,
    progress: crate::Progress,
) -> Result<ResultDocument, CheckError> {
    crate::node_check::run(&mut CudaCheck::new(cuda.clone()), opts, progress)
}

/// A panic from the dynamic loader means a library or symbol is missing.
fn classify_panic(msg: &str) -> CheckError {
    if msg.contains("Unable to dynamically load") || msg.contains("Missing symbol") {
        let library = msg
            .split('"')
            .nth(1)
            .map(|s| format!("lib{s}"))
            .unwrap_or_else(|| "a CUDA library".into());
        CheckError::LibraryMissing {
            library,
            detail: msg.to_string(),
        }
    } else {
        CheckError::Other(format!("the cuda backend failed: {msg}"))
    }
}

/// Opens the driver and every visible GPU, or says why not.
pub(crate) fn open_gpus() -> Result<Vec<Gpu>, CheckError> {
    open_devices(count_gpus()?)
}

/// Initialises the driver and counts the visible GPUs, creating no context yet.
pub(crate) fn count_gpus() -> Result<u32, CheckError> {
    if !gpu::driver_present() {
        return Err(CheckError::LibraryMissing {
            library: "libcuda.so (NVIDIA driver)".into(),
            detail: "the CUDA driver library is not installed or not on the library path; \
                     this host has no usable NVIDIA GPU"
                .into(),
        });
    }
    let n = gpu::init_and_count().map_err(|e| CheckError::NoGpu(e.to_string()))?;
    if n == 0 {
        return Err(CheckError::NoGpu("the CUDA driver sees no GPU".into()));
    }
    Ok(n)
}

/// Opens GPUs `0..n` with their primary contexts.
pub(crate) fn open_devices(n: u32) -> Result<Vec<Gpu>, CheckError> {
    (0..n)
        .map(|i| Gpu::open(i).map_err(|e| CheckError::Other(format!("GPU {i}: {e}"))))
        .collect()
}

/// NVML over GPUs `0..n` (CUDA's order, matched by PCI bus id read without a context), or
/// None where NVML does not load.
pub(crate) fn open_monitor(n: u32) -> Option<health::Monitor> {
    let buses: Vec<(u32, String)> = (0..n)
        .map(|i| (i, gpu::device_bus_id(i).unwrap_or_default()))
        .collect();
    match health::Monitor::open(buses) {
        Ok(m) => Some(m),
        Err(e) => {
            tracing::warn!(error = %e, "NVML unavailable");
            None
        }
    }
}

/// A phase's error as the result document carries it: a timeout, a failure of the node,
/// or a phase that could not run here (the node's software refused a feature, its memory
/// was taken, or the test's suite or agent env asked for what no node of it can do; the
/// suite's own sizes are named).
fn phase_error(phase: Phase, e: &GpuError) -> PhaseError {
    let kind = match e {
        GpuError::Timeout(..) => ErrorKind::Timeout,
        GpuError::Call { .. } => ErrorKind::Failed,
        GpuError::Refused { .. }
        | GpuError::MemoryFull { .. }
        | GpuError::SuiteTooLarge { .. }
        | GpuError::Misconfigured { .. } => ErrorKind::Unavailable,
    };
    let mut message = e.to_string();
    if let GpuError::SuiteTooLarge { .. } = e
        && let Some(field) = gpufabric_api::suite::memory_field(phase)
    {
        message.push_str(&format!(" ({field} sets this phase's buffers: lower it)"));
    }
    PhaseError {
        phase,
        kind,
        message,
    }
}

/// Why the suite cannot run on `gpus` at all: a part whose buffers are larger than the
/// smallest GPU's memory, each named by its field (the node check's phases only; node
/// pairs run in pods of their own).
fn suite_too_large(opts: &CheckOptions, gpus: &[Gpu]) -> Option<String> {
    let smallest = gpus
        .iter()
        .map(|g| (g.total_mem(), g))
        .min_by_key(|(m, _)| *m)?;
    let product = smallest.1.name();
    let gpu = gpufabric_api::validate::memory::GpuMemory {
        product: &product,
        bytes: smallest.0,
        chosen: gpufabric_api::validate::memory::Chosen::ThisNode,
    };
    refusal(opts, gpus.len() as u32, &gpu)
}

/// [`suite_too_large`] on a GPU of known memory (the sim backend's, from its product).
pub(crate) fn refusal(
    opts: &CheckOptions,
    gpus: u32,
    gpu: &gpufabric_api::validate::memory::GpuMemory,
) -> Option<String> {
    let problems: Vec<String> = opts
        .suite
        .memory_needs(gpus, &opts.sweep_sizes())
        .iter()
        .filter(|need| need.phase != Phase::NodePair)
        .filter_map(|need| gpufabric_api::validate::memory::need_problem(need, gpu))
        .map(|p| format!("{}: {}", p.field, p.message))
        .collect();
    (!problems.is_empty()).then(|| {
        format!(
            "the suite does not fit this node's GPUs, so they were not measured: {}",
            problems.join("; ")
        )
    })
}

fn unavailable(phase: Phase, message: &str) -> PhaseError {
    PhaseError {
        phase,
        kind: ErrorKind::Unavailable,
        message: message.to_string(),
    }
}

/// The document of a check on `gpus`, nothing measured yet: versions, GPUs, network ports.
pub(crate) fn document(
    opts: &CheckOptions,
    monitor: Option<&health::Monitor>,
    gpus: Vec<GpuInfo>,
    started_at: String,
) -> ResultDocument {
    let nccl_ok = nccl::nccl_present();
    let versions = Versions {
        agent: env!("CARGO_PKG_VERSION").to_string(),
        driver: monitor.and_then(health::Monitor::driver_version),
        cuda: gpu::driver_cuda_version(),
        nccl: if nccl_ok { nccl::nccl_version() } else { None },
        // The agent fills in its NCCL config files' digest: it reads those files.
        nccl_conf: None,
        vbios: monitor
            .map(health::Monitor::vbios_versions)
            .unwrap_or_default(),
        fabric_manager: monitor.and_then(health::Monitor::fabric_manager),
    };
    let mut doc =
        ResultDocument::unmeasured(opts.node.clone(), Backend::Cuda, started_at, versions, gpus);
    doc.nics =
        crate::nic::read_ports(std::path::Path::new(crate::nic::SYSFS_ROOT)).unwrap_or_else(|e| {
            tracing::warn!("network ports not listed: {e}");
            Vec::new()
        });
    doc
}

/// Why NCCL cannot run in this process, if so: with `CUDA_LAUNCH_BLOCKING=1` (`env`) the
/// first GPU's kernel launch waits for kernels the one thread has not yet launched on the
/// other GPUs, and a collective over `gpus` > 1 GPUs of one process never ends (NCCL's
/// maintainers say so; one 4 x H200 sweep hung in its first all_reduce). That is the
/// agent's environment, not the node's hardware: the phase is Unavailable, not a hang.
pub(crate) fn blocking_launches(gpus: usize, env: Option<&str>) -> Option<String> {
    (gpus > 1 && env.is_some_and(|v| v.trim() == "1")).then(|| {
        format!(
            "CUDA_LAUNCH_BLOCKING=1 is set: NCCL deadlocks when one process drives {gpus} GPUs with blocking launches; unset it in the agent's environment"
        )
    })
}

/// The GPU-pair copy matrix.
#[tracing::instrument(name = "gpuPairs", skip_all)]
fn copy_matrix(
    run: &PhaseRun,
    gpus: &[Gpu],
) -> Result<gpufabric_api::result::PairMatrix, GpuError> {
    let (opts, timeout, progress) = (run.opts, run.timeout, run.progress);
    let suite = &opts.suite;
    let set = pairs::PairSettings {
        bytes: suite.gpu_pairs.bytes as usize,
        bidirectional: suite.gpu_pairs.bidirectional,
        host_copies: suite.gpu_pairs.host_copies,
        repeats: if opts.quick { 2 } else { 5 },
        copies: if opts.quick { 2 } else { 4 },
        timeout,
    };
    pairs::measure(gpus, &set, progress)
}

/// The DDP scaling probe; its worker processes, if any, keep out of `nccl_log`.
#[tracing::instrument(name = "ddpProbe", skip_all)]
fn ddp_probe(
    run: &PhaseRun,
    cuda: &CudaOptions,
    gpus: &[Gpu],
    nccl_log: Option<&std::path::Path>,
    wd: &nccl::Watchdog,
) -> Result<gpufabric_api::result::DdpResult, GpuError> {
    let (opts, timeout, progress) = (run.opts, run.timeout, run.progress);
    let probe = &opts.suite.ddp_probe;
    let (warmup, steps) = opts.ddp_steps();
    let set = ddp::DdpSettings {
        hidden: probe.hidden as usize,
        layers: probe.layers as usize,
        batch: probe.batch_per_gpu as usize,
        first_bucket_bytes: probe.first_bucket_bytes,
        bucket_bytes: probe.bucket_bytes,
        warmup,
        steps,
        counts: opts.ddp_counts(gpus.len() as u32),
        timeout,
        trace: cuda.ddp_trace,
    };
    let worker = cuda.ddp_worker.as_deref();
    ddp::probe(gpus, &set, worker, nccl_log, wd, progress)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_missing_library_panic_becomes_library_missing() {
        let e = classify_panic(
            "Unable to dynamically load the \"nccl\" shared library - searched for library names: [..]",
        );
        assert!(
            matches!(e, CheckError::LibraryMissing { ref library, .. } if library == "libnccl")
        );
        assert!(matches!(
            classify_panic("index out of bounds"),
            CheckError::Other(_)
        ));
    }

    #[test]
    fn blocking_launches_make_nccl_unavailable_only_where_one_process_drives_several_gpus() {
        assert!(blocking_launches(4, None).is_none());
        assert!(blocking_launches(4, Some("0")).is_none());
        assert!(
            blocking_launches(1, Some("1")).is_none(),
            "one GPU cannot deadlock"
        );
        let why = blocking_launches(4, Some("1")).expect("refused");
        assert!(
            why.contains("CUDA_LAUNCH_BLOCKING=1") && why.contains("4 GPUs"),
            "{why}"
        );
        assert_eq!(
            unavailable(Phase::NcclSweep, &why).kind,
            ErrorKind::Unavailable
        );
    }

    #[test]
    fn a_suite_larger_than_the_nodes_gpus_is_refused_as_input_naming_the_field() {
        use gpufabric_api::validate::memory::{Chosen, GpuMemory};
        let mut opts = CheckOptions {
            node: "n".into(),
            suite: Default::default(),
            quick: false,
            expect_gpus: None,
            phase_timeout: Duration::from_secs(30),
            shared_gpus: false,
        };
        let h100 = GpuMemory {
            product: "NVIDIA H100 80GB HBM3",
            bytes: 81_559 << 20,
            chosen: Chosen::ThisNode,
        };
        assert_eq!(refusal(&opts, 8, &h100), None, "the default suite fits");
        opts.suite.nccl_sweep.max_bytes = 1 << 40;
        // Node pairs run in pods of their own: the node check does not refuse them.
        opts.suite.node_pairs.enabled = true;
        opts.suite.node_pairs.bytes = 1 << 40;
        let why = refusal(&opts, 8, &h100).expect("1 TiB does not fit");
        assert!(
            why.contains("suite.ncclSweep.maxBytes: needs 3.0 TiB on each GPU")
                && why.contains("this node's NVIDIA H100 80GB HBM3 GPUs hold (79.6 GiB)")
                && !why.contains("nodePairs"),
            "{why}"
        );
        assert_eq!(CheckError::InvalidInput(why).exit_code(), 2);
        // A quick check runs sizes up to 64 MiB only: it fits.
        opts.quick = true;
        assert_eq!(refusal(&opts, 8, &h100), None);
    }

    #[test]
    fn node_check_without_a_gpu_reports_why_and_never_panics() {
        let opts = CheckOptions {
            node: "n".into(),
            suite: Default::default(),
            quick: true,
            expect_gpus: None,
            phase_timeout: Duration::from_secs(30),
            shared_gpus: false,
        };
        match node_check(&opts, &CudaOptions::default(), &|_| {}) {
            Ok(doc) => {
                // A host with GPUs: the document must carry them.
                assert!(!doc.gpus.is_empty());
                eprintln!("GPU present: measured {} GPU(s)", doc.gpus.len());
            }
            Err(e) => {
                eprintln!("skipped: no GPU ({e})");
                assert!(matches!(
                    e,
                    CheckError::LibraryMissing { .. } | CheckError::NoGpu(_)
                ));
            }
        }
    }
}
