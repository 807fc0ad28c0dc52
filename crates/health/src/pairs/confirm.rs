//! The retests of the confirmation round (rule 6 of [`super`]): which node meets which
//! known-good partner.

use super::Localization;
use super::rounds::NodePair;
use std::collections::BTreeSet;

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
