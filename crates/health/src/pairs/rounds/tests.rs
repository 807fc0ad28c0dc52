use super::*;
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

fn nodes(n: usize) -> Vec<Candidate> {
    (0..n)
        .map(|i| Candidate {
            name: format!("n{i:04}"),
            group: None,
        })
        .collect()
}

fn grouped(sizes: &[usize]) -> Vec<Candidate> {
    sizes
        .iter()
        .enumerate()
        .flat_map(|(g, &size)| {
            (0..size).map(move |i| Candidate {
                name: format!("g{g}-n{i:03}"),
                group: Some(format!("rack-{g}")),
            })
        })
        .collect()
}

/// Partners of each node in the rounds of one set.
fn partners(plan: &RoundPlan, set: PairSet) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for round in plan.rounds.iter().filter(|r| r.set == set) {
        for p in &round.pairs {
            out.entry(p.a.clone()).or_default().insert(p.b.clone());
            out.entry(p.b.clone()).or_default().insert(p.a.clone());
        }
    }
    out
}

fn group_of(nodes: &[Candidate]) -> BTreeMap<String, Option<String>> {
    nodes
        .iter()
        .map(|n| (n.name.clone(), n.group.clone()))
        .collect()
}

/// Checks that hold for every plan: rounds are matchings of known, distinct nodes, no pair
/// is tested twice, and each set keeps to its side of the groups.
fn check_plan(nodes: &[Candidate], plan: &RoundPlan) -> Result<(), TestCaseError> {
    let groups = group_of(nodes);
    let mut seen = BTreeSet::new();
    for round in &plan.rounds {
        prop_assert!(!round.pairs.is_empty(), "empty round");
        let mut busy = BTreeSet::new();
        for p in &round.pairs {
            prop_assert_ne!(&p.a, &p.b);
            prop_assert!(groups.contains_key(&p.a) && groups.contains_key(&p.b));
            prop_assert!(busy.insert(p.a.clone()), "{} twice in a round", p.a);
            prop_assert!(busy.insert(p.b.clone()), "{} twice in a round", p.b);
            prop_assert!(seen.insert(unordered(p)), "pair {p:?} tested twice");
            let same = groups.get(&p.a) == groups.get(&p.b);
            match round.set {
                PairSet::Within => prop_assert!(same, "within pair across groups: {p:?}"),
                PairSet::Across => prop_assert!(!same, "across pair within a group: {p:?}"),
            }
        }
    }
    Ok(())
}

#[test]
fn eight_nodes_in_a_ring_take_two_rounds_of_four_pairs() {
    let plan = plan_rounds(&nodes(8), Pairing::Ring, 0);
    assert_eq!(plan.rounds.len(), 2);
    assert!(plan.rounds.iter().all(|r| r.pairs.len() == 4));
    let p = partners(&plan, PairSet::Within);
    assert!(p.values().all(|s| s.len() == 2), "{p:?}");
    // The circle method: n0 fixed, the others shifted by one.
    assert_eq!(
        plan.rounds[0].pairs[0],
        NodePair {
            a: "n0000".into(),
            b: "n0007".into()
        }
    );
    assert_eq!(plan.rounds[1].pairs[0].b, "n0006");
}

#[test]
fn an_odd_count_takes_three_rounds_so_the_node_that_sits_out_still_meets_two() {
    let plan = plan_rounds(&nodes(5), Pairing::Ring, 0);
    assert_eq!(plan.rounds.len(), 3);
    assert!(plan.rounds.iter().all(|r| r.pairs.len() == 2));
    let p = partners(&plan, PairSet::Within);
    assert_eq!(p.len(), 5);
    assert!(p.values().all(|s| s.len() >= 2), "{p:?}");
}

#[test]
fn two_nodes_meet_once_and_one_node_meets_nobody() {
    let plan = plan_rounds(&nodes(2), Pairing::Ring, 0);
    assert_eq!(plan.rounds.len(), 1);
    assert_eq!(plan.pairs().count(), 1);
    assert!(plan_rounds(&nodes(1), Pairing::Ring, 0).rounds.is_empty());
    assert!(plan_rounds(&nodes(0), Pairing::Random, 9).rounds.is_empty());
}

#[test]
fn the_number_of_rounds_does_not_grow_with_the_fleet() {
    for n in [16, 128, 1000, 1001] {
        let plan = plan_rounds(&nodes(n), Pairing::Ring, 0);
        assert!(
            plan.rounds.len() <= 3,
            "{n} nodes: {} rounds",
            plan.rounds.len()
        );
        assert!(plan.rounds.iter().all(|r| r.pairs.len() == n / 2));
    }
}

#[test]
fn random_pairing_depends_on_the_recorded_seed_only() {
    let a = plan_rounds(&nodes(32), Pairing::Random, 7);
    let b = plan_rounds(&nodes(32), Pairing::Random, 7);
    let c = plan_rounds(&nodes(32), Pairing::Random, 8);
    assert_eq!(a, b);
    assert_eq!(a.seed, 7);
    assert_ne!(a.rounds, c.rounds);
    assert_ne!(a.rounds, plan_rounds(&nodes(32), Pairing::Ring, 7).rounds);
}

#[test]
fn all_pairs_tests_every_two_nodes_exactly_once() {
    let plan = plan_rounds(&nodes(7), Pairing::All, 0);
    assert_eq!(plan.pairs().count(), 21);
    assert_eq!(plan.rounds.len(), 7);
}

#[test]
fn racks_pair_inside_first_then_across_as_a_separate_set() {
    let nodes = grouped(&[4, 4]);
    let plan = plan_rounds(&nodes, Pairing::Ring, 0);
    let sets: Vec<PairSet> = plan.rounds.iter().map(|r| r.set).collect();
    assert_eq!(
        sets,
        vec![
            PairSet::Within,
            PairSet::Within,
            PairSet::Across,
            PairSet::Across
        ]
    );
    // Both racks run at once in a within round.
    assert_eq!(plan.rounds[0].pairs.len(), 4);
    let across = partners(&plan, PairSet::Across);
    assert_eq!(
        across.len(),
        8,
        "every node meets the other rack: {across:?}"
    );
}

#[test]
fn nodes_without_the_label_form_a_group_of_their_own() {
    let mut nodes = grouped(&[3]);
    nodes.extend(nodes_named(&["x1", "x2", "x3"]));
    let plan = plan_rounds(&nodes, Pairing::Ring, 0);
    let within = partners(&plan, PairSet::Within);
    assert_eq!(
        within
            .get("x1")
            .map(|s| s.iter().cloned().collect::<Vec<_>>()),
        Some(vec!["x2".to_string(), "x3".to_string()])
    );
}

fn nodes_named(names: &[&str]) -> Vec<Candidate> {
    names
        .iter()
        .map(|n| Candidate {
            name: n.to_string(),
            group: None,
        })
        .collect()
}

#[test]
fn a_node_listed_twice_is_planned_once() {
    let mut n = nodes(4);
    n.push(n[0].clone());
    let plan = plan_rounds(&n, Pairing::Ring, 0);
    assert!(plan.rounds.iter().all(|r| r.pairs.len() == 2));
}

fn pairing() -> impl Strategy<Value = Pairing> {
    prop_oneof![
        Just(Pairing::Ring),
        Just(Pairing::Random),
        Just(Pairing::All)
    ]
}

proptest! {
    #[test]
    fn every_round_is_a_matching_and_each_node_meets_two_partners(
        n in 0usize..80,
        pairing in pairing(),
        seed in any::<u64>(),
    ) {
        let nodes = nodes(n);
        let plan = plan_rounds(&nodes, pairing, seed);
        check_plan(&nodes, &plan)?;
        let p = partners(&plan, PairSet::Within);
        for node in &nodes {
            let met = p.get(&node.name).map_or(0, BTreeSet::len);
            prop_assert!(met >= 2.min(n - 1), "{} met {met} of {n}", node.name);
        }
        if pairing != Pairing::All {
            prop_assert!(plan.rounds.len() <= 3);
        }
    }

    #[test]
    fn groups_keep_within_and_across_apart_and_everyone_crosses_when_no_group_is_a_majority(
        sizes in proptest::collection::vec(1usize..12, 1..6),
        pairing in pairing(),
        seed in any::<u64>(),
    ) {
        let nodes = grouped(&sizes);
        let plan = plan_rounds(&nodes, pairing, seed);
        check_plan(&nodes, &plan)?;
        let within = partners(&plan, PairSet::Within);
        for (g, &size) in sizes.iter().enumerate() {
            for i in 0..size {
                let name = format!("g{g}-n{i:03}");
                let met = within.get(&name).map_or(0, BTreeSet::len);
                prop_assert!(met >= 2.min(size - 1), "{name} met {met} in a group of {size}");
            }
        }
        let total: usize = sizes.iter().sum();
        let largest = sizes.iter().copied().max().unwrap_or(0);
        if sizes.len() >= 2 && largest * 2 <= total {
            let across = partners(&plan, PairSet::Across);
            prop_assert_eq!(across.len(), total, "someone never met another group");
        }
        if pairing != Pairing::All {
            prop_assert!(plan.rounds.len() <= 5);
        }
    }
}

fn ring_or_random() -> impl Strategy<Value = Pairing> {
    prop_oneof![Just(Pairing::Ring), Just(Pairing::Random)]
}

proptest! {
    /// Rule 5: one partner a node. Every node of a group of two or more meets at least one
    /// partner (the bye of an odd group included), at most the bye's partner meets two, and
    /// the plan holds one round (two for an odd group).
    #[test]
    fn with_one_partner_every_node_meets_one_and_no_node_is_left_out(
        n in 0usize..80,
        pairing in ring_or_random(),
        seed in any::<u64>(),
    ) {
        let nodes = nodes(n);
        let plan = plan_with_partners(&nodes, pairing, seed, 1);
        check_plan(&nodes, &plan)?;
        let p = partners(&plan, PairSet::Within);
        let twice = p.values().filter(|m| m.len() > 1).count();
        for node in &nodes {
            let met = p.get(&node.name).map_or(0, BTreeSet::len);
            prop_assert!(met >= 1.min(n.saturating_sub(1)), "{} met {met} of {n}", node.name);
            prop_assert!(met <= 2, "{} met {met}", node.name);
        }
        prop_assert!(twice <= n % 2, "{twice} nodes met two partners among {n}");
        let rounds = if n < 2 { 0 } else if n % 2 == 1 && n >= 3 { 2 } else { 1 };
        prop_assert_eq!(plan.rounds.len(), rounds);
    }

    /// With topology groups, one partner within a group and one round across.
    #[test]
    fn with_one_partner_groups_meet_one_partner_within_and_cross_in_one_round(
        sizes in proptest::collection::vec(2usize..12, 2..6),
        pairing in ring_or_random(),
        seed in any::<u64>(),
    ) {
        let nodes = grouped(&sizes);
        let plan = plan_with_partners(&nodes, pairing, seed, 1);
        check_plan(&nodes, &plan)?;
        let within = partners(&plan, PairSet::Within);
        prop_assert_eq!(within.len(), nodes.len(), "a node met no partner in its group");
        let across_rounds = plan.rounds.iter().filter(|r| r.set == PairSet::Across).count();
        prop_assert!(across_rounds <= 1);
    }
}

#[test]
fn one_partner_a_night_meets_every_partner_of_an_even_ring_within_its_nights() {
    // 8 nodes: the circle's 7 rounds, one a night by the day, meet all 28 pairs once.
    let nodes = nodes(8);
    let mut met = BTreeSet::new();
    for day in 20_000..20_007 {
        let plan = plan_with_partners(&nodes, Pairing::Ring, day, 1);
        assert_eq!(plan.rounds.len(), 1);
        assert_eq!(plan.rounds[0].pairs.len(), 4);
        for p in plan.pairs() {
            assert!(met.insert(unordered(p)), "{p:?} met twice in a week");
        }
    }
    assert_eq!(met.len(), 28);
    // Two nights in a row meet different partners.
    let a = plan_with_partners(&nodes, Pairing::Ring, 20_000, 1);
    let b = plan_with_partners(&nodes, Pairing::Ring, 20_001, 1);
    assert!(
        a.pairs()
            .all(|p| !b.pairs().any(|q| unordered(p) == unordered(q)))
    );
}

#[test]
fn one_partner_keeps_the_usual_plan_for_all_pairing_and_two_partners() {
    let nodes = nodes(7);
    assert_eq!(
        plan_with_partners(&nodes, Pairing::All, 3, 1),
        plan_rounds(&nodes, Pairing::All, 3)
    );
    assert_eq!(
        plan_with_partners(&nodes, Pairing::Ring, 0, 2),
        plan_rounds(&nodes, Pairing::Ring, 0)
    );
}
