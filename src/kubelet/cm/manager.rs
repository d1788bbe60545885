//! The cgroup manager: creates and updates `kubepods`, the QoS tiers and the pods' cgroups
//! through a [`CgroupFs`], and keeps the set of active pods the burstable tier's shares are
//! computed from.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;

use super::fs::CgroupFs;
use super::pod_config::{CfsSettings, ResourceConfig, pod_requests, resource_config_for_pod};
use super::{FileWrite, qos, qos_dir, v1, v2};
use crate::base::podspec::{QosClass, qos_class};

/// cgroup v1 (one hierarchy per controller) or v2 (the unified hierarchy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CgroupVersion {
    V1,
    V2,
}

/// v2 when the mount root is the unified hierarchy (it has `cgroup.controllers`), as
/// upstream's `IsCgroup2UnifiedMode`; a hybrid machine (v1 controllers, v2 only for systemd
/// under `unified/`) is v1.
pub fn detect_version(fs: &dyn CgroupFs) -> CgroupVersion {
    if fs.exists(Path::new(""), "cgroup.controllers") {
        CgroupVersion::V2
    } else {
        CgroupVersion::V1
    }
}

/// Why a cgroup could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error(
        "cgroupRoot {root:?} does not exist ({missing}); create it or choose another --cgroup-root"
    )]
    RootMissing { root: String, missing: String },
    #[error("no cgroup controllers found under the cgroup mount")]
    NoControllers,
    #[error("creating cgroup {path}: {source}")]
    Create {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("writing {value:?} to {path}: {source}")]
    Write {
        path: String,
        value: String,
        #[source]
        source: io::Error,
    },
}

/// The node settings the manager applies.
#[derive(Debug, Clone, PartialEq)]
pub struct ManagerSettings {
    /// `cgroupRoot` (`/` by default).
    pub cgroup_root: String,
    pub cfs: CfsSettings,
    /// `podPidsLimit`: over zero limits every pod's cgroup to that many tasks.
    pub pod_pids_limit: i64,
    /// `qosReserved` memory percentage (upstream's alpha gate; `None` = off, the default).
    pub memory_reserve_percent: Option<i64>,
    /// Allocatable memory in bytes, for `qosReserved`.
    pub allocatable_memory: i64,
}

/// Creates and updates the cgroup tree for the cgroupfs driver.
#[derive(Debug)]
pub struct CgroupManager {
    fs: Arc<dyn CgroupFs>,
    version: CgroupVersion,
    /// v1: the hierarchies present (of [`v1::CONTROLLERS`]); v2: the controllers the root
    /// offers (of [`v2::CONTROLLERS`]).
    controllers: Vec<String>,
    page_sizes: Vec<u64>,
    settings: ManagerSettings,
    /// Pods whose cgroup exists and that may still run, by UID.
    active: Mutex<BTreeMap<String, qos::PodFacts>>,
}

/// What [`CgroupManager::ensure_pod`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ensured {
    Created,
    Existed,
    /// The UID cannot be a path component: no cgroup is made (the runtime's default applies).
    Skipped,
}

/// Further tries at removing a pod cgroup whose processes were just killed, and the pause
/// between them (blocking: the removal runs on a blocking thread).
const REMOVE_ATTEMPTS: u32 = 5;
const REMOVE_PAUSE: std::time::Duration = std::time::Duration::from_millis(20);

impl CgroupManager {
    /// A manager on `fs`, with the controllers found there. `page_sizes` are the machine's
    /// huge page sizes in bytes.
    pub fn new(
        fs: Arc<dyn CgroupFs>,
        page_sizes: Vec<u64>,
        settings: ManagerSettings,
    ) -> Result<Self, CgroupError> {
        let version = detect_version(fs.as_ref());
        let controllers: Vec<String> = match version {
            // A hierarchy counts only where the kernel mounted one (its root has
            // `cgroup.procs`): a plain directory of that name in the tmpfs above is not a
            // cgroup, and writing limits into it would only create files.
            CgroupVersion::V1 => v1::CONTROLLERS
                .iter()
                .filter(|c| fs.exists(Path::new(c), "cgroup.procs"))
                .map(|c| c.to_string())
                .collect(),
            CgroupVersion::V2 => {
                let offered = fs
                    .read(Path::new(""), "cgroup.controllers")
                    .unwrap_or_default();
                let offered: Vec<&str> = offered.split_whitespace().collect();
                v2::CONTROLLERS
                    .iter()
                    .filter(|c| offered.contains(c))
                    .map(|c| c.to_string())
                    .collect()
            }
        };
        if controllers.is_empty() {
            return Err(CgroupError::NoControllers);
        }
        Ok(CgroupManager {
            fs,
            version,
            controllers,
            page_sizes,
            settings,
            active: Mutex::new(BTreeMap::new()),
        })
    }

    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    fn has(&self, controller: &str) -> bool {
        self.controllers.iter().any(|c| c == controller)
    }

    /// `<root>/kubepods` as a cgroup path (`/kubepods`, `/custom/kubepods`).
    pub fn kubepods(&self) -> String {
        let root = self.settings.cgroup_root.trim_end_matches('/');
        format!("{root}/kubepods")
    }

    fn tier(&self, qos: QosClass) -> String {
        match qos_dir(qos) {
            Some(dir) => format!("{}/{dir}", self.kubepods()),
            None => self.kubepods(),
        }
    }

    /// The pod's cgroup path (`/kubepods/burstable/pod<uid>`).
    pub fn pod_cgroup(&self, qos: QosClass, uid: &str) -> String {
        format!("{}/pod{uid}", self.tier(qos))
    }

    /// The directories (relative to the mount) of a cgroup: one per hierarchy on v1.
    fn dirs(&self, cgroup: &str) -> Vec<PathBuf> {
        let rel = cgroup.trim_start_matches('/');
        match self.version {
            CgroupVersion::V1 => self
                .controllers
                .iter()
                .map(|c| Path::new(c).join(rel))
                .collect(),
            CgroupVersion::V2 => vec![PathBuf::from(rel)],
        }
    }

    fn dir_of(&self, controller: &str, cgroup: &str) -> PathBuf {
        let rel = cgroup.trim_start_matches('/');
        match self.version {
            CgroupVersion::V1 => Path::new(controller).join(rel),
            CgroupVersion::V2 => PathBuf::from(rel),
        }
    }

    /// The processes (and threads) in a pod's cgroup (`pids.current`), whatever its QoS tier;
    /// `None` when no tier has it or the pids controller is absent. For the eviction manager's
    /// ranking under PID pressure.
    pub fn pod_process_count(&self, uid: &str) -> Option<u64> {
        if crate::base::safe_names::component_problem(uid).is_some() {
            return None;
        }
        [
            QosClass::Guaranteed,
            QosClass::Burstable,
            QosClass::BestEffort,
        ]
        .into_iter()
        .find_map(|qos| {
            let dir = self.dir_of("pids", &self.pod_cgroup(qos, uid));
            self.fs.read(&dir, "pids.current").ok()?.trim().parse().ok()
        })
    }

    /// What the pod's cgroup uses of memory now (`memory.usage_in_bytes` on v1,
    /// `memory.current` on v2), for the check before a pod-level memory limit goes down;
    /// `None` when it cannot be read.
    pub(crate) fn pod_memory_usage(&self, pod: &Pod) -> Option<u64> {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        if crate::base::safe_names::component_problem(uid).is_some() {
            return None;
        }
        let dir = self.dir_of("memory", &self.pod_cgroup(qos_class(pod), uid));
        let file = match self.version {
            CgroupVersion::V1 => "memory.usage_in_bytes",
            CgroupVersion::V2 => "memory.current",
        };
        self.fs.read(&dir, file).ok()?.trim().parse().ok()
    }

    /// Whether the cgroup exists everywhere it should (every hierarchy on v1).
    pub fn exists(&self, cgroup: &str) -> bool {
        self.dirs(cgroup).iter().all(|d| self.fs.is_dir(d))
    }

    /// The files and contents `config` means on this machine.
    pub fn files_for(&self, config: &ResourceConfig) -> Vec<FileWrite> {
        match self.version {
            CgroupVersion::V1 => v1::files(config, &self.page_sizes, self.has("hugetlb")),
            CgroupVersion::V2 => v2::files(config, &self.page_sizes, self.has("hugetlb")),
        }
    }

    /// Writes `config` into an existing cgroup. A write the kernel refuses with EINVAL is
    /// tried again after the others (a new CFS period can be refused until the new quota is
    /// in, and the other way round), as runc does.
    pub fn apply(&self, cgroup: &str, config: &ResourceConfig) -> Result<(), CgroupError> {
        let mut again = Vec::new();
        for write in self.files_for(config) {
            if self.version == CgroupVersion::V1 && !self.has(write.controller) {
                continue;
            }
            let dir = self.dir_of(write.controller, cgroup);
            if write.optional && !self.fs.exists(&dir, &write.file) {
                continue;
            }
            match self.fs.write(&dir, &write.file, &write.value) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => again.push((dir, write)),
                Err(source) => return Err(write_error(&dir, &write, source)),
            }
        }
        for (dir, write) in again {
            self.fs
                .write(&dir, &write.file, &write.value)
                .map_err(|source| write_error(&dir, &write, source))?;
        }
        Ok(())
    }

    /// Creates the cgroup (and missing parents) and writes `config` into it.
    pub fn create(&self, cgroup: &str, config: &ResourceConfig) -> Result<(), CgroupError> {
        self.make(cgroup)?;
        self.apply(cgroup, config)
    }

    /// Writes `config`, logging instead of failing: upstream's kubelet creates a cgroup and
    /// only logs when the kernel refuses a setting (a limit below what is already used, say),
    /// so the pod still starts and the node agent still runs.
    fn apply_or_warn(&self, cgroup: &str, config: &ResourceConfig) {
        if let Err(err) = self.apply(cgroup, config) {
            tracing::warn!(%cgroup, error = %err, "cannot apply the cgroup's settings");
        }
    }

    /// Creates the cgroup's directories (and missing parents) everywhere it lives.
    pub fn make(&self, cgroup: &str) -> Result<(), CgroupError> {
        let create_err = |source| CgroupError::Create {
            path: cgroup.to_string(),
            source,
        };
        match self.version {
            CgroupVersion::V1 => {
                for dir in self.dirs(cgroup) {
                    self.fs.create_dir_all(&dir).map_err(create_err)?;
                }
                if self.has("cpuset") {
                    self.init_cpuset(cgroup).map_err(create_err)?;
                }
            }
            CgroupVersion::V2 => {
                // Each ancestor hands the controllers down to its children, then the cgroup
                // itself is made.
                let enable = self
                    .controllers
                    .iter()
                    .map(|c| format!("+{c}"))
                    .collect::<Vec<_>>()
                    .join(" ");
                let mut dir = PathBuf::new();
                let parts: Vec<&str> = cgroup
                    .trim_start_matches('/')
                    .split('/')
                    .filter(|p| !p.is_empty())
                    .collect();
                for part in &parts {
                    self.fs
                        .write(&dir, "cgroup.subtree_control", &enable)
                        .map_err(create_err)?;
                    dir.push(part);
                    if !self.fs.is_dir(&dir) {
                        self.fs.create_dir_all(&dir).map_err(create_err)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// A new v1 cpuset cgroup has no CPUs or memory nodes, and nothing can join it until it
    /// has: each level without them gets its parent's, from the top down (as runc does).
    fn init_cpuset(&self, cgroup: &str) -> io::Result<()> {
        let mut parent = PathBuf::from("cpuset");
        for part in cgroup
            .trim_start_matches('/')
            .split('/')
            .filter(|p| !p.is_empty())
        {
            let dir = parent.join(part);
            for file in ["cpuset.cpus", "cpuset.mems"] {
                let own = self.fs.read(&dir, file).unwrap_or_default();
                if own.trim().is_empty() {
                    let inherited = self.fs.read(&parent, file).unwrap_or_default();
                    if !inherited.trim().is_empty() {
                        self.fs.write(&dir, file, inherited.trim())?;
                    }
                }
            }
            parent = dir;
        }
        Ok(())
    }

    /// Start-up: checks that the cgroup root exists, creates or updates `kubepods` with
    /// `kubepods_config` (see [`super::allocatable`]) and the QoS tiers, then computes the
    /// tiers' shares. Only a cgroup that cannot be made stops the start; a setting the kernel
    /// refuses is logged (upstream retries the kubepods limits in the background).
    pub fn start(&self, kubepods_config: &ResourceConfig) -> Result<(), CgroupError> {
        let root = self.settings.cgroup_root.clone();
        let missing: Vec<String> = self
            .dirs(&root)
            .into_iter()
            .filter(|d| !self.fs.is_dir(d))
            .map(|d| d.display().to_string())
            .collect();
        if !missing.is_empty() {
            return Err(CgroupError::RootMissing {
                root,
                missing: missing.join(", "),
            });
        }
        let kubepods = self.kubepods();
        self.make(&kubepods)?;
        self.apply_or_warn(&kubepods, kubepods_config);
        let startup = qos::startup(&self.page_sizes, self.version == CgroupVersion::V2);
        for (qos, config) in [
            (QosClass::Burstable, &startup.burstable),
            (QosClass::BestEffort, &startup.besteffort),
        ] {
            let tier = self.tier(qos);
            self.make(&tier)?;
            self.apply_or_warn(&tier, config);
        }
        if !startup.kubepods.unified.is_empty() {
            self.apply_or_warn(&kubepods, &startup.kubepods);
        }
        if let Err(err) = self.update_qos() {
            tracing::warn!(error = %err, "cannot update the QoS cgroups");
        }
        Ok(())
    }

    /// Recomputes the QoS tiers from the active pods and writes them.
    pub fn update_qos(&self) -> Result<(), CgroupError> {
        let pods: Vec<qos::PodFacts> = self.lock().values().copied().collect();
        let configs = qos::update(
            &pods,
            &self.page_sizes,
            self.settings.memory_reserve_percent,
            self.settings.allocatable_memory,
        );
        self.apply(&self.kubepods(), &configs.kubepods)?;
        self.apply(&self.tier(QosClass::Burstable), &configs.burstable)?;
        self.apply(&self.tier(QosClass::BestEffort), &configs.besteffort)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, qos::PodFacts>> {
        // The map stays consistent through a panic elsewhere: entries are whole values.
        self.active.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pod's settings: upstream's `ResourceConfigForPod` and the node's `podPidsLimit`.
    pub fn pod_config(&self, pod: &Pod) -> ResourceConfig {
        let mut config = resource_config_for_pod(pod, self.settings.cfs);
        if self.settings.pod_pids_limit > 0 {
            config.pids_limit = Some(self.settings.pod_pids_limit);
        }
        config
    }

    /// Makes sure the pod's cgroup exists (before its sandbox): counts the pod as active,
    /// and when its cgroup is missing updates the QoS tiers and creates it with the pod's
    /// settings. An existing cgroup is left as it is (upstream does not resize it either).
    pub fn ensure_pod(&self, pod: &Pod) -> Result<Ensured, CgroupError> {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        if crate::base::safe_names::component_problem(uid).is_some() {
            return Ok(Ensured::Skipped);
        }
        let qos = qos_class(pod);
        let reqs = pod_requests(pod);
        let clamp =
            |v: Option<&i128>| v.copied().unwrap_or(0).clamp(0, i128::from(i64::MAX)) as i64;
        let facts = qos::PodFacts {
            qos,
            cpu_request_milli: clamp(reqs.get("cpu")),
            memory_request: clamp(reqs.get("memory")),
        };
        let changed = self.lock().insert(uid.to_string(), facts) != Some(facts);
        let cgroup = self.pod_cgroup(qos, uid);
        if self.exists(&cgroup) {
            if changed {
                self.update_qos()?;
            }
            return Ok(Ensured::Existed);
        }
        // As upstream: the tiers first, so the new pod's share is there when it starts.
        if let Err(err) = self.update_qos() {
            tracing::warn!(pod_uid = %uid, error = %err, "cannot update the QoS cgroups");
        }
        self.make(&cgroup)?;
        self.apply_or_warn(&cgroup, &self.pod_config(pod));
        Ok(Ensured::Created)
    }

    /// The pod will not run again: it no longer counts for the QoS tiers.
    pub fn pod_stopped(&self, uid: &str) {
        let removed = self.lock().remove(uid);
        if removed.is_some_and(|f| f.qos == QosClass::Burstable)
            && let Err(err) = self.update_qos()
        {
            tracing::warn!(pod_uid = %uid, error = %err, "cannot update the QoS cgroups");
        }
    }

    /// Removes the pod's cgroup (wherever its QoS class put it) from every hierarchy, after
    /// killing anything still in it, as upstream's `Destroy`. What could not be removed is
    /// returned for the log.
    pub fn destroy_pod(&self, uid: &str) -> Vec<String> {
        self.pod_stopped(uid);
        if crate::base::safe_names::component_problem(uid).is_some() {
            return Vec::new();
        }
        let hierarchies = self.hierarchies();
        let mut problems = Vec::new();
        for qos in [
            QosClass::Guaranteed,
            QosClass::Burstable,
            QosClass::BestEffort,
        ] {
            let rel = self.pod_cgroup(qos, uid);
            let rel = rel.trim_start_matches('/');
            for h in &hierarchies {
                let dir = h.join(rel);
                if !self.fs.is_dir(&dir) {
                    continue;
                }
                // A killed process leaves its cgroup only once it has finished exiting, a
                // moment after the signal: the removal is tried a few times (as upstream's
                // Destroy retries its kill), killing again in between.
                let mut attempt = 0;
                loop {
                    self.kill_tasks(&dir);
                    match self.remove_tree(&dir) {
                        Ok(()) => break,
                        Err(_) if attempt < REMOVE_ATTEMPTS => {
                            attempt += 1;
                            std::thread::sleep(REMOVE_PAUSE);
                        }
                        Err(err) => {
                            problems.push(format!("{}: {err}", dir.display()));
                            break;
                        }
                    }
                }
            }
        }
        problems
    }

    /// Where pod cgroups can be (relative to the mount): on v1 every hierarchy, since runc
    /// makes the pod's cgroup in each (devices, freezer, …), not only in the ones Deckhand
    /// writes to; on v2 the one tree.
    fn hierarchies(&self) -> Vec<PathBuf> {
        let mut hierarchies: Vec<PathBuf> = match self.version {
            CgroupVersion::V1 => self
                .fs
                .subdirs(Path::new(""))
                .into_iter()
                .map(PathBuf::from)
                .collect(),
            CgroupVersion::V2 => vec![PathBuf::new()],
        };
        if self.version == CgroupVersion::V1 {
            for c in &self.controllers {
                let p = PathBuf::from(c);
                if !hierarchies.contains(&p) {
                    hierarchies.push(p);
                }
            }
        }
        hierarchies
    }

    /// The UIDs of every `pod<uid>` cgroup under the QoS tiers, in any hierarchy: what the
    /// orphan sweep compares with the pods the node knows.
    pub fn pod_cgroup_uids(&self) -> std::collections::BTreeSet<String> {
        let mut uids = std::collections::BTreeSet::new();
        for h in self.hierarchies() {
            for qos in [
                QosClass::Guaranteed,
                QosClass::Burstable,
                QosClass::BestEffort,
            ] {
                let tier = h.join(self.tier(qos).trim_start_matches('/'));
                for name in self.fs.subdirs(&tier) {
                    if let Some(uid) = name.strip_prefix("pod")
                        && !uid.is_empty()
                    {
                        uids.insert(uid.to_string());
                    }
                }
            }
        }
        uids
    }

    /// Sends SIGKILL to every process left in `dir` and below.
    fn kill_tasks(&self, dir: &Path) {
        let mut pids = Vec::new();
        self.collect_pids(dir, &mut pids);
        for pid in pids {
            tracing::info!(pid, cgroup = %dir.display(), "killing a process left in a removed pod's cgroup");
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }

    fn collect_pids(&self, dir: &Path, out: &mut Vec<i32>) {
        if let Ok(text) = self.fs.read(dir, "cgroup.procs") {
            out.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            );
        }
        for sub in self.fs.subdirs(dir) {
            self.collect_pids(&dir.join(sub), out);
        }
    }

    /// Removes a cgroup and the cgroups below it, deepest first (cgroup files go with rmdir).
    fn remove_tree(&self, dir: &Path) -> io::Result<()> {
        for sub in self.fs.subdirs(dir) {
            self.remove_tree(&dir.join(sub))?;
        }
        self.fs.remove_dir(dir)
    }
}

fn write_error(dir: &Path, write: &FileWrite, source: io::Error) -> CgroupError {
    CgroupError::Write {
        path: dir.join(&write.file).display().to_string(),
        value: write.value.clone(),
        source,
    }
}

#[cfg(test)]
#[path = "manager_tests.rs"]
mod tests;
