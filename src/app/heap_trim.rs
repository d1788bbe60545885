//! Gives the kernel back the memory the allocator holds but no longer uses.
//!
//! glibc's malloc keeps the pages of freed chunks unless they sit at the very top of an arena,
//! and a tokio runtime spreads its allocations over one arena per thread. After a burst (110
//! pods started at once: gRPC buffers, pod specs parsed, statuses built) the agent keeps
//! about 8 MiB of such free pages for good, more than half of its anonymous memory at rest.
//! `malloc_trim(0)` returns every free page of every arena; it takes a few milliseconds at
//! most, so the agent calls it once a minute (upstream's kubelet leaves this to Go's
//! scavenger). On a libc other than glibc this does nothing.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::base::clock;

/// How often free memory is handed back.
pub(crate) const TRIM_PERIOD: Duration = Duration::from_secs(60);

/// Returns the allocator's free pages to the kernel; true when any were returned.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) fn release_free_memory() -> bool {
    // SAFETY: malloc_trim takes no pointer and has no precondition: it locks each arena
    // itself and may be called from any thread at any time.
    unsafe { libc::malloc_trim(0) == 1 }
}

/// Returns the allocator's free pages to the kernel; true when any were returned.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn release_free_memory() -> bool {
    false
}

/// Hands free memory back every [`TRIM_PERIOD`] (on a blocking thread: a trim walks every
/// arena under its lock) until cancelled.
pub(crate) async fn run(cancel: CancellationToken) {
    let mut tick = tokio::time::interval_at(clock::instant() + TRIM_PERIOD, TRIM_PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tick.tick() => {}
        }
        let began = clock::instant();
        match tokio::task::spawn_blocking(release_free_memory).await {
            Ok(released) => tracing::trace!(
                released,
                elapsed_ms = began.elapsed().as_secs_f64() * 1000.0,
                "handed free memory back to the kernel"
            ),
            Err(err) => tracing::debug!(error = %err, "the memory trim did not run"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freed_memory_goes_back_to_the_kernel() {
        // Many small blocks on this thread's arena, all freed but the last, which pins the
        // top of the heap so that free() alone cannot shrink it.
        let mut blocks: Vec<Vec<u8>> = (0..20_000).map(|i| vec![i as u8; 1000]).collect();
        let pin = vec![1u8; 1000];
        let before = anon_kib();
        blocks.truncate(0);
        blocks.shrink_to_fit();
        let freed = anon_kib();
        assert!(release_free_memory(), "nothing was released");
        let after = anon_kib();
        assert!(
            after + 8 * 1024 < freed,
            "anonymous RSS before {before} KiB, after free {freed} KiB, after trim {after} KiB"
        );
        drop(pin);
    }

    fn anon_kib() -> u64 {
        std::fs::read_to_string("/proc/self/status")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("RssAnon:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap()
    }
}
