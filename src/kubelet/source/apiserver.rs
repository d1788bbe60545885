//! The third pod source: the pods the API server binds to this node (`spec.nodeName`), by
//! list and then watch from the list's resourceVersion, with bookmarks. A 410 Gone (the
//! version fell out of the API server's window) lists again; a broken stream resumes from the
//! newest version seen; failures retry with back-off up to 7 s. Every change sends the
//! source's full set of pods to the merge, like the other sources.
//!
//! Mirror pods (the API server's copies of this node's static pods) are not pods to run: they
//! never reach the merge. Every pod the source sees, mirror pods included, is kept in an
//! [`ApiPodsView`], from which the mirror pod manager learns which mirror pods exist and the
//! status writer what the API server holds. Pods the node cannot run safely are refused with
//! the reason logged.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::validate::{self, validate_security::NodeSecurity};
use super::{SOURCE_API, SourceSnapshot, full_name};
use crate::clients::apiserver::retry::{Backoff, pause};
use crate::clients::apiserver::{Problem, ProblemKind, ProblemLog};

/// The annotation that marks a mirror pod.
pub const MIRROR_ANNOTATION: &str = super::defaults::CONFIG_MIRROR_ANNOTATION;

/// How long one watch request lasts before the API server ends it (and we start the next).
const WATCH_SECONDS: u32 = 290;

/// Lists and watches the pods bound to this node.
pub struct ApiSource {
    pods: Api<Pod>,
    node_name: String,
    security: Arc<NodeSecurity>,
    on_refused: Option<OnRefused>,
    view: ApiPodsView,
    problems: ProblemLog,
}

/// Told about each pod the node refuses, with upstream's reason and message, so the refusal
/// can be written to the pod's status.
pub type OnRefused = Arc<dyn Fn(&Pod, &str, &str) + Send + Sync>;

/// What the source needs: the client it watches with, who hears of refusals, and the view it
/// keeps of every pod it sees.
#[derive(Clone)]
pub struct ApiSourceConfig {
    pub client: kube::Client,
    pub on_refused: Option<OnRefused>,
    pub view: ApiPodsView,
}

/// What the API server last said about the pods bound to this node, mirror pods included, by
/// UID. The source replaces it after every list and every batch of watch events; the status
/// writer puts in the pods its writes return, so the next write is computed against them.
/// Cheap to clone; readers get `Arc`s, and nothing holds the lock across an await.
#[derive(Clone)]
pub struct ApiPodsView {
    inner: Arc<RwLock<ViewInner>>,
    /// Bumped on every change the source makes (not on the writer's own updates).
    changed: Arc<watch::Sender<u64>>,
}

#[derive(Default)]
struct ViewInner {
    /// The source has listed at least once: an absent pod is really absent.
    listed: bool,
    pods: BTreeMap<String, Arc<Pod>>,
}

impl Default for ApiPodsView {
    fn default() -> Self {
        ApiPodsView {
            inner: Arc::default(),
            changed: Arc::new(watch::channel(0).0),
        }
    }
}

impl ApiPodsView {
    /// Wakes the receiver whenever the source changed the view.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// True once the source has listed the node's pods.
    pub fn listed(&self) -> bool {
        self.read().listed
    }

    /// The pod with this UID, as the API server last returned it.
    pub fn get(&self, uid: &str) -> Option<Arc<Pod>> {
        self.read().pods.get(uid).cloned()
    }

    /// The mirror pods bound to this node.
    pub fn mirrors(&self) -> Vec<Arc<Pod>> {
        self.read()
            .pods
            .values()
            .filter(|p| is_mirror(p))
            .cloned()
            .collect()
    }

    /// Replaces the whole view (the source's set after a list or a batch of events).
    pub(crate) fn replace(&self, pods: BTreeMap<String, Arc<Pod>>) {
        {
            let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
            inner.listed = true;
            inner.pods = pods;
        }
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// A write returned `pod`: it replaces the view's copy, if the view still holds that UID
    /// (a pod the source has seen go stays gone).
    pub fn note_written(&self, pod: Pod) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        let mut inner = self.inner.write().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = inner.pods.get_mut(&uid) {
            *entry = Arc::new(pod);
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, ViewInner> {
        self.inner.read().unwrap_or_else(|e| e.into_inner())
    }
}

impl std::fmt::Debug for ApiPodsView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.read();
        f.debug_struct("ApiPodsView")
            .field("listed", &inner.listed)
            .field("pods", &inner.pods.len())
            .finish()
    }
}

pub use crate::base::podspec::origin::is_mirror;

impl std::fmt::Debug for ApiSourceConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiSourceConfig")
    }
}

/// Why a pod from the API server is not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotRun {
    /// Not a pod for this node to run (a mirror pod, another node's, already finished).
    Skip,
    /// The node refuses it: upstream's admission reason and message.
    Refuse {
        reason: &'static str,
        message: String,
    },
}

/// Upstream's admission result for the checks a pod failed: sysctls and AppArmor have their
/// own reasons; anything else is an unexpected admission error.
pub fn admission_result(errors: &[validate::ValidationError]) -> (&'static str, String) {
    let all = validate::join_errors(errors);
    if errors.iter().any(|e| e.field.contains("sysctls")) {
        ("SysctlForbidden", format!("forbidden sysctl: {all}"))
    } else if errors.iter().any(|e| e.field.contains("appArmorProfile")) {
        ("AppArmor", format!("Cannot enforce AppArmor: {all}"))
    } else {
        ("UnexpectedAdmissionError", all)
    }
}

/// The pods the source holds, by UID, and the version they are current at.
struct Seen {
    version: String,
    pods: BTreeMap<String, Arc<Pod>>,
}

impl ApiSource {
    pub fn new(config: ApiSourceConfig, node_name: String, security: Arc<NodeSecurity>) -> Self {
        ApiSource {
            pods: Api::all(config.client),
            node_name,
            security,
            on_refused: config.on_refused,
            view: config.view,
            problems: ProblemLog::default(),
        }
    }

    fn field_selector(&self) -> String {
        format!("spec.nodeName={}", self.node_name)
    }

    /// Runs until `cancel`.
    pub(crate) async fn run(self, tx: mpsc::Sender<SourceSnapshot>, cancel: CancellationToken) {
        let mut seen: Option<Seen> = None;
        let mut backoff = Backoff::new(Duration::from_millis(100));
        let mut refused = BTreeMap::new();
        loop {
            if cancel.is_cancelled() {
                return;
            }
            let result = match seen.as_mut() {
                // A list against a slow API server can take long; a stop must not wait for it.
                None => match tokio::select! {
                    _ = cancel.cancelled() => return,
                    r = self.list() => r,
                } {
                    Ok(list) => {
                        seen = Some(list);
                        Ok(())
                    }
                    Err(p) => Err(p),
                },
                Some(current) => self.watch(current, &tx, &mut refused, &cancel).await,
            };
            match result {
                Ok(()) => {
                    backoff.reset();
                    self.problems.succeeded("watching the node's pods");
                }
                Err(p) if p.is(ProblemKind::Expired) => {
                    tracing::info!("the pod watch's version expired; listing again");
                    seen = None;
                    continue;
                }
                Err(p) => {
                    self.problems.failed("watching the node's pods", &p);
                    if !pause(backoff.next_wait(), &cancel).await {
                        return;
                    }
                    continue;
                }
            }
            // After a list, the snapshot goes out before the watch starts.
            if let Some(current) = seen.as_ref()
                && !self.send(current, &tx, &mut refused).await
            {
                return;
            }
        }
    }

    async fn list(&self) -> Result<Seen, Problem> {
        let list = self
            .pods
            .list(&ListParams::default().fields(&self.field_selector()))
            .await?;
        let version = list.metadata.resource_version.clone().unwrap_or_default();
        let pods = list
            .items
            .into_iter()
            .filter_map(|p| Some((p.metadata.uid.clone()?, Arc::new(p))))
            .collect();
        Ok(Seen { version, pods })
    }

    /// One watch request, applied to `seen` until it ends. Events that arrive together are
    /// applied together and sent as one snapshot.
    async fn watch(
        &self,
        seen: &mut Seen,
        tx: &mpsc::Sender<SourceSnapshot>,
        refused: &mut BTreeMap<String, String>,
        cancel: &CancellationToken,
    ) -> Result<(), Problem> {
        let params = WatchParams::default()
            .fields(&self.field_selector())
            .timeout(WATCH_SECONDS);
        let stream = tokio::select! {
            _ = cancel.cancelled() => return Ok(()),
            r = self.pods.watch(&params, &seen.version) => r?,
        };
        let mut stream = std::pin::pin!(stream);
        loop {
            let event = tokio::select! {
                _ = cancel.cancelled() => return Ok(()),
                e = stream.next() => e,
            };
            let Some(event) = event else {
                return Ok(());
            };
            let mut changed = apply(seen, event?)?;
            while let Some(Some(event)) = stream.next().now_or_never() {
                changed |= apply(seen, event?)?;
            }
            if changed && !self.send(seen, tx, refused).await {
                return Ok(());
            }
        }
    }

    /// Updates the view and sends the pods to run (mirror pods stay in the view only); false
    /// when the merge is gone (shutting down).
    async fn send(
        &self,
        seen: &Seen,
        tx: &mpsc::Sender<SourceSnapshot>,
        refused: &mut BTreeMap<String, String>,
    ) -> bool {
        self.view.replace(seen.pods.clone());
        let mut pods = Vec::with_capacity(seen.pods.len());
        let mut still_refused = BTreeMap::new();
        for pod in seen.pods.values() {
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

    /// Whether this node runs `pod`: not a mirror pod, bound here, not finished, and safe.
    fn admit(&self, pod: &Pod) -> Result<(), NotRun> {
        let mirror = is_mirror(pod);
        let bound_here =
            pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(self.node_name.as_str());
        // A pod in a terminal phase is never started again (upstream's rule); once its final
        // status is written, its containers are torn down.
        let finished = matches!(
            pod.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Succeeded" | "Failed")
        );
        if mirror || !bound_here || finished {
            return Err(NotRun::Skip);
        }
        validate::validate_pod(pod, &self.security).map_err(|errors| {
            let (reason, message) = admission_result(&errors);
            NotRun::Refuse { reason, message }
        })
    }
}

/// Applies one watch event; true when the set of pods changed.
fn apply(seen: &mut Seen, event: WatchEvent<Pod>) -> Result<bool, Problem> {
    match event {
        WatchEvent::Added(pod) | WatchEvent::Modified(pod) => {
            note_version(seen, &pod);
            let Some(uid) = pod.metadata.uid.clone() else {
                return Ok(false);
            };
            seen.pods.insert(uid, Arc::new(pod));
            Ok(true)
        }
        WatchEvent::Deleted(pod) => {
            note_version(seen, &pod);
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            Ok(seen.pods.remove(&uid).is_some())
        }
        WatchEvent::Bookmark(b) => {
            seen.version = b.metadata.resource_version;
            Ok(false)
        }
        WatchEvent::Error(status) => Err(Problem::watch_ended("the pod watch", &status)),
    }
}

fn note_version(seen: &mut Seen, pod: &Pod) {
    if let Some(v) = &pod.metadata.resource_version {
        seen.version = v.clone();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::watch::Bookmark;

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

    #[test]
    fn events_update_the_set_and_the_version() {
        let mut seen = Seen {
            version: "1".into(),
            pods: BTreeMap::new(),
        };
        assert!(apply(&mut seen, WatchEvent::Added(pod("a", "2"))).unwrap());
        assert!(apply(&mut seen, WatchEvent::Modified(pod("a", "3"))).unwrap());
        assert_eq!(seen.version, "3");
        assert!(
            !apply(&mut seen, WatchEvent::Deleted(pod("b", "4"))).unwrap(),
            "unknown pod"
        );
        assert!(apply(&mut seen, WatchEvent::Deleted(pod("a", "5"))).unwrap());
        assert!(seen.pods.is_empty());
        let bookmark: Bookmark = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"resourceVersion": "9"}
        }))
        .unwrap();
        assert!(!apply(&mut seen, WatchEvent::Bookmark(bookmark)).unwrap());
        assert_eq!(seen.version, "9");
        let mut gone = kube::core::Status::failure("too old resource version", "Expired");
        gone.code = 410;
        let err = apply(&mut seen, WatchEvent::Error(Box::new(gone))).unwrap_err();
        assert!(err.is(ProblemKind::Expired), "{err:?}");
    }

    /// An API server that accepts the connection and never answers: the source must still stop
    /// when asked, not wait out its list.
    #[tokio::test]
    async fn a_stop_does_not_wait_for_an_unanswered_list() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url: http::Uri = format!("http://{}", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let client = kube::Client::try_from(kube::Config::new(url)).unwrap();
        let source = ApiSource::new(
            ApiSourceConfig {
                client,
                on_refused: None,
                view: ApiPodsView::default(),
            },
            "n1".into(),
            Arc::new(NodeSecurity::default()),
        );
        let (tx, _rx) = mpsc::channel(1);
        let cancel = CancellationToken::new();
        let task = tokio::spawn(source.run(tx, cancel.clone()));
        // The list request is on its way once the connection is accepted.
        let (_held, _) = listener.accept().await.unwrap();
        cancel.cancel();
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("the source stopped while its list was unanswered")
            .unwrap();
    }
}
