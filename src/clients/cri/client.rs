//! The real CRI client: tonic over the runtime's Unix socket.

use std::future::Future;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

use super::proto::image_service_client::ImageServiceClient;
use super::proto::runtime_service_client::RuntimeServiceClient;
use super::proto::*;
use super::pull_progress::content_proto::ListStatusesRequest;
use super::pull_progress::content_proto::content_client::ContentClient;
use super::pull_progress::{CRI_NAMESPACE, NAMESPACE_HEADER, PullProgress};
use super::service::{CriResult, ImageService, RuntimeService};
use super::{CriError, RuntimeEndpoint};
use crate::base::clock;

/// Upstream's limit for CRI messages; a node with many containers exceeds tonic's 4 MiB default.
const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;

/// One connection to a CRI runtime; cheap to clone (the channel is shared).
///
/// The channel reconnects by itself, so a runtime restart shows up as a few `Unavailable`
/// errors, not as a dead client.
#[derive(Clone)]
pub struct CriClient {
    runtime: RuntimeServiceClient<Channel>,
    image: ImageServiceClient<Channel>,
    /// containerd's content service on the same socket, only to watch pulls progress.
    content: ContentClient<Channel>,
    /// The connection itself, for the long-lived event subscriptions (`pleg::feed`).
    channel: Channel,
    timeout: Duration,
    endpoint: RuntimeEndpoint,
}

impl CriClient {
    /// Connects to `endpoint`, failing at once when nothing listens there.
    ///
    /// `timeout` is the deadline of each call (`runtimeRequestTimeout`).
    pub async fn connect(endpoint: &RuntimeEndpoint, timeout: Duration) -> Result<Self, CriError> {
        let channel = Self::endpoint(endpoint, timeout)?
            .connect()
            .await
            .map_err(|err| CriError::Connect {
                endpoint: endpoint.original.clone(),
                reason: error_chain(&err),
            })?;
        Ok(Self::from_channel(channel, endpoint, timeout))
    }

    /// Builds a client that connects on first use, for callers that handle an absent runtime
    /// themselves (the daemon keeps retrying while containerd restarts).
    pub fn connect_lazy(endpoint: &RuntimeEndpoint, timeout: Duration) -> Result<Self, CriError> {
        let channel = Self::endpoint(endpoint, timeout)?.connect_lazy();
        Ok(Self::from_channel(channel, endpoint, timeout))
    }

    fn endpoint(endpoint: &RuntimeEndpoint, _timeout: Duration) -> Result<Endpoint, CriError> {
        Endpoint::from_shared(endpoint.uri())
            .map(|e| e.connect_timeout(Duration::from_secs(5)))
            .map_err(|err| CriError::Endpoint {
                endpoint: endpoint.original.clone(),
                reason: err.to_string(),
            })
    }

    fn from_channel(channel: Channel, endpoint: &RuntimeEndpoint, timeout: Duration) -> Self {
        CriClient {
            runtime: RuntimeServiceClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            image: ImageServiceClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            content: ContentClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES),
            channel,
            timeout,
            endpoint: endpoint.clone(),
        }
    }

    /// `Exec`: the runtime's streaming URL for a command in a container (the node API
    /// proxies the client's upgraded connection to it).
    pub async fn exec(&self, req: ExecRequest) -> CriResult<String> {
        call("Exec", Some(self.timeout), self.runtime.clone().exec(req))
            .await
            .map(|r| r.url)
    }

    /// `Attach`: the streaming URL for a container's main process.
    pub async fn attach(&self, req: AttachRequest) -> CriResult<String> {
        call(
            "Attach",
            Some(self.timeout),
            self.runtime.clone().attach(req),
        )
        .await
        .map(|r| r.url)
    }

    /// `PortForward`: the streaming URL for ports in a pod's network namespace.
    pub async fn port_forward(&self, req: PortForwardRequest) -> CriResult<String> {
        call(
            "PortForward",
            Some(self.timeout),
            self.runtime.clone().port_forward(req),
        )
        .await
        .map(|r| r.url)
    }

    /// The endpoint this client talks to.
    pub fn endpoint_info(&self) -> &RuntimeEndpoint {
        &self.endpoint
    }

    /// The shared connection (reconnects by itself), for streams that outlive one call.
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// Another connection to the same endpoint, opened on first use; its I/O runs on the async
    /// runtime it is made in (the PLEG's event thread).
    pub fn new_connection(&self) -> Result<Channel, CriError> {
        Ok(Self::endpoint(&self.endpoint, self.timeout)?.connect_lazy())
    }

    /// The per-call deadline.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

/// Runs one call under a deadline, turning tonic's status into a [`CriError`] that names it.
async fn call<T>(
    method: &'static str,
    deadline: Option<Duration>,
    fut: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> CriResult<T> {
    let began = clock::instant();
    let result = match deadline {
        Some(timeout) => match tokio::time::timeout(timeout, fut).await {
            Ok(result) => result,
            Err(_) => {
                crate::base::metrics::record_runtime_call(method, began.elapsed(), false);
                return Err(CriError::Timeout { method, timeout });
            }
        },
        None => fut.await,
    };
    crate::base::metrics::record_runtime_call(method, began.elapsed(), result.is_ok());
    result
        .map(tonic::Response::into_inner)
        .map_err(|status| CriError::rpc(method, status))
}

/// Carries a call that changes the runtime through to its end on a task of its own, even when
/// the caller stops waiting (a sync abandoned because its pod is to be stopped). Dropping the
/// request would cancel containerd's own context half-way: a `StartContainer` cut short like
/// that left containerd 1.6 with a task it then refused to delete ("cannot delete running
/// task"), so the container and its sandbox stayed for good. The answer nobody waits for is
/// dropped; the next look at the pod sees what the call did.
async fn to_completion<T: Send + 'static>(
    method: &'static str,
    fut: impl Future<Output = CriResult<T>> + Send + 'static,
) -> CriResult<T> {
    tokio::spawn(fut).await.unwrap_or_else(|err| {
        Err(CriError::Rpc {
            method,
            code: tonic::Code::Aborted,
            message: format!("the call's task ended early: {err}"),
        })
    })
}

impl CriClient {
    /// One call that changes the runtime, with `deadline`, carried to its end by
    /// [`to_completion`]: `rpc` makes the request on a client of its own.
    async fn changing<T, Fut>(
        &self,
        method: &'static str,
        deadline: Duration,
        rpc: impl FnOnce(RuntimeServiceClient<Channel>) -> Fut + Send + 'static,
    ) -> CriResult<T>
    where
        T: Send + 'static,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>> + Send + 'static,
    {
        let client = self.runtime.clone();
        to_completion(method, async move {
            call(method, Some(deadline), rpc(client)).await
        })
        .await
    }
}

/// Flattens an error and its sources into one line ("transport error: No such file or directory").
pub(crate) fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        let next = inner.to_string();
        if !text.contains(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = inner.source();
    }
    text
}

impl RuntimeService for CriClient {
    async fn version(&self) -> CriResult<VersionResponse> {
        let req = VersionRequest {
            version: "v1".into(),
        };
        call(
            "Version",
            Some(self.timeout),
            self.runtime.clone().version(req),
        )
        .await
    }

    async fn status(&self, verbose: bool) -> CriResult<StatusResponse> {
        call(
            "Status",
            Some(self.timeout),
            self.runtime.clone().status(StatusRequest { verbose }),
        )
        .await
    }

    async fn run_pod_sandbox(&self, req: RunPodSandboxRequest) -> CriResult<RunPodSandboxResponse> {
        self.changing("RunPodSandbox", self.timeout, move |mut c| async move {
            c.run_pod_sandbox(req).await
        })
        .await
    }

    async fn stop_pod_sandbox(&self, pod_sandbox_id: String) -> CriResult<()> {
        let req = StopPodSandboxRequest { pod_sandbox_id };
        self.changing("StopPodSandbox", self.timeout, move |mut c| async move {
            c.stop_pod_sandbox(req).await
        })
        .await
        .map(drop)
    }

    async fn remove_pod_sandbox(&self, pod_sandbox_id: String) -> CriResult<()> {
        let req = RemovePodSandboxRequest { pod_sandbox_id };
        self.changing("RemovePodSandbox", self.timeout, move |mut c| async move {
            c.remove_pod_sandbox(req).await
        })
        .await
        .map(drop)
    }

    async fn pod_sandbox_status(
        &self,
        pod_sandbox_id: String,
    ) -> CriResult<PodSandboxStatusResponse> {
        let req = PodSandboxStatusRequest {
            pod_sandbox_id,
            verbose: false,
        };
        call(
            "PodSandboxStatus",
            Some(self.timeout),
            self.runtime.clone().pod_sandbox_status(req),
        )
        .await
    }

    async fn list_pod_sandbox(
        &self,
        filter: Option<PodSandboxFilter>,
    ) -> CriResult<Vec<PodSandbox>> {
        let req = ListPodSandboxRequest { filter };
        call(
            "ListPodSandbox",
            Some(self.timeout),
            self.runtime.clone().list_pod_sandbox(req),
        )
        .await
        .map(|r| r.items)
    }

    async fn create_container(&self, req: CreateContainerRequest) -> CriResult<String> {
        self.changing("CreateContainer", self.timeout, move |mut c| async move {
            c.create_container(req).await
        })
        .await
        .map(|r| r.container_id)
    }

    async fn start_container(&self, container_id: String) -> CriResult<()> {
        let req = StartContainerRequest { container_id };
        self.changing("StartContainer", self.timeout, move |mut c| async move {
            c.start_container(req).await
        })
        .await
        .map(drop)
    }

    async fn stop_container(&self, container_id: String, timeout_seconds: i64) -> CriResult<()> {
        let req = StopContainerRequest {
            container_id,
            timeout: timeout_seconds,
        };
        let deadline = self.timeout + Duration::from_secs(timeout_seconds.max(0) as u64);
        self.changing("StopContainer", deadline, move |mut c| async move {
            c.stop_container(req).await
        })
        .await
        .map(drop)
    }

    async fn remove_container(&self, container_id: String) -> CriResult<()> {
        let req = RemoveContainerRequest { container_id };
        self.changing("RemoveContainer", self.timeout, move |mut c| async move {
            c.remove_container(req).await
        })
        .await
        .map(drop)
    }

    async fn update_container_resources(
        &self,
        container_id: String,
        linux: LinuxContainerResources,
    ) -> CriResult<()> {
        let req = UpdateContainerResourcesRequest {
            container_id,
            linux: Some(linux),
            ..Default::default()
        };
        self.changing(
            "UpdateContainerResources",
            self.timeout,
            move |mut c| async move { c.update_container_resources(req).await },
        )
        .await
        .map(drop)
    }

    async fn list_containers(&self, filter: Option<ContainerFilter>) -> CriResult<Vec<Container>> {
        let req = ListContainersRequest { filter };
        call(
            "ListContainers",
            Some(self.timeout),
            self.runtime.clone().list_containers(req),
        )
        .await
        .map(|r| r.containers)
    }

    async fn container_status(&self, container_id: String) -> CriResult<ContainerStatusResponse> {
        let req = ContainerStatusRequest {
            container_id,
            verbose: false,
        };
        call(
            "ContainerStatus",
            Some(self.timeout),
            self.runtime.clone().container_status(req),
        )
        .await
    }

    async fn exec_sync(
        &self,
        container_id: String,
        cmd: Vec<String>,
        timeout_seconds: i64,
    ) -> CriResult<ExecSyncResponse> {
        let req = ExecSyncRequest {
            container_id,
            cmd,
            timeout: timeout_seconds,
        };
        let deadline = self.timeout + Duration::from_secs(timeout_seconds.max(0) as u64);
        call(
            "ExecSync",
            Some(deadline),
            self.runtime.clone().exec_sync(req),
        )
        .await
    }

    async fn reopen_container_log(&self, container_id: String) -> CriResult<()> {
        let req = ReopenContainerLogRequest { container_id };
        call(
            "ReopenContainerLog",
            Some(self.timeout),
            self.runtime.clone().reopen_container_log(req),
        )
        .await
        .map(drop)
    }

    async fn list_container_stats(
        &self,
        filter: Option<ContainerStatsFilter>,
    ) -> CriResult<Vec<ContainerStats>> {
        let req = ListContainerStatsRequest { filter };
        call(
            "ListContainerStats",
            Some(self.timeout),
            self.runtime.clone().list_container_stats(req),
        )
        .await
        .map(|r| r.stats)
    }
}

impl ImageService for CriClient {
    async fn image_status(&self, image: String) -> CriResult<Option<Image>> {
        let req = ImageStatusRequest {
            image: Some(ImageSpec {
                image,
                ..Default::default()
            }),
            verbose: false,
        };
        let resp = call(
            "ImageStatus",
            Some(self.timeout),
            self.image.clone().image_status(req),
        )
        .await?;
        Ok(resp.image.filter(|img| !img.id.is_empty()))
    }

    async fn pull_image(
        &self,
        image: String,
        auth: Option<AuthConfig>,
        sandbox_config: Option<PodSandboxConfig>,
    ) -> CriResult<String> {
        let req = PullImageRequest {
            image: Some(ImageSpec {
                image,
                ..Default::default()
            }),
            auth,
            sandbox_config,
        };
        // Pulls take as long as the network needs; upstream sets no deadline either.
        call("PullImage", None, self.image.clone().pull_image(req))
            .await
            .map(|r| r.image_ref)
    }

    async fn pull_progress(&self) -> Option<PullProgress> {
        let mut req = tonic::Request::new(ListStatusesRequest::default());
        req.metadata_mut()
            .insert(NAMESPACE_HEADER, CRI_NAMESPACE.parse().ok()?);
        match tokio::time::timeout(self.timeout, self.content.clone().list_statuses(req)).await {
            Ok(Ok(resp)) => Some(PullProgress::from_statuses(resp.into_inner().statuses)),
            Ok(Err(status)) => {
                tracing::debug!(code = ?status.code(), message = %status.message(), "the runtime's content service gives no pull progress");
                None
            }
            Err(_) => None,
        }
    }

    async fn list_images(&self) -> CriResult<Vec<Image>> {
        let req = ListImagesRequest { filter: None };
        call(
            "ListImages",
            Some(self.timeout),
            self.image.clone().list_images(req),
        )
        .await
        .map(|r| r.images)
    }

    async fn remove_image(&self, image: String) -> CriResult<()> {
        let req = RemoveImageRequest {
            image: Some(ImageSpec {
                image,
                ..Default::default()
            }),
        };
        call(
            "RemoveImage",
            Some(self.timeout),
            self.image.clone().remove_image(req),
        )
        .await
        .map(drop)
    }

    async fn image_fs_info(&self) -> CriResult<ImageFsInfoResponse> {
        call(
            "ImageFsInfo",
            Some(self.timeout),
            self.image.clone().image_fs_info(ImageFsInfoRequest {}),
        )
        .await
    }
}

#[cfg(test)]
mod completion_tests {
    use super::*;

    #[tokio::test]
    async fn a_call_that_changes_the_runtime_ends_even_when_nobody_waits_for_it() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let call = to_completion("StartContainer", async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let _ = tx.send(());
            Ok(())
        });
        // The caller gives up (its sync abandoned) long before the call is done.
        assert!(
            tokio::time::timeout(Duration::from_millis(5), call)
                .await
                .is_err()
        );
        tokio::time::timeout(Duration::from_secs(5), rx)
            .await
            .expect("the call ran to its end")
            .unwrap();
    }
}
