//! End to end, against the private containerd: security settings are applied or refused,
//! never dropped. `runAsNonRoot` against a root image waits with `CreateContainerConfigError`;
//! `runAsUser` takes effect; safe and allow-listed sysctls reach the pod's kernel namespaces
//! while others, AppArmor on a node without it and a user namespace with the host's PID
//! namespace are refused like any
//! invalid manifest; a read-only root filesystem is read-only; a Localhost seccomp profile
//! from `<root-dir>/seccomp` is enforced.

mod common;

use std::time::Duration;

use common::{Agent, containers_of, cri, wait_until};
use deckhand::clients::cri::{CriClient, RuntimeService};
use serde_json::Value;

const BUSYBOX: &str = "localhost/deckhand/busybox:1.35";
const WAIT: Duration = Duration::from_secs(60);
const SLEEP: &str = r#"["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]"#;

fn pod_yaml(name: &str, spec_extra: &str, container_extra: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 1
{spec_extra}  containers:
  - name: main
    image: {BUSYBOX}
    command: {SLEEP}
{container_extra}"
    )
}

fn waiting(pod: &Value) -> (&str, &str) {
    let w = &pod["status"]["containerStatuses"][0]["state"]["waiting"];
    (
        w["reason"].as_str().unwrap_or_default(),
        w["message"].as_str().unwrap_or_default(),
    )
}

/// Runs `cmd` in the running `main` container of `name`; its exit code and output, once the
/// container runs.
async fn exec(client: &CriClient, agent: &Agent, name: &str, cmd: &str) -> (i32, String) {
    let full = agent.pod_name(name);
    wait_until(&format!("`{cmd}` to run in {name}"), WAIT, || {
        let client = client.clone();
        let full = full.clone();
        async move {
            let id = containers_of(&client, &full)
                .await
                .into_iter()
                .find(|c| c.state == 1)?
                .id;
            let resp = client
                .exec_sync(id, vec!["sh".into(), "-c".into(), cmd.to_string()], 10)
                .await
                .ok()?;
            let out = String::from_utf8_lossy(&resp.stdout).into_owned()
                + &String::from_utf8_lossy(&resp.stderr);
            Some((resp.exit_code, out.trim().to_string()))
        }
    })
    .await
}

#[tokio::test]
async fn run_as_non_root_run_as_user_read_only_root_and_seccomp() {
    let mut agent = Agent::new("e2e-sec-user");
    agent.write_manifest(
        "root.yaml",
        &pod_yaml("root", "  securityContext: {runAsNonRoot: true}\n", ""),
    );
    agent.write_manifest(
        "user.yaml",
        &pod_yaml(
            "user",
            "  securityContext: {runAsNonRoot: true, runAsUser: 1000, runAsGroup: 3000}\n",
            "    securityContext: {readOnlyRootFilesystem: true}\n",
        ),
    );
    // A Localhost seccomp profile is read from <root-dir>/seccomp, as upstream.
    let profiles = agent.root_dir().join("seccomp");
    std::fs::create_dir_all(&profiles).unwrap();
    std::fs::write(
        profiles.join("deny-mkdir.json"),
        r#"{"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO"}]}"#,
    )
    .unwrap();
    agent.write_manifest(
        "seccomp.yaml",
        &pod_yaml(
            "seccomp",
            "",
            "    securityContext: {seccompProfile: {type: Localhost, localhostProfile: deny-mkdir.json}}\n",
        ),
    );
    agent.start();
    agent.wait_healthy(WAIT).await;
    let client = cri().await;

    // The busybox image names no user, so it runs as root: refused before creation.
    let full = agent.pod_name("root");
    let pod = wait_until(
        "the root pod to wait with CreateContainerConfigError",
        WAIT,
        || async {
            let pod = agent.pod("root").await?;
            (waiting(&pod).0 == "CreateContainerConfigError").then_some(pod)
        },
    )
    .await;
    let (_, message) = waiting(&pod);
    let uid = pod["metadata"]["uid"].as_str().unwrap();
    assert_eq!(
        message,
        format!(
            "container has runAsNonRoot and image will run as root (pod: \"{full}_default({uid})\", container: main)"
        )
    );
    assert_eq!(pod["status"]["phase"], "Pending");
    assert!(
        containers_of(&client, &full).await.is_empty(),
        "no container was created for the refused pod"
    );

    // runAsUser 1000 satisfies runAsNonRoot whatever the image says.
    assert_eq!(
        exec(&client, &agent, "user", "id -u; id -g").await,
        (0, "1000\n3000".to_string())
    );
    // readOnlyRootFilesystem: writing to / fails, writing to a tmpfs the image does not have
    // is not possible either.
    let (code, out) = exec(&client, &agent, "user", "touch /probe-file").await;
    assert_ne!(code, 0, "writing to / succeeded: {out}");
    assert!(out.contains("Read-only file system"), "{out}");

    let (code, out) = exec(&client, &agent, "seccomp", "mkdir /tmp/d").await;
    assert_ne!(
        code, 0,
        "mkdir succeeded under a profile that denies it: {out}"
    );
    assert_eq!(
        exec(&client, &agent, "seccomp", "touch /tmp/f && echo ok").await,
        (0, "ok".to_string())
    );
}

#[tokio::test]
async fn sysctls_apparmor_and_user_namespaces() {
    let mut agent = Agent::new("e2e-sec-sysctl");
    agent
        .extra_args
        .push("--allowed-unsafe-sysctls=kernel.msgmax".into());
    agent.write_manifest(
        "safe.yaml",
        &pod_yaml(
            "safe",
            "  securityContext:\n    sysctls:\n    - {name: net.ipv4.ip_unprivileged_port_start, value: '99'}\n    - {name: kernel.msgmax, value: '12345'}\n",
            "",
        ),
    );
    agent.write_manifest(
        "unsafe.yaml",
        &pod_yaml(
            "unsafe",
            "  securityContext:\n    sysctls: [{name: kernel.msgmnb, value: '1'}]\n",
            "",
        ),
    );
    agent.write_manifest(
        "hostnet.yaml",
        &pod_yaml(
            "hostnet",
            "  hostNetwork: true\n  securityContext:\n    sysctls: [{name: net.ipv4.tcp_syncookies, value: '0'}]\n",
            "",
        ),
    );
    agent.write_manifest(
        "userns.yaml",
        &pod_yaml("userns", "  hostUsers: false\n  hostPID: true\n", ""),
    );
    let apparmor_on = std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
        .is_ok_and(|s| s.trim() == "Y");
    agent.write_manifest(
        "apparmor.yaml",
        &pod_yaml(
            "apparmor",
            "",
            "    securityContext: {appArmorProfile: {type: RuntimeDefault}}\n",
        ),
    );
    agent.start();
    agent.wait_healthy(WAIT).await;
    let client = cri().await;

    assert_eq!(
        exec(
            &client,
            &agent,
            "safe",
            "cat /proc/sys/net/ipv4/ip_unprivileged_port_start /proc/sys/kernel/msgmax"
        )
        .await,
        (0, "99\n12345".to_string())
    );

    let mut refused = vec![
        (
            "unsafe.yaml",
            "SysctlForbidden: forbidden sysctl: \"kernel.msgmnb\" is not in the safe set and not listed in the node's allowedUnsafeSysctls",
        ),
        (
            "hostnet.yaml",
            "SysctlForbidden: forbidden sysctl: \"net.ipv4.tcp_syncookies\" is not allowed with hostNetwork: true",
        ),
        (
            "userns.yaml",
            "spec.securityContext.HostPID: Forbidden: when `pod.Spec.HostUsers` is false",
        ),
    ];
    if !apparmor_on {
        refused.push((
            "apparmor.yaml",
            "spec.containers[0].securityContext.appArmorProfile: AppArmor: Cannot enforce AppArmor: AppArmor is not enabled on the host",
        ));
    }
    wait_until("every refused manifest to be reported", WAIT, || async {
        let log = agent.log();
        refused
            .iter()
            .all(|(file, why)| log.lines().any(|l| l.contains(file) && l.contains(why)))
            .then_some(())
    })
    .await;
    // Refused pods never reach the runtime or /pods.
    let pods = agent.pods().await.unwrap();
    let names: Vec<&str> = pods["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["metadata"]["name"].as_str())
        .collect();
    for (file, _) in &refused {
        let name = agent.pod_name(file.trim_end_matches(".yaml"));
        assert!(
            !names.contains(&name.as_str()),
            "{name} is in /pods: {names:?}"
        );
        assert!(
            common::sandboxes_of(&client, &name).await.is_empty(),
            "{name} has a sandbox"
        );
    }
}
