//! Certificates of a local control plane: a CA, the API server's serving certificate,
//! the service-account key pair and client certificates, generated with rcgen.

use crate::{Error, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use std::path::{Path, PathBuf};

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

/// Generates every certificate and key a control plane on 127.0.0.1 needs, into `dir`.
pub fn write(dir: &Path) -> Result<Pki> {
    let ca_key = KeyPair::generate().map_err(cert_err("CA key"))?;
    let mut ca_params = CertificateParams::default();
    ca_params.distinguished_name = dn("gpufabric-test-ca", None);
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca_params.self_signed(&ca_key).map_err(cert_err("CA"))?;
    let ca_pem = ca_cert.pem();
    let ca_key_pem = ca_key.serialize_pem();
    let issuer = Issuer::new(ca_params, ca_key);

    let leaf = |cn: &str,
                org: Option<&str>,
                sans: Vec<String>,
                usage: ExtendedKeyUsagePurpose|
     -> Result<(String, String)> {
        let key = KeyPair::generate().map_err(cert_err(cn))?;
        let mut params = CertificateParams::new(sans).map_err(cert_err(cn))?;
        params.distinguished_name = dn(cn, org);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![usage];
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, &issuer).map_err(cert_err(cn))?;
        Ok((cert.pem(), key.serialize_pem()))
    };

    let sans = [
        "127.0.0.1",
        "10.0.0.1",
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
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
    Ok(pki)
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
