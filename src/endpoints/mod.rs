//! Layer 4: the HTTP servers operators and the control plane query: the healthz port, the
//! read-only port and the local socket ([`read_only`]), and the authenticated node API on port
//! 10250 ([`node_api`]). They read what the managers publish and never drive a pod themselves.
//! [`listener`] is the connection machinery they share: classes, caps and timeouts.

pub(crate) mod listener;
pub mod node_api;
pub(crate) mod read_only;
