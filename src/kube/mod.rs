//! Kubernetes helpers that several layers need (the runtime manager, status, probes, volumes,
//! cgroups): what a pod's spec means, computed the way upstream computes it. A leaf: it depends
//! on no other module of Deckhand, so every layer can use it without a cycle.

pub mod pod;

pub use pod::{RestartPolicy, full_name, is_sidecar};
