//! The run's node pairs: every pair from its rank-0 node's record, and the phase as a table.

use super::run_name;
use crate::doc::{Doc, Table, fmt_opt, wire};
use gpufabric_api::FabricTestRun;
use gpufabric_api::pair::{NetTransport, PairState};
use gpufabric_api::shard::FabricTestRunShard;
use serde::Serialize;

/// One node pair of a run, from its rank-0 node's record.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PairRow {
    pub round: u32,
    pub index: u32,
    /// A retest of a suspect against a known-good partner.
    pub confirmation: bool,
    pub a: String,
    pub b: String,
    pub state: PairState,
    pub busbw_gbps: Option<f64>,
    pub transport: Option<NetTransport>,
    pub message: Option<String>,
}

/// Every pair the shards of a run record, each once (from its rank-0 node), by round.
pub fn pair_rows(shards: &[FabricTestRunShard]) -> Vec<PairRow> {
    let mut pairs: Vec<PairRow> = shards
        .iter()
        .filter_map(|s| s.status.as_ref())
        .flat_map(|s| &s.nodes)
        .flat_map(|e| {
            e.pairs.iter().filter(|p| p.rank == 0).map(|p| PairRow {
                round: p.round,
                index: p.index,
                confirmation: p.confirmation,
                a: e.node.clone(),
                b: p.partner.clone(),
                state: p.state,
                busbw_gbps: p.busbw_gbps,
                transport: p.transport,
                message: p.message.clone(),
            })
        })
        .collect();
    pairs.sort_by_key(|p| (p.round, p.index));
    pairs
}

/// The confirmation rounds of a node-pair phase in words: ", round 3 retests 5 suspect(s)",
/// ", rounds 3 and 4 retest 7 suspect(s)" with a second, or nothing without one.
pub fn retest_words(np: &gpufabric_api::pair::NodePairsStatus) -> String {
    match (np.confirmation_round, np.second_confirmation_round) {
        (Some(c), Some(d)) => format!(", rounds {c} and {d} retest {} suspect(s)", np.retested),
        (Some(c), None) => format!(", round {c} retests {} suspect(s)", np.retested),
        _ => String::new(),
    }
}

/// The run's node-pair phase: its rounds, and every pair of it (see [`pair_rows`]). Empty
/// for a run without one.
pub fn pairs_doc(r: &FabricTestRun, pairs: &[PairRow]) -> Doc {
    let mut doc = Doc::default();
    let Some(np) = r.status.as_ref().and_then(|s| s.node_pairs.as_ref()) else {
        return doc;
    };
    doc.heading(format!(
        "run {}: node pairs ({} of the nodes that passed their own check, {} rounds{}, {} pairs: {} measured, {} not measured, {} errored; median {} GB/s)",
        run_name(r),
        np.candidates,
        np.rounds,
        retest_words(np),
        np.pairs,
        np.measured,
        np.not_measured,
        np.errored,
        fmt_opt(np.within.as_ref().and_then(|w| w.median_gbps), 1),
    ));
    // Why the phase did not run, or which pairs it could not measure and why.
    if let Some(m) = &np.message {
        doc.line(format!("note: {m}"));
    }
    let mut t = Table::new(&[
        "ROUND",
        "PAIR",
        "STATE",
        "BUSBW GB/s",
        "TRANSPORT",
        "MESSAGE",
    ]);
    for p in pairs {
        t.push(vec![
            format!(
                "{}{}",
                p.round,
                if p.confirmation { " (retest)" } else { "" }
            ),
            format!("{} <-> {}", p.a, p.b),
            wire(&p.state),
            fmt_opt(p.busbw_gbps, 1),
            p.transport.map(|t| wire(&t)).unwrap_or_default(),
            p.message.clone().unwrap_or_default(),
        ]);
    }
    doc.table(t);
    doc
}
