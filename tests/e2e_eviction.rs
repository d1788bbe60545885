//! End to end, against the real test control plane and the private containerd: the eviction
//! manager under real memory and disk pressure.
//!
//! - Memory: the hard `memory.available` threshold is set a little below what the node has
//!   free when the test starts; a BestEffort pod that takes 1 GiB is evicted (Failed, reason
//!   Evicted, upstream's message, an event), a Guaranteed pod keeps running, and
//!   MemoryPressure turns True, then False once the (shortened) transition period is over.
//! - Disk: the agent's root and log directories are on a 64 MiB tmpfs; a crash-looping
//!   container's first instance leaves a 24 MiB log; once the disk crosses the threshold, the
//!   dead instance is removed with its log before any pod is evicted, and DiskPressure clears.
//!
//! - Images: a containerd of the test's own keeps its root (content store and overlayfs
//!   snapshots, the image filesystem) on a 96 MiB tmpfs, with a third image no pod uses
//!   (`localhost/deckhand/filler:1`, 20 MiB). A ballast file takes the tmpfs below the
//!   `imagefs.available` threshold; the eviction manager removes the unused image (and only
//!   it), which alone takes the signal back over the threshold, and no pod is evicted.
//!
//! - Local storage limits (upstream's `evicted pods should be terminal`, and an emptyDir
//!   `sizeLimit`): with no node pressure at all, a pod writing 10 MiB into its writable layer
//!   under a 5Mi `ephemeral-storage` limit and a pod writing 2 MiB into a `sizeLimit: 1Mi`
//!   emptyDir are evicted (Failed, reason Evicted, upstream's messages and events, counted
//!   under upstream's signals), and a pod without limits writing as much keeps running.
//!
//! All need root (tmpfs, cgroups) and a cluster (`DECKHAND_TEST_CLUSTER`): evicted pods come
//! from the API server, since static pods are never evicted.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::cluster::{
    NamespaceCleanup, admin, create_namespace, joined_agent, sleeping_spec, wait_node_ready,
};
use common::pressure::{ConditionTrace, SmallFs, metrics_line, quick_rounds};
use common::wait_until;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};

const WAIT: Duration = Duration::from_secs(40);
const MI: u64 = 1 << 20;

fn phase_reason(p: &Pod) -> (Option<String>, Option<String>) {
    let s = p.status.as_ref();
    (
        s.and_then(|s| s.phase.clone()),
        s.and_then(|s| s.reason.clone()),
    )
}

async fn running(pods: &Api<Pod>, name: &str) -> bool {
    pods.get(name)
        .await
        .ok()
        .is_some_and(|p| phase_reason(&p).0.as_deref() == Some("Running"))
}

#[tokio::test]
async fn memory_pressure_evicts_the_besteffort_pod_and_keeps_the_guaranteed_one() {
    let started = Instant::now();
    let client = admin().await;
    let node = "dev-memory";
    // 1 GiB taken by the pod, the threshold 600 MiB below what is free now: the pod takes the
    // node 400 MiB past it, and other processes' noise of a few hundred MiB either way neither
    // triggers it early (the pod would still rank first) nor hides it.
    let threshold_mi = common::node_memory_available() / MI - 600;
    let (mut agent, _node_cleanup) = joined_agent(node);
    quick_rounds(
        &mut agent,
        &format!("memory.available<{threshold_mi}Mi,nodefs.available<1%,imagefs.available<1%"),
        "5s",
        "1s",
    );
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    let ns = "e2e-evict-memory";
    let _ns: NamespaceCleanup = create_namespace(&client, ns).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);

    let mut guaranteed = sleeping_spec(1);
    guaranteed["containers"][0]["resources"] = serde_json::json!({
        "requests": {"cpu": "100m", "memory": "64Mi"},
        "limits": {"cpu": "100m", "memory": "64Mi"},
    });
    let mut hog = sleeping_spec(1);
    // dd holds its 1 GiB buffer, filled from /dev/zero, while it waits to write it to a pipe
    // nobody reads.
    hog["containers"][0]["command"] =
        serde_json::json!(["sh", "-c", "dd if=/dev/zero bs=1024M count=1 | sleep 600"]);
    pods.create(
        &PostParams::default(),
        &common::cluster::bound_pod_with("guaranteed", node, guaranteed),
    )
    .await
    .unwrap();
    wait_until("the guaranteed pod running", WAIT, || async {
        running(&pods, "guaranteed").await.then_some(())
    })
    .await;
    let pressure = ConditionTrace::follow(client.clone(), node, "MemoryPressure");
    pods.create(
        &PostParams::default(),
        &common::cluster::bound_pod_with("hog", node, hog),
    )
    .await
    .unwrap();

    let evicted = wait_until("the BestEffort pod evicted", WAIT, || async {
        let p = pods.get("hog").await.ok()?;
        (phase_reason(&p) == (Some("Failed".into()), Some("Evicted".into()))).then_some(p)
    })
    .await;
    let message = evicted.status.unwrap().message.unwrap_or_default();
    let want = format!(
        "The node was low on resource: memory. Threshold quantity: {threshold_mi}Mi, available: "
    );
    assert!(message.starts_with(&want), "{message}");
    assert!(
        message.contains("Container app was using ")
            && message.ends_with(", request is 0, has larger consumption of memory. "),
        "{message}"
    );
    wait_until("the Evicted event", WAIT, || async {
        common::cluster::event_reasons(&client, ns, "hog")
            .await
            .into_iter()
            .any(|(reason, m)| reason == "Evicted" && m == message)
            .then_some(())
    })
    .await;
    let cri = common::cri().await;
    wait_until("the evicted pod's containers gone", WAIT, || async {
        common::containers_of(&cri, "hog")
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    // The pressure ends once the transition period (5 s) has passed without the threshold met.
    pressure.wait_came_and_went(WAIT).await;
    assert!(
        running(&pods, "guaranteed").await,
        "the Guaranteed pod keeps running"
    );
    let line = metrics_line(&agent, "kubelet_evictions{")
        .await
        .unwrap_or_default();
    assert_eq!(
        line, "kubelet_evictions{eviction_signal=\"memory.available\"} 1",
        "one eviction counted"
    );
    eprintln!(
        "memory eviction test took {:.1}s",
        started.elapsed().as_secs_f64()
    );
}

fn available(dir: &Path) -> u64 {
    let st = nix::sys::statvfs::statvfs(dir).unwrap();
    st.blocks_available() as u64 * st.fragment_size() as u64
}

#[tokio::test]
async fn disk_pressure_reclaims_dead_containers_before_evicting_pods() {
    let started = Instant::now();
    let client = admin().await;
    let node = "dev-disk";
    let (mut agent, _node_cleanup) = joined_agent(node);
    // The root and log directories on one 64 MiB filesystem.
    let mut mounts = SmallFs::mount(&agent.root_dir(), "size=64m");
    let logs_in_tmpfs = agent.root_dir().join("pod-logs");
    std::fs::create_dir_all(&logs_in_tmpfs).unwrap();
    mounts.bind(&logs_in_tmpfs, &agent.logs_dir());
    quick_rounds(
        &mut agent,
        "nodefs.available<20Mi,memory.available<100Mi,imagefs.available<1%",
        "3s",
        "1s",
    );
    // Instance 0 leaves its log and is restarted at once; instance 1 exits at once, and the
    // back-off that follows (upstream's 10 s) keeps both dead instances there while the test
    // fills the disk.
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    let ns = "e2e-evict-disk";
    let _ns = create_namespace(&client, ns).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);

    let mut filler = sleeping_spec(1);
    filler["containers"][0]["name"] = "filler".into();
    filler["containers"][0]["command"] = serde_json::json!([
        "sh",
        "-c",
        "if [ ! -f /data/once ]; then touch /data/once; head -c 24m /dev/zero | tr '\\0' x | fold -w 1000; fi; exit 1"
    ]);
    filler["containers"][0]["volumeMounts"] =
        serde_json::json!([{"name": "data", "mountPath": "/data"}]);
    filler["volumes"] = serde_json::json!([{"name": "data", "emptyDir": {}}]);
    for (name, spec) in [("sleeper", sleeping_spec(1)), ("filler", filler)] {
        pods.create(
            &PostParams::default(),
            &common::cluster::bound_pod_with(name, node, spec),
        )
        .await
        .unwrap();
    }
    // Both instances dead: restarted once and waiting in back-off again.
    let filler_pod = wait_until("the filler's second instance dead", WAIT, || async {
        let p = pods.get("filler").await.ok()?;
        let c = p
            .status
            .as_ref()?
            .container_statuses
            .as_ref()?
            .first()?
            .clone();
        let waiting = c.state.as_ref()?.waiting.as_ref()?.reason.clone();
        (c.restart_count >= 1 && waiting.as_deref() == Some("CrashLoopBackOff")).then_some(p)
    })
    .await;
    assert!(running(&pods, "sleeper").await);
    let uid = filler_pod.metadata.uid.clone().unwrap();
    // The agent reports an exit as soon as containerd's exit event arrives; containerd's CRI
    // shows the container exited only once it has deleted the task. Until then the container
    // GC would see one dead instance, not two, and keep it.
    let cri = common::cri().await;
    wait_until("both instances exited in the runtime", WAIT, || async {
        let mine: Vec<_> = common::containers_of(&cri, "filler")
            .await
            .into_iter()
            .filter(|c| c.labels.get("io.kubernetes.pod.uid") == Some(&uid))
            .collect();
        (mine.len() >= 2
            && mine.iter().all(|c| {
                c.state == deckhand::clients::cri::proto::ContainerState::ContainerExited as i32
            }))
        .then_some(())
    })
    .await;
    let first_log = agent
        .logs_dir()
        .join(format!("{ns}_filler_{uid}"))
        .join("filler")
        .join("0.log");
    let size = std::fs::metadata(&first_log)
        .unwrap_or_else(|e| panic!("{}: {e}", first_log.display()))
        .len();
    assert!(size > 24 * MI, "the first instance's log is {size} bytes");

    // Push the disk past the threshold: the dead instance's log is what can go.
    let pressure = ConditionTrace::follow(client.clone(), node, "DiskPressure");
    let free = available(&agent.root_dir());
    let fill = free - 16 * MI;
    std::fs::write(agent.root_dir().join("ballast"), vec![0u8; fill as usize]).unwrap();
    let crossed = Instant::now();
    wait_until("the dead instance removed with its log", WAIT, || async {
        (!first_log.exists()).then_some(())
    })
    .await;
    let reclaimed_after = crossed.elapsed();
    wait_until("the disk back above the threshold", WAIT, || async {
        (available(&agent.root_dir()) > 20 * MI).then_some(())
    })
    .await;
    pressure.wait_came_and_went(WAIT).await;
    // No pod was evicted: the reclaim was enough.
    for name in ["sleeper", "filler"] {
        let p = pods.get(name).await.unwrap();
        assert_ne!(
            phase_reason(&p).1.as_deref(),
            Some("Evicted"),
            "{name} was evicted"
        );
    }
    assert!(running(&pods, "sleeper").await);
    assert_eq!(
        metrics_line(&agent, "kubelet_evictions{").await,
        None,
        "no eviction counted"
    );
    // The root dir's tmpfs is not containerd's filesystem: a dedicated image filesystem, for
    // which Deckhand still reclaims dead containers under nodefs pressure (their logs are
    // on nodefs; upstream would go straight to evicting).
    let debug =
        common::local_socket_get(&agent.root_dir().join("deckhand.sock"), "/debug/eviction").await;
    assert!(debug.contains("\"dedicated_imagefs\":true"), "{debug}");
    eprintln!(
        "disk test: reclaimed {:.1}s after the threshold was crossed; took {:.1}s",
        reclaimed_after.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    drop(mounts);
}

/// The image filesystem of the test's own containerd, under pressure: the unused image is
/// removed before any pod is evicted, and that removal alone ends the pressure.
#[tokio::test]
async fn imagefs_pressure_removes_the_unused_image_before_evicting_pods() {
    const FILLER: &str = "localhost/deckhand/filler:1";
    const PAUSE: &str = "localhost/deckhand/pause:3.10";
    // Threshold and what the ballast leaves free: removing the filler frees its 20 MiB
    // snapshot (and as much again in the content store), so the signal goes from 6 MiB to at
    // least 26 MiB, over 16 MiB, with the ballast still there.
    const THRESHOLD: u64 = 16 * MI;
    const LEFT_FREE: u64 = 6 * MI;
    let min_age = Duration::from_secs(4);
    let started = Instant::now();
    let client = admin().await;
    let node = "dev-imagefs";

    // Declared first so that it is dropped last: the testbed's `down` unmounts the tmpfs
    // itself, and this lazy unmount is only for a test that failed before `up`.
    let mounts;
    let tb = common::OwnTestbed::new("deckhand-tbimg-", "dhimg", "10.88.82.0/24")
        .with_env("TESTBED_EXTRA_IMAGES", "filler");
    std::fs::create_dir_all(tb.root_dir()).unwrap();
    mounts = SmallFs::mount(&tb.root_dir(), "size=96m");
    tb.up();
    let endpoint = deckhand::clients::cri::parse_endpoint(&tb.endpoint()).unwrap();
    let cri = deckhand::clients::cri::CriClient::connect(&endpoint, Duration::from_secs(30))
        .await
        .expect("the test's containerd answers");
    let image_names = || async {
        use deckhand::clients::cri::ImageService;
        cri.list_images()
            .await
            .unwrap_or_default()
            .into_iter()
            .flat_map(|i| i.repo_tags)
            .collect::<Vec<String>>()
    };
    let names = image_names().await;
    for want in [FILLER, PAUSE, common::BUSYBOX] {
        assert!(names.iter().any(|n| n == want), "{want} missing: {names:?}");
    }

    let (mut agent, _node_cleanup) = joined_agent(node);
    agent.runtime = Some(tb.endpoint());
    quick_rounds(
        &mut agent,
        &format!(
            "imagefs.available<{}Mi,nodefs.available<1%,nodefs.inodesFree<1%,memory.available<100Mi",
            THRESHOLD / MI
        ),
        "3s",
        "1s",
    );
    agent.extra_args.push(format!(
        "--minimum-image-ttl-duration={}s",
        min_age.as_secs()
    ));
    agent.start();
    let agent_started = Instant::now();
    wait_node_ready(&client, node, &agent).await;
    let ns = "e2e-evict-imagefs";
    let _ns = create_namespace(&client, ns).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.create(
        &PostParams::default(),
        &common::cluster::bound_pod_with("sleeper", node, sleeping_spec(1)),
    )
    .await
    .unwrap();
    wait_until("the sleeper running", WAIT, || async {
        running(&pods, "sleeper").await.then_some(())
    })
    .await;
    // The agent records the images when it starts; an image seen for less than the minimum
    // age is never removed (upstream's rule, it may be about to be used). Past it (with a
    // margin for the agent's start), the filler may go.
    wait_until("the filler past the minimum image age", WAIT, || async {
        (agent_started.elapsed() >= min_age + Duration::from_secs(2)).then_some(())
    })
    .await;

    let root = tb.root_dir();
    let free = available(&root);
    assert!(
        free > THRESHOLD + 8 * MI,
        "the image filesystem has only {free} bytes free before the ballast"
    );
    let pressure = ConditionTrace::follow(client.clone(), node, "DiskPressure");
    let ballast = root.join("ballast");
    std::fs::write(&ballast, vec![b'b'; (free - LEFT_FREE) as usize]).unwrap();
    let crossed = Instant::now();
    wait_until("the unused image removed", WAIT, || async {
        let names = image_names().await;
        (!names.iter().any(|n| n == FILLER)).then_some(())
    })
    .await;
    let removed_after = crossed.elapsed();
    let free_after = available(&root);
    assert!(
        free_after >= THRESHOLD,
        "with the filler gone, {free_after} bytes free: still under the threshold"
    );
    assert!(ballast.exists());
    pressure.wait_came_and_went(WAIT).await;
    let cleared_after = crossed.elapsed();

    // The images in use stay: busybox (the sleeper's) and pause (the sandbox image).
    let names = image_names().await;
    for want in [PAUSE, common::BUSYBOX] {
        assert!(
            names.iter().any(|n| n == want),
            "{want} was removed: {names:?}"
        );
    }
    // No pod evicted: the sleeper still runs, no Evicted event, no eviction counted.
    assert!(running(&pods, "sleeper").await, "the sleeper keeps running");
    let p = pods.get("sleeper").await.unwrap();
    assert_ne!(phase_reason(&p).1.as_deref(), Some("Evicted"));
    assert!(
        !common::cluster::event_reasons(&client, ns, "sleeper")
            .await
            .iter()
            .any(|(reason, _)| reason == "Evicted"),
        "an Evicted event"
    );
    assert_eq!(
        metrics_line(&agent, "kubelet_evictions{").await,
        None,
        "no eviction counted"
    );
    assert_eq!(
        metrics_line(
            &agent,
            "kubelet_image_garbage_collected_total{reason=\"space\"}"
        )
        .await
        .as_deref(),
        Some("kubelet_image_garbage_collected_total{reason=\"space\"} 1"),
        "one image removed"
    );
    // The manager's own account: the reclaim for imagefs.available took one image and was
    // enough; the image filesystem is a dedicated one (the tmpfs, not the agent's root dir).
    let debug =
        common::local_socket_get(&agent.root_dir().join("deckhand.sock"), "/debug/eviction").await;
    let debug: serde_json::Value =
        serde_json::from_str(&debug).unwrap_or_else(|e| panic!("{e}: {debug}"));
    assert_eq!(debug["dedicated_imagefs"], true, "{debug}");
    let reclaim = &debug["last_reclaim"];
    assert_eq!(reclaim["signal"], "imagefs.available", "{debug}");
    assert_eq!(reclaim["removed"]["unused_images"], 1, "{debug}");
    assert_eq!(reclaim["enough"], true, "{debug}");
    eprintln!(
        "imagefs test: threshold crossed -> image removed {:.2}s -> DiskPressure False {:.1}s; \
         reclaim round {:.0} ms; free {} MiB -> {} MiB; took {:.1}s",
        removed_after.as_secs_f64(),
        cleared_after.as_secs_f64(),
        reclaim["took_ms"].as_f64().unwrap_or_default(),
        LEFT_FREE / MI,
        free_after / MI,
        started.elapsed().as_secs_f64()
    );
    drop(agent);
    drop(tb);
    drop(mounts);
}

/// Waits for `name` to be Failed with reason Evicted and returns its status message.
async fn evicted_message(pods: &Api<Pod>, name: &str, within: Duration) -> String {
    let evicted = wait_until(&format!("{name} evicted"), within, || async {
        let p = pods.get(name).await.ok()?;
        (phase_reason(&p) == (Some("Failed".into()), Some("Evicted".into()))).then_some(p)
    })
    .await;
    evicted.status.and_then(|s| s.message).unwrap_or_default()
}

#[tokio::test]
async fn pods_over_their_local_storage_limits_are_evicted_without_node_pressure() {
    let client = admin().await;
    let node = "dev-local-storage";
    let (mut agent, _node_cleanup) = joined_agent(node);
    // Thresholds no machine here meets: only the pods' own limits can evict.
    quick_rounds(
        &mut agent,
        "memory.available<1Mi,nodefs.available<1%,imagefs.available<1%",
        "5s",
        "1s",
    );
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    let ns = "e2e-evict-local-storage";
    let _ns: NamespaceCleanup = create_namespace(&client, ns).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);

    let write = |to: &str| {
        serde_json::json!([
            "sh",
            "-c",
            format!("dd if=/dev/zero of={to} bs=1M count=10; sleep 600")
        ])
    };
    // Upstream's spec: 10 MiB into the writable layer under a 5Mi limit.
    let mut layer = sleeping_spec(1);
    layer["restartPolicy"] = "OnFailure".into();
    layer["containers"][0]["command"] = write("/file");
    layer["containers"][0]["resources"] =
        serde_json::json!({"limits": {"ephemeral-storage": "5Mi"}});
    // 2 MiB into an emptyDir limited to 1Mi (no container limit).
    let mut dir = sleeping_spec(1);
    dir["volumes"] = serde_json::json!([{"name": "cache", "emptyDir": {"sizeLimit": "1Mi"}}]);
    dir["containers"][0]["volumeMounts"] =
        serde_json::json!([{"name": "cache", "mountPath": "/cache"}]);
    dir["containers"][0]["command"] = serde_json::json!([
        "sh",
        "-c",
        "dd if=/dev/zero of=/cache/f bs=1M count=2; sleep 600"
    ]);
    // The same 10 MiB without any limit.
    let mut free = sleeping_spec(1);
    free["containers"][0]["command"] = write("/file");
    for (name, spec) in [("layer", layer), ("dir", dir), ("free", free)] {
        pods.create(
            &PostParams::default(),
            &common::cluster::bound_pod_with(name, node, spec),
        )
        .await
        .unwrap();
    }

    // containerd measures writable layers on a period of its own (10 s by default).
    let within = Duration::from_secs(90);
    let message = evicted_message(&pods, "layer", within).await;
    assert_eq!(
        message,
        "Pod ephemeral local storage usage exceeds the total limit of containers 5Mi. "
    );
    let dir_message = evicted_message(&pods, "dir", within).await;
    assert_eq!(
        dir_message,
        "Usage of EmptyDir volume \"cache\" exceeds the limit \"1Mi\". "
    );
    for (name, want) in [("layer", &message), ("dir", &dir_message)] {
        wait_until(&format!("the Evicted event of {name}"), WAIT, || async {
            common::cluster::event_reasons(&client, ns, name)
                .await
                .into_iter()
                .any(|(reason, m)| reason == "Evicted" && &m == want)
                .then_some(())
        })
        .await;
    }
    assert!(
        running(&pods, "free").await,
        "the pod without limits keeps running"
    );
    for signal in ["ephemeralpodfs.limit", "emptydirfs.limit"] {
        let prefix = format!("kubelet_evictions{{eviction_signal=\"{signal}\"}}");
        let line = metrics_line(&agent, &prefix).await.unwrap_or_default();
        assert_eq!(
            line,
            format!("{prefix} 1"),
            "one eviction counted under {signal}"
        );
    }
}
