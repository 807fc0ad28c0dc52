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

use crate::{CheckError, Progress};

/// Memory in use on a GPU, before the check's own contexts exist, above which another
/// process holds it. An idle GPU reports a few MiB besides the driver's reserve (which is
/// not counted as used); one CUDA context takes 300-600 MiB.
pub const FOREIGN_BYTES: u64 = 256 << 20;

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
        let procs: Vec<String> = self
            .processes
            .iter()
            .map(|(pid, bytes)| match bytes {
                Some(b) => format!("pid {pid} {}", gib(*b)),
                None => format!("pid {pid}"),
            })
            .collect();
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
pub fn refuse(gpus: &[GpuUse], shared: bool, progress: Progress) -> Result<(), CheckError> {
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
