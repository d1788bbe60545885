//! One task per pod UID. Each works on the newest thing asked of it: a later update replaces an
//! earlier one that has not been picked up yet (a `watch` channel, never a queue of stale work).
//!
//! A worker syncs its pod until asked to terminate it; then it stops and removes everything of
//! the pod, reports that it is done, and ends. The agent shutting down ends workers without
//! touching their containers: a restarted agent adopts them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::cri::{ImageService, RuntimeService};
use crate::pleg::RuntimeCache;
use crate::pod_state::PodStates;
use crate::prober::ProbeManager;
use crate::runtime::executor::Executor;
use crate::runtime::observed::ObservedPod;
use crate::status::{StatusInputs, compute_pod_status};

/// What a worker is asked to do.
#[derive(Clone, Debug)]
pub enum Work {
    /// Make the runtime match this pod.
    Sync(Arc<Pod>),
    /// Stop and remove everything of the pod. `pod` is absent for orphans.
    Terminate {
        pod: Option<Arc<Pod>>,
        grace_override: Option<i64>,
    },
}

struct Handle {
    tx: watch::Sender<Work>,
    poke: Arc<Notify>,
    terminating: bool,
    /// `namespace/name`, to keep two UIDs of one static pod from running at once.
    full_name: Option<String>,
}

/// Shared pieces every worker uses.
#[derive(Clone)]
pub struct WorkerDeps<R> {
    pub executor: Executor<R>,
    pub prober: ProbeManager<R>,
    pub states: PodStates,
    pub runtime_cache: RuntimeCache,
    pub sync_frequency: Duration,
    pub host_ip: Option<String>,
}

/// The set of pod workers.
pub struct PodWorkers<R> {
    deps: WorkerDeps<R>,
    handles: HashMap<String, Handle>,
    tracker: TaskTracker,
    cancel: CancellationToken,
    done_tx: mpsc::UnboundedSender<String>,
}

/// `namespace/name` of a pod.
pub fn full_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

impl<R: RuntimeService + ImageService> PodWorkers<R> {
    /// `done_tx` receives the UID of each worker that finished terminating its pod.
    pub fn new(
        deps: WorkerDeps<R>,
        tracker: TaskTracker,
        cancel: CancellationToken,
        done_tx: mpsc::UnboundedSender<String>,
    ) -> Self {
        PodWorkers {
            deps,
            handles: HashMap::new(),
            tracker,
            cancel,
            done_tx,
        }
    }

    /// Hands work to the pod's worker, starting one if needed.
    pub fn dispatch(&mut self, uid: &str, work: Work) {
        let terminating = matches!(work, Work::Terminate { .. });
        let name = match &work {
            Work::Sync(p) => Some(full_name(p)),
            Work::Terminate { pod, .. } => pod.as_deref().map(full_name),
        };
        if let Some(handle) = self.handles.get_mut(uid) {
            if handle.terminating && !terminating {
                // A pod being torn down is not brought back by a late update.
                return;
            }
            handle.terminating = terminating;
            if name.is_some() {
                handle.full_name = name;
            }
            handle.tx.send_replace(work);
            return;
        }
        let (tx, rx) = watch::channel(work);
        let poke = Arc::new(Notify::new());
        self.handles.insert(
            uid.to_string(),
            Handle {
                tx,
                poke: poke.clone(),
                terminating,
                full_name: name,
            },
        );
        let deps = self.deps.clone();
        let cancel = self.cancel.clone();
        let done = self.done_tx.clone();
        let uid = uid.to_string();
        let span = tracing::info_span!("pod_worker", pod_uid = %uid);
        self.tracker
            .spawn(worker_loop(uid, rx, poke, deps, cancel, done).instrument(span));
    }

    /// Asks the worker to look at its pod again now (the runtime changed).
    pub fn poke(&self, uid: &str) {
        if let Some(h) = self.handles.get(uid) {
            h.poke.notify_one();
        }
    }

    /// True when a worker exists for the UID.
    pub fn has(&self, uid: &str) -> bool {
        self.handles.contains_key(uid)
    }

    /// True when another UID with this full name is still being torn down.
    pub fn terminating_other(&self, uid: &str, full_name: &str) -> bool {
        self.handles
            .iter()
            .any(|(u, h)| u != uid && h.terminating && h.full_name.as_deref() == Some(full_name))
    }

    /// Forgets a worker that reported it is done.
    pub fn finished(&mut self, uid: &str) {
        self.handles.remove(uid);
    }

    /// How many workers run.
    pub fn len(&self) -> usize {
        self.handles.len()
    }

    pub fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }
}

async fn worker_loop<R: RuntimeService + ImageService>(
    uid: String,
    mut rx: watch::Receiver<Work>,
    poke: Arc<Notify>,
    deps: WorkerDeps<R>,
    cancel: CancellationToken,
    done: mpsc::UnboundedSender<String>,
) {
    let mut state = deps.executor.load_state(&uid);
    let mut next = Instant::now();
    let mut first = true;
    loop {
        if !first {
            tokio::select! {
                _ = cancel.cancelled() => return,
                changed = rx.changed() => if changed.is_err() { return },
                _ = poke.notified() => {},
                _ = tokio::time::sleep_until(next) => {},
            }
        }
        first = false;
        let work = rx.borrow_and_update().clone();
        match work {
            Work::Sync(pod) => {
                let span = tracing::info_span!(
                    "sync",
                    pod = %full_name(&pod),
                );
                let unhealthy = deps.prober.unhealthy(&uid);
                let probes_before = deps.prober.results(&uid);
                let outcome = tokio::select! {
                    _ = cancel.cancelled() => return,
                    outcome = deps.executor.sync_pod(&pod, &mut state, &unhealthy, &probes_before).instrument(span) => outcome,
                };
                if outcome.runtime_unreachable {
                    // Keep the last status while the runtime cannot be read.
                    next = Instant::now() + outcome.retry_after.unwrap_or(deps.sync_frequency);
                    continue;
                }
                deps.runtime_cache
                    .update_pod(&uid, outcome.observed.clone());
                deps.prober.sync_pod(&pod, &outcome.observed);
                let probes = deps.prober.results(&uid);
                let status = compute_pod_status(
                    &pod,
                    &outcome.observed,
                    &StatusInputs {
                        now: SystemTime::now(),
                        host_ip: deps.host_ip.clone(),
                        waiting: &state.waiting,
                        previous: state.status.as_ref(),
                        terminating: false,
                        probes: &probes,
                    },
                );
                state.status = Some(status.clone());
                deps.states.publish(pod.clone(), status);
                let wait = outcome.retry_after.unwrap_or(deps.sync_frequency);
                next = Instant::now() + wait.min(deps.sync_frequency);
            }
            Work::Terminate {
                pod,
                grace_override,
            } => {
                deps.states.forget(&uid);
                deps.prober.remove_pod(&uid);
                let span = tracing::info_span!(
                    "terminate",
                    pod = %pod.as_deref().map(full_name).unwrap_or_else(|| "(orphan)".into()),
                );
                let started = Instant::now();
                let result = tokio::select! {
                    _ = cancel.cancelled() => return,
                    r = deps.executor.terminate_pod(&uid, pod.as_deref(), grace_override).instrument(span) => r,
                };
                match result {
                    Ok(()) => {
                        tracing::info!(
                            elapsed_ms = started.elapsed().as_millis() as u64,
                            "pod terminated and removed"
                        );
                        deps.runtime_cache.update_pod(&uid, ObservedPod::default());
                        let _ = done.send(uid);
                        return;
                    }
                    Err(err) => {
                        tracing::warn!(error = %err, "tearing the pod down failed; will retry");
                        next = Instant::now() + Duration::from_secs(2);
                    }
                }
            }
        }
    }
}
