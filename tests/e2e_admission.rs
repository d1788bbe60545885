//! End to end, against the private containerd (and, for taints, the real control plane): pods
//! the node cannot take are refused before anything of them starts, with upstream's reasons
//! and messages, while the others run.
//!
//! Static pods: one agent with `--max-pods=3` and seven manifests written before it starts,
//! so they arrive in one batch and are admitted in name order (static pods have no creation
//! time): a pod that asks for more memory than the machine has (`OutOfmemory`), a second pod
//! on a host port another holds (`NodePorts`), a node selector the node does not match
//! (`NodeAffinity`), and the fourth pod that fits (`OutOfpods`).
//!
//! Cluster: a node registered with a NoExecute taint; a DaemonSet's pod (the DaemonSet
//! controller adds its tolerations; the template tolerates the taint) runs, while a bare pod
//! bound to the node without the toleration is marked Failed with `TaintToleration` in the
//! API server and never reaches containerd; after `kubectl label node`, a pod that selects the
//! new label runs.

mod common;

use std::time::Duration;

use common::cluster::{admin, create_namespace, event_reasons, joined_agent, sleeping_spec};
use common::{Agent, cri, sandboxes_of, sleeping_pod, wait_until};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};

const WAIT: Duration = Duration::from_secs(60);

/// `sleeping_pod` with `extra` (YAML lines, indented for the pod's only container or spec)
/// inserted after the container's command.
fn pod_with(name: &str, container_extra: &str, spec_extra: &str) -> String {
    let mut text = sleeping_pod(name);
    text.push_str(container_extra);
    text.replace("spec:\n", &format!("spec:\n{spec_extra}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_pods_past_the_nodes_limits_are_refused_while_the_others_run() {
    let cri = cri().await;
    let mut agent = Agent::new("e2e-adm-static");
    agent.extra_args.push("--max-pods=3".into());
    let port = "    ports:\n    - {containerPort: 8080, hostPort: 31871}\n";
    let manifests = [
        ("a-port", pod_with("a-port", port, "")),
        ("b-port", pod_with("b-port", port, "")),
        (
            "c-huge",
            pod_with(
                "c-huge",
                "    resources:\n      requests: {memory: 1000Gi}\n",
                "",
            ),
        ),
        (
            "d-sel",
            pod_with("d-sel", "", "  nodeSelector: {disk: ssd}\n"),
        ),
        ("e-run", sleeping_pod("e-run")),
        ("f-run", sleeping_pod("f-run")),
        ("g-extra", sleeping_pod("g-extra")),
    ];
    for (name, text) in &manifests {
        agent.write_manifest(&format!("{name}.yaml"), text);
    }
    agent.start();
    agent.wait_healthy(WAIT).await;

    let refusals = [
        (
            "b-port",
            "NodePorts",
            "Pod was rejected: Predicate NodePorts failed: node(s) didn't have free ports for the requested pod ports",
        ),
        (
            "c-huge",
            "OutOfmemory",
            "Pod was rejected: Node didn't have enough resource: memory, requested: 1073741824000, used: 0, capacity: ",
        ),
        (
            "d-sel",
            "NodeAffinity",
            "Pod was rejected: Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector",
        ),
        (
            "g-extra",
            "OutOfpods",
            "Pod was rejected: Node didn't have enough resource: pods, requested: 1, used: 3, capacity: 3",
        ),
    ];
    for (name, reason, message) in refusals {
        let status = wait_until(&format!("{name} refused in /pods"), WAIT, || async {
            let pod = agent.pod(name).await?;
            (pod["status"]["phase"] == "Failed").then(|| pod["status"].clone())
        })
        .await;
        assert_eq!(status["reason"], reason, "{name}: {status}");
        let got = status["message"].as_str().unwrap_or_default();
        assert!(
            got.starts_with(message),
            "{name}: message {got:?}, want {message:?}…"
        );
    }
    for name in ["a-port", "e-run", "f-run"] {
        wait_until(&format!("{name} running"), WAIT, || async {
            let pod = agent.pod(name).await?;
            (pod["status"]["phase"] == "Running").then_some(())
        })
        .await;
    }
    for (name, _, _) in refusals {
        assert!(
            sandboxes_of(&cri, &agent.pod_name(name)).await.is_empty(),
            "{name} reached containerd"
        );
    }
    let log = agent.log();
    assert!(
        log.contains("refusing a static pod"),
        "the refusals are logged"
    );
    agent.stop();
}

/// The taint the test node registers with, and the toleration of it.
const TAINT: &str = "deckhand.test/dedicated=infra:NoExecute";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_noexecute_taint_admits_daemonset_pods_and_refuses_pods_without_the_toleration() {
    let node = "e2e-adm-taint";
    let client = admin().await;
    let cri = cri().await;
    let (mut agent, _node_cleanup) = joined_agent(node);
    agent
        .extra_args
        .push(format!("--register-with-taints={TAINT}"));
    let ns = "e2e-admission";
    let _ns_cleanup = create_namespace(&client, ns).await;
    agent.start();
    agent.wait_healthy(WAIT).await;
    common::cluster::wait_node_ready(&client, node, &agent).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);

    // A DaemonSet for this node only: its controller adds the tolerations of every
    // DaemonSet pod (not-ready and unreachable NoExecute, the pressure and unschedulable
    // NoSchedule ones); the template tolerates the node's own taint.
    let mut spec = sleeping_spec(1);
    spec["nodeSelector"] = serde_json::json!({"kubernetes.io/hostname": node});
    spec["tolerations"] = serde_json::json!([
        {"key": "deckhand.test/dedicated", "operator": "Exists", "effect": "NoExecute"},
    ]);
    let ds: DaemonSet = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "agent"},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "template": {"metadata": {"labels": {"app": "agent"}}, "spec": spec},
        },
    }))
    .unwrap();
    Api::<DaemonSet>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &ds)
        .await
        .expect("create the DaemonSet");

    // The bare pod is watched from before it exists: once refused, it is Failed, and the
    // taint eviction controller deletes it (a Failed pod goes at once).
    let name = "no-toleration";
    let refused = {
        let pods = pods.clone();
        let params = WatchParams::default()
            .fields(&format!("metadata.name={name}"))
            .timeout(60);
        let version = pods
            .list(&ListParams::default().limit(1))
            .await
            .expect("list pods")
            .metadata
            .resource_version
            .unwrap_or_default();
        let stream = pods.watch(&params, &version).await.expect("watch the pod");
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(Ok(event)) = stream.next().await {
                if let WatchEvent::Added(p) | WatchEvent::Modified(p) = event
                    && let Some(status) = p.status
                    && status.phase.as_deref() == Some("Failed")
                {
                    return Some((status.reason, status.message));
                }
            }
            None
        })
    };
    let mut bare = common::cluster::bound_pod(name, node);
    bare.metadata.namespace = Some(ns.into());
    pods.create(&PostParams::default(), &bare)
        .await
        .expect("create the bare pod");
    let (reason, message) = tokio::time::timeout(WAIT, refused)
        .await
        .expect("the bare pod marked Failed in time")
        .expect("the watch task")
        .expect("the watch saw the pod Failed");
    assert_eq!(reason.as_deref(), Some("TaintToleration"));
    assert_eq!(
        message.as_deref(),
        Some(
            "Pod was rejected: Predicate TaintToleration failed: node(s) had taints that the pod didn't tolerate"
        )
    );
    let events = wait_until("the refusal's event", WAIT, || async {
        let events = event_reasons(&client, ns, name).await;
        events
            .iter()
            .any(|(reason, _)| reason == "TaintToleration")
            .then_some(events)
    })
    .await;
    assert!(
        events.iter().any(|(_, m)| m
            == "Predicate TaintToleration failed: node(s) had taints that the pod didn't tolerate"),
        "{events:?}"
    );

    // The DaemonSet's pod runs on the node.
    let ds_pod = wait_until("the DaemonSet's pod Running", WAIT, || async {
        let list = pods
            .list(&ListParams::default().labels("app=agent"))
            .await
            .ok()?;
        list.items
            .into_iter()
            .find(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
    })
    .await;
    let tolerations = ds_pod.spec.unwrap().tolerations.unwrap_or_default();
    assert!(
        tolerations
            .iter()
            .any(|t| t.key.as_deref() == Some("node.kubernetes.io/not-ready")),
        "the DaemonSet controller's tolerations: {tolerations:?}"
    );
    assert!(
        sandboxes_of(&cri, name).await.is_empty(),
        "the refused pod reached containerd"
    );

    // `kubectl label node` counts: a pod that selects the new label runs. (The label reaches
    // the agent through its watch of the Node, a moment after kubectl returns; a pod created
    // in that moment is refused, and the next one is tried.)
    common::cluster::kubectl(&["label", "node", node, "deckhand.test/tier=gold"]);
    let deadline = std::time::Instant::now() + WAIT;
    for attempt in 1.. {
        let name = format!("gold-{attempt}");
        let mut gold = common::cluster::bound_pod(&name, node);
        gold.metadata.namespace = Some(ns.into());
        let spec = gold.spec.as_mut().unwrap();
        spec.node_selector = Some([("deckhand.test/tier".to_string(), "gold".to_string())].into());
        spec.tolerations = Some(vec![
            serde_json::from_value(serde_json::json!(
                {"key": "deckhand.test/dedicated", "operator": "Exists", "effect": "NoExecute"}
            ))
            .unwrap(),
        ]);
        pods.create(&PostParams::default(), &gold)
            .await
            .expect("create the gold pod");
        let running = wait_until(&format!("{name} running or refused"), WAIT, || async {
            let p = pods.get(&name).await.ok()?;
            match p.status?.phase.as_deref() {
                Some("Running") => Some(true),
                Some("Failed") => Some(false),
                _ => None,
            }
        })
        .await;
        if running {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the node's new label never reached admission"
        );
    }
    agent.stop();
}
