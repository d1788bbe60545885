//! `requiresRepublish`: a driver that asks for it has its volumes published again while
//! their pod runs, so that what it was handed (the `tokenRequests` tokens, above all) is
//! renewed before it expires. Upstream marks every volume of such a driver for a remount on
//! each sync of the pod (`WaitForAttachAndMount` → `ReprocessPod` → `MarkRemountRequired`),
//! so at least once per `syncFrequency`, and the reconciler calls `SetUp` again:
//! `NodePublishVolume` with fresh tokens, never an unpublish and, for a persistent volume
//! already staged, no stage. A republish that fails is told in a `FailedMount` event and
//! tried again after upstream's volume back-off; the volume stays mounted and the pod runs.
//!
//! Which volumes are published again at a sync is pure ([`due`]); the executor carries it
//! out and keeps the back-off.

use tokio::time::Instant;

use crate::kubelet::volume::backoff::{MountBackoff, Turn};

/// A CSI volume of the pod that is published, as its `vol_data.json` and its driver's
/// CSIDriver tell it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Published {
    /// The pod's volume name.
    pub volume: String,
    /// The driver's CSIDriver says `requiresRepublish: true`.
    pub requires_republish: bool,
}

/// The volumes to publish again at a sync at `now` (pure): those whose driver requires it,
/// unless a republish of theirs failed and its back-off runs still.
pub(crate) fn due(published: &[Published], backoff: &MountBackoff, now: Instant) -> Vec<String> {
    published
        .iter()
        .filter(|p| p.requires_republish)
        .filter(|p| !matches!(backoff.turn(&p.volume, 0, now), Turn::Wait(_)))
        .map(|p| p.volume.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn published(volume: &str, requires_republish: bool) -> Published {
        Published {
            volume: volume.into(),
            requires_republish,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn each_sync_republishes_unless_a_failure_backs_it_off() {
        let volumes = [published("tokens", true), published("plain", false)];
        let mut backoff = MountBackoff::default();
        let start = Instant::now();
        let ms = Duration::from_millis;
        // Every sync of a healthy volume republishes it; the other driver's never.
        assert_eq!(due(&volumes, &backoff, start), ["tokens"]);
        tokio::time::advance(ms(10)).await;
        assert_eq!(due(&volumes, &backoff, Instant::now()), ["tokens"]);

        // A failure: not again for 500 ms, then 1 s after the second, as upstream's back-off.
        let failed_at = Instant::now();
        assert_eq!(backoff.failed("tokens", 0, failed_at, "e".into()), ms(500));
        // (sync after the failure, due?)
        let rows = [(ms(0), false), (ms(499), false), (ms(500), true)];
        for (after, want) in rows {
            let got = due(&volumes, &backoff, failed_at + after);
            assert_eq!(!got.is_empty(), want, "{after:?} after the failure");
        }
        tokio::time::advance(ms(500)).await;
        let again = Instant::now();
        assert_eq!(backoff.failed("tokens", 0, again, "e".into()), ms(1000));
        tokio::time::advance(ms(999)).await;
        assert!(due(&volumes, &backoff, Instant::now()).is_empty());
        tokio::time::advance(ms(1)).await;
        assert_eq!(due(&volumes, &backoff, Instant::now()), ["tokens"]);

        // A success forgets the back-off: the next sync republishes at once.
        backoff.succeeded("tokens");
        assert_eq!(due(&volumes, &backoff, Instant::now()), ["tokens"]);
        assert_eq!(backoff.next_try(Instant::now()), None);
    }

    #[test]
    fn only_drivers_that_ask_for_it() {
        let now = Instant::now();
        let backoff = MountBackoff::default();
        // (volumes published, due)
        let rows: Vec<(Vec<Published>, Vec<&str>)> = vec![
            (vec![], vec![]),
            (vec![published("a", false)], vec![]),
            (vec![published("a", true)], vec!["a"]),
            (
                vec![
                    published("a", true),
                    published("b", false),
                    published("c", true),
                ],
                vec!["a", "c"],
            ),
        ];
        for (volumes, want) in rows {
            assert_eq!(due(&volumes, &backoff, now), want, "{volumes:?}");
        }
    }
}
