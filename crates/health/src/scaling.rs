//! The multi-node NCCL sweep's curves judged: where adding nodes starts to cost more than the
//! fabric should (a knee), and which topology block's curve falls below the others'.
//!
//! # Rules
//! busbw is nccl-tests' bus bandwidth, which is made independent of the rank count: on a
//! fabric that carries every node at its links' rate a collective's curve over 2, 4, 8, ...
//! nodes is flat. So:
//! 1. **Knee.** The reference of a curve is its busbw at its smallest multi-node count. Going
//!    from one node count to the next may cost up to `min_gap` (the fleet's minimum relative
//!    gap) of the previous count's busbw; the first count that costs more, and is also more
//!    than `min_gap` below the reference, is the knee. One knee per curve: after it the curve
//!    is judged by what it lost already. A count the curve has no value for (NaN, 0) is
//!    skipped, never a knee.
//! 2. **Slow block.** Blocks are the nodes that share one value of a topology label (an
//!    NVLink domain, a rack, a leaf). At each node count at least `min_count` blocks
//!    measured, a block whose busbw is a fleet outlier below the blocks' median (the
//!    [`crate::fleet`] rule: robust score and minimum gap) is slow from that count on. A
//!    slow block is a finding on the block, never on its nodes: each node's own checks and
//!    pairs judge it.
//!
//! 3. **Below the baseline.** For each collective and node count of 2 or more that the group's
//!    sweep (the one across blocks, with a topology label) measured and that the test's
//!    baseline expects (`sweep.COLLECTIVE.N`, resting on at least
//!    [`gpufabric_api::baseline::MIN_NODES`] nodes, among the keys of the run's suite and NCCL
//!    settings): a busbw far below it (rule 3 of [`crate::evaluate::baseline`], with the
//!    fleet's minimum relative gap) is a shortfall of the run, never of a node. Without a
//!    baseline for the count, the curve is judged by rules 1 and 2 alone.
//!
//! The expectation from the links the nodes report is [`crate::links`]'.

use crate::evaluate::baseline::{Against, basis_words, far_below};
use crate::fleet::{self, Better, Rule};
use gpufabric_api::baseline::Series;
use gpufabric_api::nccl_nodes::{NcclNodesShortfall, NcclNodesSlowBlock};
use gpufabric_api::suite::Collective;
use std::collections::BTreeMap;

/// One node count of a collective's curve.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CurvePoint {
    pub nodes: u32,
    /// nccl-tests' bus bandwidth at the sweep's large sizes, GB/s.
    pub busbw: f64,
}

/// One collective's curve over node counts, inside one block (`block` names the label's
/// value) or across blocks / over the whole group (`block` None).
#[derive(Debug, Clone, PartialEq)]
pub struct Curve {
    pub block: Option<String>,
    pub collective: Collective,
    pub points: Vec<CurvePoint>,
}

/// Where a curve starts to lose more than the fabric should.
#[derive(Debug, Clone, PartialEq)]
pub struct Knee {
    pub block: Option<String>,
    pub collective: Collective,
    /// The last node count before the knee, and the first in it.
    pub from_nodes: u32,
    pub at_nodes: u32,
    /// busbw at `at_nodes`, at `from_nodes` and at the curve's smallest multi-node count.
    pub busbw: f64,
    pub previous: f64,
    pub reference: f64,
    pub reference_nodes: u32,
    /// One sentence a person can act on.
    pub message: String,
}

fn usable(p: &CurvePoint) -> bool {
    p.nodes >= 2 && p.busbw.is_finite() && p.busbw > 0.0
}

fn where_(block: &Option<String>) -> String {
    match block {
        Some(b) => format!(" in block {b}"),
        None => String::new(),
    }
}

/// The knee of one curve by rule 1, if it has one.
pub fn knee(curve: &Curve, min_gap: f64) -> Option<Knee> {
    let mut points: Vec<CurvePoint> = curve.points.iter().copied().filter(usable).collect();
    points.sort_by_key(|p| p.nodes);
    let first = *points.first()?;
    let gap = min_gap.max(0.0);
    points.windows(2).find_map(|w| {
        let (prev, at) = (w[0], w[1]);
        let step_loss = 1.0 - at.busbw / prev.busbw;
        let total_loss = 1.0 - at.busbw / first.busbw;
        if step_loss <= gap || total_loss <= gap {
            return None;
        }
        let c = curve.collective.nccl_tests_name();
        Some(Knee {
            block: curve.block.clone(),
            collective: curve.collective,
            from_nodes: prev.nodes,
            at_nodes: at.nodes,
            busbw: at.busbw,
            previous: prev.busbw,
            reference: first.busbw,
            reference_nodes: first.nodes,
            message: format!(
                "{c}{} loses {:.0}% of its bus bandwidth from {} to {} nodes ({:.1} -> {:.1} GB/s; {:.1} GB/s at {} nodes): more than the {:.0}% a step may cost on a fabric that carries every node at its links' rate; look at the switches above these nodes (oversubscription, a degraded uplink, adaptive routing off)",
                where_(&curve.block),
                step_loss * 100.0,
                prev.nodes,
                at.nodes,
                prev.busbw,
                at.busbw,
                first.busbw,
                first.nodes,
                gap * 100.0,
            ),
        })
    })
}

/// The blocks (curves with `block` set, all of one collective or several) whose busbw is an
/// outlier below the other blocks' at some node count, by rule 2; `key` is the label the
/// blocks are values of. One entry per block and collective: the first count where it is slow.
pub fn slow_blocks(key: &str, curves: &[Curve], rule: &Rule) -> Vec<NcclNodesSlowBlock> {
    // (collective, nodes) -> [(block, busbw)]
    let mut at: BTreeMap<(Collective, u32), Vec<(&str, f64)>> = BTreeMap::new();
    for c in curves {
        let Some(block) = c.block.as_deref() else {
            continue;
        };
        for p in c.points.iter().filter(|p| usable(p)) {
            at.entry((c.collective, p.nodes))
                .or_default()
                .push((block, p.busbw));
        }
    }
    let rule = Rule {
        min_count: rule.min_count.max(3),
        ..*rule
    };
    let mut out: BTreeMap<(Collective, &str), NcclNodesSlowBlock> = BTreeMap::new();
    for ((collective, nodes), values) in &at {
        for (block, o) in fleet::outliers(values, Better::Higher, &rule) {
            out.entry((*collective, block)).or_insert_with(|| NcclNodesSlowBlock {
                key: key.to_string(),
                value: block.to_string(),
                collective: *collective,
                nodes: *nodes,
                busbw: o.value,
                median: o.median,
                blocks: u32::try_from(o.count).unwrap_or(u32::MAX),
                message: format!(
                    "{} over {nodes} nodes of block {key}={block} reached {:.1} GB/s, {:.0}% below the median of {} blocks ({:.1} GB/s): the fabric inside this block is slow though its nodes are judged by their own checks; look at its switch and its uplinks",
                    collective.nccl_tests_name(),
                    o.value,
                    -o.gap * 100.0,
                    o.count,
                    o.median,
                ),
            });
        }
    }
    out.into_values().collect()
}

/// The points of `curves` (the group's sweep over `swept`, its nodes by rank) far below the
/// baseline, by rule 3.
pub fn below_baseline(
    curves: &[Curve],
    swept: &[String],
    against: &Against<'_>,
    min_gap: f64,
) -> Vec<NcclNodesShortfall> {
    curves
        .iter()
        .flat_map(|c| c.points.iter().map(move |p| (c.collective, p)))
        .filter(|(_, p)| usable(p))
        .filter_map(|(collective, p)| {
            let e = against.across_keys(Series::Sweep(collective, p.nodes))?;
            if !far_below(p.busbw, &e, min_gap) {
                return None;
            }
            let over: Vec<&str> = swept
                .iter()
                .take(p.nodes as usize)
                .map(String::as_str)
                .collect();
            Some(NcclNodesShortfall {
                collective,
                nodes: p.nodes,
                busbw: p.busbw,
                expected: e.median,
                message: format!(
                    "{} over {} nodes ({}) reached {:.1} GB/s, {}, the sweeps of {}: the fabric between them is slower than it was though each node passed its own tests; look at their node pairs and the switches between them",
                    collective.nccl_tests_name(),
                    p.nodes,
                    over.join(", "),
                    p.busbw,
                    crate::evaluate::how_far(p.busbw, e.median),
                    basis_words(&e, "GB/s"),
                ),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULE: Rule = Rule {
        score: 3.5,
        min_gap: 0.10,
        min_count: 3,
    };

    fn curve(block: Option<&str>, points: &[(u32, f64)]) -> Curve {
        Curve {
            block: block.map(str::to_string),
            collective: Collective::AllReduce,
            points: points
                .iter()
                .map(|&(nodes, busbw)| CurvePoint { nodes, busbw })
                .collect(),
        }
    }

    #[test]
    fn a_flat_curve_with_small_losses_per_doubling_has_no_knee() {
        // 5% per doubling: 40 GB/s at 2 nodes down to 32.6 at 32, never more than 10% a step.
        let c = curve(
            None,
            &[(2, 40.0), (4, 38.0), (8, 36.1), (16, 34.3), (32, 32.6)],
        );
        assert_eq!(knee(&c, 0.10), None);
    }

    #[test]
    fn the_knee_is_the_first_count_that_costs_more_than_the_gap() {
        let c = curve(
            None,
            &[(2, 40.0), (4, 39.0), (8, 38.5), (16, 24.0), (32, 12.0)],
        );
        let k = knee(&c, 0.10).expect("a knee");
        assert_eq!((k.from_nodes, k.at_nodes), (8, 16));
        assert_eq!((k.reference_nodes, k.reference), (2, 40.0));
        assert!(
            k.message
                .starts_with("all_reduce loses 38% of its bus bandwidth from 8 to 16 nodes"),
            "{}",
            k.message
        );
    }

    #[test]
    fn a_dip_that_recovers_its_reference_is_no_knee() {
        // 4 nodes ran faster than 2 (a better ring); 8 lost 12% of 4's but not of 2's.
        let c = curve(None, &[(2, 36.0), (4, 42.0), (8, 37.0)]);
        assert_eq!(knee(&c, 0.10), None);
    }

    #[test]
    fn points_without_a_value_and_one_node_are_never_a_knee() {
        let c = curve(
            None,
            &[(1, 300.0), (2, 40.0), (4, f64::NAN), (8, 0.0), (16, 39.0)],
        );
        assert_eq!(knee(&c, 0.10), None);
        assert_eq!(knee(&curve(None, &[(1, 300.0), (2, 40.0)]), 0.10), None);
        assert_eq!(knee(&curve(None, &[]), 0.10), None);
    }

    #[test]
    fn the_slow_block_is_named_from_the_count_where_it_starts_and_the_others_not() {
        let mut curves: Vec<Curve> = ["rack-a", "rack-b", "rack-c", "rack-d"]
            .iter()
            .map(|b| curve(Some(b), &[(2, 40.0), (4, 39.5), (8, 39.0)]))
            .collect();
        curves[2] = curve(Some("rack-c"), &[(2, 39.8), (4, 30.0), (8, 21.0)]);
        curves.push(curve(None, &[(2, 40.0), (4, 38.0)]));
        let slow = slow_blocks("example.com/rack", &curves, &RULE);
        assert_eq!(slow.len(), 1, "{slow:#?}");
        assert_eq!(slow[0].value, "rack-c");
        assert_eq!(slow[0].nodes, 4);
        assert_eq!(slow[0].blocks, 4);
        assert!(
            slow[0]
                .message
                .starts_with("all_reduce over 4 nodes of block example.com/rack=rack-c reached 30.0 GB/s, 24% below the median of 4 blocks"),
            "{}",
            slow[0].message
        );
    }

    #[test]
    fn two_blocks_are_never_compared() {
        let curves = vec![
            curve(Some("a"), &[(2, 40.0), (4, 40.0)]),
            curve(Some("b"), &[(2, 10.0), (4, 10.0)]),
        ];
        assert!(slow_blocks("k", &curves, &RULE).is_empty());
    }

    #[test]
    fn blocks_within_their_normal_spread_are_not_slow() {
        let curves: Vec<Curve> = [40.0, 37.0, 43.0, 38.5, 41.0]
            .iter()
            .enumerate()
            .map(|(i, v)| curve(Some(&format!("b{i}")), &[(2, *v), (4, v * 0.97)]))
            .collect();
        assert!(slow_blocks("k", &curves, &RULE).is_empty());
    }

    fn baseline_of(busbw: f64, nodes: u32) -> gpufabric_api::baseline::FleetBaseline {
        let spread = gpufabric_api::baseline::Spread {
            median: busbw,
            p10: busbw * 0.97,
            p90: busbw * 1.01,
            n: nodes,
        };
        gpufabric_api::baseline::testing::one_series(
            &Series::Sweep(Collective::AllReduce, 4).to_string(),
            spread,
            &[("r1", 1_000), ("r2", 2_000)],
        )
    }

    fn swept() -> Vec<String> {
        (0..4).map(|i| format!("n{i}")).collect()
    }

    #[test]
    fn a_sweep_far_below_its_baseline_at_a_node_count_is_a_shortfall_of_the_run() {
        let b = baseline_of(40.0, 4);
        let against = Against {
            baseline: &b,
            suite: "s",
            settings: "n",
            now: 3_000,
        };
        let c = curve(None, &[(2, 41.0), (4, 20.0)]);
        let s = below_baseline(&[c], &swept(), &against, 0.1);
        assert_eq!(s.len(), 1, "{s:#?}");
        assert_eq!((s[0].nodes, s[0].busbw, s[0].expected), (4, 20.0, 40.0));
        assert!(
            s[0].message.starts_with(
                "all_reduce over 4 nodes (n0, n1, n2, n3) reached 20.0 GB/s, 50% below"
            ),
            "{}",
            s[0].message
        );
        // Within the gap, or at a count the baseline has no value for: nothing.
        let near = curve(None, &[(2, 10.0), (4, 37.5)]);
        assert!(below_baseline(&[near], &swept(), &against, 0.1).is_empty());
    }

    #[test]
    fn a_baseline_on_too_few_nodes_or_of_other_runs_judges_nothing() {
        let c = curve(None, &[(4, 5.0)]);
        let thin = baseline_of(40.0, 2);
        let against = Against {
            baseline: &thin,
            suite: "s",
            settings: "n",
            now: 3_000,
        };
        assert!(below_baseline(std::slice::from_ref(&c), &swept(), &against, 0.1).is_empty());
        let b = baseline_of(40.0, 4);
        let other_suite = Against {
            baseline: &b,
            suite: "other",
            settings: "n",
            now: 3_000,
        };
        assert!(below_baseline(&[c], &swept(), &other_suite, 0.1).is_empty());
    }
}
