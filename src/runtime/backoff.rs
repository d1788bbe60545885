//! Crash-loop back-off, as a pure calculation over explicit times.
//!
//! Upstream's rule: the first restart after an exit is immediate; each further exit waits the
//! current delay (10s, doubling, capped at the maximum, 300s by default) counted from the exit;
//! an entry older than twice the maximum is forgotten, so a container that ran cleanly for ten
//! minutes starts again from the initial delay.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

/// The delays in force (configurable so tests can use short ones).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackoffPolicy {
    pub initial: Duration,
    pub max: Duration,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        BackoffPolicy {
            initial: Duration::from_secs(10),
            max: Duration::from_secs(300),
        }
    }
}

/// Back-off state of one container.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BackoffEntry {
    /// The wait that applies to the next exit.
    pub delay: Duration,
    /// The exit time the delay was last updated for.
    pub last_update: SystemTime,
}

/// Back-off state of one pod's containers, keyed by container name.
pub type BackoffTable = HashMap<String, BackoffEntry>;

impl BackoffPolicy {
    /// True when the entry has aged out (no exit for twice the maximum).
    fn expired(&self, entry: &BackoffEntry, event: SystemTime) -> bool {
        event
            .duration_since(entry.last_update)
            .is_ok_and(|d| d > self.max * 2)
    }

    /// How long a restart for an exit at `finished` must still wait at `now`; `None` = go.
    pub fn remaining(
        &self,
        entry: Option<&BackoffEntry>,
        finished: SystemTime,
        now: SystemTime,
    ) -> Option<Duration> {
        let entry = entry?;
        if self.expired(entry, finished) {
            return None;
        }
        let ready_at = finished + entry.delay;
        ready_at.duration_since(now).ok().filter(|d| !d.is_zero())
    }

    /// The entry to record when a restart for an exit at `finished` goes ahead.
    pub fn next(&self, entry: Option<&BackoffEntry>, finished: SystemTime) -> BackoffEntry {
        let delay = match entry {
            Some(e) if !self.expired(e, finished) => (e.delay * 2).min(self.max),
            _ => self.initial.min(self.max),
        };
        BackoffEntry {
            delay,
            last_update: finished,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + secs)
    }

    #[test]
    fn delays_double_cap_and_reset() {
        let p = BackoffPolicy::default();
        // First exit: no entry, restart at once; the entry starts at the initial delay.
        assert_eq!(p.remaining(None, t(0), t(0)), None);
        let e1 = p.next(None, t(0));
        assert_eq!(e1.delay, Duration::from_secs(10));
        // Second exit at 5s: must wait 10s from the exit.
        assert_eq!(
            p.remaining(Some(&e1), t(5), t(6)),
            Some(Duration::from_secs(9))
        );
        assert_eq!(p.remaining(Some(&e1), t(5), t(15)), None);
        let e2 = p.next(Some(&e1), t(5));
        assert_eq!(e2.delay, Duration::from_secs(20));
        // Doubling stops at the cap.
        let mut e = e2;
        for i in 0..10 {
            e = p.next(Some(&e), t(10 + i));
        }
        assert_eq!(e.delay, Duration::from_secs(300));
        // Ten quiet minutes (more than 2 × max) forget the entry.
        let later = e.last_update + Duration::from_secs(601);
        assert_eq!(p.remaining(Some(&e), later, later), None);
        assert_eq!(p.next(Some(&e), later).delay, Duration::from_secs(10));
    }

    #[test]
    fn short_policy_for_tests() {
        let p = BackoffPolicy {
            initial: Duration::from_millis(200),
            max: Duration::from_millis(800),
        };
        let mut e = p.next(None, t(0));
        let mut seen = vec![e.delay.as_millis()];
        for i in 1..5 {
            e = p.next(Some(&e), t(i));
            seen.push(e.delay.as_millis());
        }
        assert_eq!(seen, vec![200, 400, 800, 800, 800]);
    }
}
