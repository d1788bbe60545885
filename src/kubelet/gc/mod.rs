//! Housekeeping of the node's disk: container GC, image GC and container log rotation
//! (upstream's `kuberuntime_gc.go`, `image_gc_manager.go` and `container_log_manager.go`).
//!
//! Each concern has a pure decision (`containers`, `images`, `rotation`), table-tested, and a
//! small loop in `run` that lists the runtime through the CRI traits, asks the decision, and
//! carries it out (file work in `files`, on blocking threads). The loops start once from the
//! daemon and end with its cancellation token.

pub mod containers;
pub mod files;
pub(crate) mod images;
pub(crate) mod rotation;
pub mod run;

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

pub use containers::PodActivity;

/// Which pods have a worker, whether it is tearing its pod down, and whether its pod has
/// finished; written by the pod workers, read by the container GC so that it never races a
/// teardown and keeps a finished pod's containers (and logs) until the pod is deleted.
#[derive(Clone, Debug, Default)]
pub struct WorkerActivity {
    inner: Arc<RwLock<HashMap<String, PodActivity>>>,
}

impl WorkerActivity {
    /// Notes that the pod's worker exists and whether it is terminating. A finished pod stays
    /// finished until its teardown: later updates of it do not run it again.
    pub fn set(&self, uid: &str, terminating: bool) {
        let mut map = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let next = match (terminating, map.get(uid)) {
            (true, _) => PodActivity::Terminating,
            (false, Some(PodActivity::Finished)) => PodActivity::Finished,
            (false, _) => PodActivity::Active,
        };
        map.insert(uid.to_string(), next);
    }

    /// Notes that the pod has finished: its worker stopped it for good and keeps its exited
    /// containers. A teardown already asked for wins.
    pub fn finished(&self, uid: &str) {
        let mut map = self.inner.write().unwrap_or_else(|e| e.into_inner());
        if let Some(a) = map.get_mut(uid)
            && *a == PodActivity::Active
        {
            *a = PodActivity::Finished;
        }
    }

    /// Notes that the pod's worker has ended.
    pub fn forget(&self, uid: &str) {
        let mut map = self.inner.write().unwrap_or_else(|e| e.into_inner());
        map.remove(uid);
    }

    /// What the GC may do with the pod's runtime objects.
    pub fn activity(&self, uid: &str) -> PodActivity {
        let map = self.inner.read().unwrap_or_else(|e| e.into_inner());
        map.get(uid).copied().unwrap_or(PodActivity::Gone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_finished_pod_stays_finished_until_its_teardown() {
        let a = WorkerActivity::default();
        assert_eq!(a.activity("u"), PodActivity::Gone);
        a.finished("u");
        assert_eq!(
            a.activity("u"),
            PodActivity::Gone,
            "no worker, nothing finished"
        );
        a.set("u", false);
        assert_eq!(a.activity("u"), PodActivity::Active);
        a.finished("u");
        assert_eq!(a.activity("u"), PodActivity::Finished);
        a.set("u", false);
        assert_eq!(
            a.activity("u"),
            PodActivity::Finished,
            "an update does not revive it"
        );
        a.set("u", true);
        assert_eq!(a.activity("u"), PodActivity::Terminating);
        a.finished("u");
        assert_eq!(
            a.activity("u"),
            PodActivity::Terminating,
            "the teardown wins"
        );
        a.forget("u");
        assert_eq!(a.activity("u"), PodActivity::Gone);
    }
}
