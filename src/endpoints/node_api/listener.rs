//! The node API's TLS listener, with the classes and limits of [`crate::endpoints::listener`]:
//! the handshake within `handshake_timeout` while the connection is in the handshaking class,
//! then a connection with a verified client certificate is authenticated at once, one without
//! is unauthenticated until a request on it passes the gate (a reviewed bearer token). HTTP/1.1
//! with protocol upgrades for exec, attach and port forwarding, whose streams are counted in
//! the streams class and closed after `streamingConnectionIdleTimeout` without traffic.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use super::auth::user_from_certificate;
use super::handlers::PeerUser;
use crate::endpoints::listener::{
    ListenerLimits, Member, ServeError, Start, accept_connections, serve_connection,
};

/// Binds `addr` and serves `router` over TLS until `cancel` fires.
pub(crate) async fn serve_tls(
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
    let what = "node API";
    accept_connections(
        listener,
        limits,
        what,
        cancel,
        move |stream, peer, shared, place| {
            let acceptor = acceptor.clone();
            let router = router.clone();
            let cancel = serve_cancel.clone();
            async move {
                let Some(tls) = handshake(&acceptor, stream, &place, limits, &peer).await else {
                    return;
                };
                // Handshaken: the connection leaves the handshaking class.
                drop(place);
                // rustls has verified the chain against the client CA; the leaf names the user.
                let user = PeerUser(
                    tls.get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|certs| certs.first())
                        .and_then(|leaf| user_from_certificate(leaf)),
                );
                let start = if user.0.is_some() {
                    Start::Authenticated
                } else {
                    Start::Unauthenticated
                };
                let service = hyper::service::service_fn(
                    move |mut req: hyper::Request<hyper::body::Incoming>| {
                        req.extensions_mut().insert(user.clone());
                        router.clone().oneshot(req)
                    },
                );
                serve_connection(TokioIo::new(tls), service, &shared, start, cancel, &peer).await;
            }
        },
    )
    .await
}

/// The TLS handshake, within the handshake timeout and while the connection keeps its
/// handshaking place; `None` when it failed, timed out or was pushed out.
async fn handshake(
    acceptor: &TlsAcceptor,
    stream: TcpStream,
    place: &Member,
    limits: ListenerLimits,
    peer: &str,
) -> Option<TlsStream<TcpStream>> {
    let accept = tokio::time::timeout(limits.handshake_timeout, acceptor.accept(stream));
    tokio::select! {
        result = accept => match result {
            Ok(Ok(tls)) => Some(tls),
            Ok(Err(e)) => {
                tracing::debug!(%peer, error = %e, "node API: TLS handshake failed");
                None
            }
            Err(_) => {
                tracing::debug!(%peer, "node API: TLS handshake timed out");
                None
            }
        },
        _ = place.evicted().cancelled() => {
            tracing::debug!(%peer, "node API: a newer handshake pushed this one out");
            None
        }
    }
}
