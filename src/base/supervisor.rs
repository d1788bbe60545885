//! Supervised background tasks: the Lease and node status, the status writer, the event sink,
//! the eviction manager, the garbage collectors, the mirror pods, certificate rotation.
//!
//! A panic in one of them used to end that task silently while `/healthz` stayed ok: the Lease
//! stopped being renewed and nothing said why. Here each task runs under a supervisor that
//! catches the panic, logs it, counts it in `deckhand_task_panics_total{task}`, shows the task
//! as failing in the `tasks` health check, and starts the task again after a back-off (1 s,
//! doubling, at most 5 minutes; a task that ran 10 minutes without panicking starts over at
//! 1 s), so a bug that always panics cannot spin. A task that returns is done and not restarted
//! (the eviction manager without thresholds returns at once, by design).
//!
//! A restart starts the task from scratch, as an agent restart would: each task is given as a
//! factory that makes a fresh future from state the supervisor keeps.

use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::base::clock;
use crate::base::health::{CheckFailure, CheckResult, Health};
use crate::base::metrics::KUBELET;

/// The first wait before a restart; doubled for each panic in a row.
const FIRST_RESTART_DELAY: Duration = Duration::from_secs(1);
/// The longest wait before a restart.
const MAX_RESTART_DELAY: Duration = Duration::from_secs(300);
/// A run this long without a panic resets the back-off.
const RESET_AFTER: Duration = Duration::from_secs(600);
/// How long after a panic the task shows as failing, at least (longer while it waits to
/// restart), so a task that panics on every round stays visible in `/healthz`.
const FAILING_FOR: Duration = Duration::from_secs(120);

/// The wait before restarting a task after its `consecutive`th panic in a row (1-based).
pub(crate) fn restart_delay(consecutive: u32) -> Duration {
    let doublings = consecutive.saturating_sub(1).min(16);
    FIRST_RESTART_DELAY
        .saturating_mul(1 << doublings)
        .min(MAX_RESTART_DELAY)
}

/// Panics in a row after a run that lasted `ran` and ended in a panic: a long clean run
/// starts the count over.
pub(crate) fn consecutive_after(previous: u32, ran: Duration) -> u32 {
    if ran >= RESET_AFTER {
        1
    } else {
        previous.saturating_add(1)
    }
}

/// What the supervisor remembers of a task that has panicked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PanicRecord {
    /// Panics since the agent started.
    pub total: u64,
    /// When the last one was caught.
    pub at: Instant,
    /// Its message.
    pub message: String,
    /// The wait before the restart that follows it.
    pub restart_in: Duration,
}

/// The `tasks` health check: failing while any task panicked within [`FAILING_FOR`] or still
/// waits for its restart; the reason names each such task.
pub(crate) fn verdict(records: &BTreeMap<&'static str, PanicRecord>, now: Instant) -> CheckResult {
    let failing: Vec<String> = records
        .iter()
        .filter(|(_, r)| now.duration_since(r.at) < FAILING_FOR.max(r.restart_in))
        .map(|(task, r)| describe(task, r, now))
        .collect();
    if failing.is_empty() {
        return Ok(None);
    }
    Err(CheckFailure(failing.join("; ")))
}

fn describe(task: &str, r: &PanicRecord, now: Instant) -> String {
    let ago = now.duration_since(r.at);
    let state = match r.restart_in.checked_sub(ago) {
        Some(left) if !left.is_zero() => format!("restarting in {} s", left.as_secs().max(1)),
        _ => "restarted".to_string(),
    };
    let times = if r.total == 1 { "time" } else { "times" };
    format!(
        "{task} panicked {} {times}, last {} s ago ({}); {state}",
        r.total,
        ago.as_secs(),
        r.message
    )
}

/// The text of a panic's payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-text payload".to_string()
    }
}

type Records = Arc<Mutex<BTreeMap<&'static str, PanicRecord>>>;

/// Starts tasks on a tracker and restarts those that panic. Cheap to clone.
#[derive(Clone)]
pub struct Supervisor {
    tracker: TaskTracker,
    cancel: CancellationToken,
    records: Records,
    /// Fault injection for tests (`DECKHAND_TEST_PANIC_TASK`): the first run of this task
    /// panics before it starts.
    inject_panic: Option<String>,
}

impl Supervisor {
    /// A supervisor whose tasks run on `tracker` until `cancel`; registers the `tasks` check.
    pub fn new(
        tracker: TaskTracker,
        cancel: CancellationToken,
        health: &Health,
        inject_panic: Option<String>,
    ) -> Supervisor {
        let records = Records::default();
        let seen = records.clone();
        health.register_noted("tasks", move || {
            let records = seen.lock().unwrap_or_else(|e| e.into_inner());
            verdict(&records, clock::instant())
        });
        Supervisor {
            tracker,
            cancel,
            records,
            inject_panic,
        }
    }

    /// The tracker the tasks run on (shutdown waits on it).
    pub fn tracker(&self) -> &TaskTracker {
        &self.tracker
    }

    /// Runs `make()` as the task named `task`, and again after a back-off each time it panics.
    pub fn spawn<F, Fut>(&self, task: &'static str, make: F)
    where
        F: FnMut() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let inject = self.inject_panic.as_deref() == Some(task);
        let run = supervise(
            task,
            make,
            self.records.clone(),
            self.cancel.clone(),
            inject,
        );
        self.tracker.spawn(run);
    }
}

/// The supervising loop of one task.
async fn supervise<F, Fut>(
    task: &'static str,
    mut make: F,
    records: Records,
    cancel: CancellationToken,
    mut inject: bool,
) where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut consecutive = 0;
    loop {
        let started = clock::instant();
        let run = make();
        let panic_now = std::mem::take(&mut inject);
        let outcome = AssertUnwindSafe(async move {
            if panic_now {
                panic!("injected by DECKHAND_TEST_PANIC_TASK");
            }
            run.await
        })
        .catch_unwind()
        .await;
        let payload = match outcome {
            _ if cancel.is_cancelled() => return,
            Ok(()) => return,
            Err(payload) => payload,
        };
        consecutive = consecutive_after(consecutive, started.elapsed());
        let restart_in = restart_delay(consecutive);
        let message = panic_message(payload.as_ref());
        note_panic(&records, task, &message, restart_in);
        tracing::error!(
            task,
            error = %message,
            restart_in_ms = restart_in.as_millis() as u64,
            "a background task panicked; it starts again after a back-off"
        );
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(restart_in) => {}
        }
    }
}

fn note_panic(records: &Records, task: &'static str, message: &str, restart_in: Duration) {
    KUBELET.task_panics.inc(&[task]);
    let mut records = records.lock().unwrap_or_else(|e| e.into_inner());
    let total = records.get(task).map_or(0, |r| r.total) + 1;
    records.insert(
        task,
        PanicRecord {
            total,
            at: clock::instant(),
            message: message.to_string(),
            restart_in,
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn restart_delay_doubles_from_a_second_up_to_five_minutes() {
        let table = [
            (0, 1),
            (1, 1),
            (2, 2),
            (3, 4),
            (9, 256),
            (10, 300),
            (40, 300),
            (u32::MAX, 300),
        ];
        for (n, secs) in table {
            assert_eq!(restart_delay(n), Duration::from_secs(secs), "after {n}");
        }
    }

    #[test]
    fn a_long_clean_run_starts_the_count_over() {
        let table = [
            (0, Duration::ZERO, 1),
            (3, Duration::from_secs(5), 4),
            (3, RESET_AFTER, 1),
            (u32::MAX, Duration::ZERO, u32::MAX),
        ];
        for (previous, ran, want) in table {
            assert_eq!(consecutive_after(previous, ran), want, "{previous} {ran:?}");
        }
    }

    fn record(total: u64, at: Instant, restart_in: u64) -> PanicRecord {
        PanicRecord {
            total,
            at,
            message: "boom".into(),
            restart_in: Duration::from_secs(restart_in),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_check_names_each_task_that_panicked_recently_or_waits() {
        let t0 = Instant::now();
        let secs = Duration::from_secs;
        // (records as (task, total, panicked at t0+s, restart_in), now as t0+s, reason)
        type Row = (
            &'static [(&'static str, u64, u64, u64)],
            u64,
            Option<&'static str>,
        );
        let table: [Row; 5] = [
            (&[], 10, None),
            (
                &[("lease", 1, 0, 1)],
                0,
                Some("lease panicked 1 time, last 0 s ago (boom); restarting in 1 s"),
            ),
            (
                &[("lease", 2, 0, 2)],
                5,
                Some("lease panicked 2 times, last 5 s ago (boom); restarted"),
            ),
            (&[("lease", 2, 0, 2)], 120, None),
            (
                &[("gc", 9, 0, 300), ("lease", 1, 0, 1)],
                200,
                Some("gc panicked 9 times, last 200 s ago (boom); restarting in 100 s"),
            ),
        ];
        for (records, now, want) in table {
            let map: BTreeMap<&'static str, PanicRecord> = records
                .iter()
                .map(|(task, total, at, restart)| {
                    let task: &'static str = Box::leak(task.to_string().into_boxed_str());
                    (task, record(*total, t0 + secs(*at), *restart))
                })
                .collect();
            let got = verdict(&map, t0 + secs(now));
            match want {
                None => assert_eq!(got, Ok(None), "at {now}"),
                Some(reason) => assert_eq!(got, Err(CheckFailure(reason.into())), "at {now}"),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_panicking_task_is_restarted_after_a_back_off_and_shown_failing() {
        let health = Health::default();
        let cancel = CancellationToken::new();
        let supervisor = Supervisor::new(TaskTracker::new(), cancel.clone(), &health, None);
        let runs = Arc::new(AtomicU32::new(0));
        let counted = runs.clone();
        let stop = cancel.clone();
        supervisor.spawn("sup-test-panics", move || {
            let n = counted.fetch_add(1, Ordering::SeqCst);
            let stop = stop.clone();
            async move {
                if n < 2 {
                    panic!("round {n}");
                }
                stop.cancelled().await
            }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        let report = health.report();
        assert!(!report.healthy());
        assert!(
            report
                .render(true)
                .contains("sup-test-panics panicked 1 time")
        );
        // 1 s, then 2 s of back-off: the third run starts and keeps running.
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        tokio::time::sleep(Duration::from_millis(2_000)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        tokio::time::sleep(FAILING_FOR).await;
        assert!(health.report().healthy());
        assert_eq!(runs.load(Ordering::SeqCst), 3);
        cancel.cancel();
        supervisor.tracker().close();
        supervisor.tracker().wait().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_task_that_returns_is_done_and_an_injected_panic_is_caught() {
        let health = Health::default();
        let supervisor = Supervisor::new(
            TaskTracker::new(),
            CancellationToken::new(),
            &health,
            Some("sup-test-inject".into()),
        );
        let runs = Arc::new(AtomicU32::new(0));
        let counted = runs.clone();
        supervisor.spawn("sup-test-inject", move || {
            counted.fetch_add(1, Ordering::SeqCst);
            async {}
        });
        supervisor.tracker().close();
        tokio::time::timeout(Duration::from_secs(5), supervisor.tracker().wait())
            .await
            .expect("the task ends once it returns");
        // Made twice: the first run panicked before it started, the second returned.
        assert_eq!(runs.load(Ordering::SeqCst), 2);
        assert!(
            health
                .report()
                .render(true)
                .contains("sup-test-inject panicked 1 time")
        );
    }
}
