//! A small time-limited answer cache for the reviews (upstream caches both TokenReview and
//! SubjectAccessReview answers), bounded so a flood of distinct tokens cannot grow it
//! without end.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// At most this many answers are kept; when full, expired ones are dropped first, then
/// everything (a rare, cheap reset rather than an LRU).
const MAX_ENTRIES: usize = 4096;

pub struct TtlCache<K, V> {
    entries: Mutex<HashMap<K, (V, Instant)>>,
}

impl<K: Eq + Hash, V: Clone> Default for TtlCache<K, V> {
    fn default() -> Self {
        TtlCache {
            entries: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash, V: Clone> TtlCache<K, V> {
    /// The answer for `key`, if one is kept and has not expired at `now`.
    pub fn get(&self, key: &K, now: Instant) -> Option<V> {
        let map = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        map.get(key)
            .filter(|(_, until)| now < *until)
            .map(|(v, _)| v.clone())
    }

    /// Keeps `value` for `ttl` from `now` (a zero ttl keeps nothing).
    pub fn put(&self, key: K, value: V, ttl: Duration, now: Instant) {
        if ttl.is_zero() {
            return;
        }
        let mut map = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        if map.len() >= MAX_ENTRIES {
            map.retain(|_, (_, until)| now < *until);
            if map.len() >= MAX_ENTRIES {
                map.clear();
            }
        }
        map.insert(key, (value, now + ttl));
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
    }

    #[test]
    fn stays_bounded() {
        let c = TtlCache::default();
        let t0 = Instant::now();
        for i in 0..(MAX_ENTRIES + 10) {
            c.put(i, i, Duration::from_secs(60), t0);
        }
        assert!(c.entries.lock().unwrap().len() <= MAX_ENTRIES);
    }
}
