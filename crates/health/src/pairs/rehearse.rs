//! The node-pair phase of a run played over a modelled network, without the API server: the
//! operator's sequence (`controller::run::pairs`) with the same pure parts, so that
//! localization can be tried at thousands of nodes in seconds.
//!
//! The sequence: the rounds of [`plan_rounds`], each pair measured by the network; the
//! localization of every pair so far ([`localize_against`]); a confirmation round of
//! [`retest_pairs`] when it names suspects or blames a node, and after it, judged again, a
//! second for the suspects it left unclear (at most [`MAX_CONFIRMATION_ROUNDS`]); then the
//! localization of every pair with rule 6 ([`require_confirmation`]): only nodes retested
//! against a known-good partner (either side of a retest that was measured) can be blamed.

use super::rounds::{Candidate, plan_with_partners};
use super::{
    Localization, MAX_CONFIRMATION_ROUNDS, PairBaseline, PairObservation, PairRules,
    localize_against, require_confirmation, retest_pairs,
};
use gpufabric_api::pair::NetTransport;
use gpufabric_api::suite::Pairing;
use std::collections::{BTreeMap, BTreeSet};

/// What a modelled network measures: the busbw (GB/s) and transport of the pair `a`, `b` in
/// round `round` (0-based, the confirmation rounds last).
pub trait Network {
    fn measure(&self, a: &str, b: &str, round: usize) -> (f64, NetTransport);
}

/// How the phase went.
#[derive(Debug, Clone, PartialEq)]
pub struct Rehearsal {
    /// Rounds run, the confirmation rounds included.
    pub rounds: usize,
    /// Pair tests run, the retests included.
    pub pair_tests: usize,
    /// Pair tests of the confirmation rounds.
    pub retests: usize,
    /// Confirmation rounds run (at most [`MAX_CONFIRMATION_ROUNDS`]).
    pub confirmation_rounds: usize,
    /// The most pairs one round ran at once.
    pub widest_round: usize,
    /// The run's localization, rule 6 applied.
    pub localization: Localization,
}

impl Rehearsal {
    /// Nodes a Critical finding blames.
    pub fn blamed(&self) -> BTreeSet<String> {
        self.localization
            .blamed_nodes()
            .into_iter()
            .map(str::to_string)
            .collect()
    }

    /// Node pairs a finding names (a slow path, or a pair whose side was not yet clear).
    pub fn named_pairs(&self) -> BTreeSet<(String, String)> {
        self.localization
            .findings
            .iter()
            .filter_map(|f| match &f.subject {
                gpufabric_api::findings::Subject::NodePair { a, b } => Some(if a <= b {
                    (a.clone(), b.clone())
                } else {
                    (b.clone(), a.clone())
                }),
                _ => None,
            })
            .collect()
    }
}

/// How the phase pairs its nodes: what [`plan_with_partners`] takes besides the nodes.
#[derive(Debug, Clone, Copy)]
pub struct Planning {
    /// Ring, random matchings or every pair.
    pub pairing: Pairing,
    /// The run's seed, which draws the partners.
    pub seed: u64,
    /// Partners a node gets a night.
    pub partners: u32,
}

/// The phase over `nodes` (those that passed their own check) paired as `planning` says,
/// measured by `network`, judged by `rules` against `baselines` (as [`localize_against`]).
pub fn rehearse(
    nodes: &[Candidate],
    planning: Planning,
    network: &dyn Network,
    rules: &PairRules,
    baselines: Option<&[PairBaseline]>,
) -> Rehearsal {
    let Planning {
        pairing,
        seed,
        partners,
    } = planning;
    let plan = plan_with_partners(nodes, pairing, seed, partners);
    let mut observed = Vec::new();
    let mut widest_round = 0;
    let measure = |a: &str, b: &str, round: usize| {
        let (busbw, transport) = network.measure(a, b, round);
        PairObservation {
            a: a.to_string(),
            b: b.to_string(),
            busbw,
            transport: Some(transport),
        }
    };
    for (r, round) in plan.rounds.iter().enumerate() {
        widest_round = widest_round.max(round.pairs.len());
        observed.extend(round.pairs.iter().map(|p| measure(&p.a, &p.b, r)));
    }
    let planned = plan.rounds.len();
    let mut retested = BTreeSet::new();
    let mut retests = 0;
    let mut confirmation_rounds = 0;
    for number in 1..=MAX_CONFIRMATION_ROUNDS {
        let before = localize_against(&observed, rules, baselines);
        let pairs = retest_pairs(number, &before, &BTreeSet::new(), &observed, &retested);
        if pairs.is_empty() {
            break;
        }
        for p in &pairs {
            observed.push(measure(&p.a, &p.b, planned + confirmation_rounds));
            retested.insert(p.a.clone());
            retested.insert(p.b.clone());
        }
        widest_round = widest_round.max(pairs.len());
        retests += pairs.len();
        confirmation_rounds += 1;
    }
    let mut localization = localize_against(&observed, rules, baselines);
    require_confirmation(&mut localization, &retested);
    Rehearsal {
        rounds: planned + confirmation_rounds,
        pair_tests: observed.len(),
        retests,
        confirmation_rounds,
        widest_round,
        localization,
    }
}

/// A modelled fabric: every healthy pair at `healthy` GB/s over `transport`, with 1% noise
/// that depends only on the two nodes and the round; a pair runs at the slower of its two
/// nodes, and a path leaving a bad switch's block at the switch's factor.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Modelled {
    pub healthy: f64,
    pub transport: Option<NetTransport>,
    /// Nodes slow with every partner (a NIC, a cable), by the factor of their bandwidth.
    pub slow: BTreeMap<String, f64>,
    /// Nodes slow in one round only (0-based), by that factor.
    pub flaky: BTreeMap<String, (usize, f64)>,
    /// Bad switches: the nodes of a block under one, and the factor of every path from
    /// one of them to a node outside it (paths inside the block turn below it and are fine).
    pub switches: Vec<(BTreeSet<String>, f64)>,
}

impl Modelled {
    fn factor(&self, node: &str, round: usize) -> f64 {
        let slow = self.slow.get(node).copied().unwrap_or(1.0);
        let flaky = match self.flaky.get(node) {
            Some((r, f)) if *r == round => *f,
            _ => 1.0,
        };
        slow * flaky
    }
}

impl Network for Modelled {
    fn measure(&self, a: &str, b: &str, round: usize) -> (f64, NetTransport) {
        let path = self
            .switches
            .iter()
            .filter(|(block, _)| block.contains(a) != block.contains(b))
            .map(|(_, f)| *f)
            .fold(1.0, f64::min);
        let nodes = self.factor(a, round).min(self.factor(b, round));
        let key = format!("{}/{}/{round}", a.min(b), a.max(b));
        let unit = (gpufabric_api::fnv1a(key.as_bytes()) % 2001) as f64 / 1000.0 - 1.0;
        let noise = 1.0 + 0.01 * unit;
        (
            self.healthy * nodes * path * noise,
            self.transport.unwrap_or(NetTransport::Ib),
        )
    }
}
