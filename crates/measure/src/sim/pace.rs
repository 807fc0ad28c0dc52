//! How long the simulated work lasts: seconds per node-check phase, per node-pair test and
//! per node count of the multi-node probe, slept in real time (with a seeded spread per node),
//! so that a run over the sim fleet takes as long as one on GPUs. Without a pace every phase
//! ends at once.

#![forbid(unsafe_code)]

use super::noise::Rng;
use gpufabric_api::result::Phase;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Duration;

/// Seconds each piece of simulated work lasts.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Pace {
    /// Seconds per node-check phase, by its name (`setup`, `health`, `ncclSweep`,
    /// `gpuPairs`, `ddpProbe`, `compute`); a phase not named ends at once.
    #[serde(default)]
    pub phases: BTreeMap<String, f64>,
    /// Seconds one node-pair test lasts, on each of its two ranks.
    #[serde(default)]
    pub node_pair: f64,
    /// Seconds the multi-node DDP probe lasts at each node count it measures.
    #[serde(default)]
    pub ddp_nodes: f64,
    /// Each node's time is the profile's times a factor drawn once per node and piece of
    /// work, uniform within 1 ± spread (0.1: ±10%).
    #[serde(default)]
    pub spread: f64,
}

/// Why a pace was refused.
#[derive(Debug, thiserror::Error)]
pub enum PaceError {
    #[error(
        "the sim pace must be a profile name (h200, none) or a YAML or JSON document with phases, nodePair, ddpNodes and spread: {0}"
    )]
    Parse(String),
    #[error(
        "the sim pace names a phase that does not exist: {0:?} (phases: setup, health, ncclSweep, gpuPairs, ddpProbe, compute)"
    )]
    UnknownPhase(String),
    #[error("the sim pace's times must be 0 to 3600 s and its spread 0 to 0.9; {0} is not")]
    OutOfRange(String),
}

const NODE_CHECK_PHASES: [Phase; 6] = [
    Phase::Setup,
    Phase::Health,
    Phase::NcclSweep,
    Phase::GpuPairs,
    Phase::DdpProbe,
    Phase::Compute,
];

impl Pace {
    /// The default suite on a 4 x H200 node, as measured on lent GPU hosts (bench/results):
    /// the node check 22-27 s (23 s idle, `h200x4-2026-11-26-states.md`; 21-24 s,
    /// `restructure-h100x4-2026-11-27.md`), split between its phases as estimated from
    /// their work (the NCCL sweep the largest part); a node-pair test at 64 MiB about 13 s
    /// (three rounds of the GPU end-to-end run took 57 s with their pod starts,
    /// `gpu-e2e-h200x4-2026-11-28.md`); the multi-node probe 34-37 s over its three node
    /// counts (`ddp-nodes-h200x4-2026-11-26/`), so 12 s a count. Spread ±10%.
    pub fn h200() -> Pace {
        let phases = [
            ("setup", 4.0),
            ("health", 1.0),
            ("ncclSweep", 10.0),
            ("gpuPairs", 4.0),
            ("ddpProbe", 3.0),
            ("compute", 2.5),
        ];
        Pace {
            phases: phases.iter().map(|(p, s)| (p.to_string(), *s)).collect(),
            node_pair: 13.0,
            ddp_nodes: 12.0,
            spread: 0.1,
        }
    }

    /// A profile by name (`h200`, `none`), or a document (YAML or JSON), checked.
    pub fn parse(text: &str) -> Result<Pace, PaceError> {
        let pace = match text.trim() {
            "h200" => Pace::h200(),
            "" | "none" => Pace::default(),
            doc => serde_yaml::from_str(doc).map_err(|e| PaceError::Parse(e.to_string()))?,
        };
        pace.check()?;
        Ok(pace)
    }

    fn check(&self) -> Result<(), PaceError> {
        for name in self.phases.keys() {
            if !NODE_CHECK_PHASES.iter().any(|p| p.api_name() == name) {
                return Err(PaceError::UnknownPhase(name.clone()));
            }
        }
        let times = self
            .phases
            .iter()
            .map(|(n, s)| (n.as_str(), *s))
            .chain([("nodePair", self.node_pair), ("ddpNodes", self.ddp_nodes)]);
        for (what, s) in times {
            if !(0.0..=3600.0).contains(&s) {
                return Err(PaceError::OutOfRange(format!("{what}: {s}")));
            }
        }
        if !(0.0..=0.9).contains(&self.spread) {
            return Err(PaceError::OutOfRange(format!("spread: {}", self.spread)));
        }
        Ok(())
    }

    /// How long `work` (a phase's name, `nodePair` or `ddpNodes`) lasts on `node` with noise
    /// seeded by `seed`: the same every time for the same three.
    pub fn of(&self, work: &str, node: &str, seed: u64) -> Duration {
        let base = match work {
            "nodePair" => self.node_pair,
            "ddpNodes" => self.ddp_nodes,
            phase => self.phases.get(phase).copied().unwrap_or(0.0),
        };
        if base <= 0.0 {
            return Duration::ZERO;
        }
        let u = Rng::new(seed, node, &format!("pace/{work}")).uniform();
        let factor = 1.0 + self.spread * (2.0 * u - 1.0);
        Duration::from_secs_f64(base * factor)
    }
}

static PACE: OnceLock<Pace> = OnceLock::new();

/// Sets this process's pace, once (the agent, from `--sim-pace`); a second call is ignored.
pub fn set(pace: Pace) {
    let _ = PACE.set(pace);
}

/// Sleeps as long as `work` lasts on `node` under this process's pace (none: not at all).
/// The thread sleeps: thousands of agents waiting at once cost no CPU.
pub(crate) fn spend(work: &str, node: &str, seed: u64) {
    if let Some(pace) = PACE.get() {
        let d = pace.of(work, node, seed);
        if !d.is_zero() {
            std::thread::sleep(d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_h200_profile_takes_a_node_check_of_22_to_27_seconds() {
        let pace = Pace::h200();
        for node in ["a", "b", "c", "d", "e"] {
            let total: f64 = NODE_CHECK_PHASES
                .iter()
                .map(|p| pace.of(p.api_name(), node, 7).as_secs_f64())
                .sum();
            assert!((22.0..=27.0).contains(&total), "{node}: {total}");
        }
        let pair = pace.of("nodePair", "a", 7).as_secs_f64();
        assert!((11.7..=14.3).contains(&pair), "{pair}");
    }

    #[test]
    fn spread_differs_by_node_and_repeats_for_the_same_node() {
        let pace = Pace::h200();
        let a = pace.of("ncclSweep", "node-a", 1);
        assert_eq!(a, pace.of("ncclSweep", "node-a", 1));
        assert_ne!(a, pace.of("ncclSweep", "node-b", 1));
        let (lo, hi) = (9.0, 11.0);
        assert!((lo..=hi).contains(&a.as_secs_f64()), "{a:?}");
    }

    #[test]
    fn a_pace_document_names_real_phases_and_sane_times() {
        let p =
            Pace::parse("{phases: {ncclSweep: 2.5}, nodePair: 1, spread: 0.2}").expect("parses");
        let sweep = p.of("ncclSweep", "n", 0).as_secs_f64();
        assert!((2.0..=3.0).contains(&sweep), "{sweep}");
        assert_eq!(p.of("health", "n", 0), Duration::ZERO);
        assert!(matches!(
            Pace::parse("{phases: {ncclSweeep: 2}}"),
            Err(PaceError::UnknownPhase(_))
        ));
        assert!(matches!(
            Pace::parse("{nodePair: -1}"),
            Err(PaceError::OutOfRange(_))
        ));
        assert_eq!(Pace::parse("none").expect("none"), Pace::default());
    }
}
