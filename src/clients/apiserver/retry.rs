//! Retrying requests to the API server as upstream's node agent does: a doubling back-off that
//! stops growing at 7 s, and a pause that ends early on shutdown. The same back-off paces kube's
//! watcher after a failure (see [`super::watch`]).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// The longest wait between two tries (upstream's node Lease and registration back-off).
pub const MAX_BACKOFF: Duration = Duration::from_secs(7);

/// Doubling back-off from `first` to [`MAX_BACKOFF`].
#[derive(Debug)]
pub struct Backoff {
    next: Duration,
    first: Duration,
}

impl Backoff {
    pub fn new(first: Duration) -> Self {
        Backoff { next: first, first }
    }

    /// The wait before the next try; each call doubles the one after.
    pub fn next_wait(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(MAX_BACKOFF);
        d
    }

    /// After a success: the next failure waits `first` again.
    pub fn reset(&mut self) {
        self.next = self.first;
    }
}

/// As kube's runtime wants a back-off: an endless series of waits, reset after a success.
impl Iterator for Backoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(self.next_wait())
    }
}

impl kube::runtime::utils::Backoff for Backoff {
    fn reset(&mut self) {
        Backoff::reset(self);
    }
}

/// Sleeps `d`; false when `cancel` fired first.
pub async fn pause(d: Duration, cancel: &CancellationToken) -> bool {
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

    #[test]
    fn as_kubes_backoff_it_never_gives_up_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100));
        assert_eq!(
            b.nth(20),
            Some(MAX_BACKOFF),
            "never None: the watch is never given up"
        );
        kube::runtime::utils::Backoff::reset(&mut b);
        assert_eq!(b.next(), Some(Duration::from_millis(100)));
    }
}
