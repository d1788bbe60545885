//! The runtime manager: decide what a pod needs (pure), translate it for CRI (pure), carry it out.

pub mod actions;
pub mod backoff;
pub mod executor;
pub mod hooks;
pub mod hosts;
pub mod images;
pub mod inspect;
pub mod pod_files;
pub mod revisit;

pub mod termination_message;
pub mod translate;
