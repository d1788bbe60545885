//! End to end, against the real test control plane and the private containerd: pods with
//! `persistentVolumeClaim` volumes (issue 29). The real controller-manager binds the claims;
//! Deckhand resolves each claim to its bound volume as upstream's kubelet does.
//!
//! - A claim that never binds keeps its pod in `ContainerCreating` with upstream's
//!   `FailedMount` message; a local volume whose node affinity names another node keeps its
//!   pod waiting with the mount operation's node-affinity message; other pods run.
//! - A claim pre-bound to a local volume that does not exist yet: the pod waits, and starts
//!   once the volume is created and the claim binds. Its data is the volume's: it survives the
//!   pod's deletion, a new pod sees it, a Deckhand restart unmounts nothing in use, and the
//!   pod's teardown unmounts without deleting it. A `readOnly` claim is mounted read-only.
//! - Dynamic provisioning with a real provisioner: Rancher's local-path-provisioner (built
//!   from its module and run as a host process by `scripts/cluster local-path-provisioner`)
//!   gives each replica of a StatefulSet its volume; the real scheduler places the replicas
//!   and the controller-manager binds the claims. A replica's data survives its pod's
//!   deletion and a Deckhand restart; scaled down and its claims deleted, the provisioner's own
//!   helper pods, run by Deckhand, remove the data.

mod common;

use std::path::Path;
use std::time::Duration;

use common::cluster::{
    admin, bound_pod_with, clean_up_with_admin, cluster_cmd, cluster_dir, create_namespace,
    events_of, first_waiting, joined_agent, sleeping_spec, wait_node_ready,
};
use common::wait_until;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};

const WAIT: Duration = Duration::from_secs(60);
const NS: &str = "e2e-pv";

/// Deletes the cluster-scoped PVs the test made when dropped (they outlive the namespace).
struct PvCleanup(Vec<String>);

impl Drop for PvCleanup {
    fn drop(&mut self) {
        let names = std::mem::take(&mut self.0);
        clean_up_with_admin(move |client| async move {
            let api: Api<PersistentVolume> = Api::all(client);
            for name in names {
                let _ = api.delete(&name, &DeleteParams::default()).await;
            }
        });
    }
}

fn claim(name: &str, volume: Option<&str>, class: &str) -> PersistentVolumeClaim {
    let mut spec = serde_json::json!({
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": class,
        "resources": {"requests": {"storage": "1Mi"}},
    });
    if let Some(v) = volume {
        spec["volumeName"] = v.into();
    }
    serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "spec": spec})).unwrap()
}

/// A local PV at `path` whose node affinity names `host`.
fn local_pv(name: &str, path: &Path, host: &str) -> PersistentVolume {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Mi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "local": {"path": path.to_string_lossy()},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": [host]}
            ]}]}},
        },
    }))
    .unwrap()
}

/// A pod on `node` with the claim `claim_name` at /data that runs `script`, then sleeps.
fn claim_pod(name: &str, node: &str, claim_name: &str, read_only: bool, script: &str) -> Pod {
    let mut spec = sleeping_spec(1);
    spec["volumes"] = serde_json::json!([
        {"name": "data", "persistentVolumeClaim": {"claimName": claim_name, "readOnly": read_only}}
    ]);
    spec["containers"][0]["volumeMounts"] =
        serde_json::json!([{"name": "data", "mountPath": "/data"}]);
    spec["containers"][0]["command"] = serde_json::json!([
        "sh",
        "-c",
        format!("{script}; trap 'exit 0' TERM; sleep 600 & wait")
    ]);
    bound_pod_with(name, node, spec)
}

async fn wait_running(pods: &Api<Pod>, name: &str) -> Pod {
    common::cluster::wait_phase(pods, name, "Running", WAIT).await
}

/// Waits for a FailedMount event about `pod` whose message is `want`.
async fn wait_failed_mount(client: &kube::Client, pod: &str, want: &str) {
    wait_until(&format!("{pod}: FailedMount {want:?}"), WAIT, || async {
        let events = events_of(client, NS, pod).await;
        events
            .iter()
            .any(|e| {
                e.reason.as_deref() == Some("FailedMount") && e.message.as_deref() == Some(want)
            })
            .then_some(())
    })
    .await;
}

/// Waits for the pod's container to wait in ContainerCreating.
async fn wait_creating(pods: &Api<Pod>, name: &str) {
    wait_until(
        &format!("{name} waits in ContainerCreating"),
        WAIT,
        || async {
            let (reason, _) = first_waiting(pods, name).await?;
            (reason == "ContainerCreating").then_some(())
        },
    )
    .await;
}

fn is_mount_point(path: &Path) -> bool {
    let Ok(real) = path.canonicalize() else {
        return false;
    };
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    table
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .any(|p| Path::new(p) == real)
}

#[tokio::test]
async fn claims_wait_for_binding_and_local_volumes_keep_their_data() {
    let client = admin().await;
    let node = "pv-node";
    let (mut agent, _node_cleanup) = joined_agent(node);
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    let _ns_cleanup = create_namespace(&client, NS).await;
    let _pv_cleanup = PvCleanup(vec!["e2e-pv-local".into(), "e2e-pv-elsewhere".into()]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let pp = PostParams::default();
    let disks = tempfile::tempdir().unwrap();
    let disk = disks.path().join("local");
    std::fs::create_dir(&disk).unwrap();

    // A claim no volume or provisioner will ever satisfy; a claim bound to a local volume
    // of another node; a claim pre-bound to a local volume of this node not made yet.
    claims
        .create(&pp, &claim("never", None, "e2e-none"))
        .await
        .unwrap();
    claims
        .create(&pp, &claim("elsewhere", Some("e2e-pv-elsewhere"), ""))
        .await
        .unwrap();
    claims
        .create(&pp, &claim("data", Some("e2e-pv-local"), ""))
        .await
        .unwrap();
    volumes
        .create(&pp, &local_pv("e2e-pv-elsewhere", &disk, "another-node"))
        .await
        .unwrap();
    for p in [
        claim_pod("never", node, "never", false, "true"),
        claim_pod("elsewhere", node, "elsewhere", false, "true"),
        claim_pod("writer", node, "data", false, "echo hello > /data/hello"),
        bound_pod_with("plain", node, sleeping_spec(1)),
    ] {
        pods.create(&pp, &p).await.expect("create a pod");
    }

    // Other pods are unaffected.
    wait_running(&pods, "plain").await;
    wait_failed_mount(
        &client,
        "never",
        &format!(
            "Unable to attach or mount volumes: unmounted volumes=[data], unattached volumes=[], \
             failed to process volumes=[data]: error processing PVC {NS}/never: PVC is not bound"
        ),
    )
    .await;
    wait_creating(&pods, "never").await;
    wait_failed_mount(
        &client,
        "elsewhere",
        "MountVolume.NodeAffinity check failed for volume \"e2e-pv-elsewhere\" : no matching NodeSelectorTerms",
    )
    .await;
    wait_creating(&pods, "elsewhere").await;
    wait_failed_mount(
        &client,
        "writer",
        &format!(
            "Unable to attach or mount volumes: unmounted volumes=[data], unattached volumes=[], \
             failed to process volumes=[data]: error processing PVC {NS}/data: PVC is not bound"
        ),
    )
    .await;

    // The volume appears; the controller-manager binds the claim; the pod starts.
    volumes
        .create(&pp, &local_pv("e2e-pv-local", &disk, node))
        .await
        .unwrap();
    let writer = wait_running(&pods, "writer").await;
    let uid = writer.metadata.uid.clone().unwrap();
    let dir = agent
        .root_dir()
        .join("pods")
        .join(&uid)
        .join("volumes/kubernetes.io~local-volume/e2e-pv-local");
    wait_until("the writer's file on the local volume", WAIT, || async {
        (std::fs::read_to_string(disk.join("hello")).ok()? == "hello\n").then_some(())
    })
    .await;
    assert!(is_mount_point(&dir), "{} is a bind mount", dir.display());

    // A read-only claim of the same volume on the same node.
    pods.create(
        &pp,
        &claim_pod(
            "reader",
            node,
            "data",
            true,
            "cat /data/hello > /dev/termination-log; touch /data/x 2>/dev/null && echo rw || echo ro",
        ),
    )
    .await
    .unwrap();
    wait_running(&pods, "reader").await;

    // A restart of Deckhand unmounts nothing that is in use.
    agent.stop();
    agent.start();
    agent.wait_healthy(WAIT).await;
    wait_until(
        "the writer still Running after the restart",
        WAIT,
        || async {
            let p = pods.get("writer").await.ok()?;
            (p.status?.phase.as_deref() == Some("Running")).then_some(())
        },
    )
    .await;
    assert!(
        is_mount_point(&dir),
        "the restart left {} mounted",
        dir.display()
    );
    assert!(
        !disk.join("x").exists(),
        "the read-only claim could not write"
    );

    // The pod goes: its mount goes, the volume's data stays; a new pod sees it.
    pods.delete("writer", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    wait_until(
        "the writer's volume unmounted and removed",
        WAIT,
        || async { (!dir.exists()).then_some(()) },
    )
    .await;
    assert_eq!(
        std::fs::read_to_string(disk.join("hello")).unwrap(),
        "hello\n",
        "the volume's data survives its pod"
    );
    pods.create(
        &pp,
        &claim_pod(
            "again",
            node,
            "data",
            false,
            "cat /data/hello >> /data/seen",
        ),
    )
    .await
    .unwrap();
    wait_running(&pods, "again").await;
    wait_until("the new pod read the old data", WAIT, || async {
        (std::fs::read_to_string(disk.join("seen")).ok()? == "hello\n").then_some(())
    })
    .await;
    agent.stop();
}

/// local-path-provisioner for the cluster, its volumes under `path`; stopped (and its API
/// objects removed) when dropped.
struct Provisioner;

impl Provisioner {
    fn start(path: &Path) -> Provisioner {
        let dir = cluster_dir();
        cluster_cmd(&[
            "local-path-provisioner",
            &dir.to_string_lossy(),
            "--path",
            &path.to_string_lossy(),
        ]);
        Provisioner
    }
}

impl Drop for Provisioner {
    fn drop(&mut self) {
        let dir = cluster_dir();
        let _ = std::process::Command::new(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/cluster"),
        )
        .args(["local-path-provisioner-down", &dir.to_string_lossy()])
        .status();
    }
}

const STS_NS: &str = "e2e-pv-sts";

fn stateful_set(node: &str) -> StatefulSet {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": "db"},
        "spec": {
            "replicas": 3,
            "serviceName": "db",
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": {"app": "db"}},
            "template": {
                "metadata": {"labels": {"app": "db"}},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "automountServiceAccountToken": false,
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "app",
                        "image": common::BUSYBOX,
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c",
                            "hostname >> /data/boots; trap 'exit 0' TERM; sleep 600 & wait"],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    }],
                },
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": "local-path",
                    "resources": {"requests": {"storage": "1Mi"}},
                },
            }],
        },
    }))
    .unwrap()
}

/// The name and node path of the volume bound to the claim `claim` (the provisioner's
/// hostPath).
async fn volume_path(client: &kube::Client, claim: &str) -> (String, std::path::PathBuf) {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), STS_NS);
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    wait_until(
        &format!("claim {claim} bound to a hostPath volume"),
        WAIT,
        || async {
            let c = claims.get(claim).await.ok()?;
            let name = c.spec?.volume_name?;
            let pv = volumes.get(&name).await.ok()?;
            Some((name, std::path::PathBuf::from(pv.spec?.host_path?.path)))
        },
    )
    .await
}

/// The `boots` file of a replica's volume once it has `lines` lines.
async fn wait_boots(path: &Path, lines: usize) -> String {
    wait_until(
        &format!("{} with {lines} boots", path.display()),
        WAIT,
        || async {
            let text = std::fs::read_to_string(path.join("boots")).ok()?;
            (text.lines().count() == lines).then_some(text)
        },
    )
    .await
}

/// Deletes the pod and waits until the StatefulSet controller's new one runs.
async fn recreate(pods: &Api<Pod>, name: &str) {
    let old = pods.get(name).await.unwrap().metadata.uid;
    pods.delete(name, &DeleteParams::default()).await.unwrap();
    wait_until(
        &format!("{name} recreated and Running"),
        WAIT * 2,
        || async {
            let p = pods.get(name).await.ok()?;
            (p.metadata.uid != old && p.status?.phase.as_deref() == Some("Running")).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn a_stateful_set_keeps_its_provisioned_local_data_until_its_claims_go() {
    let client = admin().await;
    let node = "pvs-node";
    let (mut agent, _node_cleanup) = joined_agent(node);
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    let storage = tempfile::tempdir().unwrap();
    let _provisioner = Provisioner::start(storage.path());
    // Declared after the provisioner, so dropped before it: PVs it did not delete go.
    let mut pv_cleanup = PvCleanup(Vec::new());
    let _ns_cleanup = create_namespace(&client, STS_NS).await;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), STS_NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), STS_NS);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), STS_NS);
    sets.create(&PostParams::default(), &stateful_set(node))
        .await
        .expect("create the StatefulSet");

    wait_until("3 replicas Ready", WAIT * 3, || async {
        let s = sets.get("db").await.ok()?;
        (s.status?.ready_replicas == Some(3)).then_some(())
    })
    .await;
    let mut paths = Vec::new();
    let mut names = Vec::new();
    for i in 0..3 {
        let (name, path) = volume_path(&client, &format!("data-db-{i}")).await;
        names.push(name);
        assert!(
            path.starts_with(storage.path()),
            "{} is under the provisioner's path",
            path.display()
        );
        assert_eq!(wait_boots(&path, 1).await, format!("db-{i}\n"));
        paths.push(path);
    }
    pv_cleanup.0.extend(names.iter().cloned());

    // The data outlives the pod, and a restart of Deckhand.
    recreate(&pods, "db-0").await;
    assert_eq!(wait_boots(&paths[0], 2).await, "db-0\ndb-0\n");
    agent.stop();
    agent.start();
    agent.wait_healthy(WAIT).await;
    recreate(&pods, "db-0").await;
    assert_eq!(wait_boots(&paths[0], 3).await, "db-0\ndb-0\ndb-0\n");
    assert_eq!(
        std::fs::read_to_string(paths[1].join("boots")).unwrap(),
        "db-1\n"
    );

    // Scaled to none and the claims deleted: the provisioner's helper pods remove the data.
    sets.patch(
        "db",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"replicas": 0}})),
    )
    .await
    .unwrap();
    wait_until("the replicas gone", WAIT * 2, || async {
        let list = pods.list(&ListParams::default()).await.ok()?;
        list.items.is_empty().then_some(())
    })
    .await;
    for i in 0..3 {
        claims
            .delete(&format!("data-db-{i}"), &DeleteParams::default())
            .await
            .unwrap();
    }
    for path in &paths {
        wait_until(
            &format!("{} removed by a helper pod", path.display()),
            WAIT * 2,
            || async { (!path.exists()).then_some(()) },
        )
        .await;
    }
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    for name in &names {
        wait_until(
            &format!("volume {name} deleted by the provisioner"),
            WAIT,
            || async { volumes.get_opt(name).await.ok()?.is_none().then_some(()) },
        )
        .await;
    }
    agent.stop();
}
