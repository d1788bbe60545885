//! Mirror pods: the API server's copies of the static pods this node runs, as upstream's mirror
//! client and pod manager keep them (only with `--kubeconfig`).
//!
//! The pod workers tell a [`MirrorPods`] handle where each static pod is (handed to a worker,
//! synced, being torn down, gone); the API server source keeps the mirror pods it sees in its
//! [`ApiPodsView`]. One task compares the two whenever either changes and creates, replaces or
//! deletes mirror pods as [`decide`] says. It has a task of its own so that an API server that
//! is slow or down never holds up a static pod: the workers only update a map and poke.
//!
//! The status writer asks [`MirrorPods::target`] where a static pod's status goes: onto its
//! mirror pod, under the mirror pod's UID.

pub(crate) mod decide;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, PostParams};
use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use self::decide::{
    Decision, MirrorView, Stage, StaticView, decide, mirror_hash, mirror_pod, static_hash,
};
use crate::base::clock;
use crate::base::podspec::full_name;
use crate::clients::apiserver::retry::Backoff;
use crate::clients::apiserver::{Problem, ProblemKind, ProblemLog};
use crate::kubelet::source::SourcesReady;
use crate::kubelet::source::apiserver::ApiPodsView;

/// How long after every source has delivered its pods orphaned mirror pods are deleted. The
/// merge marks a source ready once its first changes are on their way to the sync loop, which
/// hands them to the workers a moment later; until then a static pod that is about to run
/// would look gone and its mirror pod orphaned.
pub(crate) const ORPHAN_GRACE: Duration = Duration::from_secs(2);
/// How often the readiness of the sources is looked at while an orphan waits for it.
const READY_POLL: Duration = Duration::from_millis(250);
/// How long a mirror pod we created is taken to exist while the watch has not shown it yet.
const CREATED_MEMORY: Duration = Duration::from_secs(15);
/// The first wait before a failed request for one pod name is tried again (doubling to 7 s).
const FIRST_RETRY: Duration = Duration::from_millis(200);
/// Field manager name in managedFields.
const FIELD_MANAGER: &str = "deckhand";

pub(crate) use crate::base::podspec::origin::is_static;

/// The three API calls mirror pods need, each one request, behind a trait so the manager can
/// be tested without an API server; [`KubeMirrorApi`] is the real one.
pub(crate) trait MirrorApi: Clone + Send + Sync + 'static {
    /// The node's own Node (its UID goes into the owner reference).
    fn get_node(&self, name: &str) -> impl Future<Output = Result<Node, Problem>> + Send;
    fn create_pod(&self, pod: &Pod) -> impl Future<Output = Result<Pod, Problem>> + Send;
    /// Deletes at once (grace 0), only if the pod still has `uid`.
    fn delete_pod(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> impl Future<Output = Result<(), Problem>> + Send;
}

/// [`MirrorApi`] on a kube client.
#[derive(Clone)]
pub(crate) struct KubeMirrorApi {
    client: kube::Client,
}

impl KubeMirrorApi {
    pub(crate) fn new(client: kube::Client) -> Self {
        KubeMirrorApi { client }
    }
}

impl MirrorApi for KubeMirrorApi {
    async fn get_node(&self, name: &str) -> Result<Node, Problem> {
        Ok(Api::<Node>::all(self.client.clone()).get(name).await?)
    }

    async fn create_pod(&self, pod: &Pod) -> Result<Pod, Problem> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        Ok(Api::<Pod>::namespaced(self.client.clone(), ns)
            .create(&params, pod)
            .await?)
    }

    async fn delete_pod(&self, namespace: &str, name: &str, uid: &str) -> Result<(), Problem> {
        let params = crate::clients::apiserver::delete_exactly_now(uid);
        Api::<Pod>::namespaced(self.client.clone(), namespace)
            .delete(name, &params)
            .await?;
        Ok(())
    }
}

/// The handle the pod workers and the status writer share: cheap to clone, never blocks on
/// anything but a short lock.
#[derive(Clone)]
pub(crate) struct MirrorPods {
    inner: Arc<Inner>,
}

struct Inner {
    /// The static pods the workers have, by UID.
    statics: Mutex<HashMap<String, StaticEntry>>,
    poke: Notify,
    view: ApiPodsView,
}

struct StaticEntry {
    pod: Arc<Pod>,
    stage: Stage,
}

impl MirrorPods {
    pub(crate) fn new(view: ApiPodsView) -> Self {
        MirrorPods {
            inner: Arc::new(Inner {
                statics: Mutex::new(HashMap::new()),
                poke: Notify::new(),
                view,
            }),
        }
    }

    fn statics(&self) -> std::sync::MutexGuard<'_, HashMap<String, StaticEntry>> {
        self.inner.statics.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A static pod was handed to a worker to run.
    pub(crate) fn desired(&self, pod: &Arc<Pod>) {
        self.note(pod, Stage::Pending);
    }

    /// A worker synced a static pod: it is admitted and being run, so it gets its mirror pod.
    pub(crate) fn synced(&self, pod: &Arc<Pod>) {
        self.note(pod, Stage::Running);
    }

    fn note(&self, pod: &Arc<Pod>, stage: Stage) {
        if !is_static(pod) {
            return;
        }
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let changed = {
            let mut statics = self.statics();
            match statics.get_mut(&uid) {
                None => {
                    statics.insert(
                        uid,
                        StaticEntry {
                            pod: pod.clone(),
                            stage,
                        },
                    );
                    true
                }
                // A late report about a pod being torn down changes nothing.
                Some(e) if e.stage == Stage::Terminating => false,
                Some(e) => {
                    e.pod = pod.clone();
                    let promoted = e.stage == Stage::Pending && stage == Stage::Running;
                    if promoted {
                        e.stage = Stage::Running;
                    }
                    promoted
                }
            }
        };
        if changed {
            self.inner.poke.notify_one();
        }
    }

    /// The pod with this UID is being torn down.
    pub(crate) fn terminating(&self, uid: &str) {
        if let Some(e) = self.statics().get_mut(uid) {
            e.stage = Stage::Terminating;
        }
    }

    /// The pod with this UID is torn down: if no other static pod has its name, its mirror pod
    /// is now an orphan.
    pub(crate) fn torn_down(&self, uid: &str) {
        if self.statics().remove(uid).is_some() {
            self.inner.poke.notify_one();
        }
    }

    /// The mirror pod a static pod's status is written onto: the one with its name that carries
    /// its hash and is not being deleted, as the API server last returned it. None while the
    /// static pod is not running or has no such mirror pod yet.
    pub(crate) fn target(&self, static_uid: &str) -> Option<Arc<Pod>> {
        let (name, hash) = {
            let statics = self.statics();
            let e = statics.get(static_uid)?;
            if e.stage != Stage::Running {
                return None;
            }
            (full_name(&e.pod), static_hash(&e.pod).to_string())
        };
        self.inner.view.mirrors().into_iter().find(|m| {
            full_name(m) == name
                && mirror_hash(m) == Some(hash.as_str())
                && m.metadata.deletion_timestamp.is_none()
        })
    }

    /// Keeps mirror pods in line until `cancel`.
    pub(crate) async fn run<A: MirrorApi>(
        self,
        api: A,
        node_name: String,
        sources_ready: SourcesReady,
        cancel: CancellationToken,
    ) {
        let mut changes = self.inner.view.subscribe();
        let mut memory = Memory::default();
        // The first round looks at once: the view may have been listed already.
        let mut wake: Option<Instant> = Some(clock::instant());
        loop {
            let timer = async {
                match wake {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = self.inner.poke.notified() => {}
                Ok(()) = changes.changed() => {}
                _ = timer => {}
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                next = self.round(&api, &node_name, &sources_ready, &mut memory) => wake = next,
            }
        }
    }

    /// One comparison of static pods with mirror pods, and the requests it calls for. Returns
    /// when to look again without being told (a retry, an orphan waiting for the grace).
    async fn round<A: MirrorApi>(
        &self,
        api: &A,
        node_name: &str,
        sources_ready: &SourcesReady,
        memory: &mut Memory,
    ) -> Option<Instant> {
        let view = &self.inner.view;
        if !view.listed() {
            // Which mirror pods exist is not known yet; the first list changes the view.
            return None;
        }
        let now = clock::instant();
        if sources_ready.all_ready() && memory.ready_since.is_none() {
            memory.ready_since = Some(now);
        }
        let orphans_allowed = memory
            .ready_since
            .is_some_and(|since| now >= since + ORPHAN_GRACE);
        let mirrors = view.mirrors();
        memory.forget_what_the_view_caught_up_with(&mirrors, now);

        let mut names: BTreeMap<String, Name> = BTreeMap::new();
        for (uid, e) in self.statics().iter() {
            names.entry(full_name(&e.pod)).or_default().statics.push((
                uid.clone(),
                e.pod.clone(),
                e.stage,
            ));
        }
        for m in &mirrors {
            let uid = m.metadata.uid.clone().unwrap_or_default();
            if memory.deleted.contains(&uid) {
                continue;
            }
            names.entry(full_name(m)).or_default().mirror = Some(MirrorEntry {
                uid,
                hash: mirror_hash(m).map(str::to_string),
                deleting: m.metadata.deletion_timestamp.is_some(),
                namespace: m.metadata.namespace.clone().unwrap_or_default(),
                name: m.metadata.name.clone().unwrap_or_default(),
            });
        }
        for (name, (created, _)) in &memory.created {
            let entry = names.entry(name.clone()).or_default();
            if entry.mirror.is_none() {
                entry.mirror = Some(created.clone());
            }
        }

        let mut wake = None;
        let (mut failed, mut worked) = (false, false);
        for (name, entry) in names {
            let statics: Vec<StaticView<'_>> = entry
                .statics
                .iter()
                .map(|(_, p, stage)| StaticView {
                    hash: static_hash(p),
                    stage: *stage,
                })
                .collect();
            let mirror = entry.mirror.as_ref().map(|m| MirrorView {
                hash: m.hash.as_deref(),
                deleting: m.deleting,
            });
            let decision = decide(&statics, mirror, orphans_allowed);
            if decision != Decision::Nothing {
                tracing::debug!(pod = %name, ?statics, ?mirror, ?decision, "mirror pod decision");
            }
            if decision == Decision::Nothing {
                if entry.statics.is_empty() && entry.mirror.is_some() {
                    // An orphan waiting for the grace after the sources, or for the sources
                    // (nothing tells this task when they are ready: look again soon).
                    let at = match memory.ready_since {
                        Some(since) => since + ORPHAN_GRACE,
                        None => now + READY_POLL,
                    };
                    wake = earliest(wake, at);
                }
                continue;
            }
            if let Some(hold) = memory.holds.get(&name)
                && hold.until > now
            {
                wake = earliest(wake, hold.until);
                continue;
            }
            let running = entry
                .statics
                .iter()
                .find(|(_, _, stage)| *stage == Stage::Running);
            let result = match (decision, running, entry.mirror.as_ref()) {
                (Decision::Create, Some((uid, pod, _)), _) => {
                    self.create(api, node_name, &name, uid, pod, memory).await
                }
                (Decision::Replace, Some((uid, pod, _)), Some(old)) => {
                    match self.delete(api, &name, old, memory, "replacing").await {
                        Ok(true) => self.create(api, node_name, &name, uid, pod, memory).await,
                        Ok(false) => Ok(()),
                        Err(p) => Err(p),
                    }
                }
                (Decision::DeleteOrphan, _, Some(old)) => self
                    .delete(api, &name, old, memory, "orphaned")
                    .await
                    .map(|_| ()),
                _ => Ok(()),
            };
            match result {
                Ok(()) => {
                    worked = true;
                    memory.holds.remove(&name);
                }
                Err(p) => {
                    failed = true;
                    // One line per distinct problem (an outage is one), whichever pod met it;
                    // the API server's own messages name the pod.
                    memory
                        .problems
                        .failed("creating or deleting mirror pods", &p);
                    let hold = memory.holds.entry(name).or_insert_with(|| Hold {
                        until: now,
                        backoff: Backoff::new(FIRST_RETRY),
                    });
                    hold.until = clock::instant() + hold.backoff.next_wait();
                    wake = earliest(wake, hold.until);
                    if p.is(ProblemKind::Unreachable) {
                        // Every other request would fail the same way; try again later.
                        break;
                    }
                }
            }
        }
        // A round that made no request says nothing of the API server.
        if worked && !failed {
            memory
                .problems
                .succeeded("creating or deleting mirror pods");
        }
        wake
    }

    /// Creates the mirror pod of `pod` (static UID `uid`).
    async fn create<A: MirrorApi>(
        &self,
        api: &A,
        node_name: &str,
        name: &str,
        uid: &str,
        pod: &Pod,
        memory: &mut Memory,
    ) -> Result<(), Problem> {
        let node_uid = match &memory.node_uid {
            Some(u) => u.clone(),
            None => {
                let node = api.get_node(node_name).await?;
                if node.metadata.deletion_timestamp.is_some() {
                    // Upstream: no mirror pods for a node that is leaving the cluster.
                    return Err(Problem {
                        kind: ProblemKind::Refused,
                        message: format!(
                            "the Node {node_name} is being deleted; mirror pods are not created"
                        ),
                    });
                }
                let node_uid = node.metadata.uid.unwrap_or_default();
                memory.node_uid = Some(node_uid.clone());
                node_uid
            }
        };
        let mirror = mirror_pod(pod, node_name, &node_uid);
        match api.create_pod(&mirror).await {
            Ok(created) => {
                let mirror_uid = created.metadata.uid.clone().unwrap_or_default();
                tracing::info!(pod = %name, pod_uid = %uid, mirror_uid = %mirror_uid, "created the mirror pod");
                let entry = MirrorEntry {
                    uid: mirror_uid,
                    hash: mirror_hash(&mirror).map(str::to_string),
                    deleting: false,
                    namespace: mirror.metadata.namespace.clone().unwrap_or_default(),
                    name: mirror.metadata.name.clone().unwrap_or_default(),
                };
                memory
                    .created
                    .insert(name.to_string(), (entry, clock::instant()));
                Ok(())
            }
            Err(p) => {
                if p.is(ProblemKind::Forbidden) {
                    // NodeRestriction refuses an owner reference with a stale Node UID (the
                    // Node was deleted and registered again): read it anew next time.
                    memory.node_uid = None;
                }
                tracing::debug!(pod = %name, problem = %p.message, "creating the mirror pod failed");
                Err(p)
            }
        }
    }

    /// Deletes a mirror pod (grace 0, its UID as precondition). Ok(true) when it is gone, Ok(false)
    /// when another pod holds the name by now (the next round decides again).
    async fn delete<A: MirrorApi>(
        &self,
        api: &A,
        name: &str,
        old: &MirrorEntry,
        memory: &mut Memory,
        why: &str,
    ) -> Result<bool, Problem> {
        let result = api.delete_pod(&old.namespace, &old.name, &old.uid).await;
        memory.created.remove(name);
        match result {
            Ok(()) => {
                tracing::info!(pod = %name, mirror_uid = %old.uid, "deleted the {why} mirror pod");
                memory.deleted.insert(old.uid.clone());
                Ok(true)
            }
            Err(p) if p.is(ProblemKind::NotFound) => {
                memory.deleted.insert(old.uid.clone());
                Ok(true)
            }
            // The UID precondition failed: the name belongs to another pod now.
            Err(p) if p.is(ProblemKind::Conflict) => {
                memory.deleted.insert(old.uid.clone());
                Ok(false)
            }
            Err(p) => {
                tracing::debug!(pod = %name, problem = %p.message, "deleting the {why} mirror pod failed");
                Err(p)
            }
        }
    }
}

fn earliest(a: Option<Instant>, b: Instant) -> Option<Instant> {
    Some(a.map_or(b, |a| a.min(b)))
}

/// One pod name's static pods and mirror pod, for a round.
#[derive(Default)]
struct Name {
    /// (UID, pod, stage)
    statics: Vec<(String, Arc<Pod>, Stage)>,
    mirror: Option<MirrorEntry>,
}

#[derive(Clone, Debug)]
struct MirrorEntry {
    uid: String,
    hash: Option<String>,
    deleting: bool,
    namespace: String,
    name: String,
}

/// A name whose last request failed, and when to try it again.
struct Hold {
    until: Instant,
    backoff: Backoff,
}

/// What the manager remembers between rounds.
#[derive(Default)]
struct Memory {
    node_uid: Option<String>,
    /// When every source had delivered its pods, first seen.
    ready_since: Option<Instant>,
    /// Mirror pods created and not yet seen through the watch, by name, with when.
    created: HashMap<String, (MirrorEntry, Instant)>,
    /// UIDs of mirror pods deleted that the watch still shows.
    deleted: HashSet<String>,
    holds: HashMap<String, Hold>,
    problems: ProblemLog,
}

impl Memory {
    fn forget_what_the_view_caught_up_with(&mut self, mirrors: &[Arc<Pod>], now: Instant) {
        let present: HashSet<&str> = mirrors
            .iter()
            .filter_map(|m| m.metadata.uid.as_deref())
            .collect();
        self.deleted.retain(|uid| present.contains(uid.as_str()));
        self.created
            .retain(|_, (c, at)| !present.contains(c.uid.as_str()) && now < *at + CREATED_MEMORY);
    }
}

#[cfg(test)]
mod tests;
