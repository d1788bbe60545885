//! The third pod source: the pods the API server binds to this node (`spec.nodeName`), by
//! kube's watcher ([`crate::clients::apiserver::watch`]: list, then watch with bookmarks; a
//! 410 Gone lists again; failures retry with back-off up to 7 s, each reported once). Every
//! change sends the source's full set of pods to the merge, like the other sources.
//!
//! Mirror pods (the API server's copies of this node's static pods) are not pods to run: they
//! never reach the merge. Every pod the source sees, mirror pods included, is kept in an
//! [`ApiPodsView`] (kube's reflector store), from which the mirror pod manager learns which
//! mirror pods exist and the status writer what the API server holds. Pods the node cannot run
//! safely are refused with the reason logged.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::reflector::{ObjectRef, Store, store::Writer};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::validate::{self, validate_security::NodeSecurity};
use super::{SOURCE_API, SourceSnapshot, full_name};
use crate::clients::apiserver::ProblemLog;
use crate::clients::apiserver::watch::{self as api_watch, Event, Watch};

/// The annotation that marks a mirror pod.
#[cfg(test)]
pub(crate) const MIRROR_ANNOTATION: &str = super::defaults::CONFIG_MIRROR_ANNOTATION;

/// The wait before the first retry of a failed list or watch (then doubling to 7 s).
const FIRST_RETRY: Duration = Duration::from_millis(100);

/// Lists and watches the pods bound to this node.
pub(crate) struct ApiSource {
    pods: Api<Pod>,
    node_name: String,
    security: Arc<NodeSecurity>,
    on_refused: Option<OnRefused>,
    view: ApiPodsView,
    problems: ProblemLog,
}

/// Told about each pod the node refuses, with upstream's reason and message, so the refusal
/// can be written to the pod's status.
pub(crate) type OnRefused = Arc<dyn Fn(&Pod, &str, &str) + Send + Sync>;

/// What the source needs: the client it watches with, who hears of refusals, and the view it
/// keeps of every pod it sees.
#[derive(Clone)]
pub struct ApiSourceConfig {
    pub client: kube::Client,
    pub on_refused: Option<OnRefused>,
    pub view: ApiPodsView,
}

/// What the API server last said about the pods bound to this node, mirror pods included: the
/// store of kube's reflector, which the source feeds with its watcher's events (a relist
/// replaces the store at once when it is complete). The status writer puts in the pods its
/// writes return, so the next write is computed against them: such a copy stands in for the
/// store's until the watch brings another version of that pod. Cheap to clone; readers get
/// `Arc`s, and nothing holds a lock across an await.
#[derive(Clone)]
pub struct ApiPodsView {
    store: Store<Pod>,
    inner: Arc<Mutex<ViewInner>>,
    /// The source has listed at least once: an absent pod is really absent.
    listed: Arc<AtomicBool>,
    /// Bumped on every change the source makes (not on the writer's own updates).
    changed: Arc<watch::Sender<u64>>,
}

struct ViewInner {
    writer: Writer<Pod>,
    /// The pods the status writer's writes returned, by UID.
    written: HashMap<String, Written>,
}

/// A pod as a write returned it, and the version of the store's copy it was written over.
struct Written {
    over: Option<String>,
    pod: Arc<Pod>,
}

impl Default for ApiPodsView {
    fn default() -> Self {
        let writer = Writer::default();
        ApiPodsView {
            store: writer.as_reader(),
            inner: Arc::new(Mutex::new(ViewInner {
                writer,
                written: HashMap::new(),
            })),
            listed: Arc::default(),
            changed: Arc::new(watch::channel(0).0),
        }
    }
}

fn uid_of(pod: &Pod) -> Option<&str> {
    pod.metadata.uid.as_deref()
}

impl ApiPodsView {
    /// Wakes the receiver whenever the source changed the view.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// True once the source has listed the node's pods.
    pub fn listed(&self) -> bool {
        self.listed.load(Ordering::Acquire)
    }

    /// The pod with this UID, as the API server last returned it.
    pub fn get(&self, uid: &str) -> Option<Arc<Pod>> {
        let current = self.store.find(|p| uid_of(p) == Some(uid))?;
        Some(self.newest(current))
    }

    /// The mirror pods bound to this node, by UID.
    pub fn mirrors(&self) -> Vec<Arc<Pod>> {
        let mut mirrors: Vec<Arc<Pod>> = self
            .store
            .state_filter(is_mirror)
            .into_iter()
            .map(|p| self.newest(p))
            .collect();
        mirrors.sort_by(|a, b| uid_of(a).cmp(&uid_of(b)));
        mirrors
    }

    /// The written copy of `current`, if one was written over this version of it.
    fn newest(&self, current: Arc<Pod>) -> Arc<Pod> {
        let inner = self.lock();
        match uid_of(&current).and_then(|uid| inner.written.get(uid)) {
            Some(w) if w.over == current.metadata.resource_version => w.pod.clone(),
            _ => current,
        }
    }

    /// Applies a batch of the watcher's events to the store; true (and the subscribers woken
    /// once) when the set of pods changed. The first complete list marks the view listed.
    pub(crate) fn apply(&self, events: &[Event<Pod>]) -> bool {
        let mut changed = false;
        let mut listed = false;
        {
            let mut inner = self.lock();
            for event in events {
                changed |= match event {
                    Event::Apply(_) | Event::InitDone => true,
                    Event::Delete(pod) => self.store.get(&ObjectRef::from_obj(pod)).is_some(),
                    Event::Init | Event::InitApply(_) => false,
                };
                listed |= matches!(event, Event::InitDone);
                inner.writer.apply_watcher_event(event);
            }
            if changed {
                // Written copies of pods the watch has since brought again are stale.
                let versions: HashMap<String, Option<String>> = self
                    .store
                    .state()
                    .iter()
                    .filter_map(|p| {
                        Some((uid_of(p)?.to_string(), p.metadata.resource_version.clone()))
                    })
                    .collect();
                inner
                    .written
                    .retain(|uid, w| versions.get(uid).is_some_and(|v| *v == w.over));
            }
        }
        if listed {
            self.listed.store(true, Ordering::Release);
        }
        if changed {
            self.changed.send_modify(|v| *v = v.wrapping_add(1));
        }
        changed
    }

    /// Replaces the whole view, as a complete list does (tests of the view's readers).
    #[cfg(test)]
    pub(crate) fn replace(&self, pods: BTreeMap<String, Arc<Pod>>) {
        let mut events = vec![Event::Init];
        events.extend(pods.values().map(|p| Event::InitApply((**p).clone())));
        events.push(Event::InitDone);
        self.apply(&events);
    }

    /// A write returned `pod`: it stands in for the view's copy, if the view still holds that
    /// UID (a pod the source has seen go stays gone), until the watch brings the pod again.
    pub fn note_written(&self, pod: Pod) {
        let Some(uid) = uid_of(&pod).map(str::to_string) else {
            return;
        };
        let Some(current) = self.store.find(|p| uid_of(p) == Some(uid.as_str())) else {
            return;
        };
        let over = current.metadata.resource_version.clone();
        self.lock().written.insert(
            uid,
            Written {
                over,
                pod: Arc::new(pod),
            },
        );
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ViewInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl std::fmt::Debug for ApiPodsView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiPodsView")
            .field("listed", &self.listed())
            .field("pods", &self.store.len())
            .finish()
    }
}

pub(crate) use crate::base::podspec::origin::is_mirror;

impl std::fmt::Debug for ApiSourceConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiSourceConfig")
    }
}

/// Why a pod from the API server is not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum NotRun {
    /// Not a pod for this node (a mirror pod, another node's, a finished one it would refuse).
    Skip,
    /// The node refuses it: upstream's admission reason and message.
    Refuse {
        reason: &'static str,
        message: String,
    },
}

/// Upstream's admission result for the checks a pod failed: sysctls and AppArmor have their
/// own reasons; anything else is an unexpected admission error.
pub(crate) fn admission_result(errors: &[validate::ValidationError]) -> (&'static str, String) {
    let all = validate::join_errors(errors);
    if errors.iter().any(|e| e.field.contains("sysctls")) {
        ("SysctlForbidden", format!("forbidden sysctl: {all}"))
    } else if errors.iter().any(|e| e.field.contains("appArmorProfile")) {
        ("AppArmor", format!("Cannot enforce AppArmor: {all}"))
    } else {
        ("UnexpectedAdmissionError", all)
    }
}

impl ApiSource {
    pub(crate) fn new(
        config: ApiSourceConfig,
        node_name: String,
        security: Arc<NodeSecurity>,
    ) -> Self {
        ApiSource {
            pods: Api::all(config.client),
            node_name,
            security,
            on_refused: config.on_refused,
            view: config.view,
            problems: ProblemLog::default(),
        }
    }

    /// Runs until `cancel`. Events that arrive together are applied together and sent as one
    /// snapshot; the first snapshot goes out when the first list is complete.
    pub(crate) async fn run(self, tx: mpsc::Sender<SourceSnapshot>, cancel: CancellationToken) {
        let config =
            api_watch::Config::default().fields(&format!("spec.nodeName={}", self.node_name));
        let mut watch = Watch::new(
            api_watch::events(self.pods.clone(), config),
            FIRST_RETRY,
            "watching the node's pods",
            self.problems.clone(),
        );
        let mut refused = BTreeMap::new();
        while let Some(batch) = watch.next_batch(&cancel).await {
            if self.view.apply(&batch) && !self.send(&tx, &mut refused).await {
                return;
            }
        }
    }

    /// Sends the pods of the view to run (mirror pods stay in the view only); false when the
    /// merge is gone (shutting down).
    async fn send(
        &self,
        tx: &mpsc::Sender<SourceSnapshot>,
        refused: &mut BTreeMap<String, String>,
    ) -> bool {
        let mut seen = self.view.store.state();
        seen.sort_by(|a, b| uid_of(a).cmp(&uid_of(b)));
        let mut pods = Vec::with_capacity(seen.len());
        let mut still_refused = BTreeMap::new();
        for pod in &seen {
            match self.admit(pod) {
                Ok(()) => pods.push((**pod).clone()),
                Err(NotRun::Skip) => {}
                Err(NotRun::Refuse { reason, message }) => {
                    let uid = pod.metadata.uid.clone().unwrap_or_default();
                    if refused.get(&uid) != Some(&message) {
                        tracing::warn!(pod = %full_name(pod), pod_uid = %uid, reason, %message, "refusing a pod from the API server");
                        if let Some(tell) = &self.on_refused {
                            tell(pod, reason, &message);
                        }
                    }
                    still_refused.insert(uid, message);
                }
            }
        }
        *refused = still_refused;
        tx.send(SourceSnapshot {
            source: SOURCE_API,
            pods,
        })
        .await
        .is_ok()
    }

    /// Whether this node has `pod`: not a mirror pod, bound here, and safe. A pod in a
    /// terminal phase is passed on, as upstream's config passes it: the node never starts it
    /// again (its worker only makes sure it is stopped), but keeps its exited containers and
    /// their logs until the API server deletes it. One that fails the checks is not refused
    /// again (it will not run), only left out.
    fn admit(&self, pod: &Pod) -> Result<(), NotRun> {
        let mirror = is_mirror(pod);
        let bound_here =
            pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(self.node_name.as_str());
        if mirror || !bound_here {
            return Err(NotRun::Skip);
        }
        let finished = crate::base::podspec::pod::phase_is_terminal(pod);
        validate::validate_pod(pod, &self.security).map_err(|errors| {
            if finished {
                return NotRun::Skip;
            }
            let (reason, message) = admission_result(&errors);
            NotRun::Refuse { reason, message }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, version: &str) -> Pod {
        let mut p = Pod::default();
        p.metadata.uid = Some(uid.into());
        p.metadata.name = Some(format!("p-{uid}"));
        p.metadata.resource_version = Some(version.into());
        p
    }

    #[test]
    fn admission_results_use_upstreams_reasons() {
        let e = |field: &str| validate::ValidationError {
            field: field.into(),
            reason: "not allowed".into(),
        };
        let (reason, message) = admission_result(&[e("spec.securityContext.sysctls[0].name")]);
        assert_eq!(reason, "SysctlForbidden");
        assert!(
            message.starts_with("forbidden sysctl: spec.securityContext.sysctls[0].name"),
            "{message}"
        );
        let (reason, message) =
            admission_result(&[e("spec.containers[0].securityContext.appArmorProfile")]);
        assert_eq!(reason, "AppArmor");
        assert!(
            message.starts_with("Cannot enforce AppArmor: "),
            "{message}"
        );
        assert_eq!(
            admission_result(&[e("spec.hostUsers")]).0,
            "UnexpectedAdmissionError"
        );
    }

    #[test]
    fn the_view_holds_every_pod_and_tells_of_changes() {
        let view = ApiPodsView::default();
        let mut changes = view.subscribe();
        assert!(!view.listed());
        let mut m = pod("m", "1");
        m.metadata.annotations = Some([(MIRROR_ANNOTATION.to_string(), "h".to_string())].into());
        let pods = BTreeMap::from([
            ("a".to_string(), Arc::new(pod("a", "1"))),
            ("m".to_string(), Arc::new(m)),
        ]);
        view.replace(pods);
        assert!(view.listed());
        assert!(changes.has_changed().unwrap());
        changes.borrow_and_update();
        let mirrors: Vec<_> = view
            .mirrors()
            .iter()
            .map(|p| p.metadata.uid.clone().unwrap())
            .collect();
        assert_eq!(mirrors, ["m"]);
        // A write's answer replaces the copy of a pod the view holds, and adds none.
        let mut written = pod("a", "2");
        written.status = Some(Default::default());
        view.note_written(written);
        view.note_written(pod("gone", "3"));
        assert_eq!(
            view.get("a").unwrap().metadata.resource_version.as_deref(),
            Some("2")
        );
        assert!(view.get("gone").is_none());
        assert!(
            !changes.has_changed().unwrap(),
            "the writer's own updates wake nobody"
        );
    }

    fn uids(view: &ApiPodsView) -> Vec<String> {
        let mut uids: Vec<String> = view
            .store
            .state()
            .iter()
            .map(|p| p.metadata.uid.clone().unwrap())
            .collect();
        uids.sort();
        uids
    }

    /// A row of the table below: what happens, the events, whether they are a change to send,
    /// whether the view is listed after them, and the UIDs of the pods it holds.
    type Row = (&'static str, Vec<Event<Pod>>, bool, bool, Vec<&'static str>);

    /// What each of the watcher's events does to the view.
    #[test]
    fn the_watchers_events_change_the_view() {
        let view = ApiPodsView::default();
        let mut changes = view.subscribe();
        let table: Vec<Row> = vec![
            ("a list starts", vec![Event::Init], false, false, vec![]),
            (
                "listed pods wait for the list's end",
                vec![
                    Event::InitApply(pod("a", "1")),
                    Event::InitApply(pod("b", "1")),
                ],
                false,
                false,
                vec![],
            ),
            (
                "the list is complete",
                vec![Event::InitDone],
                true,
                true,
                vec!["a", "b"],
            ),
            (
                "a pod is added",
                vec![Event::Apply(pod("c", "2"))],
                true,
                true,
                vec!["a", "b", "c"],
            ),
            (
                "a pod changes",
                vec![Event::Apply(pod("a", "3"))],
                true,
                true,
                vec!["a", "b", "c"],
            ),
            (
                "an unknown pod goes",
                vec![Event::Delete(pod("x", "4"))],
                false,
                true,
                vec!["a", "b", "c"],
            ),
            (
                "a pod goes",
                vec![Event::Delete(pod("b", "5"))],
                true,
                true,
                vec!["a", "c"],
            ),
            (
                "a relist (after a 410) keeps the old set until it is complete",
                vec![Event::Init, Event::InitApply(pod("c", "6"))],
                false,
                true,
                vec!["a", "c"],
            ),
            (
                "… and then replaces it",
                vec![Event::InitDone],
                true,
                true,
                vec!["c"],
            ),
            (
                "a burst is one change",
                vec![Event::Apply(pod("d", "7")), Event::Delete(pod("c", "8"))],
                true,
                true,
                vec!["d"],
            ),
        ];
        for (what, events, changed, listed, pods) in table {
            changes.mark_unchanged();
            assert_eq!(view.apply(&events), changed, "{what}");
            assert_eq!(
                changes.has_changed().unwrap(),
                changed,
                "{what}: subscribers woken"
            );
            assert_eq!(view.listed(), listed, "{what}");
            assert_eq!(uids(&view), pods, "{what}");
        }
        assert_eq!(
            view.get("a")
                .map(|p| p.metadata.resource_version.clone().unwrap()),
            None
        );
        assert_eq!(
            view.get("d").unwrap().metadata.resource_version.as_deref(),
            Some("7")
        );
    }

    #[test]
    fn a_written_copy_stands_in_until_the_watch_brings_the_pod_again() {
        let view = ApiPodsView::default();
        view.replace(BTreeMap::from([
            ("a".to_string(), Arc::new(pod("a", "1"))),
            ("b".to_string(), Arc::new(pod("b", "1"))),
        ]));
        let rv = |uid: &str| {
            view.get(uid)
                .unwrap()
                .metadata
                .resource_version
                .clone()
                .unwrap()
        };
        view.note_written(pod("a", "3"));
        assert_eq!(rv("a"), "3");
        // Another pod's change leaves it.
        view.apply(&[Event::Apply(pod("b", "4"))]);
        assert_eq!(rv("a"), "3");
        // The watch's next version of the pod replaces it.
        view.apply(&[Event::Apply(pod("a", "5"))]);
        assert_eq!(rv("a"), "5");
        view.note_written(pod("a", "6"));
        view.apply(&[Event::Delete(pod("a", "7"))]);
        assert!(view.get("a").is_none(), "gone stays gone");
        view.note_written(pod("a", "8"));
        assert!(view.get("a").is_none());
    }

    /// An API server that never answers the list: the source must still stop when asked,
    /// not wait out its list.
    #[tokio::test]
    async fn a_stop_does_not_wait_for_an_unanswered_list() {
        use crate::clients::apiserver::fake::{FakeApiServer, Rule};
        let fake = FakeApiServer::new();
        let held = fake.hold(Rule::new("*", "pods"));
        let source = ApiSource::new(
            ApiSourceConfig {
                client: fake.client(),
                on_refused: None,
                view: ApiPodsView::default(),
            },
            "n1".into(),
            Arc::new(NodeSecurity::default()),
        );
        let (tx, _rx) = mpsc::channel(1);
        let cancel = CancellationToken::new();
        let task = tokio::spawn(source.run(tx, cancel.clone()));
        tokio::time::timeout(Duration::from_secs(10), held.arrived(1))
            .await
            .expect("the source asked for its pods");
        let list = &fake.requests()[0];
        assert_eq!(list.describe(), "list pods");
        assert_eq!(list.param("fieldSelector"), Some("spec.nodeName=n1"));
        cancel.cancel();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the source stopped while its list was unanswered")
            .unwrap();
    }
}
