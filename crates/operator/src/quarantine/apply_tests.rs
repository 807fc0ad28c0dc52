//! The executor changing many nodes at once: a failed write or a conflict on one node
//! mid-way loses nothing and counts nothing twice.

use super::apply::{CHANGE_CONCURRENCY, execute_held};
use super::metrics::QuarantineMetrics;
use super::outcome::Action;
use super::refusal::Change;
use crate::controller::fake_api::{Expect, client, serve_any_order, status};
use crate::events::{Events, Reporter};
use gpufabric_api::policy::QuarantineMode;
use gpufabric_api::quarantine::QuarantineRecord;
use gpufabric_api::test::{FabricTest, FabricTestSpec};
use gpufabric_health::quarantine::{Enforcement, Hold, Plan};
use http::{Method, StatusCode};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};

fn node(name: &str, rv: &str, unschedulable: bool) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": format!("uid-{name}"), "resourceVersion": rv},
        "spec": {"unschedulable": unschedulable},
    })
}

fn get(name: &str, rv: &str) -> Expect {
    Expect::new(
        Method::GET,
        &format!("/api/v1/nodes/{name}"),
        StatusCode::OK,
        node(name, rv, false),
    )
}

fn patch(name: &str, code: StatusCode, body: Value) -> Expect {
    Expect::new(Method::PATCH, &format!("/api/v1/nodes/{name}"), code, body)
}

fn held_record(run: &str) -> QuarantineRecord {
    QuarantineRecord {
        test: "nightly".into(),
        run: run.into(),
        reason: "slow".into(),
        since: Time("2026-11-28T02:00:00Z".parse().expect("timestamp")),
        mode: QuarantineMode::Cordon,
        cordoned: true,
        tainted: false,
        labeled: false,
    }
}

#[tokio::test]
async fn a_write_failing_mid_way_among_concurrent_cordons_is_reported_and_nothing_counts_twice() {
    let names: Vec<String> = (0..24).map(|i| format!("n{i:02}")).collect();
    let mut script = Vec::new();
    for name in &names {
        match name.as_str() {
            // The API server fails this node's patch: reported, never counted.
            "n07" => {
                script.push(get(name, "1"));
                script.push(patch(
                    name,
                    StatusCode::INTERNAL_SERVER_ERROR,
                    status(500, "InternalError"),
                ));
                // The failure's Event reads the node for its uid.
                script.push(get(name, "1"));
            }
            // A person cordoned this node between our read and our patch: decided again
            // from the new read, and left alone.
            "n03" => {
                script.push(get(name, "1"));
                script.push(patch(name, StatusCode::CONFLICT, status(409, "Conflict")));
                script.push(Expect::new(
                    Method::GET,
                    &format!("/api/v1/nodes/{name}"),
                    StatusCode::OK,
                    node(name, "2", true),
                ));
            }
            _ => {
                script.push(get(name, "1"));
                script.push(patch(name, StatusCode::OK, node(name, "2", true)));
            }
        }
    }
    // Over budget: reported with the count after the changes, read for its uid.
    script.push(get("n99", "1"));
    let (client, handle) = client();
    let server = serve_any_order(handle, script);
    let events = Events::new(client.clone(), Reporter::from("gpufabric"));
    let metrics = QuarantineMetrics::default();
    let mut test = FabricTest::new("nightly", FabricTestSpec::default());
    test.metadata.uid = Some("uid-1".into());
    let plan = Plan {
        quarantine: names.clone(),
        enforcement: Some(Enforcement::Cordon),
        held_back: vec![("n99".into(), Hold::OverBudget)],
        budget: 24,
        ..Plan::default()
    };
    // A node held since an earlier run.
    let held = BTreeMap::from([("old".to_string(), held_record("run-0"))]);
    let outcome = execute_held(
        &client,
        &events,
        &metrics,
        &test,
        "run-1",
        &plan,
        &BTreeMap::new(),
        held,
        None,
    )
    .await
    .expect("executed");
    drop((client, events));
    let seen = server.await.expect("server");
    assert!(
        seen.unexpected.is_empty() && seen.missing.is_empty(),
        "{seen:#?}"
    );

    // Every change was made once, at most CHANGE_CONCURRENCY nodes at once: the first
    // requests read that many different nodes, and no further node is read before a
    // patch came back.
    let read_before: BTreeSet<&str> = seen
        .requests
        .iter()
        .take_while(|r| r.method == Method::GET)
        .map(|r| r.path.as_str())
        .collect();
    assert_eq!(read_before.len(), CHANGE_CONCURRENCY, "{:?}", seen.requests);

    let cordoned: Vec<String> = names
        .iter()
        .filter(|n| !["n03", "n07"].contains(&n.as_str()))
        .cloned()
        .collect();
    assert_eq!(outcome.nodes_with(Action::Quarantined), cordoned);
    assert_eq!(outcome.nodes_with(Action::Failed), ["n07"]);
    assert_eq!(outcome.nodes_with(Action::LeftAlone), ["n03"]);
    assert_eq!(outcome.errors.len(), 1);
    assert_eq!(outcome.errors[0].node, "n07");
    assert!(matches!(outcome.errors[0].change, Change::Quarantine));
    // Held: the 22 cordoned now and the earlier one, none twice; not the failed one.
    assert_eq!(outcome.quarantined.len(), 23, "{:?}", outcome.quarantined);
    assert!(outcome.quarantined.contains_key("old"));
    assert!(!outcome.quarantined.contains_key("n03") && !outcome.quarantined.contains_key("n07"));
    assert_eq!(metrics.action_count("nightly", "quarantined"), 22);
    assert_eq!(metrics.action_count("nightly", "failed"), 1);
    assert!(
        outcome.held_back["n99"].contains("23 of 24 node(s) held"),
        "{:?}",
        outcome.held_back
    );
    // Each patch carries the resourceVersion its node was decided from.
    assert!(
        seen.requests
            .iter()
            .filter(|r| r.method == Method::PATCH)
            .all(|r| r.body["metadata"]["resourceVersion"] == "1")
    );
}
