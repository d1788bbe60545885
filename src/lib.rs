//! Deckhand: a kubelet-compatible node agent that runs pods on containerd over CRI v1.
//!
//! The crate is built in layers, lowest first; a module uses its own layer's lower parts and
//! the layers below it, never one above (`tests/module_graph.rs` holds the tree to this):
//!
//! - [`base`]: plain helpers every layer needs (what a pod spec means, names, YAML, the
//!   runtime's view of a pod, the resync queue, health checks, metric families);
//! - [`clients`]: the outside systems Deckhand talks to (containerd over CRI, the API server);
//! - [`config`]: flags and `KubeletConfiguration`, validated into one [`config::Config`];
//! - [`kubelet`]: the managers, as upstream's `pkg/kubelet/<manager>`: sync loop, pod
//!   workers, PLEG, runtime, volumes, cgroups, probes, status, eviction, GC, node, …;
//! - [`endpoints`]: the HTTP servers (healthz, read-only port and local socket; the node API);
//! - [`app`]: what wires the agent together and the `deckhand` commands.
//!
//! `main.rs` only parses flags, builds a [`config::Config`] and hands it to [`app::daemon::run`].
//! `docs/architecture.md` walks through the layers and the flow of a pod.

// `pub(crate)` by default: an item is `pub` only when something outside the library (the
// binary, `tests/`, `benches/`, `fuzz/`) reaches it through a `pub` path; the compiler refuses
// any other `pub`.
#![deny(unreachable_pub)]

pub mod app;
pub mod base;
pub mod clients;
pub mod config;
pub mod endpoints;
pub mod kubelet;
