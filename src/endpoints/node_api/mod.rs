//! The node API on port 10250 (`--port`, `--address`): HTTPS with client-certificate and
//! token authentication and SubjectAccessReview authorization, serving what the API server
//! and operators ask a node for: `/pods`, `/runningpods/`, `/healthz`, `/configz`,
//! `/metrics…`, `/stats/summary`, `/containerLogs/…` (`kubectl logs`), `/exec`, `/attach`, `/portForward`
//! (`kubectl exec`/`attach`/`port-forward`).
//!
//! * [`attributes`]: request path and method → verb and `nodes` subresources (pure).
//! * [`auth`]: who is asking and may they (pure decisions over a [`review::Reviewer`]).
//! * [`review`]: TokenReview and SubjectAccessReview through the API server.
//! * [`cache`]: the reviews' answer cache.
//! * [`tls`]: serving certificate (files, self-signed, or a CSR's in a swappable slot) and
//!   the client CA.
//! * [`listener`]: the TLS accept loop with the listener limits.
//! * [`handlers`]: the router (the shared pages of [`crate::endpoints::routes`] and the node
//!   API's own, behind the gate) and the node API's own endpoints; [`logs`]: CRI log files
//!   ([`flush_each`]: their bodies leave a chunk at a time);
//!   [`streaming`]: the upgrade proxy to the runtime's streaming server; [`configz`]:
//!   `/configz`; [`node_logs`]: `/logs/`.

pub mod attributes;
pub mod auth;
pub(crate) mod cache;
pub(crate) mod configz;
pub(crate) mod flush_each;
pub mod handlers;
pub(crate) mod listener;
pub mod log_read;
pub mod logs;
pub mod node_logs;
pub(crate) mod review;
pub(crate) mod streaming;
#[cfg(test)]
pub(crate) mod test_state;
pub(crate) mod tls;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

pub use handlers::NodeApiState;
pub use tls::ServingSlot;

use crate::endpoints::listener::{ListenerLimits, ServeError};

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
    settings: &crate::config::ServerSettings,
    limits: ListenerLimits,
    cancel: CancellationToken,
) -> Result<tokio::task::JoinHandle<()>, NodeApiError> {
    let config = tls::server_config(slot, settings)?;
    let router = handlers::router(state);
    Ok(listener::serve_tls(addr, router, Arc::new(config), limits, cancel).await?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::test_ca::TestCa;
    use crate::config::{AuthorizationMode, ServerSettings};
    use crate::kubelet::certificate::Credentials;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn start(
        ca: &TestCa,
        dir: &std::path::Path,
        mode: AuthorizationMode,
    ) -> (u16, CancellationToken) {
        let ca_file = dir.join("ca.crt");
        std::fs::write(&ca_file, &ca.pem).unwrap();
        let serving = Credentials::from_pem(ca.server("node").pem().as_bytes()).unwrap();
        let gate = auth::Gate::new(
            ServerSettings {
                authorization_mode: mode,
                ..Default::default()
            },
            "n1".into(),
            None,
        );
        let state = test_state::test_state(gate, dir);
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cancel = CancellationToken::new();
        serve(
            SocketAddr::from(([127, 0, 0, 1], port)),
            state,
            ServingSlot::with(serving),
            &ServerSettings {
                client_ca_file: Some(ca_file),
                ..Default::default()
            },
            ListenerLimits::default(),
            cancel.clone(),
        )
        .await
        .unwrap();
        (port, cancel)
    }

    /// GET `path` over TLS trusting `ca`, presenting `client` if given: the raw answer, or
    /// None when the handshake fails.
    async fn get(port: u16, ca: &TestCa, client: Option<&str>, path: &str) -> Option<String> {
        get_with(port, ca, client, path, rustls::DEFAULT_VERSIONS).await
    }

    async fn get_with(
        port: u16,
        ca: &TestCa,
        client: Option<&str>,
        path: &str,
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> Option<String> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca.pem.as_bytes()).unwrap())
            .unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(roots);
        let config = match client {
            Some(pem) => builder
                .with_client_auth_cert(
                    vec![CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()],
                    PrivateKeyDer::from_pem_slice(pem.as_bytes()).unwrap(),
                )
                .unwrap(),
            None => builder.with_no_client_auth(),
        };
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        let name = ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
        let mut tls = connector.connect(name, tcp).await.ok()?;
        tls.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: n1\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .ok()?;
        let mut out = Vec::new();
        tls.read_to_end(&mut out).await.ok()?;
        Some(String::from_utf8_lossy(&out).into_owned())
    }

    #[tokio::test]
    async fn client_certificates_from_the_client_ca_authenticate() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = TestCa::new("cluster-ca");
        let (port, cancel) = start(&cluster, dir.path(), AuthorizationMode::AlwaysAllow).await;
        let apiserver = cluster
            .client("kube-apiserver-kubelet-client", Some("system:masters"))
            .pem();
        let ok = get(port, &cluster, Some(&apiserver), "/healthz")
            .await
            .unwrap();
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        assert!(ok.ends_with("\r\n\r\nok"), "{ok}");
        let configz = get(port, &cluster, Some(&apiserver), "/configz")
            .await
            .unwrap();
        assert!(configz.contains("application/json"), "{configz}");

        let anonymous = get(port, &cluster, None, "/healthz").await.unwrap();
        assert!(anonymous.starts_with("HTTP/1.1 401"), "{anonymous}");
        assert!(anonymous.ends_with("\r\n\r\nUnauthorized"), "{anonymous}");

        // A certificate from another CA is refused in the handshake.
        let stranger = TestCa::new("other-ca").client("mallory", None).pem();
        let refused = get(port, &cluster, Some(&stranger), "/healthz").await;
        assert!(
            refused.is_none() || refused.as_deref().is_some_and(|r| r.is_empty()),
            "{refused:?}"
        );
        cancel.cancel();
    }

    #[tokio::test]
    async fn without_an_api_server_webhook_authorization_refuses() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = TestCa::new("cluster-ca");
        let (port, cancel) = start(&cluster, dir.path(), AuthorizationMode::Webhook).await;
        let user = cluster.client("alice", None).pem();
        let got = get(port, &cluster, Some(&user), "/pods").await.unwrap();
        assert!(got.starts_with("HTTP/1.1 403"), "{got}");
        assert!(
            got.ends_with(
                "Forbidden (user=alice, verb=get, resource=nodes, subresource(s)=[pods proxy])\n"
            ),
            "{got}"
        );
        cancel.cancel();
    }

    #[tokio::test]
    async fn tls_min_version_13_refuses_tls12_clients() {
        let cluster = TestCa::new("cluster-ca");
        let slot = ServingSlot::with(
            Credentials::from_pem(cluster.server("node").pem().as_bytes()).unwrap(),
        );
        let settings = ServerSettings {
            tls_min_version: crate::config::server::TlsMinVersion::Tls13,
            ..Default::default()
        };
        let config = tls::server_config(slot, &settings).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cancel = CancellationToken::new();
        let router = axum::Router::new().route("/healthz", axum::routing::get(|| async { "ok" }));
        listener::serve_tls(
            SocketAddr::from(([127, 0, 0, 1], port)),
            router,
            Arc::new(config),
            ListenerLimits::default(),
            cancel.clone(),
        )
        .await
        .unwrap();
        let old = get_with(port, &cluster, None, "/healthz", &[&rustls::version::TLS12]).await;
        assert_eq!(old, None, "a TLS 1.2 client is refused");
        let new = get_with(port, &cluster, None, "/healthz", &[&rustls::version::TLS13]).await;
        assert!(new.unwrap().starts_with("HTTP/1.1 200"));
        cancel.cancel();
    }

    #[tokio::test]
    async fn an_empty_serving_slot_refuses_handshakes_until_filled() {
        let dir = tempfile::tempdir().unwrap();
        let cluster = TestCa::new("cluster-ca");
        let slot = ServingSlot::default();
        let config = tls::server_config(slot.clone(), &ServerSettings::default()).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cancel = CancellationToken::new();
        let router = axum::Router::new().route("/healthz", axum::routing::get(|| async { "ok" }));
        listener::serve_tls(
            SocketAddr::from(([127, 0, 0, 1], port)),
            router,
            Arc::new(config),
            ListenerLimits::default(),
            cancel.clone(),
        )
        .await
        .unwrap();
        assert_eq!(get(port, &cluster, None, "/healthz").await, None);
        slot.set(Credentials::from_pem(cluster.server("node").pem().as_bytes()).unwrap());
        let got = get(port, &cluster, None, "/healthz").await.unwrap();
        assert!(got.starts_with("HTTP/1.1 200"), "{got}");
        drop(dir);
        cancel.cancel();
    }
}
