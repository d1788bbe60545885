//! A counting gRPC pass-through for the benches: listens on a Unix socket of its own, forwards
//! every HTTP/2 request to the runtime's socket unchanged (bodies and trailers stream through),
//! and counts the requests by `:path` (`/runtime.v1.RuntimeService/ListContainers`, …). An agent
//! pointed at it makes exactly the calls it would make to containerd, and the bench can say how
//! many of each a pod start cost.
//!
//! With [`CountingProxy::record`] on, it also keeps a timeline: each request's arrival (wall
//! clock, taken when its headers arrive, before anything is forwarded) and when the runtime's
//! answer came back. A `CreateContainer` request is small, so its body is read whole and
//! decoded for the pod, container name and attempt it makes (then forwarded as read); other
//! requests are only named by method. That is where "the agent began a restart" can be seen
//! from outside the agent: the moment its `CreateContainer` reached the runtime's socket, before
//! the runtime did any of its own work.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use anyhow::{Context, Result};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use tokio::net::{UnixListener, UnixStream};

/// Calls by path.
pub type Counts = BTreeMap<String, u64>;

/// One request seen while recording.
#[derive(Clone, Debug, Default)]
pub struct Call {
    /// The method's short name (`CreateContainer`).
    pub method: String,
    /// When the request's headers reached the proxy (ns since the epoch).
    pub at_ns: i64,
    /// When the runtime's answer (its headers) came back (ns since the epoch; 0 if it failed).
    pub answered_ns: i64,
    /// For `CreateContainer`: the `io.kubernetes.pod.name` label, the container's name and its
    /// attempt, from the request.
    pub pod: Option<String>,
    pub container: Option<String>,
    pub attempt: Option<u32>,
    /// For `StartContainer` and `StopContainer`: the container's ID.
    pub container_id: Option<String>,
}

/// The methods whose request bodies are read for [`Call`]'s details.
const DECODED: [&str; 3] = ["CreateContainer", "StartContainer", "StopContainer"];

#[derive(Default)]
struct Shared {
    counts: Mutex<Counts>,
    recording: AtomicBool,
    calls: Mutex<Vec<Call>>,
}

/// A running proxy; it stops when dropped.
pub struct CountingProxy {
    socket: PathBuf,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl CountingProxy {
    /// Listens on `socket` (replaced if it exists) and forwards to the Unix socket `upstream`.
    pub async fn start(upstream: &Path, socket: &Path) -> Result<CountingProxy> {
        let _ = std::fs::remove_file(socket);
        let listener = UnixListener::bind(socket)
            .with_context(|| format!("binding the counting proxy at {}", socket.display()))?;
        let shared = Arc::new(Shared::default());
        let upstream = upstream.to_path_buf();
        let task = {
            let shared = shared.clone();
            tokio::spawn(async move {
                while let Ok((conn, _)) = listener.accept().await {
                    tokio::spawn(serve(conn, upstream.clone(), shared.clone()));
                }
            })
        };
        Ok(CountingProxy {
            socket: socket.to_path_buf(),
            shared,
            task,
        })
    }

    /// The endpoint to give the agent.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// The counts so far.
    pub fn counts(&self) -> Counts {
        self.shared.counts.lock().unwrap().clone()
    }

    /// Starts counting from zero.
    pub fn reset(&self) {
        self.shared.counts.lock().unwrap().clear();
    }

    /// Turns the timeline on or off (off by default: a long run would keep every call).
    pub fn record(&self, on: bool) {
        self.shared.recording.store(on, Ordering::Relaxed);
    }

    /// The calls recorded so far (each is kept once answered), in order of arrival.
    pub fn calls(&self) -> Vec<Call> {
        let mut calls = self.shared.calls.lock().unwrap().clone();
        calls.sort_by_key(|c| c.at_ns);
        calls
    }

    /// Forgets the recorded calls.
    pub fn clear_calls(&self) {
        self.shared.calls.lock().unwrap().clear();
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.socket);
    }
}

fn now_ns() -> i64 {
    super::unix_ns(SystemTime::now())
}

/// The message of a gRPC-framed request with one frame (a compression flag, a 4-byte length,
/// the message); `None` when compressed or cut short.
fn frame(body: &[u8]) -> Option<&[u8]> {
    let (&flag, rest) = body.split_first()?;
    if flag != 0 || rest.len() < 4 {
        return None;
    }
    let len = u32::from_be_bytes(rest[..4].try_into().ok()?) as usize;
    rest.get(4..4 + len)
}

/// Fills `call`'s details from the request body of its method (see [`DECODED`]); a body that
/// does not decode leaves them empty.
fn decode_into(call: &mut Call, body: &[u8]) {
    use deckhand::clients::cri::proto::{
        CreateContainerRequest, StartContainerRequest, StopContainerRequest,
    };
    let Some(message) = frame(body) else {
        return;
    };
    match call.method.as_str() {
        "CreateContainer" => {
            let Some(config) = CreateContainerRequest::decode(message)
                .ok()
                .and_then(|r| r.config)
            else {
                return;
            };
            call.pod = config.labels.get(super::POD_NAME).cloned();
            if let Some(meta) = config.metadata {
                call.container = Some(meta.name);
                call.attempt = Some(meta.attempt);
            }
        }
        "StartContainer" => {
            call.container_id = StartContainerRequest::decode(message)
                .ok()
                .map(|r| r.container_id);
        }
        "StopContainer" => {
            call.container_id = StopContainerRequest::decode(message)
                .ok()
                .map(|r| r.container_id);
        }
        _ => {}
    }
}

type ProxyBody = BoxBody<Bytes, hyper::Error>;

/// One client connection: its own upstream connection, every request forwarded on it.
async fn serve(conn: UnixStream, upstream: PathBuf, shared: Arc<Shared>) {
    let Ok(up) = UnixStream::connect(&upstream).await else {
        return;
    };
    let Ok((sender, up_conn)) = hyper::client::conn::http2::handshake::<_, _, ProxyBody>(
        TokioExecutor::new(),
        TokioIo::new(up),
    )
    .await
    else {
        return;
    };
    tokio::spawn(up_conn);
    let service = service_fn(move |req: Request<Incoming>| {
        let at_ns = now_ns();
        let path = req.uri().path().to_string();
        *shared
            .counts
            .lock()
            .unwrap()
            .entry(path.clone())
            .or_default() += 1;
        let recording = shared.recording.load(Ordering::Relaxed);
        let mut sender = sender.clone();
        let shared = shared.clone();
        async move {
            let method = super::proxy::method(&path).to_string();
            let mut call = Call {
                method: method.clone(),
                at_ns,
                ..Default::default()
            };
            let req: Request<ProxyBody> = if recording && DECODED.contains(&method.as_str()) {
                let (parts, body) = req.into_parts();
                let bytes = body.collect().await?.to_bytes();
                decode_into(&mut call, &bytes);
                let body = Full::new(bytes).map_err(|never| match never {}).boxed();
                Request::from_parts(parts, body)
            } else {
                req.map(|b| b.boxed())
            };
            let answer: Result<Response<Incoming>, hyper::Error> = sender.send_request(req).await;
            if recording {
                if answer.is_ok() {
                    call.answered_ns = now_ns();
                }
                shared.calls.lock().unwrap().push(call);
            }
            answer
        }
    });
    let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(conn), service)
        .await;
}

/// The short name of a gRPC path: `/runtime.v1.RuntimeService/ListContainers` → `ListContainers`.
pub fn method(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}
