//! `persistentVolumeClaim` volumes: the claim resolved to the persistent volume bound to it,
//! and how that volume is served here. Pure: the claim and the volume are read before (see
//! `kubelet::api_objects::claims`), the node-affinity check is handed in.
//!
//! The checks and their messages are upstream's, in upstream's order: the desired-state
//! populator's (`error processing PVC <ns>/<claim>: PVC is not bound`, the claim being
//! deleted, the volume not yet bound back to the claim, `volumeMode` against
//! `volumeMounts`), then the mount operation's node-affinity check (`MountVolume.NodeAffinity
//! check failed … no matching NodeSelectorTerms`).
//!
//! Served: `local` (the path bind-mounted at
//! `<root>/pods/<uid>/volumes/kubernetes.io~local-volume/<pv>`, given to the fsGroup unless
//! read-only, as upstream's local plugin) and `hostPath` (the node's path, checked against
//! its `type`, as the hostPath volume type). A `csi` volume is refused until the CSI plugin
//! serves it; any other source, and `volumeMode: Block`, are refused with a message saying
//! so. Teardown unmounts and never deletes the volume's data.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::{
    NodeSelector, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimVolumeSource,
};

use crate::kubelet::api_objects::claims::{self, FetchError};

/// The directory of local volumes under a pod's `volumes` (upstream's escaped plugin name).
pub(crate) const LOCAL_PLUGIN: &str = "kubernetes.io~local-volume";

/// Why a claim does not lead to a volume yet (upstream's populator texts).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ClaimError {
    #[error("failed to fetch PVC from API server: {0}")]
    FetchClaim(FetchError),
    #[error("PVC is being deleted")]
    Deleting,
    #[error("PVC is not bound")]
    NotBound,
    #[error("PVC has empty pvc.Spec.VolumeName")]
    NoVolumeName,
    #[error("failed to fetch PV {name} from API server: {reason}")]
    FetchVolume { name: String, reason: FetchError },
    #[error(
        "found PV object {0} but it has a nil pv.Spec.ClaimRef indicating it is not yet bound to the claim"
    )]
    NoClaimRef(String),
    #[error(
        "found PV object {name} but its pv.Spec.ClaimRef.UID {got} does not point to claim.UID {want}"
    )]
    OtherClaim {
        name: String,
        got: String,
        want: String,
    },
}

/// Why a `persistentVolumeClaim` volume cannot be set up (now, or on this node).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PersistentError {
    #[error("error processing PVC {namespace}/{claim}: {reason}")]
    Claim {
        namespace: String,
        claim: String,
        reason: Box<ClaimError>,
    },
    #[error("volume {volume} has volumeMode {mode}, but is specified in volumeMounts")]
    MountsBlock { volume: String, mode: String },
    /// Raw block devices (`volumeDevices`) are not served by this node.
    #[error(
        "volume {volume} has volumeMode Block: raw block volumes (volumeDevices) are not supported on this node"
    )]
    Block { volume: String },
    #[error("volume type {0} is not supported on this node")]
    Unsupported(String),
    /// The volume's node affinity leaves this node out (the message is what upstream's
    /// `CheckNodeAffinity` says; the caller names the volume).
    #[error("no matching NodeSelectorTerms")]
    NodeAffinity { pv: String },
}

/// How a bound persistent volume is provided on this node.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Served {
    /// A `local` volume: its path, bind-mounted into the pod's volume directory.
    Local { path: PathBuf },
    /// A `hostPath` volume: the node's path, mounted directly after its `type` check.
    HostPath { path: String, kind: String },
    /// A `csi` volume: staged and published by its driver (`volume::csi`).
    Csi {
        source: Box<k8s_openapi::api::core::v1::CSIPersistentVolumeSource>,
        access_modes: Vec<String>,
        mount_options: Vec<String>,
    },
}

/// A claim resolved to its volume.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Resolved {
    /// The persistent volume's name (upstream's volume spec name: the directory name).
    pub pv: String,
    pub served: Served,
    /// The pod's `readOnly` on the claim (upstream's spec read-only for a PV).
    pub read_only: bool,
    /// `ReadWriteOncePod` is the volume's only access mode: no second pod may mount it.
    pub once_per_pod: bool,
}

/// Upstream's unique volume name, as `volumesInUse` and the volume manager's logs show it:
/// `kubernetes.io/local-volume/<pv>` (a device-mountable plugin), and for hostPath (neither
/// attachable nor device-mountable) `kubernetes.io/host-path/<pod-uid>-<pv>`. Neither plugin is
/// attachable, so upstream reports neither in the node's `volumesInUse`; nor does Deckhand.
pub(crate) fn unique_name(resolved: &Resolved, pod_uid: &str) -> String {
    match resolved.served {
        Served::Local { .. } => format!("kubernetes.io/local-volume/{}", resolved.pv),
        Served::HostPath { .. } => format!("kubernetes.io/host-path/{pod_uid}-{}", resolved.pv),
        Served::Csi { ref source, .. } => {
            super::csi::attach::unique_name(&source.driver, &source.volume_handle)
        }
    }
}

/// How the pod uses a volume: through `volumeMounts`, `volumeDevices`, or both.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct VolumeUse {
    pub mounts: bool,
    pub devices: bool,
}

/// Resolves a pod's claim volume: the claim (as read), its bound volume (as read, when the
/// claim named one), how the pod's containers use it, and whether the volume's required node
/// affinity admits this node.
pub(crate) fn resolve(
    volume: &str,
    namespace: &str,
    source: &PersistentVolumeClaimVolumeSource,
    claim: &claims::Claim,
    pv: Option<&claims::Volume>,
    usage: VolumeUse,
    affinity_matches: &dyn Fn(&NodeSelector) -> bool,
) -> Result<Resolved, PersistentError> {
    let claim_error = |reason| PersistentError::Claim {
        namespace: namespace.to_string(),
        claim: source.claim_name.clone(),
        reason: Box::new(reason),
    };
    let claim = claim
        .as_ref()
        .map_err(|e| claim_error(ClaimError::FetchClaim(e.clone())))?;
    let pv_name = bound_volume_name(claim).map_err(claim_error)?;
    let pv = match pv {
        Some(Ok(pv)) => pv,
        Some(Err(e)) => {
            return Err(claim_error(ClaimError::FetchVolume {
                name: pv_name.to_string(),
                reason: e.clone(),
            }));
        }
        None => {
            return Err(claim_error(ClaimError::FetchVolume {
                name: pv_name.to_string(),
                reason: FetchError::Request("not read".to_string()),
            }));
        }
    };
    check_claim_ref(pv, pv_name, claim).map_err(claim_error)?;
    let mode = pv
        .spec
        .as_ref()
        .and_then(|s| s.volume_mode.clone())
        .unwrap_or_else(|| "Filesystem".to_string());
    if mode != "Filesystem" {
        if usage.mounts {
            return Err(PersistentError::MountsBlock {
                volume: volume.to_string(),
                mode,
            });
        }
        return Err(PersistentError::Block {
            volume: volume.to_string(),
        });
    }
    if usage.devices {
        // Upstream: a Filesystem volume listed in volumeDevices.
        return Err(PersistentError::Block {
            volume: volume.to_string(),
        });
    }
    let served = served(pv)?;
    let required = pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref());
    if let Some(required) = required
        && !affinity_matches(required)
    {
        return Err(PersistentError::NodeAffinity {
            pv: pv_name.to_string(),
        });
    }
    let modes = pv.spec.as_ref().and_then(|s| s.access_modes.as_deref());
    Ok(Resolved {
        pv: pv_name.to_string(),
        served,
        read_only: source.read_only == Some(true),
        once_per_pod: modes.is_some_and(|m| m == ["ReadWriteOncePod"]),
    })
}

/// The claim's volume name, when the claim may be used (upstream's `getPVCExtractPV`).
fn bound_volume_name(claim: &PersistentVolumeClaim) -> Result<&str, ClaimError> {
    if claim.metadata.deletion_timestamp.is_some() {
        return Err(ClaimError::Deleting);
    }
    if claim.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
        return Err(ClaimError::NotBound);
    }
    claims::bound_volume(claim).ok_or(ClaimError::NoVolumeName)
}

/// The volume must be bound back to this very claim (upstream's `getPVSpec`).
fn check_claim_ref(
    pv: &PersistentVolume,
    name: &str,
    claim: &PersistentVolumeClaim,
) -> Result<(), ClaimError> {
    let Some(claim_ref) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return Err(ClaimError::NoClaimRef(name.to_string()));
    };
    let got = claim_ref.uid.clone().unwrap_or_default();
    let want = claim.metadata.uid.clone().unwrap_or_default();
    if got != want {
        return Err(ClaimError::OtherClaim {
            name: name.to_string(),
            got,
            want,
        });
    }
    Ok(())
}

/// Which of the served sources the volume has, or why it cannot be served.
fn served(pv: &PersistentVolume) -> Result<Served, PersistentError> {
    let spec = pv.spec.clone().unwrap_or_default();
    if let Some(local) = &spec.local {
        return Ok(Served::Local {
            path: PathBuf::from(&local.path),
        });
    }
    if let Some(host) = &spec.host_path {
        return Ok(Served::HostPath {
            path: host.path.clone(),
            kind: host.type_.clone().unwrap_or_default(),
        });
    }
    if let Some(csi) = &spec.csi {
        return Ok(Served::Csi {
            source: Box::new(csi.clone()),
            access_modes: spec.access_modes.clone().unwrap_or_default(),
            mount_options: spec.mount_options.clone().unwrap_or_default(),
        });
    }
    Err(PersistentError::Unsupported(source_kind(&spec)))
}

/// The source field a volume spec sets (`nfs`, `iscsi`, …), as the API names it.
fn source_kind(spec: &k8s_openapi::api::core::v1::PersistentVolumeSpec) -> String {
    const NOT_SOURCES: &[&str] = &[
        "accessModes",
        "capacity",
        "claimRef",
        "mountOptions",
        "nodeAffinity",
        "persistentVolumeReclaimPolicy",
        "storageClassName",
        "volumeAttributesClassName",
        "volumeMode",
    ];
    serde_json::to_value(spec)
        .ok()
        .and_then(|v| {
            v.as_object().and_then(|o| {
                o.keys()
                    .find(|k| !NOT_SOURCES.contains(&k.as_str()))
                    .cloned()
            })
        })
        .unwrap_or_else(|| "with no source".to_string())
}

#[cfg(test)]
mod tests;
