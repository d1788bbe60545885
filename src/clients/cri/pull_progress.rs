//! A progress deadline for image pulls.
//!
//! CRI's `PullImage` is one call that answers when the image is complete; it reports no
//! progress, and upstream gives it no deadline, so a registry that accepts a connection and
//! then says nothing holds a pod in `ContainerCreating` for as long as the connection lives.
//! containerd writes every blob it downloads through its content store, and its content
//! service lists those writes in progress ("ingests") with the bytes written so far. Deckhand
//! reads that list while a pull runs: when neither the set of ingests nor their byte counts
//! change for the deadline (`--image-pull-progress-deadline`, 1 minute, the old dockershim
//! flag's name and default), the pull is abandoned and reported as `ErrImagePull`.
//!
//! The list covers every pull of the namespace, not only ours, so a concurrent pull that moves
//! counts as progress for all: the deadline only ever fires when nothing at all is arriving.
//! A runtime without the content service (another CRI runtime) gives no reading, and then a
//! pull has no deadline, as upstream.

use std::time::Duration;

use tokio::time::Instant;

use super::proto::{AuthConfig, PodSandboxConfig};
use super::{CriError, ImageService};
use crate::base::clock;

/// Types generated from `proto/containerd/services/content/v1/content.proto`.
#[allow(clippy::all, missing_docs, unreachable_pub)]
pub(crate) mod content_proto {
    tonic::include_proto!("containerd.services.content.v1");
}

/// containerd keeps CRI's objects in this namespace; requests name it in a gRPC header.
pub(crate) const CRI_NAMESPACE: &str = "k8s.io";
/// The gRPC metadata key that selects a containerd namespace.
pub(crate) const NAMESPACE_HEADER: &str = "containerd-namespace";

/// What the content store shows of the pulls in flight.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PullProgress {
    /// The ingests in progress, by ref, with the bytes written so far, sorted by ref.
    pub ingests: Vec<(String, i64)>,
}

impl PullProgress {
    pub fn from_statuses(statuses: Vec<content_proto::Status>) -> Self {
        let mut ingests: Vec<(String, i64)> =
            statuses.into_iter().map(|s| (s.r#ref, s.offset)).collect();
        ingests.sort();
        PullProgress { ingests }
    }
}

/// Watches successive readings and says when the pull has made no progress for too long.
/// Pure: the readings and the times are given.
#[derive(Debug)]
pub(crate) struct ProgressWatch {
    deadline: Duration,
    last: Option<PullProgress>,
    since: Instant,
}

/// What a new reading means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Something moved, or the deadline has not passed yet.
    Going,
    /// Nothing moved for the whole deadline.
    Stalled,
}

impl ProgressWatch {
    /// Starts watching a pull that began at `started`.
    pub(crate) fn new(deadline: Duration, started: Instant) -> Self {
        ProgressWatch {
            deadline,
            last: None,
            since: started,
        }
    }

    /// Takes a reading made at `now`; `None` when the runtime could not say. A failed reading
    /// is neither progress nor a stall (the clock keeps running from the last change), and a
    /// runtime that never gives one never stalls a pull.
    pub(crate) fn observe(&mut self, reading: Option<PullProgress>, now: Instant) -> Verdict {
        if let Some(reading) = reading
            && self.last.as_ref() != Some(&reading)
        {
            // The first reading counts as a change only if it shows bytes arriving.
            let moved = self.last.is_some() || !reading.ingests.is_empty();
            self.last = Some(reading);
            if moved {
                self.since = now;
            }
        }
        if self.last.is_none() {
            // Never a reading: the runtime cannot tell, so there is no deadline to judge.
            return Verdict::Going;
        }
        if now.saturating_duration_since(self.since) >= self.deadline {
            Verdict::Stalled
        } else {
            Verdict::Going
        }
    }

    /// How often readings are worth taking for this deadline.
    pub(crate) fn poll_period(&self) -> Duration {
        (self.deadline / 4).clamp(Duration::from_millis(250), Duration::from_secs(5))
    }
}

/// Pulls `image`, abandoning the pull when it makes no progress for `deadline` (none: wait as
/// long as the pull takes).
pub(crate) async fn pull_with_progress_deadline<R: ImageService>(
    rt: &R,
    image: String,
    auth: Option<AuthConfig>,
    sandbox_config: Option<PodSandboxConfig>,
    deadline: Option<Duration>,
) -> Result<String, CriError> {
    let pull = rt.pull_image(image, auth, sandbox_config);
    let Some(deadline) = deadline else {
        return pull.await;
    };
    tokio::pin!(pull);
    let mut watch = ProgressWatch::new(deadline, clock::instant());
    let mut ticks = tokio::time::interval(watch.poll_period());
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            result = &mut pull => return result,
            _ = ticks.tick() => {
                let reading = rt.pull_progress().await;
                if watch.observe(reading, clock::instant()) == Verdict::Stalled {
                    // Dropping the call cancels it; containerd ends the pull with its context.
                    return Err(CriError::PullStalled { deadline });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(items: &[(&str, i64)]) -> Option<PullProgress> {
        Some(PullProgress {
            ingests: items.iter().map(|(r, o)| (r.to_string(), *o)).collect(),
        })
    }

    #[test]
    fn stalls_only_when_nothing_moves_for_the_whole_deadline() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut w = ProgressWatch::new(s(10), t0);
        // (reading, seconds after the start, verdict)
        let rows: Vec<(Option<PullProgress>, u64, Verdict)> = vec![
            (reading(&[]), 2, Verdict::Going),
            (None, 5, Verdict::Going),
            (reading(&[("layer-a", 100)]), 8, Verdict::Going),
            (reading(&[("layer-a", 100)]), 17, Verdict::Going),
            (reading(&[("layer-a", 900)]), 18, Verdict::Going),
            // The blob is committed: its ingest disappears, which is a change.
            (reading(&[]), 25, Verdict::Going),
            (reading(&[]), 34, Verdict::Going),
            (None, 35, Verdict::Stalled),
        ];
        for (i, (r, at, want)) in rows.into_iter().enumerate() {
            assert_eq!(w.observe(r, t0 + s(at)), want, "row {i}");
        }
    }

    #[test]
    fn no_reading_ever_means_no_deadline() {
        let t0 = Instant::now();
        let mut w = ProgressWatch::new(Duration::from_secs(2), t0);
        assert_eq!(
            w.observe(None, t0 + Duration::from_secs(100)),
            Verdict::Going
        );
    }

    #[test]
    fn a_pull_that_never_receives_anything_stalls_at_the_deadline() {
        let t0 = Instant::now();
        let mut w = ProgressWatch::new(Duration::from_secs(2), t0);
        assert_eq!(
            w.observe(reading(&[]), t0 + Duration::from_secs(1)),
            Verdict::Going
        );
        assert_eq!(
            w.observe(reading(&[]), t0 + Duration::from_secs(2)),
            Verdict::Stalled
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_pull_is_abandoned_and_a_moving_one_is_not() {
        use crate::clients::cri::fake::{FakeCri, Script};
        let rt = FakeCri::default();
        rt.set_progress(reading(&[]));
        rt.script("PullImage", Script::Hang);
        let started = Instant::now();
        let got = pull_with_progress_deadline(
            &rt,
            "example.test/slow:1".into(),
            None,
            None,
            Some(Duration::from_secs(60)),
        )
        .await;
        assert!(matches!(got, Err(CriError::PullStalled { .. })), "{got:?}");
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_secs(60) && waited <= Duration::from_secs(66),
            "{waited:?}"
        );

        // A runtime that gives no reading: the pull runs as long as it takes.
        let rt = FakeCri::default();
        rt.script("PullImage", Script::Hang);
        let pull = pull_with_progress_deadline(
            &rt,
            "example.test/ok:1".into(),
            None,
            None,
            Some(Duration::from_secs(1)),
        );
        tokio::pin!(pull);
        let early = tokio::time::timeout(Duration::from_secs(600), &mut pull).await;
        assert!(early.is_err(), "abandoned without any reading: {early:?}");
        rt.release();
        assert_eq!(pull.await.unwrap(), "sha256:example.test/ok:1");
    }

    #[test]
    fn poll_period_follows_the_deadline() {
        let w = |d| ProgressWatch::new(Duration::from_secs(d), Instant::now()).poll_period();
        assert_eq!(w(60), Duration::from_secs(5));
        assert_eq!(w(2), Duration::from_millis(500));
        assert_eq!(
            ProgressWatch::new(Duration::from_millis(100), Instant::now()).poll_period(),
            Duration::from_millis(250)
        );
    }
}
