//! The cuda backend's part of the multi-node NCCL sweep: this process drives every visible
//! GPU of its node as ranks `rank x G ..` of one NCCL clique of `nodes x G` ranks per node
//! count (a fresh communicator from the id rank 0 made and the rendezvous handed over),
//! each collective timed at each size as the node pair times its own
//! ([`super::clique::time_one`]).

use super::clique::{Local, Timing, init_ranks, time_one, unique_id};
use super::gpu::{Gpu, GpuResult};
use super::gpu_use::in_use;
use super::health;
use super::nccl::{self, Comms, Watchdog, settle};
use super::node_pair::PairSettings;
use crate::gpu_use::GpuUse;
use crate::nccl_nodes::{NcclMeasure, NodeError, Sweep};
use crate::{CheckError, Progress};
use gpufabric_api::pair::PairCollective;
use gpufabric_api::result::Backend;

/// One rank (node) of the sweep on real GPUs.
pub struct CudaNcclNodes {
    rank: u32,
    set: PairSettings,
    /// NVML over the node's GPUs, for the look after the sweep.
    monitor: Option<health::Monitor>,
    /// This node's GPUs, opened once other work was found not to hold them.
    gpus: Vec<Gpu>,
    /// What the GPUs had in use once this process's contexts were open.
    opened: Option<Vec<GpuUse>>,
}

impl CudaNcclNodes {
    /// Rank `rank`, each collective's iterations and watchdog as `set` says.
    pub fn new(rank: u32, set: PairSettings) -> CudaNcclNodes {
        CudaNcclNodes {
            rank,
            set,
            monitor: None,
            gpus: Vec::new(),
            opened: None,
        }
    }
}

impl NcclMeasure for CudaNcclNodes {
    fn kind(&self) -> Backend {
        Backend::Cuda
    }

    /// NCCL found, the GPUs free of other work, then opened.
    fn prepare(&mut self, shared: bool, progress: Progress) -> Result<u32, CheckError> {
        nccl::require()?;
        let n = super::count_gpus()?;
        self.monitor = super::open_monitor(n);
        super::refuse_gpus_in_use(self.monitor.as_ref(), shared, progress)?;
        self.gpus = super::open_devices(n)?;
        let blocking = std::env::var("CUDA_LAUNCH_BLOCKING").ok();
        if let Some(why) = super::blocking_launches(self.gpus.len(), blocking.as_deref()) {
            return Err(CheckError::Other(why));
        }
        self.opened = Some(in_use(self.monitor.as_ref()));
        Ok(n)
    }

    /// NCCL's unique id, its 128 bytes.
    fn make_id(&mut self) -> Result<Vec<u8>, NodeError> {
        let id = nccl::unique_id().map_err(NodeError::backend)?;
        Ok(id.internal.iter().map(|c| *c as u8).collect())
    }

    fn measure(
        &mut self,
        nodes: u32,
        id: &[u8],
        sweep: &Sweep,
    ) -> Result<Vec<PairCollective>, NodeError> {
        let gpus = std::mem::take(&mut self.gpus);
        let (gpus, rows) = sweep_count(&self.set, gpus, self.rank, nodes, id, sweep);
        self.gpus = gpus;
        rows.map_err(NodeError::backend)
    }

    /// Work that started on this node's GPUs while the sweep ran shared them with it.
    fn end_look(&mut self) -> Result<(), CheckError> {
        match (&self.opened, &self.monitor) {
            (Some(opened), Some(monitor)) => {
                crate::gpu_use::refuse_after(opened, &monitor.gpu_use())
            }
            _ => Ok(()),
        }
    }

    /// sysfs' InfiniBand / RoCE ports (none on a node without RDMA devices).
    fn ports(&mut self) -> Option<Vec<gpufabric_api::pair::NicPort>> {
        match crate::nic::read_ports(std::path::Path::new(crate::nic::SYSFS_ROOT)) {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::warn!(error = %e, "the network ports could not be read");
                None
            }
        }
    }
}

/// Every collective of `sweep` at every size over the first `nodes` nodes, and the GPUs
/// back (none after a failure: the sweep stops at it); the communicators end with the
/// count.
fn sweep_count(
    set: &PairSettings,
    gpus: Vec<Gpu>,
    rank: u32,
    nodes: u32,
    id: &[u8],
    sweep: &Sweep,
) -> (Vec<Gpu>, GpuResult<Vec<PairCollective>>) {
    let g = gpus.len() as i32;
    let world = nodes as i32 * g;
    let first = rank as i32 * g;
    crate::activity::enter(format!(
        "nccl-nodes: {nodes} node(s), joining NCCL's communicator"
    ));
    let mut comms = match init_ranks(&gpus, unique_id(id), world, first) {
        Ok(c) => c,
        Err(e) => return (gpus, Err(e)),
    };
    let largest = sweep.sizes.iter().copied().max().unwrap_or(0);
    let bytes = largest.max(4 * world as u64) / 4 * 4;
    let mut local = match Local::new(gpus, first, world, bytes as usize) {
        Ok(l) => l,
        Err(e) => return (Vec::new(), Err(e)),
    };
    let rows = time_all(set, &mut comms, &mut local, nodes, sweep);
    drop(comms);
    (local.into_gpus(), rows)
}

/// Every collective of `sweep` at every size on `local`'s communicators.
fn time_all(
    set: &PairSettings,
    comms: &mut Comms,
    local: &mut Local,
    nodes: u32,
    sweep: &Sweep,
) -> GpuResult<Vec<PairCollective>> {
    let wd = Watchdog::start();
    // The warm-up's collectives meet the other nodes before each timed loop.
    let mut none = || Ok(());
    let what = format!("nccl-nodes {nodes} nodes");
    let mut timing = Timing {
        iters: sweep.iters,
        timeout: set.timeout,
        wd: &wd,
        barrier: &mut none,
        what: &what,
    };
    let mut rows = Vec::new();
    for &c in &sweep.collectives {
        for &size in &sweep.sizes {
            crate::activity::enter(format!(
                "nccl-nodes: {nodes} node(s), {} {}",
                c.nccl_tests_name(),
                crate::activity::size(size)
            ));
            match time_one(c, comms, local, size, &mut timing) {
                Ok(row) if row.bytes > 0 => rows.push(row),
                Ok(_) => {}
                Err(e) => return Err(settle(e, comms, &wd, set.timeout)),
            }
        }
    }
    Ok(rows)
}
