//! GPU-pair copy-engine bandwidth (one way per ordered pair, both ways per pair) and
//! host<->device per GPU, with peer access enabled and every copy's data checked.

use super::gpu::{
    DevBuf, Event, Gpu, GpuResult, HostBuf, Stream, count_pattern_mismatch, fill_pattern,
};
use crate::stats;
use gpufabric_api::result::{HostBandwidth, PairBandwidth, PairMatrix};
use std::time::{Duration, Instant};

/// How the matrix is measured.
pub(crate) struct PairSettings {
    pub bytes: usize,
    pub bidirectional: bool,
    pub host_copies: bool,
    /// Timed repetitions (the median is reported).
    pub repeats: usize,
    /// Copies between the two events of one repetition.
    pub copies: usize,
    pub timeout: Duration,
}

struct Side<'g> {
    gpu: &'g Gpu,
    stream: Stream,
    src: DevBuf,
    dst: DevBuf,
    start: Event,
    end: Event,
    mid: Event,
}

fn seed_of(gpu: u32) -> u64 {
    0x5eed_0000 + u64::from(gpu)
}

/// Measures the matrix over `gpus`. Peer access is enabled both ways for every pair.
pub(crate) fn measure(
    gpus: &[Gpu],
    set: &PairSettings,
    progress: &dyn Fn(&str),
) -> GpuResult<PairMatrix> {
    let bytes = set.bytes.max(8);
    for a in gpus {
        for b in gpus {
            if a.index != b.index {
                a.enable_peer(b)?;
            }
        }
    }
    let Some(first) = gpus.first() else {
        return Ok(empty(bytes));
    };
    let mut host = HostBuf::new(first, bytes)?;
    let mut check = HostBuf::new(first, bytes)?;
    let mut sides = Vec::new();
    for g in gpus {
        let side = Side {
            gpu: g,
            stream: Stream::new(g)?,
            src: DevBuf::new(g, bytes)?,
            dst: DevBuf::new(g, bytes)?,
            start: Event::new(g)?,
            end: Event::new(g)?,
            mid: Event::new(g)?,
        };
        fill_pattern(host.as_mut_slice(), seed_of(g.index));
        side.stream.memcpy_htod(side.src.ptr, &host, bytes)?;
        side.stream.sync()?;
        sides.push(side);
    }
    let mut m = Copies {
        set,
        bytes,
        check: &mut check,
        corrupt: 0,
        progress,
    };
    let unidirectional = m.one_way(&sides)?;
    let bidirectional = if set.bidirectional {
        m.both_ways(&sides)?
    } else {
        Vec::new()
    };
    let (host_to_device, device_to_host) = if set.host_copies {
        m.host_ways(&sides, &mut host)?
    } else {
        (Vec::new(), Vec::new())
    };
    Ok(PairMatrix {
        bytes: bytes as u64,
        unidirectional,
        bidirectional,
        host_to_device,
        device_to_host,
        corrupt_copies: m.corrupt,
    })
}

/// The copies of one matrix: its settings, the host buffer that checks arrivals, and the
/// count of copies that arrived corrupt.
struct Copies<'a> {
    set: &'a PairSettings,
    bytes: usize,
    check: &'a mut HostBuf,
    corrupt: u32,
    progress: &'a dyn Fn(&str),
}

impl Copies<'_> {
    /// Deadline of a wait covering `k` copy directions.
    fn deadline(&self, k: u32) -> Instant {
        Instant::now() + self.set.timeout.max(Duration::from_secs(1)) * k
    }

    /// The median over the repeats of `sample`, which times one repeat (GB/s).
    fn median(&self, mut sample: impl FnMut() -> GpuResult<f64>) -> GpuResult<f64> {
        let mut samples = Vec::new();
        for _ in 0..self.set.repeats.max(1) {
            samples.push(sample()?);
        }
        Ok(stats::median(&samples).unwrap_or(0.0))
    }

    /// Counts a copy into `side.dst` that does not hold the pattern of `seed`.
    fn verify(&mut self, side: &Side, seed: u64) -> GpuResult<()> {
        if !verify(side, self.check, seed)? {
            self.corrupt += 1;
        }
        Ok(())
    }

    /// One way, every ordered pair.
    fn one_way(&mut self, sides: &[Side]) -> GpuResult<Vec<PairBandwidth>> {
        let (bytes, copies) = (self.bytes, self.set.copies.max(1));
        let mut out = Vec::new();
        for s in sides {
            for d in sides {
                if s.gpu.index == d.gpu.index {
                    continue;
                }
                crate::activity::enter(format!(
                    "GPU pairs: copies GPU {} -> GPU {}",
                    s.gpu.index, d.gpu.index
                ));
                let bw = self.median(|| {
                    s.start.record(&s.stream)?;
                    for _ in 0..copies {
                        s.stream.memcpy_dtod(d.dst.ptr, s.src.ptr, bytes)?;
                    }
                    s.end.record(&s.stream)?;
                    s.stream
                        .sync_until("pair copy", self.deadline(1), &|| false)?;
                    Ok(gbps(bytes * copies, s.start.elapsed_ms(&s.end)?))
                })?;
                self.verify(d, seed_of(s.gpu.index))?;
                (self.progress)(&format!(
                    "pair {} -> {}: {:.1} GB/s",
                    s.gpu.index, d.gpu.index, bw
                ));
                out.push(PairBandwidth {
                    src: s.gpu.index,
                    dst: d.gpu.index,
                    gbps: bw,
                });
            }
        }
        Ok(out)
    }

    /// Both ways at once, every unordered pair.
    fn both_ways(&mut self, sides: &[Side]) -> GpuResult<Vec<PairBandwidth>> {
        let (bytes, copies) = (self.bytes, self.set.copies.max(1));
        let mut out = Vec::new();
        for (i, a) in sides.iter().enumerate() {
            for b in sides.iter().skip(i + 1) {
                crate::activity::enter(format!(
                    "GPU pairs: copies both ways GPU {} <-> GPU {}",
                    a.gpu.index, b.gpu.index
                ));
                let bw = self.median(|| {
                    a.start.record(&a.stream)?;
                    b.stream.wait(&a.start)?;
                    // Twice the copies of the one-way test: the two streams start a few
                    // microseconds apart, which a longer run amortises.
                    for _ in 0..2 * copies {
                        a.stream.memcpy_dtod(b.dst.ptr, a.src.ptr, bytes)?;
                        b.stream.memcpy_dtod(a.dst.ptr, b.src.ptr, bytes)?;
                    }
                    b.mid.record(&b.stream)?;
                    a.stream.wait(&b.mid)?;
                    a.end.record(&a.stream)?;
                    a.stream
                        .sync_until("bidirectional copy", self.deadline(2), &|| false)?;
                    Ok(gbps(4 * bytes * copies, a.start.elapsed_ms(&a.end)?))
                })?;
                self.verify(b, seed_of(a.gpu.index))?;
                self.verify(a, seed_of(b.gpu.index))?;
                (self.progress)(&format!(
                    "pair {} <-> {}: {:.1} GB/s both ways",
                    a.gpu.index, b.gpu.index, bw
                ));
                out.push(PairBandwidth {
                    src: a.gpu.index,
                    dst: b.gpu.index,
                    gbps: bw,
                });
            }
        }
        Ok(out)
    }

    /// Host to device and back, per GPU.
    fn host_ways(
        &mut self,
        sides: &[Side],
        host: &mut HostBuf,
    ) -> GpuResult<(Vec<HostBandwidth>, Vec<HostBandwidth>)> {
        let (bytes, copies) = (self.bytes, self.set.copies.max(1));
        let host_seed = 0x0057_0057;
        fill_pattern(host.as_mut_slice(), host_seed);
        let host = &*host;
        let (mut h2d, mut d2h) = (Vec::new(), Vec::new());
        crate::activity::enter("GPU pairs: host <-> GPU copies");
        for s in sides {
            let up = self.median(|| {
                s.start.record(&s.stream)?;
                for _ in 0..copies {
                    s.stream.memcpy_htod(s.dst.ptr, host, bytes)?;
                }
                s.end.record(&s.stream)?;
                s.stream
                    .sync_until("host-to-device copy", self.deadline(1), &|| false)?;
                Ok(gbps(bytes * copies, s.start.elapsed_ms(&s.end)?))
            })?;
            self.verify(s, host_seed)?;
            let mut samples = Vec::new();
            for _ in 0..self.set.repeats.max(1) {
                s.start.record(&s.stream)?;
                for _ in 0..copies {
                    s.stream.memcpy_dtoh(self.check, s.src.ptr, bytes)?;
                }
                s.end.record(&s.stream)?;
                s.stream
                    .sync_until("device-to-host copy", self.deadline(1), &|| false)?;
                samples.push(gbps(bytes * copies, s.start.elapsed_ms(&s.end)?));
            }
            let down = stats::median(&samples).unwrap_or(0.0);
            if count_pattern_mismatch(self.check.as_slice(), seed_of(s.gpu.index)) != 0 {
                self.corrupt += 1;
            }
            (self.progress)(&format!(
                "host -> GPU {}: {:.1} GB/s, GPU {} -> host: {:.1} GB/s",
                s.gpu.index, up, s.gpu.index, down
            ));
            h2d.push(HostBandwidth {
                gpu: s.gpu.index,
                gbps: up,
            });
            d2h.push(HostBandwidth {
                gpu: s.gpu.index,
                gbps: down,
            });
        }
        Ok((h2d, d2h))
    }
}

fn empty(bytes: usize) -> PairMatrix {
    PairMatrix {
        bytes: bytes as u64,
        unidirectional: Vec::new(),
        bidirectional: Vec::new(),
        host_to_device: Vec::new(),
        device_to_host: Vec::new(),
        corrupt_copies: 0,
    }
}

/// Whether `side.dst` holds the pattern of `seed` (copied back to the host and compared).
fn verify(side: &Side, check: &mut HostBuf, seed: u64) -> GpuResult<bool> {
    let bytes = side.dst.bytes.min(check.bytes);
    side.stream.memcpy_dtoh(check, side.dst.ptr, bytes)?;
    side.stream.sync()?;
    let bad = count_pattern_mismatch(&check.as_slice()[..bytes], seed);
    if bad != 0 {
        tracing::warn!(gpu = side.gpu.index, bad, "copy arrived corrupt");
    }
    Ok(bad == 0)
}

fn gbps(bytes: usize, ms: f64) -> f64 {
    if ms > 0.0 {
        bytes as f64 / (ms * 1e-3) / 1e9
    } else {
        0.0
    }
}
