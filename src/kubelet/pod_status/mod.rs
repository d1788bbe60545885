//! Pod status: one pure computation from the spec, the runtime's view and the worker's notes.
//!
//! The read-only API serves exactly what this produces. Keeping it pure means every waiting and
//! terminated reason and every condition transition is a table row in the tests.

use std::collections::HashMap;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated,
    ContainerStateWaiting, ContainerStatus, HostIP, Pod, PodCondition, PodIP, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::base::observed::{
    self, ContainerState as RtState, ObservedContainer, ObservedPod, ObservedSandbox,
};
use crate::base::podspec::restart::{any_restart_all_rule, should_restart, spec_container};
use crate::base::podspec::{ephemeral, is_sidecar, readiness_gates};
use crate::base::restart_round;
use crate::kubelet::prober::ProbeView;

/// The reasons upstream shows for a container that is waiting, which the pod worker records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum WaitReason {
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
    pub(crate) fn as_str(self) -> &'static str {
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
    pub(crate) fn retried_soon(self) -> bool {
        self != WaitReason::CrashLoopBackOff
    }
}

/// A text that is none of the waiting reasons Deckhand records.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a waiting reason Deckhand records")]
pub(crate) struct UnknownWaitReason(pub String);

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
pub(crate) struct WaitingReason {
    pub reason: WaitReason,
    pub message: String,
}

impl WaitingReason {
    pub(crate) fn new(reason: WaitReason, message: impl Into<String>) -> Self {
        WaitingReason {
            reason,
            message: message.into(),
        }
    }
}

/// Inputs to the status computation besides the pod and the runtime's view.
pub(crate) struct StatusInputs<'a> {
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
pub(crate) fn container_id(id: &str) -> String {
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

/// The status of one container of the spec (of `pod`, whose policies say whether an exited
/// container restarts).
fn container_status(
    pod: &Pod,
    container: &Container,
    observed: &ObservedPod,
    inputs: &StatusInputs,
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
    resize_conditions::resources(container, latest.map(|i| i.state), &mut status);
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
            let restarting = should_restart(pod, container, inst.exit_code) && !inputs.terminating;
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

/// Whether the container of this status may run again after the exit it shows (its current
/// state, else its last one): upstream's `ContainerShouldRestart` in `getPhase`. A status with
/// no container in the spec, or no exit, counts as restartable.
fn restartable(pod: &Pod, s: &ContainerStatus) -> bool {
    let exit = s
        .state
        .as_ref()
        .and_then(|st| st.terminated.as_ref())
        .or_else(|| s.last_state.as_ref().and_then(|l| l.terminated.as_ref()))
        .map(|t| t.exit_code);
    match (spec_container(pod, &s.name), exit) {
        (Some(c), Some(code)) => should_restart(pod, c, code),
        _ => true,
    }
}

/// Upstream's phase rules (`getPhase`, ContainerRestartRules on), over the computed container
/// statuses: whether an exited container restarts is asked of each container's own policy.
fn phase(pod: &Pod, init: &[ContainerStatus], app: &[ContainerStatus]) -> &'static str {
    // Init containers: a failure that may not restart fails the pod; anything unfinished keeps
    // it pending.
    let mut init_pending = false;
    for s in init {
        let st = s.state.as_ref();
        match st.and_then(|st| st.terminated.as_ref()) {
            Some(t) if t.exit_code == 0 => {}
            Some(_) if !restartable(pod, s) => return "Failed",
            _ => init_pending = true,
        }
    }
    if init_pending {
        return "Pending";
    }
    let (mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0);
    let mut stopped_for_good = 0;
    for s in app {
        let st = s.state.as_ref();
        if st.and_then(|st| st.running.as_ref()).is_some() {
            running += 1;
            continue;
        }
        if let Some(t) = st.and_then(|st| st.terminated.as_ref()) {
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
            continue;
        }
        if !restartable(pod, s) {
            stopped_for_good += 1;
        }
    }
    if waiting > 0 {
        return "Pending";
    }
    if running > 0 {
        return "Running";
    }
    if stopped > 0 {
        // At least one container is on its way to running again.
        if stopped != stopped_for_good {
            return "Running";
        }
        if stopped == succeeded {
            return "Succeeded";
        }
        return "Failed";
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
///
/// The container statuses come first; the phase, the conditions and the IPs are each read off
/// them, the sandbox and the previous status by a helper of their own.
pub(crate) fn compute_pod_status(
    pod: &Pod,
    observed: &ObservedPod,
    inputs: &StatusInputs,
) -> PodStatus {
    let spec = pod.spec.clone().unwrap_or_default();
    let inits = InitStatuses::compute(pod, &spec, observed, inputs);
    // Upstream's default waiting reason is PodInitializing for every container of a pod that has
    // init containers, even once they are done.
    let app_default = if inits.statuses.is_empty() {
        "ContainerCreating"
    } else {
        "PodInitializing"
    };
    let apps: Vec<ContainerStatus> = spec
        .containers
        .iter()
        .map(|c| container_status(pod, c, observed, inputs, app_default))
        .collect();

    let sandbox = observed.newest_sandbox();
    let sandbox_ready =
        sandbox.is_some_and(|s| s.state == crate::base::observed::SandboxState::Ready);
    let previous = inputs.previous;
    let phase = pod_phase(pod, &inits, &apps, previous);
    let initialized = initialized_verdict(phase, &inits, previous);
    let containers_ready = ready_verdict(phase, &inits, &apps);
    let ready = gated(pod, &containers_ready);
    let mut conditions = vec![
        condition(
            previous,
            inputs.now,
            "PodReadyToStartContainers",
            sandbox_ready,
            None,
        ),
        initialized.condition(previous, inputs.now, "Initialized"),
        ready.condition(previous, inputs.now, "Ready"),
        containers_ready.condition(previous, inputs.now, "ContainersReady"),
        condition(previous, inputs.now, "PodScheduled", true, None),
    ];
    if any_restart_all_rule(pod) {
        conditions.push(all_containers_restarting(pod, observed, inputs));
    }
    for c in &mut conditions {
        c.observed_generation = observed_generation(pod);
    }
    let conditions = resize_conditions::with_resize_verdict(conditions, pod, previous, inputs.now);
    let ephemeral = ephemeral_statuses(pod, observed, inputs, app_default);

    let (pod_ip, pod_ips) = pod_ips(sandbox, inputs.host_ip.as_deref());
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
        init_container_statuses: (!inits.statuses.is_empty()).then_some(inits.statuses),
        container_statuses: Some(apps),
        ephemeral_container_statuses: (!ephemeral.is_empty()).then_some(ephemeral),
        observed_generation: observed_generation(pod),
        ..Default::default()
    }
}

/// `AllContainersRestarting`, which a pod with a `RestartAllContainers` rule carries: true, with
/// upstream's reason and message, while a round of it stops what of the earlier ones still runs.
fn all_containers_restarting(
    pod: &Pod,
    observed: &ObservedPod,
    inputs: &StatusInputs,
) -> PodCondition {
    let restarting = restart_round::restarting(pod, observed);
    let mut c = condition(
        inputs.previous,
        inputs.now,
        "AllContainersRestarting",
        restarting,
        restarting.then_some("RestartAllContainersStarted"),
    );
    c.message = restarting.then(|| "container exited with restart policy rule".to_string());
    c
}

/// The generation of the pod spec a status is computed from, which the status and each of the
/// node's conditions carry as `observedGeneration` (upstream's `PodObservedGenerationTracking`,
/// GA and locked on since 1.35). A pod without one (from a file) has none to report.
pub(crate) fn observed_generation(pod: &Pod) -> Option<i64> {
    pod.metadata.generation.filter(|g| *g != 0)
}

/// The ephemeral containers' statuses, as upstream computes them: like an app container's
/// (the same default waiting reason), but never restarted, never ready, and with no `started`
/// (the probe manager, which sets it, does not look at them).
fn ephemeral_statuses(
    pod: &Pod,
    observed: &ObservedPod,
    inputs: &StatusInputs,
    default_waiting: &str,
) -> Vec<ContainerStatus> {
    ephemeral::of(pod)
        .iter()
        .map(|ec| {
            // Never restarted, whatever the pod's policy.
            let container = Container {
                restart_policy: Some("Never".into()),
                ..ephemeral::as_container(ec)
            };
            let mut status = container_status(pod, &container, observed, inputs, default_waiting);
            status.ready = false;
            status.started = None;
            status
        })
        .collect()
}

/// The init containers' statuses, each with whether it is a sidecar: readiness, the phase and
/// the Initialized condition treat the two kinds differently, so the flag travels with them.
struct InitStatuses {
    statuses: Vec<ContainerStatus>,
    sidecars: Vec<bool>,
}

impl InitStatuses {
    /// The statuses of the spec's init containers, in order. A regular init container restarts
    /// only on failure and as its policy says; a sidecar always restarts.
    fn compute(pod: &Pod, spec: &PodSpec, observed: &ObservedPod, inputs: &StatusInputs) -> Self {
        let mut statuses: Vec<ContainerStatus> = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| container_status(pod, c, observed, inputs, "PodInitializing"))
            .collect();
        let sidecars: Vec<bool> = spec
            .init_containers
            .iter()
            .flatten()
            .map(is_sidecar)
            .collect();
        for (s, sidecar) in statuses.iter_mut().zip(&sidecars) {
            // Upstream reports an init container that completed successfully as ready; a
            // sidecar is ready like an app container is.
            if !sidecar {
                s.ready = exit_code(s).is_some_and(|code| code == 0);
            }
        }
        InitStatuses { statuses, sidecars }
    }

    /// Each status with whether it is a sidecar's.
    fn iter(&self) -> impl Iterator<Item = (&ContainerStatus, bool)> {
        self.statuses.iter().zip(self.sidecars.iter().copied())
    }

    /// Every init container is done: the regular ones succeeded, the sidecars started.
    fn all_initialized(&self) -> bool {
        self.iter().all(|(s, sidecar)| initialized(s, sidecar))
    }

    /// The statuses of the regular (non-sidecar) init containers, which the phase rules read.
    fn regular(&self) -> Vec<ContainerStatus> {
        self.iter()
            .filter(|(_, sidecar)| !sidecar)
            .map(|(s, _)| s.clone())
            .collect()
    }

    /// Every sidecar is ready (a pod's containers are ready only when its sidecars are too).
    fn sidecars_ready(&self) -> bool {
        self.iter()
            .filter(|(_, sidecar)| *sidecar)
            .all(|(s, _)| s.ready)
    }

    /// A regular init container has exited with a non-zero code and may not restart.
    fn any_failed_for_good(&self, pod: &Pod) -> bool {
        self.iter().any(|(s, sidecar)| {
            !sidecar && exit_code(s).is_some_and(|code| code != 0) && !restartable(pod, s)
        })
    }
}

/// The exit code of a container whose current state is terminated.
fn exit_code(status: &ContainerStatus) -> Option<i32> {
    status
        .state
        .as_ref()
        .and_then(|st| st.terminated.as_ref())
        .map(|t| t.exit_code)
}

/// Whether one init container counts as done. A sidecar counts as initialized once it has
/// started, and stays so while it restarts; a regular one once it is ready (succeeded).
fn initialized(s: &ContainerStatus, sidecar: bool) -> bool {
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
}

/// The pod's phase: upstream's rules once the init containers are done; before that Failed
/// when one failed and may not restart, else Pending. A terminal phase reported before is
/// kept, as upstream never leaves one.
fn pod_phase(
    pod: &Pod,
    inits: &InitStatuses,
    apps: &[ContainerStatus],
    previous: Option<&PodStatus>,
) -> &'static str {
    let phase = if inits.all_initialized() {
        phase(pod, &inits.regular(), apps)
    } else if inits.any_failed_for_good(pod) {
        "Failed"
    } else {
        "Pending"
    };
    match previous.and_then(|p| p.phase.as_deref()) {
        Some("Succeeded") => "Succeeded",
        Some("Failed") => "Failed",
        _ => phase,
    }
}

/// What a condition says before its transition time is filled in: the Initialized, Ready and
/// ContainersReady conditions carry a reason and a message that depend on the phase.
struct Verdict {
    ok: bool,
    reason: Option<&'static str>,
    message: Option<String>,
}

impl Verdict {
    /// The condition of type `type_` with this verdict.
    fn condition(
        &self,
        previous: Option<&PodStatus>,
        now: SystemTime,
        type_: &str,
    ) -> PodCondition {
        let mut c = condition(previous, now, type_, self.ok, self.reason);
        c.message = self.message.clone();
        c
    }
}

/// The Initialized condition: true once the init containers are done (or the pod succeeded);
/// otherwise it lists the init containers that are not, formatted like Go prints a string
/// slice. A pod once initialized stays so while its init containers run again (a round of
/// `RestartAllContainers`, a new sandbox), as upstream's with that feature on.
fn initialized_verdict(phase: &str, inits: &InitStatuses, previous: Option<&PodStatus>) -> Verdict {
    if phase == "Succeeded" {
        return Verdict {
            ok: true,
            reason: Some("PodCompleted"),
            message: None,
        };
    }
    let was_initialized = previous
        .and_then(|p| p.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Initialized" && c.status == "True")
        });
    if inits.all_initialized() || was_initialized {
        return Verdict {
            ok: true,
            reason: None,
            message: None,
        };
    }
    let incomplete: Vec<&str> = inits
        .statuses
        .iter()
        .filter(|s| !s.ready)
        .map(|s| s.name.as_str())
        .collect();
    Verdict {
        ok: false,
        reason: Some("ContainersNotInitialized"),
        message: Some(format!(
            "containers with incomplete status: [{}]",
            incomplete.join(" ")
        )),
    }
}

/// The Ready and ContainersReady conditions. Upstream: a finished pod's readiness reason says
/// how it finished; otherwise it lists the containers that are not ready, formatted like Go
/// prints a string slice. A finished pod is never ready.
fn ready_verdict(phase: &'static str, inits: &InitStatuses, apps: &[ContainerStatus]) -> Verdict {
    let containers_ready =
        !apps.is_empty() && apps.iter().all(|s| s.ready) && inits.sidecars_ready();
    let terminal = phase == "Succeeded" || phase == "Failed";
    let unready: Vec<&str> = apps
        .iter()
        .filter(|s| !s.ready)
        .map(|s| s.name.as_str())
        .collect();
    let (reason, message) = match phase {
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
    Verdict {
        ok: containers_ready && !terminal,
        reason,
        message,
    }
}

/// The Ready condition from the ContainersReady one: the same while the containers are not
/// ready; otherwise held back by any readiness gate whose condition (set by others, read from
/// the pod the API server holds) is missing or not "True", as upstream's
/// `GeneratePodReadyCondition`.
fn gated(pod: &Pod, containers: &Verdict) -> Verdict {
    let message = containers
        .ok
        .then(|| readiness_gates::unready_message(pod))
        .flatten();
    match message {
        Some(message) => Verdict {
            ok: false,
            reason: Some(readiness_gates::REASON),
            message: Some(message),
        },
        None => Verdict {
            ok: containers.ok,
            reason: containers.reason,
            message: containers.message.clone(),
        },
    }
}

/// The pod's IP and IPs: the node's under host networking, else the sandbox's own (its first
/// IP, then any additional ones).
fn pod_ips(
    sandbox: Option<&ObservedSandbox>,
    host_ip: Option<&str>,
) -> (Option<String>, Option<Vec<PodIP>>) {
    let pod_ip = sandbox.and_then(|s| {
        if s.host_network {
            host_ip.map(str::to_string)
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
    (pod_ip, pod_ips)
}

#[cfg(test)]
mod tests;

pub(crate) mod allocated_resources;
pub(crate) mod api_writer;
pub(crate) mod published;
pub(crate) mod readiness;
pub(crate) mod resize_conditions;
