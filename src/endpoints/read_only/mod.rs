//! HTTP endpoints: the healthz port, the read-only port and the local socket.
//!
//! The ports are plain HTTP on the addresses the configuration names. The read-only port serves
//! what upstream's does for the parts Deckhand has: `/pods` (a `v1` `PodList` with status),
//! `/healthz`, `/metrics…`, `/stats/summary` and `/metrics/resource`. The local socket
//! (`<root-dir>/deckhand.sock`, mode 0600) serves the same pages to root on the node, whether or
//! not the read-only port is on, plus `/debug/probes` (what the `deckhand pods` command reads)
//! and `/debug/eviction` (the eviction manager's last round).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::net::{TcpListener, UnixListener};
use tokio_util::sync::CancellationToken;

use crate::endpoints::listener::{Acceptor, Start, accept_connections, serve_connection};
use crate::endpoints::routes::{self, Healthz, Pages, count_request, metrics_page};

use crate::base::health::Health;
use crate::kubelet::pod_status::published::PodStates;

pub(crate) use crate::endpoints::listener::{ListenerLimits, ServeError};
/// The page registry lives with the shared pages; it is named here too, where the daemon and
/// the pages' users have always found it.
pub(crate) use crate::endpoints::routes::Metrics;

/// The node's usage, as the read-only port serves it (upstream serves `/stats/summary` and
/// `/metrics/resource` there without authentication, like `/pods`).
pub(crate) type StatsProvider = crate::kubelet::stats::StatsProvider;

/// Binds `addr` and serves `router` until `cancel` fires. Binding errors come back at once.
async fn serve(
    what: &'static str,
    addr: SocketAddr,
    router: Router,
    limits: ListenerLimits,
    cancel: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, ServeError> {
    let listener = TcpListener::bind(addr).await.map_err(|source| ServeError {
        what,
        addr: addr.to_string(),
        source,
    })?;
    let local = listener.local_addr().unwrap_or(addr);
    tracing::info!(%local, "serving the {what}");
    Ok(tokio::spawn(accept_loop(
        what, listener, router, limits, cancel,
    )))
}

/// Accepts plain HTTP connections and serves each on its own task. Nobody authenticates
/// here: every connection is in the unauthenticated class, under its timeouts and cap.
async fn accept_loop(
    what: &'static str,
    listener: impl Acceptor,
    router: Router,
    limits: ListenerLimits,
    cancel: CancellationToken,
) {
    let serve_cancel = cancel.clone();
    accept_connections(
        listener,
        limits,
        what,
        cancel,
        move |stream, peer, shared, place| {
            let service = TowerToHyperService::new(router.clone());
            let cancel = serve_cancel.clone();
            async move {
                let io = TokioIo::new(stream);
                serve_connection(
                    io,
                    service,
                    &shared,
                    Start::Handshaking(place),
                    cancel,
                    &peer,
                )
                .await
            }
        },
    )
    .await
}

/// Serves `GET /healthz` on the healthz address.
pub(crate) async fn serve_healthz(
    addr: SocketAddr,
    health: Health,
    pods: PodStates,
    cancel: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, ServeError> {
    let router = routes::healthz_alone().with_state(Pages {
        health,
        pods,
        metrics: Metrics::default(),
        stats: None,
    });
    serve(
        "healthz endpoint",
        addr,
        router,
        ListenerLimits::default(),
        cancel,
    )
    .await
}

/// Serves the read-only API: `GET /pods`, `GET /healthz`, `GET /metrics/...`.
pub(crate) async fn serve_read_only(
    addr: SocketAddr,
    health: Health,
    pods: PodStates,
    metrics: Metrics,
    stats: Option<Arc<StatsProvider>>,
    limits: ListenerLimits,
    cancel: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, ServeError> {
    let router = read_only_router().with_state(Pages {
        health,
        pods,
        metrics,
        stats,
    });
    serve("read-only API", addr, router, limits, cancel).await
}

/// The shared pages (`/pods`, `/healthz`, `/stats/summary`, `/metrics/...`), counted in
/// upstream's `kubelet_http_*` metrics as server type `readonly`.
fn read_only_router() -> Router<Pages> {
    routes::common(Healthz::Verbose).layer(axum::middleware::from_fn(|req, next| {
        count_request("readonly", req, next)
    }))
}

/// Where the local socket lives under the root dir.
pub(crate) fn local_socket_path(root_dir: &std::path::Path) -> std::path::PathBuf {
    root_dir.join("deckhand.sock")
}

/// Serves the read-only pages and `/debug/probes` (rendered from the page registry) on a Unix
/// socket at `path`, readable and writable by its owner only: pod specs and probe output are
/// not for every local user. A socket left by an earlier run is replaced.
pub(crate) async fn serve_local_socket(
    path: &std::path::Path,
    health: Health,
    pods: PodStates,
    metrics: Metrics,
    stats: Option<Arc<StatsProvider>>,
    cancel: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, ServeError> {
    use std::os::unix::fs::PermissionsExt;
    let failed = |source| ServeError {
        what: "local socket",
        addr: path.display().to_string(),
        source,
    };
    use std::os::unix::fs::FileTypeExt;
    // A socket left by an earlier run is replaced; anything else there is not ours to delete.
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => {
            std::fs::remove_file(path).map_err(failed)?;
        }
        Ok(_) => {
            return Err(failed(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                "something other than a socket is in the way",
            )));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(failed(e)),
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(failed)?;
    }
    // Connecting needs write permission on the socket; it is narrowed to the owner before
    // anything is served on it.
    let listener = UnixListener::bind(path).map_err(failed)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(failed)?;
    tracing::info!(path = %path.display(), "serving the local socket");
    // Added after the counting layer: the debug pages are not counted, as they never were.
    let router = read_only_router()
        .route("/debug/probes", get(metrics_page))
        .route("/debug/eviction", get(metrics_page))
        .with_state(Pages {
            health,
            pods,
            metrics,
            stats,
        });
    Ok(tokio::spawn(accept_loop(
        "local socket",
        listener,
        router,
        ListenerLimits::default(),
        cancel,
    )))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;

    fn quick_limits(max_connections: usize) -> ListenerLimits {
        ListenerLimits {
            handshake_timeout: Duration::from_millis(300),
            unauthenticated_idle_timeout: Duration::from_millis(300),
            max_handshaking: max_connections,
            max_unauthenticated: max_connections,
            ..ListenerLimits::default()
        }
    }

    async fn serve_on(limits: ListenerLimits) -> (SocketAddr, CancellationToken) {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        let cancel = CancellationToken::new();
        serve_read_only(
            addr,
            Health::default(),
            PodStates::default(),
            Metrics::default(),
            None,
            limits,
            cancel.clone(),
        )
        .await
        .expect("listening");
        (addr, cancel)
    }

    /// Reads until the peer closes; returns what was read.
    async fn read_to_close(stream: &mut TcpStream, within: Duration) -> Option<String> {
        let mut buf = Vec::new();
        tokio::time::timeout(within, stream.read_to_end(&mut buf))
            .await
            .ok()?
            .ok()?;
        Some(String::from_utf8_lossy(&buf).into_owned())
    }

    #[tokio::test]
    async fn a_client_that_sends_no_headers_is_cut_off() {
        let (addr, cancel) = serve_on(quick_limits(8)).await;
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let began = Instant::now();
        let got = read_to_close(&mut silent, Duration::from_secs(10)).await;
        assert!(got.is_some(), "the server never closed a silent connection");
        assert!(began.elapsed() < Duration::from_secs(10));

        // Half a request line, then nothing: also closed.
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /healthz HT").await.unwrap();
        assert!(
            read_to_close(&mut slow, Duration::from_secs(10))
                .await
                .is_some()
        );
        cancel.cancel();
    }

    #[tokio::test]
    async fn an_idle_kept_alive_connection_is_closed() {
        let (addr, cancel) = serve_on(quick_limits(8)).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        let got = read_to_close(&mut s, Duration::from_secs(10))
            .await
            .expect("the idle connection is closed after the answer");
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
        assert!(got.ends_with("ok"), "{got}");
        cancel.cancel();
    }

    #[tokio::test]
    async fn a_newcomer_over_the_cap_pushes_the_oldest_idle_connection_out() {
        // Long timeouts: only the cap can end the idle connections here.
        let (addr, cancel) = serve_on(ListenerLimits {
            handshake_timeout: Duration::from_secs(60),
            unauthenticated_idle_timeout: Duration::from_secs(60),
            max_handshaking: 2,
            max_unauthenticated: 2,
            ..ListenerLimits::default()
        })
        .await;
        let mut idle = Vec::new();
        for _ in 0..2 {
            idle.push(TcpStream::connect(addr).await.unwrap());
        }
        // The third is served at once, and the oldest idle one is closed.
        let began = Instant::now();
        let mut third = TcpStream::connect(addr).await.unwrap();
        third
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let got = read_to_close(&mut third, Duration::from_secs(10))
            .await
            .expect("served although the cap is reached");
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
        assert!(
            began.elapsed() < Duration::from_secs(5),
            "{:?}",
            began.elapsed()
        );
        assert!(
            read_to_close(&mut idle[0], Duration::from_secs(5))
                .await
                .is_some(),
            "the oldest idle connection was pushed out"
        );
        cancel.cancel();
    }

    #[tokio::test]
    async fn the_local_socket_replaces_an_old_socket_but_never_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("root/deckhand.sock");
        let serve = |cancel: CancellationToken| {
            serve_local_socket(
                &path,
                Health::default(),
                PodStates::default(),
                Metrics::default(),
                None,
                cancel,
            )
        };
        // A missing root dir is made; a socket from an earlier run is replaced.
        let first = CancellationToken::new();
        serve(first.clone()).await.unwrap();
        first.cancel();
        let second = CancellationToken::new();
        serve(second.clone()).await.unwrap();
        second.cancel();
        // Something else in the way is left alone.
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, "precious").unwrap();
        let err = serve(CancellationToken::new())
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("other than a socket"), "{err}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "precious");
    }

    #[tokio::test]
    async fn metrics_root_page_is_served() {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = probe.local_addr().unwrap();
        drop(probe);
        let cancel = CancellationToken::new();
        let metrics = Metrics::default();
        metrics.register("/metrics", || "deckhand_up 1\n".to_string());
        serve_read_only(
            addr,
            Health::default(),
            PodStates::default(),
            metrics,
            None,
            quick_limits(4),
            cancel.clone(),
        )
        .await
        .unwrap();
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let got = read_to_close(&mut s, Duration::from_secs(5)).await.unwrap();
        assert!(got.ends_with("deckhand_up 1\n"), "{got}");
        cancel.cancel();
    }
}
