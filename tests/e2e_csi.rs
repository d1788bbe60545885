//! End to end, against the real test control plane and the private containerd: upstream's
//! CSI mock driver (`controlplane/csi-mock`: k8s.io/kubernetes' `csi-test` mock service, the
//! driver once published as csi-test's mock-driver, with a registration server speaking the
//! kubelet's `pluginregistration.v1`) registers through `<root-dir>/plugins_registry`; the
//! node's CSINode lists it; a pod with a CSI inline ephemeral volume runs with the volume
//! published by the driver (its own gRPC call log shows NodePublishVolume with upstream's
//! target path and pod-info volume_context, and NodeUnpublishVolume when the pod goes); a pod
//! whose driver is not registered waits with upstream's message while another pod runs; a
//! restart of Deckhand registers the driver again and the volume is still unpublished when its
//! pod goes; the driver is deregistered when its socket goes away, and registered again when
//! the socket is made again. A driver whose CSIDriver has `tokenRequests` and
//! `requiresRepublish` is handed the pod's tokens, and its volume is published again while
//! the pod runs.
//!
//! The mock driver is taken from `DECKHAND_CSI_MOCK_DRIVER` (`scripts/test` sets it from
//! `scripts/build-csi-mock`, cached as the control plane is), else built with `go build` from
//! `controlplane/csi-mock` into the test's target dir.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::cluster::{admin, bound_pod, create_namespace, joined_agent, wait_node_ready};
use common::wait_until;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode};
use kube::api::{Api, DeleteParams, PostParams};

const WAIT: Duration = Duration::from_secs(60);
const NS: &str = "e2e-csi";
const MOCK: &str = "io.kubernetes.storage.mock";
const UNREGISTERED: &str = "unregistered.csi.mock";
/// The mock driver's topology segment (with `--enable-topology`).
const TOPOLOGY_KEY: &str = "io.kubernetes.storage.mock/node";

/// The mock driver's binary: built from `controlplane/csi-mock` unless given.
fn mock_driver() -> PathBuf {
    if let Ok(p) = std::env::var("DECKHAND_CSI_MOCK_DRIVER") {
        return PathBuf::from(p);
    }
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("csi-mock-driver");
    let module = Path::new(env!("CARGO_MANIFEST_DIR")).join("controlplane/csi-mock");
    let go = if Path::new("/usr/local/go/bin/go").exists() {
        "/usr/local/go/bin/go"
    } else {
        "go"
    };
    let status = Command::new(go)
        .args(["build", "-trimpath", "-o"])
        .arg(&out)
        .arg(".")
        .current_dir(&module)
        .status()
        .expect("run go build for the CSI mock driver (is Go installed?)");
    assert!(status.success(), "go build of {} failed", module.display());
    out
}

/// The mock driver and its registration server, killed when dropped.
struct Driver {
    child: Child,
    log: PathBuf,
    registration: PathBuf,
}

impl Driver {
    fn start(dir: &Path, root: &Path) -> Driver {
        Driver::start_as(dir, root, MOCK)
    }

    /// The mock driver under another name (its own CSIDriver object).
    fn start_as(dir: &Path, root: &Path, name: &str) -> Driver {
        let log = dir.join("csi-mock.log");
        let registration = root
            .join("plugins_registry")
            .join(format!("{name}-reg.sock"));
        std::fs::create_dir_all(registration.parent().unwrap()).unwrap();
        let child = Command::new(mock_driver())
            .arg(format!("--csi-address={}", dir.join("csi.sock").display()))
            .arg(format!("--registration-socket={}", registration.display()))
            .args(["--name", name, "-v=5", "--logtostderr"])
            .args(["--enable-topology", "--attach-limit=5", "--node-expand"])
            .stderr(std::fs::File::create(&log).unwrap())
            .stdout(Stdio::null())
            .spawn()
            .expect("start the CSI mock driver");
        Driver {
            child,
            log,
            registration,
        }
    }

    /// The driver's own gRPC call log: (method, request JSON), in order.
    fn calls(&self) -> Vec<(String, serde_json::Value)> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines()
            .filter_map(|l| l.split_once("gRPCCall: ").map(|(_, json)| json))
            .filter_map(|json| serde_json::from_str::<serde_json::Value>(json).ok())
            .map(|v| {
                (
                    v["Method"].as_str().unwrap_or("").to_string(),
                    v["Request"].clone(),
                )
            })
            .collect()
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn csi_driver(name: &str) -> CSIDriver {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"attachRequired": false, "podInfoOnMount": true,
                 "volumeLifecycleModes": ["Persistent", "Ephemeral"]}
    }))
    .unwrap()
}

/// A pod on `node` that prints whether `/data` is a mount and sleeps, with a CSI inline volume
/// of `driver`.
fn csi_pod(name: &str, node: &str, driver: &str) -> Pod {
    let mut value = serde_json::to_value(bound_pod(name, node)).unwrap();
    let spec = &mut value["spec"];
    spec["terminationGracePeriodSeconds"] = 1.into();
    spec["volumes"] = serde_json::json!([
        {"name": "scratch", "csi": {"driver": driver, "volumeAttributes": {"size": "1Mi"}}}
    ]);
    let c = &mut spec["containers"][0];
    c["command"] = serde_json::json!([
        "sh",
        "-c",
        "grep -q ' /data ' /proc/mounts && echo MOUNTED; trap 'exit 0' TERM; sleep 600 & wait"
    ]);
    c["volumeMounts"] = serde_json::json!([{"name": "scratch", "mountPath": "/data"}]);
    serde_json::from_value(value).unwrap()
}

async fn running(pods: &Api<Pod>, name: &str) -> Pod {
    common::cluster::wait_phase(pods, name, "Running", WAIT).await
}

#[tokio::test]
async fn a_registered_csi_driver_serves_inline_volumes_and_an_unregistered_one_waits() {
    let client = admin().await;
    let node = "csi-node";
    let (mut agent, _node_cleanup) = joined_agent(node);
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    let _ns_cleanup = create_namespace(&client, NS).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let drivers: Api<CSIDriver> = Api::all(client.clone());
    let csi_nodes: Api<CSINode> = Api::all(client.clone());
    let pp = PostParams::default();
    for name in [MOCK, UNREGISTERED] {
        let _ = drivers.delete(name, &DeleteParams::default()).await;
        drivers
            .create(&pp, &csi_driver(name))
            .await
            .expect("create a CSIDriver");
    }

    // Registration: the plugin watcher finds the socket and the CSINode lists the driver.
    let driver = Driver::start(agent.dir.path(), &agent.root_dir());
    let entry = wait_until("the CSINode lists the mock driver", WAIT, || async {
        let csi_node = csi_nodes.get(node).await.ok()?;
        csi_node.spec.drivers.into_iter().find(|d| d.name == MOCK)
    })
    .await;
    assert_eq!(entry.node_id, MOCK, "the mock driver's node ID is its name");
    assert_eq!(entry.topology_keys, Some(vec![TOPOLOGY_KEY.to_string()]));
    assert_eq!(entry.allocatable.and_then(|a| a.count), Some(5));
    let nodes: Api<Node> = Api::all(client.clone());
    let meta = nodes.get(node).await.unwrap().metadata;
    assert_eq!(
        meta.labels
            .unwrap_or_default()
            .get(TOPOLOGY_KEY)
            .map(String::as_str),
        Some("some-mock-node")
    );
    let ids = meta
        .annotations
        .unwrap_or_default()
        .get("csi.volume.kubernetes.io/nodeid")
        .cloned();
    assert_eq!(ids, Some(format!("{{\"{MOCK}\":\"{MOCK}\"}}")));
    let csi_node = csi_nodes.get(node).await.unwrap();
    let owner = &csi_node.metadata.owner_references.unwrap()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Node", node));

    // An inline ephemeral volume, an unregistered driver's, and a pod with neither.
    pods.create(&pp, &csi_pod("inline", node, MOCK))
        .await
        .unwrap();
    pods.create(&pp, &csi_pod("orphan", node, UNREGISTERED))
        .await
        .unwrap();
    pods.create(&pp, &bound_pod("plain", node)).await.unwrap();
    let inline = running(&pods, "inline").await;
    running(&pods, "plain").await;
    let uid = inline.metadata.uid.clone().unwrap();
    let target = agent.root_dir().join(format!(
        "pods/{uid}/volumes/kubernetes.io~csi/scratch/mount"
    ));
    let publish = wait_until("NodePublishVolume in the driver's log", WAIT, || async {
        driver.calls().into_iter().find(|(m, r)| {
            m == "/csi.v1.Node/NodePublishVolume"
                && r["target_path"] == target.display().to_string()
        })
    })
    .await
    .1;
    let context = &publish["volume_context"];
    assert_eq!(
        context["csi.storage.k8s.io/pod.name"], "inline",
        "{publish}"
    );
    assert_eq!(context["csi.storage.k8s.io/pod.namespace"], NS, "{publish}");
    assert_eq!(
        context["csi.storage.k8s.io/pod.uid"],
        uid.as_str(),
        "{publish}"
    );
    assert_eq!(context["csi.storage.k8s.io/ephemeral"], "true", "{publish}");
    assert_eq!(context["size"], "1Mi", "{publish}");
    assert!(
        publish["volume_id"].as_str().unwrap().starts_with("csi-"),
        "{publish}"
    );
    let data: serde_json::Value = serde_json::from_slice(
        &std::fs::read(target.parent().unwrap().join("vol_data.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(data["driverName"], MOCK);
    assert_eq!(data["volumeLifecycleMode"], "Ephemeral");
    wait_until("the inline pod sees its mount", WAIT, || async {
        let log = common::cluster::first_run_log(&agent.logs_dir(), NS, "inline", "app");
        log.contains("MOUNTED").then_some(log)
    })
    .await;

    // The unregistered driver's pod waits with upstream's reason and message.
    let want = format!(
        "MountVolume.SetUp failed for volume \"scratch\" : kubernetes.io/csi: mounter.SetUpAt failed to get CSI client: driver name {UNREGISTERED} not found in the list of registered CSI drivers"
    );
    let (_, message) = wait_until("orphan waits in ContainerCreating", WAIT, || async {
        common::cluster::first_waiting(&pods, "orphan")
            .await
            .filter(|(r, _)| r == "ContainerCreating")
    })
    .await;
    assert_eq!(message, want);
    wait_until("the orphan's FailedMount event", WAIT, || async {
        common::cluster::event_reasons(&client, NS, "orphan")
            .await
            .into_iter()
            .find(|(r, m)| r == "FailedMount" && *m == want)
    })
    .await;

    // Deckhand restarts while the pod runs: the driver registers again (a second NodeGetInfo)
    // and the volume, found again from its vol_data.json, is still unpublished when the pod goes.
    let infos = || {
        driver
            .calls()
            .iter()
            .filter(|(m, _)| m == "/csi.v1.Node/NodeGetInfo")
            .count()
    };
    let before = infos();
    agent.stop();
    agent.start();
    wait_until(
        "the driver registered again after the restart",
        WAIT,
        || async { (infos() > before).then_some(()) },
    )
    .await;

    // The pod goes: its volume is unpublished from the same path.
    pods.delete("inline", &DeleteParams::default())
        .await
        .unwrap();
    wait_until("NodeUnpublishVolume in the driver's log", WAIT, || async {
        driver.calls().into_iter().find(|(m, r)| {
            m == "/csi.v1.Node/NodeUnpublishVolume"
                && r["target_path"] == target.display().to_string()
        })
    })
    .await;
    wait_until("the inline volume's directory is gone", WAIT, || async {
        (!target.parent().unwrap().exists()).then_some(())
    })
    .await;

    // The registration socket goes away: the driver is deregistered.
    std::fs::remove_file(&driver.registration).unwrap();
    wait_until("the CSINode no longer lists the driver", WAIT, || async {
        let csi_node = csi_nodes.get(node).await.ok()?;
        (!csi_node.spec.drivers.iter().any(|d| d.name == MOCK)).then_some(())
    })
    .await;
    let meta = nodes.get(node).await.unwrap().metadata;
    assert!(
        !meta
            .annotations
            .unwrap_or_default()
            .contains_key("csi.volume.kubernetes.io/nodeid")
    );

    // A registration socket made again (the driver restarted): registered anew.
    drop(driver);
    let _driver = Driver::start(agent.dir.path(), &agent.root_dir());
    wait_until("the CSINode lists the driver again", WAIT, || async {
        let csi_node = csi_nodes.get(node).await.ok()?;
        csi_node.spec.drivers.into_iter().find(|d| d.name == MOCK)
    })
    .await;
    for name in [MOCK, UNREGISTERED] {
        let _ = drivers.delete(name, &DeleteParams::default()).await;
    }
}

/// Where a pod's `csi-pv` volume is published.
fn volume_target(agent: &common::Agent, uid: &str) -> String {
    agent
        .root_dir()
        .join(format!("pods/{uid}/volumes/kubernetes.io~csi/csi-pv/mount"))
        .display()
        .to_string()
}

/// A static PV + PVC of the mock driver, staged and published with upstream's paths and
/// order: the pod's `persistentVolumeClaim` is resolved to the PV (`volume::persistent`) and
/// handed to `volume::csi::mount::set_up_persistent`; its `NodeGetVolumeStats` figures in
/// `/stats/summary` and the claim's `kubelet_volume_stats_*` gauges.
#[tokio::test]
async fn a_static_csi_pv_is_staged_then_published_and_torn_down_in_order() {
    let client = admin().await;
    let node = "csi-pv-node";
    let (mut agent, _node_cleanup) = joined_agent(node);
    // The volume stats are measured on this period (60 s by default); a running pod's claims
    // are looked at on each sync (every syncFrequency, 1 min by default, as upstream).
    let config = agent.dir.path().join("config.yaml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        format!("{text}volumeStatsAggPeriod: 2s\nsyncFrequency: 3s\n"),
    )
    .unwrap();
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    let _ns_cleanup = create_namespace(&client, NS).await;
    let drivers: Api<CSIDriver> = Api::all(client.clone());
    let _ = drivers
        .create(&PostParams::default(), &csi_driver(MOCK))
        .await;
    let driver = Driver::start(agent.dir.path(), &agent.root_dir());
    let pv: k8s_openapi::api::core::v1::PersistentVolume =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "csi-pv"},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "storageClassName": "", "persistentVolumeReclaimPolicy": "Retain",
                     "csi": {"driver": MOCK, "volumeHandle": "1"}}
        }))
        .unwrap();
    let pvs: Api<k8s_openapi::api::core::v1::PersistentVolume> = Api::all(client.clone());
    // A PV left by an earlier run still names that run's claim and would never bind this one.
    let _ = pvs.delete("csi-pv", &DeleteParams::default()).await;
    wait_until("no PV csi-pv left from an earlier run", WAIT, || async {
        pvs.get_opt("csi-pv").await.ok()?.is_none().then_some(())
    })
    .await;
    pvs.create(&PostParams::default(), &pv).await.unwrap();
    let pvc: k8s_openapi::api::core::v1::PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "claim"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": "csi-pv",
                 "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap();
    Api::<k8s_openapi::api::core::v1::PersistentVolumeClaim>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &pvc)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut value = serde_json::to_value(csi_pod("pv-user", node, MOCK)).unwrap();
    value["spec"]["volumes"] =
        serde_json::json!([{"name": "scratch", "persistentVolumeClaim": {"claimName": "claim"}}]);
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(value).unwrap(),
    )
    .await
    .unwrap();
    let p = running(&pods, "pv-user").await;

    // NodeGetVolumeStats (the mock advertises GET_VOLUME_STATS and gives the volume's total,
    // 100 GiB): the pod's volume in /stats/summary with its claim, and the claim's gauges.
    let base = format!("http://{}:{}", agent.address, agent.read_only_port);
    let uid = p.metadata.uid.clone().unwrap();
    let volume = wait_until("the CSI volume in /stats/summary", WAIT, || async {
        let (_, body) = common::http_get(&format!("{base}/stats/summary")).await?;
        let summary: serde_json::Value = serde_json::from_str(&body).ok()?;
        let pod = summary["pods"]
            .as_array()?
            .iter()
            .find(|p| p["podRef"]["uid"] == uid.as_str())?
            .clone();
        pod["volume"]
            .as_array()?
            .iter()
            .find(|v| v["name"] == "scratch")
            .cloned()
    })
    .await;
    assert_eq!(volume["capacityBytes"], 107374182400u64, "{volume}");
    assert_eq!(
        volume["pvcRef"],
        serde_json::json!({"name": "claim", "namespace": NS}),
        "{volume}"
    );
    assert!(
        driver
            .calls()
            .iter()
            .any(|(m, r)| m.ends_with("NodeGetVolumeStats")
                && r["volume_path"] == volume_target(&agent, &uid)),
        "NodeGetVolumeStats asked for the published path"
    );
    let (_, metrics) = common::http_get(&format!("{base}/metrics")).await.unwrap();
    let series = format!(
        "kubelet_volume_stats_capacity_bytes{{namespace=\"{NS}\",persistentvolumeclaim=\"claim\"}} 107374182400"
    );
    assert!(
        metrics.lines().any(|l| l == series),
        "{series} in\n{metrics}"
    );

    expand_online(&client, &driver, &agent, &uid).await;

    pods.delete("pv-user", &DeleteParams::default())
        .await
        .unwrap();
    wait_until("NodeUnstageVolume in the driver's log", WAIT, || async {
        driver
            .calls()
            .iter()
            .any(|(m, _)| m == "/csi.v1.Node/NodeUnstageVolume")
            .then_some(())
    })
    .await;
    let calls: Vec<String> = driver
        .calls()
        .into_iter()
        .map(|(m, _)| m)
        .filter(|m| {
            let m = m.to_ascii_lowercase();
            m.contains("stagevolume") || m.contains("publishvolume")
        })
        .collect();
    assert_eq!(
        calls,
        [
            "/csi.v1.Node/NodeStageVolume",
            "/csi.v1.Node/NodePublishVolume",
            "/csi.v1.Node/NodeUnpublishVolume",
            "/csi.v1.Node/NodeUnstageVolume",
        ]
    );
    let target = agent.root_dir().join(format!(
        "pods/{}/volumes/kubernetes.io~csi/csi-pv/mount",
        p.metadata.uid.unwrap()
    ));
    assert!(
        driver
            .calls()
            .iter()
            .any(|(m, r)| m.ends_with("NodePublishVolume")
                && r["target_path"] == target.display().to_string())
    );
    let _ = pvs.delete("csi-pv", &DeleteParams::default()).await;
}

/// Plays the resize controller (the external-resizer sidecar and the controller manager's
/// expand controller, which the test cluster does not run) for `claim` on `csi-pv`: the PV
/// grown to 2Gi, the claim's status handing the expansion to the node (`allocatedResources`
/// 2Gi, `NodeResizePending`). Deckhand's next sync of the pod calls the driver's
/// `NodeExpandVolume` on the published volume and writes the claim's new capacity, with
/// upstream's event.
async fn expand_online(client: &kube::Client, driver: &Driver, agent: &common::Agent, uid: &str) {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    use kube::api::{Patch, PatchParams};
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    let grow = serde_json::json!({"spec": {"capacity": {"storage": "2Gi"}}});
    pvs.patch("csi-pv", &PatchParams::default(), &Patch::Merge(&grow))
        .await
        .unwrap();
    let pending = serde_json::json!({"status": {
        "allocatedResources": {"storage": "2Gi"},
        "allocatedResourceStatuses": {"storage": "NodeResizePending"},
        "conditions": [{"type": "FileSystemResizePending", "status": "True"}],
    }});
    claims
        .patch_status("claim", &PatchParams::default(), &Patch::Merge(&pending))
        .await
        .unwrap();
    let status = wait_until(
        "the claim's capacity 2Gi after the node's expansion",
        WAIT,
        || async {
            let c = claims.get("claim").await.ok()?;
            let status = c.status?;
            (status.capacity?.get("storage")?.0 == "2Gi").then_some(())?;
            // The controller manager keeps conditions of its own (`Unused`): only the
            // resize ones are the node's to remove.
            let resize: Vec<String> = (status.conditions.into_iter().flatten())
                .map(|c| c.type_)
                .filter(|t| t.contains("Resiz"))
                .collect();
            Some(serde_json::json!({
                "statuses": status.allocated_resource_statuses,
                "resize conditions": resize,
            }))
        },
    )
    .await;
    assert_eq!(
        status,
        serde_json::json!({"statuses": null, "resize conditions": []}),
        "the resize tracking and its conditions are gone"
    );
    let expand = driver
        .calls()
        .into_iter()
        .find(|(m, _)| m == "/csi.v1.Node/NodeExpandVolume")
        .map(|(_, r)| r)
        .expect("NodeExpandVolume in the driver's log");
    assert_eq!(expand["volume_id"], "1", "{expand}");
    assert_eq!(expand["volume_path"], volume_target(agent, uid), "{expand}");
    assert_eq!(
        expand["capacity_range"]["required_bytes"],
        2u64 << 30,
        "{expand}"
    );
    let staged = expand["staging_target_path"].as_str().unwrap_or_default();
    assert!(staged.ends_with("/globalmount"), "{expand}");
    let want = (
        "FileSystemResizeSuccessful".to_string(),
        "MountVolume.NodeExpandVolume succeeded for volume \"csi-pv\" csi-pv-node".to_string(),
    );
    for object in ["pv-user", "claim"] {
        wait_until(&format!("{want:?} about {object}"), WAIT, || async {
            let events = common::cluster::event_reasons(client, NS, object).await;
            events.contains(&want).then_some(())
        })
        .await;
    }
}

/// A driver whose CSIDriver requires attachment (a name of its own: CSIDriver objects are
/// cluster-wide and the other tests' says `attachRequired: false`).
const ATTACHED: &str = "attach.csi.mock";
const ATTACH_NS: &str = "e2e-csi-attach";
/// What the test's attacher writes as the attachment's metadata (the publish context).
const DEVICE: &str = "/dev/mock-attached";

/// Plays the external attacher (the `csi-attacher` sidecar, which is the driver's, not the
/// kubelet's): marks every VolumeAttachment of `ATTACHED` for `node` attached with
/// `attachmentMetadata`, as the sidecar does after ControllerPublishVolume. The attach/detach
/// controller in the real controller-manager creates and deletes the VolumeAttachments.
async fn attacher(client: kube::Client, node: String) {
    use k8s_openapi::api::storage::v1::VolumeAttachment;
    let vas: Api<VolumeAttachment> = Api::all(client);
    loop {
        for va in vas
            .list(&Default::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
        {
            let pending = va.status.as_ref().is_none_or(|s| !s.attached);
            if va.spec.attacher == ATTACHED && va.spec.node_name == node && pending {
                let patch = serde_json::json!({"status": {
                    "attached": true, "attachmentMetadata": {"device": DEVICE}}});
                let name = va.metadata.name.clone().unwrap_or_default();
                let _ = vas
                    .patch_status(&name, &Default::default(), &kube::api::Patch::Merge(&patch))
                    .await;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn in_use(node: &Node) -> Vec<String> {
    node.status
        .as_ref()
        .and_then(|s| s.volumes_in_use.clone())
        .unwrap_or_default()
}

fn attached_volumes(node: &Node) -> Vec<String> {
    node.status
        .as_ref()
        .and_then(|s| s.volumes_attached.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|a| a.name)
        .collect()
}

/// `attachRequired: true`: the node reports the claim's volume in `volumesInUse` at once; the
/// pod waits in ContainerCreating with upstream's message while the controller has not
/// attached it; once the VolumeAttachment is attached and the Node lists the volume in
/// `volumesAttached`, it is staged and published with the attachment's metadata as the
/// publish context and the pod runs; after the pod is deleted the volume leaves
/// `volumesInUse` and the controller detaches it.
#[tokio::test]
async fn an_attach_required_volume_waits_for_the_controller_and_is_detached_after_the_pod() {
    use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim};
    use k8s_openapi::api::storage::v1::VolumeAttachment;
    let client = admin().await;
    let node = "csi-attach-node";
    let (mut agent, _node_cleanup) = joined_agent(node);
    agent
        .extra_args
        .push("--node-status-update-frequency=2s".into());
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    let _ns_cleanup = create_namespace(&client, ATTACH_NS).await;
    let drivers: Api<CSIDriver> = Api::all(client.clone());
    let _ = drivers.delete(ATTACHED, &DeleteParams::default()).await;
    let mut object = csi_driver(ATTACHED);
    object.spec.attach_required = Some(true);
    drivers
        .create(&PostParams::default(), &object)
        .await
        .unwrap();
    let driver = Driver::start_as(agent.dir.path(), &agent.root_dir(), ATTACHED);
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pv_name = "csi-attach-pv";
    let _ = pvs.delete(pv_name, &DeleteParams::default()).await;
    wait_until(
        "no PV csi-attach-pv left from an earlier run",
        WAIT,
        || async { pvs.get_opt(pv_name).await.ok()?.is_none().then_some(()) },
    )
    .await;
    let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
        "metadata": {"name": pv_name},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "storageClassName": "", "persistentVolumeReclaimPolicy": "Retain",
                 "csi": {"driver": ATTACHED, "volumeHandle": "2"}}
    }))
    .unwrap();
    pvs.create(&PostParams::default(), &pv).await.unwrap();
    let pvc: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "claim"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": pv_name,
                 "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap();
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), ATTACH_NS)
        .create(&PostParams::default(), &pvc)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ATTACH_NS);
    let mut value = serde_json::to_value(csi_pod("attached", node, ATTACHED)).unwrap();
    value["spec"]["volumes"] =
        serde_json::json!([{"name": "scratch", "persistentVolumeClaim": {"claimName": "claim"}}]);
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(value).unwrap(),
    )
    .await
    .unwrap();
    let unique = format!("kubernetes.io/csi/{ATTACHED}^2");
    let nodes: Api<Node> = Api::all(client.clone());

    // Not attached yet (no attacher runs): reported in use, waiting with upstream's message.
    wait_until("the Node reports the volume in use", WAIT, || async {
        in_use(&nodes.get(node).await.ok()?)
            .contains(&unique)
            .then_some(())
    })
    .await;
    let events: Api<Event> = Api::namespaced(client.clone(), ATTACH_NS);
    let wanted = "Unable to attach or mount volumes: unmounted volumes=[scratch], unattached volumes=[scratch], failed to process volumes=[]";
    let message = wait_until(
        "a FailedMount event naming the unattached volume",
        WAIT,
        || async {
            let list = events.list(&Default::default()).await.ok()?;
            list.items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("FailedMount"))
                .filter_map(|e| e.message)
                .find(|m| m.starts_with(wanted))
        },
    )
    .await;
    assert!(
        message.contains("not attached") || message.contains("VolumesInUse"),
        "{message}"
    );
    let p = pods.get("attached").await.unwrap();
    let waiting = p
        .status
        .and_then(|s| s.container_statuses)
        .unwrap_or_default();
    assert!(
        waiting.iter().all(|c| c
            .state
            .as_ref()
            .and_then(|s| s.waiting.as_ref())
            .is_some_and(|w| w.reason.as_deref() == Some("ContainerCreating"))),
        "the pod waits in ContainerCreating: {waiting:?}"
    );
    assert!(
        !driver
            .calls()
            .iter()
            .any(|(m, _)| m.ends_with("NodeStageVolume")),
        "nothing is staged before the attach"
    );

    // The attacher marks the controller's VolumeAttachment attached: the pod runs.
    let attaching = tokio::spawn(attacher(client.clone(), node.to_string()));
    running(&pods, "attached").await;
    let n = nodes.get(node).await.unwrap();
    assert!(attached_volumes(&n).contains(&unique), "{:?}", n.status);
    assert!(in_use(&n).contains(&unique));
    for call in ["NodeStageVolume", "NodePublishVolume"] {
        let (_, request) = driver
            .calls()
            .into_iter()
            .find(|(m, _)| m.ends_with(call))
            .unwrap_or_else(|| panic!("{call} in the driver's log"));
        assert_eq!(
            request["publish_context"]["device"], DEVICE,
            "{call} carries the attachment's metadata: {request}"
        );
    }

    // The pod goes: the volume leaves volumesInUse, then the controller detaches it.
    pods.delete("attached", &DeleteParams::default())
        .await
        .unwrap();
    wait_until("the volume no longer in use", WAIT, || async {
        (!in_use(&nodes.get(node).await.ok()?).contains(&unique)).then_some(())
    })
    .await;
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    wait_until("the controller detached the volume", WAIT, || async {
        let n = nodes.get(node).await.ok()?;
        let list = vas.list(&Default::default()).await.ok()?;
        let left = list.items.iter().any(|va| va.spec.node_name == node);
        (!left && !attached_volumes(&n).contains(&unique)).then_some(())
    })
    .await;
    assert!(
        driver
            .calls()
            .iter()
            .any(|(m, _)| m.ends_with("NodeUnstageVolume")),
        "unstaged before the detach"
    );
    attaching.abort();
    let _ = pvs.delete(pv_name, &DeleteParams::default()).await;
    let _ = drivers.delete(ATTACHED, &DeleteParams::default()).await;
}

/// A driver whose CSIDriver asks for the pod's tokens and a republish (a name of its own:
/// CSIDriver objects are cluster-wide).
const TOKENS: &str = "tokens.csi.mock";
const TOKENS_NS: &str = "e2e-csi-tokens";
/// The audience its `tokenRequests` name (beside an empty one: the API server's own).
const AUDIENCE: &str = "e2e-csi-vault";
const TOKENS_KEY: &str = "csi.storage.k8s.io/serviceAccount.tokens";

/// The claims of a JWT (its middle part), as the API server signed them.
fn jwt_claims(token: &str) -> serde_json::Value {
    use base64::Engine;
    let payload = token.split('.').nth(1).expect("a JWT has three parts");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload)
        .expect("the JWT's payload is base64url");
    serde_json::from_slice(&bytes).expect("the JWT's payload is JSON")
}

/// The tokens a NodePublishVolume request carries, by audience.
fn published_tokens(request: &serde_json::Value) -> serde_json::Value {
    let text = request["volume_context"][TOKENS_KEY]
        .as_str()
        .unwrap_or_else(|| panic!("{TOKENS_KEY} in the volume context: {request}"));
    serde_json::from_str(text).expect("the tokens are JSON")
}

/// Checks a token handed to the driver: issued by the API server for `pod` (bound to it),
/// for `audience` when one is named, and its `expirationTimestamp` the JWT's `exp`.
fn check_token(entry: &serde_json::Value, pod: &Pod, audience: Option<&str>) {
    let claims = jwt_claims(entry["token"].as_str().expect("a token"));
    let bound = &claims["kubernetes.io"]["pod"];
    assert_eq!(
        bound["name"],
        pod.metadata.name.as_deref().unwrap(),
        "{claims}"
    );
    assert_eq!(
        bound["uid"],
        pod.metadata.uid.as_deref().unwrap(),
        "{claims}"
    );
    let aud: Vec<&str> = claims["aud"]
        .as_array()
        .expect("aud is a list")
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    match audience {
        Some(audience) => assert_eq!(aud, [audience], "{claims}"),
        // The API server's own audiences.
        None => assert!(!aud.is_empty() && !aud.contains(&AUDIENCE), "{claims}"),
    }
    let exp = claims["exp"].as_i64().expect("exp");
    let expires = jiff::Timestamp::from_second(exp)
        .unwrap()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    assert_eq!(entry["expirationTimestamp"], expires.as_str(), "{claims}");
}

/// `tokenRequests` and `requiresRepublish`: NodePublishVolume carries the pod's tokens in
/// the volume context under `csi.storage.k8s.io/serviceAccount.tokens` (for the named
/// audience, with its `expirationSeconds`, and for the empty one, the API server's
/// audiences), tokens the API server issued bound to the pod; the volume is published again
/// on the pod's syncs (upstream's remount, at least once per `syncFrequency`, here 2 s), with
/// tokens, while the pod keeps running, and unpublished only when the pod goes.
#[tokio::test]
async fn token_requests_reach_the_driver_and_its_volumes_are_published_again() {
    use k8s_openapi::api::storage::v1::TokenRequest;
    let client = admin().await;
    let node = "csi-token-node";
    let (mut agent, _node_cleanup) = joined_agent(node);
    agent.extra_args.push("--sync-frequency=2s".into());
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    let _ns_cleanup = create_namespace(&client, TOKENS_NS).await;
    let drivers: Api<CSIDriver> = Api::all(client.clone());
    let _ = drivers.delete(TOKENS, &DeleteParams::default()).await;
    let mut object = csi_driver(TOKENS);
    object.spec.token_requests = Some(vec![
        TokenRequest {
            audience: AUDIENCE.into(),
            expiration_seconds: Some(600),
        },
        TokenRequest {
            audience: String::new(),
            expiration_seconds: None,
        },
    ]);
    object.spec.requires_republish = Some(true);
    drivers
        .create(&PostParams::default(), &object)
        .await
        .unwrap();
    let driver = Driver::start_as(agent.dir.path(), &agent.root_dir(), TOKENS);
    let csi_nodes: Api<CSINode> = Api::all(client.clone());
    wait_until("the CSINode lists the token driver", WAIT, || async {
        let csi_node = csi_nodes.get(node).await.ok()?;
        csi_node.spec.drivers.into_iter().find(|d| d.name == TOKENS)
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), TOKENS_NS);
    pods.create(&PostParams::default(), &csi_pod("tokens", node, TOKENS))
        .await
        .unwrap();
    let pod = running(&pods, "tokens").await;
    let uid = pod.metadata.uid.clone().unwrap();
    let target = agent
        .root_dir()
        .join(format!(
            "pods/{uid}/volumes/kubernetes.io~csi/scratch/mount"
        ))
        .display()
        .to_string();
    let calls_for = |method: &'static str| {
        let target = target.clone();
        driver
            .calls()
            .into_iter()
            .filter(move |(m, r)| m == method && r["target_path"] == target.as_str())
            .map(|(_, r)| r)
            .collect::<Vec<_>>()
    };
    const PUBLISH: &str = "/csi.v1.Node/NodePublishVolume";
    const UNPUBLISH: &str = "/csi.v1.Node/NodeUnpublishVolume";

    // The first publish carries both tokens, bound to the pod.
    let first = wait_until("NodePublishVolume in the driver's log", WAIT, || async {
        calls_for(PUBLISH).into_iter().next()
    })
    .await;
    let tokens = published_tokens(&first);
    check_token(&tokens[AUDIENCE], &pod, Some(AUDIENCE));
    check_token(&tokens[""], &pod, None);
    let claims = jwt_claims(tokens[AUDIENCE]["token"].as_str().unwrap());
    let lifetime = claims["exp"].as_i64().unwrap() - claims["iat"].as_i64().unwrap();
    assert_eq!(lifetime, 600, "the expirationSeconds asked for: {claims}");

    // Published again while the pod runs, each time with the tokens; never unpublished.
    let publishes = wait_until(
        "three NodePublishVolume calls for the volume",
        WAIT,
        || async { Some(calls_for(PUBLISH)).filter(|p| p.len() >= 3) },
    )
    .await;
    for request in &publishes {
        check_token(&published_tokens(request)[AUDIENCE], &pod, Some(AUDIENCE));
    }
    assert!(
        calls_for(UNPUBLISH).is_empty(),
        "no unpublish while the pod runs"
    );
    let now = pods.get("tokens").await.unwrap();
    let status = now.status.unwrap_or_default();
    assert_eq!(status.phase.as_deref(), Some("Running"));
    let restarts: Vec<i32> = status
        .container_statuses
        .unwrap_or_default()
        .iter()
        .map(|c| c.restart_count)
        .collect();
    assert_eq!(restarts, [0], "the pod keeps running as it was");

    // The pod goes: unpublished once.
    pods.delete("tokens", &DeleteParams::default())
        .await
        .unwrap();
    wait_until("NodeUnpublishVolume in the driver's log", WAIT, || async {
        Some(calls_for(UNPUBLISH)).filter(|u| !u.is_empty())
    })
    .await;
    let _ = drivers.delete(TOKENS, &DeleteParams::default()).await;
}
