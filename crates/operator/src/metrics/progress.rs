//! Progress of the runs under way: nodes done, nodes in all, and the wave, per run
//! (`run`: the cluster-scoped FabricTestRun, `test`: its FabricTest). A finished run's series
//! are removed.

use gpufabric_api::run::{FabricTestRun, RunProgress};
use kube::ResourceExt;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// `{run, test}`: a FabricTestRun and its FabricTest.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RunLabels {
    pub run: String,
    pub test: String,
}

/// The run progress families.
#[derive(Default)]
pub struct ProgressMetrics {
    done: Family<RunLabels, Gauge>,
    total: Family<RunLabels, Gauge>,
    wave: Family<RunLabels, Gauge>,
    waves: Family<RunLabels, Gauge>,
}

impl ProgressMetrics {
    pub fn register(&self, r: &mut Registry) {
        r.register(
            "gpufabric_run_nodes_done",
            "Nodes of the run under way with a result",
            self.done.clone(),
        );
        r.register(
            "gpufabric_run_nodes",
            "Nodes the run under way tests",
            self.total.clone(),
        );
        r.register(
            "gpufabric_run_wave",
            "The wave the run under way is in (1-based; spec.rollout)",
            self.wave.clone(),
        );
        r.register(
            "gpufabric_run_waves",
            "Waves of the run under way",
            self.waves.clone(),
        );
    }

    /// Sets the series of `run`, or removes them (`None`: the run finished).
    pub fn set(&self, run: &FabricTestRun, progress: Option<&RunProgress>) {
        let l = RunLabels {
            run: run.name_any(),
            test: run.spec.test.clone(),
        };
        let families = [&self.done, &self.total, &self.wave, &self.waves];
        match progress {
            Some(p) => {
                let values = [p.done, p.total, p.wave, p.waves];
                for (f, v) in families.into_iter().zip(values) {
                    f.get_or_create(&l).set(i64::from(v));
                }
            }
            None => {
                for f in families {
                    f.remove(&l);
                }
            }
        }
    }
}
