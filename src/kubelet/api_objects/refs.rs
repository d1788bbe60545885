//! Which API objects a pod refers to, and which tokens its volumes need (pure).

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::token::TokenWant;
use super::{Kind, ObjectKey, TokenSlot};
use crate::base::podspec::{self, pod::namespace};

/// Upstream's default lifetime of a projected service-account token.
pub(crate) const DEFAULT_TOKEN_SECONDS: i64 = 3600;

/// Every configMap and secret the pod's volumes (plain and projected), containers' `env`
/// and `envFrom` and `imagePullSecrets` name, in the pod's namespace. Empty names are left out (validation refuses
/// them; nothing could be read by such a name anyway).
pub(crate) fn referenced(pod: &Pod) -> BTreeSet<ObjectKey> {
    let ns = namespace(pod);
    let mut out = BTreeSet::new();
    let mut add = |kind: Kind, name: &str| {
        if !name.is_empty() {
            out.insert(ObjectKey::new(kind, ns, name));
        }
    };
    let Some(spec) = pod.spec.as_ref() else {
        return BTreeSet::new();
    };
    for pull in spec.image_pull_secrets.iter().flatten() {
        add(Kind::Secret, &pull.name);
    }
    for volume in spec.volumes.iter().flatten() {
        if let Some(cm) = &volume.config_map {
            add(Kind::ConfigMap, &cm.name);
        }
        if let Some(secret) = &volume.secret {
            add(Kind::Secret, secret.secret_name.as_deref().unwrap_or(""));
        }
        for source in volume
            .projected
            .iter()
            .flat_map(|p| p.sources.iter().flatten())
        {
            if let Some(cm) = &source.config_map {
                add(Kind::ConfigMap, &cm.name);
            }
            if let Some(secret) = &source.secret {
                add(Kind::Secret, &secret.name);
            }
        }
    }
    for container in podspec::spec_init_and_app_containers(spec) {
        container_refs(container, &mut add);
    }
    for ephemeral in spec.ephemeral_containers.iter().flatten() {
        for var in ephemeral.env.iter().flatten() {
            if let Some(from) = &var.value_from {
                if let Some(cm) = &from.config_map_key_ref {
                    add(Kind::ConfigMap, &cm.name);
                }
                if let Some(s) = &from.secret_key_ref {
                    add(Kind::Secret, &s.name);
                }
            }
        }
        for from in ephemeral.env_from.iter().flatten() {
            if let Some(cm) = &from.config_map_ref {
                add(Kind::ConfigMap, &cm.name);
            }
            if let Some(s) = &from.secret_ref {
                add(Kind::Secret, &s.name);
            }
        }
    }
    out
}

fn container_refs(container: &Container, add: &mut impl FnMut(Kind, &str)) {
    for var in container.env.iter().flatten() {
        if let Some(from) = &var.value_from {
            if let Some(cm) = &from.config_map_key_ref {
                add(Kind::ConfigMap, &cm.name);
            }
            if let Some(s) = &from.secret_key_ref {
                add(Kind::Secret, &s.name);
            }
        }
    }
    for from in container.env_from.iter().flatten() {
        if let Some(cm) = &from.config_map_ref {
            add(Kind::ConfigMap, &cm.name);
        }
        if let Some(s) = &from.secret_ref {
            add(Kind::Secret, &s.name);
        }
    }
}

/// The TokenRequests the pod's projected volumes need: for each serviceAccountToken source,
/// the pod's service account (`default` when unset), the audience, and the lifetime (3600 s
/// when unset, as the API server defaults it).
pub(crate) fn token_requests(pod: &Pod) -> Vec<(TokenSlot, TokenWant)> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let service_account = spec
        .service_account_name
        .as_deref()
        .filter(|s| !s.is_empty())
        .unwrap_or("default");
    let mut out = Vec::new();
    for volume in spec.volumes.iter().flatten() {
        let sources = volume
            .projected
            .iter()
            .flat_map(|p| p.sources.iter().flatten());
        for (index, source) in sources.enumerate() {
            let Some(token) = &source.service_account_token else {
                continue;
            };
            out.push((
                TokenSlot {
                    volume: volume.name.clone(),
                    source: index,
                },
                TokenWant {
                    namespace: namespace(pod).to_string(),
                    service_account: service_account.to_string(),
                    audience: token.audience.clone().filter(|a| !a.is_empty()),
                    expiration_seconds: token.expiration_seconds.unwrap_or(DEFAULT_TOKEN_SECONDS),
                },
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(spec: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "shop", "uid": "u1"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn keys(pod: &Pod) -> Vec<String> {
        referenced(pod).iter().map(ToString::to_string).collect()
    }

    #[test]
    fn references_table() {
        let rows: Vec<(&str, serde_json::Value, Vec<&str>)> = vec![
            (
                "nothing",
                serde_json::json!({"containers": [{"name": "c"}]}),
                vec![],
            ),
            (
                "volumes of every kind",
                serde_json::json!({
                    "containers": [{"name": "c"}],
                    "volumes": [
                        {"name": "a", "configMap": {"name": "cm-a"}},
                        {"name": "b", "secret": {"secretName": "s-b"}},
                        {"name": "c", "projected": {"sources": [
                            {"configMap": {"name": "kube-root-ca.crt"}},
                            {"secret": {"name": "s-c"}},
                            {"serviceAccountToken": {"path": "token"}},
                            {"downwardAPI": {"items": []}}
                        ]}},
                        {"name": "d", "emptyDir": {}},
                        {"name": "e", "secret": {}}
                    ]
                }),
                vec![
                    "configmap shop/cm-a",
                    "configmap shop/kube-root-ca.crt",
                    "secret shop/s-b",
                    "secret shop/s-c",
                ],
            ),
            (
                "env and envFrom of init, app and ephemeral containers, once each",
                serde_json::json!({
                    "initContainers": [{"name": "i", "envFrom": [{"secretRef": {"name": "s1"}}]}],
                    "containers": [{"name": "c",
                        "env": [
                            {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "cm1", "key": "k"}}},
                            {"name": "B", "valueFrom": {"secretKeyRef": {"name": "s1", "key": "k"}}},
                            {"name": "C", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                            {"name": "D", "value": "x"}
                        ],
                        "envFrom": [{"configMapRef": {"name": "cm2"}, "prefix": "P_"}]
                    }],
                    "ephemeralContainers": [{"name": "dbg",
                        "env": [{"name": "E", "valueFrom": {"configMapKeyRef": {"name": "cm3", "key": "k"}}}]}]
                }),
                vec![
                    "configmap shop/cm1",
                    "configmap shop/cm2",
                    "configmap shop/cm3",
                    "secret shop/s1",
                ],
            ),
            (
                "image pull secrets, empty names left out",
                serde_json::json!({
                    "containers": [{"name": "c"}],
                    "imagePullSecrets": [{"name": "regcred"}, {"name": ""}, {"name": "s1"}],
                    "volumes": [{"name": "b", "secret": {"secretName": "s1"}}]
                }),
                vec!["secret shop/regcred", "secret shop/s1"],
            ),
        ];
        for (what, spec, want) in rows {
            assert_eq!(keys(&pod(spec)), want, "{what}");
        }
        let mut no_ns = pod(serde_json::json!({"containers": [], "volumes": [
            {"name": "a", "configMap": {"name": "x"}}]}));
        no_ns.metadata.namespace = None;
        assert_eq!(keys(&no_ns), ["configmap default/x"]);
    }

    #[test]
    fn token_requests_default_the_account_and_lifetime() {
        let p = pod(serde_json::json!({
            "containers": [{"name": "c"}],
            "volumes": [
                {"name": "kube-api-access-x", "projected": {"sources": [
                    {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                    {"configMap": {"name": "kube-root-ca.crt"}}
                ]}},
                {"name": "vault", "projected": {"sources": [
                    {"configMap": {"name": "x"}},
                    {"serviceAccountToken": {"path": "t", "audience": "vault"}}
                ]}}
            ]
        }));
        let got = token_requests(&p);
        assert_eq!(got.len(), 2);
        assert_eq!(
            got[0].0,
            TokenSlot {
                volume: "kube-api-access-x".into(),
                source: 0
            }
        );
        assert_eq!(got[0].1.service_account, "default");
        assert_eq!(got[0].1.expiration_seconds, 3607);
        assert_eq!(got[0].1.audience, None);
        assert_eq!(got[1].0.source, 1);
        assert_eq!(got[1].1.audience.as_deref(), Some("vault"));
        assert_eq!(got[1].1.expiration_seconds, DEFAULT_TOKEN_SECONDS);
        assert_eq!(got[1].1.namespace, "shop");

        let mut sa = p.clone();
        sa.spec.as_mut().unwrap().service_account_name = Some("builder".into());
        assert_eq!(token_requests(&sa)[0].1.service_account, "builder");
    }
}
