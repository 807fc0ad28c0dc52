//! The deterministic byte pattern that copies are checked against, written and compared
//! on the host with several threads.

/// Deterministic 64-bit pattern word (splitmix64 of seed and index).
pub(crate) fn pattern_word(seed: u64, i: u64) -> u64 {
    let mut z = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(i.wrapping_mul(0xBF58_476D_1CE4_E5B9))
        .wrapping_add(0x94D0_49BB_1331_11EB);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Fills `buf` with the pattern of `seed`, using several threads.
pub(crate) fn fill_pattern(buf: &mut [u8], seed: u64) {
    let words = buf.len() / 8;
    let chunk_words = (words / 16).max(1 << 16);
    let (head, tail) = buf.split_at_mut(words * 8);
    std::thread::scope(|s| {
        for (ci, chunk) in head.chunks_mut(chunk_words * 8).enumerate() {
            s.spawn(move || {
                let base = (ci * chunk_words) as u64;
                for (j, w) in chunk.chunks_exact_mut(8).enumerate() {
                    w.copy_from_slice(&pattern_word(seed, base + j as u64).to_le_bytes());
                }
            });
        }
    });
    for (k, b) in tail.iter_mut().enumerate() {
        *b = (pattern_word(seed, words as u64 + k as u64) & 0xff) as u8;
    }
}

/// Counts 8-byte words of `buf` that differ from the pattern of `seed` (several threads).
pub(crate) fn count_pattern_mismatch(buf: &[u8], seed: u64) -> u64 {
    let words = buf.len() / 8;
    let chunk_words = (words / 16).max(1 << 16);
    let head = &buf[..words * 8];
    let mut bad: u64 = std::thread::scope(|s| {
        let handles: Vec<_> = head
            .chunks(chunk_words * 8)
            .enumerate()
            .map(|(ci, chunk)| {
                s.spawn(move || {
                    let base = (ci * chunk_words) as u64;
                    chunk
                        .chunks_exact(8)
                        .enumerate()
                        .filter(|(j, w)| {
                            let mut a = [0u8; 8];
                            a.copy_from_slice(w);
                            u64::from_le_bytes(a) != pattern_word(seed, base + *j as u64)
                        })
                        .count() as u64
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(u64::MAX / 64))
            .fold(0u64, u64::saturating_add)
    });
    for (k, b) in buf[words * 8..].iter().enumerate() {
        if *b != (pattern_word(seed, words as u64 + k as u64) & 0xff) as u8 {
            bad += 1;
        }
    }
    bad
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_check_finds_exactly_the_corrupted_words() {
        let mut buf = vec![0u8; 8 * 300_000 + 3];
        fill_pattern(&mut buf, 7);
        assert_eq!(count_pattern_mismatch(&buf, 7), 0);
        buf[8 * 12345] ^= 1;
        buf[8 * 299_999 + 7] ^= 0x80;
        let last = buf.len() - 1;
        buf[last] ^= 1;
        assert_eq!(count_pattern_mismatch(&buf, 7), 3);
        assert!(
            count_pattern_mismatch(&buf, 8) > 290_000,
            "another seed is another pattern"
        );
    }
}
