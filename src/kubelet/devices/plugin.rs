//! The gRPC side of the device manager: the `Registration` service on
//! `device-plugins/kubelet.sock`, and one client per registered plugin that runs its
//! `ListAndWatch` stream and answers `GetPreferredAllocation`, `Allocate` and
//! `PreStartContainer`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

use super::api::v1beta1::{
    DevicePluginOptions, Empty, RegisterRequest,
    device_plugin_client::DevicePluginClient,
    registration_server::{Registration, RegistrationServer},
};
use super::{Inner, table::Device};

/// The API version this node speaks (upstream's `SupportedVersions`).
pub(crate) const VERSION: &str = "v1beta1";
/// The registration socket's name in the device-plugins directory.
pub(crate) const KUBELET_SOCKET: &str = "kubelet.sock";
/// How long dialing a plugin may take (upstream's dial timeout).
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// How often the registration socket is checked for deletion.
const SOCKET_CHECK: Duration = Duration::from_secs(1);

/// A connected plugin.
#[derive(Clone)]
pub(crate) struct Plugin {
    pub client: DevicePluginClient<Channel>,
    pub options: DevicePluginOptions,
    /// Counts registrations, so that an old stream's end does not disconnect a newer one.
    pub generation: u64,
}

/// Why a registration is refused, in upstream's words (the plugin sees them).
#[derive(Debug, thiserror::Error)]
pub(crate) enum RegisterRefusal {
    #[error(
        "requested API version {0:?} is not supported by kubelet. Supported version is [{VERSION:?}]"
    )]
    Version(String),
    #[error("the ResourceName {0:?} is invalid")]
    ResourceName(String),
    #[error("the endpoint {0:?} is not a socket name in the device-plugins directory")]
    Endpoint(String),
}

/// Why a registered plugin could not be reached, in upstream's words.
#[derive(Debug, thiserror::Error)]
enum ConnectError {
    #[error("failed to dial device plugin: {0}")]
    Dial(String),
    #[error("failed to get device plugin options: {0}")]
    Options(String),
}

/// Checks a registration request as upstream does.
pub(crate) fn check_request(r: &RegisterRequest) -> Result<(), RegisterRefusal> {
    if r.version != VERSION {
        return Err(RegisterRefusal::Version(r.version.clone()));
    }
    if !is_extended_resource_name(&r.resource_name) {
        return Err(RegisterRefusal::ResourceName(r.resource_name.clone()));
    }
    if r.endpoint.is_empty()
        || r.endpoint.contains('/')
        || r.endpoint == "."
        || r.endpoint == ".."
        || r.endpoint == KUBELET_SOCKET
    {
        return Err(RegisterRefusal::Endpoint(r.endpoint.clone()));
    }
    Ok(())
}

/// Upstream's `IsExtendedResourceName`: domain-prefixed, outside `kubernetes.io`, not a quota
/// `requests.` name, and a qualified name once `requests.` is put before it.
pub(crate) fn is_extended_resource_name(name: &str) -> bool {
    let Some((prefix, short)) = name.split_once('/') else {
        return false;
    };
    if name.contains("kubernetes.io/") || name.starts_with("requests.") {
        return false;
    }
    let prefix = format!("requests.{prefix}");
    let dns_label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    let short_ok = !short.is_empty()
        && short.len() <= 63
        && short
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && short.as_bytes()[0].is_ascii_alphanumeric()
        && short.as_bytes()[short.len() - 1].is_ascii_alphanumeric();
    prefix.len() <= 253 && prefix.split('.').all(dns_label) && short_ok
}

/// Devices as the table keeps them.
pub(crate) fn devices_of(list: &[super::api::v1beta1::Device]) -> Vec<Device> {
    list.iter()
        .map(|d| Device {
            id: d.id.clone(),
            healthy: d.health == "Healthy",
            numa: d
                .topology
                .as_ref()
                .map(|t| t.nodes.iter().map(|n| n.id).collect())
                .unwrap_or_default(),
        })
        .collect()
}

/// The Registration service.
struct Registrar {
    inner: Arc<Inner>,
}

#[tonic::async_trait]
impl Registration for Registrar {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let r = request.into_inner();
        tracing::info!(resource = %r.resource_name, endpoint = %r.endpoint, version = %r.version, "device plugin registration request");
        if let Err(refusal) = check_request(&r) {
            tracing::warn!(resource = %r.resource_name, error = %refusal, "device plugin registration refused");
            return Err(Status::unknown(refusal.to_string()));
        }
        let socket = self.inner.dir.join(&r.endpoint);
        match connect(&socket).await {
            Ok((client, options)) => {
                let generation =
                    self.inner
                        .plugin_connected(&r.resource_name, client.clone(), options);
                tokio::spawn(list_and_watch(
                    self.inner.clone(),
                    r.resource_name,
                    client,
                    generation,
                ));
                Ok(Response::new(Empty {}))
            }
            Err(err) => {
                tracing::warn!(resource = %r.resource_name, error = %err, "cannot connect to the device plugin");
                Err(Status::unknown(err.to_string()))
            }
        }
    }
}

/// Dials the plugin and asks its options (upstream's `PluginConnected`).
async fn connect(
    socket: &Path,
) -> Result<(DevicePluginClient<Channel>, DevicePluginOptions), ConnectError> {
    let endpoint = Endpoint::from_shared(format!("unix://{}", socket.display()))
        .map_err(|e| ConnectError::Dial(e.to_string()))?
        .connect_timeout(DIAL_TIMEOUT);
    let channel = tokio::time::timeout(DIAL_TIMEOUT, endpoint.connect())
        .await
        .map_err(|_| ConnectError::Dial("timed out".into()))?
        .map_err(|e| ConnectError::Dial(e.to_string()))?;
    let mut client = DevicePluginClient::new(channel);
    let options = tokio::time::timeout(DIAL_TIMEOUT, client.get_device_plugin_options(Empty {}))
        .await
        .map_err(|_| ConnectError::Options("timed out".into()))?
        .map_err(|e| ConnectError::Options(e.message().to_string()))?
        .into_inner();
    Ok((client, options))
}

/// Runs the plugin's `ListAndWatch` until it ends; then the resource turns unhealthy unless
/// the plugin registered again meanwhile.
async fn list_and_watch(
    inner: Arc<Inner>,
    resource: String,
    mut client: DevicePluginClient<Channel>,
    generation: u64,
) {
    let result = async {
        let mut stream = client.list_and_watch(Empty {}).await?.into_inner();
        while let Some(answer) = stream.message().await? {
            inner.devices_reported(&resource, devices_of(&answer.devices));
        }
        Ok::<(), Status>(())
    }
    .await;
    match result {
        Ok(()) => {
            tracing::info!(resource = %resource, "device plugin ended its ListAndWatch stream")
        }
        Err(e) => {
            tracing::info!(resource = %resource, error = %e.message(), "device plugin's ListAndWatch stream broke")
        }
    }
    inner.plugin_gone(&resource, generation);
}

/// Removes the sockets in the directory (not the checkpoint, not other files), as upstream's
/// `CleanupPluginDirectory`: plugins see the new `kubelet.sock` and register again.
pub(crate) fn clean_directory(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        use std::os::unix::fs::FileTypeExt as _;
        if entry.file_type().is_ok_and(|t| t.is_socket())
            && let Err(e) = std::fs::remove_file(entry.path())
        {
            tracing::warn!(path = %entry.path().display(), error = %e, "cannot remove a stale device plugin socket");
        }
    }
}

/// Serves the Registration service on `kubelet.sock` and serves it again on a new socket when
/// someone deletes the file (plugins watch for its creation and register again).
pub(crate) async fn serve(inner: Arc<Inner>, stop: CancellationToken) {
    let path: PathBuf = inner.dir.join(KUBELET_SOCKET);
    loop {
        let _ = std::fs::remove_file(&path);
        let listener = match tokio::net::UnixListener::bind(&path) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(path = %path.display(), error = %e, "cannot listen on the device plugin registration socket");
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(SOCKET_CHECK) => continue,
                }
            }
        };
        tracing::info!(path = %path.display(), "device plugin registration server listening");
        let this = stop.child_token();
        let server = tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(Registrar {
                inner: inner.clone(),
            }))
            .serve_with_incoming_shutdown(
                super::authority::incoming(listener),
                this.clone().cancelled_owned(),
            );
        let task = tokio::spawn(server);
        loop {
            tokio::select! {
                () = stop.cancelled() => {
                    this.cancel();
                    let _ = task.await;
                    return;
                }
                () = tokio::time::sleep(SOCKET_CHECK) => {}
            }
            if !path.exists() {
                tracing::warn!(path = %path.display(), "the device plugin registration socket was deleted; serving it again");
                this.cancel();
                let _ = task.await;
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registration_requests_are_checked_as_upstream() {
        let ok = RegisterRequest {
            version: "v1beta1".into(),
            endpoint: "dp.1".into(),
            resource_name: "example.com/resource".into(),
            options: None,
        };
        assert!(check_request(&ok).is_ok());
        let cases: &[(&str, &str, &str, &str)] = &[
            (
                "v1alpha",
                "dp.1",
                "example.com/resource",
                "requested API version \"v1alpha\" is not supported by kubelet. Supported version is [\"v1beta1\"]",
            ),
            (
                "v1beta1",
                "dp.1",
                "resource",
                "the ResourceName \"resource\" is invalid",
            ),
            (
                "v1beta1",
                "dp.1",
                "kubernetes.io/gpu",
                "the ResourceName \"kubernetes.io/gpu\" is invalid",
            ),
            (
                "v1beta1",
                "dp.1",
                "requests.example.com/x",
                "the ResourceName \"requests.example.com/x\" is invalid",
            ),
            (
                "v1beta1",
                "../x",
                "example.com/resource",
                "not a socket name",
            ),
            (
                "v1beta1",
                "kubelet.sock",
                "example.com/resource",
                "not a socket name",
            ),
        ];
        for (version, endpoint, name, want) in cases {
            let r = RegisterRequest {
                version: version.to_string(),
                endpoint: endpoint.to_string(),
                resource_name: name.to_string(),
                options: None,
            };
            let err = check_request(&r).expect_err(name).to_string();
            assert!(err.contains(want), "{err}");
        }
    }

    #[test]
    fn extended_resource_names() {
        for good in ["example.com/resource", "nvidia.com/gpu", "a.b/c_d.e"] {
            assert!(is_extended_resource_name(good), "{good}");
        }
        for bad in [
            "cpu",
            "example.com/",
            "/x",
            "Example.com/x",
            "example.com/-x",
            "kubernetes.io/x",
            "x.kubernetes.io/y",
        ] {
            assert!(!is_extended_resource_name(bad), "{bad}");
        }
    }
}
