//! The probe workers of every pod, what they concluded, and the link to the pod workers.
//!
//! Workers are keyed by container instance (container ID) and probe kind: a restarted container
//! is a new instance and gets new workers with fresh counts, and the workers of an instance end
//! when [`ProbeManager::sync_pod`] no longer sees it running (its results go with them).
//! Verdicts are kept per instance; a change wakes the pod's worker, whose next sync publishes the
//! new status or kills the unhealthy instance. A readiness change also goes straight to the
//! published status through the [`ReadinessSink`] (upstream's `SetContainerReadiness`), so it
//! reaches `/pods` and the API server within milliseconds of the probe's answer even while the
//! pod's worker is busy with something else.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, Probe as ProbeSpec};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::handlers;
use super::metrics::{ProbeCounters, SeriesKey};
use super::worker::{Report, StartupGate, Verdict, WorkerConfig, random_below, run_worker};
use super::{ProbeKind, ProbeOutcome, ProbeView, Unhealthy};
use crate::base::clock;
use crate::base::observed::{ContainerState, ObservedContainer, ObservedPod};
use crate::base::podspec::is_sidecar;
use crate::base::resync_queue::Pokes;
use crate::clients::cri::RuntimeService;
use crate::kubelet::events::{EventType, Recorder, container_ref, reason};

/// Told of every readiness change at once: pod UID, container ID, ready.
pub(crate) type ReadinessSink = Arc<dyn Fn(&str, &str, bool) + Send + Sync>;

/// Runs the probes of every pod on the node.
#[derive(Clone)]
pub struct ProbeManager<R> {
    rt: R,
    shared: Arc<Shared>,
    cancel: CancellationToken,
    host_ip: Option<String>,
    /// Every probe worker is tracked, so shutdown waits for them to end.
    tracker: TaskTracker,
    events: Recorder,
}

struct Shared {
    wake: Pokes,
    /// Where readiness changes go at once (set once, by the pod workers).
    readiness: std::sync::OnceLock<ReadinessSink>,
    /// When the manager was made: workers that start within one period of it (adopted
    /// containers after an agent restart) wait a random part of the period first.
    created: Instant,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// By pod UID, then container ID.
    pods: HashMap<String, HashMap<String, Instance>>,
    counters: ProbeCounters,
}

/// One running container instance with probes.
struct Instance {
    name: String,
    attempt: u32,
    view: ProbeView,
    unhealthy: Option<Unhealthy>,
    /// The last failed probe run's message while it is the newest result of its probe, for
    /// `deckhand pods` to say why a container is not ready or was killed.
    failing: Option<String>,
    /// Stops the instance's workers.
    stop: CancellationToken,
}

impl<R: RuntimeService> ProbeManager<R> {
    /// `wake` is poked with a pod UID whenever a probe result of that pod changes.
    pub fn new(
        rt: R,
        wake: Pokes,
        host_ip: Option<String>,
        tracker: TaskTracker,
        events: Recorder,
        cancel: CancellationToken,
    ) -> Self {
        ProbeManager {
            events,
            rt,
            shared: Arc::new(Shared {
                wake,
                readiness: std::sync::OnceLock::new(),
                created: clock::instant(),
                state: Mutex::new(State::default()),
            }),
            cancel,
            host_ip,
            tracker,
        }
    }

    /// Sends every readiness change to `sink` as it happens, besides waking the pod's worker
    /// (the first sink set stays).
    pub(crate) fn on_readiness(&self, sink: ReadinessSink) {
        let _ = self.shared.readiness.set(sink);
    }

    /// Starts workers for running containers of `pod` that have probes, and stops the workers
    /// of containers that no longer run.
    pub fn sync_pod(&self, pod: &Arc<Pod>, observed: &ObservedPod) {
        let Some(uid) = pod.metadata.uid.clone() else {
            return;
        };
        let Some(spec) = pod.spec.as_ref() else {
            return;
        };
        let running: Vec<&ObservedContainer> = observed
            .containers
            .iter()
            .filter(|c| c.state == ContainerState::Running)
            .collect();
        let mut start = Vec::new();
        {
            let mut state = self.shared.lock();
            let instances = state.pods.entry(uid.clone()).or_default();
            instances.retain(|id, inst| {
                let keep = running.iter().any(|c| &c.id == id);
                if !keep {
                    inst.stop.cancel();
                }
                keep
            });
            for c in &running {
                if instances.contains_key(&c.id) {
                    continue;
                }
                // App containers and sidecars (restartable init containers) are probed; a
                // regular init container runs to completion and has no probes.
                let container = if c.is_init {
                    spec.init_containers
                        .iter()
                        .flatten()
                        .find(|s| s.name == c.name && is_sidecar(s))
                } else {
                    spec.containers.iter().find(|s| s.name == c.name)
                };
                let Some(container) = container else {
                    continue;
                };
                if container.startup_probe.is_none()
                    && container.liveness_probe.is_none()
                    && container.readiness_probe.is_none()
                {
                    continue;
                }
                let stop = self.cancel.child_token();
                instances.insert(
                    c.id.clone(),
                    Instance {
                        name: c.name.clone(),
                        attempt: c.attempt,
                        view: ProbeView {
                            ready: container.readiness_probe.as_ref().map(|_| false),
                            started: container.startup_probe.as_ref().map(|_| false),
                        },
                        unhealthy: None,
                        failing: None,
                        stop: stop.clone(),
                    },
                );
                start.push((*c, container, stop));
            }
            if instances.is_empty() {
                state.pods.remove(&uid);
            }
        }
        for (c, container, stop) in start {
            self.start_workers(pod, &uid, c, container, observed, stop);
        }
    }

    /// Spawns one task per probe of a newly running instance.
    fn start_workers(
        &self,
        pod: &Pod,
        uid: &str,
        c: &ObservedContainer,
        container: &Container,
        observed: &ObservedPod,
        stop: CancellationToken,
    ) {
        let target = self.probe_ip(observed, c);
        let running_for = c
            .started_time()
            .and_then(|t| clock::now().duration_since(t).ok())
            .unwrap_or_default();
        let (started_tx, started_rx) = watch::channel(false);
        let has_startup = container.startup_probe.is_some();
        let kinds = [
            (ProbeKind::Startup, &container.startup_probe),
            (ProbeKind::Liveness, &container.liveness_probe),
            (ProbeKind::Readiness, &container.readiness_probe),
        ];
        for (kind, probe) in kinds {
            let Some(probe) = probe else { continue };
            let gate = match kind {
                ProbeKind::Startup => StartupGate {
                    wait: None,
                    signal: Some(started_tx.clone()),
                },
                _ if has_startup => StartupGate {
                    wait: Some(started_rx.clone()),
                    signal: None,
                },
                _ => StartupGate::default(),
            };
            let cfg = self.worker_config(kind, probe, &c.name, running_for);
            let handler =
                handlers::build(probe, container, &c.id, target.as_deref(), self.rt.clone());
            let report = InstanceReport {
                shared: self.shared.clone(),
                events: self.events.clone(),
                object: container_ref(pod, &c.name),
                uid: uid.to_string(),
                container_id: c.id.clone(),
                series: SeriesKey {
                    pod_uid: uid.to_string(),
                    namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                    pod: pod.metadata.name.clone().unwrap_or_default(),
                    container: c.name.clone(),
                    kind,
                },
            };
            tracing::debug!(
                container = %c.name,
                container_id = %c.id,
                probe = kind.as_str(),
                first_in_ms = cfg.first_wait().as_millis() as u64,
                "starting probe worker"
            );
            self.tracker
                .spawn(run_worker(cfg, handler, report, gate, stop.clone()));
        }
    }

    fn worker_config(
        &self,
        kind: ProbeKind,
        probe: &ProbeSpec,
        name: &str,
        running_for: Duration,
    ) -> WorkerConfig {
        let secs =
            |v: Option<i32>, default: i32| Duration::from_secs(v.unwrap_or(default).max(0) as u64);
        let period = secs(probe.period_seconds, 10).max(Duration::from_secs(1));
        let jitter = if self.shared.created.elapsed() < period {
            random_below(period)
        } else {
            Duration::ZERO
        };
        WorkerConfig {
            kind,
            container_name: name.to_string(),
            initial_delay: secs(probe.initial_delay_seconds, 0),
            period,
            success_threshold: probe.success_threshold.unwrap_or(1).max(1) as u32,
            failure_threshold: probe.failure_threshold.unwrap_or(3).max(1) as u32,
            running_for,
            jitter,
            grace_override: probe.termination_grace_period_seconds,
        }
    }

    /// Where network probes of an instance go: its sandbox's IP, or the host's for hostNetwork.
    fn probe_ip(&self, observed: &ObservedPod, c: &ObservedContainer) -> Option<String> {
        observed.reachable_ip(Some(&c.sandbox_id), self.host_ip.as_deref())
    }

    /// Stops every worker of a pod that is gone.
    pub fn remove_pod(&self, uid: &str) {
        let mut state = self.shared.lock();
        if let Some(instances) = state.pods.remove(uid) {
            for inst in instances.values() {
                inst.stop.cancel();
            }
        }
        state.counters.remove_pod(uid);
    }

    /// Probe results by container name, for the pod's status.
    pub fn results(&self, uid: &str) -> HashMap<String, ProbeView> {
        let state = self.shared.lock();
        let mut newest: HashMap<String, (u32, ProbeView)> = HashMap::new();
        for inst in state.pods.get(uid).into_iter().flat_map(|p| p.values()) {
            let slot = newest
                .entry(inst.name.clone())
                .or_insert((inst.attempt, inst.view));
            if inst.attempt > slot.0 {
                *slot = (inst.attempt, inst.view);
            }
        }
        newest
            .into_iter()
            .map(|(name, (_, view))| (name, view))
            .collect()
    }

    /// Running container instances (by container ID) that failed liveness or startup.
    pub fn unhealthy(&self, uid: &str) -> HashMap<String, Unhealthy> {
        let state = self.shared.lock();
        state
            .pods
            .get(uid)
            .into_iter()
            .flat_map(|p| p.iter())
            .filter_map(|(id, inst)| inst.unhealthy.clone().map(|u| (id.clone(), u)))
            .collect()
    }

    /// The newest failing probe of every container that has one, by pod UID and container
    /// name (the newest instance of each container): what `deckhand pods` shows as the reason a
    /// container is not ready.
    pub fn failing(&self) -> BTreeMap<String, BTreeMap<String, String>> {
        let state = self.shared.lock();
        let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for (uid, instances) in &state.pods {
            let mut newest: HashMap<&str, &Instance> = HashMap::new();
            for inst in instances.values() {
                let slot = newest.entry(inst.name.as_str()).or_insert(inst);
                if inst.attempt > slot.attempt {
                    *slot = inst;
                }
            }
            for (name, inst) in newest {
                if let Some(message) = &inst.failing {
                    out.entry(uid.clone())
                        .or_default()
                        .insert(name.to_string(), message.clone());
                }
            }
        }
        out
    }

    /// Prometheus text for `/metrics/probes` (`prober_probe_total`).
    pub fn render_metrics(&self) -> String {
        self.shared.lock().counters.render()
    }

    /// How many instances have probe workers (for tests and diagnostics).
    pub fn instance_count(&self) -> usize {
        self.shared.lock().pods.values().map(HashMap::len).sum()
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep using it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What a worker reports into: the manager's state for one instance.
struct InstanceReport {
    shared: Arc<Shared>,
    events: Recorder,
    /// The container, as its events name it.
    object: k8s_openapi::api::core::v1::ObjectReference,
    uid: String,
    container_id: String,
    series: SeriesKey,
}

impl Report for InstanceReport {
    fn outcome(&self, kind: ProbeKind, outcome: &ProbeOutcome) {
        {
            let mut state = self.shared.lock();
            state.counters.inc(&self.series, outcome.metric_result());
            if let Some(inst) = state
                .pods
                .get_mut(&self.uid)
                .and_then(|p| p.get_mut(&self.container_id))
            {
                inst.failing = match outcome {
                    ProbeOutcome::Failure(out) => {
                        Some(format!("{} probe failed: {out}", kind.as_str()))
                    }
                    ProbeOutcome::Error(err) => {
                        Some(format!("{} probe errored: {err}", kind.as_str()))
                    }
                    ProbeOutcome::Success | ProbeOutcome::Warning(_) => None,
                };
            }
        }
        // Upstream's probe events: every failed run, every warning, every error.
        let (why, message) = match outcome {
            ProbeOutcome::Success => return,
            ProbeOutcome::Warning(out) => (
                reason::PROBE_WARNING,
                format!("{} probe warning: {out}", kind.as_str()),
            ),
            ProbeOutcome::Failure(out) => (
                reason::UNHEALTHY,
                format!("{} probe failed: {out}", kind.as_str()),
            ),
            ProbeOutcome::Error(err) => (
                reason::UNHEALTHY,
                format!(
                    "{} probe errored and resulted in unknown state: {err}",
                    kind.as_str()
                ),
            ),
        };
        self.events
            .record(self.object.clone(), EventType::Warning, why, message);
    }

    fn verdict(&self, kind: ProbeKind, verdict: Verdict) {
        let readiness = match verdict {
            Verdict::Ready(ready) => Some(ready),
            _ => None,
        };
        let changed = {
            let mut state = self.shared.lock();
            let Some(inst) = state
                .pods
                .get_mut(&self.uid)
                .and_then(|p| p.get_mut(&self.container_id))
            else {
                return;
            };
            match verdict {
                Verdict::Ready(ready) => inst.view.ready.replace(ready) != Some(ready),
                Verdict::Started => inst.view.started.replace(true) != Some(true),
                Verdict::Unhealthy(bad) => {
                    tracing::info!(
                        container = %inst.name,
                        container_id = %self.container_id,
                        probe = kind.as_str(),
                        "{}",
                        bad.message
                    );
                    inst.unhealthy = Some(bad);
                    true
                }
            }
        };
        if changed {
            tracing::debug!(pod_uid = %self.uid, container_id = %self.container_id, probe = kind.as_str(), "probe result changed");
            if let (Some(ready), Some(sink)) = (readiness, self.shared.readiness.get()) {
                sink(&self.uid, &self.container_id, ready);
            }
            self.shared.wake.poke(&self.uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ExecAction, PodSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;
    use crate::base::observed::{ObservedSandbox, SandboxState};
    use crate::clients::cri::fake::{ExecReply, FakeCri};
    use crate::kubelet::prober::metrics::ProbeResult;

    fn exec_probe(period: i32, failure: i32) -> ProbeSpec {
        named_exec_probe("true", period, failure)
    }

    fn named_exec_probe(command: &str, period: i32, failure: i32) -> ProbeSpec {
        ProbeSpec {
            exec: Some(ExecAction {
                command: Some(vec![command.into()]),
            }),
            period_seconds: Some(period),
            failure_threshold: Some(failure),
            termination_grace_period_seconds: Some(7),
            ..Default::default()
        }
    }

    fn pod(container: Container) -> Arc<Pod> {
        Arc::new(Pod {
            metadata: ObjectMeta {
                name: Some("web-node".into()),
                namespace: Some("default".into()),
                uid: Some("uid1".into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![container],
                ..Default::default()
            }),
            status: None,
        })
    }

    fn observed(id: &str, state: ContainerState, host_network: bool) -> ObservedPod {
        ObservedPod {
            sandboxes: vec![ObservedSandbox {
                id: "sb1".into(),
                attempt: 0,
                state: SandboxState::Ready,
                created_at: 1,
                ip: Some("10.1.2.3".into()),
                additional_ips: vec![],
                host_network,
            }],
            containers: vec![ObservedContainer {
                id: id.into(),
                sandbox_id: "sb1".into(),
                name: "app".into(),
                attempt: 0,
                state,
                created_at: 1,
                started_at: 0,
                finished_at: 0,
                exit_code: 0,
                reason: String::new(),
                message: String::new(),
                hash: None,
                image: String::new(),
                image_ref: String::new(),
                grace_period: None,
                is_init: false,
                pre_stop: None,
                round: None,
            }],
            names: None,
        }
    }

    fn manager(rt: FakeCri) -> (ProbeManager<FakeCri>, Pokes) {
        let pokes = Pokes::default();
        (
            ProbeManager::new(
                rt,
                pokes.clone(),
                Some("192.0.2.1".into()),
                TaskTracker::new(),
                crate::kubelet::events::Recorder::log_only("node"),
                CancellationToken::new(),
            ),
            pokes,
        )
    }

    #[tokio::test(start_paused = true)]
    async fn readiness_result_flows_to_results_and_wakes_the_pod() {
        let rt = FakeCri::with_exec(vec![ExecReply::Exit(1, "not yet")]);
        let (m, wake) = manager(rt.clone());
        let p = pod(Container {
            name: "app".into(),
            readiness_probe: Some(exec_probe(1, 1)),
            ..Default::default()
        });
        m.sync_pod(&p, &observed("c1", ContainerState::Running, false));
        assert_eq!(
            m.results("uid1")["app"],
            ProbeView {
                ready: Some(false),
                started: None
            }
        );
        let uid = tokio::time::timeout(Duration::from_secs(5), wake.take())
            .await
            .unwrap()
            .remove(0);
        assert_eq!(uid, "uid1");
        assert_eq!(m.results("uid1")["app"].ready, Some(true));
        assert!(m.unhealthy("uid1").is_empty());
        // The exec went to the instance, with the probe's timeout.
        assert_eq!(rt.exec_calls()[0].0, "c1");
        assert_eq!(rt.exec_calls()[0].2, 1);
        // Syncing again starts nothing new.
        m.sync_pod(&p, &observed("c1", ContainerState::Running, false));
        assert_eq!(m.instance_count(), 1);
        let metrics = m.render_metrics();
        assert!(
            metrics.contains(r#"probe_type="Readiness",result="failed"} 1"#),
            "{metrics}"
        );
        assert!(
            metrics.contains(r#"probe_type="Readiness",result="successful"}"#),
            "{metrics}"
        );

        // The instance stops: its results go, the metrics stay until the pod goes.
        m.sync_pod(&p, &observed("c1", ContainerState::Exited, false));
        assert!(m.results("uid1").is_empty());
        assert_eq!(m.instance_count(), 0);
        assert!(m.render_metrics().contains("uid1"));
        m.remove_pod("uid1");
        assert!(!m.render_metrics().contains("uid1"));
    }

    #[tokio::test(start_paused = true)]
    async fn liveness_failure_marks_the_instance_until_it_stops() {
        let rt = FakeCri::with_exec(vec![ExecReply::Exit(1, ""); 10]);
        let (m, wake) = manager(rt.clone());
        let p = pod(Container {
            name: "app".into(),
            liveness_probe: Some(exec_probe(1, 2)),
            ..Default::default()
        });
        m.sync_pod(&p, &observed("c1", ContainerState::Running, false));
        assert!(m.results("uid1")["app"] == ProbeView::default());
        tokio::time::timeout(Duration::from_secs(5), wake.take())
            .await
            .unwrap()
            .remove(0);
        let bad = m.unhealthy("uid1");
        assert_eq!(
            bad["c1"],
            Unhealthy {
                container_name: "app".into(),
                message: "Container app failed liveness probe, will be restarted".into(),
                grace_override: Some(7),
            }
        );
        // Still marked while it runs, and no more probing (the worker is on hold).
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(rt.exec_calls().len(), 2);
        m.sync_pod(&p, &observed("c1", ContainerState::Running, false));
        assert_eq!(m.unhealthy("uid1").len(), 1);
        // Killed: gone. The restarted instance gets a fresh worker.
        m.sync_pod(&p, &observed("c1", ContainerState::Exited, false));
        assert!(m.unhealthy("uid1").is_empty());
        m.sync_pod(&p, &observed("c2", ContainerState::Running, false));
        assert_eq!(m.instance_count(), 1);
        let series = SeriesKey {
            pod_uid: "uid1".into(),
            namespace: "default".into(),
            pod: "web-node".into(),
            container: "app".into(),
            kind: ProbeKind::Liveness,
        };
        assert_eq!(
            m.shared.lock().counters.get(&series, ProbeResult::Failed),
            2
        );
    }

    #[tokio::test(start_paused = true)]
    async fn startup_gates_liveness_and_readiness() {
        // Startup: fails twice, then succeeds. Readiness and liveness then run.
        let rt = FakeCri::with_exec(vec![ExecReply::Exit(1, ""), ExecReply::Exit(1, "")]);
        let (m, wake) = manager(rt.clone());
        let p = pod(Container {
            name: "app".into(),
            startup_probe: Some(named_exec_probe("startup", 1, 5)),
            liveness_probe: Some(named_exec_probe("live", 1, 1)),
            readiness_probe: Some(named_exec_probe("ready", 1, 1)),
            ..Default::default()
        });
        m.sync_pod(&p, &observed("c1", ContainerState::Running, false));
        assert_eq!(
            m.results("uid1")["app"],
            ProbeView {
                ready: Some(false),
                started: Some(false)
            }
        );
        tokio::time::timeout(Duration::from_secs(5), wake.take())
            .await
            .unwrap()
            .remove(0);
        assert_eq!(m.results("uid1")["app"].started, Some(true));
        // Pokes coalesce: the readiness change may have come with the first one.
        while m.results("uid1")["app"].ready != Some(true) {
            tokio::time::timeout(Duration::from_secs(5), wake.take())
                .await
                .unwrap();
        }
        assert_eq!(
            m.results("uid1")["app"],
            ProbeView {
                ready: Some(true),
                started: Some(true)
            }
        );
        let commands: Vec<String> = rt.exec_calls().iter().map(|c| c.1[0].clone()).collect();
        assert_eq!(
            &commands[..3],
            ["startup", "startup", "startup"],
            "only startup ran until it succeeded"
        );
        assert!(
            commands[3..].contains(&"live".to_string())
                && commands[3..].contains(&"ready".to_string())
        );
        assert!(
            !commands[3..].contains(&"startup".to_string()),
            "startup stops once it succeeded"
        );
        assert!(m.unhealthy("uid1").is_empty());
    }

    #[test]
    fn network_probes_go_to_the_pod_ip_or_the_host_ip() {
        let rt = FakeCri::default();
        let (m, _rx) = manager(rt);
        let own = observed("c1", ContainerState::Running, false);
        assert_eq!(
            m.probe_ip(&own, &own.containers[0]).as_deref(),
            Some("10.1.2.3")
        );
        let host = observed("c1", ContainerState::Running, true);
        assert_eq!(
            m.probe_ip(&host, &host.containers[0]).as_deref(),
            Some("192.0.2.1")
        );
    }

    #[tokio::test]
    async fn containers_without_probes_get_no_workers() {
        let (m, _rx) = manager(FakeCri::default());
        let p = pod(Container {
            name: "app".into(),
            ..Default::default()
        });
        m.sync_pod(&p, &observed("c1", ContainerState::Running, false));
        assert_eq!(m.instance_count(), 0);
        assert!(m.results("uid1").is_empty());
    }
}
