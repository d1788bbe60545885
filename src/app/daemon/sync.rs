//! The sync loop, which joins the sources, the PLEG and the workers: its admission, graceful
//! node shutdown (which takes it over when the node shuts down), and its supervision.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use k8s_openapi::api::core::v1::Node;
use tokio::sync::{mpsc, oneshot, watch};
use tracing::Instrument;

use super::Agent;
use super::node::NodeFacts;
use crate::base::resync_queue::Pokes;
use crate::base::supervisor::panic_message;
use crate::clients::cri::CriClient;
use crate::kubelet::admission::{self, NodeSource};
use crate::kubelet::eviction::{EvictRequest, PressureView};
use crate::kubelet::pleg::RuntimeCache;
use crate::kubelet::pod_workers::PodWorkers;
use crate::kubelet::shutdown::{self, ShutdownStatus};
use crate::kubelet::source::{PodChange, SourcesReady};
use crate::kubelet::sync_loop::{Admission, Refusals, SyncLoop, SyncLoopControl, SyncLoopHealth};

/// Admission checks new pods against the node as configured and, with a kubeconfig, once the
/// node agent has it back from the API server, the Node's own labels and taints: they arrive
/// through the returned sender.
pub(super) fn admission(
    agent: &Agent,
    facts: &NodeFacts,
    refusals: Refusals,
    pressure: &PressureView,
) -> (Admission, watch::Sender<Option<Arc<Node>>>) {
    let config = &agent.config;
    let (node_tx, node_rx) = watch::channel(None);
    let admission_node = admission::NodeInfo {
        name: config.node_name.clone(),
        labels: crate::kubelet::node::registration::node_labels(&config.node_name, &config.cluster),
        taints: config.cluster.register_with_taints.clone(),
        allocatable: admission::Allocatable::from_quantities(&facts.allocatable.to_quantities()),
    };
    let admission = Admission {
        node: if agent.plan.cluster.is_some() {
            NodeSource::with_node_object(admission_node, node_rx)
        } else {
            NodeSource::fixed(admission_node)
        },
        states: agent.states.clone(),
        refusals,
        pressure: pressure.clone(),
        devices: Some(agent.devices.clone()),
    };
    (admission, node_tx)
}

/// The sync loop, taking eviction requests; with graceful node shutdown in the plan, also
/// the shutdown manager (a delay lock from logind, and the pods stopped in priority order
/// when the node shuts down), which controls the loop. The returned status says whether the
/// node is shutting down (for the Node's status).
pub(super) fn sync_loop(
    agent: &Agent,
    workers: PodWorkers<CriClient>,
    sources_ready: SourcesReady,
    runtime_cache: RuntimeCache,
    admission: Admission,
    evictions: mpsc::Receiver<EvictRequest>,
) -> (SyncLoop<CriClient>, ShutdownStatus) {
    let mut sync_loop =
        SyncLoop::new(workers, sources_ready, runtime_cache, admission).with_evictions(evictions);
    // The allocations of in-place resizes, kept across restarts in the root dir.
    let allocations = crate::kubelet::admission::allocation::Allocations::load(
        agent
            .config
            .root_dir
            .join(crate::kubelet::admission::allocation::FILE_NAME),
    );
    sync_loop = sync_loop
        .with_resizes(crate::kubelet::sync_loop::Resizes::new(allocations))
        .with_dra(agent.dra.clone());
    let status = ShutdownStatus::default();
    if let Some(buckets) = &agent.plan.graceful_shutdown {
        let config = &agent.config;
        let (control, control_rx) = SyncLoopControl::channel();
        sync_loop = sync_loop.with_control(control_rx, status.clone());
        let manager = shutdown::Manager::new(
            shutdown::logind::SystemBus,
            control,
            shutdown::ManagerSettings {
                buckets: buckets.clone(),
                state_file: config.root_dir.join(shutdown::STATE_FILE),
                events: agent.events.clone(),
                node_name: config.node_name.clone(),
                volumes: Arc::new(shutdown::volumes::MountTable {
                    pods_dir: config.root_dir.join("pods"),
                    read: || {
                        use crate::kubelet::volume::mounter::{KernelMounter, Mounter};
                        KernelMounter
                            .mount_table()
                            .map(|table| table.into_iter().map(|e| e.mount_point).collect())
                    },
                }),
            },
            status.clone(),
        );
        agent.tracker.spawn(
            manager
                .run(agent.cancel.clone())
                .instrument(tracing::info_span!("node_shutdown")),
        );
    }
    (sync_loop, status)
}

/// Starts the sync loop supervised: if it panics or returns while the agent runs, the
/// `syncloop` health check says so and the returned receiver hears why, so the agent stops
/// with an error, to be restarted by its service manager.
pub(super) fn supervise(
    agent: &Agent,
    sync_loop: SyncLoop<CriClient>,
    changes: mpsc::Receiver<Vec<PodChange>>,
    pokes: Pokes,
    done: mpsc::UnboundedReceiver<String>,
) -> oneshot::Receiver<String> {
    let loop_health = SyncLoopHealth::default();
    {
        let loop_health = loop_health.clone();
        agent
            .health
            .register("syncloop", move || loop_health.check());
    }
    let (loop_ended_tx, loop_ended_rx) = oneshot::channel::<String>();
    let cancel = agent.cancel.clone();
    let run = sync_loop.run(changes, pokes, done, loop_health.clone(), cancel.clone());
    agent.tracker.spawn(async move {
        let why = match AssertUnwindSafe(run).catch_unwind().await {
            _ if cancel.is_cancelled() => return,
            Ok(()) => "it returned".to_string(),
            Err(payload) => format!("it panicked: {}", panic_message(payload.as_ref())),
        };
        tracing::error!(reason = %why, "the sync loop ended; the agent stops");
        loop_health.ended(why.clone());
        let _ = loop_ended_tx.send(why);
    });
    loop_ended_rx
}
