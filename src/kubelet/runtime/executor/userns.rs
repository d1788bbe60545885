//! A pod's user namespace for its sandbox and containers (`kubelet::userns`), and upstream's
//! refusal when the runtime cannot make one.

use k8s_openapi::api::core::v1::Pod;

use crate::clients::cri::proto::UserNamespace;
use crate::clients::cri::{CriError, ImageService, RuntimeService};
use crate::kubelet::userns::{self, UsernsError, alloc};

use super::{Executor, pod_uid};

/// Why a pod gets no user namespace; the message of `FailedCreatePodSandBox`, in upstream's
/// words where upstream has them.
#[derive(Debug, thiserror::Error)]
pub(super) enum UsernsRefusal {
    #[error("can't set `spec.hostUsers: false`: user namespaces are not set up")]
    NotSetUp,
    #[error("can't set `spec.hostUsers: false`, runtime does not support user namespaces: {0}")]
    RuntimeStatus(CriError),
    /// The runtime's handler cannot make user namespaces (`alloc::runtime_refusal`'s text).
    #[error("{0}")]
    Runtime(String),
    #[error("the user namespace task failed: {0}")]
    Task(tokio::task::JoinError),
    #[error("{0}")]
    Mappings(UsernsError),
}

impl<R: RuntimeService + ImageService> Executor<R> {
    /// The pod's user-namespace options: the node's for a pod that shares the host's users
    /// (upstream passes them for every pod), its own mappings with `hostUsers: false`. When
    /// `new_sandbox`, the runtime is asked first whether its handler makes user namespaces.
    pub(super) async fn pod_userns(
        &self,
        pod: &Pod,
        new_sandbox: bool,
    ) -> Result<Option<UserNamespace>, UsernsRefusal> {
        let host_users = pod.spec.as_ref().and_then(|s| s.host_users).unwrap_or(true);
        let Some(manager) = self.node.userns.clone() else {
            return if host_users {
                Ok(None)
            } else {
                Err(UsernsRefusal::NotSetUp)
            };
        };
        if host_users {
            return Ok(Some(userns::node_mode()));
        }
        if new_sandbox {
            let handlers = match self.rt.status(false).await {
                Ok(status) => status.runtime_handlers,
                Err(err) => return Err(UsernsRefusal::RuntimeStatus(err)),
            };
            if let Some(refusal) = alloc::runtime_refusal(&handlers, "") {
                return Err(UsernsRefusal::Runtime(refusal));
            }
        }
        let uid = pod_uid(pod).to_string();
        tokio::task::spawn_blocking(move || manager.pod_mappings(&uid))
            .await
            .map_err(UsernsRefusal::Task)?
            .map(Some)
            .map_err(UsernsRefusal::Mappings)
    }
}
