//! End to end, against the real test control plane and the private containerd: what happens
//! on a Deckhand node shows up as core/v1 events in the API server (what `kubectl describe`
//! and `kubectl get events` read), with upstream's reasons and wording: an image that cannot
//! be pulled, a crash loop, a failing probe, the node's own Starting/NodeReady; and a pod
//! that asks for something the node does not support waits with an event and a status
//! message that say so.

mod common;

use std::time::Duration;

use common::cluster::{admin, bound_pod, create_namespace, joined_agent, wait_node_ready};
use common::wait_until;
use deckhand::clients::cri::RuntimeService;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::{Api, DeleteParams, PostParams};

const WAIT: Duration = Duration::from_secs(60);

/// A pod bound to `node` whose first container is changed by `edit`.
fn pod(name: &str, node: &str, edit: impl FnOnce(&mut serde_json::Value)) -> Pod {
    let mut value = serde_json::to_value(bound_pod(name, node)).unwrap();
    edit(&mut value["spec"]);
    serde_json::from_value(value).unwrap()
}

/// The events about `name` in `ns` as (type, reason, message, count, fieldPath).
async fn events_of(
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> Vec<(String, String, String, i32, String)> {
    common::cluster::events_of(client, ns, name)
        .await
        .into_iter()
        .map(|e| {
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default(),
                e.count.unwrap_or(0),
                e.involved_object.field_path.unwrap_or_default(),
            )
        })
        .collect()
}

/// Waits for an event about `name` that `want` accepts; fails with every event seen.
async fn wait_event(
    client: &kube::Client,
    ns: &str,
    name: &str,
    what: &str,
    want: impl Fn(&(String, String, String, i32, String)) -> bool,
) -> (String, String, String, i32, String) {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let seen = events_of(client, ns, name).await;
        if let Some(hit) = seen.iter().find(|e| want(e)) {
            return hit.clone();
        }
        if std::time::Instant::now() > deadline {
            panic!("no event about {ns}/{name}: {what}; events seen: {seen:#?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Deletes the RuntimeClass when dropped.
struct RuntimeClassCleanup(String);

impl Drop for RuntimeClassCleanup {
    fn drop(&mut self) {
        let name = self.0.clone();
        common::cluster::clean_up_with_admin(move |client| async move {
            let _ = Api::<RuntimeClass>::all(client)
                .delete(&name, &DeleteParams::default())
                .await;
        });
    }
}

#[tokio::test]
async fn what_happens_on_the_node_is_told_in_events() {
    let client = admin().await;
    let node = "ev-node";
    let (mut agent, _node_cleanup) = joined_agent(node);
    // Short crash-loop back-off, so the BackOff event comes within seconds.
    agent.backoff("1s", "4s");
    agent.start();
    wait_node_ready(&client, node, &agent).await;

    // The node's own events land in `default`, named after the node.
    wait_event(&client, "default", node, "Starting", |e| {
        e.1 == "Starting" && e.2 == "Starting kubelet."
    })
    .await;
    wait_event(&client, "default", node, "NodeReady", |e| {
        e.1 == "NodeReady" && e.2 == format!("Node {node} status is now: NodeReady")
    })
    .await;

    let ns = "e2e-events";
    let _ns_cleanup = create_namespace(&client, ns).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let runtime_class = "e2e-ev-sandboxed";
    let _rc_cleanup = RuntimeClassCleanup(runtime_class.into());
    let rc: RuntimeClass = serde_json::from_value(serde_json::json!({
        "apiVersion": "node.k8s.io/v1",
        "kind": "RuntimeClass",
        "metadata": {"name": runtime_class},
        "handler": "sandboxed",
    }))
    .unwrap();
    let rcs: Api<RuntimeClass> = Api::all(client.clone());
    let _ = rcs.delete(runtime_class, &DeleteParams::default()).await;
    rcs.create(&PostParams::default(), &rc)
        .await
        .expect("create the RuntimeClass");

    let specs = [
        pod("no-image", node, |s| {
            // Nothing serves this registry here: the pull fails at once.
            s["containers"][0]["image"] = "localhost:1/deckhand/absent:1".into();
            s["containers"][0]["imagePullPolicy"] = "IfNotPresent".into();
        }),
        pod("crasher", node, |s| {
            s["containers"][0]["command"] = serde_json::json!(["sh", "-c", "exit 1"]);
        }),
        pod("unready", node, |s| {
            s["containers"][0]["readinessProbe"] =
                serde_json::json!({"exec": {"command": ["false"]}, "periodSeconds": 1});
        }),
        pod("claims", node, |s| {
            s["volumes"] = serde_json::json!([
                {"name": "data", "persistentVolumeClaim": {"claimName": "e2e-missing"}}
            ]);
            s["containers"][0]["volumeMounts"] =
                serde_json::json!([{"name": "data", "mountPath": "/data"}]);
        }),
        pod("sandboxed", node, |s| {
            s["runtimeClassName"] = runtime_class.into();
        }),
    ];
    for p in &specs {
        pods.create(&PostParams::default(), p)
            .await
            .unwrap_or_else(|e| panic!("create pod {:?}: {e}", p.metadata.name));
    }

    // A pull failure: Pulling, then the failure with the runtime's reason, then the
    // container's "Error: ErrImagePull" — on the container, as upstream.
    let image = "localhost:1/deckhand/absent:1";
    wait_event(&client, ns, "no-image", "Pulling", |e| {
        e.0 == "Normal" && e.1 == "Pulling" && e.2 == format!("Pulling image {image:?}")
    })
    .await;
    let failed = wait_event(&client, ns, "no-image", "Failed to pull", |e| {
        e.0 == "Warning"
            && e.1 == "Failed"
            && e.2
                .starts_with(&format!("Failed to pull image {image:?}: "))
    })
    .await;
    assert_eq!(failed.4, "spec.containers{app}");
    wait_event(&client, ns, "no-image", "Error: ErrImagePull", |e| {
        e.1 == "Failed" && e.2 == "Error: ErrImagePull"
    })
    .await;

    // A crash loop: the image was there, the container was created and started, then it
    // backs off; repeats of the same event are counted on one object.
    wait_event(&client, ns, "crasher", "Pulled (already present)", |e| {
        e.1 == "Pulled"
            && e.2
                == format!(
                    "Container image {:?} already present on machine",
                    common::BUSYBOX
                )
    })
    .await;
    wait_event(&client, ns, "crasher", "Created", |e| {
        e.1 == "Created" && e.2 == "Container created"
    })
    .await;
    wait_event(&client, ns, "crasher", "Started", |e| {
        e.1 == "Started" && e.2 == "Container started"
    })
    .await;
    let uid = pods.get("crasher").await.unwrap().metadata.uid.unwrap();
    wait_event(&client, ns, "crasher", "BackOff counted twice", |e| {
        e.0 == "Warning"
            && e.1 == "BackOff"
            && e.2 == format!("Back-off restarting failed container app in pod crasher_{ns}({uid})")
            && e.3 >= 2
    })
    .await;

    // A failing readiness probe: Unhealthy, counted.
    wait_event(&client, ns, "unready", "Unhealthy counted", |e| {
        e.0 == "Warning"
            && e.1 == "Unhealthy"
            && e.2.starts_with("Readiness probe failed")
            && e.3 >= 2
    })
    .await;

    // A claim that is not there, and an unsupported RuntimeClass. Each waits with an event
    // and a status message that name what is missing; neither gets a container.
    wait_event(&client, ns, "claims", "FailedMount", |e| {
        e.0 == "Warning"
            && e.1 == "FailedMount"
            && e.2.starts_with("Unable to attach or mount volumes: ")
            && e.2.contains("error processing PVC")
    })
    .await;
    wait_event(&client, ns, "sandboxed", "FailedCreatePodSandBox", |e| {
        e.0 == "Warning"
            && e.1 == "FailedCreatePodSandBox"
            && e.2.starts_with(&format!(
                "Failed to create pod sandbox: RuntimeClass {runtime_class:?} is not supported"
            ))
    })
    .await;
    for (name, needle) in [
        ("claims", "error processing PVC"),
        ("sandboxed", "RuntimeClass"),
    ] {
        wait_until(
            &format!("{name}: waiting ContainerCreating with a message naming {needle}"),
            WAIT,
            || async {
                let p = pods.get(name).await.ok()?;
                let status = p.status?;
                let waiting = status.container_statuses?.first()?.state.clone()?.waiting?;
                (status.phase.as_deref() == Some("Pending")
                    && waiting.reason.as_deref() == Some("ContainerCreating")
                    && waiting
                        .message
                        .as_deref()
                        .unwrap_or_default()
                        .contains(needle))
                .then_some(())
            },
        )
        .await;
    }
    let sandboxes = common::cri()
        .await
        .list_pod_sandbox(None)
        .await
        .expect("list sandboxes");
    for name in ["claims", "sandboxed"] {
        assert!(
            !sandboxes.iter().any(|s| s
                .metadata
                .as_ref()
                .is_some_and(|m| m.name == name && m.namespace == ns)),
            "{name} must not get a sandbox"
        );
    }

    // Events are in the log too.
    let log = agent.log();
    assert!(
        log.contains("Back-off restarting failed container app"),
        "{log}"
    );

    // Deleting the pods here keeps the namespace clean-up short.
    for p in &specs {
        let _ = pods
            .delete(
                p.metadata.name.as_deref().unwrap(),
                &DeleteParams::default().grace_period(0),
            )
            .await;
    }
}
