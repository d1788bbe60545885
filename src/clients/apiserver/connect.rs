//! A client for the API server from a kubeconfig: client certificates, bearer tokens and CA
//! bundles as kubectl reads them, behind upstream's client-side rate limit.
//!
//! The files a kubeconfig names are read and checked first, so that a missing or unreadable
//! certificate stops the agent with one line naming that file, not an opaque TLS error later.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::problem::cause_chain;
use super::rate_limit::{RateLimitLayer, TokenBucket};

/// How the client behaves.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// `kubeAPIQPS` / `kubeAPIBurst`.
    pub qps: f32,
    pub burst: u32,
    /// How long connecting and sending may take: a hung API server must not stall the
    /// heartbeats behind it.
    pub timeout: Duration,
    /// How long an answer may stay silent: `timeout` for plain requests, longer than a watch
    /// request lasts for a client that watches.
    pub read_timeout: Duration,
}

/// Why no client could be made; each names the file at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("kubeconfig {}: {reason}", path.display())]
    Kubeconfig { path: PathBuf, reason: String },
    #[error("{what} {} (named in kubeconfig {}): {reason}", file.display(), kubeconfig.display())]
    NamedFile {
        kubeconfig: PathBuf,
        what: &'static str,
        file: PathBuf,
        reason: String,
    },
}

/// Reads the kubeconfig at `path` (its current context), checks the files it names, and builds
/// the client. Nothing is sent to the API server yet.
pub async fn connect(path: &Path, options: &ClientOptions) -> Result<kube::Client, ConnectError> {
    let bad = |reason: String| ConnectError::Kubeconfig {
        path: path.to_path_buf(),
        reason,
    };
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| bad(cause_chain(&e)))?;
    check_named_files(path, &kubeconfig)?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| bad(cause_chain(&e)))?;
    config.connect_timeout = Some(options.timeout);
    config.read_timeout = Some(options.read_timeout);
    config.write_timeout = Some(options.timeout);
    let builder =
        kube::client::ClientBuilder::try_from(config).map_err(|e| bad(cause_chain(&e)))?;
    let bucket = TokenBucket::new(options.qps, options.burst);
    Ok(builder.with_layer(&RateLimitLayer::new(bucket)).build())
}

/// Like [`connect`], but the client certificate presented on each new connection is the one
/// `resolver` gives at that moment (the kubeconfig's own client certificate is replaced), so
/// a rotated certificate is used without rebuilding the client: open connections and their
/// watches carry on, and the next connection presents the new certificate.
pub async fn connect_rotating(
    path: &Path,
    options: &ClientOptions,
    resolver: std::sync::Arc<dyn rustls::client::ResolvesClientCert>,
) -> Result<kube::Client, ConnectError> {
    use hyper_util::client::legacy::connect::HttpConnector;
    use kube::client::ConfigExt;
    use tower::ServiceBuilder;

    let bad = |reason: String| ConnectError::Kubeconfig {
        path: path.to_path_buf(),
        reason,
    };
    let kubeconfig = Kubeconfig::read_from(path).map_err(|e| bad(cause_chain(&e)))?;
    check_named_files(path, &kubeconfig)?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| bad(cause_chain(&e)))?;
    let mut tls = config
        .rustls_client_config()
        .map_err(|e| bad(cause_chain(&e)))?;
    tls.client_auth_cert_resolver = resolver;
    // No session resumption: a resumed session keeps the identity of the handshake it
    // resumes, so after a rotation new connections would still be the old certificate.
    tls.resumption = rustls::client::Resumption::disabled();
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    let mut https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        let name = rustls::pki_types::ServerName::try_from(name.clone())
            .map_err(|e| bad(format!("tls-server-name {name:?}: {e}")))?;
        https = https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let https = https.enable_http1().wrap_connector(http);
    let mut connector = hyper_timeout::TimeoutConnector::new(https);
    connector.set_connect_timeout(Some(options.timeout));
    connector.set_read_timeout(Some(options.read_timeout));
    connector.set_write_timeout(Some(options.timeout));
    let http_client: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(connector);
    let auth = config.auth_layer().map_err(|e| bad(cause_chain(&e)))?;
    let service = ServiceBuilder::new()
        .layer(RateLimitLayer::new(TokenBucket::new(
            options.qps,
            options.burst,
        )))
        .layer(config.base_uri_layer())
        .option_layer(config.default_retry.then(|| {
            tower::retry::RetryLayer::new(kube::client::retry::RetryPolicy::server_retry())
        }))
        .option_layer(auth)
        .layer(
            config
                .extra_headers_layer()
                .map_err(|e| bad(cause_chain(&e)))?,
        )
        .map_err(tower::BoxError::from)
        .service(http_client);
    Ok(kube::Client::new(service, config.default_namespace))
}

/// What a kubeconfig file reference holds.
#[derive(Clone, Copy)]
enum Holds {
    Certificates,
    PrivateKey,
    Token,
}

/// Checks every file the current context names: readable, and holding what it should.
fn check_named_files(path: &Path, kubeconfig: &Kubeconfig) -> Result<(), ConnectError> {
    let bad = |reason: String| ConnectError::Kubeconfig {
        path: path.to_path_buf(),
        reason,
    };
    let context_name = kubeconfig
        .current_context
        .as_deref()
        .ok_or_else(|| bad("no current-context is set".into()))?;
    let context = kubeconfig
        .contexts
        .iter()
        .find(|c| c.name == context_name)
        .and_then(|c| c.context.as_ref())
        .ok_or_else(|| bad(format!("current-context {context_name:?} is not defined")))?;
    let cluster = kubeconfig
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .and_then(|c| c.cluster.as_ref())
        .ok_or_else(|| bad(format!("cluster {:?} is not defined", context.cluster)))?;
    let mut files: Vec<(&'static str, &str, Holds)> = Vec::new();
    if let Some(ca) = cluster.certificate_authority.as_deref() {
        files.push(("certificate-authority", ca, Holds::Certificates));
    }
    if let Some(user) = context.user.as_deref() {
        let auth = kubeconfig
            .auth_infos
            .iter()
            .find(|a| a.name == user)
            .and_then(|a| a.auth_info.as_ref())
            .ok_or_else(|| bad(format!("user {user:?} is not defined")))?;
        if let Some(cert) = auth.client_certificate.as_deref() {
            files.push(("client-certificate", cert, Holds::Certificates));
        }
        if let Some(key) = auth.client_key.as_deref() {
            files.push(("client-key", key, Holds::PrivateKey));
        }
        if let Some(token) = auth.token_file.as_deref() {
            files.push(("tokenFile", token, Holds::Token));
        }
    }
    for (what, file, holds) in files {
        check_file(Path::new(file), holds).map_err(|reason| ConnectError::NamedFile {
            kubeconfig: path.to_path_buf(),
            what,
            file: PathBuf::from(file),
            reason: reason.to_string(),
        })?;
    }
    Ok(())
}

/// Why a file a kubeconfig names is unusable.
#[derive(Debug, thiserror::Error)]
enum NamedFileError {
    #[error("{0}")]
    Read(#[from] std::io::Error),
    #[error("holds no PEM certificate")]
    NoCertificate,
    #[error("not a PEM certificate file: {0}")]
    NotCertificates(#[source] rustls::pki_types::pem::Error),
    #[error("holds no PEM private key: {0}")]
    NoPrivateKey(#[source] rustls::pki_types::pem::Error),
    #[error("is empty")]
    EmptyToken,
}

fn check_file(file: &Path, holds: Holds) -> Result<(), NamedFileError> {
    let bytes = std::fs::read(file)?;
    match holds {
        Holds::Certificates => {
            let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(&bytes).collect();
            match certs {
                Ok(certs) if !certs.is_empty() => Ok(()),
                Ok(_) => Err(NamedFileError::NoCertificate),
                Err(e) => Err(NamedFileError::NotCertificates(e)),
            }
        }
        Holds::PrivateKey => PrivateKeyDer::from_pem_slice(&bytes)
            .map(|_| ())
            .map_err(NamedFileError::NoPrivateKey),
        Holds::Token => {
            if String::from_utf8_lossy(&bytes).trim().is_empty() {
                Err(NamedFileError::EmptyToken)
            } else {
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubeconfig(dir: &Path, ca: &str, cert: &str, key: &str) -> PathBuf {
        let path = dir.join("kubeconfig");
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: c\n\
                 clusters:\n- name: k\n  cluster:\n    server: https://127.0.0.1:1\n    certificate-authority: {ca}\n\
                 contexts:\n- name: c\n  context:\n    cluster: k\n    user: u\n\
                 users:\n- name: u\n  user:\n    client-certificate: {cert}\n    client-key: {key}\n"
            ),
        )
        .unwrap();
        path
    }

    async fn connect_err(path: &Path) -> String {
        match connect(path, &options()).await {
            Ok(_) => panic!("{} was accepted", path.display()),
            Err(e) => e.to_string(),
        }
    }

    fn options() -> ClientOptions {
        ClientOptions {
            qps: 50.0,
            burst: 100,
            timeout: Duration::from_secs(1),
            read_timeout: Duration::from_secs(1),
        }
    }

    #[tokio::test]
    async fn each_failure_names_the_file_at_fault() {
        let dir = std::env::temp_dir().join(format!("deckhand-kc-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("garbage.pem"), "not pem at all").unwrap();

        let missing = dir.join("nope.kubeconfig");
        let err = connect_err(&missing).await;
        assert!(
            err.starts_with(&format!("kubeconfig {}:", missing.display())),
            "{err}"
        );

        let path = kubeconfig(&dir, "missing-ca.crt", "garbage.pem", "garbage.pem");
        let err = connect_err(&path).await;
        assert!(
            err.starts_with(&format!(
                "certificate-authority {}",
                dir.join("missing-ca.crt").display()
            )),
            "{err}"
        );
        assert!(err.contains("No such file"), "{err}");

        std::fs::write(dir.join("yaml.kubeconfig"), "clusters: [").unwrap();
        let err = connect_err(&dir.join("yaml.kubeconfig")).await;
        assert!(err.starts_with("kubeconfig "), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
