//! Table tests of the eviction decisions, and rounds of the manager on fakes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStatus, Pod, PodSpec, PodStatus,
    ResourceRequirements, Toleration,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as KQuantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::sync::oneshot;

use super::decide::*;
use super::manager::{Manager, ManagerSettings, Outcome};
use super::observe::{ActivePods, EvictionError, Evictor, Measure, Observer, Reading, Reclaimer};
use super::signals::*;
use super::*;
use crate::base::clock::Instant;
use crate::base::podspec::threshold::{Threshold, parse_flag};
use crate::config::EvictionSettings;
use crate::kubelet::events::Recorder;

const MI: i64 = 1 << 20;

fn pod(name: &str, requests: &[(&str, &str)], priority: Option<i32>) -> Pod {
    let requests: BTreeMap<String, KQuantity> = requests
        .iter()
        .map(|(k, v)| (k.to_string(), KQuantity(v.to_string())))
        .collect();
    let limits = requests.clone();
    Pod {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(format!("uid-{name}")),
            annotations: Some(BTreeMap::from([(
                "kubernetes.io/config.source".to_string(),
                "api".to_string(),
            )])),
            ..Default::default()
        },
        spec: Some(PodSpec {
            priority,
            termination_grace_period_seconds: Some(30),
            containers: vec![Container {
                name: "app".into(),
                resources: (!requests.is_empty()).then(|| ResourceRequirements {
                    requests: Some(requests),
                    limits: Some(limits),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn static_pod(name: &str) -> Pod {
    let mut p = pod(name, &[], None);
    p.metadata.annotations = Some(BTreeMap::from([(
        "kubernetes.io/config.source".to_string(),
        "file".to_string(),
    )]));
    p
}

fn mem_usage(bytes: i64) -> PodUsage {
    PodUsage {
        memory_working_set: bytes as u64,
        containers: vec![ContainerUsage {
            name: "app".into(),
            memory_working_set: Some(bytes as u64),
            ..Default::default()
        }],
        ..Default::default()
    }
}

fn hard(text: &str) -> Vec<ThresholdSpec> {
    thresholds(&parse_flag(text).unwrap(), &EvictionSettings::default())
}

fn obs(pairs: &[(Signal, i64, i64)]) -> Observations {
    pairs
        .iter()
        .map(|(s, a, c)| {
            (
                *s,
                Observation {
                    available: *a,
                    capacity: *c,
                },
            )
        })
        .collect()
}

#[test]
fn quantities_are_written_as_kubernetes_writes_them() {
    for (amount, binary, decimal) in [
        (0, "0", "0"),
        (100 * MI, "100Mi", "104857600"),
        (1536 * MI, "1536Mi", "1610612736"),
        (1 << 30, "1Gi", "1073741824"),
        (1000, "1000", "1k"),
        (5_000_000, "5000000", "5M"),
        (1_050_000_123, "1050000123", "1050000123"),
    ] {
        assert_eq!(format_binary(amount), binary, "{amount}");
        assert_eq!(format_decimal(amount), decimal, "{amount}");
    }
}

#[test]
fn thresholds_take_grace_periods_and_minimum_reclaim() {
    let settings = EvictionSettings {
        soft: parse_flag("memory.available<1Gi,nodefs.available<0%").unwrap(),
        soft_grace_period: BTreeMap::from([("memory.available".into(), Duration::from_secs(90))]),
        minimum_reclaim: BTreeMap::from([(
            "memory.available".into(),
            Threshold::Quantity(crate::base::podspec::quantity::parse("50Mi").unwrap()),
        )]),
        ..Default::default()
    };
    let t = thresholds(
        &parse_flag("memory.available<100Mi,imagefs.available<100%").unwrap(),
        &settings,
    );
    // 0% and 100% mean "no threshold", as upstream.
    assert_eq!(t.len(), 2);
    assert!(t[0].is_hard());
    assert_eq!(t[0].quantity(0), 100 * MI);
    assert_eq!(t[0].min_reclaim.unwrap().amount(0), 50 * MI);
    assert!(!t[1].is_hard());
    assert_eq!(t[1].grace_period, Duration::from_secs(90));
}

#[test]
fn signals_map_to_resources_and_conditions() {
    for (signal, resource, condition) in [
        (
            Signal::MemoryAvailable,
            Resource::Memory,
            Condition::MemoryPressure,
        ),
        (
            Signal::NodeFsAvailable,
            Resource::EphemeralStorage,
            Condition::DiskPressure,
        ),
        (
            Signal::ImageFsInodesFree,
            Resource::Inodes,
            Condition::DiskPressure,
        ),
        (Signal::PidAvailable, Resource::Pids, Condition::PidPressure),
    ] {
        assert_eq!(signal.resource(), resource);
        assert_eq!(signal.condition(), condition);
        assert_eq!(Signal::parse(signal.as_str()), Some(signal));
    }
}

#[test]
fn hard_thresholds_act_at_once_and_conditions_wait_out_the_transition_period() {
    let t = hard("memory.available<100Mi,nodefs.available<10%");
    let mut state = EvictionState::default();
    let t0 = Instant::now();
    let period = Duration::from_secs(30);
    let ok = obs(&[
        (Signal::MemoryAvailable, 500 * MI, 1000 * MI),
        (Signal::NodeFsAvailable, 50, 100),
    ]);
    let low_memory = obs(&[
        (Signal::MemoryAvailable, 90 * MI, 1000 * MI),
        (Signal::NodeFsAvailable, 50, 100),
    ]);
    // (observations, seconds after t0, conditions, signals acted on)
    let cases: Vec<(&Observations, u64, Vec<Condition>, Vec<Signal>)> = vec![
        (&ok, 0, vec![], vec![]),
        (
            &low_memory,
            1,
            vec![Condition::MemoryPressure],
            vec![Signal::MemoryAvailable],
        ),
        // Clear again, but the condition holds for the transition period.
        (&ok, 2, vec![Condition::MemoryPressure], vec![]),
        (&ok, 30, vec![Condition::MemoryPressure], vec![]),
        (&ok, 31, vec![], vec![]),
    ];
    for (o, at, conditions, act) in cases {
        let round = state.step(&t, o, period, t0 + Duration::from_secs(at));
        assert_eq!(
            round.conditions,
            conditions.into_iter().collect::<BTreeSet<_>>(),
            "at {at}s"
        );
        let acted: Vec<Signal> = round.act_on.iter().map(|i| t[*i].signal).collect();
        assert_eq!(acted, act, "at {at}s");
    }
}

#[test]
fn soft_thresholds_wait_for_their_grace_period() {
    let settings = EvictionSettings {
        soft: parse_flag("memory.available<1Gi").unwrap(),
        soft_grace_period: BTreeMap::from([("memory.available".into(), Duration::from_secs(60))]),
        ..Default::default()
    };
    let t = thresholds(&BTreeMap::new(), &settings);
    let low = obs(&[(Signal::MemoryAvailable, 900 * MI, 4096 * MI)]);
    let ok = obs(&[(Signal::MemoryAvailable, 2048 * MI, 4096 * MI)]);
    let mut state = EvictionState::default();
    let t0 = Instant::now();
    let p = Duration::from_secs(300);
    let r = state.step(&t, &low, p, t0);
    assert_eq!(
        r.conditions,
        BTreeSet::from([Condition::MemoryPressure]),
        "the condition does not wait for the grace period"
    );
    assert!(r.act_on.is_empty());
    assert!(
        state
            .step(&t, &low, p, t0 + Duration::from_secs(59))
            .act_on
            .is_empty()
    );
    assert_eq!(
        state.step(&t, &low, p, t0 + Duration::from_secs(60)).act_on,
        vec![0]
    );
    // Cleared: the grace period starts again from the next time it is met.
    state.step(&t, &ok, p, t0 + Duration::from_secs(61));
    assert!(
        state
            .step(&t, &low, p, t0 + Duration::from_secs(62))
            .act_on
            .is_empty()
    );
}

#[test]
fn minimum_reclaim_keeps_a_threshold_met_until_reclaimed_beyond_it() {
    let settings = EvictionSettings {
        minimum_reclaim: BTreeMap::from([(
            "nodefs.available".into(),
            Threshold::Quantity(crate::base::podspec::quantity::parse("20").unwrap()),
        )]),
        ..Default::default()
    };
    let t = thresholds(&parse_flag("nodefs.available<10").unwrap(), &settings);
    let mut state = EvictionState::default();
    let now = Instant::now();
    let p = Duration::ZERO;
    let at = |a: i64| obs(&[(Signal::NodeFsAvailable, a, 1000)]);
    // (available, still acted on)
    for (available, met) in [(5, true), (15, true), (29, true), (30, false), (15, false)] {
        let r = state.step(&t, &at(available), p, now);
        assert_eq!(!r.act_on.is_empty(), met, "available {available}");
    }
    assert_eq!(thresholds_met(&t, [0], &at(25), true), vec![0]);
    assert!(thresholds_met(&t, [0], &at(25), false).is_empty());
}

#[test]
fn memory_is_reclaimed_first() {
    let t = hard("nodefs.available<50%,memory.available<100Mi,pid.available<10");
    let mut state = EvictionState::default();
    let o = obs(&[
        (Signal::NodeFsAvailable, 10, 100),
        (Signal::MemoryAvailable, MI, 1000 * MI),
        (Signal::PidAvailable, 5, 100),
    ]);
    let r = state.step(&t, &o, Duration::from_secs(1), Instant::now());
    assert_eq!(r.to_reclaim(&t).unwrap().signal, Signal::MemoryAvailable);
    assert_eq!(r.conditions.len(), 3);
    // A signal not observed meets nothing.
    let r = EvictionState::default().step(&t, &Observations::new(), Duration::ZERO, Instant::now());
    assert!(r.act_on.is_empty() && r.conditions.is_empty());
}

#[test]
fn what_is_reclaimed_for_each_signal() {
    use Reclaim::*;
    for (signal, dedicated, want) in [
        (Signal::MemoryAvailable, false, &[][..]),
        (Signal::PidAvailable, false, &[][..]),
        (
            Signal::NodeFsAvailable,
            false,
            &[DeadContainers, UnusedImages][..],
        ),
        (Signal::NodeFsAvailable, true, &[DeadContainers][..]),
        (Signal::NodeFsInodesFree, true, &[DeadContainers][..]),
        (
            Signal::ImageFsAvailable,
            true,
            &[DeadContainers, UnusedImages][..],
        ),
    ] {
        assert_eq!(
            reclaim_steps(signal, dedicated),
            want,
            "{signal:?} {dedicated}"
        );
    }
}

fn ranked(pods: &[(Pod, Option<PodUsage>)], signal: Signal, dedicated: bool) -> Vec<String> {
    let mut c: Vec<Candidate<'_>> = pods
        .iter()
        .map(|(p, u)| Candidate {
            pod: p,
            usage: u.as_ref(),
        })
        .collect();
    rank(&mut c, signal, dedicated);
    c.iter()
        .map(|c| c.pod.metadata.name.clone().unwrap())
        .collect()
}

#[test]
fn memory_ranking_is_upstreams() {
    type Case = (
        &'static str,
        Vec<(Pod, Option<PodUsage>)>,
        Vec<&'static str>,
    );
    let cases: Vec<Case> = vec![
        (
            "a BestEffort pod over its (zero) request goes before a Guaranteed pod under it",
            vec![
                (
                    pod("guaranteed", &[("memory", "1Gi"), ("cpu", "1")], None),
                    Some(mem_usage(500 * MI)),
                ),
                (pod("besteffort", &[], None), Some(mem_usage(300 * MI))),
            ],
            vec!["besteffort", "guaranteed"],
        ),
        (
            "among pods over their requests, lower priority first",
            vec![
                (pod("high", &[], Some(1000)), Some(mem_usage(900 * MI))),
                (pod("low", &[], Some(10)), Some(mem_usage(10 * MI))),
            ],
            vec!["low", "high"],
        ),
        (
            "same priority: the larger usage above requests first",
            vec![
                (
                    pod("small-over", &[("memory", "100Mi")], None),
                    Some(mem_usage(150 * MI)),
                ),
                (
                    pod("big-over", &[("memory", "100Mi")], None),
                    Some(mem_usage(400 * MI)),
                ),
            ],
            vec!["big-over", "small-over"],
        ),
        (
            "a pod without stats first",
            vec![
                (pod("measured", &[], None), Some(mem_usage(400 * MI))),
                (pod("unmeasured", &[], None), None),
            ],
            vec!["unmeasured", "measured"],
        ),
    ];
    for (what, pods, want) in cases {
        assert_eq!(
            ranked(&pods, Signal::MemoryAvailable, false),
            want,
            "{what}"
        );
    }
}

#[test]
fn disk_and_pid_ranking() {
    let disk = |logs: u64, rootfs: u64| PodUsage {
        logs_bytes: logs,
        rootfs_bytes: rootfs,
        ..Default::default()
    };
    let pods = vec![
        (
            pod("logs", &[("ephemeral-storage", "1Mi")], None),
            Some(disk(50 << 20, 0)),
        ),
        (pod("layers", &[], None), Some(disk(0, 80 << 20))),
        (
            pod("within", &[("ephemeral-storage", "1Gi")], None),
            Some(disk(100 << 20, 100 << 20)),
        ),
    ];
    // One filesystem: everything counts.
    assert_eq!(
        ranked(&pods, Signal::NodeFsAvailable, false),
        vec!["layers", "logs", "within"]
    );
    // A dedicated image filesystem: nodefs counts logs (and volumes) only, so the pod
    // with big layers uses nothing there, which is still more than usage − a 1Gi request.
    assert_eq!(
        ranked(&pods, Signal::NodeFsAvailable, true),
        vec!["logs", "layers", "within"]
    );
    assert_eq!(
        ranked(&pods, Signal::ImageFsAvailable, true),
        vec!["layers", "logs", "within"]
    );
    let procs = |n: u64| PodUsage {
        processes: Some(n),
        ..Default::default()
    };
    let pods = vec![
        (pod("few", &[], None), Some(procs(2))),
        (pod("many", &[], None), Some(procs(200))),
        (pod("important", &[], Some(100)), Some(procs(1000))),
    ];
    assert_eq!(
        ranked(&pods, Signal::PidAvailable, false),
        vec!["many", "few", "important"]
    );
}

#[test]
fn grace_periods() {
    let hard_t = &hard("memory.available<1Mi")[0];
    let soft_t = ThresholdSpec {
        grace_period: Duration::from_secs(60),
        ..hard_t.clone()
    };
    let mut p = pod("p", &[], None);
    // (threshold, pod's own, evictionMaxPodGracePeriod, want)
    for (t, own, max, want) in [
        (hard_t, Some(30), 10, 1),
        (&soft_t, Some(30), 10, 10),
        (&soft_t, Some(5), 10, 5),
        (&soft_t, Some(30), 0, 0),
        (&soft_t, Some(45), -1, 45),
        (&soft_t, None, 20, 20),
    ] {
        p.spec.as_mut().unwrap().termination_grace_period_seconds = own;
        assert_eq!(grace_period(t, &p, max), want, "{own:?} {max}");
    }
}

#[test]
fn the_message_is_upstreams() {
    let t = hard("memory.available<100Mi");
    let o = obs(&[(Signal::MemoryAvailable, 80 * MI, 4096 * MI)]);
    let p = pod("hog", &[("memory", "64Mi")], None);
    let usage = mem_usage(300 * MI);
    assert_eq!(
        eviction_message(Resource::Memory, &p, Some(&usage), &t, &[0], &o),
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 80Mi. \
         Container app was using 300Mi, request is 64Mi, has larger consumption of memory. "
    );
    // Under its request: no container line.
    let usage = mem_usage(10 * MI);
    assert_eq!(
        eviction_message(Resource::Memory, &p, Some(&usage), &t, &[0], &o),
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 80Mi. "
    );
    // No request at all: "request is 0".
    let p = pod("besteffort", &[], None);
    let usage = mem_usage(1000 * MI + 1);
    assert_eq!(
        eviction_message(Resource::Memory, &p, Some(&usage), &t, &[0], &o),
        "The node was low on resource: memory. Threshold quantity: 100Mi, available: 80Mi. \
         Container app was using 1048576001, request is 0, has larger consumption of memory. "
    );
    // A percentage threshold of a disk signal.
    let t = hard("nodefs.available<10%");
    let o = obs(&[(Signal::NodeFsAvailable, 5 * MI, 100 * MI)]);
    let usage = PodUsage {
        containers: vec![ContainerUsage {
            name: "app".into(),
            rootfs_bytes: Some(MI as u64),
            logs_bytes: Some(3 * MI as u64),
            ..Default::default()
        }],
        ..Default::default()
    };
    assert_eq!(
        eviction_message(Resource::EphemeralStorage, &p, Some(&usage), &t, &[0], &o),
        "The node was low on resource: ephemeral-storage. Threshold quantity: 10Mi, available: 5Mi. \
         Container app was using 4Mi, request is 0, has larger consumption of ephemeral-storage. "
    );
}

#[test]
fn admission_under_pressure() {
    let besteffort = pod("be", &[], None);
    let burstable = pod("bu", &[("memory", "64Mi")], None);
    let mut tolerating = pod("tol", &[], None);
    tolerating.spec.as_mut().unwrap().tolerations = Some(vec![Toleration {
        key: Some(MEMORY_PRESSURE_TAINT.into()),
        operator: Some("Exists".into()),
        effect: Some("NoSchedule".into()),
        ..Default::default()
    }]);
    let critical = pod("crit", &[], Some(SYSTEM_CRITICAL_PRIORITY));
    let static_ = static_pod("static");
    use Condition::*;
    let refused = |c: &[Condition]| {
        Some((
            REASON,
            format!(
                "The node had condition: [{}]. ",
                c.iter().map(|c| c.as_str()).collect::<Vec<_>>().join(" ")
            ),
        ))
    };
    // (pod, conditions, refused?)
    let cases: Vec<(&Pod, Vec<Condition>, bool)> = vec![
        (&besteffort, vec![], false),
        (&besteffort, vec![MemoryPressure], true),
        (&burstable, vec![MemoryPressure], false),
        (&tolerating, vec![MemoryPressure], false),
        (&burstable, vec![DiskPressure], true),
        (&tolerating, vec![MemoryPressure, DiskPressure], true),
        (&burstable, vec![PidPressure], true),
        (&critical, vec![MemoryPressure, DiskPressure], false),
        (&static_, vec![DiskPressure], false),
    ];
    for (p, conditions, want) in cases {
        let set: BTreeSet<Condition> = conditions.iter().copied().collect();
        let got = admit(p, &set);
        let want = if want { refused(&conditions) } else { None };
        assert_eq!(got, want, "{:?} under {conditions:?}", p.metadata.name);
    }
}

#[test]
fn an_evicted_pod_ends_failed() {
    let p = pod("hog", &[], None);
    let now = k8s_openapi::jiff::Timestamp::now();
    let last = PodStatus {
        phase: Some("Running".into()),
        container_statuses: Some(vec![ContainerStatus {
            name: "app".into(),
            ready: true,
            started: Some(true),
            container_id: Some("containerd://abc".into()),
            state: Some(ContainerState {
                running: Some(ContainerStateRunning { started_at: None }),
                ..Default::default()
            }),
            ..Default::default()
        }]),
        ..Default::default()
    };
    let s = evicted_status(
        &p,
        Some(last),
        "The node was low on resource: memory. ",
        now,
    );
    assert_eq!(s.phase.as_deref(), Some("Failed"));
    assert_eq!(s.reason.as_deref(), Some("Evicted"));
    assert_eq!(
        s.message.as_deref(),
        Some("The node was low on resource: memory. ")
    );
    assert_eq!(s.qos_class.as_deref(), Some("BestEffort"));
    let dt = s
        .conditions
        .as_ref()
        .unwrap()
        .iter()
        .find(|c| c.type_ == "DisruptionTarget")
        .unwrap();
    assert_eq!(dt.reason.as_deref(), Some("TerminationByKubelet"));
    let c = &s.container_statuses.as_ref().unwrap()[0];
    assert!(!c.ready);
    let t = c.state.as_ref().unwrap().terminated.as_ref().unwrap();
    assert_eq!(t.exit_code, 137);
}

// ---- rounds of the manager on fakes

#[derive(Clone, Default)]
struct Fakes {
    /// Readings handed out in turn (the last one repeats); a reading with the pods' usage is
    /// the one handed out last.
    readings: Arc<Mutex<Vec<Reading>>>,
    last: Arc<Mutex<Option<Reading>>>,
    /// How many readings had the pods' usage.
    with_pods: Arc<Mutex<usize>>,
    reclaimed: Arc<Mutex<Vec<Reclaim>>>,
    evicted: Arc<Mutex<Vec<(String, i64, String)>>>,
    pods: Arc<Mutex<Vec<Arc<Pod>>>>,
}

impl Observer for Fakes {
    fn observe(&self, measure: Measure) -> BoxFuture<'_, Result<Reading, EvictionError>> {
        let mut last = self.last.lock().unwrap();
        let next = match (&*last, measure.any_pods()) {
            (Some(last), true) => {
                *self.with_pods.lock().unwrap() += 1;
                last.clone()
            }
            _ => {
                let mut r = self.readings.lock().unwrap();
                let next = if r.len() > 1 {
                    r.remove(0)
                } else {
                    r[0].clone()
                };
                *last = Some(next.clone());
                Reading {
                    pods: Default::default(),
                    ..next
                }
            }
        };
        Box::pin(async move { Ok(next) })
    }
}

impl Reclaimer for Fakes {
    fn reclaim(&self, what: Reclaim) -> BoxFuture<'_, Result<usize, EvictionError>> {
        self.reclaimed.lock().unwrap().push(what);
        Box::pin(async { Ok(1) })
    }
}

impl Evictor for Fakes {
    fn evict(
        &self,
        uid: &str,
        grace: i64,
        message: String,
    ) -> BoxFuture<'_, Result<oneshot::Receiver<()>, EvictionError>> {
        self.evicted
            .lock()
            .unwrap()
            .push((uid.to_string(), grace, message));
        let (tx, rx) = oneshot::channel();
        let _ = tx.send(());
        Box::pin(async move { Ok(rx) })
    }
}

impl ActivePods for Fakes {
    fn active(&self) -> Vec<Arc<Pod>> {
        self.pods.lock().unwrap().clone()
    }
}

fn manager(fakes: &Fakes, flag: &str) -> Manager<Fakes, Fakes, Fakes, Fakes> {
    Manager::new(
        ManagerSettings {
            thresholds: hard(flag),
            pressure_transition_period: Duration::from_secs(5),
            max_pod_grace_period_seconds: 0,
            monitoring_period: Duration::from_secs(1),
            node_name: "node-a".into(),
            local_storage_capacity_isolation: true,
        },
        fakes.clone(),
        fakes.clone(),
        fakes.clone(),
        fakes.clone(),
        PressureView::default(),
        Recorder::log_only("node-a"),
    )
}

fn reading(signal: Signal, available: i64, pods: &[(&str, PodUsage)]) -> Reading {
    Reading {
        observations: obs(&[(signal, available, 1000 * MI)]),
        pods: pods
            .iter()
            .map(|(n, u)| (format!("uid-{n}"), u.clone()))
            .collect::<HashMap<_, _>>(),
        dedicated_imagefs: false,
    }
}

#[tokio::test]
async fn disk_pressure_is_reclaimed_before_any_pod_is_evicted() {
    let fakes = Fakes::default();
    *fakes.pods.lock().unwrap() = vec![Arc::new(pod("app", &[], None))];
    *fakes.readings.lock().unwrap() = vec![
        reading(Signal::NodeFsAvailable, 5 * MI, &[]),
        // After the reclaim: above the threshold again.
        reading(Signal::NodeFsAvailable, 500 * MI, &[]),
    ];
    let mut m = manager(&fakes, "nodefs.available<10Mi");
    let (outcome, _) = m.round().await.unwrap();
    assert_eq!(outcome, Outcome::Reclaimed);
    assert_eq!(
        *fakes.reclaimed.lock().unwrap(),
        vec![Reclaim::DeadContainers, Reclaim::UnusedImages]
    );
    assert!(fakes.evicted.lock().unwrap().is_empty());
    assert_eq!(
        *fakes.with_pods.lock().unwrap(),
        0,
        "no pod was chosen: their usage was not read"
    );
    assert!(m.pressure.has(Condition::DiskPressure));
    let last = m.last.lock().unwrap().clone();
    assert_eq!(last.action, "reclaimed");
    let record = last.last_reclaim.expect("the reclaim is recorded");
    assert_eq!(record.signal, "nodefs.available");
    assert!(record.enough);
    assert_eq!(
        record.removed,
        BTreeMap::from([("dead_containers".into(), 1), ("unused_images".into(), 1)])
    );
}

#[tokio::test]
async fn imagefs_pressure_the_reclaim_does_not_end_evicts_a_pod() {
    let fakes = Fakes::default();
    *fakes.pods.lock().unwrap() = vec![Arc::new(pod("app", &[], None))];
    let imagefs = |available: i64| Reading {
        dedicated_imagefs: true,
        ..reading(Signal::ImageFsAvailable, available, &[])
    };
    // Still under the threshold after the reclaim.
    *fakes.readings.lock().unwrap() = vec![imagefs(5 * MI), imagefs(8 * MI)];
    let mut m = manager(&fakes, "imagefs.available<10Mi");
    let (outcome, _) = m.round().await.unwrap();
    assert_eq!(outcome, Outcome::Evicted("uid-app".into()));
    assert_eq!(
        *fakes.reclaimed.lock().unwrap(),
        vec![Reclaim::DeadContainers, Reclaim::UnusedImages],
        "a dedicated image filesystem: containers' writable layers and images both live there"
    );
    let last = m.last.lock().unwrap().clone();
    assert!(last.action.starts_with("evicted "), "{}", last.action);
    let record = last.last_reclaim.expect("the reclaim is recorded");
    assert_eq!(record.signal, "imagefs.available");
    assert!(!record.enough);
}

#[tokio::test]
async fn memory_pressure_evicts_the_top_ranked_pod_but_never_a_static_one() {
    let fakes = Fakes::default();
    *fakes.pods.lock().unwrap() = vec![
        Arc::new(static_pod("static")),
        Arc::new(pod("guaranteed", &[("memory", "1Gi"), ("cpu", "1")], None)),
        Arc::new(pod("hog", &[], None)),
    ];
    *fakes.readings.lock().unwrap() = vec![reading(
        Signal::MemoryAvailable,
        50 * MI,
        &[
            ("static", mem_usage(900 * MI)),
            ("guaranteed", mem_usage(100 * MI)),
            ("hog", mem_usage(400 * MI)),
        ],
    )];
    let mut m = manager(&fakes, "memory.available<100Mi");
    let (outcome, done) = m.round().await.unwrap();
    assert_eq!(outcome, Outcome::Evicted("uid-hog".into()));
    assert!(done.is_some());
    assert!(
        fakes.reclaimed.lock().unwrap().is_empty(),
        "nothing to reclaim for memory"
    );
    let evicted = fakes.evicted.lock().unwrap().clone();
    assert_eq!(evicted.len(), 1, "one pod per round");
    assert_eq!(
        *fakes.with_pods.lock().unwrap(),
        1,
        "the pods' usage is read to rank them"
    );
    assert_eq!(
        evicted[0].1, 1,
        "hard threshold: upstream's immediate grace"
    );
    assert!(
        evicted[0]
            .2
            .starts_with("The node was low on resource: memory. Threshold quantity: 100Mi, available: 50Mi. Container app was using 400Mi"),
        "{}",
        evicted[0].2
    );
    assert_eq!(
        m.pressure.conditions(),
        BTreeSet::from([Condition::MemoryPressure])
    );
    // Only static pods left: nothing can be evicted.
    *fakes.pods.lock().unwrap() = vec![Arc::new(static_pod("static"))];
    let (outcome, _) = m.round().await.unwrap();
    assert_eq!(outcome, Outcome::NoneEvictable);
}

/// A pod with `ephemeral-storage` limits on its containers (name, limit) and emptyDirs
/// (name, sizeLimit, medium).
fn storage_pod(name: &str, containers: &[(&str, &str)], dirs: &[(&str, &str, &str)]) -> Pod {
    let mut p = pod(name, &[], None);
    let spec = p.spec.as_mut().unwrap();
    spec.containers = containers
        .iter()
        .map(|(c, limit)| Container {
            name: c.to_string(),
            resources: (!limit.is_empty()).then(|| ResourceRequirements {
                limits: Some(BTreeMap::from([(
                    "ephemeral-storage".to_string(),
                    KQuantity(limit.to_string()),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        })
        .collect();
    spec.volumes = Some(
        dirs.iter()
            .map(|(v, size, medium)| k8s_openapi::api::core::v1::Volume {
                name: v.to_string(),
                empty_dir: Some(k8s_openapi::api::core::v1::EmptyDirVolumeSource {
                    size_limit: (!size.is_empty()).then(|| KQuantity(size.to_string())),
                    medium: (!medium.is_empty()).then(|| medium.to_string()),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect(),
    );
    p
}

/// Usage: each container's (name, rootfs, logs) and each emptyDir's (name, bytes).
fn storage_usage(containers: &[(&str, u64, u64)], dirs: &[(&str, u64)]) -> PodUsage {
    PodUsage {
        rootfs_bytes: containers.iter().map(|c| c.1).sum(),
        logs_bytes: containers.iter().map(|c| c.2).sum(),
        volumes_bytes: dirs.iter().map(|d| d.1).sum(),
        volume_bytes: dirs.iter().map(|(n, b)| (n.to_string(), *b)).collect(),
        containers: containers
            .iter()
            .map(|(n, r, l)| ContainerUsage {
                name: n.to_string(),
                rootfs_bytes: Some(*r),
                logs_bytes: Some(*l),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

#[test]
fn local_storage_limits_decide_in_upstreams_order() {
    use super::local_storage::{Limit, exceeded, has_limits};
    let m = MI as u64;
    struct Case {
        name: &'static str,
        pod: Pod,
        usage: PodUsage,
        dedicated_imagefs: bool,
        want: Option<(Limit, &'static str)>,
    }
    let cases = [
        Case {
            name: "no limits: never",
            pod: storage_pod("p", &[("app", "")], &[("scratch", "", "")]),
            usage: storage_usage(&[("app", 900 * m, 0)], &[("scratch", 900 * m)]),
            dedicated_imagefs: false,
            want: None,
        },
        Case {
            name: "the upstream spec: 10Mi written under a 5Mi container limit",
            pod: storage_pod("p", &[("bar", "5Mi")], &[]),
            usage: storage_usage(&[("bar", 10 * m, 0)], &[]),
            dedicated_imagefs: false,
            // The pod's limit (the sum, 5Mi) is met first, as upstream checks it first.
            want: Some((
                Limit::Pod,
                "Pod ephemeral local storage usage exceeds the total limit of containers 5Mi. ",
            )),
        },
        Case {
            name: "a container over its own limit while the pod is under the sum",
            pod: storage_pod("p", &[("a", "5Mi"), ("b", "100Mi")], &[]),
            usage: storage_usage(&[("a", 4 * m, 2 * m), ("b", 0, 0)], &[]),
            dedicated_imagefs: false,
            want: Some((
                Limit::Container,
                "Container a exceeded its local ephemeral storage limit \"5Mi\". ",
            )),
        },
        Case {
            name: "with a dedicated image filesystem only the logs count for a container",
            pod: storage_pod("p", &[("a", "5Mi"), ("b", "100Mi")], &[]),
            usage: storage_usage(&[("a", 4 * m, 2 * m), ("b", 0, 0)], &[]),
            dedicated_imagefs: true,
            want: None,
        },
        Case {
            name: "exactly at the limit is not over it",
            pod: storage_pod("p", &[("a", "5Mi")], &[]),
            usage: storage_usage(&[("a", 5 * m, 0)], &[]),
            dedicated_imagefs: false,
            want: None,
        },
        Case {
            name: "an emptyDir over its sizeLimit comes first",
            pod: storage_pod("p", &[("a", "5Mi")], &[("cache", "1Mi", "")]),
            usage: storage_usage(&[("a", 9 * m, 0)], &[("cache", 2 * m)]),
            dedicated_imagefs: false,
            want: Some((
                Limit::EmptyDir,
                "Usage of EmptyDir volume \"cache\" exceeds the limit \"1Mi\". ",
            )),
        },
        Case {
            name: "a memory-backed emptyDir is left to its tmpfs",
            pod: storage_pod("p", &[("a", "")], &[("shm", "1Mi", "Memory")]),
            usage: storage_usage(&[("a", 0, 0)], &[("shm", 2 * m)]),
            dedicated_imagefs: false,
            want: None,
        },
        Case {
            name: "an emptyDir not measured is not judged",
            pod: storage_pod("p", &[("a", "")], &[("cache", "1Mi", "")]),
            usage: storage_usage(&[("a", 0, 0)], &[]),
            dedicated_imagefs: false,
            want: None,
        },
    ];
    for c in cases {
        let got = exceeded(&c.pod, &c.usage, c.dedicated_imagefs).map(|e| (e.limit, e.message));
        let want = c.want.map(|(l, m)| (l, m.to_string()));
        assert_eq!(got, want, "{}", c.name);
    }
    assert!(!has_limits(&storage_pod(
        "p",
        &[("a", "")],
        &[("d", "", "")]
    )));
    assert!(!has_limits(&storage_pod(
        "p",
        &[("a", "")],
        &[("d", "1Mi", "Memory")]
    )));
    assert!(has_limits(&storage_pod(
        "p",
        &[("a", "")],
        &[("d", "1Mi", "")]
    )));
    assert!(has_limits(&storage_pod("p", &[("a", "1Gi")], &[])));
}

#[tokio::test]
async fn a_pod_over_its_ephemeral_storage_limit_is_evicted_without_node_pressure() {
    let fakes = Fakes::default();
    let over = storage_pod("over", &[("bar", "5Mi")], &[]);
    *fakes.pods.lock().unwrap() = vec![Arc::new(pod("unlimited", &[], None)), Arc::new(over)];
    *fakes.readings.lock().unwrap() = vec![reading(
        Signal::MemoryAvailable,
        900 * MI,
        &[
            ("unlimited", storage_usage(&[("app", 900 << 20, 0)], &[])),
            ("over", storage_usage(&[("bar", 10 << 20, 0)], &[])),
        ],
    )];
    let mut m = manager(&fakes, "memory.available<100Mi");
    let (outcome, done) = m.round().await.unwrap();
    assert_eq!(outcome, Outcome::Evicted("uid-over".into()));
    assert!(done.is_some());
    let evicted = fakes.evicted.lock().unwrap().clone();
    assert_eq!(
        evicted,
        vec![(
            "uid-over".to_string(),
            1,
            "Pod ephemeral local storage usage exceeds the total limit of containers 5Mi. "
                .to_string()
        )]
    );
    assert!(!m.pressure.has(Condition::MemoryPressure));
    assert_eq!(
        m.last
            .lock()
            .unwrap()
            .last_eviction
            .as_ref()
            .unwrap()
            .signal,
        "ephemeralpodfs.limit"
    );
}

#[tokio::test]
async fn pods_without_local_storage_limits_are_not_measured_and_the_check_can_be_off() {
    let fakes = Fakes::default();
    *fakes.pods.lock().unwrap() = vec![Arc::new(pod("unlimited", &[], None))];
    *fakes.readings.lock().unwrap() = vec![reading(Signal::MemoryAvailable, 900 * MI, &[])];
    let mut m = manager(&fakes, "memory.available<100Mi");
    assert_eq!(m.round().await.unwrap().0, Outcome::Nothing);
    assert_eq!(
        *fakes.with_pods.lock().unwrap(),
        0,
        "no pod's usage was read"
    );

    let fakes = Fakes::default();
    *fakes.pods.lock().unwrap() = vec![Arc::new(storage_pod("over", &[("bar", "5Mi")], &[]))];
    *fakes.readings.lock().unwrap() = vec![reading(
        Signal::MemoryAvailable,
        900 * MI,
        &[("over", storage_usage(&[("bar", 10 << 20, 0)], &[]))],
    )];
    let mut m = manager(&fakes, "memory.available<100Mi");
    m.settings.local_storage_capacity_isolation = false;
    assert_eq!(m.round().await.unwrap().0, Outcome::Nothing);
    assert!(fakes.evicted.lock().unwrap().is_empty());
}
