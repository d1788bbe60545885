//! Graceful node shutdown, as upstream's node shutdown manager does it: with a grace period
//! configured, Deckhand holds a systemd-logind "delay" inhibitor lock, and when logind
//! announces the shutdown (`PrepareForShutdown(true)`) it marks the node not ready, refuses new
//! pods, stops the running pods in priority order (regular pods first, critical pods last),
//! each within its bucket's grace (which also bounds the wait for their volumes to be
//! unmounted, see [`volumes`]), and then releases the lock so the shutdown goes on. A
//! cancelled shutdown (`PrepareForShutdown(false)`) takes the lock again and the node is
//! ready again; pods already stopped stay stopped (as upstream).
//!
//! The order and the graces are pure ([`plan`]); logind is behind [`logind::Logind`]; the pods
//! are behind [`NodePods`] (the sync loop implements it), their mounts behind
//! [`volumes::PodVolumes`]. Of the rest of the agent it uses only the event recorder.

pub(crate) mod logind;
pub(crate) mod plan;
pub(crate) mod volumes;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::base::clock;
use logind::{InhibitLock, Logind, LogindConnector, LogindError, ShutdownSignals};
use plan::{PodToStop, PriorityGrace};

/// The reason of a pod stopped for the shutdown (upstream's).
pub(crate) const POD_REASON: &str = "Terminated";
/// Its message (upstream's).
pub(crate) const POD_MESSAGE: &str = "Pod was terminated in response to imminent node shutdown.";
/// The `DisruptionTarget` condition's reason on such a pod.
pub(crate) const DISRUPTION_REASON: &str = "TerminationByKubelet";
/// Admission's reason for a new pod while the node shuts down.
pub(crate) const NOT_ADMITTED_REASON: &str = "NodeShutdown";
/// Admission's message for it.
pub(crate) const NOT_ADMITTED_MESSAGE: &str = "Pod was rejected as the node is shutting down.";
/// What the Ready condition says while the node shuts down.
pub(crate) const NOT_READY_MESSAGE: &str = "node is shutting down";
/// Upstream's wait before connecting to the bus again after the connection is lost.
pub(crate) const RECONNECT_PERIOD: Duration = Duration::from_secs(1);
/// The file (in the root dir) where the last shutdown's start and end times are kept, so the
/// metrics show them after the restart.
pub(crate) const STATE_FILE: &str = "graceful_node_shutdown_state";

/// Whether the node is shutting down: the node status and admission read it. Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct ShutdownStatus(Arc<watch::Sender<bool>>);

impl Default for ShutdownStatus {
    fn default() -> Self {
        ShutdownStatus(Arc::new(watch::channel(false).0))
    }
}

impl ShutdownStatus {
    pub(crate) fn shutting_down(&self) -> bool {
        *self.0.borrow()
    }

    /// Says whether the node shuts down (the manager, and tests).
    pub(crate) fn set(&self, on: bool) {
        self.0.send_replace(on);
    }

    /// Resolves at the next change (for the node status loop to report at once).
    pub(crate) fn changed(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.0.subscribe();
        async move {
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }
}

/// The node's pods, as the shutdown manager needs them.
pub(crate) trait NodePods: Send + Sync + 'static {
    /// The pods admitted and not finished.
    fn active(&self) -> impl Future<Output = Vec<Arc<Pod>>> + Send;
    /// Stops the pod with `grace` seconds and marks it Failed with [`POD_REASON`] and
    /// [`POD_MESSAGE`]; resolves once it has stopped.
    fn kill(&self, uid: &str, grace: i64) -> impl Future<Output = ()> + Send;
}

/// What the manager is configured with.
#[derive(Clone)]
pub(crate) struct ManagerSettings {
    /// From [`plan::buckets`]; empty = graceful shutdown off.
    pub buckets: Vec<PriorityGrace>,
    /// `<root-dir>/graceful_node_shutdown_state`.
    pub state_file: PathBuf,
    /// The Node's `NodeShutdown` events go here, as upstream records them.
    pub events: crate::kubelet::events::Recorder,
    pub node_name: String,
    /// Where the stopped pods' volume mounts are looked for ([`volumes::MountTable`]).
    pub volumes: Arc<dyn volumes::PodVolumes>,
}

/// Upstream's event reason for a shutdown announced or cancelled.
pub(crate) const EVENT_REASON: &str = "NodeShutdown";

/// One connection to logind with the lock held (or not, after a shutdown).
struct Session<B> {
    bus: B,
    signals: ShutdownSignals,
    lock: Option<InhibitLock>,
}

/// How watching one connection ended.
enum Ended {
    /// The agent stops.
    Cancelled,
    /// The bus connection went away.
    Lost,
}

/// The shutdown manager's task.
pub(crate) struct Manager<C, P> {
    connector: C,
    pods: P,
    settings: ManagerSettings,
    status: ShutdownStatus,
}

impl<C: LogindConnector, P: NodePods> Manager<C, P> {
    pub(crate) fn new(
        connector: C,
        pods: P,
        settings: ManagerSettings,
        status: ShutdownStatus,
    ) -> Self {
        Manager {
            connector,
            pods,
            settings,
            status,
        }
    }

    /// Runs until `cancel`. Upstream's kubelet logs a failed first start and goes on without
    /// graceful shutdown (it does not try again); so does this. A connection lost later is
    /// made again every second.
    pub(crate) async fn run(self, cancel: CancellationToken) {
        set_metrics(&load_state(&self.settings.state_file));
        let requested = plan::period_requested(&self.settings.buckets);
        tracing::info!(
            grace_period_s = requested.as_secs(),
            buckets = ?self.settings.buckets,
            "starting the node shutdown manager"
        );
        let mut session = match self.start(requested).await {
            Ok(s) => s,
            Err(err) => {
                tracing::warn!(
                    error = %err,
                    "graceful node shutdown is configured but logind cannot be reached; pods will not be stopped gracefully when the node shuts down"
                );
                return;
            }
        };
        loop {
            match self.watch(&mut session, &cancel).await {
                Ended::Cancelled => return,
                Ended::Lost => {
                    tracing::warn!("the connection to the system bus was lost; connecting again");
                }
            }
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(RECONNECT_PERIOD) => {}
                }
                match self.start(requested).await {
                    Ok(s) => {
                        tracing::info!("watching logind for shutdown again");
                        session = s;
                        break;
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, "cannot watch logind for shutdown; trying again")
                    }
                }
            }
        }
    }

    /// Connects, checks logind's delay limit, subscribes to the signal and takes the lock.
    async fn start(&self, requested: Duration) -> Result<Session<C::Bus>, LogindError> {
        let bus = self.connector.connect().await?;
        let max_delay = bus.inhibit_delay_max().await?;
        if requested > max_delay {
            // Upstream writes a logind.conf.d drop-in and makes logind reload it. Deckhand
            // leaves the host's logind configuration to its owner and says what to do.
            tracing::warn!(
                inhibit_delay_max_s = max_delay.as_secs_f64(),
                shutdown_grace_period_s = requested.as_secs(),
                "logind's InhibitDelayMaxSec is shorter than the shutdown grace period: logind will not wait that long for the pods to stop; set InhibitDelayMaxSec={} in a drop-in under /etc/systemd/logind.conf.d/ and reload systemd-logind",
                requested.as_secs()
            );
        }
        // Subscribe before taking the lock: no announcement can fall between the two.
        let signals = bus.shutdown_signals().await?;
        let lock = bus.inhibit().await?;
        tracing::info!(
            inhibit_delay_max_s = max_delay.as_secs_f64(),
            "holding a shutdown delay lock from logind"
        );
        Ok(Session {
            bus,
            signals,
            lock: Some(lock),
        })
    }

    /// Acts on the signals of one connection until it is lost or the agent stops.
    async fn watch(&self, session: &mut Session<C::Bus>, cancel: &CancellationToken) -> Ended {
        loop {
            let signal = tokio::select! {
                _ = cancel.cancelled() => return Ended::Cancelled,
                s = session.signals.next() => s,
            };
            match signal {
                None => return Ended::Lost,
                Some(true) => {
                    tracing::info!("logind announced the node's shutdown; stopping pods");
                    self.node_event("Shutdown manager detected shutdown event");
                    self.status.set(true);
                    if !self.shut_down(session, cancel).await {
                        return Ended::Cancelled;
                    }
                }
                Some(false) => {
                    tracing::info!(
                        "logind says the shutdown was cancelled; the node is ready again"
                    );
                    self.status.set(false);
                    if session.lock.is_none() {
                        match session.bus.inhibit().await {
                            Ok(lock) => session.lock = Some(lock),
                            Err(err) => {
                                tracing::warn!(error = %err, "cannot take the shutdown delay lock again")
                            }
                        }
                    }
                }
            }
        }
    }

    fn node_event(&self, message: &str) {
        self.settings.events.record(
            crate::kubelet::events::node_ref(&self.settings.node_name, None),
            crate::kubelet::events::EventType::Normal,
            EVENT_REASON,
            message,
        );
    }

    /// Stops the pods step by step, then releases the lock. False when the agent stops first.
    async fn shut_down(&self, session: &mut Session<C::Bus>, cancel: &CancellationToken) -> bool {
        let start = clock::now();
        let began = clock::instant();
        let state = ShutdownState {
            start_time: Some(unix_seconds(start)),
            end_time: None,
        };
        set_metrics(&state);
        store_state(&self.settings.state_file, &state);
        let pods = self.pods.active().await;
        let names: std::collections::HashMap<String, String> = pods
            .iter()
            .map(|p| {
                (
                    p.metadata.uid.clone().unwrap_or_default(),
                    format!(
                        "{}/{}",
                        p.metadata.namespace.as_deref().unwrap_or_default(),
                        p.metadata.name.as_deref().unwrap_or_default()
                    ),
                )
            })
            .collect();
        let to_stop: Vec<PodToStop> = pods.iter().map(|p| PodToStop::of(p)).collect();
        for step in plan::plan(&self.settings.buckets, &to_stop) {
            if step.pods.is_empty() {
                continue;
            }
            let listed: Vec<String> = step
                .pods
                .iter()
                .map(|(uid, grace)| {
                    format!(
                        "{} ({grace}s)",
                        names.get(uid).map_or(uid.as_str(), |n| n.as_str())
                    )
                })
                .collect();
            tracing::info!(
                priority = step.priority,
                grace_s = step.grace_seconds,
                pods = ?listed,
                "stopping pods for the node's shutdown"
            );
            let kills = futures::future::join_all(
                step.pods
                    .iter()
                    .map(|(uid, grace)| self.pods.kill(uid, *grace)),
            );
            // As upstream: the pods stopped, then their volumes unmounted, all within the
            // step's grace; whatever is left then does not hold up the next step.
            let uids: Vec<String> = step.pods.iter().map(|(uid, _)| uid.clone()).collect();
            let stopped = std::sync::atomic::AtomicBool::new(false);
            let step_done = async {
                kills.await;
                stopped.store(true, std::sync::atomic::Ordering::Relaxed);
                volumes::wait_unmounted(self.settings.volumes.as_ref(), &uids).await;
            };
            let limit = Duration::from_secs(u64::try_from(step.grace_seconds).unwrap_or(0));
            tokio::select! {
                _ = cancel.cancelled() => return false,
                _ = step_done => tracing::info!(
                    priority = step.priority,
                    "these pods have stopped and their volumes are unmounted"
                ),
                _ = tokio::time::sleep(limit) => {
                    if stopped.load(std::sync::atomic::Ordering::Relaxed) {
                        let left = self.settings.volumes.still_mounted(&uids).await;
                        tracing::warn!(
                            priority = step.priority,
                            grace_s = step.grace_seconds,
                            mounts = ?left,
                            "volumes of the stopped pods were not unmounted within their shutdown grace period; going on"
                        );
                    } else {
                        tracing::warn!(
                            priority = step.priority,
                            grace_s = step.grace_seconds,
                            "pods did not stop within their shutdown grace period; going on"
                        );
                    }
                }
            }
        }
        // Closing the descriptor releases the lock: logind goes on with the shutdown.
        session.lock = None;
        let end = clock::now();
        let state = ShutdownState {
            end_time: Some(unix_seconds(end)),
            ..state
        };
        set_metrics(&state);
        store_state(&self.settings.state_file, &state);
        tracing::info!(
            elapsed_ms = began.elapsed().as_millis() as u64,
            "pods stopped for the shutdown; released the delay lock"
        );
        true
    }
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs() as f64)
        .unwrap_or(0.0)
}

/// The last shutdown's times, kept across restarts (upstream keeps them the same way, as
/// JSON in the root dir, for the same two gauges).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ShutdownState {
    #[serde(default)]
    start_time: Option<f64>,
    #[serde(default)]
    end_time: Option<f64>,
}

fn load_state(path: &std::path::Path) -> ShutdownState {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|err| {
            tracing::warn!(path = %path.display(), error = %err, "cannot read the graceful shutdown state; ignored");
            ShutdownState::default()
        }),
        Err(_) => ShutdownState::default(),
    }
}

fn store_state(path: &std::path::Path, state: &ShutdownState) {
    let write = || -> std::io::Result<()> {
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, serde_json::to_vec(state).unwrap_or_default())?;
        std::fs::rename(&tmp, path)
    };
    if let Err(err) = write() {
        tracing::warn!(path = %path.display(), error = %err, "cannot store the graceful shutdown state");
    }
}

fn set_metrics(state: &ShutdownState) {
    use crate::base::metrics::SHUTDOWN_TIMES;
    SHUTDOWN_TIMES.start.store(
        state.start_time.unwrap_or(0.0).to_bits(),
        std::sync::atomic::Ordering::Relaxed,
    );
    SHUTDOWN_TIMES.end.store(
        state.end_time.unwrap_or(0.0).to_bits(),
        std::sync::atomic::Ordering::Relaxed,
    );
}

#[cfg(test)]
mod tests;
