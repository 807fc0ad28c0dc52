//! Rounds of node pairs: each round is a matching (no node in two pairs at once), and each
//! node meets at least two different partners per run, or one when the suite asks for one
//! partner a night (rule 5).
//!
//! # Rules
//! 1. Nodes are split into groups by the value of the topology label (one group when no
//!    key is set; nodes without the label form a group of their own).
//! 2. **Within groups** first: each group is scheduled by the circle method (one node fixed,
//!    the others shifted one place around a ring per round; an odd group gets a bye). Round
//!    r of the run holds round r of every group, so the number of rounds does not grow
//!    with the node count: `Ring` and `Random` take 2 rounds for a group of even size and
//!    3 for an odd one (so the node that sits out once still meets 2 partners); `All`
//!    takes every round (each pair of the group exactly once). A group of 2 meets once.
//! 3. **Across groups**, as a separate set of rounds when there are 2 groups or more: the
//!    nodes ordered by group (largest first) are cut in two halves and the first half is
//!    paired with the second, then with the second shifted by one: 2 rounds, and every
//!    node meets a node of another group whenever no group holds more than half the nodes.
//!    Pairs inside one group are left out of this set. `All` pairs every two nodes of
//!    different groups once.
//! 4. `Ring` takes the nodes in name order; `Random` shuffles each group with the seed
//!    first (recorded in the plan, so a run can be replayed).
//! 5. **One partner a night** (`partners: 1`; `Ring` and `Random`, `All` always meets every
//!    partner): each group takes one round of its circle, round `seed mod (m - 1)` of a group
//!    of `m` (an odd group counted with its bye), so a `Ring` run whose seed is the day it
//!    runs on meets a new partner each night and every pair of the group within `m - 1`
//!    nights. In an odd group the node with the bye is not left untested: it meets its
//!    partner of the circle's next round in a round of its own (the second round of the
//!    plan, one pair a group). Across groups, one round: the halves shifted by
//!    `seed mod (the second half's size)`. Each node then has one pair to judge it by, so a
//!    slow pair makes both of its nodes suspects, and the confirmation round tells them
//!    apart against known-good partners ([`super::confirm`]).

use gpufabric_api::suite::Pairing;
use std::collections::BTreeMap;

/// Which set a round belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PairSet {
    /// Both nodes in the same topology group.
    Within,
    /// The nodes in different topology groups.
    Across,
}

/// Two nodes tested together; `a` is rank 0.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodePair {
    pub a: String,
    pub b: String,
}

/// One round: pairs that run at the same time.
#[derive(Clone, Debug, PartialEq)]
pub struct Round {
    pub set: PairSet,
    pub pairs: Vec<NodePair>,
}

/// Every round of a run's node-pair phase.
#[derive(Clone, Debug, PartialEq)]
pub struct RoundPlan {
    pub pairing: Pairing,
    /// Seed of the shuffle (`Random`); recorded for every pairing.
    pub seed: u64,
    pub rounds: Vec<Round>,
}

impl RoundPlan {
    /// Every pair of the plan, in round order.
    pub fn pairs(&self) -> impl Iterator<Item = &NodePair> {
        self.rounds.iter().flat_map(|r| r.pairs.iter())
    }
}

/// A node that passed its own check, with the value of its topology label (if any).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub name: String,
    pub group: Option<String>,
}

/// The plan for these nodes, by the rules in the module docs: each node meets two
/// partners (or more, by `pairing`).
pub fn plan_rounds(nodes: &[Candidate], pairing: Pairing, seed: u64) -> RoundPlan {
    plan_with_partners(nodes, pairing, seed, 2)
}

/// The plan for these nodes with `partners` partners a node (1, or 2 and above for the
/// usual plan; rule 5 for 1; `All` ignores it).
pub fn plan_with_partners(
    nodes: &[Candidate],
    pairing: Pairing,
    seed: u64,
    partners: u32,
) -> RoundPlan {
    let one = partners <= 1 && pairing != Pairing::All;
    let mut groups: BTreeMap<Option<&str>, Vec<&str>> = BTreeMap::new();
    for n in nodes {
        groups
            .entry(n.group.as_deref())
            .or_default()
            .push(n.name.as_str());
    }
    for (index, members) in groups.values_mut().enumerate() {
        members.sort_unstable();
        members.dedup();
        if pairing == Pairing::Random {
            shuffle(members, seed.wrapping_add(index as u64));
        }
    }
    let mut rounds = Vec::new();
    // Rule 2: within groups, round r of every group together.
    let per_group: Vec<Vec<Vec<NodePair>>> = groups
        .values()
        .map(|members| {
            if one {
                one_partner_rounds(members, seed)
            } else {
                circle_rounds(members, 0, within_rounds(members.len(), pairing))
            }
        })
        .collect();
    let most = per_group.iter().map(Vec::len).max().unwrap_or(0);
    for r in 0..most {
        let pairs: Vec<NodePair> = per_group
            .iter()
            .filter_map(|g| g.get(r))
            .flatten()
            .cloned()
            .collect();
        if !pairs.is_empty() {
            rounds.push(Round {
                set: PairSet::Within,
                pairs,
            });
        }
    }
    // Rule 3: across groups.
    if groups.len() >= 2 {
        let group_of: BTreeMap<&str, Option<&str>> = groups
            .iter()
            .flat_map(|(g, members)| members.iter().map(move |m| (*m, *g)))
            .collect();
        let across = |p: &NodePair| group_of.get(p.a.as_str()) != group_of.get(p.b.as_str());
        let candidate_rounds = if pairing == Pairing::All {
            let all: Vec<&str> = group_of.keys().copied().collect();
            circle_rounds(&all, 0, all.len())
        } else {
            // The groups in a line, largest first, its first half against its second.
            let mut ordered: Vec<&Vec<&str>> = groups.values().collect();
            ordered.sort_by_key(|m| std::cmp::Reverse(m.len()));
            let line: Vec<&str> = ordered.into_iter().flatten().copied().collect();
            if one {
                let second = line.len() - line.len() / 2;
                vec![half_round(&line, (seed % second.max(1) as u64) as usize)]
            } else {
                half_rounds(&line)
            }
        };
        let mut seen = std::collections::BTreeSet::new();
        for pairs in candidate_rounds {
            let pairs: Vec<NodePair> = pairs
                .into_iter()
                .filter(|p| across(p) && seen.insert(unordered(p)))
                .collect();
            if !pairs.is_empty() {
                rounds.push(Round {
                    set: PairSet::Across,
                    pairs,
                });
            }
        }
    }
    RoundPlan {
        pairing,
        seed,
        rounds,
    }
}

fn unordered(p: &NodePair) -> (String, String) {
    if p.a <= p.b {
        (p.a.clone(), p.b.clone())
    } else {
        (p.b.clone(), p.a.clone())
    }
}

/// Rounds a group of `m` nodes needs: at least two partners each where the group allows.
fn within_rounds(m: usize, pairing: Pairing) -> usize {
    let all = if m.is_multiple_of(2) {
        m.saturating_sub(1)
    } else {
        m
    };
    if m < 2 {
        0
    } else if pairing == Pairing::All {
        all
    } else if m.is_multiple_of(2) {
        all.min(2)
    } else {
        all.min(3)
    }
}

/// Rule 5 for one group: round `seed mod (m - 1)` of its circle, and for an odd group a
/// second round holding only the pair of the node that sat the first one out.
fn one_partner_rounds(members: &[&str], seed: u64) -> Vec<Vec<NodePair>> {
    let m = members.len() + members.len() % 2;
    if m < 2 {
        return Vec::new();
    }
    let first = (seed % (m as u64 - 1)) as usize;
    let mut rounds = circle_rounds(members, first, 1);
    if members.len() % 2 == 1 && members.len() >= 3 {
        let paired: std::collections::BTreeSet<&str> = rounds
            .iter()
            .flatten()
            .flat_map(|p| [p.a.as_str(), p.b.as_str()])
            .collect();
        // An odd circle leaves exactly one node out of each round.
        if let Some(bye) = members.iter().copied().find(|n| !paired.contains(n)) {
            let own: Vec<NodePair> = circle_rounds(members, first + 1, 1)
                .into_iter()
                .flatten()
                .filter(|p| p.a == bye || p.b == bye)
                .collect();
            rounds.push(own);
        }
    }
    rounds
}

/// `count` rounds of the circle method over `members` (a bye for an odd count), from round
/// `first` (counted around the circle's `m - 1` rounds).
fn circle_rounds(members: &[&str], first: usize, count: usize) -> Vec<Vec<NodePair>> {
    let mut ring: Vec<Option<&str>> = members.iter().map(|m| Some(*m)).collect();
    if !ring.len().is_multiple_of(2) {
        ring.push(None);
    }
    let m = ring.len();
    let mut rounds = Vec::with_capacity(count);
    if m < 2 {
        return rounds;
    }
    ring[1..].rotate_right(first % (m - 1));
    for _ in 0..count.min(m - 1) {
        let pairs = (0..m / 2)
            .filter_map(|i| match (ring[i], ring[m - 1 - i]) {
                (Some(a), Some(b)) => Some(NodePair {
                    a: a.to_string(),
                    b: b.to_string(),
                }),
                _ => None,
            })
            .collect();
        rounds.push(pairs);
        // Keep the first place, shift the others one place around the ring.
        ring[1..].rotate_right(1);
    }
    rounds
}

/// Two rounds pairing the first half of `line` with its second half, unshifted and
/// shifted by one.
fn half_rounds(line: &[&str]) -> Vec<Vec<NodePair>> {
    (0..2).map(|shift| half_round(line, shift)).collect()
}

/// The first half of `line` paired with its second half shifted by `shift`.
fn half_round(line: &[&str], shift: usize) -> Vec<NodePair> {
    let h = line.len() / 2;
    let (first, second) = line.split_at(h);
    first
        .iter()
        .enumerate()
        .filter_map(|(i, a)| {
            let b = second.get((i + shift) % second.len().max(1))?;
            Some(NodePair {
                a: a.to_string(),
                b: b.to_string(),
            })
        })
        .collect()
}

/// Fisher-Yates with splitmix64: the same seed gives the same order on every platform.
fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut state = seed;
    let mut next = || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    for i in (1..items.len()).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        items.swap(i, j);
    }
}

#[cfg(test)]
mod tests;
