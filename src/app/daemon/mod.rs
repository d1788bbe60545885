//! Wires Deckhand together and runs it until asked to stop.
//!
//! Order of start: runtime handshake (fail fast and clearly), HTTP endpoints, PLEG, sources,
//! sync loop, then readiness to systemd. On shutdown every task ends; containers keep running,
//! so a restarted agent adopts them (upstream behaviour).

use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::base::health::Health;
use crate::base::resync_queue::Pokes;
use crate::clients::cri::{self, CriClient, CriError};
use crate::config::Config;
use crate::endpoints::read_only::Metrics;
use crate::endpoints::read_only::{self, ServeError};
use crate::kubelet::admission::NodeSource;
use crate::kubelet::pleg::{self, PlegConfig, RuntimeCache};
use crate::kubelet::pod_status::published::PodStates;
use crate::kubelet::pod_workers::{PodWorkers, WorkerDeps, WorkerStats, panic_message};
use crate::kubelet::prober::ProbeManager;
use crate::kubelet::runtime::executor::{Executor, NodeContext};
use crate::kubelet::runtime::inspect::DetailCache;
use crate::kubelet::runtime::translate::{HostDns, parse_resolv_conf};
use crate::kubelet::source::{self, SourceConfig};
use crate::kubelet::sync_loop::{Admission, Refusals, SyncLoop, SyncLoopHealth};
use tracing::Instrument;

pub mod plan;
mod tuning;

pub use plan::Plan;
pub use tuning::{Tuning, TuningError};

/// How long start-up waits for the runtime to report RuntimeReady and NetworkReady.
pub const RUNTIME_READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a Node or Lease request may take before it is abandoned and retried.
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a watch may stay silent before it is taken for dead (the API server ends each
/// watch request within 290 s, and sends bookmarks meanwhile).
const WATCH_READ_TIMEOUT: Duration = Duration::from_secs(330);
/// How long shutdown waits for tasks to end.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
/// Where the cgroup hierarchies are mounted.
const CGROUP_MOUNT: &str = "/sys/fs/cgroup";

/// Why the agent could not run.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Runtime(#[from] CriError),
    #[error(transparent)]
    Serve(#[from] ServeError),
    /// The kubeconfig (or a file it names) cannot be used.
    #[error(transparent)]
    Apiserver(#[from] crate::clients::apiserver::ConnectError),
    /// The node API (port 10250) could not start.
    #[error(transparent)]
    NodeApi(#[from] crate::endpoints::node_api::NodeApiError),
    /// TLS bootstrap could not finish.
    #[error(transparent)]
    Bootstrap(#[from] crate::kubelet::certificate::bootstrap::BootstrapError),
    /// `cgroupDriver: systemd` on a machine where systemd does not run.
    #[error(transparent)]
    Systemd(#[from] crate::kubelet::cm::systemd::SystemdNotRunning),
    /// The cgroup root is missing, or kubepods and the QoS cgroups cannot be made.
    #[error("setting up the pod cgroups: {0}")]
    Cgroups(#[from] crate::kubelet::cm::CgroupError),
    /// The sync loop died: nothing would sync pods any more, so the agent stops (its service
    /// manager starts it again, and the new agent adopts the pods, which keep running).
    #[error("the sync loop ended unexpectedly: {0}")]
    SyncLoopEnded(String),
}

/// The cgroup side of the start (upstream's container manager): the cgroup version, the
/// container settings translation needs, and with the cgroupfs driver and `cgroupsPerQOS`
/// the manager, after it made `kubepods` (limited to allocatable when
/// `enforceNodeAllocatable` has `pods`) and the QoS cgroups.
fn setup_cgroups(
    config: &Config,
    capacity: &crate::kubelet::node::allocatable::Amounts,
) -> Result<
    (
        Option<Arc<crate::kubelet::cm::CgroupManager>>,
        crate::kubelet::cm::ContainerSettings,
    ),
    DaemonError,
> {
    use crate::kubelet::cm::{
        CfsSettings, CgroupManager, ContainerSettings, HostCgroupFs, ManagerSettings,
    };
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
    if !config.cgroups_per_qos {
        return Ok((None, settings));
    }
    if config.cgroup_driver == crate::config::CgroupDriver::Systemd {
        // Slices are made by systemd on the runtime's request; Deckhand does not talk to
        // systemd, so pod-level limits are not written with this driver.
        tracing::warn!(
            "with the systemd cgroup driver the runtime creates the pod slices; pod-level cgroup limits and kubepods enforcement are not applied"
        );
        return Ok((None, settings));
    }
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
    let node = crate::kubelet::cm::allocatable::NodeCapacity {
        cpu_millis: capacity.cpu_millis,
        memory_bytes: capacity.memory_bytes,
        pids: crate::kubelet::cm::allocatable::NodeCapacity::read_pids(std::path::Path::new(
            "/proc/sys/kernel",
        )),
        hugepages: capacity.hugepages.clone(),
    };
    let enforce_pods = config
        .enforce_node_allocatable
        .iter()
        .any(|l| l == crate::config::ENFORCE_PODS);
    let kubepods =
        crate::kubelet::cm::allocatable::kubepods_config(&node, &config.reservations, enforce_pods);
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
    Ok((Some(Arc::new(manager)), settings))
}

/// How often the QoS cgroups are written again from the active pods (upstream's period),
/// besides each time a pod's cgroup is made or a pod ends: whatever changed them meanwhile is
/// set right.
const QOS_CGROUP_PERIOD: Duration = Duration::from_secs(60);

async fn keep_qos_cgroups(
    cgroups: Arc<crate::kubelet::cm::CgroupManager>,
    cancel: CancellationToken,
) {
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

fn host_dns(config: &Config) -> HostDns {
    if config.resolv_conf.as_os_str().is_empty() {
        return HostDns::default();
    }
    match std::fs::read_to_string(&config.resolv_conf) {
        Ok(text) => parse_resolv_conf(&text),
        Err(err) => {
            tracing::warn!(path = %config.resolv_conf.display(), error = %err, "cannot read resolvConf; pods get no DNS servers from the node");
            HostDns::default()
        }
    }
}

/// The node API's serving certificate: requested by CSR with `serverTLSBootstrap` (the
/// slot stays empty, and handshakes fail, until the CSR is approved and signed), else
/// `tlsCertFile`/`tlsPrivateKeyFile`, else a self-signed one in the cert dir.
fn serving_certificate(
    config: &Config,
    host_ip: Option<std::net::IpAddr>,
    api: Option<&kube::Client>,
    cancel: &CancellationToken,
) -> Result<crate::endpoints::node_api::ServingSlot, crate::endpoints::node_api::NodeApiError> {
    use crate::endpoints::node_api::tls;
    if config.server.server_tls_bootstrap {
        match api {
            Some(client) => {
                let slot = crate::endpoints::node_api::ServingSlot::default();
                let manager = crate::kubelet::certificate::serving::ServingRotation {
                    api: crate::kubelet::certificate::csr::KubeCsrApi(client.clone()),
                    slot: slot.clone(),
                    store: crate::kubelet::certificate::FileStore::serving(&config.cert_dir),
                    node_name: config.node_name.clone(),
                    addresses: crate::kubelet::certificate::serving::node_addresses(
                        &config.node_name,
                        host_ip,
                    ),
                };
                tokio::spawn(manager.run(cancel.clone()));
                return Ok(slot);
            }
            None => tracing::warn!(
                "serverTLSBootstrap needs --kubeconfig; using a self-signed serving certificate"
            ),
        }
    }
    let credentials = match &config.server.tls_files {
        Some((cert, key)) => tls::load_pair(cert, key)?,
        None => {
            let (cert, key) = crate::config::ServerSettings::self_signed_paths(&config.cert_dir);
            tls::self_signed(
                &cert,
                &key,
                &config.node_name,
                &host_ip.into_iter().collect::<Vec<_>>(),
            )?
        }
    };
    Ok(crate::endpoints::node_api::ServingSlot::with(credentials))
}

/// Runs the agent until `cancel` fires.
pub async fn run(
    config: Config,
    tuning: Tuning,
    cancel: CancellationToken,
) -> Result<(), DaemonError> {
    tracing::info!("starting: {}", config.summary());
    for warning in &config.warnings {
        tracing::warn!("configuration: {warning}");
    }
    // The systemd driver needs systemd; say so before anything starts.
    if config.cgroup_driver == crate::config::CgroupDriver::Systemd {
        crate::kubelet::cm::systemd::check_running(std::path::Path::new(
            crate::kubelet::cm::systemd::SYSTEMD_RUNNING_MARKER,
        ))?;
    }

    // A kubeconfig that cannot be used stops the agent before anything starts. Two clients:
    // one for the node's heartbeats and pod status (short time-outs), one that watches pods.
    let api_clients = match &config.kubeconfig {
        Some(path) => {
            let options = crate::clients::apiserver::ClientOptions {
                qps: config.cluster.kube_api_qps,
                burst: config.cluster.kube_api_burst,
                timeout: HEARTBEAT_TIMEOUT,
                read_timeout: HEARTBEAT_TIMEOUT,
            };
            // TLS bootstrap: a missing or unusable kubeconfig is replaced by one naming a
            // certificate requested with the bootstrap kubeconfig.
            let store = crate::kubelet::certificate::FileStore::new(&config.cert_dir);
            if let Some(bootstrap) = &config.bootstrap_kubeconfig {
                crate::kubelet::certificate::bootstrap::load_client_cert(
                    path,
                    bootstrap,
                    &store,
                    &config.node_name,
                    &cancel,
                )
                .await?;
            }
            // With rotation, every client presents the certificate of a shared slot that the
            // rotation loop replaces.
            let slot = if config.rotate_certificates {
                let current = crate::kubelet::certificate::bootstrap::current_credentials(&store);
                if current.is_none() {
                    tracing::warn!(cert_dir = %config.cert_dir.display(), "rotateCertificates is on, but the cert dir holds no current client certificate (kubelet-client-current.pem); not rotating");
                }
                current.map(crate::kubelet::certificate::CertSlot::new)
            } else {
                None
            };
            let connect = |options: crate::clients::apiserver::ClientOptions| {
                let slot = slot.clone();
                async move {
                    match &slot {
                        Some(slot) => {
                            crate::clients::apiserver::connect_rotating(
                                path,
                                &options,
                                slot.resolver(),
                            )
                            .await
                        }
                        None => crate::clients::apiserver::connect(path, &options).await,
                    }
                }
            };
            let heartbeat = connect(options.clone()).await?;
            let watch = connect(crate::clients::apiserver::ClientOptions {
                read_timeout: WATCH_READ_TIMEOUT,
                ..options.clone()
            })
            .await?;
            // Events have a rate limit of their own (eventRecordQPS, eventBurst), so a burst
            // of them never holds up a status write.
            let events = connect(crate::clients::apiserver::ClientOptions {
                qps: if config.cluster.event_record_qps > 0.0 {
                    config.cluster.event_record_qps
                } else {
                    -1.0
                },
                burst: config.cluster.event_burst,
                ..options.clone()
            })
            .await?;
            if let Some(slot) = slot {
                let rotation = crate::kubelet::certificate::manager::Rotation {
                    api: crate::kubelet::certificate::csr::KubeCsrApi(heartbeat.clone()),
                    slot,
                    store,
                    node_name: config.node_name.clone(),
                    rotate_after: tuning.cert_rotate_after,
                };
                tokio::spawn(rotation.run(cancel.clone()));
            }
            Some((heartbeat, watch, events))
        }
        None => None,
    };

    let endpoint = cri::parse_endpoint(&config.container_runtime_endpoint)?;
    if let Some(image_ep) = &config.image_service_endpoint
        && image_ep != &config.container_runtime_endpoint
    {
        tracing::warn!(%image_ep, "a separate image service endpoint is not supported yet; using the runtime endpoint for images");
    }
    let client = CriClient::connect(&endpoint, config.runtime_request_timeout).await?;
    cri::handshake(&client, &endpoint.original, RUNTIME_READY_TIMEOUT).await?;

    let health = Health::default();
    let states = PodStates::default();
    let metrics = Metrics::default();
    let tracker = TaskTracker::new();
    // Events: logged always, and written to the API server when there is one.
    let events = match &api_clients {
        Some((_, _, client)) => {
            let (recorder, queue) = crate::kubelet::events::Recorder::to_api(&config.node_name);
            tracker.spawn(crate::kubelet::events::sink::run(
                crate::kubelet::events::sink::KubeEventSink::new(client.clone()),
                queue,
                recorder.stats(),
                cancel.clone(),
            ));
            recorder
        }
        None => crate::kubelet::events::Recorder::log_only(&config.node_name),
    };
    {
        let stats = events.stats();
        metrics.register("/metrics/events", move || stats.render());
    }
    // The node's facts and its cgroup tree come first: a node that cannot hold pods says so
    // and stops before it answers as healthy.
    let host_ip = crate::kubelet::node::detect_host_ip(config.node_ip);
    let machine = crate::kubelet::node::MachineFacts::read(&config.root_dir);
    let node_memory_bytes = machine.memory_bytes;
    let capacity = crate::kubelet::node::allocatable::capacity(&machine, config.max_pods);
    let allocatable =
        crate::kubelet::node::allocatable::allocatable(&capacity, &config.reservations);
    let (cgroups, container_settings) = setup_cgroups(&config, &capacity)?;
    // One stats provider for both ports, so both see the same rates and kept volume figures.
    let stats = Arc::new(
        crate::kubelet::stats::StatsProvider::new(
            Arc::new(client.clone()),
            Arc::new(crate::kubelet::stats::HostFiles::new(
                config.root_dir.clone(),
                config.pod_logs_dir.clone(),
                cgroups
                    .as_ref()
                    .map(|m| crate::kubelet::stats::host::PodCgroups {
                        mount: PathBuf::from(CGROUP_MOUNT),
                        kubepods: m.kubepods(),
                        v2: m.version() == crate::kubelet::cm::CgroupVersion::V2,
                    }),
                config.volume_stats_agg_period,
            )),
            config.node_name.clone(),
        )
        .with_sandboxes(Arc::new(crate::kubelet::stats::CriSandboxInspector::new(
            client.channel(),
            config.runtime_request_timeout,
        ))),
    );
    let mut servers = Vec::new();
    if config.healthz_port != 0 {
        let addr = SocketAddr::new(config.healthz_bind_address, config.healthz_port);
        servers.push(
            read_only::serve_healthz(addr, health.clone(), states.clone(), cancel.clone()).await?,
        );
    }
    if config.read_only_port != 0 {
        let addr = SocketAddr::new(config.address, config.read_only_port);
        servers.push(
            read_only::serve_read_only(
                addr,
                health.clone(),
                states.clone(),
                metrics.clone(),
                Some(stats.clone()),
                read_only::ListenerLimits::default(),
                cancel.clone(),
            )
            .await?,
        );
    }

    let socket = read_only::local_socket_path(&config.root_dir);
    match read_only::serve_local_socket(
        &socket,
        health.clone(),
        states.clone(),
        metrics.clone(),
        Some(stats.clone()),
        cancel.clone(),
    )
    .await
    {
        Ok(handle) => servers.push(handle),
        // Only `deckhand pods` needs it; the node runs its pods without it.
        Err(err) => tracing::warn!("{err}; `deckhand pods` will not reach this agent"),
    }

    let node = Arc::new(NodeContext {
        node_name: config.node_name.clone(),
        host_ip: host_ip.map(|ip| ip.to_string()),
        root_dir: config.root_dir.clone(),
        pod_logs_dir: config.pod_logs_dir.clone(),
        host_dns: host_dns(&config),
        cluster_domain: config.cluster_domain.clone(),
        cluster_dns: config.cluster_dns.iter().map(ToString::to_string).collect(),
        cgroup_driver: config.cgroup_driver,
        cgroup_root: config.cgroup_root.clone(),
        cgroups_per_qos: config.cgroups_per_qos,
        cgroup_fs: PathBuf::from(CGROUP_MOUNT),
        node_memory_bytes,
        allocatable: allocatable.for_downward_api(),
        runtime_request_timeout: config.runtime_request_timeout,
        image_pull_progress_deadline: config.image_pull_progress_deadline,
    });
    tracing::info!(host_ip = ?host_ip, node = %config.node_name, "node facts");
    if config.cluster_dns.is_empty() {
        tracing::warn!(
            "no clusterDNS is configured: pods with dnsPolicy \"ClusterFirst\" get the node's DNS settings (upstream's \"Default\")"
        );
    }

    let details = DetailCache::default();
    let runtime_cache = RuntimeCache::default();
    if config.server.enable_server {
        let state = crate::endpoints::node_api::NodeApiState {
            gate: Arc::new(crate::endpoints::node_api::auth::Gate::new(
                config.server.clone(),
                config.node_name.clone(),
                api_clients.as_ref().map(|(heartbeat, _, _)| {
                    crate::endpoints::node_api::review::KubeReviewer::shared(heartbeat.clone())
                }),
            )),
            health: health.clone(),
            pods: states.clone(),
            runtime: runtime_cache.clone(),
            streams: Arc::new(client.clone()),
            metrics: metrics.clone(),
            pod_logs_dir: config.pod_logs_dir.clone(),
            node_log_dir: PathBuf::from(crate::endpoints::node_api::node_logs::NODE_LOG_DIR),
            configz: Arc::new(
                serde_json::to_vec(&crate::endpoints::node_api::configz::configz(&config))
                    .unwrap_or_default(),
            ),
            stats: stats.clone(),
        };
        let slot = serving_certificate(
            &config,
            host_ip,
            api_clients.as_ref().map(|c| &c.0),
            &cancel,
        )?;
        servers.push(
            crate::endpoints::node_api::serve(
                SocketAddr::new(config.address, config.port),
                state,
                slot,
                &config.server,
                read_only::ListenerLimits::default(),
                cancel.clone(),
            )
            .await?,
        );
    }
    // Free memory the allocator keeps after bursts goes back to the kernel once a minute.
    tracker.spawn(crate::app::heap_trim::run(cancel.clone()));
    // The PLEG and the probe workers ask for looks at pods through one coalescing set.
    let pokes = Pokes::default();
    // The PLEG follows the runtime's events where it can, and tells the workers whether it does.
    let pleg_state = pleg::PlegState::default();
    tracker.spawn(pleg::run(
        client.clone(),
        Some(pleg::feed::RuntimeFeed::new(client.channel())),
        details.clone(),
        runtime_cache.clone(),
        pokes.clone(),
        health.clone(),
        pleg_state.clone(),
        PlegConfig {
            node_name: config.node_name.clone(),
            ..tuning.pleg.clone()
        },
        cancel.clone(),
    ));

    let security = source::validate::validate_security::detect_node_security(
        &config.allowed_unsafe_sysctls,
        &client,
    )
    .await;
    // With a kubeconfig: what the API server says of the node's pods (mirror pods included),
    // the mirror pods of static pods, and pod status to the API server (for its pods and, on
    // their mirror pods, for static pods; and refusals, deletions).
    let api_view = source::apiserver::ApiPodsView::default();
    let mirror_pods = api_clients
        .as_ref()
        .map(|_| crate::kubelet::mirror_pods::MirrorPods::new(api_view.clone()));
    let status_sync =
        api_clients
            .as_ref()
            .zip(mirror_pods.as_ref())
            .map(|((heartbeat, _, _), mirrors)| {
                let (handle, writer) = crate::kubelet::pod_status::api_writer::start(
                    heartbeat.clone(),
                    states.clone(),
                    api_view.clone(),
                    mirrors.clone(),
                    cancel.clone(),
                );
                tracker.spawn(writer);
                handle
            });
    // Every refusal, the API server source's and admission's, is told the same way: an
    // event, and the pod's status in the API server.
    let refusals = Refusals::new(events.clone(), status_sync.clone());
    let (changes_rx, sources_ready, _problems) = source::spawn_sources(
        SourceConfig {
            node_name: config.node_name.clone(),
            static_pod_path: config.static_pod_path.clone(),
            file_check_frequency: config.file_check_frequency,
            static_pod_url: config.static_pod_url.clone(),
            static_pod_url_header: config.static_pod_url_header.clone(),
            http_check_frequency: config.http_check_frequency,
            security: Arc::new(security),
            api: api_clients
                .as_ref()
                .map(|(_, watch, _)| source::apiserver::ApiSourceConfig {
                    client: watch.clone(),
                    on_refused: status_sync.as_ref().map(|_| {
                        let refusals = refusals.clone();
                        let tell: source::apiserver::OnRefused =
                            Arc::new(move |pod, reason, message| {
                                refusals.refused(pod, reason, message)
                            });
                        tell
                    }),
                    view: api_view.clone(),
                }),
        },
        &tracker,
        cancel.clone(),
    );

    let mut executor = Executor::new(
        client.clone(),
        node.clone(),
        details,
        tuning.backoff,
        events.clone(),
    )
    .with_container_settings(container_settings)
    .with_pleg(Arc::new(pleg_state.clone()));
    // The eviction manager counts each pod's processes in its cgroup.
    let eviction_cgroups = cgroups.clone();
    let orphan_cgroups = cgroups.clone();
    if let Some(cgroups) = cgroups {
        tracker.spawn(keep_qos_cgroups(cgroups.clone(), cancel.clone()));
        executor = executor.with_cgroups(cgroups);
    }
    // With a kubeconfig: the configMaps, secrets and tokens the pods refer to, watched one by
    // one; a change pokes the pods that refer to the object.
    if let Some((heartbeat, watch, _)) = &api_clients {
        let api = crate::kubelet::api_objects::KubeObjectApi::new(watch.clone(), heartbeat.clone());
        executor = executor.with_api_objects(crate::kubelet::api_objects::ApiObjects::new(
            Arc::new(api),
            pokes.clone(),
            cancel.clone(),
        ));
    }
    let prober = ProbeManager::new(
        client.clone(),
        pokes.clone(),
        node.host_ip.clone(),
        tracker.clone(),
        events.clone(),
        cancel.clone(),
    );
    {
        let prober = prober.clone();
        metrics.register("/metrics/probes", move || prober.render_metrics());
    }
    {
        let prober = prober.clone();
        metrics.register("/debug/probes", move || {
            serde_json::to_string(&prober.failing()).unwrap_or_default()
        });
    }
    // Unbounded, yet bounded in practice: each worker sends exactly one message, when it ends.
    let (done_tx, done_rx) = mpsc::unbounded_channel();
    let worker_stats = WorkerStats::default();
    {
        let stats = worker_stats.clone();
        let cache = runtime_cache.clone();
        let node_name = config.node_name.clone();
        let pleg_state = pleg_state.clone();
        metrics.register("/metrics", move || {
            let own = format!("{}{}", stats.render(), pleg_state.render_metrics());
            crate::base::metrics::render(&current_state(&cache, &node_name), &own)
        });
    }
    let workers = PodWorkers::new(
        WorkerDeps {
            executor,
            prober,
            states: states.clone(),
            runtime_cache: runtime_cache.clone(),
            sync_frequency: config.sync_frequency,
            host_ip: node.host_ip.clone(),
            stats: worker_stats.clone(),
            status_sync,
            mirror_pods: mirror_pods.clone(),
            panic_pod: tuning.panic_pod.clone(),
        },
        tracker.clone(),
        cancel.clone(),
        done_tx,
    );
    // Housekeeping of the disk: dead containers and sandboxes, unused images, large logs. The
    // image record is shared with the eviction manager's reclaim.
    let image_gc = crate::kubelet::gc::run::ImageGc::shared();
    {
        let ready = sources_ready.clone();
        crate::kubelet::gc::run::spawn(
            crate::kubelet::gc::run::GcContext {
                rt: client.clone(),
                node_name: config.node_name.clone(),
                pod_logs_dir: config.pod_logs_dir.clone(),
                activity: workers.activity(),
                sources_ready: Arc::new(move || ready.all_ready()),
            },
            &config.gc,
            config.pod_infra_container_image.as_slice(),
            image_gc.clone(),
            crate::kubelet::gc::run::GcPeriods {
                container_gc: tuning
                    .container_gc_period
                    .unwrap_or(crate::kubelet::gc::run::CONTAINER_GC_PERIOD),
                image_gc: tuning
                    .image_gc_period
                    .unwrap_or(crate::kubelet::gc::run::IMAGE_GC_PERIOD),
                log_monitor: tuning
                    .log_monitor_interval
                    .unwrap_or(config.gc.container_log_monitor_interval),
            },
            &tracker,
            cancel.clone(),
        );
    }
    if let (Some(mirrors), Some((heartbeat, _, _))) = (mirror_pods, api_clients.as_ref()) {
        tracker.spawn(mirrors.run(
            crate::kubelet::mirror_pods::KubeMirrorApi::new(heartbeat.clone()),
            config.node_name.clone(),
            sources_ready.clone(),
            cancel.clone(),
        ));
    }
    // The eviction manager: pressure conditions for the node status and admission, node-level
    // reclaim through the GC passes, and evictions carried out by the sync loop.
    let pressure = crate::kubelet::eviction::PressureView::default();
    let (evict_tx, evict_rx) = mpsc::channel(4);
    {
        let ready = sources_ready.clone();
        let gc_ctx = crate::kubelet::gc::run::GcContext {
            rt: client.clone(),
            node_name: config.node_name.clone(),
            pod_logs_dir: config.pod_logs_dir.clone(),
            activity: workers.activity(),
            sources_ready: Arc::new(move || ready.all_ready()),
        };
        let manager = crate::kubelet::eviction::manager::Manager::new(
            crate::kubelet::eviction::manager::ManagerSettings {
                thresholds: crate::kubelet::eviction::signals::thresholds(
                    &config.reservations.eviction_hard,
                    &config.eviction,
                ),
                pressure_transition_period: config.eviction.pressure_transition_period,
                max_pod_grace_period_seconds: config.eviction.max_pod_grace_period_seconds,
                monitoring_period: tuning
                    .eviction_monitoring_period
                    .unwrap_or(crate::kubelet::eviction::MONITORING_PERIOD),
                node_name: config.node_name.clone(),
            },
            crate::kubelet::eviction::observe::LiveObserver {
                cgroups: eviction_cgroups,
                ..crate::kubelet::eviction::observe::LiveObserver::new(
                    client.clone(),
                    config.node_name.clone(),
                    config.root_dir.clone(),
                    config.pod_logs_dir.clone(),
                )
            },
            crate::kubelet::eviction::observe::GcReclaimer {
                ctx: gc_ctx,
                images: image_gc.clone(),
                min_image_age: config.gc.image_minimum_gc_age,
                keep_images: config.pod_infra_container_image.iter().cloned().collect(),
            },
            crate::kubelet::eviction::observe::SyncLoopEvictor { tx: evict_tx },
            states.clone(),
            pressure.clone(),
            events.clone(),
        );
        // kernelMemcgNotification: a round also when the kernel says memory crossed a
        // threshold; where that cannot work (cgroup v2), said once, and polling goes on.
        let manager = if !config.eviction.kernel_memcg_notification {
            manager
        } else {
            match crate::kubelet::eviction::memcg::CgroupV1Memcg::detect(std::path::Path::new(
                CGROUP_MOUNT,
            )) {
                Ok(control) => manager.with_memcg(
                    crate::kubelet::eviction::memcg::MemcgNotifier::new(Box::new(control)),
                ),
                Err(err) => {
                    tracing::warn!(error = %err, "kernelMemcgNotification: no memory threshold notifications here; polling every monitoring period only");
                    manager
                }
            }
        };
        let last = manager.last.clone();
        metrics.register("/debug/eviction", move || {
            let last = last.lock().unwrap_or_else(|e| e.into_inner()).clone();
            serde_json::to_string(&last).unwrap_or_default()
        });
        tracker.spawn(manager.run(cancel.clone()));
    }
    // Admission checks new pods against the node as configured and, once the node agent has
    // it back from the API server, the Node's own labels and taints.
    let (node_tx, node_rx) = tokio::sync::watch::channel(None);
    let admission_node = crate::kubelet::admission::NodeInfo {
        name: config.node_name.clone(),
        labels: crate::kubelet::node::registration::node_labels(&config.node_name, &config.cluster),
        taints: config.cluster.register_with_taints.clone(),
        allocatable: crate::kubelet::admission::Allocatable::from_quantities(
            &allocatable.to_quantities(),
        ),
    };
    let admission = Admission {
        node: if api_clients.is_some() {
            NodeSource::with_node_object(admission_node, node_rx)
        } else {
            NodeSource::fixed(admission_node)
        },
        states: states.clone(),
        refusals,
        pressure: pressure.clone(),
    };
    // Pod cgroups left behind by pods the node no longer has.
    if let Some(cgroups) = orphan_cgroups {
        let (activity, listed, known_runtime) = (
            workers.activity(),
            runtime_cache.clone(),
            runtime_cache.clone(),
        );
        let pods_dir = config.root_dir.join("pods");
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
        tracker.spawn(
            crate::kubelet::cm::orphans::run(cgroups, inputs, cancel.clone())
                .instrument(tracing::info_span!("orphan_cgroups")),
        );
    }
    let mut sync_loop =
        SyncLoop::new(workers, sources_ready, runtime_cache, admission).with_evictions(evict_rx);
    // Graceful node shutdown, when a grace period is configured: a delay lock from logind,
    // and the pods stopped in priority order when the node shuts down.
    let shutdown_status = crate::kubelet::shutdown::ShutdownStatus::default();
    let shutdown_buckets = config.shutdown.buckets();
    if !shutdown_buckets.is_empty() {
        let (control, control_rx) = crate::kubelet::sync_loop::SyncLoopControl::channel();
        sync_loop = sync_loop.with_control(control_rx, shutdown_status.clone());
        let manager = crate::kubelet::shutdown::Manager::new(
            crate::kubelet::shutdown::logind::SystemBus,
            control,
            crate::kubelet::shutdown::ManagerSettings {
                buckets: shutdown_buckets,
                state_file: config.root_dir.join(crate::kubelet::shutdown::STATE_FILE),
                events: events.clone(),
                node_name: config.node_name.clone(),
                volumes: Arc::new(crate::kubelet::shutdown::volumes::MountTable {
                    pods_dir: config.root_dir.join("pods"),
                    read: || {
                        crate::kubelet::volume::mountinfo::read()
                            .map(|table| table.into_iter().map(|e| e.mount_point).collect())
                    },
                }),
            },
            shutdown_status.clone(),
        );
        tracker.spawn(
            manager
                .run(cancel.clone())
                .instrument(tracing::info_span!("node_shutdown")),
        );
    }
    let loop_health = SyncLoopHealth::default();
    {
        let loop_health = loop_health.clone();
        health.register("syncloop", move || loop_health.check());
    }
    // The sync loop is supervised: if it panics or returns while the agent runs, the health
    // check says so and the agent stops with an error, to be restarted by its service manager.
    let (loop_ended_tx, mut loop_ended_rx) = tokio::sync::oneshot::channel::<String>();
    {
        let cancel = cancel.clone();
        let loop_health = loop_health.clone();
        let run = sync_loop.run(
            changes_rx,
            pokes,
            done_rx,
            loop_health.clone(),
            cancel.clone(),
        );
        tracker.spawn(async move {
            let why = match AssertUnwindSafe(run).catch_unwind().await {
                _ if cancel.is_cancelled() => return,
                Ok(()) => "it returned".to_string(),
                Err(payload) => format!("it panicked: {}", panic_message(payload.as_ref())),
            };
            tracing::error!(reason = %why, "the sync loop ended; the agent stops");
            loop_health.ended(why.clone());
            let _ = loop_ended_tx.send(why);
        });
    }

    // With a kubeconfig: register the Node, keep its status and Lease current. This talks to
    // the API server only; pods are untouched by anything it does or fails to do.
    if let Some((api_client, watch_client, _)) = api_clients {
        // Its own Node, watched, so admission sees label and taint changes at once.
        tracker.spawn(crate::kubelet::node::watch::run(
            watch_client,
            config.node_name.clone(),
            crate::kubelet::node::agent::NodePublisher::to(node_tx.clone()),
            cancel.clone(),
        ));
        let snapshots = crate::kubelet::node::agent::LiveSnapshots {
            cri: client.clone(),
            health: health.clone(),
            node_name: config.node_name.clone(),
            node_ip: config.node_ip,
            root_dir: config.root_dir.clone(),
            max_pods: config.max_pods,
            max_images: config.cluster.node_status_max_images,
            reservations: config.reservations.clone(),
            kubelet_port: config.port,
            pressure: pressure.clone(),
            shutdown: shutdown_status.clone(),
        };
        tracker.spawn(crate::kubelet::node::agent::run(
            crate::kubelet::node::api::KubeNodeApi::new(api_client),
            snapshots,
            crate::kubelet::node::agent::AgentSettings {
                node_name: config.node_name.clone(),
                cluster: config.cluster.clone(),
                status_update_frequency: config.node_status_update_frequency,
                published: crate::kubelet::node::agent::NodePublisher::to(node_tx),
            },
            crate::clients::apiserver::ProblemLog::default(),
            events.clone(),
            cancel.clone(),
        ));
    }

    // Tell systemd we are up (a no-op when not started by systemd).
    if let Err(err) = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]) {
        tracing::debug!(error = %err, "sd_notify failed");
    }
    tracing::info!("deckhand is running");

    let mut failure = None;
    tokio::select! {
        _ = cancel.cancelled() => {}
        why = &mut loop_ended_rx => {
            failure = why.ok();
            cancel.cancel();
        }
    }
    tracing::info!("shutting down; containers keep running");
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
    tracker.close();
    if tokio::time::timeout(SHUTDOWN_TIMEOUT, tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!("some tasks did not end in time");
    }
    for s in servers {
        let _ = tokio::time::timeout(Duration::from_secs(2), s).await;
    }
    match failure {
        Some(why) => Err(DaemonError::SyncLoopEnded(why)),
        None => Ok(()),
    }
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
