//! The pages every HTTP server of the agent serves, built once: `/healthz`, `/pods`,
//! `/stats/summary`, `/metrics` and the pages under it. The read-only port and the local socket
//! mount [`common`] as it is; the node API mounts it, adds its own endpoints and puts its
//! authentication and authorization in front of all of them. Each server adds its own layers
//! (the request metrics, the gate) after mounting, so they cover these pages too.
//!
//! The servers differ in one page, as they always have: the node API serves `/healthz` and
//! `/healthz/<check>` without the verbose report, the read-only port `/healthz` alone with
//! `?verbose` ([`Healthz`]).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use axum::Router;
use axum::extract::{FromRef, Query, State};
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::base::clock;
use crate::base::health::Health;
use crate::kubelet::pod_status::published::PodStates;
use crate::kubelet::stats::StatsProvider;

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

    pub(crate) fn render(&self, path: &str) -> Option<String> {
        let page = self
            .pages
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(path)
            .cloned()?;
        Some(page())
    }
}

/// What the shared pages read. A server's own state gives it through [`FromRef`].
#[derive(Clone)]
pub(crate) struct Pages {
    pub health: Health,
    pub pods: PodStates,
    pub metrics: Metrics,
    /// `/stats/summary` and `/metrics/resource`; without it the first answers 404 and the
    /// second comes from the page registry like any other metrics page.
    pub stats: Option<Arc<StatsProvider>>,
}

/// How a server answers `/healthz`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Healthz {
    /// `/healthz` alone; `?verbose` lists every check (the read-only port, the local socket,
    /// the healthz port).
    Verbose,
    /// `/healthz` and `/healthz/<anything>`, always the short answer (the node API).
    Short,
}

/// The shared pages, for a server whose state `S` gives [`Pages`].
pub(crate) fn common<S>(healthz: Healthz) -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Pages: FromRef<S>,
{
    let routes = match healthz {
        Healthz::Verbose => healthz_alone(),
        Healthz::Short => Router::new()
            .route("/healthz", get(short_healthz))
            .route("/healthz/{*check}", get(short_healthz)),
    };
    routes
        .route("/pods", get(pods))
        .route("/pods/", get(pods))
        .route("/stats/summary", get(stats_summary).post(stats_summary))
        .route("/metrics", get(metrics_page))
        .route("/metrics/{*rest}", get(metrics_page))
}

/// `/healthz` alone, `?verbose` listing every check: the healthz port.
pub(crate) fn healthz_alone<S>() -> Router<S>
where
    S: Clone + Send + Sync + 'static,
    Pages: FromRef<S>,
{
    Router::new().route("/healthz", get(verbose_healthz))
}

#[derive(serde::Deserialize)]
struct HealthQuery {
    verbose: Option<String>,
}

fn health_answer(health: &Health, verbose: bool) -> Response {
    let report = health.report();
    let code = if report.healthy() {
        StatusCode::OK
    } else {
        StatusCode::INTERNAL_SERVER_ERROR
    };
    (
        code,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        report.render(verbose),
    )
        .into_response()
}

/// `/healthz`, with every check listed when the query has `verbose`.
async fn verbose_healthz(State(pages): State<Pages>, Query(q): Query<HealthQuery>) -> Response {
    health_answer(&pages.health, q.verbose.is_some())
}

async fn short_healthz(State(pages): State<Pages>) -> Response {
    health_answer(&pages.health, false)
}

/// `/pods`: a `v1` `PodList` of the pods with their published statuses.
async fn pods(State(pages): State<Pages>) -> Response {
    match serde_json::to_vec(&pages.pods.pod_list()) {
        Ok(body) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            body,
        )
            .into_response(),
        Err(err) => (StatusCode::INTERNAL_SERVER_ERROR, err.to_string()).into_response(),
    }
}

async fn stats_summary(State(pages): State<Pages>, uri: Uri) -> Response {
    match &pages.stats {
        Some(stats) => super::stats::summary_response(stats, uri.query()).await,
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// A page of the registry by its path; `/metrics/resource` from the stats provider when
/// there is one.
pub(crate) async fn metrics_page(State(pages): State<Pages>, uri: Uri) -> Response {
    if uri.path() == "/metrics/resource"
        && let Some(stats) = &pages.stats
    {
        return super::stats::resource_metrics_response(stats).await;
    }
    match pages.metrics.render(uri.path()) {
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

/// Counts and times one request (upstream's `kubelet_http_requests_total`, `…_duration_seconds`
/// and `kubelet_http_inflight_requests`) under `server_type` (`readonly`, `readwrite`).
pub(crate) async fn count_request(
    server_type: &'static str,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let m = &crate::base::metrics::KUBELET;
    let path = crate::base::metrics::http_path_bucket(req.uri().path());
    let method = crate::base::metrics::http_method_bucket(req.method().as_str());
    // Upstream's long-running requests: the streaming ones.
    let long_running = if matches!(path.as_str(), "exec" | "attach" | "portForward" | "debug") {
        "true"
    } else {
        "false"
    };
    let labels = [method, path.as_str(), server_type, long_running];
    m.http_requests.inc(&labels);
    m.http_inflight_requests.add(&labels, 1.0);
    let began = clock::instant();
    let response = next.run(req).await;
    m.http_inflight_requests.add(&labels, -1.0);
    m.http_requests_duration
        .observe(&labels, began.elapsed().as_secs_f64());
    response
}
