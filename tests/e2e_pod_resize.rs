//! End to end, against the real test control plane and the private containerd: in-place pod
//! resize through the API server's `resize` subresource.
//!
//! A pod bound to a Deckhand node runs one container with cpu and memory requests and limits
//! (`resizePolicy` NotRequired for both). Patching the pod's `resize` subresource to larger
//! values changes the container's cgroup limits in place, read inside the container
//! (`cpu.cfs_quota_us`, `memory.limit_in_bytes`, cgroup v1) through CRI `ExecSync`: the same
//! container, never restarted; the pod's status follows (`allocatedResources`, `resources`, no
//! resize condition left). A resize that fits the node but not beside another pod is left
//! pending (`PodResizePending`, `Deferred`, upstream's message) with the limits as they were,
//! and is applied once that pod is deleted. (One beyond the node's allocatable never reaches
//! the node: the v1.37 API server refuses it.)

mod common;

use std::time::Duration;

use common::cluster::{admin, bound_pod_with, create_namespace, joined_agent, wait_node_ready};
use common::{BUSYBOX, cri, wait_until};
use deckhand::clients::cri::RuntimeService;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};

const WAIT: Duration = Duration::from_secs(90);

fn resources(cpu_req: &str, mem_req: &str, cpu_lim: &str, mem_lim: &str) -> serde_json::Value {
    serde_json::json!({
        "requests": {"cpu": cpu_req, "memory": mem_req},
        "limits": {"cpu": cpu_lim, "memory": mem_lim},
    })
}

fn resizable_pod(name: &str, node: &str) -> Pod {
    bound_pod_with(
        name,
        node,
        serde_json::json!({
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "app",
                "image": BUSYBOX,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"],
                "resources": resources("100m", "64Mi", "200m", "128Mi"),
                "resizePolicy": [
                    {"resourceName": "cpu", "restartPolicy": "NotRequired"},
                    {"resourceName": "memory", "restartPolicy": "NotRequired"},
                ],
            }],
        }),
    )
}

/// The running container of pod `name` in `ns`, by ID.
async fn running_container(
    cri: &deckhand::clients::cri::CriClient,
    ns: &str,
    name: &str,
) -> String {
    wait_until(&format!("{name}'s running container"), WAIT, || async {
        common::containers_of(cri, name)
            .await
            .into_iter()
            .filter(|c| {
                c.labels
                    .get("io.kubernetes.pod.namespace")
                    .map(String::as_str)
                    == Some(ns)
            })
            .find(|c| c.state == 1)
            .map(|c| c.id)
    })
    .await
}

/// The container's CFS quota and memory limit, read inside it.
async fn limits_inside(
    cri: &deckhand::clients::cri::CriClient,
    id: &str,
) -> Option<(String, String)> {
    let cmd = [
        "cat",
        "/sys/fs/cgroup/cpu/cpu.cfs_quota_us",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ];
    let out = cri
        .exec_sync(
            id.to_string(),
            cmd.iter().map(|s| s.to_string()).collect(),
            10,
        )
        .await
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = text.lines();
    Some((
        lines.next()?.trim().to_string(),
        lines.next()?.trim().to_string(),
    ))
}

fn condition(pod: &Pod, kind: &str) -> Option<(String, String)> {
    pod.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind)
        .map(|c| {
            (
                c.reason.clone().unwrap_or_default(),
                c.message.clone().unwrap_or_default(),
            )
        })
}

/// The first container's status `resources.limits` cpu and `allocatedResources` cpu.
fn shown_cpu(pod: &Pod) -> Option<(String, String)> {
    let cs = pod.status.as_ref()?.container_statuses.as_ref()?.first()?;
    let limit = cs
        .resources
        .as_ref()?
        .limits
        .as_ref()?
        .get("cpu")?
        .0
        .clone();
    let allocated = cs.allocated_resources.as_ref()?.get("cpu")?.0.clone();
    Some((limit, allocated))
}

#[tokio::test]
async fn a_resize_changes_the_running_containers_limits_in_place() {
    let client = admin().await;
    let node = "df-resize";
    let ns = "e2e-resize";
    let (mut agent, _node_cleanup) = joined_agent(node);
    let _ns = create_namespace(&client, ns).await;
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.create(&PostParams::default(), &resizable_pod("resizable", node))
        .await
        .expect("create the pod");
    let cri = cri().await;
    let id = running_container(&cri, ns, "resizable").await;
    let before = wait_until("the container's limits", WAIT, || limits_inside(&cri, &id)).await;
    assert_eq!(before, ("20000".to_string(), (128u64 << 20).to_string()));

    let patch = serde_json::json!({"spec": {"containers": [{
        "name": "app", "resources": resources("200m", "128Mi", "400m", "256Mi"),
    }]}});
    pods.patch_subresource(
        "resize",
        "resizable",
        &PatchParams::default(),
        &Patch::Strategic(&patch),
    )
    .await
    .expect("patch the resize subresource");
    let want = ("40000".to_string(), (256u64 << 20).to_string());
    wait_until("the new limits inside the container", WAIT, || async {
        let now = limits_inside(&cri, &id).await?;
        (now == want).then_some(())
    })
    .await;
    assert_eq!(
        running_container(&cri, ns, "resizable").await,
        id,
        "resized in place, not restarted"
    );
    let pod = wait_until("the status to follow", WAIT, || async {
        let p = pods.get("resizable").await.ok()?;
        (shown_cpu(&p) == Some(("400m".into(), "200m".into()))
            && condition(&p, "PodResizeInProgress").is_none()
            && condition(&p, "PodResizePending").is_none())
        .then_some(p)
    })
    .await;
    let restarts = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map(|c| c[0].restart_count);
    assert_eq!(restarts, Some(0));

    // The API server refuses more than the node's allocatable itself; a resize that fits the
    // node but not beside another pod waits (Deferred, upstream's message) with nothing
    // changed, and is allocated once that pod is gone.
    let allocatable = wait_until("the node's allocatable cpu", WAIT, || async {
        let n = common::cluster::get_node(&client, node).await?;
        let q = n.status?.allocatable?.get("cpu")?.0.clone();
        deckhand::base::podspec::quantity::parse(&q)
            .ok()
            .map(|q| q.milli_value())
    })
    .await;
    let mut filler = resizable_pod("filler", node);
    let used = allocatable - 300;
    filler.spec.as_mut().unwrap().containers[0].resources = Some(
        serde_json::from_value(resources(
            &format!("{used}m"),
            "16Mi",
            &format!("{used}m"),
            "16Mi",
        ))
        .unwrap(),
    );
    pods.create(&PostParams::default(), &filler)
        .await
        .expect("create the filler");
    running_container(&cri, ns, "filler").await;
    let patch = serde_json::json!({"spec": {"containers": [{
        "name": "app", "resources": resources("400m", "128Mi", "500m", "256Mi"),
    }]}});
    pods.patch_subresource(
        "resize",
        "resizable",
        &PatchParams::default(),
        &Patch::Strategic(&patch),
    )
    .await
    .expect("patch the resize subresource");
    let (reason, message) = wait_until("the resize pending", WAIT, || async {
        condition(&pods.get("resizable").await.ok()?, "PodResizePending")
    })
    .await;
    assert_eq!(reason, "Deferred");
    assert_eq!(
        message,
        format!(
            "Node didn't have enough resource: cpu, requested: 400, used: {used}, capacity: {allocatable}"
        )
    );
    assert_eq!(limits_inside(&cri, &id).await, Some(want));
    pods.delete("filler", &DeleteParams::default())
        .await
        .expect("delete the filler");
    let grown = ("50000".to_string(), (256u64 << 20).to_string());
    wait_until(
        "the deferred resize applied once there is room",
        WAIT,
        || async {
            let now = limits_inside(&cri, &id).await?;
            (now == grown).then_some(())
        },
    )
    .await;
    wait_until("the pending condition gone", WAIT, || async {
        let p = pods.get("resizable").await.ok()?;
        condition(&p, "PodResizePending").is_none().then_some(())
    })
    .await;

    pods.delete("resizable", &DeleteParams::default())
        .await
        .ok();
    wait_until("the pod gone", WAIT, || async {
        pods.get_opt("resizable")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    agent.stop();
}
