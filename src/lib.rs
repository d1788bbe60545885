//! Deckhand: a kubelet-compatible node agent that runs pods on containerd over CRI v1.
//!
//! The library holds everything; `main.rs` only parses flags, builds a [`config::Config`] and
//! hands it to [`daemon::run`]. See the README for the module map.

pub mod admission;
pub mod api_objects;
pub mod apiserver;
pub mod certificate;
pub mod cli;
pub mod cm;
pub mod config;
pub mod credentials;
pub mod cri;
pub mod daemon;
pub mod events;
pub mod eviction;
pub mod gc;
pub mod health;
pub mod k8s;
pub mod logging;
pub mod memory;
pub mod metrics;
pub mod mirror_pods;
pub mod node;
pub mod node_api;
pub mod observed;
pub mod paths;
pub mod pleg;
pub mod pod_state;
pub mod pod_workers;
pub mod pokes;
pub mod prober;
pub mod runtime;
pub mod server;
pub mod shutdown;
pub mod source;
pub mod stats;
pub mod status;
pub mod status_sync;
pub mod sync_loop;
pub mod volume;
pub mod yaml;
