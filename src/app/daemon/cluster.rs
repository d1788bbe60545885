//! The agent's side of the cluster, with a kubeconfig: the API server clients (after TLS
//! bootstrap, with client certificate rotation), the event sink, and the Node's registration,
//! status and Lease. None of it touches pods: what the API server does or fails to do never
//! stops one.

use std::path::Path;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use tokio_util::sync::CancellationToken;

use super::plan::ClusterPlan;
use super::{Agent, DaemonError, HEARTBEAT_TIMEOUT, Tuning, WATCH_READ_TIMEOUT};
use crate::base::supervisor::Supervisor;
use crate::clients::apiserver::{self, ClientOptions, ConnectError};
use crate::config::Config;
use crate::kubelet::certificate::{self, CertSlot, FileStore};
use crate::kubelet::events::{self, Recorder};
use crate::kubelet::shutdown::ShutdownStatus;

/// The three API server clients. Each has time-outs and a rate limit for its own kind of
/// request, so a slow watch or a burst of events never holds up a heartbeat.
pub(super) struct ApiClients {
    /// The node's heartbeats, pod status, reviews, CSRs and the objects pods use (short
    /// time-outs).
    pub heartbeat: kube::Client,
    /// Watches: pods bound to the node, the Node itself, the objects pods use.
    pub watch: kube::Client,
    /// Events, at `eventRecordQPS`.
    pub events: kube::Client,
    /// With `rotateCertificates` and a current certificate: the rotation loop, started with
    /// the other supervised tasks.
    pub rotation: Option<Rotation>,
}

type Rotation = certificate::manager::Rotation<certificate::csr::KubeCsrApi>;

/// Connects the three clients. With `--bootstrap-kubeconfig`, a missing or unusable
/// kubeconfig is first replaced by one naming a certificate requested by CSR; with
/// `rotateCertificates`, the clients share a certificate slot that a rotation loop renews.
pub(super) async fn connect(
    config: &Config,
    plan: &ClusterPlan,
    tuning: &Tuning,
    cancel: &CancellationToken,
) -> Result<ApiClients, DaemonError> {
    let options = ClientOptions {
        qps: config.cluster.kube_api_qps,
        burst: config.cluster.kube_api_burst,
        timeout: HEARTBEAT_TIMEOUT,
        read_timeout: HEARTBEAT_TIMEOUT,
    };
    let store = FileStore::new(&config.cert_dir);
    if let Some(bootstrap) = &plan.bootstrap_kubeconfig {
        certificate::bootstrap::load_client_cert(
            &plan.kubeconfig,
            bootstrap,
            &store,
            &config.node_name,
            cancel,
        )
        .await?;
    }
    let slot = rotation_slot(config, plan, &store);
    let path = plan.kubeconfig.as_path();
    let heartbeat = connect_one(path, &options, slot.as_ref()).await?;
    let watch_options = ClientOptions {
        read_timeout: WATCH_READ_TIMEOUT,
        ..options.clone()
    };
    let watch = connect_one(path, &watch_options, slot.as_ref()).await?;
    let events_options = ClientOptions {
        qps: plan.events_qps,
        burst: config.cluster.event_burst,
        ..options.clone()
    };
    let events = connect_one(path, &events_options, slot.as_ref()).await?;
    let rotation = slot.map(|slot| certificate::manager::Rotation {
        api: certificate::csr::KubeCsrApi(heartbeat.clone()),
        slot,
        store,
        node_name: config.node_name.clone(),
        rotate_after: tuning.cert_rotate_after,
    });
    Ok(ApiClients {
        heartbeat,
        watch,
        events,
        rotation,
    })
}

/// With rotation, the slot every client presents the certificate of, holding the current
/// client certificate; none (and a warning) when the cert dir has no current certificate.
fn rotation_slot(config: &Config, plan: &ClusterPlan, store: &FileStore) -> Option<CertSlot> {
    if !plan.rotate_certificates {
        return None;
    }
    let current = certificate::bootstrap::current_credentials(store);
    if current.is_none() {
        tracing::warn!(cert_dir = %config.cert_dir.display(), "rotateCertificates is on, but the cert dir holds no current client certificate (kubelet-client-current.pem); not rotating");
    }
    current.map(CertSlot::new)
}

/// One client: presenting the slot's certificate when rotating, else the kubeconfig's.
async fn connect_one(
    path: &Path,
    options: &ClientOptions,
    slot: Option<&CertSlot>,
) -> Result<kube::Client, ConnectError> {
    match slot {
        Some(slot) => apiserver::connect_rotating(path, options, slot.resolver()).await,
        None => apiserver::connect(path, options).await,
    }
}

/// The event recorder: events are logged always, and with a kubeconfig also written to the
/// API server by a sink task (the first supervised task).
pub(super) fn events(
    node_name: &str,
    api: Option<&ApiClients>,
    tasks: &Supervisor,
    cancel: &CancellationToken,
) -> Recorder {
    match api {
        Some(api) => {
            let (recorder, queue) = Recorder::to_api(node_name);
            let queue = Arc::new(tokio::sync::Mutex::new(queue));
            let (client, stats, cancel) = (api.events.clone(), recorder.stats(), cancel.clone());
            tasks.spawn("event-sink", move || {
                let sink = events::sink::KubeEventSink::new(client.clone());
                let (queue, stats, cancel) = (queue.clone(), stats.clone(), cancel.clone());
                async move {
                    let mut queue = queue.lock().await;
                    events::sink::run(sink, &mut queue, stats, cancel).await
                }
            });
            recorder
        }
        None => Recorder::log_only(node_name),
    }
}

/// Starts client certificate rotation, when there is one to do.
pub(super) fn start_rotation(agent: &Agent) {
    let Some(rotation) = agent.api.as_ref().and_then(|api| api.rotation.clone()) else {
        return;
    };
    let cancel = agent.cancel.clone();
    agent.tasks.spawn("cert-rotation", move || {
        rotation.clone().run(cancel.clone())
    });
}

/// Registers the Node and keeps its status and Lease current; watches the Node, so admission
/// sees label and taint changes at once (`published` feeds admission's view of the Node).
/// This talks to the API server only; pods are untouched by anything it does or fails to do.
pub(super) fn start_membership(
    agent: &Agent,
    api: &ApiClients,
    published: tokio::sync::watch::Sender<Option<Arc<Node>>>,
    pressure: &crate::kubelet::eviction::PressureView,
    shutdown: &ShutdownStatus,
) {
    use crate::kubelet::node::{agent as node_agent, api as node_api, watch as node_watch};
    let config = &agent.config;
    let (client, name, publisher) = (
        api.watch.clone(),
        config.node_name.clone(),
        node_agent::NodePublisher::to(published.clone()),
    );
    let cancel = agent.cancel.clone();
    agent.tasks.spawn("node-watch", move || {
        node_watch::run(
            client.clone(),
            name.clone(),
            publisher.clone(),
            cancel.clone(),
        )
    });
    let snapshots = node_agent::LiveSnapshots {
        cri: agent.cri.clone(),
        health: agent.health.clone(),
        node_name: config.node_name.clone(),
        node_ip: config.node_ip,
        root_dir: config.root_dir.clone(),
        max_pods: config.max_pods,
        max_images: config.cluster.node_status_max_images,
        reservations: config.reservations.clone(),
        kubelet_port: config.port,
        pressure: pressure.clone(),
        shutdown: shutdown.clone(),
    };
    let settings = node_agent::AgentSettings {
        node_name: config.node_name.clone(),
        cluster: config.cluster.clone(),
        status_update_frequency: config.node_status_update_frequency,
        published: node_agent::NodePublisher::to(published),
    };
    let (client, events, cancel) = (
        api.heartbeat.clone(),
        agent.events.clone(),
        agent.cancel.clone(),
    );
    // Registration, node status and the Lease: one task, restarted as a whole.
    agent.tasks.spawn("node-status", move || {
        node_agent::run(
            node_api::KubeNodeApi::new(client.clone()),
            snapshots.clone(),
            settings.clone(),
            apiserver::ProblemLog::default(),
            events.clone(),
            cancel.clone(),
        )
    });
}
