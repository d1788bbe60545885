use super::*;
use crate::endpoints::node_api::logs::tail_start;

/// `find_tail` over in-memory segments.
fn tail(segments: &[&str], n: u64, block: usize) -> (usize, u64) {
    let segs: Vec<(&[u8], u64)> = segments
        .iter()
        .map(|s| (s.as_bytes(), s.len() as u64))
        .collect();
    find_tail(&segs, n, block).unwrap()
}

#[test]
fn backward_tail_table() {
    type Case<'a> = (&'a str, Vec<&'a str>, u64, (usize, u64));
    let cases: Vec<Case> = vec![
        ("empty log", vec![""], 3, (0, 0)),
        ("no lines wanted", vec!["a\nb\n"], 0, (0, 4)),
        ("last line", vec!["a\nb\nc\n"], 1, (0, 4)),
        ("two lines", vec!["a\nb\nc\n"], 2, (0, 2)),
        ("exactly all", vec!["a\nb\nc\n"], 3, (0, 0)),
        ("more than there are", vec!["a\nb\nc\n"], 9, (0, 0)),
        ("no trailing newline", vec!["a\nb\nc"], 1, (0, 4)),
        ("no trailing newline, two", vec!["a\nb\nc"], 2, (0, 2)),
        ("an empty last line", vec!["a\n\n"], 1, (0, 2)),
        ("just a newline", vec!["\n"], 1, (0, 0)),
        (
            "into the rotated file",
            vec!["r1\nr2\n", "c1\nc2\n"],
            3,
            (0, 3),
        ),
        (
            "the current file holds them",
            vec!["r1\nr2\n", "c1\nc2\n"],
            2,
            (1, 0),
        ),
        ("an empty current file", vec!["r1\nr2\n", ""], 1, (0, 3)),
        ("every file", vec!["o\n", "r1\nr2\n", "c\n"], 9, (0, 0)),
        (
            "a rotation cut mid-line is a line of its own",
            vec!["r1\nr2", "c\n"],
            2,
            (0, 3),
        ),
    ];
    for (name, segments, n, want) in cases {
        // Every block size, down to one byte: lines across block boundaries.
        for block in [1, 2, 3, 5, 7, 64, BLOCK] {
            assert_eq!(tail(&segments, n, block), want, "{name}, block {block}");
        }
    }
}

#[test]
fn backward_tail_agrees_with_the_in_memory_one() {
    let mut data = Vec::new();
    for i in 0..300u32 {
        // Lines of many lengths, some longer than a block.
        data.extend(std::iter::repeat_n(b'x', (i * 37 % 150) as usize));
        data.push(b'\n');
    }
    data.extend_from_slice(b"unterminated");
    for n in [0, 1, 2, 17, 150, 299, 300, 301, 1000] {
        for block in [1, 16, 64, 4096] {
            let got = find_tail(&[(&data[..], data.len() as u64)], n, block).unwrap();
            assert_eq!(
                got,
                (0, tail_start(&data, n) as u64),
                "n {n}, block {block}"
            );
        }
    }
}

#[test]
fn rotations_a_tail_can_read() {
    let names: Vec<String> = [
        "0.log",
        "0.log.20261201-100000.gz",
        "0.log.20261201-110000",
        "0.log.20261201-100500",
        "0.log.20261201-120000.tmp",
        "1.log.20261201-130000",
        "0.logx",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(
        readable_rotations("0.log", &names),
        ["0.log.20261201-100500", "0.log.20261201-110000"]
    );
}

fn options(tail: Option<u64>, limit: Option<u64>) -> LogOptions {
    LogOptions {
        tail_lines: tail,
        limit_bytes: limit,
        ..Default::default()
    }
}

/// Feeds `data` to a pump in `chunk`-byte pieces, then ends the file.
fn pumped(data: &[u8], o: &LogOptions, chunk: usize, max_line: usize) -> String {
    let mut pump = Pump::new(Renderer::new(o), max_line);
    let mut out = Vec::new();
    for piece in data.chunks(chunk) {
        pump.feed(piece, &mut out);
    }
    pump.end_of_file(&mut out);
    String::from_utf8(out).unwrap()
}

#[test]
fn pump_table() {
    let t = "2026-12-01T10:00:00Z";
    let long = "y".repeat(300);
    type Case = (&'static str, String, LogOptions, usize, String);
    let cases: Vec<Case> = vec![
        (
            "whole lines",
            format!("{t} stdout F a\n{t} stderr F b\n"),
            options(None, None),
            4096,
            "a\nb\n".into(),
        ),
        (
            "partial entries join",
            format!("{t} stdout P ab\n{t} stdout P cd\n{t} stdout F e\n"),
            options(None, None),
            4096,
            "abcde\n".into(),
        ),
        (
            "no trailing newline",
            format!("{t} stdout F a\n{t} stdout F last"),
            options(None, None),
            4096,
            "a\nlast".into(),
        ),
        (
            "limitBytes stops mid-line",
            format!("{t} stdout F hello\n{t} stdout F world\n"),
            options(None, Some(8)),
            4096,
            "hello\nwo".into(),
        ),
        (
            "an overlong full line passes through whole",
            format!("{t} stdout F {long}\n{t} stdout F next\n"),
            options(None, None),
            64,
            format!("{long}\nnext\n"),
        ),
        (
            "an overlong partial line keeps no newline",
            format!("{t} stdout P {long}\n{t} stdout F !\n"),
            options(None, None),
            64,
            format!("{long}!\n"),
        ),
        (
            "an overlong line within limitBytes",
            format!("{t} stdout F {long}\n{t} stdout F next\n"),
            options(None, Some(100)),
            64,
            "y".repeat(100),
        ),
        (
            "an overlong line that is no entry is skipped whole",
            format!("{long} {long}\n{t} stdout F ok\n"),
            options(None, None),
            64,
            "ok\n".into(),
        ),
    ];
    for (name, data, o, max_line, want) in cases {
        for chunk in [1, 2, 7, 33, 4096] {
            assert_eq!(
                pumped(data.as_bytes(), &o, chunk, max_line),
                want,
                "{name}, chunks of {chunk}"
            );
        }
    }
}

fn entries(prefix: &str, range: std::ops::Range<u32>) -> String {
    range
        .map(|i| format!("2026-12-01T10:00:00Z stdout F {prefix}{i}\n"))
        .collect()
}

/// Reads the log at `path` to its end with a `LogReader`, as a request would.
fn read_all(path: &Path, o: &LogOptions) -> String {
    let mut reader = LogReader::open(path, o).unwrap();
    let mut out = Vec::new();
    loop {
        match reader.step().unwrap() {
            Step::Data(d) => out.extend(d),
            Step::Done => break,
            Step::Idle => panic!("idle without follow"),
        }
    }
    String::from_utf8(out).unwrap()
}

#[test]
fn reader_across_rotated_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(d.join("0.log.20261201-100000.gz"), "not gzip, never read").unwrap();
    std::fs::write(d.join("0.log.20261201-100500"), entries("old", 0..3)).unwrap();
    std::fs::write(d.join("0.log.20261201-101000"), entries("mid", 0..2)).unwrap();
    std::fs::write(d.join("0.log"), entries("cur", 0..2)).unwrap();
    let cur = d.join("0.log");
    let lines = |s: &str| s.lines().map(str::to_string).collect::<Vec<_>>();
    assert_eq!(lines(&read_all(&cur, &options(Some(1), None))), ["cur1"]);
    assert_eq!(
        lines(&read_all(&cur, &options(Some(3), None))),
        ["mid1", "cur0", "cur1"]
    );
    assert_eq!(
        lines(&read_all(&cur, &options(Some(100), None))),
        ["old0", "old1", "old2", "mid0", "mid1", "cur0", "cur1"]
    );
    // Without tailLines: the current file, as upstream.
    assert_eq!(
        lines(&read_all(&cur, &options(None, None))),
        ["cur0", "cur1"]
    );
    assert_eq!(read_all(&cur, &options(Some(3), Some(7))), "mid1\ncu");
    assert_eq!(read_all(&cur, &options(Some(0), None)), "");
}

#[test]
fn reader_on_a_log_larger_than_many_blocks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("0.log");
    let n = (3 * BLOCK / 40) as u32;
    std::fs::write(&path, entries("line-", 0..n)).unwrap();
    let got = read_all(&path, &options(Some(2), None));
    assert_eq!(got, format!("line-{}\nline-{}\n", n - 2, n - 1));
    let all = read_all(&path, &options(None, None));
    assert_eq!(all.lines().count(), n as usize);
    let limited = read_all(&path, &options(None, Some(20_000)));
    assert_eq!(limited.len(), 20_000);
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
    let (tx, mut rx) = mpsc::channel(CHANNEL_CHUNKS);
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
    // Rotated as the log monitor does: renamed, a new file under the old name. What the
    // writer put into the old file before the switch comes first.
    f.write_all(b"2026-12-01T10:00:02Z stdout F before\n")
        .unwrap();
    std::fs::rename(&path, dir.path().join("0.log.20261201-100002")).unwrap();
    std::fs::write(&path, "2026-12-01T10:00:03Z stdout F after\n").unwrap();
    let mut got = Vec::new();
    while got != b"before\nafter\n" {
        let chunk = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("the lines around a rotation arrive")
            .unwrap();
        got.extend_from_slice(&chunk);
    }
    running.store(false, Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(5), task)
        .await
        .expect("following ends once the container has stopped")
        .unwrap();
    assert!(rx.recv().await.is_none());
}
