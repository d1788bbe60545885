//! The eviction manager (upstream's `pkg/kubelet/eviction`): watches memory, disk, inodes and
//! PIDs, reports MemoryPressure / DiskPressure / PIDPressure, reclaims dead containers and
//! unused images under disk pressure, and when that is not enough evicts one pod per round.
//!
//! - [`signals`]: signals, resources, conditions, thresholds, quantity formatting.
//! - [`decide`]: every decision, pure and table-tested (thresholds met, grace periods,
//!   minimum reclaim, transition period, ranking, messages, admission).
//! - [`local_storage`]: the pods over their own ephemeral-storage limits or emptyDir
//!   `sizeLimit`s, evicted whatever the node's pressure (pure, table-tested).
//! - [`observe`]: the I/O behind small traits: the node's signals and pods' usage
//!   ([`observe::LiveObserver`], from the stats code of the node API), reclaiming through the
//!   GC passes, evicting through the sync loop.
//! - [`manager`]: the loop that runs a round every `evictionMonitoringPeriod` (10 s), and at
//!   once on a memory threshold notification ([`memcg`], cgroup v1, `kernelMemcgNotification`).
//!
//! Others see the manager through [`PressureView`] (node conditions, admission) and hand it
//! evictions through [`EvictRequest`]s that the sync loop carries out.

pub mod decide;
pub mod local_storage;
pub mod manager;
pub mod memcg;
pub mod observe;
pub mod signals;

#[cfg(test)]
mod tests;

use tokio::sync::oneshot;

pub use crate::base::node_pressure::{Condition, PressureView};
pub use decide::{Observation, Observations, REASON};
pub use signals::{Resource, Signal};

/// Upstream's `evictionMonitoringPeriod`.
pub const MONITORING_PERIOD: std::time::Duration = std::time::Duration::from_secs(10);

/// A pod to evict, handed to the sync loop: it stops the pod with `grace_seconds`, shows it
/// Failed with reason [`REASON`] and `message`, and answers on `done` once the pod's
/// containers are gone (or drops `done` when it does not have the pod).
#[derive(Debug)]
pub struct EvictRequest {
    pub uid: String,
    pub grace_seconds: i64,
    pub message: String,
    pub done: oneshot::Sender<()>,
}
