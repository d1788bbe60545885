//! End to end, against the private containerd: init containers and sidecars, crash-loop
//! back-off, lifecycle hooks, graceful termination, termination messages, and surviving
//! restarts of the agent, of containerd, and of the node.

mod common;

use std::time::{Duration, Instant};

use common::{Agent, containers_of, cri, sandboxes_of, wait_until};
use deckhand::clients::cri::RuntimeService;
use serde_json::Value;

const BUSYBOX: &str = "localhost/deckhand/busybox:1.35";
const WAIT: Duration = Duration::from_secs(60);

fn phase(pod: &Value) -> &str {
    pod["status"]["phase"].as_str().unwrap_or_default()
}

/// Start and finish times (ns) of every instance of the pod's containers, by container name.
async fn instance_times(full: &str) -> Vec<(String, u32, i64, i64, i32)> {
    let client = cri().await;
    let mut out = Vec::new();
    for c in containers_of(&client, full).await {
        let Ok(resp) = client.container_status(c.id.clone()).await else {
            continue;
        };
        let s = resp.status.unwrap_or_default();
        let name = c
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default();
        let attempt = c.metadata.as_ref().map(|m| m.attempt).unwrap_or(0);
        out.push((name, attempt, s.started_at, s.finished_at, s.exit_code));
    }
    out
}

#[tokio::test]
async fn init_containers_run_in_order_before_the_app_and_a_failure_under_never_fails_the_pod() {
    let mut agent = Agent::new("e2e-lc-init");
    agent.start();
    agent.wait_healthy(WAIT).await;
    agent.write_manifest(
        "init.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: init}}
spec:
  terminationGracePeriodSeconds: 2
  initContainers:
  - {{name: one, image: {BUSYBOX}, command: ["sh", "-c", "echo one"]}}
  - {{name: two, image: {BUSYBOX}, command: ["sh", "-c", "echo two"]}}
  - {{name: three, image: {BUSYBOX}, command: ["sh", "-c", "echo three"]}}
  containers:
  - {{name: app, image: {BUSYBOX}, command: ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]}}
"#
        ),
    );
    agent.write_manifest(
        "badinit.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: badinit}}
spec:
  restartPolicy: Never
  initContainers:
  - {{name: fails, image: {BUSYBOX}, command: ["sh", "-c", "exit 7"]}}
  containers:
  - {{name: app, image: {BUSYBOX}, command: ["sh", "-c", "sleep 3600"]}}
"#
        ),
    );
    let pod = wait_until(
        "the app to run after three init containers",
        WAIT,
        || async {
            let pod = agent.pod("init").await?;
            (phase(&pod) == "Running"
                && pod["status"]["containerStatuses"][0]["state"]["running"].is_object())
            .then_some(pod)
        },
    )
    .await;
    let inits = pod["status"]["initContainerStatuses"].as_array().unwrap();
    assert_eq!(inits.len(), 3);
    for s in inits {
        assert_eq!(s["state"]["terminated"]["exitCode"], 0, "{s}");
        assert_eq!(s["state"]["terminated"]["reason"], "Completed");
    }
    let conditions = pod["status"]["conditions"].as_array().unwrap();
    let initialized = conditions
        .iter()
        .find(|c| c["type"] == "Initialized")
        .unwrap();
    assert_eq!(initialized["status"], "True");

    // Order, from the runtime's own clock: each starts after the previous one finished.
    let times = instance_times(&agent.pod_name("init")).await;
    let get = |n: &str| {
        times
            .iter()
            .find(|t| t.0 == n)
            .cloned()
            .unwrap_or_else(|| panic!("{n} in {times:?}"))
    };
    let (one, two, three, app) = (get("one"), get("two"), get("three"), get("app"));
    assert!(one.3 <= two.2, "one finished before two started: {times:?}");
    assert!(
        two.3 <= three.2,
        "two finished before three started: {times:?}"
    );
    assert!(
        three.3 <= app.2,
        "three finished before the app started: {times:?}"
    );

    let bad = wait_until(
        "the pod with a failing init container to fail",
        WAIT,
        || async {
            let pod = agent.pod("badinit").await?;
            (phase(&pod) == "Failed").then_some(pod)
        },
    )
    .await;
    assert_eq!(
        bad["status"]["initContainerStatuses"][0]["state"]["terminated"]["exitCode"],
        7
    );
    let names: Vec<String> = instance_times(&agent.pod_name("badinit"))
        .await
        .into_iter()
        .map(|t| t.0)
        .collect();
    assert!(
        !names.contains(&"app".to_string()),
        "the app never started: {names:?}"
    );
}

#[tokio::test]
async fn a_sidecar_runs_beside_the_app_does_not_block_completion_and_stops_after_the_app() {
    let mut agent = Agent::new("e2e-lc-sidecar");
    agent.start();
    agent.wait_healthy(WAIT).await;
    let shared = agent.dir.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    // Completion: the app exits 0 while the sidecar keeps running; the pod succeeds.
    agent.write_manifest(
        "done.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: done}}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 2
  initContainers:
  - name: side
    image: {BUSYBOX}
    restartPolicy: Always
    command: ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
  containers:
  - {{name: app, image: {BUSYBOX}, command: ["sh", "-c", "sleep 2; echo finished"]}}
"#
        ),
    );
    wait_until("the sidecar to run beside the app", WAIT, || async {
        let pod = agent.pod("done").await?;
        let side = pod["status"]["initContainerStatuses"][0]["state"]["running"].is_object();
        let app = pod["status"]["containerStatuses"][0]["state"]["running"].is_object();
        (side && app).then_some(())
    })
    .await;
    let done = wait_until(
        "the pod to succeed although its sidecar never exits on its own",
        WAIT,
        || async {
            let pod = agent.pod("done").await?;
            (phase(&pod) == "Succeeded").then_some(pod)
        },
    )
    .await;
    assert_eq!(
        done["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
        0
    );

    // Stop order: both write the time they got SIGTERM into a host directory.
    agent.write_manifest(
        "order.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: order}}
spec:
  terminationGracePeriodSeconds: 10
  volumes:
  - name: shared
    hostPath: {{path: {shared}, type: Directory}}
  initContainers:
  - name: side
    image: {BUSYBOX}
    restartPolicy: Always
    command: ["sh", "-c", "trap 'echo side >> /shared/order; exit 0' TERM; sleep 3600 & wait"]
    volumeMounts: [{{name: shared, mountPath: /shared}}]
  containers:
  - name: app
    image: {BUSYBOX}
    command: ["sh", "-c", "trap 'sleep 1; echo app >> /shared/order; exit 0' TERM; sleep 3600 & wait"]
    volumeMounts: [{{name: shared, mountPath: /shared}}]
"#,
            shared = shared.display()
        ),
    );
    wait_until("the ordering pod to run", WAIT, || async {
        let pod = agent.pod("order").await?;
        pod["status"]["containerStatuses"][0]["state"]["running"]
            .is_object()
            .then_some(())
    })
    .await;
    agent.remove_manifest("order.yaml");
    let client = cri().await;
    let full = agent.pod_name("order");
    wait_until("the ordering pod to be removed", WAIT, || async {
        sandboxes_of(&client, &full).await.is_empty().then_some(())
    })
    .await;
    let order = std::fs::read_to_string(shared.join("order")).unwrap_or_default();
    assert_eq!(order, "app\nside\n", "the app stops before its sidecar");
}

#[tokio::test]
async fn a_crash_loop_backs_off_with_growing_delays() {
    let mut agent = Agent::new("e2e-lc-crash");
    agent.backoff("1s", "4s");
    agent.start();
    agent.wait_healthy(WAIT).await;
    agent.write_manifest(
        "crash.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: crash}}
spec:
  containers:
  - {{name: crash, image: {BUSYBOX}, command: ["sh", "-c", "exit 1"]}}
"#
        ),
    );
    let full = agent.pod_name("crash");
    // Record every instance's start and finish as it appears (old ones are garbage-collected).
    let mut seen: std::collections::BTreeMap<u32, (i64, i64)> = Default::default();
    let mut backoff_status: Option<Value> = None;
    let deadline = Instant::now() + WAIT;
    while seen.len() < 5 {
        assert!(Instant::now() < deadline, "only saw {seen:?}");
        for (name, attempt, started, finished, _) in instance_times(&full).await {
            if name == "crash" && started > 0 && finished > 0 {
                seen.insert(attempt, (started, finished));
            }
        }
        if backoff_status.is_none()
            && let Some(pod) = agent.pod("crash").await
        {
            let st = &pod["status"]["containerStatuses"][0];
            if st["state"]["waiting"]["reason"] == "CrashLoopBackOff" {
                backoff_status = Some(st.clone());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Delay before restart k+1, from the exit of instance k.
    let gaps: Vec<f64> = (0..4)
        .map(|k| (seen[&(k + 1)].0 - seen[&k].1) as f64 / 1e9)
        .collect();
    let floors = [0.0, 1.0, 2.0, 4.0];
    for (k, (gap, floor)) in gaps.iter().zip(floors).enumerate() {
        assert!(
            *gap >= floor - 0.2,
            "restart {k} came after {gap:.2}s, expected at least {floor}s: {gaps:?}"
        );
        assert!(
            *gap <= floor + 3.0,
            "restart {k} came after {gap:.2}s, expected about {floor}s: {gaps:?}"
        );
    }
    let st = backoff_status.expect("a CrashLoopBackOff status was shown");
    let message = st["state"]["waiting"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        message.contains("back-off") && message.contains("restarting failed container=crash"),
        "{message}"
    );
    assert_eq!(st["lastState"]["terminated"]["exitCode"], 1);
}

#[tokio::test]
async fn prestop_delays_the_stop_and_a_sigterm_ignorer_is_killed_at_the_grace_period() {
    let mut agent = Agent::new("e2e-lc-stop");
    agent.start();
    agent.wait_healthy(WAIT).await;
    let shared = agent.dir.path().join("prestop-out");
    std::fs::create_dir_all(&shared).unwrap();
    agent.write_manifest(
        "prestop.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: prestop}}
spec:
  terminationGracePeriodSeconds: 20
  volumes:
  - name: out
    hostPath: {{path: {shared}, type: Directory}}
  containers:
  - name: main
    image: {BUSYBOX}
    command: ["sh", "-c", "trap 'echo term >> /out/log; exit 0' TERM; sleep 3600 & wait"]
    volumeMounts: [{{name: out, mountPath: /out}}]
    lifecycle:
      preStop:
        exec: {{command: ["sh", "-c", "echo prestop >> /out/log; sleep 2"]}}
"#,
            shared = shared.display()
        ),
    );
    agent.write_manifest(
        "stubborn.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: stubborn}}
spec:
  terminationGracePeriodSeconds: 3
  containers:
  - {{name: main, image: {BUSYBOX}, command: ["sh", "-c", "trap '' TERM; while true; do sleep 1; done"]}}
"#
        ),
    );
    for name in ["prestop", "stubborn"] {
        wait_until(&format!("{name} to run"), WAIT, || async {
            let pod = agent.pod(name).await?;
            pod["status"]["containerStatuses"][0]["state"]["running"]
                .is_object()
                .then_some(())
        })
        .await;
    }
    let client = cri().await;
    let stop_time = |name: &'static str| {
        let full = agent.pod_name(name);
        let client = client.clone();
        async move {
            let start = Instant::now();
            wait_until(&format!("{name} to be removed"), WAIT, || async {
                sandboxes_of(&client, &full).await.is_empty().then_some(())
            })
            .await;
            start.elapsed()
        }
    };
    agent.remove_manifest("prestop.yaml");
    agent.remove_manifest("stubborn.yaml");
    let (prestop, stubborn) = tokio::join!(stop_time("prestop"), stop_time("stubborn"));
    assert!(
        prestop >= Duration::from_secs(2),
        "the preStop hook (sleep 2) ran first: {prestop:?}"
    );
    assert!(
        prestop < Duration::from_secs(15),
        "then the container stopped on SIGTERM: {prestop:?}"
    );
    assert!(agent.log().contains("running the preStop hook"));
    let written = std::fs::read_to_string(shared.join("log")).unwrap_or_default();
    assert_eq!(
        written, "prestop\nterm\n",
        "preStop wrote into the hostPath before SIGTERM"
    );
    assert!(
        stubborn >= Duration::from_millis(2800),
        "killed only at the 3s grace period: {stubborn:?}"
    );
    assert!(
        stubborn < Duration::from_secs(10),
        "killed at the grace period: {stubborn:?}"
    );
}

#[tokio::test]
async fn a_failing_poststart_hook_restarts_the_container() {
    let mut agent = Agent::new("e2e-lc-poststart");
    agent.backoff("200ms", "1s");
    agent.start();
    agent.wait_healthy(WAIT).await;
    agent.write_manifest(
        "hook.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: hook}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - name: main
    image: {BUSYBOX}
    command: ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]
    lifecycle:
      postStart:
        exec: {{command: ["sh", "-c", "echo no; exit 1"]}}
"#
        ),
    );
    wait_until(
        "the container to be restarted after its postStart hook failed",
        WAIT,
        || async {
            let pod = agent.pod("hook").await?;
            (pod["status"]["containerStatuses"][0]["restartCount"].as_i64()? >= 1).then_some(())
        },
    )
    .await;
    assert!(agent.log().contains("FailedPostStartHook"));
}

#[tokio::test]
async fn termination_messages_come_from_the_file_or_the_log() {
    let mut agent = Agent::new("e2e-lc-msg");
    agent.start();
    agent.wait_healthy(WAIT).await;
    agent.write_manifest(
        "msg.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: msg}}
spec:
  restartPolicy: Never
  containers:
  - {{name: file, image: {BUSYBOX}, command: ["sh", "-c", "echo -n bye from file > /dev/termination-log; exit 1"]}}
  - name: logs
    image: {BUSYBOX}
    terminationMessagePolicy: FallbackToLogsOnError
    command: ["sh", "-c", "echo something broke; exit 2"]
"#
        ),
    );
    let pod = wait_until("the pod to fail", WAIT, || async {
        let pod = agent.pod("msg").await?;
        (phase(&pod) == "Failed").then_some(pod)
    })
    .await;
    let by_name = |n: &str| {
        pod["status"]["containerStatuses"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == n)
            .cloned()
            .unwrap()
    };
    assert_eq!(
        by_name("file")["state"]["terminated"]["message"],
        "bye from file"
    );
    let logs = by_name("logs")["state"]["terminated"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(logs.contains("something broke"), "{logs}");
}

/// The pods in `/pods` when exactly `n` of them have a running container.
async fn all_running(agent: &Agent, n: usize) -> Option<Vec<Value>> {
    let list = agent.pods().await?;
    let items = list["items"].as_array()?.clone();
    let running = items
        .iter()
        .filter(|p| p["status"]["containerStatuses"][0]["state"]["running"].is_object())
        .count();
    (running == n).then_some(items)
}

/// Sandbox and container IDs of pods `p0..pN`, as the runtime lists them.
async fn runtime_ids(
    agent: &Agent,
    client: &deckhand::clients::cri::CriClient,
    n: usize,
) -> Vec<(Vec<String>, Vec<String>)> {
    let mut ids = Vec::new();
    for i in 0..n {
        let full = agent.pod_name(&format!("p{i}"));
        let mut sbs: Vec<String> = sandboxes_of(client, &full)
            .await
            .into_iter()
            .map(|s| s.id)
            .collect();
        let mut cs: Vec<String> = containers_of(client, &full)
            .await
            .into_iter()
            .map(|c| c.id)
            .collect();
        sbs.sort();
        cs.sort();
        ids.push((sbs, cs));
    }
    ids
}

#[tokio::test]
async fn sigkill_and_restart_adopts_ten_pods_with_no_restarts_and_no_new_sandboxes() {
    let mut agent = Agent::new("e2e-lc-adopt");
    agent.start();
    agent.wait_healthy(WAIT).await;
    for i in 0..10 {
        agent.write_manifest(
            &format!("p{i}.yaml"),
            &format!(
                r#"apiVersion: v1
kind: Pod
metadata: {{name: p{i}}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - {{name: main, image: {BUSYBOX}, command: ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]}}
"#
            ),
        );
    }
    wait_until("ten pods running", WAIT, || all_running(&agent, 10)).await;
    let client = cri().await;
    let before = runtime_ids(&agent, &client, 10).await;

    agent.kill();
    let restarted = Instant::now();
    agent.start();
    agent.wait_healthy(WAIT).await;
    let healthy_after = restarted.elapsed();
    let items = wait_until("all ten pods adopted and Running", WAIT, || {
        all_running(&agent, 10)
    })
    .await;
    let adopted_after = restarted.elapsed();
    for p in &items {
        assert_eq!(
            p["status"]["containerStatuses"][0]["restartCount"], 0,
            "{}",
            p["metadata"]["name"]
        );
    }
    // Watch a few relists: nothing may be restarted or recreated.
    let watch_until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < watch_until {
        assert_eq!(
            runtime_ids(&agent, &client, 10).await,
            before,
            "containers or sandboxes changed after the restart"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("healthy {healthy_after:?} after the restart, all adopted {adopted_after:?}");
}

#[tokio::test]
async fn pods_lost_by_the_node_are_recreated_from_their_manifests() {
    let mut agent = Agent::new("e2e-lc-reboot");
    agent.start();
    agent.wait_healthy(WAIT).await;
    agent.write_manifest(
        "lost.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: lost}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - {{name: main, image: {BUSYBOX}, command: ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]}}
"#
        ),
    );
    let full = agent.pod_name("lost");
    let client = cri().await;
    let first = wait_until("the pod to run", WAIT, || async {
        let sbs = sandboxes_of(&client, &full).await;
        let cs = containers_of(&client, &full).await;
        (sbs.len() == 1 && cs.iter().any(|c| c.state == 1)).then(|| sbs[0].id.clone())
    })
    .await;
    // What a reboot leaves: no sandbox, no container.
    common::remove_node_pods(&client, &agent.node).await;
    wait_until("the pod to be recreated in a new sandbox", WAIT, || async {
        let sbs = sandboxes_of(&client, &full).await;
        let cs = containers_of(&client, &full).await;
        (sbs.len() == 1 && sbs[0].id != first && cs.iter().any(|c| c.state == 1)).then_some(())
    })
    .await;
}

#[tokio::test]
async fn containerd_restarts_under_deckhand_and_pods_keep_running() {
    let _ = common::runtime_endpoint();
    let tb = common::OwnTestbed::new("deckhand-tbr-", "dhr0", "10.88.49.0/24");
    tb.up();
    let endpoint = format!("unix://{}/containerd.sock", tb.tb());
    let mut agent = Agent::new("e2e-lc-ctrd");
    agent.runtime = Some(endpoint.clone());
    agent.start();
    agent.wait_healthy(WAIT).await;
    agent.write_manifest(
        "steady.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: steady}}
spec:
  terminationGracePeriodSeconds: 2
  containers:
  - {{name: main, image: {BUSYBOX}, command: ["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]}}
"#
        ),
    );
    let before = wait_until("the pod to run", WAIT, || async {
        let pod = agent.pod("steady").await?;
        let cs = &pod["status"]["containerStatuses"][0];
        cs["state"]["running"]
            .is_object()
            .then(|| cs["containerID"].clone())
    })
    .await;

    // Stop containerd; the shims (and so the pod) live on.
    let pid = nix::unistd::Pid::from_raw(tb.containerd_pid());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    // `/healthz` stays ok, as upstream's does (a watchdog on it must not restart the agent for
    // containerd's outage); its verbose report names the outage.
    let url = format!("http://127.0.0.1:{}/healthz?verbose", agent.healthz_port);
    let (code, body) = wait_until("healthz to name the runtime outage", WAIT, || async {
        let (code, body) = common::http_get(&url).await?;
        body.contains("[+]runtime ok: the container runtime is not answering")
            .then_some((code, body))
    })
    .await;
    assert_eq!(code, 200, "{body}");

    tb.up();
    wait_until(
        "healthz to drop the outage once containerd is back",
        WAIT,
        || async {
            let (code, body) = common::http_get(&url).await?;
            (code == 200 && body.contains("[+]runtime ok\n")).then_some(())
        },
    )
    .await;
    let after = wait_until("the pod to be seen running again", WAIT, || async {
        let pod = agent.pod("steady").await?;
        let cs = &pod["status"]["containerStatuses"][0];
        cs["state"]["running"]
            .is_object()
            .then(|| (cs["containerID"].clone(), cs["restartCount"].clone()))
    })
    .await;
    assert_eq!(after.0, before, "the same container keeps running");
    assert_eq!(after.1, 0);
    // The agent's Drop removes pods through the main testbed's socket; remove ours here.
    let client = deckhand::clients::cri::CriClient::connect(
        &deckhand::clients::cri::parse_endpoint(&endpoint).unwrap(),
        Duration::from_secs(30),
    )
    .await
    .unwrap();
    agent.kill();
    common::remove_node_pods(&client, &agent.node).await;
}

#[tokio::test]
async fn a_container_over_its_memory_limit_is_oom_killed() {
    let mut agent = Agent::new("e2e-lc-oom");
    agent.start();
    agent.wait_healthy(WAIT).await;
    agent.write_manifest(
        "oom.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: oom}}
spec:
  restartPolicy: Never
  containers:
  - name: hog
    image: {BUSYBOX}
    command: ["sh", "-c", "dd if=/dev/zero of=/dev/null bs=64M count=1"]
    resources:
      limits: {{memory: 16Mi}}
"#
        ),
    );
    let pod = wait_until("the memory hog to be OOM-killed", WAIT, || async {
        let pod = agent.pod("oom").await?;
        (phase(&pod) == "Failed").then_some(pod)
    })
    .await;
    let t = &pod["status"]["containerStatuses"][0]["state"]["terminated"];
    assert_eq!(t["exitCode"], 137, "{t}");
    // containerd 1.6 may record the exit before it handles the OOM event: the agent names the
    // reason from the stream's OOM event when it comes, so the status may show `Error` for a
    // moment first.
    wait_until("the hog's reason to be OOMKilled", WAIT, || async {
        let pod = agent.pod("oom").await?;
        let t = &pod["status"]["containerStatuses"][0]["state"]["terminated"];
        (t["reason"] == "OOMKilled").then_some(())
    })
    .await;
}

#[tokio::test]
async fn an_image_that_cannot_be_pulled_backs_off() {
    let mut agent = Agent::new("e2e-lc-pull");
    agent
        .env
        .push(("DECKHAND_BACKOFF_INITIAL".into(), "2s".into()));
    agent.start();
    agent.wait_healthy(WAIT).await;
    agent.write_manifest(
        "nopull.yaml",
        r#"apiVersion: v1
kind: Pod
metadata: {name: nopull}
spec:
  containers:
  - {name: main, image: "localhost/deckhand/no-such-image:1"}
"#,
    );
    // The reason alternates between the two while the pull keeps failing; both must show.
    let reasons = std::sync::Mutex::new(std::collections::BTreeSet::new());
    wait_until("ErrImagePull, then ImagePullBackOff", WAIT, || async {
        let pod = agent.pod("nopull").await?;
        let waiting = &pod["status"]["containerStatuses"][0]["state"]["waiting"];
        let mut seen = reasons.lock().unwrap();
        if let Some(r) = waiting["reason"].as_str() {
            seen.insert(r.to_string());
        }
        (seen.contains("ErrImagePull") && seen.contains("ImagePullBackOff")).then_some(())
    })
    .await;
    let pod = agent.pod("nopull").await.unwrap();
    assert_eq!(phase(&pod), "Pending");
}

/// Container restart rules (ContainerRestartRules, on by default in upstream v1.37): a
/// container's own `restartPolicy` and `restartPolicyRules` override the pod's. Under the pod's
/// restartPolicy Never, `always` (its own Always) and `rule` (its own Never with a Restart rule
/// on exit 42) both run again, `done` (no policy of its own) does not, and the pod stays
/// Running while two of its containers keep restarting.
#[tokio::test]
async fn a_container_s_own_restart_policy_and_rules_override_the_pod_s() {
    let mut agent = Agent::new("e2e-lc-rules");
    agent.backoff("200ms", "1s");
    agent.start();
    agent.wait_healthy(WAIT).await;
    agent.write_manifest(
        "rules.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: rules}}
spec:
  restartPolicy: Never
  containers:
  - {{name: always, image: {BUSYBOX}, command: ["sh", "-c", "exit 1"], restartPolicy: Always}}
  - name: rule
    image: {BUSYBOX}
    command: ["sh", "-c", "exit 42"]
    restartPolicy: Never
    restartPolicyRules:
    - {{action: Restart, exitCodes: {{operator: In, values: [42]}}}}
  - {{name: done, image: {BUSYBOX}, command: ["sh", "-c", "exit 3"]}}
"#
        ),
    );
    let restarts = |pod: &Value, name: &str| {
        pod["status"]["containerStatuses"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["name"] == name))
            .and_then(|c| c["restartCount"].as_i64())
    };
    let pod = wait_until(
        "`always` and `rule` to restart twice each under the pod's restartPolicy Never",
        WAIT,
        || async {
            let pod = agent.pod("rules").await?;
            (restarts(&pod, "always")? >= 2 && restarts(&pod, "rule")? >= 2).then_some(pod)
        },
    )
    .await;
    assert_eq!(restarts(&pod, "done"), Some(0), "{pod}");
    assert_eq!(phase(&pod), "Running", "{pod}");
}

/// `RestartAllContainers`: an exit its rule matches runs every container again, init
/// containers first, in the same sandbox; each counts a restart and shows the earlier round's
/// exit as its last state; the pod does not fail although its policy is Never.
#[tokio::test]
async fn an_exit_matching_a_restart_all_rule_runs_every_container_again_in_the_same_sandbox() {
    let mut agent = Agent::new("e2e-lc-restart-all");
    agent.backoff("200ms", "1s");
    agent.start();
    agent.wait_healthy(WAIT).await;
    agent.write_manifest(
        "all.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: all}}
spec:
  restartPolicy: Never
  volumes: [{{name: work, emptyDir: {{}}}}]
  initContainers:
  - {{name: init, image: {BUSYBOX}, command: ["sh", "-c", "exit 0"]}}
  - {{name: sidecar, image: {BUSYBOX}, command: ["sleep", "10000"], restartPolicy: Always}}
  containers:
  - name: source
    image: {BUSYBOX}
    command: ["sh", "-c", "if [ -f /w/done ]; then sleep 10000; else touch /w/done; exit 42; fi"]
    volumeMounts: [{{name: work, mountPath: /w}}]
    restartPolicy: Never
    restartPolicyRules:
    - {{action: RestartAllContainers, exitCodes: {{operator: In, values: [42]}}}}
  - {{name: regular, image: {BUSYBOX}, command: ["sleep", "10000"]}}
"#
        ),
    );
    let statuses = |pod: &Value| -> Vec<Value> {
        ["initContainerStatuses", "containerStatuses"]
            .iter()
            .flat_map(|k| pod["status"][k].as_array().cloned().unwrap_or_default())
            .collect()
    };
    let pod = wait_until(
        "all four containers to restart once, with the source and regular running again",
        WAIT,
        || async {
            let pod = agent.pod("all").await?;
            let all = statuses(&pod);
            let restarted = all.len() == 4
                && all.iter().all(|c| {
                    c["restartCount"].as_i64() == Some(1)
                        && c["lastState"]["terminated"].is_object()
                });
            let running = all
                .iter()
                .filter(|c| c["name"] == "source" || c["name"] == "regular")
                .all(|c| c["state"]["running"].is_object());
            (restarted && running).then_some(pod)
        },
    )
    .await;
    assert_eq!(phase(&pod), "Running", "{pod}");
    let conditions = pod["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let restarting = conditions
        .iter()
        .find(|c| c["type"] == "AllContainersRestarting")
        .unwrap_or_else(|| panic!("no AllContainersRestarting condition: {pod}"));
    assert_eq!(restarting["status"], "False", "the round is over: {pod}");
    let source = statuses(&pod)
        .into_iter()
        .find(|c| c["name"] == "source")
        .unwrap();
    assert_eq!(source["lastState"]["terminated"]["exitCode"], 42, "{pod}");
    let full = agent.pod_name("all");
    let client = cri().await;
    assert_eq!(
        sandboxes_of(&client, &full).await.len(),
        1,
        "the round runs in the sandbox it started in"
    );
    let init_runs = instance_times(&full)
        .await
        .into_iter()
        .filter(|(name, ..)| name == "init")
        .count();
    assert_eq!(
        init_runs, 2,
        "the init container ran again, and its first run is kept"
    );
}
