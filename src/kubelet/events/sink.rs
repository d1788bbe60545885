//! Writing events to the API server: one task takes events from the recorder's queue, asks the
//! correlator what to write, and writes it through [`EventSink`] ([`KubeEventSink`]; its unit
//! tests run it against the fake API server, `clients::apiserver::fake`).
//!
//! As upstream: an answer that refuses an event (invalid, forbidden, the namespace is going)
//! drops it, since the same request would be refused again; no answer at all (the API server
//! is down) is retried, up to 12 tries, holding the events behind it in the queue. An update
//! of an event the server no longer has creates it again.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::EventStats;
use super::correlate::{Correlated, Correlator};
use crate::clients::apiserver::retry::{Backoff, pause};
use crate::clients::apiserver::{Problem, ProblemKind, ProblemLog};

/// Tries per event before it is given up (upstream's number).
pub(crate) const MAX_TRIES: u32 = 12;
/// The first wait after a failed try; it doubles up to the API back-off's cap (7 s).
pub(crate) const FIRST_RETRY: Duration = Duration::from_secs(1);

/// The two calls events need.
pub(crate) trait EventSink: Send + Sync + 'static {
    fn create(&self, event: &Event) -> impl Future<Output = Result<Event, Problem>> + Send;
    /// Sets `count`, `lastTimestamp` and `message` of the event named in `event`.
    fn update(&self, event: &Event) -> impl Future<Output = Result<Event, Problem>> + Send;
}

/// [`EventSink`] on a kube client (core/v1 events).
pub(crate) struct KubeEventSink {
    client: kube::Client,
}

impl KubeEventSink {
    pub(crate) fn new(client: kube::Client) -> Self {
        KubeEventSink { client }
    }

    fn api(&self, event: &Event) -> Api<Event> {
        let ns = event.metadata.namespace.as_deref().unwrap_or("default");
        Api::namespaced(self.client.clone(), ns)
    }
}

impl EventSink for KubeEventSink {
    async fn create(&self, event: &Event) -> Result<Event, Problem> {
        let mut event = event.clone();
        event.metadata.resource_version = None;
        Ok(self
            .api(&event)
            .create(&PostParams::default(), &event)
            .await?)
    }

    async fn update(&self, event: &Event) -> Result<Event, Problem> {
        let name = event.metadata.name.clone().unwrap_or_default();
        let patch = serde_json::json!({
            "count": event.count,
            "lastTimestamp": event.last_timestamp,
            "message": event.message,
        });
        Ok(self
            .api(event)
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?)
    }
}

/// How one try ended.
#[derive(Debug, PartialEq)]
enum Try {
    Written(Box<Event>),
    /// The server refused it: drop.
    Refused(Problem),
    /// No answer: try again later.
    Again(Problem),
}

/// Runs the writer until `cancel` fires or the recorders are gone. The queue is borrowed, so
/// that a writer started again after a panic takes over the events still queued.
pub(crate) async fn run(
    sink: impl EventSink,
    queue: &mut mpsc::Receiver<Event>,
    stats: Arc<EventStats>,
    cancel: CancellationToken,
) {
    let mut correlator = Correlator::default();
    let problems = ProblemLog::default();
    loop {
        let event = tokio::select! {
            _ = cancel.cancelled() => return,
            e = queue.recv() => match e {
                Some(e) => e,
                None => return,
            },
        };
        let decided = correlator.correlate(event);
        let (mut event, update) = match decided {
            Correlated::Skip => {
                stats.throttled.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            Correlated::Create(e) => (e, false),
            Correlated::Update(e) => (e, true),
        };
        let mut backoff = Backoff::new(FIRST_RETRY);
        let mut tries = 0;
        loop {
            tries += 1;
            match write_once(&sink, &mut correlator, &mut event, update).await {
                Try::Written(written) => {
                    correlator.written(&written);
                    stats.written.fetch_add(1, Ordering::Relaxed);
                    problems.succeeded("writing events");
                    break;
                }
                Try::Refused(problem) => {
                    stats.failed.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(reason = ?event.reason, error = %problem, "the API server refused an event; dropped");
                    break;
                }
                Try::Again(problem) => {
                    problems.failed("writing events", &problem);
                    if tries >= MAX_TRIES {
                        stats.failed.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(reason = ?event.reason, message = ?event.message, "an event could not be written after {MAX_TRIES} tries; dropped");
                        break;
                    }
                    if !pause(backoff.next_wait(), &cancel).await {
                        return;
                    }
                }
            }
        }
    }
}

async fn write_once(
    sink: &impl EventSink,
    correlator: &mut Correlator,
    event: &mut Event,
    update: bool,
) -> Try {
    let result = if update {
        match sink.update(event).await {
            Err(p) if p.is(ProblemKind::NotFound) => {
                // The server dropped it (events expire after an hour): create it anew.
                correlator.forget(event);
                sink.create(event).await
            }
            other => other,
        }
    } else {
        sink.create(event).await
    };
    match result {
        Ok(written) => Try::Written(Box::new(written)),
        Err(p) if p.is(ProblemKind::Unreachable) => Try::Again(p),
        Err(p) => Try::Refused(p),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clients::apiserver::fake::{FakeApiServer, Rule, Verb};
    use crate::kubelet::events::{EventType, Recorder, node_ref};

    /// The event writes that reached the API server, in order: the verb and the `count` sent.
    fn calls(fake: &FakeApiServer) -> Vec<(&'static str, Option<i64>)> {
        fake.requests()
            .iter()
            .filter(|r| r.gvr.resource == "events")
            .map(|r| {
                let count = r.body.as_ref().and_then(|b| b["count"].as_i64());
                (r.verb.as_str(), count)
            })
            .collect()
    }

    /// Records `events` repeats of one event and runs the real sink on `fake` until each is
    /// written or given up.
    async fn feed(fake: &FakeApiServer, events: usize) -> Recorder {
        let sink = KubeEventSink::new(fake.client());
        let (recorder, rx) = Recorder::to_api("n1");
        for _ in 0..events {
            recorder.record(
                node_ref("n1", None),
                EventType::Normal,
                "Starting",
                "Starting kubelet.",
            );
        }
        let cancel = CancellationToken::new();
        let (stats2, cancel2, mut rx) = (recorder.stats(), cancel.clone(), rx);
        let task = tokio::spawn(async move { run(sink, &mut rx, stats2, cancel2).await });
        let stats = recorder.stats();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
        while stats.written.load(Ordering::Relaxed) + stats.failed.load(Ordering::Relaxed)
            < events as u64
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        cancel.cancel();
        let _ = task.await;
        recorder
    }

    #[tokio::test(start_paused = true)]
    async fn repeats_update_and_no_answer_is_retried_until_written() {
        let fake = FakeApiServer::new();
        fake.unreachable(Rule::new("patch", "events"), 2);
        let recorder = feed(&fake, 2).await;
        let (create, patch) = (Verb::Create.as_str(), Verb::Patch.as_str());
        assert_eq!(
            calls(&fake),
            vec![
                (create, Some(1)),
                (patch, Some(2)),
                (patch, Some(2)),
                (patch, Some(2)),
            ]
        );
        assert_eq!(recorder.stats().written.load(Ordering::Relaxed), 2);
        let stored = fake.list::<Event>(Some("default"));
        assert_eq!(stored.len(), 1, "{stored:?}");
        assert_eq!(stored[0].count, Some(2));
    }

    #[tokio::test(start_paused = true)]
    async fn a_refusal_drops_the_event_and_a_lost_event_is_created_again() {
        let fake = FakeApiServer::new();
        fake.fail(Rule::new("create", "events"), 403, 1);
        let recorder = feed(&fake, 2).await;
        // The first create is refused (dropped). The repeat is still counted as the second
        // occurrence: its update finds nothing (404), so it is created.
        let (create, patch) = (Verb::Create.as_str(), Verb::Patch.as_str());
        assert_eq!(
            calls(&fake),
            vec![(create, Some(1)), (patch, Some(2)), (create, Some(2))]
        );
        assert_eq!(recorder.stats().failed.load(Ordering::Relaxed), 1);
        assert_eq!(recorder.stats().written.load(Ordering::Relaxed), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_unreachable_server_is_tried_twelve_times_then_given_up() {
        let fake = FakeApiServer::new();
        fake.unreachable(Rule::any(), 20);
        let recorder = feed(&fake, 1).await;
        assert_eq!(calls(&fake).len(), MAX_TRIES as usize);
        assert_eq!(recorder.stats().failed.load(Ordering::Relaxed), 1);
    }
}
