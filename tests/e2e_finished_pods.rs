//! End to end, against the real test control plane and the private containerd: a pod that
//! ran to completion keeps its exited containers and their logs, as upstream's kubelet keeps
//! them, until it is deleted.
//!
//! Three bare pods bound to a Deckhand node: one that succeeds (`restartPolicy: Never`), one
//! that fails (`Never`, exit 3), and one under `OnFailure` that fails once and then succeeds;
//! and a static pod that succeeds, read through its mirror pod.
//! Once the API server shows them `Succeeded`/`Failed`, their logs are read through the API
//! server (the pods' `log` subresource, which the API server fetches from the node API's
//! `containerLogs`), the restarted container's first run with `previous=true`; the containers
//! are still in containerd, exited, with their sandbox stopped. The agent is restarted: it
//! adopts the finished pods without running them again and their logs still answer. Deleting
//! the pods removes their containers, sandboxes and log directories.
//!
//! The API server reaches the node API only at a non-loopback node address, so the node gets
//! one of this host's (on `lo`, removed by its guard) as in `e2e_api_proxy`.

mod common;

use std::time::Duration;

use common::cluster::{
    admin, bound_pod_with, cluster_dir, create_namespace, joined_agent, wait_node_ready,
};
use common::{BUSYBOX, HostAddress, cri, wait_until};
use deckhand::clients::cri::proto::{ContainerState, PodSandboxState};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, LogParams, PostParams};

const WAIT: Duration = Duration::from_secs(90);
/// From TEST-NET-2 (RFC 5737), never a real address; .92 as this test's testbed subnet.
const NODE_ADDRESS: &str = "198.51.100.92";

/// A pod bound to `node` whose one container `app` runs `script` under `policy`, with an
/// emptyDir at `/data` (kept across the container's restarts, so a script can tell its first
/// run from the next).
fn script_pod(name: &str, node: &str, policy: &str, script: &str) -> Pod {
    bound_pod_with(
        name,
        node,
        serde_json::json!({
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "restartPolicy": policy,
            "volumes": [{"name": "data", "emptyDir": {}}],
            "containers": [{
                "name": "app",
                "image": BUSYBOX,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", script],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }],
        }),
    )
}

fn phase(pod: &Pod) -> Option<&str> {
    pod.status.as_ref()?.phase.as_deref()
}

/// The kube client's last complaint about reading logs, for a failure message.
static LAST_ERROR: std::sync::Mutex<String> = std::sync::Mutex::new(String::new());

/// The pod's logs through the API server, waited for; fails with the API server's answer.
async fn logs(pods: &Api<Pod>, name: &str, previous: bool) -> String {
    let params = LogParams {
        previous,
        ..Default::default()
    };
    let what = format!("the logs of {name} (previous={previous}) through the API server");
    let start = std::time::Instant::now();
    loop {
        match pods.logs(name, &params).await {
            Ok(text) => return text,
            Err(err) => {
                if let Ok(mut e) = LAST_ERROR.lock() {
                    *e = err.to_string();
                }
            }
        }
        if start.elapsed() > WAIT {
            panic!(
                "timed out after {WAIT:?} waiting for {what}; last answer: {}",
                LAST_ERROR.lock().map(|e| e.clone()).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The containers of the pod `name` in `ns` in containerd, as (attempt, state).
async fn containers(
    cri: &deckhand::clients::cri::CriClient,
    ns: &str,
    name: &str,
) -> Vec<(u32, i32)> {
    let mut found: Vec<(u32, i32)> = common::containers_of(cri, name)
        .await
        .into_iter()
        .filter(|c| {
            c.labels
                .get("io.kubernetes.pod.namespace")
                .map(String::as_str)
                == Some(ns)
        })
        .map(|c| (c.metadata.map(|m| m.attempt).unwrap_or_default(), c.state))
        .collect();
    found.sort();
    found
}

async fn sandbox_states(cri: &deckhand::clients::cri::CriClient, ns: &str, name: &str) -> Vec<i32> {
    common::sandboxes_of(cri, name)
        .await
        .into_iter()
        .filter(|s| {
            s.labels
                .get("io.kubernetes.pod.namespace")
                .map(String::as_str)
                == Some(ns)
        })
        .map(|s| s.state)
        .collect()
}

/// A static pod (in the test's namespace) that prints a line and succeeds.
fn static_manifest(ns: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata: {{name: static-once, namespace: {ns}}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: {BUSYBOX}
    imagePullPolicy: Never
    command: ["sh", "-c", "echo out of static; exit 0"]
"#
    )
}

const EXITED: i32 = ContainerState::ContainerExited as i32;
const NOT_READY: i32 = PodSandboxState::SandboxNotready as i32;

#[tokio::test]
async fn a_finished_pod_keeps_its_containers_and_logs_until_it_is_deleted() {
    let client = admin().await;
    let node = "df-finished";
    let ns = "e2e-finished";
    let address = HostAddress::add(NODE_ADDRESS);
    let (mut agent, _node_cleanup) = joined_agent(node);
    agent.address = address.ip.clone();
    agent.backoff("1s", "2s");
    // The periodic container GC keeps only the newest exited instance of each container (as
    // upstream's, within a minute); a long period keeps the first run for `previous=true`.
    agent
        .env
        .push(("DECKHAND_CONTAINER_GC_PERIOD".into(), "1h".into()));
    agent.extra_args.extend([
        format!("--node-ip={}", address.ip),
        format!(
            "--client-ca-file={}",
            cluster_dir().join("pki").join("ca.crt").display()
        ),
    ]);
    let _ns = create_namespace(&client, ns).await;
    agent.write_manifest("static.yaml", &static_manifest(ns));
    let mirror = format!("static-once-{node}");
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    for pod in [
        script_pod("succeeds", node, "Never", "echo out of succeeds; exit 0"),
        script_pod(
            "fails",
            node,
            "Never",
            "echo out of fails; echo -n gave up > /dev/termination-log; exit 3",
        ),
        script_pod(
            "retries",
            node,
            "OnFailure",
            "if [ -e /data/ran ]; then echo second run; exit 0; fi; touch /data/ran; echo first run; exit 1",
        ),
    ] {
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    for (name, want) in [
        ("succeeds", "Succeeded"),
        ("fails", "Failed"),
        ("retries", "Succeeded"),
        (mirror.as_str(), "Succeeded"),
    ] {
        wait_until(&format!("{name} {want}"), WAIT, || async {
            let p = pods.get(name).await.ok()?;
            (phase(&p) == Some(want)).then_some(())
        })
        .await;
    }

    let cri = cri().await;
    let check_kept = |when: &'static str| {
        let (pods, cri, mirror) = (pods.clone(), &cri, mirror.clone());
        async move {
            assert_eq!(
                logs(&pods, &mirror, false).await,
                "out of static\n",
                "{when}"
            );
            assert_eq!(
                logs(&pods, "succeeds", false).await,
                "out of succeeds\n",
                "{when}"
            );
            assert_eq!(
                logs(&pods, "fails", false).await,
                "out of fails\n",
                "{when}"
            );
            assert_eq!(
                logs(&pods, "retries", false).await,
                "second run\n",
                "{when}"
            );
            assert_eq!(logs(&pods, "retries", true).await, "first run\n", "{when}");
            for name in ["succeeds", "fails", mirror.as_str()] {
                assert_eq!(
                    containers(cri, ns, name).await,
                    [(0, EXITED)],
                    "{when}: {name}'s container is kept, exited"
                );
                assert_eq!(
                    sandbox_states(cri, ns, name).await,
                    [NOT_READY],
                    "{when}: {name}'s sandbox is kept, stopped"
                );
            }
            assert_eq!(
                containers(cri, ns, "retries").await,
                [(0, EXITED), (1, EXITED)],
                "{when}: both runs of the restarted container are kept"
            );
        }
    };
    check_kept("once finished").await;

    // A restarted agent finds the finished pods in the API server: it adopts them without
    // running them again or removing them.
    agent.stop();
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    // Once the node's pods are synced again, the kept containers are still all there is.
    wait_until(
        "the restarted agent's /pods to list the finished pods",
        WAIT,
        || async {
            let list = agent.pods().await?;
            let items = list["items"].as_array()?;
            (items.len() >= 4).then_some(())
        },
    )
    .await;
    check_kept("after the agent restarted").await;
    // The node's own status of the adopted pod keeps its termination message (read again from
    // the pod's directory).
    let message = wait_until("the restarted agent's status of fails", WAIT, || async {
        let list = agent.pods().await?;
        let fails = list["items"]
            .as_array()?
            .iter()
            .find(|p| p["metadata"]["name"] == "fails")?
            .clone();
        Some(fails["status"]["containerStatuses"][0]["state"]["terminated"]["message"].clone())
    })
    .await;
    assert_eq!(message, "gave up", "the termination message on the node");
    let retries = pods.get("retries").await.unwrap();
    assert_eq!(phase(&retries), Some("Succeeded"));

    // Deleting the pods removes everything of them on the node; removing the manifest, the
    // static pod's.
    agent.remove_manifest("static.yaml");
    wait_until("the static pod gone from containerd", WAIT, || async {
        (containers(&cri, ns, &mirror).await.is_empty()
            && sandbox_states(&cri, ns, &mirror).await.is_empty())
        .then_some(())
    })
    .await;
    let prefix = format!("{ns}_{mirror}_");
    wait_until("the static pod's log directory removed", WAIT, || async {
        let left = std::fs::read_dir(agent.logs_dir())
            .ok()?
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with(&prefix));
        (!left).then_some(())
    })
    .await;
    let mut uids = Vec::new();
    for name in ["succeeds", "fails", "retries"] {
        let p = pods.get(name).await.unwrap();
        uids.push((name, p.metadata.uid.clone().unwrap()));
        pods.delete(name, &DeleteParams::default()).await.unwrap();
    }
    for (name, uid) in &uids {
        wait_until(&format!("{name} gone from containerd"), WAIT, || async {
            (containers(&cri, ns, name).await.is_empty()
                && sandbox_states(&cri, ns, name).await.is_empty())
            .then_some(())
        })
        .await;
        let dir = agent.logs_dir().join(format!("{ns}_{name}_{uid}"));
        wait_until(&format!("{} removed", dir.display()), WAIT, || async {
            (!dir.exists()).then_some(())
        })
        .await;
        assert!(
            pods.get_opt(name).await.unwrap().is_none(),
            "{name} is gone from the API server"
        );
    }
    agent.stop();
}
