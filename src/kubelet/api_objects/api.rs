//! The requests the object cache and the token manager make, behind [`ObjectApi`] so the
//! cache's watch logic and the token refresh can be unit-tested; [`KubeObjectApi`] is the
//! real one. The trait returns boxed futures and streams so one cache can hold it as a trait
//! object (the executor is not made generic over it).

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt, TryStreamExt};
use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};

use super::{Kind, ObjectKey};
use crate::clients::apiserver::Problem;

/// How long one watch request lasts before the API server ends it (and the next starts).
const WATCH_SECONDS: u32 = 290;

/// A configMap or a secret, shared (the cache hands out the same copy to every pod).
#[derive(Debug, Clone)]
pub enum ApiObject {
    ConfigMap(Arc<ConfigMap>),
    Secret(Arc<Secret>),
}

impl ApiObject {
    pub fn resource_version(&self) -> Option<&str> {
        match self {
            ApiObject::ConfigMap(o) => o.metadata.resource_version.as_deref(),
            ApiObject::Secret(o) => o.metadata.resource_version.as_deref(),
        }
    }

    /// `immutable: true`: the object never changes, so it is not watched once read.
    pub fn immutable(&self) -> bool {
        match self {
            ApiObject::ConfigMap(o) => o.immutable == Some(true),
            ApiObject::Secret(o) => o.immutable == Some(true),
        }
    }
}

/// The answer to a list of one object by name.
#[derive(Debug, Clone)]
pub struct Listed {
    /// `None`: there is no such object (yet).
    pub object: Option<ApiObject>,
    /// The list's resourceVersion, where the watch starts.
    pub version: String,
}

/// One event of a watch on one object.
#[derive(Debug, Clone)]
pub enum Change {
    /// Created or changed.
    Put(ApiObject),
    Deleted(ApiObject),
    /// Nothing changed; the watch may resume from this version.
    Bookmark(String),
    /// The version fell out of the API server's window (410 Gone): list again.
    Expired,
}

/// A stream of one watch request's events; it ends when the API server ends the request.
pub type Changes = BoxStream<'static, Result<Change, Problem>>;

/// List and watch one object by name, and create a service-account token.
pub trait ObjectApi: Send + Sync + 'static {
    fn list(&self, key: &ObjectKey) -> BoxFuture<'static, Result<Listed, Problem>>;
    fn watch(&self, key: &ObjectKey, version: &str)
    -> BoxFuture<'static, Result<Changes, Problem>>;
    /// `POST serviceaccounts/<name>/token` in `namespace`.
    fn create_token(
        &self,
        namespace: &str,
        service_account: &str,
        request: TokenRequest,
    ) -> BoxFuture<'static, Result<TokenRequest, Problem>>;
}

/// [`ObjectApi`] on kube clients: lists and watches on the client made for watching (its
/// read time-out outlasts a watch request), token requests on the one for plain requests (a
/// hung API server must not hold a pod's sync for minutes).
#[derive(Clone)]
pub struct KubeObjectApi {
    watch: kube::Client,
    requests: kube::Client,
}

impl KubeObjectApi {
    pub fn new(watch: kube::Client, requests: kube::Client) -> Self {
        KubeObjectApi { watch, requests }
    }
}

fn selector(key: &ObjectKey) -> String {
    format!("metadata.name={}", key.name)
}

/// A watch request's 410 Gone, which arrives as an event of the stream.
fn watch_event<T>(event: WatchEvent<T>, wrap: fn(T) -> ApiObject) -> Result<Change, Problem> {
    match event {
        WatchEvent::Added(o) | WatchEvent::Modified(o) => Ok(Change::Put(wrap(o))),
        WatchEvent::Deleted(o) => Ok(Change::Deleted(wrap(o))),
        WatchEvent::Bookmark(b) => Ok(Change::Bookmark(b.metadata.resource_version)),
        WatchEvent::Error(status) if status.code == 410 => Ok(Change::Expired),
        WatchEvent::Error(status) => Err(Problem::watch_ended("the watch", &status)),
    }
}

async fn list_one<T>(
    api: Api<T>,
    key: ObjectKey,
    wrap: fn(T) -> ApiObject,
) -> Result<Listed, Problem>
where
    T: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let list = api
        .list(&ListParams::default().fields(&selector(&key)))
        .await?;
    let version = list.metadata.resource_version.clone().unwrap_or_default();
    let object = list.items.into_iter().next().map(wrap);
    Ok(Listed { object, version })
}

async fn watch_one<T>(
    api: Api<T>,
    key: ObjectKey,
    version: String,
    wrap: fn(T) -> ApiObject,
) -> Result<Changes, Problem>
where
    T: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let params = WatchParams::default()
        .fields(&selector(&key))
        .timeout(WATCH_SECONDS);
    let stream = api.watch(&params, &version).await?;
    Ok(stream
        .map_err(Problem::from)
        .and_then(move |e| futures::future::ready(watch_event(e, wrap)))
        .boxed())
}

fn wrap_cm(o: ConfigMap) -> ApiObject {
    ApiObject::ConfigMap(Arc::new(o))
}

fn wrap_secret(o: Secret) -> ApiObject {
    ApiObject::Secret(Arc::new(o))
}

impl ObjectApi for KubeObjectApi {
    fn list(&self, key: &ObjectKey) -> BoxFuture<'static, Result<Listed, Problem>> {
        let client = self.watch.clone();
        let key = key.clone();
        match key.kind {
            Kind::ConfigMap => {
                list_one(Api::namespaced(client, &key.namespace), key, wrap_cm).boxed()
            }
            Kind::Secret => {
                list_one(Api::namespaced(client, &key.namespace), key, wrap_secret).boxed()
            }
        }
    }

    fn watch(
        &self,
        key: &ObjectKey,
        version: &str,
    ) -> BoxFuture<'static, Result<Changes, Problem>> {
        let client = self.watch.clone();
        let key = key.clone();
        let version = version.to_string();
        match key.kind {
            Kind::ConfigMap => watch_one(
                Api::namespaced(client, &key.namespace),
                key,
                version,
                wrap_cm,
            )
            .boxed(),
            Kind::Secret => watch_one(
                Api::namespaced(client, &key.namespace),
                key,
                version,
                wrap_secret,
            )
            .boxed(),
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
}
