//! The node check's NCCL sweep phase: communicators, buffers and inputs on every GPU, then
//! each collective of the suite in nccl-tests' order; which failures end the phase.

use super::{
    Comms, Rank, SweepSettings, Watchdog, comm_buffer, fill_inputs, settle, sweep_collective,
};
use crate::cuda::gpu::{self, Gpu, GpuError, HostBuf, Stream};
use crate::cuda::{CudaOptions, phase_error, unavailable};
use crate::node_check::PhaseRun;
use gpufabric_api::result::{NcclSweepResult, Phase, PhaseError};
use gpufabric_api::suite::Collective;
use std::time::Instant;

/// The NCCL sweep of every collective of the suite.
#[tracing::instrument(name = "ncclSweep", skip_all)]
pub(crate) fn sweep(
    run: &PhaseRun,
    cuda: &CudaOptions,
    gpus: &[Gpu],
    wd: &Watchdog,
) -> Result<(NcclSweepResult, Vec<PhaseError>), GpuError> {
    let (opts, timeout, progress) = (run.opts, run.timeout, run.progress);
    let cfg = &opts.suite.nccl_sweep;
    // `--quick` reduces sizes and iterations the same way for both backends.
    let sizes = opts.sweep_sizes();
    let (warmup, iters) = opts.sweep_iters();
    let max = sizes.iter().copied().max().unwrap_or(8);
    let elem = cfg.data_type.size() as usize;
    // Largest buffer: n elements at least (one per rank) for the smallest sizes. Not the
    // largest size exactly, as nccl-tests allocates: on 2 x H100 that build timed all_reduce
    // 16 MiB 1.2% slower than this one in the same call (the buffers' place in the GPU's
    // memory moves that size by about 1%; bench/results/h100x2-2026-11-26-alloc.md).
    let buf = cfg.buffer_bytes(max, gpus.len() as u32) as usize;
    let devs: Vec<i32> = gpus.iter().map(|g| g.index as i32).collect();
    let setup = Instant::now();
    crate::activity::enter("NCCL sweep: creating the communicators and buffers");
    let mut comms = Comms::init(&devs)?;
    // The send and receive buffers of every rank come first, right after the
    // communicators, as nccl-tests allocates them (before anything else of the sweep's).
    // On 2 x H100 this did not move busbw at 16 MiB - 1 GiB beyond the spread between
    // rounds (bench/results/h100x2-2026-11-26-alloc.md).
    let mut comm_bufs = Vec::new();
    // Which allocators gave the send and receive buffers (comm_buffer).
    let mut allocators = std::collections::BTreeSet::new();
    for g in gpus {
        let (send, from_send) = comm_buffer(g, buf)?;
        let (recv, from_recv) = comm_buffer(g, buf)?;
        allocators.extend([from_send, from_recv]);
        comm_bufs.push((send, recv));
    }
    let mut ranks = Vec::new();
    for ((r, g), (send, recv)) in gpus.iter().enumerate().zip(comm_bufs) {
        let mut host = HostBuf::new(g, buf)?;
        let count = (buf / elem) as u64;
        fill_inputs(cfg.data_type, r as u64, count, host.as_mut_slice());
        let input = gpu::DevBuf::new(g, buf)?;
        let stream = Stream::new(g)?;
        stream.memcpy_htod(input.ptr, &host, buf)?;
        stream.sync()?;
        ranks.push(Rank {
            gpu: g,
            stream,
            send,
            recv,
            input,
            host,
            start: gpu::Event::new(g)?,
            end: gpu::Event::new(g)?,
        });
    }
    progress(&format!(
        "nccl sweep: communicators, buffers ({}) and inputs ready in {:.2} s",
        allocators.into_iter().collect::<Vec<_>>().join("; "),
        setup.elapsed().as_secs_f64()
    ));
    let mut set = SweepSettings {
        sizes,
        warmup,
        iters,
        data_type: cfg.data_type,
        timeout,
        check: cuda.check_values,
        launch: None,
        graph_launches: cfg.graph_launches,
    };
    if set.graph_launches > 0 {
        progress(&format!(
            "nccl sweep: each block records its {iters} iterations into a CUDA graph per GPU and \
             times {} launches of them (nccl-tests' -G {0}), from one thread per GPU{}",
            set.graph_launches,
            if cuda.launch_pin {
                "; --pin-launch-cpu does not apply to them"
            } else {
                ""
            }
        ));
    }
    let launch_pin = pins_launches(cuda.launch_pin, set.graph_launches);
    let mut out = Vec::new();
    let mut errors = Vec::new();
    let wanted: Vec<Collective> = Collective::ALL
        .into_iter()
        .filter(|c| cfg.collectives.contains(c))
        .collect();
    for c in wanted {
        // Small sizes time the host's launches: when asked, time each collective's iterations
        // from the CPU that runs a fixed piece of work fastest now (crate::launch_cpu).
        set.launch = None;
        if launch_pin {
            match crate::launch_cpu::probe() {
                Ok(launch) => {
                    progress(&format!(
                        "nccl sweep: {}, {}",
                        c.nccl_tests_name(),
                        launch.choice.describe()
                    ));
                    set.launch = Some(launch);
                }
                Err(e) => progress(&format!(
                    "nccl sweep: {}, launching thread left unpinned ({e})",
                    c.nccl_tests_name()
                )),
            }
        } else {
            progress(&format!("nccl sweep: {}", c.nccl_tests_name()));
        }
        match sweep_collective(c, &mut comms, &mut ranks, wd, &set, progress) {
            Ok(s) => out.push(s),
            Err(e) => {
                let e = settle(e, &mut comms, wd, timeout);
                progress(&format!("nccl sweep: {} failed: {e}", c.nccl_tests_name()));
                match e {
                    GpuError::Timeout(..) | GpuError::MemoryFull { .. } => {
                        // After a timeout the communicators are aborted; on a full GPU the
                        // next collective would meet the same memory: the rest cannot run.
                        errors.push(phase_error(Phase::NcclSweep, &e));
                        break;
                    }
                    GpuError::Refused { .. } => {
                        // The node's software refuses CUDA graphs: every collective would
                        // meet the same refusal, and it says nothing about the GPUs.
                        errors.push(graphs_refused(&e));
                        break;
                    }
                    GpuError::SuiteTooLarge { .. } => {
                        // The buffers are the sweep's, whichever collective met the limit.
                        errors.push(phase_error(Phase::NcclSweep, &e));
                        break;
                    }
                    // NCCL refusing its settings (NCCL_ALGO naming an algorithm this
                    // collective lacks) may refuse this collective alone: go on.
                    GpuError::Call { .. } | GpuError::Misconfigured { .. } => {
                        errors.push(phase_error(Phase::NcclSweep, &e))
                    }
                }
            }
        }
    }
    drop(ranks);
    drop(comms);
    Ok((
        NcclSweepResult {
            collectives: out,
            graph_launches: set.graph_launches,
        },
        errors,
    ))
}

/// Whether the sweep pins its launching thread (`--pin-launch-cpu`): not with graph
/// launches, which come from one thread per GPU; those threads would inherit the pin and
/// share its one CPU (on 4 x H200, all_reduce read 12.7-13.8 us against 9.4-10.1 so).
fn pins_launches(asked: bool, graph_launches: u32) -> bool {
    asked && graph_launches == 0
}

/// The sweep's error when the node refuses CUDA graph capture (`graphLaunches` > 0): the
/// phase could not run as asked, which is no finding against the node's hardware.
fn graphs_refused(e: &GpuError) -> PhaseError {
    unavailable(
        Phase::NcclSweep,
        &format!(
            "CUDA graphs cannot be used here ({e}); the sweep needs suite.ncclSweep.graphLaunches 0 (node-check -G 0) on this node"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufabric_api::result::ErrorKind;

    #[test]
    fn the_launching_thread_is_pinned_only_when_asked_and_without_graphs() {
        assert!(pins_launches(true, 0));
        assert!(!pins_launches(true, 10));
        assert!(!pins_launches(false, 0));
    }

    #[test]
    fn a_node_that_refuses_cuda_graphs_gets_no_fault_from_the_sweep() {
        let refused = GpuError::Refused {
            call: "cuGraphInstantiate",
            detail: "operation not permitted when stream is capturing".into(),
        };
        let e = graphs_refused(&refused);
        assert_eq!(e.phase, Phase::NcclSweep);
        assert_eq!(e.kind, ErrorKind::Unavailable);
        assert!(
            e.message.contains("cuGraphInstantiate was refused")
                && e.message.contains("graphLaunches 0"),
            "{}",
            e.message
        );
        assert_eq!(
            phase_error(Phase::NcclSweep, &refused).kind,
            ErrorKind::Unavailable
        );
        let fault = GpuError::Call {
            call: "cuGraphLaunch",
            detail: "an illegal memory access was encountered".into(),
        };
        assert_eq!(
            phase_error(Phase::NcclSweep, &fault).kind,
            ErrorKind::Failed
        );
    }
}
