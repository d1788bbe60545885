//! Talking to the Kubernetes API server: the client (from `--kubeconfig`, rate limited as
//! upstream's), one-line descriptions of what went wrong, and the watches (kube's watcher
//! with the node's back-off and problem reports).
//!
//! Only this module and the parts that use the API (`node`) know about the client; without
//! `--kubeconfig` nothing here runs and Deckhand is a standalone node agent.

pub mod connect;
#[cfg(test)]
pub(crate) mod fake;
pub(crate) mod problem;
pub(crate) mod rate_limit;
pub(crate) mod retry;
pub(crate) mod watch;

pub use connect::{ClientOptions, ConnectError, connect, connect_rotating};
pub use problem::{Problem, ProblemKind, ProblemLog};

/// Delete parameters for a pod the node has finished with: grace 0 (its containers are
/// already stopped) and this UID only, so a pod of the same name made meanwhile is never hit.
/// Upstream's status manager and mirror client delete this way.
pub fn delete_exactly_now(uid: &str) -> kube::api::DeleteParams {
    kube::api::DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(kube::api::Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..Default::default()
    }
}
