//! The admission webhook against a real kube-apiserver: registered as a
//! ValidatingWebhookConfiguration (URL form, a CA made here, failurePolicy Fail), it makes
//! `kubectl apply` refuse each FabricTest the operator could only fail on later, with the
//! reason, accept good ones, print its warnings, and refuse everything while it is down.

use gpufabric_operator::webhook::{CertFiles, Webhook, review::FABRICTEST_PATH};
use gpufabric_tests::cluster::Cluster;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::api::{Api, PostParams};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use serde_json::json;
use std::io::Write;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

const WEBHOOK: &str = "fabrictests.gpufabric.io";
const DENIED: &str = "admission webhook \"fabrictests.gpufabric.io\" denied the request";

/// A CA and a serving certificate for 127.0.0.1 signed by it, written to `dir`; returns
/// the CA's PEM (the caBundle) and the serving files.
fn certificates(dir: &Path) -> (String, CertFiles) {
    let ca_key = KeyPair::generate().expect("CA key");
    let mut ca = CertificateParams::default();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_pem = ca.self_signed(&ca_key).expect("CA certificate").pem();
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate().expect("serving key");
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .expect("serving params")
        .signed_by(&key, &issuer)
        .expect("serving certificate");
    let files = CertFiles {
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
    };
    std::fs::write(&files.cert, cert.pem()).expect("write tls.crt");
    std::fs::write(&files.key, key.serialize_pem()).expect("write tls.key");
    (ca_pem, files)
}

/// The configuration the chart installs, with a URL instead of a Service.
fn webhook_configuration(url: &str, ca_pem: &str) -> ValidatingWebhookConfiguration {
    let mut config: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "gpufabric"},
        "webhooks": [{
            "name": WEBHOOK,
            "clientConfig": {"url": url},
            "rules": [{
                "apiGroups": ["gpufabric.io"],
                "apiVersions": ["v1alpha1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["fabrictests"],
                "scope": "Cluster",
            }],
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 10,
        }],
    }))
    .expect("webhook configuration");
    for w in config.webhooks.iter_mut().flatten() {
        w.client_config.ca_bundle = Some(ByteString(ca_pem.as_bytes().to_vec()));
    }
    config
}

/// `kubectl <args>` with `stdin` (FabricTests are cluster-scoped: no namespace).
fn kubectl(cluster: &Cluster, args: &[&str], stdin: &str) -> Output {
    let mut child = cluster
        .kubectl()
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    if let Some(mut input) = child.stdin.take() {
        input.write_all(stdin.as_bytes()).expect("kubectl stdin");
    }
    child.wait_with_output().expect("kubectl finishes")
}

fn manifest(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: gpufabric.io/v1alpha1\nkind: FabricTest\nmetadata:\n  name: {name}\nspec:\n{spec}"
    )
}

/// `kubectl apply -f -` of a FabricTest; (succeeded, stdout, stderr).
fn apply(cluster: &Cluster, name: &str, spec: &str) -> (bool, String, String) {
    let out = kubectl(cluster, &["apply", "-f", "-"], &manifest(name, spec));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn refused(cluster: &Cluster, name: &str, spec: &str, expected: &[&str]) {
    let (ok, out, err) = apply(cluster, name, spec);
    assert!(!ok, "{name} was accepted: {out}{err}");
    for e in expected {
        assert!(err.contains(e), "{name}: {e:?} not in: {err}");
    }
}

/// Waits until the API server calls the webhook (it picks up a new configuration within
/// a second or so): a server-side dry run of a never-firing schedule is refused by it.
async fn until_the_webhook_answers(cluster: &Cluster) {
    let until = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let out = kubectl(
            cluster,
            &["apply", "--dry-run=server", "-f", "-"],
            &manifest("probe", "  schedule: \"0 0 31 2 *\"\n"),
        );
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        if err.contains(DENIED) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "the webhook never answered: {err}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

// kubectl runs blocking on a worker thread while others serve the webhook.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubectl_apply_is_refused_at_the_door_for_input_that_cannot_work() {
    gpufabric_tests::init_tracing();
    let cluster = Cluster::start().await.expect("local control plane starts");
    let dir = tempfile::tempdir().expect("temp dir");
    let (ca_pem, files) = certificates(dir.path());

    // Stored before the webhook exists: the schema lets a never-firing schedule through.
    let (ok, _, err) = apply(&cluster, "stored-before", "  schedule: \"0 0 30 2 *\"\n");
    assert!(ok, "{err}");

    let webhook = Webhook::bind("127.0.0.1:0".parse().expect("address"), files)
        .await
        .expect("webhook binds with the generated certificate");
    let url = format!("https://{}{FABRICTEST_PATH}", webhook.local_addr());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(webhook.serve(async {
        let _ = stopped.await;
    }));
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(cluster.client());
    configs
        .create(
            &PostParams::default(),
            &webhook_configuration(&url, &ca_pem),
        )
        .await
        .expect("webhook configuration created");
    until_the_webhook_answers(&cluster).await;

    refused(
        &cluster,
        "feb-31",
        "  schedule: \"0 0 31 2 *\"\n",
        &[
            DENIED,
            "schedule: schedule \"0 0 31 2 *\" never fires: none of its months has that day of the month",
        ],
    );
    refused(
        &cluster,
        "mars",
        "  schedule: \"0 2 * * *\"\n  timeZone: Mars/Olympus\n",
        &[
            DENIED,
            "timeZone: timeZone \"Mars/Olympus\" is not a known IANA time zone",
        ],
    );
    refused(
        &cluster,
        "bad-node-name",
        "  nodes: [gpu-01, GPU_02]\n",
        &[DENIED, "nodes: \"GPU_02\" is not a valid node name"],
    );
    refused(
        &cluster,
        "endless",
        "  suite:\n    ncclSweep:\n      minBytes: 1073741824\n      maxBytes: 8589934592\n      iters: 1000000\n  agent:\n    timeoutSeconds: 600\n",
        &[
            DENIED,
            "suite: cannot finish within agent.timeoutSeconds (600 s): even one GPU at rates no GPU reaches today needs at least",
        ],
    );
    // Selectors are the schema's to refuse: its CEL rule and pattern answer before any
    // webhook is called.
    refused(
        &cluster,
        "bad-selector-key",
        "  nodeSelector:\n    \"gpu type\": h100\n",
        &[
            "is invalid",
            "spec.nodeSelector",
            "nodeSelector keys must be label keys",
        ],
    );
    refused(
        &cluster,
        "bad-selector-value",
        "  nodeSelector:\n    pool: \"-training\"\n",
        &["is invalid", "spec.nodeSelector.pool", "should match"],
    );
    // CUDA graph launches: the schema bounds the count, and the webhook counts the timed
    // iterations they multiply (the same sweep at 20 iterations and no graphs fits).
    refused(
        &cluster,
        "graph-launches",
        "  suite:\n    ncclSweep:\n      graphLaunches: 1001\n",
        &[
            "is invalid",
            "spec.suite.ncclSweep.graphLaunches",
            "less than or equal to 1000",
        ],
    );
    refused(
        &cluster,
        "endless-graphs",
        "  suite:\n    ncclSweep:\n      minBytes: 1073741824\n      maxBytes: 8589934592\n      graphLaunches: 1000\n  agent:\n    timeoutSeconds: 60\n",
        &[
            DENIED,
            "suite: cannot finish within agent.timeoutSeconds (60 s)",
        ],
    );
    // A suite no GPU can hold is the test's fault: refused here, not run to fail every
    // node. A test naming no product is held against the largest known GPU; one whose
    // nodeSelector names a product, against that product.
    refused(
        &cluster,
        "terabyte-sweep",
        "  suite:\n    ncclSweep:\n      maxBytes: 1099511627776\n",
        &[
            DENIED,
            "suite.ncclSweep.maxBytes: needs 3.0 TiB on each GPU (3 x 1.0 TiB, the largest size the sweep runs",
            "more than any known GPU holds",
        ],
    );
    refused(
        &cluster,
        "h100-large-sweep",
        "  nodeSelector:\n    nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3\n  suite:\n    ncclSweep:\n      maxBytes: 34359738368\n",
        &[
            DENIED,
            "suite.ncclSweep.maxBytes: needs 96.0 GiB on each GPU",
            "the 79.6 GiB of one H100 80GB HBM3 GPU, the product nodeSelector selects",
        ],
    );
    // Every problem at once, in one refusal.
    refused(
        &cluster,
        "two-problems",
        "  schedule: \"0 0 31 4 *\"\n  timeZone: Europe/Atlantis\n",
        &[DENIED, "schedule:", "timeZone:"],
    );
    for name in [
        "feb-31",
        "mars",
        "bad-node-name",
        "endless",
        "graph-launches",
        "endless-graphs",
        "terabyte-sweep",
        "h100-large-sweep",
        "bad-selector-key",
        "bad-selector-value",
        "two-problems",
    ] {
        let out = kubectl(&cluster, &["get", "fabrictest", name], "");
        assert!(!out.status.success(), "{name} was stored");
    }

    // Good input is stored; a suite close to its timeout is stored with a warning.
    let (ok, out, err) = apply(
        &cluster,
        "nightly",
        "  schedule: \"0 2 * * *\"\n  timeZone: Europe/Berlin\n  nodeSelector:\n    pool: training\n",
    );
    assert!(ok, "{err}");
    assert!(
        out.contains("fabrictest.gpufabric.io/nightly created"),
        "{out}"
    );
    assert!(!err.contains("Warning"), "{err}");
    let (ok, _, err) = apply(
        &cluster,
        "big-sizes-no-graphs",
        "  suite:\n    ncclSweep:\n      minBytes: 1073741824\n      maxBytes: 8589934592\n  agent:\n    timeoutSeconds: 60\n",
    );
    assert!(ok, "the sweep of endless-graphs without graphs fits: {err}");
    let (ok, _, err) = apply(&cluster, "tight", "  agent:\n    timeoutSeconds: 20\n");
    assert!(ok, "{err}");
    eprintln!("kubectl apply of `tight` printed: {err}");
    assert!(
        err.contains("Warning: suite: estimated at")
            && err.contains("more than agent.timeoutSeconds (20 s)"),
        "{err}"
    );

    // A test stored before the webhook: metadata changes pass (so it can still be run,
    // relabelled and deleted), a spec change must fix the schedule.
    let out = kubectl(
        &cluster,
        &["annotate", "fabrictest", "stored-before", "team=fabric"],
        "",
    );
    assert!(out.status.success(), "{:?}", out);
    let out = kubectl(
        &cluster,
        &[
            "patch",
            "fabrictest",
            "stored-before",
            "--type=merge",
            "-p",
            r#"{"spec":{"suspend":true}}"#,
        ],
        "",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains(DENIED), "{err}");
    assert!(err.contains("never fires"), "{err}");

    // failurePolicy Fail: with the webhook down, nothing is admitted.
    let _ = stop.send(());
    server
        .await
        .expect("server task")
        .expect("webhook serves until stopped");
    let (ok, _, err) = apply(&cluster, "while-down", "  schedule: \"@daily\"\n");
    assert!(!ok, "admitted while the webhook was down");
    assert!(
        err.contains(&format!("failed calling webhook \"{WEBHOOK}\"")),
        "{err}"
    );
}
