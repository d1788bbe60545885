//! When a volume that failed to set up is tried again: upstream's exponential back-off for
//! volume operations (`exponentialbackoff` under `nestedpendingoperations`), per pod and
//! volume. The first failure waits 500 ms, each further one twice as long, up to 2 m 2 s; a
//! success forgets the volume. Pure: the caller gives the time.
//!
//! Upstream retries only when the wait is over. Deckhand also tries at once when what the
//! volume is made from changed since the failure (the configMap, secret or token it needs
//! appeared or changed: the caller's `inputs` fingerprint), so a pod waiting for an object
//! starts as soon as the object's watch pokes it, however long the back-off had grown.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

/// The wait after the first failure (upstream's `initialDurationBeforeRetry`).
pub(crate) const INITIAL: Duration = Duration::from_millis(500);
/// The longest wait (upstream's `maxDurationBeforeRetry`, 2 m 2 s).
pub(crate) const MAX: Duration = Duration::from_secs(122);

/// The key of the pod's own directory, made before any volume (never a volume's name: those
/// are DNS labels).
pub(crate) const POD_DIR: &str = "";

#[derive(Debug, Clone, PartialEq, Eq)]
struct Failure {
    delay: Duration,
    at: Instant,
    inputs: u64,
    message: String,
}

/// Whether a volume is tried now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Never failed, or its wait is over.
    Try,
    /// Still waiting, but what it is made from changed: tried now.
    Changed,
    /// Not before this much longer (unless poked with changed inputs).
    Wait(Duration),
}

/// The failed set-ups of one pod's volumes, by volume name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct MountBackoff {
    failures: BTreeMap<String, Failure>,
}

impl MountBackoff {
    /// Whether `volume` (made from `inputs`) may be tried at `now`.
    pub(crate) fn turn(&self, volume: &str, inputs: u64, now: Instant) -> Turn {
        let Some(f) = self.failures.get(volume) else {
            return Turn::Try;
        };
        let due = f.at + f.delay;
        if now >= due {
            Turn::Try
        } else if inputs != f.inputs {
            Turn::Changed
        } else {
            Turn::Wait(due - now)
        }
    }

    /// Records a failed try at `now`; returns the wait before the next one.
    pub(crate) fn failed(
        &mut self,
        volume: &str,
        inputs: u64,
        now: Instant,
        message: String,
    ) -> Duration {
        let delay = match self.failures.get(volume) {
            None => INITIAL,
            Some(f) => (f.delay * 2).min(MAX),
        };
        self.failures.insert(
            volume.to_string(),
            Failure {
                delay,
                at: now,
                inputs,
                message,
            },
        );
        delay
    }

    /// The volume is set up: its back-off is over.
    pub(crate) fn succeeded(&mut self, volume: &str) {
        self.failures.remove(volume);
    }

    /// Forgets the volumes for which `keep` is false (no longer in the pod's spec).
    pub(crate) fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.failures.retain(|name, _| keep(name));
    }

    /// Why `volume` last failed, while it is backed off.
    pub(crate) fn message(&self, volume: &str) -> Option<&str> {
        self.failures.get(volume).map(|f| f.message.as_str())
    }

    /// How long until the first backed-off volume may be tried again (zero when one may be
    /// now); `None` when none failed.
    pub(crate) fn next_try(&self, now: Instant) -> Option<Duration> {
        self.failures
            .values()
            .map(|f| (f.at + f.delay).saturating_duration_since(now))
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_doubles_from_half_a_second_to_two_minutes_two() {
        let t0 = Instant::now();
        let mut b = MountBackoff::default();
        let mut waits = Vec::new();
        for _ in 0..12 {
            waits.push(b.failed("v", 1, t0, "x".into()));
        }
        let ms = Duration::from_millis;
        assert_eq!(
            waits,
            [
                ms(500),
                ms(1000),
                ms(2000),
                ms(4000),
                ms(8000),
                ms(16_000),
                ms(32_000),
                ms(64_000),
                ms(122_000),
                ms(122_000),
                ms(122_000),
                ms(122_000),
            ]
        );
        b.succeeded("v");
        assert_eq!(
            b.failed("v", 1, t0, "x".into()),
            INITIAL,
            "a success starts over"
        );
    }

    #[test]
    fn turn_table() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut b = MountBackoff::default();
        b.failed("cfg", 7, t0, "configmap \"c\" not found".into());
        b.failed("host", 0, t0, "hostPath type check failed".into());
        b.failed("host", 0, t0, "hostPath type check failed".into());
        let rows = [
            ("never failed", "other", 0, t0, Turn::Try),
            ("just failed", "cfg", 7, t0, Turn::Wait(ms(500))),
            ("half-way", "cfg", 7, t0 + ms(200), Turn::Wait(ms(300))),
            ("the wait is over", "cfg", 7, t0 + ms(500), Turn::Try),
            ("its object appeared", "cfg", 8, t0 + ms(1), Turn::Changed),
            (
                "second failure waits 1s",
                "host",
                0,
                t0 + ms(999),
                Turn::Wait(ms(1)),
            ),
            ("and then goes", "host", 0, t0 + ms(1000), Turn::Try),
        ];
        for (what, volume, inputs, now, want) in rows {
            assert_eq!(b.turn(volume, inputs, now), want, "{what}");
        }
        assert_eq!(b.next_try(t0 + ms(100)), Some(ms(400)));
        assert_eq!(b.next_try(t0 + ms(700)), Some(Duration::ZERO));
        assert_eq!(b.message("cfg"), Some("configmap \"c\" not found"));
        b.retain(|name| name == "host");
        assert_eq!(b.message("cfg"), None);
        assert_eq!(b.next_try(t0), Some(ms(1000)));
        b.succeeded("host");
        assert_eq!(b.next_try(t0), None);
    }
}
