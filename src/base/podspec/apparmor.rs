//! A container's AppArmor profile as its pod asks for it: the `appArmorProfile` field (the
//! container's own, else the pod's), else upstream's deprecated annotation
//! `container.apparmor.security.beta.kubernetes.io/<container>`. Validation (the sources,
//! refusing a bad setting when the pod is loaded) and translation (the runtime manager, passing
//! the profile to CRI) read the same answer from here.

use k8s_openapi::api::core::v1::{AppArmorProfile, Container, Pod};
use thiserror::Error;

/// Upstream's annotation prefix for a container's AppArmor profile (deprecated by the
/// `appArmorProfile` field, still honoured when the field is unset).
pub(crate) const APPARMOR_ANNOTATION_PREFIX: &str =
    "container.apparmor.security.beta.kubernetes.io/";

/// The profile a container asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum AppArmor {
    RuntimeDefault,
    Unconfined,
    /// A profile loaded on the node, by name.
    Localhost(String),
}

impl AppArmor {
    /// The deprecated string form (`runtime/default`, `unconfined`, `localhost/<name>`) that
    /// older runtimes read.
    pub(crate) fn deprecated_form(&self) -> String {
        match self {
            AppArmor::RuntimeDefault => "runtime/default".into(),
            AppArmor::Unconfined => "unconfined".into(),
            AppArmor::Localhost(name) => format!("localhost/{name}"),
        }
    }
}

/// Why an AppArmor setting cannot be passed on.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub(crate) enum AppArmorError {
    #[error("unsupported appArmorProfile type {0:?} (RuntimeDefault, Unconfined or Localhost)")]
    BadType(String),
    #[error("appArmorProfile type Localhost needs localhostProfile")]
    NoLocalhostProfile,
    #[error(
        "annotation {key}: unsupported value {value:?} (runtime/default, unconfined or localhost/<profile>)"
    )]
    BadAnnotation { key: String, value: String },
}

fn from_field(p: &AppArmorProfile) -> Result<AppArmor, AppArmorError> {
    match p.type_.as_str() {
        "RuntimeDefault" => Ok(AppArmor::RuntimeDefault),
        "Unconfined" => Ok(AppArmor::Unconfined),
        "Localhost" => p
            .localhost_profile
            .clone()
            .filter(|n| !n.is_empty())
            .map(AppArmor::Localhost)
            .ok_or(AppArmorError::NoLocalhostProfile),
        other => Err(AppArmorError::BadType(other.to_string())),
    }
}

fn from_annotation(key: &str, value: &str) -> Result<AppArmor, AppArmorError> {
    match value {
        "runtime/default" => Ok(AppArmor::RuntimeDefault),
        "unconfined" => Ok(AppArmor::Unconfined),
        v => v
            .strip_prefix("localhost/")
            .filter(|n| !n.is_empty())
            .map(|name| AppArmor::Localhost(name.to_string()))
            .ok_or_else(|| AppArmorError::BadAnnotation {
                key: key.to_string(),
                value: value.to_string(),
            }),
    }
}

/// The container's AppArmor profile: its own field, else the pod's, else the annotation;
/// `None` leaves the runtime's default in place, as upstream.
pub(crate) fn apparmor_profile(
    pod: &Pod,
    c: &Container,
) -> Result<Option<AppArmor>, AppArmorError> {
    let field = c
        .security_context
        .as_ref()
        .and_then(|s| s.app_armor_profile.as_ref())
        .or_else(|| {
            pod.spec
                .as_ref()
                .and_then(|s| s.security_context.as_ref())
                .and_then(|s| s.app_armor_profile.as_ref())
        });
    if let Some(p) = field {
        return from_field(p).map(Some);
    }
    let key = format!("{APPARMOR_ANNOTATION_PREFIX}{}", c.name);
    match pod.metadata.annotations.as_ref().and_then(|a| a.get(&key)) {
        Some(value) => from_annotation(&key, value).map(Some),
        None => Ok(None),
    }
}

/// Whether the pod needs the node to enforce AppArmor: some container asks for a profile
/// other than `Unconfined` (upstream refuses such a pod on a node without AppArmor).
#[cfg(test)]
pub(crate) fn requires_apparmor(pod: &Pod) -> bool {
    super::pod::init_and_app_containers(pod).any(|c| match apparmor_profile(pod, c) {
        Ok(Some(a)) => a != AppArmor::Unconfined,
        Ok(None) => false,
        // A malformed setting is reported by validation on its own.
        Err(_) => true,
    })
}

/// A non-empty relative path that stays below its base (no `..` part), as upstream requires
/// of `localhostProfile` (seccomp's and AppArmor's alike).
pub(crate) fn is_local_descending_path(path: &str) -> bool {
    use std::path::Component;
    !path.is_empty()
        && std::path::Path::new(path)
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}
