//! When to rotate a certificate: at a jittered 70-90 % of its life, as upstream's
//! certificate manager does, so that a fleet of nodes does not renew at once and a
//! certificate is replaced well before it expires; and how to retry a failed attempt to get
//! one (the same for bootstrap, client rotation and the serving certificate).

use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, SystemTime};

use tokio_util::sync::CancellationToken;

use crate::base::clock;

/// The pause after the first failed attempt to get a certificate; it doubles after each
/// further failure, up to [`RETRY_MAX`].
pub(crate) const RETRY_FIRST: Duration = Duration::from_secs(2);
/// The longest pause between two attempts.
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(5 * 60);

/// Runs `attempt` until it succeeds, pausing [`RETRY_FIRST`], then twice as long each time up
/// to [`RETRY_MAX`], between failures. Each failure goes to `failed` with the pause that
/// follows; `failed` returns false to give up, and the failure comes back as `Err(Some(_))`.
/// `Err(None)`: `cancel` fired during a pause.
pub(crate) async fn retry_with_backoff<E, Fut>(
    cancel: &CancellationToken,
    mut attempt: impl FnMut() -> Fut,
    mut failed: impl FnMut(&E, Duration) -> bool,
) -> Result<(), Option<E>>
where
    Fut: std::future::Future<Output = Result<(), E>>,
{
    let mut pause = RETRY_FIRST;
    loop {
        match attempt().await {
            Ok(()) => return Ok(()),
            Err(e) if !failed(&e, pause) => return Err(Some(e)),
            Err(_) => {}
        }
        tokio::select! {
            _ = cancel.cancelled() => return Err(None),
            _ = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(RETRY_MAX);
    }
}

/// The rotation deadline of a certificate valid from `not_before` to `not_after`, for a
/// `jitter` in [0, 1] (clamped): `not_before + life × (0.7 + 0.2 × jitter)`. A certificate
/// whose `not_after` is not after `not_before` is due at once (`not_before`).
pub(crate) fn rotation_deadline(
    not_before: SystemTime,
    not_after: SystemTime,
    jitter: f64,
) -> SystemTime {
    let Ok(life) = not_after.duration_since(not_before) else {
        return not_before;
    };
    let jitter = if jitter.is_nan() {
        0.0
    } else {
        jitter.clamp(0.0, 1.0)
    };
    // Whole milliseconds: no float noise in the result.
    let millis = (life.as_millis() as f64 * (0.7 + 0.2 * jitter)).round();
    not_before + Duration::from_millis(millis as u64)
}

/// How long from `now` until `deadline` (zero when it has passed).
pub(crate) fn wait_for(deadline: SystemTime, now: SystemTime) -> Duration {
    deadline.duration_since(now).unwrap_or(Duration::ZERO)
}

/// A random jitter in [0, 1) (from the process's randomly keyed hasher; no crypto needed).
pub(crate) fn jitter() -> f64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(
        clock::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn deadline_table() {
        // (not_before, not_after, jitter, expected deadline), seconds.
        let cases: &[(u64, u64, f64, u64)] = &[
            (0, 1000, 0.0, 700),
            (0, 1000, 1.0, 900),
            (0, 1000, 0.5, 800),
            (1000, 2000, 0.25, 1750),
            // Out-of-range jitter is clamped; NaN counts as 0.
            (0, 1000, -3.0, 700),
            (0, 1000, 7.0, 900),
            (0, 1000, f64::NAN, 700),
            // A year-long certificate: between 255.5 and 328.5 days.
            (0, 365 * 86400, 0.0, 255 * 86400 + 43200),
            (0, 365 * 86400, 1.0, 328 * 86400 + 43200),
            // A broken certificate (ends before it starts) is due at once.
            (500, 100, 0.5, 500),
            (500, 500, 0.5, 500),
        ];
        for &(nb, na, j, want) in cases {
            assert_eq!(
                rotation_deadline(at(nb), at(na), j),
                at(want),
                "nb={nb} na={na} jitter={j}"
            );
        }
    }

    #[test]
    fn waits() {
        assert_eq!(wait_for(at(10), at(4)), Duration::from_secs(6));
        assert_eq!(wait_for(at(4), at(10)), Duration::ZERO);
    }

    #[test]
    fn jitter_is_in_range() {
        for _ in 0..1000 {
            let j = jitter();
            assert!((0.0..1.0).contains(&j), "{j}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn retries_back_off_and_stop_when_told() {
        let cancel = CancellationToken::new();
        let mut calls = 0;
        let mut pauses = Vec::new();
        let r: Result<(), Option<&str>> = retry_with_backoff(
            &cancel,
            || {
                calls += 1;
                let n = calls;
                async move { if n < 4 { Err("not yet") } else { Ok(()) } }
            },
            |_, pause| {
                pauses.push(pause.as_secs());
                true
            },
        )
        .await;
        assert_eq!(r, Ok(()));
        assert_eq!(pauses, [2, 4, 8]);
        let r: Result<(), Option<&str>> =
            retry_with_backoff(&cancel, || async { Err("fatal") }, |_, _| false).await;
        assert_eq!(r, Err(Some("fatal")));
        cancel.cancel();
        let r: Result<(), Option<&str>> =
            retry_with_backoff(&cancel, || async { Err("down") }, |_, _| true).await;
        assert_eq!(r, Err(None));
    }
}
