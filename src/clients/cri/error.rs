//! Errors from talking to the runtime, shaped so a log line says which call failed and why.

use std::time::Duration;

/// A failed conversation with the container runtime.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    /// The endpoint string cannot name a Unix socket.
    #[error("invalid container runtime endpoint {endpoint:?}: {reason}")]
    Endpoint { endpoint: String, reason: String },
    /// Nothing answered at the endpoint.
    #[error("cannot connect to the container runtime at {endpoint}: {reason}")]
    Connect { endpoint: String, reason: String },
    /// The runtime answered with a gRPC error.
    #[error("{method}: {code:?}: {message}")]
    Rpc {
        method: &'static str,
        code: tonic::Code,
        message: String,
    },
    /// The runtime did not answer within the call's deadline.
    #[error("{method}: no answer within {timeout:?}")]
    Timeout {
        method: &'static str,
        timeout: Duration,
    },
    /// An image pull received nothing for the whole progress deadline and was abandoned.
    #[error("PullImage: no progress for {deadline:?}; the pull was abandoned")]
    PullStalled { deadline: Duration },
    /// The runtime speaks another CRI version.
    #[error("the runtime at {endpoint} speaks CRI {version:?}; Deckhand needs v1")]
    Version { endpoint: String, version: String },
    /// The runtime did not report itself ready in time.
    #[error("the runtime at {endpoint} is not ready after {waited:?}: {reason}")]
    NotReady {
        endpoint: String,
        waited: Duration,
        reason: String,
    },
}

impl CriError {
    /// Builds the error for a failed call, keeping the gRPC code for callers that branch on it.
    pub fn rpc(method: &'static str, status: tonic::Status) -> Self {
        CriError::Rpc {
            method,
            code: status.code(),
            message: status.message().to_string(),
        }
    }

    /// True when the runtime said the object does not exist (already removed, never created).
    /// The gRPC code's name as upstream's metrics label it (`Unknown` when there is none).
    pub fn code_name(&self) -> String {
        match self {
            CriError::Rpc { code, .. } => format!("{code:?}"),
            CriError::Timeout { .. } => "DeadlineExceeded".into(),
            CriError::Connect { .. } => "Unavailable".into(),
            _ => "Unknown".into(),
        }
    }

    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            CriError::Rpc {
                code: tonic::Code::NotFound,
                ..
            }
        )
    }

    /// True when the runtime could not be reached at all (socket gone, runtime restarting).
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            CriError::Rpc {
                code: tonic::Code::Unavailable,
                ..
            } | CriError::Connect { .. }
                | CriError::Timeout { .. }
        )
    }
}
