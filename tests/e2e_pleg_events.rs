//! End-to-end: the PLEG follows the runtime's event stream, against a real containerd.
//!
//! The source it should use depends on the runtime (CRI `Version`'s name): containerd's own
//! event service on any containerd (1.6 has no CRI events; 2.x sends them only after it has
//! deleted the task), CRI `GetContainerEvents` elsewhere.
//!
//! With the relist period raised to 60 s, only the events can explain a crash restarted and an
//! init chain finished within seconds. The second test breaks the stream by restarting
//! containerd; it does so on a private containerd of its own (`common::OwnTestbed`, its own
//! bridge and subnet), so the other tests, which share the suite's testbed and may run at the
//! same time, never see containerd go away.

mod common;

use std::time::{Duration, Instant};

use common::{Agent, BUSYBOX, OwnTestbed, http_get, wait_until};
use deckhand::clients::cri::{CriClient, RuntimeService, parse_endpoint};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);

/// The line `/healthz?verbose` gives for the PLEG.
async fn pleg_line(agent: &Agent) -> Option<String> {
    let url = format!("http://127.0.0.1:{}/healthz?verbose", agent.healthz_port);
    let (_, body) = http_get(&url).await?;
    body.lines()
        .find(|l| l.contains("]pleg "))
        .map(str::to_string)
}

/// The `/healthz` words for the source the PLEG should follow on the runtime at `endpoint`.
async fn expected_source(endpoint: &str) -> String {
    let endpoint = parse_endpoint(endpoint).expect("a unix endpoint");
    let client = CriClient::connect(&endpoint, Duration::from_secs(30))
        .await
        .unwrap_or_else(|e| panic!("the runtime at {endpoint:?} does not answer: {e}"));
    let version = client.version().await.expect("CRI Version");
    let source = if version.runtime_name == "containerd" {
        "containerd"
    } else {
        "cri"
    };
    format!("events from {source} ")
}

/// One counter or gauge from `/metrics` (the first sample whose name and labels start so).
async fn metric(agent: &Agent, prefix: &str) -> Option<f64> {
    let url = format!("http://127.0.0.1:{}/metrics", agent.read_only_port);
    let (code, body) = http_get(&url).await?;
    if code != 200 {
        return None;
    }
    body.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Seconds since the epoch of an RFC 3339 time in a status.
fn secs(v: &Value) -> Option<i64> {
    let text = v.as_str()?;
    let t = text.parse::<jiff::Timestamp>().ok()?;
    Some(t.as_second())
}

#[tokio::test]
async fn with_a_60s_relist_a_crash_is_restarted_and_an_init_chain_proceeds_on_events() {
    let mut agent = Agent::new("e2e-pleg-ev");
    agent
        .env
        .push(("DECKHAND_RELIST_PERIOD".into(), "60s".into()));
    agent.start();
    agent.wait_healthy(WAIT).await;
    let line = wait_until("the PLEG to follow events", WAIT, || async {
        pleg_line(&agent)
            .await
            .filter(|l| l.contains("events from"))
    })
    .await;
    let want = expected_source(&common::runtime_endpoint()).await;
    assert!(line.contains(&want), "want {want:?}: {line}");
    let source = want.trim_end().rsplit(' ').next().unwrap_or_default();
    assert_eq!(
        metric(
            &agent,
            &format!("deckhand_pleg_mode{{mode=\"events\",source=\"{source}\"}}")
        )
        .await,
        Some(1.0),
        "the metric names the source"
    );

    let written = Instant::now();
    agent.write_manifest(
        "chain.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: chain}}
spec:
  terminationGracePeriodSeconds: 1
  initContainers:
  - {{name: i1, image: {BUSYBOX}, command: ["sh", "-c", "sleep 0.5"]}}
  - {{name: i2, image: {BUSYBOX}, command: ["sh", "-c", "sleep 0.5"]}}
  - {{name: i3, image: {BUSYBOX}, command: ["sh", "-c", "sleep 0.5"]}}
  containers:
  - {{name: crash, image: {BUSYBOX}, command: ["sh", "-c", "sleep 1; exit 3"]}}
"#
        ),
    );
    // The chain and the first restart: a relist every 60 s (and the pod's own resync every
    // minute) would take well over 60 s for the four exits; events take seconds.
    let pod = wait_until("the crashed container restarted", WAIT, || async {
        let pod = agent.pod("chain").await?;
        let cs = &pod["status"]["containerStatuses"][0];
        (cs["restartCount"].as_i64()? >= 1).then_some(pod)
    })
    .await;
    let took = written.elapsed();
    assert!(
        took < Duration::from_secs(20),
        "the chain and a restart took {took:?}: {pod}"
    );
    // In order: each init container ended before the next began, the app after the last.
    let inits = pod["status"]["initContainerStatuses"].as_array().unwrap();
    assert_eq!(inits.len(), 3, "{pod}");
    let mut previous_end = 0;
    for init in inits {
        let t = &init["state"]["terminated"];
        assert_eq!(t["exitCode"], 0, "{init}");
        let (start, end) = (
            secs(&t["startedAt"]).unwrap(),
            secs(&t["finishedAt"]).unwrap(),
        );
        assert!(start >= previous_end, "{pod}");
        previous_end = end;
    }
    let crash = &pod["status"]["containerStatuses"][0];
    let last = &crash["lastState"]["terminated"];
    assert_eq!(last["exitCode"], 3, "{crash}");
    assert!(secs(&last["startedAt"]).unwrap() >= previous_end, "{pod}");
    // The restart came right after the exit, not at a relist.
    let restarted = secs(&crash["state"]["running"]["startedAt"])
        .or_else(|| secs(&crash["state"]["terminated"]["startedAt"]));
    if let Some(restarted) = restarted {
        let gap = restarted - secs(&last["finishedAt"]).unwrap();
        assert!(gap <= 3, "restarted {gap}s after the exit: {crash}");
    }
    let pokes = metric(&agent, "deckhand_pleg_event_pokes_total")
        .await
        .unwrap_or(0.0);
    assert!(pokes >= 4.0, "events woke the worker {pokes} times");
    assert_eq!(
        metric(&agent, "deckhand_pleg_mode{mode=\"events\"").await,
        Some(1.0)
    );
}

#[tokio::test]
async fn when_containerd_restarts_the_relist_takes_over_and_events_resume() {
    let _ = common::runtime_endpoint();
    let tb = OwnTestbed::new("deckhand-tbp-", "dhpev", "10.88.63.0/24");
    tb.up();
    let endpoint = tb.endpoint();
    let mut agent = Agent::new("e2e-pleg-rs");
    agent.runtime = Some(endpoint.clone());
    agent.start();
    agent.wait_healthy(WAIT).await;
    let want = expected_source(&endpoint).await;
    wait_until("the PLEG to follow events", WAIT, || async {
        pleg_line(&agent).await.filter(|l| l.contains(&want))
    })
    .await;

    // Break the stream: stop containerd (the shims live on).
    let pid = nix::unistd::Pid::from_raw(tb.containerd_pid());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let line = wait_until("the relist to take over", WAIT, || async {
        pleg_line(&agent)
            .await
            .filter(|l| l.contains("relisting every"))
    })
    .await;
    assert!(line.contains("relisting every 1000ms"), "{line}");
    assert_eq!(
        metric(&agent, "deckhand_pleg_mode{mode=\"relist\"").await,
        Some(1.0)
    );

    tb.up();
    wait_until("events to resume", WAIT, || async {
        pleg_line(&agent).await.filter(|l| l.contains(&want))
    })
    .await;
    assert!(
        metric(&agent, "deckhand_pleg_subscriptions_total")
            .await
            .unwrap_or(0.0)
            >= 2.0
    );
    // And they are followed: a container's exit wakes its worker through the new stream.
    let before = metric(&agent, "deckhand_pleg_event_pokes_total")
        .await
        .unwrap_or(0.0);
    agent.write_manifest(
        "brief.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: brief}}
spec:
  restartPolicy: Never
  containers:
  - {{name: main, image: {BUSYBOX}, command: ["sh", "-c", "sleep 1"]}}
"#
        ),
    );
    wait_until("the exit heard as an event", WAIT, || async {
        let now = metric(&agent, "deckhand_pleg_event_pokes_total").await?;
        (now > before).then_some(())
    })
    .await;
    wait_until("the pod to succeed", WAIT, || async {
        let pod = agent.pod("brief").await?;
        (pod["status"]["phase"] == "Succeeded").then_some(())
    })
    .await;

    // The agent's Drop removes pods through the suite's testbed; remove ours here.
    let client = CriClient::connect(&parse_endpoint(&endpoint).unwrap(), Duration::from_secs(30))
        .await
        .unwrap();
    agent.kill();
    common::remove_node_pods(&client, &agent.node).await;
}

/// Two agents on one containerd never wake each other (issue 28): one agent's crash loop
/// makes exits and new container IDs that reach the other agent's event stream too; that
/// agent settles each unknown ID with at most one relist (after which the ID is foreign) and
/// wakes none of its pod workers for it, and its own pod is left as it was.
#[tokio::test]
async fn two_agents_on_one_containerd_never_wake_each_other() {
    const POKES: &str = "deckhand_pleg_event_pokes_total";
    const RELISTS: &str = "kubelet_pleg_relist_duration_seconds_count";
    let mut quiet = Agent::new("e2e-pleg-quiet");
    quiet
        .env
        .push(("DECKHAND_RELIST_PERIOD".into(), "60s".into()));
    quiet.start();
    let mut busy = Agent::new("e2e-pleg-busy");
    busy.backoff("500ms", "1s");
    busy.start();
    quiet.wait_healthy(WAIT).await;
    busy.wait_healthy(WAIT).await;
    quiet.write_manifest("steady.yaml", &common::sleeping_pod("steady"));
    let steady = wait_until("the quiet agent's pod to run", WAIT, || async {
        let pod = quiet.pod("steady").await?;
        let status = &pod["status"]["containerStatuses"][0];
        let id = status["containerID"].as_str()?;
        status["state"]["running"]
            .is_object()
            .then(|| id.to_string())
    })
    .await;
    // Only exits and removals wake a worker, and the quiet pod has none.
    let pokes_before = metric(&quiet, POKES)
        .await
        .expect("the quiet agent's pokes");
    let relists_before = metric(&quiet, RELISTS)
        .await
        .expect("the quiet agent's relists");

    busy.write_manifest("crash.yaml", &common::crashing_pod("sleep 0.2; exit 3"));
    let restart_count =
        |pod: serde_json::Value| pod["status"]["containerStatuses"][0]["restartCount"].as_i64();
    wait_until("the busy agent's pod to restart 3 times", WAIT, || async {
        let n = restart_count(busy.pod("crash").await?)?;
        (n >= 3).then_some(())
    })
    .await;
    let pokes_after = metric(&quiet, POKES)
        .await
        .expect("the quiet agent's pokes");
    let relists_after = metric(&quiet, RELISTS)
        .await
        .expect("the quiet agent's relists");
    // Read after the quiet agent's figures, so every ID it may have seen is counted.
    let restarts =
        restart_count(busy.pod("crash").await.expect("the busy pod")).expect("its restart count");
    let busy_pokes = metric(&busy, POKES).await.unwrap_or(0.0);
    assert!(
        busy_pokes >= 3.0,
        "the busy agent's own exits wake it: {busy_pokes}"
    );
    assert_eq!(
        pokes_after, pokes_before,
        "the quiet agent was woken by another agent's pod ({restarts} restarts)"
    );
    // The foreign IDs that exited: one container per run, and the sandbox; two more for a
    // periodic relist and one ID being settled as the window closes.
    let foreign_ids = restarts as f64 + 2.0;
    let relists = relists_after - relists_before;
    assert!(
        relists <= foreign_ids + 2.0,
        "{relists} relists for {foreign_ids} foreign IDs"
    );
    let pod = quiet.pod("steady").await.expect("the quiet agent's pod");
    let status = &pod["status"]["containerStatuses"][0];
    assert_eq!(
        status["containerID"].as_str(),
        Some(steady.as_str()),
        "{pod}"
    );
    assert_eq!(status["restartCount"], 0, "{pod}");
}
