//! NVLink error counters between runs, end to end: the real `fabric-operator` against a
//! real control plane, the process-kubelet and the sim agents. The first run records each
//! node's counters in the `gpufabric.io/counters` annotation (replacing one it cannot
//! read); the next run fails only the node whose GPU's counters grew past
//! `thresholds.nvlinkErrorGrowth`, names that GPU, cordons it, and keeps its old record so
//! the growth is not forgotten; healthy nodes pass both runs and stay schedulable. The
//! records follow the test's fold; an operator that stops before writing them leaves the
//! run's `CountersRecorded` False, and the next one records them.
//!
//! Build the binaries first: `cargo build --bins`, then
//! `cargo test -p gpufabric-tests --test counters`.

use gpufabric_api::counters::CounterBaseline;
use gpufabric_api::keys::ANNOTATION_COUNTERS;
use gpufabric_api::run::NodeVerdict;
use gpufabric_api::{FindingKind, Subject};
use gpufabric_measure::fleet::{Fault, Fleet};
use gpufabric_tests::fleet::{H200, SimFleet};
use gpufabric_tests::operator::{
    OperatorEnv, cordoned, last_run_name, quarantine_on_first_failure, sim_agent,
};
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams};
use serde_json::json;

const TEST: &str = "nvlink-growth";

/// Four H200 nodes; GPU 3 of gpu-02 adds a million NVLink errors a second.
fn fleet() -> Fleet {
    let mut f = SimFleet::uniform("gpu", 4, H200, 8);
    f.nodes[1].faults.push(Fault::NvlinkErrors {
        gpu: 3,
        per_second: 1e6,
    });
    f
}

fn record(n: &Node) -> Option<CounterBaseline> {
    CounterBaseline::parse(n.annotations().get(ANNOTATION_COUNTERS)?).ok()
}

/// Every node's record, by base name.
async fn records_of(env: &OperatorEnv) -> Vec<(String, Option<CounterBaseline>)> {
    let mut out = Vec::new();
    for base in ["gpu-01", "gpu-02", "gpu-03", "gpu-04"] {
        out.push((base.to_string(), record(&env.read_node(base).await)));
    }
    out
}

/// Sets the run's `CountersRecorded` to False, as the verdict leaves it until the
/// counters are written.
async fn mark_counters_due(env: &OperatorEnv, run: &str) {
    let runs = env.runs_api();
    let mut status = runs.get(run).await.expect("run").status.expect("status");
    let due = status
        .conditions
        .iter_mut()
        .find(|c| c.type_ == "CountersRecorded")
        .expect("the run has a CountersRecorded condition");
    due.status = "False".into();
    due.reason = "AfterFold".into();
    let patch = json!({"status": {"conditions": status.conditions}});
    runs.patch_status(run, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("condition set");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvlink_errors_growing_between_runs_fail_only_their_node_and_name_the_gpu() {
    let mut env = OperatorEnv::shared(fleet(), "counters").await;
    // A record nobody can read (another tool's, or corrupted) is ignored and replaced.
    env.annotate_node("gpu-03", ANNOTATION_COUNTERS, "{broken")
        .await;

    env.create_test(
        TEST,
        json!({
            "nodeSelector": env.node_selector(),
            "thresholds": {"nvlinkErrorGrowth": 1000},
            "quarantine": quarantine_on_first_failure("Cordon", false),
            "agent": sim_agent(60)
        }),
    )
    .await;

    // Run 1: no node has a record yet, so nothing grew: every node passes and gets one.
    let s1 = env.wait_folded(TEST, None).await;
    let run1 = last_run_name(&s1);
    for base in ["gpu-01", "gpu-02", "gpu-03", "gpu-04"] {
        let n = env.read_node(base).await;
        let r = record(&n).unwrap_or_else(|| panic!("{base}: no readable record after run 1"));
        assert_eq!(r.run, run1, "{base}");
        assert_eq!(r.nvlink.len(), 8, "{base}");
        assert!(!cordoned(&n), "{base} cordoned after run 1");
    }
    let first = record(&env.read_node("gpu-02").await).expect("gpu-02 record");
    assert!(first.nvlink[3] > 0 && first.nvlink[0] == 0, "{first:?}");

    // The operator stops between the verdict and the counters' write (they follow the
    // test's fold): the run says they are due, no node carries them. The next operator
    // records them from the run's pods, the same as the first would have.
    env.operator.kill();
    let records_before = records_of(&env).await;
    let nodes: kube::Api<Node> = kube::Api::all(env.cluster.client());
    for base in ["gpu-01", "gpu-02", "gpu-03", "gpu-04"] {
        let forget = json!({"metadata": {"annotations": {ANNOTATION_COUNTERS: null}}});
        nodes
            .patch(
                &env.node(base),
                &PatchParams::default(),
                &Patch::Merge(&forget),
            )
            .await
            .expect("record removed");
    }
    mark_counters_due(&env, &run1).await;
    env.operator.restart();
    env.wait_counters_recorded(&run1).await;
    assert_eq!(
        records_of(&env).await,
        records_before,
        "the records of run 1 after a restart between its verdict and their write"
    );

    // Run 2: GPU 3 of gpu-02 grew by about a million a second since run 1.
    env.run_now(TEST).await;
    let s2 = env.wait_folded(TEST, Some(&run1)).await;
    let run2 = last_run_name(&s2);
    let status = env.run_status(&run2).await;
    let growing: Vec<_> = status
        .findings
        .iter()
        .filter(|f| f.kind == FindingKind::NvlinkErrorsGrowing)
        .collect();
    assert_eq!(growing.len(), 1, "{:#?}", status.findings);
    assert_eq!(growing[0].subject, Subject::gpu(env.node("gpu-02"), 3));
    assert!(
        growing[0].message.contains(&format!("since run {run1}")),
        "{}",
        growing[0].message
    );
    let verdicts: std::collections::BTreeMap<String, NodeVerdict> = s2
        .nodes
        .iter()
        .map(|h| (h.node.clone(), h.verdict))
        .collect();
    assert_eq!(
        verdicts.get(&env.node("gpu-02")),
        Some(&NodeVerdict::Failed),
        "{verdicts:?}"
    );
    for base in ["gpu-01", "gpu-03", "gpu-04"] {
        assert_eq!(
            verdicts.get(&env.node(base)),
            Some(&NodeVerdict::Passed),
            "{base}"
        );
        let n = env.read_node(base).await;
        assert!(!cordoned(&n), "{base} cordoned");
        // Unchanged counters are not written again.
        assert_eq!(record(&n).map(|r| r.run), Some(run1.clone()), "{base}");
    }
    let bad = env.read_node("gpu-02").await;
    assert!(
        cordoned(&bad),
        "gpu-02 should be cordoned after its GPU's errors grew"
    );
    // The record of run 1 stays: the next run still measures growth from there.
    assert_eq!(record(&bad), Some(first));
}
