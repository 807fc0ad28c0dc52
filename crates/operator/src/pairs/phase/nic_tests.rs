//! The NIC port counters a node pair reads: recorded on both nodes the first time, compared
//! with the previous run's record (or the same run's first pair) after, and the growth
//! found on its node.

use super::tests::{NODES, doc, ended, entries, no_record, on_nodes, running};
use super::*;
use gpufabric_api::pair::NotMeasured;
use gpufabric_api::suite::Pairing;
use gpufabric_api::{FindingKind, Subject};

/// Eight up ports; `mlx5_2` has `symbol_errors` symbol errors.
fn ports(symbol_errors: u64) -> Vec<gpufabric_api::pair::NicPort> {
    (0..8)
        .map(|i| gpufabric_api::pair::NicPort {
            device: format!("mlx5_{i}"),
            port: 1,
            link_layer: Some("InfiniBand".into()),
            state: "ACTIVE".into(),
            phys_state: "LinkUp".into(),
            rate_gbps: Some(400.0),
            errors: gpufabric_api::nic_counters::PortErrors {
                symbol_errors: Some(if i == 2 { symbol_errors } else { 0 }),
                link_downed: Some(0),
                rcv_errors: Some(0),
            },
        })
        .collect()
}

/// The documents of a measured pair whose nodes read `n0` and `n1` symbol errors on
/// `mlx5_2`.
fn docs_with_ports(n0: u64, n1: u64) -> (PairPod, PairPod) {
    let mut d0 = doc(0, 190.0);
    d0.nics = ports(n0);
    let mut d1 = doc(1, 190.0);
    d1.nics = ports(n1);
    (ended(d0), ended(d1))
}

fn settled(step: PairStep) -> PairOutcome {
    match step {
        PairStep::Settle(o) => o,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_first_pair_test_records_both_nodes_counters_and_judges_none() {
    let (p0, p1) = docs_with_ports(5_000, 0);
    let nics = NicHistory {
        run: "nightly-1",
        at: "2026-11-24T02:00:00Z",
        previous: &no_record,
    };
    let o = settled(decide(PairState::Joined, (&p0, &p1), NODES, false, &nics));
    assert_eq!(o.state, PairState::Measured);
    assert!(
        o.nic_findings.iter().all(Vec::is_empty),
        "{:#?}",
        o.nic_findings
    );
    for (rank, want) in [(0, 5_000), (1, 0)] {
        let r = o.nic_records[rank]
            .as_ref()
            .expect("a record for each node");
        assert_eq!((r.run.as_str(), r.at.as_str()), (nics.run, nics.at));
        assert_eq!(r.ports.len(), 8);
        assert_eq!(
            r.port("mlx5_2", 1).and_then(|p| p.errors.symbol_errors),
            Some(want)
        );
    }
}

#[test]
fn counters_grown_since_the_previous_run_are_found_on_their_node_with_the_delta() {
    let (p0, p1) = docs_with_ports(1_000, 7);
    let before = [
        NicCounters::of(&ports(1_000), "nightly-1", "2026-11-23T02:00:00Z"),
        NicCounters::of(&ports(0), "nightly-1", "2026-11-23T02:00:00Z"),
    ];
    let read = on_nodes(before);
    let nics = NicHistory {
        run: "nightly-2",
        at: "2026-11-24T02:00:00Z",
        previous: &read,
    };
    let o = settled(decide(PairState::Joined, (&p0, &p1), NODES, false, &nics));
    // Rank 0 (n0): unchanged, no finding and nothing new to write.
    assert!(o.nic_findings[0].is_empty(), "{:#?}", o.nic_findings[0]);
    assert_eq!(o.nic_records[0], None);
    // Rank 1 (n1): 7 symbol errors since run 1, Info; its new counts are recorded.
    let f = &o.nic_findings[1];
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].kind, FindingKind::NicErrors);
    assert_eq!(f[0].severity, Severity::Info);
    assert_eq!(f[0].subject, Subject::nic("n1", "mlx5_2 port 1"));
    assert_eq!(f[0].measured, Some(7.0));
    assert!(
        f[0].message
            .contains("grew by 7 (from 0 to 7) since run nightly-1 at 2026-11-23T02:00:00Z"),
        "{}",
        f[0].message
    );
    let r = o.nic_records[1].as_ref().expect("n1's new counts");
    assert_eq!(r.run, "nightly-2");
    assert_eq!(
        r.port("mlx5_2", 1).and_then(|p| p.errors.symbol_errors),
        Some(7)
    );

    // The findings reach both records of the pair and the run's findings.
    let mut e = entries(2);
    let plan = RoundPlan {
        pairing: Pairing::Ring,
        seed: 0,
        rounds: vec![crate::pairs::Round {
            set: crate::pairs::PairSet::Within,
            pairs: vec![crate::pairs::NodePair {
                a: "n0".into(),
                b: "n1".into(),
            }],
        }],
    };
    assert_eq!(write_plan(&mut e, &plan, 1, false), 1);
    let slot = slots(&e, 1)[0];
    settle(&mut e, &slot, &o);
    let all = findings(&e, &PairRules::default(), None).findings;
    assert!(
        all.iter()
            .any(|f| f.kind == FindingKind::NicErrors && f.subject.node_name() == "n1"),
        "{all:#?}"
    );
    assert!(blamed(&all).is_empty(), "Info growth fails no node");
}

#[test]
fn critical_growth_keeps_the_older_record_and_blames_the_node() {
    let (p0, p1) = docs_with_ports(0, 0);
    let (q0, _) = docs_with_ports(900, 0);
    let before = NicCounters::of(&ports(0), "nightly-1", "2026-11-23T02:00:00Z");
    let read = on_nodes([before.clone(), before]);
    let nics = NicHistory {
        run: "nightly-2",
        at: "2026-11-24T02:00:00Z",
        previous: &read,
    };
    let o = settled(decide(PairState::Joined, (&q0, &p1), NODES, false, &nics));
    assert_eq!(o.nic_findings[0].len(), 1, "{:#?}", o.nic_findings);
    assert_eq!(o.nic_findings[0][0].severity, Severity::Critical);
    assert_eq!(
        o.nic_records,
        [None, None],
        "n0 keeps the older record; n1's counts did not change"
    );
    let blaming = o.nic_findings[0].iter().collect::<Vec<_>>();
    let one_reading = NodeRunResult {
        node: "n0".into(),
        pairs: vec![PairRecord {
            nic_findings: o.nic_findings[0].clone(),
            ..Default::default()
        }],
        ..Default::default()
    };
    assert!(!confirmed_within_run(&one_reading, &blaming));
    // A pair with unchanged counters writes nothing.
    let o = settled(decide(PairState::Joined, (&p0, &p1), NODES, false, &nics));
    assert_eq!(o.nic_records, [None, None]);
}

#[test]
fn a_later_pair_of_the_same_run_compares_against_the_first_pairs_reading() {
    // n0's first pair of nightly-2 read 100 symbol errors; its second pair reads 400.
    let first = NicCounters::of(&ports(100), "nightly-2", "2026-11-24T02:00:00Z");
    let (p0, p1) = docs_with_ports(400, 0);
    let read = on_nodes([first, None]);
    let nics = NicHistory {
        run: "nightly-2",
        at: "2026-11-24T02:03:00Z",
        previous: &read,
    };
    let o = settled(decide(PairState::Joined, (&p0, &p1), NODES, false, &nics));
    let f = &o.nic_findings[0];
    assert_eq!(f.len(), 1, "{f:#?}");
    assert_eq!(f[0].severity, Severity::Critical);
    assert!(
        f[0].message.contains(
            "grew by 300 (from 100 to 400) since an earlier pair test of this run (nightly-2) at 2026-11-24T02:00:00Z: the counters grew during the run"
        ),
        "{}",
        f[0].message
    );
    assert_eq!(o.nic_records[0], None, "the first pair's reading stays");
    assert!(o.nic_records[1].is_some(), "n1's first reading is recorded");
}

#[test]
fn a_pair_that_failed_still_judges_and_records_the_ports_its_documents_read() {
    let mut d0 = doc(0, 0.0);
    d0.collectives.clear();
    d0.nics = ports(3);
    d0.not_measured = Some(NotMeasured {
        peer: Some("n1".into()),
        message: "rank 1 (node n1) did not arrive within 20s".into(),
    });
    let before = NicCounters::of(&ports(0), "nightly-1", "t1");
    let read = on_nodes([before, None]);
    let nics = NicHistory {
        run: "nightly-2",
        at: "t2",
        previous: &read,
    };
    let o = settled(decide(
        PairState::Listening,
        (&ended(d0), &PairPod::Absent),
        NODES,
        false,
        &nics,
    ));
    assert_eq!(o.state, PairState::NotMeasured);
    assert_eq!(o.nic_findings[0].len(), 1, "{:#?}", o.nic_findings);
    assert!(o.nic_records[0].is_some());
    assert_eq!(o.nic_records[1], None, "rank 1 never ran");
    // A pod without a document reads no ports.
    let crashed = PairPod::Ended(PairEnd::Failed("exit 134".into()));
    let o = settled(decide(
        PairState::Joined,
        (&crashed, &crashed),
        NODES,
        false,
        &nics,
    ));
    assert_eq!(o.nic_records, [None, None]);
    assert!(o.nic_findings.iter().all(Vec::is_empty));
}

#[test]
fn the_nic_records_are_read_only_for_the_nodes_of_a_settling_pair_with_documents() {
    let reads = std::sync::Mutex::new(Vec::<String>::new());
    let taken = || std::mem::take(&mut *reads.lock().expect("not poisoned"));
    let read = |node: &str| {
        reads.lock().expect("not poisoned").push(node.to_string());
        None
    };
    let nics = NicHistory {
        run: "r1",
        at: "",
        previous: &read,
    };
    let (p0, p1) = docs_with_ports(0, 0);
    let (absent, r0, r1) = (PairPod::Absent, running("10.0.0.1"), running("10.0.0.2"));
    // Under way: nothing is read.
    for (state, pods) in [
        (PairState::Pending, (&absent, &absent)),
        (PairState::Listening, (&r0, &absent)),
        (PairState::Joined, (&r0, &r1)),
        (PairState::Joined, (&p0, &r1)),
    ] {
        let step = decide(state, pods, NODES, false, &nics);
        assert!(
            !matches!(step, PairStep::Settle(_) | PairStep::Stop(_)),
            "{step:?}"
        );
    }
    assert_eq!(taken(), Vec::<String>::new());
    // Settling: each node whose rank wrote a document, once.
    settled(decide(PairState::Joined, (&p0, &p1), NODES, false, &nics));
    assert_eq!(taken(), ["n0", "n1"]);
    let step = decide(PairState::Joined, (&p0, &r1), NODES, true, &nics);
    assert!(matches!(step, PairStep::Stop(_)), "{step:?}");
    assert_eq!(taken(), ["n0"], "rank 1 wrote no document");
    let crashed = PairPod::Ended(PairEnd::Failed("exit 134".into()));
    settled(decide(
        PairState::Joined,
        (&crashed, &crashed),
        NODES,
        false,
        &nics,
    ));
    assert_eq!(taken(), Vec::<String>::new());
}
