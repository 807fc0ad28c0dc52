//! cuBLAS for the probe: a handle per GPU, the bf16 GEMM of the MLP step, random bf16
//! inputs, and the busy GEMMs that make a real straggler.

use crate::cuda::gpu::{DevBuf, Gpu, GpuError, GpuResult, HostBuf, Stream};
use cudarc::cublas::sys as bsys;
use std::ffi::c_void;
use std::time::Duration;

fn bcheck(call: &'static str, s: bsys::cublasStatus_t) -> GpuResult<()> {
    if s == bsys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
        Ok(())
    } else {
        Err(GpuError::Call {
            call,
            detail: format!("{s:?}"),
        })
    }
}

/// Whether libcublas can be opened.
pub(crate) fn cublas_present() -> bool {
    // SAFETY: only opens the library.
    unsafe { bsys::is_culib_present() }
}

/// A column-major matrix in device memory: its address and leading dimension.
#[derive(Clone, Copy)]
pub(super) struct Mat {
    pub(super) ptr: u64,
    pub(super) ld: usize,
}

/// How a GEMM reads one of its inputs.
#[derive(Clone, Copy)]
pub(super) enum Input {
    AsStored(Mat),
    Transposed(Mat),
}

impl Input {
    fn op(self) -> (bsys::cublasOperation_t, Mat) {
        match self {
            Input::AsStored(m) => (bsys::cublasOperation_t::CUBLAS_OP_N, m),
            Input::Transposed(m) => (bsys::cublasOperation_t::CUBLAS_OP_T, m),
        }
    }
}

pub(crate) struct Blas {
    raw: bsys::cublasHandle_t,
}

impl Blas {
    pub(crate) fn new(gpu: &Gpu, stream: &Stream) -> GpuResult<Blas> {
        gpu.bind()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid out-pointer; destroyed in Drop.
        bcheck("cublasCreate", unsafe { bsys::cublasCreate_v2(&mut raw) })?;
        let b = Blas { raw };
        // SAFETY: live handle and stream.
        bcheck("cublasSetStream", unsafe {
            bsys::cublasSetStream_v2(b.raw, stream.raw as bsys::cudaStream_t)
        })?;
        Ok(b)
    }

    /// C(m x n, bf16) = op(A) op(B) of bf16 matrices with inner dimension `k`, fp32
    /// accumulate; column-major.
    pub(super) fn gemm(
        &self,
        m: usize,
        n: usize,
        k: usize,
        a: Input,
        b: Input,
        c: Mat,
    ) -> GpuResult<()> {
        let alpha = 1.0f32;
        let beta = 0.0f32;
        let bf16 = bsys::cudaDataType::CUDA_R_16BF;
        let (op_a, a) = a.op();
        let (op_b, b) = b.op();
        // SAFETY: the pointers are device buffers sized for these shapes by the caller.
        bcheck("cublasGemmEx", unsafe {
            bsys::cublasGemmEx(
                self.raw,
                op_a,
                op_b,
                m as i32,
                n as i32,
                k as i32,
                &alpha as *const f32 as *const c_void,
                a.ptr as *const c_void,
                bf16,
                a.ld as i32,
                b.ptr as *const c_void,
                bf16,
                b.ld as i32,
                &beta as *const f32 as *const c_void,
                c.ptr as *mut c_void,
                bf16,
                c.ld as i32,
                bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        })
    }
}

impl Blas {
    /// C = A B of `n x n` matrices in the types of `kind` (column-major, no transposes, the
    /// default algorithm): the compute checks' GEMMs.
    pub(crate) fn square(
        &self,
        kind: SquareGemm,
        n: usize,
        a: u64,
        b: u64,
        c: u64,
    ) -> GpuResult<()> {
        let alpha = 1.0f32;
        let beta = 0.0f32;
        let (input, output, compute) = match kind {
            SquareGemm::Bf16 => (
                bsys::cudaDataType::CUDA_R_16BF,
                bsys::cudaDataType::CUDA_R_16BF,
                bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            ),
            SquareGemm::Bf16ToF32 => (
                bsys::cudaDataType::CUDA_R_16BF,
                bsys::cudaDataType::CUDA_R_32F,
                bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            ),
            SquareGemm::Tf32 => (
                bsys::cudaDataType::CUDA_R_32F,
                bsys::cudaDataType::CUDA_R_32F,
                bsys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
            ),
        };
        let n = n as i32;
        let op = bsys::cublasOperation_t::CUBLAS_OP_N;
        // SAFETY: the pointers are device buffers of n x n elements of these types, sized
        // by the caller.
        bcheck("cublasGemmEx", unsafe {
            bsys::cublasGemmEx(
                self.raw,
                op,
                op,
                n,
                n,
                n,
                &alpha as *const f32 as *const c_void,
                a as *const c_void,
                input,
                n,
                b as *const c_void,
                input,
                n,
                &beta as *const f32 as *const c_void,
                c as *mut c_void,
                output,
                n,
                compute,
                bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        })
    }
}

/// The types of a square GEMM of the compute checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SquareGemm {
    /// bf16 inputs and output, fp32 accumulation (PyTorch's bf16 `matmul`).
    Bf16,
    /// bf16 inputs, fp32 output and accumulation (the silent-data-corruption GEMM).
    Bf16ToF32,
    /// fp32 inputs and output on the tensor cores in TF32.
    Tf32,
}

// SAFETY: a cuBLAS handle may be used from any thread, one at a time; each handle belongs
// to one replica and each replica to one thread at a time.
unsafe impl Send for Blas {}
// SAFETY: as above.
unsafe impl Sync for Blas {}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: destroys the handle created in new().
        unsafe { bsys::cublasDestroy_v2(self.raw) };
    }
}

/// Pseudo-random bf16 values uniform in (-scale, scale), as little-endian bytes.
pub(super) fn bf16_random(buf: &mut [u8], scale: f32, seed: u64) {
    let n = buf.len() / 2;
    let chunk = (n / 16).max(1 << 16);
    std::thread::scope(|s| {
        for (ci, part) in buf[..n * 2].chunks_mut(chunk * 2).enumerate() {
            s.spawn(move || {
                for (j, cell) in part.chunks_exact_mut(2).enumerate() {
                    let w = crate::cuda::gpu::pattern_word(seed, (ci * chunk + j) as u64);
                    let u = (w >> 40) as f32 / (1u64 << 24) as f32; // [0, 1)
                    let v = (2.0 * u - 1.0) * scale;
                    let bits = (v.to_bits() >> 16) as u16;
                    cell.copy_from_slice(&bits.to_le_bytes());
                }
            });
        }
    });
}

/// Runs n x n x n bf16 GEMMs on `gpu` until `duration` passes or `stop` is set; returns the
/// floating-point operations done. Used to make a real straggler.
pub(crate) fn busy_gemms(
    gpu: &Gpu,
    n: usize,
    duration: Duration,
    stop: &std::sync::atomic::AtomicBool,
) -> GpuResult<f64> {
    let stream = Stream::new(gpu)?;
    let blas = Blas::new(gpu, &stream)?;
    let bytes = n * n * 2;
    let a = DevBuf::new(gpu, bytes)?;
    let b = DevBuf::new(gpu, bytes)?;
    let c = DevBuf::new(gpu, bytes)?;
    let mut host = HostBuf::new(gpu, bytes)?;
    bf16_random(host.as_mut_slice(), 1.0, 21);
    stream.memcpy_htod(a.ptr, &host, bytes)?;
    stream.memcpy_htod(b.ptr, &host, bytes)?;
    stream.sync()?;
    let started = std::time::Instant::now();
    let mut flops = 0.0;
    while started.elapsed() < duration && !stop.load(std::sync::atomic::Ordering::Relaxed) {
        gpu.bind()?;
        for _ in 0..8 {
            let mat = |ptr| Mat { ptr, ld: n };
            blas.gemm(
                n,
                n,
                n,
                Input::AsStored(mat(a.ptr)),
                Input::AsStored(mat(b.ptr)),
                mat(c.ptr),
            )?;
        }
        stream.sync()?;
        flops += 8.0 * 2.0 * (n as f64).powi(3);
    }
    Ok(flops)
}
