//! The compute checks, backend-neutral: the silent-data-corruption GEMM's inputs, its exact
//! reference, the check of one GPU's output against it and the comparison of the GPUs'
//! outputs with one another; and the throughput arithmetic both backends share.
//!
//! The SDC GEMM multiplies two `n x n` matrices of small integers (-2 to 2) held in bf16,
//! with fp32 accumulation into an fp32 output. Every product and partial sum is an integer of
//! at most `4 n` in magnitude, exact in fp32 (for `n` up to 2^22), so every algorithm, split
//! and order reaches the same exact output: any other bit on any GPU is a corruption, never
//! rounding. The reference is not a second GEMM: each row sum of `C = A B` is `A (B 1)` and
//! each column sum `(1^T A) B`, both exact in i64 in `O(n^2)` on the host. A flipped bit in
//! one element changes its row's and its column's sums, which names the element.

use gpufabric_api::result::SdcStatus;

/// Seed of the SDC inputs: every GPU and every run multiplies the same matrices.
const SDC_SEED: u64 = 0x5dc0_5eed;

/// The value (-2 to 2) of element `i` of SDC input `which` (0: A, 1: B).
pub(crate) fn sdc_value(which: u64, i: u64) -> i64 {
    let w = splitmix(SDC_SEED ^ which.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ i);
    (w % 5) as i64 - 2
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The bf16 bits of a small integer (exact: bf16 holds integers up to 256).
fn bf16_bits(v: i64) -> u16 {
    ((v as f32).to_bits() >> 16) as u16
}

/// SDC input `which` (0: A, 1: B) of `n x n`, column-major, as little-endian bf16 bytes.
pub(crate) fn sdc_input_bf16(which: u64, n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n * n * 2];
    for (i, cell) in out.chunks_exact_mut(2).enumerate() {
        cell.copy_from_slice(&bf16_bits(sdc_value(which, i as u64)).to_le_bytes());
    }
    out
}

/// The exact row and column sums of the SDC product of `n x n`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SdcReference {
    pub n: usize,
    pub rows: Vec<i64>,
    pub cols: Vec<i64>,
}

impl SdcReference {
    /// Row sums `A (B 1)` and column sums `(1^T A) B`, column-major (element (i, k) of A is
    /// `A[i + k n]`).
    pub(crate) fn new(n: usize) -> SdcReference {
        let a = |i: usize, k: usize| sdc_value(0, (i + k * n) as u64);
        let b = |k: usize, j: usize| sdc_value(1, (k + j * n) as u64);
        let b_row_sums: Vec<i64> = (0..n).map(|k| (0..n).map(|j| b(k, j)).sum()).collect();
        let a_col_sums: Vec<i64> = (0..n).map(|k| (0..n).map(|i| a(i, k)).sum()).collect();
        let rows = (0..n)
            .map(|i| (0..n).map(|k| a(i, k) * b_row_sums[k]).sum())
            .collect();
        let cols = (0..n)
            .map(|j| (0..n).map(|k| a_col_sums[k] * b(k, j)).sum())
            .collect();
        SdcReference { n, rows, cols }
    }
}

/// One output of one GPU against the reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OutputCheck {
    /// Rows whose sum differs from the exact one (or that hold a value that is not an
    /// integer), ascending.
    pub wrong_rows: Vec<u32>,
    /// Columns likewise.
    pub wrong_cols: Vec<u32>,
    /// A hash of the output's bytes.
    pub hash: u64,
}

impl OutputCheck {
    pub(crate) fn is_exact(&self) -> bool {
        self.wrong_rows.is_empty() && self.wrong_cols.is_empty()
    }
}

/// Checks one `n x n` fp32 output (column-major, little-endian bytes) against `reference`.
pub(crate) fn check_output(reference: &SdcReference, out: &[u8]) -> OutputCheck {
    let n = reference.n;
    let mut rows = vec![0i64; n];
    let mut cols = vec![0i64; n];
    let mut bad_rows = vec![false; n];
    let mut bad_cols = vec![false; n];
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    for (idx, word) in out.chunks_exact(4).take(n * n).enumerate() {
        let bits = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
        hash = (hash ^ u64::from(bits)).wrapping_mul(0x0000_0100_0000_01b3);
        let (i, j) = (idx % n, idx / n);
        let v = f32::from_bits(bits);
        if !v.is_finite() || v.fract() != 0.0 || v.abs() > 16_777_216.0 {
            bad_rows[i] = true;
            bad_cols[j] = true;
            continue;
        }
        rows[i] += v as i64;
        cols[j] += v as i64;
    }
    // A short output leaves every line it lacks wrong.
    let complete = out.len() >= n * n * 4;
    let wrong = |sums: &[i64], want: &[i64], bad: &[bool]| -> Vec<u32> {
        (0..n)
            .filter(|&x| !complete || bad[x] || sums[x] != want[x])
            .map(|x| x as u32)
            .collect()
    };
    OutputCheck {
        wrong_rows: wrong(&rows, &reference.rows, &bad_rows),
        wrong_cols: wrong(&cols, &reference.cols, &bad_cols),
        hash,
    }
}

/// Each GPU's SDC status from its outputs' checks (`(gpu, checks)`, in GPU order). A GPU
/// differs from the others when its first output's bytes differ from those most GPUs
/// produced, or, where no hash has a majority (two GPUs, or all different), when its
/// output is not exact. Every output is recomputed, so a corruption that comes and goes is
/// counted in the outputs it touched.
pub(crate) fn sdc_statuses(per_gpu: &[(u32, Vec<OutputCheck>)]) -> Vec<(u32, SdcStatus)> {
    let firsts: Vec<u64> = per_gpu
        .iter()
        .filter_map(|(_, c)| c.first().map(|o| o.hash))
        .collect();
    let majority = majority(&firsts);
    per_gpu
        .iter()
        .map(|(gpu, checks)| {
            let first = checks.first();
            let hash = first.map_or(0, |o| o.hash);
            // Exact outputs are the same bytes: only an inexact one is wrong.
            let wrong_outputs = checks.iter().filter(|o| !o.is_exact()).count() as u32;
            let wrong_lines = checks
                .iter()
                .map(|o| (o.wrong_rows.len() + o.wrong_cols.len()) as u64)
                .sum();
            let first_wrong = checks
                .iter()
                .find(|o| !o.is_exact())
                .and_then(|o| Some((*o.wrong_rows.first()?, *o.wrong_cols.first()?)));
            let differs_from_others = match majority {
                Some(m) => hash != m,
                None => first.is_none_or(|o| !o.is_exact()),
            };
            let status = SdcStatus {
                outputs: checks.len() as u32,
                wrong_outputs,
                wrong_lines,
                first_wrong,
                checksum: format!("{hash:016x}"),
                differs_from_others,
            };
            (*gpu, status)
        })
        .collect()
}

/// The value more than half of `values` share, if one does.
fn majority(values: &[u64]) -> Option<u64> {
    values
        .iter()
        .find(|v| values.iter().filter(|w| w == v).count() * 2 > values.len())
        .copied()
}

/// The exact SDC product of `n x n` computed on the host, column-major fp32 bytes: what
/// every GPU must output. `O(n^3)`: for small `n` (the sim backend, tests).
pub(crate) fn exact_output(n: usize) -> Vec<u8> {
    let a: Vec<i64> = (0..n * n).map(|i| sdc_value(0, i as u64)).collect();
    let b: Vec<i64> = (0..n * n).map(|i| sdc_value(1, i as u64)).collect();
    let mut out = Vec::with_capacity(n * n * 4);
    for j in 0..n {
        for i in 0..n {
            let v: i64 = (0..n).map(|k| a[i + k * n] * b[k + j * n]).sum();
            out.extend_from_slice(&(v as f32).to_le_bytes());
        }
    }
    out
}

/// Flips bit `bit` of element (`row`, `col`) of an `n x n` fp32 output (column-major): a
/// test hook standing in for a corruption, never a real fault.
pub(crate) fn flip_bit(out: &mut [u8], n: usize, row: usize, col: usize, bit: u32) {
    let at = (row + col * n) * 4;
    if let Some(cell) = out.get_mut(at..at + 4) {
        let w = u32::from_le_bytes([cell[0], cell[1], cell[2], cell[3]]) ^ (1 << (bit % 32));
        cell.copy_from_slice(&w.to_le_bytes());
    }
}

/// TFLOP/s of `iters` square GEMMs of `n` in `seconds`.
pub(crate) fn gemm_tflops(n: u32, iters: u32, seconds: f64) -> f64 {
    if seconds <= 0.0 {
        return 0.0;
    }
    2.0 * f64::from(n).powi(3) * f64::from(iters) / seconds / 1e12
}

/// GB/s of `iters` transfers of `bytes` each in `seconds`.
pub(crate) fn gbps(bytes: u64, iters: u32, seconds: f64) -> f64 {
    if seconds <= 0.0 {
        return 0.0;
    }
    bytes as f64 * f64::from(iters) / seconds / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flip(out: &mut [u8], row: usize, col: usize, n: usize, bit: u32) {
        flip_bit(out, n, row, col, bit);
    }

    #[test]
    fn the_inputs_are_small_integers_spread_over_all_five_values_and_the_same_every_time() {
        let a = sdc_input_bf16(0, 64);
        assert_eq!(a, sdc_input_bf16(0, 64));
        assert_ne!(a, sdc_input_bf16(1, 64));
        let mut seen = [0usize; 5];
        for i in 0..4096 {
            let v = sdc_value(0, i);
            assert!((-2..=2).contains(&v));
            seen[(v + 2) as usize] += 1;
        }
        assert!(seen.iter().all(|&c| c > 600), "{seen:?}");
        // bf16 of -2 is 0xc000, of 1 is 0x3f80.
        assert_eq!(bf16_bits(-2), 0xc000);
        assert_eq!(bf16_bits(1), 0x3f80);
    }

    #[test]
    fn an_exact_output_passes_and_every_single_bit_flip_is_found_where_it_is() {
        let n = 48;
        let reference = SdcReference::new(n);
        let good = exact_output(n);
        let c = check_output(&reference, &good);
        assert!(c.is_exact(), "{c:?}");
        for bit in 0..32 {
            let (row, col) = (bit as usize % n, (bit as usize * 7) % n);
            let mut bad = good.clone();
            flip(&mut bad, row, col, n, bit);
            let c = check_output(&reference, &bad);
            assert_eq!(c.wrong_rows, vec![row as u32], "bit {bit}: {c:?}");
            assert_eq!(c.wrong_cols, vec![col as u32], "bit {bit}: {c:?}");
            assert_ne!(c.hash, check_output(&reference, &good).hash);
        }
    }

    #[test]
    fn a_short_or_non_integer_output_is_wrong() {
        let n = 16;
        let reference = SdcReference::new(n);
        let good = exact_output(n);
        assert!(!check_output(&reference, &good[..good.len() - 4]).is_exact());
        let mut half = good.clone();
        let v = f32::from_le_bytes([half[0], half[1], half[2], half[3]]) + 0.5;
        half[..4].copy_from_slice(&v.to_le_bytes());
        let c = check_output(&reference, &half);
        assert_eq!((c.wrong_rows[0], c.wrong_cols[0]), (0, 0), "{c:?}");
        let mut nan = good;
        nan[4..8].copy_from_slice(&f32::NAN.to_le_bytes());
        assert_eq!(check_output(&reference, &nan).wrong_rows, vec![1]);
    }

    #[test]
    fn the_gpu_whose_output_differs_is_named_and_the_others_are_not() {
        let n = 32;
        let reference = SdcReference::new(n);
        let good = check_output(&reference, &exact_output(n));
        let mut out = exact_output(n);
        flip(&mut out, 5, 9, n, 3);
        let bad = check_output(&reference, &out);
        // Four GPUs, GPU 2 wrong in its second output only.
        let gpus: Vec<(u32, Vec<OutputCheck>)> = (0..4)
            .map(|g| {
                let second = if g == 2 { bad.clone() } else { good.clone() };
                (g, vec![good.clone(), second])
            })
            .collect();
        let s = sdc_statuses(&gpus);
        for (g, st) in &s {
            if *g == 2 {
                assert_eq!(st.wrong_outputs, 1, "{st:?}");
                assert_eq!(st.first_wrong, Some((5, 9)));
                assert!(!st.clean());
                // Its first output was right: it is the repeat that failed.
                assert!(!st.differs_from_others);
            } else {
                assert!(st.clean(), "{g}: {st:?}");
            }
            assert_eq!(st.outputs, 2);
        }
        // Wrong in its first output: it also differs from the others.
        let gpus = vec![
            (0, vec![good.clone()]),
            (1, vec![bad.clone()]),
            (2, vec![good.clone()]),
        ];
        let s = sdc_statuses(&gpus);
        assert!(s[1].1.differs_from_others && !s[0].1.differs_from_others);
        // Wrong in its first output only, the repeats exact: one wrong output, and the
        // first output (the one compared) differs from the others'.
        let gpus = vec![
            (0, vec![good.clone(), good.clone()]),
            (1, vec![bad.clone(), good.clone()]),
            (2, vec![good.clone(), good.clone()]),
        ];
        let s = sdc_statuses(&gpus);
        assert_eq!(s[1].1.wrong_outputs, 1, "{:?}", s[1]);
        assert!(s[1].1.differs_from_others && !s[1].1.clean());
        // Two GPUs: no majority, the reference decides.
        let s = sdc_statuses(&[(0, vec![good.clone()]), (1, vec![bad])]);
        assert!(!s[0].1.differs_from_others && s[1].1.differs_from_others);
        assert_eq!(s[0].1.checksum.len(), 16);
    }

    #[test]
    fn the_reference_of_a_large_product_is_exact() {
        // The largest row or column sum of 4096 stays far inside i64, and the reference is
        // the same every time.
        let r = SdcReference::new(256);
        assert_eq!(r, SdcReference::new(256));
        assert_eq!(r.rows.iter().sum::<i64>(), r.cols.iter().sum::<i64>());
    }

    #[test]
    fn rates_are_work_over_time_and_zero_time_is_no_rate() {
        assert!((gemm_tflops(8192, 100, 0.2) - 549.755_813_888).abs() < 1e-6);
        assert_eq!(gbps(1 << 30, 10, 0.0), 0.0);
        assert!((gbps(1_000_000_000, 3, 1.5) - 2.0).abs() < 1e-12);
    }
}
