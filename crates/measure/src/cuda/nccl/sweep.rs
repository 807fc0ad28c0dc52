//! The nccl-tests style sweep of one collective: buffers per rank, the NCCL calls, and the
//! rows of time, algbw/busbw and wrong elements per size.

use super::check::count_wrong;
use super::comm::{Comms, Watchdog, sync_all};
use super::nccl_type;
use super::rank::{Op, Rank, SweepSettings, enqueue, load_inputs};
use super::timing::{Blocks, RAMP, RAMP_ROUNDS_MAX, time_block};
use crate::cuda::gpu::{GpuResult, Stream};
use crate::model::{counts, has_in_place, row_count};
use crate::stats;
use gpufabric_api::result::{CollectiveSweep, SweepRow};
use gpufabric_api::suite::{Collective, DataType};
use std::time::{Duration, Instant};

/// NCCL connects peers lazily at the first call of each kind: do that outside timing, at
/// the first size of the sweep, with back-to-back calls for at least [`RAMP`] as well: the
/// GPUs idled while the previous collective's outputs were checked on the host, and the
/// first sizes must not be timed while their clocks come back up.
fn ramp_up(
    c: Collective,
    comms: &mut Comms,
    ranks: &[Rank],
    wd: &Watchdog,
    set: &SweepSettings,
    first: u64,
) -> GpuResult<()> {
    let n = ranks.len() as u64;
    let elem = set.data_type.size();
    let ndt = nccl_type(set.data_type);
    let (sc, rc, bytes) = counts(c, first, elem, n);
    let op = Op {
        c,
        dt: ndt,
        elem,
        sc,
        rc,
        in_place: false,
        total: bytes,
        max_total: bytes,
    };
    // Armed before the enqueue too: a peer that never joins can block NCCL on the host.
    wd.arm(comms, c.nccl_tests_name(), set.timeout);
    load_inputs(c, ranks, elem, sc, false)?;
    let streams: Vec<&Stream> = ranks.iter().map(|r| &r.stream).collect();
    let _pin = set.hold_launch_cpu();
    let ramp_start = Instant::now();
    for round in 0..RAMP_ROUNDS_MAX {
        for _ in 0..5 {
            enqueue(&op, comms, ranks)?;
        }
        sync_all(&streams, comms, wd, c.nccl_tests_name(), set.timeout)?;
        if round > 0 && ramp_start.elapsed() >= RAMP {
            break;
        }
        wd.arm(comms, c.nccl_tests_name(), set.timeout);
    }
    Ok(())
}

/// One placement (out of place or in place) of one size: its call, timed blocks and the
/// wrong elements its validation found.
struct Place {
    op: Op,
    blocks: Blocks,
    wrong: u64,
}

/// One size of the sweep until its blocks are all timed.
struct Entry {
    bytes: u64,
    count: u64,
    /// Out of place, then in place where the collective has it.
    places: Vec<Place>,
}

impl Entry {
    fn wants_more(&self) -> bool {
        self.places.iter().any(|p| p.blocks.wants_more())
    }

    fn row(&self, c: Collective, n: u64) -> SweepRow {
        let timing =
            |p: &Place| stats::timing(c, n as u32, self.bytes, p.blocks.timing().host_us, p.wrong);
        SweepRow {
            bytes: self.bytes,
            count: self.count,
            out_of_place: self.places.first().map(timing).unwrap_or_default(),
            in_place: self.places.get(1).map(timing),
        }
    }

    /// The progress line of the size: host times (nccl-tests' column), the GPU event times
    /// beside them, and each block where a short size was timed more than once.
    fn line(&self, c: Collective, row: &SweepRow) -> String {
        let gpu = |i: usize| {
            self.places
                .get(i)
                .map(|p| p.blocks.timing().gpu_us)
                .unwrap_or_default()
        };
        let mut line = format!(
            "{:>14} {:>12} {:>10.2} us {:>8.2} GB/s busbw {:>8.2} in-place {:>10.2} us wrong {} (gpu-event {:.2} / {:.2} us)",
            c.nccl_tests_name(),
            row.bytes,
            row.out_of_place.time_us,
            row.out_of_place.busbw,
            row.in_place.unwrap_or_default().busbw,
            row.in_place.unwrap_or_default().time_us,
            row.wrong(),
            gpu(0),
            gpu(1),
        );
        if let Some(p) = self.places.first().filter(|p| p.blocks.host_us().len() > 1) {
            let blocks: Vec<String> = p
                .blocks
                .host_us()
                .iter()
                .map(|b| format!("{b:.1}"))
                .collect();
            line.push_str(&format!(" blocks {}", blocks.join(" ")));
        }
        line
    }
}

/// Times and checks one collective over all sizes.
pub(crate) fn sweep_collective(
    c: Collective,
    comms: &mut Comms,
    ranks: &mut [Rank],
    wd: &Watchdog,
    set: &SweepSettings,
    progress: &dyn Fn(&str),
) -> GpuResult<CollectiveSweep> {
    let n = ranks.len() as u64;
    let dt = set.data_type;
    let elem = dt.size();
    if let Some(&first) = set.sizes.first() {
        crate::activity::enter(format!("NCCL sweep: {}, warming up", c.nccl_tests_name()));
        ramp_up(c, comms, ranks, wd, set, first)?;
    }
    let started = Instant::now();
    let mut timed = Duration::ZERO;
    let max_total = set
        .sizes
        .iter()
        .map(|&size| counts(c, size, elem, n).2)
        .max()
        .unwrap_or(0);
    let mut entries: Vec<Entry> = Vec::new();
    let mut rows: Vec<SweepRow> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    // After the last size, `None`: whatever is still short gets its repeats.
    for size in set.sizes.iter().copied().map(Some).chain([None]) {
        if let Some(size) = size {
            let (sc, rc, bytes) = counts(c, size, elem, n);
            if !seen.insert(bytes) {
                continue;
            }
            let out_of_place = Op {
                c,
                dt: nccl_type(dt),
                elem,
                sc,
                rc,
                in_place: false,
                total: bytes,
                max_total,
            };
            crate::activity::enter(format!(
                "NCCL sweep: {}, {}",
                c.nccl_tests_name(),
                crate::activity::size(bytes)
            ));
            let entry = first_blocks(out_of_place, comms, ranks, wd, set, &mut timed)?;
            let settled = !entry.wants_more();
            entries.push(entry);
            if !settled {
                continue;
            }
        }
        // The short sizes before a long one (or the end) get their repeats now, round by
        // round.
        crate::activity::enter(format!(
            "NCCL sweep: {}, repeating the short sizes",
            c.nccl_tests_name()
        ));
        let t0 = Instant::now();
        repeat_short(&mut entries[rows.len()..], &mut |op, b| {
            time_block(op, comms, ranks, wd, set, b)
        })?;
        timed += t0.elapsed();
        finish(c, n, &entries, &mut rows, progress);
    }
    progress(&format!(
        "{} swept in {:.2} s, {:.2} s of it timed iterations, the rest loading and checking",
        c.nccl_tests_name(),
        started.elapsed().as_secs_f64(),
        timed.as_secs_f64()
    ));
    let points: Vec<(u64, f64)> = rows
        .iter()
        .map(|r| (r.bytes, r.out_of_place.time_us))
        .collect();
    Ok(CollectiveSweep {
        collective: c,
        data_type: dt,
        ranks: n as u32,
        fit: stats::fit_sweep(c, n as u32, &points),
        rows,
    })
}

/// One size's first block of each placement of `out_of_place` (the size's call out of
/// place), and the check of its outputs after each; `timed` adds the time spent in timed
/// blocks.
fn first_blocks(
    out_of_place: Op,
    comms: &mut Comms,
    ranks: &mut [Rank],
    wd: &Watchdog,
    set: &SweepSettings,
    timed: &mut Duration,
) -> GpuResult<Entry> {
    let n = ranks.len() as u64;
    let dt = set.data_type;
    let Op {
        c, elem, sc, rc, ..
    } = out_of_place;
    let mut entry = Entry {
        bytes: out_of_place.total,
        count: row_count(c, sc, rc, n),
        places: Vec::new(),
    };
    for in_place in [false, true] {
        if in_place && !has_in_place(c) {
            continue;
        }
        let op = Op {
            in_place,
            ..out_of_place
        };
        let mut blocks = Blocks::default();
        let t0 = Instant::now();
        time_block(&op, comms, ranks, wd, set, &mut blocks)?;
        *timed += t0.elapsed();
        let what = op.what();
        let streams: Vec<&Stream> = ranks.iter().map(|r| &r.stream).collect();
        let mut wrong = 0;
        if set.check {
            wd.arm(comms, &what, set.timeout);
            load_inputs(c, ranks, elem, sc, in_place)?;
            enqueue(&op, comms, ranks)?;
            sync_all(&streams, comms, wd, &what, set.timeout)?;
            wrong = check_outputs(c, ranks, dt, sc, rc, in_place)?;
        }
        entry.places.push(Place { op, blocks, wrong });
    }
    Ok(entry)
}

/// Repeats the short blocks of `entries` in rounds, one block of each size and placement
/// that wants one per round, until none does. `time` times one more block of a call (the
/// sweep's [`time_block`]).
fn repeat_short(
    entries: &mut [Entry],
    time: &mut dyn FnMut(&Op, &mut Blocks) -> GpuResult<()>,
) -> GpuResult<()> {
    loop {
        let mut more = false;
        for p in entries.iter_mut().flat_map(|e| e.places.iter_mut()) {
            if p.blocks.wants_more() {
                time(&p.op, &mut p.blocks)?;
                more = true;
            }
        }
        if !more {
            return Ok(());
        }
    }
}

/// Turns the timed entries after the rows made so far into rows, with a progress line each.
fn finish(
    c: Collective,
    n: u64,
    entries: &[Entry],
    rows: &mut Vec<SweepRow>,
    progress: &dyn Fn(&str),
) {
    for e in &entries[rows.len()..] {
        let row = e.row(c, n);
        progress(&e.line(c, &row));
        rows.push(row);
    }
}

fn check_outputs(
    c: Collective,
    ranks: &mut [Rank],
    dt: DataType,
    sc: u64,
    rc: u64,
    in_place: bool,
) -> GpuResult<u64> {
    let n = ranks.len() as u64;
    let elem = dt.size();
    let per = match c {
        Collective::AllGather => sc,
        Collective::ReduceScatter => rc,
        Collective::AllToAll => sc / n,
        _ => rc,
    };
    for (r, rk) in ranks.iter_mut().enumerate() {
        let off = if in_place && matches!(c, Collective::ReduceScatter) {
            r as u64 * rc * elem
        } else {
            0
        };
        let src = rk.recv.at(off as usize);
        rk.stream
            .memcpy_dtoh(&mut rk.host, src, (rc * elem) as usize)?;
    }
    let mut wrong = 0u64;
    for (r, rk) in ranks.iter().enumerate() {
        rk.stream.sync()?;
        wrong += count_wrong(dt, c, n, r as u64, rc, per, rk.host.as_slice());
    }
    Ok(wrong)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::gpu::GpuError;
    use cudarc::nccl::sys as nsys;

    fn place(bytes: u64, in_place: bool, host_us: f64, wrong: u64) -> Place {
        let mut blocks = Blocks::default();
        // A first block as the sweep times it: 20 iterations.
        blocks.record(
            host_us,
            host_us * 0.97,
            Duration::from_secs_f64(host_us * 20.0 / 1e6),
        );
        Place {
            op: Op {
                c: Collective::AllReduce,
                dt: nsys::ncclDataType_t::ncclFloat32,
                elem: 4,
                sc: bytes / 4,
                rc: bytes / 4,
                in_place,
                total: bytes,
                max_total: 1 << 30,
            },
            blocks,
            wrong,
        }
    }

    fn entry(bytes: u64, host_us: f64) -> Entry {
        Entry {
            bytes,
            count: bytes / 4,
            places: vec![
                place(bytes, false, host_us, 0),
                place(bytes, true, host_us, 0),
            ],
        }
    }

    #[test]
    fn repeats_go_round_the_short_sizes_until_each_has_five_blocks() {
        // 8 B and 64 B take ~0.4 ms a block: short. 16 MiB takes 1.6 ms: timed once.
        let mut entries = vec![entry(8, 20.0), entry(64, 20.5), entry(16 << 20, 80.0)];
        let mut order = Vec::new();
        repeat_short(&mut entries, &mut |op, b| {
            order.push((op.total, op.in_place));
            assert!(op.what().contains(&op.total.to_string()), "{}", op.what());
            b.record(19.0, 18.5, Duration::from_micros(380));
            Ok(())
        })
        .expect("no GPU call fails here");
        let round = [(8, false), (8, true), (64, false), (64, true)];
        assert_eq!(
            order,
            round.repeat(4),
            "rounds over the short sizes, not five in a row"
        );
        for e in &entries[..2] {
            assert!(e.places.iter().all(|p| p.blocks.host_us().len() == 5));
        }
        assert!(
            entries[2]
                .places
                .iter()
                .all(|p| p.blocks.host_us().len() == 1)
        );
    }

    #[test]
    fn a_failed_repeat_ends_the_repeats_with_its_error() {
        let mut entries = vec![entry(8, 20.0)];
        let mut calls = 0;
        let r = repeat_short(&mut entries, &mut |_, _| {
            calls += 1;
            Err(GpuError::Timeout(
                "all_reduce 8 bytes".into(),
                Duration::from_secs(1),
            ))
        });
        assert!(matches!(r, Err(GpuError::Timeout(..))));
        assert_eq!(calls, 1);
    }

    #[test]
    fn the_row_is_the_median_block_with_the_wrong_elements_and_the_line_lists_the_blocks() {
        let mut e = entry(8, 40.0);
        for us in [24.1, 24.0, 24.3, 23.9] {
            e.places[0]
                .blocks
                .record(us, us - 0.5, Duration::from_micros(480));
        }
        e.places[1].wrong = 3;
        let row = e.row(Collective::AllReduce, 2);
        assert_eq!(row.bytes, 8);
        assert_eq!(row.out_of_place.time_us, 24.1);
        let in_place = row.in_place.expect("all_reduce has an in-place run");
        assert_eq!(in_place.time_us, 40.0);
        assert_eq!(row.wrong(), 3);
        let line = e.line(Collective::AllReduce, &row);
        assert!(line.contains("blocks 40.0 24.1 24.0 24.3 23.9"), "{line}");
        // A collective without an in-place run has no in-place timing.
        e.places.truncate(1);
        assert!(e.row(Collective::SendRecv, 2).in_place.is_none());
    }
}
