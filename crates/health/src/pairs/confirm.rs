//! The retests of the confirmation rounds (rule 6 of [`super`]): which node meets which
//! known-good partner, in the first round and in the second for what the first left unclear.

use super::rounds::NodePair;
use super::{Localization, PairObservation};
use std::collections::BTreeSet;

/// Most confirmation rounds a run holds. Rule 3 names a node once two of its partners are
/// fine elsewhere; a bad node whose every planned partner is bad too (inside a run of bad
/// nodes along the rounds' ring) has none after the planned rounds, and each confirmation
/// round gives it one known-good partner: two rounds give every such node the two that rule
/// 3 needs. A node still unclear after two is a slow path or a node with too few good
/// partners to be told apart, and a third round (a pair test and its pod starts, about 19 s
/// on H200 nodes) would not tell it either.
pub const MAX_CONFIRMATION_ROUNDS: usize = 2;

/// The retests of confirmation round `number` (1-based) after `loc`, the localization of
/// `observed` (every pair so far, the retests included): the first round's
/// ([`confirmation_pairs`]), the second's ([`second_confirmation_pairs`]), or none past
/// [`MAX_CONFIRMATION_ROUNDS`]. `ports`: nodes whose port finding is to be read again (first
/// round only); `retested`: nodes a confirmation round has already retested.
pub fn retest_pairs(
    number: usize,
    loc: &Localization,
    ports: &BTreeSet<String>,
    observed: &[PairObservation],
    retested: &BTreeSet<String>,
) -> Vec<NodePair> {
    match number {
        1 => confirmation_pairs(loc, ports),
        2 => second_confirmation_pairs(loc, observed, retested),
        _ => Vec::new(),
    }
}

/// The retests of the confirmation round: each suspect (the slowest first, as
/// [`Localization::suspects`] orders them), then each node a finding blames, then each node
/// in `ports` (a port finding to read again), with a known-good partner of its own (in name
/// order, as far as known-good nodes go: a round is a matching, so a node left without a
/// partner is not retested and nothing acts on it).
pub fn confirmation_pairs(loc: &Localization, ports: &BTreeSet<String>) -> Vec<NodePair> {
    let mut seen = BTreeSet::new();
    let retest: Vec<String> = loc
        .suspects
        .iter()
        .cloned()
        .chain(loc.blamed_nodes().into_iter().map(str::to_string))
        .chain(ports.iter().cloned())
        .filter(|n| seen.insert(n.clone()))
        .collect();
    let partners = loc.known_good.iter().filter(|n| !seen.contains(*n));
    retest
        .into_iter()
        .zip(partners)
        .map(|(a, b)| NodePair { a, b: b.clone() })
        .collect()
}

/// The retests of the second confirmation round, for what the first left unclear: each
/// suspect of `loc` (the localization of every pair so far, the first round's retests
/// included; the slowest first), then each node a finding blames that no confirmation round
/// has retested yet (not in `retested`), with a known-good partner it has not met in
/// `observed` (a second partner fine elsewhere is what rule 3 needs; the same one again
/// would only read the same path twice). Partners go in name order, each once; a node with
/// no such partner left is not retested.
pub fn second_confirmation_pairs(
    loc: &Localization,
    observed: &[PairObservation],
    retested: &BTreeSet<String>,
) -> Vec<NodePair> {
    let mut seen = BTreeSet::new();
    let retest: Vec<&str> = loc
        .suspects
        .iter()
        .map(String::as_str)
        .chain(
            loc.blamed_nodes()
                .into_iter()
                .filter(|n| !retested.contains(*n)),
        )
        .filter(|n| seen.insert(*n))
        .collect();
    let met = |a: &str, b: &str| observed.iter().any(|p| p.touches(a) && p.touches(b));
    let mut taken = BTreeSet::new();
    let mut out = Vec::new();
    for node in retest {
        let partner = loc
            .known_good
            .iter()
            .map(String::as_str)
            .find(|k| !seen.contains(k) && !taken.contains(k) && !met(node, k));
        if let Some(k) = partner {
            taken.insert(k);
            out.push(NodePair {
                a: node.to_string(),
                b: k.to_string(),
            });
        }
    }
    out
}
