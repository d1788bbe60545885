//! Eviction manager benchmark against a real containerd and the real host:
//!
//! 1. the decisions of one round with 110 pods (thresholds, conditions, ranking, the message),
//!    pure CPU;
//! 2. the observations of one round with 110 running pods: the root memory cgroup, `statvfs`,
//!    CRI container stats, `ImageFsInfo`, `pid_max`, each pod's logs and volumes on disk;
//! 3. the time from a threshold crossed to the eviction handed to the sync loop, with a
//!    real observer: the bench writes a file that takes the root dir's filesystem below a
//!    `nodefs.available` threshold at a random moment of the monitoring period.
//!
//! Needs the private testbed: `scripts/testbed up DIR`, then
//! `DECKHAND_TEST_RUNTIME=unix://DIR/containerd.sock cargo bench --bench eviction` (release) or
//! `cargo test --bench eviction` (a debug-build figure). `BENCH_EVICTION_PODS` sets the pods
//! (110), `BENCH_EVICTION_PERIOD` the monitoring period of part 3 (10s, upstream's) and
//! `BENCH_EVICTION_TRIALS` its trials (3). Everything it makes carries its own node name and is
//! removed at the end.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::sync::oneshot;

use deckhand::base::podspec::threshold::parse_flag;
use deckhand::clients::cri::proto::*;
use deckhand::clients::cri::{CriClient, RuntimeService, parse_endpoint};
use deckhand::config::EvictionSettings;
use deckhand::kubelet::events::Recorder;
use deckhand::kubelet::eviction::PressureView;
use deckhand::kubelet::eviction::decide::*;
use deckhand::kubelet::eviction::manager::{Manager, ManagerSettings};
use deckhand::kubelet::eviction::observe::*;
use deckhand::kubelet::eviction::signals::{Resource, Signal, thresholds};

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// CPU time of this process (user + system, every thread), from `/proc/self/stat` in the
/// kernel's USER_HZ ticks (100 a second), for the cost of a round apart from waiting.
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command (which may hold spaces) start at the state, field 3.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or_default();
    let fields: Vec<u64> = rest
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    // utime and stime are fields 14 and 15, i.e. 10 and 11 after the state.
    let ticks = fields.get(10).unwrap_or(&0) + fields.get(11).unwrap_or(&0);
    Duration::from_millis(ticks * 10)
}

fn pod(i: usize) -> Pod {
    let requests: BTreeMap<String, Quantity> = match i % 3 {
        0 => BTreeMap::new(),
        1 => [("memory".to_string(), Quantity("64Mi".into()))].into(),
        _ => [
            ("memory".to_string(), Quantity("256Mi".into())),
            ("cpu".to_string(), Quantity("250m".into())),
        ]
        .into(),
    };
    Pod {
        metadata: ObjectMeta {
            name: Some(format!("p{i}")),
            namespace: Some("default".into()),
            uid: Some(format!("uid-{i}")),
            ..Default::default()
        },
        spec: Some(PodSpec {
            priority: Some((i % 4) as i32 * 100),
            containers: vec![Container {
                name: "app".into(),
                resources: Some(ResourceRequirements {
                    requests: Some(requests.clone()),
                    limits: Some(requests),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn usage(i: usize) -> PodUsage {
    let ws = ((i * 7919) % 500 + 1) as u64 * (1 << 20);
    PodUsage {
        memory_working_set: ws,
        logs_bytes: ws / 10,
        rootfs_bytes: ws / 20,
        containers: vec![ContainerUsage {
            name: "app".into(),
            memory_working_set: Some(ws),
            rootfs_bytes: Some(ws / 20),
            logs_bytes: Some(ws / 10),
        }],
        ..Default::default()
    }
}

/// Part 1: the pure decisions of a round, `n` pods, averaged over many rounds.
fn decisions(n: usize) -> Duration {
    let ts = thresholds(
        &parse_flag("memory.available<100Mi,nodefs.available<10%,nodefs.inodesFree<5%,imagefs.available<15%").unwrap(),
        &EvictionSettings::default(),
    );
    let pods: Vec<Pod> = (0..n).map(pod).collect();
    let usages: HashMap<String, PodUsage> =
        (0..n).map(|i| (format!("uid-{i}"), usage(i))).collect();
    let observations: Observations = [
        (
            Signal::MemoryAvailable,
            Observation {
                available: 50 << 20,
                capacity: 24 << 30,
            },
        ),
        (
            Signal::NodeFsAvailable,
            Observation {
                available: 50 << 30,
                capacity: 250 << 30,
            },
        ),
        (
            Signal::NodeFsInodesFree,
            Observation {
                available: 1 << 24,
                capacity: 1 << 25,
            },
        ),
        (
            Signal::ImageFsAvailable,
            Observation {
                available: 50 << 30,
                capacity: 250 << 30,
            },
        ),
    ]
    .into();
    let rounds = 2000;
    let mut state = EvictionState::default();
    let began = Instant::now();
    for _ in 0..rounds {
        let round = state.step(
            &ts,
            &observations,
            Duration::from_secs(300),
            tokio::time::Instant::now(),
        );
        let t = round.to_reclaim(&ts).expect("memory is low");
        let mut candidates: Vec<Candidate<'_>> = pods
            .iter()
            .map(|p| Candidate {
                pod: p,
                usage: usages.get(p.metadata.uid.as_deref().unwrap()),
            })
            .collect();
        rank(&mut candidates, t.signal, false);
        let first = &candidates[0];
        let message = eviction_message(
            Resource::Memory,
            first.pod,
            first.usage,
            &ts,
            &round.act_on,
            &observations,
        );
        std::hint::black_box(message);
    }
    began.elapsed() / rounds
}

/// Records when an eviction was asked for.
#[derive(Clone, Default)]
struct Recording {
    at: Arc<Mutex<Option<Instant>>>,
    pods: Arc<Vec<Arc<Pod>>>,
}

impl Evictor for Recording {
    fn evict(
        &self,
        _uid: &str,
        _grace: i64,
        _message: String,
    ) -> BoxFuture<'_, Result<oneshot::Receiver<()>, EvictionError>> {
        *self.at.lock().unwrap() = Some(Instant::now());
        let (tx, rx) = oneshot::channel();
        let _ = tx.send(());
        Box::pin(async move { Ok(rx) })
    }
}

impl ActivePods for Recording {
    fn active(&self) -> Vec<Arc<Pod>> {
        self.pods.to_vec()
    }
}

/// Nothing to reclaim (the bench's ballast is no container).
struct NoReclaim;
impl Reclaimer for NoReclaim {
    fn reclaim(&self, _: Reclaim) -> BoxFuture<'_, Result<usize, EvictionError>> {
        Box::pin(async { Ok(0) })
    }
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let n: usize = env("BENCH_EVICTION_PODS", 110);
    let period = deckhand::config::parse_go_duration(
        &std::env::var("BENCH_EVICTION_PERIOD").unwrap_or_else(|_| "10s".into()),
    )
    .expect("a Go duration");
    let trials: usize = env("BENCH_EVICTION_TRIALS", 3);

    let per_round = decisions(n);
    println!(
        "eviction decisions, {n} pods: {:.1} µs per round",
        per_round.as_secs_f64() * 1e6
    );

    let endpoint = std::env::var("DECKHAND_TEST_RUNTIME")
        .expect("DECKHAND_TEST_RUNTIME=unix://DIR/containerd.sock (scripts/testbed up DIR)");
    let cri = CriClient::connect(&parse_endpoint(&endpoint).unwrap(), Duration::from_secs(60))
        .await
        .expect("the testbed's containerd answers");
    let node = format!("bench-evict-{}", std::process::id());
    let base: PathBuf =
        std::env::temp_dir().join(format!("deckhand-bench-evict-{}", std::process::id()));
    let (root, logs) = (base.join("root"), base.join("logs"));
    std::fs::create_dir_all(&root).unwrap();
    std::fs::create_dir_all(&logs).unwrap();

    // n pods, as n running containers with their own pod UIDs, in one host-network sandbox.
    let sandbox_uid = format!("{node}-sandbox");
    let sandbox_config =
        common::host_network_sandbox(&node, &sandbox_uid, &format!("bench-{sandbox_uid}"), &logs);
    let sandbox = cri
        .run_pod_sandbox(RunPodSandboxRequest {
            config: Some(sandbox_config.clone()),
            runtime_handler: String::new(),
        })
        .await
        .expect("a host-network sandbox")
        .pod_sandbox_id;
    let made = Instant::now();
    for i in 0..n {
        let uid = format!("uid-{i}");
        let name = format!("c{i}");
        std::fs::create_dir_all(logs.join(&name)).unwrap();
        let id = cri
            .create_container(common::busybox_container(
                &sandbox,
                &sandbox_config,
                &name,
                vec!["sleep".into(), "600".into()],
                common::pod_labels(&node, &uid, &format!("bench-{uid}"), Some("app")),
            ))
            .await
            .unwrap();
        cri.start_container(id).await.unwrap();
    }
    eprintln!(
        "started {n} containers in {:.1}s",
        made.elapsed().as_secs_f64()
    );

    // Part 2: the observations.
    let observer = LiveObserver::new(cri.clone(), node.clone(), root.clone(), logs.clone());
    let first = observer.observe(Measure::AllPods).await.expect("a reading");
    assert_eq!(first.pods.len(), n, "every pod measured");
    let rounds = 20;
    // A round's signals alone, and a reading with every pod's usage (when one is chosen).
    for (what, pods) in [
        ("signals only", Measure::Node),
        ("with the pods' usage", Measure::AllPods),
    ] {
        let (wall0, cpu0) = (Instant::now(), cpu_time());
        for _ in 0..rounds {
            std::hint::black_box(observer.observe(pods.clone()).await.unwrap());
        }
        let (wall, cpu) = (wall0.elapsed() / rounds, (cpu_time() - cpu0) / rounds);
        println!(
            "eviction observations, {n} running pods, {what}: {:.1} ms per round (this process's CPU: {:.1} ms)",
            wall.as_secs_f64() * 1e3,
            cpu.as_secs_f64() * 1e3
        );
    }

    // Part 3: threshold crossed → eviction asked, with the real observer and period.
    let pods: Arc<Vec<Arc<Pod>>> = Arc::new((0..n).map(|i| Arc::new(pod(i))).collect());
    let mut latencies = Vec::new();
    for trial in 0..trials {
        let free = first.observations[&Signal::NodeFsAvailable].available;
        let free_now = nix::sys::statvfs::statvfs(&root)
            .map(|s| s.blocks_available() as i64 * s.fragment_size() as i64)
            .unwrap_or(free);
        let ballast_size: i64 = 256 << 20;
        let threshold_mi = (free_now - ballast_size / 2) >> 20;
        let recording = Recording {
            at: Arc::default(),
            pods: pods.clone(),
        };
        let mut manager = Manager::new(
            ManagerSettings {
                thresholds: thresholds(
                    &parse_flag(&format!("nodefs.available<{threshold_mi}Mi")).unwrap(),
                    &EvictionSettings::default(),
                ),
                pressure_transition_period: Duration::from_secs(1),
                max_pod_grace_period_seconds: 0,
                monitoring_period: period,
                node_name: node.clone(),
                local_storage_capacity_isolation: true,
            },
            LiveObserver::new(cri.clone(), node.clone(), root.clone(), logs.clone()),
            NoReclaim,
            recording.clone(),
            recording.clone(),
            PressureView::default(),
            Recorder::log_only(&node),
        );
        let cancel = tokio_util::sync::CancellationToken::new();
        let stop = cancel.clone();
        let task = tokio::spawn(async move { manager.run(stop).await });
        // Somewhere in the period, not in step with it.
        let offset = period.mul_f64(((trial * 37 + 11) % 100) as f64 / 100.0);
        tokio::time::sleep(Duration::from_millis(200) + offset).await;
        // The blocks are allocated in one call, so the crossing has a moment.
        let ballast = root.join("ballast");
        let file = std::fs::File::create(&ballast).unwrap();
        nix::fcntl::fallocate(&file, nix::fcntl::FallocateFlags::empty(), 0, ballast_size)
            .expect("fallocate on the bench's filesystem");
        let crossed = Instant::now();
        let deadline = crossed + period * 3;
        let at = loop {
            if let Some(at) = *recording.at.lock().unwrap() {
                break Some(at);
            }
            if Instant::now() > deadline {
                break None;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        cancel.cancel();
        let _ = task.await;
        std::fs::remove_file(&ballast).unwrap();
        match at {
            Some(at) => {
                let l = at.saturating_duration_since(crossed);
                eprintln!(
                    "trial {trial}: evicted {:.3}s after the threshold was crossed",
                    l.as_secs_f64()
                );
                latencies.push(l);
            }
            None => eprintln!("trial {trial}: no eviction within three periods"),
        }
    }
    if !latencies.is_empty() {
        let mean = latencies.iter().sum::<Duration>() / latencies.len() as u32;
        let max = latencies.iter().max().unwrap();
        println!(
            "threshold crossed → eviction asked (period {}s, {} trials): mean {:.2}s, max {:.2}s",
            period.as_secs_f64(),
            latencies.len(),
            mean.as_secs_f64(),
            max.as_secs_f64()
        );
    }

    // Clean up.
    let _ = cri.stop_pod_sandbox(sandbox.clone()).await;
    let _ = cri.remove_pod_sandbox(sandbox).await;
    let _ = std::fs::remove_dir_all(&base);
}
