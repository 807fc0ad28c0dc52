//! Node pairs judged against the test's baseline (rules 2b to 5b of [`super`]): a pair far
//! below what the test's pairs reached in recent runs is slow whatever this run's median,
//! so a run whose median pair is itself slow (a third of a small pool bad) still names its
//! bad nodes.

use super::{
    Localization, PairBaseline, PairObservation, PairRules, nodes_of, pair_finding, slow_nodes,
};
use crate::evaluate::baseline::{basis_words, far_below};
use crate::fleet::median;
use gpufabric_api::pair::NetTransport;
use std::collections::BTreeSet;

/// Rules 2b to 5b: returns the nodes rule 3 named against the baseline.
pub(super) fn judge(
    compared: &[&PairObservation],
    b: &PairBaseline,
    rules: &PairRules,
    out: &mut Localization,
    suspects: &mut BTreeSet<String>,
) -> BTreeSet<String> {
    let slow = |p: &PairObservation| far_below(p.busbw, &b.expectation, rules.slow_gap);
    let named = slow_nodes(compared, &slow, &mut out.findings, Some(b));
    let fine_somewhere = |n: &str| compared.iter().any(|q| q.touches(n) && !slow(q));
    // Rule 4b: a node with no pair at the baseline is a suspect.
    for n in nodes_of(compared.iter().copied()) {
        if !fine_somewhere(n) && !named.contains(n) {
            suspects.insert(n.to_string());
        }
    }
    for p in compared.iter().filter(|p| slow(p)) {
        if named.contains(&p.a) || named.contains(&p.b) {
            continue;
        }
        let unclear = suspects.contains(&p.a) || suspects.contains(&p.b);
        let meaning = if unclear {
            "; not yet clear which side: the side with no pair at the baseline is retested with a partner the baseline calls good"
        } else {
            ": the path between them (cables, switch ports, routing), not either node: both reach the baseline with other partners"
        };
        out.findings.push(pair_finding(
            p,
            b.expectation.median,
            &basis(b),
            meaning,
            gpufabric_api::findings::ExpectationSource::Baseline,
        ));
    }
    // Rule 5b: a node with a pair at the baseline has a working network; it can partner a
    // suspect's retest.
    out.known_good = nodes_of(compared.iter().copied())
        .into_iter()
        .filter(|n| fine_somewhere(n) && !named.contains(*n))
        .map(str::to_string)
        .collect();
    named
}

/// What a pair was held to: "the 412 nodes of this test run alike over 7 days (median ...)".
pub(super) fn basis(b: &PairBaseline) -> String {
    basis_words(&b.expectation, "GB/s")
}

/// The note of pairs judged against the run alone when a baseline was looked for.
pub(super) fn run_only_note(transport: Option<NetTransport>, pairs: usize) -> String {
    let over = transport.map_or(String::new(), |t| format!(" over {t}"));
    format!(
        "the {pairs} node pairs were judged against this run's own median only: the test has no baseline yet for node pairs{over} at this size (it forms from the pairs of passing nodes in complete runs); when much of the run is slow, its median is too and a slow node may not be named"
    )
}

/// Suspects, the slowest first: by the median busbw of their pairs (a suspect with no
/// pair left to compare last), then by name. The retest partners go to them in this order.
pub(super) fn slowest_first(
    suspects: BTreeSet<String>,
    compared: &[&PairObservation],
) -> Vec<String> {
    let mut keyed: Vec<(f64, String)> = suspects
        .into_iter()
        .map(|n| {
            let bw: Vec<f64> = compared
                .iter()
                .filter(|p| p.touches(&n))
                .map(|p| p.busbw)
                .collect();
            (median(&bw).unwrap_or(f64::INFINITY), n)
        })
        .collect();
    keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
    keyed.into_iter().map(|(_, n)| n).collect()
}
