//! Seeded measurement noise: the same seed, node and stream always give the same numbers.

#![forbid(unsafe_code)]

use gpufabric_api::fnv1a;

/// splitmix64: a small, fast, well-mixed generator; plenty for measurement noise.
pub(crate) struct Rng(u64);

impl Rng {
    /// A generator for one stream of measurements of one node: the same (seed, node,
    /// stream) always gives the same numbers, and streams do not depend on each other (so
    /// disabling one phase does not change the numbers of another).
    pub(crate) fn new(seed: u64, node: &str, stream: &str) -> Rng {
        let mut r = Rng(seed
            ^ fnv1a(node.as_bytes()).rotate_left(21)
            ^ fnv1a(stream.as_bytes()).rotate_left(42));
        r.next_u64();
        r
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in (0, 1).
    pub(crate) fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Standard normal, cut at 3 sigma.
    pub(crate) fn normal(&mut self) -> f64 {
        let (u1, u2) = (self.uniform(), self.uniform());
        ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()).clamp(-3.0, 3.0)
    }

    /// A multiplicative factor around 1 with relative standard deviation `sigma`.
    pub(crate) fn jitter(&mut self, sigma: f64) -> f64 {
        1.0 + sigma * self.normal()
    }
}
