//! The node-pair phase of a run, without a client: the plan written into the nodes'
//! records, where a pair stands from its two pods, what to do next, and what the pairs of
//! a run say once every one has ended.
//!
//! # A pair, step by step ([`decide`])
//! 1. `Pending`: the rank-0 pod is created (within the phase's concurrency).
//! 2. `Listening`: once the rank-0 pod has an IP, the rank-1 pod is created with it. A
//!    rank-1 pod the API server refuses deletes the rank-0 pod: a pair is all or nothing,
//!    and such a pair counts against neither node.
//! 3. `Joined`: both pods exist; the pair settles when both have ended (or when rank 0 has
//!    ended before rank 1 existed).
//! 4. Past the pair's deadline (the agent timeout and the operator's margin from the
//!    rank-0 pod's creation), its pods are stopped: two ranks still running hung
//!    (`Errored`), a pod that never started was not measured.
//!
//! A pair settles `Measured` from rank 0's document, `NotMeasured` when either rank says
//! so (a peer that never arrived) or a pod never ran for a reason outside the nodes, and
//! `Errored` otherwise (the ranks met and the test failed).
//!
//! Whatever the state, each rank's document carries its node's network ports: they are
//! judged against the node's record of its previous pair test ([`NicHistory`], read from
//! the node through the caller only when the pair settles), and the settled outcome says
//! which records to write next (`health::nics` rules 3 and 4).

use super::rank::{GroupOutcome, RankEnd, RankPod, cut, rank_pod, still_running};
use super::rounds::RoundPlan;
use gpufabric_api::findings::{Finding, Severity};
use gpufabric_api::nic_counters::NicCounters;
use gpufabric_api::pair::{
    NetTransport, NodePairResult, NodePairsStatus, PairRecord, PairSetSummary, PairState,
};
use gpufabric_api::run::NodeRunResult;
use gpufabric_health::nics::{NicRules, next_record, nic_findings};
use gpufabric_health::pairs::{
    PairBaseline, PairObservation, PairRules, localize_against, require_confirmation,
};
use k8s_openapi::api::core::v1::Pod;
use std::collections::{BTreeMap, BTreeSet};

/// One pair of a round, by the indexes of its two nodes' results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    pub round: u32,
    pub index: u32,
    /// Rank 0's node.
    pub a: usize,
    /// Rank 1's node.
    pub b: usize,
}

/// Writes the rounds of `plan` into both nodes' records, numbered from `first_round`
/// (1-based); nodes the results do not hold are left out. Returns the rounds written.
pub fn write_plan(
    entries: &mut [NodeRunResult],
    plan: &RoundPlan,
    first_round: u32,
    confirmation: bool,
) -> u32 {
    let at: BTreeMap<String, usize> = entries
        .iter()
        .enumerate()
        .map(|(i, e)| (e.node.clone(), i))
        .collect();
    let mut written = 0;
    for round in &plan.rounds {
        let number = first_round + written;
        let mut index = 0;
        for p in &round.pairs {
            let (Some(&a), Some(&b)) = (at.get(&p.a), at.get(&p.b)) else {
                continue;
            };
            let across = round.set == super::rounds::PairSet::Across;
            for (me, partner, rank) in [(a, &p.b, 0), (b, &p.a, 1)] {
                entries[me].pairs.push(PairRecord {
                    round: number,
                    index,
                    partner: partner.clone(),
                    rank,
                    across,
                    confirmation,
                    ..Default::default()
                });
            }
            index += 1;
        }
        if index > 0 {
            written += 1;
        }
    }
    written
}

/// The pairs of round `round`, in pair order.
pub fn slots(entries: &[NodeRunResult], round: u32) -> Vec<Slot> {
    let at: BTreeMap<&str, usize> = entries
        .iter()
        .enumerate()
        .map(|(i, e)| (e.node.as_str(), i))
        .collect();
    let mut out: Vec<Slot> = entries
        .iter()
        .enumerate()
        .flat_map(|(a, e)| {
            e.pairs
                .iter()
                .filter(move |r| r.round == round && r.rank == 0)
                .map(move |r| (a, r))
        })
        .filter_map(|(a, r)| {
            Some(Slot {
                round,
                index: r.index,
                a,
                b: *at.get(r.partner.as_str())?,
            })
        })
        .collect();
    out.sort_by_key(|s| s.index);
    out
}

/// Rank 0's record of `slot` (where the pair's state is kept).
pub fn record<'a>(entries: &'a [NodeRunResult], slot: &Slot) -> Option<&'a PairRecord> {
    entries[slot.a]
        .pairs
        .iter()
        .find(|r| r.round == slot.round && r.index == slot.index && r.rank == 0)
}

/// Sets the state of both records of `slot`.
pub fn set_state(entries: &mut [NodeRunResult], slot: &Slot, state: PairState) {
    for i in [slot.a, slot.b] {
        if let Some(r) = record_mut(&mut entries[i], slot) {
            r.state = state;
        }
    }
}

/// The UID recorded for the pod of `rank` (0 on node a, 1 on node b) of `slot`.
pub fn pod_uid<'a>(entries: &'a [NodeRunResult], slot: &Slot, rank: u32) -> Option<&'a str> {
    let i = if rank == 0 { slot.a } else { slot.b };
    entries[i]
        .pairs
        .iter()
        .find(|r| r.round == slot.round && r.index == slot.index)
        .and_then(|r| r.pod_uid.as_deref())
}

/// Records the UID of the pod of `rank` of `slot`, made now.
pub fn set_pod_uid(entries: &mut [NodeRunResult], slot: &Slot, rank: u32, uid: String) {
    let i = if rank == 0 { slot.a } else { slot.b };
    if let Some(r) = record_mut(&mut entries[i], slot) {
        r.pod_uid = Some(uid);
    }
}

fn record_mut<'a>(e: &'a mut NodeRunResult, slot: &Slot) -> Option<&'a mut PairRecord> {
    e.pairs
        .iter_mut()
        .find(|r| r.round == slot.round && r.index == slot.index)
}

/// How one pod of a pair ended.
pub type PairEnd = RankEnd<NodePairResult>;

/// Where one pod of a pair stands.
pub type PairPod = RankPod<NodePairResult>;

/// Where a pair pod stands, from its status alone.
pub fn pair_pod(pod: &Pod) -> PairPod {
    rank_pod(pod)
}

/// What a settled pair says, for both of its records.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PairOutcome {
    pub state: PairState,
    pub busbw: Option<f64>,
    pub transport: Option<NetTransport>,
    /// By rank.
    pub nics_used: [Option<u32>; 2],
    /// Port findings by rank, from each rank's own document.
    pub nic_findings: [Vec<Finding>; 2],
    /// The port counter records to write on the nodes, by rank; None: nothing new to keep.
    pub nic_records: [Option<NicCounters>; 2],
    pub message: Option<String>,
}

/// What a pair's port counters are judged against: the run reading them, when (RFC 3339,
/// the time the records written are stamped with), and a node's record of its previous
/// pair test, by node name; `previous` is called only for the nodes of a pair that
/// settles, and only for those whose rank wrote a document.
#[derive(Clone, Copy)]
pub struct NicHistory<'a> {
    pub run: &'a str,
    pub at: &'a str,
    pub previous: &'a (dyn Fn(&str) -> Option<NicCounters> + Sync),
}

impl GroupOutcome for PairOutcome {
    fn errored(&self) -> bool {
        self.state == PairState::Errored
    }
    fn not_measured(why: String) -> Self {
        PairOutcome::not_measured(why)
    }
}

impl PairOutcome {
    pub(crate) fn not_measured(message: impl Into<String>) -> Self {
        PairOutcome {
            state: PairState::NotMeasured,
            message: Some(cut(&message.into())),
            ..Default::default()
        }
    }
    fn errored(message: impl Into<String>) -> Self {
        PairOutcome {
            state: PairState::Errored,
            message: Some(cut(&message.into())),
            ..Default::default()
        }
    }
}

/// The next step for one pair.
#[derive(Debug, Clone, PartialEq)]
pub enum PairStep {
    CreateRank0,
    CreateRank1 {
        ip: String,
    },
    Wait,
    /// Delete whatever pods are left, then settle.
    Stop(PairOutcome),
    Settle(PairOutcome),
}

/// The next step for a pair in `state` whose pods stand as `p0`, `p1` (by rank), on
/// nodes `nodes` (by rank); `past_deadline`: the pair's deadline has passed; `nics`: what
/// the ports read by the pair are judged against.
pub fn decide(
    state: PairState,
    (p0, p1): (&PairPod, &PairPod),
    nodes: [&str; 2],
    past_deadline: bool,
    nics: &NicHistory<'_>,
) -> PairStep {
    if state.is_final() {
        return PairStep::Wait;
    }
    match (p0, p1) {
        (PairPod::Absent, _) if state == PairState::Pending => PairStep::CreateRank0,
        (PairPod::Absent, _) => PairStep::Stop(PairOutcome::not_measured(format!(
            "the rank-0 pod on {} is gone",
            nodes[0]
        ))),
        (PairPod::Ended(e0), PairPod::Ended(e1)) => {
            PairStep::Settle(outcome([Some(e0), Some(e1)], nodes, nics))
        }
        (PairPod::Ended(e0), PairPod::Absent) => {
            PairStep::Settle(outcome([Some(e0), None], nodes, nics))
        }
        (PairPod::Ended(e0), _) if past_deadline => {
            PairStep::Stop(outcome([Some(e0), None], nodes, nics))
        }
        (_, PairPod::Absent) if state == PairState::Joined => PairStep::Stop(
            PairOutcome::not_measured(format!("the rank-1 pod on {} is gone", nodes[1])),
        ),
        (p0, PairPod::Absent) if !past_deadline => match p0.ip() {
            Some(ip) => PairStep::CreateRank1 { ip: ip.to_string() },
            None => PairStep::Wait,
        },
        _ if !past_deadline => PairStep::Wait,
        // Rank 0 stuck while rank 1 ended: what rank 1 says, with rank 0 named.
        (PairPod::Running { .. }, PairPod::Ended(e1)) => {
            let mut o = outcome([None, Some(e1)], nodes, nics);
            o.message = Some(still_running(0, nodes[0], "pair", o.message));
            PairStep::Stop(o)
        }
        (PairPod::Running { .. }, PairPod::Running { .. }) => PairStep::Stop(PairOutcome::errored(
            "both ranks were still running at the pair's deadline (a hang in NCCL between the nodes?)",
        )),
        (p0, p1) => {
            let waiting = [p0, p1]
                .iter()
                .zip(nodes)
                .find(|(p, _)| matches!(p, PairPod::Waiting { .. } | PairPod::Absent))
                .map(|(_, n)| n)
                .unwrap_or(nodes[1]);
            PairStep::Stop(PairOutcome::not_measured(format!(
                "the pod on {waiting} never started before the pair's deadline"
            )))
        }
    }
}

/// The port findings of each rank's document (on the rank's node, against its record)
/// and the records to write next, by rank.
fn nic_outcome(
    docs: [Option<&NodePairResult>; 2],
    nodes: [&str; 2],
    nics: &NicHistory<'_>,
) -> ([Vec<Finding>; 2], [Option<NicCounters>; 2]) {
    let mut findings: [Vec<Finding>; 2] = Default::default();
    let mut records: [Option<NicCounters>; 2] = Default::default();
    for (rank, d) in docs.into_iter().enumerate() {
        let Some(d) = d else { continue };
        let previous = (nics.previous)(nodes[rank]);
        let previous = previous.as_ref();
        let f = nic_findings(
            nodes[rank],
            &d.nics,
            previous,
            nics.run,
            &NicRules::default(),
        );
        records[rank] = next_record(nodes[rank], &d.nics, previous, &f, nics.run, nics.at);
        findings[rank] = f;
    }
    (findings, records)
}

/// What the ends of a pair's pods say, by rank (rank 1: None when it never ran).
fn outcome(
    [e0, e1]: [Option<&PairEnd>; 2],
    nodes: [&str; 2],
    nics: &NicHistory<'_>,
) -> PairOutcome {
    let doc = |e: Option<&PairEnd>| match e {
        Some(PairEnd::Document(d)) => Some(d.as_ref().clone()),
        _ => None,
    };
    let (d0, d1) = (doc(e0), doc(e1));
    let (nic_findings, nic_records) = nic_outcome([d0.as_ref(), d1.as_ref()], nodes, nics);
    let nics_used = [
        d0.as_ref().map(|d| d.nics_used),
        d1.as_ref().map(|d| d.nics_used),
    ];
    let with_docs = |mut o: PairOutcome| {
        o.nic_findings = nic_findings.clone();
        o.nic_records = nic_records.clone();
        o.nics_used = nics_used;
        o
    };
    for d in [&d0, &d1].into_iter().flatten() {
        if let Some(nm) = &d.not_measured {
            return with_docs(PairOutcome::not_measured(nm.message.clone()));
        }
    }
    for e in [e0, e1].into_iter().flatten() {
        if let PairEnd::NotMeasured(m) = e {
            return with_docs(PairOutcome::not_measured(m.clone()));
        }
    }
    if let Some(d) = &d0
        && d.errors.is_empty()
        && d.collectives.iter().all(|c| c.wrong == 0)
        && let Some(busbw) = d.busbw()
    {
        let socket = [&d0, &d1]
            .into_iter()
            .flatten()
            .any(|d| d.transport == Some(NetTransport::Socket));
        return with_docs(PairOutcome {
            state: PairState::Measured,
            busbw: Some(busbw),
            transport: if socket {
                Some(NetTransport::Socket)
            } else {
                d.transport
            },
            ..Default::default()
        });
    }
    let why = [(0, &d0, e0), (1, &d1, e1)]
        .into_iter()
        .find_map(|(rank, d, e)| match (d, e) {
            (Some(d), _) if !d.errors.is_empty() => {
                Some(format!("rank {rank}: {}", d.errors[0].message))
            }
            (Some(d), _) if d.collectives.iter().any(|c| c.wrong > 0) => {
                Some(format!("rank {rank}: wrong results in a collective"))
            }
            (_, Some(PairEnd::Failed(m))) => Some(format!("rank {rank}: {m}")),
            _ => None,
        })
        .unwrap_or_else(|| "the pair ended without a measurement".into());
    with_docs(PairOutcome::errored(why))
}

/// Writes a settled pair's outcome into both of its records; a port finding that the
/// node's latest earlier reading also had counts one more reading (`nicReadings`).
pub fn settle(entries: &mut [NodeRunResult], slot: &Slot, o: &PairOutcome) {
    for (rank, i) in [slot.a, slot.b].into_iter().enumerate() {
        let readings = nic_readings(&entries[i], slot, &o.nic_findings[rank]);
        if let Some(r) = record_mut(&mut entries[i], slot) {
            r.state = o.state;
            r.busbw_gbps = o.busbw;
            r.transport = o.transport;
            r.nics_used = o.nics_used[rank];
            r.nic_findings = o.nic_findings[rank].clone();
            r.nic_readings = readings;
            r.message = o.message.clone();
        }
    }
}

/// How many readings of the node's worst port finding `found` makes, with the node's
/// latest earlier record that kept one (shards keep port findings on that record only).
fn nic_readings(e: &NodeRunResult, slot: &Slot, found: &[Finding]) -> u32 {
    let Some(worst) = found.iter().max_by_key(|f| f.severity) else {
        return 0;
    };
    let earlier = e
        .pairs
        .iter()
        .filter(|r| !(r.round == slot.round && r.index == slot.index))
        .rev()
        .find(|r| !r.nic_findings.is_empty());
    let same = |r: &&PairRecord| {
        r.nic_findings
            .iter()
            .any(|f| f.kind == worst.kind && f.subject == worst.subject)
    };
    1 + earlier.filter(same).map_or(0, |r| r.nic_readings.max(1))
}

/// Every pair of the run as the localization rules read it.
pub fn observations(entries: &[NodeRunResult]) -> Vec<PairObservation> {
    PairObservation::from_records(
        entries
            .iter()
            .flat_map(|e| e.pairs.iter().map(move |r| (e.node.as_str(), r))),
    )
}

pub use gpufabric_health::pairs::{confirmation_pairs, retest_pairs};

/// Nodes a confirmation round retested: either side of a confirmation pair that was
/// measured or failed (not one never measured).
pub fn retested(entries: &[NodeRunResult]) -> BTreeSet<String> {
    entries
        .iter()
        .filter(|e| {
            e.pairs.iter().any(|r| {
                r.confirmation && matches!(r.state, PairState::Measured | PairState::Errored)
            })
        })
        .map(|e| e.node.clone())
        .collect()
}

/// The node's latest pair record that found something on its ports (the shards keep port
/// findings on that record only).
fn latest_port_reading(e: &NodeRunResult) -> Option<&PairRecord> {
    e.pairs.iter().rev().find(|r| !r.nic_findings.is_empty())
}

/// The nodes whose latest port reading of the run has a Critical finding that only one of
/// their pair tests read: a retest reads the ports once more, and a second reading of the
/// same finding confirms it within the run ([`confirmed_within_run`]).
pub fn unconfirmed_ports(entries: &[NodeRunResult]) -> BTreeSet<String> {
    entries
        .iter()
        .filter(|e| {
            latest_port_reading(e).is_some_and(|r| {
                r.nic_readings < 2
                    && r.nic_findings
                        .iter()
                        .any(|f| f.severity == Severity::Critical)
            })
        })
        .map(|e| e.node.clone())
        .collect()
}

/// What the run's pairs say once every one has ended.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Judged {
    pub findings: Vec<Finding>,
    /// Set when the pairs were judged against the run alone though a baseline was looked
    /// for (`health::pairs::Localization::basis`).
    pub basis: Option<String>,
}

/// What the run's pairs say once every one has ended: the localization against
/// `baselines` (as `health::pairs::localize_against`) with rule 6 applied (only retested
/// nodes are blamed), and each node's port findings (from its latest test that read them).
pub fn findings(
    entries: &[NodeRunResult],
    rules: &PairRules,
    baselines: Option<&[PairBaseline]>,
) -> Judged {
    let mut loc = localize_against(&observations(entries), rules, baselines);
    require_confirmation(&mut loc, &retested(entries));
    let mut out = loc.findings;
    for e in entries {
        if let Some(r) = latest_port_reading(e) {
            out.extend(r.nic_findings.iter().cloned());
        }
    }
    Judged {
        findings: out,
        basis: loc.basis,
    }
}

/// Adds `note` to the phase's message, once.
pub fn note(status: &mut NodePairsStatus, note: &str) {
    crate::status::add_note(&mut status.message, note);
}

/// Nodes that a Critical finding on the node (or one of its ports) blames.
pub fn blamed(findings: &[Finding]) -> BTreeMap<&str, Vec<&Finding>> {
    let mut out: BTreeMap<&str, Vec<&Finding>> = BTreeMap::new();
    for f in findings.iter().filter(|f| f.severity == Severity::Critical) {
        if matches!(
            f.subject.kind(),
            gpufabric_api::SubjectKind::Node | gpufabric_api::SubjectKind::Nic
        ) {
            out.entry(f.subject.node_name()).or_default().push(f);
        }
    }
    out
}

/// Whether the findings that blame a node were confirmed within the run (`entry`: the
/// node's result, with its pair records): a finding on the node itself stands only after a
/// retest against a known-good partner (health::pairs rule 6); a port finding is a reading
/// of the node's sysfs, which every pair test of the node takes again, so it is confirmed
/// when at least two of the node's pair tests of the run found the same on that port
/// (`nicReadings`, counted as the pairs settle).
pub fn confirmed_within_run(entry: &NodeRunResult, blaming: &[&Finding]) -> bool {
    blaming.iter().any(|f| match f.subject.kind() {
        gpufabric_api::SubjectKind::Node => true,
        gpufabric_api::SubjectKind::Nic => entry.pairs.iter().any(|r| {
            r.nic_readings >= 2
                && r.nic_findings
                    .iter()
                    .any(|g| g.kind == f.kind && g.subject == f.subject)
        }),
        _ => false,
    })
}

/// What the phase says when some of its pairs ended not measured: how many, and the reason
/// most of them gave. A pair not measured judges neither of its nodes, so a node whose only
/// pairs were not measured is spared by the phase: the status and an Event say why, with
/// the counts, rather than a phase that reads as done and clean. `None` when every pair
/// was measured or errored.
pub fn unmeasured_note(entries: &[NodeRunResult]) -> Option<String> {
    let records: Vec<(&str, &PairRecord)> = pair_records(entries).collect();
    let unmeasured = || {
        records
            .iter()
            .filter(|(_, r)| r.state == PairState::NotMeasured)
    };
    let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
    for (_, r) in unmeasured() {
        *reasons
            .entry(r.message.as_deref().unwrap_or("no reason recorded"))
            .or_default() += 1;
    }
    let missed: usize = reasons.values().sum();
    let (reason, most) = reasons
        .iter()
        .max_by_key(|(m, n)| (**n, std::cmp::Reverse(**m)))?;
    let spared: BTreeSet<&str> = unmeasured()
        .flat_map(|(node, r)| [*node, r.partner.as_str()])
        .collect();
    // The reason last: an Event's note may be cut at its end.
    Some(format!(
        "{missed} of {} node pairs not measured, judging none of their {} nodes; the most common reason ({most} of {missed}): {reason}",
        records.len(),
        spared.len()
    ))
}

/// Every pair of the run once, from rank 0's record (where its state is kept), with the
/// node that holds it.
fn pair_records(entries: &[NodeRunResult]) -> impl Iterator<Item = (&str, &PairRecord)> {
    entries
        .iter()
        .flat_map(|e| e.pairs.iter().map(move |r| (e.node.as_str(), r)))
        .filter(|(_, r)| r.rank == 0)
}

/// Counts of the pairs (each once, from rank 0's record) and the bandwidth of the pairs
/// within and across topology groups, into `status`.
pub fn summarize(entries: &[NodeRunResult], status: &mut NodePairsStatus) {
    let records: Vec<&PairRecord> = pair_records(entries).map(|(_, r)| r).collect();
    let count = |s: PairState| records.iter().filter(|r| r.state == s).count() as u32;
    status.pairs = records.len() as u32;
    status.measured = count(PairState::Measured);
    status.not_measured = count(PairState::NotMeasured);
    status.errored = count(PairState::Errored);
    let set = |across: bool| {
        let mut bw: Vec<f64> = records
            .iter()
            .filter(|r| r.across == across && r.state == PairState::Measured)
            .filter_map(|r| r.busbw_gbps)
            .collect();
        bw.sort_by(f64::total_cmp);
        (!bw.is_empty()).then(|| PairSetSummary {
            measured: bw.len() as u32,
            median_gbps: gpufabric_health::fleet::median(&bw).map(|m| (m * 10.0).round() / 10.0),
            min_gbps: bw.first().copied(),
        })
    };
    status.within = set(false);
    status.across = set(true);
}

#[cfg(test)]
mod nic_tests;
#[cfg(test)]
mod tests;
