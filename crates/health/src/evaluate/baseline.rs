//! A node judged without enough peers in its run, against the fleet's baseline
//! ([`gpufabric_api::baseline`]): what the test's passing nodes of the same product, suite
//! and NCCL settings measured in recent complete runs.
//!
//! # Rules
//! 1. Who: a node whose run holds fewer than [`peers_needed`] comparable nodes (same product
//!    and GPU count). That is the fleet comparison's own minimum (`fleetMinNodes`): below it
//!    the run has no median worth holding a node to (a gate, a repair, a small pool, the agent
//!    alone), so the baseline stands in for the peers the run lacks.
//! 2. What: each [`Series`] the node measured that the baseline expects (it rests on at least
//!    [`gpufabric_api::baseline::MIN_NODES`] nodes in one run of the window), unless the
//!    spec's threshold holds it or the node's own findings already name it.
//! 3. When: far below, by both measures: more than the fleet's minimum relative gap
//!    (`fleetMinRelativeGap`) below the baseline's median, and further below its 10th
//!    percentile than that percentile is below the median (twice the low tail healthy nodes
//!    reach). A tight baseline holds to the gap; a loose one to its own spread.
//! 4. Then: a Critical Slow finding on the node, from [`ExpectationSource::Baseline`]. The
//!    spec's NCCL settings spare nothing here: the baseline was measured with the same ones.
//! 5. No baseline yet for the node's key: one Info says so, and the other rules judge alone.

use super::stats::{NodeStats, SeriesKey};
use super::{how_far, tenths_below_100};
use gpufabric_api::baseline::{
    BaselineKey, Expectation, FleetBaseline, KeyedSample, RunSample, Series, Spread,
};
use gpufabric_api::findings::{ExpectationSource, Finding, FindingKind, Metric, Severity, Subject};
use gpufabric_api::policy::Thresholds;
use gpufabric_api::result::CompactResult;
use std::collections::BTreeMap;

/// What the test's baseline expects of a node pair over `transport` at the suite's size
/// (`bytes`): what the test's passing nodes' pairs reached in recent complete runs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PairBaseline {
    pub transport: gpufabric_api::pair::NetTransport,
    pub bytes: u64,
    pub expectation: Expectation,
}

/// What a run is judged against besides itself: the test's baseline and what makes a run
/// alike (the suite's and the spec's NCCL settings' fingerprints).
#[derive(Clone, Copy, Debug)]
pub struct Against<'a> {
    pub baseline: &'a FleetBaseline,
    /// [`gpufabric_api::suite::Suite::fingerprint`] of the run's suite.
    pub suite: &'a str,
    /// [`gpufabric_api::baseline::settings_fingerprint`] of the spec's NCCL settings.
    pub settings: &'a str,
    /// Now, seconds since the Unix epoch.
    pub now: i64,
}

impl Against<'_> {
    /// The key of a node of `group` (normalized product, GPU count).
    pub fn key(&self, group: &(String, u32)) -> BaselineKey {
        BaselineKey {
            product: group.0.clone(),
            gpus: group.1,
            suite: self.suite.to_string(),
            settings: self.settings.to_string(),
        }
    }

    /// What the baseline expects of `series` among the keys of this suite and these NCCL
    /// settings (node pairs and the probe span nodes, so no one node's product picks the
    /// key): the expectation resting on the most nodes.
    pub fn across_keys(&self, series: Series) -> Option<Expectation> {
        self.baseline
            .entries
            .iter()
            .filter(|e| e.key.suite == self.suite && e.key.settings == self.settings)
            .filter_map(|e| self.baseline.expectation(&e.key, series, self.now))
            .max_by_key(|e| e.nodes)
    }

    /// The baselines of node pairs at the suite's size `bytes`, one per transport that has
    /// one (what [`crate::pairs::localize_against`] judges against).
    pub fn node_pairs(&self, bytes: u64) -> Vec<PairBaseline> {
        use gpufabric_api::pair::NetTransport;
        [
            NetTransport::Ib,
            NetTransport::Roce,
            NetTransport::Socket,
            NetTransport::Unknown,
        ]
        .into_iter()
        .filter_map(|transport| {
            let expectation = self.across_keys(Series::NodePair(transport, bytes))?;
            Some(PairBaseline {
                transport,
                bytes,
                expectation,
            })
        })
        .collect()
    }
}

/// The numbers a baseline keeps of one passing node, by the group it is compared in.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct NodeSeries {
    /// Normalized product and GPU count.
    pub group: (String, u32),
    pub values: BTreeMap<Series, f64>,
}

/// Fewest comparable nodes in a run for the run to judge them by its own median: with
/// fewer, a node is judged against the baseline (rule 1).
pub fn peers_needed(t: &Thresholds) -> usize {
    t.fleet_min_nodes.max(2) as usize
}

/// The numbers of one node the baseline keeps: the values its own rules filled (only what
/// they judged: a sweep or copy too short to judge feeds nothing), and its slowest GPU pairs
/// from its result where its pairs were judged.
pub(super) fn series_of(s: &NodeStats, r: &CompactResult) -> NodeSeries {
    let mut values: BTreeMap<Series, f64> = BTreeMap::new();
    let mut worst = |series: Series, v: f64| {
        if v.is_finite() && v > 0.0 {
            values
                .entry(series)
                .and_modify(|w| *w = w.min(v))
                .or_insert(v);
        }
    };
    for (k, v) in &s.values {
        let series = match (k.metric, k.collective, k.gpu, k.peer) {
            (Metric::NcclBusBw, Some(c), None, None) => Series::BusBw(c),
            (Metric::H2dBandwidth, _, Some(_), None) => Series::WorstH2d,
            (Metric::D2hBandwidth, _, Some(_), None) => Series::WorstD2h,
            (Metric::DdpScalingEfficiency, None, None, None) => Series::Ddp(s.group.1),
            (Metric::GemmThroughput, None, None, None) => Series::Gemm,
            (Metric::MemoryBandwidth, None, None, None) => Series::Memory,
            _ => continue,
        };
        worst(series, *v);
    }
    let judged = |m: Metric| s.values.contains_key(&SeriesKey::of_node(m));
    let pairs = || (0..r.gpus).flat_map(|a| (0..r.gpus).map(move |b| (a, b)));
    if judged(Metric::PairBandwidth) {
        for (a, b) in pairs() {
            if let Some(v) = r.pair_uni(a, b) {
                worst(Series::WorstPair, v);
            }
        }
    }
    if judged(Metric::PairBidirBandwidth) {
        for (a, b) in pairs().filter(|(a, b)| a < b) {
            if let Some(v) = r.pair_bidir(a, b) {
                worst(Series::WorstPairBidir, v);
            }
        }
    }
    NodeSeries {
        group: s.group.clone(),
        values,
    }
}

/// The finding's metric and collective for a series judged per node.
fn metric_of(series: Series) -> Option<(Metric, Option<gpufabric_api::suite::Collective>)> {
    Some(match series {
        Series::BusBw(c) => (Metric::NcclBusBw, Some(c)),
        Series::WorstPair => (Metric::PairBandwidth, None),
        Series::WorstPairBidir => (Metric::PairBidirBandwidth, None),
        Series::WorstH2d => (Metric::H2dBandwidth, None),
        Series::WorstD2h => (Metric::D2hBandwidth, None),
        Series::Ddp(_) => (Metric::DdpScalingEfficiency, None),
        Series::Gemm => (Metric::GemmThroughput, None),
        Series::Memory => (Metric::MemoryBandwidth, None),
        Series::NodePair(..) | Series::Probe(_) | Series::Sweep(..) => return None,
    })
}

/// Whether `value` is far below `e` (rule 3), with the fleet's minimum relative gap.
pub fn far_below(value: f64, e: &Expectation, min_gap: f64) -> bool {
    let by_gap = e.median * (1.0 - min_gap.max(0.0));
    let by_spread = e.p10 - (e.median - e.p10).max(0.0);
    value < by_gap.min(by_spread)
}

/// "the 412 nodes of this test run alike over 7 days (median 380 GB/s, 10th percentile
/// 371 GB/s, 14 runs)".
pub fn basis_words(e: &Expectation, unit: &str) -> String {
    let v = |x: f64| {
        if unit == "ratio" {
            format!("{:.0}%", x * 100.0)
        } else {
            format!("{} {unit}", tenths_below_100(x))
        }
    };
    format!(
        "the {} nodes of this test run alike over {} day{} (median {}, 10th percentile {}, {} run{})",
        e.nodes,
        e.days,
        if e.days == 1 { "" } else { "s" },
        v(e.median),
        v(e.p10),
        e.runs,
        if e.runs == 1 { "" } else { "s" },
    )
}

/// Judges one node without enough peers against the baseline (rules 2 to 5).
pub(super) fn judge(
    s: &NodeStats,
    mine: &NodeSeries,
    own: &[Finding],
    against: &Against<'_>,
    t: &Thresholds,
) -> Vec<Finding> {
    let key = against.key(&s.group);
    let mut out = Vec::new();
    let mut expected_any = false;
    for (series, value) in &mine.values {
        let Some(e) = against.baseline.expectation(&key, *series, against.now) else {
            continue;
        };
        expected_any = true;
        let Some((metric, collective)) = metric_of(*series) else {
            continue;
        };
        let held = super::compare::explicit_threshold(
            &SeriesKey {
                metric,
                collective,
                gpu: None,
                peer: None,
            },
            t,
        );
        let named = own.iter().any(|f| {
            f.severity == Severity::Critical && f.metric == metric && f.collective == collective
        });
        // Host copies vary more from run to run than the links they cross (compare.rs).
        let min_gap = if super::compare::host_copy(metric) {
            t.fleet_min_relative_gap
                .max(super::compare::HOST_COPY_FAIL_GAP)
        } else {
            t.fleet_min_relative_gap
        };
        if held || named || !far_below(*value, &e, min_gap) {
            continue;
        }
        let unit = series.unit();
        let shown = if unit == "ratio" {
            format!("{:.0}%", value * 100.0)
        } else {
            format!("{} {unit}", tenths_below_100(*value))
        };
        out.push(Finding {
            collective,
            ..Finding::new(
                FindingKind::Slow,
                Subject::node(&s.node),
                metric,
                Severity::Critical,
                format!(
                    "{}: {} {shown}, {} {}; compare its NVLink, PCIe and clock state with a healthy node.",
                    s.node,
                    series.label(),
                    how_far(*value, e.median),
                    basis_words(&e, unit),
                ),
            )
            .with_evidence(*value, e.median, unit, ExpectationSource::Baseline)
        });
    }
    if !expected_any {
        out.push(Finding::new(
            FindingKind::Slow,
            Subject::node(&s.node),
            Metric::NcclBusBw,
            Severity::Info,
            format!(
                "{}: no baseline yet for {} x{} with this suite and NCCL settings (it forms from this test's passing nodes of complete runs, once it rests on {} nodes); with fewer than {} comparable nodes in this run, the node is judged by its own rules alone.",
                s.node,
                s.product,
                s.group.1,
                gpufabric_api::baseline::MIN_NODES,
                peers_needed(t),
            ),
        ));
    }
    out
}

/// The run's numbers for the baseline: per key, the spread of each series over `nodes` (the
/// passing nodes the caller lets feed it), and how many nodes there were.
pub fn sample<'a>(
    run: &str,
    suite: &str,
    settings: &str,
    nodes: impl IntoIterator<Item = &'a NodeSeries>,
) -> Vec<KeyedSample> {
    let mut by_key: BTreeMap<BaselineKey, (u32, BTreeMap<Series, Vec<f64>>)> = BTreeMap::new();
    for n in nodes {
        let key = BaselineKey {
            product: n.group.0.clone(),
            gpus: n.group.1,
            suite: suite.to_string(),
            settings: settings.to_string(),
        };
        let (count, values) = by_key.entry(key).or_default();
        *count += 1;
        for (s, v) in &n.values {
            values.entry(*s).or_default().push(*v);
        }
    }
    by_key
        .into_iter()
        .map(|(key, (nodes, values))| KeyedSample {
            key,
            sample: RunSample {
                run: run.to_string(),
                at: 0,
                nodes,
                series: values
                    .iter()
                    .filter_map(|(s, v)| Spread::of(v).map(|sp| (s.to_string(), sp)))
                    .collect(),
            },
        })
        .collect()
}
