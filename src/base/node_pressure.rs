//! The node pressure conditions in effect (memory, disk, PIDs): the eviction manager sets
//! them after each round; the node status reports them and admission refuses pods by them.
//! A shared value of its own, so that readers need nothing of the eviction manager.

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};

/// A node pressure condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub enum Condition {
    MemoryPressure,
    DiskPressure,
    #[serde(rename = "PIDPressure")]
    PidPressure,
}

impl Condition {
    /// The Node condition type.
    pub fn as_str(self) -> &'static str {
        match self {
            Condition::MemoryPressure => "MemoryPressure",
            Condition::DiskPressure => "DiskPressure",
            Condition::PidPressure => "PIDPressure",
        }
    }
}

/// The pressure conditions the manager reports now; cheap to clone, read by the node status
/// and by admission. Empty until the first round.
#[derive(Clone, Debug, Default)]
pub struct PressureView {
    inner: Arc<RwLock<BTreeSet<Condition>>>,
}

impl PressureView {
    pub fn conditions(&self) -> BTreeSet<Condition> {
        self.inner.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn has(&self, c: Condition) -> bool {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&c)
    }

    pub fn set(&self, conditions: BTreeSet<Condition>) {
        *self.inner.write().unwrap_or_else(|e| e.into_inner()) = conditions;
    }
}
