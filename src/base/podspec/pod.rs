//! A pod's identity, priority and restart rules.

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

/// `restartPolicy` of a pod (or of a container, for sidecars).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

impl RestartPolicy {
    /// The pod's policy; unset or unknown reads as `Always`, the API's default.
    pub fn of(pod: &Pod) -> RestartPolicy {
        Self::parse(pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref()))
    }

    fn parse(value: Option<&str>) -> RestartPolicy {
        match value {
            Some("Never") => RestartPolicy::Never,
            Some("OnFailure") => RestartPolicy::OnFailure,
            _ => RestartPolicy::Always,
        }
    }

    /// The policy that governs one container: `Always` for a sidecar, the pod's otherwise.
    pub fn for_container(pod: &Pod, container: &Container) -> RestartPolicy {
        if is_sidecar(container) {
            RestartPolicy::Always
        } else {
            Self::of(pod)
        }
    }

    /// Should a container that exited with `exit_code` run again?
    pub fn restarts_after(self, exit_code: i32) -> bool {
        match self {
            RestartPolicy::Never => false,
            RestartPolicy::OnFailure => exit_code != 0,
            RestartPolicy::Always => true,
        }
    }
}

/// An init container with `restartPolicy: Always` is a sidecar.
pub fn is_sidecar(c: &Container) -> bool {
    c.restart_policy.as_deref() == Some("Always")
}

/// Every init container (sidecars included), then every app container, in spec order; none
/// for a pod without a spec. Ephemeral containers are not among them.
pub(crate) fn init_and_app_containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    pod.spec.iter().flat_map(spec_init_and_app_containers)
}

/// [`init_and_app_containers`] of a spec on its own.
pub(crate) fn spec_init_and_app_containers(spec: &PodSpec) -> impl Iterator<Item = &Container> {
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
}

/// The pod's namespace; an unset or empty one is `default`, as the API server defaults it.
pub(crate) fn namespace(pod: &Pod) -> &str {
    pod.metadata
        .namespace
        .as_deref()
        .filter(|n| !n.is_empty())
        .unwrap_or("default")
}

/// `namespace/name` of a pod.
pub fn full_name(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or_default()
    )
}

/// True when the pod's own status (as its source gives it: the API server's copy) has a
/// terminal phase, `Succeeded` or `Failed`. Upstream never runs such a pod again; its exited
/// containers stay until it is deleted.
pub(crate) fn phase_is_terminal(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Upstream's priority of pods without a priority class, when no default class exists.
pub(crate) const DEFAULT_PRIORITY: i32 = 0;
/// The lowest priority of critical system pods (`system-cluster-critical`).
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;
/// `system-node-critical`, which the API server gives 1000 more.
pub(crate) const NODE_CRITICAL_PRIORITY: i32 = SYSTEM_CRITICAL_PRIORITY + 1000;

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::PodSpec;

    use super::*;

    #[test]
    fn restart_rules() {
        use RestartPolicy::*;
        for (policy, code, want) in [
            (Always, 0, true),
            (Always, 1, true),
            (OnFailure, 0, false),
            (OnFailure, 137, true),
            (Never, 1, false),
        ] {
            assert_eq!(policy.restarts_after(code), want, "{policy:?} {code}");
        }
        let pod = |p: Option<&str>| Pod {
            spec: Some(PodSpec {
                restart_policy: p.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(RestartPolicy::of(&pod(None)), Always);
        assert_eq!(RestartPolicy::of(&pod(Some("OnFailure"))), OnFailure);
        let sidecar = Container {
            restart_policy: Some("Always".into()),
            ..Default::default()
        };
        assert!(is_sidecar(&sidecar));
        assert_eq!(
            RestartPolicy::for_container(&pod(Some("Never")), &sidecar),
            Always
        );
        assert_eq!(
            RestartPolicy::for_container(&pod(Some("Never")), &Container::default()),
            Never
        );
    }
}
