//! Crash-loop back-off, as a pure calculation over explicit times.
//!
//! Upstream's rule (`flowcontrol.Backoff` as the kubelet sets it up): the first restart after an
//! exit is immediate; each further exit waits the current delay (10s, doubling, capped at the
//! maximum, 300s by default or `crashLoopBackOff.maxContainerRestartPeriod`) counted from the
//! exit. The entry is stamped with the time of the restart, and an exit more than ten minutes
//! after it (the kubelet's `HasExpiredFunc`, whatever the maximum) forgets it: a container that
//! ran cleanly for ten minutes starts again from the initial delay. Image pulls back off the
//! same way (upstream's 2 × 300 s is the same ten minutes).
//!
//! The table is kept across restarts in the pod's `backoff.json`, a file anything with root on
//! the node can edit. [`decode_table`] reads it back entry by entry and [`sanitize`] clamps what
//! makes no sense (negative or huge delays, times in the future); the arithmetic below never
//! panics whatever an entry holds.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

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

/// Back-off state of one pod's containers, keyed by [`container_key`] (and of its image pulls,
/// keyed by image).
pub(crate) type BackoffTable = HashMap<String, BackoffEntry>;

/// A container's crash-loop back-off key: its name and the hash of its spec, as upstream keys
/// it, so a changed container (a new image) starts afresh instead of inheriting the wait.
pub(crate) fn container_key(name: &str, spec_hash: &str) -> String {
    format!("{name}@{spec_hash}")
}

/// How long after its last restart an entry is forgotten: upstream's crash-loop
/// `HasExpiredFunc` (a fixed 600 s, not twice the configured maximum).
pub(crate) const STABLE_AFTER: Duration = Duration::from_secs(600);

impl BackoffPolicy {
    /// True when the entry has aged out: `event` (an exit) came more than [`STABLE_AFTER`]
    /// after the entry's last update (the restart).
    fn expired(&self, entry: &BackoffEntry, event: SystemTime) -> bool {
        event
            .duration_since(entry.last_update)
            .is_ok_and(|d| d > STABLE_AFTER)
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
        // Never wait longer than the policy allows, whatever the entry says.
        let delay = entry.delay.min(self.max);
        match finished.checked_add(delay) {
            Some(ready_at) => ready_at.duration_since(now).ok().filter(|d| !d.is_zero()),
            // Only reachable with an exit time at the end of representable time.
            None => Some(delay).filter(|d| !d.is_zero()),
        }
    }

    /// The entry to record when a restart for an exit at `finished` goes ahead at `now`: the
    /// delay doubled (or the initial one when the entry aged out), stamped with `now`, as
    /// upstream's `Next` stamps the clock's time.
    pub fn next(
        &self,
        entry: Option<&BackoffEntry>,
        finished: SystemTime,
        now: SystemTime,
    ) -> BackoffEntry {
        let delay = match entry {
            Some(e) if !self.expired(e, finished) => e.delay.saturating_mul(2).min(self.max),
            _ => self.initial.min(self.max),
        };
        BackoffEntry {
            delay,
            last_update: now,
        }
    }
}

/// What [`sanitize`] or [`decode_table`] changed in a table read back from disk, per
/// container name (for a log line).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Repair {
    /// The delay was negative or above the policy's maximum; it is the maximum now.
    DelayClamped { container: String },
    /// The last update lies in the future (a clock step, or an edited file): entry dropped.
    FutureDropped { container: String },
    /// The entry could not be read at all: dropped.
    Unreadable { container: String },
}

/// Clamp every delay to `policy.max` and drop entries whose last update is after `now`.
/// Returns what was changed, so the caller can log it with the pod's fields.
pub(crate) fn sanitize(
    table: &mut BackoffTable,
    policy: &BackoffPolicy,
    now: SystemTime,
) -> Vec<Repair> {
    let mut repairs = Vec::new();
    table.retain(|name, entry| {
        if entry.last_update > now {
            repairs.push(Repair::FutureDropped {
                container: name.clone(),
            });
            return false;
        }
        if entry.delay > policy.max {
            entry.delay = policy.max;
            repairs.push(Repair::DelayClamped {
                container: name.clone(),
            });
        }
        true
    });
    repairs.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
    repairs
}

/// A span as written by serde for `Duration` / `SystemTime` (seconds and nanoseconds),
/// read leniently: negative and oversized numbers are told apart instead of failing the
/// whole file.
enum Span {
    Negative,
    TooLarge,
    Fits(Duration),
}

fn read_span(value: &Value, secs_key: &str, nanos_key: &str) -> Option<Span> {
    let secs = value.get(secs_key)?;
    let nanos = value.get(nanos_key).map_or(Some(0), Value::as_u64)?;
    if secs.as_i64().is_some_and(|s| s < 0) || secs.as_f64().is_some_and(|s| s < 0.0) {
        return Some(Span::Negative);
    }
    let Some(secs) = secs.as_u64() else {
        // A non-negative number that is not a u64: a float or beyond 2^64.
        return secs.as_f64().map(|_| Span::TooLarge);
    };
    Some(
        Duration::from_secs(secs)
            .checked_add(Duration::from_nanos(nanos))
            .map_or(Span::TooLarge, Span::Fits),
    )
}

/// Decode a `backoff.json` written by an earlier run, one entry at a time: an entry that
/// cannot be read is dropped (the container then starts from the initial delay) instead of
/// losing the whole table, a negative or huge delay becomes the policy's maximum, and an entry
/// last updated in the future is dropped. Anything but a JSON object yields an empty table.
pub(crate) fn decode_table(
    bytes: &[u8],
    policy: &BackoffPolicy,
    now: SystemTime,
) -> (BackoffTable, Vec<Repair>) {
    let mut table = BackoffTable::new();
    let mut repairs = Vec::new();
    let Ok(Value::Object(entries)) = serde_json::from_slice::<Value>(bytes) else {
        return (table, repairs);
    };
    for (name, raw) in entries {
        let delay = raw.get("delay").and_then(|d| read_span(d, "secs", "nanos"));
        let last_update = raw
            .get("last_update")
            .and_then(|t| read_span(t, "secs_since_epoch", "nanos_since_epoch"))
            .and_then(|span| match span {
                Span::Fits(d) => UNIX_EPOCH.checked_add(d),
                Span::Negative | Span::TooLarge => None,
            });
        let (Some(delay), Some(last_update)) = (delay, last_update) else {
            repairs.push(Repair::Unreadable { container: name });
            continue;
        };
        let delay = match delay {
            Span::Fits(d) => d,
            Span::Negative | Span::TooLarge => {
                repairs.push(Repair::DelayClamped {
                    container: name.clone(),
                });
                policy.max
            }
        };
        table.insert(name, BackoffEntry { delay, last_update });
    }
    repairs.extend(sanitize(&mut table, policy, now));
    repairs.sort_by(|a, b| format!("{a:?}").cmp(&format!("{b:?}")));
    (table, repairs)
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
        let e1 = p.next(None, t(0), t(0));
        assert_eq!(e1.delay, Duration::from_secs(10));
        // Second exit at 5s: must wait 10s from the exit.
        assert_eq!(
            p.remaining(Some(&e1), t(5), t(6)),
            Some(Duration::from_secs(9))
        );
        assert_eq!(p.remaining(Some(&e1), t(5), t(15)), None);
        let e2 = p.next(Some(&e1), t(5), t(15));
        assert_eq!(e2.delay, Duration::from_secs(20));
        // Doubling stops at the cap.
        let mut e = e2;
        for i in 0..10 {
            e = p.next(Some(&e), t(10 + i), t(10 + i));
        }
        assert_eq!(e.delay, Duration::from_secs(300));
        // Ten quiet minutes (more than 2 × max) forget the entry.
        let later = e.last_update + Duration::from_secs(601);
        assert_eq!(p.remaining(Some(&e), later, later), None);
        assert_eq!(
            p.next(Some(&e), later, later).delay,
            Duration::from_secs(10)
        );
    }

    /// Upstream's cap and reset, pinned: 10 s doubling to the 300 s cap, the cap held; the
    /// entry ages from the restart, not the exit, and after ten minutes whatever the maximum.
    #[test]
    fn cap_and_reset_as_upstream() {
        let p = BackoffPolicy::default();
        // A container that exits 5 s after each start, restarted as soon as allowed.
        let (mut entry, mut exit, mut delays) = (None, 0u64, Vec::new());
        for _ in 0..9 {
            let wait = p
                .remaining(entry.as_ref(), t(exit), t(exit))
                .unwrap_or_default();
            let restart = exit + wait.as_secs();
            assert_eq!(p.remaining(entry.as_ref(), t(exit), t(restart)), None);
            entry = Some(p.next(entry.as_ref(), t(exit), t(restart)));
            delays.push(wait.as_secs());
            exit = restart + 5;
        }
        assert_eq!(delays, [0, 10, 20, 40, 80, 160, 300, 300, 300]);
        let capped = entry.unwrap();
        assert_eq!(capped.last_update, t(exit - 5), "stamped at the restart");
        // Ran 305 s after a restart that came 300 s after the exit before it: 605 s since that
        // exit, but only 305 s since the restart, so the cap still holds.
        let e = BackoffEntry {
            delay: Duration::from_secs(300),
            last_update: t(300),
        };
        assert_eq!(
            p.remaining(Some(&e), t(605), t(605)),
            Some(Duration::from_secs(300))
        );
        assert_eq!(
            p.next(Some(&e), t(605), t(905)).delay,
            Duration::from_secs(300)
        );
        // Ten clean minutes after the restart: forgotten.
        assert_eq!(p.remaining(Some(&e), t(901), t(901)), None);
        assert_eq!(
            p.next(Some(&e), t(901), t(901)).delay,
            Duration::from_secs(10)
        );
        // A configured maximum of 60 s does not shorten the ten minutes.
        let short = BackoffPolicy {
            max: Duration::from_secs(60),
            ..p
        };
        let e = BackoffEntry {
            delay: Duration::from_secs(60),
            last_update: t(100),
        };
        assert_eq!(
            short.remaining(Some(&e), t(250), t(250)),
            Some(Duration::from_secs(60))
        );
        assert_eq!(
            short.next(Some(&e), t(250), t(310)).delay,
            Duration::from_secs(60)
        );
    }

    #[test]
    fn short_policy_for_tests() {
        let p = BackoffPolicy {
            initial: Duration::from_millis(200),
            max: Duration::from_millis(800),
        };
        let mut e = p.next(None, t(0), t(0));
        let mut seen = vec![e.delay.as_millis()];
        for i in 1..5 {
            e = p.next(Some(&e), t(i), t(i));
            seen.push(e.delay.as_millis());
        }
        assert_eq!(seen, vec![200, 400, 800, 800, 800]);
    }

    #[test]
    fn round_trips_what_serde_writes() {
        let p = BackoffPolicy::default();
        let table: BackoffTable = [
            ("a".to_string(), p.next(None, t(0), t(0))),
            (
                "b".to_string(),
                BackoffEntry {
                    delay: Duration::new(20, 5),
                    last_update: t(3) + Duration::from_nanos(7),
                },
            ),
        ]
        .into();
        let bytes = serde_json::to_vec(&table).unwrap();
        let (back, repairs) = decode_table(&bytes, &p, t(100));
        assert_eq!(back, table);
        assert!(repairs.is_empty(), "{repairs:?}");
    }

    /// Hand-edited or corrupted `backoff.json` entries: (json, expected entry for "c", repairs).
    #[test]
    fn hostile_files_are_clamped_or_dropped() {
        let p = BackoffPolicy::default();
        let now = t(100);
        let at = |secs: u64| {
            format!(
                r#"{{"secs_since_epoch":{},"nanos_since_epoch":0}}"#,
                1_000_000 + secs
            )
        };
        let max = BackoffEntry {
            delay: p.max,
            last_update: t(50),
        };
        let clamped = || {
            vec![Repair::DelayClamped {
                container: "c".into(),
            }]
        };
        let dropped = || {
            vec![Repair::Unreadable {
                container: "c".into(),
            }]
        };
        let cases: Vec<(String, Option<BackoffEntry>, Vec<Repair>)> = vec![
            (
                format!(r#"{{"c":{{"delay":{{"secs":-5,"nanos":0}},"last_update":{}}}}}"#, at(50)),
                Some(max),
                clamped(),
            ),
            (
                format!(r#"{{"c":{{"delay":{{"secs":18446744073709551615,"nanos":999999999}},"last_update":{}}}}}"#, at(50)),
                Some(max),
                clamped(),
            ),
            (
                format!(r#"{{"c":{{"delay":{{"secs":1e300,"nanos":0}},"last_update":{}}}}}"#, at(50)),
                Some(max),
                clamped(),
            ),
            (
                format!(r#"{{"c":{{"delay":{{"secs":100000,"nanos":0}},"last_update":{}}}}}"#, at(50)),
                Some(max),
                clamped(),
            ),
            (
                format!(r#"{{"c":{{"delay":{{"secs":20,"nanos":0}},"last_update":{}}}}}"#, at(5_000)),
                None,
                vec![Repair::FutureDropped { container: "c".into() }],
            ),
            (
                r#"{"c":{"delay":{"secs":20,"nanos":0},"last_update":{"secs_since_epoch":18446744073709551615,"nanos_since_epoch":999999999}}}"#.to_string(),
                None,
                dropped(),
            ),
            (
                r#"{"c":{"delay":{"secs":20,"nanos":0},"last_update":{"secs_since_epoch":-1,"nanos_since_epoch":0}}}"#.to_string(),
                None,
                dropped(),
            ),
            (r#"{"c":{"delay":"ten seconds"}}"#.to_string(), None, dropped()),
            (r#"{"c":7}"#.to_string(), None, dropped()),
            (r#"[1,2]"#.to_string(), None, vec![]),
            ("not json".to_string(), None, vec![]),
        ];
        for (json, want, want_repairs) in cases {
            let (table, repairs) = decode_table(json.as_bytes(), &p, now);
            assert_eq!(table.get("c").copied(), want, "{json}");
            assert_eq!(repairs, want_repairs, "{json}");
        }
        // One bad entry does not cost the good ones.
        let json = format!(
            r#"{{"bad":{{"delay":{{"secs":"x"}}}},"good":{{"delay":{{"secs":20,"nanos":0}},"last_update":{}}}}}"#,
            at(50)
        );
        let (table, _) = decode_table(json.as_bytes(), &p, now);
        assert_eq!(table["good"].delay, Duration::from_secs(20));
        assert!(!table.contains_key("bad"));
    }

    /// Entries that used to panic (`SystemTime + Duration`, `Duration * 2`) when they reached
    /// the arithmetic without going through [`decode_table`].
    #[test]
    fn arithmetic_never_panics() {
        let p = BackoffPolicy::default();
        let huge = BackoffEntry {
            delay: Duration::MAX,
            last_update: t(0),
        };
        assert_eq!(p.remaining(Some(&huge), t(1), t(1)), Some(p.max));
        assert_eq!(p.next(Some(&huge), t(1), t(1)).delay, p.max);
        let wide = BackoffPolicy {
            initial: Duration::MAX,
            max: Duration::MAX,
        };
        assert_eq!(wide.next(Some(&huge), t(1), t(1)).delay, Duration::MAX);
        assert!(wide.remaining(Some(&huge), t(1), t(1)).is_some());
        // A last update in the future is never "expired" and still bounded by the maximum.
        let future = BackoffEntry {
            delay: Duration::from_secs(20),
            last_update: t(10_000),
        };
        assert_eq!(
            p.remaining(Some(&future), t(1), t(1)),
            Some(Duration::from_secs(20))
        );
        let mut table: BackoffTable = [("f".to_string(), future), ("h".to_string(), huge)].into();
        let repairs = sanitize(&mut table, &p, t(100));
        assert_eq!(
            repairs,
            [
                Repair::DelayClamped {
                    container: "h".into()
                },
                Repair::FutureDropped {
                    container: "f".into()
                },
            ]
        );
        assert_eq!(table.len(), 1);
        assert_eq!(table["h"].delay, p.max);
    }
}
