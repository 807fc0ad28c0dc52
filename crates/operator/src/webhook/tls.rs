//! The webhook's TLS: a serving certificate read from PEM files and read again when the
//! files change (cert-manager and the kubelet replace a mounted Secret's files in place), and
//! a listener whose handshakes run beside each other so one slow client holds up no other.

use super::WebhookError;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::crypto::{CryptoProvider, ring};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::rustls::{ServerConfig, version};
use tokio_rustls::server::TlsStream;

/// How long a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the certificate files are checked for a change.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(30);

/// The certificate chain and private key files (PEM), as `tls.crt` and `tls.key` of a
/// `kubernetes.io/tls` Secret.
#[derive(Debug, Clone)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn read(path: &Path) -> Result<Vec<u8>, WebhookError> {
    std::fs::read(path).map_err(|source| WebhookError::Io {
        what: format!("reading {}", path.display()),
        source,
    })
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

impl CertFiles {
    /// The certificate and key, checked to belong together.
    pub fn load(&self) -> Result<CertifiedKey, WebhookError> {
        let bad = |what: &Path, e: &dyn std::fmt::Display| {
            WebhookError::Certificate(format!("{}: {e}", what.display()))
        };
        let chain = CertificateDer::pem_slice_iter(&read(&self.cert)?)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| bad(&self.cert, &e))?;
        if chain.is_empty() {
            return Err(bad(&self.cert, &"no CERTIFICATE block in the file"));
        }
        let key =
            PrivateKeyDer::from_pem_slice(&read(&self.key)?).map_err(|e| bad(&self.key, &e))?;
        CertifiedKey::from_der(chain, key, &provider()).map_err(|e| {
            WebhookError::Certificate(format!(
                "{} and {} do not make a serving certificate: {e}",
                self.cert.display(),
                self.key.display()
            ))
        })
    }

    fn stamp(&self) -> Stamp {
        (modified(&self.cert), modified(&self.key))
    }
}

/// Modification times of the certificate and key files, to notice a change.
type Stamp = (Option<SystemTime>, Option<SystemTime>);

fn provider() -> CryptoProvider {
    ring::default_provider()
}

/// The serving certificate in use, replaced when its files change.
#[derive(Debug)]
pub struct ReloadingCert {
    files: CertFiles,
    current: RwLock<(Arc<CertifiedKey>, Stamp)>,
}

impl ReloadingCert {
    /// Loads the files now; an error here stops the server from starting.
    pub fn new(files: CertFiles) -> Result<Arc<Self>, WebhookError> {
        let stamp = files.stamp();
        let key = Arc::new(files.load()?);
        Ok(Arc::new(ReloadingCert {
            files,
            current: RwLock::new((key, stamp)),
        }))
    }

    /// Reads the files again if they changed since the last load. Returns whether a new
    /// certificate is in use; a file that does not load keeps the old one (and says why).
    pub fn reload_if_changed(&self) -> Result<bool, WebhookError> {
        let stamp = self.files.stamp();
        let unchanged = self.current.read().map(|c| c.1 == stamp).unwrap_or(false);
        if unchanged {
            return Ok(false);
        }
        let key = Arc::new(self.files.load()?);
        if let Ok(mut current) = self.current.write() {
            *current = (key, stamp);
        }
        Ok(true)
    }

    /// Checks the files every `every` until the task is dropped.
    pub async fn watch(self: Arc<Self>, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match self.reload_if_changed() {
                Ok(true) => tracing::info!(
                    cert = %self.files.cert.display(),
                    "webhook serving certificate reloaded"
                ),
                Ok(false) => {}
                Err(e) => tracing::warn!(
                    error = %e,
                    "webhook certificate files changed but do not load; serving the previous certificate"
                ),
            }
        }
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok().map(|c| c.0.clone())
    }
}

/// TLS 1.2 and 1.3 with `cert`, HTTP/1.1 only.
pub fn server_config(cert: Arc<ReloadingCert>) -> Result<ServerConfig, WebhookError> {
    let mut config = ServerConfig::builder_with_provider(Arc::new(provider()))
        .with_protocol_versions(&[&version::TLS13, &version::TLS12])
        .map_err(|e| WebhookError::Certificate(format!("TLS set-up: {e}")))?
        .with_no_client_auth()
        .with_cert_resolver(cert);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// Accepted connections whose handshake finished, for `axum::serve`.
pub struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    /// Accepts on `tcp` and shakes hands in a task per connection; a failed handshake is
    /// logged and dropped.
    pub fn new(tcp: TcpListener, config: ServerConfig) -> std::io::Result<Self> {
        let local = tcp.local_addr()?;
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let (tx, ready) = mpsc::channel(64);
        tokio::spawn(async move {
            while !tx.is_closed() {
                let (stream, peer) = match tcp.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::warn!(error = %e, "webhook accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _closed = tx.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "webhook TLS handshake failed")
                        }
                        Err(_) => tracing::debug!(%peer, "webhook TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener { ready, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(conn) => conn,
            // The accept task only ends when this listener is gone.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{CertificateParams, KeyPair};

    /// A self-signed certificate for `name`: (certificate PEM, key PEM, certificate DER).
    fn self_signed(name: &str) -> (String, String, Vec<u8>) {
        let key = KeyPair::generate().expect("key");
        let cert = CertificateParams::new(vec![name.to_string()])
            .expect("params")
            .self_signed(&key)
            .expect("certificate");
        (cert.pem(), key.serialize_pem(), cert.der().to_vec())
    }

    fn write(path: &Path, text: &str, stamp: SystemTime) {
        std::fs::write(path, text).expect("write");
        let f = std::fs::File::options()
            .write(true)
            .open(path)
            .expect("open");
        f.set_modified(stamp).expect("set mtime");
    }

    fn serving(cert: &ReloadingCert) -> Vec<u8> {
        let current = cert.current.read().expect("lock");
        current.0.cert[0].as_ref().to_vec()
    }

    #[test]
    fn a_renewed_certificate_is_served_and_a_broken_one_is_not() {
        let dir = tempfile::tempdir().expect("dir");
        let files = CertFiles {
            cert: dir.path().join("tls.crt"),
            key: dir.path().join("tls.key"),
        };
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let (crt, key, first) = self_signed("first.example");
        write(&files.cert, &crt, t0);
        write(&files.key, &key, t0);
        let cert = ReloadingCert::new(files.clone()).expect("loads");
        assert_eq!(serving(&cert), first);
        assert!(!cert.reload_if_changed().expect("unchanged"));

        let (crt, key, second) = self_signed("second.example");
        let t1 = t0 + Duration::from_secs(60);
        write(&files.cert, &crt, t1);
        write(&files.key, &key, t1);
        assert!(cert.reload_if_changed().expect("reloads"));
        assert_eq!(serving(&cert), second);

        // A key that does not belong to the certificate keeps the one in use.
        let (_, other_key, _) = self_signed("third.example");
        write(&files.key, &other_key, t1 + Duration::from_secs(60));
        let err = cert
            .reload_if_changed()
            .expect_err("mismatched pair refused");
        assert!(
            err.to_string()
                .contains("do not make a serving certificate"),
            "{err}"
        );
        assert_eq!(serving(&cert), second);
    }

    #[test]
    fn a_missing_or_empty_file_is_named_in_the_error() {
        let dir = tempfile::tempdir().expect("dir");
        let files = CertFiles {
            cert: dir.path().join("tls.crt"),
            key: dir.path().join("tls.key"),
        };
        let err = files.load().expect_err("missing");
        assert!(err.to_string().contains("tls.crt"), "{err}");
        std::fs::write(&files.cert, "not pem").expect("write");
        let err = files.load().expect_err("empty");
        assert!(err.to_string().contains("no CERTIFICATE block"), "{err}");
    }
}
