//! The requests the object cache and the token manager make, behind [`ObjectApi`] so the
//! cache's handling of a watch's events and the token refresh can be unit-tested;
//! [`KubeObjectApi`] is the real one, on kube's watcher. The trait returns boxed futures and
//! streams so one cache can hold it as a trait object (the executor is not made generic over
//! it).

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt, TryStreamExt};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolume, PersistentVolumeClaim, Secret, ServiceAccount,
};
use kube::api::{Api, PostParams};

use super::{Kind, ObjectKey};
use crate::clients::apiserver::Problem;
use crate::clients::apiserver::watch::{self as api_watch, Event, Events};

/// A configMap or a secret, shared (the cache hands out the same copy to every pod).
#[derive(Debug, Clone)]
pub(crate) enum ApiObject {
    ConfigMap(Arc<ConfigMap>),
    Secret(Arc<Secret>),
}

impl ApiObject {
    pub(crate) fn resource_version(&self) -> Option<&str> {
        match self {
            ApiObject::ConfigMap(o) => o.metadata.resource_version.as_deref(),
            ApiObject::Secret(o) => o.metadata.resource_version.as_deref(),
        }
    }

    /// `immutable: true`: the object never changes, so it is not watched once read.
    pub(crate) fn immutable(&self) -> bool {
        match self {
            ApiObject::ConfigMap(o) => o.immutable == Some(true),
            ApiObject::Secret(o) => o.immutable == Some(true),
        }
    }
}

/// Watch one object by name, and create a service-account token.
pub(crate) trait ObjectApi: Send + Sync + 'static {
    /// The watcher's events for `key` (`fieldSelector=metadata.name=<name>` in its namespace):
    /// a list (`Init`, the object if there is one, `InitDone`), then its changes; failures
    /// are items of the stream, which the watcher retries when polled again.
    fn watch(&self, key: &ObjectKey) -> Events<ApiObject>;
    /// `POST serviceaccounts/<name>/token` in `namespace`.
    fn create_token(
        &self,
        namespace: &str,
        service_account: &str,
        request: TokenRequest,
    ) -> BoxFuture<'static, Result<TokenRequest, Problem>>;
    /// `GET persistentvolumeclaims/<name>` in `namespace`: the Node authorizer lets a node
    /// get (not list or watch) the claims of its pods, so claims are read, not watched.
    fn get_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> BoxFuture<'static, Result<PersistentVolumeClaim, Problem>>;
    /// `GET persistentvolumes/<name>` (the volume bound to a claim of one of the node's pods).
    fn get_volume(&self, name: &str) -> BoxFuture<'static, Result<PersistentVolume, Problem>>;
    /// A merge patch of `persistentvolumeclaims/<name>/status` in `namespace`: the node's
    /// part of a volume expansion (the Node authorizer and NodeRestriction let a node write
    /// the status of its pods' claims, and only the capacity, conditions and resize state).
    fn patch_claim_status(
        &self,
        namespace: &str,
        name: &str,
        patch: serde_json::Value,
    ) -> BoxFuture<'static, Result<PersistentVolumeClaim, Problem>>;
}

/// [`ObjectApi`] on kube clients: kube's watcher on the client made for watching (its read
/// time-out outlasts a watch request), token requests on the one for plain requests (a
/// hung API server must not hold a pod's sync for minutes).
#[derive(Clone)]
pub(crate) struct KubeObjectApi {
    watch: kube::Client,
    requests: kube::Client,
}

impl KubeObjectApi {
    pub(crate) fn new(watch: kube::Client, requests: kube::Client) -> Self {
        KubeObjectApi { watch, requests }
    }
}

fn selector(key: &ObjectKey) -> String {
    format!("metadata.name={}", key.name)
}

/// kube's watcher of one object of type `T`, its events carrying [`ApiObject`]s.
fn watch_one<T>(api: Api<T>, key: &ObjectKey, wrap: fn(T) -> ApiObject) -> Events<ApiObject>
where
    T: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let config = api_watch::Config::default().fields(&selector(key));
    api_watch::events(api, config)
        .map_ok(move |e| map_event(e, wrap))
        .boxed()
}

fn map_event<T>(event: Event<T>, wrap: fn(T) -> ApiObject) -> Event<ApiObject> {
    match event {
        Event::Apply(o) => Event::Apply(wrap(o)),
        Event::Delete(o) => Event::Delete(wrap(o)),
        Event::Init => Event::Init,
        Event::InitApply(o) => Event::InitApply(wrap(o)),
        Event::InitDone => Event::InitDone,
    }
}

fn wrap_cm(o: ConfigMap) -> ApiObject {
    ApiObject::ConfigMap(Arc::new(o))
}

fn wrap_secret(o: Secret) -> ApiObject {
    ApiObject::Secret(Arc::new(o))
}

impl ObjectApi for KubeObjectApi {
    fn watch(&self, key: &ObjectKey) -> Events<ApiObject> {
        let client = self.watch.clone();
        match key.kind {
            Kind::ConfigMap => watch_one(Api::namespaced(client, &key.namespace), key, wrap_cm),
            Kind::Secret => watch_one(Api::namespaced(client, &key.namespace), key, wrap_secret),
        }
    }

    fn create_token(
        &self,
        namespace: &str,
        service_account: &str,
        request: TokenRequest,
    ) -> BoxFuture<'static, Result<TokenRequest, Problem>> {
        let api: Api<ServiceAccount> = Api::namespaced(self.requests.clone(), namespace);
        let name = service_account.to_string();
        async move {
            Ok(api
                .create_token_request(&name, &PostParams::default(), &request)
                .await?)
        }
        .boxed()
    }

    fn get_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> BoxFuture<'static, Result<PersistentVolumeClaim, Problem>> {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.requests.clone(), namespace);
        let name = name.to_string();
        async move { Ok(api.get(&name).await?) }.boxed()
    }

    fn get_volume(&self, name: &str) -> BoxFuture<'static, Result<PersistentVolume, Problem>> {
        let api: Api<PersistentVolume> = Api::all(self.requests.clone());
        let name = name.to_string();
        async move { Ok(api.get(&name).await?) }.boxed()
    }

    fn patch_claim_status(
        &self,
        namespace: &str,
        name: &str,
        patch: serde_json::Value,
    ) -> BoxFuture<'static, Result<PersistentVolumeClaim, Problem>> {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.requests.clone(), namespace);
        let name = name.to_string();
        async move {
            let params = kube::api::PatchParams::default();
            Ok(api
                .patch_status(&name, &params, &kube::api::Patch::Merge(&patch))
                .await?)
        }
        .boxed()
    }
}
