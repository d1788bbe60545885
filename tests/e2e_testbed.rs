//! The testbed's tear-down leaves nothing behind: a second private containerd is brought up in
//! its own directory with its own bridge, runs a pod, and is torn down; then no mount, netns,
//! shim, bridge or lease of it may remain.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use deckhand::clients::cri::proto::{
    ContainerConfig, ContainerMetadata, CreateContainerRequest, ImageSpec, LinuxPodSandboxConfig,
    PodSandboxConfig, PodSandboxMetadata, RunPodSandboxRequest,
};
use deckhand::clients::cri::{CriClient, RuntimeService, parse_endpoint};

fn testbed(args: &[&str]) -> std::process::Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/testbed");
    Command::new(script)
        .args(args)
        .output()
        .expect("run scripts/testbed")
}

fn mounts_under(dir: &Path) -> Vec<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let prefix = dir.display().to_string();
    text.lines()
        .filter_map(|l| l.split_whitespace().nth(4))
        .filter(|m| m.starts_with(&prefix))
        .map(str::to_string)
        .collect()
}

fn shims_naming(sock: &Path) -> Vec<String> {
    let needle = sock.display().to_string();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if text.contains("containerd-shim") && text.contains(&needle) {
            found.push(text);
        }
    }
    found
}

#[tokio::test]
async fn teardown_leaves_no_mount_netns_shim_or_bridge() {
    // Fails clearly without the main testbed's tools; this test makes its own instance.
    let _ = common::runtime_endpoint();
    let dir = tempfile::Builder::new()
        .prefix("deckhand-tb2-")
        .tempdir()
        .unwrap();
    let tb = dir.path().join("tb");
    let tb_s = tb.display().to_string();
    let bridge = "dhz0";
    let up = testbed(&["up", &tb_s, "--bridge", bridge, "--subnet", "10.88.44.0/24"]);
    assert!(
        up.status.success(),
        "testbed up failed: {}",
        String::from_utf8_lossy(&up.stderr)
    );
    let sock = tb.join("containerd.sock");

    let netns_before: Vec<String> = std::fs::read_dir("/var/run/netns")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();

    let client = CriClient::connect(
        &parse_endpoint(&format!("unix://{}", sock.display())).unwrap(),
        Duration::from_secs(60),
    )
    .await
    .expect("second testbed answers");
    let sandbox_config = PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: "teardown-probe".into(),
            uid: "teardown-probe-uid".into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: "teardown-probe".into(),
        log_directory: dir.path().join("logs").display().to_string(),
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent: "/kubepods/besteffort/podteardown-probe-uid".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let sandbox = client
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(sandbox_config.clone()),
            runtime_handler: String::new(),
        })
        .await
        .expect("RunPodSandbox on the second testbed")
        .pod_sandbox_id;
    let container = client
        .create_container(CreateContainerRequest {
            pod_sandbox_id: sandbox.clone(),
            config: Some(ContainerConfig {
                metadata: Some(ContainerMetadata {
                    name: "sleep".into(),
                    attempt: 0,
                }),
                image: Some(ImageSpec {
                    image: "localhost/deckhand/busybox:1.35".into(),
                    ..Default::default()
                }),
                command: vec!["sleep".into(), "3600".into()],
                log_path: "sleep.log".into(),
                ..Default::default()
            }),
            sandbox_config: Some(sandbox_config),
        })
        .await
        .expect("CreateContainer");
    client
        .start_container(container)
        .await
        .expect("StartContainer");
    assert!(
        !mounts_under(&tb).is_empty(),
        "a running pod should have mounts under the testbed"
    );
    assert!(
        !shims_naming(&sock).is_empty(),
        "a running pod should have a shim"
    );
    drop(client);

    let down = testbed(&["down", &tb_s]);
    assert!(
        down.status.success(),
        "testbed down failed: {}",
        String::from_utf8_lossy(&down.stderr)
    );

    assert_eq!(
        mounts_under(&tb),
        Vec::<String>::new(),
        "mounts left under the testbed"
    );
    assert_eq!(
        shims_naming(&sock),
        Vec::<String>::new(),
        "shims left running"
    );
    let bridge_exists = Command::new("ip")
        .args(["link", "show", bridge])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(!bridge_exists, "bridge {bridge} left behind");
    let netns_after: Vec<String> = std::fs::read_dir("/var/run/netns")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !netns_before.contains(n))
        .collect();
    assert!(netns_after.is_empty(), "new netns left: {netns_after:?}");
    let leftovers = testbed(&["leftovers", &tb_s]);
    assert!(
        leftovers.status.success(),
        "leftovers reported: {}{}",
        String::from_utf8_lossy(&leftovers.stdout),
        String::from_utf8_lossy(&leftovers.stderr)
    );
    assert!(
        !Path::new("/sys/fs/cgroup/memory/kubepods/besteffort/podteardown-probe-uid").exists(),
        "the pod's cgroup was left behind"
    );
}
