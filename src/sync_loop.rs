//! The sync loop: the one place where pod source changes, runtime events and housekeeping meet.
//!
//! It owns the set of desired pods and the pod workers. Periodic resyncs are the workers' own
//! timers (each knows when its pod next needs a look: a back-off ending, `syncFrequency`), so the
//! loop only routes events and runs housekeeping every two seconds.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::cri::{ImageService, RuntimeService};
use crate::health::CheckFailure;
use crate::k8s::full_name;
use crate::pleg::RuntimeCache;
use crate::pod_workers::{PodWorkers, Work};
use crate::pokes::Pokes;
use crate::source::{PodChange, SourcesReady};

/// How often orphans are looked for.
pub const HOUSEKEEPING_PERIOD: Duration = Duration::from_secs(2);

/// How long the loop may go without turning before `/healthz` says so. It turns at least
/// every [`HOUSEKEEPING_PERIOD`]; upstream waits for twice `syncFrequency` (at least five
/// minutes), which hides a stuck loop far too long.
pub const STALL_THRESHOLD: Duration = Duration::from_secs(30);

/// The loop's liveness as the `syncloop` health check sees it.
#[derive(Clone)]
pub struct SyncLoopHealth {
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
                last_turn: Instant::now(),
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
    pub fn turned(&self) {
        self.lock().last_turn = Instant::now();
    }

    /// The loop is gone for good (it panicked or returned while the agent runs).
    pub fn ended(&self, why: String) {
        self.lock().ended = Some(why);
    }

    /// The `syncloop` health check, evaluated at `now`.
    pub fn check_at(&self, now: Instant) -> Result<(), CheckFailure> {
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

    pub fn check(&self) -> Result<(), CheckFailure> {
        self.check_at(Instant::now())
    }
}

/// The loop's state.
pub struct SyncLoop<R> {
    workers: PodWorkers<R>,
    desired: HashMap<String, Arc<Pod>>,
    /// New UIDs of a static pod waiting for the old UID's teardown, by full name.
    waiting_for_name: HashMap<String, Arc<Pod>>,
    /// Refused static pods whose earlier version is being torn down, with the refusal, shown
    /// once the teardown is done (it clears the pod's status).
    refused: HashMap<String, (Arc<Pod>, String)>,
    sources_ready: SourcesReady,
    runtime_cache: RuntimeCache,
}

fn uid_of(pod: &Pod) -> String {
    pod.metadata.uid.clone().unwrap_or_default()
}

/// The reason a refused static pod's status gives: upstream has none of its own for this
/// refusal (it refuses the manifest when reading it), so the generic admission reason.
const REFUSED_REASON: &str = "UnexpectedAdmissionError";

/// Why a static pod may not be run (it refers to API objects), or `None`.
fn static_pod_refusal(pod: &Pod) -> Option<String> {
    if !crate::mirror_pods::is_static(pod) {
        return None;
    }
    crate::source::validate::static_pod_api_refusal(pod)
}

impl<R: RuntimeService + ImageService> SyncLoop<R> {
    pub fn new(
        workers: PodWorkers<R>,
        sources_ready: SourcesReady,
        runtime_cache: RuntimeCache,
    ) -> Self {
        SyncLoop {
            workers,
            desired: HashMap::new(),
            waiting_for_name: HashMap::new(),
            refused: HashMap::new(),
            sources_ready,
            runtime_cache,
        }
    }

    /// Applies one batch of source changes.
    pub fn handle_changes(&mut self, changes: Vec<PodChange>) {
        // Removals first: an edited static pod arrives as Remove(old) + Add(new), and the new
        // one must see the old one terminating.
        let (removes, others): (Vec<_>, Vec<_>) = changes
            .into_iter()
            .partition(|c| matches!(c, PodChange::Remove(_)));
        for change in removes.into_iter().chain(others) {
            match change {
                // The API server is deleting the pod: stop it with the grace period the
                // deletion asked for; once it is torn down, the status writer deletes it.
                PodChange::Add(pod) | PodChange::Update(pod)
                    if pod.metadata.deletion_timestamp.is_some() =>
                {
                    let grace = pod.metadata.deletion_grace_period_seconds;
                    self.terminate(pod, grace, "the pod is being deleted; terminating");
                }
                PodChange::Add(pod) | PodChange::Update(pod) => {
                    if let Some(message) = static_pod_refusal(&pod) {
                        self.refuse(pod, message);
                        continue;
                    }
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
                PodChange::Remove(pod) => {
                    self.terminate(pod, None, "pod removed from its source; terminating");
                }
            }
        }
    }

    /// Refuses a static pod at admission: it is not run, and `/pods` shows it Failed with the
    /// reason (upstream: "static pods may not reference …"). An earlier version of it that
    /// runs (a manifest that names its UID) is torn down first.
    fn refuse(&mut self, pod: Arc<Pod>, message: String) {
        let uid = uid_of(&pod);
        tracing::warn!(pod = %full_name(&pod), pod_uid = %uid, reason = REFUSED_REASON, %message, "refusing a static pod");
        let message = format!("Pod was rejected: {message}");
        if self.desired.contains_key(&uid) || self.workers.has(&uid) {
            self.terminate(pod.clone(), None, "the pod is refused now; terminating");
            self.refused.insert(uid, (pod.clone(), message.clone()));
        }
        self.workers.refused(&pod, REFUSED_REASON, &message);
    }

    /// Stops wanting `pod` and has its worker tear it down (`grace` overrides the pod's own).
    fn terminate(&mut self, pod: Arc<Pod>, grace: Option<i64>, why: &str) {
        let uid = uid_of(&pod);
        let name = full_name(&pod);
        self.desired.remove(&uid);
        self.refused.remove(&uid);
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
    pub fn handle_done(&mut self, uid: &str) {
        self.workers.finished(uid);
        if let Some((pod, message)) = self.refused.remove(uid) {
            self.workers.refused(&pod, REFUSED_REASON, &message);
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

    /// Tears down what runs in the runtime for pods no source has, once every source has
    /// spoken (before that, a missing pod may just not have been read yet).
    pub fn housekeeping(&mut self) {
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
    }

    /// Runs until `cancel` fires. An input that closes is simply no longer read (the
    /// housekeeping tick keeps the loop going); `health` hears of every turn.
    pub async fn run(
        mut self,
        mut config: mpsc::Receiver<Vec<PodChange>>,
        pokes: Pokes,
        mut done: mpsc::UnboundedReceiver<String>,
        health: SyncLoopHealth,
        cancel: CancellationToken,
    ) {
        let mut housekeeping = tokio::time::interval(HOUSEKEEPING_PERIOD);
        housekeeping.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            health.turned();
            tokio::select! {
                _ = cancel.cancelled() => return,
                Some(changes) = config.recv() => self.handle_changes(changes),
                uids = pokes.take() => for uid in uids { self.workers.poke(&uid) },
                Some(uid) = done.recv() => self.handle_done(&uid),
                _ = housekeeping.tick() => self.housekeeping(),
            }
        }
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
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::cri::fake::FakeCri;
    use crate::observed::{ObservedPod, ObservedSandbox, SandboxState};
    use crate::pod_workers::test_support::{IMAGE, eventually, harness, pod};

    fn sync_loop(h: crate::pod_workers::test_support::Harness) -> (SyncLoop<FakeCri>, Parts) {
        let ready = SourcesReady::new(["file"]);
        let parts = Parts {
            rt: h.rt,
            done: h.done,
            ready: ready.clone(),
            cache: h.runtime_cache.clone(),
            cancel: h.cancel,
            _dir: h.dir,
        };
        (SyncLoop::new(h.workers, ready, h.runtime_cache), parts)
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
        let (mut sl, mut parts) = sync_loop(h);
        parts.ready.mark_seen("file");
        let mut p = (*pod("uid-secret")).clone();
        p.metadata.annotations = Some(BTreeMap::from([(
            crate::source::defaults::CONFIG_SOURCE_ANNOTATION.to_string(),
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
        // Its manifest removed: it is gone from /pods.
        sl.handle_changes(vec![PodChange::Remove(p)]);
        let done = next_done(&mut parts).await;
        assert_eq!(done.as_deref(), Some("uid-secret"));
        sl.handle_done("uid-secret");
        assert!(states.status("uid-secret").is_none());
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
}
