//! End to end, on containerd 2.x (user namespaces need it; not in the 1.6 compatibility
//! subset): a `hostUsers: false` pod runs with its root mapped to an unprivileged host UID
//! (read from the host in `/proc/<pid>/uid_map` of its process), writes its emptyDir through
//! the runtime's idmapped mount, two pods get disjoint ranges, and a restarted agent keeps
//! every pod's range (a pod added after the restart gets a third one).

mod common;

use std::time::Duration;

use common::{Agent, BUSYBOX, wait_until};

const WAIT: Duration = Duration::from_secs(90);

/// A `hostUsers: false` pod whose container writes `hello` into its emptyDir and then sleeps
/// `marker` seconds: the sleep's command line finds its process on the host.
fn userns_pod(name: &str, marker: u32) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  hostUsers: false
  terminationGracePeriodSeconds: 1
  volumes:
  - name: data
    emptyDir: {{}}
  containers:
  - name: app
    image: {BUSYBOX}
    command: ["sh", "-c", "echo hello > /data/f && exec sleep {marker}"]
    volumeMounts:
    - {{name: data, mountPath: /data}}
"#
    )
}

/// The first line of `/proc/<pid>/uid_map` of the host process running `sleep <marker>`:
/// (inside ID, host ID, length).
fn uid_map_of(marker: u32) -> Option<(u32, u32, u32)> {
    let want = format!("sleep\0{marker}\0");
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let dir = entry.path();
        let Ok(cmdline) = std::fs::read(dir.join("cmdline")) else {
            continue;
        };
        if cmdline != want.as_bytes() {
            continue;
        }
        let map = std::fs::read_to_string(dir.join("uid_map")).ok()?;
        let nums: Vec<u32> = map
            .split_whitespace()
            .take(3)
            .filter_map(|n| n.parse().ok())
            .collect();
        if let [inside, host, len] = nums[..] {
            return Some((inside, host, len));
        }
    }
    None
}

async fn running_map(marker: u32) -> (u32, u32, u32) {
    wait_until(
        &format!("the process `sleep {marker}` of a hostUsers: false pod to run"),
        WAIT,
        || async move { uid_map_of(marker) },
    )
    .await
}

#[tokio::test]
async fn pods_without_host_users_get_their_own_disjoint_id_ranges_kept_across_restarts() {
    let mut agent = Agent::new("e2e-userns");
    agent.write_manifest("a.yaml", &userns_pod("a", 3601));
    agent.write_manifest("b.yaml", &userns_pod("b", 3602));
    agent.start();
    agent.wait_healthy(WAIT).await;

    let a = running_map(3601).await;
    let b = running_map(3602).await;
    for (name, (inside, host, len)) in [("a", a), ("b", b)] {
        assert_eq!(inside, 0, "{name}: root is the first mapped ID");
        assert!(
            host >= 65536,
            "{name}: root maps to host UID {host}, a host user's"
        );
        assert_eq!(len, 65536, "{name}: 65536 IDs per pod");
    }
    assert!(
        a.1 + a.2 <= b.1 || b.1 + b.2 <= a.1,
        "the two pods' ranges overlap: {a:?} {b:?}"
    );

    // The container wrote its emptyDir as its root.
    let uid = wait_until("pod a in /pods with its UID", WAIT, || async {
        agent.pod("a").await?["metadata"]["uid"]
            .as_str()
            .map(str::to_string)
    })
    .await;
    let pod_dir = agent.root_dir().join("pods").join(&uid);
    let file = pod_dir.join("volumes/kubernetes.io~empty-dir/data/f");
    assert_eq!(
        std::fs::read_to_string(&file).unwrap_or_default(),
        "hello\n",
        "the emptyDir file {} written by the container",
        file.display()
    );
    assert!(
        pod_dir.join("userns").is_file(),
        "the mappings file is kept in the pod's directory"
    );

    // A restarted agent reads the ranges back: the running pods keep theirs, and a new pod
    // gets neither.
    agent.stop();
    agent.write_manifest("c.yaml", &userns_pod("c", 3603));
    agent.start();
    agent.wait_healthy(WAIT).await;
    let c = running_map(3603).await;
    for other in [a, b] {
        assert!(
            c.1 + c.2 <= other.1 || other.1 + other.2 <= c.1,
            "the pod added after the restart got a range in use: {c:?} overlaps {other:?}"
        );
    }
    assert_eq!(uid_map_of(3601), Some(a), "pod a kept its mapping");
    assert_eq!(uid_map_of(3602), Some(b), "pod b kept its mapping");

    // A removed pod's range is freed with its directory.
    agent.remove_manifest("a.yaml");
    wait_until("pod a's directory to go", WAIT, || async {
        (!pod_dir.exists()).then_some(())
    })
    .await;
}
