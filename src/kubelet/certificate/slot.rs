//! The current client key pair, shared between the rotation loop (which replaces it) and
//! the TLS configuration of every API client (which presents it on each new connection).

use std::sync::{Arc, RwLock};

use rustls::SignatureScheme;
use rustls::client::ResolvesClientCert;
use rustls::sign::CertifiedKey;

use super::Credentials;

/// A shared, replaceable [`Credentials`].
#[derive(Debug, Clone)]
pub struct CertSlot(Arc<RwLock<Arc<Credentials>>>);

impl CertSlot {
    pub fn new(credentials: Credentials) -> CertSlot {
        CertSlot(Arc::new(RwLock::new(Arc::new(credentials))))
    }

    /// The current credentials.
    pub fn get(&self) -> Arc<Credentials> {
        match self.0.read() {
            Ok(g) => g.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Replaces the credentials: connections made from now on present the new certificate;
    /// open connections (and the watches on them) stay as they are.
    pub fn set(&self, credentials: Credentials) {
        let new = Arc::new(credentials);
        match self.0.write() {
            Ok(mut g) => *g = new,
            Err(poisoned) => *poisoned.into_inner() = new,
        }
    }

    /// A rustls client-certificate resolver reading this slot.
    pub fn resolver(&self) -> Arc<dyn ResolvesClientCert> {
        Arc::new(SlotResolver(self.clone()))
    }
}

#[derive(Debug)]
struct SlotResolver(CertSlot);

impl ResolvesClientCert for SlotResolver {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        let current = self.0.get();
        // Offer the certificate only if the server accepts a scheme our key can sign with.
        current.key.key.choose_scheme(sigschemes)?;
        Some(current.key.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::test_ca::TestCa;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use std::time::Duration;

    fn options() -> crate::clients::apiserver::ClientOptions {
        crate::clients::apiserver::ClientOptions {
            qps: 50.0,
            burst: 100,
            timeout: Duration::from_secs(5),
            read_timeout: Duration::from_secs(5),
        }
    }

    /// A TLS server that demands a client certificate, records each connection's client
    /// subject, and answers one request per connection (`Connection: close`).
    async fn recording_server(
        pki: &TestCa,
    ) -> (u16, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
        use std::sync::{Arc, Mutex};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let server = pki.server("server");
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(pki.pem.as_bytes()).unwrap())
            .unwrap();
        let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
            .build()
            .unwrap();
        let config = rustls::ServerConfig::builder()
            .with_client_cert_verifier(verifier)
            .with_single_cert(
                vec![CertificateDer::from(server.der)],
                PrivateKeyDer::from_pem_slice(server.key.as_bytes()).unwrap(),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let record = record.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let subject = tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .and_then(|c| {
                            crate::kubelet::certificate::credentials::certificate_validity(c).ok()
                        })
                        .map(|(_, _, s)| s)
                        .unwrap_or_default();
                    record.lock().unwrap().push(subject);
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 1024];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match tls.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let _ = tls
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok",
                        )
                        .await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        (port, seen)
    }

    #[tokio::test]
    async fn a_rotated_certificate_is_presented_on_new_connections() {
        let pki = TestCa::new("test-ca");
        let (port, seen) = recording_server(&pki).await;
        let dir = tempfile::tempdir().unwrap();
        let first_pem = pki.client("system:node:first", None).pem();
        let second_pem = pki.client("system:node:second", None).pem();
        std::fs::write(dir.path().join("ca.crt"), &pki.pem).unwrap();
        std::fs::write(dir.path().join("current.pem"), &first_pem).unwrap();
        let path = dir.path().join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
                 clusters:\n- name: k\n  cluster:\n    server: https://127.0.0.1:{port}\n    certificate-authority: ca.crt\n\
                 contexts:\n- name: c\n  context:\n    cluster: k\n    user: u\n\
                 users:\n- name: u\n  user:\n    client-certificate: current.pem\n    client-key: current.pem\n"
            ),
        )
        .unwrap();
        let slot = CertSlot::new(Credentials::from_pem(first_pem.as_bytes()).unwrap());
        let client =
            crate::clients::apiserver::connect_rotating(&path, &options(), slot.resolver())
                .await
                .unwrap();
        let get = || async {
            client
                .request_text(http::Request::get("/version").body(Vec::new()).unwrap())
                .await
                .unwrap()
        };
        assert_eq!(get().await, "ok");
        slot.set(Credentials::from_pem(second_pem.as_bytes()).unwrap());
        assert_eq!(get().await, "ok");
        assert_eq!(
            *seen.lock().unwrap(),
            ["CN=system:node:first", "CN=system:node:second"],
            "each connection presents the slot's certificate of the moment"
        );
    }
}
