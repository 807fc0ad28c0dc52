//! The node check, backend-neutral: the order of its steps, the refusals on the way and the
//! result document they add up to; the cuda and sim backends ([`CheckBackend`]) measure
//! only the phases.
//!
//! In order: the suite's sweep sizes are checked; the node must have a GPU, and as many as
//! asked for ([`CheckOptions::expect_gpus`]); other work on the GPUs ends the check
//! ([`crate::gpu_use`]), or leaves a document of their health alone; the backend opens the
//! GPUs (and may refuse a suite they cannot hold); the setup phase runs, whose failure ends
//! the check with the document so far; then the NCCL sweep, the GPU-pair copies, the DDP
//! probe and the compute checks (on GPUs the probe has warmed), while XIDs are watched; then the health snapshot, with the XIDs raised meanwhile;
//! last, other work that started during the measurements makes them not the node's (unless
//! the GPUs are shared by request, a phase timed out or a GPU raised an XID).

use crate::gpu_use::GpuUse;
use crate::{CheckError, CheckOptions, Progress};
use gpufabric_api::ResultDocument;
use gpufabric_api::result::{
    ComputeResult, DdpResult, HealthSnapshot, NcclSweepResult, PairMatrix, PhaseError,
};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The XIDs each GPU (by index) raised while the check measured.
pub type Xids = BTreeMap<u32, Vec<u64>>;

/// When the check looks at what else the GPUs have in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Look {
    /// Before the check made any context of its own: all of it is other work's.
    Start,
    /// Once the check's contexts are open, to set the end beside.
    Opened,
    /// After the measurements.
    End,
}

/// What each phase of a check is given.
#[derive(Clone, Copy)]
pub struct PhaseRun<'a> {
    pub opts: &'a CheckOptions,
    /// Work that does not finish in time is aborted and is the phase's `timeout` error.
    pub timeout: Duration,
    pub progress: Progress<'a>,
}

/// The NCCL sweep, and the errors of the collectives that failed while others ran.
pub type Swept = (NcclSweepResult, Vec<PhaseError>);

/// How one backend runs the parts of a node check; the order is [`run`]'s.
pub trait CheckBackend {
    /// The node's GPUs: [`CheckError::NoGpu`] or [`CheckError::LibraryMissing`] when it has
    /// none or none can be used.
    fn count_gpus(&mut self) -> Result<u32, CheckError>;

    /// What the GPUs have in use at `look`; nothing where the backend cannot tell.
    fn gpu_use(&mut self, look: Look) -> Vec<GpuUse>;

    /// The GPUs' health read without a context of this check (other work holds them), or
    /// None where it cannot be read.
    fn health_alone(&self, progress: Progress) -> Option<HealthSnapshot>;

    /// The document of the node before any phase ran: versions and GPUs.
    fn document(&self, opts: &CheckOptions, started_at: String) -> ResultDocument;

    /// Makes the GPUs ready to measure (this check's contexts are open afterwards);
    /// [`CheckError::InvalidInput`] when the suite cannot run on them at all.
    fn open(&mut self, opts: &CheckOptions, progress: Progress) -> Result<(), CheckError>;

    /// The setup phase; its error ends the check with the document so far.
    fn setup(&self, run: &PhaseRun) -> Result<(), PhaseError>;

    /// Runs `measure` (the measuring phases) and returns the XIDs the GPUs raised meanwhile.
    fn watch_xids(&self, measure: &mut dyn FnMut()) -> Xids;

    /// The NCCL sweep ([`Swept`]).
    fn nccl_sweep(&self, run: &PhaseRun) -> Result<Swept, PhaseError>;

    /// The GPU-pair copy matrix.
    fn gpu_pairs(&self, run: &PhaseRun) -> Result<PairMatrix, PhaseError>;

    /// The DDP scaling probe.
    fn ddp_probe(&self, run: &PhaseRun) -> Result<DdpResult, PhaseError>;

    /// The compute checks ([`CheckOptions::compute`]), every GPU at once.
    fn compute(&self, run: &PhaseRun) -> Result<ComputeResult, PhaseError>;

    /// The health snapshot, with the XIDs the measurements raised.
    fn health(&self, xids: &Xids, run: &PhaseRun) -> Result<HealthSnapshot, PhaseError>;

    /// Adds what the backend learnt while the phases ran (the transports between GPUs).
    fn finish(&mut self, doc: &mut ResultDocument);

    /// The error of a check that panicked with `message`.
    fn panicked(&self, message: &str) -> CheckError {
        CheckError::Other(format!("the node check failed: {message}"))
    }
}

/// Runs the node check on `backend` (see the module doc). `startedAt` and `durationS` are
/// the real time of the call; a panic is the backend's error, never the process's end.
pub fn run(
    backend: &mut dyn CheckBackend,
    opts: &CheckOptions,
    progress: Progress,
) -> Result<ResultDocument, CheckError> {
    let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        check(&mut *backend, opts, progress)
    }));
    match checked {
        Ok(r) => r,
        Err(p) => Err(backend.panicked(&panic_message(p.as_ref()))),
    }
}

/// The message a caught panic carried.
pub(crate) fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "unknown panic".into())
}

fn check(
    b: &mut dyn CheckBackend,
    opts: &CheckOptions,
    progress: Progress,
) -> Result<ResultDocument, CheckError> {
    let started = Instant::now();
    let started_at = gpufabric_api::rfc3339::now();
    let suite = &opts.suite;
    if suite.nccl_sweep.enabled && suite.nccl_sweep.min_bytes > suite.nccl_sweep.max_bytes {
        return Err(CheckError::InvalidInput(
            "ncclSweep.minBytes is larger than ncclSweep.maxBytes".into(),
        ));
    }
    crate::activity::enter("finding the GPUs");
    let found = b.count_gpus()?;
    if let Some(wanted) = opts.expect_gpus
        && found < wanted
    {
        return Err(CheckError::TooFewGpus { found, wanted });
    }
    let _span = tracing::info_span!("node_check", node = %opts.node).entered();
    let before = b.gpu_use(Look::Start);
    if let Err(refused) = crate::gpu_use::refuse(&before, opts.shared_gpus, progress) {
        let b = &*b;
        return crate::gpu_use::health_alone(
            refused,
            suite,
            progress,
            || b.health_alone(progress),
            || {
                let mut doc = b.document(opts, started_at);
                doc.duration_s = started.elapsed().as_secs_f64();
                doc
            },
        );
    }
    crate::activity::enter("opening the GPUs (CUDA, NCCL and NVML setup)");
    b.open(opts, progress)?;
    let opened = b.gpu_use(Look::Opened);
    let run = PhaseRun {
        opts,
        timeout: opts.phase_timeout,
        progress,
    };
    let mut doc = b.document(opts, started_at);
    crate::activity::enter("setting up the phases");
    if let Err(e) = b.setup(&run) {
        doc.errors.push(e);
        doc.duration_s = started.elapsed().as_secs_f64();
        return Ok(doc);
    }
    let xids = {
        let b = &*b;
        let doc = &mut doc;
        b.watch_xids(&mut || {
            if suite.nccl_sweep.enabled {
                crate::activity::enter("NCCL sweep");
                match b.nccl_sweep(&run) {
                    Ok((n, errors)) => {
                        doc.nccl = Some(n);
                        doc.errors.extend(errors);
                    }
                    Err(e) => doc.errors.push(e),
                }
            }
            if suite.gpu_pairs.enabled {
                crate::activity::enter("GPU pairs");
                match b.gpu_pairs(&run) {
                    Ok(p) => doc.pairs = Some(p),
                    Err(e) => doc.errors.push(e),
                }
            }
            if suite.ddp_probe.enabled {
                crate::activity::enter("DDP probe");
                match b.ddp_probe(&run) {
                    Ok(d) => doc.ddp = Some(d),
                    Err(e) => doc.errors.push(e),
                }
            }
            if suite.compute.enabled() {
                crate::activity::enter("compute checks");
                match b.compute(&run) {
                    Ok(c) => doc.compute = Some(c),
                    Err(e) => doc.errors.push(e),
                }
            }
        })
    };
    if suite.health.enabled {
        crate::activity::enter("health snapshot (NVML)");
        match b.health(&xids, &run) {
            Ok(h) => doc.health = Some(h),
            Err(e) => doc.errors.push(e),
        }
    }
    crate::activity::enter("tearing down (NCCL communicators, CUDA contexts)");
    b.finish(&mut doc);
    // A phase that timed out leaves a thread holding the check's own memory; an XID is the
    // GPU's evidence whatever ran beside it.
    if !(opts.shared_gpus || crate::gpu_use::timed_out(&doc.errors) || !xids.is_empty()) {
        crate::gpu_use::refuse_after(&opened, &b.gpu_use(Look::End))?;
    }
    doc.duration_s = started.elapsed().as_secs_f64();
    Ok(doc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufabric_api::result::{Backend, ErrorKind, Phase, Versions};
    use std::cell::RefCell;

    fn unavailable(phase: Phase) -> PhaseError {
        PhaseError {
            phase,
            kind: ErrorKind::Unavailable,
            message: String::new(),
        }
    }

    /// Records the order of the calls; its phases cannot run, and its GPU raises XID 79
    /// while measured.
    #[derive(Default)]
    struct Recorder {
        calls: RefCell<Vec<&'static str>>,
    }

    impl Recorder {
        fn call<T>(&self, name: &'static str, value: T) -> T {
            self.calls.borrow_mut().push(name);
            value
        }
    }

    impl CheckBackend for Recorder {
        fn count_gpus(&mut self) -> Result<u32, CheckError> {
            self.call("count", Ok(1))
        }
        fn gpu_use(&mut self, look: Look) -> Vec<GpuUse> {
            let name = match look {
                Look::Start => "start",
                Look::Opened => "opened",
                Look::End => "end",
            };
            self.call(name, Vec::new())
        }
        fn health_alone(&self, _: Progress) -> Option<HealthSnapshot> {
            self.call("health alone", None)
        }
        fn document(&self, opts: &CheckOptions, started_at: String) -> ResultDocument {
            let versions = Versions {
                agent: String::new(),
                driver: None,
                cuda: None,
                nccl: None,
                ..Versions::default()
            };
            let doc = ResultDocument::unmeasured(
                opts.node.clone(),
                Backend::Sim,
                started_at,
                versions,
                Vec::new(),
            );
            self.call("document", doc)
        }
        fn open(&mut self, _: &CheckOptions, _: Progress) -> Result<(), CheckError> {
            self.call("open", Ok(()))
        }
        fn setup(&self, _: &PhaseRun) -> Result<(), PhaseError> {
            self.call("setup", Ok(()))
        }
        fn watch_xids(&self, measure: &mut dyn FnMut()) -> Xids {
            measure();
            self.call("xids", Xids::from([(0, vec![79])]))
        }
        fn nccl_sweep(&self, _: &PhaseRun) -> Result<Swept, PhaseError> {
            self.call("nccl", Err(unavailable(Phase::NcclSweep)))
        }
        fn gpu_pairs(&self, _: &PhaseRun) -> Result<PairMatrix, PhaseError> {
            self.call("pairs", Err(unavailable(Phase::GpuPairs)))
        }
        fn ddp_probe(&self, _: &PhaseRun) -> Result<DdpResult, PhaseError> {
            self.call("ddp", Err(unavailable(Phase::DdpProbe)))
        }
        fn compute(&self, _: &PhaseRun) -> Result<ComputeResult, PhaseError> {
            self.call("compute", Err(unavailable(Phase::Compute)))
        }
        fn health(&self, xids: &Xids, _: &PhaseRun) -> Result<HealthSnapshot, PhaseError> {
            assert_eq!(xids.get(&0), Some(&vec![79]), "the measurements' XIDs");
            self.call("health", Ok(Default::default()))
        }
        fn finish(&mut self, _: &mut ResultDocument) {
            self.call("finish", ())
        }
    }

    #[test]
    fn health_follows_the_measurements_and_an_xid_spares_the_last_look() {
        let opts = CheckOptions {
            node: "n".into(),
            suite: Default::default(),
            quick: true,
            expect_gpus: None,
            phase_timeout: Duration::from_secs(1),
            shared_gpus: false,
        };
        let mut b = Recorder::default();
        let doc = run(&mut b, &opts, &|_| {}).expect("checked");
        let phases: Vec<Phase> = doc.errors.iter().map(|e| e.phase).collect();
        assert_eq!(
            phases,
            [
                Phase::NcclSweep,
                Phase::GpuPairs,
                Phase::DdpProbe,
                Phase::Compute
            ]
        );
        assert!(doc.health.is_some());
        assert_eq!(
            b.calls.into_inner(),
            [
                "count", "start", "open", "opened", "document", "setup", "nccl", "pairs", "ddp",
                "compute", "xids", "health", "finish"
            ]
        );
    }
}
