//! The pod cgroups (upstream's container manager): made at start, the QoS cgroups kept
//! current, and the cgroups of pods the node no longer has removed.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::plan::PodCgroups;
use super::{Agent, CGROUP_MOUNT, DaemonError};
use crate::clients::cri::CriClient;
use crate::config::Config;
use crate::kubelet::cm::{
    CfsSettings, CgroupManager, CgroupVersion, ContainerSettings, HostCgroupFs, ManagerSettings,
};
use crate::kubelet::node::allocatable::Amounts;
use crate::kubelet::pleg::RuntimeCache;
use crate::kubelet::pod_workers::PodWorkers;

/// How often the QoS cgroups are written again from the active pods (upstream's period),
/// besides each time a pod's cgroup is made or a pod ends: whatever changed them meanwhile is
/// set right.
const QOS_CGROUP_PERIOD: Duration = Duration::from_secs(60);

/// The cgroup side of the start: the cgroup version, the container settings translation
/// needs, and with [`PodCgroups::Managed`] the manager, after it made `kubepods` (limited to
/// allocatable when `enforceNodeAllocatable` has `pods`) and the QoS cgroups.
pub(super) fn setup(
    config: &Config,
    pod_cgroups: PodCgroups,
    capacity: &Amounts,
) -> Result<(Option<Arc<CgroupManager>>, ContainerSettings), DaemonError> {
    let fs = HostCgroupFs::new(CGROUP_MOUNT);
    let version = crate::kubelet::cm::detect_version(&fs);
    let page_sizes: Vec<u64> = capacity.hugepages.iter().map(|(size, _)| *size).collect();
    let cfs = CfsSettings {
        enforce_cpu_limits: config.cpu_cfs_quota,
        period_us: u64::try_from(config.cpu_cfs_quota_period.as_micros()).unwrap_or(u64::MAX),
    };
    let settings = ContainerSettings {
        cfs,
        version: Some(version),
        page_sizes: page_sizes.clone(),
    };
    let enforce_pods = match pod_cgroups {
        PodCgroups::Unmanaged => return Ok((None, settings)),
        PodCgroups::BySystemd => {
            // Slices are made by systemd on the runtime's request; Deckhand does not talk to
            // systemd, so pod-level limits are not written with this driver.
            tracing::warn!(
                "with the systemd cgroup driver the runtime creates the pod slices; pod-level cgroup limits and kubepods enforcement are not applied"
            );
            return Ok((None, settings));
        }
        PodCgroups::Managed { enforce_pods } => enforce_pods,
    };
    let manager = start_manager(config, fs, version, page_sizes, cfs, capacity, enforce_pods)?;
    Ok((Some(Arc::new(manager)), settings))
}

/// Makes `kubepods` (with the node's capacity, less the reservations when `enforce_pods`) and
/// the QoS cgroups under the cgroup root.
fn start_manager(
    config: &Config,
    fs: HostCgroupFs,
    version: CgroupVersion,
    page_sizes: Vec<u64>,
    cfs: CfsSettings,
    capacity: &Amounts,
    enforce_pods: bool,
) -> Result<CgroupManager, DaemonError> {
    use crate::kubelet::cm::allocatable::{NodeCapacity, kubepods_config};
    let allocatable =
        crate::kubelet::node::allocatable::allocatable(capacity, &config.reservations);
    let manager = CgroupManager::new(
        Arc::new(fs),
        page_sizes,
        ManagerSettings {
            cgroup_root: config.cgroup_root.clone(),
            cfs,
            pod_pids_limit: config.pod_pids_limit,
            memory_reserve_percent: None,
            allocatable_memory: allocatable.memory_bytes,
        },
    )?;
    let node = NodeCapacity {
        cpu_millis: capacity.cpu_millis,
        memory_bytes: capacity.memory_bytes,
        pids: NodeCapacity::read_pids(std::path::Path::new("/proc/sys/kernel")),
        hugepages: capacity.hugepages.clone(),
    };
    let kubepods = kubepods_config(&node, &config.reservations, enforce_pods);
    manager.start(&kubepods)?;
    tracing::info!(
        cgroup = %manager.kubepods(),
        version = ?version,
        memory = ?kubepods.memory,
        cpu_shares = ?kubepods.cpu_shares,
        pids = ?kubepods.pids_limit,
        enforce_pods,
        "pod cgroups ready"
    );
    Ok(manager)
}

/// Writes the QoS cgroups again every [`QOS_CGROUP_PERIOD`] until `cancel` fires.
pub(super) async fn keep_qos_cgroups(cgroups: Arc<CgroupManager>, cancel: CancellationToken) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(QOS_CGROUP_PERIOD) => {}
        }
        let cgroups = cgroups.clone();
        if let Ok(Err(err)) = tokio::task::spawn_blocking(move || cgroups.update_qos()).await {
            tracing::warn!(error = %err, "cannot update the QoS cgroups");
        }
    }
}

/// Removes the pod cgroups left behind by pods the node no longer has: neither a worker nor
/// the runtime knows them (once the PLEG has listed the runtime), they are Deckhand's (the
/// pod dir is there) and no volume is left mounted for them.
pub(super) fn start_orphan_sweep(
    agent: &Agent,
    cgroups: Arc<CgroupManager>,
    workers: &PodWorkers<CriClient>,
    runtime_cache: &RuntimeCache,
) {
    let (activity, listed, known_runtime) = (
        workers.activity(),
        runtime_cache.clone(),
        runtime_cache.clone(),
    );
    let pods_dir = agent.config.root_dir.join("pods");
    let our_pods = pods_dir.clone();
    let inputs = crate::kubelet::cm::orphans::SweepInputs {
        ready: Arc::new(move || listed.has_relisted()),
        ours: Arc::new(move |uid| our_pods.join(uid).is_dir()),
        known: Arc::new(move |uid| {
            activity.activity(uid) != crate::kubelet::gc::PodActivity::Gone
                || known_runtime.pod(uid).is_some()
        }),
        volumes_left: Arc::new(move |uid| {
            std::fs::read_dir(pods_dir.join(uid).join("volumes"))
                .is_ok_and(|mut d| d.next().is_some())
        }),
    };
    agent.tracker.spawn(
        crate::kubelet::cm::orphans::run(cgroups, inputs, agent.cancel.clone())
            .instrument(tracing::info_span!("orphan_cgroups")),
    );
}
