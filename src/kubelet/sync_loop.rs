//! The sync loop: the one place where pod source changes, runtime events and housekeeping meet.
//!
//! It owns the set of desired pods and the pod workers. Periodic resyncs are the workers' own
//! timers (each knows when its pod next needs a look: a back-off ending, `syncFrequency`), so the
//! loop only routes events and runs housekeeping every two seconds.
//!
//! It is also where pods are admitted: a new pod from any source is checked by
//! [`crate::kubelet::admission`] against the pods admitted before it, and a refused one never reaches a
//! worker; [`Refusals`] tells the rest of the agent.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use tokio::sync::{mpsc, oneshot};
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::base::clock::{self, Instant};
use crate::base::health::CheckFailure;
use crate::base::podspec::full_name;
use crate::base::podspec::pod::phase_is_terminal;
use crate::base::resync_queue::Pokes;
use crate::clients::cri::{ImageService, RuntimeService};
use crate::kubelet::admission::{self, Decision, NodeInfo, NodeSource, Usage};
use crate::kubelet::dra::DraManager;
use crate::kubelet::events::{EventType, Recorder};
use crate::kubelet::eviction::{EvictRequest, PressureView};
use crate::kubelet::pleg::RuntimeCache;
use crate::kubelet::pod_status::api_writer::StatusSync;
use crate::kubelet::pod_status::published::PodStates;
use crate::kubelet::pod_workers::{FinalStatus, Kill, PodWorkers, Work};
use crate::kubelet::shutdown::ShutdownStatus;
use crate::kubelet::source::{PodChange, SourcesReady};

mod resize;
pub(crate) use resize::Resizes;

/// The node and its usage while one batch of new pods is admitted; each admitted pod is
/// added to the usage, so the next is admitted against it.
struct Batch {
    node: NodeInfo,
    usage: Usage,
}

/// How often orphans are looked for.
pub(crate) const HOUSEKEEPING_PERIOD: Duration = Duration::from_secs(2);

/// How long the loop may go without turning before `/healthz` says so. It turns at least
/// every [`HOUSEKEEPING_PERIOD`]; upstream waits for twice `syncFrequency` (at least five
/// minutes), which hides a stuck loop far too long.
pub(crate) const STALL_THRESHOLD: Duration = Duration::from_secs(30);

/// The loop's liveness as the `syncloop` health check sees it.
#[derive(Clone)]
pub(crate) struct SyncLoopHealth {
    inner: Arc<Mutex<LoopLiveness>>,
}

struct LoopLiveness {
    last_turn: Instant,
    ended: Option<String>,
}

impl Default for SyncLoopHealth {
    fn default() -> Self {
        SyncLoopHealth {
            inner: Arc::new(Mutex::new(LoopLiveness {
                last_turn: clock::instant(),
                ended: None,
            })),
        }
    }
}

impl SyncLoopHealth {
    fn lock(&self) -> std::sync::MutexGuard<'_, LoopLiveness> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The loop went round once.
    pub(crate) fn turned(&self) {
        self.lock().last_turn = clock::instant();
    }

    /// The loop is gone for good (it panicked or returned while the agent runs).
    pub(crate) fn ended(&self, why: String) {
        self.lock().ended = Some(why);
    }

    /// The `syncloop` health check, evaluated at `now`.
    pub(crate) fn check_at(&self, now: Instant) -> Result<(), CheckFailure> {
        let l = self.lock();
        if let Some(why) = &l.ended {
            return Err(format!("the sync loop has ended: {why}").into());
        }
        let idle = now.saturating_duration_since(l.last_turn);
        if idle > STALL_THRESHOLD {
            return Err(format!(
                "the sync loop has not turned for {}s (expected at least every {}s)",
                idle.as_secs(),
                HOUSEKEEPING_PERIOD.as_secs()
            )
            .into());
        }
        Ok(())
    }

    pub(crate) fn check(&self) -> Result<(), CheckFailure> {
        self.check_at(clock::instant())
    }
}

/// What admission needs besides the pods: the node, the published states (finished pods
/// hold nothing of the node) and who hears of refusals.
pub(crate) struct Admission {
    pub node: NodeSource,
    pub states: PodStates,
    pub refusals: Refusals,
    /// The eviction manager's pressure conditions: under pressure, new pods are refused as
    /// upstream's eviction admit handler refuses them.
    pub pressure: PressureView,
    /// The device plugin manager: a pod asking for more devices than are free is refused
    /// before the resource fit, as upstream's device manager admit handler runs before its
    /// predicate handler.
    pub devices: Option<crate::kubelet::devices::DeviceManager>,
}

/// Who hears of a refused pod besides `/pods`, as upstream's `rejectPod` tells them: a
/// Warning event with the reason and the bare message, and, for pods from the API server, the
/// status writer, which marks the pod Failed there and, when the API server is deleting the
/// pod, finishes the deletion (nothing runs for it that could still need stopping). The API
/// server source's own refusals go the same way.
#[derive(Clone)]
pub(crate) struct Refusals {
    events: Recorder,
    status: Option<StatusSync>,
}

impl Refusals {
    pub(crate) fn new(events: Recorder, status: Option<StatusSync>) -> Refusals {
        Refusals { events, status }
    }

    /// The node refuses `pod` (`message` without the "Pod was rejected: " of the status).
    pub(crate) fn refused(&self, pod: &Pod, reason: &str, message: &str) {
        self.events.pod(pod, EventType::Warning, reason, message);
        // Not `from_api`: the API server source refuses pods before the merge marks their
        // source, so "not static" is what tells an API server pod here.
        if let Some(status) = self
            .status
            .as_ref()
            .filter(|_| !crate::kubelet::mirror_pods::is_static(pod))
        {
            status.refused(pod, reason, message);
            if pod.metadata.deletion_timestamp.is_some() {
                status.torn_down(Arc::new(pod.clone()));
            }
        }
    }

    /// A pod was evicted: its Failed status is published; the status writer should look.
    pub(crate) fn evicted(&self, pod: &Pod) {
        if let Some(status) = &self.status {
            status.changed(pod.metadata.uid.as_deref().unwrap_or_default());
        }
    }

    /// A pod refused earlier is being deleted in the API server: nothing runs for it, so the
    /// deletion can be finished.
    pub(crate) fn deleting(&self, pod: &Arc<Pod>) {
        if let Some(status) = &self.status {
            status.torn_down(pod.clone());
        }
    }
}

/// A pod the node refused, shown in `/pods` as Failed until its source drops it.
struct Refused {
    pod: Arc<Pod>,
    reason: String,
    /// As the status shows it ("Pod was rejected: …").
    message: String,
    /// Refused by admission: later updates do not bring it in (upstream admits a pod once,
    /// when it is added). A static pod refused for referring to API objects is looked at
    /// again when its manifest changes.
    final_: bool,
    /// The status to show instead of the refusal's (an evicted pod's: Failed, Evicted).
    status: Option<PodStatus>,
}

/// Requests to the loop from parts that need its view of the pods (the node shutdown
/// manager).
pub(crate) enum Control {
    /// The pods admitted and not finished.
    ActivePods(oneshot::Sender<Vec<Arc<Pod>>>),
    /// Stop a pod and give it a final status (see [`Work::Kill`]); `done` is cancelled when
    /// it has stopped, or at once when the loop does not run the pod.
    Kill {
        uid: String,
        grace: i64,
        outcome: FinalStatus,
        done: CancellationToken,
    },
}

/// The handle that sends [`Control`] requests; it is the shutdown manager's
/// [`crate::kubelet::shutdown::NodePods`].
#[derive(Clone)]
pub(crate) struct SyncLoopControl {
    tx: mpsc::UnboundedSender<Control>,
}

impl SyncLoopControl {
    /// The handle and the receiver to give [`SyncLoop::with_control`].
    pub(crate) fn channel() -> (SyncLoopControl, mpsc::UnboundedReceiver<Control>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (SyncLoopControl { tx }, rx)
    }
}

impl crate::kubelet::shutdown::NodePods for SyncLoopControl {
    async fn active(&self) -> Vec<Arc<Pod>> {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Control::ActivePods(tx)).is_err() {
            return Vec::new();
        }
        rx.await.unwrap_or_default()
    }

    async fn kill(&self, uid: &str, grace: i64) {
        let done = CancellationToken::new();
        let request = Control::Kill {
            uid: uid.to_string(),
            grace,
            outcome: FinalStatus {
                reason: crate::kubelet::shutdown::POD_REASON.into(),
                message: crate::kubelet::shutdown::POD_MESSAGE.into(),
                disruption_reason: Some(crate::kubelet::shutdown::DISRUPTION_REASON.into()),
            },
            done: done.clone(),
        };
        if self.tx.send(request).is_ok() {
            done.cancelled().await;
        }
    }
}

/// The loop's state.
pub(crate) struct SyncLoop<R> {
    workers: PodWorkers<R>,
    desired: HashMap<String, Arc<Pod>>,
    /// New UIDs of a static pod waiting for the old UID's teardown, by full name.
    waiting_for_name: HashMap<String, Arc<Pod>>,
    /// Pods refused, by UID. One whose earlier version is being torn down is shown again once
    /// the teardown is done (the teardown clears the pod's status).
    refused: HashMap<String, Refused>,
    sources_ready: SourcesReady,
    runtime_cache: RuntimeCache,
    admission: Admission,
    /// Evictions asked for by the eviction manager, and who waits for each pod's teardown.
    evictions: Option<mpsc::Receiver<EvictRequest>>,
    evicting: HashMap<String, oneshot::Sender<()>>,
    /// Requests from the shutdown manager, when there is one.
    control: Option<mpsc::UnboundedReceiver<Control>>,
    /// While the node shuts down, new pods are refused (upstream's shutdown admit handler).
    shutdown: ShutdownStatus,
    /// Pods being stopped for passing their `activeDeadlineSeconds`.
    past_deadline: HashSet<String>,
    /// What the admitted pods were allocated, and the resizes not allocated yet.
    resizes: Resizes,
    /// The DRA manager, whose claims of pods gone while the agent was down housekeeping
    /// releases.
    dra: Option<DraManager>,
}

fn uid_of(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

/// The reason a refused static pod's status gives: upstream has none of its own for this
/// refusal (it refuses the manifest when reading it), so the generic admission reason.
const REFUSED_REASON: &str = "UnexpectedAdmissionError";

/// Why a static pod may not be run (it refers to API objects), or `None`.
fn static_pod_refusal(pod: &Pod) -> Option<String> {
    if !crate::kubelet::mirror_pods::is_static(pod) {
        return None;
    }
    crate::kubelet::source::validate::static_pod_api_refusal(pod)
}

fn deleting(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

/// The order upstream admits new pods in: oldest first. Static pods carry no creation time
/// (they come first, as upstream's zero time does); ties go by name, so the order never
/// depends on how a source listed them.
fn admission_order(a: &Arc<Pod>, b: &Arc<Pod>) -> std::cmp::Ordering {
    let created = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0);
    created(a)
        .cmp(&created(b))
        .then_with(|| full_name(a).cmp(&full_name(b)))
}

impl<R: RuntimeService + ImageService> SyncLoop<R> {
    pub(crate) fn new(
        workers: PodWorkers<R>,
        sources_ready: SourcesReady,
        runtime_cache: RuntimeCache,
        admission: Admission,
    ) -> Self {
        SyncLoop {
            workers,
            desired: HashMap::new(),
            waiting_for_name: HashMap::new(),
            refused: HashMap::new(),
            sources_ready,
            runtime_cache,
            admission,
            evictions: None,
            evicting: HashMap::new(),
            control: None,
            shutdown: ShutdownStatus::default(),
            past_deadline: HashSet::new(),
            resizes: Resizes::default(),
            dra: None,
        }
    }

    /// Keeps the pods' allocations in `resizes` (its checkpoint, in the daemon).
    pub(crate) fn with_resizes(mut self, resizes: Resizes) -> Self {
        self.resizes = resizes;
        self
    }

    /// Lets housekeeping release the DRA claims of pods that are gone.
    pub(crate) fn with_dra(mut self, dra: DraManager) -> Self {
        self.dra = Some(dra);
        self
    }

    /// Takes [`Control`] requests from `rx`, and refuses new pods while `shutdown` says the
    /// node shuts down.
    pub(crate) fn with_control(
        mut self,
        rx: mpsc::UnboundedReceiver<Control>,
        shutdown: ShutdownStatus,
    ) -> Self {
        self.control = Some(rx);
        self.shutdown = shutdown;
        self
    }

    /// Answers one [`Control`] request.
    pub(crate) fn handle_control(&mut self, request: Control) {
        match request {
            Control::ActivePods(reply) => {
                let finished = self.admission.states.finished();
                let pods = self
                    .desired
                    .iter()
                    .filter(|(uid, p)| !finished.contains(*uid) && !phase_is_terminal(p))
                    .map(|(_, p)| p.clone())
                    .collect();
                let _ = reply.send(pods);
            }
            Control::Kill {
                uid,
                grace,
                outcome,
                done,
            } => {
                let Some(pod) = self.desired.get(&uid).cloned() else {
                    done.cancel();
                    return;
                };
                // A new instance waiting for its name would start once the old one is gone.
                let name = full_name(&pod);
                if self
                    .waiting_for_name
                    .get(&name)
                    .is_some_and(|p| uid_of(p) == uid)
                {
                    self.waiting_for_name.remove(&name);
                }
                tracing::info!(pod = %name, pod_uid = %uid, grace, reason = %outcome.reason, "killing the pod");
                self.workers.dispatch(
                    &uid,
                    Work::Kill(Kill {
                        pod,
                        grace,
                        outcome: Some(outcome),
                        done,
                    }),
                );
            }
        }
    }

    /// Takes evictions from the eviction manager.
    pub(crate) fn with_evictions(mut self, rx: mpsc::Receiver<EvictRequest>) -> Self {
        self.evictions = Some(rx);
        self
    }

    /// Evicts a pod as the eviction manager asked: it is stopped with the given grace period
    /// and shown Failed with reason Evicted, and is not run again for later updates (as a
    /// refused pod). A pod the loop does not run (gone meanwhile) is not evicted; dropping
    /// `done` tells the manager.
    pub(crate) fn evict(&mut self, req: EvictRequest) {
        let Some(pod) = self.desired.get(&req.uid).cloned() else {
            tracing::info!(pod_uid = %req.uid, "eviction of a pod that no longer runs here; ignored");
            return;
        };
        let status = crate::kubelet::eviction::decide::evicted_status(
            &pod,
            self.admission.states.status(&req.uid),
            &req.message,
            clock::timestamp(),
        );
        self.terminate(
            pod.clone(),
            Some(req.grace_seconds),
            "the pod is evicted; terminating",
        );
        self.workers.publish_final(&pod, status.clone());
        self.admission.refusals.evicted(&pod);
        self.refused.insert(
            req.uid.clone(),
            Refused {
                pod,
                reason: crate::kubelet::eviction::REASON.to_string(),
                message: req.message,
                final_: true,
                status: Some(status),
            },
        );
        self.evicting.insert(req.uid, req.done);
    }

    /// Applies one batch of source changes: removals first (an edited static pod arrives as
    /// Remove(old) + Add(new), and the new one must see the old one terminating), then
    /// updates, then new pods in admission order, each admitted against the pods admitted
    /// before it.
    pub(crate) fn handle_changes(&mut self, changes: Vec<PodChange>) {
        let mut removes = Vec::new();
        let mut updates = Vec::new();
        let mut adds = Vec::new();
        for change in changes {
            match change {
                PodChange::Remove(p) => removes.push(p),
                PodChange::Update(p) => updates.push(p),
                PodChange::Add(p) => adds.push(p),
            }
        }
        for pod in removes {
            self.remove(pod);
        }
        let mut batch = None;
        for pod in updates {
            self.update(pod, &mut batch);
        }
        adds.sort_by(admission_order);
        for pod in adds {
            self.add(pod, &mut batch);
        }
    }

    fn remove(&mut self, pod: Arc<Pod>) {
        let uid = uid_of(&pod);
        if self.refused.remove(&uid).is_some()
            && !self.desired.contains_key(&uid)
            && !self.workers.has(&uid)
        {
            // Refused and never run: there is nothing to tear down.
            tracing::info!(pod = %full_name(&pod), pod_uid = %uid, "a refused pod was removed from its source");
            self.admission.states.forget(&uid);
            return;
        }
        self.terminate(pod, None, "pod removed from its source; terminating");
    }

    fn update(&mut self, pod: Arc<Pod>, batch: &mut Option<Batch>) {
        let uid = uid_of(&pod);
        let known = self.desired.contains_key(&uid) || self.workers.has(&uid);
        if let Some(refused) = self.refused.get(&uid) {
            if deleting(&pod) && !known {
                self.admission.refusals.deleting(&pod);
                return;
            }
            if refused.final_ && !deleting(&pod) {
                return;
            }
        }
        if deleting(&pod) {
            // The API server is deleting the pod: stop it with the grace period the deletion
            // asked for; once it is torn down, the status writer deletes it.
            let grace = pod.metadata.deletion_grace_period_seconds;
            self.terminate(pod, grace, "the pod is being deleted; terminating");
            return;
        }
        if let Some(message) = static_pod_refusal(&pod) {
            self.refuse(pod, REFUSED_REASON, message, false);
            return;
        }
        if self.desired.contains_key(&uid) {
            let pod = self.resized(pod);
            self.start(pod);
        } else {
            // Not admitted before (a static pod whose refusal is fixed, a pod whose worker is
            // still tearing an earlier version down): it is admitted as a new one.
            self.add(pod, batch);
        }
    }

    fn add(&mut self, pod: Arc<Pod>, batch: &mut Option<Batch>) {
        let uid = uid_of(&pod);
        if self.desired.contains_key(&uid) {
            // Admitted before (the same UID again in one batch): no second admission.
            return self.update(pod, batch);
        }
        if !deleting(&pod)
            && let Some(message) = static_pod_refusal(&pod)
        {
            self.refuse(pod, REFUSED_REASON, message, false);
            return;
        }
        if phase_is_terminal(&pod) && !deleting(&pod) {
            // Finished before the node saw it (an agent restarted after the pod completed):
            // not admitted again, as upstream; its worker only makes sure it is stopped and
            // keeps its exited containers.
            self.start(pod);
            return;
        }
        if self.shutdown.shutting_down() && !deleting(&pod) {
            self.refuse(
                pod,
                crate::kubelet::shutdown::NOT_ADMITTED_REASON,
                crate::kubelet::shutdown::NOT_ADMITTED_MESSAGE.to_string(),
                true,
            );
            return;
        }
        // Upstream admits a new pod even when the API server is already deleting it, so a
        // pod the node would refuse ends Failed with its reason either way.
        if let Some((reason, message)) =
            crate::kubelet::eviction::decide::admit(&pod, &self.admission.pressure.conditions())
        {
            self.refuse(pod, reason, message, true);
            return;
        }
        let source = pod;
        let pod = self.as_allocated(source.clone());
        let batch = batch.get_or_insert_with(|| self.batch());
        if let Some(devices) = &self.admission.devices {
            let wanted = admission::extended_requests(&pod);
            let usage = &batch.usage;
            if let Err((reason, message)) =
                devices.admit(&uid, &wanted, &|name| usage.requested_scalar(name))
            {
                self.refuse(pod, reason, message, true);
                return;
            }
        }
        match admission::admit_with_usage(&pod, &batch.node, &batch.usage) {
            Decision::Refuse(refusal) => {
                self.refuse(pod, &refusal.reason, refusal.message, true);
            }
            Decision::Admit if deleting(&pod) => {
                let grace = pod.metadata.deletion_grace_period_seconds;
                self.terminate(pod, grace, "the pod is being deleted; terminating");
            }
            Decision::Admit => {
                batch.usage.add(&pod);
                self.refused.remove(&uid);
                self.allocate(&pod);
                let pod = self.resized(source);
                self.start(pod);
            }
        }
    }

    /// The node and what the admitted, unfinished pods hold of it, for one batch of new pods.
    fn batch(&self) -> Batch {
        let finished = self.admission.states.finished();
        let usage = admission::Usage::of(
            self.desired
                .iter()
                .filter(|(uid, p)| !finished.contains(*uid) && !phase_is_terminal(p))
                .map(|(_, p)| &**p),
        );
        Batch {
            node: self.admission.node.current(),
            usage,
        }
    }

    /// Wants `pod` and has its worker sync it, once no other instance of its name runs.
    fn start(&mut self, pod: Arc<Pod>) {
        let uid = uid_of(&pod);
        let name = full_name(&pod);
        self.desired.insert(uid.clone(), pod.clone());
        if self.workers.terminating_other(&uid, &name) {
            tracing::info!(pod = %name, pod_uid = %uid, "waiting for the previous instance of the pod to stop");
            self.waiting_for_name.insert(name, pod);
        } else {
            self.workers.dispatch(&uid, Work::Sync(pod));
        }
    }

    /// Refuses a pod: it never reaches a worker or the runtime, `/pods` shows it Failed with
    /// the reason and "Pod was rejected: <message>", and [`Refusals`] hears of it. An earlier
    /// version of it that runs (a static manifest that names its UID, edited) is torn down
    /// first.
    fn refuse(&mut self, pod: Arc<Pod>, reason: &str, message: String, final_: bool) {
        let uid = uid_of(&pod);
        if crate::kubelet::mirror_pods::is_static(&pod) {
            tracing::warn!(pod = %full_name(&pod), pod_uid = %uid, reason, %message, "refusing a static pod");
        } else {
            tracing::warn!(pod = %full_name(&pod), pod_uid = %uid, reason, %message, "refusing a pod");
        }
        let shown = format!("Pod was rejected: {message}");
        if self.desired.contains_key(&uid) || self.workers.has(&uid) {
            self.terminate(pod.clone(), None, "the pod is refused now; terminating");
        }
        self.workers.refused(&pod, reason, &shown);
        self.admission.refusals.refused(&pod, reason, &message);
        self.refused.insert(
            uid,
            Refused {
                pod,
                reason: reason.to_string(),
                message: shown,
                final_,
                status: None,
            },
        );
    }

    /// Stops wanting `pod` and has its worker tear it down (`grace` overrides the pod's own).
    fn terminate(&mut self, pod: Arc<Pod>, grace: Option<i64>, why: &str) {
        let uid = uid_of(&pod);
        let name = full_name(&pod);
        self.desired.remove(&uid);
        if self
            .waiting_for_name
            .get(&name)
            .is_some_and(|p| uid_of(p) == uid)
        {
            self.waiting_for_name.remove(&name);
        }
        tracing::info!(pod = %name, pod_uid = %uid, grace = ?grace, "{why}");
        self.workers.dispatch(
            &uid,
            Work::Terminate {
                pod: Some(pod),
                grace_override: grace,
            },
        );
    }

    /// A worker finished tearing its pod down.
    pub(crate) fn handle_done(&mut self, uid: &str) {
        self.workers.finished(uid);
        // A refused pod whose earlier version (or leftovers in the runtime) was just torn
        // down: the teardown cleared its status, so it is shown again.
        if let Some(r) = self.refused.get(uid) {
            match &r.status {
                Some(status) => {
                    self.workers.publish_final(&r.pod, status.clone());
                    self.admission.refusals.evicted(&r.pod);
                }
                None => self.workers.refused(&r.pod, &r.reason, &r.message),
            }
        }
        if let Some(done) = self.evicting.remove(uid) {
            let _ = done.send(());
        }
        // The same UID came back while it was being torn down (a manifest restored to the
        // content it had): it starts afresh now.
        if let Some(pod) = self.desired.get(uid).cloned() {
            let name = full_name(&pod);
            if !self.waiting_for_name.contains_key(&name) {
                self.workers.dispatch(uid, Work::Sync(pod));
            }
        }
        let ready: Vec<String> = self
            .waiting_for_name
            .iter()
            .filter(|(name, pod)| !self.workers.terminating_other(&uid_of(pod), name))
            .map(|(name, _)| name.clone())
            .collect();
        for name in ready {
            if let Some(pod) = self.waiting_for_name.remove(&name) {
                let uid = uid_of(&pod);
                if self.desired.contains_key(&uid) {
                    self.workers.dispatch(&uid, Work::Sync(pod));
                }
            }
        }
    }

    /// Stops, in place, each running pod past its `activeDeadlineSeconds` (counted from its
    /// start time), which ends Failed with upstream's `DeadlineExceeded` reason and message and
    /// a Normal event; it is looked for on every tick because the deadline may be set or
    /// lowered on a running pod.
    pub(crate) fn enforce_active_deadlines(&mut self) {
        use crate::base::podspec::active_deadline::{MESSAGE, REASON, past_active_deadline};
        self.past_deadline
            .retain(|uid| self.desired.contains_key(uid));
        let now = clock::now();
        let finished = self.admission.states.finished();
        let due: Vec<Arc<Pod>> = self
            .desired
            .iter()
            .filter(|(uid, _)| !finished.contains(*uid) && !self.past_deadline.contains(*uid))
            .filter(|(uid, pod)| {
                let start = self
                    .admission
                    .states
                    .status(uid)
                    .and_then(|s| s.start_time)
                    .or_else(|| pod.status.as_ref().and_then(|s| s.start_time.clone()))
                    .map(|t| std::time::SystemTime::from(t.0));
                past_active_deadline(pod, start, now)
            })
            .map(|(_, pod)| pod.clone())
            .collect();
        for pod in due {
            let uid = uid_of(&pod);
            self.past_deadline.insert(uid.clone());
            self.admission
                .refusals
                .events
                .pod(&pod, EventType::Normal, REASON, MESSAGE);
            let grace = crate::kubelet::runtime::executor::grace_period(Some(&pod), None);
            tracing::info!(pod = %full_name(&pod), pod_uid = %uid, grace, "the pod is past its active deadline; stopping it");
            self.workers.dispatch(
                &uid,
                Work::Kill(Kill {
                    pod,
                    grace,
                    outcome: Some(FinalStatus {
                        reason: REASON.into(),
                        message: MESSAGE.into(),
                        disruption_reason: None,
                    }),
                    done: CancellationToken::new(),
                }),
            );
        }
    }

    /// Tears down what runs in the runtime for pods no source has, once every source has
    /// spoken (before that, a missing pod may just not have been read yet).
    pub(crate) fn housekeeping(&mut self) {
        if !self.sources_ready.all_ready() || !self.runtime_cache.has_relisted() {
            return;
        }
        for uid in self.runtime_cache.pod_uids() {
            if !self.desired.contains_key(&uid) && !self.workers.has(&uid) {
                tracing::info!(pod_uid = %uid, "found a pod that no source has; removing it");
                self.workers.dispatch(
                    &uid,
                    Work::Terminate {
                        pod: None,
                        grace_override: None,
                    },
                );
            }
        }
        self.release_absent_claims();
    }

    /// The DRA claims held for pods that no source has, no worker runs and the runtime shows
    /// nothing of (they went while the agent was down: no teardown will release them) are
    /// released, as upstream's reconcile loop does; on a task of its own, so the loop never
    /// waits for a driver.
    fn release_absent_claims(&self) {
        let Some(dra) = &self.dra else {
            return;
        };
        let runtime: HashSet<String> = self.runtime_cache.pod_uids().into_iter().collect();
        let absent: HashSet<String> = dra
            .pod_uids()
            .into_iter()
            .filter(|uid| {
                !self.desired.contains_key(uid) && !self.workers.has(uid) && !runtime.contains(uid)
            })
            .collect();
        if absent.is_empty() {
            return;
        }
        tracing::info!(
            pods = absent.len(),
            "releasing the DRA claims of pods that are gone"
        );
        let dra = dra.clone();
        tokio::spawn(async move {
            if let Err(err) = dra.release_pods(&absent).await {
                tracing::warn!(error = %err, "cannot unprepare the DRA claims of pods that are gone; trying again later");
            }
        });
    }

    /// Runs until `cancel` fires. An input that closes is simply no longer read (the
    /// housekeeping tick keeps the loop going); `health` hears of every turn.
    pub(crate) async fn run(
        mut self,
        mut config: mpsc::Receiver<Vec<PodChange>>,
        pokes: Pokes,
        mut done: mpsc::UnboundedReceiver<String>,
        health: SyncLoopHealth,
        cancel: CancellationToken,
    ) {
        let mut housekeeping = tokio::time::interval(HOUSEKEEPING_PERIOD);
        housekeeping.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut evictions = self.evictions.take();
        let mut control = self.control.take();
        loop {
            health.turned();
            let next_control = async {
                match control.as_mut() {
                    Some(rx) => rx.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = cancel.cancelled() => return,
                Some(request) = next_control => self.handle_control(request),
                Some(changes) = config.recv() => self.handle_changes(changes),
                uids = pokes.take() => for uid in uids { self.workers.poke(&uid) },
                Some(uid) = done.recv() => self.handle_done(&uid),
                _ = housekeeping.tick() => {
                    self.enforce_active_deadlines();
                    self.retry_deferred_resizes();
                    self.housekeeping();
                }
                Some(req) = next_eviction(&mut evictions) => self.evict(req),
            }
        }
    }
}

/// The next eviction, or never when there is no eviction manager (or it is gone).
async fn next_eviction(rx: &mut Option<mpsc::Receiver<EvictRequest>>) -> Option<EvictRequest> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod health_tests {
    use super::*;

    #[test]
    fn syncloop_check_fails_when_the_loop_stalls_or_ends() {
        let h = SyncLoopHealth::default();
        let start = Instant::now();
        h.turned();
        assert_eq!(h.check_at(start), Ok(()));
        let later = Instant::now() + STALL_THRESHOLD + Duration::from_secs(1);
        let err = h.check_at(later).unwrap_err().to_string();
        assert!(err.contains("has not turned for"), "{err}");
        h.ended("it panicked: boom".into());
        let err = h.check_at(Instant::now()).unwrap_err().to_string();
        assert_eq!(err, "the sync loop has ended: it panicked: boom");
    }

    /// The check reads the one clock, so a paused test clock moved past the threshold is a
    /// stall; with the `std::time::Instant` it read before, only made-up instants could show it.
    #[tokio::test(start_paused = true)]
    async fn a_paused_clock_moved_past_the_threshold_is_a_stall() {
        let h = SyncLoopHealth::default();
        h.turned();
        tokio::time::advance(STALL_THRESHOLD).await;
        assert_eq!(h.check(), Ok(()));
        tokio::time::advance(Duration::from_secs(1)).await;
        let err = h.check().unwrap_err().to_string();
        assert!(err.contains("has not turned for 31s"), "{err}");
        h.turned();
        assert_eq!(h.check(), Ok(()));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::base::observed::{ObservedPod, ObservedSandbox, SandboxState};
    use crate::clients::cri::fake::FakeCri;
    use crate::kubelet::pod_workers::test_support::{IMAGE, eventually, harness, pod};

    /// A node with room for `max_pods` pods, 2 cpus and 4 GiB.
    fn node_info(max_pods: i64) -> NodeInfo {
        NodeInfo {
            name: "node-a".into(),
            labels: BTreeMap::from([("kubernetes.io/hostname".into(), "node-a".into())]),
            taints: vec![],
            allocatable: crate::kubelet::admission::Allocatable {
                cpu_millis: 2000,
                memory_bytes: 4 << 30,
                ephemeral_storage_bytes: 10 << 30,
                pods: max_pods,
                scalar: BTreeMap::new(),
            },
        }
    }

    fn sync_loop(
        h: crate::kubelet::pod_workers::test_support::Harness,
    ) -> (SyncLoop<FakeCri>, Parts) {
        sync_loop_on(h, node_info(110))
    }

    fn sync_loop_on(
        h: crate::kubelet::pod_workers::test_support::Harness,
        node: NodeInfo,
    ) -> (SyncLoop<FakeCri>, Parts) {
        let ready = SourcesReady::new(["file"]);
        let admission = Admission {
            node: NodeSource::fixed(node),
            states: h.states.clone(),
            refusals: Refusals::new(Recorder::log_only("node-a"), None),
            pressure: PressureView::default(),
            devices: None,
        };
        let parts = Parts {
            rt: h.rt,
            done: h.done,
            ready: ready.clone(),
            cache: h.runtime_cache.clone(),
            cancel: h.cancel,
            _dir: h.dir,
        };
        (
            SyncLoop::new(h.workers, ready, h.runtime_cache, admission),
            parts,
        )
    }

    struct Parts {
        rt: FakeCri,
        done: mpsc::UnboundedReceiver<String>,
        ready: SourcesReady,
        cache: RuntimeCache,
        cancel: CancellationToken,
        _dir: tempfile::TempDir,
    }

    fn orphan_relist(uid: &str) -> BTreeMap<String, ObservedPod> {
        BTreeMap::from([(
            uid.to_string(),
            ObservedPod {
                sandboxes: vec![ObservedSandbox {
                    id: "sb-orphan".into(),
                    attempt: 0,
                    state: SandboxState::Ready,
                    created_at: 1,
                    ip: None,
                    additional_ips: vec![],
                    host_network: false,
                }],
                containers: vec![],
                names: None,
            },
        )])
    }

    /// Adds pod `uid` as the first pod and waits until the runtime has started its container.
    async fn add_started(sl: &mut SyncLoop<FakeCri>, parts: &Parts, uid: &str) -> Arc<Pod> {
        let p = pod(uid);
        sl.handle_changes(vec![PodChange::Add(p.clone())]);
        eventually("started", || async {
            parts.rt.count("StartContainer") == 1
        })
        .await;
        p
    }

    /// The UID of the next worker that finished tearing its pod down.
    async fn next_done(parts: &mut Parts) -> Option<String> {
        tokio::time::timeout(Duration::from_secs(60), parts.done.recv())
            .await
            .ok()
            .flatten()
    }

    #[tokio::test(start_paused = true)]
    async fn housekeeping_waits_until_every_source_has_spoken() {
        let (mut sl, parts) = sync_loop(harness(FakeCri::with_images(&[IMAGE])));
        parts.cache.store_relist(orphan_relist("orphan-1"));
        // The file source has not delivered its first snapshot: the pod may be one of its own.
        sl.housekeeping();
        assert!(!sl.workers.has("orphan-1"));
        parts.ready.mark_seen("file");
        sl.housekeeping();
        assert!(sl.workers.has("orphan-1"), "the orphan is torn down");
        parts.cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn housekeeping_releases_the_dra_claims_of_pods_that_are_gone() {
        use crate::kubelet::dra::state::{self, ClaimInfo, DriverState};
        let root = tempfile::tempdir().unwrap();
        // Claims whose driver skips unprepare, so that releasing one needs no driver.
        let claim = |name: &str, pod: &str| ClaimInfo {
            claim_uid: format!("cu-{name}"),
            claim_name: name.into(),
            namespace: "ns".into(),
            pod_uids: [pod.to_string()].into(),
            drivers: [(
                "d.example.com".to_string(),
                DriverState {
                    devices: vec![],
                    skip_node_operations: vec!["All".into()],
                },
            )]
            .into(),
            prepared: false,
        };
        let checkpoint = root.path().join(state::FILE_NAME);
        let claims = [
            claim("of-a-source", "uid-a"),
            claim("of-the-runtime", "orphan-1"),
            claim("of-nobody", "gone"),
        ];
        state::write(&checkpoint, &claims).unwrap();
        let dra = DraManager::new(root.path(), None);
        let (sl, parts) = sync_loop(harness(FakeCri::with_images(&[IMAGE])));
        let mut sl = sl.with_dra(dra.clone());
        add_started(&mut sl, &parts, "uid-a").await;
        parts.cache.store_relist(orphan_relist("orphan-1"));
        sl.housekeeping();
        assert_eq!(dra.pod_uids().len(), 3, "before every source has spoken");
        parts.ready.mark_seen("file");
        sl.housekeeping();
        eventually("the absent pod's claim released", || async {
            dra.pod_uids().len() == 2
        })
        .await;
        assert!(!dra.pod_uids().contains("gone"));
        let names: Vec<String> = state::read(&checkpoint)
            .unwrap()
            .unwrap()
            .into_iter()
            .map(|c| c.claim_name)
            .collect();
        assert_eq!(names, ["of-a-source", "of-the-runtime"]);
        parts.cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_from_a_source_runs_and_its_removal_tears_it_down() {
        let (mut sl, mut parts) = sync_loop(harness(FakeCri::with_images(&[IMAGE])));
        parts.ready.mark_seen("file");
        let p = add_started(&mut sl, &parts, "uid-a").await;
        // A relist that shows the pod is not an orphan: housekeeping leaves it alone.
        parts.cache.store_relist(orphan_relist("uid-a"));
        sl.housekeeping();
        sl.handle_changes(vec![PodChange::Remove(p)]);
        let done = next_done(&mut parts).await;
        assert_eq!(done.as_deref(), Some("uid-a"));
        sl.handle_done("uid-a");
        assert!(!sl.workers.has("uid-a"));
        assert!(parts.rt.sandboxes().is_empty());
        parts.cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn an_edited_static_pod_starts_after_the_old_instance_is_gone() {
        let (mut sl, mut parts) = sync_loop(harness(FakeCri::with_images(&[IMAGE])));
        parts.ready.mark_seen("file");
        let old = add_started(&mut sl, &parts, "uid-old").await;
        // An edit arrives as Remove(old) + Add(new) with the same name and a new UID.
        let new = pod("uid-new");
        sl.handle_changes(vec![PodChange::Add(new), PodChange::Remove(old)]);
        assert!(!sl.workers.has("uid-new"), "the new instance waits");
        let done = next_done(&mut parts).await;
        assert_eq!(done.as_deref(), Some("uid-old"));
        sl.handle_done("uid-old");
        assert!(
            sl.workers.has("uid-new"),
            "and starts once the old one is gone"
        );
        eventually("the new one started", || async {
            parts.rt.count("StartContainer") == 2
        })
        .await;
        parts.cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_static_pod_referring_to_a_secret_is_refused_and_shown_failed() {
        let h = harness(FakeCri::with_images(&[IMAGE]));
        let states = h.states.clone();
        let (mut sl, parts) = sync_loop(h);
        parts.ready.mark_seen("file");
        let mut p = (*pod("uid-secret")).clone();
        p.metadata.annotations = Some(BTreeMap::from([(
            crate::kubelet::source::defaults::CONFIG_SOURCE_ANNOTATION.to_string(),
            "file".to_string(),
        )]));
        p.spec.as_mut().unwrap().volumes = Some(vec![k8s_openapi::api::core::v1::Volume {
            name: "creds".into(),
            secret: Some(Default::default()),
            ..Default::default()
        }]);
        let p = Arc::new(p);
        sl.handle_changes(vec![PodChange::Add(p.clone())]);
        assert!(!sl.workers.has("uid-secret"), "not run");
        let status = states.status("uid-secret").expect("shown in /pods");
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        assert_eq!(status.reason.as_deref(), Some("UnexpectedAdmissionError"));
        assert_eq!(
            status.message.as_deref(),
            Some("Pod was rejected: static pods may not reference secrets")
        );
        // Every other pod runs.
        add_started(&mut sl, &parts, "uid-other").await;
        // Its manifest removed: it is gone from /pods, and there was nothing to tear down.
        sl.handle_changes(vec![PodChange::Remove(p)]);
        assert!(states.status("uid-secret").is_none());
        assert!(!sl.workers.has("uid-secret"));
        assert_eq!(parts.rt.count("RunPodSandbox"), 1, "only the other pod ran");
        parts.cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_being_deleted_is_stopped_with_its_grace_and_not_started_again() {
        let (mut sl, mut parts) = sync_loop(harness(FakeCri::with_images(&[IMAGE])));
        parts.ready.mark_seen("file");
        let p = add_started(&mut sl, &parts, "uid-del").await;
        // The API server marks it deleted, with 7 s of grace.
        let mut deleting = (*p).clone();
        deleting.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now()),
        );
        deleting.metadata.deletion_grace_period_seconds = Some(7);
        sl.handle_changes(vec![PodChange::Update(Arc::new(deleting))]);
        let done = next_done(&mut parts).await;
        assert_eq!(done.as_deref(), Some("uid-del"));
        assert_eq!(
            parts.rt.stop_timeouts(),
            vec![7],
            "stopped with the deletion's grace"
        );
        sl.handle_done("uid-del");
        assert!(!sl.workers.has("uid-del"), "not started again");
        assert_eq!(parts.rt.count("StartContainer"), 1);
        parts.cancel.cancel();
    }
    #[tokio::test(start_paused = true)]
    async fn an_evicted_pod_is_stopped_shown_evicted_and_not_run_again() {
        let (mut sl, mut parts) = sync_loop(harness(FakeCri::with_images(&[IMAGE])));
        parts.ready.mark_seen("file");
        let p = add_started(&mut sl, &parts, "uid-ev").await;
        let (tx, mut cleaned) = oneshot::channel();
        let message = "The node was low on resource: memory. ";
        sl.evict(EvictRequest {
            uid: "uid-ev".into(),
            grace_seconds: 1,
            message: message.into(),
            done: tx,
        });
        let done = next_done(&mut parts).await;
        assert_eq!(done.as_deref(), Some("uid-ev"));
        assert_eq!(
            parts.rt.stop_timeouts(),
            vec![2],
            "stopped with the grace asked for, raised to the 2 s floor as upstream"
        );
        assert!(
            cleaned.try_recv().is_err(),
            "not before the loop hears of it"
        );
        sl.handle_done("uid-ev");
        assert_eq!(
            cleaned.try_recv(),
            Ok(()),
            "the manager hears of the cleanup"
        );
        let status = sl.admission.states.status("uid-ev").unwrap();
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        assert_eq!(status.reason.as_deref(), Some("Evicted"));
        assert_eq!(status.message.as_deref(), Some(message));
        // Later updates of the pod do not run it again.
        sl.handle_changes(vec![PodChange::Update(p)]);
        assert!(!sl.workers.has("uid-ev"));
        assert_eq!(parts.rt.count("StartContainer"), 1);
        // A pod the loop does not run is not evicted; the manager is told by the drop.
        let (tx, gone) = oneshot::channel();
        sl.evict(EvictRequest {
            uid: "uid-unknown".into(),
            grace_seconds: 0,
            message: message.into(),
            done: tx,
        });
        assert!(gone.await.is_err());
        // Under memory pressure a new BestEffort pod is refused as upstream refuses it.
        sl.admission
            .pressure
            .set([crate::kubelet::eviction::Condition::MemoryPressure].into());
        sl.handle_changes(vec![PodChange::Add(pod("uid-new"))]);
        assert!(!sl.workers.has("uid-new"));
        let status = sl.admission.states.status("uid-new").unwrap();
        assert_eq!(status.reason.as_deref(), Some("Evicted"));
        assert_eq!(
            status.message.as_deref(),
            Some("Pod was rejected: The node had condition: [MemoryPressure]. ")
        );
        parts.cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_killed_pod_stops_in_place_ends_failed_and_is_not_started_again() {
        let (sl, parts) = sync_loop(harness(FakeCri::with_images(&[IMAGE])));
        let (control, rx) = SyncLoopControl::channel();
        let shutdown = ShutdownStatus::default();
        let mut sl = sl.with_control(rx, shutdown.clone());
        parts.ready.mark_seen("file");
        let p = add_started(&mut sl, &parts, "uid-k").await;
        let active = |sl: &mut SyncLoop<FakeCri>| {
            let (tx, mut rx) = oneshot::channel();
            sl.handle_control(Control::ActivePods(tx));
            rx.try_recv().unwrap().len()
        };
        assert_eq!(active(&mut sl), 1);
        let done = CancellationToken::new();
        sl.handle_control(Control::Kill {
            uid: "uid-k".into(),
            grace: 5,
            outcome: FinalStatus {
                reason: crate::kubelet::shutdown::POD_REASON.into(),
                message: crate::kubelet::shutdown::POD_MESSAGE.into(),
                disruption_reason: Some(crate::kubelet::shutdown::DISRUPTION_REASON.into()),
            },
            done: done.clone(),
        });
        tokio::time::timeout(Duration::from_secs(60), done.cancelled())
            .await
            .expect("the kill completes");
        assert_eq!(
            parts.rt.stop_timeouts(),
            vec![5],
            "stopped with the given grace"
        );
        assert_eq!(parts.rt.count("RemoveContainer"), 0, "left in place");
        let status = sl.admission.states.status("uid-k").unwrap();
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        assert_eq!(status.reason.as_deref(), Some("Terminated"));
        assert!(
            status
                .conditions
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "DisruptionTarget" && c.status == "True")
        );
        assert_eq!(active(&mut sl), 0, "a killed pod is finished");
        // A later update does not bring it back.
        sl.handle_changes(vec![PodChange::Update(p)]);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(parts.rt.count("StartContainer"), 1);
        // While the node shuts down, a new pod is refused.
        shutdown.set(true);
        sl.handle_changes(vec![PodChange::Add(pod("uid-new"))]);
        let refused = sl.admission.states.status("uid-new").unwrap();
        assert_eq!(refused.reason.as_deref(), Some("NodeShutdown"));
        assert!(!sl.workers.has("uid-new"));
        drop(control);
        parts.cancel.cancel();
    }

    /// Pod `uid` named `name`, created `created` seconds into the epoch.
    fn named(uid: &str, name: &str, created: i64) -> Arc<Pod> {
        let mut p = (*pod(uid)).clone();
        p.metadata.name = Some(name.into());
        p.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::from_second(created).unwrap(),
        ));
        Arc::new(p)
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_pod_never_reaches_the_runtime_while_the_others_run() {
        let h = harness(FakeCri::with_images(&[IMAGE]));
        let states = h.states.clone();
        let (mut sl, parts) = sync_loop_on(h, node_info(2));
        parts.ready.mark_seen("file");
        // One batch, listed newest first; "a" sorts first by name but is the newest, so it
        // is the one past maxPods.
        sl.handle_changes(vec![
            PodChange::Add(named("uid-a", "a", 300)),
            PodChange::Add(named("uid-c", "c", 200)),
            PodChange::Add(named("uid-b", "b", 100)),
        ]);
        assert!(!sl.workers.has("uid-a"), "the refused pod gets no worker");
        let status = states.status("uid-a").expect("shown in /pods");
        assert_eq!(status.phase.as_deref(), Some("Failed"));
        assert_eq!(status.reason.as_deref(), Some("OutOfpods"));
        assert_eq!(
            status.message.as_deref(),
            Some(
                "Pod was rejected: Node didn't have enough resource: pods, requested: 1, used: 2, capacity: 2"
            )
        );
        eventually("the other two started", || async {
            parts.rt.count("StartContainer") == 2
        })
        .await;
        assert_eq!(parts.rt.count("RunPodSandbox"), 2);
        parts.cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_pod_stays_refused_on_update_and_leaves_without_a_teardown() {
        let h = harness(FakeCri::with_images(&[IMAGE]));
        let states = h.states.clone();
        let (mut sl, mut parts) = sync_loop_on(h, node_info(1));
        parts.ready.mark_seen("file");
        let first = named("uid-1", "first", 100);
        let second = named("uid-2", "second", 200);
        sl.handle_changes(vec![
            PodChange::Add(first.clone()),
            PodChange::Add(second.clone()),
        ]);
        eventually("the first started", || async {
            parts.rt.count("StartContainer") == 1
        })
        .await;
        // The first goes; its room does not admit the refused pod when it is updated
        // (upstream admits a pod once, when it is added).
        sl.handle_changes(vec![PodChange::Remove(first)]);
        assert_eq!(next_done(&mut parts).await.as_deref(), Some("uid-1"));
        sl.handle_done("uid-1");
        let mut edited = (*second).clone();
        edited.metadata.labels = Some(BTreeMap::from([("v".into(), "2".into())]));
        sl.handle_changes(vec![PodChange::Update(Arc::new(edited))]);
        assert!(!sl.workers.has("uid-2"));
        assert_eq!(
            states.status("uid-2").and_then(|s| s.reason).as_deref(),
            Some("OutOfpods")
        );
        // Removed from its source: gone from /pods, with nothing to tear down.
        sl.handle_changes(vec![PodChange::Remove(second)]);
        assert!(states.status("uid-2").is_none());
        assert!(!sl.workers.has("uid-2"));
        assert_eq!(parts.rt.count("RunPodSandbox"), 1);
        parts.cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn finished_pods_hold_nothing_and_pods_admitted_earlier_count() {
        let h = harness(FakeCri::with_images(&[IMAGE]));
        let states = h.states.clone();
        let (mut sl, parts) = sync_loop_on(h, node_info(1));
        parts.ready.mark_seen("file");
        let done = named("uid-done", "done", 100);
        sl.handle_changes(vec![PodChange::Add(done.clone())]);
        // Another batch: the pod admitted before counts.
        sl.handle_changes(vec![PodChange::Add(named("uid-x", "x", 150))]);
        assert_eq!(
            states.status("uid-x").and_then(|s| s.reason).as_deref(),
            Some("OutOfpods")
        );
        // Once it has finished (a restartPolicy Never pod that exited), it holds nothing.
        states.publish(
            done,
            k8s_openapi::api::core::v1::PodStatus {
                phase: Some("Succeeded".into()),
                ..Default::default()
            },
        );
        sl.handle_changes(vec![PodChange::Add(named("uid-y", "y", 200))]);
        assert!(sl.workers.has("uid-y"), "admitted");
        parts.cancel.cancel();
    }

    /// A pod that is already finished when the loop first sees it (the agent restarted after
    /// it completed) is not admitted: it holds nothing of the node and is never refused.
    #[tokio::test(start_paused = true)]
    async fn a_pod_already_finished_is_not_admitted_again() {
        let h = harness(FakeCri::with_images(&[IMAGE]));
        let states = h.states.clone();
        let (mut sl, parts) = sync_loop_on(h, node_info(1));
        parts.ready.mark_seen("file");
        sl.handle_changes(vec![PodChange::Add(named("uid-x", "x", 100))]);
        let mut done = (*named("uid-done", "done", 150)).clone();
        done.status = Some(PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        });
        sl.handle_changes(vec![PodChange::Add(Arc::new(done))]);
        assert!(sl.workers.has("uid-done"), "kept, with a worker");
        assert_ne!(
            states.status("uid-done").and_then(|s| s.reason).as_deref(),
            Some("OutOfpods"),
            "not refused for lack of room"
        );
        // It takes no room from a new pod either.
        sl.handle_changes(vec![PodChange::Remove(named("uid-x", "x", 100))]);
        sl.handle_changes(vec![PodChange::Add(named("uid-y", "y", 200))]);
        assert!(sl.workers.has("uid-y"), "admitted");
        eventually("y's sandbox", || async {
            parts
                .rt
                .sandboxes()
                .iter()
                .any(|s| s.metadata.as_ref().is_some_and(|m| m.uid == "uid-y"))
        })
        .await;
        tokio::time::sleep(Duration::from_secs(30)).await;
        let ran_done = parts
            .rt
            .sandboxes()
            .iter()
            .any(|s| s.metadata.as_ref().is_some_and(|m| m.uid == "uid-done"));
        assert!(!ran_done, "the finished pod never ran");
        parts.cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_on_a_taken_host_port_or_for_other_labels_is_refused() {
        let h = harness(FakeCri::with_images(&[IMAGE]));
        let states = h.states.clone();
        let (mut sl, parts) = sync_loop(h);
        parts.ready.mark_seen("file");
        let with_port = |uid: &str, name: &str, created: i64| {
            let mut p = (*named(uid, name, created)).clone();
            p.spec.as_mut().unwrap().containers[0].ports =
                Some(vec![k8s_openapi::api::core::v1::ContainerPort {
                    container_port: 80,
                    host_port: Some(8080),
                    ..Default::default()
                }]);
            Arc::new(p)
        };
        let mut elsewhere = (*named("uid-sel", "sel", 300)).clone();
        elsewhere.spec.as_mut().unwrap().node_selector =
            Some(BTreeMap::from([("disk".into(), "ssd".into())]));
        sl.handle_changes(vec![
            PodChange::Add(with_port("uid-p1", "p1", 100)),
            PodChange::Add(with_port("uid-p2", "p2", 200)),
            PodChange::Add(Arc::new(elsewhere)),
        ]);
        assert!(sl.workers.has("uid-p1"));
        for (uid, reason) in [("uid-p2", "NodePorts"), ("uid-sel", "NodeAffinity")] {
            assert!(!sl.workers.has(uid));
            assert_eq!(
                states.status(uid).and_then(|s| s.reason).as_deref(),
                Some(reason)
            );
        }
        parts.cancel.cancel();
    }

    #[tokio::test(start_paused = true)]
    async fn a_pod_already_being_deleted_is_still_admitted_or_refused_first() {
        let h = harness(FakeCri::with_images(&[IMAGE]));
        let states = h.states.clone();
        let (mut sl, parts) = sync_loop_on(h, node_info(0));
        parts.ready.mark_seen("file");
        let mut p = (*named("uid-del", "del", 100)).clone();
        p.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            jiff::Timestamp::now(),
        ));
        let p = Arc::new(p);
        // Upstream admits a new pod even when its deletion has begun: it ends Failed with
        // its reason, and nothing of it is started or torn down.
        sl.handle_changes(vec![PodChange::Add(p.clone())]);
        assert_eq!(
            states.status("uid-del").and_then(|s| s.reason).as_deref(),
            Some("OutOfpods")
        );
        assert!(!sl.workers.has("uid-del"));
        // A later update of the deletion reaches no worker either.
        sl.handle_changes(vec![PodChange::Update(p)]);
        assert!(!sl.workers.has("uid-del"));
        assert_eq!(parts.rt.count("RunPodSandbox"), 0);
        parts.cancel.cancel();
    }

    /// `activeDeadlineSeconds` set on a running pod (an update, as the API server allows):
    /// once the deadline passes, counted from the pod's start time, the pod is stopped in
    /// place and ends Failed with upstream's reason and message, and is not started again.
    #[tokio::test(start_paused = true)]
    async fn a_pod_past_an_active_deadline_set_while_it_runs_is_stopped_and_failed() {
        let (mut sl, parts) = sync_loop(harness(FakeCri::with_images(&[IMAGE])));
        parts.ready.mark_seen("file");
        clock::set_wall(std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000));
        let p = add_started(&mut sl, &parts, "uid-d").await;
        eventually("a start time", || async {
            sl.admission
                .states
                .status("uid-d")
                .is_some_and(|s| s.start_time.is_some())
        })
        .await;
        sl.enforce_active_deadlines();
        let mut with_deadline = (*p).clone();
        with_deadline.spec.as_mut().unwrap().active_deadline_seconds = Some(30);
        sl.handle_changes(vec![PodChange::Update(Arc::new(with_deadline))]);
        tokio::time::sleep(Duration::from_secs(20)).await;
        sl.enforce_active_deadlines();
        assert_eq!(parts.rt.count("StopContainer"), 0, "not yet past it");
        tokio::time::sleep(Duration::from_secs(11)).await;
        sl.enforce_active_deadlines();
        eventually("the pod Failed", || async {
            sl.admission
                .states
                .status("uid-d")
                .is_some_and(|s| s.phase.as_deref() == Some("Failed"))
        })
        .await;
        let status = sl.admission.states.status("uid-d").unwrap();
        assert_eq!(status.reason.as_deref(), Some("DeadlineExceeded"));
        assert_eq!(
            status.message.as_deref(),
            Some("Pod was active on the node longer than the specified deadline")
        );
        assert_eq!(
            parts.rt.stop_timeouts(),
            vec![30],
            "the pod's own grace period"
        );
        sl.enforce_active_deadlines();
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(parts.rt.count("StopContainer"), 1, "stopped once");
        assert_eq!(parts.rt.count("StartContainer"), 1, "not started again");
        parts.cancel.cancel();
    }

    /// A running pod whose container is resized through the API: beyond the node's capacity
    /// the resize waits (`PodResizePending`, `Infeasible`, upstream's message) and the
    /// container keeps running at its allocation; once it fits, the new resources are the
    /// allocation the status shows and the condition goes.
    #[tokio::test(start_paused = true)]
    async fn a_resize_is_allocated_when_it_fits_and_pending_when_it_does_not() {
        use k8s_openapi::api::core::v1::ResourceRequirements;
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let with_cpu = |p: &Pod, cpu: &str| {
            let mut p = p.clone();
            p.spec.as_mut().unwrap().containers[0].resources = Some(ResourceRequirements {
                requests: Some(BTreeMap::from([("cpu".into(), Quantity(cpu.into()))])),
                ..Default::default()
            });
            Arc::new(p)
        };
        let (mut sl, parts) = sync_loop(harness(FakeCri::with_images(&[IMAGE])));
        parts.ready.mark_seen("file");
        let p = with_cpu(&pod("uid-r"), "500m");
        sl.handle_changes(vec![PodChange::Add(p.clone())]);
        eventually("started", || async {
            parts.rt.count("StartContainer") == 1
        })
        .await;
        let pending = |sl: &SyncLoop<FakeCri>| {
            sl.admission.states.status("uid-r").and_then(|s| {
                s.conditions?
                    .into_iter()
                    .find(|c| c.type_ == "PodResizePending")
                    .map(|c| (c.reason.unwrap_or_default(), c.message.unwrap_or_default()))
            })
        };
        let allocated_cpu = |sl: &SyncLoop<FakeCri>| {
            sl.admission.states.status("uid-r").and_then(|s| {
                let c = s.container_statuses?.into_iter().next()?;
                Some(c.allocated_resources?.get("cpu")?.0.clone())
            })
        };
        sl.handle_changes(vec![PodChange::Update(with_cpu(&p, "3"))]);
        eventually("the resize pending", || async { pending(&sl).is_some() }).await;
        assert_eq!(
            pending(&sl),
            Some((
                "Infeasible".to_string(),
                "Node didn't have enough capacity: cpu, requested: 3000, capacity: 2000"
                    .to_string()
            ))
        );
        assert_eq!(allocated_cpu(&sl).as_deref(), Some("500m"));
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(
            parts.rt.count("StopContainer"),
            0,
            "still running at its allocation"
        );
        sl.handle_changes(vec![PodChange::Update(with_cpu(&p, "1"))]);
        eventually("the resize allocated", || async {
            pending(&sl).is_none() && allocated_cpu(&sl).as_deref() == Some("1")
        })
        .await;
        // Applied in place: the runtime is asked once, with 1 cpu's shares, and the container
        // keeps running.
        eventually("the container resized", || async {
            !parts.rt.resource_updates().is_empty()
        })
        .await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        let updates = parts.rt.resource_updates();
        assert_eq!(updates.len(), 1, "{updates:?}");
        assert_eq!(updates[0].1.cpu_shares, 1024);
        assert_eq!(parts.rt.count("StopContainer"), 0, "not restarted");
        let in_progress = sl.admission.states.status("uid-r").and_then(|s| {
            s.conditions?
                .into_iter()
                .find(|c| c.type_ == "PodResizeInProgress")
        });
        assert_eq!(in_progress, None, "the resize is done");
        parts.cancel.cancel();
    }
}
