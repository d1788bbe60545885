//! For tests that drive the real [`KubeObjectApi`] against the in-memory API server
//! ([`FakeApiServer`]): the objects they put there and what they read back of the requests.
//! The watches' events come from the fake's store (`apply`, `delete`), as the API server's
//! come from etcd.

use std::sync::Arc;

use k8s_openapi::api::authentication::v1::TokenRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};

use super::{Kind, KubeObjectApi, ObjectKey};
use crate::clients::apiserver::fake::{FakeApiServer, Rule};

/// The real requests on `fake` (one client for watches, one for requests, as in production).
pub(crate) fn object_api(fake: &FakeApiServer) -> Arc<KubeObjectApi> {
    Arc::new(KubeObjectApi::new(fake.client(), fake.client()))
}

pub(crate) fn config_map(namespace: &str, name: &str, data: &[(&str, &str)]) -> ConfigMap {
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some(name.into());
    cm.metadata.namespace = Some(namespace.into());
    cm.data = Some(
        data.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    cm
}

/// A secret of a type (`kubernetes.io/dockerconfigjson`, …) or of none.
pub(crate) fn secret(
    namespace: &str,
    name: &str,
    kind: Option<&str>,
    data: &[(&str, &[u8])],
) -> Secret {
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
    s
}

/// Removes the object, as a user deleting it would.
pub(crate) fn delete(fake: &FakeApiServer, key: &ObjectKey) {
    match key.kind {
        Kind::ConfigMap => fake
            .delete::<ConfigMap>(&key.namespace, &key.name)
            .map(drop),
        Kind::Secret => fake.delete::<Secret>(&key.namespace, &key.name).map(drop),
    };
}

/// The lists made so far (of configMaps and secrets).
pub(crate) fn lists(fake: &FakeApiServer) -> usize {
    fake.count(&Rule::new("list", "*"))
}

/// The objects watched now, from the open watch requests (`metadata.name=<name>`).
pub(crate) fn open_watches(fake: &FakeApiServer) -> Vec<ObjectKey> {
    fake.open_watches()
        .iter()
        .map(|r| {
            let kind = match r.gvr.resource.as_str() {
                "configmaps" => Kind::ConfigMap,
                "secrets" => Kind::Secret,
                other => panic!("a watch of {other}"),
            };
            let name = r
                .param("fieldSelector")
                .and_then(|f| f.strip_prefix("metadata.name="))
                .expect("a watch of one object");
            ObjectKey::new(kind, r.namespace.as_deref().unwrap_or(""), name)
        })
        .collect()
}

/// The TokenRequests sent so far.
pub(crate) fn token_requests(fake: &FakeApiServer) -> Vec<TokenRequest> {
    let rule = Rule::new("create", "serviceaccounts/token");
    fake.requests()
        .iter()
        .filter(|r| rule.matches(r))
        .map(|r| r.body_as().expect("a TokenRequest"))
        .collect()
}

/// Every later list and token request is refused as the Node authorizer refuses a node an
/// object none of its pods refers to (until `fake.clear_failures()`).
pub(crate) fn forbid(fake: &FakeApiServer) {
    let refused = |verb: &str, resource: &str| {
        let message = format!(
            "{resource} is forbidden: User \"system:node:n1\" cannot {verb} resource \
             \"{resource}\": no relationship found between node 'n1' and this object"
        );
        let status = crate::clients::apiserver::fake::status(403, "Forbidden", message);
        fake.fail_with(Rule::new(verb, resource), status, usize::MAX);
    };
    refused("list", "configmaps");
    refused("list", "secrets");
    refused("create", "serviceaccounts/token");
}
