//! `/stats/summary` and `/metrics/resource` as HTTP answers, the same on every server that
//! serves them (the node API, the read-only port, the local socket). What they say is
//! [`crate::kubelet::stats`]'s: this module only turns it into a response, so the readers and
//! the summary's composition stay free of HTTP.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::kubelet::stats::StatsProvider;

/// Whether the query asks for CPU and memory alone: upstream's `only_cpu_and_memory=true`,
/// matched as that exact pair (what metrics-server sends). Pure.
pub(crate) fn cpu_and_memory_only(query: Option<&str>) -> bool {
    query.is_some_and(|q| q.split('&').any(|kv| kv == "only_cpu_and_memory=true"))
}

/// `/stats/summary` (GET or POST): the summary as JSON, or 500 with upstream's
/// `Internal Error: …` when the runtime could not be read.
pub(crate) async fn summary_response(stats: &StatsProvider, query: Option<&str>) -> Response {
    match stats.summary(cpu_and_memory_only(query)).await {
        Ok(summary) => match serde_json::to_vec(&summary) {
            Ok(body) => (
                StatusCode::OK,
                [(header::CONTENT_TYPE, "application/json")],
                body,
            )
                .into_response(),
            Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
        },
        Err(e) => {
            tracing::warn!(error = %e, "stats summary failed");
            (
                StatusCode::INTERNAL_SERVER_ERROR,
                [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
                format!("Internal Error: {e}"),
            )
                .into_response()
        }
    }
}

/// `/metrics/resource` in Prometheus' text format (on a runtime error, the node alone and
/// `scrape_error 1`, still 200, as upstream).
pub(crate) async fn resource_metrics_response(stats: &StatsProvider) -> Response {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        stats.resource_metrics().await,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_pair_asks_for_cpu_and_memory_alone() {
        let cases = [
            (None, false),
            (Some(""), false),
            (Some("only_cpu_and_memory=true"), true),
            (Some("a=1&only_cpu_and_memory=true&b=2"), true),
            (Some("only_cpu_and_memory=false"), false),
            (Some("only_cpu_and_memory=1"), false),
            (Some("only_cpu_and_memory"), false),
            (Some("xonly_cpu_and_memory=true"), false),
        ];
        for (query, want) in cases {
            assert_eq!(cpu_and_memory_only(query), want, "{query:?}");
        }
    }
}
