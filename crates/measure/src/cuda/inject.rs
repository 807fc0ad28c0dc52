//! Real faults to run beside a node check: a slow GPU pair (continuous copy traffic between
//! two GPUs, both ways), a straggler GPU (continuous bf16 GEMMs on one GPU) and a loaded host
//! link (continuous host-device copies on one GPU's PCIe link, both ways).

use super::gpu::{DevBuf, Gpu, GpuError, HostBuf, Stream};
use super::{ddp, open_gpus};
use crate::CheckError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// What an injector did.
#[derive(Debug, Clone, PartialEq)]
pub struct InjectReport {
    pub seconds: f64,
    /// Bytes copied (slow pair) or floating-point operations done (straggler).
    pub work: f64,
}

fn gpu_err(e: GpuError) -> CheckError {
    CheckError::Other(e.to_string())
}

fn pick(gpus: &[Gpu], index: u32) -> Result<&Gpu, CheckError> {
    gpus.iter().find(|g| g.index == index).ok_or_else(|| {
        CheckError::InvalidInput(format!(
            "GPU {index} does not exist (this host has {} GPU(s))",
            gpus.len()
        ))
    })
}

/// Copies between GPUs `a` and `b` in both directions, two streams each way, until
/// `duration` has passed or `stop` is set.
pub fn slow_pair(
    a: u32,
    b: u32,
    duration: Duration,
    stop: &AtomicBool,
) -> Result<InjectReport, CheckError> {
    if a == b {
        return Err(CheckError::InvalidInput(format!(
            "a slow pair needs two different GPUs, got {a} twice"
        )));
    }
    let gpus = open_gpus()?;
    let (ga, gb) = (pick(&gpus, a)?, pick(&gpus, b)?);
    ga.enable_peer(gb).map_err(gpu_err)?;
    gb.enable_peer(ga).map_err(gpu_err)?;
    let bytes = 512usize << 20;
    let bufs = (|| -> Result<_, GpuError> {
        Ok([
            (
                DevBuf::new(ga, bytes)?,
                DevBuf::new(gb, bytes)?,
                Stream::new(ga)?,
            ),
            (
                DevBuf::new(ga, bytes)?,
                DevBuf::new(gb, bytes)?,
                Stream::new(ga)?,
            ),
            (
                DevBuf::new(gb, bytes)?,
                DevBuf::new(ga, bytes)?,
                Stream::new(gb)?,
            ),
            (
                DevBuf::new(gb, bytes)?,
                DevBuf::new(ga, bytes)?,
                Stream::new(gb)?,
            ),
        ])
    })()
    .map_err(gpu_err)?;
    let started = Instant::now();
    let mut moved = 0f64;
    while started.elapsed() < duration && !stop.load(Ordering::Relaxed) {
        for (src, dst, stream) in &bufs {
            for _ in 0..4 {
                stream
                    .memcpy_dtod(dst.ptr, src.ptr, bytes)
                    .map_err(gpu_err)?;
            }
        }
        for (_, _, stream) in &bufs {
            stream.sync().map_err(gpu_err)?;
        }
        moved += (bufs.len() * 4 * bytes) as f64;
    }
    Ok(InjectReport {
        seconds: started.elapsed().as_secs_f64(),
        work: moved,
    })
}

/// Runs 8192^3 bf16 GEMMs back to back on GPU `index` until `duration` has passed or
/// `stop` is set.
pub fn straggler(
    index: u32,
    duration: Duration,
    stop: &AtomicBool,
) -> Result<InjectReport, CheckError> {
    if !ddp::cublas_present() {
        return Err(CheckError::LibraryMissing {
            library: "libcublas.so".into(),
            detail: "cuBLAS is needed to load a GPU with GEMMs".into(),
        });
    }
    let gpus = open_gpus()?;
    let g = pick(&gpus, index)?;
    let n = 8192usize;
    let started = Instant::now();
    let flops = ddp::busy_gemms(g, n, duration, stop).map_err(gpu_err)?;
    Ok(InjectReport {
        seconds: started.elapsed().as_secs_f64(),
        work: flops,
    })
}

/// Copies between pinned host memory and GPU `index` in both directions, `streams` streams
/// each way, until `duration` has passed or `stop` is set: the GPU's host link is shared
/// with the check, as when a link trains at a lower generation or width.
pub fn host_load(
    index: u32,
    streams: usize,
    duration: Duration,
    stop: &AtomicBool,
) -> Result<InjectReport, CheckError> {
    if streams == 0 {
        return Err(CheckError::InvalidInput(
            "a host-link load needs at least one stream each way".into(),
        ));
    }
    let gpus = open_gpus()?;
    let g = pick(&gpus, index)?;
    let bytes = 256usize << 20;
    let mut lanes = (0..streams)
        .map(|_| -> Result<_, GpuError> {
            Ok((
                HostBuf::new(g, bytes)?,
                DevBuf::new(g, bytes)?,
                Stream::new(g)?,
                HostBuf::new(g, bytes)?,
                DevBuf::new(g, bytes)?,
                Stream::new(g)?,
            ))
        })
        .collect::<Result<Vec<_>, _>>()
        .map_err(gpu_err)?;
    let started = Instant::now();
    let mut moved = 0f64;
    while started.elapsed() < duration && !stop.load(Ordering::Relaxed) {
        for (up_src, up_dst, up, down_dst, down_src, down) in &mut lanes {
            up.memcpy_htod(up_dst.ptr, up_src, bytes).map_err(gpu_err)?;
            down.memcpy_dtoh(down_dst, down_src.ptr, bytes)
                .map_err(gpu_err)?;
        }
        for (_, _, up, _, _, down) in &lanes {
            up.sync().map_err(gpu_err)?;
            down.sync().map_err(gpu_err)?;
        }
        moved += (lanes.len() * 2 * bytes) as f64;
    }
    Ok(InjectReport {
        seconds: started.elapsed().as_secs_f64(),
        work: moved,
    })
}
