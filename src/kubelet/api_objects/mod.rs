//! The API objects a node's pods refer to: configMaps and secrets (volumes, `env`,
//! `envFrom`) and service-account tokens (projected volumes).
//!
//! As upstream's watch-based manager, each object a pod refers to is watched on its own
//! (`fieldSelector=metadata.name=<name>` in its namespace): the Node authorizer lets a node
//! read only the objects the pods bound to it refer to, so a node cannot list a namespace.
//! Watches are counted by pod and stopped when the last pod referring to the object goes; an
//! immutable object is not watched after it has been read. Unlike upstream, a change pokes the
//! pods that refer to the object, so their volumes follow within a sync, not within a
//! resync period.
//!
//! - [`refs`]: which objects a pod refers to (pure).
//! - [`api`]: the few requests made, behind [`ObjectApi`]; [`KubeObjectApi`] is the real one.
//! - [`cache`]: the watches and what they last saw.
//! - [`token`]: TokenRequests, cached and refreshed as upstream's token manager does.
//!
//! Without `--kubeconfig` none of this runs; [`PodObjects::standalone`] tells every consumer
//! that there is no API server to read from.

pub(crate) mod api;
pub(crate) mod cache;
pub(crate) mod claims;
pub(crate) mod refs;
pub(crate) mod services;
#[cfg(test)]
pub(crate) mod testing;
pub(crate) mod token;

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::future::join_all;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use tokio_util::sync::CancellationToken;

pub(crate) use api::{ApiObject, KubeObjectApi, ObjectApi};
pub(crate) use cache::ObjectCache;
pub(crate) use token::{TokenError, TokenManager};

use crate::base::resync_queue::Pokes;

/// The kinds of object a pod can refer to by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Kind {
    ConfigMap,
    Secret,
}

impl Kind {
    /// The name upstream's managers use in their errors (`configmap "x" not found`).
    pub(crate) fn resource(self) -> &'static str {
        match self {
            Kind::ConfigMap => "configmap",
            Kind::Secret => "secret",
        }
    }

    /// The kind as users write it (`couldn't find key k in ConfigMap ns/x`).
    pub(crate) fn title(self) -> &'static str {
        match self {
            Kind::ConfigMap => "ConfigMap",
            Kind::Secret => "Secret",
        }
    }

    /// The field name in upstream's standalone message (`couldn't get configMap ns/x, …`).
    pub(crate) fn field(self) -> &'static str {
        match self {
            Kind::ConfigMap => "configMap",
            Kind::Secret => "secret",
        }
    }
}

/// One object, by kind, namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ObjectKey {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
}

impl ObjectKey {
    pub(crate) fn new(kind: Kind, namespace: &str, name: &str) -> Self {
        ObjectKey {
            kind,
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {}/{}",
            self.kind.resource(),
            self.namespace,
            self.name
        )
    }
}

/// Why an object could not be had. The messages are upstream's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ObjectError {
    #[error("{} {name:?} not found", kind.resource())]
    NotFound { kind: Kind, name: String },
    /// The watch has not listed the object yet (within a second, as upstream waits); `last`
    /// is the request's problem, when one is known (a 403, an unreachable API server).
    #[error("failed to sync {} cache: timed out waiting for the condition{}", kind.resource(), last_problem(.last))]
    NotSynced { kind: Kind, last: Option<String> },
    #[error("couldn't get {} {namespace}/{name}, no kubeClient defined", kind.field())]
    NoApiServer {
        kind: Kind,
        namespace: String,
        name: String,
    },
    #[error("object {namespace:?}/{name:?} not registered")]
    NotRegistered { namespace: String, name: String },
    /// The Services have not been listed once, so the service variables cannot be had.
    #[error("services have not yet been read at least once, cannot construct envvars")]
    ServicesNotSynced,
}

fn last_problem(last: &Option<String>) -> String {
    match last {
        Some(p) => format!(" (last error: {p})"),
        None => String::new(),
    }
}

impl ObjectError {
    pub(crate) fn is_not_found(&self) -> bool {
        matches!(self, ObjectError::NotFound { .. })
    }
}

/// Which serviceAccountToken source of which volume a token is for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct TokenSlot {
    pub volume: String,
    pub source: usize,
}

/// Everything one pod's volumes and environment read from the API server, fetched before
/// the (blocking, pure-ish) volume and environment code runs.
#[derive(Debug, Clone, Default)]
pub(crate) struct PodObjects {
    /// False without `--kubeconfig`: nothing could be read.
    pub from_api: bool,
    pub config_maps: BTreeMap<String, Result<Arc<ConfigMap>, ObjectError>>,
    pub secrets: BTreeMap<String, Result<Arc<Secret>, ObjectError>>,
    pub tokens: BTreeMap<TokenSlot, Result<String, TokenError>>,
    /// The service variables every container gets ([`services`]): none without an API
    /// server (`None`), an error until the Services have been listed once.
    pub service_env: Option<Result<BTreeMap<String, String>, ObjectError>>,
    /// The claims of the pod's `persistentVolumeClaim` volumes, by claim name.
    pub claims: BTreeMap<String, claims::Claim>,
    /// The volumes those claims are bound to, by volume name.
    pub persistent_volumes: BTreeMap<String, claims::Volume>,
}

impl PodObjects {
    /// No API server: every lookup says so.
    pub(crate) fn standalone() -> Self {
        PodObjects::default()
    }

    /// The configMap `name` in the pod's namespace `namespace`.
    pub(crate) fn config_map(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<&ConfigMap, ObjectError> {
        self.lookup(&self.config_maps, Kind::ConfigMap, namespace, name)
    }

    /// The secret `name` in the pod's namespace `namespace`.
    pub(crate) fn secret(&self, namespace: &str, name: &str) -> Result<&Secret, ObjectError> {
        self.lookup(&self.secrets, Kind::Secret, namespace, name)
    }

    /// The token of a serviceAccountToken source.
    pub(crate) fn token(&self, volume: &str, source: usize) -> Result<&str, TokenError> {
        let slot = TokenSlot {
            volume: volume.to_string(),
            source,
        };
        match self.tokens.get(&slot) {
            Some(Ok(t)) => Ok(t),
            Some(Err(e)) => Err(e.clone()),
            None if !self.from_api => Err(TokenError::NoApiServer),
            None => Err(TokenError::NotFetched),
        }
    }

    /// The claim `name` in the pod's namespace, as last read.
    pub(crate) fn claim(&self, name: &str) -> claims::Claim {
        match self.claims.get(name) {
            Some(c) => c.clone(),
            None => Err(claims::FetchError::NoApiServer {
                resource: claims::CLAIMS,
                name: name.to_string(),
            }),
        }
    }

    /// The persistent volume `name`, as last read.
    pub(crate) fn persistent_volume(&self, name: &str) -> claims::Volume {
        match self.persistent_volumes.get(name) {
            Some(v) => v.clone(),
            None => Err(claims::FetchError::NoApiServer {
                resource: claims::VOLUMES,
                name: name.to_string(),
            }),
        }
    }

    fn lookup<'a, T>(
        &self,
        map: &'a BTreeMap<String, Result<Arc<T>, ObjectError>>,
        kind: Kind,
        namespace: &str,
        name: &str,
    ) -> Result<&'a T, ObjectError> {
        match map.get(name) {
            Some(Ok(o)) => Ok(o),
            Some(Err(e)) => Err(e.clone()),
            None if !self.from_api => Err(ObjectError::NoApiServer {
                kind,
                namespace: namespace.to_string(),
                name: name.to_string(),
            }),
            None => Err(ObjectError::NotRegistered {
                namespace: namespace.to_string(),
                name: name.to_string(),
            }),
        }
    }
}

/// The objects of the node's pods, with an API server: the watch cache and the tokens.
/// Cheap to clone; all clones share one cache.
#[derive(Clone)]
pub(crate) struct ApiObjects {
    api: Arc<dyn ObjectApi>,
    cache: ObjectCache,
    tokens: TokenManager,
    services: Option<services::ServiceView>,
}

impl ApiObjects {
    /// Starts nothing yet: each watch starts when a pod first refers to its object, and every
    /// watch ends with `cancel`. A change to a watched object pokes the pods that refer to it.
    pub(crate) fn new(api: Arc<dyn ObjectApi>, pokes: Pokes, cancel: CancellationToken) -> Self {
        ApiObjects {
            api: api.clone(),
            cache: ObjectCache::new(api.clone(), pokes, cancel),
            tokens: TokenManager::new(api),
            services: None,
        }
    }

    /// Gives each pod the variables of the Services in `view`.
    pub(crate) fn with_services(mut self, view: services::ServiceView) -> Self {
        self.services = Some(view);
        self
    }

    /// Writes the status of one of the pods' claims (a merge patch; see
    /// [`ObjectApi::patch_claim_status`]).
    pub(crate) async fn patch_claim_status(
        &self,
        namespace: &str,
        name: &str,
        patch: serde_json::Value,
    ) -> Result<k8s_openapi::api::core::v1::PersistentVolumeClaim, crate::clients::apiserver::Problem>
    {
        self.api.patch_claim_status(namespace, name, patch).await
    }

    /// The token manager, shared with the CSI volume code (a CSIDriver's `tokenRequests`):
    /// one cache of tokens for the node, as upstream's.
    pub(crate) fn tokens(&self) -> TokenManager {
        self.tokens.clone()
    }

    #[cfg(test)]
    pub(crate) fn cache(&self) -> &ObjectCache {
        &self.cache
    }

    /// Registers the pod's references (so the objects are watched from now on) and reads
    /// every object and token the pod's volumes and environment need. Cheap for a pod that
    /// refers to nothing, and for later calls: objects come from the cache, tokens are reused
    /// until they need a refresh.
    pub(crate) async fn for_pod(&self, pod: &Pod) -> PodObjects {
        let mut out = PodObjects {
            from_api: true,
            ..Default::default()
        };
        let keys = self.cache.register_pod(pod);
        let fetched = join_all(keys.iter().map(|key| self.cache.get(key))).await;
        for (key, result) in keys.into_iter().zip(fetched) {
            match key.kind {
                Kind::ConfigMap => {
                    let cm = result.and_then(|o| match o {
                        ApiObject::ConfigMap(cm) => Ok(cm),
                        ApiObject::Secret(_) => Err(ObjectError::NotFound {
                            kind: Kind::ConfigMap,
                            name: key.name.clone(),
                        }),
                    });
                    out.config_maps.insert(key.name, cm);
                }
                Kind::Secret => {
                    let secret = result.and_then(|o| match o {
                        ApiObject::Secret(s) => Ok(s),
                        ApiObject::ConfigMap(_) => Err(ObjectError::NotFound {
                            kind: Kind::Secret,
                            name: key.name.clone(),
                        }),
                    });
                    out.secrets.insert(key.name, secret);
                }
            }
        }
        let namespace = crate::base::podspec::pod::namespace(pod);
        let (claims, volumes) = claims::fetch(&*self.api, namespace, pod).await;
        out.claims.extend(claims);
        out.persistent_volumes.extend(volumes);
        if let Some(view) = &self.services {
            out.service_env = Some(view.env_for(pod).ok_or(ObjectError::ServicesNotSynced));
        }
        for (slot, want) in refs::token_requests(pod) {
            let token = self.tokens.get(pod, &want).await;
            out.tokens.insert(slot, token);
        }
        out
    }

    /// The pod is gone: its references are dropped (a watch nobody needs any more stops) and
    /// its tokens forgotten.
    pub(crate) fn forget_pod(&self, uid: &str) {
        self.cache.unregister_pod(uid);
        self.tokens.forget_pod(uid);
    }
}
