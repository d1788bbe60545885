//! `compute_pod_actions`: given the pod we want and what the runtime shows, decide what to do.
//!
//! Pure: the time, the back-off state and the spec hashes are arguments, so every case is a row
//! in a table test. The executor carries the decision out; nothing here talks to the runtime.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec, ResourceRequirements};

use super::backoff::{BackoffEntry, BackoffPolicy, BackoffTable};
use crate::base::observed::{
    ContainerState, ObservedContainer, ObservedPod, ObservedSandbox, SandboxState,
};
use crate::base::podspec::restart::{container_policy, may_restart, should_restart};
use crate::base::podspec::{RestartPolicy, ephemeral, is_sidecar, spec_hash};
use crate::base::restart_round;
use crate::kubelet::prober::{ProbeView, Unhealthy};

/// Which list of the spec a container comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ContainerKind {
    Init,
    App,
    /// `spec.ephemeralContainers` (`kubectl debug`): started once, never restarted.
    Ephemeral,
}

/// A container instance to create and start.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct StartContainer {
    pub kind: ContainerKind,
    /// Index in `spec.initContainers`, `spec.containers` or `spec.ephemeralContainers`.
    pub index: usize,
    pub name: String,
    /// The new instance's restart count (its CRI attempt).
    pub restart_count: u32,
    /// Back-off state to record when this start is a restart after an exit.
    pub backoff: Option<BackoffEntry>,
    /// The `RestartAllContainers` round the instance is made for (its trigger's ID), recorded
    /// on it ([`crate::base::cri_labels::RESTART_ROUND_ANNOTATION`]).
    pub round: Option<String>,
}

/// A running container instance to stop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KillContainer {
    pub id: String,
    pub name: String,
    pub reason: String,
    /// A probe's own `terminationGracePeriodSeconds`, which beats the pod's.
    pub grace_override: Option<i64>,
}

/// A running container whose resources change in place (`UpdateContainerResources`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ResizeContainer {
    pub id: String,
    pub name: String,
}

/// A container that should restart but must wait out its back-off first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BackoffWait {
    pub name: String,
    pub remaining: Duration,
    pub message: String,
}

/// Everything to do for one pod in one sync, in the order the executor does it.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct PodActions {
    /// Stop every container and sandbox of the pod first (sandbox gone bad, pod finished).
    pub kill_pod: Option<String>,
    /// Create a new sandbox with this attempt number.
    pub create_sandbox: Option<u32>,
    /// The sandbox to start containers in, when an existing one is kept.
    pub sandbox_id: Option<String>,
    pub kill_containers: Vec<KillContainer>,
    pub start_containers: Vec<StartContainer>,
    /// Running containers whose allocated resources are applied in place.
    pub resize_containers: Vec<ResizeContainer>,
    pub waiting: Vec<BackoffWait>,
    /// Exited instances and dead sandboxes no longer needed for status or logs.
    pub remove_containers: Vec<String>,
    pub remove_sandboxes: Vec<String>,
    /// The pod's init containers failed under restartPolicy Never, or every app container has
    /// exited for good: nothing will run again.
    pub terminal: bool,
}

impl PodActions {
    /// When the worker should look again even if nothing else happens (a back-off ends).
    pub(crate) fn retry_after(&self) -> Option<Duration> {
        self.waiting.iter().map(|w| w.remaining).min()
    }
}

/// Inputs besides the pod and the runtime's view.
pub(crate) struct DecisionContext<'a> {
    pub now: SystemTime,
    pub backoff: &'a BackoffTable,
    pub policy: BackoffPolicy,
    /// The spec hash of a container, as recorded on the instances Deckhand creates.
    pub spec_hash: &'a dyn Fn(&Container) -> String,
    /// Running instances (by container ID) that failed their liveness or startup probe.
    pub unhealthy: &'a HashMap<String, Unhealthy>,
    /// Probe results by container name (a sidecar with a startup probe counts as started only
    /// once the probe succeeded).
    pub probes: &'a HashMap<String, ProbeView>,
    /// The resources each running instance (by container ID) was last given; an instance
    /// missing here runs with its spec's.
    pub actuated: &'a HashMap<String, ResourceRequirements>,
    /// The pod-level resources the allocation sets and those the pod's cgroup was last given,
    /// under which a container without limits of its own is resized.
    pub pod_level: super::resize::PodLevel<'a>,
}

/// The next restart count for a container: one more than any instance seen.
fn next_restart_count(observed: &ObservedPod, name: &str) -> u32 {
    observed
        .instances(name)
        .first()
        .map(|c| c.attempt.saturating_add(1))
        .unwrap_or(0)
}

/// True when the newest instance of the container exited with code 0.
fn succeeded(observed: &ObservedPod, name: &str) -> bool {
    observed
        .latest(name)
        .is_some_and(|i| i.state == ContainerState::Exited && i.exit_code == 0)
}

/// True when every app container has exited and none will run again.
fn app_containers_finished(pod: &Pod, observed: &ObservedPod) -> bool {
    let spec = match &pod.spec {
        Some(s) => s,
        None => return false,
    };
    !spec.containers.is_empty()
        && spec
            .containers
            .iter()
            .all(|c| match observed.latest(&c.name) {
                Some(inst) => {
                    inst.state == ContainerState::Exited && !should_restart(pod, c, inst.exit_code)
                }
                None => false,
            })
}

/// Has an init container failed for good (it may not restart after its exit: restartPolicy
/// Never, the pod's or its own, and no rule asking for a restart)?
fn init_failed_for_good(pod: &Pod, observed: &ObservedPod) -> bool {
    let spec = match &pod.spec {
        Some(s) => s,
        None => return false,
    };
    spec.init_containers
        .iter()
        .flatten()
        .filter(|c| !is_sidecar(c))
        .any(|c| {
            observed.latest(&c.name).is_some_and(|i| {
                i.state == ContainerState::Exited
                    && i.exit_code != 0
                    && !should_restart(pod, c, i.exit_code)
            })
        })
}

/// Decides what to do for `pod` given what the runtime shows.
///
/// The checks go in order of precedence: a round of `RestartAllContainers` first stops what of
/// the earlier rounds still runs; a pod that will never run again is only made sure to be
/// stopped; a pod whose sandbox must be replaced starts over in a new one; otherwise its init
/// containers run, one at a time, before its app containers are looked at. Within a round
/// everything is decided over the round's own instances (`base::restart_round`).
pub(crate) fn compute_pod_actions(
    pod: &Pod,
    observed: &ObservedPod,
    ctx: &DecisionContext,
) -> PodActions {
    let mut actions = PodActions::default();
    let Some(spec) = pod.spec.as_ref() else {
        return actions;
    };
    let view = SandboxView::of(spec, observed);
    actions.remove_sandboxes = unneeded_sandboxes(observed, view.newest);
    let trigger = view
        .kept()
        .and_then(|s| restart_round::trigger(pod, observed, &s.id));
    if let Some(trigger) = trigger
        && stop_earlier_round(&mut actions, pod, observed, trigger)
    {
        actions.sandbox_id = view.kept().map(|s| s.id.clone());
        return actions;
    }
    let round = trigger.map(|t| restart_round::current(pod, observed, t));
    let planned = round.as_ref().unwrap_or(observed);
    actions.terminal = init_failed_for_good(pod, planned) || app_containers_finished(pod, planned);
    if actions.terminal {
        stop_terminal_pod(&mut actions, pod, planned);
        return actions;
    }
    let Some(sandbox) = view.kept() else {
        plan_new_sandbox(&mut actions, ctx, pod, spec, observed, &view);
        return actions;
    };
    actions.sandbox_id = Some(sandbox.id.clone());
    plan_ephemeral_containers(&mut actions, pod, planned);
    if plan_init_containers(&mut actions, ctx, pod, spec, planned, sandbox) == InitStep::Next {
        for (index, c) in spec.containers.iter().enumerate() {
            let latest = planned
                .instances(&c.name)
                .into_iter()
                .find(|i| i.sandbox_id == sandbox.id);
            plan_app_container(&mut actions, ctx, pod, planned, (index, c), latest);
        }
    }
    if let Some(trigger) = trigger {
        // Made for the round, and counting on from the earlier rounds' attempts.
        for start in &mut actions.start_containers {
            if start.kind != ContainerKind::Ephemeral {
                start.restart_count = next_restart_count(observed, &start.name);
                start.round = Some(trigger.id.clone());
            }
        }
    }
    collect_garbage(&mut actions, observed, trigger.map(|t| t.id.as_str()));
    actions
}

/// The first step of a round of `RestartAllContainers`: the earlier rounds' instances that
/// still run are stopped at once (no grace period, as upstream), app containers first, then
/// the init containers, the last started first; the ones made and never started are removed.
/// True when something is left to stop, so the round waits for the next look.
fn stop_earlier_round(
    actions: &mut PodActions,
    pod: &Pod,
    observed: &ObservedPod,
    trigger: &ObservedContainer,
) -> bool {
    let mut left = restart_round::left_over(pod, observed, trigger);
    left.sort_by_key(|i| (i.is_init, std::cmp::Reverse(i.created_at)));
    for inst in left {
        if inst.state == ContainerState::Created {
            actions.remove_containers.push(inst.id.clone());
            continue;
        }
        actions.kill_containers.push(KillContainer {
            id: inst.id.clone(),
            name: inst.name.clone(),
            reason: format!(
                "Container {} exited with code {}, which its restart rule maps to \
                 RestartAllContainers: every container of the pod runs again",
                trigger.name, trigger.exit_code
            ),
            grace_override: Some(0),
        });
    }
    !actions.kill_containers.is_empty()
}

/// Ephemeral containers start in the kept sandbox, even before the init containers are done,
/// and only once: one with an instance in any state, in any sandbox, is never started again
/// (upstream's `computePodActions`). None starts in a new sandbox; they are not part of the
/// pod's restart. They are started first, as upstream does, so that a debugger runs even when
/// an init container cannot start.
fn plan_ephemeral_containers(actions: &mut PodActions, pod: &Pod, observed: &ObservedPod) {
    for (index, ec) in ephemeral::of(pod).iter().enumerate() {
        if observed.instances(&ec.name).is_empty() {
            actions.start_containers.push(StartContainer {
                kind: ContainerKind::Ephemeral,
                index,
                name: ec.name.clone(),
                restart_count: 0,
                backoff: None,
                round: None,
            });
        }
    }
}

/// What the sandbox decision looks at, gathered once: the newest sandbox, how many sandboxes are
/// ready, and the network mode the spec asks for. Whether the sandbox must be replaced and why
/// are two questions on the same facts, so they sit together.
struct SandboxView<'a> {
    newest: Option<&'a ObservedSandbox>,
    ready: usize,
    host_network: bool,
}

impl<'a> SandboxView<'a> {
    fn of(spec: &PodSpec, observed: &'a ObservedPod) -> Self {
        SandboxView {
            newest: observed.newest_sandbox(),
            ready: observed
                .sandboxes
                .iter()
                .filter(|s| s.state == SandboxState::Ready)
                .count(),
            host_network: spec.host_network.unwrap_or(false),
        }
    }

    /// The sandbox to keep running containers in, or `None` when a new one is needed: there is
    /// none, the newest is not ready, its network mode is not the spec's, or more than one is
    /// ready.
    fn kept(&self) -> Option<&'a ObservedSandbox> {
        self.newest.filter(|s| {
            s.state == SandboxState::Ready && s.host_network == self.host_network && self.ready <= 1
        })
    }

    /// Why the pod is stopped before its new sandbox is made (upstream's wording).
    fn kill_reason(&self) -> &'static str {
        match self.newest {
            Some(s) if s.state == SandboxState::Ready && s.host_network != self.host_network => {
                "the pod's network mode changed"
            }
            Some(_) if self.ready > 1 => "more than one ready sandbox",
            _ => "the pod sandbox is not ready",
        }
    }
}

/// Dead sandboxes other than the newest are garbage, unless they still hold an instance kept
/// for `lastState` and the restart count (removing a sandbox removes its containers).
fn unneeded_sandboxes(observed: &ObservedPod, newest: Option<&ObservedSandbox>) -> Vec<String> {
    let kept = kept_instances(observed);
    observed
        .sandboxes
        .iter()
        .filter(|sandbox| {
            Some(sandbox.id.as_str()) != newest.map(|s| s.id.as_str())
                && sandbox.state == SandboxState::NotReady
                && !observed
                    .containers
                    .iter()
                    .any(|c| c.sandbox_id == sandbox.id && kept.contains(c.id.as_str()))
        })
        .map(|sandbox| sandbox.id.clone())
        .collect()
}

/// A pod where nothing will run again: the only thing left is to make sure nothing is still
/// running, with the reason the pod finished.
fn stop_terminal_pod(actions: &mut PodActions, pod: &Pod, observed: &ObservedPod) {
    if observed.is_running() {
        actions.kill_pod = Some(if init_failed_for_good(pod, observed) {
            "an init container failed and restartPolicy is Never".into()
        } else {
            "all containers have exited and none will restart".into()
        });
    }
}

/// The pod needs a new sandbox: stop what is left of the old one and start over in a new one,
/// unless the pod runs under restartPolicy Never and had already run, in which case it is done.
fn plan_new_sandbox(
    actions: &mut PodActions,
    ctx: &DecisionContext,
    pod: &Pod,
    spec: &PodSpec,
    observed: &ObservedPod,
    view: &SandboxView,
) {
    // A pod under restartPolicy Never whose sandbox died after its containers ran is done. Upstream
    // asks the pod's policy here, not the containers'.
    if RestartPolicy::of(pod) == RestartPolicy::Never
        && view.newest.is_some()
        && !observed.containers.is_empty()
    {
        if observed.is_running() {
            actions.kill_pod = Some("the pod sandbox is gone and restartPolicy is Never".into());
        }
        actions.terminal = true;
        return;
    }
    // Upstream kills the pod whenever it needs a new sandbox: besides running containers,
    // a NotReady sandbox may still hold its network (IP, veth, host ports) until it is
    // stopped, so it is stopped too before the new one is made.
    if observed.is_running() || view.newest.is_some() {
        actions.kill_pod = Some(view.kill_reason().into());
    }
    let attempt = view
        .newest
        .map(|s| s.attempt.saturating_add(1))
        .unwrap_or(0);
    actions.create_sandbox = Some(attempt);
    // Everything starts again in a new sandbox: the first init container, or every app
    // container when there are none. A container whose last instance exited keeps its
    // crash-loop back-off across the new sandbox, as upstream (a sandbox that keeps dying
    // must not turn a crash loop into a tight loop).
    match spec.init_containers.as_deref().unwrap_or_default().first() {
        Some(first) => {
            start_in_new_sandbox(actions, ctx, pod, (ContainerKind::Init, 0), first, observed)
        }
        None => {
            for (index, c) in spec.containers.iter().enumerate() {
                // A container that runs to success (OnFailure, its own or the pod's) and did
                // is not started again.
                if container_policy(pod, c) == RestartPolicy::OnFailure
                    && succeeded(observed, &c.name)
                {
                    continue;
                }
                start_in_new_sandbox(actions, ctx, pod, (ContainerKind::App, index), c, observed);
            }
        }
    }
}

/// Whether the init sequence may go on past one init container.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum InitStep {
    /// Done with it (succeeded, or a sidecar that has started): look at the next one.
    Next,
    /// Still to run or running: nothing after it starts in this sync.
    Wait,
}

/// Init containers in the kept sandbox: one at a time, each to success, in order. Returns
/// [`InitStep::Next`] when all of them are done and the app containers may run.
fn plan_init_containers(
    actions: &mut PodActions,
    ctx: &DecisionContext,
    pod: &Pod,
    spec: &PodSpec,
    observed: &ObservedPod,
    sandbox: &ObservedSandbox,
) -> InitStep {
    for (index, c) in spec.init_containers.iter().flatten().enumerate() {
        let latest = observed
            .instances(&c.name)
            .into_iter()
            .find(|i| i.sandbox_id == sandbox.id);
        let step = if is_sidecar(c) {
            plan_sidecar(actions, ctx, pod, observed, (index, c), latest)
        } else {
            plan_init_container(actions, ctx, pod, observed, (index, c), latest)
        };
        if step == InitStep::Wait {
            return InitStep::Wait;
        }
    }
    InitStep::Next
}

/// A sidecar (restartable init container) keeps running beside the app; the next init
/// container waits only until it has started. `latest` is its newest instance in the sandbox.
fn plan_sidecar(
    actions: &mut PodActions,
    ctx: &DecisionContext,
    pod: &Pod,
    observed: &ObservedPod,
    (index, c): (usize, &Container),
    latest: Option<&ObservedContainer>,
) -> InitStep {
    let Some(inst) = latest else {
        start_afresh(actions, observed, (ContainerKind::Init, index), c, None);
        return InitStep::Wait;
    };
    match inst.state {
        ContainerState::Running | ContainerState::Unknown => {
            if let Some(bad) = ctx.unhealthy.get(&inst.id) {
                actions.kill_containers.push(probe_kill(inst, c, bad));
            } else {
                plan_sidecar_resize(actions, ctx, c, inst);
            }
            let started = c.startup_probe.is_none()
                || ctx.probes.get(&c.name).and_then(|v| v.started) == Some(true);
            if started {
                InitStep::Next
            } else {
                InitStep::Wait
            }
        }
        ContainerState::Exited => {
            plan_restart(
                actions,
                ctx,
                pod,
                (ContainerKind::Init, index),
                c,
                inst,
                observed,
            );
            InitStep::Next
        }
        ContainerState::Created => {
            start_afresh(
                actions,
                observed,
                (ContainerKind::Init, index),
                c,
                Some(inst),
            );
            InitStep::Wait
        }
    }
}

/// An ordinary init container must exit 0 before the next one starts. `latest` is its newest
/// instance in the sandbox.
fn plan_init_container(
    actions: &mut PodActions,
    ctx: &DecisionContext,
    pod: &Pod,
    observed: &ObservedPod,
    (index, c): (usize, &Container),
    latest: Option<&ObservedContainer>,
) -> InitStep {
    let Some(inst) = latest else {
        start_afresh(actions, observed, (ContainerKind::Init, index), c, None);
        return InitStep::Wait;
    };
    match inst.state {
        ContainerState::Exited if inst.exit_code == 0 => InitStep::Next,
        ContainerState::Running => {
            plan_resize(
                actions,
                ctx,
                observed,
                (ContainerKind::Init, index, c),
                inst,
            );
            InitStep::Wait
        }
        ContainerState::Unknown => InitStep::Wait,
        ContainerState::Exited => {
            // Failed: retried with back-off (Never was handled as terminal above).
            plan_restart(
                actions,
                ctx,
                pod,
                (ContainerKind::Init, index),
                c,
                inst,
                observed,
            );
            InitStep::Wait
        }
        ContainerState::Created => {
            start_afresh(
                actions,
                observed,
                (ContainerKind::Init, index),
                c,
                Some(inst),
            );
            InitStep::Wait
        }
    }
}

/// One app container in the kept sandbox, once the init containers are done: start it,
/// restart it per the restart policy, or replace it when it is unhealthy, changed or of
/// unknown state. `latest` is its newest instance in the sandbox.
fn plan_app_container(
    actions: &mut PodActions,
    ctx: &DecisionContext,
    pod: &Pod,
    observed: &ObservedPod,
    (index, c): (usize, &Container),
    latest: Option<&ObservedContainer>,
) {
    let Some(inst) = latest else {
        // Done for good in an earlier sandbox (succeeded under OnFailure): not run again.
        if observed.latest(&c.name).is_some_and(|i| {
            i.state == ContainerState::Exited && !should_restart(pod, c, i.exit_code)
        }) {
            return;
        }
        actions.start_containers.push(StartContainer {
            kind: ContainerKind::App,
            index,
            name: c.name.clone(),
            restart_count: next_restart_count(observed, &c.name),
            backoff: None,
            round: None,
        });
        return;
    };
    match inst.state {
        ContainerState::Unknown if may_restart(pod, c) => {
            // Nobody knows whether it runs: kill it before starting a new instance, so two
            // never run at once (upstream does the same). A container that may never restart
            // (restartPolicy Never, its own or the pod's) is left alone.
            replace_instance(
                actions,
                observed,
                (ContainerKind::App, index, c),
                inst,
                UNKNOWN_STATE,
            );
        }
        ContainerState::Running | ContainerState::Unknown => {
            let want = (ctx.spec_hash)(c);
            if let Some(bad) = ctx.unhealthy.get(&inst.id) {
                // Killed now; the next sync sees it exited and restarts it per the
                // restart policy and back-off, like any other exit.
                actions.kill_containers.push(probe_kill(inst, c, bad));
            } else if inst
                .hash
                .as_deref()
                .is_some_and(|h| h != want && !spec_hash::is_legacy_hash_of(h, c))
            {
                replace_instance(
                    actions,
                    observed,
                    (ContainerKind::App, index, c),
                    inst,
                    &format!("Container {} definition changed, will be restarted", c.name),
                );
            } else {
                plan_resize(actions, ctx, observed, (ContainerKind::App, index, c), inst);
            }
        }
        ContainerState::Exited => {
            if should_restart(pod, c, inst.exit_code) {
                plan_restart(
                    actions,
                    ctx,
                    pod,
                    (ContainerKind::App, index),
                    c,
                    inst,
                    observed,
                );
            }
        }
        ContainerState::Created => {
            start_afresh(
                actions,
                observed,
                (ContainerKind::App, index),
                c,
                Some(inst),
            );
        }
    }
}

/// Stops a running instance that failed its liveness or startup probe, with the probe's
/// message and its own grace period (sidecars and app containers are stopped alike).
fn probe_kill(inst: &ObservedContainer, container: &Container, bad: &Unhealthy) -> KillContainer {
    KillContainer {
        id: inst.id.clone(),
        name: container.name.clone(),
        reason: bad.message.clone(),
        grace_override: bad.grace_override,
    }
}

/// Stops an app container's instance and starts a new one at once (no back-off: the
/// instance did not fail, it is replaced).
fn replace_instance(
    actions: &mut PodActions,
    observed: &ObservedPod,
    (kind, index, container): (ContainerKind, usize, &Container),
    inst: &ObservedContainer,
    reason: &str,
) {
    actions.kill_containers.push(KillContainer {
        id: inst.id.clone(),
        name: container.name.clone(),
        reason: reason.to_string(),
        grace_override: None,
    });
    actions.start_containers.push(StartContainer {
        kind,
        index,
        name: container.name.clone(),
        restart_count: next_restart_count(observed, &container.name),
        backoff: None,
        round: None,
    });
}

/// A running container whose allocation differs from what it runs with: resized in place, or
/// restarted when its `resizePolicy` asks for that ([`super::resize::resize_step`]): stopped and
/// started again in the same step. This is how app containers and ordinary init containers
/// are resized (upstream's InPlacePodVerticalScalingInitContainers, GA in v1.37; a stop alone
/// would read as the init container's failure).
fn plan_resize(
    actions: &mut PodActions,
    ctx: &DecisionContext,
    observed: &ObservedPod,
    (kind, index, c): (ContainerKind, usize, &Container),
    inst: &ObservedContainer,
) {
    if resize_needs_restart(actions, ctx, c, inst) {
        let message = super::resize::restart_message(&c.name);
        replace_instance(actions, observed, (kind, index, c), inst, &message);
    }
}

/// A running sidecar's resize: in place, or a stop (its restart follows as for any exit).
fn plan_sidecar_resize(
    actions: &mut PodActions,
    ctx: &DecisionContext,
    c: &Container,
    inst: &ObservedContainer,
) {
    if resize_needs_restart(actions, ctx, c, inst) {
        actions.kill_containers.push(KillContainer {
            id: inst.id.clone(),
            name: c.name.clone(),
            reason: super::resize::restart_message(&c.name),
            grace_override: None,
        });
    }
}

/// Plans the in-place resize of a running instance whose allocation changed; true when its
/// `resizePolicy` asks for a restart instead, which the caller plans as its kind of container
/// needs. Nothing for an instance with no record of what it runs with.
fn resize_needs_restart(
    actions: &mut PodActions,
    ctx: &DecisionContext,
    c: &Container,
    inst: &ObservedContainer,
) -> bool {
    let Some(actuated) = ctx.actuated.get(&inst.id) else {
        return false;
    };
    match super::resize::resize_step_under(c, actuated, ctx.pod_level) {
        None => false,
        Some(super::resize::ResizeStep::InPlace) => {
            actions.resize_containers.push(ResizeContainer {
                id: inst.id.clone(),
                name: c.name.clone(),
            });
            false
        }
        Some(super::resize::ResizeStep::Restart) => true,
    }
}

/// Why an instance in state Unknown is stopped (upstream's wording).
pub(crate) const UNKNOWN_STATE: &str =
    "Container is in \"unknown\" state, try killing it before restart";

/// Plans a container's start in a new sandbox: a restart with back-off when its newest
/// instance (in any older sandbox) exited, a plain start otherwise.
fn start_in_new_sandbox(
    actions: &mut PodActions,
    ctx: &DecisionContext,
    pod: &Pod,
    (kind, index): (ContainerKind, usize),
    container: &Container,
    observed: &ObservedPod,
) {
    match observed.latest(&container.name) {
        Some(inst) if inst.state == ContainerState::Exited => {
            plan_restart(actions, ctx, pod, (kind, index), container, inst, observed)
        }
        _ => actions.start_containers.push(StartContainer {
            kind,
            index,
            name: container.name.clone(),
            restart_count: next_restart_count(observed, &container.name),
            backoff: None,
            round: None,
        }),
    }
}

/// Starts a container that has no instance yet, or only one that was created and never
/// started (the agent died in between): that one is removed and replaced.
fn start_afresh(
    actions: &mut PodActions,
    observed: &ObservedPod,
    (kind, index): (ContainerKind, usize),
    container: &Container,
    stale: Option<&ObservedContainer>,
) {
    if let Some(stale) = stale {
        actions.remove_containers.push(stale.id.clone());
    }
    actions.start_containers.push(StartContainer {
        kind,
        index,
        name: container.name.clone(),
        restart_count: next_restart_count(observed, &container.name),
        backoff: None,
        round: None,
    });
}

/// Restarts an exited container now, or records that it must wait out its back-off.
fn plan_restart(
    actions: &mut PodActions,
    ctx: &DecisionContext,
    pod: &Pod,
    (kind, index): (ContainerKind, usize),
    container: &Container,
    exited: &ObservedContainer,
    observed: &ObservedPod,
) {
    let finished = exited.finished_time().unwrap_or(ctx.now);
    let key = super::backoff::container_key(&container.name, &(ctx.spec_hash)(container));
    let entry = ctx.backoff.get(&key);
    match ctx.policy.remaining(entry, finished, ctx.now) {
        Some(remaining) => actions.waiting.push(BackoffWait {
            name: container.name.clone(),
            remaining,
            message: format!(
                "back-off {} restarting failed container={} pod={}",
                format_delay(entry.map(|e| e.delay).unwrap_or(remaining)),
                container.name,
                pod_label(pod)
            ),
        }),
        None => actions.start_containers.push(StartContainer {
            kind,
            index,
            name: container.name.clone(),
            restart_count: next_restart_count(observed, &container.name),
            backoff: Some(ctx.policy.next(entry, finished, ctx.now)),
            round: None,
        }),
    }
}

/// The pod as upstream names it in messages: `name_namespace(uid)`.
pub(crate) fn pod_label(pod: &Pod) -> String {
    let meta = &pod.metadata;
    format!(
        "{}_{}({})",
        meta.name.as_deref().unwrap_or_default(),
        meta.namespace.as_deref().unwrap_or_default(),
        meta.uid.as_deref().unwrap_or_default()
    )
}

/// Upstream writes back-off delays like Go durations: `10s`, `1m20s`, `5m0s`.
pub(crate) fn format_delay(d: Duration) -> String {
    let secs = d.as_secs();
    if secs >= 60 {
        format!("{}m{}s", secs / 60, secs % 60)
    } else if d.subsec_millis() > 0 && secs < 10 {
        format!("{}ms", d.as_millis())
    } else {
        format!("{secs}s")
    }
}

/// Keeps the two newest instances of each container name (the current one, and the one before
/// it for `lastState`, logs and the restart count), and the exit that started the current
/// `RestartAllContainers` round (it tells the round's instances from the earlier ones); older
/// exited instances go.
fn collect_garbage(actions: &mut PodActions, observed: &ObservedPod, trigger: Option<&str>) {
    let mut keep = kept_instances(observed);
    keep.extend(trigger);
    let removing_sandbox: HashSet<&str> = actions
        .remove_sandboxes
        .iter()
        .map(String::as_str)
        .collect();
    for c in &observed.containers {
        let dead = c.state == ContainerState::Exited;
        let stale =
            !keep.contains(c.id.as_str()) || removing_sandbox.contains(c.sandbox_id.as_str());
        if dead && stale && !actions.remove_containers.contains(&c.id) {
            actions.remove_containers.push(c.id.clone());
        }
    }
}

/// The newest instance of each container name and the one before it (it is the `lastState`
/// users see, and carries the restart count).
fn kept_instances(observed: &ObservedPod) -> HashSet<&str> {
    let names: HashSet<&str> = observed
        .containers
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    let mut keep = HashSet::new();
    for name in names {
        for inst in observed.instances(name).into_iter().take(2) {
            keep.insert(inst.id.as_str());
        }
    }
    keep
}

#[cfg(test)]
#[path = "actions_tests.rs"]
mod tests;
