//! Label and annotation keys Deckhand puts on CRI sandboxes and containers, and the parsers
//! that read them back when relisting (PLEG) or adopting what an earlier run left behind.
//!
//! The `io.kubernetes.*` keys are the ones the upstream kubelet uses, so tools such as crictl
//! show our pods the familiar way. Labels are filterable by the runtime; annotations carry the
//! rest. On top of upstream's keys, everything Deckhand creates carries
//! [`MANAGED_LABEL`]`=`[`MANAGED_VALUE`], and housekeeping leaves alone anything without it.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::LifecycleHandler;

use crate::base::podspec::spec_hash::parse_hash;

// ---- labels (sandboxes and containers)

/// Pod name.
pub const POD_NAME_LABEL: &str = "io.kubernetes.pod.name";
/// Pod namespace.
pub const POD_NAMESPACE_LABEL: &str = "io.kubernetes.pod.namespace";
/// Pod UID.
pub const POD_UID_LABEL: &str = "io.kubernetes.pod.uid";
/// Container name (containers only).
pub const CONTAINER_NAME_LABEL: &str = "io.kubernetes.container.name";
/// Deckhand's ownership marker.
pub const MANAGED_LABEL: &str = "deckhand.io/managed";
/// Value of [`MANAGED_LABEL`].
pub const MANAGED_VALUE: &str = "true";
/// The node name of the agent that created the object: agents with different node names can
/// share one runtime (as the tests do) without ever touching each other's pods.
pub const NODE_LABEL: &str = "deckhand.io/node";

// ---- annotations (containers)

/// Hash of the container spec, lowercase hex.
pub const CONTAINER_HASH_ANNOTATION: &str = "io.kubernetes.container.hash";
/// How many times this container had been restarted when this instance was created.
pub const CONTAINER_RESTART_COUNT_ANNOTATION: &str = "io.kubernetes.container.restartCount";
/// Path of the termination message file inside the container.
pub const CONTAINER_TERMINATION_MESSAGE_PATH_ANNOTATION: &str =
    "io.kubernetes.container.terminationMessagePath";
/// `File` or `FallbackToLogsOnError`.
pub const CONTAINER_TERMINATION_MESSAGE_POLICY_ANNOTATION: &str =
    "io.kubernetes.container.terminationMessagePolicy";
/// The preStop hook as JSON, so a container can be stopped properly without its pod spec.
pub const CONTAINER_PRE_STOP_HANDLER_ANNOTATION: &str = "io.kubernetes.container.preStopHandler";
/// The container's ports as a JSON array.
pub const CONTAINER_PORTS_ANNOTATION: &str = "io.kubernetes.container.ports";
/// `init`, `container` or `ephemeral`.
pub const CONTAINER_TYPE_ANNOTATION: &str = "io.kubernetes.container.type";
/// Pod's terminationGracePeriodSeconds.
pub const POD_TERMINATION_GRACE_PERIOD_ANNOTATION: &str =
    "io.kubernetes.pod.terminationGracePeriod";
/// Pod's metadata.deletionGracePeriodSeconds, when set.
pub const POD_DELETION_GRACE_PERIOD_ANNOTATION: &str = "io.kubernetes.pod.deletionGracePeriod";

/// The ID of the exited container whose `RestartAllContainers` rule started the round this
/// container was made for (Deckhand's own: upstream removes the earlier rounds' containers).
pub const RESTART_ROUND_ANNOTATION: &str = "deckhand.io/restart-round";

/// Values of [`CONTAINER_TYPE_ANNOTATION`].
pub const CONTAINER_TYPE_INIT: &str = "init";
pub const CONTAINER_TYPE_REGULAR: &str = "container";
pub const CONTAINER_TYPE_EPHEMERAL: &str = "ephemeral";

/// True when the object carries Deckhand's ownership marker.
pub fn is_managed(labels: &HashMap<String, String>) -> bool {
    labels.get(MANAGED_LABEL).map(String::as_str) == Some(MANAGED_VALUE)
}

fn non_empty<'a>(map: &'a HashMap<String, String>, key: &str) -> Option<&'a str> {
    map.get(key).map(String::as_str).filter(|v| !v.is_empty())
}

/// Which pod a sandbox belongs to, read from its labels.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SandboxIdentity {
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

impl SandboxIdentity {
    /// None unless name, namespace and UID labels are all present and non-empty.
    pub fn from_labels(labels: &HashMap<String, String>) -> Option<SandboxIdentity> {
        Some(SandboxIdentity {
            name: non_empty(labels, POD_NAME_LABEL)?.to_string(),
            namespace: non_empty(labels, POD_NAMESPACE_LABEL)?.to_string(),
            uid: non_empty(labels, POD_UID_LABEL)?.to_string(),
        })
    }

    /// The pod's own labels: the sandbox labels minus the ones Deckhand added.
    pub fn pod_labels(labels: &HashMap<String, String>) -> HashMap<String, String> {
        labels
            .iter()
            .filter(|(k, _)| {
                !matches!(
                    k.as_str(),
                    POD_NAME_LABEL
                        | POD_NAMESPACE_LABEL
                        | POD_UID_LABEL
                        | MANAGED_LABEL
                        | NODE_LABEL
                )
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

/// Which pod and spec container a runtime container belongs to, plus what the annotations
/// recorded when it was created.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerIdentity {
    pub pod_name: String,
    pub pod_namespace: String,
    pub pod_uid: String,
    pub container_name: String,
    /// Spec hash at creation; 0 when the annotation is missing or unreadable.
    pub hash: u64,
    /// Restart count at creation; 0 when missing or unreadable.
    pub restart_count: u32,
    /// `init`, `container`, `ephemeral`; empty when missing.
    pub container_type: String,
    pub termination_message_path: Option<String>,
    pub termination_message_policy: Option<String>,
    pub pod_termination_grace_period: Option<i64>,
    pub pod_deletion_grace_period: Option<i64>,
    /// The preStop hook recorded at creation, when there was one and it parses.
    pub pre_stop_handler: Option<LifecycleHandler>,
}

impl ContainerIdentity {
    /// None unless the pod name/namespace/UID and container name labels are present.
    /// Annotation values that are missing or malformed fall back to defaults, as upstream
    /// does, so an odd annotation never hides a container from the relist.
    pub fn from_labels_annotations(
        labels: &HashMap<String, String>,
        annotations: &HashMap<String, String>,
    ) -> Option<ContainerIdentity> {
        let text = |key: &str| non_empty(annotations, key).map(str::to_string);
        Some(ContainerIdentity {
            pod_name: non_empty(labels, POD_NAME_LABEL)?.to_string(),
            pod_namespace: non_empty(labels, POD_NAMESPACE_LABEL)?.to_string(),
            pod_uid: non_empty(labels, POD_UID_LABEL)?.to_string(),
            container_name: non_empty(labels, CONTAINER_NAME_LABEL)?.to_string(),
            hash: non_empty(annotations, CONTAINER_HASH_ANNOTATION)
                .and_then(parse_hash)
                .unwrap_or(0),
            restart_count: non_empty(annotations, CONTAINER_RESTART_COUNT_ANNOTATION)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            container_type: text(CONTAINER_TYPE_ANNOTATION).unwrap_or_default(),
            termination_message_path: text(CONTAINER_TERMINATION_MESSAGE_PATH_ANNOTATION),
            termination_message_policy: text(CONTAINER_TERMINATION_MESSAGE_POLICY_ANNOTATION),
            pod_termination_grace_period: non_empty(
                annotations,
                POD_TERMINATION_GRACE_PERIOD_ANNOTATION,
            )
            .and_then(|v| v.parse().ok()),
            pod_deletion_grace_period: non_empty(annotations, POD_DELETION_GRACE_PERIOD_ANNOTATION)
                .and_then(|v| v.parse().ok()),
            pre_stop_handler: non_empty(annotations, CONTAINER_PRE_STOP_HANDLER_ANNOTATION)
                .and_then(|v| serde_json::from_str(v).ok()),
        })
    }

    /// True for init containers.
    pub fn is_init(&self) -> bool {
        self.container_type == CONTAINER_TYPE_INIT
    }
}

/// A label selector for objects this agent (node `node`) created.
pub fn managed_selector(node: &str) -> HashMap<String, String> {
    HashMap::from([
        (MANAGED_LABEL.to_string(), MANAGED_VALUE.to_string()),
        (NODE_LABEL.to_string(), node.to_string()),
    ])
}

/// A label selector for one pod's objects.
pub fn pod_selector(node: &str, uid: &str) -> HashMap<String, String> {
    let mut sel = managed_selector(node);
    sel.insert(POD_UID_LABEL.to_string(), uid.to_string());
    sel
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn sandbox_identity_needs_all_three_labels() {
        let full = map(&[
            (POD_NAME_LABEL, "web"),
            (POD_NAMESPACE_LABEL, "default"),
            (POD_UID_LABEL, "u-1"),
            (MANAGED_LABEL, MANAGED_VALUE),
            ("app", "web"),
        ]);
        assert_eq!(
            SandboxIdentity::from_labels(&full),
            Some(SandboxIdentity {
                name: "web".into(),
                namespace: "default".into(),
                uid: "u-1".into()
            })
        );
        assert_eq!(SandboxIdentity::pod_labels(&full), map(&[("app", "web")]));
        assert!(is_managed(&full));

        let mut missing = full.clone();
        missing.remove(POD_UID_LABEL);
        assert_eq!(SandboxIdentity::from_labels(&missing), None);
        let mut empty = full.clone();
        empty.insert(POD_NAME_LABEL.into(), String::new());
        assert_eq!(SandboxIdentity::from_labels(&empty), None);
        assert!(!is_managed(&map(&[(MANAGED_LABEL, "yes")])));
    }

    #[test]
    fn container_identity_reads_labels_and_annotations() {
        let labels = map(&[
            (POD_NAME_LABEL, "web"),
            (POD_NAMESPACE_LABEL, "default"),
            (POD_UID_LABEL, "u-1"),
            (CONTAINER_NAME_LABEL, "nginx"),
        ]);
        let annotations = map(&[
            (CONTAINER_HASH_ANNOTATION, "1f2e3d"),
            (CONTAINER_RESTART_COUNT_ANNOTATION, "4"),
            (CONTAINER_TYPE_ANNOTATION, "init"),
            (
                CONTAINER_TERMINATION_MESSAGE_PATH_ANNOTATION,
                "/dev/termination-log",
            ),
            (CONTAINER_TERMINATION_MESSAGE_POLICY_ANNOTATION, "File"),
            (POD_TERMINATION_GRACE_PERIOD_ANNOTATION, "30"),
            (
                CONTAINER_PRE_STOP_HANDLER_ANNOTATION,
                r#"{"exec":{"command":["sh","-c","sleep 1"]}}"#,
            ),
        ]);
        let id = ContainerIdentity::from_labels_annotations(&labels, &annotations).unwrap();
        assert_eq!(id.pod_name, "web");
        assert_eq!(id.pod_namespace, "default");
        assert_eq!(id.pod_uid, "u-1");
        assert_eq!(id.container_name, "nginx");
        assert_eq!(id.hash, 0x1f2e3d);
        assert_eq!(id.restart_count, 4);
        assert!(id.is_init());
        assert_eq!(
            id.termination_message_path.as_deref(),
            Some("/dev/termination-log")
        );
        assert_eq!(id.termination_message_policy.as_deref(), Some("File"));
        assert_eq!(id.pod_termination_grace_period, Some(30));
        assert_eq!(id.pod_deletion_grace_period, None);
        let pre_stop = id.pre_stop_handler.unwrap();
        assert_eq!(
            pre_stop.exec.unwrap().command.unwrap(),
            vec!["sh", "-c", "sleep 1"]
        );
    }

    #[test]
    fn container_identity_tolerates_bad_annotations() {
        let labels = map(&[
            (POD_NAME_LABEL, "web"),
            (POD_NAMESPACE_LABEL, "default"),
            (POD_UID_LABEL, "u-1"),
            (CONTAINER_NAME_LABEL, "nginx"),
        ]);
        let annotations = map(&[
            (CONTAINER_HASH_ANNOTATION, "not-hex"),
            (CONTAINER_RESTART_COUNT_ANNOTATION, "-1"),
            (CONTAINER_PRE_STOP_HANDLER_ANNOTATION, "{"),
        ]);
        let id = ContainerIdentity::from_labels_annotations(&labels, &annotations).unwrap();
        assert_eq!((id.hash, id.restart_count), (0, 0));
        assert!(id.pre_stop_handler.is_none());
        assert!(!id.is_init());

        let mut no_name = labels.clone();
        no_name.remove(CONTAINER_NAME_LABEL);
        assert!(ContainerIdentity::from_labels_annotations(&no_name, &annotations).is_none());
    }
}
