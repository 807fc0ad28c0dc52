//! The sweep's ranks and the one call it makes on them: each rank's buffers, stream and
//! events ([`Rank`]), the sweep's settings, a collective call of one size ([`Op`]), its
//! enqueue on every rank, and the inputs it reads.

use super::comm::{Comms, group};
use super::ncheck;
use crate::cuda::gpu::{DevBuf, Event, Gpu, GpuResult, HostBuf, Stream};
use cudarc::nccl::sys as nsys;
use gpufabric_api::suite::{Collective, DataType};
use std::ffi::c_void;
use std::time::Duration;

/// Per-rank buffers and streams of the sweep.
pub(crate) struct Rank<'g> {
    pub gpu: &'g Gpu,
    pub stream: Stream,
    pub send: DevBuf,
    pub recv: DevBuf,
    pub input: DevBuf,
    pub host: HostBuf,
    pub start: Event,
    pub end: Event,
}

/// Settings of one sweep.
pub(crate) struct SweepSettings {
    pub sizes: Vec<u64>,
    pub warmup: u32,
    pub iters: u32,
    pub data_type: DataType,
    pub timeout: Duration,
    pub check: bool,
    /// The CPU the timed iterations are launched from (held only while they run).
    pub launch: Option<crate::launch_cpu::Launch>,
    /// Launches of a CUDA graph of the `iters` iterations that one timed block makes, as
    /// nccl-tests' `-G`; 0 (the default) launches every iteration from the host.
    pub graph_launches: u32,
}

impl SweepSettings {
    /// Pins the calling thread to the launch CPU, if one was chosen, until the guard drops.
    pub(super) fn hold_launch_cpu(&self) -> Option<crate::launch_cpu::Pin> {
        self.launch.as_ref().and_then(|l| l.hold().ok())
    }
}

/// One collective call of the sweep: what [`enqueue`] needs besides the ranks.
#[derive(Clone, Copy, Debug)]
pub(super) struct Op {
    pub(super) c: Collective,
    pub(super) dt: nsys::ncclDataType_t,
    pub(super) elem: u64,
    pub(super) sc: u64,
    pub(super) rc: u64,
    pub(super) in_place: bool,
    /// Bytes one call covers (the nccl-tests size).
    pub(super) total: u64,
    /// Largest such size of the sweep: the buffers hold at least this much.
    pub(super) max_total: u64,
}

impl Op {
    /// The call as the watchdog and errors name it ("all_reduce 8 bytes").
    pub(super) fn what(&self) -> String {
        format!("{} {} bytes", self.c.nccl_tests_name(), self.total)
    }

    /// Where iteration `iter` places its buffers, as nccl-tests does: consecutive
    /// iterations move by one size through the buffers sized for the largest, so a size
    /// that fits the L2 cache is not timed from it (one H200 timed 16 MiB at 7.0 µs from
    /// L2 against nccl-tests' 11.1 µs before).
    pub(super) fn shift(&self, iter: u32) -> u64 {
        let steps = self.max_total.checked_div(self.total).unwrap_or(1).max(1);
        self.total * (u64::from(iter) % steps)
    }
}

/// Whether the loaded NCCL has `ncclAlltoAll` (2.28 and later): nccl-tests times that call
/// where it exists, and grouped sends and receives before it, and so does the sweep.
pub(crate) fn alltoall_call() -> bool {
    super::nccl_version_code().is_some_and(|v| v >= 22800)
}

/// Enqueues the call `op` on every rank (one NCCL group).
pub(super) fn enqueue(op: &Op, comms: &Comms, ranks: &[Rank]) -> GpuResult<()> {
    enqueue_at(op, comms, ranks, 0)
}

/// [`enqueue`] with both buffers `shift` bytes further in (see [`Op::shift`]).
pub(super) fn enqueue_at(op: &Op, comms: &Comms, ranks: &[Rank], shift: u64) -> GpuResult<()> {
    let &Op {
        c,
        dt,
        elem,
        sc: send_count,
        rc: recv_count,
        in_place,
        ..
    } = op;
    let n = ranks.len() as u64;
    group(|| {
        for (r, rk) in ranks.iter().enumerate() {
            let comm = comms.raw[r];
            let st = rk.stream.raw as nsys::cudaStream_t;
            let (send, recv) = buffers(c, rk, r as u64, elem, send_count, recv_count, in_place);
            let send = (send as u64 + shift) as *const c_void;
            let recv = (recv as u64 + shift) as *mut c_void;
            let sc = send_count as usize;
            let rc = recv_count as usize;
            use nsys::ncclRedOp_t::ncclSum;
            // SAFETY: buffers hold at least send/recv counts of elements (sized for the
            // largest size of the sweep); the communicator and stream are live.
            unsafe {
                match c {
                    Collective::AllReduce => ncheck(
                        "ncclAllReduce",
                        nsys::ncclAllReduce(send, recv, sc, dt, ncclSum, comm, st),
                    )?,
                    Collective::AllGather => ncheck(
                        "ncclAllGather",
                        nsys::ncclAllGather(send, recv, sc, dt, comm, st),
                    )?,
                    Collective::ReduceScatter => ncheck(
                        "ncclReduceScatter",
                        nsys::ncclReduceScatter(send, recv, rc, dt, ncclSum, comm, st),
                    )?,
                    Collective::Broadcast => ncheck(
                        "ncclBroadcast",
                        nsys::ncclBroadcast(send, recv, sc, dt, 0, comm, st),
                    )?,
                    Collective::Reduce => ncheck(
                        "ncclReduce",
                        nsys::ncclReduce(send, recv, sc, dt, ncclSum, 0, comm, st),
                    )?,
                    Collective::AllToAll if alltoall_call() => {
                        let per = (sc as u64 / n) as usize;
                        ncheck(
                            "ncclAlltoAll",
                            nsys::ncclAlltoAll(send, recv, per, dt, comm, st),
                        )?;
                    }
                    Collective::AllToAll => {
                        let per = (sc as u64 / n) as usize;
                        for p in 0..n as usize {
                            let off = (p * per) as u64 * elem;
                            ncheck(
                                "ncclSend",
                                nsys::ncclSend(
                                    (send as u64 + off) as *const c_void,
                                    per,
                                    dt,
                                    p as i32,
                                    comm,
                                    st,
                                ),
                            )?;
                            ncheck(
                                "ncclRecv",
                                nsys::ncclRecv(
                                    (recv as u64 + off) as *mut c_void,
                                    per,
                                    dt,
                                    p as i32,
                                    comm,
                                    st,
                                ),
                            )?;
                        }
                    }
                    Collective::SendRecv => {
                        let next = ((r as u64 + 1) % n) as i32;
                        let prev = ((r as u64 + n - 1) % n) as i32;
                        ncheck("ncclSend", nsys::ncclSend(send, sc, dt, next, comm, st))?;
                        ncheck("ncclRecv", nsys::ncclRecv(recv, rc, dt, prev, comm, st))?;
                    }
                }
            }
        }
        Ok(())
    })
}

fn buffers(
    c: Collective,
    rk: &Rank,
    r: u64,
    elem: u64,
    send_count: u64,
    recv_count: u64,
    in_place: bool,
) -> (*const c_void, *mut c_void) {
    if !in_place {
        return (rk.send.ptr as *const c_void, rk.recv.void());
    }
    match c {
        // In place, nccl-tests' layout: the rank's input is its slot of the output.
        Collective::AllGather => (
            rk.recv.at((r * send_count * elem) as usize) as *const c_void,
            rk.recv.void(),
        ),
        Collective::ReduceScatter => (
            rk.recv.ptr as *const c_void,
            rk.recv.at((r * recv_count * elem) as usize) as *mut c_void,
        ),
        _ => (rk.recv.ptr as *const c_void, rk.recv.void()),
    }
}

/// Where the in-place input lives in `recv` (byte offset) for a collective.
fn in_place_input_offset(c: Collective, r: u64, elem: u64, send_count: u64) -> u64 {
    match c {
        Collective::AllGather => r * send_count * elem,
        _ => 0,
    }
}

/// Copies each rank's inputs (kept in `input`) to where the collective reads them.
pub(super) fn load_inputs(
    c: Collective,
    ranks: &[Rank],
    elem: u64,
    sc: u64,
    in_place: bool,
) -> GpuResult<()> {
    for (r, rk) in ranks.iter().enumerate() {
        let bytes = (sc * elem) as usize;
        if in_place {
            let off = in_place_input_offset(c, r as u64, elem, sc) as usize;
            rk.stream
                .memcpy_dtod(rk.recv.at(off), rk.input.ptr, bytes)?;
        } else {
            rk.stream.memcpy_dtod(rk.send.ptr, rk.input.ptr, bytes)?;
            // Poison the output so that an element nothing wrote is counted wrong.
            rk.stream
                .memset_d32(rk.recv.ptr, 0xdead_beef, rk.recv.bytes / 4)?;
        }
    }
    Ok(())
}

/// Records each rank's start event on its stream.
pub(super) fn record_starts(ranks: &[Rank]) -> GpuResult<()> {
    for rk in ranks {
        rk.start.record(&rk.stream)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iterations_move_through_the_buffers_like_nccl_tests() {
        let op = |total, max_total| Op {
            c: Collective::AllReduce,
            dt: nsys::ncclDataType_t::ncclFloat32,
            elem: 4,
            sc: total / 4,
            rc: total / 4,
            in_place: false,
            total,
            max_total,
        };
        // 16 MiB in buffers for 1 GiB: 64 places, one size apart.
        let o = op(16 << 20, 1 << 30);
        assert_eq!(o.shift(0), 0);
        assert_eq!(o.shift(1), 16 << 20);
        assert_eq!(o.shift(19), 19 * (16 << 20));
        assert_eq!(o.shift(64), 0);
        // The largest size never moves; the last place still fits the buffers.
        assert_eq!(op(1 << 30, 1 << 30).shift(7), 0);
        let o = op(3 << 20, 10 << 20);
        assert!((0..100).all(|i| o.shift(i) + o.total <= o.max_total));
        assert_eq!(op(0, 1 << 30).shift(5), 0);
    }
}
