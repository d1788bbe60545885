//! Table tests for the pod worker's state machine ([`WorkerState::step`]): each row is the
//! worker's state before, one event, the actions asked for (as short text) and the state
//! after. The async driver only waits and carries actions out, so these rows are the worker's
//! decisions.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio_util::sync::CancellationToken;

use super::test_support::pod;
use super::*;

/// An action as short text: `sync create`, `wait 1s`, `record start`, …
fn label(action: &Action) -> String {
    match action {
        Action::Kill(kill) => match &kill.outcome {
            Some(_) => format!("kill grace {}", kill.grace),
            None => format!("stop the finished pod, grace {}", kill.grace),
        },
        Action::Sync(job) if job.inject_panic => format!("sync {} with a panic", job.operation),
        Action::Sync(job) => format!("sync {}", job.operation),
        Action::Terminate {
            pod,
            grace_override,
        } => format!(
            "terminate {} grace {grace_override:?}",
            pod.as_deref().map(full_name).unwrap_or("(orphan)".into())
        ),
        Action::RecordStart(pod) => format!("record start of {}", full_name(pod)),
        Action::ReportPanic { report, wait } => format!(
            "report panic of {} while {}: {}; retry in {}s",
            report.pod,
            report.doing,
            report.message,
            wait.as_secs()
        ),
        Action::WaitFor(wait) => format!("wait {}s", wait.as_secs()),
        Action::LookNow => "look now".into(),
        Action::Finish => "finish".into(),
    }
}

/// The state's fields as short text; `last_synced` names which of `pods` it is (by pointer,
/// as the worker compares them), `-` for none.
fn summary(w: &WorkerState, pods: &[(&str, &Arc<Pod>)]) -> String {
    let last = match &w.last_synced {
        None => "-".to_string(),
        Some(p) => pods
            .iter()
            .find(|(_, q)| Arc::ptr_eq(p, q))
            .map(|(name, _)| name.to_string())
            .unwrap_or_else(|| "another pod".into()),
    };
    format!(
        "injected={} panics={} last={last} recorded={} killed={} finished={}",
        w.injected_panic, w.panics_in_a_row, w.start_recorded, w.killed, w.finished
    )
}

/// A worker state for a row.
fn state(
    panics_in_a_row: u32,
    last_synced: Option<&Arc<Pod>>,
    start_recorded: bool,
    killed: bool,
) -> WorkerState {
    WorkerState {
        panic_pod: None,
        injected_panic: false,
        panics_in_a_row,
        last_synced: last_synced.cloned(),
        start_recorded,
        killed,
        finished: false,
    }
}

/// [`state`] of a pod that finished by itself (and, with `killed`, was stopped).
fn finished_state(last_synced: Option<&Arc<Pod>>, killed: bool) -> WorkerState {
    WorkerState {
        finished: true,
        ..state(0, last_synced, true, killed)
    }
}

fn kill(pod: &Arc<Pod>) -> Work {
    Work::Kill(Kill {
        pod: pod.clone(),
        grace: 30,
        outcome: Some(FinalStatus {
            reason: "Terminated".into(),
            message: "node shutdown".into(),
            disruption_reason: None,
        }),
        done: CancellationToken::new(),
    })
}

fn panicked(doing: &'static str) -> Event {
    Event::Panicked(PanicReport {
        pod: "default/web".into(),
        doing,
        message: "boom".into(),
    })
}

struct Row {
    name: &'static str,
    before: WorkerState,
    event: Event,
    actions: &'static [&'static str],
    after: WorkerState,
}

#[test]
fn each_event_gives_its_actions_and_state() {
    let a = pod("uid-a");
    // The same pod as a new object: an update.
    let a2 = Arc::new((*a).clone());
    let pods = [("a", &a), ("a2", &a2)];
    let synced = |running: bool| Event::Synced {
        pod: a.clone(),
        wait: Duration::from_secs(10),
        running,
        finished: false,
    };
    let finished = Event::Synced {
        pod: a.clone(),
        wait: Duration::from_secs(10),
        running: false,
        finished: true,
    };
    // The pod as its source shows it once finished (the API server's copy, Succeeded).
    let done = {
        let mut p = (*a).clone();
        p.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        });
        Arc::new(p)
    };
    let rows = vec![
        Row {
            name: "the first sync is a create",
            before: state(0, None, false, false),
            event: Event::Picked(Work::Sync(a.clone())),
            actions: &["sync create"],
            after: state(0, Some(&a), false, false),
        },
        Row {
            name: "the same pod object again is a plain sync",
            before: state(0, Some(&a), false, false),
            event: Event::Picked(Work::Sync(a.clone())),
            actions: &["sync sync"],
            after: state(0, Some(&a), false, false),
        },
        Row {
            name: "a new pod object is an update",
            before: state(0, Some(&a), false, false),
            event: Event::Picked(Work::Sync(a2.clone())),
            actions: &["sync update"],
            after: state(0, Some(&a2), false, false),
        },
        Row {
            name: "a completed sync resets the panics and looks again when asked",
            before: state(3, Some(&a), false, false),
            event: synced(false),
            actions: &["wait 10s"],
            after: state(0, Some(&a), false, false),
        },
        Row {
            name: "the first sync that finds the pod running records its start",
            before: state(0, Some(&a), false, false),
            event: synced(true),
            actions: &["wait 10s", "record start of default/web"],
            after: state(0, Some(&a), true, false),
        },
        Row {
            name: "a start is recorded once",
            before: state(0, Some(&a), true, false),
            event: synced(true),
            actions: &["wait 10s"],
            after: state(0, Some(&a), true, false),
        },
        Row {
            name: "a sync that finds the pod finished stops it for good, keeping its containers",
            before: state(0, Some(&a), true, false),
            event: finished,
            actions: &["stop the finished pod, grace 30"],
            after: finished_state(Some(&a), false),
        },
        Row {
            name: "a pod its source shows finished is never synced (started), only stopped",
            before: state(0, None, false, false),
            event: Event::Picked(Work::Sync(done.clone())),
            actions: &["stop the finished pod, grace 30"],
            after: WorkerState {
                finished: true,
                ..state(0, None, false, false)
            },
        },
        Row {
            name: "a finished pod once stopped is never synced again, only read again",
            before: finished_state(Some(&a), true),
            event: Event::Picked(Work::Sync(done.clone())),
            actions: &["stop the finished pod, grace 30"],
            after: finished_state(Some(&a), true),
        },
        Row {
            name: "a killed pod that did not finish by itself is not even read again",
            before: state(0, Some(&a), true, true),
            event: Event::Picked(Work::Sync(done.clone())),
            actions: &["wait 3600s"],
            after: state(0, Some(&a), true, true),
        },
        Row {
            name: "a sync that ran before the stop was done asks for no second stop",
            before: state(0, Some(&a), true, true),
            event: Event::Synced {
                pod: a.clone(),
                wait: Duration::from_secs(10),
                running: false,
                finished: true,
            },
            actions: &["wait 10s"],
            after: state(0, Some(&a), true, true),
        },
        Row {
            name: "a kill is carried out",
            before: state(0, Some(&a), false, false),
            event: Event::Picked(kill(&a)),
            actions: &["kill grace 30"],
            after: state(0, Some(&a), false, false),
        },
        Row {
            name: "a kill done leaves the worker idle",
            before: state(0, Some(&a), false, false),
            event: Event::Killed,
            actions: &["wait 3600s"],
            after: state(0, Some(&a), false, true),
        },
        Row {
            name: "a failed kill is tried again after a second",
            before: state(0, Some(&a), false, false),
            event: Event::KillFailed,
            actions: &["wait 1s"],
            after: state(0, Some(&a), false, false),
        },
        Row {
            name: "a killed pod is not synced again",
            before: state(0, Some(&a), false, true),
            event: Event::Picked(Work::Sync(a2.clone())),
            actions: &["wait 3600s"],
            after: state(0, Some(&a), false, true),
        },
        Row {
            name: "a killed pod is not killed again",
            before: state(0, Some(&a), false, true),
            event: Event::Picked(kill(&a)),
            actions: &["wait 3600s"],
            after: state(0, Some(&a), false, true),
        },
        Row {
            name: "a killed pod is still torn down",
            before: state(0, Some(&a), false, true),
            event: Event::Picked(Work::Terminate {
                pod: Some(a.clone()),
                grace_override: Some(5),
            }),
            actions: &["terminate default/web grace Some(5)"],
            after: state(0, Some(&a), false, true),
        },
        Row {
            name: "an orphan is torn down",
            before: state(0, None, false, false),
            event: Event::Picked(Work::Terminate {
                pod: None,
                grace_override: None,
            }),
            actions: &["terminate (orphan) grace None"],
            after: state(0, None, false, false),
        },
        Row {
            name: "a pod torn down ends the worker",
            before: state(0, Some(&a), false, false),
            event: Event::TornDown,
            actions: &["finish"],
            after: state(0, Some(&a), false, false),
        },
        Row {
            name: "a failed teardown is tried again after two seconds",
            before: state(1, Some(&a), false, false),
            event: Event::TeardownFailed,
            actions: &["wait 2s"],
            after: state(1, Some(&a), false, false),
        },
        Row {
            name: "newer work that interrupts is looked at at once",
            before: state(0, Some(&a), false, false),
            event: Event::Interrupted,
            actions: &["look now"],
            after: state(0, Some(&a), false, false),
        },
        Row {
            name: "a first panic is reported and retried after a second",
            before: state(0, Some(&a), false, false),
            event: panicked("syncing"),
            actions: &[
                "report panic of default/web while syncing: boom; retry in 1s",
                "wait 1s",
            ],
            after: state(1, Some(&a), false, false),
        },
        Row {
            name: "panics in a row back off further, whatever the worker was doing",
            before: state(2, Some(&a), false, false),
            event: panicked("tearing the pod down"),
            actions: &[
                "report panic of default/web while tearing the pod down: boom; retry in 4s",
                "wait 4s",
            ],
            after: state(3, Some(&a), false, false),
        },
        Row {
            name: "the back-off stops at a minute",
            before: state(9, Some(&a), false, false),
            event: panicked("killing"),
            actions: &[
                "report panic of default/web while killing: boom; retry in 60s",
                "wait 60s",
            ],
            after: state(10, Some(&a), false, false),
        },
    ];
    for row in rows {
        let Row {
            name,
            mut before,
            event,
            actions,
            after,
        } = row;
        let got: Vec<String> = before.step(event).iter().map(label).collect();
        assert_eq!(got, actions, "{name}: actions");
        assert_eq!(
            summary(&before, &pods),
            summary(&after, &pods),
            "{name}: state after"
        );
    }
}

#[test]
fn the_test_panic_is_injected_into_the_named_pods_first_sync_only() {
    let a = pod("uid-a");
    let mut named = WorkerState::new(Some("web".into()));
    let sync = |w: &mut WorkerState| -> Vec<String> {
        w.step(Event::Picked(Work::Sync(a.clone())))
            .iter()
            .map(label)
            .collect()
    };
    assert_eq!(sync(&mut named), ["sync create with a panic"]);
    assert!(named.injected_panic);
    assert_eq!(sync(&mut named), ["sync sync"]);

    let mut other = WorkerState::new(Some("db".into()));
    assert_eq!(sync(&mut other), ["sync create"]);
    assert!(!other.injected_panic);
}

#[test]
fn a_pods_life_from_first_sync_to_removal() {
    let a = pod("uid-a");
    let mut worker = WorkerState::new(None);
    let steps: Vec<(Event, &[&str])> = vec![
        (Event::Picked(Work::Sync(a.clone())), &["sync create"]),
        (
            panicked("syncing"),
            &[
                "report panic of default/web while syncing: boom; retry in 1s",
                "wait 1s",
            ],
        ),
        (Event::Picked(Work::Sync(a.clone())), &["sync sync"]),
        (
            Event::Synced {
                pod: a.clone(),
                wait: Duration::from_secs(60),
                running: true,
                finished: false,
            },
            &["wait 60s", "record start of default/web"],
        ),
        // A panic after a completed sync starts the back-off over.
        (Event::Picked(Work::Sync(a.clone())), &["sync sync"]),
        (
            panicked("syncing"),
            &[
                "report panic of default/web while syncing: boom; retry in 1s",
                "wait 1s",
            ],
        ),
        (Event::Picked(kill(&a)), &["kill grace 30"]),
        (Event::Killed, &["wait 3600s"]),
        (Event::Picked(Work::Sync(a.clone())), &["wait 3600s"]),
        (
            Event::Picked(Work::Terminate {
                pod: Some(a.clone()),
                grace_override: None,
            }),
            &["terminate default/web grace None"],
        ),
        (Event::TeardownFailed, &["wait 2s"]),
        (
            Event::Picked(Work::Terminate {
                pod: Some(a.clone()),
                grace_override: None,
            }),
            &["terminate default/web grace None"],
        ),
        (Event::TornDown, &["finish"]),
    ];
    for (i, (event, want)) in steps.into_iter().enumerate() {
        let got: Vec<String> = worker.step(event).iter().map(label).collect();
        assert_eq!(got, want, "step {i}");
    }
}

/// A pod that runs to completion: stopped and kept once it finished (its containers and logs
/// stay for `kubectl logs`), removed only when its source removes it.
#[test]
fn a_finished_pod_is_kept_until_it_is_removed() {
    let a = pod("uid-a");
    let mut worker = WorkerState::new(None);
    let synced = |finished| Event::Synced {
        pod: a.clone(),
        wait: Duration::from_secs(60),
        running: false,
        finished,
    };
    let steps: Vec<(Event, &[&str])> = vec![
        (Event::Picked(Work::Sync(a.clone())), &["sync create"]),
        (synced(false), &["wait 60s"]),
        (Event::Picked(Work::Sync(a.clone())), &["sync sync"]),
        (synced(true), &["stop the finished pod, grace 30"]),
        // The stop failed: the next look syncs and stops again.
        (Event::KillFailed, &["wait 1s"]),
        (Event::Picked(Work::Sync(a.clone())), &["sync sync"]),
        (synced(true), &["stop the finished pod, grace 30"]),
        (Event::Killed, &["wait 3600s"]),
        // A later look (a poke, an update) reads it again and starts nothing.
        (
            Event::Picked(Work::Sync(a.clone())),
            &["stop the finished pod, grace 30"],
        ),
        (Event::Killed, &["wait 3600s"]),
        (
            Event::Picked(Work::Terminate {
                pod: Some(a.clone()),
                grace_override: None,
            }),
            &["terminate default/web grace None"],
        ),
        (Event::TornDown, &["finish"]),
    ];
    for (i, (event, want)) in steps.into_iter().enumerate() {
        let got: Vec<String> = worker.step(event).iter().map(label).collect();
        assert_eq!(got, want, "step {i}");
    }
}
