//! End to end, against the real test control plane and the private containerd: pods the
//! scheduler binds to a Deckhand node run there, their status reaches the API server, and a
//! Deployment scaled to zero has its pods stopped on the node and deleted from the API server.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::cluster::{admin, bound_pod, create_namespace, joined_agent, wait_node_ready};
use common::{cri, running_containers, wait_until};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
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
    wait_node_ready(&client, node, &agent).await;

    let ns = "e2e-deploy";
    let _ns_cleanup = create_namespace(&client, ns).await;
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

#[tokio::test]
async fn pods_deleted_while_the_agent_is_stopped_are_cleaned_up_after_its_restart() {
    let client = admin().await;
    let node = "da-restart";
    let (mut agent, _node_cleanup) = joined_agent(node);
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    let ns = "e2e-deleted-while-down";
    let _ns = create_namespace(&client, ns).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    for name in ["graceful", "forced", "kept"] {
        pods.create(&PostParams::default(), &bound_pod(name, node))
            .await
            .unwrap();
    }
    let cri = cri().await;
    let mut before = BTreeMap::new();
    for name in ["graceful", "forced", "kept"] {
        before.insert(name, running_containers(&cri, name, WAIT).await);
    }

    agent.stop();
    // One deletion the node must finish (it waits for the node), one the user forced.
    pods.delete("graceful", &DeleteParams::default())
        .await
        .unwrap();
    pods.delete("forced", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    assert!(
        pods.get_opt("forced").await.unwrap().is_none(),
        "a forced deletion is immediate"
    );
    assert!(
        pods.get_opt("graceful")
            .await
            .unwrap()
            .is_some_and(|p| p.metadata.deletion_timestamp.is_some()),
        "a graceful deletion waits for the node"
    );

    agent.start();
    wait_until("the graceful pod deleted by the node", WAIT, || async {
        pods.get_opt("graceful").await.ok()?.is_none().then_some(())
    })
    .await;
    for name in ["graceful", "forced"] {
        wait_until(&format!("{name}'s containers stopped"), WAIT, || async {
            let running = common::containers_of(&cri, name)
                .await
                .into_iter()
                .any(|c| c.state == deckhand::cri::proto::ContainerState::ContainerRunning as i32);
            (!running).then_some(())
        })
        .await;
    }
    assert_eq!(
        running_containers(&cri, "kept", WAIT).await,
        before["kept"],
        "the pod that was not deleted kept its container"
    );
}
