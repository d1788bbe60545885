//! End to end, against the private containerd: a subPath that another container of the pod
//! swaps between a directory and a symlink to a host directory never shows the host's files,
//! and `fsGroup` owns the pod's emptyDir and downwardAPI volumes.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Agent, wait_until};

const BUSYBOX: &str = "localhost/deckhand/busybox:1.35";
const WAIT: Duration = Duration::from_secs(25);

/// Mount points at or below `dir` in this process's mount table.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(PathBuf::from))
        .filter(|p| p.starts_with(&dir))
        .collect()
}

/// Unmounts (lazily) whatever a failed test left mounted under a directory, so that removing
/// the test's temporary directory cannot reach into a volume. Declared after the agent, so it
/// runs before the agent's directory is deleted.
struct UnmountOnDrop(PathBuf);

impl Drop for UnmountOnDrop {
    fn drop(&mut self) {
        let mut left = mounts_under(&self.0);
        left.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        for point in left {
            let _ = nix::mount::umount2(&point, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

async fn pod_uid(agent: &Agent, name: &str) -> String {
    wait_until(&format!("pod {name} in /pods"), WAIT, || async {
        let pod = agent.pod(name).await?;
        pod["metadata"]["uid"].as_str().map(str::to_string)
    })
    .await
}

#[tokio::test]
async fn a_sub_path_swapped_for_a_symlink_never_shows_the_host() {
    let mut agent = Agent::new("e2e-subpath-race");
    agent.backoff("100ms", "300ms");
    let _unmount = UnmountOnDrop(agent.dir.path().to_path_buf());
    // The host directory the symlink points to, with a file no container may ever see.
    let host = agent.dir.path().join("host-secret");
    std::fs::create_dir_all(&host).unwrap();
    std::fs::write(host.join("host-sentinel"), "host only\n").unwrap();
    agent.start();
    agent.wait_healthy(WAIT).await;
    // `swapper` flips `sub` between the real directory and a symlink to the host directory,
    // each state held for a moment; `victim` mounts `sub` with subPath, records what it sees
    // and exits, so it is started again and again while the swapping goes on.
    agent.write_manifest(
        "race.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: race
spec:
  terminationGracePeriodSeconds: 1
  restartPolicy: Always
  containers:
  - name: swapper
    image: {BUSYBOX}
    command:
    - sh
    - -c
    - |
      mkdir -p /vol/sub && echo inside > /vol/sub/marker
      while :; do
        # An empty `sub` Deckhand made just before the `mv` below swallows the real one
        # (`mv` into a directory nests): put the real directory back first.
        m=$(find /vol -name marker | head -n 1)
        if [ -n "$m" ] && [ "$m" != /vol/sub/marker ]; then
          mv "${{m%/marker}}" /vol/real; rm -rf /vol/sub; mv /vol/real /vol/sub
        fi
        mv /vol/sub /vol/parked; ln -s {host} /vol/sub; usleep 3000
        rm -f /vol/sub
        # Deckhand may have made an empty `sub` while it was parked: drop that one.
        [ -d /vol/sub ] && [ ! -L /vol/sub ] && rm -rf /vol/sub
        mv /vol/parked /vol/sub; usleep 3000
      done 2>/dev/null
    volumeMounts:
    - {{name: shared, mountPath: /vol}}
  - name: victim
    image: {BUSYBOX}
    command:
    - sh
    - -c
    - |
      if [ -e /data/host-sentinel ]; then r=HOST; elif [ -e /data/marker ]; then r=inside; else r="other:$(ls -A /data | tr '\n' ' ')"; fi
      echo "$r" >> /report/log
      sleep 0.2
      exit 1
    volumeMounts:
    - {{name: shared, mountPath: /data, subPath: sub}}
    - {{name: report, mountPath: /report}}
  volumes:
  - name: shared
    emptyDir: {{}}
  - name: report
    emptyDir: {{}}
"#,
            host = host.display()
        ),
    );
    let uid = pod_uid(&agent, "race").await;
    let pod_dir = agent.root_dir().join("pods").join(&uid);
    let report = pod_dir.join("volumes/kubernetes.io~empty-dir/report/log");
    let starts = 10;
    let seen = wait_until(
        &format!("{starts} starts of the victim"),
        Duration::from_secs(120),
        || {
            let text = std::fs::read_to_string(&report).unwrap_or_default();
            async move { (text.lines().count() >= starts).then_some(text) }
        },
    )
    .await;
    eprintln!("the victim saw:\n{seen}");
    assert!(
        !seen.lines().any(|l| l == "HOST"),
        "the host directory was mounted into the container:\n{seen}"
    );
    assert!(seen.lines().any(|l| l == "inside"), "{seen}");
    assert_eq!(
        std::fs::read_to_string(host.join("host-sentinel")).unwrap(),
        "host only\n"
    );
    // The private bind mounts live under the pod's directory.
    let subpaths = pod_dir.canonicalize().unwrap().join("volume-subpaths");
    assert!(
        mounts_under(&subpaths)
            .iter()
            .all(|p| p.starts_with(subpaths.join("shared/victim"))),
        "{:?}",
        mounts_under(&subpaths)
    );

    agent.remove_manifest("race.yaml");
    wait_until("the pod directory to be removed", WAIT, || {
        let gone = !pod_dir.exists();
        async move { gone.then_some(()) }
    })
    .await;
    assert_eq!(mounts_under(&agent.root_dir()), Vec::<PathBuf>::new());
    assert!(host.join("host-sentinel").is_file());
}

#[tokio::test]
async fn fs_group_owns_empty_dir_and_downward_api_volumes() {
    let mut agent = Agent::new("e2e-subpath-fsgroup");
    let _unmount = UnmountOnDrop(agent.dir.path().to_path_buf());
    agent.start();
    agent.wait_healthy(WAIT).await;
    agent.write_manifest(
        "owned.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: owned
  labels: {{app: owned}}
spec:
  terminationGracePeriodSeconds: 1
  securityContext:
    fsGroup: 2345
    fsGroupChangePolicy: OnRootMismatch
  containers:
  - name: app
    image: {BUSYBOX}
    command:
    - sh
    - -c
    - |
      touch /data/made-in-pod
      {{ stat -c '%g %a' /data; stat -c %g /data/made-in-pod; stat -L -c '%g %a' /info/labels; id -G; }} > /data/report.tmp
      mv /data/report.tmp /data/report
      exec sleep 3600
    volumeMounts:
    - {{name: data, mountPath: /data}}
    - {{name: info, mountPath: /info}}
  volumes:
  - name: data
    emptyDir: {{}}
  - name: info
    downwardAPI:
      items:
      - {{path: labels, fieldRef: {{fieldPath: metadata.labels}}}}
"#
        ),
    );
    let uid = pod_uid(&agent, "owned").await;
    let pod_dir = agent.root_dir().join("pods").join(&uid);
    let report = pod_dir.join("volumes/kubernetes.io~empty-dir/data/report");
    let text = wait_until("the container's report", WAIT, || {
        let text = std::fs::read_to_string(&report).ok();
        async move { text }
    })
    .await;
    let lines: Vec<&str> = text.lines().collect();
    // The volume root: group 2345, setgid, group rwx; a new file inherits the group; the
    // downwardAPI file is group-readable by 2345 (0644 | 0440).
    assert_eq!(lines[0], "2345 2777", "{text}");
    assert_eq!(lines[1], "2345", "{text}");
    assert_eq!(lines[2], "2345 644", "{text}");
    assert!(lines[3].split(' ').any(|g| g == "2345"), "{text}");

    agent.remove_manifest("owned.yaml");
    wait_until("the pod directory to be removed", WAIT, || {
        let gone = !pod_dir.exists();
        async move { gone.then_some(()) }
    })
    .await;
}
