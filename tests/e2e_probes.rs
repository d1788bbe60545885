//! End to end, against the private containerd: readiness, liveness and startup probes of every
//! handler kind change what `/pods` reports and restart containers, and are counted in
//! `/metrics/probes`.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{Agent, containers_of, cri, http_get, wait_until};
use deckhand::clients::cri::RuntimeService;
use deckhand::kubelet::prober::health_proto::health_check_response::ServingStatus;
use deckhand::kubelet::prober::health_proto::health_server::{Health, HealthServer};
use deckhand::kubelet::prober::health_proto::{HealthCheckRequest, HealthCheckResponse};
use serde_json::Value;

const BUSYBOX: &str = "localhost/deckhand/busybox:1.35";
const WAIT: Duration = Duration::from_secs(30);

/// One test at a time: an agent tears down every pod of the runtime that it does not run
/// itself, so two agents on one containerd remove each other's pods.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Starts an agent with quick restarts, holding the serial lock for as long as the test runs
/// (bind the guard before the agent, so the agent is dropped and cleaned up first).
async fn agent(node: &str) -> (tokio::sync::MutexGuard<'static, ()>, Agent) {
    let serial = SERIAL.lock().await;
    let mut agent = Agent::new(node);
    agent
        .env
        .push(("DECKHAND_BACKOFF_INITIAL".into(), "200ms".into()));
    agent.start();
    agent.wait_healthy(WAIT).await;
    (serial, agent)
}

/// The status of one container of a pod in `/pods`.
fn container_status<'a>(pod: &'a Value, name: &str) -> Option<&'a Value> {
    pod["status"]["containerStatuses"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
}

/// The status of the pod's `Ready` condition.
fn pod_ready(pod: &Value) -> Option<String> {
    let conds = pod["status"]["conditions"].as_array()?;
    let ready = conds.iter().find(|c| c["type"] == "Ready")?;
    ready["status"].as_str().map(str::to_string)
}

fn running(pod: &Value, name: &str) -> bool {
    container_status(pod, name).is_some_and(|c| c["state"]["running"].is_object())
}

async fn metrics(agent: &Agent) -> String {
    let url = format!("http://127.0.0.1:{}/metrics/probes", agent.read_only_port);
    http_get(&url)
        .await
        .map(|(_, body)| body)
        .unwrap_or_default()
}

/// Runs `sh -c cmd` in the running container `name` of pod `pod`.
async fn exec_in(agent: &Agent, pod: &str, name: &str, cmd: &str) {
    let client = cri().await;
    let containers = containers_of(&client, &agent.pod_name(pod)).await;
    let c = containers
        .iter()
        .find(|c| {
            c.state == 1
                && c.labels
                    .get("io.kubernetes.container.name")
                    .map(String::as_str)
                    == Some(name)
        })
        .unwrap_or_else(|| panic!("a running container {name} of {pod} in {containers:?}"));
    let resp = client
        .exec_sync(c.id.clone(), vec!["sh".into(), "-c".into(), cmd.into()], 10)
        .await
        .expect("exec");
    assert_eq!(
        resp.exit_code,
        0,
        "{cmd}: {}",
        String::from_utf8_lossy(&resp.stderr)
    );
}

#[tokio::test]
async fn http_readiness_probe_makes_the_container_ready_when_the_page_exists() {
    let (_serial, agent) = agent("e2e-probe-http").await;
    agent.write_manifest(
        "web.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: web
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: httpd
    image: {BUSYBOX}
    command: ["sh", "-c", "mkdir -p /www && trap 'exit 0' TERM; httpd -f -p 8080 -h /www & wait"]
    ports:
    - name: http
      containerPort: 8080
    readinessProbe:
      httpGet:
        path: /ready.html
        port: http
        httpHeaders:
        - name: X-Probe
          value: deckhand
      periodSeconds: 1
"#
        ),
    );
    // Running, but the page is not there: not ready.
    let pod = wait_until("web running", WAIT, || async {
        let pod = agent.pod("web").await?;
        running(&pod, "httpd").then_some(pod)
    })
    .await;
    assert_eq!(
        container_status(&pod, "httpd").unwrap()["ready"],
        false,
        "{pod}"
    );
    assert_eq!(pod_ready(&pod).as_deref(), Some("False"));
    // Several probe periods later it is still not ready (every probe gets a 404).
    wait_until("failed readiness probes counted", WAIT, || async {
        let text = metrics(&agent).await;
        text.lines()
            .find(|l| {
                l.contains(r#"container="httpd""#)
                    && l.contains(r#"probe_type="Readiness",result="failed""#)
            })
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .filter(|n| *n >= 2)
    })
    .await;
    let pod = agent.pod("web").await.unwrap();
    assert_eq!(
        container_status(&pod, "httpd").unwrap()["ready"],
        false,
        "{pod}"
    );

    // The page appears: ready within a few periods, and the pod's Ready condition follows.
    exec_in(&agent, "web", "httpd", "echo ok > /www/ready.html").await;
    let appeared = Instant::now();
    let pod = wait_until("web ready", WAIT, || async {
        let pod = agent.pod("web").await?;
        (container_status(&pod, "httpd")?["ready"] == true).then_some(pod)
    })
    .await;
    assert!(
        appeared.elapsed() < Duration::from_secs(5),
        "ready {:?} after the page appeared",
        appeared.elapsed()
    );
    assert_eq!(pod_ready(&pod).as_deref(), Some("True"), "{pod}");
    assert_eq!(container_status(&pod, "httpd").unwrap()["started"], true);

    // Counted, with the pod's identity.
    let text = metrics(&agent).await;
    let full = agent.pod_name("web");
    let uid = pod["metadata"]["uid"].as_str().unwrap();
    assert!(text.contains("# TYPE prober_probe_total counter"), "{text}");
    let successful = format!(
        r#"prober_probe_total{{container="httpd",namespace="default",pod="{full}",pod_uid="{uid}",probe_type="Readiness",result="successful"}}"#
    );
    assert!(text.contains(&successful), "{text}");

    // The page goes away again: not ready again.
    exec_in(&agent, "web", "httpd", "rm /www/ready.html").await;
    wait_until("web not ready again", WAIT, || async {
        let pod = agent.pod("web").await?;
        (container_status(&pod, "httpd")?["ready"] == false && pod_ready(&pod)? == "False")
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn failing_exec_liveness_probe_restarts_the_container() {
    let (_serial, agent) = agent("e2e-probe-live").await;
    agent.write_manifest(
        "live.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: live
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: {BUSYBOX}
    command: ["sh", "-c", "trap 'exit 0' TERM; touch /tmp/healthy; sleep 3; rm -f /tmp/healthy; sleep 600 & wait"]
    livenessProbe:
      exec:
        command: ["cat", "/tmp/healthy"]
      periodSeconds: 1
      failureThreshold: 2
"#
        ),
    );
    let first = wait_until("live running", WAIT, || async {
        let pod = agent.pod("live").await?;
        let cs = container_status(&pod, "app")?;
        cs["state"]["running"]
            .is_object()
            .then(|| cs["containerID"].clone())
    })
    .await;
    let pod = wait_until("a restart after the liveness failure", WAIT, || async {
        let pod = agent.pod("live").await?;
        let cs = container_status(&pod, "app")?;
        let restarted = cs["restartCount"].as_i64()? >= 1 && cs["state"]["running"].is_object();
        (restarted && cs["lastState"]["terminated"].is_object()).then_some(pod)
    })
    .await;
    let cs = container_status(&pod, "app").unwrap();
    assert_ne!(cs["containerID"], first, "a new instance");
    assert!(cs["lastState"]["terminated"].is_object(), "{cs}");
    assert!(
        agent
            .log()
            .contains("Container app failed liveness probe, will be restarted"),
        "the kill names the reason"
    );
    let text = metrics(&agent).await;
    assert!(
        text.contains(r#"container="app""#)
            && text.contains(r#"probe_type="Liveness",result="failed""#),
        "{text}"
    );
    assert!(
        text.contains(r#"probe_type="Liveness",result="successful""#),
        "{text}"
    );
}

#[tokio::test]
async fn startup_probe_that_never_succeeds_kills_the_container() {
    let (_serial, agent) = agent("e2e-probe-startup").await;
    agent.write_manifest(
        "slow.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: slow
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: {BUSYBOX}
    command: ["sh", "-c", "trap 'exit 0' TERM; sleep 600 & wait"]
    startupProbe:
      exec:
        command: ["cat", "/never"]
      periodSeconds: 1
      failureThreshold: 3
    readinessProbe:
      exec:
        command: ["true"]
      periodSeconds: 1
"#
        ),
    );
    let pod = wait_until("slow running", WAIT, || async {
        let pod = agent.pod("slow").await?;
        running(&pod, "app").then_some(pod)
    })
    .await;
    let seen_running = Instant::now();
    let cs = container_status(&pod, "app").unwrap();
    assert_eq!(
        cs["started"], false,
        "not started before the startup probe succeeds: {cs}"
    );
    assert_eq!(cs["ready"], false, "and so not ready: {cs}");

    let pod = wait_until("a restart after the startup failures", WAIT, || async {
        let pod = agent.pod("slow").await?;
        let cs = container_status(&pod, "app")?;
        (cs["restartCount"].as_i64()? >= 1 && cs["lastState"]["terminated"].is_object())
            .then_some(pod)
    })
    .await;
    // failureThreshold × period = 3 s, plus the kill, the restart and our polling.
    let elapsed = seen_running.elapsed();
    assert!(
        elapsed >= Duration::from_secs(1) && elapsed <= Duration::from_secs(15),
        "restarted {elapsed:?} after it was seen running"
    );
    let term = &container_status(&pod, "app").unwrap()["lastState"]["terminated"];
    let secs = |field: &str| {
        term[field]
            .as_str()?
            .parse::<jiff::Timestamp>()
            .ok()
            .map(|t| t.as_second())
    };
    if let (Some(started), Some(finished)) = (secs("startedAt"), secs("finishedAt")) {
        let lived = finished - started;
        assert!(
            (1..=8).contains(&lived),
            "the first instance lived {lived}s: {term}"
        );
    }
    assert!(
        agent
            .log()
            .contains("Container app failed startup probe, will be restarted")
    );
    let text = metrics(&agent).await;
    assert!(
        text.contains(r#"probe_type="Startup",result="failed""#),
        "{text}"
    );
    assert!(
        !text.contains(r#"probe_type="Readiness""#),
        "readiness never ran: {text}"
    );
}

#[tokio::test]
async fn tcp_probe_follows_the_listening_port() {
    let (_serial, agent) = agent("e2e-probe-tcp").await;
    agent.write_manifest(
        "tcp.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: tcp
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: listener
    image: {BUSYBOX}
    command: ["sh", "-c", "trap 'exit 0' TERM; nc -ll -p 9000 -e true & wait"]
    readinessProbe:
      tcpSocket:
        port: 9000
      periodSeconds: 1
  - name: closed
    image: {BUSYBOX}
    command: ["sh", "-c", "trap 'exit 0' TERM; sleep 600 & wait"]
    readinessProbe:
      tcpSocket:
        port: 9001
      periodSeconds: 1
"#
        ),
    );
    let pod = wait_until("listener ready", WAIT, || async {
        let pod = agent.pod("tcp").await?;
        (container_status(&pod, "listener")?["ready"] == true && running(&pod, "closed"))
            .then_some(pod)
    })
    .await;
    assert_eq!(
        pod_ready(&pod).as_deref(),
        Some("False"),
        "one container is not ready"
    );
    // The closed port keeps failing.
    wait_until("failed tcp probes on the closed port", WAIT, || async {
        let text = metrics(&agent).await;
        text.lines()
            .find(|l| l.contains(r#"container="closed""#) && l.contains(r#"result="failed""#))
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .filter(|n| *n >= 3)
    })
    .await;
    let pod = agent.pod("tcp").await.unwrap();
    assert_eq!(
        container_status(&pod, "closed").unwrap()["ready"],
        false,
        "{pod}"
    );
    assert_eq!(
        container_status(&pod, "listener").unwrap()["ready"],
        true,
        "{pod}"
    );
}

/// A health service on the host: the empty service serves, `down` does not.
#[derive(Clone)]
struct HostHealth;

#[tonic::async_trait]
impl Health for HostHealth {
    async fn check(
        &self,
        req: tonic::Request<HealthCheckRequest>,
    ) -> Result<tonic::Response<HealthCheckResponse>, tonic::Status> {
        let status = match req.get_ref().service.as_str() {
            "" => ServingStatus::Serving,
            _ => ServingStatus::NotServing,
        };
        Ok(tonic::Response::new(HealthCheckResponse {
            status: status as i32,
        }))
    }
}

#[tokio::test]
async fn grpc_probe_of_a_host_network_pod_reaches_a_health_server_on_the_host() {
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let closed = common::free_port();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(HealthServer::new(HostHealth))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let (_serial, agent) = agent("e2e-probe-grpc").await;
    let probe = |service: &str, port: u16| {
        format!(
            "    readinessProbe:\n      grpc:\n        port: {port}\n        service: \"{service}\"\n      periodSeconds: 1\n"
        )
    };
    let container = |name: &str, probe: String| {
        format!(
            "  - name: {name}\n    image: {BUSYBOX}\n    command: [\"sh\", \"-c\", \"trap 'exit 0' TERM; sleep 600 & wait\"]\n{probe}"
        )
    };
    agent.write_manifest(
        "grpc.yaml",
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: grpc\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  containers:\n{}{}{}",
            container("serving", probe("", port)),
            container("notserving", probe("down", port)),
            container("closed", probe("", closed)),
        ),
    );
    wait_until("the serving container ready", WAIT, || async {
        let pod = agent.pod("grpc").await?;
        (container_status(&pod, "serving")?["ready"] == true).then_some(())
    })
    .await;
    let failed = |text: &str, container: &str| {
        text.lines()
            .find(|l| {
                l.contains(&format!(r#"container="{container}""#))
                    && l.contains(r#"result="failed""#)
            })
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    wait_until("failed grpc probes of the other two", WAIT, || async {
        let text = metrics(&agent).await;
        (failed(&text, "notserving") >= 2 && failed(&text, "closed") >= 2).then_some(())
    })
    .await;
    let pod = agent.pod("grpc").await.unwrap();
    let ready: HashMap<&str, bool> = ["serving", "notserving", "closed"]
        .into_iter()
        .map(|n| (n, container_status(&pod, n).unwrap()["ready"] == true))
        .collect();
    assert_eq!(
        ready,
        HashMap::from([("serving", true), ("notserving", false), ("closed", false)]),
        "{pod}"
    );
    assert_eq!(pod_ready(&pod).as_deref(), Some("False"));
}

#[tokio::test]
async fn sidecar_startup_probe_runs_and_lets_the_pod_start() {
    let (_serial, agent) = agent("e2e-probe-sidecar").await;
    agent.write_manifest(
        "side.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: side
spec:
  terminationGracePeriodSeconds: 1
  initContainers:
  - name: proxy
    image: {BUSYBOX}
    restartPolicy: Always
    command: ["sh", "-c", "trap 'exit 0' TERM; sleep 1; touch /tmp/up; sleep 600 & wait"]
    startupProbe:
      exec:
        command: ["test", "-f", "/tmp/up"]
      periodSeconds: 1
      failureThreshold: 30
    readinessProbe:
      exec:
        command: ["true"]
      periodSeconds: 1
  containers:
  - name: app
    image: {BUSYBOX}
    command: ["sh", "-c", "trap 'exit 0' TERM; sleep 600 & wait"]
"#
        ),
    );
    // The app container starts only once the sidecar's startup probe has succeeded; before the
    // fix the probe never ran and the pod stayed in Init forever.
    let pod = wait_until(
        "the app container running after the sidecar started",
        WAIT,
        || async {
            let pod = agent.pod("side").await?;
            running(&pod, "app").then_some(pod)
        },
    )
    .await;
    let proxy = pod["status"]["initContainerStatuses"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["name"] == "proxy"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(proxy["started"], true, "{pod}");
    wait_until("the sidecar ready by its readiness probe", WAIT, || async {
        let pod = agent.pod("side").await?;
        let proxy = pod["status"]["initContainerStatuses"]
            .as_array()?
            .iter()
            .find(|c| c["name"] == "proxy")?
            .clone();
        (proxy["ready"] == true).then_some(())
    })
    .await;
    let text = metrics(&agent).await;
    assert!(
        text.contains(r#"container="proxy""#)
            && text.contains(r#"probe_type="Startup",result="successful""#),
        "{text}"
    );
}
