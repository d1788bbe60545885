//! Container logs for `/containerLogs/<ns>/<pod>/<container>` (what `kubectl logs` reads
//! through the API server): the CRI log files the runtime writes under
//! `<podLogsDir>/<ns>_<name>_<uid>/<container>/<restart>.log`, one entry a line,
//! `<RFC3339Nano time> stdout|stderr P|F <message>`, turned back into the container's output
//! with upstream's options: `tailLines`, `limitBytes`, `sinceSeconds`/`sinceTime`,
//! `timestamps`, `previous` and `follow`.

use std::path::{Path, PathBuf};

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
        (Some(s), _) => Some(since_seconds_ago(now, s)),
        (_, Some(t)) => Some(t),
        _ => None,
    };
    Ok(o)
}

/// `seconds` before `now`, clamped to the earliest time there is: a `sinceSeconds` that
/// reaches past it (up to `i64::MAX`, which the API server lets through) asks for every
/// entry, as upstream's wrapped-around time does in effect, instead of overflowing.
fn since_seconds_ago(now: jiff::Timestamp, seconds: i64) -> jiff::Timestamp {
    now.checked_sub(jiff::SignedDuration::from_secs(seconds))
        .unwrap_or(jiff::Timestamp::MIN)
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
            b'%' if i + 2 < bytes.len() => match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                // Two hex digits exactly (`from_str_radix` would also take a sign: `%+1`).
                (Some(hi), Some(lo)) => {
                    out.push(hi << 4 | lo);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
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
    /// `None` when the line is not a CRI entry; otherwise whether its message was shown (a
    /// line cut short by the reader goes on through [`Renderer::emit`] when it was).
    pub fn render(&mut self, line: &[u8], out: &mut Vec<u8>) -> Option<Shown> {
        let Some(entry) = parse_entry(line) else {
            tracing::debug!(line = %String::from_utf8_lossy(&line[..line.len().min(256)]), "skipping a log line that is not in CRI format");
            return None;
        };
        let partial = entry.partial;
        if self.done() || self.since.is_some_and(|s| entry.time < s) {
            return Some(Shown {
                emit: false,
                partial,
            });
        }
        let idx = entry.stream as usize;
        if self.timestamps && self.line_start[idx] {
            let stamp = format_time(entry.time);
            self.emit(stamp.as_bytes(), out);
            self.emit(b" ", out);
        }
        self.emit(entry.message, out);
        self.line_start[idx] = !partial;
        Some(Shown {
            emit: true,
            partial,
        })
    }

    /// Appends `bytes` of content to `out`, as far as `limitBytes` allows.
    pub fn emit(&mut self, bytes: &[u8], out: &mut Vec<u8>) {
        let take = match self.remaining.as_mut() {
            Some(left) => {
                let take = (bytes.len() as u64).min(*left) as usize;
                *left -= take as u64;
                take
            }
            None => bytes.len(),
        };
        out.extend_from_slice(&bytes[..take]);
    }
}

/// What [`Renderer::render`] did with an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shown {
    /// Its message went to the output (not too old, limit not reached).
    pub emit: bool,
    /// A `P` entry: its line's newline is not part of the message.
    pub partial: bool,
}

/// Where the last `n` lines of `data` begin (a final unterminated line counts as one): the
/// in-memory reference that [`super::log_read::find_tail`], which reads files backwards in
/// blocks, is checked against (unit tests, the `container_log` fuzz target).
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
        let mut pump = super::super::log_read::Pump::new(Renderer::new(o), 1024);
        let mut out = Vec::new();
        pump.feed(&bytes[start..], &mut out);
        pump.end_of_file(&mut out);
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
            // Reaches past the earliest time there is: every entry (it overflowed, a panic).
            (
                "sinceSeconds=9223372036854775807",
                Ok(LogOptions {
                    since: Some(jiff::Timestamp::MIN),
                    ..Default::default()
                }),
            ),
            (
                "sinceSeconds=9223372036854775808",
                Err(LogQueryError::Decode),
            ),
            (
                "tailLines=%2B1",
                Ok(LogOptions {
                    tail_lines: Some(1),
                    ..Default::default()
                }),
            ),
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
    fn form_values() {
        let cases = [
            ("a+b%20c", "a b c"),
            ("%41%7e", "A~"),
            // Not escapes: a sign is no hex digit (`from_str_radix` took `+1` for 0x01), nor
            // is `%4`.
            ("%+1", "% 1"),
            ("%-1x", "%-1x"),
            ("%4", "%4"),
            ("%", "%"),
            ("%zz%41", "%zzA"),
            ("%ff", "\u{fffd}"),
        ];
        for (raw, want) in cases {
            assert_eq!(parse_form_value(raw), want, "{raw}");
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
}
