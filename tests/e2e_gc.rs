//! End to end, against the private containerd: the container GC trims a crash loop's dead
//! instances and their logs, and container log rotation renames, compresses and limits a
//! fast-growing log while the container keeps writing to `<n>.log` (CRI ReopenContainerLog).
//!
//! Image GC is covered by unit tests only: its thresholds are percentages of the whole disk,
//! and on a runtime shared by the suite a pass that frees space may remove any image no
//! container uses at that moment, the suite's own included.

mod common;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;

const WAIT: Duration = Duration::from_secs(60);

/// The log directory of the static pod `full` (`<ns>_<name>_<uid>/<container>`).
fn container_log_dir(logs: &Path, full: &str, container: &str) -> Option<PathBuf> {
    let prefix = format!("default_{full}_");
    std::fs::read_dir(logs)
        .ok()?
        .filter_map(Result::ok)
        .find(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path().join(container))
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[tokio::test]
async fn container_gc_keeps_one_dead_instance_of_a_crash_loop() {
    let cri = cri().await;
    let mut agent = Agent::new("e2e-gc-crash");
    agent.backoff("2s", "2s");
    agent
        .env
        .push(("DECKHAND_CONTAINER_GC_PERIOD".into(), "500ms".into()));
    agent.start();
    agent.wait_healthy(WAIT).await;
    agent.write_manifest(
        "crash.yaml",
        &common::crashing_pod("echo attempt; sleep 1; exit 1"),
    );
    let full = agent.pod_name("crash");
    let started = Instant::now();
    // Only this run's instances: a container an earlier run's agent was creating when it was
    // killed can outlive that run's clean-up.
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
        - 5_000_000_000;
    // While the newest instance waits out its back-off the executor keeps it and the one
    // before; the GC takes that one away: one dead instance, nothing running, and the logs
    // of the removed instances gone too.
    let (restarts, files) = wait_until("a crash loop trimmed to one dead instance", WAIT, || {
        let (cri, agent, full) = (&cri, &agent, &full);
        async move {
            let cs: Vec<_> = containers_of(cri, full)
                .await
                .into_iter()
                .filter(|c| c.created_at > since)
                .collect();
            let restarts = cs
                .iter()
                .filter_map(|c| c.metadata.as_ref())
                .map(|m| m.attempt)
                .max()?;
            let running = cs.iter().filter(|c| c.state == 1).count();
            let dead = cs.iter().filter(|c| c.state == 2).count();
            let dir = container_log_dir(&agent.logs_dir(), full, "crash")?;
            let files = names(&dir);
            (restarts >= 3 && dead == 1 && running == 0 && files.len() <= 2)
                .then_some((restarts, files))
        }
    })
    .await;
    eprintln!(
        "crash loop trimmed after {:.1}s, at restart {restarts}; log files {files:?}",
        started.elapsed().as_secs_f64()
    );
    let log = agent.log();
    assert!(
        log.contains("container GC removed a dead container"),
        "the GC (not only the executor) removed an instance"
    );
    // Never more than the running instance, one dead one and the one the executor keeps
    // until the next pass.
    let total = containers_of(&cri, &full)
        .await
        .iter()
        .filter(|c| c.created_at > since)
        .count();
    assert!(total <= 3, "{total} instances");
    // Stop the pod through the agent, so no restart is half-way when the agent is killed.
    agent.remove_manifest("crash.yaml");
    wait_until("the crash loop's pod removed", WAIT, || {
        let (cri, full) = (&cri, &full);
        async move {
            (containers_of(cri, full).await.is_empty() && sandboxes_of(cri, full).await.is_empty())
                .then_some(())
        }
    })
    .await;
}

#[tokio::test]
async fn a_fast_log_is_rotated_compressed_and_limited() {
    let mut agent = Agent::new("e2e-gc-rotate");
    let config = agent.dir.path().join("config.yaml");
    std::fs::write(
        &config,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
         containerLogMaxSize: 4Ki\ncontainerLogMaxFiles: 3\n",
    )
    .unwrap();
    agent
        .extra_args
        .push(format!("--config={}", config.display()));
    agent.env.push((
        "DECKHAND_CONTAINER_LOG_MONITOR_INTERVAL".into(),
        "300ms".into(),
    ));
    agent.start();
    agent.wait_healthy(WAIT).await;
    // About 8 KiB a second, each line numbered.
    agent.write_manifest(
        "chatty.yaml",
        &format!(
            r#"apiVersion: v1
kind: Pod
metadata: {{name: chatty}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: app
    image: {BUSYBOX}
    command: ["sh", "-c", "i=0; while true; do i=$((i+1)); echo \"line $i padding padding padding padding padding padding padding padding padding\"; [ $((i % 10)) = 0 ] && sleep 0.1; done"]
"#
        ),
    );
    let full = agent.pod_name("chatty");
    let dir = wait_until("the pod's log directory", WAIT, || {
        let d = container_log_dir(&agent.logs_dir(), &full, "app");
        async move { d.filter(|d| d.join("0.log").exists()) }
    })
    .await;
    let started = Instant::now();
    let mut most = 0;
    let files = wait_until("rotations, compressed, at most 3 files", WAIT, || {
        let files: Vec<String> = names(&dir)
            .into_iter()
            .filter(|n| !n.ends_with(".tmp"))
            .collect();
        most = most.max(files.len());
        let gz = files.iter().filter(|n| n.ends_with(".gz")).count();
        let plain = files
            .iter()
            .filter(|n| n.starts_with("0.log.") && !n.ends_with(".gz"))
            .count();
        let ok = gz >= 1 && plain == 1 && files.contains(&"0.log".to_string());
        async move { ok.then_some(files) }
    })
    .await;
    eprintln!(
        "rotated and compressed within {:.1}s: {files:?}",
        started.elapsed().as_secs_f64()
    );
    assert!(most <= 3, "at most containerLogMaxFiles files, saw {most}");
    for name in &files {
        assert!(
            name == "0.log" || name.starts_with("0.log.20"),
            "rotated files are named <n>.log.<YYYYMMDD-HHMMSS>[.gz]: {name}"
        );
    }
    // The compressed file holds CRI log lines.
    let gz = files.iter().find(|n| n.ends_with(".gz")).unwrap();
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(dir.join(gz)).unwrap())
        .read_to_string(&mut text)
        .unwrap();
    assert!(
        text.contains(" stdout F line "),
        "{}",
        &text[..text.len().min(200)]
    );
    let last_rotated = text
        .lines()
        .filter_map(|l| {
            l.split("line ")
                .nth(1)?
                .split(' ')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .max()
        .unwrap();
    // The container goes on writing into 0.log, past what was rotated away.
    wait_until("newer lines in 0.log", WAIT, || {
        let current = std::fs::read_to_string(dir.join("0.log")).unwrap_or_default();
        let newest = current
            .lines()
            .filter_map(|l| {
                l.split("line ")
                    .nth(1)?
                    .split(' ')
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .max();
        async move { newest.filter(|n| *n > last_rotated) }
    })
    .await;
    assert!(
        agent.log().contains("rotated a container log"),
        "the agent logged its rotations"
    );
}

/// What image GC measures, on the real runtime (nothing is removed): containerd names its
/// image filesystem through CRI `ImageFsInfo`, and statvfs there gives a usage.
#[tokio::test]
async fn the_image_filesystem_can_be_measured() {
    use deckhand::clients::cri::{ImageService, RuntimeService};
    let cri = cri().await;
    let info = cri.image_fs_info().await.expect("ImageFsInfo answers");
    let fs = info
        .image_filesystems
        .first()
        .expect("containerd reports an image filesystem");
    let mountpoint = fs
        .fs_id
        .as_ref()
        .expect("with a mountpoint")
        .mountpoint
        .clone();
    let usage =
        deckhand::kubelet::gc::files::fs_usage(Path::new(&mountpoint)).expect("statvfs works");
    // Image GC keeps the sandbox image. containerd 1.6 neither pins it nor lists it as any
    // container's image, so GC reads it from the verbose status; containerd 2.x no longer
    // names it there (its `pinned_images` moved to the images plugin) but pins it in
    // ListImages, which GC never removes. Either way GC can tell.
    const PAUSE: &str = "localhost/deckhand/pause:3.10";
    let status = cri.status(true).await.expect("Status answers");
    let config: serde_json::Value = serde_json::from_str(
        status
            .info
            .get("config")
            .expect("a config in the status info"),
    )
    .expect("JSON");
    let named = config["sandboxImage"] == PAUSE;
    let pinned = cri
        .list_images()
        .await
        .expect("ListImages answers")
        .iter()
        .any(|i| i.pinned && i.repo_tags.iter().any(|t| t == PAUSE));
    assert!(
        named || pinned,
        "the sandbox image is neither named in the verbose status nor pinned: {}",
        config["sandboxImage"]
    );
    assert!(
        usage.capacity > 0 && usage.available <= usage.capacity,
        "{usage:?}"
    );
    eprintln!(
        "image filesystem {mountpoint}: {}% used, images {} bytes",
        usage.usage_percent(),
        fs.used_bytes.as_ref().map(|u| u.value).unwrap_or_default()
    );
}
