//! A response body that puts each chunk on the wire before the next one, and before its end.
//!
//! Upstream's kubelet writes a container log through a flushing writer: every chunk leaves
//! at once, and the chunked body's terminator only follows when the handler returns. hyper
//! instead gathers whatever the body has ready into one write, so a short log and the
//! terminator usually travel in one TLS record. That matters because the API server's
//! websocket relay of `pods/log` (`wsstream`'s `messageCopy`, k8s.io/streaming v0.37) drops
//! the bytes of a read that also reports the end: Go's chunked reader returns the last data
//! together with `io.EOF` when the terminator is already buffered. Measured against this
//! repository's cluster before the change: 22 of 300 websocket log reads of a one-line log
//! came back empty (plain `GET`s through the API server and direct reads: 0 of 300), and the
//! NodeConformance spec `Pods should support retrieving logs from the container over
//! websockets` failed on Deckhand about one run in fifteen (its retries cannot help: each one
//! rewrites the URL's scheme it shares with the first, `https` → `wss` → `ws`).
//!
//! [`FlushEach`] yields each chunk and then answers `Pending` once (waking itself at once), so
//! hyper writes what it holds before it asks for more; the end goes out in a write of its own.

use std::pin::Pin;
use std::task::{Context, Poll};

use futures::Stream;

/// Wraps a body stream so that each item is flushed before the next item or the end.
pub(crate) struct FlushEach<S> {
    inner: S,
    /// An item was just handed out: give the connection a chance to write it first.
    pause: bool,
}

impl<S> FlushEach<S> {
    pub(crate) fn new(inner: S) -> FlushEach<S> {
        FlushEach {
            inner,
            pause: false,
        }
    }
}

impl<S: Stream + Unpin> Stream for FlushEach<S> {
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        if self.pause {
            self.pause = false;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        let next = Pin::new(&mut self.inner).poll_next(cx);
        if matches!(next, Poll::Ready(Some(_))) {
            self.pause = true;
        }
        next
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::sync::{Arc, Mutex};

    use axum::body::{Body, Bytes};
    use futures::StreamExt;
    use hyper::server::conn::http1;
    use hyper_util::rt::TokioIo;
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

    use super::*;

    /// The server's end of a duplex pipe that records each write hyper makes.
    struct Recorder {
        pipe: tokio::io::DuplexStream,
        writes: Arc<Mutex<Vec<Vec<u8>>>>,
    }

    impl AsyncRead for Recorder {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Pin::new(&mut self.pipe).poll_read(cx, buf)
        }
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let written = Pin::new(&mut self.pipe).poll_write(cx, buf);
            if let Poll::Ready(Ok(n)) = written {
                self.writes.lock().unwrap().push(buf[..n].to_vec());
            }
            written
        }
        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.pipe).poll_flush(cx)
        }
        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.pipe).poll_shutdown(cx)
        }
    }

    /// The writes hyper made to answer one GET with a body of `chunks`, every chunk ready at
    /// once (a short log read to its end), with or without [`FlushEach`].
    async fn writes_for(chunks: &[&'static str], flush_each: bool) -> Vec<String> {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let writes = Arc::new(Mutex::new(Vec::new()));
        let io = TokioIo::new(Recorder {
            pipe: server,
            writes: writes.clone(),
        });
        let items: Vec<Bytes> = chunks
            .iter()
            .map(|c| Bytes::from_static(c.as_bytes()))
            .collect();
        let service = hyper::service::service_fn(move |_req| {
            let stream =
                futures::stream::iter(items.clone().into_iter().map(Ok::<_, io::Error>)).boxed();
            let body = if flush_each {
                Body::from_stream(FlushEach::new(stream))
            } else {
                Body::from_stream(stream)
            };
            async move { Ok::<_, io::Error>(hyper::Response::new(body)) }
        });
        let served = tokio::spawn(http1::Builder::new().serve_connection(io, service));
        let mut client = client;
        client
            .write_all(
                b"GET /containerLogs/ns/pod/c HTTP/1.1\r\nhost: node\r\nconnection: close\r\n\r\n",
            )
            .await
            .unwrap();
        let mut response = Vec::new();
        client.read_to_end(&mut response).await.unwrap();
        served.await.unwrap().unwrap();
        let writes = writes.lock().unwrap();
        writes
            .iter()
            .map(|w| String::from_utf8_lossy(w).into_owned())
            .collect()
    }

    /// The write that carries the body's terminator.
    fn terminator_write(writes: &[String]) -> &str {
        writes
            .iter()
            .find(|w| w.ends_with("0\r\n\r\n"))
            .expect("a chunked body ends with its terminator")
    }

    #[tokio::test]
    async fn the_last_chunk_leaves_before_the_end_of_the_body() {
        let line = "container is alive\n";
        let plain = writes_for(&[line], false).await;
        // What the change is for: without it the line and the end share one write.
        assert!(terminator_write(&plain).contains(line), "{plain:?}");
        let flushed = writes_for(&[line], true).await;
        assert!(!terminator_write(&flushed).contains(line), "{flushed:?}");
        assert!(flushed.iter().any(|w| w.contains(line)), "{flushed:?}");
    }

    #[tokio::test]
    async fn every_chunk_gets_a_write_of_its_own() {
        let lines = ["one\n", "two\n", "three\n"];
        let flushed = writes_for(&lines, true).await;
        for line in lines {
            let carrying: Vec<&String> = flushed.iter().filter(|w| w.contains(line)).collect();
            assert_eq!(carrying.len(), 1, "{line:?} in {flushed:?}");
            for other in lines.iter().filter(|l| **l != line) {
                assert!(!carrying[0].contains(other), "{flushed:?}");
            }
        }
    }
}
