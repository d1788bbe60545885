//! The eviction manager's decisions, all pure: which thresholds are met (with grace periods
//! and minimum reclaim), which pressure conditions hold (with the transition period), what to
//! reclaim, how pods rank, the grace period and message of an eviction, and admission under
//! pressure. Upstream's `eviction_manager.go` and `helpers.go` rules, in Deckhand's words.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use super::signals::{Condition, Resource, Signal, ThresholdSpec};
use crate::base::clock::Instant;
use crate::base::podspec::qos::{QosClass, qos_class};
use crate::kubelet::admission::requests::pod_requests;

/// Upstream's reason for evicted pods and for pods refused under pressure.
pub const REASON: &str = "Evicted";

pub use crate::base::podspec::pod::SYSTEM_CRITICAL_PRIORITY;

/// The taint a BestEffort pod may tolerate to be admitted under memory pressure.
pub const MEMORY_PRESSURE_TAINT: &str = "node.kubernetes.io/memory-pressure";

/// One measured signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Observation {
    pub available: i64,
    pub capacity: i64,
}

pub type Observations = BTreeMap<Signal, Observation>;

/// The thresholds (by index into the configured list) that `observations` meet. With
/// `enforce_min_reclaim`, a threshold counts as met until its minimum reclaim is available
/// beyond it too (upstream's `thresholdsMet`). A signal not observed meets nothing.
pub fn thresholds_met(
    thresholds: &[ThresholdSpec],
    which: impl IntoIterator<Item = usize>,
    observations: &Observations,
    enforce_min_reclaim: bool,
) -> Vec<usize> {
    let mut out = Vec::new();
    for i in which {
        let Some(t) = thresholds.get(i) else { continue };
        let Some(o) = observations.get(&t.signal) else {
            continue;
        };
        let mut quantity = t.quantity(o.capacity);
        if enforce_min_reclaim && let Some(min) = &t.min_reclaim {
            quantity = quantity.saturating_add(min.amount(o.capacity));
        }
        if quantity > o.available {
            out.push(i);
        }
    }
    out
}

/// What the manager remembers between rounds.
#[derive(Debug, Default, Clone)]
pub struct EvictionState {
    /// Threshold index → when it was first seen met (its grace period runs from then).
    first_observed: HashMap<usize, Instant>,
    /// Condition → when a threshold setting it was last met.
    condition_last_observed: BTreeMap<Condition, Instant>,
    /// The thresholds met with their grace periods at the end of the last round.
    met: Vec<usize>,
}

/// What one round decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Round {
    /// The pressure conditions to report (and admit by).
    pub conditions: BTreeSet<Condition>,
    /// The thresholds met whose grace period has passed, memory first.
    pub act_on: Vec<usize>,
}

impl Round {
    /// The threshold to reclaim for, if any: the first of `act_on`.
    pub fn to_reclaim<'a>(&self, thresholds: &'a [ThresholdSpec]) -> Option<&'a ThresholdSpec> {
        self.act_on.first().and_then(|i| thresholds.get(*i))
    }
}

impl EvictionState {
    /// One round at `now`, as upstream's `synchronize` before it acts.
    pub fn step(
        &mut self,
        thresholds: &[ThresholdSpec],
        observations: &Observations,
        transition_period: Duration,
        now: Instant,
    ) -> Round {
        let mut met = thresholds_met(thresholds, 0..thresholds.len(), observations, false);
        // Met before and not yet reclaimed down to threshold + minimum reclaim: still met.
        for i in thresholds_met(thresholds, self.met.iter().copied(), observations, true) {
            if !met.contains(&i) {
                met.push(i);
            }
        }
        let first_observed: HashMap<usize, Instant> = met
            .iter()
            .map(|i| (*i, self.first_observed.get(i).copied().unwrap_or(now)))
            .collect();
        for i in &met {
            self.condition_last_observed
                .insert(thresholds[*i].signal.condition(), now);
        }
        let conditions: BTreeSet<Condition> = self
            .condition_last_observed
            .iter()
            .filter(|(_, at)| now.saturating_duration_since(**at) < transition_period)
            .map(|(c, _)| *c)
            .collect();
        let mut act_on: Vec<usize> = first_observed
            .iter()
            .filter(|(i, at)| now.saturating_duration_since(**at) >= thresholds[**i].grace_period)
            .map(|(i, _)| *i)
            .collect();
        act_on.sort_by(|a, b| {
            let (sa, sb) = (thresholds[*a].signal, thresholds[*b].signal);
            sb.is_memory().cmp(&sa.is_memory()).then(a.cmp(b))
        });
        self.first_observed = first_observed;
        self.met = act_on.clone();
        Round { conditions, act_on }
    }
}

/// A node-level reclaim, tried before any pod is evicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reclaim {
    /// Dead containers (with their logs) and dead sandboxes: the container GC.
    DeadContainers,
    /// Unused images: the image GC.
    UnusedImages,
}

impl Reclaim {
    /// The name `/debug/eviction` shows.
    pub fn as_str(self) -> &'static str {
        match self {
            Reclaim::DeadContainers => "dead_containers",
            Reclaim::UnusedImages => "unused_images",
        }
    }
}

/// What may be reclaimed for a signal. Memory and PIDs: nothing. Disk with images on the
/// node filesystem: dead containers, then unused images (upstream). With a dedicated image
/// filesystem, upstream reclaims nothing for nodefs; Deckhand still removes dead containers
/// there, because their logs are on nodefs, and only images for imagefs.
pub fn reclaim_steps(signal: Signal, dedicated_imagefs: bool) -> &'static [Reclaim] {
    use Reclaim::*;
    match signal {
        Signal::MemoryAvailable | Signal::AllocatableMemoryAvailable | Signal::PidAvailable => &[],
        Signal::NodeFsAvailable | Signal::NodeFsInodesFree if dedicated_imagefs => {
            &[DeadContainers]
        }
        _ => &[DeadContainers, UnusedImages],
    }
}

/// What a pod uses, as measured; `None` fields were not measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PodUsage {
    /// Working set of the pod's running containers.
    pub memory_working_set: u64,
    /// Bytes of the containers' writable layers.
    pub rootfs_bytes: u64,
    /// Bytes of the pod's container logs.
    pub logs_bytes: u64,
    /// Bytes of its local volumes (emptyDir and the like).
    pub volumes_bytes: u64,
    /// Each disk-backed emptyDir's bytes by volume name (measured for its `sizeLimit`; empty
    /// when not measured).
    pub volume_bytes: BTreeMap<String, u64>,
    /// Inodes the above use.
    pub inodes: u64,
    /// Processes (and threads) in the pod; `None` when unknown.
    pub processes: Option<u64>,
    pub containers: Vec<ContainerUsage>,
}

impl PodUsage {
    /// Its ephemeral storage as upstream's pod stats sum it: the writable layers, the logs
    /// and the local volumes.
    pub fn ephemeral_bytes(&self) -> u64 {
        self.rootfs_bytes
            .saturating_add(self.logs_bytes)
            .saturating_add(self.volumes_bytes)
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContainerUsage {
    pub name: String,
    pub memory_working_set: Option<u64>,
    pub rootfs_bytes: Option<u64>,
    pub logs_bytes: Option<u64>,
}

/// A pod the manager may evict, with its usage (`None`: no stats, which ranks first).
#[derive(Debug, Clone)]
pub struct Candidate<'a> {
    pub pod: &'a Pod,
    pub usage: Option<&'a PodUsage>,
}

/// Upstream's `IsCriticalPod`: static, mirror, or system-critical priority. Never evicted,
/// always admitted.
pub fn is_critical(pod: &Pod) -> bool {
    crate::base::podspec::origin::is_static(pod)
        || crate::base::podspec::origin::is_mirror(pod)
        || priority(pod) >= SYSTEM_CRITICAL_PRIORITY
}

fn priority(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

fn memory_request(pod: &Pod) -> i64 {
    pod_requests(pod, &|_| true).memory_bytes
}

fn storage_request(pod: &Pod) -> i64 {
    pod_requests(pod, &|_| true).ephemeral_storage_bytes
}

/// The pod's disk usage for `signal`: with a dedicated image filesystem, nodefs counts logs
/// and local volumes and imagefs the writable layers; otherwise all of them (upstream's
/// `buildSignalToRankFunc`).
pub fn disk_usage(usage: &PodUsage, signal: Signal, dedicated_imagefs: bool) -> u64 {
    if signal.resource() == Resource::Inodes {
        return usage.inodes;
    }
    let node = usage.logs_bytes + usage.volumes_bytes;
    match signal {
        Signal::NodeFsAvailable if dedicated_imagefs => node,
        Signal::ImageFsAvailable | Signal::ContainerFsAvailable if dedicated_imagefs => {
            usage.rootfs_bytes
        }
        _ => node + usage.rootfs_bytes,
    }
}

/// A candidate's (usage exceeds its request, usage − request); `None` without stats.
type Measure = Option<Measured>;
type Measured = (bool, i128);

/// Sorts candidates, first to evict first, for the signal (upstream's rank functions):
/// memory: usage above requests, then lower priority, then larger usage − requests;
/// disk: the same with ephemeral storage; PIDs: lower priority, then more processes.
/// A pod without stats comes first in each comparison that needs them.
pub fn rank(candidates: &mut [Candidate<'_>], signal: Signal, dedicated_imagefs: bool) {
    let resource = signal.resource();
    // (exceeds its request, usage − request) per pod, computed once.
    let measure = |c: &Candidate<'_>| -> Measure {
        let u = c.usage?;
        let (used, request) = match resource {
            Resource::Memory => (u.memory_working_set, memory_request(c.pod)),
            Resource::EphemeralStorage => (
                disk_usage(u, signal, dedicated_imagefs),
                storage_request(c.pod),
            ),
            Resource::Inodes => (u.inodes, 0),
            Resource::Pids => (u.processes.unwrap_or(0), 0),
        };
        Some((
            i128::from(used) > i128::from(request),
            i128::from(used) - i128::from(request),
        ))
    };
    let mut keyed: Vec<(Measure, Candidate<'_>)> =
        candidates.iter().map(|c| (measure(c), c.clone())).collect();
    keyed.sort_by(|(ma, a), (mb, b)| {
        let prio = priority(a.pod).cmp(&priority(b.pod));
        if resource == Resource::Pids {
            return prio.then_with(|| by_stats(ma, mb, &|x, y| y.1.cmp(&x.1)));
        }
        by_stats(ma, mb, &|x, y| y.0.cmp(&x.0))
            .then(prio)
            .then_with(|| by_stats(ma, mb, &|x, y| y.1.cmp(&x.1)))
    });
    for (slot, (_, c)) in candidates.iter_mut().zip(keyed) {
        *slot = c;
    }
}

/// Compares two measures: a pod without stats first, else as `f` says.
fn by_stats(a: &Measure, b: &Measure, f: &dyn Fn(&Measured, &Measured) -> Ordering) -> Ordering {
    match (a, b) {
        (None, None) => Ordering::Equal,
        (None, Some(_)) => Ordering::Less,
        (Some(_), None) => Ordering::Greater,
        (Some(x), Some(y)) => f(x, y),
    }
}

/// The grace period of a pod evicted for a hard threshold (upstream's
/// `immediateEvictionGracePeriodSeconds`; the executor's 2 s floor for stopping a container
/// applies on top, as upstream's).
pub const IMMEDIATE_EVICTION_GRACE_SECONDS: i64 = 1;

/// The grace period of an eviction: [`IMMEDIATE_EVICTION_GRACE_SECONDS`] for a hard threshold;
/// for a soft one the pod's own, capped at `evictionMaxPodGracePeriod` (negative: not capped).
pub fn grace_period(threshold: &ThresholdSpec, pod: &Pod, max_pod_grace_period: i64) -> i64 {
    if threshold.is_hard() {
        return IMMEDIATE_EVICTION_GRACE_SECONDS;
    }
    let own = pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds);
    match own {
        _ if max_pod_grace_period < 0 => own.unwrap_or(30),
        Some(own) => own.min(max_pod_grace_period),
        None => max_pod_grace_period,
    }
}

/// The request a container makes of `resource`, as written in its spec (`0` when none).
fn container_request(pod: &Pod, name: &str, resource: Resource) -> (i64, String) {
    let key = match resource {
        Resource::Memory => "memory",
        Resource::EphemeralStorage => "ephemeral-storage",
        _ => return (0, "0".into()),
    };
    let spec = pod.spec.as_ref();
    let containers = spec
        .map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
        .into_iter()
        .flatten();
    for c in containers {
        if c.name != name {
            continue;
        }
        let q = c
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get(key));
        return match q {
            Some(q) => {
                let value = crate::base::podspec::quantity::parse(&q.0)
                    .map(|v| v.value())
                    .unwrap_or(0);
                (value, resource.format(value))
            }
            None => (0, "0".into()),
        };
    }
    (0, "0".into())
}

/// Upstream's eviction message: the resource, the threshold and what was available, and each
/// container that used more than it requested.
pub fn eviction_message(
    resource: Resource,
    pod: &Pod,
    usage: Option<&PodUsage>,
    thresholds: &[ThresholdSpec],
    act_on: &[usize],
    observations: &Observations,
) -> String {
    let mut message = format!("The node was low on resource: {}. ", resource.as_str());
    let met = act_on
        .iter()
        .filter_map(|i| thresholds.get(*i))
        .find(|t| t.signal.resource() == resource);
    if let Some(t) = met
        && let Some(o) = observations.get(&t.signal)
    {
        message.push_str(&format!(
            "Threshold quantity: {}, available: {}. ",
            threshold_text(t, o.capacity),
            resource.format(o.available)
        ));
    }
    let Some(usage) = usage else {
        return message;
    };
    for c in &usage.containers {
        let used = match resource {
            Resource::Memory => c.memory_working_set,
            Resource::EphemeralStorage => c.rootfs_bytes.zip(c.logs_bytes).map(|(r, l)| r + l),
            _ => None,
        };
        let Some(used) = used else { continue };
        let (request, request_text) = container_request(pod, &c.name, resource);
        if i128::from(used) > i128::from(request) {
            message.push_str(&format!(
                "Container {} was using {}, request is {}, has larger consumption of {}. ",
                c.name,
                resource.format(i64::try_from(used).unwrap_or(i64::MAX)),
                request_text,
                resource.as_str()
            ));
        }
    }
    message
}

/// The threshold's amount as upstream writes it.
fn threshold_text(t: &ThresholdSpec, capacity: i64) -> String {
    t.signal.resource().format(t.quantity(capacity))
}

/// Admission under pressure (upstream's eviction admit handler): `None` admits; otherwise
/// the reason and message of the refusal. Critical pods are always admitted; under memory
/// pressure alone, only BestEffort pods that do not tolerate the memory-pressure taint are
/// refused; any other pressure refuses every pod.
pub fn admit(pod: &Pod, conditions: &BTreeSet<Condition>) -> Option<(&'static str, String)> {
    if conditions.is_empty() || is_critical(pod) {
        return None;
    }
    let memory_only = conditions.len() == 1 && conditions.contains(&Condition::MemoryPressure);
    if memory_only && (qos_class(pod) != QosClass::BestEffort || tolerates_memory_pressure(pod)) {
        return None;
    }
    let names: Vec<&str> = conditions.iter().map(|c| c.as_str()).collect();
    Some((
        REASON,
        format!("The node had condition: [{}]. ", names.join(" ")),
    ))
}

fn tolerates_memory_pressure(pod: &Pod) -> bool {
    let tolerations = pod.spec.as_ref().and_then(|s| s.tolerations.as_ref());
    tolerations.into_iter().flatten().any(|t| {
        let effect_ok = t
            .effect
            .as_deref()
            .is_none_or(|e| e.is_empty() || e == "NoSchedule");
        let exists = t.operator.as_deref() == Some("Exists");
        let key_ok = match t.key.as_deref() {
            None | Some("") => exists,
            Some(k) => k == MEMORY_PRESSURE_TAINT,
        };
        let value_ok = exists || t.value.as_deref().unwrap_or("").is_empty();
        effect_ok && key_ok && value_ok
    })
}

/// The status an evicted pod ends with (upstream's eviction status function on top of the
/// pod's last status): phase Failed, reason Evicted, the message, a `DisruptionTarget`
/// condition, not ready, and each running container shown terminated as the kill leaves it
/// (exit code 137).
pub fn evicted_status(
    pod: &Pod,
    last: Option<k8s_openapi::api::core::v1::PodStatus>,
    message: &str,
    now: k8s_openapi::jiff::Timestamp,
) -> k8s_openapi::api::core::v1::PodStatus {
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateTerminated, PodCondition};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    let mut status = last.unwrap_or_default();
    status.phase = Some("Failed".into());
    status.reason = Some(REASON.into());
    status.message = Some(message.into());
    if status.qos_class.is_none() {
        status.qos_class = Some(qos_class(pod).as_str().to_string());
    }
    let mut conditions = status.conditions.take().unwrap_or_default();
    conditions.retain(|c| c.type_ != "DisruptionTarget");
    for c in conditions.iter_mut() {
        if matches!(c.type_.as_str(), "Ready" | "ContainersReady") && c.status != "False" {
            c.status = "False".into();
            c.reason = Some("PodFailed".into());
            c.last_transition_time = Some(Time(now));
        }
    }
    conditions.push(PodCondition {
        type_: "DisruptionTarget".into(),
        status: "True".into(),
        reason: Some("TerminationByKubelet".into()),
        message: Some(message.into()),
        last_transition_time: Some(Time(now)),
        ..Default::default()
    });
    status.conditions = Some(conditions);
    let kill = |cs: &mut Vec<k8s_openapi::api::core::v1::ContainerStatus>| {
        for c in cs.iter_mut() {
            c.ready = false;
            c.started = Some(false);
            if let Some(running) = c.state.as_ref().and_then(|s| s.running.as_ref()) {
                c.state = Some(ContainerState {
                    terminated: Some(ContainerStateTerminated {
                        exit_code: 137,
                        reason: Some("Error".into()),
                        started_at: running.started_at.clone(),
                        finished_at: Some(Time(now)),
                        container_id: Some(c.container_id.clone().unwrap_or_default())
                            .filter(|s| !s.is_empty()),
                        ..Default::default()
                    }),
                    ..Default::default()
                });
            }
        }
    };
    if let Some(cs) = status.container_statuses.as_mut() {
        kill(cs);
    }
    if let Some(cs) = status.init_container_statuses.as_mut() {
        kill(cs);
    }
    status
}
