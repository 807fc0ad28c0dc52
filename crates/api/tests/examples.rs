//! Every example under deploy/examples parses as a FabricTest and passes validate().

use gpufabric_api::policy::QuarantineMode;
use gpufabric_api::{FabricTest, validate};
use std::path::PathBuf;

fn example(name: &str) -> FabricTest {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/examples")
        .join(name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{name} does not parse: {e}"))
}

#[test]
fn every_example_parses_and_validates() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/examples");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("deploy/examples exists") {
        let path = entry.expect("readable entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_string();
        let test = example(&name);
        if let Err(e) = validate(&test.spec) {
            panic!("{name} is invalid: {e}");
        }
        seen += 1;
    }
    assert!(
        seen >= 3,
        "expected minimal, nightly and full examples, found {seen}"
    );
}

#[test]
fn nightly_cordons_at_two_with_ten_percent_budget_and_confirmation() {
    let t = example("nightly.yaml");
    assert_eq!(t.spec.schedule.as_deref(), Some("0 2 * * *"));
    assert_eq!(t.spec.quarantine.mode, QuarantineMode::Cordon);
    assert!(t.spec.quarantine.confirm_retest);
    assert_eq!(t.spec.quarantine.budget(100), Ok(10));
}

#[test]
fn minimal_example_gets_every_default() {
    let t = example("minimal.yaml");
    assert_eq!(
        t.spec.node_selector.get("pool").map(String::as_str),
        Some("training")
    );
    assert_eq!(t.spec.schedule, None);
    assert_eq!(t.spec.quarantine.mode, QuarantineMode::Observe);
    assert_eq!(t.spec.suite.nccl_sweep.collectives.len(), 7);
    assert_eq!(t.spec.suite.nccl_sweep.min_bytes, 8);
    assert_eq!(t.spec.suite.nccl_sweep.max_bytes, 1 << 30);
    assert_eq!(t.spec.suite.ddp_probe.first_bucket_bytes, 1 << 20);
    assert_eq!(t.spec.suite.ddp_probe.bucket_bytes, 25 << 20);
    assert_eq!(t.spec.successful_runs_history_limit, 3);
    assert_eq!(t.spec.failed_runs_history_limit, 1);
    assert_eq!(t.spec.agent.timeout_seconds, 900);
    assert_eq!(
        t.spec,
        gpufabric_api::FabricTestSpec {
            node_selector: t.spec.node_selector.clone(),
            ..Default::default()
        }
    );
}

#[test]
fn full_example_sets_every_spec_field() {
    // Serialising the parsed full example must mention every top-level spec field, so a new
    // field without an example entry fails here.
    let t = example("full.yaml");
    let value = serde_json::to_value(&t.spec).expect("serialises");
    let schema = &gpufabric_api::crds()[0].1.spec.versions[0].schema;
    let props = schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .and_then(|s| s.properties.as_ref())
        .and_then(|p| p.get("spec"))
        .and_then(|s| s.properties.as_ref())
        .expect("spec properties");
    for field in props.keys() {
        assert!(
            value.get(field).is_some(),
            "full.yaml does not set spec.{field}"
        );
    }
}

#[test]
fn plain_manifests_parse_as_kubernetes_objects_and_grant_what_the_operator_does() {
    use k8s_openapi::api::apps::v1::Deployment;
    use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
    use serde::Deserialize;

    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/operator.yaml");
    let text = std::fs::read_to_string(&path).expect("deploy/operator.yaml exists");
    // Rules of every ClusterRole and Role, and of the ClusterRoles alone.
    let mut rules: Vec<PolicyRule> = Vec::new();
    let mut cluster_rules: Vec<PolicyRule> = Vec::new();
    let mut deployment = None;
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value = serde_yaml::Value::deserialize(doc).expect("each document is YAML");
        match value.get("kind").and_then(|k| k.as_str()) {
            Some("ClusterRole") => {
                let role = serde_yaml::from_value::<ClusterRole>(value).expect("a ClusterRole");
                cluster_rules.extend(role.rules.clone().unwrap_or_default());
                rules.extend(role.rules.unwrap_or_default());
            }
            Some("Role") => {
                let role = serde_yaml::from_value::<Role>(value).expect("a Role");
                rules.extend(role.rules.unwrap_or_default());
            }
            Some("Deployment") => {
                deployment =
                    Some(serde_yaml::from_value::<Deployment>(value).expect("a Deployment"))
            }
            _ => {}
        }
    }
    let grants_in = |rules: &[PolicyRule], group: &str, resource: &str, verb: &str| {
        rules.iter().any(|r| {
            r.api_groups.iter().flatten().any(|g| g == group)
                && r.resources.iter().flatten().any(|x| x == resource)
                && r.verbs.iter().any(|v| v == verb)
        })
    };
    let grants = |group: &str, resource: &str, verb: &str| grants_in(&rules, group, resource, verb);
    for (group, resource, verb) in [
        ("gpufabric.io", "fabrictests", "watch"),
        ("gpufabric.io", "fabrictestruns", "create"),
        ("gpufabric.io", "fabrictests/status", "patch"),
        ("gpufabric.io", "fabrictestruns/status", "patch"),
        ("gpufabric.io", "fabrictests/finalizers", "update"),
        ("gpufabric.io", "fabrictestruns/finalizers", "update"),
        ("", "pods", "create"),
        ("", "pods", "delete"),
        ("", "secrets", "create"),
        ("", "nodes", "patch"),
        ("events.k8s.io", "events", "create"),
        ("coordination.k8s.io", "leases", "update"),
    ] {
        assert!(
            grants(group, resource, verb),
            "no Role or ClusterRole grants {verb} on {group}/{resource}"
        );
    }
    assert!(
        !grants("", "nodes", "delete"),
        "the operator must never delete nodes"
    );
    assert!(
        !grants_in(&cluster_rules, "", "pods", "create"),
        "pods are created in the operator's namespace only (a Role), not cluster-wide"
    );
    for resource in ["fabrictests", "fabrictestruns", "fabrictests/status"] {
        assert!(
            grants_in(&cluster_rules, "gpufabric.io", resource, "patch"),
            "{resource} are cluster-scoped: a ClusterRole must grant them"
        );
    }
    let lease_rules = rules
        .iter()
        .filter(|r| r.resources.iter().flatten().any(|x| x == "leases"));
    for r in lease_rules {
        let named = r.resource_names.as_ref().is_some_and(|n| !n.is_empty());
        let only_create = r.verbs.iter().all(|v| v == "create");
        assert!(
            named || only_create,
            "Lease rights beyond create name the operator's Lease: {r:?}"
        );
    }
    assert!(
        !cluster_rules
            .iter()
            .any(|r| r.resources.iter().flatten().any(|x| x == "leases")),
        "no Lease rights cluster-wide"
    );
    let deployment = deployment.expect("a Deployment");
    let container = &deployment
        .spec
        .expect("spec")
        .template
        .spec
        .expect("pod spec")
        .containers[0];
    assert_eq!(
        container
            .args
            .as_ref()
            .and_then(|a| a.first())
            .map(String::as_str),
        Some("run")
    );
}
