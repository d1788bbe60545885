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

/// Which pods have a worker, and whether it is tearing its pod down; written by the pod
/// workers, read by the container GC so that it never races a teardown.
#[derive(Clone, Debug, Default)]
pub struct WorkerActivity {
    /// UID → the worker is terminating its pod.
    inner: Arc<RwLock<HashMap<String, bool>>>,
}

impl WorkerActivity {
    /// Notes that the pod's worker exists and whether it is terminating.
    pub fn set(&self, uid: &str, terminating: bool) {
        let mut map = self.inner.write().unwrap_or_else(|e| e.into_inner());
        map.insert(uid.to_string(), terminating);
    }

    /// Notes that the pod's worker has finished.
    pub fn forget(&self, uid: &str) {
        let mut map = self.inner.write().unwrap_or_else(|e| e.into_inner());
        map.remove(uid);
    }

    /// What the GC may do with the pod's runtime objects.
    pub fn activity(&self, uid: &str) -> PodActivity {
        let map = self.inner.read().unwrap_or_else(|e| e.into_inner());
        match map.get(uid) {
            Some(true) => PodActivity::Terminating,
            Some(false) => PodActivity::Active,
            None => PodActivity::Gone,
        }
    }
}
