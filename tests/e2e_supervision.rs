//! End to end, against the private containerd: a pod worker that panics is caught, counted on
//! `/metrics` and retried, while the agent's other pods and its health stay as they were.

mod common;

use std::time::Duration;

use common::{Agent, http_get, sleeping_pod, wait_until};

const WAIT: Duration = Duration::from_secs(30);

fn running(pod: &serde_json::Value) -> bool {
    pod["status"]["containerStatuses"]
        .as_array()
        .and_then(|a| a.first())
        .is_some_and(|c| c["state"]["running"].is_object())
}

#[tokio::test]
async fn a_panicking_pod_worker_is_retried_and_counted() {
    let mut agent = Agent::new("e2e-supervise-panic");
    // Fault injection: the first sync of this pod panics inside its worker.
    agent
        .env
        .push(("DECKHAND_TEST_PANIC_POD".into(), agent.pod_name("boom")));
    agent.write_manifest("calm.yaml", &sleeping_pod("calm"));
    agent.write_manifest("boom.yaml", &sleeping_pod("boom"));
    agent.start();
    agent.wait_healthy(WAIT).await;

    for name in ["calm", "boom"] {
        wait_until(&format!("{name} running"), WAIT, || async {
            let pod = agent.pod(name).await?;
            running(&pod).then_some(())
        })
        .await;
    }
    let log = agent.log();
    assert!(
        log.contains("the pod worker panicked while syncing; it will try again")
            && log.contains("injected panic"),
        "the panic is logged with its message"
    );
    let metrics = format!("http://127.0.0.1:{}/metrics", agent.read_only_port);
    let (code, body) = http_get(&metrics).await.expect("/metrics answers");
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains("deckhand_pod_worker_panics_total 1\n"),
        "{body}"
    );
    let healthz = format!("http://127.0.0.1:{}/healthz?verbose", agent.healthz_port);
    let (code, body) = http_get(&healthz).await.expect("/healthz answers");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("[+]syncloop ok"), "{body}");
}

/// A "registry" on loopback that accepts connections and never answers.
struct SilentRegistry {
    port: u16,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl SilentRegistry {
    fn start() -> SilentRegistry {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                match listener.accept() {
                    Ok((s, _)) => held.push(s),
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        SilentRegistry { port, stop }
    }
}

impl Drop for SilentRegistry {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

#[tokio::test]
async fn a_pull_that_receives_nothing_is_abandoned_at_its_progress_deadline() {
    let registry = SilentRegistry::start();
    let mut agent = Agent::new("e2e-supervise-pull");
    agent
        .extra_args
        .push("--image-pull-progress-deadline=2s".into());
    agent.write_manifest(
        "silent.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: silent
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: 127.0.0.1:{}/deckhand/silent:1
"#,
            registry.port
        ),
    );
    agent.start();
    agent.wait_healthy(WAIT).await;
    // Without the deadline the pull hangs as long as the registry holds the connection.
    let waiting = wait_until("the stalled pull reported", WAIT, || async {
        let pod = agent.pod("silent").await?;
        let w = pod["status"]["containerStatuses"][0]["state"]["waiting"].clone();
        (w["reason"] == "ErrImagePull").then_some(w)
    })
    .await;
    let message = waiting["message"].as_str().unwrap_or_default();
    assert!(message.contains("no progress for 2s"), "{waiting}");
    wait_until("then ImagePullBackOff", WAIT, || async {
        let pod = agent.pod("silent").await?;
        let w = &pod["status"]["containerStatuses"][0]["state"]["waiting"];
        (w["reason"] == "ImagePullBackOff").then_some(())
    })
    .await;
    drop(registry);
}

/// Fault injection (`DECKHAND_TEST_PANIC_TASK`): the PLEG's task panics once. The supervisor
/// catches it, names it in `/healthz` and counts it on `/metrics`, and starts it again: pods
/// start and the PLEG relists as before.
#[tokio::test]
async fn a_panicking_background_task_is_restarted_counted_and_named() {
    let mut agent = Agent::new("e2e-supervise-task");
    agent
        .env
        .push(("DECKHAND_TEST_PANIC_TASK".into(), "pleg".into()));
    agent.write_manifest("calm.yaml", &sleeping_pod("calm"));
    agent.start();
    let healthz = format!("http://127.0.0.1:{}/healthz?verbose", agent.healthz_port);
    let failing = wait_until("/healthz to name the task that panicked", WAIT, || async {
        let (code, body) = http_get(&healthz).await?;
        (code == 500 && body.contains("[-]tasks failed: pleg panicked 1 time")).then_some(body)
    })
    .await;
    assert!(failing.contains("[+]syncloop ok"), "{failing}");
    wait_until("calm running", WAIT, || async {
        let pod = agent.pod("calm").await?;
        running(&pod).then_some(())
    })
    .await;
    let metrics = format!("http://127.0.0.1:{}/metrics", agent.read_only_port);
    let (_, body) = http_get(&metrics).await.expect("/metrics answers");
    assert!(
        body.contains("deckhand_task_panics_total{task=\"pleg\"} 1\n"),
        "{body}"
    );
    // Restarted: the PLEG relists again (its check passes with a note on its mode).
    wait_until("the restarted PLEG to relist", WAIT, || async {
        let (_, body) = http_get(&healthz).await?;
        body.contains("[+]pleg ok").then_some(())
    })
    .await;
    assert!(
        agent.log().contains("a background task panicked"),
        "the panic is logged"
    );
}
