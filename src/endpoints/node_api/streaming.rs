//! `/exec`, `/attach` and `/portForward`: the runtime hands out a streaming URL (CRI `Exec`,
//! `Attach`, `PortForward`) on its own streaming server; the node API forwards the client's
//! upgrade request (SPDY/3.1 or WebSocket, whatever it asked for) there and, once the
//! runtime switches protocols, copies bytes both ways until either side closes. Deckhand
//! never parses the stream, so every protocol version the runtime speaks works. The stream
//! holds a place in the listener's streams class and is closed after
//! `streamingConnectionIdleTimeout` with no bytes either way.

use axum::body::Body;
use axum::http::{HeaderValue, Request, Response, StatusCode, Uri, header};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::endpoints::listener::{ConnectionHandle, splice};

/// How long connecting to the runtime's streaming server may take.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

fn plain(status: StatusCode, text: impl Into<String>) -> Response<Body> {
    let mut r = Response::new(Body::from(text.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Whether the request asks to switch protocols.
pub(crate) fn is_upgrade(req: &Request<Body>) -> bool {
    let connection_upgrade = req
        .headers()
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    connection_upgrade && req.headers().contains_key(header::UPGRADE)
}

/// Headers never passed to the runtime: hop-by-hop ones hyper sets itself, and the
/// client's credentials, which the runtime has no business seeing.
fn forwarded(name: &header::HeaderName) -> bool {
    !matches!(
        name.as_str(),
        "host" | "authorization" | "content-length" | "transfer-encoding" | "proxy-authorization"
    )
}

/// Forwards the upgrade request `req` to the runtime's streaming `url` and splices the two
/// connections together.
pub(crate) async fn proxy_upgrade(mut req: Request<Body>, url: &str) -> Response<Body> {
    if !is_upgrade(&req) {
        return plain(StatusCode::BAD_REQUEST, "Upgrade request required");
    }
    // The stream is counted apart from connections and ends after the idle timeout.
    let place = match req.extensions().get::<ConnectionHandle>() {
        Some(connection) => match connection.open_stream() {
            Some(place) => Some(place),
            None => {
                return plain(
                    StatusCode::SERVICE_UNAVAILABLE,
                    super::handlers::TOO_MANY_STREAMS,
                );
            }
        },
        None => None,
    };
    let target: Uri = match url.parse() {
        Ok(u) => u,
        Err(e) => {
            return plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the runtime gave a bad streaming URL {url:?}: {e}"),
            );
        }
    };
    if target.scheme_str() != Some("http") {
        return plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("streaming URL {url:?}: only plain http streaming servers are supported"),
        );
    }
    let Some(authority) = target.authority().cloned() else {
        return plain(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("streaming URL {url:?} names no host"),
        );
    };
    let addr = if authority.port().is_some() {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    let tcp = match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&addr)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            return plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot reach the runtime's streaming server at {addr}: {e}"),
            );
        }
        Err(_) => {
            return plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the runtime's streaming server at {addr} did not answer"),
            );
        }
    };
    let _ = tcp.set_nodelay(true);
    let (mut sender, conn) = match hyper::client::conn::http1::handshake(TokioIo::new(tcp)).await {
        Ok(x) => x,
        Err(e) => {
            return plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("streaming server {addr}: {e}"),
            );
        }
    };
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "streaming server connection ended with an error");
        }
    });

    let path = target
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".into());
    let mut upstream = match Request::builder()
        .method(req.method().clone())
        .uri(path)
        .body(http_body_util::Empty::<axum::body::Bytes>::new())
    {
        Ok(r) => r,
        Err(e) => {
            return plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("streaming URL {url:?}: {e}"),
            );
        }
    };
    for (name, value) in req.headers() {
        if forwarded(name) {
            upstream.headers_mut().append(name.clone(), value.clone());
        }
    }
    if let Ok(host) = HeaderValue::from_str(authority.as_str()) {
        upstream.headers_mut().insert(header::HOST, host);
    }
    let client_upgrade = hyper::upgrade::on(&mut req);
    let mut answer = match sender.send_request(upstream).await {
        Ok(r) => r,
        Err(e) => {
            return plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("streaming server {addr}: {e}"),
            );
        }
    };
    if answer.status() != StatusCode::SWITCHING_PROTOCOLS {
        // The runtime refused (a finished exec token, a bad option): pass its answer on.
        let (parts, body) = answer.into_parts();
        return Response::from_parts(parts, Body::new(body));
    }
    let runtime_upgrade = hyper::upgrade::on(&mut answer);
    tokio::spawn(async move {
        let (client, runtime) = match tokio::join!(client_upgrade, runtime_upgrade) {
            (Ok(c), Ok(r)) => (c, r),
            (c, r) => {
                tracing::debug!(client = ?c.err(), runtime = ?r.err(), "a side of the stream never switched protocols");
                return;
            }
        };
        let client = TokioIo::new(client);
        let runtime = TokioIo::new(runtime);
        match splice(client, runtime, place).await {
            Ok((up, down)) => {
                tracing::debug!(to_runtime = up, to_client = down, "stream closed")
            }
            Err(e) => tracing::debug!(error = %e, "stream ended with an error"),
        }
    });
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    *response.headers_mut() = answer.headers().clone();
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn upgrade_detection() {
        let r = |conn: &str, up: Option<&str>| {
            let mut b = Request::builder().header(header::CONNECTION, conn);
            if let Some(u) = up {
                b = b.header(header::UPGRADE, u);
            }
            is_upgrade(&b.body(Body::empty()).unwrap())
        };
        assert!(r("Upgrade", Some("SPDY/3.1")));
        assert!(r("keep-alive, upgrade", Some("websocket")));
        assert!(!r("keep-alive", Some("SPDY/3.1")));
        assert!(!r("Upgrade", None));
    }

    /// A fake streaming server: answers 101 and echoes bytes upper-cased; records the
    /// request head it got.
    async fn echo_server() -> (u16, tokio::task::JoinHandle<String>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut head = Vec::new();
            let mut b = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                s.read_exact(&mut b).await.unwrap();
                head.push(b[0]);
            }
            s.write_all(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n")
                .await
                .unwrap();
            let mut buf = [0u8; 64];
            loop {
                let n = s.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                let up: Vec<u8> = buf[..n].to_ascii_uppercase();
                s.write_all(&up).await.unwrap();
            }
            String::from_utf8(head).unwrap()
        });
        (port, task)
    }

    #[tokio::test]
    async fn bytes_flow_both_ways_after_the_switch() {
        let (port, server) = echo_server().await;
        // The node API side: an axum router whose handler proxies.
        let url = format!("http://127.0.0.1:{port}/exec/tok3n");
        let app = axum::Router::new().route(
            "/exec/{*rest}",
            axum::routing::any(move |req: Request<Body>| {
                let url = url.clone();
                async move { proxy_upgrade(req, &url).await }
            }),
        );
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let api = l.local_addr().unwrap();
        tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            hyper::server::conn::http1::Builder::new()
                .serve_connection(
                    TokioIo::new(s),
                    hyper_util::service::TowerToHyperService::new(app),
                )
                .with_upgrades()
                .await
                .unwrap();
        });
        let mut c = TcpStream::connect(api).await.unwrap();
        c.write_all(b"POST /exec/ns/p/c?command=sh HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer secret\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\nX-Stream-Protocol-Version: v4.channel.k8s.io\r\n\r\n")
            .await
            .unwrap();
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            c.read_exact(&mut b).await.unwrap();
            head.push(b[0]);
        }
        let head = String::from_utf8(head).unwrap().to_ascii_lowercase();
        assert!(head.starts_with("http/1.1 101"), "{head}");
        assert!(
            head.contains("x-stream-protocol-version: v4.channel.k8s.io"),
            "{head}"
        );
        c.write_all(b"hello").await.unwrap();
        let mut got = [0u8; 5];
        c.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"HELLO");
        drop(c);
        let seen = server.await.unwrap().to_ascii_lowercase();
        assert!(seen.starts_with("post /exec/tok3n http/1.1"), "{seen}");
        assert!(seen.contains("upgrade: spdy/3.1"), "{seen}");
        assert!(
            !seen.contains("secret"),
            "credentials are not forwarded: {seen}"
        );
    }
}
