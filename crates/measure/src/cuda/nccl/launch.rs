//! The graph launches of a timed block: each GPU's graphs from a thread of its own, all
//! released together once every thread has bound its GPU and the start events are recorded.

use super::rank::{Rank, record_starts};
use crate::cuda::gpu::{GpuError, GpuResult};
use crate::cuda::graph::Graph;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

/// The timed launches of a block with CUDA graphs: each GPU's graph `launches` times, from
/// one thread per GPU. NCCL warns that one thread launching graphs on several GPUs of a
/// process can deadlock, as a launch that blocks holds up the launches on the other GPUs
/// its own work waits for; with a thread each, a blocked launch holds up only its GPU
/// (bench/results/h200x4-2026-11-26-graph-threads.md sets this beside one thread). Returns
/// when the clock started, once every launch is enqueued ([`released_together`]).
pub(super) fn launch_graphs(
    ranks: &[Rank],
    graphs: &mut [Graph],
    launches: u32,
) -> GpuResult<Instant> {
    let jobs = ranks
        .iter()
        .zip(graphs.iter_mut())
        .map(|(rk, g)| {
            (
                move || rk.gpu.bind(),
                move || -> GpuResult<()> {
                    for _ in 0..launches {
                        g.launch(&rk.stream)?;
                    }
                    Ok(())
                },
            )
        })
        .collect();
    released_together(jobs, || record_starts(ranks))
}

/// Runs each job `(prepare, work)` on a thread of its own: every `prepare` (binding a GPU)
/// and then `start` (the start events) on this thread before the clock starts, then every
/// `work` at once. Returns when the clock started, after every `work` ended; the first
/// error of any part otherwise. A failed `prepare` or `start` runs no `work`. A thread the
/// system will not start is a refusal ([`GpuError::Refused`]: the sweep then stops, with
/// `graphLaunches 0` as the way out), never a hang or a fault of the GPUs.
fn released_together<P, W>(
    jobs: Vec<(P, W)>,
    start: impl FnOnce() -> GpuResult<()>,
) -> GpuResult<Instant>
where
    P: FnOnce() -> GpuResult<()> + Send,
    W: FnOnce() -> GpuResult<()> + Send,
{
    let gate = std::sync::RwLock::new(());
    let ready = AtomicUsize::new(0);
    // Set by a thread whose prepare failed, or here when the start or a spawn failed: the
    // threads then run no work.
    let abort = AtomicBool::new(false);
    std::thread::scope(|s| {
        // Held until the clock starts: every thread waits to read it.
        let hold = gate
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut threads = Vec::with_capacity(jobs.len());
        let mut result = Ok(());
        for (i, (prepare, work)) in jobs.into_iter().enumerate() {
            let (gate, ready, abort) = (&gate, &ready, &abort);
            let spawned = std::thread::Builder::new()
                .name(format!("graph-launch-{i}"))
                .spawn_scoped(s, move || -> GpuResult<()> {
                    let prepared = prepare();
                    if prepared.is_err() {
                        abort.store(true, Ordering::SeqCst);
                    }
                    ready.fetch_add(1, Ordering::SeqCst);
                    drop(gate.read());
                    prepared?;
                    if abort.load(Ordering::SeqCst) {
                        return Ok(());
                    }
                    work()
                });
            match spawned {
                Ok(t) => threads.push(t),
                Err(e) => {
                    result = Err(GpuError::Refused {
                        call: "std::thread::spawn",
                        detail: format!("a thread to launch GPU {i}'s graphs could not start: {e}"),
                    });
                    break;
                }
            }
        }
        if result.is_ok() {
            while ready.load(Ordering::SeqCst) < threads.len() {
                std::thread::yield_now();
            }
        }
        if result.is_ok() && !abort.load(Ordering::SeqCst) {
            result = start();
        }
        // After the start events, right before the launches are released (as the
        // host-launched block starts its clock).
        let t0 = Instant::now();
        if result.is_err() {
            abort.store(true, Ordering::SeqCst);
        }
        drop(hold);
        for t in threads {
            let ended = t.join().unwrap_or_else(|p| {
                Err(GpuError::Call {
                    call: "cuGraphLaunch",
                    detail: format!(
                        "a launching thread panicked: {}",
                        crate::cuda::panic_message(p.as_ref())
                    ),
                })
            });
            if let (Ok(()), Err(e)) = (&result, ended) {
                result = Err(e);
            }
        }
        result.map(|()| t0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;

    fn fail(what: &'static str) -> GpuError {
        GpuError::Call {
            call: what,
            detail: "failed".into(),
        }
    }

    type Job<'a> = (
        Box<dyn FnOnce() -> GpuResult<()> + Send + 'a>,
        Box<dyn FnOnce() -> GpuResult<()> + Send + 'a>,
    );

    /// Four jobs that log "prepare i" and "work i"; `bad` fails one part of one job (or
    /// panics its work: `("panic", i)`).
    fn jobs<'a>(log: &'a Mutex<Vec<String>>, bad: Option<(&'static str, usize)>) -> Vec<Job<'a>> {
        (0..4)
            .map(|i| -> Job<'a> {
                let note = move |what: &'static str| -> GpuResult<()> {
                    // The prepares take a while, so that a start that did not wait for them
                    // would come first.
                    if what == "prepare" {
                        std::thread::sleep(Duration::from_millis(20 * i as u64));
                    }
                    log.lock().expect("log").push(format!("{what} {i}"));
                    match bad {
                        Some((part, at)) if part == what && at == i => Err(fail(part)),
                        Some(("panic", at)) if at == i && what == "work" => {
                            panic!("launch {i} panicked")
                        }
                        _ => Ok(()),
                    }
                };
                (
                    Box::new(move || note("prepare")),
                    Box::new(move || note("work")),
                )
            })
            .collect()
    }

    fn starter(log: &Mutex<Vec<String>>, ok: bool) -> impl FnOnce() -> GpuResult<()> + '_ {
        move || {
            log.lock().expect("log").push("start".into());
            if ok { Ok(()) } else { Err(fail("start")) }
        }
    }

    #[test]
    fn launching_threads_are_released_together_after_every_prepare_and_the_start() {
        let log = Mutex::new(Vec::new());
        let started = Mutex::new(None);
        let start = || {
            // The start events take a while: the clock must not count them.
            std::thread::sleep(Duration::from_millis(30));
            *started.lock().expect("mark") = Some(Instant::now());
            starter(&log, true)()
        };
        let t0 = released_together(jobs(&log, None), start).expect("runs");
        assert!(t0.elapsed() < Duration::from_secs(5));
        let started = started.into_inner().expect("mark").expect("start ran");
        assert!(
            t0 >= started,
            "the clock started before the start events ended"
        );
        let log = log.into_inner().expect("log");
        let at = |e: &str| log.iter().position(|x| x == e).expect(e);
        for i in 0..4 {
            assert!(at(&format!("prepare {i}")) < at("start"), "{log:?}");
            assert!(at("start") < at(&format!("work {i}")), "{log:?}");
        }
        assert_eq!(log.len(), 9);
    }

    #[test]
    fn a_failed_part_stops_the_block_and_runs_no_work_after_a_failed_prepare_or_start() {
        let works = |log: &[String]| log.iter().filter(|e| e.starts_with("work")).count();
        // A GPU that cannot be bound: its error, no start, no launch anywhere.
        let log = Mutex::new(Vec::new());
        let e = released_together(jobs(&log, Some(("prepare", 2))), starter(&log, true));
        assert!(
            matches!(
                e,
                Err(GpuError::Call {
                    call: "prepare",
                    ..
                })
            ),
            "{e:?}"
        );
        let log = log.into_inner().expect("log");
        assert!(
            !log.contains(&"start".to_string()) && works(&log) == 0,
            "{log:?}"
        );
        // Start events that fail: no launch.
        let log = Mutex::new(Vec::new());
        let e = released_together(jobs(&log, None), starter(&log, false));
        assert!(
            matches!(e, Err(GpuError::Call { call: "start", .. })),
            "{e:?}"
        );
        assert_eq!(works(&log.into_inner().expect("log")), 0);
        // A launch that fails, or panics: the block's error, after every thread ended.
        let log = Mutex::new(Vec::new());
        let e = released_together(jobs(&log, Some(("work", 1))), starter(&log, true));
        assert!(
            matches!(e, Err(GpuError::Call { call: "work", .. })),
            "{e:?}"
        );
        assert_eq!(works(&log.into_inner().expect("log")), 4);
        let log = Mutex::new(Vec::new());
        let e = released_together(jobs(&log, Some(("panic", 3))), starter(&log, true));
        assert!(
            matches!(&e, Err(GpuError::Call { detail, .. }) if detail.contains("launch 3 panicked")),
            "{e:?}"
        );
    }
}
