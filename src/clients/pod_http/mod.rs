//! HTTP(S) GETs from the node to a pod's address: what `httpGet` probes and `httpGet`
//! lifecycle hooks send, as upstream's `pkg/probe/http` does for both. One connection per run;
//! HTTPS certificates are not checked, as upstream.
//!
//! A status from 200 to 399 is a success. Redirects (301, 302, 303, 307, 308) are followed,
//! at most ten, while they stay on the same host name; a redirect to another host is not
//! followed, and its 3xx answer counts as a success with a warning, as upstream. The
//! User-Agent is the caller's (`kube-probe/<version>`, `kube-lifecycle/<version>`) and Accept
//! `*/*` unless the request's headers set them (an empty value removes them); a `Host` header
//! sets the request's host. At most [`MAX_BODY`] bytes of a body are read. The timeout covers
//! the whole run, redirects included.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::header::{ACCEPT, CONNECTION, HOST, LOCATION, USER_AGENT};
use http::{HeaderMap, HeaderName, HeaderValue, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

/// How many redirects one run follows.
const MAX_REDIRECTS: usize = 10;

/// How much of an answer's body is read (upstream's `maxRespBodyLength`, 10 KiB).
pub(crate) const MAX_BODY: usize = 10 * 1024;

/// `host:port`, with brackets around an IPv6 address.
pub(crate) fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// What a GET came to, in upstream's words (the prober's result for an `httpGet` probe; a
/// hook fails on [`Verdict::Failure`] only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// A 2xx answer.
    Success,
    /// A 3xx answer that was not followed (another host, or no `Location`).
    Warning(String),
    /// No answer, or an error status.
    Failure(String),
}

/// Where a request goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Target {
    pub https: bool,
    pub host: String,
    pub port: u16,
    /// Path and query, starting with `/`.
    pub path: String,
}

impl Target {
    fn authority(&self) -> String {
        join_host_port(&self.host, self.port)
    }

    fn url(&self) -> String {
        format!(
            "{}://{}{}",
            if self.https { "https" } else { "http" },
            self.authority(),
            self.path
        )
    }

    /// Parses an absolute `http://` or `https://` URL.
    fn parse_absolute(url: &str) -> Result<Target, HttpError> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| HttpError::NotAbsolute(url.to_string()))?;
        let https = match scheme.to_ascii_lowercase().as_str() {
            "http" => false,
            "https" => true,
            other => return Err(HttpError::Scheme(other.to_string())),
        };
        let end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(end);
        let authority = authority
            .rsplit_once('@')
            .map(|(_, a)| a)
            .unwrap_or(authority);
        let default_port = if https { 443 } else { 80 };
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (host, after) = v6
                .split_once(']')
                .ok_or_else(|| HttpError::BadHost(url.to_string()))?;
            let port = match after.strip_prefix(':') {
                Some(p) => p.parse().map_err(|_| HttpError::BadPort(url.to_string()))?,
                None => default_port,
            };
            (host.to_string(), port)
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (
                    h.to_string(),
                    p.parse().map_err(|_| HttpError::BadPort(url.to_string()))?,
                ),
                None => (authority.to_string(), default_port),
            }
        };
        if host.is_empty() {
            return Err(HttpError::NoHost(url.to_string()));
        }
        Ok(Target {
            https,
            host,
            port,
            path: normalize_path(path),
        })
    }

    /// Where a `Location` header sends a request that went to `self`.
    fn follow(&self, location: &str) -> Result<Target, HttpError> {
        let location = location.split('#').next().unwrap_or_default();
        if location.contains("://") {
            return Target::parse_absolute(location);
        }
        if let Some(rest) = location.strip_prefix("//") {
            let scheme = if self.https { "https" } else { "http" };
            return Target::parse_absolute(&format!("{scheme}://{rest}"));
        }
        let path = if location.starts_with('/') {
            location.to_string()
        } else if location.starts_with('?') {
            let base = self.path.split('?').next().unwrap_or("/");
            format!("{base}{location}")
        } else {
            let base = self.path.split('?').next().unwrap_or("/");
            let dir = &base[..base.rfind('/').map(|i| i + 1).unwrap_or(0)];
            format!("{dir}{location}")
        };
        Ok(Target {
            path: normalize_path(&path),
            ..self.clone()
        })
    }
}

/// A request target: starts with `/`, characters a URL cannot hold are percent-encoded.
fn normalize_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len() + 1);
    if !path.starts_with('/') {
        out.push('/');
    }
    for b in path.bytes() {
        let plain = b.is_ascii_graphic()
            && !matches!(
                b,
                b'"' | b'<' | b'>' | b'\\' | b'^' | b'`' | b'{' | b'|' | b'}'
            );
        if plain {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Why an HTTP probe's or hook's request could not be made or answered.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HttpError {
    #[error("not an absolute URL: {0:?}")]
    NotAbsolute(String),
    #[error("unsupported protocol scheme {0:?}")]
    Scheme(String),
    #[error("bad host in {0:?}")]
    BadHost(String),
    #[error("bad port in {0:?}")]
    BadPort(String),
    #[error("no host in {0:?}")]
    NoHost(String),
    #[error("invalid header name {0:?}")]
    HeaderName(String),
    #[error("invalid value of header {0}")]
    HeaderValue(String),
    #[error("dial tcp: {0}")]
    Dial(#[source] std::io::Error),
    #[error("bad TLS server name {0:?}")]
    ServerName(String),
    #[error("TLS handshake: {0}")]
    Tls(#[source] std::io::Error),
    #[error("{0}")]
    Hyper(#[from] hyper::Error),
    #[error("{0}")]
    Request(#[from] http::Error),
    #[error("{0}")]
    InvalidHost(#[from] http::header::InvalidHeaderValue),
}

/// One GET, built once from a probe's or hook's spec and run as often as needed.
pub(crate) struct HttpGet {
    target: Target,
    /// The request's headers, with the defaults applied.
    headers: HeaderMap,
    /// A `Host` header from the request's headers.
    host_header: Option<HeaderValue>,
    timeout: Duration,
}

/// One answer: status, `Location`, and the start of the body.
struct Answer {
    status: StatusCode,
    location: Option<String>,
    body: String,
}

impl HttpGet {
    /// `headers` are the spec's `httpHeaders` in order; `user_agent` is sent unless they set
    /// one.
    pub(crate) fn new(
        https: bool,
        host: &str,
        port: u16,
        path: &str,
        headers: Vec<(String, String)>,
        user_agent: &'static str,
        timeout: Duration,
    ) -> Result<HttpGet, HttpError> {
        let mut map = HeaderMap::new();
        let mut host_header = None;
        for (name, value) in headers {
            let name = HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| HttpError::HeaderName(name.clone()))?;
            let value = HeaderValue::from_str(&value)
                .map_err(|_| HttpError::HeaderValue(name.to_string()))?;
            if name == HOST {
                host_header = Some(value);
            } else {
                map.append(name, value);
            }
        }
        for (name, default) in [(USER_AGENT, user_agent), (ACCEPT, "*/*")] {
            match map.get(&name) {
                None => {
                    map.insert(name, HeaderValue::from_static(default));
                }
                Some(v) if v.is_empty() => {
                    map.remove(&name);
                }
                Some(_) => {}
            }
        }
        map.insert(CONNECTION, HeaderValue::from_static("close"));
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        Ok(HttpGet {
            target: Target {
                https,
                host,
                port,
                path: normalize_path(path),
            },
            headers: map,
            host_header,
            timeout,
        })
    }

    /// The URL of the first request.
    pub(crate) fn url(&self) -> String {
        self.target.url()
    }

    pub(crate) async fn run(&self) -> Verdict {
        match tokio::time::timeout(self.timeout, self.run_inner()).await {
            Ok(verdict) => verdict,
            Err(_) => Verdict::Failure(format!(
                "GET {}: no answer within {:?}",
                self.url(),
                self.timeout
            )),
        }
    }

    async fn run_inner(&self) -> Verdict {
        let mut target = self.target.clone();
        let mut host_header = self.host_header.clone();
        let mut followed = 0;
        let answer = loop {
            let answer = match self.fetch(&target, host_header.as_ref()).await {
                Ok(a) => a,
                Err(err) => return Verdict::Failure(format!("GET {}: {err}", target.url())),
            };
            let redirect = matches!(answer.status.as_u16(), 301 | 302 | 303 | 307 | 308);
            let Some(location) = answer.location.as_deref().filter(|_| redirect) else {
                break answer;
            };
            let next = match target.follow(location) {
                Ok(next) => next,
                Err(err) => {
                    return Verdict::Failure(format!("GET {}: bad redirect: {err}", target.url()));
                }
            };
            if !next.host.eq_ignore_ascii_case(&self.target.host) {
                // Not followed: the 3xx answer itself is judged (a success with a warning).
                break answer;
            }
            if followed >= MAX_REDIRECTS {
                return Verdict::Failure(format!(
                    "GET {}: stopped after {MAX_REDIRECTS} redirects",
                    next.url()
                ));
            }
            followed += 1;
            // A relative redirect keeps a custom Host header; an absolute one names its host.
            if location.contains("://") || location.starts_with("//") {
                host_header = None;
            }
            target = next;
        };
        let code = answer.status.as_u16();
        match code {
            200..=299 => Verdict::Success,
            300..=399 => Verdict::Warning(format!(
                "Probe terminated redirects, Response body: {}",
                answer.body
            )),
            _ => Verdict::Failure(format!("HTTP probe failed with statuscode: {code}")),
        }
    }

    /// One request on a fresh connection.
    async fn fetch(
        &self,
        target: &Target,
        host_header: Option<&HeaderValue>,
    ) -> Result<Answer, HttpError> {
        let tcp = TcpStream::connect(target.authority())
            .await
            .map_err(HttpError::Dial)?;
        let _ = tcp.set_nodelay(true);
        let host = match host_header {
            Some(h) => h.clone(),
            None => HeaderValue::from_str(&target.authority())?,
        };
        let mut builder = Request::get(target.path.as_str()).header(HOST, host);
        for (name, value) in &self.headers {
            builder = builder.header(name, value);
        }
        let req = builder.body(Empty::<Bytes>::new())?;
        if target.https {
            let name = rustls::pki_types::ServerName::try_from(target.host.clone())
                .map_err(|_| HttpError::ServerName(target.host.clone()))?;
            let tls = tokio_rustls::TlsConnector::from(tls_config())
                .connect(name, tcp)
                .await
                .map_err(HttpError::Tls)?;
            exchange(tls, req).await
        } else {
            exchange(tcp, req).await
        }
    }
}

/// Sends one request over `io` and reads the answer (body up to [`MAX_BODY`]).
async fn exchange<T>(io: T, req: Request<Empty<Bytes>>) -> Result<Answer, HttpError>
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    let request = async move {
        let resp = sender.send_request(req).await?;
        let status = resp.status();
        let location = resp
            .headers()
            .get(LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let mut body = resp.into_body();
        let mut bytes = Vec::new();
        while bytes.len() < MAX_BODY {
            match body.frame().await {
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        bytes.extend_from_slice(data);
                    }
                }
                Some(Err(_)) | None => break,
            }
        }
        bytes.truncate(MAX_BODY);
        Ok(Answer {
            status,
            location,
            body: String::from_utf8_lossy(&bytes).into_owned(),
        })
    };
    // The connection is driven here, not in a task of its own: nothing outlives the run.
    tokio::pin!(conn);
    tokio::pin!(request);
    tokio::select! {
        answer = &mut request => answer,
        _ = &mut conn => request.await,
    }
}

/// TLS for probes and hooks: any certificate is accepted, as upstream skips verification.
fn tls_config() -> Arc<rustls::ClientConfig> {
    static CONFIG: OnceLock<Arc<rustls::ClientConfig>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let config = rustls::ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .expect("ring supports the default TLS versions")
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
                .with_no_client_auth();
            Arc::new(config)
        })
        .clone()
}

/// Accepts every server certificate; still checks that the handshake is signed by its key.
#[derive(Debug)]
struct AnyCertificate(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
pub(crate) mod user_agent_server;

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use axum::Router;
    use axum::extract::State;
    use axum::http::{HeaderMap as AxumHeaders, Uri};
    use axum::response::{IntoResponse, Response};
    use axum::routing::get;

    use super::*;

    /// Requests the test server saw: path and headers.
    type Seen = Arc<Mutex<Vec<(String, AxumHeaders)>>>;

    /// `port` is the server's own port: `localhost:port` is the same server under another host name.
    async fn handle(
        State((seen, other)): State<(Seen, u16)>,
        uri: Uri,
        headers: AxumHeaders,
    ) -> Response {
        let path = uri.path().to_string();
        seen.lock().unwrap().push((path.clone(), headers));
        let redirect = |to: String| (StatusCode::FOUND, [(LOCATION, to)], "moved").into_response();
        match path.as_str() {
            "/ok" => (StatusCode::OK, "fine").into_response(),
            "/created" => StatusCode::CREATED.into_response(),
            "/notmodified" => StatusCode::NOT_MODIFIED.into_response(),
            "/notfound" => StatusCode::NOT_FOUND.into_response(),
            "/broken" => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
            "/same-host" => redirect("/ok".into()),
            "/same-host-relative" => redirect("ok".into()),
            "/same-host-to-404" => redirect(format!("http://127.0.0.1:{other}/notfound")),
            "/other-host" => redirect(format!("http://localhost:{other}/ok")),
            "/loop" => redirect("/loop".into()),
            "/slow" => {
                tokio::time::sleep(Duration::from_secs(5)).await;
                StatusCode::OK.into_response()
            }
            _ => StatusCode::NOT_FOUND.into_response(),
        }
    }

    async fn server() -> (u16, Seen) {
        let seen: Seen = Arc::default();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let app = Router::new()
            .fallback(get(handle))
            .with_state((seen.clone(), port));
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (port, seen)
    }

    /// The User-Agent the tests' requests default to (a probe's).
    const AGENT: &str = "kube-probe/1.37";

    fn probe(port: u16, path: &str, headers: Vec<(&str, &str)>) -> HttpGet {
        let headers = headers
            .into_iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        HttpGet::new(
            false,
            "127.0.0.1",
            port,
            path,
            headers,
            AGENT,
            Duration::from_secs(1),
        )
        .unwrap()
    }

    fn paths(seen: &Seen) -> Vec<String> {
        seen.lock()
            .unwrap()
            .iter()
            .map(|(p, _)| p.clone())
            .collect()
    }

    #[tokio::test]
    async fn status_codes_decide() {
        let (port, _) = server().await;
        assert_eq!(probe(port, "/ok", vec![]).run().await, Verdict::Success);
        assert_eq!(
            probe(port, "/created", vec![]).run().await,
            Verdict::Success
        );
        assert!(matches!(
            probe(port, "/notmodified", vec![]).run().await,
            Verdict::Warning(_)
        ));
        assert_eq!(
            probe(port, "/notfound", vec![]).run().await,
            Verdict::Failure("HTTP probe failed with statuscode: 404".into())
        );
        assert_eq!(
            probe(port, "/broken", vec![]).run().await,
            Verdict::Failure("HTTP probe failed with statuscode: 500".into())
        );
    }

    #[tokio::test]
    async fn default_and_custom_headers() {
        let (port, seen) = server().await;
        assert_eq!(probe(port, "/ok", vec![]).run().await, Verdict::Success);
        assert_eq!(
            probe(
                port,
                "/ok",
                vec![
                    ("X-Custom", "a"),
                    ("x-custom", "b"),
                    ("Host", "example.test"),
                    ("Accept", "")
                ]
            )
            .run()
            .await,
            Verdict::Success
        );
        assert_eq!(
            probe(
                port,
                "/ok",
                vec![("User-Agent", "mine"), ("Accept", "text/plain")]
            )
            .run()
            .await,
            Verdict::Success
        );
        let seen = seen.lock().unwrap();
        let plain = &seen[0].1;
        assert_eq!(plain[USER_AGENT], "kube-probe/1.37");
        assert_eq!(plain[ACCEPT], "*/*");
        assert_eq!(plain[HOST], format!("127.0.0.1:{port}").as_str());
        assert_eq!(plain[CONNECTION], "close");
        let custom = &seen[1].1;
        let values: Vec<_> = custom
            .get_all("x-custom")
            .iter()
            .map(|v| v.to_str().unwrap())
            .collect();
        assert_eq!(values, ["a", "b"]);
        assert_eq!(custom[HOST], "example.test");
        assert!(custom.get(ACCEPT).is_none(), "an empty Accept removes it");
        assert_eq!(custom[USER_AGENT], "kube-probe/1.37");
        let own = &seen[2].1;
        assert_eq!(own[USER_AGENT], "mine");
        assert_eq!(own[ACCEPT], "text/plain");
    }

    #[tokio::test]
    async fn redirects_on_the_same_host_are_followed() {
        let (port, seen) = server().await;
        assert_eq!(
            probe(port, "/same-host", vec![]).run().await,
            Verdict::Success
        );
        assert_eq!(
            probe(port, "/same-host-relative", vec![]).run().await,
            Verdict::Success
        );
        assert_eq!(
            paths(&seen),
            ["/same-host", "/ok", "/same-host-relative", "/ok"]
        );
        assert_eq!(
            probe(port, "/same-host-to-404", vec![]).run().await,
            Verdict::Failure("HTTP probe failed with statuscode: 404".into())
        );
        match probe(port, "/loop", vec![]).run().await {
            Verdict::Failure(msg) => {
                assert!(msg.contains("stopped after 10 redirects"), "{msg}")
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(paths(&seen).iter().filter(|p| *p == "/loop").count(), 11);
    }

    #[tokio::test]
    async fn a_redirect_to_another_host_is_a_success_with_a_warning() {
        let (port, seen) = server().await;
        assert_eq!(
            probe(port, "/other-host", vec![]).run().await,
            Verdict::Warning("Probe terminated redirects, Response body: moved".into())
        );
        assert_eq!(paths(&seen), ["/other-host"], "not followed");
    }

    #[tokio::test]
    async fn timeouts_and_closed_ports_fail() {
        let (port, _) = server().await;
        let started = std::time::Instant::now();
        match probe(port, "/slow", vec![]).run().await {
            Verdict::Failure(msg) => assert!(msg.contains("no answer within 1s"), "{msg}"),
            other => panic!("{other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(3));
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        match probe(closed, "/ok", vec![]).run().await {
            Verdict::Failure(msg) => assert!(msg.contains("dial tcp"), "{msg}"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn https_accepts_a_self_signed_certificate() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let cert = rustls::pki_types::CertificateDer::from(
            include_bytes!("testdata/selfsigned-cert.der").to_vec(),
        );
        let key =
            rustls::pki_types::PrivateKeyDer::Pkcs8(rustls::pki_types::PrivatePkcs8KeyDer::from(
                include_bytes!("testdata/selfsigned-key.der").to_vec(),
            ));
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let mut buf = vec![0u8; 4096];
                    let n = tls.read(&mut buf).await.unwrap_or(0);
                    let head = String::from_utf8_lossy(&buf[..n]).to_string();
                    let status = if head.starts_with("GET /healthz ") {
                        "200 OK"
                    } else {
                        "503 Service Unavailable"
                    };
                    let reply = format!(
                        "HTTP/1.1 {status}\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
                    );
                    let _ = tls.write_all(reply.as_bytes()).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        let ok = HttpGet::new(
            true,
            "127.0.0.1",
            port,
            "/healthz",
            vec![],
            AGENT,
            Duration::from_secs(2),
        )
        .unwrap();
        assert_eq!(ok.url(), format!("https://127.0.0.1:{port}/healthz"));
        assert_eq!(ok.run().await, Verdict::Success);
        let bad = HttpGet::new(
            true,
            "127.0.0.1",
            port,
            "/other",
            vec![],
            AGENT,
            Duration::from_secs(2),
        )
        .unwrap();
        assert_eq!(
            bad.run().await,
            Verdict::Failure("HTTP probe failed with statuscode: 503".into())
        );
    }

    #[test]
    fn urls_and_redirect_targets() {
        let base = Target::parse_absolute("http://10.0.0.1:8080/a/b?x=1").unwrap();
        assert_eq!(base.path, "/a/b?x=1");
        assert_eq!(base.follow("/c").unwrap().url(), "http://10.0.0.1:8080/c");
        assert_eq!(base.follow("c").unwrap().url(), "http://10.0.0.1:8080/a/c");
        assert_eq!(
            base.follow("?y=2").unwrap().url(),
            "http://10.0.0.1:8080/a/b?y=2"
        );
        assert_eq!(
            base.follow("https://h.test/z#frag").unwrap().url(),
            "https://h.test:443/z"
        );
        assert_eq!(base.follow("//other:81").unwrap().url(), "http://other:81/");
        assert_eq!(
            Target::parse_absolute("http://[fd00::1]:9/").unwrap().host,
            "fd00::1"
        );
        assert!(Target::parse_absolute("ftp://x/").is_err());
        assert_eq!(normalize_path(""), "/");
        assert_eq!(normalize_path("healthz"), "/healthz");
        assert_eq!(normalize_path("/a b"), "/a%20b");
        assert_eq!(join_host_port("10.0.0.1", 80), "10.0.0.1:80");
        assert_eq!(join_host_port("fd00::1", 80), "[fd00::1]:80");
        assert!(
            HttpGet::new(
                false,
                "h",
                1,
                "/",
                vec![("bad name".into(), "v".into())],
                AGENT,
                Duration::from_secs(1)
            )
            .is_err()
        );
    }
}
