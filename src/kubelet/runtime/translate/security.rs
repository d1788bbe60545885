//! The security settings of a container as the runtime gets them, and the checks upstream's
//! kubelet makes at container start.
//!
//! Every `securityContext` field ends up in one of three places: here (passed to the runtime),
//! in `source::validate_security` (refused when the pod is loaded, with the field named), or in
//! the volume manager (`fsGroup` ownership, `fsGroupChangePolicy`). Nothing is dropped.

use k8s_openapi::api::core::v1::{Container, Pod, PodSecurityContext, SecurityContext};
use thiserror::Error;

use crate::clients::cri::proto::SecurityProfile;
use crate::clients::cri::proto::security_profile::ProfileType;

#[cfg(test)]
use crate::base::podspec::apparmor::APPARMOR_ANNOTATION_PREFIX;

/// Paths the runtime hides from a container whose `procMount` is `Default` (upstream's list).
pub(crate) const DEFAULT_MASKED_PATHS: [&str; 11] = [
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

/// Paths the runtime mounts read-only for a `Default` procMount (upstream's list).
pub(crate) const DEFAULT_READONLY_PATHS: [&str; 5] = [
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// A container that must not start as configured. The messages are upstream's, so operators
/// can search for them; the pod is named as upstream formats it (`name_namespace(uid)`).
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub(crate) enum SecurityError {
    #[error("container's runAsUser breaks non-root policy (pod: {pod:?}, container: {container})")]
    RunAsUserIsRoot { pod: String, container: String },
    #[error(
        "container has runAsNonRoot and image will run as root (pod: {pod:?}, container: {container})"
    )]
    ImageRunsAsRoot { pod: String, container: String },
    #[error(
        "container has runAsNonRoot and image has non-numeric user ({user}), cannot verify user is non-root (pod: {pod:?}, container: {container})"
    )]
    NonNumericImageUser {
        user: String,
        pod: String,
        container: String,
    },
    #[error(
        "container has runAsNonRoot and image has an invalid user id ({uid}). (Must be 1-(2147483647)) (pod: {pod:?}, container: {container})"
    )]
    InvalidImageUid {
        uid: i64,
        pod: String,
        container: String,
    },
}

impl SecurityError {}

/// `name_namespace(uid)`, upstream's way of naming a pod in messages.
pub(crate) fn format_pod(pod: &Pod) -> String {
    format!(
        "{}_{}({})",
        pod.metadata.name.as_deref().unwrap_or_default(),
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.uid.as_deref().unwrap_or_default()
    )
}

fn pod_sc(pod: &Pod) -> Option<&PodSecurityContext> {
    pod.spec.as_ref().and_then(|s| s.security_context.as_ref())
}

fn own_sc(c: &Container) -> Option<&SecurityContext> {
    c.security_context.as_ref()
}

/// The container's field, else the pod's: the precedence upstream gives the fields that exist
/// at both levels.
fn effective<T: Clone>(
    pod: &Pod,
    c: &Container,
    own: impl Fn(&SecurityContext) -> Option<T>,
    of_pod: impl Fn(&PodSecurityContext) -> Option<T>,
) -> Option<T> {
    own_sc(c)
        .and_then(own)
        .or_else(|| pod_sc(pod).and_then(of_pod))
}

/// The effective `runAsUser`.
pub(crate) fn effective_run_as_user(pod: &Pod, c: &Container) -> Option<i64> {
    effective(pod, c, |s| s.run_as_user, |p| p.run_as_user)
}

/// The effective `runAsGroup`.
pub(crate) fn effective_run_as_group(pod: &Pod, c: &Container) -> Option<i64> {
    effective(pod, c, |s| s.run_as_group, |p| p.run_as_group)
}

/// Whether starting the container needs the image's user: `runAsNonRoot` is in force and no
/// `runAsUser` says who the process runs as. Callers skip the image lookup otherwise.
pub(crate) fn needs_image_user(pod: &Pod, c: &Container) -> bool {
    effective(pod, c, |s| s.run_as_non_root, |p| p.run_as_non_root) == Some(true)
        && effective_run_as_user(pod, c).is_none()
}

/// Upstream's start-time check of `runAsNonRoot` against the user the container will run as:
/// the effective `runAsUser` when set, else the image's user (the CRI image status gives a
/// `uid`, or a `username` that is not a number and so cannot be checked).
pub(crate) fn verify_run_as_non_root(
    pod: &Pod,
    container: &Container,
    image_uid: Option<i64>,
    image_username: &str,
) -> Result<(), SecurityError> {
    if effective(pod, container, |s| s.run_as_non_root, |p| p.run_as_non_root) != Some(true) {
        return Ok(());
    }
    let names = || (format_pod(pod), container.name.clone());
    if let Some(uid) = effective_run_as_user(pod, container) {
        if uid == 0 {
            let (pod, container) = names();
            return Err(SecurityError::RunAsUserIsRoot { pod, container });
        }
        return Ok(());
    }
    match image_uid {
        None if !image_username.is_empty() => {
            let (pod, container) = names();
            Err(SecurityError::NonNumericImageUser {
                user: image_username.to_string(),
                pod,
                container,
            })
        }
        Some(0) => {
            let (pod, container) = names();
            Err(SecurityError::ImageRunsAsRoot { pod, container })
        }
        Some(uid) if !(0..=i64::from(i32::MAX)).contains(&uid) => {
            let (pod, container) = names();
            Err(SecurityError::InvalidImageUid {
                uid,
                pod,
                container,
            })
        }
        // A numeric non-root user, or an image that names no user at all (upstream lets the
        // latter through: the runtime's default is not known here).
        _ => Ok(()),
    }
}

/// The user an image runs as, from the CRI image status, as upstream reads it: the numeric
/// `uid` when the runtime gives one, else the `username`; an image that names no user at all
/// runs as root (uid 0).
pub(crate) fn image_user(image: &crate::clients::cri::proto::Image) -> (Option<i64>, String) {
    match (&image.uid, image.username.as_str()) {
        (Some(uid), _) => (Some(uid.value), String::new()),
        (None, name) if !name.is_empty() => (None, name.to_string()),
        _ => (Some(0), String::new()),
    }
}

pub(crate) use crate::base::podspec::apparmor::AppArmorError;

/// An AppArmor profile in the two forms the CRI carries: the typed field and the deprecated
/// string (`runtime/default`, `unconfined`, `localhost/<name>`) older runtimes read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct AppArmor {
    pub profile: SecurityProfile,
    pub deprecated: String,
}

fn profile(kind: ProfileType, localhost_ref: &str) -> SecurityProfile {
    SecurityProfile {
        profile_type: kind as i32,
        localhost_ref: localhost_ref.to_string(),
    }
}

/// The container's AppArmor profile in CRI's terms (the pod spec's answer is
/// [`crate::base::podspec::apparmor::apparmor_profile`]); `None` leaves the runtime's default.
pub(crate) fn apparmor_profile(
    pod: &Pod,
    c: &Container,
) -> Result<Option<AppArmor>, AppArmorError> {
    use crate::base::podspec::apparmor::AppArmor as Asked;
    let asked = crate::base::podspec::apparmor::apparmor_profile(pod, c)?;
    Ok(asked.map(|a| {
        let deprecated = a.deprecated_form();
        let profile = match &a {
            Asked::RuntimeDefault => profile(ProfileType::RuntimeDefault, ""),
            Asked::Unconfined => profile(ProfileType::Unconfined, ""),
            Asked::Localhost(name) => profile(ProfileType::Localhost, name),
        };
        AppArmor {
            profile,
            deprecated,
        }
    }))
}

/// `masked_paths` and `readonly_paths` for the container's `procMount`. `Default` gets
/// upstream's lists; `Unmasked` is refused at validation (it needs a user namespace).
pub(crate) fn proc_mount_paths(c: &Container) -> (Vec<String>, Vec<String>) {
    match own_sc(c).and_then(|s| s.proc_mount.as_deref()) {
        Some("Unmasked") => (Vec::new(), Vec::new()),
        _ => (
            DEFAULT_MASKED_PATHS.iter().map(|p| p.to_string()).collect(),
            DEFAULT_READONLY_PATHS
                .iter()
                .map(|p| p.to_string())
                .collect(),
        ),
    }
}

/// Supplemental groups as upstream sends them: `fsGroup` first (volume access), then
/// `supplementalGroups`.
pub(crate) fn supplemental_groups(pod: &Pod) -> Vec<i64> {
    let sc = pod_sc(pod);
    let mut out: Vec<i64> = sc.and_then(|p| p.fs_group).into_iter().collect();
    out.extend(
        sc.and_then(|p| p.supplemental_groups.clone())
            .unwrap_or_default(),
    );
    out
}

/// The CRI value of `supplementalGroupsPolicy` (`Merge`, the default, is 0).
pub(crate) fn supplemental_groups_policy(pod: &Pod) -> i32 {
    use crate::clients::cri::proto::SupplementalGroupsPolicy;
    match pod_sc(pod).and_then(|p| p.supplemental_groups_policy.as_deref()) {
        Some("Strict") => SupplementalGroupsPolicy::Strict as i32,
        _ => SupplementalGroupsPolicy::Merge as i32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::podspec::apparmor::requires_apparmor;
    use k8s_openapi::api::core::v1::{AppArmorProfile, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::collections::BTreeMap;

    fn pod(pod_sc: Option<PodSecurityContext>, c_sc: Option<SecurityContext>) -> (Pod, Container) {
        let c = Container {
            name: "app".into(),
            image: Some("busybox".into()),
            security_context: c_sc,
            ..Default::default()
        };
        let p = Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("shop".into()),
                uid: Some("u1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![c.clone()],
                security_context: pod_sc,
                ..Default::default()
            }),
            ..Default::default()
        };
        (p, c)
    }

    fn psc(non_root: Option<bool>, user: Option<i64>) -> Option<PodSecurityContext> {
        Some(PodSecurityContext {
            run_as_non_root: non_root,
            run_as_user: user,
            ..Default::default()
        })
    }

    fn csc(non_root: Option<bool>, user: Option<i64>) -> Option<SecurityContext> {
        Some(SecurityContext {
            run_as_non_root: non_root,
            run_as_user: user,
            ..Default::default()
        })
    }

    #[test]
    fn run_as_non_root_table() {
        const ROOT: &str = "container has runAsNonRoot and image will run as root (pod: \"web_shop(u1)\", container: app)";
        const NAMED: &str = "container has runAsNonRoot and image has non-numeric user (nginx), cannot verify user is non-root (pod: \"web_shop(u1)\", container: app)";
        const USER0: &str =
            "container's runAsUser breaks non-root policy (pod: \"web_shop(u1)\", container: app)";
        type Row = (
            &'static str,
            Option<PodSecurityContext>,
            Option<SecurityContext>,
            Option<i64>,
            &'static str,
            Option<&'static str>,
        );
        let rows: Vec<Row> = vec![
            ("not asked", None, None, Some(0), "", None),
            ("false", psc(Some(false), None), None, Some(0), "", None),
            (
                "pod: root image",
                psc(Some(true), None),
                None,
                Some(0),
                "",
                Some(ROOT),
            ),
            (
                "container: root image",
                None,
                csc(Some(true), None),
                Some(0),
                "",
                Some(ROOT),
            ),
            (
                "container false overrides pod",
                psc(Some(true), None),
                csc(Some(false), None),
                Some(0),
                "",
                None,
            ),
            (
                "image uid 1000",
                psc(Some(true), None),
                None,
                Some(1000),
                "",
                None,
            ),
            (
                "image named user",
                psc(Some(true), None),
                None,
                None,
                "nginx",
                Some(NAMED),
            ),
            (
                "image without user",
                psc(Some(true), None),
                None,
                None,
                "",
                None,
            ),
            (
                "runAsUser 1000 beats root image",
                psc(Some(true), Some(1000)),
                None,
                Some(0),
                "",
                None,
            ),
            (
                "container runAsUser over pod",
                psc(Some(true), Some(0)),
                csc(None, Some(7)),
                Some(0),
                "",
                None,
            ),
            (
                "runAsUser 0",
                psc(Some(true), Some(0)),
                None,
                Some(1000),
                "",
                Some(USER0),
            ),
            (
                "container runAsUser 0",
                None,
                csc(Some(true), Some(0)),
                None,
                "",
                Some(USER0),
            ),
        ];
        for (what, p_sc, c_sc, uid, username, want) in rows {
            let (p, c) = pod(p_sc, c_sc);
            let got = verify_run_as_non_root(&p, &c, uid, username).map_err(|e| e.to_string());
            assert_eq!(got, want.map_or(Ok(()), |m| Err(m.to_string())), "{what}");
        }
        let (p, c) = pod(psc(Some(true), None), None);
        assert!(matches!(
            verify_run_as_non_root(&p, &c, Some(1 << 40), ""),
            Err(SecurityError::InvalidImageUid { .. })
        ));
    }

    #[test]
    fn image_user_as_upstream_reads_it() {
        use crate::clients::cri::proto::{Image, Int64Value};
        let img = |uid: Option<i64>, name: &str| Image {
            uid: uid.map(|value| Int64Value { value }),
            username: name.into(),
            ..Default::default()
        };
        assert_eq!(
            image_user(&img(Some(1000), "")),
            (Some(1000), String::new())
        );
        assert_eq!(image_user(&img(None, "nginx")), (None, "nginx".to_string()));
        // No user in the image: root, so runAsNonRoot refuses it.
        assert_eq!(image_user(&img(None, "")), (Some(0), String::new()));
        let (p, c) = pod(psc(Some(true), None), None);
        let (uid, name) = image_user(&img(None, ""));
        assert!(matches!(
            verify_run_as_non_root(&p, &c, uid, &name),
            Err(SecurityError::ImageRunsAsRoot { .. })
        ));
    }

    #[test]
    fn needs_image_user_only_when_it_matters() {
        assert!(!needs_image_user(&pod(None, None).0, &pod(None, None).1));
        let (p, c) = pod(psc(Some(true), None), None);
        assert!(needs_image_user(&p, &c));
        let (p, c) = pod(psc(Some(true), None), csc(None, Some(5)));
        assert!(!needs_image_user(&p, &c));
    }

    fn aa(t: &str, local: Option<&str>) -> Option<AppArmorProfile> {
        Some(AppArmorProfile {
            type_: t.into(),
            localhost_profile: local.map(str::to_string),
        })
    }

    #[test]
    fn apparmor_table() {
        let rt = |kind: ProfileType, r: &str, d: &str| {
            Ok(Some(AppArmor {
                profile: profile(kind, r),
                deprecated: d.into(),
            }))
        };
        type Row = (
            &'static str,
            Option<AppArmorProfile>,
            Option<AppArmorProfile>,
            Option<&'static str>,
            Result<Option<AppArmor>, AppArmorError>,
        );
        let rows: Vec<Row> = vec![
            ("nothing", None, None, None, Ok(None)),
            (
                "pod field",
                aa("RuntimeDefault", None),
                None,
                None,
                rt(ProfileType::RuntimeDefault, "", "runtime/default"),
            ),
            (
                "container over pod",
                aa("RuntimeDefault", None),
                aa("Unconfined", None),
                None,
                rt(ProfileType::Unconfined, "", "unconfined"),
            ),
            (
                "localhost",
                None,
                aa("Localhost", Some("k8s-nginx")),
                None,
                rt(ProfileType::Localhost, "k8s-nginx", "localhost/k8s-nginx"),
            ),
            (
                "localhost without name",
                None,
                aa("Localhost", None),
                None,
                Err(AppArmorError::NoLocalhostProfile),
            ),
            (
                "bad type",
                None,
                aa("Strict", None),
                None,
                Err(AppArmorError::BadType("Strict".into())),
            ),
            (
                "annotation default",
                None,
                None,
                Some("runtime/default"),
                rt(ProfileType::RuntimeDefault, "", "runtime/default"),
            ),
            (
                "annotation localhost",
                None,
                None,
                Some("localhost/p1"),
                rt(ProfileType::Localhost, "p1", "localhost/p1"),
            ),
            (
                "annotation unconfined",
                None,
                None,
                Some("unconfined"),
                rt(ProfileType::Unconfined, "", "unconfined"),
            ),
            (
                "field beats annotation",
                aa("Unconfined", None),
                None,
                Some("runtime/default"),
                rt(ProfileType::Unconfined, "", "unconfined"),
            ),
            (
                "bad annotation",
                None,
                None,
                Some("docker-default"),
                Err(AppArmorError::BadAnnotation {
                    key: "container.apparmor.security.beta.kubernetes.io/app".into(),
                    value: "docker-default".into(),
                }),
            ),
        ];
        for (what, pod_field, c_field, annotation, want) in rows {
            let (mut p, c) = pod(
                Some(PodSecurityContext {
                    app_armor_profile: pod_field,
                    ..Default::default()
                }),
                Some(SecurityContext {
                    app_armor_profile: c_field,
                    ..Default::default()
                }),
            );
            if let Some(v) = annotation {
                p.metadata.annotations = Some(BTreeMap::from([(
                    format!("{APPARMOR_ANNOTATION_PREFIX}app"),
                    v.to_string(),
                )]));
            }
            assert_eq!(apparmor_profile(&p, &c), want, "{what}");
            let needs = matches!(&want, Ok(Some(a)) if a.deprecated != "unconfined");
            assert_eq!(requires_apparmor(&p), needs || want.is_err(), "{what}");
        }
    }

    #[test]
    fn proc_mount_and_groups() {
        let (_, c) = pod(None, None);
        let (masked, readonly) = proc_mount_paths(&c);
        assert_eq!(masked.len(), 11);
        assert_eq!(readonly, DEFAULT_READONLY_PATHS.map(String::from).to_vec());
        let (_, c) = pod(
            None,
            Some(SecurityContext {
                proc_mount: Some("Unmasked".into()),
                ..Default::default()
            }),
        );
        assert_eq!(proc_mount_paths(&c), (vec![], vec![]));

        let (p, _) = pod(
            Some(PodSecurityContext {
                fs_group: Some(2000),
                supplemental_groups: Some(vec![4000, 5000]),
                supplemental_groups_policy: Some("Strict".into()),
                ..Default::default()
            }),
            None,
        );
        assert_eq!(supplemental_groups(&p), vec![2000, 4000, 5000]);
        assert_eq!(supplemental_groups_policy(&p), 1);
        assert_eq!(supplemental_groups_policy(&pod(None, None).0), 0);
    }
}
