//! How the sweep times one size: nccl-tests' warm-up and block of iterations, short blocks
//! repeated (in rounds over a collective's short sizes) and the median kept, buffers moved
//! per iteration as nccl-tests does.

use super::comm::{Comms, Watchdog, sync_all};
use super::launch::launch_graphs;
use super::rank::{Op, Rank, SweepSettings, enqueue_at, load_inputs, record_starts};
use crate::cuda::gpu::{Gpu, GpuResult, Stream};
use crate::cuda::graph::Capture;
use std::time::{Duration, Instant};

/// Time per iteration of one size: host time (what nccl-tests reports) and GPU event time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Timing {
    pub host_us: f64,
    pub gpu_us: f64,
}

/// How long a collective's first size runs back to back before the sweep times it.
pub(crate) const RAMP: Duration = Duration::from_millis(50);
/// Most rounds of 5 calls spent on [`RAMP`] (a call of the smallest size takes ~20 µs).
pub(super) const RAMP_ROUNDS_MAX: u32 = 2000;

/// Most timed blocks of one size; short blocks are repeated (see [`blocks_wanted`]).
pub(crate) const MAX_BLOCKS: u32 = 5;
/// A block shorter than this is repeated, up to [`MAX_BLOCKS`] times. At 1 ms the sizes of
/// nccl-tests' latency range (<= 1 MiB, 0.2-0.6 ms a block of 20 on H200) are repeated and
/// its bandwidth range (>= 16 MiB, 1 ms and more) is timed once, as nccl-tests times it:
/// with 2 ms, 16 MiB all_to_all on 2 x H200 (1.0-1.1 ms a block) was the median of five
/// blocks, which leaves out the slower first block that nccl-tests' single one is.
pub(crate) const SHORT_BLOCK: Duration = Duration::from_millis(1);

/// Host time over GPU time above which a block counts as stalled and is timed again (the
/// two agree within a few percent at every size when the host keeps up: 17.6 / 17.1 us at
/// 8 B, 79.4 / 78.8 us at 16 MiB on 2 x H200).
pub(super) const STALL: f64 = 1.2;

/// Whether another timed block is wanted after `done` blocks, the shortest of which took
/// `shortest`: one block of n iterations is nccl-tests' measurement; sizes whose blocks can
/// be shorter than [`SHORT_BLOCK`] (small sizes, where a single preemption of the launching
/// thread moves the mean by tens of percent) are repeated up to [`MAX_BLOCKS`] times and the
/// median kept.
pub(crate) fn blocks_wanted(done: u32, shortest: Duration) -> bool {
    done < MAX_BLOCKS && shortest < SHORT_BLOCK
}

/// The median of `v` (the upper middle of an even count); 0 when empty.
pub(crate) fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    s.sort_by(f64::total_cmp);
    s.get(s.len() / 2).copied().unwrap_or(0.0)
}

/// The timed blocks of one size and placement so far.
#[derive(Debug, Default)]
pub(super) struct Blocks {
    /// Host time per iteration of each block, µs.
    host: Vec<f64>,
    /// GPU event time per iteration of each block (the slowest rank's), µs.
    gpu: Vec<f64>,
    /// How long the shortest block took (by the GPU's clock where that is shorter). The
    /// shortest, not the last: a block slowed 4x by the host (2 x H100 timed all_reduce 8 B at
    /// 14.5 us, then 66.1 us by both clocks) must not end the repeats of a short size and
    /// leave the median of two, the slow one.
    shortest: Option<Duration>,
}

impl Blocks {
    /// Whether another block is wanted: after a short one ([`blocks_wanted`]), or while
    /// stalled blocks, whose host time is more than [`STALL`] times their GPU time, are not
    /// yet outvoted in the median (the launching thread was held up while the GPUs waited or
    /// after they finished: one 2 x H200 run timed all_reduce 16 MiB at 113.7 us host
    /// against 78.5 us GPU in a single block); never before the first, never more than
    /// [`MAX_BLOCKS`].
    pub(super) fn wants_more(&self) -> bool {
        let done = self.host.len() as u32;
        let stalled = self
            .host
            .iter()
            .zip(&self.gpu)
            .filter(|&(&h, &g)| g > 0.0 && h > STALL * g)
            .count() as u32;
        done > 0
            && (blocks_wanted(done, self.shortest.unwrap_or(Duration::ZERO))
                || (stalled > 0 && 2 * stalled >= done && done < MAX_BLOCKS))
    }

    /// The median block.
    pub(super) fn timing(&self) -> Timing {
        Timing {
            host_us: median(&self.host),
            gpu_us: median(&self.gpu),
        }
    }

    /// Adds a block: host and GPU time per iteration (µs), and how long it took.
    pub(super) fn record(&mut self, host_us: f64, gpu_us: f64, took: Duration) {
        self.host.push(host_us);
        self.gpu.push(gpu_us);
        self.shortest = Some(self.shortest.map_or(took, |s| s.min(took)));
    }

    /// Host time per iteration of each block, in the order timed.
    pub(super) fn host_us(&self) -> &[f64] {
        &self.host
    }
}

/// Times one block of a size as nccl-tests does: warm-up iterations, nccl-tests' sync call
/// (one more at iteration 0's place), a wait for every stream, then the host time around `iters` back-to-back iterations and the wait for their
/// end, divided by `iters`; GPU events around the block give the GPU time beside it. With
/// [`SweepSettings::graph_launches`] (nccl-tests' `-G`), the `iters` iterations are recorded
/// into a CUDA graph per GPU after the warm-up, and the block times that many launches of
/// the graphs, divided by `iters` times the launches: the host launches one graph per GPU,
/// not one call per iteration, so a slow launching CPU barely moves small sizes. The
/// sweep repeats short blocks ([`Blocks::wants_more`]) in rounds over the short sizes of a
/// collective, so that a change of the host's speed while they are timed (both tools meet
/// two such states, ~1.45x apart) falls on all of them alike, not on one size.
pub(super) fn time_block(
    op: &Op,
    comms: &mut Comms,
    ranks: &[Rank],
    wd: &Watchdog,
    set: &SweepSettings,
    blocks: &mut Blocks,
) -> GpuResult<()> {
    let what = &op.what();
    let iters = set.iters.max(1);
    let streams: Vec<&Stream> = ranks.iter().map(|r| &r.stream).collect();
    let run = |comms: &Comms, iter: u32| enqueue_at(op, comms, ranks, op.shift(iter));
    wd.arm(comms, what, set.timeout);
    let _pin = set.hold_launch_cpu();
    if blocks.host.is_empty() {
        load_inputs(op.c, ranks, op.elem, op.sc, op.in_place)?;
    }
    for iter in 0..set.warmup {
        run(comms, iter)?;
    }
    // nccl-tests' sync call: one more call at the first iteration's place, so the block's
    // first iteration finds its buffers where nccl-tests' does (in L2 at 16 MiB). On
    // 2 x H100 this did not move the 16 MiB ratios beyond their spread between rounds
    // (bench/results/h100x2-2026-11-26-point.md); it keeps the block nccl-tests' shape.
    run(comms, 0)?;
    sync_all(&streams, comms, wd, what, set.timeout)?;
    // With graph launches, the iterations are recorded into one graph per GPU first, and
    // the timed block launches those graphs (nccl-tests' `-G`).
    let mut graphs = match set.graph_launches {
        0 => None,
        _ => {
            let on: Vec<(&Gpu, &Stream)> = ranks.iter().map(|r| (r.gpu, &r.stream)).collect();
            let capture = Capture::begin(&on)?;
            for iter in 0..iters {
                if let Err(e) = run(comms, iter) {
                    // NCCL fails a call the driver would not record: the recording's
                    // failure, not the GPUs'.
                    return Err(if capture.invalidated() {
                        e.refused()
                    } else {
                        e
                    });
                }
            }
            Some(capture.finish()?)
        }
    };
    wd.arm(comms, what, set.timeout);
    let t0 = match &mut graphs {
        Some(graphs) => launch_graphs(ranks, graphs, set.graph_launches)?,
        None => {
            // The clock starts right before the first call, as nccl-tests' does: the start
            // events are this tool's own, and their records are not the collective's time.
            record_starts(ranks)?;
            let t0 = Instant::now();
            for iter in 0..iters {
                run(comms, iter)?;
            }
            t0
        }
    };
    for rk in ranks {
        rk.end.record(&rk.stream)?;
    }
    sync_all(&streams, comms, wd, what, set.timeout)?;
    let took = t0.elapsed();
    let mut ms: f64 = 0.0;
    for rk in ranks {
        ms = ms.max(rk.start.elapsed_ms(&rk.end)?);
    }
    // The block's length by the GPU's clock where that is shorter: a host stall inside
    // the first block must not make a short size look long and stop the repeats that
    // would outvote it (one H200 timed 16 MiB at 101.6 us host against 11.1 us GPU).
    let per = f64::from(iters) * f64::from(set.graph_launches.max(1));
    blocks.record(
        took.as_secs_f64() * 1e6 / per,
        ms * 1000.0 / per,
        took.min(Duration::from_secs_f64((ms / 1000.0).max(0.0))),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_blocks_are_repeated_and_long_ones_are_not() {
        // A 20-iteration block of 8 B (~0.4 ms) is repeated up to MAX_BLOCKS times.
        assert!(blocks_wanted(1, Duration::from_micros(400)));
        assert!(blocks_wanted(MAX_BLOCKS - 1, Duration::from_micros(400)));
        assert!(!blocks_wanted(MAX_BLOCKS, Duration::from_micros(400)));
        // A block of 1 GiB (~90 ms) is nccl-tests' single measurement.
        assert!(!blocks_wanted(1, Duration::from_millis(90)));
        assert!(!blocks_wanted(1, SHORT_BLOCK));
    }

    #[test]
    fn blocks_keep_the_median_and_ask_for_more_only_while_short() {
        let mut b = Blocks::default();
        assert!(
            !b.wants_more(),
            "nothing is repeated before the first block"
        );
        for (us, took) in [(40.0, 800), (24.1, 480), (24.0, 480), (24.3, 490)] {
            b.record(us, us - 0.5, Duration::from_micros(took));
            assert!(b.wants_more());
        }
        b.record(23.9, 23.4, Duration::from_micros(480));
        assert!(!b.wants_more(), "at most MAX_BLOCKS blocks");
        assert_eq!(b.timing().host_us, 24.1);
        assert_eq!(b.timing().gpu_us, 23.6);
        assert_eq!(b.host_us(), &[40.0, 24.1, 24.0, 24.3, 23.9]);
        let long = Blocks {
            host: vec![90_000.0],
            gpu: vec![89_000.0],
            shortest: Some(Duration::from_millis(90)),
        };
        assert!(!long.wants_more());
        // A long block whose host time ran far past its GPU time is timed again.
        let mut stalled = Blocks {
            host: vec![113.7],
            gpu: vec![78.5],
            shortest: Some(Duration::from_micros(1570)),
        };
        assert!(stalled.wants_more());
        for _ in 0..MAX_BLOCKS - 1 {
            stalled.record(113.7, 78.5, Duration::from_micros(1570));
        }
        assert!(!stalled.wants_more(), "at most MAX_BLOCKS blocks");
        // Repeated until the stalled blocks are a minority, so the median is one that kept up.
        stalled.host = vec![113.7, 79.4];
        stalled.gpu = vec![78.5, 78.8];
        assert!(stalled.wants_more());
        stalled.record(79.2, 78.6, Duration::from_micros(1580));
        assert!(!stalled.wants_more());
        assert_eq!(stalled.timing().host_us, 79.4);
    }

    #[test]
    fn a_short_size_slowed_by_the_host_is_still_repeated() {
        // 2 x H100, all_reduce 8 B: a first block of 20 at 14.5 us (0.29 ms), then one the
        // host held up to 66.1 us by both clocks (1.32 ms). The size is short: five blocks,
        // and the median is a block that kept up, not the upper of two.
        let mut b = Blocks::default();
        b.record(14.5, 14.1, Duration::from_micros(290));
        b.record(66.1, 65.1, Duration::from_micros(1302));
        assert!(b.wants_more());
        for us in [14.9, 15.2, 14.7] {
            b.record(us, us - 0.4, Duration::from_micros(300));
        }
        assert!(!b.wants_more(), "at most MAX_BLOCKS blocks");
        assert_eq!(b.timing().host_us, 14.9);
        // A size none of whose blocks is short is still timed once.
        let mut long = Blocks::default();
        long.record(80.4, 80.0, Duration::from_micros(1608));
        assert!(!long.wants_more());
    }

    #[test]
    fn the_median_block_ignores_one_preempted_block() {
        assert_eq!(median(&[20.1, 19.9, 61.0, 20.0, 20.2]), 20.1);
        assert_eq!(median(&[20.0]), 20.0);
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[f64::NAN, 3.0]), 3.0);
    }
}
