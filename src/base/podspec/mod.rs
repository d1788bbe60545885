//! What a pod's spec means, computed the way upstream computes it: its identity and origin,
//! QoS class, resources and quantities, named ports, sysctls, AppArmor settings, eviction thresholds and
//! label rules. Several layers ask (the runtime manager, status, probes, volumes, cgroups,
//! admission, eviction); it depends on nothing else of Deckhand, so any of them can.

pub mod apparmor;
pub mod expand;
pub mod item_path;
pub mod labels;
pub mod origin;
pub mod pod;
pub mod ports;
pub mod qos;
pub mod quantity;
pub mod resources;
pub mod spec_hash;
pub mod sysctl;
pub mod threshold;

pub use pod::{RestartPolicy, full_name, is_sidecar};
pub use qos::{QosClass, qos_class};
