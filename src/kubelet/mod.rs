//! Layer 3: the managers that make up the node agent, one module each, as upstream's
//! `pkg/kubelet/<manager>`. The sync loop routes pod changes, runtime events and housekeeping
//! to one worker per pod; the workers drive the runtime manager (`runtime`), volumes, cgroups
//! (`cm`) and probes, and publish the pod's status. Beside them run the node's own loops:
//! node status and Lease, eviction, GC, graceful shutdown, mirror pods and events.
//!
//! Inside this layer the managers are ordered too (`tests/module_graph.rs` has the table): a
//! manager uses only those below it, so the pod workers may use the runtime manager but never
//! the other way round.

pub mod admission;
pub(crate) mod api_objects;
pub mod certificate;
pub mod cm;
pub(crate) mod devices;
pub(crate) mod dra;
pub mod events;
pub mod eviction;
pub mod gc;
pub(crate) mod mirror_pods;
pub(crate) mod node;
pub mod pleg;
pub(crate) mod plugin_watcher;
pub(crate) mod pod_status;
pub(crate) mod pod_workers;
pub mod prober;
pub(crate) mod pull_credentials;
pub mod runtime;
pub(crate) mod shutdown;
pub mod source;
pub(crate) mod stats;
pub(crate) mod sync_loop;
pub(crate) mod userns;
pub(crate) mod volume;
