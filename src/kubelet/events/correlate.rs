//! What to do with a new event, given the ones before it: pure, so every rule is a table row.
//!
//! Upstream's rules (client-go's event correlator), in its order:
//! 1. **Similar events fold.** Events about one object with the same type and reason but
//!    different messages are counted; from the 10th distinct message within 10 minutes, the
//!    event becomes one combined event ("(combined from similar events): <message>") that
//!    later ones update.
//! 2. **Identical events count.** An event identical to one already written (same object,
//!    type, reason, message) is not created again: the written one gets `count + 1` and a new
//!    `lastTimestamp`.
//! 3. **Spam limit.** Each object (per type) may have a burst of 25 events, refilled at one
//!    per 5 minutes; past that, events are skipped.
//!
//! Each cache holds at most 4096 keys; the least recently used go first.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;
use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

/// Keys per cache (upstream's LRU size).
pub(crate) const CACHE_ENTRIES: usize = 4096;
/// Distinct messages of similar events before they are combined.
pub(crate) const AGGREGATE_MAX: usize = 10;
/// The window for counting similar events.
pub(crate) const AGGREGATE_WINDOW: Duration = Duration::from_secs(600);
/// Events per object before the spam limit applies.
pub(crate) const SPAM_BURST: f64 = 25.0;
/// One more event per object every this long.
pub(crate) const SPAM_REFILL: Duration = Duration::from_secs(300);

/// The prefix of a combined event's message.
pub(crate) const COMBINED_PREFIX: &str = "(combined from similar events): ";

/// What the writer does with an event.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Correlated {
    /// Not sent (the spam limit).
    Skip,
    /// Create this event.
    Create(Event),
    /// The event exists on the server: update its count, last time and message.
    Update(Event),
}

/// A map that keeps at most `cap` keys, forgetting the least recently used.
struct Lru<K, V> {
    cap: usize,
    tick: u64,
    entries: HashMap<K, (u64, V)>,
}

impl<K: Eq + Hash + Clone, V> Lru<K, V> {
    fn new(cap: usize) -> Self {
        Lru {
            cap,
            tick: 0,
            entries: HashMap::new(),
        }
    }

    fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        self.tick += 1;
        let tick = self.tick;
        self.entries.get_mut(key).map(|(t, v)| {
            *t = tick;
            v
        })
    }

    fn insert(&mut self, key: K, value: V) {
        self.tick += 1;
        self.entries.insert(key, (self.tick, value));
        if self.entries.len() > self.cap {
            // Forget the oldest eighth at once, so the scan is rare.
            let mut ticks: Vec<u64> = self.entries.values().map(|(t, _)| *t).collect();
            ticks.sort_unstable();
            let cut = ticks[(self.cap / 8).max(1).min(ticks.len() - 1)];
            self.entries.retain(|_, (t, _)| *t >= cut);
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

struct Similar {
    messages: HashSet<String>,
    last: Timestamp,
}

/// What the server holds for an event key.
#[derive(Clone, Debug)]
struct Written {
    name: String,
    count: i32,
    first: Option<Time>,
}

struct Bucket {
    tokens: f64,
    at: Timestamp,
}

/// The correlator's memory. One task owns it.
pub(crate) struct Correlator {
    similar: Lru<String, Similar>,
    written: Lru<String, Written>,
    spam: Lru<String, Bucket>,
}

impl Default for Correlator {
    fn default() -> Self {
        Correlator {
            similar: Lru::new(CACHE_ENTRIES),
            written: Lru::new(CACHE_ENTRIES),
            spam: Lru::new(CACHE_ENTRIES),
        }
    }
}

fn text(s: &Option<String>) -> &str {
    s.as_deref().unwrap_or_default()
}

/// Source, object and type: the spam limit's key.
fn object_key(e: &Event) -> String {
    let source = e.source.as_ref();
    let o = &e.involved_object;
    [
        source.map(|s| text(&s.component)).unwrap_or_default(),
        source.map(|s| text(&s.host)).unwrap_or_default(),
        text(&o.kind),
        text(&o.namespace),
        text(&o.name),
        text(&o.uid),
        text(&o.api_version),
        text(&e.type_),
    ]
    .join("\u{1f}")
}

/// The spam key plus the reason: events that differ only in message are similar.
fn similar_key(e: &Event) -> String {
    format!("{}\u{1f}{}", object_key(e), text(&e.reason))
}

/// Everything that makes two events the same event, the field path included.
fn identity_key(e: &Event) -> String {
    format!(
        "{}\u{1f}{}\u{1f}{}",
        similar_key(e),
        text(&e.involved_object.field_path),
        text(&e.message)
    )
}

fn since(later: Timestamp, earlier: Timestamp) -> Duration {
    let nanos = later.as_nanosecond() - earlier.as_nanosecond();
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(0))
}

fn event_time(e: &Event) -> Timestamp {
    e.last_timestamp
        .as_ref()
        .map(|t| t.0)
        .unwrap_or(Timestamp::UNIX_EPOCH)
}

impl Correlator {
    /// Decides what to write for `event` (made at its `lastTimestamp`).
    pub(crate) fn correlate(&mut self, event: Event) -> Correlated {
        let now = event_time(&event);
        let (event, key) = self.fold_similar(event, now);
        let event = self.count_repeat(event, &key);
        if !self.spam_allows(&event, now) {
            return Correlated::Skip;
        }
        if event.count.unwrap_or(1) > 1 {
            Correlated::Update(event)
        } else {
            Correlated::Create(event)
        }
    }

    /// The server accepted `event` (as it returned it): later repeats update this one.
    pub(crate) fn written(&mut self, event: &Event) {
        let entry = Written {
            name: event.metadata.name.clone().unwrap_or_default(),
            count: event.count.unwrap_or(1),
            first: event.first_timestamp.clone(),
        };
        self.written.insert(Self::key_for_written(event), entry);
    }

    /// Forgets `event`'s server copy (it was deleted there): the next repeat creates it anew.
    pub(crate) fn forget(&mut self, event: &Event) {
        let key = Self::key_for_written(event);
        self.written.entries.remove(&key);
    }

    /// A combined event is keyed by its similar-key, any other by its identity.
    fn key_for_written(e: &Event) -> String {
        if text(&e.message).starts_with(COMBINED_PREFIX) {
            similar_key(e)
        } else {
            identity_key(e)
        }
    }

    fn fold_similar(&mut self, event: Event, now: Timestamp) -> (Event, String) {
        let key = similar_key(&event);
        let message = text(&event.message).to_string();
        let fresh = || Similar {
            messages: HashSet::new(),
            last: now,
        };
        let mut record = match self.similar.entries.remove(&key) {
            Some((_, r)) if since(now, r.last) <= AGGREGATE_WINDOW => r,
            _ => fresh(),
        };
        record.messages.insert(message.clone());
        record.last = now;
        let combine = record.messages.len() >= AGGREGATE_MAX;
        if combine {
            // Keep the set from growing past the limit, as upstream does.
            if let Some(any) = record.messages.iter().next().cloned() {
                record.messages.remove(&any);
            }
        }
        self.similar.insert(key.clone(), record);
        if !combine {
            return (event.clone(), identity_key(&event));
        }
        let mut combined = event;
        combined.message = Some(format!("{COMBINED_PREFIX}{message}"));
        combined.count = Some(1);
        combined.first_timestamp = Some(Time(now));
        combined.last_timestamp = Some(Time(now));
        (combined, key)
    }

    fn count_repeat(&mut self, mut event: Event, key: &str) -> Event {
        let key = key.to_string();
        if let Some(seen) = self.written.get_mut(&key) {
            event.metadata.name = Some(seen.name.clone());
            event.first_timestamp = seen.first.clone();
            event.count = Some(seen.count + 1);
            seen.count += 1;
        } else {
            self.written.insert(
                key,
                Written {
                    name: event.metadata.name.clone().unwrap_or_default(),
                    count: event.count.unwrap_or(1),
                    first: event.first_timestamp.clone(),
                },
            );
        }
        event
    }

    fn spam_allows(&mut self, event: &Event, now: Timestamp) -> bool {
        let key = object_key(event);
        let refill = |b: &mut Bucket| {
            let gained = since(now, b.at).as_secs_f64() / SPAM_REFILL.as_secs_f64();
            b.tokens = (b.tokens + gained).min(SPAM_BURST);
            b.at = now;
        };
        let bucket = match self.spam.get_mut(&key) {
            Some(b) => {
                refill(b);
                b
            }
            None => {
                self.spam.insert(
                    key.clone(),
                    Bucket {
                        tokens: SPAM_BURST,
                        at: now,
                    },
                );
                self.spam.get_mut(&key).expect("just inserted")
            }
        };
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Keys held, for tests of the bound.
    #[cfg(test)]
    fn sizes(&self) -> (usize, usize, usize) {
        (self.similar.len(), self.written.len(), self.spam.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kubelet::events::{EventType, container_ref, new_event, node_ref, pod_ref};
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(name: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn ev(p: &str, reason: &str, message: &str, secs: i64) -> Event {
        new_event(
            pod_ref(&pod(p)),
            EventType::Warning,
            reason,
            message.to_string(),
            "n1",
            at(secs),
        )
    }

    /// Feeds events in order (writing each created or updated one), returns the outcomes.
    fn run(events: Vec<Event>) -> Vec<Correlated> {
        let mut c = Correlator::default();
        events
            .into_iter()
            .map(|e| {
                let out = c.correlate(e);
                if let Correlated::Create(w) | Correlated::Update(w) = &out {
                    c.written(w);
                }
                out
            })
            .collect()
    }

    fn summary(out: &[Correlated]) -> Vec<String> {
        out.iter()
            .map(|o| match o {
                Correlated::Skip => "skip".to_string(),
                Correlated::Create(e) => format!("create {}", text(&e.message)),
                Correlated::Update(e) => {
                    format!("update#{} {}", e.count.unwrap_or(0), text(&e.message))
                }
            })
            .collect()
    }

    #[test]
    fn table() {
        type Row = (&'static str, Vec<Event>, Vec<&'static str>);
        let many_similar: Vec<Event> = (0..11)
            .map(|i| ev("a", "Unhealthy", &format!("probe failed: {i}"), i))
            .collect();
        let mut folded = vec![
            "create probe failed: 0",
            "create probe failed: 1",
            "create probe failed: 2",
            "create probe failed: 3",
            "create probe failed: 4",
            "create probe failed: 5",
            "create probe failed: 6",
            "create probe failed: 7",
            "create probe failed: 8",
        ];
        folded.push("create (combined from similar events): probe failed: 9");
        folded.push("update#2 (combined from similar events): probe failed: 10");
        let spread_out: Vec<Event> = (0..11)
            .map(|i| ev("a", "Unhealthy", &format!("m{i}"), i * 601))
            .collect();
        let rows: Vec<Row> = vec![
            (
                "an identical repeat updates the written event's count",
                vec![
                    ev("a", "BackOff", "Back-off", 0),
                    ev("a", "BackOff", "Back-off", 5),
                    ev("a", "BackOff", "Back-off", 9),
                ],
                vec!["create Back-off", "update#2 Back-off", "update#3 Back-off"],
            ),
            (
                "different objects are counted apart",
                vec![ev("a", "Pulled", "x", 0), ev("b", "Pulled", "x", 0)],
                vec!["create x", "create x"],
            ),
            (
                "the 10th distinct message within 10 minutes is combined, then counted",
                many_similar,
                folded,
            ),
            (
                "similar events further apart than 10 minutes are not combined",
                spread_out,
                vec![
                    "create m0",
                    "create m1",
                    "create m2",
                    "create m3",
                    "create m4",
                    "create m5",
                    "create m6",
                    "create m7",
                    "create m8",
                    "create m9",
                    "create m10",
                ],
            ),
        ];
        for (name, events, want) in rows {
            assert_eq!(summary(&run(events)), want, "{name}");
        }
    }

    #[test]
    fn an_object_gets_25_events_then_one_per_five_minutes() {
        // Distinct reasons so that nothing folds; all at the same second.
        let burst: Vec<Event> = (0..30).map(|i| ev("a", &format!("R{i}"), "m", 0)).collect();
        let out = run(burst);
        let sent = out.iter().filter(|o| **o != Correlated::Skip).count();
        assert_eq!(sent, 25);
        // Another object is not affected.
        let mut c = Correlator::default();
        for i in 0..30 {
            c.correlate(ev("a", &format!("R{i}"), "m", 0));
        }
        assert_ne!(c.correlate(ev("b", "R0", "m", 0)), Correlated::Skip);
        // 299 s later: still nothing; 300 s: one more, then nothing again.
        assert_eq!(c.correlate(ev("a", "S1", "m", 299)), Correlated::Skip);
        assert!(matches!(
            c.correlate(ev("a", "S2", "m", 301)),
            Correlated::Create(_)
        ));
        assert_eq!(c.correlate(ev("a", "S3", "m", 302)), Correlated::Skip);
    }

    #[test]
    fn repeats_of_a_container_event_keep_name_and_first_time() {
        let p = pod("a");
        let mk = |secs| {
            new_event(
                container_ref(&p, "app"),
                EventType::Warning,
                "BackOff",
                "Back-off restarting failed container app".into(),
                "n1",
                at(secs),
            )
        };
        let mut c = Correlator::default();
        let Correlated::Create(first) = c.correlate(mk(0)) else {
            panic!("first is created")
        };
        c.written(&first);
        let Correlated::Update(again) = c.correlate(mk(30)) else {
            panic!("repeat is an update")
        };
        assert_eq!(again.metadata.name, first.metadata.name);
        assert_eq!(again.first_timestamp, first.first_timestamp);
        assert_eq!(again.last_timestamp, Some(Time(at(30))));
        assert_eq!(again.count, Some(2));
        // The server lost it: forgetting makes the next repeat a create.
        c.forget(&again);
        assert!(matches!(c.correlate(mk(40)), Correlated::Create(_)));
    }

    #[test]
    fn caches_stay_bounded() {
        let mut c = Correlator::default();
        for i in 0..(CACHE_ENTRIES * 2) {
            c.correlate(new_event(
                node_ref(&format!("n{i}"), None),
                EventType::Normal,
                "Starting",
                "m".into(),
                "n1",
                at(0),
            ));
        }
        let (a, b, s) = c.sizes();
        assert!(a <= CACHE_ENTRIES && b <= CACHE_ENTRIES && s <= CACHE_ENTRIES);
    }
}
