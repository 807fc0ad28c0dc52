//! The test's baseline ([`gpufabric_api::baseline`]) around a run: read from the test when
//! the run is judged (a node without enough peers is judged against it), the run's own
//! numbers made from its passing, unquarantined nodes of a complete check, and those numbers
//! added to the test's baseline when the test folds a complete run.

use gpufabric_api::baseline::{FleetBaseline, KeyedSample, settings_fingerprint};
use gpufabric_api::keys;
use gpufabric_api::run::{
    FabricTestRun, FabricTestRunStatus, NodeRunResult, NodeVerdict, RunPhase,
};
use gpufabric_api::test::FabricTest;
use gpufabric_api::trend::suite_fingerprint;
use gpufabric_health::evaluate::tuning::NCCL_TUNING;
use gpufabric_health::evaluate::{Against, NodeSeries, baseline};
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::{Client, ResourceExt};
use std::collections::BTreeMap;

/// What makes runs alike: the fingerprints of a run's suite and of its spec's NCCL settings.
#[derive(Clone, Debug, PartialEq)]
pub struct Alike {
    pub suite: String,
    pub settings: String,
}

impl Alike {
    pub fn of(run: &FabricTestRun) -> Alike {
        Alike {
            suite: suite_fingerprint(&run.spec.suite),
            // The tuning variables only (as the agent alone reports them): NCCL_DEBUG or
            // NCCL_IB_HCA change no number.
            settings: settings_fingerprint(
                run.spec
                    .agent
                    .env
                    .iter()
                    .filter(|e| NCCL_TUNING.contains(&e.name.as_str()))
                    .map(|e| (e.name.as_str(), e.value.as_deref())),
            ),
        }
    }

    /// What a run is judged against with `baseline`, at `now` (seconds since the epoch).
    pub fn against<'a>(&'a self, baseline: &'a FleetBaseline, now: i64) -> Against<'a> {
        Against {
            baseline,
            suite: &self.suite,
            settings: &self.settings,
            now,
        }
    }
}

/// The baseline of the run's test; empty when the test is gone or has none yet.
pub async fn of_test(client: &Client, run: &FabricTestRun) -> kube::Result<FleetBaseline> {
    let api: Api<FabricTest> = Api::all(client.clone());
    Ok(api
        .get_opt(&run.spec.test)
        .await?
        .and_then(|t| t.status)
        .map(|s| s.baseline)
        .unwrap_or_default())
}

/// The run's numbers for its test's baseline (pure): of the nodes that passed a complete
/// check (`entries` after every judgement, node pairs included) and that no test holds in
/// quarantine (`node` returns the node from the cache). A failing or quarantined node never
/// feeds it.
pub fn sample(
    run: &str,
    alike: &Alike,
    entries: &[NodeRunResult],
    series: &BTreeMap<String, NodeSeries>,
    node: impl Fn(&str) -> Option<std::sync::Arc<Node>>,
) -> Vec<KeyedSample> {
    let quarantined =
        |n: &str| node(n).is_some_and(|n| n.labels().contains_key(keys::LABEL_QUARANTINED));
    let feeding = entries
        .iter()
        .filter(|e| e.verdict == NodeVerdict::Passed && e.complete() && !quarantined(&e.node))
        .filter_map(|e| series.get(&e.node));
    baseline::sample(run, &alike.suite, &alike.settings, feeding)
}

/// The test's baseline after folding a run with `status` (pure): a run that ended with
/// every pod done (Succeeded) adds its numbers at its completion time; any other leaves it
/// as it was.
pub fn after_fold(before: &FleetBaseline, status: Option<&FabricTestRunStatus>) -> FleetBaseline {
    let Some(status) = status else {
        return before.clone();
    };
    let at = status.completion_time.as_ref().map(|t| t.0.as_second());
    match at {
        Some(at) if status.phase == RunPhase::Succeeded && !status.baseline_sample.is_empty() => {
            before.with_run(&status.baseline_sample, at)
        }
        _ => before.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufabric_api::baseline::{BaselineKey, RunSample, Series, Spread};
    use gpufabric_api::suite::Collective;
    use std::sync::Arc;

    fn entry(node: &str, verdict: NodeVerdict) -> NodeRunResult {
        NodeRunResult {
            node: node.into(),
            verdict,
            ..Default::default()
        }
    }

    fn series(v: f64) -> NodeSeries {
        NodeSeries {
            group: ("h100".into(), 8),
            values: [(Series::BusBw(Collective::AllReduce), v)].into(),
        }
    }

    fn alike() -> Alike {
        Alike {
            suite: "s".into(),
            settings: "n".into(),
        }
    }

    #[test]
    fn only_passing_unquarantined_nodes_of_a_complete_check_feed_the_sample() {
        let mut partial = entry("partial", NodeVerdict::Passed);
        partial.unmeasured = vec!["ddpProbe".into()];
        let entries = [
            entry("good", NodeVerdict::Passed),
            entry("held", NodeVerdict::Passed),
            entry("bad", NodeVerdict::Failed),
            partial,
        ];
        let all: BTreeMap<String, NodeSeries> = ["good", "held", "bad", "partial"]
            .iter()
            .map(|n| (n.to_string(), series(400.0)))
            .collect();
        let held = |n: &str| {
            let mut node = Node::default();
            node.metadata.name = Some(n.into());
            if n == "held" {
                node.labels_mut()
                    .insert(keys::LABEL_QUARANTINED.into(), "true".into());
            }
            Some(Arc::new(node))
        };
        let s = sample("run-1", &alike(), &entries, &all, held);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].sample.nodes, 1, "only `good` feeds it");
    }

    fn run_with(phase: RunPhase, at: i64) -> FabricTestRunStatus {
        let key = BaselineKey {
            product: "h100".into(),
            gpus: 8,
            suite: "s".into(),
            settings: "n".into(),
        };
        let spread = Spread::of(&[400.0; 4]).expect("values");
        FabricTestRunStatus {
            phase,
            completion_time: Some(crate::time::to_time(
                chrono::DateTime::from_timestamp(at, 0).expect("a time"),
            )),
            baseline_sample: vec![KeyedSample {
                key,
                sample: RunSample {
                    run: "r".into(),
                    at: 0,
                    nodes: 4,
                    series: [(Series::BusBw(Collective::AllReduce).to_string(), spread)].into(),
                },
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_complete_run_feeds_the_baseline_and_a_run_stopped_at_its_deadline_does_not() {
        let empty = FleetBaseline::default();
        let fed = after_fold(&empty, Some(&run_with(RunPhase::Succeeded, 1_000)));
        assert_eq!(fed.entries.len(), 1);
        assert_eq!(fed.entries[0].runs[0].at, 1_000);
        assert_eq!(
            after_fold(&empty, Some(&run_with(RunPhase::Failed, 1_000))),
            empty
        );
    }
}
