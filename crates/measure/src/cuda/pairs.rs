//! GPU-pair copy-engine bandwidth (one way per ordered pair, both ways per pair) and
//! host<->device per GPU, with peer access enabled and every copy's data checked.

use super::gpu::{
    DevBuf, Event, Gpu, GpuResult, HostBuf, Stream, count_pattern_mismatch, fill_pattern,
};
use crate::stats;
use gpufabric_api::result::{HostBandwidth, PairBandwidth, PairMatrix};
use std::time::{Duration, Instant};

/// How the matrix is measured.
pub struct PairSettings {
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
pub fn measure(gpus: &[Gpu], set: &PairSettings, progress: &dyn Fn(&str)) -> GpuResult<PairMatrix> {
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
    let deadline = |k: usize| Instant::now() + set.timeout.max(Duration::from_secs(1)) * k as u32;
    let never = || false;
    let mut corrupt = 0u32;
    let mut uni = Vec::new();
    for s in &sides {
        for d in &sides {
            if s.gpu.index == d.gpu.index {
                continue;
            }
            let mut samples = Vec::new();
            for _ in 0..set.repeats.max(1) {
                s.start.record(&s.stream)?;
                for _ in 0..set.copies.max(1) {
                    s.stream.memcpy_dtod(d.dst.ptr, s.src.ptr, bytes)?;
                }
                s.end.record(&s.stream)?;
                s.stream.sync_until("pair copy", deadline(1), &never)?;
                let ms = s.start.elapsed_ms(&s.end)?;
                samples.push(gbps(bytes * set.copies.max(1), ms));
            }
            let bw = stats::median(&samples).unwrap_or(0.0);
            if !verify(d, &mut check, seed_of(s.gpu.index))? {
                corrupt += 1;
            }
            progress(&format!(
                "pair {} -> {}: {:.1} GB/s",
                s.gpu.index, d.gpu.index, bw
            ));
            uni.push(PairBandwidth {
                src: s.gpu.index,
                dst: d.gpu.index,
                gbps: bw,
            });
        }
    }
    let mut bidir = Vec::new();
    if set.bidirectional {
        for (i, a) in sides.iter().enumerate() {
            for b in sides.iter().skip(i + 1) {
                let mut samples = Vec::new();
                for _ in 0..set.repeats.max(1) {
                    a.start.record(&a.stream)?;
                    b.stream.wait(&a.start)?;
                    // Twice the copies of the one-way test: the two streams start a few
                    // microseconds apart, which a longer run amortises.
                    for _ in 0..2 * set.copies.max(1) {
                        a.stream.memcpy_dtod(b.dst.ptr, a.src.ptr, bytes)?;
                        b.stream.memcpy_dtod(a.dst.ptr, b.src.ptr, bytes)?;
                    }
                    b.mid.record(&b.stream)?;
                    a.stream.wait(&b.mid)?;
                    a.end.record(&a.stream)?;
                    a.stream
                        .sync_until("bidirectional copy", deadline(2), &never)?;
                    let ms = a.start.elapsed_ms(&a.end)?;
                    samples.push(gbps(4 * bytes * set.copies.max(1), ms));
                }
                let bw = stats::median(&samples).unwrap_or(0.0);
                if !verify(b, &mut check, seed_of(a.gpu.index))? {
                    corrupt += 1;
                }
                if !verify(a, &mut check, seed_of(b.gpu.index))? {
                    corrupt += 1;
                }
                progress(&format!(
                    "pair {} <-> {}: {:.1} GB/s both ways",
                    a.gpu.index, b.gpu.index, bw
                ));
                bidir.push(PairBandwidth {
                    src: a.gpu.index,
                    dst: b.gpu.index,
                    gbps: bw,
                });
            }
        }
    }
    let (mut h2d, mut d2h) = (Vec::new(), Vec::new());
    if set.host_copies {
        let host_seed = 0x0057_0057;
        fill_pattern(host.as_mut_slice(), host_seed);
        for s in &sides {
            let mut samples = Vec::new();
            for _ in 0..set.repeats.max(1) {
                s.start.record(&s.stream)?;
                for _ in 0..set.copies.max(1) {
                    s.stream.memcpy_htod(s.dst.ptr, &host, bytes)?;
                }
                s.end.record(&s.stream)?;
                s.stream
                    .sync_until("host-to-device copy", deadline(1), &never)?;
                samples.push(gbps(bytes * set.copies.max(1), s.start.elapsed_ms(&s.end)?));
            }
            let up = stats::median(&samples).unwrap_or(0.0);
            if !verify(s, &mut check, host_seed)? {
                corrupt += 1;
            }
            let mut samples = Vec::new();
            for _ in 0..set.repeats.max(1) {
                s.start.record(&s.stream)?;
                for _ in 0..set.copies.max(1) {
                    s.stream.memcpy_dtoh(&mut check, s.src.ptr, bytes)?;
                }
                s.end.record(&s.stream)?;
                s.stream
                    .sync_until("device-to-host copy", deadline(1), &never)?;
                samples.push(gbps(bytes * set.copies.max(1), s.start.elapsed_ms(&s.end)?));
            }
            let down = stats::median(&samples).unwrap_or(0.0);
            if count_pattern_mismatch(check.as_slice(), seed_of(s.gpu.index)) != 0 {
                corrupt += 1;
            }
            progress(&format!(
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
    }
    Ok(PairMatrix {
        bytes: bytes as u64,
        unidirectional: uni,
        bidirectional: bidir,
        host_to_device: h2d,
        device_to_host: d2h,
        corrupt_copies: corrupt,
    })
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
