//! Prometheus metrics of the operator: runs started and finished, nodes tested, benchmark
//! pods active, how long reconciles take per controller, and the quarantine executor's.

use crate::quarantine::QuarantineMetrics;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

/// Label of per-controller metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ControllerLabels {
    pub controller: String,
}

/// Label of run metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TriggerLabels {
    pub trigger: String,
}

/// Label of node metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerdictLabels {
    pub verdict: String,
}

fn reconcile_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

/// Every metric the operator exports.
pub struct Metrics {
    pub registry: Registry,
    pub runs_started: Family<TriggerLabels, Counter>,
    pub runs_succeeded: Counter,
    pub runs_failed: Counter,
    pub nodes_tested: Family<VerdictLabels, Counter>,
    pub pods_active: Gauge,
    pub reconcile_duration: Family<ControllerLabels, Histogram, fn() -> Histogram>,
    pub reconcile_errors: Family<ControllerLabels, Counter>,
    /// The quarantine executor's metrics (nodes held, actions taken).
    pub quarantine: QuarantineMetrics,
    /// Active pods per run, summed into `pods_active`.
    active_by_run: Mutex<BTreeMap<String, i64>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let runs_started = Family::<TriggerLabels, Counter>::default();
        let runs_succeeded = Counter::default();
        let runs_failed = Counter::default();
        let nodes_tested = Family::<VerdictLabels, Counter>::default();
        let pods_active = Gauge::default();
        let reconcile_duration =
            Family::<ControllerLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                reconcile_histogram,
            );
        let reconcile_errors = Family::<ControllerLabels, Counter>::default();
        let quarantine = QuarantineMetrics::default();
        quarantine.register(&mut registry);
        registry.register(
            "gpufabric_runs_started",
            "FabricTestRuns started, by trigger",
            runs_started.clone(),
        );
        registry.register(
            "gpufabric_runs_succeeded",
            "FabricTestRuns that ran to the end",
            runs_succeeded.clone(),
        );
        registry.register(
            "gpufabric_runs_failed",
            "FabricTestRuns that could not be carried out",
            runs_failed.clone(),
        );
        registry.register(
            "gpufabric_nodes_tested",
            "Nodes tested, by verdict",
            nodes_tested.clone(),
        );
        registry.register(
            "gpufabric_pods_active",
            "Benchmark pods not yet finished",
            pods_active.clone(),
        );
        registry.register(
            "gpufabric_reconcile_duration_seconds",
            "Time of one reconcile, by controller",
            reconcile_duration.clone(),
        );
        registry.register(
            "gpufabric_reconcile_errors",
            "Reconciles that failed, by controller",
            reconcile_errors.clone(),
        );
        Metrics {
            registry,
            runs_started,
            runs_succeeded,
            runs_failed,
            nodes_tested,
            pods_active,
            reconcile_duration,
            reconcile_errors,
            quarantine,
            active_by_run: Mutex::new(BTreeMap::new()),
        }
    }

    /// Starts timing a reconcile of `controller`; the time is recorded when the guard drops.
    pub fn reconcile_timer(&self, controller: &str) -> ReconcileTimer<'_> {
        ReconcileTimer {
            metrics: self,
            controller: controller.to_string(),
            start: Instant::now(),
        }
    }

    /// Counts a failed reconcile.
    pub fn reconcile_failed(&self, controller: &str) {
        self.reconcile_errors
            .get_or_create(&ControllerLabels {
                controller: controller.to_string(),
            })
            .inc();
    }

    /// Records how many pods of `run` are still active (0 or absent removes the run).
    pub fn set_active_pods(&self, run: &str, active: i64) {
        let total = match self.active_by_run.lock() {
            Ok(mut map) => {
                if active > 0 {
                    map.insert(run.to_string(), active);
                } else {
                    map.remove(run);
                }
                map.values().sum()
            }
            Err(_) => return,
        };
        self.pods_active.set(total);
    }

    /// The text exposition of every metric.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            tracing::warn!("encoding metrics failed");
        }
        out
    }
}

/// Records a reconcile's duration when dropped.
pub struct ReconcileTimer<'a> {
    metrics: &'a Metrics,
    controller: String,
    start: Instant,
}

impl Drop for ReconcileTimer<'_> {
    fn drop(&mut self) {
        self.metrics
            .reconcile_duration
            .get_or_create(&ControllerLabels {
                controller: std::mem::take(&mut self.controller),
            })
            .observe(self.start.elapsed().as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposition_has_the_documented_metrics() {
        let m = Metrics::new();
        m.runs_started
            .get_or_create(&TriggerLabels {
                trigger: "schedule".into(),
            })
            .inc();
        {
            let _t = m.reconcile_timer("fabrictest");
        }
        m.set_active_pods("r1", 5);
        m.set_active_pods("r2", 3);
        m.set_active_pods("r1", 0);
        let text = m.encode();
        assert!(
            text.contains("gpufabric_runs_started_total{trigger=\"schedule\"} 1"),
            "{text}"
        );
        assert!(
            text.contains(
                "gpufabric_reconcile_duration_seconds_count{controller=\"fabrictest\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains("gpufabric_pods_active 3"), "{text}");
    }
}
