//! Rounds of `RestartAllContainers` (upstream's RestartAllContainersOnContainerExits, beta and
//! on by default since v1.36): when a container exits with a code its first matching rule maps
//! to that action, every init, sidecar and app container of the pod runs again, from the first
//! init container, in the same sandbox.
//!
//! Upstream removes every container from the runtime and carries the restart counts and last
//! states over in the API status. Deckhand keeps the exited instances (their logs, `lastState`
//! and attempt numbers stay where they are) and instead looks at the pod *as of the round*: the
//! newest such exit is the round's trigger, and every instance made for the round carries the
//! trigger's ID (`cri_labels::RESTART_ROUND_ANNOTATION`); the others belong to earlier rounds,
//! even one made after the exit but before the agent saw it. The runtime manager first stops
//! what of them still runs, then plans the round over its own instances, as it plans a pod that
//! has just started.

use k8s_openapi::api::core::v1::Pod;

use super::observed::{ContainerState, ObservedContainer, ObservedPod};
use super::podspec::restart::{restarts_all, spec_container};

/// The exit that started the pod's current round in `sandbox_id`: the newest exited instance
/// there whose exit code its container's rule maps to `RestartAllContainers`. None when no
/// exit in that sandbox ever asked for one.
pub(crate) fn trigger<'a>(
    pod: &Pod,
    observed: &'a ObservedPod,
    sandbox_id: &str,
) -> Option<&'a ObservedContainer> {
    observed
        .containers
        .iter()
        .filter(|i| i.sandbox_id == sandbox_id && i.state == ContainerState::Exited)
        .filter(|i| spec_container(pod, &i.name).is_some_and(|c| restarts_all(c, i.exit_code)))
        .max_by_key(|i| i.finished_at)
}

/// Whether an instance belongs to a round before the one `trigger` started: an init or app
/// container's instance not made for it. Ephemeral containers take no part in rounds: they run
/// once, whatever the others do.
fn earlier(pod: &Pod, inst: &ObservedContainer, trigger: &ObservedContainer) -> bool {
    inst.round.as_deref() != Some(trigger.id.as_str()) && spec_container(pod, &inst.name).is_some()
}

/// The pod as the round `trigger` started sees it: without the earlier rounds' instances.
pub(crate) fn current(
    pod: &Pod,
    observed: &ObservedPod,
    trigger: &ObservedContainer,
) -> ObservedPod {
    ObservedPod {
        sandboxes: observed.sandboxes.clone(),
        containers: observed
            .containers
            .iter()
            .filter(|i| !earlier(pod, i, trigger))
            .cloned()
            .collect(),
        names: observed.names.clone(),
    }
}

/// Earlier rounds' instances that still run, or may (state unknown), or were made and never
/// started: what must be stopped or removed before the round `trigger` started begins.
pub(crate) fn left_over<'a>(
    pod: &Pod,
    observed: &'a ObservedPod,
    trigger: &ObservedContainer,
) -> Vec<&'a ObservedContainer> {
    observed
        .containers
        .iter()
        .filter(|i| earlier(pod, i, trigger) && i.state != ContainerState::Exited)
        .collect()
}

/// True while a round is starting: an exit asked for one in the newest sandbox and instances of
/// earlier rounds are still left to stop (upstream's `AllContainersRestarting` condition).
pub(crate) fn restarting(pod: &Pod, observed: &ObservedPod) -> bool {
    observed
        .newest_sandbox()
        .and_then(|s| trigger(pod, observed, &s.id))
        .is_some_and(|t| !left_over(pod, observed, t).is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::observed::{ObservedSandbox, SandboxState};

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({"spec": {
            "restartPolicy": "Never",
            "initContainers": [{"name": "init"}],
            "containers": [
                {"name": "source", "restartPolicy": "Never", "restartPolicyRules": [
                    {"action": "RestartAllContainers",
                     "exitCodes": {"operator": "In", "values": [42]}}]},
                {"name": "regular"},
            ],
        }}))
        .unwrap()
    }

    /// Instance `id` of `name`, made at `made` for the round of `round`; an exited one
    /// finished 5 later with `exit`.
    fn inst(
        id: &str,
        name: &str,
        state: ContainerState,
        made: i64,
        exit: i32,
    ) -> ObservedContainer {
        ObservedContainer {
            id: id.into(),
            sandbox_id: "s".into(),
            name: name.into(),
            attempt: 0,
            state,
            created_at: made,
            started_at: made,
            finished_at: if state == ContainerState::Exited {
                made + 5
            } else {
                0
            },
            exit_code: exit,
            reason: String::new(),
            message: String::new(),
            hash: None,
            image: String::new(),
            image_ref: String::new(),
            grace_period: None,
            is_init: name == "init",
            pre_stop: None,
            round: None,
        }
    }

    fn of_round(mut i: ObservedContainer, round: &str) -> ObservedContainer {
        i.round = Some(round.into());
        i
    }

    fn observed(containers: Vec<ObservedContainer>) -> ObservedPod {
        ObservedPod {
            sandboxes: vec![ObservedSandbox {
                id: "s".into(),
                attempt: 0,
                state: SandboxState::Ready,
                created_at: 0,
                ip: None,
                additional_ips: vec![],
                host_network: false,
            }],
            containers,
            names: None,
        }
    }

    /// (instances, trigger, left over, the round's own, restarting)
    type Row = (
        Vec<ObservedContainer>,
        Option<&'static str>,
        Vec<&'static str>,
        Vec<&'static str>,
        bool,
    );

    #[test]
    fn a_round_is_the_newest_matching_exit_and_the_instances_made_for_it() {
        use ContainerState::*;
        let p = pod();
        let rows: Vec<Row> = vec![
            // No matching exit: no round.
            (
                vec![
                    inst("i", "init", Exited, 10, 0),
                    inst("a", "source", Exited, 20, 1),
                ],
                None,
                vec![],
                vec![],
                false,
            ),
            // Exit 42 at 25: the running regular is left over, even one made after the exit
            // for no round (the agent had not seen it yet), and a created one.
            (
                vec![
                    inst("i", "init", Exited, 10, 0),
                    inst("a", "source", Exited, 20, 42),
                    inst("r", "regular", Running, 21, 0),
                    inst("late", "regular", Created, 30, 0),
                ],
                Some("a"),
                vec!["r", "late"],
                vec![],
                true,
            ),
            // Everything earlier has stopped; the instances made for the round are its own.
            (
                vec![
                    inst("i", "init", Exited, 10, 0),
                    inst("a", "source", Exited, 20, 42),
                    inst("r", "regular", Exited, 21, 137),
                    of_round(inst("i2", "init", Exited, 30, 0), "a"),
                    of_round(inst("a2", "source", Running, 40, 0), "a"),
                ],
                Some("a"),
                vec![],
                vec!["i2", "a2"],
                false,
            ),
            // A second matching exit starts a new round: the first round's instances are
            // earlier ones now.
            (
                vec![
                    inst("a", "source", Exited, 20, 42),
                    of_round(inst("a2", "source", Exited, 40, 42), "a"),
                    of_round(inst("r2", "regular", Running, 41, 0), "a"),
                ],
                Some("a2"),
                vec!["r2"],
                vec![],
                true,
            ),
        ];
        for (containers, want_trigger, want_left, want_own, want_restarting) in rows {
            let o = observed(containers);
            let t = trigger(&p, &o, "s");
            assert_eq!(t.map(|t| t.id.as_str()), want_trigger);
            assert_eq!(restarting(&p, &o), want_restarting);
            let Some(t) = t else { continue };
            let left: Vec<&str> = left_over(&p, &o, t).iter().map(|i| i.id.as_str()).collect();
            assert_eq!(left, want_left);
            let own: Vec<String> = current(&p, &o, t)
                .containers
                .into_iter()
                .map(|i| i.id)
                .collect();
            assert_eq!(own, want_own);
        }
    }

    #[test]
    fn ephemeral_containers_and_other_sandboxes_take_no_part() {
        let p = pod();
        let debug = inst("d", "debugger", ContainerState::Running, 1, 0);
        let mut elsewhere = inst("x", "source", ContainerState::Exited, 50, 42);
        elsewhere.sandbox_id = "old".into();
        let o = observed(vec![
            debug,
            elsewhere,
            inst("a", "source", ContainerState::Exited, 20, 42),
        ]);
        let t = trigger(&p, &o, "s").expect("the exit in this sandbox");
        assert_eq!(t.id, "a");
        assert!(left_over(&p, &o, t).is_empty(), "the debugger runs on");
        let ids: Vec<String> = current(&p, &o, t)
            .containers
            .into_iter()
            .map(|i| i.id)
            .collect();
        assert_eq!(ids, vec!["d"]);
    }
}
