//! Image volumes (`volumes[].image`, the OCI volume source), as pure decisions: which volumes
//! of a pod are images and under which pull policy, whether the runtime can mount them, and
//! what a container that mounts one waits for when its pull failed.
//!
//! As upstream's kubelet (v1.37, `getImageVolumes` / `toKubeContainerImageVolumes`), the images
//! are pulled once per start of the pod's containers, through the very step a container's
//! image goes through (pull policy, the pod's pull secrets, the pull back-off), with the events
//! on the pod. A failed pull fails only the containers that mount the volume, with the
//! image's waiting reason (`ErrImagePull`, then `ImagePullBackOff`); the mount itself is
//! handed to the runtime as CRI's `Mount.image` (the pulled image's ID), read-only, with the
//! volume mount's `subPath` as `image_sub_path`.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, Pod};

use super::images::PullPolicy;
use crate::kubelet::pod_status::WaitingReason;

/// One image volume of a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ImageVolume {
    pub name: String,
    pub reference: String,
    pub policy: PullPolicy,
}

/// The pod's image volumes, in the spec's order. The pull policy is the volume's, or, when it
/// sets none, what the API server would have given it (`Always` for `:latest` or no tag).
pub(crate) fn image_volumes(pod: &Pod) -> Vec<ImageVolume> {
    let volumes = pod.spec.iter().flat_map(|s| s.volumes.iter().flatten());
    volumes
        .filter_map(|v| {
            let source = v.image.as_ref()?;
            let reference = source.reference.clone().unwrap_or_default();
            let policy = match source.pull_policy.as_deref() {
                Some("Always") => PullPolicy::Always,
                Some("Never") => PullPolicy::Never,
                Some("IfNotPresent") => PullPolicy::IfNotPresent,
                _ => default_policy(&reference),
            };
            Some(ImageVolume {
                name: v.name.clone(),
                reference,
                policy,
            })
        })
        .collect()
}

fn default_policy(reference: &str) -> PullPolicy {
    match crate::kubelet::source::defaults::default_image_pull_policy(reference) {
        "Always" => PullPolicy::Always,
        _ => PullPolicy::IfNotPresent,
    }
}

/// Why a runtime cannot mount image volumes, or `None` when it can (or is not known not to).
/// CRI's `Mount.image` is served by containerd from 2.1 (earlier releases drop the field and
/// fail on the empty host path, or worse) and by CRI-O from 1.31; other runtimes are trusted
/// to say so themselves when they create the container.
pub(crate) fn runtime_refusal(runtime_name: &str, runtime_version: &str) -> Option<String> {
    let minimum = match runtime_name {
        "containerd" => (2, 1),
        "cri-o" => (1, 31),
        _ => return None,
    };
    let version = runtime_version.trim_start_matches('v');
    let mut parts = version
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u64>().ok());
    let major = parts.next().flatten()?;
    let minor = parts.next().flatten().unwrap_or(0);
    if (major, minor) >= minimum {
        return None;
    }
    Some(format!(
        "image volumes are not supported by the container runtime {runtime_name} {runtime_version} \
         (it needs {runtime_name} {}.{} or later)",
        minimum.0, minimum.1
    ))
}

/// What a container that mounts image volumes waits for: the waiting reason of the last of
/// its mounted volumes (in `volumeMounts` order) whose image could not be had, as upstream
/// keeps the last error; `None` when every mounted image is there.
pub(crate) fn container_waiting(
    container: &Container,
    failed: &HashMap<String, WaitingReason>,
) -> Option<WaitingReason> {
    container
        .volume_mounts
        .iter()
        .flatten()
        .filter_map(|m| failed.get(&m.name))
        .next_back()
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::pod_status::WaitReason;

    fn pod(yaml: &str) -> Pod {
        crate::base::yaml::from_str(yaml).unwrap()
    }

    #[test]
    fn image_volumes_carry_their_policy_or_the_api_servers_default() {
        let p = pod(r#"
spec:
  containers: [{name: a, image: i}]
  volumes:
  - {name: e, emptyDir: {}}
  - {name: tagged, image: {reference: "reg/x:1.0"}}
  - {name: latest, image: {reference: "reg/x:latest"}}
  - {name: bare, image: {reference: "reg/x"}}
  - {name: digest, image: {reference: "reg/x@sha256:abc"}}
  - {name: never, image: {reference: "reg/x", pullPolicy: Never}}
  - {name: always, image: {reference: "reg/x:1", pullPolicy: Always}}
  - {name: odd, image: {reference: "reg/x:1", pullPolicy: Sometimes}}
"#);
        let got: Vec<(String, PullPolicy)> = image_volumes(&p)
            .into_iter()
            .map(|v| (v.name, v.policy))
            .collect();
        use PullPolicy::*;
        let want = [
            ("tagged", IfNotPresent),
            ("latest", Always),
            ("bare", Always),
            ("digest", IfNotPresent),
            ("never", Never),
            ("always", Always),
            ("odd", IfNotPresent),
        ];
        let want: Vec<(String, PullPolicy)> =
            want.iter().map(|(n, p)| (n.to_string(), *p)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn runtimes_that_cannot_mount_images_are_named() {
        let rows = [
            ("containerd", "1.6.20", true),
            ("containerd", "v1.7.24", true),
            ("containerd", "2.0.5", true),
            ("containerd", "2.1.0", false),
            ("containerd", "v2.4.2", false),
            ("containerd", "3.0.0-rc.1", false),
            ("cri-o", "1.30.4", true),
            ("cri-o", "1.31.0", false),
            ("other", "0.1", false),
            ("containerd", "garbage", false),
        ];
        for (name, version, refused) in rows {
            let got = runtime_refusal(name, version);
            assert_eq!(got.is_some(), refused, "{name} {version}: {got:?}");
        }
        assert_eq!(
            runtime_refusal("containerd", "1.6.20").unwrap(),
            "image volumes are not supported by the container runtime containerd 1.6.20 \
             (it needs containerd 2.1 or later)"
        );
    }

    #[test]
    fn a_container_waits_for_the_last_failed_image_it_mounts_only() {
        let p = pod(r#"
spec:
  containers:
  - {name: none, image: i}
  - {name: good, image: i, volumeMounts: [{name: ok, mountPath: /ok}]}
  - {name: both, image: i, volumeMounts: [{name: bad1, mountPath: /a}, {name: ok, mountPath: /ok}, {name: bad2, mountPath: /b}]}
"#);
        let mut failed = HashMap::new();
        failed.insert(
            "bad1".to_string(),
            WaitingReason::new(WaitReason::ErrImagePull, "first"),
        );
        failed.insert(
            "bad2".to_string(),
            WaitingReason::new(WaitReason::ImagePullBackOff, "second"),
        );
        let containers = &p.spec.as_ref().unwrap().containers;
        assert_eq!(container_waiting(&containers[0], &failed), None);
        assert_eq!(container_waiting(&containers[1], &failed), None);
        let both = container_waiting(&containers[2], &failed).unwrap();
        assert_eq!(
            (both.reason, both.message.as_str()),
            (WaitReason::ImagePullBackOff, "second")
        );
    }
}
