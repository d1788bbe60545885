//! Wires Deckhand together and runs it until asked to stop.
//!
//! [`Plan::for_config`] first decides, from the configuration alone, which clients, managers
//! and endpoints exist; [`run`] then builds them part by part, each part in a builder of its
//! own:
//!
//! - `cluster`: the API server clients (TLS bootstrap, certificate rotation), events, and
//!   the Node's registration, status and Lease;
//! - `node`: the runtime handshake, the machine's facts, what the executor knows of the node;
//! - `cgroups`: the pod cgroups, kept current and swept of pods that are gone;
//! - `endpoints`: healthz, the read-only port, the local socket and the node API;
//! - `pods`: the pod pipeline (PLEG, sources, executor, probes, workers);
//! - `housekeeping`: disk GC and the eviction manager;
//! - `sync`: admission, the sync loop (with graceful node shutdown) and its supervision.
//!
//! Order of start: runtime handshake (fail fast and clearly), HTTP endpoints, PLEG, sources,
//! sync loop, then readiness to systemd. On shutdown every task ends; containers keep running,
//! so a restarted agent adopts them (upstream behaviour).

mod cgroups;
mod cluster;
mod devices;
mod endpoints;
mod housekeeping;
mod node;
pub(crate) mod plan;
mod pods;
mod sync;
mod tuning;

use std::time::Duration;

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::base::health::Health;
use crate::base::supervisor::Supervisor;
use crate::clients::cri::{CriClient, CriError};
use crate::config::Config;
use crate::endpoints::read_only::{Metrics, ServeError};
use crate::kubelet::devices::DeviceManager;
use crate::kubelet::events::Recorder;
use crate::kubelet::pleg::RuntimeCache;
use crate::kubelet::pod_status::published::PodStates;

pub use plan::Plan;
pub use tuning::{Tuning, TuningError};

use cluster::ApiClients;

/// How long start-up waits for the runtime to report RuntimeReady and NetworkReady.
pub const RUNTIME_READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a Node or Lease request may take before it is abandoned and retried.
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a watch may stay silent before it is taken for dead (the API server ends each
/// watch request within 290 s, and sends bookmarks meanwhile).
const WATCH_READ_TIMEOUT: Duration = Duration::from_secs(330);
/// How long shutdown waits for tasks to end.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long shutdown waits for each HTTP server after the tasks.
const SERVER_STOP_TIMEOUT: Duration = Duration::from_secs(2);
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
    /// `protectKernelDefaults: true` and a kernel tunable differs from upstream's value.
    #[error(transparent)]
    KernelDefaults(#[from] crate::kubelet::cm::kernel::KernelDefaultsError),
    /// The cgroup root is missing, or kubepods and the QoS cgroups cannot be made.
    #[error("setting up the pod cgroups: {0}")]
    Cgroups(#[from] crate::kubelet::cm::CgroupError),
    /// The node's user-namespace ID range breaks upstream's rules, or a pod's mappings file
    /// cannot be read back (upstream's kubelet does not start either).
    #[error("user namespaces: {0}")]
    Userns(Box<dyn std::error::Error + Send + Sync>),
    /// The sync loop died: nothing would sync pods any more, so the agent stops (its service
    /// manager starts it again, and the new agent adopts the pods, which keep running).
    #[error("the sync loop ended unexpectedly: {0}")]
    SyncLoopEnded(String),
}

/// What every builder after the runtime handshake reads: the configuration and its plan,
/// the two clients, and the state the parts share. One value instead of a dozen arguments
/// to each builder.
struct Agent {
    config: Config,
    plan: Plan,
    tuning: Tuning,
    cri: CriClient,
    /// With a kubeconfig.
    api: Option<ApiClients>,
    /// Events: logged always, and written to the API server when there is one.
    events: Recorder,
    health: Health,
    states: PodStates,
    /// The device plugin manager (upstream's `cm/devicemanager`).
    devices: DeviceManager,
    /// The DRA manager (upstream's `cm/dra`), its claims restored from the checkpoint.
    dra: crate::kubelet::dra::DraManager,
    metrics: Metrics,
    /// Every task of the agent but the HTTP servers, so shutdown can wait for them.
    tracker: TaskTracker,
    /// Starts the background tasks on `tracker` and restarts any that panics.
    tasks: Supervisor,
    cancel: CancellationToken,
}

impl Agent {
    /// The shared state, then the event recorder (its sink is the first tracked task).
    fn assemble(
        config: Config,
        plan: Plan,
        tuning: Tuning,
        cri: CriClient,
        api: Option<ApiClients>,
        cancel: CancellationToken,
    ) -> Agent {
        let tracker = TaskTracker::new();
        let health = Health::default();
        // Before any pod is admitted: the checkpoint says which devices running containers hold.
        let devices = DeviceManager::new(&config.root_dir);
        let dra = crate::kubelet::dra::DraManager::new(
            &config.root_dir,
            api.as_ref().map(|api| api.general.clone()),
        );
        // Before any driver registers: the node's slices left from before go (upstream's
        // start-up wipe); a driver publishes its own again when it registers.
        dra.start_slice_wipes(&config.node_name, cancel.clone());
        let tasks = Supervisor::new(
            tracker.clone(),
            cancel.clone(),
            &health,
            tuning.panic_task.clone(),
        );
        let events = cluster::events(&config.node_name, api.as_ref(), &tasks, &cancel);
        let agent = Agent {
            config,
            plan,
            tuning,
            cri,
            api,
            events,
            health,
            states: PodStates::default(),
            devices,
            dra,
            metrics: Metrics::default(),
            tracker,
            tasks,
            cancel,
        };
        let stats = agent.events.stats();
        agent
            .metrics
            .register("/metrics/events", move || stats.render());
        agent
    }
}

/// Runs the agent until `cancel` fires.
///
/// Each step below starts one part; the order is the order of start (later parts use what
/// earlier ones made); `wait_and_stop` then waits for the end and stops every part.
pub async fn run(
    config: Config,
    tuning: Tuning,
    cancel: CancellationToken,
) -> Result<(), DaemonError> {
    let plan = Plan::for_config(&config);
    preflight(&config, &plan, &tuning)?;
    // A kubeconfig that cannot be used stops the agent before anything starts.
    let (api, rotation) = match &plan.cluster {
        Some(cluster) => {
            let (api, rotation) = cluster::connect(&config, cluster, &tuning, &cancel).await?;
            (Some(api), rotation)
        }
        None => (None, None),
    };
    let cri = node::connect_runtime(&config, &plan).await?;
    let agent = Agent::assemble(config, plan, tuning, cri, api, cancel);
    cluster::start_rotation(&agent, rotation);
    // The node's facts and its cgroup tree come first: a node that cannot hold pods says so
    // and stops before it answers as healthy.
    let facts = node::NodeFacts::read(&agent.config, agent.plan.pod_cgroups)?;
    let stats = endpoints::stats_provider(&agent, facts.cgroups.as_ref());
    let mut servers = endpoints::serve_local(&agent, &stats).await?;
    let node = node::context(&agent, &facts);
    let runtime_cache = RuntimeCache::default();
    if let Some(node_api) = &agent.plan.node_api {
        servers.push(
            endpoints::serve_node_api(&agent, node_api, facts.host_ip, &runtime_cache, &stats)
                .await?,
        );
    }
    // Free memory the allocator keeps after bursts goes back to the kernel once a minute.
    let cancel = agent.cancel.clone();
    agent.tasks.spawn("heap-trim", move || {
        crate::app::heap_trim::run(cancel.clone())
    });
    let pods::PodPipeline {
        workers,
        changes,
        sources_ready,
        pokes,
        done,
        mirror_pods,
        refusals,
    } = pods::build(&agent, &node, &facts, &runtime_cache).await;
    devices::start(&agent, &sources_ready);
    let image_gc = housekeeping::start_gc(&agent, &workers, &sources_ready);
    if let (Some(mirrors), Some(api)) = (mirror_pods, &agent.api) {
        pods::start_mirror_pods(&agent, api, mirrors, &sources_ready);
    }
    let (pressure, evictions) = housekeeping::start_eviction(
        &agent,
        &workers,
        &sources_ready,
        &image_gc,
        facts.cgroups.clone(),
    );
    let (admission, node_tx) = sync::admission(&agent, &facts, refusals, &pressure);
    if let Some(cgroups) = &facts.cgroups {
        cgroups::start_orphan_sweep(&agent, cgroups.clone(), &workers, &runtime_cache);
    }
    let (sync_loop, shutdown) = sync::sync_loop(
        &agent,
        workers,
        sources_ready,
        runtime_cache,
        admission,
        evictions,
    );
    let loop_ended = sync::supervise(&agent, sync_loop, changes, pokes, done);
    if let Some(api) = &agent.api {
        cluster::start_membership(&agent, api, node_tx, &pressure, &shutdown);
    }
    notify_ready();
    wait_and_stop(agent, servers, loop_ended).await
}

/// Says what starts, and refuses a configuration this machine cannot serve before anything
/// starts: the systemd driver needs systemd; `protectKernelDefaults` needs the kernel's
/// tunables at upstream's values.
fn preflight(config: &Config, plan: &Plan, tuning: &Tuning) -> Result<(), DaemonError> {
    tracing::info!("starting: {}", config.summary());
    for warning in &config.warnings {
        tracing::warn!("configuration: {warning}");
    }
    if plan.require_systemd {
        crate::kubelet::cm::systemd::check_running(std::path::Path::new(
            crate::kubelet::cm::systemd::SYSTEMD_RUNNING_MARKER,
        ))?;
    }
    check_kernel_tunables(config, tuning)?;
    Ok(())
}

/// `protectKernelDefaults`: refuses the start when a tunable differs (upstream's container
/// manager does the same); otherwise says which differ and leaves them (upstream would write
/// them: see `kubelet::cm::kernel`).
fn check_kernel_tunables(config: &Config, tuning: &Tuning) -> Result<(), DaemonError> {
    use crate::kubelet::cm::kernel::{self, KernelDecision};
    let root = tuning
        .proc_sys
        .clone()
        .unwrap_or_else(|| std::path::PathBuf::from(kernel::PROC_SYS));
    let readings = kernel::read_tunables(&root);
    match kernel::decide(&readings, config.hardening.protect_kernel_defaults)? {
        KernelDecision::Fine => {}
        KernelDecision::LeaveAlone(mismatches) => {
            let list: Vec<String> = mismatches.iter().map(ToString::to_string).collect();
            tracing::info!(
                "kernel tunables differ from upstream's kubelet values and are left as they are (protectKernelDefaults is false; Deckhand never writes them): {}",
                list.join("; ")
            );
        }
    }
    Ok(())
}

/// Tells systemd we are up (a no-op when not started by systemd).
fn notify_ready() {
    if let Err(err) = sd_notify::notify(false, &[sd_notify::NotifyState::Ready]) {
        tracing::debug!(error = %err, "sd_notify failed");
    }
    tracing::info!("deckhand is running");
}

/// Runs until `cancel` fires or the sync loop ends, then stops: every tracked task is given
/// [`SHUTDOWN_TIMEOUT`], then each HTTP server a little more. Containers keep running. A sync
/// loop that ended on its own is the error the agent exits with.
async fn wait_and_stop(
    agent: Agent,
    servers: Vec<JoinHandle<()>>,
    mut loop_ended: oneshot::Receiver<String>,
) -> Result<(), DaemonError> {
    let mut failure = None;
    tokio::select! {
        _ = agent.cancel.cancelled() => {}
        why = &mut loop_ended => {
            failure = why.ok();
            agent.cancel.cancel();
        }
    }
    tracing::info!("shutting down; containers keep running");
    let _ = sd_notify::notify(false, &[sd_notify::NotifyState::Stopping]);
    agent.tracker.close();
    if tokio::time::timeout(SHUTDOWN_TIMEOUT, agent.tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!("some tasks did not end in time");
    }
    for s in servers {
        let _ = tokio::time::timeout(SERVER_STOP_TIMEOUT, s).await;
    }
    match failure {
        Some(why) => Err(DaemonError::SyncLoopEnded(why)),
        None => Ok(()),
    }
}
