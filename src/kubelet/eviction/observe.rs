//! The eviction manager's I/O, behind small traits: reading the signals and the pods' usage
//! ([`Observer`]), reclaiming node resources ([`Reclaimer`]), evicting a pod ([`Evictor`]) and
//! listing the pods that run ([`ActivePods`]). The real implementations come first; the
//! tests use their own.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{mpsc, oneshot};

use super::EvictRequest;
use super::decide::{ContainerUsage, Observation, Observations, PodUsage, Reclaim};
use super::signals::Signal;
use crate::clients::cri::{CriError, ImageService, RuntimeService};
use crate::kubelet::gc::containers::ContainerGcPolicy;
use crate::kubelet::gc::run::{
    GcContext, GcError, SharedImageGc, container_gc_pass, delete_unused_images,
};
use crate::kubelet::pod_status::published::PodStates;
use crate::kubelet::stats::{HostFiles, StatsError, StatsProvider};

/// Why a round could not read or act.
#[derive(Debug, thiserror::Error)]
pub enum EvictionError {
    #[error("cannot read the node's usage: {0}")]
    Stats(#[from] StatsError),
    #[error("the runtime failed: {0}")]
    Runtime(#[from] CriError),
    #[error("reclaiming failed: {0}")]
    Gc(#[from] GcError),
    #[error("a blocking task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
    #[error("the sync loop is gone")]
    SyncLoopGone,
}

/// One reading: the signals, each pod's usage by UID, and whether images live on a
/// filesystem of their own.
#[derive(Debug, Clone, Default)]
pub struct Reading {
    pub observations: Observations,
    pub pods: HashMap<String, PodUsage>,
    pub dedicated_imagefs: bool,
}

/// Whose usage a reading measures besides the node's signals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Measure {
    /// The node alone: every round.
    Node,
    /// Every pod: when one must be chosen under pressure.
    AllPods,
    /// These pods (UIDs): the ones with local storage limits, every round.
    Pods(HashSet<String>),
}

impl Measure {
    pub fn any_pods(&self) -> bool {
        *self != Measure::Node
    }

    fn includes(&self, uid: &str) -> bool {
        match self {
            Measure::Node => false,
            Measure::AllPods => true,
            Measure::Pods(uids) => uids.contains(uid),
        }
    }
}

/// Reads the node's signals and the usage of the pods `measure` names.
pub trait Observer: Send + Sync + 'static {
    /// The pods' usage costs a walk of each pod's volumes and logs, a read of its cgroup and
    /// the runtime's container stats: it is asked for only when a pod must be chosen, and for
    /// the pods whose local storage limits are checked.
    fn observe(&self, measure: Measure) -> BoxFuture<'_, Result<Reading, EvictionError>>;
}

/// Frees node resources; answers how many objects went.
pub trait Reclaimer: Send + Sync + 'static {
    fn reclaim(&self, what: Reclaim) -> BoxFuture<'_, Result<usize, EvictionError>>;
}

/// Evicts a pod; the receiver fires once the pod's containers are gone.
pub trait Evictor: Send + Sync + 'static {
    fn evict(
        &self,
        uid: &str,
        grace_seconds: i64,
        message: String,
    ) -> BoxFuture<'_, Result<oneshot::Receiver<()>, EvictionError>>;
}

/// The pods that run (or are about to): admitted and not finished.
pub trait ActivePods: Send + Sync + 'static {
    fn active(&self) -> Vec<Arc<Pod>>;
}

impl ActivePods for PodStates {
    fn active(&self) -> Vec<Arc<Pod>> {
        self.uids()
            .into_iter()
            .filter_map(|uid| self.get(&uid))
            .filter(|(_, status)| !matches!(status.phase.as_deref(), Some("Succeeded" | "Failed")))
            .map(|(pod, _)| pod)
            .collect()
    }
}

/// The real observer: the node API's stats (root memory cgroup, `statvfs` of the root dir,
/// CRI container stats), CRI `ImageFsInfo`, `pid_max` and the process count, and the sizes
/// of each pod's logs and volumes on disk.
pub struct LiveObserver<R> {
    pub rt: R,
    pub stats: StatsProvider,
    pub root_dir: PathBuf,
    pub pod_logs_dir: PathBuf,
    pub proc_root: PathBuf,
    /// The pod cgroups, for each pod's process count (`None`: not counted).
    pub cgroups: Option<Arc<crate::kubelet::cm::CgroupManager>>,
}

impl<R: RuntimeService + ImageService + Clone> LiveObserver<R> {
    pub fn new(rt: R, node_name: String, root_dir: PathBuf, pod_logs_dir: PathBuf) -> Self {
        // Only the containers' figures are read from the summary; volumes and logs are walked
        // here, so the summary's own volume walks are off (period 0).
        let host = HostFiles::new(
            root_dir.clone(),
            pod_logs_dir.clone(),
            None,
            std::time::Duration::ZERO,
        );
        LiveObserver {
            stats: StatsProvider::new(Arc::new(rt.clone()), Arc::new(host), node_name),
            rt,
            root_dir,
            pod_logs_dir,
            proc_root: PathBuf::from("/proc"),
            cgroups: None,
        }
    }
}

/// Bytes (allocated blocks) and inodes under `dir`, counted as `/stats/summary` counts them
/// (`du -x`: links not followed, memory-backed mounts such as secrets left out); 0 for a
/// directory that is not there.
fn disk_use(dir: &Path) -> (u64, u64) {
    crate::kubelet::stats::host::disk_usage(dir, crate::kubelet::stats::host::WALK_LIMIT)
        .map_or((0, 0), |u| (u.bytes, u.inodes))
}

/// Each disk-backed emptyDir of the pod whose volumes are under `volumes`, by volume name:
/// its bytes as [`disk_use`] counts them. A memory-backed one (a mount of its own) is left
/// out, as the walk of the whole pod leaves it out.
fn empty_dir_use(volumes: &Path) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let Ok(dev) = std::fs::symlink_metadata(volumes).map(|m| m.dev()) else {
        return out;
    };
    let dir = volumes.join(crate::kubelet::volume::EMPTY_DIR_PLUGIN);
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let same_fs = entry.metadata().is_ok_and(|m| m.is_dir() && m.dev() == dev);
        if let (true, Some(name)) = (same_fs, entry.file_name().to_str()) {
            out.insert(name.to_string(), disk_use(&entry.path()).0);
        }
    }
    out
}

fn statvfs_observations(path: &Path) -> Option<(Observation, Observation, u64)> {
    let st = nix::sys::statvfs::statvfs(path).ok()?;
    let frag = st.fragment_size() as u64;
    let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let dev = std::fs::metadata(path).ok()?.dev();
    Some((
        Observation {
            available: clamp((st.blocks_available() as u64).saturating_mul(frag)),
            capacity: clamp((st.blocks() as u64).saturating_mul(frag)),
        },
        Observation {
            available: clamp(st.files_free() as u64),
            capacity: clamp(st.files() as u64),
        },
        dev,
    ))
}

/// `pid_max` and the number of processes (threads included, as upstream's `sysinfo`).
fn pids(proc_root: &Path) -> Option<Observation> {
    let max: i64 = std::fs::read_to_string(proc_root.join("sys/kernel/pid_max"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let running = nix::sys::sysinfo::sysinfo().ok()?.process_count();
    Some(Observation {
        available: max - i64::from(running),
        capacity: max,
    })
}

impl<R: RuntimeService + ImageService + Clone> Observer for LiveObserver<R> {
    fn observe(&self, measure: Measure) -> BoxFuture<'_, Result<Reading, EvictionError>> {
        Box::pin(async move {
            let summary = if measure.any_pods() {
                self.stats.summary(false).await?
            } else {
                crate::kubelet::stats::types::Summary {
                    node: self.stats.node_summary().await,
                    pods: Vec::new(),
                }
            };
            let image_mount = match self.rt.image_fs_info().await {
                Ok(info) => info
                    .image_filesystems
                    .first()
                    .and_then(|fs| fs.fs_id.as_ref())
                    .map(|id| PathBuf::from(&id.mountpoint)),
                Err(err) => {
                    tracing::debug!(error = %err, "eviction: the runtime does not report its image filesystem");
                    None
                }
            };
            let mut observations = Observations::new();
            if let Some(m) = &summary.node.memory
                && let (Some(avail), Some(ws)) = (m.available_bytes, m.working_set_bytes)
            {
                let clamp = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
                observations.insert(
                    Signal::MemoryAvailable,
                    Observation {
                        available: clamp(avail),
                        capacity: clamp(avail.saturating_add(ws)),
                    },
                );
            }
            let pods: Vec<(String, String, String, Vec<_>)> = summary
                .pods
                .iter()
                .filter(|p| measure.includes(&p.pod_ref.uid))
                .map(|p| {
                    (
                        p.pod_ref.uid.clone(),
                        p.pod_ref.namespace.clone(),
                        p.pod_ref.name.clone(),
                        p.containers.clone(),
                    )
                })
                .collect();
            let root_dir = self.root_dir.clone();
            let logs_dir = self.pod_logs_dir.clone();
            let proc_root = self.proc_root.clone();
            let cgroups = self.cgroups.clone();
            // Each emptyDir is walked on its own only for the pods whose limits are checked.
            let limits_checked = matches!(measure, Measure::Pods(_));
            let (node_fs, image_fs, pid, usages) = tokio::task::spawn_blocking(move || {
                let node_fs = statvfs_observations(&root_dir);
                let image_fs = image_mount.as_deref().and_then(statvfs_observations);
                let pid = pids(&proc_root);
                let mut usages = HashMap::new();
                for (uid, ns, name, containers) in pods {
                    // A UID or name that is not one path component is never a directory here.
                    let log_dir = format!("{ns}_{name}_{uid}");
                    let mut usage = PodUsage::default();
                    for c in &containers {
                        let logs = (crate::base::safe_names::component_problem(&log_dir).is_none()
                            && crate::base::safe_names::component_problem(&c.name).is_none())
                        .then(|| disk_use(&logs_dir.join(&log_dir).join(&c.name)));
                        let ws = c.memory.as_ref().and_then(|m| m.working_set_bytes);
                        let rootfs = c.rootfs.as_ref().and_then(|r| r.used_bytes);
                        usage.memory_working_set += ws.unwrap_or(0);
                        usage.rootfs_bytes += rootfs.unwrap_or(0);
                        usage.inodes += c.rootfs.as_ref().and_then(|r| r.inodes_used).unwrap_or(0);
                        if let Some((b, i)) = logs {
                            usage.logs_bytes += b;
                            usage.inodes += i;
                        }
                        usage.containers.push(ContainerUsage {
                            name: c.name.clone(),
                            memory_working_set: ws,
                            rootfs_bytes: rootfs,
                            logs_bytes: logs.map(|(b, _)| b),
                        });
                    }
                    usage.processes = cgroups.as_ref().and_then(|c| c.pod_process_count(&uid));
                    if crate::base::safe_names::component_problem(&uid).is_none() {
                        let volumes = root_dir.join("pods").join(&uid).join("volumes");
                        let (b, i) = disk_use(&volumes);
                        usage.volumes_bytes = b;
                        usage.inodes += i;
                        if limits_checked {
                            usage.volume_bytes = empty_dir_use(&volumes);
                        }
                    }
                    usages.insert(uid, usage);
                }
                (node_fs, image_fs, pid, usages)
            })
            .await?;
            let mut dedicated_imagefs = false;
            if let Some((bytes, inodes, dev)) = node_fs {
                observations.insert(Signal::NodeFsAvailable, bytes);
                observations.insert(Signal::NodeFsInodesFree, inodes);
                // Without a reading of its own, the image filesystem is taken to be the node's.
                let (ibytes, iinodes) = match image_fs {
                    Some((b, i, idev)) => {
                        dedicated_imagefs = idev != dev;
                        (b, i)
                    }
                    None => (bytes, inodes),
                };
                for (s, o) in [
                    (Signal::ImageFsAvailable, ibytes),
                    (Signal::ImageFsInodesFree, iinodes),
                    (Signal::ContainerFsAvailable, ibytes),
                    (Signal::ContainerFsInodesFree, iinodes),
                ] {
                    observations.insert(s, o);
                }
            }
            if let Some(p) = pid {
                observations.insert(Signal::PidAvailable, p);
            }
            Ok(Reading {
                observations,
                pods: usages,
                dedicated_imagefs,
            })
        })
    }
}

/// The real reclaimer: the GC's passes, run at once. Dead containers go as in the periodic
/// container GC, and with them every exited container and dead sandbox of finished pods
/// (upstream's `evictNonDeletedPods`); images as upstream's `DeleteUnusedImages`: every unused image seen for at
/// least the minimum age, whatever the GC thresholds, through the image record the periodic
/// image GC keeps (so an image's age counts from when the agent first saw it).
pub struct GcReclaimer<R> {
    pub ctx: GcContext<R>,
    pub images: SharedImageGc,
    pub min_image_age: std::time::Duration,
    pub keep_images: Vec<String>,
}

impl<R: RuntimeService + ImageService> Reclaimer for GcReclaimer<R> {
    fn reclaim(&self, what: Reclaim) -> BoxFuture<'_, Result<usize, EvictionError>> {
        Box::pin(async move {
            match what {
                Reclaim::DeadContainers => {
                    // Finished pods' exited containers go too, as upstream's reclaim does.
                    let done =
                        container_gc_pass(&self.ctx, ContainerGcPolicy::reclaiming()).await?;
                    Ok(done.containers.len() + done.sandboxes.len())
                }
                Reclaim::UnusedImages => {
                    let mut state = self.images.lock().await;
                    let removed = delete_unused_images(
                        &self.ctx.rt,
                        &mut state,
                        self.min_image_age,
                        &self.keep_images,
                    )
                    .await?;
                    Ok(removed.len())
                }
            }
        })
    }
}

/// The real evictor: hands the pod to the sync loop.
pub struct SyncLoopEvictor {
    pub tx: mpsc::Sender<EvictRequest>,
}

impl Evictor for SyncLoopEvictor {
    fn evict(
        &self,
        uid: &str,
        grace_seconds: i64,
        message: String,
    ) -> BoxFuture<'_, Result<oneshot::Receiver<()>, EvictionError>> {
        let uid = uid.to_string();
        Box::pin(async move {
            let (done, rx) = oneshot::channel();
            self.tx
                .send(EvictRequest {
                    uid,
                    grace_seconds,
                    message,
                    done,
                })
                .await
                .map_err(|_| EvictionError::SyncLoopGone)?;
            Ok(rx)
        })
    }
}
