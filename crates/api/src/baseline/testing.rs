//! A baseline for tests: earlier runs that each measured one series alike.

use super::{BaselineKey, FleetBaseline, KeyedSample, RunSample, Spread};

/// The key of [`one_series`]'s runs: 8-GPU `h200` nodes of suite `s`, settings `n`.
pub fn key() -> BaselineKey {
    BaselineKey {
        product: "h200".into(),
        gpus: 8,
        suite: "s".into(),
        settings: "n".into(),
    }
}

/// A baseline fed one run per `(name, at)` of `runs`, each over 8 nodes of [`key`] with
/// `series` measured at `spread`.
pub fn one_series(series: &str, spread: Spread, runs: &[(&str, i64)]) -> FleetBaseline {
    runs.iter().fold(FleetBaseline::default(), |b, (run, at)| {
        let sample = KeyedSample {
            key: key(),
            sample: RunSample {
                run: (*run).into(),
                at: 0,
                nodes: 8,
                series: [(series.to_string(), spread)].into(),
            },
        };
        b.with_run(&[sample], *at)
    })
}
