//! `deckhand pods`: the node's pods as a table, each with one line saying why it is not running
//! when it is not. Pure: a `PodList` (what `/pods` serves) and the failing probes in, rows out.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use serde::Serialize;

/// Failing probe messages by pod UID, then container name (the local socket's `/debug/probes`).
pub(crate) type FailingProbes = BTreeMap<String, BTreeMap<String, String>>;

/// One pod as `deckhand pods` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct PodRow {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub phase: String,
    /// kubectl's STATUS column: the reason that matters most, else the phase.
    pub status: String,
    /// Ready app containers over all app containers (sidecars count), as kubectl shows it.
    pub ready: String,
    pub restarts: i32,
    /// Seconds since the pod started (or was created), when known.
    pub age_seconds: Option<i64>,
    pub ip: String,
    /// Why the pod is not running as it should, in one line; empty when it is.
    pub why: String,
    pub containers: Vec<ContainerRow>,
}

/// One container of a pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct ContainerRow {
    pub name: String,
    /// `init`, `sidecar` or `app`.
    pub kind: &'static str,
    /// `waiting`, `running`, `terminated` or `unknown`.
    pub state: &'static str,
    pub ready: bool,
    pub restarts: i32,
    /// Why this container is not running or not ready; empty when nothing is wrong.
    pub why: String,
}

/// The rows for every pod in `pods`, sorted by namespace and name.
pub(crate) fn rows(pods: &[Pod], failing: &FailingProbes, now: jiff::Timestamp) -> Vec<PodRow> {
    let mut out: Vec<PodRow> = pods.iter().map(|p| row(p, failing, now)).collect();
    out.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    out
}

fn row(pod: &Pod, failing: &FailingProbes, now: jiff::Timestamp) -> PodRow {
    let meta = &pod.metadata;
    let uid = meta.uid.clone().unwrap_or_default();
    let status = pod.status.clone().unwrap_or_default();
    let phase = status.phase.clone().unwrap_or_else(|| "Pending".into());
    let no_probes = BTreeMap::new();
    let probes = failing.get(&uid).unwrap_or(&no_probes);

    let sidecars: Vec<&str> = pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten())
        .filter(|c| c.restart_policy.as_deref() == Some("Always"))
        .map(|c| c.name.as_str())
        .collect();
    let init_statuses = status.init_container_statuses.clone().unwrap_or_default();
    let app_statuses = status.container_statuses.clone().unwrap_or_default();
    let mut containers = Vec::new();
    for s in &init_statuses {
        let kind = if sidecars.contains(&s.name.as_str()) {
            "sidecar"
        } else {
            "init"
        };
        containers.push(container_row(s, kind, probes.get(&s.name)));
    }
    for s in &app_statuses {
        containers.push(container_row(s, "app", probes.get(&s.name)));
    }

    let app_like = || containers.iter().filter(|c| c.kind != "init");
    let ready = format!(
        "{}/{}",
        app_like().filter(|c| c.ready).count(),
        pod.spec
            .as_ref()
            .map_or(0, |s| s.containers.len() + sidecars.len())
    );
    let restarts = containers.iter().map(|c| c.restarts).sum();
    let started = status
        .start_time
        .as_ref()
        .or(meta.creation_timestamp.as_ref())
        .map(|t| t.0);
    PodRow {
        namespace: meta.namespace.clone().unwrap_or_else(|| "default".into()),
        name: meta.name.clone().unwrap_or_default(),
        uid,
        status: status_column(pod, &phase, &init_statuses, &app_statuses, &sidecars),
        why: why(pod, &phase, &containers),
        phase,
        ready,
        restarts,
        age_seconds: started.map(|t| now.duration_since(t).as_secs().max(0)),
        ip: status.pod_ip.clone().unwrap_or_default(),
        containers,
    }
}

fn container_row(s: &ContainerStatus, kind: &'static str, probe: Option<&String>) -> ContainerRow {
    let state = s.state.as_ref();
    let (state_name, mut why) = if let Some(w) = state.and_then(|st| st.waiting.as_ref()) {
        let reason = w.reason.clone().unwrap_or_else(|| "Waiting".into());
        let why = match w.message.as_deref().filter(|m| !m.is_empty()) {
            Some(m) => format!("{reason}: {m}"),
            None => reason,
        };
        ("waiting", why)
    } else if state.and_then(|st| st.running.as_ref()).is_some() {
        let why = if s.ready || kind == "init" {
            String::new()
        } else if let Some(p) = probe {
            format!("not ready: {p}")
        } else if s.started == Some(false) {
            "not started: its startup probe has not succeeded yet".into()
        } else {
            "not ready".into()
        };
        ("running", why)
    } else if let Some(t) = state.and_then(|st| st.terminated.as_ref()) {
        let why = if t.exit_code == 0 && kind == "init" {
            String::new()
        } else {
            exit_text(t.exit_code, t.reason.as_deref(), t.message.as_deref())
        };
        ("terminated", why)
    } else {
        ("unknown", String::new())
    };
    // A container that keeps failing says how it last ended.
    if state_name == "waiting"
        && let Some(t) = s.last_state.as_ref().and_then(|l| l.terminated.as_ref())
    {
        why.push_str(&format!(
            "; last {}",
            exit_text(t.exit_code, t.reason.as_deref(), t.message.as_deref())
        ));
        if let Some(p) = probe {
            why.push_str(&format!(" after {p}"));
        }
    }
    ContainerRow {
        name: s.name.clone(),
        kind,
        state: state_name,
        ready: s.ready,
        restarts: s.restart_count,
        why,
    }
}

/// "exit code 1 (Error)", "exit code 137 (OOMKilled)", with the termination message's first line.
fn exit_text(code: i32, reason: Option<&str>, message: Option<&str>) -> String {
    let mut text = format!("exit code {code}");
    if let Some(r) = reason.filter(|r| !r.is_empty()) {
        text.push_str(&format!(" ({r})"));
    }
    if let Some(first) = message
        .and_then(|m| m.lines().find(|l| !l.trim().is_empty()))
        .map(str::trim)
    {
        text.push_str(&format!(": {first}"));
    }
    text
}

/// kubectl's STATUS column, in its order of precedence: terminating, a pod-level reason, an
/// init container's trouble or progress, an app container's waiting or terminated reason, the
/// phase.
fn status_column(
    pod: &Pod,
    phase: &str,
    init: &[ContainerStatus],
    app: &[ContainerStatus],
    sidecars: &[&str],
) -> String {
    if pod.metadata.deletion_timestamp.is_some() {
        return "Terminating".into();
    }
    if let Some(reason) = pod
        .status
        .as_ref()
        .and_then(|s| s.reason.as_deref())
        .filter(|r| !r.is_empty())
    {
        return reason.to_string();
    }
    let plain_init: Vec<&ContainerStatus> = init
        .iter()
        .filter(|s| !sidecars.contains(&s.name.as_str()))
        .collect();
    for (i, s) in plain_init.iter().enumerate() {
        let state = s.state.as_ref();
        if let Some(t) = state.and_then(|st| st.terminated.as_ref()) {
            if t.exit_code == 0 {
                continue;
            }
            return format!(
                "Init:{}",
                t.reason.clone().unwrap_or_else(|| "Error".into())
            );
        }
        if let Some(reason) = state
            .and_then(|st| st.waiting.as_ref())
            .and_then(|w| w.reason.as_deref())
            .filter(|r| *r != "PodInitializing")
        {
            return format!("Init:{reason}");
        }
        return format!("Init:{i}/{}", plain_init.len());
    }
    for s in app {
        let state = s.state.as_ref();
        if let Some(reason) = state
            .and_then(|st| st.waiting.as_ref())
            .and_then(|w| w.reason.as_deref())
        {
            return reason.to_string();
        }
        if let Some(reason) = state
            .and_then(|st| st.terminated.as_ref())
            .and_then(|t| t.reason.as_deref())
        {
            return reason.to_string();
        }
    }
    phase.to_string()
}

/// One line on why the pod is not running as it should, or empty.
fn why(pod: &Pod, phase: &str, containers: &[ContainerRow]) -> String {
    let status = pod.status.as_ref();
    if pod.metadata.deletion_timestamp.is_some() {
        return "being deleted; its containers are stopping".into();
    }
    if phase == "Failed" || phase == "Succeeded" {
        let reason = status.and_then(|s| s.reason.as_deref()).unwrap_or_default();
        let message = status
            .and_then(|s| s.message.as_deref())
            .unwrap_or_default();
        return match (reason.is_empty(), message.is_empty()) {
            (false, false) => format!("{reason}: {message}"),
            (false, true) => reason.to_string(),
            (true, false) => message.to_string(),
            (true, true) if phase == "Succeeded" => "completed".into(),
            (true, true) => first_container_problem(containers).unwrap_or_default(),
        };
    }
    if let Some(problem) = first_container_problem(containers) {
        return problem;
    }
    if phase == "Pending" && containers.is_empty() {
        return "waiting to be started".into();
    }
    String::new()
}

/// The first container (init containers first, in order) with something wrong.
fn first_container_problem(containers: &[ContainerRow]) -> Option<String> {
    containers.iter().find(|c| !c.why.is_empty()).map(|c| {
        let what = match c.kind {
            "init" => "init container",
            "sidecar" => "sidecar",
            _ => "container",
        };
        format!("{what} {}: {}", c.name, c.why)
    })
}

/// Seconds as kubectl prints ages: `45s`, `3m12s`, `5h4m`, `3d4h`.
pub(crate) fn human_age(secs: i64) -> String {
    let (d, h, m, s) = (
        secs / 86_400,
        (secs / 3600) % 24,
        (secs / 60) % 60,
        secs % 60,
    );
    if d > 0 {
        format!("{d}d{h}h")
    } else if h > 0 {
        format!("{h}h{m}m")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

/// The rows as a table for people, columns padded to their widest cell.
pub(crate) fn render_table(rows: &[PodRow]) -> String {
    let header = [
        "NAMESPACE",
        "NAME",
        "READY",
        "STATUS",
        "RESTARTS",
        "AGE",
        "IP",
        "WHY",
    ];
    let mut cells: Vec<Vec<String>> = vec![header.iter().map(|h| h.to_string()).collect()];
    for r in rows {
        cells.push(vec![
            r.namespace.clone(),
            r.name.clone(),
            r.ready.clone(),
            r.status.clone(),
            r.restarts.to_string(),
            r.age_seconds.map_or_else(|| "-".into(), human_age),
            if r.ip.is_empty() {
                "-".into()
            } else {
                r.ip.clone()
            },
            r.why.clone(),
        ]);
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            cells
                .iter()
                .map(|row| row[i].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in cells {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}   ", width = widths[i]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(json: serde_json::Value) -> Pod {
        serde_json::from_value(json).unwrap()
    }

    fn now() -> jiff::Timestamp {
        "2026-12-01T12:00:00Z".parse().unwrap()
    }

    fn one(p: Pod, failing: &FailingProbes) -> PodRow {
        rows(&[p], failing, now()).remove(0)
    }

    #[test]
    fn why_a_pod_is_not_running_in_one_line() {
        let no_probes = FailingProbes::new();
        let failing: FailingProbes = [(
            "u-ready".to_string(),
            [(
                "app".to_string(),
                "Readiness probe failed: HTTP probe failed with statuscode: 503".to_string(),
            )]
            .into(),
        )]
        .into();
        let rows: Vec<(&str, serde_json::Value, &FailingProbes, &str, &str)> = vec![
            (
                "running and ready",
                serde_json::json!({
                    "metadata": {"name": "a", "namespace": "n", "uid": "u1"},
                    "spec": {"containers": [{"name": "app"}]},
                    "status": {"phase": "Running", "containerStatuses": [{"name": "app", "image": "i", "imageID": "", "ready": true, "restartCount": 0, "state": {"running": {}}}]}
                }),
                &no_probes,
                "Running",
                "",
            ),
            (
                "crash loop with the last exit",
                serde_json::json!({
                    "metadata": {"name": "a", "uid": "u2"},
                    "spec": {"containers": [{"name": "app"}]},
                    "status": {"phase": "Running", "containerStatuses": [{"name": "app", "image": "i", "imageID": "", "ready": false, "restartCount": 3,
                        "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container=app pod=a_default(u2)"}},
                        "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}
                }),
                &no_probes,
                "CrashLoopBackOff",
                "container app: CrashLoopBackOff: back-off 40s restarting failed container=app pod=a_default(u2); last exit code 1 (Error)",
            ),
            (
                "image pull",
                serde_json::json!({
                    "metadata": {"name": "a", "uid": "u3"},
                    "spec": {"containers": [{"name": "app"}]},
                    "status": {"phase": "Pending", "containerStatuses": [{"name": "app", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                        "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"nope\""}}}]}
                }),
                &no_probes,
                "ImagePullBackOff",
                "container app: ImagePullBackOff: Back-off pulling image \"nope\"",
            ),
            (
                "failing readiness probe",
                serde_json::json!({
                    "metadata": {"name": "a", "uid": "u-ready"},
                    "spec": {"containers": [{"name": "app"}]},
                    "status": {"phase": "Running", "containerStatuses": [{"name": "app", "image": "i", "imageID": "", "ready": false, "started": true, "restartCount": 0, "state": {"running": {}}}]}
                }),
                &failing,
                "Running",
                "container app: not ready: Readiness probe failed: HTTP probe failed with statuscode: 503",
            ),
            (
                "refused at admission",
                serde_json::json!({
                    "metadata": {"name": "a", "uid": "u4"},
                    "spec": {"containers": [{"name": "app"}]},
                    "status": {"phase": "Failed", "reason": "OutOfmemory", "message": "Pod was rejected: Node didn't have enough resource: memory"}
                }),
                &no_probes,
                "OutOfmemory",
                "OutOfmemory: Pod was rejected: Node didn't have enough resource: memory",
            ),
            (
                "init container failing",
                serde_json::json!({
                    "metadata": {"name": "a", "uid": "u5"},
                    "spec": {"initContainers": [{"name": "setup"}], "containers": [{"name": "app"}]},
                    "status": {"phase": "Pending",
                        "initContainerStatuses": [{"name": "setup", "image": "i", "imageID": "", "ready": false, "restartCount": 2,
                            "state": {"waiting": {"reason": "CrashLoopBackOff"}}, "lastState": {"terminated": {"exitCode": 3, "reason": "Error", "message": "no config\n"}}}],
                        "containerStatuses": [{"name": "app", "image": "i", "imageID": "", "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "PodInitializing"}}}]}
                }),
                &no_probes,
                "Init:CrashLoopBackOff",
                "init container setup: CrashLoopBackOff; last exit code 3 (Error): no config",
            ),
            (
                "init in progress",
                serde_json::json!({
                    "metadata": {"name": "a", "uid": "u6"},
                    "spec": {"initContainers": [{"name": "one"}, {"name": "two"}], "containers": [{"name": "app"}]},
                    "status": {"phase": "Pending",
                        "initContainerStatuses": [
                            {"name": "one", "image": "i", "imageID": "", "ready": true, "restartCount": 0, "state": {"terminated": {"exitCode": 0, "reason": "Completed"}}},
                            {"name": "two", "image": "i", "imageID": "", "ready": false, "restartCount": 0, "state": {"running": {}}}]}
                }),
                &no_probes,
                "Init:1/2",
                "",
            ),
            (
                "OOM killed and completed",
                serde_json::json!({
                    "metadata": {"name": "a", "uid": "u7"},
                    "spec": {"restartPolicy": "Never", "containers": [{"name": "app"}]},
                    "status": {"phase": "Failed", "containerStatuses": [{"name": "app", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                        "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}
                }),
                &no_probes,
                "OOMKilled",
                "container app: exit code 137 (OOMKilled)",
            ),
        ];
        for (what, json, probes, status, why) in rows {
            let r = one(pod(json), probes);
            assert_eq!(r.status, status, "{what}: status");
            assert_eq!(r.why, why, "{what}: why");
        }
    }

    #[test]
    fn ready_counts_app_containers_and_sidecars() {
        let r = one(
            pod(serde_json::json!({
                "metadata": {"name": "a", "uid": "u"},
                "spec": {"initContainers": [{"name": "log", "restartPolicy": "Always"}], "containers": [{"name": "app"}, {"name": "b"}]},
                "status": {"phase": "Running", "startTime": "2026-12-01T11:57:00Z",
                    "initContainerStatuses": [{"name": "log", "image": "i", "imageID": "", "ready": true, "restartCount": 1, "state": {"running": {}}}],
                    "containerStatuses": [
                        {"name": "app", "image": "i", "imageID": "", "ready": true, "restartCount": 2, "state": {"running": {}}},
                        {"name": "b", "image": "i", "imageID": "", "ready": true, "restartCount": 0, "state": {"running": {}}}]}
            })),
            &FailingProbes::new(),
        );
        assert_eq!(r.ready, "3/3");
        assert_eq!(r.restarts, 3);
        assert_eq!(r.age_seconds, Some(180));
        assert_eq!(r.containers[0].kind, "sidecar");
    }

    #[test]
    fn ages_read_like_kubectls() {
        for (secs, want) in [
            (5, "5s"),
            (192, "3m12s"),
            (3 * 3600 + 240, "3h4m"),
            (2 * 86_400 + 3600, "2d1h"),
        ] {
            assert_eq!(human_age(secs), want);
        }
    }

    #[test]
    fn the_table_pads_columns() {
        let r = one(
            pod(serde_json::json!({
                "metadata": {"name": "web", "namespace": "default", "uid": "u"},
                "spec": {"containers": [{"name": "app"}]},
                "status": {"phase": "Running", "podIP": "10.0.0.5"}
            })),
            &FailingProbes::new(),
        );
        let table = render_table(&[r]);
        let lines: Vec<&str> = table.lines().collect();
        assert!(
            lines[0].starts_with("NAMESPACE   NAME   READY   STATUS"),
            "{table}"
        );
        assert!(
            lines[1].starts_with("default     web    0/1     Running"),
            "{table}"
        );
        assert!(lines[1].contains("10.0.0.5"), "{table}");
    }
}
