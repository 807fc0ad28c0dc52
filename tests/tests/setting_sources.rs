//! Where an NCCL setting came from, end to end: the real `fabric-operator` against a real
//! control plane, the process-kubelet and the sim agents. The same `NCCL_P2P_DISABLE=1` is
//! spared when the FabricTest's `spec.agent.env` sets it, and is a finding naming its source
//! when it reaches NCCL from a config file the spec did not write (the sim's collectives do
//! not move with NCCL settings, so the finding is the Warning, and no node fails).
//!
//! Build the binaries first: `cargo build -p gpufabric-agent -p gpufabric-tests --bins`,
//! then `cargo test -p gpufabric-tests --test setting_sources`.

use gpufabric_api::run::NodeVerdict;
use gpufabric_api::{Severity, Subject};
use gpufabric_tests::fleet::{H200, SimFleet};
use gpufabric_tests::operator::{OperatorEnv, last_run_name, quarantine_on_first_failure};
use serde_json::json;

fn agent(env: serde_json::Value) -> serde_json::Value {
    json!({
        "image": "fabric-agent:test",
        "timeoutSeconds": 60,
        "env": env
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_setting_from_the_spec_is_spared_and_the_same_from_a_config_file_is_named() {
    let env = OperatorEnv::shared(SimFleet::uniform("gpu", 2, H200, 8), "setting-sources").await;
    let dir = tempfile::tempdir().expect("temp dir");
    let conf = dir.path().join("site-nccl.conf");
    std::fs::write(&conf, "# brought by the host\nNCCL_P2P_DISABLE=1\n").expect("conf");
    let conf = conf.display().to_string();

    for (name, extra) in [
        (
            "settings-from-spec",
            json!({"name": "NCCL_P2P_DISABLE", "value": "1"}),
        ),
        (
            "settings-from-file",
            json!({"name": "NCCL_CONF_FILE", "value": conf}),
        ),
    ] {
        env.create_test(
            name,
            json!({
                "nodeSelector": env.node_selector(),
                "quarantine": quarantine_on_first_failure("Cordon", false),
                "agent": agent(json!([{"name": "FABRIC_BACKEND", "value": "sim"}, extra]))
            }),
        )
        .await;
    }

    let spared = env.wait_folded("settings-from-spec", None).await;
    let status = env.run_status(&last_run_name(&spared)).await;
    assert!(
        spared
            .nodes
            .iter()
            .all(|h| h.verdict == NodeVerdict::Passed),
        "{:#?}",
        status.findings
    );
    assert!(
        !status
            .findings
            .iter()
            .any(|f| f.message.contains("did not choose")),
        "{:#?}",
        status.findings
    );

    let named = env.wait_folded("settings-from-file", None).await;
    let status = env.run_status(&last_run_name(&named)).await;
    for base in ["gpu-01", "gpu-02"] {
        let node = env.node(base);
        let found: Vec<_> = status
            .findings
            .iter()
            .filter(|f| f.subject == Subject::node(&node) && f.message.contains("did not choose"))
            .collect();
        assert_eq!(found.len(), 1, "{base}: {:#?}", status.findings);
        assert_eq!(found[0].severity, Severity::Warning);
        assert!(
            found[0]
                .message
                .contains(&format!("NCCL_P2P_DISABLE=1 from NCCL_CONF_FILE {conf}")),
            "{}",
            found[0].message
        );
    }
    // The sim reaches its links with the setting: a Warning, which fails no node.
    assert!(
        named.nodes.iter().all(|h| h.verdict == NodeVerdict::Passed),
        "{:#?}",
        status.findings
    );
}
