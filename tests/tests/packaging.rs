//! The chart as a platform team uses it, checked with the real tools: `helm lint` and
//! `helm template` against values.schema.json, deploy/operator.yaml generated from it,
//! `promtool test rules` on the alerts; then `helm install` and `helm upgrade` into a real
//! kube-apiserver (RBAC on), the operator run with nothing but the chart's ServiceAccount
//! (its own token) through a quarantine end to end, and a real Prometheus scraping it that
//! answers every query of the shipped Grafana dashboard.
//!
//! Needs helm, prometheus and promtool: `tests/tools/build.sh` (cached; or point
//! GPUFABRIC_TOOLS_BIN at a directory holding them), and the binaries: `cargo build --bins`.

use gpufabric_api::FabricTest;
use gpufabric_measure::fleet::{Fault, Fleet};
use gpufabric_tests::cluster::{Cluster, ClusterOptions};
use gpufabric_tests::fleet::{H100, SimFleet};
use gpufabric_tests::kubelet::{Kubelet, KubeletOptions};
use gpufabric_tests::operator::{OperatorProcess, sim_agent};
use gpufabric_tests::tools::{self, bin_dir as tools_bin, can, chart, helm, run_ok};
use gpufabric_tests::{wait, workspace_root};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, Role, RoleBinding};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const NS: &str = "gpufabric-system";
/// The ServiceAccount Prometheus scrapes as, bound to the chart's metrics-reader role.
const SCRAPER: &str = "prometheus";
/// A ServiceAccount bound to nothing.
const STRANGER: &str = "stranger";
const RELEASE: &str = "fabric";
/// `<release>-operator`: the ServiceAccount, Deployment, roles and Lease of the release.
const NAME: &str = "fabric-operator";

#[test]
fn the_chart_lints_and_its_schema_refuses_bad_values() {
    run_ok(helm(None).args(["lint", "--strict"]).arg(chart()));
    let rendered = run_ok(
        helm(None)
            .args(["template", "t"])
            .arg(chart())
            .args(["-n", NS]),
    );
    let text = String::from_utf8_lossy(&rendered.stdout);
    for kind in [
        "kind: Deployment",
        "kind: PodDisruptionBudget",
        "kind: Role\n",
        "kind: ClusterRole\n",
        "grafana_dashboard: \"1\"",
        "seccompProfile: {type: RuntimeDefault}",
    ] {
        assert!(text.contains(kind), "rendered chart lacks {kind:?}");
    }
    assert!(
        !text.contains("kind: ServiceMonitor"),
        "ServiceMonitor is opt-in"
    );
    let all = run_ok(
        helm(None)
            .args(["template", "t"])
            .arg(chart())
            .args(["--set", "metrics.serviceMonitor.enabled=true"])
            .args(["--set", "metrics.prometheusRule.enabled=true"]),
    );
    let text = String::from_utf8_lossy(&all.stdout);
    assert!(text.contains("kind: ServiceMonitor") && text.contains("kind: PrometheusRule"));
    assert!(text.contains("alert: GPUFabricNodeQuarantined"), "{text}");

    for (value, why) in [
        ("replicas=-1", "minimum"),
        ("logFormat=xml", "logFormat"),
        ("testSelector=1", "testSelector"),
        // Removed with the cluster-scoped FabricTest: refused, not silently ignored.
        ("watchNamespace=gpu", "additional properties"),
        ("metrics.port=70000", "maximum"),
        ("maxQuarantinedNodes=lots", "maxQuarantinedNodes"),
        ("typo=1", "additional properties"),
    ] {
        let out = helm(None)
            .args(["template", "t"])
            .arg(chart())
            .args(["--set", value])
            .output()
            .expect("helm runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "--set {value} was accepted");
        assert!(err.contains(why), "--set {value}: {err}");
    }
}

/// What a parent chart (an umbrella chart, a platform's chart of charts) gives its
/// dependencies: `global` passes the schema and `helm lint`; the chart's own hygiene renders:
/// images by digest, the operator's NetworkPolicy, the benchmark-pod defaults as the
/// operator's flags, and a cluster older than `kubeVersion` refused.
#[test]
fn a_parent_chart_sets_global_and_the_chart_renders_digests_network_policy_and_pod_defaults() {
    let dir = tempfile::tempdir().expect("temp dir");
    let parent = dir.path().join("platform");
    let charts = parent.join("charts");
    std::fs::create_dir_all(&charts).expect("parent chart dir");
    run_ok(
        Command::new("cp")
            .arg("-r")
            .arg(chart())
            .arg(charts.join("gpufabric")),
    );
    std::fs::write(
        parent.join("Chart.yaml"),
        format!(
            "apiVersion: v2\nname: platform\nversion: 1.0.0\ndependencies:\n  - name: gpufabric\n    version: {}\n",
            env!("CARGO_PKG_VERSION")
        ),
    )
    .expect("parent Chart.yaml");
    std::fs::write(
        parent.join("values.yaml"),
        "global:\n  imageRegistry: registry.example.com\n  imagePullSecrets: [regcred]\ngpufabric:\n  replicas: 1\n",
    )
    .expect("parent values.yaml");
    run_ok(helm(None).args(["lint", "--strict"]).arg(&parent));
    let text = String::from_utf8_lossy(
        &run_ok(
            helm(None)
                .args(["template", "p"])
                .arg(&parent)
                .args(["-n", NS]),
        )
        .stdout,
    )
    .into_owned();
    assert!(text.contains("kind: Deployment"), "{text}");

    let digest = format!("sha256:{}", "ab".repeat(32));
    let rendered = run_ok(
        helm(None)
            .args(["template", "t"])
            .arg(chart())
            .args(["-n", NS])
            .args(["--set", &format!("image.digest={digest}")])
            .args(["--set", &format!("agentImage.digest={digest}")])
            .args(["--set", "benchmarkPods.priorityClassName=gpu-tests"])
            .args(["--set", "benchmarkPods.runtimeClassName=nvidia"])
            .args(["--set", "benchmarkPods.imagePullSecrets[0].name=regcred"])
            .args(["--set", "networkPolicy.apiServerPorts={6443}"]),
    );
    let text = String::from_utf8_lossy(&rendered.stdout);
    for want in [
        format!("image: \"ghcr.io/gpufabric/fabric-operator@{digest}\""),
        format!("--agent-image=ghcr.io/gpufabric/fabric-agent@{digest}"),
        "--agent-priority-class=gpu-tests".into(),
        "--agent-runtime-class=nvidia".into(),
        "--agent-image-pull-secret=regcred".into(),
        "kind: NetworkPolicy".into(),
        "policyTypes: [Ingress, Egress]".into(),
        "- {protocol: TCP, port: 6443}".into(),
        "- {protocol: TCP, port: 9443}".into(),
        "- {protocol: UDP, port: 53}".into(),
    ] {
        assert!(text.contains(&want), "rendered chart lacks {want:?}");
    }
    let plain = String::from_utf8_lossy(
        &run_ok(
            helm(None)
                .args(["template", "t"])
                .arg(chart())
                .args(["-n", NS]),
        )
        .stdout,
    )
    .into_owned();
    assert!(
        !plain.contains("--agent-priority-class") && !plain.contains("--agent-image-pull-secret"),
        "no defaults unless set: a FabricTest's spec.agent is all there is"
    );
    assert!(plain.contains(&format!(
        "ghcr.io/gpufabric/fabric-operator:v{}",
        env!("CARGO_PKG_VERSION")
    )));

    for (args, why) in [
        (&["--set", "image.digest=latest"][..], "/image/digest"),
        (&["--set", "networkPolicy.apiServerPorts={0}"], "minimum"),
        (&["--kube-version", "1.29.0"], "kubeVersion"),
    ] {
        let out = helm(None)
            .args(["template", "t"])
            .arg(chart())
            .args(args)
            .output()
            .expect("helm runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(err.contains(why), "{args:?}: {err}");
    }
}

/// Every alert links its runbook, and the page is there.
#[test]
fn every_alert_links_a_runbook_that_exists() {
    let rules: serde_json::Value = serde_yaml::from_str(
        &std::fs::read_to_string(chart().join("files/alerts.yaml")).expect("alerts file"),
    )
    .expect("the alerts are YAML");
    let alerts: Vec<&serde_json::Value> = rules["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().into_iter().flatten())
        .filter(|r| r["alert"].is_string())
        .collect();
    assert!(alerts.len() >= 8, "{} alerts", alerts.len());
    let base = "https://github.com/gpufabric/gpufabric/blob/main/";
    for a in alerts {
        let name = a["alert"].as_str().unwrap_or_default();
        let url = a["annotations"]["runbook_url"]
            .as_str()
            .unwrap_or_else(|| panic!("{name} has no runbook_url"));
        let path = url
            .strip_prefix(base)
            .unwrap_or_else(|| panic!("{name}: {url} is not under {base}"));
        assert_eq!(path, format!("docs/runbooks/{name}.md"), "{name}");
        let page = std::fs::read_to_string(workspace_root().join(path))
            .unwrap_or_else(|e| panic!("{name}: {path}: {e}"));
        assert!(page.starts_with(&format!("# {name}\n")), "{path}");
        for part in ["**What it means.**", "**Check.**", "**Act.**"] {
            assert!(page.contains(part), "{path} lacks {part}");
        }
    }
}

/// The dashboard's variables: test, node and GPU, each from a series the operator exports.
fn dashboard_variables(dashboard: &serde_json::Value) -> Vec<(String, String)> {
    dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["type"] == "query")
        .map(|v| {
            (
                v["name"].as_str().unwrap_or_default().to_string(),
                v["definition"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// A dashboard query as Grafana sends it with every variable at "All".
fn with_all_selected(expr: &str) -> String {
    ["$test", "$node", "$gpu"]
        .iter()
        .fold(expr.to_string(), |e, v| e.replace(v, ".*"))
}

/// `label_values(SELECTOR, LABEL)`, Grafana's variable query, as the PromQL that answers it.
fn label_values_promql(definition: &str) -> String {
    let inner = definition
        .strip_prefix("label_values(")
        .and_then(|d| d.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{definition} is not label_values(...)"));
    let (selector, label) = inner
        .rsplit_once(',')
        .unwrap_or_else(|| panic!("{definition} names no label"));
    format!(
        "count by ({}) ({})",
        label.trim(),
        with_all_selected(selector.trim())
    )
}

#[test]
fn the_dashboard_filters_by_test_node_and_gpu() {
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(chart().join("files/dashboard.json")).expect("dashboard file"),
    )
    .expect("the dashboard is JSON");
    let vars = dashboard_variables(&dashboard);
    let names: Vec<&str> = vars.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["test", "node", "gpu"]);
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(String::from))
        .collect();
    // Every query of a per-test series follows the test variable; per node, the node's.
    for e in &exprs {
        if e.contains("gpufabric_node_") || e.contains("gpufabric_test_") {
            assert!(e.contains(r#"test=~"$test""#), "{e} ignores $test");
        }
        if e.contains("gpufabric_node_") && !e.contains("quantile by") {
            assert!(e.contains(r#"node=~"$node""#), "{e} ignores $node");
        }
        if e.contains("gpufabric_gpu_") {
            assert!(e.contains(r#"gpu=~"$gpu""#), "{e} ignores $gpu");
        }
    }
    assert_eq!(
        label_values_promql(r#"label_values(m{test=~"$test"}, node)"#),
        r#"count by (node) (m{test=~".*"})"#
    );
}

/// Chart and code are released together: the chart's version and appVersion are the
/// workspace version, its default images are the ones the operator names, and CHANGELOG.md
/// says what the version changed.
#[test]
fn the_chart_is_versioned_with_the_code() {
    let version = env!("CARGO_PKG_VERSION");
    let chart_yaml: serde_json::Value = serde_yaml::from_str(
        &std::fs::read_to_string(chart().join("Chart.yaml")).expect("Chart.yaml read"),
    )
    .expect("Chart.yaml is YAML");
    for key in ["version", "appVersion"] {
        assert_eq!(
            chart_yaml[key].as_str(),
            Some(version),
            "charts/gpufabric/Chart.yaml {key} is the workspace version (Cargo.toml)"
        );
    }
    assert_eq!(
        gpufabric_api::test::DEFAULT_AGENT_IMAGE,
        format!("ghcr.io/gpufabric/fabric-agent:v{version}"),
        "the operator's default agent image is the chart's"
    );
    let changelog =
        std::fs::read_to_string(workspace_root().join("CHANGELOG.md")).expect("CHANGELOG.md");
    assert!(
        changelog
            .lines()
            .any(|l| l.starts_with(&format!("## {version}"))),
        "CHANGELOG.md has a section \"## {version}\""
    );
}

/// What `helm template` renders with no cluster to look in, as Argo CD renders a chart: with
/// cert-manager the same manifests every time; without it a new webhook CA, certificate and
/// key every time (docs/fabrictest.md, "Certificates", says to use cert-manager under GitOps), and
/// nothing else that changes.
#[test]
fn a_render_without_a_cluster_is_stable_with_cert_manager() {
    let render = |values: &[&str]| {
        let mut cmd = helm(None);
        cmd.args(["template", RELEASE])
            .arg(chart())
            .args(["-n", NS]);
        for v in values {
            cmd.args(["--set", v]);
        }
        String::from_utf8_lossy(&run_ok(&mut cmd).stdout).into_owned()
    };
    let cert_manager = ["webhook.certManager.enabled=true"];
    assert_eq!(
        render(&cert_manager),
        render(&cert_manager),
        "two renders with cert-manager differ"
    );
    let (a, b) = (render(&[]), render(&[]));
    assert_ne!(
        a, b,
        "without a cluster, helm generates a new CA on each render"
    );
    let without_keys = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| {
                !["ca.crt:", "tls.crt:", "tls.key:", "caBundle:"]
                    .iter()
                    .any(|k| l.trim_start().starts_with(k))
            })
            .map(String::from)
            .collect()
    };
    assert_eq!(
        without_keys(&a),
        without_keys(&b),
        "only the webhook's key material differs between renders"
    );
}

#[test]
fn deploy_manifests_are_generated_from_the_chart() {
    let helm_bin = tools_bin().join("helm");
    let out = Command::new("bash")
        .arg(workspace_root().join("deploy/generate.sh"))
        .arg("--check")
        .env("HELM", helm_bin)
        .output()
        .expect("deploy/generate.sh runs");
    assert!(
        out.status.success(),
        "deploy/operator.yaml differs from the chart; run deploy/generate.sh\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn promtool_passes_the_alert_rule_tests() {
    let promtool = tools_bin().join("promtool");
    run_ok(
        Command::new(&promtool)
            .arg("check")
            .arg("rules")
            .arg(chart().join("files/alerts.yaml")),
    );
    for tests in ["alerts_test.yaml", "trend_test.yaml"] {
        let out = run_ok(
            Command::new(&promtool)
                .args(["test", "rules"])
                .arg(workspace_root().join("tests/tools/prometheus").join(tests)),
        );
        assert!(
            String::from_utf8_lossy(&out.stdout).contains("SUCCESS"),
            "{tests}"
        );
    }
}

/// A token of the chart's ServiceAccount, in a kubeconfig of its own.
async fn service_account_kubeconfig(cluster: &Cluster, dir: &Path) -> PathBuf {
    let path = dir.join("sa.kubeconfig");
    tools::service_account_kubeconfig(cluster, NS, NAME, &path).await;
    path
}

/// What the chart grants, and no more: FabricTests and their runs cluster-wide (they are
/// cluster-scoped), pods written in its namespace only (pods read cluster-wide, to see which
/// GPUs other pods hold), its Lease only.
async fn check_least_privilege(kubeconfig: &Path) {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("sa kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .expect("sa config");
    let sa = Client::try_from(config).expect("sa client");
    let granted = [
        ("create", "pods", Some(NS), None),
        ("watch", "gpufabric.io/fabrictests", None, None),
        ("patch", "gpufabric.io/fabrictestruns/status", None, None),
        ("update", "gpufabric.io/fabrictests/finalizers", None, None),
        ("patch", "nodes", None, None),
        // Read-only, to skip nodes whose GPUs other pods hold.
        ("list", "pods", None, None),
        // ... or other pods' DRA claims hold.
        ("list", "resource.k8s.io/resourceclaims", None, None),
        // A benchmark pod's own claim template, on a node whose GPUs are DRA devices.
        (
            "create",
            "resource.k8s.io/resourceclaimtemplates",
            Some(NS),
            None,
        ),
        ("update", "coordination.k8s.io/leases", Some(NS), Some(NAME)),
        ("create", "events.k8s.io/events", Some("default"), None),
        // The run's rendezvous Secret, created and never read back.
        ("create", "secrets", Some(NS), None),
        // Who scrapes /metrics, and whether they may.
        ("create", "authentication.k8s.io/tokenreviews", None, None),
        (
            "create",
            "authorization.k8s.io/subjectaccessreviews",
            None,
            None,
        ),
    ];
    for (verb, res, ns, name) in granted {
        assert!(
            can(&sa, verb, res, ns, name).await,
            "{verb} {res} in {ns:?} {name:?} is granted"
        );
    }
    let refused = [
        // FabricTests are people's to create and delete (and the uninstall hook's).
        ("create", "gpufabric.io/fabrictests", None, None),
        ("delete", "gpufabric.io/fabrictests", None, None),
        ("update", "gpufabric.io/fabrictestrunshards", None, None),
        ("create", "pods", Some("default"), None),
        ("delete", "pods", Some("default"), None),
        // Claims are made by Kubernetes from the pod's template, never by the operator.
        ("create", "resource.k8s.io/resourceclaims", Some(NS), None),
        (
            "create",
            "resource.k8s.io/resourceclaimtemplates",
            Some("default"),
            None,
        ),
        ("get", "pods", Some("default"), None),
        ("list", "secrets", Some(NS), None),
        ("get", "secrets", Some(NS), None),
        ("list", "secrets", None, None),
        ("create", "secrets", Some("default"), None),
        (
            "create",
            "coordination.k8s.io/leases",
            Some("default"),
            None,
        ),
        (
            "update",
            "coordination.k8s.io/leases",
            Some(NS),
            Some("someone-elses-lease"),
        ),
        (
            "update",
            "coordination.k8s.io/leases",
            Some("kube-system"),
            Some(NAME),
        ),
        ("delete", "nodes", None, None),
        (
            "create",
            "rbac.authorization.k8s.io/rolebindings",
            Some(NS),
            None,
        ),
    ];
    for (verb, res, ns, name) in refused {
        assert!(
            !can(&sa, verb, res, ns, name).await,
            "{verb} {res} in {ns:?} {name:?} is refused"
        );
    }
}

/// The Deployment's pod is admitted by a namespace that enforces Pod Security "restricted",
/// and one without the chart's security context is not.
async fn check_pod_security(cluster: &Cluster, deployment: &Deployment) {
    let ns = "restricted";
    let nss: Api<Namespace> = Api::all(cluster.client());
    let obj = Namespace {
        metadata: ObjectMeta {
            name: Some(ns.into()),
            labels: Some(
                [(
                    "pod-security.kubernetes.io/enforce".to_string(),
                    "restricted".to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        ..Default::default()
    };
    nss.create(&PostParams::default(), &obj)
        .await
        .expect("namespace");
    cluster
        .create_namespace(ns)
        .await
        .expect("default ServiceAccount");
    let template = deployment.spec.as_ref().expect("spec").template.clone();
    let mut pod = Pod {
        metadata: ObjectMeta {
            name: Some("operator".into()),
            labels: template.metadata.as_ref().and_then(|m| m.labels.clone()),
            ..Default::default()
        },
        spec: template.spec.clone(),
        ..Default::default()
    };
    if let Some(spec) = pod.spec.as_mut() {
        // The ServiceAccount lives in the release namespace; this pod is only admitted.
        spec.service_account_name = None;
        spec.service_account = None;
    }
    let pods: Api<Pod> = Api::namespaced(cluster.client(), ns);
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    if let Err(e) = pods.create(&dry, &pod).await {
        panic!("Pod Security restricted refused the chart's pod: {e}");
    }
    if let Some(spec) = pod.spec.as_mut() {
        spec.security_context = None;
        for c in &mut spec.containers {
            c.security_context = None;
        }
    }
    let refused = pods.create(&dry, &pod).await;
    assert!(
        refused.is_err(),
        "a pod without the security context is refused (control)"
    );
}

/// `helm install`, the objects it made, then `helm upgrade` and what it changed.
async fn install_and_upgrade(cluster: &Cluster) -> Deployment {
    let chart = chart();
    run_ok(
        helm(Some(cluster))
            .args(["install", RELEASE])
            .arg(&chart)
            .args(["--namespace", NS, "--set", "image.tag=test"])
            // No pod serves the webhook here (no kubelet runs the Deployment): let the API
            // server admit FabricTests unchecked rather than refuse them.
            .args(["--set", "webhook.failurePolicy=Ignore"]),
    );
    let c = cluster.client();
    Api::<ServiceAccount>::namespaced(c.clone(), NS)
        .get(NAME)
        .await
        .expect("ServiceAccount");
    Api::<ClusterRole>::all(c.clone())
        .get(NAME)
        .await
        .expect("ClusterRole");
    for role in [format!("{NAME}-workloads"), format!("{NAME}-leader")] {
        Api::<Role>::namespaced(c.clone(), NS)
            .get(&role)
            .await
            .expect("Role");
        Api::<RoleBinding>::namespaced(c.clone(), NS)
            .get(&role)
            .await
            .expect("RoleBinding");
    }
    Api::<Service>::namespaced(c.clone(), NS)
        .get(&format!("{NAME}-metrics"))
        .await
        .expect("metrics Service");
    Api::<PodDisruptionBudget>::namespaced(c.clone(), NS)
        .get(NAME)
        .await
        .expect("PDB");
    let dashboard = Api::<ConfigMap>::namespaced(c.clone(), NS)
        .get(&format!("{NAME}-dashboard"))
        .await
        .expect("dashboard ConfigMap");
    assert_eq!(
        dashboard
            .labels()
            .get("grafana_dashboard")
            .map(String::as_str),
        Some("1")
    );
    let deployments: Api<Deployment> = Api::namespaced(c.clone(), NS);
    let before = deployments.get(NAME).await.expect("Deployment");
    assert_eq!(before.spec.as_ref().and_then(|s| s.replicas), Some(2));

    run_ok(
        helm(Some(cluster))
            .args(["upgrade", RELEASE])
            .arg(&chart)
            .args(["--namespace", NS, "--set", "image.tag=test"])
            .args(["--set", "webhook.failurePolicy=Ignore"])
            .args(["--set", "logFormat=json", "--set", "replicas=3"])
            // Prometheus's ServiceAccount may read /metrics.
            .arg("--set-json")
            .arg(format!(
                r#"metrics.readers=[{{"kind":"ServiceAccount","name":"{SCRAPER}","namespace":"{NS}"}}]"#
            ))
            .args(["--set", "priorityClassName=system-cluster-critical"]),
    );
    let after = deployments.get(NAME).await.expect("Deployment");
    let spec = after.spec.as_ref().expect("spec");
    assert_eq!(spec.replicas, Some(3), "the upgrade changed the replicas");
    let pod = spec.template.spec.as_ref().expect("pod spec");
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-cluster-critical")
    );
    let args = pod.containers[0].args.clone().unwrap_or_default();
    assert!(args.iter().any(|a| a == "--log-json"), "{args:?}");
    let status = run_ok(helm(Some(cluster)).args(["status", RELEASE, "-n", NS, "-o", "json"]));
    let status: serde_json::Value =
        serde_json::from_slice(&status.stdout).expect("helm status json");
    assert_eq!(status["version"], 2, "revision 2 after the upgrade");
    assert_eq!(status["info"]["status"], "deployed");
    after
}

/// Four nodes, the second with a straggler GPU: a Cordon test quarantines it.
fn fleet() -> Fleet {
    let mut f = SimFleet::uniform("gpu", 4, H100, 8);
    f.nodes[1].faults.push(Fault::Straggler {
        gpu: 1,
        factor: 1.5,
    });
    f
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_installs_and_upgrades_and_the_chart_rbac_runs_a_quarantine_scraped_by_prometheus() {
    gpufabric_tests::init_tracing();
    // Helm installs the CRDs from the chart's crds/, as it would in a cluster.
    let cluster = Cluster::start_with(ClusterOptions {
        install_crds: false,
        ..Default::default()
    })
    .await
    .expect("local control plane starts");
    cluster.create_namespace(NS).await.expect("namespace");
    cluster
        .enforce_pod_security(NS, "restricted")
        .await
        .expect("Pod Security");
    let deployment = install_and_upgrade(&cluster).await;
    check_pod_security(&cluster, &deployment).await;

    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = service_account_kubeconfig(&cluster, dir.path()).await;
    check_least_privilege(&kubeconfig).await;

    let fleet = SimFleet::write_to(fleet(), dir.path().join("fleet.yaml")).expect("fleet file");
    let opts = KubeletOptions {
        root_dir: Some(dir.path().join("kubelet")),
        ..Default::default()
    };
    let _kubelet = Kubelet::start(cluster.client(), &fleet, opts)
        .await
        .expect("kubelet starts");

    // The operator with the Deployment's own arguments (but its admin address and the
    // webhook), as the chart's ServiceAccount.
    let pod = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.clone())
        .expect("pod spec");
    let chart_args: Vec<String> = pod.containers[0]
        .args
        .clone()
        .unwrap_or_default()
        .into_iter()
        // The webhook serves from the Secret the pod mounts; tests/tests/admission.rs runs it.
        .filter(|a| a != "run" && !a.starts_with("--admin-addr") && !a.starts_with("--webhook-"))
        .collect();
    let args: Vec<&str> = chart_args.iter().map(String::as_str).collect();
    let operator = OperatorProcess::start_as(
        kubeconfig,
        dir.path().join("operator.log"),
        &args,
        &[("POD_NAME", "fabric-operator-0"), ("POD_NAMESPACE", NS)],
    );
    quarantine_end_to_end(&cluster, &operator).await;
    let log = std::fs::read_to_string(dir.path().join("operator.log")).unwrap_or_default();
    assert!(
        !log.to_lowercase().contains("forbidden") && !log.contains("ValidatingAdmissionPolicy"),
        "the operator was refused something under the chart's RBAC or admission policies:\n{}",
        operator.log_tail(80)
    );
    let scraper_token = metrics_readers_need_a_token_the_chart_admits(&cluster, &operator).await;
    prometheus_scrapes_the_operator(&operator, dir.path(), &scraper_token).await;
}

/// `GET /metrics` on the operator's admin port with `token` as bearer: the status code.
async fn metrics_status(operator: &OperatorProcess, token: Option<&str>) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(operator.admin_addr())
        .await
        .expect("the admin port answers");
    let auth = token.map_or_else(String::new, |t| format!("Authorization: Bearer {t}\r\n"));
    let req = format!("GET /metrics HTTP/1.0\r\nHost: x\r\n{auth}\r\n");
    s.write_all(req.as_bytes()).await.expect("request");
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.expect("response");
    let text = String::from_utf8_lossy(&buf);
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"))
}

/// The chart's operator serves /metrics only to a token the API server accepts, of an
/// identity bound to the chart's metrics-reader role; /ready stays open to the kubelet.
/// Returns the token of the bound scraper.
async fn metrics_readers_need_a_token_the_chart_admits(
    cluster: &Cluster,
    operator: &OperatorProcess,
) -> String {
    let sas: Api<ServiceAccount> = Api::namespaced(cluster.client(), NS);
    for name in [SCRAPER, STRANGER] {
        let sa = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        sas.create(&PostParams::default(), &sa)
            .await
            .expect("ServiceAccount");
    }
    let scraper = tools::service_account_token(cluster, NS, SCRAPER).await;
    let stranger = tools::service_account_token(cluster, NS, STRANGER).await;
    assert_eq!(metrics_status(operator, None).await, 401, "no token");
    assert_eq!(
        metrics_status(operator, Some("not-a-token")).await,
        401,
        "a token the API server does not know"
    );
    assert_eq!(
        metrics_status(operator, Some(&stranger)).await,
        403,
        "a ServiceAccount without the metrics-reader role"
    );
    assert_eq!(
        metrics_status(operator, Some(&scraper)).await,
        200,
        "the ServiceAccount bound through metrics.readers"
    );
    let ready = operator.get("/ready").await.map(|(code, _)| code);
    assert_eq!(ready, Some(200), "/ready needs no token");
    scraper
}

async fn quarantine_end_to_end(cluster: &Cluster, operator: &OperatorProcess) {
    let tests: Api<FabricTest> = Api::all(cluster.client());
    let t: FabricTest = serde_json::from_value(json!({
        "apiVersion": "gpufabric.io/v1alpha1",
        "kind": "FabricTest",
        "metadata": {"name": "fleet"},
        "spec": {
            "nodeSelector": {"pool": "training"},
            "quarantine": {"mode": "Cordon", "maxQuarantined": 1, "confirmRetest": false},
            "agent": sim_agent(60)
        }
    }))
    .expect("FabricTest");
    tests
        .create(&PostParams::default(), &t)
        .await
        .expect("FabricTest created");
    let r = wait::for_object(&tests, "fleet", Duration::from_secs(180), |t| {
        t.and_then(|t| t.status.as_ref())
            .is_some_and(|s| s.quarantined_nodes == ["gpu-02"] && s.active_run.is_none())
    })
    .await;
    if let Err(e) = r {
        panic!("gpu-02 was not quarantined: {e}\n{}", operator.log_tail(80));
    }
    let node = Api::<Node>::all(cluster.client())
        .get("gpu-02")
        .await
        .expect("node");
    assert_eq!(
        node.spec.and_then(|s| s.unschedulable),
        Some(true),
        "gpu-02 cordoned"
    );
    // Run again so that the runs counter and the reconcile histogram have history.
    let patch =
        json!({"metadata": {"annotations": {gpufabric_api::keys::ANNOTATION_RUN_NOW: "again"}}});
    tests
        .patch("fleet", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("run now");
    let r = wait::for_object(&tests, "fleet", Duration::from_secs(180), |t| {
        t.and_then(|t| t.status.as_ref())
            .and_then(|s| s.last_run.as_ref())
            .is_some_and(|r| r.trigger == gpufabric_api::run::Trigger::Manual)
    })
    .await;
    if let Err(e) = r {
        panic!(
            "the second run did not finish: {e}\n{}",
            operator.log_tail(80)
        );
    }
}

/// A Prometheus process (killed on drop) with its own data dir.
struct Prometheus {
    child: Child,
    addr: String,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_prometheus(target: &str, dir: &Path, token: &str) -> Prometheus {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port");
    // The chart's rules, with the hourly group evaluated every second: a test of minutes
    // sees what an hour's evaluation records.
    let text = std::fs::read_to_string(chart().join("files/alerts.yaml")).expect("alerts file");
    let hourly = "    interval: 1h\n";
    assert!(text.contains(hourly), "the trend group's interval moved");
    let rules = dir.join("alerts.yaml");
    std::fs::write(&rules, text.replace(hourly, "    interval: 1s\n")).expect("rules file");
    // As the chart's ServiceMonitor: the scraper's own token as bearer.
    let token_path = dir.join("token");
    std::fs::write(&token_path, token).expect("token file");
    let config = format!(
        "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n\
         rule_files: [{rules:?}]\n\
         scrape_configs:\n  - job_name: fabric-operator\n    authorization: {{credentials_file: {token:?}}}\n    static_configs: [{{targets: [{target:?}]}}]\n",
        rules = rules.display().to_string(),
        token = token_path.display().to_string()
    );
    let config_path = dir.join("prometheus.yml");
    std::fs::write(&config_path, config).expect("prometheus.yml");
    let log = std::fs::File::create(dir.join("prometheus.log")).expect("prometheus log");
    let addr = format!("127.0.0.1:{port}");
    let mut cmd = Command::new(tools_bin().join("prometheus"));
    gpufabric_tests::process::harden(&mut cmd);
    let child = cmd
        .arg(format!("--config.file={}", config_path.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("tsdb").display()
        ))
        .arg(format!("--web.listen-address={addr}"))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("prometheus starts");
    Prometheus { child, addr }
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// `GET /api/v1/query`: the JSON answer, or None when Prometheus does not answer yet.
async fn query(addr: &str, promql: &str) -> Option<serde_json::Value> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
    let req = format!(
        "GET /api/v1/query?query={} HTTP/1.0\r\nHost: x\r\n\r\n",
        url_encode(promql)
    );
    s.write_all(req.as_bytes()).await.ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.ok()?;
    let text = String::from_utf8_lossy(&buf);
    let body = text.split_once("\r\n\r\n")?.1;
    serde_json::from_str(body).ok()
}

fn result_count(answer: &serde_json::Value) -> usize {
    answer["data"]["result"].as_array().map_or(0, Vec::len)
}

async fn prometheus_scrapes_the_operator(operator: &OperatorProcess, dir: &Path, token: &str) {
    let prom_dir = dir.join("prometheus");
    std::fs::create_dir_all(&prom_dir).expect("prometheus dir");
    let prom = start_prometheus(operator.admin_addr(), &prom_dir, token);
    let log = || gpufabric_tests::cluster::log_tail(&prom_dir.join("prometheus.log"), 30);
    let expected = [
        r#"up{job="fabric-operator"} == 1"#.to_string(),
        r#"gpufabric_node_last_result{test="fleet",node="gpu-02",result="fail"} == 1"#.to_string(),
        r#"gpufabric_node_last_result{test="fleet",node="gpu-01",result="pass"} == 1"#.to_string(),
        r#"gpufabric_node_quarantined{test="fleet",node="gpu-02"} == 1"#.to_string(),
        // The straggler is named down to its GPU, as dcgm-exporter names it.
        r#"gpufabric_gpu_findings{test="fleet",node="gpu-02",gpu="1",kind="Straggler"} >= 1"#
            .to_string(),
        // One failing node of four is no storm: the breaker is closed.
        r#"gpufabric_breaker_open{test="fleet"} == 0"#.to_string(),
        // Bandwidths in bytes per second: an H100's are well over 1 GB/s.
        r#"count(gpufabric_node_allreduce_busbw_bytes_per_second > 1e9) == 4"#.to_string(),
        r#"count(gpufabric_node_worst_pair_bandwidth_bytes_per_second > 1e9) == 4"#.to_string(),
        r#"gpufabric_test_runs_total{test="fleet",result="nodes_failed"} >= 2"#.to_string(),
        r#"gpufabric_test_last_run_timestamp_seconds > 0"#.to_string(),
        r#"gpufabric_test_last_success_timestamp_seconds > 0"#.to_string(),
        r#"gpufabric_build_info == 1"#.to_string(),
        r#"gpufabric_leader == 1"#.to_string(),
        r#"gpufabric:fleet_allreduce_busbw_bytes_per_second:median > 1e9"#.to_string(),
    ];
    for q in &expected {
        let r = wait::poll(
            q,
            Duration::from_secs(60),
            Duration::from_millis(500),
            || async { Ok(query(&prom.addr, q).await.filter(|a| result_count(a) > 0)) },
        )
        .await;
        if let Err(e) = r {
            panic!(
                "Prometheus has no {q}: {e}\n{}\nmetrics:\n{}",
                log(),
                operator.metrics().await
            );
        }
    }
    // The operator is scraped under the job the rules select: the expression of the alert
    // for an operator that is gone is empty.
    let rules: serde_json::Value = serde_yaml::from_str(
        &std::fs::read_to_string(chart().join("files/alerts.yaml")).expect("alerts file"),
    )
    .expect("the alerts are YAML");
    let down = rules["groups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
        .find(|r| r["alert"] == "GPUFabricOperatorDown")
        .and_then(|r| r["expr"].as_str().map(String::from))
        .expect("alerts.yaml has GPUFabricOperatorDown");
    let answer = query(&prom.addr, &down)
        .await
        .unwrap_or_else(|| panic!("no answer to {down}\n{}", log()));
    assert_eq!(
        (answer["status"].as_str(), result_count(&answer)),
        (Some("success"), 0),
        "{down} while the operator is scraped: {answer}"
    );
    // rate() and increase() need two samples in their window.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(chart().join("files/dashboard.json")).expect("dashboard file"),
    )
    .expect("the dashboard is JSON");
    let exprs: Vec<String> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(String::from))
        .collect();
    assert!(exprs.len() >= 10, "{} dashboard queries", exprs.len());
    // Each variable lists values, and each panel answers with all of them selected.
    let variables: Vec<String> = dashboard_variables(&dashboard)
        .iter()
        .map(|(_, d)| label_values_promql(d))
        .collect();
    let exprs: Vec<String> = exprs
        .iter()
        .map(|e| with_all_selected(e))
        .chain(variables)
        .collect();
    for q in &exprs {
        let answer = query(&prom.addr, q)
            .await
            .unwrap_or_else(|| panic!("no answer to {q}\n{}", log()));
        assert_eq!(
            answer["status"], "success",
            "dashboard query {q} does not parse: {answer}"
        );
        assert!(
            result_count(&answer) > 0,
            "dashboard query {q} returns no data: {answer}"
        );
    }
    eprintln!(
        "{} series checked, {} dashboard queries answered",
        expected.len(),
        exprs.len()
    );
}
