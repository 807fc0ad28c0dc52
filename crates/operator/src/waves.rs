//! Waves (`spec.rollout`): which of a run's nodes get their benchmark pod now. The nodes,
//! in the run's order, are cut into waves of `wave size` nodes; a wave's pods are created
//! once every node of the waves before it has a final result, and never while that would
//! put more than `wave size` of the run's nodes under test at once (a pod that ended but
//! still holds its node counts until it is gone).

/// What to do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaveStep {
    /// The wave under way, 0-based.
    pub wave: usize,
    /// Number of waves.
    pub waves: usize,
    /// Nodes (indices into the run's nodes) whose pods to create now.
    pub create: Vec<usize>,
}

/// The wave of node `index`.
pub fn wave_of(index: usize, wave_size: usize) -> usize {
    index / wave_size.max(1)
}

/// The next step for a run whose nodes are `done` (final result or not, in the run's
/// order), of which `to_create` have no pod yet and `occupying` hold their node now. None
/// when every node is done.
pub fn step(
    done: &[bool],
    to_create: &[usize],
    occupying: usize,
    wave_size: usize,
) -> Option<WaveStep> {
    let size = wave_size.max(1);
    let first = done.iter().position(|d| !d)?;
    let wave = wave_of(first, size);
    let room = size.saturating_sub(occupying);
    let create = to_create
        .iter()
        .copied()
        .filter(|i| wave_of(*i, size) == wave)
        .take(room)
        .collect();
    Some(WaveStep {
        wave,
        waves: done.len().div_ceil(size),
        create,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_next_wave_waits_for_every_node_of_the_one_before() {
        // 10 nodes in waves of 3: nodes 0..3 done except node 1.
        let mut done = vec![false; 10];
        done[0] = true;
        done[2] = true;
        let s = step(&done, &[3, 4, 5, 6], 1, 3).expect("a step");
        assert_eq!((s.wave, s.waves), (0, 4));
        assert!(s.create.is_empty(), "wave 1 waits for node 1");
        done[1] = true;
        let s = step(&done, &[3, 4, 5, 6], 0, 3).expect("a step");
        assert_eq!((s.wave, s.create), (1, vec![3, 4, 5]));
        // The last pod of wave 0 still holds its node: one fewer.
        let s = step(&done, &[3, 4, 5, 6], 1, 3).expect("a step");
        assert_eq!(s.create, vec![3, 4]);
        assert_eq!(step(&[true; 4], &[], 0, 3), None);
    }

    proptest! {
        /// Simulated runs: pods end in any order and linger a while after ending; at no
        /// moment do more than `wave size` nodes hold a pod.
        #[test]
        fn never_more_than_a_wave_of_nodes_under_test(
            n in 1usize..60,
            size in 1usize..12,
            seed in any::<u64>(),
        ) {
            let mut rng = seed;
            let mut next = || { rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); (rng >> 33) as usize };
            // 0: no pod, 1: running, 2: ended but holding, 3: gone.
            let mut state = vec![0u8; n];
            let mut steps = 0;
            loop {
                let done: Vec<bool> = state.iter().map(|s| *s >= 2).collect();
                let to_create: Vec<usize> = (0..n).filter(|i| state[*i] == 0).collect();
                let occupying = state.iter().filter(|s| **s == 1 || **s == 2).count();
                let Some(s) = step(&done, &to_create, occupying, size) else { break };
                for i in s.create { state[i] = 1; }
                let held = state.iter().filter(|s| **s == 1 || **s == 2).count();
                prop_assert!(held <= size, "{held} nodes under test, wave size {size}");
                // Something happens to one node under test.
                let busy: Vec<usize> = (0..n).filter(|i| state[*i] == 1 || state[*i] == 2).collect();
                if let Some(&i) = busy.get(next() % busy.len().max(1)) { state[i] += 1; }
                steps += 1;
                prop_assert!(steps < 10 * n + 10, "the run makes progress");
            }
            prop_assert!(state.iter().all(|s| *s >= 2));
        }
    }
}
