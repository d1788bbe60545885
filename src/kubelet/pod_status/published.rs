//! The pods Deckhand runs and their latest computed status, shared with the HTTP endpoints.
//!
//! Pod workers publish here after every sync; readers take a snapshot. One lock, held only to
//! copy a map entry in or out, never across an await.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use k8s_openapi::List;
use k8s_openapi::api::core::v1::{Pod, PodStatus};

/// Each pod with its latest status, by UID.
type StatesByUid = BTreeMap<String, (Arc<Pod>, PodStatus)>;

/// Desired pod plus status, by UID.
#[derive(Clone, Default)]
pub struct PodStates {
    inner: Arc<RwLock<StatesByUid>>,
}

impl PodStates {
    /// Records the newest status of a pod.
    pub fn publish(&self, pod: Arc<Pod>, status: PodStatus) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.inner
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(uid, (pod, status));
    }

    /// Changes a pod's published status in place (under the lock, so no publish comes in
    /// between); true when `change` says it changed it.
    pub(crate) fn update(
        &self,
        uid: &str,
        change: impl FnOnce(&Pod, &mut PodStatus) -> bool,
    ) -> bool {
        let mut map = self.inner.write().unwrap_or_else(|e| e.into_inner());
        map.get_mut(uid)
            .is_some_and(|(pod, status)| change(pod, status))
    }

    /// Forgets a pod that is gone from the node.
    pub fn forget(&self, uid: &str) {
        self.inner
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(uid);
    }

    /// The last published status of a pod.
    pub fn status(&self, uid: &str) -> Option<PodStatus> {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(uid)
            .map(|(_, s)| s.clone())
    }

    /// The UIDs whose last published phase is terminal (`Succeeded` or `Failed`): pods that
    /// no longer hold anything of the node, which admission leaves out.
    pub fn finished(&self) -> std::collections::HashSet<String> {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|(_, (_, s))| matches!(s.phase.as_deref(), Some("Succeeded" | "Failed")))
            .map(|(uid, _)| uid.clone())
            .collect()
    }

    /// A pod and its last published status.
    pub fn get(&self, uid: &str) -> Option<(Arc<Pod>, PodStatus)> {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(uid)
            .cloned()
    }

    /// The UIDs of every pod known.
    pub fn uids(&self) -> Vec<String> {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    /// Every pod with its status, as the read-only API's `/pods` serves them.
    pub fn pod_list(&self) -> List<Pod> {
        let map = self.inner.read().unwrap_or_else(|e| e.into_inner());
        let items = map
            .values()
            .map(|(pod, status)| {
                let mut pod = (**pod).clone();
                pod.status = Some(status.clone());
                pod
            })
            .collect();
        List {
            items,
            metadata: Default::default(),
        }
    }

    /// How many pods are known.
    pub fn len(&self) -> usize {
        self.inner.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
