//! The suite's per-GPU compute checks: dense GEMM throughput, device memory bandwidth and
//! the silent-data-corruption GEMM.

use serde::{Deserialize, Serialize};

/// What each GPU computes, each GPU on its own and all GPUs at once: dense GEMM throughput,
/// device memory bandwidth, and a deterministic GEMM whose output is checked exactly
/// (silent data corruption). About 3 s on 4 x H100 with the defaults.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase", default)]
pub struct Compute {
    /// Dense matrix-multiply throughput per GPU.
    pub gemm: Gemm,
    /// Device memory bandwidth per GPU.
    pub memory: MemoryBandwidth,
    /// Silent data corruption: one GEMM with an exactly known result on every GPU.
    pub sdc: Sdc,
}

impl Compute {
    /// Whether any compute check runs.
    pub fn enabled(&self) -> bool {
        self.gemm.enabled || self.memory.enabled || self.sdc.enabled
    }

    /// Device bytes the largest enabled check holds on each GPU (the checks run one after
    /// the other), or None when none runs.
    pub fn device_bytes(&self) -> Option<u64> {
        let square = |n: u32| u64::from(n).saturating_mul(u64::from(n));
        [
            self.gemm
                .enabled
                .then(|| square(self.gemm.size).saturating_mul(12)),
            self.memory
                .enabled
                .then(|| self.memory.bytes.saturating_mul(2)),
            self.sdc
                .enabled
                .then(|| square(self.sdc.size).saturating_mul(8)),
        ]
        .into_iter()
        .flatten()
        .max()
    }
}

/// Dense GEMM throughput per GPU: `size` x `size` x `size` multiplies in bf16 (fp32
/// accumulate) and, where the GPU has it, TF32. The bf16 warm-up (about 0.8 s on H100 with
/// the defaults) brings clocks and power to their loaded plateau, and TF32 follows with at
/// most 50; the timed multiplies run in 4 blocks and the best is kept, so that a moment of
/// another tenant's load costs a block and not the check. Judged against the product
/// profile and the node's own median GPU.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct Gemm {
    /// Run the check.
    pub enabled: bool,
    /// M = N = K of each multiply; a multiple of 256 up to 32768.
    #[schemars(range(min = 256, max = 32768), extend("multipleOf" = 256))]
    pub size: u32,
    /// Untimed bf16 multiplies first (TF32: at most 50).
    #[schemars(range(max = 100000))]
    pub warmup_iters: u32,
    /// Timed multiplies of each data type, in 4 blocks.
    #[schemars(range(min = 1, max = 100000))]
    pub iters: u32,
    /// Also time TF32 (fp32 inputs on the tensor cores), on GPUs that have it.
    pub tf32: bool,
}

impl Default for Gemm {
    fn default() -> Self {
        Gemm {
            enabled: true,
            size: 8192,
            warmup_iters: 600,
            iters: 200,
            tf32: true,
        }
    }
}

/// Device memory bandwidth per GPU: device-to-device copies of `bytes` within the GPU (read
/// and write, counted as 2 x bytes, as nvbandwidth and PyTorch's `copy_` benchmarks do) and
/// fills of `bytes` (write only), each in 4 blocks of `iters`, the best block kept.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct MemoryBandwidth {
    /// Run the check.
    pub enabled: bool,
    /// Bytes of each copy; at least 64 MiB, so that caches do not hold it.
    #[schemars(range(min = 67108864))]
    pub bytes: u64,
    /// Copies (and fills) in each of the 4 timed blocks.
    #[schemars(range(min = 1, max = 100000))]
    pub iters: u32,
}

impl Default for MemoryBandwidth {
    fn default() -> Self {
        MemoryBandwidth {
            enabled: true,
            bytes: 1 << 30,
            iters: 50,
        }
    }
}

/// Silent data corruption: every GPU multiplies the same `size` x `size` integer-valued bf16
/// matrices with fp32 accumulation, whose exact product every algorithm reaches; each GPU's
/// output is checked against row and column sums computed exactly on the host, and compared
/// bit for bit with the other GPUs'. A mismatch fails the node and names the GPU.
#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct Sdc {
    /// Run the check.
    pub enabled: bool,
    /// M = N = K of the multiply; a multiple of 256 up to 16384 (the product stays exact in
    /// fp32 up to 2^24 / 4).
    #[schemars(range(min = 256, max = 16384), extend("multipleOf" = 256))]
    pub size: u32,
    /// Times each GPU computes it; every output is checked.
    #[schemars(range(min = 1, max = 1000))]
    pub repeats: u32,
}

impl Default for Sdc {
    fn default() -> Self {
        Sdc {
            enabled: true,
            size: 4096,
            repeats: 4,
        }
    }
}
