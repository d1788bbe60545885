//! The shipped systemd unit is accepted by `systemd-analyze verify` and keeps containers alive
//! across a restart of the agent.

use std::path::Path;
use std::process::Command;

#[test]
fn systemd_unit_verifies_and_keeps_containers_on_restart() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let unit = std::fs::read_to_string(repo.join("systemd/deckhand.service")).unwrap();
    for line in [
        "Type=notify",
        "KillMode=process",
        "Restart=always",
        "After=containerd.service network-online.target",
        "LimitNOFILE=1048576",
    ] {
        assert!(
            unit.lines().any(|l| l.trim() == line),
            "the unit should say {line}"
        );
    }
    assert!(unit.contains("--config=/etc/deckhand/config.yaml"));

    // The shipped configuration keeps the unauthenticated read-only port off, as upstream.
    let config = std::fs::read_to_string(repo.join("systemd/config.yaml")).unwrap();
    let read_only: Vec<&str> = config
        .lines()
        .filter(|l| l.trim_start().starts_with("readOnlyPort:"))
        .collect();
    assert_eq!(read_only, vec!["readOnlyPort: 0"], "{config}");

    // systemd-analyze checks that ExecStart exists: point it at the binary under test.
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("deckhand.service");
    let text = unit.replace("/usr/local/bin/deckhand", env!("CARGO_BIN_EXE_deckhand"));
    std::fs::write(&copy, text).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .output()
        .expect("systemd-analyze is part of Debian's systemd package (scripts/install-deps installs it)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Without a running systemd, verify still parses the unit; only unit-file problems fail it.
    let problems: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("deckhand.service"))
        .collect();
    assert!(
        out.status.success() && problems.is_empty(),
        "systemd-analyze verify: {stderr}"
    );
}
