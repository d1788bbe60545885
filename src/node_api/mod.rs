//! The node API on port 10250 (`--port`, `--address`): HTTPS with client-certificate and
//! token authentication and SubjectAccessReview authorization, serving what the API server
//! and operators ask a node for: `/pods`, `/runningpods/`, `/healthz`, `/configz`,
//! `/metrics…`, `/containerLogs/…` (`kubectl logs`), `/exec`, `/attach`, `/portForward`
//! (`kubectl exec`/`attach`/`port-forward`).
//!
//! * [`attributes`]: request path and method → verb and `nodes` subresources (pure).
//! * [`auth`]: who is asking and may they (pure decisions over a [`review::Reviewer`]).
//! * [`review`]: TokenReview and SubjectAccessReview through the API server.
//! * [`cache`]: the reviews' answer cache.
//! * [`tls`]: serving certificate (files, self-signed, or a CSR's in a swappable slot) and
//!   the client CA.
//! * [`listener`]: the TLS accept loop with the listener limits.
//! * [`handlers`]: the endpoints; [`logs`]: CRI log files; [`streaming`]: the upgrade proxy
//!   to the runtime's streaming server; [`configz`]: `/configz`.

pub mod attributes;
pub mod auth;
pub mod cache;
pub mod configz;
pub mod handlers;
pub mod listener;
pub mod logs;
pub mod review;
pub mod streaming;
pub mod tls;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

pub use handlers::NodeApiState;
pub use tls::ServingSlot;

use crate::server::{ListenerLimits, ServeError};

/// Why the node API could not start.
#[derive(Debug, thiserror::Error)]
pub enum NodeApiError {
    #[error("node API TLS: {0}")]
    Tls(#[from] tls::TlsError),
    #[error(transparent)]
    Serve(#[from] ServeError),
}

/// Serves the node API on `addr` with the certificate of `slot` until `cancel` fires.
pub async fn serve(
    addr: SocketAddr,
    state: NodeApiState,
    slot: ServingSlot,
    client_ca: Option<&std::path::Path>,
    limits: ListenerLimits,
    cancel: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, NodeApiError> {
    let config = tls::server_config(slot, client_ca)?;
    let router = handlers::router(state);
    Ok(listener::serve_tls(addr, router, Arc::new(config), limits, cancel).await?)
}
