//! "Look at this pod again": the requests that the PLEG and the probe workers send to the sync
//! loop, coalesced.
//!
//! A pod's worker only needs to know that something changed, not how often, so a poke is a UID
//! put in a set. Producers never wait and no poke is ever lost, yet memory stays bounded by the
//! number of distinct pods however far the consumer falls behind (an unbounded channel would
//! hold one entry per event instead).

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// The set of pods waiting for a look; cheap to clone, all clones share it.
#[derive(Clone, Default)]
pub struct Pokes {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    uids: Mutex<BTreeSet<String>>,
    ready: Notify,
}

impl Pokes {
    /// Asks for a look at the pod (at once; never blocks).
    pub fn poke(&self, uid: &str) {
        let added = self
            .inner
            .uids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(uid.to_string());
        if added {
            self.inner.ready.notify_one();
        }
    }

    /// Waits until some pod was poked, and takes every poked UID.
    pub async fn take(&self) -> Vec<String> {
        loop {
            let taken: Vec<String> = {
                let mut uids = self.inner.uids.lock().unwrap_or_else(|e| e.into_inner());
                std::mem::take(&mut *uids).into_iter().collect()
            };
            if !taken.is_empty() {
                return taken;
            }
            self.inner.ready.notified().await;
        }
    }

    /// How many pods wait for a look.
    pub fn pending(&self) -> usize {
        self.inner
            .uids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn pokes_coalesce_and_wake_the_taker() {
        let p = Pokes::default();
        for _ in 0..1000 {
            p.poke("a");
        }
        p.poke("b");
        assert_eq!(p.pending(), 2, "a thousand pokes of one pod hold one entry");
        assert_eq!(p.take().await, vec!["a", "b"]);
        let taker = tokio::spawn({
            let p = p.clone();
            async move { p.take().await }
        });
        tokio::task::yield_now().await;
        p.poke("c");
        let got = tokio::time::timeout(Duration::from_secs(5), taker)
            .await
            .expect("woken")
            .unwrap();
        assert_eq!(got, vec!["c"]);
    }
}
