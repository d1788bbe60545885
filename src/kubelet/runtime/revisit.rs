//! When a pod's worker should look at it again, decided purely from what one sync did and saw.
//!
//! Upstream's worker looks again at the next relist (1 s) or resync. Deckhand comes back sooner
//! when it knows more is due: at once after a step of the start-up went through and the fresh
//! view already calls for the next one, after 2 s when a step failed, and when a back-off ends.
//!
//! What a worker cannot know is when a container exits (an init container's end starts the
//! next one; a crash calls for a restart). While the runtime's event stream flows the exit
//! pokes the worker the moment it happens, so the worker only sets a deadline
//! ([`EVENT_DEADLINE`]) in case the event got lost; without a stream it re-observes every
//! 50 ms while a regular init container runs ([`INIT_POLL`]). The stream can also be a moment
//! ahead of the runtime's own view (containerd's CRI plugin records an exit after publishing
//! it, once the task is deleted): the deletion's event pokes the worker again, and a view that
//! still shows running what the stream said exited is read again every 50 ms until it agrees
//! (for at most `pleg::EXIT_NOTE_TTL`).

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use super::actions::PodActions;
use crate::base::observed::{ContainerState, ObservedPod};
use crate::base::podspec::is_sidecar;

/// How often a pod is looked at while one of its init containers runs and no event stream
/// flows.
pub(crate) const INIT_POLL: Duration = Duration::from_millis(50);
/// While events flow: how long a worker waits for the exit of its running init container
/// before it looks anyway (a lost event costs this much, not a relist period).
pub(crate) const EVENT_DEADLINE: Duration = Duration::from_secs(5);
/// How soon the view is read again when the event stream told of an exit it does not show.
/// The task's deletion, after which containerd's CRI plugin shows the exit, pokes the worker
/// too; this is the fallback should the view lag even that.
pub(crate) const CATCH_UP: Duration = Duration::from_millis(50);
/// How soon a pod is looked at again after a step of its start-up went through.
pub(crate) const PROGRESS_RETRY: Duration = Duration::from_millis(20);
/// How soon a sync that hit an error is retried.
pub(crate) const ERROR_RETRY: Duration = Duration::from_secs(2);

/// What one sync did and saw, as far as the next look is concerned.
pub(crate) struct SyncFacts<'a> {
    /// The decision that was carried out.
    pub decision: &'a PodActions,
    /// Carrying it out failed somewhere.
    pub failed: bool,
    /// Some container waits on an error that is retried (not a back-off).
    pub error_waiting: bool,
    /// The decision made again on the view after the step, when the step changed anything.
    pub followup: Option<&'a PodActions>,
    /// Containers whose start is blocked by an error (their start is not "progress").
    pub blocked: &'a dyn Fn(&str) -> bool,
    /// A regular init container runs in the newest sandbox.
    pub init_running: bool,
    /// The runtime's event stream flows (its exits poke the worker).
    pub events_live: bool,
    /// The stream told of an exit that the view does not show yet.
    pub exit_pending: bool,
    /// The start waits for volumes that are backed off: nothing can start before the first
    /// back-off ends (or the pod is poked), however ready the rest looks.
    pub start_blocked: Option<Duration>,
    /// A CSI volume's republish failed: tried again when its back-off ends, though nothing
    /// else calls for a look (the pod runs as it is).
    pub republish_after: Option<Duration>,
}

/// The wait before the next look; `None` means only events and the resync bring it.
pub(crate) fn next_look(facts: &SyncFacts) -> Option<Duration> {
    let mut next = facts.decision.retry_after();
    let mut sooner = |d: Duration| next = Some(next.map_or(d, |n: Duration| n.min(d)));
    // Waiting on volumes, the containers' ContainerCreating is no error to retry, and the
    // sandbox or containers still to start are no progress that could be made now.
    let blocked = facts.start_blocked.is_some();
    if let Some(wait) = facts.start_blocked {
        sooner(wait);
    }
    if let Some(wait) = facts.republish_after {
        sooner(wait);
    }
    if facts.failed || (facts.error_waiting && !blocked) {
        sooner(ERROR_RETRY);
    }
    if let Some(followup) = facts.followup.filter(|_| !facts.failed) {
        if !blocked && makes_progress(followup, facts.blocked) {
            sooner(PROGRESS_RETRY);
        }
        if let Some(wait) = followup.retry_after() {
            sooner(wait);
        }
    }
    if facts.init_running {
        sooner(if facts.events_live {
            EVENT_DEADLINE
        } else {
            INIT_POLL
        });
    }
    if facts.exit_pending {
        sooner(CATCH_UP);
    }
    next
}

/// True when carrying out `followup` would move the pod on: a sandbox to make, something to
/// stop, or a container to start whose start is not blocked by an error.
pub(crate) fn makes_progress(followup: &PodActions, blocked: &dyn Fn(&str) -> bool) -> bool {
    followup.create_sandbox.is_some()
        || followup.kill_pod.is_some()
        || !followup.kill_containers.is_empty()
        || followup.start_containers.iter().any(|s| !blocked(&s.name))
}

/// True when a step carried out all of `decision`: the sandbox it was to make was made and no
/// container it was to start waits on an error. Only then does the same sync go on with the
/// next step; a step that fell short is retried at its own pace.
pub(crate) fn went_through(
    decision: &PodActions,
    made_sandbox: bool,
    blocked: &dyn Fn(&str) -> bool,
) -> bool {
    (decision.create_sandbox.is_none() || made_sandbox)
        && !decision.start_containers.iter().any(|s| blocked(&s.name))
}

/// True when a regular init container of the pod runs in its newest sandbox.
pub(crate) fn init_running(pod: &Pod, observed: &ObservedPod) -> bool {
    let Some(sandbox) = observed.newest_sandbox() else {
        return false;
    };
    pod.spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .filter(|c| !is_sidecar(c))
        .any(|c| {
            observed.containers.iter().any(|i| {
                i.name == c.name && i.sandbox_id == sandbox.id && i.state == ContainerState::Running
            })
        })
}

/// True when the decision asks for anything beyond keeping the pod as it is.
pub(crate) fn changes_anything(decision: &PodActions) -> bool {
    *decision
        != PodActions {
            sandbox_id: decision.sandbox_id.clone(),
            terminal: decision.terminal,
            ..Default::default()
        }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::runtime::actions::{BackoffWait, ContainerKind, StartContainer};

    fn start(name: &str) -> StartContainer {
        StartContainer {
            kind: ContainerKind::App,
            index: 0,
            name: name.into(),
            restart_count: 0,
            backoff: None,
            round: None,
        }
    }

    fn waits(secs: u64) -> PodActions {
        PodActions {
            waiting: vec![BackoffWait {
                name: "a".into(),
                remaining: Duration::from_secs(secs),
                message: String::new(),
            }],
            ..Default::default()
        }
    }

    #[test]
    fn next_look_table() {
        let none = PodActions::default();
        let waits_7 = waits(7);
        let waits_3 = waits(3);
        let starts_b = PodActions {
            start_containers: vec![start("b")],
            ..Default::default()
        };
        let nobody: &dyn Fn(&str) -> bool = &|_| false;
        let b_blocked: &dyn Fn(&str) -> bool = &|n| n == "b";
        let facts = |decision, failed, error_waiting, followup, blocked, init_running| SyncFacts {
            decision,
            failed,
            error_waiting,
            followup,
            blocked,
            init_running,
            events_live: false,
            exit_pending: false,
            start_blocked: None,
            republish_after: None,
        };
        fn live(f: SyncFacts<'_>) -> SyncFacts<'_> {
            SyncFacts {
                events_live: true,
                ..f
            }
        }
        fn pending(f: SyncFacts<'_>) -> SyncFacts<'_> {
            SyncFacts {
                exit_pending: true,
                ..f
            }
        }
        fn republish_wait(ms: u64, f: SyncFacts<'_>) -> SyncFacts<'_> {
            SyncFacts {
                republish_after: Some(Duration::from_millis(ms)),
                ..f
            }
        }
        fn volumes_wait(ms: u64, f: SyncFacts<'_>) -> SyncFacts<'_> {
            SyncFacts {
                start_blocked: Some(Duration::from_millis(ms)),
                ..f
            }
        }
        let new_sandbox = PodActions {
            create_sandbox: Some(0),
            ..starts_b.clone()
        };
        let ms = Duration::from_millis;
        let rows: Vec<(&str, SyncFacts, Option<Duration>)> = vec![
            (
                "nothing to do",
                facts(&none, false, false, None, nobody, false),
                None,
            ),
            (
                "a back-off ends in 7s",
                facts(&waits_7, false, false, None, nobody, false),
                Some(Duration::from_secs(7)),
            ),
            (
                "a failure retries in 2s",
                facts(&none, true, false, Some(&starts_b), nobody, false),
                Some(ERROR_RETRY),
            ),
            (
                "an error wait retries in 2s",
                facts(&none, false, true, None, nobody, false),
                Some(ERROR_RETRY),
            ),
            (
                "more is due at once",
                facts(&none, false, false, Some(&starts_b), nobody, false),
                Some(ms(20)),
            ),
            (
                "a blocked start is not progress",
                facts(&none, false, false, Some(&starts_b), b_blocked, false),
                None,
            ),
            (
                "the follow-up's back-off counts",
                facts(&none, false, false, Some(&waits_3), nobody, false),
                Some(Duration::from_secs(3)),
            ),
            (
                "an init container runs",
                facts(&waits_7, false, false, None, nobody, true),
                Some(INIT_POLL),
            ),
            (
                "with events, its exit is waited for with a deadline",
                live(facts(&waits_7, false, false, None, nobody, true)),
                Some(EVENT_DEADLINE),
            ),
            (
                "with events, a sooner back-off still counts",
                live(facts(&waits_3, false, false, None, nobody, true)),
                Some(Duration::from_secs(3)),
            ),
            (
                "with events and nothing running, nothing to wait for",
                live(facts(&none, false, false, None, nobody, false)),
                None,
            ),
            (
                "an exit the view does not show yet",
                pending(live(facts(&none, false, false, None, nobody, false))),
                Some(CATCH_UP),
            ),
            (
                "volumes back off: the sandbox still to make is no progress",
                volumes_wait(
                    500,
                    facts(&new_sandbox, false, true, Some(&new_sandbox), nobody, false),
                ),
                Some(ms(500)),
            ),
            (
                "volumes back off for two minutes: no error retry either",
                volumes_wait(
                    122_000,
                    facts(&new_sandbox, false, true, Some(&new_sandbox), nobody, false),
                ),
                Some(Duration::from_secs(122)),
            ),
            (
                "volumes back off, a crash-loop wait ends sooner",
                volumes_wait(
                    8000,
                    facts(&waits_3, false, true, Some(&waits_3), nobody, false),
                ),
                Some(Duration::from_secs(3)),
            ),
            (
                "volumes back off but a CRI call failed",
                volumes_wait(
                    8000,
                    facts(&new_sandbox, true, true, Some(&new_sandbox), nobody, false),
                ),
                Some(ERROR_RETRY),
            ),
            (
                "a running pod whose CSI republish failed: after its back-off",
                republish_wait(500, facts(&none, false, false, None, nobody, false)),
                Some(ms(500)),
            ),
            (
                "a republish back-off, a crash-loop wait ends sooner",
                republish_wait(8000, facts(&waits_3, false, false, None, nobody, false)),
                Some(Duration::from_secs(3)),
            ),
        ];
        for (name, f, want) in rows {
            assert_eq!(next_look(&f), want, "{name}");
        }
    }

    #[test]
    fn a_step_went_through_only_when_all_of_it_was_done() {
        let nobody: &dyn Fn(&str) -> bool = &|_| false;
        let b_blocked: &dyn Fn(&str) -> bool = &|n| n == "b";
        let starts_b = PodActions {
            start_containers: vec![start("b")],
            ..Default::default()
        };
        let new_sandbox = PodActions {
            create_sandbox: Some(0),
            ..starts_b.clone()
        };
        type Row<'a> = (
            &'a str,
            &'a PodActions,
            bool,
            &'a dyn Fn(&str) -> bool,
            bool,
        );
        let rows: Vec<Row> = vec![
            ("a start that went", &starts_b, false, nobody, true),
            (
                "a start that waits on an error",
                &starts_b,
                false,
                b_blocked,
                false,
            ),
            ("the sandbox made", &new_sandbox, true, nobody, true),
            (
                "the sandbox not made (volumes not ready)",
                &new_sandbox,
                false,
                nobody,
                false,
            ),
        ];
        for (name, decision, made, blocked, want) in rows {
            assert_eq!(went_through(decision, made, blocked), want, "{name}");
        }
    }

    #[test]
    fn changes_anything_ignores_the_kept_sandbox() {
        let keep = PodActions {
            sandbox_id: Some("s0".into()),
            ..Default::default()
        };
        assert!(!changes_anything(&keep));
        assert!(changes_anything(&PodActions {
            start_containers: vec![start("a")],
            ..keep
        }));
    }
}
