//! Container environment: literal values, the downward API (`fieldRef`) and `$(VAR)` expansion.
//!
//! `resourceFieldRef` reads the container's limits and requests, a missing CPU, memory or
//! ephemeral-storage limit standing for the node's allocatable amount (as upstream does for the
//! downward API).
//!
//! Deckhand has no API-server objects to read from here, so `configMapKeyRef`, `secretKeyRef`
//! and `envFrom` are refused with an error naming the container and the variable (the pod then
//! shows `CreateContainerConfigError`), unless marked optional, in which case they are skipped.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::{ContainerContext, TranslateError};
pub use crate::k8s::expand::{expand, expand_all};
pub use crate::k8s::resources::{NodeAllocatable, resource_field_value};

/// The container's environment in spec order (a later duplicate replaces the earlier value in
/// place). Values may refer to variables defined before them with `$(NAME)`.
pub fn container_env(
    pod: &Pod,
    container: &Container,
    ctx: &ContainerContext,
) -> Result<Vec<(String, String)>, TranslateError> {
    for source in container.env_from.iter().flatten() {
        if let Some(cm) = &source.config_map_ref
            && cm.optional != Some(true)
        {
            return Err(TranslateError::UnsupportedEnvFrom {
                container: container.name.clone(),
                kind: "configMapRef",
                name: cm.name.clone(),
            });
        }
        if let Some(secret) = &source.secret_ref
            && secret.optional != Some(true)
        {
            return Err(TranslateError::UnsupportedEnvFrom {
                container: container.name.clone(),
                kind: "secretRef",
                name: secret.name.clone(),
            });
        }
    }

    let mut ordered: Vec<(String, String)> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for var in container.env.iter().flatten() {
        let value = match &var.value_from {
            None => {
                let raw = var.value.as_deref().unwrap_or("");
                expand(raw, |name| index.get(name).map(|&i| ordered[i].1.clone()))
            }
            Some(from) => {
                let unsupported = |kind: &'static str| TranslateError::UnsupportedEnvSource {
                    container: container.name.clone(),
                    var: var.name.clone(),
                    kind,
                };
                if let Some(field) = &from.field_ref {
                    field_ref_value(pod, &field.field_path, ctx).ok_or_else(|| {
                        TranslateError::UnsupportedFieldPath {
                            container: container.name.clone(),
                            var: var.name.clone(),
                            path: field.field_path.clone(),
                        }
                    })?
                } else if let Some(cm) = &from.config_map_key_ref {
                    if cm.optional == Some(true) {
                        continue;
                    }
                    return Err(unsupported("configMapKeyRef"));
                } else if let Some(secret) = &from.secret_key_ref {
                    if secret.optional == Some(true) {
                        continue;
                    }
                    return Err(unsupported("secretKeyRef"));
                } else if let Some(selector) = &from.resource_field_ref {
                    let node = ctx.node_allocatable;
                    resource_field_value(pod, Some(container), selector, &node).map_err(
                        |reason| TranslateError::InvalidQuantity {
                            container: container.name.clone(),
                            field: format!("env {:?} resourceFieldRef", var.name),
                            value: selector.resource.clone(),
                            reason: Box::new(reason.into()),
                        },
                    )?
                } else {
                    return Err(unsupported("an empty valueFrom"));
                }
            }
        };
        match index.get(&var.name) {
            Some(&i) => ordered[i].1 = value,
            None => {
                index.insert(var.name.clone(), ordered.len());
                ordered.push((var.name.clone(), value));
            }
        }
    }
    Ok(ordered)
}

/// Value of a downward-API field path, or None for paths we do not serve.
fn field_ref_value(pod: &Pod, path: &str, ctx: &ContainerContext) -> Option<String> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref();
    let status = pod.status.as_ref();
    let pod_ip = || {
        ctx.pod_ip
            .clone()
            .or_else(|| status.and_then(|s| s.pod_ip.clone()))
            .unwrap_or_default()
    };
    let host_ip = || {
        ctx.host_ip
            .clone()
            .or_else(|| status.and_then(|s| s.host_ip.clone()))
            .unwrap_or_default()
    };
    let value = match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "spec.nodeName" => spec
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| ctx.node_name.clone()),
        "spec.serviceAccountName" => spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default(),
        // Single-stack node: the plural forms carry the one address.
        "status.hostIP" | "status.hostIPs" => host_ip(),
        "status.podIP" | "status.podIPs" => pod_ip(),
        _ => {
            let (map, key) = if let Some(key) = subscript(path, "metadata.labels") {
                (meta.labels.as_ref(), key)
            } else if let Some(key) = subscript(path, "metadata.annotations") {
                (meta.annotations.as_ref(), key)
            } else {
                return None;
            };
            map.and_then(|m| m.get(key)).cloned().unwrap_or_default()
        }
    };
    Some(value)
}

/// `prefix['key']` → `key`.
fn subscript<'a>(path: &'a str, prefix: &str) -> Option<&'a str> {
    path.strip_prefix(prefix)?
        .strip_prefix("['")?
        .strip_suffix("']")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ConfigMapEnvSource, ConfigMapKeySelector, EnvFromSource, EnvVar, EnvVarSource,
        ObjectFieldSelector, PodSpec, ResourceFieldSelector, SecretKeySelector,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::collections::BTreeMap;

    fn lookup(name: &str) -> Option<String> {
        match name {
            "A" => Some("alpha".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn expansion_table() {
        let cases = [
            ("$(A)", "alpha"),
            ("x-$(A)-y", "x-alpha-y"),
            ("$(A)$(A)", "alphaalpha"),
            ("$$(A)", "$(A)"),
            ("$$$(A)", "$alpha"),
            ("$$$$(A)", "$$(A)"),
            ("$(UNKNOWN)", "$(UNKNOWN)"),
            ("pre $(UNKNOWN) post $(A)", "pre $(UNKNOWN) post alpha"),
            ("$(EMPTY)|", "|"),
            ("$()", "$()"),
            ("$(A", "$(A"),
            ("$A", "$A"),
            ("cost: 5$", "cost: 5$"),
            ("$", "$"),
            ("", ""),
            ("no refs", "no refs"),
            ("ünï $(A) cödé", "ünï alpha cödé"),
            ("$(A)))", "alpha))"),
        ];
        for (input, want) in cases {
            assert_eq!(expand(input, lookup), want, "input {input:?}");
        }
    }

    fn env(name: &str, value: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: Some(value.into()),
            value_from: None,
        }
    }

    fn field(name: &str, path: &str) -> EnvVar {
        EnvVar {
            name: name.into(),
            value: None,
            value_from: Some(EnvVarSource {
                field_ref: Some(ObjectFieldSelector {
                    api_version: Some("v1".into()),
                    field_path: path.into(),
                }),
                ..Default::default()
            }),
        }
    }

    fn test_pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("shop".into()),
                uid: Some("1234-abcd".into()),
                labels: Some(BTreeMap::from([("app".to_string(), "web".to_string())])),
                annotations: Some(BTreeMap::from([("team".to_string(), "blue".to_string())])),
                ..Default::default()
            },
            spec: Some(PodSpec {
                service_account_name: Some("builder".into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn ctx() -> ContainerContext {
        ContainerContext {
            pod_ip: Some("10.88.0.7".into()),
            host_ip: Some("192.168.1.10".into()),
            node_name: "node-a".into(),
            ..Default::default()
        }
    }

    fn container(vars: Vec<EnvVar>) -> Container {
        Container {
            name: "app".into(),
            env: Some(vars),
            ..Default::default()
        }
    }

    #[test]
    fn literal_values_expand_earlier_variables_only() {
        let c = container(vec![
            env("A", "one"),
            env("B", "$(A)-two"),
            env("C", "$(D)"),
            env("D", "late"),
            env("A", "again:$(A)"),
        ]);
        let got = container_env(&test_pod(), &c, &ctx()).unwrap();
        let want: Vec<(String, String)> = [
            ("A", "again:one"),
            ("B", "one-two"),
            ("C", "$(D)"),
            ("D", "late"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn field_refs() {
        let c = container(vec![
            field("NAME", "metadata.name"),
            field("NS", "metadata.namespace"),
            field("UID", "metadata.uid"),
            field("APP", "metadata.labels['app']"),
            field("NOPE", "metadata.labels['missing']"),
            field("TEAM", "metadata.annotations['team']"),
            field("NODE", "spec.nodeName"),
            field("SA", "spec.serviceAccountName"),
            field("HOST", "status.hostIP"),
            field("HOSTS", "status.hostIPs"),
            field("POD", "status.podIP"),
            field("PODS", "status.podIPs"),
        ]);
        let got: HashMap<String, String> = container_env(&test_pod(), &c, &ctx())
            .unwrap()
            .into_iter()
            .collect();
        let want: HashMap<String, String> = [
            ("NAME", "web"),
            ("NS", "shop"),
            ("UID", "1234-abcd"),
            ("APP", "web"),
            ("NOPE", ""),
            ("TEAM", "blue"),
            ("NODE", "node-a"),
            ("SA", "builder"),
            ("HOST", "192.168.1.10"),
            ("HOSTS", "192.168.1.10"),
            ("POD", "10.88.0.7"),
            ("PODS", "10.88.0.7"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn unknown_field_path_is_an_error() {
        let c = container(vec![field("X", "status.phase")]);
        let err = container_env(&test_pod(), &c, &ctx()).unwrap_err();
        assert_eq!(
            err,
            TranslateError::UnsupportedFieldPath {
                container: "app".into(),
                var: "X".into(),
                path: "status.phase".into()
            }
        );
        assert!(err.to_string().contains("\"app\""));
        assert!(err.to_string().contains("\"X\""));
    }

    #[test]
    fn api_object_refs_fail_unless_optional() {
        let cm = |optional| EnvVar {
            name: "CM".into(),
            value: None,
            value_from: Some(EnvVarSource {
                config_map_key_ref: Some(ConfigMapKeySelector {
                    name: "settings".into(),
                    key: "k".into(),
                    optional,
                }),
                ..Default::default()
            }),
        };
        let secret = |optional| EnvVar {
            name: "PW".into(),
            value: None,
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: "creds".into(),
                    key: "pw".into(),
                    optional,
                }),
                ..Default::default()
            }),
        };
        let resource = EnvVar {
            name: "MEM".into(),
            value: None,
            value_from: Some(EnvVarSource {
                resource_field_ref: Some(ResourceFieldSelector {
                    resource: "limits.memory".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        };

        let err = container_env(&test_pod(), &container(vec![cm(None)]), &ctx()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "container \"app\": env var \"CM\" uses configMapKeyRef, which this node cannot resolve (no API server access)"
        );
        let err =
            container_env(&test_pod(), &container(vec![secret(Some(false))]), &ctx()).unwrap_err();
        assert!(matches!(
            err,
            TranslateError::UnsupportedEnvSource {
                kind: "secretKeyRef",
                ..
            }
        ));
        // resourceFieldRef is served: with no limit it is the node's memory.
        let mut node_ctx = ctx();
        node_ctx.node_allocatable.memory_bytes = 2 * 1024 * 1024 * 1024;
        let ok = container_env(&test_pod(), &container(vec![resource]), &node_ctx).unwrap();
        assert_eq!(ok, vec![("MEM".to_string(), "2147483648".to_string())]);

        let ok = container_env(
            &test_pod(),
            &container(vec![cm(Some(true)), secret(Some(true)), env("X", "1")]),
            &ctx(),
        )
        .unwrap();
        assert_eq!(ok, vec![("X".to_string(), "1".to_string())]);
    }

    #[test]
    fn env_from_fails_unless_optional() {
        let mut c = container(vec![]);
        c.env_from = Some(vec![EnvFromSource {
            config_map_ref: Some(ConfigMapEnvSource {
                name: "settings".into(),
                optional: None,
            }),
            ..Default::default()
        }]);
        let err = container_env(&test_pod(), &c, &ctx()).unwrap_err();
        assert!(matches!(
            err,
            TranslateError::UnsupportedEnvFrom {
                kind: "configMapRef",
                ..
            }
        ));
        c.env_from.as_mut().unwrap()[0]
            .config_map_ref
            .as_mut()
            .unwrap()
            .optional = Some(true);
        assert_eq!(container_env(&test_pod(), &c, &ctx()).unwrap(), vec![]);
    }

    fn resources(limits: &[(&str, &str)], requests: &[(&str, &str)]) -> Container {
        use k8s_openapi::api::core::v1::ResourceRequirements;
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let map = |items: &[(&str, &str)]| {
            Some(
                items
                    .iter()
                    .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                    .collect::<BTreeMap<_, _>>(),
            )
        };
        Container {
            name: "app".into(),
            resources: Some(ResourceRequirements {
                limits: map(limits),
                requests: map(requests),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn selector(resource: &str, divisor: Option<&str>) -> ResourceFieldSelector {
        ResourceFieldSelector {
            resource: resource.into(),
            divisor: divisor
                .map(|d| k8s_openapi::apimachinery::pkg::api::resource::Quantity(d.into())),
            container_name: None,
        }
    }

    #[test]
    fn resource_field_ref_table() {
        let node = NodeAllocatable {
            cpu_millis: 4000,
            memory_bytes: 8 * 1024 * 1024 * 1024,
            ephemeral_storage_bytes: 100_000_000_000,
        };
        let limited = resources(
            &[
                ("cpu", "250m"),
                ("memory", "64Mi"),
                ("ephemeral-storage", "1Gi"),
            ],
            &[("cpu", "100m"), ("memory", "32Mi")],
        );
        let unlimited = resources(&[], &[]);
        let cases: &[(&str, &Container, &str, Option<&str>, &str)] = &[
            (
                "memory limit in bytes",
                &limited,
                "limits.memory",
                None,
                "67108864",
            ),
            (
                "memory limit in Mi",
                &limited,
                "limits.memory",
                Some("1Mi"),
                "64",
            ),
            (
                "memory limit in M rounds up",
                &limited,
                "limits.memory",
                Some("1M"),
                "68",
            ),
            (
                "cpu limit rounds up to a core",
                &limited,
                "limits.cpu",
                None,
                "1",
            ),
            (
                "cpu limit in millicores",
                &limited,
                "limits.cpu",
                Some("1m"),
                "250",
            ),
            ("cpu request", &limited, "requests.cpu", Some("1m"), "100"),
            (
                "cpu request in cores",
                &limited,
                "requests.cpu",
                Some("1"),
                "1",
            ),
            (
                "memory request",
                &limited,
                "requests.memory",
                Some("1Ki"),
                "32768",
            ),
            (
                "ephemeral limit",
                &limited,
                "limits.ephemeral-storage",
                Some("1Mi"),
                "1024",
            ),
            (
                "zero divisor means 1",
                &limited,
                "limits.memory",
                Some("0"),
                "67108864",
            ),
            (
                "no cpu limit: node cpus",
                &unlimited,
                "limits.cpu",
                None,
                "4",
            ),
            (
                "no memory limit: node memory",
                &unlimited,
                "limits.memory",
                Some("1Gi"),
                "8",
            ),
            (
                "no ephemeral limit: node disk",
                &unlimited,
                "limits.ephemeral-storage",
                None,
                "100000000000",
            ),
            ("no request: zero", &unlimited, "requests.memory", None, "0"),
        ];
        for (what, c, resource, divisor, want) in cases {
            let got =
                resource_field_value(&test_pod(), Some(c), &selector(resource, *divisor), &node);
            assert_eq!(got.as_deref(), Ok(*want), "{what}");
        }
        let err = resource_field_value(
            &test_pod(),
            Some(&limited),
            &selector("limits.gpu", None),
            &node,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "unsupported container resource : limits.gpu"
        );

        // containerName picks another container of the pod.
        let mut pod = test_pod();
        let mut other = resources(&[("memory", "1Gi")], &[]);
        other.name = "side".into();
        pod.spec.as_mut().unwrap().containers = vec![limited.clone(), other];
        let mut sel = selector("limits.memory", Some("1Mi"));
        sel.container_name = Some("side".into());
        assert_eq!(
            resource_field_value(&pod, None, &sel, &node).as_deref(),
            Ok("1024")
        );
        sel.container_name = Some("gone".into());
        assert_eq!(
            resource_field_value(&pod, None, &sel, &node)
                .unwrap_err()
                .to_string(),
            "container gone not found"
        );
    }

    #[test]
    fn resource_field_ref_env_shows_the_limit() {
        let mut c = resources(&[("memory", "64Mi")], &[]);
        c.env = Some(vec![EnvVar {
            name: "MEM".into(),
            value: None,
            value_from: Some(EnvVarSource {
                resource_field_ref: Some(selector("limits.memory", None)),
                ..Default::default()
            }),
        }]);
        assert_eq!(
            container_env(&test_pod(), &c, &ctx()).unwrap(),
            vec![("MEM".to_string(), "67108864".to_string())]
        );
    }
}
