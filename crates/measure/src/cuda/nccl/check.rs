//! The sweep's inputs and the expected outputs of every collective: small integers exact in
//! every data type, so that each wrong element is counted.

use gpufabric_api::suite::{Collective, DataType};

/// Input value of rank `r` at element `i`: small integers, exact in every data type.
pub(crate) fn input_value(r: u64, i: u64) -> i64 {
    ((i.wrapping_mul(7) + r.wrapping_mul(3) + (i >> 12)) % 8) as i64
}

/// Expected output of rank `r` at element `i` (count = per-rank recv count, `per` = the
/// chunk per peer where relevant); `None` where the output is not defined (non-root of
/// reduce).
#[cfg(test)]
pub(crate) fn expected_value(c: Collective, n: u64, r: u64, i: u64, per: u64) -> Option<i64> {
    expected_with(c, n, r, i, per, &rank_sums(n))
}

/// The sum over `n` ranks of [`input_value`] by the rank-independent part of the index
/// modulo 8 (`(7i + (i >> 12)) % 8`): a reduction's expected value is one table read.
pub(crate) fn rank_sums(n: u64) -> [i64; 8] {
    let mut t = [0i64; 8];
    for (k, slot) in t.iter_mut().enumerate() {
        *slot = (0..n).map(|q| ((k as u64 + q * 3) % 8) as i64).sum();
    }
    t
}

fn expected_with(c: Collective, n: u64, r: u64, i: u64, per: u64, sums: &[i64; 8]) -> Option<i64> {
    // (7i + 3q + (i >> 12)) % 8 summed over q: only (7i + (i >> 12)) % 8 varies with i, and
    // wrapping arithmetic modulo 2^64 keeps the residue modulo 8.
    let sum = |idx: u64| sums[(idx.wrapping_mul(7).wrapping_add(idx >> 12) % 8) as usize];
    match c {
        Collective::AllReduce => Some(sum(i)),
        Collective::Reduce => (r == 0).then(|| sum(i)),
        Collective::Broadcast => Some(input_value(0, i)),
        Collective::AllGather => Some(input_value(i / per, i % per)),
        Collective::ReduceScatter => Some(sum(r * per + i)),
        Collective::AllToAll => Some(input_value(i / per, r * per + i % per)),
        Collective::SendRecv => Some(input_value((r + n - 1) % n, i)),
    }
}

/// Encodes a small integer in `dt` (wrapping like the device arithmetic for integers).
pub(crate) fn encode(dt: DataType, v: i64, out: &mut [u8]) {
    match dt {
        DataType::Int8 | DataType::Uint8 => out[0] = v as u8,
        DataType::Int32 | DataType::Uint32 => out[..4].copy_from_slice(&(v as u32).to_le_bytes()),
        DataType::Int64 | DataType::Uint64 => out[..8].copy_from_slice(&(v as u64).to_le_bytes()),
        DataType::Float32 => out[..4].copy_from_slice(&(v as f32).to_le_bytes()),
        DataType::Float64 => out[..8].copy_from_slice(&(v as f64).to_le_bytes()),
        DataType::Bfloat16 => {
            let bits = ((v as f32).to_bits() >> 16) as u16;
            out[..2].copy_from_slice(&bits.to_le_bytes());
        }
        DataType::Float16 => out[..2].copy_from_slice(&f16_bits(v as f32).to_le_bytes()),
    }
}

/// IEEE half bits of a small integer-valued float (exact for |v| <= 2048).
fn f16_bits(v: f32) -> u16 {
    if v == 0.0 {
        return 0;
    }
    let bits = v.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32 - 127 + 15;
    let mant = ((bits >> 13) & 0x3ff) as u16;
    if exp <= 0 {
        return sign;
    }
    if exp >= 31 {
        return sign | 0x7c00;
    }
    sign | ((exp as u16) << 10) | mant
}

/// Fills `buf` with rank `r`'s inputs for `count` elements.
pub(crate) fn fill_inputs(dt: DataType, r: u64, count: u64, buf: &mut [u8]) {
    let e = dt.size() as usize;
    let count = (count as usize).min(buf.len() / e);
    let chunk = (count / 32).max(1 << 16);
    std::thread::scope(|s| {
        for (ci, part) in buf[..count * e].chunks_mut(chunk * e).enumerate() {
            s.spawn(move || {
                let base = (ci * chunk) as u64;
                for (j, cell) in part.chunks_exact_mut(e).enumerate() {
                    encode(dt, input_value(r, base + j as u64), cell);
                }
            });
        }
    });
}

/// Counts elements of `buf` (rank `r`'s output, `count` elements) that differ from the
/// expected values.
pub(crate) fn count_wrong(
    dt: DataType,
    c: Collective,
    n: u64,
    r: u64,
    count: u64,
    per: u64,
    buf: &[u8],
) -> u64 {
    let e = dt.size() as usize;
    let count = (count as usize).min(buf.len() / e);
    if matches!(c, Collective::Reduce) && r != 0 {
        return 0;
    }
    let threads = std::thread::available_parallelism().map_or(32, |t| t.get());
    let chunk = (count / threads.max(1)).max(1 << 16);
    let sums = rank_sums(n);
    // Every expected value is in 0..=7n: encode each once.
    let encoded: Vec<[u8; 8]> = (0..=7 * n as i64)
        .map(|v| {
            let mut b = [0u8; 8];
            encode(dt, v, &mut b);
            b
        })
        .collect();
    let encoded = &encoded;
    std::thread::scope(|s| {
        let handles: Vec<_> = buf[..count * e]
            .chunks(chunk * e)
            .enumerate()
            .map(|(ci, part)| {
                s.spawn(move || {
                    let base = (ci * chunk) as u64;
                    let mut wrong = 0u64;
                    for (j, cell) in part.chunks_exact(e).enumerate() {
                        let Some(v) = expected_with(c, n, r, base + j as u64, per, &sums) else {
                            continue;
                        };
                        match encoded.get(v as usize) {
                            Some(want) if cell == &want[..e] => {}
                            _ => wrong += 1,
                        }
                    }
                    wrong
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(u64::MAX / 64))
            .fold(0u64, u64::saturating_add)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::counts;

    fn simulate(c: Collective, n: u64, count_bytes: u64) -> Vec<Vec<i64>> {
        // A host model of each collective on the same inputs, to check expected_value.
        let (sc, rc, _) = counts(c, count_bytes, 4, n);
        let inputs: Vec<Vec<i64>> = (0..n)
            .map(|r| (0..sc).map(|i| input_value(r, i)).collect())
            .collect();
        (0..n)
            .map(|r| match c {
                Collective::AllReduce | Collective::Reduce => (0..rc)
                    .map(|i| inputs.iter().map(|v| v[i as usize]).sum())
                    .collect(),
                Collective::Broadcast => inputs[0].clone(),
                Collective::AllGather => inputs.iter().flatten().copied().collect(),
                Collective::ReduceScatter => (0..rc)
                    .map(|i| inputs.iter().map(|v| v[(r * rc + i) as usize]).sum())
                    .collect(),
                Collective::AllToAll => {
                    let per = sc / n;
                    (0..n)
                        .flat_map(|p| {
                            let src = &inputs[p as usize];
                            (0..per).map(move |k| src[(r * per + k) as usize])
                        })
                        .collect()
                }
                Collective::SendRecv => inputs[((r + n - 1) % n) as usize].clone(),
            })
            .collect()
    }

    #[test]
    fn expected_values_match_a_host_model_of_every_collective() {
        for c in Collective::ALL {
            for n in [1u64, 2, 3, 4, 8] {
                let out = simulate(c, n, 4 * 1000);
                let (sc, rc, _) = counts(c, 4 * 1000, 4, n);
                let per = match c {
                    Collective::AllGather => sc,
                    Collective::ReduceScatter => rc,
                    Collective::AllToAll => sc / n,
                    _ => rc,
                };
                for r in 0..n {
                    for i in 0..rc {
                        if let Some(v) = expected_value(c, n, r, i, per) {
                            assert_eq!(v, out[r as usize][i as usize], "{c:?} n={n} r={r} i={i}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_rank_sum_table_matches_summing_every_rank() {
        for n in [1u64, 2, 4, 8, 72] {
            let sums = rank_sums(n);
            for i in (0..100_000u64).chain([1 << 40, (1 << 12) - 1, (1 << 45) + 4097]) {
                let direct: i64 = (0..n).map(|q| input_value(q, i)).sum();
                let key = (i.wrapping_mul(7).wrapping_add(i >> 12) % 8) as usize;
                assert_eq!(sums[key], direct, "n={n} i={i}");
            }
        }
    }

    #[test]
    fn wrong_elements_are_counted_in_every_data_type() {
        use DataType::*;
        for dt in [
            Int8, Uint8, Int32, Uint32, Int64, Uint64, Float16, Float32, Float64, Bfloat16,
        ] {
            let n = 4;
            let count = 200_000u64;
            let e = dt.size() as usize;
            let mut buf = vec![0u8; count as usize * e];
            for i in 0..count {
                let v = expected_value(Collective::AllReduce, n, 0, i, count).unwrap_or(0);
                encode(dt, v, &mut buf[i as usize * e..]);
            }
            assert_eq!(
                count_wrong(dt, Collective::AllReduce, n, 0, count, count, &buf),
                0,
                "{dt:?}"
            );
            buf[5 * e] ^= 0x40;
            buf[(count as usize - 1) * e] ^= 0x01;
            assert_eq!(
                count_wrong(dt, Collective::AllReduce, n, 0, count, count, &buf),
                2,
                "{dt:?}"
            );
        }
    }

    #[test]
    fn half_encoding_of_small_integers_is_exact() {
        assert_eq!(f16_bits(1.0), 0x3c00);
        assert_eq!(f16_bits(2.0), 0x4000);
        assert_eq!(f16_bits(7.0), 0x4700);
        assert_eq!(f16_bits(-3.0), 0xc200);
        assert_eq!(f16_bits(0.0), 0);
    }
}
