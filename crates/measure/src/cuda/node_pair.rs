//! The cuda backend's node pair: every visible GPU of this node joins, as ranks
//! `rank x G .. rank x G + G - 1`, one NCCL clique of 2 x G ranks over the two nodes, through
//! the unique id the rendezvous handed over. Each collective runs at the pair's size:
//! warm-up iterations, a barrier with the other node, then timed iterations (host time per
//! iteration, as nccl-tests reports it), busbw by nccl-tests' factors for 2 x G ranks.
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

use super::gpu::{DevBuf, Gpu, GpuError, GpuResult, HostBuf, Stream};
use super::gpu_use::in_use;
use super::health;
use super::nccl::{self, Comms, Watchdog, alltoall_call, group, ncheck, settle, sync_all};
use crate::gpu_use::GpuUse;
use crate::node_pair::{Met, PairBackend};
use crate::rendezvous::{ID_BYTES, RendezvousError};
use crate::{CheckError, Progress, stats};
use cudarc::nccl::sys as nsys;
use gpufabric_api::pair::{NetTransport, NicPort, NodePairResult, PairCollective};
use gpufabric_api::result::{Backend, ErrorKind, Phase, PhaseError};
use gpufabric_api::suite::Collective;
use std::collections::BTreeSet;
use std::ffi::c_void;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Elements of each rank checked after a collective.
const CHECKED: usize = 1 << 20;

/// How one rank of a pair measures.
pub struct PairSettings {
    /// Warm-up and timed iterations of each collective.
    pub iters: (u32, u32),
    /// Watchdog of each step (init, warm-up, timing): a hung collective is aborted.
    pub timeout: Duration,
}

/// This node's GPUs in the clique: ranks `first ..` of `world`.
struct Local {
    first: i32,
    world: i32,
    gpus: Vec<Gpu>,
    streams: Vec<Stream>,
    send: Vec<DevBuf>,
    recv: Vec<DevBuf>,
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
    let (opts, id) = (met.opts, met.id);
    let g = gpus.len() as i32;
    let world = 2 * g;
    let first = opts.rank as i32 * g;
    let mut uid = nsys::ncclUniqueId { internal: [0; 128] };
    for (d, s) in uid.internal.iter_mut().zip(id.iter()) {
        *d = *s as std::ffi::c_char;
    }
    let mut comms = init_ranks(&gpus, uid, world, first)?;
    met.joined.store(true, std::sync::atomic::Ordering::SeqCst);
    let bytes = (opts.bytes.max(4 * world as u64) / 4 * 4) as usize;
    let mut local = Local {
        first,
        world,
        streams: gpus.iter().map(Stream::new).collect::<GpuResult<_>>()?,
        send: gpus
            .iter()
            .map(|gpu| DevBuf::new(gpu, bytes))
            .collect::<GpuResult<_>>()?,
        recv: gpus
            .iter()
            .map(|gpu| DevBuf::new(gpu, bytes))
            .collect::<GpuResult<_>>()?,
        gpus,
    };
    let wd = Watchdog::start();
    for &c in &opts.collectives {
        if !matches!(
            c,
            Collective::AllReduce | Collective::SendRecv | Collective::AllToAll
        ) {
            continue;
        }
        let r = time_one(
            c,
            &mut comms,
            &mut local,
            bytes,
            set,
            &wd,
            &mut *met.barrier,
        );
        match r {
            Ok(pc) => doc.collectives.push(pc),
            Err(e) => return Err(settle(e, &mut comms, &wd, set.timeout)),
        }
    }
    Ok(())
}

/// One communicator per local GPU, ranks `first ..` of `world`, created in one NCCL group.
fn init_ranks(gpus: &[Gpu], id: nsys::ncclUniqueId, world: i32, first: i32) -> GpuResult<Comms> {
    let mut raw: Vec<nsys::ncclComm_t> = vec![std::ptr::null_mut(); gpus.len()];
    group(|| {
        for (i, (gpu, slot)) in gpus.iter().zip(raw.iter_mut()).enumerate() {
            gpu.bind()?;
            // SAFETY: valid out-pointer; the id comes from ncclGetUniqueId on rank 0.
            ncheck("ncclCommInitRank", unsafe {
                nsys::ncclCommInitRank(slot, world, id, first + i as i32)
            })?;
        }
        Ok(())
    })?;
    Ok(Comms::from_raw(raw))
}

/// What one rank's buffers hold: `rank + 1` as f32 everywhere.
fn fill(local: &Local) -> GpuResult<()> {
    let first = local.first;
    for (i, (s, buf)) in local.streams.iter().zip(&local.send).enumerate() {
        let v = (first + i as i32 + 1) as f32;
        s.memset_d32(buf.at(0), v.to_bits(), buf.bytes / 4)?;
        s.memset_d32(local.recv[i].at(0), 0, buf.bytes / 4)?;
    }
    Ok(())
}

/// Enqueues one iteration of `c` on every local rank, in one NCCL group.
fn enqueue(c: Collective, comms: &Comms, local: &Local, count: usize) -> GpuResult<()> {
    let (first, world) = (local.first, local.world);
    let g = local.gpus.len() as i32;
    let dt = nsys::ncclDataType_t::ncclFloat32;
    group(|| {
        for i in 0..local.gpus.len() {
            let comm = comms.raw[i];
            let st = local.streams[i].raw as nsys::cudaStream_t;
            let send = local.send[i].void() as *const c_void;
            let recv = local.recv[i].void();
            let me = first + i as i32;
            // SAFETY: both buffers hold `count` f32; communicator and stream are live.
            unsafe {
                match c {
                    Collective::SendRecv => {
                        let peer = (me + g) % world;
                        ncheck("ncclSend", nsys::ncclSend(send, count, dt, peer, comm, st))?;
                        ncheck("ncclRecv", nsys::ncclRecv(recv, count, dt, peer, comm, st))?;
                    }
                    Collective::AllToAll => {
                        let per = count / world as usize;
                        if alltoall_call() {
                            ncheck(
                                "ncclAlltoAll",
                                nsys::ncclAlltoAll(send, recv, per, dt, comm, st),
                            )?;
                        } else {
                            for p in 0..world {
                                let off = (p as usize * per * 4) as u64;
                                let s = (send as u64 + off) as *const c_void;
                                let r = (recv as u64 + off) as *mut c_void;
                                ncheck("ncclSend", nsys::ncclSend(s, per, dt, p, comm, st))?;
                                ncheck("ncclRecv", nsys::ncclRecv(r, per, dt, p, comm, st))?;
                            }
                        }
                    }
                    _ => ncheck(
                        "ncclAllReduce",
                        nsys::ncclAllReduce(
                            send,
                            recv,
                            count,
                            dt,
                            nsys::ncclRedOp_t::ncclSum,
                            comm,
                            st,
                        ),
                    )?,
                }
            }
        }
        Ok(())
    })
}

fn time_one(
    c: Collective,
    comms: &mut Comms,
    local: &mut Local,
    bytes: usize,
    set: &PairSettings,
    wd: &Watchdog,
    barrier: &mut dyn FnMut() -> Result<(), RendezvousError>,
) -> GpuResult<PairCollective> {
    let count = bytes / 4;
    let what = format!("node-pair {}", c.nccl_tests_name());
    let world = local.world;
    fill(local)?;
    let (warmup, iters) = (set.iters.0, set.iters.1.max(1));
    wd.arm(comms, &what, set.timeout);
    for _ in 0..warmup {
        enqueue(c, comms, local, count)?;
    }
    let streams: Vec<&Stream> = local.streams.iter().collect();
    sync_all(&streams, comms, wd, &what, set.timeout)?;
    barrier().map_err(|e| GpuError::Call {
        call: "rendezvous barrier",
        detail: e.to_string(),
    })?;
    let t0 = Instant::now();
    wd.arm(comms, &what, set.timeout);
    for _ in 0..iters {
        enqueue(c, comms, local, count)?;
    }
    sync_all(&streams, comms, wd, &what, set.timeout)?;
    let time_us = t0.elapsed().as_secs_f64() * 1e6 / f64::from(iters);
    let wrong = check(c, local, count)?;
    let reported = match c {
        // nccl-tests' size of all_to_all is the whole buffer; of the others, one rank's.
        Collective::AllToAll => (count / world as usize * world as usize * 4) as u64,
        _ => bytes as u64,
    };
    Ok(PairCollective {
        collective: c,
        bytes: reported,
        time_us,
        algbw: stats::algbw_gbps(reported, time_us),
        busbw: stats::busbw_gbps(c, world as u32, reported, time_us),
        wrong,
    })
}

/// Elements (of the first [`CHECKED`] of each rank) that do not hold what `c` must give.
fn check(c: Collective, local: &Local, count: usize) -> GpuResult<u64> {
    let (first, world) = (local.first, local.world);
    let g = local.gpus.len() as i32;
    let n = count.min(CHECKED);
    let per = (count / world as usize).max(1);
    let mut wrong = 0u64;
    for (i, gpu) in local.gpus.iter().enumerate() {
        let mut host = HostBuf::new(gpu, n * 4)?;
        local.streams[i].memcpy_dtoh(&mut host, local.recv[i].at(0), n * 4)?;
        local.streams[i].sync()?;
        let me = first + i as i32;
        for (k, chunk) in host.as_slice().chunks_exact(4).enumerate() {
            let got = f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            let want = match c {
                Collective::SendRecv => ((me + g) % world + 1) as f32,
                // Block p of the receive buffer comes from rank p (blocks past the last
                // whole one are not written).
                Collective::AllToAll if k >= per * world as usize => continue,
                Collective::AllToAll => (k / per + 1) as f32,
                _ => (world * (world + 1) / 2) as f32,
            };
            if got != want {
                wrong += 1;
            }
        }
    }
    Ok(wrong)
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
