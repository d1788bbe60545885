//! The pages the read-only port, the local socket and the node API share, asked of each: every
//! path answers with the status, content type and body it always had, the differences between
//! the servers included (only the node API serves `/healthz/<check>` and ignores `?verbose`;
//! only the local socket serves `/debug/probes` and `/debug/eviction`; the read-only port
//! without a stats provider answers 404 on `/stats/summary` and serves `/metrics/resource` from
//! the page registry). Written before the servers shared their routes, and kept, so that the
//! sharing is shown to change no answer.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::base::health::Health;
use crate::base::metrics::KUBELET;
use crate::endpoints::node_api::handlers::{self, DebugHandlers};
use crate::endpoints::node_api::test_state;
use crate::endpoints::read_only::{self, ListenerLimits, Metrics};
use crate::kubelet::pod_status::published::PodStates;
use crate::kubelet::stats::{HostFiles, StatsProvider};

const TEXT: &str = "text/plain; charset=utf-8";
const PROM: &str = "text/plain; version=0.0.4; charset=utf-8";
const JSON: &str = "application/json";
const VERBOSE: &str = "[+]ping ok\n[+]tasks ok\nhealthz check passed\n";

/// What an answer's body must be.
#[derive(Clone, Copy, Debug)]
enum Text {
    Is(&'static str),
    Has(&'static str),
}

/// (status, content type or "" for none, body).
type Want = (u16, &'static str, Text);

const NOT_FOUND: Want = (404, "", Text::Is(""));
const NOT_ALLOWED: Want = (405, "", Text::Is(""));

/// One request and what each server answers: the read-only port, the read-only port without
/// a stats provider, the local socket, the node API (anyone let in).
struct Row {
    method: &'static str,
    path: &'static str,
    want: [Want; 4],
}

fn all(want: Want) -> [Want; 4] {
    [want; 4]
}

fn rows() -> Vec<Row> {
    use Text::{Has, Is};
    let ok = (200, TEXT, Is("ok"));
    let pods = (200, JSON, Has("\"items\":[]"));
    let summary = (200, JSON, Has("\"nodeName\":\"n1\""));
    let resource = (200, PROM, Has("scrape_error 0"));
    let row = |method, path, want| Row { method, path, want };
    vec![
        row("GET", "/healthz", all(ok)),
        row(
            "GET",
            "/healthz?verbose",
            [
                (200, TEXT, Is(VERBOSE)),
                (200, TEXT, Is(VERBOSE)),
                (200, TEXT, Is(VERBOSE)),
                ok,
            ],
        ),
        row(
            "GET",
            "/healthz/ping",
            [NOT_FOUND, NOT_FOUND, NOT_FOUND, ok],
        ),
        row("GET", "/pods", all(pods)),
        row("GET", "/pods/", all(pods)),
        row("DELETE", "/pods", all(NOT_ALLOWED)),
        row(
            "GET",
            "/stats/summary",
            [summary, NOT_FOUND, summary, summary],
        ),
        row(
            "POST",
            "/stats/summary",
            [summary, NOT_FOUND, summary, summary],
        ),
        row(
            "GET",
            "/stats/summary?only_cpu_and_memory=true",
            [summary, NOT_FOUND, summary, summary],
        ),
        row("GET", "/stats/", all(NOT_FOUND)),
        row("GET", "/metrics", all((200, PROM, Is("m_root 1\n")))),
        row("POST", "/metrics", all(NOT_ALLOWED)),
        row(
            "GET",
            "/metrics/probes",
            all((200, PROM, Is("m_probes 1\n"))),
        ),
        row(
            "GET",
            "/metrics/resource",
            [
                resource,
                (200, PROM, Is("registry resource\n")),
                resource,
                resource,
            ],
        ),
        row("GET", "/metrics/nope", all(NOT_FOUND)),
        row(
            "GET",
            "/debug/probes",
            [
                NOT_FOUND,
                NOT_FOUND,
                (200, PROM, Is("probes page\n")),
                NOT_FOUND,
            ],
        ),
        row(
            "GET",
            "/debug/eviction",
            [
                NOT_FOUND,
                NOT_FOUND,
                (200, PROM, Is("eviction page\n")),
                NOT_FOUND,
            ],
        ),
        row(
            "GET",
            "/configz",
            [NOT_FOUND, NOT_FOUND, NOT_FOUND, (200, JSON, Is("{}"))],
        ),
        row(
            "GET",
            "/runningpods/",
            [
                NOT_FOUND,
                NOT_FOUND,
                NOT_FOUND,
                (200, JSON, Has("\"items\":[]")),
            ],
        ),
        row("GET", "/nope", all(NOT_FOUND)),
    ]
}

fn stats() -> Arc<StatsProvider> {
    Arc::new(StatsProvider::new(
        Arc::new(crate::clients::cri::fake::FakeCri::default()),
        Arc::new(HostFiles::default()),
        "n1".into(),
    ))
}

fn pages() -> (Health, Metrics) {
    let health = Health::default();
    health.register("tasks", || Ok(()));
    let metrics = Metrics::default();
    for (path, text) in [
        ("/metrics", "m_root 1\n"),
        ("/metrics/probes", "m_probes 1\n"),
        ("/metrics/resource", "registry resource\n"),
        ("/debug/probes", "probes page\n"),
        ("/debug/eviction", "eviction page\n"),
    ] {
        metrics.register(path, move || text.to_string());
    }
    (health, metrics)
}

/// (status, content type, body) of a raw HTTP/1.1 answer read to its end.
fn parse(raw: &[u8]) -> (u16, String, String) {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let content_type = head
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-type")
                .then(|| v.trim().to_string())
        })
        .unwrap_or_default();
    (status, content_type, body.to_string())
}

async fn ask<S: AsyncRead + AsyncWrite + Unpin>(
    mut s: S,
    method: &str,
    path: &str,
) -> (u16, String, String) {
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await.unwrap();
    parse(&raw)
}

async fn read_only_port(stats: Option<Arc<StatsProvider>>) -> SocketAddr {
    let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = probe.local_addr().unwrap();
    drop(probe);
    let (health, metrics) = pages();
    read_only::serve_read_only(
        addr,
        health,
        PodStates::default(),
        metrics,
        stats,
        ListenerLimits::default(),
        CancellationToken::new(),
    )
    .await
    .unwrap();
    addr
}

async fn local_socket(path: &Path) {
    let (health, metrics) = pages();
    read_only::serve_local_socket(
        path,
        health,
        PodStates::default(),
        metrics,
        Some(stats()),
        CancellationToken::new(),
    )
    .await
    .unwrap();
}

fn node_api(dir: &Path) -> axum::Router {
    let (health, metrics) = pages();
    let mut state = test_state::test_state(
        crate::endpoints::node_api::auth::Gate::new(
            crate::config::ServerSettings {
                anonymous_enabled: true,
                authorization_mode: crate::config::AuthorizationMode::AlwaysAllow,
                ..Default::default()
            },
            "n1".into(),
            None,
        ),
        dir,
    );
    state.health = health;
    state.metrics = metrics;
    state.debug = DebugHandlers::default();
    handlers::router(state)
}

async fn ask_router(router: &axum::Router, method: &str, path: &str) -> (u16, String, String) {
    let (status, content_type, body) = test_state::ask(router, method, path).await;
    (status.as_u16(), content_type, body)
}

fn check(server: &str, row: &Row, want: Want, got: &(u16, String, String)) {
    let (status, content_type, body) = want;
    let body_ok = match body {
        Text::Is(text) => got.2 == text,
        Text::Has(text) => got.2.contains(text),
    };
    assert!(
        got.0 == status && got.1 == content_type && body_ok,
        "{server}: {} {}: want {want:?}, got {got:?}",
        row.method,
        row.path
    );
}

#[tokio::test]
async fn every_server_answers_the_shared_pages_as_it_always_did() {
    let dir = tempfile::tempdir().unwrap();
    let ro = read_only_port(Some(stats())).await;
    let ro_bare = read_only_port(None).await;
    let socket = dir.path().join("deckhand.sock");
    local_socket(&socket).await;
    let node = node_api(dir.path());
    for row in rows() {
        let tcp = |addr| async move { tokio::net::TcpStream::connect(addr).await.unwrap() };
        let got = ask(tcp(ro).await, row.method, row.path).await;
        check("read-only", &row, row.want[0], &got);
        let got = ask(tcp(ro_bare).await, row.method, row.path).await;
        check("read-only without stats", &row, row.want[1], &got);
        let unix = tokio::net::UnixStream::connect(&socket).await.unwrap();
        let got = ask(unix, row.method, row.path).await;
        check("local socket", &row, row.want[2], &got);
        let got = ask_router(&node, row.method, row.path).await;
        check("node API", &row, row.want[3], &got);
    }
}

/// The requests are counted by server type (`readonly` on the read-only port and the local
/// socket, `readwrite` on the node API), but not the local socket's own `/debug/` pages.
#[tokio::test]
async fn requests_are_counted_by_server_type_but_not_the_debug_pages() {
    let dir = tempfile::tempdir().unwrap();
    let ro = read_only_port(None).await;
    let socket = dir.path().join("deckhand.sock");
    local_socket(&socket).await;
    let node = node_api(dir.path());
    let count = |path: &str, server: &str, long: &str| {
        KUBELET.http_requests.value(&["GET", path, server, long])
    };
    let (ro_before, rw_before) = (
        count("configz", "readonly", "false"),
        count("configz", "readwrite", "false"),
    );
    let debug_before = count("debug", "readonly", "true");

    let tcp = tokio::net::TcpStream::connect(ro).await.unwrap();
    assert_eq!(ask(tcp, "GET", "/configz").await.0, 404);
    assert_eq!(ask_router(&node, "GET", "/configz").await.0, 200);
    let unix = tokio::net::UnixStream::connect(&socket).await.unwrap();
    assert_eq!(ask(unix, "GET", "/debug/probes").await.0, 200);

    assert!(count("configz", "readonly", "false") > ro_before);
    assert!(count("configz", "readwrite", "false") > rw_before);
    assert_eq!(count("debug", "readonly", "true"), debug_before);
}
