//! The one-way copy matrix read by direction: on a switched board a GPU sends through one
//! set of ports and receives through another, so a GPU slow to send to every peer, or slow
//! to receive from every peer, is named as that GPU and side, not as the pairs it touches.

use super::classify::{Missed, classify};
use super::{how_far, source_words, tenths_below_100};
use crate::fleet::{self, Rule};
use gpufabric_api::findings::{ExpectationSource, Finding, FindingKind, Metric, Severity, Subject};
use gpufabric_api::result::CompactResult;
use std::collections::{BTreeMap, BTreeSet};

/// A side of a GPU's links.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Side {
    Send,
    Receive,
}

/// A GPU side whose every measured cell is slow, with those cells.
type Candidate = ((u32, Side), BTreeSet<(u32, u32)>);

/// Candidate sides tried exhaustively for the smallest explanation; past this many the
/// choice is greedy (more than 16 fully slow sides is a node-wide fault anyway).
const EXHAUSTIVE_SIDES: usize = 16;

/// The smallest set of GPU sides that explains the slow cells of an ordered matrix
/// (`(src, dst)`): a side is a candidate only when every measured cell through it is slow
/// (at least two of them), and among the sets that explain as many slow cells as all
/// candidates together, the one with the fewest sides wins (ties: the first in GPU order,
/// sending before receiving). Nothing is named on fewer than three GPUs (one peer cannot
/// tell a GPU from a pair), or when every cell is slow (the node's fault, not a GPU's).
pub(super) fn slow_sides(
    g: u32,
    measured: &BTreeSet<(u32, u32)>,
    slow: &BTreeSet<(u32, u32)>,
) -> Vec<(u32, Side)> {
    if g < 3 || slow.is_empty() || measured.iter().all(|c| slow.contains(c)) {
        return Vec::new();
    }
    let cells = |k: u32, side: Side| -> Vec<(u32, u32)> {
        measured
            .iter()
            .filter(|(a, b)| match side {
                Side::Send => *a == k,
                Side::Receive => *b == k,
            })
            .copied()
            .collect()
    };
    let candidates: Vec<Candidate> = (0..g)
        .flat_map(|k| [(k, Side::Send), (k, Side::Receive)])
        .filter_map(|(k, side)| {
            let mine = cells(k, side);
            (mine.len() >= 2 && mine.iter().all(|c| slow.contains(c)))
                .then(|| ((k, side), mine.into_iter().collect()))
        })
        .collect();
    if candidates.is_empty() {
        return Vec::new();
    }
    let target: BTreeSet<(u32, u32)> = candidates.iter().flat_map(|(_, c)| c.clone()).collect();
    let covers = |pick: &[usize]| -> bool {
        let got: BTreeSet<(u32, u32)> = pick
            .iter()
            .flat_map(|i| candidates[*i].1.iter().copied())
            .collect();
        got == target
    };
    let chosen: Vec<usize> = if candidates.len() <= EXHAUSTIVE_SIDES {
        let n = candidates.len();
        (1u32..(1 << n))
            .map(|mask| (0..n).filter(|i| mask & (1 << i) != 0).collect::<Vec<_>>())
            .filter(|pick| covers(pick))
            .min_by_key(|pick| (pick.len(), pick.clone()))
            .unwrap_or_default()
    } else {
        let mut left = target.clone();
        let mut pick = Vec::new();
        while !left.is_empty() {
            let best = (0..candidates.len())
                .max_by_key(|i| {
                    (
                        candidates[*i].1.intersection(&left).count(),
                        std::cmp::Reverse(*i),
                    )
                })
                .filter(|i| candidates[*i].1.intersection(&left).count() > 0);
            let Some(i) = best else { break };
            left.retain(|c| !candidates[i].1.contains(c));
            pick.push(i);
        }
        pick
    };
    let mut sides: Vec<(u32, Side)> = chosen.iter().map(|i| candidates[*i].0).collect();
    sides.sort();
    sides
}

/// The ordered one-way matrix of a node, `(src, dst)` to GB/s, cells above 0 only.
pub(super) fn ordered_pairs(r: &CompactResult) -> BTreeMap<(u32, u32), f64> {
    let n = r.gpus as usize;
    let mut values = BTreeMap::new();
    if r.copy_uni.len() != n * n {
        return values;
    }
    for a in 0..r.gpus {
        for b in 0..r.gpus {
            if a != b
                && let Some(v) = r.pair_uni(a, b).filter(|v| *v > 0.0)
            {
                values.insert((a, b), v);
            }
        }
    }
    values
}

/// Names GPUs whose sending or receiving side makes every copy through it slow, and
/// returns the GPUs named (their pairs are not blamed again).
pub(super) fn check_sides(
    node: &str,
    r: &CompactResult,
    floor: Option<(f64, ExpectationSource)>,
    judge_in_node: bool,
    rule: &Rule,
    out: &mut Vec<Finding>,
) -> BTreeSet<u32> {
    let values = ordered_pairs(r);
    let slow = classify(&values, floor, judge_in_node, rule);
    let measured: BTreeSet<(u32, u32)> = values.keys().copied().collect();
    let bad: BTreeSet<(u32, u32)> = slow.keys().copied().collect();
    let sides = slow_sides(r.gpus, &measured, &bad);
    if r.gpus == 2 && bad.len() == 1 && measured.len() == 2 {
        two_gpus_one_direction(node, &values, &slow, out);
    }
    let mut named = BTreeSet::new();
    for k in sides.iter().map(|(k, _)| *k).collect::<BTreeSet<u32>>() {
        let send = sides.contains(&(k, Side::Send));
        let recv = sides.contains(&(k, Side::Receive));
        let through = |c: &(u32, u32)| (send && c.0 == k) || (recv && c.1 == k);
        let mine: Vec<f64> = values
            .iter()
            .filter(|(c, _)| through(c))
            .map(|(_, v)| *v)
            .collect();
        let others: Vec<f64> = values
            .iter()
            .filter(|(c, _)| !bad.contains(*c))
            .map(|(_, v)| *v)
            .collect();
        let measured_gbps = fleet::median(&mine).unwrap_or(0.0);
        let theirs: Vec<Missed> = slow
            .iter()
            .filter(|(c, _)| through(c))
            .map(|(_, m)| *m)
            .collect();
        // The expectation the side's copies missed: a floor, else the node's fastest pair
        // when most copies are slow, else the median of the copies not through it.
        let missed = Missed::of_group(&theirs, fleet::median(&others).unwrap_or(0.0));
        let (expected, source) = missed.expectation();
        let against = match missed {
            Missed::Floor(_, s) => source_words(s, "pair copy bandwidth"),
            Missed::NodeFastest(_) => "the node's fastest pair".to_string(),
            Missed::NodeMedian(_) => "the node's copies that do not pass through it".to_string(),
        };
        let (side, which, hint) = match (send, recv) {
            (true, true) => (
                "sending and receiving sides",
                "copies out of and into it",
                "traffic of other work in both directions, or its NVLink ports",
            ),
            (true, false) => (
                "sending side",
                "copies out of it to every other GPU",
                "other work sending from it, or its NVLink transmit side",
            ),
            _ => (
                "receiving side",
                "copies into it from every other GPU",
                "other work sending to it, or its NVLink receive side",
            ),
        };
        let other_way = values
            .iter()
            .filter(|(c, _)| (c.0 == k || c.1 == k) && !through(c))
            .map(|(_, v)| *v)
            .collect::<Vec<f64>>();
        let contrast = fleet::median(&other_way)
            .map(|v| {
                format!(
                    ", while copies the other way reach {} GB/s",
                    tenths_below_100(v)
                )
            })
            .unwrap_or_default();
        out.push(
            Finding::new(
                FindingKind::Slow,
                Subject::gpu(node, k),
                Metric::PairBandwidth,
                Severity::Critical,
                format!(
                    "GPU {k} on {node} is slow on its {side}: {which} median {} GB/s, {} {against} ({} GB/s){contrast}; check {hint} (nvidia-smi nvlink -s -i {k}, nvidia-smi nvlink -gt d -i {k}).",
                    tenths_below_100(measured_gbps),
                    how_far(measured_gbps, expected),
                    tenths_below_100(expected)
                ),
            )
            .with_evidence(measured_gbps, expected, "GB/s", source),
        );
        named.insert(k);
    }
    named
}

/// Two GPUs with one direction slow: the sender's sending side or the receiver's receiving
/// side, which one peer cannot tell apart, so both are named.
fn two_gpus_one_direction(
    node: &str,
    values: &BTreeMap<(u32, u32), f64>,
    slow: &BTreeMap<(u32, u32), Missed>,
    out: &mut Vec<Finding>,
) {
    let Some((&(a, b), missed)) = slow.iter().next() else {
        return;
    };
    let Some(&measured) = values.get(&(a, b)) else {
        return;
    };
    let reverse = values.get(&(b, a)).copied().unwrap_or(0.0);
    let (expected, source) = missed.expectation();
    out.push(
        Finding::new(
            FindingKind::Slow,
            Subject::gpu_pair(node, a.min(b), a.max(b)),
            Metric::PairBandwidth,
            Severity::Critical,
            format!(
                "Copies from GPU {a} to GPU {b} on {node} reach {} GB/s, {} the {} GB/s of the other direction; GPU {a}'s sending side or GPU {b}'s receiving side is slow (with two GPUs the two cannot be told apart): check other work moving data between them and their NVLink ports (nvidia-smi nvlink -gt d -i {a}).",
                tenths_below_100(measured),
                how_far(measured, expected),
                tenths_below_100(reverse)
            ),
        )
        .with_evidence(measured, expected, "GB/s", source),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_cells(g: u32) -> BTreeSet<(u32, u32)> {
        (0..g)
            .flat_map(|a| (0..g).filter(move |b| *b != a).map(move |b| (a, b)))
            .collect()
    }

    #[test]
    fn a_one_way_load_names_the_sender_and_the_receiver() {
        // 1 -> 3 loaded: GPU 1's sending ports and GPU 3's receiving ports are shared.
        let slow: BTreeSet<(u32, u32)> = [(1, 0), (1, 2), (1, 3), (0, 3), (2, 3)]
            .into_iter()
            .collect();
        assert_eq!(
            slow_sides(4, &all_cells(4), &slow),
            vec![(1, Side::Send), (3, Side::Receive)]
        );
    }

    #[test]
    fn two_slow_receivers_are_not_mistaken_for_a_slow_sender() {
        // On 3 GPUs, GPU 0's two copies go into the two slow receivers: sending from 0 is
        // slow everywhere too, but receiving on 1 and 2 explains every slow cell.
        let slow: BTreeSet<(u32, u32)> = [(0, 1), (2, 1), (0, 2), (1, 2)].into_iter().collect();
        assert_eq!(
            slow_sides(3, &all_cells(3), &slow),
            vec![(1, Side::Receive), (2, Side::Receive)]
        );
    }

    #[test]
    fn a_single_slow_cell_or_every_cell_slow_names_no_side() {
        let one: BTreeSet<(u32, u32)> = [(0, 1)].into_iter().collect();
        assert!(slow_sides(4, &all_cells(4), &one).is_empty());
        assert!(slow_sides(4, &all_cells(4), &all_cells(4)).is_empty());
        // Two GPUs: one peer cannot tell a GPU's side from the pair.
        let two: BTreeSet<(u32, u32)> = [(0, 1)].into_iter().collect();
        assert!(slow_sides(2, &all_cells(2), &two).is_empty());
    }

    #[test]
    fn a_gpu_slow_both_ways_is_named_on_both_sides() {
        let slow: BTreeSet<(u32, u32)> = all_cells(4)
            .into_iter()
            .filter(|(a, b)| *a == 2 || *b == 2)
            .collect();
        assert_eq!(
            slow_sides(4, &all_cells(4), &slow),
            vec![(2, Side::Send), (2, Side::Receive)]
        );
    }

    #[test]
    fn eight_gpus_with_one_slow_sender() {
        let slow: BTreeSet<(u32, u32)> = (0..8).filter(|b| *b != 5).map(|b| (5, b)).collect();
        assert_eq!(slow_sides(8, &all_cells(8), &slow), vec![(5, Side::Send)]);
    }
}
