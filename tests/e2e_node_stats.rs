//! End to end, on the private containerd: `/stats/summary` and `/metrics/resource` on the node
//! API, as metrics-server and `kubectl top` read them. The agent runs standalone with
//! anonymous requests allowed (`--anonymous-auth=true --authorization-mode=AlwaysAllow`), so
//! no control plane is needed; e2e_node_api covers the authentication in front of these paths.
//!
//! One pod spins a shell loop, one sleeps: both are listed with their containers, the node's
//! CPU and memory are non-zero, the busy pod's `usageNanoCores` (from two scrapes) exceeds the
//! idle one's, and the resource metrics pass `promtool check metrics`.
//!
//! A second test reads the read-only port (plain HTTP, no authentication, as upstream): a pod
//! that keeps pinging its gateway shows its network counters rising, the file it wrote
//! into an emptyDir shows in the volume's and the pod's ephemeral storage, its container's log
//! is measured, and the node reports its network, image filesystem, process limits and the
//! `pods` cgroup; `only_cpu_and_memory=true` leaves the rest out.

mod common;

use std::time::Duration;

use common::node_api::curl_node_api;
use common::{Agent, BUSYBOX, http_get, sleeping_pod, wait_until};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);

fn busy_pod(name: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 0
  containers:
  - name: spin
    image: {BUSYBOX}
    command: ["sh", "-c", "while true; do :; done"]
"#
    )
}

fn pod<'a>(summary: &'a Value, name: &str) -> Option<&'a Value> {
    summary["pods"]
        .as_array()?
        .iter()
        .find(|p| p["podRef"]["name"] == name)
}

fn nano_cores(summary: &Value, name: &str) -> Option<u64> {
    pod(summary, name)?["cpu"]["usageNanoCores"].as_u64()
}

async fn summary(port: u16) -> Option<Value> {
    let (code, body) =
        tokio::task::spawn_blocking(move || curl_node_api(port, "/stats/summary", ["-k"]).ok())
            .await
            .ok()??;
    if code != 200 {
        return None;
    }
    serde_json::from_str(&body).ok()
}

#[tokio::test]
async fn stats_summary_and_resource_metrics_follow_the_pods() {
    let mut agent = Agent::new("e2e-stats");
    agent.let_anyone_in();
    agent.start();
    agent.wait_healthy(WAIT).await;
    agent.write_manifest("busy.yaml", &busy_pod("busy"));
    agent.write_manifest("idle.yaml", &sleeping_pod("idle"));
    let busy = agent.pod_name("busy");
    let idle = agent.pod_name("idle");
    let port = agent.port;

    // Both pods listed; scraped until each has a rate (the second scrape at least a second
    // after the first gives one).
    let sum = wait_until("both pods with CPU rates in /stats/summary", WAIT, || {
        let (busy, idle) = (busy.clone(), idle.clone());
        async move {
            let s = summary(port).await?;
            (nano_cores(&s, &busy).is_some() && nano_cores(&s, &idle).is_some()).then_some(s)
        }
    })
    .await;

    assert_eq!(sum["node"]["nodeName"], agent.node.as_str(), "{sum}");
    assert!(
        sum["node"]["cpu"]["usageCoreNanoSeconds"]
            .as_u64()
            .is_some_and(|v| v > 0),
        "{sum}"
    );
    assert!(
        sum["node"]["memory"]["workingSetBytes"]
            .as_u64()
            .is_some_and(|v| v > 0),
        "{sum}"
    );
    assert!(
        sum["node"]["fs"]["capacityBytes"]
            .as_u64()
            .is_some_and(|v| v > 0),
        "{sum}"
    );
    for (name, container) in [(&busy, "spin"), (&idle, "app")] {
        let p = pod(&sum, name).unwrap();
        assert_eq!(p["podRef"]["namespace"], "default", "{p}");
        assert_eq!(p["containers"][0]["name"], container, "{p}");
        assert!(p["containers"][0]["startTime"].is_string(), "{p}");
        assert!(
            p["containers"][0]["memory"]["workingSetBytes"].is_u64(),
            "{p}"
        );
    }
    let (b, i) = (
        nano_cores(&sum, &busy).unwrap(),
        nano_cores(&sum, &idle).unwrap(),
    );
    assert!(b > i, "busy {b} nano-cores, idle {i}: {sum}");
    // A spinning shell uses a good part of a core; a sleeping one next to nothing.
    assert!(b > 100_000_000, "busy {b} nano-cores: {sum}");

    let (code, page) =
        tokio::task::spawn_blocking(move || curl_node_api(port, "/metrics/resource", ["-k"]).ok())
            .await
            .unwrap()
            .expect("GET /metrics/resource");
    assert_eq!(code, 200, "{page}");
    assert_eq!(common::promtool_lint(&page), "", "promtool on\n{page}");
    for series in [
        format!(
            "container_cpu_usage_seconds_total{{container=\"spin\",namespace=\"default\",pod=\"{busy}\"}} "
        ),
        format!(
            "container_cpu_usage_seconds_total{{container=\"app\",namespace=\"default\",pod=\"{idle}\"}} "
        ),
        format!("pod_memory_working_set_bytes{{namespace=\"default\",pod=\"{idle}\"}} "),
        "node_cpu_usage_seconds_total ".to_string(),
        "node_memory_working_set_bytes ".to_string(),
        "scrape_error 0".to_string(),
    ] {
        assert!(
            page.lines().any(|l| l.starts_with(&series)),
            "{series} in\n{page}"
        );
    }
}

/// Writes 1 MiB into an emptyDir, says hello on its log, then pings its gateway (the host's
/// bridge) with 1000-byte packets five times a second. (The image's static busybox `wget`
/// crashes, `ping` works.)
fn talking_pod(name: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 0
  volumes:
  - name: scratch
    emptyDir: {{}}
  containers:
  - name: talk
    image: {BUSYBOX}
    volumeMounts:
    - {{name: scratch, mountPath: /scratch}}
    command:
    - sh
    - -c
    - |
      head -c 1048576 /dev/zero > /scratch/blob
      echo hello
      gw=$(ip route | awk '/default/ {{print $3}}')
      while true; do ping -c 1 -W 1 -s 1000 "$gw" >/dev/null; sleep 0.2; done
"#
    )
}

/// GET on the read-only port: the parsed JSON of a 200 answer.
async fn read_only_json(port: u16, path: &str) -> Option<Value> {
    match http_get(&format!("http://127.0.0.1:{port}{path}")).await? {
        (200, body) => serde_json::from_str(&body).ok(),
        _ => None,
    }
}

fn u64_at(v: &Value, pointer: &str) -> Option<u64> {
    v.pointer(pointer)?.as_u64()
}

#[tokio::test]
async fn network_volumes_and_logs_on_the_read_only_port() {
    let mut agent = Agent::new("e2e-stats-ro");
    // Volumes measured again every second, so the test need not wait upstream's minute.
    agent.with_config("volumeStatsAggPeriod: 1s\n");
    agent.start();
    agent.wait_healthy(WAIT).await;
    agent.write_manifest("talk.yaml", &talking_pod("talk"));
    let talk = agent.pod_name("talk");
    let ro = agent.read_only_port;

    // The blob shows in the volume once it was walked after the write.
    let sum = wait_until("the emptyDir's 1 MiB in /stats/summary", WAIT, || {
        let talk = talk.clone();
        async move {
            let s = read_only_json(ro, "/stats/summary").await?;
            let p = pod(&s, &talk)?;
            let vol = p["volume"]
                .as_array()?
                .iter()
                .find(|v| v["name"] == "scratch")?;
            (vol["usedBytes"].as_u64()? >= 1 << 20).then(|| s.clone())
        }
    })
    .await;
    let p = pod(&sum, &talk).unwrap();
    let vol = p["volume"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "scratch")
        .unwrap();
    assert!(
        u64_at(vol, "/capacityBytes").is_some_and(|c| c > 0),
        "{vol}"
    );
    assert!(u64_at(vol, "/inodesUsed").is_some_and(|i| i >= 2), "{vol}");
    assert!(
        u64_at(p, "/ephemeral-storage/usedBytes").is_some_and(|u| u >= 1 << 20),
        "the emptyDir counts in the ephemeral storage: {p}"
    );
    assert!(
        u64_at(p, "/containers/0/logs/inodesUsed").is_some_and(|i| i >= 2),
        "the container's log directory and file: {p}"
    );
    assert!(p["cpu"]["usageCoreNanoSeconds"].is_u64(), "{p}");
    assert!(p["memory"]["workingSetBytes"].is_u64(), "{p}");

    // The pod's own namespace: eth0 at the top, its counters rising as it pings.
    assert_eq!(p["network"]["name"], "eth0", "{p}");
    assert!(
        p["network"]["interfaces"]
            .as_array()
            .is_some_and(|i| i.iter().all(|i| i["name"] != "lo")),
        "{p}"
    );
    let tx0 = u64_at(p, "/network/txBytes").expect("txBytes");
    let rx0 = u64_at(p, "/network/rxBytes").expect("rxBytes");
    wait_until("the pod's rx and tx bytes to rise", WAIT, || {
        let talk = talk.clone();
        async move {
            let s = read_only_json(ro, "/stats/summary").await?;
            let p = pod(&s, &talk)?;
            let (tx, rx) = (
                u64_at(p, "/network/txBytes")?,
                u64_at(p, "/network/rxBytes")?,
            );
            (tx > tx0 + 2000 && rx > rx0 + 2000).then_some(())
        }
    })
    .await;

    // The node's side.
    let node = &sum["node"];
    assert!(
        node["network"]["interfaces"]
            .as_array()
            .is_some_and(|i| !i.is_empty()),
        "{node}"
    );
    assert!(
        u64_at(node, "/runtime/imageFs/capacityBytes").is_some_and(|c| c > 0),
        "{node}"
    );
    assert!(
        u64_at(node, "/runtime/imageFs/usedBytes").is_some_and(|u| u > 0),
        "{node}"
    );
    assert!(
        u64_at(node, "/rlimit/maxpid").is_some_and(|m| m > 0),
        "{node}"
    );
    assert!(
        u64_at(node, "/rlimit/curproc").is_some_and(|c| c > 0),
        "{node}"
    );
    assert!(
        node["systemContainers"].as_array().is_some_and(|s| s
            .iter()
            .any(|c| c["name"] == "pods" && c["memory"]["workingSetBytes"].is_u64())),
        "{node}"
    );

    // What metrics-server asks for: CPU and memory only.
    let small = read_only_json(ro, "/stats/summary?only_cpu_and_memory=true")
        .await
        .expect("only_cpu_and_memory");
    let p = pod(&small, &talk).expect("the pod");
    assert!(p["cpu"].is_object() && p["memory"].is_object(), "{p}");
    for key in ["network", "volume", "ephemeral-storage"] {
        assert!(p.get(key).is_none(), "{key} in {p}");
    }

    // /metrics/resource is on the read-only port too.
    let (code, page) = http_get(&format!("http://127.0.0.1:{ro}/metrics/resource"))
        .await
        .expect("GET /metrics/resource");
    assert_eq!(code, 200, "{page}");
    let series = format!("pod_cpu_usage_seconds_total{{namespace=\"default\",pod=\"{talk}\"}} ");
    assert!(
        page.lines().any(|l| l.starts_with(&series)),
        "{series} in\n{page}"
    );
}
