//! The admin port: `/metrics` (Prometheus text, for the callers [`MetricsAccess`] admits),
//! `/live` (the process serves), `/ready` (the watches have synced once; with leader
//! election, also a follower that reached the Lease, so that a rolling upgrade does not wait
//! for leadership). `/live` and `/ready` say nothing about the fleet and stay open to the
//! kubelet's probes.

use crate::metrics::Metrics;
use crate::metrics_access::{self, MetricsAccess};
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Clone)]
struct AdminState {
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
    access: MetricsAccess,
}

/// The admin routes.
pub fn router(metrics: Arc<Metrics>, ready: Arc<AtomicBool>, access: MetricsAccess) -> Router {
    Router::new()
        .route(metrics_access::METRICS_PATH, get(metrics_handler))
        .route("/live", get(|| async { "ok" }))
        .route("/ready", get(ready_handler))
        .with_state(AdminState {
            metrics,
            ready,
            access,
        })
}

async fn metrics_handler(State(s): State<AdminState>, headers: HeaderMap) -> impl IntoResponse {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if let Err(denied) = metrics_access::check(&s.access, authorization).await {
        tracing::debug!(error = %denied, "refused a /metrics request");
        let status =
            StatusCode::from_u16(denied.status()).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
        return (
            status,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            denied.to_string(),
        );
    }
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
}

async fn ready_handler(State(s): State<AdminState>) -> impl IntoResponse {
    if s.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ready")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "waiting for the first watch sync or the leader Lease",
        )
    }
}

/// Binds `addr` and serves the admin routes until `shutdown` completes.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
    access: MetricsAccess,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    tracing::info!(addr = %listener.local_addr()?, "admin server listening");
    axum::serve(listener, router(metrics, ready, access))
        .with_graceful_shutdown(shutdown)
        .await
}
