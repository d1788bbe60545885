//! A counting gRPC pass-through for the benches: listens on a Unix socket of its own, forwards
//! every HTTP/2 request to the runtime's socket unchanged (bodies and trailers stream through),
//! and counts the requests by `:path` (`/runtime.v1.RuntimeService/ListContainers`, …). An agent
//! pointed at it makes exactly the calls it would make to containerd, and the bench can say how
//! many of each a pod start cost.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::{UnixListener, UnixStream};

/// Calls by path.
pub type Counts = BTreeMap<String, u64>;

/// A running proxy; it stops when dropped.
pub struct CountingProxy {
    socket: PathBuf,
    counts: Arc<Mutex<Counts>>,
    task: tokio::task::JoinHandle<()>,
}

impl CountingProxy {
    /// Listens on `socket` (replaced if it exists) and forwards to the Unix socket `upstream`.
    pub async fn start(upstream: &Path, socket: &Path) -> Result<CountingProxy> {
        let _ = std::fs::remove_file(socket);
        let listener = UnixListener::bind(socket)
            .with_context(|| format!("binding the counting proxy at {}", socket.display()))?;
        let counts = Arc::new(Mutex::new(Counts::new()));
        let upstream = upstream.to_path_buf();
        let task = {
            let counts = counts.clone();
            tokio::spawn(async move {
                while let Ok((conn, _)) = listener.accept().await {
                    tokio::spawn(serve(conn, upstream.clone(), counts.clone()));
                }
            })
        };
        Ok(CountingProxy {
            socket: socket.to_path_buf(),
            counts,
            task,
        })
    }

    /// The endpoint to give the agent.
    pub fn endpoint(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// The counts so far.
    pub fn counts(&self) -> Counts {
        self.counts.lock().unwrap().clone()
    }

    /// Starts counting from zero.
    pub fn reset(&self) {
        self.counts.lock().unwrap().clear();
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// One client connection: its own upstream connection, every request forwarded on it.
async fn serve(conn: UnixStream, upstream: PathBuf, counts: Arc<Mutex<Counts>>) {
    let Ok(up) = UnixStream::connect(&upstream).await else {
        return;
    };
    let Ok((sender, up_conn)) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(up)).await
    else {
        return;
    };
    tokio::spawn(up_conn);
    let service = service_fn(move |req: Request<Incoming>| {
        *counts
            .lock()
            .unwrap()
            .entry(req.uri().path().to_string())
            .or_default() += 1;
        let mut sender = sender.clone();
        async move {
            let answer: Result<Response<Incoming>, hyper::Error> = sender.send_request(req).await;
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
