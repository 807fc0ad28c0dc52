use super::*;
use crate::pairs::rounds::{Candidate, plan_rounds};
use gpufabric_api::pair::{NotMeasured, PAIR_SCHEMA, PairCollective};
use gpufabric_api::result::{Backend, ErrorKind, Phase, PhaseError};
use gpufabric_api::suite::{Collective, Pairing};
use gpufabric_api::{FindingKind, Subject};
use gpufabric_health::pairs::localize;
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus, PodStatus,
};

pub(super) fn entries(n: usize) -> Vec<NodeRunResult> {
    (0..n)
        .map(|i| NodeRunResult {
            node: format!("n{i}"),
            ..Default::default()
        })
        .collect()
}

fn planned(n: usize) -> Vec<NodeRunResult> {
    let mut e = entries(n);
    let candidates: Vec<Candidate> = e
        .iter()
        .map(|e| Candidate {
            name: e.node.clone(),
            group: None,
        })
        .collect();
    let rounds = write_plan(
        &mut e,
        &plan_rounds(&candidates, Pairing::Ring, 0),
        1,
        false,
    );
    assert_eq!(rounds, 2);
    e
}

pub(super) fn doc(rank: u32, busbw: f64) -> NodePairResult {
    NodePairResult {
        schema: PAIR_SCHEMA.into(),
        group: "run/r1/p0".into(),
        nodes: ["n0".into(), "n1".into()],
        rank,
        backend: Backend::Sim,
        started_at: "2026-11-24T02:00:00Z".into(),
        duration_s: 1.0,
        gpus_per_node: 8,
        collectives: vec![PairCollective {
            collective: Collective::AllReduce,
            bytes: 1 << 30,
            time_us: 1.0,
            algbw: 1.0,
            busbw,
            wrong: 0,
        }],
        transport: Some(NetTransport::Ib),
        nics_used: 8,
        nics: vec![],
        not_measured: None,
        errors: vec![],
    }
}

pub(super) fn ended(d: NodePairResult) -> PairPod {
    PairPod::Ended(PairEnd::Document(Box::new(d)))
}

pub(super) fn running(ip: &str) -> PairPod {
    PairPod::Running {
        ip: Some(ip.into()),
    }
}

pub(super) const NODES: [&str; 2] = ["n0", "n1"];
/// No port counter records on either node.
const NO_NICS: NicHistory<'static> = NicHistory {
    run: "r1",
    at: "",
    previous: &no_record,
};

pub(super) fn no_record(_: &str) -> Option<NicCounters> {
    None
}

/// Reads `records` (by rank) as the records of the nodes of [`NODES`].
pub(super) fn on_nodes(records: [Option<NicCounters>; 2]) -> impl Fn(&str) -> Option<NicCounters> {
    move |node| records[NODES.iter().position(|n| *n == node)?].clone()
}

#[test]
fn the_plan_is_written_on_both_nodes_and_read_back_as_slots() {
    let e = planned(4);
    for n in &e {
        assert_eq!(n.pairs.len(), 2, "{}: {:?}", n.node, n.pairs);
        assert!(n.pairs.iter().all(|r| r.state == PairState::Pending));
    }
    for round in [1, 2] {
        let slots = slots(&e, round);
        assert_eq!(slots.len(), 2, "round {round}");
        let mut seen: Vec<usize> = slots.iter().flat_map(|s| [s.a, s.b]).collect();
        seen.sort_unstable();
        assert_eq!(seen, vec![0, 1, 2, 3], "a matching: each node once");
        for s in &slots {
            let r0 = record(&e, s).expect("rank 0 record");
            assert_eq!(r0.partner, e[s.b].node);
            let r1 = e[s.b]
                .pairs
                .iter()
                .find(|r| r.round == round && r.index == s.index)
                .expect("rank 1 record");
            assert_eq!((r1.rank, r1.partner.as_str()), (1, e[s.a].node.as_str()));
        }
    }
    assert!(slots(&e, 3).is_empty());
}

/// What `decide` does with a pair on [`NODES`] whose nodes have no port records.
fn step(state: PairState, pods: (&PairPod, &PairPod), past_deadline: bool) -> PairStep {
    decide(state, pods, NODES, past_deadline, &NO_NICS)
}

#[test]
fn a_pair_starts_rank_0_then_rank_1_with_its_ip() {
    let absent = PairPod::Absent;
    let waiting = PairPod::Waiting { ip: None };
    let (r0, r1) = (running("10.0.0.7"), running("10.0.0.8"));
    let rank1_joins = PairStep::CreateRank1 {
        ip: "10.0.0.7".into(),
    };
    // (state, rank 0's pod, rank 1's pod, past the deadline, the step, why)
    let table = [
        (
            PairState::Pending,
            &absent,
            &absent,
            false,
            PairStep::CreateRank0,
            "rank 0 first",
        ),
        (
            PairState::Listening,
            &waiting,
            &absent,
            false,
            PairStep::Wait,
            "rank 0 has no IP yet",
        ),
        (
            PairState::Listening,
            &r0,
            &absent,
            false,
            rank1_joins,
            "rank 1 joins rank 0's IP",
        ),
        (
            PairState::Joined,
            &r0,
            &r1,
            false,
            PairStep::Wait,
            "both ranks run",
        ),
        (
            PairState::Measured,
            &absent,
            &absent,
            true,
            PairStep::Wait,
            "a settled pair is left alone",
        ),
    ];
    for (state, rank0, rank1, past, want, why) in table {
        assert_eq!(step(state, (rank0, rank1), past), want, "{why}");
    }
}

#[test]
fn a_measured_pair_settles_from_rank_0s_document() {
    let s = step(
        PairState::Joined,
        (&ended(doc(0, 190.5)), &ended(doc(1, 189.0))),
        false,
    );
    let PairStep::Settle(o) = s else {
        panic!("{s:?}")
    };
    assert_eq!(o.state, PairState::Measured);
    assert_eq!(o.busbw, Some(190.5));
    assert_eq!(o.transport, Some(NetTransport::Ib));
    assert_eq!(o.nics_used, [Some(8), Some(8)]);

    let mut e = planned(4);
    let slot = slots(&e, 1)[0];
    settle(&mut e, &slot, &o);
    for i in [slot.a, slot.b] {
        let r = e[i].pairs.iter().find(|r| r.round == 1).expect("record");
        assert_eq!((r.state, r.busbw_gbps), (PairState::Measured, Some(190.5)));
    }
    let obs = observations(&e);
    assert_eq!(obs.len(), 1, "one observation per pair, from rank 0");
    assert_eq!(obs[0].a, e[slot.a].node);
}

#[test]
fn a_peer_that_never_arrived_is_not_measured_and_a_hang_is_errored() {
    let mut d = doc(0, 0.0);
    d.collectives.clear();
    d.not_measured = Some(NotMeasured {
        peer: Some("n1".into()),
        message: "rank 1 (node n1) did not arrive within 20s".into(),
    });
    let s = step(PairState::Listening, (&ended(d), &PairPod::Absent), false);
    let PairStep::Settle(o) = s else {
        panic!("{s:?}")
    };
    assert_eq!(o.state, PairState::NotMeasured);
    assert!(o.message.as_deref().is_some_and(|m| m.contains("n1")));

    // Rank 0 running with rank 1 as below: the pair is stopped in the state, its message
    // saying what the row says. (rank 1's pod, past the deadline, state, says, why)
    let rank0 = running("a");
    let table = [
        (
            running("b"),
            true,
            PairState::Errored,
            None,
            "both ranks hung",
        ),
        (
            PairPod::Waiting { ip: None },
            true,
            PairState::NotMeasured,
            Some("n1 never started"),
            "rank 1 never started",
        ),
        (
            PairPod::Absent,
            false,
            PairState::NotMeasured,
            None,
            "a rank-1 pod that is gone ends the pair",
        ),
    ];
    for (rank1, past, state, says, why) in table {
        let s = step(PairState::Joined, (&rank0, &rank1), past);
        assert!(
            matches!(&s, PairStep::Stop(o) if o.state == state
                && says.is_none_or(|says| o.message.as_deref().is_some_and(|m| m.contains(says)))),
            "{why}: {s:?}"
        );
    }
    // Rank 0 stuck past the deadline while rank 1 ended on a timeout: the pair hung, errored
    // with rank 1's reason, rank 0 named; never "never started".
    let mut timed_out = doc(1, 0.0);
    timed_out.collectives.clear();
    timed_out.errors.push(PhaseError {
        phase: Phase::NodePair,
        kind: ErrorKind::Timeout,
        message: "all_reduce did not finish within 10 s".into(),
    });
    let s = step(PairState::Joined, (&running("a"), &ended(timed_out)), true);
    let PairStep::Stop(o) = &s else {
        panic!("{s:?}")
    };
    assert_eq!(o.state, PairState::Errored, "{s:?}");
    let m = o.message.as_deref().unwrap_or_default();
    assert!(
        m.starts_with("rank 0 on n0 was still running at the pair's deadline")
            && m.contains("rank 1: all_reduce did not finish")
            && !m.contains("never started"),
        "{m}"
    );
}

#[test]
fn ranks_that_met_and_failed_are_errored_with_the_reason() {
    let crashed = PairPod::Ended(PairEnd::Failed("the agent exited with code 134".into()));
    let s = step(PairState::Joined, (&crashed, &ended(doc(1, 150.0))), false);
    let PairStep::Settle(o) = s else {
        panic!("{s:?}")
    };
    assert_eq!(o.state, PairState::Errored);
    assert_eq!(
        o.message.as_deref(),
        Some("rank 0: the agent exited with code 134")
    );
    let mut wrong = doc(0, 150.0);
    wrong.collectives[0].wrong = 3;
    // (rank 0's pod, rank 1's pod, the state the pair settles in, why)
    let table = [
        (
            ended(wrong),
            ended(doc(1, 150.0)),
            PairState::Errored,
            "wrong results",
        ),
        (
            ended(doc(0, 150.0)),
            PairPod::Ended(PairEnd::NotMeasured("image pull".into())),
            PairState::NotMeasured,
            "a pod the cluster never ran counts against neither node",
        ),
    ];
    for (rank0, rank1, state, why) in table {
        let s = step(PairState::Joined, (&rank0, &rank1), false);
        assert!(
            matches!(&s, PairStep::Settle(o) if o.state == state),
            "{why}: {s:?}"
        );
    }
}

fn pod(status: PodStatus) -> Pod {
    Pod {
        status: Some(status),
        ..Default::default()
    }
}

fn container(state: ContainerState) -> PodStatus {
    PodStatus {
        phase: Some("Running".into()),
        pod_ip: Some("10.1.1.1".into()),
        container_statuses: Some(vec![ContainerStatus {
            name: crate::pods::CONTAINER.into(),
            state: Some(state),
            ..Default::default()
        }]),
        ..Default::default()
    }
}

#[test]
fn pair_pods_are_read_from_their_status() {
    let text = serde_json::to_string(&doc(0, 170.0)).expect("serialises");
    let done = pod(container(ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: 0,
            message: Some(text),
            ..Default::default()
        }),
        ..Default::default()
    }));
    assert!(
        matches!(pair_pod(&done), PairPod::Ended(PairEnd::Document(d)) if d.busbw() == Some(170.0))
    );
    let garbage = pod(container(ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: 139,
            message: Some("{\"schema\":".into()),
            ..Default::default()
        }),
        ..Default::default()
    }));
    assert!(matches!(pair_pod(&garbage), PairPod::Ended(PairEnd::Failed(m)) if m.contains("139")));
    // A rank that ended without a document for a reason outside its node (other work held
    // its GPUs, the image's NCCL does not load): the pair is not measured, not failed, so
    // no 0 GB/s pair is held against either node.
    for (code, message, says) in [
        (
            14,
            "the GPUs are in use by other work: GPU 0: 40.0 GiB of 79.6 GiB in use",
            "(exit code 14): the GPUs are in use by other work",
        ),
        (
            11,
            "libnccl.so could not be loaded",
            "could not be loaded (exit code 11)",
        ),
    ] {
        let spared = pod(PodStatus {
            phase: Some("Failed".into()),
            ..container(ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: code,
                    message: Some(message.into()),
                    ..Default::default()
                }),
                ..Default::default()
            })
        });
        assert!(
            matches!(pair_pod(&spared), PairPod::Ended(PairEnd::NotMeasured(m)) if m.contains(says)),
            "{:?}",
            pair_pod(&spared)
        );
    }
    let pulling = pod(PodStatus {
        phase: Some("Pending".into()),
        ..container(ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some("ErrImagePull".into()),
                ..Default::default()
            }),
            ..Default::default()
        })
    });
    assert!(
        matches!(
            pair_pod(&pulling),
            PairPod::Waiting { .. } | PairPod::Ended(PairEnd::NotMeasured(_))
        ),
        "{:?}",
        pair_pod(&pulling)
    );
    let up = pod(container(ContainerState {
        running: Some(Default::default()),
        ..Default::default()
    }));
    assert_eq!(
        pair_pod(&up),
        PairPod::Running {
            ip: Some("10.1.1.1".into())
        }
    );
}

/// Writes `retests` as the confirmation round (round 3, after a ring's two) and returns
/// its one slot.
fn retest_round(e: &mut [NodeRunResult], retests: Vec<crate::pairs::NodePair>) -> Slot {
    let plan = RoundPlan {
        pairing: Pairing::Ring,
        seed: 0,
        rounds: vec![crate::pairs::Round {
            set: crate::pairs::PairSet::Within,
            pairs: retests,
        }],
    };
    assert_eq!(write_plan(e, &plan, 3, true), 1);
    slots(e, 3)[0]
}

/// Eight nodes in a ring (two rounds), n3 slow with both partners.
fn slow_node_run() -> Vec<NodeRunResult> {
    let mut e = planned(8);
    for round in [1, 2] {
        for s in slots(&e, round) {
            let slow = e[s.a].node == "n3" || e[s.b].node == "n3";
            let o = PairOutcome {
                state: PairState::Measured,
                busbw: Some(if slow { 40.0 } else { 195.0 }),
                transport: Some(NetTransport::Ib),
                ..Default::default()
            };
            settle(&mut e, &s, &o);
        }
    }
    e
}

#[test]
fn a_slow_node_is_retested_and_blamed_only_once_the_retest_is_slow_too() {
    let mut e = slow_node_run();
    let loc = localize(&observations(&e), &PairRules::default());
    let retests = confirmation_pairs(&loc, &unconfirmed_ports(&e));
    assert_eq!(retests.len(), 1, "{retests:?}");
    assert_eq!(retests[0].a, "n3");
    assert!(loc.known_good.contains(&retests[0].b));

    // Before the retest the finding is there, but not acted on.
    let before = findings(&e, &PairRules::default(), None).findings;
    assert!(blamed(&before).is_empty(), "{before:#?}");
    assert!(before.iter().any(|f| f.subject == Subject::node("n3")));

    let s = retest_round(&mut e, retests);
    let o = PairOutcome {
        state: PairState::Measured,
        busbw: Some(41.0),
        transport: Some(NetTransport::Ib),
        ..Default::default()
    };
    settle(&mut e, &s, &o);
    let after = findings(&e, &PairRules::default(), None).findings;
    let b = blamed(&after);
    assert_eq!(
        b.keys().copied().collect::<Vec<_>>(),
        vec!["n3"],
        "{after:#?}"
    );
    assert_eq!(b["n3"][0].kind, FindingKind::Slow);

    let mut st = NodePairsStatus::default();
    summarize(&e, &mut st);
    assert_eq!((st.pairs, st.measured, st.not_measured), (9, 9, 0));
    let within = st.within.expect("within set");
    assert_eq!(within.measured, 9);
    assert_eq!(within.min_gbps, Some(40.0));
    assert!(st.across.is_none());
}

#[test]
fn a_node_finding_is_confirmed_by_the_retest_and_a_port_finding_by_a_second_reading() {
    let finding = |subject: Subject| {
        Finding::new(
            FindingKind::Slow,
            subject,
            gpufabric_api::Metric::NodePairBusBw,
            Severity::Critical,
            "m".into(),
        )
    };
    let node = finding(Subject::node("n1"));
    let port = Finding {
        kind: FindingKind::NicDown,
        ..finding(Subject::nic("n1", "mlx5_3 port 1"))
    };
    // Two pairs of n1 (rank 1 in both) settle with the port down; the shards then keep the
    // port finding on the latest record only, with its count of readings.
    let mut e = vec![
        NodeRunResult {
            node: "n0".into(),
            ..Default::default()
        },
        NodeRunResult {
            node: "n1".into(),
            ..Default::default()
        },
    ];
    let plan = crate::pairs::RoundPlan {
        pairing: Pairing::Ring,
        seed: 0,
        rounds: (0..2)
            .map(|_| crate::pairs::Round {
                set: crate::pairs::PairSet::Within,
                pairs: vec![crate::pairs::NodePair {
                    a: "n0".into(),
                    b: "n1".into(),
                }],
            })
            .collect(),
    };
    assert_eq!(write_plan(&mut e, &plan, 1, false), 2);
    let down = PairOutcome {
        state: PairState::Measured,
        nic_findings: [vec![], vec![port.clone()]],
        ..Default::default()
    };
    let first = slots(&e, 1)[0];
    settle(&mut e, &first, &down);
    assert!(confirmed_within_run(&e[1], &[&node]));
    assert!(!confirmed_within_run(&e[1], &[&port]), "one reading");
    assert_eq!(
        unconfirmed_ports(&e).into_iter().collect::<Vec<_>>(),
        vec!["n1".to_string()],
        "one reading: the confirmation round reads it again"
    );
    let second = slots(&e, 2)[0];
    settle(&mut e, &second, &down);
    gpufabric_api::shard::bound_pairs(&mut e[1].pairs);
    assert!(e[1].pairs[0].nic_findings.is_empty(), "{:#?}", e[1].pairs);
    assert_eq!(e[1].pairs[1].nic_readings, 2, "{:#?}", e[1].pairs);
    assert!(
        confirmed_within_run(&e[1], &[&port]),
        "two pair tests read the same port down"
    );
    assert!(unconfirmed_ports(&e).is_empty(), "read twice: no retest");
    let other_port = Finding {
        subject: Subject::nic("n1", "mlx5_4 port 1"),
        ..port.clone()
    };
    assert!(!confirmed_within_run(&e[1], &[&other_port]), "another port");
    assert!(!confirmed_within_run(&e[1], &[]));
    assert!(!confirmed_within_run(&e[0], &[&port]), "n0 read nothing");
}

#[test]
fn a_port_read_down_once_is_read_again_in_the_confirmation_round_and_then_confirmed() {
    let port = Finding::new(
        FindingKind::NicDown,
        Subject::nic("n5", "mlx5_3 port 1"),
        gpufabric_api::Metric::NodePairBusBw,
        Severity::Critical,
        "mlx5_3 port 1 is down".into(),
    );
    // Eight fast nodes in a ring; n5's port reads down in its round-1 pair test only.
    let mut e = planned(8);
    for round in [1, 2] {
        for s in slots(&e, round) {
            let mut o = PairOutcome {
                state: PairState::Measured,
                busbw: Some(195.0),
                transport: Some(NetTransport::Ib),
                ..Default::default()
            };
            for (rank, i) in [s.a, s.b].into_iter().enumerate() {
                if round == 1 && e[i].node == "n5" {
                    o.nic_findings[rank] = vec![port.clone()];
                }
            }
            settle(&mut e, &s, &o);
        }
    }
    let n5 = e.iter().position(|x| x.node == "n5").expect("n5");
    assert!(!confirmed_within_run(&e[n5], &[&port]), "one reading");
    let loc = localize(&observations(&e), &PairRules::default());
    assert!(loc.suspects.is_empty(), "{loc:#?}");
    let retests = confirmation_pairs(&loc, &unconfirmed_ports(&e));
    assert_eq!(retests.len(), 1, "{retests:?}");
    assert_eq!(retests[0].a, "n5");
    assert!(loc.known_good.contains(&retests[0].b) && retests[0].b != "n5");

    let s = retest_round(&mut e, retests);
    let rank = if e[s.a].node == "n5" { 0 } else { 1 };
    let mut o = PairOutcome {
        state: PairState::Measured,
        busbw: Some(194.0),
        transport: Some(NetTransport::Ib),
        ..Default::default()
    };
    o.nic_findings[rank] = vec![port.clone()];
    settle(&mut e, &s, &o);
    assert!(
        confirmed_within_run(&e[n5], &[&port]),
        "read down again: {:#?}",
        e[n5].pairs
    );
    assert!(unconfirmed_ports(&e).is_empty());
    let found = findings(&e, &PairRules::default(), None).findings;
    assert_eq!(
        blamed(&found).keys().copied().collect::<Vec<_>>(),
        vec!["n5"]
    );
}

/// Pairs that ended not measured spare their nodes: the note counts them, names the nodes
/// they leave unjudged and the reason most gave; none when every pair was measured.
#[test]
fn pairs_not_measured_are_counted_with_the_reason_most_gave() {
    let mut e = planned(4);
    assert_eq!(unmeasured_note(&e), None, "nothing ended yet");
    let mut ended = 0;
    for entry in e.iter_mut() {
        for r in entry.pairs.iter_mut().filter(|r| r.rank == 0) {
            ended += 1;
            (r.state, r.message) = match ended {
                1 | 2 => (
                    PairState::NotMeasured,
                    Some("rendezvous timed out after 60 s".into()),
                ),
                3 => (PairState::NotMeasured, Some("image pull".into())),
                _ => (PairState::Measured, None),
            };
        }
    }
    assert_eq!(pair_records(&e).count(), 4, "{e:#?}");
    let note = unmeasured_note(&e).expect("three pairs not measured");
    assert!(note.starts_with("3 of 4 node pairs not measured"), "{note}");
    assert!(
        note.ends_with("the most common reason (2 of 3): rendezvous timed out after 60 s"),
        "{note}"
    );
    // Three pairs of a ring over four nodes touch every node.
    assert!(note.contains("judging none of their 4 nodes"), "{note}");

    for entry in e.iter_mut() {
        for r in entry.pairs.iter_mut() {
            r.state = PairState::Measured;
        }
    }
    assert_eq!(unmeasured_note(&e), None);
}
