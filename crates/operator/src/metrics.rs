//! Prometheus metrics of the operator: runs started and finished (by result), nodes tested,
//! benchmark pods active, how long reconciles take per controller, the quarantine
//! executor's, build info and leadership; and, read from the API state at each scrape
//! ([`state`]), per node the last result and bandwidths, per GPU the findings and per test
//! the run times.
//!
//! One naming scheme, which `scheme_tests` holds every family to: `gpufabric_<noun>[_<unit>]`
//! in Prometheus base units (`_seconds`, `_bytes_per_second`), counters ending in `_total`;
//! a FabricTest is always the label `test`, a run `run`, a node `node`, a GPU `gpu` (its
//! index on the node, as dcgm-exporter's `gpu`).

pub mod progress;
pub mod state;

use crate::quarantine::QuarantineMetrics;
use gpufabric_api::run::{FabricTestRun, RunPhase};
use gpufabric_api::test::FabricTest;
use kube::runtime::reflector::Store;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;
use state::{GpuFindingLabels, GpuLabels, NodeLabels, NodeResultLabels, StateSeries, TestLabels};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
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

/// `{test, result}` of a finished run: its (cluster-scoped) FabricTest and `passed`,
/// `nodes_failed` or `failed`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RunResultLabels {
    pub test: String,
    pub result: String,
}

/// `{version}` of `gpufabric_build_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// The families refreshed from the API state at each scrape.
#[derive(Default)]
struct StateFamilies {
    node_result: Family<NodeResultLabels, Gauge>,
    node_busbw: Family<NodeLabels, FloatGauge>,
    node_worst_pair: Family<NodeLabels, FloatGauge>,
    node_quarantined: Family<NodeLabels, Gauge>,
    gpu_findings: Family<GpuFindingLabels, Gauge>,
    gpu_quarantined: Family<GpuLabels, Gauge>,
    last_run: Family<TestLabels, FloatGauge>,
    last_success: Family<TestLabels, FloatGauge>,
    next_run: Family<TestLabels, FloatGauge>,
    breaker_open: Family<TestLabels, Gauge>,
}

/// Empties `family` and sets it to `values`.
fn replace_all<L, M, V>(family: &Family<L, M>, values: Vec<(L, V)>, set: impl Fn(&M, V))
where
    L: Clone + std::hash::Hash + Eq,
    M: Default,
{
    family.clear();
    for (l, v) in values {
        set(&family.get_or_create(&l), v);
    }
}

impl StateFamilies {
    fn register(&self, r: &mut Registry) {
        r.register(
            "gpufabric_node_last_result",
            "1 for the node's result in the FabricTest's latest run (pass, suspect, fail, not_measured), 0 for the others",
            self.node_result.clone(),
        );
        r.register(
            "gpufabric_node_allreduce_busbw_bytes_per_second",
            "Peak all_reduce bus bandwidth of the node in the FabricTest's latest run (bytes per second)",
            self.node_busbw.clone(),
        );
        r.register(
            "gpufabric_node_worst_pair_bandwidth_bytes_per_second",
            "Lowest GPU-pair copy bandwidth of the node in the FabricTest's latest run (bytes per second)",
            self.node_worst_pair.clone(),
        );
        r.register(
            "gpufabric_node_quarantined",
            "1 while the FabricTest holds the node in quarantine",
            self.node_quarantined.clone(),
        );
        r.register(
            "gpufabric_gpu_findings",
            "Findings about the GPU in the FabricTest's latest run, by kind and severity (a GPU pair's finding counts for both GPUs; as listed in the run status)",
            self.gpu_findings.clone(),
        );
        r.register(
            "gpufabric_gpu_quarantined",
            "1 while the FabricTest holds the GPU out of service with a DRA device taint (its node is not held)",
            self.gpu_quarantined.clone(),
        );
        r.register(
            "gpufabric_test_last_run_timestamp_seconds",
            "When the FabricTest's latest run finished (Unix seconds)",
            self.last_run.clone(),
        );
        r.register(
            "gpufabric_test_last_success_timestamp_seconds",
            "When the FabricTest's newest run that ran to the end finished (Unix seconds; runs kept by the history limits)",
            self.last_success.clone(),
        );
        r.register(
            "gpufabric_test_next_run_timestamp_seconds",
            "When the FabricTest's schedule fires next (Unix seconds)",
            self.next_run.clone(),
        );
        r.register(
            "gpufabric_breaker_open",
            "1 while the FabricTest's breaker is open (a storm of failures: nothing is quarantined or released until a person resets it), else 0",
            self.breaker_open.clone(),
        );
    }

    fn refresh(&self, tests: &Store<FabricTest>, runs: &Store<FabricTestRun>) {
        self.set(state::series(&tests.state(), &runs.state()));
    }

    /// Replaces every state series with those of `s`.
    fn set(&self, s: StateSeries) {
        let int = |g: &Gauge, v: i64| {
            g.set(v);
        };
        let float = |g: &FloatGauge, v: f64| {
            g.set(v);
        };
        replace_all(&self.node_result, s.node_result, int);
        replace_all(&self.node_quarantined, s.node_quarantined, int);
        replace_all(&self.gpu_findings, s.gpu_findings, int);
        replace_all(&self.gpu_quarantined, s.gpu_quarantined, int);
        replace_all(&self.breaker_open, s.breaker_open, int);
        replace_all(&self.node_busbw, s.node_busbw_bytes_per_second, float);
        replace_all(
            &self.node_worst_pair,
            s.node_worst_pair_bytes_per_second,
            float,
        );
        replace_all(&self.last_run, s.last_run_seconds, float);
        replace_all(&self.last_success, s.last_success_seconds, float);
        replace_all(&self.next_run, s.next_run_seconds, float);
    }
}

fn reconcile_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

/// Every metric the operator exports.
pub struct Metrics {
    pub registry: Registry,
    pub runs_started: Family<TriggerLabels, Counter>,
    /// `gpufabric_test_runs_total{test,result}`: finished runs by result.
    pub runs_finished: Family<RunResultLabels, Counter>,
    pub nodes_tested: Family<VerdictLabels, Counter>,
    pub pods_active: Gauge,
    pub reconcile_duration: Family<ControllerLabels, Histogram, fn() -> Histogram>,
    pub reconcile_errors: Family<ControllerLabels, Counter>,
    /// The quarantine executor's metrics (nodes held, actions taken).
    pub quarantine: QuarantineMetrics,
    /// 1 while this replica holds the leader Lease (or runs without leader election).
    pub leader: Gauge,
    /// Progress of the runs under way.
    progress: progress::ProgressMetrics,
    /// Active pods per run, summed into `pods_active`.
    active_by_run: Mutex<BTreeMap<String, i64>>,
    state: StateFamilies,
    /// Where the state families are read from, once the caches exist.
    source: std::sync::OnceLock<(Store<FabricTest>, Store<FabricTestRun>)>,
    /// One scrape at a time refreshes and encodes the state families.
    scrape: Mutex<()>,
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
        let runs_finished = Family::<RunResultLabels, Counter>::default();
        let nodes_tested = Family::<VerdictLabels, Counter>::default();
        let pods_active = Gauge::default();
        let reconcile_duration =
            Family::<ControllerLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                reconcile_histogram,
            );
        let reconcile_errors = Family::<ControllerLabels, Counter>::default();
        let quarantine = QuarantineMetrics::default();
        quarantine.register(&mut registry);
        let leader = Gauge::default();
        registry.register(
            "gpufabric_leader",
            "1 while this replica runs the controllers (holds the leader Lease)",
            leader.clone(),
        );
        registry.register(
            "gpufabric_runs_started",
            "FabricTestRuns started, by trigger",
            runs_started.clone(),
        );
        registry.register(
            "gpufabric_test_runs",
            "Finished FabricTestRuns by FabricTest and result: passed (every node passed), nodes_failed (ran to the end, some node did not pass), failed (could not be carried out)",
            runs_finished.clone(),
        );
        registry.register(
            "gpufabric_build",
            "The operator's version",
            Info::new(BuildLabels {
                version: env!("CARGO_PKG_VERSION").to_string(),
            }),
        );
        let state = StateFamilies::default();
        state.register(&mut registry);
        let progress = progress::ProgressMetrics::default();
        progress.register(&mut registry);
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
            runs_finished,
            nodes_tested,
            pods_active,
            reconcile_duration,
            reconcile_errors,
            quarantine,
            leader,
            progress,
            active_by_run: Mutex::new(BTreeMap::new()),
            state,
            source: std::sync::OnceLock::new(),
            scrape: Mutex::new(()),
        }
    }

    /// Reads the per-node and per-test series from these caches at each scrape.
    pub fn read_state_from(&self, tests: Store<FabricTest>, runs: Store<FabricTestRun>) {
        let _ = self.source.set((tests, runs));
    }

    /// Counts a finished run of its FabricTest: `failed` when it could not be carried
    /// out, `nodes_failed` when some node did not pass, else `passed`.
    pub fn run_finished(&self, run: &FabricTestRun, phase: RunPhase, nodes_not_passed: u32) {
        let result = if phase != RunPhase::Succeeded {
            "failed"
        } else if nodes_not_passed > 0 {
            "nodes_failed"
        } else {
            "passed"
        };
        self.runs_finished
            .get_or_create(&RunResultLabels {
                test: run.spec.test.clone(),
                result: result.into(),
            })
            .inc();
    }

    /// The progress series of a run under way (`None` removes them once it finished).
    pub fn set_run_progress(
        &self,
        run: &FabricTestRun,
        progress: Option<&gpufabric_api::run::RunProgress>,
    ) {
        self.progress.set(run, progress);
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
        let _scrape = self.scrape.lock();
        if let Some((tests, runs)) = self.source.get() {
            self.state.refresh(tests, runs);
        }
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
mod scheme_tests;

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
