use super::*;
use gpufabric_api::baseline::Expectation;

fn name(i: usize) -> String {
    format!("h200-{i:02}")
}

fn pair(a: usize, b: usize, busbw: f64, transport: NetTransport) -> PairObservation {
    PairObservation {
        a: name(a),
        b: name(b),
        busbw,
        transport: Some(transport),
    }
}

/// Node i with node i+1 around a ring of `n`, every pair at `busbw` over InfiniBand.
fn ring(n: usize, busbw: f64) -> Vec<PairObservation> {
    (0..n)
        .map(|i| pair(i, (i + 1) % n, busbw, NetTransport::Ib))
        .collect()
}

fn set(pairs: &mut [PairObservation], a: usize, b: usize, busbw: f64, t: NetTransport) {
    for p in pairs.iter_mut() {
        if (p.a == name(a) && p.b == name(b)) || (p.a == name(b) && p.b == name(a)) {
            p.busbw = busbw;
            p.transport = Some(t);
        }
    }
}

#[test]
fn a_clean_fleet_has_no_finding_and_every_node_is_known_good() {
    let mut pairs = ring(8, 196.0);
    set(&mut pairs, 0, 1, 191.0, NetTransport::Ib);
    set(&mut pairs, 4, 5, 199.0, NetTransport::Ib);
    let l = localize(&pairs, &PairRules::default());
    assert!(l.findings.is_empty(), "{:#?}", l.findings);
    assert!(l.suspects.is_empty());
    assert_eq!(l.known_good.len(), 8);
}

#[test]
fn a_node_slow_with_every_partner_is_the_node() {
    let mut pairs = ring(8, 196.0);
    pairs.push(pair(5, 1, 44.0, NetTransport::Ib));
    set(&mut pairs, 4, 5, 41.0, NetTransport::Ib);
    set(&mut pairs, 5, 6, 43.0, NetTransport::Ib);
    let l = localize(&pairs, &PairRules::default());
    assert_eq!(l.findings.len(), 1, "{:#?}", l.findings);
    let f = &l.findings[0];
    assert_eq!(f.subject, Subject::node("h200-05"));
    assert_eq!(
        (f.kind, f.severity),
        (FindingKind::Slow, Severity::Critical)
    );
    assert_eq!(
        f.message,
        "node h200-05: NCCL busbw to 3 partners 41-44 GB/s, 78% below its partners' other pairs (median 196 GB/s): check its NICs and links"
    );
    assert_eq!((f.measured, f.expected), (Some(43.0), Some(196.0)));
    assert_eq!(
        l.blamed_nodes().into_iter().collect::<Vec<_>>(),
        vec!["h200-05"]
    );
    assert!(l.suspects.is_empty(), "{:?}", l.suspects);
    assert!(!l.known_good.contains(&"h200-05".to_string()));
    // Its partners are not known-good either: each had one slow pair.
    assert_eq!(
        l.known_good,
        vec!["h200-00", "h200-02", "h200-03", "h200-07"]
    );
}

#[test]
fn one_slow_pair_between_nodes_fine_elsewhere_is_the_path_and_blames_neither() {
    let mut pairs = ring(8, 196.0);
    pairs.push(pair(2, 6, 52.0, NetTransport::Ib));
    let l = localize(&pairs, &PairRules::default());
    assert_eq!(l.findings.len(), 1, "{:#?}", l.findings);
    let f = &l.findings[0];
    assert_eq!(f.subject, Subject::node_pair("h200-02", "h200-06"));
    assert_eq!(f.severity, Severity::Info);
    assert_eq!(
        f.message,
        "node pair h200-02 <-> h200-06: NCCL busbw 52 GB/s, 73% below both nodes' other pairs (median 196 GB/s): the path between them (cables, switch ports, routing), not either node"
    );
    assert!(l.blamed_nodes().is_empty());
    assert!(l.suspects.is_empty());
}

#[test]
fn a_node_on_sockets_where_the_fleet_uses_infiniband_is_a_transport_finding() {
    let mut pairs = ring(8, 196.0);
    set(&mut pairs, 2, 3, 11.0, NetTransport::Socket);
    set(&mut pairs, 3, 4, 12.0, NetTransport::Socket);
    let l = localize(&pairs, &PairRules::default());
    assert_eq!(l.findings.len(), 1, "{:#?}", l.findings);
    let f = &l.findings[0];
    assert_eq!(f.subject, Subject::node("h200-03"));
    assert_eq!(
        (f.kind, f.metric, f.severity),
        (
            FindingKind::TransportFallback,
            Metric::NetTransport,
            Severity::Critical
        )
    );
    assert_eq!(
        f.message,
        "node h200-03: NCCL fell back to sockets with 2 partners (busbw 11-12 GB/s) where the fleet uses InfiniBand (6 of 8 pairs): check its RDMA devices, NCCL_IB_HCA and the network operator"
    );
    // Its slow pairs are explained, not repeated as Slow, and its partners are not blamed.
    assert_eq!(
        l.blamed_nodes().into_iter().collect::<Vec<_>>(),
        vec!["h200-03"]
    );
}

#[test]
fn a_socket_pair_between_two_rdma_nodes_is_the_pair_and_roce_is_named_as_such() {
    let mut pairs: Vec<PairObservation> = ring(8, 180.0)
        .into_iter()
        .map(|p| PairObservation {
            transport: Some(NetTransport::Roce),
            ..p
        })
        .collect();
    pairs.push(pair(1, 5, 9.0, NetTransport::Socket));
    let l = localize(&pairs, &PairRules::default());
    assert_eq!(l.findings.len(), 1, "{:#?}", l.findings);
    let f = &l.findings[0];
    assert_eq!(f.subject, Subject::node_pair("h200-01", "h200-05"));
    assert_eq!(f.severity, Severity::Info);
    assert!(
        f.message
            .contains("though both use RoCE with other partners"),
        "{}",
        f.message
    );
    assert!(l.blamed_nodes().is_empty());
}

#[test]
fn a_fleet_on_sockets_gets_no_transport_finding() {
    let pairs: Vec<PairObservation> = ring(6, 11.0)
        .into_iter()
        .map(|p| PairObservation {
            transport: Some(NetTransport::Socket),
            ..p
        })
        .collect();
    let l = localize(&pairs, &PairRules::default());
    assert!(l.findings.is_empty(), "{:#?}", l.findings);
    assert_eq!(l.known_good.len(), 6);
}

#[test]
fn too_few_pairs_to_compare_give_no_slow_finding() {
    let pairs = vec![
        pair(0, 1, 196.0, NetTransport::Ib),
        pair(2, 3, 40.0, NetTransport::Ib),
    ];
    let l = localize(&pairs, &PairRules::default());
    assert!(l.findings.is_empty(), "{:#?}", l.findings);
    assert!(l.suspects.is_empty());
}

#[test]
fn two_slow_nodes_that_met_are_suspects_until_retested() {
    // Ring of 8; nodes 2 and 3 are both slow. Pair (2,3) is slow, and each of them has
    // only one partner that is fine elsewhere, so neither can be named yet.
    let mut pairs = ring(8, 196.0);
    set(&mut pairs, 1, 2, 60.0, NetTransport::Ib);
    set(&mut pairs, 2, 3, 40.0, NetTransport::Ib);
    set(&mut pairs, 3, 4, 61.0, NetTransport::Ib);
    let l = localize(&pairs, &PairRules::default());
    assert!(l.blamed_nodes().is_empty(), "{:#?}", l.findings);
    // The slowest first (the median of their pairs: 50, 50.5, 128, 128.5 GB/s).
    assert_eq!(l.suspects, vec!["h200-02", "h200-03", "h200-01", "h200-04"]);
    assert!(l.findings.iter().all(|f| f.severity == Severity::Info));
    assert!(!l.known_good.iter().any(|n| l.suspects.contains(n)));
    assert!(l.known_good.contains(&"h200-06".to_string()));
}

#[test]
fn a_slow_node_with_one_pair_is_only_a_suspect() {
    let mut pairs = ring(6, 196.0);
    pairs.push(pair(6, 0, 40.0, NetTransport::Ib));
    let l = localize(&pairs, &PairRules::default());
    assert!(l.blamed_nodes().is_empty());
    // Node 6's only pair is slow; node 0 has two fine ones besides: 6 is retested first.
    assert_eq!(l.suspects, vec!["h200-06", "h200-00"]);
}

fn doc(a: &str, b: &str, rank: u32, busbw: f64, t: NetTransport) -> NodePairResult {
    use gpufabric_api::pair::{PAIR_SCHEMA, PairCollective};
    NodePairResult {
        schema: PAIR_SCHEMA.into(),
        group: format!("run/{a}-{b}"),
        nodes: [a.into(), b.into()],
        rank,
        backend: gpufabric_api::result::Backend::Sim,
        started_at: String::new(),
        duration_s: 1.0,
        gpus_per_node: 8,
        collectives: vec![PairCollective {
            collective: gpufabric_api::Collective::AllReduce,
            bytes: 1 << 30,
            time_us: 1.0,
            algbw: busbw / 1.875,
            busbw,
            wrong: 0,
        }],
        transport: Some(t),
        nics_used: 8,
        nics: vec![],
        not_measured: None,
        errors: vec![],
    }
}

#[test]
fn documents_become_one_observation_per_measured_pair() {
    let mut missing = doc("c", "d", 0, 0.0, NetTransport::Ib);
    missing.collectives.clear();
    missing.not_measured = Some(gpufabric_api::pair::NotMeasured {
        peer: Some("d".into()),
        message: "rank 1 (d) did not join".into(),
    });
    let docs = vec![
        doc("a", "b", 1, 190.0, NetTransport::Ib),
        doc("a", "b", 0, 191.0, NetTransport::Ib),
        missing,
        doc("c", "d", 1, 50.0, NetTransport::Ib),
        doc("e", "f", 1, 11.0, NetTransport::Socket),
        doc("e", "f", 0, 11.5, NetTransport::Ib),
    ];
    let obs = PairObservation::from_documents(&docs);
    assert_eq!(
        obs,
        vec![
            PairObservation {
                a: "a".into(),
                b: "b".into(),
                busbw: 191.0,
                transport: Some(NetTransport::Ib)
            },
            PairObservation {
                a: "e".into(),
                b: "f".into(),
                busbw: 11.5,
                transport: Some(NetTransport::Socket)
            },
        ]
    );
}

fn record(partner: &str, rank: u32, state: PairState, busbw: Option<f64>) -> PairRecord {
    PairRecord {
        partner: partner.into(),
        rank,
        state,
        busbw_gbps: busbw,
        transport: Some(NetTransport::Ib),
        ..Default::default()
    }
}

#[test]
fn records_give_one_observation_per_pair_and_an_errored_pair_no_bandwidth() {
    let a_ok = record("b", 0, PairState::Measured, Some(190.0));
    let b_ok = record("a", 1, PairState::Measured, Some(190.0));
    let c_err = record("d", 0, PairState::Errored, None);
    let e_nm = record("f", 0, PairState::NotMeasured, None);
    let g_pending = record("h", 0, PairState::Joined, None);
    let obs = PairObservation::from_records([
        ("a", &a_ok),
        ("b", &b_ok),
        ("c", &c_err),
        ("e", &e_nm),
        ("g", &g_pending),
    ]);
    assert_eq!(
        obs,
        vec![
            PairObservation {
                a: "a".into(),
                b: "b".into(),
                busbw: 190.0,
                transport: Some(NetTransport::Ib),
            },
            PairObservation {
                a: "c".into(),
                b: "d".into(),
                busbw: 0.0,
                transport: None,
            },
        ]
    );
}

#[test]
fn a_node_finding_stands_only_once_its_retest_confirmed_it() {
    let mut pairs = ring(8, 196.0);
    set(&mut pairs, 4, 5, 41.0, NetTransport::Ib);
    set(&mut pairs, 5, 6, 43.0, NetTransport::Ib);
    let mut l = localize(&pairs, &PairRules::default());
    assert_eq!(l.blamed_nodes().len(), 1, "{:#?}", l.findings);
    let spared = require_confirmation(&mut l, &BTreeSet::new());
    assert_eq!(spared, BTreeSet::from(["h200-05".to_string()]));
    assert!(l.blamed_nodes().is_empty());
    assert!(
        l.findings[0]
            .message
            .ends_with("not confirmed against a known-good partner, so not acted on"),
        "{}",
        l.findings[0].message
    );

    // Retested against h200-01 and slow there too: the finding stands.
    pairs.push(pair(5, 1, 40.0, NetTransport::Ib));
    let mut l = localize(&pairs, &PairRules::default());
    let spared = require_confirmation(&mut l, &BTreeSet::from(["h200-05".to_string()]));
    assert!(spared.is_empty());
    assert_eq!(l.blamed_nodes(), BTreeSet::from(["h200-05"]));
}

#[test]
fn a_suspect_fine_against_a_known_good_partner_is_not_blamed() {
    // 8 nodes in a ring, 4-5 slow: both suspects (each has one fine pair elsewhere, so rule
    // 4 names the path). A retest of 5 against 1 that is fine keeps it a path finding.
    let mut pairs = ring(8, 196.0);
    set(&mut pairs, 4, 5, 41.0, NetTransport::Ib);
    pairs.push(pair(5, 1, 195.0, NetTransport::Ib));
    let mut l = localize(&pairs, &PairRules::default());
    require_confirmation(&mut l, &BTreeSet::from(["h200-05".to_string()]));
    assert!(l.blamed_nodes().is_empty(), "{:#?}", l.findings);
    assert_eq!(l.findings.len(), 1);
    assert_eq!(
        l.findings[0].subject,
        Subject::node_pair("h200-04", "h200-05")
    );
}

/// A baseline for InfiniBand pairs at 1 GiB: median 196 GB/s, 10th percentile 190.
fn baseline_ib() -> PairBaseline {
    PairBaseline {
        transport: NetTransport::Ib,
        bytes: 1 << 30,
        expectation: Expectation {
            median: 196.0,
            p10: 190.0,
            p90: 199.0,
            nodes: 412,
            runs: 14,
            days: 7,
        },
    }
}

/// Six nodes in the two rounds a ring plans for them (0-5, 1-4, 2-3, then 0-4, 5-3, 1-2),
/// nodes 4 and 5 slowed: four of the six pairs slow, the median pair slow too.
fn two_of_six_slow() -> Vec<PairObservation> {
    let slow = 44.0;
    vec![
        pair(0, 5, slow, NetTransport::Ib),
        pair(1, 4, slow - 2.0, NetTransport::Ib),
        pair(2, 3, 195.0, NetTransport::Ib),
        pair(0, 4, slow - 1.0, NetTransport::Ib),
        pair(5, 3, slow + 1.0, NetTransport::Ib),
        pair(1, 2, 197.0, NetTransport::Ib),
    ]
}

#[test]
fn two_slow_nodes_of_six_make_the_runs_median_slow_and_the_run_alone_names_nobody() {
    let l = localize(&two_of_six_slow(), &PairRules::default());
    assert!(l.blamed_nodes().is_empty(), "{:#?}", l.findings);
    assert!(
        l.findings.iter().all(|f| f.severity == Severity::Info),
        "{:#?}",
        l.findings
    );
}

#[test]
fn against_the_baseline_the_slow_sides_are_suspects_and_good_nodes_partner_their_retests() {
    let b = [baseline_ib()];
    let l = localize_against(&two_of_six_slow(), &PairRules::default(), Some(&b));
    assert_eq!(l.basis, None);
    // Node 0 met both slow nodes: no pair at the baseline, so a suspect too, retested last
    // (its pairs are the fastest of the three).
    assert_eq!(l.suspects, vec![name(4), name(0), name(5)]);
    assert_eq!(l.known_good, vec![name(1), name(2), name(3)]);
    let retests = confirmation_pairs(&l, &BTreeSet::new());
    assert_eq!(retests.len(), 3, "{retests:?}");
    assert_eq!(
        (retests[0].a.as_str(), retests[0].b.as_str()),
        ("h200-04", "h200-01")
    );
    // The retests: node 0 reaches the baseline with a good partner, 4 and 5 do not.
    let mut all = two_of_six_slow();
    all.push(pair(4, 1, 43.0, NetTransport::Ib));
    all.push(pair(0, 2, 196.0, NetTransport::Ib));
    all.push(pair(5, 3, 44.0, NetTransport::Ib));
    let mut l = localize_against(&all, &PairRules::default(), Some(&b));
    let retested: BTreeSet<String> = [0, 1, 2, 3, 4, 5].into_iter().map(name).collect();
    require_confirmation(&mut l, &retested);
    assert_eq!(
        l.blamed_nodes().into_iter().collect::<Vec<_>>(),
        vec!["h200-04", "h200-05"],
        "{:#?}",
        l.findings
    );
    let f = l
        .findings
        .iter()
        .find(|f| f.subject == Subject::node("h200-04"))
        .expect("a finding on node 4");
    assert_eq!(f.source, Some(ExpectationSource::Baseline));
    assert!(
        f.message.starts_with("node h200-04: NCCL busbw to 3 partners 42-43 GB/s, 78% below the 412 nodes of this test run alike over 7 days (median 196 GB/s"),
        "{}",
        f.message
    );
}

#[test]
fn a_slow_path_between_nodes_at_the_baseline_elsewhere_blames_neither() {
    let b = [baseline_ib()];
    let mut pairs = ring(8, 196.0);
    pairs.push(pair(2, 6, 52.0, NetTransport::Ib));
    let l = localize_against(&pairs, &PairRules::default(), Some(&b));
    assert!(l.blamed_nodes().is_empty());
    assert!(l.suspects.is_empty(), "{:?}", l.suspects);
    assert_eq!(l.findings.len(), 1, "{:#?}", l.findings);
    assert_eq!(l.findings[0].subject, Subject::node_pair(name(2), name(6)));
    assert_eq!(l.findings[0].severity, Severity::Info);
    assert!(l.findings[0].message.contains("the path between them"));
}

#[test]
fn a_pair_within_a_loose_baselines_own_spread_is_not_slow() {
    // Healthy pairs of this fleet spread from 120 to 200 GB/s: 130 is within it, though
    // 34% below the median.
    let mut b = baseline_ib();
    b.expectation.p10 = 140.0;
    let mut pairs = ring(6, 196.0);
    set(&mut pairs, 0, 1, 130.0, NetTransport::Ib);
    let l = localize_against(&pairs, &PairRules::default(), Some(&[b]));
    assert!(l.findings.is_empty(), "{:#?}", l.findings);
    // 70 is beyond both the gap and the spread.
    set(&mut pairs, 0, 1, 70.0, NetTransport::Ib);
    let l = localize_against(&pairs, &PairRules::default(), Some(&[b]));
    assert_eq!(l.findings.len(), 1, "{:#?}", l.findings);
}

#[test]
fn without_a_baseline_for_the_pairs_transport_the_run_alone_judges_and_says_so() {
    let roce = PairBaseline {
        transport: NetTransport::Roce,
        ..baseline_ib()
    };
    let pairs = two_of_six_slow();
    let looked = localize_against(&pairs, &PairRules::default(), Some(&[roce]));
    assert_eq!(
        looked.findings,
        localize(&pairs, &PairRules::default()).findings
    );
    let note = looked.basis.expect("a note");
    assert!(
        note.starts_with("the 6 node pairs were judged against this run's own median only: the test has no baseline yet for node pairs over InfiniBand"),
        "{note}"
    );
    assert_eq!(localize(&pairs, &PairRules::default()).basis, None);
}

#[test]
fn with_fewer_good_partners_than_suspects_the_slowest_suspects_are_retested() {
    let l = Localization {
        suspects: vec![name(7), name(3), name(5)],
        known_good: vec![name(0)],
        ..Default::default()
    };
    let retests = confirmation_pairs(&l, &BTreeSet::new());
    assert_eq!(
        retests,
        vec![rounds::NodePair {
            a: name(7),
            b: name(0)
        }]
    );
}

#[test]
fn a_second_retest_pairs_each_unclear_suspect_with_a_known_good_node_it_has_not_met() {
    // After the first retest, node 5 is still a suspect: it met node 0 there (slow).
    let l = Localization {
        suspects: vec![name(5), name(0)],
        known_good: vec![name(0), name(1), name(2)],
        ..Default::default()
    };
    let observed = vec![
        pair(4, 5, 40.0, NetTransport::Ib),
        pair(5, 6, 40.0, NetTransport::Ib),
        pair(5, 0, 41.0, NetTransport::Ib),
        pair(0, 1, 196.0, NetTransport::Ib),
    ];
    let retested = BTreeSet::from([name(5), name(0)]);
    let retests = retest_pairs(2, &l, &BTreeSet::new(), &observed, &retested);
    // Node 0 is a suspect itself, so not a partner; node 5 meets 1, node 0 (which met 1)
    // meets 2.
    let pair_of = |a: usize, b: usize| rounds::NodePair {
        a: name(a),
        b: name(b),
    };
    assert_eq!(retests, vec![pair_of(5, 1), pair_of(0, 2)]);
    assert!(retest_pairs(3, &l, &BTreeSet::new(), &observed, &retested).is_empty());
}
