//! The sync loop's side of in-place resize (upstream's allocation manager): it keeps what each
//! admitted pod was allocated, decides each resize the API server's spec asks for
//! ([`crate::kubelet::admission::resize::decide`]), and gives the workers the pod *as the node
//! runs it*: the spec with the allocation's resources, and in its `status.conditions` the
//! node's `PodResizePending` verdict, which the status computation copies into the status it
//! writes (upstream's status manager holds these conditions; here the pod carries them to its
//! worker, so no other state is shared). Deferred resizes are tried again on each housekeeping
//! tick (upstream: when pods leave, and every three minutes).

use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodStatus};

use super::{SyncLoop, deleting, uid_of};
use crate::base::podspec::full_name;
use crate::base::podspec::pod::phase_is_terminal;
use crate::clients::cri::{ImageService, RuntimeService};
use crate::kubelet::admission::allocation::Allocations;
use crate::kubelet::admission::resize::{
    self, DEFERRED, Pending, RESIZE_PENDING, Verdict, allocation_of, with_allocation,
};
use crate::kubelet::admission::{NodeInfo, Usage};

/// What the loop knows of resizes: the allocations, and the resizes not allocated yet (the
/// pod as its source last offered it, and why it waits).
#[derive(Default)]
pub(crate) struct Resizes {
    pub(super) allocations: Allocations,
    pub(super) pending: HashMap<String, (Arc<Pod>, Pending)>,
}

impl Resizes {
    pub(crate) fn new(allocations: Allocations) -> Resizes {
        Resizes {
            allocations,
            pending: HashMap::new(),
        }
    }
}

/// `pod` with the node's resize verdict as its only `PodResizePending` condition (none when
/// nothing waits).
fn with_verdict(mut pod: Pod, pending: Option<&Pending>) -> Pod {
    let condition = pending.map(|p| resize::pending_condition(&pod, p));
    let status = pod.status.get_or_insert_with(PodStatus::default);
    let conditions = status.conditions.get_or_insert_with(Vec::new);
    conditions.retain(|c| c.type_ != RESIZE_PENDING);
    conditions.extend(condition);
    pod
}

impl<R: RuntimeService + ImageService> SyncLoop<R> {
    /// Admission's view of a pod that may have been allocated before (an agent restarted
    /// with the pod running): the checkpointed allocation wins over the spec, as upstream's
    /// `AddPod`.
    pub(super) fn as_allocated(&self, pod: Arc<Pod>) -> Arc<Pod> {
        match self.resizes.allocations.get(&uid_of(&pod)) {
            Some(a) if resize::differs(&pod, a) => Arc::new(with_allocation(&pod, a)),
            _ => pod,
        }
    }

    /// Records the allocation of a pod just admitted as `admitted`.
    pub(super) fn allocate(&mut self, admitted: &Pod) {
        let uid = uid_of(admitted);
        self.resizes.allocations.set(&uid, allocation_of(admitted));
    }

    /// What the admitted pods other than `uid` hold, at their allocations.
    fn usage_without(&self, uid: &str) -> Usage {
        let finished = self.admission.states.finished();
        Usage::of(
            self.desired
                .iter()
                .filter(|(u, p)| *u != uid && !finished.contains(*u) && !phase_is_terminal(p))
                .map(|(_, p)| &**p),
        )
    }

    /// The pod a worker runs for `source`, the pod as its source offers it: a resize the spec
    /// asks for is decided here; allocated, the spec is what runs; pending, the allocation is.
    pub(super) fn resized(&mut self, source: Arc<Pod>) -> Arc<Pod> {
        let uid = uid_of(&source);
        let Some(allocation) = self.resizes.allocations.get(&uid).cloned() else {
            return Arc::new(with_verdict((*source).clone(), None));
        };
        if phase_is_terminal(&source) || deleting(&source) {
            // Nothing is resized on its way out; the allocation stays what runs.
            return Arc::new(with_allocation(&source, &allocation));
        }
        let node: NodeInfo = self.admission.node.current();
        let verdict = resize::decide(&source, &allocation, &node, &self.usage_without(&uid));
        let name = full_name(&source);
        match verdict {
            Verdict::Unchanged => {
                self.resizes.pending.remove(&uid);
                Arc::new(with_verdict((*source).clone(), None))
            }
            Verdict::Allocate => {
                tracing::info!(pod = %name, pod_uid = %uid, "pod resize allocated");
                self.resizes.allocations.set(&uid, allocation_of(&source));
                self.resizes.pending.remove(&uid);
                Arc::new(with_verdict((*source).clone(), None))
            }
            Verdict::Pending(p) => {
                let known = self.resizes.pending.get(&uid).map(|(_, was)| was);
                if known != Some(&p) {
                    tracing::info!(pod = %name, pod_uid = %uid, reason = p.reason, message = %p.message, "pod resize pending");
                }
                let runs = with_verdict(with_allocation(&source, &allocation), Some(&p));
                self.resizes.pending.insert(uid, (source, p));
                Arc::new(runs)
            }
        }
    }

    /// Decides each deferred resize again (the pods that left may have made room); a changed
    /// verdict reaches the pod's worker. Allocations of pods the loop no longer knows are
    /// forgotten.
    pub(crate) fn retry_deferred_resizes(&mut self) {
        let deferred: Vec<(Arc<Pod>, Pending)> = self
            .resizes
            .pending
            .values()
            .filter(|(_, p)| p.reason == DEFERRED)
            .cloned()
            .collect();
        for (source, was) in deferred {
            let uid = uid_of(&source);
            if !self.desired.contains_key(&uid) {
                self.resizes.pending.remove(&uid);
                continue;
            }
            let runs = self.resized(source);
            if self.resizes.pending.get(&uid).map(|(_, p)| p) != Some(&was) {
                self.start(runs);
            }
        }
        if self.sources_ready.all_ready() {
            let (desired, workers) = (&self.desired, &self.workers);
            self.resizes
                .allocations
                .retain(|uid| desired.contains_key(uid) || workers.has(uid));
        }
    }
}
