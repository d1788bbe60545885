//! End to end: the API server goes away for a minute and comes back. The static pods and the
//! pods from the API server are not touched, the agent stays healthy, says once that it cannot
//! reach the API server, renews its Lease as soon as the API server answers again, and its pod
//! watch resumes (a pod created after the return starts).
//!
//! A binary of its own: it stops the shared test control plane's API server, which no other
//! test may see (cargo runs test binaries one after another).

mod common;

use std::time::{Duration, Instant};

use common::cluster::{
    admin, bound_pod, cluster_cmd, cluster_dir, condition, create_namespace, get_lease, get_node,
    joined_agent, wait_node_ready,
};
use common::{cri, http_get, running_containers, sleeping_pod, wait_until};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};

const WAIT: Duration = Duration::from_secs(30);
/// How long the API server stays down (the figure).
const OUTAGE: Duration = Duration::from_secs(60);

/// Starts the API server again when dropped, so a failing test never leaves it down.
struct ApiserverBack;

impl Drop for ApiserverBack {
    fn drop(&mut self) {
        let dir = cluster_dir();
        let _ = std::process::Command::new(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/cluster"),
        )
        .args(["start", &dir.to_string_lossy(), "kube-apiserver"])
        .status();
    }
}

#[tokio::test]
async fn an_apiserver_outage_leaves_static_pods_alone_and_the_lease_resumes() {
    let client = admin().await;
    let node = "dn-outage";
    let (mut agent, _cleanup) = joined_agent(node);
    agent.write_manifest("steady.yaml", &sleeping_pod("steady"));
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    let cri = cri().await;
    let pod = agent.pod_name("steady");
    let before = running_containers(&cri, &pod, WAIT).await;

    // Three pods from the API server as well.
    let ns = "e2e-outage";
    let _ns = create_namespace(&client, ns).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let api_pods = ["api-1", "api-2", "api-3"];
    for name in api_pods {
        pods.create(&PostParams::default(), &bound_pod(name, node))
            .await
            .unwrap();
    }
    let mut api_before = Vec::new();
    for name in api_pods {
        api_before.push(running_containers(&cri, name, WAIT).await);
    }

    let dir = cluster_dir();
    let _back = ApiserverBack;
    cluster_cmd(&["stop", &dir.to_string_lossy(), "kube-apiserver"]);
    let down_at = Instant::now();
    // Through the outage, check every second that nothing changes on the node.
    while down_at.elapsed() < OUTAGE {
        let now = running_containers(&cri, &pod, WAIT).await;
        assert_eq!(now, before, "the static pod's containers are untouched");
        let (code, body) = http_get(&format!("http://127.0.0.1:{}/healthz", agent.healthz_port))
            .await
            .expect("/healthz answers");
        assert_eq!(
            (code, body.as_str()),
            (200, "ok"),
            "/healthz is about the node agent"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    cluster_cmd(&["start", &dir.to_string_lossy(), "kube-apiserver"]);
    let back_at = jiff::Timestamp::now();
    let back = Instant::now();

    // The Lease is renewed within one renew interval plus the longest back-off (7 s).
    wait_until(
        "the Lease renewed after the outage",
        Duration::from_secs(15),
        || async {
            let renewed = get_lease(&client, node).await?.spec?.renew_time?.0;
            (renewed > back_at).then_some(())
        },
    )
    .await;
    eprintln!("API server back → Lease renewed: {:?}", back.elapsed());
    wait_until("the Node Ready after the outage", WAIT, || async {
        let n = get_node(&client, node).await?;
        (condition(&n, "Ready").as_deref() == Some("True")).then_some(())
    })
    .await;
    let after = running_containers(&cri, &pod, WAIT).await;
    assert_eq!(after, before);
    for (name, was) in api_pods.iter().zip(&api_before) {
        assert_eq!(
            &running_containers(&cri, name, WAIT).await,
            was,
            "{name} kept its container"
        );
    }
    // The watch resumed: a pod created now starts.
    pods.create(&PostParams::default(), &bound_pod("api-after", node))
        .await
        .unwrap();
    running_containers(&cri, "api-after", WAIT).await;

    // The outage is told once per task (Lease, status), not once per retry, and its end too.
    let log = agent.log();
    let lease_warnings = log
        .matches("renewing the node Lease failed; retrying")
        .count();
    assert!(
        (1..=2).contains(&lease_warnings),
        "{lease_warnings} warnings:\n{log}"
    );
    assert!(log.contains("renewing the node Lease works again"), "{log}");
}
