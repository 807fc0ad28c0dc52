//! The packaging tools and the built images the end-to-end tests use: helm, prometheus and
//! promtool from `tests/tools/build.sh`, and the OCI image archives `deploy/images/build.sh`
//! writes.

use crate::cluster::Cluster;
use crate::workspace_root;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Env var: directory holding helm, prometheus and promtool.
pub const ENV_TOOLS_BIN: &str = "GPUFABRIC_TOOLS_BIN";
/// Env var: directory holding the image archives and `images.env`.
pub const ENV_IMAGES: &str = "GPUFABRIC_IMAGES";

/// Directory of helm, prometheus and promtool: `$GPUFABRIC_TOOLS_BIN`, else what
/// `tests/tools/build.sh --print-bin-dir` prints. Panics, saying how to build them, when
/// one is missing.
pub fn bin_dir() -> PathBuf {
    let dir = match std::env::var_os(ENV_TOOLS_BIN) {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => {
            let out = Command::new("bash")
                .arg(workspace_root().join("tests/tools/build.sh"))
                .arg("--print-bin-dir")
                .output()
                .expect("tests/tools/build.sh runs");
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        }
    };
    for tool in ["helm", "prometheus", "promtool"] {
        assert!(
            dir.join(tool).is_file(),
            "{tool} not found in {}: run tests/tools/build.sh (builds helm from its Go module, \
             unpacks prometheus and promtool from Debian's package; cached) or set {ENV_TOOLS_BIN}",
            dir.display()
        );
    }
    dir
}

/// The chart.
pub fn chart() -> PathBuf {
    workspace_root().join("charts/gpufabric")
}

/// Runs a tool; panics with its output when it fails.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?} starts: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// helm, with its own state (repositories, cache) in a throwaway place, against `cluster`.
pub fn helm(cluster: Option<&Cluster>) -> Command {
    let mut cmd = Command::new(bin_dir().join("helm"));
    let home = std::env::temp_dir().join("gpufabric-helm-home");
    cmd.env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"));
    if let Some(c) = cluster {
        cmd.arg("--kubeconfig").arg(c.kubeconfig_path());
    }
    cmd
}

/// One image `deploy/images/build.sh` built.
#[derive(Debug, Clone)]
pub struct Image {
    /// Full reference, e.g. `ghcr.io/gpufabric/fabric-operator:v0.1.0`.
    pub reference: String,
    /// Repository part of the reference (before the tag).
    pub repository: String,
    pub tag: String,
    pub digest: String,
    pub archive: PathBuf,
}

/// The images of one build.
#[derive(Debug, Clone)]
pub struct Images {
    pub operator: Image,
    pub agent: Image,
}

/// The images in `$GPUFABRIC_IMAGES` (default `target/images`), as its `images.env` names
/// them. Panics, saying how to build them, when they are missing.
pub fn images() -> Images {
    let dir = match std::env::var_os(ENV_IMAGES) {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => workspace_root().join("target/images"),
    };
    let env_file = dir.join("images.env");
    let text = std::fs::read_to_string(&env_file).unwrap_or_else(|e| {
        panic!(
            "{}: {e}: build the images with deploy/images/build.sh (or set {ENV_IMAGES} to \
             the directory it wrote)",
            env_file.display()
        )
    });
    let vars: BTreeMap<String, String> = text
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            (
                k.trim().to_string(),
                v.trim().trim_matches(['"', '\'']).to_string(),
            )
        })
        .collect();
    let image = |prefix: &str| {
        let get = |key: &str| {
            vars.get(&format!("{prefix}_{key}"))
                .cloned()
                .unwrap_or_else(|| panic!("{} has no {prefix}_{key}", env_file.display()))
        };
        let reference = get("IMAGE");
        let (repository, tag) = reference
            .rsplit_once(':')
            .map(|(r, t)| (r.to_string(), t.to_string()))
            .unwrap_or_else(|| panic!("{prefix}_IMAGE {reference:?} has no tag"));
        let archive = PathBuf::from(get("ARCHIVE"));
        let archive = if archive.is_relative() {
            dir.join(archive.file_name().unwrap_or(archive.as_os_str()))
        } else {
            archive
        };
        assert!(
            archive.is_file(),
            "{} is missing: build the images with deploy/images/build.sh",
            archive.display()
        );
        Image {
            reference,
            repository,
            tag,
            digest: get("DIGEST"),
            archive,
        }
    };
    Images {
        operator: image("OPERATOR"),
        agent: image("AGENT"),
    }
}

/// A kubeconfig at `path` that acts as ServiceAccount `sa` of namespace `ns` (a token of
/// it, an hour long) against `cluster`: what a pod of that ServiceAccount may do.
pub async fn service_account_kubeconfig(cluster: &Cluster, ns: &str, sa: &str, path: &Path) {
    let token = service_account_token(cluster, ns, sa).await;
    let admin =
        kube::config::Kubeconfig::read_from(cluster.kubeconfig_path()).expect("admin kubeconfig");
    let mut cluster_entry = admin.clusters[0].clone();
    cluster_entry.name = "local".into();
    let kubeconfig = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [serde_json::to_value(&cluster_entry).expect("cluster entry")],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": sa, "context": {"cluster": "local", "user": sa, "namespace": ns}}],
        "current-context": sa
    });
    std::fs::write(path, serde_yaml::to_string(&kubeconfig).expect("yaml"))
        .expect("kubeconfig written");
}

/// A token of ServiceAccount `ns`/`sa` (an hour's), from the API server's TokenRequest.
pub async fn service_account_token(cluster: &Cluster, ns: &str, sa: &str) -> String {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::ServiceAccount;
    use kube::api::{Api, PostParams};
    let sas: Api<ServiceAccount> = Api::namespaced(cluster.client(), ns);
    let req: TokenRequest = serde_json::from_value(serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600}
    }))
    .expect("token request");
    sas.create_token_request(sa, &PostParams::default(), &req)
        .await
        .unwrap_or_else(|e| panic!("a token of ServiceAccount {ns}/{sa}: {e}"))
        .status
        .expect("token status")
        .token
}

/// Whether `client` may `verb` the `resource` (`group/resource`, or a core resource), in
/// namespace `ns` and by `name` where given: the API server's own answer
/// (SelfSubjectAccessReview).
pub async fn can(
    client: &kube::Client,
    verb: &str,
    resource: &str,
    ns: Option<&str>,
    name: Option<&str>,
) -> bool {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    };
    use kube::api::{Api, PostParams};
    let (group, resource) = resource.split_once('/').unwrap_or(("", resource));
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                group: Some(group.into()),
                resource: Some(resource.into()),
                verb: Some(verb.into()),
                namespace: ns.map(Into::into),
                name: name.map(Into::into),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .expect("access review")
        .status
        .is_some_and(|s| s.allowed)
}
