//! The watch-based object cache: one watcher (kube's: list, then watch) per referenced
//! object, counted by pod.
//!
//! Upstream's manager waits up to a second for an object's first list before it answers
//! "failed to sync … cache"; so does [`ObjectCache::get`]. After that it answers from memory.
//! A watch keeps serving what it last saw while its requests fail, retrying with back-off (each
//! problem reported once); the watcher lists again after a 410 Gone. Each change (and the
//! first list) pokes the pods that refer to the object, so their workers sync and rewrite the
//! files, or retry a start that waited.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::api::{ApiObject, ObjectApi};
use super::{ObjectError, ObjectKey, refs};
use crate::base::resync_queue::Pokes;
use crate::clients::apiserver::watch::{Event, Watch};
use crate::clients::apiserver::{Problem, ProblemKind, ProblemLog};

/// How long a read waits for an object's first list (upstream's one second).
pub(crate) const SYNC_WAIT: Duration = Duration::from_secs(1);

/// The wait before the first retry of a failed list or watch (then doubling to 7 s).
const FIRST_RETRY: Duration = Duration::from_millis(200);

/// What the watch of one object has seen.
#[derive(Debug, Clone)]
enum Seen {
    /// Not listed yet; the last failure, if any.
    Syncing { problem: Option<String> },
    /// Listed: the object, or `None` when there is none.
    Synced(Option<ApiObject>),
}

struct Item {
    /// The UIDs of the pods that refer to the object.
    pods: BTreeSet<String>,
    seen: watch::Sender<Seen>,
    stop: CancellationToken,
}

#[derive(Default)]
struct State {
    items: HashMap<ObjectKey, Item>,
    /// What each registered pod refers to.
    pods: HashMap<String, BTreeSet<ObjectKey>>,
}

struct Inner {
    api: Arc<dyn ObjectApi>,
    pokes: Pokes,
    cancel: CancellationToken,
    state: Mutex<State>,
    sync_wait: Duration,
}

/// The cache; cheap to clone, all clones share it. Nothing is held locked across an await.
#[derive(Clone)]
pub(crate) struct ObjectCache {
    inner: Arc<Inner>,
}

impl ObjectCache {
    pub(crate) fn new(api: Arc<dyn ObjectApi>, pokes: Pokes, cancel: CancellationToken) -> Self {
        ObjectCache {
            inner: Arc::new(Inner {
                api,
                pokes,
                cancel,
                state: Mutex::new(State::default()),
                sync_wait: SYNC_WAIT,
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records what the pod refers to now: watches start for new objects, and end for objects
    /// no other pod refers to. Returns the pod's references. Must run inside a tokio runtime.
    pub(crate) fn register_pod(&self, pod: &Pod) -> BTreeSet<ObjectKey> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let keys = refs::referenced(pod);
        let mut state = self.state();
        let old = state.pods.get(&uid).cloned().unwrap_or_default();
        if old == keys {
            return keys;
        }
        for key in keys.difference(&old) {
            let item = match state.items.get_mut(key) {
                Some(item) => item,
                None => {
                    let item = self.start_watch(key);
                    state.items.entry(key.clone()).or_insert(item)
                }
            };
            item.pods.insert(uid.clone());
        }
        for key in old.difference(&keys) {
            drop_ref(&mut state, key, &uid);
        }
        if keys.is_empty() {
            state.pods.remove(&uid);
        } else {
            state.pods.insert(uid, keys.clone());
        }
        keys
    }

    /// The pod is gone: its references are dropped.
    pub(crate) fn unregister_pod(&self, uid: &str) {
        let mut state = self.state();
        let Some(keys) = state.pods.remove(uid) else {
            return;
        };
        for key in &keys {
            drop_ref(&mut state, key, uid);
        }
    }

    /// The objects watched now (or, for immutable ones, kept), for tests and logs.
    #[cfg(test)]
    pub(crate) fn watched(&self) -> Vec<ObjectKey> {
        let mut keys: Vec<ObjectKey> = self.state().items.keys().cloned().collect();
        keys.sort();
        keys
    }

    /// The object as last seen, waiting up to a second for its first list. The object must be
    /// referenced by a registered pod.
    pub(crate) async fn get(&self, key: &ObjectKey) -> Result<ApiObject, ObjectError> {
        let not_registered = || ObjectError::NotRegistered {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
        };
        let mut rx = {
            let state = self.state();
            state
                .items
                .get(key)
                .map(|i| i.seen.subscribe())
                .ok_or_else(not_registered)?
        };
        let waited = tokio::time::timeout(
            self.inner.sync_wait,
            rx.wait_for(|s| matches!(s, Seen::Synced(_))),
        )
        .await
        .map(|r| r.map(|seen| seen.clone()));
        let seen = match waited {
            Ok(Ok(seen)) => seen,
            Ok(Err(_)) => return Err(not_registered()),
            Err(_) => rx.borrow().clone(),
        };
        match seen {
            Seen::Synced(Some(object)) => Ok(object),
            Seen::Synced(None) => Err(ObjectError::NotFound {
                kind: key.kind,
                name: key.name.clone(),
            }),
            Seen::Syncing { problem } => Err(ObjectError::NotSynced {
                kind: key.kind,
                last: problem,
            }),
        }
    }

    fn start_watch(&self, key: &ObjectKey) -> Item {
        let (seen, _) = watch::channel(Seen::Syncing { problem: None });
        let stop = self.inner.cancel.child_token();
        let task = Watcher {
            cache: self.clone(),
            key: key.clone(),
            seen: seen.clone(),
            stop: stop.clone(),
            problems: ProblemLog::default(),
        };
        tracing::debug!(object = %key, "watching");
        tokio::spawn(task.run());
        Item {
            pods: BTreeSet::new(),
            seen,
            stop,
        }
    }

    /// Pokes every pod that refers to `key`.
    fn poke_pods(&self, key: &ObjectKey) {
        let uids: Vec<String> = self
            .state()
            .items
            .get(key)
            .map(|i| i.pods.iter().cloned().collect())
            .unwrap_or_default();
        for uid in uids {
            self.inner.pokes.poke(&uid);
        }
    }
}

fn drop_ref(state: &mut State, key: &ObjectKey, uid: &str) {
    let Some(item) = state.items.get_mut(key) else {
        return;
    };
    item.pods.remove(uid);
    if item.pods.is_empty() {
        item.stop.cancel();
        state.items.remove(key);
        tracing::debug!(object = %key, "no pod refers to the object any more; watch stopped");
    }
}

/// The task that watches one object until no pod refers to it.
struct Watcher {
    cache: ObjectCache,
    key: ObjectKey,
    seen: watch::Sender<Seen>,
    stop: CancellationToken,
    problems: ProblemLog,
}

/// Where the watch of one object is in the watcher's events: within a list (`Init` …
/// `InitDone`), the object listed so far.
#[derive(Debug, Default)]
struct Listing(Option<Option<ApiObject>>);

impl Listing {
    /// What the API server says the object is after `event` (`Some(None)`: there is none), or
    /// None while a list is under way.
    fn step(&mut self, event: Event<ApiObject>) -> Option<Option<ApiObject>> {
        match event {
            Event::Init => {
                self.0 = Some(None);
                None
            }
            Event::InitApply(object) => {
                self.0 = Some(Some(object));
                None
            }
            Event::InitDone => Some(self.0.take().flatten()),
            Event::Apply(object) => Some(Some(object)),
            Event::Delete(_) => Some(None),
        }
    }
}

impl Watcher {
    async fn run(self) {
        let mut watch = Watch::new(
            self.cache.inner.api.watch(&self.key),
            FIRST_RETRY,
            self.doing(),
            self.problems.clone(),
        );
        let mut listing = Listing::default();
        while let Some(next) = watch.next(&self.stop).await {
            let object = match next {
                Ok(event) => listing.step(event),
                Err(problem) => {
                    self.failed(&problem);
                    None
                }
            };
            let Some(object) = object else { continue };
            let immutable = object.as_ref().is_some_and(ApiObject::immutable);
            self.set(object);
            if immutable {
                tracing::debug!(object = %self.key, "immutable: no longer watched");
                return;
            }
        }
    }

    fn doing(&self) -> String {
        format!("watching {}", self.key)
    }

    /// Keeps the problem (already reported by the watch) to tell a read that waits for the
    /// first list; a 410 Gone is none (the watcher lists again).
    fn failed(&self, problem: &Problem) {
        if problem.is(ProblemKind::Expired) {
            return;
        }
        self.seen.send_if_modified(|seen| match seen {
            Seen::Syncing { problem: last } => {
                *last = Some(problem.message.clone());
                false
            }
            Seen::Synced(_) => false,
        });
    }

    /// Records what the API server says the object is now, and pokes the pods that refer to
    /// it when that differs from what was seen before (the first list always does).
    fn set(&self, object: Option<ApiObject>) {
        let version = |o: &Option<ApiObject>| {
            o.as_ref()
                .map(|o| o.resource_version().unwrap_or("").to_string())
        };
        let changed = self.seen.send_if_modified(|seen| {
            let differs = match seen {
                Seen::Syncing { .. } => true,
                Seen::Synced(old) => version(old) != version(&object),
            };
            if differs {
                *seen = Seen::Synced(object.clone());
            }
            differs
        });
        if changed {
            tracing::debug!(object = %self.key, present = object.is_some(), "object changed");
            self.cache.poke_pods(&self.key);
        }
    }
}

#[cfg(test)]
mod tests;
