//! The pod lifecycle event generator: relist the runtime, diff, tell the sync loop what changed.
//!
//! containerd 1.6 does not implement `GetContainerEvents`, so state is relisted every second
//! (upstream's period). A relist costs two list calls when nothing changed (see
//! `runtime::inspect`). The newest snapshot is kept in a [`RuntimeCache`] for housekeeping, and
//! `/healthz` turns unhealthy when no relist has completed for three minutes, or when the last
//! one could not reach the runtime.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use crate::cri::RuntimeService;
use crate::health::Health;
use crate::observed::{ContainerState, ObservedPod, SandboxState};
use crate::pokes::Pokes;
use crate::runtime::inspect::{self, DetailCache};

/// What changed for one pod between two relists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PlegEventKind {
    ContainerStarted,
    ContainerDied,
    ContainerRemoved,
    ContainerChanged,
    SandboxChanged,
}

/// One change, naming the pod and the object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlegEvent {
    pub pod_uid: String,
    pub kind: PlegEventKind,
    pub id: String,
}

/// The newest relist, for housekeeping and status.
#[derive(Clone, Default)]
pub struct RuntimeCache {
    inner: Arc<RwLock<Snapshot>>,
}

#[derive(Default)]
struct Snapshot {
    pods: BTreeMap<String, ObservedPod>,
    relisted: bool,
}

impl RuntimeCache {
    /// Pod UIDs with anything in the runtime, from the last relist.
    pub fn pod_uids(&self) -> Vec<String> {
        let s = self.inner.read().unwrap_or_else(|e| e.into_inner());
        s.pods.keys().cloned().collect()
    }

    /// One pod as the last relist saw it.
    pub fn pod(&self, uid: &str) -> Option<ObservedPod> {
        let s = self.inner.read().unwrap_or_else(|e| e.into_inner());
        s.pods.get(uid).cloned()
    }

    /// True once a relist has completed.
    pub fn has_relisted(&self) -> bool {
        self.inner
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .relisted
    }

    /// Takes a full relist in place of what was known, and returns what changed.
    pub fn store_relist(&self, current: BTreeMap<String, ObservedPod>) -> Vec<PlegEvent> {
        let mut s = self.inner.write().unwrap_or_else(|e| e.into_inner());
        let changes = diff(&s.pods, &current);
        s.pods = current;
        s.relisted = true;
        changes
    }

    /// Replaces one pod's entry with a fresher view (a worker just inspected it).
    pub fn update_pod(&self, uid: &str, pod: ObservedPod) {
        let mut s = self.inner.write().unwrap_or_else(|e| e.into_inner());
        if pod.is_empty() {
            s.pods.remove(uid);
        } else {
            s.pods.insert(uid.to_string(), pod);
        }
    }
}

/// Compares two relists and lists the changes, pod by pod.
pub fn diff(
    old: &BTreeMap<String, ObservedPod>,
    new: &BTreeMap<String, ObservedPod>,
) -> Vec<PlegEvent> {
    let empty = ObservedPod::default();
    let mut events = Vec::new();
    let uids: std::collections::BTreeSet<&String> = old.keys().chain(new.keys()).collect();
    for uid in uids {
        let before = old.get(uid).unwrap_or(&empty);
        let after = new.get(uid).unwrap_or(&empty);
        let old_c: HashMap<&str, ContainerState> = before
            .containers
            .iter()
            .map(|c| (c.id.as_str(), c.state))
            .collect();
        let new_c: HashMap<&str, ContainerState> = after
            .containers
            .iter()
            .map(|c| (c.id.as_str(), c.state))
            .collect();
        for c in &after.containers {
            let kind = match (old_c.get(c.id.as_str()), c.state) {
                (Some(prev), now) if *prev == now => continue,
                (_, ContainerState::Running) => PlegEventKind::ContainerStarted,
                (_, ContainerState::Exited) => PlegEventKind::ContainerDied,
                _ => PlegEventKind::ContainerChanged,
            };
            events.push(PlegEvent {
                pod_uid: uid.clone(),
                kind,
                id: c.id.clone(),
            });
        }
        for c in &before.containers {
            if !new_c.contains_key(c.id.as_str()) {
                events.push(PlegEvent {
                    pod_uid: uid.clone(),
                    kind: PlegEventKind::ContainerRemoved,
                    id: c.id.clone(),
                });
            }
        }
        let old_s: HashMap<&str, SandboxState> = before
            .sandboxes
            .iter()
            .map(|s| (s.id.as_str(), s.state))
            .collect();
        let new_s: HashMap<&str, SandboxState> = after
            .sandboxes
            .iter()
            .map(|s| (s.id.as_str(), s.state))
            .collect();
        for (id, state) in &new_s {
            if old_s.get(id) != Some(state) {
                events.push(PlegEvent {
                    pod_uid: uid.clone(),
                    kind: PlegEventKind::SandboxChanged,
                    id: id.to_string(),
                });
            }
        }
        for id in old_s.keys() {
            if !new_s.contains_key(id) {
                events.push(PlegEvent {
                    pod_uid: uid.clone(),
                    kind: PlegEventKind::SandboxChanged,
                    id: id.to_string(),
                });
            }
        }
    }
    events
}

/// Timing of the relist loop.
#[derive(Clone, Debug)]
pub struct PlegConfig {
    /// The node whose pods are relisted (objects carry it as a label).
    pub node_name: String,
    pub period: Duration,
    /// `/healthz` fails when no relist completed for this long (upstream: 3 minutes).
    pub unhealthy_after: Duration,
}

impl Default for PlegConfig {
    fn default() -> Self {
        PlegConfig {
            node_name: String::new(),
            period: Duration::from_secs(1),
            unhealthy_after: Duration::from_secs(180),
        }
    }
}

#[derive(Default)]
struct Progress {
    last_ok: Option<Instant>,
    last_error: Option<String>,
}

/// Runs the relist loop until `cancel` fires.
pub async fn run<R: RuntimeService>(
    rt: R,
    details: DetailCache,
    cache: RuntimeCache,
    pokes: Pokes,
    health: Health,
    config: PlegConfig,
    cancel: CancellationToken,
) {
    let started = Instant::now();
    let progress = Arc::new(RwLock::new(Progress::default()));
    {
        let progress = progress.clone();
        let limit = config.unhealthy_after;
        health.register("pleg", move || {
            let p = progress.read().unwrap_or_else(|e| e.into_inner());
            let since = p.last_ok.unwrap_or(started).elapsed();
            if since > limit {
                Err(format!(
                    "PLEG has not completed a relist for {}s (limit {}s)",
                    since.as_secs(),
                    limit.as_secs()
                )
                .into())
            } else {
                Ok(())
            }
        });
    }
    {
        let progress = progress.clone();
        health.register("runtime", move || {
            let p = progress.read().unwrap_or_else(|e| e.into_inner());
            match &p.last_error {
                Some(err) => Err(format!("the container runtime is not answering: {err}").into()),
                None => Ok(()),
            }
        });
    }

    let mut ticker = tokio::time::interval(config.period);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut last_relist_start: Option<Instant> = None;
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let relist_started = Instant::now();
        if let Some(previous) = last_relist_start.replace(relist_started) {
            crate::metrics::KUBELET
                .pleg_relist_interval
                .observe(&[], (relist_started - previous).as_secs_f64());
        }
        let result = inspect::observe_all(&rt, &details, &config.node_name).await;
        let took = relist_started.elapsed();
        crate::metrics::KUBELET
            .pleg_relist_duration
            .observe(&[], took.as_secs_f64());
        if took > config.period * 5 {
            tracing::warn!(took_ms = took.as_millis() as u64, "a relist was slow");
        }
        match result {
            Ok(current) => {
                tracing::trace!(
                    pods = current.len(),
                    took_us = took.as_micros() as u64,
                    "relisted"
                );
                // Compare with the freshest known state, which includes what workers saw since
                // the last relist: a container created and removed between two relists still
                // shows up as a change.
                let changes = cache.store_relist(current);
                {
                    let mut p = progress.write().unwrap_or_else(|e| e.into_inner());
                    if p.last_error.take().is_some() {
                        tracing::info!("the container runtime answers again");
                    }
                    p.last_ok = Some(Instant::now());
                }
                for event in changes {
                    tracing::debug!(pod_uid = %event.pod_uid, kind = ?event.kind, id = %event.id, "PLEG event");
                    pokes.poke(&event.pod_uid);
                }
            }
            Err(err) => {
                let mut p = progress.write().unwrap_or_else(|e| e.into_inner());
                let text = err.to_string();
                if p.last_error.as_deref() != Some(text.as_str()) {
                    tracing::warn!(error = %text, "relist failed");
                }
                p.last_error = Some(text);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observed::{ObservedContainer, ObservedSandbox};

    fn container(id: &str, state: ContainerState) -> ObservedContainer {
        ObservedContainer {
            id: id.into(),
            sandbox_id: "s1".into(),
            name: "c".into(),
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
        }
    }

    fn pod(containers: Vec<ObservedContainer>, sandbox: Option<SandboxState>) -> ObservedPod {
        ObservedPod {
            sandboxes: sandbox
                .map(|state| ObservedSandbox {
                    id: "s1".into(),
                    attempt: 0,
                    state,
                    created_at: 1,
                    ip: None,
                    additional_ips: vec![],
                    host_network: false,
                })
                .into_iter()
                .collect(),
            containers,
            names: None,
        }
    }

    fn kinds(old: ObservedPod, new: ObservedPod) -> Vec<PlegEventKind> {
        let o = BTreeMap::from([("u".to_string(), old)]);
        let n = BTreeMap::from([("u".to_string(), new)]);
        diff(&o, &n).into_iter().map(|e| e.kind).collect()
    }

    #[test]
    fn diff_table() {
        use ContainerState::*;
        use PlegEventKind::*;
        let ready = Some(SandboxState::Ready);
        let rows: Vec<(ObservedPod, ObservedPod, Vec<PlegEventKind>)> = vec![
            (pod(vec![], ready), pod(vec![], ready), vec![]),
            (
                pod(vec![], ready),
                pod(vec![container("a", Running)], ready),
                vec![ContainerStarted],
            ),
            (
                pod(vec![container("a", Running)], ready),
                pod(vec![container("a", Exited)], ready),
                vec![ContainerDied],
            ),
            (
                pod(vec![container("a", Exited)], ready),
                pod(vec![], ready),
                vec![ContainerRemoved],
            ),
            (
                pod(vec![], ready),
                pod(vec![container("a", Created)], ready),
                vec![ContainerChanged],
            ),
            (
                pod(vec![container("a", Running)], ready),
                pod(vec![container("a", Running)], ready),
                vec![],
            ),
            (
                pod(vec![], ready),
                pod(vec![], Some(SandboxState::NotReady)),
                vec![SandboxChanged],
            ),
            (pod(vec![], None), pod(vec![], ready), vec![SandboxChanged]),
            (pod(vec![], ready), pod(vec![], None), vec![SandboxChanged]),
        ];
        for (i, (old, new, want)) in rows.into_iter().enumerate() {
            assert_eq!(kinds(old, new), want, "row {i}");
        }
    }

    #[test]
    fn diff_reports_pods_that_vanish() {
        let old = BTreeMap::from([(
            "u".to_string(),
            pod(
                vec![container("a", ContainerState::Running)],
                Some(SandboxState::Ready),
            ),
        )]);
        let events = diff(&old, &BTreeMap::new());
        assert_eq!(events.len(), 2);
        assert!(events.iter().all(|e| e.pod_uid == "u"));
    }
}
