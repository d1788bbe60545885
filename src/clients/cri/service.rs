//! The narrow traits through which Deckhand talks to a CRI runtime.
//!
//! They take and return the CRI messages themselves: the protocol is already the vocabulary of
//! this domain, and a second set of types would only add translation bugs. The real
//! implementation is [`super::CriClient`]; unit tests may supply their own.

use std::future::Future;

use super::CriError;
use super::proto::*;
use super::pull_progress::PullProgress;

/// Result of one CRI call.
pub(crate) type CriResult<T> = Result<T, CriError>;

/// Pod sandboxes and containers (`runtime.v1.RuntimeService`).
pub trait RuntimeService: Clone + Send + Sync + 'static {
    fn version(&self) -> impl Future<Output = CriResult<VersionResponse>> + Send;
    fn status(&self, verbose: bool) -> impl Future<Output = CriResult<StatusResponse>> + Send;
    fn run_pod_sandbox(
        &self,
        req: RunPodSandboxRequest,
    ) -> impl Future<Output = CriResult<RunPodSandboxResponse>> + Send;
    fn stop_pod_sandbox(
        &self,
        pod_sandbox_id: String,
    ) -> impl Future<Output = CriResult<()>> + Send;
    fn remove_pod_sandbox(
        &self,
        pod_sandbox_id: String,
    ) -> impl Future<Output = CriResult<()>> + Send;
    fn pod_sandbox_status(
        &self,
        pod_sandbox_id: String,
    ) -> impl Future<Output = CriResult<PodSandboxStatusResponse>> + Send;
    fn list_pod_sandbox(
        &self,
        filter: Option<PodSandboxFilter>,
    ) -> impl Future<Output = CriResult<Vec<PodSandbox>>> + Send;
    fn create_container(
        &self,
        req: CreateContainerRequest,
    ) -> impl Future<Output = CriResult<String>> + Send;
    fn start_container(&self, container_id: String) -> impl Future<Output = CriResult<()>> + Send;
    /// Stops with SIGTERM, then SIGKILL after `timeout_seconds`; the call's own deadline is
    /// extended by that much so a long grace period is not cut short.
    fn stop_container(
        &self,
        container_id: String,
        timeout_seconds: i64,
    ) -> impl Future<Output = CriResult<()>> + Send;
    fn remove_container(&self, container_id: String) -> impl Future<Output = CriResult<()>> + Send;
    /// Changes a running container's resources in place (in-place pod resize).
    fn update_container_resources(
        &self,
        container_id: String,
        linux: LinuxContainerResources,
    ) -> impl Future<Output = CriResult<()>> + Send;
    fn list_containers(
        &self,
        filter: Option<ContainerFilter>,
    ) -> impl Future<Output = CriResult<Vec<Container>>> + Send;
    fn container_status(
        &self,
        container_id: String,
    ) -> impl Future<Output = CriResult<ContainerStatusResponse>> + Send;
    fn exec_sync(
        &self,
        container_id: String,
        cmd: Vec<String>,
        timeout_seconds: i64,
    ) -> impl Future<Output = CriResult<ExecSyncResponse>> + Send;
    /// Asks the runtime to close the container's log file and open it again at its path
    /// (log rotation renamed the old one away). Only running containers can do it.
    fn reopen_container_log(
        &self,
        container_id: String,
    ) -> impl Future<Output = CriResult<()>> + Send;
    /// Resource usage of the containers the filter selects (`/stats/summary`,
    /// `/metrics/resource`): cumulative CPU, memory working set, writable layer.
    fn list_container_stats(
        &self,
        filter: Option<ContainerStatsFilter>,
    ) -> impl Future<Output = CriResult<Vec<ContainerStats>>> + Send;
}

/// Images (`runtime.v1.ImageService`).
pub trait ImageService: Clone + Send + Sync + 'static {
    /// `None` when the image is not present (containerd answers with an empty image, no error).
    fn image_status(&self, image: String) -> impl Future<Output = CriResult<Option<Image>>> + Send;
    /// Returns the image reference the runtime stored. `auth` is the registry credential to
    /// present (from the pod's pull secrets); it must never be logged.
    fn pull_image(
        &self,
        image: String,
        auth: Option<AuthConfig>,
        sandbox_config: Option<PodSandboxConfig>,
    ) -> impl Future<Output = CriResult<String>> + Send;
    fn list_images(&self) -> impl Future<Output = CriResult<Vec<Image>>> + Send;
    /// What the runtime shows of the image pulls in flight (for the pull progress deadline);
    /// `None` when it cannot say.
    fn pull_progress(&self) -> impl Future<Output = Option<PullProgress>> + Send;
    fn remove_image(&self, image: String) -> impl Future<Output = CriResult<()>> + Send;
    /// The filesystems that hold images, with what the images use on them (image GC).
    fn image_fs_info(&self) -> impl Future<Output = CriResult<ImageFsInfoResponse>> + Send;
}
