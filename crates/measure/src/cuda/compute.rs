//! The compute checks on this process's GPUs, every GPU at once, each from its own thread:
//! bf16 and TF32 GEMM throughput (cuBLAS, the default algorithm, timed with CUDA events
//! after warm-up multiplies that bring the clocks to their loaded plateau, NVML read
//! halfway through the timed ones), device memory copy and fill bandwidth, and the
//! silent-data-corruption GEMM checked on the host ([`crate::compute`]).

use super::ddp::{Blas, SquareGemm};
use super::gpu::{DevBuf, Event, Gpu, GpuError, GpuResult, HostBuf, Stream};
use super::health::Monitor;
use crate::compute::{OutputCheck, SdcReference, check_output, gbps, gemm_tflops};
use crate::node_check::PhaseRun;
use gpufabric_api::result::{ComputeResult, GpuCompute, LoadReading};
use gpufabric_api::suite::Compute;
use std::time::Instant;

/// What every GPU's SDC check starts from, made once on the host: the two inputs, the
/// exact sums an output must have, and how many outputs each GPU computes.
struct SdcInputs {
    reference: SdcReference,
    a: Vec<u8>,
    b: Vec<u8>,
    repeats: u32,
}

impl SdcInputs {
    fn new(c: &Compute) -> SdcInputs {
        let n = c.sdc.size as usize;
        SdcInputs {
            reference: SdcReference::new(n),
            a: crate::compute::sdc_input_bf16(0, n),
            b: crate::compute::sdc_input_bf16(1, n),
            repeats: c.sdc.repeats,
        }
    }
}

/// What one GPU's thread measured: its rates, its load reading and its SDC outputs.
struct Measured {
    compute: GpuCompute,
    sdc: Vec<OutputCheck>,
}

/// The compute checks of `run` on `gpus`; `flip` names a GPU whose first SDC output gets
/// one bit flipped on the device before it is read (a test hook, never a real fault).
pub(super) fn compute_phase(
    run: &PhaseRun,
    gpus: &[Gpu],
    monitor: Option<&Monitor>,
    flip: Option<u32>,
) -> GpuResult<ComputeResult> {
    let c = run.opts.compute();
    let deadline = Instant::now() + run.timeout;
    let sdc = c.sdc.enabled.then(|| SdcInputs::new(&c));
    let results: Vec<GpuResult<Measured>> = std::thread::scope(|s| {
        let handles: Vec<_> = gpus
            .iter()
            .map(|gpu| {
                let (c, sdc) = (&c, sdc.as_ref());
                s.spawn(move || one_gpu(gpu, c, deadline, monitor, sdc, flip == Some(gpu.index)))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| super::gpu::joined(h, "compute check"))
            .collect()
    });
    let mut measured = Vec::with_capacity(results.len());
    for (gpu, r) in gpus.iter().zip(results) {
        measured.push(r.map_err(|e| on_gpu(gpu.index, e))?);
    }
    let checks: Vec<(u32, Vec<OutputCheck>)> = measured
        .iter()
        .map(|m| (m.compute.gpu, m.sdc.clone()))
        .collect();
    let statuses = if c.sdc.enabled {
        crate::compute::sdc_statuses(&checks)
    } else {
        Vec::new()
    };
    let gpus = measured
        .into_iter()
        .map(|m| {
            let mut g = m.compute;
            g.sdc = statuses
                .iter()
                .find(|(i, _)| *i == g.gpu)
                .map(|(_, s)| s.clone());
            g
        })
        .collect();
    let progress = run.progress;
    progress("compute: done");
    Ok(ComputeResult {
        gemm_size: c.gemm.enabled.then_some(c.gemm.size),
        memory_bytes: c.memory.enabled.then_some(c.memory.bytes),
        sdc_size: c.sdc.enabled.then_some(c.sdc.size),
        gpus,
    })
}

/// The same error, naming the GPU it happened on.
fn on_gpu(index: u32, e: GpuError) -> GpuError {
    match e {
        GpuError::Call { call, detail } => GpuError::Call {
            call,
            detail: format!("GPU {index}: {detail}"),
        },
        GpuError::Timeout(what, d) => GpuError::Timeout(format!("GPU {index}: {what}"), d),
        other => other,
    }
}

fn one_gpu(
    gpu: &Gpu,
    c: &Compute,
    deadline: Instant,
    monitor: Option<&Monitor>,
    sdc: Option<&SdcInputs>,
    flip: bool,
) -> GpuResult<Measured> {
    gpu.bind()?;
    let stream = Stream::new(gpu)?;
    let blas = Blas::new(gpu, &stream)?;
    let mut out = GpuCompute {
        gpu: gpu.index,
        ..Default::default()
    };
    if c.gemm.enabled {
        let n = c.gemm.size as usize;
        let (bf16, load) = gemm_rate(gpu, &stream, &blas, SquareGemm::Bf16, c, deadline, monitor)?;
        out.gemm_bf16_tflops = Some(bf16);
        out.under_load = load;
        if c.gemm.tf32 && supports_tf32(gpu) {
            let (tf32, _) = gemm_rate(gpu, &stream, &blas, SquareGemm::Tf32, c, deadline, None)?;
            out.gemm_tf32_tflops = Some(tf32);
        }
        tracing::debug!(gpu = gpu.index, n, "GEMM rates measured");
    }
    if c.memory.enabled {
        let (copy, write) = memory_rates(gpu, &stream, c, deadline)?;
        out.memory_copy_gbps = Some(copy);
        out.memory_write_gbps = Some(write);
    }
    let sdc = match sdc {
        Some(sdc) => sdc_outputs(gpu, &stream, &blas, sdc, deadline, flip)?,
        None => Vec::new(),
    };
    Ok(Measured { compute: out, sdc })
}

/// TF32 needs compute capability 8.0 (Ampere) or later.
fn supports_tf32(gpu: &Gpu) -> bool {
    gpu.compute_capability()
        .is_some_and(|(major, _)| major >= 8)
}

/// Waits for `stream` until `deadline`, a timeout naming `what` after it.
fn wait(stream: &Stream, what: &str, deadline: Instant) -> GpuResult<()> {
    stream.sync_until(what, deadline, &|| false)
}

/// Timed blocks of a rate, the best of which is kept: a pause of the GPU's memory or
/// clocks for another tenant's burst (a shared host) costs one block, not the check; a GPU
/// that is slow is slow in every block.
const BLOCKS: u32 = 4;

/// Warm-up multiplies of TF32 at most: it follows bf16 on a GPU already at its plateau.
const TF32_WARMUP_MAX: u32 = 50;

/// Where timed work runs, what it is called in a timeout, and the phase's deadline.
struct On<'a> {
    gpu: &'a Gpu,
    stream: &'a Stream,
    what: &'a str,
    deadline: Instant,
}

/// The best rate (calls per second) of `blocks` timed blocks of `per_block` calls of `work`
/// each; `during` runs once while the last block runs.
fn best_of_blocks(
    on: &On,
    blocks: u32,
    work: &dyn Fn() -> GpuResult<()>,
    per_block: u32,
    during: &dyn Fn(),
) -> GpuResult<f64> {
    let On {
        gpu,
        stream,
        what,
        deadline,
    } = *on;
    let events = (0..=blocks)
        .map(|_| Event::new(gpu))
        .collect::<GpuResult<Vec<Event>>>()?;
    events[0].record(stream)?;
    for e in &events[1..] {
        for _ in 0..per_block {
            work()?;
        }
        e.record(stream)?;
    }
    if let Some(second_last) = events.get(events.len().saturating_sub(2)) {
        // Wait for the last block to start, then read the GPU under load.
        second_last.synchronize()?;
        during();
    }
    wait(stream, what, deadline)?;
    let mut best = f64::INFINITY;
    for pair in events.windows(2) {
        best = best.min(pair[0].elapsed_ms(&pair[1])? / 1e3);
    }
    Ok(if best.is_finite() && best > 0.0 {
        f64::from(per_block) / best
    } else {
        0.0
    })
}

/// One GEMM type's TFLOP/s: warm-up multiplies (bf16's bring the clocks and power to their
/// loaded plateau), then `iters` timed ones in [`BLOCKS`] blocks, the best kept, NVML read
/// (with `monitor`) as the last block runs.
fn gemm_rate(
    gpu: &Gpu,
    stream: &Stream,
    blas: &Blas,
    kind: SquareGemm,
    c: &Compute,
    deadline: Instant,
    monitor: Option<&Monitor>,
) -> GpuResult<(f64, Option<LoadReading>)> {
    let n = c.gemm.size as usize;
    let elem = if kind == SquareGemm::Tf32 { 4 } else { 2 };
    let bytes = n * n * elem;
    let a = DevBuf::new(gpu, bytes)?;
    let b = DevBuf::new(gpu, bytes)?;
    let out = DevBuf::new(gpu, bytes)?;
    // Inputs of a small constant: finite throughout, and the GEMM's rate does not depend
    // on the values.
    let one = if kind == SquareGemm::Tf32 {
        0.001f32.to_bits()
    } else {
        let h = 0.001f32.to_bits() >> 16;
        h | (h << 16)
    };
    stream.memset_d32(a.ptr, one, bytes / 4)?;
    stream.memset_d32(b.ptr, one, bytes / 4)?;
    let what = format!("{kind:?} GEMMs of {n}");
    let warmup = if kind == SquareGemm::Tf32 {
        c.gemm.warmup_iters.min(TF32_WARMUP_MAX)
    } else {
        c.gemm.warmup_iters
    };
    for _ in 0..warmup {
        blas.square(kind, n, a.ptr, b.ptr, out.ptr)?;
    }
    wait(stream, &what, deadline)?;
    let blocks = BLOCKS.min(c.gemm.iters.max(1));
    let per_block = (c.gemm.iters / blocks).max(1);
    let load = std::cell::Cell::new(None);
    let on = On {
        gpu,
        stream,
        what: &what,
        deadline,
    };
    let per_second = best_of_blocks(
        &on,
        blocks,
        &|| blas.square(kind, n, a.ptr, b.ptr, out.ptr),
        per_block,
        &|| load.set(monitor.and_then(|m| m.load_reading(gpu.index))),
    )?;
    Ok((gemm_tflops(c.gemm.size, 1, 1.0) * per_second, load.take()))
}

/// Device-to-device copies within the GPU (2 x bytes each) and fills (bytes each), GB/s:
/// the best of [`BLOCKS`] blocks of `iters` each.
fn memory_rates(
    gpu: &Gpu,
    stream: &Stream,
    c: &Compute,
    deadline: Instant,
) -> GpuResult<(f64, f64)> {
    let bytes = c.memory.bytes as usize;
    let src = DevBuf::new(gpu, bytes)?;
    let dst = DevBuf::new(gpu, bytes)?;
    stream.memset_d32(src.ptr, 0x5a5a_5a5a, bytes / 4)?;
    let what = format!("memory copies of {bytes} bytes");
    let iters = c.memory.iters.max(1);
    let copy = || stream.memcpy_dtod(dst.ptr, src.ptr, bytes);
    let fill = || stream.memset_d32(dst.ptr, 0xa5a5_a5a5, bytes / 4);
    let on = On {
        gpu,
        stream,
        what: &what,
        deadline,
    };
    copy()?;
    let copies = best_of_blocks(&on, BLOCKS, &copy, iters, &|| {})?;
    fill()?;
    let fills = best_of_blocks(&on, BLOCKS, &fill, iters, &|| {})?;
    Ok((
        gbps(2 * c.memory.bytes, 1, 1.0) * copies,
        gbps(c.memory.bytes, 1, 1.0) * fills,
    ))
}

/// The SDC GEMM of `sdc`'s inputs `repeats` times, each output read back and checked
/// against its reference; with `flip`, one bit of the first output is flipped on the device
/// before it is read.
fn sdc_outputs(
    gpu: &Gpu,
    stream: &Stream,
    blas: &Blas,
    sdc: &SdcInputs,
    deadline: Instant,
    flip: bool,
) -> GpuResult<Vec<OutputCheck>> {
    let SdcInputs {
        reference,
        a: a_host,
        b: b_host,
        repeats,
    } = sdc;
    let n = reference.n;
    let in_bytes = n * n * 2;
    let out_bytes = n * n * 4;
    let a = DevBuf::new(gpu, in_bytes)?;
    let b = DevBuf::new(gpu, in_bytes)?;
    let out = DevBuf::new(gpu, out_bytes)?;
    let mut host = HostBuf::new(gpu, out_bytes.max(in_bytes))?;
    for (dev, src) in [(&a, a_host), (&b, b_host)] {
        host.as_mut_slice()[..in_bytes].copy_from_slice(&src[..in_bytes]);
        stream.memcpy_htod(dev.ptr, &host, in_bytes)?;
        wait(stream, "the SDC inputs", deadline)?;
    }
    let mut checks = Vec::with_capacity(*repeats as usize);
    for r in 0..(*repeats).max(1) {
        // NaN everywhere first: an element the GEMM never wrote is wrong, not stale.
        stream.memset_d32(out.ptr, 0xffff_ffff, n * n)?;
        blas.square(SquareGemm::Bf16ToF32, n, a.ptr, b.ptr, out.ptr)?;
        if flip && r == 0 {
            flip_on_device(gpu, stream, &out, n, deadline)?;
        }
        stream.memcpy_dtoh(&mut host, out.ptr, out_bytes)?;
        wait(stream, "the SDC GEMM", deadline)?;
        checks.push(check_output(reference, &host.as_slice()[..out_bytes]));
    }
    Ok(checks)
}

/// Flips bit 12 of element (n/3, n/2) of the output in device memory.
fn flip_on_device(
    gpu: &Gpu,
    stream: &Stream,
    out: &DevBuf,
    n: usize,
    deadline: Instant,
) -> GpuResult<()> {
    let offset = (n / 3 + (n / 2) * n) * 4;
    let mut cell = HostBuf::new(gpu, 4)?;
    stream.memcpy_dtoh(&mut cell, out.at(offset), 4)?;
    wait(stream, "the SDC test hook", deadline)?;
    crate::compute::flip_bit(cell.as_mut_slice(), 1, 0, 0, 12);
    stream.memcpy_htod(out.at(offset), &cell, 4)?;
    wait(stream, "the SDC test hook", deadline)
}
