//! Every permission the chart grants, checked three ways against one table: the roles
//! `helm template` renders (hooks included), the table below, and the table of docs/install.md's
//! "Permissions". A rule added to the chart, or a verb, fails here until both tables say it,
//! so the docs cannot drift from what the chart grants.
//!
//! Needs helm: `tests/tools/build.sh` (cached; or point GPUFABRIC_TOOLS_BIN at it).

use gpufabric_tests::tools::{chart, helm, run_ok};
use gpufabric_tests::workspace_root;
use std::collections::BTreeSet;

const RELEASE: &str = "fabric";
const NS: &str = "gpufabric-system";

/// One rule a role grants: (role, API group, resources, resource names, verbs). The role is
/// its kind and name, with `<release>` for the release's name; "" is the core group.
type Grant = (
    &'static str,
    &'static str,
    &'static [&'static str],
    &'static [&'static str],
    &'static [&'static str],
);

/// What the chart grants.
const GRANTED: &[Grant] = &[
    // The operator, cluster-wide: what is cluster-scoped or lands in "default".
    (
        "ClusterRole <release>-operator",
        "",
        &["nodes"],
        &[],
        &["get", "list", "watch", "patch"],
    ),
    (
        "ClusterRole <release>-operator",
        "",
        &["nodes/status"],
        &[],
        &["patch"],
    ),
    (
        "ClusterRole <release>-operator",
        "",
        &["pods"],
        &[],
        &["list"],
    ),
    (
        "ClusterRole <release>-operator",
        "gpufabric.io",
        &["fabrictests"],
        &[],
        &["get", "list", "watch", "patch"],
    ),
    (
        "ClusterRole <release>-operator",
        "gpufabric.io",
        &["fabrictestruns"],
        &[],
        &["get", "list", "watch", "create", "patch", "delete"],
    ),
    (
        "ClusterRole <release>-operator",
        "gpufabric.io",
        &["fabrictestrunshards"],
        &[],
        &["get", "list", "watch", "create"],
    ),
    (
        "ClusterRole <release>-operator",
        "gpufabric.io",
        &[
            "fabrictests/status",
            "fabrictestruns/status",
            "fabrictestrunshards/status",
        ],
        &[],
        &["get", "patch", "update"],
    ),
    (
        "ClusterRole <release>-operator",
        "gpufabric.io",
        &["fabrictests/finalizers", "fabrictestruns/finalizers"],
        &[],
        &["update"],
    ),
    (
        "ClusterRole <release>-operator",
        "resource.k8s.io",
        &["resourceslices"],
        &[],
        &["list"],
    ),
    (
        "ClusterRole <release>-operator",
        "resource.k8s.io",
        &["resourceclaims"],
        &[],
        &["list"],
    ),
    (
        "ClusterRole <release>-operator",
        "resource.k8s.io",
        &["devicetaintrules"],
        &[],
        &["list", "create", "delete"],
    ),
    // The operator, in the release namespace: its benchmark pods and what they leave.
    (
        "Role <release>-operator-workloads",
        "",
        &["pods"],
        &[],
        &["get", "list", "watch", "create", "delete"],
    ),
    (
        "Role <release>-operator-workloads",
        "",
        &["pods/log"],
        &[],
        &["get"],
    ),
    (
        "Role <release>-operator-workloads",
        "",
        &["configmaps"],
        &[],
        &["create", "patch"],
    ),
    (
        "Role <release>-operator-workloads",
        "",
        &["secrets"],
        &[],
        &["create"],
    ),
    (
        "Role <release>-operator-workloads",
        "resource.k8s.io",
        &["resourceclaimtemplates"],
        &[],
        &["get", "create"],
    ),
    // The operator's Events: all about cluster-scoped objects, so all in "default".
    (
        "Role <release>-operator-events",
        "events.k8s.io",
        &["events"],
        &[],
        &["create", "patch"],
    ),
    // The operator's leader Lease.
    (
        "Role <release>-operator-leader",
        "coordination.k8s.io",
        &["leases"],
        &[],
        &["create"],
    ),
    (
        "Role <release>-operator-leader",
        "coordination.k8s.io",
        &["leases"],
        &["<release>-operator"],
        &["get", "update"],
    ),
    // The uninstall hook, only while `helm uninstall` runs it.
    (
        "ClusterRole <release>-operator-uninstall",
        "gpufabric.io",
        &["fabrictests"],
        &[],
        &["list", "delete", "patch"],
    ),
    (
        "ClusterRole <release>-operator-uninstall",
        "",
        &["nodes"],
        &[],
        &["get", "list", "patch"],
    ),
    (
        "ClusterRole <release>-operator-uninstall",
        "",
        &["nodes/status"],
        &[],
        &["patch"],
    ),
    (
        "ClusterRole <release>-operator-uninstall",
        "resource.k8s.io",
        &["devicetaintrules"],
        &[],
        &["list", "delete"],
    ),
    (
        "Role <release>-operator-uninstall-events",
        "events.k8s.io",
        &["events"],
        &[],
        &["create", "patch"],
    ),
    (
        "Role <release>-operator-uninstall",
        "coordination.k8s.io",
        &["leases"],
        &["<release>-operator"],
        &["get"],
    ),
    // Who sent a scrape's bearer token, and whether it may read /metrics (metrics.auth).
    (
        "ClusterRole <release>-operator-metrics-auth",
        "authentication.k8s.io",
        &["tokenreviews"],
        &[],
        &["create"],
    ),
    (
        "ClusterRole <release>-operator-metrics-auth",
        "authorization.k8s.io",
        &["subjectaccessreviews"],
        &[],
        &["create"],
    ),
    // For the scrapers bound through metrics.readers, not the operator.
    (
        "ClusterRole <release>-operator-metrics-reader",
        "",
        &["/metrics"],
        &[],
        &["get"],
    ),
];

/// One rule of one role, every list sorted.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Rule {
    role: String,
    group: String,
    resources: Vec<String>,
    names: Vec<String>,
    verbs: Vec<String>,
}

impl Rule {
    fn new(
        role: &str,
        group: &str,
        resources: impl IntoIterator<Item = String>,
        names: impl IntoIterator<Item = String>,
        verbs: impl IntoIterator<Item = String>,
    ) -> Rule {
        Rule {
            role: role.to_string(),
            group: group.to_string(),
            resources: sorted(resources),
            names: sorted(names),
            verbs: sorted(verbs),
        }
    }
}

fn sorted(items: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut v: Vec<String> = items.into_iter().collect();
    v.sort();
    v
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let group = if self.group.is_empty() {
            "core"
        } else {
            &self.group
        };
        write!(f, "{}: {} ({group})", self.role, self.resources.join(", "))?;
        if !self.names.is_empty() {
            write!(f, " named {}", self.names.join(", "))?;
        }
        write!(f, ": {}", self.verbs.join(", "))
    }
}

fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(String::from))
        .collect()
}

fn with_release(s: &str) -> String {
    s.replace("<release>", RELEASE)
}

/// The table above, for release [`RELEASE`].
fn table() -> BTreeSet<Rule> {
    GRANTED
        .iter()
        .map(|(role, group, resources, names, verbs)| {
            Rule::new(
                &with_release(role),
                group,
                resources.iter().map(|s| s.to_string()),
                names.iter().map(|s| with_release(s)),
                verbs.iter().map(|s| s.to_string()),
            )
        })
        .collect()
}

/// Every document `helm template` renders with `values`, hooks included.
fn render(values: &[&str]) -> Vec<serde_json::Value> {
    let mut cmd = helm(None);
    cmd.args(["template", RELEASE])
        .arg(chart())
        .args(["-n", NS]);
    for v in values {
        cmd.args(["--set", v]);
    }
    let out = run_ok(&mut cmd);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    serde_yaml::Deserializer::from_str(&text)
        .filter_map(|doc| serde::Deserialize::deserialize(doc).ok())
        .filter(|v: &serde_json::Value| !v.is_null())
        .collect()
}

/// The rules of every Role and ClusterRole rendered.
fn rendered_rules(docs: &[serde_json::Value]) -> BTreeSet<Rule> {
    let mut rules = BTreeSet::new();
    for doc in docs {
        let kind = doc["kind"].as_str().unwrap_or_default();
        if kind != "Role" && kind != "ClusterRole" {
            continue;
        }
        let name = doc["metadata"]["name"].as_str().unwrap_or_default();
        if kind == "Role" {
            // Events about cluster-scoped objects land in "default"; everything else of
            // the operator's is in the release namespace.
            let ns = if name.ends_with("-events") {
                "default"
            } else {
                NS
            };
            assert_eq!(
                doc["metadata"]["namespace"].as_str(),
                Some(ns),
                "Role {name} is in namespace {ns}"
            );
        }
        for r in doc["rules"].as_array().into_iter().flatten() {
            // A non-resource URL (the scrapers' `/metrics`): the table names it with no group.
            if r.get("nonResourceURLs").is_some() {
                rules.insert(Rule::new(
                    &format!("{kind} {name}"),
                    "",
                    strings(&r["nonResourceURLs"]),
                    Vec::new(),
                    strings(&r["verbs"]),
                ));
                continue;
            }
            let groups = strings(&r["apiGroups"]);
            assert_eq!(
                groups.len(),
                1,
                "{kind} {name}: one API group per rule: {r}"
            );
            rules.insert(Rule::new(
                &format!("{kind} {name}"),
                &groups[0],
                strings(&r["resources"]),
                strings(&r["resourceNames"]),
                strings(&r["verbs"]),
            ));
        }
    }
    rules
}

/// The rows of docs/install.md's permission table: `| role | resources | verbs | why |`, where an
/// empty role cell continues the role above; resources are back-quoted, followed by
/// `named` and the back-quoted resource names when there are any, and the API group in
/// parentheses (none: core).
fn readme_rules() -> BTreeSet<Rule> {
    let readme = std::fs::read_to_string(workspace_root().join("docs/install.md"))
        .expect("docs/install.md read");
    let start = readme
        .find("| role | resources | verbs | why |")
        .expect("docs/install.md has the permission table");
    let quoted =
        |s: &str| -> Vec<String> { s.split('`').skip(1).step_by(2).map(with_release).collect() };
    let mut role = String::new();
    let mut rules = BTreeSet::new();
    for line in readme[start..].lines().skip(2) {
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        assert_eq!(
            cells.len(),
            4,
            "docs/install.md permission row of 4 cells: {line}"
        );
        if !cells[0].is_empty() {
            let kind = cells[0].split_whitespace().next().unwrap_or_default();
            let name = quoted(cells[0]).into_iter().next().unwrap_or_default();
            role = format!("{kind} {name}");
        }
        let (what, group) = match cells[1].rsplit_once('(') {
            Some((what, group)) => (what, group.trim_end_matches(')').trim()),
            None => (cells[1], ""),
        };
        let (resources, names) = what.split_once(" named ").unwrap_or((what, ""));
        rules.insert(Rule::new(
            &role,
            group,
            quoted(resources),
            quoted(names),
            cells[2].split(',').map(|v| v.trim().to_string()),
        ));
    }
    rules
}

fn differences(a: &BTreeSet<Rule>, b: &BTreeSet<Rule>) -> String {
    let list = |s: Vec<&Rule>| {
        s.iter()
            .map(|r| format!("  {r}"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    format!(
        "only in the first:\n{}\nonly in the second:\n{}",
        list(a.difference(b).collect()),
        list(b.difference(a).collect())
    )
}

#[test]
fn the_chart_grants_exactly_what_the_table_and_readme_say() {
    let docs = render(&[]);
    let rendered = rendered_rules(&docs);
    let table = table();
    assert!(
        rendered == table,
        "the chart's RBAC (first) differs from the table in tests/tests/permissions.rs \
         (second): change both, and docs/install.md's Permissions\n{}",
        differences(&rendered, &table)
    );
    let readme = readme_rules();
    assert!(
        readme == table,
        "docs/install.md's Permissions (first) differs from what the chart grants (second)\n{}",
        differences(&readme, &table)
    );
}

#[test]
fn every_role_is_bound_to_its_own_service_account_only() {
    let docs = render(&[]);
    let mut bindings = BTreeSet::new();
    for doc in &docs {
        let kind = doc["kind"].as_str().unwrap_or_default();
        if kind != "RoleBinding" && kind != "ClusterRoleBinding" {
            continue;
        }
        let role = format!(
            "{} {}",
            doc["roleRef"]["kind"].as_str().unwrap_or_default(),
            doc["roleRef"]["name"].as_str().unwrap_or_default()
        );
        for s in doc["subjects"].as_array().into_iter().flatten() {
            bindings.insert((
                role.clone(),
                format!(
                    "{} {}/{}",
                    s["kind"].as_str().unwrap_or_default(),
                    s["namespace"].as_str().unwrap_or_default(),
                    s["name"].as_str().unwrap_or_default()
                ),
            ));
        }
    }
    let operator = format!("ServiceAccount {NS}/{RELEASE}-operator");
    let uninstall = format!("ServiceAccount {NS}/{RELEASE}-operator-uninstall");
    let expected: BTreeSet<(String, String)> = [
        ("ClusterRole <release>-operator", &operator),
        ("Role <release>-operator-workloads", &operator),
        ("Role <release>-operator-leader", &operator),
        ("Role <release>-operator-events", &operator),
        ("ClusterRole <release>-operator-metrics-auth", &operator),
        ("ClusterRole <release>-operator-uninstall", &uninstall),
        ("Role <release>-operator-uninstall", &uninstall),
        ("Role <release>-operator-uninstall-events", &uninstall),
    ]
    .into_iter()
    .map(|(role, sa)| (with_release(role), sa.clone()))
    .collect();
    assert_eq!(bindings, expected);
}

#[test]
fn no_value_grants_more() {
    // The values that change what is rendered: none adds a rule.
    let base = rendered_rules(&render(&[]));
    for values in [
        &["webhook.certManager.enabled=true"][..],
        &["webhook.enabled=false"],
        &[
            "metrics.serviceMonitor.enabled=true",
            "metrics.prometheusRule.enabled=true",
        ],
        &["testSelector=team=infra"],
        &["admissionPolicy.enabled=false"],
    ] {
        assert_eq!(rendered_rules(&render(values)), base, "--set {values:?}");
    }
    // Without the uninstall hook, its roles are gone and nothing else changes.
    let without_hook = rendered_rules(&render(&["uninstall.releaseNodes=false"]));
    let operator_only: BTreeSet<Rule> = base
        .into_iter()
        .filter(|r| !r.role.contains("-operator-uninstall"))
        .collect();
    assert_eq!(without_hook, operator_only);
}

/// The usernames a rendered ValidatingAdmissionPolicy applies to, read from its
/// `request.userInfo.username in [...]` match condition.
fn policy_users(policy: &serde_json::Value) -> BTreeSet<String> {
    let conditions = policy["spec"]["matchConditions"].as_array();
    let expression = conditions
        .into_iter()
        .flatten()
        .filter_map(|c| c["expression"].as_str())
        .find(|e| e.starts_with("request.userInfo.username in ["))
        .unwrap_or_else(|| panic!("policy without a username condition: {policy}"));
    expression
        .split('\'')
        .skip(1)
        .step_by(2)
        .map(String::from)
        .collect()
}

#[test]
fn the_admission_policies_hold_the_operators_service_accounts_and_no_one_else() {
    let docs = render(&[]);
    let of_kind = |kind: &str| -> Vec<&serde_json::Value> {
        docs.iter().filter(|d| d["kind"] == kind).collect()
    };
    let policies = of_kind("ValidatingAdmissionPolicy");
    let names: BTreeSet<&str> = policies
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect();
    assert_eq!(
        names,
        BTreeSet::from(["fabric-operator-nodes", "fabric-operator-workloads"])
    );
    let users: BTreeSet<String> = [
        format!("system:serviceaccount:{NS}:{RELEASE}-operator"),
        format!("system:serviceaccount:{NS}:{RELEASE}-operator-uninstall"),
    ]
    .into();
    for p in &policies {
        assert_eq!(policy_users(p), users, "{}", p["metadata"]["name"]);
        assert_eq!(
            p["spec"]["failurePolicy"], "Fail",
            "a policy that cannot be evaluated refuses"
        );
    }
    // Each policy is bound, and denies (not only warns or audits).
    let bound: BTreeSet<&str> = of_kind("ValidatingAdmissionPolicyBinding")
        .iter()
        .inspect(|b| {
            assert_eq!(b["spec"]["validationActions"], serde_json::json!(["Deny"]));
        })
        .filter_map(|b| b["spec"]["policyName"].as_str())
        .collect();
    assert_eq!(bound, names);
    // Without the uninstall hook its ServiceAccount does not exist, and is not named.
    let without_hook = render(&["uninstall.releaseNodes=false"]);
    for p in without_hook
        .iter()
        .filter(|d| d["kind"] == "ValidatingAdmissionPolicy")
    {
        assert_eq!(
            policy_users(p),
            BTreeSet::from([format!("system:serviceaccount:{NS}:{RELEASE}-operator")])
        );
    }
}
