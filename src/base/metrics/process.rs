//! The standard process metrics (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
//! …) from `/proc/self`, as every Prometheus client library exports them.

use std::fmt::Write as _;

/// What `/proc/self/stat` and friends say about this process.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct ProcessStats {
    pub cpu_seconds: f64,
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    pub start_time_seconds: f64,
    pub open_fds: u64,
    pub max_fds: Option<u64>,
}

/// Parses the fields of `/proc/self/stat` that matter; the command name (in parentheses, and
/// free to contain spaces) is skipped by looking for the last `)`.
pub(crate) fn parse_stat(
    stat: &str,
    ticks_per_second: f64,
    page_size: u64,
    boot_time: u64,
) -> Option<ProcessStats> {
    let after = &stat[stat.rfind(')')? + 1..];
    // Fields from the state (field 3) on; utime is field 14, so index 11 here.
    let fields: Vec<&str> = after.split_whitespace().collect();
    let num = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
    let utime = num(11)?;
    let stime = num(12)?;
    let start_ticks = num(19)?;
    let vsize = num(20)?;
    let rss_pages = num(21)?;
    Some(ProcessStats {
        cpu_seconds: (utime + stime) as f64 / ticks_per_second,
        resident_bytes: rss_pages * page_size,
        virtual_bytes: vsize,
        start_time_seconds: boot_time as f64 + start_ticks as f64 / ticks_per_second,
        open_fds: 0,
        max_fds: None,
    })
}

/// The soft "Max open files" limit from `/proc/self/limits`.
pub(crate) fn parse_max_fds(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `btime` from `/proc/stat`: boot time in seconds since the epoch.
pub(crate) fn parse_boot_time(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// Reads this process's numbers; `None` when `/proc` cannot be read.
pub(crate) fn read() -> Option<ProcessStats> {
    use nix::unistd::{SysconfVar, sysconf};
    let ticks = sysconf(SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100) as f64;
    let page = sysconf(SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .unwrap_or(4096) as u64;
    let boot = parse_boot_time(&std::fs::read_to_string("/proc/stat").ok()?)?;
    let mut stats = parse_stat(
        &std::fs::read_to_string("/proc/self/stat").ok()?,
        ticks,
        page,
        boot,
    )?;
    stats.open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
    stats.max_fds = std::fs::read_to_string("/proc/self/limits")
        .ok()
        .as_deref()
        .and_then(parse_max_fds);
    Some(stats)
}

/// Appends the process families (nothing when `/proc` cannot be read).
pub(crate) fn render(out: &mut String) {
    let Some(s) = read() else {
        return;
    };
    let mut one = |name: &str, kind: &str, help: &str, value: String| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    };
    one(
        "process_cpu_seconds_total",
        "counter",
        "User and system CPU time spent, in seconds.",
        super::family::format_float(s.cpu_seconds),
    );
    one(
        "process_resident_memory_bytes",
        "gauge",
        "Resident memory size in bytes.",
        s.resident_bytes.to_string(),
    );
    one(
        "process_virtual_memory_bytes",
        "gauge",
        "Virtual memory size in bytes.",
        s.virtual_bytes.to_string(),
    );
    one(
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since the Unix epoch, in seconds.",
        super::family::format_float(s.start_time_seconds),
    );
    one(
        "process_open_fds",
        "gauge",
        "Open file descriptors.",
        s.open_fds.to_string(),
    );
    if let Some(max) = s.max_fds {
        one(
            "process_max_fds",
            "gauge",
            "The most file descriptors the process may open.",
            max.to_string(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_read_past_a_command_name_with_spaces() {
        let stat = "1234 (dh (x) y) S 1 1234 1234 0 -1 4194560 500 0 0 0 250 50 0 0 20 0 8 0 \
                    1000 104857600 2560 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        let s = parse_stat(stat, 100.0, 4096, 1_700_000_000).unwrap();
        assert_eq!(s.cpu_seconds, 3.0);
        assert_eq!(s.resident_bytes, 2560 * 4096);
        assert_eq!(s.virtual_bytes, 104_857_600);
        assert_eq!(s.start_time_seconds, 1_700_000_010.0);
    }

    #[test]
    fn limits_and_boot_time_are_read() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1024                 524288               files\n";
        assert_eq!(parse_max_fds(limits), Some(1024));
        assert_eq!(
            parse_boot_time("cpu 1 2\nbtime 1700000000\n"),
            Some(1_700_000_000)
        );
        assert!(read().is_some(), "this process's /proc is readable");
    }
}
