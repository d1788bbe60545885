//! The pure half of mirror pods: given what the node knows of a static pod and what the API
//! server shows of its mirror pod, what to do; and the mirror pod to create. No I/O, no clock:
//! the manager in `mod.rs` gathers the inputs and carries the decisions out.
//!
//! Upstream's rules (the kubelet's `tryReconcileMirrorPods` and its housekeeping):
//! - a static pod that is being run gets a mirror pod with its name and namespace;
//! - a mirror pod is the static pod's when its `kubernetes.io/config.mirror` annotation equals
//!   the static pod's hash (`kubernetes.io/config.hash`); one that is not, or that is being
//!   deleted (a user deleted it), is deleted with its UID as a precondition and created anew;
//! - a mirror pod whose static pod is gone (torn down, or unknown after a restart) is an
//!   orphan and is deleted, but only once every source has delivered its pods, and never while
//!   a static pod of that name is still being torn down.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use crate::kubelet::source::defaults::{CONFIG_HASH_ANNOTATION, CONFIG_MIRROR_ANNOTATION};

/// Where a static pod is in its life, as the pod workers report it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    /// Handed to a worker and not synced yet: its name is taken (an old mirror is no orphan),
    /// but nothing is created before the pod is actually run.
    Pending,
    /// Synced at least once, i.e. admitted and being run: it has a mirror pod.
    Running,
    /// Being torn down: its mirror pod is left as it is until the teardown ends.
    Terminating,
}

/// A static pod as the decision sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StaticView<'a> {
    pub hash: &'a str,
    pub stage: Stage,
}

/// A mirror pod as the decision sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MirrorView<'a> {
    /// Its `kubernetes.io/config.mirror` annotation.
    pub hash: Option<&'a str>,
    /// It has a deletion timestamp.
    pub deleting: bool,
}

/// What to do about one pod name (`namespace/name`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    Nothing,
    /// No mirror pod: create one.
    Create,
    /// The mirror pod is not this static pod's (another hash) or is being deleted: delete it
    /// (with its UID as precondition), then create the static pod's.
    Replace,
    /// No static pod has this name: delete the mirror pod.
    DeleteOrphan,
}

/// Decides for one name. `statics` are the static pods with that name (an edited static pod
/// has its old instance terminating while the new one waits); `orphans_allowed` is true once
/// every source has delivered its pods.
pub(crate) fn decide(
    statics: &[StaticView<'_>],
    mirror: Option<MirrorView<'_>>,
    orphans_allowed: bool,
) -> Decision {
    let running = statics.iter().find(|s| s.stage == Stage::Running);
    match (running, mirror) {
        (Some(_), None) => Decision::Create,
        (Some(s), Some(m)) if m.deleting || m.hash != Some(s.hash) => Decision::Replace,
        (Some(_), Some(_)) => Decision::Nothing,
        // A pending or terminating static pod keeps its name's mirror as it is.
        (None, _) if !statics.is_empty() => Decision::Nothing,
        (None, Some(_)) if orphans_allowed => Decision::DeleteOrphan,
        (None, _) => Decision::Nothing,
    }
}

/// The hash a static pod's mirror pod must carry: its `kubernetes.io/config.hash` annotation
/// (the sources set it to the pod's UID), else the UID.
pub(crate) fn static_hash(pod: &Pod) -> &str {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONFIG_HASH_ANNOTATION))
        .or(pod.metadata.uid.as_ref())
        .map(String::as_str)
        .unwrap_or_default()
}

/// The `kubernetes.io/config.mirror` annotation of a mirror pod.
pub(crate) fn mirror_hash(pod: &Pod) -> Option<&str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CONFIG_MIRROR_ANNOTATION))
        .map(String::as_str)
}

/// The mirror pod to create for `static_pod` on node `node_name` (whose Node has `node_uid`):
/// the static pod's name, namespace, labels, annotations and spec, plus the mirror annotation
/// with the static pod's hash and the Node as controlling owner (the NodeRestriction admission
/// plugin refuses a mirror pod without exactly that owner). The static pod's UID, version,
/// timestamps and status are left out: the API server assigns its own.
pub(crate) fn mirror_pod(static_pod: &Pod, node_name: &str, node_uid: &str) -> Pod {
    let meta = &static_pod.metadata;
    let mut annotations: BTreeMap<String, String> = meta.annotations.clone().unwrap_or_default();
    annotations.insert(
        CONFIG_MIRROR_ANNOTATION.to_string(),
        static_hash(static_pod).to_string(),
    );
    let mut spec = static_pod.spec.clone().unwrap_or_default();
    spec.node_name = Some(node_name.to_string());
    Pod {
        metadata: ObjectMeta {
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            labels: meta.labels.clone(),
            annotations: Some(annotations),
            finalizers: meta.finalizers.clone(),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node_name.to_string(),
                uid: node_uid.to_string(),
                controller: Some(true),
                block_owner_deletion: None,
            }]),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(hash: &str, stage: Stage) -> StaticView<'_> {
        StaticView { hash, stage }
    }

    fn m(hash: Option<&str>, deleting: bool) -> MirrorView<'_> {
        MirrorView { hash, deleting }
    }

    /// (what, static pods of the name, its mirror pod, orphans allowed, decision)
    #[test]
    fn decisions() {
        use Decision::*;
        use Stage::*;
        type Row<'a> = (
            &'a str,
            Vec<StaticView<'a>>,
            Option<MirrorView<'a>>,
            bool,
            Decision,
        );
        let rows: Vec<Row> = vec![
            (
                "running, no mirror",
                vec![s("h1", Running)],
                None,
                true,
                Create,
            ),
            (
                "running, no mirror, sources not ready yet",
                vec![s("h1", Running)],
                None,
                false,
                Create,
            ),
            (
                "running, its mirror",
                vec![s("h1", Running)],
                Some(m(Some("h1"), false)),
                true,
                Nothing,
            ),
            (
                "running, a mirror of an older version",
                vec![s("h2", Running)],
                Some(m(Some("h1"), false)),
                true,
                Replace,
            ),
            (
                "running, a pod of that name without the annotation's value",
                vec![s("h1", Running)],
                Some(m(None, false)),
                true,
                Replace,
            ),
            (
                "running, its mirror deleted by a user",
                vec![s("h1", Running)],
                Some(m(Some("h1"), true)),
                true,
                Replace,
            ),
            (
                "pending (not run yet): nothing created",
                vec![s("h1", Pending)],
                None,
                true,
                Nothing,
            ),
            (
                "pending: an old mirror is not an orphan",
                vec![s("h2", Pending)],
                Some(m(Some("h1"), false)),
                true,
                Nothing,
            ),
            (
                "terminating: its mirror stays until the teardown ends",
                vec![s("h1", Terminating)],
                Some(m(Some("h1"), false)),
                true,
                Nothing,
            ),
            (
                "terminating: a deleted mirror is not recreated",
                vec![s("h1", Terminating)],
                None,
                true,
                Nothing,
            ),
            (
                "edited: the old instance terminates, the new one waits",
                vec![s("h1", Terminating), s("h2", Pending)],
                Some(m(Some("h1"), false)),
                true,
                Nothing,
            ),
            (
                "edited: the new instance runs, the old one is still going",
                vec![s("h1", Terminating), s("h2", Running)],
                Some(m(Some("h1"), false)),
                true,
                Replace,
            ),
            (
                "static pod gone: orphan",
                vec![],
                Some(m(Some("h1"), false)),
                true,
                DeleteOrphan,
            ),
            (
                "orphan being deleted by a user: finished",
                vec![],
                Some(m(Some("h1"), true)),
                true,
                DeleteOrphan,
            ),
            (
                "orphan, sources not ready",
                vec![],
                Some(m(Some("h1"), false)),
                false,
                Nothing,
            ),
            ("nothing at all", vec![], None, true, Nothing),
        ];
        for (what, statics, mirror, ready, want) in rows {
            assert_eq!(decide(&statics, mirror, ready), want, "{what}");
        }
    }

    #[test]
    fn the_mirror_pod_copies_the_static_pod_and_is_owned_by_the_node() {
        let static_pod: Pod = crate::base::yaml::from_str(
            r#"
metadata:
  name: web-n1
  namespace: kube-system
  uid: 0123abcd
  resourceVersion: "7"
  labels: {app: web}
  annotations:
    kubernetes.io/config.hash: 0123abcd
    kubernetes.io/config.source: file
    kubernetes.io/config.seen: "2025-01-01T00:00:00Z"
spec:
  containers: [{name: app, image: busybox}]
status: {phase: Pending}
"#,
        )
        .unwrap();
        let mirror = mirror_pod(&static_pod, "n1", "node-uid-1");
        let meta = &mirror.metadata;
        assert_eq!(meta.name.as_deref(), Some("web-n1"));
        assert_eq!(meta.namespace.as_deref(), Some("kube-system"));
        assert_eq!(meta.labels, static_pod.metadata.labels);
        assert_eq!(meta.uid, None, "the API server assigns the UID");
        assert_eq!(meta.resource_version, None);
        let annotations = meta.annotations.as_ref().unwrap();
        assert_eq!(annotations[CONFIG_MIRROR_ANNOTATION], "0123abcd");
        assert_eq!(annotations["kubernetes.io/config.source"], "file");
        assert_eq!(annotations[CONFIG_HASH_ANNOTATION], "0123abcd");
        assert_eq!(
            serde_json::to_value(meta.owner_references.as_ref().unwrap()).unwrap(),
            serde_json::json!([{
                "apiVersion": "v1", "kind": "Node", "name": "n1",
                "uid": "node-uid-1", "controller": true,
            }])
        );
        let spec = mirror.spec.as_ref().unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        assert_eq!(
            spec.containers,
            static_pod.spec.as_ref().unwrap().containers
        );
        assert!(mirror.status.is_none());
        assert_eq!(mirror_hash(&mirror), Some(static_hash(&static_pod)));
    }

    #[test]
    fn the_hash_falls_back_to_the_uid() {
        let mut p = Pod::default();
        p.metadata.uid = Some("u-1".into());
        assert_eq!(static_hash(&p), "u-1");
        assert_eq!(mirror_hash(&p), None);
    }
}
