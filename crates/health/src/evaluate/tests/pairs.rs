//! GPU pairs: slow pairs, directions, and blame on the smallest part (pair, GPU or node).

use super::*;

#[test]
fn a_gpu_slow_to_every_peer_is_blamed_instead_of_its_pairs() {
    let mut r = healthy("n", 9, 0.02);
    for peer in [0, 1, 3, 4, 5, 6, 7] {
        slow_pair(&mut r, 2, peer, 0.6);
    }
    let e = run(vec![r]);
    assert_eq!(e.findings.len(), 1, "{:#?}", e.findings);
    let f = &e.findings[0];
    assert_eq!(f.subject, Subject::gpu("n", 2));
    assert_eq!(f.metric, Metric::PairBandwidth);
    assert_eq!(f.kind, FindingKind::Slow);
    assert!(f.message.contains("GPU 2"), "{}", f.message);
}

#[test]
fn every_pair_below_the_profile_floor_blames_the_node() {
    let mut r = healthy("n", 9, 0.02);
    for v in r.copy_uni.iter_mut() {
        *v *= 0.4;
    }
    let e = run(vec![r]);
    let pairs: Vec<&Finding> = e
        .findings
        .iter()
        .filter(|f| f.metric == Metric::PairBandwidth)
        .collect();
    assert_eq!(pairs.len(), 1, "{pairs:#?}");
    assert_eq!(pairs[0].subject, Subject::node("n"));
    assert_eq!(pairs[0].source, Some(ExpectationSource::Profile));
}

#[test]
fn two_slow_pairs_of_one_gpu_are_named_as_pairs_not_the_gpu() {
    let mut r = healthy("n", 4, 0.02);
    slow_pair(&mut r, 1, 4, 0.5);
    slow_pair(&mut r, 1, 6, 0.5);
    let e = run(vec![r]);
    let subjects: Vec<&Subject> = e.findings.iter().map(|f| &f.subject).collect();
    assert_eq!(
        subjects,
        vec![&Subject::gpu_pair("n", 1, 4), &Subject::gpu_pair("n", 1, 6)]
    );
}

#[test]
fn a_one_way_slow_direction_counts_for_the_pair() {
    let mut r = healthy("n", 4, 0.02);
    r.copy_uni[7 * 8] *= 0.5; // only 7 -> 0 (row 7, column 0)
    let e = run(vec![r]);
    assert_eq!(e.findings.len(), 1);
    assert_eq!(e.findings[0].subject, Subject::gpu_pair("n", 0, 7));
}

#[test]
fn a_named_slow_pair_explains_a_node_below_the_profile_floor_but_not_below_a_threshold() {
    let mut r = healthy("n", 1, 0.01);
    slow_pair(&mut r, 2, 5, 0.4);
    all_reduce(&mut r).peak_busbw = 150.0;
    let e = run(vec![r.clone()]);
    assert_eq!(e.findings.len(), 1, "{:#?}", e.findings);
    assert_eq!(e.findings[0].subject, Subject::gpu_pair("n", 2, 5));
    let t = Thresholds {
        nccl_bus_bw_gbps: Some(300.0),
        ..Thresholds::default()
    };
    let e = evaluate(&[NodeInput::measured(r)], &t);
    assert_eq!(e.findings.len(), 2, "{:#?}", e.findings);
    assert!(
        e.findings
            .iter()
            .any(|f| f.source == Some(ExpectationSource::Threshold)
                && f.subject == Subject::node("n"))
    );
}

#[test]
fn a_pair_slow_only_both_ways_at_once_is_a_bidirectional_finding() {
    let mut r = healthy("n", 2, 0.01);
    r.copy_bidir[upper(8, 3, 4)] *= 0.5;
    let e = run(vec![r]);
    assert_eq!(e.findings.len(), 1, "{:#?}", e.findings);
    assert_eq!(e.findings[0].metric, Metric::PairBidirBandwidth);
    assert_eq!(e.findings[0].subject, Subject::gpu_pair("n", 3, 4));
}

#[test]
fn an_explicit_pair_threshold_judges_every_pair_alone() {
    let mut r = healthy("n", 2, 0.01);
    slow_pair(&mut r, 0, 1, 0.7); // 30% below its peers, but above the spec's floor
    slow_pair(&mut r, 2, 3, 0.4); // below the spec's floor
    let t = Thresholds {
        pair_bandwidth_gbps: Some(200.0),
        ..Thresholds::default()
    };
    let e = evaluate(&[NodeInput::measured(r)], &t);
    let pairs: Vec<_> = e
        .findings
        .iter()
        .filter(|f| f.metric == Metric::PairBandwidth)
        .collect();
    assert_eq!(pairs.len(), 1, "{pairs:#?}");
    assert_eq!(pairs[0].subject, Subject::gpu_pair("n", 2, 3));
    assert_eq!(pairs[0].source, Some(ExpectationSource::Threshold));
    assert_eq!(pairs[0].expected, Some(200.0));
}

/// An 8-GPU PCIe node of an unknown product: pairs on one CPU socket (0-3, 4-7) copy at
/// 25 GB/s, pairs across sockets at 15 GB/s.
fn pcie_node(name: &str, seed: u64) -> CompactResult {
    let mut r = node_of(name, "NVIDIA L40S", 8, seed, 0.0);
    let mut n = Noise(seed + 99, 0.02);
    for a in 0..8usize {
        for b in 0..8usize {
            if a != b {
                let same_socket = (a < 4) == (b < 4);
                r.copy_uni[a * 8 + b] = n.scale(if same_socket { 25.0 } else { 15.0 });
            }
        }
    }
    r.copy_bidir.clear();
    for h in &mut r.health {
        h.nvlinks = (0, 0);
        h.pcie = (4, 4, 16, 16);
    }
    r
}

#[test]
fn pcie_topologies_are_not_judged_against_the_nodes_own_pairs() {
    let e = run(vec![pcie_node("p", 1)]);
    assert!(e.findings.is_empty(), "{:#?}", e.findings);
    let e = run((0..6).map(|i| pcie_node(&format!("p{i}"), i)).collect());
    assert!(e.findings.is_empty(), "{:#?}", e.findings);
}

#[test]
fn on_pcie_topologies_a_pair_is_compared_with_the_same_pair_of_other_nodes() {
    let mut fleet: Vec<CompactResult> = (0..6).map(|i| pcie_node(&format!("p{i}"), i)).collect();
    // Across sockets, 1 <-> 6 at half speed; all of GPU 3's pairs at 60%.
    fleet[2].copy_uni[8 + 6] *= 0.5;
    fleet[2].copy_uni[6 * 8 + 1] *= 0.5;
    for peer in 0..8usize {
        if peer != 3 {
            fleet[4].copy_uni[3 * 8 + peer] *= 0.6;
            fleet[4].copy_uni[peer * 8 + 3] *= 0.6;
        }
    }
    let e = run(fleet);
    let f2 = on(&e, "p2");
    assert_eq!(f2.len(), 1, "{f2:#?}");
    assert_eq!(f2[0].subject, Subject::gpu_pair("p2", 1, 6));
    assert_eq!(f2[0].source, Some(ExpectationSource::Fleet));
    assert!(
        f2[0].message.contains("same GPU pairs"),
        "{}",
        f2[0].message
    );
    let f4 = on(&e, "p4");
    assert_eq!(f4.len(), 1, "{f4:#?}");
    assert_eq!(f4[0].subject, Subject::gpu("p4", 3));
    assert_eq!(e.findings.len(), 2, "{:#?}", e.findings);
}

#[test]
fn blame_names_the_smallest_part() {
    use super::gpu_pairs::blame;
    let all: BTreeSet<(u32, u32)> = (0..4u32)
        .flat_map(|a| ((a + 1)..4).map(move |b| (a, b)))
        .collect();
    let set = |v: &[(u32, u32)]| v.iter().copied().collect::<BTreeSet<_>>();
    // One pair.
    let b = blame(4, &all, &set(&[(1, 2)]));
    assert_eq!(
        (b.node, b.gpus.clone(), b.pairs.clone()),
        (false, vec![], vec![(1, 2)])
    );
    // Every pair of GPU 2.
    let b = blame(4, &all, &set(&[(0, 2), (1, 2), (2, 3), (0, 1)]));
    assert_eq!(
        (b.node, b.gpus.clone(), b.pairs.clone()),
        (false, vec![2], vec![(0, 1)])
    );
    // Every pair.
    let b = blame(4, &all, &all);
    assert!(b.node);
    // Two GPUs: a single pair is that pair, never a GPU.
    let two = set(&[(0, 1)]);
    let b = blame(2, &two, &two);
    assert_eq!((b.node, b.gpus, b.pairs), (false, vec![], vec![(0, 1)]));
}

#[test]
fn two_gpus_slow_to_everyone_are_blamed_even_when_most_pairs_are_slow() {
    // A 4-GPU node where every copy into or out of GPUs 1 and 3 runs at half speed (as
    // traffic between them does on NVSwitch): 5 of 6 pairs slow, the median slow too.
    let mut r = node_of("n", "NVIDIA H200", 4, 7, 0.01);
    for (a, b) in [(0, 1), (0, 3), (1, 2), (1, 3), (2, 3)] {
        slow_pair(&mut r, a, b, 0.5);
    }
    let e = run(vec![r]);
    let subjects: Vec<Subject> = on(&e, "n")
        .iter()
        .filter(|f| f.severity == Severity::Critical)
        .map(|f| f.subject.clone())
        .collect();
    assert_eq!(subjects, vec![Subject::gpu("n", 1), Subject::gpu("n", 3)]);
}

#[test]
fn a_noisy_healthy_node_is_not_judged_against_its_fastest_pair() {
    // 3% noise on every pair of 8 GPUs: the fastest of 28 pairs sits well above the
    // median, and no healthy pair may fall below the bar drawn from it.
    for seed in 0..40 {
        let e = run(vec![node_of("n", "NVIDIA H100 80GB HBM3", 8, seed, 0.03)]);
        assert!(
            on(&e, "n").iter().all(|f| f.severity == Severity::Info),
            "seed {seed}: {:#?}",
            on(&e, "n")
        );
    }
}
