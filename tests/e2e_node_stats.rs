//! End to end, on the private containerd: `/stats/summary` and `/metrics/resource` on the node
//! API, as metrics-server and `kubectl top` read them. The agent runs standalone with
//! anonymous requests allowed (`--anonymous-auth=true --authorization-mode=AlwaysAllow`), so
//! no control plane is needed; e2e_node_api covers the authentication in front of these paths.
//!
//! One pod spins a shell loop, one sleeps: both are listed with their containers, the node's
//! CPU and memory are non-zero, the busy pod's `usageNanoCores` (from two scrapes) exceeds the
//! idle one's, and the resource metrics pass `promtool check metrics`.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{Agent, BUSYBOX, sleeping_pod, wait_until};
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

/// `curl -k` against the node API; (HTTP status, body).
fn curl(port: u16, path: &str) -> Option<(u16, String)> {
    let out = Command::new("curl")
        .args(["-sSk", "--max-time", "10", "-w", "\n%{http_code}"])
        .arg(format!("https://127.0.0.1:{port}{path}"))
        .output()
        .expect("run curl (scripts/install-deps installs it)");
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n')?;
    Some((code.trim().parse().ok()?, body.to_string()))
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
    let (code, body) = tokio::task::spawn_blocking(move || curl(port, "/stats/summary"))
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
    agent.extra_args.extend([
        "--anonymous-auth=true".to_string(),
        "--authorization-mode=AlwaysAllow".to_string(),
    ]);
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

    let (code, page) = tokio::task::spawn_blocking(move || curl(port, "/metrics/resource"))
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
