//! Events (core/v1), as upstream's event recorder writes them, so that `kubectl describe` and
//! `kubectl get events` tell an operator what happened to a pod or to the node.
//!
//! Three parts, so that no worker ever waits on the API server for an event:
//! - [`Recorder`]: a cheap, cloneable handle. Recording an event logs it and pushes it into a
//!   bounded queue; a full queue drops the event (counted) rather than block.
//! - [`correlate::Correlator`]: pure. It counts repeats of an identical event (one object on
//!   the server, `count` and `lastTimestamp` patched), folds many similar events into one
//!   ("(combined from similar events): …"), and limits each object to a burst of 25 events
//!   with one more every 5 minutes — upstream's numbers.
//! - [`sink`]: one task owns the correlator and writes to the API server through the
//!   [`sink::EventSink`] trait, retrying what failed for lack of an answer and dropping what
//!   the server refused.
//!
//! Without `--kubeconfig` the recorder only logs.
//!
//! The reasons and message wording are upstream's ([`reason`]), because operators and their
//! tools search for them.

pub(crate) mod correlate;
pub(crate) mod sink;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use tokio::sync::mpsc;

use crate::base::clock;

/// The component named in `source.component` and `reportingComponent`: upstream's, since
/// tools and dashboards filter on it.
pub const COMPONENT: &str = "kubelet";

/// Events waiting for the writer; more are dropped (upstream's broadcaster queue is the same).
pub const QUEUE: usize = 1000;

/// The event reasons Deckhand records, with upstream's spelling.
pub(crate) mod reason {
    pub(crate) const PULLING: &str = "Pulling";
    pub(crate) const PULLED: &str = "Pulled";
    pub(crate) const FAILED: &str = "Failed";
    pub(crate) const FAILED_TO_RETRIEVE_IMAGE_PULL_SECRET: &str = "FailedToRetrieveImagePullSecret";
    pub(crate) const BACK_OFF: &str = "BackOff";
    pub(crate) const ERR_IMAGE_NEVER_PULL: &str = "ErrImageNeverPull";
    pub(crate) const INSPECT_FAILED: &str = "InspectFailed";
    pub(crate) const CREATED: &str = "Created";
    pub(crate) const STARTED: &str = "Started";
    pub(crate) const KILLING: &str = "Killing";
    pub(crate) const EXCEEDED_GRACE_PERIOD: &str = "ExceededGracePeriod";
    pub(crate) const FAILED_POST_START_HOOK: &str = "FailedPostStartHook";
    pub(crate) const FAILED_PRE_STOP_HOOK: &str = "FailedPreStopHook";
    pub(crate) const UNHEALTHY: &str = "Unhealthy";
    pub(crate) const PROBE_WARNING: &str = "ProbeWarning";
    pub(crate) const FAILED_MOUNT: &str = "FailedMount";
    pub(crate) const FILE_SYSTEM_RESIZE_SUCCESSFUL: &str = "FileSystemResizeSuccessful";
    pub(crate) const FILE_SYSTEM_RESIZE_FAILED: &str = "FileSystemResizeFailed";
    pub(crate) const VOLUME_RESIZE_FAILED: &str = "VolumeResizeFailed";
    pub(crate) const INVALID_ENVIRONMENT_VARIABLE_NAMES: &str = "InvalidEnvironmentVariableNames";
    pub(crate) const FAILED_CREATE_POD_SANDBOX: &str = "FailedCreatePodSandBox";
    /// A DRA driver could not prepare the pod's claims (or they are not usable yet).
    pub(crate) const FAILED_PREPARE_DYNAMIC_RESOURCES: &str = "FailedPrepareDynamicResources";
    /// The pod's cgroup could not be made or set.
    pub(crate) const FAILED_TO_CREATE_POD_CONTAINER: &str = "FailedToCreatePodContainer";
    pub(crate) const SANDBOX_CHANGED: &str = "SandboxChanged";
    pub(crate) const STARTING: &str = "Starting";
    pub(crate) const NODE_READY: &str = "NodeReady";
    pub(crate) const NODE_NOT_READY: &str = "NodeNotReady";
}

/// `Normal` or `Warning`, the two types the API accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    Normal,
    Warning,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Normal => "Normal",
            EventType::Warning => "Warning",
        }
    }
}

/// The recorder's counters, shown at `/metrics/events`.
#[derive(Debug, Default)]
pub struct EventStats {
    /// Events dropped because the queue to the writer was full.
    pub dropped: AtomicU64,
    /// Events the spam filter held back (too many about one object).
    pub throttled: AtomicU64,
    /// Events created or patched on the API server.
    pub written: AtomicU64,
    /// Events given up: refused by the API server, or out of retries.
    pub failed: AtomicU64,
}

impl EventStats {
    /// Prometheus text for the counters.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (name, help, counter) in [
            (
                "deckhand_events_dropped_total",
                "Events dropped because the queue to the API server was full.",
                &self.dropped,
            ),
            (
                "deckhand_events_throttled_total",
                "Events not sent: more than 25 about one object, refilled one per 5 minutes.",
                &self.throttled,
            ),
            (
                "deckhand_events_written_total",
                "Events created or updated on the API server.",
                &self.written,
            ),
            (
                "deckhand_events_failed_total",
                "Events the API server refused, or that ran out of retries.",
                &self.failed,
            ),
        ] {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}\n",
                counter.load(Ordering::Relaxed)
            ));
        }
        out
    }
}

/// The handle that components record events through. Cloning is cheap; recording never
/// blocks and never fails (what cannot be queued is counted and logged).
#[derive(Clone)]
pub struct Recorder {
    inner: Arc<RecorderInner>,
}

struct RecorderInner {
    /// `source.host` and `reportingInstance`: the node's name.
    host: String,
    /// `None`: log only (no API server).
    queue: Option<mpsc::Sender<Event>>,
    stats: Arc<EventStats>,
}

impl Recorder {
    /// A recorder that only writes events to the log (standalone, and in unit tests).
    pub fn log_only(host: &str) -> Recorder {
        Recorder {
            inner: Arc::new(RecorderInner {
                host: host.to_string(),
                queue: None,
                stats: Arc::default(),
            }),
        }
    }

    /// A recorder that also queues events for the API server, and the queue's other end.
    pub fn to_api(host: &str) -> (Recorder, mpsc::Receiver<Event>) {
        let (tx, rx) = mpsc::channel(QUEUE);
        let recorder = Recorder {
            inner: Arc::new(RecorderInner {
                host: host.to_string(),
                queue: Some(tx),
                stats: Arc::default(),
            }),
        };
        (recorder, rx)
    }

    pub fn stats(&self) -> Arc<EventStats> {
        self.inner.stats.clone()
    }

    /// Records an event about `object`.
    pub fn record(
        &self,
        object: ObjectReference,
        kind: EventType,
        reason: &str,
        message: impl Into<String>,
    ) {
        let message = message.into();
        let who = match (&object.namespace, &object.name) {
            (Some(ns), Some(name)) => format!("{ns}/{name}"),
            (_, Some(name)) => name.clone(),
            _ => String::new(),
        };
        let kind_of_object = object.kind.as_deref().unwrap_or_default();
        let field = object.field_path.as_deref().unwrap_or_default();
        match kind {
            EventType::Normal => {
                tracing::info!(object = %who, object_kind = kind_of_object, field_path = field, reason, message = %message, "event")
            }
            EventType::Warning => {
                tracing::warn!(object = %who, object_kind = kind_of_object, field_path = field, reason, message = %message, "event")
            }
        }
        let Some(queue) = &self.inner.queue else {
            return;
        };
        let event = new_event(
            object,
            kind,
            reason,
            message,
            &self.inner.host,
            clock::timestamp(),
        );
        if queue.try_send(event).is_err() {
            let before = self.inner.stats.dropped.fetch_add(1, Ordering::Relaxed);
            if before.is_power_of_two() || before == 0 {
                tracing::warn!(
                    dropped = before + 1,
                    "the event queue is full; events are dropped (they are still in this log)"
                );
            }
        }
    }

    /// An event about a pod.
    pub fn pod(&self, pod: &Pod, kind: EventType, reason: &str, message: impl Into<String>) {
        self.record(pod_ref(pod), kind, reason, message);
    }

    /// An event about one of a pod's containers (`involvedObject.fieldPath` names it).
    pub fn container(
        &self,
        pod: &Pod,
        container: &str,
        kind: EventType,
        reason: &str,
        message: impl Into<String>,
    ) {
        self.record(container_ref(pod, container), kind, reason, message);
    }
}

/// The reference to a pod that its events name.
pub fn pod_ref(pod: &Pod) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".to_string()),
        kind: Some("Pod".to_string()),
        namespace: Some(
            pod.metadata
                .namespace
                .clone()
                .unwrap_or_else(|| "default".to_string()),
        ),
        name: pod.metadata.name.clone(),
        uid: pod.metadata.uid.clone(),
        resource_version: pod.metadata.resource_version.clone(),
        field_path: None,
    }
}

/// The reference to one container of a pod: `spec.containers{name}`,
/// `spec.initContainers{name}` or `spec.ephemeralContainers{name}`, as upstream's container
/// references.
pub fn container_ref(pod: &Pod, container: &str) -> ObjectReference {
    let init = pod
        .spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .is_some_and(|list| list.iter().any(|c| c.name == container));
    let list = if init {
        "initContainers"
    } else if crate::base::podspec::ephemeral::is_ephemeral(pod, container) {
        "ephemeralContainers"
    } else {
        "containers"
    };
    ObjectReference {
        field_path: Some(format!("spec.{list}{{{container}}}")),
        ..pod_ref(pod)
    }
}

/// The reference of a PersistentVolumeClaim (events about a volume expansion).
pub fn claim_ref(claim: &k8s_openapi::api::core::v1::PersistentVolumeClaim) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        namespace: claim.metadata.namespace.clone(),
        name: claim.metadata.name.clone(),
        uid: claim.metadata.uid.clone(),
        resource_version: claim.metadata.resource_version.clone(),
        ..Default::default()
    }
}

/// The reference to the node that node events name (upstream gives it the Node's UID once
/// known, and the namespace is empty, so the events land in `default`).
pub fn node_ref(name: &str, uid: Option<&str>) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".to_string()),
        kind: Some("Node".to_string()),
        name: Some(name.to_string()),
        uid: uid.map(str::to_string),
        ..ObjectReference::default()
    }
}

/// A new event, as upstream's recorder makes it: named `<object>.<nanoseconds in hex>`, in
/// the object's namespace (`default` for the node), count 1.
pub fn new_event(
    object: ObjectReference,
    kind: EventType,
    reason: &str,
    message: String,
    host: &str,
    now: Timestamp,
) -> Event {
    let namespace = object
        .namespace
        .clone()
        .filter(|ns| !ns.is_empty())
        .unwrap_or_else(|| "default".to_string());
    let name = event_name(object.name.as_deref().unwrap_or("unknown"), now);
    Event {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace),
            ..ObjectMeta::default()
        },
        involved_object: object,
        reason: Some(reason.to_string()),
        message: Some(message),
        type_: Some(kind.as_str().to_string()),
        count: Some(1),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        source: Some(EventSource {
            component: Some(COMPONENT.to_string()),
            host: Some(host.to_string()),
        }),
        reporting_component: Some(COMPONENT.to_string()),
        reporting_instance: Some(host.to_string()),
        ..Event::default()
    }
}

/// `<object>.<nanoseconds since the epoch, in hex>`.
pub fn event_name(object: &str, now: Timestamp) -> String {
    format!("{object}.{:x}", now.as_nanosecond().max(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec};

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("shop".into()),
                uid: Some("u-1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                init_containers: Some(vec![Container {
                    name: "setup".into(),
                    ..Default::default()
                }]),
                containers: vec![Container {
                    name: "app".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn container_references_name_the_list_the_container_is_in() {
        let p = pod();
        let app = container_ref(&p, "app");
        assert_eq!(app.field_path.as_deref(), Some("spec.containers{app}"));
        assert_eq!(app.uid.as_deref(), Some("u-1"));
        assert_eq!(app.kind.as_deref(), Some("Pod"));
        let init = container_ref(&p, "setup");
        assert_eq!(
            init.field_path.as_deref(),
            Some("spec.initContainers{setup}")
        );
        let mut p = p;
        p.spec.as_mut().unwrap().ephemeral_containers =
            Some(vec![k8s_openapi::api::core::v1::EphemeralContainer {
                name: "debugger".into(),
                ..Default::default()
            }]);
        let debugger = container_ref(&p, "debugger");
        assert_eq!(
            debugger.field_path.as_deref(),
            Some("spec.ephemeralContainers{debugger}")
        );
    }

    #[test]
    fn new_events_are_named_after_their_object_and_node_events_go_to_default() {
        let now: Timestamp = "2026-12-01T10:00:00Z".parse().unwrap();
        let e = new_event(
            node_ref("n1", Some("abc")),
            EventType::Normal,
            reason::STARTING,
            "Starting kubelet.".into(),
            "n1",
            now,
        );
        assert_eq!(e.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(
            e.metadata.name.as_deref(),
            Some(format!("n1.{:x}", now.as_nanosecond()).as_str())
        );
        assert_eq!(e.count, Some(1));
        assert_eq!(e.source.unwrap().component.as_deref(), Some("kubelet"));
        let p = new_event(
            pod_ref(&pod()),
            EventType::Warning,
            reason::FAILED,
            "x".into(),
            "n1",
            now,
        );
        assert_eq!(p.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(p.type_.as_deref(), Some("Warning"));
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_instead_of_blocking() {
        let (recorder, mut rx) = Recorder::to_api("n1");
        for i in 0..QUEUE + 5 {
            recorder.pod(&pod(), EventType::Normal, reason::PULLED, format!("{i}"));
        }
        assert_eq!(recorder.stats().dropped.load(Ordering::Relaxed), 5);
        assert_eq!(rx.recv().await.unwrap().message.as_deref(), Some("0"));
    }
}
