//! The admission webhook as the chart installs it: the operator serves it (a serving
//! certificate for 127.0.0.1 signed by a CA made here), a ValidatingWebhookConfiguration
//! points the API server at it (a URL instead of a Service), and a FabricTest that cannot
//! work is refused at `kubectl apply`.

use crate::print::{info, step};
use anyhow::{Context, bail};
use gpufabric_tests::cluster::Cluster;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::api::{Api, PostParams};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

/// The webhook's name, as the chart has it.
const WEBHOOK: &str = "fabrictests.gpufabric.io";
/// The path the operator serves FabricTest reviews on.
const FABRICTEST_PATH: &str = "/validate/fabrictests";

/// Where the operator serves the webhook, with what certificate, and the CA that signed it.
pub(crate) struct Serving {
    pub addr: SocketAddr,
    pub cert: PathBuf,
    pub key: PathBuf,
    ca_pem: String,
}

impl Serving {
    /// A free loopback port and a serving certificate for it, written to `dir`.
    pub(crate) fn new(dir: &Path) -> anyhow::Result<Serving> {
        let addr = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let ca_key = KeyPair::generate()?;
        let mut ca = CertificateParams::default();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_pem = ca.self_signed(&ca_key)?.pem();
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate()?;
        let cert =
            CertificateParams::new(vec!["127.0.0.1".to_string()])?.signed_by(&key, &issuer)?;
        let serving = Serving {
            addr,
            cert: dir.join("webhook-tls.crt"),
            key: dir.join("webhook-tls.key"),
            ca_pem,
        };
        std::fs::write(&serving.cert, cert.pem())?;
        std::fs::write(&serving.key, key.serialize_pem())?;
        Ok(serving)
    }

    /// The `fabric-operator run` arguments that serve the webhook.
    pub(crate) fn operator_args(&self) -> Vec<String> {
        vec![
            format!("--webhook-addr={}", self.addr),
            format!("--webhook-cert={}", self.cert.display()),
            format!("--webhook-key={}", self.key.display()),
        ]
    }
}

/// The configuration the chart installs (failurePolicy Fail), with a URL instead of a
/// Service.
fn configuration(serving: &Serving) -> anyhow::Result<ValidatingWebhookConfiguration> {
    let mut config: ValidatingWebhookConfiguration = serde_json::from_value(serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "gpufabric"},
        "webhooks": [{
            "name": WEBHOOK,
            "clientConfig": {"url": format!("https://{}{FABRICTEST_PATH}", serving.addr)},
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
    }))?;
    for w in config.webhooks.iter_mut().flatten() {
        w.client_config.ca_bundle = Some(ByteString(serving.ca_pem.as_bytes().to_vec()));
    }
    Ok(config)
}

/// A FabricTest whose schedule never fires (there is no February 31st): the schema lets it
/// through, the webhook refuses it.
const NEVER_FIRES: &str = "apiVersion: gpufabric.io/v1alpha1
kind: FabricTest
metadata:
  name: february-31
spec:
  schedule: \"0 2 31 2 *\"
";

/// `kubectl apply -f -` of `manifest`, as a user runs it.
fn kubectl_apply(cluster: &Cluster, manifest: &str, dry_run: bool) -> anyhow::Result<Output> {
    let mut cmd = cluster.kubectl();
    cmd.arg("apply");
    if dry_run {
        cmd.arg("--dry-run=server");
    }
    let mut child = cmd
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running kubectl")?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(manifest.as_bytes())?;
    }
    Ok(child.wait_with_output()?)
}

/// Registers the webhook the operator serves and waits until the API server calls it (it
/// picks up a new configuration within a second or so).
pub(crate) async fn register(cluster: &Cluster, serving: &Serving) -> anyhow::Result<()> {
    step(format!(
        "registering the admission webhook (ValidatingWebhookConfiguration gpufabric, served by the operator on {})",
        serving.addr
    ));
    let api: Api<ValidatingWebhookConfiguration> = Api::all(cluster.client());
    api.create(&PostParams::default(), &configuration(serving)?)
        .await
        .context("creating the ValidatingWebhookConfiguration")?;
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let out = kubectl_apply(cluster, NEVER_FIRES, true)?;
        if String::from_utf8_lossy(&out.stderr).contains(WEBHOOK) {
            return Ok(());
        }
        if Instant::now() >= until {
            bail!(
                "the API server never called the webhook: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Applies a FabricTest that cannot work and prints what `kubectl apply` answers.
pub(crate) fn show_refusal(cluster: &Cluster) -> anyhow::Result<()> {
    step(
        "kubectl apply of a FabricTest whose schedule never fires (\"0 2 31 2 *\", February 31st)",
    );
    let out = kubectl_apply(cluster, NEVER_FIRES, false)?;
    if out.status.success() {
        bail!(
            "the API server accepted it: {}",
            String::from_utf8_lossy(&out.stdout).trim()
        );
    }
    for line in String::from_utf8_lossy(&out.stderr).lines() {
        info(format!("refused: {line}"));
    }
    Ok(())
}
