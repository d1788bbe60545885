//! Termination messages: what a container left at its `terminationMessagePath`, or, with
//! `FallbackToLogsOnError` and a failed exit, the tail of its log — shown in the terminated state.
//!
//! Deckhand mounts a file of its own at the path (`<root>/pods/<uid>/containers/<name>/<restart>`),
//! so the message is read from the node once the container has exited, and remembered.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use k8s_openapi::api::core::v1::Pod;

use crate::base::observed::{ContainerState, ObservedPod};

/// Upstream's limits: the file is read up to 4096 bytes; the log fallback keeps the last 80
/// lines and at most 2048 bytes.
pub(crate) const MAX_MESSAGE_BYTES: u64 = 4096;
pub(crate) const FALLBACK_LINES: usize = 80;
pub(crate) const FALLBACK_BYTES: usize = 2048;

fn read_prefix(path: &Path, limit: u64) -> Option<String> {
    let mut file = std::fs::File::open(path).ok()?;
    let mut buf = Vec::new();
    file.by_ref().take(limit).read_to_end(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf).into_owned())
}

/// The text of a CRI log (`<time> <stream> <P|F> <text>` per record), partial records joined.
pub(crate) fn log_text(cri_log: &str) -> String {
    let mut out = String::new();
    for line in cri_log.lines() {
        let mut parts = line.splitn(4, ' ');
        let (_time, _stream, tag) = (parts.next(), parts.next(), parts.next());
        let text = parts.next().unwrap_or("");
        out.push_str(text);
        if tag != Some("P") {
            out.push('\n');
        }
    }
    out
}

/// The last `lines` lines and at most `bytes` bytes of `text`.
pub(crate) fn tail(text: &str, lines: usize, bytes: usize) -> String {
    let kept: Vec<&str> = text.lines().collect();
    let start = kept.len().saturating_sub(lines);
    let mut joined = kept[start..].join("\n");
    if joined.len() > bytes {
        let mut cut = joined.len() - bytes;
        while !joined.is_char_boundary(cut) {
            cut += 1;
        }
        joined = joined[cut..].to_string();
    }
    joined
}

fn read_log_tail(path: &Path) -> Option<String> {
    // Read only the end of a log that may be large.
    let mut file = std::fs::File::open(path).ok()?;
    let len = file.metadata().ok()?.len();
    let window = 64 * 1024;
    if len > window {
        file.seek(SeekFrom::Start(len - window)).ok()?;
    }
    let mut buf = Vec::new();
    file.read_to_end(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf);
    Some(tail(&log_text(&text), FALLBACK_LINES, FALLBACK_BYTES))
}

/// Adds termination messages to the exited instances of `observed`. `cache` remembers what was
/// read per container ID (an exited container's message never changes).
pub(crate) fn fill_messages(
    observed: &mut ObservedPod,
    pod: &Pod,
    pod_dir: &Path,
    log_dir: &Path,
    cache: &mut HashMap<String, String>,
) {
    let spec = pod.spec.clone().unwrap_or_default();
    let policy_of = |name: &str| {
        spec.containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .find(|c| c.name == name)
            .and_then(|c| c.termination_message_policy.clone())
            .unwrap_or_else(|| "File".into())
    };
    for c in &mut observed.containers {
        if c.state != ContainerState::Exited {
            continue;
        }
        let message = cache.entry(c.id.clone()).or_insert_with(|| {
            let file = pod_dir
                .join("containers")
                .join(&c.name)
                .join(c.attempt.to_string());
            let written = read_prefix(&file, MAX_MESSAGE_BYTES).unwrap_or_default();
            if !written.is_empty() {
                return written;
            }
            if policy_of(&c.name) == "FallbackToLogsOnError" && c.exit_code != 0 {
                let log = log_dir.join(&c.name).join(format!("{}.log", c.attempt));
                return read_log_tail(&log).unwrap_or_default();
            }
            String::new()
        });
        if message.is_empty() {
            continue;
        }
        if c.message.is_empty() {
            c.message = message.clone();
        } else if !c.message.contains(message.as_str()) {
            c.message = format!("{}: {message}", c.message);
        }
    }
    cache.retain(|id, _| observed.containers.iter().any(|c| &c.id == id));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cri_log_text_joins_partial_records() {
        let log = "2026-01-01T00:00:00Z stdout P hel\n2026-01-01T00:00:00Z stdout F lo\n2026-01-01T00:00:01Z stderr F bye\n";
        assert_eq!(log_text(log), "hello\nbye\n");
    }

    #[test]
    fn tail_keeps_last_lines_and_bytes() {
        let text: String = (0..100).map(|i| format!("line {i}\n")).collect();
        let t = tail(&text, 80, 2048);
        assert!(t.starts_with("line 20\n"), "{t}");
        assert!(t.ends_with("line 99"));
        let long = "x".repeat(5000);
        assert_eq!(tail(&long, 80, 2048).len(), 2048);
    }
}
