//! Bad nodes at scale: the operator's node-pair rounds and localization played over a
//! modelled fabric of 1,000 nodes (no API server), each case against the run alone and
//! against a baseline: every bad node blamed, every slow path named, no good node blamed.
//! The table of rounds, pair tests and wall time: `cargo run -p gpufabric-health --example
//! localize`.

#[allow(dead_code)]
mod scale_cases;

use gpufabric_health::pairs::MAX_CONFIRMATION_ROUNDS;
use scale_cases::{
    Case, bad_node_among_bad_partners, bad_run_along_the_ring, baseline, cases, one_partner, play,
    random_bad, score, two_bad_paired,
};

const N: usize = 1000;

fn check(case: &Case, with_baseline: bool) {
    let r = play(case, with_baseline.then(|| baseline(N as u32)));
    let s = score(case, &r);
    let how = if with_baseline {
        "baseline"
    } else {
        "run alone"
    };
    assert!(
        s.good_blamed.is_empty(),
        "{} ({how}): good nodes blamed {:?}",
        case.name,
        s.good_blamed
    );
    assert!(
        s.missed.is_empty(),
        "{} ({how}): bad nodes not blamed {:?}",
        case.name,
        s.missed
    );
    assert_eq!(
        s.paths_unnamed, 0,
        "{} ({how}): {} of {} slow paths not named",
        case.name, s.paths_unnamed, s.paths
    );
    // Two planned rounds (four with the block's topology key), two confirmation rounds at
    // most; one partner a night plans half as many.
    let planned = if case.block.is_some() { 4 } else { 2 } / (3 - case.partners as usize);
    assert!(
        r.rounds <= planned + MAX_CONFIRMATION_ROUNDS,
        "{} ({how}): {} rounds",
        case.name,
        r.rounds
    );
    assert!(
        r.retests <= 4 * case.bad.len().max(1),
        "{} ({how}): {} retests",
        case.name,
        r.retests
    );
}

fn case(name_starts: &str) -> Case {
    cases(N)
        .into_iter()
        .find(|c| c.name.starts_with(name_starts))
        .expect("the case")
}

#[test]
fn one_bad_node_of_a_thousand_is_blamed_and_no_other() {
    check(&case("1 bad"), false);
    check(&case("1 bad"), true);
}

#[test]
fn five_bad_nodes_of_a_thousand_are_blamed_and_no_other() {
    check(&case("5 bad"), false);
    check(&case("5 bad"), true);
}

#[test]
fn twenty_bad_nodes_of_a_thousand_are_blamed_and_no_other() {
    check(&case("20 bad"), false);
    check(&case("20 bad"), true);
}

#[test]
fn twenty_bad_nodes_at_random_places_are_each_named_and_no_good_node_is_blamed() {
    for seed in [1, 2] {
        check(&random_bad(N, 20, seed), false);
        check(&random_bad(N, 20, seed), true);
    }
}

#[test]
fn two_bad_nodes_paired_in_the_first_round_are_both_blamed_and_no_other() {
    check(&case("2 bad paired"), false);
    check(&case("2 bad paired"), true);
}

#[test]
fn a_good_node_whose_every_partner_is_bad_is_cleared_by_its_retest_and_not_blamed() {
    let c = case("2 bad sharing");
    let good = format!("n{:04}", N / 2);
    assert_eq!(scale_cases::partners(&c.nodes, &good), c.bad);
    check(&c, false);
    check(&c, true);
}

#[test]
fn a_bad_switch_over_a_block_names_its_paths_and_blames_none_of_its_nodes() {
    let c = case("bad switch");
    check(&c, false);
    check(&c, true);
    let r = play(&c, Some(baseline(N as u32)));
    let block = c.block.as_ref().expect("a block");
    let named = r.named_pairs();
    assert!(!named.is_empty());
    assert!(
        named
            .iter()
            .all(|(a, b)| block.contains(a) != block.contains(b)),
        "only paths out of the block are named: {named:?}"
    );
}

#[test]
fn a_node_flaky_in_one_round_is_named_on_its_slow_pair_and_not_blamed() {
    let c = case("1 flaky");
    check(&c, false);
    check(&c, true);
    let flaky = c.flaky.clone().expect("a flaky node");
    let r = play(&c, None);
    assert!(
        r.named_pairs()
            .iter()
            .any(|(a, b)| *a == flaky || *b == flaky),
        "{:#?}",
        r.localization.findings
    );
}

#[test]
fn a_bad_node_whose_every_partner_is_bad_is_named_by_a_second_retest() {
    let c = bad_node_among_bad_partners(N);
    assert_eq!(c.bad.len(), 3);
    check(&c, false);
    check(&c, true);
    for with_baseline in [false, true] {
        let r = play(&c, with_baseline.then(|| baseline(N as u32)));
        assert_eq!(r.confirmation_rounds, 2, "baseline: {with_baseline}");
    }
}

#[test]
fn a_run_of_bad_nodes_along_the_ring_is_named_whole_and_no_good_node_is_blamed() {
    for k in [3, 4, 8, 20] {
        let c = bad_run_along_the_ring(N, k);
        assert_eq!(c.bad.len(), k);
        check(&c, false);
        check(&c, true);
    }
}

#[test]
fn without_suspects_left_unclear_no_second_confirmation_round_is_run() {
    for c in cases(N) {
        let r = play(&c, Some(baseline(N as u32)));
        assert!(r.confirmation_rounds <= 1, "{}: {:?}", c.name, r.rounds);
    }
}

/// Nights of one partner a node (`nodePairs.partners: 1`) on three rounds of the circle:
/// every case above still blames each bad node and no good one, in one planned round (two
/// with the block's topology key) and two confirmation rounds at most.
#[test]
fn with_one_partner_a_night_every_bad_node_is_blamed_and_no_good_one() {
    for seed in [0, 1, 20_421] {
        let mut all: Vec<Case> = cases(N).into_iter().map(|c| one_partner(c, seed)).collect();
        all.push(one_partner(bad_node_among_bad_partners(N), seed));
        all.push(one_partner(bad_run_along_the_ring(N, 8), seed));
        all.push(one_partner(random_bad(N, 20, seed + 3), seed));
        all.push(two_bad_paired(N, seed));
        for c in &all {
            check(c, false);
            check(c, true);
            let r = play(c, None);
            let planned = if c.block.is_some() { 2 } else { 1 };
            assert_eq!(r.rounds - r.confirmation_rounds, planned, "{}", c.name);
        }
    }
}

/// One partner a night, two bad nodes paired together: neither has a partner fine
/// elsewhere until the retests give each two (the second confirmation round), and both are
/// then named.
#[test]
fn with_one_partner_two_bad_nodes_paired_together_are_both_named_by_their_retests() {
    let c = two_bad_paired(N, 20_421);
    let r = play(&c, None);
    assert_eq!(r.blamed(), c.bad, "{:#?}", r.localization.findings);
    assert_eq!(r.confirmation_rounds, 2);
}
