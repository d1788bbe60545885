//! The loops' passes on the fake runtime and real temporary files.

use super::*;
use crate::clients::cri::fake::{FakeCri, Script};
use crate::clients::cri::proto::{
    ContainerMetadata, FilesystemIdentifier, FilesystemUsage, Image, ImageFsInfoResponse,
    PodSandboxMetadata,
};

const NODE: &str = "gc-node";

fn tempdir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("deckhand-gcrun-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn ours(uid: &str, name: Option<&str>) -> HashMap<String, String> {
    let mut l = managed_selector(NODE);
    l.insert(cri_labels::POD_UID_LABEL.into(), uid.into());
    l.insert(cri_labels::POD_NAME_LABEL.into(), format!("pod-{uid}"));
    l.insert(cri_labels::POD_NAMESPACE_LABEL.into(), "default".into());
    if let Some(name) = name {
        l.insert(cri_labels::CONTAINER_NAME_LABEL.into(), name.into());
    }
    l
}

fn container(id: &str, uid: &str, attempt: u32, state: ContainerState) -> Container {
    Container {
        id: id.into(),
        pod_sandbox_id: format!("sb-{uid}"),
        metadata: Some(ContainerMetadata {
            name: "app".into(),
            attempt,
        }),
        state: state as i32,
        created_at: i64::from(attempt) + 1,
        labels: ours(uid, Some("app")),
        ..Default::default()
    }
}

fn sandbox(id: &str, uid: &str, ready: bool, at: i64) -> PodSandbox {
    PodSandbox {
        id: id.into(),
        metadata: Some(PodSandboxMetadata {
            name: format!("pod-{uid}"),
            uid: uid.into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        state: if ready {
            PodSandboxState::SandboxReady
        } else {
            PodSandboxState::SandboxNotready
        } as i32,
        created_at: at,
        labels: ours(uid, None),
        ..Default::default()
    }
}

fn context(rt: FakeCri, logs: &Path, ready: bool) -> GcContext<FakeCri> {
    GcContext {
        rt,
        node_name: NODE.into(),
        pod_logs_dir: logs.to_path_buf(),
        activity: WorkerActivity::default(),
        sources_ready: Arc::new(move || ready),
    }
}

#[tokio::test]
async fn container_gc_removes_old_dead_instances_with_their_logs() {
    let logs = tempdir("cgc");
    let dir = logs.join("default_pod-p_p/app");
    std::fs::create_dir_all(&dir).unwrap();
    let rt = FakeCri::default();
    rt.add_sandbox(sandbox("sb-p", "p", true, 10));
    rt.add_sandbox(sandbox("sb-old", "p", false, 1));
    for attempt in 0..4 {
        let state = if attempt == 3 {
            ContainerState::ContainerRunning
        } else {
            ContainerState::ContainerExited
        };
        let id = format!("c{attempt}");
        rt.add_container(container(&id, "p", attempt, state));
        let path = dir.join(format!("{attempt}.log"));
        std::fs::write(&path, "x").unwrap();
        rt.set_log_path(&id, path.to_str().unwrap());
    }
    // A log whose container the executor removed earlier.
    std::fs::write(dir.join("7.log"), "x").unwrap();
    std::fs::File::options()
        .write(true)
        .open(dir.join("7.log"))
        .unwrap()
        .set_modified(SystemTime::now() - Duration::from_secs(60))
        .unwrap();
    std::fs::write(dir.join("0.log.20261201-120000.gz"), "x").unwrap();
    // Another node's dead container is not ours.
    let mut foreign = container("x", "q", 0, ContainerState::ContainerExited);
    foreign
        .labels
        .insert(cri_labels::NODE_LABEL.into(), "other".into());
    rt.add_container(foreign);
    let ctx = context(rt.clone(), &logs, true);
    ctx.activity.set("p", false);

    let done = container_gc_pass(&ctx, ContainerGcPolicy::default())
        .await
        .unwrap();
    let mut removed = done.containers.clone();
    removed.sort();
    assert_eq!(removed, vec!["c0", "c1"]);
    assert_eq!(done.sandboxes, vec!["sb-old"]);
    let mut left = files::dir_names(&dir).unwrap();
    left.sort();
    assert_eq!(left, vec!["2.log", "3.log"]);
    let ids: Vec<String> = rt.containers().into_iter().map(|c| c.id).collect();
    assert_eq!(ids, vec!["c2", "c3", "x"]);

    // A pod being torn down, or one not known before the sources are ready, is left alone.
    for (terminating, ready) in [(Some(true), true), (None, false)] {
        let rt = FakeCri::default();
        rt.add_container(container("d0", "t", 0, ContainerState::ContainerExited));
        rt.add_container(container("d1", "t", 1, ContainerState::ContainerExited));
        rt.add_sandbox(sandbox("sb-t", "t", false, 1));
        let ctx = context(rt.clone(), &logs, ready);
        if let Some(t) = terminating {
            ctx.activity.set("t", t);
        }
        let done = container_gc_pass(&ctx, ContainerGcPolicy::default())
            .await
            .unwrap();
        assert_eq!(done, ContainerGcPlan::default(), "{terminating:?} {ready}");
        assert_eq!(rt.containers().len(), 2);
    }
    std::fs::remove_dir_all(&logs).unwrap();
}

fn listed(id: &str, tag: &str, pinned: bool) -> Image {
    Image {
        id: id.into(),
        repo_tags: vec![tag.into()],
        size: 1024,
        pinned,
        ..Default::default()
    }
}

#[tokio::test]
async fn image_gc_removes_only_unused_unpinned_images() {
    let rt = FakeCri::default();
    rt.set_listed_images(vec![
        listed("sha256:used", "example/used:1", false),
        listed("sha256:byname", "example/byname:1", false),
        listed("sha256:unused", "example/unused:1", false),
        listed("sha256:pause", "example/pause:1", true),
        listed("sha256:kept", "example/kept:1", false),
        listed("sha256:sandbox", "example/sandbox:1", false),
    ]);
    rt.set_status_info("config", r#"{"sandboxImage": "example/sandbox:1"}"#);
    rt.add_container(Container {
        id: "a".into(),
        image_ref: "sha256:used".into(),
        state: ContainerState::ContainerExited as i32,
        ..Default::default()
    });
    rt.add_container(Container {
        id: "b".into(),
        image: Some(crate::clients::cri::proto::ImageSpec {
            image: "example/byname:1".into(),
            ..Default::default()
        }),
        ..Default::default()
    });
    rt.set_image_fs(ImageFsInfoResponse {
        image_filesystems: vec![FilesystemUsage {
            fs_id: Some(FilesystemIdentifier {
                mountpoint: "/".into(),
            }),
            ..Default::default()
        }],
        ..Default::default()
    });
    // Thresholds every real filesystem is above: free everything that may go.
    let policy = ImageGcPolicy {
        high_threshold_percent: 1,
        low_threshold_percent: 0,
        min_age: Duration::ZERO,
        max_age: Duration::ZERO,
    };
    let mut state = ImageGc {
        tracker: ImageTracker::default(),
        began: Instant::now(),
    };
    let removed = image_gc_pass(&rt, &mut state, policy, &["example/kept:1".to_string()])
        .await
        .unwrap();
    assert_eq!(removed, vec!["sha256:unused"]);
    assert_eq!(rt.listed_images().len(), 5);
    assert_eq!(rt.count("ImageFsInfo"), 1);
}

#[tokio::test]
async fn reclaim_removes_every_unused_image_the_shared_record_has_seen_long_enough() {
    let rt = FakeCri::default();
    let image = |id: &str, size: u64| Image {
        size,
        ..listed(
            id,
            &format!("example/{}:1", id.trim_start_matches("sha256:")),
            false,
        )
    };
    rt.set_listed_images(vec![
        image("sha256:used", 1 << 20),
        image("sha256:big", 64 << 20),
        image("sha256:small", 1024),
        listed("sha256:pause", "example/pause:1", true),
    ]);
    rt.add_container(Container {
        id: "a".into(),
        image_ref: "sha256:used".into(),
        state: ContainerState::ContainerRunning as i32,
        ..Default::default()
    });
    let min_age = Duration::from_secs(120);

    // Pressure in the agent's first minutes: the images were all first seen just now.
    let shared = ImageGc::shared();
    assert_eq!(
        record_images(&rt, &mut *shared.lock().await, &[])
            .await
            .unwrap(),
        4
    );
    let removed = delete_unused_images(&rt, &mut *shared.lock().await, min_age, &[])
        .await
        .unwrap();
    assert_eq!(removed, Vec::<String>::new());
    assert_eq!(rt.listed_images().len(), 4);

    // The periodic GC saw them five minutes ago: all the unused ones go, whatever the
    // filesystem's usage (no ImageFsInfo asked), and no byte goal stops it early.
    let mut state = shared.lock().await;
    let listed_now: Vec<ListedImage> = rt
        .listed_images()
        .into_iter()
        .map(|i| ListedImage {
            id: i.id,
            size: i.size,
            pinned: i.pinned,
        })
        .collect();
    state.tracker = ImageTracker::default();
    state.tracker.observe(
        &listed_now,
        &HashSet::new(),
        Instant::now() - Duration::from_secs(300),
    );
    let mut removed = delete_unused_images(&rt, &mut state, min_age, &[])
        .await
        .unwrap();
    removed.sort();
    assert_eq!(removed, vec!["sha256:big", "sha256:small"]);
    let mut left: Vec<String> = rt.listed_images().into_iter().map(|i| i.id).collect();
    left.sort();
    assert_eq!(left, vec!["sha256:pause", "sha256:used"]);
    assert_eq!(rt.count("ImageFsInfo"), 0);
}

#[tokio::test]
async fn rotation_renames_reopens_and_undoes_a_failed_reopen() {
    let dir = tempdir("rotate");
    let log = dir.join("0.log");
    let rt = FakeCri::default();
    rt.add_container(container("r", "p", 0, ContainerState::ContainerRunning));
    rt.add_container(container("e", "p", 1, ContainerState::ContainerExited));
    rt.set_log_path("r", log.to_str().unwrap());
    std::fs::write(&log, vec![b'x'; 2048]).unwrap();
    std::fs::write(dir.join("0.log.20200101-000000"), "older").unwrap();
    let ctx = context(rt.clone(), &dir, true);
    let policy = RotationPolicy {
        max_size: 1024,
        max_files: 5,
        workers: 2,
        interval: Duration::from_secs(10),
    };

    let paths = LogPaths::default();

    // The runtime cannot reopen: the file is renamed back, nothing lost.
    rt.script("ReopenContainerLog", Script::Fail(tonic::Code::Unavailable));
    assert_eq!(rotate_logs_pass(&ctx, policy, &paths).await.unwrap(), 0);
    let mut names = files::dir_names(&dir).unwrap();
    names.sort();
    assert_eq!(names, vec!["0.log", "0.log.20200101-000000.gz"]);
    assert_eq!(std::fs::metadata(&log).unwrap().len(), 2048);

    assert_eq!(rotate_logs_pass(&ctx, policy, &paths).await.unwrap(), 1);
    let names = files::dir_names(&dir).unwrap();
    assert!(!names.contains(&"0.log".to_string()), "{names:?}");
    assert!(
        names.iter().any(|n| n.starts_with("0.log.2")
            && !n.ends_with(".gz")
            && !n.starts_with("0.log.2020")),
        "{names:?}"
    );
    assert_eq!(rt.count("ReopenContainerLog"), 2);

    // Under the size nothing happens.
    std::fs::write(&log, "small").unwrap();
    assert_eq!(rotate_logs_pass(&ctx, policy, &paths).await.unwrap(), 0);
    assert_eq!(rt.count("ReopenContainerLog"), 2);
    // The log path was asked once, for the running container only.
    assert_eq!(rt.count("ContainerStatus"), 1);
    assert_eq!(paths.len(), 1);

    // A container that stopped running is forgotten.
    rt.exit_container("r");
    assert_eq!(rotate_logs_pass(&ctx, policy, &paths).await.unwrap(), 0);
    assert!(paths.is_empty());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn a_fast_growing_log_is_looked_at_between_passes() {
    let dir = tempdir("rotate-fast");
    let log = dir.join("0.log");
    let rt = FakeCri::default();
    rt.add_container(container("r", "p", 0, ContainerState::ContainerRunning));
    rt.set_log_path("r", log.to_str().unwrap());
    let ctx = context(rt.clone(), &dir, true);
    let policy = RotationPolicy {
        max_size: 10_000,
        max_files: 5,
        workers: 2,
        interval: Duration::from_secs(10),
    };
    let paths = LogPaths::default();
    std::fs::write(&log, vec![b'x'; 1000]).unwrap();
    assert_eq!(rotate_logs_pass(&ctx, policy, &paths).await.unwrap(), 0);
    // A first look plans a second one a second later, to see how fast the log grows: not
    // at all, so nothing more is planned.
    assert_eq!(
        rotate_growing_logs(&ctx, policy, &paths, Instant::now()).await,
        0
    );
    assert_eq!(rt.count("ContainerStatus"), 1);
    let later = Instant::now() + FAST_CHECK + Duration::from_millis(100);
    assert_eq!(rotate_growing_logs(&ctx, policy, &paths, later).await, 0);
    assert!(paths.due(later + Duration::from_secs(5)).is_empty());
    // 5000 bytes in a few milliseconds: full within the second, looked at after one.
    std::fs::write(&log, vec![b'x'; 6000]).unwrap();
    assert_eq!(rotate_logs_pass(&ctx, policy, &paths).await.unwrap(), 0);
    let lists = rt.count("ListContainers");
    assert_eq!(
        rotate_growing_logs(&ctx, policy, &paths, Instant::now()).await,
        0,
        "not due yet"
    );
    std::fs::write(&log, vec![b'x'; 12_000]).unwrap();
    let due = Instant::now() + FAST_CHECK + Duration::from_millis(100);
    assert_eq!(rotate_growing_logs(&ctx, policy, &paths, due).await, 1);
    assert!(!log.exists(), "the log was rotated");
    assert_eq!(rt.count("ListContainers"), lists, "no full pass in between");
    assert_eq!(rt.count("ReopenContainerLog"), 1);
    std::fs::remove_dir_all(&dir).unwrap();
}
