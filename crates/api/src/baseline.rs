//! The fleet's baseline: what a FabricTest's passing nodes measured in its recent complete
//! runs, per GPU product, suite and NCCL settings (a [`BaselineKey`]), so that a node judged
//! without enough peers in its run (a gate, a repair, a small pool, the agent alone) has
//! something run alike to compare with.
//!
//! Each run adds one [`RunSample`] per key: for every [`Series`], the median, 10th and 90th
//! percentile of its passing nodes' values and how many there were. The baseline of a series
//! is the median over the window's runs of those run medians (and of their percentiles):
//! one bad run moves it no more than one run's worth, and its size does not grow with the
//! fleet. Bounded: at most [`MAX_KEYS`] keys (the most recently fed kept), each with at most
//! [`MAX_RUNS`] runs no older than [`MAX_AGE_SECONDS`], each with at most [`MAX_SERIES`]
//! series; `crates/api` tests the bytes of the largest (`bench/SCALE.md`).

use crate::counters::BaselineError;
use crate::pair::NetTransport;
use crate::suite::{Collective, Suite};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

/// Most runs kept per key: two weeks of nightly runs.
pub const MAX_RUNS: usize = 14;
/// Oldest run kept: seven days. A fleet's firmware, drivers and cabling change; an
/// expectation older than a week says less about today's nodes than none.
pub const MAX_AGE_SECONDS: i64 = 7 * 24 * 3600;
/// Most keys (product, GPU count, suite, settings) kept per test.
pub const MAX_KEYS: usize = 4;
/// Most series kept per run sample: the seven collectives, the node's slowest copies, DDP,
/// GEMM and memory, and room for the node pairs' transports and sizes, the probe's node
/// counts and the multi-node sweep's four collectives at its node counts.
pub const MAX_SERIES: usize = 48;
/// Most bytes of a stored or exported baseline read back (the largest one kept is about
/// 160 KB: `a_full_baseline_stays_small`).
pub const MAX_BYTES: usize = 1 << 20;
/// Fewest nodes (in one run of the window) a baseline must rest on before a node is judged
/// against it: the median of fewer says as much of one node as of the fleet.
pub const MIN_NODES: u32 = 3;

/// What runs must share for their numbers to be compared.
#[derive(
    Serialize, Deserialize, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, schemars::JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct BaselineKey {
    /// The GPU product, normalized (`h100`, `h200`, ...).
    pub product: String,
    /// GPUs a node measured.
    pub gpus: u32,
    /// The fingerprint of the suite measured with (its sizes, iterations and phases).
    pub suite: String,
    /// [`settings_fingerprint`] of the NCCL settings the test's spec chose.
    pub settings: String,
}

impl fmt::Display for BaselineKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} x{} (suite {}, NCCL settings {})",
            self.product, self.gpus, self.suite, self.settings
        )
    }
}

/// A short, stable fingerprint of the NCCL settings a test's spec chose: each `NCCL_*`
/// variable's name and value (`valueFrom` counts by its name alone), sorted, FNV-1a hashed.
/// Runs with other settings reach other numbers, so they never share a baseline.
pub fn settings_fingerprint<'a>(
    env: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
) -> String {
    let mut pairs: Vec<String> = env
        .into_iter()
        .filter(|(name, _)| name.starts_with("NCCL_"))
        .map(|(name, value)| format!("{name}={}", value.unwrap_or("")))
        .collect();
    pairs.sort();
    pairs.dedup();
    format!("{:016x}", crate::fnv1a(pairs.join("\n").as_bytes()))
}

/// The key of a run of `suite` with the spec's `env`, on nodes of `product` x `gpus`.
pub fn key_of<'a>(
    product: &str,
    gpus: u32,
    suite: &Suite,
    env: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
) -> BaselineKey {
    BaselineKey {
        product: product.to_string(),
        gpus,
        suite: suite.fingerprint(),
        settings: settings_fingerprint(env),
    }
}

/// One number a baseline keeps of each node (or node pair, or probe).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Series {
    /// A collective's peak bus bandwidth, GB/s.
    BusBw(Collective),
    /// The slowest one-way GPU-pair copy of the node, GB/s.
    WorstPair,
    /// The slowest bidirectional GPU-pair copy of the node, GB/s.
    WorstPairBidir,
    /// The slowest host-to-device copy of any GPU, GB/s.
    WorstH2d,
    /// The slowest device-to-host copy of any GPU, GB/s.
    WorstD2h,
    /// DDP scaling efficiency at this many GPUs (ratio).
    Ddp(u32),
    /// The node's median GPU's GEMM throughput, TFLOP/s.
    Gemm,
    /// The node's median GPU's memory bandwidth, GB/s.
    Memory,
    /// A node pair's bus bandwidth over a network transport at the suite's size in bytes
    /// (`nodePairs.bytes`), GB/s.
    NodePair(NetTransport, u64),
    /// The multi-node probe's scaling efficiency at this many nodes (ratio).
    Probe(u32),
    /// The multi-node NCCL sweep's bus bandwidth of a collective at its large sizes over this
    /// many nodes, GB/s.
    Sweep(Collective, u32),
}

impl Series {
    /// True when more is better (every series kept is a bandwidth, a throughput or an
    /// efficiency).
    pub fn higher_is_better(self) -> bool {
        true
    }

    /// Its unit in messages.
    pub fn unit(self) -> &'static str {
        match self {
            Series::Ddp(_) | Series::Probe(_) => "ratio",
            Series::Gemm => "TFLOP/s",
            _ => "GB/s",
        }
    }

    /// Its name in messages.
    pub fn label(self) -> String {
        match self {
            Series::BusBw(c) => format!("{} peak bus bandwidth", c.nccl_tests_name()),
            Series::WorstPair => "slowest GPU-pair copy".into(),
            Series::WorstPairBidir => "slowest bidirectional GPU-pair copy".into(),
            Series::WorstH2d => "slowest host-to-device copy".into(),
            Series::WorstD2h => "slowest device-to-host copy".into(),
            Series::Ddp(g) => format!("DDP scaling efficiency at {g} GPUs"),
            Series::Gemm => "median GPU's GEMM throughput".into(),
            Series::Memory => "median GPU's memory bandwidth".into(),
            Series::NodePair(t, b) => {
                format!(
                    "node-pair bus bandwidth over {} at {b} bytes",
                    transport_word(t)
                )
            }
            Series::Probe(n) => format!("multi-node probe efficiency at {n} nodes"),
            Series::Sweep(c, n) => format!(
                "multi-node NCCL sweep's {} bus bandwidth over {n} nodes",
                c.nccl_tests_name()
            ),
        }
    }
}

fn transport_word(t: NetTransport) -> &'static str {
    match t {
        NetTransport::Ib => "ib",
        NetTransport::Roce => "roce",
        NetTransport::Socket => "socket",
        NetTransport::Unknown => "unknown",
    }
}

impl fmt::Display for Series {
    /// The stored name: `busbw.all_reduce`, `pair.worst`, `ddp.8`, `nodePair.ib.1073741824`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Series::BusBw(c) => write!(f, "busbw.{}", c.nccl_tests_name()),
            Series::WorstPair => f.write_str("pair.worst"),
            Series::WorstPairBidir => f.write_str("pairBidir.worst"),
            Series::WorstH2d => f.write_str("h2d.worst"),
            Series::WorstD2h => f.write_str("d2h.worst"),
            Series::Ddp(g) => write!(f, "ddp.{g}"),
            Series::Gemm => f.write_str("gemm"),
            Series::Memory => f.write_str("memory"),
            Series::NodePair(t, b) => write!(f, "nodePair.{}.{b}", transport_word(*t)),
            Series::Probe(n) => write!(f, "probe.{n}"),
            Series::Sweep(c, n) => write!(f, "sweep.{}.{n}", c.nccl_tests_name()),
        }
    }
}

impl FromStr for Series {
    type Err = BaselineError;

    fn from_str(s: &str) -> Result<Series, BaselineError> {
        let bad = || BaselineError::Malformed(format!("unknown baseline series {s:?}"));
        let mut parts = s.split('.');
        let head = parts.next().unwrap_or_default();
        let rest: Vec<&str> = parts.collect();
        let num = |i: usize| {
            rest.get(i)
                .and_then(|v| v.parse::<u64>().ok())
                .ok_or_else(bad)
        };
        let small = |i: usize| num(i).and_then(|v| u32::try_from(v).map_err(|_| bad()));
        let collective = |name: &str| {
            Collective::ALL
                .into_iter()
                .find(|c| c.nccl_tests_name() == name)
                .ok_or_else(bad)
        };
        Ok(match (head, rest.as_slice()) {
            ("busbw", [name]) => Series::BusBw(collective(name)?),
            ("pair", ["worst"]) => Series::WorstPair,
            ("pairBidir", ["worst"]) => Series::WorstPairBidir,
            ("h2d", ["worst"]) => Series::WorstH2d,
            ("d2h", ["worst"]) => Series::WorstD2h,
            ("ddp", [_]) => Series::Ddp(small(0)?),
            ("gemm", []) => Series::Gemm,
            ("memory", []) => Series::Memory,
            ("nodePair", [t, _]) => {
                let t = [
                    NetTransport::Ib,
                    NetTransport::Roce,
                    NetTransport::Socket,
                    NetTransport::Unknown,
                ]
                .into_iter()
                .find(|x| transport_word(*x) == *t)
                .ok_or_else(bad)?;
                Series::NodePair(t, num(1)?)
            }
            ("probe", [_]) => Series::Probe(small(0)?),
            ("sweep", [name, _]) => Series::Sweep(collective(name)?, small(1)?),
            _ => return Err(bad()),
        })
    }
}

/// How one series spread over the passing nodes of one run.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, schemars::JsonSchema)]
pub struct Spread {
    /// Median.
    #[serde(rename = "m")]
    pub median: f64,
    /// 10th percentile.
    #[serde(rename = "lo")]
    pub p10: f64,
    /// 90th percentile.
    #[serde(rename = "hi")]
    pub p90: f64,
    /// Values it rests on (stored as `c`: a bare `n` is the boolean false in YAML 1.1, which
    /// Helm reads CRDs in).
    #[serde(rename = "c")]
    pub n: u32,
}

impl Spread {
    /// The spread of `values` (finite and positive ones only), each number to four
    /// significant digits; None when none is left.
    pub fn of(values: &[f64]) -> Option<Spread> {
        let mut v: Vec<f64> = values
            .iter()
            .copied()
            .filter(|x| x.is_finite() && *x > 0.0)
            .collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        Some(Spread {
            median: round4(quantile(&v, 0.5)),
            p10: round4(quantile(&v, 0.1)),
            p90: round4(quantile(&v, 0.9)),
            n: u32::try_from(v.len()).unwrap_or(u32::MAX),
        })
    }
}

/// The `q` quantile of sorted, non-empty `v`, linearly interpolated.
fn quantile(v: &[f64], q: f64) -> f64 {
    let pos = q * (v.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    v[lo] + (v[hi] - v[lo]) * (pos - lo as f64)
}

/// Four significant digits (the stored numbers are measurements, not more precise).
fn round4(v: f64) -> f64 {
    if !v.is_finite() || v <= 0.0 {
        return v;
    }
    let scale = 10f64.powi(3 - v.log10().floor() as i32);
    (v * scale).round() / scale
}

/// What the passing nodes of one run measured, for one key.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunSample {
    /// The run.
    pub run: String,
    /// When it finished, seconds since the Unix epoch.
    pub at: i64,
    /// Passing nodes it rests on.
    pub nodes: u32,
    /// Each series by its stored name ([`Series`]'s `Display`).
    pub series: BTreeMap<String, Spread>,
}

impl RunSample {
    /// The spread of one series, if the run measured it.
    pub fn get(&self, s: Series) -> Option<&Spread> {
        self.series.get(&s.to_string())
    }
}

/// A run's sample for one key: what a run's status carries until its test folds it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeyedSample {
    pub key: BaselineKey,
    pub sample: RunSample,
}

/// The runs of one key, oldest first.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BaselineEntry {
    pub key: BaselineKey,
    pub runs: Vec<RunSample>,
}

/// A test's baseline: its keys, the most recently fed first.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FleetBaseline {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub entries: Vec<BaselineEntry>,
}

/// What a baseline expects of one series.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Expectation {
    /// Median of the runs' medians.
    pub median: f64,
    /// Median of the runs' 10th percentiles.
    pub p10: f64,
    /// Median of the runs' 90th percentiles.
    pub p90: f64,
    /// The most passing nodes one run of the window measured it on.
    pub nodes: u32,
    /// Runs that measured it.
    pub runs: u32,
    /// Days from its oldest run to `now`, at least 1.
    pub days: u32,
}

impl FleetBaseline {
    /// Parses an exported or stored baseline; never panics on what a person wrote.
    pub fn parse(text: &str) -> Result<FleetBaseline, BaselineError> {
        if text.len() > MAX_BYTES {
            return Err(BaselineError::Malformed(format!(
                "{} bytes, over the {MAX_BYTES}-byte limit of a baseline",
                text.len()
            )));
        }
        serde_json::from_str(text).map_err(|e| BaselineError::Malformed(e.to_string()))
    }

    /// The runs kept for `key`, oldest first.
    pub fn runs(&self, key: &BaselineKey) -> &[RunSample] {
        self.entries
            .iter()
            .find(|e| &e.key == key)
            .map(|e| e.runs.as_slice())
            .unwrap_or(&[])
    }

    /// The baseline with a finished run's `samples` added at `at` (seconds since the epoch):
    /// a retried fold of the same run replaces its sample, runs older than
    /// [`MAX_AGE_SECONDS`] before `at` and beyond the newest [`MAX_RUNS`] go, a fed key
    /// becomes the most recent of at most [`MAX_KEYS`], and a key left with no run goes.
    pub fn with_run(&self, samples: &[KeyedSample], at: i64) -> FleetBaseline {
        let mut entries = self.entries.clone();
        let mut fed = Vec::new();
        for s in samples.iter().filter(|s| s.sample.nodes > 0) {
            let mut sample = s.sample.clone();
            sample.at = at;
            if sample.series.len() > MAX_SERIES {
                let keep: Vec<String> = sample.series.keys().take(MAX_SERIES).cloned().collect();
                sample.series.retain(|k, _| keep.contains(k));
            }
            let mut entry = match entries.iter().position(|e| e.key == s.key) {
                Some(i) => entries.remove(i),
                None => BaselineEntry {
                    key: s.key.clone(),
                    runs: Vec::new(),
                },
            };
            entry.runs.retain(|r| r.run != sample.run);
            entry.runs.push(sample);
            entry.runs.sort_by_key(|r| r.at);
            fed.push(entry);
        }
        fed.extend(entries);
        for e in &mut fed {
            e.runs.retain(|r| at - r.at <= MAX_AGE_SECONDS);
            let excess = e.runs.len().saturating_sub(MAX_RUNS);
            e.runs.drain(..excess);
        }
        fed.retain(|e| !e.runs.is_empty());
        fed.truncate(MAX_KEYS);
        FleetBaseline { entries: fed }
    }

    /// What the baseline of `key` expects of `series` at `now`: None until it rests on
    /// [`MIN_NODES`] nodes in one run of the window.
    pub fn expectation(&self, key: &BaselineKey, series: Series, now: i64) -> Option<Expectation> {
        let runs: Vec<(&RunSample, &Spread)> = self
            .runs(key)
            .iter()
            .filter(|r| now - r.at <= MAX_AGE_SECONDS)
            .filter_map(|r| r.get(series).map(|s| (r, s)))
            .collect();
        let nodes = runs.iter().map(|(_, s)| s.n).max()?;
        if nodes < MIN_NODES {
            return None;
        }
        let med = |f: fn(&Spread) -> f64| {
            let mut v: Vec<f64> = runs.iter().map(|(_, s)| f(s)).collect();
            v.sort_by(f64::total_cmp);
            quantile(&v, 0.5)
        };
        let oldest = runs.iter().map(|(r, _)| r.at).min().unwrap_or(now);
        Some(Expectation {
            median: med(|s| s.median),
            p10: med(|s| s.p10),
            p90: med(|s| s.p90),
            nodes,
            runs: runs.len() as u32,
            days: (((now - oldest).max(0) + 86_399) / 86_400).max(1) as u32,
        })
    }

    /// The stored and exported form.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

#[cfg(feature = "testing")]
pub mod testing;

#[cfg(test)]
mod tests;
