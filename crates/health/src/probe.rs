//! The multi-node DDP probe of a run judged against the test's baseline: a probe far below
//! what the test's probes reached at the same node count is a finding on the run, not on a
//! node (the probe's nodes passed their own checks and pairs; each one's own tests judge it).
//!
//! # Rule
//! For each node count of 2 or more that the probe measured and that the baseline expects
//! (`probe.N`, resting on at least [`gpufabric_api::baseline::MIN_NODES`] nodes, among the
//! keys of the run's suite and NCCL settings): a scaling efficiency far below it (rule 3 of
//! [`crate::evaluate::baseline`], with the fleet's minimum relative gap) is a
//! [`ProbeShortfall`]. Without a baseline for the count, the probe is not judged.

use crate::evaluate::baseline::{Against, basis_words, far_below};
use gpufabric_api::baseline::Series;

/// One node count of the probe, far below the baseline.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeShortfall {
    pub nodes: u32,
    /// Its scaling efficiency (ratio).
    pub measured: f64,
    /// The baseline's median at that count (ratio).
    pub expected: f64,
    /// One sentence a person can act on.
    pub message: String,
}

/// The node counts of a probe (`(nodes, scaling efficiency)` over `probed`, the probe's
/// nodes) that fall far below the baseline, by the rule above.
pub fn shortfalls(
    points: &[(u32, f64)],
    probed: &[String],
    against: &Against<'_>,
    min_gap: f64,
) -> Vec<ProbeShortfall> {
    points
        .iter()
        .filter(|(n, e)| *n >= 2 && e.is_finite())
        .filter_map(|&(nodes, measured)| {
            let e = against.across_keys(Series::Probe(nodes))?;
            if !far_below(measured, &e, min_gap) {
                return None;
            }
            let over: Vec<&str> = probed
                .iter()
                .take(nodes as usize)
                .map(String::as_str)
                .collect();
            Some(ProbeShortfall {
                nodes,
                measured,
                expected: e.median,
                message: format!(
                    "the multi-node probe over {nodes} nodes ({}) ran at {:.0}% scaling efficiency, {}, the probes of {}: the fabric between them is slow though each node passed its own tests; look at their node pairs and the switches between them",
                    over.join(", "),
                    measured * 100.0,
                    crate::evaluate::how_far(measured, e.median),
                    basis_words(&e, "ratio"),
                ),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufabric_api::baseline::testing::one_series;
    use gpufabric_api::baseline::{FleetBaseline, Spread};

    fn baseline_of(efficiency: f64, nodes: u32) -> FleetBaseline {
        let spread = Spread {
            median: efficiency,
            p10: efficiency - 0.02,
            p90: efficiency + 0.01,
            n: nodes,
        };
        one_series(
            &Series::Probe(4).to_string(),
            spread,
            &[("r1", 1_000), ("r2", 2_000)],
        )
    }

    fn against(b: &FleetBaseline) -> Against<'_> {
        Against {
            baseline: b,
            suite: "s",
            settings: "n",
            now: 3_000,
        }
    }

    fn probed() -> Vec<String> {
        (0..4).map(|i| format!("n{i}")).collect()
    }

    #[test]
    fn a_probe_far_below_the_baseline_at_its_node_count_is_a_shortfall_of_the_run() {
        let b = baseline_of(0.92, 4);
        let s = shortfalls(
            &[(1, 1.0), (2, 0.95), (4, 0.044)],
            &probed(),
            &against(&b),
            0.1,
        );
        assert_eq!(s.len(), 1, "{s:#?}");
        assert_eq!((s[0].nodes, s[0].expected), (4, 0.92));
        assert!(
            s[0].message.starts_with(
                "the multi-node probe over 4 nodes (n0, n1, n2, n3) ran at 4% scaling efficiency, "
            ),
            "{}",
            s[0].message
        );
        assert!(s[0].message.contains("the 4 nodes of this test run alike"));
    }

    #[test]
    fn a_probe_near_the_baseline_or_without_one_is_not_judged() {
        let b = baseline_of(0.92, 4);
        assert!(shortfalls(&[(4, 0.88)], &probed(), &against(&b), 0.1).is_empty());
        // No baseline at 2 nodes; a baseline resting on 2 nodes is none.
        assert!(shortfalls(&[(2, 0.1)], &probed(), &against(&b), 0.1).is_empty());
        let thin = baseline_of(0.92, 2);
        assert!(shortfalls(&[(4, 0.1)], &probed(), &against(&thin), 0.1).is_empty());
        // Another suite's baseline says nothing of this one.
        let other = Against {
            suite: "other",
            ..against(&b)
        };
        assert!(shortfalls(&[(4, 0.1)], &probed(), &other, 0.1).is_empty());
    }
}
