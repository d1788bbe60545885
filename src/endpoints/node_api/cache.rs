//! A small time-limited answer cache for the reviews (upstream caches both TokenReview and
//! SubjectAccessReview answers), bounded so a flood of distinct tokens cannot grow it
//! without end: when full, the oldest answer goes first.

use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use crate::base::clock::Instant;

/// How many answers a cache keeps unless told otherwise.
pub(crate) const DEFAULT_CAPACITY: usize = 4096;

pub(crate) struct TtlCache<K, V> {
    capacity: usize,
    inner: Mutex<Entries<K, V>>,
}

/// The answers by key, and their keys in the order they were stored (oldest first), so the
/// oldest is found without a scan.
struct Entries<K, V> {
    by_key: HashMap<K, Entry<V>>,
    by_age: BTreeMap<u64, K>,
    next: u64,
}

struct Entry<V> {
    value: V,
    until: Instant,
    stored: u64,
}

impl<K: Eq + Hash + Clone, V: Clone> Default for TtlCache<K, V> {
    fn default() -> Self {
        TtlCache::with_capacity(DEFAULT_CAPACITY)
    }
}

impl<K: Eq + Hash + Clone, V: Clone> TtlCache<K, V> {
    /// A cache of at most `capacity` answers (at least one).
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        TtlCache {
            capacity: capacity.max(1),
            inner: Mutex::new(Entries {
                by_key: HashMap::new(),
                by_age: BTreeMap::new(),
                next: 0,
            }),
        }
    }

    /// The answer for `key`, if one is kept and has not expired at `now`.
    pub(crate) fn get(&self, key: &K, now: Instant) -> Option<V> {
        let mut e = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let entry = e.by_key.get(key)?;
        if now < entry.until {
            return Some(entry.value.clone());
        }
        let stored = entry.stored;
        e.by_key.remove(key);
        e.by_age.remove(&stored);
        None
    }

    /// Keeps `value` for `ttl` from `now` (a zero ttl keeps nothing). A full cache first
    /// drops its oldest answer.
    pub(crate) fn put(&self, key: K, value: V, ttl: Duration, now: Instant) {
        if ttl.is_zero() {
            return;
        }
        let mut e = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = e.by_key.remove(&key) {
            e.by_age.remove(&old.stored);
        }
        while e.by_key.len() >= self.capacity {
            let Some((_, oldest)) = e.by_age.pop_first() else {
                break;
            };
            e.by_key.remove(&oldest);
        }
        let stored = e.next;
        e.next += 1;
        e.by_age.insert(stored, key.clone());
        e.by_key.insert(
            key,
            Entry {
                value,
                until: now + ttl,
                stored,
            },
        );
    }

    /// How many answers are kept (expired ones included until they are looked up or pushed
    /// out).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .by_key
            .len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_expire() {
        let c = TtlCache::default();
        let t0 = Instant::now();
        c.put("a", 1, Duration::from_secs(10), t0);
        c.put("z", 2, Duration::ZERO, t0);
        assert_eq!(c.get(&"a", t0 + Duration::from_secs(9)), Some(1));
        assert_eq!(c.get(&"a", t0 + Duration::from_secs(10)), None);
        assert_eq!(c.get(&"z", t0), None);
        assert!(c.is_empty(), "an expired answer looked up is dropped");
    }

    #[test]
    fn a_full_cache_drops_its_oldest_answer_only() {
        let c = TtlCache::with_capacity(3);
        let t0 = Instant::now();
        let ttl = Duration::from_secs(60);
        for k in ["a", "b", "c"] {
            c.put(k, k.len(), ttl, t0);
        }
        // Storing "a" again makes it the newest.
        c.put("a", 7, ttl, t0);
        c.put("d", 4, ttl, t0);
        assert_eq!(c.get(&"b", t0), None, "the oldest went");
        assert_eq!(c.get(&"a", t0), Some(7));
        assert_eq!(c.get(&"c", t0), Some(1));
        assert_eq!(c.get(&"d", t0), Some(4));
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn stays_bounded_and_keeps_the_newest() {
        let c = TtlCache::with_capacity(DEFAULT_CAPACITY);
        let t0 = Instant::now();
        for i in 0..(DEFAULT_CAPACITY * 3) {
            c.put(i, i, Duration::from_secs(60), t0);
        }
        assert_eq!(c.len(), DEFAULT_CAPACITY);
        let last = DEFAULT_CAPACITY * 3 - 1;
        assert_eq!(c.get(&last, t0), Some(last));
        assert_eq!(c.get(&0, t0), None);
    }
}
