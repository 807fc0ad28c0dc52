//! Certificates of a local control plane: a CA, the API server's serving certificate,
//! the service-account key pair and client certificates, generated with rcgen; and, later,
//! more client certificates from the same CA (a real node's kubelet, kube-proxy and
//! kube-scheduler, see `crate::realnode`).

use crate::{Error, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// The cluster's Service IP range. Its first address is the `kubernetes` Service's
/// ClusterIP, which pods reach the API server at (`KUBERNETES_SERVICE_HOST`).
pub const SERVICE_CIDR: &str = "10.96.0.0/12";
/// The `kubernetes` Service's ClusterIP: in the API server's certificate.
pub const KUBERNETES_SERVICE_IP: &str = "10.96.0.1";

/// Paths of the PEM files [`write()`] created.
#[derive(Debug, Clone)]
pub struct Pki {
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    pub apiserver_cert: PathBuf,
    pub apiserver_key: PathBuf,
    /// Service-account token signing key (private) and its public half.
    pub sa_key: PathBuf,
    pub sa_pub: PathBuf,
    /// Admin client (O=system:masters).
    pub admin_cert: PathBuf,
    pub admin_key: PathBuf,
    /// kube-controller-manager client (CN=system:kube-controller-manager).
    pub controller_manager_cert: PathBuf,
    pub controller_manager_key: PathBuf,
    /// The API server's client certificate towards kubelets (`kubectl logs`, `exec`):
    /// CN=kube-apiserver-kubelet-client, O=system:masters.
    pub apiserver_kubelet_client_cert: PathBuf,
    pub apiserver_kubelet_client_key: PathBuf,
}

/// A client certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct ClientCert {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn cert_err(what: &str) -> impl Fn(rcgen::Error) -> Error + '_ {
    move |e| Error::Certificates(format!("{what}: {e}"))
}

fn dn(cn: &str, org: Option<&str>) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    if let Some(o) = org {
        dn.push(DnType::OrganizationName, o);
    }
    dn.push(DnType::CommonName, cn);
    dn
}

fn write_file(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|source| Error::Io {
        what: format!("writing {}", path.display()),
        source,
    })
}

/// The CA's parameters. An issuer built from them and the CA's key signs certificates
/// that chain to the CA certificate [`write()`] made (same subject, same key identifier).
fn ca_params() -> CertificateParams {
    let mut ca_params = CertificateParams::default();
    ca_params.distinguished_name = dn("gpufabric-test-ca", None);
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca_params
}

/// A certificate for `cn` (and organisation `org`) signed by `issuer`: `(cert, key)` PEM.
fn leaf(
    issuer: &Issuer<'_, KeyPair>,
    cn: &str,
    org: Option<&str>,
    sans: Vec<String>,
    usage: ExtendedKeyUsagePurpose,
) -> Result<(String, String)> {
    let key = KeyPair::generate().map_err(cert_err(cn))?;
    let mut params = CertificateParams::new(sans).map_err(cert_err(cn))?;
    params.distinguished_name = dn(cn, org);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![usage];
    params.use_authority_key_identifier_extension = true;
    let cert = params.signed_by(&key, issuer).map_err(cert_err(cn))?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// Generates every certificate and key a control plane needs, into `dir`. The API
/// server's certificate is valid for 127.0.0.1, [`KUBERNETES_SERVICE_IP`], the
/// `kubernetes.default...` names and `host_ips` (the address pods reach it at, when the
/// cluster has a real node).
pub fn write(dir: &Path, host_ips: &[IpAddr]) -> Result<Pki> {
    let ca_key = KeyPair::generate().map_err(cert_err("CA key"))?;
    let ca_params = ca_params();
    let ca_cert = ca_params.self_signed(&ca_key).map_err(cert_err("CA"))?;
    let ca_pem = ca_cert.pem();
    let ca_key_pem = ca_key.serialize_pem();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf =
        |cn: &str, org: Option<&str>, sans: Vec<String>, usage| leaf(&issuer, cn, org, sans, usage);

    let mut sans: Vec<String> = [
        "127.0.0.1",
        KUBERNETES_SERVICE_IP,
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    sans.extend(host_ips.iter().map(|ip| ip.to_string()));
    let (api_pem, api_key) = leaf(
        "kube-apiserver",
        None,
        sans,
        ExtendedKeyUsagePurpose::ServerAuth,
    )?;
    let (admin_pem, admin_key) = leaf(
        "gpufabric-admin",
        Some("system:masters"),
        Vec::new(),
        ExtendedKeyUsagePurpose::ClientAuth,
    )?;
    let (kcm_pem, kcm_key) = leaf(
        "system:kube-controller-manager",
        None,
        Vec::new(),
        ExtendedKeyUsagePurpose::ClientAuth,
    )?;
    let (kubelet_client_pem, kubelet_client_key) = leaf(
        "kube-apiserver-kubelet-client",
        Some("system:masters"),
        Vec::new(),
        ExtendedKeyUsagePurpose::ClientAuth,
    )?;
    let sa = KeyPair::generate().map_err(cert_err("service-account key"))?;

    let pki = Pki {
        ca_cert: dir.join("ca.crt"),
        ca_key: dir.join("ca.key"),
        apiserver_cert: dir.join("apiserver.crt"),
        apiserver_key: dir.join("apiserver.key"),
        sa_key: dir.join("sa.key"),
        sa_pub: dir.join("sa.pub"),
        admin_cert: dir.join("admin.crt"),
        admin_key: dir.join("admin.key"),
        controller_manager_cert: dir.join("controller-manager.crt"),
        controller_manager_key: dir.join("controller-manager.key"),
        apiserver_kubelet_client_cert: dir.join("apiserver-kubelet-client.crt"),
        apiserver_kubelet_client_key: dir.join("apiserver-kubelet-client.key"),
    };
    write_file(&pki.ca_cert, &ca_pem)?;
    write_file(&pki.ca_key, &ca_key_pem)?;
    write_file(&pki.apiserver_cert, &api_pem)?;
    write_file(&pki.apiserver_key, &api_key)?;
    write_file(&pki.sa_key, &sa.serialize_pem())?;
    write_file(&pki.sa_pub, &sa.public_key_pem())?;
    write_file(&pki.admin_cert, &admin_pem)?;
    write_file(&pki.admin_key, &admin_key)?;
    write_file(&pki.controller_manager_cert, &kcm_pem)?;
    write_file(&pki.controller_manager_key, &kcm_key)?;
    write_file(&pki.apiserver_kubelet_client_cert, &kubelet_client_pem)?;
    write_file(&pki.apiserver_kubelet_client_key, &kubelet_client_key)?;
    Ok(pki)
}

impl Pki {
    /// A client certificate from the cluster's CA for user `cn` in group `org`, written to
    /// `dir/<stem>.crt` and `dir/<stem>.key` (e.g. `system:node:<name>` in `system:nodes`
    /// for a kubelet, which the Node authorizer then lets act for that node).
    pub fn issue_client(
        &self,
        dir: &Path,
        stem: &str,
        cn: &str,
        org: Option<&str>,
    ) -> Result<ClientCert> {
        let ca_key_pem = std::fs::read_to_string(&self.ca_key).map_err(|source| Error::Io {
            what: format!("reading {}", self.ca_key.display()),
            source,
        })?;
        let ca_key = KeyPair::from_pem(&ca_key_pem).map_err(cert_err("CA key"))?;
        let issuer = Issuer::new(ca_params(), ca_key);
        let (pem, key) = leaf(
            &issuer,
            cn,
            org,
            Vec::new(),
            ExtendedKeyUsagePurpose::ClientAuth,
        )?;
        let out = ClientCert {
            cert: dir.join(format!("{stem}.crt")),
            key: dir.join(format!("{stem}.key")),
        };
        write_file(&out.cert, &pem)?;
        write_file(&out.key, &key)?;
        Ok(out)
    }
}

/// A kubeconfig (YAML) for `server` that authenticates with a client certificate.
/// Files are referenced by absolute path, so the kubeconfig is valid as long as they exist.
pub fn kubeconfig_yaml(server: &str, ca: &Path, cert: &Path, key: &Path, user: &str) -> String {
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "gpufabric-local", "cluster": {
            "server": server,
            "certificate-authority": ca.display().to_string(),
        }}],
        "users": [{"name": user, "user": {
            "client-certificate": cert.display().to_string(),
            "client-key": key.display().to_string(),
        }}],
        "contexts": [{"name": "gpufabric-local", "context": {
            "cluster": "gpufabric-local",
            "user": user,
        }}],
        "current-context": "gpufabric-local",
        "preferences": {},
    });
    // A JSON document is valid YAML; serde_yaml output is easier to read for people.
    serde_yaml::to_string(&doc).unwrap_or_else(|_| doc.to_string())
}

/// A server's own CA and its serving certificate (e.g. a registry's), as PEM files.
#[derive(Debug, Clone)]
pub struct ServingCert {
    pub ca_cert: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// A new CA and a serving certificate from it for `cn`, valid for `sans` (names or
/// addresses), written to `dir/ca.crt`, `dir/<stem>.crt` and `dir/<stem>.key`.
pub fn write_serving(dir: &Path, stem: &str, cn: &str, sans: &[String]) -> Result<ServingCert> {
    let ca_key = KeyPair::generate().map_err(cert_err("CA key"))?;
    let params = ca_params();
    let ca_pem = params.self_signed(&ca_key).map_err(cert_err("CA"))?.pem();
    let issuer = Issuer::new(params, ca_key);
    let (pem, key) = leaf(
        &issuer,
        cn,
        None,
        sans.to_vec(),
        ExtendedKeyUsagePurpose::ServerAuth,
    )?;
    let out = ServingCert {
        ca_cert: dir.join("ca.crt"),
        cert: dir.join(format!("{stem}.crt")),
        key: dir.join(format!("{stem}.key")),
    };
    write_file(&out.ca_cert, &ca_pem)?;
    write_file(&out.cert, &pem)?;
    write_file(&out.key, &key)?;
    Ok(out)
}
