//! A node's own numbers over its last runs, per FabricTest: what the drift rule compares a
//! run against (`gpufabric_health::trend`). The operator keeps them in the node annotation
//! [`crate::keys::ANNOTATION_TREND`], read from its node cache and written after each judged
//! run, so the record scales with the nodes and needs no object of its own. Bounded: at most
//! [`MAX_TESTS`] tests (the most recently written kept) of at most [`MAX_POINTS`] runs each,
//! numbers rounded to four significant digits: about 40 bytes a run.

use crate::counters::{BaselineError, parse_record};
use crate::result::{CompactResult, KeyNumbers};
use crate::run::NodeRunResult;
use serde::{Deserialize, Serialize};

/// Most runs kept per test (`thresholds.trend.window` is at most this).
pub const MAX_POINTS: usize = 20;
/// Most tests kept per node.
pub const MAX_TESTS: usize = 3;

/// The key numbers of one measured run of a node. A number is None when its phase did not
/// run or measured nothing.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct TrendPoint {
    /// When the run finished, seconds since the Unix epoch.
    #[serde(rename = "t")]
    pub at: i64,
    /// Peak all_reduce bus bandwidth, GB/s.
    #[serde(rename = "b", default, skip_serializing_if = "Option::is_none")]
    pub busbw_gbps: Option<f64>,
    /// Lowest one-way GPU-pair copy, GB/s.
    #[serde(rename = "p", default, skip_serializing_if = "Option::is_none")]
    pub worst_pair_gbps: Option<f64>,
    /// Lowest host-to-device or device-to-host copy of any GPU, GB/s.
    #[serde(rename = "h", default, skip_serializing_if = "Option::is_none")]
    pub host_gbps: Option<f64>,
    /// DDP step time at the largest GPU count, milliseconds.
    #[serde(rename = "s", default, skip_serializing_if = "Option::is_none")]
    pub ddp_step_ms: Option<f64>,
}

/// One of the numbers a trend keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TrendMetric {
    BusBw,
    WorstPair,
    Host,
    DdpStep,
}

impl TrendMetric {
    pub const ALL: [TrendMetric; 4] = [
        TrendMetric::BusBw,
        TrendMetric::WorstPair,
        TrendMetric::Host,
        TrendMetric::DdpStep,
    ];

    /// Its name in messages.
    pub fn label(self) -> &'static str {
        match self {
            TrendMetric::BusBw => "all_reduce busbw",
            TrendMetric::WorstPair => "worst GPU-pair copy",
            TrendMetric::Host => "slowest host link",
            TrendMetric::DdpStep => "DDP step time",
        }
    }

    /// Its unit in messages.
    pub fn unit(self) -> &'static str {
        match self {
            TrendMetric::DdpStep => "ms",
            _ => "GB/s",
        }
    }

    /// True when more is better (bandwidths); false for times.
    pub fn higher_is_better(self) -> bool {
        self != TrendMetric::DdpStep
    }
}

impl TrendPoint {
    /// The key numbers of a measured node's compact result, as the record keeps them
    /// (rounded).
    pub fn of(result: &CompactResult, at: i64) -> TrendPoint {
        TrendPoint::from_numbers(KeyNumbers::of(result), at)
    }

    /// The key numbers of a node's run entry (which keeps them from its compact result), as
    /// the record keeps them: the same as [`TrendPoint::of`] that result.
    pub fn of_entry(entry: &NodeRunResult, at: i64) -> TrendPoint {
        let numbers = KeyNumbers {
            busbw_gbps: entry.all_reduce_bus_bw_gbps,
            worst_pair_gbps: entry.min_pair_gbps,
            host_gbps: entry.min_host_gbps,
            ddp_step_ms: entry.ddp_step_ms,
        };
        TrendPoint::from_numbers(numbers.rounded(), at)
    }

    fn from_numbers(numbers: KeyNumbers, at: i64) -> TrendPoint {
        TrendPoint {
            at,
            busbw_gbps: numbers.busbw_gbps,
            worst_pair_gbps: numbers.worst_pair_gbps,
            host_gbps: numbers.host_gbps,
            ddp_step_ms: numbers.ddp_step_ms,
        }
    }

    /// One of its numbers.
    pub fn get(&self, m: TrendMetric) -> Option<f64> {
        match m {
            TrendMetric::BusBw => self.busbw_gbps,
            TrendMetric::WorstPair => self.worst_pair_gbps,
            TrendMetric::Host => self.host_gbps,
            TrendMetric::DdpStep => self.ddp_step_ms,
        }
    }

    /// True when it holds no number at all (nothing worth keeping).
    pub fn is_empty(&self) -> bool {
        TrendMetric::ALL.iter().all(|m| self.get(*m).is_none())
    }
}

/// One test's runs of the node.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct TestTrend {
    pub test: String,
    /// Fingerprint of the suite the points were measured with ([`crate::suite::Suite::fingerprint`]): a
    /// changed suite starts the trend again, since its numbers are not comparable.
    pub suite: String,
    /// Oldest first.
    pub points: Vec<TrendPoint>,
}

/// The record on a node: its runs per test.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct NodeTrend {
    /// Most recently written first.
    pub tests: Vec<TestTrend>,
}

impl NodeTrend {
    /// Parses a stored record; never panics on what a person or another tool wrote there.
    pub fn parse(text: &str) -> Result<NodeTrend, BaselineError> {
        parse_record(text)
    }

    /// The stored form.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The runs of `test` measured with the suite `suite` (oldest first); empty when there
    /// are none or the suite changed since.
    pub fn points(&self, test: &str, suite: &str) -> &[TrendPoint] {
        self.tests
            .iter()
            .find(|t| t.test == test && t.suite == suite)
            .map(|t| t.points.as_slice())
            .unwrap_or(&[])
    }

    /// The runs of `test` whatever their suite (what a person reads), oldest first.
    pub fn of_test(&self, test: &str) -> Option<&TestTrend> {
        self.tests.iter().find(|t| t.test == test)
    }

    /// The record with `point` added to `test`'s runs: a changed suite starts them again,
    /// at most `window` (and [`MAX_POINTS`]) are kept, and `test` becomes the most recent
    /// of at most [`MAX_TESTS`] tests. A point with no number changes nothing.
    pub fn with_point(
        &self,
        test: &str,
        suite: &str,
        point: TrendPoint,
        window: usize,
    ) -> NodeTrend {
        let mut tests = self.tests.clone();
        if point.is_empty() {
            return NodeTrend { tests };
        }
        let mut mine = match tests.iter().position(|t| t.test == test) {
            Some(i) => tests.remove(i),
            None => TestTrend {
                test: test.to_string(),
                suite: suite.to_string(),
                points: Vec::new(),
            },
        };
        if mine.suite != suite {
            mine.suite = suite.to_string();
            mine.points.clear();
        }
        // A retried write of the same run replaces its point.
        mine.points.retain(|p| p.at != point.at);
        mine.points.push(point);
        let keep = window.clamp(1, MAX_POINTS);
        let excess = mine.points.len().saturating_sub(keep);
        mine.points.drain(..excess);
        tests.insert(0, mine);
        tests.truncate(MAX_TESTS);
        NodeTrend { tests }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::suite::Suite;

    fn point(at: i64, busbw: f64) -> TrendPoint {
        TrendPoint {
            at,
            busbw_gbps: Some(busbw),
            ..Default::default()
        }
    }

    #[test]
    fn a_test_keeps_its_window_and_a_new_suite_starts_again() {
        let mut t = NodeTrend::default();
        for i in 0..30 {
            t = t.with_point("nightly", "s1", point(i, 100.0 + i as f64), 14);
        }
        let pts = t.points("nightly", "s1");
        assert_eq!(pts.len(), 14);
        assert_eq!(pts.first().map(|p| p.at), Some(16));
        assert_eq!(pts.last().map(|p| p.at), Some(29));
        assert!(t.points("nightly", "s2").is_empty(), "another suite's runs");
        let t = t.with_point("nightly", "s2", point(30, 50.0), 14);
        assert_eq!(t.points("nightly", "s2").len(), 1);
        assert!(t.points("nightly", "s1").is_empty());
        // The window never exceeds the bound.
        let mut u = NodeTrend::default();
        for i in 0..100 {
            u = u.with_point("x", "s", point(i, 1.0), 1000);
        }
        assert_eq!(u.points("x", "s").len(), MAX_POINTS);
    }

    #[test]
    fn at_most_three_tests_the_latest_kept_and_a_retry_replaces_its_point() {
        let mut t = NodeTrend::default();
        for (i, name) in ["a", "b", "c", "d"].iter().enumerate() {
            t = t.with_point(name, "s", point(i as i64, 1.0), 14);
        }
        let names: Vec<&str> = t.tests.iter().map(|x| x.test.as_str()).collect();
        assert_eq!(names, ["d", "c", "b"]);
        let t = t.with_point("c", "s", point(2, 2.0), 14);
        assert_eq!(t.tests[0].test, "c");
        assert_eq!(t.points("c", "s"), [point(2, 2.0)]);
        // An empty point changes nothing.
        let same = t.with_point("c", "s", TrendPoint::default(), 14);
        assert_eq!(same, t);
    }

    #[test]
    fn the_record_round_trips_and_junk_is_an_error() {
        let t = NodeTrend::default().with_point(
            "nightly",
            "s",
            TrendPoint {
                at: 1_764_208_800,
                busbw_gbps: Some(371.2),
                worst_pair_gbps: Some(391.0),
                host_gbps: Some(52.31),
                ddp_step_ms: Some(41.07),
            },
            14,
        );
        let text = t.to_json();
        assert!(text.len() < 200, "{} bytes: {text}", text.len());
        assert_eq!(NodeTrend::parse(&text).ok(), Some(t));
        assert!(NodeTrend::parse("cordon me").is_err());
        assert!(NodeTrend::parse(&"x".repeat(20_000)).is_err());
    }

    #[test]
    fn a_fingerprint_follows_the_suite() {
        let a = Suite::default();
        let mut b = Suite::default();
        assert_eq!(a.fingerprint(), b.fingerprint());
        b.compute.sdc.enabled = !b.compute.sdc.enabled;
        assert_eq!(a.fingerprint(), b.fingerprint(), "compute is not kept");
        b.nccl_sweep.max_bytes *= 2;
        assert_ne!(a.fingerprint(), b.fingerprint());
    }
}
