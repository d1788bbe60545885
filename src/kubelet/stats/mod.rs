//! `/stats/summary` and `/metrics/resource`: what metrics-server and `kubectl top` read.
//!
//! Containers come from CRI `ListContainerStats` (cumulative CPU, memory working set, writable
//! layer), grouped by the pod labels the agent put on them. A pod's CPU and memory come from
//! its cgroup where it has one (what upstream reports: the sandbox and everything else in the
//! pod counts), else they are the sums of its running containers. Pods also get their network
//! counters (read in the sandbox's network namespace, `/proc/<sandbox pid>/net/dev`), their
//! volumes' disk use (walked, and kept for `volumeStatsAggPeriod`, see [`host`]), their
//! containers' log files, and the ephemeral storage all of that adds up to.
//!
//! The node comes from the root cgroup (cgroup v1 `cpuacct.usage`, `memory.usage_in_bytes`
//! less `total_inactive_file`, as cadvisor reckons the working set; `/proc/stat` and
//! `/proc/meminfo` where those files are missing), `/proc/net/dev`, `statvfs` of the root
//! directory, the runtime's image filesystem (CRI `ImageFsInfo`), the process limits and the
//! `kubepods` cgroup (`systemContainers`). Rates (`usageNanoCores`) are the difference to the
//! previous sample of the same container, pod or node, kept in memory as cadvisor keeps its
//! last sample.
//!
//! The reading is behind [`StatsRuntime`], [`SandboxInspector`] and [`HostReader`]; grouping,
//! working set, rates, the composition of the summary and the rendering of both pages are pure
//! functions, table-tested below. The summary's types are in [`types`]; what it reads of the
//! host in [`host`]. It is its own module because the node API, the read-only port and the
//! eviction manager all read it; the HTTP answers are `endpoints::stats`'s.

pub(crate) mod host;
pub(crate) mod types;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use self::host::{CgroupSample, DiskUsage, DiskUsageCache, InterfaceSample, PodCgroups};
use self::types::{
    ContainerStats, CpuStats, FsStats, InterfaceStats, MemoryStats, NetworkStats, NodeStats,
    PodReference, PodStats, ProcessStats, RlimitStats, RuntimeStats, Summary, VolumeStats,
};
use crate::base::clock;
use crate::base::cri_labels;
use crate::base::cri_labels::managed_selector;
use crate::clients::cri::proto::{
    self, ContainerFilter, ContainerState, ContainerStateValue, ContainerStatsFilter,
    PodSandboxFilter, PodSandboxState, PodSandboxStateValue,
};
use crate::clients::cri::{CriError, ImageService, RuntimeService};
use crate::kubelet::volume::{
    CONFIG_MAP_PLUGIN, DOWNWARD_API_PLUGIN, EMPTY_DIR_PLUGIN, PROJECTED_PLUGIN, SECRET_PLUGIN,
};

/// Why no summary could be made.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    #[error("failed to list container stats: {0}")]
    Runtime(#[from] CriError),
}

/// What the stats need of the runtime: the managed containers' usage and their creation
/// times, the pods' sandboxes, and the image filesystem.
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
    /// The ready sandboxes the selector picks.
    fn ready_sandboxes(
        &self,
        selector: HashMap<String, String>,
    ) -> BoxFuture<'_, Result<Vec<proto::PodSandbox>, CriError>>;
    /// CRI `ImageFsInfo`.
    fn image_fs_info(&self) -> BoxFuture<'_, Result<proto::ImageFsInfoResponse, CriError>>;
}

impl<R: RuntimeService + ImageService> StatsRuntime for R {
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
    fn ready_sandboxes(
        &self,
        selector: HashMap<String, String>,
    ) -> BoxFuture<'_, Result<Vec<proto::PodSandbox>, CriError>> {
        Box::pin(self.list_pod_sandbox(Some(PodSandboxFilter {
            state: Some(PodSandboxStateValue {
                state: PodSandboxState::SandboxReady as i32,
            }),
            label_selector: selector,
            ..Default::default()
        })))
    }
    fn image_fs_info(&self) -> BoxFuture<'_, Result<proto::ImageFsInfoResponse, CriError>> {
        Box::pin(ImageService::image_fs_info(self))
    }
}

/// What the stats need to know of a sandbox beyond its listing: its process (whose network
/// namespace holds the pod's interfaces) and whether it uses the node's network.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SandboxFacts {
    pub pid: Option<u32>,
    pub host_network: bool,
}

/// Looks at one sandbox (CRI `PodSandboxStatus` with `verbose`). A sandbox's facts never
/// change while it lives, so the provider asks once per sandbox.
pub trait SandboxInspector: Send + Sync + 'static {
    fn facts(&self, sandbox_id: String) -> BoxFuture<'_, Option<SandboxFacts>>;
}

/// The sandbox's facts from its verbose status: `info["info"]` is containerd's JSON with the
/// sandbox's `pid`; the namespace options say whether the network is the node's. Pure.
pub(crate) fn sandbox_facts(resp: &proto::PodSandboxStatusResponse) -> SandboxFacts {
    let host_network = resp
        .status
        .as_ref()
        .and_then(|s| s.linux.as_ref())
        .and_then(|l| l.namespaces.as_ref())
        .and_then(|n| n.options.as_ref())
        .is_some_and(|o| o.network == proto::NamespaceMode::Node as i32);
    let pid = resp
        .info
        .get("info")
        .and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok())
        .and_then(|v| v.get("pid").and_then(serde_json::Value::as_u64))
        .and_then(|p| u32::try_from(p).ok())
        .filter(|p| *p > 0);
    SandboxFacts { pid, host_network }
}

/// The real inspector: a verbose `PodSandboxStatus` on the CRI connection (the shared CRI
/// client asks without `verbose`, which containerd answers faster).
pub(crate) struct CriSandboxInspector {
    channel: tonic::transport::Channel,
    timeout: Duration,
}

impl CriSandboxInspector {
    pub(crate) fn new(channel: tonic::transport::Channel, timeout: Duration) -> Self {
        CriSandboxInspector { channel, timeout }
    }
}

impl SandboxInspector for CriSandboxInspector {
    fn facts(&self, sandbox_id: String) -> BoxFuture<'_, Option<SandboxFacts>> {
        Box::pin(async move {
            let mut client =
                proto::runtime_service_client::RuntimeServiceClient::new(self.channel.clone());
            let call = client.pod_sandbox_status(proto::PodSandboxStatusRequest {
                pod_sandbox_id: sandbox_id.clone(),
                verbose: true,
            });
            match tokio::time::timeout(self.timeout, call).await {
                Ok(Ok(resp)) => Some(sandbox_facts(resp.get_ref())),
                Ok(Err(status)) => {
                    tracing::debug!(sandbox = %sandbox_id, error = %status.message(), "stats: sandbox status failed");
                    None
                }
                Err(_) => {
                    tracing::debug!(sandbox = %sandbox_id, "stats: sandbox status timed out");
                    None
                }
            }
        })
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
    /// The node's interfaces (`/proc/net/dev`) and the default route's interface.
    pub network: Option<Vec<InterfaceSample>>,
    pub default_interface: Option<String>,
    pub max_pid: Option<i64>,
    pub processes: Option<i64>,
    /// The `kubepods` cgroup, every pod's parent.
    pub pods_cgroup: Option<CgroupSample>,
    /// The filesystem of the pod log directory.
    pub logs_fs: Option<FsSample>,
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

/// The runtime's filesystem as CRI `ImageFsInfo` tells it (what the images, or the writable
/// layers, use) with `statvfs` of its mountpoint.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct RuntimeFsSample {
    pub at_ns: i64,
    pub used: Option<u64>,
    pub inodes_used: Option<u64>,
    pub fs: Option<FsSample>,
}

/// A pod the host is asked about.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodTarget {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    /// The container names whose logs to measure.
    pub containers: Vec<String>,
    /// The sandbox's process, for its network namespace; `None` for the node's network.
    pub netns_pid: Option<u32>,
}

/// One volume of a pod as the host measured it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VolumeSample {
    pub name: String,
    /// When `usage` was measured (it may be kept from an earlier scrape).
    pub at_ns: i64,
    pub usage: DiskUsage,
    pub fs: Option<FsSample>,
    /// On the node's disk and counted in the pod's ephemeral storage (upstream: an emptyDir
    /// not in memory, a configMap).
    pub ephemeral: bool,
}

/// What the host tells of one pod.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodHostSample {
    pub cgroup: Option<CgroupSample>,
    pub network_at_ns: i64,
    pub network: Option<Vec<InterfaceSample>>,
    pub volumes: Vec<VolumeSample>,
    /// The CSI volumes' figures, as their drivers last gave them (`volume::csi::stats`).
    pub(crate) csi_volumes: Vec<crate::kubelet::volume::csi::stats::Measured>,
    /// Container name → its log files' use.
    pub logs: HashMap<String, DiskUsage>,
    /// The pod's `/etc/hosts` file, which is on the node's disk too.
    pub etc_hosts: Option<DiskUsage>,
}

/// Reads the node's usage.
pub trait HostReader: Send + Sync + 'static {
    fn node(&self) -> NodeSample;
    /// The pod's cgroup, network, volumes and logs; `cpu_and_memory_only` reads the cgroup
    /// alone (upstream's `only_cpu_and_memory`, what metrics-server asks for).
    fn pod(&self, pod: &PodTarget, cpu_and_memory_only: bool) -> PodHostSample {
        let _ = (pod, cpu_and_memory_only);
        PodHostSample::default()
    }
    /// `statvfs` of the filesystem holding `path`.
    fn fs(&self, path: &Path) -> Option<FsSample> {
        statvfs(path)
    }
    /// Forgets what was kept for pods that are gone, and measures again what went stale; on
    /// a blocking thread, after the scrape was answered.
    fn housekeeping(&self, live: &HashSet<String>) {
        let _ = live;
    }
}

/// The real host: cgroup files under `cgroup_root`, `/proc`, `statvfs` of `root_dir`, the pods'
/// volume directories under `root_dir` and their logs under `pod_logs_dir`.
pub(crate) struct HostFiles {
    pub cgroup_root: PathBuf,
    pub proc_root: PathBuf,
    pub root_dir: PathBuf,
    pub pod_logs_dir: PathBuf,
    /// Where the pods' cgroups are (none with `--cgroups-per-qos=false` or the systemd driver).
    pub pod_cgroups: Option<PodCgroups>,
    volumes: DiskUsageCache,
    /// Volume paths found stale by the last scrape, for [`HostReader::housekeeping`].
    stale: Mutex<Vec<PathBuf>>,
}

/// Upstream's `volumeStatsAggPeriod` default: how long a volume's measured use is kept.
pub(crate) const DEFAULT_VOLUME_STATS_PERIOD: Duration = Duration::from_secs(60);

impl Default for HostFiles {
    fn default() -> Self {
        HostFiles::new(
            PathBuf::from("/"),
            PathBuf::from("/var/log/pods"),
            None,
            DEFAULT_VOLUME_STATS_PERIOD,
        )
    }
}

/// The local volume plugins whose directories hold the data (others are mounts of remote
/// storage, or none at all), and whether a volume of that plugin counts as ephemeral storage
/// when it is on the node's disk (upstream counts emptyDir and configMap).
const MEASURED_PLUGINS: &[(&str, bool)] = &[
    (EMPTY_DIR_PLUGIN, true),
    (CONFIG_MAP_PLUGIN, true),
    (SECRET_PLUGIN, false),
    (PROJECTED_PLUGIN, false),
    (DOWNWARD_API_PLUGIN, false),
];

impl HostFiles {
    pub(crate) fn new(
        root_dir: PathBuf,
        pod_logs_dir: PathBuf,
        pod_cgroups: Option<PodCgroups>,
        volume_stats_period: Duration,
    ) -> Self {
        HostFiles {
            cgroup_root: PathBuf::from("/sys/fs/cgroup"),
            proc_root: PathBuf::from("/proc"),
            root_dir,
            pod_logs_dir,
            pod_cgroups,
            volumes: DiskUsageCache::new(volume_stats_period),
            stale: Mutex::new(Vec::new()),
        }
    }

    fn read(&self, path: PathBuf) -> Option<String> {
        match std::fs::read_to_string(&path) {
            Ok(text) => Some(text),
            Err(e) => {
                tracing::trace!(path = %path.display(), error = %e, "stats: file not readable");
                None
            }
        }
    }

    fn pod_dir(&self, uid: &str) -> Option<PathBuf> {
        crate::base::safe_names::component_problem(uid)
            .is_none()
            .then(|| self.root_dir.join("pods").join(uid))
    }

    /// The pod's volumes: every directory under `volumes/<plugin>/` of the measured plugins.
    fn volumes(&self, uid: &str, stale: &mut Vec<PathBuf>) -> Vec<VolumeSample> {
        if self.volumes.is_off() {
            return Vec::new();
        }
        let Some(pod_dir) = self.pod_dir(uid) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for (plugin, counts) in MEASURED_PLUGINS {
            let Ok(entries) = std::fs::read_dir(pod_dir.join("volumes").join(plugin)) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                let Some((usage, at_ns)) = self.volumes.get(&path, stale) else {
                    continue;
                };
                let (fs, tmpfs) = statfs(&path);
                out.push(VolumeSample {
                    name: entry.file_name().to_string_lossy().into_owned(),
                    at_ns,
                    usage,
                    fs,
                    ephemeral: *counts && !tmpfs,
                });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }
}

/// `statfs` of `path`: its figures and whether it is a tmpfs (memory, not the node's disk).
fn statfs(path: &Path) -> (Option<FsSample>, bool) {
    match nix::sys::statfs::statfs(path) {
        Ok(st) => {
            let bsize = st.block_size() as u64;
            let capacity = st.blocks().saturating_mul(bsize);
            let free = st.blocks_free().saturating_mul(bsize);
            (
                Some(FsSample {
                    capacity,
                    available: st.blocks_available().saturating_mul(bsize),
                    used: capacity.saturating_sub(free),
                    inodes: st.files(),
                    inodes_free: st.files_free(),
                }),
                st.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC,
            )
        }
        Err(_) => (None, false),
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
        let sys = self.proc_root.join("sys/kernel");
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
            network: self
                .read(self.proc_root.join("net/dev"))
                .map(|t| host::parse_net_dev(&t)),
            default_interface: self
                .read(self.proc_root.join("net/route"))
                .and_then(|t| host::default_route_interface(&t)),
            max_pid: host::max_pid(
                self.read(sys.join("pid_max")).as_deref(),
                self.read(sys.join("threads-max")).as_deref(),
            ),
            processes: self
                .read(self.proc_root.join("loadavg"))
                .and_then(|t| host::loadavg_tasks(&t)),
            pods_cgroup: self.pod_cgroups.as_ref().and_then(|c| c.read(&c.kubepods)),
            logs_fs: statvfs(&self.pod_logs_dir),
        }
    }

    fn pod(&self, pod: &PodTarget, cpu_and_memory_only: bool) -> PodHostSample {
        let cgroup = self.pod_cgroups.as_ref().and_then(|c| c.pod(&pod.uid));
        if cpu_and_memory_only {
            return PodHostSample {
                cgroup,
                ..Default::default()
            };
        }
        let network_at_ns = now_ns();
        let network = pod.netns_pid.and_then(|pid| {
            self.read(self.proc_root.join(pid.to_string()).join("net/dev"))
                .map(|t| host::parse_net_dev(&t))
        });
        let mut stale = Vec::new();
        let volumes = self.volumes(&pod.uid, &mut stale);
        if !stale.is_empty() {
            self.stale
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .extend(stale);
        }
        let mut logs = HashMap::new();
        if [&pod.namespace, &pod.name, &pod.uid]
            .iter()
            .all(|c| crate::base::safe_names::component_problem(c).is_none())
        {
            let pod_logs = crate::base::safe_names::pod_log_directory(
                &self.pod_logs_dir,
                &pod.namespace,
                &pod.name,
                &pod.uid,
            );
            for c in &pod.containers {
                if crate::base::safe_names::component_problem(c).is_some() {
                    continue;
                }
                if let Some(u) = host::disk_usage(&pod_logs.join(c), host::WALK_LIMIT) {
                    logs.insert(c.clone(), u);
                }
            }
        }
        let etc_hosts = self
            .pod_dir(&pod.uid)
            .and_then(|d| host::disk_usage(&d.join("etc-hosts"), 1));
        PodHostSample {
            cgroup,
            network_at_ns,
            network,
            volumes,
            csi_volumes: crate::kubelet::volume::csi::stats::of_pod(&pod.uid),
            logs,
            etc_hosts,
        }
    }

    fn housekeeping(&self, live: &HashSet<String>) {
        let stale = std::mem::take(&mut *self.stale.lock().unwrap_or_else(|e| e.into_inner()));
        // Paths of pods that are gone are forgotten; the rest of the stale ones walked again.
        let under_live = |p: &PathBuf| {
            p.strip_prefix(self.root_dir.join("pods"))
                .ok()
                .and_then(|rel| rel.components().next())
                .is_some_and(|uid| live.contains(uid.as_os_str().to_string_lossy().as_ref()))
        };
        self.volumes.retain_where(under_live);
        let stale: Vec<PathBuf> = stale.into_iter().filter(under_live).collect();
        if !stale.is_empty() {
            let began = clock::instant();
            self.volumes.refresh(&stale);
            tracing::debug!(
                volumes = stale.len(),
                elapsed_ms = began.elapsed().as_secs_f64() * 1000.0,
                "stats: volumes measured again"
            );
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

/// Nanoseconds since the epoch, now.
pub(crate) fn now_ns() -> i64 {
    clock::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or_default()
}

/// `key value [unit]` lines (`memory.stat`, `cpu.stat`, `/proc/meminfo` with its `kB`, the
/// `btime` line of `/proc/stat`) → key → value, with `kB` turned into bytes.
pub(crate) fn key_values(text: &str) -> HashMap<String, u64> {
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
pub(crate) fn working_set(usage: u64, inactive_file: Option<u64>) -> u64 {
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
pub(crate) struct Rates {
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
    pub(crate) fn rate(&mut self, key: &str, at_ns: i64, total: u64) -> Option<u64> {
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
    pub(crate) fn keep_only(&mut self, seen: &HashSet<String>) {
        self.last.retain(|k, _| seen.contains(k));
    }
}

fn time_ns(ns: i64) -> Time {
    Time(jiff::Timestamp::from_nanosecond(i128::from(ns)).unwrap_or(jiff::Timestamp::UNIX_EPOCH))
}

/// Everything one scrape read, the input of [`build_summary`].
#[derive(Clone, Debug, Default)]
pub(crate) struct Reading {
    pub node: NodeSample,
    /// The containers' usage (`ListContainerStats`); exited ones linger there.
    pub stats: Vec<proto::ContainerStats>,
    /// The containers to report, with their creation times.
    pub running: Vec<proto::Container>,
    /// What the host told of each pod, by UID.
    pub pods: HashMap<String, PodHostSample>,
    pub image_fs: Option<RuntimeFsSample>,
    /// Where the writable layers are, when the runtime names a filesystem of their own
    /// (otherwise they are on the image filesystem).
    pub container_fs: Option<RuntimeFsSample>,
}

/// The interface upstream gives at the top of a pod's network figures.
const POD_DEFAULT_INTERFACE: &str = "eth0";

/// Builds the summary from one reading of the runtime and the host (pure apart from `rates`).
///
/// Containers first, grouped by pod; then each pod's own figures; then the node. Every key
/// whose rate is kept is noted in `seen`, and the samples of what is gone are forgotten.
pub(crate) fn build_summary(node_name: &str, reading: &Reading, rates: &mut Rates) -> Summary {
    let mut seen = HashSet::new();
    seen.insert("node".to_string());
    let pods = group_containers(reading, rates, &mut seen)
        .into_values()
        .map(|pod| pod_figures(pod, reading, rates, &mut seen))
        .collect();
    let node = node_stats(node_name, reading, rates, &mut seen);
    rates.keep_only(&seen);
    Summary { node, pods }
}

/// A pod as the container labels name it: (namespace, name, UID), the order pods are
/// listed in.
type PodKey = (String, String, String);

/// The running containers' usage grouped into their pods (by the labels the agent put on
/// them); a pod starts when its first container was created. Exited containers, which linger
/// in `ListContainerStats`, and containers of no pod are left out.
fn group_containers(
    reading: &Reading,
    rates: &mut Rates,
    seen: &mut HashSet<String>,
) -> BTreeMap<PodKey, PodStats> {
    let created: HashMap<&str, i64> = reading
        .running
        .iter()
        .map(|c| (c.id.as_str(), c.created_at))
        .collect();
    let mut pods: BTreeMap<PodKey, PodStats> = BTreeMap::new();
    for s in &reading.stats {
        let Some(attrs) = &s.attributes else { continue };
        let Some(&created_at) = created.get(attrs.id.as_str()) else {
            continue;
        };
        let Some((key, container)) = container_entry(s, attrs, created_at, reading, rates, seen)
        else {
            continue;
        };
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
            pod.start_time = Some(start);
        }
        pod.containers.push(container);
    }
    pods
}

/// One running container's figures and the pod it belongs to; `None` for a container that
/// names no pod UID. Its CPU rate is its own, from its cumulative time; its rootfs is its
/// writable layer on the container (or image, or node) filesystem; its logs are what the host
/// measured of its log files.
fn container_entry(
    s: &proto::ContainerStats,
    attrs: &proto::ContainerAttributes,
    created_at: i64,
    reading: &Reading,
    rates: &mut Rates,
    seen: &mut HashSet<String>,
) -> Option<(PodKey, ContainerStats)> {
    let node = &reading.node;
    let container_fs = reading
        .container_fs
        .as_ref()
        .or(reading.image_fs.as_ref())
        .and_then(|r| r.fs.as_ref());
    let label = |k: &str| attrs.labels.get(k).cloned().unwrap_or_default();
    let uid = label(cri_labels::POD_UID_LABEL);
    if uid.is_empty() {
        return None;
    }
    let name = attrs
        .metadata
        .as_ref()
        .map(|m| m.name.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| label(cri_labels::CONTAINER_NAME_LABEL));
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
        used_bytes: w.used_bytes.map(|v| v.value),
        inodes_used: w.inodes_used.map(|v| v.value),
        ..fs_figures(container_fs.or(node.fs.as_ref()), w.timestamp)
    });
    let logs = reading
        .pods
        .get(&uid)
        .and_then(|p| p.logs.get(&name))
        .map(|u| FsStats {
            used_bytes: Some(u.bytes),
            inodes_used: Some(u.inodes),
            ..fs_figures(node.logs_fs.as_ref(), node.at_ns)
        });
    let key = (
        label(cri_labels::POD_NAMESPACE_LABEL),
        label(cri_labels::POD_NAME_LABEL),
        uid,
    );
    let container = ContainerStats {
        name,
        start_time: Some(time_ns(created_at)),
        cpu,
        memory,
        rootfs,
        logs,
    };
    Some((key, container))
}

/// A pod's own figures, once its containers are in: CPU and memory from its cgroup (or the
/// containers' sums), process count, network, volumes and ephemeral storage from what the
/// host told of it.
fn pod_figures(
    mut pod: PodStats,
    reading: &Reading,
    rates: &mut Rates,
    seen: &mut HashSet<String>,
) -> PodStats {
    pod.containers.sort_by(|a, b| a.name.cmp(&b.name));
    let host = reading.pods.get(&pod.pod_ref.uid);
    let cgroup = host.and_then(|h| h.cgroup.as_ref());
    let key = format!("pod/{}", pod.pod_ref.uid);
    // The pod's cgroup counts everything in the pod (the sandbox too), as upstream's
    // figures do; without one, the containers' sums stand in.
    let cpu_total = match cgroup.and_then(|c| c.cpu_core_ns.map(|v| (c.at_ns, v))) {
        Some(sample) => Some(sample),
        None => sum_cpu(&pod.containers),
    };
    pod.cpu = cpu_total.map(|(at, total)| {
        seen.insert(key.clone());
        CpuStats {
            time: time_ns(at),
            usage_nano_cores: rates.rate(&key, at, total),
            usage_core_nano_seconds: Some(total),
        }
    });
    pod.memory = match cgroup.filter(|c| c.memory_working_set.is_some()) {
        Some(c) => Some(cgroup_memory(c, None)),
        None => sum_memory(&pod.containers),
    };
    pod.process_stats = cgroup.and_then(|c| c.pids).map(|n| ProcessStats {
        process_count: Some(n),
    });
    if let Some(host) = host {
        pod.network = host
            .network
            .as_ref()
            .map(|ifaces| network_stats(host.network_at_ns, ifaces, Some(POD_DEFAULT_INTERFACE)));
        pod.volume_stats = host
            .volumes
            .iter()
            .map(|v| VolumeStats {
                fs: FsStats {
                    used_bytes: Some(v.usage.bytes),
                    inodes_used: Some(v.usage.inodes),
                    ..fs_figures(v.fs.as_ref(), v.at_ns)
                },
                name: v.name.clone(),
                pvc_ref: None,
            })
            .chain(host.csi_volumes.iter().map(csi_volume_stats))
            .collect();
    }
    pod.ephemeral_storage = ephemeral_storage(&pod.containers, host, &reading.node);
    pod
}

/// A CSI volume as its driver's `NodeGetVolumeStats` gave it, named as upstream: the pod's
/// volume name, and the claim for a `persistentVolumeClaim`.
fn csi_volume_stats(m: &crate::kubelet::volume::csi::stats::Measured) -> VolumeStats {
    let f = &m.figures;
    VolumeStats {
        fs: FsStats {
            time: time_ns(m.at_ns),
            available_bytes: f.available_bytes,
            capacity_bytes: f.capacity_bytes,
            used_bytes: f.used_bytes,
            inodes_free: f.inodes_free,
            inodes: f.inodes,
            inodes_used: f.inodes_used,
        },
        name: m.volume.clone(),
        pvc_ref: m.claim.as_ref().map(|c| types::PvcReference {
            name: c.clone(),
            namespace: m.namespace.clone(),
        }),
    }
}

/// The node's figures: CPU, memory, network, filesystems, process limits, and the `pods`
/// system container (the `kubepods` cgroup).
fn node_stats(
    node_name: &str,
    reading: &Reading,
    rates: &mut Rates,
    seen: &mut HashSet<String>,
) -> NodeStats {
    let node = &reading.node;
    let pods_cgroup = pods_system_container(node, rates, seen);
    NodeStats {
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
        network: node.network.as_ref().map(|ifaces| {
            // eth0 as upstream; on a node without one, the default route's interface.
            let default = if ifaces.iter().any(|i| i.name == POD_DEFAULT_INTERFACE) {
                Some(POD_DEFAULT_INTERFACE)
            } else {
                node.default_interface.as_deref()
            };
            network_stats(node.at_ns, ifaces, default)
        }),
        fs: node.fs.as_ref().map(|_| fs_stats_of(node)),
        runtime: reading.image_fs.as_ref().map(|image| RuntimeStats {
            image_fs: Some(runtime_fs_stats(image)),
            container_fs: Some(runtime_fs_stats(
                reading.container_fs.as_ref().unwrap_or(image),
            )),
        }),
        rlimit: (node.max_pid.is_some() || node.processes.is_some()).then(|| RlimitStats {
            time: time_ns(node.at_ns),
            maxpid: node.max_pid,
            curproc: node.processes,
        }),
        system_containers: pods_cgroup.into_iter().collect(),
    }
}

/// The `pods` system container: the `kubepods` cgroup, every pod's parent, whose memory counts
/// against the node's.
fn pods_system_container(
    node: &NodeSample,
    rates: &mut Rates,
    seen: &mut HashSet<String>,
) -> Option<ContainerStats> {
    node.pods_cgroup.as_ref().map(|c| {
        let key = "system/pods".to_string();
        let total = c.cpu_core_ns;
        if total.is_some() {
            seen.insert(key.clone());
        }
        ContainerStats {
            name: "pods".to_string(),
            start_time: None,
            cpu: total.map(|t| CpuStats {
                time: time_ns(c.at_ns),
                usage_nano_cores: rates.rate(&key, c.at_ns, t),
                usage_core_nano_seconds: Some(t),
            }),
            memory: c
                .memory_working_set
                .map(|_| cgroup_memory(c, node.memory_total)),
            rootfs: None,
            logs: None,
        }
    })
}

/// A namespace's interfaces, with `default` (when present among them) also at the top level.
fn network_stats(at_ns: i64, ifaces: &[InterfaceSample], default: Option<&str>) -> NetworkStats {
    let stats = |i: &InterfaceSample| InterfaceStats {
        name: i.name.clone(),
        rx_bytes: Some(i.rx_bytes),
        rx_errors: Some(i.rx_errors),
        tx_bytes: Some(i.tx_bytes),
        tx_errors: Some(i.tx_errors),
    };
    NetworkStats {
        time: time_ns(at_ns),
        default: default
            .and_then(|d| ifaces.iter().find(|i| i.name == d))
            .map(stats)
            .unwrap_or_default(),
        interfaces: ifaces.iter().map(stats).collect(),
    }
}

/// A cgroup's memory; `available` is the limit the working set counts against, when known.
fn cgroup_memory(c: &CgroupSample, limit: Option<u64>) -> MemoryStats {
    MemoryStats {
        available_bytes: limit
            .zip(c.memory_working_set)
            .map(|(l, ws)| l.saturating_sub(ws)),
        usage_bytes: c.memory_usage,
        working_set_bytes: c.memory_working_set,
        rss_bytes: c.rss,
        page_faults: c.page_faults,
        major_page_faults: c.major_page_faults,
        ..MemoryStats::at(time_ns(c.at_ns))
    }
}

fn runtime_fs_stats(r: &RuntimeFsSample) -> FsStats {
    FsStats {
        used_bytes: r.used,
        inodes_used: r.inodes_used,
        ..fs_figures(r.fs.as_ref(), r.at_ns)
    }
}

/// A filesystem's size, free space and inodes (not what one user takes of it), as of `at_ns`.
fn fs_figures(fs: Option<&FsSample>, at_ns: i64) -> FsStats {
    match fs {
        Some(fs) => FsStats {
            time: time_ns(at_ns),
            available_bytes: Some(fs.available),
            capacity_bytes: Some(fs.capacity),
            used_bytes: None,
            inodes_free: Some(fs.inodes_free),
            inodes: Some(fs.inodes),
            inodes_used: None,
        },
        None => FsStats::at(time_ns(at_ns)),
    }
}

/// The node filesystem's figures, with what is used of it as a whole.
fn fs_stats_of(node: &NodeSample) -> FsStats {
    match &node.fs {
        Some(fs) => FsStats {
            used_bytes: Some(fs.used),
            inodes_used: Some(fs.inodes.saturating_sub(fs.inodes_free)),
            ..fs_figures(Some(fs), node.at_ns)
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

/// The pod's ephemeral storage as upstream adds it up: the containers' writable layers and
/// logs, the volumes on the node's disk (emptyDir not in memory, configMap) and the pod's
/// `/etc/hosts`, against the node filesystem's size. `None` when nothing was measured.
fn ephemeral_storage(
    containers: &[ContainerStats],
    host: Option<&PodHostSample>,
    node: &NodeSample,
) -> Option<FsStats> {
    let mut parts: Vec<(Option<u64>, Option<u64>)> = Vec::new();
    for c in containers {
        if let Some(r) = &c.rootfs {
            parts.push((r.used_bytes, r.inodes_used));
        }
        if let Some(l) = &c.logs {
            parts.push((l.used_bytes, l.inodes_used));
        }
    }
    if let Some(h) = host {
        for v in h.volumes.iter().filter(|v| v.ephemeral) {
            parts.push((Some(v.usage.bytes), Some(v.usage.inodes)));
        }
        if let Some(e) = &h.etc_hosts {
            parts.push((Some(e.bytes), Some(e.inodes)));
        }
    }
    if parts.is_empty() {
        return None;
    }
    Some(FsStats {
        used_bytes: Some(parts.iter().filter_map(|p| p.0).sum()),
        inodes_used: Some(parts.iter().filter_map(|p| p.1).sum()),
        ..fs_figures(node.fs.as_ref(), node.at_ns)
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
pub(crate) fn render_resource_metrics(summary: &Summary, error: bool) -> String {
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

/// Reads the runtime and the host and keeps what later scrapes need: the previous samples
/// for the rates, and each sandbox's facts.
pub struct StatsProvider {
    runtime: Arc<dyn StatsRuntime>,
    host: Arc<dyn HostReader>,
    sandboxes: Option<Arc<dyn SandboxInspector>>,
    node_name: String,
    rates: Mutex<Rates>,
    /// Sandbox ID → its facts (asked once per sandbox).
    facts: Mutex<HashMap<String, SandboxFacts>>,
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
            sandboxes: None,
            node_name,
            rates: Mutex::new(Rates::default()),
            facts: Mutex::new(HashMap::new()),
        }
    }

    /// Pods' network figures need each sandbox's process: `inspector` finds it.
    pub fn with_sandboxes(mut self, inspector: Arc<dyn SandboxInspector>) -> Self {
        self.sandboxes = Some(inspector);
        self
    }

    /// The summary now: everything, or (`cpu_and_memory_only`, what metrics-server asks for)
    /// CPU and memory alone, which skips the network, volumes, logs and filesystems.
    pub async fn summary(&self, cpu_and_memory_only: bool) -> Result<Summary, StatsError> {
        let began = clock::instant();
        let selector = managed_selector(&self.node_name);
        let listing = async {
            futures::try_join!(
                self.runtime.container_stats(selector.clone()),
                self.runtime.running_containers(selector.clone()),
                async {
                    // Without sandboxes a summary can still be made: pods just lack a network.
                    match self.runtime.ready_sandboxes(selector.clone()).await {
                        Ok(s) => Ok(s),
                        Err(e) => {
                            tracing::debug!(error = %e, "stats: sandboxes not listed");
                            Ok(Vec::new())
                        }
                    }
                },
            )
        };
        // The image filesystem is asked for at the same time as the containers.
        let runtime_fs = async {
            if cpu_and_memory_only {
                (None, None)
            } else {
                self.runtime_fs().await
            }
        };
        let (listed, (image_fs, container_fs)) = futures::join!(listing, runtime_fs);
        let (stats, running, sandboxes) = listed?;
        let listed_at = began.elapsed();
        let targets = if cpu_and_memory_only {
            pod_targets(&running, &sandboxes, &HashMap::new())
        } else {
            let facts = self.sandbox_facts(&sandboxes).await;
            pod_targets(&running, &sandboxes, &facts)
        };
        let facts_at = began.elapsed();
        let host = self.host.clone();
        let (node, pods) = tokio::task::spawn_blocking(move || {
            let node = host.node();
            let pods: HashMap<String, PodHostSample> = targets
                .iter()
                .map(|t| (t.uid.clone(), host.pod(t, cpu_and_memory_only)))
                .collect();
            (node, pods)
        })
        .await
        .unwrap_or_default();
        tracing::debug!(
            pods = pods.len(),
            cpu_and_memory_only,
            runtime_ms = listed_at.as_millis() as u64,
            sandboxes_ms = (facts_at - listed_at).as_millis() as u64,
            host_ms = (began.elapsed() - facts_at).as_millis() as u64,
            "stats: summary read"
        );
        let live: HashSet<String> = pods.keys().cloned().collect();
        let reading = Reading {
            node,
            stats,
            running,
            pods,
            image_fs,
            container_fs,
        };
        let mut summary = {
            let mut rates = self.rates.lock().unwrap_or_else(|e| e.into_inner());
            build_summary(&self.node_name, &reading, &mut rates)
        };
        if cpu_and_memory_only {
            keep_cpu_and_memory(&mut summary);
        }
        if !cpu_and_memory_only {
            // Stale volume figures are measured again after this answer, not before it.
            let host = self.host.clone();
            tokio::task::spawn_blocking(move || host.housekeeping(&live));
        }
        Ok(summary)
    }

    /// The node's own figures (memory, CPU, its filesystems) and no pod's: what the eviction
    /// manager's signals need every round, without the runtime's three lists or a read of
    /// each pod's cgroup.
    pub async fn node_summary(&self) -> NodeStats {
        let host = self.host.clone();
        let node = tokio::task::spawn_blocking(move || host.node())
            .await
            .unwrap_or_default();
        let reading = Reading {
            node,
            ..Default::default()
        };
        let mut rates = self.rates.lock().unwrap_or_else(|e| e.into_inner());
        build_summary(&self.node_name, &reading, &mut rates).node
    }

    /// Each ready sandbox's facts, asking the runtime only about sandboxes not seen before;
    /// facts of sandboxes that are gone are forgotten.
    async fn sandbox_facts(
        &self,
        sandboxes: &[proto::PodSandbox],
    ) -> HashMap<String, SandboxFacts> {
        let Some(inspector) = &self.sandboxes else {
            return HashMap::new();
        };
        let known: HashMap<String, SandboxFacts> = {
            let mut facts = self.facts.lock().unwrap_or_else(|e| e.into_inner());
            let live: HashSet<&str> = sandboxes.iter().map(|s| s.id.as_str()).collect();
            facts.retain(|id, _| live.contains(id.as_str()));
            facts.clone()
        };
        let missing: Vec<String> = sandboxes
            .iter()
            .filter(|s| !known.contains_key(&s.id))
            .map(|s| s.id.clone())
            .collect();
        let found = futures::future::join_all(missing.into_iter().map(|id| async move {
            let facts = inspector.facts(id.clone()).await;
            (id, facts)
        }))
        .await;
        let mut facts = self.facts.lock().unwrap_or_else(|e| e.into_inner());
        for (id, f) in found {
            // A sandbox that did not answer is asked again next time.
            if let Some(f) = f {
                facts.insert(id, f);
            }
        }
        facts.clone()
    }

    /// The runtime's image filesystem and, when it names one, its container filesystem.
    async fn runtime_fs(&self) -> (Option<RuntimeFsSample>, Option<RuntimeFsSample>) {
        let info = match self.runtime.image_fs_info().await {
            Ok(info) => info,
            Err(e) => {
                tracing::debug!(error = %e, "stats: no image filesystem from the runtime");
                return (None, None);
            }
        };
        let host = self.host.clone();
        tokio::task::spawn_blocking(move || {
            let sample = |u: &proto::FilesystemUsage| RuntimeFsSample {
                at_ns: if u.timestamp > 0 {
                    u.timestamp
                } else {
                    now_ns()
                },
                used: u.used_bytes.as_ref().map(|v| v.value),
                inodes_used: u.inodes_used.as_ref().map(|v| v.value),
                fs: u
                    .fs_id
                    .as_ref()
                    .filter(|f| !f.mountpoint.is_empty())
                    .and_then(|f| host.fs(Path::new(&f.mountpoint))),
            };
            (
                info.image_filesystems.first().map(sample),
                info.container_filesystems.first().map(sample),
            )
        })
        .await
        .unwrap_or_default()
    }

    /// `/metrics/resource`: on a runtime error, the node alone and `scrape_error 1`.
    pub async fn resource_metrics(&self) -> String {
        match self.summary(true).await {
            Ok(summary) => render_resource_metrics(&summary, false),
            Err(e) => {
                tracing::warn!(error = %e, "resource metrics: container stats unavailable");
                let host = self.host.clone();
                let node = tokio::task::spawn_blocking(move || host.node())
                    .await
                    .unwrap_or_default();
                let mut rates = self.rates.lock().unwrap_or_else(|e| e.into_inner());
                let reading = Reading {
                    node,
                    ..Default::default()
                };
                let summary = build_summary(&self.node_name, &reading, &mut rates);
                render_resource_metrics(&summary, true)
            }
        }
    }
}

/// Leaves CPU and memory alone in the summary (upstream's `only_cpu_and_memory` answer):
/// no filesystems, network, volumes, process counts or limits.
pub(crate) fn keep_cpu_and_memory(summary: &mut Summary) {
    let node = &mut summary.node;
    node.network = None;
    node.fs = None;
    node.runtime = None;
    node.rlimit = None;
    for pod in &mut summary.pods {
        pod.network = None;
        pod.volume_stats.clear();
        pod.ephemeral_storage = None;
        pod.process_stats = None;
        for c in &mut pod.containers {
            c.rootfs = None;
            c.logs = None;
        }
    }
}

/// The pods to ask the host about: one per pod UID among the running containers, with those
/// containers' names, and the network namespace of its ready sandbox unless that sandbox is on
/// the node's network (or its process is unknown). Pure.
pub(crate) fn pod_targets(
    running: &[proto::Container],
    sandboxes: &[proto::PodSandbox],
    facts: &HashMap<String, SandboxFacts>,
) -> Vec<PodTarget> {
    let mut by_uid: BTreeMap<String, PodTarget> = BTreeMap::new();
    for c in running {
        let label = |k: &str| c.labels.get(k).cloned().unwrap_or_default();
        let uid = label(cri_labels::POD_UID_LABEL);
        if uid.is_empty() {
            continue;
        }
        let target = by_uid.entry(uid.clone()).or_insert_with(|| PodTarget {
            uid,
            namespace: label(cri_labels::POD_NAMESPACE_LABEL),
            name: label(cri_labels::POD_NAME_LABEL),
            ..Default::default()
        });
        let name = c
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| label(cri_labels::CONTAINER_NAME_LABEL));
        if !target.containers.contains(&name) {
            target.containers.push(name);
        }
    }
    for s in sandboxes {
        let Some(uid) = s.labels.get(cri_labels::POD_UID_LABEL) else {
            continue;
        };
        let Some(target) = by_uid.get_mut(uid) else {
            continue;
        };
        if let Some(f) = facts.get(&s.id)
            && !f.host_network
            && f.pid.is_some()
        {
            target.netns_pid = f.pid;
        }
    }
    by_uid.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clients::cri::proto::{
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
                    (cri_labels::POD_UID_LABEL.to_string(), uid.to_string()),
                    (cri_labels::POD_NAME_LABEL.to_string(), pod.to_string()),
                    (
                        cri_labels::POD_NAMESPACE_LABEL.to_string(),
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

    fn reading(
        node: &NodeSample,
        stats: &[proto::ContainerStats],
        running: &[proto::Container],
    ) -> Reading {
        Reading {
            node: node.clone(),
            stats: stats.to_vec(),
            running: running.to_vec(),
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
        let sum = build_summary("n1", &reading(&node, &stats, &run), &mut rates);
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
        let sum2 = build_summary("n1", &reading(&node2, &stats2, &run), &mut rates);
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
            &reading(&node, &stats, &[running("a1", s)]),
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
            &reading(&node, &stats, &[running("a1", s)]),
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

    #[test]
    fn sandbox_facts_from_verbose_status() {
        use crate::clients::cri::proto::{
            LinuxPodSandboxStatus, Namespace, NamespaceMode, NamespaceOption, PodSandboxStatus,
            PodSandboxStatusResponse,
        };
        let resp = |info: Option<&str>, network: NamespaceMode| PodSandboxStatusResponse {
            status: Some(PodSandboxStatus {
                linux: Some(LinuxPodSandboxStatus {
                    namespaces: Some(Namespace {
                        options: Some(NamespaceOption {
                            network: network as i32,
                            ..Default::default()
                        }),
                    }),
                }),
                ..Default::default()
            }),
            info: info
                .map(|i| HashMap::from([("info".to_string(), i.to_string())]))
                .unwrap_or_default(),
            ..Default::default()
        };
        let cases = [
            (
                resp(
                    Some(r#"{"pid": 4242, "image": "pause"}"#),
                    NamespaceMode::Pod,
                ),
                SandboxFacts {
                    pid: Some(4242),
                    host_network: false,
                },
            ),
            (
                resp(Some(r#"{"pid": 7}"#), NamespaceMode::Node),
                SandboxFacts {
                    pid: Some(7),
                    host_network: true,
                },
            ),
            (
                resp(Some(r#"{"pid": 0}"#), NamespaceMode::Pod),
                SandboxFacts::default(),
            ),
            (
                resp(Some("not json"), NamespaceMode::Pod),
                SandboxFacts::default(),
            ),
            (resp(None, NamespaceMode::Pod), SandboxFacts::default()),
        ];
        for (i, (r, want)) in cases.iter().enumerate() {
            assert_eq!(sandbox_facts(r), *want, "case {i}");
        }
    }

    fn labelled(uid: &str, name: &str) -> HashMap<String, String> {
        HashMap::from([
            (cri_labels::POD_UID_LABEL.to_string(), uid.to_string()),
            (cri_labels::POD_NAME_LABEL.to_string(), name.to_string()),
            (
                cri_labels::POD_NAMESPACE_LABEL.to_string(),
                "default".to_string(),
            ),
        ])
    }

    #[test]
    fn pod_targets_take_the_sandbox_namespace_unless_it_is_the_nodes() {
        let container = |id: &str, uid: &str, pod: &str, name: &str| proto::Container {
            id: id.into(),
            labels: labelled(uid, pod),
            metadata: Some(ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            ..Default::default()
        };
        let running = vec![
            container("c1", "u1", "web", "app"),
            container("c2", "u1", "web", "side"),
            container("c3", "u2", "hostnet", "app"),
            container("c4", "u3", "unknown", "app"),
        ];
        let sandbox = |id: &str, uid: &str, pod: &str| proto::PodSandbox {
            id: id.into(),
            labels: labelled(uid, pod),
            ..Default::default()
        };
        let sandboxes = vec![
            sandbox("s1", "u1", "web"),
            sandbox("s2", "u2", "hostnet"),
            sandbox("s3", "u3", "unknown"),
        ];
        let facts = HashMap::from([
            (
                "s1".to_string(),
                SandboxFacts {
                    pid: Some(10),
                    host_network: false,
                },
            ),
            (
                "s2".to_string(),
                SandboxFacts {
                    pid: Some(20),
                    host_network: true,
                },
            ),
        ]);
        let got: Vec<(String, Vec<String>, Option<u32>)> =
            pod_targets(&running, &sandboxes, &facts)
                .into_iter()
                .map(|t| (t.name, t.containers, t.netns_pid))
                .collect();
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            got,
            vec![
                ("web".to_string(), s(&["app", "side"]), Some(10)),
                ("hostnet".to_string(), s(&["app"]), None),
                ("unknown".to_string(), s(&["app"]), None),
            ]
        );
    }

    #[test]
    fn host_figures_compose_the_pod_and_the_node() {
        let s = 1_000_000_000i64;
        let disk = FsSample {
            capacity: 1000,
            available: 600,
            used: 400,
            inodes: 100,
            inodes_free: 60,
        };
        let node = NodeSample {
            at_ns: 100 * s,
            memory_total: Some(10_000),
            fs: Some(disk.clone()),
            logs_fs: Some(disk.clone()),
            network: Some(vec![
                InterfaceSample {
                    name: "ens3".into(),
                    rx_bytes: 5,
                    tx_bytes: 6,
                    ..Default::default()
                },
                InterfaceSample {
                    name: "cni0".into(),
                    rx_bytes: 1,
                    ..Default::default()
                },
            ]),
            default_interface: Some("ens3".into()),
            max_pid: Some(4096),
            processes: Some(300),
            pods_cgroup: Some(CgroupSample {
                at_ns: 100 * s,
                cpu_core_ns: Some(9),
                memory_working_set: Some(4000),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut st = stat("a1", "web", "u1", "app", 100 * s, 30, 100);
        st.writable_layer = Some(proto::FilesystemUsage {
            timestamp: 100 * s,
            used_bytes: Some(UInt64Value { value: 8 }),
            inodes_used: Some(UInt64Value { value: 2 }),
            ..Default::default()
        });
        let volume = |name: &str, bytes: u64, ephemeral: bool| VolumeSample {
            name: name.into(),
            at_ns: 90 * s,
            usage: DiskUsage { bytes, inodes: 3 },
            fs: Some(disk.clone()),
            ephemeral,
        };
        let host = PodHostSample {
            cgroup: Some(CgroupSample {
                at_ns: 100 * s,
                cpu_core_ns: Some(50),
                memory_usage: Some(700),
                memory_working_set: Some(500),
                pids: Some(3),
                ..Default::default()
            }),
            network_at_ns: 100 * s,
            network: Some(vec![InterfaceSample {
                name: "eth0".into(),
                rx_bytes: 1000,
                rx_errors: 1,
                tx_bytes: 2000,
                tx_errors: 2,
            }]),
            volumes: vec![volume("cache", 4096, true), volume("token", 100, false)],
            csi_volumes: vec![crate::kubelet::volume::csi::stats::Measured {
                pod_uid: "u1".into(),
                volume: "data".into(),
                namespace: "ns".into(),
                claim: Some("claim".into()),
                figures: crate::kubelet::volume::csi::stats::Figures {
                    capacity_bytes: Some(5000),
                    used_bytes: Some(0),
                    ..Default::default()
                },
                at_ns: 90 * s,
            }],
            logs: HashMap::from([(
                "app".to_string(),
                DiskUsage {
                    bytes: 16,
                    inodes: 2,
                },
            )]),
            etc_hosts: Some(DiskUsage {
                bytes: 4,
                inodes: 1,
            }),
        };
        let image = RuntimeFsSample {
            at_ns: 100 * s,
            used: Some(77),
            inodes_used: Some(7),
            fs: Some(disk.clone()),
        };
        let reading = Reading {
            node,
            stats: vec![st],
            running: vec![running("a1", s)],
            pods: HashMap::from([("u1".to_string(), host)]),
            image_fs: Some(image),
            container_fs: None,
        };
        let sum = build_summary("n1", &reading, &mut Rates::default());
        let v = serde_json::to_value(&sum).unwrap();
        let p = &v["pods"][0];
        // The pod's cgroup, not the container's sum.
        assert_eq!(p["cpu"]["usageCoreNanoSeconds"], 50);
        assert_eq!(p["memory"]["workingSetBytes"], 500);
        assert_eq!(p["process_stats"]["process_count"], 3);
        // eth0 at the top level and in the list.
        assert_eq!(p["network"]["name"], "eth0");
        assert_eq!(p["network"]["rxBytes"], 1000);
        assert_eq!(p["network"]["txErrors"], 2);
        assert_eq!(p["network"]["interfaces"][0]["txBytes"], 2000);
        // Volumes with their filesystem.
        assert_eq!(p["volume"][0]["name"], "cache");
        assert_eq!(p["volume"][0]["usedBytes"], 4096);
        assert_eq!(p["volume"][0]["capacityBytes"], 1000);
        assert_eq!(p["volume"][1]["name"], "token");
        // A CSI volume as its driver told it, with its claim; not in the ephemeral storage.
        assert_eq!(p["volume"][2]["name"], "data");
        assert_eq!(p["volume"][2]["capacityBytes"], 5000);
        assert_eq!(
            p["volume"][2]["pvcRef"],
            serde_json::json!({"name": "claim", "namespace": "ns"})
        );
        assert_eq!(p["volume"][2].get("inodes"), None);
        // Logs of the container.
        assert_eq!(p["containers"][0]["logs"]["usedBytes"], 16);
        assert_eq!(p["containers"][0]["rootfs"]["usedBytes"], 8);
        // rootfs 8 + logs 16 + the ephemeral volume 4096 + etc-hosts 4; not the token.
        assert_eq!(p["ephemeral-storage"]["usedBytes"], 8 + 16 + 4096 + 4);
        assert_eq!(p["ephemeral-storage"]["inodesUsed"], 2 + 2 + 3 + 1);
        assert_eq!(p["ephemeral-storage"]["capacityBytes"], 1000);
        // The node: the default route's interface when there is no eth0.
        let n = &v["node"];
        assert_eq!(n["network"]["name"], "ens3");
        assert_eq!(n["network"]["interfaces"].as_array().unwrap().len(), 2);
        assert_eq!(n["runtime"]["imageFs"]["usedBytes"], 77);
        assert_eq!(n["runtime"]["containerFs"]["usedBytes"], 77);
        assert_eq!(n["runtime"]["imageFs"]["availableBytes"], 600);
        assert_eq!(n["rlimit"]["maxpid"], 4096);
        assert_eq!(n["rlimit"]["curproc"], 300);
        assert_eq!(n["systemContainers"][0]["name"], "pods");
        assert_eq!(n["systemContainers"][0]["memory"]["workingSetBytes"], 4000);
        assert_eq!(n["systemContainers"][0]["memory"]["availableBytes"], 6000);

        // Only CPU and memory: the rest goes.
        let mut small = sum.clone();
        keep_cpu_and_memory(&mut small);
        let v = serde_json::to_value(&small).unwrap();
        for key in ["network", "volume", "ephemeral-storage", "process_stats"] {
            assert!(v["pods"][0].get(key).is_none(), "{key}");
        }
        assert!(v["pods"][0]["containers"][0].get("rootfs").is_none());
        for key in ["network", "fs", "runtime", "rlimit"] {
            assert!(v["node"].get(key).is_none(), "{key}");
        }
        assert_eq!(v["pods"][0]["cpu"]["usageCoreNanoSeconds"], 50);
    }
}
