//! An in-memory container runtime for unit tests of the layers above CRI (pod workers, the
//! executor, the sync loop).
//!
//! It keeps sandboxes and containers the way containerd reports them (labels, states, attempts),
//! records every call by method name, and can be scripted per method to fail, to panic, or to
//! hang until released. End-to-end tests use the real containerd; this fake exists so that the
//! worker's own rules (retry, cancellation, panics) can be tested in milliseconds under a paused
//! clock.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use super::proto::*;
use super::pull_progress::PullProgress;
use super::service::CriResult;
use super::{CriError, ImageService, RuntimeService};

/// What one scripted `ExecSync` answers (probes and hooks run commands through it).
#[derive(Clone, Debug)]
pub(crate) enum ExecReply {
    /// Exits with this code and this output.
    Exit(i32, &'static str),
    Fail(tonic::Code),
    /// Takes this long, then exits 0.
    Slow(std::time::Duration),
}

/// One `ExecSync` call: container ID, command, timeout in seconds.
pub(crate) type ExecCall = (String, Vec<String>, i64);

/// What a scripted method does on its next call.
#[derive(Clone, Debug)]
pub(crate) enum Script {
    /// Fails with this gRPC code.
    Fail(tonic::Code),
    /// Panics (a bug somewhere below the worker).
    Panic,
    /// Never answers until [`FakeCri::release`] is called.
    Hang,
}

#[derive(Default)]
struct State {
    next_id: u64,
    sandboxes: Vec<PodSandbox>,
    containers: Vec<Container>,
    /// The usage `ListContainerStats` reports per container ID (unset: none).
    container_stats: HashMap<String, ContainerStats>,
    images: HashSet<String>,
    /// What `ListImages` answers (empty unless a test sets it; image GC tests do).
    listed_images: Vec<Image>,
    /// What `ImageFsInfo` answers.
    image_fs: ImageFsInfoResponse,
    /// What a verbose `Status` carries in `info`.
    status_info: HashMap<String, String>,
    /// The log path `ContainerStatus` reports, by container ID.
    log_paths: HashMap<String, String>,
    progress: Option<PullProgress>,
    /// The image of every container created, in order.
    created: Vec<String>,
    /// The mounts of every container created, in order, by container name.
    created_mounts: Vec<(String, Vec<Mount>)>,
    calls: Vec<&'static str>,
    /// `UpdateContainerResources` calls: the container and its new resources.
    resource_updates: Vec<(String, LinuxContainerResources)>,
    /// Every PullImage's image and credential, in order (failed ones too).
    pull_auths: Vec<(String, Option<AuthConfig>)>,
    exec_replies: std::collections::VecDeque<ExecReply>,
    exec_calls: Vec<ExecCall>,
    stop_timeouts: Vec<i64>,
    /// The container of every `StopContainer` call, in order.
    stopped: Vec<String>,
    /// Scripted behaviour, consumed one per call, by method name.
    scripts: HashMap<&'static str, Vec<Script>>,
    /// The runtime is gone (stopped, restarting): every call fails as on a closed socket.
    down: bool,
}

/// The fake runtime; clones share one state.
#[derive(Clone, Default)]
pub(crate) struct FakeCri {
    state: Arc<Mutex<State>>,
    released: Arc<Notify>,
}

fn matches(labels: &HashMap<String, String>, selector: &HashMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

impl FakeCri {
    /// Makes a container's process exit with code 0 (an init container's end, a crash), as
    /// the runtime would report it afterwards.
    pub(crate) fn exit_container(&self, id: &str) {
        if let Some(c) = self.lock().containers.iter_mut().find(|c| c.id == id) {
            c.state = ContainerState::ContainerExited as i32;
        }
    }

    /// A runtime that has these images.
    pub(crate) fn with_images(images: &[&str]) -> Self {
        let fake = FakeCri::default();
        fake.lock().images = images.iter().map(|s| s.to_string()).collect();
        fake
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A runtime whose `ExecSync` answers with `replies` in order (then exits 0).
    pub(crate) fn with_exec(replies: Vec<ExecReply>) -> Self {
        let fake = FakeCri::default();
        fake.lock().exec_replies = replies.into();
        fake
    }

    /// Every `ExecSync` call so far.
    pub(crate) fn exec_calls(&self) -> Vec<ExecCall> {
        self.lock().exec_calls.clone()
    }

    /// Makes the next call of `method` behave as `script` (several queue up in order).
    pub(crate) fn script(&self, method: &'static str, script: Script) {
        self.lock().scripts.entry(method).or_default().push(script);
    }

    /// What `pull_progress` reports from now on.
    pub(crate) fn set_progress(&self, progress: Option<PullProgress>) {
        self.lock().progress = progress;
    }

    /// What `ListImages` answers from now on (`RemoveImage` takes an image out by ID).
    pub(crate) fn set_listed_images(&self, images: Vec<Image>) {
        self.lock().listed_images = images;
    }

    /// The images `ListImages` would answer now.
    pub(crate) fn listed_images(&self) -> Vec<Image> {
        self.lock().listed_images.clone()
    }

    /// What `ImageFsInfo` answers from now on.
    pub(crate) fn set_image_fs(&self, info: ImageFsInfoResponse) {
        self.lock().image_fs = info;
    }

    /// What a verbose `Status` answers in `info` from now on (containerd's `config`, ...).
    pub(crate) fn set_status_info(&self, key: &str, value: &str) {
        self.lock().status_info.insert(key.into(), value.into());
    }

    /// The log path `ContainerStatus` reports for the container from now on.
    pub(crate) fn set_log_path(&self, id: &str, path: &str) {
        self.lock().log_paths.insert(id.into(), path.into());
    }

    /// Puts a container in, as a relist would find it (GC and rotation tests).
    /// What `ListContainerStats` reports of the container `id`.
    pub(crate) fn set_container_stats(&self, id: &str, stats: ContainerStats) {
        self.lock().container_stats.insert(id.to_string(), stats);
    }

    pub(crate) fn add_container(&self, container: Container) {
        self.lock().containers.push(container);
    }

    /// Puts a sandbox in, as a relist would find it.
    pub(crate) fn add_sandbox(&self, sandbox: PodSandbox) {
        self.lock().sandboxes.push(sandbox);
    }

    /// Lets every hanging call go on.
    pub(crate) fn release(&self) {
        self.released.notify_waiters();
    }

    /// The timeout of every `StopContainer` call so far, in order.
    pub(crate) fn stop_timeouts(&self) -> Vec<i64> {
        self.lock().stop_timeouts.clone()
    }

    /// The container of every `StopContainer` call so far, in order.
    pub(crate) fn stopped(&self) -> Vec<String> {
        self.lock().stopped.clone()
    }

    /// The methods called so far, in order.
    /// Every PullImage's image and credential, in order.
    pub(crate) fn pull_auths(&self) -> Vec<(String, Option<AuthConfig>)> {
        self.lock().pull_auths.clone()
    }

    /// The `UpdateContainerResources` calls, in order.
    pub(crate) fn resource_updates(&self) -> Vec<(String, LinuxContainerResources)> {
        self.lock().resource_updates.clone()
    }

    pub(crate) fn calls(&self) -> Vec<&'static str> {
        self.lock().calls.clone()
    }

    /// The image of every container created so far, in order.
    pub(crate) fn created_images(&self) -> Vec<String> {
        self.lock().created.clone()
    }

    /// The mounts of every container created so far, in order, with the container's name.
    pub(crate) fn created_mounts(&self) -> Vec<(String, Vec<Mount>)> {
        self.lock().created_mounts.clone()
    }

    /// How often `method` was called.
    pub(crate) fn count(&self, method: &str) -> usize {
        self.lock().calls.iter().filter(|m| **m == method).count()
    }

    /// The sandboxes the runtime holds now.
    pub(crate) fn sandboxes(&self) -> Vec<PodSandbox> {
        self.lock().sandboxes.clone()
    }

    /// The containers the runtime holds now.
    pub(crate) fn containers(&self) -> Vec<Container> {
        self.lock().containers.clone()
    }

    /// Takes the runtime away (`true`: every call fails `Unavailable`, as while containerd
    /// restarts) or brings it back.
    pub(crate) fn set_down(&self, down: bool) {
        self.lock().down = down;
    }

    /// Records the call and runs its script, if any.
    async fn enter(&self, method: &'static str) -> CriResult<()> {
        let script = {
            let mut st = self.lock();
            st.calls.push(method);
            if st.down {
                return Err(CriError::Rpc {
                    method,
                    code: tonic::Code::Unavailable,
                    message: "the runtime is down".into(),
                });
            }
            st.scripts.get_mut(method).and_then(|q| {
                if q.is_empty() {
                    None
                } else {
                    Some(q.remove(0))
                }
            })
        };
        match script {
            None => Ok(()),
            Some(Script::Fail(code)) => Err(CriError::Rpc {
                method,
                code,
                message: "scripted failure".into(),
            }),
            Some(Script::Panic) => panic!("scripted panic in {method}"),
            Some(Script::Hang) => {
                self.released.notified().await;
                Ok(())
            }
        }
    }

    fn new_id(&self, prefix: &str) -> String {
        let mut st = self.lock();
        st.next_id += 1;
        format!("{prefix}{}", st.next_id)
    }

    fn not_found(method: &'static str, id: &str) -> CriError {
        CriError::Rpc {
            method,
            code: tonic::Code::NotFound,
            message: format!("{id} not found"),
        }
    }
}

impl RuntimeService for FakeCri {
    async fn version(&self) -> CriResult<VersionResponse> {
        self.enter("Version").await?;
        Ok(VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "fake".into(),
            runtime_version: "0".into(),
            runtime_api_version: "v1".into(),
        })
    }

    async fn status(&self, verbose: bool) -> CriResult<StatusResponse> {
        self.enter("Status").await?;
        let info = if verbose {
            self.lock().status_info.clone()
        } else {
            HashMap::new()
        };
        Ok(StatusResponse {
            info,
            ..Default::default()
        })
    }

    async fn run_pod_sandbox(&self, req: RunPodSandboxRequest) -> CriResult<RunPodSandboxResponse> {
        self.enter("RunPodSandbox").await?;
        let config = req.config.unwrap_or_default();
        let id = self.new_id("sb");
        self.lock().sandboxes.push(PodSandbox {
            id: id.clone(),
            metadata: config.metadata.clone(),
            state: PodSandboxState::SandboxReady as i32,
            created_at: 1,
            labels: config.labels.clone(),
            annotations: config.annotations.clone(),
            runtime_handler: String::new(),
        });
        Ok(RunPodSandboxResponse { pod_sandbox_id: id })
    }

    async fn stop_pod_sandbox(&self, id: String) -> CriResult<()> {
        self.enter("StopPodSandbox").await?;
        let mut st = self.lock();
        for c in st.containers.iter_mut().filter(|c| c.pod_sandbox_id == id) {
            c.state = ContainerState::ContainerExited as i32;
        }
        if let Some(s) = st.sandboxes.iter_mut().find(|s| s.id == id) {
            s.state = PodSandboxState::SandboxNotready as i32;
        }
        Ok(())
    }

    async fn remove_pod_sandbox(&self, id: String) -> CriResult<()> {
        self.enter("RemovePodSandbox").await?;
        let mut st = self.lock();
        st.containers.retain(|c| c.pod_sandbox_id != id);
        st.sandboxes.retain(|s| s.id != id);
        Ok(())
    }

    async fn pod_sandbox_status(&self, id: String) -> CriResult<PodSandboxStatusResponse> {
        self.enter("PodSandboxStatus").await?;
        let st = self.lock();
        let sb = st
            .sandboxes
            .iter()
            .find(|s| s.id == id)
            .ok_or_else(|| Self::not_found("PodSandboxStatus", &id))?;
        Ok(PodSandboxStatusResponse {
            status: Some(PodSandboxStatus {
                id: sb.id.clone(),
                metadata: sb.metadata.clone(),
                state: sb.state,
                created_at: sb.created_at,
                network: Some(PodSandboxNetworkStatus {
                    ip: "10.0.0.2".into(),
                    ..Default::default()
                }),
                labels: sb.labels.clone(),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    async fn list_pod_sandbox(&self, f: Option<PodSandboxFilter>) -> CriResult<Vec<PodSandbox>> {
        self.enter("ListPodSandbox").await?;
        let selector = f.map(|f| f.label_selector).unwrap_or_default();
        Ok(self
            .lock()
            .sandboxes
            .iter()
            .filter(|s| matches(&s.labels, &selector))
            .cloned()
            .collect())
    }

    async fn create_container(&self, req: CreateContainerRequest) -> CriResult<String> {
        self.enter("CreateContainer").await?;
        let config = req.config.unwrap_or_default();
        let id = self.new_id("c");
        let image = config
            .image
            .as_ref()
            .map(|i| i.image.clone())
            .unwrap_or_default();
        let mut st = self.lock();
        st.created.push(image);
        let name = config.metadata.as_ref().map(|m| m.name.clone());
        st.created_mounts
            .push((name.unwrap_or_default(), config.mounts.clone()));
        st.containers.push(Container {
            id: id.clone(),
            pod_sandbox_id: req.pod_sandbox_id,
            metadata: config.metadata.clone(),
            image: config.image.clone(),
            image_ref: "sha256:fake".into(),
            state: ContainerState::ContainerCreated as i32,
            created_at: 1,
            labels: config.labels.clone(),
            annotations: config.annotations.clone(),
            ..Default::default()
        });
        Ok(id)
    }

    async fn start_container(&self, id: String) -> CriResult<()> {
        self.enter("StartContainer").await?;
        let mut st = self.lock();
        let c = st
            .containers
            .iter_mut()
            .find(|c| c.id == id)
            .ok_or_else(|| Self::not_found("StartContainer", &id))?;
        c.state = ContainerState::ContainerRunning as i32;
        Ok(())
    }

    async fn update_container_resources(
        &self,
        id: String,
        linux: LinuxContainerResources,
    ) -> CriResult<()> {
        self.enter("UpdateContainerResources").await?;
        let mut st = self.lock();
        if !st.containers.iter().any(|c| c.id == id) {
            return Err(Self::not_found("UpdateContainerResources", &id));
        }
        st.resource_updates.push((id, linux));
        Ok(())
    }

    async fn stop_container(&self, id: String, timeout: i64) -> CriResult<()> {
        self.enter("StopContainer").await?;
        let mut st = self.lock();
        st.stop_timeouts.push(timeout);
        st.stopped.push(id.clone());
        if let Some(c) = st.containers.iter_mut().find(|c| c.id == id) {
            c.state = ContainerState::ContainerExited as i32;
        }
        Ok(())
    }

    async fn remove_container(&self, id: String) -> CriResult<()> {
        self.enter("RemoveContainer").await?;
        self.lock().containers.retain(|c| c.id != id);
        Ok(())
    }

    async fn list_containers(&self, f: Option<ContainerFilter>) -> CriResult<Vec<Container>> {
        self.enter("ListContainers").await?;
        let state = f.as_ref().and_then(|f| f.state.as_ref()).map(|s| s.state);
        let sandbox = f
            .as_ref()
            .map(|f| f.pod_sandbox_id.clone())
            .unwrap_or_default();
        let selector = f.map(|f| f.label_selector).unwrap_or_default();
        Ok(self
            .lock()
            .containers
            .iter()
            .filter(|c| sandbox.is_empty() || c.pod_sandbox_id == sandbox)
            .filter(|c| matches(&c.labels, &selector))
            .filter(|c| state.is_none_or(|s| c.state == s))
            .cloned()
            .collect())
    }

    async fn container_status(&self, id: String) -> CriResult<ContainerStatusResponse> {
        self.enter("ContainerStatus").await?;
        let st = self.lock();
        let c = st
            .containers
            .iter()
            .find(|c| c.id == id)
            .ok_or_else(|| Self::not_found("ContainerStatus", &id))?;
        Ok(ContainerStatusResponse {
            status: Some(ContainerStatus {
                id: c.id.clone(),
                metadata: c.metadata.clone(),
                state: c.state,
                created_at: c.created_at,
                started_at: 2,
                image: c.image.clone(),
                image_ref: c.image_ref.clone(),
                labels: c.labels.clone(),
                annotations: c.annotations.clone(),
                log_path: st.log_paths.get(&id).cloned().unwrap_or_default(),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    async fn exec_sync(
        &self,
        container_id: String,
        cmd: Vec<String>,
        timeout_seconds: i64,
    ) -> CriResult<ExecSyncResponse> {
        self.enter("ExecSync").await?;
        let reply = {
            let mut st = self.lock();
            st.exec_calls.push((container_id, cmd, timeout_seconds));
            st.exec_replies
                .pop_front()
                .unwrap_or(ExecReply::Exit(0, ""))
        };
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

    async fn reopen_container_log(&self, id: String) -> CriResult<()> {
        self.enter("ReopenContainerLog").await?;
        let st = self.lock();
        match st.containers.iter().find(|c| c.id == id) {
            Some(c) if c.state == ContainerState::ContainerRunning as i32 => Ok(()),
            Some(_) => Err(CriError::Rpc {
                method: "ReopenContainerLog",
                code: tonic::Code::FailedPrecondition,
                message: "container is not running".into(),
            }),
            None => Err(Self::not_found("ReopenContainerLog", &id)),
        }
    }

    /// Every container that matches, with the usage a test set (`set_container_stats`) or
    /// none.
    async fn list_container_stats(
        &self,
        f: Option<ContainerStatsFilter>,
    ) -> CriResult<Vec<ContainerStats>> {
        self.enter("ListContainerStats").await?;
        let st = self.lock();
        let selector = f
            .as_ref()
            .map(|f| f.label_selector.clone())
            .unwrap_or_default();
        let id = f.map(|f| f.id).unwrap_or_default();
        Ok(st
            .containers
            .iter()
            .filter(|c| matches(&c.labels, &selector))
            .filter(|c| id.is_empty() || c.id == id)
            .map(|c| {
                let mut stats = st.container_stats.get(&c.id).cloned().unwrap_or_default();
                stats.attributes = Some(ContainerAttributes {
                    id: c.id.clone(),
                    metadata: c.metadata.clone(),
                    labels: c.labels.clone(),
                    annotations: c.annotations.clone(),
                });
                stats
            })
            .collect())
    }
}

impl ImageService for FakeCri {
    async fn image_status(&self, image: String) -> CriResult<Option<Image>> {
        self.enter("ImageStatus").await?;
        Ok(self.lock().images.contains(&image).then(|| Image {
            id: format!("sha256:{image}"),
            repo_tags: vec![image.clone()],
            ..Default::default()
        }))
    }

    async fn pull_image(
        &self,
        image: String,
        auth: Option<AuthConfig>,
        _sandbox_config: Option<PodSandboxConfig>,
    ) -> CriResult<String> {
        self.lock().pull_auths.push((image.clone(), auth));
        self.enter("PullImage").await?;
        self.lock().images.insert(image.clone());
        Ok(format!("sha256:{image}"))
    }

    async fn pull_progress(&self) -> Option<PullProgress> {
        self.lock().progress.clone()
    }

    async fn list_images(&self) -> CriResult<Vec<Image>> {
        self.enter("ListImages").await?;
        Ok(self.lock().listed_images.clone())
    }

    async fn remove_image(&self, image: String) -> CriResult<()> {
        self.enter("RemoveImage").await?;
        let mut st = self.lock();
        st.images.remove(&image);
        st.listed_images.retain(|i| i.id != image);
        Ok(())
    }

    async fn image_fs_info(&self) -> CriResult<ImageFsInfoResponse> {
        self.enter("ImageFsInfo").await?;
        Ok(self.lock().image_fs.clone())
    }
}
