//! End to end, on this host's cgroup v1 memory controller: memory threshold notifications
//! (`kernelMemcgNotification`).
//!
//! - The kernel part alone: an eventfd registered on the root memory cgroup's usage fires when
//!   this test process allocates past it.
//! - The agent: with notifications on and an eviction monitoring period of 5 minutes (so no
//!   periodic round falls within the test), a BestEffort pod that allocates past the
//!   `memory.available` threshold is evicted within seconds, and `/debug/eviction` says the
//!   round that evicted it was started by the notification.
//!
//! Both need root and cgroup v1's memory controller; the second also a cluster
//! (`DECKHAND_TEST_CLUSTER`), since static pods are never evicted.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::cluster::{
    NamespaceCleanup, admin, bound_pod_with, create_namespace, joined_agent, sleeping_spec,
    wait_node_ready,
};
use common::{local_socket_get, node_memory_available, wait_until};
use deckhand::kubelet::eviction::memcg::{CgroupV1Memcg, Fired, MemcgControl};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
// The instant `Fired::wait` answers with (the agent's one monotonic clock, `base::clock`).
use tokio::time::Instant;

const WAIT: Duration = Duration::from_secs(60);
const MI: u64 = 1 << 20;

/// The two tests move the node's memory by a GiB or more and measure it: one at a time.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn root_usage() -> u64 {
    std::fs::read_to_string("/sys/fs/cgroup/memory/memory.usage_in_bytes")
        .expect("the root memory cgroup's usage (cgroup v1)")
        .trim()
        .parse()
        .expect("a number")
}

fn v1_memory() -> CgroupV1Memcg {
    CgroupV1Memcg::detect(Path::new("/sys/fs/cgroup")).unwrap_or_else(|e| {
        panic!("memory threshold notifications need cgroup v1's memory controller: {e}")
    })
}

#[tokio::test]
async fn the_kernel_notifies_when_root_memory_usage_crosses_a_registered_threshold() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let control = v1_memory();
    let fired = Arc::new(Fired::default());
    let margin = 512 * MI;
    let threshold = root_usage() + margin;
    let armed = control
        .arm(threshold, fired.clone())
        .unwrap_or_else(|e| panic!("registering at {threshold} (needs root): {e}"));
    // 1 GiB written page by page (a zeroed allocation alone would not be charged).
    let began = Instant::now();
    let mut ballast = vec![0u8; 2 * margin as usize];
    let mut crossed = None;
    for (i, page) in ballast.chunks_mut(4096).enumerate() {
        page[0] = 1;
        if crossed.is_none() && (i as u64 + 1) * 4096 >= margin {
            // Where this process alone takes usage past the threshold (others move it too).
            crossed = Some(Instant::now());
        }
    }
    let filled = began.elapsed();
    let crossed = crossed.expect("the ballast is larger than the margin");
    let at = tokio::time::timeout(WAIT, fired.wait())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "no notification within {WAIT:?}: usage {} against the threshold {threshold}",
                root_usage()
            )
        });
    let ms = |a: Instant, b: Instant| a.duration_since(b).as_secs_f64() * 1e3;
    eprintln!(
        "kernel notification: {:+.1} ms from this process crossing the threshold ({:.1} ms \
         after the allocation began; filling 1 GiB took {:.1} ms)",
        if at >= crossed {
            ms(at, crossed)
        } else {
            -ms(crossed, at)
        },
        ms(at.max(began), began),
        filled.as_secs_f64() * 1e3
    );
    std::hint::black_box(&ballast);
    drop(ballast);
    drop(armed);
}

fn debug_eviction(page: &str) -> Option<serde_json::Value> {
    serde_json::from_str(page).ok()
}

#[tokio::test]
async fn a_memory_threshold_notification_evicts_without_waiting_for_the_monitoring_period() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let started = Instant::now();
    v1_memory();
    let client = admin().await;
    let node = "dev-memcg";
    // The pod takes 3 GiB, the threshold is 1.5 GiB below what is free now: the pod takes the
    // node 1.5 GiB past it. The other builds and tests on this machine move memory by up to a
    // GiB; a crossing of theirs only starts a round that finds nothing and renews the
    // registration.
    let threshold_mi = node_memory_available() / MI - 1536;
    let (mut agent, _node_cleanup) = joined_agent(node);
    let config = agent.dir.path().join("config.yaml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("kernelMemcgNotification: true\n");
    std::fs::write(&config, text).unwrap();
    common::pressure::quick_rounds(
        &mut agent,
        &format!("memory.available<{threshold_mi}Mi,nodefs.available<1%,imagefs.available<1%"),
        "5s",
        "300s",
    );
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    let socket = agent.root_dir().join("deckhand.sock");
    // The first round, at the start, registers the threshold.
    let armed = wait_until("the memory threshold registered", WAIT, || async {
        let page = debug_eviction(&local_socket_get(&socket, "/debug/eviction").await)?;
        (page["memcg"]["armed"].as_array()?.len() == 1).then_some(page)
    })
    .await;
    assert_eq!(armed["memcg"]["error"], serde_json::Value::Null, "{armed}");

    let ns = "e2e-memcg-notify";
    let _ns: NamespaceCleanup = create_namespace(&client, ns).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut hog = sleeping_spec(1);
    // dd keeps its 3 GiB block, read from /dev/zero, while it waits on a pipe nobody reads.
    hog["containers"][0]["command"] =
        serde_json::json!(["sh", "-c", "dd if=/dev/zero bs=3072M count=1 | sleep 600"]);
    pods.create(&PostParams::default(), &bound_pod_with("hog", node, hog))
        .await
        .unwrap();
    let created = Instant::now();
    wait_until("the BestEffort pod evicted", WAIT, || async {
        let s = pods.get("hog").await.ok()?.status?;
        (s.phase.as_deref() == Some("Failed") && s.reason.as_deref() == Some("Evicted"))
            .then_some(())
    })
    .await;
    let evicted_after = created.elapsed();
    let page = debug_eviction(&local_socket_get(&socket, "/debug/eviction").await)
        .expect("/debug/eviction answers JSON");
    let last = &page["last_eviction"];
    assert_eq!(last["pod"], format!("{ns}/hog"), "{page}");
    assert_eq!(last["signal"], "memory.available", "{page}");
    assert_eq!(last["trigger"], "memcg notification", "{page}");
    assert!(page["memcg"]["notifications"].as_u64() >= Some(1), "{page}");
    eprintln!(
        "memcg test: notification to eviction handed to the sync loop {:.1} ms; pod created \
         to Evicted seen {:.1}s; {} notifications; took {:.1}s",
        last["notification_to_handoff_ms"]
            .as_f64()
            .unwrap_or(f64::NAN),
        evicted_after.as_secs_f64(),
        page["memcg"]["notifications"],
        started.elapsed().as_secs_f64()
    );
}
