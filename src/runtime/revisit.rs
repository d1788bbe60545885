//! When a pod's worker should look at it again, decided purely from what one sync did and saw.
//!
//! Upstream's worker looks again at the next relist (1 s) or resync. Deckhand comes back sooner
//! when it knows more is due: at once after a step of the start-up went through and the fresh
//! view already calls for the next one, every 50 ms while a regular init container runs (its
//! exit starts the next), after 2 s when a step failed, and when a back-off ends.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use super::actions::PodActions;
use crate::k8s::is_sidecar;
use crate::observed::{ContainerState, ObservedPod};

/// How often a pod is looked at while one of its init containers runs.
pub const INIT_POLL: Duration = Duration::from_millis(50);
/// How soon a pod is looked at again after a step of its start-up went through.
pub const PROGRESS_RETRY: Duration = Duration::from_millis(20);
/// How soon a sync that hit an error is retried.
pub const ERROR_RETRY: Duration = Duration::from_secs(2);

/// What one sync did and saw, as far as the next look is concerned.
pub struct SyncFacts<'a> {
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
}

/// The wait before the next look; `None` means only events and the resync bring it.
pub fn next_look(facts: &SyncFacts) -> Option<Duration> {
    let mut next = facts.decision.retry_after();
    let mut sooner = |d: Duration| next = Some(next.map_or(d, |n: Duration| n.min(d)));
    if facts.failed || facts.error_waiting {
        sooner(ERROR_RETRY);
    }
    if let Some(followup) = facts.followup.filter(|_| !facts.failed) {
        let more = followup.create_sandbox.is_some()
            || followup.kill_pod.is_some()
            || !followup.kill_containers.is_empty()
            || followup
                .start_containers
                .iter()
                .any(|s| !(facts.blocked)(&s.name));
        if more {
            sooner(PROGRESS_RETRY);
        }
        if let Some(wait) = followup.retry_after() {
            sooner(wait);
        }
    }
    if facts.init_running {
        sooner(INIT_POLL);
    }
    next
}

/// True when a regular init container of the pod runs in its newest sandbox.
pub fn init_running(pod: &Pod, observed: &ObservedPod) -> bool {
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
pub fn changes_anything(decision: &PodActions) -> bool {
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
    use crate::runtime::actions::{BackoffWait, ContainerKind, StartContainer};

    fn start(name: &str) -> StartContainer {
        StartContainer {
            kind: ContainerKind::App,
            index: 0,
            name: name.into(),
            restart_count: 0,
            backoff: None,
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
        ];
        for (name, f, want) in rows {
            assert_eq!(next_look(&f), want, "{name}");
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
