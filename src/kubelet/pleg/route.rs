//! The PLEG's pure decisions: what an event from the runtime asks for, how often to relist in
//! each mode, and how long to wait before subscribing again. No I/O and no clock of their own,
//! so each is a table test.

use std::time::Duration;

use super::feed::{FeedSource, Happening, RuntimeEvent};

/// Where the PLEG learns of changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Only by relisting, every `PlegConfig::period` (no event stream, or it broke).
    Relist,
    /// From an event stream, with a relist every `PlegConfig::events_period` as a check.
    Events(FeedSource),
}

impl Mode {
    /// The mode's name on `/healthz` and `/metrics`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Relist => "relist",
            Mode::Events(_) => "events",
        }
    }
}

/// What one event asks of the PLEG.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    /// Tell this pod's worker to look again now.
    Poke(String),
    /// An object the PLEG does not know changed in a way that matters: relist soon to find
    /// whose it is (it may be ours, created a moment ago).
    RelistSoon,
    /// Nothing to do.
    Ignore,
}

/// The pod an event is about, if it is one this agent runs: the pod the runtime cache or a
/// worker's own call ties the object to, else the pod UID the event carries (CRI
/// `GetContainerEvents` names it) when `is_ours` knows that pod. A UID the event names but
/// this agent does not run (another agent's pod on a shared containerd) is not an owner:
/// poking it would wake nobody and leave it in the PLEG's stale set for good.
pub(crate) fn event_owner(
    known: Option<String>,
    event_pod_uid: Option<&str>,
    is_ours: impl Fn(&str) -> bool,
) -> Option<String> {
    known.or_else(|| event_pod_uid.filter(|uid| is_ours(uid)).map(str::to_string))
}

/// Decides what an event asks for. `owner` is the pod the object belongs to as far as this
/// agent knows ([`event_owner`]); `foreign` says an earlier relist showed the object is not this node's;
/// `exit_awaited` says its exit was heard but its worker has not seen it in the runtime's view
/// yet.
///
/// Only what a worker cannot see coming is routed: an exit (crash, OOM kill, an init
/// container's end, a sandbox's pause process dying) and a removal done by someone else.
/// Creations and starts are the worker's own doing (the CRI calls that make them answer only
/// once they happened, and the worker observes right after), so poking it again would cost
/// a second observation per start for nothing. A task's deletion follows its exit (containerd's
/// CRI plugin deletes the task of every process that exits, and only then shows the container
/// as exited): it matters only when the worker is still waiting for the view to show the exit.
pub(crate) fn route(
    event: &RuntimeEvent,
    owner: Option<&str>,
    foreign: bool,
    exit_awaited: bool,
) -> Route {
    let matters = match event.happening {
        Happening::Exited | Happening::OomKilled | Happening::Removed => true,
        Happening::Deleted => exit_awaited && owner.is_some(),
        Happening::Created | Happening::Started => false,
    };
    if !matters {
        return Route::Ignore;
    }
    match (owner, foreign) {
        (Some(uid), _) => Route::Poke(uid.to_string()),
        (None, true) => Route::Ignore,
        // An OOM kill is always followed by the exit, which does the finding.
        (None, false) if event.happening == Happening::OomKilled => Route::Ignore,
        (None, false) => Route::RelistSoon,
    }
}

/// How long after one relist the next is due in `mode`. `period` is the relist-only period
/// (1 s, upstream's), `events_period` the check while events flow.
pub(crate) fn relist_period(mode: Mode, period: Duration, events_period: Duration) -> Duration {
    match mode {
        Mode::Relist => period,
        Mode::Events(_) => events_period.max(period),
    }
}

/// The shortest gap between two relists that unknown objects asked for: a burst of exits of
/// objects the PLEG does not know (another agent's pods on a shared containerd) costs at most
/// this many relists a second.
pub(crate) const RELIST_SOON_GAP: Duration = Duration::from_millis(250);

/// The first wait before subscribing again after a stream broke or a subscription failed.
pub(crate) const RESUBSCRIBE_FIRST: Duration = Duration::from_millis(250);
/// The longest wait between subscription attempts while the runtime is down.
pub(crate) const RESUBSCRIBE_MAX: Duration = Duration::from_secs(30);
/// How long a runtime that offers no event service at all is left alone before asking again
/// (it may have been upgraded in place).
pub(crate) const UNSUPPORTED_RETRY: Duration = Duration::from_secs(300);
/// A stream that lasted this long was healthy: the next break starts the back-off afresh.
pub(crate) const STABLE_STREAM: Duration = Duration::from_secs(60);

/// The wait before the next subscription attempt, after `failures` failed attempts in a row
/// (0 after a stream that was healthy for a while): a quarter second, doubling, at most 30 s.
pub(crate) fn resubscribe_delay(failures: u32, unsupported: bool) -> Duration {
    if unsupported {
        return UNSUPPORTED_RETRY;
    }
    let factor = 1u32 << failures.min(8);
    (RESUBSCRIBE_FIRST * factor).min(RESUBSCRIBE_MAX)
}

/// The count of failures in a row after a stream that lived `lived` ended.
pub(crate) fn failures_after_break(failures: u32, lived: Duration) -> u32 {
    if lived >= STABLE_STREAM {
        0
    } else {
        failures.saturating_add(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(happening: Happening, pod_uid: Option<&str>) -> RuntimeEvent {
        RuntimeEvent {
            id: "c1".into(),
            happening,
            pod_uid: pod_uid.map(String::from),
            exit: None,
        }
    }

    /// Only a pod this agent runs is an owner; the event's UID of another agent's pod is not.
    #[test]
    fn event_owner_table() {
        let ours = |uid: &str| uid == "mine";
        // (case, the owner known, the event's pod UID, the owner wanted)
        type Row = (
            &'static str,
            Option<&'static str>,
            Option<&'static str>,
            Option<&'static str>,
        );
        let rows: Vec<Row> = vec![
            (
                "the cache or a worker knows the object",
                Some("u1"),
                None,
                Some("u1"),
            ),
            (
                "what is known wins over the event",
                Some("u1"),
                Some("mine"),
                Some("u1"),
            ),
            (
                "the event names a pod this agent runs",
                None,
                Some("mine"),
                Some("mine"),
            ),
            (
                "the event names another agent's pod",
                None,
                Some("theirs"),
                None,
            ),
            ("nothing names the pod", None, None, None),
        ];
        for (name, known, event_uid, want) in rows {
            let got = event_owner(known.map(String::from), event_uid, ours);
            assert_eq!(got.as_deref(), want, "{name}");
        }
    }

    #[test]
    fn route_table() {
        use Happening::*;
        let poke = |u: &str| Route::Poke(u.into());
        let rows: Vec<(&str, RuntimeEvent, Option<&str>, bool, Route)> = vec![
            (
                "a deletion after an exit the worker has not seen yet",
                ev(Deleted, None),
                Some("u1"),
                false,
                poke("u1"),
            ),
            (
                "a known exit",
                ev(Exited, None),
                Some("u1"),
                false,
                poke("u1"),
            ),
            (
                "a known OOM kill",
                ev(OomKilled, None),
                Some("u1"),
                false,
                poke("u1"),
            ),
            (
                "a known removal",
                ev(Removed, None),
                Some("u1"),
                false,
                poke("u1"),
            ),
            (
                "a start is the worker's doing",
                ev(Started, None),
                Some("u1"),
                false,
                Route::Ignore,
            ),
            (
                "so is a creation",
                ev(Created, None),
                Some("u1"),
                false,
                Route::Ignore,
            ),
            (
                "a task deletion follows its exit",
                ev(Deleted, None),
                Some("u1"),
                false,
                Route::Ignore,
            ),
            (
                "an unknown exit",
                ev(Exited, None),
                None,
                false,
                Route::RelistSoon,
            ),
            (
                "an unknown removal",
                ev(Removed, None),
                None,
                false,
                Route::RelistSoon,
            ),
            (
                "an unknown OOM kill waits for its exit",
                ev(OomKilled, None),
                None,
                false,
                Route::Ignore,
            ),
            (
                "an unknown start",
                ev(Started, None),
                None,
                false,
                Route::Ignore,
            ),
            (
                "a foreign exit",
                ev(Exited, None),
                None,
                true,
                Route::Ignore,
            ),
        ];
        for (name, event, owner, foreign, want) in rows {
            let awaited = name.starts_with("a deletion after");
            assert_eq!(route(&event, owner, foreign, awaited), want, "{name}");
        }
    }

    #[test]
    fn relist_period_by_mode() {
        let s = Duration::from_secs;
        let rows = [
            (Mode::Relist, s(1), s(300), s(1)),
            (Mode::Events(FeedSource::Containerd), s(1), s(300), s(300)),
            (Mode::Events(FeedSource::Cri), s(1), s(300), s(300)),
            // The events period is never shorter than the relist-only one.
            (Mode::Events(FeedSource::Containerd), s(600), s(300), s(600)),
            (Mode::Relist, s(60), s(300), s(60)),
        ];
        for (mode, period, events_period, want) in rows {
            assert_eq!(relist_period(mode, period, events_period), want, "{mode:?}");
        }
    }

    #[test]
    fn resubscribe_backs_off_and_resets_after_a_stable_stream() {
        let ms: Vec<u128> = (0..10)
            .map(|f| resubscribe_delay(f, false).as_millis())
            .collect();
        assert_eq!(
            ms,
            [250, 500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
        );
        assert_eq!(resubscribe_delay(0, true), UNSUPPORTED_RETRY);
        assert_eq!(failures_after_break(3, Duration::from_secs(1)), 4);
        assert_eq!(failures_after_break(3, STABLE_STREAM), 0);
        assert_eq!(failures_after_break(u32::MAX, Duration::ZERO), u32::MAX);
    }
}
