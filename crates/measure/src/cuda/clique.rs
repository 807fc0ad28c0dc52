//! This node's GPUs as ranks `first .. first + G - 1` of one NCCL clique over several nodes
//! (the node pair's and the multi-node sweep's): the communicators, the buffers, and one
//! collective timed at one size as nccl-tests times it (warm-up iterations, a barrier, timed
//! iterations, host time per iteration), its outputs checked.
//!
//! Sizes are nccl-tests': one rank's buffer of all_reduce and sendrecv; the whole buffer of
//! all_gather's output, reduce_scatter's input and alltoall's (each rank's share of it is
//! `size / ranks`, rounded down to whole f32). Every rank sends `rank + 1` as f32
//! everywhere; all_reduce and reduce_scatter must give `R (R + 1) / 2`, all_gather and
//! alltoall each source's `rank + 1` in its block, sendrecv the peer's `rank + 1` (the GPU
//! of the same index on the next node), over the first 1 Mi elements of each rank.

use super::gpu::{DevBuf, Gpu, GpuError, GpuResult, HostBuf, Stream};
use super::nccl::{Comms, Watchdog, alltoall_call, group, ncheck, sync_all};
use crate::rendezvous::RendezvousError;
use crate::stats;
use cudarc::nccl::sys as nsys;
use gpufabric_api::pair::PairCollective;
use gpufabric_api::suite::Collective;
use std::ffi::c_void;
use std::time::{Duration, Instant};

/// Elements of each rank checked after a collective.
const CHECKED: usize = 1 << 20;

/// This node's GPUs in the clique: ranks `first ..` of `world`, a stream and a send and a
/// receive buffer of the largest size each.
pub(crate) struct Local {
    first: i32,
    world: i32,
    gpus: Vec<Gpu>,
    streams: Vec<Stream>,
    send: Vec<DevBuf>,
    recv: Vec<DevBuf>,
}

impl Local {
    /// `gpus` as ranks `first ..` of `world`, with buffers of `bytes` each.
    pub(crate) fn new(gpus: Vec<Gpu>, first: i32, world: i32, bytes: usize) -> GpuResult<Local> {
        let bufs = || {
            gpus.iter()
                .map(|gpu| DevBuf::new(gpu, bytes))
                .collect::<GpuResult<Vec<_>>>()
        };
        Ok(Local {
            first,
            world,
            streams: gpus.iter().map(Stream::new).collect::<GpuResult<_>>()?,
            send: bufs()?,
            recv: bufs()?,
            gpus,
        })
    }
}

impl Local {
    /// The GPUs back, their streams and buffers freed.
    pub(crate) fn into_gpus(self) -> Vec<Gpu> {
        let Local {
            gpus,
            streams,
            send,
            recv,
            ..
        } = self;
        drop((streams, send, recv));
        gpus
    }
}

/// The unique id rank 0 made, from the bytes the rendezvous handed over.
pub(crate) fn unique_id(bytes: &[u8]) -> nsys::ncclUniqueId {
    let mut uid = nsys::ncclUniqueId { internal: [0; 128] };
    for (d, s) in uid.internal.iter_mut().zip(bytes.iter()) {
        *d = *s as std::ffi::c_char;
    }
    uid
}

/// One communicator per local GPU, ranks `first ..` of `world`, created in one NCCL group.
pub(crate) fn init_ranks(
    gpus: &[Gpu],
    id: nsys::ncclUniqueId,
    world: i32,
    first: i32,
) -> GpuResult<Comms> {
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

/// The elements one rank passes NCCL for `c` at nccl-tests' size `bytes` over `world`
/// ranks (all_gather's send count, reduce_scatter's receive count, alltoall's per-peer
/// count, else the whole buffer), and the size it reports: whole f32 and whole shares.
pub(crate) fn count_of(c: Collective, bytes: u64, world: i32) -> (usize, u64) {
    let elems = (bytes / 4) as usize;
    match c {
        Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => {
            let per = elems / world.max(1) as usize;
            (per, (per * world as usize * 4) as u64)
        }
        _ => (elems, (elems * 4) as u64),
    }
}

/// What one rank's buffers hold: `rank + 1` as f32 everywhere to send, zeros to receive.
fn fill(local: &Local) -> GpuResult<()> {
    let first = local.first;
    for (i, (s, buf)) in local.streams.iter().zip(&local.send).enumerate() {
        let v = (first + i as i32 + 1) as f32;
        s.memset_d32(buf.at(0), v.to_bits(), buf.bytes / 4)?;
        s.memset_d32(local.recv[i].at(0), 0, buf.bytes / 4)?;
    }
    Ok(())
}

/// Enqueues one iteration of `c` on every local rank, in one NCCL group; `count` is
/// [`count_of`]'s.
fn enqueue(c: Collective, comms: &Comms, local: &Local, count: usize) -> GpuResult<()> {
    let (first, world) = (local.first, local.world);
    let g = local.gpus.len() as i32;
    let dt = nsys::ncclDataType_t::ncclFloat32;
    let sum = nsys::ncclRedOp_t::ncclSum;
    group(|| {
        for i in 0..local.gpus.len() {
            let comm = comms.raw[i];
            let st = local.streams[i].raw as nsys::cudaStream_t;
            let send = local.send[i].void() as *const c_void;
            let recv = local.recv[i].void();
            let me = first + i as i32;
            // SAFETY: both buffers hold `count x world` f32 at least ([`count_of`] of a size
            // no larger than the buffers); communicator and stream are live.
            unsafe {
                match c {
                    Collective::SendRecv => {
                        let peer = (me + g) % world;
                        ncheck("ncclSend", nsys::ncclSend(send, count, dt, peer, comm, st))?;
                        ncheck("ncclRecv", nsys::ncclRecv(recv, count, dt, peer, comm, st))?;
                    }
                    Collective::AllToAll if alltoall_call() => ncheck(
                        "ncclAlltoAll",
                        nsys::ncclAlltoAll(send, recv, count, dt, comm, st),
                    )?,
                    Collective::AllToAll => {
                        for p in 0..world {
                            let off = (p as usize * count * 4) as u64;
                            let s = (send as u64 + off) as *const c_void;
                            let r = (recv as u64 + off) as *mut c_void;
                            ncheck("ncclSend", nsys::ncclSend(s, count, dt, p, comm, st))?;
                            ncheck("ncclRecv", nsys::ncclRecv(r, count, dt, p, comm, st))?;
                        }
                    }
                    Collective::AllGather => ncheck(
                        "ncclAllGather",
                        nsys::ncclAllGather(send, recv, count, dt, comm, st),
                    )?,
                    Collective::ReduceScatter => ncheck(
                        "ncclReduceScatter",
                        nsys::ncclReduceScatter(send, recv, count, dt, sum, comm, st),
                    )?,
                    _ => ncheck(
                        "ncclAllReduce",
                        nsys::ncclAllReduce(send, recv, count, dt, sum, comm, st),
                    )?,
                }
            }
        }
        Ok(())
    })
}

/// How each collective is timed.
pub(crate) struct Timing<'a> {
    /// Warm-up and timed iterations.
    pub(crate) iters: (u32, u32),
    /// Watchdog of the warm-up and of the timed loop: a hung collective is aborted.
    pub(crate) timeout: Duration,
    pub(crate) wd: &'a Watchdog,
    /// Meets the other nodes before the timed loop (the warm-up's collectives meet them
    /// too; a no-op where they are enough).
    pub(crate) barrier: &'a mut dyn FnMut() -> Result<(), RendezvousError>,
    /// What the watchdog names (`node-pair`, `nccl-nodes 4 nodes`).
    pub(crate) what: &'a str,
}

/// Times `c` at nccl-tests' size `bytes` (no larger than the buffers) and checks its
/// outputs: nccl-tests' row for the clique's `world` ranks.
pub(crate) fn time_one(
    c: Collective,
    comms: &mut Comms,
    local: &mut Local,
    bytes: u64,
    t: &mut Timing,
) -> GpuResult<PairCollective> {
    let (count, reported) = count_of(c, bytes, local.world);
    let what = format!(
        "{} {} {}",
        t.what,
        c.nccl_tests_name(),
        crate::activity::size(reported)
    );
    fill(local)?;
    let (warmup, iters) = (t.iters.0, t.iters.1.max(1));
    t.wd.arm(comms, &what, t.timeout);
    for _ in 0..warmup {
        enqueue(c, comms, local, count)?;
    }
    let streams: Vec<&Stream> = local.streams.iter().collect();
    sync_all(&streams, comms, t.wd, &what, t.timeout)?;
    (t.barrier)().map_err(|e| GpuError::Call {
        call: "rendezvous barrier",
        detail: e.to_string(),
    })?;
    let t0 = Instant::now();
    t.wd.arm(comms, &what, t.timeout);
    for _ in 0..iters {
        enqueue(c, comms, local, count)?;
    }
    sync_all(&streams, comms, t.wd, &what, t.timeout)?;
    let time_us = t0.elapsed().as_secs_f64() * 1e6 / f64::from(iters);
    let wrong = check(c, local, count)?;
    Ok(PairCollective {
        collective: c,
        bytes: reported,
        time_us,
        algbw: stats::algbw_gbps(reported, time_us),
        busbw: stats::busbw_gbps(c, local.world as u32, reported, time_us),
        wrong,
    })
}

/// What element `k` of rank `me`'s output must hold after `c` with [`count_of`]'s `count`;
/// None where `c` writes nothing.
fn expected(c: Collective, me: i32, g: i32, world: i32, count: usize, k: usize) -> Option<f32> {
    let whole = count * world as usize;
    match c {
        Collective::SendRecv => Some(((me + g) % world + 1) as f32),
        // Block p of the receive buffer comes from rank p.
        Collective::AllToAll | Collective::AllGather if k >= whole => None,
        Collective::AllToAll | Collective::AllGather => Some((k / count.max(1) + 1) as f32),
        Collective::ReduceScatter if k >= count => None,
        _ => Some((world * (world + 1) / 2) as f32),
    }
}

/// Elements (of the first [`CHECKED`] of each rank) that do not hold what `c` must give.
fn check(c: Collective, local: &Local, count: usize) -> GpuResult<u64> {
    let (first, world) = (local.first, local.world);
    let g = local.gpus.len() as i32;
    let written = match c {
        Collective::AllToAll | Collective::AllGather => count * world as usize,
        _ => count,
    };
    let n = written.min(CHECKED);
    let mut wrong = 0u64;
    for (i, gpu) in local.gpus.iter().enumerate() {
        let mut host = HostBuf::new(gpu, n * 4)?;
        local.streams[i].memcpy_dtoh(&mut host, local.recv[i].at(0), n * 4)?;
        local.streams[i].sync()?;
        let me = first + i as i32;
        for (k, chunk) in host.as_slice().chunks_exact(4).enumerate() {
            let got = f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
            if expected(c, me, g, world, count, k).is_some_and(|want| got != want) {
                wrong += 1;
            }
        }
    }
    Ok(wrong)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_nccl_tests_whole_buffer_for_the_split_collectives() {
        // 16 ranks: all_gather of 1 MiB sends 1 MiB / 16 from each rank.
        assert_eq!(
            count_of(Collective::AllGather, 1 << 20, 16),
            (1 << 14, 1 << 20)
        );
        assert_eq!(
            count_of(Collective::AllReduce, 1 << 20, 16),
            (1 << 18, 1 << 20)
        );
        // A size that does not split evenly reports what ran.
        assert_eq!(count_of(Collective::AllToAll, 1000, 3), (83, 996));
        assert_eq!(count_of(Collective::ReduceScatter, 8, 4), (0, 0));
    }

    #[test]
    fn each_collective_expects_its_sources_values_in_their_blocks() {
        // 4 ranks, 2 GPUs per node, 3 elements per share.
        let e = |c, k| expected(c, 1, 2, 4, 3, k);
        assert_eq!(e(Collective::AllGather, 0), Some(1.0));
        assert_eq!(e(Collective::AllGather, 11), Some(4.0));
        assert_eq!(e(Collective::AllGather, 12), None);
        assert_eq!(e(Collective::ReduceScatter, 2), Some(10.0));
        assert_eq!(e(Collective::ReduceScatter, 3), None);
        assert_eq!(e(Collective::AllReduce, 100), Some(10.0));
        assert_eq!(e(Collective::SendRecv, 0), Some(4.0));
    }
}
