//! The runtime going away and coming back (containerd restarted or upgraded).
//!
//! While the runtime does not answer, the PLEG asks it again on a short fixed period instead of
//! waiting out the relist period or a growing back-off: a `Version` call every [`DOWN_POLL`]
//! (on a closed or missing socket it fails at once, so this costs next to nothing), and the
//! moment one is answered the relist runs (and with it `/healthz` turns ok) and the event stream
//! is subscribed to again. Upstream's kubelet never fails `/healthz` for a runtime outage; Deckhand
//! does, so it must notice the return as soon as the socket accepts again.

use std::time::Duration;

use crate::clients::cri::RuntimeService;

/// How often a runtime that does not answer is asked again.
pub(crate) const DOWN_POLL: Duration = Duration::from_millis(10);

/// Resolves once the runtime answers a `Version` call, asked every [`DOWN_POLL`] (the first
/// time one period from now, so a runtime that answers `Version` but fails the relist is not
/// asked in a tight loop).
pub(crate) async fn until_answering<R: RuntimeService>(rt: &R) {
    loop {
        tokio::time::sleep(DOWN_POLL).await;
        if rt.version().await.is_ok() {
            return;
        }
    }
}

/// Resolves when the runtime, which does not answer now, answers again; never while it does
/// answer (a subscription that fails against a runtime that is up keeps its back-off).
pub(crate) async fn back_after_outage<R: RuntimeService>(rt: &R) {
    if rt.version().await.is_ok() {
        std::future::pending::<()>().await;
    }
    until_answering(rt).await;
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
    use super::{DOWN_POLL, back_after_outage, until_answering};
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

    fn runtime_ok(health: &Health) -> bool {
        let report = health.report().render(true);
        report.contains("[+]runtime ok") && report.contains("[+]pleg ok")
    }

    /// containerd stopped for 2 s and started again: the relist that turns `/healthz` ok and
    /// the new subscription follow within two polls of the return, not on the relist period
    /// (1 s) or the subscription back-off (250 ms doubling); one relist is enough.
    #[tokio::test(start_paused = true)]
    async fn the_runtime_is_picked_up_again_within_two_polls_of_its_return() {
        let (rt, _, _) = crate::kubelet::runtime::inspect::test_support::one_pod("node-a").await;
        let feed = OwnFeed {
            rt: rt.clone(),
            senders: Arc::default(),
        };
        let (health, state, cancel) = (
            Health::default(),
            PlegState::default(),
            CancellationToken::new(),
        );
        tokio::spawn(run(
            rt.clone(),
            Some(feed.clone()),
            DetailCache::default(),
            RuntimeCache::default(),
            Pokes::default(),
            health.clone(),
            state.clone(),
            PlegConfig {
                node_name: "node-a".into(),
                ..Default::default()
            },
            cancel.clone(),
        ));
        until("events and a relist", || {
            state.events_live() && runtime_ok(&health)
        })
        .await;
        tokio::time::sleep(Duration::from_secs(3)).await;

        // containerd stops: its streams end, the relist fails, `/healthz` says so.
        rt.set_down(true);
        feed.break_all();
        until("the outage on /healthz", || !runtime_ok(&health)).await;
        assert!(!state.events_live());
        tokio::time::sleep(Duration::from_millis(2_000)).await;

        rt.set_down(false);
        let back = Instant::now();
        let relists = rt.count("ListPodSandbox");
        until("/healthz ok again", || runtime_ok(&health)).await;
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
        until_answering(&rt).await;
        assert_eq!(t0.elapsed(), DOWN_POLL, "asked once, one poll from now");
        let waited = tokio::time::timeout(Duration::from_secs(60), back_after_outage(&rt)).await;
        assert!(waited.is_err(), "a runtime that answers is no outage");
        rt.set_down(true);
        let t0 = Instant::now();
        let returned = tokio::spawn({
            let rt = rt.clone();
            async move { back_after_outage(&rt).await }
        });
        tokio::time::sleep(Duration::from_millis(95)).await;
        rt.set_down(false);
        returned.await.unwrap();
        assert_eq!(t0.elapsed(), Duration::from_millis(100));
        assert_eq!(rt.count("Version"), 1 + 1 + 1 + 10, "one call per poll");
    }
}
