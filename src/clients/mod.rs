//! Layer 1: the clients of the systems outside Deckhand: containerd over CRI v1 ([`cri`], with
//! the one shared in-memory fake the unit tests use) and the Kubernetes API server
//! ([`apiserver`]: connections, rate limits, retries), and the HTTP(S) GETs to a pod's address
//! that `httpGet` probes and lifecycle hooks send ([`pod_http`]). Nothing here knows about
//! pods' desired state; the managers above decide what to ask.

pub mod apiserver;
pub mod cri;
pub(crate) mod pod_http;
