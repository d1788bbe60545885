//! End to end, against the private containerd: hostile or broken static-pod input. A manifest
//! whose UID would walk out of the pod directories is refused and nothing outside is touched;
//! a manifest that is half-written, or a manifest directory that cannot be listed, leaves the
//! pods it had running.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Agent, containers_of, cri, sandboxes_of, wait_until};
use serde_json::Value;

const BUSYBOX: &str = "localhost/deckhand/busybox:1.35";
const WAIT: Duration = Duration::from_secs(60);

fn sleeper(name: &str, uid: Option<&str>) -> String {
    let uid = uid.map(|u| format!("  uid: {u:?}\n")).unwrap_or_default();
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: {name}
{uid}spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: main
    image: {BUSYBOX}
    command: [\"sh\", \"-c\", \"trap 'exit 0' TERM; sleep 3600 & wait\"]
"
    )
}

/// Waits until `/pods` shows the pod Running with a running container.
async fn wait_running(agent: &Agent, name: &str) -> Value {
    wait_until(&format!("pod {name} Running in /pods"), WAIT, || async {
        let pod = agent.pod(name).await?;
        let running = pod["status"]["phase"] == "Running"
            && pod["status"]["containerStatuses"][0]["state"]["running"].is_object();
        running.then_some(pod)
    })
    .await
}

/// The IDs of the pod's running containers, per CRI.
async fn running_containers(agent: &Agent, name: &str) -> Vec<String> {
    let client = cri().await;
    let mut ids: Vec<String> = containers_of(&client, &agent.pod_name(name))
        .await
        .into_iter()
        .filter(|c| c.state == 1)
        .map(|c| c.id)
        .collect();
    ids.sort();
    ids
}

/// Lines of the agent's log where the merger removed the pod.
fn removals(agent: &Agent, name: &str) -> Vec<String> {
    let full = format!("default/{}", agent.pod_name(name));
    agent
        .log()
        .lines()
        .filter(|l| l.contains("pod config change") && l.contains("remove") && l.contains(&full))
        .map(str::to_string)
        .collect()
}

/// A UID such as `x/../../…/<sentinel>` would make the pod directory (and the log directory,
/// removed on teardown) the sentinel itself. It is refused with the file named, the good pod
/// beside it runs, and after both are gone the sentinel is still there.
#[tokio::test]
async fn a_uid_that_walks_out_of_the_pod_dirs_is_refused() {
    let mut agent = Agent::new("e2e-sh-uid");
    let sentinel = agent.dir.path().join("victim");
    std::fs::create_dir_all(&sentinel).unwrap();
    std::fs::write(sentinel.join("keep"), "precious").unwrap();
    // From any directory: `x/..` cancels `x`, enough `..` reach `/`, then the absolute path.
    let relative = sentinel.strip_prefix("/").unwrap().display().to_string();
    let evil_uid = format!("x/{}{relative}", "../".repeat(24));

    agent.start();
    agent.wait_healthy(WAIT).await;
    agent.write_manifest("evil.yaml", &sleeper("evil", Some(&evil_uid)));
    agent.write_manifest("good.yaml", &sleeper("good", None));

    wait_running(&agent, "good").await;
    let evil_file = agent.manifests().join("evil.yaml").display().to_string();
    let refusal = wait_until("the evil manifest to be refused", WAIT, || async {
        agent
            .log()
            .lines()
            .find(|l| l.contains(&evil_file) && l.contains("metadata.uid"))
            .map(str::to_string)
    })
    .await;
    assert!(refusal.contains("not a safe UID"), "{refusal}");
    assert!(
        agent.pod("evil").await.is_none(),
        "the evil pod was admitted"
    );
    let client = cri().await;
    assert!(
        sandboxes_of(&client, &agent.pod_name("evil"))
            .await
            .is_empty()
    );

    // Both go; the good pod's teardown (pod dir, log dir) leaves the sentinel alone.
    agent.remove_manifest("evil.yaml");
    agent.remove_manifest("good.yaml");
    wait_until("the good pod to be torn down", WAIT, || async {
        sandboxes_of(&client, &agent.pod_name("good"))
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    assert_eq!(
        common::read(&sentinel.join("keep")).as_deref(),
        Some("precious"),
        "the sentinel outside the pod dirs was touched"
    );
    assert!(
        !agent.root_dir().join("pods").join("x").exists(),
        "a directory was made from the UID's first component"
    );
    agent.stop();
}

/// A half-written manifest, then a manifest directory that cannot be listed even by root (a
/// symlink loop where it was): the pod keeps running in the same container throughout.
/// Deleting the manifest still removes the pod.
#[tokio::test]
async fn unreadable_manifests_keep_their_pods_running() {
    let mut agent = Agent::new("e2e-sh-unreadable");
    agent
        .extra_args
        .push("--file-check-frequency=1s".to_string());
    agent.start();
    agent.wait_healthy(WAIT).await;
    let original = sleeper("keep", None);
    agent.write_manifest("keep.yaml", &original);
    let pod = wait_running(&agent, "keep").await;
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
    let containers = running_containers(&agent, "keep").await;
    assert_eq!(containers.len(), 1, "{containers:?}");

    // 1. Half-written in place (as a non-atomic writer leaves it), then a marker pod: a scan
    //    that sees the marker saw the broken file too.
    let manifests = agent.manifests();
    std::fs::write(manifests.join("keep.yaml"), &original[..original.len() / 2]).unwrap();
    agent.write_manifest("marker-1.yaml", &sleeper("marker-1", None));
    wait_running(&agent, "marker-1").await;
    assert_still_running(&agent, &uid, &containers).await;

    // 2. The directory becomes a symlink loop (ELOOP: no permission bit stops root). The
    //    failure is logged; then the directory comes back with a second marker.
    let away = agent.dir.path().join("manifests.away");
    std::fs::rename(&manifests, &away).unwrap();
    std::os::unix::fs::symlink("manifests", &manifests).unwrap();
    let dir_text = manifests.display().to_string();
    wait_until("the unlistable directory to be reported", WAIT, || async {
        agent
            .log()
            .lines()
            .any(|l| l.contains(&dir_text) && l.contains("cannot read") && !l.contains(".yaml"))
            .then_some(())
    })
    .await;
    std::fs::remove_file(&manifests).unwrap();
    write_atomically(&away, "marker-2.yaml", &sleeper("marker-2", None));
    std::fs::rename(&away, &manifests).unwrap();
    wait_running(&agent, "marker-2").await;
    assert_still_running(&agent, &uid, &containers).await;

    // 3. The same content again: the same UID, nothing to do; then a deletion removes it.
    agent.write_manifest("keep.yaml", &original);
    agent.remove_manifest("keep.yaml");
    let client = cri().await;
    wait_until(
        "the deleted manifest's pod to be torn down",
        WAIT,
        || async {
            sandboxes_of(&client, &agent.pod_name("keep"))
                .await
                .is_empty()
                .then_some(())
        },
    )
    .await;
    assert_eq!(removals(&agent, "keep").len(), 1, "{}", agent.log());
    agent.stop();
}

async fn assert_still_running(agent: &Agent, uid: &str, containers: &[String]) {
    assert!(
        removals(agent, "keep").is_empty(),
        "the pod was removed: {:?}",
        removals(agent, "keep")
    );
    let pod = agent.pod("keep").await.expect("the pod is still listed");
    assert_eq!(pod["metadata"]["uid"], uid);
    assert_eq!(pod["status"]["phase"], "Running");
    assert_eq!(running_containers(agent, "keep").await, containers);
}

fn write_atomically(dir: &Path, file: &str, text: &str) {
    let tmp = dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join(file)).unwrap();
}
