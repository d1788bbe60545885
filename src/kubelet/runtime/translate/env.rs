//! Container environment: literal values, the downward API (`fieldRef`) and `$(VAR)` expansion.
//!
//! `resourceFieldRef` reads the container's limits and requests, a missing CPU, memory or
//! ephemeral-storage limit standing for the node's allocatable amount (as upstream does for the
//! downward API).
//!
//! `configMapKeyRef`, `secretKeyRef` and `envFrom` read the objects fetched for the pod
//! ([`PodObjects`]), with upstream's rules: `envFrom` first (keys in order, with the prefix),
//! then `env` in spec order, a later name replacing an earlier value; a missing object or key
//! is an error unless marked optional (the container then waits in
//! `CreateContainerConfigError` with upstream's message); an `envFrom` key that is not a valid
//! variable name is skipped and reported. Without an API server (standalone) these sources
//! are refused with an error naming the container and the variable, unless optional, in
//! which case they are skipped.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, EnvVarSource, Pod};

use super::{ContainerContext, TranslateError};
pub(crate) use crate::base::podspec::expand::{expand, expand_all};
pub(crate) use crate::base::podspec::resources::resource_field_value;
use crate::kubelet::api_objects::{Kind, PodObjects};

/// The container's environment in spec order (a later duplicate replaces the earlier value in
/// place). Values may refer to variables defined before them with `$(NAME)`. No API server:
/// see [`container_env_with`].
#[cfg(test)]
pub(crate) fn container_env(
    pod: &Pod,
    container: &Container,
    ctx: &ContainerContext,
) -> Result<Vec<(String, String)>, TranslateError> {
    container_env_with(pod, container, ctx, &PodObjects::standalone()).map(|r| r.vars)
}

/// Keys of one `envFrom` source that were left out because they are not valid variable
/// names (upstream's `InvalidEnvironmentVariableNames` event says so).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SkippedKeys {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
    /// Sorted.
    pub keys: Vec<String>,
}

impl SkippedKeys {
    /// Upstream's event message.
    pub(crate) fn message(&self) -> String {
        let kind = match self.kind {
            Kind::ConfigMap => "configMap",
            Kind::Secret => "secret",
        };
        format!(
            "Keys [{}] from the EnvFrom {kind} {}/{} were skipped since they are considered invalid environment variable names.",
            self.keys.join(", "),
            self.namespace,
            self.name
        )
    }
}

/// A container's resolved environment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct ResolvedEnv {
    pub vars: Vec<(String, String)>,
    pub skipped: Vec<SkippedKeys>,
}

/// A variable name as the API server accepts it (relaxed validation, on by default since
/// 1.32): printable ASCII except `=`, not empty.
pub(crate) fn valid_env_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| (0x20..=0x7e).contains(&b) && b != b'=')
}

/// The container's environment, reading configMaps and secrets from `objects`.
pub(crate) fn container_env_with(
    pod: &Pod,
    container: &Container,
    ctx: &ContainerContext,
    objects: &PodObjects,
) -> Result<ResolvedEnv, TranslateError> {
    if !objects.from_api {
        check_standalone_env_from(container)?;
    }
    let namespace = crate::base::podspec::pod::namespace(pod);
    let services = match &objects.service_env {
        Some(Ok(env)) => Some(env),
        Some(Err(e)) => return Err(e.clone().into()),
        None => None,
    };
    let mut ordered: Vec<(String, String)> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut skipped = Vec::new();
    let mut set =
        |ordered: &mut Vec<(String, String)>, name: String, value: String| match index.get(&name) {
            Some(&i) => ordered[i].1 = value,
            None => {
                index.insert(name.clone(), ordered.len());
                ordered.push((name, value));
            }
        };
    if objects.from_api {
        for source in container.env_from.iter().flatten() {
            let prefix = source.prefix.as_deref().unwrap_or("");
            let (kind, name, optional) = if let Some(cm) = &source.config_map_ref {
                (Kind::ConfigMap, cm.name.as_str(), cm.optional == Some(true))
            } else if let Some(sec) = &source.secret_ref {
                (Kind::Secret, sec.name.as_str(), sec.optional == Some(true))
            } else {
                continue;
            };
            let entries = match object_data(objects, kind, namespace, name) {
                Ok(entries) => entries,
                Err(e) if e.is_not_found() && optional => continue,
                Err(e) => return Err(e.into()),
            };
            let mut invalid = Vec::new();
            for (key, value) in entries {
                let key = format!("{prefix}{key}");
                if !valid_env_name(&key) {
                    invalid.push(key);
                    continue;
                }
                set(&mut ordered, key, value);
            }
            if !invalid.is_empty() {
                invalid.sort();
                skipped.push(SkippedKeys {
                    kind,
                    namespace: namespace.to_string(),
                    name: name.to_string(),
                    keys: invalid,
                });
            }
        }
    }
    for var in container.env.iter().flatten() {
        let value = match &var.value_from {
            None => {
                let raw = var.value.as_deref().unwrap_or("");
                expand(raw, |name| {
                    index_of(&ordered, name).or_else(|| services?.get(name).cloned())
                })
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
                } else if let Some((kind, name, key, optional, what)) = key_ref(from) {
                    if !objects.from_api {
                        if optional {
                            continue;
                        }
                        return Err(unsupported(what));
                    }
                    let data = match object_data(objects, kind, namespace, name) {
                        Ok(data) => data,
                        Err(e) if e.is_not_found() && optional => continue,
                        Err(e) => return Err(e.into()),
                    };
                    match data.into_iter().find(|(k, _)| k == key) {
                        Some((_, v)) => v,
                        None if optional => continue,
                        None => {
                            return Err(TranslateError::MissingKey {
                                kind: kind.title(),
                                namespace: namespace.to_string(),
                                name: name.to_string(),
                                key: key.to_string(),
                            });
                        }
                    }
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
        set(&mut ordered, var.name.clone(), value);
    }
    // The service variables come last, each unless the container defines it (upstream's
    // order; `$(VAR)` above may refer to them).
    for (name, value) in services.into_iter().flatten() {
        if index_of(&ordered, name).is_none() {
            ordered.push((name.clone(), value.clone()));
        }
    }
    Ok(ResolvedEnv {
        vars: ordered,
        skipped,
    })
}

/// The value of an earlier variable, for `$(NAME)`.
/// The configMap or secret key a `valueFrom` names: kind, object, key, whether it is
/// optional, and the field's name for errors.
fn key_ref(from: &EnvVarSource) -> Option<(Kind, &str, &str, bool, &'static str)> {
    if let Some(cm) = &from.config_map_key_ref {
        return Some((
            Kind::ConfigMap,
            &cm.name,
            &cm.key,
            cm.optional == Some(true),
            "configMapKeyRef",
        ));
    }
    let secret = from.secret_key_ref.as_ref()?;
    Some((
        Kind::Secret,
        &secret.name,
        &secret.key,
        secret.optional == Some(true),
        "secretKeyRef",
    ))
}

/// A configMap's `data`, or a secret's `data` as text, as (key, value) pairs in key order.
fn object_data(
    objects: &PodObjects,
    kind: Kind,
    namespace: &str,
    name: &str,
) -> Result<Vec<(String, String)>, crate::kubelet::api_objects::ObjectError> {
    Ok(match kind {
        Kind::ConfigMap => objects
            .config_map(namespace, name)?
            .data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        Kind::Secret => objects
            .secret(namespace, name)?
            .data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), String::from_utf8_lossy(&v.0).into_owned()))
            .collect(),
    })
}

fn index_of(ordered: &[(String, String)], name: &str) -> Option<String> {
    ordered
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.clone())
}

/// Standalone: an `envFrom` source that is not optional cannot be resolved.
fn check_standalone_env_from(container: &Container) -> Result<(), TranslateError> {
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
    Ok(())
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
    use crate::base::podspec::resources::NodeAllocatable;
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
    fn under_pod_level_limits_a_container_without_its_own_reads_the_pods() {
        let node = NodeAllocatable {
            cpu_millis: 4000,
            memory_bytes: 8 * 1024 * 1024 * 1024,
            ephemeral_storage_bytes: 100_000_000_000,
        };
        let mut pod = test_pod();
        let pod_limits = resources(&[("cpu", "1500m"), ("memory", "0")], &[]);
        pod.spec.as_mut().unwrap().resources = pod_limits.resources;
        let own_memory = resources(&[("memory", "64Mi")], &[]);
        let cases: &[(&str, &Container, &str, &str)] = &[
            ("no cpu limit: the pod's", &own_memory, "limits.cpu", "1500"),
            (
                "its own memory limit wins",
                &own_memory,
                "limits.memory",
                "64",
            ),
            // A zero pod limit is as good as none: the node's amount.
            (
                "the pod's zero memory limit: the node's",
                &resources(&[], &[]),
                "limits.memory",
                "8192",
            ),
            (
                "ephemeral storage is not pod-level",
                &own_memory,
                "limits.ephemeral-storage",
                "100000000000",
            ),
        ];
        for (what, c, resource, want) in cases {
            let divisor = match *resource {
                "limits.cpu" => Some("1m"),
                "limits.memory" => Some("1Mi"),
                _ => None,
            };
            let got = resource_field_value(&pod, Some(c), &selector(resource, divisor), &node);
            assert_eq!(got.as_deref(), Ok(*want), "{what}");
        }
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

    fn objects() -> PodObjects {
        use crate::kubelet::api_objects::ObjectError;
        use k8s_openapi::ByteString;
        use k8s_openapi::api::core::v1::{ConfigMap, Secret};
        use std::sync::Arc;
        PodObjects {
            from_api: true,
            config_maps: BTreeMap::from([
                (
                    "app".to_string(),
                    Ok(Arc::new(ConfigMap {
                        data: Some(BTreeMap::from([
                            ("MODE".to_string(), "fast".to_string()),
                            ("1ST".to_string(), "ok".to_string()),
                            ("level".to_string(), "3".to_string()),
                        ])),
                        ..Default::default()
                    })),
                ),
                (
                    "gone".to_string(),
                    Err(ObjectError::NotFound {
                        kind: Kind::ConfigMap,
                        name: "gone".into(),
                    }),
                ),
            ]),
            secrets: BTreeMap::from([(
                "db".to_string(),
                Ok(Arc::new(Secret {
                    data: Some(BTreeMap::from([
                        ("password".to_string(), ByteString(b"hunter2".to_vec())),
                        ("bad=name".to_string(), ByteString(b"x".to_vec())),
                    ])),
                    ..Default::default()
                })),
            )]),
            tokens: BTreeMap::new(),
            service_env: None,
            ..Default::default()
        }
    }

    /// The service variables come after the container's own, which win over them, and
    /// `$(VAR)` sees them; until the Services are listed the container cannot be made.
    #[test]
    fn service_variables_follow_the_containers_own() {
        use crate::kubelet::api_objects::ObjectError;
        let mut with_services = objects();
        with_services.service_env = Some(Ok(BTreeMap::from([
            (
                "KUBERNETES_SERVICE_HOST".to_string(),
                "10.0.0.1".to_string(),
            ),
            ("MY_SVC_SERVICE_HOST".to_string(), "10.0.0.3".to_string()),
        ])));
        let container = c(serde_json::json!({"env": [
            {"name": "URL", "value": "https://$(KUBERNETES_SERVICE_HOST)"},
            {"name": "MY_SVC_SERVICE_HOST", "value": "mine"}
        ]}));
        let got = container_env_with(&test_pod(), &container, &ctx(), &with_services).unwrap();
        let vars: Vec<(&str, &str)> = got
            .vars
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            vars,
            [
                ("URL", "https://10.0.0.1"),
                ("MY_SVC_SERVICE_HOST", "mine"),
                ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
            ]
        );
        let mut not_listed = objects();
        not_listed.service_env = Some(Err(ObjectError::ServicesNotSynced));
        let err = container_env_with(&test_pod(), &container, &ctx(), &not_listed).unwrap_err();
        assert_eq!(
            err.to_string(),
            "services have not yet been read at least once, cannot construct envvars"
        );
    }

    fn from_api(container: &Container) -> Result<ResolvedEnv, TranslateError> {
        container_env_with(&test_pod(), container, &ctx(), &objects())
    }

    fn c(mut spec: serde_json::Value) -> Container {
        spec["name"] = "app".into();
        serde_json::from_value(spec).unwrap()
    }

    #[test]
    fn env_from_api_objects_in_upstreams_order() {
        let got = from_api(&c(serde_json::json!({
            "envFrom": [
                {"configMapRef": {"name": "app"}},
                {"secretRef": {"name": "db"}, "prefix": "DB_"},
                {"configMapRef": {"name": "gone", "optional": true}}
            ],
            "env": [
                {"name": "MODE", "value": "slow-$(level)"},
                {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}},
                {"name": "LVL", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "level"}}},
                {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "nope", "optional": true}}},
                {"name": "OPT2", "valueFrom": {"secretKeyRef": {"name": "gone-too", "key": "k", "optional": true}}}
            ]
        })));
        // "gone-too" was never fetched: an object the cache does not know is an error even
        // when optional (only "not found" is forgiven).
        assert!(matches!(got, Err(TranslateError::Object(_))), "{got:?}");

        let got = from_api(&c(serde_json::json!({
            "envFrom": [
                {"configMapRef": {"name": "app"}},
                {"secretRef": {"name": "db"}, "prefix": "DB_"},
                {"configMapRef": {"name": "gone", "optional": true}}
            ],
            "env": [
                {"name": "MODE", "value": "slow-$(level)"},
                {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}},
                {"name": "LVL", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "level"}}},
                {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "nope", "optional": true}}},
                {"name": "OPT2", "valueFrom": {"configMapKeyRef": {"name": "gone", "key": "k", "optional": true}}}
            ]
        })))
        .unwrap();
        let vars: Vec<(&str, &str)> = got
            .vars
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(
            vars,
            [
                ("1ST", "ok"),
                ("MODE", "slow-3"),
                ("level", "3"),
                ("DB_password", "hunter2"),
                ("PW", "hunter2"),
                ("LVL", "3"),
            ]
        );
        assert_eq!(got.skipped.len(), 1);
        assert_eq!(
            got.skipped[0].message(),
            "Keys [DB_bad=name] from the EnvFrom secret shop/db were skipped since they are considered invalid environment variable names."
        );
    }

    #[test]
    fn missing_objects_and_keys_use_upstreams_messages() {
        let rows = [
            (
                serde_json::json!({"env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "gone", "key": "k"}}}]}),
                "configmap \"gone\" not found",
            ),
            (
                serde_json::json!({"env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "k"}}}]}),
                "couldn't find key k in ConfigMap shop/app",
            ),
            (
                serde_json::json!({"env": [{"name": "X", "valueFrom": {"secretKeyRef": {"name": "db", "key": "user"}}}]}),
                "couldn't find key user in Secret shop/db",
            ),
            (
                serde_json::json!({"envFrom": [{"configMapRef": {"name": "gone"}}]}),
                "configmap \"gone\" not found",
            ),
        ];
        for (spec, want) in rows {
            let err = from_api(&c(spec.clone())).unwrap_err();
            assert_eq!(err.to_string(), want, "{spec}");
        }
        assert!(valid_env_name("my.env-name 1"));
        assert!(valid_env_name("1BAD"));
        assert!(!valid_env_name("a=b"));
        assert!(!valid_env_name(""));
        assert!(!valid_env_name("tab\there"));
        assert!(!valid_env_name("ünï"));
    }
}
