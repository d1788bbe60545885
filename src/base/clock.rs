//! The one place production code reads time (`tests/one_clock.rs` holds the rest of the crate
//! to it).
//!
//! - **One source.** Deadlines, periods and durations use tokio's [`Instant`], read with
//!   [`instant`]. Under `tokio::time::pause()` a unit test then governs every deadline at once,
//!   where a `std::time::Instant` beside it would keep running on the machine's clock. Outside a
//!   runtime, and in production, tokio's instant is the std one.
//! - **Testable.** Wall-clock decisions (status and event timestamps, the Lease's renewTime,
//!   certificate deadlines, token refresh, ages for GC and log rotation) read [`now`] or
//!   [`timestamp`]; a unit test sets that clock on its own thread with [`set_wall`]. The pure
//!   decisions take `now` as an argument; this lets the code around them be driven too.
//! - **NTP-safe.** Production reads the system's wall clock afresh on every call and never
//!   derives it from the monotonic clock, so a step of the system clock shows at once (in the
//!   next Lease renewal, the next status).

use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// The monotonic instant every deadline and duration in the crate is measured in.
pub(crate) use tokio::time::Instant;

/// The monotonic clock: tokio's, so a paused test clock governs it.
pub(crate) fn instant() -> Instant {
    Instant::now()
}

/// The wall clock: the system's, read afresh each time (a unit test's own, once it set one).
pub(crate) fn now() -> SystemTime {
    #[cfg(test)]
    if let Some(at) = test_wall() {
        return at;
    }
    SystemTime::now()
}

/// The wall clock as the Kubernetes API's timestamp type.
pub(crate) fn timestamp() -> jiff::Timestamp {
    // As `jiff::Timestamp::now` does: a system clock outside jiff's range (years -9999 to 9999)
    // is not a state the agent can work in.
    jiff::Timestamp::try_from(now()).expect("the system clock is within jiff's range")
}

/// The wall clock as a Kubernetes `Time` (a field such as `deletionTimestamp`).
pub(crate) fn time() -> Time {
    Time(timestamp())
}

#[cfg(test)]
thread_local! {
    /// A test's wall clock: the time it was set to, and tokio's instant when it was set.
    static TEST_WALL: std::cell::Cell<Option<(SystemTime, Instant)>> =
        const { std::cell::Cell::new(None) };
}

#[cfg(test)]
fn test_wall() -> Option<SystemTime> {
    TEST_WALL
        .get()
        .map(|(at, since)| at + instant().duration_since(since))
}

/// Sets this thread's wall clock to `at` from now on, for a unit test: [`now`] then reads `at`
/// plus however far tokio's clock has moved since (under `tokio::time::pause()`, exactly what
/// the test advances it by). Setting it again steps it, as NTP would. Only code on this thread
/// sees it: a `#[tokio::test]` on the current-thread runtime (the default), not blocking
/// threads.
#[cfg(test)]
pub(crate) fn set_wall(at: impl Into<SystemTime>) {
    TEST_WALL.set(Some((at.into(), instant())));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn without_a_test_clock_the_wall_clock_is_the_systems() {
        let before = SystemTime::now();
        let read = now();
        assert!(before <= read && read <= SystemTime::now());
    }

    #[tokio::test(start_paused = true)]
    async fn a_test_wall_clock_moves_with_the_paused_clock_and_can_be_stepped() {
        let at: jiff::Timestamp = "2026-01-02T03:04:05Z".parse().unwrap();
        set_wall(at);
        assert_eq!(timestamp(), at);
        tokio::time::advance(Duration::from_secs(90)).await;
        assert_eq!(timestamp(), at + jiff::SignedDuration::from_secs(90));
        assert_eq!(time(), Time(at + jiff::SignedDuration::from_secs(90)));
        // A step back, as NTP may make: the next read shows it.
        set_wall(at - jiff::SignedDuration::from_secs(3600));
        assert_eq!(timestamp(), at - jiff::SignedDuration::from_secs(3600));
    }

    #[test]
    fn the_test_wall_clock_is_the_setting_threads_own() {
        set_wall(SystemTime::UNIX_EPOCH);
        assert!(now() < SystemTime::UNIX_EPOCH + Duration::from_secs(60));
        let other = std::thread::spawn(now).join().unwrap();
        assert!(other > SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000));
    }
}
