//! The node's watches of the API server (its pods, its Node, the configMaps and secrets its
//! pods refer to) on kube's watcher, which lists, then watches from the list's resourceVersion
//! with bookmarks, resumes a broken stream from the newest version it saw, and lists again
//! after a 410 Gone (an `Init` … `InitDone` run of events, as the first list).
//!
//! [`Watch`] adds what the node wants around it: after a failure the watcher waits as the
//! node's other API tasks do ([`Backoff`]: from `first_retry`, doubling, to 7 s, where kube's
//! default grows to 30 s), every failure goes to a [`ProblemLog`] (each distinct problem
//! logged once, the recovery once), and a stop never waits for a list or a watch request in
//! flight (dropping the stream drops the request).
//!
//! The wait is ours, not kube's `StreamBackoff` (nor `.default_backoff()`, which is one):
//! that waits after every error, a 410 Gone too, which the watcher answers by listing again.
//! After an outage the first watch request to the API server that came back is the one that
//! gets a 410 (its watch cache starts after our version), so kube's back-off would hold the
//! relist, and every pod created meanwhile, for the longest wait (7 s here, 30 s by default).

use std::time::Duration;

use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt, TryStreamExt};
use kube::api::Api;
use tokio_util::sync::CancellationToken;

pub(crate) use kube::runtime::watcher::{Config, Event};

use super::retry::{Backoff, pause};
use super::{Problem, ProblemKind, ProblemLog};

/// How long one watch request lasts before the API server ends it (and the watcher starts the
/// next from the newest version): at rest, one request every five minutes per watch.
pub(crate) const WATCH_SECONDS: u32 = 290;

/// A watcher's events, its failures described.
pub(crate) type Events<K> = BoxStream<'static, Result<Event<K>, Problem>>;

/// kube's watcher of `api` with `config` (its watch requests last [`WATCH_SECONDS`]). `api`
/// must be on the client made for watching, whose read time-out outlasts a watch request.
pub(crate) fn events<K>(api: Api<K>, config: Config) -> Events<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    kube::runtime::watcher(api, config.timeout(WATCH_SECONDS))
        .map_err(Problem::from)
        .boxed()
}

/// A watcher's events, paced after failures and with its failures reported.
pub(crate) struct Watch<K> {
    events: Events<K>,
    backoff: Backoff,
    /// The wait before the watcher is polled again, after a failure.
    wait: Option<Duration>,
    /// What the log says is failing, e.g. "watching the node's pods".
    doing: String,
    problems: ProblemLog,
}

impl<K> Watch<K> {
    /// `events` from [`events`] (or a test's stream); after a failure the next try waits
    /// `first_retry`, doubling to 7 s, until an event arrives.
    pub(crate) fn new(
        events: Events<K>,
        first_retry: Duration,
        doing: impl Into<String>,
        problems: ProblemLog,
    ) -> Self {
        Watch {
            events,
            backoff: Backoff::new(first_retry),
            wait: None,
            doing: doing.into(),
            problems,
        }
    }

    /// The next event, or the failure that the watcher retries after the back-off (reported to
    /// the problem log, except a 410 Gone: the watcher lists again at once, as it should). None
    /// once `cancel` fires (without waiting for the back-off or the request in flight), or if
    /// the stream ends (kube's watcher never does).
    pub(crate) async fn next(
        &mut self,
        cancel: &CancellationToken,
    ) -> Option<Result<Event<K>, Problem>> {
        if let Some(wait) = self.wait.take()
            && !pause(wait, cancel).await
        {
            return None;
        }
        let item = tokio::select! {
            _ = cancel.cancelled() => return None,
            item = self.events.next() => item?,
        };
        Some(self.note(item))
    }

    /// The next events that arrived together, at least one (failures in between are reported
    /// and left out), so a burst is applied at once. None once `cancel` fires.
    pub(crate) async fn next_batch(&mut self, cancel: &CancellationToken) -> Option<Vec<Event<K>>> {
        let mut batch = Vec::new();
        while batch.is_empty() {
            if let Ok(event) = self.next(cancel).await? {
                batch.push(event);
            }
            while self.wait.is_none()
                && let Some(Some(item)) = self.events.next().now_or_never()
            {
                if let Ok(event) = self.note(item) {
                    batch.push(event);
                }
            }
        }
        Some(batch)
    }

    fn note(&mut self, item: Result<Event<K>, Problem>) -> Result<Event<K>, Problem> {
        match &item {
            Ok(_) => {
                self.backoff.reset();
                self.problems.succeeded(&self.doing);
            }
            Err(p) if p.is(ProblemKind::Expired) => {
                tracing::info!(problem = %p.message, "{}: the version expired; listing again", self.doing);
            }
            Err(p) => {
                self.problems.failed(&self.doing, p);
                self.wait = Some(self.backoff.next_wait());
            }
        }
        item
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;

    fn cm(name: &str) -> ConfigMap {
        let mut c = ConfigMap::default();
        c.metadata.name = Some(name.into());
        c
    }

    fn problem(kind: ProblemKind, message: &str) -> Problem {
        Problem {
            kind,
            message: message.into(),
        }
    }

    fn names(batch: &[Event<ConfigMap>]) -> Vec<String> {
        batch
            .iter()
            .map(|e| match e {
                Event::Apply(o) | Event::InitApply(o) | Event::Delete(o) => {
                    o.metadata.name.clone().unwrap()
                }
                Event::Init => "Init".into(),
                Event::InitDone => "InitDone".into(),
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn failures_are_reported_once_paced_and_left_out_of_batches() {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let log = ProblemLog::default();
        let mut watch = Watch::new(
            rx.boxed(),
            Duration::from_millis(100),
            "watching things",
            log.clone(),
        );
        let cancel = CancellationToken::new();
        let refused = problem(ProblemKind::Unreachable, "connection refused");
        tx.unbounded_send(Err(refused.clone())).unwrap();
        tx.unbounded_send(Err(problem(ProblemKind::Unreachable, "reset")))
            .unwrap();
        for e in [Event::Init, Event::InitApply(cm("a")), Event::InitDone] {
            tx.unbounded_send(Ok(e)).unwrap();
        }
        let started = tokio::time::Instant::now();
        let batch = watch.next_batch(&cancel).await.unwrap();
        assert_eq!(names(&batch), ["Init", "a", "InitDone"]);
        // Two failures: two waits of the back-off (100 ms, then 200 ms) before the events.
        assert_eq!(started.elapsed(), Duration::from_millis(300));
        assert_eq!(log.current(), None, "the events said it works again");

        tx.unbounded_send(Err(refused.clone())).unwrap();
        assert_eq!(watch.next(&cancel).await.unwrap().unwrap_err(), refused);
        assert_eq!(log.current().as_deref(), Some("connection refused"));
        // A 410 is no problem to report, and no reason to wait: the watcher lists again.
        tx.unbounded_send(Err(problem(ProblemKind::Expired, "gone")))
            .unwrap();
        tx.unbounded_send(Ok(Event::Init)).unwrap();
        tx.unbounded_send(Ok(Event::InitDone)).unwrap();
        let started = tokio::time::Instant::now();
        let batch = watch.next_batch(&cancel).await.unwrap();
        assert_eq!(names(&batch), ["Init", "InitDone"]);
        assert_eq!(
            started.elapsed(),
            Duration::from_millis(100),
            "only the wait after the failure before the 410"
        );
        assert_eq!(log.current(), None);
    }

    #[tokio::test]
    async fn a_stop_does_not_wait_for_the_next_event() {
        let (_tx, rx) = futures::channel::mpsc::unbounded::<Result<Event<ConfigMap>, Problem>>();
        let mut watch = Watch::new(
            rx.boxed(),
            Duration::from_millis(100),
            "watching things",
            ProblemLog::default(),
        );
        let cancel = CancellationToken::new();
        cancel.cancel();
        assert!(watch.next_batch(&cancel).await.is_none());
    }
}
