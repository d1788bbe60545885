//! What rotating one container's log does (pure; upstream's `container_log_manager.go`).
//!
//! The runtime writes `<dir>/<restart>.log`. When it grows past `containerLogMaxSize` it is
//! renamed to `<restart>.log.<YYYYMMDD-HHMMSS>` and the runtime is asked to reopen the
//! original name, so readers that follow `<restart>.log` (log shippers, `kubectl logs`) find
//! the new file where they expect it. Earlier rotations are gzip-compressed
//! (`….gz`), and at most `containerLogMaxFiles` files are kept, counting the current one and
//! the one being rotated.

/// Upstream's suffix layout: `<log>.<timestamp>[.gz]`, with `.tmp` while compressing.
pub(crate) const COMPRESS_SUFFIX: &str = ".gz";
pub(crate) const TMP_SUFFIX: &str = ".tmp";
/// Upstream's timestamp (Go's `20060102-150405`), in strftime's words.
pub(crate) const TIMESTAMP_FORMAT: &str = "%Y%m%d-%H%M%S";

/// The file operations of one rotation, file names relative to the log's directory, in the
/// order they are done: remove, compress, then rename and reopen.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct RotationPlan {
    /// Left-overs of an interrupted compression and the oldest rotations beyond the limit.
    pub remove: Vec<String>,
    /// Rotated files not compressed yet.
    pub compress: Vec<String>,
    /// The new name of the current file; `None` when a rotation with the same timestamp
    /// exists (two in one second): it waits for the next round rather than overwrite one.
    pub rotate_to: Option<String>,
}

/// Plans the rotation of `log` (its file name) of `size` bytes, given the names of the other
/// files in its directory. `None` when the file is still under `max_size`.
pub(crate) fn plan_rotation(
    log: &str,
    size: u64,
    max_size: u64,
    max_files: u32,
    siblings: &[String],
    timestamp: &str,
) -> Option<RotationPlan> {
    if size < max_size {
        return None;
    }
    let prefix = format!("{log}.");
    let rotated: Vec<&str> = siblings
        .iter()
        .map(String::as_str)
        .filter(|name| name.starts_with(&prefix))
        .collect();
    let mut plan = RotationPlan::default();
    // A `.tmp` is a compression that did not finish; an uncompressed file whose `.gz` exists
    // was compressed but not removed. Both go.
    let (unused, mut kept): (Vec<&str>, Vec<&str>) = rotated.iter().partition(|name| {
        name.ends_with(TMP_SUFFIX)
            || (!name.ends_with(COMPRESS_SUFFIX)
                && rotated.contains(&format!("{name}{COMPRESS_SUFFIX}").as_str()))
    });
    plan.remove.extend(unused.iter().map(|s| s.to_string()));
    // Oldest first (the timestamps sort as text); room for max_files - 2 rotated files
    // besides the current file and the one about to be rotated.
    kept.sort_unstable();
    let room = max_files.saturating_sub(2) as usize;
    let excess = kept.len().saturating_sub(room);
    plan.remove.extend(kept.drain(..excess).map(str::to_string));
    plan.compress = kept
        .iter()
        .filter(|name| !name.ends_with(COMPRESS_SUFFIX))
        .map(|s| s.to_string())
        .collect();
    let target = format!("{log}.{timestamp}");
    let taken = kept
        .iter()
        .any(|name| *name == target || *name == format!("{target}{COMPRESS_SUFFIX}"));
    plan.rotate_to = (!taken).then_some(target);
    Some(plan)
}

/// The soonest a growing log is looked at again between the monitor's regular passes.
pub(crate) const FAST_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// When to look at a log again sooner than the regular pass `interval` (upstream looks only
/// every `containerLogMonitorInterval`, 10 s, so a container writing 10 MB/s leaves its log
/// 100 MB past `containerLogMaxSize`). From its growth of `grew` bytes over `over`: the time
/// the log needs at that rate to reach `max_size` from `size`, at least [`FAST_CHECK`];
/// `None` when the regular pass comes first (or the log is not growing).
pub(crate) fn recheck_after(
    grew: u64,
    over: std::time::Duration,
    size: u64,
    max_size: u64,
    interval: std::time::Duration,
) -> Option<std::time::Duration> {
    if grew == 0 || over.is_zero() {
        return None;
    }
    let rate = grew as f64 / over.as_secs_f64();
    let to_full = max_size.saturating_sub(size) as f64 / rate;
    let after =
        std::time::Duration::from_secs_f64(to_full.min(interval.as_secs_f64())).max(FAST_CHECK);
    (after < interval).then_some(after)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn rechecks_of_growing_logs() {
        use std::time::Duration;
        let s = Duration::from_secs;
        const MB: u64 = 1 << 20;
        type Case = (&'static str, u64, Duration, u64, Option<Duration>);
        let cases: Vec<Case> = vec![
            ("not growing", 0, s(10), MB, None),
            ("slow: the regular pass is soon enough", MB, s(10), MB, None),
            (
                "5 MiB/s, 5 MiB of room: in a second",
                50 * MB,
                s(10),
                5 * MB,
                Some(s(1)),
            ),
            (
                "1 MiB/s, 4 MiB of room: in four",
                10 * MB,
                s(10),
                6 * MB,
                Some(s(4)),
            ),
            (
                "already over: as soon as allowed",
                10 * MB,
                s(10),
                20 * MB,
                Some(s(1)),
            ),
            (
                "100 MiB/s: never sooner than a second",
                100 * MB,
                s(1),
                0,
                Some(s(1)),
            ),
            ("no time measured", MB, s(0), 0, None),
        ];
        for (name, grew, over, size, want) in cases {
            assert_eq!(
                recheck_after(grew, over, size, 10 * MB, s(10)),
                want,
                "{name}"
            );
        }
    }

    #[test]
    fn rotation_plans() {
        let ts = "20261201-153000";
        type Case<'a> = (&'a str, u64, u32, Vec<&'a str>, Option<RotationPlan>);
        let cases: Vec<Case> = vec![
            ("under the limit", 99, 5, vec![], None),
            (
                "first rotation",
                100,
                5,
                vec!["1.log"],
                Some(RotationPlan {
                    rotate_to: Some("0.log.20261201-153000".into()),
                    ..Default::default()
                }),
            ),
            (
                "older rotations get compressed, other instances are not touched",
                150,
                5,
                vec![
                    "0.log.20261201-152900.gz",
                    "0.log.20261201-152950",
                    "1.log.20261201-150000",
                ],
                Some(RotationPlan {
                    compress: names(&["0.log.20261201-152950"]),
                    rotate_to: Some("0.log.20261201-153000".into()),
                    ..Default::default()
                }),
            ),
            (
                "the oldest beyond max files go; left-overs of compression too",
                100,
                4,
                vec![
                    "0.log.20261201-152000.gz",
                    "0.log.20261201-152100.gz",
                    "0.log.20261201-152200.gz",
                    "0.log.20261201-152300",
                    "0.log.20261201-152300.gz",
                    "0.log.20261201-152400.tmp",
                ],
                Some(RotationPlan {
                    remove: names(&[
                        "0.log.20261201-152300",
                        "0.log.20261201-152400.tmp",
                        "0.log.20261201-152000.gz",
                        "0.log.20261201-152100.gz",
                    ]),
                    rotate_to: Some("0.log.20261201-153000".into()),
                    ..Default::default()
                }),
            ),
            (
                "two files at most: no rotated file survives the new one",
                100,
                2,
                vec!["0.log.20261201-152000.gz"],
                Some(RotationPlan {
                    remove: names(&["0.log.20261201-152000.gz"]),
                    rotate_to: Some("0.log.20261201-153000".into()),
                    ..Default::default()
                }),
            ),
            (
                "a rotation in the same second waits",
                100,
                5,
                vec!["0.log.20261201-153000"],
                Some(RotationPlan {
                    compress: names(&["0.log.20261201-153000"]),
                    rotate_to: None,
                    ..Default::default()
                }),
            ),
        ];
        for (name, size, max_files, siblings, want) in cases {
            let got = plan_rotation("0.log", size, 100, max_files, &names(&siblings), ts);
            assert_eq!(got, want, "{name}");
        }
    }
}
