//! The runtime manager: decide what a pod needs (pure), translate it for CRI (pure), carry it out.

pub(crate) mod actions;
pub(crate) mod backoff;
pub(crate) mod executor;
pub(crate) mod hooks;
pub(crate) mod hosts;
pub(crate) mod image_volumes;
pub(crate) mod images;
pub mod inspect;
pub(crate) mod pod_files;
pub(crate) mod resize;
pub(crate) mod revisit;

pub(crate) mod termination_message;
pub(crate) mod termination_order;
pub(crate) mod translate;
