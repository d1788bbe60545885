//! End to end, against the real test control plane and the private containerd: the eviction
//! manager under PID and inode pressure (memory and disk space are in `e2e_eviction`).
//!
//! - PIDs: the hard `pid.available` threshold is set a few hundred processes below what the
//!   host has free when the test starts (from `pid_max` and the number of tasks now); a pod
//!   that forks a thousand `sleep`s takes the node past it and is evicted (Failed, reason
//!   Evicted, upstream's message naming pids), a pod with two processes keeps running, and
//!   PIDPressure turns True, then False once the (shortened) transition period is over.
//! - Inodes: the agent's root directory is a tmpfs with few inodes; a pod that creates
//!   files in its emptyDir takes `nodefs.inodesFree` under the threshold and is evicted (it
//!   uses the most inodes), which removes its emptyDir; another pod keeps running, and
//!   DiskPressure comes and goes.
//!
//! Both need root (tmpfs, cgroups) and a cluster (`DECKHAND_TEST_CLUSTER`): evicted pods come
//! from the API server, since static pods are never evicted. They run in parallel, each with
//! its own node.

mod common;

use std::time::{Duration, Instant};

use common::cluster::{
    admin, bound_pod_with, create_namespace, event_reasons, joined_agent, sleeping_spec,
    wait_node_ready,
};
use common::pressure::{
    ConditionTrace, SmallFs, metrics_line, outcome, quick_rounds, wait_evicted, wait_running,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};

const WAIT: Duration = Duration::from_secs(40);

/// What the agent reckons `pid.available` to be: `pid_max` less the number of tasks
/// (threads included) the kernel reports.
fn pids_available() -> i64 {
    let max: i64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .expect("/proc/sys/kernel/pid_max")
        .trim()
        .parse()
        .expect("pid_max is a number");
    let tasks = nix::sys::sysinfo::sysinfo()
        .expect("sysinfo")
        .process_count();
    max - i64::from(tasks)
}

/// Creates the pods (bound to `node`) in `pods`' namespace.
async fn create_pods(pods: &Api<Pod>, node: &str, specs: Vec<(&str, serde_json::Value)>) {
    for (name, spec) in specs {
        pods.create(&PostParams::default(), &bound_pod_with(name, node, spec))
            .await
            .unwrap_or_else(|e| panic!("cannot create pod {name}: {e}"));
    }
}

#[tokio::test]
async fn pid_pressure_evicts_the_pod_with_most_processes_and_keeps_the_other() {
    let started = Instant::now();
    let client = admin().await;
    let node = "dev-pids";
    // Pressure once 500 more tasks exist than now: the hog adds a thousand, while the agent,
    // the shims and the rest of the machine's noise stay well under 500.
    let mut threshold = pids_available() - 500;
    // A count divisible by 1000 would be written with a suffix (`31k`); keep it plain.
    if threshold % 10 == 0 {
        threshold -= 1;
    }
    let (mut agent, _node_cleanup) = joined_agent(node);
    quick_rounds(
        &mut agent,
        &format!(
            "pid.available<{threshold},memory.available<100Mi,nodefs.available<1%,nodefs.inodesFree<1%,imagefs.available<1%"
        ),
        "3s",
        "1s",
    );
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    let ns = "e2e-pressure-pids";
    let _ns = create_namespace(&client, ns).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);

    create_pods(&pods, node, vec![("calm", sleeping_spec(1))]).await;
    wait_running(&pods, "calm", WAIT).await;
    let pressure = ConditionTrace::follow(client.clone(), node, "PIDPressure");
    let mut hog = sleeping_spec(1);
    hog["containers"][0]["command"] = serde_json::json!([
        "sh",
        "-c",
        "i=0; while [ $i -lt 1000 ]; do sleep 600 & i=$((i+1)); done; wait"
    ]);
    let created = Instant::now();
    create_pods(&pods, node, vec![("forker", hog)]).await;

    let evicted = wait_evicted(&pods, "forker", WAIT).await;
    let evicted_after = created.elapsed();
    let want =
        format!("The node was low on resource: pids. Threshold quantity: {threshold}, available: ");
    assert!(evicted.message.starts_with(&want), "{evicted:?}");
    // No container figures: upstream names them for memory and ephemeral storage only.
    assert!(
        evicted.message.ends_with(". ") && !evicted.message.contains("Container"),
        "{evicted:?}"
    );
    wait_until_event(&client, ns, "forker", &evicted.message).await;
    let (rose, fell) = pressure.wait_came_and_went(WAIT).await;
    let calm = outcome(&pods, "calm").await.expect("the calm pod");
    assert_eq!(
        calm.phase, "Running",
        "the pod with few processes keeps running: {calm:?}"
    );
    assert_eq!(
        metrics_line(&agent, "kubelet_evictions{").await.as_deref(),
        Some("kubelet_evictions{eviction_signal=\"pid.available\"} 1"),
        "one eviction counted"
    );
    eprintln!(
        "pid test: forker created -> PIDPressure {:.1}s, -> evicted {:.1}s; pressure lasted {:.1}s; took {:.1}s",
        rose.duration_since(created).as_secs_f64(),
        evicted_after.as_secs_f64(),
        fell.duration_since(rose).as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
}

/// Waits for the pod's `Evicted` event with the same message as its status.
async fn wait_until_event(client: &kube::Client, ns: &str, pod: &str, message: &str) {
    common::wait_until("the Evicted event", WAIT, || async {
        event_reasons(client, ns, pod)
            .await
            .into_iter()
            .any(|(reason, m)| reason == "Evicted" && m == message)
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn inode_pressure_evicts_the_pod_with_most_files_and_keeps_the_other() {
    let started = Instant::now();
    let client = admin().await;
    let node = "dev-inodes";
    let (mut agent, _node_cleanup) = joined_agent(node);
    // The root directory (pods' directories and emptyDirs) on a filesystem of 2000 inodes;
    // the agent and a pod use a few dozen of them, the hog 1500 more.
    let fs = SmallFs::mount(&agent.root_dir(), "size=64m,nr_inodes=2000");
    quick_rounds(
        &mut agent,
        "nodefs.inodesFree<1000,nodefs.available<1%,memory.available<100Mi,imagefs.available<1%",
        "3s",
        "1s",
    );
    agent.start();
    wait_node_ready(&client, node, &agent).await;
    let ns = "e2e-pressure-inodes";
    let _ns = create_namespace(&client, ns).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);

    // Both pods have an emptyDir; the calm one writes a handful of files into it.
    let with_scratch = |script: &str| {
        let mut spec = sleeping_spec(1);
        spec["containers"][0]["command"] = serde_json::json!(["sh", "-c", script]);
        spec["containers"][0]["volumeMounts"] =
            serde_json::json!([{"name": "scratch", "mountPath": "/scratch"}]);
        spec["volumes"] = serde_json::json!([{"name": "scratch", "emptyDir": {}}]);
        spec
    };
    create_pods(
        &pods,
        node,
        vec![(
            "calm",
            with_scratch("touch /scratch/a /scratch/b; trap 'exit 0' TERM; sleep 600 & wait"),
        )],
    )
    .await;
    wait_running(&pods, "calm", WAIT).await;
    let (free_before, total) = fs.inodes();
    assert!(
        free_before > 1600,
        "the agent and the calm pod use {} of {total} inodes: too many for the test",
        total - free_before
    );
    let pressure = ConditionTrace::follow(client.clone(), node, "DiskPressure");
    let created = Instant::now();
    create_pods(
        &pods,
        node,
        vec![(
            "filer",
            with_scratch(
                "mkdir -p /scratch/many && cd /scratch/many && i=0; \
                 while [ $i -lt 1500 ]; do : > f$i; i=$((i+1)); done; sleep 600",
            ),
        )],
    )
    .await;

    let evicted = wait_evicted(&pods, "filer", WAIT).await;
    let evicted_after = created.elapsed();
    assert!(
        evicted.message.starts_with(
            "The node was low on resource: inodes. Threshold quantity: 1k, available: "
        ),
        "{evicted:?}"
    );
    wait_until_event(&client, ns, "filer", &evicted.message).await;
    // The evicted pod's emptyDir goes with its containers: the inodes come back.
    common::wait_until("the inodes freed", WAIT, || async {
        (fs.inodes().0 >= free_before - 50).then_some(())
    })
    .await;
    let (rose, fell) = pressure.wait_came_and_went(WAIT).await;
    let calm = outcome(&pods, "calm").await.expect("the calm pod");
    assert_eq!(
        calm.phase, "Running",
        "the pod with few files keeps running: {calm:?}"
    );
    assert_eq!(
        metrics_line(&agent, "kubelet_evictions{").await.as_deref(),
        Some("kubelet_evictions{eviction_signal=\"nodefs.inodesFree\"} 1"),
        "one eviction counted"
    );
    eprintln!(
        "inode test: filer created -> DiskPressure {:.1}s, -> evicted {:.1}s; pressure lasted {:.1}s; took {:.1}s",
        rose.duration_since(created).as_secs_f64(),
        evicted_after.as_secs_f64(),
        fell.duration_since(rose).as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    agent.kill();
    drop(fs);
}
