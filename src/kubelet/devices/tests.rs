//! The manager against a fake plugin over real Unix sockets: registration, `ListAndWatch`,
//! capacity, `Allocate` and `PreStartContainer` at container creation, the checkpoint across
//! a new manager, and a plugin that goes away.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::api::v1beta1::{
    self as api,
    device_plugin_server::{DevicePlugin, DevicePluginServer},
    registration_client::RegistrationClient,
};
use super::*;

const R: &str = "example.com/resource";

#[derive(Default, Clone)]
struct Fake {
    allocations: Arc<Mutex<Vec<Vec<String>>>>,
    pre_starts: Arc<Mutex<Vec<Vec<String>>>>,
    /// Ends the `ListAndWatch` streams, as a plugin that exits.
    gone: CancellationToken,
}

#[tonic::async_trait]
impl DevicePlugin for Fake {
    async fn get_device_plugin_options(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(api::DevicePluginOptions {
            pre_start_required: true,
            get_preferred_allocation_available: false,
        }))
    }

    type ListAndWatchStream =
        futures::stream::BoxStream<'static, Result<api::ListAndWatchResponse, Status>>;

    async fn list_and_watch(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let devices = ["Dev-1", "Dev-2", "Dev-3"]
            .iter()
            .map(|id| api::Device {
                id: id.to_string(),
                health: if *id == "Dev-3" {
                    "Unhealthy"
                } else {
                    "Healthy"
                }
                .into(),
                topology: None,
            })
            .collect();
        let first = futures::stream::once(async { Ok(api::ListAndWatchResponse { devices }) });
        use futures::StreamExt as _;
        let gone = self.gone.clone().cancelled_owned();
        let end = futures::stream::once(gone).filter_map(|()| async { None });
        Ok(Response::new(first.chain(end).boxed()))
    }

    async fn get_preferred_allocation(
        &self,
        _: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        Err(Status::unimplemented("not offered"))
    }

    async fn allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let ids = request
            .into_inner()
            .container_requests
            .remove(0)
            .devices_ids;
        self.allocations.lock().unwrap().push(ids.clone());
        Ok(Response::new(api::AllocateResponse {
            container_responses: vec![api::ContainerAllocateResponse {
                envs: HashMap::from([("DEVICES".to_string(), ids.join(","))]),
                ..Default::default()
            }],
        }))
    }

    async fn pre_start_container(
        &self,
        request: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        self.pre_starts
            .lock()
            .unwrap()
            .push(request.into_inner().devices_ids);
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}

/// Serves the fake on `dir/name` and registers it; the token stops it.
async fn run_plugin(dir: &Path, fake: Fake) -> CancellationToken {
    let socket = dir.join(DIR).join("fake.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let stop = fake.gone.clone();
    let server = tonic::transport::Server::builder()
        .add_service(DevicePluginServer::new(fake))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::UnixListenerStream::new(listener),
            stop.clone().cancelled_owned(),
        );
    tokio::spawn(server);
    let kubelet = dir.join(DIR).join(plugin::KUBELET_SOCKET);
    let deadline = clock::instant() + Duration::from_secs(10);
    let channel = loop {
        let endpoint =
            tonic::transport::Endpoint::from_shared(format!("unix://{}", kubelet.display()))
                .unwrap();
        match endpoint.connect().await {
            Ok(c) => break c,
            Err(e) if clock::instant() > deadline => {
                panic!("the registration socket never answered: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    RegistrationClient::new(channel)
        .register(api::RegisterRequest {
            version: "v1beta1".into(),
            endpoint: "fake.sock".into(),
            resource_name: R.into(),
            options: None,
        })
        .await
        .expect("registered");
    stop
}

async fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = clock::instant() + Duration::from_secs(10);
    while !check() {
        assert!(clock::instant() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn pod(uid: &str, devices: &str) -> (Pod, Container) {
    let container = Container {
        name: "c".into(),
        resources: Some(ResourceRequirements {
            limits: Some([(R.to_string(), Quantity(devices.into()))].into()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut pod = Pod {
        spec: Some(PodSpec {
            containers: vec![container.clone()],
            ..Default::default()
        }),
        ..Default::default()
    };
    pod.metadata.uid = Some(uid.into());
    pod.metadata.name = Some(uid.into());
    (pod, container)
}

#[tokio::test]
async fn a_plugin_registers_its_devices_are_allocated_once_each_and_kept_across_a_restart() {
    let root = tempfile::tempdir().unwrap();
    let manager = DeviceManager::new(root.path());
    let stop = CancellationToken::new();
    tokio::spawn(manager.clone().serve_registration(stop.clone()));
    let fake = Fake::default();
    let plugin = run_plugin(root.path(), fake.clone()).await;
    wait_for("the devices", || manager.capacity().0.get(R) == Some(&3)).await;
    assert_eq!(
        manager.capacity().1[R],
        2,
        "the unhealthy device is not allocatable"
    );

    let (pod1, c1) = pod("uid-1", "1");
    let options = manager
        .container_options(&pod1, &c1)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        options.envs,
        vec![("DEVICES".to_string(), "Dev-1".to_string())]
    );
    // The same container again (a restart): no second Allocate, PreStartContainer again.
    manager.container_options(&pod1, &c1).await.unwrap();
    assert_eq!(fake.allocations.lock().unwrap().len(), 1);
    assert_eq!(fake.pre_starts.lock().unwrap().len(), 2);
    let (pod2, c2) = pod("uid-2", "1");
    let options = manager
        .container_options(&pod2, &c2)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        options.envs[0].1, "Dev-2",
        "never the device another container holds"
    );
    let (pod3, c3) = pod("uid-3", "1");
    let err = manager.container_options(&pod3, &c3).await.unwrap_err();
    assert!(
        err.to_string().contains("Requested: 1, Available: 0"),
        "{err}"
    );

    // A new manager (a restart) reads the checkpoint: the devices stay with their containers.
    let checkpoint =
        std::fs::read_to_string(root.path().join(DIR).join(checkpoint::FILE_NAME)).unwrap();
    assert!(checkpoint.contains("\"PodUID\":\"uid-1\""), "{checkpoint}");
    stop.cancel();
    plugin.cancel();
    let again = DeviceManager::new(root.path());
    assert_eq!(
        again.devices_of("uid-1", "c")[0].1,
        vec!["Dev-1".to_string()]
    );
    assert_eq!(
        again.devices_of("uid-2", "c")[0].1,
        vec!["Dev-2".to_string()]
    );
    assert_eq!(again.capacity().0[R], 0, "until the plugin registers again");
}

#[tokio::test]
async fn a_plugin_that_goes_away_leaves_capacity_and_no_allocatable() {
    let root = tempfile::tempdir().unwrap();
    let manager = DeviceManager::new(root.path());
    let stop = CancellationToken::new();
    tokio::spawn(manager.clone().serve_registration(stop.clone()));
    let plugin = run_plugin(root.path(), Fake::default()).await;
    wait_for("the devices", || manager.capacity().1.get(R) == Some(&2)).await;
    plugin.cancel();
    wait_for("allocatable 0", || manager.capacity().1.get(R) == Some(&0)).await;
    assert_eq!(
        manager.capacity().0[R],
        3,
        "capacity kept through the grace"
    );
    // The admission check now refuses a pod that asks for one.
    let wanted = BTreeMap::from([(R.to_string(), 1)]);
    let (reason, message) = manager.admit("new", &wanted, &|_| 0).unwrap_err();
    assert_eq!(reason, "UnexpectedAdmissionError");
    assert!(message.contains("Requested: 1, Available: 0"), "{message}");
    stop.cancel();
}

#[tokio::test]
async fn a_deleted_registration_socket_is_served_again() {
    let root = tempfile::tempdir().unwrap();
    let manager = DeviceManager::new(root.path());
    let stop = CancellationToken::new();
    tokio::spawn(manager.clone().serve_registration(stop.clone()));
    let socket = root.path().join(DIR).join(plugin::KUBELET_SOCKET);
    wait_for("the socket", || socket.exists()).await;
    std::fs::remove_file(&socket).unwrap();
    wait_for("the socket again", || socket.exists()).await;
    let plugin = run_plugin(root.path(), Fake::default()).await;
    wait_for("the devices", || manager.capacity().0.get(R) == Some(&3)).await;
    plugin.cancel();
    stop.cancel();
}
