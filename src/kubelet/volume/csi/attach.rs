//! Attachable CSI volumes, as upstream's volume manager and `csiAttacher` treat them on the
//! node: a persistent volume whose driver requires attachment (its CSIDriver says
//! `attachRequired: true`, or there is no CSIDriver) is attached by the attach/detach
//! controller in the control plane, which creates the `VolumeAttachment` and lists the volume
//! in the Node's `status.volumesAttached`. The node only waits for that, and tells the
//! controller which volumes it uses in `status.volumesInUse`, so the controller never detaches
//! a volume under a pod.
//!
//! `volumesInUse` is upstream's `GetVolumesInUse`: the unique names
//! (`kubernetes.io/csi/<driver>^<handle>`) of the attachable volumes of the pods that are to
//! be mounted (the set-up marks them, [`want`], until the pod's teardown, [`forget_pod`]) and
//! of those still mounted or staged on disk that the controller lists as attached (so a
//! restart of Deckhand keeps reporting the volumes its running pods use), sorted as upstream.
//! Non-attachable volumes (`attachRequired: false`, inline ephemeral ones, `local`,
//! `hostPath`) are never listed, as upstream.
//!
//! Before a volume is staged and published, the set-up checks what upstream's
//! `VerifyControllerAttachedVolume` and `WaitForAttach` check: the Node reports it in use, the
//! Node lists it as attached, and its VolumeAttachment is attached; the attachment's
//! `attachmentMetadata` is the `publish_context` of the stage and publish calls.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::{AttachedVolume, Node, NodeStatus};
use k8s_openapi::api::storage::v1::VolumeAttachment;

use super::{CSI_PLUGIN_DIR, CsiError, host};

/// Upstream's unique volume name of a CSI persistent volume (`csiPlugin.GetVolumeName`).
pub(crate) fn unique_name(driver: &str, handle: &str) -> String {
    format!("kubernetes.io/csi/{driver}^{handle}")
}

/// The attachable volumes each pod on the node is to mount, by pod UID (upstream's desired
/// state of world, for what `volumesInUse` needs of it).
static DESIRED: Mutex<BTreeMap<String, BTreeSet<String>>> = Mutex::new(BTreeMap::new());

/// Marks `unique` as to be mounted by the pod: reported in use from now on.
pub(crate) fn want(pod_uid: &str, unique: &str) {
    let mut desired = DESIRED.lock().unwrap_or_else(|e| e.into_inner());
    desired
        .entry(pod_uid.to_string())
        .or_default()
        .insert(unique.to_string());
}

/// The pod's volumes are torn down: what it wanted is no longer reported for it.
pub(crate) fn forget_pod(pod_uid: &str) {
    let mut desired = DESIRED.lock().unwrap_or_else(|e| e.into_inner());
    desired.remove(pod_uid);
}

/// Every volume some pod is to mount.
pub(crate) fn desired() -> BTreeSet<String> {
    let desired = DESIRED.lock().unwrap_or_else(|e| e.into_inner());
    desired.values().flatten().cloned().collect()
}

fn read_json(path: &Path) -> Option<BTreeMap<String, String>> {
    serde_json::from_slice(&std::fs::read(path).ok()?).ok()
}

fn unique_of(data: &BTreeMap<String, String>) -> Option<String> {
    let driver = data.get("driverName").filter(|d| !d.is_empty())?;
    let handle = data.get("volumeHandle").filter(|h| !h.is_empty())?;
    Some(unique_name(driver, handle))
}

/// The persistent CSI volumes mounted on the node, from what the set-up left on disk: each
/// pod volume's `vol_data.json` (persistent ones) and each staged volume's (upstream's actual
/// state of world, rebuilt from disk as its reconstruction does).
pub(crate) fn on_disk(root: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let dirs = |p: &Path| -> Vec<std::path::PathBuf> {
        std::fs::read_dir(p)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default()
    };
    for pod in dirs(&root.join("pods")) {
        for volume in dirs(&pod.join("volumes").join(CSI_PLUGIN_DIR)) {
            let Some(data) = read_json(&volume.join("vol_data.json")) else {
                continue;
            };
            if data.get("volumeLifecycleMode").map(String::as_str) == Some("Persistent") {
                out.extend(unique_of(&data));
            }
        }
    }
    for driver in dirs(&root.join("plugins/kubernetes.io/csi")) {
        for staged in dirs(&driver) {
            if let Some(data) = read_json(&staged.join("vol_data.json")) {
                out.extend(unique_of(&data));
            }
        }
    }
    out
}

/// Upstream's `GetVolumesInUse` (pure): the volumes to be mounted, and those mounted that the
/// controller lists as attached (only an attachable volume ever is), once each, sorted.
pub(crate) fn volumes_in_use(
    desired: &BTreeSet<String>,
    mounted: &BTreeSet<String>,
    attached: &[AttachedVolume],
) -> Vec<String> {
    let attached: BTreeSet<&str> = attached.iter().map(|a| a.name.as_str()).collect();
    let mut out: BTreeSet<&String> = desired.iter().collect();
    out.extend(mounted.iter().filter(|m| attached.contains(m.as_str())));
    out.into_iter().cloned().collect()
}

/// Why an attachable volume is not ready to be mounted yet (upstream's texts).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NotAttached {
    #[error("Volume has not been added to the list of VolumesInUse in the node's volume status")]
    NotReportedInUse,
    #[error("Volume not attached according to node status")]
    NotInNodeStatus,
    #[error("volume attachment {0} is not attached yet")]
    Pending(String),
    #[error("attachment {name} failed: {message}")]
    Failed { name: String, message: String },
    #[error("volume attachment {0} is being deleted")]
    Deleting(String),
}

/// The Node's side of upstream's `VerifyControllerAttachedVolume` (pure): the volume must be
/// reported in use (so the controller will not detach it under the pod) and listed attached.
pub(crate) fn check_node(unique: &str, status: Option<&NodeStatus>) -> Result<(), NotAttached> {
    let status = status.ok_or(NotAttached::NotReportedInUse)?;
    if !status.volumes_in_use.iter().flatten().any(|v| v == unique) {
        return Err(NotAttached::NotReportedInUse);
    }
    if !status
        .volumes_attached
        .iter()
        .flatten()
        .any(|a| a.name == unique)
    {
        return Err(NotAttached::NotInNodeStatus);
    }
    Ok(())
}

/// The VolumeAttachment's side (upstream's `waitForVolumeAttachment` and `getPublishContext`,
/// pure): attached, and its `attachmentMetadata` is the publish context.
pub(crate) fn publish_context(
    name: &str,
    attachment: Option<&VolumeAttachment>,
) -> Result<HashMap<String, String>, NotAttached> {
    let pending = || NotAttached::Pending(name.to_string());
    let attachment = attachment.ok_or_else(pending)?;
    if attachment.metadata.deletion_timestamp.is_some() {
        return Err(NotAttached::Deleting(name.to_string()));
    }
    let status = attachment.status.as_ref().ok_or_else(pending)?;
    if let Some(message) = status.attach_error.as_ref().and_then(|e| e.message.clone()) {
        return Err(NotAttached::Failed {
            name: name.to_string(),
            message,
        });
    }
    if !status.attached {
        return Err(pending());
    }
    Ok(status
        .attachment_metadata
        .clone()
        .unwrap_or_default()
        .into_iter()
        .collect())
}

/// Checks the Node and the VolumeAttachment `attachment` once; the publish context when the
/// volume is attached. A volume that is not attached yet fails the set-up, which is tried
/// again with the volume back-off, as upstream's reconciler retries.
pub(crate) async fn attached(
    unique: String,
    attachment: String,
) -> Result<HashMap<String, String>, CsiError> {
    let read = |what: &'static str| {
        move |e: kube::Error| CsiError::ReadAttachment {
            what,
            reason: e.to_string(),
        }
    };
    let host = host().ok_or(CsiError::ReadAttachment {
        what: "Node",
        reason: "no API server".into(),
    })?;
    let client = host.client.clone().ok_or(CsiError::ReadAttachment {
        what: "Node",
        reason: "no API server".into(),
    })?;
    let nodes: kube::Api<Node> = kube::Api::all(client.clone());
    let node = nodes.get(&host.node_name).await.map_err(read("Node"))?;
    check_node(&unique, node.status.as_ref())?;
    let attachments: kube::Api<VolumeAttachment> = kube::Api::all(client);
    let found = attachments
        .get_opt(&attachment)
        .await
        .map_err(read("VolumeAttachment"))?;
    Ok(publish_context(&attachment, found.as_ref())?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::storage::v1::{VolumeAttachmentStatus, VolumeError};

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn attached(names: &[&str]) -> Vec<AttachedVolume> {
        names
            .iter()
            .map(|n| AttachedVolume {
                name: n.to_string(),
                device_path: String::new(),
            })
            .collect()
    }

    #[test]
    fn volumes_in_use_as_upstream_reports_them() {
        let a = "kubernetes.io/csi/d^a";
        let b = "kubernetes.io/csi/d^b";
        let c = "kubernetes.io/csi/c^z";
        // (desired, mounted, attached) → reported
        type Row<'a> = (&'a [&'a str], &'a [&'a str], &'a [&'a str], &'a [&'a str]);
        let rows: &[Row] = &[
            (&[], &[], &[], &[]),
            // To be mounted: reported before the controller attached it.
            (&[b, a], &[], &[], &[a, b]),
            // Mounted and attached, though no pod wants it any more (being torn down).
            (&[], &[a], &[a], &[a]),
            // Mounted but never attached: not attachable (attachRequired: false).
            (&[], &[a], &[], &[]),
            // Both: once, sorted as Go sorts strings.
            (&[b], &[b, a, c], &[a, b, c], &[c, a, b]),
        ];
        for (desired, mounted, att, want) in rows {
            assert_eq!(
                volumes_in_use(&set(desired), &set(mounted), &attached(att)),
                want.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                "desired {desired:?} mounted {mounted:?} attached {att:?}"
            );
        }
    }

    #[test]
    fn the_node_must_report_it_in_use_and_list_it_attached() {
        let u = "kubernetes.io/csi/d^h";
        let status = |in_use: &[&str], att: &[&str]| NodeStatus {
            volumes_in_use: Some(in_use.iter().map(|s| s.to_string()).collect()),
            volumes_attached: Some(attached(att)),
            ..Default::default()
        };
        assert_eq!(check_node(u, None), Err(NotAttached::NotReportedInUse));
        assert_eq!(
            check_node(u, Some(&status(&[], &[u]))),
            Err(NotAttached::NotReportedInUse)
        );
        assert_eq!(
            check_node(u, Some(&status(&[u], &[]))),
            Err(NotAttached::NotInNodeStatus)
        );
        assert_eq!(check_node(u, Some(&status(&[u], &[u]))), Ok(()));
        assert_eq!(
            NotAttached::NotInNodeStatus.to_string(),
            "Volume not attached according to node status"
        );
    }

    #[test]
    fn the_publish_context_is_the_attachment_metadata() {
        let va = |attached: bool, error: Option<&str>| VolumeAttachment {
            status: Some(VolumeAttachmentStatus {
                attached,
                attachment_metadata: Some(BTreeMap::from([("device".into(), "/dev/x".into())])),
                attach_error: error.map(|m| VolumeError {
                    message: Some(m.into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            publish_context("csi-1", None),
            Err(NotAttached::Pending("csi-1".into()))
        );
        assert_eq!(
            publish_context("csi-1", Some(&va(false, None))),
            Err(NotAttached::Pending("csi-1".into()))
        );
        assert_eq!(
            publish_context("csi-1", Some(&va(false, Some("boom")))),
            Err(NotAttached::Failed {
                name: "csi-1".into(),
                message: "boom".into()
            })
        );
        assert_eq!(
            publish_context("csi-1", Some(&va(true, None))).unwrap(),
            HashMap::from([("device".to_string(), "/dev/x".to_string())])
        );
    }

    #[test]
    fn what_is_mounted_is_read_from_disk() {
        let root = tempfile::tempdir().unwrap();
        let write = |rel: &str, json: &str| {
            let dir = root.path().join(rel);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("vol_data.json"), json).unwrap();
        };
        write(
            "pods/u1/volumes/kubernetes.io~csi/pv1",
            r#"{"driverName":"d","volumeHandle":"h1","volumeLifecycleMode":"Persistent"}"#,
        );
        write(
            "pods/u1/volumes/kubernetes.io~csi/inline",
            r#"{"driverName":"d","volumeHandle":"csi-x","volumeLifecycleMode":"Ephemeral"}"#,
        );
        write(
            "plugins/kubernetes.io/csi/d/abc",
            r#"{"driverName":"d","volumeHandle":"h2"}"#,
        );
        assert_eq!(
            on_disk(root.path()),
            set(&["kubernetes.io/csi/d^h1", "kubernetes.io/csi/d^h2"])
        );
    }
}
