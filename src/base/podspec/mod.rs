//! What a pod's spec means, computed the way upstream computes it: its identity and origin,
//! QoS class, resources and quantities, named ports, sysctls, AppArmor settings, eviction thresholds and
//! label rules. Several layers ask (the runtime manager, status, probes, volumes, cgroups,
//! admission, eviction); it depends on nothing else of Deckhand, so any of them can.

pub(crate) mod active_deadline;
pub(crate) mod apparmor;
pub(crate) mod ephemeral;
pub(crate) mod expand;
pub(crate) mod item_path;
pub(crate) mod labels;
pub(crate) mod origin;
pub(crate) mod pod;
pub(crate) mod pod_level;
pub(crate) mod ports;
pub(crate) mod qos;
pub mod quantity;
pub(crate) mod readiness_gates;
pub(crate) mod resources;
pub(crate) mod restart;
pub(crate) mod spec_hash;
pub(crate) mod sysctl;
pub mod threshold;

pub use pod::{RestartPolicy, full_name, is_sidecar};
pub(crate) use pod::{init_and_app_containers, spec_init_and_app_containers};
pub use qos::{QosClass, qos_class};
