//! The pod-resources API (`podresources.v1`) on `<root-dir>/pod-resources/kubelet.sock`, as
//! upstream's `apis/podresources` serves it: `List` (the active pods), `Get` (one pod by
//! namespace and name), `GetAllocatableResources`; a token bucket of 100 requests a second
//! with a burst of 10 (`ResourceExhausted`, "rejected by rate limit" beyond it); the directory
//! made 0750 and the socket left at the process umask, as upstream's `CreateListener`.
//!
//! Devices come from the device plugin manager. With no CPU or memory manager policy (Deckhand
//! has neither) upstream reports no CPU IDs and no memory, for containers and in
//! `GetAllocatableResources`; so does this. `dynamic_resources` comes from the DRA manager
//! through [`Providers::dynamic`] (a function the daemon gives, as the DRA manager is a
//! manager of a higher tier), each prepared claim a container uses with all its devices.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Container, Pod};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::DeviceManager;
use super::api::podresources::{
    AllocatableResourcesRequest, AllocatableResourcesResponse, ContainerDevices,
    ContainerResources, DynamicResource, GetPodResourcesRequest, GetPodResourcesResponse,
    ListPodResourcesRequest, ListPodResourcesResponse, NumaNode, PodResources, TopologyInfo,
    pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer},
};
use crate::base::clock;

/// The directory under the root dir.
pub(crate) const DIR: &str = "pod-resources";
/// The socket's name in it.
pub(crate) const SOCKET: &str = "kubelet.sock";
/// Upstream's `DefaultQPS` and `DefaultBurstTokens`.
const QPS: f64 = 100.0;
const BURST: f64 = 10.0;

/// The node's pods: each with whether it is active (admitted and not finished).
pub(crate) type PodsProvider = Arc<dyn Fn() -> Vec<(Arc<Pod>, bool)> + Send + Sync>;

/// The DRA claims a container uses, as the pod-resources API lists them.
pub(crate) type DynamicProvider =
    Arc<dyn Fn(&Pod, &Container) -> Vec<DynamicResource> + Send + Sync>;

/// Where the answers come from.
#[derive(Clone)]
pub(crate) struct Providers {
    pub pods: PodsProvider,
    pub devices: DeviceManager,
    /// `None`: no DRA claims are listed.
    pub dynamic: Option<DynamicProvider>,
}

impl Providers {
    /// The DRA claims a container uses.
    fn dynamic(&self, pod: &Pod, container: &Container) -> Vec<DynamicResource> {
        self.dynamic
            .as_ref()
            .map(|f| f(pod, container))
            .unwrap_or_default()
    }
}

/// A token bucket: `rate` tokens a second up to `burst`.
#[derive(Debug)]
pub(crate) struct Bucket {
    tokens: f64,
    at: Instant,
    rate: f64,
    burst: f64,
}

impl Bucket {
    pub(crate) fn new(rate: f64, burst: f64, now: Instant) -> Bucket {
        Bucket {
            tokens: burst,
            at: now,
            rate,
            burst,
        }
    }

    /// Takes a token if there is one (upstream's `rate.Limiter.Allow`).
    pub(crate) fn allow(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.at = now;
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

struct Server {
    providers: Providers,
    bucket: Mutex<Bucket>,
}

impl Server {
    fn limit(&self) -> Result<(), Status> {
        let allowed = self
            .bucket
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .allow(clock::instant());
        if allowed {
            Ok(())
        } else {
            Err(Status::resource_exhausted("rejected by rate limit"))
        }
    }

    /// Sidecars (restartable init containers), then the app containers, as upstream lists them.
    fn pod_resources(&self, pod: &Pod) -> PodResources {
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let spec = pod.spec.clone().unwrap_or_default();
        let sidecars = spec
            .init_containers
            .iter()
            .flatten()
            .filter(|c| c.restart_policy.as_deref() == Some("Always"));
        let containers = sidecars
            .chain(spec.containers.iter())
            .map(|c| ContainerResources {
                name: c.name.clone(),
                devices: container_devices(self.providers.devices.devices_of(uid, &c.name)),
                cpu_ids: Vec::new(),
                memory: Vec::new(),
                dynamic_resources: self.providers.dynamic(pod, c),
            })
            .collect();
        PodResources {
            name: pod.metadata.name.clone().unwrap_or_default(),
            namespace: pod.metadata.namespace.clone().unwrap_or_default(),
            containers,
            cpu_ids: Vec::new(),
            memory: Vec::new(),
        }
    }
}

fn topology(numa: Vec<i64>) -> Option<TopologyInfo> {
    (!numa.is_empty()).then(|| TopologyInfo {
        nodes: numa.into_iter().map(|id| NumaNode { id }).collect(),
    })
}

fn container_devices(held: Vec<(String, Vec<String>, Vec<i64>)>) -> Vec<ContainerDevices> {
    held.into_iter()
        .map(|(resource_name, device_ids, numa)| ContainerDevices {
            resource_name,
            device_ids,
            topology: topology(numa),
        })
        .collect()
}

#[tonic::async_trait]
impl PodResourcesLister for Server {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        self.limit()?;
        let pod_resources = (self.providers.pods)()
            .iter()
            .filter(|(_, active)| *active)
            .map(|(pod, _)| self.pod_resources(pod))
            .collect();
        Ok(Response::new(ListPodResourcesResponse { pod_resources }))
    }

    async fn get_allocatable_resources(
        &self,
        _: Request<AllocatableResourcesRequest>,
    ) -> Result<Response<AllocatableResourcesResponse>, Status> {
        self.limit()?;
        // One entry per device, as upstream's `containerDevicesFromResourceDeviceInstances`.
        let devices = self
            .providers
            .devices
            .allocatable_devices()
            .into_iter()
            .map(|(resource, id, numa)| ContainerDevices {
                resource_name: resource,
                device_ids: vec![id],
                topology: topology(numa),
            })
            .collect();
        Ok(Response::new(AllocatableResourcesResponse {
            devices,
            cpu_ids: Vec::new(),
            memory: Vec::new(),
        }))
    }

    async fn get(
        &self,
        request: Request<GetPodResourcesRequest>,
    ) -> Result<Response<GetPodResourcesResponse>, Status> {
        self.limit()?;
        let r = request.into_inner();
        let pods = (self.providers.pods)();
        let found = pods.iter().map(|(p, _)| p).find(|p| {
            p.metadata.namespace.as_deref() == Some(r.pod_namespace.as_str())
                && p.metadata.name.as_deref() == Some(r.pod_name.as_str())
        });
        let Some(pod) = found else {
            return Err(Status::unknown(format!(
                "pod {} in namespace {} not found",
                r.pod_name, r.pod_namespace
            )));
        };
        Ok(Response::new(GetPodResourcesResponse {
            pod_resources: Some(self.pod_resources(pod)),
        }))
    }
}

/// The socket's path under the root dir.
pub(crate) fn socket_path(root_dir: &Path) -> PathBuf {
    root_dir.join(DIR).join(SOCKET)
}

/// Serves the API until `stop`.
pub(crate) async fn serve(root_dir: PathBuf, providers: Providers, stop: CancellationToken) {
    let path = socket_path(&root_dir);
    let dir = root_dir.join(DIR);
    if let Err(e) = std::fs::create_dir_all(&dir) {
        tracing::error!(path = %dir.display(), error = %e, "cannot make the pod-resources directory");
        return;
    }
    {
        use std::os::unix::fs::PermissionsExt as _;
        let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o750));
    }
    let _ = std::fs::remove_file(&path);
    let listener = match tokio::net::UnixListener::bind(&path) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(path = %path.display(), error = %e, "cannot listen on the pod-resources socket");
            return;
        }
    };
    tracing::info!(path = %path.display(), qps = QPS, burst = BURST, "serving the pod-resources API");
    let server = Server {
        providers,
        bucket: Mutex::new(Bucket::new(QPS, BURST, clock::instant())),
    };
    let result = tonic::transport::Server::builder()
        .add_service(PodResourcesListerServer::new(server))
        .serve_with_incoming_shutdown(super::authority::incoming(listener), stop.cancelled_owned())
        .await;
    if let Err(e) = result {
        tracing::error!(error = %e, "the pod-resources server failed");
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_bucket_allows_a_burst_of_ten_then_a_hundred_a_second() {
        let start = Instant::now();
        let mut bucket = Bucket::new(QPS, BURST, start);
        let burst = (0..20).filter(|_| bucket.allow(start)).count();
        assert_eq!(burst, 10);
        assert!(!bucket.allow(start));
        assert!(
            bucket.allow(start + Duration::from_millis(10)),
            "one token back after 10 ms"
        );
        assert!(!bucket.allow(start + Duration::from_millis(10)));
        let later = start + Duration::from_secs(60);
        let refilled = (0..20).filter(|_| bucket.allow(later)).count();
        assert_eq!(refilled, 10, "never more than the burst");
    }

    #[test]
    fn devices_carry_their_topology_only_when_they_have_one() {
        let got = container_devices(vec![
            ("r".into(), vec!["a".into()], Vec::new()),
            ("r".into(), vec!["b".into()], vec![1]),
        ]);
        assert!(got[0].topology.is_none());
        assert_eq!(got[1].topology.as_ref().unwrap().nodes[0].id, 1);
    }
}
