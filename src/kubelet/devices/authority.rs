//! Lets gRPC clients that name a Unix socket's path as the HTTP/2 `:authority` reach the
//! device plugin and pod-resources servers. grpc-go dialing a bare path (upstream's device
//! plugin stub does: `grpc.DialContext(ctx, "/var/lib/kubelet/device-plugins/kubelet.sock")`)
//! sends that path as `:authority`; the HTTP/2 server under tonic (`h2`) refuses it as
//! malformed (RST_STREAM PROTOCOL_ERROR, hyperium/h2#487). Upstream's kubelet (grpc-go) takes
//! it. So each connection's client-to-server bytes pass through [`AuthorityFix`], which
//! rewrites a literal `:authority` in each HEADERS frame to `localhost` (a literal with
//! incremental indexing stays one, so the HPACK dynamic tables of both ends stay in step:
//! the server's entry is only smaller, so it never evicts an entry the client still uses).
//! Everything else passes unchanged.

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The HTTP/2 client preface.
const PREFACE_LEN: usize = 24;
const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const FLAG_PADDED: u8 = 0x8;
const FLAG_PRIORITY: u8 = 0x20;
/// `:authority` is entry 1 of HPACK's static table.
const AUTHORITY_INDEX: u64 = 1;

/// An HPACK integer with an `n`-bit prefix at `block[at]`: its value and the bytes it took.
fn integer(block: &[u8], at: usize, n: u32) -> Option<(u64, usize)> {
    let max = (1u64 << n) - 1;
    let first = u64::from(*block.get(at)?) & max;
    if first < max {
        return Some((first, 1));
    }
    let (mut value, mut shift, mut i) = (max, 0u32, at + 1);
    loop {
        let b = *block.get(i)?;
        value = value.checked_add(u64::from(b & 0x7f).checked_shl(shift)?)?;
        i += 1;
        if b & 0x80 == 0 {
            return Some((value, i - at));
        }
        shift += 7;
        if shift > 56 {
            return None;
        }
    }
}

/// The length of the HPACK string at `block[at]` (length prefix and bytes).
fn string_len(block: &[u8], at: usize) -> Option<usize> {
    let (len, took) = integer(block, at, 7)?;
    let total = took.checked_add(usize::try_from(len).ok()?)?;
    (at + total <= block.len()).then_some(total)
}

/// A header block with each literal `:authority` (an indexed name, static entry 1) replaced
/// by `localhost`; `None` when it does not parse (it is then passed on as it came).
pub(crate) fn rewrite_block(block: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(block.len());
    let mut at = 0;
    while at < block.len() {
        let b = block[at];
        if b & 0x80 != 0 {
            // Indexed field.
            let (_, took) = integer(block, at, 7)?;
            out.extend_from_slice(&block[at..at + took]);
            at += took;
            continue;
        }
        if b & 0xe0 == 0x20 {
            // Dynamic table size update.
            let (_, took) = integer(block, at, 5)?;
            out.extend_from_slice(&block[at..at + took]);
            at += took;
            continue;
        }
        // Literals: with incremental indexing (01, 6-bit index), else without or never
        // indexed (0000 / 0001, 4-bit index).
        let prefix = if b & 0x40 != 0 { 6 } else { 4 };
        let (index, took) = integer(block, at, prefix)?;
        let mut end = at + took;
        if index == 0 {
            end += string_len(block, end)?;
        }
        let value = string_len(block, end)?;
        if index == AUTHORITY_INDEX {
            // The same representation and index, with the value `localhost` (no Huffman).
            out.push(block[at] & if prefix == 6 { 0xc0 } else { 0xf0 } | 1);
            out.push(9);
            out.extend_from_slice(b"localhost");
        } else {
            out.extend_from_slice(&block[at..end + value]);
        }
        at = end + value;
    }
    Some(out)
}

/// A HEADERS frame (9-byte header and payload) with its block rewritten; other frames as they
/// are.
fn rewrite_frame(frame: &[u8]) -> Vec<u8> {
    let (kind, flags) = (frame[3], frame[4]);
    let payload = &frame[FRAME_HEADER..];
    if kind != HEADERS {
        return frame.to_vec();
    }
    let pad = if flags & FLAG_PADDED != 0 {
        usize::from(*payload.first().unwrap_or(&0))
    } else {
        0
    };
    let mut start = usize::from(flags & FLAG_PADDED != 0);
    if flags & FLAG_PRIORITY != 0 {
        start += 5;
    }
    if start + pad > payload.len() {
        return frame.to_vec();
    }
    let block = &payload[start..payload.len() - pad];
    let Some(new_block) = rewrite_block(block) else {
        return frame.to_vec();
    };
    let new_len = start + new_block.len() + pad;
    let Ok(len) = u32::try_from(new_len) else {
        return frame.to_vec();
    };
    let mut out = Vec::with_capacity(FRAME_HEADER + new_len);
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.extend_from_slice(&frame[3..FRAME_HEADER]);
    out.extend_from_slice(&payload[..start]);
    out.extend_from_slice(&new_block);
    out.extend_from_slice(&payload[payload.len() - pad..]);
    out
}

/// A server-side connection whose incoming HEADERS frames get a usable `:authority`.
pub(crate) struct AuthorityFix<S> {
    inner: S,
    /// Bytes read and not yet framed.
    pending: Vec<u8>,
    /// Bytes ready to hand to the server.
    ready: Vec<u8>,
    preface_left: usize,
    eof: bool,
}

impl<S> AuthorityFix<S> {
    pub(crate) fn new(inner: S) -> AuthorityFix<S> {
        AuthorityFix {
            inner,
            pending: Vec::new(),
            ready: Vec::new(),
            preface_left: PREFACE_LEN,
            eof: false,
        }
    }

    /// Moves whole frames (and the preface) from `pending` to `ready`.
    fn frame(&mut self) {
        if self.preface_left > 0 {
            let n = self.preface_left.min(self.pending.len());
            self.ready.extend(self.pending.drain(..n));
            self.preface_left -= n;
        }
        while self.preface_left == 0 && self.pending.len() >= FRAME_HEADER {
            let len = usize::from(self.pending[0]) << 16
                | usize::from(self.pending[1]) << 8
                | usize::from(self.pending[2]);
            if self.pending.len() < FRAME_HEADER + len {
                break;
            }
            let frame: Vec<u8> = self.pending.drain(..FRAME_HEADER + len).collect();
            self.ready.extend(rewrite_frame(&frame));
        }
        if self.eof {
            // A truncated frame at the end: hand it on as it is.
            self.ready.append(&mut self.pending);
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for AuthorityFix<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        loop {
            if !this.ready.is_empty() {
                let n = this.ready.len().min(buf.remaining());
                buf.put_slice(&this.ready[..n]);
                this.ready.drain(..n);
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; 16 * 1024];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Ready(Ok(())) => {
                    if read.filled().is_empty() {
                        this.eof = true;
                    }
                    this.pending.extend_from_slice(read.filled());
                    this.frame();
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, data)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for AuthorityFix<tokio::net::UnixStream> {
    type ConnectInfo = <tokio::net::UnixStream as tonic::transport::server::Connected>::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// The listener's connections, each wrapped.
pub(crate) fn incoming(
    listener: tokio::net::UnixListener,
) -> impl futures::Stream<Item = std::io::Result<AuthorityFix<tokio::net::UnixStream>>> {
    use futures::StreamExt as _;
    tokio_stream::wrappers::UnixListenerStream::new(listener)
        .map(|conn| conn.map(AuthorityFix::new))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_literal_path_authority_becomes_localhost_and_the_rest_stays() {
        // :method POST (indexed 3), :path literal with indexing (name 4), :authority literal
        // with indexing (name 1) "/a/b.sock", a header with a literal name, then :authority
        // without indexing (0000 0001).
        let mut block = vec![0x83, 0x44, 0x02, b'/', b'x', 0x41, 0x09];
        block.extend_from_slice(b"/a/b.sock");
        block.extend_from_slice(&[0x40, 0x01, b'k', 0x01, b'v', 0x01, 0x03]);
        block.extend_from_slice(b"/zz");
        let got = rewrite_block(&block).unwrap();
        let mut want = vec![0x83, 0x44, 0x02, b'/', b'x', 0x41, 0x09];
        want.extend_from_slice(b"localhost");
        want.extend_from_slice(&[0x40, 0x01, b'k', 0x01, b'v', 0x01, 0x09]);
        want.extend_from_slice(b"localhost");
        assert_eq!(got, want);
        // Truncated: not parsed.
        assert!(rewrite_block(&[0x41, 0x09, b'/']).is_none());
    }

    #[test]
    fn a_headers_frame_gets_its_new_length_and_other_frames_pass() {
        let mut block = vec![0x41, 0x03];
        block.extend_from_slice(b"/ab");
        let mut frame = vec![
            0,
            0,
            u8::try_from(block.len()).unwrap(),
            HEADERS,
            0x4,
            0,
            0,
            0,
            1,
        ];
        frame.extend_from_slice(&block);
        let got = rewrite_frame(&frame);
        assert_eq!(&got[..3], &[0, 0, 11]);
        assert_eq!(&got[3..9], &frame[3..9]);
        assert_eq!(&got[9..], b"\x41\x09localhost");
        let data = vec![0, 0, 2, 0x0, 0x1, 0, 0, 0, 1, 7, 7];
        assert_eq!(rewrite_frame(&data), data);
    }
}
