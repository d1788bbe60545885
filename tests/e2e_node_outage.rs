//! End to end: the API server goes away for a minute and comes back while ten pods from it and
//! a static pod run. No container is restarted (the same container IDs in containerd,
//! restartCount 0 in the API server), the agent stays healthy, says once that it cannot reach
//! the API server, renews its Lease as soon as the API server answers again, and its pod watch
//! resumes: a pod created while the agent still cannot reach the API server starts once it can.
//!
//! The agent reaches the API server through a TCP relay in this test, which the test closes
//! just before it stops the API server, and opens again once the restarted API server has the
//! new pod: the pod is created "during the outage" from the agent's point of view, before its
//! watch has reconnected, in every run (not only when the agent's retry back-off happens to be
//! long enough). Closed, the relay does not listen, so connecting is refused, as when the API
//! server is down.
//!
//! A binary of its own: it stops the shared test control plane's API server, which no other
//! test may see (cargo runs test binaries one after another).

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::cluster::{
    admin, bound_pod, cluster_cmd, cluster_dir, cluster_env, condition, create_namespace,
    create_namespace_waiting, get_lease, get_node, joined_agent, wait_node_ready,
};
use common::{cri, http_get, running_containers, sleeping_pod, wait_until};
use deckhand::clients::cri::proto::{ContainerFilter, ContainerState};
use deckhand::clients::cri::{CriClient, RuntimeService};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use tokio_util::sync::CancellationToken;

const WAIT: Duration = Duration::from_secs(30);
/// How long the API server stays down (the figure).
const OUTAGE: Duration = Duration::from_secs(60);
/// Pods from the API server running through the outage (the figure).
const API_PODS: usize = 10;

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

/// A TCP relay on loopback to the API server, on a thread of its own (the test's runtime
/// blocks in `scripts/cluster`). Open, it passes connections through; closed, it cuts the ones
/// it carries and stops listening, so that connecting is refused as when the API server is
/// down. Stops when dropped.
struct Relay {
    port: u16,
    commands: tokio::sync::mpsc::UnboundedSender<(bool, tokio::sync::oneshot::Sender<()>)>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn listen(port: u16) -> std::io::Result<tokio::net::TcpListener> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(([127, 0, 0, 1], port).into())?;
    socket.listen(128)
}

impl Relay {
    fn start(upstream: u16) -> Relay {
        let (commands, mut rx) =
            tokio::sync::mpsc::unbounded_channel::<(bool, tokio::sync::oneshot::Sender<()>)>();
        let (port_tx, port_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
                .block_on(async move {
                    let first = listen(0).expect("a relay port");
                    let port = first.local_addr().unwrap().port();
                    port_tx.send(port).unwrap();
                    let mut listener = Some(first);
                    let mut cut = CancellationToken::new();
                    loop {
                        let accepted = match listener.as_ref() {
                            Some(l) => tokio::select! {
                                command = rx.recv() => Err(command),
                                accepted = l.accept() => Ok(accepted),
                            },
                            None => Err(rx.recv().await),
                        };
                        match accepted {
                            Ok(Ok((mut client, _))) => {
                                let cut = cut.clone();
                                tokio::spawn(async move {
                                    let Ok(mut server) =
                                        tokio::net::TcpStream::connect(("127.0.0.1", upstream))
                                            .await
                                    else {
                                        return;
                                    };
                                    tokio::select! {
                                        _ = cut.cancelled() => {}
                                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                                    }
                                });
                            }
                            Ok(Err(_)) => {}
                            Err(None) => return,
                            Err(Some((open, done))) => {
                                if open {
                                    if listener.is_none() {
                                        listener = Some(listen(port).expect("the relay's port again"));
                                    }
                                } else {
                                    listener = None;
                                    cut.cancel();
                                    cut = CancellationToken::new();
                                }
                                let _ = done.send(());
                            }
                        }
                    }
                })
        });
        let port = port_rx.recv().expect("the relay started");
        Relay {
            port,
            commands,
            thread: Some(thread),
        }
    }

    async fn set(&self, open: bool) {
        let (done, wait) = tokio::sync::oneshot::channel();
        self.commands.send((open, done)).expect("the relay runs");
        wait.await.expect("the relay answers");
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        let (closed, _) = tokio::sync::mpsc::unbounded_channel();
        drop(std::mem::replace(&mut self.commands, closed));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The IDs of the running containers of `node`'s pods, by pod name.
async fn running_by_pod(cri: &CriClient, node: &str) -> BTreeMap<String, Vec<String>> {
    let containers = cri
        .list_containers(Some(ContainerFilter {
            label_selector: [(
                deckhand::base::cri_labels::NODE_LABEL.to_string(),
                node.to_string(),
            )]
            .into(),
            ..Default::default()
        }))
        .await
        .expect("list containers");
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for c in containers {
        if c.state == ContainerState::ContainerRunning as i32 {
            let pod = c
                .labels
                .get("io.kubernetes.pod.name")
                .cloned()
                .unwrap_or_default();
            out.entry(pod).or_default().push(c.id);
        }
    }
    for ids in out.values_mut() {
        ids.sort();
    }
    out
}

#[tokio::test]
async fn an_apiserver_outage_restarts_no_container_and_the_watch_and_lease_resume() {
    let client = admin().await;
    let node = "dn-outage";
    let (mut agent, _cleanup) = joined_agent(node);
    // The agent's kubeconfig points at the relay (the API server's certificate names
    // 127.0.0.1, so only the port changes).
    let apiserver_port: u16 = cluster_env("APISERVER_PORT").parse().unwrap();
    let relay = Relay::start(apiserver_port);
    let kubeconfig = agent.dir.path().join("relayed.kubeconfig");
    let original = common::cluster::node_kubeconfig(node);
    let text = std::fs::read_to_string(&original).unwrap();
    let from = format!("https://127.0.0.1:{apiserver_port}");
    assert!(text.contains(&from), "{text}");
    std::fs::write(
        &kubeconfig,
        text.replace(&from, &format!("https://127.0.0.1:{}", relay.port)),
    )
    .unwrap();
    for arg in agent.extra_args.iter_mut() {
        if arg.starts_with("--kubeconfig=") {
            *arg = format!("--kubeconfig={}", kubeconfig.display());
        }
    }
    agent.write_manifest("steady.yaml", &sleeping_pod("steady"));
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    let cri = cri().await;
    let steady = agent.pod_name("steady");
    running_containers(&cri, &steady, WAIT).await;

    // Ten pods from the API server as well, Ready there before the outage.
    let ns = "e2e-outage";
    let _ns = create_namespace(&client, ns).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let api_pods: Vec<String> = (1..=API_PODS).map(|i| format!("api-{i}")).collect();
    for name in &api_pods {
        pods.create(&PostParams::default(), &bound_pod(name, node))
            .await
            .unwrap();
    }
    for name in &api_pods {
        wait_until(&format!("{name} Ready in the API server"), WAIT, || async {
            let p = pods.get(name).await.ok()?;
            let cs = p.status?.container_statuses?;
            cs.first()?.ready.then_some(())
        })
        .await;
    }
    let before = running_by_pod(&cri, node).await;
    assert_eq!(before.len(), API_PODS + 1, "{before:?}");
    assert!(before.values().all(|ids| ids.len() == 1), "{before:?}");

    let dir = cluster_dir();
    let _back = ApiserverBack;
    // The agent is cut off first, then the API server stops: to the agent it vanishes at once
    // (as in a crash or a network cut), and whatever it reaches later is a new API server.
    relay.set(false).await;
    cluster_cmd(&["stop", &dir.to_string_lossy(), "kube-apiserver"]);
    let down_at = Instant::now();
    // Through the outage, check every second that nothing changes on the node.
    while down_at.elapsed() < OUTAGE {
        assert_eq!(
            running_by_pod(&cri, node).await,
            before,
            "the pods' containers are untouched"
        );
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
    // The API server is back, the agent cannot reach it yet: a pod created now is one its
    // watch has not seen.
    pods.create(&PostParams::default(), &bound_pod("api-during", node))
        .await
        .unwrap();
    let back_at = jiff::Timestamp::now();
    let back = Instant::now();
    relay.set(true).await;

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
    eprintln!("API server reachable → Lease renewed: {:?}", back.elapsed());
    // The watch resumed: the pod created during the outage runs, and is Ready in the API server.
    running_containers(&cri, "api-during", WAIT).await;
    wait_until("api-during Ready in the API server", WAIT, || async {
        let p = pods.get("api-during").await.ok()?;
        let cs = p.status?.container_statuses?;
        cs.first()?.ready.then_some(())
    })
    .await;
    eprintln!(
        "API server reachable → api-during Ready: {:?}",
        back.elapsed()
    );
    // And the watch streams again: a pod created now starts too.
    pods.create(&PostParams::default(), &bound_pod("api-after", node))
        .await
        .unwrap();
    running_containers(&cri, "api-after", WAIT).await;
    wait_until("the Node Ready after the outage", WAIT, || async {
        let n = get_node(&client, node).await?;
        (condition(&n, "Ready").as_deref() == Some("True")).then_some(())
    })
    .await;

    // No container was restarted: the same IDs in containerd, restartCount 0 and Ready in the
    // API server.
    let mut after = running_by_pod(&cri, node).await;
    after.remove("api-during");
    after.remove("api-after");
    assert_eq!(after, before, "the same containers before and after");
    for name in &api_pods {
        let p = pods.get(name).await.unwrap();
        let status = p.status.unwrap();
        assert_eq!(status.phase.as_deref(), Some("Running"), "{name}");
        let cs = &status.container_statuses.unwrap()[0];
        assert_eq!(cs.restart_count, 0, "{name}: {cs:?}");
        assert!(cs.ready, "{name}: {cs:?}");
    }

    // The outage is told once, not once per retry, and its end too: by the pod watch, and by
    // the node's Lease and status tasks, which share one account (whichever of them reaches
    // the API server first says it works again).
    let log = agent.log();
    let count = |texts: &[&str]| -> usize { texts.iter().map(|t| log.matches(t).count()).sum() };
    for (what, failed, works) in [
        (
            "the pod watch",
            count(&["watching the node's pods failed; retrying"]),
            count(&["watching the node's pods works again"]),
        ),
        (
            "the Lease and status",
            count(&[
                "renewing the node Lease failed; retrying",
                "updating the node status failed; retrying",
            ]),
            count(&[
                "renewing the node Lease works again",
                "updating the node status works again",
            ]),
        ),
    ] {
        assert!(
            (1..=2).contains(&failed) && (1..=failed).contains(&works),
            "{what}: {failed} warnings, {works} recoveries:\n{log}"
        );
    }

    // Leave a control plane the next test can use: the controller-manager's watches come back
    // on their own back-off (up to about 30 s after a minute's outage), and a test that makes
    // a namespace next waits for its service account from them.
    let _after =
        create_namespace_waiting(&client, "e2e-outage-after", Duration::from_secs(180)).await;
}
