//! The CPU the NCCL sweep launches its collectives from.
//!
//! At small sizes a collective's time per iteration is the host's launch time, so it moves
//! with the speed of the CPU the launching thread runs on. On shared GPU hosts that speed is
//! not the same on every CPU: on one 2 x H200 host a fixed loop took 12.5-14 ms on about two
//! thirds of the 32 CPUs and 21-27 ms on the others at the same moment, and which CPUs were
//! slow changed from one second to the next (bench/results/h200x2-2026-11-26-compare.md). A
//! thread left where the scheduler puts it times a collective in one of two states ~1.45x
//! apart, and nccl-tests does the same from one process to the next.
//!
//! With `--pin-launch-cpu`, before each collective the sweep runs a fixed piece of work on each CPU it may use
//! ([`probe`]) and pins its launching thread to the fastest while it times that collective's
//! iterations ([`Launch::hold`]); the CPU mask it had is put back for everything else (the
//! threads that check outputs are started with it). The choice and what the CPUs measured go to the
//! progress log. NCCL's own threads are started before and keep the mask they had.
//!
//! Measured on that host (`bench/launch-pin.sh`): eight runs each way at 8 B - 4 KiB,
//! -n 1000, spread by 5-13% (standard deviation over mean) pinned against 18-19% not pinned
//! and 19% for nccl-tests; at -n 20 by 7-20% against 15-19%, no steadier for all_reduce. In
//! full sweeps the pinned agent still met the slow state in some collectives: the fixed work
//! does not always find the CPU the launches run fast on. So it is not the default.

use std::time::Instant;

/// Most CPUs probed; larger sets are sampled evenly.
pub(crate) const MAX_PROBED: usize = 64;

/// What the probe found, for the progress log.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Choice {
    /// The CPU the thread is pinned to.
    pub cpu: usize,
    /// Its time for the fixed work, µs.
    pub us: f64,
    /// Median and slowest time over the CPUs probed, µs.
    pub median_us: f64,
    pub slowest_us: f64,
    /// CPUs probed, and those allowed.
    pub probed: usize,
    pub allowed: usize,
}

impl Choice {
    pub(crate) fn describe(&self) -> String {
        format!(
            "launching from CPU {} (fixed work {:.0} us; median of {} CPUs probed {:.0} us, slowest {:.0} us)",
            self.cpu, self.us, self.probed, self.median_us, self.slowest_us
        )
    }
}

/// The CPU chosen for one collective, and the mask the thread had before the probe.
#[derive(Clone, Debug)]
pub(crate) struct Launch {
    pub choice: Choice,
    previous: Vec<usize>,
}

impl Launch {
    /// Pins the calling thread to the chosen CPU until the guard drops. Only the timed
    /// iterations are held there: threads the sweep starts to check outputs inherit the
    /// mask of the thread that starts them, and must keep every CPU.
    pub(crate) fn hold(&self) -> std::io::Result<Pin> {
        set_affinity(&[self.choice.cpu])?;
        Ok(Pin {
            previous: self.previous.clone(),
        })
    }
}

/// The calling thread pinned to one CPU; drop restores the mask it had before.
pub(crate) struct Pin {
    previous: Vec<usize>,
}

impl Drop for Pin {
    fn drop(&mut self) {
        // Nothing to do on failure: the thread keeps a narrower mask, which is still valid.
        let _ = set_affinity(&self.previous);
    }
}

/// The CPUs the calling thread may run on.
pub(crate) fn allowed_cpus() -> std::io::Result<Vec<usize>> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: pid 0 is the calling thread; the size is the set's own.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let max = libc::CPU_SETSIZE as usize;
    // SAFETY: CPU_ISSET reads a bit of the set for indexes below CPU_SETSIZE.
    Ok((0..max)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

fn set_affinity(cpus: &[usize]) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
        // SAFETY: CPU_SET writes one bit below CPU_SETSIZE.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: pid 0 is the calling thread; the set is initialised above.
    let r = unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Up to `max` of `cpus`, spread evenly over the list.
pub(crate) fn sample(cpus: &[usize], max: usize) -> Vec<usize> {
    if cpus.len() <= max || max == 0 {
        return cpus.to_vec();
    }
    (0..max).map(|i| cpus[i * cpus.len() / max]).collect()
}

/// A fixed piece of work shaped like a launch path (dependent loads from a table that fits
/// a core's L2 cache, and branches): ~1 ms on one core of a current server.
struct Work {
    next: Vec<u32>,
}

impl Work {
    const ENTRIES: usize = 1 << 16;
    const STEPS: usize = 200_000;

    fn new() -> Work {
        // One cycle through every entry, in an order that defeats the prefetcher.
        let mut order: Vec<u32> = (0..Self::ENTRIES as u32).collect();
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for i in (1..order.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            order.swap(i, (x % (i as u64 + 1)) as usize);
        }
        let mut next = vec![0u32; Self::ENTRIES];
        for w in 0..order.len() {
            next[order[w] as usize] = order[(w + 1) % order.len()];
        }
        Work { next }
    }

    /// Time of one run of the work, µs.
    fn time(&self) -> f64 {
        let t = Instant::now();
        let mut at = 0u32;
        let mut odd = 0u32;
        for _ in 0..Self::STEPS {
            at = self.next[at as usize];
            if at & 1 == 1 {
                odd = odd.wrapping_add(at);
            }
        }
        std::hint::black_box((at, odd));
        t.elapsed().as_secs_f64() * 1e6
    }
}

/// Runs the fixed work on each of up to [`MAX_PROBED`] allowed CPUs and chooses the
/// fastest; the calling thread's mask is as before when it returns. Err when the mask cannot
/// be read or set.
pub(crate) fn probe() -> std::io::Result<Launch> {
    let previous = allowed_cpus()?;
    let probed = sample(&previous, MAX_PROBED);
    let work = Work::new();
    let mut times = Vec::with_capacity(probed.len());
    let pin = Pin {
        previous: previous.clone(),
    };
    for &cpu in &probed {
        set_affinity(&[cpu])?;
        times.push((cpu, work.time()));
    }
    drop(pin);
    Ok(Launch {
        choice: choose(&times, previous.len()),
        previous,
    })
}

/// The fastest of the probed CPUs (the first of equals), with the spread beside it.
pub(crate) fn choose(times: &[(usize, f64)], allowed: usize) -> Choice {
    let mut sorted: Vec<f64> = times.iter().map(|t| t.1).collect();
    sorted.sort_by(f64::total_cmp);
    let (cpu, us) = times
        .iter()
        .copied()
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap_or((0, 0.0));
    Choice {
        cpu,
        us,
        median_us: sorted.get(sorted.len() / 2).copied().unwrap_or(0.0),
        slowest_us: sorted.last().copied().unwrap_or(0.0),
        probed: times.len(),
        allowed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fastest_cpu_is_chosen_and_the_spread_reported() {
        let c = choose(&[(0, 1300.0), (1, 2400.0), (5, 1250.0), (7, 1260.0)], 32);
        assert_eq!(c.cpu, 5);
        assert_eq!(c.us, 1250.0);
        assert_eq!(c.median_us, 1300.0);
        assert_eq!(c.slowest_us, 2400.0);
        assert_eq!((c.probed, c.allowed), (4, 32));
        assert!(c.describe().contains("CPU 5"), "{}", c.describe());
    }

    #[test]
    fn large_cpu_sets_are_sampled_evenly() {
        let cpus: Vec<usize> = (0..224).collect();
        let s = sample(&cpus, 64);
        assert_eq!(s.len(), 64);
        assert_eq!(s[0], 0);
        assert!(s.windows(2).all(|w| w[1] > w[0]));
        assert!(*s.last().unwrap_or(&0) >= 200);
        assert_eq!(sample(&cpus[..8], 64), cpus[..8].to_vec());
    }

    #[test]
    fn the_probe_leaves_the_mask_and_hold_pins_until_dropped() {
        // Runs in its own thread so that the test harness's thread keeps its mask.
        std::thread::spawn(|| {
            let before = allowed_cpus().expect("read the mask");
            let launch = match probe() {
                Ok(l) => l,
                // A sandbox that forbids setting the mask: the sweep then runs unpinned.
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                    return eprintln!("skipped: the CPU mask cannot be set here ({e})");
                }
                Err(e) => panic!("probe: {e}"),
            };
            assert_eq!(allowed_cpus().expect("read the mask"), before);
            assert!(before.contains(&launch.choice.cpu));
            assert!(launch.choice.us > 0.0 && launch.choice.us <= launch.choice.slowest_us);
            let pin = launch.hold().expect("pin");
            assert_eq!(
                allowed_cpus().expect("read the mask"),
                vec![launch.choice.cpu]
            );
            drop(pin);
            assert_eq!(allowed_cpus().expect("read the mask"), before);
        })
        .join()
        .expect("the probing thread");
    }
}
