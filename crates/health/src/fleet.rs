//! Robust statistics: the median, the median absolute deviation, and the outlier rule
//! shared by fleet comparisons (a node against comparable nodes) and node comparisons (a
//! GPU pair against the node's other pairs).
//!
//! A value is an outlier when, in the worse direction only, both hold:
//! - its robust z-score `0.6745 * (x - median) / MAD` is beyond the score limit, and
//! - it is at least `min_gap` (relative) away from the median.
//!
//! The second condition keeps a tight population (MAD near zero) from turning noise into
//! findings; the first keeps a loose population from flagging its normal spread.

/// Scale of the MAD to a standard deviation for normal data (Iglewicz and Hoaglin).
pub const MAD_SCALE: f64 = 0.6745;

/// Which direction of a metric is worse.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Better {
    /// Higher is better (bandwidth, efficiency): only values below the median can be outliers.
    Higher,
    /// Lower is better (latency, time): only values above the median can be outliers.
    Lower,
}

/// The outlier rule's limits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rule {
    /// Robust z-score beyond which a value is an outlier.
    pub score: f64,
    /// Smallest relative gap from the median (0.1 = 10%).
    pub min_gap: f64,
    /// Fewest values for a comparison at all.
    pub min_count: usize,
}

/// Median of finite values; `None` when there are none.
pub fn median(values: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// Median absolute deviation of finite values around `center`.
pub fn mad(values: &[f64], center: f64) -> f64 {
    let deviations: Vec<f64> = values
        .iter()
        .filter(|x| x.is_finite())
        .map(|x| (x - center).abs())
        .collect();
    median(&deviations).unwrap_or(0.0)
}

/// Robust z-score of `x`; infinite (with the sign of `x - median`) when the MAD is zero and
/// `x` differs from the median, zero when it equals it.
pub fn robust_score(x: f64, median: f64, mad: f64) -> f64 {
    let diff = x - median;
    if mad > 0.0 {
        MAD_SCALE * diff / mad
    } else if diff == 0.0 {
        0.0
    } else {
        diff.signum() * f64::INFINITY
    }
}

/// How far one value sits from its population.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Outlier {
    pub value: f64,
    pub median: f64,
    pub mad: f64,
    /// Robust z-score (signed).
    pub score: f64,
    /// (value - median) / median (signed).
    pub gap: f64,
    /// How many values the population had.
    pub count: usize,
}

/// Whether `x` is an outlier of a population with this median and MAD, in the worse direction.
pub fn is_outlier(x: f64, median: f64, mad: f64, better: Better, rule: &Rule) -> bool {
    if !x.is_finite() || !median.is_finite() || median <= 0.0 {
        return false;
    }
    let score = robust_score(x, median, mad);
    let gap = (x - median) / median;
    match better {
        Better::Higher => score < -rule.score && gap <= -rule.min_gap,
        Better::Lower => score > rule.score && gap >= rule.min_gap,
    }
}

/// The outliers of a population of keyed values, worse direction only. Non-finite values
/// are ignored; with fewer than `rule.min_count` finite values nothing is an outlier.
pub fn outliers<K: Clone>(values: &[(K, f64)], better: Better, rule: &Rule) -> Vec<(K, Outlier)> {
    let finite: Vec<f64> = values
        .iter()
        .map(|(_, v)| *v)
        .filter(|v| v.is_finite())
        .collect();
    if finite.len() < rule.min_count.max(1) {
        return Vec::new();
    }
    let Some(m) = median(&finite) else {
        return Vec::new();
    };
    let d = mad(&finite, m);
    values
        .iter()
        .filter(|(_, x)| is_outlier(*x, m, d, better, rule))
        .map(|(k, x)| {
            (
                k.clone(),
                Outlier {
                    value: *x,
                    median: m,
                    mad: d,
                    score: robust_score(*x, m, d),
                    gap: (*x - m) / m,
                    count: finite.len(),
                },
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULE: Rule = Rule {
        score: 3.5,
        min_gap: 0.10,
        min_count: 4,
    };

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[f64::NAN, 5.0]), Some(5.0));
    }

    #[test]
    fn mad_is_median_of_absolute_deviations() {
        // deviations from 3: 2,1,0,1,97 -> median 1
        assert_eq!(mad(&[1.0, 2.0, 3.0, 4.0, 100.0], 3.0), 1.0);
    }

    #[test]
    fn tight_fleet_with_zero_mad_does_not_flag_noise_below_min_gap() {
        let v: Vec<(usize, f64)> = vec![(0, 400.0), (1, 400.0), (2, 400.0), (3, 400.0), (4, 390.0)];
        // MAD 0 makes the score infinite, but 2.5% is below the 10% gap.
        assert!(outliers(&v, Better::Higher, &RULE).is_empty());
    }

    #[test]
    fn tight_fleet_flags_a_value_beyond_the_min_gap() {
        let v: Vec<(usize, f64)> = vec![(0, 400.0), (1, 400.0), (2, 400.0), (3, 400.0), (4, 300.0)];
        let o = outliers(&v, Better::Higher, &RULE);
        assert_eq!(o.len(), 1);
        assert_eq!(o[0].0, 4);
        assert!((o[0].1.gap + 0.25).abs() < 1e-9);
    }

    #[test]
    fn only_the_worse_direction_is_an_outlier() {
        let v: Vec<(usize, f64)> = vec![(0, 400.0), (1, 401.0), (2, 399.0), (3, 400.0), (4, 600.0)];
        assert!(outliers(&v, Better::Higher, &RULE).is_empty());
        let o = outliers(&v, Better::Lower, &RULE);
        assert_eq!(o.iter().map(|(k, _)| *k).collect::<Vec<_>>(), vec![4]);
    }

    #[test]
    fn loose_population_does_not_flag_its_normal_spread() {
        // Spread +-30%: a value 20% below the median is within 3.5 scaled MADs.
        let v: Vec<(usize, f64)> = [70.0, 130.0, 80.0, 120.0, 100.0, 90.0, 110.0, 80.0]
            .iter()
            .copied()
            .enumerate()
            .collect();
        assert!(outliers(&v, Better::Higher, &RULE).is_empty());
    }

    #[test]
    fn too_few_values_never_flag() {
        let v: Vec<(usize, f64)> = vec![(0, 400.0), (1, 400.0), (2, 100.0)];
        assert!(outliers(&v, Better::Higher, &RULE).is_empty());
    }

    #[test]
    fn robust_score_scales_by_mad() {
        assert!((robust_score(10.0, 0.0, 0.6745) - 10.0).abs() < 1e-9);
        assert_eq!(robust_score(1.0, 1.0, 0.0), 0.0);
        assert_eq!(robust_score(0.0, 1.0, 0.0), f64::NEG_INFINITY);
    }
}
