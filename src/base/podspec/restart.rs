//! Whether a container runs again after it exits: the one per-container decision the runtime
//! manager, the pod phase and the status writer all ask, as upstream's `ContainerShouldRestart`
//! with the ContainerRestartRules gate on (beta, on by default since v1.35).
//!
//! A container may carry its own `restartPolicy` (overriding the pod's) and, with it, ordered
//! `restartPolicyRules`: the first rule whose `exitCodes` requirement matches the exit code
//! decides; action `Restart` runs the container again. With no rule matching, the container's
//! policy decides, and without one the pod's. A sidecar is the special case of an init
//! container whose policy is `Always`.
//!
//! Action `RestartAllContainers` (upstream's RestartAllContainersOnContainerExits, beta and on by
//! default since v1.36) also counts as running again: the exit starts a new round of every init,
//! sidecar and app container of the pod in its sandbox (`base::restart_round`).

use k8s_openapi::api::core::v1::{Container, ContainerRestartRule, Pod};

use super::pod::{RestartPolicy, init_and_app_containers, is_sidecar};

/// The policy that governs one container: its own `restartPolicy` when it has a known one (a
/// sidecar's `Always`), the pod's otherwise.
pub(crate) fn container_policy(pod: &Pod, container: &Container) -> RestartPolicy {
    match container.restart_policy.as_deref() {
        Some("Always") => RestartPolicy::Always,
        Some("OnFailure") => RestartPolicy::OnFailure,
        Some("Never") => RestartPolicy::Never,
        _ => RestartPolicy::of(pod),
    }
}

/// The first rule whose exit-code requirement the exit code meets (upstream's
/// `FindMatchingContainerRestartRule`): `In` matches a listed code, `NotIn` any other; a rule
/// with an unknown operator or no requirement never matches.
fn matching_rule(container: &Container, exit_code: i32) -> Option<&ContainerRestartRule> {
    container
        .restart_policy_rules
        .iter()
        .flatten()
        .find(|rule| {
            let Some(codes) = rule.exit_codes.as_ref() else {
                return false;
            };
            let listed = codes.values.iter().flatten().any(|&v| v == exit_code);
            match codes.operator.as_str() {
                "In" => listed,
                "NotIn" => !listed,
                _ => false,
            }
        })
}

/// Should `container` of `pod`, which exited with `exit_code`, run again?
///
/// Rules first (only with a container-level policy, as the API requires), then the container's
/// policy, then the pod's. A regular init container that exited 0 is done and never runs again
/// in its sandbox, whatever the policies say (upstream restarts only a failed init container).
pub(crate) fn should_restart(pod: &Pod, container: &Container, exit_code: i32) -> bool {
    if exit_code == 0 && is_regular_init(pod, container) {
        return false;
    }
    if container.restart_policy.is_some()
        && let Some(rule) = matching_rule(container, exit_code)
        && (rule.action == "Restart" || rule.action == RESTART_ALL)
    {
        return true;
    }
    container_policy(pod, container).restarts_after(exit_code)
}

/// The rule action that restarts every container of the pod.
const RESTART_ALL: &str = "RestartAllContainers";

/// Does this exit of `container` restart every container of the pod: its first rule that
/// matches the code says `RestartAllContainers` (rules count only with a container-level
/// policy, as the API requires)?
pub(crate) fn restarts_all(container: &Container, exit_code: i32) -> bool {
    container.restart_policy.is_some()
        && matching_rule(container, exit_code).is_some_and(|r| r.action == RESTART_ALL)
}

/// Does any container of the pod carry a `RestartAllContainers` rule (upstream's
/// `AllContainersCouldRestart`: such a pod gets the `AllContainersRestarting` condition)?
pub(crate) fn any_restart_all_rule(pod: &Pod) -> bool {
    init_and_app_containers(pod)
        .filter(|c| c.restart_policy.is_some())
        .flat_map(|c| c.restart_policy_rules.iter().flatten())
        .any(|r| r.action == RESTART_ALL)
}

/// Can the container ever run again (upstream's `IsContainerRestartable`): a `Restart` rule, or
/// a policy other than `Never`. Used where there is no exit code to judge: a container in an
/// unknown state.
pub(crate) fn may_restart(pod: &Pod, container: &Container) -> bool {
    let by_rule = container.restart_policy.is_some()
        && container
            .restart_policy_rules
            .iter()
            .flatten()
            .any(|r| r.action == "Restart");
    by_rule || container_policy(pod, container) != RestartPolicy::Never
}

/// An init container of the pod that is not a sidecar.
fn is_regular_init(pod: &Pod, container: &Container) -> bool {
    !is_sidecar(container)
        && pod
            .spec
            .as_ref()
            .and_then(|s| s.init_containers.as_ref())
            .is_some_and(|inits| inits.iter().any(|c| c.name == container.name))
}

/// The spec's container (init or app) of that name.
pub(crate) fn spec_container<'a>(pod: &'a Pod, name: &str) -> Option<&'a Container> {
    init_and_app_containers(pod).find(|c| c.name == name)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::PodSpec;

    use super::*;

    fn rule(action: &str, op: &str, values: &[i32]) -> serde_json::Value {
        serde_json::json!({"action": action, "exitCodes": {"operator": op, "values": values}})
    }

    /// A pod with one app container `app` (and init containers `init` and `sidecar`).
    fn pod(pod_policy: Option<&str>, policy: Option<&str>, rules: Vec<serde_json::Value>) -> Pod {
        let mut app = serde_json::json!({"name": "app"});
        if let Some(p) = policy {
            app["restartPolicy"] = p.into();
        }
        if !rules.is_empty() {
            app["restartPolicyRules"] = rules.into();
        }
        let mut spec = serde_json::json!({
            "containers": [app],
            "initContainers": [{"name": "init"}, {"name": "sidecar", "restartPolicy": "Always"}],
        });
        if let Some(p) = pod_policy {
            spec["restartPolicy"] = p.into();
        }
        serde_json::from_value(serde_json::json!({"spec": spec})).unwrap()
    }

    /// (pod policy, container policy, rules, exit code, restarts)
    type ExitRow = (
        Option<&'static str>,
        Option<&'static str>,
        Vec<serde_json::Value>,
        i32,
        bool,
    );
    /// (pod policy, container policy, rules, may restart)
    type PolicyRow = (
        Option<&'static str>,
        Option<&'static str>,
        Vec<serde_json::Value>,
        bool,
    );

    fn app(p: &Pod) -> &Container {
        &p.spec.as_ref().unwrap().containers[0]
    }

    #[test]
    fn should_restart_follows_rules_then_container_then_pod_policy() {
        let restart_42 = || vec![rule("Restart", "In", &[42])];
        // (pod policy, container policy, rules, exit code, restarts)
        let rows: Vec<ExitRow> = vec![
            // The pod's policy alone, as before.
            (None, None, vec![], 0, true),
            (Some("Always"), None, vec![], 1, true),
            (Some("OnFailure"), None, vec![], 0, false),
            (Some("OnFailure"), None, vec![], 1, true),
            (Some("Never"), None, vec![], 1, false),
            // The container's policy overrides the pod's, both ways.
            (Some("Never"), Some("Always"), vec![], 0, true),
            (Some("Never"), Some("OnFailure"), vec![], 1, true),
            (Some("Never"), Some("OnFailure"), vec![], 0, false),
            (Some("Always"), Some("Never"), vec![], 1, false),
            (Some("Always"), Some("OnFailure"), vec![], 0, false),
            // A matching Restart rule beats a Never policy; a rule that does not match leaves
            // the container's policy to decide.
            (Some("Never"), Some("Never"), restart_42(), 42, true),
            (Some("Never"), Some("Never"), restart_42(), 1, false),
            (Some("Always"), Some("Never"), restart_42(), 0, false),
            (
                Some("Never"),
                Some("Never"),
                vec![rule("Restart", "NotIn", &[0, 1])],
                2,
                true,
            ),
            (
                Some("Never"),
                Some("Never"),
                vec![rule("Restart", "NotIn", &[0, 1])],
                1,
                false,
            ),
            // The first matching rule decides; an unknown action or operator never restarts.
            (
                Some("Never"),
                Some("Never"),
                vec![rule("Bogus", "In", &[3]), rule("Restart", "In", &[3])],
                3,
                false,
            ),
            (
                Some("Never"),
                Some("Never"),
                vec![rule("Restart", "Bogus", &[3])],
                3,
                false,
            ),
            // RestartAllContainers runs the container again (with every other one); an exit it
            // does not match leaves the container's policy to decide.
            (
                Some("Never"),
                Some("Never"),
                vec![rule("RestartAllContainers", "In", &[42])],
                42,
                true,
            ),
            (
                Some("Never"),
                Some("Never"),
                vec![rule("RestartAllContainers", "In", &[42])],
                1,
                false,
            ),
            // Rules without a container-level policy (refused by the API) are not read.
            (Some("Never"), None, restart_42(), 42, false),
            // An unknown container policy falls back to the pod's.
            (Some("OnFailure"), Some("Sometimes"), vec![], 1, true),
        ];
        for (pod_policy, policy, rules, code, want) in rows {
            let p = pod(pod_policy, policy, rules.clone());
            assert_eq!(
                should_restart(&p, app(&p), code),
                want,
                "pod {pod_policy:?} container {policy:?} rules {rules:?} exit {code}"
            );
        }
    }

    #[test]
    fn init_containers_restart_only_after_a_failure_sidecars_always() {
        for pod_policy in [Some("Always"), Some("OnFailure"), Some("Never"), None] {
            let p = pod(pod_policy, None, vec![]);
            let spec: &PodSpec = p.spec.as_ref().unwrap();
            let inits = spec.init_containers.as_ref().unwrap();
            let (init, sidecar) = (&inits[0], &inits[1]);
            assert!(!should_restart(&p, init, 0), "{pod_policy:?}");
            assert_eq!(
                should_restart(&p, init, 1),
                pod_policy != Some("Never"),
                "{pod_policy:?}"
            );
            assert!(should_restart(&p, sidecar, 0), "{pod_policy:?}");
            assert!(should_restart(&p, sidecar, 1), "{pod_policy:?}");
        }
    }

    #[test]
    fn may_restart_without_an_exit_code() {
        let rows: Vec<PolicyRow> = vec![
            (Some("Never"), None, vec![], false),
            (Some("OnFailure"), None, vec![], true),
            (Some("Never"), Some("Always"), vec![], true),
            (Some("Always"), Some("Never"), vec![], false),
            (
                Some("Always"),
                Some("Never"),
                vec![rule("Restart", "In", &[1])],
                true,
            ),
        ];
        for (pod_policy, policy, rules, want) in rows {
            let p = pod(pod_policy, policy, rules);
            assert_eq!(
                may_restart(&p, app(&p)),
                want,
                "pod {pod_policy:?} container {policy:?}"
            );
        }
    }

    #[test]
    fn spec_container_finds_init_and_app_containers() {
        let p = pod(None, None, vec![]);
        assert!(spec_container(&p, "init").is_some());
        assert!(spec_container(&p, "app").is_some());
        assert!(spec_container(&p, "gone").is_none());
    }
}
