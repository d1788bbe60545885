//! Housekeeping of the node: the disk (dead containers and sandboxes, unused images, large
//! logs) and the eviction manager, which watches the node's resources, reports pressure and
//! reclaims through the same GC passes before it evicts pods.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::{Agent, CGROUP_MOUNT};
use crate::clients::cri::CriClient;
use crate::kubelet::cm::CgroupManager;
use crate::kubelet::eviction::{self, EvictRequest, PressureView};
use crate::kubelet::gc::run::{self as gc, GcContext, GcPeriods, ImageGc, SharedImageGc};
use crate::kubelet::pod_workers::PodWorkers;
use crate::kubelet::source::SourcesReady;

/// What a GC pass needs: the runtime, the pod logs, which pods have workers, and whether the
/// sources are ready (before, a pod without a worker may be one not read yet).
fn gc_context(
    agent: &Agent,
    workers: &PodWorkers<CriClient>,
    sources_ready: &SourcesReady,
) -> GcContext<CriClient> {
    let ready = sources_ready.clone();
    GcContext {
        rt: agent.cri.clone(),
        node_name: agent.config.node_name.clone(),
        pod_logs_dir: agent.config.pod_logs_dir.clone(),
        activity: workers.activity(),
        sources_ready: Arc::new(move || ready.all_ready()),
    }
}

/// Starts the container GC, the image GC and the log rotation, at upstream's periods unless
/// the tuning shortens them. Returns the image record, which the eviction manager's reclaim
/// shares.
pub(super) fn start_gc(
    agent: &Agent,
    workers: &PodWorkers<CriClient>,
    sources_ready: &SourcesReady,
) -> SharedImageGc {
    let image_gc = ImageGc::shared();
    let tuning = &agent.tuning;
    gc::spawn(
        gc_context(agent, workers, sources_ready),
        &agent.config.gc,
        agent.plan.keep_images.as_slice(),
        image_gc.clone(),
        GcPeriods {
            container_gc: tuning
                .container_gc_period
                .unwrap_or(gc::CONTAINER_GC_PERIOD),
            image_gc: tuning.image_gc_period.unwrap_or(gc::IMAGE_GC_PERIOD),
            log_monitor: tuning
                .log_monitor_interval
                .unwrap_or(agent.config.gc.container_log_monitor_interval),
        },
        &agent.tasks,
        agent.cancel.clone(),
    );
    image_gc
}

/// Starts the eviction manager: pressure conditions for the node status and admission (the
/// returned view), node-level reclaim through the GC passes, and evictions carried out by the
/// sync loop (the returned receiver). It counts each pod's processes in its cgroup, and its
/// last round is on `/debug/eviction`.
pub(super) fn start_eviction(
    agent: &Agent,
    workers: &PodWorkers<CriClient>,
    sources_ready: &SourcesReady,
    images: &SharedImageGc,
    cgroups: Option<Arc<CgroupManager>>,
) -> (PressureView, mpsc::Receiver<EvictRequest>) {
    use eviction::observe::{GcReclaimer, LiveObserver, SyncLoopEvictor};
    let config = &agent.config;
    let pressure = PressureView::default();
    let (evict_tx, evict_rx) = mpsc::channel(4);
    let settings = eviction::manager::ManagerSettings {
        thresholds: eviction::signals::thresholds(
            &config.reservations.eviction_hard,
            &config.eviction,
        ),
        pressure_transition_period: config.eviction.pressure_transition_period,
        max_pod_grace_period_seconds: config.eviction.max_pod_grace_period_seconds,
        monitoring_period: agent
            .tuning
            .eviction_monitoring_period
            .unwrap_or(eviction::MONITORING_PERIOD),
        node_name: config.node_name.clone(),
        local_storage_capacity_isolation: config.eviction.local_storage_capacity_isolation,
    };
    let observer = LiveObserver {
        cgroups,
        ..LiveObserver::new(
            agent.cri.clone(),
            config.node_name.clone(),
            config.root_dir.clone(),
            config.pod_logs_dir.clone(),
        )
    };
    let reclaimer = GcReclaimer {
        ctx: gc_context(agent, workers, sources_ready),
        images: images.clone(),
        min_image_age: config.gc.image_minimum_gc_age,
        keep_images: agent.plan.keep_images.clone(),
    };
    let mut manager = eviction::manager::Manager::new(
        settings,
        observer,
        reclaimer,
        SyncLoopEvictor { tx: evict_tx },
        agent.states.clone(),
        pressure.clone(),
        agent.events.clone(),
    );
    if agent.plan.memcg_notification
        && let Some(notifier) = memcg_notifier()
    {
        manager = manager.with_memcg(notifier);
    }
    let last = manager.last.clone();
    agent.metrics.register("/debug/eviction", move || {
        let last = last.lock().unwrap_or_else(|e| e.into_inner()).clone();
        serde_json::to_string(&last).unwrap_or_default()
    });
    // Restarted after a panic with the state it had (its last observations and reclaims).
    let manager = Arc::new(tokio::sync::Mutex::new(manager));
    let cancel = agent.cancel.clone();
    agent.tasks.spawn("eviction", move || {
        let (manager, cancel) = (manager.clone(), cancel.clone());
        async move { manager.lock().await.run(cancel).await }
    });
    (pressure, evict_rx)
}

/// `kernelMemcgNotification`: a round also when the kernel says memory crossed a threshold;
/// where that cannot work (cgroup v2), said once, and polling goes on.
fn memcg_notifier() -> Option<eviction::memcg::MemcgNotifier> {
    use eviction::memcg::{CgroupV1Memcg, MemcgNotifier};
    match CgroupV1Memcg::detect(std::path::Path::new(CGROUP_MOUNT)) {
        Ok(control) => Some(MemcgNotifier::new(Box::new(control))),
        Err(err) => {
            tracing::warn!(error = %err, "kernelMemcgNotification: no memory threshold notifications here; polling every monitoring period only");
            None
        }
    }
}
