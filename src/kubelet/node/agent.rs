//! The node agent's side of cluster membership: register the Node, keep its status current,
//! renew its Lease. Runs only with `--kubeconfig`; it never touches pods, so an API server
//! outage leaves every pod as it is.
//!
//! Request budget at rest: one Lease update per renew interval and one status patch when the
//! status changed or `nodeStatusReportFrequency` passed. The status is compared against the
//! Node the API server last returned instead of being re-read every period; after any failed
//! request the next round re-reads it first, so a Node marked Unknown while we were cut off
//! is set right as soon as the API server answers.

use std::future::Future;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeStatus};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use super::allocatable::{allocatable, capacity};
use super::api::NodeApi;
use super::facts::MachineFacts;
use super::lease::{self, NodeRef};
use super::registration::{initial_node, reconcile_existing, status_patch};
use super::status::{
    ImageEntry, NodeSnapshot, Pressure, RuntimeCondition, RuntimeState, compute_node_status,
    condition_status, status_changed,
};
use crate::base::clock;
use crate::base::health::Health;
use crate::clients::apiserver::retry::{Backoff, pause};
use crate::clients::apiserver::{Problem, ProblemKind, ProblemLog};
use crate::clients::cri::{ImageService, RuntimeService};
use crate::config::{ClusterSettings, Reservations};
use crate::kubelet::events::{EventType, Recorder, node_ref, reason};

/// Upstream's `nodeStatusUpdateRetry`.
const STATUS_UPDATE_TRIES: u32 = 5;
/// How often the status is recomputed while the Node is not Ready yet (upstream's fast
/// status update after start), so Ready is reported as soon as it is true.
const FAST_UPDATE: Duration = Duration::from_millis(100);
/// How long the fast updates go on at most.
const FAST_UPDATE_FOR: Duration = Duration::from_secs(120);
/// The least time between two status rounds when a change (shutdown, device capacity) asks
/// for one early: a device plugin that flaps cannot make the node re-read the runtime and
/// patch its status more than about once a second.
const EARLY_UPDATE_GAP: Duration = Duration::from_secs(1);

/// How many status rounds re-read the Node after the Lease could not be renewed. While the
/// node was cut off, the controller manager may mark the Node Unknown, and it may do so a few
/// seconds after the API server is back, once it sees how old the Lease is; re-reading for
/// three rounds (30 s at the default period) finds that mark and sets the status right,
/// instead of waiting for the 5-minute report. (Upstream watches its own Node for this; a
/// watch of the Node would be the thorough fix.)
const REREADS_AFTER_LEASE_FAILURE: u32 = 3;

/// Status rounds still to re-read the Node, set by the Lease task when a renewal fails.
#[derive(Clone, Default)]
struct Rereads(Arc<AtomicU32>);

impl Rereads {
    fn after_lease_failure(&self) {
        self.0.store(REREADS_AFTER_LEASE_FAILURE, Ordering::Relaxed);
    }
    fn pending(&self) -> bool {
        self.0.load(Ordering::Relaxed) > 0
    }
    /// A round re-read the Node and sent the status.
    fn done_one(&self) {
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }
}

/// Gathers what the node status is computed from.
pub(crate) trait SnapshotSource: Send + Sync + 'static {
    fn gather(&self) -> impl Future<Output = NodeSnapshot> + Send;
    /// Resolves when something changed that must be reported before the next period (the
    /// node starting to shut down, a device plugin's capacity); never, by default.
    fn changed(&self) -> impl Future<Output = ()> + Send {
        std::future::pending()
    }
}

/// Timing and identity of the agent.
#[derive(Debug, Clone)]
pub(crate) struct AgentSettings {
    pub node_name: String,
    pub cluster: ClusterSettings,
    pub status_update_frequency: Duration,
    /// Hears of every Node the API server returns (registration, status writes, re-reads),
    /// so admission sees the Node's current labels and taints.
    pub published: NodePublisher,
}

/// Where the node agent publishes the Node it last had back from the API server.
#[derive(Clone, Default, Debug)]
pub(crate) struct NodePublisher(Option<tokio::sync::watch::Sender<Option<std::sync::Arc<Node>>>>);

impl NodePublisher {
    /// Publishes to `tx`.
    pub(crate) fn to(
        tx: tokio::sync::watch::Sender<Option<std::sync::Arc<Node>>>,
    ) -> NodePublisher {
        NodePublisher(Some(tx))
    }

    /// Publishes `node` unless the one published already is newer: the node agent and the
    /// Node watch both publish, and neither may put an older version back. (Versions are
    /// compared as the numbers the API server hands out; one that is not a number replaces.)
    pub(crate) fn publish(&self, node: &Node) {
        let Some(tx) = &self.0 else {
            return;
        };
        let version = |n: &Node| {
            n.metadata
                .resource_version
                .as_deref()
                .and_then(|v| v.parse::<u64>().ok())
        };
        tx.send_if_modified(|current| {
            let older = match (current.as_deref().and_then(version), version(node)) {
                (Some(have), Some(new)) => new < have,
                _ => false,
            };
            if older {
                return false;
            }
            *current = Some(std::sync::Arc::new(node.clone()));
            true
        });
    }
}

/// Registers the Node, then keeps its status and Lease current until `cancel`.
pub(crate) async fn run<A: NodeApi, S: SnapshotSource>(
    api: A,
    snapshots: S,
    settings: AgentSettings,
    problems: ProblemLog,
    events: Recorder,
    cancel: CancellationToken,
) {
    let Some(node) = register(&api, &snapshots, &settings, &problems, &cancel).await else {
        return;
    };
    settings.published.publish(&node);
    let node_ref = NodeRef {
        name: settings.node_name.clone(),
        uid: node.metadata.uid.clone().unwrap_or_default(),
    };
    tracing::info!(node = %node_ref.name, uid = %node_ref.uid, "registered with the API server");
    let events = NodeEvents {
        recorder: events,
        name: node_ref.name.clone(),
        uid: node_ref.uid.clone(),
    };
    events.record(
        EventType::Normal,
        reason::STARTING,
        "Starting kubelet.".into(),
    );
    // Upstream records the conditions its first status sets at every start (registered
    // anew or not); later ones as they change.
    events.conditions(&NodeStatus::default(), node.status.as_ref());
    let rereads = Rereads::default();
    // The Lease renews on its own task (a slow status write never delays it); it ends with
    // this function, and a panic in it is this function's panic, so that a supervisor that
    // restarts the node agent never leaves a second renewer behind.
    let mut lease_task = AbortOnDropHandle::new(tokio::spawn(renew_lease(
        api.clone(),
        node_ref,
        settings.cluster.node_lease_duration_seconds,
        problems.clone(),
        rereads.clone(),
        cancel.clone(),
    )));
    let around = StatusLoopAround {
        problems: &problems,
        rereads: &rereads,
        events: &events,
    };
    let status = sync_status(&api, &snapshots, &settings, node, &around, &cancel);
    tokio::pin!(status);
    tokio::select! {
        () = &mut status => {}
        ended = &mut lease_task => {
            if let Err(err) = ended
                && err.is_panic()
            {
                std::panic::resume_unwind(err.into_panic());
            }
            status.await;
        }
    }
}

/// Creates the Node (or finds and reconciles it), retrying with back-off. `None` on cancel.
async fn register<A: NodeApi, S: SnapshotSource>(
    api: &A,
    snapshots: &S,
    settings: &AgentSettings,
    problems: &ProblemLog,
    cancel: &CancellationToken,
) -> Option<Node> {
    let name = &settings.node_name;
    let mut backoff = Backoff::new(Duration::from_millis(100));
    loop {
        if cancel.is_cancelled() {
            return None;
        }
        let snap = snapshots.gather().await;
        let status = compute_node_status(&snap, None, clock::timestamp());
        let initial = initial_node(name, &settings.cluster, status);
        match try_register(api, settings, &initial).await {
            Ok(node) => {
                problems.succeeded("registering the node");
                return Some(node);
            }
            Err(problem) => problems.failed(&format!("registering node {name:?}"), &problem),
        }
        if !pause(backoff.next_wait(), cancel).await {
            return None;
        }
    }
}

async fn try_register<A: NodeApi>(
    api: &A,
    settings: &AgentSettings,
    initial: &Node,
) -> Result<Node, Problem> {
    let name = &settings.node_name;
    if settings.cluster.register_node {
        match api.create_node(initial).await {
            Ok(node) => return Ok(node),
            // Creating may be forbidden while the Node exists (and may be read): go on.
            Err(p) if p.is(ProblemKind::AlreadyExists) || p.is(ProblemKind::Forbidden) => {
                let existing = match api.get_node(name).await {
                    Ok(node) => node,
                    // The refusal to create says why (NodeRestriction names both nodes).
                    Err(_) if p.is(ProblemKind::Forbidden) => return Err(p),
                    Err(get) => return Err(get),
                };
                return reconcile(api, name, existing, initial).await;
            }
            Err(p) => return Err(p),
        }
    }
    let existing = api.get_node(name).await?;
    reconcile(api, name, existing, initial).await
}

async fn reconcile<A: NodeApi>(
    api: &A,
    name: &str,
    existing: Node,
    initial: &Node,
) -> Result<Node, Problem> {
    tracing::info!(node = %name, "the Node was registered before; reconciling its labels");
    match reconcile_existing(&existing, initial) {
        Some(patch) => api.patch_node(name, &patch).await,
        None => Ok(existing),
    }
}

/// Keeps the Node's status current: recomputed every `nodeStatusUpdateFrequency` (every
/// 100 ms until the Node is Ready), sent when changed or when the report period passed.
async fn sync_status<A: NodeApi, S: SnapshotSource>(
    api: &A,
    snapshots: &S,
    settings: &AgentSettings,
    mut known: Node,
    around: &StatusLoopAround<'_>,
    cancel: &CancellationToken,
) {
    let StatusLoopAround {
        problems,
        rereads,
        events,
    } = *around;
    let name = &settings.node_name;
    let started = clock::instant();
    let mut last_report = clock::instant();
    let mut reread = false;
    loop {
        let known_status = known.status.clone().unwrap_or_default();
        let ready = condition_status(&known_status, "Ready") == Some("True");
        let gathered = clock::instant();
        let snap = snapshots.gather().await;
        let ours = compute_node_status(&snap, Some(&known_status), clock::timestamp());
        let due = last_report.elapsed() >= settings.cluster.node_status_report_frequency;
        let after_lease_failure = rereads.pending();
        reread |= after_lease_failure;
        if reread || due || status_changed(&known_status, &ours) {
            match update_status(api, name, &mut known, &snap, reread, problems).await {
                Ok(before) => {
                    settings.published.publish(&known);
                    events.conditions(&before, known.status.as_ref());
                    last_report = clock::instant();
                    reread = false;
                    if after_lease_failure {
                        rereads.done_one();
                    }
                    problems.succeeded("updating the node status");
                }
                Err(problem) => {
                    reread = true;
                    problems.failed("updating the node status", &problem);
                }
            }
        }
        let fast = !ready && started.elapsed() < FAST_UPDATE_FOR;
        let wait = if fast {
            FAST_UPDATE
        } else {
            settings.status_update_frequency
        };
        let go_on = tokio::select! {
            go_on = pause(wait, cancel) => go_on,
            _ = snapshots.changed() => {
                pause(EARLY_UPDATE_GAP.saturating_sub(gathered.elapsed()), cancel).await
            }
        };
        if !go_on {
            return;
        }
    }
}

/// Up to `nodeStatusUpdateRetry` tries; the first uses the Node we hold unless told to
/// re-read, later ones re-read it. A failure to connect ends the round at once (the next
/// round comes soon enough; five time-outs in a row would only delay it). Returns the status
/// the API server held before the patch that went through.
async fn update_status<A: NodeApi>(
    api: &A,
    name: &str,
    known: &mut Node,
    snap: &NodeSnapshot,
    reread_first: bool,
    problems: &ProblemLog,
) -> Result<NodeStatus, Problem> {
    let mut last = None;
    for attempt in 0..STATUS_UPDATE_TRIES {
        if attempt > 0 || reread_first {
            match api.get_node(name).await {
                Ok(node) => *known = node,
                Err(p) if p.is(ProblemKind::Unreachable) => return Err(p),
                Err(p) => {
                    problems.failed("reading the Node", &p);
                    last = Some(p);
                    continue;
                }
            }
        }
        let known_status = known.status.clone().unwrap_or_default();
        let ours: NodeStatus = compute_node_status(snap, Some(&known_status), clock::timestamp());
        match api.patch_node_status(name, &status_patch(&ours)).await {
            Ok(node) => {
                *known = node;
                return Ok(known_status);
            }
            Err(p) if p.is(ProblemKind::Unreachable) => return Err(p),
            Err(p) => last = Some(p),
        }
    }
    Err(last.unwrap_or(Problem {
        kind: ProblemKind::Refused,
        message: "the node status update exceeded its retries".into(),
    }))
}

/// What the status loop shares with the rest of the agent.
#[derive(Clone, Copy)]
struct StatusLoopAround<'a> {
    problems: &'a ProblemLog,
    /// Set by the Lease task when a renewal failed.
    rereads: &'a Rereads,
    events: &'a NodeEvents,
}

/// The node's events, about the Node object (with its UID, as upstream once it knows it).
struct NodeEvents {
    recorder: Recorder,
    name: String,
    uid: String,
}

impl NodeEvents {
    fn record(&self, kind: EventType, why: &str, message: String) {
        let uid = Some(self.uid.as_str()).filter(|u| !u.is_empty());
        self.recorder
            .record(node_ref(&self.name, uid), kind, why, message);
    }

    /// The events for the conditions that moved from `before` to `after`.
    fn conditions(&self, before: &NodeStatus, after: Option<&NodeStatus>) {
        let Some(after) = after else { return };
        for event in condition_events(before, after) {
            let message = format!("Node {} status is now: {event}", self.name);
            self.record(EventType::Normal, event, message);
        }
    }
}

/// The events upstream records when the node itself moves one of its conditions: for each
/// condition whose status the patch changed (or set first), the event named after the new
/// state (`NodeReady`, `NodeHasSufficientMemory`, …).
pub(crate) fn condition_events(before: &NodeStatus, after: &NodeStatus) -> Vec<&'static str> {
    const NAMES: [(&str, &str, &str); 4] = [
        ("Ready", reason::NODE_READY, reason::NODE_NOT_READY),
        (
            "MemoryPressure",
            "NodeHasInsufficientMemory",
            "NodeHasSufficientMemory",
        ),
        (
            "DiskPressure",
            "NodeHasDiskPressure",
            "NodeHasNoDiskPressure",
        ),
        (
            "PIDPressure",
            "NodeHasInsufficientPID",
            "NodeHasSufficientPID",
        ),
    ];
    let mut out = Vec::new();
    for (kind, when_true, otherwise) in NAMES {
        let now = condition_status(after, kind);
        if now.is_none() || now == condition_status(before, kind) {
            continue;
        }
        out.push(if now == Some("True") {
            when_true
        } else {
            otherwise
        });
    }
    out
}

/// Renews the Lease every quarter of its duration. Holds the Lease the API server last
/// returned and updates it optimistically (one request per renewal); a conflict or any
/// failure re-reads (or creates) it, retrying with back-off up to 7 s.
async fn renew_lease<A: NodeApi>(
    api: A,
    node: NodeRef,
    duration_seconds: u32,
    problems: ProblemLog,
    rereads: Rereads,
    cancel: CancellationToken,
) {
    let interval = lease::renew_interval(duration_seconds);
    let mut latest = None;
    let mut backoff = Backoff::new(Duration::from_millis(200));
    loop {
        let result = match latest.take() {
            Some(base) => {
                api.replace_lease(&lease::renewed(
                    &base,
                    &node,
                    duration_seconds,
                    clock::timestamp(),
                ))
                .await
            }
            None => ensure_lease(&api, &node, duration_seconds).await,
        };
        let wait = match result {
            Ok(l) => {
                latest = Some(l);
                backoff.reset();
                problems.succeeded("renewing the node Lease");
                interval
            }
            Err(p) => {
                problems.failed("renewing the node Lease", &p);
                rereads.after_lease_failure();
                backoff.next_wait()
            }
        };
        if !pause(wait, &cancel).await {
            return;
        }
    }
}

/// Reads the Lease and renews it, or creates it when there is none.
async fn ensure_lease<A: NodeApi>(
    api: &A,
    node: &NodeRef,
    duration_seconds: u32,
) -> Result<k8s_openapi::api::coordination::v1::Lease, Problem> {
    let now = clock::timestamp();
    match api.get_lease(&node.name).await {
        Ok(base) => {
            api.replace_lease(&lease::renewed(&base, node, duration_seconds, now))
                .await
        }
        Err(p) if p.is(ProblemKind::NotFound) => {
            api.create_lease(&lease::new_lease(node, duration_seconds, now))
                .await
        }
        Err(p) => Err(p),
    }
}

/// The real [`SnapshotSource`]: the machine's files, the runtime over CRI, the agent's health.
#[derive(Clone)]
pub(crate) struct LiveSnapshots<R> {
    pub cri: R,
    pub health: Health,
    pub node_name: String,
    /// `--node-ip`; else the address of the default-route interface, looked up each time.
    pub node_ip: Option<IpAddr>,
    pub root_dir: PathBuf,
    pub max_pods: u32,
    pub max_images: i32,
    pub reservations: Reservations,
    pub kubelet_port: u16,
    /// The eviction manager's pressure conditions.
    pub pressure: crate::base::node_pressure::PressureView,
    /// Whether the node shuts down (the Ready condition says so).
    pub shutdown: crate::kubelet::shutdown::ShutdownStatus,
    /// The device plugins' extended resources (upstream's `GetCapacity`).
    pub devices: Option<crate::kubelet::devices::DeviceManager>,
    /// The device capacity version the last gather read, which `changed` waits to move past.
    pub devices_seen: Arc<std::sync::atomic::AtomicU64>,
}

impl<R: RuntimeService + ImageService> SnapshotSource for LiveSnapshots<R> {
    fn changed(&self) -> impl Future<Output = ()> + Send {
        let shutdown = self.shutdown.changed();
        let seen = self.devices_seen.load(Ordering::Relaxed);
        let devices = self
            .devices
            .as_ref()
            .map(|d| d.capacity_changed_since(seen));
        async move {
            match devices {
                Some(devices) => tokio::select! {
                    _ = shutdown => {}
                    _ = devices => {}
                },
                None => shutdown.await,
            }
        }
    }

    async fn gather(&self) -> NodeSnapshot {
        let root_dir = self.root_dir.clone();
        let configured_ip = self.node_ip;
        let (machine, internal_ip, mounted) = tokio::task::spawn_blocking(move || {
            (
                MachineFacts::read(&root_dir),
                super::facts::detect_host_ip(configured_ip),
                crate::kubelet::volume::csi::attach::on_disk(&root_dir),
            )
        })
        .await
        .unwrap_or_default();
        let runtime = match (self.cri.status(false).await, self.cri.version().await) {
            (Ok(status), Ok(version)) => RuntimeState::Up {
                version: format!("{}://{}", version.runtime_name, version.runtime_version),
                handlers: super::status::runtime_handlers(&status.runtime_handlers),
                features: super::status::node_features(status.features.as_ref()),
                conditions: status
                    .status
                    .map(|s| s.conditions)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|c| RuntimeCondition {
                        kind: c.r#type,
                        ok: c.status,
                        reason: c.reason,
                        message: c.message,
                    })
                    .collect(),
            },
            _ => RuntimeState::Down,
        };
        let images = self
            .cri
            .list_images()
            .await
            .unwrap_or_default()
            .into_iter()
            .map(|i| ImageEntry {
                repo_tags: i.repo_tags,
                repo_digests: i.repo_digests,
                size_bytes: i64::try_from(i.size).unwrap_or(i64::MAX),
            })
            .collect();
        let unhealthy = self
            .health
            .report()
            .results
            .into_iter()
            // The runtime is judged from its own answer above; "ping" always passes; a
            // background task that panicked is restarted and says nothing about whether
            // pods can run (the PLEG's own check covers a PLEG that does not come back).
            .filter(|(name, _)| !matches!(name.as_str(), "ping" | "runtime" | "tasks"))
            .filter_map(|(name, result)| {
                let reason = result.err()?.0;
                Some((
                    if name == "pleg" {
                        "PLEG".to_string()
                    } else {
                        name
                    },
                    reason,
                ))
            })
            .collect();
        let mut cap = capacity(&machine, self.max_pods);
        let mut alloc = allocatable(&cap, &self.reservations);
        if let Some(devices) = &self.devices {
            self.devices_seen
                .store(devices.capacity_version(), Ordering::Relaxed);
            (cap.extended, alloc.extended) = devices.capacity();
        }
        NodeSnapshot {
            node_name: self.node_name.clone(),
            internal_ip,
            allocatable: alloc,
            capacity: cap,
            machine,
            runtime,
            unhealthy,
            images,
            max_images: self.max_images,
            pressure: {
                use crate::base::node_pressure::Condition;
                let c = self.pressure.conditions();
                Pressure {
                    memory: c.contains(&Condition::MemoryPressure),
                    disk: c.contains(&Condition::DiskPressure),
                    pid: c.contains(&Condition::PidPressure),
                }
            },
            kubelet_port: self.kubelet_port,
            shutting_down: self.shutdown.shutting_down(),
            volumes: super::status::VolumeReport {
                desired: crate::kubelet::volume::csi::attach::desired(),
                mounted,
            },
        }
    }
}

#[cfg(test)]
#[path = "agent_tests.rs"]
mod tests;
