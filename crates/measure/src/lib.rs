//! GPU fabric measurements (NCCL sweep, GPU-pair copies, DDP probe, compute checks, NVML
//! health) behind a cuda and a sim backend; no Kubernetes.
//!
//! What other crates use, and all that is public: the probes' sequences over their
//! backend traits ([`node_check::run`] over [`node_check::CheckBackend`], [`node_pair::run`]
//! over [`node_pair::PairBackend`], [`ddp_nodes::run`] over [`ddp_nodes::NodeMeasure`],
//! [`nccl_nodes::run`] over [`nccl_nodes::NcclMeasure`]);
//! the backends that implement them ([`cuda::CudaCheck`] with [`cuda::CudaOptions`],
//! [`cuda::node_pair::CudaPair`], [`cuda::ddp_nodes::CudaDdpNodes`],
//! [`cuda::nccl_nodes::CudaNcclNodes`], [`sim::SimCheck`], [`sim::SimPair`],
//! [`sim::ddp_nodes::SimDdpNodes`], [`sim::nccl_nodes::SimNcclNodes`]; the sim's check of one fleet node,
//! [`sim::node_check`], and its process faults, [`sim::process_fault`]); the DDP worker process
//! ([`cuda::ddp::procs::worker_main`]), the fault injectors ([`cuda::inject`]) and whether
//! NCCL loads ([`cuda::nccl::nccl_present`]); the sim fleet description ([`fleet`]), a
//! pair's options ([`pairs`]) and the rendezvous settings ([`rendezvous::Config`]);
//! [`CheckOptions`], [`CheckError`] and [`Progress`]; what the process is
//! measuring now and how it ends at once when stopped ([`activity`]). The maths, statistics,
//! NVML, NCCL and driver wrappers behind them are the crate's own.

#![warn(unreachable_pub)]

pub mod activity;
pub(crate) mod compute;
pub mod cuda;
pub mod ddp_nodes;
pub mod fleet;
pub(crate) mod gpu_use;
pub(crate) mod launch_cpu;
pub(crate) mod model;
pub mod nccl_env;
pub mod nccl_nodes;
pub(crate) mod nic;
pub mod node_check;
pub(crate) mod node_counts;
pub mod node_pair;
pub mod pairs;
pub mod rendezvous;
pub mod sim;
pub(crate) mod stats;

use gpufabric_api::suite::Suite;
use std::time::Duration;

/// What a node check is asked to do.
#[derive(Debug, Clone)]
pub struct CheckOptions {
    /// Name of the node (goes into the result document).
    pub node: String,
    /// What to measure.
    pub suite: Suite,
    /// Fewer sizes, iterations and steps: a fast smoke check.
    pub quick: bool,
    /// GPUs the node must have (fail with `TooFewGpus` when fewer are visible).
    pub expect_gpus: Option<u32>,
    /// Watchdog per phase: a collective or copy that does not finish in time is aborted
    /// and reported as a `timeout` phase error.
    pub phase_timeout: Duration,
    /// Measure even when another process holds the GPUs ([`gpu_use`]); otherwise the
    /// check ends with [`CheckError::GpusInUse`].
    pub shared_gpus: bool,
}

/// What `quick` does, the same for both backends: NCCL sizes up to 64 MiB, every third
/// size of the sweep (and the last), at most 2 warm-up and 5 timed iterations; the DDP
/// probe at 1 GPU and all GPUs only, 1 warm-up and at most 3 timed steps.
impl CheckOptions {
    /// NCCL message sizes to run.
    pub(crate) fn sweep_sizes(&self) -> Vec<u64> {
        let mut sizes = self.suite.nccl_sweep.sizes();
        if self.quick {
            sizes.retain(|&s| s <= 64 << 20);
            let last = sizes.last().copied();
            sizes = sizes
                .iter()
                .enumerate()
                .filter(|(i, s)| i % 3 == 0 || Some(**s) == last)
                .map(|(_, s)| *s)
                .collect();
        }
        sizes
    }

    /// Warm-up and timed iterations per NCCL size.
    pub(crate) fn sweep_iters(&self) -> (u32, u32) {
        let n = &self.suite.nccl_sweep;
        if self.quick {
            (n.warmup_iters.min(2), n.iters.clamp(1, 5))
        } else {
            (n.warmup_iters, n.iters.max(1))
        }
    }

    /// GPU counts of the DDP probe on a node of `gpus` GPUs.
    pub(crate) fn ddp_counts(&self, gpus: u32) -> Vec<u32> {
        let mut counts = self.suite.ddp_probe.counts_for(gpus);
        if self.quick {
            let last = counts.last().copied();
            counts.retain(|&c| c == 1 || Some(c) == last);
        }
        counts
    }

    /// The compute checks to run: the suite's, or in a quick check GEMMs of at most 4096
    /// with at most 5 warm-up and 20 timed multiplies, at most 5 copies, and one SDC output
    /// of at most 2048.
    pub(crate) fn compute(&self) -> gpufabric_api::suite::Compute {
        let mut c = self.suite.compute.clone();
        if self.quick {
            c.gemm.size = c.gemm.size.min(4096);
            c.gemm.warmup_iters = c.gemm.warmup_iters.min(5);
            c.gemm.iters = c.gemm.iters.clamp(1, 20);
            c.memory.iters = c.memory.iters.clamp(1, 5);
            c.sdc.size = c.sdc.size.min(2048);
            c.sdc.repeats = 1;
        }
        c
    }

    /// Warm-up and timed steps of the DDP probe.
    pub(crate) fn ddp_steps(&self) -> (u32, u32) {
        let d = &self.suite.ddp_probe;
        if self.quick {
            (1, d.steps.clamp(1, 3))
        } else {
            (d.warmup_steps, d.steps.max(1))
        }
    }
}

/// Receives one line of progress (the agent prints it on stderr).
pub type Progress<'a> = &'a (dyn Fn(&str) + Sync);

/// Why a node check could not measure at all. Each kind has its own process exit code.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("no GPU found: {0}")]
    NoGpu(String),
    #[error("{library} could not be loaded: {detail}")]
    LibraryMissing { library: String, detail: String },
    #[error("found {found} GPUs, {wanted} expected")]
    TooFewGpus { found: u32, wanted: u32 },
    /// Another process holds the node's GPUs ([`gpu_use::refuse`]).
    #[error("the GPUs are in use by other work: {0}")]
    GpusInUse(String),
    #[error("invalid input: {0}")]
    InvalidInput(String),
    #[error("{0}")]
    Other(String),
}

impl CheckError {
    /// Process exit code of the agent for this error (0 is "measured", 1 is a bug).
    pub fn exit_code(&self) -> i32 {
        match self {
            CheckError::NoGpu(_) => 10,
            CheckError::LibraryMissing { .. } => 11,
            CheckError::TooFewGpus { .. } => 12,
            CheckError::InvalidInput(_) => 2,
            CheckError::Other(_) => 13,
            CheckError::GpusInUse(_) => 14,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_shrinks_the_check_and_full_keeps_the_suite() {
        let mut opts = CheckOptions {
            node: "n".into(),
            suite: Suite::default(),
            quick: false,
            expect_gpus: None,
            phase_timeout: Duration::from_secs(60),
            shared_gpus: false,
        };
        assert_eq!(opts.sweep_sizes(), Suite::default().nccl_sweep.sizes());
        assert_eq!(opts.sweep_iters(), (5, 20));
        assert_eq!(opts.ddp_counts(8), vec![1, 2, 4, 8]);
        assert_eq!(opts.ddp_steps(), (3, 10));
        opts.quick = true;
        // 8 B .. 64 MiB by 2 is 24 sizes; every third (8, 64, 512, ...) and the last.
        let sizes = opts.sweep_sizes();
        assert_eq!(sizes.first(), Some(&8));
        assert_eq!(sizes.get(1), Some(&64));
        assert_eq!(sizes.last(), Some(&(64 << 20)));
        assert_eq!(sizes.len(), 9);
        assert_eq!(opts.sweep_iters(), (2, 5));
        assert_eq!(opts.ddp_counts(8), vec![1, 8]);
        assert_eq!(opts.ddp_steps(), (1, 3));
    }
}
