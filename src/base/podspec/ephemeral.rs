//! Ephemeral containers (`kubectl debug`) as the rest of the node sees them. Upstream casts an
//! `EphemeralContainer`'s common part to a `Container` wherever it starts one or reports its
//! status; the two types share every field but `targetContainerName`, so the same is done here
//! by copying them, and the target is asked for on its own.

use k8s_openapi::api::core::v1::{Container, EphemeralContainer, Pod};

/// The ephemeral container as a plain container (every field it shares with one).
pub(crate) fn as_container(ec: &EphemeralContainer) -> Container {
    Container {
        args: ec.args.clone(),
        command: ec.command.clone(),
        env: ec.env.clone(),
        env_from: ec.env_from.clone(),
        image: ec.image.clone(),
        image_pull_policy: ec.image_pull_policy.clone(),
        lifecycle: ec.lifecycle.clone(),
        liveness_probe: ec.liveness_probe.clone(),
        name: ec.name.clone(),
        ports: ec.ports.clone(),
        readiness_probe: ec.readiness_probe.clone(),
        resize_policy: ec.resize_policy.clone(),
        resources: ec.resources.clone(),
        restart_policy: ec.restart_policy.clone(),
        restart_policy_rules: ec.restart_policy_rules.clone(),
        security_context: ec.security_context.clone(),
        startup_probe: ec.startup_probe.clone(),
        stdin: ec.stdin,
        stdin_once: ec.stdin_once,
        termination_message_path: ec.termination_message_path.clone(),
        termination_message_policy: ec.termination_message_policy.clone(),
        tty: ec.tty,
        volume_devices: ec.volume_devices.clone(),
        volume_mounts: ec.volume_mounts.clone(),
        working_dir: ec.working_dir.clone(),
    }
}

/// The pod's ephemeral containers, in spec order.
pub(crate) fn of(pod: &Pod) -> &[EphemeralContainer] {
    pod.spec
        .as_ref()
        .and_then(|s| s.ephemeral_containers.as_deref())
        .unwrap_or_default()
}

/// Whether `name` is one of the pod's ephemeral containers.
pub(crate) fn is_ephemeral(pod: &Pod, name: &str) -> bool {
    of(pod).iter().any(|ec| ec.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PodSpec;

    #[test]
    fn an_ephemeral_container_keeps_its_fields_as_a_container() {
        let ec = EphemeralContainer {
            name: "debugger".into(),
            image: Some("busybox".into()),
            command: Some(vec!["sh".into()]),
            stdin: Some(true),
            tty: Some(true),
            target_container_name: Some("app".into()),
            ..Default::default()
        };
        let c = as_container(&ec);
        assert_eq!(c.name, "debugger");
        assert_eq!(c.image.as_deref(), Some("busybox"));
        assert_eq!(c.command, Some(vec!["sh".to_string()]));
        assert_eq!((c.stdin, c.tty), (Some(true), Some(true)));
        let pod = Pod {
            spec: Some(PodSpec {
                ephemeral_containers: Some(vec![ec]),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(is_ephemeral(&pod, "debugger"));
        assert!(!is_ephemeral(&pod, "app"));
        assert!(!is_ephemeral(&Pod::default(), "debugger"));
    }
}
