//! Retrying requests to the API server as upstream's node agent does: a doubling back-off that
//! stops growing at 7 s, and a pause that ends early on shutdown. The same back-off paces kube's
//! watcher after a failure (see [`super::watch`]).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// The longest wait between two tries (upstream's node Lease and registration back-off).
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(7);

/// Doubling back-off from `first` to [`MAX_BACKOFF`].
#[derive(Debug)]
pub(crate) struct Backoff {
    next: Duration,
    first: Duration,
}

impl Backoff {
    pub(crate) fn new(first: Duration) -> Self {
        Backoff { next: first, first }
    }

    /// The wait before the next try; each call doubles the one after.
    pub(crate) fn next_wait(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(MAX_BACKOFF);
        d
    }

    /// After a success: the next failure waits `first` again.
    pub(crate) fn reset(&mut self) {
        self.next = self.first;
    }
}

/// Sleeps `d`; false when `cancel` fired first.
pub(crate) async fn pause(d: Duration, cancel: &CancellationToken) -> bool {
    tokio::select! {
        _ = cancel.cancelled() => false,
        _ = tokio::time::sleep(d) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_to_seven_seconds_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100));
        let waits: Vec<u128> = (0..9).map(|_| b.next_wait().as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 800, 1600, 3200, 6400, 7000, 7000]);
        b.reset();
        assert_eq!(b.next_wait(), Duration::from_millis(100));
    }
}
