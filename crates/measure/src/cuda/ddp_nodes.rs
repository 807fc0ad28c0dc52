//! The cuda backend's part of the multi-node DDP probe: this node's GPUs as global ranks
//! `rank x G ..` of a clique of `nodes x G`, one `ddp-worker` process per GPU (as PyTorch
//! DDP runs), joined through the id rank 0 made and the rendezvous handed over.

use super::ddp::DdpSettings;
use super::ddp::procs::{WORKER_SUBCOMMAND, WorkerTask, combine_ranks, encode_id, run_workers};
use super::nccl;
use crate::ddp_nodes::{NodeError, NodeMeasure, NodeTimes};
use crate::{CheckError, Progress};
use gpufabric_api::result::{Backend, PhaseError};
use std::path::PathBuf;
use std::time::Duration;

/// One rank (node) of the probe on real GPUs.
pub struct CudaDdpNodes {
    /// CUDA device ordinals of this node's GPUs, in local rank order (found by
    /// [`NodeMeasure::prepare`]).
    devices: Vec<u32>,
    /// This node's rank in the group.
    rank: u32,
    settings: DdpSettings,
    /// The program started per GPU (its `ddp-worker` subcommand): this agent.
    exe: PathBuf,
    /// Longest one node count's workers may take; they are killed then.
    limit: Duration,
}

impl CudaDdpNodes {
    /// Rank `rank` measuring the step `settings` with workers of `exe`, each node count
    /// within `limit`.
    pub fn new(rank: u32, settings: DdpSettings, exe: PathBuf, limit: Duration) -> CudaDdpNodes {
        CudaDdpNodes {
            devices: Vec::new(),
            rank,
            settings,
            exe,
            limit,
        }
    }
}

impl NodeMeasure for CudaDdpNodes {
    fn kind(&self) -> Backend {
        Backend::Cuda
    }

    /// NCCL and cuBLAS found, the GPUs free of other work, and counted.
    fn prepare(&mut self, shared: bool, progress: Progress) -> Result<u32, CheckError> {
        nccl::require()?;
        if !super::ddp::cublas_present() {
            return Err(CheckError::LibraryMissing {
                library: "libcublas.so".into(),
                detail: "cuBLAS is not installed or not on the library path".into(),
            });
        }
        super::refuse_shared_gpus(shared, progress)?;
        let count = super::count_gpus()?;
        self.devices = (0..count).collect();
        Ok(count)
    }

    /// A hung node count is its workers' timeout.
    fn hang(&self, _timeout: Duration, _progress: Progress) -> Option<PhaseError> {
        None
    }

    fn end_look(&mut self) -> Result<(), CheckError> {
        super::refuse_work_started()
    }

    /// The id as the workers take it: 256 hex digits.
    fn make_id(&mut self) -> Result<Vec<u8>, NodeError> {
        let id = nccl::unique_id().map_err(NodeError::backend)?;
        Ok(encode_id(&id).into_bytes())
    }

    fn measure(&mut self, nodes: u32, id: &[u8]) -> Result<NodeTimes, NodeError> {
        let g = self.devices.len() as u32;
        let hex = String::from_utf8(id.to_vec()).map_err(|_| NodeError::IdNotText)?;
        let first = self.rank * g;
        let inputs = self
            .devices
            .iter()
            .enumerate()
            .map(|(i, &device)| {
                serde_json::to_string(&WorkerTask {
                    rank: first + i as u32,
                    world: nodes * g,
                    device,
                    id: hex.clone(),
                    settings: self.settings.clone(),
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(NodeError::backend)?;
        let reports = run_workers(&self.exe, &[WORKER_SUBCOMMAND], &inputs, self.limit, None)
            .map_err(NodeError::backend)?;
        combine_ranks(&reports, first).map_err(NodeError::backend)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::ddp::procs::WorkerReport;

    #[test]
    fn a_nodes_times_are_its_slowest_gpu_and_its_ranks_are_global() {
        let r = |rank: u32, step: f64| WorkerReport::Measured {
            rank,
            step_ms: step,
            compute_ms: step - 10.0,
            compute_alone_ms: step - 12.0,
            comm_alone_ms: 30.0 + f64::from(rank),
        };
        let t = combine_ranks(&[r(4, 100.0), r(5, 104.0)], 4).expect("times");
        assert_eq!(t.step_ms, 104.0);
        assert_eq!(t.compute_ms, [90.0, 94.0]);
        assert_eq!((t.compute_alone_ms, t.comm_alone_ms), (92.0, 35.0));
        assert!(
            combine_ranks(&[r(0, 100.0)], 4).is_err(),
            "a report of another rank"
        );
        assert!(combine_ranks(&[], 0).is_err());
    }
}
