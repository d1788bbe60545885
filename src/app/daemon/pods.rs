//! The pod pipeline: the PLEG watches the runtime, the sources say which pods the node should
//! run, the workers (one per pod, each with the executor and the probes) make it so. Built in
//! that order; the sync loop that joins them is built in `sync`.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::Agent;
use super::node::NodeFacts;
use crate::base::resync_queue::Pokes;
use crate::clients::cri::CriClient;
use crate::kubelet::mirror_pods::{KubeMirrorApi, MirrorPods};
use crate::kubelet::pleg::{self, PlegConfig, PlegState, RuntimeCache};
use crate::kubelet::pod_status::api_writer::{self, StatusSync};
use crate::kubelet::pod_workers::{PodWorkers, WorkerDeps, WorkerStats};
use crate::kubelet::prober::ProbeManager;
use crate::kubelet::runtime::executor::{Executor, NodeContext};
use crate::kubelet::runtime::inspect::DetailCache;
use crate::kubelet::source::{self, PodChange, SourceConfig, SourcesReady};
use crate::kubelet::sync_loop::Refusals;

/// What the pipeline hands on to housekeeping, admission and the sync loop.
pub(super) struct PodPipeline {
    pub workers: PodWorkers<CriClient>,
    /// The merged sources' changes, for the sync loop.
    pub changes: mpsc::Receiver<Vec<PodChange>>,
    /// True once every configured source has delivered its first snapshot.
    pub sources_ready: SourcesReady,
    /// Pods the PLEG and the probes want looked at.
    pub pokes: Pokes,
    /// One message from each worker, when it ends.
    pub done: mpsc::UnboundedReceiver<String>,
    /// With a kubeconfig: the mirror pods of static pods.
    pub mirror_pods: Option<MirrorPods>,
    /// Who hears of refused pods (admission's refusals go the same way as the sources').
    pub refusals: Refusals,
}

/// With a kubeconfig: what the API server says of the node's pods (mirror pods included),
/// the mirror pods of static pods, and pod status to the API server (for its pods and, on
/// their mirror pods, for static pods; and refusals, deletions).
struct ApiPods {
    view: source::apiserver::ApiPodsView,
    mirror_pods: Option<MirrorPods>,
    status_sync: Option<StatusSync>,
}

/// Builds the pipeline: PLEG, the node's security features, the API server's view of pods
/// and the status writer, the sources, the executor, the probes and the workers.
pub(super) async fn build(
    agent: &Agent,
    node: &Arc<NodeContext>,
    facts: &NodeFacts,
    runtime_cache: &RuntimeCache,
) -> PodPipeline {
    let details = DetailCache::default();
    // The PLEG, the probe workers and the device managers ask for looks at pods through one
    // coalescing set.
    let pokes = Pokes::default();
    // A change in the health of devices a pod holds asks for a look at it too.
    agent.devices.set_status_pokes(pokes.clone());
    agent.dra.set_status_pokes(pokes.clone());
    let pleg_state = start_pleg(agent, &details, runtime_cache, &pokes);
    let security = source::validate::validate_security::detect_node_security(
        &agent.config.allowed_unsafe_sysctls,
        &agent.cri,
    )
    .await;
    let api_pods = start_api_pods(agent);
    let objects = api_objects(agent, &pokes);
    start_plugin_watcher(agent, objects.as_ref().map(|o| o.tokens()));
    // Every refusal, the API server source's and admission's, is told the same way: an
    // event, and the pod's status in the API server.
    let refusals = Refusals::new(agent.events.clone(), api_pods.status_sync.clone());
    let (changes, sources_ready) = start_sources(agent, security, &api_pods, &refusals);
    let executor = executor(agent, node, details, &pleg_state, facts, objects);
    let prober = prober(agent, node, &pokes);
    let (workers, done) = workers(
        agent,
        node,
        executor,
        prober,
        runtime_cache,
        &pleg_state,
        &api_pods,
    );
    PodPipeline {
        workers,
        changes,
        sources_ready,
        pokes,
        done,
        mirror_pods: api_pods.mirror_pods,
        refusals,
    }
}

/// The plugin watcher on `<root-dir>/plugins_registry`, with the CSI and DRA handlers; the CSI volume
/// code's view of the cluster (CSIDriver objects, secrets, the pods' tokens) is installed here.
fn start_plugin_watcher(agent: &Agent, tokens: Option<crate::kubelet::api_objects::TokenManager>) {
    use crate::kubelet::plugin_watcher::{self, CSI_PLUGIN, Handlers, PluginHandler};
    use crate::kubelet::volume::csi::{self, CsiHandler, CsiHost};
    let host = CsiHost {
        node_name: agent.config.node_name.clone(),
        client: agent.api.as_ref().map(|api| api.general.clone()),
        tokens,
    };
    csi::install_host(host.clone());
    let handler: Arc<dyn PluginHandler> = CsiHandler::new(host);
    let dra: Arc<dyn PluginHandler> = Arc::new(crate::kubelet::dra::DraHandler {
        manager: agent.dra.clone(),
    });
    let handlers: Handlers = [
        (CSI_PLUGIN.to_string(), handler),
        (crate::kubelet::dra::DRA_PLUGIN.to_string(), dra),
    ]
    .into();
    let dir = agent.config.root_dir.join("plugins_registry");
    let cancel = agent.cancel.clone();
    agent.tasks.spawn("plugin-watcher", move || {
        plugin_watcher::run(dir.clone(), handlers.clone(), cancel.clone())
    });
}

/// The PLEG follows the runtime's events where it can, and tells the workers (through the
/// returned state) whether it does.
fn start_pleg(
    agent: &Agent,
    details: &DetailCache,
    runtime_cache: &RuntimeCache,
    pokes: &Pokes,
) -> PlegState {
    let pleg_state = PlegState::default();
    let (cri, details, runtime_cache, pokes, health, state) = (
        agent.cri.clone(),
        details.clone(),
        runtime_cache.clone(),
        pokes.clone(),
        agent.health.clone(),
        pleg_state.clone(),
    );
    // containerd makes its socket again when it restarts: the PLEG hears it at once.
    let runtime_socket =
        match crate::clients::cri::parse_endpoint(&agent.config.container_runtime_endpoint) {
            Ok(endpoint) => {
                pleg::reconnect::SocketSignal::watching(&endpoint.socket, agent.cancel.clone())
            }
            Err(_) => Default::default(),
        };
    let config = PlegConfig {
        node_name: agent.config.node_name.clone(),
        runtime_socket,
        ..agent.tuning.pleg.clone()
    };
    let cancel = agent.cancel.clone();
    agent.tasks.spawn("pleg", move || {
        pleg::run(
            cri.clone(),
            Some(pleg::feed::RuntimeFeed::on_own_thread(&cri)),
            details.clone(),
            runtime_cache.clone(),
            pokes.clone(),
            health.clone(),
            state.clone(),
            config.clone(),
            cancel.clone(),
        )
    });
    pleg_state
}

/// The API server's view of pods always (empty without a kubeconfig); with one, the mirror
/// pods and the status writer, whose task starts here.
fn start_api_pods(agent: &Agent) -> ApiPods {
    let view = source::apiserver::ApiPodsView::default();
    let mirror_pods = agent.api.as_ref().map(|_| MirrorPods::new(view.clone()));
    let status_sync = agent
        .api
        .as_ref()
        .zip(mirror_pods.as_ref())
        .map(|(api, mirrors)| {
            let (handle, writer) = api_writer::start(
                api.general.clone(),
                agent.states.clone(),
                view.clone(),
                mirrors.clone(),
                agent.cancel.clone(),
            );
            agent.tasks.spawn("status-writer", writer);
            handle
        });
    ApiPods {
        view,
        mirror_pods,
        status_sync,
    }
}

/// The sources the plan names (static pod directory and URL; the API server with a
/// kubeconfig), merged into one stream of changes.
fn start_sources(
    agent: &Agent,
    security: source::NodeSecurity,
    api_pods: &ApiPods,
    refusals: &Refusals,
) -> (mpsc::Receiver<Vec<PodChange>>, SourcesReady) {
    let config = &agent.config;
    let api = agent
        .api
        .as_ref()
        .map(|api| source::apiserver::ApiSourceConfig {
            client: api.watch.clone(),
            on_refused: api_pods.status_sync.as_ref().map(|_| {
                let refusals = refusals.clone();
                let tell: source::apiserver::OnRefused =
                    Arc::new(move |pod, reason, message| refusals.refused(pod, reason, message));
                tell
            }),
            view: api_pods.view.clone(),
        });
    let (changes, ready, _problems) = source::spawn_sources(
        SourceConfig {
            node_name: config.node_name.clone(),
            static_pod_path: agent.plan.static_pod_path.clone(),
            file_check_frequency: config.file_check_frequency,
            static_pod_url: agent.plan.static_pod_url.clone(),
            static_pod_url_header: config.static_pod_url_header.clone(),
            http_check_frequency: config.http_check_frequency,
            security: Arc::new(security),
            api,
        },
        &agent.tracker,
        agent.cancel.clone(),
    );
    (changes, ready)
}

/// The executor: the runtime calls of a pod's sync. With managed pod cgroups it makes each
/// pod's cgroup (and the QoS loop starts); with a kubeconfig, the configMaps, secrets and
/// tokens the pods refer to are watched one by one, and a change pokes the pods that use it.
fn executor(
    agent: &Agent,
    node: &Arc<NodeContext>,
    details: DetailCache,
    pleg_state: &PlegState,
    facts: &NodeFacts,
    objects: Option<crate::kubelet::api_objects::ApiObjects>,
) -> Executor<CriClient> {
    let mut executor = Executor::new(
        agent.cri.clone(),
        node.clone(),
        details,
        agent.tuning.backoff,
        agent.events.clone(),
    )
    .with_container_settings(facts.container_settings.clone())
    .with_pleg(Arc::new(pleg_state.clone()));
    if let Some(cgroups) = &facts.cgroups {
        agent.tracker.spawn(super::cgroups::keep_qos_cgroups(
            cgroups.clone(),
            agent.cancel.clone(),
        ));
        executor = executor.with_cgroups(cgroups.clone());
    }
    if let Some(objects) = objects {
        executor = executor.with_api_objects(objects);
    }
    executor
}

/// With a kubeconfig, the objects pods refer to: the configMaps, secrets and tokens (the
/// token manager is the CSI drivers' too), and the Services for every container's service
/// variables.
fn api_objects(agent: &Agent, pokes: &Pokes) -> Option<crate::kubelet::api_objects::ApiObjects> {
    use crate::kubelet::api_objects::services::{ServiceView, watch};
    use crate::kubelet::api_objects::{ApiObjects, KubeObjectApi};
    let api = agent.api.as_ref()?;
    let objects = KubeObjectApi::new(api.watch.clone(), api.general.clone());
    let services = ServiceView::default();
    agent.tracker.spawn(watch(
        services.clone(),
        api.watch.clone(),
        agent.cancel.clone(),
    ));
    Some(
        ApiObjects::new(Arc::new(objects), pokes.clone(), agent.cancel.clone())
            .with_services(services),
    )
}

/// The probe manager, with its pages: `/metrics/probes` and `/debug/probes` (failing probes).
fn prober(agent: &Agent, node: &NodeContext, pokes: &Pokes) -> ProbeManager<CriClient> {
    let prober = ProbeManager::new(
        agent.cri.clone(),
        pokes.clone(),
        node.host_ip.clone(),
        agent.tracker.clone(),
        agent.events.clone(),
        agent.cancel.clone(),
    );
    {
        let prober = prober.clone();
        agent
            .metrics
            .register("/metrics/probes", move || prober.render_metrics());
    }
    {
        let prober = prober.clone();
        agent.metrics.register("/debug/probes", move || {
            serde_json::to_string(&prober.failing()).unwrap_or_default()
        });
    }
    prober
}

/// The pod workers, and `/metrics` (their counters, the PLEG's and the runtime's state).
/// The receiver hears of each worker that ends: unbounded, yet bounded in practice, as each
/// worker sends exactly one message.
fn workers(
    agent: &Agent,
    node: &NodeContext,
    executor: Executor<CriClient>,
    prober: ProbeManager<CriClient>,
    runtime_cache: &RuntimeCache,
    pleg_state: &PlegState,
    api_pods: &ApiPods,
) -> (PodWorkers<CriClient>, mpsc::UnboundedReceiver<String>) {
    let (done_tx, done_rx) = mpsc::unbounded_channel();
    let worker_stats = WorkerStats::default();
    {
        let stats = worker_stats.clone();
        let cache = runtime_cache.clone();
        let node_name = agent.config.node_name.clone();
        let pleg_state = pleg_state.clone();
        let dra = agent.dra.clone();
        agent.metrics.register("/metrics", move || {
            let own = format!(
                "{}{}{}{}",
                stats.render(),
                pleg_state.render_metrics(),
                crate::kubelet::volume::csi::stats::metrics(),
                dra.render_metrics()
            );
            crate::base::metrics::render(&current_state(&cache, &node_name), &own)
        });
    }
    let workers = PodWorkers::new(
        WorkerDeps {
            executor,
            prober,
            states: agent.states.clone(),
            runtime_cache: runtime_cache.clone(),
            sync_frequency: agent.config.sync_frequency,
            host_ip: node.host_ip.clone(),
            stats: worker_stats.clone(),
            status_sync: api_pods.status_sync.clone(),
            mirror_pods: api_pods.mirror_pods.clone(),
            panic_pod: agent.tuning.panic_pod.clone(),
        },
        agent.tracker.clone(),
        agent.cancel.clone(),
        done_tx,
    );
    (workers, done_rx)
}

/// With a kubeconfig: creates, replaces and deletes the mirror pods of static pods once the
/// sources are ready.
pub(super) fn start_mirror_pods(
    agent: &Agent,
    api: &super::cluster::ApiClients,
    mirrors: MirrorPods,
    sources_ready: &SourcesReady,
) {
    let (client, node_name, sources_ready, cancel) = (
        api.general.clone(),
        agent.config.node_name.clone(),
        sources_ready.clone(),
        agent.cancel.clone(),
    );
    agent.tasks.spawn("mirror-pods", move || {
        mirrors.clone().run(
            KubeMirrorApi::new(client.clone()),
            node_name.clone(),
            sources_ready.clone(),
            cancel.clone(),
        )
    });
}

/// Running pods and containers by state, from the last relist, for `/metrics`.
fn current_state(cache: &RuntimeCache, node_name: &str) -> crate::base::metrics::CurrentState {
    use crate::base::observed::{ContainerState, SandboxState};
    let mut state = crate::base::metrics::CurrentState {
        node_name: node_name.to_string(),
        running_pods: 0,
        containers: [
            ("created", 0),
            ("running", 0),
            ("exited", 0),
            ("unknown", 0),
        ],
    };
    for uid in cache.pod_uids() {
        let Some(pod) = cache.pod(&uid) else {
            continue;
        };
        if pod.sandboxes.iter().any(|s| s.state == SandboxState::Ready) {
            state.running_pods += 1;
        }
        for c in &pod.containers {
            let slot = match c.state {
                ContainerState::Created => 0,
                ContainerState::Running => 1,
                ContainerState::Exited => 2,
                ContainerState::Unknown => 3,
            };
            state.containers[slot].1 += 1;
        }
    }
    state
}
