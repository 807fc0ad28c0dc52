//! The cuda backend of the node check ([`crate::node_check`]): every visible GPU, driven by
//! this one process. NCCL's INFO log goes to a temporary file (unless `NCCL_DEBUG` is
//! already set) and is read for the transport NCCL chose between each pair of GPUs.

use super::gpu::Gpu;
use super::gpu_use::in_use;
use super::{
    CudaOptions, blocking_launches, classify_panic, compute, copy_matrix, count_gpus, ddp,
    ddp_probe, document, health, nccl, open_devices, open_monitor, phase_error, suite_too_large,
    transport, unavailable,
};
use crate::gpu_use::GpuUse;
use crate::node_check::{CheckBackend, Look, PhaseRun, Swept, Xids};
use crate::{CheckError, CheckOptions, Progress};
use gpufabric_api::ResultDocument;
use gpufabric_api::result::{
    ComputeResult, DdpResult, GpuInfo, HealthSnapshot, PairMatrix, Phase, PhaseError,
};
use std::cell::OnceCell;
use std::path::PathBuf;
use std::time::Duration;

/// `run` with a timeout of one second at least, whatever the phase timeout asks.
fn floored<'a>(run: &PhaseRun<'a>) -> PhaseRun<'a> {
    PhaseRun {
        timeout: run.timeout.max(Duration::from_secs(1)),
        ..*run
    }
}

/// The node check on this process's GPUs. Its fields drop in order: the watchdog before the
/// GPUs' contexts, NVML last.
pub struct CudaCheck {
    options: CudaOptions,
    /// Aborts collectives that do not finish in time; started by the first phase that
    /// runs NCCL, once NCCL's log settings are made.
    watchdog: OnceCell<nccl::Watchdog>,
    /// Open once [`CheckBackend::open`] ran.
    gpus: Vec<Gpu>,
    found: u32,
    nccl_ok: bool,
    debug_file: Option<PathBuf>,
    monitor: Option<health::Monitor>,
}

impl CudaCheck {
    /// The check as the agent's command line set it.
    pub fn new(options: CudaOptions) -> CudaCheck {
        CudaCheck {
            options,
            watchdog: OnceCell::new(),
            gpus: Vec::new(),
            found: 0,
            nccl_ok: false,
            debug_file: None,
            monitor: None,
        }
    }

    fn watchdog(&self) -> &nccl::Watchdog {
        self.watchdog.get_or_init(nccl::Watchdog::start)
    }

    /// [`blocking_launches`] with this process's environment.
    fn blocking(&self) -> Option<String> {
        blocking_launches(
            self.gpus.len(),
            std::env::var("CUDA_LAUNCH_BLOCKING").ok().as_deref(),
        )
    }
}

impl CheckBackend for CudaCheck {
    fn count_gpus(&mut self) -> Result<u32, CheckError> {
        self.found = count_gpus()?;
        self.monitor = open_monitor(self.found);
        Ok(self.found)
    }

    /// What NVML reads now: nothing without NVML.
    fn gpu_use(&mut self, _look: Look) -> Vec<GpuUse> {
        in_use(self.monitor.as_ref())
    }

    fn health_alone(&self, _progress: Progress) -> Option<HealthSnapshot> {
        self.monitor
            .as_ref()
            .map(|m| m.snapshot(&Default::default()))
    }

    /// The GPUs as their contexts describe them once open; before, as NVML does. The UUID is
    /// NVML's either way (a context does not say it), matched by the bus id CUDA reports.
    fn document(&self, opts: &CheckOptions, started_at: String) -> ResultDocument {
        let nvml = self
            .monitor
            .as_ref()
            .map(health::Monitor::gpu_infos)
            .unwrap_or_default();
        let infos: Vec<GpuInfo> = if self.gpus.is_empty() {
            nvml
        } else {
            self.gpus
                .iter()
                .map(|g| {
                    let pci_bus_id = g.pci_bus_id();
                    let uuid = nvml
                        .iter()
                        .find(|n| pci_bus_id.is_some() && n.pci_bus_id == pci_bus_id)
                        .and_then(|n| n.uuid.clone());
                    GpuInfo {
                        index: g.index,
                        product: g.name(),
                        uuid,
                        pci_bus_id,
                        memory_bytes: g.total_mem(),
                    }
                })
                .collect()
        };
        document(opts, self.monitor.as_ref(), infos, started_at)
    }

    fn open(&mut self, opts: &CheckOptions, progress: Progress) -> Result<(), CheckError> {
        self.gpus = open_devices(self.found)?;
        if let Some(why) = suite_too_large(opts, &self.gpus) {
            return Err(CheckError::InvalidInput(why));
        }
        let product = self.gpus.first().map(Gpu::name).unwrap_or_default();
        progress(&format!("{} GPU(s): {product}", self.found));
        self.debug_file = nccl::debug_file();
        self.nccl_ok = nccl::nccl_present();
        Ok(())
    }

    fn setup(&self, _run: &PhaseRun) -> Result<(), PhaseError> {
        Ok(())
    }

    /// NVML's XID events; none without NVML.
    fn watch_xids(&self, measure: &mut dyn FnMut()) -> Xids {
        match &self.monitor {
            Some(m) => m.watch_xids(measure).1,
            None => {
                measure();
                Xids::new()
            }
        }
    }

    fn nccl_sweep(&self, run: &PhaseRun) -> Result<Swept, PhaseError> {
        if !self.nccl_ok {
            return Err(unavailable(
                Phase::NcclSweep,
                "libnccl.so could not be loaded (put NCCL's lib directory on LD_LIBRARY_PATH)",
            ));
        }
        if let Some(why) = self.blocking() {
            return Err(unavailable(Phase::NcclSweep, &why));
        }
        nccl::phase::sweep(&floored(run), &self.options, &self.gpus, self.watchdog())
            .map_err(|e| phase_error(Phase::NcclSweep, &e))
    }

    fn gpu_pairs(&self, run: &PhaseRun) -> Result<PairMatrix, PhaseError> {
        copy_matrix(&floored(run), &self.gpus).map_err(|e| phase_error(Phase::GpuPairs, &e))
    }

    fn ddp_probe(&self, run: &PhaseRun) -> Result<DdpResult, PhaseError> {
        if !self.nccl_ok || !ddp::cublas_present() {
            return Err(unavailable(
                Phase::DdpProbe,
                "libnccl.so or libcublas.so could not be loaded",
            ));
        }
        // One process per GPU (--ddp-process-per-gpu) is not affected.
        if let Some(why) = self
            .blocking()
            .filter(|_| self.options.ddp_worker.is_none())
        {
            return Err(unavailable(Phase::DdpProbe, &why));
        }
        let log = self.debug_file.as_deref();
        ddp_probe(
            &floored(run),
            &self.options,
            &self.gpus,
            log,
            self.watchdog(),
        )
        .map_err(|e| phase_error(Phase::DdpProbe, &e))
    }

    fn compute(&self, run: &PhaseRun) -> Result<ComputeResult, PhaseError> {
        if !ddp::cublas_present() {
            return Err(unavailable(
                Phase::Compute,
                "libcublas.so could not be loaded (put cuBLAS's lib directory on LD_LIBRARY_PATH)",
            ));
        }
        compute::compute_phase(
            &floored(run),
            &self.gpus,
            self.monitor.as_ref(),
            self.options.flip_sdc_bit,
        )
        .map_err(|e| phase_error(Phase::Compute, &e))
    }

    /// NVML's snapshot, or `unavailable` without NVML.
    fn health(&self, xids: &Xids, _run: &PhaseRun) -> Result<HealthSnapshot, PhaseError> {
        match &self.monitor {
            Some(m) => Ok(m.snapshot(xids)),
            None => Err(unavailable(
                Phase::Health,
                "NVML (libnvidia-ml.so.1) could not be loaded",
            )),
        }
    }

    /// The transports NCCL's log names; the log file is removed.
    fn finish(&mut self, doc: &mut ResultDocument) {
        let Some(path) = &self.debug_file else {
            return;
        };
        if let Ok(log) = std::fs::read_to_string(path) {
            let pairs = transport::parse(&log);
            doc.transports = transport::to_infos(&pairs, &|a, b| {
                self.monitor.as_ref().and_then(|m| m.nvlink_between(a, b))
            });
        }
        let _ = std::fs::remove_file(path);
    }

    /// A panic from the dynamic loader means a library or symbol is missing.
    fn panicked(&self, message: &str) -> CheckError {
        classify_panic(message)
    }
}
