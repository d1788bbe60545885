//! The HTTP source: `GET staticPodURL` at start and every `httpCheckFrequency`. The body is a
//! Pod or a PodList / List (YAML or JSON). A failed fetch, a body that does not decode, and an
//! empty body keep the last good set; only a valid (possibly empty) Pod list replaces it.
//!
//! `https://` URLs are verified against the system's CA roots, found the way Go (and so
//! upstream's kubelet, which has no flag for a manifest-URL CA) finds them: the file named by
//! `SSL_CERT_FILE`, else the first of the usual distribution bundles
//! (`/etc/ssl/certs/ca-certificates.crt` on Debian). To trust a private CA, add it to the
//! system bundle or point `SSL_CERT_FILE` at a bundle that holds it (e.g. in the unit's
//! `Environment=`).

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use k8s_openapi::api::core::v1::Pod;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::defaults::ManifestOrigin;
use super::manifest::MAX_MANIFEST_BYTES;
use super::{
    NodeSecurity, SOURCE_HTTP, SourceProblems, SourceSnapshot, full_name, load_static_pods,
};
use crate::base::clock;

/// Longest one fetch may take (shorter when the period is shorter).
const MAX_FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Where Go looks for the system CA bundle on Linux, in order (after `SSL_CERT_FILE`).
pub(crate) const SYSTEM_CA_FILES: &[&str] = &[
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/pki/tls/cacert.pem",
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

/// What one fetch produced.
#[derive(Debug)]
pub(crate) enum FetchOutcome {
    /// A new set of pods (possibly with a non-fatal problem, e.g. a duplicate pod dropped).
    Pods {
        pods: Vec<Pod>,
        unknown_fields: Vec<String>,
        problem: Option<String>,
    },
    /// Nothing usable; the previous set stays.
    Failed(String),
    /// The URL can never work as configured (e.g. `ftp://`): report it and run no pods.
    Unsupported(String),
}

/// Why TLS for the manifest URL could not be set up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TlsSetupError {
    #[error("no CA bundle found (looked at $SSL_CERT_FILE and {})", SYSTEM_CA_FILES.join(", "))]
    NoBundle,
    #[error("{path}: cannot read CA bundle: {reason}")]
    Unreadable { path: String, reason: String },
    #[error("{path}: no usable CA certificate in the bundle")]
    Empty { path: String },
    #[error("TLS configuration: {0}")]
    Config(String),
}

/// The CA bundle to trust: `SSL_CERT_FILE` when set, else the first system bundle present.
pub(crate) fn system_ca_file() -> Result<PathBuf, TlsSetupError> {
    if let Some(file) = std::env::var_os("SSL_CERT_FILE").filter(|f| !f.is_empty()) {
        return Ok(PathBuf::from(file));
    }
    SYSTEM_CA_FILES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or(TlsSetupError::NoBundle)
}

/// A TLS client configuration (ring provider) trusting the PEM certificates in `ca_file`.
/// Certificates in the bundle that do not parse are skipped, as Go does.
pub(crate) fn tls_config_from_ca_file(
    ca_file: &Path,
) -> Result<Arc<rustls::ClientConfig>, TlsSetupError> {
    let path = ca_file.display().to_string();
    let certs = CertificateDer::pem_file_iter(ca_file)
        .map_err(|e| TlsSetupError::Unreadable {
            path: path.clone(),
            reason: e.to_string(),
        })?
        .filter_map(Result::ok);
    let mut roots = rustls::RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(TlsSetupError::Empty { path });
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsSetupError::Config(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The parts of the manifest URL a fetch needs.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Target {
    https: bool,
    /// Host as written, without IPv6 brackets (the TLS server name).
    host: String,
    /// `host:port` to dial (IPv6 in brackets).
    dial: String,
    /// The `Host` header: the URL's authority without user info.
    authority: String,
    path_and_query: String,
}

/// Why a URL can never be fetched.
#[derive(Debug, thiserror::Error)]
enum TargetError {
    #[error("{url}: invalid URL: {source}")]
    Invalid {
        url: String,
        #[source]
        source: hyper::http::uri::InvalidUri,
    },
    #[error("{0}: only http:// and https:// manifest URLs are supported")]
    Scheme(String),
    #[error("{0}: the URL has no host")]
    NoHost(String),
}

/// Why one fetch of the manifest URL failed.
#[derive(Debug, thiserror::Error)]
enum FetchError {
    #[error("GET {url}: invalid request: {source}")]
    Request {
        url: String,
        #[source]
        source: hyper::http::Error,
    },
    #[error("GET {url}: {source}")]
    Failed {
        url: String,
        #[source]
        source: ExchangeError,
    },
    #[error("GET {url}: timed out after {timeout:?}")]
    TimedOut { url: String, timeout: Duration },
}

/// Why the exchange with the server failed (the server's side of a failed fetch).
#[derive(Debug, thiserror::Error)]
enum ExchangeError {
    #[error("dial {addr}: {source}")]
    Dial {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Tls(#[from] TlsSetupError),
    #[error("bad TLS server name {host:?}: {source}")]
    ServerName {
        host: String,
        #[source]
        source: rustls::pki_types::InvalidDnsNameError,
    },
    #[error("TLS handshake: {}", error_chain(.0))]
    Handshake(#[source] std::io::Error),
    /// The HTTP exchange itself, shown with its whole chain of causes.
    #[error("{}", error_chain(.0))]
    Http(#[source] hyper::Error),
    #[error("HTTP {0}")]
    Status(hyper::StatusCode),
    #[error("reading body: {0}")]
    Body(#[source] Box<dyn std::error::Error + Send + Sync>),
}

fn parse_target(url: &str) -> Result<Target, TargetError> {
    let uri: hyper::Uri = url.parse().map_err(|source| TargetError::Invalid {
        url: url.to_string(),
        source,
    })?;
    let https = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => return Err(TargetError::Scheme(url.to_string())),
    };
    let authority = uri
        .authority()
        .ok_or_else(|| TargetError::NoHost(url.to_string()))?;
    let raw_host = authority.host();
    if raw_host.is_empty() {
        return Err(TargetError::NoHost(url.to_string()));
    }
    let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
    let host = raw_host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let host_part = authority
        .as_str()
        .rsplit_once('@')
        .map_or(authority.as_str(), |(_, h)| h);
    Ok(Target {
        https,
        dial: format!("{raw_host}:{port}"),
        host,
        authority: host_part.to_string(),
        path_and_query: uri
            .path_and_query()
            .map_or_else(|| "/".to_string(), |p| p.as_str().to_string()),
    })
}

/// The HTTP source's state between fetches.
pub(crate) struct HttpSource {
    url: String,
    headers: BTreeMap<String, Vec<String>>,
    node_name: String,
    security: Arc<NodeSecurity>,
    period: Duration,
    problems: SourceProblems,
    /// TLS for an `https://` URL: the configuration, or why there is none.
    tls: Option<Result<Arc<rustls::ClientConfig>, TlsSetupError>>,
    last_problem: Option<String>,
    last_unknown: Vec<String>,
}

impl HttpSource {
    pub(crate) fn new(
        url: String,
        headers: BTreeMap<String, Vec<String>>,
        node_name: String,
        security: Arc<NodeSecurity>,
        period: Duration,
        problems: SourceProblems,
    ) -> Self {
        let tls = url
            .starts_with("https://")
            .then(|| system_ca_file().and_then(|f| tls_config_from_ca_file(&f)));
        HttpSource {
            url,
            headers,
            node_name,
            security,
            period: period.max(Duration::from_millis(100)),
            problems,
            tls,
            last_problem: None,
            last_unknown: Vec::new(),
        }
    }

    /// Trust exactly `config` for `https://` (tests: a CA made on the spot).
    #[cfg(test)]
    pub(crate) fn with_tls_config(mut self, config: Arc<rustls::ClientConfig>) -> Self {
        self.tls = Some(Ok(config));
        self
    }

    fn timeout(&self) -> Duration {
        self.period.min(MAX_FETCH_TIMEOUT)
    }

    async fn get(&self, target: &Target) -> Result<Vec<u8>, FetchError> {
        let url = &self.url;
        let mut request = hyper::Request::get(target.path_and_query.as_str())
            .header(hyper::header::HOST, target.authority.as_str());
        for (name, values) in &self.headers {
            for value in values {
                request = request.header(name.as_str(), value.as_str());
            }
        }
        let request =
            request
                .body(Empty::<Bytes>::new())
                .map_err(|source| FetchError::Request {
                    url: url.clone(),
                    source,
                })?;
        let fetch = async {
            let tcp =
                TcpStream::connect(&target.dial)
                    .await
                    .map_err(|source| ExchangeError::Dial {
                        addr: target.dial.clone(),
                        source,
                    })?;
            let _ = tcp.set_nodelay(true);
            if !target.https {
                return exchange(tcp, request).await;
            }
            let config = match &self.tls {
                Some(Ok(config)) => config.clone(),
                Some(Err(e)) => return Err(e.clone().into()),
                None => system_ca_file().and_then(|f| tls_config_from_ca_file(&f))?,
            };
            let name = ServerName::try_from(target.host.clone()).map_err(|source| {
                ExchangeError::ServerName {
                    host: target.host.clone(),
                    source,
                }
            })?;
            let tls = tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await
                .map_err(ExchangeError::Handshake)?;
            exchange(tls, request).await
        };
        match tokio::time::timeout(self.timeout(), fetch).await {
            Ok(result) => result.map_err(|source| FetchError::Failed {
                url: url.clone(),
                source,
            }),
            Err(_) => Err(FetchError::TimedOut {
                url: url.clone(),
                timeout: self.timeout(),
            }),
        }
    }

    /// Fetch once and decode.
    pub(crate) async fn fetch(&self) -> FetchOutcome {
        let target = match parse_target(&self.url) {
            Ok(target) => target,
            Err(e) => return FetchOutcome::Unsupported(e.to_string()),
        };
        let bytes = match self.get(&target).await {
            Ok(bytes) => bytes,
            Err(e) => return FetchOutcome::Failed(e.to_string()),
        };
        if bytes.iter().all(u8::is_ascii_whitespace) {
            // Upstream reads an empty body as "no pods"; a server mid-restart or a proxy
            // answering 200 with nothing would then stop every pod. Only an explicit, empty
            // PodList / List empties the set.
            return FetchOutcome::Failed(format!(
                "GET {}: empty body; keeping the last pods (send an empty v1 PodList to run none)",
                self.url
            ));
        }
        let loaded = match load_static_pods(
            &bytes,
            ManifestOrigin::Http(&self.url),
            &self.node_name,
            &self.security,
            clock::now(),
        ) {
            Ok(loaded) => loaded,
            Err(e) => return FetchOutcome::Failed(e.to_string()),
        };
        let mut names = HashSet::new();
        let mut pods = Vec::with_capacity(loaded.pods.len());
        let mut duplicates = Vec::new();
        for pod in loaded.pods {
            let name = full_name(&pod);
            if names.insert(name.clone()) {
                pods.push(pod);
            } else {
                duplicates.push(name);
            }
        }
        let problem = (!duplicates.is_empty()).then(|| {
            format!(
                "{}: duplicate pods ignored (first kept): {}",
                self.url,
                duplicates.join(", ")
            )
        });
        FetchOutcome::Pods {
            pods,
            unknown_fields: loaded.unknown_fields,
            problem,
        }
    }
    /// Record and log (once per distinct message) the problem of this round, if any.
    fn note_problem(&mut self, problem: Option<String>) {
        match &problem {
            Some(message) if self.last_problem.as_ref() != Some(message) => {
                tracing::warn!(url = %self.url, error = %message, "static pod URL problem");
                self.problems.set(&self.url, message);
            }
            Some(_) => {}
            None if self.last_problem.is_some() => {
                tracing::info!(url = %self.url, "static pod URL is good again");
                self.problems.clear(&self.url);
            }
            None => {}
        }
        self.last_problem = problem;
    }

    /// Fetch at start and every period until cancelled; send a snapshot after each fetch that
    /// produced pods.
    pub(crate) async fn run(mut self, tx: mpsc::Sender<SourceSnapshot>, cancel: CancellationToken) {
        let mut ticker = tokio::time::interval(self.period);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = ticker.tick() => {}
            }
            let outcome = tokio::select! {
                _ = cancel.cancelled() => return,
                outcome = self.fetch() => outcome,
            };
            match outcome {
                FetchOutcome::Pods {
                    pods,
                    unknown_fields,
                    problem,
                } => {
                    if unknown_fields != self.last_unknown && !unknown_fields.is_empty() {
                        tracing::warn!(url = %self.url, fields = %unknown_fields.join(", "), "static pod URL manifest has unknown fields (ignored)");
                    }
                    self.last_unknown = unknown_fields;
                    self.note_problem(problem);
                    if tx
                        .send(SourceSnapshot {
                            source: SOURCE_HTTP,
                            pods,
                        })
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                FetchOutcome::Failed(message) => self.note_problem(Some(message)),
                FetchOutcome::Unsupported(message) => {
                    self.note_problem(Some(message));
                    // Nothing will change until the configuration does: deliver an empty set
                    // so the node does not wait for this source, then idle.
                    let _ = tx
                        .send(SourceSnapshot {
                            source: SOURCE_HTTP,
                            pods: Vec::new(),
                        })
                        .await;
                    cancel.cancelled().await;
                    return;
                }
            }
        }
    }
}

/// Sends one request over `io` (one connection per fetch: the period is long, and a fresh
/// connection sees a restarted server at once) and reads the body, up to the manifest limit.
async fn exchange<T>(io: T, request: hyper::Request<Empty<Bytes>>) -> Result<Vec<u8>, ExchangeError>
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(ExchangeError::Http)?;
    let request = async move {
        let response = sender
            .send_request(request)
            .await
            .map_err(ExchangeError::Http)?;
        let status = response.status();
        if !status.is_success() {
            return Err(ExchangeError::Status(status));
        }
        let body = Limited::new(response.into_body(), MAX_MANIFEST_BYTES)
            .collect()
            .await
            .map_err(ExchangeError::Body)?;
        Ok(body.to_bytes().to_vec())
    };
    // The connection is driven here: nothing outlives the fetch.
    tokio::pin!(conn);
    tokio::pin!(request);
    tokio::select! {
        result = &mut request => result,
        _ = &mut conn => request.await,
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        text.push_str(": ");
        text.push_str(&inner.to_string());
        source = inner.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::source::{PodChange, SourceConfig, spawn_sources};
    use std::sync::{Arc, Mutex};
    use tokio::net::TcpListener;

    /// What the test server answers: status, body.
    type Reply = Arc<Mutex<(u16, String)>>;

    /// A tiny HTTP/1 responder on 127.0.0.1:0 serving whatever `reply` holds (one request
    /// per connection), recording the `x-test` header it saw.
    async fn serve(reply: Reply, seen_header: Arc<Mutex<Option<String>>>) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                let reply = reply.clone();
                let seen_header = seen_header.clone();
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    let text = String::from_utf8_lossy(&request).to_string();
                    for line in text.lines() {
                        if let Some((name, value)) = line.split_once(':')
                            && name.eq_ignore_ascii_case("x-test")
                        {
                            *seen_header.lock().unwrap() = Some(value.trim().to_string());
                        }
                    }
                    let (status, body) = reply.lock().unwrap().clone();
                    let response = format!(
                        "HTTP/1.1 {status} X\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(response.as_bytes()).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        format!("http://{addr}/pods")
    }

    fn pod_yaml(name: &str, image: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n  containers:\n  - name: c\n    image: {image}\n"
        )
    }

    fn pod_list_json(names: &[&str]) -> String {
        let items: Vec<String> = names
            .iter()
            .map(|n| {
                format!(
                    r#"{{"metadata":{{"name":"{n}"}},"spec":{{"containers":[{{"name":"c","image":"x"}}]}}}}"#
                )
            })
            .collect();
        format!(
            r#"{{"apiVersion":"v1","kind":"PodList","items":[{}]}}"#,
            items.join(",")
        )
    }

    use crate::kubelet::source::describe_changes as describe;

    async fn recv(rx: &mut mpsc::Receiver<Vec<PodChange>>) -> Vec<PodChange> {
        tokio::time::timeout(Duration::from_secs(10), rx.recv())
            .await
            .expect("no change within 10s")
            .expect("channel closed")
    }

    fn source(url: &str) -> HttpSource {
        HttpSource::new(
            url.to_string(),
            BTreeMap::from([("x-test".to_string(), vec!["yes".to_string()])]),
            "node-1".into(),
            Default::default(),
            Duration::from_secs(1),
            SourceProblems::default(),
        )
    }

    fn pod_names(outcome: &FetchOutcome) -> Vec<String> {
        match outcome {
            FetchOutcome::Pods { pods, .. } => pods
                .iter()
                .map(|p| p.metadata.name.clone().unwrap())
                .collect(),
            other => panic!("expected pods, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn fetch_pod_and_list() {
        let reply: Reply = Arc::new(Mutex::new((200, pod_yaml("web", "nginx:1"))));
        let header = Arc::new(Mutex::new(None));
        let url = serve(reply.clone(), header.clone()).await;
        let src = source(&url);

        let outcome = src.fetch().await;
        assert_eq!(pod_names(&outcome), ["web-node-1"]);
        assert_eq!(header.lock().unwrap().as_deref(), Some("yes"));
        if let FetchOutcome::Pods { pods, .. } = &outcome {
            let ann = pods[0].metadata.annotations.as_ref().unwrap();
            assert_eq!(ann["kubernetes.io/config.source"], "http");
            assert!(pods[0].spec.as_ref().unwrap().tolerations.is_none());
        }

        *reply.lock().unwrap() = (200, pod_list_json(&["a", "b", "a"]));
        let outcome = src.fetch().await;
        assert_eq!(pod_names(&outcome), ["a-node-1", "b-node-1"]);
        if let FetchOutcome::Pods { problem, .. } = &outcome {
            assert!(problem.as_deref().unwrap().contains("duplicate"));
        }

        *reply.lock().unwrap() = (500, "boom".into());
        assert!(matches!(src.fetch().await, FetchOutcome::Failed(m) if m.contains("500")));
        *reply.lock().unwrap() = (200, "{not json".into());
        assert!(matches!(src.fetch().await, FetchOutcome::Failed(_)));
        *reply.lock().unwrap() = (200, "apiVersion: v1\nkind: Service\n".into());
        assert!(matches!(src.fetch().await, FetchOutcome::Failed(m) if m.contains("kind")));
    }

    #[tokio::test]
    async fn unsupported_and_unreachable() {
        let src = source("ftp://example.invalid/pods");
        assert!(
            matches!(src.fetch().await, FetchOutcome::Unsupported(m) if m.contains("only http:// and https://"))
        );
        // A port nobody listens on (bound, then released).
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let src = source(&format!("http://{addr}/"));
        assert!(matches!(src.fetch().await, FetchOutcome::Failed(_)));
    }

    #[tokio::test]
    async fn slow_server_times_out() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        // Accept and never answer.
        let holder = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((stream, _)) = listener.accept().await {
                held.push(stream);
            }
        });
        let mut src = source(&format!("http://{addr}/"));
        src.period = Duration::from_millis(200);
        let started = std::time::Instant::now();
        assert!(matches!(src.fetch().await, FetchOutcome::Failed(m) if m.contains("timed out")));
        assert!(started.elapsed() < Duration::from_secs(5));
        holder.abort();
    }

    #[tokio::test]
    async fn source_keeps_last_good_set() {
        let reply: Reply = Arc::new(Mutex::new((200, pod_list_json(&["a", "b"]))));
        let url = serve(reply.clone(), Arc::new(Mutex::new(None))).await;
        let cancel = CancellationToken::new();
        let cfg = SourceConfig {
            node_name: "node-1".into(),
            static_pod_path: None,
            file_check_frequency: Duration::from_secs(20),
            static_pod_url: Some(url.clone()),
            static_pod_url_header: BTreeMap::new(),
            http_check_frequency: Duration::from_millis(100),
            security: Default::default(),
            api: None,
        };
        let (mut rx, ready, problems) =
            spawn_sources(cfg, &tokio_util::task::TaskTracker::new(), cancel.clone());
        assert_eq!(
            describe(&recv(&mut rx).await),
            ["add a-node-1", "add b-node-1"]
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !ready.all_ready() {
            assert!(std::time::Instant::now() < deadline);
            tokio::task::yield_now().await;
        }

        // Server error, then garbage: the set stays and the problem is visible.
        *reply.lock().unwrap() = (500, "down".into());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !problems
            .snapshot()
            .get(&url)
            .is_some_and(|m| m.contains("500"))
        {
            assert!(std::time::Instant::now() < deadline, "500 never reported");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        *reply.lock().unwrap() = (200, String::new());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !problems
            .snapshot()
            .get(&url)
            .is_some_and(|m| m.contains("empty body"))
        {
            assert!(
                std::time::Instant::now() < deadline,
                "empty body never reported"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        *reply.lock().unwrap() = (200, "::: not yaml [".into());
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while problems
            .snapshot()
            .get(&url)
            .is_none_or(|m| m.contains("500") || m.contains("empty body"))
        {
            assert!(
                std::time::Instant::now() < deadline,
                "garbage never reported"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(rx.try_recv().is_err(), "a failed fetch changed the pod set");

        // A change: b goes, c comes.
        *reply.lock().unwrap() = (200, pod_list_json(&["a", "c"]));
        assert_eq!(
            describe(&recv(&mut rx).await),
            ["remove b-node-1", "add c-node-1"]
        );
        assert!(problems.snapshot().is_empty());

        // Only a valid empty list empties the set.
        *reply.lock().unwrap() = (
            200,
            r#"{"apiVersion":"v1","kind":"PodList","items":[]}"#.into(),
        );
        assert_eq!(
            describe(&recv(&mut rx).await),
            ["remove a-node-1", "remove c-node-1"]
        );
        cancel.cancel();
    }

    #[tokio::test]
    async fn empty_body_is_not_an_empty_set() {
        let reply: Reply = Arc::new(Mutex::new((200, String::new())));
        let url = serve(reply.clone(), Arc::new(Mutex::new(None))).await;
        let src = source(&url);
        for body in ["", " \n\t\r\n"] {
            *reply.lock().unwrap() = (200, body.to_string());
            assert!(
                matches!(src.fetch().await, FetchOutcome::Failed(m) if m.contains("empty body")),
                "{body:?}"
            );
        }
        // Valid empty lists, in any spelling, are an empty set.
        for body in [
            r#"{"apiVersion":"v1","kind":"PodList","items":[]}"#,
            r#"{"apiVersion":"v1","kind":"List"}"#,
            "apiVersion: v1\nkind: PodList\nitems: []\n",
            "apiVersion: v1\nkind: List\nmetadata: {}\n",
        ] {
            *reply.lock().unwrap() = (200, body.to_string());
            assert!(pod_names(&src.fetch().await).is_empty(), "{body}");
        }
        // Anything else that is not a pod list keeps the last set.
        for body in [
            "null",
            "{}",
            "[]",
            r#"{"apiVersion":"v1","kind":"PodList","items":[{"metadata":{"name":"a"}}]}"#,
            r#"{"apiVersion":"v1","kind":"PodList","items":"#,
        ] {
            *reply.lock().unwrap() = (200, body.to_string());
            assert!(
                matches!(src.fetch().await, FetchOutcome::Failed(_)),
                "{body} was taken as pods"
            );
        }
    }

    #[test]
    fn url_targets() {
        let t = parse_target("https://user:pw@[::1]:8443/a/b?c=d").unwrap();
        assert!(t.https);
        assert_eq!(t.host, "::1");
        assert_eq!(t.dial, "[::1]:8443");
        assert_eq!(t.authority, "[::1]:8443");
        assert_eq!(t.path_and_query, "/a/b?c=d");
        let t = parse_target("http://example.com").unwrap();
        assert!(!t.https);
        assert_eq!(t.dial, "example.com:80");
        assert_eq!(t.path_and_query, "/");
        assert_eq!(parse_target("https://h/").unwrap().dial, "h:443");
        for bad in ["ftp://h/", "/just/a/path", "h:80", "not a url"] {
            assert!(parse_target(bad).is_err(), "{bad}");
        }
    }

    /// A CA and a server certificate for 127.0.0.1 / localhost signed by it, made on the spot.
    struct TestPki {
        ca_pem: String,
        server_chain: Vec<rustls::pki_types::CertificateDer<'static>>,
        server_key: rustls::pki_types::PrivateKeyDer<'static>,
    }

    fn test_pki(names: &[&str]) -> TestPki {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "deckhand test CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let server_key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let server_params = CertificateParams::new(names).unwrap();
        let server = server_params.signed_by(&server_key, &issuer).unwrap();
        TestPki {
            ca_pem: ca.pem(),
            server_chain: vec![server.der().clone()],
            server_key: rustls::pki_types::PrivateKeyDer::Pkcs8(server_key.serialize_der().into()),
        }
    }

    /// An HTTPS responder on 127.0.0.1 answering every request with `body`.
    async fn serve_tls(pki: &TestPki, body: String) -> std::net::SocketAddr {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(pki.server_chain.clone(), pki.server_key.clone_key())
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let body = body.clone();
                tokio::spawn(async move {
                    let Ok(mut stream) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut request = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match stream.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    let response = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(response.as_bytes()).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn https_verified_against_the_given_ca() {
        let pki = test_pki(&["localhost", "127.0.0.1"]);
        let addr = serve_tls(&pki, pod_yaml("tls", "nginx:1")).await;
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, &pki.ca_pem).unwrap();
        let trusted = tls_config_from_ca_file(&ca_file).unwrap();

        for host in [addr.to_string(), format!("localhost:{}", addr.port())] {
            let url = format!("https://{host}/pods");
            let src = source(&url).with_tls_config(trusted.clone());
            assert_eq!(pod_names(&src.fetch().await), ["tls-node-1"], "{url}");
        }

        // Another CA, or the system roots: the server is not trusted, and that is a
        // transport error (the last set stays), naming the reason.
        let other = test_pki(&["localhost", "127.0.0.1"]);
        std::fs::write(&ca_file, &other.ca_pem).unwrap();
        let untrusted = tls_config_from_ca_file(&ca_file).unwrap();
        let url = format!("https://{addr}/pods");
        let outcome = source(&url).with_tls_config(untrusted).fetch().await;
        assert!(
            matches!(&outcome, FetchOutcome::Failed(m) if m.contains("TLS handshake") && m.contains("certificate")),
            "{outcome:?}"
        );
        let outcome = source(&url).fetch().await;
        assert!(matches!(outcome, FetchOutcome::Failed(_)), "{outcome:?}");

        // A certificate from the trusted CA, but for another name.
        let elsewhere = test_pki(&["elsewhere.example"]);
        std::fs::write(&ca_file, &elsewhere.ca_pem).unwrap();
        let trusted = tls_config_from_ca_file(&ca_file).unwrap();
        let addr = serve_tls(&elsewhere, pod_yaml("tls", "nginx:1")).await;
        let url = format!("https://{addr}/pods");
        let outcome = source(&url).with_tls_config(trusted).fetch().await;
        assert!(
            matches!(&outcome, FetchOutcome::Failed(m) if m.contains("certificate")),
            "{outcome:?}"
        );
    }

    #[test]
    fn ca_bundle_problems_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        assert!(matches!(
            tls_config_from_ca_file(&missing),
            Err(TlsSetupError::Unreadable { .. })
        ));
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        assert!(matches!(
            tls_config_from_ca_file(&empty),
            Err(TlsSetupError::Empty { .. })
        ));
        // The machine's own bundle loads (Debian's ca-certificates is installed).
        if let Ok(file) = system_ca_file() {
            assert!(tls_config_from_ca_file(&file).is_ok(), "{}", file.display());
        }
    }
}
