//! A real OCI registry for end-to-end tests: Debian's `docker-registry` (distribution v2) on
//! a free loopback port, TLS from a CA of its own, htpasswd basic auth (bcrypt, from
//! `htpasswd -B`), its storage in its temp dir; images pushed to it with skopeo. Dropping it
//! stops the registry and removes everything it stored.
//!
//! ```no_run
//! # fn demo() -> gpufabric_tests::Result<()> {
//! use gpufabric_tests::registry::Registry;
//! let registry = Registry::start()?;                 // https://127.0.0.1:PORT, basic auth
//! let image = registry.push_archive(
//!     std::path::Path::new("target/images/fabric-operator.oci.tar"),
//!     "gpufabric/fabric-operator:v0.3.0",
//! )?;                                                // "127.0.0.1:PORT/gpufabric/fabric-operator:v0.3.0"
//! // registry.auth_file(): a docker config.json for skopeo and helm (--registry-config);
//! // registry.pull_secret_json(..): the same for a kubernetes.io/dockerconfigjson Secret;
//! // registry.ca_cert(): what a client (helm --ca-file, containerd's hosts.toml) trusts.
//! # let _ = image; Ok(()) }
//! ```
//!
//! Needs Debian's `docker-registry`, `skopeo` and `apache2-utils` (htpasswd).

use crate::cluster::{Component, free_port, log_tail, spawn};
use crate::{Error, Result, io_err, pki};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The Debian packages the registry needs.
pub const APT_PACKAGES: [&str; 3] = ["docker-registry", "skopeo", "apache2-utils"];
/// The user the registry lets in (with [`Registry::password`]).
pub const USERNAME: &str = "gpufabric";

const START_TIMEOUT: Duration = Duration::from_secs(20);
const PORT_ATTEMPTS: usize = 3;

/// A running registry. Dropping it stops the registry and removes its storage.
pub struct Registry {
    host: String,
    password: String,
    dir: tempfile::TempDir,
    process: Option<Component>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("host", &self.host)
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

/// `program` on PATH or in /usr/bin (and /usr/sbin), or an error naming the package.
fn find(program: &str, package: &str) -> Result<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")])
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Error::Invalid(format!(
                "{program} not found: install Debian's {package} (apt-get install {package})"
            ))
        })
}

/// Runs `cmd`; its stdout, or an error with what it said.
fn run(cmd: &mut Command, what: &str) -> Result<String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(io_err(format!("running {what}")))?;
    if !out.status.success() {
        return Err(Error::Invalid(format!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A docker `config.json` that logs `user` into `host` with `password`: what skopeo's
/// `--authfile`, helm's `--registry-config` and a `kubernetes.io/dockerconfigjson` Secret
/// read.
pub fn docker_config_json(host: &str, user: &str, password: &str) -> String {
    use base64::Engine;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    serde_json::json!({"auths": {host: {"username": user, "password": password, "auth": auth}}})
        .to_string()
}

/// Writes the certificates (a CA of its own, and the registry's for 127.0.0.1 and localhost;
/// `certs/` holds the CA alone, as skopeo's `--cert-dir` takes every `.crt` there for one)
/// and the password file into `dir`.
fn prepare(dir: &Path, htpasswd: &Path, password: &str) -> Result<pki::ServingCert> {
    for d in ["certs", "tls", "data"] {
        let d = dir.join(d);
        std::fs::create_dir_all(&d).map_err(io_err(format!("creating {}", d.display())))?;
    }
    let served = pki::write_serving(
        &dir.join("tls"),
        "registry",
        "gpufabric-test-registry",
        &["127.0.0.1".into(), "localhost".into()],
    )?;
    std::fs::copy(&served.ca_cert, dir.join("certs/ca.crt"))
        .map_err(io_err("copying the registry's CA"))?;
    let entry = run(
        Command::new(htpasswd).args(["-Bbn", USERNAME, password]),
        "htpasswd -B",
    )?;
    let path = dir.join("htpasswd");
    std::fs::write(&path, entry).map_err(io_err(format!("writing {}", path.display())))?;
    Ok(served)
}

/// Starts the registry of `dir` on `host` (`127.0.0.1:PORT`) and waits until it accepts
/// connections. The error says whether another port may do.
fn serve(
    program: &Path,
    dir: &Path,
    served: &pki::ServingCert,
    host: &str,
) -> std::result::Result<Component, (Error, bool)> {
    let config = serde_json::json!({
        "version": 0.1,
        "log": {"level": "warn", "accesslog": {"disabled": true}},
        "storage": {"filesystem": {"rootdirectory": dir.join("data")}},
        "http": {
            "addr": host,
            "tls": {"certificate": served.cert, "key": served.key},
        },
        "auth": {"htpasswd": {"realm": "gpufabric-test-registry", "path": dir.join("htpasswd")}},
    });
    let path = dir.join("config.yml");
    // JSON is YAML.
    std::fs::write(&path, config.to_string())
        .map_err(io_err(format!("writing {}", path.display())))
        .map_err(|e| (e, false))?;
    let mut process = spawn(
        "registry",
        program,
        &["serve".into(), path.display().to_string()],
        dir,
    )
    .map_err(|e| (e, false))?;
    let end = Instant::now() + START_TIMEOUT;
    loop {
        if std::net::TcpStream::connect(host).is_ok() {
            return Ok(process);
        }
        if let Some(why) = process.exited() {
            let retry = process.port_conflict();
            return Err((process.start_error(why), retry));
        }
        if Instant::now() > end {
            let e = process.start_error(format!(
                "no connection on {host} within {}s",
                START_TIMEOUT.as_secs()
            ));
            process.stop();
            return Err((e, false));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Registry {
    /// Starts a registry on a free loopback port (another one when the port is taken
    /// meanwhile) and waits until it accepts connections.
    pub fn start() -> Result<Registry> {
        let program = find("docker-registry", "docker-registry")?;
        let htpasswd = find("htpasswd", "apache2-utils")?;
        find("skopeo", "skopeo")?;
        let dir = tempfile::Builder::new()
            .prefix("gpufabric-registry-")
            .tempdir()
            .map_err(io_err("creating the registry's temp dir"))?;
        let password = format!("{:032x}", rand::random::<u128>());
        let served = prepare(dir.path(), &htpasswd, &password)?;
        let mut last = None;
        for _ in 0..PORT_ATTEMPTS {
            let host = format!("127.0.0.1:{}", free_port()?);
            match serve(&program, dir.path(), &served, &host) {
                Ok(process) => {
                    let registry = Registry {
                        host,
                        password,
                        dir,
                        process: Some(process),
                    };
                    let auth = registry.auth_file();
                    std::fs::write(
                        &auth,
                        docker_config_json(&registry.host, USERNAME, &registry.password),
                    )
                    .map_err(io_err(format!("writing {}", auth.display())))?;
                    tracing::info!(host = %registry.host, dir = %registry.dir.path().display(), "registry serving");
                    return Ok(registry);
                }
                Err((e, true)) => last = Some(e),
                Err((e, false)) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::Invalid("the registry did not start".into())))
    }

    /// `127.0.0.1:PORT`, the first part of every reference to it.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// [`USERNAME`]'s password.
    pub fn password(&self) -> &str {
        &self.password
    }

    /// The CA that signed the registry's certificate (`certs/ca.crt`).
    pub fn ca_cert(&self) -> PathBuf {
        self.cert_dir().join("ca.crt")
    }

    /// A directory holding the CA alone, for skopeo's `--cert-dir` (and containerd's
    /// `certs.d/<host>/`).
    pub fn cert_dir(&self) -> PathBuf {
        self.dir.path().join("certs")
    }

    /// A docker `config.json` logged in as [`USERNAME`]: skopeo's `--authfile`, helm's
    /// `--registry-config`.
    pub fn auth_file(&self) -> PathBuf {
        self.dir.path().join("auth.json")
    }

    /// The `.dockerconfigjson` of a pull Secret for [`USERNAME`] with `password` (the right
    /// one, [`Registry::password`], or not).
    pub fn pull_secret_json(&self, password: &str) -> String {
        docker_config_json(&self.host, USERNAME, password)
    }

    /// The registry's log.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.dir.path().join("registry.log"), lines)
    }

    fn skopeo(&self) -> Command {
        let mut cmd = Command::new("skopeo");
        // skopeo reads its policy from /etc/containers/policy.json (Debian's
        // golang-github-containers-common): accept anything, as Debian's does.
        cmd.arg("--insecure-policy");
        cmd
    }

    /// Pushes an OCI image archive (as `deploy/images/oci.py` writes) as `name` (e.g.
    /// `gpufabric/fabric-agent:v0.3.0`); returns the full reference.
    pub fn push_archive(&self, archive: &Path, name: &str) -> Result<String> {
        let target = format!("{}/{name}", self.host);
        run(
            self.skopeo()
                .args(["copy", "--quiet", "--dest-authfile"])
                .arg(self.auth_file())
                .arg("--dest-cert-dir")
                .arg(self.cert_dir())
                .arg(format!("oci-archive:{}", archive.display()))
                .arg(format!("docker://{target}")),
            &format!("skopeo copy of {} to {target}", archive.display()),
        )?;
        Ok(target)
    }

    /// Gives the image `from` (a reference in this registry) a second name `to` (a tag of
    /// a new release, say); returns `to`'s full reference. The registry copies no layer.
    pub fn tag(&self, from: &str, to: &str) -> Result<String> {
        let target = format!("{}/{to}", self.host);
        let auth = self.auth_file();
        let certs = self.cert_dir();
        run(
            self.skopeo()
                .args(["copy", "--quiet", "--src-authfile"])
                .arg(&auth)
                .arg("--src-cert-dir")
                .arg(&certs)
                .arg("--dest-authfile")
                .arg(&auth)
                .arg("--dest-cert-dir")
                .arg(&certs)
                .arg(format!("docker://{from}"))
                .arg(format!("docker://{target}")),
            &format!("skopeo copy of {from} to {target}"),
        )?;
        Ok(target)
    }

    /// The tags of `repository` (e.g. `gpufabric/fabric-agent`), asked with `password` for
    /// [`USERNAME`]: an error when the registry refuses it.
    pub fn tags(&self, repository: &str, password: &str) -> Result<Vec<String>> {
        let out = run(
            self.skopeo()
                .args(["list-tags", "--creds"])
                .arg(format!("{USERNAME}:{password}"))
                .arg("--cert-dir")
                .arg(self.cert_dir())
                .arg(format!("docker://{}/{repository}", self.host)),
            &format!("skopeo list-tags of {}/{repository}", self.host),
        )?;
        let doc: serde_json::Value = serde_json::from_str(&out)
            .map_err(|e| Error::Invalid(format!("skopeo list-tags said {out:?}: {e}")))?;
        Ok(doc["Tags"]
            .as_array()
            .map(|t| {
                t.iter()
                    .filter_map(|t| t.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default())
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        if let Some(p) = self.process.take() {
            p.stop();
        }
        // The TempDir removes the storage.
    }
}
