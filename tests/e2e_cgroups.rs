//! End to end, against the private containerd on this machine (cgroup v1, hybrid): the pod
//! cgroups Deckhand makes hold upstream's values and go with the pod, and the limits are
//! enforced by the kernel: a container that allocates past its memory limit is OOMKilled, a
//! container with a CPU limit that spins is throttled.
//!
//! Each test has its own `--cgroup-root` (`/deckhand-e2e-<node>`), made in every hierarchy
//! before the agent starts (as an operator would; upstream requires the root to exist) and
//! removed at the end, also when the test fails.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{Agent, containers_of, cri, wait_until};
use serde_json::Value;

const BUSYBOX: &str = "localhost/deckhand/busybox:1.35";
const WAIT: Duration = Duration::from_secs(40);
const MOUNT: &str = "/sys/fs/cgroup";
/// The v1 hierarchies a pod cgroup is made in.
/// A private cgroup root in every hierarchy, removed (deepest first) when dropped.
struct CgroupRoot {
    name: String,
}

impl CgroupRoot {
    fn new(node: &str) -> CgroupRoot {
        assert!(
            !Path::new(MOUNT).join("cgroup.controllers").exists(),
            "these tests read cgroup v1 files; this machine has the unified hierarchy"
        );
        let name = format!("/deckhand-e2e-{node}");
        let root = CgroupRoot { name };
        root.remove();
        // In every mounted hierarchy (the agent needs its root in each one it uses).
        for h in mounted_hierarchies() {
            std::fs::create_dir_all(root.dir(&h, "")).expect("create the test's cgroup root");
        }
        root
    }

    /// `<mount>/<hierarchy>/<root>/<rel>`.
    fn dir(&self, hierarchy: &str, rel: &str) -> PathBuf {
        let mut p = Path::new(MOUNT)
            .join(hierarchy)
            .join(self.name.trim_start_matches('/'));
        if !rel.is_empty() {
            p = p.join(rel);
        }
        p
    }

    fn read(&self, hierarchy: &str, rel: &str, file: &str) -> Option<String> {
        std::fs::read_to_string(self.dir(hierarchy, rel).join(file))
            .ok()
            .map(|s| s.trim().to_string())
    }

    fn remove(&self) {
        for h in std::fs::read_dir(MOUNT).into_iter().flatten().flatten() {
            remove_tree(&h.path().join(self.name.trim_start_matches('/')));
        }
    }
}

/// The cgroup v1 hierarchies mounted here (a directory under the mount with `cgroup.procs`).
fn mounted_hierarchies() -> Vec<String> {
    std::fs::read_dir(MOUNT)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().join("cgroup.procs").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

fn remove_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

impl Drop for CgroupRoot {
    fn drop(&mut self) {
        // The agent (dropped before this) removed the pods; runc removes the containers'
        // cgroups a moment later, so an rmdir may still find one busy: try for a while.
        for _ in 0..50 {
            self.remove();
            if !self.dir("cpu", "").exists() && !self.dir("memory", "").exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("cgroup root {} could not be removed", self.name);
    }
}

fn pod_yaml(name: &str, restart: &str, command: &str, resources: &str) -> String {
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  terminationGracePeriodSeconds: 1
  restartPolicy: {restart}
  containers:
  - name: main
    image: {BUSYBOX}
    command: {command}
{resources}"
    )
}

const SLEEP: &str = r#"["sh", "-c", "trap 'exit 0' TERM; sleep 3600 & wait"]"#;

async fn running_pod(agent: &Agent, name: &str) -> Value {
    wait_until(&format!("{name} running"), WAIT, || async {
        let pod = agent.pod(name).await?;
        (pod["status"]["phase"] == "Running").then_some(pod)
    })
    .await
}

/// The id of the pod's (first) container, once it runs.
async fn container_id(agent: &Agent, name: &str) -> String {
    let client = cri().await;
    let full = agent.pod_name(name);
    wait_until(&format!("{name}'s container"), WAIT, || async {
        containers_of(&client, &full)
            .await
            .into_iter()
            .find(|c| c.state == 1)
            .map(|c| c.id)
    })
    .await
}

fn agent_with_root(node: &str, root: &CgroupRoot, extra: &[&str]) -> Agent {
    let mut agent = Agent::new(node);
    agent
        .extra_args
        .push(format!("--cgroup-root={}", root.name));
    agent.extra_args.extend(extra.iter().map(|s| s.to_string()));
    agent
}

fn mem_total() -> i64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kb: i64 = text
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb * 1024
}

fn pid_capacity() -> i64 {
    ["pid_max", "threads-max"]
        .iter()
        .filter_map(|f| {
            std::fs::read_to_string(format!("/proc/sys/kernel/{f}"))
                .ok()?
                .trim()
                .parse()
                .ok()
        })
        .min()
        .unwrap()
}

/// What the kernel shows for "no memory limit" on v1 (the largest page-aligned value).
const V1_UNLIMITED: &str = "9223372036854771712";

#[tokio::test]
async fn each_qos_class_gets_upstreams_cgroup_files_and_loses_them_with_the_pod() {
    let node = "e2e-cg-qos";
    let root = CgroupRoot::new(node);
    let mut agent = agent_with_root(
        node,
        &root,
        &[
            "--pod-max-pids=256",
            "--kube-reserved=cpu=100m,memory=100Mi",
        ],
    );
    agent.write_manifest(
        "g.yaml",
        &pod_yaml(
            "g",
            "Always",
            SLEEP,
            "    resources: {limits: {cpu: 200m, memory: 64Mi}}\n",
        ),
    );
    agent.write_manifest(
        "b.yaml",
        &pod_yaml(
            "b",
            "Always",
            SLEEP,
            "    resources: {requests: {cpu: 100m, memory: 16Mi}, limits: {cpu: 300m, memory: 128Mi}}\n",
        ),
    );
    agent.write_manifest("e.yaml", &pod_yaml("e", "Always", SLEEP, ""));
    agent.start();
    agent.wait_healthy(WAIT).await;

    // kubepods: capacity less kubeReserved (eviction thresholds are not taken off).
    let cpus = std::thread::available_parallelism().unwrap().get() as i64;
    let shares = |milli: i64| (milli * 1024 / 1000).clamp(2, 262_144).to_string();
    let kubepods = [
        ("cpu", "", "cpu.shares", shares(cpus * 1000 - 100)),
        (
            "memory",
            "",
            "memory.limit_in_bytes",
            (mem_total() - (100 << 20)).to_string(),
        ),
        ("pids", "", "pids.max", pid_capacity().to_string()),
        ("cpu", "besteffort", "cpu.shares", "2".to_string()),
    ];
    for (h, tier, file, want) in &kubepods {
        let rel = if tier.is_empty() {
            "kubepods".to_string()
        } else {
            format!("kubepods/{tier}")
        };
        assert_eq!(
            root.read(h, &rel, file).as_deref(),
            Some(want.as_str()),
            "{h}/{rel}/{file}"
        );
    }

    // (pod, its cgroup's place, pod files, container files) as upstream sets them.
    type Files<'a> = &'a [(&'a str, &'a str, &'a str)];
    let rows: [(&str, &str, Files, Files); 3] = [
        (
            "g",
            "kubepods",
            &[
                ("cpu", "cpu.shares", "204"),
                ("cpu", "cpu.cfs_quota_us", "20000"),
                ("cpu", "cpu.cfs_period_us", "100000"),
                ("memory", "memory.limit_in_bytes", "67108864"),
                ("pids", "pids.max", "256"),
            ],
            &[
                ("cpu", "cpu.shares", "204"),
                ("cpu", "cpu.cfs_quota_us", "20000"),
                ("cpu", "cpu.cfs_period_us", "100000"),
                ("memory", "memory.limit_in_bytes", "67108864"),
            ],
        ),
        (
            "b",
            "kubepods/burstable",
            &[
                ("cpu", "cpu.shares", "102"),
                ("cpu", "cpu.cfs_quota_us", "30000"),
                ("cpu", "cpu.cfs_period_us", "100000"),
                ("memory", "memory.limit_in_bytes", "134217728"),
                ("pids", "pids.max", "256"),
            ],
            &[
                ("cpu", "cpu.shares", "102"),
                ("cpu", "cpu.cfs_quota_us", "30000"),
                ("memory", "memory.limit_in_bytes", "134217728"),
            ],
        ),
        (
            "e",
            "kubepods/besteffort",
            &[
                ("cpu", "cpu.shares", "2"),
                ("cpu", "cpu.cfs_quota_us", "-1"),
                ("memory", "memory.limit_in_bytes", V1_UNLIMITED),
                ("pids", "pids.max", "256"),
            ],
            &[
                ("cpu", "cpu.shares", "2"),
                ("cpu", "cpu.cfs_quota_us", "-1"),
                ("cpu", "cpu.cfs_period_us", "100000"),
                ("memory", "memory.limit_in_bytes", V1_UNLIMITED),
            ],
        ),
    ];
    let mut pod_dirs = Vec::new();
    for (name, tier, pod_files, container_files) in &rows {
        let pod = running_pod(&agent, name).await;
        let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
        let pod_rel = format!("{tier}/pod{uid}");
        let id = container_id(&agent, name).await;
        let ctr_rel = format!("{pod_rel}/{id}");
        for (h, file, want) in *pod_files {
            assert_eq!(
                root.read(h, &pod_rel, file).as_deref(),
                Some(*want),
                "pod {name}: {h}/{pod_rel}/{file}"
            );
        }
        for (h, file, want) in *container_files {
            assert_eq!(
                root.read(h, &ctr_rel, file).as_deref(),
                Some(*want),
                "container of {name}: {h}/{ctr_rel}/{file}"
            );
        }
        pod_dirs.push(pod_rel);
    }
    // The burstable tier has the shares of the one burstable pod's request.
    assert_eq!(
        root.read("cpu", "kubepods/burstable", "cpu.shares")
            .as_deref(),
        Some("102")
    );

    // The time the agent spent making each pod's cgroup (measured, not asserted).
    let took: Vec<String> = agent
        .log()
        .lines()
        .filter(|l| l.contains("pod cgroup created"))
        .filter_map(|l| l.split("elapsed_ms=").nth(1))
        .map(|v| v.split_whitespace().next().unwrap_or_default().to_string())
        .collect();
    eprintln!("pod cgroup setup (ms): {took:?}");

    for file in ["g.yaml", "b.yaml", "e.yaml"] {
        agent.remove_manifest(file);
    }
    let dirs: Vec<PathBuf> = pod_dirs
        .iter()
        .flat_map(|rel| {
            mounted_hierarchies()
                .into_iter()
                .map(|h| root.dir(&h, rel))
                .collect::<Vec<_>>()
        })
        .collect();
    let dirs = &dirs;
    wait_until("every pod cgroup removed", WAIT, || async move {
        dirs.iter().all(|d| !d.exists()).then_some(())
    })
    .await;
    assert_eq!(
        root.read("cpu", "kubepods/burstable", "cpu.shares")
            .as_deref(),
        Some("2"),
        "the burstable tier shrinks back when its pod is gone"
    );
    agent.stop();
}

#[tokio::test]
async fn a_memory_hog_is_oom_killed_and_a_cpu_spinner_is_throttled() {
    let node = "e2e-cg-limits";
    let root = CgroupRoot::new(node);
    let mut agent = agent_with_root(node, &root, &[]);
    // dd reads into one 64 MiB buffer: past the 16 MiB limit.
    agent.write_manifest(
        "hog.yaml",
        &pod_yaml(
            "hog",
            "Never",
            r#"["dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=4"]"#,
            "    resources: {limits: {memory: 16Mi}}\n",
        ),
    );
    agent.write_manifest(
        "spin.yaml",
        &pod_yaml(
            "spin",
            "Always",
            r#"["sh", "-c", "while :; do :; done"]"#,
            "    resources: {limits: {cpu: 50m}}\n",
        ),
    );
    agent.start();
    agent.wait_healthy(WAIT).await;

    let terminated = wait_until("hog terminated", WAIT, || async {
        let pod = agent.pod("hog").await?;
        let t = &pod["status"]["containerStatuses"][0]["state"]["terminated"];
        (!t.is_null()).then(|| t.clone())
    })
    .await;
    assert_eq!(terminated["reason"], "OOMKilled", "{terminated}");
    assert_eq!(terminated["exitCode"], 137, "{terminated}");

    let pod = running_pod(&agent, "spin").await;
    let uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
    let id = container_id(&agent, "spin").await;
    let rel = format!("kubepods/burstable/pod{uid}/{id}");
    assert_eq!(
        root.read("cpu", &rel, "cpu.cfs_quota_us").as_deref(),
        Some("5000")
    );
    let throttled = |root: &CgroupRoot| -> Option<u64> {
        root.read("cpu", &rel, "cpu.stat")?
            .lines()
            .find_map(|l| l.strip_prefix("nr_throttled "))?
            .trim()
            .parse()
            .ok()
    };
    let first = wait_until("throttling counters", WAIT, || async { throttled(&root) }).await;
    let later = wait_until("the throttling counter to rise", WAIT, || async {
        throttled(&root).filter(|n| *n > first)
    })
    .await;
    eprintln!("nr_throttled {first} → {later}");
    for file in ["hog.yaml", "spin.yaml"] {
        agent.remove_manifest(file);
    }
    agent.stop();
}

/// A pod cgroup left behind by a pod the node no longer has (here: made before the agent
/// starts, with a process in it) is found by the orphan sweep, its process killed and its
/// directories removed in every hierarchy; a running pod's cgroup is left alone.
#[tokio::test]
async fn an_orphaned_pod_cgroup_is_removed_with_its_processes() {
    let node = "e2e-cg-orphan";
    let root = CgroupRoot::new(node);
    let orphan_uid = "6f1c7a52-0rph-4a2e-9d1b-000000000001";
    let orphan = format!("kubepods/besteffort/pod{orphan_uid}");
    let orphan = orphan.as_str();
    let hierarchies = ["cpu", "memory", "pids"];
    for h in hierarchies {
        std::fs::create_dir_all(root.dir(h, orphan)).expect("make the orphan's cgroup");
    }
    // Killed on drop too, should the test fail before the agent kills it.
    struct Child(std::process::Child);
    impl Drop for Child {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut left_over = Child(
        std::process::Command::new("sleep")
            .arg("3600")
            .spawn()
            .expect("start sleep"),
    );
    let pid = left_over.0.id().to_string();
    for h in hierarchies {
        std::fs::write(root.dir(h, orphan).join("cgroup.procs"), &pid)
            .expect("move the process into the orphan's cgroup");
    }
    let mut agent = agent_with_root(node, &root, &[]);
    // The pod's directory under the agent's root dir, as a teardown cut short leaves it: what
    // tells the agent the cgroup is its own to sweep.
    std::fs::create_dir_all(agent.root_dir().join("pods").join(orphan_uid)).unwrap();
    // Another agent's pod (no directory here) on the same cgroup root is left alone.
    let foreign = "kubepods/besteffort/pod6f1c7a52-f0re-4a2e-9d1b-000000000002";
    std::fs::create_dir_all(root.dir("memory", foreign)).unwrap();
    agent.write_manifest("live.yaml", &pod_yaml("live", "Always", SLEEP, ""));
    agent.start();
    agent.wait_healthy(WAIT).await;
    let live = running_pod(&agent, "live").await;
    let live_dir = format!(
        "kubepods/besteffort/pod{}",
        live["metadata"]["uid"].as_str().unwrap()
    );

    let orphan_dirs: Vec<PathBuf> = hierarchies.iter().map(|h| root.dir(h, orphan)).collect();
    let orphan_dirs = &orphan_dirs;
    wait_until("the orphaned pod cgroup removed", WAIT, || async move {
        orphan_dirs.iter().all(|d| !d.exists()).then_some(())
    })
    .await;
    let status = wait_until("the left-over process killed", WAIT, || {
        let done = left_over.0.try_wait().expect("wait for sleep");
        async move { done }
    })
    .await;
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9), "killed with SIGKILL: {status:?}");
    assert!(
        root.dir("memory", &live_dir).exists(),
        "the running pod's cgroup stays"
    );
    assert!(
        root.dir("memory", foreign).exists(),
        "a pod cgroup this agent never ran stays"
    );

    assert!(
        agent
            .log()
            .contains("removing the cgroup of a pod the node no longer has"),
        "the agent says why it removed the cgroup"
    );
    agent.stop();
}
