//! In-place pod resize as the node decides it (upstream's allocation manager,
//! `handlePodResourcesResize`, and the resize operation of its admit handlers): pure.
//!
//! A running pod's containers run with the resources the node *allocated* them, which are the
//! spec's at admission. When the API server's `resize` subresource changes a container's
//! `resources`, the new spec is a request: the node allocates it when it fits, or leaves the
//! allocation as it was and says why in the pod's `PodResizePending` condition:
//! - `Infeasible` when the pod would ask for more cpu or memory than the node has at all
//!   ("Node didn't have enough capacity: …"); nothing but a new resize changes that;
//! - `Deferred` when it fits the node but not beside the other pods' allocations (the
//!   admission's own "Node didn't have enough resource: …"); it is tried again as pods leave.
//!
//! Every container's resources can be resized: app containers, sidecars and ordinary init
//! containers, as upstream's `IsResizableContainer` with `InPlacePodVerticalScalingInitContainers`
//! (GA and locked on in v1.37; the Node declares it). An allocation checkpointed before init
//! containers were resizable does not name them, and their spec stays as it was allocated. The
//! pod-level resources (`spec.resources`, `InPlacePodLevelResourcesVerticalScaling`) are
//! allocated with them: the pod's requests admission counts are the pod-level ones where set.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodCondition, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::{Deserialize, Serialize};

use super::requests::{CPU, MEMORY, pod_requests};
use super::{Decision, NodeInfo, Usage, admit_with_usage};

/// The condition a resize the node has not allocated yet shows on the pod.
pub(crate) const RESIZE_PENDING: &str = "PodResizePending";
/// The condition a resize allocated but not yet applied to the containers shows.
pub(crate) const RESIZE_IN_PROGRESS: &str = "PodResizeInProgress";
/// `PodResizePending`'s reason when the node can never hold the pod at the new size.
pub(crate) const INFEASIBLE: &str = "Infeasible";
/// `PodResizePending`'s reason when the node could hold it once other pods leave.
pub(crate) const DEFERRED: &str = "Deferred";

/// The resources the node allocated a pod's resizable containers, by container name: what it
/// runs them with, whatever the spec asks now. Checkpointed, so a restarted agent keeps it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Allocation {
    pub containers: BTreeMap<String, ResourceRequirements>,
    /// The pod-level resources (`spec.resources`, empty for a pod without them) allocated, as
    /// upstream's `PodLevelResources` in its checkpoint; `None` only in checkpoints written
    /// before they were kept, where the spec's stand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<ResourceRequirements>,
}

/// A resize the node did not allocate, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pending {
    /// [`INFEASIBLE`] or [`DEFERRED`].
    pub reason: &'static str,
    pub message: String,
}

/// What to do with a pod whose spec asks for other resources than it was allocated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The spec's resources are what it was allocated: nothing to resize.
    Unchanged,
    /// Allocate the spec's resources.
    Allocate,
    /// Keep the allocation; the resize waits.
    Pending(Pending),
}

fn resizable(pod: &Pod) -> impl Iterator<Item = &Container> {
    let spec = pod.spec.as_ref();
    let inits = spec
        .and_then(|s| s.init_containers.as_deref())
        .unwrap_or_default()
        .iter();
    spec.map(|s| s.containers.as_slice())
        .unwrap_or_default()
        .iter()
        .chain(inits)
}

/// The allocation the spec asks for.
pub(crate) fn allocation_of(pod: &Pod) -> Allocation {
    Allocation {
        containers: resizable(pod)
            .map(|c| (c.name.clone(), c.resources.clone().unwrap_or_default()))
            .collect(),
        pod: Some(
            pod.spec
                .as_ref()
                .and_then(|s| s.resources.clone())
                .unwrap_or_default(),
        ),
    }
}

/// Whether the pod-level resources the spec asks for differ from the allocation's (a pod
/// without them and an empty set are the same). A checkpoint written before they were kept
/// knows nothing of them: the spec's stand.
fn pod_level_differs(pod: &Pod, allocation: &Allocation) -> bool {
    let Some(allocated) = &allocation.pod else {
        return false;
    };
    let asked = pod
        .spec
        .as_ref()
        .and_then(|s| s.resources.clone())
        .unwrap_or_default();
    !same_resources(&asked, allocated)
}

/// A quantity as a comparable number (thousandths), so `1` and `1000m` are the same, as
/// upstream's semantic equality sees them. A quantity that does not parse compares by its text.
fn amount(q: &Quantity) -> Result<i128, &str> {
    match crate::base::podspec::quantity::parse(&q.0) {
        Ok(v) => Ok(v
            .checked_milli_value()
            .map(i128::from)
            .unwrap_or_else(|| i128::from(v.value()) * 1000)),
        Err(_) => Err(q.0.as_str()),
    }
}

fn same_list(
    a: Option<&BTreeMap<String, Quantity>>,
    b: Option<&BTreeMap<String, Quantity>>,
) -> bool {
    let empty = BTreeMap::new();
    let (a, b) = (a.unwrap_or(&empty), b.unwrap_or(&empty));
    a.len() == b.len()
        && a.iter()
            .all(|(name, q)| b.get(name).is_some_and(|r| amount(q) == amount(r)))
}

/// Whether two containers' resources are the same (requests and limits, semantically).
pub(crate) fn same_resources(a: &ResourceRequirements, b: &ResourceRequirements) -> bool {
    same_list(a.requests.as_ref(), b.requests.as_ref())
        && same_list(a.limits.as_ref(), b.limits.as_ref())
}

/// Whether the spec's resources differ from the allocation's, for a container the
/// allocation knows (a container it does not know keeps its spec), or at pod level.
pub(crate) fn differs(pod: &Pod, allocation: &Allocation) -> bool {
    pod_level_differs(pod, allocation)
        || resizable(pod).any(|c| {
            allocation
                .containers
                .get(&c.name)
                .is_some_and(|a| !same_resources(&c.resources.clone().unwrap_or_default(), a))
        })
}

/// The pod with its resizable containers' and its pod-level resources replaced by the
/// allocation's (upstream's `updatePodFromAllocation`, `updatePodLevelResourcesFromAllocation`):
/// what the node runs, whatever the spec asks.
pub(crate) fn with_allocation(pod: &Pod, allocation: &Allocation) -> Pod {
    let mut out = pod.clone();
    let Some(spec) = out.spec.as_mut() else {
        return out;
    };
    if pod_level_differs(pod, allocation) {
        spec.resources = allocation
            .pod
            .clone()
            .filter(|r| r != &ResourceRequirements::default());
    }
    let inits = spec.init_containers.iter_mut().flatten();
    for c in spec.containers.iter_mut().chain(inits) {
        if let Some(a) = allocation.containers.get(&c.name) {
            c.resources = (a != &ResourceRequirements::default()).then(|| a.clone());
        }
    }
    out
}

/// Decides a resize: `pod` is the spec as the API server has it now, `allocation` what its
/// containers were allocated, `others` what the node's other admitted pods hold.
pub(crate) fn decide(
    pod: &Pod,
    allocation: &Allocation,
    node: &NodeInfo,
    others: &Usage,
) -> Verdict {
    if !differs(pod, allocation) {
        return Verdict::Unchanged;
    }
    let asked = pod_requests(pod, &|_| true);
    let capacity = &node.allocatable;
    if asked.memory_bytes > capacity.memory_bytes || asked.cpu_millis > capacity.cpu_millis {
        let (name, requested, capacity) = if asked.memory_bytes > capacity.memory_bytes {
            (MEMORY, asked.memory_bytes, capacity.memory_bytes)
        } else {
            (CPU, asked.cpu_millis, capacity.cpu_millis)
        };
        return Verdict::Pending(Pending {
            reason: INFEASIBLE,
            message: format!(
                "Node didn't have enough capacity: {name}, requested: {requested}, capacity: {capacity}"
            ),
        });
    }
    match admit_with_usage(pod, node, others) {
        Decision::Admit => Verdict::Allocate,
        Decision::Refuse(refusal) => Verdict::Pending(Pending {
            reason: DEFERRED,
            message: refusal.message,
        }),
    }
}

/// The `PodResizePending` condition for a pending resize, as upstream writes it (its
/// `observedGeneration` the pod's generation). The status keeps its transition time while it
/// stays.
pub(crate) fn pending_condition(pod: &Pod, pending: &Pending) -> PodCondition {
    PodCondition {
        type_: RESIZE_PENDING.to_string(),
        status: "True".to_string(),
        reason: Some(pending.reason.to_string()),
        message: Some(pending.message.clone()),
        observed_generation: pod.metadata.generation,
        ..Default::default()
    }
}

#[cfg(test)]
#[path = "resize_tests.rs"]
mod tests;
