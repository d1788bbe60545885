//! An in-memory [`ObjectApi`] for unit tests: objects put and deleted by the test reach the
//! open watches at once; lists, watches and token requests are counted and can be made to
//! fail.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestStatus};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::sync::mpsc;

use super::api::{ApiObject, Change, Changes, Listed, ObjectApi};
use super::{Kind, ObjectKey};
use crate::clients::apiserver::{Problem, ProblemKind};

#[derive(Default)]
struct State {
    objects: BTreeMap<ObjectKey, ApiObject>,
    version: u64,
    watchers: Vec<(ObjectKey, mpsc::UnboundedSender<Result<Change, Problem>>)>,
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
            .retain(|(k, tx)| k != &key || tx.send(Ok(Change::Put(object.clone()))).is_ok());
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

    pub fn put_secret(&self, namespace: &str, name: &str, data: &[(&str, &[u8])]) {
        self.put_secret_typed(namespace, name, None, data);
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
                .retain(|(k, tx)| k != key || tx.send(Ok(Change::Deleted(object.clone()))).is_ok());
        }
    }

    /// Every later list, watch and token request fails with this (or works again with None).
    pub fn fail_with(&self, problem: Option<Problem>) {
        self.state().fail = problem;
    }

    pub fn grant_seconds(&self, seconds: Option<i64>) {
        self.state().granted_seconds = seconds;
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

impl ObjectApi for FakeObjectApi {
    fn list(&self, key: &ObjectKey) -> BoxFuture<'static, Result<Listed, Problem>> {
        let mut s = self.state();
        s.lists += 1;
        let result = match &s.fail {
            Some(p) => Err(p.clone()),
            None => Ok(Listed {
                object: s.objects.get(key).cloned(),
                version: s.version.to_string(),
            }),
        };
        futures::future::ready(result).boxed()
    }

    fn watch(
        &self,
        key: &ObjectKey,
        _version: &str,
    ) -> BoxFuture<'static, Result<Changes, Problem>> {
        let mut s = self.state();
        if let Some(p) = &s.fail {
            return futures::future::ready(Err(p.clone())).boxed();
        }
        let (tx, rx) = mpsc::unbounded_channel();
        s.watchers.push((key.clone(), tx));
        let stream: Changes = tokio_stream::wrappers::UnboundedReceiverStream::new(rx).boxed();
        futures::future::ready(Ok(stream)).boxed()
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
        let expires = jiff::Timestamp::now() + jiff::SignedDuration::from_secs(seconds);
        request.status = Some(TokenRequestStatus {
            token: format!("token-{n}"),
            expiration_timestamp: Time(expires),
        });
        futures::future::ready(Ok(request)).boxed()
    }
}
