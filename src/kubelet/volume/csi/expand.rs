//! Online expansion of a CSI persistent volume a running pod uses, as upstream's kubelet does
//! it (`ExpandInUseVolume`, `NodeExpander`): once the resize controller has grown the volume
//! (the PV's capacity is above the claim's `status.capacity`), the driver's
//! `NodeExpandVolume` grows the file system the pod sees, and the claim's status is brought
//! up to the new size. Pure: what to do about a claim ([`decide`]), the status patches and
//! how a driver's error is classed; the executor reads the objects, calls the driver and
//! writes the patches.
//!
//! With the resize controller's tracking (`status.allocatedResourceStatuses[storage]`, GA
//! since 1.34 as `RecoverVolumeExpansionFailure`), the node expands only while the claim says
//! `NodeResizePending` or `NodeResizeInProgress`, to `status.allocatedResources[storage]`;
//! it marks the claim `NodeResizeInProgress` before the call and, on success, sets
//! `status.capacity`, drops the tracking entry and the resize conditions. Without it (an older
//! resize controller), the PV's capacity is the target and only the capacity is written.

use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimCondition,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{Value, json};

use crate::base::podspec::quantity;

/// The resource whose size is expanded.
const STORAGE: &str = "storage";
/// The resize controller handed the expansion to the node.
pub(crate) const NODE_RESIZE_PENDING: &str = "NodeResizePending";
/// A node is expanding the volume.
pub(crate) const NODE_RESIZE_IN_PROGRESS: &str = "NodeResizeInProgress";
/// The driver refused the size for good.
pub(crate) const NODE_RESIZE_INFEASIBLE: &str = "NodeResizeInfeasible";
/// The condition a failed node expansion sets.
pub(crate) const NODE_RESIZE_ERROR: &str = "NodeResizeError";
/// The claim conditions that belong to a resize (upstream's `resizeConditions`).
const RESIZE_CONDITIONS: [&str; 4] = [
    "Resizing",
    "FileSystemResizePending",
    "ControllerResizeError",
    NODE_RESIZE_ERROR,
];

/// What a mounted claim's size asks of the node.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Decision {
    /// Nothing: the claim's status holds the volume's size, or the resize controller does not
    /// (or no longer) hand the expansion to the node.
    Nothing,
    /// The volume grew but the pod mounts it read-only: not expanded (upstream's
    /// `FileSystemResizeFailed`, "requested read-only file system").
    ReadOnly {
        size: Quantity,
    },
    Expand(Expansion),
}

/// An expansion to carry out.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Expansion {
    /// The size to grow to, as the API writes it, and in bytes.
    pub size: Quantity,
    pub bytes: i64,
    /// The resize controller tracks the expansion in `allocatedResourceStatuses`.
    pub tracked: bool,
}

fn bytes(q: Option<&Quantity>) -> Option<i64> {
    quantity::parse(&q?.0).ok().map(|q| q.value())
}

/// What to do about a claim a running pod mounts (`read_only`: the pod's volume, the claim
/// source or the PV's CSI source says so), in upstream's order: the PV must have grown past
/// the claim's recorded capacity; a read-only mount is not expanded; a tracked expansion
/// goes on only while pending or in progress on the node.
pub(crate) fn decide(
    claim: &PersistentVolumeClaim,
    pv: &PersistentVolume,
    read_only: bool,
) -> Decision {
    let status = claim.status.clone().unwrap_or_default();
    let pv_size = pv
        .spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref()?.get(STORAGE));
    let (Some(pv_size), Some(pv_bytes)) = (pv_size, bytes(pv_size)) else {
        return Decision::Nothing;
    };
    let recorded = bytes(status.capacity.as_ref().and_then(|c| c.get(STORAGE))).unwrap_or(0);
    if pv_bytes <= recorded {
        return Decision::Nothing;
    }
    if read_only {
        return Decision::ReadOnly {
            size: pv_size.clone(),
        };
    }
    let state = status
        .allocated_resource_statuses
        .as_ref()
        .and_then(|s| s.get(STORAGE));
    let allocated = status
        .allocated_resources
        .as_ref()
        .and_then(|a| a.get(STORAGE));
    if state.is_none() && allocated.is_none() {
        // An older resize controller: grow to the PV's size.
        return Decision::Expand(Expansion {
            size: pv_size.clone(),
            bytes: pv_bytes,
            tracked: false,
        });
    }
    if !matches!(
        state.map(String::as_str),
        Some(NODE_RESIZE_PENDING | NODE_RESIZE_IN_PROGRESS)
    ) {
        return Decision::Nothing;
    }
    let size = allocated.unwrap_or(pv_size);
    match bytes(Some(size)) {
        Some(b) if b > 0 => Decision::Expand(Expansion {
            size: size.clone(),
            bytes: b,
            tracked: true,
        }),
        _ => Decision::Nothing,
    }
}

/// How the driver's refusal is told to the claim (upstream's `isInfeasibleError`,
/// `inUseError`, `isFinalError`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// The size cannot be had: the claim is marked `NodeResizeInfeasible`, not tried again.
    Infeasible,
    /// The driver cannot expand a volume in use: not tried again while mounted.
    InUse,
    /// Failed for now: a `NodeResizeError` condition, tried again after a back-off.
    Final,
    /// Maybe still going on in the driver: tried again, the claim untouched.
    Transient,
}

pub(crate) fn classify(code: tonic::Code) -> Failure {
    use tonic::Code;
    match code {
        Code::InvalidArgument | Code::OutOfRange | Code::NotFound => Failure::Infeasible,
        Code::FailedPrecondition => Failure::InUse,
        Code::Cancelled
        | Code::DeadlineExceeded
        | Code::Unavailable
        | Code::ResourceExhausted
        | Code::Aborted => Failure::Transient,
        _ => Failure::Final,
    }
}

fn version_check(claim: &PersistentVolumeClaim) -> Value {
    json!({"resourceVersion": claim.metadata.resource_version})
}

/// The claim marked as expanding on this node (a merge patch of its status, checked against
/// the version read, as upstream's `MarkNodeExpansionInProgress`).
pub(crate) fn in_progress_patch(claim: &PersistentVolumeClaim) -> Value {
    json!({
        "metadata": version_check(claim),
        "status": {"allocatedResourceStatuses": {"storage": NODE_RESIZE_IN_PROGRESS}},
    })
}

/// The claim's conditions without the resize ones, plus `added`.
fn conditions_after(
    claim: &PersistentVolumeClaim,
    keep_resize: bool,
    added: Option<PersistentVolumeClaimCondition>,
) -> Value {
    let mut kept: Vec<PersistentVolumeClaimCondition> = claim
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .filter(|c| keep_resize || !RESIZE_CONDITIONS.contains(&c.type_.as_str()))
        .filter(|c| added.as_ref().is_none_or(|a| a.type_ != c.type_))
        .collect();
    kept.extend(added);
    serde_json::to_value(kept).unwrap_or(Value::Array(Vec::new()))
}

/// The expansion done: the new capacity, the tracking entry and the resize conditions gone
/// (upstream's `MarkNodeExpansionFinishedWithRecovery`, `MarkFSResizeFinished`).
pub(crate) fn finished_patch(claim: &PersistentVolumeClaim, size: &Quantity) -> Value {
    json!({
        "metadata": version_check(claim),
        "status": {
            "capacity": {"storage": size},
            "allocatedResourceStatuses": {"storage": null},
            "conditions": conditions_after(claim, false, None),
        },
    })
}

/// The expansion failed: a `NodeResizeError` condition with the driver's answer, and the
/// tracking entry `NodeResizeInfeasible` when the size cannot be had (upstream's
/// `MarkNodeExpansionInfeasible`, `MarkNodeExpansionFailedCondition`; unconditional, as
/// upstream's).
pub(crate) fn failed_patch(
    claim: &PersistentVolumeClaim,
    message: &str,
    infeasible: bool,
    now: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> Value {
    let condition = PersistentVolumeClaimCondition {
        type_: NODE_RESIZE_ERROR.into(),
        status: "True".into(),
        last_transition_time: Some(now),
        message: Some(format!("failed to expand pvc with {message}")),
        ..Default::default()
    };
    let mut status = json!({"conditions": conditions_after(claim, true, Some(condition))});
    if infeasible {
        status["allocatedResourceStatuses"] = json!({"storage": NODE_RESIZE_INFEASIBLE});
    }
    json!({"status": status})
}

#[cfg(test)]
#[path = "expand_tests.rs"]
mod tests;
