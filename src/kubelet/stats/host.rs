//! What `/stats/summary` reads from the host besides the runtime: network counters of a
//! network namespace (`/proc/<pid>/net/dev`), a pod's cgroup, the disk use of volume and log
//! directories, the process limits. Parsers are pure and table-tested; the walks and file
//! reads are plain functions the [`super::HostFiles`] reader calls on a blocking thread.
//!
//! Walking a volume is the one costly reading (upstream runs `du` for it), so its answers are
//! kept in a [`DiskUsageCache`]: a scrape answers the kept figure and, when it is older than
//! the period (`volumeStatsAggPeriod`), has it measured again in the background, so a scrape
//! of a node with 110 pods never walks 110 trees.

use std::collections::{HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use crate::base::clock::{self, Instant};

/// One interface's counters, as `/proc/net/dev` gives them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InterfaceSample {
    pub name: String,
    pub rx_bytes: u64,
    pub rx_errors: u64,
    pub tx_bytes: u64,
    pub tx_errors: u64,
}

/// Interfaces cadvisor leaves out of a namespace's figures: loopback, and the host ends of
/// container links and bridges other runtimes make.
const IGNORED_INTERFACE_PREFIXES: &[&str] = &["lo", "veth", "docker", "nerdctl"];

/// `/proc/<pid>/net/dev` → the interfaces' counters, ignored ones left out, in file order.
pub(crate) fn parse_net_dev(text: &str) -> Vec<InterfaceSample> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((name, counters)) = line.split_once(':') else {
            continue;
        };
        let name = name.trim();
        if name.is_empty()
            || name.contains('|')
            || IGNORED_INTERFACE_PREFIXES
                .iter()
                .any(|p| name.starts_with(p))
        {
            continue;
        }
        let fields: Vec<u64> = counters
            .split_whitespace()
            .map_while(|f| f.parse().ok())
            .collect();
        // receive: bytes packets errs drop fifo frame compressed multicast; transmit: bytes
        // packets errs …
        if fields.len() < 11 {
            continue;
        }
        out.push(InterfaceSample {
            name: name.to_string(),
            rx_bytes: fields[0],
            rx_errors: fields[2],
            tx_bytes: fields[8],
            tx_errors: fields[10],
        });
    }
    out
}

/// The interface of the default IPv4 route in `/proc/net/route` (destination `00000000`).
pub(crate) fn default_route_interface(text: &str) -> Option<String> {
    text.lines().skip(1).find_map(|line| {
        let mut f = line.split_whitespace();
        let (iface, dest) = (f.next()?, f.next()?);
        (dest == "00000000").then(|| iface.to_string())
    })
}

/// The lower of `pid_max` and `threads-max` (each file's single number), as upstream reckons
/// the node's process limit.
pub(crate) fn max_pid(pid_max: Option<&str>, threads_max: Option<&str>) -> Option<i64> {
    [pid_max, threads_max]
        .into_iter()
        .flatten()
        .filter_map(|t| t.trim().parse::<i64>().ok())
        .min()
}

/// The total number of tasks: the part after `/` of `/proc/loadavg`'s fourth field.
pub(crate) fn loadavg_tasks(text: &str) -> Option<i64> {
    let field = text.split_whitespace().nth(3)?;
    field.split_once('/')?.1.parse().ok()
}

/// What a directory tree takes on its disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiskUsage {
    /// Allocated bytes (blocks × 512, as `du` counts them).
    pub bytes: u64,
    /// Distinct inodes (files, directories, links; hard links once).
    pub inodes: u64,
}

/// The most entries one walk visits: a tree larger than this is reported as far as it was
/// walked (a lower bound), and the walk says so at debug level.
pub(crate) const WALK_LIMIT: u64 = 200_000;

/// Walks `root` without following links or leaving its filesystem, counting what `du -x`
/// would: allocated blocks and distinct inodes, `root` itself included. `None` when `root`
/// cannot be read at all.
pub(crate) fn disk_usage(root: &Path, limit: u64) -> Option<DiskUsage> {
    let meta = std::fs::symlink_metadata(root).ok()?;
    let dev = meta.dev();
    let mut usage = DiskUsage::default();
    let mut seen_links: HashSet<u64> = HashSet::new();
    let mut count = |m: &std::fs::Metadata, usage: &mut DiskUsage| {
        if m.nlink() > 1 && !m.is_dir() && !seen_links.insert(m.ino()) {
            return;
        }
        usage.bytes = usage.bytes.saturating_add(m.blocks().saturating_mul(512));
        usage.inodes += 1;
    };
    count(&meta, &mut usage);
    if !meta.is_dir() {
        return Some(usage);
    }
    let mut visited = 1u64;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            visited += 1;
            if visited > limit {
                tracing::debug!(path = %root.display(), limit, "disk usage: walk cut short");
                return Some(usage);
            }
            let Ok(m) = entry.metadata() else { continue };
            if m.dev() != dev {
                continue;
            }
            count(&m, &mut usage);
            if m.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    Some(usage)
}

/// Kept walks of directories, by path.
#[derive(Debug)]
pub(crate) struct DiskUsageCache {
    period: Duration,
    entries: Mutex<HashMap<PathBuf, CacheEntry>>,
}

#[derive(Debug, Clone, Copy)]
struct CacheEntry {
    usage: DiskUsage,
    measured: Instant,
    /// Measured at, in nanoseconds since the epoch (the figure's `time`).
    at_ns: i64,
    refreshing: bool,
}

/// What the cache decides for a path asked for at `now` (pure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CacheDecision {
    /// Fresh: answer it.
    Fresh,
    /// Older than the period: answer it, and measure again in the background.
    Stale,
    /// Older, and already being measured again.
    Refreshing,
    /// Never measured: measure now.
    Missing,
}

/// Whether a kept figure measured at `measured` is still good at `now`.
pub(crate) fn decide(
    measured: Option<(Instant, bool)>,
    now: Instant,
    period: Duration,
) -> CacheDecision {
    match measured {
        None => CacheDecision::Missing,
        Some((_, true)) => CacheDecision::Refreshing,
        Some((at, false)) if now.saturating_duration_since(at) >= period => CacheDecision::Stale,
        Some(_) => CacheDecision::Fresh,
    }
}

impl DiskUsageCache {
    pub(crate) fn new(period: Duration) -> Self {
        DiskUsageCache {
            period,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// A period of 0 is upstream's way of turning volume measurement off.
    pub(crate) fn is_off(&self) -> bool {
        self.period.is_zero()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, CacheEntry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The usage of `path` and when it was measured (ns since the epoch). A path never seen is
    /// walked now; a stale one is answered as kept and pushed onto `stale` for
    /// [`Self::refresh`].
    pub(crate) fn get(&self, path: &Path, stale: &mut Vec<PathBuf>) -> Option<(DiskUsage, i64)> {
        let now = clock::instant();
        let kept = self.lock().get(path).copied();
        match decide(kept.map(|e| (e.measured, e.refreshing)), now, self.period) {
            CacheDecision::Fresh | CacheDecision::Refreshing => kept.map(|e| (e.usage, e.at_ns)),
            CacheDecision::Stale => {
                if let Some(e) = self.lock().get_mut(path) {
                    e.refreshing = true;
                }
                stale.push(path.to_path_buf());
                kept.map(|e| (e.usage, e.at_ns))
            }
            CacheDecision::Missing => {
                let usage = disk_usage(path, WALK_LIMIT)?;
                let at_ns = super::now_ns();
                self.lock().insert(
                    path.to_path_buf(),
                    CacheEntry {
                        usage,
                        measured: clock::instant(),
                        at_ns,
                        refreshing: false,
                    },
                );
                Some((usage, at_ns))
            }
        }
    }

    /// Walks `paths` again (on the caller's thread: a blocking one).
    pub(crate) fn refresh(&self, paths: &[PathBuf]) {
        for path in paths {
            let usage = disk_usage(path, WALK_LIMIT);
            let mut entries = self.lock();
            match usage {
                Some(usage) => {
                    entries.insert(
                        path.clone(),
                        CacheEntry {
                            usage,
                            measured: clock::instant(),
                            at_ns: super::now_ns(),
                            refreshing: false,
                        },
                    );
                }
                None => {
                    entries.remove(path);
                }
            }
        }
    }

    /// Forgets every path `keep` refuses (volumes of pods that are gone).
    pub(crate) fn retain_where(&self, keep: impl Fn(&PathBuf) -> bool) {
        self.lock().retain(|p, _| keep(p));
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One cgroup's CPU and memory (cgroup v1 or v2 files).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CgroupSample {
    pub at_ns: i64,
    pub cpu_core_ns: Option<u64>,
    pub memory_usage: Option<u64>,
    pub memory_working_set: Option<u64>,
    pub rss: Option<u64>,
    pub page_faults: Option<u64>,
    pub major_page_faults: Option<u64>,
    pub pids: Option<u64>,
}

/// Reads a cgroup from its files: `read(controller, file)` gives a file's text (`controller`
/// is the v1 hierarchy; on v2 it is ignored). Pure over `read`.
pub(crate) fn cgroup_sample(
    v2: bool,
    at_ns: i64,
    read: &dyn Fn(&str, &str) -> Option<String>,
) -> Option<CgroupSample> {
    let num = |c: &str, f: &str| read(c, f).and_then(|t| t.trim().parse::<u64>().ok());
    let kv = |c: &str, f: &str| read(c, f).map(|t| super::key_values(&t));
    let sample = if v2 {
        let stat = kv("memory", "memory.stat").unwrap_or_default();
        let usage = num("memory", "memory.current");
        CgroupSample {
            at_ns,
            cpu_core_ns: kv("cpu", "cpu.stat")
                .and_then(|s| s.get("usage_usec").map(|u| u.saturating_mul(1000))),
            memory_usage: usage,
            memory_working_set: usage
                .map(|u| super::working_set(u, stat.get("inactive_file").copied())),
            rss: stat.get("anon").copied(),
            page_faults: stat.get("pgfault").copied(),
            major_page_faults: stat.get("pgmajfault").copied(),
            pids: num("pids", "pids.current"),
        }
    } else {
        let stat = kv("memory", "memory.stat").unwrap_or_default();
        let usage = num("memory", "memory.usage_in_bytes");
        CgroupSample {
            at_ns,
            cpu_core_ns: num("cpuacct", "cpuacct.usage"),
            memory_usage: usage,
            memory_working_set: usage
                .map(|u| super::working_set(u, stat.get("total_inactive_file").copied())),
            rss: stat.get("total_rss").copied(),
            page_faults: stat.get("total_pgfault").copied(),
            major_page_faults: stat.get("total_pgmajfault").copied(),
            pids: num("pids", "pids.current"),
        }
    };
    (sample.cpu_core_ns.is_some() || sample.memory_usage.is_some()).then_some(sample)
}

/// Where the pods' cgroups are: `kubepods` under the cgroup root, on cgroup v1 or v2.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PodCgroups {
    /// The cgroup filesystem (`/sys/fs/cgroup`).
    pub mount: PathBuf,
    /// `kubepods` as a cgroup path (`/kubepods`).
    pub kubepods: String,
    pub v2: bool,
}

impl PodCgroups {
    fn dir(&self, controller: &str, cgroup: &str) -> PathBuf {
        let rel = cgroup.trim_start_matches('/');
        if self.v2 {
            self.mount.join(rel)
        } else {
            self.mount.join(controller).join(rel)
        }
    }

    /// Reads the cgroup at `cgroup` (a path like `/kubepods/burstable/pod<uid>`).
    pub(crate) fn read(&self, cgroup: &str) -> Option<CgroupSample> {
        let read = |controller: &str, file: &str| {
            std::fs::read_to_string(self.dir(controller, cgroup).join(file)).ok()
        };
        cgroup_sample(self.v2, super::now_ns(), &read)
    }

    /// The pod's cgroup, whichever QoS tier it is in; `None` when it has none (yet).
    pub(crate) fn pod(&self, uid: &str) -> Option<CgroupSample> {
        if crate::base::safe_names::component_problem(uid).is_some() {
            return None;
        }
        let probe = if self.v2 { "cpu" } else { "cpuacct" };
        let kubepods = self.kubepods.trim_end_matches('/');
        ["", "/burstable", "/besteffort"]
            .iter()
            .map(|tier| format!("{kubepods}{tier}/pod{uid}"))
            .find(|cg| self.dir(probe, cg).is_dir())
            .and_then(|cg| self.read(&cg))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NET_DEV: &str = "Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:     100       1    0    0    0     0          0         0      100       1    0    0    0     0       0          0
  eth0:    1296      16    2    0    0     0          0         0     1076      14    3    0    0     0       0          0
vethab12:     5       1    0    0    0     0          0         0        5       1    0    0    0     0       0          0
  ens3: 9000000000 7 0 0 0 0 0 0 42 1 0 0 0 0 0 0
  bad: 1 2 3
";

    #[test]
    fn net_dev_counters() {
        let got = parse_net_dev(NET_DEV);
        assert_eq!(
            got,
            vec![
                InterfaceSample {
                    name: "eth0".into(),
                    rx_bytes: 1296,
                    rx_errors: 2,
                    tx_bytes: 1076,
                    tx_errors: 3,
                },
                InterfaceSample {
                    name: "ens3".into(),
                    rx_bytes: 9_000_000_000,
                    rx_errors: 0,
                    tx_bytes: 42,
                    tx_errors: 0,
                },
            ]
        );
        assert!(parse_net_dev("").is_empty());
    }

    #[test]
    fn default_route() {
        let cases = [
            (
                "Iface\tDestination\tGateway\nens3\t0010A8C0\t00000000\nens4\t00000000\t0101A8C0\n",
                Some("ens4"),
            ),
            ("Iface\tDestination\tGateway\n", None),
            ("", None),
        ];
        for (text, want) in cases {
            assert_eq!(default_route_interface(text).as_deref(), want, "{text:?}");
        }
    }

    #[test]
    fn process_limits() {
        let cases = [
            (Some("4194304\n"), Some("63000\n"), Some(63000)),
            (Some("32768\n"), None, Some(32768)),
            (Some("x"), Some("7"), Some(7)),
            (None, None, None),
        ];
        for (pid_max, threads, want) in cases {
            assert_eq!(max_pid(pid_max, threads), want);
        }
        assert_eq!(loadavg_tasks("0.10 0.20 0.30 2/517 12345\n"), Some(517));
        assert_eq!(loadavg_tasks("0.10 0.20"), None);
        assert_eq!(loadavg_tasks("0.10 0.20 0.30 517 1"), None);
    }

    #[test]
    fn a_zero_period_turns_volume_measurement_off() {
        assert!(DiskUsageCache::new(Duration::ZERO).is_off());
        assert!(!DiskUsageCache::new(Duration::from_secs(60)).is_off());
    }

    #[test]
    fn cache_decisions() {
        let now = Instant::now();
        let period = Duration::from_secs(60);
        let old = now.checked_sub(Duration::from_secs(61)).unwrap_or(now);
        let cases = [
            (None, CacheDecision::Missing),
            (Some((now, false)), CacheDecision::Fresh),
            (Some((old, false)), CacheDecision::Stale),
            (Some((old, true)), CacheDecision::Refreshing),
        ];
        for (kept, want) in cases {
            assert_eq!(decide(kept, now, period), want, "{kept:?}");
        }
    }

    #[test]
    fn disk_usage_counts_files_once_and_stops_at_the_limit() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir(root.join("sub")).unwrap();
        std::fs::write(root.join("sub/a"), vec![1u8; 64 * 1024]).unwrap();
        std::fs::hard_link(root.join("sub/a"), root.join("b")).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("link")).unwrap();
        let u = disk_usage(root, WALK_LIMIT).unwrap();
        // root, sub, a (and its second name once), link.
        assert_eq!(u.inodes, 4, "{u:?}");
        assert!(u.bytes >= 64 * 1024, "{u:?}");
        let cut = disk_usage(root, 2).unwrap();
        assert!(cut.inodes < u.inodes, "{cut:?}");
        assert_eq!(disk_usage(&root.join("missing"), 10), None);
    }

    #[test]
    fn cache_answers_kept_figures_and_refreshes_stale_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        let cache = DiskUsageCache::new(Duration::ZERO);
        let mut stale = Vec::new();
        let first = cache.get(&path, &mut stale).unwrap().0;
        assert!(stale.is_empty());
        std::fs::write(path.join("f"), vec![1u8; 32 * 1024]).unwrap();
        // Period zero: stale at once; the kept figure is answered, the path queued once.
        assert_eq!(cache.get(&path, &mut stale).unwrap().0, first);
        assert_eq!(cache.get(&path, &mut stale).unwrap().0, first);
        assert_eq!(stale, vec![path.clone()]);
        cache.refresh(&stale);
        let mut again = Vec::new();
        let second = cache.get(&path, &mut again).unwrap().0;
        assert_eq!(second.inodes, first.inodes + 1);
        cache.retain_where(|_| false);
        assert!(cache.is_empty());
    }

    #[test]
    fn cgroup_files_v1_and_v2() {
        let v1 = |c: &str, f: &str| -> Option<String> {
            match (c, f) {
                ("cpuacct", "cpuacct.usage") => Some("1500\n".into()),
                ("memory", "memory.usage_in_bytes") => Some("1000\n".into()),
                ("memory", "memory.stat") => Some(
                    "total_inactive_file 300\ntotal_rss 600\ntotal_pgfault 9\ntotal_pgmajfault 1\n"
                        .into(),
                ),
                ("pids", "pids.current") => Some("3\n".into()),
                _ => None,
            }
        };
        let s = cgroup_sample(false, 7, &v1).unwrap();
        assert_eq!(
            s,
            CgroupSample {
                at_ns: 7,
                cpu_core_ns: Some(1500),
                memory_usage: Some(1000),
                memory_working_set: Some(700),
                rss: Some(600),
                page_faults: Some(9),
                major_page_faults: Some(1),
                pids: Some(3),
            }
        );
        let v2 = |_: &str, f: &str| -> Option<String> {
            match f {
                "cpu.stat" => Some("usage_usec 2\nuser_usec 1\n".into()),
                "memory.current" => Some("500\n".into()),
                "memory.stat" => Some("anon 100\ninactive_file 50\n".into()),
                _ => None,
            }
        };
        let s = cgroup_sample(true, 7, &v2).unwrap();
        assert_eq!(s.cpu_core_ns, Some(2000));
        assert_eq!(s.memory_working_set, Some(450));
        assert_eq!(s.rss, Some(100));
        assert_eq!(s.pids, None);
        assert_eq!(cgroup_sample(false, 7, &|_: &str, _: &str| None), None);
    }
}
