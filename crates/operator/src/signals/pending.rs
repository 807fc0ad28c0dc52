//! The node signals of folded runs that wait for the test's status: decided when a run is
//! folded, written once the status (and with it every quarantine) is, and decided again
//! from the folded status after a restart in between.

use super::apply::{NodeSignal, decide};
use gpufabric_api::run::{FabricTestRun, NodeRunResult, NodeVerdict};
use gpufabric_api::standing::Standing;
use gpufabric_api::test::{FabricTest, FabricTestStatus, NodeHealth};
use gpufabric_api::trend::NodeTrend;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::runtime::reflector::Store;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

/// The signals of one folded run, decided at its fold and not yet written.
#[derive(Clone, Debug, Default)]
pub struct Pending {
    /// The run whose fold decided them.
    pub run: String,
    pub signals: Vec<NodeSignal>,
    /// Trend records of passing nodes without signals, written on their own.
    pub trends: Vec<(String, NodeTrend)>,
}

/// The last folded run per test (by UID) whose signals this process wrote: a test whose
/// status names another (the operator started, or took the lead, since) has its signals
/// decided again from the status.
#[derive(Debug, Default)]
pub struct Written(Mutex<HashMap<String, String>>);

impl Written {
    /// Whether this process wrote the signals of `run`, the test's last folded run.
    pub fn holds(&self, test_uid: &str, run: &str) -> bool {
        self.0
            .lock()
            .map(|m| m.get(test_uid).is_some_and(|r| r == run))
            .unwrap_or(false)
    }

    /// Records that the signals of `run` were written (or given up on, and reported).
    pub fn record(&self, test_uid: &str, run: &str) {
        if let Ok(mut m) = self.0.lock() {
            m.insert(test_uid.to_string(), run.to_string());
        }
    }
}

/// Which nodes of each folded run still in the cache get their signals decided again
/// after a restart, and the history they are decided from. A node gets those of the latest
/// run that tested it, as its history entry names (`lastRun`). The status keeps a bounded
/// history (the nodes that need attention first): a node of the last folded run (`last`)
/// without an entry was left out as plain, and a plain node the run passed stands
/// `Passing`; one it failed or did not measure is left to its next run (only past the
/// bound's share of failing nodes). Pure.
pub fn to_redecide<'a>(
    status: &FabricTestStatus,
    runs: &'a [(FabricTestRun, Vec<NodeRunResult>)],
) -> Vec<(&'a FabricTestRun, Vec<NodeRunResult>, Vec<NodeHealth>)> {
    let last = status.last_run.as_ref().map(|l| l.name.as_str());
    let latest: BTreeMap<&str, &str> = status
        .nodes
        .iter()
        .filter_map(|h| Some((h.node.as_str(), h.last_run.as_deref()?)))
        .collect();
    let named: BTreeSet<&str> = latest.values().copied().chain(last).collect();
    runs.iter()
        .filter(|(run, _)| named.contains(run.name_any().as_str()))
        .map(|(run, results)| {
            let name = run.name_any();
            let is_last = last == Some(name.as_str());
            let mut history = status.nodes.clone();
            let mine: Vec<NodeRunResult> = results
                .iter()
                .filter(|r| match latest.get(r.node.as_str()) {
                    Some(l) => *l == name,
                    None if is_last && r.verdict == NodeVerdict::Passed => {
                        history.push(NodeHealth {
                            node: r.node.clone(),
                            verdict: r.verdict,
                            standing: Standing::Passing,
                            last_run: Some(name.clone()),
                            ..Default::default()
                        });
                        true
                    }
                    None => false,
                })
                .cloned()
                .collect();
            (run, mine, history)
        })
        .collect()
}

/// The signals of `to_redecide`'s runs that change something on their node: a node already
/// written before the restart is left alone. Pure but for reading the node cache.
pub fn redecided(
    test: &FabricTest,
    status: &FabricTestStatus,
    runs: &[(FabricTestRun, Vec<NodeRunResult>)],
    nodes: &Store<Node>,
) -> Vec<Pending> {
    to_redecide(status, runs)
        .into_iter()
        .map(|(run, results, history)| Pending {
            run: run.name_any(),
            signals: decide(test, run, &results, &history, nodes)
                .into_iter()
                .filter(|s| s.metadata.is_some() || s.condition.is_some() || s.remove_legacy)
                .collect(),
            trends: Vec::new(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpufabric_api::run::{FabricTestRunSpec, FabricTestRunStatus, RunPhase, Trigger};
    use gpufabric_api::test::FabricTestSpec;

    fn run(name: &str) -> FabricTestRun {
        let spec = FabricTestSpec::default();
        let mut r = FabricTestRun::new(
            name,
            FabricTestRunSpec::of_test("nightly", &spec, Trigger::Schedule, None, None),
        );
        r.status = Some(FabricTestRunStatus {
            phase: RunPhase::Succeeded,
            ..Default::default()
        });
        r
    }

    fn result(node: &str, verdict: NodeVerdict) -> NodeRunResult {
        NodeRunResult {
            node: node.into(),
            verdict,
            ..Default::default()
        }
    }

    fn health(node: &str, run: &str, standing: Standing) -> NodeHealth {
        NodeHealth {
            node: node.into(),
            standing,
            last_run: Some(run.into()),
            ..Default::default()
        }
    }

    #[test]
    fn after_a_restart_each_node_gets_the_signals_of_the_latest_run_that_tested_it() {
        let runs = vec![
            (
                run("n-1"),
                vec![
                    result("only-in-1", NodeVerdict::Failed),
                    result("both", NodeVerdict::Passed),
                ],
            ),
            (
                run("n-2"),
                vec![
                    result("bad", NodeVerdict::Failed),
                    result("both", NodeVerdict::Failed),
                    result("plain", NodeVerdict::Passed),
                    result("left-out", NodeVerdict::Failed),
                ],
            ),
            (run("n-0"), vec![result("old", NodeVerdict::Passed)]),
        ];
        let status = FabricTestStatus {
            last_run: Some(crate::status::run_summary(&runs[1].0)),
            nodes: vec![
                health("bad", "n-2", Standing::Quarantined { hardware: false }),
                health("only-in-1", "n-1", Standing::Suspect),
                health("both", "n-2", Standing::Failing { hardware: false }),
            ],
            ..Default::default()
        };
        let got = to_redecide(&status, &runs);
        let nodes: Vec<(String, Vec<&str>)> = got
            .iter()
            .map(|(r, results, _)| {
                (
                    r.name_any(),
                    results.iter().map(|r| r.node.as_str()).collect(),
                )
            })
            .collect();
        assert_eq!(
            nodes,
            [
                ("n-1".to_string(), vec!["only-in-1"]),
                ("n-2".to_string(), vec!["bad", "both", "plain"]),
            ],
            "a run no history entry names is left alone; a node gets its latest run's signals"
        );
        let plain = got[1]
            .2
            .iter()
            .find(|h| h.node == "plain")
            .map(|h| h.standing.clone());
        assert_eq!(
            plain,
            Some(Standing::Passing),
            "a passed node the bounded history left out stands Passing"
        );
    }

    #[test]
    fn the_marker_names_the_last_run_whose_signals_were_written() {
        let w = Written::default();
        assert!(!w.holds("uid-1", "n-1"), "a fresh process holds nothing");
        w.record("uid-1", "n-1");
        assert!(w.holds("uid-1", "n-1"));
        assert!(!w.holds("uid-1", "n-2"));
        assert!(!w.holds("uid-2", "n-1"));
    }
}
