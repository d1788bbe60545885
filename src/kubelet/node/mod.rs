//! The node itself: its facts (CPUs, memory, addresses, identity), its capacity and
//! allocatable, and — with `--kubeconfig` — its membership of a cluster: the Node object,
//! its status and its Lease.
//!
//! - [`facts`]: what the machine is (I/O, cheap reads of /proc, /sys, /etc).
//! - [`allocatable`]: capacity and allocatable (pure).
//! - [`status`]: the Node status from a snapshot (pure), and whether it changed.
//! - [`registration`]: the Node to create, and how an existing one is reconciled (pure).
//! - [`lease`]: the Lease to create or renew (pure).
//! - [`api`]: the API calls, behind a trait.
//! - [`agent`]: the loops that register, update the status and renew the Lease.
//! - [`watch`]: a watch of the node's own Node, for admission (labels, taints).

pub(crate) mod agent;
pub(crate) mod allocatable;
pub(crate) mod api;
pub(crate) mod facts;
pub(crate) mod lease;
pub(crate) mod registration;
pub(crate) mod status;
pub(crate) mod watch;

pub(crate) use facts::{MachineFacts, detect_host_ip};
