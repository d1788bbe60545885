use std::path::{Path, PathBuf};
use std::sync::{LazyLock, Mutex};

use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, CSIVolumeSource, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, CSIDriverSpec};

use super::client::NodeInfo;
use super::mount::{self, PersistentCsi};
use super::proto::node_server::{Node, NodeServer};
use super::*;
use crate::clients::apiserver::fake::FakeApiServer;

#[test]
fn versions_are_checked_as_upstream() {
    let v = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        validate_versions("d", &v(&["1.0.0"]), None).unwrap(),
        (1, 0, 0)
    );
    assert_eq!(
        validate_versions("d", &v(&["0.3.0", "v1.5.0", "1.2"]), None).unwrap(),
        (1, 5, 0)
    );
    let none = validate_versions("d", &v(&["0.3.0", "2.0.0"]), None)
        .unwrap_err()
        .to_string();
    assert!(
        none.contains("None of the versions specified [\"0.3.0\", \"2.0.0\"] are supported"),
        "{none}"
    );
    let empty = validate_versions("d", &[], None).unwrap_err().to_string();
    assert!(
        empty.contains("Plugin returned an empty list for supported versions"),
        "{empty}"
    );
    let taken = validate_versions("d", &v(&["1.0.0"]), Some((1, 0, 0)))
        .unwrap_err()
        .to_string();
    assert!(
        taken.contains("already registered with a higher supported version: \"1.0.0\""),
        "{taken}"
    );
    assert!(validate_versions("d", &v(&["1.1.0"]), Some((1, 0, 0))).is_ok());
}

#[test]
fn node_ids_and_csi_node_drivers() {
    assert_eq!(
        node_info::node_ids(None, "a", Some("n1")).as_deref(),
        Some(r#"{"a":"n1"}"#)
    );
    let both = node_info::node_ids(Some(r#"{"a":"n1"}"#), "b", Some("n2"));
    assert_eq!(both.as_deref(), Some(r#"{"a":"n1","b":"n2"}"#));
    assert_eq!(node_info::node_ids(Some(r#"{"a":"n1"}"#), "a", None), None);
    let info = NodeInfo {
        node_id: "n".into(),
        max_volumes: 7,
        topology: [("io.mock/node".to_string(), "x".to_string())].into(),
    };
    let drivers = node_info::with_driver(Vec::new(), "d", Some(&info));
    assert_eq!(
        drivers[0].topology_keys.as_deref(),
        Some(&["io.mock/node".to_string()][..])
    );
    assert_eq!(
        drivers[0].allocatable.as_ref().and_then(|a| a.count),
        Some(7)
    );
    let bare = node_info::with_driver(drivers, "d", Some(&NodeInfo::default()));
    assert_eq!(
        (
            bare.len(),
            bare[0].topology_keys.is_none(),
            bare[0].allocatable.is_none()
        ),
        (1, true, true)
    );
    assert!(node_info::with_driver(bare, "d", None).is_empty());
}

#[test]
fn lifecycle_modes_and_fs_group_policy() {
    let object = |modes: Option<Vec<&str>>| CSIDriver {
        spec: CSIDriverSpec {
            volume_lifecycle_modes: modes.map(|m| m.into_iter().map(String::from).collect()),
            ..Default::default()
        },
        ..Default::default()
    };
    assert!(mount::check_mode("d", None, "Persistent").is_ok());
    let none = mount::check_mode("d", None, "Ephemeral")
        .unwrap_err()
        .to_string();
    assert_eq!(
        none,
        "volume mode \"Ephemeral\" not supported by driver d (no CSIDriver object)"
    );
    let only = mount::check_mode("d", Some(&object(None)), "Ephemeral")
        .unwrap_err()
        .to_string();
    assert_eq!(
        only,
        "volume mode \"Ephemeral\" not supported by driver d (only supports [\"Persistent\"])"
    );
    assert!(mount::check_mode("d", Some(&object(Some(vec!["Ephemeral"]))), "Ephemeral").is_ok());
    let rwo = ["ReadWriteOnce".to_string()];
    let cases = [
        (None, false, "ext4", Some(&rwo[..]), true),
        (None, false, "", Some(&rwo[..]), false),
        (None, false, "ext4", None, false),
        (Some("File"), false, "", None, true),
        (Some("File"), true, "", None, false),
        (Some("None"), false, "ext4", Some(&rwo[..]), false),
    ];
    for (policy, ro, fs, modes, want) in cases {
        assert_eq!(
            mount::applies_fs_group(policy, ro, fs, modes),
            want,
            "{policy:?} {ro} {fs:?} {modes:?}"
        );
    }
}

#[test]
fn upstreams_names_and_paths() {
    // sha256("uid1" + "vol") and sha256("h") as upstream computes them.
    assert_eq!(mount::inline_volume_handle("uid1", "vol").len(), 4 + 64);
    assert_eq!(
        mount::global_mount_path(Path::new("/r"), "drv", "h"),
        PathBuf::from(
            "/r/plugins/kubernetes.io/csi/drv/aaa9402664f1a41f40ebbc52c9993eb66aeb366602958fdfaa283b71e64db123/globalmount"
        )
    );
}

/// A CSI driver's Node service that records each call as `Method volume path`.
#[derive(Clone, Default)]
struct FakeDriver {
    calls: Arc<Mutex<Vec<String>>>,
    contexts: Arc<Mutex<Vec<HashMap<String, String>>>>,
    stage: bool,
    /// Advertises `EXPAND_VOLUME`.
    expand: bool,
}

type Reply<T> = Result<tonic::Response<T>, tonic::Status>;

#[tonic::async_trait]
impl Node for FakeDriver {
    async fn node_stage_volume(
        &self,
        r: tonic::Request<proto::NodeStageVolumeRequest>,
    ) -> Reply<proto::NodeStageVolumeResponse> {
        let r = r.into_inner();
        self.calls.lock().unwrap().push(format!(
            "NodeStageVolume {} {}",
            r.volume_id, r.staging_target_path
        ));
        Ok(tonic::Response::new(proto::NodeStageVolumeResponse {}))
    }
    async fn node_unstage_volume(
        &self,
        r: tonic::Request<proto::NodeUnstageVolumeRequest>,
    ) -> Reply<proto::NodeUnstageVolumeResponse> {
        let r = r.into_inner();
        self.calls.lock().unwrap().push(format!(
            "NodeUnstageVolume {} {}",
            r.volume_id, r.staging_target_path
        ));
        Ok(tonic::Response::new(proto::NodeUnstageVolumeResponse {}))
    }
    async fn node_publish_volume(
        &self,
        r: tonic::Request<proto::NodePublishVolumeRequest>,
    ) -> Reply<proto::NodePublishVolumeResponse> {
        let r = r.into_inner();
        self.calls.lock().unwrap().push(format!(
            "NodePublishVolume {} {} {}",
            r.volume_id, r.staging_target_path, r.target_path
        ));
        self.contexts.lock().unwrap().push(r.volume_context);
        Ok(tonic::Response::new(proto::NodePublishVolumeResponse {}))
    }
    async fn node_unpublish_volume(
        &self,
        r: tonic::Request<proto::NodeUnpublishVolumeRequest>,
    ) -> Reply<proto::NodeUnpublishVolumeResponse> {
        let r = r.into_inner();
        self.calls.lock().unwrap().push(format!(
            "NodeUnpublishVolume {} {}",
            r.volume_id, r.target_path
        ));
        Ok(tonic::Response::new(proto::NodeUnpublishVolumeResponse {}))
    }
    async fn node_get_volume_stats(
        &self,
        _: tonic::Request<proto::NodeGetVolumeStatsRequest>,
    ) -> Reply<proto::NodeGetVolumeStatsResponse> {
        Err(tonic::Status::unimplemented(""))
    }
    async fn node_expand_volume(
        &self,
        r: tonic::Request<proto::NodeExpandVolumeRequest>,
    ) -> Reply<proto::NodeExpandVolumeResponse> {
        let r = r.into_inner();
        let bytes = r.capacity_range.map(|c| c.required_bytes).unwrap_or(0);
        self.calls.lock().unwrap().push(format!(
            "NodeExpandVolume {} {} {} {bytes}",
            r.volume_id, r.volume_path, r.staging_target_path
        ));
        Ok(tonic::Response::new(proto::NodeExpandVolumeResponse {
            capacity_bytes: bytes,
        }))
    }
    async fn node_get_capabilities(
        &self,
        _: tonic::Request<proto::NodeGetCapabilitiesRequest>,
    ) -> Reply<proto::NodeGetCapabilitiesResponse> {
        use proto::node_service_capability::rpc::Type as Rpc;
        use proto::node_service_capability::{Rpc as RpcCap, Type};
        let cap = |rpc: Rpc| proto::NodeServiceCapability {
            r#type: Some(Type::Rpc(RpcCap { r#type: rpc as i32 })),
        };
        let stage = self.stage.then(|| cap(Rpc::StageUnstageVolume));
        let expand = self.expand.then(|| cap(Rpc::ExpandVolume));
        Ok(tonic::Response::new(proto::NodeGetCapabilitiesResponse {
            capabilities: stage.into_iter().chain(expand).collect(),
        }))
    }
    async fn node_get_info(
        &self,
        _: tonic::Request<proto::NodeGetInfoRequest>,
    ) -> Reply<proto::NodeGetInfoResponse> {
        Ok(tonic::Response::new(proto::NodeGetInfoResponse {
            node_id: "mock-node".into(),
            ..Default::default()
        }))
    }
}

static FAKE: LazyLock<FakeApiServer> = LazyLock::new(FakeApiServer::new);

fn serve(socket: &Path, driver: FakeDriver) {
    let listener = tokio::net::UnixListener::bind(socket).unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(NodeServer::new(driver))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
    );
}

fn pod(uid: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "p", "namespace": "ns", "uid": uid},
        "spec": {"containers": [], "serviceAccountName": "sa"}
    }))
    .unwrap()
}

/// Stage, publish with pod info, then unpublish and unstage with upstream's paths; a second
/// pod keeps the volume staged until it is gone too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn persistent_volume_is_staged_published_and_torn_down_in_order() {
    install_host(CsiHost {
        node_name: "node1".into(),
        client: Some(FAKE.client()),
        tokens: None,
    });
    FAKE.apply(&CSIDriver {
        metadata: kube::api::ObjectMeta {
            name: Some("pv.mock".into()),
            ..Default::default()
        },
        spec: CSIDriverSpec {
            attach_required: Some(false),
            pod_info_on_mount: Some(true),
            ..Default::default()
        },
    });
    let root = tempfile::tempdir().unwrap();
    let root = root.path().canonicalize().unwrap();
    let socket = root.join("csi.sock");
    let fake = FakeDriver {
        stage: true,
        ..Default::default()
    };
    serve(&socket, fake.clone());
    set_driver(
        "pv.mock",
        Some(Driver {
            endpoint: socket.display().to_string(),
            version: (1, 0, 0),
        }),
    );
    let root2 = root.clone();
    tokio::task::spawn_blocking(move || {
        let source = CSIPersistentVolumeSource {
            driver: "pv.mock".into(),
            volume_handle: "h".into(),
            ..Default::default()
        };
        let modes = ["ReadWriteOnce".to_string()];
        let manager = crate::kubelet::volume::VolumeManager::new(
            root2.clone(),
            1 << 30,
            crate::base::podspec::resources::NodeAllocatable::default(),
            Arc::new(crate::kubelet::volume::mounter::fake::FakeMounter::default()),
        );
        for uid in ["u1", "u2"] {
            let dir = root2.join(format!("pods/{uid}/volumes/kubernetes.io~csi/pv1"));
            let pv = PersistentCsi {
                pv_name: "pv1",
                source: &source,
                access_modes: &modes,
                mount_options: &[],
                read_only: false,
                pod_volume: "data",
                claim: "claim",
                remount: false,
            };
            let set_up = manager.set_up_csi_persistent(&pod(uid), &pv).unwrap();
            assert_eq!((set_up.path, set_up.read_only), (dir.join("mount"), false));
            let data: serde_json::Value =
                serde_json::from_slice(&std::fs::read(dir.join("vol_data.json")).unwrap()).unwrap();
            assert_eq!(data["volumeLifecycleMode"], "Persistent");
            assert_eq!(data["specVolID"], "pv1");
        }
        // A republish (`requiresRepublish`): published again at the same path with the
        // staging path, not staged again; the published volume is found by its pod volume.
        let again = PersistentCsi {
            pv_name: "pv1",
            source: &source,
            access_modes: &modes,
            mount_options: &[],
            read_only: false,
            pod_volume: "data",
            claim: "claim",
            remount: true,
        };
        manager.set_up_csi_persistent(&pod("u2"), &again).unwrap();
        let published = manager.csi_published("u2");
        assert_eq!(
            published,
            [republish::Published {
                volume: "data".into(),
                requires_republish: false,
            }]
        );
        manager.teardown("u1").unwrap();
        assert!(
            !root2.join("pods/u1/volumes").exists(),
            "the pod's volumes are gone"
        );
        manager.teardown("u2").unwrap();
    })
    .await
    .unwrap();
    let global = mount::global_mount_path(&root, "pv.mock", "h");
    let g = global.display();
    let t = |uid: &str| {
        root.join(format!("pods/{uid}/volumes/kubernetes.io~csi/pv1/mount"))
            .display()
            .to_string()
    };
    assert_eq!(
        *fake.calls.lock().unwrap(),
        [
            format!("NodeStageVolume h {g}"),
            format!("NodePublishVolume h {g} {}", t("u1")),
            format!("NodeStageVolume h {g}"),
            format!("NodePublishVolume h {g} {}", t("u2")),
            format!("NodePublishVolume h {g} {}", t("u2")),
            format!("NodeUnpublishVolume h {}", t("u1")),
            format!("NodeUnpublishVolume h {}", t("u2")),
            format!("NodeUnstageVolume h {g}"),
        ]
    );
    let context = &fake.contexts.lock().unwrap()[0];
    assert_eq!(context["csi.storage.k8s.io/pod.uid"], "u1");
    assert_eq!(context["csi.storage.k8s.io/ephemeral"], "false");
    assert_eq!(context["csi.storage.k8s.io/serviceAccount.name"], "sa");
    assert!(
        !global.exists(),
        "the global mount dir is removed after unstage"
    );
}

/// A driver that is not registered: the set-up fails with upstream's message, and so does
/// the teardown of a volume it published (nothing is removed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unregistered_driver_fails_in_upstreams_words() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("pods/u9/volumes/kubernetes.io~csi/v");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("vol_data.json"),
        r#"{"driverName":"gone.mock","volumeHandle":"x"}"#,
    )
    .unwrap();
    let root2 = root.path().to_path_buf();
    let err = tokio::task::spawn_blocking(move || {
        mount::tear_down_pod(&root2, &root2.join("pods/u9")).unwrap_err()
    })
    .await
    .unwrap();
    assert_eq!(
        err.to_string(),
        "kubernetes.io/csi: mounter.SetUpAt failed to get CSI client: driver name gone.mock not found in the list of registered CSI drivers"
    );
    assert!(dir.join("vol_data.json").exists());
    let _ = CSIVolumeSource::default();
}

/// `NodeExpandVolume` goes to the published path with the staging path and the size, and a
/// driver without `EXPAND_VOLUME` is not called.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_in_use_is_expanded_where_it_is_published() {
    let root = tempfile::tempdir().unwrap();
    let root = root.path().canonicalize().unwrap();
    let source = CSIPersistentVolumeSource {
        driver: "expand.mock".into(),
        volume_handle: "h".into(),
        fs_type: Some("ext4".into()),
        ..Default::default()
    };
    let dir = root
        .join("pods/u1/volumes")
        .join(CSI_PLUGIN_DIR)
        .join("pv1");
    let modes = ["ReadWriteOnce".to_string()];
    let in_use = expander::InUse {
        dir: dir.clone(),
        source: &source,
        access_modes: &modes,
        mount_options: &[],
    };
    for expand in [true, false] {
        let socket = root.join(format!("expand-{expand}.sock"));
        let fake = FakeDriver {
            stage: true,
            expand,
            ..Default::default()
        };
        serve(&socket, fake.clone());
        set_driver(
            "expand.mock",
            Some(Driver {
                endpoint: socket.display().to_string(),
                version: (1, 0, 0),
            }),
        );
        let got = expander::expand_in_use(&root, &in_use, 2 << 30).await;
        let calls = fake.calls.lock().unwrap().clone();
        if expand {
            got.unwrap();
            let global = mount::global_mount_path(&root, "expand.mock", "h");
            assert_eq!(
                calls,
                [format!(
                    "NodeExpandVolume h {} {} {}",
                    dir.join("mount").display(),
                    global.display(),
                    2u64 << 30
                )]
            );
        } else {
            let err = got.unwrap_err().to_string();
            assert_eq!(
                err,
                "NodeExpand is not supported by the CSI driver expand.mock"
            );
            assert!(calls.is_empty(), "{calls:?}");
        }
    }
    set_driver("expand.mock", None);
    assert!(!expander::published(&dir), "nothing published in this test");
}
