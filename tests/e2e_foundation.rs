//! End to end, against the private containerd: the CRI handshake, the daemon's health endpoint,
//! clean shutdown, and clear failures for a bad runtime endpoint or configuration.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Agent, cri, deckhand_bin, wait_until};
use deckhand::clients::cri::{RuntimeService, handshake};

#[tokio::test]
async fn cri_handshake_returns_containerd_version() {
    let client = cri().await;
    let info = handshake(&client, "testbed", Duration::from_secs(30))
        .await
        .expect("handshake with the testbed");
    assert_eq!(info.runtime_name, "containerd");
    assert_eq!(info.runtime_api_version, "v1");
    assert!(!info.runtime_version.is_empty());
}

#[tokio::test]
async fn daemon_is_healthy_and_sigterm_exits_zero_leaving_pods_running() {
    let mut agent = Agent::new("e2e-found-health");
    agent.write_manifest(
        "sleeper.yaml",
        r#"
apiVersion: v1
kind: Pod
metadata: {name: sleeper}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: localhost/deckhand/busybox:1.35
    command: ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
"#,
    );
    agent.start();
    agent.wait_healthy(Duration::from_secs(60)).await;
    let client = cri().await;
    let full = agent.pod_name("sleeper");
    wait_until(
        "the sleeper container to run",
        Duration::from_secs(60),
        || {
            let client = client.clone();
            let full = full.clone();
            async move {
                let cs = common::containers_of(&client, &full).await;
                cs.iter().any(|c| c.state == 1).then_some(())
            }
        },
    )
    .await;

    let status = agent.stop().expect("the agent was running");
    assert!(
        status.success(),
        "exit status {status}; log:\n{}",
        agent.log()
    );
    assert!(
        agent
            .log()
            .contains("shutting down; containers keep running")
    );

    // Upstream's promise: restarting the agent must not kill pods.
    let cs = common::containers_of(&client, &full).await;
    assert!(
        cs.iter().any(|c| c.state == 1),
        "the container should still run after the agent stopped: {cs:?}"
    );
}

#[tokio::test]
async fn healthz_names_a_failing_check_with_500() {
    // A bound healthz with an unreachable read-only address is not a thing we can fail on
    // purpose, so this asserts the format through the library.
    let health = deckhand::base::health::Health::default();
    health.register("syncloop", || {
        Err("the sync loop has not turned for 400s".into())
    });
    let report = health.report();
    assert!(!report.healthy());
    assert!(
        report
            .render(false)
            .contains("[-]syncloop failed: the sync loop has not turned for 400s")
    );
}

#[test]
fn bad_runtime_endpoint_fails_fast_with_the_endpoint_named() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nothing-here.sock");
    let started = Instant::now();
    let out = Command::new(deckhand_bin())
        .arg(format!(
            "--container-runtime-endpoint=unix://{}",
            sock.display()
        ))
        .arg(format!("--root-dir={}", dir.path().join("root").display()))
        .arg("--healthz-port=0")
        .output()
        .expect("run deckhand");
    let elapsed = started.elapsed();
    assert!(!out.status.success(), "deckhand should fail");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.contains(&sock.display().to_string())
            && last.contains("cannot connect to the container runtime"),
        "the last line should name the endpoint: {stderr}"
    );
    assert!(elapsed < Duration::from_secs(20), "took {elapsed:?}");
}

#[test]
fn invalid_configuration_fails_at_start_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("config.yaml");
    std::fs::write(
        &cfg,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nsyncFrequency: \"1 minute\"\n",
    )
    .unwrap();
    let out = Command::new(deckhand_bin())
        .arg(format!("--config={}", cfg.display()))
        .output()
        .expect("run deckhand");
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("syncFrequency"), "{stderr}");
}

#[tokio::test]
async fn runtime_status_reports_ready() {
    let client = cri().await;
    let status = client.status(false).await.expect("Status");
    assert_eq!(
        deckhand::clients::cri::handshake::readiness_problem(&status),
        None
    );
}
