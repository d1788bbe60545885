//! End to end, against the real test control plane and the private containerd: a static pod
//! of a node that joined the cluster gets a mirror pod in the API server (owned by the Node,
//! with the static pod's status), which is recreated when a user deletes it, replaced when the
//! manifest changes, and deleted when the manifest goes, also when it went while Deckhand was
//! stopped; a static pod that refers to a Secret is refused and says so in `/pods`.

mod common;

use std::time::Duration;

use common::cluster::{admin, create_namespace, joined_agent, wait_node_ready};
use common::{Agent, BUSYBOX, cri, running_containers, sandboxes_of, wait_until};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};

const WAIT: Duration = Duration::from_secs(30);
const MIRROR: &str = "kubernetes.io/config.mirror";

/// A static pod in namespace `ns` that sleeps until told to stop; `version` goes into a label
/// and the command, so a new version is a new manifest.
fn manifest(name: &str, ns: &str, version: u32) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: {ns}
  labels: {{app: {name}, version: "{version}"}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: {BUSYBOX}
    imagePullPolicy: Never
    command: ["sh", "-c", "trap 'exit 0' TERM; sleep {version}000 & wait"]
"#
    )
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// The static pod's UID as `/pods` shows it (its `config.hash`), once it is there.
async fn static_uid(agent: &Agent, name: &str) -> String {
    wait_until(&format!("{name} in /pods"), WAIT, || async {
        agent.pod(name).await?["metadata"]["uid"]
            .as_str()
            .map(str::to_string)
    })
    .await
}

/// Waits for the mirror pod `name` that carries `hash`, running with an IP, and returns it.
async fn running_mirror(pods: &Api<Pod>, name: &str, hash: &str) -> Pod {
    wait_until(
        &format!("mirror pod {name} of {hash} Running with a pod IP"),
        WAIT,
        || async {
            let pod = pods.get_opt(name).await.ok()??;
            let status = pod.status.as_ref()?;
            let ok = annotation(&pod, MIRROR) == Some(hash)
                && pod.metadata.deletion_timestamp.is_none()
                && status.phase.as_deref() == Some("Running")
                && status.pod_ip.is_some();
            ok.then_some(pod)
        },
    )
    .await
}

#[tokio::test]
async fn a_static_pod_has_a_mirror_pod_that_follows_it() {
    let client = admin().await;
    let ns = "e2e-mirror";
    let _ns = create_namespace(&client, ns).await;
    let node = "dm-mirror";
    let (mut agent, _node_cleanup) = joined_agent(node);
    agent.write_manifest("web.yaml", &manifest("web", ns, 1));
    agent.write_manifest("gone.yaml", &manifest("gone", ns, 1));
    agent.start();
    let node_obj = wait_node_ready(&client, node, &agent).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let web = agent.pod_name("web");

    // The mirror pod: the static pod's hash, owned by the Node, bound to it, with the status
    // the node computes for the static pod.
    let uid1 = static_uid(&agent, "web").await;
    let mirror = running_mirror(&pods, &web, &uid1).await;
    let owners = mirror.metadata.owner_references.clone().unwrap_or_default();
    assert_eq!(owners.len(), 1, "{owners:?}");
    assert_eq!(
        (owners[0].kind.as_str(), owners[0].name.as_str()),
        ("Node", node)
    );
    assert_eq!(Some(&owners[0].uid), node_obj.metadata.uid.as_ref());
    assert_eq!(owners[0].controller, Some(true));
    assert_eq!(
        mirror.spec.as_ref().and_then(|s| s.node_name.as_deref()),
        Some(node)
    );
    assert_eq!(
        annotation(&mirror, "kubernetes.io/config.source"),
        Some("file")
    );
    let labels = mirror.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("version").map(String::as_str), Some("1"));
    let status = mirror.status.clone().unwrap();
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    assert!(ready, "{status:?}");
    let local = agent.pod("web").await.unwrap();
    assert_eq!(
        status.pod_ip.as_deref(),
        local["status"]["podIP"].as_str(),
        "the API server shows the static pod's IP"
    );
    let cri = cri().await;
    let containers = running_containers(&cri, &web, WAIT).await;

    // A user deletes the mirror pod: another one appears; the static pod runs on untouched.
    let first = mirror.metadata.uid.clone().unwrap();
    pods.delete(&web, &DeleteParams::default()).await.unwrap();
    let again = wait_until("a new mirror pod", WAIT, || async {
        let pod = pods.get_opt(&web).await.ok()??;
        let fresh = pod.metadata.uid.as_deref() != Some(first.as_str())
            && pod.metadata.deletion_timestamp.is_none();
        fresh.then_some(pod)
    })
    .await;
    assert_eq!(annotation(&again, MIRROR), Some(uid1.as_str()));
    running_mirror(&pods, &web, &uid1).await;
    assert_eq!(running_containers(&cri, &web, WAIT).await, containers);

    // The manifest changes: the static pod has a new hash, and its mirror pod is replaced.
    let second = again.metadata.uid.clone().unwrap();
    agent.write_manifest("web.yaml", &manifest("web", ns, 2));
    let uid2 = wait_until("the new version in /pods", WAIT, || async {
        let uid = agent.pod("web").await?["metadata"]["uid"]
            .as_str()?
            .to_string();
        (uid != uid1).then_some(uid)
    })
    .await;
    let replaced = running_mirror(&pods, &web, &uid2).await;
    assert_ne!(replaced.metadata.uid.as_deref(), Some(second.as_str()));
    let labels = replaced.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("version").map(String::as_str), Some("2"));

    // The manifest is removed: the static pod stops and its mirror pod goes.
    agent.remove_manifest("web.yaml");
    wait_until("the mirror pod deleted", WAIT, || async {
        pods.get_opt(&web).await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(sandboxes_of(&cri, &web).await.is_empty());

    // A manifest removed while Deckhand is stopped leaves an orphaned mirror pod, deleted once
    // Deckhand is back and has read its sources.
    let gone = agent.pod_name("gone");
    let gone_uid = static_uid(&agent, "gone").await;
    running_mirror(&pods, &gone, &gone_uid).await;
    agent.stop();
    agent.remove_manifest("gone.yaml");
    agent.start();
    wait_until("the orphaned mirror pod deleted", WAIT, || async {
        pods.get_opt(&gone).await.ok()?.is_none().then_some(())
    })
    .await;
    let log = agent.log();
    assert!(log.contains("deleted the orphaned mirror pod"), "{log}");
}

#[tokio::test]
async fn a_static_pod_that_refers_to_a_secret_is_refused_and_says_why() {
    let client = admin().await;
    let ns = "e2e-mirror-refused";
    let _ns = create_namespace(&client, ns).await;
    let node = "dm-refused";
    let (mut agent, _node_cleanup) = joined_agent(node);
    let with_secret = format!(
        "{}  volumes:\n  - name: creds\n    secret: {{secretName: creds}}\n",
        manifest("vault", ns, 1)
    );
    agent.write_manifest("vault.yaml", &with_secret);
    agent.write_manifest("web.yaml", &manifest("web", ns, 1));
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);

    let vault = wait_until("the refused pod in /pods", WAIT, || async {
        agent.pod("vault").await
    })
    .await;
    assert_eq!(vault["status"]["phase"], "Failed", "{vault}");
    assert_eq!(vault["status"]["reason"], "UnexpectedAdmissionError");
    assert_eq!(
        vault["status"]["message"],
        "Pod was rejected: static pods may not reference secrets"
    );
    assert!(
        agent.log().contains("refusing a static pod"),
        "{}",
        agent.log()
    );

    // The other static pod runs and has its mirror pod; the refused one has neither.
    let web_uid = static_uid(&agent, "web").await;
    running_mirror(&pods, &agent.pod_name("web"), &web_uid).await;
    let cri = cri().await;
    assert!(
        sandboxes_of(&cri, &agent.pod_name("vault"))
            .await
            .is_empty()
    );
    assert!(
        pods.get_opt(&agent.pod_name("vault"))
            .await
            .unwrap()
            .is_none()
    );
}
