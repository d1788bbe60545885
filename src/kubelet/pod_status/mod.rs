//! Pod status: one pure computation from the spec, the runtime's view and the worker's notes.
//!
//! The read-only API serves exactly what this produces. Keeping it pure means every waiting and
//! terminated reason and every condition transition is a table row in the tests.

use std::collections::HashMap;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::base::observed::{self, ContainerState as RtState, ObservedContainer, ObservedPod};
use crate::base::podspec::{RestartPolicy, is_sidecar};
use crate::kubelet::prober::ProbeView;

/// The reasons upstream shows for a container that is waiting, which the pod worker records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WaitReason {
    /// Volumes are not ready yet.
    ContainerCreating,
    /// A restart waits out its crash-loop back-off.
    CrashLoopBackOff,
    ErrImagePull,
    ImagePullBackOff,
    ErrImageNeverPull,
    CreateContainerConfigError,
    CreateContainerError,
    RunContainerError,
    PostStartHookError,
}

impl WaitReason {
    /// The reason as the API shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            WaitReason::ContainerCreating => "ContainerCreating",
            WaitReason::CrashLoopBackOff => "CrashLoopBackOff",
            WaitReason::ErrImagePull => "ErrImagePull",
            WaitReason::ImagePullBackOff => "ImagePullBackOff",
            WaitReason::ErrImageNeverPull => "ErrImageNeverPull",
            WaitReason::CreateContainerConfigError => "CreateContainerConfigError",
            WaitReason::CreateContainerError => "CreateContainerError",
            WaitReason::RunContainerError => "RunContainerError",
            WaitReason::PostStartHookError => "PostStartHookError",
        }
    }

    /// An error that the worker retries soon by itself (everything but a back-off wait, which
    /// has its own end time).
    pub fn retried_soon(self) -> bool {
        self != WaitReason::CrashLoopBackOff
    }
}

/// A text that is none of the waiting reasons Deckhand records.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a waiting reason Deckhand records")]
pub struct UnknownWaitReason(pub String);

impl std::str::FromStr for WaitReason {
    type Err = UnknownWaitReason;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        const ALL: [WaitReason; 9] = [
            WaitReason::ContainerCreating,
            WaitReason::CrashLoopBackOff,
            WaitReason::ErrImagePull,
            WaitReason::ImagePullBackOff,
            WaitReason::ErrImageNeverPull,
            WaitReason::CreateContainerConfigError,
            WaitReason::CreateContainerError,
            WaitReason::RunContainerError,
            WaitReason::PostStartHookError,
        ];
        ALL.into_iter()
            .find(|r| r.as_str() == text)
            .ok_or_else(|| UnknownWaitReason(text.to_string()))
    }
}

impl std::fmt::Display for WaitReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a container is not running, as recorded by the pod worker (image pull failed, back-off…).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitingReason {
    pub reason: WaitReason,
    pub message: String,
}

impl WaitingReason {
    pub fn new(reason: WaitReason, message: impl Into<String>) -> Self {
        WaitingReason {
            reason,
            message: message.into(),
        }
    }
}

/// Inputs to the status computation besides the pod and the runtime's view.
pub struct StatusInputs<'a> {
    pub now: SystemTime,
    pub host_ip: Option<String>,
    /// Waiting reasons by container name.
    pub waiting: &'a HashMap<String, WaitingReason>,
    /// The status computed last time, whose transition times and start time are kept.
    pub previous: Option<&'a PodStatus>,
    /// The pod is being torn down (deleted or replaced).
    pub terminating: bool,
    /// Probe results by container name; a container with a readiness or startup probe and no
    /// result yet is not ready / not started.
    pub probes: &'a HashMap<String, ProbeView>,
}

/// Container ID as the Kubernetes API writes it.
pub fn container_id(id: &str) -> String {
    format!("containerd://{id}")
}

fn time(t: SystemTime) -> Time {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let ts = Timestamp::new(since.as_secs() as i64, since.subsec_nanos() as i32)
        .unwrap_or(Timestamp::UNIX_EPOCH);
    Time(ts)
}

fn nanos_time(nanos: i64) -> Option<Time> {
    observed::nanos_to_time(nanos).map(time)
}

fn terminated_state(inst: &ObservedContainer) -> ContainerStateTerminated {
    let reason = if !inst.reason.is_empty() {
        inst.reason.clone()
    } else if inst.exit_code == 0 {
        "Completed".to_string()
    } else {
        "Error".to_string()
    };
    ContainerStateTerminated {
        container_id: Some(container_id(&inst.id)),
        exit_code: inst.exit_code,
        reason: Some(reason),
        message: (!inst.message.is_empty()).then(|| inst.message.clone()),
        started_at: nanos_time(inst.started_at),
        finished_at: nanos_time(inst.finished_at),
        signal: None,
    }
}

/// The terminated state of an instance, when it has exited.
fn exited_state(inst: Option<&ObservedContainer>) -> Option<ContainerState> {
    inst.filter(|i| i.state == RtState::Exited)
        .map(|i| ContainerState {
            terminated: Some(terminated_state(i)),
            ..Default::default()
        })
}

fn waiting(reason: &str, message: Option<String>) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.to_string()),
            message,
        }),
        ..Default::default()
    }
}

/// The status of one container of the spec.
fn container_status(
    container: &Container,
    observed: &ObservedPod,
    inputs: &StatusInputs,
    restart_policy: RestartPolicy,
    default_waiting: &str,
) -> ContainerStatus {
    let instances = observed.instances(&container.name);
    let latest = instances.first().copied();
    let previous = instances.get(1).copied();
    let noted = inputs.waiting.get(&container.name);
    let mut status = ContainerStatus {
        name: container.name.clone(),
        image: container.image.clone().unwrap_or_default(),
        image_id: String::new(),
        restart_count: latest.map(|c| c.attempt as i32).unwrap_or(0),
        ready: false,
        started: Some(false),
        ..Default::default()
    };
    if let Some(inst) = latest {
        status.container_id = Some(container_id(&inst.id));
        status.image_id = inst.image_ref.clone();
    }
    match latest.map(|i| i.state) {
        Some(RtState::Running) => {
            let inst = latest.expect("matched");
            status.state = Some(ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: nanos_time(inst.started_at),
                }),
                ..Default::default()
            });
            let view = inputs
                .probes
                .get(&container.name)
                .copied()
                .unwrap_or_default();
            let ready_by_probe = container.readiness_probe.is_none() || view.ready == Some(true);
            let started_by_probe = container.startup_probe.is_none() || view.started == Some(true);
            status.ready = !inputs.terminating && ready_by_probe && started_by_probe;
            status.started = Some(started_by_probe);
            status.last_state = exited_state(previous);
        }
        Some(RtState::Exited) => {
            let inst = latest.expect("matched");
            let restarting = restart_policy.restarts_after(inst.exit_code) && !inputs.terminating;
            match noted {
                Some(w) if restarting => {
                    status.state = Some(waiting(w.reason.as_str(), Some(w.message.clone())));
                    status.last_state = exited_state(Some(inst));
                }
                _ => {
                    status.state = exited_state(Some(inst));
                    status.last_state = exited_state(previous);
                }
            }
        }
        Some(RtState::Created) | Some(RtState::Unknown) | None => {
            status.state = Some(match noted {
                Some(w) => waiting(w.reason.as_str(), Some(w.message.clone())),
                None => waiting(default_waiting, None),
            });
            status.last_state = exited_state(latest).or_else(|| exited_state(previous));
        }
    }
    status
}

/// Upstream's phase rules (`getPhase`), over the computed container statuses.
fn phase(
    restart_policy: RestartPolicy,
    init: &[ContainerStatus],
    app: &[ContainerStatus],
    has_sandbox_history: bool,
) -> &'static str {
    // Init containers: any failure under Never fails the pod; anything unfinished keeps it pending.
    let mut init_pending = false;
    for s in init {
        let st = s.state.as_ref();
        match st.and_then(|st| st.terminated.as_ref()) {
            Some(t) if t.exit_code == 0 => {}
            Some(_) if restart_policy == RestartPolicy::Never => return "Failed",
            _ => init_pending = true,
        }
    }
    if init_pending {
        return "Pending";
    }
    let (mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0);
    for s in app {
        let st = s.state.as_ref();
        if st.and_then(|st| st.running.as_ref()).is_some() {
            running += 1;
        } else if let Some(t) = st.and_then(|st| st.terminated.as_ref()) {
            stopped += 1;
            if t.exit_code == 0 {
                succeeded += 1;
            }
        } else if s
            .last_state
            .as_ref()
            .and_then(|l| l.terminated.as_ref())
            .is_some()
        {
            stopped += 1;
        } else {
            waiting += 1;
        }
    }
    let _ = has_sandbox_history;
    if waiting > 0 {
        return "Pending";
    }
    if running > 0 {
        return "Running";
    }
    if stopped > 0 {
        if restart_policy == RestartPolicy::Always {
            return "Running";
        }
        if stopped == succeeded {
            return "Succeeded";
        }
        if restart_policy == RestartPolicy::Never {
            return "Failed";
        }
        return "Running";
    }
    "Pending"
}

/// Keeps a condition's transition time when its status has not changed.
fn condition(
    previous: Option<&PodStatus>,
    now: SystemTime,
    type_: &str,
    ok: bool,
    reason: Option<&str>,
) -> PodCondition {
    let status = if ok { "True" } else { "False" };
    let kept = previous
        .and_then(|p| p.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
        .filter(|c| c.status == status)
        .and_then(|c| c.last_transition_time.clone());
    PodCondition {
        type_: type_.to_string(),
        status: status.to_string(),
        last_transition_time: Some(kept.unwrap_or_else(|| time(now))),
        reason: reason.map(str::to_string),
        ..Default::default()
    }
}

/// Computes the pod's status.
pub fn compute_pod_status(pod: &Pod, observed: &ObservedPod, inputs: &StatusInputs) -> PodStatus {
    let spec = pod.spec.clone().unwrap_or_default();
    let restart_policy = RestartPolicy::of(pod);
    let inits: Vec<ContainerStatus> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| {
            let policy = if is_sidecar(c) {
                RestartPolicy::Always
            } else {
                restart_policy_for_init(restart_policy)
            };
            container_status(c, observed, inputs, policy, "PodInitializing")
        })
        .collect();
    let sidecars: Vec<bool> = spec
        .init_containers
        .iter()
        .flatten()
        .map(is_sidecar)
        .collect();
    let mut inits = inits;
    for (s, sidecar) in inits.iter_mut().zip(&sidecars) {
        // Upstream reports an init container that completed successfully as ready; a sidecar
        // is ready like an app container is.
        if !sidecar {
            s.ready = s
                .state
                .as_ref()
                .and_then(|st| st.terminated.as_ref())
                .is_some_and(|t| t.exit_code == 0);
        }
    }
    // A sidecar counts as initialized once it has started (and stays so while it restarts).
    let initialized = |s: &ContainerStatus, sidecar: bool| {
        if sidecar {
            // It has run: started now, or terminated (stopped with the pod, or restarting).
            s.started == Some(true)
                || s.state
                    .as_ref()
                    .and_then(|l| l.terminated.as_ref())
                    .is_some()
                || s.last_state
                    .as_ref()
                    .and_then(|l| l.terminated.as_ref())
                    .is_some()
        } else {
            s.ready
        }
    };
    let init_done = inits
        .iter()
        .zip(&sidecars)
        .all(|(s, sidecar)| initialized(s, *sidecar));
    let regular_inits: Vec<ContainerStatus> = inits
        .iter()
        .zip(&sidecars)
        .filter(|(_, sidecar)| !**sidecar)
        .map(|(s, _)| s.clone())
        .collect();
    let sidecars_ready = inits
        .iter()
        .zip(&sidecars)
        .filter(|(_, sidecar)| **sidecar)
        .all(|(s, _)| s.ready);
    // Upstream's default waiting reason is PodInitializing for every container of a pod that has
    // init containers, even once they are done.
    let app_default = if inits.is_empty() {
        "ContainerCreating"
    } else {
        "PodInitializing"
    };
    let apps: Vec<ContainerStatus> = spec
        .containers
        .iter()
        .map(|c| container_status(c, observed, inputs, restart_policy, app_default))
        .collect();

    let sandbox = observed.newest_sandbox();
    let sandbox_ready =
        sandbox.is_some_and(|s| s.state == crate::base::observed::SandboxState::Ready);
    let previous = inputs.previous;
    let mut phase = if init_done {
        phase(restart_policy, &regular_inits, &apps, sandbox.is_some())
    } else if inits.iter().zip(&sidecars).any(|(s, sidecar)| {
        !sidecar
            && s.state
                .as_ref()
                .and_then(|st| st.terminated.as_ref())
                .is_some_and(|t| t.exit_code != 0)
    }) && restart_policy == RestartPolicy::Never
    {
        "Failed"
    } else {
        "Pending"
    };
    // Like upstream, a pod never leaves a terminal phase once reported.
    if let Some(kept) = previous
        .and_then(|p| p.phase.as_deref())
        .filter(|p| *p == "Succeeded" || *p == "Failed")
    {
        phase = if kept == "Succeeded" {
            "Succeeded"
        } else {
            "Failed"
        };
    }
    let terminal = phase == "Succeeded" || phase == "Failed";
    let containers_ready = !apps.is_empty() && apps.iter().all(|s| s.ready) && sidecars_ready;

    // Upstream: a finished pod's readiness reason says how it finished; otherwise it lists the
    // containers that are not ready, formatted like Go prints a string slice.
    let unready: Vec<&str> = apps
        .iter()
        .filter(|s| !s.ready)
        .map(|s| s.name.as_str())
        .collect();
    let (ready_reason, ready_message) = match phase {
        "Succeeded" => (Some("PodCompleted"), None),
        "Failed" => (Some("PodFailed"), None),
        _ if containers_ready => (None, None),
        _ => (
            Some("ContainersNotReady"),
            Some(format!(
                "containers with unready status: [{}]",
                unready.join(" ")
            )),
        ),
    };
    let incomplete: Vec<&str> = inits
        .iter()
        .filter(|s| !s.ready)
        .map(|s| s.name.as_str())
        .collect();
    let (init_ok, init_reason, init_message) = if phase == "Succeeded" {
        (true, Some("PodCompleted"), None)
    } else if init_done {
        (true, None, None)
    } else {
        (
            false,
            Some("ContainersNotInitialized"),
            Some(format!(
                "containers with incomplete status: [{}]",
                incomplete.join(" ")
            )),
        )
    };
    let ready_ok = containers_ready && !terminal;
    let with_message = |mut c: PodCondition, message: &Option<String>| {
        c.message = message.clone();
        c
    };

    let conditions = vec![
        condition(
            previous,
            inputs.now,
            "PodReadyToStartContainers",
            sandbox_ready,
            None,
        ),
        with_message(
            condition(previous, inputs.now, "Initialized", init_ok, init_reason),
            &init_message,
        ),
        with_message(
            condition(previous, inputs.now, "Ready", ready_ok, ready_reason),
            &ready_message,
        ),
        with_message(
            condition(
                previous,
                inputs.now,
                "ContainersReady",
                ready_ok,
                ready_reason,
            ),
            &ready_message,
        ),
        condition(previous, inputs.now, "PodScheduled", true, None),
    ];

    let pod_ip = sandbox.and_then(|s| {
        if s.host_network {
            inputs.host_ip.clone()
        } else {
            s.ip.clone()
        }
    });
    let pod_ips = pod_ip.as_ref().map(|ip| {
        let mut ips = vec![PodIP { ip: ip.clone() }];
        if let Some(s) = sandbox.filter(|s| !s.host_network) {
            ips.extend(s.additional_ips.iter().map(|ip| PodIP { ip: ip.clone() }));
        }
        ips
    });
    let start_time = previous
        .and_then(|p| p.start_time.clone())
        .unwrap_or_else(|| time(inputs.now));

    PodStatus {
        phase: Some(phase.to_string()),
        conditions: Some(conditions),
        host_ip: inputs.host_ip.clone(),
        host_ips: inputs
            .host_ip
            .as_ref()
            .map(|ip| vec![HostIP { ip: ip.clone() }]),
        pod_ip,
        pod_ips,
        start_time: Some(start_time),
        qos_class: Some(crate::base::podspec::qos_class(pod).as_str().to_string()),
        init_container_statuses: (!inits.is_empty()).then_some(inits),
        container_statuses: Some(apps),
        ..Default::default()
    }
}

/// Init containers restart on failure unless the pod says Never.
fn restart_policy_for_init(pod_policy: RestartPolicy) -> RestartPolicy {
    if pod_policy == RestartPolicy::Never {
        RestartPolicy::Never
    } else {
        RestartPolicy::OnFailure
    }
}

#[cfg(test)]
mod tests;

pub mod api_writer;
pub mod published;
