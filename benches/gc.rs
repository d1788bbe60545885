//! Housekeeping benchmark against a real containerd: one container GC pass that removes N dead
//! containers (with their log files), and rotating a container's 10 MiB log (rename and
//! `ReopenContainerLog`, then compressing it on the next rotation).
//!
//! Needs the private testbed: `scripts/testbed up DIR`, then
//! `DECKHAND_TEST_RUNTIME=unix://DIR/containerd.sock cargo bench --bench gc` (release) or
//! `cargo test --bench gc` (a quick debug-build figure). `BENCH_GC_CONTAINERS` sets N (50).
//! Everything it makes carries its own node name and is removed at the end.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use deckhand::clients::cri::proto::*;
use deckhand::clients::cri::{CriClient, RuntimeService, parse_endpoint};
use deckhand::kubelet::gc::WorkerActivity;
use deckhand::kubelet::gc::containers::ContainerGcPolicy;
use deckhand::kubelet::gc::run::{
    GcContext, LogPaths, RotationPolicy, container_gc_pass, rotate_logs_pass,
};
use deckhand::kubelet::runtime::inspect::managed_selector;

async fn wait_states(cri: &CriClient, node: &str, state: ContainerState, n: usize) {
    let start = Instant::now();
    loop {
        let cs = cri
            .list_containers(Some(ContainerFilter {
                label_selector: managed_selector(node),
                state: Some(ContainerStateValue {
                    state: state as i32,
                }),
                ..Default::default()
            }))
            .await
            .unwrap();
        if cs.len() >= n {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "containers did not reach {state:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let n: usize = std::env::var("BENCH_GC_CONTAINERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(50);
    let endpoint = std::env::var("DECKHAND_TEST_RUNTIME")
        .expect("DECKHAND_TEST_RUNTIME=unix://DIR/containerd.sock (scripts/testbed up DIR)");
    let cri = CriClient::connect(&parse_endpoint(&endpoint).unwrap(), Duration::from_secs(60))
        .await
        .expect("the testbed's containerd answers");
    let node = format!("bench-gc-{}", std::process::id());
    let uid = format!("bench-gc-uid-{}", std::process::id());
    let logs: PathBuf =
        std::env::temp_dir().join(format!("deckhand-bench-gc-{}", std::process::id()));
    std::fs::create_dir_all(&logs).unwrap();
    let sandbox_config = common::host_network_sandbox(&node, &uid, "bench", &logs);
    let sandbox = cri
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(sandbox_config.clone()),
            runtime_handler: String::new(),
        })
        .await
        .expect("a host-network sandbox")
        .pod_sandbox_id;

    let container = |name: String, command: Vec<String>| {
        let labels = common::pod_labels(&node, &uid, "bench", Some(&name));
        common::busybox_container(&sandbox, &sandbox_config, &name, command, labels)
    };

    // N dead containers, each in its own name (so each has a log), and one that runs.
    let made = Instant::now();
    for i in 0..n {
        std::fs::create_dir_all(logs.join(format!("dead{i}"))).unwrap();
        let id = cri
            .create_container(container(
                format!("dead{i}"),
                vec!["echo".into(), "bye".into()],
            ))
            .await
            .unwrap();
        cri.start_container(id).await.unwrap();
    }
    std::fs::create_dir_all(logs.join("live")).unwrap();
    let live = cri
        .create_container(container("live".into(), vec!["sleep".into(), "600".into()]))
        .await
        .unwrap();
    cri.start_container(live.clone()).await.unwrap();
    wait_states(&cri, &node, ContainerState::ContainerExited, n).await;
    eprintln!(
        "made {n} dead containers in {:.1}s",
        made.elapsed().as_secs_f64()
    );

    let ctx = GcContext {
        rt: cri.clone(),
        node_name: node.clone(),
        pod_logs_dir: logs.clone(),
        // No worker has the pod: all its dead containers go.
        activity: WorkerActivity::default(),
        sources_ready: Arc::new(|| true),
    };
    let began = Instant::now();
    let done = container_gc_pass(&ctx, ContainerGcPolicy::default())
        .await
        .unwrap();
    let gc_took = began.elapsed();
    assert_eq!(done.containers.len(), n);
    let left_logs = (0..n)
        .filter(|i| logs.join(format!("dead{i}/0.log")).exists())
        .count();
    assert_eq!(left_logs, 0);

    // Rotation of a 10 MiB log, twice: the second also compresses the first rotation.
    let policy = RotationPolicy {
        max_size: 10 * 1024 * 1024,
        max_files: 5,
        workers: 1,
        interval: std::time::Duration::from_secs(10),
    };
    let line = "2026-12-01T00:00:00.000000000Z stdout F lorem ipsum dolor sit amet consectetur\n";
    let fill = || {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(logs.join("live/0.log"))
            .unwrap();
        let chunk = line.repeat(1024);
        let mut written = 0;
        while written < policy.max_size as usize {
            f.write_all(chunk.as_bytes()).unwrap();
            written += chunk.len();
        }
    };
    fill();
    let paths = LogPaths::default();
    let began = Instant::now();
    assert_eq!(rotate_logs_pass(&ctx, policy, &paths).await.unwrap(), 1);
    let first = began.elapsed();
    // The next rotation name needs the next second.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    fill();
    let began = Instant::now();
    assert_eq!(rotate_logs_pass(&ctx, policy, &paths).await.unwrap(), 1);
    let second = began.elapsed();
    let gz: u64 = std::fs::read_dir(logs.join("live"))
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".gz"))
        .map(|e| e.metadata().map(|m| m.len()).unwrap_or(0))
        .sum();

    let _ = cri.stop_container(live.clone(), 0).await;
    let _ = cri.stop_pod_sandbox(sandbox.clone()).await;
    let _ = cri.remove_pod_sandbox(sandbox).await;
    let _ = std::fs::remove_dir_all(&logs);

    println!(
        "container GC pass removing {n} dead containers and their logs: {:.0} ms ({:.1} ms each)",
        gc_took.as_secs_f64() * 1000.0,
        gc_took.as_secs_f64() * 1000.0 / n as f64
    );
    println!(
        "log rotation of a 10 MiB log (rename + ReopenContainerLog): {:.1} ms",
        first.as_secs_f64() * 1000.0
    );
    println!(
        "log rotation with compression of the previous 10 MiB rotation: {:.0} ms (compressed to {} KiB)",
        second.as_secs_f64() * 1000.0,
        gz / 1024
    );
}
