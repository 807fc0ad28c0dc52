//! The cuda backend: real GPUs through cudarc (driver, NCCL, cuBLAS) and nvml-wrapper.
//!
//! One process drives every visible GPU: the NCCL sweep (nccl-tests' single-process mode),
//! the copy-engine pair matrix, the DDP probe and the NVML health snapshot. Libraries are
//! loaded at run time, so the same binary reports a clear error on a host without them.
//!
//! NCCL's INFO log goes to a temporary file (unless `NCCL_DEBUG` is already set) and is read
//! for the transport NCCL chose between each pair of GPUs. Environment variables
//! switch DDP-probe variants for comparisons (`bench/gpu-check.sh ddp-variants`):
//! `FABRIC_DDP_FRAMEWORK_PASSES` (default 1: model autocast's and DDP's memory passes),
//! `FABRIC_DDP_THREAD_PER_GPU` (default 1: one launching thread per GPU),
//! `FABRIC_DDP_COMM_HIGH_PRIORITY` (default 0: all-reduces on a normal-priority stream) and
//! `FABRIC_DDP_TRACE` (default 0: 1 prints the last timed step's timeline on GPU 0).
//! `FABRIC_DDP_SINGLE_PROCESS` (default 1: this process drives every GPU of the DDP
//! probe; 0: one `fabric-agent ddp-worker` process per GPU as PyTorch DDP runs, `ddp_procs`;
//! `FABRIC_DDP_WORKER_EXE` names another agent binary to start).

pub mod ddp;
pub mod ddp_procs;
pub mod gpu;
pub mod health;
pub mod inject;
pub mod nccl;
pub mod pairs;
pub mod transport;

use crate::{CheckError, CheckOptions, Progress};
use gpu::{Gpu, GpuError, HostBuf, Stream};
use gpufabric_api::ResultDocument;
use gpufabric_api::result::{
    Backend, ErrorKind, FULL_SCHEMA, GpuInfo, NcclSweepResult, Phase, PhaseError, Versions,
};
use gpufabric_api::suite::Collective;
use std::time::{Duration, Instant};

/// The message a caught panic carried.
pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
}

/// Runs the node check on every visible GPU.
pub fn node_check(opts: &CheckOptions, progress: Progress) -> Result<ResultDocument, CheckError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(opts, progress))) {
        Ok(r) => r,
        Err(p) => Err(classify_panic(&panic_message(p.as_ref()))),
    }
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
    (0..n)
        .map(|i| Gpu::open(i).map_err(|e| CheckError::Other(format!("GPU {i}: {e}"))))
        .collect()
}

/// Points NCCL's INFO log at a file we parse for transports, unless the user set NCCL_DEBUG.
fn nccl_debug_file() -> Option<std::path::PathBuf> {
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

fn phase_error(phase: Phase, e: &GpuError) -> PhaseError {
    let kind = match e {
        GpuError::Timeout(..) => ErrorKind::Timeout,
        GpuError::Call { .. } => ErrorKind::Failed,
    };
    PhaseError {
        phase,
        kind,
        message: e.to_string(),
    }
}

fn unavailable(phase: Phase, message: &str) -> PhaseError {
    PhaseError {
        phase,
        kind: ErrorKind::Unavailable,
        message: message.to_string(),
    }
}

fn check(opts: &CheckOptions, progress: Progress) -> Result<ResultDocument, CheckError> {
    let started = Instant::now();
    let started_at = rfc3339_now();
    let suite = &opts.suite;
    if suite.nccl_sweep.enabled && suite.nccl_sweep.min_bytes > suite.nccl_sweep.max_bytes {
        return Err(CheckError::InvalidInput(
            "ncclSweep.minBytes is larger than ncclSweep.maxBytes".into(),
        ));
    }
    let gpus = open_gpus()?;
    let found = gpus.len() as u32;
    if let Some(wanted) = opts.expect_gpus
        && found < wanted
    {
        return Err(CheckError::TooFewGpus { found, wanted });
    }
    progress(&format!("{found} GPU(s): {}", gpus[0].name()));
    let debug_file = nccl_debug_file();
    let infos: Vec<GpuInfo> = gpus
        .iter()
        .map(|g| GpuInfo {
            index: g.index,
            product: g.name(),
            uuid: None,
            pci_bus_id: g.pci_bus_id(),
            memory_bytes: g.total_mem(),
        })
        .collect();
    let buses: Vec<(u32, String)> = infos
        .iter()
        .map(|i| (i.index, i.pci_bus_id.clone().unwrap_or_default()))
        .collect();
    let monitor = match health::Monitor::open(buses) {
        Ok(m) => Some(m),
        Err(e) => {
            tracing::warn!(error = %e, "NVML unavailable");
            None
        }
    };
    let mut errors = Vec::new();
    let nccl_ok = nccl::nccl_present();
    let versions = Versions {
        agent: env!("CARGO_PKG_VERSION").to_string(),
        driver: monitor.as_ref().and_then(|m| m.driver_version()),
        cuda: gpu::driver_cuda_version(),
        nccl: if nccl_ok { nccl::nccl_version() } else { None },
    };
    let run = || measure(opts, &gpus, nccl_ok, progress);
    let (measured, xids) = match &monitor {
        Some(m) => m.watch_xids(run),
        None => (run(), Default::default()),
    };
    let (nccl_result, pairs_result, ddp_result, mut phase_errors) = measured;
    errors.append(&mut phase_errors);
    let health = if suite.health.enabled {
        match &monitor {
            Some(m) => Some(m.snapshot(&xids)),
            None => {
                errors.push(unavailable(
                    Phase::Health,
                    "NVML (libnvidia-ml.so.1) could not be loaded",
                ));
                None
            }
        }
    } else {
        None
    };
    let mut transports = Vec::new();
    if let Some(path) = &debug_file {
        if let Ok(log) = std::fs::read_to_string(path) {
            let pairs = transport::parse(&log);
            transports = transport::to_infos(&pairs, &|a, b| {
                monitor.as_ref().and_then(|m| m.nvlink_between(a, b))
            });
        }
        let _ = std::fs::remove_file(path);
    }
    Ok(ResultDocument {
        schema: FULL_SCHEMA.to_string(),
        node: opts.node.clone(),
        backend: Backend::Cuda,
        started_at,
        duration_s: started.elapsed().as_secs_f64(),
        versions,
        gpus: infos,
        nccl: nccl_result,
        pairs: pairs_result,
        ddp: ddp_result,
        health,
        transports,
        nics: crate::nic::read_ports(std::path::Path::new(crate::nic::SYSFS_ROOT)).unwrap_or_else(
            |e| {
                tracing::warn!("network ports not listed: {e}");
                Vec::new()
            },
        ),
        errors,
    })
}

type Measured = (
    Option<NcclSweepResult>,
    Option<gpufabric_api::result::PairMatrix>,
    Option<gpufabric_api::result::DdpResult>,
    Vec<PhaseError>,
);

fn measure(opts: &CheckOptions, gpus: &[Gpu], nccl_ok: bool, progress: Progress) -> Measured {
    let suite = &opts.suite;
    let mut errors = Vec::new();
    let wd = nccl::Watchdog::start();
    let timeout = opts.phase_timeout.max(Duration::from_secs(1));
    let p = |s: &str| progress(s);

    let mut nccl_result = None;
    if suite.nccl_sweep.enabled {
        if !nccl_ok {
            errors.push(unavailable(
                Phase::NcclSweep,
                "libnccl.so could not be loaded (put NCCL's lib directory on LD_LIBRARY_PATH)",
            ));
        } else {
            match sweep(opts, gpus, &wd, timeout, &p) {
                Ok((r, errs)) => {
                    nccl_result = Some(r);
                    errors.extend(errs);
                }
                Err(e) => errors.push(phase_error(Phase::NcclSweep, &e)),
            }
        }
    }

    let mut pairs_result = None;
    if suite.gpu_pairs.enabled {
        let set = pairs::PairSettings {
            bytes: suite.gpu_pairs.bytes as usize,
            bidirectional: suite.gpu_pairs.bidirectional,
            host_copies: suite.gpu_pairs.host_copies,
            repeats: if opts.quick { 2 } else { 5 },
            copies: if opts.quick { 2 } else { 4 },
            timeout,
        };
        match pairs::measure(gpus, &set, &p) {
            Ok(m) => pairs_result = Some(m),
            Err(e) => errors.push(phase_error(Phase::GpuPairs, &e)),
        }
    }

    let mut ddp_result = None;
    let probe = &suite.ddp_probe;
    if probe.enabled {
        if !nccl_ok || !ddp::cublas_present() {
            errors.push(unavailable(
                Phase::DdpProbe,
                "libnccl.so or libcublas.so could not be loaded",
            ));
        } else {
            let counts = opts.ddp_counts(gpus.len() as u32);
            let (warmup, steps) = opts.ddp_steps();
            let set = ddp::DdpSettings {
                hidden: probe.hidden as usize,
                layers: probe.layers as usize,
                batch: probe.batch_per_gpu as usize,
                first_bucket_bytes: probe.first_bucket_bytes,
                bucket_bytes: probe.bucket_bytes,
                warmup,
                steps,
                counts,
                timeout,
                framework_passes: env_flag("FABRIC_DDP_FRAMEWORK_PASSES", true),
                comm_high_priority: env_flag("FABRIC_DDP_COMM_HIGH_PRIORITY", false),
                thread_per_gpu: env_flag("FABRIC_DDP_THREAD_PER_GPU", true),
                worker_exe: ddp_worker_exe(),
                trace: env_flag("FABRIC_DDP_TRACE", false),
            };
            match ddp::probe(gpus, &set, &wd, &p) {
                Ok(r) => ddp_result = Some(r),
                Err(e) => errors.push(phase_error(Phase::DdpProbe, &e)),
            }
        }
    }
    (nccl_result, pairs_result, ddp_result, errors)
}

fn sweep(
    opts: &CheckOptions,
    gpus: &[Gpu],
    wd: &nccl::Watchdog,
    timeout: Duration,
    progress: &dyn Fn(&str),
) -> Result<(NcclSweepResult, Vec<PhaseError>), GpuError> {
    let cfg = &opts.suite.nccl_sweep;
    // `--quick` reduces sizes and iterations the same way for both backends.
    let sizes = opts.sweep_sizes();
    let (warmup, iters) = opts.sweep_iters();
    let max = sizes.iter().copied().max().unwrap_or(8) as usize;
    let elem = cfg.data_type.size() as usize;
    let n = gpus.len();
    // Largest buffer: n elements at least (one per rank) for the smallest sizes.
    let buf = max.max(n * elem) + n * elem;
    let devs: Vec<i32> = gpus.iter().map(|g| g.index as i32).collect();
    let setup = Instant::now();
    let mut comms = nccl::Comms::init(&devs)?;
    let mut ranks = Vec::new();
    for (r, g) in gpus.iter().enumerate() {
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
            send: gpu::DevBuf::new(g, buf)?,
            recv: gpu::DevBuf::new(g, buf)?,
            input,
            host,
            start: gpu::Event::new(g)?,
            end: gpu::Event::new(g)?,
        });
    }
    progress(&format!(
        "nccl sweep: communicators, buffers and inputs ready in {:.2} s",
        setup.elapsed().as_secs_f64()
    ));
    let set = nccl::SweepSettings {
        sizes,
        warmup,
        iters,
        data_type: cfg.data_type,
        timeout,
        check: true,
    };
    let mut out = Vec::new();
    let mut errors = Vec::new();
    let wanted: Vec<Collective> = Collective::ALL
        .into_iter()
        .filter(|c| cfg.collectives.contains(c))
        .collect();
    for c in wanted {
        progress(&format!("nccl sweep: {}", c.nccl_tests_name()));
        match nccl::sweep_collective(c, &mut comms, &mut ranks, wd, &set, progress) {
            Ok(s) => out.push(s),
            Err(e) => {
                let e = nccl::settle(e, &mut comms, wd, timeout);
                let timed_out = matches!(e, GpuError::Timeout(..));
                errors.push(phase_error(Phase::NcclSweep, &e));
                if timed_out {
                    // The communicators are aborted; the rest of the sweep cannot run.
                    break;
                }
            }
        }
    }
    drop(ranks);
    drop(comms);
    Ok((NcclSweepResult { collectives: out }, errors))
}

/// The program the DDP probe starts once per GPU with `FABRIC_DDP_SINGLE_PROCESS=0`:
/// `FABRIC_DDP_WORKER_EXE`, else this program when it is the agent (a test binary has no
/// `ddp-worker` subcommand). `None` (one process drives every GPU, the default: on 4 x H200
/// both modes measured the same multi-GPU step, bench/results/ddp-modes-2026-11-21.md).
fn ddp_worker_exe() -> Option<std::path::PathBuf> {
    if env_flag("FABRIC_DDP_SINGLE_PROCESS", true) {
        return None;
    }
    if let Some(exe) = std::env::var_os("FABRIC_DDP_WORKER_EXE").filter(|v| !v.is_empty()) {
        return Some(exe.into());
    }
    let exe = std::env::current_exe().ok()?;
    let is_agent = exe
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("fabric-agent"));
    if !is_agent {
        tracing::debug!(exe = %exe.display(), "not the agent binary: DDP probe in one process");
    }
    is_agent.then_some(exe)
}

fn env_flag(name: &str, default: bool) -> bool {
    match std::env::var(name) {
        Ok(v) => !matches!(v.trim(), "0" | "false" | "no" | "off"),
        Err(_) => default,
    }
}

/// Current time in RFC 3339 (UTC, seconds).
fn rfc3339_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    rfc3339(secs)
}

fn rfc3339(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    }

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
    fn node_check_without_a_gpu_reports_why_and_never_panics() {
        let opts = CheckOptions {
            node: "n".into(),
            suite: Default::default(),
            quick: true,
            expect_gpus: None,
            phase_timeout: Duration::from_secs(30),
        };
        match node_check(&opts, &|_| {}) {
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
