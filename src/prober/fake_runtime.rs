//! A runtime for unit tests: `ExecSync` answers from a script, everything else is refused.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::cri::proto::*;
use crate::cri::service::CriResult;
use crate::cri::{CriError, RuntimeService};

/// What one scripted `ExecSync` does.
#[derive(Clone, Debug)]
pub enum ExecReply {
    Exit(i32, &'static str),
    Fail(tonic::Code),
    /// Takes this long, then exits 0.
    Slow(Duration),
}

/// One `ExecSync` call: container ID, command, timeout in seconds.
pub type ExecCall = (String, Vec<String>, i64);

#[derive(Clone, Default)]
pub struct FakeRuntime {
    pub replies: Arc<Mutex<VecDeque<ExecReply>>>,
    pub calls: Arc<Mutex<Vec<ExecCall>>>,
}

impl FakeRuntime {
    pub fn with(replies: Vec<ExecReply>) -> Self {
        FakeRuntime {
            replies: Arc::new(Mutex::new(replies.into())),
            calls: Arc::default(),
        }
    }
}

fn refused<T>(method: &'static str) -> CriResult<T> {
    Err(CriError::Rpc {
        method,
        code: tonic::Code::Unimplemented,
        message: "not in the fake".into(),
    })
}

impl RuntimeService for FakeRuntime {
    async fn version(&self) -> CriResult<VersionResponse> {
        refused("Version")
    }
    async fn status(&self, _verbose: bool) -> CriResult<StatusResponse> {
        refused("Status")
    }
    async fn run_pod_sandbox(
        &self,
        _req: RunPodSandboxRequest,
    ) -> CriResult<RunPodSandboxResponse> {
        refused("RunPodSandbox")
    }
    async fn stop_pod_sandbox(&self, _id: String) -> CriResult<()> {
        refused("StopPodSandbox")
    }
    async fn remove_pod_sandbox(&self, _id: String) -> CriResult<()> {
        refused("RemovePodSandbox")
    }
    async fn pod_sandbox_status(&self, _id: String) -> CriResult<PodSandboxStatusResponse> {
        refused("PodSandboxStatus")
    }
    async fn list_pod_sandbox(&self, _f: Option<PodSandboxFilter>) -> CriResult<Vec<PodSandbox>> {
        refused("ListPodSandbox")
    }
    async fn create_container(&self, _req: CreateContainerRequest) -> CriResult<String> {
        refused("CreateContainer")
    }
    async fn start_container(&self, _id: String) -> CriResult<()> {
        refused("StartContainer")
    }
    async fn stop_container(&self, _id: String, _t: i64) -> CriResult<()> {
        refused("StopContainer")
    }
    async fn remove_container(&self, _id: String) -> CriResult<()> {
        refused("RemoveContainer")
    }
    async fn list_containers(&self, _f: Option<ContainerFilter>) -> CriResult<Vec<Container>> {
        refused("ListContainers")
    }
    async fn container_status(&self, _id: String) -> CriResult<ContainerStatusResponse> {
        refused("ContainerStatus")
    }
    async fn exec_sync(
        &self,
        container_id: String,
        cmd: Vec<String>,
        timeout_seconds: i64,
    ) -> CriResult<ExecSyncResponse> {
        self.calls
            .lock()
            .unwrap()
            .push((container_id, cmd, timeout_seconds));
        let reply = self
            .replies
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(ExecReply::Exit(0, ""));
        match reply {
            ExecReply::Exit(code, out) => Ok(ExecSyncResponse {
                stdout: out.as_bytes().to_vec(),
                stderr: Vec::new(),
                exit_code: code,
            }),
            ExecReply::Fail(code) => Err(CriError::Rpc {
                method: "ExecSync",
                code,
                message: "scripted failure".into(),
            }),
            ExecReply::Slow(d) => {
                tokio::time::sleep(d).await;
                Ok(ExecSyncResponse::default())
            }
        }
    }
}
