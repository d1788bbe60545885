use std::sync::Mutex as StdMutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    PodResourceClaim, PodResourceClaimStatus, PodSpec, PodStatus,
    ResourceClaim as ContainerResourceClaim, ResourceRequirements,
};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult,
    ResourceClaimConsumerReference, ResourceClaimStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

use super::proto::dra_plugin_server::{DraPlugin, DraPluginServer};
use super::*;
use crate::clients::apiserver::fake::FakeApiServer;

pub(super) const DRIVER: &str = "test-driver.cdi.k8s.io";

/// One recorded call: its method and the claims' names.
type Call = (&'static str, Vec<String>);

/// A DRA driver that records its calls and answers with one CDI device per claim, or fails;
/// while a test holds `held` for writing, it records calls but answers none.
#[derive(Clone, Default)]
pub(super) struct FakeDriver {
    calls: Arc<StdMutex<Vec<Call>>>,
    fail: Arc<StdMutex<Option<String>>>,
    held: Arc<tokio::sync::RwLock<()>>,
}

impl FakeDriver {
    /// Holds every answer back until the guard is dropped.
    fn hold(&self) -> tokio::sync::OwnedRwLockWriteGuard<()> {
        self.held
            .clone()
            .try_write_owned()
            .expect("the driver is held once")
    }
}

#[tonic::async_trait]
impl DraPlugin for FakeDriver {
    async fn node_prepare_resources(
        &self,
        request: tonic::Request<proto::NodePrepareResourcesRequest>,
    ) -> Result<tonic::Response<proto::NodePrepareResourcesResponse>, tonic::Status> {
        let claims = request.into_inner().claims;
        self.calls
            .lock()
            .unwrap()
            .push((PREPARE, claims.iter().map(|c| c.name.clone()).collect()));
        let _answer = self.held.read().await;
        let error = self.fail.lock().unwrap().clone().unwrap_or_default();
        let answer = claims
            .iter()
            .map(|c| {
                let device = proto::Device {
                    request_names: vec!["req".into()],
                    pool_name: "node".into(),
                    device_name: "device-00".into(),
                    cdi_device_ids: vec![format!("{DRIVER}/test={}", c.uid)],
                    share_id: None,
                };
                let result = proto::NodePrepareResourceResponse {
                    devices: vec![device],
                    error: error.clone(),
                };
                (c.uid.clone(), result)
            })
            .collect();
        Ok(tonic::Response::new(proto::NodePrepareResourcesResponse {
            claims: answer,
        }))
    }

    async fn node_unprepare_resources(
        &self,
        request: tonic::Request<proto::NodeUnprepareResourcesRequest>,
    ) -> Result<tonic::Response<proto::NodeUnprepareResourcesResponse>, tonic::Status> {
        let claims = request.into_inner().claims;
        self.calls
            .lock()
            .unwrap()
            .push((UNPREPARE, claims.iter().map(|c| c.name.clone()).collect()));
        let _answer = self.held.read().await;
        let answer = claims
            .iter()
            .map(|c| {
                (
                    c.uid.clone(),
                    proto::NodeUnprepareResourceResponse::default(),
                )
            })
            .collect();
        Ok(tonic::Response::new(
            proto::NodeUnprepareResourcesResponse { claims: answer },
        ))
    }
}

fn serve(driver: &FakeDriver, socket: &std::path::Path) -> tokio::task::JoinHandle<()> {
    let listener = tokio::net::UnixListener::bind(socket).unwrap();
    let service = DraPluginServer::new(driver.clone());
    tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
            .await;
    })
}

pub(super) fn pod(name: &str, uid: &str, claim: PodResourceClaim) -> Pod {
    let container = Container {
        name: "c".into(),
        resources: Some(ResourceRequirements {
            claims: Some(vec![ContainerResourceClaim {
                name: claim.name.clone(),
                request: None,
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![container],
            resource_claims: Some(vec![claim]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(super) fn by_name(claim: &str) -> PodResourceClaim {
    PodResourceClaim {
        name: "gpu".into(),
        resource_claim_name: Some(claim.into()),
        ..Default::default()
    }
}

pub(super) fn claim(name: &str, uid: &str, reserved_for: &[&str]) -> ResourceClaim {
    claim_of(DRIVER, name, uid, reserved_for)
}

fn claim_of(driver: &str, name: &str, uid: &str, reserved_for: &[&str]) -> ResourceClaim {
    let result = DeviceRequestAllocationResult {
        driver: driver.into(),
        pool: "node".into(),
        device: "device-00".into(),
        request: "req".into(),
        ..Default::default()
    };
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        status: Some(ResourceClaimStatus {
            allocation: Some(AllocationResult {
                devices: Some(DeviceAllocationResult {
                    results: Some(vec![result]),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            reserved_for: Some(
                reserved_for
                    .iter()
                    .map(|u| ResourceClaimConsumerReference {
                        resource: "pods".into(),
                        name: "p".into(),
                        uid: (*u).into(),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub(super) struct Setup {
    _dir: tempfile::TempDir,
    pub(super) root: PathBuf,
    pub(super) api: FakeApiServer,
    driver: FakeDriver,
    pub(super) manager: DraManager,
    _server: tokio::task::JoinHandle<()>,
}

pub(super) fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    let api = FakeApiServer::new();
    let driver = FakeDriver::default();
    let socket = root.join("dra.sock");
    let server = serve(&driver, &socket);
    let manager = DraManager::new(&root, Some(api.client()));
    manager.set_driver(DRIVER, Some(socket.to_str().unwrap()));
    Setup {
        _dir: dir,
        root,
        api,
        driver,
        manager,
        _server: server,
    }
}

fn calls(driver: &FakeDriver) -> Vec<Call> {
    driver.calls.lock().unwrap().clone()
}

#[tokio::test]
async fn a_shared_claim_is_prepared_once_and_unprepared_after_its_last_pod() {
    let s = setup();
    s.api.apply(&claim("shared", "cu1", &["p1", "p2"]));
    let (a, b) = (
        pod("a", "p1", by_name("shared")),
        pod("b", "p2", by_name("shared")),
    );
    s.manager.prepare(&a).await.unwrap();
    s.manager.prepare(&b).await.unwrap();
    assert_eq!(
        calls(&s.driver),
        vec![(PREPARE, vec!["shared".to_string()])]
    );
    let container = &a.spec.as_ref().unwrap().containers[0];
    assert_eq!(
        s.manager.cdi_devices(&b, container),
        vec![format!("{DRIVER}/test=cu1")]
    );
    s.manager.unprepare("p1").await.unwrap();
    assert_eq!(calls(&s.driver).len(), 1, "still used by the second pod");
    s.manager.unprepare("p2").await.unwrap();
    assert_eq!(calls(&s.driver)[1], (UNPREPARE, vec!["shared".to_string()]));
    assert!(s.manager.snapshot().is_empty());
}

/// How long a call that must not wait for a held driver may take (it takes milliseconds; the
/// held driver's deadline is 45 s).
const AT_ONCE: Duration = Duration::from_secs(5);

pub(super) async fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = crate::base::clock::instant() + Duration::from_secs(10);
    while !check() {
        assert!(
            crate::base::clock::instant() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn spawn_prepare(manager: &DraManager, pod: Pod) -> tokio::task::JoinHandle<Result<(), DraError>> {
    let manager = manager.clone();
    tokio::spawn(async move { manager.prepare(&pod).await })
}

#[tokio::test]
async fn a_driver_that_does_not_answer_holds_up_only_its_own_claims() {
    const OTHER: &str = "other.example.com";
    let s = setup();
    let other = FakeDriver::default();
    let socket = s.root.join("other.sock");
    let _other_server = serve(&other, &socket);
    s.manager.set_driver(OTHER, Some(socket.to_str().unwrap()));
    s.api.apply(&claim("stuck", "cu1", &["p1", "p3"]));
    s.api.apply(&claim_of(OTHER, "free", "cu2", &["p2"]));
    let held = s.driver.hold();
    let first = spawn_prepare(&s.manager, pod("a", "p1", by_name("stuck")));
    wait_for("the held driver's call", || calls(&s.driver).len() == 1).await;
    let sharer = spawn_prepare(&s.manager, pod("c", "p3", by_name("stuck")));

    let free = pod("b", "p2", by_name("free"));
    tokio::time::timeout(AT_ONCE, s.manager.prepare(&free))
        .await
        .expect("another driver's claim waits for the held driver")
        .unwrap();
    tokio::time::timeout(AT_ONCE, s.manager.unprepare("p2"))
        .await
        .expect("another driver's unprepare waits for the held driver")
        .unwrap();
    assert_eq!(
        calls(&other),
        vec![
            (PREPARE, vec!["free".to_string()]),
            (UNPREPARE, vec!["free".to_string()])
        ]
    );
    assert!(!first.is_finished() && !sharer.is_finished());

    drop(held);
    first.await.unwrap().unwrap();
    sharer.await.unwrap().unwrap();
    assert_eq!(
        calls(&s.driver),
        vec![(PREPARE, vec!["stuck".to_string()])],
        "the second pod of the claim waited for the first's prepare instead of calling again"
    );
    let cached = s.manager.snapshot();
    assert_eq!(cached.len(), 1);
    assert!(cached[0].prepared);
    assert_eq!(cached[0].pod_uids.len(), 2);
}

#[tokio::test]
async fn claims_of_pods_gone_while_the_agent_was_down_are_released() {
    let s = setup();
    s.api.apply(&claim("gone", "cu1", &["p1"]));
    s.api.apply(&claim("kept", "cu2", &["p2"]));
    s.manager
        .prepare(&pod("a", "p1", by_name("gone")))
        .await
        .unwrap();
    s.manager
        .prepare(&pod("b", "p2", by_name("kept")))
        .await
        .unwrap();
    let again = DraManager::new(&s.root, Some(s.api.client()));
    again.set_driver(DRIVER, Some(s.root.join("dra.sock").to_str().unwrap()));
    assert_eq!(
        again.pod_uids(),
        BTreeSet::from(["p1".to_string(), "p2".to_string()])
    );
    again
        .release_pods(&HashSet::from(["p1".to_string()]))
        .await
        .unwrap();
    assert_eq!(
        calls(&s.driver).last().unwrap(),
        &(UNPREPARE, vec!["gone".to_string()])
    );
    let left: Vec<String> = again.snapshot().into_iter().map(|c| c.claim_name).collect();
    assert_eq!(left, vec!["kept".to_string()]);
    let on_disk = state::read(&s.root.join(state::FILE_NAME))
        .unwrap()
        .unwrap();
    assert_eq!(on_disk.len(), 1, "the checkpoint follows");
}

#[tokio::test]
async fn driver_calls_and_claims_in_use_show_in_the_metrics() {
    let s = setup();
    s.api.apply(&claim("c", "cu1", &["p1"]));
    let p = pod("a", "p1", by_name("c"));
    s.manager.prepare(&p).await.unwrap();
    assert!(
        s.manager.render_metrics().contains(&format!(
            "dra_resource_claims_in_use{{driver_name=\"{DRIVER}\"}} 1\n"
        )),
        "{}",
        s.manager.render_metrics()
    );
    s.manager.unprepare("p1").await.unwrap();
    assert!(
        s.manager
            .render_metrics()
            .contains("dra_resource_claims_in_use{driver_name=\"<any>\"} 0\n")
    );
    let mut page = String::new();
    crate::base::metrics::KUBELET
        .dra_grpc_operations_duration
        .render(&mut page);
    for method in [PREPARE, UNPREPARE] {
        let want = format!(
            "dra_grpc_operations_duration_seconds_count{{driver_name=\"{DRIVER}\",grpc_status_code=\"OK\",method_name=\"/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/{method}\"}} "
        );
        assert!(page.contains(&want), "{want} missing from:\n{page}");
    }
}

#[tokio::test]
async fn a_claim_not_reserved_for_the_pod_waits_with_upstreams_message() {
    let s = setup();
    s.api.apply(&claim("c", "cu1", &["someone-else"]));
    let err = s
        .manager
        .prepare(&pod("a", "p1", by_name("c")))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "pod a (p1) is not allowed to use ResourceClaim c (cu1)"
    );
    assert!(calls(&s.driver).is_empty());
    assert!(
        s.manager.snapshot().is_empty(),
        "nothing cached for a failed check"
    );
}

#[tokio::test]
async fn an_absent_driver_and_a_failing_driver_give_upstreams_errors() {
    let s = setup();
    s.api.apply(&claim("c", "cu1", &["p1"]));
    s.manager.set_driver(DRIVER, None);
    let p = pod("a", "p1", by_name("c"));
    let err = s.manager.prepare(&p).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("DRA driver {DRIVER} is not registered")
    );
    s.manager
        .set_driver(DRIVER, Some(s.root.join("dra.sock").to_str().unwrap()));
    *s.driver.fail.lock().unwrap() = Some("no such device".into());
    let err = s.manager.prepare(&p).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "NodePrepareResources failed for ResourceClaim c: no such device"
    );
    *s.driver.fail.lock().unwrap() = None;
    s.manager.prepare(&p).await.unwrap();
    assert_eq!(
        calls(&s.driver).len(),
        2,
        "the failed claim is prepared again"
    );
}

#[tokio::test]
async fn a_generated_claim_is_found_through_the_pod_status_and_must_be_owned() {
    let s = setup();
    let template = PodResourceClaim {
        name: "gpu".into(),
        resource_claim_template_name: Some("t".into()),
        ..Default::default()
    };
    let mut p = pod("a", "p1", template);
    let err = s.manager.prepare(&p).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "pod \"ns/a\": ResourceClaim not created yet"
    );
    p.status = Some(PodStatus {
        resource_claim_statuses: Some(vec![PodResourceClaimStatus {
            name: "gpu".into(),
            resource_claim_name: Some("a-gpu-x".into()),
        }]),
        ..Default::default()
    });
    let mut generated = claim("a-gpu-x", "cu9", &["p1"]);
    s.api.apply(&generated);
    let err = s.manager.prepare(&p).await.unwrap_err();
    assert!(err.to_string().contains("(Pod is not owner)"), "{err}");
    generated.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: "a".into(),
        uid: "p1".into(),
        controller: Some(true),
        ..Default::default()
    }]);
    s.api.apply(&generated);
    s.manager.prepare(&p).await.unwrap();
    let container = &p.spec.as_ref().unwrap().containers[0];
    assert_eq!(
        s.manager.cdi_devices(&p, container),
        vec![format!("{DRIVER}/test=cu9")]
    );
}

#[tokio::test]
async fn the_checkpoint_keeps_prepared_claims_across_a_restart() {
    let s = setup();
    s.api.apply(&claim("c", "cu1", &["p1"]));
    let p = pod("a", "p1", by_name("c"));
    s.manager.prepare(&p).await.unwrap();
    let again = DraManager::new(&s.root, Some(s.api.client()));
    let container = &p.spec.as_ref().unwrap().containers[0];
    assert_eq!(
        again.cdi_devices(&p, container),
        vec![format!("{DRIVER}/test=cu1")]
    );
    again.set_driver(DRIVER, Some(s.root.join("dra.sock").to_str().unwrap()));
    again.unprepare("p1").await.unwrap();
    assert_eq!(calls(&s.driver).last().unwrap().0, UNPREPARE);
}

#[test]
fn the_checkpoint_is_upstreams_format() {
    let mut info = ClaimInfo {
        claim_uid: "cu1".into(),
        claim_name: "c".into(),
        namespace: "ns".into(),
        ..Default::default()
    };
    info.pod_uids.insert("p1".into());
    info.drivers.insert(
        DRIVER.into(),
        state::DriverState {
            devices: vec![state::Device {
                pool_name: "node".into(),
                device_name: "device-00".into(),
                share_id: None,
                request_names: vec!["req".into()],
                cdi_device_ids: vec!["v/c=d".into()],
            }],
            skip_node_operations: vec![],
        },
    );
    let bytes = state::encode(std::slice::from_ref(&info));
    let file: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    let data = file["Data"].as_str().unwrap();
    assert_eq!(
        data,
        r#"{"kind":"DRACheckpoint","apiVersion":"checkpoint.dra.kubelet.k8s.io/v1","ClaimInfoStateList":[{"ClaimUID":"cu1","ClaimName":"c","Namespace":"ns","PodUIDs":{"p1":{}},"DriverState":{"test-driver.cdi.k8s.io":{"Devices":[{"PoolName":"node","DeviceName":"device-00","ShareID":null,"RequestNames":["req"],"CDIDeviceIDs":["v/c=d"]}]}}}]}"#
    );
    assert_eq!(
        file["Checksum"].as_u64().unwrap(),
        u64::from(state::crc32_ieee(data.as_bytes()))
    );
    // Go's crc32.ChecksumIEEE("123456789") is 0xCBF43926.
    assert_eq!(state::crc32_ieee(b"123456789"), 0xCBF4_3926);
    let back = state::decode(std::path::Path::new("x"), &bytes).unwrap();
    assert_eq!(back, vec![info]);
}

#[test]
fn driver_services_are_checked_as_upstream() {
    assert!(
        validate_services(
            "d",
            "/e",
            &["v1beta1.DRAPlugin".into(), "v1.DRAPlugin".into()]
        )
        .is_ok()
    );
    let err = validate_services("d", "/e", &[]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid supported gRPC versions of DRA driver plugin d at endpoint /e: empty list of supported gRPC services (aka supported versions)"
    );
    assert!(validate_services("d", "/e", &["v1beta1.DRAPlugin".into()]).is_err());
}

#[test]
fn a_container_gets_only_its_claims_and_requests() {
    let mut info = ClaimInfo {
        claim_uid: "u".into(),
        claim_name: "c".into(),
        namespace: "ns".into(),
        ..Default::default()
    };
    let device = |req: &str, id: &str| state::Device {
        request_names: vec![req.into()],
        cdi_device_ids: vec![id.into()],
        ..Default::default()
    };
    info.drivers.insert(
        DRIVER.into(),
        state::DriverState {
            devices: vec![device("a", "v/c=1"), device("b/sub", "v/c=2")],
            skip_node_operations: vec![],
        },
    );
    let cases: &[(&[&str], &[&str])] = &[
        (&[""], &["v/c=1", "v/c=2"]),
        (&["a"], &["v/c=1"]),
        (&["b"], &["v/c=2"]),
        (&["b/sub"], &["v/c=2"]),
        (&["z"], &[]),
    ];
    for (requests, want) in cases {
        let requests: Vec<String> = requests.iter().map(|s| s.to_string()).collect();
        assert_eq!(claims::cdi_devices(&info, &requests), *want, "{requests:?}");
    }
}

/// A pod whose container `c` asks for `amount` of an extended resource the scheduler
/// mapped to request `req` of claim `ext`, besides a container `other` that asks for none.
fn extended_pod(amount: &str) -> Pod {
    use k8s_openapi::api::core::v1::{
        ContainerExtendedResourceRequest, PodExtendedResourceClaimStatus,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    const RESOURCE: &str = "deckhand.test/dra-gpu";
    let requests = [(RESOURCE.to_string(), Quantity(amount.into()))].into();
    let asking = Container {
        name: "c".into(),
        resources: Some(ResourceRequirements {
            requests: Some(requests),
            ..Default::default()
        }),
        ..Default::default()
    };
    let mapping = |container: &str| ContainerExtendedResourceRequest {
        container_name: container.into(),
        resource_name: RESOURCE.into(),
        request_name: "req".into(),
    };
    Pod {
        metadata: ObjectMeta {
            name: Some("a".into()),
            namespace: Some("ns".into()),
            uid: Some("p1".into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![
                asking,
                Container {
                    name: "other".into(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        }),
        status: Some(PodStatus {
            extended_resource_claim_status: Some(PodExtendedResourceClaimStatus {
                resource_claim_name: "ext".into(),
                request_mappings: vec![mapping("c"), mapping("other")],
            }),
            ..Default::default()
        }),
    }
}

#[tokio::test]
async fn the_claim_made_for_extended_resources_is_prepared_for_the_containers_requesting_them() {
    let s = setup();
    s.api.apply(&claim("ext", "cu-ext", &["p1"]));
    let p = extended_pod("1");
    assert!(claims::has_claims(&p));
    s.manager.prepare(&p).await.unwrap();
    assert_eq!(calls(&s.driver), vec![(PREPARE, vec!["ext".to_string()])]);
    let containers = &p.spec.as_ref().unwrap().containers;
    assert_eq!(
        s.manager.cdi_devices(&p, &containers[0]),
        vec![format!("{DRIVER}/test=cu-ext")]
    );
    assert!(
        s.manager.cdi_devices(&p, &containers[1]).is_empty(),
        "a mapping for a container that requests none of the resource gives nothing"
    );
    let zero = extended_pod("0");
    assert!(
        s.manager
            .cdi_devices(&zero, &zero.spec.as_ref().unwrap().containers[0])
            .is_empty()
    );
    s.manager.unprepare("p1").await.unwrap();
    assert_eq!(calls(&s.driver)[1], (UNPREPARE, vec!["ext".to_string()]));
}

/// Upstream's wiping: the node's slices at start, a gone driver's after 30 s unless it
/// registers again within them; other nodes' and other drivers' slices stay.
#[tokio::test(start_paused = true)]
async fn a_gone_drivers_slices_are_deleted_after_the_delay_unless_it_comes_back() {
    use k8s_openapi::api::resource::v1::ResourceSlice;
    let slice = |name: &str, node: &str, driver: &str| -> ResourceSlice {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}},
        }))
        .unwrap()
    };
    let api = FakeApiServer::new();
    api.apply(&slice("old", "n1", DRIVER));
    api.apply(&slice("elsewhere", "n2", DRIVER));
    let root = tempfile::tempdir().unwrap();
    let manager = DraManager::new(root.path(), Some(api.client()));
    let stop = tokio_util::sync::CancellationToken::new();
    manager.start_slice_wipes("n1", stop.clone());
    let there = |name: &str| api.get::<ResourceSlice>("", name).is_some();
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(!there("old"), "the node's slices go at start");
    assert!(there("elsewhere"));

    api.apply(&slice("mine", "n1", DRIVER));
    api.apply(&slice("other-driver", "n1", "other.example.com"));
    manager.set_driver(DRIVER, Some("/nowhere.sock"));
    manager.set_driver(DRIVER, None);
    tokio::time::sleep(Duration::from_secs(29)).await;
    assert!(there("mine"), "not within the delay");
    manager.set_driver(DRIVER, Some("/nowhere.sock"));
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert!(there("mine"), "a driver that came back keeps its slices");
    manager.set_driver(DRIVER, None);
    tokio::time::sleep(Duration::from_secs(31)).await;
    assert!(!there("mine"), "gone 30 s after the driver");
    assert!(there("other-driver") && there("elsewhere"));
    stop.cancel();
}
