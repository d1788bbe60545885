//! Production code reads time in one place, `src/base/clock.rs`: one source of time that a unit
//! test can drive (tokio's paused clock for deadlines, a test wall clock for timestamps), and
//! that reads the system's wall clock afresh each time so an NTP step shows at once. Anywhere
//! else, reading the clock directly (`SystemTime::now`, `Instant::now` of std or tokio,
//! `jiff::Timestamp::now`, …) or holding a `std::time::Instant` (whose `elapsed` reads the std
//! clock, which `tokio::time::pause` does not govern) fails this test with its file and line.

mod shape;

use shape::{SourceFile, production_files};

/// The one file allowed to read the clock, below `src/`.
const CLOCK: &str = "base/clock.rs";

/// What reads the clock, or names the monotonic type tokio's clock does not govern. Matched on
/// code with comments and literals blanked, so a word boundary must precede each.
const FORBIDDEN: &[&str] = &[
    "SystemTime::now",
    "Instant::now",
    "Timestamp::now",
    "Zoned::now",
    "Utc::now",
    "Local::now",
    "UNIX_EPOCH.elapsed",
    "std::time::Instant",
];

/// A direct read found: where, and what.
#[derive(Debug, PartialEq)]
struct Read {
    line: usize,
    what: String,
}

fn starts_word(code: &str, at: usize) -> bool {
    !code[..at]
        .chars()
        .next_back()
        .is_some_and(|c| c.is_alphanumeric() || c == '_')
}

/// Every forbidden read in the file's code, plus `Instant` named in a `use std::time::{…}`
/// group (which the plain patterns cannot see).
fn reads_in(file: &SourceFile) -> Vec<Read> {
    let code = &file.code;
    let mut out = Vec::new();
    for pattern in FORBIDDEN {
        for (at, _) in code.match_indices(pattern) {
            if starts_word(code, at) {
                out.push(Read {
                    line: file.line_of(at),
                    what: pattern.to_string(),
                });
            }
        }
    }
    for (at, _) in code.match_indices("std::time::{") {
        let open = at + "std::time::".len();
        let group = &code[open + 1..open + shape::end_of_group(&code[open..], '{', '}')];
        let names_instant = group
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .any(|word| word == "Instant");
        if names_instant {
            out.push(Read {
                line: file.line_of(at),
                what: "std::time::Instant".to_string(),
            });
        }
    }
    // One report a line: `std::time::Instant::now()` matches two patterns.
    out.sort_by_key(|r| r.line);
    out.dedup_by_key(|r| r.line);
    out
}

fn file_of(rel: &str, text: &str) -> SourceFile {
    SourceFile {
        rel: rel.into(),
        module: shape::module_of(std::path::Path::new(rel)),
        text: text.into(),
        code: shape::blank_test_items(&shape::blank_comments_and_literals(text)),
    }
}

#[test]
fn production_code_reads_time_only_through_base_clock() {
    let mut files = production_files();
    // `shape` leaves the binary's root out; it is production code all the same.
    let main = shape::src_dir().join("main.rs");
    files.push(file_of("main.rs", &std::fs::read_to_string(main).unwrap()));
    let mut problems = Vec::new();
    for file in files
        .iter()
        .filter(|f| f.rel != std::path::Path::new(CLOCK))
    {
        for read in reads_in(file) {
            problems.push(format!(
                "src/{}:{}: {}\n    {}",
                file.rel.display(),
                read.line,
                read.what,
                file.line(read.line)
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "{} direct time reads outside src/{CLOCK} (use crate::base::clock: `clock::now()`, \
         `clock::timestamp()`, `clock::instant()`, `clock::Instant`):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn the_reader_finds_reads_and_skips_comments_literals_and_tests() {
    let text = "use std::time::{Duration, Instant};\n\
                fn a() { let t = SystemTime::now(); }\n\
                // Instant::now() in a comment\n\
                fn b() { let s = \"jiff::Timestamp::now()\"; let n = tokio::time::Instant::now(); }\n\
                fn c() { clock::instant(); my_SystemTime::now(); }\n\
                #[cfg(test)]\nmod tests { fn d() { std::time::Instant::now(); } }\n";
    let found: Vec<(usize, String)> = reads_in(&file_of("x.rs", text))
        .into_iter()
        .map(|r| (r.line, r.what))
        .collect();
    assert_eq!(
        found,
        vec![
            (1, "std::time::Instant".to_string()),
            (2, "SystemTime::now".to_string()),
            (4, "Instant::now".to_string()),
        ]
    );
}
