//! End to end, against the real test control plane and the private containerd: pods the
//! scheduler binds to a Deckhand node run there, their status reaches the API server, a
//! Deployment is rolled by `kubectl rollout restart` and, scaled to zero, has its pods stopped
//! on the node with their grace period and deleted from the API server.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use common::cluster::{
    admin, bound_pod, create_namespace, joined_agent, kubectl, sleeping_spec, wait_node_ready,
};
use common::{cri, running_containers, wait_until};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};

const WAIT: Duration = Duration::from_secs(60);
const REPLICAS: usize = 5;

/// A Deployment of `replicas` sleeping pods on `node`, each with a readiness probe, a preStop
/// hook and a SIGTERM trap that write to `marks` (a host directory, one file per pod): the
/// hook writes `prestop`; the trap writes `term`, takes a second, writes `done` and exits 0.
/// `prestop term done` in a pod's file shows it was stopped with its grace period (10 s):
/// the hook first, then SIGTERM, and time to finish before any SIGKILL.
fn deployment(name: &str, node: &str, replicas: usize, marks: &Path) -> Deployment {
    let mut spec = sleeping_spec(10);
    spec["nodeSelector"] = serde_json::json!({"kubernetes.io/hostname": node});
    spec["volumes"] = serde_json::json!([
        {"name": "marks", "hostPath": {"path": marks, "type": "Directory"}},
    ]);
    let mark = |word: &str| format!("echo {word} >> /marks/$POD_NAME");
    let c = &mut spec["containers"][0];
    c["command"] = serde_json::json!([
        "sh",
        "-c",
        format!(
            "trap '{}; sleep 1; {}; exit 0' TERM; sleep 600 & wait",
            mark("term"),
            mark("done")
        ),
    ]);
    c["env"] = serde_json::json!([
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]);
    c["volumeMounts"] = serde_json::json!([{"name": "marks", "mountPath": "/marks"}]);
    c["lifecycle"] =
        serde_json::json!({"preStop": {"exec": {"command": ["sh", "-c", mark("prestop")]}}});
    c["readinessProbe"] = serde_json::json!({"exec": {"command": ["true"]}, "periodSeconds": 1});
    serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
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

/// The Deployment has rolled out completely: its controller saw the newest spec, and all of
/// `replicas` pods are updated and available, with none of an older ReplicaSet left.
fn rolled_out(d: &Deployment, replicas: i32) -> bool {
    let (Some(status), Some(generation)) = (d.status.as_ref(), d.metadata.generation) else {
        return false;
    };
    let available =
        status.conditions.iter().flatten().any(|c| {
            c.type_.as_deref() == Some("Available") && c.status.as_deref() == Some("True")
        });
    status.observed_generation >= Some(generation)
        && status.replicas.unwrap_or(0) == replicas
        && status.updated_replicas.unwrap_or(0) == replicas
        && status.available_replicas.unwrap_or(0) == replicas
        && (replicas == 0 || available)
}

/// The names of the pods of `app` once there are exactly `n`, all Running and Ready on `node`,
/// and none of them in `not`.
async fn ready_pods(
    pods: &Api<Pod>,
    app: &str,
    node: &str,
    n: usize,
    not: &BTreeSet<String>,
) -> BTreeSet<String> {
    wait_until(
        &format!("{n} new pods of {app} Running and Ready on {node}"),
        WAIT,
        || async {
            let list = pods
                .list(&ListParams::default().labels(&format!("app={app}")))
                .await
                .ok()?;
            let names: BTreeSet<String> = list
                .items
                .iter()
                .filter(|p| {
                    ready(p) && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
                })
                .filter_map(|p| p.metadata.name.clone())
                .filter(|name| !not.contains(name))
                .collect();
            (list.items.len() == n && names.len() == n).then_some(names)
        },
    )
    .await
}

/// Waits until `name` has neither a sandbox nor a container left in containerd.
async fn gone_from_containerd(cri: &deckhand::clients::cri::CriClient, name: &str) {
    wait_until(&format!("{name} gone from containerd"), WAIT, || async {
        (common::containers_of(cri, name).await.is_empty()
            && common::sandboxes_of(cri, name).await.is_empty())
        .then_some(())
    })
    .await;
}

/// Checks that each pod wrote `prestop term done`: stopped gracefully, in upstream's order.
fn assert_stopped_gracefully(marks: &Path, names: &BTreeSet<String>) {
    for name in names {
        let text = common::read(&marks.join(name)).unwrap_or_default();
        let words: Vec<&str> = text.split_whitespace().collect();
        assert_eq!(
            words,
            ["prestop", "term", "done"],
            "{name}: the preStop hook, then SIGTERM, then the time to exit"
        );
    }
}

#[tokio::test]
async fn a_deployment_runs_on_the_node_rolls_over_and_scales_to_zero() {
    let client = admin().await;
    let node = "da-deploy";
    let (mut agent, _node_cleanup) = joined_agent(node);
    let marks = agent.dir.path().join("marks");
    std::fs::create_dir(&marks).unwrap();
    agent.start();
    wait_node_ready(&client, node, &agent).await;

    let ns = "e2e-deploy";
    let _ns_cleanup = create_namespace(&client, ns).await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    deployments
        .create(
            &PostParams::default(),
            &deployment("web", node, REPLICAS, &marks),
        )
        .await
        .expect("create the deployment");

    // The scheduler binds the pods here; Deckhand runs them and writes their status.
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let first = ready_pods(&pods, "web", node, REPLICAS, &BTreeSet::new()).await;
    wait_until("the Deployment Available", WAIT, || async {
        let d = deployments.get("web").await.ok()?;
        rolled_out(&d, REPLICAS as i32).then_some(())
    })
    .await;
    let cri = cri().await;
    let mut containers = BTreeMap::new();
    for name in &first {
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

    // `kubectl rollout restart`: a new ReplicaSet's pods replace the old ones, which are
    // stopped with their grace period and gone from the API server and from containerd.
    kubectl(&["-n", ns, "rollout", "restart", "deployment/web"]);
    let second = ready_pods(&pods, "web", node, REPLICAS, &first).await;
    wait_until("the restarted Deployment rolled out", WAIT, || async {
        let d = deployments.get("web").await.ok()?;
        rolled_out(&d, REPLICAS as i32).then_some(())
    })
    .await;
    let hashes = |names: &BTreeSet<String>| -> BTreeSet<String> {
        names
            .iter()
            .map(|n| n.rsplit_once('-').map_or("", |(rs, _)| rs).to_string())
            .collect()
    };
    assert_eq!(hashes(&first).len(), 1, "{first:?}");
    assert_eq!(hashes(&second).len(), 1, "{second:?}");
    assert_ne!(hashes(&first), hashes(&second), "a new ReplicaSet");
    for name in &first {
        assert!(
            pods.get_opt(name).await.unwrap().is_none(),
            "{name} is gone from the API server"
        );
        gone_from_containerd(&cri, name).await;
    }
    assert_stopped_gracefully(&marks, &first);
    for name in &second {
        running_containers(&cri, name, WAIT).await;
    }

    // Scaled to zero: each pod is stopped on the node with its grace period, then deleted
    // from the API server, and nothing of it is left in containerd.
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
    for name in &second {
        gone_from_containerd(&cri, name).await;
    }
    assert_stopped_gracefully(&marks, &second);
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
                .any(|c| {
                    c.state
                        == deckhand::clients::cri::proto::ContainerState::ContainerRunning as i32
                });
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

/// A bare pod bound to `node` whose container runs `script` with `policy`.
fn script_pod(name: &str, node: &str, policy: &str, script: &str) -> Pod {
    let mut pod = bound_pod(name, node);
    let spec = pod.spec.as_mut().unwrap();
    spec.restart_policy = Some(policy.into());
    spec.termination_grace_period_seconds = Some(1);
    spec.containers[0].command = Some(vec!["sh".into(), "-c".into(), script.into()]);
    pod
}

fn phase(pod: &Pod) -> Option<String> {
    pod.status.as_ref()?.phase.clone()
}

#[tokio::test]
async fn the_api_server_sees_phases_restarts_and_refusals() {
    let client = admin().await;
    let node = "da-status";
    let (mut agent, _node_cleanup) = joined_agent(node);
    agent.backoff("1s", "2s");
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    let ns = "e2e-status";
    let _ns = create_namespace(&client, ns).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut unsafe_sysctl = bound_pod("unsafe-sysctl", node);
    unsafe_sysctl.spec.as_mut().unwrap().security_context = Some(
        serde_json::from_value(
            serde_json::json!({"sysctls": [{"name": "kernel.msgmax", "value": "65536"}]}),
        )
        .unwrap(),
    );
    for pod in [
        script_pod("done", node, "Never", "exit 0"),
        script_pod("broken", node, "Never", "exit 3"),
        script_pod("crashing", node, "Always", "exit 1"),
        unsafe_sysctl,
    ] {
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }

    let done = wait_until("done Succeeded", WAIT, || async {
        let p = pods.get("done").await.ok()?;
        (phase(&p).as_deref() == Some("Succeeded")).then_some(p)
    })
    .await;
    let state = done.status.unwrap().container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap();
    assert_eq!(state.terminated.unwrap().exit_code, 0);
    let broken = wait_until("broken Failed", WAIT, || async {
        let p = pods.get("broken").await.ok()?;
        (phase(&p).as_deref() == Some("Failed")).then_some(p)
    })
    .await;
    let state = broken.status.unwrap().container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap();
    assert_eq!(state.terminated.unwrap().exit_code, 3);
    wait_until("crashing restarted", WAIT, || async {
        let p = pods.get("crashing").await.ok()?;
        let restarts = p.status?.container_statuses?.first()?.restart_count;
        (restarts >= 1).then_some(())
    })
    .await;
    let refused = wait_until("the unsafe sysctl refused", WAIT, || async {
        let p = pods.get("unsafe-sysctl").await.ok()?;
        (phase(&p).as_deref() == Some("Failed")).then_some(p)
    })
    .await;
    let status = refused.status.unwrap();
    assert_eq!(status.reason.as_deref(), Some("SysctlForbidden"));
    assert!(
        status
            .message
            .as_deref()
            .unwrap_or_default()
            .starts_with("Pod was rejected: forbidden sysctl: "),
        "{:?}",
        status.message
    );
    // Finished pods are not run again: as upstream, their exited containers (and logs) stay
    // until the pod is deleted, their sandbox stopped; the status stays.
    let cri = cri().await;
    for name in ["done", "broken"] {
        wait_until(&format!("{name}'s sandbox stopped"), WAIT, || async {
            let sandboxes = common::sandboxes_of(&cri, name).await;
            (sandboxes.len() == 1
                && sandboxes[0].state
                    == deckhand::clients::cri::proto::PodSandboxState::SandboxNotready as i32)
                .then_some(())
        })
        .await;
        let states: Vec<i32> = common::containers_of(&cri, name)
            .await
            .into_iter()
            .map(|c| c.state)
            .collect();
        assert_eq!(
            states,
            [deckhand::clients::cri::proto::ContainerState::ContainerExited as i32],
            "{name}'s one container is kept, exited"
        );
    }
    assert_eq!(
        phase(&pods.get("done").await.unwrap()).as_deref(),
        Some("Succeeded")
    );
    assert!(
        common::sandboxes_of(&cri, "unsafe-sysctl").await.is_empty(),
        "a refused pod never runs"
    );
}

#[tokio::test]
async fn a_daemonset_places_its_pod_on_the_node() {
    let client = admin().await;
    let node = "da-daemonset";
    let (mut agent, _node_cleanup) = joined_agent(node);
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    let ns = "e2e-daemonset";
    let _ns = create_namespace(&client, ns).await;
    let mut spec = sleeping_spec(1);
    spec["nodeSelector"] = serde_json::json!({"kubernetes.io/hostname": node});
    let daemonset: k8s_openapi::api::apps::v1::DaemonSet =
        serde_json::from_value(serde_json::json!({
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "agent"},
            "spec": {
                "selector": {"matchLabels": {"app": "agent"}},
                "template": {"metadata": {"labels": {"app": "agent"}}, "spec": spec},
            },
        }))
        .unwrap();
    let daemonsets: Api<k8s_openapi::api::apps::v1::DaemonSet> =
        Api::namespaced(client.clone(), ns);
    daemonsets
        .create(&PostParams::default(), &daemonset)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let name = wait_until("the DaemonSet's pod Running and Ready", WAIT, || async {
        let list = pods
            .list(&ListParams::default().labels("app=agent"))
            .await
            .ok()?;
        let pod = list.items.into_iter().find(ready)?;
        pod.metadata.name
    })
    .await;
    let cri = cri().await;
    running_containers(&cri, &name, WAIT).await;
    daemonsets
        .delete("agent", &DeleteParams::default())
        .await
        .unwrap();
    wait_until("the DaemonSet's pod gone", WAIT, || async {
        let list = pods
            .list(&ListParams::default().labels("app=agent"))
            .await
            .ok()?;
        list.items.is_empty().then_some(())
    })
    .await;
    wait_until("its containers gone", WAIT, || async {
        common::containers_of(&cri, &name)
            .await
            .is_empty()
            .then_some(())
    })
    .await;
}
