//! One task per pod UID. Each works on the newest thing asked of it: a later update replaces an
//! earlier one that has not been picked up yet (a `watch` channel, never a queue of stale work).
//!
//! A worker syncs its pod until asked to terminate it; then it stops and removes everything of
//! the pod, reports that it is done, and ends. A pod that finishes (its phase is `Succeeded`
//! or `Failed`, as computed here or as its source says) is stopped for good and kept, as
//! upstream's "terminated" pod: sandbox stopped, volumes unmounted, its exited containers and
//! their logs left for `kubectl logs` until the pod is removed from its source. The agent shutting down ends workers without
//! touching their containers: a restarted agent adopts them.

use std::any::Any;
use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use futures::FutureExt;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::base::clock;
use crate::base::observed::{ContainerState, ObservedPod};
use crate::base::podspec::full_name;
use crate::base::supervisor::panic_message;
use crate::clients::cri::{ImageService, RuntimeService};
use crate::kubelet::pleg::RuntimeCache;
use crate::kubelet::pod_status::published::PodStates;
use crate::kubelet::pod_status::{StatusInputs, compute_pod_status};
use crate::kubelet::prober::ProbeManager;
use crate::kubelet::runtime::executor::{Executor, PodSyncState};

/// What a worker is asked to do.
#[derive(Clone, Debug)]
pub(crate) enum Work {
    /// Make the runtime match this pod.
    Sync(Arc<Pod>),
    /// Stop and remove everything of the pod. `pod` is absent for orphans.
    Terminate {
        pod: Option<Arc<Pod>>,
        grace_override: Option<i64>,
    },
    /// Stop the pod's containers (and sandbox) with a grace period, leave them in place,
    /// publish the pod's final status and unmount its volumes: upstream's `killPodNow`, as the
    /// node shutdown manager uses it. The worker then syncs the pod no more; a later
    /// `Terminate` removes it. A worker whose pod finished does the same by itself.
    Kill(Kill),
}

/// A [`Work::Kill`] request.
#[derive(Clone, Debug)]
pub(crate) struct Kill {
    pub pod: Arc<Pod>,
    /// Seconds the containers get (the pod's own grace is not consulted).
    pub grace: i64,
    /// The reason the status is to show; `None` for a pod that finished by itself (its
    /// status stays as computed).
    pub outcome: Option<FinalStatus>,
    /// Cancelled once the pod has stopped and its final status is published.
    pub done: CancellationToken,
}

impl Kill {
    /// The stop of a pod that finished by itself: its own grace period, no outcome of its
    /// own, nobody waiting (upstream's `SyncTerminatingPod` then `SyncTerminatedPod`).
    fn finished(pod: Arc<Pod>) -> Kill {
        let grace = crate::kubelet::runtime::executor::grace_period(Some(&pod), None);
        Kill {
            pod,
            grace,
            outcome: None,
            done: CancellationToken::new(),
        }
    }
}

/// The status a killed pod ends with: phase Failed (unless it had Succeeded), the reason and
/// message, and a `DisruptionTarget` condition with `disruption_reason` when given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FinalStatus {
    pub reason: String,
    pub message: String,
    pub disruption_reason: Option<String>,
}

impl FinalStatus {
    /// Puts the outcome on the status computed from what the runtime shows after the stop.
    pub(crate) fn apply(
        &self,
        status: &mut k8s_openapi::api::core::v1::PodStatus,
        now: SystemTime,
    ) {
        if status.phase.as_deref() != Some("Succeeded") {
            status.phase = Some("Failed".into());
        }
        status.reason = Some(self.reason.clone());
        status.message = Some(self.message.clone());
        if let Some(reason) = &self.disruption_reason {
            let since = now
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default();
            let at = jiff::Timestamp::new(since.as_secs() as i64, 0)
                .unwrap_or(jiff::Timestamp::UNIX_EPOCH);
            let conditions = status.conditions.get_or_insert_with(Vec::new);
            conditions.retain(|c| c.type_ != "DisruptionTarget");
            conditions.push(k8s_openapi::api::core::v1::PodCondition {
                type_: "DisruptionTarget".into(),
                status: "True".into(),
                reason: Some(reason.clone()),
                message: Some(self.message.clone()),
                last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    at,
                )),
                ..Default::default()
            });
        }
    }
}

struct Handle {
    tx: watch::Sender<Work>,
    poke: Arc<Notify>,
    terminating: bool,
    /// `namespace/name`, to keep two UIDs of one static pod from running at once.
    full_name: Option<String>,
    /// Asked to kill the pod: later syncs are not passed on (they would undo the kill).
    killed: bool,
}

/// Shared pieces every worker uses.
#[derive(Clone)]
pub(crate) struct WorkerDeps<R> {
    pub executor: Executor<R>,
    pub prober: ProbeManager<R>,
    pub states: PodStates,
    pub runtime_cache: RuntimeCache,
    pub sync_frequency: Duration,
    pub host_ip: Option<String>,
    pub stats: WorkerStats,
    /// With `--kubeconfig`: where statuses of pods from the API server are written, and pods
    /// the API server is deleting are finished once torn down.
    pub status_sync: Option<crate::kubelet::pod_status::api_writer::StatusSync>,
    /// With `--kubeconfig`: told where each static pod is (handed to a worker, synced, being
    /// torn down, gone), so its mirror pod is created, replaced and deleted in step.
    pub mirror_pods: Option<crate::kubelet::mirror_pods::MirrorPods>,
    /// Test-only fault injection (`DECKHAND_TEST_PANIC_POD`): the first sync of the pod with
    /// this name panics, so the end-to-end tests can show that a panic is caught and retried.
    pub panic_pod: Option<String>,
}

/// What the workers report about themselves on `/metrics`.
#[derive(Clone, Default)]
pub(crate) struct WorkerStats {
    panics: Arc<AtomicU64>,
    syncs_interrupted: Arc<AtomicU64>,
}

impl WorkerStats {
    /// Panics caught in workers so far.
    pub(crate) fn panics(&self) -> u64 {
        self.panics.load(Ordering::Relaxed)
    }

    /// Syncs abandoned because the pod was to be terminated.
    pub(crate) fn syncs_interrupted(&self) -> u64 {
        self.syncs_interrupted.load(Ordering::Relaxed)
    }

    /// Counts a panic caught in a worker and logs it, with the wait before the worker tries
    /// again (the worker's state machine reckons it from its own run of panics).
    fn caught_panic(&self, report: &PanicReport, wait: Duration) {
        self.panics.fetch_add(1, Ordering::Relaxed);
        let (pod, doing) = (report.pod.as_str(), report.doing);
        tracing::error!(
            pod,
            panic = %report.message,
            retry_in_ms = wait.as_millis() as u64,
            "the pod worker panicked while {doing}; it will try again"
        );
    }

    /// The counters in Prometheus' text format.
    pub(crate) fn render(&self) -> String {
        format!(
            "# HELP deckhand_pod_worker_panics_total Panics caught in pod workers; each pod is synced again after a back-off.\n\
             # TYPE deckhand_pod_worker_panics_total counter\n\
             deckhand_pod_worker_panics_total {}\n\
             # HELP deckhand_pod_worker_syncs_interrupted_total Syncs abandoned because their pod was to be terminated.\n\
             # TYPE deckhand_pod_worker_syncs_interrupted_total counter\n\
             deckhand_pod_worker_syncs_interrupted_total {}\n",
            self.panics(),
            self.syncs_interrupted()
        )
    }
}

/// The wait before a worker tries again after its `n`th panic in a row: 1 s, doubling, at
/// most a minute (a bug that always panics must not spin).
pub(crate) fn panic_backoff(n: u32) -> Duration {
    let secs = 1u64 << n.saturating_sub(1).min(6);
    Duration::from_secs(secs.min(60))
}

/// Waits until the newest work for the pod is one that `wanted` picks. The sync in progress
/// is abandoned for a terminate or a kill (a slow pull or hook no longer matters, as upstream
/// cancels a pod's sync once it starts terminating: otherwise a node shutdown's kill would
/// wait for a sync that may never end); a kill in progress only for a terminate.
async fn requested(rx: &mut watch::Receiver<Work>, wanted: fn(&Work) -> bool) {
    if rx.wait_for(wanted).await.is_err() {
        // The sender is gone: only shutdown ends the worker now.
        std::future::pending::<()>().await;
    }
}

fn is_terminate(w: &Work) -> bool {
    matches!(w, Work::Terminate { .. })
}

fn is_stop(w: &Work) -> bool {
    matches!(w, Work::Terminate { .. } | Work::Kill(_))
}

/// The set of pod workers.
pub(crate) struct PodWorkers<R> {
    deps: WorkerDeps<R>,
    handles: HashMap<String, Handle>,
    tracker: TaskTracker,
    cancel: CancellationToken,
    done_tx: mpsc::UnboundedSender<String>,
    /// Which pods have a worker and which of them terminate, for the container GC.
    activity: crate::kubelet::gc::WorkerActivity,
}

impl<R: RuntimeService + ImageService> PodWorkers<R> {
    /// `done_tx` receives the UID of each worker that finished terminating its pod.
    pub(crate) fn new(
        deps: WorkerDeps<R>,
        tracker: TaskTracker,
        cancel: CancellationToken,
        done_tx: mpsc::UnboundedSender<String>,
    ) -> Self {
        deps.prober.on_readiness(readiness_sink(
            deps.states.clone(),
            deps.status_sync.clone(),
        ));
        PodWorkers {
            deps,
            handles: HashMap::new(),
            tracker,
            cancel,
            done_tx,
            activity: crate::kubelet::gc::WorkerActivity::default(),
        }
    }

    /// The shared view of which pods have a worker and which terminate (the container GC
    /// reads it so that it never races a teardown).
    pub(crate) fn activity(&self) -> crate::kubelet::gc::WorkerActivity {
        self.activity.clone()
    }

    /// Hands work to the pod's worker, starting one if needed.
    pub(crate) fn dispatch(&mut self, uid: &str, work: Work) {
        let terminating = matches!(work, Work::Terminate { .. });
        let name = match &work {
            Work::Sync(p) => Some(full_name(p)),
            Work::Terminate { pod, .. } => pod.as_deref().map(full_name),
            Work::Kill(k) => Some(full_name(&k.pod)),
        };
        let killing = matches!(work, Work::Kill(_));
        // Nothing is ever run for a UID that cannot be a path component (the sources refuse
        // such pods; this guards every other way in). Tearing one down is still allowed.
        if !terminating && let Some(problem) = crate::base::safe_names::component_problem(uid) {
            tracing::error!(pod_uid = %uid, pod = ?name, problem, "refusing to run a pod whose UID cannot be a path component");
            return;
        }
        if let Some(handle) = self.handles.get_mut(uid) {
            if handle.terminating && !terminating {
                // A pod being torn down is not brought back by a late update.
                return;
            }
            if handle.killed && !terminating {
                // A killed pod stays stopped; only its removal is still to come.
                return;
            }
            handle.killed |= killing;
            handle.terminating = terminating;
            self.activity.set(uid, terminating);
            if name.is_some() {
                handle.full_name = name;
            }
            note_mirror(self.deps.mirror_pods.as_ref(), uid, &work);
            handle.tx.send_replace(work);
            return;
        }
        note_mirror(self.deps.mirror_pods.as_ref(), uid, &work);
        self.activity.set(uid, terminating);
        let (tx, rx) = watch::channel(work);
        let poke = Arc::new(Notify::new());
        self.handles.insert(
            uid.to_string(),
            Handle {
                tx,
                poke: poke.clone(),
                terminating,
                full_name: name,
                killed: killing,
            },
        );
        let deps = self.deps.clone();
        let cancel = self.cancel.clone();
        let done = self.done_tx.clone();
        let uid = uid.to_string();
        let span = tracing::info_span!("pod_worker", pod_uid = %uid);
        let channels = WorkerChannels {
            rx,
            poke,
            done,
            activity: self.activity.clone(),
        };
        self.tracker
            .spawn(worker_loop(uid, channels, deps, cancel).instrument(span));
    }

    /// Asks the worker to look at its pod again now (the runtime changed).
    pub(crate) fn poke(&self, uid: &str) {
        if let Some(h) = self.handles.get(uid) {
            h.poke.notify_one();
        }
    }

    /// True when a worker exists for the UID.
    pub(crate) fn has(&self, uid: &str) -> bool {
        self.handles.contains_key(uid)
    }

    /// True when another UID with this full name is still being torn down.
    pub(crate) fn terminating_other(&self, uid: &str, full_name: &str) -> bool {
        self.handles
            .iter()
            .any(|(u, h)| u != uid && h.terminating && h.full_name.as_deref() == Some(full_name))
    }

    /// Publishes a pod refused at admission as upstream's `rejectPod` sets it: phase Failed,
    /// the reason and message, the QoS class. Nothing runs for it.
    pub(crate) fn refused(&self, pod: &Arc<Pod>, reason: &str, message: &str) {
        let status = k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Failed".into()),
            reason: Some(reason.into()),
            message: Some(message.into()),
            qos_class: Some(crate::base::podspec::qos_class(pod).as_str().to_string()),
            ..Default::default()
        };
        self.deps.states.publish(pod.clone(), status);
    }

    /// Publishes a pod's final status as it is (an evicted pod: Failed, reason Evicted).
    pub(crate) fn publish_final(
        &self,
        pod: &Arc<Pod>,
        status: k8s_openapi::api::core::v1::PodStatus,
    ) {
        self.deps.states.publish(pod.clone(), status);
    }

    /// Forgets a worker that reported it is done.
    pub(crate) fn finished(&mut self, uid: &str) {
        self.handles.remove(uid);
        self.activity.forget(uid);
    }
}

/// Where the probe manager writes readiness verdicts at once: into the pod's published status
/// (then `/pods`), and on to the API server's status writer. The pod's worker, poked too,
/// computes the same status on its next sync.
fn readiness_sink(
    states: PodStates,
    status_sync: Option<crate::kubelet::pod_status::api_writer::StatusSync>,
) -> crate::kubelet::prober::manager::ReadinessSink {
    Arc::new(move |uid: &str, container_id: &str, ready: bool| {
        let now = clock::now();
        let changed = states.update(uid, |pod, status| {
            crate::kubelet::pod_status::readiness::apply_readiness(
                status,
                pod,
                container_id,
                ready,
                now,
            )
        });
        if !changed {
            return;
        }
        tracing::debug!(pod_uid = %uid, container_id, ready, "readiness published");
        if let Some(sync) = &status_sync {
            sync.changed(uid);
        }
    })
}

/// Tells the mirror pods where a static pod is going.
fn note_mirror(mirrors: Option<&crate::kubelet::mirror_pods::MirrorPods>, uid: &str, work: &Work) {
    let Some(mirrors) = mirrors else {
        return;
    };
    match work {
        Work::Sync(pod) => mirrors.desired(pod),
        Work::Terminate { .. } => mirrors.terminating(uid),
        // The static pod stays (stopped, Failed): its mirror pod shows that.
        Work::Kill(_) => {}
    }
}

/// What a worker decides by itself from one round to the next: which work to carry out, and
/// when to look again after it. Kept apart from the waiting and the acting (the async
/// [`worker_loop`]) so that every decision is a plain function of what happened, table-tested
/// in `step_tests`.
#[derive(Debug, Default)]
struct WorkerState {
    /// Test-only fault injection, from [`WorkerDeps::panic_pod`].
    panic_pod: Option<String>,
    /// The injected panic has been asked for (it is asked for once).
    injected_panic: bool,
    /// Panics caught since the last sync that completed: the back-off grows with them.
    panics_in_a_row: u32,
    /// For upstream's metrics: the pod last synced (a new pod object is an update).
    last_synced: Option<Arc<Pod>>,
    /// For upstream's metrics: the pod's start has been recorded.
    start_recorded: bool,
    /// The kill asked for has been carried out, or the pod finished and was stopped: nothing
    /// is synced any more.
    killed: bool,
    /// The pod finished by itself (it was not killed from outside): a later look at it reads
    /// it again and publishes its status again, still starting nothing (an OOM kill the event
    /// stream tells of after the exit still names the container's reason).
    finished: bool,
}

/// What happened, as the worker's state machine hears it.
#[derive(Debug)]
enum Event {
    /// The newest work was picked up.
    Picked(Work),
    /// The pod is killed and its final status published.
    Killed,
    /// Killing the pod failed.
    KillFailed,
    /// A sync of `pod` completed and asks to be looked at again after `wait`. `running`: the
    /// pod runs with every container started (see [`pod_started`]); `finished`: the status it
    /// published has a terminal phase.
    Synced {
        pod: Arc<Pod>,
        wait: Duration,
        running: bool,
        finished: bool,
    },
    /// Everything of the pod is stopped and removed.
    TornDown,
    /// Tearing the pod down failed.
    TeardownFailed,
    /// The work in progress panicked.
    Panicked(PanicReport),
    /// Newer work came in that abandons the work in progress (a stop during a sync, a
    /// terminate during a kill).
    Interrupted,
}

/// A panic caught in a worker: whose pod, while doing what, and the panic's text.
#[derive(Clone, Debug, PartialEq, Eq)]
struct PanicReport {
    pod: String,
    doing: &'static str,
    message: String,
}

impl PanicReport {
    fn new(payload: &(dyn Any + Send), pod: String, doing: &'static str) -> Self {
        PanicReport {
            pod,
            doing,
            message: panic_message(payload),
        }
    }
}

/// A sync to run, as the state machine asks for it.
#[derive(Debug)]
struct SyncJob {
    pod: Arc<Pod>,
    /// Test-only: panic in this sync (`DECKHAND_TEST_PANIC_POD`).
    inject_panic: bool,
    /// For upstream's metrics: `create` (first sync), `update` (a new pod object) or `sync`.
    operation: &'static str,
}

/// What the worker is to do next, as its state machine says; the async driver does it.
#[derive(Debug)]
enum Action {
    Kill(Kill),
    Sync(SyncJob),
    Terminate {
        pod: Option<Arc<Pod>>,
        grace_override: Option<i64>,
    },
    /// Record upstream's start-up metrics for the pod (once per worker).
    RecordStart(Arc<Pod>),
    /// Count and log a caught panic; the worker tries again `wait` later.
    ReportPanic {
        report: PanicReport,
        wait: Duration,
    },
    /// Wait for new work, a poke or this long, then look at the work again.
    WaitFor(Duration),
    /// Look at the (newer) work at once.
    LookNow,
    /// The pod is gone: report the worker done and end it.
    Finish,
}

/// How long a worker waits before it tries a failed kill again.
const KILL_RETRY: Duration = Duration::from_secs(1);

/// How long a worker waits before it tries a failed teardown again.
const TEARDOWN_RETRY: Duration = Duration::from_secs(2);

impl WorkerState {
    fn new(panic_pod: Option<String>) -> Self {
        WorkerState {
            panic_pod,
            ..Default::default()
        }
    }

    /// The state machine's one transition: takes in what happened, says what to do.
    fn step(&mut self, event: Event) -> Vec<Action> {
        match event {
            Event::Picked(work) => vec![self.pick(work)],
            Event::Killed => {
                self.killed = true;
                vec![Action::WaitFor(KILLED_IDLE)]
            }
            Event::KillFailed => vec![Action::WaitFor(KILL_RETRY)],
            Event::Synced {
                pod,
                wait,
                running,
                finished,
            } => {
                self.panics_in_a_row = 0;
                if finished && !self.killed {
                    // Nothing will run again: stop what is left and keep the containers.
                    self.finished = true;
                    return vec![Action::Kill(Kill::finished(pod))];
                }
                let mut actions = vec![Action::WaitFor(wait)];
                if running && !self.start_recorded {
                    self.start_recorded = true;
                    actions.push(Action::RecordStart(pod));
                }
                actions
            }
            Event::TornDown => vec![Action::Finish],
            Event::TeardownFailed => vec![Action::WaitFor(TEARDOWN_RETRY)],
            Event::Panicked(report) => {
                self.panics_in_a_row += 1;
                let wait = panic_backoff(self.panics_in_a_row);
                vec![Action::ReportPanic { report, wait }, Action::WaitFor(wait)]
            }
            Event::Interrupted => vec![Action::LookNow],
        }
    }

    /// What to do with the newest work: a killed pod is synced and killed no more (only its
    /// removal is still to come); a pod its source shows finished is never started again,
    /// only stopped (upstream: a terminal phase is never left); a sync notes what upstream's
    /// metrics call it.
    fn pick(&mut self, work: Work) -> Action {
        match work {
            Work::Sync(pod) if self.killed && self.finished => Action::Kill(Kill::finished(pod)),
            Work::Sync(_) | Work::Kill(_) if self.killed => Action::WaitFor(KILLED_IDLE),
            Work::Kill(kill) => Action::Kill(kill),
            Work::Sync(pod) if crate::base::podspec::pod::phase_is_terminal(&pod) => {
                self.finished = true;
                Action::Kill(Kill::finished(pod))
            }
            Work::Sync(pod) => {
                let inject_panic = !self.injected_panic
                    && self.panic_pod.as_deref() == pod.metadata.name.as_deref();
                self.injected_panic |= inject_panic;
                let operation = match &self.last_synced {
                    None => "create",
                    Some(last) if !Arc::ptr_eq(last, &pod) => "update",
                    Some(_) => "sync",
                };
                self.last_synced = Some(pod.clone());
                Action::Sync(SyncJob {
                    pod,
                    inject_panic,
                    operation,
                })
            }
            Work::Terminate {
                pod,
                grace_override,
            } => Action::Terminate {
                pod,
                grace_override,
            },
        }
    }
}

/// What connects one worker to the rest: its work, its pokes, where it reports its end, and
/// the activity the container GC reads (a finished pod is noted there).
struct WorkerChannels {
    rx: watch::Receiver<Work>,
    poke: Arc<Notify>,
    done: mpsc::UnboundedSender<String>,
    activity: crate::kubelet::gc::WorkerActivity,
}

/// The worker task of one pod: waits for new work, a poke or its next look, hands what
/// happened to [`WorkerState::step`] and carries out what it says, until the pod is torn down
/// or the agent shuts down.
async fn worker_loop<R: RuntimeService + ImageService>(
    uid: String,
    channels: WorkerChannels,
    deps: WorkerDeps<R>,
    cancel: CancellationToken,
) {
    let WorkerChannels {
        mut rx,
        poke,
        done,
        activity,
    } = channels;
    let mut state = initial_sync_state(&uid, &deps);
    let mut worker = WorkerState::new(deps.panic_pod.clone());
    // For upstream's metrics: when the worker first saw the pod.
    let first_seen = clock::instant();
    let mut next = clock::instant();
    // Look at the work at once (first round, or newer work that interrupted the last).
    let mut immediate = true;
    loop {
        if !immediate {
            tokio::select! {
                _ = cancel.cancelled() => return,
                changed = rx.changed() => if changed.is_err() { return },
                _ = poke.notified() => {},
                _ = tokio::time::sleep_until(next) => {},
            }
        }
        immediate = false;
        let work = rx.borrow_and_update().clone();
        let mut todo = VecDeque::from(worker.step(Event::Picked(work)));
        while let Some(action) = todo.pop_front() {
            let ran = match action {
                Action::Kill(kill) => {
                    let ran = run_kill(&uid, &kill, &mut state, &deps, &mut rx, &cancel).await;
                    if matches!(ran, Some(Event::Killed)) {
                        activity.finished(&uid);
                    }
                    ran
                }
                Action::Sync(job) => {
                    run_sync(&uid, &job, &mut state, &deps, &mut rx, &cancel).await
                }
                Action::Terminate {
                    pod,
                    grace_override,
                } => run_terminate(&uid, pod, grace_override, &deps, &cancel).await,
                Action::RecordStart(pod) => {
                    record_pod_start(&pod, &state, first_seen);
                    continue;
                }
                Action::ReportPanic { report, wait } => {
                    deps.stats.caught_panic(&report, wait);
                    continue;
                }
                Action::WaitFor(wait) => {
                    next = clock::instant() + wait;
                    continue;
                }
                Action::LookNow => {
                    immediate = true;
                    continue;
                }
                Action::Finish => {
                    let _ = done.send(uid);
                    return;
                }
            };
            // `None`: the agent is shutting down.
            let Some(event) = ran else {
                return;
            };
            todo.extend(worker.step(event));
        }
    }
}

/// The pod's sync state as its worker starts: what the executor kept of it, and whether the
/// runtime has to be read before the first sync.
fn initial_sync_state<R: RuntimeService + ImageService>(
    uid: &str,
    deps: &WorkerDeps<R>,
) -> PodSyncState {
    let mut state = deps.executor.load_state(uid);
    // Only this worker creates objects for its UID, and a worker that ended removed them all:
    // when a relist has completed and neither it nor a worker since saw anything of the pod,
    // the runtime holds nothing of it and the first sync need not read it (on a node starting
    // many pods at once, two list calls per pod that each walk every container).
    let cached = deps.runtime_cache.pod(uid);
    state.known_empty = deps.runtime_cache.has_relisted() && cached.is_none();
    // A pod the relist saw (adopted after a restart) is read from there on through its own
    // sandbox, not by lists of the node.
    state.reread = cached.is_some();
    state.view = cached;
    state
}

/// Carries out a [`Work::Kill`]: stops the pod and publishes its final status, unless a
/// terminate comes in first (it abandons the kill). `None` when the agent shuts down.
async fn run_kill<R: RuntimeService + ImageService>(
    uid: &str,
    kill: &Kill,
    state: &mut PodSyncState,
    deps: &WorkerDeps<R>,
    rx: &mut watch::Receiver<Work>,
    cancel: &CancellationToken,
) -> Option<Event> {
    deps.prober.remove_pod(uid);
    let span = tracing::info_span!("kill", pod = %full_name(&kill.pod), grace = kill.grace);
    let started = clock::instant();
    // Boxed, as the sync and the teardown: each is a future of tens of KiB, which inline
    // would make every idle worker's task that large.
    let once = Box::pin(kill_once(uid, kill, state, deps).instrument(span));
    let result = tokio::select! {
        _ = cancel.cancelled() => return None,
        _ = requested(rx, is_terminate) => {
            tracing::info!("the pod is to be terminated; the kill in progress is abandoned");
            return Some(Event::Interrupted);
        }
        r = AssertUnwindSafe(once).catch_unwind() => r,
    };
    Some(match result {
        Ok(Ok(())) => {
            let elapsed_ms = started.elapsed().as_millis() as u64;
            let pod = full_name(&kill.pod);
            match &kill.outcome {
                Some(outcome) => {
                    tracing::info!(%pod, reason = %outcome.reason, elapsed_ms, "pod killed")
                }
                None => tracing::info!(
                    %pod,
                    elapsed_ms,
                    "pod finished and stopped; its containers and logs are kept until it is removed"
                ),
            }
            kill.done.cancel();
            Event::Killed
        }
        Ok(Err(err)) => {
            tracing::warn!(pod = %full_name(&kill.pod), error = %err, "killing the pod failed; will retry");
            Event::KillFailed
        }
        Err(payload) => Event::Panicked(PanicReport::new(
            payload.as_ref(),
            full_name(&kill.pod),
            "killing",
        )),
    })
}

/// Carries out one sync of the pod, unless a terminate or a kill comes in first (it abandons
/// the sync). `None` when the agent shuts down.
async fn run_sync<R: RuntimeService + ImageService>(
    uid: &str,
    job: &SyncJob,
    state: &mut PodSyncState,
    deps: &WorkerDeps<R>,
    rx: &mut watch::Receiver<Work>,
    cancel: &CancellationToken,
) -> Option<Event> {
    let span = tracing::info_span!("sync", pod = %full_name(&job.pod));
    let began = clock::instant();
    let sync = Box::pin(sync_once(uid, &job.pod, state, deps, job.inject_panic).instrument(span));
    let result = tokio::select! {
        _ = cancel.cancelled() => return None,
        _ = requested(rx, is_stop) => {
            deps.stats.syncs_interrupted.fetch_add(1, Ordering::Relaxed);
            tracing::info!("the pod is to be stopped; the sync in progress is abandoned");
            return Some(Event::Interrupted);
        }
        r = AssertUnwindSafe(sync).catch_unwind() => r,
    };
    Some(match result {
        Ok(wait) => {
            crate::base::metrics::KUBELET
                .pod_worker_duration
                .observe(&[job.operation], began.elapsed().as_secs_f64());
            Event::Synced {
                pod: job.pod.clone(),
                wait,
                running: pod_started(state),
                finished: state
                    .status
                    .as_ref()
                    .is_some_and(|s| matches!(s.phase.as_deref(), Some("Succeeded" | "Failed"))),
            }
        }
        Err(payload) => Event::Panicked(PanicReport::new(
            payload.as_ref(),
            full_name(&job.pod),
            "syncing",
        )),
    })
}

/// Carries out a [`Work::Terminate`]: stops and removes everything of the pod and tells those
/// who follow it (nothing interrupts a teardown). `None` when the agent shuts down.
async fn run_terminate<R: RuntimeService + ImageService>(
    uid: &str,
    pod: Option<Arc<Pod>>,
    grace_override: Option<i64>,
    deps: &WorkerDeps<R>,
    cancel: &CancellationToken,
) -> Option<Event> {
    let previous = deps.states.status(uid);
    deps.states.forget(uid);
    deps.prober.remove_pod(uid);
    let name = pod
        .as_deref()
        .map(full_name)
        .unwrap_or_else(|| "(orphan)".into());
    let span = tracing::info_span!("terminate", pod = %name);
    let started = clock::instant();
    let teardown = Box::pin(
        async {
            let last = last_status(uid, pod.as_deref(), grace_override, previous, deps).await;
            deps.executor
                .terminate_pod(uid, pod.as_deref(), grace_override)
                .await
                .map(|()| last)
        }
        .instrument(span),
    );
    let result = tokio::select! {
        _ = cancel.cancelled() => return None,
        r = AssertUnwindSafe(teardown).catch_unwind() => r,
    };
    Some(match result {
        Ok(Ok(last)) => {
            tracing::info!(
                elapsed_ms = started.elapsed().as_millis() as u64,
                "pod terminated and removed"
            );
            crate::base::metrics::KUBELET
                .pod_worker_duration
                .observe(&["terminated"], started.elapsed().as_secs_f64());
            deps.runtime_cache.update_pod(uid, ObservedPod::default());
            if let (Some(sync), Some(pod)) = (&deps.status_sync, pod) {
                sync.torn_down_with(pod, last);
            }
            if let Some(mirrors) = &deps.mirror_pods {
                mirrors.torn_down(uid);
            }
            Event::TornDown
        }
        Ok(Err(err)) => {
            tracing::warn!(error = %err, "tearing the pod down failed; will retry");
            Event::TeardownFailed
        }
        Err(payload) => Event::Panicked(PanicReport::new(
            payload.as_ref(),
            name,
            "tearing the pod down",
        )),
    })
}

/// For a pod the API server is deleting: stops it (preStop hooks within the grace period) and
/// returns the status it ended with, its containers terminated with their exit codes and
/// times, for the status writer to write before the deletion (upstream's
/// `syncTerminatingPod`). None for other pods, for one with no container left, or when the
/// stop fails (the teardown that follows retries it).
async fn last_status<R: RuntimeService + ImageService>(
    uid: &str,
    pod: Option<&Pod>,
    grace_override: Option<i64>,
    previous: Option<k8s_openapi::api::core::v1::PodStatus>,
    deps: &WorkerDeps<R>,
) -> Option<k8s_openapi::api::core::v1::PodStatus> {
    let pod = pod.filter(|p| {
        deps.status_sync.is_some()
            && p.metadata.deletion_timestamp.is_some()
            && crate::kubelet::pod_status::api_writer::from_api(p)
    })?;
    let grace = crate::kubelet::runtime::executor::grace_period(Some(pod), grace_override);
    let observed = match deps.executor.kill_pod(uid, pod, grace).await {
        Ok(observed) => observed,
        Err(err) => {
            tracing::warn!(error = %err, "stopping the deleted pod failed; the teardown retries");
            return None;
        }
    };
    // Nothing of the pod is left (a second teardown, after the deletion's first): the status
    // written then stands.
    if observed.containers.is_empty() {
        return None;
    }
    let no_probes = HashMap::new();
    Some(compute_pod_status(
        pod,
        &observed,
        &StatusInputs {
            now: clock::now(),
            host_ip: deps.host_ip.clone(),
            waiting: &HashMap::new(),
            previous: previous.as_ref(),
            terminating: true,
            probes: &no_probes,
        },
    ))
}

/// True once the pod runs with every container started: when upstream's start-up metrics
/// are taken ([`record_pod_start`]).
fn pod_started(state: &PodSyncState) -> bool {
    let Some(status) = state.status.as_ref() else {
        return false;
    };
    let all_running = status.container_statuses.as_ref().is_some_and(|cs| {
        !cs.is_empty()
            && cs
                .iter()
                .all(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
    });
    status.phase.as_deref() == Some("Running") && all_running
}

/// Records upstream's start-up metrics, once the pod has started ([`pod_started`]): from
/// first seen to running, and the SLI (from creation, less image and init-container time;
/// the creation of a static pod is when the node first saw it).
fn record_pod_start(pod: &Pod, state: &PodSyncState, first_seen: Instant) {
    let Some(status) = state.status.as_ref() else {
        return;
    };
    let m = &crate::base::metrics::KUBELET;
    m.pod_start_duration
        .observe(&[], first_seen.elapsed().as_secs_f64());
    // A static pod has no creation time of its own: the node seeing it is its creation.
    let since_creation = match pod.metadata.creation_timestamp.as_ref() {
        Some(created) => clock::timestamp().duration_since(created.0).as_secs_f64(),
        None => first_seen.elapsed().as_secs_f64(),
    };
    let init_time: f64 = status
        .init_container_statuses
        .iter()
        .flatten()
        .filter_map(|c| c.state.as_ref()?.terminated.as_ref())
        .filter_map(|t| {
            let (start, end) = (t.started_at.as_ref()?, t.finished_at.as_ref()?);
            Some(end.0.duration_since(start.0).as_secs_f64())
        })
        .sum();
    let sli = since_creation - state.image_time.as_secs_f64() - init_time;
    m.pod_start_sli_duration.observe(&[], sli.max(0.0));
}

/// How long a worker whose pod was killed sleeps between looks at its (unchanging) work.
const KILLED_IDLE: Duration = Duration::from_secs(3600);

/// Stops the pod for a [`Work::Kill`] and publishes its final status.
async fn kill_once<R: RuntimeService + ImageService>(
    uid: &str,
    kill: &Kill,
    state: &mut PodSyncState,
    deps: &WorkerDeps<R>,
) -> Result<(), crate::kubelet::runtime::executor::TeardownError> {
    let mut observed = deps.executor.kill_pod(uid, &kill.pod, kill.grace).await?;
    deps.executor
        .fill_termination_messages(&kill.pod, &mut observed, &mut state.messages);
    // An OOM kill the last sync's view named (told by the event stream, which need not
    // remember it by now) stays one in the final status.
    if let Some(before) = state.view.as_ref() {
        crate::kubelet::runtime::inspect::name_heard_ooms(&mut observed, |id| {
            before
                .containers
                .iter()
                .any(|b| b.id == id && b.reason == "OOMKilled")
        });
    }
    deps.runtime_cache.update_pod(uid, observed.clone());
    let now = clock::now();
    let no_probes = HashMap::new();
    // A pod its source already shows finished keeps that phase (upstream never leaves one);
    // when the runtime has nothing of it either (refused, or removed before), the source's
    // status is all there is to say.
    let from_source = kill
        .pod
        .status
        .as_ref()
        .filter(|_| crate::base::podspec::pod::phase_is_terminal(&kill.pod));
    let nothing_here = observed.containers.is_empty() && observed.sandboxes.is_empty();
    let mut status = match from_source {
        Some(source) if nothing_here && state.status.is_none() => source.clone(),
        _ => compute_pod_status(
            &kill.pod,
            &observed,
            &StatusInputs {
                now,
                host_ip: deps.host_ip.clone(),
                waiting: &state.waiting,
                previous: state.status.as_ref().or(from_source),
                terminating: true,
                probes: &no_probes,
            },
        ),
    };
    if let Some(outcome) = &kill.outcome {
        outcome.apply(&mut status, now);
    }
    state.status = Some(status.clone());
    deps.states.publish(kill.pod.clone(), status);
    if let Some(mirrors) = &deps.mirror_pods {
        mirrors.synced(&kill.pod);
    }
    if let Some(sync) = &deps.status_sync {
        sync.changed(uid);
    }
    // The pod is terminal: its volumes go now (the node shutdown manager waits for their
    // unmount); a failure is retried by the pod's removal later.
    if let Err(err) = deps.executor.unmount_volumes(uid).await {
        tracing::warn!(error = %err, "cannot unmount the killed pod's volumes");
    }
    deps.executor.release_claims(uid).await;
    Ok(())
}

/// One sync of a pod: act, then publish the status. Returns when to look again.
async fn sync_once<R: RuntimeService + ImageService>(
    uid: &str,
    pod: &Arc<Pod>,
    state: &mut PodSyncState,
    deps: &WorkerDeps<R>,
    inject_panic: bool,
) -> Duration {
    if inject_panic {
        panic!(
            "DECKHAND_TEST_PANIC_POD: injected panic for {}",
            full_name(pod)
        );
    }
    let unhealthy = deps.prober.unhealthy(uid);
    // A probe asks to kill an instance the last view shows running: the kill starts on that
    // view, with no read of the pod first (whatever else changed is read after the step).
    state.act_on_view |= state.view.as_ref().is_some_and(|view| {
        view.containers
            .iter()
            .any(|c| c.state == ContainerState::Running && unhealthy.contains_key(&c.id))
    });
    let probes_before = deps.prober.results(uid);
    let outcome = deps
        .executor
        .sync_pod(pod, state, &unhealthy, &probes_before)
        .await;
    if outcome.runtime_unreachable {
        // Keep the last status while the runtime cannot be read.
        return outcome.retry_after.unwrap_or(deps.sync_frequency);
    }
    deps.runtime_cache.update_pod(uid, outcome.observed.clone());
    deps.prober.sync_pod(pod, &outcome.observed);
    let probes = deps.prober.results(uid);
    // The status as published, readiness verdicts written in since this worker's last one
    // included: their transition times are kept.
    let published = deps.states.status(uid);
    let status = compute_pod_status(
        pod,
        &outcome.observed,
        &StatusInputs {
            now: clock::now(),
            host_ip: deps.host_ip.clone(),
            waiting: &state.waiting,
            previous: published.as_ref().or(state.status.as_ref()),
            terminating: false,
            probes: &probes,
        },
    );
    let status = crate::kubelet::pod_status::resize_conditions::with_actuated(
        status,
        pod,
        (
            &state.actuated,
            match &state.actuated_pod {
                Some(given) => given.as_ref(),
                None => crate::base::podspec::pod_level::pod_resources(pod),
            },
        ),
        state.resize_error.as_deref(),
        published.as_ref().or(state.status.as_ref()),
        clock::now(),
    );
    let app_containers = pod
        .spec
        .as_ref()
        .map_or(&[][..], |s| s.containers.as_slice());
    let status = crate::kubelet::pod_status::allocated_resources::with_allocated_resources(
        status,
        app_containers,
        &|c| deps.executor.allocated_resources_status(pod, c),
    );
    state.status = Some(status.clone());
    deps.states.publish(pod.clone(), status);
    if let Some(mirrors) = &deps.mirror_pods {
        mirrors.synced(pod);
    }
    if let Some(sync) = &deps.status_sync {
        sync.changed(pod.metadata.uid.as_deref().unwrap_or_default());
    }
    outcome
        .retry_after
        .unwrap_or(deps.sync_frequency)
        .min(deps.sync_frequency)
}

/// A pod worker set on the in-memory runtime, for unit tests here and in the sync loop.
#[cfg(test)]
pub(crate) mod test_support {
    use std::future::Future;

    use k8s_openapi::api::core::v1::{Container, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::clients::cri::fake::FakeCri;
    use crate::config::CgroupDriver;
    use crate::kubelet::runtime::backoff::BackoffPolicy;
    use crate::kubelet::runtime::executor::NodeContext;
    use crate::kubelet::runtime::inspect::DetailCache;
    use crate::kubelet::runtime::translate::HostDns;

    pub(crate) const IMAGE: &str = "example.test/app:1";

    pub(crate) struct Harness {
        pub rt: FakeCri,
        pub workers: PodWorkers<FakeCri>,
        pub stats: WorkerStats,
        pub states: PodStates,
        pub runtime_cache: RuntimeCache,
        pub done: mpsc::UnboundedReceiver<String>,
        pub cancel: CancellationToken,
        pub dir: tempfile::TempDir,
        /// The events the workers recorded, in order.
        pub events: mpsc::Receiver<k8s_openapi::api::core::v1::Event>,
        /// Where the probe manager asks for a look at a pod (no sync loop takes from it here).
        pub probe_pokes: crate::base::resync_queue::Pokes,
    }

    pub(crate) fn harness(rt: FakeCri) -> Harness {
        harness_with_objects(rt, None)
    }

    /// [`harness`] whose executor reads API objects through `objects`.
    pub(crate) fn harness_with_objects(
        rt: FakeCri,
        objects: Option<crate::kubelet::api_objects::ApiObjects>,
    ) -> Harness {
        harness_full(rt, objects, None)
    }

    /// [`harness`] whose executor knows the PLEG's mode through `pleg`.
    pub(crate) fn harness_with_pleg(rt: FakeCri, pleg: crate::kubelet::pleg::PlegState) -> Harness {
        harness_full(rt, None, Some(pleg))
    }

    fn harness_full(
        rt: FakeCri,
        objects: Option<crate::kubelet::api_objects::ApiObjects>,
        pleg: Option<crate::kubelet::pleg::PlegState>,
    ) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let node = Arc::new(NodeContext {
            node_name: "node-a".into(),
            host_ip: Some("192.0.2.10".into()),
            root_dir: dir.path().join("root"),
            pod_logs_dir: dir.path().join("logs"),
            host_dns: HostDns::default(),
            cluster_domain: None,
            cluster_dns: vec![],
            cgroup_driver: CgroupDriver::Cgroupfs,
            cgroup_root: "/".into(),
            cgroups_per_qos: true,
            cgroup_fs: dir.path().join("cgroup"),
            node_memory_bytes: 1 << 30,
            allocatable: crate::base::podspec::resources::NodeAllocatable {
                cpu_millis: 2000,
                memory_bytes: 1 << 30,
                ephemeral_storage_bytes: 10 << 30,
            },
            runtime_request_timeout: Duration::from_secs(5),
            image_pull_progress_deadline: Some(Duration::from_secs(60)),
            seccomp_default: false,
            mounter: Arc::new(crate::kubelet::volume::mounter::fake::FakeMounter::default()),
            node_labels: Default::default(),
            userns: None,
            devices: None,
            dra: None,
        });
        let cancel = CancellationToken::new();
        let stats = WorkerStats::default();
        let states = PodStates::default();
        let runtime_cache = RuntimeCache::default();
        let (done_tx, done) = mpsc::unbounded_channel();
        let (recorder, events) = crate::kubelet::events::Recorder::to_api("node-a");
        let probe_pokes = crate::base::resync_queue::Pokes::default();
        let deps = WorkerDeps {
            executor: {
                let executor = Executor::new(
                    rt.clone(),
                    node,
                    DetailCache::default(),
                    BackoffPolicy::default(),
                    recorder,
                );
                let executor = match pleg {
                    Some(p) => executor.with_pleg(Arc::new(p)),
                    None => executor,
                };
                match objects {
                    Some(o) => executor.with_api_objects(o),
                    None => executor,
                }
            },
            prober: ProbeManager::new(
                rt.clone(),
                probe_pokes.clone(),
                None,
                TaskTracker::new(),
                crate::kubelet::events::Recorder::log_only("node"),
                cancel.clone(),
            ),
            states: states.clone(),
            runtime_cache: runtime_cache.clone(),
            sync_frequency: Duration::from_secs(60),
            host_ip: Some("192.0.2.10".into()),
            stats: stats.clone(),
            status_sync: None,
            mirror_pods: None,
            panic_pod: None,
        };
        Harness {
            rt,
            workers: PodWorkers::new(deps, TaskTracker::new(), cancel.clone(), done_tx),
            stats,
            states,
            runtime_cache,
            done,
            cancel,
            dir,
            events,
            probe_pokes,
        }
    }

    /// The (reason, message) of every event recorded so far.
    pub(crate) fn drain_events(h: &mut Harness) -> Vec<(String, String)> {
        let mut out = Vec::new();
        while let Ok(e) = h.events.try_recv() {
            out.push((e.reason.unwrap_or_default(), e.message.unwrap_or_default()));
        }
        out
    }

    /// A pod `web` with one container of [`IMAGE`].
    pub(crate) fn pod(uid: &str) -> Arc<Pod> {
        Arc::new(Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                // As the sources set it: the objects' node label comes from it.
                node_name: Some("node-a".into()),
                containers: vec![Container {
                    name: "app".into(),
                    image: Some(IMAGE.into()),
                    image_pull_policy: Some("IfNotPresent".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    /// Waits (in the paused clock's time) until `check` holds.
    pub(crate) async fn eventually<F, Fut>(what: &str, mut check: F)
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !check().await {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;
    use crate::clients::cri::fake::{FakeCri, Script};

    /// `pod(uid)` under `restartPolicy` `policy`, with its source's `phase` if any.
    fn pod_with(uid: &str, policy: &str, phase: Option<&str>) -> Arc<Pod> {
        let mut p = (*pod(uid)).clone();
        p.spec.as_mut().unwrap().restart_policy = Some(policy.into());
        p.status = phase.map(|phase| k8s_openapi::api::core::v1::PodStatus {
            phase: Some(phase.into()),
            ..Default::default()
        });
        Arc::new(p)
    }

    /// A pod that ran to completion is stopped and kept: its exited container stays (for its
    /// logs), its sandbox is stopped, nothing starts again, the GC sees it finished; only its
    /// removal takes the container and sandbox away.
    #[tokio::test(start_paused = true)]
    async fn a_finished_pod_is_stopped_and_kept_until_it_is_removed() {
        let mut h = harness(FakeCri::with_images(&[IMAGE]));
        let p = pod_with("uid-f", "Never", None);
        h.workers.dispatch("uid-f", Work::Sync(p.clone()));
        eventually("the container started", || async {
            h.rt.count("StartContainer") == 1
        })
        .await;
        let id = h.rt.containers()[0].id.clone();
        h.rt.exit_container(&id);
        h.workers.poke("uid-f");
        let activity = h.workers.activity();
        eventually("the finished pod stopped", || async {
            activity.activity("uid-f") == crate::kubelet::gc::PodActivity::Finished
        })
        .await;
        let status = h.states.status("uid-f").expect("a status");
        assert_eq!(status.phase.as_deref(), Some("Succeeded"));
        assert_eq!(h.rt.count("RemoveContainer"), 0, "{:?}", h.rt.calls());
        assert_eq!(h.rt.count("RemovePodSandbox"), 0, "{:?}", h.rt.calls());
        assert_eq!(h.rt.containers().len(), 1, "the exited container is kept");
        let sandboxes = h.rt.sandboxes();
        assert_eq!(sandboxes.len(), 1);
        assert_eq!(
            sandboxes[0].state,
            crate::clients::cri::proto::PodSandboxState::SandboxNotready as i32,
            "the sandbox is stopped"
        );
        // Its source shows it Succeeded now; later looks start nothing and remove nothing.
        h.workers.dispatch(
            "uid-f",
            Work::Sync(pod_with("uid-f", "Never", Some("Succeeded"))),
        );
        tokio::time::sleep(Duration::from_secs(300)).await;
        assert_eq!(h.rt.count("StartContainer"), 1);
        assert_eq!(h.rt.containers().len(), 1);
        h.workers.dispatch(
            "uid-f",
            Work::Terminate {
                pod: Some(p),
                grace_override: None,
            },
        );
        let done = tokio::time::timeout(Duration::from_secs(60), h.done.recv()).await;
        assert_eq!(done.ok().flatten().as_deref(), Some("uid-f"));
        assert!(h.rt.containers().is_empty() && h.rt.sandboxes().is_empty());
        h.cancel.cancel();
    }

    /// A pod its source already shows finished (an agent restarted after it completed) is
    /// never started, whatever its restart policy: its leftovers are stopped and kept.
    #[tokio::test(start_paused = true)]
    async fn a_pod_its_source_shows_finished_is_never_started() {
        let mut h = harness(FakeCri::with_images(&[IMAGE]));
        let p = pod_with("uid-g", "Always", Some("Failed"));
        h.workers.dispatch("uid-g", Work::Sync(p));
        let activity = h.workers.activity();
        eventually("the finished pod stopped", || async {
            activity.activity("uid-g") == crate::kubelet::gc::PodActivity::Finished
        })
        .await;
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(h.rt.count("RunPodSandbox"), 0, "{:?}", h.rt.calls());
        assert_eq!(h.rt.count("StartContainer"), 0);
        let status = h.states.status("uid-g").expect("a status");
        assert_eq!(
            status.phase.as_deref(),
            Some("Failed"),
            "the source's phase stays"
        );
        h.cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_sync_is_caught_counted_and_retried() {
        let rt = FakeCri::with_images(&[IMAGE]);
        rt.script("ListPodSandbox", Script::Panic);
        let mut h = harness(rt);
        h.workers.dispatch("uid-1", Work::Sync(pod("uid-1")));
        eventually("the container started after the panic", || async {
            h.rt.count("StartContainer") == 1
        })
        .await;
        assert_eq!(h.stats.panics(), 1);
        eventually("a status published", || async {
            h.states.status("uid-1").is_some()
        })
        .await;
        assert!(
            h.stats
                .render()
                .contains("deckhand_pod_worker_panics_total 1\n")
        );
        // The worker is still alive and serves a terminate.
        h.workers.dispatch(
            "uid-1",
            Work::Terminate {
                pod: Some(pod("uid-1")),
                grace_override: Some(0),
            },
        );
        let done = tokio::time::timeout(Duration::from_secs(60), h.done.recv()).await;
        assert_eq!(done.ok().flatten().as_deref(), Some("uid-1"));
        assert!(h.rt.sandboxes().is_empty() && h.rt.containers().is_empty());
        h.cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_terminate_interrupts_a_sync_that_hangs() {
        // The image is missing, and its pull never ends (PullImage has no deadline).
        let rt = FakeCri::default();
        rt.script("PullImage", Script::Hang);
        let mut h = harness(rt);
        h.workers.dispatch("uid-2", Work::Sync(pod("uid-2")));
        eventually("the pull started", || async {
            h.rt.count("PullImage") == 1
        })
        .await;
        h.workers.dispatch(
            "uid-2",
            Work::Terminate {
                pod: Some(pod("uid-2")),
                grace_override: Some(0),
            },
        );
        let done = tokio::time::timeout(Duration::from_secs(60), h.done.recv()).await;
        assert_eq!(
            done.ok().flatten().as_deref(),
            Some("uid-2"),
            "the pod was not torn down while its sync hung"
        );
        assert_eq!(h.stats.syncs_interrupted(), 1);
        assert!(h.rt.sandboxes().is_empty(), "{:?}", h.rt.sandboxes());
        h.cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_kill_interrupts_a_sync_that_hangs() {
        let rt = FakeCri::default();
        rt.script("PullImage", Script::Hang);
        let mut h = harness(rt);
        h.workers.dispatch("uid-k", Work::Sync(pod("uid-k")));
        eventually("the pull started", || async {
            h.rt.count("PullImage") == 1
        })
        .await;
        let done = CancellationToken::new();
        h.workers.dispatch(
            "uid-k",
            Work::Kill(Kill {
                pod: pod("uid-k"),
                grace: 0,
                outcome: Some(FinalStatus {
                    reason: "Terminated".into(),
                    message: "node shutdown".into(),
                    disruption_reason: None,
                }),
                done: done.clone(),
            }),
        );
        tokio::time::timeout(Duration::from_secs(60), done.cancelled())
            .await
            .expect("the pod was not killed while its sync hung");
        assert_eq!(h.stats.syncs_interrupted(), 1);
        let status = h.states.status("uid-k").expect("a final status");
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        assert_eq!(status.reason.as_deref(), Some("Terminated"));
        h.cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn no_worker_runs_a_uid_that_is_not_one_path_component() {
        let mut h = harness(FakeCri::with_images(&[IMAGE]));
        let bad = "x/../../../../tmp/victim";
        h.workers.dispatch(bad, Work::Sync(pod(bad)));
        assert!(!h.workers.has(bad));
        assert!(h.rt.calls().is_empty());
        // Tearing down what the runtime holds under such a UID is still allowed, and touches
        // no file.
        h.workers.dispatch(
            bad,
            Work::Terminate {
                pod: None,
                grace_override: Some(0),
            },
        );
        let done = tokio::time::timeout(Duration::from_secs(60), h.done.recv()).await;
        assert_eq!(done.ok().flatten().as_deref(), Some(bad));
        h.cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn the_newest_request_wins_and_stale_ones_are_skipped() {
        let rt = FakeCri::with_images(&[IMAGE, "example.test/app:2", "example.test/app:3"]);
        rt.script("RunPodSandbox", Script::Hang);
        let mut h = harness(rt);
        let version = |image: &str| {
            let mut p = (*pod("uid-3")).clone();
            p.spec.as_mut().unwrap().containers[0].image = Some(image.into());
            Arc::new(p)
        };
        h.workers.dispatch("uid-3", Work::Sync(pod("uid-3")));
        eventually("the first sync creating its sandbox", || async {
            h.rt.count("RunPodSandbox") == 1
        })
        .await;
        // Two updates while the worker is busy: only the last one is ever acted on.
        h.workers
            .dispatch("uid-3", Work::Sync(version("example.test/app:2")));
        h.workers
            .dispatch("uid-3", Work::Sync(version("example.test/app:3")));
        h.rt.release();
        eventually("the newest image running", || async {
            h.rt.containers().iter().any(|c| {
                c.image
                    .as_ref()
                    .is_some_and(|i| i.image == "example.test/app:3")
                    && c.state == 1
            })
        })
        .await;
        assert!(
            !h.rt
                .created_images()
                .iter()
                .any(|i| i == "example.test/app:2"),
            "a stale update was acted on: {:?}",
            h.rt.created_images()
        );
        h.cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_step_is_retried_without_any_event() {
        let rt = FakeCri::with_images(&[IMAGE]);
        rt.script("RunPodSandbox", Script::Fail(tonic::Code::Unavailable));
        let h = harness(rt);
        let mut workers = h.workers;
        workers.dispatch("uid-4", Work::Sync(pod("uid-4")));
        eventually("the container started after the retry", || async {
            h.rt.count("StartContainer") == 1
        })
        .await;
        assert_eq!(h.rt.count("RunPodSandbox"), 2);
        h.cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn teardown_stops_containers_before_sandboxes_and_removes_everything() {
        let mut h = harness(FakeCri::with_images(&[IMAGE]));
        h.workers.dispatch("uid-5", Work::Sync(pod("uid-5")));
        eventually("running", || async { h.rt.count("StartContainer") == 1 }).await;
        let pod_dir = h.dir.path().join("root/pods/uid-5");
        assert!(pod_dir.exists());
        h.workers.dispatch(
            "uid-5",
            Work::Terminate {
                pod: Some(pod("uid-5")),
                grace_override: Some(1),
            },
        );
        let done = tokio::time::timeout(Duration::from_secs(60), h.done.recv()).await;
        assert_eq!(done.ok().flatten().as_deref(), Some("uid-5"));
        let calls = h.rt.calls();
        let at = |m: &str| calls.iter().position(|c| *c == m).unwrap_or(usize::MAX);
        assert!(at("StopContainer") < at("StopPodSandbox"), "{calls:?}");
        assert!(at("StopPodSandbox") < at("RemovePodSandbox"), "{calls:?}");
        assert!(h.rt.sandboxes().is_empty() && h.rt.containers().is_empty());
        assert!(!pod_dir.exists(), "the pod's files are removed");
        assert!(
            h.states.status("uid-5").is_none(),
            "and its status is forgotten"
        );
        h.cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_start_and_a_stop_are_told_in_events_in_order() {
        let mut h = harness(FakeCri::with_images(&[IMAGE]));
        h.workers.dispatch("uid-6", Work::Sync(pod("uid-6")));
        eventually("running", || async { h.rt.count("StartContainer") == 1 }).await;
        h.workers.dispatch(
            "uid-6",
            Work::Terminate {
                pod: Some(pod("uid-6")),
                grace_override: Some(1),
            },
        );
        let done = tokio::time::timeout(Duration::from_secs(60), h.done.recv()).await;
        assert_eq!(done.ok().flatten().as_deref(), Some("uid-6"));
        let image_there = format!("Container image {IMAGE:?} already present on machine");
        assert_eq!(
            drain_events(&mut h),
            vec![
                ("Pulled".to_string(), image_there),
                ("Created".to_string(), "Container created".to_string()),
                ("Started".to_string(), "Container started".to_string()),
                ("Killing".to_string(), "Stopping container app".to_string()),
            ]
        );
        h.cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_missing_config_map_waits_with_failed_mount_then_starts_and_is_followed() {
        use crate::clients::apiserver::fake::FakeApiServer;
        use crate::kubelet::api_objects::testing::{config_map, object_api};
        use crate::kubelet::api_objects::{ApiObjects, Kind, ObjectKey};
        let api = FakeApiServer::new();
        let objects = ApiObjects::new(
            object_api(&api),
            crate::base::resync_queue::Pokes::default(),
            CancellationToken::new(),
        );
        let mut h = harness_with_objects(FakeCri::with_images(&[IMAGE]), Some(objects.clone()));
        let mut p = (*pod("uid-7")).clone();
        let spec = p.spec.as_mut().unwrap();
        spec.volumes = Some(
            serde_json::from_value(serde_json::json!([
                {"name": "cfg", "configMap": {"name": "settings"}}
            ]))
            .unwrap(),
        );
        spec.containers[0].env = Some(
            serde_json::from_value(serde_json::json!([
                {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}}}
            ]))
            .unwrap(),
        );
        let p = Arc::new(p);
        h.workers.dispatch("uid-7", Work::Sync(p.clone()));
        eventually("the FailedMount event", || async { !h.events.is_empty() }).await;
        assert_eq!(
            drain_events(&mut h),
            [(
                "FailedMount".to_string(),
                "MountVolume.SetUp failed for volume \"cfg\" : configmap \"settings\" not found"
                    .to_string()
            )]
        );
        assert_eq!(
            h.rt.count("RunPodSandbox"),
            0,
            "nothing runs before the volumes"
        );
        assert_eq!(
            objects.cache().watched(),
            [ObjectKey::new(Kind::ConfigMap, "default", "settings")]
        );

        api.apply(&config_map("default", "settings", &[("mode", "fast")]));
        eventually("started", || async { h.rt.count("StartContainer") == 1 }).await;
        let file = h
            .dir
            .path()
            .join("root/pods/uid-7/volumes/kubernetes.io~configmap/cfg/mode");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "fast");

        // A change is written on the next sync of the running pod.
        api.apply(&config_map("default", "settings", &[("mode", "slow")]));
        h.workers.poke("uid-7");
        eventually("the file follows", || async {
            std::fs::read_to_string(&file).ok().as_deref() == Some("slow")
        })
        .await;

        h.workers.dispatch(
            "uid-7",
            Work::Terminate {
                pod: Some(p),
                grace_override: Some(1),
            },
        );
        let done = tokio::time::timeout(Duration::from_secs(60), h.done.recv()).await;
        assert_eq!(done.ok().flatten().as_deref(), Some("uid-7"));
        assert!(
            objects.cache().watched().is_empty(),
            "the watch ends with the pod"
        );
        h.cancel.cancel();
    }

    /// Issue 27, item 5: a volume that cannot be set up is tried again after upstream's
    /// back-off (500 ms doubling), one FailedMount each try, and not at 20 ms forever; once
    /// its configMap appears, the object's watch pokes the pod and it starts at once, however
    /// long the back-off has grown.
    #[tokio::test(start_paused = true)]
    async fn a_failing_volume_backs_off_and_wakes_when_its_object_appears() {
        use crate::clients::apiserver::fake::FakeApiServer;
        use crate::kubelet::api_objects::ApiObjects;
        use crate::kubelet::api_objects::testing::{config_map, object_api};
        let api = FakeApiServer::new();
        let pokes = crate::base::resync_queue::Pokes::default();
        let objects = ApiObjects::new(object_api(&api), pokes.clone(), CancellationToken::new());
        let mut h = harness_with_objects(FakeCri::with_images(&[IMAGE]), Some(objects));
        let mut p = (*pod("uid-b1")).clone();
        p.spec.as_mut().unwrap().volumes = Some(
            serde_json::from_value(serde_json::json!([
                {"name": "cfg", "configMap": {"name": "late"}}
            ]))
            .unwrap(),
        );
        h.workers.dispatch("uid-b1", Work::Sync(Arc::new(p)));
        // The sync loop's part: pokes reach the worker.
        let forward = |h: &Harness| {
            if pokes.pending() > 0 {
                let taken = pokes.take().now_or_never().unwrap_or_default();
                for uid in taken {
                    h.workers.poke(&uid);
                }
            }
        };
        let mut tries = 0;
        let began = Instant::now();
        while began.elapsed() < Duration::from_secs(60) {
            tokio::time::sleep(Duration::from_millis(100)).await;
            forward(&h);
            tries += drain_events(&mut h)
                .iter()
                .filter(|(r, _)| r == "FailedMount")
                .count();
        }
        // Tries at 0, 0.5, 1.5, 3.5, 7.5, 15.5 and 31.5 s; the next at 63.5 s.
        assert_eq!(tries, 7, "FailedMount events in a minute");
        assert_eq!(h.rt.count("RunPodSandbox"), 0);
        let status = h.states.status("uid-b1").expect("a published status");
        let waiting = &status.container_statuses.as_ref().unwrap()[0];
        let message = waiting.state.as_ref().unwrap().waiting.as_ref().unwrap();
        assert_eq!(message.reason.as_deref(), Some("ContainerCreating"));
        assert_eq!(
            message.message.as_deref(),
            Some("MountVolume.SetUp failed for volume \"cfg\" : configmap \"late\" not found")
        );

        let created = Instant::now();
        api.apply(&config_map("default", "late", &[("k", "v")]));
        while h.rt.count("StartContainer") == 0 {
            assert!(
                created.elapsed() < Duration::from_secs(1),
                "the pod did not start within a second of its configMap appearing"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
            forward(&h);
        }
        h.cancel.cancel();
    }

    /// Issue 27, item 7: the pod's directory is 0750 (upstream's `makePodDataDirs`), with
    /// or without volumes.
    #[tokio::test(start_paused = true)]
    async fn a_pod_without_volumes_gets_a_0750_pod_directory() {
        use std::os::unix::fs::PermissionsExt;
        let mut h = harness(FakeCri::with_images(&[IMAGE]));
        h.workers.dispatch("uid-d1", Work::Sync(pod("uid-d1")));
        eventually("started", || async { h.rt.count("StartContainer") == 1 }).await;
        let dir = h.dir.path().join("root/pods/uid-d1");
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o750, "{mode:o}");
        h.cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn pull_secrets_are_tried_in_turn_and_a_broken_one_fails_only_its_pod() {
        use crate::clients::apiserver::fake::FakeApiServer;
        use crate::kubelet::api_objects::ApiObjects;
        use crate::kubelet::api_objects::testing::{object_api, secret};
        use crate::kubelet::pull_credentials::{KEY_DOCKER_CONFIG_JSON, TYPE_DOCKER_CONFIG_JSON};
        const PRIVATE: &str = "reg.example.test:5000/team/app:1";
        let api = FakeApiServer::new();
        let json = Some(TYPE_DOCKER_CONFIG_JSON);
        // Both match: the more specific key ("…/team") is tried first, then the host's.
        api.apply(&secret(
            "default",
            "team",
            json,
            &[(
                KEY_DOCKER_CONFIG_JSON,
                br#"{"auths": {"reg.example.test:5000/team": {"username": "old", "password": "expired"}}}"#,
            )],
        ));
        api.apply(&secret(
            "default",
            "host",
            json,
            &[(
                KEY_DOCKER_CONFIG_JSON,
                br#"{"auths": {"http://reg.example.test:5000": {"auth": "bmV3OmZyZXNo"}}}"#,
            )],
        ));
        api.apply(&secret(
            "default",
            "broken",
            json,
            &[(
                KEY_DOCKER_CONFIG_JSON,
                br#"{"auths": {"reg.example.test:5000": "#,
            )],
        ));
        let objects = ApiObjects::new(
            object_api(&api),
            crate::base::resync_queue::Pokes::default(),
            CancellationToken::new(),
        );
        let rt = FakeCri::default();
        // The first credential is refused by the registry.
        rt.script("PullImage", Script::Fail(tonic::Code::Unknown));
        let mut h = harness_with_objects(rt, Some(objects));
        let with_secrets = |uid: &str, names: &[&str]| {
            let mut p = (*pod(uid)).clone();
            p.metadata.name = Some(uid.into());
            let spec = p.spec.as_mut().unwrap();
            spec.containers[0].image = Some(PRIVATE.into());
            spec.containers[0].image_pull_policy = Some("Always".into());
            spec.image_pull_secrets = Some(
                names
                    .iter()
                    .map(|n| k8s_openapi::api::core::v1::LocalObjectReference {
                        name: n.to_string(),
                    })
                    .collect(),
            );
            Arc::new(p)
        };
        h.workers.dispatch(
            "good",
            Work::Sync(with_secrets("good", &["missing", "team", "host"])),
        );
        eventually("the good pod started", || async {
            h.rt.count("StartContainer") == 1
        })
        .await;
        let tried: Vec<(String, String, String)> =
            h.rt.pull_auths()
                .into_iter()
                .map(|(image, auth)| {
                    let auth = auth.expect("a credential");
                    (image, auth.username, auth.password)
                })
                .collect();
        assert_eq!(
            tried,
            [
                (PRIVATE.to_string(), "old".into(), "expired".into()),
                (PRIVATE.to_string(), "new".into(), "fresh".into()),
            ]
        );
        let events = drain_events(&mut h);
        assert!(
            !events
                .iter()
                .any(|(r, _)| r == "FailedToRetrieveImagePullSecret"),
            "only after a failed pull: {events:?}"
        );

        // A pod whose pull secret does not parse: ErrImagePull naming the secret, no pull.
        h.workers
            .dispatch("bad", Work::Sync(with_secrets("bad", &["host", "broken"])));
        eventually("the bad pod's status", || async {
            h.states.status("bad").is_some_and(|s| {
                s.container_statuses.unwrap_or_default().iter().any(|c| {
                    c.state
                        .as_ref()
                        .and_then(|s| s.waiting.as_ref())
                        .is_some_and(|w| w.reason.as_deref() == Some("ErrImagePull"))
                })
            })
        })
        .await;
        let status = h.states.status("bad").unwrap();
        let waiting = status.container_statuses.unwrap()[0]
            .state
            .clone()
            .unwrap()
            .waiting
            .unwrap();
        let message = waiting.message.unwrap_or_default();
        assert!(
            message.starts_with(
                "couldn't parse image pull secret \"default/broken\" (.dockerconfigjson): "
            ),
            "{message}"
        );
        assert_eq!(h.rt.count("PullImage"), 2, "no pull with a broken secret");
        // While it backs off, the status still says why (upstream's wording).
        eventually("the back-off says why", || async {
            h.states.status("bad").is_some_and(|s| {
                s.container_statuses.unwrap_or_default().iter().any(|c| {
                    c.state
                        .as_ref()
                        .and_then(|s| s.waiting.as_ref())
                        .is_some_and(|w| {
                            w.reason.as_deref() == Some("ImagePullBackOff")
                                && w.message.as_deref().is_some_and(|m| {
                                    m.starts_with(&format!(
                                        "Back-off pulling image \"{PRIVATE}\": ErrImagePull: couldn't parse image pull secret \"default/broken\""
                                    ))
                                })
                        })
                })
            })
        })
        .await;
        let events = drain_events(&mut h);
        assert!(
            events.iter().any(|(r, m)| r == "Failed"
                && m.contains("Failed to pull image")
                && m.contains("default/broken")),
            "{events:?}"
        );
        assert_eq!(h.rt.count("StartContainer"), 1, "the good pod runs on");
        h.cancel.cancel();
    }

    /// A pod with one regular init container before its app.
    fn pod_with_init(uid: &str) -> Arc<Pod> {
        let mut p = (*pod(uid)).clone();
        let spec = p.spec.as_mut().unwrap();
        let mut init = spec.containers[0].clone();
        init.name = "init".into();
        spec.init_containers = Some(vec![init]);
        Arc::new(p)
    }

    fn running_init(rt: &FakeCri) -> Option<String> {
        rt.containers()
            .into_iter()
            .find(|c| {
                c.metadata.as_ref().is_some_and(|m| m.name == "init")
                    && c.state
                        == crate::clients::cri::proto::ContainerState::ContainerRunning as i32
            })
            .map(|c| c.id)
    }

    #[tokio::test(start_paused = true)]
    async fn with_events_a_running_init_container_is_waited_for_not_polled() {
        use crate::kubelet::pleg::feed::FeedSource;
        use crate::kubelet::pleg::route::Mode;
        let pleg = crate::kubelet::pleg::PlegState::default();
        pleg.set_mode(Mode::Events(FeedSource::Containerd));
        let mut h = harness_with_pleg(FakeCri::with_images(&[IMAGE]), pleg);
        h.workers
            .dispatch("uid-e1", Work::Sync(pod_with_init("uid-e1")));
        eventually("the init container running", || async {
            running_init(&h.rt).is_some()
        })
        .await;
        let init = running_init(&h.rt).unwrap();
        // Let the sync that started it finish, then count: nothing is read while it runs.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let lists = h.rt.count("ListContainers");
        tokio::time::sleep(
            crate::kubelet::runtime::revisit::EVENT_DEADLINE - Duration::from_secs(1),
        )
        .await;
        assert_eq!(
            h.rt.count("ListContainers"),
            lists,
            "the worker polled while waiting for the init container's exit"
        );
        // Its exit, told by the event stream, starts the app at once.
        h.rt.exit_container(&init);
        let heard = Instant::now();
        h.workers.poke("uid-e1");
        eventually("the app started", || async {
            h.rt.count("StartContainer") == 2
        })
        .await;
        assert!(
            heard.elapsed() < Duration::from_millis(100),
            "{:?}",
            heard.elapsed()
        );
        h.cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn with_events_a_lost_exit_is_found_at_the_deadline() {
        use crate::kubelet::pleg::feed::FeedSource;
        use crate::kubelet::pleg::route::Mode;
        let pleg = crate::kubelet::pleg::PlegState::default();
        pleg.set_mode(Mode::Events(FeedSource::Containerd));
        let mut h = harness_with_pleg(FakeCri::with_images(&[IMAGE]), pleg);
        h.workers
            .dispatch("uid-e2", Work::Sync(pod_with_init("uid-e2")));
        eventually("the init container running", || async {
            running_init(&h.rt).is_some()
        })
        .await;
        let started = Instant::now();
        h.rt.exit_container(&running_init(&h.rt).unwrap());
        // No poke: the event got lost.
        eventually("the app started", || async {
            h.rt.count("StartContainer") == 2
        })
        .await;
        let waited = started.elapsed();
        assert!(
            waited <= crate::kubelet::runtime::revisit::EVENT_DEADLINE + Duration::from_millis(100),
            "{waited:?}"
        );
        h.cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn an_exit_heard_before_the_runtime_shows_it_is_read_again_until_it_does() {
        use crate::kubelet::pleg::feed::FeedSource;
        use crate::kubelet::pleg::route::Mode;
        let pleg = crate::kubelet::pleg::PlegState::default();
        pleg.set_mode(Mode::Events(FeedSource::Containerd));
        let mut h = harness_with_pleg(FakeCri::with_images(&[IMAGE]), pleg.clone());
        h.workers
            .dispatch("uid-e3", Work::Sync(pod_with_init("uid-e3")));
        eventually("the init container running", || async {
            running_init(&h.rt).is_some()
        })
        .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let init = running_init(&h.rt).unwrap();
        // The stream is a moment ahead of the runtime's view: the poke finds it still running.
        pleg.note_exit(&init, None, false);
        let heard = Instant::now();
        h.workers.poke("uid-e3");
        tokio::time::sleep(Duration::from_millis(30)).await;
        h.rt.exit_container(&init);
        eventually("the app started", || async {
            h.rt.count("StartContainer") == 2
        })
        .await;
        assert!(
            heard.elapsed() < Duration::from_millis(200),
            "{:?}",
            heard.elapsed()
        );
        h.cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn an_exit_heard_with_its_code_is_acted_on_without_reading_the_runtime() {
        use crate::kubelet::pleg::feed::{ExitFacts, FeedSource};
        use crate::kubelet::pleg::route::Mode;
        let pleg = crate::kubelet::pleg::PlegState::default();
        pleg.set_mode(Mode::Events(FeedSource::Containerd));
        let mut h = harness_with_pleg(FakeCri::with_images(&[IMAGE]), pleg.clone());
        h.workers
            .dispatch("uid-e5", Work::Sync(pod_with_init("uid-e5")));
        eventually("the init container running", || async {
            running_init(&h.rt).is_some()
        })
        .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let init = running_init(&h.rt).unwrap();
        let reads = |rt: &FakeCri| {
            ["ListContainers", "ListPodSandbox", "PodSandboxStatus"].map(|m| rt.count(m))
        };
        let before = reads(&h.rt);
        // The stream tells of the exit with its code; the runtime still shows it running.
        pleg.note_exit(
            &init,
            Some(ExitFacts {
                code: 0,
                at_ns: 1_700_000_000_000_000_000,
            }),
            false,
        );
        h.workers.poke("uid-e5");
        eventually("the app started", || async {
            h.rt.count("StartContainer") == 2
        })
        .await;
        assert_eq!(reads(&h.rt), before, "{:?}", h.rt.calls());
        // The status shows the init container's end as the runtime will.
        eventually("the status", || async {
            h.states.status("uid-e5").is_some_and(|s| {
                s.init_container_statuses.iter().flatten().any(|c| {
                    c.state
                        .as_ref()
                        .and_then(|s| s.terminated.as_ref())
                        .is_some_and(|t| {
                            t.exit_code == 0 && t.reason.as_deref() == Some("Completed")
                        })
                })
            })
        })
        .await;
        h.cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn with_events_resyncs_and_updates_act_on_the_last_view_until_a_change_is_heard() {
        use crate::kubelet::pleg::feed::FeedSource;
        use crate::kubelet::pleg::route::Mode;
        const READS: [&str; 4] = [
            "ListContainers",
            "ListPodSandbox",
            "PodSandboxStatus",
            "ContainerStatus",
        ];
        let pleg = crate::kubelet::pleg::PlegState::default();
        pleg.set_mode(Mode::Events(FeedSource::Containerd));
        let rt = FakeCri::with_images(&[IMAGE, "example.test/app:2"]);
        let mut h = harness_with_pleg(rt, pleg.clone());
        h.workers.dispatch("uid-e6", Work::Sync(pod("uid-e6")));
        eventually("the container running", || async {
            h.rt.containers().iter().any(|c| c.state == 1)
        })
        .await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let reads = |rt: &FakeCri| READS.map(|m| rt.count(m));
        let before = reads(&h.rt);

        // Three resync periods: nothing heard, nothing read.
        tokio::time::sleep(Duration::from_secs(3 * 60 + 1)).await;
        assert_eq!(reads(&h.rt), before, "{:?}", h.rt.calls());

        // A new spec is acted on from the last view: the old container is stopped without
        // a read before it.
        let mut p = (*pod("uid-e6")).clone();
        p.spec.as_mut().unwrap().containers[0].image = Some("example.test/app:2".into());
        let from = h.rt.calls().len();
        h.workers.dispatch("uid-e6", Work::Sync(Arc::new(p)));
        eventually("the old container stopped", || async {
            h.rt.count("StopContainer") == 1
        })
        .await;
        let calls = h.rt.calls();
        let until_stop = calls[from..]
            .iter()
            .take_while(|m| **m != "StopContainer")
            .filter(|m| READS.contains(m))
            .count();
        assert_eq!(until_stop, 0, "{:?}", &calls[from..]);
        eventually("the new image running", || async {
            h.rt.containers().iter().any(|c| {
                c.state == 1
                    && c.image
                        .as_ref()
                        .is_some_and(|i| i.image == "example.test/app:2")
            })
        })
        .await;
        tokio::time::sleep(Duration::from_millis(200)).await;

        // A change the PLEG heard of (an event or a relist's diff) is read.
        let lists = h.rt.count("ListContainers");
        pleg.mark_stale("uid-e6");
        h.workers.poke("uid-e6");
        eventually("the pod read", || async {
            h.rt.count("ListContainers") > lists
        })
        .await;
        h.cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_the_runtime_cannot_hold_yet_is_started_without_reading_it_first() {
        let mut h = harness(FakeCri::with_images(&[IMAGE]));
        h.runtime_cache.store_relist(Default::default());
        h.workers.dispatch("uid-n1", Work::Sync(pod("uid-n1")));
        eventually("started", || async { h.rt.count("StartContainer") == 1 }).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Only the calls the pod's start needs: no read before, and after it only the status
        // of what was made (the sandbox's was read for its IP).
        assert_eq!(
            h.rt.calls(),
            [
                "RunPodSandbox",
                "PodSandboxStatus",
                "ImageStatus",
                "CreateContainer",
                "StartContainer",
                "ContainerStatus"
            ]
        );
        // A pod the cache knows is read first, as before.
        let mut h = harness(FakeCri::with_images(&[IMAGE]));
        h.runtime_cache.store_relist(Default::default());
        h.runtime_cache.update_pod(
            "uid-n2",
            crate::base::observed::ObservedPod {
                names: Some(("default".into(), "web".into())),
                sandboxes: vec![crate::base::observed::ObservedSandbox {
                    id: "gone".into(),
                    attempt: 0,
                    state: crate::base::observed::SandboxState::NotReady,
                    created_at: 1,
                    ip: None,
                    additional_ips: vec![],
                    host_network: false,
                }],
                containers: vec![],
            },
        );
        h.workers.dispatch("uid-n2", Work::Sync(pod("uid-n2")));
        eventually("started", || async { h.rt.count("StartContainer") == 1 }).await;
        // Through the sandbox it knows of; that one gone, by the pod's labels.
        assert_eq!(
            h.rt.calls()[..3],
            ["PodSandboxStatus", "ListPodSandbox", "ListContainers"]
        );
        h.cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn without_events_a_running_init_container_is_polled() {
        let mut h = harness_with_pleg(
            FakeCri::with_images(&[IMAGE]),
            crate::kubelet::pleg::PlegState::default(),
        );
        h.workers
            .dispatch("uid-e4", Work::Sync(pod_with_init("uid-e4")));
        eventually("the init container running", || async {
            running_init(&h.rt).is_some()
        })
        .await;
        let init = running_init(&h.rt).unwrap();
        let lists = h.rt.count("ListContainers");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(h.rt.count("ListContainers") >= lists + 10);
        h.rt.exit_container(&init);
        eventually("the app started", || async {
            h.rt.count("StartContainer") == 2
        })
        .await;
        h.cancel.cancel();
    }

    #[test]
    fn panic_backoff_doubles_to_a_minute() {
        let secs: Vec<u64> = (1..=9).map(|n| panic_backoff(n).as_secs()).collect();
        assert_eq!(secs, vec![1, 2, 4, 8, 16, 32, 60, 60, 60]);
    }
    /// A pod `web` whose container `app` has this probe (exec, period 1 s, threshold 1).
    fn probed_pod(uid: &str, liveness: bool) -> Arc<Pod> {
        let probe = k8s_openapi::api::core::v1::Probe {
            exec: Some(k8s_openapi::api::core::v1::ExecAction {
                command: Some(vec!["check".into()]),
            }),
            period_seconds: Some(1),
            failure_threshold: Some(1),
            ..Default::default()
        };
        let mut pod = (*pod(uid)).clone();
        let app = &mut pod.spec.as_mut().unwrap().containers[0];
        if liveness {
            app.liveness_probe = Some(probe);
        } else {
            app.readiness_probe = Some(probe);
        }
        Arc::new(pod)
    }

    fn pod_ready(h: &Harness, uid: &str) -> Option<bool> {
        let status = h.states.status(uid)?;
        let ready = status
            .conditions?
            .into_iter()
            .find(|c| c.type_ == "Ready")?;
        Some(ready.status == "True")
    }

    /// A readiness verdict reaches the published status (`/pods`, the API writer) at once,
    /// even while the pod's worker is stuck in a sync: it does not wait for the worker.
    #[tokio::test(start_paused = true)]
    async fn a_readiness_verdict_is_published_while_the_worker_is_busy() {
        use crate::clients::cri::fake::ExecReply;
        let rt = FakeCri::with_exec(vec![ExecReply::Exit(1, "not yet")]);
        let mut h = harness(rt);
        h.workers
            .dispatch("uid-r", Work::Sync(probed_pod("uid-r", false)));
        eventually("the pod published, not ready", || async {
            pod_ready(&h, "uid-r") == Some(false) && h.rt.exec_calls().len() == 1
        })
        .await;
        // The worker's next sync hangs reading the pod (a slow runtime, a pull, a hook).
        h.rt.script("PodSandboxStatus", Script::Hang);
        h.rt.script("ListContainers", Script::Hang);
        let listed = h.rt.count("ListContainers") + h.rt.count("PodSandboxStatus");
        h.workers.poke("uid-r");
        eventually("the worker stuck in its read", || async {
            h.rt.count("ListContainers") + h.rt.count("PodSandboxStatus") > listed
        })
        .await;
        // The probe's second run (1 s after the first) succeeds.
        let answered = tokio::time::Instant::now();
        eventually("the pod ready in the published status", || async {
            pod_ready(&h, "uid-r") == Some(true)
        })
        .await;
        assert!(
            answered.elapsed() <= Duration::from_millis(1_010),
            "published {:?} after the worker got stuck (the probe answers 1 s after its first run)",
            answered.elapsed()
        );
        let status = h.states.status("uid-r").unwrap();
        assert!(status.container_statuses.unwrap()[0].ready);
        h.rt.release();
        h.cancel.cancel();
    }

    /// A liveness verdict starts the kill at once, on the last view: no read of the pod comes
    /// between the failed probe and `StopContainer` (with no event stream a sync reads first).
    #[tokio::test(start_paused = true)]
    async fn a_liveness_verdict_starts_the_kill_without_reading_the_pod_first() {
        use crate::clients::cri::fake::ExecReply;
        let rt = FakeCri::with_exec(vec![ExecReply::Exit(0, ""), ExecReply::Exit(1, "dead")]);
        let mut h = harness(rt);
        h.workers
            .dispatch("uid-l", Work::Sync(probed_pod("uid-l", true)));
        // Probe pokes go to the worker at once (the sync loop's part here).
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while h.rt.count("StopContainer") == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no kill after the failed probe"
            );
            tokio::select! {
                uids = h.probe_pokes.take() => for uid in uids { h.workers.poke(&uid) },
                _ = tokio::time::sleep(Duration::from_millis(10)) => {}
            }
        }
        let calls = h.rt.calls();
        let stop = calls.iter().position(|c| *c == "StopContainer").unwrap();
        let failed = calls[..stop]
            .iter()
            .rposition(|c| *c == "ExecSync")
            .unwrap();
        assert_eq!(
            &calls[failed + 1..stop],
            &[] as &[&str],
            "nothing between the verdict and the kill: {calls:?}"
        );
        // The restart follows in the same sync.
        eventually("the restarted instance", || async {
            h.rt.count("StartContainer") == 2
        })
        .await;
        h.cancel.cancel();
    }
}

#[cfg(test)]
#[path = "pod_workers_step_tests.rs"]
mod step_tests;

#[cfg(test)]
#[path = "pod_workers_image_volume_tests.rs"]
mod image_volume_tests;

#[cfg(test)]
mod task_size {
    use super::*;
    use crate::clients::cri::CriClient;

    /// The size of what an async fn returns, without calling it.
    fn future_size<A, B, C, D, Fut>(_: fn(A, B, C, D) -> Fut) -> usize {
        std::mem::size_of::<Fut>()
    }

    /// Every pod has a worker task, idle nearly all the time; its future is allocated whole
    /// for the pod's life. The sync, kill and teardown futures (tens of KiB each) are boxed
    /// while they run, so the idle task holds only the loop's own state.
    #[test]
    fn an_idle_worker_task_stays_small() {
        let size = future_size(worker_loop::<CriClient>);
        assert!(size <= 8 * 1024, "worker_loop's future is {size} bytes");
    }
}
