//! The connection machinery every listener shares (healthz, read-only, the local socket and
//! the node API): accepting, classifying and limiting connections, so that nobody who can
//! merely open a TCP connection can starve the clients that authenticate.
//!
//! A connection moves through classes, each with its own cap and timeouts:
//!
//! * **handshaking**: from accept until the TLS handshake is done (node API) or the first
//!   request's headers arrived (plain HTTP); at most `handshake_timeout`.
//! * **unauthenticated**: no request on it has passed authentication yet (every connection
//!   of the plain-HTTP listeners stays here). It may idle `unauthenticated_idle_timeout`
//!   between requests.
//! * **authenticated**: a verified client certificate, or a request on it that passed
//!   authentication (a reviewed bearer token). It may idle `idle_timeout` (upstream's 90 s)
//!   and is served for at most `max_connection_age`.
//! * **streams**: a request that became a long-lived stream (logs follow, exec, attach,
//!   port-forward) leaves its connection's class for this one, and is closed after
//!   `streaming_idle_timeout` (`streamingConnectionIdleTimeout`) without traffic.
//!
//! The two untrusted classes are full when their cap is reached; a newcomer then pushes the
//! oldest member out rather than waiting, so sockets opened earlier (idle, half-open, or
//! trickling unauthenticated requests) can never keep a legitimate client waiting: its
//! handshake takes milliseconds, a flood's sockets would have to outnumber the cap within
//! those milliseconds to push it out. The trusted classes never push anyone out: over their
//! cap, an authenticated connection is served as an unauthenticated one, and a stream is
//! refused (503). The listener itself always accepts, so nothing waits in the kernel's
//! backlog behind a flood.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::TokioTimer;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::base::clock;

/// A server could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr} for the {what}: {source}")]
pub struct ServeError {
    pub what: &'static str,
    /// The address or socket path.
    pub addr: String,
    #[source]
    pub source: std::io::Error,
}

/// A listening socket the accept loop takes connections from (TCP or Unix).
pub(crate) trait Acceptor: Send + 'static {
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// The next connection and a description of its peer for the log.
    fn next(
        &self,
    ) -> impl std::future::Future<Output = std::io::Result<(Self::Stream, String)>> + Send;
}

impl Acceptor for TcpListener {
    type Stream = tokio::net::TcpStream;
    async fn next(&self) -> std::io::Result<(Self::Stream, String)> {
        let (stream, peer) = self.accept().await?;
        Ok((stream, peer.to_string()))
    }
}

impl Acceptor for UnixListener {
    type Stream = tokio::net::UnixStream;
    async fn next(&self) -> std::io::Result<(Self::Stream, String)> {
        let (stream, _) = self.accept().await?;
        Ok((stream, "local socket".to_string()))
    }
}

/// The limits of one listener (see the module's description of the classes).
#[derive(Clone, Copy, Debug)]
pub struct ListenerLimits {
    /// The TLS handshake, or on plain HTTP the first request's headers, within this.
    pub handshake_timeout: Duration,
    /// How long a connection that has not authenticated may wait for its next request.
    pub unauthenticated_idle_timeout: Duration,
    /// How long an authenticated connection may wait for its next request (upstream's
    /// server `IdleTimeout`), which also bounds the arrival of one request's headers.
    pub idle_timeout: Duration,
    pub max_handshaking: usize,
    pub max_unauthenticated: usize,
    pub max_authenticated: usize,
    /// The longest a connection is served, however busy; streams are exempt.
    pub max_connection_age: Duration,
    pub max_streams: usize,
    /// `streamingConnectionIdleTimeout`: a stream without traffic this long is closed
    /// (zero: never).
    pub streaming_idle_timeout: Duration,
}

impl Default for ListenerLimits {
    fn default() -> Self {
        ListenerLimits {
            handshake_timeout: Duration::from_secs(5),
            unauthenticated_idle_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(90),
            max_handshaking: 512,
            max_unauthenticated: 512,
            max_authenticated: 256,
            max_connection_age: Duration::from_secs(300),
            max_streams: 256,
            streaming_idle_timeout: crate::config::server::DEFAULT_STREAMING_IDLE_TIMEOUT,
        }
    }
}

/// A capped class of connections. Untrusted classes [`Pool::admit`] by pushing their oldest
/// member out; trusted ones [`Pool::try_admit`] only below the cap.
#[derive(Debug)]
pub(crate) struct Pool {
    cap: usize,
    members: Mutex<VecDeque<(u64, CancellationToken)>>,
    next_id: AtomicU64,
}

/// A place in a [`Pool`], given back on drop. `evicted` fires when a newcomer pushed it out.
#[derive(Debug)]
pub(crate) struct Member {
    pool: Arc<Pool>,
    id: u64,
    evicted: CancellationToken,
}

impl Pool {
    pub(crate) fn new(cap: usize) -> Arc<Pool> {
        Arc::new(Pool {
            cap: cap.max(1),
            members: Mutex::new(VecDeque::new()),
            next_id: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(u64, CancellationToken)>> {
        self.members.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn join(self: &Arc<Self>, members: &mut VecDeque<(u64, CancellationToken)>) -> Member {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let evicted = CancellationToken::new();
        members.push_back((id, evicted.clone()));
        Member {
            pool: self.clone(),
            id,
            evicted,
        }
    }

    /// A place, pushing the oldest members out while the pool is full.
    pub(crate) fn admit(self: &Arc<Self>) -> Member {
        let mut members = self.lock();
        while members.len() >= self.cap {
            match members.pop_front() {
                Some((_, evicted)) => evicted.cancel(),
                None => break,
            }
        }
        self.join(&mut members)
    }

    /// A place if the pool is not full.
    pub(crate) fn try_admit(self: &Arc<Self>) -> Option<Member> {
        let mut members = self.lock();
        (members.len() < self.cap).then(|| self.join(&mut members))
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

impl Member {
    pub(crate) fn evicted(&self) -> &CancellationToken {
        &self.evicted
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let mut members = self.pool.lock();
        if let Some(at) = members.iter().position(|(id, _)| *id == self.id) {
            members.remove(at);
        }
    }
}

/// One listener's classes and limits, shared by its connections.
#[derive(Debug)]
pub(crate) struct Listener {
    pub(crate) what: &'static str,
    pub(crate) limits: ListenerLimits,
    handshaking: Arc<Pool>,
    unauthenticated: Arc<Pool>,
    authenticated: Arc<Pool>,
    streams: Arc<Pool>,
}

impl Listener {
    pub(crate) fn new(what: &'static str, limits: ListenerLimits) -> Arc<Listener> {
        Arc::new(Listener {
            what,
            limits,
            handshaking: Pool::new(limits.max_handshaking),
            unauthenticated: Pool::new(limits.max_unauthenticated),
            authenticated: Pool::new(limits.max_authenticated),
            streams: Pool::new(limits.max_streams),
        })
    }
}

/// Accepts connections until `cancel` fires, each into the handshaking class, and hands each
/// to `serve` on its own task; on `cancel` the open connections get 2 s to finish. `serve`
/// is what differs between listeners (plain HTTP, or a TLS handshake first): it gets the
/// connection's handshaking place, to keep until it hands the connection to
/// [`serve_connection`].
pub(crate) async fn accept_connections<A, F, Fut>(
    listener: A,
    limits: ListenerLimits,
    what: &'static str,
    cancel: CancellationToken,
    serve: F,
) where
    A: Acceptor,
    F: Fn(A::Stream, String, Arc<Listener>, Member) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let shared = Listener::new(what, limits);
    let connections = TaskTracker::new();
    loop {
        let (stream, peer) = tokio::select! {
            _ = cancel.cancelled() => break,
            accepted = listener.next() => match accepted {
                Ok(a) => a,
                Err(err) => {
                    // Out of file descriptors, for instance: wait a little rather than spin.
                    tracing::warn!(error = %err, "the {what} cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let place = shared.handshaking.admit();
        connections.spawn(serve(stream, peer, shared.clone(), place));
    }
    connections.close();
    let _ = tokio::time::timeout(Duration::from_secs(2), connections.wait()).await;
}

/// How a connection starts being served.
#[derive(Debug)]
pub(crate) enum Start {
    /// Plain HTTP: still handshaking until its first request's headers arrive.
    Handshaking(Member),
    /// A TLS connection without a client certificate.
    Unauthenticated,
    /// A TLS connection with a verified client certificate.
    Authenticated,
}

/// What a request learns of its connection (put on each request's extensions): the gate
/// says when the connection authenticated, a streaming handler registers its stream.
#[derive(Clone, Debug)]
pub(crate) struct ConnectionHandle(Arc<ConnectionState>);

#[derive(Debug)]
struct ConnectionState {
    listener: Arc<Listener>,
    authenticated: AtomicBool,
    /// A stream was opened on it: the connection leaves its class and ends with the stream.
    streaming: AtomicBool,
    requests: AtomicU64,
    in_flight: AtomicUsize,
    last_answer: Mutex<Instant>,
    changed: Notify,
}

/// A registered long-lived stream; its place is given back on drop.
#[derive(Debug)]
pub(crate) struct StreamPlace {
    _member: Member,
    /// `streamingConnectionIdleTimeout` (zero: never).
    pub(crate) idle_timeout: Duration,
}

impl ConnectionHandle {
    fn new(listener: Arc<Listener>) -> ConnectionHandle {
        ConnectionHandle(Arc::new(ConnectionState {
            listener,
            authenticated: AtomicBool::new(false),
            streaming: AtomicBool::new(false),
            requests: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            last_answer: Mutex::new(clock::instant()),
            changed: Notify::new(),
        }))
    }

    /// A request on this connection passed authentication (not as `system:anonymous`).
    pub(crate) fn mark_authenticated(&self) {
        if !self.0.authenticated.swap(true, Ordering::SeqCst) {
            self.0.changed.notify_one();
        }
    }

    /// Registers the request being answered as a long-lived stream; `None` when the
    /// listener's streams are at their cap. The connection ends once the stream does.
    pub(crate) fn open_stream(&self) -> Option<StreamPlace> {
        let member = self.0.listener.streams.try_admit()?;
        self.0.streaming.store(true, Ordering::SeqCst);
        self.0.changed.notify_one();
        Some(StreamPlace {
            _member: member,
            idle_timeout: self.0.listener.limits.streaming_idle_timeout,
        })
    }

    fn began(&self) {
        self.0.requests.fetch_add(1, Ordering::SeqCst);
        self.0.in_flight.fetch_add(1, Ordering::SeqCst);
        self.0.changed.notify_one();
    }

    fn answered(&self) {
        *self.0.last_answer.lock().unwrap_or_else(|e| e.into_inner()) = clock::instant();
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.0.changed.notify_one();
    }

    fn last_answer(&self) -> Instant {
        *self.0.last_answer.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Counts a request as answered when its response (or its abandonment) comes.
struct InFlight(ConnectionHandle);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.answered();
    }
}

/// A service that tells its connection when requests begin and end, and hands each request
/// the connection's handle.
struct Tracked<S> {
    inner: S,
    connection: ConnectionHandle,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Request = hyper::Request<hyper::body::Incoming>;

impl<S, B> hyper::service::Service<Request> for Tracked<S>
where
    S: hyper::service::Service<Request, Response = hyper::Response<B>>,
    S::Future: Send + 'static,
{
    type Response = hyper::Response<B>;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<hyper::Response<B>, S::Error>>;

    fn call(&self, mut req: Request) -> Self::Future {
        self.connection.began();
        let in_flight = InFlight(self.connection.clone());
        req.extensions_mut().insert(self.connection.clone());
        let answer = self.inner.call(req);
        Box::pin(async move {
            let result = answer.await;
            drop(in_flight);
            result
        })
    }
}

/// The class a connection is in, with its place there.
#[derive(Debug)]
enum Class {
    Handshaking(Member),
    Unauthenticated(Member),
    Authenticated(Member),
    /// Its stream holds a place of its own; the connection no longer counts.
    Streaming,
}

/// What the connection tells about itself, for [`reclassify`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seen {
    requests: u64,
    authenticated: bool,
    streaming: bool,
}

/// The class a connection moves to: streaming once a stream opened, authenticated once a
/// request authenticated (if the authenticated class has room), unauthenticated once a
/// plain connection sent its first request; else where it is.
fn reclassify(class: Class, seen: Seen, listener: &Listener) -> Class {
    match class {
        Class::Streaming => Class::Streaming,
        _ if seen.streaming => Class::Streaming,
        Class::Authenticated(m) => Class::Authenticated(m),
        other if seen.authenticated => match listener.authenticated.try_admit() {
            Some(m) => Class::Authenticated(m),
            None => reclassify_untrusted(other, seen, listener),
        },
        other => reclassify_untrusted(other, seen, listener),
    }
}

fn reclassify_untrusted(class: Class, seen: Seen, listener: &Listener) -> Class {
    match class {
        Class::Handshaking(_) if seen.requests > 0 => {
            Class::Unauthenticated(listener.unauthenticated.admit())
        }
        other => other,
    }
}

/// When the connection is to be closed for idling, by class: handshaking connections at
/// `handshake_timeout` after they began, unauthenticated ones `unauthenticated_idle_timeout`
/// after their last answer (never while a request is in flight); authenticated ones are left
/// to hyper's idle timeout, streams to their own. Every non-stream connection at
/// `max_connection_age`.
fn idle_deadline(
    class: &Class,
    limits: &ListenerLimits,
    began: Instant,
    last_answer: Instant,
    in_flight: usize,
) -> Option<Instant> {
    let age = began + limits.max_connection_age;
    match class {
        Class::Streaming => None,
        Class::Handshaking(_) => Some(age.min(began + limits.handshake_timeout)),
        Class::Unauthenticated(_) if in_flight == 0 => {
            Some(age.min(last_answer.max(began) + limits.unauthenticated_idle_timeout))
        }
        Class::Unauthenticated(_) | Class::Authenticated(_) => Some(age),
    }
}

fn evicted_token(class: &Class) -> Option<CancellationToken> {
    match class {
        Class::Handshaking(m) | Class::Unauthenticated(m) => Some(m.evicted().clone()),
        Class::Authenticated(_) | Class::Streaming => None,
    }
}

/// Serves one HTTP/1.1 connection (protocol upgrades allowed, a bounded read buffer) in its
/// class, moving it between classes as its requests authenticate or become streams, and ends
/// it gracefully (a request in flight is finished) when `cancel` fires, when its class's
/// timeout passes, or when a newcomer pushed it out of its class.
pub(crate) async fn serve_connection<I, S, B>(
    io: I,
    service: S,
    listener: &Arc<Listener>,
    start: Start,
    cancel: CancellationToken,
    peer: &str,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    S: hyper::service::Service<Request, Response = hyper::Response<B>>,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: hyper::body::Body + Send + 'static,
    B::Error: Into<BoxError>,
{
    let limits = listener.limits;
    let handle = ConnectionHandle::new(listener.clone());
    let mut class = match start {
        Start::Handshaking(m) => Class::Handshaking(m),
        Start::Unauthenticated => Class::Unauthenticated(listener.unauthenticated.admit()),
        Start::Authenticated => {
            handle.0.authenticated.store(true, Ordering::SeqCst);
            match listener.authenticated.try_admit() {
                Some(m) => Class::Authenticated(m),
                None => Class::Unauthenticated(listener.unauthenticated.admit()),
            }
        }
    };
    let service = Tracked {
        inner: service,
        connection: handle.clone(),
    };
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.idle_timeout)
        .max_buf_size(64 * 1024);
    let conn = builder.serve_connection(io, service).with_upgrades();
    tokio::pin!(conn);
    let began = clock::instant();
    let mut closing = false;
    // When a connection closed for its untrusted class must be gone: hyper closes an idle one
    // at once but waits on half a request's headers, which a trickling client never ends.
    let mut cut_at: Option<Instant> = None;
    let untrusted_grace = limits.unauthenticated_idle_timeout;
    loop {
        let state = &handle.0;
        let seen = Seen {
            requests: state.requests.load(Ordering::SeqCst),
            authenticated: state.authenticated.load(Ordering::SeqCst),
            streaming: state.streaming.load(Ordering::SeqCst),
        };
        class = reclassify(class, seen, listener);
        let in_flight = state.in_flight.load(Ordering::SeqCst);
        if matches!(class, Class::Streaming) && !closing && in_flight == 0 {
            // The stream is the last answer on this connection; its own idle timeout ends it.
            // Only once the handler has answered: hyper closes a connection shut down while
            // the answer is still being made without writing it, and an exec or attach
            // upgrade then reaches the API server as an empty response.
            conn.as_mut().graceful_shutdown();
            closing = true;
        }
        let deadline = idle_deadline(&class, &limits, began, handle.last_answer(), in_flight);
        let evicted = evicted_token(&class);
        let untrusted = evicted.is_some();
        let evicted = evicted.unwrap_or_default();
        let mut close = false;
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(err) = result {
                    tracing::debug!(%peer, error = %err, "connection ended with an error");
                }
                break;
            }
            _ = state.changed.notified() => {}
            _ = cancel.cancelled(), if !closing => close = true,
            _ = evicted.cancelled(), if !closing && untrusted => {
                tracing::debug!(%peer, "{}: a newer connection pushed this one out", listener.what);
                close = true;
            }
            _ = sleep_until(deadline), if !closing && deadline.is_some() => close = true,
            _ = sleep_until(cut_at), if cut_at.is_some() => {
                tracing::debug!(%peer, "{}: closed while still sending a request", listener.what);
                break;
            }
        }
        if close {
            conn.as_mut().graceful_shutdown();
            closing = true;
            if untrusted {
                cut_at = Some(clock::instant() + untrusted_grace);
            }
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Ends `stream` once no item came for `place.idle_timeout` (zero: never), and gives the
/// stream's place back when it ends: a follow-mode log with nothing new to say.
pub(crate) fn idle_limited<St>(
    stream: St,
    place: StreamPlace,
) -> impl futures::Stream<Item = St::Item> + Send + 'static
where
    St: futures::Stream + Send + Unpin + 'static,
    St::Item: Send,
{
    use futures::StreamExt;
    futures::stream::unfold((stream, place), |(mut stream, place)| async move {
        let item = if place.idle_timeout.is_zero() {
            stream.next().await
        } else {
            tokio::time::timeout(place.idle_timeout, stream.next())
                .await
                .ok()
                .flatten()
        };
        item.map(|item| (item, (stream, place)))
    })
}

/// Copies bytes both ways between `a` and `b` until either side closes or, with a `place`,
/// nothing moved either way for its idle timeout (an exec, attach or port-forward stream).
pub(crate) async fn splice<A, B>(
    a: A,
    b: B,
    place: Option<StreamPlace>,
) -> std::io::Result<(u64, u64)>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let idle = place
        .as_ref()
        .map(|p| p.idle_timeout)
        .filter(|d| !d.is_zero());
    let Some(idle) = idle else {
        let (mut a, mut b) = (a, b);
        return tokio::io::copy_bidirectional(&mut a, &mut b).await;
    };
    let clock = clock::instant();
    let last = Arc::new(AtomicU64::new(0));
    let mut a = Active::new(a, clock, last.clone());
    let mut b = Active::new(b, clock, last.clone());
    let copy = tokio::io::copy_bidirectional(&mut a, &mut b);
    tokio::pin!(copy);
    loop {
        let since = Duration::from_millis(last.load(Ordering::Relaxed));
        let at = clock + since + idle;
        tokio::select! {
            result = copy.as_mut() => return result,
            _ = tokio::time::sleep_until(at) => {
                if Duration::from_millis(last.load(Ordering::Relaxed)) == since {
                    tracing::debug!(idle_s = idle.as_secs(), "stream closed: idle for streamingConnectionIdleTimeout");
                    return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "stream idle"));
                }
            }
        }
    }
}

/// An I/O object that notes when bytes last moved through it (ms since `clock`).
struct Active<T> {
    inner: T,
    clock: Instant,
    last: Arc<AtomicU64>,
}

impl<T> Active<T> {
    fn new(inner: T, clock: Instant, last: Arc<AtomicU64>) -> Self {
        Active { inner, clock, last }
    }

    fn touch(&self) {
        let ms = u64::try_from(self.clock.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last.fetch_max(ms, Ordering::Relaxed);
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Active<T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let result = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.touch();
        }
        result
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Active<T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let result = std::pin::Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(result, std::task::Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        result
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_untrusted_pool_pushes_its_oldest_out_and_a_trusted_one_refuses() {
        let pool = Pool::new(2);
        let first = pool.admit();
        let second = pool.admit();
        assert_eq!(pool.len(), 2);
        let third = pool.admit();
        assert!(first.evicted().is_cancelled(), "the oldest goes");
        assert!(!second.evicted().is_cancelled());
        assert!(!third.evicted().is_cancelled());
        assert_eq!(pool.len(), 2);
        // The evicted member's drop finds nothing to remove; a live one frees its place.
        drop(first);
        assert_eq!(pool.len(), 2);
        drop(second);
        assert_eq!(pool.len(), 1);

        let trusted = Pool::new(1);
        let only = trusted.try_admit().expect("room for one");
        assert!(trusted.try_admit().is_none(), "full: refused");
        assert!(!only.evicted().is_cancelled(), "never pushed out");
        drop(only);
        assert!(trusted.try_admit().is_some());
    }

    fn limits() -> ListenerLimits {
        ListenerLimits {
            handshake_timeout: Duration::from_secs(5),
            unauthenticated_idle_timeout: Duration::from_secs(7),
            max_connection_age: Duration::from_secs(300),
            ..ListenerLimits::default()
        }
    }

    #[tokio::test]
    async fn each_class_has_its_own_deadline() {
        let listener = Listener::new("test", limits());
        let began = Instant::now();
        let s = Duration::from_secs;
        let pool = Pool::new(8);
        let later = began + s(20);
        let cases: Vec<(&str, Class, Instant, usize, Option<Instant>)> = vec![
            (
                "handshaking: the handshake timeout",
                Class::Handshaking(pool.admit()),
                began,
                0,
                Some(began + s(5)),
            ),
            (
                "unauthenticated, idle: its idle timeout after the last answer",
                Class::Unauthenticated(pool.admit()),
                later,
                0,
                Some(later + s(7)),
            ),
            (
                "unauthenticated, a request in flight: only the age",
                Class::Unauthenticated(pool.admit()),
                later,
                1,
                Some(began + s(300)),
            ),
            (
                "authenticated: the age (hyper closes it when idle)",
                Class::Authenticated(pool.admit()),
                later,
                0,
                Some(began + s(300)),
            ),
            ("a stream: none", Class::Streaming, later, 0, None),
        ];
        for (what, class, last, in_flight, want) in cases {
            let got = idle_deadline(&class, &listener.limits, began, last, in_flight);
            assert_eq!(got, want, "{what}");
        }
    }

    #[tokio::test]
    async fn connections_move_up_as_they_request_and_authenticate() {
        let listener = Listener::new(
            "test",
            ListenerLimits {
                max_authenticated: 1,
                ..limits()
            },
        );
        let seen = |requests, authenticated, streaming| Seen {
            requests,
            authenticated,
            streaming,
        };
        let kind = |c: &Class| match c {
            Class::Handshaking(_) => "handshaking",
            Class::Unauthenticated(_) => "unauthenticated",
            Class::Authenticated(_) => "authenticated",
            Class::Streaming => "streaming",
        };
        let handshaking = || Class::Handshaking(listener.handshaking.admit());
        let c = reclassify(handshaking(), seen(0, false, false), &listener);
        assert_eq!(kind(&c), "handshaking");
        let c = reclassify(c, seen(1, false, false), &listener);
        assert_eq!(kind(&c), "unauthenticated");
        let held = reclassify(c, seen(1, true, false), &listener);
        assert_eq!(kind(&held), "authenticated");
        // The authenticated class is full: a second stays unauthenticated, and is served.
        let other = Class::Unauthenticated(listener.unauthenticated.admit());
        let other = reclassify(other, seen(1, true, false), &listener);
        assert_eq!(kind(&other), "unauthenticated");
        // A stream leaves every class, and frees the authenticated place.
        let streaming = reclassify(held, seen(2, true, true), &listener);
        assert_eq!(kind(&streaming), "streaming");
        let other = reclassify(other, seen(1, true, false), &listener);
        assert_eq!(kind(&other), "authenticated");
    }

    #[tokio::test]
    async fn a_quiet_stream_is_cut_after_its_idle_timeout() {
        use tokio::io::AsyncWriteExt;
        let listener = Listener::new(
            "test",
            ListenerLimits {
                streaming_idle_timeout: Duration::from_millis(300),
                ..ListenerLimits::default()
            },
        );
        let handle = ConnectionHandle::new(listener.clone());
        let place = handle.open_stream().unwrap();
        assert_eq!(listener.streams.len(), 1);
        let (client, mut client_far) = tokio::io::duplex(64);
        let (runtime, _runtime_far) = tokio::io::duplex(64);
        let began = std::time::Instant::now();
        let splicing = tokio::spawn(splice(client, runtime, Some(place)));
        // Traffic keeps it open past the timeout...
        for _ in 0..4 {
            tokio::time::sleep(Duration::from_millis(150)).await;
            client_far.write_all(b"x").await.unwrap();
        }
        assert!(!splicing.is_finished(), "closed while bytes flowed");
        // ...quiet closes it.
        let ended = tokio::time::timeout(Duration::from_secs(5), splicing).await;
        assert!(ended.is_ok(), "a quiet stream stayed open");
        assert!(began.elapsed() >= Duration::from_millis(600));
        assert_eq!(listener.streams.len(), 0, "its place is given back");

        // A follow-mode body the same way.
        let place = handle.open_stream().unwrap();
        let (tx, rx) = tokio::sync::mpsc::channel::<u8>(4);
        let body = idle_limited(tokio_stream::wrappers::ReceiverStream::new(rx), place);
        tx.send(1).await.unwrap();
        let got: Vec<u8> = tokio::time::timeout(Duration::from_secs(5), {
            use futures::StreamExt;
            body.collect::<Vec<u8>>()
        })
        .await
        .expect("ended after the idle timeout although the sender lives");
        assert_eq!(got, vec![1]);
        drop(tx);
        assert_eq!(listener.streams.len(), 0);
    }
}
