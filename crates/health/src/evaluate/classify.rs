//! The slow cells of a node's pair copies and the expectation each missed: against the
//! node's other cells, its fastest cell, or a floor. Both the pair rule (`gpu_pairs.rs`)
//! and the direction rule (`direction.rs`) classify with it.

use crate::fleet::{self, Better, Rule};
use gpufabric_api::findings::ExpectationSource;
use std::collections::BTreeMap;

/// The expectation a slow pair missed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Missed {
    /// A floor: the spec's threshold or the profile's.
    Floor(f64, ExpectationSource),
    /// The node's median pair.
    NodeMedian(f64),
    /// The node's fastest pair.
    NodeFastest(f64),
}

impl Missed {
    /// What a group of slow copies missed together: a floor one of them missed, else the
    /// node's fastest pair when that is what they missed, else `median` (the median of the
    /// node's copies outside the group).
    pub(super) fn of_group(missed: &[Missed], median: f64) -> Missed {
        missed
            .iter()
            .find(|m| matches!(m, Missed::Floor(..)))
            .or_else(|| missed.iter().find(|m| matches!(m, Missed::NodeFastest(_))))
            .copied()
            .unwrap_or(Missed::NodeMedian(median))
    }

    pub(super) fn expectation(self) -> (f64, ExpectationSource) {
        match self {
            Missed::Floor(v, s) => (v, s),
            Missed::NodeMedian(v) | Missed::NodeFastest(v) => (v, ExpectationSource::Node),
        }
    }
}

/// The node's fastest pair and the bar below which a pair is slow against it: on a board
/// whose pairs are all alike, no fault makes a pair faster, so the fastest pair is what
/// each should reach, less the fleet rule's minimum gap and its score in robust standard
/// deviations of the node's pairs (the fastest pair is itself the high end of the noise).
fn fastest_reference(values: &[f64], mad: f64, rule: &Rule) -> Option<(f64, f64)> {
    let fastest = values
        .iter()
        .copied()
        .filter(|v| v.is_finite())
        .reduce(f64::max)?;
    let bar = fastest * (1.0 - rule.min_gap) - rule.score * 1.4826 * mad;
    (fastest > 0.0 && bar > 0.0).then_some((fastest, bar))
}

/// Each slow cell of `values` with the expectation it missed: against the node's other
/// cells first (the sharpest evidence for one link) when `in_node` (a board whose pairs are
/// all alike, no explicit threshold) and there are enough of them, then against the node's
/// fastest cell, then the floor (an explicit threshold alone when the spec sets one).
pub(super) fn classify<K: Copy + Ord>(
    values: &BTreeMap<K, f64>,
    floor: Option<(f64, ExpectationSource)>,
    in_node: bool,
    rule: &Rule,
) -> BTreeMap<K, Missed> {
    let all: Vec<f64> = values.values().copied().collect();
    let mut slow = BTreeMap::new();
    let Some(node_median) = fleet::median(&all) else {
        return slow;
    };
    let node_mad = fleet::mad(&all, node_median);
    let fastest = fastest_reference(&all, node_mad, rule);
    let judge_in_node = in_node && all.len() >= rule.min_count;
    // The two directions between two GPUs leave no spread to judge by, but on a board whose
    // pairs are all alike both run at the same speed (2 x H200: within 0.1%), so one far
    // below the other is slow (a one-way load took 0 -> 1 to 263 against 390 GB/s).
    let two_directions = (in_node && all.len() == 2 && !judge_in_node)
        .then(|| all.iter().copied().fold(f64::NAN, f64::max))
        .filter(|f| f.is_finite() && *f > 0.0);
    for (cell, v) in values {
        if judge_in_node && fleet::is_outlier(*v, node_median, node_mad, Better::Higher, rule) {
            slow.insert(*cell, Missed::NodeMedian(node_median));
        } else if let Some((f, _)) = fastest.filter(|(_, bar)| judge_in_node && *v < *bar) {
            // Most cells slow (the ports of two GPUs, say): the median is slow too, but on
            // a board whose pairs are all alike each should reach the fastest.
            slow.insert(*cell, Missed::NodeFastest(f));
        } else if let Some(f) = two_directions.filter(|f| *v < f * (1.0 - 2.0 * rule.min_gap)) {
            slow.insert(*cell, Missed::NodeFastest(f));
        } else if let Some((floor, source)) = floor
            && *v < floor
        {
            slow.insert(*cell, Missed::Floor(floor, source));
        }
    }
    slow
}
