//! End to end, on containerd 2.x: an image volume (`volumes[].image`, the testbed's busybox,
//! already present) shows the image's files read-only (a write fails with EROFS), a `subPath`
//! into the image mounts that directory of it, and an image that cannot be pulled keeps only
//! the container mounting it waiting (`ErrImagePull`, then upstream's `ImagePullBackOff`
//! message) while the pod's other container runs. On a containerd that cannot mount images
//! (1.6) the container waits in `CreateContainerError` with a message naming the runtime.

mod common;

use std::time::Duration;

use common::{Agent, BUSYBOX, cri, wait_until};
use deckhand::clients::cri::RuntimeService;

const WAIT: Duration = Duration::from_secs(40);
const ABSENT: &str = "localhost/deckhand/absent-image-volume:1";

fn reader_pod() -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: reader
spec:
  terminationGracePeriodSeconds: 1
  volumes:
  - name: img
    image: {{reference: "{BUSYBOX}", pullPolicy: IfNotPresent}}
  - name: report
    emptyDir: {{}}
  containers:
  - name: app
    image: {BUSYBOX}
    command:
    - sh
    - -c
    - |
      r=/report/r
      [ -x /img/bin/busybox ] && echo whole=ok >> $r
      grep -q '^root:' /etc-img/passwd && echo sub=ok >> $r
      [ -e /etc-img/passwd ] && [ ! -e /etc-img/etc ] && echo sub=etc-only >> $r
      if touch /img/new 2>> $r; then echo write=allowed >> $r; else echo write=refused >> $r; fi
      echo done >> $r
      exec sleep 3600
    volumeMounts:
    - {{name: img, mountPath: /img}}
    - {{name: img, mountPath: /etc-img, subPath: etc}}
    - {{name: report, mountPath: /report}}
"#
    )
}

fn waiter_pod() -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: waiter
spec:
  terminationGracePeriodSeconds: 1
  volumes:
  - name: img
    image: {{reference: "{ABSENT}", pullPolicy: IfNotPresent}}
  containers:
  - name: uses
    image: {BUSYBOX}
    command: ["sleep", "3600"]
    volumeMounts:
    - {{name: img, mountPath: /img}}
  - name: other
    image: {BUSYBOX}
    command: ["sleep", "3600"]
"#
    )
}

/// The state of one container of a pod in `/pods`.
async fn container_state(agent: &Agent, pod: &str, container: &str) -> Option<serde_json::Value> {
    let p = agent.pod(pod).await?;
    p["status"]["containerStatuses"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == container)
        .map(|c| c["state"].clone())
}

async fn waiting(agent: &Agent, pod: &str, container: &str) -> Option<(String, String)> {
    let state = container_state(agent, pod, container).await?;
    let w = &state["waiting"];
    Some((
        w["reason"].as_str()?.to_string(),
        w["message"].as_str().unwrap_or_default().to_string(),
    ))
}

/// Whether the runtime is a containerd that mounts images (2.1 or later).
async fn runtime_mounts_images() -> bool {
    let version = cri().await.version().await.expect("CRI Version");
    let major_minor: Vec<u32> = version
        .runtime_version
        .trim_start_matches('v')
        .split('.')
        .take(2)
        .filter_map(|p| p.parse().ok())
        .collect();
    version.runtime_name != "containerd" || major_minor >= vec![2, 1]
}

#[tokio::test]
async fn image_volumes_are_read_only_images_and_a_missing_one_waits_alone() {
    let mounts_images = runtime_mounts_images().await;
    let mut agent = Agent::new("e2e-image-volumes");
    agent.write_manifest("reader.yaml", &reader_pod());
    agent.write_manifest("waiter.yaml", &waiter_pod());
    agent.start();
    agent.wait_healthy(WAIT).await;

    if !mounts_images {
        let (reason, message) = wait_until(
            "the reader's container to wait in CreateContainerError",
            WAIT,
            || async {
                waiting(&agent, "reader", "app")
                    .await
                    .filter(|(r, _)| r == "CreateContainerError")
            },
        )
        .await;
        assert_eq!(reason, "CreateContainerError");
        assert!(
            message.starts_with(
                "image volumes are not supported by the container runtime containerd "
            ),
            "{message}"
        );
        return;
    }

    // The reader: the image's files, read-only, and its `etc` through subPath.
    let uid = wait_until("the reader in /pods", WAIT, || async {
        let p = agent.pod("reader").await?;
        p["metadata"]["uid"].as_str().map(str::to_string)
    })
    .await;
    let report = agent
        .root_dir()
        .join("pods")
        .join(&uid)
        .join("volumes/kubernetes.io~empty-dir/report/r");
    let text = wait_until("the reader's report", WAIT, || async {
        std::fs::read_to_string(&report)
            .ok()
            .filter(|t| t.contains("done"))
    })
    .await;
    for line in ["whole=ok", "sub=ok", "sub=etc-only", "write=refused"] {
        assert!(
            text.contains(line),
            "{line} missing from the report:\n{text}"
        );
    }
    assert!(
        text.contains("Read-only file system"),
        "the write failed otherwise than with EROFS:\n{text}"
    );

    // The waiter: `uses` waits for the image, `other` runs.
    wait_until("the waiter's other container to run", WAIT, || async {
        let state = container_state(&agent, "waiter", "other").await?;
        state.get("running").map(|_| ())
    })
    .await;
    let (reason, message) = wait_until("uses to wait in ImagePullBackOff", WAIT, || async {
        waiting(&agent, "waiter", "uses")
            .await
            .filter(|(r, _)| r == "ImagePullBackOff")
    })
    .await;
    assert_eq!(reason, "ImagePullBackOff");
    assert!(
        message.starts_with(&format!(
            "Back-off pulling image \"{ABSENT}\": ErrImagePull: failed to pull image \"{ABSENT}\""
        )),
        "{message}"
    );
    let log = agent.log();
    assert!(log.contains(ABSENT), "the agent's log names the image");
}
