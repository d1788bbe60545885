//! Reading a container's log for one request in bounded memory, off the async runtime.
//!
//! The tail (`tailLines`) is found by reading the file backwards in fixed-size blocks from its
//! end, going on into the log's earlier rotations (`<n>.log.<timestamp>`, the ones not
//! compressed yet) when the current file holds fewer lines. From there the files are read
//! forwards one block at a time, each block on a blocking thread, into a bounded channel; a
//! line longer than [`MAX_LINE`] is passed through piece by piece instead of being held whole.
//! So a request holds a block, one line's head and the channel's few chunks, whatever the
//! size of the log (a whole-file read took the agent from 18 MB to 430 MB for `tailLines=1`
//! on a 213 MB log, and stalled the runtime's threads meanwhile).

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::body::Bytes;
use tokio::sync::mpsc;

use super::logs::{LogOptions, Renderer, Shown};
use crate::base::clock;

/// How much of a file one read takes, backwards while looking for the tail and forwards while
/// streaming.
pub const BLOCK: usize = 64 * 1024;
/// The longest file line held whole. The runtime splits a container's output into entries of
/// at most 16 KiB (containerd's `max_container_log_line_size`), so only a file written by
/// something else has longer ones; their head is rendered and the rest passed through.
pub const MAX_LINE: usize = 256 * 1024;
/// How many rendered chunks (each from at most one block) may wait for a slow client.
pub const CHANNEL_CHUNKS: usize = 4;
/// How often a followed file is looked at for more.
const FOLLOW_POLL: Duration = Duration::from_millis(100);
/// How often, while a followed file is quiet, the container is checked for having ended.
const RUNNING_CHECK: Duration = Duration::from_secs(1);

/// Reads at a position: a file, or bytes in memory (tests and the fuzz target).
pub trait ReadAt {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
}

impl ReadAt for File {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }
}

impl ReadAt for [u8] {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let start = usize::try_from(offset)
            .ok()
            .filter(|&s| s <= self.len() && self.len() - s >= buf.len())
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(&self[start..start + buf.len()]);
        Ok(())
    }
}

/// Where the last `n` lines of a log begin, as (segment, offset in it). `segments` are the
/// log's files oldest first, each with the length to consider; each file's lines are its own
/// (a final unterminated line counts as one, as in [`super::logs::tail_start`]). Files are
/// read backwards `block` bytes at a time, and older ones only while more lines are needed.
pub fn find_tail<R: ReadAt + ?Sized>(
    segments: &[(&R, u64)],
    n: u64,
    block: usize,
) -> io::Result<(usize, u64)> {
    let Some(last) = segments.len().checked_sub(1) else {
        return Ok((0, 0));
    };
    if n == 0 {
        return Ok((last, segments[last].1));
    }
    let mut buf = vec![0u8; block.max(1)];
    let mut need = n;
    for (idx, &(reader, len)) in segments.iter().enumerate().rev() {
        match tail_in(reader, len, need, &mut buf)? {
            Found::At(offset) => return Ok((idx, offset)),
            Found::Short(lines) => need -= lines,
        }
    }
    Ok((0, 0))
}

enum Found {
    At(u64),
    /// The segment has this many lines, fewer than needed.
    Short(u64),
}

/// The start of the last `need` (at least 1) lines of one segment, or its line count when it
/// has fewer.
fn tail_in<R: ReadAt + ?Sized>(
    reader: &R,
    len: u64,
    need: u64,
    buf: &mut [u8],
) -> io::Result<Found> {
    if len == 0 {
        return Ok(Found::Short(0));
    }
    // A final newline ends the last line; it does not start another one.
    let mut end = len;
    let mut last = [0u8];
    reader.read_exact_at(&mut last, len - 1)?;
    if last[0] == b'\n' {
        end -= 1;
    }
    let mut seen = 0;
    while end > 0 {
        let start = end.saturating_sub(buf.len() as u64);
        let chunk = &mut buf[..(end - start) as usize];
        reader.read_exact_at(chunk, start)?;
        for (i, &b) in chunk.iter().enumerate().rev() {
            if b == b'\n' {
                seen += 1;
                if seen == need {
                    return Ok(Found::At(start + i as u64 + 1));
                }
            }
        }
        end = start;
    }
    // Every newline is counted; the first line has none before it.
    Ok(if seen + 1 == need {
        Found::At(0)
    } else {
        Found::Short(seen + 1)
    })
}

/// The earlier rotations of `log` (a file name) among `siblings`, oldest first: the ones a
/// tail can be read from (compressed ones, and a compression's `.tmp`, are not).
pub fn readable_rotations(log: &str, siblings: &[String]) -> Vec<String> {
    let prefix = format!("{log}.");
    let mut found: Vec<String> = siblings
        .iter()
        .filter(|n| n.starts_with(&prefix) && !n.ends_with(".gz") && !n.ends_with(".tmp"))
        .cloned()
        .collect();
    // `<log>.<YYYYMMDD-HHMMSS>`: the timestamps sort as text.
    found.sort_unstable();
    found
}

/// Turns file bytes into output a block at a time. Whole lines go to the renderer; a line
/// longer than `max_line` has its head rendered and the rest passed through (or skipped, with
/// its head) as it comes, so at most `max_line` plus one block is held.
#[derive(Debug)]
pub struct Pump {
    renderer: Renderer,
    pending: Vec<u8>,
    /// Inside a line too long to hold: what became of its head.
    overlong: Option<Shown>,
    max_line: usize,
}

impl Pump {
    pub fn new(renderer: Renderer, max_line: usize) -> Pump {
        Pump {
            renderer,
            pending: Vec::new(),
            overlong: None,
            max_line: max_line.max(1),
        }
    }

    /// Whether `limitBytes` has been reached.
    pub fn done(&self) -> bool {
        self.renderer.done()
    }

    /// Renders the lines `data` completes; keeps an unfinished one for the next call.
    pub fn feed(&mut self, mut data: &[u8], out: &mut Vec<u8>) {
        while !data.is_empty() && !self.done() {
            let newline = data.iter().position(|&b| b == b'\n');
            if let Some(shown) = self.overlong {
                let piece = &data[..newline.unwrap_or(data.len())];
                if shown.emit {
                    self.renderer.emit(piece, out);
                }
                let Some(i) = newline else { return };
                if shown.emit && !shown.partial {
                    self.renderer.emit(b"\n", out);
                }
                self.overlong = None;
                data = &data[i + 1..];
                continue;
            }
            match newline {
                Some(i) if self.pending.is_empty() => {
                    self.renderer.render(&data[..=i], out);
                    data = &data[i + 1..];
                }
                Some(i) => {
                    self.pending.extend_from_slice(&data[..=i]);
                    self.render_pending(out);
                    data = &data[i + 1..];
                }
                None => {
                    let take = data.len().min(self.max_line - self.pending.len());
                    self.pending.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    if self.pending.len() >= self.max_line {
                        let shown = self.render_pending(out);
                        // A head that is no entry: the rest of its line goes too.
                        self.overlong = Some(shown.unwrap_or(Shown {
                            emit: false,
                            partial: true,
                        }));
                    }
                }
            }
        }
    }

    /// The end of a file: an unterminated last line is a whole entry.
    pub fn end_of_file(&mut self, out: &mut Vec<u8>) {
        if !self.pending.is_empty() && !self.done() {
            self.render_pending(out);
        }
        self.pending.clear();
        self.overlong = None;
    }

    /// Forgets an unfinished line (the file was truncated under it).
    pub fn drop_line(&mut self) {
        self.pending.clear();
        self.overlong = None;
    }

    fn render_pending(&mut self, out: &mut Vec<u8>) -> Option<Shown> {
        let line = std::mem::take(&mut self.pending);
        let shown = self.renderer.render(&line, out);
        self.pending = line;
        self.pending.clear();
        shown
    }
}

/// One file of the log being read.
#[derive(Debug)]
struct Segment {
    file: File,
    /// Read up to here; `None` for the followed file, read as long as it grows.
    end: Option<u64>,
}

/// What one step of a [`LogReader`] gave.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Output (possibly none: progress without output).
    Data(Vec<u8>),
    /// Nothing new in the followed file for now.
    Idle,
    /// The end: the files are read, or `limitBytes` is reached.
    Done,
}

/// One request's reading position in a container's log, moved to a blocking thread for each
/// step.
#[derive(Debug)]
pub struct LogReader {
    /// The current file's name, looked at again when following.
    path: PathBuf,
    /// The files still to read, oldest first; the last is `path`'s.
    segments: Vec<Segment>,
    offset: u64,
    pump: Pump,
    buf: Vec<u8>,
    follow: bool,
    finished: bool,
}

impl LogReader {
    /// Opens `path` (a `<n>.log`) for a request with options `o`, positioned at its tail.
    pub fn open(path: &Path, o: &LogOptions) -> io::Result<LogReader> {
        let current = File::open(path)?;
        let current_len = current.metadata()?.len();
        let mut files = match o.tail_lines {
            Some(n) if n > 0 => open_rotations(path),
            _ => Vec::new(),
        };
        files.push((current, current_len));
        let (first, offset) = match o.tail_lines {
            Some(n) => {
                let segments: Vec<(&File, u64)> = files.iter().map(|(f, l)| (f, *l)).collect();
                find_tail(&segments, n, BLOCK)?
            }
            None => (files.len() - 1, 0),
        };
        let last = files.len() - 1;
        let segments = files
            .into_iter()
            .enumerate()
            .skip(first)
            .map(|(i, (file, len))| Segment {
                file,
                end: (i < last || !o.follow).then_some(len),
            })
            .collect();
        Ok(LogReader {
            path: path.to_path_buf(),
            segments,
            offset,
            pump: Pump::new(Renderer::new(o), MAX_LINE),
            buf: vec![0u8; BLOCK],
            follow: o.follow,
            finished: false,
        })
    }

    /// Reads at most one block and renders it.
    pub fn step(&mut self) -> io::Result<Step> {
        if self.finished || self.pump.done() {
            return Ok(Step::Done);
        }
        let mut out = Vec::new();
        let segment = &self.segments[0];
        let want = match segment.end {
            Some(end) => end.saturating_sub(self.offset).min(BLOCK as u64) as usize,
            None => BLOCK,
        };
        let n = match want {
            0 => 0,
            _ => segment.file.read_at(&mut self.buf[..want], self.offset)?,
        };
        if n > 0 {
            self.offset += n as u64;
            self.pump.feed(&self.buf[..n], &mut out);
            return Ok(Step::Data(out));
        }
        if self.segments.len() > 1 {
            self.segments.remove(0);
            self.offset = 0;
            self.pump.end_of_file(&mut out);
            return Ok(Step::Data(out));
        }
        if !self.follow {
            self.finish(&mut out);
            return Ok(Step::Data(out));
        }
        self.look_for_rotation()
    }

    /// The last of a followed log once its container has ended: the rest of the file, with an
    /// unterminated last line.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        self.pump.end_of_file(out);
        self.finished = true;
    }

    /// At the end of the followed file: when the runtime now writes another file under the
    /// name (rotation), what was written to ours is read to its present end, then the new one;
    /// a file cut short is read again from its start. Lines written to the old file between
    /// this look and the runtime's reopening of the log are missed (upstream misses them too).
    fn look_for_rotation(&mut self) -> io::Result<Step> {
        let Ok(named) = std::fs::metadata(&self.path) else {
            // Renamed, not yet reopened by the runtime.
            return Ok(Step::Idle);
        };
        let ours = self.segments[0].file.metadata()?;
        if named.ino() != ours.ino() || named.dev() != ours.dev() {
            let new = File::open(&self.path)?;
            self.segments[0].end = Some(ours.len());
            self.segments.push(Segment {
                file: new,
                end: None,
            });
            return Ok(Step::Data(Vec::new()));
        }
        if named.len() < self.offset {
            self.offset = 0;
            self.pump.drop_line();
            return Ok(Step::Data(Vec::new()));
        }
        Ok(Step::Idle)
    }
}

/// The readable earlier rotations of `path`, oldest first, opened with their lengths (one
/// compressed or removed in the meantime is left out).
fn open_rotations(path: &Path) -> Vec<(File, u64)> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return Vec::new();
    };
    let siblings: Vec<String> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    readable_rotations(name, &siblings)
        .into_iter()
        .filter_map(|n| {
            let file = File::open(dir.join(n)).ok()?;
            let len = file.metadata().ok()?.len();
            Some((file, len))
        })
        .collect()
}

/// Whether the container whose log is being followed still runs (checked while the file
/// is quiet; once it does not, following ends after a last read).
pub type StillRunning = Box<dyn Fn() -> bool + Send + Sync>;

/// Streams the log at `path` with options `o` into `tx`, following it while `still_running`
/// says so (and `o.follow`). Ends when the client goes away (the channel closes). Every read
/// runs on a blocking thread; the task holds none while it waits.
pub async fn stream_file(
    path: PathBuf,
    o: LogOptions,
    still_running: StillRunning,
    tx: mpsc::Sender<Bytes>,
) {
    if let Err(e) = stream_file_inner(&path, &o, still_running, &tx).await {
        tracing::debug!(file = %path.display(), error = %e, "log streaming ended");
    }
}

/// Runs `f` on `reader` on a blocking thread and hands the reader back.
async fn blocking<T: Send + 'static>(
    mut reader: LogReader,
    f: impl FnOnce(&mut LogReader) -> T + Send + 'static,
) -> io::Result<(LogReader, T)> {
    tokio::task::spawn_blocking(move || {
        let t = f(&mut reader);
        (reader, t)
    })
    .await
    .map_err(io::Error::other)
}

async fn stream_file_inner(
    path: &Path,
    o: &LogOptions,
    still_running: StillRunning,
    tx: &mpsc::Sender<Bytes>,
) -> io::Result<()> {
    let (p, opts) = (path.to_path_buf(), o.clone());
    let mut reader = tokio::task::spawn_blocking(move || LogReader::open(&p, &opts))
        .await
        .map_err(io::Error::other)??;
    let mut quiet_since = clock::instant();
    loop {
        let (r, step) = blocking(reader, LogReader::step).await?;
        reader = r;
        match step? {
            Step::Data(out) => {
                if !out.is_empty() && tx.send(Bytes::from(out)).await.is_err() {
                    return Ok(());
                }
                quiet_since = clock::instant();
            }
            Step::Done => return Ok(()),
            Step::Idle => {
                if quiet_since.elapsed() >= RUNNING_CHECK {
                    if !still_running() {
                        return drain(reader, tx).await;
                    }
                    quiet_since = clock::instant();
                }
                tokio::select! {
                    _ = tx.closed() => return Ok(()),
                    _ = tokio::time::sleep(FOLLOW_POLL) => {}
                }
            }
        }
    }
}

/// One last look at a followed log whose container has ended: what is left, then the end.
async fn drain(mut reader: LogReader, tx: &mpsc::Sender<Bytes>) -> io::Result<()> {
    loop {
        let (r, step) = blocking(reader, LogReader::step).await?;
        reader = r;
        let out = match step? {
            Step::Data(out) => out,
            Step::Done => return Ok(()),
            Step::Idle => {
                let (_, out) = blocking(reader, |r| {
                    let mut out = Vec::new();
                    r.finish(&mut out);
                    out
                })
                .await?;
                if !out.is_empty() {
                    let _ = tx.send(Bytes::from(out)).await;
                }
                return Ok(());
            }
        };
        if !out.is_empty() && tx.send(Bytes::from(out)).await.is_err() {
            return Ok(());
        }
    }
}

#[cfg(test)]
#[path = "log_read_tests.rs"]
mod tests;
