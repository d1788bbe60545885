//! Layer 4: the HTTP servers operators and the control plane query: the healthz port, the
//! read-only port and the local socket ([`read_only`]), and the authenticated node API on port
//! 10250 ([`node_api`]). They read what the managers publish and never drive a pod themselves.
//! They are one HTTP stack: [`listener`] is the connection machinery they share (classes, caps
//! and timeouts), [`routes`] the pages they all serve (`/healthz`, `/pods`, `/stats/summary`,
//! `/metrics…`), built once and mounted by each, and [`stats`] the stats pages' answers.

pub(crate) mod listener;
pub mod node_api;
pub(crate) mod read_only;
pub(crate) mod routes;
pub(crate) mod stats;

#[cfg(test)]
mod pages_tests;
