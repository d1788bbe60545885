//! HTTP endpoints: the healthz port and the read-only port.
//!
//! Both are plain HTTP on the addresses the configuration names. The read-only port serves what
//! upstream's does for the parts Deckhand has: `/pods` (a `v1` `PodList` with status) and
//! `/healthz`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::health::Health;
use crate::pod_state::PodStates;

/// A server could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr} for the {what}: {source}")]
pub struct ServeError {
    pub what: &'static str,
    pub addr: SocketAddr,
    #[source]
    pub source: std::io::Error,
}

/// Metric pages by path, each rendered on request in Prometheus' text format.
#[derive(Clone, Default)]
pub struct Metrics {
    pages: Arc<RwLock<BTreeMap<String, Renderer>>>,
}

type Renderer = Arc<dyn Fn() -> String + Send + Sync>;

impl Metrics {
    /// Serves `render()` at `path` (e.g. `/metrics/probes`).
    pub fn register(&self, path: &str, render: impl Fn() -> String + Send + Sync + 'static) {
        self.pages
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(path.to_string(), Arc::new(render));
    }

    fn render(&self, path: &str) -> Option<String> {
        let page = self
            .pages
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(path)
            .cloned()?;
        Some(page())
    }
}

#[derive(Clone)]
struct AppState {
    health: Health,
    pods: PodStates,
    metrics: Metrics,
}

#[derive(serde::Deserialize)]
struct HealthQuery {
    verbose: Option<String>,
}

async fn healthz(State(state): State<AppState>, Query(q): Query<HealthQuery>) -> Response {
    let report = state.health.report();
    let code = if report.healthy() {
        StatusCode::OK
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    };
    let body = report.render(q.verbose.is_some());
    (
        code,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body,
    )
        .into_response()
}

async fn list_pods(State(state): State<AppState>) -> Response {
    let list = state.pods.pod_list();
    match serde_json::to_vec(&list) {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Err(err) => (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response(),
    }
}

async fn metrics_page(State(state): State<AppState>, uri: axum::http::Uri) -> Response {
    match state.metrics.render(uri.path()) {
        Some(text) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// Binds `addr` and serves `router` until `cancel` fires. Binding errors come back at once.
async fn serve(
    what: &'static str,
    addr: SocketAddr,
    router: Router,
    cancel: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, ServeError> {
    let listener =
        TcpListener::bind(addr)
            .await
            .map_err(|source| ServeError { what, addr, source })?;
    let local = listener.local_addr().unwrap_or(addr);
    tracing::info!(%local, "serving the {what}");
    Ok(tokio::spawn(async move {
        let shutdown = cancel.cancelled_owned();
        if let Err(err) = axum::serve(listener, router)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::error!(%err, "the {what} stopped");
        }
    }))
}

/// Serves `GET /healthz` on the healthz address.
pub async fn serve_healthz(
    addr: SocketAddr,
    health: Health,
    pods: PodStates,
    cancel: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, ServeError> {
    let router = Router::new()
        .route("/healthz", get(healthz))
        .with_state(AppState {
            health,
            pods,
            metrics: Metrics::default(),
        });
    serve("healthz endpoint", addr, router, cancel).await
}

/// Serves the read-only API: `GET /pods`, `GET /healthz`, `GET /metrics/...`.
pub async fn serve_read_only(
    addr: SocketAddr,
    health: Health,
    pods: PodStates,
    metrics: Metrics,
    cancel: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, ServeError> {
    let router = Router::new()
        .route("/healthz", get(healthz))
        .route("/pods", get(list_pods))
        .route("/pods/", get(list_pods))
        .route("/metrics/{*rest}", get(metrics_page))
        .with_state(AppState {
            health,
            pods,
            metrics,
        });
    serve("read-only API", addr, router, cancel).await
}
