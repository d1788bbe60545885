//! Where the PLEG hears of container changes as they happen, instead of at the next relist.
//!
//! Two sources on the runtime's own socket; which one is tried first depends on the runtime
//! ([`preference`], from CRI `Version`'s runtime name):
//! - containerd's event service (`containerd.services.events.v1.Events/Subscribe`), which every
//!   containerd has: task start, exit, OOM and delete, container create and delete, and on 1.7
//!   the sandbox events, filtered to CRI's namespace `k8s.io`. In 1.6 a pod sandbox is a
//!   container whose ID is the sandbox's, so its pause process starting and exiting arrive as
//!   task events under the sandbox ID. Preferred on any containerd: it reports an exit as the
//!   shim does, while containerd 2 sends CRI's stop event only after it has deleted the task
//!   and updated its own record (≈130 ms later at the median here, issue 28).
//! - CRI `GetContainerEvents` (containerd 1.7 and later, CRI-O): the events upstream's evented
//!   PLEG reads, and the first choice on every other runtime. containerd 1.6 answers
//!   `Unimplemented`.
//!
//! Decoding is pure ([`from_envelope`], [`from_cri`]); the I/O is behind [`EventFeed`], whose
//! real implementation is [`RuntimeFeed`].

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::Stream;
use prost::Message;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use crate::clients::cri::CriClient;
use crate::clients::cri::proto::{self, ContainerEventType};
use crate::clients::cri::pull_progress::CRI_NAMESPACE;

/// Types generated from `proto/containerd/services/events/v1/events.proto`.
#[allow(clippy::all, missing_docs, unreachable_pub)]
pub(crate) mod events_proto {
    tonic::include_proto!("containerd.services.events.v1");
}

/// Types generated from `proto/containerd/events/events.proto`.
#[allow(clippy::all, missing_docs, unreachable_pub)]
pub(crate) mod payload_proto {
    tonic::include_proto!("containerd.events");
}

/// What happened to a runtime object, as far as the PLEG cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Happening {
    /// A container (or sandbox) was created.
    Created,
    /// Its process started.
    Started,
    /// Its main process exited.
    Exited,
    /// The OOM killer hit it (its exit follows).
    OomKilled,
    /// Its task was deleted (after an exit).
    Deleted,
    /// The container itself was removed.
    Removed,
}

/// One event, naming the object (container or sandbox ID).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeEvent {
    pub id: String,
    pub happening: Happening,
    /// The pod's UID when the event itself says (CRI events carry the sandbox's status).
    pub pod_uid: Option<String>,
    /// For an exit: the code and time the event carries, which are what the runtime's own view
    /// will show once it catches up (containerd records them from this very event). A worker
    /// acts on them at once instead of waiting for that.
    pub exit: Option<ExitFacts>,
}

/// How a process ended, as the exit event tells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExitFacts {
    pub code: i32,
    /// Nanoseconds since the epoch; 0 when the event gave no time.
    pub at_ns: i64,
}

fn timestamp_ns(t: Option<&prost_types::Timestamp>) -> i64 {
    t.map(|t| {
        t.seconds
            .saturating_mul(1_000_000_000)
            .saturating_add(i64::from(t.nanos))
    })
    .unwrap_or(0)
}

/// containerd keeps an exit status as an unsigned number and CRI reports it as a signed one.
fn exit_code(status: u32) -> i32 {
    status as i32
}

/// Which stream the events come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FeedSource {
    /// CRI `GetContainerEvents`.
    Cri,
    /// containerd's event service.
    Containerd,
}

impl FeedSource {
    pub fn as_str(self) -> &'static str {
        match self {
            FeedSource::Cri => "cri",
            FeedSource::Containerd => "containerd",
        }
    }
}

/// Why there is no event stream (the PLEG relists meanwhile).
#[derive(Debug, thiserror::Error)]
pub enum FeedError {
    /// Neither CRI events nor containerd's event service exist on this runtime.
    #[error("the runtime offers neither CRI container events nor containerd's event service")]
    Unsupported,
    #[error("cannot subscribe to {what}: {status}")]
    Subscribe {
        what: &'static str,
        status: Box<tonic::Status>,
    },
    #[error("the {what} stream broke: {status}")]
    Broken {
        what: &'static str,
        status: Box<tonic::Status>,
    },
    #[error("the {what} stream ended")]
    Ended { what: &'static str },
}

/// Events as they arrive; an `Err` item (or the end) means the stream is gone.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<RuntimeEvent, FeedError>> + Send>>;

/// A source of runtime events.
pub trait EventFeed: Clone + Send + Sync + 'static {
    /// Subscribes; answers once the subscription stands (or failed).
    fn subscribe(
        &self,
    ) -> impl Future<Output = Result<(FeedSource, EventStream), FeedError>> + Send;

    /// Whether the PLEG follows this feed on a thread of its own (see `pleg::run`).
    fn own_thread(&self) -> bool {
        false
    }
}

/// The topics Deckhand subscribes to on containerd's event service.
pub const TOPICS: [&str; 9] = [
    "/tasks/start",
    "/tasks/exit",
    "/tasks/oom",
    "/tasks/delete",
    "/containers/create",
    "/containers/delete",
    "/sandboxes/create",
    "/sandboxes/start",
    "/sandboxes/exit",
];

/// containerd's filters for [`TOPICS`] in CRI's namespace (any one filter passes an event).
pub fn subscribe_filters() -> Vec<String> {
    TOPICS
        .iter()
        .map(|t| format!("namespace=={CRI_NAMESPACE:?},topic=={t:?}"))
        .collect()
}

/// The last part of a type URL: `containerd.events.TaskExit` → `TaskExit`.
fn type_name(type_url: &str) -> &str {
    type_url.rsplit(['/', '.']).next().unwrap_or(type_url)
}

fn decode<M: Message + Default>(any: &prost_types::Any, name: &str) -> Option<M> {
    if type_name(&any.type_url) != name {
        tracing::debug!(type_url = %any.type_url, want = name, "an event of an unexpected type");
        return None;
    }
    M::decode(any.value.as_slice()).ok()
}

/// Reads one containerd envelope; `None` for what the PLEG does not follow (another namespace,
/// an exec process, an unknown topic, a payload that does not decode).
pub fn from_envelope(env: &events_proto::Envelope) -> Option<RuntimeEvent> {
    use payload_proto::*;
    if env.namespace != CRI_NAMESPACE {
        return None;
    }
    let any = env.event.as_ref()?;
    // An exec process (a probe's, `kubectl exec`) has its own process ID; the container's own
    // process has the container's ID or none.
    let own = |container: &str, process: &str| process.is_empty() || process == container;
    let mut exit = None;
    let (id, happening) = match env.topic.as_str() {
        "/tasks/start" => (
            decode::<TaskStart>(any, "TaskStart")?.container_id,
            Happening::Started,
        ),
        "/tasks/exit" => {
            let e = decode::<TaskExit>(any, "TaskExit")?;
            if !own(&e.container_id, &e.id) {
                return None;
            }
            exit = Some(ExitFacts {
                code: exit_code(e.exit_status),
                at_ns: timestamp_ns(e.exited_at.as_ref()),
            });
            (e.container_id, Happening::Exited)
        }
        "/tasks/oom" => (
            decode::<TaskOom>(any, "TaskOOM")?.container_id,
            Happening::OomKilled,
        ),
        "/tasks/delete" => {
            let e = decode::<TaskDelete>(any, "TaskDelete")?;
            if !own(&e.container_id, &e.id) {
                return None;
            }
            (e.container_id, Happening::Deleted)
        }
        "/containers/create" => (
            decode::<ContainerCreate>(any, "ContainerCreate")?.id,
            Happening::Created,
        ),
        "/containers/delete" => (
            decode::<ContainerDelete>(any, "ContainerDelete")?.id,
            Happening::Removed,
        ),
        "/sandboxes/create" => (
            decode::<SandboxCreate>(any, "SandboxCreate")?.sandbox_id,
            Happening::Created,
        ),
        "/sandboxes/start" => (
            decode::<SandboxStart>(any, "SandboxStart")?.sandbox_id,
            Happening::Started,
        ),
        "/sandboxes/exit" => {
            let e = decode::<SandboxExit>(any, "SandboxExit")?;
            exit = Some(ExitFacts {
                code: exit_code(e.exit_status),
                at_ns: timestamp_ns(e.exited_at.as_ref()),
            });
            (e.sandbox_id, Happening::Exited)
        }
        _ => return None,
    };
    (!id.is_empty()).then_some(RuntimeEvent {
        id,
        happening,
        pod_uid: None,
        exit,
    })
}

/// Reads one CRI container event.
pub fn from_cri(event: &proto::ContainerEventResponse) -> Option<RuntimeEvent> {
    if event.container_id.is_empty() {
        return None;
    }
    let happening = match ContainerEventType::try_from(event.container_event_type).ok()? {
        ContainerEventType::ContainerCreatedEvent => Happening::Created,
        ContainerEventType::ContainerStartedEvent => Happening::Started,
        ContainerEventType::ContainerStoppedEvent => Happening::Exited,
        ContainerEventType::ContainerDeletedEvent => Happening::Removed,
    };
    let pod_uid = event
        .pod_sandbox_status
        .as_ref()
        .and_then(|s| s.metadata.as_ref())
        .map(|m| m.uid.clone())
        .filter(|u| !u.is_empty());
    // A stop event carries the container's status as the runtime recorded it.
    let exit = (happening == Happening::Exited)
        .then(|| {
            event
                .containers_statuses
                .iter()
                .find(|s| s.id == event.container_id && s.finished_at > 0)
        })
        .flatten()
        .map(|s| ExitFacts {
            code: s.exit_code,
            at_ns: s.finished_at,
        });
    Some(RuntimeEvent {
        id: event.container_id.clone(),
        happening,
        pod_uid,
        exit,
    })
}

/// A server stream sends no response headers until its first message, so a subscription that
/// has not failed within this long is taken as standing (a refused or unreachable one fails
/// at once). Events that arrive meanwhile are kept.
const SUBSCRIBE_GRACE: Duration = Duration::from_millis(500);
/// Events held while the PLEG is busy; beyond it the stream waits (containerd queues).
const BUFFER: usize = 1024;

/// The runtime's own event streams on its CRI socket.
#[derive(Clone)]
pub struct RuntimeFeed {
    connection: Connection,
    /// The runtime answered `Unimplemented` to CRI events (perhaps only after the grace, on a
    /// busy node): later subscriptions go to containerd's event service at once.
    cri_unimplemented: Arc<AtomicBool>,
}

/// The connection the streams use.
#[derive(Clone)]
enum Connection {
    /// Given, and followed on the caller's runtime.
    Given(Channel),
    /// The feed's own to the client's endpoint, made on first use (on the PLEG's event thread).
    Own {
        cri: Box<CriClient>,
        made: Arc<OnceLock<Channel>>,
    },
}

impl RuntimeFeed {
    /// Streams over `channel`, followed on the caller's runtime.
    pub fn new(channel: Channel) -> Self {
        RuntimeFeed {
            connection: Connection::Given(channel),
            cri_unimplemented: Arc::default(),
        }
    }

    /// Streams over a connection of the feed's own to `cri`'s endpoint, followed by the PLEG on
    /// a thread of its own: the connection is made there, on first use, so that reading an
    /// event never waits for the agent's busy worker threads (nor for other calls' frames on
    /// the shared connection).
    pub fn on_own_thread(cri: &CriClient) -> Self {
        RuntimeFeed {
            connection: Connection::Own {
                cri: Box::new(cri.clone()),
                made: Arc::default(),
            },
            cri_unimplemented: Arc::default(),
        }
    }

    fn channel(&self) -> Channel {
        match &self.connection {
            Connection::Given(channel) => channel.clone(),
            Connection::Own { cri, made } => made
                .get_or_init(|| {
                    cri.new_connection().unwrap_or_else(|err| {
                        tracing::warn!(error = %err, "cannot open a connection for the runtime's events; sharing the agent's");
                        cri.channel()
                    })
                })
                .clone(),
        }
    }
}

/// The order to try the sources in, from the runtime's name in CRI `Version` (`None` when that
/// call failed: CRI first, as before the runtime was known). containerd names itself
/// `containerd` in every version.
pub(crate) fn preference(runtime_name: Option<&str>) -> [FeedSource; 2] {
    match runtime_name {
        Some("containerd") => [FeedSource::Containerd, FeedSource::Cri],
        _ => [FeedSource::Cri, FeedSource::Containerd],
    }
}

const CRI: &str = "CRI container events";
const CONTAINERD: &str = "containerd's event service";

impl RuntimeFeed {
    /// The runtime's name, asked again at each subscription (a restarted endpoint may be
    /// another runtime); `None` if it does not answer in time.
    async fn runtime_name(&self) -> Option<String> {
        let mut cri = proto::runtime_service_client::RuntimeServiceClient::new(self.channel());
        let call = cri.version(proto::VersionRequest {
            version: "v1".into(),
        });
        match tokio::time::timeout(SUBSCRIBE_GRACE * 4, call).await {
            Ok(Ok(v)) => Some(v.into_inner().runtime_name),
            Ok(Err(status)) => {
                tracing::debug!(%status, "CRI Version failed; trying CRI events first");
                None
            }
            Err(_) => None,
        }
    }

    /// CRI `GetContainerEvents`; `Ok(None)` when the runtime does not implement it.
    async fn subscribe_cri(&self) -> Result<Option<EventStream>, FeedError> {
        if self.cri_unimplemented.load(Ordering::Relaxed) {
            return Ok(None);
        }
        let mut cri = proto::runtime_service_client::RuntimeServiceClient::new(self.channel());
        let call = async move { cri.get_container_events(proto::GetEventsRequest {}).await };
        let flag = Some(self.cri_unimplemented.clone());
        match open(
            CRI,
            call,
            |m: proto::ContainerEventResponse| from_cri(&m),
            flag,
        )
        .await
        {
            Ok(stream) => Ok(Some(stream)),
            Err(status) if status.code() == tonic::Code::Unimplemented => {
                self.cri_unimplemented.store(true, Ordering::Relaxed);
                Ok(None)
            }
            Err(status) => Err(FeedError::Subscribe {
                what: CRI,
                status: Box::new(status),
            }),
        }
    }

    /// containerd's event service; `Ok(None)` when the runtime has none.
    async fn subscribe_containerd(&self) -> Result<Option<EventStream>, FeedError> {
        let mut events = events_proto::events_client::EventsClient::new(self.channel());
        let request = events_proto::SubscribeRequest {
            filters: subscribe_filters(),
        };
        let call = async move { events.subscribe(request).await };
        let decode = |m: events_proto::Envelope| from_envelope(&m);
        match open(CONTAINERD, call, decode, None).await {
            Ok(stream) => Ok(Some(stream)),
            Err(status) if status.code() == tonic::Code::Unimplemented => Ok(None),
            Err(status) => Err(FeedError::Subscribe {
                what: CONTAINERD,
                status: Box::new(status),
            }),
        }
    }
}

impl EventFeed for RuntimeFeed {
    async fn subscribe(&self) -> Result<(FeedSource, EventStream), FeedError> {
        let name = self.runtime_name().await;
        for source in preference(name.as_deref()) {
            let stream = match source {
                FeedSource::Cri => self.subscribe_cri().await?,
                FeedSource::Containerd => self.subscribe_containerd().await?,
            };
            if let Some(stream) = stream {
                return Ok((source, stream));
            }
        }
        Err(FeedError::Unsupported)
    }

    fn own_thread(&self) -> bool {
        matches!(self.connection, Connection::Own { .. })
    }
}

/// Starts a server-streaming call in a task of its own that decodes and forwards its messages,
/// and answers once the call failed or [`SUBSCRIBE_GRACE`] passed without failing. The task
/// ends when the returned stream is dropped. A late `Unimplemented` sets `unimplemented`.
async fn open<M, F>(
    what: &'static str,
    call: F,
    decode: fn(M) -> Option<RuntimeEvent>,
    unimplemented: Option<Arc<AtomicBool>>,
) -> Result<EventStream, tonic::Status>
where
    M: Send + 'static,
    F: Future<Output = Result<tonic::Response<tonic::Streaming<M>>, tonic::Status>>
        + Send
        + 'static,
{
    let (tx, rx) = mpsc::channel(BUFFER);
    let (ready_tx, ready_rx) = oneshot::channel();
    tokio::spawn(async move {
        let answer = tokio::select! {
            _ = tx.closed() => return,
            answer = call => answer,
        };
        let mut stream = match answer {
            Ok(response) => {
                let _ = ready_tx.send(Ok(()));
                response.into_inner()
            }
            Err(status) => {
                if status.code() == tonic::Code::Unimplemented
                    && let Some(flag) = &unimplemented
                {
                    flag.store(true, Ordering::Relaxed);
                }
                let _ = ready_tx.send(Err(status));
                return;
            }
        };
        loop {
            let message = tokio::select! {
                _ = tx.closed() => return,
                m = stream.message() => m,
            };
            let item = match message {
                Ok(Some(m)) => match decode(m) {
                    Some(event) => Ok(event),
                    None => continue,
                },
                Ok(None) => Err(FeedError::Ended { what }),
                Err(status) => Err(FeedError::Broken {
                    what,
                    status: Box::new(status),
                }),
            };
            let last = item.is_err();
            if tx.send(item).await.is_err() || last {
                return;
            }
        }
    });
    match tokio::time::timeout(SUBSCRIBE_GRACE, ready_rx).await {
        Ok(Ok(Err(status))) => Err(status),
        _ => Ok(Box::pin(ReceiverStream::new(rx))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use payload_proto::*;

    fn envelope(topic: &str, type_url: &str, value: Vec<u8>) -> events_proto::Envelope {
        events_proto::Envelope {
            timestamp: None,
            namespace: CRI_NAMESPACE.into(),
            topic: topic.into(),
            event: Some(prost_types::Any {
                type_url: type_url.into(),
                value,
            }),
        }
    }

    fn exit(container: &str, process: &str) -> Vec<u8> {
        TaskExit {
            container_id: container.into(),
            id: process.into(),
            pid: 7,
            exit_status: 1,
            exited_at: None,
        }
        .encode_to_vec()
    }

    #[test]
    fn envelopes_decode_by_topic() {
        let got = |e: events_proto::Envelope| from_envelope(&e).map(|e| (e.id, e.happening));
        let some = |id: &str, h| Some((id.to_string(), h));
        type Row = (
            &'static str,
            events_proto::Envelope,
            Option<(String, Happening)>,
        );
        let rows: Vec<Row> = vec![
            (
                "the container's own exit",
                envelope(
                    "/tasks/exit",
                    "containerd.events.TaskExit",
                    exit("c1", "c1"),
                ),
                some("c1", Happening::Exited),
            ),
            (
                "an exit without a process ID",
                envelope("/tasks/exit", "containerd.events.TaskExit", exit("c1", "")),
                some("c1", Happening::Exited),
            ),
            (
                "an exec process's exit",
                envelope(
                    "/tasks/exit",
                    "containerd.events.TaskExit",
                    exit("c1", "probe-1"),
                ),
                None,
            ),
            (
                "a start",
                envelope(
                    "/tasks/start",
                    "containerd.events.TaskStart",
                    TaskStart {
                        container_id: "s1".into(),
                        pid: 3,
                    }
                    .encode_to_vec(),
                ),
                some("s1", Happening::Started),
            ),
            (
                "an OOM kill",
                envelope(
                    "/tasks/oom",
                    "types.containerd.io/containerd.events.TaskOOM",
                    TaskOom {
                        container_id: "c2".into(),
                    }
                    .encode_to_vec(),
                ),
                some("c2", Happening::OomKilled),
            ),
            (
                "a removal",
                envelope(
                    "/containers/delete",
                    "containerd.events.ContainerDelete",
                    ContainerDelete { id: "c3".into() }.encode_to_vec(),
                ),
                some("c3", Happening::Removed),
            ),
            (
                "a 1.7 sandbox exit",
                envelope(
                    "/sandboxes/exit",
                    "containerd.events.SandboxExit",
                    SandboxExit {
                        sandbox_id: "s2".into(),
                        exit_status: 0,
                        exited_at: None,
                    }
                    .encode_to_vec(),
                ),
                some("s2", Happening::Exited),
            ),
            (
                "a payload of another type",
                envelope(
                    "/tasks/exit",
                    "containerd.events.TaskStart",
                    exit("c1", "c1"),
                ),
                None,
            ),
            (
                "garbage",
                envelope(
                    "/tasks/exit",
                    "containerd.events.TaskExit",
                    vec![0xff, 0xff],
                ),
                None,
            ),
            (
                "an unknown topic",
                envelope("/images/create", "containerd.events.ImageCreate", vec![]),
                None,
            ),
        ];
        for (name, env, want) in rows {
            assert_eq!(got(env), want, "{name}");
        }
        let mut other = envelope(
            "/tasks/exit",
            "containerd.events.TaskExit",
            exit("c1", "c1"),
        );
        other.namespace = "moby".into();
        assert_eq!(from_envelope(&other), None, "another namespace");
        other.namespace = CRI_NAMESPACE.into();
        other.event = None;
        assert_eq!(from_envelope(&other), None, "no payload");
    }

    #[test]
    fn exits_carry_their_code_and_time() {
        let env = envelope(
            "/tasks/exit",
            "containerd.events.TaskExit",
            TaskExit {
                container_id: "c1".into(),
                id: "c1".into(),
                pid: 7,
                exit_status: 137,
                exited_at: Some(prost_types::Timestamp {
                    seconds: 1_700_000_000,
                    nanos: 5,
                }),
            }
            .encode_to_vec(),
        );
        assert_eq!(
            from_envelope(&env).and_then(|e| e.exit),
            Some(ExitFacts {
                code: 137,
                at_ns: 1_700_000_000_000_000_005,
            })
        );
        // No time told: 0, and the worker uses its own clock.
        let untimed = envelope(
            "/tasks/exit",
            "containerd.events.TaskExit",
            exit("c1", "c1"),
        );
        assert_eq!(
            from_envelope(&untimed).and_then(|e| e.exit),
            Some(ExitFacts { code: 1, at_ns: 0 })
        );
        // A start carries none.
        let start = envelope(
            "/tasks/start",
            "containerd.events.TaskStart",
            TaskStart {
                container_id: "c1".into(),
                pid: 3,
            }
            .encode_to_vec(),
        );
        assert_eq!(from_envelope(&start).and_then(|e| e.exit), None);
        // A CRI stop event carries the container's status.
        let stopped = proto::ContainerEventResponse {
            container_id: "c1".into(),
            container_event_type: ContainerEventType::ContainerStoppedEvent as i32,
            created_at: 1,
            pod_sandbox_status: None,
            containers_statuses: vec![proto::ContainerStatus {
                id: "c1".into(),
                exit_code: 2,
                finished_at: 99,
                ..Default::default()
            }],
        };
        assert_eq!(
            from_cri(&stopped).and_then(|e| e.exit),
            Some(ExitFacts { code: 2, at_ns: 99 })
        );
    }

    #[test]
    fn cri_events_carry_the_pod() {
        let event = proto::ContainerEventResponse {
            container_id: "c1".into(),
            container_event_type: ContainerEventType::ContainerStoppedEvent as i32,
            created_at: 1,
            pod_sandbox_status: Some(proto::PodSandboxStatus {
                metadata: Some(proto::PodSandboxMetadata {
                    uid: "u1".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            containers_statuses: vec![],
        };
        assert_eq!(
            from_cri(&event),
            Some(RuntimeEvent {
                id: "c1".into(),
                happening: Happening::Exited,
                pod_uid: Some("u1".into()),
                exit: None,
            })
        );
        let unknown_type = proto::ContainerEventResponse {
            container_event_type: 99,
            ..event.clone()
        };
        assert_eq!(from_cri(&unknown_type), None);
    }

    #[test]
    fn containerd_prefers_its_own_event_service() {
        use FeedSource::{Containerd, Cri};
        let rows: [(Option<&str>, [FeedSource; 2]); 5] = [
            // Any containerd (1.6 has no CRI events; 2.x sends them late).
            (Some("containerd"), [Containerd, Cri]),
            (Some("cri-o"), [Cri, Containerd]),
            (Some("fake"), [Cri, Containerd]),
            (Some(""), [Cri, Containerd]),
            // Version failed: the order from before the runtime was known.
            (None, [Cri, Containerd]),
        ];
        for (name, want) in rows {
            assert_eq!(preference(name), want, "{name:?}");
        }
    }

    #[test]
    fn filters_name_the_namespace_and_each_topic() {
        let f = subscribe_filters();
        assert_eq!(f.len(), TOPICS.len());
        assert_eq!(f[1], r#"namespace=="k8s.io",topic=="/tasks/exit""#);
    }
}
