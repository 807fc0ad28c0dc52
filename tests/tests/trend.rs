//! A node drifting over five nights, end to end: the real `fabric-operator` against a real
//! control plane, the process-kubelet and the sim agents. Each run adds every passing
//! node's key numbers to its `gpufabric.io/trend` annotation; gpu-02's GPU links slow a
//! little each night (a `slowFabric` fault rewritten into the fleet file between runs).
//! The run in which it has been below its own median for two runs, by more than 5%, gives
//! a Warning `Drifting` finding on a node that still passes and stays schedulable; the
//! night it falls through the floor it fails and is cordoned, after the Warning.
//!
//! Beside it, the fleet's own baseline: a gate run of one node, with no peers in its run,
//! is judged against what the test's passing nodes measured in its earlier runs.
//!
//! Build the binaries first: `cargo build --bins`, then
//! `cargo test -p gpufabric-tests --test trend`.

use gpufabric_api::keys::ANNOTATION_TREND;
use gpufabric_api::run::NodeVerdict;
use gpufabric_api::trend::NodeTrend;
use gpufabric_api::{FindingKind, Severity, Subject};
use gpufabric_measure::fleet::{Fault, Fleet};
use gpufabric_tests::fleet::{H100, SimFleet};
use gpufabric_tests::operator::{
    OperatorEnv, cordoned, last_run_name, quarantine_on_first_failure, sim_agent,
};
use kube::ResourceExt;
use serde_json::json;

const TEST: &str = "nightly";

fn fleet() -> Fleet {
    SimFleet::uniform("gpu", 4, H100, 8)
}

/// The fleet file with gpu-02's links at `factor` (1.0: healthy).
fn set_fabric(env: &OperatorEnv, factor: f64) {
    let mut f = env.fleet.fleet().clone();
    let name = env.node("gpu-02");
    for n in f.nodes.iter_mut().filter(|n| n.name == name) {
        n.faults.retain(|x| !matches!(x, Fault::SlowFabric { .. }));
        if factor < 1.0 {
            n.faults.push(Fault::SlowFabric { factor });
        }
    }
    SimFleet::write_to(f, env.fleet.path()).expect("fleet file rewritten");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_drifting_over_five_nights_gets_a_warning_before_it_fails() {
    let env = OperatorEnv::shared(fleet(), "trend").await;
    // A record nobody can read is ignored and replaced.
    env.annotate_node("gpu-03", ANNOTATION_TREND, "{broken")
        .await;
    env.create_test(
        TEST,
        json!({
            "nodeSelector": env.node_selector(),
            "thresholds": {"trend": {"minRuns": 2, "sustainedRuns": 2}},
            "quarantine": quarantine_on_first_failure("Cordon", false),
            "agent": sim_agent(60)
        }),
    )
    .await;
    let bad = env.node("gpu-02");

    // gpu-02's links each night: two healthy nights, 2.5% down (below its median, but by
    // less than 5%), 7% down (the Warning), then a third of normal (a failure).
    let nights = [1.0, 1.0, 0.975, 0.93, 0.3];
    let mut previous: Option<String> = None;
    let mut warned_on = None;
    for (night, factor) in nights.iter().enumerate() {
        set_fabric(&env, *factor);
        if previous.is_some() {
            env.run_now(TEST).await;
        }
        let status = env.wait_folded(TEST, previous.as_deref()).await;
        let run = last_run_name(&status);
        let rs = env.run_status(&run).await;
        let verdict = status
            .nodes
            .iter()
            .find(|h| h.node == bad)
            .map(|h| h.verdict);
        let drifting: Vec<_> = rs
            .findings
            .iter()
            .filter(|f| f.kind == FindingKind::Drifting)
            .collect();
        eprintln!(
            "night {} (links at {factor}): {verdict:?}, {} drift finding(s)",
            night + 1,
            drifting.len()
        );
        // Drift is only ever gpu-02's, and only ever a Warning.
        for f in &drifting {
            assert_eq!(f.subject, Subject::node(&bad), "{f:#?}");
            assert_eq!(f.severity, Severity::Warning, "{f:#?}");
        }
        match night {
            0..=2 => {
                assert!(drifting.is_empty(), "night {}: {drifting:#?}", night + 1);
                assert_eq!(verdict, Some(NodeVerdict::Passed), "night {}", night + 1);
            }
            3 => {
                assert!(
                    drifting
                        .iter()
                        .any(|f| f.message.contains("below its 3-run median")),
                    "night 4 should warn: {:#?}",
                    rs.findings
                );
                assert_eq!(verdict, Some(NodeVerdict::Passed), "a drift fails nothing");
                assert!(!cordoned(&env.read_node("gpu-02").await));
                warned_on = Some(night);
            }
            _ => {
                assert_eq!(verdict, Some(NodeVerdict::Failed), "{:#?}", rs.findings);
                assert!(cordoned(&env.read_node("gpu-02").await));
            }
        }
        previous = Some(run);
    }
    assert_eq!(
        warned_on,
        Some(3),
        "the Warning came the night before the failure"
    );

    // The records: the healthy nodes have all five nights, gpu-03's broken record was
    // replaced, and gpu-02 has the four nights it passed (a failed run adds nothing).
    for (base, nights) in [("gpu-01", 5), ("gpu-03", 5), ("gpu-04", 5), ("gpu-02", 4)] {
        let n = env.read_node(base).await;
        let text = n
            .annotations()
            .get(ANNOTATION_TREND)
            .cloned()
            .unwrap_or_default();
        let record = NodeTrend::parse(&text).unwrap_or_else(|e| panic!("{base}: {e}: {text}"));
        let t = record.of_test(TEST).expect("the test's runs");
        assert_eq!(t.points.len(), nights, "{base}: {text}");
        assert!(
            t.points.iter().all(|p| p.busbw_gbps.is_some()
                && p.worst_pair_gbps.is_some()
                && p.host_gbps.is_some()
                && p.ddp_step_ms.is_some()),
            "{base}: {text}"
        );
    }
}

/// Sets the validation gate on `node`, as a provisioning tool would.
async fn gate(env: &OperatorEnv, base: &str) {
    let node = env.read_node(base).await;
    let mut taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
    taints.push(k8s_openapi::api::core::v1::Taint {
        key: gpufabric_api::keys::TAINT_VALIDATION.into(),
        value: Some("pending".into()),
        effect: "NoSchedule".into(),
        time_added: None,
    });
    env.patch_node_as_kubectl(&env.node(base), json!({"spec": {"taints": taints}}))
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gated_node_alone_is_judged_against_the_baseline_of_earlier_runs() {
    let env = OperatorEnv::shared(fleet(), "baseline").await;
    let test = "baseline";
    env.create_test(
        test,
        json!({
            "nodeSelector": env.node_selector(),
            "quarantine": {"mode": "Observe"},
            "agent": sim_agent(60)
        }),
    )
    .await;
    // The first run: four healthy nodes, judged by their own median, make the baseline.
    let status = env.wait_folded(test, None).await;
    let first = last_run_name(&status);
    let entry = status
        .baseline
        .entries
        .first()
        .expect("a baseline after a complete run");
    assert_eq!(entry.runs.len(), 1);
    assert_eq!(entry.runs[0].nodes, 4, "{entry:?}");

    // gpu-04 comes back with its links at 80% and is gated: a run of it alone.
    let slow = env.node("gpu-04");
    let mut f = env.fleet.fleet().clone();
    for n in f.nodes.iter_mut().filter(|n| n.name == slow) {
        n.faults.push(Fault::SlowFabric { factor: 0.8 });
    }
    SimFleet::write_to(f, env.fleet.path()).expect("fleet file rewritten");
    gate(&env, "gpu-04").await;
    let status = env.wait_folded(test, Some(&first)).await;
    let run = last_run_name(&status);
    let rs = env.run_status(&run).await;
    assert_eq!(rs.node_count, 1, "a gate run of one node");
    assert_eq!(rs.failed, 1, "{:#?}", rs.findings);
    let against: Vec<_> = rs
        .findings
        .iter()
        .filter(|f| f.source == Some(gpufabric_api::findings::ExpectationSource::Baseline))
        .collect();
    assert!(!against.is_empty(), "{:#?}", rs.findings);
    for f in &against {
        assert_eq!(f.subject, Subject::node(&slow), "{f:#?}");
        assert!(
            f.message
                .contains("below the 4 nodes of this test run alike over 1 day"),
            "{}",
            f.message
        );
    }
    // A failing node feeds nothing: the baseline still rests on the first run alone.
    let entry = &status.baseline.entries[0];
    assert_eq!(entry.runs.len(), 1, "{entry:?}");
}
