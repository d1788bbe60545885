//! End to end, against the real test control plane and the private containerd: pods the
//! scheduler binds to a Deckhand node run there, their status reaches the API server, and a
//! Deployment scaled to zero has its pods stopped on the node and deleted from the API server.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::cluster::{admin, condition, get_node, joined_agent};
use common::{cri, running_containers, wait_until};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};

const WAIT: Duration = Duration::from_secs(60);

fn deployment(name: &str, node: &str, replicas: i32) -> Deployment {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "automountServiceAccountToken": false,
                    "terminationGracePeriodSeconds": 2,
                    "containers": [{
                        "name": "app",
                        "image": common::BUSYBOX,
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c", "trap 'exit 0' TERM; sleep 600 & wait"],
                        "readinessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 1},
                    }],
                },
            },
        },
    }))
    .unwrap()
}

/// Deletes the test's namespace when dropped.
struct NamespaceCleanup(String);

impl Drop for NamespaceCleanup {
    fn drop(&mut self) {
        let name = self.0.clone();
        let _ = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async move {
                    let _ = Api::<Namespace>::all(admin().await)
                        .delete(&name, &DeleteParams::default())
                        .await;
                })
        })
        .join();
    }
}

fn ready(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    status.and_then(|s| s.phase.as_deref()) == Some("Running")
        && status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[tokio::test]
async fn a_deployment_runs_on_the_node_reports_status_and_scales_to_zero() {
    let client = admin().await;
    let node = "da-deploy";
    let (mut agent, _node_cleanup) = joined_agent(node);
    agent.start();
    wait_until("the Node Ready", WAIT, || async {
        let n = get_node(&client, node).await?;
        (condition(&n, "Ready").as_deref() == Some("True")).then_some(())
    })
    .await;

    let ns = "e2e-deploy";
    let _ns_cleanup = NamespaceCleanup(ns.into());
    let namespace: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("create the namespace");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    deployments
        .create(&PostParams::default(), &deployment("web", node, 3))
        .await
        .expect("create the deployment");

    // The scheduler binds three pods here; Deckhand runs them and writes their status.
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let names: Vec<String> = wait_until(
        "3 pods Running and Ready in the API server",
        WAIT,
        || async {
            let list = pods
                .list(&ListParams::default().labels("app=web"))
                .await
                .ok()?;
            let ready: Vec<String> = list
                .items
                .iter()
                .filter(|p| ready(p))
                .filter_map(|p| p.metadata.name.clone())
                .collect();
            (ready.len() == 3).then_some(ready)
        },
    )
    .await;
    wait_until("the Deployment available", WAIT, || async {
        let d = deployments.get("web").await.ok()?;
        (d.status?.available_replicas == Some(3)).then_some(())
    })
    .await;
    let cri = cri().await;
    let mut containers = BTreeMap::new();
    for name in &names {
        containers.insert(name.clone(), running_containers(&cri, name, WAIT).await);
        let pod = pods.get(name).await.unwrap();
        let status = pod.status.unwrap();
        assert!(
            status.pod_ip.is_some(),
            "{name} has its IP in the API server"
        );
        assert!(status.host_ip.is_some(), "{name} has the node's IP");
        let cs = &status.container_statuses.unwrap()[0];
        assert!(
            cs.ready && cs.state.as_ref().unwrap().running.is_some(),
            "{name}: {cs:?}"
        );
    }

    // Scaled to zero: each pod is stopped on the node, then deleted from the API server.
    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 0}})),
        )
        .await
        .unwrap();
    wait_until("the pods gone from the API server", WAIT, || async {
        let list = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .ok()?;
        list.items.is_empty().then_some(())
    })
    .await;
    for name in &names {
        let left: Vec<_> = common::containers_of(&cri, name)
            .await
            .into_iter()
            .filter(|c| c.state == deckhand::cri::proto::ContainerState::ContainerRunning as i32)
            .collect();
        assert!(left.is_empty(), "{name} still runs containers: {left:?}");
    }
    assert!(
        agent.log().contains("deleted the pod from the API server"),
        "{}",
        agent.log()
    );
}
