//! `kubectl gpufabric` against the real control plane, the real `fabric-operator` binary,
//! the process-kubelet and the sim agents: what it shows of a test that quarantined a
//! faulty node, and the requests it makes (a targeted run, a repaired node) carried out by
//! the operator.
//!
//! Build the binaries first: `cargo build -p gpufabric-agent -p gpufabric-operator -p
//! gpufabric-kubectl`, then `cargo test -p gpufabric-tests --test kubectl_plugin`.

use gpufabric_api::keys::{ANNOTATION_REPAIRED, ANNOTATION_RUN_NODES};
use gpufabric_api::run::Trigger;
use gpufabric_api::{FabricTest, FabricTestStatus, Severity};
use gpufabric_measure::fleet::{Fault, Fleet};
use gpufabric_tests::fleet::{H100, SimFleet};
use gpufabric_tests::kubelet::default_agent_bin_dir;
use gpufabric_tests::operator::{OperatorEnv, sim_agent};
use gpufabric_tests::wait;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::Api;
use serde_json::json;
use std::time::Duration;

const TEST: &str = "kp";
const WAIT: Duration = Duration::from_secs(180);

/// Four H100 nodes; gpu-02 has a straggler GPU (the DDP probe finds it).
fn fleet() -> Fleet {
    let mut f = SimFleet::uniform("gpu", 4, H100, 8);
    f.nodes[1].faults.push(Fault::Straggler {
        gpu: 1,
        factor: 1.5,
    });
    f
}

/// What one `kubectl gpufabric` command printed and how it ended.
struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl std::fmt::Display for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Runs the built `kubectl-gpufabric` against the environment's control plane.
async fn plugin(env: &OperatorEnv, args: &[&str]) -> Out {
    let bin = default_agent_bin_dir().join("kubectl-gpufabric");
    assert!(
        bin.is_file(),
        "{} is missing: run `cargo build -p gpufabric-kubectl` first",
        bin.display()
    );
    let out = tokio::process::Command::new(&bin)
        .arg("--kubeconfig")
        .arg(env.cluster.kubeconfig_path())
        .args(args)
        .output()
        .await
        .expect("kubectl-gpufabric runs");
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Waits until the test's status satisfies `cond` with no run active.
async fn wait_status(
    env: &OperatorEnv,
    what: &str,
    cond: impl Fn(&FabricTestStatus) -> bool + Send + Sync,
) -> FabricTestStatus {
    let api = env.tests_api();
    let r = wait::for_object(&api, TEST, WAIT, |t: Option<&FabricTest>| {
        t.and_then(|t| t.status.as_ref())
            .is_some_and(|s| s.active_run.is_none() && cond(s))
    })
    .await;
    match r {
        Ok(Some(t)) => t.status.unwrap_or_default(),
        other => panic!(
            "{what}: {other:?}\noperator log:\n{}",
            env.operator.log_tail(120)
        ),
    }
}

fn holds(s: &FabricTestStatus, node: &str) -> bool {
    s.quarantined_nodes.iter().any(|n| n == node)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_shows_a_quarantined_node_and_asks_the_operator_to_run_and_release() {
    let env = OperatorEnv::shared(fleet(), TEST).await;
    let bad = env.node("gpu-02");
    let good = env.node("gpu-03");
    env.create_test(
        TEST,
        json!({
            "nodeSelector": env.node_selector(),
            "quarantine": {"mode": "Cordon", "maxQuarantined": 2, "confirmRetest": false,
                           "failuresToQuarantine": 1, "passesToRelease": 3},
            "agent": sim_agent(60)
        }),
    )
    .await;
    let s = wait_status(&env, "gpu-02 quarantined", |s| holds(s, &bad)).await;
    let first = s.last_run.expect("a run").name;

    // status: the test, its last run, the node it holds.
    let out = plugin(&env, &["status"]).await;
    assert_eq!(out.code, 0, "{out}");
    let row = out
        .stdout
        .lines()
        .find(|l| l.starts_with(&format!("{TEST} ")))
        .unwrap_or_else(|| panic!("no row of {TEST}: {out}"));
    assert!(row.contains(&first) && row.contains(&bad), "{row}");
    assert!(row.ends_with("closed"), "{row}");

    // status -o json parses, with the same facts.
    let out = plugin(&env, &["status", "-o", "json"]).await;
    assert_eq!(out.code, 0, "{out}");
    let json: serde_json::Value = serde_json::from_str(&out.stdout).expect("status -o json");
    let t = json["tests"]
        .as_array()
        .and_then(|a| a.iter().find(|t| t["name"] == TEST))
        .unwrap_or_else(|| panic!("{TEST} in {json}"));
    assert_eq!(t["quarantined"], json!([bad]), "{t}");
    assert_eq!(t["lastRun"]["name"], json!(first), "{t}");
    let out = plugin(&env, &["status", "-o", "yaml"]).await;
    assert_eq!(out.code, 0, "{out}");
    let yaml: serde_json::Value = serde_yaml::from_str(&out.stdout).expect("status -o yaml");
    assert_eq!(yaml["tests"], json["tests"]);

    // findings: the faulty node's critical finding, in each test's latest run and by name.
    let run = env.runs_api().get(&first).await.expect("run");
    let finding = run
        .status
        .as_ref()
        .and_then(|s| {
            s.findings
                .iter()
                .find(|f| f.severity == Severity::Critical && f.subject.node_name() == bad)
        })
        .cloned()
        .unwrap_or_else(|| panic!("a critical finding on {bad}: {:#?}", run.status));
    for args in [vec!["findings"], vec!["findings", first.as_str()]] {
        let out = plugin(&env, &args).await;
        assert_eq!(out.code, 0, "{out}");
        assert!(
            out.stdout
                .lines()
                .any(|l| l.starts_with(&format!("{first}  {bad}"))
                    && l.contains("Critical")
                    && l.contains(&finding.message)),
            "{out}"
        );
    }

    // node: the quarantine record, parsed, and why the test acts on it.
    let out = plugin(&env, &["node", &bad]).await;
    assert_eq!(out.code, 0, "{out}");
    assert!(
        out.stdout.contains(&format!(
            "quarantine record (gpufabric.io/quarantine): FabricTest {TEST}, run {first}"
        )),
        "{out}"
    );
    assert!(
        out.stdout
            .contains("released after 3 passing run(s) in a row, or one pass after a repair"),
        "{out}"
    );
    let out = plugin(&env, &["node", &bad, "-o", "json"]).await;
    let view: serde_json::Value = serde_json::from_str(&out.stdout).expect("node -o json");
    assert_eq!(view["quarantine"]["cordoned"], true, "{view}");

    // report: the demo's tables for the run.
    let out = plugin(&env, &["report", &first]).await;
    assert_eq!(out.code, 0, "{out}");
    assert!(out.stdout.contains("per-node results"), "{out}");
    assert!(
        out.stdout
            .contains(&format!("{TEST} holds 1 node(s) in quarantine: {bad}")),
        "{out}"
    );
    // report -o html: the same run as one page, to stdout or to a file; no other command
    // writes one.
    let out = plugin(&env, &["report", &first, "-o", "html"]).await;
    assert_eq!(out.code, 0, "{out}");
    assert!(out.stdout.starts_with("<!DOCTYPE html>"), "{out}");
    assert!(
        out.stdout
            .contains(&format!(r#"<article class="node-detail" id="node-{bad}""#)),
        "{out}"
    );
    let dir = tempfile::tempdir().expect("a temp dir");
    let file = dir.path().join("report.html");
    let path = file.to_string_lossy().into_owned();
    let out = plugin(&env, &["report", &first, "-o", &path]).await;
    assert_eq!(out.code, 0, "{out}");
    assert_eq!(out.stdout.trim(), format!("wrote {path}"), "{out}");
    let page = std::fs::read_to_string(&file).expect("the page");
    assert!(page.contains(r#"<section id="fleet">"#), "{page}");
    let out = plugin(&env, &["status", "-o", "html"]).await;
    assert_eq!(out.code, 2, "{out}");
    assert!(out.stderr.contains("for `report RUN` only"), "{out}");

    // Missing objects end with 3, malformed arguments with 2, and nothing is asked.
    for args in [
        vec!["node", "no-such-node"],
        vec!["findings", "no-such-run"],
        vec!["report", "no-such-run"],
        vec!["run", "no-such-test"],
        vec!["run", TEST, "--nodes", "no-such-node"],
    ] {
        let out = plugin(&env, &args).await;
        assert_eq!(out.code, 3, "{args:?}: {out}");
        assert!(out.stderr.contains("not found"), "{out}");
    }
    let out = plugin(&env, &["run", TEST, "--selector", "rack"]).await;
    assert_eq!(out.code, 2, "{out}");
    let out = plugin(&env, &["frobnicate"]).await;
    assert_eq!(out.code, 2, "{out}");

    // release refuses a node gpufabric holds nothing on, and leaves it as it is.
    let out = plugin(&env, &["release", &good]).await;
    assert_eq!(out.code, 4, "{out}");
    assert!(
        out.stderr
            .contains("carries no gpufabric quarantine record"),
        "{out}"
    );
    let nodes: Api<Node> = Api::all(env.cluster.client());
    let n = nodes.get(&good).await.expect("node");
    assert!(!n.annotations().contains_key(ANNOTATION_REPAIRED), "{n:?}");

    // run --nodes: the documented annotation, and the operator runs those nodes now.
    let out = plugin(&env, &["run", TEST, "--nodes", &good]).await;
    assert_eq!(out.code, 0, "{out}");
    assert!(
        out.stdout
            .contains(&format!("{ANNOTATION_RUN_NODES}={good}")),
        "{out}"
    );
    let s = wait_status(&env, "the targeted run of gpu-03 folded", |s| {
        s.last_run
            .as_ref()
            .is_some_and(|l| l.name != first && l.trigger == Trigger::Targeted)
    })
    .await;
    let targeted = env
        .runs_api()
        .get(&s.last_run.expect("a run").name)
        .await
        .expect("the targeted run");
    assert_eq!(
        targeted.spec.reasons.keys().collect::<Vec<_>>(),
        [&good],
        "{:?}",
        targeted.spec.reasons
    );
    let t = env.tests_api().get(TEST).await.expect("test");
    assert!(
        !t.annotations().contains_key(ANNOTATION_RUN_NODES),
        "consumed"
    );

    // release: the repaired annotation on the quarantined node; repaired in the fleet, one
    // passing run releases it.
    let mut repaired = env.fleet.fleet().clone();
    repaired.nodes[1].faults.clear();
    SimFleet::write_to(repaired, env.fleet.path()).expect("fleet rewritten");
    let out = plugin(&env, &["release", &bad, "--note", "INC-42 GPU 1 replaced"]).await;
    assert_eq!(out.code, 0, "{out}");
    assert!(
        out.stdout.contains(&format!(
            "annotated Node {bad}: {ANNOTATION_REPAIRED}=INC-42"
        )),
        "{out}"
    );
    let s = wait_status(&env, "gpu-02 released by its repair test", |s| {
        !holds(s, &bad)
    })
    .await;
    let last = env
        .runs_api()
        .get(&s.last_run.expect("a run").name)
        .await
        .expect("the repair run");
    assert_eq!(last.spec.trigger, Trigger::Targeted);
    assert!(
        last.spec
            .reasons
            .get(&bad)
            .is_some_and(|r| r.contains("INC-42")),
        "{:?}",
        last.spec.reasons
    );
}

/// Runs the built `kubectl-gpufabric` with `kubeconfig` (None: none anywhere).
async fn plugin_with(kubeconfig: Option<&std::path::Path>, home: &std::path::Path) -> Out {
    let bin = default_agent_bin_dir().join("kubectl-gpufabric");
    let mut cmd = tokio::process::Command::new(&bin);
    cmd.env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env_remove("KUBERNETES_SERVICE_PORT")
        .env("HOME", home);
    if let Some(k) = kubeconfig {
        cmd.arg("--kubeconfig").arg(k);
    }
    let out = cmd
        .arg("status")
        .output()
        .await
        .expect("kubectl-gpufabric runs");
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The one line the plugin wrote to stderr.
fn one_line(out: &Out) -> &str {
    assert_ne!(out.code, 0, "{out}");
    let lines: Vec<&str> = out.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {out}");
    lines[0]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_says_in_one_line_what_to_do_without_a_kubeconfig_a_cluster_or_rights() {
    let env = OperatorEnv::shared(fleet(), "kp-errors").await;
    let dir = tempfile::tempdir().expect("a temp dir");

    let none = plugin_with(None, dir.path()).await;
    let line = one_line(&none);
    assert!(
        line.starts_with("kubectl gpufabric: no usable kubeconfig") && line.contains("KUBECONFIG"),
        "{none}"
    );

    // The same cluster's kubeconfig, its server moved to a port where nothing listens.
    let text = std::fs::read_to_string(env.cluster.kubeconfig_path()).expect("kubeconfig");
    let mut kc: serde_yaml::Value = serde_yaml::from_str(&text).expect("yaml");
    kc["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:1".into();
    let unreachable = dir.path().join("unreachable");
    std::fs::write(&unreachable, serde_yaml::to_string(&kc).expect("yaml")).expect("written");
    let out = plugin_with(Some(&unreachable), dir.path()).await;
    let line = one_line(&out);
    assert!(
        line.contains("cannot reach the cluster's API server") && !line.contains("ServiceError"),
        "{out}"
    );

    // A user with no rights: the admin's credentials, impersonating nobody.
    let mut kc: serde_yaml::Value = serde_yaml::from_str(&text).expect("yaml");
    kc["users"][0]["user"]["as"] = "gpufabric-nobody".into();
    let forbidden = dir.path().join("forbidden");
    std::fs::write(&forbidden, serde_yaml::to_string(&kc).expect("yaml")).expect("written");
    let out = plugin_with(Some(&forbidden), dir.path()).await;
    let line = one_line(&out);
    assert!(
        line.contains("not allowed:") && line.contains("(403)") && line.contains("get and list"),
        "{out}"
    );
}
