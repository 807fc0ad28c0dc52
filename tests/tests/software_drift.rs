//! Software drift, end to end: the real `fabric-operator` against a real control plane, the
//! process-kubelet and the sim agents. Of four nodes, the one whose driver differs from the
//! other three gets a Warning naming both versions, passes, and is not cordoned; the nodes
//! that agree get nothing.
//!
//! Build the binaries first: `cargo build -p gpufabric-agent -p gpufabric-tests --bins`,
//! then `cargo test -p gpufabric-tests --test software_drift`.

use gpufabric_api::findings::FindingKind;
use gpufabric_api::run::NodeVerdict;
use gpufabric_api::{Severity, Subject};
use gpufabric_measure::fleet::SimSoftware;
use gpufabric_tests::fleet::{H100, SimFleet};
use gpufabric_tests::operator::{
    OperatorEnv, cordoned, last_run_name, quarantine_on_first_failure, sim_agent,
};
use serde_json::json;

const OLD_DRIVER: &str = "550.54.15";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_driver_differs_from_its_runs_is_warned_and_not_cordoned() {
    let mut fleet = SimFleet::uniform("gpu", 4, H100, 8);
    fleet.nodes[1].software.driver = Some(OLD_DRIVER.into());
    let env = OperatorEnv::shared(fleet, "software-drift").await;
    env.create_test(
        "drift",
        json!({
            "nodeSelector": env.node_selector(),
            "quarantine": quarantine_on_first_failure("Cordon", false),
            "agent": sim_agent(60)
        }),
    )
    .await;

    let status = env.wait_folded("drift", None).await;
    let run = env.run_status(&last_run_name(&status)).await;
    let drift: Vec<_> = run
        .findings
        .iter()
        .filter(|f| f.kind == FindingKind::SoftwareDrift)
        .collect();
    let odd = env.node("gpu-02");
    assert_eq!(drift.len(), 1, "{:#?}", run.findings);
    assert_eq!(drift[0].subject, Subject::node(&odd));
    assert_eq!(drift[0].severity, Severity::Warning);
    let expected = format!(
        "driver {OLD_DRIVER} on {odd} where 3 of 4 nodes in this run have {}",
        SimSoftware::USUAL_DRIVER
    );
    assert!(
        drift[0].message.starts_with(&expected),
        "{}",
        drift[0].message
    );

    assert!(
        status
            .nodes
            .iter()
            .all(|h| h.verdict == NodeVerdict::Passed),
        "{:#?}",
        run.findings
    );
    assert!(!cordoned(&env.read_node("gpu-02").await));
}
