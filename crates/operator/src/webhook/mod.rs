//! The validating admission webhook: the API server sends each FabricTest create and update
//! here over HTTPS, and a spec the operator could only fail on later (a schedule that never
//! fires, an unknown time zone, a node selector no node can carry, a suite that cannot
//! finish within its timeout) is refused before it is stored.

pub mod review;
pub mod tls;

use axum::Router;
use axum::body::Bytes;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use std::net::SocketAddr;
use std::sync::Arc;
pub use tls::CertFiles;

/// Why the webhook server cannot start.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("webhook certificate: {0}")]
    Certificate(String),
}

/// The webhook's routes: reviews at [`review::FABRICTEST_PATH`], and `/live`.
pub fn router() -> Router {
    Router::new()
        .route(review::FABRICTEST_PATH, post(review_handler))
        .route("/live", get(|| async { "ok" }))
}

async fn review_handler(body: Bytes) -> Response {
    match review::answer(&body) {
        Ok(json) => ([(header::CONTENT_TYPE, "application/json")], json).into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "malformed admission review");
            (StatusCode::BAD_REQUEST, e.to_string()).into_response()
        }
    }
}

/// A bound webhook server, not yet serving.
pub struct Webhook {
    listener: tls::TlsListener,
    cert: Arc<tls::ReloadingCert>,
    local: SocketAddr,
}

impl Webhook {
    /// Loads the certificate (an error names the file and what is wrong with it) and binds
    /// `addr` (port 0 picks a free one).
    pub async fn bind(addr: SocketAddr, files: CertFiles) -> Result<Webhook, WebhookError> {
        let cert = tls::ReloadingCert::new(files)?;
        let config = tls::server_config(cert.clone())?;
        let tcp = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| WebhookError::Io {
                what: format!("binding the webhook address {addr}"),
                source,
            })?;
        let listener = tls::TlsListener::new(tcp, config).map_err(|source| WebhookError::Io {
            what: "reading the webhook listener's address".into(),
            source,
        })?;
        let local =
            axum::serve::Listener::local_addr(&listener).map_err(|source| WebhookError::Io {
                what: "reading the webhook listener's address".into(),
                source,
            })?;
        Ok(Webhook {
            listener,
            cert,
            local,
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Serves reviews until `shutdown` completes, reloading the certificate when its files
    /// change.
    pub async fn serve(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), WebhookError> {
        tracing::info!(addr = %self.local, "admission webhook listening");
        let reload = tokio::spawn(self.cert.watch(tls::RELOAD_INTERVAL));
        let served = axum::serve(self.listener, router())
            .with_graceful_shutdown(shutdown)
            .await;
        reload.abort();
        served.map_err(|source| WebhookError::Io {
            what: "serving the admission webhook".into(),
            source,
        })
    }
}
