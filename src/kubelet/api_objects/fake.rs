//! An in-memory [`ObjectApi`] for unit tests: its watches give events as kube's watcher does
//! (a list: `Init`, the object, `InitDone`; then the changes); objects put and deleted by the
//! test reach the open watches at once; lists and token requests are counted and can be made
//! to fail.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestStatus};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::sync::mpsc;

use super::api::{ApiObject, ObjectApi};
use super::{Kind, ObjectKey};
use crate::base::clock;
use crate::clients::apiserver::watch::{Event, Events};
use crate::clients::apiserver::{Problem, ProblemKind};

#[derive(Default)]
struct State {
    objects: BTreeMap<ObjectKey, ApiObject>,
    version: u64,
    watchers: Vec<(ObjectKey, mpsc::UnboundedSender<Event<ApiObject>>)>,
    lists: usize,
    fail: Option<Problem>,
    tokens: Vec<TokenRequest>,
    /// The lifetime the fake API server grants, when it overrides what was asked.
    granted_seconds: Option<i64>,
    /// When tokens expire, in seconds from now, when not their lifetime.
    expires_in: Option<i64>,
}

#[derive(Clone, Default)]
pub struct FakeObjectApi {
    state: Arc<Mutex<State>>,
}

impl FakeObjectApi {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap()
    }

    fn put(&self, key: ObjectKey, object: impl FnOnce(String) -> ApiObject) {
        let mut s = self.state();
        s.version += 1;
        let object = object(s.version.to_string());
        s.objects.insert(key.clone(), object.clone());
        s.watchers
            .retain(|(k, tx)| k != &key || tx.send(Event::Apply(object.clone())).is_ok());
    }

    pub fn put_config_map(&self, namespace: &str, name: &str, data: &[(&str, &str)]) {
        self.put_config_map_with(namespace, name, data, false);
    }

    pub fn put_config_map_with(
        &self,
        namespace: &str,
        name: &str,
        data: &[(&str, &str)],
        immutable: bool,
    ) {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.metadata.namespace = Some(namespace.into());
        cm.data = Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        cm.immutable = immutable.then_some(true);
        self.put(ObjectKey::new(Kind::ConfigMap, namespace, name), |v| {
            cm.metadata.resource_version = Some(v);
            ApiObject::ConfigMap(Arc::new(cm))
        });
    }

    /// A secret of a type (`kubernetes.io/dockerconfigjson`, …).
    pub fn put_secret_typed(
        &self,
        namespace: &str,
        name: &str,
        kind: Option<&str>,
        data: &[(&str, &[u8])],
    ) {
        let mut s = Secret {
            type_: kind.map(str::to_string),
            ..Default::default()
        };
        s.metadata.name = Some(name.into());
        s.metadata.namespace = Some(namespace.into());
        s.data = Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), k8s_openapi::ByteString(v.to_vec())))
                .collect(),
        );
        self.put(ObjectKey::new(Kind::Secret, namespace, name), |v| {
            s.metadata.resource_version = Some(v);
            ApiObject::Secret(Arc::new(s))
        });
    }

    pub fn delete(&self, key: &ObjectKey) {
        let mut s = self.state();
        s.version += 1;
        if let Some(object) = s.objects.remove(key) {
            s.watchers
                .retain(|(k, tx)| k != key || tx.send(Event::Delete(object.clone())).is_ok());
        }
    }

    /// Every later list and token request fails with this (or works again with None).
    pub fn fail_with(&self, problem: Option<Problem>) {
        self.state().fail = problem;
    }

    pub fn expire_in(&self, seconds: Option<i64>) {
        self.state().expires_in = seconds;
    }

    pub fn lists(&self) -> usize {
        self.state().lists
    }

    /// Watches whose stream is still held by someone.
    pub fn open_watches(&self) -> Vec<ObjectKey> {
        let mut s = self.state();
        s.watchers.retain(|(_, tx)| !tx.is_closed());
        s.watchers.iter().map(|(k, _)| k.clone()).collect()
    }

    pub fn token_requests(&self) -> Vec<TokenRequest> {
        self.state().tokens.clone()
    }
}

pub fn forbidden() -> Problem {
    Problem {
        kind: ProblemKind::Forbidden,
        message: "the API server forbids it (403 Forbidden): no relationship found".into(),
    }
}

/// Where one fake watch is: listing (again after a failure), or watching.
enum Phase {
    List,
    Watching(mpsc::UnboundedReceiver<Event<ApiObject>>),
}

impl FakeObjectApi {
    /// A list: its events, and the watch from then on. Under one lock, so no change is missed
    /// between the two.
    fn list(&self, key: &ObjectKey) -> Result<(Vec<Event<ApiObject>>, Phase), Problem> {
        let mut s = self.state();
        s.lists += 1;
        if let Some(p) = &s.fail {
            return Err(p.clone());
        }
        let mut events = vec![Event::Init];
        events.extend(s.objects.get(key).cloned().map(Event::InitApply));
        events.push(Event::InitDone);
        let (tx, rx) = mpsc::unbounded_channel();
        s.watchers.push((key.clone(), tx));
        Ok((events, Phase::Watching(rx)))
    }
}

impl ObjectApi for FakeObjectApi {
    fn watch(&self, key: &ObjectKey) -> Events<ApiObject> {
        let start = (self.clone(), key.clone(), Phase::List, VecDeque::new());
        futures::stream::unfold(start, |(api, key, phase, mut queue)| async move {
            if let Some(event) = queue.pop_front() {
                return Some((Ok(event), (api, key, phase, queue)));
            }
            match phase {
                Phase::List => match api.list(&key) {
                    Ok((events, phase)) => {
                        queue.extend(events);
                        let first = queue.pop_front().map(Ok);
                        first.map(|e| (e, (api, key, phase, queue)))
                    }
                    Err(p) => Some((Err(p), (api, key, Phase::List, queue))),
                },
                Phase::Watching(mut rx) => {
                    let event = rx.recv().await?;
                    Some((Ok(event), (api, key, Phase::Watching(rx), queue)))
                }
            }
        })
        .boxed()
    }

    fn create_token(
        &self,
        _namespace: &str,
        _service_account: &str,
        mut request: TokenRequest,
    ) -> BoxFuture<'static, Result<TokenRequest, Problem>> {
        let mut s = self.state();
        if let Some(p) = &s.fail {
            return futures::future::ready(Err(p.clone())).boxed();
        }
        let n = s.tokens.len() + 1;
        s.tokens.push(request.clone());
        if let Some(granted) = s.granted_seconds {
            request.spec.expiration_seconds = Some(granted);
        }
        let seconds = s
            .expires_in
            .unwrap_or(request.spec.expiration_seconds.unwrap_or(3600));
        let expires = clock::timestamp() + jiff::SignedDuration::from_secs(seconds);
        request.status = Some(TokenRequestStatus {
            token: format!("token-{n}"),
            expiration_timestamp: Time(expires),
        });
        futures::future::ready(Ok(request)).boxed()
    }
}
