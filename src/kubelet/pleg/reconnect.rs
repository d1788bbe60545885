//! The runtime going away and coming back (containerd restarted or upgraded).
//!
//! While the runtime does not answer, the PLEG asks it again on a short fixed period instead of
//! waiting out the relist period or a growing back-off: a `Version` call every [`DOWN_POLL`]
//! (on a closed or missing socket it fails at once, so this costs next to nothing), and the
//! moment one is answered the relist runs (and with it the Node's Ready condition and
//! `/healthz?verbose`'s `runtime` line turn back) and the event stream is subscribed to again, so
//! pods are seen, probed and synced again as soon as the runtime answers.
//!
//! The socket's directory is watched too ([`SocketSignal`]): containerd binds its socket a few
//! tens of milliseconds before its CRI plugin answers (it recovers its containers first), so
//! the moment the socket is made the PLEG asks at once and then every [`FRESH_POLL`] for
//! [`FRESH_WINDOW`], and picks the runtime up within a couple of milliseconds of its first
//! answer instead of up to one [`DOWN_POLL`] later.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use inotify::{EventMask, Inotify, WatchMask};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::base::clock;
use crate::clients::cri::RuntimeService;

/// How often a runtime that does not answer is asked again.
pub(crate) const DOWN_POLL: Duration = Duration::from_millis(10);

/// How often it is asked right after its socket was made again.
pub(crate) const FRESH_POLL: Duration = Duration::from_millis(2);

/// How long after its socket was made the runtime is asked every [`FRESH_POLL`]: longer than
/// containerd takes from binding its socket to answering CRI calls (about 30 ms on a loaded
/// node), short enough that a socket made by something that never answers costs little.
pub(crate) const FRESH_WINDOW: Duration = Duration::from_secs(1);

/// When the runtime's socket was last made (created or moved into place), as heard from inotify
/// on its directory. Cheap to clone; the default one never hears anything (no socket path, the
/// fake runtime of tests), and then only [`DOWN_POLL`] applies.
#[derive(Clone)]
pub(crate) struct SocketSignal {
    made: Arc<watch::Sender<Option<Instant>>>,
}

impl Default for SocketSignal {
    fn default() -> Self {
        SocketSignal {
            made: Arc::new(watch::Sender::new(None)),
        }
    }
}

impl std::fmt::Debug for SocketSignal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SocketSignal")
            .field("made", &*self.made.borrow())
            .finish()
    }
}

impl SocketSignal {
    /// Watches the directory holding `socket` until `cancel`; without inotify or the
    /// directory, the signal stays silent (the polls still find the runtime, only later).
    pub(crate) fn watching(socket: &Path, cancel: CancellationToken) -> SocketSignal {
        let signal = SocketSignal::default();
        let (Some(dir), Some(name)) = (socket.parent(), socket.file_name()) else {
            return signal;
        };
        let stream = Inotify::init().and_then(|inotify| {
            inotify.watches().add(
                dir,
                WatchMask::CREATE | WatchMask::MOVED_TO | WatchMask::ONLYDIR,
            )?;
            inotify.into_event_stream(vec![0u8; 1024])
        });
        let mut stream = match stream {
            Ok(stream) => stream,
            Err(e) => {
                tracing::debug!(dir = %dir.display(), error = %e, "cannot watch the runtime's socket directory; polling only");
                return signal;
            }
        };
        let (name, sender) = (name.to_os_string(), signal.clone());
        tokio::spawn(async move {
            loop {
                let event = tokio::select! {
                    _ = cancel.cancelled() => return,
                    event = stream.next() => event,
                };
                match event {
                    Some(Ok(event)) => {
                        if event.mask.contains(EventMask::Q_OVERFLOW)
                            || event.name.as_deref() == Some(name.as_os_str())
                        {
                            sender.made();
                        }
                    }
                    Some(Err(e)) => {
                        tracing::debug!(error = %e, "watching the runtime's socket failed; polling only");
                        return;
                    }
                    None => return,
                }
            }
        });
        signal
    }

    /// The socket was made just now.
    pub(crate) fn made(&self) {
        self.made.send_replace(Some(clock::instant()));
    }

    fn subscribe(&self) -> watch::Receiver<Option<Instant>> {
        self.made.subscribe()
    }
}

/// How long to wait before asking a runtime that does not answer again: [`FRESH_POLL`] within
/// [`FRESH_WINDOW`] of its socket being made, [`DOWN_POLL`] otherwise.
pub(crate) fn poll_period(made: Option<Instant>, now: Instant) -> Duration {
    match made {
        Some(at) if now.saturating_duration_since(at) < FRESH_WINDOW => FRESH_POLL,
        _ => DOWN_POLL,
    }
}

/// Resolves once the runtime answers a `Version` call, asked every [`poll_period`] (the first
/// time one period from now, so a runtime that answers `Version` but fails the relist is not
/// asked in a tight loop) and at once when its socket is made again.
pub(crate) async fn until_answering<R: RuntimeService>(rt: &R, socket: &SocketSignal) {
    let mut made = socket.subscribe();
    loop {
        let wait = poll_period(*made.borrow_and_update(), clock::instant());
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            Ok(()) = made.changed() => {}
        }
        if rt.version().await.is_ok() {
            return;
        }
    }
}

/// Resolves when the runtime, which does not answer now, answers again; never while it does
/// answer (a subscription that fails against a runtime that is up keeps its back-off).
pub(crate) async fn back_after_outage<R: RuntimeService>(rt: &R, socket: &SocketSignal) {
    if rt.version().await.is_ok() {
        std::future::pending::<()>().await;
    }
    until_answering(rt, socket).await;
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tokio::sync::mpsc;
    use tokio::time::Instant;
    use tokio_stream::wrappers::ReceiverStream;
    use tokio_util::sync::CancellationToken;

    use super::super::feed::{EventFeed, EventStream, FeedError, FeedSource, RuntimeEvent};
    use super::super::*;
    use super::{
        DOWN_POLL, FRESH_POLL, FRESH_WINDOW, SocketSignal, back_after_outage, poll_period,
        until_answering,
    };
    use crate::clients::cri::fake::FakeCri;

    type Senders = Arc<Mutex<Vec<mpsc::Sender<Result<RuntimeEvent, FeedError>>>>>;

    /// containerd's event service on the fake runtime: no subscription while it is down, and
    /// [`OwnFeed::break_all`] ends the streams that stand (what a stopping containerd does).
    #[derive(Clone)]
    struct OwnFeed {
        rt: FakeCri,
        senders: Senders,
    }

    impl OwnFeed {
        fn break_all(&self) {
            self.senders.lock().unwrap().clear();
        }
    }

    impl EventFeed for OwnFeed {
        async fn subscribe(&self) -> Result<(FeedSource, EventStream), FeedError> {
            self.rt
                .version()
                .await
                .map_err(|_| FeedError::Ended { what: "fake" })?;
            let (tx, rx) = mpsc::channel(4);
            self.senders.lock().unwrap().push(tx);
            let stream: EventStream = Box::pin(ReceiverStream::new(rx));
            Ok((FeedSource::Containerd, stream))
        }
    }

    async fn until(what: &str, mut check: impl FnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while !check() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// The runtime line without an outage note: the relist after the return has run.
    fn runtime_ok(health: &Health) -> bool {
        let report = health.report().render(true);
        report.contains("[+]runtime ok\n") && report.contains("[+]pleg ok")
    }

    /// containerd stopped for 2 s and started again: the relist that turns `/healthz` ok and
    /// the new subscription follow within two polls of the return, not on the relist period
    /// (1 s) or the subscription back-off (250 ms doubling); one relist is enough.
    #[tokio::test(start_paused = true)]
    async fn the_runtime_is_picked_up_again_within_two_polls_of_its_return() {
        let up = Up::start(SocketSignal::default()).await;
        let Up {
            rt,
            health,
            state,
            cancel,
            ..
        } = &up;
        tokio::time::sleep(Duration::from_secs(3)).await;

        // containerd stops: its streams end, the relist fails, `/healthz?verbose` names the
        // outage and `/healthz` stays ok (it is about the agent, as upstream's is).
        up.stop_runtime().await;
        assert!(!state.events_live());
        let report = health.report();
        let verbose = report.render(true);
        assert!(report.healthy(), "{verbose}");
        assert!(
            verbose.contains("[+]runtime ok: the container runtime is not answering"),
            "{verbose}"
        );
        tokio::time::sleep(Duration::from_millis(2_000)).await;

        rt.set_down(false);
        let back = Instant::now();
        let relists = rt.count("ListPodSandbox");
        until("/healthz ok again", || runtime_ok(health)).await;
        let healthy = back.elapsed();
        until("the event stream again", || state.events_live()).await;
        let subscribed = back.elapsed();
        assert!(
            healthy <= DOWN_POLL * 2,
            "/healthz ok {healthy:?} after the runtime came back (poll {DOWN_POLL:?})"
        );
        assert!(
            subscribed <= DOWN_POLL * 2,
            "subscribed again {subscribed:?} after the runtime came back"
        );
        assert_eq!(
            rt.count("ListPodSandbox"),
            relists + 1,
            "one relist picked the runtime up again"
        );
        cancel.cancel();
    }

    /// A runtime that answers `Version` but whose relist keeps failing is asked again every
    /// poll, never in a tight loop; one that answers throughout is left to the caller's timer.
    #[tokio::test(start_paused = true)]
    async fn the_polls_keep_their_period_and_an_answering_runtime_is_left_alone() {
        let rt = FakeCri::default();
        let t0 = Instant::now();
        until_answering(&rt, &SocketSignal::default()).await;
        assert_eq!(t0.elapsed(), DOWN_POLL, "asked once, one poll from now");
        let waited = tokio::time::timeout(
            Duration::from_secs(60),
            back_after_outage(&rt, &SocketSignal::default()),
        )
        .await;
        assert!(waited.is_err(), "a runtime that answers is no outage");
        rt.set_down(true);
        let t0 = Instant::now();
        let returned = tokio::spawn({
            let rt = rt.clone();
            async move { back_after_outage(&rt, &SocketSignal::default()).await }
        });
        tokio::time::sleep(Duration::from_millis(95)).await;
        rt.set_down(false);
        returned.await.unwrap();
        assert_eq!(t0.elapsed(), Duration::from_millis(100));
        assert_eq!(rt.count("Version"), 1 + 1 + 1 + 10, "one call per poll");
    }

    /// The PLEG running on a one-pod fake runtime.
    struct Up {
        rt: FakeCri,
        feed: OwnFeed,
        health: Health,
        state: PlegState,
        cancel: CancellationToken,
    }

    impl Up {
        /// Starts the PLEG with `socket` and waits for it to relist and follow events.
        async fn start(socket: SocketSignal) -> Up {
            let (rt, _, _) =
                crate::kubelet::runtime::inspect::test_support::one_pod("node-a").await;
            let up = Up {
                feed: OwnFeed {
                    rt: rt.clone(),
                    senders: Arc::default(),
                },
                rt,
                health: Health::default(),
                state: PlegState::default(),
                cancel: CancellationToken::new(),
            };
            tokio::spawn(run(
                up.rt.clone(),
                Some(up.feed.clone()),
                DetailCache::default(),
                RuntimeCache::default(),
                Pokes::default(),
                up.health.clone(),
                up.state.clone(),
                PlegConfig {
                    node_name: "node-a".into(),
                    runtime_socket: socket,
                    ..Default::default()
                },
                up.cancel.clone(),
            ));
            until("events and a relist", || {
                up.state.events_live() && runtime_ok(&up.health)
            })
            .await;
            up
        }

        /// Stops the runtime as containerd stops (its event streams end too) and waits for
        /// `/healthz?verbose` to say so.
        async fn stop_runtime(&self) {
            self.rt.set_down(true);
            self.feed.break_all();
            until("the outage on /healthz", || !runtime_ok(&self.health)).await;
        }
    }

    /// containerd makes its socket again when it starts, and its CRI plugin answers a moment
    /// later: the socket being made wakes the PLEG at once (a runtime that answers then is
    /// picked up in the same instant, not on the next 10 ms poll), and it then asks every
    /// `FRESH_POLL`, so a runtime that answers 1 ms after its socket was made is picked up
    /// within one such poll. The outages start 3 ms off the 10 ms grid of the polls, so
    /// polling alone would take 6-7 ms in both cases.
    #[tokio::test(start_paused = true)]
    async fn the_socket_being_made_again_is_heard_at_once() {
        let socket = SocketSignal::default();
        let up = Up::start(socket.clone()).await;
        let Up {
            rt, health, cancel, ..
        } = &up;
        up.stop_runtime().await;
        tokio::time::sleep(Duration::from_millis(2_003)).await;
        socket.made();
        rt.set_down(false);
        let back = Instant::now();
        until("/healthz ok again", || runtime_ok(health)).await;
        assert!(
            back.elapsed() <= Duration::from_millis(1),
            "/healthz ok {:?} after the socket was made by a runtime that answers",
            back.elapsed()
        );

        // A stopping containerd ends the event streams too; with one still standing, the
        // PLEG would relist only on its long evented period and miss the outage.
        up.stop_runtime().await;
        tokio::time::sleep(Duration::from_millis(2_003)).await;
        socket.made();
        tokio::time::sleep(Duration::from_millis(1)).await;
        rt.set_down(false);
        let answering = Instant::now();
        until("/healthz ok again", || runtime_ok(health)).await;
        assert!(
            answering.elapsed() <= FRESH_POLL,
            "/healthz ok {:?} after the runtime answered, its socket made 1 ms before",
            answering.elapsed()
        );
        cancel.cancel();
    }

    /// The poll period: fast only within the window after the socket was made.
    #[test]
    fn the_poll_period_follows_the_socket() {
        let now = Instant::now();
        let table = [
            (None, DOWN_POLL),
            (Some(now), FRESH_POLL),
            (Some(now - FRESH_WINDOW / 2), FRESH_POLL),
            (Some(now - FRESH_WINDOW), DOWN_POLL),
            (Some(now - FRESH_WINDOW * 10), DOWN_POLL),
        ];
        for (made, want) in table {
            assert_eq!(poll_period(made, now), want, "socket made {made:?}");
        }
    }
}
