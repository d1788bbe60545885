//! Checks that protect the node from a malformed static pod. Not the API server's full
//! validation: the parts a node relies on, each reported with the field it concerns.

use std::collections::HashSet;
use std::fmt;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, DownwardAPIVolumeFile, KeyToPath, Pod, ResourceRequirements, Volume,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::base::podspec::{self, item_path, quantity};

#[path = "validate_security.rs"]
pub(crate) mod validate_security;

use self::validate_security::NodeSecurity;

/// One problem with one field, e.g. `spec.containers[1].name: duplicate name "app"`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct ValidationError {
    pub field: String,
    pub reason: String,
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

/// Join errors for a one-line message.
pub fn join_errors(errors: &[ValidationError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}

const DNS1123_LABEL_MAX: usize = 63;
/// Longest pod UID accepted. Generated UIDs are 32 (static pods) or 36 (UUIDs) characters;
/// the bound keeps `<namespace>_<name>_<uid>` directory names within reach of NAME_MAX.
pub const UID_MAX: usize = 128;
/// Largest file mode a volume may ask for (upstream: "between 0 and 0777, both inclusive").
pub const MAX_FILE_MODE: i32 = 0o777;
const DNS1123_SUBDOMAIN_MAX: usize = 253;

fn is_label_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-'
}

/// Why `value` is not a DNS-1123 label, or `None` if it is one.
pub fn dns1123_label_problem(value: &str) -> Option<String> {
    if value.is_empty() {
        return Some("must not be empty".into());
    }
    if value.len() > DNS1123_LABEL_MAX {
        return Some(format!(
            "must be no more than {DNS1123_LABEL_MAX} characters (is {})",
            value.len()
        ));
    }
    let ok = value.chars().all(is_label_char) && !value.starts_with('-') && !value.ends_with('-');
    if !ok {
        return Some(format!(
            "{value:?} is not a valid DNS-1123 label: lowercase letters, digits and '-', \
             starting and ending with a letter or digit"
        ));
    }
    None
}

/// Why `value` is not a DNS-1123 subdomain, or `None` if it is one.
pub fn dns1123_subdomain_problem(value: &str) -> Option<String> {
    if value.is_empty() {
        return Some("must not be empty".into());
    }
    if value.len() > DNS1123_SUBDOMAIN_MAX {
        return Some(format!(
            "must be no more than {DNS1123_SUBDOMAIN_MAX} characters (is {})",
            value.len()
        ));
    }
    let ok = value.split('.').all(|part| {
        !part.is_empty()
            && part.chars().all(is_label_char)
            && !part.starts_with('-')
            && !part.ends_with('-')
    });
    if !ok {
        return Some(format!(
            "{value:?} is not a valid DNS-1123 subdomain: lowercase letters, digits, '-' and \
             '.', each part starting and ending with a letter or digit"
        ));
    }
    None
}

/// Why `uid` cannot be a pod UID, or `None` if it can.
///
/// The UID becomes one path component of the pod's directory, its log directory and its
/// cgroup: only ASCII letters, digits, `-` and `_` are accepted, so no UID can hold a `/`,
/// be `.` or `..`, or carry anything a shell, systemd or the kernel treats specially.
/// Upstream accepts any string here; we do not.
pub fn uid_problem(uid: &str) -> Option<String> {
    if uid.is_empty() {
        return Some("must not be empty".into());
    }
    if uid.len() > UID_MAX {
        return Some(format!(
            "must be no more than {UID_MAX} characters (is {})",
            uid.len()
        ));
    }
    let ok = uid
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !ok {
        return Some(format!(
            "{uid:?} is not a safe UID: only ASCII letters, digits, '-' and '_' are allowed \
             (it names the pod's directories)"
        ));
    }
    None
}

/// The problems found so far, each with its field.
struct Errors(Vec<ValidationError>);

impl Errors {
    fn push(&mut self, field: impl Into<String>, reason: impl Into<String>) {
        self.0.push(ValidationError {
            field: field.into(),
            reason: reason.into(),
        });
    }
}

const RESTART_POLICIES: [&str; 3] = ["Always", "OnFailure", "Never"];
const DNS_POLICIES: [&str; 4] = ["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"];
const PROTOCOLS: [&str; 3] = ["TCP", "UDP", "SCTP"];
const PULL_POLICIES: [&str; 3] = ["Always", "IfNotPresent", "Never"];

/// Why a resource quantity is unusable, or `None`. CPU is used in millicores, everything
/// else in whole units; the amount must be non-negative and fit an i64 in that unit (an
/// amount that does not would silently saturate further on).
fn quantity_problem(resource: &str, raw: &Quantity) -> Option<String> {
    let q = match quantity::parse(&raw.0) {
        Ok(q) => q,
        Err(e) => return Some(format!("{:?} is not a quantity: {e}", raw.0)),
    };
    if q.is_negative() {
        return Some(format!("{:?} must not be negative", raw.0));
    }
    let fits = if resource == "cpu" {
        q.checked_milli_value().is_some()
    } else {
        q.checked_value().is_some()
    };
    if !fits {
        let unit = if resource == "cpu" {
            "millicores"
        } else {
            "units"
        };
        return Some(format!(
            "{:?} is too large (must fit in a 64-bit count of {unit})",
            raw.0
        ));
    }
    None
}

fn validate_quantities(map: Option<&BTreeMap<String, Quantity>>, field: &str, errors: &mut Errors) {
    for (name, raw) in map.into_iter().flatten() {
        if let Some(problem) = quantity_problem(name, raw) {
            errors.push(format!("{field}.{name}"), problem);
        }
    }
}

fn validate_resources(res: Option<&ResourceRequirements>, field: &str, errors: &mut Errors) {
    let Some(res) = res else { return };
    validate_quantities(res.limits.as_ref(), &format!("{field}.limits"), errors);
    validate_quantities(res.requests.as_ref(), &format!("{field}.requests"), errors);
}

/// A `resourceFieldRef` divisor is a quantity too (only its magnitude matters).
fn validate_divisor(divisor: Option<&Quantity>, field: &str, errors: &mut Errors) {
    if let Some(raw) = divisor.filter(|q| !q.0.is_empty())
        && let Some(problem) = quantity_problem("divisor", raw)
    {
        errors.push(field, problem);
    }
}

fn validate_mode(mode: Option<i32>, field: &str, errors: &mut Errors) {
    if let Some(mode) = mode
        && !(0..=MAX_FILE_MODE).contains(&mode)
    {
        errors.push(
            field,
            format!(
                "{mode} (0{mode:o}) must be a number between 0 and 0777 (octal), both inclusive"
            ),
        );
    }
}

/// A file's path in a volume: what the volume's writer would refuse at mount time is refused
/// here, naming the volume (see `base::podspec::item_path`).
fn validate_item_path(path: &str, field: &str, volume: &str, errors: &mut Errors) {
    if let Err(problem) = item_path::check_item_path(path) {
        errors.push(field, format!("volume {volume:?}: {problem}"));
    }
}

fn validate_key_items(
    items: Option<&Vec<KeyToPath>>,
    field: &str,
    volume: &str,
    errors: &mut Errors,
) {
    for (k, item) in items.into_iter().flatten().enumerate() {
        validate_mode(item.mode, &format!("{field}.items[{k}].mode"), errors);
        validate_item_path(
            &item.path,
            &format!("{field}.items[{k}].path"),
            volume,
            errors,
        );
    }
}

fn validate_downward_items(
    items: Option<&Vec<DownwardAPIVolumeFile>>,
    field: &str,
    volume: &str,
    errors: &mut Errors,
) {
    for (k, item) in items.into_iter().flatten().enumerate() {
        let itf = format!("{field}.items[{k}]");
        validate_mode(item.mode, &format!("{itf}.mode"), errors);
        validate_item_path(&item.path, &format!("{itf}.path"), volume, errors);
        if let Some(r) = &item.resource_field_ref {
            validate_divisor(
                r.divisor.as_ref(),
                &format!("{itf}.resourceFieldRef.divisor"),
                errors,
            );
        }
    }
}

/// File modes (`defaultMode`, `items[].mode`), file paths (`items[].path`, a token's or
/// bundle's `path`) and quantities (`sizeLimit`, divisors) of one volume.
fn validate_volume(v: &Volume, field: &str, errors: &mut Errors) {
    if let Some(secret) = &v.secret {
        validate_mode(
            secret.default_mode,
            &format!("{field}.secret.defaultMode"),
            errors,
        );
        validate_key_items(
            secret.items.as_ref(),
            &format!("{field}.secret"),
            &v.name,
            errors,
        );
    }
    if let Some(cm) = &v.config_map {
        validate_mode(
            cm.default_mode,
            &format!("{field}.configMap.defaultMode"),
            errors,
        );
        validate_key_items(
            cm.items.as_ref(),
            &format!("{field}.configMap"),
            &v.name,
            errors,
        );
    }
    if let Some(downward) = &v.downward_api {
        validate_mode(
            downward.default_mode,
            &format!("{field}.downwardAPI.defaultMode"),
            errors,
        );
        validate_downward_items(
            downward.items.as_ref(),
            &format!("{field}.downwardAPI"),
            &v.name,
            errors,
        );
    }
    if let Some(projected) = &v.projected {
        validate_mode(
            projected.default_mode,
            &format!("{field}.projected.defaultMode"),
            errors,
        );
        for (j, source) in projected.sources.iter().flatten().enumerate() {
            let sf = format!("{field}.projected.sources[{j}]");
            if let Some(secret) = &source.secret {
                validate_key_items(
                    secret.items.as_ref(),
                    &format!("{sf}.secret"),
                    &v.name,
                    errors,
                );
            }
            if let Some(cm) = &source.config_map {
                validate_key_items(
                    cm.items.as_ref(),
                    &format!("{sf}.configMap"),
                    &v.name,
                    errors,
                );
            }
            if let Some(downward) = &source.downward_api {
                validate_downward_items(
                    downward.items.as_ref(),
                    &format!("{sf}.downwardAPI"),
                    &v.name,
                    errors,
                );
            }
            if let Some(token) = &source.service_account_token {
                let tf = format!("{sf}.serviceAccountToken.path");
                validate_item_path(&token.path, &tf, &v.name, errors);
            }
            if let Some(bundle) = &source.cluster_trust_bundle {
                let bf = format!("{sf}.clusterTrustBundle.path");
                validate_item_path(&bundle.path, &bf, &v.name, errors);
            }
        }
    }
    if let Some(image) = &v.image {
        if image.reference.as_deref().unwrap_or_default().is_empty() {
            errors.push(format!("{field}.image.reference"), "required");
        }
        if let Some(policy) = image.pull_policy.as_deref()
            && !PULL_POLICIES.contains(&policy)
        {
            errors.push(
                format!("{field}.image.pullPolicy"),
                format!("{policy:?} is not one of {PULL_POLICIES:?}"),
            );
        }
    }
    if let Some(empty_dir) = &v.empty_dir
        && let Some(limit) = &empty_dir.size_limit
        && let Some(problem) = quantity_problem("sizeLimit", limit)
    {
        errors.push(format!("{field}.emptyDir.sizeLimit"), problem);
    }
}

/// Upstream's rule for mounts of image volumes: a `subPath` is a path inside the image (the
/// runtime checks it), a `subPathExpr` is refused.
fn validate_image_mounts(spec: &k8s_openapi::api::core::v1::PodSpec, errors: &mut Errors) {
    let images: HashSet<&str> = spec
        .volumes
        .iter()
        .flatten()
        .filter(|v| v.image.is_some())
        .map(|v| v.name.as_str())
        .collect();
    if images.is_empty() {
        return;
    }
    let containers = [
        (
            "initContainers",
            spec.init_containers.as_deref().unwrap_or_default(),
        ),
        ("containers", spec.containers.as_slice()),
    ];
    for (kind, list) in containers {
        for (i, c) in list.iter().enumerate() {
            for (j, m) in c.volume_mounts.iter().flatten().enumerate() {
                if let Some(expr) = m.sub_path_expr.as_deref().filter(|e| !e.is_empty())
                    && images.contains(m.name.as_str())
                {
                    errors.push(
                        format!("spec.{kind}[{i}].volumeMounts[{j}].subPathExpr"),
                        format!("{expr:?}: not allowed in image volume sources"),
                    );
                }
            }
        }
    }
}

fn validate_container(
    c: &Container,
    field: &str,
    names: &mut HashSet<String>,
    errors: &mut Errors,
) {
    validate_resources(c.resources.as_ref(), &format!("{field}.resources"), errors);
    for (j, var) in c.env.iter().flatten().enumerate() {
        if let Some(r) = var
            .value_from
            .as_ref()
            .and_then(|f| f.resource_field_ref.as_ref())
        {
            validate_divisor(
                r.divisor.as_ref(),
                &format!("{field}.env[{j}].valueFrom.resourceFieldRef.divisor"),
                errors,
            );
        }
    }
    match dns1123_label_problem(&c.name) {
        Some(problem) => errors.push(format!("{field}.name"), problem),
        None => {
            if !names.insert(c.name.clone()) {
                errors.push(
                    format!("{field}.name"),
                    format!("duplicate container name {:?}", c.name),
                );
            }
        }
    }
    if c.image.as_deref().unwrap_or_default().trim().is_empty() {
        errors.push(format!("{field}.image"), "required");
    }
    if let Some(policy) = c.image_pull_policy.as_deref()
        && !PULL_POLICIES.contains(&policy)
    {
        errors.push(
            format!("{field}.imagePullPolicy"),
            format!("{policy:?} is not one of {PULL_POLICIES:?}"),
        );
    }
    for (j, port) in c.ports.iter().flatten().enumerate() {
        let pf = format!("{field}.ports[{j}]");
        if !(1..=65535).contains(&port.container_port) {
            errors.push(
                format!("{pf}.containerPort"),
                format!("{} is not between 1 and 65535", port.container_port),
            );
        }
        if let Some(host_port) = port.host_port
            && !(0..=65535).contains(&host_port)
        {
            errors.push(
                format!("{pf}.hostPort"),
                format!("{host_port} is not between 0 and 65535"),
            );
        }
        if let Some(protocol) = port.protocol.as_deref()
            && !PROTOCOLS.contains(&protocol)
        {
            errors.push(
                format!("{pf}.protocol"),
                format!("{protocol:?} is not one of {PROTOCOLS:?}"),
            );
        }
    }
}

/// Validate a pod after defaults and static-pod conventions were applied. Returns every
/// problem found, not just the first.
pub fn validate_pod(pod: &Pod, node: &NodeSecurity) -> Result<(), Vec<ValidationError>> {
    let mut errors = Errors(Vec::new());
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    if let Some(problem) = dns1123_subdomain_problem(name) {
        errors.push("metadata.name", problem);
    }
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    if let Some(problem) = dns1123_label_problem(namespace) {
        errors.push("metadata.namespace", problem);
    }
    // Name and namespace are DNS names (no '/', never "." or ".."), so they are safe path
    // parts already; the UID is checked here because a manifest may set it.
    if let Some(problem) = uid_problem(pod.metadata.uid.as_deref().unwrap_or_default()) {
        errors.push("metadata.uid", problem);
    }
    let Some(spec) = pod.spec.as_ref() else {
        errors.push("spec", "required");
        return Err(errors.0);
    };
    if spec.containers.is_empty() {
        errors.push("spec.containers", "must have at least one container");
    }
    let mut names = HashSet::new();
    for (i, c) in spec.init_containers.iter().flatten().enumerate() {
        validate_container(
            c,
            &format!("spec.initContainers[{i}]"),
            &mut names,
            &mut errors,
        );
    }
    for (i, c) in spec.containers.iter().enumerate() {
        validate_container(c, &format!("spec.containers[{i}]"), &mut names, &mut errors);
    }
    for (i, c) in spec.ephemeral_containers.iter().flatten().enumerate() {
        validate_resources(
            c.resources.as_ref(),
            &format!("spec.ephemeralContainers[{i}].resources"),
            &mut errors,
        );
    }
    validate_resources(spec.resources.as_ref(), "spec.resources", &mut errors);
    validate_quantities(spec.overhead.as_ref(), "spec.overhead", &mut errors);
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        validate_volume(v, &format!("spec.volumes[{i}]"), &mut errors);
    }
    validate_image_mounts(spec, &mut errors);
    if let Some(policy) = spec.restart_policy.as_deref()
        && !RESTART_POLICIES.contains(&policy)
    {
        errors.push(
            "spec.restartPolicy",
            format!("{policy:?} is not one of {RESTART_POLICIES:?}"),
        );
    }
    if let Some(policy) = spec.dns_policy.as_deref()
        && !DNS_POLICIES.contains(&policy)
    {
        errors.push(
            "spec.dnsPolicy",
            format!("{policy:?} is not one of {DNS_POLICIES:?}"),
        );
    }
    if let Some(grace) = spec.termination_grace_period_seconds
        && grace < 0
    {
        errors.push(
            "spec.terminationGracePeriodSeconds",
            format!("{grace} must not be negative"),
        );
    }
    errors
        .0
        .extend(validate_security::validate_pod_security(pod, node));
    if errors.0.is_empty() {
        Ok(())
    } else {
        Err(errors.0)
    }
}

/// A volume [`api_object_reference`] cannot tell the API objects of.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ApiReferenceError {
    #[error("unknown source for projected volume {volume:?}")]
    UnknownProjectedSource { volume: String },
    #[error("unknown volume type for volume {volume:?}")]
    UnknownVolumeType { volume: String },
}

/// Upstream's `HasAPIObjectReference`, in its order: the first kind of API object the pod
/// refers to, as the plural resource upstream names it (`serviceaccounts`, `secrets`,
/// `configmaps`, `resourceclaims`, then by volume: `persistentvolumeclaims`,
/// `csidrivers (via CSI volumes)`, …), or `Ok(None)`. A volume of no known type is an error,
/// since what it refers to cannot be told.
pub fn api_object_reference(pod: &Pod) -> Result<Option<&'static str>, ApiReferenceError> {
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(None);
    };
    // `serviceAccount` is the deprecated spelling of `serviceAccountName`.
    let account = [&spec.service_account_name, &spec.service_account];
    if account
        .iter()
        .any(|a| a.as_deref().is_some_and(|a| !a.is_empty()))
    {
        return Ok(Some("serviceaccounts"));
    }
    let volumes = spec.volumes.as_deref().unwrap_or_default();
    let envs = podspec::spec_init_and_app_containers(spec)
        .map(|c| (c.env.as_deref(), c.env_from.as_deref()))
        .chain(
            spec.ephemeral_containers
                .iter()
                .flatten()
                .map(|c| (c.env.as_deref(), c.env_from.as_deref())),
        );
    let (mut secrets, mut config_maps) = (false, false);
    for (env, env_from) in envs {
        for e in env.unwrap_or_default() {
            let from = e.value_from.as_ref();
            secrets |= from.is_some_and(|f| f.secret_key_ref.is_some());
            config_maps |= from.is_some_and(|f| f.config_map_key_ref.is_some());
        }
        for e in env_from.unwrap_or_default() {
            secrets |= e.secret_ref.is_some();
            config_maps |= e.config_map_ref.is_some();
        }
    }
    secrets |= spec
        .image_pull_secrets
        .as_ref()
        .is_some_and(|s| !s.is_empty());
    for v in volumes {
        let projected = v.projected.as_ref().and_then(|p| p.sources.as_deref());
        secrets |= v.secret.is_some()
            || v.cephfs.as_ref().is_some_and(|x| x.secret_ref.is_some())
            || v.cinder.as_ref().is_some_and(|x| x.secret_ref.is_some())
            || v.flex_volume
                .as_ref()
                .is_some_and(|x| x.secret_ref.is_some())
            || v.rbd.as_ref().is_some_and(|x| x.secret_ref.is_some())
            || v.iscsi.as_ref().is_some_and(|x| x.secret_ref.is_some())
            || v.storageos.as_ref().is_some_and(|x| x.secret_ref.is_some())
            || v.csi
                .as_ref()
                .is_some_and(|x| x.node_publish_secret_ref.is_some())
            || v.scale_io.is_some()
            || v.azure_file
                .as_ref()
                .is_some_and(|x| !x.secret_name.is_empty())
            || projected.is_some_and(|ps| ps.iter().any(|p| p.secret.is_some()));
        config_maps |= v.config_map.is_some()
            || projected.is_some_and(|ps| ps.iter().any(|p| p.config_map.is_some()));
    }
    if secrets {
        return Ok(Some("secrets"));
    }
    if config_maps {
        return Ok(Some("configmaps"));
    }
    if spec.resource_claims.as_ref().is_some_and(|c| !c.is_empty()) {
        return Ok(Some("resourceclaims"));
    }
    for v in volumes {
        let without_api = v.aws_elastic_block_store.is_some()
            || v.azure_disk.is_some()
            || v.cephfs.is_some()
            || v.cinder.is_some()
            || v.downward_api.is_some()
            || v.empty_dir.is_some()
            || v.fc.is_some()
            || v.flex_volume.is_some()
            || v.flocker.is_some()
            || v.gce_persistent_disk.is_some()
            || v.git_repo.is_some()
            || v.host_path.is_some()
            || v.image.is_some()
            || v.iscsi.is_some()
            || v.nfs.is_some()
            || v.photon_persistent_disk.is_some()
            || v.portworx_volume.is_some()
            || v.quobyte.is_some()
            || v.rbd.is_some()
            || v.scale_io.is_some()
            || v.storageos.is_some()
            || v.vsphere_volume.is_some();
        let found = if without_api {
            continue;
        } else if v.config_map.is_some() {
            "configmaps (via configmap volumes)"
        } else if v.secret.is_some() {
            "secrets (via secret volumes)"
        } else if v.csi.is_some() {
            "csidrivers (via CSI volumes)"
        } else if v.glusterfs.is_some() {
            "endpoints (via glusterFS volumes)"
        } else if v.persistent_volume_claim.is_some() {
            "persistentvolumeclaims"
        } else if v.ephemeral.is_some() {
            "persistentvolumeclaims (via ephemeral volumes)"
        } else if v.azure_file.is_some() {
            "secrets (via azureFile volumes)"
        } else if let Some(projected) = &v.projected {
            let mut found = None;
            for p in projected.sources.iter().flatten() {
                found = if p.config_map.is_some() {
                    Some("configmaps (via projected volumes)")
                } else if p.secret.is_some() {
                    Some("secrets (via projected volumes)")
                } else if p.service_account_token.is_some() {
                    Some("serviceaccounts (via projected volumes)")
                } else if p.cluster_trust_bundle.is_some() {
                    Some("clustertrustbundles")
                } else if p.downward_api.is_some() {
                    continue;
                } else {
                    return Err(ApiReferenceError::UnknownProjectedSource {
                        volume: v.name.clone(),
                    });
                };
                break;
            }
            match found {
                Some(found) => found,
                None => continue,
            }
        } else {
            return Err(ApiReferenceError::UnknownVolumeType {
                volume: v.name.clone(),
            });
        };
        return Ok(Some(found));
    }
    Ok(None)
}

/// Why a static pod is refused for referring to API objects, in upstream's words
/// (`static pods may not reference secrets`), or `None`. A static pod is run before, and
/// without, the API server: what it refers to there could not be had, and the node may not
/// create a mirror pod that refers to it (NodeRestriction). Upstream refuses such manifests
/// since 1.34 (`PreventStaticPodAPIReferences`).
pub fn static_pod_api_refusal(pod: &Pod) -> Option<String> {
    match api_object_reference(pod) {
        Ok(None) => None,
        Ok(Some(resource)) => Some(format!("static pods may not reference {resource}")),
        Err(e) => Some(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        crate::base::yaml::from_str(yaml).unwrap()
    }

    fn fields(result: Result<(), Vec<ValidationError>>) -> Vec<String> {
        result
            .err()
            .unwrap_or_default()
            .into_iter()
            .map(|e| e.field)
            .collect()
    }

    const OK: &str = "
metadata: {name: web-node, namespace: default, uid: u1}
spec:
  restartPolicy: Always
  initContainers: [{name: init, image: busybox}]
  containers:
  - name: app
    image: nginx
    ports: [{containerPort: 80, hostPort: 8080, protocol: TCP}]
";

    /// (what, spec, upstream's refusal or None)
    #[test]
    fn static_pods_referring_to_api_objects_are_refused_in_upstreams_words() {
        let rows: &[(&str, &str, Option<&str>)] = &[
            (
                "nothing",
                "{containers: [{name: a, image: i}], volumes: [{name: v, emptyDir: {}}, {name: h, hostPath: {path: /x}}, {name: d, downwardAPI: {items: []}}, {name: p, projected: {sources: [{downwardAPI: {items: []}}]}}]}",
                None,
            ),
            (
                "a service account",
                "{serviceAccountName: sa, containers: [{name: a, image: i}]}",
                Some("static pods may not reference serviceaccounts"),
            ),
            (
                "the deprecated field",
                "{serviceAccount: sa, containers: [{name: a, image: i}]}",
                Some("static pods may not reference serviceaccounts"),
            ),
            (
                "a secret volume",
                "{containers: [{name: a, image: i}], volumes: [{name: s, secret: {secretName: s}}]}",
                Some("static pods may not reference secrets"),
            ),
            (
                "an env var from a secret",
                "{containers: [{name: a, image: i, env: [{name: E, valueFrom: {secretKeyRef: {name: s, key: k}}}]}]}",
                Some("static pods may not reference secrets"),
            ),
            (
                "envFrom a config map in an init container",
                "{initContainers: [{name: a, image: i, envFrom: [{configMapRef: {name: c}}]}], containers: [{name: b, image: i}]}",
                Some("static pods may not reference configmaps"),
            ),
            (
                "image pull secrets",
                "{imagePullSecrets: [{name: r}], containers: [{name: a, image: i}]}",
                Some("static pods may not reference secrets"),
            ),
            (
                "secrets come before config maps",
                "{containers: [{name: a, image: i}], volumes: [{name: c, configMap: {name: c}}, {name: s, secret: {secretName: s}}]}",
                Some("static pods may not reference secrets"),
            ),
            (
                "a projected config map",
                "{containers: [{name: a, image: i}], volumes: [{name: p, projected: {sources: [{configMap: {name: c}}]}}]}",
                Some("static pods may not reference configmaps"),
            ),
            (
                "resource claims",
                "{resourceClaims: [{name: gpu, resourceClaimName: c}], containers: [{name: a, image: i}]}",
                Some("static pods may not reference resourceclaims"),
            ),
            (
                "a PVC",
                "{containers: [{name: a, image: i}], volumes: [{name: v, persistentVolumeClaim: {claimName: c}}]}",
                Some("static pods may not reference persistentvolumeclaims"),
            ),
            (
                "an ephemeral volume",
                "{containers: [{name: a, image: i}], volumes: [{name: v, ephemeral: {}}]}",
                Some(
                    "static pods may not reference persistentvolumeclaims (via ephemeral volumes)",
                ),
            ),
            (
                "a CSI volume",
                "{containers: [{name: a, image: i}], volumes: [{name: v, csi: {driver: d}}]}",
                Some("static pods may not reference csidrivers (via CSI volumes)"),
            ),
            (
                "a token",
                "{containers: [{name: a, image: i}], volumes: [{name: p, projected: {sources: [{downwardAPI: {items: []}}, {serviceAccountToken: {path: t}}]}}]}",
                Some("static pods may not reference serviceaccounts (via projected volumes)"),
            ),
            (
                "a cluster trust bundle",
                "{containers: [{name: a, image: i}], volumes: [{name: p, projected: {sources: [{clusterTrustBundle: {path: b, name: n}}]}}]}",
                Some("static pods may not reference clustertrustbundles"),
            ),
            (
                "a volume of no known type",
                "{containers: [{name: a, image: i}], volumes: [{name: odd}]}",
                Some("unknown volume type for volume \"odd\""),
            ),
        ];
        for (what, spec, want) in rows {
            let p = pod(&format!("metadata: {{name: p}}\nspec: {spec}\n"));
            assert_eq!(static_pod_api_refusal(&p).as_deref(), *want, "{what}");
        }
    }

    #[test]
    fn image_volumes_need_a_reference_a_known_policy_and_no_sub_path_expr() {
        let p = pod(
            "metadata: {name: a, namespace: default, uid: u1}\nspec:\n  \
             initContainers: [{name: i, image: x, volumeMounts: [{name: img, mountPath: /i, subPathExpr: $(X)}]}]\n  \
             containers: [{name: c, image: x, volumeMounts: [{name: img, mountPath: /a, subPath: etc}, \
             {name: e, mountPath: /e, subPathExpr: $(X)}, {name: bad, mountPath: /b}]}]\n  \
             volumes: [{name: img, image: {reference: busybox, pullPolicy: Always}}, {name: e, emptyDir: {}}, \
             {name: bad, image: {pullPolicy: Sometimes}}]\n",
        );
        assert_eq!(
            fields(validate_pod(&p, &NodeSecurity::default())),
            [
                "spec.volumes[2].image.reference",
                "spec.volumes[2].image.pullPolicy",
                "spec.initContainers[0].volumeMounts[0].subPathExpr",
            ]
        );
        let errors = validate_pod(&p, &NodeSecurity::default()).unwrap_err();
        assert_eq!(
            errors[2].to_string(),
            "spec.initContainers[0].volumeMounts[0].subPathExpr: \"$(X)\": not allowed in image volume sources"
        );
    }

    #[test]
    fn good_pod_passes() {
        assert_eq!(validate_pod(&pod(OK), &NodeSecurity::default()), Ok(()));
    }

    #[test]
    fn table() {
        let cases: &[(&str, &str, &[&str])] = &[
            (
                "missing containers",
                "metadata: {name: a, namespace: default, uid: u1}\nspec: {containers: []}\n",
                &["spec.containers"],
            ),
            (
                "no spec",
                "metadata: {name: a, namespace: default, uid: u1}\n",
                &["spec"],
            ),
            (
                "duplicate across init and app",
                "metadata: {name: a, namespace: default, uid: u1}\nspec:\n  initContainers: [{name: app, image: x}]\n  containers: [{name: app, image: x}]\n",
                &["spec.containers[0].name"],
            ),
            (
                "duplicate app names",
                "metadata: {name: a, namespace: default, uid: u1}\nspec:\n  containers: [{name: app, image: x}, {name: app, image: y}]\n",
                &["spec.containers[1].name"],
            ),
            (
                "invalid pod name",
                "metadata: {name: Web_1, namespace: default, uid: u1}\nspec: {containers: [{name: a, image: x}]}\n",
                &["metadata.name"],
            ),
            (
                "invalid namespace",
                "metadata: {name: a, namespace: kube.system, uid: u1}\nspec: {containers: [{name: a, image: x}]}\n",
                &["metadata.namespace"],
            ),
            (
                "invalid container name and missing image",
                "metadata: {name: a, namespace: default, uid: u1}\nspec: {containers: [{name: App}]}\n",
                &["spec.containers[0].name", "spec.containers[0].image"],
            ),
            (
                "bad ports",
                "metadata: {name: a, namespace: default, uid: u1}\nspec: {containers: [{name: a, image: x, ports: [{containerPort: 0}, {containerPort: 70000, hostPort: 70000, protocol: ICMP}]}]}\n",
                &[
                    "spec.containers[0].ports[0].containerPort",
                    "spec.containers[0].ports[1].containerPort",
                    "spec.containers[0].ports[1].hostPort",
                    "spec.containers[0].ports[1].protocol",
                ],
            ),
            (
                "bad restart and dns policy",
                "metadata: {name: a, namespace: default, uid: u1}\nspec: {restartPolicy: Sometimes, dnsPolicy: Magic, containers: [{name: a, image: x}]}\n",
                &["spec.restartPolicy", "spec.dnsPolicy"],
            ),
        ];
        for (what, yaml, want) in cases {
            assert_eq!(
                fields(validate_pod(&pod(yaml), &NodeSecurity::default())),
                *want,
                "{what}"
            );
        }
    }

    #[test]
    fn name_length_limits() {
        let long = "a".repeat(254);
        assert!(dns1123_subdomain_problem(&long).is_some());
        assert!(dns1123_subdomain_problem(&"a".repeat(253)).is_none());
        assert!(dns1123_label_problem(&"a".repeat(64)).is_some());
        assert!(dns1123_label_problem(&"a".repeat(63)).is_none());
        assert!(dns1123_subdomain_problem("a..b").is_some());
        assert!(dns1123_subdomain_problem("kube-apiserver.node-1").is_none());
    }

    #[test]
    fn uid_must_be_one_safe_path_component() {
        let good = [
            "3f2a9c0d8e7b6a5f4e3d2c1b0a998877",
            "123e4567-e89b-12d3-a456-426614174000",
            "my_static_pod-1",
            "A",
        ];
        for uid in good {
            assert_eq!(uid_problem(uid), None, "{uid}");
        }
        let long = "a".repeat(UID_MAX + 1);
        let bad = [
            "",
            ".",
            "..",
            "x/../../../../tmp/victim",
            "/etc",
            "a/b",
            "a\\b",
            "a.b",
            "a b",
            "a\u{0}b",
            "a\nb",
            "ü",
            "$(reboot)",
            long.as_str(),
        ];
        for uid in bad {
            assert!(uid_problem(uid).is_some(), "{uid:?} was accepted");
        }
        // Names and namespaces are DNS names: none of them can be a path step either.
        for step in [".", "..", "a/b", "../x", "a/../b", "/x", ""] {
            assert!(dns1123_subdomain_problem(step).is_some(), "{step:?}");
            assert!(dns1123_label_problem(step).is_some(), "{step:?}");
        }
        let p = pod(
            "metadata: {name: a, namespace: default, uid: x/../../../../tmp/victim}\nspec: {containers: [{name: a, image: x}]}\n",
        );
        assert_eq!(
            fields(validate_pod(&p, &NodeSecurity::default())),
            ["metadata.uid"]
        );
        let mut p = pod(OK);
        p.metadata.uid = None;
        assert_eq!(
            fields(validate_pod(&p, &NodeSecurity::default())),
            ["metadata.uid"]
        );
    }

    #[test]
    fn quantities_that_do_not_fit_are_rejected_with_their_field() {
        let yaml = r#"
metadata: {name: a, namespace: default, uid: u1}
spec:
  overhead: {cpu: "1e40"}
  resources: {limits: {memory: 16Ei}}
  initContainers:
  - name: i
    image: x
    resources: {requests: {cpu: "-1"}}
  containers:
  - name: a
    image: x
    resources:
      limits: {cpu: "1e2147483647", memory: "1e19", ephemeral-storage: "9223372036854775807"}
      requests: {cpu: "9223372036854775807", memory: lots}
    env:
    - name: E
      valueFrom: {resourceFieldRef: {resource: limits.cpu, divisor: "1e99"}}
  volumes:
  - name: e
    emptyDir: {sizeLimit: 99999999999999999999Ei}
"#;
        assert_eq!(
            fields(validate_pod(&pod(yaml), &NodeSecurity::default())),
            [
                "spec.initContainers[0].resources.requests.cpu",
                "spec.containers[0].resources.limits.cpu",
                "spec.containers[0].resources.limits.memory",
                "spec.containers[0].resources.requests.cpu",
                "spec.containers[0].resources.requests.memory",
                "spec.containers[0].env[0].valueFrom.resourceFieldRef.divisor",
                "spec.resources.limits.memory",
                "spec.overhead.cpu",
                "spec.volumes[0].emptyDir.sizeLimit",
            ]
        );
        // The largest amounts that still fit pass.
        let fits = r#"
metadata: {name: a, namespace: default, uid: u1}
spec:
  containers:
  - name: a
    image: x
    resources:
      limits: {cpu: 9223372036854775807m, memory: 7Ei, ephemeral-storage: "9223372036854775807"}
"#;
        assert_eq!(validate_pod(&pod(fits), &NodeSecurity::default()), Ok(()));
        let err = validate_pod(&pod(yaml), &NodeSecurity::default()).unwrap_err();
        assert!(
            err[1].reason.contains("too large") && err[1].reason.contains("millicores"),
            "{err:?}"
        );
    }

    #[test]
    fn item_paths_the_volume_writer_refuses_are_refused_naming_volume_and_item() {
        let yaml = "
metadata: {name: a, namespace: default, uid: u1}
spec:
  containers: [{name: a, image: x}]
  volumes:
  - name: s
    secret: {secretName: s, items: [{key: k, path: ok/fine}, {key: l, path: ./..data/x}]}
  - name: c
    configMap: {name: c, items: [{key: k, path: /etc/passwd}]}
  - name: d
    downwardAPI: {items: [{path: a/../../x, fieldRef: {fieldPath: metadata.name}}]}
  - name: p
    projected:
      sources:
      - secret: {name: s, items: [{key: k, path: ..data}]}
      - configMap: {name: c, items: [{key: k, path: ''}]}
      - downwardAPI: {items: [{path: .//..data_tmp, fieldRef: {fieldPath: metadata.name}}]}
      - serviceAccountToken: {path: ./..2024_01_01_00_00_00.1}
      - clusterTrustBundle: {path: ../b, name: n, optional: true}
";
        let err = validate_pod(&pod(yaml), &NodeSecurity::default()).unwrap_err();
        let got: Vec<(&str, &str)> = err
            .iter()
            .map(|e| (e.field.as_str(), e.reason.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (
                    "spec.volumes[0].secret.items[1].path",
                    "volume \"s\": invalid path: must not start with '..' once cleaned \
                     (..data/x): ./..data/x; names starting with '..' belong to the volume's \
                     writer"
                ),
                (
                    "spec.volumes[1].configMap.items[0].path",
                    "volume \"c\": invalid path: must be relative path: /etc/passwd"
                ),
                (
                    "spec.volumes[2].downwardAPI.items[0].path",
                    "volume \"d\": invalid path: must not contain '..': a/../../x"
                ),
                (
                    "spec.volumes[3].projected.sources[0].secret.items[0].path",
                    "volume \"p\": invalid path: must not start with '..': ..data"
                ),
                (
                    "spec.volumes[3].projected.sources[1].configMap.items[0].path",
                    "volume \"p\": invalid path: must not be empty"
                ),
                (
                    "spec.volumes[3].projected.sources[2].downwardAPI.items[0].path",
                    "volume \"p\": invalid path: must not start with '..' once cleaned \
                     (..data_tmp): .//..data_tmp; names starting with '..' belong to the \
                     volume's writer"
                ),
                (
                    "spec.volumes[3].projected.sources[3].serviceAccountToken.path",
                    "volume \"p\": invalid path: must not start with '..' once cleaned \
                     (..2024_01_01_00_00_00.1): ./..2024_01_01_00_00_00.1; names starting \
                     with '..' belong to the volume's writer"
                ),
                (
                    "spec.volumes[3].projected.sources[4].clusterTrustBundle.path",
                    "volume \"p\": invalid path: must not contain '..': ../b"
                ),
            ]
        );
    }

    #[test]
    fn volume_file_modes_must_be_between_0_and_0777() {
        let yaml = "
metadata: {name: a, namespace: default, uid: u1}
spec:
  containers: [{name: a, image: x}]
  volumes:
  - name: s
    secret: {secretName: s, defaultMode: 512, items: [{key: k, path: p, mode: -1}]}
  - name: c
    configMap: {name: c, defaultMode: 511, items: [{key: k, path: p, mode: 4096}]}
  - name: d
    downwardAPI: {defaultMode: 2147483647, items: [{path: p, mode: 1024, fieldRef: {fieldPath: metadata.name}}]}
  - name: p
    projected:
      defaultMode: 1000
      sources:
      - secret: {name: s, items: [{key: k, path: p, mode: 777}]}
      - configMap: {name: c, items: [{key: k, path: p, mode: 420}]}
      - downwardAPI: {items: [{path: p, mode: -2147483648, fieldRef: {fieldPath: metadata.name}}]}
";
        assert_eq!(
            fields(validate_pod(&pod(yaml), &NodeSecurity::default())),
            [
                "spec.volumes[0].secret.defaultMode",
                "spec.volumes[0].secret.items[0].mode",
                "spec.volumes[1].configMap.items[0].mode",
                "spec.volumes[2].downwardAPI.defaultMode",
                "spec.volumes[2].downwardAPI.items[0].mode",
                "spec.volumes[3].projected.defaultMode",
                "spec.volumes[3].projected.sources[0].secret.items[0].mode",
                "spec.volumes[3].projected.sources[2].downwardAPI.items[0].mode",
            ]
        );
        let err = validate_pod(&pod(yaml), &NodeSecurity::default()).unwrap_err();
        assert_eq!(
            err[0].reason,
            "512 (01000) must be a number between 0 and 0777 (octal), both inclusive"
        );
    }
}
