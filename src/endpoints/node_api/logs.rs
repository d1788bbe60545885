//! Container logs for `/containerLogs/<ns>/<pod>/<container>` (what `kubectl logs` reads
//! through the API server): the CRI log files the runtime writes under
//! `<podLogsDir>/<ns>_<name>_<uid>/<container>/<restart>.log`, one entry a line,
//! `<RFC3339Nano time> stdout|stderr P|F <message>`, turned back into the container's output
//! with upstream's options: `tailLines`, `limitBytes`, `sinceSeconds`/`sinceTime`,
//! `timestamps`, `previous` and `follow`.

use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::Duration;

use axum::body::Bytes;
use tokio::sync::mpsc;

/// How often a followed file is looked at for more.
const FOLLOW_POLL: Duration = Duration::from_millis(100);
/// How often, while a followed file is quiet, the container is checked for having ended.
const RUNNING_CHECK: Duration = Duration::from_secs(1);

/// The options of one request (upstream's `PodLogOptions` as the kubelet reads them).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LogOptions {
    pub follow: bool,
    pub previous: bool,
    pub timestamps: bool,
    pub tail_lines: Option<u64>,
    pub limit_bytes: Option<u64>,
    /// Entries older than this are skipped.
    pub since: Option<jiff::Timestamp>,
}

/// A query upstream refuses: 400 for what does not decode, 422 for what does not validate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LogQueryError {
    #[error("{{\"message\": \"Unable to decode query.\"}}")]
    Decode,
    #[error("{{\"message\": \"Invalid request.\"}}")]
    Invalid,
}

fn parse_bool(v: &str) -> Result<bool, LogQueryError> {
    match v.to_ascii_lowercase().as_str() {
        "true" | "1" => Ok(true),
        "false" | "0" | "" => Ok(false),
        _ => Err(LogQueryError::Decode),
    }
}

fn parse_int(v: &str) -> Result<i64, LogQueryError> {
    v.parse().map_err(|_| LogQueryError::Decode)
}

/// Reads the query string of a `/containerLogs` request at `now`.
pub fn parse_log_query(query: &str, now: jiff::Timestamp) -> Result<LogOptions, LogQueryError> {
    let mut o = LogOptions::default();
    let mut since_seconds = None;
    let mut since_time = None;
    let mut tail_lines = None;
    let mut limit_bytes = None;
    let pairs = form_pairs(query);
    // The old `tail` parameter stands for tailLines ("all" for no limit).
    let legacy_tail = pairs
        .iter()
        .find(|(k, _)| k == "tail")
        .map(|(_, v)| v.clone());
    for (k, v) in &pairs {
        match k.as_str() {
            "follow" => o.follow = parse_bool(v)?,
            "previous" => o.previous = parse_bool(v)?,
            "timestamps" => o.timestamps = parse_bool(v)?,
            "tailLines" if legacy_tail.is_none() => tail_lines = Some(parse_int(v)?),
            "limitBytes" => limit_bytes = Some(parse_int(v)?),
            "sinceSeconds" => since_seconds = Some(parse_int(v)?),
            "sinceTime" => {
                since_time = Some(
                    v.parse::<jiff::Timestamp>()
                        .map_err(|_| LogQueryError::Decode)?,
                )
            }
            _ => {}
        }
    }
    if let Some(t) = legacy_tail
        && t != "all"
    {
        tail_lines = Some(parse_int(&t)?);
    }
    if tail_lines.is_some_and(|n| n < 0)
        || limit_bytes.is_some_and(|n| n < 1)
        || since_seconds.is_some_and(|n| n < 1)
        || (since_seconds.is_some() && since_time.is_some())
    {
        return Err(LogQueryError::Invalid);
    }
    o.tail_lines = tail_lines.map(|n| n as u64);
    o.limit_bytes = limit_bytes.map(|n| n as u64);
    o.since = match (since_seconds, since_time) {
        (Some(s), _) => Some(now - jiff::SignedDuration::from_secs(s)),
        (_, Some(t)) => Some(t),
        _ => None,
    };
    Ok(o)
}

/// `application/x-www-form-urlencoded` pairs, percent-decoded.
fn form_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

/// One percent-encoded query value, decoded (`+` is a space).
pub fn parse_form_value(s: &str) -> String {
    percent_decode(s)
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Which output stream a log entry belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// One entry of a CRI log file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<'a> {
    pub time: jiff::Timestamp,
    pub stream: Stream,
    /// `P`: the message goes on in the next entry.
    pub partial: bool,
    /// The message; a full entry's ends with its newline.
    pub message: &'a [u8],
}

/// Parses one line of a CRI log file (with or without its trailing newline).
pub fn parse_entry(line: &[u8]) -> Option<Entry<'_>> {
    let mut rest = line;
    let mut field = || {
        let i = rest.iter().position(|&b| b == b' ')?;
        let f = &rest[..i];
        rest = &rest[i + 1..];
        Some(f)
    };
    let time = std::str::from_utf8(field()?).ok()?.parse().ok()?;
    let stream = match field()? {
        b"stdout" => Stream::Stdout,
        b"stderr" => Stream::Stderr,
        _ => return None,
    };
    let tags = field()?;
    let partial = tags.split(|&b| b == b':').next() == Some(b"P");
    let mut message = rest;
    if !message.ends_with(b"\n") && !partial {
        // The last line of a file that was cut short: still a whole entry.
    } else if partial && message.ends_with(b"\n") {
        message = &message[..message.len() - 1];
    }
    Some(Entry {
        time,
        stream,
        partial,
        message,
    })
}

/// Go's RFC 3339 with nanoseconds, trailing zeros of the fraction dropped (upstream's
/// `timestamps` prefix).
pub fn format_time(t: jiff::Timestamp) -> String {
    let secs = t.strftime("%Y-%m-%dT%H:%M:%S").to_string();
    let nanos = t.subsec_nanosecond();
    if nanos == 0 {
        return format!("{secs}Z");
    }
    let frac = format!("{nanos:09}");
    format!("{secs}.{}Z", frac.trim_end_matches('0'))
}

/// Turns entries into output: skips those before `since`, prefixes timestamps at the start
/// of each output line, stops at `limit_bytes`.
#[derive(Debug)]
pub struct Renderer {
    since: Option<jiff::Timestamp>,
    timestamps: bool,
    remaining: Option<u64>,
    /// Whether the next entry of each stream starts a line (after a partial one it does not).
    line_start: [bool; 2],
}

impl Renderer {
    pub fn new(o: &LogOptions) -> Renderer {
        Renderer {
            since: o.since,
            timestamps: o.timestamps,
            remaining: o.limit_bytes,
            line_start: [true, true],
        }
    }

    /// Whether the byte limit has been reached.
    pub fn done(&self) -> bool {
        self.remaining == Some(0)
    }

    /// The output for one file line (nothing for lines that do not parse or are too old).
    pub fn render(&mut self, line: &[u8], out: &mut Vec<u8>) {
        if self.done() {
            return;
        }
        let Some(entry) = parse_entry(line) else {
            tracing::debug!(line = %String::from_utf8_lossy(line), "skipping a log line that is not in CRI format");
            return;
        };
        if self.since.is_some_and(|s| entry.time < s) {
            return;
        }
        let idx = entry.stream as usize;
        let mut piece = Vec::with_capacity(entry.message.len() + 32);
        if self.timestamps && self.line_start[idx] {
            piece.extend_from_slice(format_time(entry.time).as_bytes());
            piece.push(b' ');
        }
        piece.extend_from_slice(entry.message);
        self.line_start[idx] = !entry.partial;
        if let Some(left) = self.remaining.as_mut() {
            let take = (piece.len() as u64).min(*left) as usize;
            piece.truncate(take);
            *left -= take as u64;
        }
        out.extend_from_slice(&piece);
    }
}

/// Where the last `n` lines of `data` begin (a final unterminated line counts as one).
pub fn tail_start(data: &[u8], n: u64) -> usize {
    if n == 0 {
        return data.len();
    }
    let mut end = data.len();
    if data.ends_with(b"\n") {
        end -= 1;
    }
    let mut seen = 0;
    for i in (0..end).rev() {
        if data[i] == b'\n' {
            seen += 1;
            if seen == n {
                return i + 1;
            }
        }
    }
    0
}

/// Renders the complete lines of `data`; returns how many bytes were used (an unterminated
/// last line is left for later unless `final_read`).
pub fn render_lines(r: &mut Renderer, data: &[u8], final_read: bool, out: &mut Vec<u8>) -> usize {
    let mut used = 0;
    while used < data.len() && !r.done() {
        let rest = &data[used..];
        match rest.iter().position(|&b| b == b'\n') {
            Some(i) => {
                r.render(&rest[..=i], out);
                used += i + 1;
            }
            None if final_read => {
                r.render(rest, out);
                used = data.len();
            }
            None => break,
        }
    }
    used
}

/// The log file numbers (`<n>.log`) in a container's log directory, ascending.
pub fn log_numbers(dir: &Path) -> Vec<u32> {
    let mut numbers: Vec<u32> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .filter_map(|e| e.file_name().to_str()?.strip_suffix(".log")?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    numbers.sort_unstable();
    numbers
}

/// Which file to read: the newest instance's, or with `previous` the one before it.
pub fn pick_log_file(dir: &Path, previous: bool) -> Option<PathBuf> {
    let numbers = log_numbers(dir);
    let n = if previous {
        numbers.iter().rev().nth(1)?
    } else {
        numbers.last()?
    };
    Some(dir.join(format!("{n}.log")))
}

/// Whether the container whose log is being followed still runs (checked while the file
/// is quiet; once it does not, following ends after a last read).
pub type StillRunning = Box<dyn Fn() -> bool + Send + Sync>;

/// Streams `path` with options `o` into `tx`, following it while `still_running` says so
/// (and `o.follow`). Ends when the client goes away (the channel closes).
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

async fn stream_file_inner(
    path: &Path,
    o: &LogOptions,
    still_running: StillRunning,
    tx: &mpsc::Sender<Bytes>,
) -> std::io::Result<()> {
    let mut file = std::fs::File::open(path)?;
    let mut data = Vec::new();
    file.read_to_end(&mut data)?;
    let start = o.tail_lines.map_or(0, |n| tail_start(&data, n));
    let mut renderer = Renderer::new(o);
    let mut out = Vec::new();
    let used = render_lines(&mut renderer, &data[start..], !o.follow, &mut out);
    let mut offset = (start + used) as u64;
    let mut pending: Vec<u8> = data[start + used..].to_vec();
    drop(data);
    if !out.is_empty() && tx.send(Bytes::from(out)).await.is_err() {
        return Ok(());
    }
    if !o.follow || renderer.done() {
        return Ok(());
    }
    offset += pending.len() as u64;
    let mut quiet_since = tokio::time::Instant::now();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // A rotated or truncated file is read again from its start.
        let len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(offset);
        if len < offset {
            file = std::fs::File::open(path)?;
            offset = 0;
            pending.clear();
        }
        file.seek(SeekFrom::Start(offset))?;
        let n = file.read(&mut buf)?;
        if n > 0 {
            offset += n as u64;
            pending.extend_from_slice(&buf[..n]);
            let mut out = Vec::new();
            let used = render_lines(&mut renderer, &pending, false, &mut out);
            pending.drain(..used);
            if !out.is_empty() && tx.send(Bytes::from(out)).await.is_err() {
                return Ok(());
            }
            if renderer.done() {
                return Ok(());
            }
            quiet_since = tokio::time::Instant::now();
            continue;
        }
        if quiet_since.elapsed() >= RUNNING_CHECK {
            if !still_running() {
                // One last look, then the end of the stream.
                let mut out = Vec::new();
                let mut rest = Vec::new();
                file.read_to_end(&mut rest)?;
                pending.extend_from_slice(&rest);
                render_lines(&mut renderer, &pending, true, &mut out);
                if !out.is_empty() {
                    let _ = tx.send(Bytes::from(out)).await;
                }
                return Ok(());
            }
            quiet_since = tokio::time::Instant::now();
        }
        tokio::select! {
            _ = tx.closed() => return Ok(()),
            _ = tokio::time::sleep(FOLLOW_POLL) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str = "\
2026-12-01T10:00:00.000000001Z stdout F one
2026-12-01T10:00:01.5Z stderr F two
2026-12-01T10:00:02.123456700Z stdout P thr
2026-12-01T10:00:02.223456700Z stdout F ee
not a cri line
2026-12-01T10:00:03Z stdout F four
2026-12-01T10:00:04Z stdout F five
";

    fn ts(s: &str) -> jiff::Timestamp {
        s.parse().unwrap()
    }

    fn render_all(o: &LogOptions, data: &str) -> String {
        let bytes = data.as_bytes();
        let start = o.tail_lines.map_or(0, |n| tail_start(bytes, n));
        let mut r = Renderer::new(o);
        let mut out = Vec::new();
        render_lines(&mut r, &bytes[start..], true, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn options_from_the_query() {
        let now = ts("2026-12-01T10:00:10Z");
        let cases: Vec<(&str, Result<LogOptions, LogQueryError>)> = vec![
            ("", Ok(LogOptions::default())),
            (
                "follow=true&tailLines=5&limitBytes=100&timestamps=1&previous=false",
                Ok(LogOptions {
                    follow: true,
                    timestamps: true,
                    tail_lines: Some(5),
                    limit_bytes: Some(100),
                    ..Default::default()
                }),
            ),
            (
                "sinceSeconds=4",
                Ok(LogOptions {
                    since: Some(ts("2026-12-01T10:00:06Z")),
                    ..Default::default()
                }),
            ),
            (
                "sinceTime=2026-12-01T10%3A00%3A03Z",
                Ok(LogOptions {
                    since: Some(ts("2026-12-01T10:00:03Z")),
                    ..Default::default()
                }),
            ),
            (
                "tail=2&tailLines=9",
                Ok(LogOptions {
                    tail_lines: Some(2),
                    ..Default::default()
                }),
            ),
            ("tail=all&tailLines=9", Ok(LogOptions::default())),
            ("follow=yes", Err(LogQueryError::Decode)),
            ("tailLines=x", Err(LogQueryError::Decode)),
            ("sinceTime=yesterday", Err(LogQueryError::Decode)),
            ("tailLines=-1", Err(LogQueryError::Invalid)),
            ("limitBytes=0", Err(LogQueryError::Invalid)),
            ("sinceSeconds=0", Err(LogQueryError::Invalid)),
            (
                "sinceSeconds=3&sinceTime=2026-12-01T10:00:03Z",
                Err(LogQueryError::Invalid),
            ),
        ];
        for (q, want) in cases {
            assert_eq!(parse_log_query(q, now), want, "{q}");
        }
    }

    #[test]
    fn rendering_table() {
        let cases: Vec<(LogOptions, &str)> = vec![
            (LogOptions::default(), "one\ntwo\nthree\nfour\nfive\n"),
            (
                LogOptions {
                    tail_lines: Some(2),
                    ..Default::default()
                },
                "four\nfive\n",
            ),
            (
                LogOptions {
                    tail_lines: Some(0),
                    ..Default::default()
                },
                "",
            ),
            (
                LogOptions {
                    tail_lines: Some(100),
                    ..Default::default()
                },
                "one\ntwo\nthree\nfour\nfive\n",
            ),
            (
                LogOptions {
                    limit_bytes: Some(10),
                    ..Default::default()
                },
                "one\ntwo\nth",
            ),
            (
                LogOptions {
                    since: Some(ts("2026-12-01T10:00:02.2Z")),
                    ..Default::default()
                },
                "ee\nfour\nfive\n",
            ),
            (
                LogOptions {
                    timestamps: true,
                    tail_lines: Some(5),
                    ..Default::default()
                },
                "2026-12-01T10:00:02.1234567Z three\n2026-12-01T10:00:03Z four\n2026-12-01T10:00:04Z five\n",
            ),
            (
                LogOptions {
                    timestamps: true,
                    limit_bytes: Some(40),
                    ..Default::default()
                },
                "2026-12-01T10:00:00.000000001Z one\n2026-",
            ),
        ];
        for (i, (o, want)) in cases.iter().enumerate() {
            assert_eq!(render_all(o, FIXTURE), *want, "case {i}: {o:?}");
        }
    }

    #[test]
    fn entries_and_times() {
        let e = parse_entry(b"2026-12-01T10:00:00.5Z stderr P:x part\n").unwrap();
        assert_eq!(e.stream, Stream::Stderr);
        assert!(e.partial);
        assert_eq!(e.message, b"part");
        let e = parse_entry(b"2026-12-01T10:00:00Z stdout F  spaced \n").unwrap();
        assert_eq!(e.message, b" spaced \n");
        assert!(parse_entry(b"garbage").is_none());
        assert!(parse_entry(b"2026-12-01T10:00:00Z stdin F x\n").is_none());
        assert_eq!(
            format_time(ts("2026-12-01T10:00:00.100Z")),
            "2026-12-01T10:00:00.1Z"
        );
        assert_eq!(
            format_time(ts("2026-12-01T10:00:00Z")),
            "2026-12-01T10:00:00Z"
        );
    }

    #[test]
    fn current_and_previous_files() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(pick_log_file(dir.path(), false), None);
        for n in [0, 2, 10] {
            std::fs::write(dir.path().join(format!("{n}.log")), "").unwrap();
        }
        std::fs::write(dir.path().join("x.log"), "").unwrap();
        assert_eq!(
            pick_log_file(dir.path(), false),
            Some(dir.path().join("10.log"))
        );
        assert_eq!(
            pick_log_file(dir.path(), true),
            Some(dir.path().join("2.log"))
        );
        let one = tempfile::tempdir().unwrap();
        std::fs::write(one.path().join("0.log"), "").unwrap();
        assert_eq!(pick_log_file(one.path(), true), None);
    }

    #[tokio::test]
    async fn follow_sees_appended_lines_and_ends_with_the_container() {
        use std::io::Write;
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("0.log");
        std::fs::write(&path, "2026-12-01T10:00:00Z stdout F old\n").unwrap();
        let running = Arc::new(AtomicBool::new(true));
        let flag = running.clone();
        let (tx, mut rx) = mpsc::channel(16);
        let task = tokio::spawn(stream_file(
            path.clone(),
            LogOptions {
                follow: true,
                ..Default::default()
            },
            Box::new(move || flag.load(Ordering::SeqCst)),
            tx,
        ));
        assert_eq!(rx.recv().await.unwrap(), Bytes::from_static(b"old\n"));
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        f.write_all(b"2026-12-01T10:00:01Z stdout P ne").unwrap();
        f.flush().unwrap();
        f.write_all(b"w\n2026-12-01T10:00:01Z stdout F !\n")
            .unwrap();
        f.flush().unwrap();
        let mut got = Vec::new();
        while got != b"new!\n" {
            got.extend_from_slice(&rx.recv().await.unwrap());
        }
        running.store(false, Ordering::SeqCst);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("following ends once the container has stopped")
            .unwrap();
        assert!(rx.recv().await.is_none());
    }
}
