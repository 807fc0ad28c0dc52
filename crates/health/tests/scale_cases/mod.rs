//! Bad nodes at scale: the cases the localization is rehearsed on (`pairs::rehearse`), shared
//! by `tests/localize_at_scale.rs` and `examples/localize.rs`.

use gpufabric_api::baseline::Expectation;
use gpufabric_api::pair::NetTransport;
use gpufabric_api::suite::Pairing;
use gpufabric_health::pairs::rehearse::{Modelled, Network, Planning, Rehearsal, rehearse};
use gpufabric_health::pairs::rounds::{Candidate, plan_rounds, plan_with_partners};
use gpufabric_health::pairs::{PairBaseline, PairRules};
use std::collections::BTreeSet;

/// Seconds of one round of node pairs: the GPU e2e on 4 x H200 (bench/results/
/// gpu-e2e-h200x4-2026-11-28.md, step 9) took 56.7 s from the checks' end to the cordon for
/// 3 rounds (pods made, NCCL's rendezvous, 64 MiB over sockets): 18.9 s a round. A round's
/// pairs run at once, so a round lasts one pair test.
pub const ROUND_SECONDS: f64 = 18.9;

/// Seconds a round of node pairs lasts in the sim fleet paced as H200 nodes
/// (`FABRIC_SIM_PACE=h200`, `measure::sim::pace::Pace::h200`): the profile's node-pair test
/// at the top of its spread, since a round of hundreds of pairs ends with its slowest pair
/// (13 s, ±10%: 14.3 s); pod starts not included.
pub fn paced_round_seconds() -> f64 {
    let pace = gpufabric_measure::sim::pace::Pace::h200();
    pace.node_pair * (1.0 + pace.spread)
}

/// A healthy pair of the modelled fleet: 8 x 400 Gb/s InfiniBand, all_reduce busbw (the sim
/// backend's model).
pub const HEALTHY_GBPS: f64 = 368.0;

/// Nodes of one topology block (under one leaf switch).
pub const BLOCK: usize = 16;

/// One case: a fleet, its network, what is wrong in it.
pub struct Case {
    pub name: String,
    pub nodes: Vec<Candidate>,
    /// How the rounds pair the nodes, and the seed of the shuffle (`Random`).
    pub pairing: Pairing,
    pub seed: u64,
    /// Partners a node meets in the planned rounds (2, or 1 for one a night).
    pub partners: u32,
    pub network: Modelled,
    /// Nodes bad with every partner: each must be blamed.
    pub bad: BTreeSet<String>,
    /// A node slow in one round only: never blamed, its slow pair named.
    pub flaky: Option<String>,
    /// The block under a bad switch: no node of it blamed, every slow path out of it named.
    pub block: Option<BTreeSet<String>>,
}

/// `n` nodes `n0000`...; with `grouped`, labelled by block of [`BLOCK`] (`b000`...).
pub fn fleet(n: usize, grouped: bool) -> Vec<Candidate> {
    (0..n)
        .map(|i| Candidate {
            name: format!("n{i:04}"),
            group: grouped.then(|| format!("b{:03}", i / BLOCK)),
        })
        .collect()
}

/// `count` nodes spread over a fleet of `n` (every n/count-th, offset so that none is the
/// first or last).
fn spread(n: usize, count: usize) -> BTreeSet<String> {
    let step = n / count;
    (0..count)
        .map(|i| format!("n{:04}", i * step + step / 3 + 1))
        .collect()
}

fn healthy() -> Modelled {
    Modelled {
        healthy: HEALTHY_GBPS,
        transport: Some(NetTransport::Ib),
        ..Default::default()
    }
}

fn slowed(bad: &BTreeSet<String>, factor: f64) -> Modelled {
    Modelled {
        slow: bad.iter().map(|n| (n.clone(), factor)).collect(),
        ..healthy()
    }
}

/// The bad switch's case without the topology key: the planner pairs across the block as
/// anywhere else, and the block's nodes look slow with every partner.
pub fn switch_without_topology(n: usize) -> Case {
    let mut c = cases(n)
        .into_iter()
        .find(|c| c.block.is_some())
        .expect("the bad switch's case");
    c.name = format!("bad switch over a block of {BLOCK}, of {n} (no topology key)");
    c.nodes = fleet(n, false);
    c
}

/// A bad node whose every planned partner is bad too (three bad nodes): its two partners
/// are blamed after the first confirmation round, but it then has one partner fine
/// elsewhere (its first retest's), which rule 3 cannot tell from a slow path; the second
/// confirmation round gives it another and it is named.
pub fn bad_node_among_bad_partners(n: usize) -> Case {
    let nodes = fleet(n, false);
    let middle = format!("n{:04}", n / 2);
    let mut bad = partners(&nodes, &middle);
    bad.insert(middle);
    Case {
        name: format!("3 bad: one and both its partners, of {n}"),
        nodes,
        pairing: Pairing::Ring,
        seed: 0,
        partners: 2,
        network: slowed(&bad, 0.3),
        bad,
        flaky: None,
        block: None,
    }
}

/// `k` bad nodes in a row along the ring the planned rounds make (each the partner of the
/// next), from the middle of the fleet: every one but the two ends has only bad partners.
pub fn bad_run_along_the_ring(n: usize, k: usize) -> Case {
    let nodes = fleet(n, false);
    let plan = plan_rounds(&nodes, Pairing::Ring, 0);
    let mut bad = BTreeSet::new();
    let mut at = format!("n{:04}", n / 2);
    while bad.len() < k {
        bad.insert(at.clone());
        let next = plan
            .pairs()
            .filter_map(|p| {
                if p.a == at {
                    Some(&p.b)
                } else if p.b == at {
                    Some(&p.a)
                } else {
                    None
                }
            })
            .find(|p| !bad.contains(*p));
        match next {
            Some(next) => at = next.clone(),
            None => break,
        }
    }
    Case {
        name: format!("{k} bad in a row along the ring, of {n}"),
        nodes,
        pairing: Pairing::Ring,
        seed: 0,
        partners: 2,
        network: slowed(&bad, 0.3),
        bad,
        flaky: None,
        block: None,
    }
}

/// `count` bad nodes at places drawn from `seed` among `n`, the rounds shuffled with the
/// same seed (`Random` pairing): the localization must not rest on an even spacing.
pub fn random_bad(n: usize, count: usize, seed: u64) -> Case {
    let mut bad = BTreeSet::new();
    let mut draw = 0u64;
    while bad.len() < count {
        let key = format!("{seed}/{draw}");
        bad.insert(format!(
            "n{:04}",
            gpufabric_api::fnv1a(key.as_bytes()) % n as u64
        ));
        draw += 1;
    }
    Case {
        name: format!("{count} bad at random of {n}, random pairing (seed {seed})"),
        nodes: fleet(n, false),
        pairing: Pairing::Random,
        seed,
        partners: 2,
        network: slowed(&bad, 0.3),
        bad,
        flaky: None,
        block: None,
    }
}

/// The cases at `n` nodes (n at least 2 blocks).
pub fn cases(n: usize) -> Vec<Case> {
    let mut out = Vec::new();
    for count in [1, 5, 20] {
        let bad = spread(n, count);
        out.push(Case {
            name: format!("{count} bad of {n}"),
            nodes: fleet(n, false),
            pairing: Pairing::Ring,
            seed: 0,
            partners: 2,
            network: slowed(&bad, 0.3),
            bad,
            flaky: None,
            block: None,
        });
    }
    // The first pair of the first round, both bad.
    let nodes = fleet(n, false);
    let first = plan_rounds(&nodes, Pairing::Ring, 0).rounds[0].pairs[0].clone();
    let bad: BTreeSet<String> = [first.a, first.b].into();
    out.push(Case {
        name: format!("2 bad paired in round 1, of {n}"),
        nodes,
        pairing: Pairing::Ring,
        seed: 0,
        partners: 2,
        network: slowed(&bad, 0.3),
        bad,
        flaky: None,
        block: None,
    });
    // A good node whose every planned partner is bad: slow with both, its retest against a
    // known-good node clears it.
    let nodes = fleet(n, false);
    let bad = partners(&nodes, &format!("n{:04}", n / 2));
    out.push(Case {
        name: format!("2 bad sharing a good partner, of {n}"),
        nodes,
        pairing: Pairing::Ring,
        seed: 0,
        partners: 2,
        network: slowed(&bad, 0.3),
        bad,
        flaky: None,
        block: None,
    });
    // A bad switch above the third block: every path out of it at 30%.
    let block: BTreeSet<String> = (2 * BLOCK..3 * BLOCK).map(|i| format!("n{i:04}")).collect();
    out.push(Case {
        name: format!("bad switch over a block of {BLOCK}, of {n} (topology key)"),
        nodes: fleet(n, true),
        pairing: Pairing::Ring,
        seed: 0,
        partners: 2,
        network: Modelled {
            switches: vec![(block.clone(), 0.3)],
            ..healthy()
        },
        bad: BTreeSet::new(),
        flaky: None,
        block: Some(block),
    });
    // A node slow in the first of its two rounds only.
    let flaky = format!("n{:04}", n / 2 + 7);
    out.push(Case {
        name: format!("1 flaky in 1 round of 2, of {n}"),
        nodes: fleet(n, false),
        pairing: Pairing::Ring,
        seed: 0,
        partners: 2,
        network: Modelled {
            flaky: [(flaky.clone(), (0, 0.3))].into(),
            ..healthy()
        },
        bad: BTreeSet::new(),
        flaky: Some(flaky),
        block: None,
    });
    out
}

/// `case` with one partner a node a night (`nodePairs.partners: 1`), the ring's round taken
/// by `seed` (a ring run's day); what is bad stays where it was.
pub fn one_partner(mut case: Case, seed: u64) -> Case {
    case.name = format!("{}, one partner a night (seed {seed})", case.name);
    case.partners = 1;
    case.seed = seed;
    case
}

/// One partner a night: the two nodes of the night's first pair both bad, so each one's
/// only planned partner is bad too.
pub fn two_bad_paired(n: usize, seed: u64) -> Case {
    let nodes = fleet(n, false);
    let first = plan_with_partners(&nodes, Pairing::Ring, seed, 1).rounds[0].pairs[0].clone();
    let bad: BTreeSet<String> = [first.a, first.b].into();
    Case {
        name: format!("2 bad paired together, of {n}, one partner a night (seed {seed})"),
        nodes,
        pairing: Pairing::Ring,
        seed,
        partners: 1,
        network: slowed(&bad, 0.3),
        bad,
        flaky: None,
        block: None,
    }
}

/// The partners `node` meets in the planned rounds (ring, seed 0).
pub fn partners(nodes: &[Candidate], node: &str) -> BTreeSet<String> {
    plan_rounds(nodes, Pairing::Ring, 0)
        .pairs()
        .filter_map(|p| {
            if p.a == node {
                Some(p.b.clone())
            } else if p.b == node {
                Some(p.a.clone())
            } else {
                None
            }
        })
        .collect()
}

/// The test's baseline of healthy pairs (resting on `n` nodes over 7 days of 14 runs).
pub fn baseline(n: u32) -> PairBaseline {
    PairBaseline {
        transport: NetTransport::Ib,
        bytes: 1 << 30,
        expectation: Expectation {
            median: HEALTHY_GBPS,
            p10: HEALTHY_GBPS * 0.994,
            p90: HEALTHY_GBPS * 1.006,
            nodes: n,
            runs: 14,
            days: 7,
        },
    }
}

/// The case played through the operator's rounds, against `baseline` when given.
pub fn play(case: &Case, baseline: Option<PairBaseline>) -> Rehearsal {
    let baselines: Vec<PairBaseline> = baseline.into_iter().collect();
    rehearse(
        &case.nodes,
        Planning {
            pairing: case.pairing,
            seed: case.seed,
            partners: case.partners,
        },
        &case.network as &dyn Network,
        &PairRules::default(),
        Some(&baselines),
    )
}

/// What a rehearsal got right and wrong.
#[derive(Debug, Default)]
pub struct Score {
    /// Good nodes blamed (a flaky node or a node of a bad switch's block counts as good).
    pub good_blamed: Vec<String>,
    /// Bad nodes not blamed.
    pub missed: Vec<String>,
    /// Slow paths (out of the bad switch's block, or the flaky node's slow pair) not named
    /// as a node pair nor explained by a blamed node.
    pub paths_unnamed: usize,
    /// Slow paths there were.
    pub paths: usize,
}

pub fn score(case: &Case, r: &Rehearsal) -> Score {
    let blamed = r.blamed();
    let named = r.named_pairs();
    let mut s = Score {
        good_blamed: blamed.difference(&case.bad).cloned().collect(),
        missed: case.bad.difference(&blamed).cloned().collect(),
        ..Default::default()
    };
    // The slow paths the planned rounds measured.
    let plan = plan_with_partners(&case.nodes, case.pairing, case.seed, case.partners);
    for (round, pairs) in plan.rounds.iter().enumerate() {
        for p in &pairs.pairs {
            let (bw, _) = case.network.measure(&p.a, &p.b, round);
            let slow = bw < HEALTHY_GBPS * 0.75;
            let explained = case.bad.contains(&p.a) || case.bad.contains(&p.b);
            if slow && !explained {
                s.paths += 1;
                let key = (p.a.clone().min(p.b.clone()), p.a.clone().max(p.b.clone()));
                if !named.contains(&key) {
                    s.paths_unnamed += 1;
                }
            }
        }
    }
    s
}
