//! The node API's state for unit tests (empty pods and runtime, no streams, a stats provider on
//! the fake runtime, `/configz` as `{}`, every optional endpoint on), and one request through
//! a router without a listener.

use std::path::Path;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::http::{StatusCode, header};
use futures::future::BoxFuture;

use super::auth::Gate;
use super::handlers::{NodeApiState, StreamUrls};
use crate::clients::cri::CriError;
use crate::clients::cri::proto::{AttachRequest, ExecRequest, PortForwardRequest};

/// A runtime whose streaming URLs lead nowhere (port 1 on loopback).
struct NoStreams;

impl StreamUrls for NoStreams {
    fn exec(&self, _: ExecRequest) -> BoxFuture<'_, Result<String, CriError>> {
        Box::pin(async { Ok("http://127.0.0.1:1/none".into()) })
    }
    fn attach(&self, _: AttachRequest) -> BoxFuture<'_, Result<String, CriError>> {
        Box::pin(async { Ok("http://127.0.0.1:1/none".into()) })
    }
    fn port_forward(&self, _: PortForwardRequest) -> BoxFuture<'_, Result<String, CriError>> {
        Box::pin(async { Ok("http://127.0.0.1:1/none".into()) })
    }
}

/// The state of a node API behind `gate`, its pod logs and `/logs/` both under `dir`.
pub(crate) fn test_state(gate: Gate, dir: &Path) -> NodeApiState {
    NodeApiState {
        gate: Arc::new(gate),
        health: Default::default(),
        pods: Default::default(),
        runtime: Default::default(),
        streams: Arc::new(NoStreams),
        metrics: Default::default(),
        pod_logs_dir: dir.to_path_buf(),
        node_log_dir: dir.to_path_buf(),
        configz: Arc::new(b"{}".to_vec()),
        stats: Arc::new(crate::kubelet::stats::StatsProvider::new(
            Arc::new(crate::clients::cri::fake::FakeCri::default()),
            Arc::new(crate::kubelet::stats::HostFiles::default()),
            "n1".into(),
        )),
        debug: Default::default(),
    }
}

/// One request through `router`: (status, content type or "" for none, body).
pub(crate) async fn ask(router: &Router, method: &str, path: &str) -> (StatusCode, String, String) {
    use tower::ServiceExt;
    let req = axum::http::Request::builder()
        .method(method)
        .uri(path)
        .body(Body::empty())
        .unwrap();
    let resp = router.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let content_type = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = axum::body::to_bytes(resp.into_body(), 1 << 22)
        .await
        .unwrap();
    (
        status,
        content_type,
        String::from_utf8_lossy(&body).into_owned(),
    )
}
