//! One probe of one container instance: when to run it, and what a run of outcomes means.
//!
//! The worker waits for the initial delay (counted from the moment the container started) and,
//! right after an agent start, a random part of the period, then runs the probe once per
//! period, as upstream's worker does: after the random wait its ticks fall on `jitter + k ·
//! period`, and the first probe is the first tick once the initial delay is over; a run that
//! takes longer than the period is followed by the next one at once, and the ticks keep their
//! phase (Go's ticker drops the ticks it missed, it does not shift the later ones). A liveness or readiness worker of a container with a startup probe waits until that
//! probe has succeeded. Consecutive equal outcomes are counted; when a run reaches the success or
//! failure threshold the worker reports a [`Verdict`]:
//!
//! - readiness: ready or not ready, again every time the state flips; it runs while the instance
//!   runs;
//! - startup: started (then the worker ends), or unhealthy after `failureThreshold` failures;
//! - liveness: unhealthy after `failureThreshold` failures.
//!
//! After an unhealthy verdict the worker ends: the instance is about to be killed, and a new
//! instance gets new workers. A probe that could not be carried out is retried at once (three
//! tries in all) and then ignored: it neither breaks nor extends a run.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::{ProbeKind, ProbeOutcome, Unhealthy};
use crate::base::clock;

/// How many times a probe that errored is tried within one period.
pub(crate) const MAX_TRIES: usize = 3;

/// The schedule and thresholds of one worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct WorkerConfig {
    pub kind: ProbeKind,
    pub container_name: String,
    pub initial_delay: Duration,
    pub period: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
    /// How long the instance had been running when the worker started.
    pub running_for: Duration,
    /// An extra wait before the first run, to spread probes that start together.
    pub jitter: Duration,
    /// The probe's own `terminationGracePeriodSeconds`.
    pub grace_override: Option<i64>,
}

impl WorkerConfig {
    /// The wait before the first run. Without jitter: what is left of the initial delay.
    /// With it (right after an agent start), upstream's schedule: its ticks fall on `jitter +
    /// k · period`, and the first probe is the first of them once the initial delay is over
    /// (the jitter and the delay overlap; they do not add up).
    pub(crate) fn first_wait(&self) -> Duration {
        let delay_left = self.initial_delay.saturating_sub(self.running_for);
        if self.jitter.is_zero() || delay_left <= self.jitter {
            return delay_left.max(self.jitter);
        }
        let period = self.period.max(Duration::from_millis(1));
        let ticks = (delay_left - self.jitter)
            .as_nanos()
            .div_ceil(period.as_nanos());
        self.jitter + period * u32::try_from(ticks).unwrap_or(u32::MAX)
    }
}

/// Something that checks a container once.
pub(crate) trait Probe: Send + Sync + 'static {
    fn run(&self) -> impl Future<Output = ProbeOutcome> + Send;
}

/// A conclusion a worker reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Ready(bool),
    Started,
    Unhealthy(Unhealthy),
}

/// Where a worker reports to.
pub(crate) trait Report: Send + Sync + 'static {
    /// Every run that was carried out or gave up (for the metrics).
    fn outcome(&self, kind: ProbeKind, outcome: &ProbeOutcome);
    /// Every conclusion.
    fn verdict(&self, kind: ProbeKind, verdict: Verdict);
}

/// The link between a container's startup worker and its other workers.
#[derive(Default)]
pub(crate) struct StartupGate {
    /// For liveness and readiness: wait until this turns true before the first run.
    pub wait: Option<watch::Receiver<bool>>,
    /// For startup: set to true on success.
    pub signal: Option<watch::Sender<bool>>,
}

/// Counts consecutive equal outcomes against the thresholds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Streak {
    last: Option<bool>,
    length: u32,
}

impl Streak {
    /// Adds one outcome (true = success); returns it when its run has reached its threshold.
    pub(crate) fn record(
        &mut self,
        success: bool,
        success_threshold: u32,
        failure_threshold: u32,
    ) -> Option<bool> {
        if self.last == Some(success) {
            self.length = self.length.saturating_add(1);
        } else {
            self.last = Some(success);
            self.length = 1;
        }
        let threshold = if success {
            success_threshold
        } else {
            failure_threshold
        };
        (self.length >= threshold.max(1)).then_some(success)
    }
}

/// Runs one worker until its instance stops (`cancel`) or it reaches a final verdict.
pub(crate) async fn run_worker<P: Probe, R: Report>(
    cfg: WorkerConfig,
    probe: P,
    report: R,
    gate: StartupGate,
    cancel: CancellationToken,
) {
    let first = cfg.first_wait();
    if !first.is_zero() {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(first) => {}
        }
    }
    if let Some(mut started) = gate.wait {
        tokio::select! {
            _ = cancel.cancelled() => return,
            ok = started.wait_for(|s| *s) => if ok.is_err() { return },
        }
    }

    let mut ticks =
        tokio::time::interval_at(clock::instant(), cfg.period.max(Duration::from_millis(1)));
    // A run longer than the period is followed by the next at once, then the ticks go on in
    // their phase (Go's ticker, which upstream's worker waits on, drops missed ticks).
    ticks.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut streak = Streak::default();
    let mut ready: Option<bool> = None;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let outcome = tokio::select! {
            _ = cancel.cancelled() => return,
            outcome = run_with_tries(&probe) => outcome,
        };
        report.outcome(cfg.kind, &outcome);
        // Failures, warnings and errors are logged (and recorded as events) by the report.
        let success = match &outcome {
            ProbeOutcome::Success | ProbeOutcome::Warning(_) => true,
            ProbeOutcome::Failure(_) => false,
            ProbeOutcome::Error(_) => continue,
        };
        let Some(reached) = streak.record(success, cfg.success_threshold, cfg.failure_threshold)
        else {
            continue;
        };
        match (cfg.kind, reached) {
            (ProbeKind::Readiness, now) => {
                if ready != Some(now) {
                    ready = Some(now);
                    report.verdict(cfg.kind, Verdict::Ready(now));
                }
            }
            (ProbeKind::Startup, true) => {
                if let Some(signal) = &gate.signal {
                    signal.send_replace(true);
                }
                report.verdict(cfg.kind, Verdict::Started);
                return;
            }
            (ProbeKind::Liveness, true) => {}
            (ProbeKind::Liveness | ProbeKind::Startup, false) => {
                let message = format!(
                    "Container {} failed {} probe, will be restarted",
                    cfg.container_name,
                    cfg.kind.lower()
                );
                report.verdict(
                    cfg.kind,
                    Verdict::Unhealthy(Unhealthy {
                        container_name: cfg.container_name.clone(),
                        message,
                        grace_override: cfg.grace_override,
                    }),
                );
                return;
            }
        }
    }
}

/// Runs the probe, trying again at once when it could not be carried out.
async fn run_with_tries<P: Probe>(probe: &P) -> ProbeOutcome {
    let mut outcome = probe.run().await;
    for _ in 1..MAX_TRIES {
        if !matches!(outcome, ProbeOutcome::Error(_)) {
            break;
        }
        outcome = probe.run().await;
    }
    outcome
}

/// A random duration in `[0, upto)`, from the standard library's per-process random hash keys.
pub(crate) fn random_below(upto: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    if upto.is_zero() {
        return Duration::ZERO;
    }
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        clock::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    let nanos = upto.as_nanos().min(u64::MAX as u128) as u64;
    Duration::from_nanos(h.finish() % nanos)
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::base::clock::Instant;

    /// A probe that replays a script (then repeats its default) and records when it ran.
    #[derive(Clone)]
    struct Scripted {
        script: Arc<Mutex<VecDeque<ProbeOutcome>>>,
        then: ProbeOutcome,
        runs: Arc<Mutex<Vec<Duration>>>,
        t0: Instant,
    }

    impl Scripted {
        fn new(script: Vec<ProbeOutcome>, then: ProbeOutcome, t0: Instant) -> Self {
            Scripted {
                script: Arc::new(Mutex::new(script.into())),
                then,
                runs: Arc::default(),
                t0,
            }
        }
        fn runs(&self) -> Vec<Duration> {
            self.runs.lock().unwrap().clone()
        }
    }

    impl Probe for Scripted {
        async fn run(&self) -> ProbeOutcome {
            self.runs.lock().unwrap().push(self.t0.elapsed());
            let next = self.script.lock().unwrap().pop_front();
            next.unwrap_or_else(|| self.then.clone())
        }
    }

    #[derive(Clone)]
    struct Recorder {
        t0: Instant,
        verdicts: Arc<Mutex<Vec<(Duration, ProbeKind, Verdict)>>>,
        outcomes: Arc<Mutex<Vec<ProbeOutcome>>>,
    }

    impl Recorder {
        fn new(t0: Instant) -> Self {
            Recorder {
                t0,
                verdicts: Arc::default(),
                outcomes: Arc::default(),
            }
        }
        fn verdicts(&self) -> Vec<(Duration, ProbeKind, Verdict)> {
            self.verdicts.lock().unwrap().clone()
        }
    }

    impl Report for Recorder {
        fn outcome(&self, _kind: ProbeKind, outcome: &ProbeOutcome) {
            self.outcomes.lock().unwrap().push(outcome.clone());
        }
        fn verdict(&self, kind: ProbeKind, verdict: Verdict) {
            self.verdicts
                .lock()
                .unwrap()
                .push((self.t0.elapsed(), kind, verdict));
        }
    }

    const S: ProbeOutcome = ProbeOutcome::Success;
    fn f() -> ProbeOutcome {
        ProbeOutcome::Failure("no".into())
    }
    fn e() -> ProbeOutcome {
        ProbeOutcome::Error("runtime down".into())
    }
    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn cfg(kind: ProbeKind) -> WorkerConfig {
        WorkerConfig {
            kind,
            container_name: "app".into(),
            initial_delay: Duration::ZERO,
            period: secs(1),
            success_threshold: 1,
            failure_threshold: 3,
            running_for: Duration::ZERO,
            jitter: Duration::ZERO,
            grace_override: None,
        }
    }

    #[test]
    fn streak_counts_consecutive_outcomes() {
        let mut s = Streak::default();
        assert_eq!(s.record(false, 2, 3), None);
        assert_eq!(s.record(false, 2, 3), None);
        assert_eq!(s.record(true, 2, 3), None);
        assert_eq!(
            s.record(false, 2, 3),
            None,
            "a success breaks the failure run"
        );
        assert_eq!(s.record(false, 2, 3), None);
        assert_eq!(s.record(false, 2, 3), Some(false));
        assert_eq!(
            s.record(false, 2, 3),
            Some(false),
            "stays reached while the run goes on"
        );
        assert_eq!(s.record(true, 2, 3), None);
        assert_eq!(s.record(true, 2, 3), Some(true));
        // A threshold of 0 (invalid) behaves as 1.
        assert_eq!(Streak::default().record(true, 0, 0), Some(true));
    }

    #[tokio::test(start_paused = true)]
    async fn readiness_flips_at_the_thresholds_after_the_initial_delay() {
        let t0 = Instant::now();
        // Runs at 2s, 3s, ...: F S S | F F F | S S
        let probe = Scripted::new(vec![f(), S, S, f(), f(), f(), S, S], S, t0);
        let rec = Recorder::new(t0);
        let mut c = cfg(ProbeKind::Readiness);
        c.initial_delay = secs(5);
        c.running_for = secs(3);
        c.success_threshold = 2;
        let cancel = CancellationToken::new();
        let task = tokio::spawn(run_worker(
            c,
            probe.clone(),
            rec.clone(),
            StartupGate::default(),
            cancel.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(12_500)).await;
        cancel.cancel();
        task.await.unwrap();
        let runs = probe.runs();
        assert_eq!(runs[0], secs(2), "what was left of the initial delay");
        assert_eq!(runs[1], secs(3), "then once per period");
        assert_eq!(runs.len(), 11, "runs from 2s to 12s: {runs:?}");
        assert_eq!(
            rec.verdicts(),
            vec![
                (secs(4), ProbeKind::Readiness, Verdict::Ready(true)),
                (secs(7), ProbeKind::Readiness, Verdict::Ready(false)),
                (secs(9), ProbeKind::Readiness, Verdict::Ready(true)),
            ],
            "each flip reported once"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn liveness_reports_unhealthy_after_failure_threshold_and_stops() {
        let t0 = Instant::now();
        let probe = Scripted::new(vec![S, f(), f(), S, f(), f(), f()], S, t0);
        let rec = Recorder::new(t0);
        let mut c = cfg(ProbeKind::Liveness);
        c.period = secs(10);
        c.grace_override = Some(5);
        let task = tokio::spawn(run_worker(
            c,
            probe.clone(),
            rec.clone(),
            StartupGate::default(),
            CancellationToken::new(),
        ));
        // The worker ends on its own after the verdict.
        tokio::time::timeout(secs(120), task)
            .await
            .expect("the worker ends")
            .unwrap();
        assert_eq!(probe.runs().len(), 7);
        assert_eq!(
            rec.verdicts(),
            vec![(
                secs(60),
                ProbeKind::Liveness,
                Verdict::Unhealthy(Unhealthy {
                    container_name: "app".into(),
                    message: "Container app failed liveness probe, will be restarted".into(),
                    grace_override: Some(5),
                })
            )]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn liveness_waits_for_the_startup_probe() {
        let t0 = Instant::now();
        let (tx, rx) = watch::channel(false);
        let startup = Scripted::new(vec![f(), f(), S], f(), t0);
        let liveness = Scripted::new(vec![], S, t0);
        let rec = Recorder::new(t0);
        let cancel = CancellationToken::new();
        let s = tokio::spawn(run_worker(
            cfg(ProbeKind::Startup),
            startup.clone(),
            rec.clone(),
            StartupGate {
                wait: None,
                signal: Some(tx),
            },
            cancel.clone(),
        ));
        let mut live_cfg = cfg(ProbeKind::Liveness);
        live_cfg.period = secs(3);
        let l = tokio::spawn(run_worker(
            live_cfg,
            liveness.clone(),
            rec.clone(),
            StartupGate {
                wait: Some(rx),
                signal: None,
            },
            cancel.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        assert!(
            liveness.runs().is_empty(),
            "no liveness run before startup succeeded"
        );
        tokio::time::sleep(secs(6)).await;
        cancel.cancel();
        s.await.unwrap();
        l.await.unwrap();
        assert_eq!(
            startup.runs(),
            vec![secs(0), secs(1), secs(2)],
            "startup ends at its success"
        );
        assert_eq!(
            liveness.runs(),
            vec![secs(2), secs(5)],
            "liveness starts when startup succeeded"
        );
        assert_eq!(
            rec.verdicts(),
            vec![(secs(2), ProbeKind::Startup, Verdict::Started)]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn startup_failing_threshold_times_is_unhealthy() {
        let t0 = Instant::now();
        let (tx, rx) = watch::channel(false);
        let startup = Scripted::new(vec![], f(), t0);
        let rec = Recorder::new(t0);
        let mut c = cfg(ProbeKind::Startup);
        c.period = secs(2);
        c.failure_threshold = 4;
        run_worker(
            c,
            startup.clone(),
            rec.clone(),
            StartupGate {
                wait: None,
                signal: Some(tx),
            },
            CancellationToken::new(),
        )
        .await;
        assert_eq!(startup.runs().len(), 4);
        let v = rec.verdicts();
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].0, secs(6), "runs at 0, 2, 4, 6");
        match &v[0].2 {
            Verdict::Unhealthy(u) => assert_eq!(
                u.message,
                "Container app failed startup probe, will be restarted"
            ),
            other => panic!("{other:?}"),
        }
        assert!(!*rx.borrow(), "never started");
    }

    #[tokio::test(start_paused = true)]
    async fn errors_are_retried_and_neither_break_nor_extend_a_run() {
        let t0 = Instant::now();
        // Run 1: F. Run 2: E E E (gives up). Run 3: F -> two failures in a row.
        let probe = Scripted::new(vec![f(), e(), e(), e(), f()], S, t0);
        let rec = Recorder::new(t0);
        let mut c = cfg(ProbeKind::Liveness);
        c.failure_threshold = 2;
        run_worker(
            c,
            probe.clone(),
            rec.clone(),
            StartupGate::default(),
            CancellationToken::new(),
        )
        .await;
        assert_eq!(
            probe.runs(),
            vec![secs(0), secs(1), secs(1), secs(1), secs(2)]
        );
        assert_eq!(rec.verdicts().len(), 1);
        assert_eq!(rec.verdicts()[0].0, secs(2));
        let outcomes = rec.outcomes.lock().unwrap().clone();
        assert_eq!(outcomes, vec![f(), e(), f()], "one counted outcome per run");

        // An error that clears on the second try counts as the later outcome.
        let probe = Scripted::new(vec![e(), S], S, t0);
        assert_eq!(run_with_tries(&probe).await, S);
    }

    #[tokio::test(start_paused = true)]
    async fn jitter_delays_the_first_run_and_cancel_stops_the_worker() {
        let t0 = Instant::now();
        let probe = Scripted::new(vec![], S, t0);
        let mut c = cfg(ProbeKind::Readiness);
        c.jitter = Duration::from_millis(700);
        let cancel = CancellationToken::new();
        let task = tokio::spawn(run_worker(
            c,
            probe.clone(),
            Recorder::new(t0),
            StartupGate::default(),
            cancel.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(2_000)).await;
        cancel.cancel();
        task.await.unwrap();
        assert_eq!(
            probe.runs(),
            vec![Duration::from_millis(700), Duration::from_millis(1_700)]
        );
        let after = probe.runs().len();
        tokio::time::sleep(secs(5)).await;
        assert_eq!(probe.runs().len(), after, "no run after cancel");
    }

    /// Upstream's schedule: after a run longer than the period the next runs at once, and the
    /// ticks keep their phase (Go's ticker drops missed ticks; it does not shift later ones).
    #[tokio::test(start_paused = true)]
    async fn a_slow_run_is_followed_at_once_and_the_ticks_keep_their_phase() {
        /// The first run takes 1.2 s, every later one no time.
        #[derive(Clone)]
        struct SlowFirst(Scripted, Arc<Mutex<bool>>);
        impl Probe for SlowFirst {
            async fn run(&self) -> ProbeOutcome {
                let outcome = self.0.run().await;
                let first = std::mem::replace(&mut *self.1.lock().unwrap(), false);
                if first {
                    tokio::time::sleep(Duration::from_millis(1_200)).await;
                }
                outcome
            }
        }
        let t0 = Instant::now();
        let probe = SlowFirst(Scripted::new(vec![], S, t0), Arc::new(Mutex::new(true)));
        let cancel = CancellationToken::new();
        let task = tokio::spawn(run_worker(
            cfg(ProbeKind::Readiness),
            probe.clone(),
            Recorder::new(t0),
            StartupGate::default(),
            cancel.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(4_500)).await;
        cancel.cancel();
        task.await.unwrap();
        assert_eq!(
            probe.0.runs(),
            vec![
                Duration::ZERO,
                Duration::from_millis(1_200),
                secs(2),
                secs(3),
                secs(4)
            ]
        );
    }

    /// The first run after the random wait of an agent start: the first of upstream's ticks
    /// (`jitter + k · period`) once the initial delay is over; without jitter the end of the
    /// initial delay itself.
    #[test]
    fn the_first_run_is_the_first_tick_after_the_initial_delay() {
        let ms = Duration::from_millis;
        // (initial delay, running for, jitter, period) -> first run.
        let rows = [
            ((ms(0), ms(0), ms(0), secs(1)), ms(0)),
            ((ms(2_500), ms(0), ms(0), secs(1)), ms(2_500)),
            ((ms(2_500), ms(1_000), ms(0), secs(1)), ms(1_500)),
            ((ms(0), ms(0), ms(700), secs(1)), ms(700)),
            ((ms(2_500), ms(0), ms(700), secs(1)), ms(2_700)),
            ((ms(2_000), ms(0), ms(700), secs(1)), ms(2_700)),
            ((ms(2_800), ms(0), ms(700), secs(1)), ms(3_700)),
            ((ms(500), ms(0), ms(700), secs(1)), ms(700)),
            ((secs(30), secs(100), ms(4_000), secs(10)), ms(4_000)),
            ((secs(30), ms(0), ms(4_000), secs(10)), ms(34_000)),
        ];
        for ((initial_delay, running_for, jitter, period), want) in rows {
            let mut c = cfg(ProbeKind::Liveness);
            c.initial_delay = initial_delay;
            c.running_for = running_for;
            c.jitter = jitter;
            c.period = period;
            assert_eq!(
                c.first_wait(),
                want,
                "delay {initial_delay:?}, running {running_for:?}, jitter {jitter:?}, period {period:?}"
            );
        }
    }

    #[test]
    fn random_below_stays_in_range() {
        for _ in 0..100 {
            assert!(random_below(secs(1)) < secs(1));
        }
        assert_eq!(random_below(Duration::ZERO), Duration::ZERO);
    }
}
