//! The eviction loop: a round every monitoring period (at once again after an eviction, as
//! upstream, and at once on a memory threshold notification when `kernelMemcgNotification`
//! is on, see [`super::memcg`]), each reading the node, deciding, reclaiming, and evicting at
//! most one pod.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use tokio_util::sync::CancellationToken;

use super::PressureView;
use super::decide::{
    Candidate, EvictionState, Observations, REASON, Round, eviction_message, grace_period,
    is_critical, rank, reclaim_steps, thresholds_met,
};
use super::local_storage;
use super::memcg::{self, MemcgNotifier, Trigger};
use super::observe::{ActivePods, EvictionError, Evictor, Measure, Observer, Reading, Reclaimer};
use super::signals::{Condition, ThresholdSpec};
use crate::base::clock;
use crate::base::podspec::full_name;
use crate::kubelet::events::{EventType, Recorder};

/// Upstream waits this long for an evicted pod's cleanup before the next round.
pub const POD_CLEANUP_TIMEOUT: Duration = Duration::from_secs(30);

/// What the manager is set to.
#[derive(Debug, Clone)]
pub struct ManagerSettings {
    pub thresholds: Vec<ThresholdSpec>,
    pub pressure_transition_period: Duration,
    pub max_pod_grace_period_seconds: i64,
    pub monitoring_period: Duration,
    pub node_name: String,
    /// `localStorageCapacityIsolation`: pods over their own ephemeral-storage limits or
    /// emptyDir `sizeLimit`s are evicted ([`local_storage`]).
    pub local_storage_capacity_isolation: bool,
}

/// What the last round saw, for `/debug/eviction`.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct LastRound {
    pub conditions: BTreeSet<Condition>,
    /// Signal name → observation.
    pub observations: std::collections::BTreeMap<String, super::Observation>,
    /// Signals whose thresholds are met with their grace periods passed.
    pub thresholds_met: Vec<String>,
    pub dedicated_imagefs: bool,
    /// What the round did: nothing, reclaimed, evicted <pod>.
    pub action: String,
    /// The latest node-level reclaim (kept across rounds until the next one).
    pub last_reclaim: Option<ReclaimRecord>,
    /// What started the round: start, period, memcg notification, after eviction.
    pub trigger: &'static str,
    /// The latest eviction, kept across rounds.
    pub last_eviction: Option<EvictionNote>,
    /// The memory threshold notifications, when `kernelMemcgNotification` is on.
    pub memcg: Option<memcg::Status>,
}

/// One node-level reclaim, as `/debug/eviction` shows it.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct ReclaimRecord {
    /// When it ran (RFC 3339).
    pub at: String,
    /// The signal whose threshold was met.
    pub signal: String,
    /// Step name (`dead_containers`, `unused_images`) → objects removed.
    pub removed: std::collections::BTreeMap<String, usize>,
    /// The steps' time, measuring again after them included.
    pub took_ms: f64,
    /// Whether it cleared every threshold, so that no pod was evicted.
    pub enough: bool,
}

/// An eviction as `/debug/eviction` shows it.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct EvictionNote {
    pub pod: String,
    pub signal: String,
    /// What started the round that evicted it.
    pub trigger: &'static str,
    /// From the memory threshold notification to the pod handed to the sync loop.
    pub notification_to_handoff_ms: Option<f64>,
}

/// What one round did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// No threshold met (or no reading).
    Nothing,
    /// Node-level reclaim was enough.
    Reclaimed,
    /// This pod (UID) was evicted.
    Evicted(String),
    /// Thresholds met but no pod could be evicted.
    NoneEvictable,
}

/// A round's outcome, and on an eviction the receiver that fires when the pod is cleaned up.
type Evicted = (Outcome, Option<tokio::sync::oneshot::Receiver<()>>);

/// The manager: decisions in [`EvictionState`], I/O through the traits.
pub struct Manager<O, R, E, P> {
    pub settings: ManagerSettings,
    pub observer: O,
    pub reclaimer: R,
    pub evictor: E,
    pub pods: P,
    pub pressure: PressureView,
    pub events: Recorder,
    pub last: Arc<Mutex<LastRound>>,
    state: EvictionState,
    memcg: Option<MemcgNotifier>,
    trigger: Trigger,
}

impl<O: Observer, R: Reclaimer, E: Evictor, P: ActivePods> Manager<O, R, E, P> {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        settings: ManagerSettings,
        observer: O,
        reclaimer: R,
        evictor: E,
        pods: P,
        pressure: PressureView,
        events: Recorder,
    ) -> Self {
        Manager {
            settings,
            observer,
            reclaimer,
            evictor,
            pods,
            pressure,
            events,
            last: Arc::default(),
            state: EvictionState::default(),
            memcg: None,
            trigger: Trigger::Start,
        }
    }

    /// Also runs a round whenever `notifier` says memory crossed a threshold.
    pub fn with_memcg(mut self, notifier: MemcgNotifier) -> Self {
        self.memcg = Some(notifier);
        self
    }

    /// Runs rounds until `cancel`. After an eviction it waits for the pod's cleanup (at most
    /// [`POD_CLEANUP_TIMEOUT`]) and goes again at once; otherwise every monitoring period.
    pub async fn run(&mut self, cancel: CancellationToken) {
        if self.settings.thresholds.is_empty() && !self.settings.local_storage_capacity_isolation {
            tracing::info!(
                "eviction manager: no thresholds configured and local storage limits off; not monitoring"
            );
            return;
        }
        tracing::info!(
            thresholds = self.settings.thresholds.len(),
            period_ms = self.settings.monitoring_period.as_millis() as u64,
            "eviction manager: starting"
        );
        loop {
            let round = tokio::select! {
                _ = cancel.cancelled() => return,
                r = self.round() => r,
            };
            let (outcome, done) = match round {
                Ok(x) => x,
                Err(err) => {
                    tracing::warn!(error = %err, "eviction manager: round failed");
                    (Outcome::Nothing, None)
                }
            };
            if let (Outcome::Evicted(uid), Some(done)) = (&outcome, done) {
                let cleaned = tokio::select! {
                    _ = cancel.cancelled() => return,
                    r = tokio::time::timeout(POD_CLEANUP_TIMEOUT, done) => r,
                };
                match cleaned {
                    Ok(Ok(())) => {
                        tracing::info!(pod_uid = %uid, "eviction manager: the evicted pod is cleaned up");
                        // As upstream: look again at once.
                        self.trigger = Trigger::AfterEviction;
                        continue;
                    }
                    // The pod was gone before the sync loop got to it: wait a period, so the
                    // same stale choice is not made in a tight loop.
                    Ok(Err(_)) => {
                        tracing::warn!(pod_uid = %uid, "eviction manager: the sync loop did not have the pod")
                    }
                    Err(_) => {
                        tracing::warn!(pod_uid = %uid, "eviction manager: timed out waiting for the evicted pod's cleanup");
                        self.trigger = Trigger::AfterEviction;
                        continue;
                    }
                }
            }
            self.trigger = tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(self.settings.monitoring_period) => Trigger::Period,
                at = memcg::notified(self.memcg.as_ref()) => {
                    tracing::info!("eviction manager: memory threshold notification; looking now");
                    Trigger::Notification(at)
                }
            };
        }
    }

    fn note(&self, f: impl FnOnce(&mut LastRound)) {
        f(&mut self.last.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// One round. On an eviction, also the receiver that fires when the pod is cleaned up.
    ///
    /// Reads the node and sets the pressure conditions; when a threshold is met, reclaims
    /// node resources first and evicts one pod only when that was not enough.
    pub async fn round(&mut self) -> Result<Evicted, EvictionError> {
        let reading = self.observer.observe(Measure::Node).await?;
        let round = self.update_pressure(&reading);
        // As upstream: a pod over its own limits goes first, and then nothing else this round.
        if let Some(evicted) = self.enforce_local_storage().await? {
            return Ok(evicted);
        }
        let Some(threshold) = round.to_reclaim(&self.settings.thresholds).cloned() else {
            return Ok((Outcome::Nothing, None));
        };
        self.announce_reclaim(&threshold);
        if self
            .reclaim_node(&threshold, reading.dedicated_imagefs)
            .await?
        {
            return Ok((Outcome::Reclaimed, None));
        }
        self.evict_one(&threshold, &reading, &round.act_on).await
    }

    /// Takes in a reading: updates the memory threshold notifications and the pressure
    /// conditions, and notes the round for `/debug/eviction`. Returns the round's decision
    /// (the conditions, and the thresholds to act on).
    fn update_pressure(&mut self, reading: &Reading) -> Round {
        if let Some(n) = self.memcg.as_mut() {
            let notified = self.trigger.notified_at().is_some();
            n.update(
                &self.settings.thresholds,
                &reading.observations,
                clock::instant(),
                notified,
            );
        }
        let thresholds = &self.settings.thresholds;
        let round = self.state.step(
            thresholds,
            &reading.observations,
            self.settings.pressure_transition_period,
            clock::instant(),
        );
        let before = self.pressure.conditions();
        if before != round.conditions {
            tracing::info!(
                conditions = ?round.conditions.iter().map(|c| c.as_str()).collect::<Vec<_>>(),
                "eviction manager: node pressure conditions changed"
            );
        }
        self.pressure.set(round.conditions.clone());
        let named = |obs: &Observations| {
            obs.iter()
                .map(|(s, o)| (s.as_str().to_string(), *o))
                .collect()
        };
        self.note(|l| {
            l.conditions = round.conditions.clone();
            l.observations = named(&reading.observations);
            l.thresholds_met = round
                .act_on
                .iter()
                .map(|i| thresholds[*i].signal.as_str().to_string())
                .collect();
            l.dedicated_imagefs = reading.dedicated_imagefs;
            l.action = "nothing".into();
            l.trigger = self.trigger.as_str();
            l.memcg = self.memcg.as_ref().map(MemcgNotifier::status);
        });
        round
    }

    /// Tells, in the log and a node event, that `threshold` is met and its resource is to be
    /// reclaimed.
    fn announce_reclaim(&self, threshold: &ThresholdSpec) {
        let resource = threshold.signal.resource();
        tracing::info!(
            signal = threshold.signal.as_str(),
            resource = resource.as_str(),
            "eviction manager: attempting to reclaim"
        );
        self.events.record(
            crate::kubelet::events::node_ref(&self.settings.node_name, None),
            EventType::Warning,
            "EvictionThresholdMet",
            format!("Attempting to reclaim {}", resource.as_str()),
        );
    }

    /// Node-level reclaim, tried before any pod is evicted: dead containers, unused images,
    /// as the signal calls for. True when it was enough: every threshold (with its minimum
    /// reclaim) is clear when the node is read again.
    async fn reclaim_node(
        &self,
        threshold: &ThresholdSpec,
        dedicated_imagefs: bool,
    ) -> Result<bool, EvictionError> {
        let steps = reclaim_steps(threshold.signal, dedicated_imagefs);
        if steps.is_empty() {
            return Ok(false);
        }
        let thresholds = &self.settings.thresholds;
        let began = clock::instant();
        let mut record = ReclaimRecord {
            at: clock::timestamp().to_string(),
            signal: threshold.signal.as_str().to_string(),
            ..Default::default()
        };
        for step in steps {
            let step_began = clock::instant();
            match self.reclaimer.reclaim(*step).await {
                Ok(n) => {
                    let took_ms = step_began.elapsed().as_secs_f64() * 1000.0;
                    tracing::info!(
                        what = step.as_str(),
                        removed = n,
                        took_ms,
                        "eviction manager: reclaimed node resources"
                    );
                    record.removed.insert(step.as_str().to_string(), n);
                }
                Err(err) => {
                    tracing::warn!(what = step.as_str(), error = %err, "eviction manager: reclaim failed")
                }
            }
        }
        let after = self.observer.observe(Measure::Node).await?;
        let still = thresholds_met(thresholds, 0..thresholds.len(), &after.observations, true);
        record.took_ms = began.elapsed().as_secs_f64() * 1000.0;
        record.enough = still.is_empty();
        self.note(|l| l.last_reclaim = Some(record));
        if !still.is_empty() {
            return Ok(false);
        }
        tracing::info!(
            resource = threshold.signal.resource().as_str(),
            "eviction manager: reduced the pressure without evicting pods"
        );
        self.note(|l| l.action = "reclaimed".into());
        Ok(true)
    }

    /// Chooses the pod to evict for `threshold` (upstream's ranking over the pods that are not
    /// critical, by their usage read now) and evicts it.
    async fn evict_one(
        &self,
        threshold: &ThresholdSpec,
        reading: &Reading,
        act_on: &[usize],
    ) -> Result<Evicted, EvictionError> {
        let resource = threshold.signal.resource();
        // The pods' usage is read only now that one must be chosen; each round would
        // otherwise walk every pod's volumes and logs for nothing.
        let usage = self.observer.observe(Measure::AllPods).await?;
        let active: Vec<Arc<Pod>> = self.pods.active();
        let evictable: Vec<&Arc<Pod>> = active.iter().filter(|p| !is_critical(p)).collect();
        let mut candidates: Vec<Candidate<'_>> = evictable
            .iter()
            .map(|p| Candidate {
                pod: p,
                usage: p
                    .metadata
                    .uid
                    .as_deref()
                    .and_then(|uid| usage.pods.get(uid)),
            })
            .collect();
        rank(&mut candidates, threshold.signal, reading.dedicated_imagefs);
        let Some(victim) = candidates.first() else {
            tracing::warn!(
                resource = resource.as_str(),
                "eviction manager: thresholds are met, but no pod can be evicted"
            );
            self.note(|l| l.action = "no pod to evict".into());
            return Ok((Outcome::NoneEvictable, None));
        };
        let message = eviction_message(
            resource,
            victim.pod,
            victim.usage,
            &self.settings.thresholds,
            act_on,
            &reading.observations,
        );
        let grace = grace_period(
            threshold,
            victim.pod,
            self.settings.max_pod_grace_period_seconds,
        );
        self.evict(threshold.signal.as_str(), grace, victim.pod, message)
            .await
    }

    /// Upstream's local storage limits: measures the pods that set any (only those) and
    /// evicts the first one over a limit with a grace period of one second. The next round
    /// follows its cleanup at once, so several offenders go one after the other.
    async fn enforce_local_storage(&self) -> Result<Option<Evicted>, EvictionError> {
        if !self.settings.local_storage_capacity_isolation {
            return Ok(None);
        }
        let active = self.pods.active();
        let limited: Vec<&Arc<Pod>> = active
            .iter()
            .filter(|p| !is_critical(p) && local_storage::has_limits(p))
            .collect();
        let uids: std::collections::HashSet<String> = limited
            .iter()
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        if uids.is_empty() {
            return Ok(None);
        }
        let reading = self.observer.observe(Measure::Pods(uids)).await?;
        for pod in limited {
            let usage = pod
                .metadata
                .uid
                .as_deref()
                .and_then(|u| reading.pods.get(u));
            let Some(usage) = usage else { continue };
            if let Some(over) = local_storage::exceeded(pod, usage, reading.dedicated_imagefs) {
                let evicted = self
                    .evict(
                        over.limit.signal(),
                        local_storage::GRACE_SECONDS,
                        pod,
                        over.message,
                    )
                    .await?;
                return Ok(Some(evicted));
            }
        }
        Ok(None)
    }

    /// Evicts the chosen pod: tells it in the log and an event, hands it to the evictor with
    /// `grace`, counts it under `signal` and notes it for `/debug/eviction`.
    async fn evict(
        &self,
        signal: &str,
        grace: i64,
        pod: &Pod,
        message: String,
    ) -> Result<Evicted, EvictionError> {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        tracing::warn!(pod = %full_name(pod), pod_uid = %uid, grace_seconds = grace, signal, %message, "eviction manager: evicting a pod");
        self.events
            .pod(pod, EventType::Warning, REASON, message.clone());
        let done = self.evictor.evict(&uid, grace, message).await?;
        let handoff = self.trigger.notified_at().map(|at| at.elapsed());
        if let Some(d) = handoff {
            tracing::info!(pod = %full_name(pod), pod_uid = %uid, handoff_ms = d.as_secs_f64() * 1e3, "eviction manager: evicted on a memory threshold notification");
        }
        crate::base::metrics::KUBELET.evictions.inc(&[signal]);
        let name = full_name(pod);
        self.note(|l| {
            l.action = format!("evicted {name}");
            l.last_eviction = Some(EvictionNote {
                pod: name,
                signal: signal.to_string(),
                trigger: self.trigger.as_str(),
                notification_to_handoff_ms: handoff.map(|d| d.as_secs_f64() * 1e3),
            });
        });
        Ok((Outcome::Evicted(uid), Some(done)))
    }
}
