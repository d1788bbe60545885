//! End to end, on the private containerd: the hardening fields of the config file are
//! applied, never dropped with a warning.
//!
//! * `seccompDefault: true`: a container whose pod asks for no seccomp profile runs filtered
//!   (`Seccomp: 2` in its `/proc/1/status`); one that asks for `Unconfined` runs unfiltered.
//! * `enableDebuggingHandlers: false`: exec and container logs answer upstream's 405 "Debug
//!   endpoints are disabled." while `/pods` still lists the pod; `enableSystemLogHandler:
//!   false` alone turns off `/logs/` (405 "logs endpoint is disabled.").
//! * `protectKernelDefaults: true`: a kernel tunable that differs from upstream's value stops
//!   the start, naming the field and the tunable. The host's settings are never changed: the
//!   agent reads a copy of `/proc/sys` the test writes (`DECKHAND_TEST_PROC_SYS`), and the
//!   host's own only when they already differ.
//!
//! The agents run standalone with anonymous requests allowed (`--anonymous-auth=true
//! --authorization-mode=AlwaysAllow`); e2e_node_api covers authentication.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::node_api::curl_node_api;
use common::{Agent, BUSYBOX, containers_of, cri, sleeping_pod, wait_until};
use deckhand::clients::cri::RuntimeService;

const WAIT: Duration = Duration::from_secs(60);

/// `curl -k -X <method>` against the node API; (HTTP status, body).
async fn curl_async(port: u16, method: &'static str, path: String) -> (u16, String) {
    tokio::task::spawn_blocking(move || curl_node_api(port, &path, ["-k", "-X", method]))
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("the node API on port {port} did not answer: {e}"))
}

/// The `Seccomp:` line of the `main` container's PID 1, read inside the container.
async fn seccomp_mode(agent: &Agent, pod: &str) -> String {
    let client = cri().await;
    let full = agent.pod_name(pod);
    wait_until(&format!("the Seccomp line of {full}"), WAIT, || {
        let client = client.clone();
        let full = full.clone();
        async move {
            let id = containers_of(&client, &full)
                .await
                .into_iter()
                .find(|c| c.state == 1)?
                .id;
            let cmd = vec!["grep".into(), "^Seccomp:".into(), "/proc/1/status".into()];
            let resp = client.exec_sync(id, cmd, 10).await.ok()?;
            let out = String::from_utf8_lossy(&resp.stdout).into_owned();
            let mode = out.strip_prefix("Seccomp:")?.trim().to_string();
            (!mode.is_empty()).then_some(mode)
        }
    })
    .await
}

fn pod_with_seccomp(name: &str, profile: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 1
  securityContext: {{seccompProfile: {{type: {profile}}}}}
  containers:
  - name: app
    image: {BUSYBOX}
    command: ["sh", "-c", "trap 'exit 0' TERM; sleep 600 & wait"]
"#
    )
}

#[tokio::test]
async fn seccomp_default_filters_pods_without_a_profile() {
    let mut agent = Agent::new("e2e-hard-seccomp");
    agent.with_config("seccompDefault: true\n");
    agent.write_manifest("bare.yaml", &sleeping_pod("bare"));
    agent.write_manifest("open.yaml", &pod_with_seccomp("open", "Unconfined"));
    agent.start();
    agent.wait_healthy(WAIT).await;

    // 2 is SECCOMP_MODE_FILTER: the runtime's default profile is in force.
    assert_eq!(
        seccomp_mode(&agent, "bare").await,
        "2",
        "a pod without a profile runs unconfined under seccompDefault: true"
    );
    // A profile the pod asks for still wins.
    assert_eq!(seccomp_mode(&agent, "open").await, "0");
    assert!(
        !agent.log().contains("unknown field \"seccompDefault\""),
        "seccompDefault was warned about as unknown"
    );
}

#[tokio::test]
async fn debugging_handlers_off_refuse_exec_and_logs_but_serve_pods() {
    let mut off = Agent::new("e2e-hard-debug");
    off.let_anyone_in();
    off.with_config("enableDebuggingHandlers: false\n");
    off.write_manifest("app.yaml", &sleeping_pod("app"));
    let mut no_logs = Agent::new("e2e-hard-nologs");
    no_logs.let_anyone_in();
    no_logs.with_config("enableSystemLogHandler: false\n");
    off.start();
    no_logs.start();
    off.wait_healthy(WAIT).await;
    no_logs.wait_healthy(WAIT).await;
    let pod = off.pod_name("app");
    let port = off.port;

    // /pods still answers, and lists the pod once it runs.
    wait_until("the pod in the node API's /pods", WAIT, || {
        let pod = pod.clone();
        async move {
            let (code, body) = curl_async(port, "GET", "/pods".into()).await;
            (code == 200 && body.contains(&format!("\"name\":\"{pod}\""))).then_some(())
        }
    })
    .await;
    let client = cri().await;
    wait_until("the pod's container to run", WAIT, || {
        let client = client.clone();
        let pod = pod.clone();
        async move {
            containers_of(&client, &pod)
                .await
                .iter()
                .any(|c| c.state == 1)
                .then_some(())
        }
    })
    .await;

    let disabled = (405, "Debug endpoints are disabled.\n".to_string());
    for (method, path) in [
        (
            "POST",
            format!("/exec/default/{pod}/app?command=id&output=1"),
        ),
        (
            "GET",
            format!("/exec/default/{pod}/app?command=id&output=1"),
        ),
        ("POST", format!("/attach/default/{pod}/app?output=1")),
        ("POST", format!("/portForward/default/{pod}")),
        ("GET", format!("/containerLogs/default/{pod}/app")),
        ("GET", "/logs/".to_string()),
        ("GET", "/runningpods/".to_string()),
    ] {
        assert_eq!(
            curl_async(port, method, path.clone()).await,
            disabled,
            "{method} {path}"
        );
    }
    assert_eq!(curl_async(port, "GET", "/configz".into()).await.0, 404);
    assert_eq!(curl_async(port, "GET", "/healthz".into()).await.0, 200);

    assert_eq!(
        curl_async(no_logs.port, "GET", "/logs/".into()).await,
        (405, "logs endpoint is disabled.\n".to_string())
    );
    assert_eq!(
        curl_async(no_logs.port, "GET", "/configz".into()).await.0,
        200
    );
}

/// A copy of the tunables `protectKernelDefaults` checks, at upstream's values but `changed`.
fn fake_proc_sys(dir: &Path, changed: &[(&str, &str)]) {
    let upstream = [
        ("vm/overcommit_memory", "1"),
        ("vm/panic_on_oom", "0"),
        ("kernel/panic", "10"),
        ("kernel/panic_on_oops", "1"),
        ("kernel/keys/root_maxkeys", "1000000"),
        ("kernel/keys/root_maxbytes", "25000000"),
    ];
    for (flag, value) in upstream {
        let value = changed
            .iter()
            .find(|(f, _)| *f == flag)
            .map_or(value, |(_, v)| *v);
        let path = dir.join(flag);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, format!("{value}\n")).unwrap();
    }
}

/// Waits (bounded) for the agent to exit; its exit status.
fn wait_exit(agent: &mut Agent) -> std::process::ExitStatus {
    let child = agent.child.as_mut().expect("started");
    let start = Instant::now();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return status;
        }
        assert!(
            start.elapsed() < WAIT,
            "deckhand did not refuse to start; log:\n{}",
            agent.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[tokio::test]
async fn protect_kernel_defaults_refuses_a_differing_kernel() {
    let fake = tempfile::tempdir().unwrap();
    fake_proc_sys(fake.path(), &[("kernel/panic_on_oops", "0")]);
    let mut refused = Agent::new("e2e-hard-kernel");
    refused.with_config("protectKernelDefaults: true\n");
    refused.env.push((
        "DECKHAND_TEST_PROC_SYS".into(),
        fake.path().display().to_string(),
    ));
    refused.start();
    let status = wait_exit(&mut refused);
    assert!(!status.success(), "exited with {status}");
    let log = refused.log();
    assert!(
        log.contains(
            "protectKernelDefaults is true and invalid kernel flag: kernel/panic_on_oops, \
             expected value: 1, actual value: 0"
        ),
        "{log}"
    );

    // The same tunables at upstream's values: the agent starts.
    let good = tempfile::tempdir().unwrap();
    fake_proc_sys(good.path(), &[]);
    let mut started = Agent::new("e2e-hard-kernel-ok");
    started.with_config("protectKernelDefaults: true\n");
    started.env.push((
        "DECKHAND_TEST_PROC_SYS".into(),
        good.path().display().to_string(),
    ));
    started.start();
    started.wait_healthy(WAIT).await;

    // The host's own /proc/sys, read only: when it differs, the refusal names the tunable.
    let differing: Vec<&str> = [
        ("vm/overcommit_memory", "1"),
        ("vm/panic_on_oom", "0"),
        ("kernel/panic", "10"),
        ("kernel/panic_on_oops", "1"),
        ("kernel/keys/root_maxkeys", "1000000"),
        ("kernel/keys/root_maxbytes", "25000000"),
    ]
    .into_iter()
    .filter(|(flag, want)| {
        std::fs::read_to_string(Path::new("/proc/sys").join(flag))
            .map_or(true, |v| v.trim() != *want)
    })
    .map(|(flag, _)| flag)
    .collect();
    if differing.is_empty() {
        eprintln!("this host's kernel tunables are upstream's: no live refusal to show");
        return;
    }
    let mut host = Agent::new("e2e-hard-kernel-host");
    host.extra_args.push("--protect-kernel-defaults".into());
    host.start();
    let status = wait_exit(&mut host);
    assert!(!status.success(), "exited with {status}");
    let log = host.log();
    for flag in differing {
        assert!(
            log.contains(&format!("invalid kernel flag: {flag},"))
                || log.contains(&format!("cannot read kernel flag {flag}")),
            "{flag} not named:\n{log}"
        );
    }
}
