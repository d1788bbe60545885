//! Layer 0: helpers that every other layer needs and that need nothing of Deckhand's own
//! beyond this layer: what a pod's spec means, the names and labels Deckhand writes, bounded
//! YAML, the runtime's view of a pod, the queue of pods to look at again, named health checks,
//! the metric families, the supervisor of background tasks and the one clock.

pub(crate) mod clock;
pub mod cri_labels;
pub mod health;
pub(crate) mod metrics;
pub(crate) mod node_pressure;
pub(crate) mod observed;
pub mod podspec;
pub(crate) mod restart_round;
pub(crate) mod resync_queue;
pub(crate) mod safe_names;
pub(crate) mod supervisor;
#[cfg(test)]
pub(crate) mod test_ca;
pub mod yaml;
