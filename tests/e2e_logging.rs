//! End to end, on the private containerd: `--logging-format=json`. Every line the agent
//! writes is one JSON object with upstream's keys (`ts`, `caller`, `msg`, and `v` except on
//! errors), a pod's lines carry the `pod` field from the worker's span, and the pod's events
//! are lines of their own with `reason` and `object`. An unknown format stops the start with
//! a clear message.

mod common;

use std::time::Duration;

use common::{Agent, deckhand_bin, sleeping_pod, wait_until};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn json_lines_with_pod_fields() {
    let mut agent = Agent::new("e2e-logjson");
    agent.extra_args.push("--logging-format=json".to_string());
    agent.start();
    agent.wait_healthy(WAIT).await;
    agent.write_manifest("app.yaml", &sleeping_pod("app"));
    let name = agent.pod_name("app");
    wait_until("the pod running", WAIT, || {
        let pod = agent.pod("app");
        async move {
            let p = pod.await?;
            (p["status"]["phase"] == "Running").then_some(())
        }
    })
    .await;
    // Its Started event is logged once the container started.
    wait_until("the Started event in the log", WAIT, || {
        let log = agent.log();
        let name = name.clone();
        async move {
            log.lines()
                .any(|l| l.contains("\"Started\"") && l.contains(&name))
                .then_some(())
        }
    })
    .await;
    agent.stop();

    let log = agent.log();
    let mut lines = Vec::new();
    for (i, line) in log
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("line {} is not JSON ({e}): {line}", i + 1));
        assert!(v.is_object(), "line {}: {line}", i + 1);
        assert!(
            v["ts"].as_f64().is_some_and(|t| t > 1.6e12),
            "ts in ms: {line}"
        );
        assert!(v["msg"].is_string(), "{line}");
        assert!(
            v["caller"].as_str().is_some_and(|c| c.contains(".rs:")),
            "{line}"
        );
        assert!(v.get("v").is_none_or(Value::is_u64), "{line}");
        lines.push(v);
    }
    assert!(lines.len() > 5, "{log}");
    let pod_field = format!("default/{name}");
    assert!(
        lines.iter().any(|l| l["pod"] == pod_field.as_str()),
        "no line with pod={pod_field}:\n{log}"
    );
    let event = lines
        .iter()
        .find(|l| l["msg"] == "event" && l["reason"] == "Started")
        .unwrap_or_else(|| panic!("no Started event line:\n{log}"));
    assert!(
        event["object"].as_str().is_some_and(|o| o.contains(&name)),
        "{event}"
    );
    assert!(event["message"].is_string(), "{event}");
    assert_eq!(event["v"], 0, "{event}");
}

#[test]
fn an_unknown_format_stops_the_start() {
    let out = std::process::Command::new(deckhand_bin())
        .args(["--logging-format=xml", "--hostname-override=e2e-logbad"])
        .output()
        .expect("run deckhand");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--logging-format: unsupported log format \"xml\" (use \"text\" or \"json\")"),
        "{err}"
    );
}
