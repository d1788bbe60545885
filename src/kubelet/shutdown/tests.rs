//! The manager against a fake logind and fake pods, under a paused clock.

use std::collections::HashMap;
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::PodSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::*;
use crate::kubelet::shutdown::plan::{NODE_CRITICAL_PRIORITY, SYSTEM_CRITICAL_PRIORITY};

/// What the fake logind saw and holds.
#[derive(Default)]
struct BusState {
    /// Our ends of the lock descriptors handed out, in order.
    locks: Vec<UnixStream>,
    /// The signal sender of the newest subscription.
    signals: Option<mpsc::UnboundedSender<bool>>,
    connects: u32,
    refuse_connect: bool,
}

#[derive(Clone, Default)]
struct FakeConnector(Arc<Mutex<BusState>>);

struct FakeBus(Arc<Mutex<BusState>>);

impl LogindConnector for FakeConnector {
    type Bus = FakeBus;
    async fn connect(&self) -> Result<FakeBus, LogindError> {
        let mut s = self.0.lock().unwrap();
        s.connects += 1;
        if s.refuse_connect {
            return Err(LogindError::Connect(zbus::Error::Unsupported));
        }
        Ok(FakeBus(self.0.clone()))
    }
}

impl Logind for FakeBus {
    async fn inhibit_delay_max(&self) -> Result<Duration, LogindError> {
        Ok(Duration::from_secs(5))
    }
    async fn inhibit(&self) -> Result<InhibitLock, LogindError> {
        let (ours, theirs) = UnixStream::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        self.0.lock().unwrap().locks.push(ours);
        Ok(InhibitLock::new(theirs.into()))
    }
    async fn shutdown_signals(&self) -> Result<ShutdownSignals, LogindError> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.0.lock().unwrap().signals = Some(tx);
        Ok(tokio_stream::wrappers::UnboundedReceiverStream::new(rx).boxed())
    }
}

impl FakeConnector {
    fn send(&self, on: bool) {
        let s = self.0.lock().unwrap();
        s.signals.as_ref().expect("subscribed").send(on).unwrap();
    }
    /// Whether each lock handed out is still held.
    fn held(&self) -> Vec<bool> {
        let mut s = self.0.lock().unwrap();
        s.locks
            .iter_mut()
            .map(|l| {
                let mut buf = [0u8; 1];
                !matches!(l.read(&mut buf), Ok(0))
            })
            .collect()
    }
    fn lose_connection(&self) {
        self.0.lock().unwrap().signals = None;
    }
}

/// Pods that take a given time to stop (or never), recording each kill.
#[derive(Clone)]
struct FakePods {
    pods: Vec<Arc<Pod>>,
    takes: HashMap<String, Option<Duration>>,
    started: Instant,
    kills: Arc<Mutex<Vec<(String, i64, Duration)>>>,
    stopped: Arc<Mutex<Vec<(String, Duration)>>>,
}

impl NodePods for FakePods {
    async fn active(&self) -> Vec<Arc<Pod>> {
        self.pods.clone()
    }
    async fn kill(&self, uid: &str, grace: i64) {
        self.kills
            .lock()
            .unwrap()
            .push((uid.to_string(), grace, self.started.elapsed()));
        match self.takes.get(uid).copied().flatten() {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending::<()>().await,
        }
        self.stopped
            .lock()
            .unwrap()
            .push((uid.to_string(), self.started.elapsed()));
    }
}

fn pod(uid: &str, priority: Option<i32>, class: Option<&str>, grace: i64) -> Arc<Pod> {
    Arc::new(Pod {
        metadata: ObjectMeta {
            name: Some(uid.into()),
            namespace: Some("default".into()),
            uid: Some(uid.into()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            priority,
            priority_class_name: class.map(str::to_string),
            termination_grace_period_seconds: Some(grace),
            ..Default::default()
        }),
        ..Default::default()
    })
}

fn pods(takes: &[(&str, Option<u64>)], list: Vec<Arc<Pod>>) -> FakePods {
    FakePods {
        pods: list,
        takes: takes
            .iter()
            .map(|(u, t)| (u.to_string(), t.map(Duration::from_secs)))
            .collect(),
        started: Instant::now(),
        kills: Arc::default(),
        stopped: Arc::default(),
    }
}

/// Pods' volume mounts that go away at given times after the start (`None`: never).
#[derive(Clone)]
struct FakeVolumes {
    started: Instant,
    unmounted_at: HashMap<String, Option<Duration>>,
}

impl volumes::PodVolumes for FakeVolumes {
    fn still_mounted<'a>(
        &'a self,
        uids: &'a [String],
    ) -> futures::future::BoxFuture<'a, Vec<PathBuf>> {
        let now = self.started.elapsed();
        let left = uids
            .iter()
            .filter(|uid| match self.unmounted_at.get(*uid) {
                Some(Some(at)) => now < *at,
                Some(None) => true,
                None => false,
            })
            .map(|uid| PathBuf::from(format!("/pods/{uid}/volumes/secret")))
            .collect();
        Box::pin(async move { left })
    }
}

fn settings(dir: &tempfile::TempDir) -> ManagerSettings {
    settings_with(dir, &[])
}

/// Settings whose pods' volumes are unmounted `unmounted_at` seconds after the start (no
/// entry: nothing mounted; `None`: never unmounted).
fn settings_with(dir: &tempfile::TempDir, unmounted_at: &[(&str, Option<u64>)]) -> ManagerSettings {
    ManagerSettings {
        buckets: crate::config::shutdown::buckets(
            Duration::from_secs(30),
            Duration::from_secs(10),
            &[],
        ),
        state_file: dir.path().join(STATE_FILE),
        events: crate::kubelet::events::Recorder::log_only("node-a"),
        node_name: "node-a".into(),
        volumes: Arc::new(FakeVolumes {
            started: Instant::now(),
            unmounted_at: unmounted_at
                .iter()
                .map(|(u, t)| (u.to_string(), t.map(Duration::from_secs)))
                .collect(),
        }),
    }
}

async fn until(what: &str, mut f: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test(start_paused = true)]
async fn regular_pods_stop_first_critical_last_then_the_lock_is_released() {
    let dir = tempfile::tempdir().unwrap();
    let bus = FakeConnector::default();
    let fake = pods(
        &[
            ("web", Some(3)),
            ("slow", Some(1)),
            ("crit", Some(2)),
            ("static-crit", Some(1)),
        ],
        vec![
            pod("crit", Some(NODE_CRITICAL_PRIORITY), None, 30),
            pod("web", Some(0), None, 30),
            pod("slow", None, None, 5),
            pod("static-crit", None, Some("system-node-critical"), 30),
        ],
    );
    let status = ShutdownStatus::default();
    let manager = Manager::new(bus.clone(), fake.clone(), settings(&dir), status.clone());
    let cancel = CancellationToken::new();
    let task = tokio::spawn(manager.run(cancel.clone()));
    until("the lock", || bus.held() == [true]).await;
    assert!(!status.shutting_down());

    let t0 = fake.started.elapsed();
    bus.send(true);
    until("the lock released", || bus.held() == [false]).await;
    assert!(
        status.shutting_down(),
        "not ready until the shutdown is cancelled"
    );
    let kills = fake.kills.lock().unwrap().clone();
    let at = |uid: &str| kills.iter().find(|k| k.0 == uid).cloned().unwrap();
    // Regular pods: the 20 s of the bucket, or their own shorter grace.
    assert_eq!(at("web").1, 20);
    assert_eq!(at("slow").1, 5);
    // Critical pods: the last 10 s, and only once the regular ones have stopped (3 s).
    assert_eq!(at("crit").1, 10);
    assert_eq!(at("static-crit").1, 10);
    assert_eq!(at("crit").2 - t0, Duration::from_secs(3));
    assert_eq!(at("static-crit").2 - t0, Duration::from_secs(3));
    let saved: ShutdownState =
        serde_json::from_slice(&std::fs::read(dir.path().join(STATE_FILE)).unwrap()).unwrap();
    assert!(saved.start_time.is_some() && saved.end_time >= saved.start_time);

    // Cancelled: the node is ready again and a new lock is held.
    bus.send(false);
    until("a new lock", || bus.held() == [false, true]).await;
    assert!(!status.shutting_down());
    cancel.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_pod_that_does_not_stop_holds_its_step_for_the_grace_only() {
    let dir = tempfile::tempdir().unwrap();
    let bus = FakeConnector::default();
    let fake = pods(
        &[("stuck", None), ("crit", Some(1))],
        vec![
            pod("stuck", Some(0), None, 30),
            pod("crit", Some(SYSTEM_CRITICAL_PRIORITY), None, 30),
        ],
    );
    let manager = Manager::new(
        bus.clone(),
        fake.clone(),
        settings(&dir),
        ShutdownStatus::default(),
    );
    let cancel = CancellationToken::new();
    let task = tokio::spawn(manager.run(cancel.clone()));
    until("the lock", || bus.held() == [true]).await;
    let t0 = fake.started.elapsed();
    bus.send(true);
    until("the lock released", || bus.held() == [false]).await;
    let kills = fake.kills.lock().unwrap().clone();
    let crit = kills.iter().find(|k| k.0 == "crit").unwrap();
    assert_eq!(crit.2 - t0, Duration::from_secs(20));
    cancel.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn no_bus_at_start_means_no_graceful_shutdown_and_a_lost_bus_is_reconnected() {
    let dir = tempfile::tempdir().unwrap();
    let refused = FakeConnector::default();
    refused.0.lock().unwrap().refuse_connect = true;
    let manager = Manager::new(
        refused.clone(),
        pods(&[], vec![]),
        settings(&dir),
        ShutdownStatus::default(),
    );
    // As upstream: logged, and not tried again.
    manager.run(CancellationToken::new()).await;
    assert_eq!(refused.0.lock().unwrap().connects, 1);

    let bus = FakeConnector::default();
    let manager = Manager::new(
        bus.clone(),
        pods(&[], vec![]),
        settings(&dir),
        ShutdownStatus::default(),
    );
    let cancel = CancellationToken::new();
    let task = tokio::spawn(manager.run(cancel.clone()));
    until("the lock", || bus.held() == [true]).await;
    bus.lose_connection();
    until("a second connection", || {
        bus.0.lock().unwrap().connects == 2
    })
    .await;
    until("a second lock", || bus.held().len() == 2).await;
    cancel.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_next_step_waits_for_the_volumes_of_the_last_within_its_grace() {
    // Regular pods get 20 s, critical ones 10 s. Each case: when the regular pod stops, when
    // its volumes are unmounted (`None`: never), and when the critical pod is killed.
    let cases: &[(u64, Option<u64>, u64)] = &[
        // Unmounted with the stop (or nothing mounted): straight on.
        (2, Some(0), 2),
        // Unmounted 5 s after the stop: the critical step waits for it.
        (2, Some(7), 7),
        // Never unmounted: the critical step starts at the end of the regular grace.
        (2, None, 20),
    ];
    for &(stops, unmounted, crit_at) in cases {
        let dir = tempfile::tempdir().unwrap();
        let bus = FakeConnector::default();
        let fake = pods(
            &[("web", Some(stops)), ("crit", Some(1))],
            vec![
                pod("web", Some(0), None, 30),
                pod("crit", Some(SYSTEM_CRITICAL_PRIORITY), None, 30),
            ],
        );
        let manager = Manager::new(
            bus.clone(),
            fake.clone(),
            settings_with(&dir, &[("web", unmounted)]),
            ShutdownStatus::default(),
        );
        let cancel = CancellationToken::new();
        let task = tokio::spawn(manager.run(cancel.clone()));
        until("the lock", || bus.held() == [true]).await;
        bus.send(true);
        until("the lock released", || bus.held() == [false]).await;
        let kills = fake.kills.lock().unwrap().clone();
        let crit = kills.iter().find(|k| k.0 == "crit").unwrap();
        // The fake's clock started with the settings, a moment before the signal.
        let since_start = crit.2.as_secs_f64();
        assert!(
            (since_start - crit_at as f64).abs() < 0.5,
            "stop {stops}s, unmount {unmounted:?}: critical pod killed at {since_start}s, want {crit_at}s"
        );
        cancel.cancel();
        task.await.unwrap();
    }
}
