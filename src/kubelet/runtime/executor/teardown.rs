//! Stopping containers the way upstream does: the preStop hook first, within the grace period,
//! then `StopContainer` with what is left of it (at least two seconds); app containers before
//! sidecars (in the reverse of their order, see `runtime::termination_order`) and other init
//! containers, and the sandboxes last. And removing everything of a
//! pod once it is gone: containers, sandboxes, log directory, pod files, volumes, cgroups.

use std::collections::HashMap;
use std::time::Duration;

use futures::future::join_all;
use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Pod};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::base::clock;
use crate::base::safe_names::component_problem;
use crate::clients::cri::{CriError, ImageService, RuntimeService};
use crate::kubelet::events::{EventType, reason};
use crate::kubelet::volume::safe_fs::SafeFsError;

use super::super::hooks::{HookKind, run_hook};
use super::super::termination_order::TerminationOrder;
use super::{Executor, MIN_GRACE_SECONDS, grace_period, pod_name, pod_namespace};
use crate::base::observed::{ContainerState, ObservedContainer, ObservedPod};
use crate::base::podspec::{QosClass, is_sidecar};

/// Errors of a teardown; the worker retries.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TeardownError {
    #[error("{0}")]
    Runtime(#[from] CriError),
    #[error("{0}")]
    Volumes(String),
    #[error("removing the pod's files: {0}")]
    Files(#[from] SafeFsError),
}

/// The spec of the named container, init or app.
fn spec_container<'a>(pod: &'a Pod, name: &str) -> Option<&'a Container> {
    let spec = pod.spec.as_ref()?;
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == name)
}

/// Whether the pod declares a sidecar (a restartable init container).
fn has_sidecars(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .is_some_and(|inits| inits.iter().any(is_sidecar))
}

fn is_active(c: &ObservedContainer) -> bool {
    matches!(
        c.state,
        ContainerState::Running | ContainerState::Created | ContainerState::Unknown
    )
}

/// How long a pod's stop may take before it counts as having exceeded its grace period:
/// the grace period and half again, plus 10 s for the runtime (upstream's margin for
/// killing a pod).
pub(super) fn overdue(grace: i64) -> Duration {
    let grace = grace.max(0) as u64;
    Duration::from_secs(grace + grace / 2 + 10)
}

/// When a stop counts as done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum StopUntil {
    /// The runtime answered `StopContainer` (a pod's teardown: what follows needs the runtime
    /// to have finished with the container).
    Answered,
    /// The container's exit was heard from the event stream with its code, or the runtime
    /// answered, whichever comes first (a container replaced within the pod's sync).
    Exited,
}

/// Seconds left of a grace period that started at `started`, never below the minimum.
pub(super) fn remaining_grace(grace: i64, started: Instant) -> i64 {
    let spent = started.elapsed().as_secs() as i64;
    (grace - spent).max(MIN_GRACE_SECONDS)
}

impl<R: RuntimeService + ImageService> Executor<R> {
    /// Runs the container's preStop hook (if any) and stops it with what is left of `grace`.
    /// A failing preStop hook is logged, and the stop goes ahead (upstream does the same).
    /// `why` is the Killing event's message (upstream's default: "Stopping container x").
    pub(super) async fn stop_container_gracefully(
        &self,
        pod: Option<&Pod>,
        inst: &ObservedContainer,
        grace: i64,
        pod_ip: Option<&str>,
        why: Option<&str>,
        until: StopUntil,
    ) -> Result<(), CriError> {
        let started = clock::instant();
        self.begin_stop(pod, inst, grace, pod_ip, why).await;
        let left = remaining_grace(grace, started);
        match until {
            StopUntil::Answered => self.stop_container(&inst.id, left).await,
            StopUntil::Exited => self.stop_container_until_exit(&inst.id, left).await,
        }
    }

    /// The start of a container's stop: the Killing event, then its preStop hook (if any)
    /// within `grace`.
    async fn begin_stop(
        &self,
        pod: Option<&Pod>,
        inst: &ObservedContainer,
        grace: i64,
        pod_ip: Option<&str>,
        why: Option<&str>,
    ) {
        let spec = pod.and_then(|p| spec_container(p, &inst.name)).cloned();
        // Orphans have no object to name in an event; their stop is in the log.
        if let Some(p) = pod
            && inst.state == ContainerState::Running
        {
            let message = why
                .map(str::to_string)
                .unwrap_or_else(|| format!("Stopping container {}", inst.name));
            self.events
                .container(p, &inst.name, EventType::Normal, reason::KILLING, message);
        }
        // An orphan's preStop comes from what Deckhand recorded on the container.
        let handler: Option<LifecycleHandler> = match &spec {
            Some(c) => c.lifecycle.as_ref().and_then(|l| l.pre_stop.clone()),
            None => inst
                .pre_stop
                .as_deref()
                .and_then(|json| serde_json::from_str(json).ok()),
        };
        if let Some(handler) = handler.filter(|_| inst.state == ContainerState::Running) {
            let container = spec.unwrap_or_else(|| Container {
                name: inst.name.clone(),
                ..Default::default()
            });
            let timeout = Duration::from_secs(grace.max(0) as u64);
            tracing::info!(container = %inst.name, grace, "running the preStop hook");
            if let Err(err) = run_hook(
                &self.rt,
                HookKind::PreStop,
                &handler,
                &container,
                &inst.id,
                pod_ip,
                timeout,
            )
            .await
            {
                tracing::warn!(container = %inst.name, error = %err, "FailedPreStopHook");
                // As upstream, the hook's output stays out of the event (it may hold secrets).
                if let Some(p) = pod {
                    self.events.container(
                        p,
                        &inst.name,
                        EventType::Warning,
                        reason::FAILED_PRE_STOP_HOOK,
                        "PreStopHook failed",
                    );
                }
            }
        }
    }

    /// Stops a container and returns once it is known to have exited. containerd answers
    /// `StopContainer` only after it has handled the exit (the task deleted, the status
    /// recorded), tens of milliseconds after publishing the exit event, and longer on a busy
    /// node; a container replaced within a sync (a failed liveness or startup probe, a changed
    /// definition) can be restarted as soon as its exit event arrives, as a crashed one is.
    /// The call then finishes in a task of its own. Without an event stream this is
    /// [`Executor::stop_container`].
    pub(super) async fn stop_container_until_exit(
        &self,
        id: &str,
        grace: i64,
    ) -> Result<(), CriError> {
        let Some(pleg) = self.pleg.clone().filter(|p| p.events_live()) else {
            return self.stop_container(id, grace).await;
        };
        let mut heard = pleg.exits_heard();
        let (answer_tx, mut answer) = tokio::sync::oneshot::channel();
        {
            let (rt, details, id) = (self.rt.clone(), self.details.clone(), id.to_string());
            let started = clock::instant();
            tokio::spawn(async move {
                let result = match rt.stop_container(id.clone(), grace).await {
                    Err(err) if !err.is_not_found() => Err(err),
                    _ => {
                        details.forget_container(&id);
                        Ok(())
                    }
                };
                tracing::trace!(
                    container_id = %id,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    ok = result.is_ok(),
                    "StopContainer answered"
                );
                if let Err(Err(err)) = answer_tx.send(result) {
                    // Nobody waits any more: the exit was heard first.
                    tracing::warn!(container_id = %id, error = %err, "stopping the container failed after its exit was heard");
                }
            });
        }
        let exited = |id: &str| pleg.exit_of(id).is_some_and(|h| h.exit_code.is_some());
        loop {
            if exited(id) {
                tracing::debug!(container_id = %id, "exit heard; going on before the runtime answers the stop");
                return Ok(());
            }
            tokio::select! {
                result = &mut answer => {
                    return result.unwrap_or_else(|_| Err(CriError::Rpc {
                        method: "StopContainer",
                        code: tonic::Code::Internal,
                        message: "the stop ended without an answer".into(),
                    }));
                }
                changed = heard.changed() => if changed.is_err() {
                    // The PLEG is gone: only the answer is left to wait for.
                    return (&mut answer).await.unwrap_or(Ok(()));
                }
            }
        }
    }

    /// Stops every running container of the pod, then its sandboxes. A pod with sidecars
    /// stops in upstream's order ([`TerminationOrder`]); otherwise app containers go first,
    /// all at once, and any running init containers follow with what is left of the grace
    /// period.
    pub(super) async fn stop_pod(
        &self,
        pod: Option<&Pod>,
        observed: &ObservedPod,
        grace: i64,
    ) -> Result<(), CriError> {
        let ip = observed.reachable_ip(None, self.node.host_ip.as_deref());
        match pod {
            Some(pod) if has_sidecars(pod) => {
                self.stop_in_order(pod, observed, grace, ip.as_deref())
                    .await?
            }
            _ => {
                self.stop_apps_then_inits(pod, observed, grace, ip.as_deref())
                    .await?
            }
        }
        // NotReady sandboxes are stopped too: a sandbox whose pause process died still holds
        // its network (IP lease, veth, host ports) until StopPodSandbox releases it.
        for sandbox in &observed.sandboxes {
            if let Err(err) = self.rt.stop_pod_sandbox(sandbox.id.clone()).await
                && !err.is_not_found()
            {
                return Err(err);
            }
        }
        Ok(())
    }

    /// Every running container's Killing event and preStop hook at once; then each one's
    /// stop once the containers it waits for ([`TerminationOrder`]) have exited, or when what
    /// is left of the grace period has run out waiting.
    async fn stop_in_order(
        &self,
        pod: &Pod,
        observed: &ObservedPod,
        grace: i64,
        ip: Option<&str>,
    ) -> Result<(), CriError> {
        let active: Vec<&ObservedContainer> = observed
            .containers
            .iter()
            .filter(|c| is_active(c))
            .collect();
        let order = match pod.spec.as_ref() {
            Some(spec) => TerminationOrder::new(spec, active.iter().map(|c| c.name.as_str())),
            None => TerminationOrder::default(),
        };
        let exited: HashMap<&str, watch::Sender<bool>> = active
            .iter()
            .map(|c| (c.name.as_str(), watch::channel(false).0))
            .collect();
        let (order, exited) = (&order, &exited);
        let stops = active.iter().map(|c| async move {
            let started = clock::instant();
            self.begin_stop(Some(pod), c, grace, ip, None).await;
            let turn = order
                .waits_for(&c.name)
                .filter_map(|name| exited.get(name))
                .map(|sender| {
                    let mut done = sender.subscribe();
                    async move {
                        // An error is a sender dropped, which cannot happen before this ends.
                        let _ = done.wait_for(|exited| *exited).await;
                    }
                });
            let left = (grace - started.elapsed().as_secs() as i64).max(0) as u64;
            if tokio::time::timeout(Duration::from_secs(left), join_all(turn))
                .await
                .is_err()
            {
                tracing::info!(container = %c.name, "the containers this one waits for did not exit within the grace period; stopping it");
            }
            let result = self
                .stop_container(&c.id, remaining_grace(grace, started))
                .await;
            if let Some(sender) = exited.get(c.name.as_str()) {
                sender.send_replace(true);
            }
            result
        });
        for result in join_all(stops).await {
            result?;
        }
        Ok(())
    }

    /// App containers all at once, then running init containers with what is left of the
    /// grace period (a pod without sidecars, or an orphan whose spec is gone).
    async fn stop_apps_then_inits(
        &self,
        pod: Option<&Pod>,
        observed: &ObservedPod,
        grace: i64,
        ip: Option<&str>,
    ) -> Result<(), CriError> {
        let started = clock::instant();
        // Orphans carry their own recorded grace period; a given one caps it.
        let grace_for = |c: &ObservedContainer, total: i64| match pod {
            Some(_) => total,
            None => c.grace_period.unwrap_or(total).min(total),
        };
        let apps: Vec<_> = observed
            .containers
            .iter()
            .filter(|c| is_active(c) && !c.is_init)
            .map(|c| {
                self.stop_container_gracefully(
                    pod,
                    c,
                    grace_for(c, grace),
                    ip,
                    None,
                    StopUntil::Answered,
                )
            })
            .collect();
        for result in join_all(apps).await {
            result?;
        }
        let left = remaining_grace(grace, started);
        let inits: Vec<_> = observed
            .containers
            .iter()
            .filter(|c| is_active(c) && c.is_init)
            .map(|c| {
                self.stop_container_gracefully(
                    pod,
                    c,
                    grace_for(c, left),
                    ip,
                    None,
                    StopUntil::Answered,
                )
            })
            .collect();
        for result in join_all(inits).await {
            result?;
        }
        Ok(())
    }
}

impl<R: RuntimeService + ImageService> Executor<R> {
    pub(super) async fn stop_container(&self, id: &str, grace: i64) -> Result<(), CriError> {
        match self.rt.stop_container(id.to_string(), grace).await {
            Err(err) if !err.is_not_found() => Err(err),
            _ => {
                self.details.forget_container(id);
                Ok(())
            }
        }
    }

    pub(super) async fn remove_container(&self, id: &str) {
        if let Err(err) = self.rt.remove_container(id.to_string()).await
            && !err.is_not_found()
        {
            tracing::warn!(container_id = %id, error = %err, "cannot remove an old container");
        }
        self.details.forget_container(id);
    }

    /// Stops every container and the sandbox of a pod with `grace`, and leaves them in place
    /// (upstream's kill: the dead containers and their logs stay until the pod is removed;
    /// the volumes go with [`Self::unmount_volumes`]). Returns what the runtime shows
    /// afterwards.
    pub(crate) async fn kill_pod(
        &self,
        uid: &str,
        pod: &Pod,
        grace: i64,
    ) -> Result<ObservedPod, TeardownError> {
        let observed = self.observe(uid).await?;
        self.stop_pod(Some(pod), &observed, grace).await?;
        let mut after = self.observe(uid).await?;
        // As a sync reads it: an OOM kill the event stream told of keeps its reason
        // (containerd 1.6 may have recorded the exit as an Error first).
        self.apply_heard(&mut after);
        Ok(after)
    }

    /// Unmounts and removes the volumes of a pod that was killed and will not run again,
    /// keeping its containers and logs: upstream's volume manager does the same once a pod is
    /// terminal, and the shutdown manager waits for it.
    pub(crate) async fn unmount_volumes(&self, uid: &str) -> Result<(), TeardownError> {
        let volumes = self.volumes.clone();
        let uid = uid.to_string();
        tokio::task::spawn_blocking(move || volumes.teardown(&uid))
            .await
            .map_err(|join| {
                TeardownError::Volumes(format!("the volume teardown task failed: {join}"))
            })?
            .map_err(|err| TeardownError::Volumes(err.to_string()))
    }

    /// Stops and removes everything of a pod, then its log directory, files and cgroup.
    /// `pod` is absent for orphans found in the runtime; their names come from the labels.
    pub(crate) async fn terminate_pod(
        &self,
        uid: &str,
        pod: Option<&Pod>,
        grace_override: Option<i64>,
    ) -> Result<(), TeardownError> {
        self.forget_objects(uid);
        let observed = self.observe(uid).await?;
        let grace = match pod {
            Some(p) => grace_period(Some(p), grace_override),
            // Orphans: each container's own recorded grace period applies (see stop_pod).
            None => grace_override.unwrap_or(30),
        };
        let stopping = clock::instant();
        self.stop_pod(pod, &observed, grace).await?;
        if let Some(p) = pod
            && stopping.elapsed() > overdue(grace)
        {
            self.events.pod(
                p,
                EventType::Warning,
                reason::EXCEEDED_GRACE_PERIOD,
                "Container runtime did not kill the pod within specified grace period.",
            );
        }
        // After every container stopped, as upstream: the pod no longer uses its claims.
        self.release_claims(uid).await;
        for c in &observed.containers {
            self.remove_container(&c.id).await;
        }
        for s in &observed.sandboxes {
            match self.rt.remove_pod_sandbox(s.id.clone()).await {
                Err(err) if !err.is_not_found() => return Err(err.into()),
                _ => {}
            }
        }
        // A UID that is not one safe path component (only possible for objects someone else
        // labelled as ours: the sources refuse such manifests) has its runtime objects removed
        // above, and no path is ever built from it.
        if let Some(problem) = component_problem(uid) {
            tracing::warn!(pod_uid = %uid, problem, "not touching any file for a pod whose UID cannot be a path component");
            return Ok(());
        }
        let names = pod
            .map(|p| (pod_namespace(p).to_string(), pod_name(p).to_string()))
            .or_else(|| observed.names.clone());
        let files = self.file_teardown();
        let uid = uid.to_string();
        tokio::task::spawn_blocking(move || files.remove_files(&uid, names))
            .await
            .map_err(|join| {
                TeardownError::Volumes(format!("the file teardown task failed: {join}"))
            })?
    }

    /// What the blocking file teardown needs, cloned out of the executor.
    fn file_teardown(&self) -> FileTeardown {
        FileTeardown {
            node: self.node.clone(),
            volumes: self.volumes.clone(),
            cgroups: self.cgroups.clone(),
        }
    }
}

/// What removing a pod's files needs; moved to a blocking thread (the removals and unmounts
/// are system calls that may take a while).
struct FileTeardown {
    node: std::sync::Arc<super::NodeContext>,
    volumes: crate::kubelet::volume::VolumeManager,
    cgroups: Option<std::sync::Arc<crate::kubelet::cm::CgroupManager>>,
}

impl FileTeardown {
    fn remove_files(
        &self,
        uid: &str,
        names: Option<(String, String)>,
    ) -> Result<(), TeardownError> {
        // Logs and pod files go with the pod, as upstream's garbage collector would do later.
        if let Some((ns, name)) = names {
            let dir = format!("{ns}_{name}_{uid}");
            match component_problem(&dir) {
                None => remove_child(&*self.node.mounter, &self.node.pod_logs_dir, &dir)?,
                // Names read back from an orphan's labels: never a path to follow.
                Some(problem) => {
                    tracing::warn!(%dir, problem, "not removing a log directory whose name cannot be a path component");
                }
            }
        }
        if let Err(err) = self.volumes.teardown(uid) {
            tracing::warn!(error = %err, "volume teardown failed; will retry");
            return Err(TeardownError::Volumes(err.to_string()));
        }
        // The manager removes the cgroup wherever its QoS class put it, after killing what is
        // left in it, and takes the pod off the QoS tiers; then the pod's directory goes.
        if let Some(cgroups) = &self.cgroups {
            for problem in cgroups.destroy_pod(uid) {
                tracing::warn!(%problem, "cannot remove the pod's cgroup");
            }
        } else {
            self.remove_cgroup_without_manager(uid);
        }
        // The pod's directory goes last: while it is there, a cgroup left by a teardown that
        // did not finish is known to be this node's to sweep (see `cm::orphans`).
        remove_child(&*self.node.mounter, &self.node.root_dir.join("pods"), uid)?;
        // With the directory went the pod's user-namespace mappings: its IDs are free.
        if let Some(userns) = &self.node.userns {
            userns.release(uid);
        }
        Ok(())
    }

    /// Without the cgroup manager (`cgroupsPerQOS` off or the systemd driver): the pod's
    /// cgroup, if the runtime made one under a parent of ours.
    fn remove_cgroup_without_manager(&self, uid: &str) {
        // The QoS class of an orphan is unknown, so every place its cgroup could be is tried.
        for qos in [
            QosClass::Guaranteed,
            QosClass::Burstable,
            QosClass::BestEffort,
        ] {
            let parent = crate::kubelet::cm::pod_cgroup_parent(
                self.node.cgroup_driver,
                &self.node.cgroup_root,
                self.node.cgroups_per_qos,
                qos,
                uid,
            );
            for problem in parent
                .map(|p| crate::kubelet::cm::remove_pod_cgroup(&self.node.cgroup_fs, &p))
                .unwrap_or_default()
            {
                tracing::warn!(%problem, "cannot remove the pod's cgroup");
            }
        }
    }
}

/// Removes `base/name` with the volume module's checked removal: nothing outside `base`, no
/// link followed (a link there is removed itself), mounts below unmounted first. A `base` that
/// does not exist holds nothing to remove.
fn remove_child(
    mounter: &dyn crate::kubelet::volume::mounter::Mounter,
    base: &std::path::Path,
    name: &str,
) -> Result<(), TeardownError> {
    let real = match base.canonicalize() {
        Ok(real) => real,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(err) => {
            return Err(SafeFsError::Sys {
                path: base.to_path_buf(),
                errno: nix::errno::Errno::from_raw(err.raw_os_error().unwrap_or(libc::EIO)),
            }
            .into());
        }
    };
    Ok(crate::kubelet::volume::remove_checked(
        mounter,
        &real.join(name),
        &real,
    )?)
}

#[cfg(test)]
mod order_tests {
    use k8s_openapi::api::core::v1::{ExecAction, Lifecycle, LifecycleHandler};

    use super::super::cgroup_tests::{executor, pod};
    use super::*;
    use crate::clients::cri::fake::FakeCri;

    fn running(name: &str, is_init: bool) -> ObservedContainer {
        ObservedContainer {
            id: format!("id-{name}"),
            sandbox_id: "sb".into(),
            name: name.into(),
            attempt: 0,
            state: ContainerState::Running,
            created_at: 0,
            started_at: 0,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            hash: None,
            image: String::new(),
            image_ref: String::new(),
            grace_period: None,
            is_init,
            pre_stop: None,
            round: None,
        }
    }

    fn container(name: &str, sidecar: bool, pre_stop: bool) -> Container {
        Container {
            name: name.into(),
            restart_policy: sidecar.then(|| "Always".to_string()),
            lifecycle: pre_stop.then(|| Lifecycle {
                pre_stop: Some(LifecycleHandler {
                    exec: Some(ExecAction {
                        command: Some(vec!["true".into()]),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// The runtime calls of a teardown as (method, container), in order.
    fn teardown_calls(rt: &FakeCri) -> Vec<(String, String)> {
        let mut execs = rt.exec_calls().into_iter().map(|c| c.0);
        let mut stops = rt.stopped().into_iter();
        rt.calls()
            .into_iter()
            .filter_map(|m| match m {
                "ExecSync" => Some(("preStop".to_string(), execs.next()?)),
                "StopContainer" => Some(("stop".to_string(), stops.next()?)),
                _ => None,
            })
            .collect()
    }

    /// The proxy sidecar (declared first) serves the later sidecar's preStop hook, as in
    /// upstream's "Restartable Init Container Lifecycle Hook ... prestop http hook" spec: it
    /// must outlive that hook and that sidecar, and the app goes first.
    #[tokio::test]
    async fn sidecars_stop_after_the_apps_in_reverse_order_once_their_hooks_ran() {
        let dir = tempfile::tempdir().unwrap();
        let rt = FakeCri::default();
        let (executor, _events) = executor(dir.path(), rt.clone());
        let mut p = pod("uid-order");
        let spec = p.spec.as_mut().unwrap();
        spec.init_containers = Some(vec![
            container("proxy", true, false),
            container("setup", false, false),
            container("hooked", true, true),
        ]);
        spec.containers = vec![container("main", false, false)];
        let observed = ObservedPod {
            containers: vec![
                running("proxy", true),
                running("hooked", true),
                running("main", false),
            ],
            ..Default::default()
        };
        executor.stop_pod(Some(&p), &observed, 30).await.unwrap();
        let calls = teardown_calls(&rt);
        let at = |what: &str, id: &str| {
            calls
                .iter()
                .position(|(m, c)| m == what && c == id)
                .unwrap_or_else(|| panic!("no {what} of {id} in {calls:?}"))
        };
        assert!(at("stop", "id-main") < at("stop", "id-hooked"), "{calls:?}");
        assert!(
            at("preStop", "id-hooked") < at("stop", "id-proxy"),
            "{calls:?}"
        );
        assert!(
            at("stop", "id-hooked") < at("stop", "id-proxy"),
            "{calls:?}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_trees_are_removed_inside_their_base_and_links_are_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("pods");
        let mounter = crate::kubelet::volume::mounter::fake::FakeMounter::default();
        let remove_child = |base: &std::path::Path, name: &str| remove_child(&mounter, base, name);
        let victim = dir.path().join("victim");
        std::fs::create_dir_all(base.join("u1/sub")).unwrap();
        std::fs::create_dir_all(&victim).unwrap();
        std::fs::write(victim.join("keep"), b"x").unwrap();
        // A link planted where a pod dir should be goes itself; what it points at stays.
        std::os::unix::fs::symlink(&victim, base.join("u2")).unwrap();
        remove_child(&base, "u2").unwrap();
        assert!(!base.join("u2").exists() && victim.join("keep").exists());
        // The real thing goes; a missing one, or a missing base, is fine.
        remove_child(&base, "u1").unwrap();
        assert!(!base.join("u1").exists());
        remove_child(&base, "u1").unwrap();
        remove_child(&dir.path().join("no-such-base"), "u1").unwrap();
    }

    #[test]
    fn remaining_grace_never_drops_below_the_minimum() {
        let now = Instant::now();
        assert_eq!(remaining_grace(30, now), 30);
        assert_eq!(remaining_grace(1, now), MIN_GRACE_SECONDS);
        assert_eq!(remaining_grace(0, now), MIN_GRACE_SECONDS);
    }
}
