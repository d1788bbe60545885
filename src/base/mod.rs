//! Layer 0: helpers that every other layer needs and that need nothing of Deckhand's own
//! beyond this layer: what a pod's spec means, the names and labels Deckhand writes, bounded
//! YAML, the runtime's view of a pod, the queue of pods to look at again, named health checks,
//! the metric families, the supervisor of background tasks and the one clock.

pub(crate) mod clock;
pub mod cri_labels;
pub mod health;
pub mod metrics;
pub mod node_pressure;
pub mod observed;
pub mod podspec;
pub mod resync_queue;
pub mod safe_names;
pub mod supervisor;
#[cfg(test)]
pub(crate) mod test_ca;
pub mod yaml;
