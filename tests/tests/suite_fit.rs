//! A suite larger than the GPUs of the nodes it runs on, on the real control plane with the
//! sim agents: admitted (it fits the largest known GPU), refused by each agent at run time
//! against its own GPUs' memory, and never blamed on the nodes.
//!
//! Build the binaries first: `cargo build -p gpufabric-agent -p gpufabric-operator`, then
//! `cargo test -p gpufabric-tests --test suite_fit`.

use gpufabric_api::run::NodeVerdict;
use gpufabric_api::{FabricTest, FabricTestStatus};
use gpufabric_tests::fleet::{H100, SimFleet};
use gpufabric_tests::operator::{OperatorEnv, sim_agent};
use gpufabric_tests::wait;
use serde_json::json;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_suite_larger_than_the_nodes_gpus_is_refused_by_the_agent_and_blames_no_node() {
    let env = OperatorEnv::shared(SimFleet::uniform("gpu", 2, H100, 8), "fit").await;
    // 32 GiB: three sweep buffers of 32 GiB fit a B200, not an H100's 80 GB.
    env.create_test(
        "fit",
        json!({
            "nodeSelector": env.node_selector(),
            "quarantine": {"mode": "Cordon", "confirmRetest": false, "failuresToQuarantine": 1},
            "suite": {"ncclSweep": {"maxBytes": 32u64 << 30}},
            "agent": sim_agent(60)
        }),
    )
    .await;
    let api = env.tests_api();
    let done = |s: &FabricTestStatus| s.active_run.is_none() && s.last_run.is_some();
    let t = wait::for_object(
        &api,
        "fit",
        Duration::from_secs(180),
        |t: Option<&FabricTest>| t.and_then(|t| t.status.as_ref()).is_some_and(done),
    )
    .await
    .unwrap_or_else(|e| panic!("the run folded: {e}\n{}", env.operator.log_tail(80)))
    .expect("the test");
    let s = t.status.expect("status");
    assert_eq!(s.nodes.len(), 2, "{s:#?}");
    for h in &s.nodes {
        assert_eq!(h.verdict, NodeVerdict::NotMeasured, "{h:?}");
        assert!(
            h.last_finding
                .as_deref()
                .is_some_and(|f| f.contains("the agent refused its input (exit code 2)")),
            "{h:?}"
        );
    }
    assert!(s.quarantined_nodes.is_empty(), "no node blamed: {s:#?}");
}
