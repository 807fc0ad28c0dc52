//! The test's baseline ([`gpufabric_api::baseline`]) around a run: read from the test when
//! the run is judged (a node without enough peers is judged against it), the run's own
//! numbers made from its passing, unquarantined nodes of a complete check, and those numbers
//! added to the test's baseline when the test folds a complete run.

use gpufabric_api::baseline::{FleetBaseline, KeyedSample, Series, Spread, settings_fingerprint};
use gpufabric_api::ddp_nodes::DdpNodesStatus;
use gpufabric_api::keys;
use gpufabric_api::nccl_nodes::NcclNodesStatus;
use gpufabric_api::pair::{NetTransport, PairState};
use gpufabric_api::run::{
    FabricTestRun, FabricTestRunStatus, NodeRunResult, NodeVerdict, RunPhase,
};
use gpufabric_api::test::FabricTest;
use gpufabric_health::evaluate::tuning::NCCL_TUNING;
use gpufabric_health::evaluate::{Against, NodeSeries, baseline};
use gpufabric_health::pairs::PairBaseline;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::{Client, ResourceExt};
use std::collections::{BTreeMap, BTreeSet};

/// What makes runs alike: the fingerprints of a run's suite and of its spec's NCCL settings.
#[derive(Clone, Debug, PartialEq)]
pub struct Alike {
    pub suite: String,
    pub settings: String,
}

impl Alike {
    pub fn of(run: &FabricTestRun) -> Alike {
        Alike {
            suite: run.spec.suite.fingerprint(),
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

/// The baselines of the run's node pairs at its suite's size, from `fleet` at `now`.
pub fn pair_baselines(fleet: &FleetBaseline, run: &FabricTestRun, now: i64) -> Vec<PairBaseline> {
    let alike = Alike::of(run);
    alike
        .against(fleet, now)
        .node_pairs(run.spec.suite.node_pairs.bytes)
}

/// A run's multi-node phases, for its sample.
#[derive(Clone, Copy, Default)]
pub struct Groups<'a> {
    pub probe: Option<&'a DdpNodesStatus>,
    pub sweep: Option<&'a NcclNodesStatus>,
}

/// The run's numbers for its test's baseline (pure): of the nodes that passed a complete
/// check (`entries` after every judgement, node pairs included) and that no test holds in
/// quarantine (`node` returns the node from the cache). A failing or quarantined node never
/// feeds it. Each such node also feeds the median busbw of its node pairs with other such
/// nodes (over the transport most of them used, at the suite's `pair_bytes`). A probe, and a
/// multi-node NCCL sweep (the group's, or the one across blocks), measured over such nodes
/// only feed their scaling efficiency and busbw at each count of 2 or more, under the key of
/// their first node, resting on that many nodes.
pub fn sample(
    run: &str,
    alike: &Alike,
    entries: &[NodeRunResult],
    series: &BTreeMap<String, NodeSeries>,
    node: impl Fn(&str) -> Option<std::sync::Arc<Node>>,
    pair_bytes: u64,
    groups: Groups<'_>,
) -> Vec<KeyedSample> {
    let Groups { probe, sweep } = groups;
    let quarantined =
        |n: &str| node(n).is_some_and(|n| n.labels().contains_key(keys::LABEL_QUARANTINED));
    let feeding: Vec<&NodeRunResult> = entries
        .iter()
        .filter(|e| e.verdict == NodeVerdict::Passed && e.complete() && !quarantined(&e.node))
        .filter(|e| series.contains_key(&e.node))
        .collect();
    let names: BTreeSet<&str> = feeding.iter().map(|e| e.node.as_str()).collect();
    let with_pairs: Vec<NodeSeries> = feeding
        .iter()
        .filter_map(|e| {
            let mut s = series.get(&e.node)?.clone();
            if let Some((t, v)) = pair_median(e, &names) {
                s.values.insert(Series::NodePair(t, pair_bytes), v);
            }
            Some(s)
        })
        .collect();
    let mut samples = baseline::sample(run, &alike.suite, &alike.settings, with_pairs.iter());
    // A multi-node phase over feeding nodes only: its points under the key of its first node,
    // each resting on as many nodes as it spanned.
    let mut feed_group = |nodes: &[String], points: Vec<(Series, u32, f64)>| {
        if !nodes.iter().all(|n| names.contains(n.as_str())) {
            return;
        }
        let Some(group) = nodes.first().and_then(|n| series.get(n)).map(|s| &s.group) else {
            return;
        };
        let Some(keyed) = samples
            .iter_mut()
            .find(|k| k.key.product == group.0 && k.key.gpus == group.1)
        else {
            return;
        };
        for (name, n, v) in points {
            if n >= 2 && v.is_finite() && v > 0.0 {
                let spread = Spread {
                    median: v,
                    p10: v,
                    p90: v,
                    n,
                };
                keyed.sample.series.insert(name.to_string(), spread);
            }
        }
    };
    if let Some(p) = probe.filter(|p| p.state == PairState::Measured) {
        let points = p
            .points
            .iter()
            .map(|x| (Series::Probe(x.nodes), x.nodes, x.scaling_efficiency))
            .collect();
        feed_group(&p.nodes, points);
    }
    if let Some(s) = sweep.filter(|s| s.sweep.state == PairState::Measured) {
        let points = s
            .sweep
            .points
            .iter()
            .flat_map(|x| {
                x.summary
                    .iter()
                    .map(|c| (Series::Sweep(c.collective, x.nodes), x.nodes, c.large_busbw))
            })
            .collect();
        feed_group(&s.sweep.nodes, points);
    }
    samples
}

/// The median busbw of a node's measured pairs with nodes in `with`, over the transport
/// most of them used.
fn pair_median(e: &NodeRunResult, with: &BTreeSet<&str>) -> Option<(NetTransport, f64)> {
    let mut by: BTreeMap<NetTransport, Vec<f64>> = BTreeMap::new();
    for r in e.pairs.iter().filter(|r| r.state == PairState::Measured) {
        if let (Some(t), Some(bw), true) =
            (r.transport, r.busbw_gbps, with.contains(r.partner.as_str()))
        {
            by.entry(t).or_default().push(bw);
        }
    }
    let (t, values) = by.into_iter().max_by_key(|(_, v)| v.len())?;
    Some((t, gpufabric_health::fleet::median(&values)?))
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
        let s = sample(
            "run-1",
            &alike(),
            &entries,
            &all,
            held,
            1 << 30,
            Groups::default(),
        );
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].sample.nodes, 1, "only `good` feeds it");
    }

    fn paired(node: &str, partners: &[(&str, f64)]) -> NodeRunResult {
        let mut e = entry(node, NodeVerdict::Passed);
        e.pairs = partners
            .iter()
            .map(|(p, bw)| gpufabric_api::pair::PairRecord {
                partner: p.to_string(),
                state: PairState::Measured,
                busbw_gbps: Some(*bw),
                transport: Some(NetTransport::Ib),
                ..Default::default()
            })
            .collect();
        e
    }

    #[test]
    fn node_pairs_among_passing_nodes_and_a_probe_over_them_feed_the_sample() {
        let entries = [
            paired("a", &[("b", 190.0), ("c", 200.0)]),
            paired("b", &[("a", 190.0), ("bad", 40.0)]),
            paired("c", &[("a", 200.0)]),
            entry("bad", NodeVerdict::Failed),
        ];
        let all: BTreeMap<String, NodeSeries> = ["a", "b", "c", "bad"]
            .iter()
            .map(|n| (n.to_string(), series(400.0)))
            .collect();
        let probe = DdpNodesStatus {
            nodes: vec!["a".into(), "b".into(), "c".into()],
            state: PairState::Measured,
            points: vec![gpufabric_api::ddp_nodes::DdpNodesSummary {
                nodes: 3,
                gpus: 24,
                step_ms: 100.0,
                scaling_efficiency: 0.9,
                comm_alone_ms: 10.0,
                exposed_comm_ms: 5.0,
            }],
            done: true,
            ..Default::default()
        };
        let node = |_: &str| None;
        let summary = |busbw: f64| gpufabric_api::nccl_nodes::NcclNodesSummary {
            collective: gpufabric_api::suite::Collective::AllReduce,
            large_busbw: busbw,
            small_time_us: 30.0,
            wrong: 0,
        };
        let sweep = NcclNodesStatus {
            sweep: gpufabric_api::nccl_nodes::NcclNodesSweep {
                nodes: vec!["a".into(), "b".into(), "c".into()],
                state: PairState::Measured,
                points: [(2, 41.0), (3, 40.0)]
                    .into_iter()
                    .map(
                        |(nodes, bw)| gpufabric_api::nccl_nodes::NcclNodesCurvePoint {
                            nodes,
                            ranks: nodes * 8,
                            summary: vec![summary(bw)],
                            links: None,
                            ceilings: Vec::new(),
                        },
                    )
                    .collect(),
                done: true,
                ..Default::default()
            },
            ..Default::default()
        };
        let s = sample(
            "r",
            &alike(),
            &entries,
            &all,
            node,
            1 << 30,
            Groups {
                probe: Some(&probe),
                sweep: Some(&sweep),
            },
        );
        assert_eq!(s.len(), 1);
        let fed = s[0]
            .sample
            .get(Series::Sweep(
                gpufabric_api::suite::Collective::AllReduce,
                3,
            ))
            .expect("the sweep fed");
        assert_eq!((fed.median, fed.n), (40.0, 3));
        let pairs = s[0]
            .sample
            .get(Series::NodePair(NetTransport::Ib, 1 << 30))
            .expect("node pairs fed");
        // a: median of 190 and 200; b: 190 (its pair with the failed node is left out); c: 200.
        assert_eq!((pairs.median, pairs.n), (195.0, 3));
        let p = s[0].sample.get(Series::Probe(3)).expect("the probe fed");
        assert_eq!((p.median, p.n), (0.9, 3));
        // A probe over a failed node feeds nothing.
        let mut over_bad = probe.clone();
        over_bad.nodes[2] = "bad".into();
        let s = sample(
            "r",
            &alike(),
            &entries,
            &all,
            node,
            1 << 30,
            Groups {
                probe: Some(&over_bad),
                sweep: None,
            },
        );
        assert!(s[0].sample.get(Series::Probe(3)).is_none());
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
