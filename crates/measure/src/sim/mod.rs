//! The sim backend: the cuda backend's result document computed from a model of the
//! declared node with the fleet file's faults injected; never runs unless asked for by name.

#![forbid(unsafe_code)]

mod compute;
pub mod ddp_nodes;
pub mod nccl_nodes;
mod node_model;
mod node_pair;
mod noise;
pub mod pace;
mod phases;
mod products;
#[cfg(test)]
mod tests;

pub use node_pair::SimPair;
pub(crate) use products::GENERIC_PCIE;

use crate::fleet::{Fault, FleetNode};
use crate::node_check::{CheckBackend, Look, PhaseRun, Swept, Xids};
use crate::{CheckError, CheckOptions, Progress};
use gpufabric_api::ResultDocument;
use gpufabric_api::result::{
    Backend, ComputeResult, DdpResult, ErrorKind, GpuInfo, HealthSnapshot, PairMatrix, Phase,
    PhaseError, TransportInfo,
};
use node_model::NodeModel;
use noise::Rng;
use phases::{ddp_phase, health_phase, nccl_phase, pairs_phase};
use std::time::{Duration, SystemTime};

/// A counter that grows by `per_second` every second of wall-clock time (millisecond
/// resolution), as an error counter since driver load does on a marginal link: the
/// faults `nvlinkErrors` and `nicErrors`.
pub(crate) fn counter_at_now(per_second: f64) -> u64 {
    let since_epoch = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    counter_at(per_second, since_epoch)
}

/// The count of a counter growing by `per_second` at `since_epoch` after the Unix epoch.
pub(crate) fn counter_at(per_second: f64, since_epoch: Duration) -> u64 {
    // Milliseconds since the epoch fit an f64 exactly for the next 285,000 years.
    (since_epoch.as_millis() as f64 / 1000.0 * per_second) as u64
}

/// A fault that acts on the agent process rather than on a measurement. The agent acts on
/// it; [`node_check`] itself ignores these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessFault {
    /// Exit with this code and write nothing.
    Crash { exit_code: i32 },
    /// Write a truncated (unparseable) document.
    Garbage,
}

/// Exit code of a `crash` fault without one (134, as for SIGABRT).
pub(crate) const DEFAULT_CRASH_CODE: i32 = 134;

/// The process-level fault of a node, if any (a crash wins over garbage).
pub fn process_fault(node: &FleetNode) -> Option<ProcessFault> {
    let crash = node.faults.iter().find_map(|f| match f {
        Fault::Crash { exit_code } => Some(ProcessFault::Crash {
            exit_code: exit_code.unwrap_or(DEFAULT_CRASH_CODE),
        }),
        _ => None,
    });
    crash.or_else(|| {
        node.faults
            .iter()
            .any(|f| matches!(f, Fault::Garbage))
            .then_some(ProcessFault::Garbage)
    })
}

/// Exit code of a `crashOnStop` fault without one (139, a segmentation fault).
const DEFAULT_CRASH_ON_STOP_CODE: i32 = 139;

/// The exit code the node's agent dies with when it is told to stop, instead of 143: its
/// `crashOnStop` fault, if any.
pub fn stop_fault(node: &FleetNode) -> Option<i32> {
    node.faults.iter().find_map(|f| match f {
        Fault::CrashOnStop { exit_code } => Some(exit_code.unwrap_or(DEFAULT_CRASH_ON_STOP_CODE)),
        _ => None,
    })
}

/// Rank `rank`'s node in the group `nodes` of a multi-node test.
fn rank_node(nodes: &[FleetNode], rank: u32) -> Result<&FleetNode, crate::node_counts::NodeError> {
    nodes
        .get(rank as usize)
        .ok_or(crate::node_counts::NodeError::NoNode(rank))
}

/// A rank of a multi-node test getting ready: its node's `gpusInUse` faults present from the
/// start refuse it (unless `shared`); its GPU count.
fn prepare_rank(
    nodes: &[FleetNode],
    rank: u32,
    shared: bool,
    progress: Progress,
) -> Result<u32, CheckError> {
    let me = rank_node(nodes, rank).map_err(|e| CheckError::InvalidInput(e.to_string()))?;
    refuse_shared_gpus(me, shared, progress)?;
    Ok(me.gpus)
}

/// A multi-node test's communicator id: no NCCL here, random bytes take its place,
/// exchanged as a real one is.
fn random_comm_id() -> Result<Vec<u8>, crate::node_counts::NodeError> {
    Ok(crate::rendezvous::random_id()?.to_vec())
}

/// The cuda backend's refusal to measure beside other work ([`crate::gpu_use`]), on the
/// simulated node's `gpusInUse` faults: [`CheckError::GpusInUse`] unless `shared`.
pub(crate) fn refuse_shared_gpus(
    node: &FleetNode,
    shared: bool,
    progress: Progress,
) -> Result<(), CheckError> {
    crate::gpu_use::refuse(&gpu_use(node, false), shared, progress)
}

/// What the node's GPUs have in use when the check starts (or, with `end`, after its
/// measurements): idle, but for `gpusInUse` faults (those with `during` only at the end),
/// whose process is not visible (as from a container).
fn gpu_use(node: &FleetNode, end: bool) -> Vec<crate::gpu_use::GpuUse> {
    let total_bytes = products::product_model(&node.product).memory_bytes;
    (0..node.gpus)
        .map(|gpu| crate::gpu_use::GpuUse {
            gpu,
            used_bytes: node
                .faults
                .iter()
                .filter_map(|f| match f {
                    Fault::GpusInUse {
                        gpu: g,
                        bytes,
                        during,
                    } if *g == gpu && (end || !during) => Some(*bytes),
                    _ => None,
                })
                .sum(),
            total_bytes,
            processes: Vec::new(),
            prohibited: false,
        })
        .collect()
}

/// A `hang` fault of `node` in `phase`: `None` without one; with `stuck: true` it never
/// returns (only the pod's deadline or a kill ends the process); otherwise it waits
/// `timeout`, as on a hung NCCL call, and returns the watchdog's timeout of the phase.
fn hang(
    node: &FleetNode,
    phase: Phase,
    timeout: Duration,
    progress: Progress,
) -> Option<PhaseError> {
    let hang = node.faults.iter().find_map(|f| match f {
        Fault::Hang { phase: p, stuck } if p.unwrap_or(Phase::NcclSweep) == phase => Some(*stuck),
        _ => None,
    });
    match hang {
        None => None,
        Some(true) => {
            let what = format!(
                "{}: stuck (simulated hang beyond the watchdog)",
                phase.api_name()
            );
            // The sim computes its phases together: the hang names its own.
            crate::activity::enter(what.as_str());
            progress(&what);
            tracing::warn!(node = %node.name, ?phase, "simulated stuck agent: blocking until killed");
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        Some(false) => {
            let what = format!("{}: hanging (simulated)", phase.api_name());
            crate::activity::enter(what.as_str());
            progress(&what);
            // The simulated work waits on a completion that never comes; the watchdog
            // gives up after the phase timeout, as it does on a hung NCCL call.
            let (_done, wait) = std::sync::mpsc::channel::<()>();
            let _ = wait.recv_timeout(timeout);
            let message = format!(
                "{} did not finish within {:.1} s; the watchdog aborted it",
                phase.api_name(),
                timeout.as_secs_f64()
            );
            progress(&format!("{}: timeout", phase.api_name()));
            Some(PhaseError {
                phase,
                kind: ErrorKind::Timeout,
                message,
            })
        }
    }
}

/// Runs the simulated node check of `node` (as the fleet describes it) with noise seeded by
/// `seed`: the same options, node and seed always give the same measurements (`startedAt`
/// and `durationS` are the real time of the call). `crash` and `garbage` faults are the
/// agent's to act on (see [`process_fault`]); a `hang` fault blocks its phase until
/// `opts.phase_timeout`, or forever with `stuck: true`.
pub fn node_check(
    opts: &CheckOptions,
    node: &FleetNode,
    seed: u64,
    progress: Progress,
) -> Result<ResultDocument, CheckError> {
    crate::node_check::run(&mut SimCheck::new(node.clone(), seed), opts, progress)
}

/// The sim backend of the node check ([`crate::node_check`]): each phase computed from the
/// model of the fleet's node, its faults injected.
pub struct SimCheck {
    node: FleetNode,
    seed: u64,
}

impl SimCheck {
    /// The check of `node` with noise seeded by `seed`.
    pub fn new(node: FleetNode, seed: u64) -> SimCheck {
        SimCheck { node, seed }
    }

    fn model(&self) -> NodeModel<'_> {
        NodeModel::new(&self.node, self.seed)
    }

    /// Runs `work` as the phase `phase` under the watchdog: when the node has a `hang` fault
    /// for this phase, the work never finishes and the watchdog aborts it after the timeout.
    fn run_phase<T>(
        &self,
        phase: Phase,
        run: &PhaseRun,
        work: impl FnOnce(&NodeModel) -> T,
    ) -> Result<T, PhaseError> {
        match hang(&self.node, phase, run.timeout, run.progress) {
            None => {
                pace::spend(phase.api_name(), &self.node.name, self.seed);
                Ok(work(&self.model()))
            }
            Some(e) => Err(e),
        }
    }
}

impl CheckBackend for SimCheck {
    fn count_gpus(&mut self) -> Result<u32, CheckError> {
        match self.node.gpus {
            0 => Err(CheckError::NoGpu(format!(
                "simulated node {} declares no GPUs",
                self.node.name
            ))),
            n => Ok(n),
        }
    }

    /// The node's `gpusInUse` faults ([`gpu_use`]).
    fn gpu_use(&mut self, look: Look) -> Vec<crate::gpu_use::GpuUse> {
        gpu_use(&self.node, look == Look::End)
    }

    fn health_alone(&self, progress: Progress) -> Option<HealthSnapshot> {
        Some(health_phase(&self.model(), progress))
    }

    fn document(&self, opts: &CheckOptions, started_at: String) -> ResultDocument {
        empty_document(opts, &self.model(), started_at)
    }

    /// Refuses a suite larger than the simulated GPUs' memory (their product's), as the
    /// cuda backend refuses it against the driver's.
    fn open(&mut self, opts: &CheckOptions, progress: Progress) -> Result<(), CheckError> {
        let m = self.model();
        if m.product.name == GENERIC_PCIE.name {
            tracing::warn!(product = %self.node.product, "unknown GPU product; simulating a PCIe-only GPU");
        }
        let gpu = gpufabric_api::validate::memory::GpuMemory {
            product: &self.node.product,
            bytes: m.product.memory_bytes,
            chosen: gpufabric_api::validate::memory::Chosen::ThisNode,
        };
        if let Some(why) = crate::cuda::refusal(opts, self.node.gpus, &gpu) {
            return Err(CheckError::InvalidInput(why));
        }
        progress(&format!(
            "setup: simulated node {}, {} x {} ({} model)",
            self.node.name, self.node.gpus, self.node.product, m.product.name
        ));
        Ok(())
    }

    fn setup(&self, run: &PhaseRun) -> Result<(), PhaseError> {
        self.run_phase(Phase::Setup, run, |_| ())
    }

    /// The node's `xid` faults.
    fn watch_xids(&self, measure: &mut dyn FnMut()) -> Xids {
        measure();
        let mut xids = Xids::new();
        for f in &self.node.faults {
            if let Fault::Xid { gpu, code } = f {
                xids.entry(*gpu).or_default().push(*code);
            }
        }
        xids
    }

    fn nccl_sweep(&self, run: &PhaseRun) -> Result<Swept, PhaseError> {
        self.run_phase(Phase::NcclSweep, run, |m| {
            (nccl_phase(m, run.opts, run.progress), Vec::new())
        })
    }

    fn gpu_pairs(&self, run: &PhaseRun) -> Result<PairMatrix, PhaseError> {
        self.run_phase(Phase::GpuPairs, run, |m| {
            pairs_phase(m, &run.opts.suite, run.progress)
        })
    }

    fn ddp_probe(&self, run: &PhaseRun) -> Result<DdpResult, PhaseError> {
        self.run_phase(Phase::DdpProbe, run, |m| {
            ddp_phase(m, run.opts, run.progress)
        })
    }

    fn compute(&self, run: &PhaseRun) -> Result<ComputeResult, PhaseError> {
        self.run_phase(Phase::Compute, run, |m| {
            compute::compute_phase(m, run.opts, run.progress)
        })
    }

    /// The model's health; its XIDs are the node's `xid` faults already.
    fn health(&self, _xids: &Xids, run: &PhaseRun) -> Result<HealthSnapshot, PhaseError> {
        self.run_phase(Phase::Health, run, |m| health_phase(m, run.progress))
    }

    /// The transport between each pair of GPUs. No node-pair phase exists in a single-node
    /// check; a `slowNic` fault only matters to node-pair tests and leaves this document
    /// untouched.
    fn finish(&mut self, doc: &mut ResultDocument) {
        let m = self.model();
        for a in 0..self.node.gpus {
            for b in a + 1..self.node.gpus {
                doc.transports.push(TransportInfo {
                    a,
                    b,
                    transport: m.transport(a, b),
                });
            }
        }
    }
}

/// The document of `node` before any phase ran: its GPUs and versions, nothing measured.
fn empty_document(opts: &CheckOptions, m: &NodeModel, started_at: String) -> ResultDocument {
    let (node, seed) = (m.node, m.seed);
    let gpus: Vec<GpuInfo> = (0..node.gpus)
        .map(|i| GpuInfo {
            index: i,
            product: node.product.clone(),
            uuid: Some(format!(
                "GPU-{:016x}",
                Rng::new(seed, &node.name, &format!("uuid/{i}")).next_u64()
            )),
            pci_bus_id: Some(format!("00000000:{:02X}:00.0", bus_id(i))),
            memory_bytes: m.product.memory_bytes,
        })
        .collect();

    let versions = node.software.reported(node.gpus);
    ResultDocument::unmeasured(opts.node.clone(), Backend::Sim, started_at, versions, gpus)
}

/// PCI bus numbers of the eight GPUs of an HGX board (as `nvidia-smi` lists them on
/// common HGX H100 systems); further GPUs continue past the last.
fn bus_id(i: u32) -> u32 {
    const HGX: [u32; 8] = [0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb];
    HGX.get(i as usize).copied().unwrap_or(0xdc + i)
}
