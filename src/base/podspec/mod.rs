//! Kubernetes helpers that several layers need (the runtime manager, status, probes, volumes,
//! cgroups): what a pod's spec means, computed the way upstream computes it. A leaf: it depends
//! on no other module of Deckhand, so every layer can use it without a cycle. (Named `k8s`, not
//! `kube`, so that it never shadows the `kube` client crate.)

pub mod expand;
pub mod labels;
pub mod pod;
pub mod qos;
pub mod quantity;
pub mod resources;
pub mod sysctl;
pub mod threshold;

pub use pod::{RestartPolicy, full_name, is_sidecar};
pub use qos::{QosClass, qos_class};
