//! The cuda backend: real GPUs through cudarc (driver, NCCL, cuBLAS) and nvml-wrapper, one
//! process driving every visible GPU; libraries load at run time, so their absence is an error.

pub mod check;
pub mod ddp;
pub mod ddp_nodes;
pub mod ddp_procs;
pub mod gpu;
pub mod gpu_use;
pub mod graph;
pub mod health;
pub mod inject;
pub mod nccl;
pub mod node_pair;
pub mod pairs;
pub mod transport;

use crate::node_check::PhaseRun;
use crate::{CheckError, CheckOptions, Progress};
pub use check::CudaCheck;
use gpu::{Gpu, GpuError, HostBuf, Stream};
use gpu_use::{UseWatch, refuse_gpus_in_use};
pub use gpu_use::{refuse_shared_gpus, refuse_work_started};
use gpufabric_api::ResultDocument;
use gpufabric_api::result::{
    Backend, ErrorKind, GpuInfo, NcclSweepResult, Phase, PhaseError, Versions,
};
use gpufabric_api::suite::Collective;
use std::time::Instant;

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
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            check_values: true,
            ddp_trace: false,
            ddp_worker: None,
            launch_pin: false,
        }
    }
}

/// Runs the node check on every visible GPU ([`CudaCheck`]).
pub fn node_check(
    opts: &CheckOptions,
    cuda: &CudaOptions,
    progress: Progress,
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
pub fn open_gpus() -> Result<Vec<Gpu>, CheckError> {
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

/// Points NCCL's INFO log at a file we parse for transports, unless the user set NCCL_DEBUG.
/// Call before the first NCCL call and before starting threads.
pub fn nccl_debug_file() -> Option<std::path::PathBuf> {
    if std::env::var_os("NCCL_DEBUG").is_some() {
        return None;
    }
    let path = std::env::temp_dir().join(format!("fabric-agent-nccl-{}.log", std::process::id()));
    // SAFETY: called before the first NCCL call and before this backend starts threads;
    // NCCL reads these variables at its initialisation.
    unsafe {
        std::env::set_var("NCCL_DEBUG", "INFO");
        std::env::set_var("NCCL_DEBUG_SUBSYS", "INIT,P2P,SHM,NET");
        std::env::set_var("NCCL_DEBUG_FILE", &path);
    }
    Some(path)
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

/// [`suite_too_large`] on a GPU of known memory.
fn refusal(
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

/// The sweep's error when the node refuses CUDA graph capture (`graphLaunches` > 0): the
/// phase could not run as asked, which is no finding against the node's hardware.
fn graphs_refused(e: &GpuError) -> PhaseError {
    unavailable(
        Phase::NcclSweep,
        &format!(
            "CUDA graphs cannot be used here ({e}); the sweep needs suite.ncclSweep.graphLaunches 0 (node-check -G 0) on this node"
        ),
    )
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

/// Whether the sweep pins its launching thread (`--pin-launch-cpu`): not with graph
/// launches, which come from one thread per GPU; those threads would inherit the pin and
/// share its one CPU (on 4 x H200, all_reduce read 12.7-13.8 us against 9.4-10.1 so).
fn pins_launches(asked: bool, graph_launches: u32) -> bool {
    asked && graph_launches == 0
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

/// The DDP scaling probe.
#[tracing::instrument(name = "ddpProbe", skip_all)]
fn ddp_probe(
    run: &PhaseRun,
    cuda: &CudaOptions,
    gpus: &[Gpu],
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
    ddp::probe(gpus, &set, cuda.ddp_worker.as_deref(), wd, progress)
}

/// The NCCL sweep of every collective of the suite.
#[tracing::instrument(name = "ncclSweep", skip_all)]
fn sweep(
    run: &PhaseRun,
    cuda: &CudaOptions,
    gpus: &[Gpu],
    wd: &nccl::Watchdog,
) -> Result<(NcclSweepResult, Vec<PhaseError>), GpuError> {
    let (opts, timeout, progress) = (run.opts, run.timeout, run.progress);
    let cfg = &opts.suite.nccl_sweep;
    // `--quick` reduces sizes and iterations the same way for both backends.
    let sizes = opts.sweep_sizes();
    let (warmup, iters) = opts.sweep_iters();
    let max = sizes.iter().copied().max().unwrap_or(8);
    let elem = cfg.data_type.size() as usize;
    // Largest buffer: n elements at least (one per rank) for the smallest sizes. Not the
    // largest size exactly, as nccl-tests allocates: on 2 x H100 that build timed all_reduce
    // 16 MiB 1.2% slower than this one in the same call (the buffers' place in the GPU's
    // memory moves that size by about 1%; bench/results/h100x2-2026-11-26-alloc.md).
    let buf = cfg.buffer_bytes(max, gpus.len() as u32) as usize;
    let devs: Vec<i32> = gpus.iter().map(|g| g.index as i32).collect();
    let setup = Instant::now();
    let mut comms = nccl::Comms::init(&devs)?;
    // The send and receive buffers of every rank come first, right after the
    // communicators, as nccl-tests allocates them (before anything else of the sweep's).
    // On 2 x H100 this did not move busbw at 16 MiB - 1 GiB beyond the spread between
    // rounds (bench/results/h100x2-2026-11-26-alloc.md).
    let mut comm_bufs = Vec::new();
    // Which allocators gave the send and receive buffers (nccl::comm_buffer).
    let mut allocators = std::collections::BTreeSet::new();
    for g in gpus {
        let (send, from_send) = nccl::comm_buffer(g, buf)?;
        let (recv, from_recv) = nccl::comm_buffer(g, buf)?;
        allocators.extend([from_send, from_recv]);
        comm_bufs.push((send, recv));
    }
    let mut ranks = Vec::new();
    for ((r, g), (send, recv)) in gpus.iter().enumerate().zip(comm_bufs) {
        let mut host = HostBuf::new(g, buf)?;
        let count = (buf / elem) as u64;
        nccl::fill_inputs(cfg.data_type, r as u64, count, host.as_mut_slice());
        let input = gpu::DevBuf::new(g, buf)?;
        let stream = Stream::new(g)?;
        stream.memcpy_htod(input.ptr, &host, buf)?;
        stream.sync()?;
        ranks.push(nccl::Rank {
            gpu: g,
            stream,
            send,
            recv,
            input,
            host,
            start: gpu::Event::new(g)?,
            end: gpu::Event::new(g)?,
        });
    }
    progress(&format!(
        "nccl sweep: communicators, buffers ({}) and inputs ready in {:.2} s",
        allocators.into_iter().collect::<Vec<_>>().join("; "),
        setup.elapsed().as_secs_f64()
    ));
    let mut set = nccl::SweepSettings {
        sizes,
        warmup,
        iters,
        data_type: cfg.data_type,
        timeout,
        check: cuda.check_values,
        launch: None,
        graph_launches: cfg.graph_launches,
    };
    if set.graph_launches > 0 {
        progress(&format!(
            "nccl sweep: each block records its {iters} iterations into a CUDA graph per GPU and \
             times {} launches of them (nccl-tests' -G {0}), from one thread per GPU{}",
            set.graph_launches,
            if cuda.launch_pin {
                "; --pin-launch-cpu does not apply to them"
            } else {
                ""
            }
        ));
    }
    let launch_pin = pins_launches(cuda.launch_pin, set.graph_launches);
    let mut out = Vec::new();
    let mut errors = Vec::new();
    let wanted: Vec<Collective> = Collective::ALL
        .into_iter()
        .filter(|c| cfg.collectives.contains(c))
        .collect();
    for c in wanted {
        // Small sizes time the host's launches: when asked, time each collective's iterations
        // from the CPU that runs a fixed piece of work fastest now (crate::launch_cpu).
        set.launch = None;
        if launch_pin {
            match crate::launch_cpu::probe() {
                Ok(launch) => {
                    progress(&format!(
                        "nccl sweep: {}, {}",
                        c.nccl_tests_name(),
                        launch.choice.describe()
                    ));
                    set.launch = Some(launch);
                }
                Err(e) => progress(&format!(
                    "nccl sweep: {}, launching thread left unpinned ({e})",
                    c.nccl_tests_name()
                )),
            }
        } else {
            progress(&format!("nccl sweep: {}", c.nccl_tests_name()));
        }
        match nccl::sweep_collective(c, &mut comms, &mut ranks, wd, &set, progress) {
            Ok(s) => out.push(s),
            Err(e) => {
                let e = nccl::settle(e, &mut comms, wd, timeout);
                progress(&format!("nccl sweep: {} failed: {e}", c.nccl_tests_name()));
                match e {
                    GpuError::Timeout(..) | GpuError::MemoryFull { .. } => {
                        // After a timeout the communicators are aborted; on a full GPU the
                        // next collective would meet the same memory: the rest cannot run.
                        errors.push(phase_error(Phase::NcclSweep, &e));
                        break;
                    }
                    GpuError::Refused { .. } => {
                        // The node's software refuses CUDA graphs: every collective would
                        // meet the same refusal, and it says nothing about the GPUs.
                        errors.push(graphs_refused(&e));
                        break;
                    }
                    GpuError::SuiteTooLarge { .. } => {
                        // The buffers are the sweep's, whichever collective met the limit.
                        errors.push(phase_error(Phase::NcclSweep, &e));
                        break;
                    }
                    // NCCL refusing its settings (NCCL_ALGO naming an algorithm this
                    // collective lacks) may refuse this collective alone: go on.
                    GpuError::Call { .. } | GpuError::Misconfigured { .. } => {
                        errors.push(phase_error(Phase::NcclSweep, &e))
                    }
                }
            }
        }
    }
    drop(ranks);
    drop(comms);
    Ok((
        NcclSweepResult {
            collectives: out,
            graph_launches: set.graph_launches,
        },
        errors,
    ))
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
    fn the_launching_thread_is_pinned_only_when_asked_and_without_graphs() {
        assert!(pins_launches(true, 0));
        assert!(!pins_launches(true, 10));
        assert!(!pins_launches(false, 0));
    }

    #[test]
    fn a_node_that_refuses_cuda_graphs_gets_no_fault_from_the_sweep() {
        let refused = GpuError::Refused {
            call: "cuGraphInstantiate",
            detail: "operation not permitted when stream is capturing".into(),
        };
        let e = graphs_refused(&refused);
        assert_eq!(e.phase, Phase::NcclSweep);
        assert_eq!(e.kind, ErrorKind::Unavailable);
        assert!(
            e.message.contains("cuGraphInstantiate was refused")
                && e.message.contains("graphLaunches 0"),
            "{}",
            e.message
        );
        assert_eq!(
            phase_error(Phase::NcclSweep, &refused).kind,
            ErrorKind::Unavailable
        );
        let fault = GpuError::Call {
            call: "cuGraphLaunch",
            detail: "an illegal memory access was encountered".into(),
        };
        assert_eq!(
            phase_error(Phase::NcclSweep, &fault).kind,
            ErrorKind::Failed
        );
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
