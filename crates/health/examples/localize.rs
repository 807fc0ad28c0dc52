//! Bad nodes at scale, as a table: the operator's node-pair rounds and localization played
//! over a modelled fabric (`pairs::rehearse`), at 1,000 nodes and at 232 (the fleet of
//! NVIDIA's published group-testing counts), against the run alone and against a baseline;
//! the wall time of the rounds with the sim fleet's H200 pace (`FABRIC_SIM_PACE=h200`: the
//! node-pair test, 13 s ±10%) and with the pod starts measured on H200 nodes. Then the
//! cases at 1,000 nodes with one partner a node a night (`nodePairs.partners: 1`), on a
//! night whose circle round is the seed.
//!
//!     cargo run -p gpufabric-health --example localize

#[path = "../tests/scale_cases/mod.rs"]
#[allow(dead_code)]
mod scale_cases;

use scale_cases::{
    Case, ROUND_SECONDS, bad_node_among_bad_partners, bad_run_along_the_ring, baseline, cases,
    one_partner, paced_round_seconds, play, random_bad, score, switch_without_topology,
    two_bad_paired,
};

fn row(case: &Case, n: usize, with_baseline: bool) {
    let started = std::time::Instant::now();
    let r = play(case, with_baseline.then(|| baseline(n as u32)));
    let took = started.elapsed();
    let s = score(case, &r);
    let bad = case.bad.len();
    let named = bad - s.missed.len();
    let named = if s.missed.is_empty() {
        format!("{named}")
    } else {
        format!("**{named}**")
    };
    println!(
        "| {} | {} | {} ({} confirmation) | {} ({} retests) | {:.0} s | {:.0} s | {named} of {bad} | {} | {} of {} | {:.2} s |",
        case.name,
        if with_baseline {
            "baseline"
        } else {
            "run alone"
        },
        r.rounds,
        r.confirmation_rounds,
        r.pair_tests,
        r.retests,
        r.rounds as f64 * paced_round_seconds(),
        r.rounds as f64 * ROUND_SECONDS,
        if s.good_blamed.is_empty() {
            "none".to_string()
        } else {
            format!("**{}**", s.good_blamed.len())
        },
        s.paths - s.paths_unnamed,
        s.paths,
        took.as_secs_f64(),
    );
}

fn main() {
    println!(
        "| case | judged against | rounds | pair tests | paced wall time ({:.1} s a round) | with pod starts ({ROUND_SECONDS} s a round) | bad nodes blamed | good nodes blamed | slow paths named | rehearsal took |",
        paced_round_seconds()
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    for n in [1000, 232] {
        let mut all = cases(n);
        all.push(switch_without_topology(n));
        all.push(bad_node_among_bad_partners(n));
        all.extend([4, 8, 20].map(|k| bad_run_along_the_ring(n, k)));
        all.extend([1, 2].map(|seed| random_bad(n, 20, seed)));
        for case in &all {
            for with_baseline in [false, true] {
                row(case, n, with_baseline);
            }
        }
    }
    let n = 1000;
    let seed = 20_421;
    let mut all: Vec<Case> = cases(n).into_iter().map(|c| one_partner(c, seed)).collect();
    all.push(two_bad_paired(n, seed));
    all.push(one_partner(bad_run_along_the_ring(n, 8), seed));
    for case in &all {
        for with_baseline in [false, true] {
            row(case, n, with_baseline);
        }
    }
}
