//! Other work on the node's GPUs when a check starts.
//!
//! The benchmark pod asks for every GPU of its node, so the scheduler gives them to no other
//! pod. A process it does not know about (one started on the host, a pod that sees the GPUs
//! without asking for them, an MPS server) still shares them: it takes their memory and
//! their time, and every measurement of the check would read slow. That is not the node's
//! hardware, so the check does not run on it: the agent ends with exit code 14 and says which
//! GPUs hold what, and the operator records the node as not measured (`GpusInUse`). With
//! `--shared-gpus` the check measures anyway, and what the other work costs counts against
//! the node. A GPU whose compute mode an administrator set to Prohibited refuses every
//! context; it is not measured either, with or without `--shared-gpus`.
//!
//! The memory a GPU has in use is read before the agent creates its own contexts, so all of
//! it is another process's. It is the evidence that holds in a container too: there NVML
//! often lists no process of another PID namespace, while the memory they hold shows.
//!
//! Work can also start while the check runs, after that first look. The agent looks again
//! once its contexts are open and once more after its measurements ([`started_during`]): a
//! process NVML lists at the end that it did not list at the start, or memory in use grown by
//! [`GROWTH_BYTES`] or more, is other work's, and the measurements it shared the GPUs with
//! are not the node's. The check then ends with exit code 14 as well.
//!
//! Other work does not hide a GPU's own faults. A process stuck on a GPU that has failed
//! (after an uncorrectable memory error, say) holds it as any other work does; when the GPUs'
//! NVML readings show such a fault ([`own_faults`]), the agent writes a document of their
//! health alone, its measuring phases `unavailable` ([`health_alone`]), and the node is
//! judged on that evidence instead of going unmeasured run after run.

use crate::{CheckError, Progress};
use gpufabric_api::ResultDocument;
use gpufabric_api::result::{ErrorKind, HealthSnapshot, Phase, PhaseError};
use gpufabric_api::suite::Suite;

/// Memory in use on a GPU, before the check's own contexts exist, above which another
/// process holds it. An idle GPU reports a few MiB besides the driver's reserve (which is
/// not counted as used); one CUDA context takes 300-600 MiB.
pub(crate) const FOREIGN_BYTES: u64 = 256 << 20;

/// How much more memory a GPU may have in use after the check's measurements than once its
/// contexts were open, before the difference is taken for other work's. Every buffer of the
/// check is freed by then; what stays is the kernels NCCL and cuBLAS load lazily into the
/// check's contexts and their caches (tens to a few hundred MiB), while a process that
/// computes holds its own context (300-600 MiB) and its data, gigabytes for any training job.
pub(crate) const GROWTH_BYTES: u64 = 1 << 30;

/// One GPU as NVML reports it before the check starts.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuUse {
    /// The GPU's index in the check (CUDA's order).
    pub gpu: u32,
    /// Memory in use, the driver's reserve excluded.
    pub used_bytes: u64,
    pub total_bytes: u64,
    /// The processes NVML lists on the GPU (compute and graphics), with the memory each
    /// holds when NVML knows it.
    pub processes: Vec<(u32, Option<u64>)>,
    /// The GPU's compute mode is Prohibited: an administrator reserved it, and it refuses
    /// every context (a check on it would fail as if the GPU were unusable).
    pub prohibited: bool,
}

impl GpuUse {
    /// Whether another process holds this GPU, or its compute mode reserves it.
    fn in_use(&self) -> bool {
        self.held_by_work() || self.prohibited
    }

    fn held_by_work(&self) -> bool {
        self.used_bytes >= FOREIGN_BYTES || !self.processes.is_empty()
    }

    fn describe(&self) -> String {
        let work = self.held_by_work().then(|| self.describe_work());
        let mode = self.prohibited.then(|| {
            format!(
                "GPU {}: compute mode Prohibited, which refuses every context (nvidia-smi -i {0} -c DEFAULT lifts it)",
                self.gpu
            )
        });
        [work, mode]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join("; ")
    }

    fn describe_work(&self) -> String {
        let held = format!(
            "GPU {}: {} of {} in use",
            self.gpu,
            gib(self.used_bytes),
            gib(self.total_bytes)
        );
        if self.processes.is_empty() {
            return format!("{held} (no process of it is visible here)");
        }
        let procs: Vec<String> = self.processes.iter().map(describe_process).collect();
        let n = self.processes.len();
        format!(
            "{held} by {n} process{} ({})",
            if n == 1 { "" } else { "es" },
            procs.join(", ")
        )
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / f64::from(1u32 << 30))
}

/// What other work holds, when it holds any of these GPUs: each such GPU, what it has in
/// use and by which processes ("GPU 2: 40.0 GiB of 140.4 GiB in use by 1 process (pid
/// 4321 40.0 GiB)"), separated by "; ".
fn held(gpus: &[GpuUse]) -> Option<String> {
    let busy: Vec<String> = gpus
        .iter()
        .filter(|g| g.in_use())
        .map(GpuUse::describe)
        .collect();
    (!busy.is_empty()).then(|| busy.join("; "))
}

/// The check's answer to other work on `gpus`: [`CheckError::GpusInUse`] when it holds any
/// of them, unless `shared`, which says so on `progress` and goes on. A GPU whose compute
/// mode is Prohibited refuses the check whatever `shared` says.
pub(crate) fn refuse(gpus: &[GpuUse], shared: bool, progress: Progress) -> Result<(), CheckError> {
    let Some(held) = held(gpus) else {
        return Ok(());
    };
    if !shared || gpus.iter().any(|g| g.prohibited) {
        return Err(CheckError::GpusInUse(not_measured(&held)));
    }
    progress(&format!(
        "measuring beside other work (--shared-gpus); what it costs counts against the node: {held}"
    ));
    Ok(())
}

/// What other work started on the GPUs while the check measured: each GPU whose reading at
/// the `end` lists a process the reading at the `start` (once the check's own contexts were
/// open) did not, or has [`GROWTH_BYTES`] more in use, with both readings and the new
/// processes, separated by "; ". A GPU missing from either reading is not judged.
pub(crate) fn started_during(start: &[GpuUse], end: &[GpuUse]) -> Option<String> {
    let grown: Vec<String> = end
        .iter()
        .filter_map(|e| {
            let s = start.iter().find(|s| s.gpu == e.gpu)?;
            let new: Vec<&(u32, Option<u64>)> = e
                .processes
                .iter()
                .filter(|(pid, _)| !s.processes.iter().any(|(p, _)| p == pid))
                .collect();
            let grew = e.used_bytes.saturating_sub(s.used_bytes) >= GROWTH_BYTES;
            if new.is_empty() && !grew {
                return None;
            }
            let mut line = format!(
                "GPU {}: {} in use once the check's contexts were open, {} after its measurements",
                e.gpu,
                gib(s.used_bytes),
                gib(e.used_bytes)
            );
            if !new.is_empty() {
                let procs: Vec<String> = new.iter().map(|p| describe_process(p)).collect();
                line.push_str(&format!(
                    ", {} process{} the check did not start ({})",
                    new.len(),
                    if new.len() == 1 { "" } else { "es" },
                    procs.join(", ")
                ));
            }
            Some(line)
        })
        .collect();
    (!grown.is_empty()).then(|| grown.join("; "))
}

/// The check's answer to other work that started while it measured ([`started_during`]):
/// [`CheckError::GpusInUse`], since its measurements shared the GPUs with that work.
pub(crate) fn refuse_after(start: &[GpuUse], end: &[GpuUse]) -> Result<(), CheckError> {
    for (s, e) in start.iter().zip(end) {
        tracing::info!(
            gpu = e.gpu,
            opened_mib = s.used_bytes >> 20,
            end_mib = e.used_bytes >> 20,
            opened_processes = s.processes.len(),
            end_processes = e.processes.len(),
            "GPU memory in use once the contexts were open and after the measurements"
        );
    }
    started_during(start, end).map_or(Ok(()), |grown| Err(started_meanwhile(&grown)))
}

/// The same answer for a process that holds no context of its own when it looks (its
/// measuring processes have ended): what the GPUs hold then is other work's, by the rule of
/// the first look ([`refuse`] without `shared`).
pub(crate) fn refuse_at_end(gpus: &[GpuUse]) -> Result<(), CheckError> {
    held(gpus).map_or(Ok(()), |held| {
        Err(started_meanwhile(&format!("{held} after the measurements")))
    })
}

fn started_meanwhile(what: &str) -> CheckError {
    CheckError::GpusInUse(format!(
        "{what}; work the scheduler does not know about started on this node's GPUs while they were measured, so the measurements are not the node's and the node was not measured. Stop it (nvidia-smi on the node lists it), or measure beside it with --shared-gpus (FABRIC_SHARED_GPUS=1)"
    ))
}

/// What the GPUs' own NVML readings say is wrong with them, whatever else runs on them:
/// uncorrectable ECC errors since the driver loaded, a row remap pending or failed, NVLink
/// links down (on a node of two GPUs or more). Each is a fault of the GPU that the health
/// rules hold against the node; temperatures and throttling are left out, since other work
/// heats and loads a GPU.
pub(crate) fn own_faults(health: &HealthSnapshot) -> Vec<String> {
    let several = health.gpus.len() >= 2;
    let mut out = Vec::new();
    for h in &health.gpus {
        let g = h.index;
        if h.ecc_uncorrected > 0 {
            out.push(format!(
                "GPU {g}: {} uncorrectable ECC errors",
                h.ecc_uncorrected
            ));
        }
        if h.remapped_failed {
            out.push(format!("GPU {g}: a memory row remap failed"));
        } else if h.remapped_pending {
            out.push(format!("GPU {g}: a memory row remap pending"));
        }
        if several && h.nvlink_active < h.nvlink_expected {
            out.push(format!(
                "GPU {g}: {} of {} NVLink links up",
                h.nvlink_active, h.nvlink_expected
            ));
        }
    }
    out
}

/// Either backend's answer when other work holds the GPUs (`refused`): when `health` (the
/// GPUs' NVML readings, None where they cannot be read) shows faults of their own
/// ([`own_faults`]), the document `unmeasured` makes with that health alone and the
/// measuring phases of `suite` `unavailable`, so that the node is judged on that evidence;
/// otherwise the refusal. Not when the suite reads no health.
pub(crate) fn health_alone(
    refused: CheckError,
    suite: &Suite,
    progress: Progress,
    health: impl FnOnce() -> Option<HealthSnapshot>,
    unmeasured: impl FnOnce() -> ResultDocument,
) -> Result<ResultDocument, CheckError> {
    let CheckError::GpusInUse(why) = &refused else {
        return Err(refused);
    };
    if !suite.health.enabled {
        return Err(refused);
    }
    let Some(snapshot) = health() else {
        return Err(refused);
    };
    let faults = own_faults(&snapshot);
    if faults.is_empty() {
        return Err(refused);
    }
    progress(&format!(
        "other work holds the GPUs, but their own readings show faults ({}): reporting their health alone",
        faults.join("; ")
    ));
    let mut doc = unmeasured();
    doc.health = Some(snapshot);
    doc.errors = unmeasured_phases(suite, why);
    Ok(doc)
}

/// The measuring phases of `suite` that other work kept from running, each `unavailable`
/// with `why` (the refusal's reason), for a document of the GPUs' health alone.
fn unmeasured_phases(suite: &Suite, why: &str) -> Vec<PhaseError> {
    [
        (Phase::NcclSweep, suite.nccl_sweep.enabled),
        (Phase::GpuPairs, suite.gpu_pairs.enabled),
        (Phase::DdpProbe, suite.ddp_probe.enabled),
    ]
    .into_iter()
    .filter(|(_, on)| *on)
    .map(|(phase, _)| PhaseError {
        phase,
        kind: ErrorKind::Unavailable,
        message: format!("not measured, only the GPUs' health was read: {why}"),
    })
    .collect()
}

/// Whether a phase of `errors` timed out: the look after the measurements is then not taken
/// (a thread still stuck in the phase holds the check's own memory).
pub(crate) fn timed_out(errors: &[PhaseError]) -> bool {
    errors.iter().any(|e| e.kind == ErrorKind::Timeout)
}

fn describe_process((pid, bytes): &(u32, Option<u64>)) -> String {
    match bytes {
        Some(b) => format!("pid {pid} {}", gib(*b)),
        None => format!("pid {pid}"),
    }
}

/// Why the check did not run: what other work holds ([`held`]), and what to do.
fn not_measured(held: &str) -> String {
    format!(
        "{held} before the check started; work the scheduler does not know about shares this node's GPUs (or an administrator reserved them) and would slow or stop every measurement, so the node was not measured. Stop it (nvidia-smi on the node lists it), or measure beside it with --shared-gpus (FABRIC_SHARED_GPUS=1)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idle(gpu: u32) -> GpuUse {
        GpuUse {
            gpu,
            used_bytes: 4 << 20,
            total_bytes: 143_771 << 20,
            processes: vec![],
            prohibited: false,
        }
    }

    #[test]
    fn idle_gpus_are_free() {
        let gpus: Vec<GpuUse> = (0..8).map(idle).collect();
        assert_eq!(held(&gpus), None);
        // Just under the bound: the driver's own bookkeeping, not a context.
        let mut g = idle(0);
        g.used_bytes = FOREIGN_BYTES - 1;
        assert!(!g.in_use());
    }

    #[test]
    fn held_memory_or_a_listed_process_names_the_gpu() {
        let mut gpus: Vec<GpuUse> = (0..4).map(idle).collect();
        gpus[2].used_bytes = 40 << 30;
        gpus[2].processes = vec![(4321, Some(40 << 30))];
        gpus[3].used_bytes = 600 << 20;
        let why = not_measured(&held(&gpus).expect("in use"));
        assert!(
            why.starts_with("GPU 2: 40.0 GiB of 140.4 GiB in use by 1 process (pid 4321 40.0 GiB); GPU 3: 0.6 GiB of 140.4 GiB in use (no process of it is visible here) before the check started"),
            "{why}"
        );
        assert!(!why.contains("GPU 0"), "{why}");
        assert!(why.contains("--shared-gpus"), "{why}");
        // A process NVML lists but whose memory it does not know still counts.
        let mut g = idle(1);
        g.processes = vec![(7, None), (8, None)];
        assert!(g.in_use());
        assert!(g.describe().ends_with("by 2 processes (pid 7, pid 8)"));
    }

    #[test]
    fn work_that_starts_during_the_check_is_told_from_what_the_check_leaves() {
        // Once the check's contexts are open: its own process and context on every GPU.
        let mut start: Vec<GpuUse> = (0..4).map(idle).collect();
        for g in &mut start {
            g.used_bytes = 520 << 20;
            g.processes = vec![(100, Some(500 << 20))];
        }
        // After the measurements: what NCCL and cuBLAS keep in the check's contexts.
        let mut end = start.clone();
        for g in &mut end {
            g.used_bytes += GROWTH_BYTES - (1 << 20);
        }
        assert_eq!(started_during(&start, &end), None);
        assert!(refuse_after(&start, &end).is_ok());
        // A process the check did not start, listed on GPU 1 (even one whose memory is small).
        end[1].processes.push((963, Some(200 << 20)));
        // Memory grown by a process NVML does not list here (another PID namespace), GPU 3.
        end[3].used_bytes = 12 << 30;
        let why = match refuse_after(&start, &end) {
            Err(CheckError::GpusInUse(m)) => m,
            other => panic!("{other:?}"),
        };
        assert!(
            why.starts_with("GPU 1: 0.5 GiB in use once the check's contexts were open, 1.5 GiB after its measurements, 1 process the check did not start (pid 963 0.2 GiB); GPU 3: 0.5 GiB in use once the check's contexts were open, 12.0 GiB after its measurements; work the scheduler does not know about started"),
            "{why}"
        );
        assert!(!why.contains("GPU 0") && !why.contains("GPU 2"), "{why}");
        // A GPU NVML could not read at either end is not judged.
        assert_eq!(started_during(&start[..3], &end[3..]), None);
        // Read with no context of the reader's own: the first look's rule.
        let mut gpus: Vec<GpuUse> = (0..2).map(idle).collect();
        assert!(refuse_at_end(&gpus).is_ok());
        gpus[1].used_bytes = 6 << 30;
        match refuse_at_end(&gpus) {
            Err(CheckError::GpusInUse(m)) => assert!(
                m.starts_with("GPU 1: 6.0 GiB of 140.4 GiB in use (no process of it is visible here) after the measurements; work the scheduler does not know about started"),
                "{m}"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_gpus_own_faults_are_read_beside_other_work() {
        use gpufabric_api::result::GpuHealth;
        let gpu = |index| GpuHealth {
            index,
            nvlink_active: 18,
            nvlink_expected: 18,
            temperature_c: 90.0,
            throttle: vec!["hwThermal".into()],
            ..GpuHealth::default()
        };
        let mut health = HealthSnapshot {
            gpus: (0..4).map(gpu).collect(),
        };
        // Heat and throttling are what other work does to a GPU: not its fault here.
        assert!(own_faults(&health).is_empty());
        health.gpus[1].ecc_uncorrected = 2;
        health.gpus[2].remapped_pending = true;
        health.gpus[2].remapped_failed = true;
        health.gpus[3].nvlink_active = 16;
        assert_eq!(
            own_faults(&health),
            [
                "GPU 1: 2 uncorrectable ECC errors",
                "GPU 2: a memory row remap failed",
                "GPU 3: 16 of 18 NVLink links up"
            ]
        );
        // A GPU alone on its node has no peer to link to.
        let alone = HealthSnapshot {
            gpus: vec![GpuHealth {
                nvlink_expected: 18,
                ..GpuHealth::default()
            }],
        };
        assert!(own_faults(&alone).is_empty());
        // Only the phases the suite runs are reported, each unavailable with the reason.
        let mut suite = Suite::default();
        suite.ddp_probe.enabled = false;
        let errs = unmeasured_phases(&suite, "GPU 1: 3.0 GiB in use");
        let phases: Vec<Phase> = errs.iter().map(|e| e.phase).collect();
        assert_eq!(phases, [Phase::NcclSweep, Phase::GpuPairs]);
        assert!(errs.iter().all(|e| {
            e.kind == ErrorKind::Unavailable
                && e.message
                    .ends_with("only the GPUs' health was read: GPU 1: 3.0 GiB in use")
        }));
    }

    #[test]
    fn a_gpu_reserved_by_its_compute_mode_refuses_the_check_even_when_shared() {
        let mut gpus: Vec<GpuUse> = (0..2).map(idle).collect();
        gpus[1].prohibited = true;
        let says = |gpus: &[GpuUse], shared| match refuse(gpus, shared, &|_| {}) {
            Err(CheckError::GpusInUse(m)) => m,
            other => panic!("{other:?}"),
        };
        let why = says(&gpus, true);
        assert!(
            why.starts_with("GPU 1: compute mode Prohibited, which refuses every context (nvidia-smi -i 1 -c DEFAULT lifts it) before the check started"),
            "{why}"
        );
        // With other work on it too, both are named.
        gpus[1].used_bytes = 2 << 30;
        assert!(
            says(&gpus, false).starts_with("GPU 1: 2.0 GiB of 140.4 GiB in use (no process of it is visible here); GPU 1: compute mode Prohibited"),
            "{}",
            says(&gpus, false)
        );
        // Other work alone: shared measures.
        gpus[1].prohibited = false;
        assert!(refuse(&gpus, true, &|_| {}).is_ok());
        assert!(refuse(&gpus, false, &|_| {}).is_err());
    }
}
