//! The kubelet's log endpoint, as much of it as `kubectl logs` and the API server's
//! `pods/log` need: HTTPS on 127.0.0.1 (a self-signed certificate: the API server does not
//! verify kubelet serving certificates unless `--kubelet-certificate-authority` is set),
//! `GET /containerLogs/{namespace}/{pod}/{container}` with `tailLines` and `limitBytes`,
//! answered from the pod's log file. The nodes report its port in
//! `status.daemonEndpoints.kubeletEndpoint.Port`.

use crate::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// Largest request head read.
const MAX_HEAD: usize = 16 * 1024;

/// Starts the log server on 127.0.0.1 (a free port), serving the logs under `root`
/// (`<root>/<namespace>_<pod>/<log_file>`). Returns the port and the accept task.
pub(super) async fn serve(root: PathBuf, log_file: &'static str) -> Result<(u16, JoinHandle<()>)> {
    let config = tls_config()?;
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(crate::io_err("binding the kubelet log server"))?;
    let port = listener
        .local_addr()
        .map_err(crate::io_err("the kubelet log server's address"))?
        .port();
    let task = tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let (acceptor, root) = (acceptor.clone(), root.clone());
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(tcp).await
                    && let Err(e) = answer(tls, &root, log_file).await
                {
                    tracing::debug!(error = %e, "kubelet log request");
                }
            });
        }
    });
    Ok((port, task))
}

fn tls_config() -> Result<ServerConfig> {
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
        .map_err(|e| Error::Certificates(format!("kubelet log server: {e}")))?;
    let chain = vec![CertificateDer::from(cert.cert.der().to_vec())];
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(cert.signing_key.serialize_der()));
    ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(chain, key))
        .map_err(|e| Error::Certificates(format!("kubelet log server TLS: {e}")))
}

/// What a request asks for.
#[derive(Debug, PartialEq)]
struct LogRequest {
    namespace: String,
    pod: String,
    tail_lines: Option<usize>,
    limit_bytes: Option<usize>,
}

/// Parses `GET /containerLogs/{ns}/{pod}/{container}?tailLines=N&limitBytes=M HTTP/1.1`.
fn parse(head: &str) -> Option<LogRequest> {
    let mut words = head.lines().next()?.split_whitespace();
    if words.next()? != "GET" {
        return None;
    }
    let target = words.next()?;
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let [kind, ns, pod, _container] = parts.as_slice() else {
        return None;
    };
    if *kind != "containerLogs" {
        return None;
    }
    let param = |name: &str| {
        query
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .find(|(k, _)| *k == name)
            .and_then(|(_, v)| v.parse().ok())
    };
    Some(LogRequest {
        namespace: ns.to_string(),
        pod: pod.to_string(),
        tail_lines: param("tailLines"),
        limit_bytes: param("limitBytes"),
    })
}

/// The part of `log` a request asks for: the last `tail_lines` lines, then at most
/// `limit_bytes` bytes of those.
fn select(log: &[u8], req: &LogRequest) -> Vec<u8> {
    let mut start = 0;
    if let Some(n) = req.tail_lines {
        let body = log.strip_suffix(b"\n").unwrap_or(log);
        let mut seen = 0;
        start = log.len();
        if n > 0 {
            start = 0;
            for (i, b) in body.iter().enumerate().rev() {
                if *b == b'\n' {
                    seen += 1;
                    if seen == n {
                        start = i + 1;
                        break;
                    }
                }
            }
        }
    }
    let out = &log[start..];
    let end = req.limit_bytes.map_or(out.len(), |m| m.min(out.len()));
    out[..end].to_vec()
}

async fn answer<S>(mut stream: S, root: &Path, log_file: &str) -> std::io::Result<()>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_HEAD {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let (status, body) = match parse(&String::from_utf8_lossy(&head)) {
        None => ("400 Bad Request", b"unsupported request\n".to_vec()),
        Some(req) => {
            let path = root
                .join(format!("{}_{}", req.namespace, req.pod))
                .join(log_file);
            match tokio::fs::read(&path).await {
                Ok(log) => ("200 OK", select(&log, &req)),
                Err(_) => ("404 Not Found", b"no log for this pod\n".to_vec()),
            }
        }
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(reply.as_bytes()).await?;
    stream.write_all(&body).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_name_the_pod_and_the_tail() {
        let r = parse(
            "GET /containerLogs/ns/p-1/agent?tailLines=1&limitBytes=9 HTTP/1.1\r\nHost: x\r\n\r\n",
        );
        assert_eq!(
            r,
            Some(LogRequest {
                namespace: "ns".into(),
                pod: "p-1".into(),
                tail_lines: Some(1),
                limit_bytes: Some(9),
            })
        );
        assert_eq!(parse("POST /containerLogs/ns/p/c HTTP/1.1"), None);
        assert_eq!(parse("GET /exec/ns/p/c HTTP/1.1"), None);
    }

    #[test]
    fn the_tail_is_the_last_lines_and_the_limit_cuts_it() {
        let req = |t, l| LogRequest {
            namespace: String::new(),
            pod: String::new(),
            tail_lines: t,
            limit_bytes: l,
        };
        let log = b"a\nbb\n{\"doc\":1}\n";
        assert_eq!(select(log, &req(Some(1), None)), b"{\"doc\":1}\n");
        assert_eq!(select(log, &req(Some(2), None)), b"bb\n{\"doc\":1}\n");
        assert_eq!(select(log, &req(Some(9), None)), log);
        assert_eq!(select(log, &req(None, Some(3))), b"a\nb");
        assert_eq!(select(log, &req(Some(0), None)), b"");
        assert_eq!(select(b"no newline", &req(Some(1), None)), b"no newline");
    }
}
