//! Talking to the Kubernetes API server: the client (from `--kubeconfig`, rate limited as
//! upstream's), and one-line descriptions of what went wrong.
//!
//! Only this module and the parts that use the API (`node`) know about the client; without
//! `--kubeconfig` nothing here runs and Deckhand is a standalone node agent.

pub mod connect;
pub mod problem;
pub mod rate_limit;
pub mod retry;

pub use connect::{ClientOptions, ConnectError, connect, connect_rotating};
pub use problem::{Problem, ProblemKind, ProblemLog};
