//! Localization of node-pair results: which node, which node pair (the path between two
//! nodes), or which node's transport is at fault, with the numbers that show it.
//!
//! # Rules, in order
//! 1. **Transport.** When most pairs with a known transport used RDMA (InfiniBand or RoCE),
//!    a node whose every pair fell back to sockets, while a partner of it used RDMA with
//!    another node, is a Critical `TransportFallback` on the node. A socket pair between two
//!    nodes that both used RDMA elsewhere is one on the node pair (Info). Other socket pairs
//!    make both nodes suspects. Socket pairs are then left out of the bandwidth rules: their
//!    slowness is explained.
//! 2. **Slow pairs.** Against the test's baseline when it has one for the transport the
//!    pairs used at the suite's size ([`PairBaseline`], at least
//!    [`gpufabric_api::baseline::MIN_NODES`] nodes in one run of its window): a pair is slow
//!    when far below it (more than `slow_gap` below its median and further below its 10th
//!    percentile than that percentile is below the median), whatever this run's median, so
//!    a run whose median pair is itself slow still names its bad nodes. Else against the
//!    run: more than `slow_gap` below the median of the pairs compared (the fleet's RDMA
//!    pairs, or all pairs where the fleet does not use RDMA), with at least `min_pairs`
//!    pairs to compare; when a baseline was looked for and none fits,
//!    [`Localization::basis`] says the pairs were judged against the run alone.
//! 3. **A node slow with every partner** (at least 2 pairs, all slow) while at least 2 of
//!    those partners have a pair elsewhere that is not slow is the node: Critical `Slow`,
//!    measured = its median busbw, expected = the median of its partners' other pairs (or
//!    the baseline's median, when judged against it).
//! 4. **One slow pair** whose two nodes each have a pair elsewhere that is not slow (and
//!    neither is named by rule 3) is the path between them: a `Slow` finding on the node
//!    pair, Info, because a path is not a reason to cordon either node.
//! 5. Any other slow pair makes nodes suspects, and the confirmation pass retests them
//!    against known-good partners, the slowest suspect first (by the median busbw of its
//!    pairs), before anything acts. Against the run: both unnamed nodes of the pair (a node
//!    with no pair to compare, two suspects that met), and the known-good nodes are those
//!    whose every pair was fine. Against the baseline: only a node with no pair at the
//!    baseline (the slow side; a good node that met two bad ones is one too, and its retest
//!    clears it), and the known-good nodes are those with a pair at the baseline: their
//!    network works. The pairs are judged again after the retests, and the suspects the
//!    first confirmation round left unclear are retested in a second, against known-good
//!    partners they have not met: a bad node whose every planned partner is bad has no
//!    partner fine elsewhere until its retests give it two ([`confirm`]; no third round).
//! 6. **Confirmation.** A Critical finding on a node stands only when the node was retested
//!    against a known-good partner and that retest was bad too: being named by rules 1 or 3
//!    with the retest among its pairs says so. Otherwise it becomes Info ("not confirmed"),
//!    and nothing acts on it ([`require_confirmation`]).
//!
//! [`rehearse`] plays the operator's rounds over a modelled network with these rules.
//!
//! Pairs that were not measured (a peer that never arrived) are not input here; pairs
//! that met and failed (an NCCL error, a crash, a hang) are, with no bandwidth.

use crate::fleet::median;
use gpufabric_api::findings::{ExpectationSource, Finding, FindingKind, Metric, Severity, Subject};
use gpufabric_api::pair::{NetTransport, NodePairResult, PairRecord, PairState};
use std::collections::{BTreeMap, BTreeSet};

mod against;
pub mod confirm;
pub mod rehearse;
pub mod rounds;

pub use crate::evaluate::baseline::PairBaseline;
pub use confirm::{
    MAX_CONFIRMATION_ROUNDS, confirmation_pairs, retest_pairs, second_confirmation_pairs,
};

/// One measured node pair.
#[derive(Debug, Clone, PartialEq)]
pub struct PairObservation {
    pub a: String,
    pub b: String,
    /// NCCL bus bandwidth between the two nodes, GB/s.
    pub busbw: f64,
    pub transport: Option<NetTransport>,
}

impl PairObservation {
    /// The pairs of a run as the rules read them, from the documents the ranks wrote (one
    /// or both per pair, any order). A pair that either rank reports as not measured, or
    /// without a busbw, is left out (it counts against neither node). Rank 0's numbers are
    /// taken when both ranks wrote; sockets on either side make the pair a socket pair.
    pub fn from_documents(docs: &[NodePairResult]) -> Vec<PairObservation> {
        let mut by_pair: BTreeMap<(&str, &str), Vec<&NodePairResult>> = BTreeMap::new();
        for d in docs {
            by_pair
                .entry((d.nodes[0].as_str(), d.nodes[1].as_str()))
                .or_default()
                .push(d);
        }
        by_pair
            .into_iter()
            .filter(|(_, ds)| ds.iter().all(|d| d.not_measured.is_none()))
            .filter_map(|((a, b), ds)| {
                let first = ds.iter().min_by_key(|d| d.rank)?;
                let socket = ds.iter().any(|d| d.transport == Some(NetTransport::Socket));
                Some(PairObservation {
                    a: a.to_string(),
                    b: b.to_string(),
                    busbw: first.busbw()?,
                    transport: if socket {
                        Some(NetTransport::Socket)
                    } else {
                        first.transport
                    },
                })
            })
            .collect()
    }
}

impl PairObservation {
    /// The pairs of a run from the records its nodes keep (`(node, record)`): rank 0's
    /// record of each pair that was measured, or that failed (with no bandwidth).
    pub fn from_records<'a>(
        records: impl IntoIterator<Item = (&'a str, &'a PairRecord)>,
    ) -> Vec<PairObservation> {
        records
            .into_iter()
            .filter(|(_, r)| r.rank == 0)
            .filter_map(|(node, r)| {
                let busbw = match r.state {
                    PairState::Measured => r.busbw_gbps?,
                    PairState::Errored => 0.0,
                    _ => return None,
                };
                Some(PairObservation {
                    a: node.to_string(),
                    b: r.partner.clone(),
                    busbw,
                    transport: r.transport.filter(|_| r.state == PairState::Measured),
                })
            })
            .collect()
    }
}

/// Rule 6: Critical findings on nodes not in `retested` (nodes whose retest against a
/// known-good partner ended, measured or failed) become Info; returns the nodes so spared.
pub fn require_confirmation(
    loc: &mut Localization,
    retested: &BTreeSet<String>,
) -> BTreeSet<String> {
    let mut spared = BTreeSet::new();
    for f in loc.findings.iter_mut() {
        if f.severity != Severity::Critical
            || f.subject.kind() != gpufabric_api::SubjectKind::Node
            || retested.contains(f.subject.node_name())
        {
            continue;
        }
        f.severity = Severity::Info;
        f.message
            .push_str("; not confirmed against a known-good partner, so not acted on");
        spared.insert(f.subject.node_name().to_string());
    }
    spared
}

/// Settings of the rules.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairRules {
    /// A pair this far below the median of the compared pairs (0.25 = 25%) is slow.
    pub slow_gap: f64,
    /// Fewest pairs to compare with before any pair is called slow.
    pub min_pairs: usize,
}

impl Default for PairRules {
    fn default() -> Self {
        PairRules {
            slow_gap: 0.25,
            min_pairs: 3,
        }
    }
}

/// What the rules make of a run's pairs.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Localization {
    pub findings: Vec<Finding>,
    /// Nodes to retest against known-good partners before anything is concluded.
    pub suspects: Vec<String>,
    /// Nodes to pair with suspects in the retest: against the run, nodes whose every pair
    /// was fine; against the baseline, nodes with a pair at the baseline.
    pub known_good: Vec<String>,
    /// Set when the pairs were judged against the run alone although a baseline was looked
    /// for: what was missing, for the run's status.
    pub basis: Option<String>,
}

impl Localization {
    /// Nodes the findings blame (Critical findings on a node); node-pair findings blame
    /// neither node.
    pub fn blamed_nodes(&self) -> BTreeSet<&str> {
        self.findings
            .iter()
            .filter(|f| f.severity == Severity::Critical)
            .filter(|f| f.subject.kind() == gpufabric_api::SubjectKind::Node)
            .map(|f| f.subject.node_name())
            .collect()
    }
}

/// The findings of a run's node pairs against the run alone, by the rules in the module
/// docs (no baseline looked for, and no note that none was).
pub fn localize(pairs: &[PairObservation], rules: &PairRules) -> Localization {
    localize_against(pairs, rules, None)
}

/// The findings of a run's node pairs, by the rules in the module docs. `baselines`: the
/// test's baselines of node-pair busbw (one per transport at the suite's size), or None
/// when none was looked for; with `Some` and none for the transport the pairs used, the
/// pairs are judged against the run alone and [`Localization::basis`] says so.
pub fn localize_against(
    pairs: &[PairObservation],
    rules: &PairRules,
    baselines: Option<&[PairBaseline]>,
) -> Localization {
    let mut out = Localization::default();
    let mut suspects = BTreeSet::new();
    let known: Vec<&PairObservation> = pairs.iter().filter(|p| p.transport.is_some()).collect();
    let rdma = known
        .iter()
        .filter(|p| p.transport.is_some_and(NetTransport::is_rdma))
        .count();
    let fleet_rdma = rdma * 2 > known.len();
    let mut transport_blamed = BTreeSet::new();
    if fleet_rdma {
        let fleet_transport = dominant_rdma(&known);
        transport_blamed = socket_fallbacks(
            pairs,
            fleet_transport,
            (rdma, known.len()),
            &mut out.findings,
            &mut suspects,
        );
    }
    let compared: Vec<&PairObservation> = pairs
        .iter()
        .filter(|p| !fleet_rdma || p.transport != Some(NetTransport::Socket))
        .filter(|p| !transport_blamed.contains(&p.a) && !transport_blamed.contains(&p.b))
        .collect();
    let transport = if fleet_rdma {
        Some(dominant_rdma(&known))
    } else {
        most_common_transport(&compared)
    };
    let baseline = baselines
        .and_then(|bs| transport.and_then(|t| bs.iter().find(|b| b.transport == t)))
        .filter(|_| !compared.is_empty());
    let slow_blamed = match baseline {
        Some(b) => against::judge(&compared, b, rules, &mut out, &mut suspects),
        None => {
            if baselines.is_some() && !compared.is_empty() {
                out.basis = Some(against::run_only_note(transport, compared.len()));
            }
            against_run(&compared, rules, &mut out, &mut suspects)
        }
    };
    out.known_good
        .retain(|n| !transport_blamed.contains(n) && !suspects.contains(n));
    for n in slow_blamed.iter().chain(transport_blamed.iter()) {
        suspects.remove(n);
    }
    out.suspects = against::slowest_first(suspects, &compared);
    gpufabric_api::findings::sort_findings(&mut out.findings);
    out
}

/// Rules 2 to 5 against the run's own median: returns the nodes rule 3 named.
fn against_run(
    compared: &[&PairObservation],
    rules: &PairRules,
    out: &mut Localization,
    suspects: &mut BTreeSet<String>,
) -> BTreeSet<String> {
    let values: Vec<f64> = compared.iter().map(|p| p.busbw).collect();
    let Some(reference) = median(&values).filter(|_| compared.len() >= rules.min_pairs) else {
        return BTreeSet::new();
    };
    let floor = reference * (1.0 - rules.slow_gap);
    let slow = |p: &PairObservation| p.busbw < floor;
    let slow_blamed = slow_nodes(compared, &slow, &mut out.findings, None);
    for p in compared.iter().filter(|p| slow(p)) {
        if slow_blamed.contains(&p.a) || slow_blamed.contains(&p.b) {
            continue;
        }
        let fine_elsewhere = |n: &str, other: &str| {
            compared
                .iter()
                .any(|q| q.touches(n) && !q.touches(other) && !slow(q))
        };
        if fine_elsewhere(&p.a, &p.b) && fine_elsewhere(&p.b, &p.a) {
            let others: Vec<f64> = compared
                .iter()
                .filter(|q| (q.touches(&p.a) || q.touches(&p.b)) && !q.same(p))
                .map(|q| q.busbw)
                .collect();
            let expected = median(&others).unwrap_or(reference);
            out.findings.push(path_finding(p, expected));
        } else {
            suspects.insert(p.a.clone());
            suspects.insert(p.b.clone());
            out.findings.push(unclear_finding(p, reference));
        }
    }
    let bad: BTreeSet<&str> = compared
        .iter()
        .filter(|p| slow(p))
        .flat_map(|p| [p.a.as_str(), p.b.as_str()])
        .collect();
    out.known_good = nodes_of(compared.iter().copied())
        .into_iter()
        .filter(|n| !bad.contains(n))
        .map(str::to_string)
        .collect();
    slow_blamed
}

/// The transport most of `pairs` used (the first in order on a tie), if any reported one.
fn most_common_transport(pairs: &[&PairObservation]) -> Option<NetTransport> {
    let mut counts: BTreeMap<NetTransport, usize> = BTreeMap::new();
    for t in pairs.iter().filter_map(|p| p.transport) {
        *counts.entry(t).or_default() += 1;
    }
    let most = counts.values().copied().max()?;
    counts.into_iter().find(|(_, c)| *c == most).map(|(t, _)| t)
}

impl PairObservation {
    fn touches(&self, node: &str) -> bool {
        self.a == node || self.b == node
    }
    fn same(&self, other: &PairObservation) -> bool {
        (self.a == other.a && self.b == other.b) || (self.a == other.b && self.b == other.a)
    }
    fn partner_of(&self, node: &str) -> &str {
        if self.a == node { &self.b } else { &self.a }
    }
}

/// InfiniBand unless RoCE pairs are the majority of the RDMA pairs.
fn dominant_rdma(known: &[&PairObservation]) -> NetTransport {
    let roce = known
        .iter()
        .filter(|p| p.transport == Some(NetTransport::Roce))
        .count();
    let ib = known
        .iter()
        .filter(|p| p.transport == Some(NetTransport::Ib))
        .count();
    if roce > ib {
        NetTransport::Roce
    } else {
        NetTransport::Ib
    }
}

fn nodes_of<'a>(pairs: impl Iterator<Item = &'a PairObservation>) -> BTreeSet<&'a str> {
    pairs.flat_map(|p| [p.a.as_str(), p.b.as_str()]).collect()
}

/// Rule 1: returns the nodes blamed for falling back to sockets.
fn socket_fallbacks(
    pairs: &[PairObservation],
    fleet: NetTransport,
    (rdma, known): (usize, usize),
    findings: &mut Vec<Finding>,
    suspects: &mut BTreeSet<String>,
) -> BTreeSet<String> {
    let socket = |p: &PairObservation| p.transport == Some(NetTransport::Socket);
    let rdma_elsewhere = |n: &str, other: &str| {
        pairs.iter().any(|q| {
            q.touches(n) && !q.touches(other) && q.transport.is_some_and(NetTransport::is_rdma)
        })
    };
    let mut blamed = BTreeSet::new();
    for node in nodes_of(pairs.iter()) {
        let own: Vec<&PairObservation> = pairs.iter().filter(|p| p.touches(node)).collect();
        if own.is_empty() || !own.iter().all(|p| socket(p)) {
            continue;
        }
        if !own.iter().any(|p| rdma_elsewhere(p.partner_of(node), node)) {
            continue;
        }
        let bw: Vec<f64> = own.iter().map(|p| p.busbw).collect();
        findings.push(Finding {
            measured: median(&bw),
            unit: Some("GB/s".into()),
            source: Some(ExpectationSource::Fleet),
            ..Finding::new(
                FindingKind::TransportFallback,
                Subject::node(node),
                Metric::NetTransport,
                Severity::Critical,
                format!(
                    "node {node}: NCCL fell back to sockets with {} (busbw {} GB/s) where the fleet uses {fleet} ({rdma} of {known} pairs): check its RDMA devices, NCCL_IB_HCA and the network operator",
                    partners(own.len()),
                    range(&bw)
                ),
            )
        });
        blamed.insert(node.to_string());
    }
    for p in pairs.iter().filter(|p| socket(p)) {
        if blamed.contains(&p.a) || blamed.contains(&p.b) {
            continue;
        }
        if rdma_elsewhere(&p.a, &p.b) && rdma_elsewhere(&p.b, &p.a) {
            findings.push(Finding {
                measured: Some(p.busbw),
                unit: Some("GB/s".into()),
                source: Some(ExpectationSource::Fleet),
                ..Finding::new(
                    FindingKind::TransportFallback,
                    Subject::node_pair(&p.a, &p.b),
                    Metric::NetTransport,
                    Severity::Info,
                    format!(
                        "node pair {} <-> {}: NCCL fell back to sockets between them (busbw {} GB/s) though both use {fleet} with other partners: check the path between them",
                        p.a,
                        p.b,
                        tenths_below_10(p.busbw)
                    ),
                )
            });
        } else {
            suspects.insert(p.a.clone());
            suspects.insert(p.b.clone());
        }
    }
    blamed
}

/// Rule 3: nodes slow with every partner while those partners are fine elsewhere.
fn slow_nodes(
    pairs: &[&PairObservation],
    slow: &dyn Fn(&PairObservation) -> bool,
    findings: &mut Vec<Finding>,
    baseline: Option<&PairBaseline>,
) -> BTreeSet<String> {
    let mut blamed = BTreeSet::new();
    for node in nodes_of(pairs.iter().copied()) {
        let own: Vec<&PairObservation> =
            pairs.iter().copied().filter(|p| p.touches(node)).collect();
        if own.len() < 2 || !own.iter().all(|p| slow(p)) {
            continue;
        }
        let mut elsewhere = Vec::new();
        let mut fine_partners = 0;
        for p in &own {
            let partner = p.partner_of(node);
            let other: Vec<&PairObservation> = pairs
                .iter()
                .copied()
                .filter(|q| q.touches(partner) && !q.touches(node))
                .collect();
            if other.iter().any(|q| !slow(q)) {
                fine_partners += 1;
            }
            elsewhere.extend(other.iter().map(|q| q.busbw));
        }
        if fine_partners < 2 {
            continue;
        }
        let bw: Vec<f64> = own.iter().map(|p| p.busbw).collect();
        let Some(measured) = median(&bw) else {
            continue;
        };
        let (expected, against, source) = match baseline {
            Some(b) => (
                b.expectation.median,
                against::basis(b),
                ExpectationSource::Baseline,
            ),
            None => {
                let Some(expected) = median(&elsewhere) else {
                    continue;
                };
                (
                    expected,
                    format!(
                        "its partners' other pairs (median {} GB/s)",
                        tenths_below_10(expected)
                    ),
                    ExpectationSource::Fleet,
                )
            }
        };
        findings.push(
            Finding::new(
                FindingKind::Slow,
                Subject::node(node),
                Metric::NodePairBusBw,
                Severity::Critical,
                format!(
                    "node {node}: NCCL busbw to {} {} GB/s, {} {against}: check its NICs and links",
                    partners(own.len()),
                    range(&bw),
                    below(measured, expected),
                ),
            )
            .with_evidence(measured, expected, "GB/s", source),
        );
        blamed.insert(node.to_string());
    }
    blamed
}

fn path_finding(p: &PairObservation, expected: f64) -> Finding {
    pair_finding(
        p,
        expected,
        &format!(
            "both nodes' other pairs (median {} GB/s)",
            tenths_below_10(expected)
        ),
        ": the path between them (cables, switch ports, routing), not either node",
        ExpectationSource::Fleet,
    )
}

fn unclear_finding(p: &PairObservation, reference: f64) -> Finding {
    pair_finding(
        p,
        reference,
        &format!(
            "the fleet's pairs (median {} GB/s)",
            tenths_below_10(reference)
        ),
        "; not yet clear which side: both are retested with known-good partners",
        ExpectationSource::Fleet,
    )
}

/// An Info finding on the pair `p`, slow against `against` (whose median is `expected`,
/// from `source`), and what that means (`meaning`, with its leading punctuation).
fn pair_finding(
    p: &PairObservation,
    expected: f64,
    against: &str,
    meaning: &str,
    source: ExpectationSource,
) -> Finding {
    Finding::new(
        FindingKind::Slow,
        Subject::node_pair(&p.a, &p.b),
        Metric::NodePairBusBw,
        Severity::Info,
        format!(
            "node pair {} <-> {}: NCCL busbw {} GB/s, {} {against}{meaning}",
            p.a,
            p.b,
            tenths_below_10(p.busbw),
            below(p.busbw, expected),
        ),
    )
    .with_evidence(p.busbw, expected, "GB/s", source)
}

fn partners(n: usize) -> String {
    if n == 1 {
        "1 partner".into()
    } else {
        format!("{n} partners")
    }
}

/// `41-44` or `41` when all are equal (rounded as [`tenths_below_10`]).
fn range(values: &[f64]) -> String {
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (lo, hi) = (tenths_below_10(lo), tenths_below_10(hi));
    if lo == hi { lo } else { format!("{lo}-{hi}") }
}

fn below(measured: f64, expected: f64) -> String {
    let pct = if expected > 0.0 {
        ((expected - measured) / expected * 100.0).round()
    } else {
        0.0
    };
    format!("{pct:.0}% below")
}

/// A bandwidth for a sentence: no decimals from 10 up, one below.
fn tenths_below_10(x: f64) -> String {
    if x.abs() >= 10.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

#[cfg(test)]
mod tests;
