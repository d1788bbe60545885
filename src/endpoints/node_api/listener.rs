//! The node API's TLS listener: the same limits as the other listeners (headers within
//! `header_read_timeout`, at most `max_connections` at once, none served for longer than
//! `max_connection_age`), a TLS handshake that must also finish within the header
//! timeout, and HTTP/1.1 with protocol upgrades for exec, attach and port forwarding.
//!
//! An upgraded stream leaves the connection's accounting once it switched protocols: it
//! lives as long as the exec session does, as upstream's.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use super::auth::user_from_certificate;
use super::handlers::PeerUser;
use crate::endpoints::read_only::{
    ListenerLimits, ServeError, accept_connections, serve_connection,
};

/// Binds `addr` and serves `router` over TLS until `cancel` fires.
pub async fn serve_tls(
    addr: SocketAddr,
    router: Router,
    tls: Arc<rustls::ServerConfig>,
    limits: ListenerLimits,
    cancel: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, ServeError> {
    let what = "node API";
    let listener = TcpListener::bind(addr).await.map_err(|source| ServeError {
        what,
        addr: addr.to_string(),
        source,
    })?;
    let local = listener.local_addr().unwrap_or(addr);
    tracing::info!(%local, "serving the node API (HTTPS)");
    Ok(tokio::spawn(accept_loop(
        listener,
        router,
        TlsAcceptor::from(tls),
        limits,
        cancel,
    )))
}

async fn accept_loop(
    listener: TcpListener,
    router: Router,
    acceptor: TlsAcceptor,
    limits: ListenerLimits,
    cancel: CancellationToken,
) {
    let serve_cancel = cancel.clone();
    accept_connections("node API", listener, limits, cancel, move |stream, peer| {
        let acceptor = acceptor.clone();
        let router = router.clone();
        let cancel = serve_cancel.clone();
        async move {
            let tls =
                match tokio::time::timeout(limits.header_read_timeout, acceptor.accept(stream))
                    .await
                {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "node API: TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "node API: TLS handshake timed out");
                        return;
                    }
                };
            // rustls has verified the chain against the client CA; the leaf names the user.
            let user = PeerUser(
                tls.get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|certs| certs.first())
                    .and_then(|leaf| user_from_certificate(leaf)),
            );
            let service = hyper::service::service_fn(
                move |mut req: hyper::Request<hyper::body::Incoming>| {
                    req.extensions_mut().insert(user.clone());
                    router.clone().oneshot(req)
                },
            );
            serve_connection(TokioIo::new(tls), service, limits, cancel, &peer).await;
        }
    })
    .await
}
