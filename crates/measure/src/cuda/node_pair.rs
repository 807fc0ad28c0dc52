//! The cuda backend's node pair: every visible GPU of this node joins, as ranks
//! `rank x G .. rank x G + G - 1`, one NCCL clique of 2 x G ranks over the two nodes, through
//! the unique id the rendezvous handed over. Each collective runs at the pair's size
//! ([`super::clique::time_one`]): warm-up iterations, a barrier with the other node, then
//! timed iterations (host time per iteration, as nccl-tests reports it), busbw by
//! nccl-tests' factors for 2 x G ranks.
//!
//! - all_reduce: every rank's `bytes` summed over all 2 x G ranks.
//! - sendrecv: each GPU exchanges `bytes` with the GPU of the same index on the other node
//!   (rail to rail), so every byte crosses the network; busbw = algbw.
//! - all_to_all (when asked): `bytes` per rank split over all 2 x G ranks.
//!
//! Outputs are checked after the timed iterations: all_reduce of `rank + 1` everywhere
//! must give `R (R + 1) / 2`, sendrecv must deliver the peer's `rank + 1`, all_to_all each
//! source's `rank + 1` in its block (first 1 Mi elements of each rank).
//!
//! The network transport is read from NCCL's INFO log (`via NET/IB/0`, `via NET/Socket/0`):
//! IB (RoCE when the node's RDMA ports are Ethernet), sockets, and how many NICs it used.

use super::clique::{Local, Timing, init_ranks, time_one, unique_id};
use super::gpu::{Gpu, GpuError, GpuResult};
use super::gpu_use::in_use;
use super::health;
use super::nccl::{self, Watchdog, settle};
use crate::gpu_use::GpuUse;
use crate::node_pair::{Met, PairBackend};
use crate::rendezvous::ID_BYTES;
use crate::{CheckError, Progress};
use gpufabric_api::pair::{NetTransport, NicPort, NodePairResult};
use gpufabric_api::result::{Backend, ErrorKind, Phase, PhaseError};
use gpufabric_api::suite::Collective;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

/// How one rank of a pair measures.
pub struct PairSettings {
    /// Warm-up and timed iterations of each collective.
    pub iters: (u32, u32),
    /// Watchdog of each step (init, warm-up, timing): a hung collective is aborted.
    pub timeout: Duration,
}

/// One rank of a node pair on real GPUs: the steps of [`crate::node_pair`]. A missing driver
/// or library is an error; a failing or hanging collective is a phase error in the
/// document.
pub struct CudaPair {
    set: PairSettings,
    /// NCCL's INFO log, when this process pointed it at a file ([`prepare`](Self::prepare)).
    nccl_log: Option<PathBuf>,
    /// NVML over the node's GPUs, from the look after meeting to the last.
    monitor: Option<health::Monitor>,
    /// The GPUs, opened once other work was found not to hold them.
    gpus: Vec<Gpu>,
    /// What the GPUs had in use once this rank's contexts were open; None until it measured.
    opened: Option<Vec<GpuUse>>,
}

impl CudaPair {
    pub fn new(set: PairSettings) -> CudaPair {
        CudaPair {
            set,
            nccl_log: None,
            monitor: None,
            gpus: Vec::new(),
            opened: None,
        }
    }
}

impl PairBackend for CudaPair {
    fn kind(&self) -> Backend {
        Backend::Cuda
    }

    /// Points NCCL's log at a file (before any NCCL call or thread: NCCL reads its log
    /// settings once), finds NCCL, and refuses GPUs other work holds.
    fn prepare(&mut self, shared: bool, progress: Progress) -> Result<(), CheckError> {
        self.nccl_log = nccl::debug_file();
        nccl::require()?;
        super::refuse_shared_gpus(shared, progress)
    }

    fn make_id(&mut self) -> Result<[u8; ID_BYTES], CheckError> {
        let id = nccl::unique_id().map_err(|e| {
            CheckError::Other(format!("NCCL could not make the pair's unique id: {e}"))
        })?;
        let mut bytes = [0u8; ID_BYTES];
        for (b, c) in bytes.iter_mut().zip(id.internal.iter()) {
            *b = *c as u8;
        }
        Ok(bytes)
    }

    /// The second look, before this process's contexts exist (the first was before the
    /// rendezvous), in the NVML session the look after the measurements uses.
    fn look_again(&mut self, shared: bool) -> Result<(), CheckError> {
        let n = super::count_gpus()?;
        self.monitor = super::open_monitor(n);
        super::refuse_gpus_in_use(self.monitor.as_ref(), shared, &|_| {})?;
        self.gpus = super::open_devices(n)?;
        Ok(())
    }

    fn measure(&mut self, met: &mut Met, doc: &mut NodePairResult) -> Result<(), CheckError> {
        let nics = crate::nic::read_ports(std::path::Path::new(crate::nic::SYSFS_ROOT));
        doc.nics = nics.unwrap_or_default();
        doc.gpus_per_node = self.gpus.len() as u32;
        // Both nodes of a pair share the agent's environment, so both stop here alike.
        let blocking = std::env::var("CUDA_LAUNCH_BLOCKING").ok();
        if let Some(why) = super::blocking_launches(self.gpus.len(), blocking.as_deref()) {
            doc.errors.push(PhaseError {
                phase: Phase::NodePair,
                kind: ErrorKind::Unavailable,
                message: why,
            });
            return Ok(());
        }
        self.opened = Some(in_use(self.monitor.as_ref()));
        let gpus = std::mem::take(&mut self.gpus);
        if let Err(e) = measure(&self.set, gpus, met, doc) {
            doc.errors.push(phase_error(&e));
        }
        if let Some(log) = self.nccl_log.as_ref()
            && let Ok(text) = std::fs::read_to_string(log)
        {
            let (transport, nics) = net_transport(&text, &doc.nics);
            doc.transport = transport;
            doc.nics_used = nics;
        }
        Ok(())
    }

    /// Work that started on this node's GPUs while the pair measured shared them with it;
    /// nothing to look at without NVML or before measuring.
    fn end_look(&mut self) -> Result<(), CheckError> {
        match (&self.opened, &self.monitor) {
            (Some(opened), Some(monitor)) => {
                crate::gpu_use::refuse_after(opened, &monitor.gpu_use())
            }
            _ => Ok(()),
        }
    }
}

fn phase_error(e: &GpuError) -> PhaseError {
    super::phase_error(Phase::NodePair, e)
}

fn measure(
    set: &PairSettings,
    gpus: Vec<Gpu>,
    met: &mut Met,
    doc: &mut NodePairResult,
) -> GpuResult<()> {
    let opts = met.opts;
    let g = gpus.len() as i32;
    let world = 2 * g;
    let first = opts.rank as i32 * g;
    let mut comms = init_ranks(&gpus, unique_id(met.id), world, first)?;
    met.joined.store(true, std::sync::atomic::Ordering::SeqCst);
    let bytes = opts.bytes.max(4 * world as u64) / 4 * 4;
    let mut local = Local::new(gpus, first, world, bytes as usize)?;
    let wd = Watchdog::start();
    let mut timing = Timing {
        iters: set.iters,
        timeout: set.timeout,
        wd: &wd,
        barrier: &mut *met.barrier,
        what: "node-pair",
    };
    for &c in &opts.collectives {
        if !matches!(
            c,
            Collective::AllReduce | Collective::SendRecv | Collective::AllToAll
        ) {
            continue;
        }
        match time_one(c, &mut comms, &mut local, bytes, &mut timing) {
            Ok(pc) => doc.collectives.push(pc),
            Err(e) => return Err(settle(e, &mut comms, &wd, set.timeout)),
        }
    }
    Ok(())
}

/// The network transport NCCL's INFO log shows between the nodes (`via NET/IB/3/GDRDMA`,
/// `via NET/Socket/0`) and how many distinct NICs it used; IB on Ethernet ports is RoCE.
/// None when the log shows no network channel.
pub(crate) fn net_transport(log: &str, nics: &[NicPort]) -> (Option<NetTransport>, u32) {
    let mut ib = BTreeSet::new();
    let mut socket = BTreeSet::new();
    let mut other = false;
    for line in log.lines() {
        let Some(pos) = line.find(" via NET/") else {
            continue;
        };
        let rest = &line[pos + " via NET/".len()..];
        let mut parts = rest.split('/');
        let kind = parts.next().unwrap_or_default();
        let dev = parts
            .next()
            .map(|d| d.trim().to_string())
            .unwrap_or_default();
        match kind {
            "IB" => {
                ib.insert(dev);
            }
            "Socket" => {
                socket.insert(dev);
            }
            _ => other = true,
        }
    }
    if !ib.is_empty() {
        let ethernet = nics
            .iter()
            .filter(|p| p.is_up())
            .all(|p| p.link_layer.as_deref() == Some("Ethernet"))
            && nics.iter().any(|p| p.is_up());
        let t = if ethernet {
            NetTransport::Roce
        } else {
            NetTransport::Ib
        };
        (Some(t), ib.len() as u32)
    } else if !socket.is_empty() {
        (Some(NetTransport::Socket), socket.len() as u32)
    } else if other {
        (Some(NetTransport::Unknown), 0)
    } else {
        (None, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn port(link: &str) -> NicPort {
        NicPort {
            device: "mlx5_0".into(),
            port: 1,
            link_layer: Some(link.into()),
            state: "ACTIVE".into(),
            phys_state: "LinkUp".into(),
            rate_gbps: Some(400.0),
            errors: Default::default(),
        }
    }

    #[test]
    fn the_transport_and_nic_count_come_from_the_net_channels_of_the_log() {
        let ib = "h0:1:2 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0/GDRDMA\n\
                  h0:1:2 [0] NCCL INFO Channel 01/0 : 1[0] -> 0[0] [receive] via NET/IB/3/GDRDMA\n\
                  h0:1:2 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[0] [send] via NET/IB/3/GDRDMA\n";
        assert_eq!(
            net_transport(ib, &[port("InfiniBand")]),
            (Some(NetTransport::Ib), 2)
        );
        assert_eq!(
            net_transport(ib, &[port("Ethernet")]),
            (Some(NetTransport::Roce), 2)
        );
        let sock = "h0:1:2 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0\n";
        assert_eq!(net_transport(sock, &[]), (Some(NetTransport::Socket), 1));
        let p2p = "h0:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n";
        assert_eq!(net_transport(p2p, &[]), (None, 0));
    }
}
