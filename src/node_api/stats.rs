//! `/stats/summary` and `/metrics/resource`: what metrics-server and `kubectl top` read.
//!
//! Containers come from CRI `ListContainerStats` (cumulative CPU, memory working set, writable
//! layer), grouped by the pod labels the agent put on them; a pod is the sum of its running
//! containers. The node comes from the root cgroup (cgroup v1 `cpuacct.usage`,
//! `memory.usage_in_bytes` less `total_inactive_file`, as cadvisor reckons the working set;
//! `/proc/stat` and `/proc/meminfo` where those files are missing) and from `statvfs` of the
//! root directory. Rates (`usageNanoCores`) are the difference to the previous sample of the
//! same container, pod or node, kept in memory as cadvisor keeps its last sample.
//!
//! The reading is behind [`StatsRuntime`] and [`HostReader`]; grouping, working set, rates and
//! the rendering of both pages are pure functions, table-tested below.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::stats_types::{
    ContainerStats, CpuStats, FsStats, MemoryStats, NodeStats, PodReference, PodStats, Summary,
};
use crate::cri::proto::{
    self, ContainerFilter, ContainerState, ContainerStateValue, ContainerStatsFilter,
};
use crate::cri::{CriError, RuntimeService};
use crate::runtime::inspect::managed_selector;
use crate::runtime::labels;

/// Why no summary could be made.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    #[error("failed to list container stats: {0}")]
    Runtime(#[from] CriError),
}

/// What the stats need of the runtime: the managed containers' usage and their creation times.
pub trait StatsRuntime: Send + Sync + 'static {
    fn container_stats(
        &self,
        selector: HashMap<String, String>,
    ) -> BoxFuture<'_, Result<Vec<proto::ContainerStats>, CriError>>;
    /// The running containers the selector picks.
    fn running_containers(
        &self,
        selector: HashMap<String, String>,
    ) -> BoxFuture<'_, Result<Vec<proto::Container>, CriError>>;
}

impl<R: RuntimeService> StatsRuntime for R {
    fn container_stats(
        &self,
        selector: HashMap<String, String>,
    ) -> BoxFuture<'_, Result<Vec<proto::ContainerStats>, CriError>> {
        Box::pin(self.list_container_stats(Some(ContainerStatsFilter {
            label_selector: selector,
            ..Default::default()
        })))
    }
    fn running_containers(
        &self,
        selector: HashMap<String, String>,
    ) -> BoxFuture<'_, Result<Vec<proto::Container>, CriError>> {
        Box::pin(self.list_containers(Some(ContainerFilter {
            state: Some(ContainerStateValue {
                state: ContainerState::ContainerRunning as i32,
            }),
            label_selector: selector,
            ..Default::default()
        })))
    }
}

/// One reading of the node as a whole; `None` where the host did not tell.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeSample {
    /// Nanoseconds since the epoch when it was read.
    pub at_ns: i64,
    pub cpu_core_ns: Option<u64>,
    pub memory_usage: Option<u64>,
    pub memory_working_set: Option<u64>,
    pub memory_total: Option<u64>,
    pub boot_time_s: Option<i64>,
    pub fs: Option<FsSample>,
}

/// `statvfs` of a filesystem, in bytes and inodes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FsSample {
    pub capacity: u64,
    pub available: u64,
    pub used: u64,
    pub inodes: u64,
    pub inodes_free: u64,
}

/// Reads the node's usage.
pub trait HostReader: Send + Sync + 'static {
    fn node(&self) -> NodeSample;
}

/// The real host: cgroup files under `cgroup_root`, `/proc`, and `statvfs` of `root_dir`.
pub struct HostFiles {
    pub cgroup_root: PathBuf,
    pub proc_root: PathBuf,
    pub root_dir: PathBuf,
}

impl Default for HostFiles {
    fn default() -> Self {
        HostFiles {
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            proc_root: PathBuf::from("/proc"),
            root_dir: PathBuf::from("/"),
        }
    }
}

impl HostFiles {
    fn read(&self, path: PathBuf) -> Option<String> {
        match std::fs::read_to_string(&path) {
            Ok(text) => Some(text),
            Err(e) => {
                tracing::trace!(path = %path.display(), error = %e, "stats: file not readable");
                None
            }
        }
    }
}

impl HostReader for HostFiles {
    fn node(&self) -> NodeSample {
        let meminfo = self
            .read(self.proc_root.join("meminfo"))
            .map(|t| key_values(&t))
            .unwrap_or_default();
        let proc_stat = self.read(self.proc_root.join("stat")).unwrap_or_default();
        // cgroup v1 first (what this project's hosts run), then the host-wide files.
        let cpu_core_ns = self
            .read(self.cgroup_root.join("cpuacct/cpuacct.usage"))
            .and_then(|t| t.trim().parse().ok())
            .or_else(|| {
                self.read(self.cgroup_root.join("cpu.stat"))
                    .and_then(|t| key_values(&t).get("usage_usec").map(|u| u * 1000))
            })
            .or_else(|| proc_stat_cpu_ns(&proc_stat));
        let v1_usage: Option<u64> = self
            .read(self.cgroup_root.join("memory/memory.usage_in_bytes"))
            .and_then(|t| t.trim().parse().ok());
        let v1_stat = self
            .read(self.cgroup_root.join("memory/memory.stat"))
            .map(|t| key_values(&t));
        let (memory_usage, memory_working_set) = match (v1_usage, v1_stat) {
            (Some(usage), Some(stat)) => (
                Some(usage),
                Some(working_set(usage, stat.get("total_inactive_file").copied())),
            ),
            _ => meminfo_usage(&meminfo),
        };
        NodeSample {
            at_ns: now_ns(),
            cpu_core_ns,
            memory_usage,
            memory_working_set,
            memory_total: meminfo.get("MemTotal").copied(),
            boot_time_s: key_values(&proc_stat)
                .get("btime")
                .and_then(|b| i64::try_from(*b).ok()),
            fs: statvfs(&self.root_dir),
        }
    }
}

fn statvfs(dir: &std::path::Path) -> Option<FsSample> {
    let st = nix::sys::statvfs::statvfs(dir).ok()?;
    let frag = st.fragment_size() as u64;
    let capacity = (st.blocks() as u64).saturating_mul(frag);
    let free = (st.blocks_free() as u64).saturating_mul(frag);
    Some(FsSample {
        capacity,
        available: (st.blocks_available() as u64).saturating_mul(frag),
        used: capacity.saturating_sub(free),
        inodes: st.files() as u64,
        inodes_free: st.files_free() as u64,
    })
}

fn now_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or_default()
}

/// `key value [unit]` lines (`memory.stat`, `cpu.stat`, `/proc/meminfo` with its `kB`, the
/// `btime` line of `/proc/stat`) → key → value, with `kB` turned into bytes.
pub fn key_values(text: &str) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let (Some(key), Some(value)) = (words.next(), words.next()) else {
            continue;
        };
        let Ok(value) = value.parse::<u64>() else {
            continue;
        };
        let value = match words.next() {
            Some("kB") => value.saturating_mul(1024),
            _ => value,
        };
        out.insert(key.trim_end_matches(':').to_string(), value);
    }
    out
}

/// The working set: usage less the inactive file pages the kernel can drop at once (cadvisor's
/// reckoning), never below zero.
pub fn working_set(usage: u64, inactive_file: Option<u64>) -> u64 {
    usage.saturating_sub(inactive_file.unwrap_or(0))
}

/// Usage and working set from `/proc/meminfo` when the root memory cgroup is not readable.
fn meminfo_usage(meminfo: &HashMap<String, u64>) -> (Option<u64>, Option<u64>) {
    let total = meminfo.get("MemTotal").copied();
    let free = meminfo.get("MemFree").copied();
    let available = meminfo.get("MemAvailable").copied();
    (
        total.zip(free).map(|(t, f)| t.saturating_sub(f)),
        total.zip(available).map(|(t, a)| t.saturating_sub(a)),
    )
}

/// All CPUs' busy time from the first line of `/proc/stat` (user hertz 100), in nanoseconds.
fn proc_stat_cpu_ns(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal: all but idle and iowait.
    let busy: u64 = fields
        .iter()
        .take(8)
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .map(|(_, v)| *v)
        .sum();
    Some(busy.saturating_mul(10_000_000))
}

/// The kept CPU sample per key (`node`, `pod/<uid>`, `container/<id>`) and the rate it ended,
/// to turn cumulative CPU time into a rate.
#[derive(Debug, Default)]
pub struct Rates {
    /// key → (time ns, cumulative core-ns, the rate up to that sample).
    last: HashMap<String, (i64, u64, Option<u64>)>,
}

/// A sample closer than this to the kept one neither replaces it nor makes a new rate: two
/// scrapers a few milliseconds apart would otherwise make a rate out of noise. The rate of the
/// kept sample is answered instead.
const MIN_SAMPLE_GAP_NS: i64 = 1_000_000_000;

impl Rates {
    /// Nano-cores between the kept sample of `key` and this one: `None` for the first sample
    /// or when the counter went back (as when a pod's container restarted).
    pub fn rate(&mut self, key: &str, at_ns: i64, total: u64) -> Option<u64> {
        let rate = match self.last.get(key) {
            Some(&(_, v0, _)) if total < v0 => None,
            Some(&(t0, _, kept)) if at_ns - t0 < MIN_SAMPLE_GAP_NS => return kept,
            Some(&(t0, v0, _)) => {
                let delta = u128::from(total - v0) * 1_000_000_000 / (at_ns - t0) as u128;
                Some(u64::try_from(delta).unwrap_or(u64::MAX))
            }
            None => None,
        };
        self.last.insert(key.to_string(), (at_ns, total, rate));
        rate
    }

    /// Forgets the samples of what is gone.
    pub fn keep_only(&mut self, seen: &HashSet<String>) {
        self.last.retain(|k, _| seen.contains(k));
    }
}

fn time_ns(ns: i64) -> Time {
    Time(jiff::Timestamp::from_nanosecond(i128::from(ns)).unwrap_or(jiff::Timestamp::UNIX_EPOCH))
}

/// Builds the summary from one reading of the runtime and the host (pure apart from `rates`).
/// `running` are the containers to report, with their creation times; usage of any other
/// container is left out (exited ones linger in `ListContainerStats`).
pub fn build_summary(
    node_name: &str,
    node: &NodeSample,
    stats: &[proto::ContainerStats],
    running: &[proto::Container],
    rates: &mut Rates,
) -> Summary {
    let mut seen = HashSet::new();
    seen.insert("node".to_string());
    let created: HashMap<&str, i64> = running
        .iter()
        .map(|c| (c.id.as_str(), c.created_at))
        .collect();
    let mut pods: BTreeMap<(String, String, String), PodStats> = BTreeMap::new();
    for s in stats {
        let Some(attrs) = &s.attributes else { continue };
        let Some(&created_at) = created.get(attrs.id.as_str()) else {
            continue;
        };
        let label = |k: &str| attrs.labels.get(k).cloned().unwrap_or_default();
        let uid = label(labels::POD_UID_LABEL);
        if uid.is_empty() {
            continue;
        }
        let name = attrs
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| label(labels::CONTAINER_NAME_LABEL));
        let cpu = s.cpu.as_ref().map(|c| {
            let total = c.usage_core_nano_seconds.map(|v| v.value);
            let key = format!("container/{}", attrs.id);
            seen.insert(key.clone());
            let own = total.and_then(|t| rates.rate(&key, c.timestamp, t));
            CpuStats {
                time: time_ns(c.timestamp),
                usage_nano_cores: own.or(c.usage_nano_cores.map(|v| v.value)),
                usage_core_nano_seconds: total,
            }
        });
        let memory = s.memory.as_ref().map(|m| MemoryStats {
            time: time_ns(m.timestamp),
            available_bytes: m.available_bytes.map(|v| v.value),
            usage_bytes: m.usage_bytes.map(|v| v.value),
            working_set_bytes: m.working_set_bytes.map(|v| v.value),
            rss_bytes: m.rss_bytes.map(|v| v.value),
            page_faults: m.page_faults.map(|v| v.value),
            major_page_faults: m.major_page_faults.map(|v| v.value),
        });
        let rootfs = s.writable_layer.as_ref().map(|w| FsStats {
            time: time_ns(w.timestamp),
            used_bytes: w.used_bytes.map(|v| v.value),
            inodes_used: w.inodes_used.map(|v| v.value),
            ..fs_stats_of(node)
        });
        let key = (
            label(labels::POD_NAMESPACE_LABEL),
            label(labels::POD_NAME_LABEL),
            uid.clone(),
        );
        let pod = pods.entry(key.clone()).or_insert_with(|| PodStats {
            pod_ref: PodReference {
                name: key.1.clone(),
                namespace: key.0.clone(),
                uid: key.2.clone(),
            },
            ..Default::default()
        });
        let start = time_ns(created_at);
        if pod.start_time.as_ref().is_none_or(|t| start.0 < t.0) {
            pod.start_time = Some(start.clone());
        }
        pod.containers.push(ContainerStats {
            name,
            start_time: Some(start),
            cpu,
            memory,
            rootfs,
        });
    }
    let mut out = Vec::with_capacity(pods.len());
    for (_, mut pod) in pods {
        pod.containers.sort_by(|a, b| a.name.cmp(&b.name));
        pod.cpu = sum_cpu(&pod.containers).map(|(at, total)| {
            let key = format!("pod/{}", pod.pod_ref.uid);
            seen.insert(key.clone());
            CpuStats {
                time: time_ns(at),
                usage_nano_cores: rates.rate(&key, at, total),
                usage_core_nano_seconds: Some(total),
            }
        });
        pod.memory = sum_memory(&pod.containers);
        pod.ephemeral_storage = sum_rootfs(&pod.containers, node);
        out.push(pod);
    }
    let node_stats = NodeStats {
        node_name: node_name.to_string(),
        start_time: node
            .boot_time_s
            .map(|s| time_ns(s.saturating_mul(1_000_000_000))),
        cpu: node.cpu_core_ns.map(|total| CpuStats {
            time: time_ns(node.at_ns),
            usage_nano_cores: rates.rate("node", node.at_ns, total),
            usage_core_nano_seconds: Some(total),
        }),
        memory: node.memory_working_set.map(|ws| MemoryStats {
            time: time_ns(node.at_ns),
            available_bytes: node.memory_total.map(|t| t.saturating_sub(ws)),
            usage_bytes: node.memory_usage,
            working_set_bytes: Some(ws),
            ..MemoryStats::at(time_ns(node.at_ns))
        }),
        fs: node.fs.as_ref().map(|_| fs_stats_of(node)),
    };
    rates.keep_only(&seen);
    Summary {
        node: node_stats,
        pods: out,
    }
}

/// The node filesystem's figures, which a container's rootfs shares (capacity, free).
fn fs_stats_of(node: &NodeSample) -> FsStats {
    match &node.fs {
        Some(fs) => FsStats {
            time: time_ns(node.at_ns),
            available_bytes: Some(fs.available),
            capacity_bytes: Some(fs.capacity),
            used_bytes: Some(fs.used),
            inodes_free: Some(fs.inodes_free),
            inodes: Some(fs.inodes),
            inodes_used: Some(fs.inodes.saturating_sub(fs.inodes_free)),
        },
        None => FsStats::at(time_ns(node.at_ns)),
    }
}

/// Latest timestamp and total CPU of the containers that report it.
fn sum_cpu(containers: &[ContainerStats]) -> Option<(i64, u64)> {
    let mut any = None;
    for c in containers {
        if let Some(cpu) = &c.cpu
            && let Some(total) = cpu.usage_core_nano_seconds
        {
            let at = cpu.time.0.as_nanosecond() as i64;
            let (t, v) = any.unwrap_or((0i64, 0u64));
            any = Some((t.max(at), v.saturating_add(total)));
        }
    }
    any
}

fn sum_memory(containers: &[ContainerStats]) -> Option<MemoryStats> {
    let mut out: Option<MemoryStats> = None;
    for m in containers.iter().filter_map(|c| c.memory.as_ref()) {
        let acc = out.get_or_insert_with(|| MemoryStats::at(m.time.clone()));
        if m.time.0 > acc.time.0 {
            acc.time = m.time.clone();
        }
        let add = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
        };
        acc.usage_bytes = add(acc.usage_bytes, m.usage_bytes);
        acc.working_set_bytes = add(acc.working_set_bytes, m.working_set_bytes);
        acc.rss_bytes = add(acc.rss_bytes, m.rss_bytes);
        acc.page_faults = add(acc.page_faults, m.page_faults);
        acc.major_page_faults = add(acc.major_page_faults, m.major_page_faults);
    }
    out
}

fn sum_rootfs(containers: &[ContainerStats], node: &NodeSample) -> Option<FsStats> {
    let used: Vec<&FsStats> = containers
        .iter()
        .filter_map(|c| c.rootfs.as_ref())
        .collect();
    if used.is_empty() {
        return None;
    }
    Some(FsStats {
        used_bytes: Some(used.iter().filter_map(|f| f.used_bytes).sum()),
        inodes_used: Some(used.iter().filter_map(|f| f.inodes_used).sum()),
        ..fs_stats_of(node)
    })
}

fn millis(t: &Time) -> i64 {
    t.0.as_millisecond()
}

fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// `/metrics/resource` in the text format, upstream's names, help, labels and millisecond
/// timestamps (each sample carries the time it was measured). `error` sets `scrape_error`.
pub fn render_resource_metrics(summary: &Summary, error: bool) -> String {
    let mut out = String::new();
    let mut family = |name: &str, help: &str, kind: &str, rows: Vec<(String, f64, i64)>| {
        let _ = writeln!(out, "# HELP {name} [STABLE] {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, value, ms) in rows {
            let _ = writeln!(out, "{name}{labels} {value} {ms}");
        }
    };
    let container_labels = |c: &ContainerStats, p: &PodStats| {
        format!(
            "{{container=\"{}\",namespace=\"{}\",pod=\"{}\"}}",
            escape(&c.name),
            escape(&p.pod_ref.namespace),
            escape(&p.pod_ref.name)
        )
    };
    let pod_labels = |p: &PodStats| {
        format!(
            "{{namespace=\"{}\",pod=\"{}\"}}",
            escape(&p.pod_ref.namespace),
            escape(&p.pod_ref.name)
        )
    };
    let each_container = || {
        summary
            .pods
            .iter()
            .flat_map(|p| p.containers.iter().map(move |c| (p, c)))
    };
    let cpu_seconds = |c: &CpuStats| {
        c.usage_core_nano_seconds
            .map(|ns| (ns as f64 / 1e9, millis(&c.time)))
    };
    family(
        "container_cpu_usage_seconds_total",
        "Cumulative cpu time consumed by the container in core-seconds",
        "counter",
        each_container()
            .filter_map(|(p, c)| {
                let (v, ms) = cpu_seconds(c.cpu.as_ref()?)?;
                Some((container_labels(c, p), v, ms))
            })
            .collect(),
    );
    family(
        "container_memory_working_set_bytes",
        "Current working set of the container in bytes",
        "gauge",
        each_container()
            .filter_map(|(p, c)| {
                let m = c.memory.as_ref()?;
                Some((
                    container_labels(c, p),
                    m.working_set_bytes? as f64,
                    millis(&m.time),
                ))
            })
            .collect(),
    );
    family(
        "container_start_time_seconds",
        "Start time of the container since unix epoch in seconds",
        "gauge",
        each_container()
            .filter_map(|(p, c)| {
                let start = c.start_time.as_ref()?;
                // Upstream stamps it with the CPU sample's time.
                let ms = c
                    .cpu
                    .as_ref()
                    .map(|c| millis(&c.time))
                    .unwrap_or(millis(start));
                Some((
                    container_labels(c, p),
                    start.0.as_nanosecond() as f64 / 1e9,
                    ms,
                ))
            })
            .collect(),
    );
    family(
        "node_cpu_usage_seconds_total",
        "Cumulative cpu time consumed by the node in core-seconds",
        "counter",
        summary
            .node
            .cpu
            .as_ref()
            .and_then(cpu_seconds)
            .map(|(v, ms)| (String::new(), v, ms))
            .into_iter()
            .collect(),
    );
    family(
        "node_memory_working_set_bytes",
        "Current working set of the node in bytes",
        "gauge",
        summary
            .node
            .memory
            .as_ref()
            .and_then(|m| Some((String::new(), m.working_set_bytes? as f64, millis(&m.time))))
            .into_iter()
            .collect(),
    );
    family(
        "pod_cpu_usage_seconds_total",
        "Cumulative cpu time consumed by the pod in core-seconds",
        "counter",
        summary
            .pods
            .iter()
            .filter_map(|p| {
                let (v, ms) = cpu_seconds(p.cpu.as_ref()?)?;
                Some((pod_labels(p), v, ms))
            })
            .collect(),
    );
    family(
        "pod_memory_working_set_bytes",
        "Current working set of the pod in bytes",
        "gauge",
        summary
            .pods
            .iter()
            .filter_map(|p| {
                let m = p.memory.as_ref()?;
                Some((pod_labels(p), m.working_set_bytes? as f64, millis(&m.time)))
            })
            .collect(),
    );
    let _ = writeln!(
        out,
        "# HELP scrape_error [ALPHA] 1 if there was an error while getting container metrics, 0 otherwise"
    );
    let _ = writeln!(out, "# TYPE scrape_error gauge");
    let _ = writeln!(out, "scrape_error {}", u8::from(error));
    out
}

/// Reads the runtime and the host and keeps the previous samples for the rates.
pub struct StatsProvider {
    runtime: Arc<dyn StatsRuntime>,
    host: Arc<dyn HostReader>,
    node_name: String,
    rates: Mutex<Rates>,
}

impl StatsProvider {
    pub fn new(
        runtime: Arc<dyn StatsRuntime>,
        host: Arc<dyn HostReader>,
        node_name: String,
    ) -> Self {
        StatsProvider {
            runtime,
            host,
            node_name,
            rates: Mutex::new(Rates::default()),
        }
    }

    /// The summary now. The host is read on a blocking thread (cgroup files, `statvfs`).
    pub async fn summary(&self) -> Result<Summary, StatsError> {
        let selector = managed_selector(&self.node_name);
        let (stats, running) = futures::try_join!(
            self.runtime.container_stats(selector.clone()),
            self.runtime.running_containers(selector),
        )?;
        let host = self.host.clone();
        let node = tokio::task::spawn_blocking(move || host.node())
            .await
            .unwrap_or_default();
        let mut rates = self.rates.lock().unwrap_or_else(|e| e.into_inner());
        Ok(build_summary(
            &self.node_name,
            &node,
            &stats,
            &running,
            &mut rates,
        ))
    }

    /// `/metrics/resource`: on a runtime error, the node alone and `scrape_error 1`.
    pub async fn resource_metrics(&self) -> String {
        match self.summary().await {
            Ok(summary) => render_resource_metrics(&summary, false),
            Err(e) => {
                tracing::warn!(error = %e, "resource metrics: container stats unavailable");
                let host = self.host.clone();
                let node = tokio::task::spawn_blocking(move || host.node())
                    .await
                    .unwrap_or_default();
                let mut rates = self.rates.lock().unwrap_or_else(|e| e.into_inner());
                let summary = build_summary(&self.node_name, &node, &[], &[], &mut rates);
                render_resource_metrics(&summary, true)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cri::proto::{
        ContainerAttributes, ContainerMetadata, CpuUsage, MemoryUsage, UInt64Value,
    };

    #[test]
    fn parses_key_value_files() {
        let cases: &[(&str, &str, Option<u64>)] = &[
            (
                "MemTotal:       16384 kB\nMemFree: 1 kB\n",
                "MemTotal",
                Some(16384 * 1024),
            ),
            (
                "cache 10\ntotal_inactive_file 4096\n",
                "total_inactive_file",
                Some(4096),
            ),
            ("usage_usec 77\nuser_usec 5\n", "usage_usec", Some(77)),
            (
                "cpu 1 2 3\nbtime 1700000000\n",
                "btime",
                Some(1_700_000_000),
            ),
            ("garbage\nx y\n", "x", None),
        ];
        for (text, key, want) in cases {
            assert_eq!(key_values(text).get(*key).copied(), *want, "{text:?}");
        }
    }

    #[test]
    fn working_set_is_usage_less_inactive_file() {
        let cases = [
            (1000, Some(300), 700),
            (1000, None, 1000),
            (100, Some(300), 0),
        ];
        for (usage, inactive, want) in cases {
            assert_eq!(working_set(usage, inactive), want);
        }
    }

    #[test]
    fn proc_stat_busy_time() {
        // user 100, nice 0, system 50, idle 1000, iowait 20, irq 5, softirq 5, steal 0
        let text = "cpu  100 0 50 1000 20 5 5 0 0 0\ncpu0 1 1 1 1\n";
        assert_eq!(proc_stat_cpu_ns(text), Some(160 * 10_000_000));
        assert_eq!(proc_stat_cpu_ns("intr 1\n"), None);
    }

    #[test]
    fn rates_from_two_samples() {
        let s = 1_000_000_000i64;
        // (at, total, want)
        let steps: &[(i64, u64, Option<u64>)] = &[
            (10 * s, 5_000_000_000, None),                     // first sample
            (12 * s, 6_000_000_000, Some(500_000_000)),        // 1 s of CPU in 2 s
            (12 * s + 1000, 6_000_000_100, Some(500_000_000)), // too close: the kept rate
            (14 * s, 8_000_000_000, Some(1_000_000_000)),      // against the 12 s sample
            (15 * s, 1_000, None),                             // counter went back
            (17 * s, 1_000 + 2 * 250_000_000, Some(250_000_000)),
        ];
        let mut rates = Rates::default();
        for (i, (at, total, want)) in steps.iter().enumerate() {
            assert_eq!(rates.rate("k", *at, *total), *want, "step {i}");
        }
        rates.keep_only(&HashSet::new());
        assert_eq!(rates.rate("k", 20 * s, 9), None);
    }

    fn stat(
        id: &str,
        pod: &str,
        uid: &str,
        name: &str,
        at: i64,
        cpu: u64,
        ws: u64,
    ) -> proto::ContainerStats {
        proto::ContainerStats {
            attributes: Some(ContainerAttributes {
                id: id.into(),
                metadata: Some(ContainerMetadata {
                    name: name.into(),
                    attempt: 0,
                }),
                labels: HashMap::from([
                    (labels::POD_UID_LABEL.to_string(), uid.to_string()),
                    (labels::POD_NAME_LABEL.to_string(), pod.to_string()),
                    (
                        labels::POD_NAMESPACE_LABEL.to_string(),
                        "default".to_string(),
                    ),
                ]),
                annotations: HashMap::new(),
            }),
            cpu: Some(CpuUsage {
                timestamp: at,
                usage_core_nano_seconds: Some(UInt64Value { value: cpu }),
                ..Default::default()
            }),
            memory: Some(MemoryUsage {
                timestamp: at,
                working_set_bytes: Some(UInt64Value { value: ws }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn running(id: &str, created: i64) -> proto::Container {
        proto::Container {
            id: id.into(),
            created_at: created,
            ..Default::default()
        }
    }

    #[test]
    fn groups_containers_by_pod_and_sums() {
        let s = 1_000_000_000i64;
        let node = NodeSample {
            at_ns: 100 * s,
            cpu_core_ns: Some(50 * s as u64),
            memory_working_set: Some(4096),
            memory_total: Some(10_000),
            ..Default::default()
        };
        let stats = vec![
            stat("a1", "web", "u1", "app", 100 * s, 3 * s as u64, 100),
            stat("a2", "web", "u1", "side", 100 * s, s as u64, 50),
            stat("b1", "db", "u2", "db", 100 * s, 7, 10),
            stat("gone", "db", "u2", "old", 100 * s, 7, 10), // not running
        ];
        let run = vec![
            running("a1", 5 * s),
            running("a2", 3 * s),
            running("b1", 9 * s),
        ];
        let mut rates = Rates::default();
        let sum = build_summary("n1", &node, &stats, &run, &mut rates);
        assert_eq!(sum.node.node_name, "n1");
        assert_eq!(
            sum.node.memory.as_ref().unwrap().available_bytes,
            Some(10_000 - 4096)
        );
        // (pod, containers, CPU core-ns, working set)
        type Row<'a> = (&'a str, Vec<&'a str>, Option<u64>, Option<u64>);
        let pods: Vec<Row> = sum
            .pods
            .iter()
            .map(|p| {
                (
                    p.pod_ref.name.as_str(),
                    p.containers.iter().map(|c| c.name.as_str()).collect(),
                    p.cpu.as_ref().and_then(|c| c.usage_core_nano_seconds),
                    p.memory.as_ref().and_then(|m| m.working_set_bytes),
                )
            })
            .collect();
        assert_eq!(
            pods,
            vec![
                ("db", vec!["db"], Some(7), Some(10)),
                ("web", vec!["app", "side"], Some(4 * s as u64), Some(150)),
            ]
        );
        let web = &sum.pods[1];
        assert_eq!(web.start_time.as_ref().unwrap().0.as_second(), 3);

        // A second sample 2 s later gives rates.
        let node2 = NodeSample {
            at_ns: 102 * s,
            cpu_core_ns: Some(52 * s as u64),
            ..node
        };
        let stats2 = vec![
            stat("a1", "web", "u1", "app", 102 * s, 4 * s as u64, 100),
            stat("a2", "web", "u1", "side", 102 * s, s as u64, 50),
        ];
        let sum2 = build_summary("n1", &node2, &stats2, &run, &mut rates);
        assert_eq!(sum2.node.cpu.unwrap().usage_nano_cores, Some(1_000_000_000));
        let web = &sum2.pods[0];
        assert_eq!(
            web.cpu.as_ref().unwrap().usage_nano_cores,
            Some(500_000_000)
        );
        assert_eq!(
            web.containers[0].cpu.as_ref().unwrap().usage_nano_cores,
            Some(500_000_000)
        );
        assert_eq!(
            web.containers[1].cpu.as_ref().unwrap().usage_nano_cores,
            Some(0)
        );
        // The vanished pod's samples are forgotten.
        assert!(!rates.last.contains_key("pod/u2"));
    }

    #[test]
    fn summary_json_uses_upstream_names() {
        let s = 1_000_000_000i64;
        let node = NodeSample {
            at_ns: 100 * s,
            cpu_core_ns: Some(1),
            memory_working_set: Some(2),
            fs: Some(FsSample {
                capacity: 10,
                available: 5,
                used: 4,
                inodes: 3,
                inodes_free: 1,
            }),
            ..Default::default()
        };
        let stats = vec![stat("a1", "web", "u1", "app", 100 * s, 3, 4)];
        let sum = build_summary(
            "n1",
            &node,
            &stats,
            &[running("a1", s)],
            &mut Rates::default(),
        );
        let v = serde_json::to_value(&sum).unwrap();
        assert_eq!(v["node"]["nodeName"], "n1");
        assert_eq!(v["node"]["cpu"]["usageCoreNanoSeconds"], 1);
        assert_eq!(v["node"]["fs"]["capacityBytes"], 10);
        assert_eq!(v["node"]["fs"]["inodesUsed"], 2);
        assert_eq!(v["pods"][0]["podRef"]["uid"], "u1");
        assert_eq!(
            v["pods"][0]["containers"][0]["memory"]["workingSetBytes"],
            4
        );
        assert_eq!(
            v["pods"][0]["containers"][0]["startTime"],
            "1970-01-01T00:00:01Z"
        );
        assert!(v["pods"][0]["cpu"].get("usageNanoCores").is_none());
    }

    #[test]
    fn resource_metrics_text() {
        let s = 1_000_000_000i64;
        let node = NodeSample {
            at_ns: 100 * s,
            cpu_core_ns: Some(2_500_000_000),
            memory_working_set: Some(2048),
            ..Default::default()
        };
        let stats = vec![stat("a1", "web", "u1", "app", 100 * s, 1_500_000_000, 4)];
        let sum = build_summary(
            "n1",
            &node,
            &stats,
            &[running("a1", s)],
            &mut Rates::default(),
        );
        let text = render_resource_metrics(&sum, false);
        for line in [
            "# TYPE container_cpu_usage_seconds_total counter",
            "container_cpu_usage_seconds_total{container=\"app\",namespace=\"default\",pod=\"web\"} 1.5 100000",
            "container_memory_working_set_bytes{container=\"app\",namespace=\"default\",pod=\"web\"} 4 100000",
            "container_start_time_seconds{container=\"app\",namespace=\"default\",pod=\"web\"} 1 100000",
            "node_cpu_usage_seconds_total 2.5 100000",
            "node_memory_working_set_bytes 2048 100000",
            "pod_cpu_usage_seconds_total{namespace=\"default\",pod=\"web\"} 1.5 100000",
            "pod_memory_working_set_bytes{namespace=\"default\",pod=\"web\"} 4 100000",
            "scrape_error 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing {line:?} in\n{text}"
            );
        }
        assert!(render_resource_metrics(&Summary::default(), true).ends_with("scrape_error 1\n"));
    }
}
